"""TF checkpoints into converted Keras models, and TF 1 CudnnRNN weights into torch_tfgrads.nn.

A Keras 3 model is saved twice with different random weights: A as `.keras`, B as `.keras` and
as `tf.train.Checkpoint(model=B).write(prefix)` (with its optimizer, so that the checkpoint keys
are not the layer paths). `load_model(A.keras)` then `load_weights(module, prefix)` must give,
bit for bit, the state dict of `load_model(B.keras)`, and the forward Keras B computes. A process
in which `import tensorflow` and `import keras` fail does the same. Mismatching checkpoints raise
and leave the module unchanged. TF 1 CudnnLSTM/GRU checkpoints (the opaque buffer and the
canonical tensors TF 1's saveable wrote beside it) load into torch_tfgrads.nn.CudnnLSTM/GRU.
"""

import importlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import torch_tfgrads
from helpers import REQUIRE_TF
from torch_tfgrads import tf_checkpoint
from torch_tfgrads.keras import KerasLoadError, load_model, load_weights

pytestmark = pytest.mark.needs_tf

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _randomise(model, seed):
    rng = np.random.default_rng(seed)
    for w in model.weights:
        v = rng.standard_normal(w.shape).astype(w.dtype)
        if "variance" in w.path:
            v = np.abs(v) + 0.5
        w.assign(v)


def _cnn(keras):
    return keras.Sequential(
        [
            keras.Input((9, 9, 3)),
            keras.layers.Conv2D(4, 3, padding="same", name="conv"),
            keras.layers.BatchNormalization(name="bn"),
            keras.layers.ReLU(),
            keras.layers.Flatten(),
            keras.layers.Dropout(0.5),
            keras.layers.Dense(5, name="head"),
        ]
    )


def _rnn(keras):
    inp = keras.Input((7,), dtype="int32")
    x = keras.layers.Embedding(30, 6, name="emb")(inp)
    x = keras.layers.Bidirectional(keras.layers.LSTM(5, return_sequences=True), name="bi")(x)
    x = keras.layers.GRU(4, name="gru")(x)
    return keras.Model(inp, keras.layers.Dense(3, name="out")(x))


def _nested(keras):
    inner = keras.Sequential(
        [keras.Input((6,)), keras.layers.Dense(4, name="idense")], name="inner"
    )
    inp = keras.Input((6,))
    norm = keras.layers.Normalization(name="norm")
    norm.adapt(np.random.default_rng(3).standard_normal((16, 6)).astype("float32"))
    return keras.Model(inp, keras.layers.Dense(2, name="out")(inner(norm(inp))))


MODELS = {"cnn": _cnn, "rnn": _rnn, "nested": _nested}


def _inputs(kind):
    rng = np.random.default_rng(7)
    if kind == "cnn":
        return rng.standard_normal((2, 9, 9, 3)).astype("float32")
    if kind == "rnn":
        return rng.integers(0, 30, (3, 7)).astype("int32")
    return rng.standard_normal((4, 6)).astype("float32")


@pytest.fixture(scope="module")
def saved(tf, tmp_path_factory):
    """kind -> {"a": A.keras, "b": B.keras, "ckpt": B's checkpoint, "x", "y": B's output}."""
    import keras

    d = tmp_path_factory.mktemp("ckpt_keras")
    out = {}
    for kind, build in MODELS.items():
        a, b = build(keras), build(keras)  # two instances: other automatic layer names too
        _randomise(a, 1)
        _randomise(b, 2)
        a.save(d / f"{kind}_a.keras")
        b.save(d / f"{kind}_b.keras")
        opt = keras.optimizers.Adam()
        opt.build(b.trainable_variables)  # its slots make the keys optimizer/... paths
        ckpt = tf.train.Checkpoint(model=b, optimizer=opt).write(str(d / kind / "ckpt"))
        x = _inputs(kind)
        out[kind] = dict(
            a=str(d / f"{kind}_a.keras"),
            b=str(d / f"{kind}_b.keras"),
            ckpt=ckpt,
            x=x,
            # from B's file: Normalization caches its statistics when adapted, not on assign
            y=np.asarray(keras.models.load_model(d / f"{kind}_b.keras")(x, training=False)),
        )
    return out


