"""torch_tfgrads.keras against Keras 3 (TF 2.21): models built and saved by Keras, loaded without
TensorFlow, compared in inference, in training (outputs, moving statistics) and in the gradients
of a loss w.r.t. every weight. Tolerances are the ones docs/keras.md states."""

import json
import os
import pathlib
import subprocess
import sys
import zipfile

import h5py
import numpy as np
import pytest
import torch

from helpers import BLOCK_TF, rel_err
from keras_helpers import compare as _compare
from keras_helpers import save as _save
from keras_helpers import var as _var
from torch_tfgrads.diff.example import randomize as _randomize
from torch_tfgrads.keras import KerasLoadError, load_model, load_weights

pytestmark = pytest.mark.needs_tf


def _cnn(keras, size=9):
    """A renamed, branching stack with the MobileNetV2 layers plus pools and merges."""
    L = keras.layers
    inp = L.Input((size, size, 3), name="image")
    x = L.Rescaling(1 / 2.0, offset=-0.5, name="zz_rescale")(inp)
    x = L.Conv2D(8, 3, strides=2, padding="same", use_bias=False, name="b_first")(x)
    x = L.BatchNormalization(name="a_bn")(x)
    x = L.ReLU(6.0, name="relu6")(x)
    y = L.DepthwiseConv2D(3, padding="same", name="dw")(x)
    y = L.BatchNormalization(momentum=0.9, name="bn_dw")(y)
    y = L.ReLU(max_value=4.0, negative_slope=0.1, threshold=0.05, name="relu_odd")(y)
    y = L.Conv2D(8, 1, name="project")(y)
    x = L.Add(name="res")([x, y])
    x = L.ZeroPadding2D(((0, 1), (1, 0)), name="pad")(x)
    x = L.Conv2D(
        6, 3, strides=2, dilation_rate=1, padding="valid", activation="swish", name="c_valid"
    )(x)
    m = L.MaxPooling2D(3, strides=2, padding="same", name="maxp")(x)
    a = L.AveragePooling2D(3, strides=2, padding="same", name="avgp")(x)
    x = L.Concatenate(name="cat")([m, a])
    g = L.GlobalAveragePooling2D(keepdims=True, name="gap")(x)
    x = L.Multiply(name="mul")([x, L.Activation("hard_sigmoid", name="hs")(g)])
    x = L.Flatten(name="flat")(x)
    x = L.Dropout(0.0, name="drop")(x)
    x = L.Dense(5, activation="elu", name="fc")(x)
    out = L.Activation("softmax", name="probs")(x)
    return keras.Model(inp, out, name="cnn")


@pytest.mark.parametrize("ext", ["keras", "h5"])
def test_cnn_float64(tf, keras, floatx, tmp_path, ext):
    floatx("float64")
    kmodel = _cnn(keras)
    _randomize(kmodel)
    module = load_model(_save(kmodel, tmp_path, ext))
    x = np.random.default_rng(2).normal(size=(4, 9, 9, 3))
    _compare(tf, kmodel, module, [x], 1e-12, 1e-12)


def test_cnn_float32(tf, keras, tmp_path):
    kmodel = _cnn(keras)
    _randomize(kmodel)
    module = load_model(_save(kmodel, tmp_path, "keras"))
    assert module.fc.kernel.dtype == torch.float32
    x = np.random.default_rng(2).normal(size=(4, 9, 9, 3)).astype(np.float32)
    _compare(tf, kmodel, module, [x], 1e-5, 1e-5)


ACTIVATIONS = [
    "relu",
    "relu6",
    "sigmoid",
    "tanh",
    "softmax",
    "swish",
    "silu",
    "gelu",
    "elu",
    "selu",
    "softplus",
    "softsign",
    "hard_sigmoid",
    "hard_silu",
    "linear",
    "leaky_relu",
    "mish",
    "exponential",
    "log_softmax",
]


def _activation_model(keras):
    """Two inputs, a shared Dense, one output per activation (and per ReLU/gelu variant)."""
    L = keras.layers
    a, b = L.Input((6,), name="a"), L.Input((6,), name="b")
    shared = L.Dense(7, name="shared")
    h = L.Subtract(name="sub")([shared(a), shared(b)])
    h = L.Average(name="avg")([h, L.Maximum(name="max")([shared(a), h])])
    outs = [L.Activation(act, name=f"act_{act}")(h) for act in ACTIVATIONS]
    outs += [
        L.Dense(3, activation=keras.activations.gelu, name="gelu_fn")(h),
        L.Softmax(axis=-1, name="softmax_layer")(h),
        L.LeakyReLU(negative_slope=0.25, name="leaky")(h),
        L.ReLU(max_value=1.5, name="relu_clip")(h),
        L.ReLU(negative_slope=0.2, threshold=0.3, name="relu_thr")(h),
        L.ReLU(negative_slope=0.2, name="relu_leaky")(h),
        L.LayerNormalization(name="ln")(h),
    ]
    return keras.Model([a, b], outs, name="acts")


