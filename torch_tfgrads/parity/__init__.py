"""`python -m torch_tfgrads parity`: every registered op against TensorFlow 2.21 (Eigen path) or
its family's float64 reference, printing a table of cases and worst relative errors.

Speed is not measured here: timing two libraries fairly needs interleaved rounds and a quiet
machine, which the benchmarks in `benchmarks/` provide (docs/benchmarks.md).

A family adds itself to FAMILIES with a module exposing OPS (op names) and
`run(tf, n_cases, seed, log)` -> list of Row.
"""

import importlib
import sys
from dataclasses import dataclass

FAMILIES = {
    "FusedBatchNorm": "torch_tfgrads.parity.fused_batch_norm",
    "FractionalPool": "torch_tfgrads.parity.fractional_pool",
    "DepthwiseConv2dNative": "torch_tfgrads.parity.depthwise_conv2d",
    "CudnnRNN": "torch_tfgrads.parity.cudnn_rnn",
}
TF_REQUIREMENT = "tensorflow-cpu==2.21.0"


@dataclass
class Row:
    op: str
    cases: int
    worst_rel_err: float
    tolerance: float

    @property
    def ok(self):
        return self.worst_rel_err <= self.tolerance


def registered_ops():
    ops = []
    for mod in FAMILIES.values():
        ops += importlib.import_module(mod).OPS
    return ops


def run_parity(n_cases=24, seed=0, families=None, out=sys.stdout):
    """Runs the parity job; returns a process exit code (0 all passed, 1 a failure, 2 no TF)."""
    from ._tf import TFUnavailable, import_tf, onednn_enabled

    try:
        tf = import_tf(eigen=True)
    except TFUnavailable as e:
        print(
            f"parity: needs TensorFlow as the oracle ({e}).\n"
            f"  Install it with:  pip install {TF_REQUIREMENT}\n"
            "  (make test installs it into .venv; the ops themselves do not need it)",
            file=out,
        )
        return 2
    if onednn_enabled():  # TF was imported before us with oneDNN on: not the reference path
        print("parity: TensorFlow runs with oneDNN on; set TF_ENABLE_ONEDNN_OPTS=0", file=out)
        return 2
    print(
        f"parity: torch_tfgrads vs TensorFlow {tf.__version__} (Eigen CPU kernels), "
        f"{n_cases} random cases per family, seed {seed}",
        file=out,
    )
    rows = []
    for name, mod in FAMILIES.items():
        if families and name not in families:
            continue
        print(f"  {name}: running ...", file=out, flush=True)
        rows += importlib.import_module(mod).run(
            tf, n_cases, seed, lambda m: print(f"    {m}", file=out, flush=True)
        )
    print(file=out)
    header = f"{'op':<58} {'cases':>5} {'worst rel err':>13} {'tol':>7}  status"
    print(header, file=out)
    print("-" * len(header), file=out)
    for r in rows:
        status = "ok" if r.ok else "FAIL"
        print(
            f"{r.op:<58} {r.cases:>5} {r.worst_rel_err:>13.2e} {r.tolerance:>7.0e}  {status}",
            file=out,
        )
    failed = [r.op for r in rows if not r.ok]
    print(f"\nparity: {len(rows) - len(failed)} passed, {len(failed)} failed", file=out)
    return 1 if failed else 0
