"""Converters of the recurrent layers (LSTM, GRU, SimpleRNN as a step loop with Keras 3's cell
math), Bidirectional, and the NotEqual node Keras 3 records for masks."""

import torch

from .activations import ACTIVATIONS, check_activation
from .layer_base import CELL_LAYERS, Context, KerasLayer, _param


class Recurrent(KerasLayer):
    """LSTM, GRU (reset_after both ways), SimpleRNN as a plain-torch step loop with Keras 3's
    math (the `implementation=2` cell: one matmul per step for all gates, Keras's order of
    additions). Inputs ``[batch, time, features]``; ``return_sequences``, ``return_state``,
    ``go_backwards`` as Keras (a backwards run returns the reversed sequence)."""

    def __init__(self, cfg, ctx):
        super().__init__(ctx.class_name)
        for opt in ("stateful", "time_major"):
            if cfg.get(opt):
                raise ctx.fail(f"{opt}=True is not supported")
        for opt in ("dropout", "recurrent_dropout"):
            if cfg.get(opt, 0.0):
                raise ctx.fail(f"{opt}={cfg[opt]} is not supported")
        self.kind = ctx.class_name
        names = ["kernel", "recurrent_kernel"] + (["bias"] if cfg.get("use_bias", True) else [])
        arrays = ctx.take(names)
        for n, a in zip(names, arrays):
            setattr(self, n, _param(a))
        if len(arrays) < 3:
            self.bias = None
        self.keras_variables = tuple(names)
        self.units = int(arrays[1].shape[0])
        self.activation = check_activation(cfg.get("activation", "tanh"), ctx.name, ctx.keras_major)
        self.recurrent_activation = check_activation(
            cfg.get("recurrent_activation", "sigmoid"), ctx.name, ctx.keras_major
        )
        self.reset_after = bool(cfg.get("reset_after", True))
        self.return_sequences = bool(cfg.get("return_sequences", False))
        self.return_state = bool(cfg.get("return_state", False))
        self.go_backwards = bool(cfg.get("go_backwards", False))

    def _step(self, x, h, c):
        act, ract = ACTIVATIONS[self.activation], ACTIVATIONS[self.recurrent_activation]
        U = self.units
        if self.kind == "LSTM":
            z = torch.matmul(x, self.kernel) + torch.matmul(h, self.recurrent_kernel)
            if self.bias is not None:
                z = z + self.bias
            z0, z1, z2, z3 = z.split(U, dim=-1)
            c = ract(z1) * c + ract(z0) * act(z2)
            return ract(z3) * act(c), c
        if self.kind == "SimpleRNN":
            y = torch.matmul(x, self.kernel)
            if self.bias is not None:
                y = y + self.bias
            return act(y + torch.matmul(h, self.recurrent_kernel)), c
        # GRU
        if self.bias is None:
            input_bias = recurrent_bias = None
        elif self.reset_after:
            input_bias, recurrent_bias = self.bias[0], self.bias[1]
        else:
            input_bias, recurrent_bias = self.bias, None
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

    def forward(self, x, mask=None, zero_output_for_mask=False):
        """``mask`` ([batch, time] bool, Keras's): a masked step keeps the state and outputs the
        previous output (zeros with ``zero_output_for_mask``, as Bidirectional asks)."""
        n, steps = x.shape[0], x.shape[1]
        h = x.new_zeros(n, self.units)
        c = x.new_zeros(n, self.units) if self.kind == "LSTM" else None
        outs = []
        prev = zero = x.new_zeros(n, self.units)
        for t in reversed(range(steps)) if self.go_backwards else range(steps):
            h_new, c_new = self._step(x[:, t], h, c)
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
        if not self.return_state:
            return y
        return [y, h, c] if self.kind == "LSTM" else [y, h]


class Bidirectional(KerasLayer):
    """keras.layers.Bidirectional over LSTM/GRU/SimpleRNN: submodules ``forward_layer`` and
    ``backward_layer``; merge_mode concat, sum, ave, mul or None (a list); the backward
    sequence is flipped back to the input's order, as Keras does."""

    keras_sublayers = ("forward_layer", "backward_layer")

    def __init__(self, cfg, ctx):
        super().__init__(ctx.class_name)
        inner = cfg["layer"]
        back = cfg.get("backward_layer") or {
            "class_name": inner["class_name"],
            "config": {
                **inner["config"],
                "go_backwards": not inner["config"].get("go_backwards", False),
            },
        }
        for sub in (inner, back):
            if sub["class_name"] not in CELL_LAYERS:
                raise ctx.fail(f"wraps a {sub['class_name']}; only {', '.join(CELL_LAYERS)}")
        self.merge_mode = cfg.get("merge_mode", "concat")
        if self.merge_mode not in ("concat", "sum", "ave", "mul", None):
            raise ctx.fail(f"merge_mode={self.merge_mode!r} is not supported")
        n = len(ctx.arrays) // 2
        fwd = Context(ctx.name, inner["class_name"], ctx.arrays[:n], ctx.keras_version)
        bwd = Context(ctx.name, back["class_name"], ctx.arrays[n:], ctx.keras_version)
        self.forward_layer = Recurrent(inner["config"], fwd)
        self.backward_layer = Recurrent(back["config"], bwd)
        self.return_state = self.forward_layer.return_state

    def forward(self, x, mask=None):
        zero = self.forward_layer.return_sequences  # Keras forces zeros at masked steps then
        yf = self.forward_layer(x, mask, zero)
        yb = self.backward_layer(x, mask, self.backward_layer.return_sequences)
        if self.return_state:
            (yf, *sf), (yb, *sb) = yf, yb
        if self.backward_layer.return_sequences:
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


class NotEqual(KerasLayer):
    """The ``x != y`` node Keras 3 records for a mask (Embedding(mask_zero=True))."""

    def __init__(self, cfg, ctx):
        super().__init__(ctx.class_name)
        ctx.take([])

    def forward(self, x, y):
        return x != y
