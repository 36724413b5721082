"""Float64 reference of TF's FusedBatchNormV3/GradV3 formulas (docs/ops/fused_batch_norm.md)."""

import torch


def channel_dim(x, data_format):
    return 1 if data_format.startswith("NC") else x.dim() - 1


def bcast(v, x, cdim):
    shape = [1] * x.dim()
    shape[cdim] = -1
    return v.double().reshape(shape)


def fused_batch_norm_v3(x, scale, offset, mean, variance, epsilon, factor, data_format, training):
    cdim = channel_dim(x, data_format)
    red = [d for d in range(x.dim()) if d != cdim]
    xd = x.double()
    n = x.numel() // x.shape[cdim]
    if training:
        m = xd.mean(red)
        vb = ((xd - bcast(m, x, cdim)) ** 2).mean(red)
        adjust = n / max(n - 1, 1)
        if factor == 1.0:
            bm, bv = m, vb * adjust
        else:
            bm = (1 - factor) * mean.double() + factor * m
            bv = (1 - factor) * variance.double() + factor * adjust * vb
        rs1, rs2 = m, vb
    else:
        m, vb = mean.double(), variance.double()
        bm, bv, rs1, rs2 = m, vb, m, vb
    y = (xd - bcast(m, x, cdim)) / torch.sqrt(bcast(vb, x, cdim) + epsilon) * bcast(
        scale, x, cdim
    ) + bcast(offset, x, cdim)
    return y, bm, bv, rs1, rs2


def fused_batch_norm_grad_v3(dy, x, scale, rs1, rs2, epsilon, data_format, training):
    cdim = channel_dim(x, data_format)
    red = [d for d in range(x.dim()) if d != cdim]
    xd, g = x.double(), dy.double()
    n = x.numel() // x.shape[cdim]
    inv = 1.0 / torch.sqrt(bcast(rs2, x, cdim) + epsilon)
    xc = xd - bcast(rs1, x, cdim)
    doffset = g.sum(red)
    dscale = (g * xc * inv).sum(red)
    if training:
        dx = (
            bcast(scale, x, cdim)
            * inv
            * (
                g
                - g.sum(red, keepdim=True) / n
                - xc * inv * inv * (g * xc).sum(red, keepdim=True) / n
            )
        )
    else:
        dx = g * inv * bcast(scale, x, cdim)
    return dx, dscale, doffset
