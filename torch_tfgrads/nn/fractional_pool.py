"""Fractional average/max pooling modules with TF's arguments (NHWC), over our ops."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..ops import fractional_avg_pool, fractional_max_pool
from ..ops._common import check_shape as check_input


def _ratio4(module, pooling_ratio):
    """A float, an (r_h, r_w) pair or TF's full [1, r_h, r_w, 1]."""

    def bad():
        return ValueError(
            f"{module}: argument 'pooling_ratio' must be a number >= 1, a pair "
            f"(r_h, r_w) or [1, r_h, r_w, 1] with r_h, r_w >= 1, got "
            f"{pooling_ratio!r}"
        )

    if isinstance(pooling_ratio, (int, float)):
        r = [1.0, float(pooling_ratio), float(pooling_ratio), 1.0]
    else:
        try:
            r = [float(v) for v in pooling_ratio]
        except (TypeError, ValueError):
            raise bad() from None
        if len(r) == 2:
            r = [1.0, r[0], r[1], 1.0]
    if len(r) != 4 or not all(v >= 1.0 for v in r):  # (also false for NaN)
        raise bad()
    return r  # batch/channel entries other than 1: the op raises NotImplementedError, as TF


class _FractionalPool2d(torch.nn.Module):
    _op = None

    def __init__(
        self,
        pooling_ratio: float | Sequence[float],
        pseudo_random: bool = False,
        overlapping: bool = False,
        deterministic: bool = False,
        seed: int = 0,
        seed2: int = 0,
    ) -> None:
        super().__init__()
        name = type(self).__name__
        self.pooling_ratio = _ratio4(name, pooling_ratio)
        if not deterministic and (seed != 0 or seed2 != 0):
            raise ValueError(
                f"{name}: argument 'seed': Both seed and seed2 should be 0 if "
                f"deterministic is false, got seed={seed!r}, seed2={seed2!r}"
            )
        self.pseudo_random, self.overlapping = pseudo_random, overlapping
        self.deterministic = deterministic
        if deterministic and seed == 0 and seed2 == 0:
            # TF draws the seeds of a deterministic op with zero seeds once per kernel
            # instance; the module is our instance, and torch's generator the source.
            seed, seed2 = (int(v) for v in torch.randint(1, 2**62, (2,)))
        self.seed, self.seed2 = seed, seed2
        # Non-persistent buffers: they follow .to(device) and torch.export records their update.
        self.register_buffer("row_pooling_sequence", None, persistent=False)
        self.register_buffer("col_pooling_sequence", None, persistent=False)

    def extra_repr(self):
        return (
            f"pooling_ratio={self.pooling_ratio}, pseudo_random={self.pseudo_random}, "
            f"overlapping={self.overlapping}, deterministic={self.deterministic}"
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_input(
            x.dim() == 4,
            lambda: (
                f"{type(self).__name__}: argument 'x' must be a 4-D NHWC tensor, got shape "
                f"{list(x.shape)} (for NCHW use x.permute(0, 2, 3, 1))"
            ),
        )
        # An empty batch (a DDP rank without data): TF's op refuses it, a module should not.
        # The pooling sequences come from one zero sample (drawing what a non-empty call would)
        # and the empty output stays connected to x, so that its gradient is x's empty one.
        empty = x.shape[0] == 0
        out, rows, cols = type(self)._op(
            x.new_zeros((1, *x.shape[1:])) if empty else x,
            self.pooling_ratio,
            self.pseudo_random,
            self.overlapping,
            self.deterministic,
            self.seed,
            self.seed2,
        )
        self.row_pooling_sequence, self.col_pooling_sequence = rows, cols
        if empty:
            return x[:, : out.shape[1], : out.shape[2]]
        return out


class FractionalAvgPool2d(_FractionalPool2d):
    """``tf.nn.fractional_avg_pool`` as a module: NHWC in, NHWC out.

    ``pooling_ratio`` is a float, ``(r_h, r_w)`` or TF's ``[1, r_h, r_w, 1]``. With
    ``deterministic=True`` and nonzero seeds every call uses TF's sequences for those seeds;
    with zero seeds the module fixes a seed pair at construction (like a TF kernel instance).
    The sequences of the last call are kept in ``row_pooling_sequence`` /
    ``col_pooling_sequence``. For an NCHW tensor ``x`` use ``x.permute(0, 2, 3, 1)`` (no copy
    when ``x`` is channels_last). An empty batch gives an empty output of the pooled size (the
    op, like TF's, refuses a batch of 0).
    """

    _op = staticmethod(fractional_avg_pool)


class FractionalMaxPool2d(_FractionalPool2d):
    """``tf.nn.fractional_max_pool`` as a module (see FractionalAvgPool2d for the arguments)."""

    _op = staticmethod(fractional_max_pool)
