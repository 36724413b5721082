"""Converters of the activation, merge, padding, pooling, reshaping, dropout and embedding
layers."""

import numpy as np
import torch
import torch.nn.functional as F

from .activations import ACTIVATIONS, check_activation
from .layer_base import KerasLayer, _param, _same_pads, _torch_pad, _tuple


class Activation(KerasLayer):
    def __init__(self, cfg, ctx):
        super().__init__(ctx.class_name)
        ctx.take([])
        self.activation = check_activation(cfg.get("activation"), ctx.name, ctx.keras_major)

    def forward(self, x):
        return ACTIVATIONS[self.activation](x)


class ReLU(KerasLayer):
    """keras.layers.ReLU: Keras 3's relu(x, negative_slope, max_value, threshold) step by step."""

    def __init__(self, cfg, ctx):
        super().__init__(ctx.class_name)
        ctx.take([])
        self.max_value = cfg.get("max_value")
        self.max_value = None if self.max_value is None else float(self.max_value)
        self.negative_slope = float(cfg.get("negative_slope", 0.0))
        self.threshold = float(cfg.get("threshold", 0.0))

    def forward(self, x):
        slope, mx, th = self.negative_slope, self.max_value, self.threshold
        if slope != 0.0:
            if mx is None and th == 0:
                return F.leaky_relu(x, slope)
            negative_part = F.relu(-x + th) if th != 0 else F.relu(-x)
        clip_max = mx is not None
        if th != 0:
            x = torch.where(x > th, x, torch.zeros((), dtype=x.dtype, device=x.device))
        elif mx == 6:
            x = F.hardtanh(x, 0.0, 6.0)  # tf.nn.relu6: gradient 0 at exactly 0 and 6
            clip_max = False
        else:
            x = F.relu(x)
        if clip_max:
            x = torch.clamp(x, 0.0, mx)  # tf.clip_by_value passes the gradient at the bounds
        if slope != 0.0:
            x = x - slope * negative_part
        return x


class LeakyReLU(KerasLayer):
    def __init__(self, cfg, ctx):
        super().__init__(ctx.class_name)
        ctx.take([])
        self.negative_slope = float(cfg.get("negative_slope", cfg.get("alpha", 0.3)))

    def forward(self, x):
        return F.leaky_relu(x, self.negative_slope)


class Softmax(KerasLayer):
    def __init__(self, cfg, ctx):
        super().__init__(ctx.class_name)
        ctx.take([])
        self.axis = cfg.get("axis", -1)
        if not isinstance(self.axis, int):
            raise ctx.fail(f"axis={self.axis!r}: only one axis is supported")

    def forward(self, x):
        return torch.softmax(x, dim=self.axis)


class ZeroPadding2D(KerasLayer):
    def __init__(self, cfg, ctx):
        super().__init__(ctx.class_name)
        ctx.take([])
        ctx.refuse_options(cfg, data_format=lambda v: v == "channels_last")
        p = cfg.get("padding", 1)
        if isinstance(p, int):
            p = ((p, p), (p, p))
        (t, b), (l, r) = [(q, q) if isinstance(q, int) else tuple(q) for q in p]
        self.pad = (0, 0, l, r, t, b)

    def forward(self, x):
        return F.pad(x, self.pad)


class Cropping2D(KerasLayer):
    def __init__(self, cfg, ctx):
        super().__init__(ctx.class_name)
        ctx.take([])
        ctx.refuse_options(cfg, data_format=lambda v: v == "channels_last")
        c = cfg.get("cropping", 0)
        if isinstance(c, int):
            c = ((c, c), (c, c))
        self.crop = [(q, q) if isinstance(q, int) else tuple(q) for q in c]

    def forward(self, x):
        (t, b), (l, r) = self.crop
        return x[:, t : x.shape[1] - b, l : x.shape[2] - r, :]


class Merge(KerasLayer):
    """Add, Subtract, Multiply, Average, Maximum, Minimum: Keras folds left to right."""

    def __init__(self, cfg, ctx):
        super().__init__(ctx.class_name)
        ctx.take([])
        self.op = ctx.class_name

    def forward(self, *inputs):
        # a merge layer gets one list; Keras 3's graph also records tensor operators
        # (x * y, x + y) as nodes of the same class names with two arguments
        if len(inputs) == 1 and isinstance(inputs[0], (list, tuple)):
            inputs = inputs[0]
        if self.op == "Subtract":
            return inputs[0] - inputs[1]
        out = inputs[0]
        for t in inputs[1:]:
            if self.op in ("Add", "Average"):
                out = out + t
            elif self.op == "Multiply":
                out = out * t
            elif self.op == "Maximum":
                out = torch.maximum(out, t)
            else:
                out = torch.minimum(out, t)
        if self.op == "Average":
            out = out / len(inputs)
        return out


