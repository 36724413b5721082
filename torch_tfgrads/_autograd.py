"""Autograd formulas (torch.library.register_autograd) for every differentiable op.

Each backward calls our own backward ops (so it is traceable by torch.compile), and the
backward ops have formulas of their own, giving TF's second-order gradients.
"""
import torch

from ._batch_norm_grad_grad import batch_norm_grad_grad
from . import _rnn_reference as rnn_reference
from ._meta import bn_channels_first, rnn_check_forward


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


# ---- FractionalPool family ------------------------------------------------------------------
# TF's `_FractionalAvgPoolGrad` / `_FractionalMaxPoolGrad` (nn_grad.py): gradient for value
# only, through our grad ops, with the sequences the forward returned (marked
# non-differentiable). The grad ops are linear in out_backprop; their backward is the adjoint
# (pooling over the same cells / reading at the same argmax), which is again linear with the
# grad op as its adjoint, so every order of derivative is available.
def _fap_setup_context(ctx, inputs, output):
    value, _ratio, _pseudo, overlapping, *_ = inputs
    _out, rows, cols = output
    ctx.mark_non_differentiable(rows, cols)
    ctx.save_for_backward(rows, cols)
    ctx.shape, ctx.overlapping = list(value.shape), overlapping


def _fap_backward(ctx, dy, *_unused):
    rows, cols = ctx.saved_tensors
    dx = torch.ops.tfgrads.fractional_avg_pool_grad(ctx.shape, dy, rows, cols, ctx.overlapping)
    return dx, None, None, None, None, None, None


torch.library.register_autograd("tfgrads::fractional_avg_pool", _fap_backward,
                                setup_context=_fap_setup_context)


def _fap_grad_setup_context(ctx, inputs, output):
    _shape, dy, rows, cols, overlapping = inputs
    ctx.save_for_backward(rows, cols)
    ctx.overlapping, ctx.dy_shape = overlapping, dy.shape


def _fap_grad_backward(ctx, g):
    rows, cols = ctx.saved_tensors
    g_dy = torch.ops.tfgrads._fractional_avg_pool_grad_backward(g, rows, cols, ctx.overlapping)
    n, oh, ow, c = ctx.dy_shape  # out_backprop may have had fewer images/channels (TF allows it)
    return None, g_dy[:n, :oh, :ow, :c], None, None, None


torch.library.register_autograd("tfgrads::fractional_avg_pool_grad", _fap_grad_backward,
                                setup_context=_fap_grad_setup_context)


def _fap_grad_bwd_setup_context(ctx, inputs, output):
    g, rows, cols, overlapping = inputs
    ctx.save_for_backward(rows, cols)
    ctx.shape, ctx.overlapping = list(g.shape), overlapping


def _fap_grad_bwd_backward(ctx, gg):
    rows, cols = ctx.saved_tensors
    return (torch.ops.tfgrads.fractional_avg_pool_grad(ctx.shape, gg, rows, cols,
                                                        ctx.overlapping), None, None, None)


torch.library.register_autograd("tfgrads::_fractional_avg_pool_grad_backward",
                                _fap_grad_bwd_backward, setup_context=_fap_grad_bwd_setup_context)


def _fmp_setup_context(ctx, inputs, output):
    value, _ratio, _pseudo, overlapping, *_ = inputs
    out, rows, cols = output
    ctx.mark_non_differentiable(rows, cols)
    ctx.save_for_backward(value, out, rows, cols)
    ctx.overlapping = overlapping


def _fmp_backward(ctx, dy, *_unused):
    value, out, rows, cols = ctx.saved_tensors
    dx = torch.ops.tfgrads.fractional_max_pool_grad(value, out, dy, rows, cols, ctx.overlapping)
    return dx, None, None, None, None, None, None


torch.library.register_autograd("tfgrads::fractional_max_pool", _fmp_backward,
                                setup_context=_fmp_setup_context)


# Gradient w.r.t. out_backprop only (TF gives none for orig_input/orig_output: the argmax is
# piecewise constant in them).
def _fmp_grad_setup_context(ctx, inputs, output):
    x, y, _dy, rows, cols, overlapping = inputs
    ctx.save_for_backward(x, y, rows, cols)
    ctx.overlapping = overlapping


