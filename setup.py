"""Builds the one extension module `torch_tfgrads._C` (schemas + CPU kernels, + CUDA kernels).

Decisions (printed at build time):
* CUDA: `csrc/cuda/*.cu` are compiled when torch is a CUDA build and nvcc is found
  (`FORCE_CUDA=1` insists and fails loudly if that is impossible, `USE_CUDA=0` turns it off).
  With no visible GPU and no `TORCH_CUDA_ARCH_LIST`, the arch list defaults to 9.0 (H100/H200).
* CPU SIMD: ATen's `at::vec::Vectorized` is compiled for AVX2+FMA when the building CPU has
  them (this package is always built on the machine that runs it); `TFGRADS_CPU_BASELINE=1`
  builds the portable baseline instead. The choice is recorded in `_build_info.py` and checked
  at import, so a mismatched CPU gets an ImportError, never an illegal instruction.
* `DEBUG=1`: -O0 -g (and -lineinfo for nvcc). Release builds carry no debug info (-g0 overrides
  the -g of Python's sysconfig CFLAGS: debug info would otherwise be most of the module).
* Runtime requirement: the C++ code uses torch's C++ API, whose ABI changes between minor
  releases, so the built package requires the building torch's major.minor (`torch>=X.Y,<X.Z`),
  and `_loader.py` checks it again at import.
* torch must already be installed: build with `pip install --no-build-isolation .`.
"""

import glob
import os
import sys

from setuptools import setup

try:
    import torch
    from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension
except ImportError as e:
    # pyproject.toml cannot list torch as a build requirement (an isolated build would fetch the
    # newest torch and build against the wrong ABI), so a plain `pip install .` lands here.
    sys.exit(
        f"torch_tfgrads: building needs torch ({e}): install torch first, then build with "
        "`pip install --no-build-isolation .` (pip's isolated build environment has no torch)"
    )

ROOT = os.path.dirname(os.path.abspath(__file__))
PKG = "torch_tfgrads"


def _env_flag(name, default="0"):
    return os.environ.get(name, default).strip().lower() in ("1", "true", "yes", "on")


def _want_cuda():
    if not _env_flag("USE_CUDA", "1"):
        return False, "USE_CUDA=0"
    is_cuda_torch = torch.version.cuda is not None
    if _env_flag("FORCE_CUDA"):
        if not is_cuda_torch or CUDA_HOME is None:
            raise RuntimeError(
                "FORCE_CUDA=1 but torch is a CPU build (torch.version.cuda is None) or nvcc was "
                f"not found (CUDA_HOME={CUDA_HOME}); install a CUDA torch and the CUDA toolkit"
            )
        return True, "FORCE_CUDA=1"
    if not is_cuda_torch:
        return False, f"torch {torch.__version__} is a CPU build"
    if CUDA_HOME is None:
        return False, "nvcc not found (set CUDA_HOME)"
    return True, f"torch {torch.__version__} (CUDA {torch.version.cuda}) and nvcc in {CUDA_HOME}"


def _cpu_has_avx2():
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith("flags")), "").split()
    except OSError:
        return False
    return all(flag in flags for flag in ("avx2", "fma", "f16c"))


def with_ptx(arch_list):
    """TORCH_CUDA_ARCH_LIST with "+PTX" on its newest arch (unless some entry has it already)."""
    archs = arch_list.replace(",", ";").replace(" ", ";").split(";")
    archs = [a for a in archs if a]
    if not archs or any(a.endswith("+PTX") for a in archs):
        return arch_list
    newest = max(range(len(archs)), key=lambda k: float(archs[k].split("+")[0].rstrip("a")))
    archs[newest] += "+PTX"
    return ";".join(archs)


def _cxx_accepts(flags):
    """Whether the C++ compiler takes these flags (tuning flags differ between GCC versions)."""
    import subprocess
    import tempfile

    cxx = os.environ.get("CXX", "c++")
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "probe.cpp")
        with open(src, "w") as f:
            f.write("int main() { return 0; }\n")
        try:
            return (
                subprocess.run(
                    [cxx, *flags, "-Werror", "-c", src, "-o", src + ".o"], capture_output=True
                ).returncode
                == 0
            )
        except OSError:
            return False


