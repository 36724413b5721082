"""Whole Keras models converted by torch_tfgrads.keras, against Keras itself (TF 2.21): Keras 3's
EfficientNetB0 and ResNet50, a masked text model (Embedding -> Bidirectional(LSTM) -> GRU), a CNN
with fractional max pooling in a custom layer (mapped with ``custom_converters``), and tf-keras
(Keras 2) models saved as legacy `.h5`. Each is saved by Keras, loaded, and compared in inference
and training mode: outputs, gradients of a loss w.r.t. every weight, moving statistics, and every
weight after three SGD steps on both sides, in float64 (float32 for the text model too). A last
test loads the files in a process where TensorFlow and Keras cannot be imported. Tolerances are
the ones docs/keras.md states; `pytest -s` prints the measured errors.
"""

import importlib
import json

import numpy as np
import pytest
import torch

import torch_tfgrads
from helpers import BLOCK_TF, REQUIRE_TF, rel_err
from keras_helpers import (
    calibrate_batch_norms,
    compare,
    keras_floatx,
    randomize_deep,
    run_tf_free,
    save,
    sgd_steps,
)
from torch_tfgrads.keras import load_model
from torch_tfgrads.nn import FractionalMaxPool2d

pytestmark = pytest.mark.needs_tf


def _saved(kmodel, directory, x, ext="keras"):
    """Save; keep Keras's inference output on ``x`` now, before a test trains the model."""
    path = save(kmodel, directory, ext, name=kmodel.name)
    return dict(kmodel=kmodel, path=path, x=x, y=np.array(kmodel(x, training=False)))


def _images(seed, batch, size, scale=1.0):
    return np.random.default_rng(seed).normal(size=(batch, size, size, 3)) * scale


def _image_batches(seed, batch, size, classes, n=3, scale=1.0):
    rng = np.random.default_rng(seed)
    return [
        (rng.normal(size=(batch, size, size, 3)) * scale, rng.integers(0, classes, size=batch))
        for _ in range(n)
    ]


# ------------------------------------------------------------------------------- EfficientNetB0

# 33 x 33, batch 2: the last stage's maps are 2 x 2. At 32 x 32 they are 1 x 1, and a batch
# norm in training normalizes 2 values per channel: its gain reaches 1/sqrt(epsilon) (30 here)
# for channels whose 2 values are close, which blew float64 rounding up to 5e-10 in the
# gradients and made the SGD steps chaotic (errors x100 per step).
EFF_SIZE = 33


@pytest.fixture(scope="module")
def efficientnet(keras, tmp_path_factory):
    """EfficientNetB0 in float64 with its dropout rates set to 0 in the config (Dropout, and the
    drop-connect Dropouts with noise_shape (None, 1, 1, 1)): their random masks come from
    different generators in Keras and torch, so training mode is only comparable without them.
    Random weights, and moving statistics near the activations' own (``calibrate_batch_norms``)."""
    with keras_floatx(keras, "float64"):
        built = keras.applications.EfficientNetB0(
            weights=None, input_shape=(EFF_SIZE, EFF_SIZE, 3), classes=5
        )
        config = built.get_config()
        rates = [lc["config"] for lc in config["layers"] if lc["class_name"] == "Dropout"]
        assert len(rates) == 10 and any(c.get("noise_shape") for c in rates)
        for c in rates:
            c["rate"] = 0.0
        kmodel = keras.Model.from_config(config)
    randomize_deep(kmodel, seed=1)
    x = _images(2, 2, EFF_SIZE, scale=60.0) + 128.0  # pixels: the model rescales by 1/255
    calibrate_batch_norms(kmodel, x)
    return _saved(kmodel, tmp_path_factory.mktemp("efficientnet"), x)


def test_efficientnet_b0_float64(tf, keras, efficientnet):
    """Inference, training (no dropout, see the fixture), the gradient of every weight, the 49
    batch norms' moving statistics; then 3 SGD steps: every weight and statistic after them."""
    kmodel = efficientnet["kmodel"]
    module = load_model(efficientnet["path"])
    assert (
        sum(getattr(m, "keras_class", "") == "BatchNormalization" for m in module.modules()) == 49
    )
    compare(tf, kmodel, module, [efficientnet["x"]], 1e-12, 1e-11)
    batches = _image_batches(3, 2, EFF_SIZE, 5, scale=60.0)
    err, moved = sgd_steps(
        tf, keras, kmodel, module, [(x + 128.0, y) for x, y in batches], 2.0**-10
    )
    print(f"efficientnet after 3 SGD steps: {err:.1e} (weights moved {moved:.1e})")
    assert err <= 1e-10 and moved >= 1e-3, (err, moved)


