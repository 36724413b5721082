"""Loads the compiled extension after checking it was built for this CPU.

setup.py compiles the CPU kernels for AVX2 when the building machine has it; importing such a
build on a CPU without AVX2 would die with SIGILL, so we refuse with a clear error instead.
"""
import torch

try:
    from . import _build_info
except ImportError:  # built by other means: nothing recorded, nothing to check
    _build_info = None

if _build_info is not None and _build_info.CPU_SIMD == "AVX2":
    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        raise ImportError(
            "torch_tfgrads was compiled for AVX2 but this CPU does not support it; rebuild with "
            "TFGRADS_CPU_BASELINE=1 pip install --no-build-isolation -e .")

from . import _C  # noqa: E402,F401

WITH_CUDA = bool(_build_info and _build_info.WITH_CUDA)