class Concatenate(KerasLayer):
    def __init__(self, cfg, ctx):
        super().__init__(ctx.class_name)
        ctx.take([])
        self.axis = int(cfg.get("axis", -1))

    def forward(self, inputs):
        return torch.cat(list(inputs), dim=self.axis)


class GlobalPooling(KerasLayer):
    """GlobalAverage/GlobalMaxPooling1D/2D/3D, channels last, keepdims."""

    def __init__(self, cfg, ctx, rank, kind):
        super().__init__(ctx.class_name)
        ctx.take([])
        ctx.refuse_options(cfg, data_format=lambda v: v == "channels_last")
        self.dims = tuple(range(1, rank + 1))
        self.keepdims, self.kind = bool(cfg.get("keepdims", False)), kind

    def forward(self, x, mask=None):
        if mask is not None:  # GlobalAveragePooling1D: the mean over the unmasked steps
            m = mask[:, :, None]
            total = torch.where(m, x, torch.zeros((), dtype=x.dtype, device=x.device))
            return total.sum(1, keepdim=self.keepdims) / m.to(x.dtype).sum(1, keepdim=self.keepdims)
        if self.kind == "avg":
            return x.mean(self.dims, keepdim=self.keepdims)
        return x.amax(self.dims, keepdim=self.keepdims)


class Pooling(KerasLayer):
    """MaxPooling/AveragePooling 1D/2D, TF SAME padding (averages divide by the valid count)."""

    def __init__(self, cfg, ctx, rank, kind):
        super().__init__(ctx.class_name)
        ctx.take([])
        ctx.refuse_options(cfg, data_format=lambda v: v == "channels_last")
        self.rank, self.kind = rank, kind
        self.pool = _tuple(cfg.get("pool_size", 2), rank)
        strides = cfg.get("strides")
        self.strides = self.pool if strides is None else _tuple(strides, rank)
        self.padding = cfg.get("padding", "valid").lower()

    def forward(self, x):
        xc = x.movedim(-1, 1)
        r = self.rank
        if r == 1:
            xc = xc.unsqueeze(-2)
        pool, strides = (
            ((1,) + self.pool, (1,) + self.strides) if r == 1 else (self.pool, self.strides)
        )
        pads = None
        if self.padding == "same":
            pads = _same_pads(xc.shape[2:], pool, strides, (1, 1))
            if not any(p for pair in pads for p in pair):
                pads = None
        if self.kind == "max":
            if pads:
                xc = F.pad(xc, _torch_pad(pads), value=float("-inf"))
            y = F.max_pool2d(xc, pool, strides)
        elif pads:
            s = F.avg_pool2d(F.pad(xc, _torch_pad(pads)), pool, strides, divisor_override=1)
            ones = torch.ones((1, 1) + tuple(xc.shape[2:]), dtype=xc.dtype, device=xc.device)
            n = F.avg_pool2d(F.pad(ones, _torch_pad(pads)), pool, strides, divisor_override=1)
            y = s / n
        else:
            y = F.avg_pool2d(xc, pool, strides)
        if r == 1:
            y = y.squeeze(-2)
        return y.movedim(1, -1)


class Flatten(KerasLayer):
    def __init__(self, cfg, ctx):
        super().__init__(ctx.class_name)
        ctx.take([])
        ctx.refuse_options(cfg, data_format=lambda v: v == "channels_last")

    def forward(self, x):
        return x.reshape(x.shape[0], -1)  # channels last: H, W, C order like Keras


class Reshape(KerasLayer):
    def __init__(self, cfg, ctx):
        super().__init__(ctx.class_name)
        ctx.take([])
        self.target_shape = tuple(int(i) for i in cfg["target_shape"])

    def forward(self, x):
        return x.reshape((x.shape[0],) + self.target_shape)


class Permute(KerasLayer):
    def __init__(self, cfg, ctx):
        super().__init__(ctx.class_name)
        ctx.take([])
        self.dims = tuple(int(i) for i in cfg["dims"])

    def forward(self, x):
        return x.permute(0, *self.dims)


class Dropout(KerasLayer):
    """Dropout/SpatialDropout1D/2D: same scaling as Keras, masks drawn from torch's RNG."""

    def __init__(self, cfg, ctx, spatial=0):
        super().__init__(ctx.class_name)
        ctx.take([])
        ns = cfg.get("noise_shape")
        self.noise_shape = None if ns is None else tuple(ns)  # None entries: the input's size
        self.rate, self.spatial = float(cfg.get("rate", 0.0)), spatial

    def forward(self, x):
        if not self.training or self.rate == 0.0:
            return x
        if self.noise_shape is not None:
            shape = tuple(
                x.shape[i] if d is None else int(d) for i, d in enumerate(self.noise_shape)
            )
        elif not self.spatial:
            return F.dropout(x, self.rate, True)
        else:
            shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (x.shape[-1],)
        keep = torch.empty(shape, dtype=x.dtype, device=x.device).bernoulli_(1 - self.rate)
        return x * keep / (1 - self.rate)


