"""torch_tfgrads.keras.optim and .losses against Keras 3.15 (and tf-keras 2.21) themselves.

Optimizers: the same variables and the same five gradients given to Keras's optimizer
(``optimizer.apply``) and to ours; float64 within 1e-12, float32 within 1e-6 (both bit-identical
on the development machine, docs/training.md), and torch's own optimizer with the nearest
settings measurably apart, which is why the helpers exist. Losses: values and gradients against
``keras.losses.*`` (float32 and ``dtype="float64"``) on probabilities with exact zeros and ones.
"""

import copy as copy_module

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import torch_tfgrads
from helpers import rel_err
from torch_tfgrads.keras import losses as L
from torch_tfgrads.keras.optim import KerasAdam, KerasAdamW, KerasRMSprop, KerasSGD

pytestmark = pytest.mark.needs_tf

DTYPES = [("float64", torch.float64, 1e-12), ("float32", torch.float32, 1e-6)]


@pytest.fixture(scope="module")
def tf_keras(tf):
    return pytest.importorskip("tf_keras")


def f32(v):
    return float(np.float32(v))


# ---- optimizers --------------------------------------------------------------------------------
def problem(n_steps=5):
    """Two variables and gradients spanning 1e-6 to 1 (where the epsilon placement shows)."""
    g = torch.Generator().manual_seed(7)
    inits = [torch.randn(3, 4, generator=g, dtype=torch.float64), torch.randn(5, generator=g)]
    grads = [
        [
            torch.randn(3, 4, generator=g, dtype=torch.float64)
            * 10.0 ** torch.randint(-6, 1, (3, 4), generator=g),
            torch.randn(5, generator=g, dtype=torch.float64),
        ]
        for _ in range(n_steps)
    ]
    return [t.double().numpy() for t in inits], [[t.numpy() for t in s] for s in grads]


def run_keras(tf, keras, opt, dtype, lrs=None, skip=None):
    inits, grads = problem()
    vs = [keras.Variable(v, dtype=dtype) for v in inits]
    for k, step in enumerate(grads):
        if lrs:
            opt.learning_rate.assign(lrs[k])
        gs = [None if (k, i) == skip else tf.constant(g, dtype=dtype) for i, g in enumerate(step)]
        opt.apply(gs, vs)
    return [torch.from_numpy(v.numpy()) for v in vs]


def run_tf_keras(tf, opt, dtype):
    inits, grads = problem()
    vs = [tf.Variable(v, dtype=dtype) for v in inits]
    for step in grads:
        opt.apply_gradients(zip([tf.constant(g, dtype=dtype) for g in step], vs))
    return [torch.from_numpy(v.numpy()) for v in vs]


def run_torch(make, dtype, lrs=None, skip=None):
    inits, grads = problem()
    ps = [torch.nn.Parameter(torch.tensor(v, dtype=dtype)) for v in inits]
    opt = make(ps)
    for k, step in enumerate(grads):
        if lrs:
            for group in opt.param_groups:
                group["lr"] = lrs[k]
        for i, (p, g) in enumerate(zip(ps, step)):
            p.grad = None if (k, i) == skip else torch.tensor(g, dtype=dtype)
        opt.step()
    return [p.detach() for p in ps]


def err(ours, theirs):
    return max(rel_err(a, b) for a, b in zip(ours, theirs, strict=True))


