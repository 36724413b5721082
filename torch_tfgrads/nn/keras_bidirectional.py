"""Keras's ``Bidirectional`` over the Keras-faithful recurrent modules of ``keras_rnn``: both
directions in one bidirectional call of the cuDNN op when they can run there, else each
direction on its own."""

from __future__ import annotations

import torch

from .keras_rnn import _KerasRNN, _right_padded_lengths, run_cudnn


class KerasBidirectional(torch.nn.Module):
    """``keras.layers.Bidirectional`` over two of the modules above: parameters
    ``forward_layer.*`` and ``backward_layer.*`` (Keras's order: the forward layer's weights,
    then the backward layer's). When both directions run on cuDNN with the same settings, one
    bidirectional cuDNN call computes them; masks must then be right-padded (as in Keras).

    ``merge_mode``: 'concat', 'sum', 'ave', 'mul' or None (a list ``[forward, backward]``).
    The backward output is flipped back to the input's time order, as Keras does.
    """

    keras_class = "Bidirectional"
    keras_sublayers = ("forward_layer", "backward_layer")

    def __init__(self, forward_layer: _KerasRNN, backward_layer: _KerasRNN, merge_mode="concat"):
        super().__init__()
        for arg, m in (("forward_layer", forward_layer), ("backward_layer", backward_layer)):
            if not isinstance(m, _KerasRNN):
                raise TypeError(
                    f"KerasBidirectional: argument '{arg}' must be a KerasLSTM/GRU/SimpleRNN, "
                    f"got {type(m).__name__}"
                )
        if merge_mode not in ("concat", "sum", "ave", "mul", None):
            raise ValueError(
                "KerasBidirectional: argument 'merge_mode' must be 'concat', 'sum', 'ave', "
                f"'mul' or None, got {merge_mode!r}"
            )
        if forward_layer.return_state != backward_layer.return_state or (
            forward_layer.return_sequences != backward_layer.return_sequences
        ):
            raise ValueError(
                "KerasBidirectional: 'forward_layer' and 'backward_layer' must agree on "
                "return_sequences and return_state"
            )
        self.forward_layer, self.backward_layer = forward_layer, backward_layer
        self.merge_mode = merge_mode
        self.return_state = forward_layer.return_state

    def set_trainable(self, trainable: bool) -> None:
        self.forward_layer.set_trainable(trainable)
        self.backward_layer.set_trainable(trainable)

    @classmethod
    def wrap(cls, layer: _KerasRNN, merge_mode="concat") -> KerasBidirectional:
        """``Bidirectional(layer)``: the backward layer is a copy with ``go_backwards`` flipped
        (its own parameters, freshly initialised, as Keras's)."""
        back = type(layer)(
            layer.input_size,
            layer.units,
            activation=layer.activation,
            recurrent_activation=layer.recurrent_activation,
            use_bias=layer.use_bias,
            reset_after=layer.reset_after,
            return_sequences=layer.return_sequences,
            return_state=layer.return_state,
            go_backwards=not layer.go_backwards,
            dropout=layer.dropout,
            recurrent_dropout=layer.recurrent_dropout,
            use_cudnn=layer.use_cudnn,
            device=layer.kernel.device,
            dtype=layer.kernel.dtype,
        )
        return cls(layer, back, merge_mode)

    def set_keras_weights(self, *arrays) -> None:
        """Loads a Keras ``Bidirectional`` layer's ``get_weights()`` in one call: the forward
        layer's variables, then the backward layer's."""
        nf = len(self.forward_layer.keras_variables)
        nb = len(self.backward_layer.keras_variables)
        if len(arrays) == 1 and isinstance(arrays[0], (list, tuple)):
            arrays = tuple(arrays[0])
        if len(arrays) != nf + nb:
            raise ValueError(
                f"KerasBidirectional.set_keras_weights: expects {nf + nb} arrays (forward "
                f"layer's {nf}, then backward layer's {nb}), got {len(arrays)}"
            )
        self.forward_layer.set_keras_weights(*arrays[:nf])
        self.backward_layer.set_keras_weights(*arrays[nf:])

    def _fused(self):
        """Both directions in one bidirectional cuDNN call: same settings, mirrored."""
        f, b = self.forward_layer, self.backward_layer
        same = all(
            getattr(f, k) == getattr(b, k)
            for k in ("keras_class", "input_size", "units", "use_bias", "dropout")
        )
        return (
            same
            and f.cudnn_mode is not None
            and f.cudnn_mode == b.cudnn_mode
            and not f.go_backwards
            and b.go_backwards
            and f.kernel.dtype == b.kernel.dtype
        )

    def forward(self, input: torch.Tensor, mask: torch.Tensor | None = None, initial_state=None):
        """``initial_state``: Keras's list, the forward layer's states then the backward's."""
        f, b = self.forward_layer, self.backward_layer
        init_f = init_b = None
        if initial_state is not None:
            n = len(initial_state) // 2
            init_f, init_b = list(initial_state[:n]), list(initial_state[n:])
        f._check(input, mask, init_f)
        b._check(input, mask, init_b)
        lengths = None
        fused = self._fused() and input.shape[0] > 0
        if fused and mask is not None:
            lengths = _right_padded_lengths(mask)
            fused = lengths is not None
        if fused:
            yf, yb, sf, sb = self._run_fused(input, lengths, init_f, init_b)
        else:
            # Keras zeroes the outputs at masked steps inside Bidirectional
            yf = f(input, mask, init_f, f.return_sequences)
            yb = b(input, mask, init_b, b.return_sequences)
            if self.return_state:
                (yf, *sf), (yb, *sb) = yf, yb
            if b.return_sequences:
                yb = yb.flip(1)
        if self.merge_mode == "concat":
            y = torch.cat([yf, yb], -1)
        elif self.merge_mode == "sum":
            y = yf + yb
        elif self.merge_mode == "ave":
            y = (yf + yb) / 2
        elif self.merge_mode == "mul":
            y = yf * yb
        else:
            y = [yf, yb]
        if self.return_state:
            return (y if isinstance(y, list) else [y]) + sf + sb
        return y

    def _run_fused(self, x, lengths, init_f, init_b):
        f, b = self.forward_layer, self.backward_layer
        if self.training and f.dropout:  # each direction draws its own mask, as in Keras
            xf = x * f._dropout_mask(x[:, 0], f.dropout, 1)[0][:, None]
            xb = x * b._dropout_mask(x[:, 0], b.dropout, 1)[0][:, None]
            yf, sf = f._cudnn(xf, lengths, init_f, True)
            yb, sb = b._cudnn(xb, lengths, init_b, True)
            return yf, (yb.flip(1) if b.return_sequences else yb), sf, sb
        U = f.units
        out, h, c = run_cudnn([f, b], x, lengths, [init_f, init_b])
        if f.return_sequences:
            yf, yb = out[..., :U], out[..., U:]
        else:
            yf, yb = h[0], h[1]
        lstm = f.keras_class == "LSTM"
        sf = [h[0], c[0]] if lstm else [h[0]]
        sb = [h[1], c[1]] if lstm else [h[1]]
        return yf, yb, sf, sb
