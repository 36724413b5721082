"""Fractional average/max pooling modules with TF's arguments (NHWC), over our ops."""
import torch

from ..ops import fractional_avg_pool, fractional_max_pool
from ._checks import check_input


def _ratio4(pooling_ratio):
    """A float, an (r_h, r_w) pair or TF's full [1, r_h, r_w, 1]."""
    if isinstance(pooling_ratio, (int, float)):
        return [1.0, float(pooling_ratio), float(pooling_ratio), 1.0]
    r = [float(v) for v in pooling_ratio]
    if len(r) == 2:
        return [1.0, r[0], r[1], 1.0]
    return r  # the op checks the length, the range and the batch/channel entries


class _FractionalPool2d(torch.nn.Module):
    _op = None

    def __init__(self, pooling_ratio, pseudo_random=False, overlapping=False,
                 deterministic=False, seed=0, seed2=0):
        super().__init__()
        self.pooling_ratio = _ratio4(pooling_ratio)
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
        return (f"pooling_ratio={self.pooling_ratio}, pseudo_random={self.pseudo_random}, "
                f"overlapping={self.overlapping}, deterministic={self.deterministic}")

    def forward(self, x):
        check_input(x.dim() == 4, lambda: (
            f"{type(self).__name__}: the input must be 4-D NHWC, got shape {list(x.shape)} (for "
            "NCHW use x.permute(0, 2, 3, 1))"))
        out, rows, cols = type(self)._op(
            x, self.pooling_ratio, self.pseudo_random, self.overlapping, self.deterministic,
            self.seed, self.seed2)
        self.row_pooling_sequence, self.col_pooling_sequence = rows, cols
        return out


class FractionalAvgPool2d(_FractionalPool2d):
    """``tf.nn.fractional_avg_pool`` as a module: NHWC in, NHWC out.

    ``pooling_ratio`` is a float, ``(r_h, r_w)`` or TF's ``[1, r_h, r_w, 1]``. With
    ``deterministic=True`` and nonzero seeds every call uses TF's sequences for those seeds;
    with zero seeds the module fixes a seed pair at construction (like a TF kernel instance).
    The sequences of the last call are kept in ``row_pooling_sequence`` /
    ``col_pooling_sequence``. For an NCHW tensor ``x`` use ``x.permute(0, 2, 3, 1)`` (no copy
    when ``x`` is channels_last).
    """
    _op = staticmethod(fractional_avg_pool)


class FractionalMaxPool2d(_FractionalPool2d):
    """``tf.nn.fractional_max_pool`` as a module (see FractionalAvgPool2d for the arguments)."""
    _op = staticmethod(fractional_max_pool)