# (id, Keras optimizer from the keras module, ours, torch's nearest built-in or None)
OPTIMIZERS = [
    ("adam", lambda k: k.optimizers.Adam(), KerasAdam, lambda p: torch.optim.Adam(p, eps=1e-7)),
    (
        "adam-amsgrad-wd",
        lambda k: k.optimizers.Adam(0.01, amsgrad=True, weight_decay=0.1),
        lambda p: KerasAdam(p, 0.01, amsgrad=True, weight_decay=0.1),
        lambda p: torch.optim.AdamW(p, 0.01, eps=1e-7, amsgrad=True, weight_decay=0.1),
    ),
    (
        "adamw",
        lambda k: k.optimizers.AdamW(),
        KerasAdamW,
        lambda p: torch.optim.AdamW(p, 1e-3, eps=1e-7, weight_decay=0.004),
    ),
    ("adam-clipnorm", lambda k: k.optimizers.Adam(clipnorm=0.5), None, None),
    ("adam-global-clipnorm", lambda k: k.optimizers.Adam(global_clipnorm=0.5), None, None),
    ("adam-clipvalue", lambda k: k.optimizers.Adam(clipvalue=0.01), None, None),
    (
        "rmsprop",
        lambda k: k.optimizers.RMSprop(),
        KerasRMSprop,
        lambda p: torch.optim.RMSprop(p, 1e-3, alpha=0.9, eps=1e-7),
    ),
    (
        "rmsprop-centered-momentum",
        lambda k: k.optimizers.RMSprop(0.01, momentum=0.9, centered=True),
        lambda p: KerasRMSprop(p, 0.01, momentum=0.9, centered=True),
        lambda p: torch.optim.RMSprop(p, 0.01, alpha=0.9, eps=1e-7, momentum=0.9, centered=True),
    ),
    (
        "sgd-nesterov-wd",
        lambda k: k.optimizers.SGD(0.1, momentum=0.9, nesterov=True, weight_decay=0.01),
        lambda p: KerasSGD(p, 0.1, momentum=0.9, nesterov=True, weight_decay=0.01),
        lambda p: torch.optim.SGD(p, 0.1, momentum=0.9, nesterov=True, weight_decay=0.01),
    ),
]
_CLIPS = {
    "adam-clipnorm": lambda p: KerasAdam(p, clipnorm=0.5),
    "adam-global-clipnorm": lambda p: KerasAdam(p, global_clipnorm=0.5),
    "adam-clipvalue": lambda p: KerasAdam(p, clipvalue=0.01),
}


@pytest.mark.parametrize("dtype,tdtype,tol", DTYPES, ids=[d[0] for d in DTYPES])
@pytest.mark.parametrize("case", OPTIMIZERS, ids=[c[0] for c in OPTIMIZERS])
def test_optimizer_matches_keras(tf, keras, case, dtype, tdtype, tol):
    name, keras_opt, ours, builtin = case
    theirs = run_keras(tf, keras, keras_opt(keras), dtype)
    assert err(run_torch(ours or _CLIPS[name], tdtype), theirs) <= tol
    if builtin is not None:  # torch's own optimizer, nearest settings: not Keras's numbers
        assert err(run_torch(builtin, tdtype), theirs) > 1e-5


@pytest.mark.parametrize("dtype,tdtype,tol", DTYPES, ids=[d[0] for d in DTYPES])
def test_sgd_equals_torch_only_at_a_constant_rate(tf, keras, dtype, tdtype, tol):
    """torch.optim.SGD with Keras's float32 rate and momentum is Keras's SGD up to rounding while
    the rate is constant; with a changing rate Keras's velocity keeps the old rates."""
    theirs = run_keras(tf, keras, keras.optimizers.SGD(0.1, momentum=0.9), dtype)
    torch_sgd = lambda p: torch.optim.SGD(p, f32(0.1), momentum=f32(0.9))  # noqa: E731
    assert err(run_torch(torch_sgd, tdtype), theirs) <= {"float64": 1e-14, "float32": 1e-6}[dtype]
    lrs = [0.1, 0.05, 0.02, 0.2, 0.01]
    theirs = run_keras(tf, keras, keras.optimizers.SGD(0.1, momentum=0.9), dtype, lrs=lrs)
    assert err(run_torch(lambda p: KerasSGD(p, 0.1, momentum=0.9), tdtype, lrs=lrs), theirs) <= tol
    assert err(run_torch(torch_sgd, tdtype, lrs=lrs), theirs) > 0.1


@pytest.mark.parametrize("dtype,tdtype,tol", DTYPES, ids=[d[0] for d in DTYPES])
def test_a_variable_without_gradient_still_advances_the_counter(tf, keras, dtype, tdtype, tol):
    """Keras's one iteration counter: the variable skipped at step 2 sees t = 3 next."""
    theirs = run_keras(tf, keras, keras.optimizers.Adam(0.01), dtype, skip=(1, 1))
    assert err(run_torch(lambda p: KerasAdam(p, 0.01), tdtype, skip=(1, 1)), theirs) <= tol