# ------------------------------------------------------------------------------------- ResNet50

# 33 x 33 for the same reason as EfficientNet's (conv5's maps are 2 x 2).
RES_SIZE = 33


@pytest.fixture(scope="module")
def resnet(keras, tmp_path_factory):
    with keras_floatx(keras, "float64"):
        kmodel = keras.applications.ResNet50(
            weights=None, input_shape=(RES_SIZE, RES_SIZE, 3), classes=5
        )
    randomize_deep(kmodel, seed=4)
    x = _images(5, 2, RES_SIZE)
    calibrate_batch_norms(kmodel, x)
    return _saved(kmodel, tmp_path_factory.mktemp("resnet"), x)


def test_resnet50_float64(tf, keras, resnet):
    """ResNet50 (53 batch norms, 23.5M parameters): inference, training, gradients, moving
    statistics, and 3 SGD steps. The learning rate is small (2**-14) because the weights are:
    behind a batch norm the effective step is lr / |w|**2; with 2**-14 a step still moves the
    first kernels by about 1 %."""
    kmodel = resnet["kmodel"]
    module = load_model(resnet["path"])
    assert (
        sum(getattr(m, "keras_class", "") == "BatchNormalization" for m in module.modules()) == 53
    )
    compare(tf, kmodel, module, [resnet["x"]], 1e-11, 1e-11)
    err, moved = sgd_steps(tf, keras, kmodel, module, _image_batches(6, 2, RES_SIZE, 5), 2.0**-14)
    print(f"resnet50 after 3 SGD steps: {err:.1e} (weights moved {moved:.1e})")
    assert err <= 1e-10 and moved >= 1e-3, (err, moved)


# ---------------------------------------------------------------------------------- MobileNetV3


@pytest.mark.parametrize("size", ["Small", "Large"])
def test_mobilenet_v3_float64(tf, keras, size, tmp_path):
    """MobileNetV3Small/Large (hard_swish, hard_sigmoid squeeze-excite, Rescaling, keepdims
    pooling), dropout 0: inference, training, gradients, moving statistics; then 3 SGD steps."""
    with keras_floatx(keras, "float64"):
        kmodel = getattr(keras.applications, f"MobileNetV3{size}")(
            input_shape=(EFF_SIZE, EFF_SIZE, 3), weights=None, classes=5, dropout_rate=0.0
        )
    randomize_deep(kmodel, seed=7)
    x = _images(8, 2, EFF_SIZE, scale=60.0) + 128.0  # pixels: the model rescales them
    calibrate_batch_norms(kmodel, x)
    saved = _saved(kmodel, tmp_path, x)
    module = load_model(saved["path"])
    compare(tf, kmodel, module, [x], 1e-11, 1e-10)
    batches = _image_batches(9, 2, EFF_SIZE, 5, scale=60.0)
    err, moved = sgd_steps(
        tf, keras, kmodel, module, [(b + 128.0, y) for b, y in batches], 2.0**-10
    )
    print(f"mobilenet_v3 {size} after 3 SGD steps: {err:.1e} (weights moved {moved:.1e})")
    assert err <= 1e-12 and moved >= 1e-3, (err, moved)


# ------------------------------------------------------------------------------- the text model

VOCAB, STEPS = 24, 8


def _text_model(keras, mask_zero=True, name="text"):
    L = keras.layers
    inp = L.Input((STEPS,), dtype="int32", name="tokens")
    x = L.Embedding(VOCAB, 6, mask_zero=mask_zero, name="emb")(inp)
    x = L.Bidirectional(L.LSTM(5, return_sequences=True), name="bi_lstm")(x)
    x = L.GRU(4, name="gru")(x)
    return keras.Model(inp, L.Dense(3, activation="softmax", name="probs")(x), name=name)


