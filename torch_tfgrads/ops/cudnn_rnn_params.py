"""CudnnRNN family, the opaque params buffer: CudnnRNNParamsSize and the conversions between the
buffer and the canonical weights and biases (CudnnRNNCanonicalToParamsV2 /
CudnnRNNParamsToCanonicalV2), as csrc/common/cudnn_rnn_params.cpp.

Public functions (TF's argument names and defaults), the fake kernels (the C++ checks with the
same messages) and the autograd formulas (each conversion is the other's adjoint). The buffer's
layout is in docs/ops/cudnn_rnn.md.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ._common import check_same_device, scalar_type_name, tf_shape, typed_arguments
from .cudnn_rnn_config import (
    RNN_ATTRS_DOC,
    RNN_DTYPES,
    RnnConfig,
    check_float,
    check_params_size,
    config_text,
)


# ---- public functions -------------------------------------------------------------------------
def _scalar_int(v, op, name):
    """TF's size inputs are host int32 scalars; accept ints and 0-d integer tensors.

    A size tensor is a value, not data: not a scalar is a ValueError, not an integer a
    TypeError."""
    if isinstance(v, torch.Tensor):
        if v.dim() != 0:
            raise ValueError(
                f"{op}: argument '{name}': {name} is not a scalar (got shape {list(v.shape)})"
            )
        if v.is_floating_point() or v.is_complex() or v.dtype == torch.bool:
            raise TypeError(f"{op}: argument '{name}' must be an integer, got a {v.dtype} tensor")
        return int(v.item())
    return v if isinstance(v, torch.SymInt) else int(v)


@typed_arguments
def cudnn_rnn_params_size(
    num_layers: int | torch.Tensor,
    num_units: int | torch.Tensor,
    input_size: int | torch.Tensor,
    rnn_mode: str = "lstm",
    input_mode: str = "linear_input",
    direction: str = "unidirectional",
    num_proj: int = 0,
) -> int:
    """TF's `CudnnRNNParamsSize`: the number of elements of the opaque params buffer.

    For linear_input this equals the parameter count of the matching ``torch.nn.LSTM/GRU/RNN``
    (``proj_size=num_proj``). Returns a Python int (TF returns a ``[1]`` tensor).
    """
    op = "cudnn_rnn_params_size"
    cfg = RnnConfig(
        op,
        rnn_mode,
        input_mode,
        direction,
        _scalar_int(num_layers, op, "num_layers"),
        _scalar_int(num_units, op, "num_units"),
        _scalar_int(input_size, op, "input_size"),
        int(num_proj),
    )
    return cfg.params_size()


@typed_arguments
def cudnn_rnn_canonical_to_params_v2(
    num_layers: int | torch.Tensor,
    num_units: int | torch.Tensor,
    input_size: int | torch.Tensor,
    weights: Sequence[torch.Tensor],
    biases: Sequence[torch.Tensor],
    rnn_mode: str = "lstm",
    input_mode: str = "linear_input",
    direction: str = "unidirectional",
    num_proj: int = 0,
) -> torch.Tensor:
    """TF's `CudnnRNNCanonicalToParamsV2`: canonical weights and biases -> the opaque buffer.

    ``weights`` per pseudo-layer (layer-major, forward before backward): G gate input matrices
    ``[U, in]``, G recurrent matrices ``[U, Hh]``, then ``Wp [P, U]`` with projection; ``biases``
    per pseudo-layer: G input biases then G recurrent biases, each ``[U]``. The buffer holds,
    per pseudo-layer, the matrices, the biases, then the projection: for one unidirectional
    layer exactly what Keras/TF build, so TF checkpoints load unchanged. Differentiable.
    """
    op = "cudnn_rnn_canonical_to_params_v2"
    if len(weights) == 0:  # the dispatcher needs a tensor to pick a device
        raise RuntimeError(f"{op}: argument 'weights' must not be empty")
    return torch.ops.tfgrads.cudnn_rnn_canonical_to_params_v2.default(
        _scalar_int(num_layers, op, "num_layers"),
        _scalar_int(num_units, op, "num_units"),
        _scalar_int(input_size, op, "input_size"),
        list(weights),
        list(biases),
        rnn_mode,
        input_mode,
        direction,
        int(num_proj),
    )


@typed_arguments
def cudnn_rnn_params_to_canonical_v2(
    num_layers: int | torch.Tensor,
    num_units: int | torch.Tensor,
    input_size: int | torch.Tensor,
    params: torch.Tensor,
    num_params_weights: int,
    num_params_biases: int,
    rnn_mode: str = "lstm",
    input_mode: str = "linear_input",
    direction: str = "unidirectional",
    num_proj: int = 0,
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """TF's `CudnnRNNParamsToCanonicalV2`: the exact inverse of the canonical -> params op.

    Returns ``(weights, biases)`` lists (copies, in the order described there); the counts
    must be ``L*D*(2G + [P>0])`` and ``L*D*2G`` (TF's checks and messages). Differentiable.
    """
    op = "cudnn_rnn_params_to_canonical_v2"
    w, b = torch.ops.tfgrads.cudnn_rnn_params_to_canonical_v2.default(
        _scalar_int(num_layers, op, "num_layers"),
        _scalar_int(num_units, op, "num_units"),
        _scalar_int(input_size, op, "input_size"),
        params,
        int(num_params_weights),
        int(num_params_biases),
        rnn_mode,
        input_mode,
        direction,
        int(num_proj),
    )
    return list(w), list(b)


for _f in (
    cudnn_rnn_params_size,
    cudnn_rnn_canonical_to_params_v2,
    cudnn_rnn_params_to_canonical_v2,
):
    _f.__doc__ += RNN_ATTRS_DOC


# ---- fake kernels -----------------------------------------------------------------------------
@torch.library.register_fake("tfgrads::cudnn_rnn_canonical_to_params_v2")
def _cudnn_rnn_canonical_to_params_v2_fake(
    num_layers,
    num_units,
    input_size,
    weights,
    biases,
    rnn_mode="lstm",
    input_mode="linear_input",
    direction="unidirectional",
    num_proj=0,
):
    # The checks of csrc/common/cudnn_rnn_params.cpp, in its order.
    op = "cudnn_rnn_canonical_to_params_v2"
    cfg = RnnConfig(
        op, rnn_mode, input_mode, direction, num_layers, num_units, input_size, num_proj
    )
    torch._check(len(weights) > 0, lambda: f"{op}: argument 'weights' must not be empty")
    ref = weights[0]
    torch._check_type(
        ref.dtype in RNN_DTYPES,
        lambda: (
            f"{op}: argument 'weights' must hold float16, bfloat16, float32 or float64 tensors, got "
            f"{scalar_type_name(ref.dtype)}"
        ),
    )
    counts, all_shapes = cfg.canonical_counts(), None
    for i, (name, ts) in enumerate((("weights", weights), ("biases", biases))):
        # The count first: the shapes are listed once the weights list is as long as they are
        # (so the lists are bounded by a real one).
        torch._check(
            len(ts) == counts[i],
            lambda: (
                f"{op}: argument '{name}': expected {counts[i]} tensors for this configuration "
                f"({config_text(cfg)}), got {len(ts)}"
            ),
        )
        all_shapes = all_shapes or cfg.canonical_shapes()
        shapes = all_shapes[i]
        for k, (t, s) in enumerate(zip(ts, shapes)):
            torch._check(
                list(t.shape) == list(s),
                lambda: (
                    f"{op}: argument '{name}': {name}[{k}] must have shape {tf_shape(s)}, got "
                    f"{tf_shape(t.shape)}"
                ),
            )
            torch._check_type(
                t.dtype == ref.dtype,
                lambda: (
                    f"{op}: argument '{name}': {name}[{k}] must have dtype "
                    f"{scalar_type_name(ref.dtype)}, got {scalar_type_name(t.dtype)}"
                ),
            )
            check_same_device(ref, t, op, "weights[0]", name)
    return weights[0].new_empty((cfg.params_size(),))


@torch.library.register_fake("tfgrads::cudnn_rnn_params_to_canonical_v2")
def _cudnn_rnn_params_to_canonical_v2_fake(
    num_layers,
    num_units,
    input_size,
    params,
    num_params_weights,
    num_params_biases,
    rnn_mode="lstm",
    input_mode="linear_input",
    direction="unidirectional",
    num_proj=0,
):
    # The checks of csrc/common/cudnn_rnn_params.cpp (TF's, typos included), in its order.
    op = "cudnn_rnn_params_to_canonical_v2"
    cfg = RnnConfig(
        op, rnn_mode, input_mode, direction, num_layers, num_units, input_size, num_proj
    )
    n_weights, n_biases = cfg.canonical_counts()
    LD = cfg.L * cfg.D

    def check(cond, name, text):
        torch._check_value(cond, lambda: f"{op}: argument '{name}': {text}")

    weights, biases = "num_params_weights", "num_params_biases"
    check(
        num_params_weights >= 1 and num_params_biases >= 1,
        weights if num_params_weights < 1 else biases,
        "num_params_weights and num_params_biases must be >= 1",
    )
    if not cfg.skip_input:
        check(
            num_params_weights % LD == 0,
            weights,
            "Number of params (weights) is not a multipleof num_layers * num_dirs.",
        )
        check(
            num_params_biases % LD == 0,
            biases,
            "Number of params (biases) is not a multipleof num_layers * num_dirs.",
        )
        per_layer = num_params_weights // LD
        if cfg.P == 0:
            check(
                per_layer % 2 == 0,
                weights,
                "Number of params (weights) per layer is notan even number with no projection.",
            )
        else:
            check(
                per_layer % 2 == 1,
                weights,
                "Number of params (weights) per layer is notan odl number with projection.",
            )
    check(
        num_params_weights == n_weights,
        weights,
        f"C Number of params mismatch. Expected {num_params_weights}, got {n_weights}",
    )
    check(
        num_params_biases == n_biases,
        biases,
        f"A Number of params mismatch. Expected {num_params_biases}, got {n_biases}",
    )
    check_params_size(op, params, cfg, with_config=True)
    check_float(op, params, "params")
    w_shapes, b_shapes = cfg.canonical_shapes()  # as many as params holds
    return ([params.new_empty(s) for s in w_shapes], [params.new_empty(s) for s in b_shapes])


# ---- autograd ---------------------------------------------------------------------------------
def _as_many_as_inputs(ctx, grads):
    # Ops with Tensor[] inputs or outputs must return exactly one gradient per input the
    # dispatcher passed, and it drops trailing arguments equal to their defaults;
    # needs_input_grad has that structure.
    return grads[: len(ctx.needs_input_grad)]


# The params conversions are linear and each is the other's adjoint (they only move elements).
def _canonical_to_params_setup_context(ctx, inputs, output):
    num_layers, num_units, input_size, weights, biases, *attrs = inputs
    ctx.sizes = (num_layers, num_units, input_size)
    ctx.counts = (len(weights), len(biases))
    ctx.attrs = attrs


def _canonical_to_params_backward(ctx, g):
    gw, gb = torch.ops.tfgrads.cudnn_rnn_params_to_canonical_v2(
        *ctx.sizes, g, *ctx.counts, *ctx.attrs
    )
    grads = (None, None, None, list(gw), list(gb), None, None, None, None)
    return _as_many_as_inputs(ctx, grads)


torch.library.register_autograd(
    "tfgrads::cudnn_rnn_canonical_to_params_v2",
    _canonical_to_params_backward,
    setup_context=_canonical_to_params_setup_context,
)


def _params_to_canonical_setup_context(ctx, inputs, output):
    num_layers, num_units, input_size, params, _nw, _nb, *attrs = inputs
    ctx.sizes = (num_layers, num_units, input_size)
    ctx.attrs = attrs
    ctx.shapes = ([w.shape for w in output[0]], [b.shape for b in output[1]])
    ctx.dtype, ctx.device = params.dtype, params.device


def _params_to_canonical_backward(ctx, gw, gb):
    def filled(grads, shapes):
        return [
            torch.zeros(s, dtype=ctx.dtype, device=ctx.device) if g is None else g
            for g, s in zip(grads, shapes)
        ]

    gw, gb = filled(gw, ctx.shapes[0]), filled(gb, ctx.shapes[1])
    gp = torch.ops.tfgrads.cudnn_rnn_canonical_to_params_v2(*ctx.sizes, gw, gb, *ctx.attrs)
    return _as_many_as_inputs(ctx, (None, None, None, gp) + (None,) * 6)


torch.library.register_autograd(
    "tfgrads::cudnn_rnn_params_to_canonical_v2",
    _params_to_canonical_backward,
    setup_context=_params_to_canonical_setup_context,
)
