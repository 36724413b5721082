"""torch_tfgrads.diff: the layer-by-layer diff report of a torch port against its Keras model.

Small Keras models (a CNN: Conv2D SAME stride 2, BatchNormalization, Dense; a text model:
Embedding, LSTM, GRU(reset_after=True), Dense) are recorded with TensorFlow, converted with
torch_tfgrads.keras.load_model, and then known porting faults are planted in the converted
module: the report must name the layer holding each fault as the first divergence, mark the
layers that only inherit its error, and find nothing in an unmodified model. Also: the
recording round trip without TensorFlow (a subprocess in which `import tensorflow` fails), the
JSON and HTML outputs, the float64 mode, the CLI, user modules mapped by name.
"""

import json
import os
import subprocess
import sys
import types
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import torch_tfgrads
from helpers import BLOCK_TF
from torch_tfgrads import diff as D
from torch_tfgrads.diff.example import randomize, symmetric_padding
from torch_tfgrads.diff.metrics import measure, ulp_distance
from torch_tfgrads.keras import load_model

pytestmark = pytest.mark.needs_tf

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _cnn(keras):
    L = keras.layers
    inp = L.Input((8, 8, 3), name="image")
    x = L.Conv2D(4, 3, strides=2, padding="same", name="conv")(inp)
    x = L.BatchNormalization(name="bn")(x)
    x = L.ReLU(name="relu")(x)
    x = L.Flatten(name="flat")(x)
    return keras.Model(inp, L.Dense(5, name="dense")(x), name="cnn")


def _text(keras):
    L = keras.layers
    inp = L.Input((6,), dtype="int32", name="tokens")
    x = L.Embedding(30, 5, name="emb")(inp)
    x = L.LSTM(4, return_sequences=True, name="lstm")(x)
    x = L.GRU(4, reset_after=True, return_sequences=True, name="gru")(x)
    return keras.Model(inp, L.Dense(4, name="dense")(x), name="text")


def _setup(keras, build, x, tmp):
    kmodel = build(keras)
    randomize(kmodel, seed=3)
    path = str(tmp / f"{kmodel.name}.keras")
    kmodel.save(path)
    rec_path = str(tmp / f"{kmodel.name}.npz")
    rec = D.record(kmodel, x, rec_path)
    return SimpleNamespace(
        kmodel=kmodel, path=path, rec_path=rec_path, rec=rec, x=x, fresh=lambda: load_model(path)
    )


@pytest.fixture(scope="module")
def cnn(keras, tmp_path_factory):
    x = np.random.default_rng(1).normal(size=(4, 8, 8, 3)).astype(np.float32)
    return _setup(keras, _cnn, x, tmp_path_factory.mktemp("cnn"))


@pytest.fixture(scope="module")
def text(keras, tmp_path_factory):
    x = np.random.default_rng(2).integers(0, 30, size=(3, 6)).astype(np.int32)
    return _setup(keras, _text, x, tmp_path_factory.mktemp("text"))


def _statuses(report):
    return {lay.name: lay.status for lay in report.layers}


def _row(report, layer, key):
    return next(r for r in report.layer(layer).rows if r.key == key)


# ------------------------------------------------------------------ no fault, no divergence


@pytest.mark.parametrize("which", ["cnn", "text"])
def test_unmodified_model_shows_no_divergence(request, which):
    m = request.getfixturevalue(which)
    report = D.compare(m.rec_path, m.fresh())
    assert report.first_divergence is None, report.table(rich=False)
    assert set(_statuses(report).values()) == {"ok"}
    worst = max(r.isolated.max_rel for lay in report.layers for r in lay.rows if r.isolated)
    assert worst < 1e-5
    # every layer, in Keras's order, with its outputs, gradients and weight gradients
    assert [lay.name for lay in report.layers] == [c.id for c in m.rec.calls]
    keys = {r.key for lay in report.layers for r in lay.rows}
    assert {"output[0]", "output_grad[0]", "weight_grad/kernel", "weight/kernel"} <= keys
    assert "No divergence" in report.summary()


