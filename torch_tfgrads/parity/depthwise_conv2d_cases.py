"""Randomised DepthwiseConv2dNative cases and their float64 reference, shared by the tests and
the parity command.

The reference is PyTorch's grouped convolution (groups=C) in float64 on explicitly padded input,
with gradients from autograd (a direct float64 loop): the oracle wherever
TF cannot be one (dilations, NCHW, unequal strides: TF's CPU kernels refuse or get them wrong).
"""

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F


def out_size_and_pads(size, k, s, d, padding, explicit=(0, 0)):
    """(out, pad_before, pad_after) by TF's kernel rule (C++ truncating division)."""
    K = (k - 1) * d + 1

    def trunc_div(a, b):
        return a // b if a >= 0 else -((-a) // b)

    if padding == "VALID":
        return trunc_div(size - K + s, s), 0, 0
    if padding == "SAME":
        out = (size + s - 1) // s
        total = max((out - 1) * s + K - size, 0)
        return out, total // 2, total - total // 2
    b, a = explicit
    return trunc_div(size + b + a - K + s, s), b, a


@dataclass
class Case:
    x: torch.Tensor  # in data_format order
    f: torch.Tensor  # [fh, fw, C, M]
    dy: torch.Tensor  # in data_format order, the forward's output shape
    strides: tuple  # (sH, sW)
    dilations: tuple  # (dH, dW)
    padding: str
    explicit: tuple  # ((top, bottom), (left, right)); zeros unless EXPLICIT
    data_format: str

    @property
    def nchw(self):
        return self.data_format == "NCHW"

    @property
    def tf_supported(self):
        """TF's Eigen CPU kernels compute this case (NHWC, equal strides, no dilation)."""
        return not self.nchw and self.dilations == (1, 1) and self.strides[0] == self.strides[1]

    def _four(self, pair):
        return [1, 1, *pair] if self.nchw else [1, *pair, 1]

    def attrs(self):
        """(strides, padding, explicit_paddings, data_format, dilations) as the ops take them."""
        ex = []
        if self.padding == "EXPLICIT":
            (t, b), (l, r) = self.explicit
            ex = [0, 0, 0, 0, t, b, l, r] if self.nchw else [0, 0, t, b, l, r, 0, 0]
        return (
            self._four(self.strides),
            self.padding,
            ex,
            self.data_format,
            self._four(self.dilations),
        )

    @property
    def name(self):
        fh, fw, C, M = self.f.shape
        shape = "x".join(map(str, self.x.shape))
        return (
            f"{self.data_format}-{str(self.x.dtype)[6:]}-{shape}-k{fh}x{fw}m{M}-"
            f"s{self.strides[0]}{self.strides[1]}-d{self.dilations[0]}{self.dilations[1]}-"
            f"{self.padding}{''.join(str(v) for p in self.explicit for v in p)}"
        )


def reference(case):
    """(output, input gradient, filter gradient) in float64, for out_backprop = case.dy."""
    x = case.x.double()
    xt = (x if case.nchw else x.permute(0, 3, 1, 2)).detach().clone().requires_grad_()
    wt = case.f.double().detach().clone().requires_grad_()
    fh, fw, C, M = wt.shape
    H, W = xt.shape[2], xt.shape[3]
    _, pt, pb = out_size_and_pads(
        H, fh, case.strides[0], case.dilations[0], case.padding, case.explicit[0]
    )
    _, pl, pr = out_size_and_pads(
        W, fw, case.strides[1], case.dilations[1], case.padding, case.explicit[1]
    )
    wk = wt.permute(2, 3, 0, 1).reshape(C * M, 1, fh, fw)
    y = F.conv2d(
        F.pad(xt, (pl, pr, pt, pb)), wk, stride=case.strides, dilation=case.dilations, groups=C
    )
    dy = case.dy.double()
    y.backward(dy if case.nchw else dy.permute(0, 3, 1, 2))
    back = (lambda t: t) if case.nchw else (lambda t: t.permute(0, 2, 3, 1))
    return back(y.detach()), back(xt.grad), wt.grad


def random_cases(n, seed=0, tf_only=False, dtypes=(torch.float32, torch.float64)):
    """Spatial sizes 1..14, channels 1..20 (vector and scalar channel paths), filters 1..5,
    multipliers 1..3, strides 1..3, dilations 1..3, all paddings (EXPLICIT up to 3), both data
    formats, both memory formats. tf_only: cases TF's Eigen kernels support."""
    rng = np.random.default_rng(seed)
    made = 0
    while made < n:
        N, H, W = int(rng.integers(1, 4)), int(rng.integers(1, 15)), int(rng.integers(1, 15))
        C = int(rng.choice([1, 3, 8, 9, 16, 20]))
        M = int(rng.choice([1, 1, 2, 3]))
        fh, fw = int(rng.integers(1, 6)), int(rng.integers(1, 6))
        s = (int(rng.integers(1, 4)), int(rng.integers(1, 4)))
        d = (int(rng.integers(1, 4)), int(rng.integers(1, 4)))
        fmt = "NHWC" if tf_only else str(rng.choice(["NHWC", "NCHW"]))
        if tf_only:
            s, d = (s[0], s[0]), (1, 1)
        padding = str(rng.choice(["SAME", "VALID", "EXPLICIT"]))
        ex = (
            (
                (int(rng.integers(0, 4)), int(rng.integers(0, 4))),
                (int(rng.integers(0, 4)), int(rng.integers(0, 4))),
            )
            if padding == "EXPLICIT"
            else ((0, 0), (0, 0))
        )
        Ho = out_size_and_pads(H, fh, s[0], d[0], padding, ex[0])[0]
        Wo = out_size_and_pads(W, fw, s[1], d[1], padding, ex[1])[0]
        if Ho <= 0 or Wo <= 0:
            continue
        dtype = dtypes[made % len(dtypes)]
        g = torch.Generator().manual_seed(int(rng.integers(2**31)))
        x = torch.randn(N, H, W, C, generator=g, dtype=torch.float64)
        f = torch.randn(fh, fw, C, M, generator=g, dtype=torch.float64)
        dy = torch.randn(N, Ho, Wo, C * M, generator=g, dtype=torch.float64)
        if fmt == "NCHW":
            x, dy = x.permute(0, 3, 1, 2), dy.permute(0, 3, 1, 2)
        if rng.integers(2):  # the other memory format half the time (no copy either way)
            x, dy = x.contiguous(), dy.contiguous()
        made += 1
        yield Case(x.to(dtype), f.to(dtype), dy.to(dtype), s, d, padding, ex, fmt)
