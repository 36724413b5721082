"""FractionalPool family in the parity command: sequences, outputs and both gradients against
TF 2.21's kernels (bit-exact expected: tolerance 0)."""
import torch

import torch_tfgrads as T

from . import Row, median_time_us
from ._tf import to_tf
from .fractional_pool_cases import random_cases
from .fractional_pool_tf import (tf_fractional_avg_pool_grad, tf_fractional_max_pool_grad,
                                 tf_fractional_pool)

OPS = ["fractional_avg_pool", "fractional_avg_pool_grad", "fractional_max_pool",
       "fractional_max_pool_grad", "fractional_pooling_sequence",
       "_fractional_avg_pool_grad_backward", "_fractional_max_pool_grad_backward"]


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
    t_out, t_rows, t_cols = tf_fractional_pool(case.kind, case.x, case.ratio, case.pseudo_random,
                                               case.overlapping, case.seed, case.seed2)
    errs = {"fractional_pooling sequences": 0.0 if (torch.equal(rows, t_rows) and
                                                    torch.equal(cols, t_cols)) else float("inf"),
            f"fractional_{case.kind}_pool": _err(out, t_out)}
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


def _timings(tf):
    """Forward and grad on NHWC 8x56x56x32 float32, ratio 1.44, seeds fixed."""
    x = torch.randn(8, 56, 56, 32)
    ratio = [1.0, 1.44, 1.44, 1.0]
    tx = to_tf(x)
    rows_out = {}
    for kind, fwd, tfop in (("avg", T.fractional_avg_pool, tf.raw_ops.FractionalAvgPool),
                            ("max", T.fractional_max_pool, tf.raw_ops.FractionalMaxPool)):
        out, rows, cols = fwd(x, ratio, False, False, True, 1, 2)
        dy = torch.randn(out.shape)
        t_f = (median_time_us(lambda: fwd(x, ratio, False, False, True, 1, 2)),
               median_time_us(lambda: tfop(value=tx, pooling_ratio=ratio, deterministic=True,
                                           seed=1, seed2=2)[0].numpy()))
        tdy, tr, tc = to_tf(dy), to_tf(rows), to_tf(cols)
        if kind == "avg":
            t_g = (median_time_us(lambda: T.fractional_avg_pool_grad(x.shape, dy, rows, cols)),
                   median_time_us(lambda: tf.raw_ops.FractionalAvgPoolGrad(
                       orig_input_tensor_shape=list(x.shape), out_backprop=tdy,
                       row_pooling_sequence=tr, col_pooling_sequence=tc).numpy()))
        else:
            ty = to_tf(out)
            t_g = (median_time_us(lambda: T.fractional_max_pool_grad(x, out, dy, rows, cols)),
                   median_time_us(lambda: tf.raw_ops.FractionalMaxPoolGrad(
                       orig_input=tx, orig_output=ty, out_backprop=tdy, row_pooling_sequence=tr,
                       col_pooling_sequence=tc).numpy()))
        rows_out[f"fractional_{kind}_pool"] = t_f
        rows_out[f"fractional_{kind}_pool_grad"] = t_g
    return rows_out


def run(tf, n_cases, seed, log):
    worst, counts = {}, {}
    n = max(4 * n_cases, 8)  # cheap cases: several per requested case
    for case in random_cases(n, seed=seed):
        for op, err in check_case(case, seed).items():
            key = op if op.endswith("sequences") else f"{op} [{str(case.x.dtype)[6:]}]"
            worst[key] = max(worst.get(key, 0.0), err)
            counts[key] = counts.get(key, 0) + 1
    log(f"{n} cases (random shapes, ratios, modes, seeds; TF's dtypes); timing NHWC 8x56x56x32 "
        f"float32, ratio 1.44")
    times = _timings(tf)
    nan = (float("nan"), float("nan"))
    return [Row(k, counts[k], worst[k], 0.0,
                *(times.get(k.split(" [")[0], nan) if k.endswith("[float32]") else nan))
            for k in sorted(worst)]
