"""Public functions: one per op, TF's argument names and defaults, autograd-enabled.

Each is a thin wrapper over `torch.ops.tfgrads.<op>.default` that only fills in conveniences
(e.g. `mean=None`); the semantics are the op's (see ../shared/API.md and README.md).
"""
import torch

from ._rnn_config import RnnConfig


def _empty_stats(x):
    dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    return x.new_empty((0,), dtype=dtype)


def fused_batch_norm_v3(x, scale, offset, mean=None, variance=None, epsilon=1e-4,
                        exponential_avg_factor=1.0, data_format="NHWC", is_training=True):
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
        x, scale, offset, mean, variance, epsilon, exponential_avg_factor, data_format,
        is_training)


def fused_batch_norm_grad_v3(y_backprop, x, scale, reserve_space_1, reserve_space_2,
                             reserve_space_3=None, epsilon=1e-4, data_format="NHWC",
                             is_training=True):
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
        y_backprop, x, scale, reserve_space_1, reserve_space_2, reserve_space_3, epsilon,
        data_format, is_training)


# ---- FractionalPool family --------------------------------------------------------------------
def _ratio_list(pooling_ratio):
    return [float(r) for r in pooling_ratio]


def _shape_list(shape, op):
    """`orig_input_tensor_shape` as TF takes it: a tensor, list or torch.Size of 4 ints."""
    if isinstance(shape, torch.Tensor):
        if shape.dim() != 1 or shape.numel() != 4:
            raise RuntimeError(f"{op}: argument 'orig_input_tensor_shape': original input "
                               "tensor shape must be1-dimensional and 4 elements")
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


def fractional_avg_pool(value, pooling_ratio, pseudo_random=False, overlapping=False,
                        deterministic=False, seed=0, seed2=0):
    return torch.ops.tfgrads.fractional_avg_pool.default(
        value, _ratio_list(pooling_ratio), pseudo_random, overlapping, deterministic, seed, seed2)


def fractional_max_pool(value, pooling_ratio, pseudo_random=False, overlapping=False,
                        deterministic=False, seed=0, seed2=0):
    return torch.ops.tfgrads.fractional_max_pool.default(
        value, _ratio_list(pooling_ratio), pseudo_random, overlapping, deterministic, seed, seed2)


fractional_avg_pool.__doc__ = _POOL_DOC.replace("{Kind}", "Avg") + """
    Each output is the mean of its cell, summed in TF's order in value's dtype (float32 for
    half types) and divided once by the cell size; integers divide with C++ truncation.
    """
fractional_max_pool.__doc__ = _POOL_DOC.replace("{Kind}", "Max") + """
    Each output is the maximum of its cell (NaN inputs are skipped, as on TF's CPU).
    """


def fractional_avg_pool_grad(orig_input_tensor_shape, out_backprop, row_pooling_sequence,
                             col_pooling_sequence, overlapping=False):
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
        _shape_list(orig_input_tensor_shape, op), out_backprop,
        _sequence(row_pooling_sequence, out_backprop),
        _sequence(col_pooling_sequence, out_backprop), overlapping)


def fractional_max_pool_grad(orig_input, orig_output, out_backprop, row_pooling_sequence,
                             col_pooling_sequence, overlapping=False):
    """TF's `FractionalMaxPoolGrad`: routes each ``out_backprop`` value to its cell's maximum.

    The maximum is recomputed from ``orig_input`` (the first one in scan order wins ties, as in
    TF) and must equal ``orig_output``. Values routed to the same input element add up (in TF's
    order). Differentiable w.r.t. ``out_backprop``.
    """
    return torch.ops.tfgrads.fractional_max_pool_grad.default(
        orig_input, orig_output, out_backprop, _sequence(row_pooling_sequence, orig_input),
        _sequence(col_pooling_sequence, orig_input), overlapping)


def fractional_pooling_sequence(input_length, output_length, pseudo_random=False, seed=0,
                                seed2=0):
    """TF's pooling sequence for one axis: ``output_length + 1`` cumulative cell boundaries.

    Generated on a fresh Philox stream for ``(seed, seed2)``, so this is the *row* sequence of
    the pool ops with the same seeds; their column sequence continues the same stream after the
    rows. Seeds ``(0, 0)`` draw from torch's default generator. Returns a CPU int64 tensor.
    """
    return torch.ops.tfgrads.fractional_pooling_sequence.default(
        int(input_length), int(output_length), bool(pseudo_random), int(seed), int(seed2))


# ---- DepthwiseConv2dNative family -------------------------------------------------------------
def _sizes_list(sizes, op, name, tf_op):
    """`input_sizes` / `filter_sizes` as TF takes them: an int tensor (1-D), list or Size."""
    if isinstance(sizes, torch.Tensor):
        if sizes.dim() != 1:
            raise ValueError(f"{op}: argument '{name}': {tf_op}: {name} input must be 1-dim, "
                             f"not {sizes.dim()}")
        if sizes.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"{op}: argument '{name}' must be an int32 or int64 tensor, got "
                             f"{sizes.dtype}")
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


