"""Shared test fixtures.

TensorFlow is the oracle: it must be imported on its Eigen path (TF_ENABLE_ONEDNN_OPTS=0),
which has to be set before the first import, hence here. With TFGRADS_REQUIRE_TF=1 (CI), a
missing TensorFlow fails the tests that need it instead of skipping them.
"""
import os

os.environ["TF_ENABLE_ONEDNN_OPTS"] = "0"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import pytest  # noqa: E402
import torch  # noqa: E402

import torch_tfgrads  # noqa: E402,F401
from torch_tfgrads.parity._tf import TFUnavailable, import_tf  # noqa: E402

REQUIRE_TF = os.environ.get("TFGRADS_REQUIRE_TF", "0") == "1"


@pytest.fixture(scope="session")
def tf():
    try:
        return import_tf()
    except TFUnavailable as e:
        if REQUIRE_TF:
            pytest.fail(f"TFGRADS_REQUIRE_TF=1 but {e}")
        pytest.skip(str(e))


def cuda_kernels_available():
    return torch.cuda.is_available() and torch._C._dispatch_has_kernel_for_dispatch_key(
        "tfgrads::fused_batch_norm_v3", "CUDA")


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not cuda_kernels_available(), reason="needs a GPU and the CUDA kernels compiled in"))]


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(12345)  # differs from the explicit generators the tests seed with 0


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
    not AVX512, reason="our AVX-512 kernels run only where ATen runs at AVX512")

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
    import subprocess
    import sys
    torch.save(calls, tmp_path / "calls.pt")
    env = dict(os.environ, ATEN_CPU_CAPABILITY="avx2")
    subprocess.run([sys.executable, "-c", _AVX2_CHILD, str(tmp_path / "calls.pt"),
                    str(tmp_path / "avx2.pt")], env=env, check=True)
    return torch.load(tmp_path / "avx2.pt")