def _fmp_grad_backward(ctx, g):
    x, y, rows, cols = ctx.saved_tensors
    g_dy = torch.ops.tfgrads._fractional_max_pool_grad_backward(x, y, g, rows, cols,
                                                                 ctx.overlapping)
    return None, None, g_dy, None, None, None


torch.library.register_autograd("tfgrads::fractional_max_pool_grad", _fmp_grad_backward,
                                setup_context=_fmp_grad_setup_context)


def _fmp_grad_bwd_setup_context(ctx, inputs, output):
    x, y, _g, rows, cols, overlapping = inputs
    ctx.save_for_backward(x, y, rows, cols)
    ctx.overlapping = overlapping


def _fmp_grad_bwd_backward(ctx, gg):
    x, y, rows, cols = ctx.saved_tensors
    return (None, None, torch.ops.tfgrads.fractional_max_pool_grad(x, y, gg, rows, cols,
                                                                    ctx.overlapping),
            None, None, None)


torch.library.register_autograd("tfgrads::_fractional_max_pool_grad_backward",
                                _fmp_grad_bwd_backward, setup_context=_fmp_grad_bwd_setup_context)


# ---- DepthwiseConv2dNative family --------------------------------------------------------------
# TF's `_DepthwiseConv2dNativeGrad` (nn_grad.py), attrs (dilations included) passed through:
# dL/dinput = BackpropInput(shape(input), filter, dy), dL/dfilter = BackpropFilter(input,
# shape(filter), dy). The two backprops are bilinear in (filter, dy) / (input, dy); each one's
# gradients are the other two ops, so every order of derivative is available.
def _dw_setup_context(ctx, inputs, output):
    x, f = inputs[0], inputs[1]
    ctx.save_for_backward(x, f)
    ctx.attrs = tuple(inputs[2:])


def _dw_backward(ctx, dy):
    x, f = ctx.saved_tensors
    dx = df = None
    if ctx.needs_input_grad[0]:
        dx = torch.ops.tfgrads.depthwise_conv2d_native_backprop_input(list(x.shape), f, dy,
                                                                      *ctx.attrs)
    if ctx.needs_input_grad[1]:
        df = torch.ops.tfgrads.depthwise_conv2d_native_backprop_filter(x, list(f.shape), dy,
                                                                       *ctx.attrs)
    return dx, df, None, None, None, None, None


torch.library.register_autograd("tfgrads::depthwise_conv2d_native", _dw_backward,
                                setup_context=_dw_setup_context)


def _dw_bi_setup_context(ctx, inputs, output):
    sizes, f, dy = inputs[0], inputs[1], inputs[2]
    ctx.save_for_backward(f, dy)
    ctx.attrs = tuple(inputs[3:])


def _dw_bi_backward(ctx, g):
    # dx = BackpropInput(f, dy): <g, dx> is the forward of g with f, read against dy.
    f, dy = ctx.saved_tensors
    g_f = g_dy = None
    if ctx.needs_input_grad[1]:
        g_f = torch.ops.tfgrads.depthwise_conv2d_native_backprop_filter(g, list(f.shape), dy,
                                                                        *ctx.attrs)
    if ctx.needs_input_grad[2]:
        g_dy = torch.ops.tfgrads.depthwise_conv2d_native(g, f, *ctx.attrs)
    return None, g_f, g_dy, None, None, None, None, None


torch.library.register_autograd("tfgrads::depthwise_conv2d_native_backprop_input",
                                _dw_bi_backward, setup_context=_dw_bi_setup_context)


def _dw_bf_setup_context(ctx, inputs, output):
    x, _sizes, dy = inputs[0], inputs[1], inputs[2]
    ctx.save_for_backward(x, dy)
    ctx.attrs = tuple(inputs[3:])


