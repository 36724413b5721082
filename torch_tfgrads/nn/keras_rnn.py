"""Keras's recurrent layers (LSTM, GRU, SimpleRNN, Bidirectional) as modules that hold Keras's
variables (``kernel``, ``recurrent_kernel``, one ``bias``) as their parameters.

Where cuDNN can express the configuration (Keras's own conditions: tanh/sigmoid, no recurrent
dropout, GRU with ``reset_after=True``, masks right-padded), the forward builds the cuDNN buffer
from those parameters on every call (differentiably, as Keras's cuDNN path does) and runs this
library's ``cudnn_rnn_v3``; otherwise it runs a plain-torch step loop with the math of Keras 3's
cells. Either way training moves exactly the variables Keras moves: one bias per gate, where the
cuDNN-layout ``nn.CudnnLSTM`` trains two.
"""

from __future__ import annotations

import math

import torch

from ..ops import cudnn_rnn_canonical_to_params_v2, cudnn_rnn_v3
from .cudnn_rnn import keras_to_canonical

_GATES = {"LSTM": 4, "GRU": 3, "SimpleRNN": 1}


def _activations():
    # Imported when a module is built: torch_tfgrads.keras imports this package's modules.
    from ..keras.activations import ACTIVATIONS

    return ACTIVATIONS


def _right_padded_lengths(mask):
    """Per-row lengths [N] (int32, on the host) if ``mask`` is right-padded with every row
    non-empty (what cuDNN can run, as Keras checks before its cuDNN path), else None."""
    m = mask.detach().to("cpu", torch.bool)
    lengths = m.sum(1, dtype=torch.int32)
    steps = torch.arange(m.shape[1], dtype=torch.int32)
    if bool((lengths == 0).any()) or not torch.equal(m, steps[None, :] < lengths[:, None]):
        return None
    return lengths