def _state(module):
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def _assert_same_state(got, want):
    assert got.keys() == want.keys()
    for k in want:
        assert got[k].dtype == want[k].dtype, k
        assert torch.equal(got[k].view(-1).view(torch.uint8), want[k].view(-1).view(torch.uint8)), k


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_checkpoint_equals_keras_file(saved, kind):
    s = saved[kind]
    module = load_model(s["a"])
    before = _state(module)
    assert load_weights(module, s["ckpt"]) is module
    want = _state(load_model(s["b"]))
    got = _state(module)
    _assert_same_state(got, want)
    assert any(not torch.equal(before[k], got[k]) for k in got)  # A's weights were replaced
    module.eval()
    with torch.no_grad():
        y = module(torch.from_numpy(s["x"]))
    np.testing.assert_allclose(y.numpy(), s["y"], rtol=1e-5, atol=1e-5)


def test_checkpoint_paths_accepted(saved):
    s = saved["cnn"]
    want = _state(load_model(s["b"]))
    for path in (s["ckpt"] + ".index", s["ckpt"]):
        module = load_model(s["a"])
        load_weights(module, path, root="model")
        _assert_same_state(_state(module), want)


def test_without_tensorflow_or_keras(saved):
    """The same loads in a process where `import tensorflow` and `import keras` fail."""
    cases = {k: (saved[k]["a"], saved[k]["ckpt"]) for k in MODELS}
    code = f"""
import hashlib, json, sys
sys.modules["tensorflow"] = None
sys.modules["keras"] = None
import torch
from torch_tfgrads.keras import load_model, load_weights
out = {{}}
for kind, (a, ckpt) in {cases!r}.items():
    m = load_model(a)
    load_weights(m, ckpt)
    for k, v in m.state_dict().items():
        out[kind + ":" + k] = hashlib.sha256(v.contiguous().view(-1).view(torch.uint8)
                                             .numpy().tobytes()).hexdigest()
assert not [m for m in sys.modules if (m.split(".")[0] in ("tensorflow", "keras"))
            and sys.modules[m] is not None]
print(json.dumps(out))
"""
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout.strip().splitlines()[-1])
    import hashlib

    want = {}
    for kind in MODELS:
        for k, v in load_model(saved[kind]["b"]).state_dict().items():
            data = v.contiguous().view(-1).view(torch.uint8).numpy().tobytes()
            want[kind + ":" + k] = hashlib.sha256(data).hexdigest()
    assert got == want


# ---------------------------------------------------------------------- mismatches, nothing loaded


@pytest.fixture(scope="module")
def other(tf, tmp_path_factory):
    """Checkpoints that do not fit the cnn model."""
    import keras

    d = tmp_path_factory.mktemp("ckpt_other")
    out = {}
    wide = keras.Sequential(
        [
            keras.Input((9, 9, 3)),
            keras.layers.Conv2D(4, 3, padding="same"),
            keras.layers.BatchNormalization(),
            keras.layers.ReLU(),
            keras.layers.Flatten(),
            keras.layers.Dropout(0.5),
            keras.layers.Dense(6),  # 6 units, not 5
        ]
    )
    out["shape"] = tf.train.Checkpoint(model=wide).write(str(d / "shape" / "ckpt"))
    nobias = keras.Sequential(
        [
            keras.Input((9, 9, 3)),
            keras.layers.Conv2D(4, 3, padding="same", use_bias=False),
            keras.layers.BatchNormalization(),
            keras.layers.ReLU(),
            keras.layers.Flatten(),
            keras.layers.Dropout(0.5),
            keras.layers.Dense(5),
        ]
    )
    out["missing"] = tf.train.Checkpoint(model=nobias).write(str(d / "missing" / "ckpt"))
    nobias.save(d / "nobias.keras")
    out["nobias.keras"] = str(d / "nobias.keras")
    fewer = keras.Sequential([keras.Input((9, 9, 3)), keras.layers.Flatten()])
    out["layers"] = tf.train.Checkpoint(model=fewer).write(str(d / "layers" / "ckpt"))
    two = _cnn(keras)
    out["two"] = tf.train.Checkpoint(a=two, b=_cnn(keras)).write(str(d / "two" / "ckpt"))
    with tf.Graph().as_default():
        v = tf.compat.v1.get_variable("conv/kernel", shape=(3, 3, 3, 4))
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            out["v1"] = tf.compat.v1.train.Saver([v]).save(sess, str(d / "v1" / "model"))
    return out


