"""Fake (meta) kernels for every op, used by torch.compile, torch.export and FakeTensor.

They repeat the C++ argument checks (csrc/common/*.h), with the same messages, so that a bad
call fails the same way when traced as when run, and they report exactly the shapes, dtypes
and strides that the real kernels return. csrc/tfgrads.cpp names this module with
set_python_module: every fake must be registered here.
"""
import math
import struct

import torch

from ._layout import channel_layout_perm, empty_in_layout
from ._rnn_config import GATES, RnnConfig, reserve_numel


def as_float32(v):
    """A Python float rounded to float32, as TF stores float attrs."""
    return struct.unpack("f", struct.pack("f", v))[0]


def _tf_shape(shape):
    return "[" + ",".join(str(s) for s in shape) + "]"


# ---- FusedBatchNorm family ------------------------------------------------------------------
_BN_FWD = "fused_batch_norm_v3"
_BN_BWD = "fused_batch_norm_grad_v3"
_BN_PARAM_WHY = "float32 for float16/bfloat16/float32 x, float64 for float64 x"
_BN_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def bn_channels_first(data_format, op):
    if data_format in ("NHWC", "NDHWC"):
        return False
    if data_format in ("NCHW", "NCDHW"):
        return True
    raise ValueError(
        f"{op}: argument 'data_format': Value for attr 'data_format' of \"{data_format}\" is not "
        'in the list of allowed values: "NHWC", "NCHW", "NDHWC", "NCDHW"')


def _bn_param_dtype(x, op):
    torch._check(x.dtype in _BN_DTYPES, lambda: (
        f"{op}: argument 'x' must be float16, bfloat16, float32 or float64, got {x.dtype}"))
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _bn_rank(t, op, name):
    torch._check(t.dim() in (4, 5), lambda: (
        f"{op}: argument '{name}': input must be 4 or 5-dimensional{_tf_shape(t.shape)}"))


def _bn_vector(t, op, name, tf_name):
    torch._check(t.dim() == 1, lambda: (
        f"{op}: argument '{name}': {tf_name} must be 1-dimensional{_tf_shape(t.shape)}"))


def _bn_channels(t, C, op, name, prefix=""):
    torch._check(t.numel() == C, lambda: (
        f"{op}: argument '{name}': {prefix}{name} must have the same number of elements as the "
        f"channels of x, got {t.numel()} and {C}"))


def _bn_dtype(t, dtype, op, name):
    torch._check(t.dtype == dtype, lambda: (
        f"{op}: argument '{name}' must be a {dtype} tensor ({_BN_PARAM_WHY}), got {t.dtype}"))


@torch.library.register_fake("tfgrads::fused_batch_norm_v3")
def _fused_batch_norm_v3_fake(x, scale, offset, mean, variance, epsilon=1e-4,
                              exponential_avg_factor=1.0, data_format="NHWC", is_training=True):
    op = _BN_FWD
    cf = bn_channels_first(data_format, op)
    pdt = _bn_param_dtype(x, op)
    _bn_rank(x, op, "x")
    _bn_vector(scale, op, "scale", "scale")
    _bn_vector(offset, op, "offset", "offset")
    _bn_vector(mean, op, "mean", "estimated_mean")
    _bn_vector(variance, op, "variance", "estimated_variance")
    cdim = 1 if cf else x.dim() - 1
    C = x.shape[cdim]
    _bn_channels(scale, C, op, "scale")
    _bn_channels(offset, C, op, "offset")
    uses_running = (not is_training) or as_float32(exponential_avg_factor) != 1.0
    if uses_running:
        prefix = "When exponential_avg_factor != 1, " if is_training else "When is_training=false, "
        _bn_channels(mean, C, op, "mean", prefix)
        _bn_channels(variance, C, op, "variance", prefix)
    _bn_dtype(scale, pdt, op, "scale")
    _bn_dtype(offset, pdt, op, "offset")
    if uses_running:
        _bn_dtype(mean, pdt, op, "mean")
        _bn_dtype(variance, pdt, op, "variance")
    perm = channel_layout_perm(x, cdim, natural_channels_last=not cf)
    y = empty_in_layout(x, x.shape, perm)
    stats = [x.new_empty((C,), dtype=pdt) for _ in range(4)]
    return (y, *stats, x.new_empty((), dtype=pdt))


