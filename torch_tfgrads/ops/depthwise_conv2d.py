"""DepthwiseConv2dNative family: the forward and its two backprop ops.

Public functions (TF's argument names and defaults), the fake kernels (the checks of
csrc/common/depthwise_conv2d.cpp in its order, with its messages) and the autograd formulas
(TF's `_DepthwiseConv2dNativeGrad`; the backprops are bilinear, so every order is available).
The contract is in docs/ops/depthwise_conv2d.md.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ._common import check_same_device, scalar_type_name, tf_shape, typed_arguments
from .layout import channel_layout_perm, empty_in_layout


# ---- public functions -------------------------------------------------------------------------
def _paddings(explicit_paddings):
    """`explicit_paddings` for the op: None when empty. The schema takes `int[]?` because
    AOTInductor's proxy executor hands an empty int list to the op as None."""
    return [int(p) for p in explicit_paddings] if explicit_paddings else None


def _sizes_list(sizes, op, name, tf_op):
    """`input_sizes` / `filter_sizes` as TF takes them: an int tensor (1-D), list or Size."""
    if isinstance(sizes, torch.Tensor):
        # A sizes tensor is a value (a list of sizes), not data: a wrong rank is a ValueError,
        # like a list of the wrong length; a dtype other than int32/int64 a TypeError.
        if sizes.dim() != 1:
            raise ValueError(
                f"{op}: argument '{name}': {tf_op}: {name} input must be 1-dim, not {sizes.dim()}"
            )
        if sizes.dtype not in (torch.int32, torch.int64):
            raise TypeError(
                f"{op}: argument '{name}' must be an int32 or int64 tensor, got {sizes.dtype}"
            )
        return [int(s) for s in sizes.tolist()]
    return [s if isinstance(s, torch.SymInt) else int(s) for s in sizes]


_DW_ATTRS_DOC = """
    ``strides`` / ``dilations`` have 4 entries in ``data_format`` order (batch and depth 1);
    ``padding`` is "SAME" (TF's split: any odd extra row/column at the bottom/right), "VALID" or
    "EXPLICIT" with 8 ``explicit_paddings`` (TF's layout). Row and column strides may differ
    and dilations are honoured (TF's CPU kernels support neither). ``filter`` is always
    ``[fh, fw, C, M]``: output channel ``c*M + m`` comes from input channel ``c``. float16 and
    bfloat16 accumulate in float32. NHWC and NCHW (either memory format) are computed in place,
    never transposed.
"""


@typed_arguments
def depthwise_conv2d_native(
    input: torch.Tensor,
    filter: torch.Tensor,
    strides: Sequence[int],
    padding: str,
    explicit_paddings: Sequence[int] | None = (),
    data_format: str = "NHWC",
    dilations: Sequence[int] = (1, 1, 1, 1),
) -> torch.Tensor:
    return torch.ops.tfgrads.depthwise_conv2d_native.default(
        input,
        filter,
        list(strides),
        padding,
        _paddings(explicit_paddings),
        data_format,
        list(dilations),
    )


@typed_arguments
def depthwise_conv2d_native_backprop_input(
    input_sizes: torch.Tensor | Sequence[int],
    filter: torch.Tensor,
    out_backprop: torch.Tensor,
    strides: Sequence[int],
    padding: str,
    explicit_paddings: Sequence[int] | None = (),
    data_format: str = "NHWC",
    dilations: Sequence[int] = (1, 1, 1, 1),
) -> torch.Tensor:
    op = "depthwise_conv2d_native_backprop_input"
    return torch.ops.tfgrads.depthwise_conv2d_native_backprop_input.default(
        _sizes_list(input_sizes, op, "input_sizes", "Conv2DBackpropInput"),
        filter,
        out_backprop,
        list(strides),
        padding,
        _paddings(explicit_paddings),
        data_format,
        list(dilations),
    )