@pytest.mark.parametrize(
    "case, match",
    [
        ("shape", r"layer 'head': weight 'kernel' has shape \[324, 5\] in the model, \[324, 6\]"),
        ("missing", r"layer 'conv' \(Conv2D\): no variable 'bias' in the checkpoint"),
        ("layers", r"has 2 layers in the checkpoint, 7 in the converted model"),
        ("two", r"more than one Keras model .* root="),
        ("v1", r"name-based checkpoint"),
    ],
)
def test_mismatch_raises_and_loads_nothing(saved, other, case, match):
    module = load_model(saved["cnn"]["a"])
    before = _state(module)
    with pytest.raises(KerasLoadError, match=match):
        load_weights(module, other[case])
    _assert_same_state(_state(module), before)


def test_extra_variable_raises(saved, other):
    """A converted Conv2D without bias, a checkpoint whose Conv2D has one: named, not loaded."""
    module = load_model(other["nobias.keras"])
    before = _state(module)
    with pytest.raises(KerasLoadError, match=r"checkpoint has variables the converted layer lacks"):
        load_weights(module, saved["cnn"]["ckpt"])
    _assert_same_state(_state(module), before)


def test_corrupted_checkpoint_loads_nothing(saved, tmp_path):
    import shutil

    src = saved["cnn"]["ckpt"]
    for f in os.listdir(os.path.dirname(src)):
        shutil.copy(os.path.join(os.path.dirname(src), f), tmp_path / f)
    prefix = str(tmp_path / os.path.basename(src))
    data = tmp_path / (os.path.basename(src) + ".data-00000-of-00001")
    raw = bytearray(data.read_bytes())
    key = next(
        k for k, n in tf_checkpoint.variable_names(prefix).items() if n.endswith("head/bias")
    )
    raw[tf_checkpoint.entries(prefix)[key].offset] ^= 0x40
    data.write_bytes(bytes(raw))
    module = load_model(saved["cnn"]["a"])
    before = _state(module)
    with pytest.raises(tf_checkpoint.CheckpointError, match="checksum"):
        load_weights(module, prefix)
    _assert_same_state(_state(module), before)


def test_tf_keras_save_weights(tf, tmp_path):
    """tf-keras's save_weights(save_format="tf") (layer_with_weights-k children), if installed."""
    # make test installs tf-keras; with TFGRADS_REQUIRE_TF=1 (CI) its absence fails the test
    tfk = importlib.import_module("tf_keras") if REQUIRE_TF else pytest.importorskip("tf_keras")
    inp = tfk.Input((7,), dtype="int32")
    x = tfk.layers.Embedding(30, 6)(inp)
    x = tfk.layers.Bidirectional(tfk.layers.LSTM(5, return_sequences=True))(x)
    x = tfk.layers.Dropout(0.1)(x)
    x = tfk.layers.GRU(4)(x)
    model = tfk.Model(inp, tfk.layers.Dense(3)(x))
    model.save(tmp_path / "a.h5")
    _randomise_v2(model)
    model.save(tmp_path / "b.h5")
    model.save_weights(str(tmp_path / "ckpt" / "w"), save_format="tf")
    module = load_model(tmp_path / "a.h5")
    load_weights(module, tmp_path / "ckpt" / "w")
    _assert_same_state(_state(module), _state(load_model(tmp_path / "b.h5")))
    x = _inputs("rnn")
    with torch.no_grad():
        y = module.eval()(torch.from_numpy(x))
    y = y[0] if isinstance(y, list) else y  # a Keras 2 config lists the outputs
    np.testing.assert_allclose(y.numpy(), model(x, training=False).numpy(), rtol=1e-5, atol=1e-5)


def _randomise_v2(model):
    rng = np.random.default_rng(5)
    for w in model.weights:
        w.assign(rng.standard_normal(w.shape).astype(w.dtype.as_numpy_dtype))


# ------------------------------------------------------------------- TF 1 CudnnRNN checkpoints


