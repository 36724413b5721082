"""CudnnRNN family: CudnnRNNV3, its backprop, the params size and the params conversions.

Public functions (TF's argument names and defaults), the fake kernels (the checks of
csrc/common/cudnn_rnn.cpp with the same messages) and the autograd formulas (TF's
`_cudnn_rnn_backwardv3`, adjoint conversions, and a composite second order). The contract is in
docs/ops/cudnn_rnn.md.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from . import cudnn_rnn_reference as rnn_reference
from ._common import scalar_type_name, tf_shape
from .cudnn_rnn_config import GATES, RnnConfig, reserve_numel

# ---- public functions -------------------------------------------------------------------------
_RNN_ATTRS_DOC = """
    ``rnn_mode``: "lstm" (gates i, f, c, o), "gru" (r, z, h; the reset gate applied after the
    recurrent matmul, Keras ``reset_after=True``), "rnn_tanh", "rnn_relu". ``input_mode``:
    "linear_input"; "skip_input" (input_size == num_units: layer 0 adds x to every gate instead
    of W x, and the buffer has no layer-0 input matrices); "auto_select" (skip_input exactly
    when input_size == num_units). ``direction``: "unidirectional" or "bidirectional".
    ``num_proj`` > 0 (LSTM only): h = Wp (o * tanh(c)), Wp ``[num_proj, num_units]``.
"""


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


def _lengths(sequence_lengths, input, time_major):
    if sequence_lengths is not None:
        return sequence_lengths
    T, B = (input.shape[0], input.shape[1]) if time_major else (input.shape[1], input.shape[0])
    # On the host, where TF keeps them too: the kernels read the lengths on the host, so a
    # device tensor would cost a device-to-host copy (a stream sync) in forward and backward.
    return torch.full((B,), T, dtype=torch.int32)


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


for _f in (
    cudnn_rnn_params_size,
    cudnn_rnn_canonical_to_params_v2,
    cudnn_rnn_params_to_canonical_v2,
    cudnn_rnn_v3,
    cudnn_rnn_backprop_v3,
):
    _f.__doc__ += _RNN_ATTRS_DOC


# ---- fake kernels -----------------------------------------------------------------------------
_RNN_FWD = "cudnn_rnn_v3"
_RNN_BWD = "cudnn_rnn_backprop_v3"
_RNN_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _check_dtype_like(op, input, t, name):
    # check_like of csrc/common/cudnn_rnn.cpp: the dtype (TypeError), then the device.
    torch._check_type(
        t.dtype == input.dtype,
        lambda: (
            f"{op}: argument '{name}' must have the dtype of input ({scalar_type_name(input.dtype)}), "
            f"got {scalar_type_name(t.dtype)}"
        ),
    )
    _check_device(op, input, "input", t, name)


def _check_device(op, ref, ref_name, t, name):
    torch._check(
        t.device == ref.device,
        lambda: (
            f"{op}: argument '{name}' is on {t.device} but '{ref_name}' is on {ref.device}; all "
            "tensors must be on one device"
        ),
    )


def _check_float(op, t, name):
    torch._check_type(
        t.dtype in _RNN_DTYPES,
        lambda: (
            f"{op}: argument '{name}' must be a float16, bfloat16, float32 or float64 tensor, got "
            f"{scalar_type_name(t.dtype)}"
        ),
    )


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
    _check_float(op, input, "input")
    _check_dtype_like(op, input, input_h, "input_h")
    if cfg.lstm:
        _check_dtype_like(op, input, input_c, "input_c")
    _check_dtype_like(op, input, params, "params")
    torch._check(
        params.dim() == 1,
        lambda: f"{op}: argument 'params' must be 1-D, got shape {tf_shape(params.shape)}",
    )
    expected = cfg.params_size()
    torch._check(
        params.shape[0] == expected,
        lambda: (
            f"{op}: argument 'params' has {params.shape[0]} elements but cudnn_rnn_params_size of "
            f"this configuration is {expected}"
        ),
    )
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
    _check_device(op, input, "input", reserve_space, "reserve_space")
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


def _config_text(cfg):
    return (
        f"num_layers={cfg.L}, num_units={cfg.U}, input_size={cfg.I}, directions={cfg.D}, "
        f"num_proj={cfg.P}"
    )


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
        ref.dtype in _RNN_DTYPES,
        lambda: (
            f"{op}: argument 'weights' must hold float16, bfloat16, float32 or float64 tensors, got "
            f"{scalar_type_name(ref.dtype)}"
        ),
    )
    w_shapes, b_shapes = cfg.canonical_shapes()
    for name, ts, shapes in (("weights", weights, w_shapes), ("biases", biases, b_shapes)):
        torch._check(
            len(ts) == len(shapes),
            lambda: (
                f"{op}: argument '{name}': expected {len(shapes)} tensors for this configuration "
                f"({_config_text(cfg)}), got {len(ts)}"
            ),
        )
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
            _check_device(op, ref, "weights[0]", t, name)
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
    w_shapes, b_shapes = cfg.canonical_shapes()
    LD = cfg.L * cfg.D
    torch._check_value(
        num_params_weights >= 1 and num_params_biases >= 1,
        lambda: f"{op}: num_params_weights and num_params_biases must be >= 1",
    )
    if not cfg.skip_input:
        torch._check_value(
            num_params_weights % LD == 0,
            lambda: f"{op}: Number of params (weights) is not a multipleof num_layers * num_dirs.",
        )
        torch._check_value(
            num_params_biases % LD == 0,
            lambda: f"{op}: Number of params (biases) is not a multipleof num_layers * num_dirs.",
        )
        per_layer = num_params_weights // LD
        if cfg.P == 0:
            torch._check_value(
                per_layer % 2 == 0,
                lambda: (
                    f"{op}: Number of params (weights) per layer is notan even number with no "
                    "projection."
                ),
            )
        else:
            torch._check_value(
                per_layer % 2 == 1,
                lambda: (
                    f"{op}: Number of params (weights) per layer is notan odl number with "
                    "projection."
                ),
            )
    torch._check_value(
        num_params_weights == len(w_shapes),
        lambda: (
            f"{op}: C Number of params mismatch. Expected {num_params_weights}, got {len(w_shapes)}"
        ),
    )
    torch._check_value(
        num_params_biases == len(b_shapes),
        lambda: (
            f"{op}: A Number of params mismatch. Expected {num_params_biases}, got {len(b_shapes)}"
        ),
    )
    torch._check(
        params.dim() == 1,
        lambda: f"{op}: argument 'params' must be 1-D, got shape {tf_shape(params.shape)}",
    )
    expected = cfg.params_size()
    torch._check(
        params.shape[0] == expected,
        lambda: (
            f"{op}: argument 'params' has {params.shape[0]} elements but cudnn_rnn_params_size of "
            f"this configuration ({_config_text(cfg)}) is {expected}"
        ),
    )
    _check_float(op, params, "params")
    return ([params.new_empty(s) for s in w_shapes], [params.new_empty(s) for s in b_shapes])


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
