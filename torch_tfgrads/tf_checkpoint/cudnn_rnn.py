"""A TF 1 CudnnRNN layer's weights from a checkpoint into `torch_tfgrads.nn.CudnnLSTM/GRU/...`.

TF 1's `tf.contrib.cudnn_rnn.CudnnLSTM` (and GRU, RNNTanh, RNNRelu) keeps its weights in one
variable `<scope>/opaque_kernel`, the 1-D cuDNN parameter buffer. `tf.compat.v1.train.Saver`
saved that variable as it is, and also (through the layer's `CudnnOpaqueParamsSaveable`) the
same weights in "TF canonical" form, the form of the CPU cells `CudnnCompatibleLSTMCell` /
`CudnnCompatibleGRUCell` / `BasicRNNCell`, under

    <scope>/rnn/multi_rnn_cell/cell_<i>/<cell>/...                              (unidirectional)
    <scope>/stack_bidirectional_rnn/cell_<i>/bidirectional_rnn/{fw,bw}/<cell>/... (bidirectional)

with, per layer and direction, LSTM: `kernel [in+U, 4U]` (gates i, c, f, o) and `bias [4U]`
(input plus recurrent bias); GRU: `gates/kernel [in+U, 2U]`, `gates/bias [2U]` (summed),
`candidate/input_projection/{kernel,bias}`, `candidate/hidden_projection/{kernel,bias}`; simple
RNNs: `kernel [in+U, U]`, `bias [U]` (summed). The torch modules keep TF's opaque layout, so the
buffer is copied as it is; the canonical form is converted back as TF 1's saveable restored it
(`_tf_to_cudnn_weights`, `_tf_to_cudnn_biases`: a summed bias is split into two halves).
"""

from __future__ import annotations

import os

import torch

_CELLS = {
    "lstm": "cudnn_compatible_lstm_cell",
    "gru": "cudnn_compatible_gru_cell",
    "rnn_tanh": "basic_rnn_cell",
    "rnn_relu": "basic_rnn_cell",
}


def _describe(module):
    return (
        f"{type(module).__name__}(num_layers={module.num_layers}, num_units={module.num_units}, "
        f"input_size={module.input_size}, direction={module.direction!r}, "
        f"input_mode={module.input_mode!r}, num_proj={module.num_proj})"
    )


def _opaque_key(keys, scope):
    if scope is not None:
        key = f"{scope.rstrip('/')}/opaque_kernel"
        return key if key in keys else None
    found = [k for k in keys if k == "opaque_kernel" or k.endswith("/opaque_kernel")]
    if len(found) > 1:
        raise KeyError(
            f"load_cudnn_rnn: several CudnnRNN buffers {sorted(found)}; pass scope= (e.g. "
            f"{found[0].rsplit('/', 1)[0]!r})"
        )
    return found[0] if found else None


def _canonical_names(module, scope):
    cell = _CELLS[module._rnn_mode]
    names = []
    for layer in range(module.num_layers):
        if module.num_dirs == 1:
            prefixes = [f"rnn/multi_rnn_cell/cell_{layer}/{cell}"]
        else:
            prefixes = [
                f"stack_bidirectional_rnn/cell_{layer}/bidirectional_rnn/{d}/{cell}"
                for d in ("fw", "bw")
            ]
        for p in prefixes:
            p = f"{scope.rstrip('/')}/{p}" if scope else p
            if module._rnn_mode == "gru":
                parts = (
                    "gates/kernel",
                    "candidate/input_projection/kernel",
                    "candidate/hidden_projection/kernel",
                    "gates/bias",
                    "candidate/input_projection/bias",
                    "candidate/hidden_projection/bias",
                )
            else:
                parts = ("kernel", "bias")
            names.append((layer, [f"{p}/{n}" for n in parts]))
    return names


def _from_canonical(module, layer, tensors):
    """TF 1's `_tf_to_cudnn_weights` + `_tf_to_cudnn_biases` for one layer and direction."""
    U = module.num_units
    width = module.input_size if layer == 0 else U * module.num_dirs
    mode = module._rnn_mode
    if mode == "gru":
        W_ir, w_h, r_h, b_ir, b_wh, b_rh = tensors
        W_i, W_r = W_ir.t().chunk(2, 0)
        weights = [W_i[:, :width], W_r[:, :width], w_h.t(), W_i[:, width:], W_r[:, width:], r_h.t()]
        half = b_ir * 0.5
        b_wi, b_wr = half.chunk(2, 0)
        return weights, [b_wi, b_wr, b_wh, b_wi.clone(), b_wr.clone(), b_rh]
    kernel, bias = tensors
    w = kernel.t()
    if mode == "lstm":
        i, c, f, o = w.chunk(4, 0)  # TF's i, c, f, o -> cuDNN's i, f, c, o
        gates = [i, f, c, o]
        bi, bc, bf, bo = (bias * 0.5).chunk(4, 0)
        half = [bi, bf, bc, bo]
    else:
        gates, half = [w], [bias * 0.5]
    weights = [g[:, :width] for g in gates] + [g[:, width:] for g in gates]
    return weights, half + [b.clone() for b in half]


