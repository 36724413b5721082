"""Converters of Masking and TimeDistributed, the layers that work along the time axis."""

import torch

from .layer_base import CELL_LAYERS, MASK_CONSUMERS, MODEL_CLASSES, Context, KerasLayer

# A layer whose training call depends on the whole batch: TimeDistributed runs it step by
# step (Keras's loop), as folding time into the batch would change its batch statistics.
_PER_STEP = ("BatchNormalization",)


class Masking(KerasLayer):
    """``keras.layers.Masking``: zeros the steps whose features all equal ``mask_value`` (the
    mask itself is a separate NotEqual/Any node of the Keras 3 graph)."""

    def __init__(self, cfg, ctx):
        super().__init__(ctx.class_name)
        ctx.take([])
        self.mask_value = float(cfg.get("mask_value", 0.0))

    def forward(self, x):
        keep = (x != self.mask_value).any(dim=-1, keepdim=True)
        return torch.where(keep, x, torch.zeros((), dtype=x.dtype, device=x.device))


class TimeDistributed(KerasLayer):
    """``keras.layers.TimeDistributed``: the wrapped layer (submodule ``layer``, its variables
    ``layer.*``) applied to every step of ``[batch, time, ...]``. A stateless layer runs once
    on the steps folded into the batch; a batch norm runs step by step, as in Keras, so that
    each step has its own batch statistics and the moving averages are updated once per step.
    """

    keras_sublayers = ("layer",)

    def __init__(self, cfg, ctx):
        from .layers import CONVERTERS  # the registry imports this module

        super().__init__(ctx.class_name)
        inner = cfg["layer"]
        cls = inner["class_name"]
        refused = set(CELL_LAYERS) | set(MODEL_CLASSES) | {"Bidirectional", "TimeDistributed"}
        if cls in refused or cls not in CONVERTERS:
            raise ctx.fail(
                f"wraps a {cls}; TimeDistributed is supported around the layers without "
                "time or model structure of their own (Dense, Conv2D, BatchNormalization, ...)"
            )
        sub = Context(ctx.name, cls, ctx.arrays, ctx.keras_version)
        self.layer = CONVERTERS[cls](inner.get("config", {}), sub)
        self.per_step = cls in _PER_STEP
        self.takes_mask = cls in MASK_CONSUMERS  # Keras hands it mask[:, t]

    def set_trainable(self, trainable):
        self.layer.set_trainable(trainable)

    def forward(self, x, mask=None):
        n, steps = x.shape[0], x.shape[1]
        if self.per_step:
            if mask is not None and self.takes_mask:
                return torch.stack([self.layer(x[:, t], mask[:, t]) for t in range(steps)], 1)
            return torch.stack([self.layer(x[:, t]) for t in range(steps)], 1)
        y = self.layer(x.reshape((n * steps,) + tuple(x.shape[2:])))
        return y.reshape((n, steps) + tuple(y.shape[1:]))
