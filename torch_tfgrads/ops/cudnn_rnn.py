"""CudnnRNN family: CudnnRNNV3 and its backprop (the params size and conversions are in
cudnn_rnn_params.py, as in csrc/common/).

Public functions (TF's argument names and defaults), the fake kernels (the checks of
csrc/common/cudnn_rnn.cpp with the same messages) and the autograd formulas (TF's
`_cudnn_rnn_backwardv3` and a composite second order). The contract is in docs/ops/cudnn_rnn.md.
"""

from __future__ import annotations

import torch

from . import cudnn_rnn_reference as rnn_reference
from ._common import check_same_device, scalar_type_name, tf_shape, typed_arguments
from .cudnn_rnn_config import (
    GATES,
    RNN_ATTRS_DOC,
    RnnConfig,
    check_float,
    check_params_size,
    reserve_numel,
)


# ---- public functions -------------------------------------------------------------------------
def _lengths(sequence_lengths, input, time_major):
    if sequence_lengths is not None:
        return sequence_lengths
    if input.dim() != 3:  # no T or B to read: the op's own check reports the input's rank
        return torch.zeros(0, dtype=torch.int32)
    T, B = (input.shape[0], input.shape[1]) if time_major else (input.shape[1], input.shape[0])
    # On the host, where TF keeps them too: the kernels read the lengths on the host, so a
    # device tensor would cost a device-to-host copy (a stream sync) in forward and backward.
    return torch.full((B,), T, dtype=torch.int32)