# ------------------------------------------------------------------ planted faults


def test_missing_kernel_transpose(cnn, text):
    """(a) The kernel transposed: conv's spatial axes swapped, the text model's square Dense
    kernel transposed. The layer holding it diverges (its weight row shows the cause), the
    layers after it only inherit."""
    module = cnn.fresh()
    module.conv.kernel.data = module.conv.kernel.data.transpose(0, 1).contiguous()
    report = D.compare(cnn.rec_path, module)
    assert report.first_divergence == "conv"
    assert _row(report, "conv", "weight/kernel").isolated.over
    assert _row(report, "conv", "output[0]").isolated.max_rel > 0.1
    assert _statuses(report) == {
        "conv": "diverges",
        "bn": "inherited",
        "relu": "inherited",
        "flat": "inherited",
        "dense": "inherited",
    }
    assert "isolated weight/kernel" in report.summary()

    module = text.fresh()
    module.dense.kernel.data = module.dense.kernel.data.T.contiguous()
    report = D.compare(text.rec_path, module)
    assert report.first_divergence == "dense"
    assert report.diverging == ["dense"]
    # the wrong kernel sends wrong gradients back: the layers before it inherit (backward)
    assert _statuses(report)["lstm"] == "inherited"
    assert not _row(report, "lstm", "output[0]").chained.over
    assert _row(report, "lstm", "output_grad[0]").chained.over


def test_symmetric_instead_of_same_padding(cnn):
    """(b) torch's symmetric padding (1, 1) for TF's SAME (0, 1) at stride 2."""
    module = cnn.fresh()
    symmetric_padding(module.conv)
    report = D.compare(cnn.rec_path, module)
    assert report.first_divergence == "conv"
    conv = report.layer("conv")
    assert _row(report, "conv", "weight/kernel").isolated.max_abs == 0  # weights are right
    out = _row(report, "conv", "output[0]").isolated
    assert out.over and out.max_rel > 0.1 and out.frac_over > 0.5
    assert _row(report, "conv", "weight_grad/kernel").isolated.over
    assert conv.status == "diverges"
    assert _row(report, "dense", "output[0]").chained.over
    assert not _row(report, "dense", "output[0]").isolated.over
    assert "isolated output[0]" in report.summary()


def test_torch_batch_norm_momentum_convention(cnn):
    """(c) momentum 0.01 (torch's convention for Keras's 0.99): the training forward is right,
    the moving statistics after the step are not; after a training step on each side an
    inference recording shows the difference as the batch norm's state before the call."""
    module = cnn.fresh()
    module.bn.momentum = 0.01
    report = D.compare(cnn.rec_path, module)
    assert report.first_divergence == "bn"
    assert not _row(report, "bn", "output[0]").isolated.over
    for stat in ("moving_mean", "moving_variance"):
        assert _row(report, "bn", f"state_out/{stat}").isolated.over
        assert not _row(report, "bn", f"state_in/{stat}").isolated.over
    assert _statuses(report)["dense"] == "ok"  # nothing downstream sees it in training

    # a second step, in inference, after one training step on each side
    kmodel, weights = cnn.kmodel, cnn.kmodel.get_weights()
    try:
        kmodel(cnn.x, training=True)
        rec = D.record(kmodel, cnn.x, training=False)
    finally:
        kmodel.set_weights(weights)
    module.train()
    module(torch.from_numpy(cnn.x))
    report = D.compare(rec, module)
    assert report.first_divergence == "bn"
    assert _row(report, "bn", "state_in/moving_mean").chained.over
    assert _row(report, "bn", "output[0]").chained.over
    assert _statuses(report)["dense"] == "inherited"


