"""Fake (meta) kernels for every op, used by torch.compile, torch.export and FakeTensor.

They repeat the C++ argument checks (csrc/common/*.h), with the same messages, so that a bad
call fails the same way when traced as when run, and they report exactly the shapes, dtypes
and strides that the real kernels return. csrc/tfgrads.cpp names this module with
set_python_module: every fake must be registered here.
"""
import struct

import torch

from ._layout import channel_layout_perm, empty_in_layout


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
