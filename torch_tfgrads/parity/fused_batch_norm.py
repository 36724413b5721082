"""FusedBatchNorm family in the parity command."""

import torch

import torch_tfgrads as T

from . import Row
from .fused_batch_norm_cases import random_cases
from .fused_batch_norm_tf import (
    tf_fused_batch_norm_grad_grad,
    tf_fused_batch_norm_grad_v3,
    tf_fused_batch_norm_v3,
)

OPS = ["fused_batch_norm_v3", "fused_batch_norm_grad_v3"]
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def _rel(a, b):
    a, b = a.double(), b.double()
    return 0.0 if b.numel() == 0 else ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


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
    log(
        f"{sum(counts['fwd'].values())} forward, {sum(counts['bwd'].values())} grad, "
        f"{sum(counts['gg'].values())} second-order cases"
    )
    rows = []
    names = {
        "fwd": "fused_batch_norm_v3",
        "bwd": "fused_batch_norm_grad_v3",
        "gg": "fused_batch_norm_grad_v3 (2nd order)",
    }
    for kind in ("fwd", "bwd", "gg"):
        for dt, err in sorted(worst[kind].items(), key=lambda kv: str(kv[0])):
            rows.append(Row(f"{names[kind]} [{str(dt)[6:]}]", counts[kind][dt], err, TOL[dt]))
    return rows