@torch.library.register_fake("tfgrads::fused_batch_norm_grad_v3")
def _fused_batch_norm_grad_v3_fake(y_backprop, x, scale, reserve_space_1, reserve_space_2,
                                   reserve_space_3, epsilon=1e-4, data_format="NHWC",
                                   is_training=True):
    op = _BN_BWD
    cf = bn_channels_first(data_format, op)
    pdt = _bn_param_dtype(x, op)
    torch._check(y_backprop.dtype == x.dtype, lambda: (
        f"{op}: argument 'y_backprop' must have the dtype of x ({x.dtype}), got {y_backprop.dtype}"))
    _bn_rank(y_backprop, op, "y_backprop")
    _bn_rank(x, op, "x")
    _bn_vector(scale, op, "scale", "scale")
    _bn_vector(reserve_space_1, op, "reserve_space_1", "saved mean")
    _bn_vector(reserve_space_2, op, "reserve_space_2", "saved variance")
    torch._check(x.shape == y_backprop.shape, lambda: (
        f"{op}: argument 'y_backprop': x and y_backprop must have same shape, but x has shape "
        f"{_tf_shape(x.shape)} and y_backprop has shape {_tf_shape(y_backprop.shape)}"))
    cdim = 1 if cf else x.dim() - 1
    C = x.shape[cdim]
    _bn_channels(scale, C, op, "scale")
    _bn_channels(reserve_space_1, C, op, "reserve_space_1")
    _bn_channels(reserve_space_2, C, op, "reserve_space_2")
    for t, name in ((scale, "scale"), (reserve_space_1, "reserve_space_1"),
                    (reserve_space_2, "reserve_space_2")):
        _bn_dtype(t, pdt, op, name)
    perm = channel_layout_perm(x, cdim, natural_channels_last=not cf)
    x_backprop = empty_in_layout(x, x.shape, perm)
    return (x_backprop, x.new_empty((C,), dtype=pdt), x.new_empty((C,), dtype=pdt),
            x.new_empty((0,), dtype=pdt), x.new_empty((0,), dtype=pdt))


# ---- FractionalPool family ------------------------------------------------------------------
# Shapes only: the sequence values are checked by the kernels (they are data). Output rows and
# columns are floor(float32(dim) / float32(ratio)) as in TF, which has no exact symbolic form,
# so a symbolic H or W is specialised (a guard; the batch and channels stay dynamic).
_FP_DTYPES = (torch.float32, torch.float64, torch.int32, torch.int64, torch.float16,
              torch.bfloat16)


def _fp_dtype(t, op, name):
    torch._check(t.dtype in _FP_DTYPES, lambda: (
        f"{op}: argument '{name}' must be float32, float64, int32, int64, float16 or bfloat16, "
        f"got {t.dtype}"))


def _fmt_g(v):
    return "%g" % v


def fractional_output_size(dim, ratio):
    """TF's `static_cast<int>(floor(float(dim) / ratio))`, in float32."""
    return int(math.floor(as_float32(as_float32(float(dim)) / as_float32(ratio))))


def _fractional_pool_fake(op, is_max, value, pooling_ratio, deterministic, seed, seed2):
    n = len(pooling_ratio)
    torch._check(n >= 4, lambda: (
        f"{op}: argument 'pooling_ratio': Length for attr 'pooling_ratio' of {n} must be at "
        f"least minimum 4"))
    torch._check(n == 4, lambda: (
        f"{op}: argument 'pooling_ratio': pooling_ratio field must specify 4 dimensions"))
    ratio = [as_float32(r) for r in pooling_ratio]
    for r in ratio:
        torch._check(r >= 1.0, lambda: (
            f"{op}: argument 'pooling_ratio': pooling_ratio cannot be smaller than 1, "
            f"got: {_fmt_g(r)}"))
    if not (ratio[0] == 1.0 and ratio[3] == 1.0):
        kind = "max" if is_max else "average"
        raise NotImplementedError(
            f"{op}: argument 'pooling_ratio': Fractional {kind} pooling is not yet supported on "
            f"the batch nor channel dimension.")
    torch._check(deterministic or (seed == 0 and seed2 == 0), lambda: (
        f"{op}: argument 'seed': Both seed and seed2 should be 0 if deterministic is false."))
    torch._check(value.dim() == 4, lambda: (
        f"{op}: argument 'value': tensor_in must be 4-dimensional"))
    _fp_dtype(value, op, "value")
    N, C = value.shape[0], value.shape[3]
    H, W = int(value.shape[1]), int(value.shape[2])  # specialises symbolic H, W (see above)
    for i, d in enumerate((N, H, W, C)):
        torch._check(d >= 1 if i in (0, 3) else as_float32(float(d)) >= ratio[i], lambda: (
            f"{op}: argument 'value': Pooling ratio is higher than input dimension size for "
            f"dimension {i}. Input dim size: {d} pooling ratio: {_fmt_g(ratio[i])}"))
    out_h, out_w = fractional_output_size(H, ratio[1]), fractional_output_size(W, ratio[2])
    return (value.new_empty((N, out_h, out_w, C)),
            value.new_empty((out_h + 1,), dtype=torch.int64),
            value.new_empty((out_w + 1,), dtype=torch.int64))


