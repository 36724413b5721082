"""Second-order gradient of batch norm: the backward of fused_batch_norm_grad_v3.

TF registers `_FusedBatchNormGradGrad` for FusedBatchNormGradV3: it differentiates a composite
re-implementation of the batch-norm gradient that *recomputes* the batch mean and biased
variance from x in training (ignoring reserve_space_1/2) and uses the population statistics in
inference, with half/bfloat16 computed in float32. We implement the closed form of the same
derivative (the formulas of PyTorch's `batchnorm_double_backward`) in torch ops, so it is
traceable by torch.compile and itself differentiable.
"""

import torch


def batch_norm_grad_grad(
    dy, x, scale, pop_mean, pop_var, g_dx, g_dscale, g_doffset, epsilon, channels_first, is_training
):
    """Returns (grad_y_backprop, grad_x, grad_scale) for upstream grads of (dx, dscale, doffset)."""
    acc = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
    cdim = 1 if channels_first else x.dim() - 1
    red = [d for d in range(x.dim()) if d != cdim]
    bshape = [1] * x.dim()
    bshape[cdim] = -1

    def bc(v):
        return v.to(acc).reshape(bshape)

    def csum(t):
        return t.sum(red, keepdim=True)

    xf, gO = x.to(acc), dy.to(acc)
    gamma = bc(scale)
    M = x.numel() // x.shape[cdim] if x.shape[cdim] else 0
    if is_training:
        mu = xf.mean(red, keepdim=True)
        xmu = xf - mu
        var = (xmu * xmu).mean(red, keepdim=True)
    else:
        xmu = xf - bc(pop_mean)
        var = bc(pop_var)
    istd = torch.rsqrt(var + epsilon)

    ggI = g_dx.to(acc) if g_dx is not None else None
    ggG = bc(g_dscale) if g_dscale is not None else None
    ggB = bc(g_doffset) if g_doffset is not None else None

    gI = None
    gG = None
    ggO = None
    if is_training:
        s2, s3 = istd * istd, istd * istd * istd
        gO_sum, gOxmu_sum = csum(gO), csum(gO * xmu)
        if ggI is not None:
            ggI_sum, ggIxmu_sum = csum(ggI), csum(ggI * xmu)
            all_sub = (
                ggI_sum * gO_sum / M - csum(gO * ggI) + (3.0 / M) * s2 * gOxmu_sum * ggIxmu_sum
            )
            gI = gamma * (
                xmu * s3 * all_sub / M
                + ggIxmu_sum * s3 / M * (gO_sum / M - gO)
                + gOxmu_sum * s3 / M * (ggI_sum / M - ggI)
            )
            gG = csum(ggI * (istd / M) * (M * gO - gO_sum - xmu * s2 * gOxmu_sum))
            ggO = gamma * istd / M * (M * ggI - ggI_sum - xmu * s2 * ggIxmu_sum)
        if ggG is not None:
            term = ggG * (gO * istd - istd * gO_sum / M - xmu * s3 * gOxmu_sum / M)
            gI = term if gI is None else gI + term
    else:
        if ggI is not None:
            gG = csum(ggI * gO * istd)
            ggO = ggI * istd * gamma
        if ggG is not None:
            term = ggG * istd * gO
            gI = term
    if ggG is not None:
        term = ggG * xmu * istd
        ggO = term if ggO is None else ggO + term
    if ggB is not None:
        term = ggB.expand_as(xf)
        ggO = term if ggO is None else ggO + term

    grad_dy = torch.zeros_like(dy) if ggO is None else ggO.to(dy.dtype)
    grad_x = torch.zeros_like(x) if gI is None else gI.to(x.dtype)
    grad_scale = torch.zeros_like(scale) if gG is None else gG.reshape(-1).to(scale.dtype)
    return grad_dy, grad_x, grad_scale
