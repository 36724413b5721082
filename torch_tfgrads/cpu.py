"""Which CPU kernel paths run on this host, and how to force the others.

The CPU kernels are compiled for AVX2 + FMA (one binary for every x86-64 CPU with AVX2). A few
have a second, AVX-512 version chosen at run time, and the recurrent family has a fast path on
oneDNN's BRGEMM micro-kernels where ATen ships them. These environment variables, read once per
process at the first use, force a path so that any host can measure and test the others:

* ``TFGRADS_CPU_CAPABILITY=avx2``: our AVX-512 kernels off (ATen keeps its own; set
  ``ATEN_CPU_CAPABILITY=avx2`` to turn both off). ``=avx512`` makes their absence an error.
* ``TFGRADS_DISABLE_BRGEMM=1``: the RNN runs its per-step cells and ATen's GEMMs.
* ``TFGRADS_DEPTHWISE_ALIASING=by_pixel|tiles``: how the 8-lane depthwise kernels run the
  layers whose pixels alias in L1 (float channels a multiple of 256): pixel by pixel over all
  channels, or as the sliding tiles. By default pixel by pixel where the CPU lacks AVX-512
  (measured faster on AMD Zen 3); where it has AVX-512 (and runs the 8-lane kernels anyway) the
  tiles, measured faster on Zen 4, except the forward and input gradient of rows of fewer than 8
  columns, measured faster pixel by pixel on Zen 5 (``cpu_paths()`` reports this default as
  ``tiles_from_8_columns``).
* ``TFGRADS_DISABLE_STREAMING=1``: the memory-bound kernels write their large outputs with
  ordinary stores instead of non-temporal ones (same results; which is faster depends on
  whether the output could stay in the host's L3).
* ``TFGRADS_L3_BYTES=<bytes>``: the L3 size the kernels plan with (by default the one sysfs
  reports, ``l3_bytes``): stride-2 depthwise forwards and filter gradients whose source is
  larger read it through row copies, and 256/512-channel depthwise layers whose source is
  larger than half of it sweep 64 channels at a time instead of 256 (same results).

An AVX2 host, peers included, is emulated on an AVX-512 one with
``ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2``: ATen, our
kernels, oneDNN (PyTorch's and TensorFlow's, the RNN's BRGEMM micro-kernels too) and MKL all
stay at AVX2. Those variables belong to the libraries; ``cpu_paths()["forced"]`` lists them
too, so that benchmark headers say what ran.

The RNN's batched GEMMs (weight gradients, GRU's input projection) run on BRGEMM only with our
AVX-512 kernels on; on AVX2 hosts MKL's GEMM, through ATen, is the faster one.

A build without AVX2 (``TFGRADS_CPU_BASELINE=1`` at build time) is the scalar path.
"""

from __future__ import annotations

import os
import platform

import torch

from . import _C

ENV_VARS = (
    "TFGRADS_CPU_CAPABILITY",
    "TFGRADS_DISABLE_BRGEMM",
    "TFGRADS_DEPTHWISE_ALIASING",
    "TFGRADS_DISABLE_STREAMING",
    "TFGRADS_L3_BYTES",
    "ATEN_CPU_CAPABILITY",
    "ONEDNN_MAX_CPU_ISA",
    "MKL_ENABLE_INSTRUCTIONS",
)


def cpu_model() -> str:
    """The CPU's model name (with its family/model numbers on Linux, which tell AMD Zen
    generations apart)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            fields = {}
            for line in f:
                if not line.strip():
                    break  # the first processor is enough
                key, _, value = line.partition(":")
                fields[key.strip()] = value.strip()
        name = fields.get("model name", platform.processor() or platform.machine())
        if "cpu family" in fields:
            name += f" (family {fields['cpu family']}, model {fields.get('model', '?')})"
        return name
    except OSError:
        return platform.processor() or platform.machine()


def l3_bytes() -> int | None:
    """The size of the L3 cache that CPU 0 shares (Linux sysfs, read by the extension, which
    plans with it too), or None where it is not reported. The hosts measured differ by 10x here
    (32 MiB on the AMD VMs, 300 MiB on the Intel one), which decides whether a benchmark's
    tensors stay in cache."""
    return _C._l3_bytes() or None


def cpu_paths() -> dict:
    """``{"cpu", "aten_capability", "avx512_kernels", "rnn_brgemm", "rnn_batched_gemms",
    "rnn_directions_in_turn_above_bytes", "rnn_tiled_steps_min_rows_per_thread",
    "rnn_tiles_before_brgemm_up_to_bytes", "depthwise_aliasing", "streaming_stores",
    "kernel_l3_bytes", "l3_bytes", "forced"}``: the host, the ISA
    ATen dispatches to, whether our AVX-512 kernels and the RNN's BRGEMM path (its fused float32
    steps) run, where the RNN's batched GEMMs run (``"brgemm"`` or ``"aten"``), the size of a
    direction's weights above which a bidirectional layer on two threads runs its directions
    one after the other rather than one per thread, the batch rows each thread
    needs for the RNN's steps to run on our register tiles where BRGEMM does not (fewer: a GEMM
    per step over all threads), the size of a direction's weights up to which the threads
    sharing a direction run it on those tiles before BRGEMM (the 8-lane path; 0 where BRGEMM's
    own schedule runs every direction), how the 8-lane depthwise
    kernels run layers whose pixels alias in L1 (``"by_pixel"``, ``"tiles"`` or
    ``"tiles_from_8_columns"``), whether large
    outputs are written with non-temporal stores, the L3 size the kernels plan with
    (``TFGRADS_L3_BYTES`` or the OS's, 32 MiB where it reports none), the L3 cache's size as
    the OS reports it (None where it does not), and the forcing environment variables that are
    set.

    Raises ValueError for a bad ``TFGRADS_CPU_CAPABILITY`` (or ``=avx512`` on a CPU or an ATen
    without AVX-512), ``TFGRADS_DEPTHWISE_ALIASING`` or ``TFGRADS_L3_BYTES``."""
    paths = dict(_C._cpu_paths())
    return {
        "cpu": cpu_model(),
        "aten_capability": torch.backends.cpu.get_cpu_capability(),
        **paths,
        "l3_bytes": l3_bytes(),
        "forced": {k: os.environ[k] for k in ENV_VARS if os.environ.get(k)},
    }


def describe() -> str:
    """One line for benchmark headers: host, ISA, the paths that run, what is forced."""
    p = cpu_paths()
    forced = ", ".join(f"{k}={v}" for k, v in p["forced"].items()) or "nothing forced"
    # (the aliasing choice only matters on the 8-lane path)
    aliasing = (
        "" if p["avx512_kernels"] else f"depthwise aliasing layers: {p['depthwise_aliasing']}; "
    )
    l3 = f", L3 {p['l3_bytes'] >> 20} MiB" if p["l3_bytes"] else ""
    return (
        f"{p['cpu']}, {os.cpu_count()} CPUs{l3}; ATen {p['aten_capability']}; our AVX-512 kernels "
        f"{'on' if p['avx512_kernels'] else 'off'}; RNN BRGEMM "
        f"{'on' if p['rnn_brgemm'] else 'off'} (batched GEMMs: {p['rnn_batched_gemms']}); "
        f"{aliasing}{forced}"
    )