@torch.library.register_fake("tfgrads::fractional_avg_pool")
def _fractional_avg_pool_fake(value, pooling_ratio, pseudo_random=False, overlapping=False,
                              deterministic=False, seed=0, seed2=0):
    return _fractional_pool_fake("fractional_avg_pool", False, value, pooling_ratio,
                                 deterministic, seed, seed2)


@torch.library.register_fake("tfgrads::fractional_max_pool")
def _fractional_max_pool_fake(value, pooling_ratio, pseudo_random=False, overlapping=False,
                              deterministic=False, seed=0, seed2=0):
    return _fractional_pool_fake("fractional_max_pool", True, value, pooling_ratio,
                                 deterministic, seed, seed2)


def _seq_dtype(t, op, name):
    torch._check(t.dtype == torch.int64, lambda: (
        f"{op}: argument '{name}' must be an int64 tensor, got {t.dtype}"))


@torch.library.register_fake("tfgrads::fractional_avg_pool_grad")
def _fractional_avg_pool_grad_fake(orig_input_tensor_shape, out_backprop, row_pooling_sequence,
                                   col_pooling_sequence, overlapping=False):
    op = "fractional_avg_pool_grad"
    orig = list(orig_input_tensor_shape)
    torch._check(len(orig) == 4, lambda: (
        f"{op}: argument 'orig_input_tensor_shape': original input tensor shape must "
        f"be1-dimensional and 4 elements"))
    dy = out_backprop
    torch._check(dy.dim() == 4, lambda: (
        f"{op}: argument 'out_backprop': out_backprop must be 4-dimensional"))
    for d in dy.shape:
        torch._check(d > 0, lambda: (
            f"{op}: argument 'out_backprop': out_backprop must be positive for all dimension, "
            f"got:{d}"))
    _fp_dtype(dy, op, "out_backprop")
    for seq, name, short, n in ((row_pooling_sequence, "row_pooling_sequence", "row", dy.shape[1]),
                                (col_pooling_sequence, "col_pooling_sequence", "col", dy.shape[2])):
        torch._check(seq.numel() > n, lambda: (
            f"{op}: argument '{name}': Given out_backprop shape {_tf_shape(dy.shape)}, "
            f"{short}_seq_tensor must have at least {n + 1} elements, but got {seq.numel()}"))
        _seq_dtype(seq, op, name)
    for d, label in zip(orig, ("Batch", "Rows", "Columns", "Depth")):
        torch._check(d != 0, lambda: (
            f"{op}: argument 'orig_input_tensor_shape': {label} dimension of input must not be 0"))
    for d in orig:
        torch._check(d >= 0, lambda: (
            f"{op}: argument 'orig_input_tensor_shape': Expected a non-negative size, got {d}"))
    torch._check(dy.shape[0] <= orig[0] and dy.shape[3] <= orig[3], lambda: (
        f"{op}: argument 'out_backprop': out_backprop batch/depth must not exceed "
        f"orig_input_tensor_shape's, got out_backprop {_tf_shape(dy.shape)} for input "
        f"{_tf_shape(orig)}"))
    return dy.new_empty(orig)


@torch.library.register_fake("tfgrads::fractional_max_pool_grad")
def _fractional_max_pool_grad_fake(orig_input, orig_output, out_backprop, row_pooling_sequence,
                                   col_pooling_sequence, overlapping=False):
    op = "fractional_max_pool_grad"
    x, y, dy = orig_input, orig_output, out_backprop
    for t, name in ((x, "orig_input"), (y, "orig_output")):
        torch._check(t.dim() == 4, lambda: (
            f"{op}: argument '{name}': {name} should be a tensor of rank 4, got shape "
            f"{_tf_shape(t.shape)}"))
        torch._check(t.numel() > 0, lambda: (
            f"{op}: argument '{name}': {name} must not be empty, got shape {_tf_shape(t.shape)}"))
    for seq, name in ((row_pooling_sequence, "row_pooling_sequence"),
                      (col_pooling_sequence, "col_pooling_sequence")):
        torch._check(seq.dim() == 1, lambda: (
            f"{op}: argument '{name}': {name} must be a vector, received shape "
            f"{_tf_shape(seq.shape)}"))
    _fp_dtype(x, op, "orig_input")
    for t, name in ((y, "orig_output"), (dy, "out_backprop")):
        torch._check(t.dtype == x.dtype, lambda: (
            f"{op}: argument '{name}' must have the dtype of orig_input ({x.dtype}), got {t.dtype}"))
    torch._check(y.shape[0] == x.shape[0] and y.shape[3] == x.shape[3], lambda: (
        f"{op}: argument 'orig_output': orig_output must have the batch and depth of orig_input"))
    torch._check(dy.shape == y.shape, lambda: (
        f"{op}: argument 'out_backprop': out_backprop must have the shape of orig_output"))
    for seq, name, n in ((row_pooling_sequence, "row_pooling_sequence", y.shape[1]),
                         (col_pooling_sequence, "col_pooling_sequence", y.shape[2])):
        _seq_dtype(seq, op, name)
        torch._check(seq.numel() == n + 1, lambda: (
            f"{op}: argument '{name}' must have orig_output's rows/columns + 1 elements"))
    return x.new_empty(x.shape)