@typed_arguments
def depthwise_conv2d_native_backprop_filter(
    input: torch.Tensor,
    filter_sizes: torch.Tensor | Sequence[int],
    out_backprop: torch.Tensor,
    strides: Sequence[int],
    padding: str,
    explicit_paddings: Sequence[int] | None = (),
    data_format: str = "NHWC",
    dilations: Sequence[int] = (1, 1, 1, 1),
) -> torch.Tensor:
    op = "depthwise_conv2d_native_backprop_filter"
    return torch.ops.tfgrads.depthwise_conv2d_native_backprop_filter.default(
        input,
        _sizes_list(filter_sizes, op, "filter_sizes", "Conv2DBackpropFilter"),
        out_backprop,
        list(strides),
        padding,
        _paddings(explicit_paddings),
        data_format,
        list(dilations),
    )


depthwise_conv2d_native.__doc__ = (
    """TF's `DepthwiseConv2dNative`: a depthwise 2-D convolution.

    Output ``[N, Ho, Wo, C*M]`` (NCHW: ``[N, C*M, Ho, Wo]``), sizes by TF's kernel rule
    (truncating division: a VALID window a little larger than the input gives an empty output).
    Differentiable w.r.t. ``input`` and ``filter`` (through the two backprop ops).
"""
    + _DW_ATTRS_DOC
)
depthwise_conv2d_native_backprop_input.__doc__ = (
    """TF's `DepthwiseConv2dNativeBackpropInput`:
    the gradient w.r.t. the input of a depthwise convolution.

    ``input_sizes`` is the full 4-D input shape in ``data_format`` order (tensor, list or
    ``torch.Size``); ``out_backprop`` must have the forward's output shape. Honours
    ``dilations`` (TF's kernel silently computes the undilated gradient). Empty inputs give
    zeros. Differentiable w.r.t. ``filter`` and ``out_backprop``.
"""
    + _DW_ATTRS_DOC
)
depthwise_conv2d_native_backprop_filter.__doc__ = (
    """TF's
    `DepthwiseConv2dNativeBackpropFilter`: the gradient w.r.t. the filter of a depthwise
    convolution.

    ``filter_sizes`` is ``[fh, fw, C, M]`` (tensor, list or ``torch.Size``). Honours
    ``dilations`` (TF's kernel does not); an empty ``out_backprop`` gives zeros (TF returns
    uninitialised memory). Summed in a fixed order: deterministic. Differentiable w.r.t.
    ``input`` and ``out_backprop``.
"""
    + _DW_ATTRS_DOC
)


