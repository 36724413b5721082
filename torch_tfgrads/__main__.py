"""Command line: `python -m torch_tfgrads demo | parity | check-build | convert | record | compare`.

`convert` turns a Keras file into a saved nn.Module and/or PyTorch source for it, without
TensorFlow (docs/keras.md);
`record` runs a Keras model (TensorFlow needed) and writes a recording of every layer;
`compare` diffs a torch port against it, layer by layer, without TensorFlow (docs/debugging.md).
"""

import argparse
import sys


def _check_build(require_cuda):
    import torch

    import torch_tfgrads
    from torch_tfgrads import _loader
    from torch_tfgrads.parity import registered_ops

    print(
        f"torch {torch.__version__} (CUDA {torch.version.cuda}), torch_tfgrads "
        f"{torch_tfgrads.__version__}, CUDA kernels compiled: {_loader.WITH_CUDA}"
    )
    ok = True
    for op in registered_ops():
        keys = [
            k
            for k in ("CPU", "CUDA", "CompositeExplicitAutograd")
            if torch._C._dispatch_has_kernel_for_dispatch_key(f"tfgrads::{op}", k)
        ]
        if "CompositeExplicitAutograd" in keys:  # one kernel for every device
            keys = ["CPU", "CUDA"]
        missing = {"CPU"} - set(keys) | ({"CUDA"} - set(keys) if require_cuda else set())
        print(
            f"  tfgrads::{op}: kernels {', '.join(keys)}"
            + (f"  MISSING {missing}" if missing else "")
        )
        ok &= not missing
    # A CPU smoke run, so an import-time or registration problem cannot hide.
    x = torch.randn(2, 3, 3, 4)
    y = torch_tfgrads.fused_batch_norm_v3(x, torch.ones(4), torch.zeros(4))[0]
    ok &= bool(torch.isfinite(y).all())
    out, rows, cols = torch_tfgrads.fractional_max_pool(
        x, [1, 1.5, 1.5, 1], False, False, True, 1, 2
    )
    ok &= rows.tolist() == [0, 1, 3] and out.shape == (2, 2, 2, 4)
    print("check-build:", "OK" if ok else "FAILED")
    return 0 if ok else 1


def _convert(path, output, source, class_name):
    import os

    import torch

    from torch_tfgrads.keras import load_model, write_source

    module = load_model(path)
    params = sum(p.numel() for p in module.parameters())
    what = f"{len(list(module.children()))} layers, {params} parameters"
    if output:
        torch.save(module, output)
        print(
            f"convert: {path} -> {output}: {what} (load with torch.load(path, "
            "weights_only=False); torch_tfgrads must be importable)"
        )
    if source:
        src, weights = write_source(
            module, source, class_name=class_name, origin=os.path.basename(path)
        )
        print(
            f"convert: {path} -> {src} (the model as PyTorch source) and {weights} (its "
            f"state_dict): {what}; load() in {src.name} returns the model with its weights"
        )
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m torch_tfgrads")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("parity", help="compare every op with TensorFlow (or its reference)")
    p.add_argument("--cases", type=int, default=24, help="random cases per family")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--family", action="append", help="only these families")
    d = sub.add_parser("demo", help="the ops, a training step, torch.compile (+ parity with TF)")
    d.add_argument("--parity-cases", type=int, default=8)
    c = sub.add_parser("check-build", help="show which kernels are compiled in")
    c.add_argument("--require-cuda", action="store_true")
    k = sub.add_parser(
        "convert", help="a Keras .keras/.h5 file -> a saved nn.Module and/or its source (no TF)"
    )
    k.add_argument("model", help="a Keras model file (.keras, .h5)")
    k.add_argument("-o", "--output", help="the module, saved with torch.save")
    k.add_argument(
        "--source",
        metavar="MODEL.py",
        help="write the model as PyTorch source, and its state_dict as MODEL.weights.pt",
    )
    k.add_argument("--class-name", help="the class of the source (default: the model's name)")
    from torch_tfgrads.diff.cli import add_parsers

    add_parsers(sub)
    args = parser.parse_args(argv)
    if args.cmd in ("record", "compare"):
        from torch_tfgrads.diff import cli

        return cli.run_record(args) if args.cmd == "record" else cli.run_compare(args)
    if args.cmd == "convert":
        if not (args.output or args.source):
            k.error("give -o MODEL.pt, --source MODEL.py, or both")
        return _convert(args.model, args.output, args.source, args.class_name)
    if args.cmd == "demo":
        from torch_tfgrads.demo import run_demo

        return run_demo(parity_cases=args.parity_cases)
    if args.cmd == "check-build":
        return _check_build(args.require_cuda)
    from torch_tfgrads.parity import run_parity

    return run_parity(n_cases=args.cases, seed=args.seed, families=args.family)


if __name__ == "__main__":
    sys.exit(main())
