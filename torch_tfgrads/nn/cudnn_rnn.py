"""TF's `tf.compat.v1` cuDNN RNN layers (CudnnLSTM, CudnnGRU, CudnnRNNTanh, CudnnRNNRelu) on
`cudnn_rnn_v3`, running on CPU and CUDA, with one opaque ``params`` Parameter and converters
to and from TF canonical weights, Keras LSTM/GRU/SimpleRNN weights and torch.nn.LSTM/GRU/RNN.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ..ops import cudnn_rnn_canonical_to_params_v2, cudnn_rnn_params_to_canonical_v2, cudnn_rnn_v3
from ..ops._common import check_shape as check_input
from ..ops.cudnn_rnn_config import RnnConfig

# cuDNN's GRU gates r, z, h are Keras's gates 1, 0, 2 (Keras orders z, r, h; its cuDNN path
# swaps them when it builds the cuDNN buffer); the swap is its own inverse, so the same list maps back.
_KERAS_GATE_ORDER = {"gru": [1, 0, 2]}


def keras_to_canonical(rnn_mode, kernel, recurrent_kernel, bias):
    """TF canonical ``(weights, biases)`` of a Keras LSTM / GRU(reset_after) / SimpleRNN layer,
    exactly as Keras's cuDNN path builds them (differentiable in the Keras tensors)."""
    G = {"lstm": 4, "gru": 3, "rnn_tanh": 1, "rnn_relu": 1}[rnn_mode]
    U = recurrent_kernel.shape[0]
    order = _KERAS_GATE_ORDER.get(rnn_mode, list(range(G)))

    def gates(m):  # [in, G*U] in Keras order -> G matrices [U, in] in cuDNN order
        parts = m.split(U, dim=1)
        return [parts[k].t() for k in order]

    if bias.dim() == 2:  # GRU reset_after: row 0 the input bias, row 1 the recurrent bias
        b_in, b_rec = bias[0].split(U), bias[1].split(U)
        biases = [b_in[k] for k in order] + [b_rec[k] for k in order]
    else:  # one bias: Keras feeds it as the recurrent bias, the input bias zero
        parts = bias.split(U)
        biases = [torch.zeros_like(parts[0]) for _ in range(G)] + [parts[k] for k in order]
    return gates(kernel) + gates(recurrent_kernel), biases