TF_KERAS = [
    ("adam", lambda o: o.Adam(0.01, amsgrad=True, weight_decay=0.1), OPTIMIZERS[1][2]),
    ("adamw", lambda o: o.AdamW(), KerasAdamW),
    ("rmsprop", lambda o: o.RMSprop(0.01, momentum=0.9, centered=True), OPTIMIZERS[7][2]),
    ("sgd", lambda o: o.SGD(0.1, momentum=0.9, nesterov=True, weight_decay=0.01), OPTIMIZERS[8][2]),
]


@pytest.mark.parametrize("dtype,tdtype,tol", DTYPES, ids=[d[0] for d in DTYPES])
@pytest.mark.parametrize("case", TF_KERAS, ids=[c[0] for c in TF_KERAS])
def test_optimizer_matches_tf_keras(tf, tf_keras, case, dtype, tdtype, tol):
    """tf-keras's optimizers compute the same updates (its RMSprop multiplies by rsqrt)."""
    _, make, ours = case
    theirs = run_tf_keras(tf, make(tf_keras.optimizers), dtype)
    assert err(run_torch(ours, tdtype), theirs) <= tol


def test_state_dict_resumes_exactly():
    ps = [torch.nn.Parameter(torch.randn(4, dtype=torch.float64))]
    grads = [torch.randn(4, dtype=torch.float64) for _ in range(4)]
    a = KerasAdam(ps, 0.01)
    for g in grads[:2]:
        ps[0].grad = g
        a.step()
    copy = [torch.nn.Parameter(ps[0].detach().clone())]
    b = KerasAdam(copy, 0.01)
    b.load_state_dict(copy_module.deepcopy(a.state_dict()))  # as torch.save/load would
    assert b.param_groups[0]["iterations"] == 2
    for g in grads[2:]:
        ps[0].grad, copy[0].grad = g, g.clone()
        a.step()
        b.step()
    assert torch.equal(ps[0], copy[0])


@pytest.mark.parametrize(
    "make,match",
    [
        (lambda p: KerasAdam(p, use_ema=True), "argument 'use_ema'.*AveragedModel"),
        (lambda p: KerasSGD(p, gradient_accumulation_steps=2), "gradient_accumulation_steps"),
        (lambda p: KerasRMSprop(p, clipnorm=1.0, clipvalue=1.0), "only one can be set"),
        (lambda p: KerasAdam(p, beta_1=1.0), "argument 'beta_1'"),
        (lambda p: KerasSGD(p, momentum=1.5), "argument 'momentum'"),
        (lambda p: KerasAdam(p, lr=-1.0), "argument 'learning_rate'"),
    ],
)
def test_optimizer_argument_errors(make, match):
    with pytest.raises(ValueError, match=match):
        make([torch.nn.Parameter(torch.zeros(2))])


# ---- losses ------------------------------------------------------------------------------------
def loss_data():
    g = torch.Generator().manual_seed(3)
    n, c = 16, 5
    logits = torch.randn(n, c, generator=g, dtype=torch.float64) * 4
    probs = torch.softmax(logits, -1)
    # exact zeros and ones: the clipping to [1e-7, 1 - 1e-7] decides these rows
    probs[0] = torch.tensor([1.0, 0, 0, 0, 0])
    probs[1] = torch.tensor([0, 0.5, 0.5, 0, 0])
    probs[2] = torch.tensor([0.2, 0, 0.8, 0, 0])
    labels = torch.randint(0, c, (n,), generator=g)
    labels[0] = 1
    bprobs = torch.rand(n, 3, generator=g, dtype=torch.float64)
    bprobs[0] = torch.tensor([0.0, 1.0, 0.5])
    bprobs[1] = torch.tensor([1.0, 0.0, 1e-9])
    btarget = (torch.rand(n, 3, generator=g) > 0.5).double()
    btarget[0] = torch.tensor([1.0, 0, 1])
    btarget[1] = torch.tensor([0.0, 1, 1])
    sw = torch.rand(n, generator=g, dtype=torch.float64)
    return dict(
        logits=logits,
        probs=probs,
        labels=labels,
        onehot=F.one_hot(labels, c).double(),
        bprobs=bprobs,
        btarget=btarget,
        blogits=logits[:, :3].contiguous(),
        sw=sw,
    )