def load_cudnn_rnn(module, prefix, scope=None, source="auto") -> list[str]:
    """Fill a `torch_tfgrads.nn.CudnnLSTM/CudnnGRU/CudnnRNNTanh/CudnnRNNRelu` from a TF 1
    checkpoint of a `tf.contrib.cudnn_rnn` layer; returns the checkpoint keys used.

    `scope` is the layer's variable scope (e.g. "cudnn_lstm", "model/encoder/cudnn_gru"); without
    it the checkpoint must hold one `*/opaque_kernel`. `source`: "opaque" copies the buffer
    `<scope>/opaque_kernel` as stored (bit for bit; its size must be
    `cudnn_rnn_params_size(...)` of the module's configuration), "canonical" converts the
    canonical tensors TF 1 saved beside it, "auto" takes the buffer when there is one. Every
    tensor is read and checked before `module.params` changes.
    """
    from ..ops import cudnn_rnn_params_size
    from . import _prefix, list_variables, read

    if source not in ("auto", "opaque", "canonical"):
        raise ValueError(f"load_cudnn_rnn: source must be auto, opaque or canonical, {source!r}")
    if module.num_proj and source != "opaque":
        source = "opaque"  # TF 1's saveable has no projection; only the buffer holds it
    prefix = _prefix(os.fspath(prefix))
    shapes = dict(list_variables(prefix))
    key = _opaque_key(shapes, scope) if source != "canonical" else None
    params = module.params
    if key is not None:
        expected = cudnn_rnn_params_size(
            module.num_layers,
            module.num_units,
            module.input_size,
            module._rnn_mode,
            module.input_mode,
            module.direction,
            module.num_proj,
        )
        value = read(prefix, [key])[key]
        if value.dtype != params.dtype:
            raise TypeError(
                f"load_cudnn_rnn: {key!r} is {value.dtype}, the module's params {params.dtype}"
            )
        if value.dim() != 1 or value.numel() != expected:
            raise ValueError(
                f"load_cudnn_rnn: {key!r} has shape {list(value.shape)}; {_describe(module)} "
                f"needs {expected} elements (cudnn_rnn_params_size). The checkpoint is of "
                "another configuration, or its buffer was laid out by a cuDNN version that pads "
                "it; load the canonical tensors saved beside it with source='canonical'"
            )
        with torch.no_grad():
            params.copy_(value.to(params.device))
        return [key]
    if source == "opaque":
        where = f"{scope}/opaque_kernel" if scope else "*/opaque_kernel"
        raise KeyError(f"load_cudnn_rnn: no {where!r} in {prefix}")
    if scope is None:
        cell = _CELLS[module._rnn_mode]
        scopes = sorted(
            {k.split("/rnn/multi_rnn_cell/")[0] for k in shapes if "/rnn/multi_rnn_cell/" in k}
            | {k.split("/stack_bidirectional_rnn/")[0] for k in shapes if "stack_bidir" in k}
        )
        scopes = [s for s in scopes if any(k.startswith(s + "/") and cell in k for k in shapes)]
        if len(scopes) != 1:
            raise KeyError(
                f"load_cudnn_rnn: {'no' if not scopes else 'several'} {type(module).__name__} "
                f"weights in {prefix} {scopes or ''}; pass scope="
            )
        scope = scopes[0]
    if module.input_mode != "linear_input":
        raise ValueError(
            f"load_cudnn_rnn: the canonical tensors are converted for input_mode='linear_input' "
            f"only; {_describe(module)} (load the opaque buffer instead)"
        )
    plan = _canonical_names(module, scope)
    missing = [n for _, names in plan for n in names if n not in shapes]
    if missing:
        raise KeyError(
            f"load_cudnn_rnn: {prefix} lacks {missing[:4]}{' ...' if len(missing) > 4 else ''} "
            f"for {_describe(module)}"
        )
    tensors = read(prefix, [n for _, names in plan for n in names])
    weights, biases = [], []
    for layer, names in plan:
        ts = [tensors[n] for n in names]
        for n, t in zip(names, ts):
            if t.dtype != params.dtype:
                raise TypeError(f"load_cudnn_rnn: {n!r} is {t.dtype}, the params {params.dtype}")
        try:
            w, b = _from_canonical(module, layer, ts)
        except (ValueError, RuntimeError) as e:
            raise ValueError(f"load_cudnn_rnn: {names[0]!r}: {e}") from None
        weights += w
        biases += b
    w_shapes, b_shapes = module._cfg.canonical_shapes()
    for i, (t, s) in enumerate(zip(weights + biases, list(w_shapes) + list(b_shapes))):
        if tuple(t.shape) != tuple(s if isinstance(s, (tuple, list)) else (s,)):
            raise ValueError(
                f"load_cudnn_rnn: the canonical tensors in {prefix} under {scope!r} do not fit "
                f"{_describe(module)} (tensor {i}: {list(t.shape)}, expected {list(s)})"
            )
    module.set_canonical_weights(
        [w.contiguous().to(params.device) for w in weights],
        [b.contiguous().to(params.device) for b in biases],
    )
    return [n for _, names in plan for n in names]