@torch.library.register_fake("tfgrads::fractional_pooling_sequence")
def _fractional_pooling_sequence_fake(input_length, output_length, pseudo_random=False, seed=0,
                                      seed2=0):
    torch._check(1 <= output_length <= input_length, lambda: (
        f"fractional_pooling_sequence: argument 'output_length' must be in [1, input_length = "
        f"{input_length}], got {output_length}"))
    return torch.empty((output_length + 1,), dtype=torch.int64, device="cpu")


@torch.library.register_fake("tfgrads::_fractional_avg_pool_grad_backward")
def _fractional_avg_pool_grad_backward_fake(grad, row_pooling_sequence, col_pooling_sequence,
                                            overlapping=False):
    torch._check(grad.dim() == 4, lambda: "_fractional_avg_pool_grad_backward: argument 'grad' "
                 "must be 4-dimensional (NHWC)")
    return grad.new_empty((grad.shape[0], row_pooling_sequence.numel() - 1,
                           col_pooling_sequence.numel() - 1, grad.shape[3]))


@torch.library.register_fake("tfgrads::_fractional_max_pool_grad_backward")
def _fractional_max_pool_grad_backward_fake(orig_input, orig_output, grad, row_pooling_sequence,
                                            col_pooling_sequence, overlapping=False):
    torch._check(grad.shape == orig_input.shape, lambda: (
        "_fractional_max_pool_grad_backward: argument 'grad' must have the shape and dtype of "
        "orig_input"))
    return grad.new_empty(orig_output.shape)


# ---- DepthwiseConv2dNative family ------------------------------------------------------------
# The checks of csrc/common/depthwise_conv2d.cpp, in its order, with its messages; the output
# follows the physical layout of the op's main tensor (input / out_backprop) as the kernels do.
_DW_FWD = "depthwise_conv2d_native"
_DW_BI = "depthwise_conv2d_native_backprop_input"
_DW_BF = "depthwise_conv2d_native_backprop_filter"
_DW_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _dw_attrs(op, strides, padding, explicit_paddings, data_format, dilations):
    torch._check_value(data_format in ("NHWC", "NCHW"), lambda: (
        f"{op}: argument 'data_format': Value for attr 'data_format' of \"{data_format}\" is not "
        'in the list of allowed values: "NHWC", "NCHW"'))
    torch._check_value(padding in ("SAME", "VALID", "EXPLICIT"), lambda: (
        f"{op}: argument 'padding': Value for attr 'padding' of \"{padding}\" is not in the list "
        'of allowed values: "SAME", "VALID", "EXPLICIT"'))
    nchw = data_format == "NCHW"
    n, c, h, w = (0, 1, 2, 3) if nchw else (0, 3, 1, 2)
    torch._check_value(len(strides) == 4, lambda: (
        f"{op}: argument 'strides': Sliding window strides field must specify 4 dimensions"))
    torch._check_value(strides[n] == 1 and strides[c] == 1, lambda: (
        f"{op}: argument 'strides': Current implementation does not yet support strides in the "
        "batch and depth dimensions."))
    pads = (0, 0, 0, 0)
    if padding == "EXPLICIT":
        torch._check_value(len(explicit_paddings) == 8, lambda: (
            f"{op}: argument 'explicit_paddings': explicit_paddings attribute must contain 8 "
            f"values, but got: {len(explicit_paddings)}"))
        torch._check_value(all(v >= 0 for v in explicit_paddings), lambda: (
            f"{op}: argument 'explicit_paddings': All elements of explicit_paddings must be "
            "nonnegative"))
        ep = explicit_paddings
        torch._check_value(ep[2 * n] == 0 and ep[2 * n + 1] == 0 and ep[2 * c] == 0
                           and ep[2 * c + 1] == 0, lambda: (
                               f"{op}: argument 'explicit_paddings': Nonzero explicit padding in "
                               "the batch or depth dimensions is not supported"))
        pads = (ep[2 * h], ep[2 * h + 1], ep[2 * w], ep[2 * w + 1])
    else:
        torch._check_value(len(explicit_paddings) == 0, lambda: (
            f"{op}: argument 'explicit_paddings': explicit_paddings attribute must be empty if "
            "the padding attribute is not EXPLICIT"))
    torch._check_value(len(dilations) == 4, lambda: (
        f"{op}: argument 'dilations': DepthwiseConv2D requires the dilations attribute to "
        f"contain 4 values, but got: {len(dilations)}"))
    torch._check_value(dilations[n] == 1 and dilations[c] == 1, lambda: (
        f"{op}: argument 'dilations': Current implementation does not yet support dilations in "
        "the batch and depth dimensions."))
    for d in (dilations[h], dilations[w]):
        torch._check_value(d >= 1, lambda: (
            f"{op}: argument 'dilations': Dilation rate must be >= 1, but got {d}"))
    for s in (strides[h], strides[w]):
        torch._check_value(s > 0, lambda: (
            f"{op}: argument 'strides': Stride must be > 0, but got {s}"))
    return nchw, (strides[h], strides[w]), (dilations[h], dilations[w]), pads