def _extension():
    debug = _env_flag("DEBUG")
    use_cuda, why = _want_cuda()
    sources = sorted(glob.glob(os.path.join("csrc", "*.cpp")))
    sources += sorted(glob.glob(os.path.join("csrc", "common", "*.cpp")))
    sources += sorted(glob.glob(os.path.join("csrc", "cpu", "*.cpp")))
    sanitize = _env_flag("TFGRADS_SANITIZE")
    # -g0 comes after sysconfig's CFLAGS (which carry -g) on the command line, so it wins.
    cxx = ["-O0", "-g"] if debug else ["-O3"] if sanitize else ["-O3", "-g0"]
    link = ["-fopenmp"]
    if sanitize:
        # AddressSanitizer + UndefinedBehaviorSanitizer (`make sanitize`): any out-of-bounds
        # access, use of freed memory or undefined behaviour in our kernels aborts the test run.
        flags = [
            "-fsanitize=address,undefined",
            "-fno-sanitize-recover=all",
            "-fno-omit-frame-pointer",
            "-g",
        ]
        cxx += flags
        link += flags
    # no fast-math: TF parity. nvcc does not get sysconfig's CFLAGS; -g0 still keeps the host
    # side free of debug info whatever the host compiler's defaults.
    nvcc = ["-O0", "-g", "-lineinfo"] if debug else ["-O3", "-Xcompiler", "-g0"]
    cxx.append("-fopenmp")  # ATen's parallel_for backend in the official wheels is OpenMP
    # GCC turns the loops that zero a kernel's accumulator arrays into memset calls, which
    # forces those arrays onto the stack (a `rep stos` per tile, then loads into registers).
    if _cxx_accepts(["-fno-tree-loop-distribute-patterns"]):
        cxx.append("-fno-tree-loop-distribute-patterns")

    simd = "baseline"
    if not _env_flag("TFGRADS_CPU_BASELINE") and _cpu_has_avx2():
        simd = "AVX2"
        cxx += ["-mavx2", "-mfma", "-mf16c", "-DCPU_CAPABILITY=AVX2", "-DCPU_CAPABILITY_AVX2"]
        # GCC's generic tuning splits unaligned 256-bit loads/stores into 128-bit halves and
        # copies vector objects in 16-byte pieces (stores then a wide reload: a store-forwarding
        # stall); every AVX2 CPU does better with whole 256-bit accesses.
        for tune in (
            ["-mno-avx256-split-unaligned-load", "-mno-avx256-split-unaligned-store"],
            ["-mmove-max=256", "-mstore-max=256"],
        ):
            if _cxx_accepts(tune):
                cxx += tune
    else:
        cxx += ["-DCPU_CAPABILITY=DEFAULT"]

    define_macros = []
    if use_cuda:
        sources += sorted(glob.glob(os.path.join("csrc", "cuda", "*.cu")))
        define_macros.append(("WITH_CUDA", None))
        if not os.environ.get("TORCH_CUDA_ARCH_LIST") and not torch.cuda.is_available():
            os.environ["TORCH_CUDA_ARCH_LIST"] = "9.0"
            print("torch_tfgrads: no GPU visible, TORCH_CUDA_ARCH_LIST defaults to 9.0")
        if os.environ.get("TORCH_CUDA_ARCH_LIST"):
            # PTX of the newest arch too, so that a newer GPU JIT-compiles the kernels instead
            # of failing with "no kernel image" (torch adds it itself only to a detected list).
            os.environ["TORCH_CUDA_ARCH_LIST"] = with_ptx(os.environ["TORCH_CUDA_ARCH_LIST"])
        nvcc += ["--expt-relaxed-constexpr", "-Werror=cross-execution-space-call"]
        if _env_flag("TFGRADS_PTXAS_VERBOSE"):
            # Registers and spills per kernel (make cuda-check fails on any spill).
            nvcc += ["-Xptxas=-v"]

    print(
        f"torch_tfgrads: CUDA kernels {'ON' if use_cuda else 'OFF'} ({why}); "
        f"CPU SIMD {simd}; {'debug' if debug else 'release'} build"
        f"{'; ASan+UBSan' if sanitize else ''}; {len(sources)} sources"
    )
    with open(os.path.join(ROOT, PKG, "_build_info.py"), "w") as f:
        f.write("# Written by setup.py at build time.\n")
        f.write(f"CPU_SIMD = {simd!r}\nWITH_CUDA = {use_cuda!r}\n")
        f.write(f"TORCH_VERSION = {torch.__version__!r}\n")

    ext = CUDAExtension if use_cuda else CppExtension
    extra = {"cxx": cxx, "nvcc": nvcc} if use_cuda else {"cxx": cxx}
    module = ext(
        f"{PKG}._C",
        sources,
        include_dirs=[os.path.join(ROOT, "csrc")],
        define_macros=define_macros,
        extra_compile_args=extra,
        extra_link_args=link,
        py_limited_api=True,
    )
    if use_cuda:
        _use_wheel_cudart(module)
    return module


def _use_wheel_cudart(module):
    """A toolkit with only the compiler (no lib64/libcudart.so, as on our CPU machines) can still
    link against the CUDA runtime that torch's own nvidia-cuda-runtime wheel ships."""
    if glob.glob(os.path.join(CUDA_HOME, "lib64", "libcudart.so")) or glob.glob(
        os.path.join(CUDA_HOME, "lib", "libcudart.so")
    ):
        return
    import site

    for sp in site.getsitepackages():
        nvidia = os.path.join(sp, "nvidia")
        found = sorted(
            glob.glob(os.path.join(nvidia, "*", "lib", "libcudart.so.*"))
            + glob.glob(os.path.join(nvidia, "cuda_runtime", "lib", "libcudart.so.*"))
        )
        if found:
            module.library_dirs.append(os.path.dirname(found[0]))
            module.libraries = [
                f":{os.path.basename(found[0])}" if lib == "cudart" else lib
                for lib in module.libraries
            ]
            print(f"torch_tfgrads: linking the CUDA runtime of torch's wheel: {found[0]}")
            return


def _install_requires():
    """The built module only loads with the torch minor release it was compiled against."""
    major, minor = (int(part) for part in torch.__version__.split("+")[0].split(".")[:2])
    return [f"torch>={major}.{minor},<{major}.{minor + 1}", "numpy"]


setup(
    ext_modules=[_extension()],
    install_requires=_install_requires(),
    cmdclass={"build_ext": BuildExtension},
    options={"bdist_wheel": {"py_limited_api": "cp310"}},
)