# ---- fake kernels -----------------------------------------------------------------------------
# The checks of csrc/common/depthwise_conv2d.cpp, in its order, with its messages and exception
# types (docs/errors.md): attributes and sizes lists ValueError, dtypes TypeError, shapes that do
# not fit and devices RuntimeError. The output follows the physical layout of the op's main
# tensor (input / out_backprop) as the kernels do.
_DW_FWD = "depthwise_conv2d_native"
_DW_BI = "depthwise_conv2d_native_backprop_input"
_DW_BF = "depthwise_conv2d_native_backprop_filter"
_DW_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _dw_attrs(op, strides, padding, explicit_paddings, data_format, dilations):
    explicit_paddings = () if explicit_paddings is None else explicit_paddings
    torch._check_value(
        data_format in ("NHWC", "NCHW"),
        lambda: (
            f"{op}: argument 'data_format': Value for attr 'data_format' of \"{data_format}\" is not "
            'in the list of allowed values: "NHWC", "NCHW"'
        ),
    )
    torch._check_value(
        padding in ("SAME", "VALID", "EXPLICIT"),
        lambda: (
            f"{op}: argument 'padding': Value for attr 'padding' of \"{padding}\" is not in the list "
            'of allowed values: "SAME", "VALID", "EXPLICIT"'
        ),
    )
    nchw = data_format == "NCHW"
    n, c, h, w = (0, 1, 2, 3) if nchw else (0, 3, 1, 2)
    torch._check_value(
        len(strides) == 4,
        lambda: f"{op}: argument 'strides': Sliding window strides field must specify 4 dimensions",
    )
    torch._check_value(
        strides[n] == 1 and strides[c] == 1,
        lambda: (
            f"{op}: argument 'strides': Current implementation does not yet support strides in the "
            "batch and depth dimensions."
        ),
    )
    pads = (0, 0, 0, 0)
    if padding == "EXPLICIT":
        torch._check_value(
            len(explicit_paddings) == 8,
            lambda: (
                f"{op}: argument 'explicit_paddings': explicit_paddings attribute must contain 8 "
                f"values, but got: {len(explicit_paddings)}"
            ),
        )
        torch._check_value(
            all(v >= 0 for v in explicit_paddings),
            lambda: (
                f"{op}: argument 'explicit_paddings': All elements of explicit_paddings must be "
                "nonnegative"
            ),
        )
        ep = explicit_paddings
        torch._check_value(
            ep[2 * n] == 0 and ep[2 * n + 1] == 0 and ep[2 * c] == 0 and ep[2 * c + 1] == 0,
            lambda: (
                f"{op}: argument 'explicit_paddings': Nonzero explicit padding in "
                "the batch or depth dimensions is not supported"
            ),
        )
        pads = (ep[2 * h], ep[2 * h + 1], ep[2 * w], ep[2 * w + 1])
    else:
        torch._check_value(
            len(explicit_paddings) == 0,
            lambda: (
                f"{op}: argument 'explicit_paddings': explicit_paddings attribute must be empty if "
                "the padding attribute is not EXPLICIT"
            ),
        )
    torch._check_value(
        len(dilations) == 4,
        lambda: (
            f"{op}: argument 'dilations': DepthwiseConv2D requires the dilations attribute to "
            f"contain 4 values, but got: {len(dilations)}"
        ),
    )
    torch._check_value(
        dilations[n] == 1 and dilations[c] == 1,
        lambda: (
            f"{op}: argument 'dilations': Current implementation does not yet support dilations in "
            "the batch and depth dimensions."
        ),
    )
    for d in (dilations[h], dilations[w]):
        torch._check_value(
            d >= 1, lambda: f"{op}: argument 'dilations': Dilation rate must be >= 1, but got {d}"
        )
    for s in (strides[h], strides[w]):
        torch._check_value(
            s > 0, lambda: f"{op}: argument 'strides': Stride must be > 0, but got {s}"
        )
    return nchw, (strides[h], strides[w]), (dilations[h], dilations[w]), pads


def _trunc_div(a, b):
    # C++ division (toward zero); b > 0. A symbolic `a` guards on its sign.
    return a // b if a >= 0 else -((-a) // b)


_INT32_MAX, _INT64_MAX = 2**31 - 1, 2**63 - 1


def _int64(v):
    # static_cast<int64_t> of the kernel's 128-bit value, as its messages print it.
    return (v + 2**63) % 2**64 - 2**63


def depthwise_out_size(op, arg, size, k, s, d, padding, before, after):
    """Output length of one axis by TF's kernel rule (A3), dilation included."""
    K = (k - 1) * d + 1
    if padding == "VALID":
        out = _trunc_div(size - K + s, s)
    elif padding == "SAME":
        out = (size + s - 1) // s
        torch._check(
            (out - 1) * s + K - size <= 2 * _INT64_MAX + 1,
            lambda: f"{op}: argument '{arg}': padding too large",
        )
    else:
        out = _trunc_div(size + before + after - K + s, s)
    torch._check(
        out >= 0,
        lambda: (
            f"{op}: argument '{arg}': Computed output size would be negative: {_int64(out)} "
            f"[input_size: {size}, effective_filter_size: {_int64(K)}, stride: {s}]"
        ),
    )
    torch._check(
        out <= _INT32_MAX,
        lambda: f"{op}: argument '{arg}': Computed output size too large: {_int64(out)}",
    )
    return out


