"""``python -m torch_tfgrads record`` and ``python -m torch_tfgrads compare``.

``record`` needs TensorFlow; ``compare`` never imports it (it loads the model with
``torch_tfgrads.keras.load_model``, or a whole module saved with ``torch.save``).

Example::

    python -m torch_tfgrads record model.keras --inputs x.npz -o recording.npz
    python -m torch_tfgrads compare model.keras recording.npz --html diff.html --json diff.json
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np


def add_parsers(sub) -> None:
    """Add the ``record`` and ``compare`` subcommands to an argparse subparsers object."""
    r = sub.add_parser(
        "record",
        help="run a Keras model once and record every layer's tensors and gradients (needs "
        "TensorFlow)",
    )
    r.add_argument("model", help="a Keras model file (.keras, .h5)")
    r.add_argument(
        "--inputs",
        required=True,
        help="the model inputs: a .npy (one input) or a .npz (by input name, "
        "else in the order saved)",
    )
    r.add_argument("-o", "--output", required=True, help="the recording (.npz, .h5)")
    r.add_argument("--targets", help="targets for --loss (.npy or .npz)")
    r.add_argument(
        "--loss",
        help="a Keras loss name (e.g. sparse_categorical_crossentropy); "
        "default: sum(output * seed) with a recorded random seed tensor",
    )
    r.add_argument(
        "--inference", action="store_true", help="run with training=False (default: training=True)"
    )
    r.add_argument(
        "--float64",
        action="store_true",
        help="record a float64 copy of the model (for compare --float64)",
    )
    r.add_argument("--seed", type=int, default=0, help="seed of the default loss's tensors")
    c = sub.add_parser(
        "compare",
        help="compare a torch port with a recording, layer by layer (no TensorFlow needed)",
    )
    c.add_argument(
        "model",
        help="a Keras model file (converted with "
        "torch_tfgrads.keras.load_model), or a module saved with torch.save (.pt)",
    )
    c.add_argument("recording", help="a recording made by `record`")
    c.add_argument("--json", help="write the report as JSON here")
    c.add_argument("--html", help="write the report as a standalone HTML page here")
    c.add_argument(
        "--float64",
        action="store_true",
        help="run the torch side in float64 (needs a record --float64 recording)",
    )
    c.add_argument("--rtol", type=float, help="relative tolerance (default by dtype)")
    c.add_argument("--atol", type=float, default=0.0, help="absolute tolerance (default 0)")
    c.add_argument("--name-map", help="a JSON file {keras layer path: torch module name}")
    c.add_argument(
        "--rows", action="store_true", help="also print every tensor of the diverging layers"
    )
    c.add_argument("--plain", action="store_true", help="plain text, even if rich is installed")


def load_arrays(path: str, names: list[str] | None = None) -> list[np.ndarray]:
    """Arrays from a ``.npy`` (one) or ``.npz`` (by ``names`` when its keys are those names,
    else in the order they were saved)."""
    if path.endswith(".npy"):
        return [np.load(path, allow_pickle=False)]
    with np.load(path, allow_pickle=False) as z:
        keys = list(z.files)
        if names and sorted(keys) == sorted(names):
            keys = list(names)
        return [z[k] for k in keys]


def run_record(args) -> int:
    from .record_keras import _import_keras, record

    _, keras = _import_keras()
    model = keras.saving.load_model(args.model, compile=False)
    inputs = load_arrays(args.inputs, [t.name for t in model.inputs])
    targets = load_arrays(args.targets) if args.targets else None
    loss = keras.losses.get(args.loss) if args.loss else None
    if loss is not None and targets is None:
        print("record: --loss needs --targets", file=sys.stderr)
        return 2
    rec = record(
        model,
        inputs,
        args.output,
        targets=targets,
        loss=loss,
        training=not args.inference,
        float64=args.float64,
        seed=args.seed,
    )
    print(
        f"recorded {len(rec.calls)} layer calls of {model.name!r} ({rec.dtype}, "
        f"{'inference' if args.inference else 'training'}) to {args.output}"
    )
    return 0


def _load_module(path: str):
    if path.endswith((".pt", ".pth")):
        import torch

        return torch.load(path, weights_only=False)
    from ..keras import load_model

    return load_model(path)


def run_compare(args) -> int:
    """Exit status 0 when no layer diverges, 1 when one does."""
    from .compare_torch import compare

    module = _load_module(args.model)
    name_map = None
    if args.name_map:
        with open(args.name_map, encoding="utf-8") as f:
            name_map = json.load(f)
    report = compare(
        os.fspath(args.recording),
        module,
        name_map=name_map,
        rtol=args.rtol,
        atol=args.atol,
        float64=args.float64,
    )
    print(report.table(rows=args.rows, rich=False if args.plain else None))
    if args.json:
        report.to_json(args.json)
        print(f"JSON: {args.json}")
    if args.html:
        report.to_html(args.html)
        print(f"HTML: {args.html}")
    return 1 if report.first_divergence else 0
