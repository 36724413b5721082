"""Randomised FusedBatchNorm cases, shared by the parity command and the TF parity tests."""

import random
from dataclasses import dataclass

import torch

_FORMATS = ("NHWC", "NCHW", "NDHWC", "NCDHW")


@dataclass
class Case:
    name: str
    x: torch.Tensor
    scale: torch.Tensor
    offset: torch.Tensor
    mean: torch.Tensor
    variance: torch.Tensor
    epsilon: float
    factor: float
    data_format: str
    training: bool
    seed: int

    @property
    def channels_first(self):
        return self.data_format.startswith("NC")

    def forward_args(self):
        return (
            self.x,
            self.scale,
            self.offset,
            self.mean,
            self.variance,
            self.epsilon,
            self.factor,
            self.data_format,
            self.training,
        )

    def _gen(self, salt):
        return torch.Generator().manual_seed(self.seed * 7919 + salt)

    def y_backprop(self):
        return torch.randn(self.x.shape, generator=self._gen(1)).to(self.x.dtype)

    def grad_args(self, forward_outputs):
        """Our grad op's arguments, as TF's registered gradient passes them."""
        rs1, rs2 = (
            (forward_outputs[3], forward_outputs[4])
            if self.training
            else (self.mean, self.variance)
        )
        return (
            self.y_backprop(),
            self.x,
            self.scale,
            rs1,
            rs2,
            forward_outputs[5],
            self.epsilon,
            self.data_format,
            self.training,
        )

    def _nhwc_perm(self):
        return (0, 2, 3, 1) if self.x.dim() == 4 else (0, 2, 3, 4, 1)

    def tf_grad_args(self, forward_outputs):
        """TF's Eigen grad kernel refuses NCHW/NCDHW in inference; TF's autograd transposes to
        channels-last around it, and so do we to get TF's numbers."""
        args = self.grad_args(forward_outputs)
        if self.training or not self.channels_first:
            return args
        p = self._nhwc_perm()
        fmt = "NHWC" if self.x.dim() == 4 else "NDHWC"
        return (args[0].permute(p), args[1].permute(p), *args[2:7], fmt, args[8])

    def from_tf_grad_layout(self, grads):
        if self.training or not self.channels_first:
            return grads
        inv = (0, 3, 1, 2) if self.x.dim() == 4 else (0, 4, 1, 2, 3)
        return (grads[0].permute(inv), *grads[1:])

    def second_order_upstream(self):
        C = self.scale.shape[0]
        g = self._gen(2)
        return (
            torch.randn(self.x.shape, generator=g).to(self.x.dtype),
            torch.randn(C, generator=g),
            torch.randn(C, generator=g),
        )


def random_cases(n, seed=0, dtypes=(torch.float32, torch.float32, torch.float16, torch.bfloat16)):
    rng = random.Random(seed)
    for i in range(n):
        fmt = _FORMATS[i % 4]
        rank = 5 if "D" in fmt else 4
        N = rng.choice([1, 2, 3, 8])
        C = rng.choice([1, 3, 4, 8, 13, 32, 64])
        spatial = [rng.randint(1, 9) for _ in range(rank - 2)]
        shape = [N] + ([C] + spatial if fmt.startswith("NC") else spatial + [C])
        dtype = dtypes[i % len(dtypes)] if i % 3 else torch.float32
        training = rng.random() < 0.65
        factor = rng.choice([1.0, 1.0, 0.6, 0.01]) if training else 1.0
        eps = rng.choice([1e-4, 1e-3, 1e-2])
        g = torch.Generator().manual_seed(seed * 1000 + i)
        x = (torch.randn(shape, generator=g) * rng.uniform(0.1, 5) + rng.uniform(-3, 3)).to(dtype)

        def vec(lo, hi):
            return torch.rand(C, generator=g) * (hi - lo) + lo

        name = (
            f"{i:02d}-{fmt}-{'x'.join(map(str, shape))}-{str(dtype)[6:]}-"
            f"{'train' if training else 'infer'}-f{factor}"
        )
        yield Case(
            name,
            x,
            vec(0.5, 1.5),
            vec(-1, 1),
            vec(-1, 1),
            vec(0.5, 2),
            eps,
            factor,
            fmt,
            training,
            seed * 1000 + i,
        )