def _dw_bf_backward(ctx, g):
    # df = BackpropFilter(x, dy): d/dx is BackpropInput with g as the filter, d/ddy the forward
    # of x with g as the filter.
    x, dy = ctx.saved_tensors
    g_x = g_dy = None
    if ctx.needs_input_grad[0]:
        g_x = torch.ops.tfgrads.depthwise_conv2d_native_backprop_input(list(x.shape), g, dy,
                                                                       *ctx.attrs)
    if ctx.needs_input_grad[2]:
        g_dy = torch.ops.tfgrads.depthwise_conv2d_native(x, g, *ctx.attrs)
    return g_x, None, g_dy, None, None, None, None, None


torch.library.register_autograd("tfgrads::depthwise_conv2d_native_backprop_filter",
                                _dw_bf_backward, setup_context=_dw_bf_setup_context)


# ---- CudnnRNN family ----------------------------------------------------------------------------
# TF's `_cudnn_rnn_backwardv3` (cudnn_rnn_grad.py): gradients for input, input_h, input_c and
# params through CudnnRNNBackpropV3 with the forward's outputs and reserve space; none for
# sequence_lengths; a ValueError when the forward ran with is_training=False. TF registers no
# gradient for the backprop op, and neither do we.
def _rnn_setup_context(ctx, inputs, output):
    x, h, c, params, lengths, *attrs = inputs
    out, out_h, out_c, reserve, host_reserved = output
    ctx.mark_non_differentiable(reserve, host_reserved)
    # Unused output gradients arrive as None, not as zeros: autograd would otherwise fill a
    # zero tensor the size of the reserve space (megabytes) on every backward.
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(x, h, c, params, lengths, out, out_h, out_c, reserve, host_reserved)
    # attrs: rnn_mode, input_mode, direction, dropout, seed, seed2, num_proj, is_training,
    # time_major
    ctx.attrs = attrs


def _rnn_backward(ctx, d_out, d_h, d_c, *_unused):
    x, h, c, params, lengths, out, out_h, out_c, reserve, host_reserved = ctx.saved_tensors
    (rnn_mode, input_mode, direction, dropout, seed, seed2, num_proj, is_training,
     time_major) = ctx.attrs
    if not is_training:
        raise ValueError("To use CudnnRNNV3 in gradients, is_training must be set to True.")
    d_out = torch.zeros_like(out) if d_out is None else d_out
    d_h = torch.zeros_like(out_h) if d_h is None else d_h
    d_c = torch.zeros_like(out_c) if d_c is None else d_c
    dx, dh, dc, dp = torch.ops.tfgrads.cudnn_rnn_backprop_v3(
        x, h, c, params, lengths, out, out_h, out_c, d_out, d_h, d_c, reserve, host_reserved,
        rnn_mode, input_mode, direction, dropout, seed, seed2, num_proj, time_major)
    if rnn_mode != "lstm":
        dc = None  # input_c is ignored outside LSTM
    return (dx, dh, dc, dp) + (None,) * 11


torch.library.register_autograd("tfgrads::cudnn_rnn_v3", _rnn_backward,
                                setup_context=_rnn_setup_context)


def _as_many_as_inputs(ctx, grads):
    # Ops with Tensor[] inputs or outputs must return exactly one gradient per input the
    # dispatcher passed, and it drops trailing arguments equal to their defaults;
    # needs_input_grad has that structure.
    return grads[:len(ctx.needs_input_grad)]


# The params conversions are linear and each is the other's adjoint (they only move elements).
def _c2p_setup_context(ctx, inputs, output):
    num_layers, num_units, input_size, weights, biases, *attrs = inputs
    ctx.sizes = (num_layers, num_units, input_size)
    ctx.counts = (len(weights), len(biases))
    ctx.attrs = attrs


def _c2p_backward(ctx, g):
    gw, gb = torch.ops.tfgrads.cudnn_rnn_params_to_canonical_v2(
        *ctx.sizes, g, *ctx.counts, *ctx.attrs)
    grads = (None, None, None, list(gw), list(gb), None, None, None, None)
    return _as_many_as_inputs(ctx, grads)


torch.library.register_autograd("tfgrads::cudnn_rnn_canonical_to_params_v2", _c2p_backward,
                                setup_context=_c2p_setup_context)