def _trunc_div(a, b):
    # C++ division (toward zero); b > 0. A symbolic `a` guards on its sign.
    return a // b if a >= 0 else -((-a) // b)


def depthwise_out_size(op, arg, size, k, s, d, padding, before, after):
    """Output length of one axis by TF's kernel rule (A3), dilation included."""
    K = (k - 1) * d + 1
    if padding == "VALID":
        out = _trunc_div(size - K + s, s)
    elif padding == "SAME":
        out = (size + s - 1) // s
    else:
        out = _trunc_div(size + before + after - K + s, s)
    torch._check_value(out >= 0, lambda: (
        f"{op}: argument '{arg}': Computed output size would be negative: {out} [input_size: "
        f"{size}, effective_filter_size: {K}, stride: {s}]"))
    return out


def _nhwc(shape, nchw):
    return (shape[0], shape[2], shape[3], shape[1]) if nchw else tuple(shape)


def _dw_sizes(op, name, sizes):
    elems = 1
    for i, v in enumerate(sizes):
        torch._check_value(v >= 0, lambda: (
            f"{op}: argument '{name}': Dimension {i} of {name} must be >= 0"))
        # TF's MultiplyWithoutOverflow: -1 when the uint64 product wraps, else the int64 cast.
        prod = elems * v
        nxt = -1 if ((elems | v) >> 32 and prod >= 2**64) else (
            prod - 2**64 if prod >= 2**63 else prod)
        torch._check_value(nxt >= 0, lambda: (
            f"{op}: argument '{name}': Encountered overflow when multiplying {elems} with {v}, "
            f"result: {nxt}"))
        elems = nxt


def _dw_float(op, name, t):
    torch._check_value(t.dtype in _DW_DTYPES, lambda: (
        f"{op}: argument '{name}' must be a float16, bfloat16, float32 or float64 tensor, got "
        f"{t.dtype}"))


def _dw_same_dtype(op, ref, ref_name, t, name):
    torch._check_value(t.dtype == ref.dtype, lambda: (
        f"{op}: argument '{name}' must have the dtype of {ref_name} ({ref.dtype}), got {t.dtype}"))


def _dw_window(op, arg, nhwc, fh, fw, padding, strides, dilations, pads):
    _, H, W, _ = nhwc
    Ho = depthwise_out_size(op, arg, H, fh, strides[0], dilations[0], padding, pads[0], pads[1])
    Wo = depthwise_out_size(op, arg, W, fw, strides[1], dilations[1], padding, pads[2], pads[3])
    return Ho, Wo


def _dw_check_backprop(op, label, input_arg, filter_arg, input_shape, filter_shape, dy, nchw,
                       padding, strides, dilations, pads):
    torch._check_value(len(input_shape) == 4, lambda: (
        f"{op}: argument '{input_arg}': {label}: input must be 4-dimensional"))
    torch._check_value(len(filter_shape) == 4, lambda: (
        f"{op}: argument '{filter_arg}': {label}: filter must be 4-dimensional"))
    torch._check_value(dy.dim() == 4, lambda: (
        f"{op}: argument 'out_backprop': {label}: out_backprop must be 4-dimensional"))
    N, H, W, C = _nhwc(input_shape, nchw)
    torch._check_value(N == dy.shape[0], lambda: (
        f"{op}: argument 'out_backprop': {label}: input and out_backprop must have the same "
        "batch size"))
    torch._check_value(C == filter_shape[2], lambda: (
        f"{op}: argument '{filter_arg}': {label}: input and filter must have the same in_depth"))
    _, dyH, dyW, dyC = _nhwc(dy.shape, nchw)
    torch._check_value(filter_shape[3] * C == dyC, lambda: (
        f"{op}: argument 'out_backprop': {label}: depth_multiplier * in_depth not equal to "
        "out_depth"))
    Ho, Wo = _dw_window(op, input_arg, (N, H, W, C), filter_shape[0], filter_shape[1], padding,
                        strides, dilations, pads)
    torch._check_value(Ho == dyH, lambda: (
        f"{op}: argument 'out_backprop': {label}: Number of rows of out_backprop doesn't match "
        f"computed: actual = {dyH}, computed = {Ho}"))
    torch._check_value(Wo == dyW, lambda: (
        f"{op}: argument 'out_backprop': {label}: Number of cols of out_backprop doesn't match "
        f"computed: actual = {dyW}, computed = {Wo}"))


