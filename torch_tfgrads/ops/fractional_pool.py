"""FractionalPool family: Fractional{Avg,Max}Pool, their gradients and the pooling sequence.

Public functions (TF's argument names and defaults), the fake kernels (the checks of
csrc/common/fractional_pool.h with the same messages) and the autograd formulas (TF's
`_FractionalAvgPoolGrad` / `_FractionalMaxPoolGrad`, with adjoint ops for every higher order).
The contract is in docs/ops/fractional_pool.md.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ._common import (
    as_float32,
    check_same_device,
    check_value,
    scalar_type_name,
    tf_shape,
    typed_arguments,
)


# ---- public functions -------------------------------------------------------------------------
def _ratio_list(pooling_ratio):
    return [float(r) for r in pooling_ratio]


def _shape_list(shape, op):
    """`orig_input_tensor_shape` as TF takes it: a tensor, list or torch.Size of 4 ints."""
    if isinstance(shape, torch.Tensor):
        if shape.dim() != 1 or shape.numel() != 4:
            raise ValueError(
                f"{op}: argument 'orig_input_tensor_shape': original input "
                "tensor shape must be1-dimensional and 4 elements"
            )
        return [int(s) for s in shape.tolist()]
    return list(shape)


def _sequence(seq, like):
    if isinstance(seq, torch.Tensor):
        return seq
    return torch.as_tensor(seq, dtype=torch.int64, device=like.device)


_POOL_DOC = """TF's `Fractional{Kind}Pool` on an NHWC tensor (Graham's fractional pooling).

    Args:
        value: ``[N, H, W, C]`` float32, float64, int32, int64, float16 or bfloat16 (half types
            accumulate in float32). Any batch/row/column strides are read in place.
        pooling_ratio: 4 floats ``[1, r_h, r_w, 1]``, each >= 1 (stored as float32, like TF);
            the output has ``floor(H / r_h)`` rows and ``floor(W / r_w)`` columns.
        pseudo_random: pseudo-random instead of random cell boundaries.
        overlapping: cells include the first row/column of the next cell.
        deterministic, seed, seed2: with a nonzero seed pair (``deterministic=True``) the
            sequences are TF's, bit for bit. With ``seed = seed2 = 0`` they come from torch's
            default CPU generator (``torch.manual_seed`` makes them reproducible; TF uses an
            unseedable source). ``deterministic=False`` requires both seeds to be 0, as in TF.

    Returns:
        ``(output, row_pooling_sequence, col_pooling_sequence)``: the sequences are int64 cell
        boundaries (``out_rows + 1`` and ``out_cols + 1`` values from 0 to H and W) on
        ``value``'s device. Differentiable w.r.t. ``value``.
    """


@typed_arguments
def fractional_avg_pool(
    value: torch.Tensor,
    pooling_ratio: Sequence[float],
    pseudo_random: bool = False,
    overlapping: bool = False,
    deterministic: bool = False,
    seed: int = 0,
    seed2: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return torch.ops.tfgrads.fractional_avg_pool.default(
        value, _ratio_list(pooling_ratio), pseudo_random, overlapping, deterministic, seed, seed2
    )


@typed_arguments
def fractional_max_pool(
    value: torch.Tensor,
    pooling_ratio: Sequence[float],
    pseudo_random: bool = False,
    overlapping: bool = False,
    deterministic: bool = False,
    seed: int = 0,
    seed2: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return torch.ops.tfgrads.fractional_max_pool.default(
        value, _ratio_list(pooling_ratio), pseudo_random, overlapping, deterministic, seed, seed2
    )


fractional_avg_pool.__doc__ = (
    _POOL_DOC.replace("{Kind}", "Avg")
    + """
    Each output is the mean of its cell, summed in TF's order in value's dtype (float32 for
    half types) and divided once by the cell size; integers divide with C++ truncation.
    """
)
fractional_max_pool.__doc__ = (
    _POOL_DOC.replace("{Kind}", "Max")
    + """
    Each output is the maximum of its cell (NaN inputs are skipped, as on TF's CPU).
    """
)


@typed_arguments
def fractional_avg_pool_grad(
    orig_input_tensor_shape: torch.Tensor | Sequence[int],
    out_backprop: torch.Tensor,
    row_pooling_sequence: torch.Tensor | Sequence[int],
    col_pooling_sequence: torch.Tensor | Sequence[int],
    overlapping: bool = False,
) -> torch.Tensor:
    """TF's `FractionalAvgPoolGrad`: spreads each ``out_backprop`` value evenly over its cell.

    Accumulates in float64 in TF's order and rounds once, so float32 results equal TF's bit for
    bit. ``orig_input_tensor_shape`` may be a tensor, list or ``torch.Size``; the sequences a
    tensor or list (int64). out_backprop's batch and depth may be smaller than the input's (the
    rest gets zero gradient, as in TF) but not larger, and the sequences must be increasing and
    within the input (TF corrupts its heap or reads out of bounds otherwise).
    Differentiable w.r.t. ``out_backprop``.
    """
    op = "fractional_avg_pool_grad"
    return torch.ops.tfgrads.fractional_avg_pool_grad.default(
        _shape_list(orig_input_tensor_shape, op),
        out_backprop,
        _sequence(row_pooling_sequence, out_backprop),
        _sequence(col_pooling_sequence, out_backprop),
        overlapping,
    )


@typed_arguments
def fractional_max_pool_grad(
    orig_input: torch.Tensor,
    orig_output: torch.Tensor,
    out_backprop: torch.Tensor,
    row_pooling_sequence: torch.Tensor | Sequence[int],
    col_pooling_sequence: torch.Tensor | Sequence[int],
    overlapping: bool = False,
) -> torch.Tensor:
    """TF's `FractionalMaxPoolGrad`: routes each ``out_backprop`` value to its cell's maximum.

    The maximum is recomputed from ``orig_input`` (the first one in scan order wins ties, as in
    TF) and must equal ``orig_output``. Values routed to the same input element add up (in TF's
    order). Differentiable w.r.t. ``out_backprop``.
    """
    return torch.ops.tfgrads.fractional_max_pool_grad.default(
        orig_input,
        orig_output,
        out_backprop,
        _sequence(row_pooling_sequence, orig_input),
        _sequence(col_pooling_sequence, orig_input),
        overlapping,
    )


@typed_arguments
def fractional_pooling_sequence(
    input_length: int,
    output_length: int,
    pseudo_random: bool = False,
    seed: int = 0,
    seed2: int = 0,
) -> torch.Tensor:
    """TF's pooling sequence for one axis: ``output_length + 1`` cumulative cell boundaries.

    Generated on a fresh Philox stream for ``(seed, seed2)``, so this is the *row* sequence of
    the pool ops with the same seeds; their column sequence continues the same stream after the
    rows. Seeds ``(0, 0)`` draw from torch's default generator. Returns a CPU int64 tensor.
    """
    return torch.ops.tfgrads.fractional_pooling_sequence.default(
        int(input_length), int(output_length), bool(pseudo_random), int(seed), int(seed2)
    )


# ---- fake kernels -----------------------------------------------------------------------------
# Shapes only: the sequence values are checked by the kernels (they are data). Output rows and
# columns are floor(float32(dim) / float32(ratio)) as in TF, which has no exact symbolic form,
# so a symbolic H or W is specialised (a guard; the batch and channels stay dynamic).
_FP_DTYPES = (torch.float32, torch.float64, torch.int32, torch.int64, torch.float16, torch.bfloat16)
# TF's dtype names, as csrc/common/fractional_pool.cpp's debug_string prints them.
_TF_DTYPE_NAMES = {
    torch.float32: "float",
    torch.float64: "double",
    torch.float16: "half",
    torch.bfloat16: "bfloat16",
    torch.int32: "int32",
    torch.int64: "int64",
}


def _fp_dtype(t, op, name):
    torch._check_type(
        t.dtype in _FP_DTYPES,
        lambda: (
            f"{op}: argument '{name}' must be float32, float64, int32, int64, float16 or bfloat16, "
            f"got {scalar_type_name(t.dtype)}"
        ),
    )


def _seq_dtype(t, op, name):
    torch._check_type(
        t.dtype == torch.int64,
        lambda: f"{op}: argument '{name}' must be an int64 tensor, got {scalar_type_name(t.dtype)}",
    )


def _debug_string(t):
    name = _TF_DTYPE_NAMES.get(t.dtype) or scalar_type_name(t.dtype)
    return f"Tensor<type: {name} shape: {tf_shape(t.shape)}>"


def _fmt_g(v):
    return f"{v:g}"


def fractional_output_size(dim, ratio):
    """TF's `static_cast<int>(floor(float(dim) / ratio))`, in float32."""
    return int(math.floor(as_float32(as_float32(float(dim)) / as_float32(ratio))))


def _fractional_pool_fake(op, is_max, value, pooling_ratio, deterministic, seed, seed2):
    n = len(pooling_ratio)
    torch._check_value(
        n >= 4,
        lambda: (
            f"{op}: argument 'pooling_ratio': Length for attr 'pooling_ratio' of {n} must be at "
            f"least minimum 4"
        ),
    )
    torch._check_value(
        n == 4,
        lambda: f"{op}: argument 'pooling_ratio': pooling_ratio field must specify 4 dimensions",
    )
    ratio = [as_float32(r) for r in pooling_ratio]
    for r in ratio:
        torch._check_value(
            r >= 1.0,
            lambda: (
                f"{op}: argument 'pooling_ratio': pooling_ratio cannot be smaller than 1, "
                f"got: {_fmt_g(r)}"
            ),
        )
    kind = "max" if is_max else "average"
    torch._check_not_implemented(
        ratio[0] == 1.0 and ratio[3] == 1.0,
        lambda: (
            f"{op}: argument 'pooling_ratio': Fractional {kind} pooling is not yet supported on "
            f"the batch nor channel dimension."
        ),
    )
    torch._check_value(
        deterministic or (seed == 0 and seed2 == 0),
        lambda: (
            f"{op}: argument 'seed': Both seed and seed2 should be 0 if deterministic is false."
        ),
    )
    torch._check(
        value.dim() == 4, lambda: f"{op}: argument 'value': tensor_in must be 4-dimensional"
    )
    _fp_dtype(value, op, "value")
    N, C = value.shape[0], value.shape[3]
    H, W = int(value.shape[1]), int(value.shape[2])  # specialises symbolic H, W (see above)
    for i, d in enumerate((N, H, W, C)):
        torch._check(
            d >= 1 if i in (0, 3) else as_float32(float(d)) >= ratio[i],
            lambda: (
                f"{op}: argument 'value': Pooling ratio is higher than input dimension size for "
                f"dimension {i}. Input dim size: {d} pooling ratio: {_fmt_g(ratio[i])}"
            ),
        )
    out_h, out_w = fractional_output_size(H, ratio[1]), fractional_output_size(W, ratio[2])
    return (
        value.new_empty((N, out_h, out_w, C)),
        value.new_empty((out_h + 1,), dtype=torch.int64),
        value.new_empty((out_w + 1,), dtype=torch.int64),
    )


@torch.library.register_fake("tfgrads::fractional_avg_pool")
def _fractional_avg_pool_fake(
    value,
    pooling_ratio,
    pseudo_random=False,
    overlapping=False,
    deterministic=False,
    seed=0,
    seed2=0,
):
    return _fractional_pool_fake(
        "fractional_avg_pool", False, value, pooling_ratio, deterministic, seed, seed2
    )


@torch.library.register_fake("tfgrads::fractional_max_pool")
def _fractional_max_pool_fake(
    value,
    pooling_ratio,
    pseudo_random=False,
    overlapping=False,
    deterministic=False,
    seed=0,
    seed2=0,
):
    return _fractional_pool_fake(
        "fractional_max_pool", True, value, pooling_ratio, deterministic, seed, seed2
    )


_INT64_MAX = 2**63 - 1


@torch.library.register_fake("tfgrads::fractional_avg_pool_grad")
def _fractional_avg_pool_grad_fake(
    orig_input_tensor_shape,
    out_backprop,
    row_pooling_sequence,
    col_pooling_sequence,
    overlapping=False,
):
    op = "fractional_avg_pool_grad"
    orig = list(orig_input_tensor_shape)
    torch._check_value(
        len(orig) == 4,
        lambda: (
            f"{op}: argument 'orig_input_tensor_shape': original input tensor shape must "
            f"be1-dimensional and 4 elements"
        ),
    )
    dy = out_backprop
    torch._check(
        dy.dim() == 4, lambda: f"{op}: argument 'out_backprop': out_backprop must be 4-dimensional"
    )
    for d in dy.shape:
        torch._check(
            d > 0,
            lambda: (
                f"{op}: argument 'out_backprop': out_backprop must be positive for all dimension, "
                f"got:{d}"
            ),
        )
    _fp_dtype(dy, op, "out_backprop")
    _seq_dtype(row_pooling_sequence, op, "row_pooling_sequence")
    _seq_dtype(col_pooling_sequence, op, "col_pooling_sequence")
    for seq, name, short, n in (
        (row_pooling_sequence, "row_pooling_sequence", "row", dy.shape[1]),
        (col_pooling_sequence, "col_pooling_sequence", "col", dy.shape[2]),
    ):
        torch._check(
            seq.numel() > n,
            lambda: (
                f"{op}: argument '{name}': Given out_backprop shape {tf_shape(dy.shape)}, "
                f"{short}_seq_tensor must have at least {n + 1} elements, but got {seq.numel()}"
            ),
        )
    for d, label in zip(orig, ("Batch", "Rows", "Columns", "Depth")):
        check_value(
            d != 0,
            lambda: (
                f"{op}: argument 'orig_input_tensor_shape': {label} dimension of input must not be 0"
            ),
        )
    numel = 1
    for d in orig:
        check_value(
            d >= 0,
            lambda: (
                f"{op}: argument 'orig_input_tensor_shape': Expected a non-negative size, got {d}"
            ),
        )
        if isinstance(d, int) and isinstance(numel, int):  # symbolic sizes cannot overflow here
            check_value(
                numel * d <= _INT64_MAX,
                lambda: (
                    f"{op}: argument 'orig_input_tensor_shape': Encountered overflow when "
                    f"multiplying {numel} with {d}, result: -1"
                ),
            )
        numel = numel * d
    torch._check(
        dy.shape[0] <= orig[0] and dy.shape[3] <= orig[3],
        lambda: (
            f"{op}: argument 'out_backprop': out_backprop batch/depth must not exceed "
            f"orig_input_tensor_shape's, got out_backprop {tf_shape(dy.shape)} for input "
            f"{tf_shape(orig)}"
        ),
    )
    return dy.new_empty(orig)


def _check_max_grad(op, x, y, dy, row_pooling_sequence, col_pooling_sequence):
    """csrc/common/fractional_pool.cpp's check_max_grad, but for the sequences' values."""
    for t, name in ((x, "orig_input"), (y, "orig_output")):
        torch._check(
            t.dim() == 4,
            lambda: (
                f"{op}: argument '{name}': {name} should be a tensor of rank 4, got "
                f"{_debug_string(t)}"
            ),
        )
        torch._check(
            t.numel() > 0,
            lambda: f"{op}: argument '{name}': {name} must not be empty, got {_debug_string(t)}",
        )
    for seq, name in (
        (row_pooling_sequence, "row_pooling_sequence"),
        (col_pooling_sequence, "col_pooling_sequence"),
    ):
        torch._check(
            seq.dim() == 1,
            lambda: (
                f"{op}: argument '{name}': {name} must be a vector, received shape "
                f"{tf_shape(seq.shape)}"
            ),
        )
    _fp_dtype(x, op, "orig_input")
    for t, name in ((y, "orig_output"), (dy, "out_backprop")):
        torch._check_type(
            t.dtype == x.dtype,
            lambda: (
                f"{op}: argument '{name}' must have the dtype of orig_input "
                f"({scalar_type_name(x.dtype)}), got {scalar_type_name(t.dtype)}"
            ),
        )
    check_same_device(x, y, op, "orig_input", "orig_output")
    check_same_device(x, dy, op, "orig_input", "out_backprop")
    torch._check(
        y.shape[0] == x.shape[0] and y.shape[3] == x.shape[3],
        lambda: (
            f"{op}: argument 'orig_output': orig_output must have the batch and depth of "
            f"orig_input, got {tf_shape(y.shape)} for orig_input {tf_shape(x.shape)}"
        ),
    )
    torch._check(
        dy.shape == y.shape,
        lambda: (
            f"{op}: argument 'out_backprop': out_backprop must have the shape of orig_output "
            f"{tf_shape(y.shape)}, got {tf_shape(dy.shape)}"
        ),
    )
    _seq_dtype(row_pooling_sequence, op, "row_pooling_sequence")
    _seq_dtype(col_pooling_sequence, op, "col_pooling_sequence")
    for seq, name, axis, n in (
        (row_pooling_sequence, "row_pooling_sequence", "rows", y.shape[1]),
        (col_pooling_sequence, "col_pooling_sequence", "columns", y.shape[2]),
    ):
        torch._check(
            seq.numel() == n + 1,
            lambda: (
                f"{op}: argument '{name}' must have orig_output's {axis} + 1 = {n + 1} elements, "
                f"got {seq.numel()}"
            ),
        )


@torch.library.register_fake("tfgrads::fractional_max_pool_grad")
def _fractional_max_pool_grad_fake(
    orig_input,
    orig_output,
    out_backprop,
    row_pooling_sequence,
    col_pooling_sequence,
    overlapping=False,
):
    _check_max_grad(
        "fractional_max_pool_grad",
        orig_input,
        orig_output,
        out_backprop,
        row_pooling_sequence,
        col_pooling_sequence,
    )
    return orig_input.new_empty(orig_input.shape)


@torch.library.register_fake("tfgrads::fractional_pooling_sequence")
def _fractional_pooling_sequence_fake(
    input_length, output_length, pseudo_random=False, seed=0, seed2=0
):
    check_value(
        1 <= output_length <= input_length,
        lambda: (
            f"fractional_pooling_sequence: argument 'output_length' must be in [1, input_length = "
            f"{input_length}], got {output_length}"
        ),
    )
    return torch.empty((output_length + 1,), dtype=torch.int64, device="cpu")


@torch.library.register_fake("tfgrads::_fractional_avg_pool_grad_backward")
def _fractional_avg_pool_grad_backward_fake(
    grad, row_pooling_sequence, col_pooling_sequence, overlapping=False
):
    op = "_fractional_avg_pool_grad_backward"
    torch._check(
        grad.dim() == 4,
        lambda: f"{op}: argument 'grad' must be 4-dimensional (NHWC), got {tf_shape(grad.shape)}",
    )
    _fp_dtype(grad, op, "grad")
    for seq, name in (
        (row_pooling_sequence, "row_pooling_sequence"),
        (col_pooling_sequence, "col_pooling_sequence"),
    ):
        torch._check(
            seq.dim() == 1 and seq.numel() >= 2,
            lambda: (
                f"{op}: argument '{name}' must be a vector of at least 2 elements, got shape "
                f"{tf_shape(seq.shape)}"
            ),
        )
    _seq_dtype(row_pooling_sequence, op, "row_pooling_sequence")
    _seq_dtype(col_pooling_sequence, op, "col_pooling_sequence")
    torch._check(
        grad.shape[1] > 0 and grad.shape[2] > 0,
        lambda: f"{op}: argument 'grad' must have rows and columns, got {tf_shape(grad.shape)}",
    )
    return grad.new_empty(
        (
            grad.shape[0],
            row_pooling_sequence.numel() - 1,
            col_pooling_sequence.numel() - 1,
            grad.shape[3],
        )
    )


@torch.library.register_fake("tfgrads::_fractional_max_pool_grad_backward")
def _fractional_max_pool_grad_backward_fake(
    orig_input, orig_output, grad, row_pooling_sequence, col_pooling_sequence, overlapping=False
):
    op = "_fractional_max_pool_grad_backward"
    _check_max_grad(
        op, orig_input, orig_output, orig_output, row_pooling_sequence, col_pooling_sequence
    )
    check_same_device(
        orig_input, grad, op, "orig_input", "grad"
    )  # (only the CUDA kernel can see it)
    torch._check(
        grad.shape == orig_input.shape and grad.dtype == orig_input.dtype,
        lambda: f"{op}: argument 'grad' must have the shape and dtype of orig_input",
    )
    return grad.new_empty(orig_output.shape)


# ---- autograd ---------------------------------------------------------------------------------
# TF's `_FractionalAvgPoolGrad` / `_FractionalMaxPoolGrad` (nn_grad.py): gradient for value
# only, through our grad ops, with the sequences the forward returned (marked
# non-differentiable). The grad ops are linear in out_backprop; their backward is the adjoint
# (pooling over the same cells / reading at the same argmax), which is again linear with the
# grad op as its adjoint, so every order of derivative is available.
def _avg_pool_setup_context(ctx, inputs, output):
    value, _ratio, _pseudo, overlapping, *_ = inputs
    _out, rows, cols = output
    ctx.mark_non_differentiable(rows, cols)
    ctx.save_for_backward(rows, cols)
    ctx.shape, ctx.overlapping = list(value.shape), overlapping


def _avg_pool_backward(ctx, dy, *_unused):
    rows, cols = ctx.saved_tensors
    dx = torch.ops.tfgrads.fractional_avg_pool_grad(ctx.shape, dy, rows, cols, ctx.overlapping)
    return dx, None, None, None, None, None, None


torch.library.register_autograd(
    "tfgrads::fractional_avg_pool", _avg_pool_backward, setup_context=_avg_pool_setup_context
)


def _avg_pool_grad_setup_context(ctx, inputs, output):
    _shape, dy, rows, cols, overlapping = inputs
    ctx.save_for_backward(rows, cols)
    ctx.overlapping, ctx.dy_shape = overlapping, dy.shape


def _avg_pool_grad_backward(ctx, g):
    rows, cols = ctx.saved_tensors
    g_dy = torch.ops.tfgrads._fractional_avg_pool_grad_backward(g, rows, cols, ctx.overlapping)
    n, oh, ow, c = ctx.dy_shape  # out_backprop may have had fewer images/channels (TF allows it)
    return None, g_dy[:n, :oh, :ow, :c], None, None, None


torch.library.register_autograd(
    "tfgrads::fractional_avg_pool_grad",
    _avg_pool_grad_backward,
    setup_context=_avg_pool_grad_setup_context,
)


def _avg_pool_grad_backward_setup_context(ctx, inputs, output):
    g, rows, cols, overlapping = inputs
    ctx.save_for_backward(rows, cols)
    ctx.shape, ctx.overlapping = list(g.shape), overlapping


def _avg_pool_grad_backward_backward(ctx, gg):
    rows, cols = ctx.saved_tensors
    return (
        torch.ops.tfgrads.fractional_avg_pool_grad(ctx.shape, gg, rows, cols, ctx.overlapping),
        None,
        None,
        None,
    )


torch.library.register_autograd(
    "tfgrads::_fractional_avg_pool_grad_backward",
    _avg_pool_grad_backward_backward,
    setup_context=_avg_pool_grad_backward_setup_context,
)


def _max_pool_setup_context(ctx, inputs, output):
    value, _ratio, _pseudo, overlapping, *_ = inputs
    out, rows, cols = output
    ctx.mark_non_differentiable(rows, cols)
    ctx.save_for_backward(value, out, rows, cols)
    ctx.overlapping = overlapping


def _max_pool_backward(ctx, dy, *_unused):
    value, out, rows, cols = ctx.saved_tensors
    dx = torch.ops.tfgrads.fractional_max_pool_grad(value, out, dy, rows, cols, ctx.overlapping)
    return dx, None, None, None, None, None, None


torch.library.register_autograd(
    "tfgrads::fractional_max_pool", _max_pool_backward, setup_context=_max_pool_setup_context
)


# Gradient w.r.t. out_backprop only (TF gives none for orig_input/orig_output: the argmax is
# piecewise constant in them).
def _max_pool_grad_setup_context(ctx, inputs, output):
    x, y, _dy, rows, cols, overlapping = inputs
    ctx.save_for_backward(x, y, rows, cols)
    ctx.overlapping = overlapping


def _max_pool_grad_backward(ctx, g):
    x, y, rows, cols = ctx.saved_tensors
    g_dy = torch.ops.tfgrads._fractional_max_pool_grad_backward(
        x, y, g, rows, cols, ctx.overlapping
    )
    return None, None, g_dy, None, None, None


torch.library.register_autograd(
    "tfgrads::fractional_max_pool_grad",
    _max_pool_grad_backward,
    setup_context=_max_pool_grad_setup_context,
)


def _max_pool_grad_backward_setup_context(ctx, inputs, output):
    x, y, _g, rows, cols, overlapping = inputs
    ctx.save_for_backward(x, y, rows, cols)
    ctx.overlapping = overlapping


def _max_pool_grad_backward_backward(ctx, gg):
    x, y, rows, cols = ctx.saved_tensors
    return (
        None,
        None,
        torch.ops.tfgrads.fractional_max_pool_grad(x, y, gg, rows, cols, ctx.overlapping),
        None,
        None,
        None,
    )


torch.library.register_autograd(
    "tfgrads::_fractional_max_pool_grad_backward",
    _max_pool_grad_backward_backward,
    setup_context=_max_pool_grad_backward_setup_context,
)