def _p2c_setup_context(ctx, inputs, output):
    num_layers, num_units, input_size, params, _nw, _nb, *attrs = inputs
    ctx.sizes = (num_layers, num_units, input_size)
    ctx.attrs = attrs
    ctx.shapes = ([w.shape for w in output[0]], [b.shape for b in output[1]])
    ctx.dtype, ctx.device = params.dtype, params.device


def _p2c_backward(ctx, gw, gb):
    def filled(grads, shapes):
        return [torch.zeros(s, dtype=ctx.dtype, device=ctx.device) if g is None else g
                for g, s in zip(grads, shapes)]
    gw, gb = filled(gw, ctx.shapes[0]), filled(gb, ctx.shapes[1])
    gp = torch.ops.tfgrads.cudnn_rnn_canonical_to_params_v2(*ctx.sizes, gw, gb, *ctx.attrs)
    return _as_many_as_inputs(ctx, (None, None, None, gp) + (None,) * 6)


torch.library.register_autograd("tfgrads::cudnn_rnn_params_to_canonical_v2", _p2c_backward,
                                setup_context=_p2c_setup_context)


# Second order: TF defines no gradient for CudnnRNNBackpropV3; ours differentiates the torch-op
# composite of the forward (_rnn_reference.py) twice, with the forward's dropout masks. The
# backprop op is linear in the three output gradients and depends on input, input_h, input_c
# and params through the recurrence; output/output_h/output_c only fix shapes.
def _rnn_bwd_setup_context(ctx, inputs, output):
    (x, h, c, p, lengths, _out, _oh, _oc, dy, dh, dc, reserve, _host, rnn_mode, input_mode,
     direction, dropout, _seed, _seed2, num_proj, time_major) = inputs
    ctx.save_for_backward(x, h, c, p, lengths, dy, dh, dc, reserve)
    ctx.attrs = (rnn_mode, input_mode, direction, dropout, num_proj, time_major)


def _rnn_bwd_backward(ctx, g_dx, g_dh, g_dc, g_dp):
    x, h, c, p, lengths, dy, dh, dc, reserve = ctx.saved_tensors
    rnn_mode, input_mode, direction, dropout, num_proj, time_major = ctx.attrs
    cfg, T, B = rnn_check_forward("cudnn_rnn_backprop_v3", x, h, c, p, lengths, rnn_mode,
                                  input_mode, direction, num_proj, time_major)
    dtype = x.dtype
    acc = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    lstm = rnn_mode == "lstm"
    with torch.enable_grad():
        leaves = [t.detach().to(acc).requires_grad_() for t in (x, h, c, p, dy, dh, dc)]
        lx, lh, lc, lp, ldy, ldh, ldc = leaves
        masks = (rnn_reference.dropout_masks(cfg, reserve.detach(), T, B, acc)
                 if dropout > 0 else [])
        out, hn, cn = rnn_reference.forward(cfg, lx, lh, lc, lp, lengths, time_major, masks)
        outs, cots, wrt = [out, hn], [ldy, ldh], [lx, lh, lp]
        if lstm:
            outs.append(cn)
            cots.append(ldc)
            wrt.append(lc)
        first = torch.autograd.grad(outs, wrt, cots, create_graph=True)
        gs = [g_dx, g_dh, g_dp] + ([g_dc] if lstm else [])
        total = sum((f * g.to(acc)).sum() for f, g in zip(first, gs) if g is not None)
        second = torch.autograd.grad(total, leaves, allow_unused=True) if torch.is_tensor(
            total) and total.requires_grad else [None] * 7

    def cast(g, like):
        return None if g is None else g.to(like.dtype)
    sx, sh, sc, sp, sdy, sdh, sdc = (cast(g, t) for g, t in zip(second, (x, h, c, p, dy, dh, dc)))
    if not lstm:
        sc = sdc = None
    grads = (sx, sh, sc, sp, None, None, None, None, sdy, sdh, sdc) + (None,) * 10
    return grads[:len(ctx.needs_input_grad)]


torch.library.register_autograd("tfgrads::cudnn_rnn_backprop_v3", _rnn_bwd_backward,
                                setup_context=_rnn_bwd_setup_context)