def _canonical_tf1(tf, mode, weights, biases, in_width, units):
    """TF 1's CudnnOpaqueParamsSaveable._TransformSingleLayerCanonical for one layer and
    direction (tf.contrib.cudnn_rnn), in TF ops: the tensors a TF 1 Saver wrote."""
    t = tf.transpose
    if mode == "lstm":
        w_i, w_f, w_c, w_o, r_i, r_f, r_c, r_o = weights
        W = [tf.concat([w, r], 1) for w, r in ((w_i, r_i), (w_c, r_c), (w_f, r_f), (w_o, r_o))]
        b_wi, b_wf, b_wc, b_wo, b_ri, b_rf, b_rc, b_ro = biases
        B = [b_wi + b_ri, b_wc + b_rc, b_wf + b_rf, b_wo + b_ro]
        return {"kernel": t(tf.concat(W, 0)), "bias": tf.concat(B, 0)}
    w_i, w_r, w_h, r_i, r_r, r_h = weights
    b_wi, b_wr, b_wh, b_ri, b_rr, b_rh = biases
    return {
        "gates/kernel": t(tf.concat([tf.concat([w_i, r_i], 1), tf.concat([w_r, r_r], 1)], 0)),
        "candidate/input_projection/kernel": t(w_h),
        "candidate/hidden_projection/kernel": t(r_h),
        "gates/bias": tf.concat([b_wi, b_wr], 0) + tf.concat([b_ri, b_rr], 0),
        "candidate/input_projection/bias": b_wh,
        "candidate/hidden_projection/bias": b_rh,
    }


def _tf1_checkpoint(tf, path, mode, layers, units, in_size, direction, seed):
    """A TF 1 name-based checkpoint of a tf.contrib.cudnn_rnn layer in scope "cudnn_<mode>":
    `opaque_kernel` (the buffer, built by TF with concat for one unidirectional layer, the layout
    Keras's cuDNN path builds, else by cudnn_rnn_canonical_to_params_v2 since TF's CPU has no
    CudnnRNNCanonicalToParams kernel) and the canonical tensors beside it."""
    module_cls = torch_tfgrads.nn.CudnnLSTM if mode == "lstm" else torch_tfgrads.nn.CudnnGRU
    ref = module_cls(layers, units, direction=direction, input_size=in_size)
    g = torch.Generator().manual_seed(seed)
    w_shapes, b_shapes = ref._cfg.canonical_shapes()
    weights = [torch.randn(s, generator=g) for s in w_shapes]
    biases = [torch.randn(s, generator=g) for s in b_shapes]
    scope = f"cudnn_{mode}"
    G = 4 if mode == "lstm" else 3
    dirs = 2 if direction == "bidirectional" else 1
    with tf.Graph().as_default():
        tw = [tf.constant(w.numpy()) for w in weights]
        tb = [tf.constant(b.numpy()) for b in biases]
        if layers == 1 and dirs == 1:
            buffer = tf.concat([tf.reshape(w, [-1]) for w in tw] + tb, 0)
        else:
            buffer = tf.constant(
                torch_tfgrads.cudnn_rnn_canonical_to_params_v2(
                    layers, units, in_size, weights, biases, mode, direction=direction
                ).numpy()
            )
        variables = [
            tf.compat.v1.get_variable(
                f"{scope}/opaque_kernel", initializer=buffer, validate_shape=False
            )
        ]
        cell = "cudnn_compatible_lstm_cell" if mode == "lstm" else "cudnn_compatible_gru_cell"
        for layer in range(layers):
            for d in range(dirs):
                k = (layer * dirs + d) * 2 * G
                if dirs == 1:
                    p = f"{scope}/rnn/multi_rnn_cell/cell_{layer}/{cell}"
                else:
                    fb = "fw" if d == 0 else "bw"
                    p = f"{scope}/stack_bidirectional_rnn/cell_{layer}/bidirectional_rnn/{fb}/{cell}"
                width = in_size if layer == 0 else units * dirs
                parts = _canonical_tf1(tf, mode, tw[k : k + 2 * G], tb[k : k + 2 * G], width, units)
                for name, value in parts.items():
                    variables.append(tf.compat.v1.get_variable(f"{p}/{name}", initializer=value))
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            prefix = tf.compat.v1.train.Saver(variables).save(sess, str(path / "model"))
    return prefix, ref, weights, biases


