"""Autograd formulas (torch.library.register_autograd) for every differentiable op.

Each backward calls our own backward ops (so it is traceable by torch.compile), and the
backward ops have formulas of their own, giving TF's second-order gradients.
"""
import torch

from ._batch_norm_grad_grad import batch_norm_grad_grad
from ._meta import bn_channels_first


# ---- FusedBatchNorm family ------------------------------------------------------------------
# TF's `_FusedBatchNormV3Grad` (nn_grad.py): gradients for x, scale, offset from dL/dy only;
# none for mean/variance, none through the statistics outputs (they are marked
# non-differentiable). Training passes the forward's reserve spaces, inference the input
# population statistics.
def _fbn_setup_context(ctx, inputs, output):
    x, scale, _offset, mean, variance, epsilon, _factor, data_format, is_training = inputs
    _y, batch_mean, batch_variance, rs1, rs2, rs3 = output
    ctx.mark_non_differentiable(batch_mean, batch_variance, rs1, rs2, rs3)
    saved_mean, saved_var = (rs1, rs2) if is_training else (mean, variance)
    ctx.save_for_backward(x, scale, saved_mean, saved_var, rs3)
    ctx.epsilon, ctx.data_format, ctx.is_training = epsilon, data_format, is_training


def _fbn_backward(ctx, dy, *_unused):
    x, scale, saved_mean, saved_var, rs3 = ctx.saved_tensors
    if dy is None:
        dy = torch.zeros_like(x)
    dx, dscale, doffset, _, _ = torch.ops.tfgrads.fused_batch_norm_grad_v3(
        dy, x, scale, saved_mean, saved_var, rs3, ctx.epsilon, ctx.data_format, ctx.is_training)
    return dx, dscale, doffset, None, None, None, None, None, None


torch.library.register_autograd("tfgrads::fused_batch_norm_v3", _fbn_backward,
                                setup_context=_fbn_setup_context)


# TF's `_FusedBatchNormGradGrad` (nn_fused_batch_norm_grad.py): gradients for y_backprop, x and
# scale; none for the reserve spaces.
def _fbn_grad_setup_context(ctx, inputs, output):
    dy, x, scale, rs1, rs2, _rs3, epsilon, data_format, is_training = inputs
    ctx.mark_non_differentiable(output[3], output[4])
    ctx.save_for_backward(dy, x, scale, rs1, rs2)
    ctx.epsilon, ctx.data_format, ctx.is_training = epsilon, data_format, is_training


def _fbn_grad_backward(ctx, g_dx, g_dscale, g_doffset, *_unused):
    dy, x, scale, rs1, rs2 = ctx.saved_tensors
    cf = bn_channels_first(ctx.data_format, "fused_batch_norm_grad_v3")
    grad_dy, grad_x, grad_scale = batch_norm_grad_grad(
        dy, x, scale, rs1, rs2, g_dx, g_dscale, g_doffset, ctx.epsilon, cf, ctx.is_training)
    return grad_dy, grad_x, grad_scale, None, None, None, None, None, None


torch.library.register_autograd("tfgrads::fused_batch_norm_grad_v3", _fbn_grad_backward,
                                setup_context=_fbn_grad_setup_context)