def _tokens(seed, lengths=(STEPS, 5, 2, 7)):
    """Right padding of different lengths (0 is the padding token), one row without any."""
    rng = np.random.default_rng(seed)
    x = rng.integers(1, VOCAB, size=(len(lengths), STEPS)).astype(np.int32)
    for row, n in enumerate(lengths):
        x[row, n:] = 0
    return x


def _token_batches(seed):
    rng = np.random.default_rng(seed)
    return [
        (_tokens(seed + i, tuple(rng.integers(1, STEPS + 1, size=4))), rng.integers(0, 3, size=4))
        for i in range(3)
    ]


@pytest.fixture(scope="module")
def text_model(keras, tmp_path_factory):
    with keras_floatx(keras, "float64"):
        kmodel = _text_model(keras)
    randomize_deep(kmodel, seed=7)
    return _saved(kmodel, tmp_path_factory.mktemp("text"), _tokens(8))


def test_masked_text_model_float64(tf, keras, text_model):
    """Embedding(mask_zero) -> Bidirectional(LSTM) -> GRU -> Dense(softmax) on right-padded
    sequences: both modes, gradients, and 3 SGD steps on other paddings."""
    kmodel, module = text_model["kmodel"], load_model(text_model["path"])
    compare(tf, kmodel, module, [text_model["x"]], 1e-12, 1e-12)
    err, moved = sgd_steps(tf, keras, kmodel, module, _token_batches(9), 2.0**-3)
    print(f"text after 3 SGD steps: {err:.1e} (weights moved {moved:.1e})")
    assert err <= 1e-12 and moved >= 1e-3, (err, moved)


def test_masked_text_model_float32(tf, keras, floatx, tmp_path):
    floatx("float32")
    kmodel = _text_model(keras, name="text32")
    randomize_deep(kmodel, seed=7)
    module = load_model(save(kmodel, tmp_path, "keras"))
    assert module.probs.kernel.dtype == torch.float32
    compare(tf, kmodel, module, [_tokens(8)], 1e-6, 3e-6)


# ------------------------------------------------- fractional max pooling in a custom Keras layer

FRAC_GLOBAL_SEED = 1234  # tf.random.set_seed of the Keras side, given to the converter


@pytest.fixture(scope="module")
def frac_layer(tf, keras):
    """A custom layer calling tf.nn.fractional_max_pool with an op seed, registered so that
    Keras can save and load it."""

    @keras.saving.register_keras_serializable(package="tfgrads_test")
    class FracMaxPool(keras.layers.Layer):
        def __init__(self, pooling_ratio=(1.44, 1.73), overlapping=False, seed=1, **kwargs):
            super().__init__(**kwargs)
            self.pooling_ratio, self.overlapping, self.seed = pooling_ratio, overlapping, seed

        def call(self, x):
            ratio = [1.0, *self.pooling_ratio, 1.0]
            return tf.nn.fractional_max_pool(
                x, ratio, pseudo_random=True, overlapping=self.overlapping, seed=self.seed
            )[0]

        def get_config(self):
            return {
                **super().get_config(),
                "pooling_ratio": list(self.pooling_ratio),
                "overlapping": self.overlapping,
                "seed": self.seed,
            }

    return FracMaxPool


def frac_converter(global_seed):
    """The custom_converters entry: a torch module drawing the pooling sequences TF draws for
    the layer's seed under ``tf.random.set_seed(global_seed)`` (None: never set)."""

    def convert(config, arrays):
        assert not arrays  # the layer has no weights
        seeds = torch_tfgrads.fractional_pool_seeds(config["seed"], global_seed)
        return FractionalMaxPool2d(
            config["pooling_ratio"], pseudo_random=True, overlapping=config["overlapping"], **seeds
        )

    return convert


