"""FusedBatchNorm family: `fused_batch_norm_v3`, `fused_batch_norm_grad_v3` and the local ops
of synchronized batch norm (`fused_batch_norm_sync_*`, composed with all-reduces by
torch_tfgrads/distributed/sync_batch_norm.py).

Public functions (TF's argument names and defaults), the fake kernels (the argument checks of
csrc/common/fused_batch_norm.h with the same messages, and the kernels' output layout) and the
autograd formulas (TF's `_FusedBatchNormV3Grad` and `_FusedBatchNormGradGrad`). The contract is
in docs/ops/fused_batch_norm.md.
"""

from __future__ import annotations

import torch

from ._common import as_float32, check_same_device, scalar_type_name, tf_shape, typed_arguments
from .fused_batch_norm_grad_grad import batch_norm_grad_grad
from .layout import channel_layout_perm, empty_in_layout


# ---- public functions -------------------------------------------------------------------------
def _empty_stats(x: torch.Tensor) -> torch.Tensor:
    dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    return x.new_empty((0,), dtype=dtype)


@typed_arguments
def fused_batch_norm_v3(
    x: torch.Tensor,
    scale: torch.Tensor,
    offset: torch.Tensor,
    mean: torch.Tensor | None = None,
    variance: torch.Tensor | None = None,
    epsilon: float = 1e-4,
    exponential_avg_factor: float = 1.0,
    data_format: str = "NHWC",
    is_training: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """TF's `FusedBatchNormV3`: batch normalisation over every dimension but the channels.

    Args:
        x: 4-D or 5-D tensor laid out as ``data_format`` says (float16, bfloat16, float32 or
            float64). Any strides are accepted; NHWC/NCHW memory is used without transposing.
        scale, offset: ``[C]`` float32 (float64 for float64 x).
        mean, variance: ``[C]`` running statistics, read in inference and when
            ``exponential_avg_factor != 1``; ``None`` means "not given" (an empty tensor, as
            ``tf.compat.v1.nn.fused_batch_norm`` passes).
        epsilon: added to the variance (TF's op default 1e-4; Keras uses 1e-3).
        exponential_avg_factor: training only; the returned statistics are
            ``(1-f) * running + f * batch`` (batch variance Bessel-corrected).
        data_format: "NHWC", "NCHW", "NDHWC" or "NCDHW".
        is_training: normalise with the batch statistics (True) or with mean/variance.

    Returns:
        ``(y, batch_mean, batch_variance, reserve_space_1, reserve_space_2, reserve_space_3)``:
        reserve_space_1/2 are the batch mean and *biased* batch variance in training (copies of
        mean/variance in inference), reserve_space_3 a zero scalar. Only ``y`` is
        differentiable (w.r.t. x, scale, offset), as in TF.
    """
    if mean is None:
        mean = _empty_stats(x)
    if variance is None:
        variance = _empty_stats(x)
    return torch.ops.tfgrads.fused_batch_norm_v3.default(
        x, scale, offset, mean, variance, epsilon, exponential_avg_factor, data_format, is_training
    )


@typed_arguments
def fused_batch_norm_grad_v3(
    y_backprop: torch.Tensor,
    x: torch.Tensor,
    scale: torch.Tensor,
    reserve_space_1: torch.Tensor,
    reserve_space_2: torch.Tensor,
    reserve_space_3: torch.Tensor | None = None,
    epsilon: float = 1e-4,
    data_format: str = "NHWC",
    is_training: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """TF's `FusedBatchNormGradV3`: gradients of batch norm w.r.t. x, scale and offset.

    ``reserve_space_1/2`` are trusted as the batch mean and biased variance (training) or the
    population mean and variance (inference); ``reserve_space_3`` is ignored, as on TF's CPU.
    Returns ``(x_backprop, scale_backprop, offset_backprop, reserve_space_4, reserve_space_5)``
    with empty placeholders for the last two. Differentiable w.r.t. y_backprop, x and scale
    (TF's second-order gradient).
    """
    if reserve_space_3 is None:
        reserve_space_3 = _empty_stats(x)
    return torch.ops.tfgrads.fused_batch_norm_grad_v3.default(
        y_backprop,
        x,
        scale,
        reserve_space_1,
        reserve_space_2,
        reserve_space_3,
        epsilon,
        data_format,
        is_training,
    )


@typed_arguments
def fused_batch_norm_sync_stats(x: torch.Tensor, data_format: str = "NHWC") -> torch.Tensor:
    """The local statistics of synchronized batch norm, packed for one all-reduce.

    Returns ``[sum of x | sum of x**2 | count]`` per channel: ``2C + 1`` values of the parameter
    dtype (float32 for float16/bfloat16/float32 x, float64 for float64 x), ``count`` being the
    number of elements per channel (0 for an empty batch). Summing this buffer over processes
    and applying Keras's ``mean = sum / count``, ``variance = sum_sq / count - mean**2`` gives the
    global batch statistics. Differentiable w.r.t. x.
    """
    return torch.ops.tfgrads.fused_batch_norm_sync_stats.default(x, data_format)


@typed_arguments
def fused_batch_norm_sync_grad_sums(
    y_backprop: torch.Tensor, x: torch.Tensor, mean: torch.Tensor, data_format: str = "NHWC"
) -> torch.Tensor:
    """The local sums of synchronized batch norm's backward: ``[sum dy | sum dy * (x - mean)]``
    per channel (``2C`` values of the parameter dtype), to be all-reduced. ``mean`` is the
    global batch mean the forward normalised with."""
    return torch.ops.tfgrads.fused_batch_norm_sync_grad_sums.default(
        y_backprop, x, mean, data_format
    )


@typed_arguments
def fused_batch_norm_sync_backprop_input(
    y_backprop: torch.Tensor,
    x: torch.Tensor,
    scale: torch.Tensor,
    mean: torch.Tensor,
    variance: torch.Tensor,
    grad_sums: torch.Tensor,
    count: torch.Tensor,
    epsilon: float = 1e-3,
    data_format: str = "NHWC",
) -> torch.Tensor:
    """Synchronized batch norm's input gradient from the all-reduced sums.

    ``dx = scale * r * ((dy - sum_dy / n) - (x - mean) * r**2 * sum_dy_xc / n)`` with
    ``r = 1 / sqrt(variance + epsilon)``, ``grad_sums = [sum_dy | sum_dy_xc]`` (the
    all-reduced output of :func:`fused_batch_norm_sync_grad_sums`) and ``count`` (a 1-element
    tensor, the all-reduced count of :func:`fused_batch_norm_sync_stats`); zero terms when
    ``n`` is 0. ``mean``/``variance`` are the global batch statistics.
    """
    return torch.ops.tfgrads.fused_batch_norm_sync_backprop_input.default(
        y_backprop, x, scale, mean, variance, grad_sums, count, epsilon, data_format
    )


# ---- fake kernels -----------------------------------------------------------------------------
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
        'in the list of allowed values: "NHWC", "NCHW", "NDHWC", "NCDHW"'
    )


def _bn_param_dtype(x, op):
    torch._check_type(
        x.dtype in _BN_DTYPES,
        lambda: (
            f"{op}: argument 'x' must be float16, bfloat16, float32 or float64, got "
            f"{scalar_type_name(x.dtype)}"
        ),
    )
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _bn_rank(t, op, name):
    torch._check(
        t.dim() in (4, 5),
        lambda: f"{op}: argument '{name}': input must be 4 or 5-dimensional{tf_shape(t.shape)}",
    )


def _bn_vector(t, op, name, tf_name):
    torch._check(
        t.dim() == 1,
        lambda: f"{op}: argument '{name}': {tf_name} must be 1-dimensional{tf_shape(t.shape)}",
    )


def _bn_channels(t, C, op, name, prefix=""):
    torch._check(
        t.numel() == C,
        lambda: (
            f"{op}: argument '{name}': {prefix}{name} must have the same number of elements as the "
            f"channels of x, got {t.numel()} and {C}"
        ),
    )


def _bn_dtype(t, dtype, op, name):
    torch._check_type(
        t.dtype == dtype,
        lambda: (
            f"{op}: argument '{name}' must be a {scalar_type_name(dtype)} tensor ({_BN_PARAM_WHY}), "
            f"got {scalar_type_name(t.dtype)}"
        ),
    )


@torch.library.register_fake("tfgrads::fused_batch_norm_v3")
def _fused_batch_norm_v3_fake(
    x,
    scale,
    offset,
    mean,
    variance,
    epsilon=1e-4,
    exponential_avg_factor=1.0,
    data_format="NHWC",
    is_training=True,
):
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
    check_same_device(x, scale, op, "x", "scale")
    check_same_device(x, offset, op, "x", "offset")
    if uses_running:
        _bn_dtype(mean, pdt, op, "mean")
        _bn_dtype(variance, pdt, op, "variance")
        check_same_device(x, mean, op, "x", "mean")
        check_same_device(x, variance, op, "x", "variance")
    perm = channel_layout_perm(x, cdim, natural_channels_last=not cf)
    y = empty_in_layout(x, x.shape, perm)
    stats = [x.new_empty((C,), dtype=pdt) for _ in range(4)]
    return (y, *stats, x.new_empty((), dtype=pdt))


@torch.library.register_fake("tfgrads::fused_batch_norm_grad_v3")
def _fused_batch_norm_grad_v3_fake(
    y_backprop,
    x,
    scale,
    reserve_space_1,
    reserve_space_2,
    reserve_space_3,
    epsilon=1e-4,
    data_format="NHWC",
    is_training=True,
):
    op = _BN_BWD
    cf = bn_channels_first(data_format, op)
    pdt = _bn_param_dtype(x, op)
    torch._check_type(
        y_backprop.dtype == x.dtype,
        lambda: (
            f"{op}: argument 'y_backprop' must have the dtype of x ({scalar_type_name(x.dtype)}), "
            f"got {scalar_type_name(y_backprop.dtype)}"
        ),
    )
    _bn_rank(y_backprop, op, "y_backprop")
    _bn_rank(x, op, "x")
    _bn_vector(scale, op, "scale", "scale")
    _bn_vector(reserve_space_1, op, "reserve_space_1", "saved mean")
    _bn_vector(reserve_space_2, op, "reserve_space_2", "saved variance")
    torch._check(
        x.shape == y_backprop.shape,
        lambda: (
            f"{op}: argument 'y_backprop': x and y_backprop must have same shape, but x has shape "
            f"{tf_shape(x.shape)} and y_backprop has shape {tf_shape(y_backprop.shape)}"
        ),
    )
    cdim = 1 if cf else x.dim() - 1
    C = x.shape[cdim]
    _bn_channels(scale, C, op, "scale")
    _bn_channels(reserve_space_1, C, op, "reserve_space_1")
    _bn_channels(reserve_space_2, C, op, "reserve_space_2")
    for t, name in (
        (scale, "scale"),
        (reserve_space_1, "reserve_space_1"),
        (reserve_space_2, "reserve_space_2"),
    ):
        _bn_dtype(t, pdt, op, name)
    for t, name in (
        (y_backprop, "y_backprop"),
        (scale, "scale"),
        (reserve_space_1, "reserve_space_1"),
        (reserve_space_2, "reserve_space_2"),
    ):
        check_same_device(x, t, op, "x", name)
    perm = channel_layout_perm(x, cdim, natural_channels_last=not cf)
    x_backprop = empty_in_layout(x, x.shape, perm)
    return (
        x_backprop,
        x.new_empty((C,), dtype=pdt),
        x.new_empty((C,), dtype=pdt),
        x.new_empty((0,), dtype=pdt),
        x.new_empty((0,), dtype=pdt),
    )


_SYNC_STATS = "fused_batch_norm_sync_stats"
_SYNC_GRAD_SUMS = "fused_batch_norm_sync_grad_sums"
_SYNC_BACKPROP_INPUT = "fused_batch_norm_sync_backprop_input"


def _sync_prepare_x(x, data_format, op):
    """csrc/common/fused_batch_norm_sync.h's prepare_x: (channel dim, C, parameter dtype)."""
    cf = bn_channels_first(data_format, op)
    pdt = _bn_param_dtype(x, op)
    _bn_rank(x, op, "x")
    cdim = 1 if cf else x.dim() - 1
    return cdim, x.shape[cdim], pdt


def _sync_prepare_grad(y_backprop, x, mean, data_format, op):
    cdim, C, pdt = _sync_prepare_x(x, data_format, op)
    torch._check_type(
        y_backprop.dtype == x.dtype,
        lambda: (
            f"{op}: argument 'y_backprop' must have the dtype of x ({scalar_type_name(x.dtype)}), "
            f"got {scalar_type_name(y_backprop.dtype)}"
        ),
    )
    torch._check(
        x.shape == y_backprop.shape,
        lambda: (
            f"{op}: argument 'y_backprop': x and y_backprop must have same shape, but x has shape "
            f"{tf_shape(x.shape)} and y_backprop has shape {tf_shape(y_backprop.shape)}"
        ),
    )
    _bn_vector(mean, op, "mean", "mean")
    _bn_channels(mean, C, op, "mean")
    _bn_dtype(mean, pdt, op, "mean")
    check_same_device(x, y_backprop, op, "x", "y_backprop")
    check_same_device(x, mean, op, "x", "mean")
    return cdim, C, pdt


def _sync_check_packed(t, n, x, pdt, op, name, what):
    torch._check(
        t.dim() == 1 and t.numel() == n,
        lambda: (
            f"{op}: argument '{name}' must be a 1-D tensor of {n} elements ({what}), got shape "
            f"{tf_shape(t.shape)}"
        ),
    )
    _bn_dtype(t, pdt, op, name)
    check_same_device(x, t, op, "x", name)


@torch.library.register_fake("tfgrads::fused_batch_norm_sync_stats")
def _fused_batch_norm_sync_stats_fake(x, data_format="NHWC"):
    _cdim, C, pdt = _sync_prepare_x(x, data_format, _SYNC_STATS)
    return x.new_empty((2 * C + 1,), dtype=pdt)


@torch.library.register_fake("tfgrads::fused_batch_norm_sync_grad_sums")
def _fused_batch_norm_sync_grad_sums_fake(y_backprop, x, mean, data_format="NHWC"):
    _cdim, C, pdt = _sync_prepare_grad(y_backprop, x, mean, data_format, _SYNC_GRAD_SUMS)
    return x.new_empty((2 * C,), dtype=pdt)


@torch.library.register_fake("tfgrads::fused_batch_norm_sync_backprop_input")
def _fused_batch_norm_sync_backprop_input_fake(
    y_backprop, x, scale, mean, variance, grad_sums, count, epsilon=1e-3, data_format="NHWC"
):
    op = _SYNC_BACKPROP_INPUT
    cdim, C, pdt = _sync_prepare_grad(y_backprop, x, mean, data_format, op)
    for t, name in ((scale, "scale"), (variance, "variance")):
        _bn_vector(t, op, name, name)
        _bn_channels(t, C, op, name)
        _bn_dtype(t, pdt, op, name)
        check_same_device(x, t, op, "x", name)
    _sync_check_packed(
        grad_sums,
        2 * C,
        x,
        pdt,
        op,
        "grad_sums",
        "the all-reduced sums of y_backprop and y_backprop * (x - mean)",
    )
    _sync_check_packed(count, 1, x, pdt, op, "count", "the all-reduced element count per channel")
    cf = cdim == 1
    perm = channel_layout_perm(x, cdim, natural_channels_last=not cf)
    return empty_in_layout(x, x.shape, perm)


# ---- autograd ---------------------------------------------------------------------------------
# TF's `_FusedBatchNormV3Grad` (nn_grad.py): gradients for x, scale, offset from dL/dy only;
# none for mean/variance, none through the statistics outputs (they are marked
# non-differentiable). Training passes the forward's reserve spaces, inference the input
# population statistics.
def _batch_norm_setup_context(ctx, inputs, output):
    x, scale, _offset, mean, variance, epsilon, _factor, data_format, is_training = inputs
    _y, batch_mean, batch_variance, rs1, rs2, rs3 = output
    ctx.mark_non_differentiable(batch_mean, batch_variance, rs1, rs2, rs3)
    saved_mean, saved_var = (rs1, rs2) if is_training else (mean, variance)
    ctx.save_for_backward(x, scale, saved_mean, saved_var, rs3)
    ctx.epsilon, ctx.data_format, ctx.is_training = epsilon, data_format, is_training


def _batch_norm_backward(ctx, dy, *_unused):
    x, scale, saved_mean, saved_var, rs3 = ctx.saved_tensors
    if dy is None:
        dy = torch.zeros_like(x)
    dx, dscale, doffset, _, _ = torch.ops.tfgrads.fused_batch_norm_grad_v3(
        dy, x, scale, saved_mean, saved_var, rs3, ctx.epsilon, ctx.data_format, ctx.is_training
    )
    return dx, dscale, doffset, None, None, None, None, None, None


torch.library.register_autograd(
    "tfgrads::fused_batch_norm_v3", _batch_norm_backward, setup_context=_batch_norm_setup_context
)


# TF's `_FusedBatchNormGradGrad` (nn_fused_batch_norm_grad.py): gradients for y_backprop, x and
# scale; none for the reserve spaces.
def _batch_norm_grad_setup_context(ctx, inputs, output):
    dy, x, scale, rs1, rs2, _rs3, epsilon, data_format, is_training = inputs
    ctx.mark_non_differentiable(output[3], output[4])
    ctx.save_for_backward(dy, x, scale, rs1, rs2)
    ctx.epsilon, ctx.data_format, ctx.is_training = epsilon, data_format, is_training


def _batch_norm_grad_backward(ctx, g_dx, g_dscale, g_doffset, *_unused):
    dy, x, scale, rs1, rs2 = ctx.saved_tensors
    cf = bn_channels_first(ctx.data_format, "fused_batch_norm_grad_v3")
    grad_dy, grad_x, grad_scale = batch_norm_grad_grad(
        dy, x, scale, rs1, rs2, g_dx, g_dscale, g_doffset, ctx.epsilon, cf, ctx.is_training
    )
    return grad_dy, grad_x, grad_scale, None, None, None, None, None, None


torch.library.register_autograd(
    "tfgrads::fused_batch_norm_grad_v3",
    _batch_norm_grad_backward,
    setup_context=_batch_norm_grad_setup_context,
)


# sync_stats: d(sum x)/dx = 1 and d(sum x^2)/dx = 2x per channel; the count has no gradient.
# (Synchronized batch norm itself differentiates through its all-reduces with its own backward,
# distributed/sync_batch_norm.py; this formula serves direct users of the op.)
def _sync_stats_setup_context(ctx, inputs, output):
    x, data_format = inputs
    ctx.save_for_backward(x)
    ctx.data_format = data_format


def _sync_stats_backward(ctx, g):
    (x,) = ctx.saved_tensors
    cf = bn_channels_first(ctx.data_format, _SYNC_STATS)
    cdim = 1 if cf else x.dim() - 1
    C = x.shape[cdim]
    shape = [1] * x.dim()
    shape[cdim] = C
    g_sum, g_sq = g[:C].reshape(shape), g[C : 2 * C].reshape(shape)
    return (g_sum + 2 * x.to(g.dtype) * g_sq).to(x.dtype), None


torch.library.register_autograd(
    "tfgrads::fused_batch_norm_sync_stats",
    _sync_stats_backward,
    setup_context=_sync_stats_setup_context,
)
