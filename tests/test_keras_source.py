"""`convert --source`: Keras models as PyTorch source (torch_tfgrads.keras.write_source). Each
generated file is imported from tmp_path, loads its weights file, and must compute bit for bit
what load_model's module computes (eval and train mode), Keras's outputs within float32
rounding, and pass this repository's ruff check and ruff format --check."""

import importlib.util
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import torch

from helpers import BLOCK_TF, rel_err
from torch_tfgrads.diff.example import randomize
from torch_tfgrads.keras import KerasLoadError, layer, load_model, model_source, write_source

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
needs_tf = pytest.mark.needs_tf


def _ruff(path):
    """ruff check and ruff format --check with this repository's settings."""
    if importlib.util.find_spec("ruff") is None:  # the generated source must be ruff-clean
        pytest.fail("ruff is not installed (make test installs it)")
    config = os.path.join(ROOT, "pyproject.toml")
    for cmd in (["check"], ["format", "--check", "--diff"]):
        r = subprocess.run(
            [sys.executable, "-m", "ruff", *cmd, "--config", config, str(path)],
            capture_output=True,
            text=True,
        )
        assert r.returncode == 0, r.stdout + r.stderr


def _import(path):
    spec = importlib.util.spec_from_file_location(f"generated_{abs(hash(str(path)))}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _listed(y):
    return list(y) if isinstance(y, (list, tuple)) else [y]


def _check(kmodel, tmp_path, inputs, tol, name="model", ext="keras", edit=None):
    """Save, convert, write the source, import it; the source's model against load_model's and
    (with ``tol``) Keras's. ``edit(path)`` changes the saved file. Returns the generated text."""
    path = str(tmp_path / f"{name}.{ext}")
    kmodel.save(path)
    if edit:
        edit(path)
    module = load_model(path)
    src, weights = write_source(module, tmp_path / f"{name}.py", origin=f"{name}.{ext}")
    assert weights == tmp_path / f"{name}.weights.pt"
    _ruff(src)
    gen = _import(src).load()
    assert not gen.training and list(gen.state_dict()) == list(module.state_dict())
    xs = [torch.from_numpy(x) for x in inputs]
    keras_out = _listed(kmodel(inputs if len(inputs) > 1 else inputs[0], training=False))
    for g, k in zip(_listed(gen(*xs)), keras_out if tol else []):
        assert rel_err(g, torch.from_numpy(np.array(k))) <= tol
    for training in (False, True):  # train: batch statistics, moving averages, dropout masks
        module.train(training)
        gen.train(training)
        torch.manual_seed(7)
        want = _listed(module(*xs))
        torch.manual_seed(7)
        got = _listed(gen(*xs))
        assert len(got) == len(want) and all(torch.equal(g, w) for g, w in zip(got, want))
    for g, w in zip(gen.state_dict().values(), module.state_dict().values()):
        assert torch.equal(g, w)  # the same moving averages after the training call
    return src.read_text()


def test_layer_builds_the_converted_module_with_zero_weights():
    dense = layer("Dense", {"kernel": (3, 2), "bias": (2,)}, activation="relu")
    assert dense.activation == "relu" and torch.equal(dense.kernel, torch.zeros(3, 2))
    norm = layer("Normalization", {"mean": (4,), "variance": (4,), "count": ((), "int64")})
    assert norm.count.dtype == torch.int64 and norm.mean.dtype == torch.float32
    conv = layer("Conv2D", [(3, 3, 2, 4)], use_bias=False, dtype="float64", trainable=False)
    assert conv.kernel.dtype == torch.float64 and not conv.kernel.requires_grad
    with pytest.raises(KerasLoadError, match=r"name the weights \['w', 'b'\]"):
        layer("Dense", {"w": (3, 2), "b": (2,)})
    with pytest.raises(KerasLoadError, match="expects 2 weights"):
        layer("Dense", {"kernel": (3, 2)})
    with pytest.raises(KerasLoadError, match="not a supported layer class"):
        layer("Lambda")
    with pytest.raises(TypeError, match="nested model"):
        layer("Functional")


@needs_tf
def test_functional_two_inputs_two_outputs_shared_layer(keras, tmp_path):
    """A Dense shared by three calls, merges, names that are no Python names, and a long name and
    configs that the writer must wrap as ruff format does."""
    L = keras.layers
    a, b = L.Input((6,), name="a"), L.Input((6,), name="input-b")
    shared = L.Dense(5, activation="tanh", name="shared")
    ha, hb = shared(a), shared(b)
    h = L.Concatenate(name="lambda")([ha, hb, L.Subtract(name="sub")([ha, hb])])
    h = L.Dense(4, use_bias=False, name="dense-1")(h)
    long = "a_long_layer_name_that_makes_the_writer_wrap_its_call"
    h = L.ReLU(max_value=3.0, negative_slope=0.1, threshold=0.2, name=long)(h)
    out1 = L.Dense(3, activation="softmax", name="probs")(h)
    out2 = L.Add(name="skip")([ha, shared(L.Maximum(name="max")([a, b]))])
    kmodel = keras.Model([a, b], [out1, out2], name="two_heads")
    randomize(kmodel)
    rng = np.random.default_rng(1)
    x = [rng.normal(size=(4, 6)).astype(np.float32) for _ in range(2)]
    text = _check(kmodel, tmp_path, x, 1e-5)
    assert "class TwoHeads(torch.nn.Module):" in text
    assert 'self.add_module("dense-1", layer("Dense", use_bias=False, shapes=' in text
    assert "x_shared_2 = self.shared(x_max)" in text
    assert 'x_dense_1 = getattr(self, "dense-1")(x_lambda)' in text
    assert "return [x_probs, x_skip]" in text
    # a custom converter's module is not what the config builds: refused, not written wrong
    custom = load_model(
        str(tmp_path / "model.keras"), custom_converters={"ReLU": lambda c, a: torch.nn.ReLU()}
    )
    with pytest.raises(KerasLoadError, match=f"'{long}' \\(ReLU\\).*custom converter"):
        model_source(custom)


@needs_tf
def test_nested_models_float64_sequential(keras, tmp_path):
    """A nested Functional model called twice (two outputs) and a nested Sequential, as classes
    of their own; a float64 Sequential with an adapted Normalization (int64 count), a frozen
    batch norm and dropout, as a chain."""
    L = keras.layers
    i = L.Input((5,), name="inner_in")
    t = L.Dense(4, activation="relu", name="d1")(i)
    inner = keras.Model(i, [L.Dense(3, name="d2")(t), t], name="inner")
    stack = keras.Sequential([L.Input((3,)), L.Dense(2, name="d3")], name="stack")
    x = L.Input((5,), name="x")
    p, q = inner(x)
    r, _ = inner(L.Dense(5, name="pre")(x))
    out = stack(L.Add(name="add")([p, r]))
    kmodel = keras.Model(x, [out, q], name="outer")
    randomize(kmodel)
    rng = np.random.default_rng(2)
    text = _check(kmodel, tmp_path, [rng.normal(size=(3, 5)).astype(np.float32)], 1e-5, "outer")
    assert text.index("class Inner(") < text.index("class Stack(") < text.index("class Outer(")
    assert "x_inner_1 = self.inner(x_pre)" in text and "x = self.d3(x)" in text

    norm = L.Normalization(name="norm", dtype="float64")
    seq = keras.Sequential(
        [
            L.Input((4,), dtype="float64"),
            norm,
            L.Dense(6, activation="swish", name="fc", dtype="float64"),
            L.BatchNormalization(name="bn", trainable=False, dtype="float64"),
            L.Dropout(0.3, name="drop", dtype="float64"),
            L.Dense(2, name="head", dtype="float64"),
        ],
        name="seq64",
    )
    randomize(seq)
    norm.adapt(rng.normal(2.0, 3.0, size=(40, 4)))  # (random statistics would be no variances)
    text = _check(seq, tmp_path, [rng.normal(size=(5, 4))], 1e-12, "seq64")
    assert '"count": ((), "int64")' in text and 'dtype="float64"' in text
    assert "trainable=False" in text and "rate=0.3" in text


@needs_tf
def test_mask_from_embedding_into_lstm(keras, tmp_path):
    L = keras.layers
    tokens = L.Input((7,), dtype="int32", name="tokens")
    x = L.Embedding(20, 5, mask_zero=True, name="emb")(tokens)
    seq, h, c = L.LSTM(4, return_sequences=True, return_state=True, name="lstm")(x)
    y = L.Bidirectional(L.GRU(3), merge_mode="sum", name="bi")(seq)
    kmodel = keras.Model(tokens, [L.Dense(2, name="out")(y), h], name="masked")
    randomize(kmodel)
    ids = np.random.default_rng(3).integers(1, 20, size=(4, 7)).astype(np.int32)
    ids[0, 4:] = ids[2, 2:] = 0  # padded sequences
    text = _check(kmodel, tmp_path, [ids], 1e-5)
    # Keras numbers the mask's NotEqual node per process: not_equal, not_equal_1, ...
    mask = re.search(r"x_lstm = self\.lstm\(x_emb, mask=(x_not_equal\w*)\)", text)
    assert mask, text
    assert f"x_bi = self.bi(x_lstm[0], mask={mask.group(1)})" in text


@needs_tf
def test_mobilenet_v2(keras, tmp_path):
    kmodel = keras.applications.MobileNetV2(
        input_shape=(32, 32, 3), alpha=0.35, weights=None, classes=10
    )
    x = np.random.default_rng(5).normal(size=(2, 32, 32, 3)).astype(np.float32)
    text = _check(kmodel, tmp_path, [x], 1e-5)
    assert (
        '"DepthwiseConv2D", padding="same", use_bias=False, shapes={"kernel": (3, 3, 16, 1)}'
        in text
    )
    assert "x_block_16_project_BN = self.block_16_project_BN(x_block_16_project)" in text


@needs_tf
def test_file_of_keras_2_keeps_its_rules(keras, tmp_path):
    """A file written by Keras 2 (its keras_version): the layers whose conversion depends on it
    (Bessel-corrected batch-norm variance, Keras 2's hard_sigmoid) are built with keras_version=2.
    """
    import h5py

    def as_keras_2(path):
        with h5py.File(path, "r+") as f:
            f.attrs["keras_version"] = "2.15.0"

    L = keras.layers
    inp = L.Input((3, 3, 2), name="image")
    x = L.BatchNormalization(name="bn")(inp)
    x = L.Dense(4, activation="hard_sigmoid", name="gate")(L.Flatten(name="flat")(x))
    kmodel = keras.Model(inp, L.Dense(2, name="head")(x), name="old")
    randomize(kmodel)
    x = np.random.default_rng(4).normal(size=(4, 3, 3, 2)).astype(np.float32)
    text = _check(kmodel, tmp_path, [x], None, "old", "h5", as_keras_2)
    calls = re.sub(r"\(\s+", "(", re.sub(r"\s+", " ", text))  # the calls, unwrapped
    assert 'self.bn = layer("BatchNormalization", keras_version=2, shapes=' in calls
    assert 'layer("Dense", activation="hard_sigmoid", keras_version=2, shapes=' in calls
    assert 'self.head = layer("Dense", shapes=' in calls  # where it changes nothing, not said


_CONVERT_CHILD = (
    BLOCK_TF
    + """
import runpy, sys
sys.argv = ["python -m torch_tfgrads", "convert", *sys.argv[1:]]
try:
    runpy.run_module("torch_tfgrads", run_name="__main__")
except SystemExit as e:  # main() ends with sys.exit
    assert not e.code, e.code
runpy.run_path(sys.argv[-1], run_name="__main__")  # the generated file runs on its own
bad = [n for n in sys.modules if n.split(".")[0] in ("tensorflow", "keras")]
assert not bad, bad
"""
)


@needs_tf
def test_convert_cli_writes_source_without_tensorflow(keras, tmp_path):
    L = keras.layers
    inp = L.Input((6, 6, 2), name="image")
    x = L.Conv2D(4, 3, strides=2, padding="same", activation="relu", name="conv")(inp)
    x = L.BatchNormalization(name="bn")(x)
    kmodel = keras.Model(inp, L.Dense(3, name="head")(L.Flatten(name="flat")(x)), name="cnn")
    randomize(kmodel)
    path = str(tmp_path / "cnn.keras")
    kmodel.save(path)
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    src = tmp_path / "out" / "cnn_source.py"
    src.parent.mkdir()
    r = subprocess.run(
        [sys.executable, "-c", _CONVERT_CHILD, path, "--class-name", "Net", "--source", str(src)],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "cnn_source.weights.pt" in r.stdout and "Net: output shape (1, 3)" in r.stdout
    _ruff(src)
    gen = _import(src).load()
    x = torch.from_numpy(np.random.default_rng(6).normal(size=(2, 6, 6, 2)).astype(np.float32))
    assert torch.equal(gen(x), load_model(path).eval()(x))
    assert type(gen).__name__ == "Net"
