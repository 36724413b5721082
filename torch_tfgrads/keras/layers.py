"""One converter per Keras layer class: Keras config + weight arrays -> an nn.Module.

Every module takes and returns channels-last tensors like Keras, holds its weights under the Keras
variable names (``kernel``, ``bias``, ``gamma``, ``moving_mean``, ...) in Keras's layouts, and
lists them in Keras's variable order in ``keras_variables`` (the order of ``layer.weights``, which
is the order of the ``vars/<i>`` datasets of a `.keras` file and of ``weight_names`` in a `.h5`).
"""

import math

import numpy as np
import torch
import torch.nn.functional as F

from ..nn import DepthwiseConv2d, FusedBatchNorm
from ..ops import depthwise_conv2d_native
from .activations import ACTIVATIONS, check_activation
from .archive import KerasLoadError


class Context:
    """What a converter knows besides the layer config: its name, the arrays, the Keras version."""

    def __init__(self, name, class_name, arrays, keras_version):
        self.name, self.class_name, self.arrays = name, class_name, arrays
        self.keras_version = keras_version

    @property
    def keras_major(self):
        try:
            return int(str(self.keras_version).split(".")[0])
        except ValueError:
            return 3

    def fail(self, msg):
        return KerasLoadError(f"layer {self.name!r} ({self.class_name}): {msg}")

    def take(self, names):
        """The arrays, checked against the variable names the layer must have."""
        if len(self.arrays) != len(names):
            raise self.fail(
                f"expects {len(names)} weights ({', '.join(names) or 'none'}), the "
                f"file has {len(self.arrays)} for it; the file does not match its "
                "config (save the model again, or load weights saved from this model)"
            )
        return list(self.arrays)

    def refuse_options(self, cfg, **allowed):
        for key, ok in allowed.items():
            if key in cfg and cfg[key] is not None and not ok(cfg[key]):
                raise self.fail(f"{key}={cfg[key]!r} is not supported")


def _tuple(v, n):
    if isinstance(v, int):
        return (v,) * n
    return tuple(int(i) for i in v)