def test_unbiased_moving_variance(cnn):
    """(d) the Bessel-corrected moving variance (tf-keras's fused rule) on a Keras 3 model:
    only the moving variance differs, by the batch's n / (n - 1) correction times 1 - momentum."""
    module = cnn.fresh()
    module.bn.moving_variance_rule = "bessel"
    report = D.compare(cnn.rec_path, module)
    assert report.first_divergence == "bn"
    var = _row(report, "bn", "state_out/moving_variance").isolated
    assert var.over and 1e-5 < var.max_rel < 1e-2
    assert not _row(report, "bn", "state_out/moving_mean").isolated.over
    assert not _row(report, "bn", "output[0]").isolated.over


def test_untied_lstm_bias(text):
    """(e) cuDNN's two bias halves (input and recurrent) untied from Keras's single bias: the
    recurrent half gets a perturbation."""
    module = text.fresh()
    lstm = module.lstm
    recurrent_half = torch.from_numpy(np.random.default_rng(5).normal(0, 0.1, 16)).float()

    def step(self, x, h, c, *_):  # Keras's cell, with z = x W + b_input + (h U + b_recurrent)
        z = x @ self.kernel + self.bias + (h @ self.recurrent_kernel + recurrent_half)
        z0, z1, z2, z3 = z.split(self.units, dim=-1)
        c = torch.sigmoid(z1) * c + torch.sigmoid(z0) * torch.tanh(z2)
        return torch.sigmoid(z3) * torch.tanh(c), c

    lstm.use_cudnn = False  # the step loop, with the planted cell
    lstm._step = types.MethodType(step, lstm)
    report = D.compare(text.rec_path, module)
    assert report.first_divergence == "lstm"
    assert _row(report, "lstm", "output[0]").isolated.over
    assert _statuses(report) == {
        "emb": "inherited",
        "lstm": "diverges",
        "gru": "inherited",
        "dense": "inherited",
    }
    assert not _row(report, "emb", "output[0]").chained.over  # emb inherits in the backward


def test_wrong_gru_reset_after(text):
    """(f) reset_after=False math (reset gate before the recurrent matmul) with a
    reset_after=True layer's weights; and the flag flipped outright, which makes the step
    raise: an error counts as a divergence, named at the layer."""
    module = text.fresh()
    gru = module.gru

    def reset_before(self, x, h, c, *_):
        U = self.units
        x_z, x_r, x_h = (x @ self.kernel + self.bias[0]).split(U, dim=-1)
        inner = h @ self.recurrent_kernel[:, : 2 * U] + self.bias[1][: 2 * U]
        z = torch.sigmoid(x_z + inner[:, :U])
        r = torch.sigmoid(x_r + inner[:, U:])
        hh = torch.tanh(x_h + (r * h) @ self.recurrent_kernel[:, 2 * U :] + self.bias[1][2 * U :])
        return z * h + (1 - z) * hh, c

    gru.use_cudnn = False  # the step loop, with the planted cell
    gru._step = types.MethodType(reset_before, gru)
    report = D.compare(text.rec_path, module)
    assert report.first_divergence == "gru"
    assert _row(report, "gru", "output[0]").isolated.over
    assert not _row(report, "lstm", "output[0]").isolated.over

    module = text.fresh()
    module.gru.reset_after = False  # the (2, 3U) bias then does not broadcast over batch 3
    report = D.compare(text.rec_path, module)
    assert report.first_divergence == "gru" and report.layer("gru").status == "error"
    assert "raised" in report.summary() and report.notes
    assert report.layer("dense").status == "ok"  # run alone, from the reference's inputs


# ------------------------------------------------------------------ round trip, outputs, CLI

_TF_FREE_CHILD = (
    BLOCK_TF
    + """
import json, sys
from torch_tfgrads.__main__ import main
rc = main(["compare", sys.argv[1], sys.argv[2], "--json", sys.argv[3], "--html", sys.argv[4],
           "--plain"])
bad = [n for n in sys.modules if n.split(".")[0] in ("tensorflow", "keras")]
assert not bad, bad
print("RC", rc)
"""
)