@typed_arguments
def cudnn_rnn_v3(
    input: torch.Tensor,
    input_h: torch.Tensor,
    input_c: torch.Tensor | None,
    params: torch.Tensor,
    sequence_lengths: torch.Tensor | None = None,
    rnn_mode: str = "lstm",
    input_mode: str = "linear_input",
    direction: str = "unidirectional",
    dropout: float = 0.0,
    seed: int = 0,
    seed2: int = 0,
    num_proj: int = 0,
    is_training: bool = True,
    time_major: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """TF's `CudnnRNNV3`, on CPU and CUDA (TF has GPU kernels only).

    Returns ``(output, output_h, output_c, reserve_space, host_reserved)``. Shapes (L layers,
    D directions, Hh = num_proj or num_units): time-major ``input [T, B, I]``, ``input_h
    [L*D, B, Hh]``, ``input_c [L*D, B, U]`` (LSTM; otherwise ignored, may be None), ``output
    [T, B, D*Hh]``; batch-major swaps T and B in input/output and labels the states ``[B, L*D,
    H]`` while reading their memory as ``[L*D, B, H]``, exactly as TF does. ``sequence_lengths``
    (int32 ``[B]``, each in ``[1, T]``; None: all T): outputs past a length are 0, final states
    are taken at each sequence's last step, the reverse direction starts there. ``dropout``
    applies between layers in training (inverted dropout from torch's CPU generator, fixed by a
    nonzero seed/seed2; kept in reserve_space for the backward). ``reserve_space`` is 1-D in
    training and a zero scalar in inference, as are ``host_reserved`` (int8) and, outside LSTM,
    ``output_c``. Half types compute in float32. Differentiable w.r.t. input, input_h, input_c
    and params (training only, as in TF).
    """
    if input_c is None:
        input_c = input.new_zeros(())
    return torch.ops.tfgrads.cudnn_rnn_v3.default(
        input,
        input_h,
        input_c,
        params,
        _lengths(sequence_lengths, input, time_major),
        rnn_mode,
        input_mode,
        direction,
        float(dropout),
        int(seed),
        int(seed2),
        int(num_proj),
        bool(is_training),
        bool(time_major),
    )


@typed_arguments
def cudnn_rnn_backprop_v3(
    input: torch.Tensor,
    input_h: torch.Tensor,
    input_c: torch.Tensor | None,
    params: torch.Tensor,
    sequence_lengths: torch.Tensor | None,
    output: torch.Tensor,
    output_h: torch.Tensor,
    output_c: torch.Tensor,
    output_backprop: torch.Tensor,
    output_h_backprop: torch.Tensor,
    output_c_backprop: torch.Tensor,
    reserve_space: torch.Tensor,
    host_reserved: torch.Tensor,
    rnn_mode: str = "lstm",
    input_mode: str = "linear_input",
    direction: str = "unidirectional",
    dropout: float = 0.0,
    seed: int = 0,
    seed2: int = 0,
    num_proj: int = 0,
    time_major: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """TF's `CudnnRNNBackpropV3`: gradients of ``<output_backprop, output> + <output_h_backprop,
    output_h> + <output_c_backprop, output_c>`` w.r.t. (input, input_h, input_c, params), the
    last in the opaque layout. Needs the ``reserve_space`` of the training-mode forward with the
    same arguments (its size is checked); output_backprop past a sequence's length is ignored.
    """
    if input_c is None:
        input_c = input.new_zeros(())
    return torch.ops.tfgrads.cudnn_rnn_backprop_v3.default(
        input,
        input_h,
        input_c,
        params,
        _lengths(sequence_lengths, input, time_major),
        output,
        output_h,
        output_c,
        output_backprop,
        output_h_backprop,
        output_c_backprop,
        reserve_space,
        host_reserved,
        rnn_mode,
        input_mode,
        direction,
        float(dropout),
        int(seed),
        int(seed2),
        int(num_proj),
        bool(time_major),
    )


for _f in (cudnn_rnn_v3, cudnn_rnn_backprop_v3):
    _f.__doc__ += RNN_ATTRS_DOC


# ---- fake kernels -----------------------------------------------------------------------------
_RNN_FWD = "cudnn_rnn_v3"
_RNN_BWD = "cudnn_rnn_backprop_v3"


def _check_dtype_like(op, input, t, name):
    # check_like of csrc/common/cudnn_rnn.cpp: the dtype (TypeError), then the device.
    torch._check_type(
        t.dtype == input.dtype,
        lambda: (
            f"{op}: argument '{name}' must have the dtype of input ({scalar_type_name(input.dtype)}), "
            f"got {scalar_type_name(t.dtype)}"
        ),
    )
    check_same_device(input, t, op, "input", name)


def rnn_check_forward(
    op,
    input,
    input_h,
    input_c,
    params,
    sequence_lengths,
    rnn_mode,
    input_mode,
    direction,
    dropout,
    num_proj,
    time_major,
):
    """The checks of csrc/common/cudnn_rnn.cpp (TF's ExtractForwardInput, then ours), in its
    order, with its messages and exception types; returns (config, T, B). The value checks of
    sequence_lengths need data: kernel only."""
    torch._check_value(
        rnn_mode in GATES,
        lambda: (
            f"{op}: argument 'rnn_mode' must be one of rnn_relu, rnn_tanh, lstm, gru, got "
            f"'{rnn_mode}'"
        ),
    )
    torch._check_value(
        direction in ("unidirectional", "bidirectional"),
        lambda: (
            f"{op}: argument 'direction' must be unidirectional or bidirectional, got '{direction}'"
        ),
    )
    D = 2 if direction == "bidirectional" else 1
    torch._check(
        input.dim() == 3, lambda: f"{op}: argument 'input': RNN input must be a 3-D vector."
    )
    torch._check(
        input_h.dim() == 3, lambda: f"{op}: argument 'input_h': RNN input_h must be a 3-D vector."
    )
    T, B, I = (
        (input.shape[0], input.shape[1], input.shape[2])
        if time_major
        else (input.shape[1], input.shape[0], input.shape[2])
    )
    L = input_h.shape[0 if time_major else 1] // D
    Hh = input_h.shape[2]
    hidden = [L * D, B, Hh] if time_major else [B, L * D, Hh]
    torch._check(
        list(input_h.shape) == hidden,
        lambda: (
            f"{op}: argument 'input_h': Invalid input_h shape: {tf_shape(input_h.shape)} "
            f"{tf_shape(hidden)}"
        ),
    )
    U = Hh
    if rnn_mode == "lstm":
        torch._check(
            input_c.dim() == 3,
            lambda: f"{op}: argument 'input_c': RNN input_c must be a 3-D vector.",
        )
        if num_proj == 0:
            torch._check(
                input_h.shape == input_c.shape,
                lambda: (
                    f"{op}: argument 'input_c': input_h and input_c must have the same shape w/o "
                    f"projection: {tf_shape(input_h.shape)} {tf_shape(input_c.shape)}"
                ),
            )
        else:
            torch._check(
                Hh <= input_c.shape[2]
                and num_proj == Hh
                and input_h.shape[:2] == input_c.shape[:2],
                lambda: (
                    f"{op}: argument 'input_c': Invalid input_h and input_c w/ projection size: "
                    f"{num_proj} {tf_shape(input_h.shape)} {tf_shape(input_c.shape)}"
                ),
            )
        U = input_c.shape[2]
    cfg = RnnConfig(op, rnn_mode, input_mode, direction, L, U, I, num_proj, from_shapes=True)
    torch._check_value(
        0.0 <= dropout < 1.0,
        lambda: f"{op}: argument 'dropout' must be in [0, 1), got {_cpp_double(dropout)}",
    )
    check_float(op, input, "input")
    _check_dtype_like(op, input, input_h, "input_h")
    if cfg.lstm:
        _check_dtype_like(op, input, input_c, "input_c")
    _check_dtype_like(op, input, params, "params")
    check_params_size(op, params, cfg)
    torch._check_type(
        sequence_lengths.dtype in (torch.int32, torch.int64),
        lambda: (
            f"{op}: argument 'sequence_lengths' must be an int32 tensor, got "
            f"{scalar_type_name(sequence_lengths.dtype)}"
        ),
    )
    torch._check(
        sequence_lengths.dim() == 1 and sequence_lengths.shape[0] == B,
        lambda: (
            f"{op}: argument 'sequence_lengths' must have shape [batch_size] = [{B}], got "
            f"{tf_shape(sequence_lengths.shape)}"
        ),
    )
    return cfg, T, B


def _cpp_double(v):
    # A double as C++ streams print it (6 significant digits, %g): 1 not 1.0, -0.1 as -0.1.
    return f"{v:g}"


@torch.library.register_fake("tfgrads::cudnn_rnn_v3")
def _cudnn_rnn_v3_fake(
    input,
    input_h,
    input_c,
    params,
    sequence_lengths,
    rnn_mode="lstm",
    input_mode="linear_input",
    direction="unidirectional",
    dropout=0.0,
    seed=0,
    seed2=0,
    num_proj=0,
    is_training=True,
    time_major=True,
):
    cfg, T, B = rnn_check_forward(
        _RNN_FWD,
        input,
        input_h,
        input_c,
        params,
        sequence_lengths,
        rnn_mode,
        input_mode,
        direction,
        dropout,
        num_proj,
        time_major,
    )
    out_shape = [T, B, cfg.D * cfg.Hh] if time_major else [B, T, cfg.D * cfg.Hh]
    output = input.new_empty(out_shape)
    output_h = input.new_empty(input_h.shape)
    output_c = input.new_empty(input_c.shape) if cfg.lstm else input.new_empty(())
    n = reserve_numel(cfg, T, B, input.dtype, dropout, is_training)
    reserve = input.new_empty((n,) if n is not None else ())
    host_reserved = input.new_empty((), dtype=torch.int8)
    return output, output_h, output_c, reserve, host_reserved


@torch.library.register_fake("tfgrads::cudnn_rnn_backprop_v3")
def _cudnn_rnn_backprop_v3_fake(
    input,
    input_h,
    input_c,
    params,
    sequence_lengths,
    output,
    output_h,
    output_c,
    output_backprop,
    output_h_backprop,
    output_c_backprop,
    reserve_space,
    host_reserved,
    rnn_mode="lstm",
    input_mode="linear_input",
    direction="unidirectional",
    dropout=0.0,
    seed=0,
    seed2=0,
    num_proj=0,
    time_major=True,
):
    op = _RNN_BWD
    cfg, T, B = rnn_check_forward(
        op,
        input,
        input_h,
        input_c,
        params,
        sequence_lengths,
        rnn_mode,
        input_mode,
        direction,
        dropout,
        num_proj,
        time_major,
    )
    out_shape = [T, B, cfg.D * cfg.Hh] if time_major else [B, T, cfg.D * cfg.Hh]
    checks = [("output", output, out_shape), ("output_h", output_h, list(input_h.shape))]
    if cfg.lstm:
        checks.append(("output_c", output_c, list(input_c.shape)))
    checks += [
        ("output_backprop", output_backprop, out_shape),
        ("output_h_backprop", output_h_backprop, list(input_h.shape)),
    ]
    if cfg.lstm:
        checks.append(("output_c_backprop", output_c_backprop, list(input_c.shape)))
    for name, t, shape in checks:
        torch._check(
            list(t.shape) == shape,
            lambda: (
                f"{op}: argument '{name}': Invalid {name} shape: {tf_shape(t.shape)} "
                f"{tf_shape(shape)}"
            ),
        )
        _check_dtype_like(op, input, t, name)
    n = reserve_numel(cfg, T, B, input.dtype, dropout)
    torch._check(
        reserve_space.dim() == 1 and reserve_space.shape[0] == n,
        lambda: (
            f"{op}: argument 'reserve_space' must be the reserve_space of a training-mode "
            f"cudnn_rnn_v3 call with the same arguments ({n} elements), got shape "
            f"{tf_shape(reserve_space.shape)}; to use cudnn_rnn_v3 in gradients, is_training must "
            "be set to True"
        ),
    )
    check_same_device(input, reserve_space, op, "input", "reserve_space")
    torch._check_type(
        reserve_space.dtype == input.dtype,
        lambda: (
            f"{op}: argument 'reserve_space' must have the dtype of input "
            f"({scalar_type_name(input.dtype)}), got {scalar_type_name(reserve_space.dtype)}"
        ),
    )
    input_c_backprop = input.new_empty(input_c.shape) if cfg.lstm else input.new_empty(())
    return (
        input.new_empty(input.shape),
        input.new_empty(input_h.shape),
        input_c_backprop,
        input.new_empty(params.shape),
    )


# ---- autograd ---------------------------------------------------------------------------------
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
    (rnn_mode, input_mode, direction, dropout, seed, seed2, num_proj, is_training, time_major) = (
        ctx.attrs
    )
    if not is_training:
        raise ValueError("To use CudnnRNNV3 in gradients, is_training must be set to True.")
    d_out = torch.zeros_like(out) if d_out is None else d_out
    d_h = torch.zeros_like(out_h) if d_h is None else d_h
    d_c = torch.zeros_like(out_c) if d_c is None else d_c
    dx, dh, dc, dp = torch.ops.tfgrads.cudnn_rnn_backprop_v3(
        x,
        h,
        c,
        params,
        lengths,
        out,
        out_h,
        out_c,
        d_out,
        d_h,
        d_c,
        reserve,
        host_reserved,
        rnn_mode,
        input_mode,
        direction,
        dropout,
        seed,
        seed2,
        num_proj,
        time_major,
    )
    if rnn_mode != "lstm":
        dc = None  # input_c is ignored outside LSTM
    return (dx, dh, dc, dp) + (None,) * 11


torch.library.register_autograd(
    "tfgrads::cudnn_rnn_v3", _rnn_backward, setup_context=_rnn_setup_context
)


# Second order: TF defines no gradient for CudnnRNNBackpropV3; ours differentiates the torch-op
# composite of the forward (_rnn_reference.py) twice, with the forward's dropout masks. The
# backprop op is linear in the three output gradients and depends on input, input_h, input_c
# and params through the recurrence; output/output_h/output_c only fix shapes.
def _rnn_backprop_setup_context(ctx, inputs, output):
    (
        x,
        h,
        c,
        p,
        lengths,
        _out,
        _oh,
        _oc,
        dy,
        dh,
        dc,
        reserve,
        _host,
        rnn_mode,
        input_mode,
        direction,
        dropout,
        _seed,
        _seed2,
        num_proj,
        time_major,
    ) = inputs
    ctx.save_for_backward(x, h, c, p, lengths, dy, dh, dc, reserve)
    ctx.attrs = (rnn_mode, input_mode, direction, dropout, num_proj, time_major)


def _rnn_backprop_backward(ctx, g_dx, g_dh, g_dc, g_dp):
    x, h, c, p, lengths, dy, dh, dc, reserve = ctx.saved_tensors
    rnn_mode, input_mode, direction, dropout, num_proj, time_major = ctx.attrs
    cfg, T, B = rnn_check_forward(
        "cudnn_rnn_backprop_v3",
        x,
        h,
        c,
        p,
        lengths,
        rnn_mode,
        input_mode,
        direction,
        dropout,
        num_proj,
        time_major,
    )
    dtype = x.dtype
    acc = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    lstm = rnn_mode == "lstm"
    with torch.enable_grad():
        leaves = [t.detach().to(acc).requires_grad_() for t in (x, h, c, p, dy, dh, dc)]
        lx, lh, lc, lp, ldy, ldh, ldc = leaves
        masks = rnn_reference.dropout_masks(cfg, reserve.detach(), T, B, acc) if dropout > 0 else []
        out, hn, cn = rnn_reference.forward(cfg, lx, lh, lc, lp, lengths, time_major, masks)
        outs, cots, wrt = [out, hn], [ldy, ldh], [lx, lh, lp]
        if lstm:
            outs.append(cn)
            cots.append(ldc)
            wrt.append(lc)
        first = torch.autograd.grad(outs, wrt, cots, create_graph=True)
        gs = [g_dx, g_dh, g_dp] + ([g_dc] if lstm else [])
        total = sum((f * g.to(acc)).sum() for f, g in zip(first, gs) if g is not None)
        second = (
            torch.autograd.grad(total, leaves, allow_unused=True)
            if torch.is_tensor(total) and total.requires_grad
            else [None] * 7
        )

    def cast(g, like):
        return None if g is None else g.to(like.dtype)

    sx, sh, sc, sp, sdy, sdh, sdc = (cast(g, t) for g, t in zip(second, (x, h, c, p, dy, dh, dc)))
    if not lstm:
        sc = sdc = None
    grads = (sx, sh, sc, sp, None, None, None, None, sdy, sdh, sdc) + (None,) * 10
    return grads[: len(ctx.needs_input_grad)]


torch.library.register_autograd(
    "tfgrads::cudnn_rnn_backprop_v3",
    _rnn_backprop_backward,
    setup_context=_rnn_backprop_setup_context,
)
