"""Keras-style DepthwiseConv2D over our op, with the filter in TF's layout."""

from __future__ import annotations

import math
import operator

import torch

from ..ops import depthwise_conv2d_native
from ..ops._common import check_shape as check_input


def _positive(v, name):
    try:
        if isinstance(v, bool):
            raise TypeError
        v = operator.index(v)
    except TypeError:
        raise TypeError(f"DepthwiseConv2d: argument '{name}' must be an int, got {v!r}") from None
    if v < 1:
        raise ValueError(f"DepthwiseConv2d: argument '{name}' must be >= 1, got {v}")
    return v


def _pair(v, name):
    if not isinstance(v, (tuple, list, torch.Size)):
        v = (v, v)
    if len(v) != 2:
        raise ValueError(
            f"DepthwiseConv2d: argument '{name}' must be an int or a pair, got {tuple(v)}"
        )
    return tuple(_positive(i, name) for i in v)


class DepthwiseConv2d(torch.nn.Module):
    """`keras.layers.DepthwiseConv2D` for PyTorch, on `depthwise_conv2d_native`.

    Arguments follow Keras (``kernel_size``, ``strides``, ``padding`` "valid"/"same",
    ``depth_multiplier``, ``data_format`` "channels_last"/"channels_first", ``dilation_rate``,
    ``use_bias``); ``in_channels`` is given up front (Keras infers it on first call). Parameters
    have Keras' names and layouts, so a Keras layer's weights load unchanged:
    ``depthwise_kernel`` ``[kh, kw, in_channels, depth_multiplier]`` and ``bias``
    ``[in_channels * depth_multiplier]``; initialised like Keras (Glorot uniform, zero bias).
    Unlike ``tf.nn.depthwise_conv2d``, strides and dilations may be combined (TF 2.21 returns a
    wrong shape there).
    """

    def __init__(
        self,
        in_channels: int,
        kernel_size: int | tuple[int, int],
        strides: int | tuple[int, int] = 1,
        padding: str = "valid",
        depth_multiplier: int = 1,
        data_format: str = "channels_last",
        dilation_rate: int | tuple[int, int] = 1,
        use_bias: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        if data_format not in ("channels_last", "channels_first"):
            raise ValueError(
                "DepthwiseConv2d: argument 'data_format' must be 'channels_last' or "
                f"'channels_first', got {data_format!r}"
            )
        pad = str(padding).upper()
        if pad not in ("VALID", "SAME"):
            raise ValueError(
                f"DepthwiseConv2d: argument 'padding' must be 'valid' or 'same', got {padding!r}"
            )
        self.in_channels = _positive(in_channels, "in_channels")
        self.depth_multiplier = _positive(depth_multiplier, "depth_multiplier")
        self.kernel_size = _pair(kernel_size, "kernel_size")
        self.strides = _pair(strides, "strides")
        self.dilation_rate = _pair(dilation_rate, "dilation_rate")
        self.padding, self.data_format = pad, data_format
        kw = dict(device=device, dtype=dtype)
        self.depthwise_kernel = torch.nn.Parameter(
            torch.empty(*self.kernel_size, self.in_channels, self.depth_multiplier, **kw)
        )
        self.bias = (
            torch.nn.Parameter(torch.empty(self.in_channels * self.depth_multiplier, **kw))
            if use_bias
            else None
        )
        self.reset_parameters()

    def reset_parameters(self) -> None:
        kh, kw = self.kernel_size
        fan_in = kh * kw * self.in_channels
        fan_out = kh * kw * self.depth_multiplier
        limit = math.sqrt(6.0 / (fan_in + fan_out))
        with torch.no_grad():
            self.depthwise_kernel.uniform_(-limit, limit)
            if self.bias is not None:
                self.bias.zero_()

    def _attr4(self, pair):
        return [1, 1, *pair] if self.data_format == "channels_first" else [1, *pair, 1]

    def _check_input(self, x):
        check_input(
            x.dim() == 4,
            lambda: (
                f"DepthwiseConv2d: the input must be 4-D ({self.data_format}), got shape "
                f"{list(x.shape)}"
            ),
        )
        cdim = 1 if self.data_format == "channels_first" else 3
        check_input(
            x.shape[cdim] == self.in_channels,
            lambda: (
                f"DepthwiseConv2d: argument 'in_channels' is {self.in_channels}, but the input of "
                f"shape {list(x.shape)} has {x.shape[cdim]} channels on axis {cdim} (the channel "
                f"axis of data_format {self.data_format!r})"
            ),
        )
        w = self.depthwise_kernel
        if x.dtype != w.dtype:
            raise TypeError(
                f"DepthwiseConv2d: the input's dtype {x.dtype} is not the module's "
                f"parameter dtype {w.dtype}"
            )
        check_input(
            x.device == w.device,
            lambda: (
                f"DepthwiseConv2d: the input is on {x.device} but the module's parameters are on "
                f"{w.device}"
            ),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_input(x)
        fmt = "NCHW" if self.data_format == "channels_first" else "NHWC"
        y = depthwise_conv2d_native(
            x,
            self.depthwise_kernel,
            self._attr4(self.strides),
            self.padding,
            None,
            fmt,
            self._attr4(self.dilation_rate),
        )
        if self.bias is not None:
            y = y + (self.bias.view(-1, 1, 1) if fmt == "NCHW" else self.bias)
        return y

    def extra_repr(self):
        return (
            f"{self.in_channels}, kernel_size={self.kernel_size}, strides={self.strides}, "
            f"padding={self.padding.lower()!r}, depth_multiplier={self.depth_multiplier}, "
            f"data_format={self.data_format!r}, dilation_rate={self.dilation_rate}, "
            f"use_bias={self.bias is not None}"
        )
