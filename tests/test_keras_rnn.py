"""nn.KerasLSTM / KerasGRU / KerasSimpleRNN / KerasBidirectional against Keras 3's layers (TF
2.21): forward, gradients of every Keras variable, continued training (one bias per gate moves,
as in Keras), the cuDNN op and the step loop agreeing, masks, dropout, errors, compile."""

import itertools

import numpy as np
import pytest
import torch

import torch_tfgrads.nn.keras_rnn as keras_rnn
from helpers import rel_err
from torch_tfgrads.nn import CudnnLSTM, KerasBidirectional, KerasGRU, KerasLSTM, KerasSimpleRNN

MODULES = {"LSTM": KerasLSTM, "GRU": KerasGRU, "SimpleRNN": KerasSimpleRNN}


@pytest.fixture
def cudnn_calls(monkeypatch):
    """How many times the modules ran the cuDNN op."""
    calls = []
    real = keras_rnn.cudnn_rnn_v3

    def counting(*args, **kwargs):
        calls.append(kwargs.get("direction", "unidirectional"))
        return real(*args, **kwargs)

    monkeypatch.setattr(keras_rnn, "cudnn_rnn_v3", counting)
    return calls


def _mask(lengths, steps, holes=()):
    m = np.arange(steps)[None] < np.asarray(lengths)[:, None]
    for row, t in holes:
        m[row, t] = False
    return m


def _keras_layer(keras, kind, units, dtype, **kw):
    layer = getattr(keras.layers, kind)(units, dtype=dtype, **kw)
    return layer


def _randomize_layer(layer, seed):
    rng = np.random.default_rng(seed)
    layer.set_weights([rng.uniform(-0.6, 0.6, size=w.shape) for w in layer.get_weights()])


def _torch_like(keras_layer, module_cls, input_size, dtype, **kw):
    m = module_cls(input_size, keras_layer.units, dtype=dtype, **kw)
    m.set_keras_weights(*keras_layer.get_weights())
    return m


def _both(tf, klayer, module, x, mask, seed_shape_rng, training=False):
    """Outputs and the gradient of sum(out * seed) w.r.t. input and every variable."""
    xt = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(xt)
        out = klayer(xt, mask=None if mask is None else tf.constant(mask), training=training)
        outs = out if isinstance(out, (list, tuple)) else [out]
        seeds = [seed_shape_rng.normal(size=tuple(o.shape)).astype(x.dtype) for o in outs]
        loss = sum(tf.reduce_sum(o * s) for o, s in zip(outs, seeds))
    k_grads = tape.gradient(loss, [xt] + klayer.trainable_weights)
    xs = torch.from_numpy(x).requires_grad_()
    module.train(training)
    t_out = module(xs, None if mask is None else torch.from_numpy(mask))
    t_outs = t_out if isinstance(t_out, list) else [t_out]
    t_loss = sum((o * torch.from_numpy(s)).sum() for o, s in zip(t_outs, seeds))
    params = [xs] + [t for _, t in _keras_tensors(module)]
    t_grads = torch.autograd.grad(t_loss, params)
    fwd = max(rel_err(t, torch.from_numpy(k.numpy())) for t, k in zip(t_outs, outs))
    grad = max(
        rel_err(t, torch.from_numpy(tf.convert_to_tensor(k).numpy()))
        for t, k in zip(t_grads, k_grads)
    )
    return fwd, grad


def _keras_tensors(module):
    if isinstance(module, KerasBidirectional):
        return [
            (f"{s}.{n}", getattr(getattr(module, s), n))
            for s in module.keras_sublayers
            for n in getattr(module, s).keras_variables
        ]
    return [(n, getattr(module, n)) for n in module.keras_variables]


CASES = [
    # kind, options, cuDNN expected
    ("LSTM", {}, True),
    ("LSTM", {"return_sequences": True, "return_state": True}, True),
    ("LSTM", {"go_backwards": True, "return_sequences": True}, True),
    ("LSTM", {"recurrent_activation": "hard_sigmoid", "return_sequences": True}, False),
    ("LSTM", {"use_bias": False, "return_state": True}, True),
    ("GRU", {"return_sequences": True}, True),
    ("GRU", {"go_backwards": True, "return_state": True}, True),
    ("GRU", {"reset_after": False, "return_sequences": True}, False),
    ("SimpleRNN", {"return_sequences": True}, True),
    ("SimpleRNN", {"activation": "relu", "go_backwards": True}, True),
    ("SimpleRNN", {"activation": "sigmoid", "return_state": True}, False),
]