# (id, Keras loss object (keras.losses module, dtype), ours, y_true key, y_pred key)
LOSSES = [
    ("scce-probs", lambda K, d: K.SparseCategoricalCrossentropy(dtype=d), None, "labels", "probs"),
    (
        "scce-logits",
        lambda K, d: K.SparseCategoricalCrossentropy(from_logits=True, dtype=d),
        lambda y, x: L.sparse_categorical_crossentropy(y, x, True),
        "labels",
        "logits",
    ),
    ("cce-probs", lambda K, d: K.CategoricalCrossentropy(dtype=d), None, "onehot", "probs"),
    (
        "cce-probs-smoothing",
        lambda K, d: K.CategoricalCrossentropy(label_smoothing=0.1, dtype=d),
        lambda y, x: L.categorical_crossentropy(y, x, label_smoothing=0.1),
        "onehot",
        "probs",
    ),
    (
        "cce-logits",
        lambda K, d: K.CategoricalCrossentropy(from_logits=True, dtype=d),
        lambda y, x: L.categorical_crossentropy(y, x, True),
        "onehot",
        "logits",
    ),
    ("bce-probs", lambda K, d: K.BinaryCrossentropy(dtype=d), None, "btarget", "bprobs"),
    (
        "bce-logits",
        lambda K, d: K.BinaryCrossentropy(from_logits=True, dtype=d),
        lambda y, x: L.binary_crossentropy(y, x, True),
        "btarget",
        "blogits",
    ),
    (
        "bce-probs-smoothing",
        lambda K, d: K.BinaryCrossentropy(label_smoothing=0.2, dtype=d),
        lambda y, x: L.binary_crossentropy(y, x, label_smoothing=0.2),
        "btarget",
        "bprobs",
    ),
    (
        "scce-sum",
        lambda K, d: K.SparseCategoricalCrossentropy(reduction="sum", dtype=d),
        lambda y, x: L.sparse_categorical_crossentropy(y, x, reduction="sum"),
        "labels",
        "probs",
    ),
]
_DEFAULT_FN = {"scce": "sparse_categorical_crossentropy", "cce": "categorical_crossentropy"}


def _ours(case):
    name, _, ours, _, _ = case
    if ours is not None:
        return ours
    return getattr(L, _DEFAULT_FN.get(name[: name.index("-")], "binary_crossentropy"))


def keras_value_and_grad(tf, loss, y, x, dtype, **kw):
    xv = tf.Variable(x.numpy().astype(dtype))
    with tf.GradientTape() as tape:
        value = loss(y.numpy(), xv, **kw)
    return torch.tensor(value.numpy()), torch.from_numpy(tape.gradient(value, xv).numpy())


def ours_value_and_grad(fn, y, x, tdtype, **kw):
    xt = x.detach().to(tdtype, copy=True).requires_grad_(True)
    value = fn(y, xt, **kw)
    value.backward()
    return value.detach(), xt.grad


@pytest.mark.parametrize("dtype,tdtype,tol", DTYPES, ids=[d[0] for d in DTYPES])
@pytest.mark.parametrize("case", LOSSES, ids=[c[0] for c in LOSSES])
def test_loss_matches_keras(tf, keras, case, dtype, tdtype, tol):
    data = loss_data()
    y, x = data[case[3]], data[case[4]]
    kv, kg = keras_value_and_grad(tf, case[1](keras.losses, dtype), y, x, dtype)
    ov, og = ours_value_and_grad(_ours(case), y, x, tdtype)
    assert rel_err(ov, kv) <= tol and rel_err(og, kg) <= tol