def _dw_empty_like_layout(t, shape, nchw):
    perm = channel_layout_perm(t, 1 if nchw else 3, natural_channels_last=not nchw)
    return empty_in_layout(t, shape, perm)


@torch.library.register_fake("tfgrads::depthwise_conv2d_native")
def _depthwise_conv2d_native_fake(input, filter, strides, padding, explicit_paddings=(),
                                  data_format="NHWC", dilations=(1, 1, 1, 1)):
    op = _DW_FWD
    nchw, st, dil, pads = _dw_attrs(op, strides, padding, explicit_paddings, data_format,
                                    dilations)
    torch._check_value(input.dim() == 4, lambda: (
        f"{op}: argument 'input': input must be 4-dimensional{_tf_shape(input.shape)}"))
    torch._check_value(filter.dim() == 4, lambda: (
        f"{op}: argument 'filter': filter must be 4-dimensional: {_tf_shape(filter.shape)}"))
    N, H, W, C = _nhwc(input.shape, nchw)
    torch._check_value(C == filter.shape[2], lambda: (
        f"{op}: argument 'filter': input and filter must have the same depth: {C} vs "
        f"{filter.shape[2]}"))
    _dw_float(op, "input", input)
    _dw_same_dtype(op, input, "input", filter, "filter")
    Ho, Wo = _dw_window(op, "input", (N, H, W, C), filter.shape[0], filter.shape[1], padding,
                        st, dil, pads)
    CM = C * filter.shape[3]
    shape = (N, CM, Ho, Wo) if nchw else (N, Ho, Wo, CM)
    return _dw_empty_like_layout(input, shape, nchw)


@torch.library.register_fake("tfgrads::depthwise_conv2d_native_backprop_input")
def _depthwise_conv2d_native_backprop_input_fake(input_sizes, filter, out_backprop, strides,
                                                 padding, explicit_paddings=(),
                                                 data_format="NHWC", dilations=(1, 1, 1, 1)):
    op = _DW_BI
    nchw, st, dil, pads = _dw_attrs(op, strides, padding, explicit_paddings, data_format,
                                    dilations)
    _dw_sizes(op, "input_sizes", input_sizes)
    _dw_check_backprop(op, "DepthwiseConv2DBackpropInput", "input_sizes", "filter",
                       list(input_sizes), list(filter.shape), out_backprop, nchw, padding, st,
                       dil, pads)
    _dw_float(op, "filter", filter)
    _dw_same_dtype(op, filter, "filter", out_backprop, "out_backprop")
    return _dw_empty_like_layout(out_backprop, list(input_sizes), nchw)


@torch.library.register_fake("tfgrads::depthwise_conv2d_native_backprop_filter")
def _depthwise_conv2d_native_backprop_filter_fake(input, filter_sizes, out_backprop, strides,
                                                  padding, explicit_paddings=(),
                                                  data_format="NHWC", dilations=(1, 1, 1, 1)):
    op = _DW_BF
    nchw, st, dil, pads = _dw_attrs(op, strides, padding, explicit_paddings, data_format,
                                    dilations)
    _dw_sizes(op, "filter_sizes", filter_sizes)
    _dw_check_backprop(op, "DepthwiseConv2DBackpropFilter", "input", "filter_sizes",
                       list(input.shape), list(filter_sizes), out_backprop, nchw, padding, st,
                       dil, pads)
    _dw_float(op, "input", input)
    _dw_same_dtype(op, input, "input", out_backprop, "out_backprop")
    return input.new_empty(list(filter_sizes))