@pytest.mark.needs_tf
@pytest.mark.parametrize("kind,opts,expect_cudnn", CASES)
@pytest.mark.parametrize("masking", ["none", "right", "holes"])
def test_matches_keras_float64(tf, keras, cudnn_calls, kind, opts, expect_cudnn, masking):
    """Each layer against Keras 3 in float64, unmasked, with right padding (the cuDNN op where
    the configuration allows) and with holes (the step loop, as Keras falls back too)."""
    rng = np.random.default_rng(hash((kind, masking)) % 2**32)
    klayer = _keras_layer(keras, kind, 4, "float64", **opts)
    x = rng.normal(size=(5, 7, 3))
    klayer(x)  # build
    _randomize_layer(klayer, 1)
    module = _torch_like(klayer, MODULES[kind], 3, torch.float64, **opts)
    mask = {
        "none": None,
        "right": _mask([7, 4, 1, 6, 7], 7),
        "holes": _mask([7, 4, 7, 6, 7], 7, holes=[(0, 2), (2, 0)]),
    }[masking]
    fwd, grad = _both(tf, klayer, module, x, mask, rng)
    assert fwd <= 1e-12 and grad <= 1e-12, (fwd, grad)
    assert bool(cudnn_calls) == (expect_cudnn and masking != "holes"), cudnn_calls


@pytest.mark.needs_tf
@pytest.mark.parametrize("kind", ["LSTM", "GRU", "SimpleRNN"])
@pytest.mark.parametrize("merge_mode", ["concat", "sum", "ave", "mul", None])
def test_bidirectional_matches_keras_one_cudnn_call(tf, keras, cudnn_calls, kind, merge_mode):
    """Bidirectional: one bidirectional cuDNN call for both directions, with a right-padded
    mask, every merge mode; weights loaded in one call from Keras's get_weights()."""
    rng = np.random.default_rng(7)
    rs = merge_mode != "mul"
    klayer = keras.layers.Bidirectional(
        getattr(keras.layers, kind)(
            3, return_sequences=rs, return_state=merge_mode == "sum", dtype="float64"
        ),
        merge_mode=merge_mode,
        dtype="float64",
    )
    x = rng.normal(size=(4, 6, 2))
    klayer(x)
    _randomize_layer(klayer, 2)
    inner = MODULES[kind](
        2, 3, return_sequences=rs, return_state=merge_mode == "sum", dtype=torch.float64
    )
    module = KerasBidirectional.wrap(inner, merge_mode)
    module.set_keras_weights(klayer.get_weights())  # one call, forward then backward
    for mask in (None, _mask([6, 2, 5, 1], 6)):
        cudnn_calls.clear()
        fwd, grad = _both(tf, klayer, module, x, mask, rng)
        assert fwd <= 1e-12 and grad <= 1e-12, (fwd, grad)
        assert cudnn_calls == ["bidirectional"]


@pytest.mark.needs_tf
@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_float32_matches_keras(tf, keras, kind):
    rng = np.random.default_rng(3)
    klayer = _keras_layer(keras, kind, 16, "float32", return_sequences=True)
    x = rng.normal(size=(8, 12, 10)).astype(np.float32)
    klayer(x)
    module = _torch_like(klayer, MODULES[kind], 10, torch.float32, return_sequences=True)
    fwd, grad = _both(tf, klayer, module, x, _mask([12, 3, 9, 12, 1, 5, 12, 7], 12), rng)
    assert fwd <= 2e-6 and grad <= 5e-6, (fwd, grad)


