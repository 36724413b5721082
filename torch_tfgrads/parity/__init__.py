"""`python -m torch_tfgrads parity`: every registered op against TensorFlow 2.21 (Eigen path) or
its family's reference, printing a table of cases, worst relative error and speed vs TF.

A family adds itself to FAMILIES with a module exposing OPS (op names) and
`run(tf, n_cases, seed, log)` -> list of Row.
"""
import importlib
import statistics
import sys
import time
from dataclasses import dataclass

FAMILIES = {"FusedBatchNorm": "torch_tfgrads.parity.fused_batch_norm",
            "FractionalPool": "torch_tfgrads.parity.fractional_pool",
            "DepthwiseConv2dNative": "torch_tfgrads.parity.depthwise_conv2d",
            "CudnnRNN": "torch_tfgrads.parity.cudnn_rnn"}


@dataclass
class Row:
    op: str
    cases: int
    worst_rel_err: float
    tolerance: float
    ours_us: float = float("nan")
    tf_us: float = float("nan")

    @property
    def ok(self):
        return self.worst_rel_err <= self.tolerance


def median_time_us(fn, repeats=7, warmup=3):
    time.sleep(0.2)  # let the other library's worker threads stop spinning (2-core machines)
    for _ in range(warmup):  # thread pool start-up, first-touch page faults
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def registered_ops():
    ops = []
    for mod in FAMILIES.values():
        ops += importlib.import_module(mod).OPS
    return ops


def run_parity(n_cases=24, seed=0, families=None, out=sys.stdout):
    from ._tf import import_tf, onednn_enabled

    tf = import_tf(eigen=True)
    if onednn_enabled():  # TF was imported before us with oneDNN on: not the reference path
        print("parity: TensorFlow runs with oneDNN on; set TF_ENABLE_ONEDNN_OPTS=0", file=out)
        return 2
    print(f"parity: torch_tfgrads vs TensorFlow {tf.__version__} (Eigen CPU kernels), "
          f"{n_cases} random cases per family, seed {seed}", file=out)
    rows = []
    for name, mod in FAMILIES.items():
        if families and name not in families:
            continue
        print(f"  {name}: running ...", file=out, flush=True)
        rows += importlib.import_module(mod).run(tf, n_cases, seed,
                                                 lambda m: print(f"    {m}", file=out, flush=True))
    print(file=out)
    header = f"{'op':<58} {'cases':>5} {'worst rel err':>13} {'tol':>7} {'ours us':>9} " \
             f"{'TF us':>9} {'TF/ours':>7}  status"
    print(header, file=out)
    print("-" * len(header), file=out)
    for r in rows:
        speed = r.tf_us / r.ours_us if r.ours_us == r.ours_us and r.tf_us == r.tf_us else float("nan")
        timing = (f"{r.ours_us:>9.1f} {r.tf_us:>9.1f} {speed:>6.2f}x" if speed == speed
                  else f"{'-':>9} {'-':>9} {'-':>7}")
        print(f"{r.op:<58} {r.cases:>5} {r.worst_rel_err:>13.2e} {r.tolerance:>7.0e} {timing}  "
              f"{'ok' if r.ok else 'FAIL'}", file=out)
    failed = [r.op for r in rows if not r.ok]
    print(f"\nparity: {len(rows) - len(failed)} passed, {len(failed)} failed", file=out)
    return 1 if failed else 0