class _CudnnRNN(torch.nn.Module):
    _rnn_mode = None
    _torch_class = None  # (torch.nn class, nonlinearity or None)

    # TF's positional arguments (num_layers, num_units, input_mode, direction, dropout, seed);
    # TF infers the input size on the first call, here it is a required keyword.
    def __init__(
        self,
        num_layers: int,
        num_units: int,
        input_mode: str = "linear_input",
        direction: str = "unidirectional",
        dropout: float = 0.0,
        seed: int | None = None,
        *,
        input_size: int,
        time_major: bool = True,
        num_proj: int = 0,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        name = type(self).__name__
        self._cfg = RnnConfig(
            name,
            self._rnn_mode,
            input_mode,
            direction,
            int(num_layers),
            int(num_units),
            int(input_size),
            int(num_proj),
        )
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"{name}: argument 'dropout' must be in [0, 1), got {dropout}")
        self.num_layers, self.num_units, self.input_size = num_layers, num_units, input_size
        self.input_mode, self.direction, self.dropout = input_mode, direction, float(dropout)
        self.seed, self.time_major, self.num_proj = seed, bool(time_major), int(num_proj)
        self.params = torch.nn.Parameter(
            torch.empty(self._cfg.params_size(), device=device, dtype=dtype)
        )
        self.reset_parameters()

    @property
    def num_dirs(self):
        return self._cfg.D

    def _attrs(self):
        return (self._rnn_mode, self.input_mode, self.direction)

    def _counts(self):
        w, b = self._cfg.canonical_shapes()
        return len(w), len(b)

    def reset_parameters(self) -> None:
        """TF's defaults for these layers: Glorot-uniform matrices, zero biases."""
        w_shapes, b_shapes = self._cfg.canonical_shapes()
        like = dict(dtype=self.params.dtype, device=self.params.device)
        weights = []
        for fan_out, fan_in in w_shapes:
            bound = math.sqrt(6.0 / (fan_in + fan_out))
            weights.append(torch.empty(fan_out, fan_in, **like).uniform_(-bound, bound))
        self.set_canonical_weights(weights, [torch.zeros(s, **like) for s in b_shapes])

    # ---- TF canonical weights ------------------------------------------------------------------
    def canonical_weights(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """``(weights, biases)`` in TF's canonical order (`CudnnRNNParamsToCanonicalV2`);
        differentiable w.r.t. ``params``."""
        return cudnn_rnn_params_to_canonical_v2(
            self.num_layers,
            self.num_units,
            self.input_size,
            self.params,
            *self._counts(),
            *self._attrs(),
            num_proj=self.num_proj,
        )

    @torch.no_grad()
    def set_canonical_weights(
        self, weights: Sequence[torch.Tensor], biases: Sequence[torch.Tensor]
    ) -> None:
        """Loads TF canonical weights/biases (e.g. from a TF checkpoint's saveable)."""
        like = dict(dtype=self.params.dtype, device=self.params.device)
        flat = cudnn_rnn_canonical_to_params_v2(
            self.num_layers,
            self.num_units,
            self.input_size,
            [torch.as_tensor(w, **like) for w in weights],
            [torch.as_tensor(b, **like) for b in biases],
            *self._attrs(),
            num_proj=self.num_proj,
        )
        self.params.copy_(flat)

    # ---- the forward --------------------------------------------------------------------------
    def forward(
        self,
        inputs: torch.Tensor,
        initial_state: tuple[torch.Tensor, ...] | None = None,
        sequence_lengths: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """Returns ``(outputs, (h,))`` or, for LSTM, ``(outputs, (h, c))`` like TF's layers.

        ``inputs`` ``[T, B, I]`` (``[B, T, I]`` with ``time_major=False``); ``initial_state`` a
        tuple of the op's state tensors (zeros when None); ``sequence_lengths`` int32 ``[B]``.
        Dropout applies between layers in training mode; a reserve space for gradients is kept
        whenever autograd will need one, in train or eval mode.
        """
        cfg = self._cfg
        name = type(self).__name__
        layout = "[T, B, I]" if self.time_major else "[B, T, I]"
        check_input(
            inputs.dim() == 3,
            lambda: (
                f"{name}: the input must be 3-D {layout} (time_major={self.time_major}), got shape "
                f"{list(inputs.shape)}"
            ),
        )
        check_input(
            inputs.shape[2] == self.input_size,
            lambda: (
                f"{name}: argument 'input_size' is {self.input_size}, but the input of shape "
                f"{list(inputs.shape)} has {inputs.shape[2]} features on its last axis"
            ),
        )
        if inputs.dtype != self.params.dtype:
            raise TypeError(
                f"{name}: the input's dtype {inputs.dtype} is not the module's "
                f"parameter dtype {self.params.dtype}"
            )
        check_input(
            inputs.device == self.params.device,
            lambda: (
                f"{name}: the input is on {inputs.device} but the module's parameters are on "
                f"{self.params.device}"
            ),
        )
        LD = cfg.L * cfg.D
        B = inputs.shape[1] if self.time_major else inputs.shape[0]
        state_shape = (lambda w: [LD, B, w]) if self.time_major else (lambda w: [B, LD, w])
        if initial_state is None:
            h = inputs.new_zeros(state_shape(cfg.Hh))
            c = inputs.new_zeros(state_shape(cfg.U)) if cfg.lstm else None
        else:
            names = ("h", "c") if cfg.lstm else ("h",)
            if len(initial_state) < len(names):
                raise ValueError(
                    f"{name}: argument 'initial_state' must hold "
                    f"({', '.join(names)}), got {len(initial_state)} tensor(s)"
                )
            h, c = initial_state[0], (initial_state[1] if cfg.lstm else None)
            for what, t, width in (("h", h, cfg.Hh), ("c", c, cfg.U))[: len(names)]:
                check_input(
                    list(t.shape) == state_shape(width),
                    lambda: (
                        f"{name}: argument 'initial_state': {what} must have shape "
                        f"{state_shape(width)} for this input, got {list(t.shape)}"
                    ),
                )
                if t.dtype != inputs.dtype:
                    raise TypeError(
                        f"{name}: argument 'initial_state': {what} has dtype "
                        f"{t.dtype}, not the input's {inputs.dtype}"
                    )
        needs_grad = torch.is_grad_enabled() and any(
            t is not None and t.requires_grad for t in (inputs, h, c, self.params)
        )
        seed = 0 if self.seed is None else int(self.seed)
        out, out_h, out_c, _, _ = cudnn_rnn_v3(
            inputs,
            h,
            c,
            self.params,
            sequence_lengths,
            *self._attrs(),
            dropout=self.dropout if self.training else 0.0,
            seed=seed,
            seed2=0,
            num_proj=self.num_proj,
            is_training=self.training or needs_grad,
            time_major=self.time_major,
        )
        return out, ((out_h, out_c) if cfg.lstm else (out_h,))

    def extra_repr(self):
        return (
            f"num_layers={self.num_layers}, num_units={self.num_units}, "
            f"input_size={self.input_size}, direction={self.direction}, "
            f"input_mode={self.input_mode}, dropout={self.dropout}, "
            f"time_major={self.time_major}"
            + (f", num_proj={self.num_proj}" if self.num_proj else "")
        )

    # ---- torch.nn.LSTM / GRU / RNN --------------------------------------------------------------
    # The opaque layout per pseudo-layer is exactly torch's weight_ih, weight_hh, bias_ih,
    # bias_hh, weight_hr (same gate orders), each flattened.
    def _torch_names(self):
        names = []
        for layer in range(self.num_layers):
            for d in range(self.num_dirs):
                sfx = f"_l{layer}" + ("_reverse" if d else "")
                names += [f"weight_ih{sfx}", f"weight_hh{sfx}", f"bias_ih{sfx}", f"bias_hh{sfx}"]
                if self.num_proj:
                    names.append(f"weight_hr{sfx}")
        return names

    @classmethod
    def from_torch(cls, module):
        """A layer with the weights of a ``torch.nn.LSTM/GRU/RNN`` (``batch_first`` maps to
        ``time_major=False``, ``proj_size`` to ``num_proj``; no bias means zero biases)."""
        torch_cls, nonlinearity = cls._torch_class
        if not isinstance(module, torch_cls) or (
            nonlinearity and module.nonlinearity != nonlinearity
        ):
            raise TypeError(
                f"{cls.__name__}.from_torch expects a torch.nn.{torch_cls.__name__}"
                + (f" with nonlinearity='{nonlinearity}'" if nonlinearity else "")
                + f", got {module}"
            )
        p0 = next(module.parameters())
        layer = cls(
            module.num_layers,
            module.hidden_size,
            input_size=module.input_size,
            direction="bidirectional" if module.bidirectional else "unidirectional",
            dropout=module.dropout,
            time_major=not module.batch_first,
            device=p0.device,
            dtype=p0.dtype,
            **({"num_proj": module.proj_size} if cls._rnn_mode == "lstm" else {}),
        )
        state = module.state_dict()
        pieces = []
        for name in layer._torch_names():
            if name in state:
                pieces.append(state[name].reshape(-1))
            else:  # bias=False
                pieces.append(
                    torch.zeros(layer._cfg.G * layer.num_units, dtype=p0.dtype, device=p0.device)
                )
        with torch.no_grad():
            layer.params.copy_(torch.cat(pieces))
        return layer

    def to_torch(self):
        """The equivalent ``torch.nn.LSTM/GRU/RNN`` (linear_input only)."""
        if self._cfg.skip_input:
            raise ValueError(f"{type(self).__name__}.to_torch: torch has no skip_input mode")
        torch_cls, nonlinearity = self._torch_class
        kwargs = dict(
            input_size=self.input_size,
            hidden_size=self.num_units,
            num_layers=self.num_layers,
            bidirectional=self.num_dirs == 2,
            batch_first=not self.time_major,
            dropout=self.dropout,
            dtype=self.params.dtype,
            device=self.params.device,
        )
        if nonlinearity:
            kwargs["nonlinearity"] = nonlinearity
        if self.num_proj:
            kwargs["proj_size"] = self.num_proj
        module = torch_cls(**kwargs)
        state, off = {}, 0
        for name in self._torch_names():
            shape = getattr(module, name).shape
            n = math.prod(shape)
            state[name] = self.params.detach()[off : off + n].view(shape)
            off += n
        module.load_state_dict(state)
        return module

    # ---- Keras -----------------------------------------------------------------------------------
    def _check_keras(self, what):
        if self.num_layers != 1 or self.num_dirs != 1 or self.num_proj or self._cfg.skip_input:
            raise ValueError(
                f"{type(self).__name__}.{what}: Keras layers hold one "
                "unidirectional linear_input layer without projection"
            )

    def set_keras_weights(self, kernel, recurrent_kernel, bias):
        """Loads a Keras layer's ``get_weights()``: LSTM ``kernel [I, 4U]``, ``recurrent_kernel
        [U, 4U]``, ``bias [4U]`` (taken as the recurrent bias, the input bias zero, as Keras's
        cuDNN path does); GRU (``reset_after=True``) with ``bias [2, 3U]`` (input, recurrent);
        SimpleRNN (CudnnRNNTanh/Relu) with ``bias [U]``."""
        self._check_keras("set_keras_weights")
        like = dict(dtype=self.params.dtype, device=self.params.device)
        self.set_canonical_weights(
            *keras_to_canonical(
                self._rnn_mode,
                *(torch.as_tensor(t, **like) for t in (kernel, recurrent_kernel, bias)),
            )
        )

    def keras_weights(self):
        """``[kernel, recurrent_kernel, bias]`` for the matching Keras layer (LSTM and
        SimpleRNN: the two biases summed; GRU: both kept, ``reset_after=True``)."""
        self._check_keras("keras_weights")
        G = self._cfg.G
        order = _KERAS_GATE_ORDER.get(self._rnn_mode, list(range(G)))
        with torch.no_grad():
            w, b = self.canonical_weights()
        kernel = torch.cat([w[k].t() for k in order], dim=1)
        recurrent = torch.cat([w[G + k].t() for k in order], dim=1)
        b_in = torch.cat([b[k] for k in order])
        b_rec = torch.cat([b[G + k] for k in order])
        bias = torch.stack([b_in, b_rec]) if self._rnn_mode == "gru" else b_in + b_rec
        return [kernel, recurrent, bias]


class CudnnLSTM(_CudnnRNN):
    """``tf.compat.v1.keras``/contrib ``CudnnLSTM``: gates i, f, c, o; optional ``num_proj``."""

    _rnn_mode = "lstm"
    _torch_class = (torch.nn.LSTM, None)


class CudnnGRU(_CudnnRNN):
    """``CudnnGRU``: cuDNN's GRU (reset gate after the recurrent matmul; Keras
    ``reset_after=True``)."""

    _rnn_mode = "gru"
    _torch_class = (torch.nn.GRU, None)


class CudnnRNNTanh(_CudnnRNN):
    """``CudnnRNNTanh``: h' = tanh(W x + bW + R h + bR) (Keras SimpleRNN, torch.nn.RNN)."""

    _rnn_mode = "rnn_tanh"
    _torch_class = (torch.nn.RNN, "tanh")


class CudnnRNNRelu(_CudnnRNN):
    """``CudnnRNNRelu``: h' = relu(W x + bW + R h + bR)."""

    _rnn_mode = "rnn_relu"
    _torch_class = (torch.nn.RNN, "relu")
