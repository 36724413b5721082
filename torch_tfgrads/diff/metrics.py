"""The four numbers a diff report gives per tensor, and the tolerance test.

Relative errors are *normwise*: ``max |torch - ref| / scale``, where ``scale`` is the largest
magnitude of the reference tensor. An element-wise relative error is useless here: at elements
that are zero up to rounding (a sum of products that cancel) any two correct implementations
differ by 100 %. A tensor whose every element is such a rounding residue (the gradient of a
bias that feeds a batch norm in training is analytically zero) is measured against the scale of
its layer's other tensors of the same kind instead; :func:`group_scales` picks those scales.

Example::

    >>> import numpy as np, torch
    >>> m = measure(torch.tensor([1.0, 2.0]), np.array([1.0, 2.5], np.float32), rtol=1e-5)
    >>> (round(m.max_rel, 3), m.frac_over, m.over)
    (0.2, 0.5, True)
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
import torch

#: Default relative tolerance per compared dtype: a few hundred ulps of the dtype, what one layer's
#: reordered sums and transcendental functions differ by between TF's kernels and torch's.
DEFAULT_RTOL = {"float64": 1e-10, "float32": 1e-5, "float16": 1e-2, "bfloat16": 1e-2}

# A tensor counts as "zero up to rounding" if it is this much smaller than its group.
_NOISE_FLOOR = 1e-4

_INT_VIEW = {np.dtype(np.float16): np.int16, np.dtype(np.float32): np.int32}


@dataclass
class Metric:
    """How one torch tensor differs from its reference.

    ``max_abs``: largest absolute difference. ``max_rel``: ``max_abs / scale``. ``max_ulp``:
    largest distance in units in the last place of the compared dtype (the reference's).
    ``frac_over``: fraction of the elements whose difference exceeds ``atol + rtol * scale``.
    ``over``: whether any element does. ``note`` says why a comparison could not be made
    (shape mismatch, missing tensor); then the errors are ``inf``.
    """

    max_abs: float
    max_rel: float
    max_ulp: float
    frac_over: float
    scale: float
    numel: int
    over: bool
    note: str = ""

    def to_dict(self) -> dict:
        """The metric as JSON-ready data: non-finite numbers become None (the note says why)."""
        return {
            k: (None if isinstance(v, float) and not math.isfinite(v) else v)
            for k, v in asdict(self).items()
        }


def failed(note: str, numel: int = 0) -> Metric:
    """A comparison that could not be made (counts as over tolerance)."""
    inf = math.inf
    return Metric(inf, inf, inf, 1.0, 0.0, numel, True, note)


def ordered_bits(a: np.ndarray) -> np.ndarray:
    """Floats mapped to integers that are consecutive for consecutive floats (as int64, or as
    float64 for float64 input, whose integers do not fit): the difference of two such values is
    the ULP distance. +0 and -0 map to the same integer."""
    if a.dtype == np.float64:
        bits = a.view(np.int64)
        mag = (bits & np.int64(0x7FFF_FFFF_FFFF_FFFF)).astype(np.float64)
        return np.where(bits < 0, -mag, mag)
    view = _INT_VIEW.get(a.dtype)
    if view is None:  # bfloat16 and friends are compared in float32
        return ordered_bits(a.astype(np.float32))
    bits = a.view(view).astype(np.int64)
    mask = (1 << (8 * a.dtype.itemsize - 1)) - 1
    mag = bits & mask
    return np.where(bits < 0, -mag, mag)


def ulp_distance(actual: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """Element-wise ULP distance in ``ref``'s float dtype (``actual`` is rounded to it first).
    NaN against a number is ``inf``; NaN against NaN is 0."""
    a, ref = np.atleast_1d(actual.astype(ref.dtype)), np.atleast_1d(ref)
    d = np.abs(ordered_bits(a).astype(np.float64) - ordered_bits(ref).astype(np.float64))
    na, nr = np.isnan(a), np.isnan(ref)
    d[na | nr] = np.inf
    d[na & nr] = 0.0
    return d


def ref_magnitude(ref: np.ndarray) -> float:
    """The largest finite magnitude of a reference tensor (0 for an empty or non-float one)."""
    if ref.size == 0 or not np.issubdtype(ref.dtype, np.floating):
        return float(np.abs(ref).max()) if ref.size and np.issubdtype(ref.dtype, np.number) else 0.0
    r = np.abs(ref.astype(np.float64))
    r = r[np.isfinite(r)]
    return float(r.max()) if r.size else 0.0


def group_scales(magnitudes: list[float]) -> list[float]:
    """The scale each tensor of a group (one layer's tensors of one kind) is measured against:
    its own magnitude, or the group's largest where its own is below ``1e-4`` of that (a
    tensor that is zero up to rounding; its rounding residue is of the group's size)."""
    top = max(magnitudes, default=0.0)
    return [m if m > _NOISE_FLOOR * top else top for m in magnitudes]


def measure(
    actual: torch.Tensor | None,
    ref: np.ndarray,
    *,
    rtol: float,
    atol: float = 0.0,
    scale: float | None = None,
) -> Metric:
    """Compare ``actual`` (torch) with ``ref`` (numpy); ``scale`` defaults to ``ref``'s largest
    magnitude. Integer and bool tensors are compared exactly (any difference is over).

    Example::

        >>> measure(None, np.zeros(3), rtol=1e-5).note
        'missing on the torch side'
    """
    if actual is None:
        return failed("missing on the torch side", int(ref.size))
    a = actual.detach().cpu()
    if tuple(a.shape) != tuple(ref.shape):
        return failed(
            f"shape {list(a.shape)} (torch) vs {list(ref.shape)} (reference)", int(ref.size)
        )
    if a.dtype == torch.bfloat16:
        a = a.float()
    a, ref = np.atleast_1d(a.numpy()), np.atleast_1d(ref)  # 0-d arrays (a loss) as 1-d
    if ref.size == 0:
        return Metric(0.0, 0.0, 0.0, 0.0, 0.0, 0, False)
    if not np.issubdtype(ref.dtype, np.floating):
        diff = np.abs(a.astype(np.float64) - ref.astype(np.float64))
        n_over = int((diff > 0).sum())
        worst = float(diff.max())
        return Metric(worst, worst, worst, n_over / ref.size, 1.0, int(ref.size), n_over > 0)
    if scale is None:
        scale = ref_magnitude(ref)
    a64, r64 = a.astype(np.float64), ref.astype(np.float64)
    with np.errstate(invalid="ignore"):
        diff = np.abs(a64 - r64)
    same = (a64 == r64) | (np.isnan(a64) & np.isnan(r64))  # equal infinities, NaN against NaN
    diff[same] = 0.0
    diff[np.isnan(diff)] = np.inf
    threshold = atol + rtol * scale
    over = diff > threshold
    max_abs = float(diff.max())
    max_rel = max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else math.inf)
    ulp = float(ulp_distance(a, ref).max())
    return Metric(
        max_abs, max_rel, ulp, float(over.mean()), float(scale), int(ref.size), bool(over.any())
    )
