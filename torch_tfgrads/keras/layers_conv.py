"""Converters of the convolution, dense and normalisation layers."""

import numpy as np
import torch
import torch.nn.functional as F

from ..nn import DepthwiseConv2d, FusedBatchNorm
from ..ops import depthwise_conv2d_native
from .activations import ACTIVATIONS, check_activation
from .layer_base import Context, KerasLayer, _param, _Renamed, _same_pads, _torch_pad, _tuple


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
        if self.padding == "same":
            pads = _same_pads(x.shape[1:-1], self.kernel_size, self.strides, self.dilation)
        elif self.padding == "causal":
            pads = [((self.kernel_size[0] - 1) * self.dilation[0], 0)]
        else:
            pads = None
        if pads and any(p for pair in pads for p in pair):
            # padded channels last, so that the convolution still reads channels-last memory
            # (padding the channels-first view would make it a contiguous NCHW copy)
            x = F.pad(x, [0, 0] + _torch_pad(pads))
        xc = x.movedim(-1, 1)
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
    tf-keras (Keras 2) the Bessel-corrected one on its fused path (4-D or 5-D input, compute
    dtype float32/float16/bfloat16, ``fused`` not False) and otherwise its unfused path,
    computed here as tf-keras does (``_keras2_unfused``). Input of any rank >= 2 is normalised
    over every axis but the last, as Keras does. A layer saved with ``trainable=False`` always
    normalises with the moving statistics (Keras 3 does the same in training mode) and its
    weights are frozen.
    ``synchronized=True`` (or ``nn.convert_sync_batchnorm``) gives global-batch statistics under
    torch.distributed, as nn.SyncFusedBatchNorm.
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
        center, scale = cfg.get("center", True), cfg.get("scale", True)
        names = (
            (["gamma"] if scale else [])
            + (["beta"] if center else [])
            + ["moving_mean", "moving_variance"]
        )
        arrays = ctx.take(names)
        c = arrays[-1].shape[0]
        # tf-keras fuses only where TF's FusedBatchNorm kernel exists: not for float64
        self.keras2_fused = (
            ctx.keras_major < 3
            and cfg.get("fused", None) is not False
            and _compute_dtype(cfg, arrays[-1].dtype) in ("float32", "float16", "bfloat16")
        )
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
        # synchronized=True: global-batch statistics inside a process group of more than one
        # process (nn.SyncFusedBatchNorm's semantics); otherwise it is the ordinary layer, as
        # Keras is outside a distribution strategy up to rounding.
        self.synchronized = bool(cfg.get("synchronized", False))
        self.keras_version = 3 if ctx.keras_major >= 3 else 2

    def forward(self, x, mask=None):
        if self.axis not in (-1, x.dim() - 1):
            raise ValueError(
                f"BatchNormalization: axis {self.axis} is not the last axis of the "
                f"input of shape {list(x.shape)}; only channels-last is supported"
            )
        if mask is not None and self.training and self.layer_trainable:
            return self._masked_training(x, mask)
        if self.keras_major < 3:
            fused = self.keras2_fused and x.dim() in (4, 5)
            self.moving_variance_rule = "bessel" if fused else "biased"
            if not fused:
                return self._keras2_unfused(x)
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

    def _masked_training(self, x, mask):
        """Keras 3's moments over the unmasked positions (it divides by their count plus
        1e-7, its epsilon), then tf.nn.batch_normalization, in plain torch."""
        if mask.dim() != x.dim() - 1:
            raise ValueError(
                f"BatchNormalization: the mask must have one dimension less than the input "
                f"{list(x.shape)}, got {list(mask.shape)}"
            )
        m = mask[..., None].expand_as(x)
        dims = tuple(range(x.dim() - 1))
        zero = torch.zeros((), dtype=x.dtype, device=x.device)
        count = m.to(x.dtype).sum(dims, keepdim=True) + 1e-7
        mean = torch.where(m, x, zero).sum(dims, keepdim=True) / count
        var = torch.where(m, x - mean, zero).square().sum(dims, keepdim=True) / count
        mean, var = mean.reshape(-1), var.reshape(-1)
        with torch.no_grad():
            k = self.momentum
            self.running_mean.copy_(self.running_mean * k + mean * (1.0 - k))
            self.running_var.copy_(self.running_var * k + var * (1.0 - k))
        inv = torch.rsqrt(var + self.epsilon)
        if self.weight is not None:
            inv = inv * self.weight
        offset = -mean * inv if self.bias is None else self.bias - mean * inv
        return x * inv + offset

    def _keras2_unfused(self, x):
        """tf-keras's unfused path: tf.nn.moments (the variance around the stopped mean),
        tf.nn.batch_normalization's ``x * inv + (beta - mean * inv)``, and moving averages
        ``v -= (v - value) * decay`` with ``decay = 1 - momentum`` made a float32 tensor first
        (tf.convert_to_tensor of a Python float), then cast."""
        dims = tuple(range(x.dim() - 1))
        if self.training and self.layer_trainable:
            mean = x.mean(dims, keepdim=True)
            var = (x - mean.detach()).square().mean(dims)
            mean = mean.reshape(-1)
            with torch.no_grad():
                decay = float(np.float32(1.0 - self.momentum))
                self.running_mean.sub_((self.running_mean - mean) * decay)
                self.running_var.sub_((self.running_var - var) * decay)
        else:
            mean, var = self.running_mean, self.running_var
        inv = torch.rsqrt(var + self.epsilon)
        if self.weight is not None:
            inv = inv * self.weight
        offset = -mean * inv if self.bias is None else self.bias - mean * inv
        return x * inv + offset

    set_trainable = KerasLayer.set_trainable


def _compute_dtype(cfg, default):
    """The layer's compute dtype from its config: a dtype name, or a (mixed) policy."""
    dtype = cfg.get("dtype")
    if isinstance(dtype, dict):
        dtype = dtype.get("config", {}).get("name")
    if not isinstance(dtype, str):
        return str(default)
    return {"mixed_float16": "float16", "mixed_bfloat16": "bfloat16"}.get(dtype, dtype)


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