@pytest.mark.parametrize("ext", ["keras", "h5"])
def test_activations_multi_io_shared_float64(tf, keras, floatx, tmp_path, ext):
    floatx("float64")
    kmodel = _activation_model(keras)
    _randomize(kmodel)
    module = load_model(_save(kmodel, tmp_path, ext))
    rng = np.random.default_rng(3)
    x = [rng.normal(size=(5, 6)), rng.normal(size=(5, 6))]
    # exact gelu: TF's float64 tf.nn.gelu is off by up to 5e-9 from the exact value, ours is not
    _compare(tf, kmodel, module, x, 1e-8, 1e-8)


def test_gelu_tanh_and_relu6_boundaries(tf):
    """gelu(approximate=True) as tf.nn.gelu; relu6/hard_sigmoid gradients 0 at the kinks."""
    from torch_tfgrads.keras.activations import ACTIVATIONS, gelu_tanh

    x = np.array([-9.0, -3.0, -1.0, 0.0, 0.5, 3.0, 6.0, 7.0])
    t = torch.tensor(x, requires_grad=True)
    y = gelu_tanh(t)
    (g,) = torch.autograd.grad(y.sum(), t)
    xt = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(xt)
        k = tf.nn.gelu(xt, approximate=True)
    # TF's float64 tanh is accurate to ~1e-10 only
    assert rel_err(y, torch.from_numpy(k.numpy())) <= 1e-9
    assert rel_err(g, torch.from_numpy(tape.gradient(k, xt).numpy())) <= 1e-9
    for name, tf_fn in (
        ("relu6", tf.nn.relu6),
        ("hard_sigmoid", lambda v: tf.nn.relu6(v + 3.0) / 6.0),
    ):
        t = torch.tensor(x, requires_grad=True)
        (g,) = torch.autograd.grad(ACTIVATIONS[name](t).sum(), t)
        with tf.GradientTape() as tape:
            tape.watch(xt)
            k = tf_fn(xt)
        assert torch.equal(g, torch.from_numpy(tape.gradient(k, xt).numpy())), name


def _mobilenet(keras):
    return keras.applications.MobileNetV2(
        input_shape=(32, 32, 3),
        alpha=0.35,
        weights=None,
        classes=7,
        classifier_activation="softmax",
    )


def test_mobilenet_v2_float64(tf, keras, floatx, tmp_path):
    """keras.applications.MobileNetV2 (alpha 0.35, 52 batch norms): inference, training,
    gradients of every weight and the 104 moving statistics after one training call."""
    floatx("float64")
    kmodel = _mobilenet(keras)
    _randomize(kmodel, seed=4)
    module = load_model(_save(kmodel, tmp_path, "keras"))
    assert len([m for m in module.modules() if m.keras_class == "BatchNormalization"]) == 52
    x = np.random.default_rng(5).normal(size=(3, 32, 32, 3))
    _compare(tf, kmodel, module, [x], 1e-10, 1e-9)


def test_mobilenet_v2_float32_h5_and_double(tf, keras, tmp_path):
    """float32 from a legacy .h5 with Keras's initial weights, in inference (with random weights
    and in training float32 rounding is amplified beyond any useful tolerance: 52 batch norms,
    the last ones over 2 x 1 x 1 activations; the float64 test covers those); then .double()."""
    kmodel = _mobilenet(keras)
    module = load_model(_save(kmodel, tmp_path, "h5"))
    x = np.random.default_rng(5).normal(size=(2, 32, 32, 3)).astype(np.float32)
    _compare(tf, kmodel, module, [x], 1e-5, 1e-5, modes=(False,))
    module.double().eval()
    y64 = module(torch.from_numpy(x).double())
    y32 = kmodel(x, training=False).numpy()
    assert y64.dtype == torch.float64 and rel_err(y64, torch.from_numpy(y32)) <= 1e-5


def test_batch_norm_rule_follows_keras_version(tf, keras, tmp_path):
    """Keras 3 files: biased moving variance. A file written by Keras 2 (its keras_version):
    Bessel-corrected on the fused path (4-D input), biased otherwise."""
    L = keras.layers
    inp = L.Input((4, 4, 3))
    x = L.BatchNormalization(name="bn4")(inp)
    x = L.Flatten()(x)
    out = L.BatchNormalization(name="bn2")(x)
    kmodel = keras.Model(inp, out)
    _randomize(kmodel)
    path = _save(kmodel, tmp_path, "h5")
    x = torch.from_numpy(np.random.default_rng(0).normal(size=(3, 4, 4, 3)).astype(np.float32))
    m3 = load_model(path).train()
    m3(x)
    assert m3.bn4.moving_variance_rule == "biased"
    with h5py.File(path, "r+") as f:
        f.attrs["keras_version"] = "2.15.0"
    m2 = load_model(path).train()
    m2(x)
    assert (m2.bn4.moving_variance_rule, m2.bn2.moving_variance_rule) == ("bessel", "biased")
    n = 3 * 4 * 4
    v = x.reshape(-1, 3).var(0, unbiased=False)
    old = torch.from_numpy(kmodel.get_layer("bn4").moving_variance.numpy())
    assert torch.allclose(m3.bn4.moving_variance, old * 0.99 + v * 0.01, rtol=1e-6)
    assert torch.allclose(m2.bn4.moving_variance, old * 0.99 + v * n / (n - 1) * 0.01, rtol=1e-6)
    assert not torch.allclose(m2.bn4.moving_variance, m3.bn4.moving_variance, rtol=1e-6)


