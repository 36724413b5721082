"""Helpers shared by the test modules (imported as `from helpers import ...`; pytest puts this
directory on sys.path). Fixtures live in conftest.py."""

import os
import subprocess
import sys

import pytest
import torch

REQUIRE_TF = os.environ.get("TFGRADS_REQUIRE_TF", "0") == "1"
# With TFGRADS_REQUIRE_CUDA=1 (the GPU test kit), a missing GPU or missing CUDA kernels fail the
# CUDA tests instead of skipping them.
REQUIRE_CUDA = os.environ.get("TFGRADS_REQUIRE_CUDA", "0") == "1"


def cuda_kernels_available():
    return torch.cuda.is_available() and torch._C._dispatch_has_kernel_for_dispatch_key(
        "tfgrads::fused_batch_norm_v3", "CUDA"
    )


def _cuda_marks():
    marks = [pytest.mark.needs_cuda]
    if not REQUIRE_CUDA:
        marks.append(
            pytest.mark.skipif(
                not cuda_kernels_available(),
                reason="needs a GPU and the CUDA kernels compiled in",
            )
        )
    return marks


# Parametrize a test over these to run it on CPU and, where a GPU is usable, on CUDA.
DEVICES = ["cpu", pytest.param("cuda", marks=_cuda_marks())]
CUDA_DEVICES = [pytest.param("cuda", marks=_cuda_marks())]


# Preamble of the child scripts that prove a path TF-free: any import of TensorFlow, Keras or
# tf-keras raises in the child.
BLOCK_TF = """
import sys
class _Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("tensorflow", "keras", "tf_keras"):
            raise ImportError(f"{name} is blocked in this test")
sys.meta_path.insert(0, _Block())
"""


def rel_err(actual, expected):
    """Normwise (L-infinity) relative error, computed in float64."""
    a, e = actual.detach().cpu().double(), expected.detach().cpu().double()
    assert a.shape == e.shape, (a.shape, e.shape)
    if e.numel() == 0:
        return 0.0
    denom = e.abs().max().clamp_min(1e-30)
    return ((a - e).abs().max() / denom).item()


AVX512 = torch.backends.cpu.get_cpu_capability() == "AVX512"
needs_avx512 = pytest.mark.skipif(
    not AVX512, reason="our AVX-512 kernels run only where ATen runs at AVX512"
)

_AVX2_CHILD = """
import sys, torch, torch_tfgrads as T
assert torch.backends.cpu.get_cpu_capability() == "AVX2", torch.backends.cpu.get_cpu_capability()
out = []
for name, args in torch.load(sys.argv[1]):
    try:
        out.append(getattr(T, name)(*args))
    except RuntimeError as e:
        out.append(str(e))
torch.save(out, sys.argv[2])
"""


def results_at_avx2(calls, tmp_path):
    """[(torch_tfgrads function name, args)] evaluated in a child process at
    ATEN_CPU_CAPABILITY=avx2, where our AVX-512 kernels are off: the results, or the error
    messages. (The parent runs them at AVX512 and compares.)"""
    torch.save(calls, tmp_path / "calls.pt")
    env = dict(os.environ, ATEN_CPU_CAPABILITY="avx2")
    subprocess.run(
        [sys.executable, "-c", _AVX2_CHILD, str(tmp_path / "calls.pt"), str(tmp_path / "avx2.pt")],
        env=env,
        check=True,
    )
    return torch.load(tmp_path / "avx2.pt")
