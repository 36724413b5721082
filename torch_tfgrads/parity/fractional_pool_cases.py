"""Randomised FractionalPool cases shared by the TF parity tests and the parity command."""

from dataclasses import dataclass

import numpy as np
import torch

DTYPES = (torch.float32, torch.float64, torch.int32, torch.int64)


@dataclass
class Case:
    kind: str  # "avg" or "max"
    x: torch.Tensor  # NHWC
    ratio: list
    pseudo_random: bool
    overlapping: bool
    seed: int
    seed2: int

    @property
    def name(self):
        n, h, w, c = self.x.shape
        return (
            f"{self.kind}-{str(self.x.dtype)[6:]}-{n}x{h}x{w}x{c}-r{self.ratio[1]:.2f}x"
            f"{self.ratio[2]:.2f}-{'p' if self.pseudo_random else 'r'}"
            f"{'o' if self.overlapping else ''}-{self.seed}-{self.seed2}"
        )

    def pool_args(self):
        return (
            self.x,
            self.ratio,
            self.pseudo_random,
            self.overlapping,
            True,
            self.seed,
            self.seed2,
        )


def random_cases(n, seed=0):
    """Shapes 1..48 per spatial axis, channels 1..40 (vector and scalar paths), ratios in
    [1, min(dim, 5)], both modes, both overlaps, seeds incl. negative and > 32-bit, TF's dtypes."""
    rng = np.random.default_rng(seed)
    for i in range(n):
        N, H, W = int(rng.integers(1, 4)), int(rng.integers(1, 48)), int(rng.integers(1, 48))
        C = int(rng.choice([1, 3, 8, 16, 40]))
        dtype = DTYPES[(i // 2) % len(DTYPES)]
        g = torch.Generator().manual_seed(int(rng.integers(2**31)))
        x = (torch.randn(N, H, W, C, generator=g, dtype=torch.float64) * 40).to(dtype)
        ratio = [
            1.0,
            float(rng.uniform(1.0, min(H, 5.0))),
            float(rng.uniform(1.0, min(W, 5.0))),
            1.0,
        ]
        seeds = [
            (int(rng.integers(1, 2**31)), int(rng.integers(0, 2**31))),
            (int(rng.integers(-(2**62), 2**62)), int(rng.integers(-(2**40), 2**40))),
            (0, 1),
        ]
        s, s2 = seeds[int(rng.integers(len(seeds)))]
        yield Case(
            "avg" if i % 2 == 0 else "max",
            x,
            ratio,
            bool(rng.integers(2)),
            bool(rng.integers(2)),
            s,
            s2,
        )
