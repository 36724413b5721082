"""Converters of the recurrent layers (LSTM, GRU, SimpleRNN, Bidirectional) into this
library's Keras-faithful modules (``nn.KerasLSTM`` ...: Keras's variables as parameters, the cuDNN
op where cuDNN can express the layer, Keras 3's cell math otherwise), and of the NotEqual and
Any nodes Keras 3 records for masks."""

import torch

from ..nn.keras_bidirectional import KerasBidirectional
from ..nn.keras_rnn import KerasGRU, KerasLSTM, KerasSimpleRNN
from .activations import check_activation
from .layer_base import CELL_LAYERS, Context, KerasLayer

_MODULES = {"LSTM": KerasLSTM, "GRU": KerasGRU, "SimpleRNN": KerasSimpleRNN}


def Recurrent(cfg, ctx):
    """LSTM, GRU (reset_after both ways), SimpleRNN: ``return_sequences``, ``return_state``,
    ``go_backwards``, ``dropout``/``recurrent_dropout`` (masks from torch's generator)."""
    for opt in ("stateful", "time_major"):
        if cfg.get(opt):
            raise ctx.fail(f"{opt}={cfg[opt]!r} is not supported")
    use_bias = bool(cfg.get("use_bias", True))
    names = ["kernel", "recurrent_kernel"] + (["bias"] if use_bias else [])
    arrays = ctx.take(names)
    kernel = torch.from_numpy(arrays[0])
    use_cudnn = cfg.get("use_cudnn", "auto")
    return _MODULES[ctx.class_name](
        int(arrays[0].shape[0]),
        int(arrays[1].shape[0]),
        activation=check_activation(cfg.get("activation", "tanh"), ctx.name, ctx.keras_major),
        recurrent_activation=check_activation(
            cfg.get("recurrent_activation", "sigmoid"), ctx.name, ctx.keras_major
        ),
        use_bias=use_bias,
        reset_after=bool(cfg.get("reset_after", True)),
        return_sequences=bool(cfg.get("return_sequences", False)),
        return_state=bool(cfg.get("return_state", False)),
        go_backwards=bool(cfg.get("go_backwards", False)),
        dropout=float(cfg.get("dropout", 0.0) or 0.0),
        recurrent_dropout=float(cfg.get("recurrent_dropout", 0.0) or 0.0),
        use_cudnn=use_cudnn if use_cudnn in (True, False) else "auto",
        dtype=kernel.dtype,
    )


def Bidirectional(cfg, ctx):
    """keras.layers.Bidirectional over LSTM/GRU/SimpleRNN: submodules ``forward_layer`` and
    ``backward_layer``; every merge_mode."""
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
    merge_mode = cfg.get("merge_mode", "concat")
    if merge_mode not in ("concat", "sum", "ave", "mul", None):
        raise ctx.fail(f"merge_mode={merge_mode!r} is not supported")
    n = len(ctx.arrays) // 2
    fwd = Context(ctx.name, inner["class_name"], ctx.arrays[:n], ctx.keras_version)
    bwd = Context(ctx.name, back["class_name"], ctx.arrays[n:], ctx.keras_version)
    return KerasBidirectional(
        Recurrent(inner["config"], fwd), Recurrent(back["config"], bwd), merge_mode
    )


class NotEqual(KerasLayer):
    """The ``x != y`` node Keras 3 records for a mask (Embedding(mask_zero=True))."""

    def __init__(self, cfg, ctx):
        super().__init__(ctx.class_name)
        ctx.take([])

    def forward(self, x, y):
        return x != y


class Any(KerasLayer):
    """``keras.ops.any`` as Keras 3 records it for a ``Masking`` layer's mask."""

    def __init__(self, cfg, ctx):
        super().__init__(ctx.class_name)
        ctx.take([])
        axis = cfg.get("axis")
        if axis is not None and not isinstance(axis, int):
            raise ctx.fail(f"axis={axis!r} is not supported (one axis or None)")
        self.axis, self.keepdims = axis, bool(cfg.get("keepdims", False))

    def forward(self, x):
        if self.axis is None:
            return x.any() if not self.keepdims else x.any().reshape([1] * x.dim())
        return x.any(dim=self.axis, keepdim=self.keepdims)