def depthwise_conv2d_native(input, filter, strides, padding, explicit_paddings=(),
                            data_format="NHWC", dilations=(1, 1, 1, 1)):
    return torch.ops.tfgrads.depthwise_conv2d_native.default(
        input, filter, list(strides), padding, list(explicit_paddings), data_format,
        list(dilations))


def depthwise_conv2d_native_backprop_input(input_sizes, filter, out_backprop, strides, padding,
                                           explicit_paddings=(), data_format="NHWC",
                                           dilations=(1, 1, 1, 1)):
    op = "depthwise_conv2d_native_backprop_input"
    return torch.ops.tfgrads.depthwise_conv2d_native_backprop_input.default(
        _sizes_list(input_sizes, op, "input_sizes", "Conv2DBackpropInput"), filter,
        out_backprop, list(strides), padding, list(explicit_paddings), data_format,
        list(dilations))


def depthwise_conv2d_native_backprop_filter(input, filter_sizes, out_backprop, strides, padding,
                                            explicit_paddings=(), data_format="NHWC",
                                            dilations=(1, 1, 1, 1)):
    op = "depthwise_conv2d_native_backprop_filter"
    return torch.ops.tfgrads.depthwise_conv2d_native_backprop_filter.default(
        input, _sizes_list(filter_sizes, op, "filter_sizes", "Conv2DBackpropFilter"),
        out_backprop, list(strides), padding, list(explicit_paddings), data_format,
        list(dilations))


depthwise_conv2d_native.__doc__ = """TF's `DepthwiseConv2dNative`: a depthwise 2-D convolution.

    Output ``[N, Ho, Wo, C*M]`` (NCHW: ``[N, C*M, Ho, Wo]``), sizes by TF's kernel rule
    (truncating division: a VALID window a little larger than the input gives an empty output).
    Differentiable w.r.t. ``input`` and ``filter`` (through the two backprop ops).
""" + _DW_ATTRS_DOC
depthwise_conv2d_native_backprop_input.__doc__ = """TF's `DepthwiseConv2dNativeBackpropInput`:
    the gradient w.r.t. the input of a depthwise convolution.

    ``input_sizes`` is the full 4-D input shape in ``data_format`` order (tensor, list or
    ``torch.Size``); ``out_backprop`` must have the forward's output shape. Honours
    ``dilations`` (TF's kernel silently computes the undilated gradient). Empty inputs give
    zeros. Differentiable w.r.t. ``filter`` and ``out_backprop``.
""" + _DW_ATTRS_DOC
depthwise_conv2d_native_backprop_filter.__doc__ = """TF's
    `DepthwiseConv2dNativeBackpropFilter`: the gradient w.r.t. the filter of a depthwise
    convolution.

    ``filter_sizes`` is ``[fh, fw, C, M]`` (tensor, list or ``torch.Size``). Honours
    ``dilations`` (TF's kernel does not); an empty ``out_backprop`` gives zeros (TF returns
    uninitialised memory). Summed in a fixed order: deterministic. Differentiable w.r.t.
    ``input`` and ``out_backprop``.
""" + _DW_ATTRS_DOC


# ---- CudnnRNN family --------------------------------------------------------------------------
_RNN_ATTRS_DOC = """
    ``rnn_mode``: "lstm" (gates i, f, c, o), "gru" (r, z, h; the reset gate applied after the
    recurrent matmul, Keras ``reset_after=True``), "rnn_tanh", "rnn_relu". ``input_mode``:
    "linear_input"; "skip_input" (input_size == num_units: layer 0 adds x to every gate instead
    of W x, and the buffer has no layer-0 input matrices); "auto_select" (skip_input exactly
    when input_size == num_units). ``direction``: "unidirectional" or "bidirectional".
    ``num_proj`` > 0 (LSTM only): h = Wp (o * tanh(c)), Wp ``[num_proj, num_units]``.
"""


def _scalar_int(v, op, name):
    """TF's size inputs are host int32 scalars; accept ints and 0-d integer tensors."""
    if isinstance(v, torch.Tensor):
        if v.dim() != 0:
            raise ValueError(f"{op}: {name} is not a scalar (got shape {list(v.shape)})")
        return int(v.item())
    return v if isinstance(v, torch.SymInt) else int(v)


def cudnn_rnn_params_size(num_layers, num_units, input_size, rnn_mode="lstm",
                          input_mode="linear_input", direction="unidirectional", num_proj=0):
    """TF's `CudnnRNNParamsSize`: the number of elements of the opaque params buffer.

    For linear_input this equals the parameter count of the matching ``torch.nn.LSTM/GRU/RNN``
    (``proj_size=num_proj``). Returns a Python int (TF returns a ``[1]`` tensor).
    """
    op = "cudnn_rnn_params_size"
    cfg = RnnConfig(op, rnn_mode, input_mode, direction, _scalar_int(num_layers, op, "num_layers"),
                    _scalar_int(num_units, op, "num_units"),
                    _scalar_int(input_size, op, "input_size"), int(num_proj))
    return cfg.params_size()