def _same_pads(sizes, kernel, strides, dilation):
    """TF SAME padding per spatial dim: total = max((ceil(in/s)-1)*s + (k-1)*d + 1 - in, 0),
    the odd pixel at the end."""
    pads = []
    for n, k, s, d in zip(sizes, kernel, strides, dilation):
        total = max((math.ceil(n / s) - 1) * s + (k - 1) * d + 1 - n, 0)
        pads.append((total // 2, total - total // 2))
    return pads


def _torch_pad(pads):
    """F.pad's argument for channels-first spatial dims, last dim first."""
    out = []
    for before, after in reversed(pads):
        out += [before, after]
    return out


def _param(array):
    return torch.nn.Parameter(torch.from_numpy(array.copy()))


def keras_tensors(module):
    """[(name, tensor)] of a converted layer in Keras's variable order."""
    if isinstance(module, Bidirectional):
        return [(f"forward_layer.{n}", t) for n, t in keras_tensors(module.forward_layer)] + [
            (f"backward_layer.{n}", t) for n, t in keras_tensors(module.backward_layer)
        ]
    return [(n, getattr(module, n)) for n in getattr(module, "keras_variables", ())]


def assign(module, arrays, layer):
    """Copy Keras arrays into the layer's variables, every shape checked first."""
    pairs = keras_tensors(module)
    names = [n for n, _ in pairs]
    if len(names) != len(arrays):
        raise KerasLoadError(
            f"layer {layer!r}: expects {len(names)} weights "
            f"({', '.join(names) or 'none'}), got {len(arrays)}"
        )
    targets = [t for _, t in pairs]
    for n, t, a in zip(names, targets, arrays):
        if tuple(t.shape) != tuple(a.shape):
            raise KerasLoadError(
                f"layer {layer!r}: weight {n!r} must have shape {list(t.shape)}"
                f", the file has {list(a.shape)}"
            )
    with torch.no_grad():
        for t, a in zip(targets, arrays):
            t.copy_(torch.from_numpy(np.array(a)))  # (ascontiguousarray makes 0-d 1-d)


class KerasLayer(torch.nn.Module):
    """Base: ``keras_variables`` names the attributes in Keras's variable order."""

    keras_variables: tuple = ()

    def __init__(self, keras_class):
        super().__init__()
        self.keras_class = keras_class

    def set_trainable(self, trainable):
        if not trainable:
            for p in self.parameters(recurse=False):
                p.requires_grad_(False)


class _Renamed:
    """Mixin for subclasses of this library's modules: expose parameters/buffers under Keras's
    variable names (what ``state_dict`` and ``named_parameters`` show) while the inherited code
    keeps reaching them under its own names."""

    def _rename(self, pairs):
        aliases = {}
        for old, new in pairs:
            if old == new:
                continue
            for store in ("_parameters", "_buffers"):
                d = self.__dict__[store]
                if old in d:
                    d[new] = d.pop(old)
                    aliases[old] = (store, new)
        self.__dict__["_keras_aliases"] = aliases

    def __getattr__(self, name):
        alias = self.__dict__.get("_keras_aliases", {}).get(name)
        if alias is not None:
            store = self.__dict__.get(alias[0])
            if store is not None and alias[1] in store:
                return store[alias[1]]
        return super().__getattr__(name)


class InputLayer(KerasLayer):
    def forward(self, x):
        return x


class Conv(KerasLayer):
    """Conv1D/Conv2D/Conv3D, channels last: TF SAME padding, dilations, groups, causal (1-D)."""

    keras_variables = ("kernel", "bias")

    def __init__(self, cfg, ctx, rank):
        super().__init__(ctx.class_name)
        ctx.refuse_options(cfg, data_format=lambda v: v == "channels_last")
        self.rank = rank
        names = ["kernel", "bias"] if cfg.get("use_bias", True) else ["kernel"]
        arrays = ctx.take(names)
        if arrays[0].ndim != rank + 2:
            raise ctx.fail(f"kernel of shape {list(arrays[0].shape)} is not {rank + 2}-D")
        self.kernel = _param(arrays[0])
        self.bias = _param(arrays[1]) if len(arrays) > 1 else None
        self.keras_variables = tuple(names)
        self.strides = _tuple(cfg.get("strides", 1), rank)
        self.dilation = _tuple(cfg.get("dilation_rate", 1), rank)
        self.kernel_size = tuple(arrays[0].shape[:rank])
        self.groups = int(cfg.get("groups", 1))
        self.padding = cfg.get("padding", "valid").lower()
        if self.padding not in ("valid", "same", "causal"):
            raise ctx.fail(f"padding={self.padding!r} is not supported")
        self.activation = check_activation(cfg.get("activation"), ctx.name, ctx.keras_major)

    def forward(self, x):
        r = self.rank
        xc = x.movedim(-1, 1)
        if self.padding == "same":
            pads = _same_pads(xc.shape[2:], self.kernel_size, self.strides, self.dilation)
        elif self.padding == "causal":
            pads = [((self.kernel_size[0] - 1) * self.dilation[0], 0)]
        else:
            pads = None
        if pads and any(p for pair in pads for p in pair):
            xc = F.pad(xc, _torch_pad(pads))
        w = self.kernel.permute(r + 1, r, *range(r))
        conv = (F.conv1d, F.conv2d, F.conv3d)[r - 1]
        y = conv(xc, w, None, self.strides, 0, self.dilation, self.groups).movedim(1, -1)
        if self.bias is not None:
            y = y + self.bias
        return ACTIVATIONS[self.activation](y)


class DepthwiseConv2D(_Renamed, DepthwiseConv2d):
    """keras.layers.DepthwiseConv2D on this library's DepthwiseConv2dNative, plus activation.

    The kernel is ``kernel`` (Keras 3's name) or ``depthwise_kernel`` (Keras 2's), as the file.
    """

    def __init__(self, cfg, ctx):
        ctx.refuse_options(cfg, data_format=lambda v: v == "channels_last")
        use_bias = cfg.get("use_bias", True)
        kname = (
            "kernel"
            if ctx.keras_major >= 3 and ctx.class_name == "DepthwiseConv2D"
            else "depthwise_kernel"
        )
        names = [kname, "bias"] if use_bias else [kname]
        arrays = ctx.take(names)
        k = arrays[0]
        if k.ndim != 4:
            raise ctx.fail(f"depthwise_kernel of shape {list(k.shape)} is not 4-D")
        super().__init__(
            k.shape[2],
            k.shape[:2],
            cfg.get("strides", 1),
            cfg.get("padding", "valid"),
            k.shape[3],
            "channels_last",
            cfg.get("dilation_rate", 1),
            use_bias,
            dtype=torch.from_numpy(k[:0]).dtype,
        )
        with torch.no_grad():
            self.depthwise_kernel.copy_(torch.from_numpy(k))
            if use_bias:
                self.bias.copy_(torch.from_numpy(arrays[1]))
        self._rename([("depthwise_kernel", kname)])
        self.keras_class = ctx.class_name
        self.keras_variables = tuple(names)
        self.activation = check_activation(cfg.get("activation"), ctx.name, ctx.keras_major)

    def forward(self, x):
        return ACTIVATIONS[self.activation](super().forward(x))

    set_trainable = KerasLayer.set_trainable


class SeparableConv2D(DepthwiseConv2D):
    """Depthwise (this library's op, no bias) then a 1x1 convolution with the bias."""

    def __init__(self, cfg, ctx):
        use_bias = cfg.get("use_bias", True)
        names = ["depthwise_kernel", "pointwise_kernel"] + (["bias"] if use_bias else [])
        arrays = ctx.take(names)
        inner = Context(ctx.name, ctx.class_name, arrays[:1], ctx.keras_version)
        super().__init__({**cfg, "use_bias": False, "activation": "linear"}, inner)
        self.pointwise_kernel = _param(arrays[1])
        self.bias = _param(arrays[2]) if use_bias else None
        self.keras_variables = tuple(names)
        self.activation = check_activation(cfg.get("activation"), ctx.name, ctx.keras_major)

    def forward(self, x):
        self._check_input(x)
        y = depthwise_conv2d_native(
            x,
            self.depthwise_kernel,
            self._attr4(self.strides),
            self.padding,
            [],
            "NHWC",
            self._attr4(self.dilation_rate),
        )
        w = self.pointwise_kernel.permute(3, 2, 0, 1)
        y = F.conv2d(y.movedim(-1, 1), w).movedim(1, -1)
        if self.bias is not None:
            y = y + self.bias
        return ACTIVATIONS[self.activation](y)


class Dense(KerasLayer):
    keras_variables = ("kernel", "bias")

    def __init__(self, cfg, ctx):
        super().__init__(ctx.class_name)
        names = ["kernel", "bias"] if cfg.get("use_bias", True) else ["kernel"]
        arrays = ctx.take(names)
        self.kernel = _param(arrays[0])
        self.bias = _param(arrays[1]) if len(arrays) > 1 else None
        self.keras_variables = tuple(names)
        self.activation = check_activation(cfg.get("activation"), ctx.name, ctx.keras_major)

    def forward(self, x):
        y = torch.matmul(x, self.kernel)
        if self.bias is not None:
            y = y + self.bias
        return ACTIVATIONS[self.activation](y)


class BatchNormalization(_Renamed, FusedBatchNorm):
    """keras.layers.BatchNormalization (channel axis last) on nn.FusedBatchNorm.

    The variables carry Keras's names (gamma, beta, moving_mean, moving_variance). The moving
    variance follows the Keras that wrote the file: Keras 3 uses the biased batch variance;
    tf-keras (Keras 2) the Bessel-corrected one on its fused path (4-D input, ``fused`` not
    False) and the biased one otherwise. Input of any rank >= 2 is normalised over every axis
    but the last, as Keras does. A layer saved with ``trainable=False`` always normalises with
    the moving statistics (Keras 3 does the same in training mode) and its weights are frozen.
    """

    def __init__(self, cfg, ctx):
        axis = cfg.get("axis", -1)
        if isinstance(axis, list):
            axis = axis[0] if len(axis) == 1 else axis
        if not isinstance(axis, int):
            raise ctx.fail(f"axis={cfg.get('axis')!r}: only one channel axis is supported")
        for opt in ("renorm", "virtual_batch_size", "adjustment"):
            if cfg.get(opt):
                raise ctx.fail(f"{opt}={cfg[opt]!r} is not supported")
        if cfg.get("synchronized"):
            raise ctx.fail("synchronized=True is not supported")
        center, scale = cfg.get("center", True), cfg.get("scale", True)
        names = (
            (["gamma"] if scale else [])
            + (["beta"] if center else [])
            + ["moving_mean", "moving_variance"]
        )
        arrays = ctx.take(names)
        c = arrays[-1].shape[0]
        self.keras2_fused = ctx.keras_major < 3 and cfg.get("fused", None) is not False
        super().__init__(
            c,
            float(cfg.get("momentum", 0.99)),
            float(cfg.get("epsilon", 1e-3)),
            center,
            scale,
            "NHWC",
            dtype=torch.from_numpy(arrays[-1][:0]).dtype,
            moving_variance="biased" if ctx.keras_major >= 3 else "bessel",
        )
        with torch.no_grad():
            affine = [n for n, on in (("weight", scale), ("bias", center)) if on]
            for n, a in zip(affine, arrays):
                getattr(self, n).copy_(torch.from_numpy(a))
            self.running_mean.copy_(torch.from_numpy(arrays[-2]))
            self.running_var.copy_(torch.from_numpy(arrays[-1]))
        self._rename(
            [
                ("weight", "gamma"),
                ("bias", "beta"),
                ("running_mean", "moving_mean"),
                ("running_var", "moving_variance"),
            ]
        )
        self.axis, self.keras_class = axis, ctx.class_name
        self.keras_variables = tuple(names)
        self.layer_trainable = bool(cfg.get("trainable", True))
        self.keras_major = ctx.keras_major

    def forward(self, x):
        if self.axis not in (-1, x.dim() - 1):
            raise ValueError(
                f"BatchNormalization: axis {self.axis} is not the last axis of the "
                f"input of shape {list(x.shape)}; only channels-last is supported"
            )
        if self.keras_major < 3:
            self.moving_variance_rule = "bessel" if self.keras2_fused and x.dim() == 4 else "biased"
        shape = x.shape
        x4 = x if x.dim() == 4 else x.reshape(shape[0], -1, 1, shape[-1])
        training = self.training
        if not self.layer_trainable:
            self.training = False
        try:
            y = super().forward(x4)
        finally:
            self.training = training
        return y.reshape(shape)

    set_trainable = KerasLayer.set_trainable


class LayerNormalization(KerasLayer):
    """Keras 3 LayerNormalization over the last axis (moments, rsqrt; not rms_scaling)."""

    def __init__(self, cfg, ctx):
        super().__init__(ctx.class_name)
        axis = cfg.get("axis", -1)
        if isinstance(axis, list):
            axis = axis[0] if len(axis) == 1 else axis
        if axis != -1:
            raise ctx.fail(f"axis={cfg.get('axis')!r}: only the last axis is supported")
        if cfg.get("rms_scaling"):
            raise ctx.fail("rms_scaling=True is not supported")
        names = (["gamma"] if cfg.get("scale", True) else []) + (
            ["beta"] if cfg.get("center", True) else []
        )
        arrays = ctx.take(names)
        for n, a in zip(names, arrays):
            setattr(self, n, _param(a))
        self.keras_variables = tuple(names)
        self.epsilon = float(cfg.get("epsilon", 1e-3))

    def forward(self, x):
        mean = x.mean(-1, keepdim=True)
        var = (x - mean.detach()).square().mean(-1, keepdim=True)
        inv = torch.rsqrt(var + self.epsilon)
        if "gamma" in self._parameters:
            inv = inv * self.gamma
        y = x * inv - mean * inv
        if "beta" in self._parameters:
            y = y + self.beta
        return y


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

    def forward(self, x):
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
        self.scale, self.offset = float(scale), float(offset)

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
            dt = torch.get_default_dtype()
            self.register_buffer("mean", torch.tensor(cfg["mean"], dtype=dt).reshape(-1))
            self.register_buffer("variance", torch.tensor(cfg["variance"], dtype=dt).reshape(-1))
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


def _conv(rank):
    return lambda cfg, ctx: Conv(cfg, ctx, rank)


def _gpool(rank, kind):
    return lambda cfg, ctx: GlobalPooling(cfg, ctx, rank, kind)


def _pool(rank, kind):
    return lambda cfg, ctx: Pooling(cfg, ctx, rank, kind)


CONVERTERS = {
    "InputLayer": lambda cfg, ctx: (ctx.take([]), InputLayer(ctx.class_name))[1],
    "Conv1D": _conv(1),
    "Conv2D": _conv(2),
    "Conv3D": _conv(3),
    "DepthwiseConv2D": DepthwiseConv2D,
    "SeparableConv2D": SeparableConv2D,
    "Dense": Dense,
    "BatchNormalization": BatchNormalization,
    "LayerNormalization": LayerNormalization,
    "Activation": Activation,
    "ReLU": ReLU,
    "LeakyReLU": LeakyReLU,
    "Softmax": Softmax,
    "ZeroPadding2D": ZeroPadding2D,
    "Cropping2D": Cropping2D,
    **{k: Merge for k in ("Add", "Subtract", "Multiply", "Average", "Maximum", "Minimum")},
    "Concatenate": Concatenate,
    "GlobalAveragePooling1D": _gpool(1, "avg"),
    "GlobalAveragePooling2D": _gpool(2, "avg"),
    "GlobalMaxPooling1D": _gpool(1, "max"),
    "GlobalMaxPooling2D": _gpool(2, "max"),
    "MaxPooling1D": _pool(1, "max"),
    "MaxPooling2D": _pool(2, "max"),
    "AveragePooling1D": _pool(1, "avg"),
    "AveragePooling2D": _pool(2, "avg"),
    "Flatten": Flatten,
    "Reshape": Reshape,
    "Permute": Permute,
    "Dropout": Dropout,
    "SpatialDropout1D": lambda cfg, ctx: Dropout(cfg, ctx, 1),
    "SpatialDropout2D": lambda cfg, ctx: Dropout(cfg, ctx, 2),
    "Rescaling": Rescaling,
    "UpSampling2D": UpSampling2D,
    "Embedding": Embedding,
    "Normalization": Normalization,
    "PReLU": PReLU,
    "LSTM": Recurrent,
    "GRU": Recurrent,
    "SimpleRNN": Recurrent,
    "Bidirectional": Bidirectional,
    "NotEqual": NotEqual,
}

#: Layers that take a Keras mask (recorded as mask=<tensor> in a Keras 3 graph).
MASK_CONSUMERS = ("LSTM", "GRU", "SimpleRNN", "Bidirectional")

#: Layers whose variables Keras 3 saves in their ``cell`` sublayer (``<layer>/cell/vars``).
CELL_LAYERS = ("LSTM", "GRU", "SimpleRNN")

#: Keras model classes that may appear as a layer (nested models).
MODEL_CLASSES = ("Functional", "Sequential", "Model")