@pytest.fixture(scope="module")
def frac_model(tf, keras, frac_layer, tmp_path_factory):
    L = keras.layers
    with keras_floatx(keras, "float64"):
        inp = L.Input((21, 21, 3), name="image")
        x = L.Conv2D(6, 3, padding="same", name="c1")(inp)
        x = L.ReLU(name="r1")(L.BatchNormalization(name="bn1")(x))
        x = frac_layer((1.44, 1.73), overlapping=True, seed=3, name="frac1")(x)
        x = L.Conv2D(8, 3, padding="same", name="c2")(x)
        x = L.ReLU(name="r2")(L.BatchNormalization(name="bn2")(x))
        x = frac_layer((1.44, 1.73), overlapping=False, seed=7, name="frac2")(x)
        x = L.Dense(4, activation="softmax", name="probs")(L.GlobalAveragePooling2D(name="gap")(x))
        kmodel = keras.Model(inp, x, name="frac")
    randomize_deep(kmodel, seed=10)
    x = _images(11, 3, 21)
    calibrate_batch_norms(kmodel, x)
    d = tmp_path_factory.mktemp("frac")
    tf.random.set_seed(FRAC_GLOBAL_SEED)
    try:
        out = _saved(kmodel, d, x)
    finally:
        tf.random.set_seed(None)
    out["h5"] = save(kmodel, d, "h5", name="frac")
    return out


def test_fractional_pool_custom_layer_float64(tf, keras, frac_model):
    """The custom layer is mapped with custom_converters to nn.FractionalMaxPool2d with the
    seeds TF derives (fractional_pool_seeds): the pooling regions are TF's, so outputs,
    gradients and 3 SGD steps match as for built-in layers. Without a global seed TF uses
    87654321 as the first seed, and so does the converter. The class name is the key for both
    formats (a legacy .h5 records the registered "package>FracMaxPool")."""
    kmodel = frac_model["kmodel"]
    x = frac_model["x"]
    try:
        tf.random.set_seed(None)
        conv = {"FracMaxPool": frac_converter(None)}  # the .h5 records "tfgrads_test>..."
        module = load_model(frac_model["h5"], custom_converters=conv).eval()
        assert module.frac2.seed == 87654321 and module.frac2.seed2 == 7
        y = module(torch.from_numpy(x))
        assert rel_err(y, torch.from_numpy(kmodel(x, training=False).numpy())) <= 1e-12
        # another global seed gives other pooling regions (else these checks prove nothing)
        tf.random.set_seed(FRAC_GLOBAL_SEED)
        assert rel_err(y, torch.from_numpy(kmodel(x, training=False).numpy())) > 1e-6

        conv = {"FracMaxPool": frac_converter(FRAC_GLOBAL_SEED)}
        module = load_model(frac_model["path"], custom_converters=conv)
        assert module.frac1.seed == FRAC_GLOBAL_SEED and module.frac1.seed2 == 3
        compare(tf, kmodel, module, [x], 1e-12, 1e-12)
        err, moved = sgd_steps(tf, keras, kmodel, module, _image_batches(12, 3, 21, 4), 2.0**-4)
        print(f"frac after 3 SGD steps: {err:.1e} (weights moved {moved:.1e})")
        assert err <= 1e-12 and moved >= 1e-3, (err, moved)
    finally:
        tf.random.set_seed(None)


# ------------------------------------------------------------------------ tf-keras, legacy .h5


@pytest.fixture(scope="module")
def tf_keras_models(tf, tmp_path_factory):
    """tf-keras (Keras 2) models saved as .h5: in float64 the text model without the mask
    (masks in Keras 2 files are implicit, and refused) and MobileNetV2 (alpha 0.35); a small
    float32 CNN, whose batch norm takes tf-keras's fused path."""
    tfk = importlib.import_module("tf_keras") if REQUIRE_TF else pytest.importorskip("tf_keras")
    d = tmp_path_factory.mktemp("tf_keras")
    old = tfk.backend.floatx()
    tfk.backend.set_floatx("float64")
    try:
        text = _text_model(tfk, mask_zero=False, name="text_v2")
        cnn = tfk.applications.MobileNetV2(
            input_shape=(32, 32, 3), alpha=0.35, weights=None, classes=5
        )
    finally:
        tfk.backend.set_floatx(old)
    L = tfk.layers
    inp = L.Input((9, 9, 3))
    x = L.ReLU()(L.BatchNormalization(name="bn")(L.Conv2D(6, 3, strides=2, name="conv")(inp)))
    cnn32 = tfk.Model(inp, L.Dense(4, activation="softmax")(L.GlobalAveragePooling2D()(x)))
    randomize_deep(cnn32, seed=17)
    randomize_deep(text, seed=13)
    randomize_deep(cnn, seed=14)
    x_img = _images(15, 3, 32)
    calibrate_batch_norms(cnn, x_img)
    return {
        "text": _saved(text, d, _tokens(16), "h5"),
        "cnn": _saved(cnn, d, x_img, "h5"),
        "cnn32": _saved(cnn32, d, _images(18, 4, 9).astype(np.float32), "h5"),
    }