def _nhwc(shape, nchw):
    return (shape[0], shape[2], shape[3], shape[1]) if nchw else tuple(shape)


def _dw_sizes(op, name, sizes):
    # A sizes list with a negative entry or an overflowing product: ValueError.
    elems = 1
    for i, v in enumerate(sizes):
        torch._check_value(
            v >= 0, lambda: f"{op}: argument '{name}': Dimension {i} of {name} must be >= 0"
        )
        # TF's MultiplyWithoutOverflow: -1 when the uint64 product wraps, else the int64 cast.
        prod = elems * v
        nxt = (
            -1
            if ((elems | v) >> 32 and prod >= 2**64)
            else (prod - 2**64 if prod >= 2**63 else prod)
        )
        torch._check_value(
            nxt >= 0,
            lambda: (
                f"{op}: argument '{name}': Encountered overflow when multiplying {elems} with {v}, "
                f"result: {nxt}"
            ),
        )
        elems = nxt


def _dw_float(op, name, t):
    torch._check_type(
        t.dtype in _DW_DTYPES,
        lambda: (
            f"{op}: argument '{name}' must be a float16, bfloat16, float32 or float64 tensor, got "
            f"{scalar_type_name(t.dtype)}"
        ),
    )


def _dw_same_dtype(op, ref, ref_name, t, name):
    torch._check_type(
        t.dtype == ref.dtype,
        lambda: (
            f"{op}: argument '{name}' must have the dtype of {ref_name} "
            f"({scalar_type_name(ref.dtype)}), got {scalar_type_name(t.dtype)}"
        ),
    )


def _dw_window(op, arg, nhwc, fh, fw, padding, strides, dilations, pads):
    _, H, W, _ = nhwc
    Ho = depthwise_out_size(op, arg, H, fh, strides[0], dilations[0], padding, pads[0], pads[1])
    Wo = depthwise_out_size(op, arg, W, fw, strides[1], dilations[1], padding, pads[2], pads[3])
    return Ho, Wo


def _dw_check_backprop(
    op,
    label,
    input_arg,
    filter_arg,
    input_shape,
    filter_shape,
    dy,
    nchw,
    padding,
    strides,
    dilations,
    pads,
):
    # One of input/filter is a sizes list (its wrong length: ValueError), the other a tensor
    # (its wrong rank: RuntimeError).
    input_check = torch._check_value if input_arg == "input_sizes" else torch._check
    filter_check = torch._check_value if filter_arg == "filter_sizes" else torch._check
    input_check(
        len(input_shape) == 4,
        lambda: f"{op}: argument '{input_arg}': {label}: input must be 4-dimensional",
    )
    filter_check(
        len(filter_shape) == 4,
        lambda: f"{op}: argument '{filter_arg}': {label}: filter must be 4-dimensional",
    )
    torch._check(
        dy.dim() == 4,
        lambda: f"{op}: argument 'out_backprop': {label}: out_backprop must be 4-dimensional",
    )
    N, H, W, C = _nhwc(input_shape, nchw)
    torch._check(
        dy.shape[0] == N,
        lambda: (
            f"{op}: argument 'out_backprop': {label}: input and out_backprop must have the same "
            "batch size"
        ),
    )
    torch._check(
        filter_shape[2] == C,
        lambda: (
            f"{op}: argument '{filter_arg}': {label}: input and filter must have the same in_depth"
        ),
    )
    _, dyH, dyW, dyC = _nhwc(dy.shape, nchw)
    torch._check(
        filter_shape[3] * C == dyC,
        lambda: (
            f"{op}: argument 'out_backprop': {label}: depth_multiplier * in_depth not equal to "
            "out_depth"
        ),
    )
    Ho, Wo = _dw_window(
        op,
        input_arg,
        (N, H, W, C),
        filter_shape[0],
        filter_shape[1],
        padding,
        strides,
        dilations,
        pads,
    )
    torch._check(
        Ho == dyH,
        lambda: (
            f"{op}: argument 'out_backprop': {label}: Number of rows of out_backprop doesn't match "
            f"computed: actual = {dyH}, computed = {Ho}"
        ),
    )
    torch._check(
        Wo == dyW,
        lambda: (
            f"{op}: argument 'out_backprop': {label}: Number of cols of out_backprop doesn't match "
            f"computed: actual = {dyW}, computed = {Wo}"
        ),
    )