@pytest.mark.parametrize("dtype,tdtype,tol", DTYPES, ids=[d[0] for d in DTYPES])
def test_loss_sample_weight_and_shapes(tf, keras, dtype, tdtype, tol):
    data = loss_data()
    sw = data["sw"]
    kl = keras.losses.SparseCategoricalCrossentropy(dtype=dtype)
    kv, kg = keras_value_and_grad(
        tf, kl, data["labels"], data["probs"], dtype, sample_weight=sw.numpy()
    )
    ov, og = ours_value_and_grad(
        L.sparse_categorical_crossentropy, data["labels"], data["probs"], tdtype, sample_weight=sw
    )
    assert rel_err(ov, kv) <= tol and rel_err(og, kg) <= tol
    # [N] targets against [N, 1] probabilities, as Keras matches them
    kb = keras.losses.BinaryCrossentropy(dtype=dtype)
    y, x = data["btarget"][:, 0], data["bprobs"][:, :1]
    kv, kg = keras_value_and_grad(tf, kb, y, x, dtype)
    ov, og = ours_value_and_grad(L.binary_crossentropy, y, x, tdtype)
    assert rel_err(ov, kv) <= tol and rel_err(og, kg) <= tol


@pytest.mark.parametrize("dtype,tdtype,tol", DTYPES, ids=[d[0] for d in DTYPES])
def test_losses_match_tf_keras(tf, tf_keras, dtype, tdtype, tol):
    """tf-keras: the same categorical losses; its binary one adds 1e-7 inside the logs."""
    data = loss_data()
    old = tf_keras.backend.floatx()
    tf_keras.backend.set_floatx(dtype)
    try:
        K = tf_keras.losses
        pairs = [
            (
                K.SparseCategoricalCrossentropy(),
                L.sparse_categorical_crossentropy,
                "labels",
                "probs",
            ),
            (K.CategoricalCrossentropy(), L.categorical_crossentropy, "onehot", "probs"),
            (
                K.BinaryCrossentropy(),
                lambda y, x: L.binary_crossentropy(y, x, tf_keras=True),
                "btarget",
                "bprobs",
            ),
        ]
        for loss, ours, yk, xk in pairs:
            kv, kg = keras_value_and_grad(tf, loss, data[yk], data[xk], dtype)
            ov, og = ours_value_and_grad(ours, data[yk], data[xk], tdtype)
            assert rel_err(ov, kv) <= tol and rel_err(og, kg) <= tol
        # Keras 3's binary formula is not tf-keras's on clipped probabilities
        kv, _ = keras_value_and_grad(
            tf, K.BinaryCrossentropy(), data["btarget"], data["bprobs"], dtype
        )
        assert rel_err(L.binary_crossentropy(data["btarget"], data["bprobs"].to(tdtype)), kv) > 1e-2
    finally:
        tf_keras.backend.set_floatx(old)


def test_torch_losses_do_not_clip_like_keras(tf, keras):
    """torch's built-ins on the same probabilities: log(0) = -inf, or a log clamped at -100."""
    data = loss_data()
    p, y = data["probs"], data["labels"]
    keras_value = float(keras.losses.SparseCategoricalCrossentropy(dtype="float64")(y, p))
    assert L.sparse_categorical_crossentropy(y, p).item() == pytest.approx(keras_value, rel=1e-12)
    assert F.nll_loss(torch.log(p), y).item() == float("inf")
    bp, by = data["bprobs"], data["btarget"]
    keras_bce = float(keras.losses.BinaryCrossentropy(dtype="float64")(by, bp))
    assert abs(F.binary_cross_entropy(bp, by).item() - keras_bce) > 1.0