def test_compare_from_recording_without_tensorflow(cnn, tmp_path):
    """`python -m torch_tfgrads compare model.keras recording.npz` where TF cannot be
    imported: exit status 0 (no divergence), the JSON and HTML written."""
    js, html = str(tmp_path / "r.json"), str(tmp_path / "r.html")
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    r = subprocess.run(
        [sys.executable, "-c", _TF_FREE_CHILD, cnn.path, cnn.rec_path, js, html],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
    )
    assert r.returncode == 0 and "RC 0" in r.stdout, r.stdout[-2000:] + r.stderr[-3000:]
    assert "No divergence" in r.stdout
    with open(js) as f:
        data = json.load(f)
    assert data["first_divergence"] is None and len(data["layers"]) == 5
    with open(html) as f:
        assert "<svg" in f.read()


def test_json_html_and_table_name_the_first_divergence(cnn, tmp_path):
    module = cnn.fresh()
    symmetric_padding(module.conv)
    report = D.compare(cnn.rec_path, module)
    report.to_json(tmp_path / "r.json")
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["format"] == "torch_tfgrads.diff.report" and data["version"] == 1
    assert data["first_divergence"] == "conv" and data["diverging"] == ["conv"]
    conv = data["layers"][0]
    assert conv["status"] == "diverges" and conv["summary"]["forward_isolated"] > 0.1
    row = next(r for r in conv["rows"] if r["key"] == "output[0]")
    assert row["isolated"]["over"] and row["isolated"]["max_ulp"] > 1e6
    assert data["reference"]["versions"]["tensorflow"]
    page = report.to_html(tmp_path / "r.html")
    assert page == (tmp_path / "r.html").read_text()
    assert "<svg" in page and "first divergence: conv" in page
    assert "<script" not in page and "http" not in page.replace("http://www.w3.org", "")
    text = report.table(rich=False, rows=True)
    assert "DIVERGES" in text and "First divergence: conv (Conv2D)" in text
    assert "inherited" in report.table()  # rich, when installed


def test_h5_recording_and_cli_record(cnn, tmp_path):
    """The same recording as .h5; `python -m torch_tfgrads record` writes one from files."""
    rec = D.load_recording(cnn.rec_path)
    rec.save(tmp_path / "r.h5")
    again = D.load_recording(tmp_path / "r.h5")
    assert again.meta == rec.meta
    assert all(np.array_equal(again.arrays[k], rec.arrays[k]) for k in rec.arrays)
    assert D.compare(again, cnn.fresh()).first_divergence is None
    from torch_tfgrads.__main__ import main

    np.savez(tmp_path / "x.npz", image=cnn.x)
    assert (
        main(
            [
                "record",
                cnn.path,
                "--inputs",
                str(tmp_path / "x.npz"),
                "-o",
                str(tmp_path / "cli.npz"),
            ]
        )
        == 0
    )
    cli = D.load_recording(tmp_path / "cli.npz")
    assert [c.id for c in cli.calls] == [c.id for c in rec.calls]
    assert all(
        np.array_equal(cli.array(a), rec.array(b))
        for a, b in zip(cli.meta["output_grads"], rec.meta["output_grads"])
    )


def test_float64_mode(tf, keras, floatx, cnn, tmp_path):
    """A float64 model compared in float64: no divergence, isolated errors at float64
    rounding. A float32 model recorded with float64=True compares with float64=True."""
    floatx("float64")
    kmodel = _cnn(keras)
    randomize(kmodel, seed=4)
    path = str(tmp_path / "m64.keras")
    kmodel.save(path)
    x = cnn.x.astype(np.float64)
    report = D.compare(D.record(kmodel, x), load_model(path), float64=True)
    assert report.dtype == "float64" and report.rtol == 1e-10
    assert report.first_divergence is None, report.table(rich=False)
    worst = max(r.isolated.max_rel for lay in report.layers for r in lay.rows if r.isolated)
    assert worst < 1e-13
    floatx("float32")
    rec64 = D.record(cnn.kmodel, cnn.x, float64=True)
    module = cnn.fresh()
    report = D.compare(rec64, module, float64=True)
    assert report.first_divergence is None and report.float64
    assert module.conv.kernel.dtype == torch.float32  # given back as it was
    module = cnn.fresh()  # a planted fault is still found in float64
    symmetric_padding(module.conv)
    assert D.compare(rec64, module, float64=True).first_divergence == "conv"
    with pytest.raises(TypeError, match="float64"):
        D.compare(cnn.rec_path, cnn.fresh(), float64=True)
    with pytest.raises(TypeError, match="float64=True"):
        D.compare(rec64, cnn.fresh())