# ---- CudnnRNN family --------------------------------------------------------------------------
_RNN_FWD = "cudnn_rnn_v3"
_RNN_BWD = "cudnn_rnn_backprop_v3"
_RNN_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def rnn_check_forward(op, input, input_h, input_c, params, sequence_lengths, rnn_mode,
                      input_mode, direction, num_proj, time_major):
    """The shape checks of csrc/common/cudnn_rnn.cpp (TF's ExtractForwardInput, then ours);
    returns (config, T, B). The value checks of sequence_lengths need data: kernel only."""
    torch._check_value(rnn_mode in GATES, lambda: (
        f"{op}: argument 'rnn_mode' must be one of rnn_relu, rnn_tanh, lstm, gru, got "
        f"'{rnn_mode}'"))
    D = 2 if direction == "bidirectional" else 1
    torch._check_value(input.dim() == 3, lambda: (
        f"{op}: argument 'input': RNN input must be a 3-D vector."))
    torch._check_value(input_h.dim() == 3, lambda: (
        f"{op}: argument 'input_h': RNN input_h must be a 3-D vector."))
    T, B, I = (input.shape[0], input.shape[1], input.shape[2]) if time_major else (
        input.shape[1], input.shape[0], input.shape[2])
    L = input_h.shape[0 if time_major else 1] // D
    Hh = input_h.shape[2]
    hidden = [L * D, B, Hh] if time_major else [B, L * D, Hh]
    torch._check_value(list(input_h.shape) == hidden, lambda: (
        f"{op}: argument 'input_h': Invalid input_h shape: {_tf_shape(input_h.shape)} "
        f"{_tf_shape(hidden)}"))
    U = Hh
    if rnn_mode == "lstm":
        torch._check_value(input_c.dim() == 3, lambda: (
            f"{op}: argument 'input_c': RNN input_c must be a 3-D vector."))
        if num_proj == 0:
            torch._check_value(input_h.shape == input_c.shape, lambda: (
                f"{op}: argument 'input_c': input_h and input_c must have the same shape w/o "
                f"projection: {_tf_shape(input_h.shape)} {_tf_shape(input_c.shape)}"))
        else:
            torch._check_value(
                Hh <= input_c.shape[2] and num_proj == Hh
                and input_h.shape[:2] == input_c.shape[:2], lambda: (
                    f"{op}: argument 'input_c': Invalid input_h and input_c w/ projection size: "
                    f"{num_proj} {_tf_shape(input_h.shape)} {_tf_shape(input_c.shape)}"))
        U = input_c.shape[2]
    cfg = RnnConfig(op, rnn_mode, input_mode, direction, L, U, I, num_proj)
    torch._check_value(input.dtype in _RNN_DTYPES, lambda: (
        f"{op}: argument 'input' must be a float16, bfloat16, float32 or float64 tensor, got "
        f"{input.dtype}"))
    for name, t in (("input_h", input_h), ("input_c", input_c), ("params", params)):
        if name == "input_c" and rnn_mode != "lstm":
            continue
        torch._check_value(t.dtype == input.dtype, lambda: (
            f"{op}: argument '{name}' must have the dtype of input ({input.dtype}), got "
            f"{t.dtype}"))
    torch._check_value(params.dim() == 1, lambda: (
        f"{op}: argument 'params' must be 1-D, got shape {_tf_shape(params.shape)}"))
    expected = cfg.params_size()
    torch._check_value(params.shape[0] == expected, lambda: (
        f"{op}: argument 'params' has {params.shape[0]} elements but cudnn_rnn_params_size of "
        f"this configuration is {expected}"))
    torch._check_value(sequence_lengths.dim() == 1 and sequence_lengths.shape[0] == B, lambda: (
        f"{op}: argument 'sequence_lengths' must have shape [batch_size] = [{B}], got "
        f"{_tf_shape(sequence_lengths.shape)}"))
    return cfg, T, B


@torch.library.register_fake("tfgrads::cudnn_rnn_v3")
def _cudnn_rnn_v3_fake(input, input_h, input_c, params, sequence_lengths, rnn_mode="lstm",
                       input_mode="linear_input", direction="unidirectional", dropout=0.0,
                       seed=0, seed2=0, num_proj=0, is_training=True, time_major=True):
    cfg, T, B = rnn_check_forward(_RNN_FWD, input, input_h, input_c, params, sequence_lengths,
                                  rnn_mode, input_mode, direction, num_proj, time_major)
    out_shape = [T, B, cfg.D * cfg.Hh] if time_major else [B, T, cfg.D * cfg.Hh]
    output = input.new_empty(out_shape)
    output_h = input.new_empty(input_h.shape)
    output_c = input.new_empty(input_c.shape) if cfg.lstm else input.new_empty(())
    n = reserve_numel(cfg, T, B, input.dtype, dropout, is_training)
    reserve = input.new_empty((n,) if n is not None else ())
    host_reserved = input.new_empty((), dtype=torch.int8)
    return output, output_h, output_c, reserve, host_reserved