def test_keras_softmax_output_is_scored_from_its_logits(tf, keras):
    """Keras 3 on TF: a loss on a Keras softmax's output reads the logits (`_keras_logits`),
    eagerly and in evaluate/fit; the clipped-probability formula gives another number."""
    x = np.array([[1.0, 0.0], [0.0, 1.0]], np.float32)
    y = np.array([2, 0])
    w = np.array([[100.0, 0.0, -100.0], [0.0, 1.0, 2.0]], np.float32)
    inp = keras.Input((2,))
    model = keras.Model(inp, keras.layers.Dense(3, activation="softmax")(inp))
    model.layers[-1].set_weights([w, np.zeros(3, np.float32)])
    eager = float(keras.losses.SparseCategoricalCrossentropy()(y, model(x)))
    model.compile(loss="sparse_categorical_crossentropy")
    evaluated = model.evaluate(x, y, verbose=0)
    logits = torch.from_numpy(x @ w)
    from_logits = L.sparse_categorical_crossentropy(torch.from_numpy(y), logits, True).item()
    from_probs = L.sparse_categorical_crossentropy(torch.from_numpy(y), logits.softmax(-1)).item()
    assert eager == pytest.approx(from_logits, rel=1e-6)
    assert evaluated == pytest.approx(from_logits, rel=1e-6)
    assert from_logits == pytest.approx(101.2038, rel=1e-5)
    assert from_probs == pytest.approx(9.26285, rel=1e-5)


# ---- batch normalisation momentum --------------------------------------------------------------
def test_batch_norm_momentum_conversion(tf, keras):
    """Keras BatchNormalization(momentum=0.99, epsilon=1e-3) = torch BatchNorm2d(momentum=0.01,
    eps=1e-3) for the moving mean; torch's moving variance uses the Bessel-corrected batch
    variance, Keras 3's the biased one: nn.FusedBatchNorm(moving_variance="biased") matches."""
    g = torch.Generator().manual_seed(5)
    xs = [torch.randn(4, 3, 3, 6, generator=g) * 2 + 1 for _ in range(3)]  # NHWC
    bn = keras.layers.BatchNormalization()
    bn.build((None, 3, 3, 6))
    tbn = torch.nn.BatchNorm2d(6, momentum=1 - 0.99, eps=1e-3)
    fbn = torch_tfgrads.nn.FusedBatchNorm(6, moving_variance="biased")
    for x in xs:
        y = bn(x.numpy(), training=True)
        ty = tbn(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)
        fy = fbn(x)
    km = torch.from_numpy(bn.moving_mean.numpy())
    kv = torch.from_numpy(bn.moving_variance.numpy())
    assert rel_err(tbn.running_mean, km) <= 1e-6 and rel_err(fbn.running_mean, km) <= 1e-6
    assert rel_err(fbn.running_var, kv) <= 1e-6
    assert rel_err(tbn.running_var, kv) > 1e-4  # 36 values per channel: n / (n - 1) = 1.029
    ky = torch.from_numpy(y.numpy())
    assert rel_err(ty, ky) <= 1e-5 and rel_err(fy, ky) <= 1e-5


@pytest.mark.parametrize(
    "name,args",
    [
        ("sparse_categorical_crossentropy", (torch.tensor([0, 2, 1]), torch.rand(3, 4))),
        ("categorical_crossentropy", (torch.eye(4)[[0, 2, 1]], torch.rand(3, 4))),
        ("binary_crossentropy", (torch.tensor([[0.0, 1.0], [1.0, 1.0]]), torch.rand(2, 2))),
    ],
)
def test_losses_compile_and_export(name, args):
    """The crossentropies under torch.compile(fullgraph=True, dynamic=True) and torch.export,
    on probabilities with exact zeros and ones (the clipping) and from logits."""
    import torch_tfgrads.keras as K

    fn = getattr(K, name)
    y, p = args
    p = p.clone()
    p.view(-1)[0], p.view(-1)[-1] = 0.0, 1.0
    for from_logits in (False, True):
        eager = fn(y, p, from_logits=from_logits)
        compiled = torch.compile(
            lambda y, p, fl=from_logits: fn(y, p, from_logits=fl), fullgraph=True, dynamic=True
        )
        torch.testing.assert_close(compiled(y, p), eager)

    class Loss(torch.nn.Module):
        def forward(self, y, p):
            return fn(y, p)

    ep = torch.export.export(Loss(), (y, p))
    torch.testing.assert_close(ep.module()(y, p), fn(y, p))