def _dw_empty_like_layout(t, shape, nchw):
    perm = channel_layout_perm(t, 1 if nchw else 3, natural_channels_last=not nchw)
    return empty_in_layout(t, shape, perm)


@torch.library.register_fake("tfgrads::depthwise_conv2d_native")
def _depthwise_conv2d_native_fake(
    input,
    filter,
    strides,
    padding,
    explicit_paddings=None,
    data_format="NHWC",
    dilations=(1, 1, 1, 1),
):
    op = _DW_FWD
    nchw, st, dil, pads = _dw_attrs(op, strides, padding, explicit_paddings, data_format, dilations)
    torch._check(
        input.dim() == 4,
        lambda: f"{op}: argument 'input': input must be 4-dimensional{tf_shape(input.shape)}",
    )
    torch._check(
        filter.dim() == 4,
        lambda: f"{op}: argument 'filter': filter must be 4-dimensional: {tf_shape(filter.shape)}",
    )
    N, H, W, C = _nhwc(input.shape, nchw)
    torch._check(
        filter.shape[2] == C,
        lambda: (
            f"{op}: argument 'filter': input and filter must have the same depth: {C} vs "
            f"{filter.shape[2]}"
        ),
    )
    _dw_float(op, "input", input)
    _dw_same_dtype(op, input, "input", filter, "filter")
    check_same_device(input, filter, op, "input", "filter")
    Ho, Wo = _dw_window(
        op, "input", (N, H, W, C), filter.shape[0], filter.shape[1], padding, st, dil, pads
    )
    CM = C * filter.shape[3]
    shape = (N, CM, Ho, Wo) if nchw else (N, Ho, Wo, CM)
    return _dw_empty_like_layout(input, shape, nchw)


@torch.library.register_fake("tfgrads::depthwise_conv2d_native_backprop_input")
def _depthwise_conv2d_native_backprop_input_fake(
    input_sizes,
    filter,
    out_backprop,
    strides,
    padding,
    explicit_paddings=None,
    data_format="NHWC",
    dilations=(1, 1, 1, 1),
):
    op = _DW_BI
    nchw, st, dil, pads = _dw_attrs(op, strides, padding, explicit_paddings, data_format, dilations)
    _dw_sizes(op, "input_sizes", input_sizes)
    _dw_check_backprop(
        op,
        "DepthwiseConv2DBackpropInput",
        "input_sizes",
        "filter",
        list(input_sizes),
        list(filter.shape),
        out_backprop,
        nchw,
        padding,
        st,
        dil,
        pads,
    )
    _dw_float(op, "filter", filter)
    _dw_same_dtype(op, filter, "filter", out_backprop, "out_backprop")
    check_same_device(filter, out_backprop, op, "filter", "out_backprop")
    return _dw_empty_like_layout(out_backprop, list(input_sizes), nchw)


@torch.library.register_fake("tfgrads::depthwise_conv2d_native_backprop_filter")
def _depthwise_conv2d_native_backprop_filter_fake(
    input,
    filter_sizes,
    out_backprop,
    strides,
    padding,
    explicit_paddings=None,
    data_format="NHWC",
    dilations=(1, 1, 1, 1),
):
    op = _DW_BF
    nchw, st, dil, pads = _dw_attrs(op, strides, padding, explicit_paddings, data_format, dilations)
    _dw_sizes(op, "filter_sizes", filter_sizes)
    _dw_check_backprop(
        op,
        "DepthwiseConv2DBackpropFilter",
        "input",
        "filter_sizes",
        list(input.shape),
        list(filter_sizes),
        out_backprop,
        nchw,
        padding,
        st,
        dil,
        pads,
    )
    _dw_float(op, "input", input)
    _dw_same_dtype(op, input, "input", out_backprop, "out_backprop")
    check_same_device(input, out_backprop, op, "input", "out_backprop")
    return input.new_empty(list(filter_sizes))


