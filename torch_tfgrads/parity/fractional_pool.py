"""FractionalPool family in the parity command: sequences, outputs and both gradients against
TF 2.21's kernels (bit-exact expected: tolerance 0)."""

import torch

import torch_tfgrads as T

from . import Row
from .fractional_pool_cases import random_cases
from .fractional_pool_tf import (
    tf_fractional_avg_pool_grad,
    tf_fractional_max_pool_grad,
    tf_fractional_pool,
)

OPS = [
    "fractional_avg_pool",
    "fractional_avg_pool_grad",
    "fractional_max_pool",
    "fractional_max_pool_grad",
    "fractional_pooling_sequence",
    "_fractional_avg_pool_grad_backward",
    "_fractional_max_pool_grad_backward",
]


def _err(a, b):
    """0 when bit-identical; else the normwise relative error (inf for different shapes)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return float("inf")
    if torch.equal(a, b):
        return 0.0
    a, b = a.double(), b.double()
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def check_case(case, dy_seed=0):
    """Runs one case through us and TF: {op: error}."""
    fwd = T.fractional_avg_pool if case.kind == "avg" else T.fractional_max_pool
    out, rows, cols = fwd(*case.pool_args())
    t_out, t_rows, t_cols = tf_fractional_pool(
        case.kind, case.x, case.ratio, case.pseudo_random, case.overlapping, case.seed, case.seed2
    )
    errs = {
        "fractional_pooling sequences": 0.0
        if (torch.equal(rows, t_rows) and torch.equal(cols, t_cols))
        else float("inf"),
        f"fractional_{case.kind}_pool": _err(out, t_out),
    }
    g = torch.Generator().manual_seed(dy_seed)
    dy = (torch.randn(out.shape, generator=g, dtype=torch.float64) * 40).to(case.x.dtype)
    if case.kind == "avg":
        ours = T.fractional_avg_pool_grad(case.x.shape, dy, rows, cols, case.overlapping)
        theirs = tf_fractional_avg_pool_grad(case.x.shape, dy, rows, cols, case.overlapping)
    else:
        ours = T.fractional_max_pool_grad(case.x, out, dy, rows, cols, case.overlapping)
        theirs = tf_fractional_max_pool_grad(case.x, out, dy, rows, cols, case.overlapping)
    errs[f"fractional_{case.kind}_pool_grad"] = _err(ours, theirs)
    return errs


def run(tf, n_cases, seed, log):
    worst, counts = {}, {}
    n = max(4 * n_cases, 8)  # cheap cases: several per requested case
    for case in random_cases(n, seed=seed):
        for op, err in check_case(case, seed).items():
            key = op if op.endswith("sequences") else f"{op} [{str(case.x.dtype)[6:]}]"
            worst[key] = max(worst.get(key, 0.0), err)
            counts[key] = counts.get(key, 0) + 1
    log(f"{n} cases (random shapes, ratios, modes, seeds; TF's dtypes)")
    return [Row(k, counts[k], worst[k], 0.0) for k in sorted(worst)]
