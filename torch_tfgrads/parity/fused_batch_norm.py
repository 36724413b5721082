"""FusedBatchNorm family in the parity command."""
import torch

import torch_tfgrads as T

from . import Row, median_time_us
from .fused_batch_norm_cases import random_cases
from .fused_batch_norm_tf import (tf_fused_batch_norm_grad_grad, tf_fused_batch_norm_grad_v3,
                                  tf_fused_batch_norm_v3)
from ._tf import to_tf

OPS = ["fused_batch_norm_v3", "fused_batch_norm_grad_v3"]
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def _rel(a, b):
    a, b = a.double(), b.double()
    return 0.0 if b.numel() == 0 else ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def _timings(tf):
    """Our op vs TF's raw op on one NHWC 8x28x28x64 float32 training batch."""
    x = torch.randn(8, 28, 28, 64)
    s, o, e = torch.rand(64) + 0.5, torch.randn(64), torch.empty(0)
    out = T.fused_batch_norm_v3(x, s, o)
    dy = torch.randn_like(x)
    tx, ts, to, te, tdy = to_tf(x), to_tf(s), to_tf(o), to_tf(e), to_tf(dy)
    tr1, tr2, tr3 = to_tf(out[3]), to_tf(out[4]), to_tf(out[5])
    fwd = (median_time_us(lambda: T.fused_batch_norm_v3(x, s, o)),
           median_time_us(lambda: tf.raw_ops.FusedBatchNormV3(
               x=tx, scale=ts, offset=to, mean=te, variance=te)[0].numpy()))
    bwd = (median_time_us(lambda: T.fused_batch_norm_grad_v3(dy, x, s, out[3], out[4], out[5])),
           median_time_us(lambda: tf.raw_ops.FusedBatchNormGradV3(
               y_backprop=tdy, x=tx, scale=ts, reserve_space_1=tr1, reserve_space_2=tr2,
               reserve_space_3=tr3)[0].numpy()))
    return fwd, bwd


def run(tf, n_cases, seed, log):
    worst = {"fwd": {}, "bwd": {}, "gg": {}}
    counts = {"fwd": {}, "bwd": {}, "gg": {}}

    def note(kind, dtype, err):
        worst[kind][dtype] = max(worst[kind].get(dtype, 0.0), err)
        counts[kind][dtype] = counts[kind].get(dtype, 0) + 1

    for case in random_cases(n_cases, seed=seed):
        dt = case.x.dtype
        ours = T.fused_batch_norm_v3(*case.forward_args())
        theirs = tf_fused_batch_norm_v3(*case.forward_args())
        n_def = 5 if case.training else 3
        note("fwd", dt, max(_rel(a, b) for a, b in zip(ours[:n_def], theirs[:n_def])))
        gargs = case.grad_args(ours)
        g = T.fused_batch_norm_grad_v3(*gargs)
        tg = case.from_tf_grad_layout(tf_fused_batch_norm_grad_v3(*case.tf_grad_args(ours)))
        note("bwd", dt, max(_rel(a, b) for a, b in zip(g[:3], tg[:3])))
        if dt == torch.float32 and not (case.channels_first and not case.training):
            dy, x, sc = (a.clone().requires_grad_() for a in gargs[:3])
            outs = T.fused_batch_norm_grad_v3(dy, x, sc, *gargs[3:])
            up = case.second_order_upstream()
            gg = torch.autograd.grad(outs[:3], [dy, x, sc], up)
            tgg = tf_fused_batch_norm_grad_grad(*gargs[:6], *up, *gargs[6:])
            note("gg", dt, max(_rel(a, b) for a, b in zip(gg, tgg)))
    log(f"{sum(counts['fwd'].values())} forward, {sum(counts['bwd'].values())} grad, "
        f"{sum(counts['gg'].values())} second-order cases; timing NHWC 8x28x28x64 float32")
    fwd_t, bwd_t = _timings(tf)
    rows = []
    names = {"fwd": "fused_batch_norm_v3", "bwd": "fused_batch_norm_grad_v3",
             "gg": "fused_batch_norm_grad_v3 (2nd order)"}
    for kind in ("fwd", "bwd", "gg"):
        for dt, err in sorted(worst[kind].items(), key=lambda kv: str(kv[0])):
            nan = (float("nan"), float("nan"))
            times = {"fwd": fwd_t, "bwd": bwd_t}.get(kind, nan) if dt == torch.float32 else nan
            rows.append(Row(f"{names[kind]} [{str(dt)[6:]}]", counts[kind][dt], err, TOL[dt],
                            *times))
    return rows