def test_fused_batch_norm_biased_option():
    """nn.FusedBatchNorm(moving_variance="biased") = Keras 3's update, in its rounding order."""
    from torch_tfgrads.nn import FusedBatchNorm

    x = torch.randn(4, 3, 3, 5)
    bn = FusedBatchNorm(5, moving_variance="biased").train()
    mean0, var0 = torch.rand(5), torch.rand(5) + 0.5
    bn.running_mean.copy_(mean0)
    bn.running_var.copy_(var0)
    bn(x)
    m, v = x.mean((0, 1, 2)), x.var((0, 1, 2), unbiased=False)
    assert torch.allclose(bn.running_mean, mean0 * 0.99 + m * (1.0 - 0.99), rtol=1e-6)
    assert torch.allclose(bn.running_var, var0 * 0.99 + v * (1.0 - 0.99), rtol=1e-6)
    with pytest.raises(ValueError, match="moving_variance"):
        FusedBatchNorm(5, moving_variance="unbiased")


_TF_FREE_CHILD = (
    BLOCK_TF
    + """
import sys
import numpy as np, torch
import torch_tfgrads.keras as K
for path in sys.argv[2:]:
    m = K.load_model(path).eval()
    y = m(torch.from_numpy(np.load(sys.argv[1])))
    np.save(path + ".out.npy", y.detach().numpy())
    K.load_weights(m, path)
bad = [n for n in sys.modules if n.split(".")[0] in ("tensorflow", "keras")]
assert not bad, bad
print("OK")
"""
)