@pytest.mark.parametrize(
    "mode, layers, direction",
    [
        ("lstm", 1, "unidirectional"),
        ("lstm", 2, "bidirectional"),
        ("gru", 1, "unidirectional"),
        ("gru", 2, "bidirectional"),
    ],
)
def test_tf1_cudnn_rnn(tf, tmp_path, mode, layers, direction):
    units, in_size = 5, 3
    prefix, module, weights, biases = _tf1_checkpoint(
        tf, tmp_path, mode, layers, units, in_size, direction, seed=11
    )
    # The opaque buffer: bit for bit what TF saved.
    keys = tf_checkpoint.load_cudnn_rnn(module, prefix)
    assert keys == [f"cudnn_{mode}/opaque_kernel"]
    saved = tf.train.load_checkpoint(prefix).get_tensor(keys[0])
    assert module.params.detach().numpy().tobytes() == saved.tobytes()
    got_w, got_b = module.canonical_weights()
    for a, b in zip(got_w + got_b, weights + biases):
        assert torch.equal(a, b)
    # The canonical tensors: TF 1's restore (halved summed biases): the same weights, biases
    # that sum to the same values, and the same outputs.
    other = type(module)(layers, units, direction=direction, input_size=in_size)
    used = tf_checkpoint.load_cudnn_rnn(other, prefix, scope=f"cudnn_{mode}", source="canonical")
    assert all("opaque_kernel" not in k for k in used)
    ow, ob = other.canonical_weights()
    for a, b in zip(ow, weights):
        assert torch.equal(a, b)
    G = 4 if mode == "lstm" else 3
    for start in range(0, len(ob), 2 * G):
        got = ob[start : start + 2 * G]
        want = biases[start : start + 2 * G]
        apart = [G - 1] if mode == "gru" else []  # GRU saves the candidate biases apart
        for j in range(G):
            if j in apart:
                assert torch.equal(got[j], want[j]) and torch.equal(got[G + j], want[G + j])
            else:  # halves of the saved sum, which they add up to exactly
                assert torch.equal(got[j], got[G + j])
                assert torch.equal(got[j] + got[G + j], want[j] + want[G + j])
    x = torch.randn(6, 2, in_size, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        y1, _ = module(x)
        y2, _ = other(x)
    torch.testing.assert_close(y2, y1, rtol=1e-5, atol=1e-5)


def test_tf1_lstm_canonical_matches_tf_block_lstm(tf, tmp_path):
    """The canonical LSTM tensors are LSTMBlockCell's (forget_bias=0); TF's CPU BlockLSTM run on
    them must compute what the module loaded from them computes."""
    prefix, module, _, _ = _tf1_checkpoint(tf, tmp_path, "lstm", 1, 5, 3, "unidirectional", 4)
    tf_checkpoint.load_cudnn_rnn(module, prefix, source="canonical")
    r = tf.train.load_checkpoint(prefix)
    p = "cudnn_lstm/rnn/multi_rnn_cell/cell_0/cudnn_compatible_lstm_cell"
    kernel, bias = r.get_tensor(p + "/kernel"), r.get_tensor(p + "/bias")
    x = np.random.default_rng(2).standard_normal((6, 2, 3)).astype("float32")
    zeros = np.zeros((2, 5), "float32")
    out = tf.raw_ops.BlockLSTM(
        seq_len_max=np.int64(6),
        x=x,
        cs_prev=zeros,
        h_prev=zeros,
        w=kernel,
        wci=np.zeros(5, "float32"),
        wcf=np.zeros(5, "float32"),
        wco=np.zeros(5, "float32"),
        b=bias,
        forget_bias=0.0,
        cell_clip=-1.0,
        use_peephole=False,
    )
    with torch.no_grad():
        y, _ = module(torch.from_numpy(x))
    np.testing.assert_allclose(y.numpy(), out.h.numpy(), rtol=1e-5, atol=1e-5)


def test_tf1_cudnn_rnn_mismatch(tf, tmp_path):
    prefix, module, _, _ = _tf1_checkpoint(tf, tmp_path, "lstm", 1, 5, 3, "unidirectional", 3)
    wrong = torch_tfgrads.nn.CudnnLSTM(1, 6, input_size=3)
    before = wrong.params.detach().clone()
    with pytest.raises(ValueError, match=r"needs 264 elements \(cudnn_rnn_params_size\)"):
        tf_checkpoint.load_cudnn_rnn(wrong, prefix)
    with pytest.raises(ValueError, match="do not fit"):
        tf_checkpoint.load_cudnn_rnn(wrong, prefix, source="canonical")
    gru = torch_tfgrads.nn.CudnnGRU(1, 5, input_size=3)
    with pytest.raises(KeyError, match="CudnnGRU weights"):
        tf_checkpoint.load_cudnn_rnn(gru, prefix, source="canonical")
    with pytest.raises(KeyError, match="no 'enc/opaque_kernel'"):
        tf_checkpoint.load_cudnn_rnn(module, prefix, scope="enc", source="opaque")
    assert torch.equal(wrong.params.detach(), before)