class _KerasRNN(torch.nn.Module):
    keras_class = ""

    def __init__(
        self,
        input_size: int,
        units: int,
        *,
        activation: str = "tanh",
        recurrent_activation: str = "sigmoid",
        use_bias: bool = True,
        reset_after: bool = True,
        return_sequences: bool = False,
        return_state: bool = False,
        go_backwards: bool = False,
        dropout: float = 0.0,
        recurrent_dropout: float = 0.0,
        use_cudnn: bool | str = "auto",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        name = type(self).__name__
        for arg, v in (("input_size", input_size), ("units", units)):
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ValueError(f"{name}: argument '{arg}' must be a positive int, got {v!r}")
        for arg, v in (("dropout", dropout), ("recurrent_dropout", recurrent_dropout)):
            if not 0.0 <= float(v) < 1.0:
                raise ValueError(f"{name}: argument '{arg}' must be in [0, 1), got {v!r}")
        if use_cudnn not in ("auto", True, False):
            raise ValueError(
                f"{name}: argument 'use_cudnn' must be 'auto', True or False, got {use_cudnn!r}"
            )
        acts = _activations()
        for arg, v in (("activation", activation), ("recurrent_activation", recurrent_activation)):
            if v not in acts:
                raise ValueError(
                    f"{name}: argument '{arg}'={v!r} is not supported; supported: "
                    f"{', '.join(sorted(acts))}"
                )
        self.input_size, self.units = input_size, units
        self.activation, self.recurrent_activation = activation, recurrent_activation
        self.use_bias = bool(use_bias)
        self.reset_after = bool(reset_after) if self.keras_class == "GRU" else True
        self.return_sequences, self.return_state = bool(return_sequences), bool(return_state)
        self.go_backwards = bool(go_backwards)
        self.dropout, self.recurrent_dropout = float(dropout), float(recurrent_dropout)
        self.use_cudnn = use_cudnn
        like = dict(device=device, dtype=dtype)
        G = _GATES[self.keras_class]
        self.kernel = torch.nn.Parameter(torch.empty(input_size, G * units, **like))
        self.recurrent_kernel = torch.nn.Parameter(torch.empty(units, G * units, **like))
        if not self.use_bias:
            self.bias = None
        elif self.keras_class == "GRU" and self.reset_after:
            self.bias = torch.nn.Parameter(torch.empty(2, G * units, **like))
        else:
            self.bias = torch.nn.Parameter(torch.empty(G * units, **like))
        if use_cudnn is True and self.cudnn_mode is None:
            raise ValueError(
                f"{name}: use_cudnn=True, but cuDNN cannot express this configuration (it "
                "needs activation='tanh' (SimpleRNN: or 'relu'), recurrent_activation="
                "'sigmoid', recurrent_dropout=0 and, for GRU, reset_after=True)"
            )
        self.reset_parameters()

    # ---- Keras's variables ------------------------------------------------------------------
    @property
    def keras_variables(self) -> tuple[str, ...]:
        """The parameter names in Keras's variable order (``layer.weights``)."""
        return ("kernel", "recurrent_kernel") + (("bias",) if self.use_bias else ())

    def set_trainable(self, trainable: bool) -> None:
        for p in self.parameters(recurse=False):
            p.requires_grad_(bool(trainable))

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Keras's initialisers: Glorot-uniform kernel, orthogonal recurrent kernel, zero bias
        (LSTM: the forget gate's bias 1, Keras's ``unit_forget_bias``)."""
        fan_in, fan_out = self.kernel.shape
        bound = math.sqrt(6.0 / (fan_in + fan_out))
        self.kernel.uniform_(-bound, bound)
        # Keras's Orthogonal initialiser on the [U, G*U] matrix
        rk = self.recurrent_kernel
        if rk.dtype in (torch.float16, torch.bfloat16):  # no QR in half types
            rk.copy_(torch.nn.init.orthogonal_(torch.empty_like(rk, dtype=torch.float32)))
        else:
            torch.nn.init.orthogonal_(rk)
        if self.bias is not None:
            self.bias.zero_()
            if self.keras_class == "LSTM":
                self.bias[self.units : 2 * self.units] = 1.0

    def set_keras_weights(self, kernel, recurrent_kernel, bias=None) -> None:
        """Loads a Keras layer's ``get_weights()`` (shapes checked)."""
        arrays = [kernel, recurrent_kernel] + ([bias] if self.use_bias else [])
        with torch.no_grad():
            for name, a in zip(self.keras_variables, arrays):
                p = getattr(self, name)
                t = torch.as_tensor(a, dtype=p.dtype, device=p.device)
                if t.shape != p.shape:
                    raise ValueError(
                        f"{type(self).__name__}.set_keras_weights: '{name}' must have shape "
                        f"{list(p.shape)}, got {list(t.shape)}"
                    )
                p.copy_(t)

    @property
    def cudnn_mode(self) -> str | None:
        """The ``rnn_mode`` of the cuDNN op that computes this layer, or None (step loop)."""
        if self.use_cudnn is False or self.recurrent_dropout:
            return None
        if self.keras_class == "SimpleRNN":
            return {"tanh": "rnn_tanh", "relu": "rnn_relu"}.get(self.activation)
        if self.activation != "tanh" or self.recurrent_activation != "sigmoid":
            return None
        if self.keras_class == "GRU" and not self.reset_after:
            return None
        return self.keras_class.lower()

    def _bias(self):
        if self.bias is not None:
            return self.bias
        G, U = _GATES[self.keras_class], self.units
        shape = (2, G * U) if self.keras_class == "GRU" else (G * U,)
        return self.kernel.new_zeros(shape)

    def extra_repr(self):
        s = f"{self.input_size}, {self.units}"
        for k, default in (
            ("activation", "tanh"),
            ("recurrent_activation", "sigmoid"),
            ("use_bias", True),
            ("return_sequences", False),
            ("return_state", False),
            ("go_backwards", False),
            ("dropout", 0.0),
            ("recurrent_dropout", 0.0),
            ("use_cudnn", "auto"),
        ):
            if getattr(self, k) != default:
                s += f", {k}={getattr(self, k)!r}"
        if self.keras_class == "GRU" and not self.reset_after:
            s += ", reset_after=False"
        return s

    # ---- forward ----------------------------------------------------------------------------
    def _check(self, x, mask, initial_state):
        name = type(self).__name__
        if x.dim() != 3 or x.shape[2] != self.input_size:
            raise ValueError(
                f"{name}: argument 'input' must be [batch, time, {self.input_size}], got "
                f"{list(x.shape)}"
            )
        if not x.is_floating_point():
            raise TypeError(f"{name}: argument 'input' must be floating point, got {x.dtype}")
        if mask is not None and (mask.dtype != torch.bool or tuple(mask.shape) != x.shape[:2]):
            raise ValueError(
                f"{name}: argument 'mask' must be bool [batch, time] = {list(x.shape[:2])}, "
                f"got {mask.dtype} {list(mask.shape)}"
            )
        n_states = 2 if self.keras_class == "LSTM" else 1
        if initial_state is not None:
            if len(initial_state) != n_states:
                raise ValueError(
                    f"{name}: argument 'initial_state' must hold {n_states} tensors, got "
                    f"{len(initial_state)}"
                )
            for s in initial_state:
                if tuple(s.shape) != (x.shape[0], self.units):
                    raise ValueError(
                        f"{name}: argument 'initial_state' tensors must be [batch, units] = "
                        f"{[x.shape[0], self.units]}, got {list(s.shape)}"
                    )

    def _dropout_mask(self, x, rate, count):
        # Keras draws one mask per call, the same at every step: [count, batch, features]
        keep = torch.empty((count,) + tuple(x.shape), dtype=x.dtype, device=x.device)
        return keep.bernoulli_(1.0 - rate) / (1.0 - rate)

    def forward(
        self,
        input: torch.Tensor,
        mask: torch.Tensor | None = None,
        initial_state: list[torch.Tensor] | None = None,
        zero_output_for_mask: bool = False,
    ):
        """``input [batch, time, features]``; ``mask`` (bool ``[batch, time]``, Keras's): a
        masked step keeps the state and outputs the previous output (zeros with
        ``zero_output_for_mask``, as inside ``Bidirectional``). Returns the output (the last
        one, or all with ``return_sequences``; a ``go_backwards`` layer returns them in
        processing order, as Keras), then the final states with ``return_state``."""
        self._check(input, mask, initial_state)
        recurrent_masks = None
        if self.training and self.dropout and not self.recurrent_dropout:
            input = input * self._dropout_mask(input[:, 0], self.dropout, 1)[0][:, None]
        lengths = None
        cudnn = self.cudnn_mode is not None and input.shape[0] > 0
        if cudnn and mask is not None:
            lengths = _right_padded_lengths(mask)
            cudnn = lengths is not None
        if cudnn:
            y, states = self._cudnn(input, lengths, initial_state, zero_output_for_mask)
        else:
            if self.use_cudnn is True and input.shape[0] > 0:
                raise ValueError(
                    f"{type(self).__name__}: use_cudnn=True, but the mask is not right-padded "
                    "(or a row is empty); cuDNN cannot run it"
                )
            if self.training and self.recurrent_dropout:
                G = _GATES[self.keras_class]
                h_like = input.new_empty(input.shape[0], self.units)
                recurrent_masks = (
                    self._dropout_mask(input[:, 0], self.dropout, G) if self.dropout else None,
                    self._dropout_mask(h_like, self.recurrent_dropout, G),
                )
            y, states = self._loop(
                input, mask, initial_state, zero_output_for_mask, recurrent_masks
            )
        return [y, *states] if self.return_state else y

    def _canonical(self):
        return keras_to_canonical(self.cudnn_mode, self.kernel, self.recurrent_kernel, self._bias())

    def _cudnn(self, x, lengths, initial_state, zero_output_for_mask):
        if self.go_backwards:
            x = _reverse_valid(x, lengths)
        out, h, c = run_cudnn([self], x, lengths, [initial_state])
        if lengths is not None and self.return_sequences:
            out = _keras_masked_outputs(out, lengths, self.go_backwards, zero_output_for_mask)
        y = out if self.return_sequences else h[0]
        masked_last = lengths is not None and not (self.return_sequences or self.go_backwards)
        if zero_output_for_mask and masked_last:
            # the last output of a row whose last step is masked is the zero output
            full = lengths.to(y.device) == x.shape[1]
            y = y * full[:, None].to(y.dtype)
        states = [h[0], c[0]] if self.keras_class == "LSTM" else [h[0]]
        return y, states

    # ---- the step loop (Keras 3's cells) ----------------------------------------------------
    def _step(self, x, h, c, masks, t):
        act = _activations()[self.activation]
        ract = _activations()[self.recurrent_activation]
        U, kind = self.units, self.keras_class
        bias = self.bias
        if masks is not None:  # Keras's implementation=1: one dropout mask per gate
            return self._step_per_gate(x, h, c, masks, act, ract)
        if kind == "LSTM":
            z = torch.matmul(x, self.kernel) + torch.matmul(h, self.recurrent_kernel)
            if bias is not None:
                z = z + bias
            z0, z1, z2, z3 = z.split(U, dim=-1)
            c = ract(z1) * c + ract(z0) * act(z2)
            return ract(z3) * act(c), c
        if kind == "SimpleRNN":
            y = torch.matmul(x, self.kernel)
            if bias is not None:
                y = y + bias
            return act(y + torch.matmul(h, self.recurrent_kernel)), c
        if bias is None:
            input_bias = recurrent_bias = None
        elif self.reset_after:
            input_bias, recurrent_bias = bias[0], bias[1]
        else:
            input_bias, recurrent_bias = bias, None
        mx = torch.matmul(x, self.kernel)
        if input_bias is not None:
            mx = mx + input_bias
        x_z, x_r, x_h = mx.split(U, dim=-1)
        if self.reset_after:
            inner = torch.matmul(h, self.recurrent_kernel)
            if recurrent_bias is not None:
                inner = inner + recurrent_bias
        else:
            inner = torch.matmul(h, self.recurrent_kernel[:, : 2 * U])
        z = ract(x_z + inner[:, :U])
        r = ract(x_r + inner[:, U : 2 * U])
        if self.reset_after:
            rh = r * inner[:, 2 * U :]
        else:
            rh = torch.matmul(r * h, self.recurrent_kernel[:, 2 * U :])
        hh = act(x_h + rh)
        return z * h + (1 - z) * hh, c

    def _step_per_gate(self, x, h, c, masks, act, ract):
        dm, rm = masks
        U, kind = self.units, self.keras_class
        G = _GATES[kind]
        k, rk = self.kernel.split(U, dim=1), self.recurrent_kernel.split(U, dim=1)
        xs = [torch.matmul(x if dm is None else x * dm[g], k[g]) for g in range(G)]
        hs = [h * rm[g] for g in range(G)]
        bias = self.bias
        if kind == "SimpleRNN":
            y = xs[0] if bias is None else xs[0] + bias
            return act(y + torch.matmul(hs[0], rk[0])), c
        if kind == "LSTM":
            if bias is not None:
                xs = [xg + bg for xg, bg in zip(xs, bias.split(U))]
            i = ract(xs[0] + torch.matmul(hs[0], rk[0]))
            f = ract(xs[1] + torch.matmul(hs[1], rk[1]))
            c = f * c + i * act(xs[2] + torch.matmul(hs[2], rk[2]))
            o = ract(xs[3] + torch.matmul(hs[3], rk[3]))
            return o * act(c), c
        if bias is not None:
            b_in = bias[0] if self.reset_after else bias
            xs = [xg + bg for xg, bg in zip(xs, b_in.split(U))]
        rz, rr = torch.matmul(hs[0], rk[0]), torch.matmul(hs[1], rk[1])
        if self.reset_after and bias is not None:
            b_rec = bias[1].split(U)
            rz, rr = rz + b_rec[0], rr + b_rec[1]
        z, r = ract(xs[0] + rz), ract(xs[1] + rr)
        if self.reset_after:
            rh = torch.matmul(hs[2], rk[2])
            if bias is not None:
                rh = rh + bias[1].split(U)[2]
            rh = r * rh
        else:
            rh = torch.matmul(r * hs[2], rk[2])
        return z * h + (1 - z) * act(xs[2] + rh), c

    def _loop(self, x, mask, initial_state, zero_output_for_mask, masks):
        n, steps = x.shape[0], x.shape[1]
        if initial_state is not None:
            h = initial_state[0]
            c = initial_state[1] if self.keras_class == "LSTM" else None
        else:
            h = x.new_zeros(n, self.units)
            c = x.new_zeros(n, self.units) if self.keras_class == "LSTM" else None
        outs = []
        prev = zero = x.new_zeros(n, self.units)
        for t in reversed(range(steps)) if self.go_backwards else range(steps):
            h_new, c_new = self._step(x[:, t], h, c, masks, t)
            if mask is None:
                h, c, out = h_new, c_new, h_new
            else:
                m = mask[:, t, None]
                out = torch.where(m, h_new, zero if zero_output_for_mask else prev)
                h = torch.where(m, h_new, h)
                c = torch.where(m, c_new, c) if c is not None else None
            outs.append(out)
            prev = out
        y = torch.stack(outs, 1) if self.return_sequences else outs[-1]
        return y, ([h, c] if self.keras_class == "LSTM" else [h])


def run_cudnn(layers, x, lengths, initial_states):
    """``cudnn_rnn_v3`` over batch-major ``x`` for one layer (one direction) or a forward and a
    backward layer (bidirectional), the buffer built from their Keras variables. Returns the
    batch-major output ``[batch, time, directions * units]`` and the final ``h``, ``c``."""
    first = layers[0]
    weights, biases = [], []
    for layer in layers:
        w, b = layer._canonical()
        weights += w
        biases += b
    direction = "bidirectional" if len(layers) == 2 else "unidirectional"
    params = cudnn_rnn_canonical_to_params_v2(
        1,
        first.units,
        first.input_size,
        weights,
        biases,
        rnn_mode=first.cudnn_mode,
        direction=direction,
    )
    h0, c0 = _initial(x, first.units, initial_states)
    out, h, c, _, _ = cudnn_rnn_v3(
        x.transpose(0, 1),
        h0,
        c0,
        params,
        lengths,
        rnn_mode=first.cudnn_mode,
        direction=direction,
        is_training=torch.is_grad_enabled(),
        time_major=True,
    )
    return out.transpose(0, 1), h, c


def _initial(x, U, per_direction):
    """cuDNN's [directions, batch, units] initial states from each direction's Keras states
    (``[h, c]`` or ``[h]``; None: zeros)."""
    dirs = len(per_direction)
    if all(s is None for s in per_direction):
        z = x.new_zeros(dirs, x.shape[0], U)
        return z, z
    zero = x.new_zeros(x.shape[0], U)
    h = torch.stack([s[0] if s is not None else zero for s in per_direction])
    c = torch.stack([s[1] if s is not None and len(s) > 1 else zero for s in per_direction])
    return h, c


def _reverse_valid(x, lengths):
    """Each row's valid steps in reverse order (TF's reverse_sequence), padding left in place."""
    if lengths is None:
        return x.flip(1)
    T = x.shape[1]
    t = torch.arange(T, device=x.device)
    L = lengths.to(x.device, torch.long)[:, None]
    idx = torch.where(t[None] < L, L - 1 - t[None], t[None])
    return x.gather(1, idx[:, :, None].expand(-1, -1, x.shape[2]))


def _keras_masked_outputs(out, lengths, go_backwards, zero_output_for_mask):
    """Keras's outputs at masked steps from cuDNN's (which are zero past each length): Keras
    repeats the previous output there (zeros with ``zero_output_for_mask``); a ``go_backwards``
    layer meets the padding first, so its outputs start with zeros, then the valid steps."""
    T = out.shape[1]
    t = torch.arange(T, device=out.device)[None]
    L = lengths.to(out.device, torch.long)[:, None]
    if go_backwards:
        idx = (t - (T - L)).clamp(min=0)
        keep = t >= T - L
    elif zero_output_for_mask:
        return out
    else:
        idx = torch.minimum(t, L - 1)
        keep = None
    y = out.gather(1, idx[:, :, None].expand(-1, -1, out.shape[2]))
    return y if keep is None else y * keep[:, :, None].to(y.dtype)


class KerasLSTM(_KerasRNN):
    """``keras.layers.LSTM`` with Keras's variables as parameters (``kernel [I, 4U]``,
    ``recurrent_kernel [U, 4U]``, ``bias [4U]``; gates i, f, c, o).

    Example::

        lstm = torch_tfgrads.nn.KerasLSTM(8, 16, return_sequences=True)
        lstm.set_keras_weights(*keras_layer.get_weights())
        y = lstm(torch.randn(4, 10, 8), mask=lengths_mask)   # [4, 10, 16]
    """

    keras_class = "LSTM"


class KerasGRU(_KerasRNN):
    """``keras.layers.GRU`` (``reset_after`` True: ``bias [2, 3U]`` input and recurrent rows;
    False: ``bias [3U]``, step loop only); gates z, r, h."""

    keras_class = "GRU"


class KerasSimpleRNN(_KerasRNN):
    """``keras.layers.SimpleRNN`` (``bias [U]``); tanh and relu run on the cuDNN op."""

    keras_class = "SimpleRNN"
