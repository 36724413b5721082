"""Deployment with AOTInductor, per family: torch.export -> aoti_compile_and_package -> load the
package in a fresh process (which imports torch_tfgrads to register the ops) -> the same numbers
as eager. Inference only (AOTInductor runs forward graphs)."""

import subprocess
import sys
import textwrap

import pytest
import torch

import torch_tfgrads as T


class BatchNormNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.bn = T.nn.FusedBatchNorm(6)
        self.bn_nchw = T.nn.FusedBatchNorm(6, data_format="NCHW")

    def forward(self, x):
        y = self.bn(x)  # training mode: batch statistics and the running-average update
        return self.bn_nchw(y.permute(0, 3, 1, 2))


class DepthwiseNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.same = T.nn.DepthwiseConv2d(6, 3, padding="same", depth_multiplier=2)
        self.valid = T.nn.DepthwiseConv2d(12, (2, 3), strides=(2, 1), padding="valid")

    def forward(self, x):
        y = self.valid(self.same(x))
        explicit = T.depthwise_conv2d_native(
            x, self.same.depthwise_kernel, [1, 1, 1, 1], "EXPLICIT", [0, 0, 1, 2, 0, 1, 0, 0]
        )
        return y, explicit


class FractionalPoolNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.avg = T.nn.FractionalAvgPool2d(
            1.5, pseudo_random=True, deterministic=True, seed=3, seed2=4
        )
        self.max = T.nn.FractionalMaxPool2d(
            (1.4, 1.7), overlapping=True, deterministic=True, seed=5, seed2=6
        )

    def forward(self, x):
        return self.avg(x), self.max(x)


class RnnNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = T.nn.CudnnLSTM(1, 5, input_size=6, time_major=False)
        self.gru = T.nn.CudnnGRU(1, 4, direction="bidirectional", input_size=5, time_major=False)

    def forward(self, x):
        y, _ = self.lstm(x)
        z, (h,) = self.gru(y)
        return z, h


def _case(family):
    torch.manual_seed(0)
    if family == "fused_batch_norm":
        return BatchNormNet().train(), (torch.randn(4, 5, 5, 6),)
    if family == "depthwise_conv2d":
        return DepthwiseNet().eval(), (torch.randn(2, 9, 8, 6),)
    if family == "fractional_pool":
        return FractionalPoolNet().eval(), (torch.randn(2, 11, 12, 3),)
    return RnnNet().eval(), (torch.randn(3, 7, 6),)


_CHILD = textwrap.dedent("""
    import sys, torch
    import torch_tfgrads  # registers the ops the package calls
    runner = torch._inductor.aoti_load_package(sys.argv[1])
    inputs = torch.load(sys.argv[2])
    out = runner(*inputs)
    torch.save(out, sys.argv[3])
""")


@pytest.mark.parametrize(
    "family", ["fused_batch_norm", "depthwise_conv2d", "fractional_pool", "cudnn_rnn"]
)
def test_aoti_package_runs_in_a_fresh_process(family, tmp_path):
    model, inputs = _case(family)
    with torch.no_grad():
        expected = model(*inputs)
    model, inputs = _case(family)  # fresh running statistics for the exported graph
    ep = torch.export.export(model, inputs)
    package = torch._inductor.aoti_compile_and_package(ep, package_path=str(tmp_path / "m.pt2"))
    torch.save(inputs, tmp_path / "inputs.pt")
    subprocess.run(
        [
            sys.executable,
            "-c",
            _CHILD,
            package,
            str(tmp_path / "inputs.pt"),
            str(tmp_path / "out.pt"),
        ],
        check=True,
        timeout=300,
    )
    got = torch.load(tmp_path / "out.pt")
    expected = expected if isinstance(expected, tuple) else (expected,)
    got = got if isinstance(got, (tuple, list)) else (got,)
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-6, atol=1e-6)
