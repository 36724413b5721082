"""The planted-fault example of docs/debugging.md, and the script that draws its picture.

A small Keras CNN is converted with ``torch_tfgrads.keras.load_model``; then its stride-2
convolution ``conv2`` is given the classic porting fault: torch's symmetric padding
(``padding=1`` on both sides) instead of TF's SAME padding, which puts the odd pixel at the end
only. The diff report names ``conv2`` as the first divergence, and the layers after it as
inheriting its error. Needs TensorFlow::

    python -m torch_tfgrads.diff.example docs/images/diff_report_example.svg \\
        [--html report.html] [--json report.json]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import types

import numpy as np
import torch
import torch.nn.functional as F


def build_cnn(keras, size: int = 16):
    """Conv/BN/ReLU twice (the second with stride 2), a depthwise block with a residual Add,
    global pooling and a classifier."""
    L = keras.layers
    inp = L.Input((size, size, 3), name="image")
    x = L.Conv2D(8, 3, padding="same", name="conv1")(inp)
    x = L.BatchNormalization(name="bn1")(x)
    x = L.ReLU(name="relu1")(x)
    x = L.Conv2D(16, 3, strides=2, padding="same", name="conv2")(x)
    x = L.BatchNormalization(name="bn2")(x)
    r = L.ReLU(name="relu2")(x)
    x = L.DepthwiseConv2D(3, padding="same", name="dw3")(r)
    x = L.BatchNormalization(name="bn3")(x)
    x = L.ReLU(name="relu3")(x)
    x = L.Conv2D(16, 1, name="conv4")(x)
    x = L.Add(name="add")([x, r])
    x = L.GlobalAveragePooling2D(name="gap")(x)
    x = L.Dense(10, name="logits")(x)
    return keras.Model(inp, L.Softmax(name="probs")(x), name="example_cnn")


def randomize(model, seed: int = 0) -> None:
    """Random weights everywhere, batch-norm statistics included, so no layer is an identity."""
    rng = np.random.default_rng(seed)
    for v in model.weights:
        shape, name = tuple(v.shape), v.path.split("/")[-1]
        if name in ("moving_variance", "gamma"):
            val = rng.uniform(0.5, 1.5, shape)
        elif name == "moving_mean":
            val = rng.normal(0.0, 0.2, shape)
        else:
            val = rng.normal(0.0, 0.3, shape)
        v.assign(val.astype(v.dtype))


def symmetric_padding(conv: torch.nn.Module) -> None:
    """Plant the fault: a converted 2-D ``Conv`` pads symmetrically (torch's ``padding=k // 2``)
    instead of TF's SAME padding."""

    def forward(self, x):
        pad = self.kernel_size[0] // 2
        w = self.kernel.permute(3, 2, 0, 1)
        y = F.conv2d(x.movedim(-1, 1), w, None, self.strides, pad, self.dilation, self.groups)
        y = y.movedim(1, -1)
        return y if self.bias is None else y + self.bias

    conv.forward = types.MethodType(forward, conv)


def example_report(seed: int = 0):
    """Build, convert, plant the fault, record and compare; returns the DiffReport."""
    from ..keras import load_model
    from .compare_torch import compare
    from .record_keras import _import_keras, record

    _, keras = _import_keras()
    kmodel = build_cnn(keras)
    randomize(kmodel, seed)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "example.keras")
        kmodel.save(path)
        module = load_model(path)
    symmetric_padding(module.conv2)
    x = np.random.default_rng(seed + 1).normal(size=(4, 16, 16, 3)).astype(np.float32)
    return compare(record(kmodel, x), module)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m torch_tfgrads.diff.example", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("svg", help="where to write the chart (SVG)")
    p.add_argument("--html", help="also write the HTML report here")
    p.add_argument("--json", help="also write the JSON report here")
    args = p.parse_args(argv)
    report = example_report()
    with open(args.svg, "w", encoding="utf-8") as f:
        f.write(report.svg())
    if args.html:
        report.to_html(args.html)
    if args.json:
        report.to_json(args.json)
    print(report.table(rich=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
