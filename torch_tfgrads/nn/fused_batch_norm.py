"""Keras' BatchNormalization(fused=True) as a module over fused_batch_norm_v3."""

from __future__ import annotations

import torch

from ..distributed.sync_batch_norm import is_synchronizing, sync_fused_batch_norm
from ..ops import fused_batch_norm_v3
from ..ops._common import check_shape as check_input

_FORMATS = {"NHWC": 4, "NCHW": 4, "NDHWC": 5, "NCDHW": 5}


class FusedBatchNorm(torch.nn.Module):
    """Batch normalisation with Keras' defaults and TF's fused-kernel numerics.

    Matches ``tf.keras.layers.BatchNormalization(fused=True)``: ``momentum=0.99``,
    ``epsilon=1e-3``, gamma/beta (``weight``/``bias``) optional through ``scale``/``center``.
    In training the op itself updates the running statistics with
    ``exponential_avg_factor = 1 - momentum`` (batch variance Bessel-corrected) and the
    module stores what the op returns, exactly as Keras assigns ``moving_mean``/``moving_variance``.
    The channel axis comes from ``data_format`` (channels last for NHWC/NDHWC).

    Parameters and statistics are kept in float32 (float64 if the module is converted to
    float64); float16/bfloat16 inputs are normalised with float32 statistics, as TF does.
    Keras weights load unchanged: ``weight`` = gamma, ``bias`` = beta, ``running_mean`` =
    moving_mean, ``running_var`` = moving_variance.

    ``moving_variance`` picks how training updates the running statistics:

    * ``"bessel"`` (default): what TF's fused op returns, ``(1-f) * running + f * batch`` with
      ``f = 1 - momentum`` and the Bessel-corrected batch variance (tf-keras / Keras 2 on its
      fused path: 4-D input, ``fused`` not False).
    * ``"biased"``: Keras 3's ``BatchNormalization`` (the Keras of TF >= 2.16), which updates
      ``running * momentum + batch * (1 - momentum)`` with the *biased* batch variance (the op's
      ``reserve_space_2``), the mean the same way. The normalised output is the same either way.
    """

    # Synchronized statistics (SyncFusedBatchNorm, or set by convert_sync_batchnorm on a
    # subclass such as the Keras converter's layer): in training inside a process group of more
    # than one process, the batch statistics are those of the global batch.
    synchronized = False
    process_group = None
    keras_version = 3

    def __init__(
        self,
        num_features: int,
        momentum: float = 0.99,
        epsilon: float = 1e-3,
        center: bool = True,
        scale: bool = True,
        data_format: str = "NHWC",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        moving_variance: str = "bessel",
    ) -> None:
        super().__init__()
        if moving_variance not in ("bessel", "biased"):
            raise ValueError(
                "FusedBatchNorm: argument 'moving_variance' must be 'bessel' or "
                f"'biased', got {moving_variance!r}"
            )
        self.moving_variance_rule = moving_variance
        if data_format not in _FORMATS:
            raise ValueError(
                f"FusedBatchNorm: argument 'data_format' must be one of "
                f"{sorted(_FORMATS)}, got {data_format!r}"
            )
        if not (isinstance(num_features, int) and num_features >= 0):
            raise ValueError(
                f"FusedBatchNorm: argument 'num_features' must be a non-negative "
                f"int, got {num_features!r}"
            )
        if not 0.0 <= momentum <= 1.0:
            raise ValueError(
                f"FusedBatchNorm: argument 'momentum' must be in [0, 1], got {momentum!r}"
            )
        self.num_features, self.momentum, self.epsilon = num_features, momentum, epsilon
        self.data_format, self.center, self.scale = data_format, center, scale
        dtype = dtype or torch.float32
        kw = {"device": device, "dtype": dtype}
        self.weight = torch.nn.Parameter(torch.ones(num_features, **kw)) if scale else None
        self.bias = torch.nn.Parameter(torch.zeros(num_features, **kw)) if center else None
        self.register_buffer("running_mean", torch.zeros(num_features, **kw))
        self.register_buffer("running_var", torch.ones(num_features, **kw))

    def extra_repr(self):
        return (
            f"{self.num_features}, momentum={self.momentum}, epsilon={self.epsilon}, "
            f"data_format={self.data_format!r}, center={self.center}, scale={self.scale}"
        )

    def _check_input(self, x):
        rank = _FORMATS[self.data_format]
        check_input(
            x.dim() == rank,
            lambda: (
                f"FusedBatchNorm: argument 'data_format' is {self.data_format!r}, which takes "
                f"{rank}-D input, but the input has shape {list(x.shape)}"
            ),
        )
        cdim = 1 if self.data_format in ("NCHW", "NCDHW") else rank - 1
        check_input(
            x.shape[cdim] == self.num_features,
            lambda: (
                f"FusedBatchNorm: argument 'num_features' is {self.num_features}, but the input of "
                f"shape {list(x.shape)} has {x.shape[cdim]} channels on axis {cdim} (the channel "
                f"axis of data_format {self.data_format!r})"
            ),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_input(x)
        pdt = torch.float64 if x.dtype == torch.float64 else torch.float32

        def param(p, fill):
            if p is None:
                return torch.full((self.num_features,), fill, dtype=pdt, device=x.device)
            return p.to(pdt)

        gamma, beta = param(self.weight, 1.0), param(self.bias, 0.0)
        mean, var = self.running_mean.to(pdt), self.running_var.to(pdt)
        if self.training and self.synchronized and is_synchronizing(self.process_group):
            return self._synchronized_forward(x, gamma, beta, mean, var)
        if self.training:
            y, new_mean, new_var, batch_mean, batch_var, _ = fused_batch_norm_v3(
                x,
                gamma,
                beta,
                mean,
                var,
                epsilon=self.epsilon,
                exponential_avg_factor=1.0 - self.momentum,
                data_format=self.data_format,
                is_training=True,
            )
            if self.moving_variance_rule == "biased":  # Keras 3's formula, its rounding order
                new_mean = mean * self.momentum + batch_mean * (1.0 - self.momentum)
                new_var = var * self.momentum + batch_var * (1.0 - self.momentum)
            with torch.no_grad():
                self.running_mean.copy_(new_mean)
                self.running_var.copy_(new_var)
            return y
        y, *_ = fused_batch_norm_v3(
            x,
            gamma,
            beta,
            mean,
            var,
            epsilon=self.epsilon,
            data_format=self.data_format,
            is_training=False,
        )
        return y

    def _synchronized_forward(self, x, gamma, beta, mean, var):
        y, batch_mean, batch_var = sync_fused_batch_norm(
            x, gamma, beta, self.epsilon, self.data_format, self.process_group
        )
        m = self.momentum
        with torch.no_grad():
            if self.keras_version == 3:  # Keras 3's formula and rounding order
                new_mean = mean * m + batch_mean * (1.0 - m)
                new_var = var * m + batch_var * (1.0 - m)
            elif x.numel() == 0:  # tf-keras leaves a replica with an empty batch unchanged
                return y
            else:  # tf-keras: assign_sub((variable - value) * decay), decay a float32 constant
                decay = float(torch.tensor(1.0 - m, dtype=torch.float32))  # a Python scalar
                new_mean = mean - (mean - batch_mean) * decay
                new_var = var - (var - batch_var) * decay
            self.running_mean.copy_(new_mean)
            self.running_var.copy_(new_var)
        return y