@pytest.mark.needs_tf
def test_training_moves_the_one_bias_like_keras(tf, keras):
    """Five SGD steps on an LSTM: KerasLSTM ends where Keras does (1e-12, float64); the
    cuDNN-layout nn.CudnnLSTM, which trains both cuDNN biases, does not."""
    rng = np.random.default_rng(5)
    klayer = _keras_layer(keras, "LSTM", 4, "float64")
    x0 = rng.normal(size=(3, 5, 2))
    klayer(x0)
    _randomize_layer(klayer, 3)
    ours = _torch_like(klayer, KerasLSTM, 2, torch.float64)
    two_bias = CudnnLSTM(1, 4, input_size=2, time_major=False, dtype=torch.float64)
    two_bias.set_keras_weights(*klayer.get_weights())
    opt_k = keras.optimizers.SGD(learning_rate=0.25)  # exact in float32, as Keras keeps it
    opt_t = torch.optim.SGD(ours.parameters(), lr=0.25)
    opt_c = torch.optim.SGD(two_bias.parameters(), lr=0.25)
    for _ in range(5):
        x = rng.normal(size=(3, 5, 2))
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(klayer(x) ** 2)
        opt_k.apply_gradients(
            zip(tape.gradient(loss, klayer.trainable_weights), klayer.trainable_weights)
        )
        for module, opt in ((ours, opt_t), (two_bias, opt_c)):
            opt.zero_grad()
            out = module(torch.from_numpy(x))
            y = out if isinstance(out, torch.Tensor) else out[0][:, -1]
            (y**2).sum().backward()
            opt.step()
    expected = [torch.from_numpy(w) for w in klayer.get_weights()]
    err = max(rel_err(getattr(ours, n), e) for n, e in zip(ours.keras_variables, expected))
    assert err <= 1e-12, err
    bias_err = rel_err(two_bias.keras_weights()[2], expected[2])
    assert bias_err > 1e-3, bias_err  # the effective bias moved twice as fast


@pytest.mark.needs_tf
@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_dropout(tf, keras, kind):
    """dropout/recurrent_dropout: Keras's masks (one per call, the same at every step; one per
    gate with recurrent dropout) from torch's generator. In inference the layer is Keras's."""
    rng = np.random.default_rng(9)
    for opts in ({"dropout": 0.3}, {"dropout": 0.2, "recurrent_dropout": 0.4}):
        klayer = _keras_layer(keras, kind, 4, "float64", return_sequences=True, **opts)
        x = rng.normal(size=(6, 5, 3))
        klayer(x)
        _randomize_layer(klayer, 4)
        module = _torch_like(klayer, MODULES[kind], 3, torch.float64, return_sequences=True, **opts)
        fwd, grad = _both(tf, klayer, module, x, None, rng, training=False)
        assert fwd <= 1e-12 and grad <= 1e-12
        module.train()
        torch.manual_seed(0)
        a = module(torch.from_numpy(x))
        torch.manual_seed(0)
        b = module(torch.from_numpy(x))
        c = module(torch.from_numpy(x))
        assert torch.equal(a, b) and not torch.equal(a, c)
        assert rel_err(a, module.eval()(torch.from_numpy(x))) > 1e-3
    # input dropout alone keeps the cuDNN op; the mask is the same at every step
    m = KerasLSTM(3, 4, dropout=0.5, return_sequences=True, dtype=torch.float64).train()
    assert m.cudnn_mode == "lstm"
    x = torch.ones(200, 5, 3, dtype=torch.float64, requires_grad=True)
    m(x).sum().backward()
    zeros = x.grad == 0
    assert torch.equal(zeros, zeros[:, :1].expand_as(zeros)) and 0.3 < zeros.double().mean() < 0.7


def test_cudnn_and_loop_agree_and_gradcheck():
    """The two implementations agree in every mode (float64), and the cuDNN path with a mask
    passes gradcheck through the gathers that restore Keras's outputs at masked steps."""
    torch.manual_seed(0)
    mask = torch.arange(5)[None] < torch.tensor([5, 2, 1, 4])[:, None]
    x = torch.randn(4, 5, 3, dtype=torch.float64)
    for cls, gb, rs in itertools.product(MODULES.values(), [False, True], [False, True]):
        kw = dict(go_backwards=gb, return_sequences=rs, return_state=True, dtype=torch.float64)
        a, b = cls(3, 2, **kw), cls(3, 2, use_cudnn=False, **kw)
        b.load_state_dict(a.state_dict())
        for m in (None, mask):
            for p, q in zip(a(x, m), b(x, m)):
                assert (p - q).abs().max() <= 1e-13
    m = KerasLSTM(3, 2, go_backwards=True, return_sequences=True, dtype=torch.float64)
    xg = x.clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda x_, k: m(x_, mask) + 0 * k.sum(), (xg, m.kernel))
    bi = KerasBidirectional.wrap(KerasGRU(3, 2, return_sequences=True, dtype=torch.float64))
    assert torch.autograd.gradcheck(lambda x_: bi(x_, mask), (xg,))