def test_loads_without_tensorflow(tf, keras, tmp_path):
    """A subprocess in which `import tensorflow`/`import keras` fail loads .keras and .h5."""
    kmodel = _cnn(keras)
    _randomize(kmodel)
    paths = [_save(kmodel, tmp_path, "keras"), _save(kmodel, tmp_path, "h5")]
    x = np.random.default_rng(2).normal(size=(2, 9, 9, 3)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    r = subprocess.run(
        [sys.executable, "-c", _TF_FREE_CHILD, str(tmp_path / "x.npy"), *paths],
        capture_output=True,
        text=True,
        env=env,
        cwd=root,
    )
    assert r.returncode == 0 and "OK" in r.stdout, r.stderr[-3000:]
    want = kmodel(x, training=False).numpy()
    for p in paths:
        assert rel_err(torch.from_numpy(np.load(p + ".out.npy")), torch.from_numpy(want)) <= 1e-5


def _small(keras, name="small"):
    L = keras.layers
    inp = L.Input((4, 4, 2))
    x = L.Conv2D(3, 3, padding="same", name="conv")(inp)
    x = L.BatchNormalization(name="bn")(x)
    x = L.GlobalMaxPooling2D(name="gmp")(x)
    return keras.Model(inp, L.Dense(2, name="head")(x), name=name)


def test_bad_files(keras, tmp_path):
    kmodel = _small(keras)
    good = _save(kmodel, tmp_path, "keras")
    data = pathlib.Path(good).read_bytes()
    truncated = tmp_path / "truncated.keras"
    truncated.write_bytes(data[: len(data) // 2])
    with pytest.raises(KerasLoadError, match="truncated"):
        load_model(truncated)
    # weights missing for one layer (legacy .h5, dataset deleted)
    h5 = _save(kmodel, tmp_path, "h5")
    with h5py.File(h5, "r+") as f:
        del f["model_weights/bn/bn/moving_variance"]
    with pytest.raises(KerasLoadError, match="'bn'.*moving_variance"):
        load_model(h5)
    # a weights file of another architecture: shape mismatch named, nothing copied
    module = load_model(good)
    before = {k: v.clone() for k, v in module.state_dict().items()}
    L = keras.layers
    inp = L.Input((4, 4, 2))
    x = L.Conv2D(5, 3, padding="same", name="conv")(inp)
    x = L.BatchNormalization(name="bn")(x)
    x = L.GlobalMaxPooling2D(name="gmp")(x)
    other = keras.Model(inp, L.Dense(2, name="head")(x))
    other.save_weights(str(tmp_path / "other.weights.h5"))
    with pytest.raises(KerasLoadError, match="layer 'conv'.*kernel"):
        load_weights(module, tmp_path / "other.weights.h5")
    after = module.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    # a weights-only file of the same model loads; a weights file alone is not a model
    _randomize(kmodel, seed=9)
    kmodel.save_weights(str(tmp_path / "same.weights.h5"))
    load_weights(module, tmp_path / "same.weights.h5")
    assert np.array_equal(
        module.head.kernel.detach().numpy(), kmodel.get_layer("head").kernel.numpy()
    )
    with pytest.raises(KerasLoadError, match="weights-only"):
        load_model(tmp_path / "same.weights.h5")


def test_unsupported_layers_refused_by_name(keras, tmp_path):
    L = keras.layers
    inp = L.Input((6,))
    x = L.Dense(4, name="d")(inp)
    x = L.GaussianNoise(0.1, name="noise")(x)
    out = L.Lambda(lambda t: t * 2, name="double_it")(x)
    path = str(tmp_path / "lam.keras")
    keras.Model(inp, out).save(path)
    with pytest.raises(KerasLoadError) as e:
        load_model(path)
    msg = str(e.value)
    assert "'noise' (GaussianNoise)" in msg and "'double_it' (Lambda)" in msg
    assert "Conv2D" in msg and "custom_converters" in msg
    # the documented hook maps them
    module = load_model(
        path,
        custom_converters={
            "Lambda": lambda cfg, arrays: torch.nn.Identity(),
            "GaussianNoise": lambda cfg, arrays: torch.nn.Identity(),
        },
    )
    assert isinstance(module.double_it, torch.nn.Identity)


def test_nested_model_and_state_dict_names(tf, keras, tmp_path):
    """A model used as a layer, twice (shared); Keras's names in the state_dict; .keras group
    names come from class names, so layers named out of class order still map right."""
    inner = _small(keras, name="inner")
    L = keras.layers
    a, b = L.Input((4, 4, 2), name="a"), L.Input((4, 4, 2), name="b")
    z = L.Conv2D(2, 1, name="aaa_conv")(a)
    out = L.Concatenate(name="cat")([inner(z), inner(b)])
    kmodel = keras.Model([a, b], [out, L.Dense(1, name="zz")(out)])
    _randomize(kmodel)
    module = load_model(_save(kmodel, tmp_path, "keras"))
    keys = set(module.state_dict())
    assert {
        "aaa_conv.kernel",
        "inner.conv.kernel",
        "inner.bn.gamma",
        "inner.bn.moving_variance",
        "inner.head.bias",
        "zz.kernel",
    } <= keys
    rng = np.random.default_rng(0)
    x = [rng.normal(size=(3, 4, 4, 2)).astype(np.float32) for _ in range(2)]
    errs = {}
    for training in (False, True):
        module.train(training)
        want = kmodel(x, training=training)
        got = module(*[torch.from_numpy(v) for v in x])
        errs[training] = max(rel_err(g, torch.from_numpy(w.numpy())) for g, w in zip(got, want))
    assert max(errs.values()) <= 1e-5, errs


def _sequential_1d(keras):
    L = keras.layers
    return keras.Sequential(
        [
            L.Input((11,), dtype="int32"),
            L.Embedding(20, 6, name="emb"),
            L.Conv1D(4, 3, padding="causal", dilation_rate=2, activation="relu", name="c1"),
            L.Conv1D(6, 3, strides=2, padding="same", groups=2, name="c2"),
            L.LayerNormalization(name="ln"),
            L.MaxPooling1D(2, padding="same", name="mp"),
            L.AveragePooling1D(2, strides=1, padding="same", name="ap"),
            L.SpatialDropout1D(0.0, name="sd"),
            L.Permute((2, 1), name="perm"),
            L.Reshape((3, -1), name="rs"),
            L.GlobalMaxPooling1D(name="gmp"),
            L.Dense(4, activation="tanh", name="out"),
        ],
        name="seq1d",
    )


def _sequential_2d(keras):
    L = keras.layers
    return keras.Sequential(
        [
            L.Input((7, 6, 3)),
            L.SeparableConv2D(4, 3, padding="same", depth_multiplier=2, name="sep"),
            L.Cropping2D(((1, 0), (0, 2)), name="crop"),
            L.UpSampling2D((2, 1), name="up"),
            L.BatchNormalization(center=False, name="bn_noc"),
            L.DepthwiseConv2D(2, strides=2, dilation_rate=1, use_bias=False, name="dw"),
            L.BatchNormalization(scale=False, momentum=0.5, epsilon=1e-2, name="bn_nos"),
            L.Conv2D(4, 2, dilation_rate=2, padding="same", name="dil"),
            L.GlobalAveragePooling2D(name="gap"),
            L.Dense(3, name="out"),
        ],
        name="seq2d",
    )


@pytest.mark.parametrize("build", [_sequential_1d, _sequential_2d])
@pytest.mark.parametrize("ext", ["keras", "h5"])
def test_sequential_float64(tf, keras, floatx, tmp_path, build, ext):
    floatx("float64")
    kmodel = build(keras)
    _randomize(kmodel, seed=7)
    module = load_model(_save(kmodel, tmp_path, ext))
    rng = np.random.default_rng(8)
    shape = (3,) + tuple(kmodel.inputs[0].shape[1:])
    x = (
        rng.integers(0, 20, size=shape).astype(np.int32)
        if build is _sequential_1d
        else rng.normal(size=shape)
    )
    _compare(tf, kmodel, module, [x], 1e-12, 1e-12)


def test_frozen_batch_norm_pickle_and_keras2_hard_sigmoid(keras, tmp_path):
    """trainable=False: frozen parameters, moving statistics in training (Keras 3); the module
    pickles; a file written by Keras 2 gets Keras 2's hard_sigmoid."""
    L = keras.layers
    inp = L.Input((4, 4, 3))
    bn = L.BatchNormalization(name="bn")
    x = L.Conv2D(2, 1, name="c")(bn(inp))
    kmodel = keras.Model(inp, L.Activation("hard_sigmoid", name="hs")(x))
    bn.trainable = False
    _randomize(kmodel)
    module = load_model(_save(kmodel, tmp_path, "keras")).train()
    assert [n for n, p in module.named_parameters() if not p.requires_grad] == [
        "bn.gamma",
        "bn.beta",
    ]
    x = torch.randn(2, 4, 4, 3)
    y = module(x)
    assert rel_err(y, torch.from_numpy(kmodel(x.numpy(), training=True).numpy())) <= 1e-6
    path = tmp_path / "module.pt"
    torch.save(module, path)
    assert torch.equal(torch.load(path, weights_only=False)(x), y)
    h5 = _save(kmodel, tmp_path, "h5")
    with h5py.File(h5, "r+") as f:
        f.attrs["keras_version"] = "2.15.0"
    old = load_model(h5)
    t = torch.tensor([-3.0, -2.5, 0.0, 1.0, 2.5, 3.0])
    assert old.hs.activation == "hard_sigmoid_keras2"
    from torch_tfgrads.keras.activations import ACTIVATIONS

    assert torch.equal(ACTIVATIONS[old.hs.activation](t), torch.clamp(0.2 * t + 0.5, 0, 1))


def _to_keras2_nodes(layer):
    """Rewrite a Keras 3 layer entry's inbound_nodes into Keras 2's list form."""
    nodes = []
    for node in layer["inbound_nodes"]:
        args = node["args"][0]
        tensors = args if isinstance(args, list) else [args]
        nodes.append([list(t["config"]["keras_history"]) + [{}] for t in tensors])
    layer["inbound_nodes"] = nodes


def test_keras2_legacy_h5_format(tf, keras, floatx, tmp_path):
    """A legacy .h5 in tf-keras's form (Keras 2 node lists, ':0' weight names, keras_version
    2.x, DepthwiseConv2D's depthwise_kernel) loads; the fused batch norms use Bessel's rule."""
    floatx("float64")
    L = keras.layers
    inp = L.Input((5, 5, 2), name="input_1")
    x = L.Conv2D(4, 3, strides=2, padding="same", name="conv")(inp)
    x = L.BatchNormalization(name="bn")(x)
    y = L.DepthwiseConv2D(3, padding="same", name="dw")(x)
    x = L.Add(name="add")([x, y])
    kmodel = keras.Model(inp, L.Dense(2, name="out")(L.Flatten(name="flat")(x)))
    _randomize(kmodel)
    path = _save(kmodel, tmp_path, "h5")
    with h5py.File(path, "r+") as f:
        cfg = json.loads(f.attrs["model_config"])
        for layer in cfg["config"]["layers"]:
            _to_keras2_nodes(layer)
        f.attrs["model_config"] = json.dumps(cfg)
        f.attrs["keras_version"] = "2.15.0"
        for name in ("conv", "bn", "dw", "out"):
            g = f["model_weights"][name]
            new = []
            for w in g.attrs["weight_names"]:
                w = w.decode() if isinstance(w, bytes) else str(w)
                leaf = (
                    "depthwise_kernel"
                    if name == "dw" and w.endswith("kernel")
                    else w.split("/")[-1]
                )
                g.move(w, f"{name}/{leaf}:0")
                new.append(f"{name}/{leaf}:0".encode())
            g.attrs["weight_names"] = new
    module = load_model(path)
    assert "dw.depthwise_kernel" in module.state_dict()
    x = np.random.default_rng(1).normal(size=(4, 5, 5, 2))
    for training in (False, True):
        module.train(training)
        got = module(torch.from_numpy(x))
        assert rel_err(got, torch.from_numpy(kmodel(x, training=training).numpy())) <= 1e-12
    # a float64 layer: tf-keras runs its unfused path (TF's fused kernel has no float64), whose
    # moving variance is the biased one
    assert module.bn.moving_variance_rule == "biased"


def test_normalization_and_prelu_float64(tf, keras, floatx, tmp_path):
    floatx("float64")
    L = keras.layers
    rng = np.random.default_rng(11)
    inp = L.Input((3, 4))
    adapted = L.Normalization(name="norm")
    adapted.adapt(rng.normal(2.0, 3.0, size=(50, 3, 4)))
    x = adapted(inp)
    x = L.PReLU(shared_axes=[1], name="prelu")(x)
    x = L.Normalization(mean=[0.5, -1.0, 0.0, 2.0], variance=[4.0, 1.0, 0.0, 0.25], name="fixed")(x)
    x = L.Normalization(mean=1.5, variance=2.0, invert=True, axis=None, name="inv")(x)
    kmodel = keras.Model(inp, L.Dense(2, name="d")(x))
    kmodel.get_layer("prelu").alpha.assign(rng.uniform(0.1, 0.5, size=(1, 4)))
    module = load_model(_save(kmodel, tmp_path, "keras"))
    _compare(tf, kmodel, module, [rng.normal(size=(5, 3, 4))], 1e-12, 1e-12)


def _text_model(keras):
    L = keras.layers
    inp = L.Input((6,), dtype="int32")
    x = L.Embedding(30, 5, name="emb")(inp)
    x = L.LSTM(4, return_sequences=True, name="lstm")(x)
    x = L.GRU(3, return_sequences=True, go_backwards=True, name="gru_after")(x)
    x = L.GRU(3, reset_after=False, return_sequences=True, name="gru_before")(x)
    seq, h = L.SimpleRNN(2, return_state=True, name="rnn")(x)
    y, h2, c2 = L.LSTM(
        2, return_state=True, recurrent_activation="hard_sigmoid", name="lstm_state"
    )(x)
    return keras.Model(
        inp, [L.Dense(3, name="out")(L.Concatenate()([seq, h, y, h2, c2]))], name="text"
    )


@pytest.mark.parametrize("ext", ["keras", "h5"])
def test_recurrent_float64(tf, keras, floatx, tmp_path, ext):
    floatx("float64")
    kmodel = _text_model(keras)
    _randomize(kmodel, seed=12)
    module = load_model(_save(kmodel, tmp_path, ext))
    x = np.random.default_rng(13).integers(0, 30, size=(4, 6)).astype(np.int32)
    _compare(tf, kmodel, module, [x], 1e-12, 1e-12)


def _bidirectional_model(keras):
    L = keras.layers
    inp = L.Input((5,), dtype="int32")
    x = L.Embedding(20, 4, name="emb")(inp)
    x = L.Bidirectional(L.LSTM(3, return_sequences=True), name="bi_lstm")(x)
    x = L.Bidirectional(L.GRU(3, return_sequences=True), merge_mode="sum", name="bi_gru")(x)
    a = L.Bidirectional(L.SimpleRNN(2), merge_mode="ave", name="bi_rnn")(x)
    b = L.Bidirectional(L.GRU(2, reset_after=False), merge_mode="mul", name="bi_mul")(x)
    c, *states = L.Bidirectional(L.LSTM(2, return_state=True), name="bi_state")(x)
    return keras.Model(
        inp, L.Dense(2, name="out")(L.Concatenate()([a, b, c] + states)), name="bidi"
    )


@pytest.mark.parametrize("ext", ["keras", "h5"])
def test_bidirectional_float64(tf, keras, floatx, tmp_path, ext):
    floatx("float64")
    kmodel = _bidirectional_model(keras)
    _randomize(kmodel, seed=14)
    path = _save(kmodel, tmp_path, ext)
    module = load_model(path)
    assert "bi_lstm.forward_layer.kernel" in module.state_dict()
    x = np.random.default_rng(15).integers(0, 20, size=(3, 5)).astype(np.int32)
    _compare(tf, kmodel, module, [x], 1e-12, 1e-12)
    load_weights(module, path)  # the same file loads back into the module


def test_training_steps_match_keras_float64(tf, keras, floatx, tmp_path):
    """Three SGD steps in Keras and on the converted module (torch.optim.SGD is Keras's SGD
    without momentum): every weight and moving statistic afterwards, in float64."""
    floatx("float64")
    kmodel = _cnn(keras)
    _randomize(kmodel, seed=21)
    module = load_model(_save(kmodel, tmp_path, "keras")).train()
    rng = np.random.default_rng(22)
    opt_k = keras.optimizers.SGD(learning_rate=0.05)
    opt_t = torch.optim.SGD(module.parameters(), lr=0.05)
    for _ in range(3):
        x = rng.normal(size=(4, 9, 9, 3))
        labels = rng.integers(0, 5, size=4)
        with tf.GradientTape() as tape:
            p = kmodel(x, training=True)
            loss = -tf.reduce_mean(tf.math.log(tf.gather(p, labels, batch_dims=1)))
        opt_k.apply_gradients(
            zip(tape.gradient(loss, kmodel.trainable_weights), kmodel.trainable_weights)
        )
        opt_t.zero_grad()
        q = module(torch.from_numpy(x))
        (-torch.log(q[torch.arange(4), torch.from_numpy(labels)]).mean()).backward()
        opt_t.step()
    err = max(rel_err(_var(module, v.path), torch.from_numpy(v.numpy())) for v in kmodel.weights)
    assert err <= 1e-12, err


def _masked_text_model(keras):
    L = keras.layers
    inp = L.Input((7,), dtype="int32")
    x = L.Embedding(15, 4, mask_zero=True, name="emb")(inp)
    x = L.Dense(4, activation="tanh", name="proj")(x)  # passes the mask on
    x = L.Bidirectional(L.LSTM(3, return_sequences=True), name="bi")(x)
    x = L.GRU(3, return_sequences=True, name="gru")(x)
    x = L.SimpleRNN(2, go_backwards=True, name="rnn")(x)
    return keras.Model(inp, L.Dense(2, name="out")(x), name="masked")


@pytest.mark.parametrize("ext", ["keras", "h5"])
def test_masked_text_model_float64(tf, keras, floatx, tmp_path, ext):
    """Embedding(mask_zero=True) -> Dense -> Bidirectional(LSTM) -> GRU -> SimpleRNN: masked
    steps keep the state; outputs there are the previous ones (zeros inside Bidirectional)."""
    floatx("float64")
    kmodel = _masked_text_model(keras)
    _randomize(kmodel, seed=31)
    module = load_model(_save(kmodel, tmp_path, ext))
    x = np.random.default_rng(32).integers(1, 15, size=(4, 7)).astype(np.int32)
    x[0, 5:] = 0  # right padding
    x[1, :2] = 0  # left padding
    x[2, 3] = 0  # a hole
    _compare(tf, kmodel, module, [x], 1e-12, 1e-12)


def test_mask_into_unsupported_layer_refused(keras, tmp_path):
    L = keras.layers
    inp = L.Input((5,), dtype="int32")
    x = L.Embedding(9, 3, mask_zero=True, name="emb")(inp)
    out = L.LSTM(2, name="lstm")(x)
    path = str(tmp_path / "m.keras")
    keras.Model(inp, out).save(path)
    # every supported layer Keras hands a mask to takes it: plant one on a layer that does not
    with zipfile.ZipFile(path) as z:
        files = {n: z.read(n) for n in z.namelist()}
    config = json.loads(files["config.json"])
    lstm = [lc for lc in config["config"]["layers"] if lc["name"] == "lstm"][0]
    emb = [lc for lc in config["config"]["layers"] if lc["name"] == "emb"][0]
    emb["inbound_nodes"][0]["kwargs"]["mask"] = lstm["inbound_nodes"][0]["kwargs"]["mask"]
    files["config.json"] = json.dumps(config).encode()
    with zipfile.ZipFile(path, "w") as z:
        for n, data in files.items():
            z.writestr(n, data)
    with pytest.raises(KerasLoadError, match="'emb'.*called with a Keras mask"):
        load_model(path)
    seq = keras.Sequential(
        [L.Input((5,), dtype="int32"), L.Embedding(9, 3, mask_zero=True), L.LSTM(2)]
    )
    seq.save(path)
    with pytest.raises(KerasLoadError, match="mask_zero=True in a Sequential"):
        load_model(path)


def test_tensor_operators_and_dropout_noise_shape(tf, keras, floatx, tmp_path):
    """`a * b`, `a + b` between Keras tensors are graph nodes named Multiply/Add with two
    arguments; Dropout(noise_shape) (EfficientNet's) is the identity in inference and drops
    whole samples in training; Normalization on axis 3 of a 4-D input."""
    floatx("float64")
    L = keras.layers
    inp = L.Input((2, 2, 3))
    a = L.Dense(3, name="a")(inp)
    b = L.Dense(3, name="b")(inp)
    x = L.Normalization(axis=3, mean=[0.0, 1.0, 2.0], variance=[1.0, 4.0, 9.0], name="n")(a * b + a)
    x = L.Dropout(0.5, noise_shape=(None, 1, 1, 1), name="drop")(x)
    kmodel = keras.Model(inp, x)
    _randomize(kmodel)
    module = load_model(_save(kmodel, tmp_path, "keras"))
    xin = np.random.default_rng(0).normal(size=(64, 2, 2, 3))
    _compare(tf, kmodel, module, [xin], 1e-12, 1e-12, modes=(False,))
    module.train()
    y = module(torch.from_numpy(xin)).detach()
    ref = module.eval()(torch.from_numpy(xin)).detach()
    kept = (y != 0).flatten(1).any(1)
    assert 0 < kept.sum() < 64
    assert torch.allclose(y[kept], 2 * ref[kept]) and (y[~kept] == 0).all()


def test_synchronized_batch_norm_loads_and_converts(tf, keras, tmp_path):
    """BatchNormalization(synchronized=True) loads (global statistics under torch.distributed;
    on one process Keras and we both give the layer's ordinary numbers), and
    convert_sync_batchnorm switches a loaded model's layers in place, Keras names kept."""
    from torch_tfgrads.nn import convert_sync_batchnorm

    L = keras.layers
    inp = L.Input((4, 4, 3))
    x = L.BatchNormalization(synchronized=True, name="bn_sync")(inp)
    out = L.BatchNormalization(name="bn_plain")(x)
    kmodel = keras.Model(inp, out)
    _randomize(kmodel)
    module = load_model(_save(kmodel, tmp_path, "keras"))
    assert module.bn_sync.synchronized and module.bn_sync.keras_version == 3
    assert not module.bn_plain.synchronized
    x = np.random.default_rng(1).normal(size=(5, 4, 4, 3)).astype(np.float32) + 2
    _compare(tf, kmodel, module, [x], 1e-5, 1e-4, modes=(True,))
    keys = list(module.state_dict())
    assert convert_sync_batchnorm(module) is module
    assert module.bn_plain.synchronized and module.bn_plain.keras_version == 3
    assert list(module.state_dict()) == keys and "bn_plain.moving_variance" in keys


_CONVERT_CHILD = (
    BLOCK_TF
    + """
import runpy, sys
sys.argv = ["python -m torch_tfgrads", "convert", *sys.argv[1:]]
runpy.run_module("torch_tfgrads", run_name="__main__")
"""
)


def test_convert_cli_saves_the_module_without_tensorflow(tf, keras, tmp_path):
    """`python -m torch_tfgrads convert model.keras -o model.pt` where TF cannot be imported; the
    saved module loads with torch.load and computes what load_model's module computes."""
    kmodel = _cnn(keras)
    _randomize(kmodel)
    path = _save(kmodel, tmp_path, "keras")
    out = tmp_path / "model.pt"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    r = subprocess.run(
        [sys.executable, "-c", _CONVERT_CHILD, path, "-o", str(out)],
        capture_output=True,
        text=True,
        env=env,
        cwd=root,
    )
    assert r.returncode == 0 and "convert:" in r.stdout, r.stderr[-3000:]
    saved = torch.load(out, weights_only=False).eval()
    direct = load_model(path).eval()
    x = torch.from_numpy(np.random.default_rng(3).normal(size=(2, 9, 9, 3)).astype(np.float32))
    assert torch.equal(saved(x), direct(x))
    assert saved.state_dict().keys() == direct.state_dict().keys()


def _time_model(keras):
    L = keras.layers
    inp = L.Input((6, 3))
    x = L.Masking(0.0, name="masking")(inp)
    x = L.LSTM(4, return_sequences=True, name="lstm")(x)
    x = L.TimeDistributed(L.Dense(3, activation="tanh"), name="td_dense")(x)
    x = L.TimeDistributed(L.BatchNormalization(), name="td_bn")(x)
    x = L.Bidirectional(L.GRU(2, return_sequences=True), name="bi")(x)
    x = L.GRU(3, name="gru")(x)
    return keras.Model(inp, L.Dense(2, name="out")(x), name="timed")


@pytest.mark.parametrize("ext", ["keras", "h5"])
def test_masking_and_time_distributed_float64(tf, keras, floatx, tmp_path, ext):
    """Masking -> LSTM -> TimeDistributed(Dense), TimeDistributed(BatchNormalization) (batch
    statistics per step in training) -> Bidirectional(GRU) -> GRU, the mask carried through:
    right padding (the cuDNN op) and a hole (the step loop); moving statistics after training."""
    floatx("float64")
    kmodel = _time_model(keras)
    _randomize(kmodel, seed=41)
    module = load_model(_save(kmodel, tmp_path, ext))
    assert "td_dense.layer.kernel" in module.state_dict()
    assert "td_bn.layer.moving_variance" in module.state_dict()
    x = np.random.default_rng(42).normal(size=(4, 6, 3))
    x[0, 4:] = 0.0  # right padding
    x[2, 5:] = 0.0
    _compare(tf, kmodel, module, [x], 1e-12, 1e-12)
    x[1, 2] = 0.0  # a hole: the step loop
    _compare(tf, kmodel, module, [x], 1e-12, 1e-12, modes=(False,))


def test_mask_into_batch_norm_and_average_pooling_float64(tf, keras, floatx, tmp_path):
    """Embedding(mask_zero) -> BatchNormalization (Keras 3's masked moments in training) ->
    GlobalAveragePooling1D (the mean over unmasked steps): the common text classifier."""
    floatx("float64")
    L = keras.layers
    inp = L.Input((6,), dtype="int32")
    x = L.Embedding(12, 4, mask_zero=True, name="emb")(inp)
    x = L.BatchNormalization(name="bn")(x)
    x = L.GlobalAveragePooling1D(name="gap")(x)
    kmodel = keras.Model(inp, L.Dense(2, name="out")(x))
    _randomize(kmodel, seed=43)
    module = load_model(_save(kmodel, tmp_path, "keras"))
    x = np.random.default_rng(44).integers(1, 12, size=(4, 6)).astype(np.int32)
    x[0, 3:] = 0
    x[2, 1] = 0
    _compare(tf, kmodel, module, [x], 1e-12, 1e-12)