class Rescaling(KerasLayer):
    def __init__(self, cfg, ctx):
        super().__init__(ctx.class_name)
        ctx.take([])
        scale, offset = cfg.get("scale", 1.0), cfg.get("offset", 0.0)
        if not isinstance(scale, (int, float)) or not isinstance(offset, (int, float)):
            raise ctx.fail("only scalar scale and offset are supported")
        # Keras casts the Python floats with tf.cast, which makes a float32 tensor first: a
        # float64 model scales by the float32-rounded 1/255, and so do we
        self.scale, self.offset = float(np.float32(scale)), float(np.float32(offset))

    def forward(self, x):
        return x * self.scale + self.offset


class UpSampling2D(KerasLayer):
    def __init__(self, cfg, ctx):
        super().__init__(ctx.class_name)
        ctx.take([])
        ctx.refuse_options(
            cfg, data_format=lambda v: v == "channels_last", interpolation=lambda v: v == "nearest"
        )
        self.size = _tuple(cfg.get("size", 2), 2)

    def forward(self, x):
        return x.repeat_interleave(self.size[0], 1).repeat_interleave(self.size[1], 2)


class Embedding(KerasLayer):
    keras_variables = ("embeddings",)

    def __init__(self, cfg, ctx):
        super().__init__(ctx.class_name)
        if cfg.get("mask_zero") and ctx.keras_major < 3:
            raise ctx.fail(
                "mask_zero=True in a file written by Keras 2 is not supported (its "
                "masks are implicit; Keras 3 files record them in the graph)"
            )
        (w,) = ctx.take(["embeddings"])
        self.embeddings = _param(w)

    def forward(self, x):
        return F.embedding(x.long(), self.embeddings)


class Normalization(KerasLayer):
    """keras.layers.Normalization over the last axis (or all, ``axis=None``): ``(x - mean) /
    max(sqrt(variance), 1e-7)``, or the inverse with ``invert=True``. Adapted statistics are the
    buffers ``mean``, ``variance``, ``count``; statistics given in the config are constants."""

    def __init__(self, cfg, ctx):
        super().__init__(ctx.class_name)
        axis = cfg.get("axis", -1)
        if isinstance(axis, (list, tuple)):  # Keras saves axis=None as []
            axis = axis[0] if len(axis) == 1 else (axis if axis else None)
        if not (axis is None or isinstance(axis, int)):
            raise ctx.fail(f"axis={cfg.get('axis')!r}: only the last axis (or None) is supported")
        self.axis = axis
        self.invert = bool(cfg.get("invert", False))
        if cfg.get("mean") is not None:
            ctx.take([])
            # float32 whatever the model's dtype: Keras converts the config's lists to
            # tensors with TF's default float type and casts them only then
            f32 = torch.float32
            self.register_buffer("mean", torch.tensor(cfg["mean"], dtype=f32).reshape(-1))
            self.register_buffer("variance", torch.tensor(cfg["variance"], dtype=f32).reshape(-1))
            self.keras_variables = ()
        else:
            mean, var, count = ctx.take(["mean", "variance", "count"])
            self.register_buffer("mean", torch.from_numpy(mean.copy()))
            self.register_buffer("variance", torch.from_numpy(var.copy()))
            self.register_buffer("count", torch.from_numpy(np.asarray(count).copy()))
            self.keras_variables = ("mean", "variance", "count")

    def forward(self, x):
        if self.axis is not None and self.axis not in (-1, x.dim() - 1):
            raise ValueError(
                f"Normalization: axis {self.axis} is not the last axis of the "
                f"input of shape {list(x.shape)}; only the last axis is supported"
            )
        mean, var = self.mean.to(x.dtype), self.variance.to(x.dtype)
        std = torch.clamp_min(torch.sqrt(var), 1e-7)
        return mean + x * std if self.invert else (x - mean) / std


class PReLU(KerasLayer):
    keras_variables = ("alpha",)

    def __init__(self, cfg, ctx):
        super().__init__(ctx.class_name)
        (alpha,) = ctx.take(["alpha"])
        self.alpha = _param(alpha)

    def forward(self, x):
        return F.relu(x) + (-self.alpha) * F.relu(-x)  # Keras: relu(x) + -alpha * relu(-x)