@pytest.mark.parametrize(
    "which, tol_fwd, tol_grad, rule",
    [("text", 1e-12, 1e-12, None), ("cnn", 1e-11, 1e-9, "biased"), ("cnn32", 1e-6, 1e-5, "bessel")],
)
def test_tf_keras_h5(tf, tf_keras_models, which, tol_fwd, tol_grad, rule):
    """tf-keras's .h5 (Keras 2 graph lists, ':0' weight names): both modes, gradients, moving
    statistics. tf-keras fuses a batch norm only in float32/16 (the Bessel-corrected moving
    variance of TF's fused op); a float64 one takes its unfused path (the biased variance)."""
    m = tf_keras_models[which]
    module = load_model(m["path"])
    assert str(module.keras_version).startswith("2.")
    compare(tf, m["kmodel"], module, [m["x"]], tol_fwd, tol_grad)
    bns = [b for b in module.modules() if getattr(b, "keras_class", "") == "BatchNormalization"]
    assert {b.moving_variance_rule for b in bns} == ({rule} if rule else set())


# ------------------------------------------------------------------------ without TensorFlow

_CHILD = (
    BLOCK_TF
    + """
import json, sys
import numpy as np, torch
import torch_tfgrads
import torch_tfgrads.keras as K
from torch_tfgrads.__main__ import main
from torch_tfgrads.nn import FractionalMaxPool2d

def frac(global_seed):
    def convert(config, arrays):
        seeds = torch_tfgrads.fractional_pool_seeds(config["seed"], global_seed)
        return FractionalMaxPool2d(config["pooling_ratio"], pseudo_random=True,
                                   overlapping=config["overlapping"], **seeds)
    return convert

for job in json.load(open(sys.argv[1])):
    if job["how"] == "cli":  # python -m torch_tfgrads convert file -o file.pt
        assert main(["convert", job["path"], "-o", job["path"] + ".pt"]) == 0
        module = torch.load(job["path"] + ".pt", weights_only=False)
    elif job["how"] == "custom":
        module = K.load_model(job["path"], custom_converters={job["key"]: frac(job["seed"])})
    else:
        module = K.load_model(job["path"])
    with torch.no_grad():
        y = module.eval()(torch.from_numpy(np.load(job["x"])))
    np.save(job["path"] + ".out.npy", (y[0] if isinstance(y, list) else y).numpy())
bad = [n for n in sys.modules if n.split(".")[0] in ("tensorflow", "keras", "tf_keras")]
assert not bad, bad
print("OK")
"""
)


def test_models_load_without_tensorflow(
    efficientnet, text_model, frac_model, tf_keras_models, tmp_path
):
    """A process in which TensorFlow, Keras and tf-keras cannot be imported converts
    EfficientNetB0 and the text model with the command line (`convert -o`), loads the fractional
    model with its custom converter and the tf-keras files; each module computes Keras's
    inference output (recorded when the models were saved)."""
    cases = [
        ("cli", efficientnet, {}),
        ("cli", text_model, {}),
        ("custom", frac_model, {"key": "FracMaxPool", "seed": FRAC_GLOBAL_SEED}),
        ("load", tf_keras_models["text"], {}),
        ("load", tf_keras_models["cnn"], {}),
    ]
    jobs = []
    for i, (how, m, extra) in enumerate(cases):
        np.save(tmp_path / f"x{i}.npy", m["x"])
        jobs.append({"how": how, "path": m["path"], "x": str(tmp_path / f"x{i}.npy"), **extra})
    (tmp_path / "jobs.json").write_text(json.dumps(jobs))
    r = run_tf_free(_CHILD, tmp_path / "jobs.json")
    assert r.returncode == 0 and "OK" in r.stdout, r.stderr[-3000:]
    for job, (_, m, _) in zip(jobs, cases):
        got = torch.from_numpy(np.load(job["path"] + ".out.npy"))
        assert rel_err(got, torch.from_numpy(m["y"])) <= 1e-11, job["path"]