# ---- autograd ---------------------------------------------------------------------------------
# TF's `_DepthwiseConv2dNativeGrad` (nn_grad.py), attrs (dilations included) passed through:
# dL/dinput = BackpropInput(shape(input), filter, dy), dL/dfilter = BackpropFilter(input,
# shape(filter), dy). The two backprops are bilinear in (filter, dy) / (input, dy); each one's
# gradients are the other two ops, so every order of derivative is available.
def _conv_setup_context(ctx, inputs, output):
    x, f = inputs[0], inputs[1]
    ctx.save_for_backward(x, f)
    ctx.attrs = tuple(inputs[2:])


def _conv_backward(ctx, dy):
    x, f = ctx.saved_tensors
    dx = df = None
    if ctx.needs_input_grad[0]:
        dx = torch.ops.tfgrads.depthwise_conv2d_native_backprop_input(
            list(x.shape), f, dy, *ctx.attrs
        )
    if ctx.needs_input_grad[1]:
        df = torch.ops.tfgrads.depthwise_conv2d_native_backprop_filter(
            x, list(f.shape), dy, *ctx.attrs
        )
    return dx, df, None, None, None, None, None


torch.library.register_autograd(
    "tfgrads::depthwise_conv2d_native", _conv_backward, setup_context=_conv_setup_context
)


def _backprop_input_setup_context(ctx, inputs, output):
    f, dy = inputs[1], inputs[2]
    ctx.save_for_backward(f, dy)
    ctx.attrs = tuple(inputs[3:])


def _backprop_input_backward(ctx, g):
    # dx = BackpropInput(f, dy): <g, dx> is the forward of g with f, read against dy.
    f, dy = ctx.saved_tensors
    g_f = g_dy = None
    if ctx.needs_input_grad[1]:
        g_f = torch.ops.tfgrads.depthwise_conv2d_native_backprop_filter(
            g, list(f.shape), dy, *ctx.attrs
        )
    if ctx.needs_input_grad[2]:
        g_dy = torch.ops.tfgrads.depthwise_conv2d_native(g, f, *ctx.attrs)
    return None, g_f, g_dy, None, None, None, None, None


torch.library.register_autograd(
    "tfgrads::depthwise_conv2d_native_backprop_input",
    _backprop_input_backward,
    setup_context=_backprop_input_setup_context,
)


def _backprop_filter_setup_context(ctx, inputs, output):
    x, _sizes, dy = inputs[0], inputs[1], inputs[2]
    ctx.save_for_backward(x, dy)
    ctx.attrs = tuple(inputs[3:])


def _backprop_filter_backward(ctx, g):
    # df = BackpropFilter(x, dy): d/dx is BackpropInput with g as the filter, d/ddy the forward
    # of x with g as the filter.
    x, dy = ctx.saved_tensors
    g_x = g_dy = None
    if ctx.needs_input_grad[0]:
        g_x = torch.ops.tfgrads.depthwise_conv2d_native_backprop_input(
            list(x.shape), g, dy, *ctx.attrs
        )
    if ctx.needs_input_grad[2]:
        g_dy = torch.ops.tfgrads.depthwise_conv2d_native(x, g, *ctx.attrs)
    return g_x, None, g_dy, None, None, None, None, None


torch.library.register_autograd(
    "tfgrads::depthwise_conv2d_native_backprop_filter",
    _backprop_filter_backward,
    setup_context=_backprop_filter_setup_context,
)