def test_initial_state_and_errors():
    torch.manual_seed(1)
    x = torch.randn(2, 4, 3)
    m = KerasLSTM(3, 5, return_state=True)
    h0, c0 = torch.randn(2, 5), torch.randn(2, 5)
    loop = KerasLSTM(3, 5, return_state=True, use_cudnn=False)
    loop.load_state_dict(m.state_dict())
    for p, q in zip(m(x, initial_state=[h0, c0]), loop(x, initial_state=[h0, c0])):
        assert (p - q).abs().max() <= 1e-6
    with pytest.raises(ValueError, match="'initial_state' must hold 2"):
        m(x, initial_state=[h0])
    with pytest.raises(ValueError, match="'input' must be"):
        m(torch.randn(2, 4, 4))
    with pytest.raises(ValueError, match="'mask' must be bool"):
        m(x, torch.ones(2, 4))
    with pytest.raises(ValueError, match="'units' must be a positive int"):
        KerasGRU(3, 0)
    with pytest.raises(ValueError, match="'dropout' must be in"):
        KerasGRU(3, 2, dropout=1.0)
    with pytest.raises(ValueError, match="'activation'='swishy' is not supported"):
        KerasSimpleRNN(3, 2, activation="swishy")
    with pytest.raises(ValueError, match="use_cudnn=True, but cuDNN cannot express"):
        KerasLSTM(3, 2, recurrent_activation="hard_sigmoid", use_cudnn=True)
    strict = KerasLSTM(3, 2, use_cudnn=True)
    with pytest.raises(ValueError, match="mask is not right-padded"):
        strict(x, torch.tensor([[False, True, True, True]] * 2))
    with pytest.raises(TypeError, match="'backward_layer' must be"):
        KerasBidirectional(m, torch.nn.LSTM(3, 5))
    bi = KerasBidirectional.wrap(KerasGRU(3, 2))
    with pytest.raises(ValueError, match="expects 6 arrays"):
        bi.set_keras_weights([np.zeros((3, 6))] * 3)
    # empty batch: the step loop, empty outputs of the right shape
    assert KerasGRU(3, 2, return_sequences=True)(torch.randn(0, 4, 3)).shape == (0, 4, 2)


def test_compile_fullgraph_and_half_types():
    torch.manual_seed(2)
    bi = KerasBidirectional.wrap(KerasLSTM(3, 4, return_sequences=True))
    x = torch.randn(2, 5, 3)
    ref = bi(x)
    compiled = torch.compile(bi, fullgraph=True, dynamic=True)
    assert torch.allclose(compiled(x), ref, atol=1e-6)
    x2 = torch.randn(3, 7, 3)
    assert torch.allclose(compiled(x2), bi(x2), atol=1e-6)
    for dtype in (torch.bfloat16, torch.float16):
        low = KerasBidirectional.wrap(KerasLSTM(3, 4, return_sequences=True, dtype=dtype))
        low.load_state_dict({k: v.to(dtype) for k, v in bi.state_dict().items()})
        y = low(x.to(dtype))
        assert y.dtype == dtype and rel_err(y.float(), ref) <= 2e-2


def test_export():
    """torch.export keeps the cuDNN op of an unmasked KerasBidirectional(KerasGRU)."""
    torch.manual_seed(3)
    bi = KerasBidirectional.wrap(KerasGRU(3, 4, return_sequences=True), "sum")
    x = torch.randn(2, 5, 3)
    ep = torch.export.export(bi, (x,))
    targets = {str(n.target) for n in ep.graph.nodes if n.op == "call_function"}
    assert "tfgrads.cudnn_rnn_v3.default" in targets, targets
    x2 = torch.randn(2, 5, 3)
    assert torch.allclose(ep.module()(x2), bi(x2), atol=1e-6)