def cudnn_rnn_canonical_to_params_v2(num_layers, num_units, input_size, weights, biases,
                                     rnn_mode="lstm", input_mode="linear_input",
                                     direction="unidirectional", num_proj=0):
    """TF's `CudnnRNNCanonicalToParamsV2`: canonical weights and biases -> the opaque buffer.

    ``weights`` per pseudo-layer (layer-major, forward before backward): G gate input matrices
    ``[U, in]``, G recurrent matrices ``[U, Hh]``, then ``Wp [P, U]`` with projection; ``biases``
    per pseudo-layer: G input biases then G recurrent biases, each ``[U]``. The buffer holds,
    per pseudo-layer, the matrices, the biases, then the projection: for one unidirectional
    layer exactly what Keras/TF build, so TF checkpoints load unchanged. Differentiable.
    """
    op = "cudnn_rnn_canonical_to_params_v2"
    if len(weights) == 0:  # the dispatcher needs a tensor to pick a device
        raise ValueError(f"{op}: argument 'weights' must not be empty")
    return torch.ops.tfgrads.cudnn_rnn_canonical_to_params_v2.default(
        _scalar_int(num_layers, op, "num_layers"), _scalar_int(num_units, op, "num_units"),
        _scalar_int(input_size, op, "input_size"), list(weights), list(biases), rnn_mode,
        input_mode, direction, int(num_proj))


def cudnn_rnn_params_to_canonical_v2(num_layers, num_units, input_size, params,
                                     num_params_weights, num_params_biases, rnn_mode="lstm",
                                     input_mode="linear_input", direction="unidirectional",
                                     num_proj=0):
    """TF's `CudnnRNNParamsToCanonicalV2`: the exact inverse of the canonical -> params op.

    Returns ``(weights, biases)`` lists (copies, in the order described there); the counts
    must be ``L*D*(2G + [P>0])`` and ``L*D*2G`` (TF's checks and messages). Differentiable.
    """
    op = "cudnn_rnn_params_to_canonical_v2"
    w, b = torch.ops.tfgrads.cudnn_rnn_params_to_canonical_v2.default(
        _scalar_int(num_layers, op, "num_layers"), _scalar_int(num_units, op, "num_units"),
        _scalar_int(input_size, op, "input_size"), params, int(num_params_weights),
        int(num_params_biases), rnn_mode, input_mode, direction, int(num_proj))
    return list(w), list(b)


def _lengths(sequence_lengths, input, time_major):
    if sequence_lengths is not None:
        return sequence_lengths
    T, B = (input.shape[0], input.shape[1]) if time_major else (input.shape[1], input.shape[0])
    return torch.full((B,), T, dtype=torch.int32, device=input.device)


def cudnn_rnn_v3(input, input_h, input_c, params, sequence_lengths=None, rnn_mode="lstm",
                 input_mode="linear_input", direction="unidirectional", dropout=0.0, seed=0,
                 seed2=0, num_proj=0, is_training=True, time_major=True):
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
        input, input_h, input_c, params, _lengths(sequence_lengths, input, time_major), rnn_mode,
        input_mode, direction, float(dropout), int(seed), int(seed2), int(num_proj),
        bool(is_training), bool(time_major))


def cudnn_rnn_backprop_v3(input, input_h, input_c, params, sequence_lengths, output, output_h,
                          output_c, output_backprop, output_h_backprop, output_c_backprop,
                          reserve_space, host_reserved, rnn_mode="lstm",
                          input_mode="linear_input", direction="unidirectional", dropout=0.0,
                          seed=0, seed2=0, num_proj=0, time_major=True):
    """TF's `CudnnRNNBackpropV3`: gradients of ``<output_backprop, output> + <output_h_backprop,
    output_h> + <output_c_backprop, output_c>`` w.r.t. (input, input_h, input_c, params), the
    last in the opaque layout. Needs the ``reserve_space`` of the training-mode forward with the
    same arguments (its size is checked); output_backprop past a sequence's length is ignored.
    """
    if input_c is None:
        input_c = input.new_zeros(())
    return torch.ops.tfgrads.cudnn_rnn_backprop_v3.default(
        input, input_h, input_c, params, _lengths(sequence_lengths, input, time_major), output,
        output_h, output_c, output_backprop, output_h_backprop, output_c_backprop, reserve_space,
        host_reserved, rnn_mode, input_mode, direction, float(dropout), int(seed), int(seed2),
        int(num_proj), bool(time_major))


for _f in (cudnn_rnn_params_size, cudnn_rnn_canonical_to_params_v2,
           cudnn_rnn_params_to_canonical_v2, cudnn_rnn_v3, cudnn_rnn_backprop_v3):
    _f.__doc__ += _RNN_ATTRS_DOC