@torch.library.register_fake("tfgrads::cudnn_rnn_backprop_v3")
def _cudnn_rnn_backprop_v3_fake(input, input_h, input_c, params, sequence_lengths, output,
                                output_h, output_c, output_backprop, output_h_backprop,
                                output_c_backprop, reserve_space, host_reserved,
                                rnn_mode="lstm", input_mode="linear_input",
                                direction="unidirectional", dropout=0.0, seed=0, seed2=0,
                                num_proj=0, time_major=True):
    op = _RNN_BWD
    cfg, T, B = rnn_check_forward(op, input, input_h, input_c, params, sequence_lengths,
                                  rnn_mode, input_mode, direction, num_proj, time_major)
    out_shape = [T, B, cfg.D * cfg.Hh] if time_major else [B, T, cfg.D * cfg.Hh]
    checks = [("output", output, out_shape), ("output_h", output_h, list(input_h.shape))]
    if cfg.lstm:
        checks.append(("output_c", output_c, list(input_c.shape)))
    checks += [("output_backprop", output_backprop, out_shape),
               ("output_h_backprop", output_h_backprop, list(input_h.shape))]
    if cfg.lstm:
        checks.append(("output_c_backprop", output_c_backprop, list(input_c.shape)))
    for name, t, shape in checks:
        torch._check_value(list(t.shape) == shape, lambda: (
            f"{op}: argument '{name}': Invalid {name} shape: {_tf_shape(t.shape)} "
            f"{_tf_shape(shape)}"))
    n = reserve_numel(cfg, T, B, input.dtype, dropout)
    torch._check_value(reserve_space.dim() == 1 and reserve_space.shape[0] == n, lambda: (
        f"{op}: argument 'reserve_space' must be the reserve_space of a training-mode "
        f"cudnn_rnn_v3 call with the same arguments ({n} elements), got shape "
        f"{_tf_shape(reserve_space.shape)}; to use cudnn_rnn_v3 in gradients, is_training must "
        "be set to True"))
    input_c_backprop = input.new_empty(input_c.shape) if cfg.lstm else input.new_empty(())
    return (input.new_empty(input.shape), input.new_empty(input_h.shape), input_c_backprop,
            input.new_empty(params.shape))


@torch.library.register_fake("tfgrads::cudnn_rnn_canonical_to_params_v2")
def _cudnn_rnn_canonical_to_params_v2_fake(num_layers, num_units, input_size, weights, biases,
                                           rnn_mode="lstm", input_mode="linear_input",
                                           direction="unidirectional", num_proj=0):
    op = "cudnn_rnn_canonical_to_params_v2"
    cfg = RnnConfig(op, rnn_mode, input_mode, direction, num_layers, num_units, input_size,
                    num_proj)
    torch._check_value(len(weights) > 0, lambda: f"{op}: argument 'weights' must not be empty")
    w_shapes, b_shapes = cfg.canonical_shapes()
    for name, ts, shapes in (("weights", weights, w_shapes), ("biases", biases, b_shapes)):
        torch._check_value(len(ts) == len(shapes), lambda: (
            f"{op}: argument '{name}': expected {len(shapes)} tensors for this configuration, "
            f"got {len(ts)}"))
        for k, (t, s) in enumerate(zip(ts, shapes)):
            torch._check_value(list(t.shape) == list(s), lambda: (
                f"{op}: argument '{name}': {name}[{k}] must have shape {_tf_shape(s)}, got "
                f"{_tf_shape(t.shape)}"))
    return weights[0].new_empty((cfg.params_size(),))


@torch.library.register_fake("tfgrads::cudnn_rnn_params_to_canonical_v2")
def _cudnn_rnn_params_to_canonical_v2_fake(num_layers, num_units, input_size, params,
                                           num_params_weights, num_params_biases,
                                           rnn_mode="lstm", input_mode="linear_input",
                                           direction="unidirectional", num_proj=0):
    op = "cudnn_rnn_params_to_canonical_v2"
    cfg = RnnConfig(op, rnn_mode, input_mode, direction, num_layers, num_units, input_size,
                    num_proj)
    w_shapes, b_shapes = cfg.canonical_shapes()
    torch._check_value(num_params_weights == len(w_shapes), lambda: (
        f"{op}: C Number of params mismatch. Expected {num_params_weights}, got {len(w_shapes)}"))
    torch._check_value(num_params_biases == len(b_shapes), lambda: (
        f"{op}: A Number of params mismatch. Expected {num_params_biases}, got {len(b_shapes)}"))
    torch._check_value(params.dim() == 1 and params.shape[0] == cfg.params_size(), lambda: (
        f"{op}: argument 'params' has {params.numel()} elements but cudnn_rnn_params_size of "
        f"this configuration is {cfg.params_size()}"))
    return ([params.new_empty(s) for s in w_shapes], [params.new_empty(s) for s in b_shapes])