def test_custom_loss(keras, cnn):
    """A Keras loss with targets: without a torch loss the recorded gradient at the output is
    backpropagated; with the same loss in torch, the loss values are compared too."""
    y = np.random.default_rng(3).integers(0, 5, size=4)
    rec = D.record(
        cnn.kmodel,
        cnn.x,
        targets=y,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    assert rec.loss["kind"] == "custom" and not rec.meta["seeds"]
    assert D.compare(rec, cnn.fresh()).first_divergence is None
    report = D.compare(
        rec,
        cnn.fresh(),
        loss=lambda y_true, y_pred: torch.nn.functional.cross_entropy(y_pred, y_true),
    )
    assert report.first_divergence is None
    loss = next(r for r in report.model_rows if r.key == "loss")
    assert not loss.chained.over


def test_keras_model_as_reference_and_shared_nested_layers(keras, tmp_path):
    """compare(keras_model, ...) records in memory; a nested model used twice (its layers
    recorded as inner/conv and inner/conv#1) and a residual Add match."""
    L = keras.layers
    i = L.Input((4, 4, 2))
    y = L.BatchNormalization(name="bn")(L.Conv2D(3, 3, padding="same", name="conv")(i))
    inner = keras.Model(i, L.GlobalMaxPooling2D(name="gmp")(y), name="inner")
    a, b = L.Input((4, 4, 2), name="a"), L.Input((4, 4, 2), name="b")
    z = L.Conv2D(2, 1, name="pre")(a)
    s = L.Add(name="add")([inner(z), inner(b)])
    kmodel = keras.Model([a, b], L.Dense(2, name="out")(L.Add(name="res")([s, inner(b)])))
    randomize(kmodel)
    kmodel.save(tmp_path / "n.keras")
    x = [np.random.default_rng(k).normal(size=(3, 4, 4, 2)).astype(np.float32) for k in (0, 1)]
    report = D.compare(kmodel, load_model(tmp_path / "n.keras"), x)
    names = [lay.name for lay in report.layers]
    assert "inner/conv#2" in names and "inner/bn#1" in names
    # torch runs the independent calls of the shared model in another order: the moving
    # statistics before a later call differ (chained: inherited), nothing diverges
    assert report.first_divergence is None, report.table(rich=False)


def test_user_module_through_name_map(keras, tmp_path):
    """A hand-written port (NCHW conv, nn.Linear) mapped with LayerMap transforms."""
    L = keras.layers
    inp = L.Input((6, 6, 2))
    x = L.Conv2D(3, 3, name="conv")(inp)
    kmodel = keras.Model(inp, L.Dense(2, name="fc")(L.Flatten(name="flat")(x)))
    randomize(kmodel)

    class Port(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.features = torch.nn.Conv2d(2, 3, 3)
            self.head = torch.nn.Linear(48, 2)

        def forward(self, x):
            y = self.features(x.permute(0, 3, 1, 2))
            return self.head(y.permute(0, 2, 3, 1).flatten(1))

    port = Port()
    conv, fc = kmodel.get_layer("conv"), kmodel.get_layer("fc")
    with torch.no_grad():
        port.features.weight.copy_(torch.from_numpy(conv.kernel.numpy()).permute(3, 2, 0, 1))
        port.features.bias.copy_(torch.from_numpy(conv.bias.numpy()))
        port.head.weight.copy_(torch.from_numpy(fc.kernel.numpy()).T)
        port.head.bias.copy_(torch.from_numpy(fc.bias.numpy()))
    name_map = {
        "conv": D.LayerMap(
            "features",
            input=lambda t: t.permute(0, 3, 1, 2),
            output=lambda t: t.permute(0, 2, 3, 1),
            weights={"kernel": ("weight", lambda w: w.permute(2, 3, 1, 0))},
        ),
        "fc": D.LayerMap("head", weights={"kernel": ("weight", lambda w: w.T)}),
    }
    x = np.random.default_rng(0).normal(size=(2, 6, 6, 2)).astype(np.float32)
    rec = D.record(kmodel, x)
    report = D.compare(rec, port, name_map=name_map)
    assert _statuses(report) == {"conv": "ok", "flat": "unmapped", "fc": "ok"}
    assert report.first_divergence is None
    with torch.no_grad():
        port.head.weight.mul_(1.01)
    assert D.compare(rec, port, name_map=name_map).first_divergence == "fc"


def test_example_regenerates_the_docs_picture(tmp_path):
    from torch_tfgrads.diff.example import main

    assert main([str(tmp_path / "e.svg")]) == 0
    svg = (tmp_path / "e.svg").read_text()
    assert svg.startswith("<svg") and "first divergence: conv2" in svg
    assert os.path.exists(os.path.join(ROOT, "docs", "images", "diff_report_example.svg"))


# ------------------------------------------------------------------ pieces and errors


def test_lazy_exports_import_neither_tensorflow_nor_h5py():
    code = (
        "import sys, torch_tfgrads as T\n"
        "assert 'torch_tfgrads.diff' not in sys.modules\n"
        "import torch_tfgrads.diff as D\n"
        "assert T.compare is D.compare and T.record is D.record and T.diff is D\n"
        "bad = [n for n in sys.modules if n.split('.')[0] in ('tensorflow', 'keras', 'h5py')]\n"
        "assert not bad, bad\n"
        "print('OK')\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert "OK" in r.stdout, r.stderr[-2000:]
    assert "compare" not in torch_tfgrads.__all__


def test_metrics():
    one = np.float32(1.0)
    nxt = np.nextafter(one, np.float32(2))
    assert ulp_distance(np.array([nxt]), np.array([one]))[0] == 1
    tiny = np.float32(1e-45)
    assert ulp_distance(np.array([-tiny]), np.array([tiny]))[0] == 2
    assert ulp_distance(np.array([-0.0], np.float32), np.array([0.0], np.float32))[0] == 0
    m = measure(torch.tensor([1.0, 2.0, 3.0]), np.array([1.0, 2.0, 3.3], np.float32), rtol=0.05)
    assert abs(m.max_rel - 0.3 / 3.3) < 1e-6 and m.over and abs(m.frac_over - 1 / 3) < 1e-9
    assert measure(torch.zeros(2), np.zeros(3), rtol=1e-5).note.startswith("shape")
    nan = measure(torch.tensor([float("nan")]), np.array([1.0]), rtol=1e-5)
    assert nan.over and nan.max_ulp == float("inf")
    assert json.dumps(nan.to_dict(), allow_nan=False)


def test_argument_errors(cnn, tmp_path):
    np.savez(tmp_path / "other.npz", x=np.ones(3))
    with pytest.raises(ValueError, match="not a torch_tfgrads diff recording"):
        D.load_recording(tmp_path / "other.npz")
    with pytest.raises(ValueError, match="argument 'path'"):
        D.load_recording(tmp_path / "r.txt")
    with pytest.raises(ValueError, match="argument 'torch_module'"):
        D.compare(cnn.rec_path, object())
    with pytest.raises(ValueError, match="argument 'inputs'"):
        D.compare(cnn.rec_path, cnn.fresh(), cnn.x + 1)
    with pytest.raises(ValueError, match="argument 'rtol'"):
        D.compare(cnn.rec_path, cnn.fresh(), rtol=-1.0)
    with pytest.raises(ValueError, match="argument 'path'"):
        D.record(cnn.kmodel, cnn.x, tmp_path / "r.json")
    with pytest.raises(ValueError, match="argument 'inputs'"):
        D.record(cnn.kmodel, [cnn.x, cnn.x])
