"""Loads the compiled extension after checking it was built for this CPU and this torch.

setup.py compiles the CPU kernels for AVX2 when the building machine has it; importing such a
build on a CPU without AVX2 would die with SIGILL, so we refuse with a clear error instead.
The extension uses torch's C++ API, whose ABI changes between torch minor releases: loaded
into another torch it fails with an undefined-symbol error (or worse), so the torch major.minor
recorded at build time must be the running one.
"""

import torch

try:
    from . import _build_info
except ImportError:  # built by other means: nothing recorded, nothing to check
    _build_info = None


def _major_minor(version):
    return ".".join(version.split("+")[0].split(".")[:2])


_built_torch = getattr(_build_info, "TORCH_VERSION", None)
if _built_torch is not None and _major_minor(_built_torch) != _major_minor(torch.__version__):
    raise ImportError(
        f"torch_tfgrads was built against torch {_major_minor(_built_torch)} but torch "
        f"{_major_minor(torch.__version__)} is running; rebuild with "
        "pip install --no-build-isolation . (-e . in a checkout), or install torch "
        f"{_major_minor(_built_torch)}.*"
    )

if (
    _build_info is not None
    and _build_info.CPU_SIMD == "AVX2"
    and torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512")
):
    raise ImportError(
        "torch_tfgrads was compiled for AVX2 but this CPU does not support it; rebuild with "
        "TFGRADS_CPU_BASELINE=1 pip install --no-build-isolation -e ."
    )

from . import _C  # noqa: E402,F401

WITH_CUDA = bool(_build_info and _build_info.WITH_CUDA)
