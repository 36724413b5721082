"""Shared benchmark helpers: thread setup, the device (`--device cpu|cuda`), timing, copy
bandwidth, TensorFlow in-process and on its Eigen path in a child process, and table printing.

Benchmarks are never timed tests: they print numbers, they do not assert them.
"""

import json
import os
import statistics
import subprocess
import sys
import time

import torch

THREADS = int(os.environ.get("TFGRADS_BENCH_THREADS", "2"))


def setup_process():
    """The benchmark's thread count, and freed memory kept in the heap (below)."""
    torch.set_num_threads(THREADS)
    keep_freed_memory()


def print_host(T):
    """The benchmark's first line: the host CPU, the ISA ATen runs at and which of our CPU kernel
    paths run (torch_tfgrads.cpu), so that every table says where it came from."""
    print(f"host: {T.cpu.describe()}", flush=True)


def add_device_args(ap):
    """The options every family benchmark takes: --device, --quick and --shapes."""
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument(
        "--quick",
        action="store_true",
        help="one shape (the first CPU shape, on cuda the first GPU-sized one; --shapes "
        "overrides) and 3 short rounds: a check that the script runs, not a measurement",
    )
    ap.add_argument(
        "--shapes",
        help="comma-separated indices into the shape list (on cuda: the CPU shapes, then the "
        "GPU-sized ones)",
    )


def select_shapes(args, cpu_shapes, gpu_shapes=()):
    """The shapes to run: the CPU list on cpu, the CPU list and then the GPU-sized list on cuda;
    --shapes picks by index, --quick alone takes the first shape of the device's own list."""
    shapes = list(cpu_shapes) + (list(gpu_shapes) if args.device == "cuda" else [])
    if args.shapes:
        try:
            return [shapes[int(i)] for i in args.shapes.split(",")]
        except (ValueError, IndexError):
            sys.exit(f"--shapes: indices 0..{len(shapes) - 1} into {shapes}, got {args.shapes!r}")
    if args.quick:
        return [gpu_shapes[0] if args.device == "cuda" and gpu_shapes else shapes[0]]
    return shapes


def timing_args(args):
    """interleaved_ms's keywords for this run: its defaults, or 3 short rounds with --quick."""
    return {"rounds": 3, "per_round": 0.02} if args.quick else {}


def setup_device(device, script):
    """Checks that the device can run the benchmark and pins its math. On cuda: a GPU torch can
    see and our CUDA kernels compiled in, else the script exits with a message (no traceback);
    TF32 is turned off for matmuls and cuDNN, so every contender computes in float32."""
    if device != "cuda":
        return
    if not torch.cuda.is_available():
        sys.exit(
            f"{script}: --device cuda needs a GPU that torch can see; torch {torch.__version__} "
            f"(CUDA {torch.version.cuda}) reports none. Run without --device for the CPU tables."
        )
    from torch_tfgrads import _loader

    if not _loader.WITH_CUDA:
        sys.exit(
            f"{script}: --device cuda needs torch_tfgrads built with its CUDA kernels "
            "(FORCE_CUDA=1, as `make gpu-test` builds it); this build has CPU kernels only."
        )
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def print_device(T, device):
    """The benchmark's first line: print_host on cpu; on cuda the GPU (name, compute capability,
    SMs, memory), the CUDA and cuDNN versions and the TF32 settings the run pinned."""
    if device != "cuda":
        print_host(T)
        return
    p = torch.cuda.get_device_properties(device)
    print(
        f"device: {torch.cuda.get_device_name(device)}, compute capability {p.major}.{p.minor}, "
        f"{p.multi_processor_count} SMs, {p.total_memory / 2**30:.0f} GiB; torch "
        f"{torch.__version__}, CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}; "
        f"torch.backends.cuda.matmul.allow_tf32 = {torch.backends.cuda.matmul.allow_tf32}, "
        f"torch.backends.cudnn.allow_tf32 = {torch.backends.cudnn.allow_tf32}",
        flush=True,
    )


def keep_freed_memory():
    """Makes glibc keep freed blocks in the heap instead of returning them to the OS.

    By default glibc serves a large block with its own mmap once the dynamic threshold has been
    reset (as it is, in practice, in a process that has imported TensorFlow), and unmaps it when
    freed: every op then page-faults on each page of its freshly allocated output (measured with
    TF loaded: 300-800 faults per 12.8-25.7 MB output, which made the same op 2x slower in
    some processes and not in others). With the thresholds raised, every contender (ours, TF,
    PyTorch) reuses heap memory as a caching allocator would. Linux/glibc only; elsewhere a no-op.
    """
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
    libc.mallopt(M_MMAP_THRESHOLD, 1 << 30)
    libc.mallopt(M_TRIM_THRESHOLD, 1 << 30)


def import_tf():
    """TensorFlow with its default CPU path (oneDNN unless the caller set TF_ENABLE_ONEDNN_OPTS=0),
    limited to the benchmark's thread count. None if TensorFlow is not installed."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    try:
        import tensorflow as tf
    except ImportError:
        return None
    tf.config.threading.set_intra_op_parallelism_threads(THREADS)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    return tf


def median_ms(fn, min_time=0.25, min_runs=5, warmup=2):
    """Median wall time of fn() in milliseconds. Starts with a short idle pause: TensorFlow's
    (and OpenMP's) worker threads spin for a while after their last op, and on a 2-core machine
    they would slow down whatever is timed next."""
    time.sleep(0.2)
    for _ in range(warmup):
        fn()
    times = []
    start = time.perf_counter()
    while len(times) < min_runs or time.perf_counter() - start < min_time:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def interleaved_ms(fns, rounds=7, per_round=0.08, pause=None, device="cpu"):
    """{name: ms} for several callables timed in alternating rounds (each round: a short idle
    pause, one warm-up call, then calls for `per_round` seconds; its median), reported as the
    median over rounds. Interleaving spreads the machine's slow phases over every peer, so the
    ratios taken in one run are comparable on a noisy machine; the order rotates from round to
    round, so no peer always runs first or right after the same other one (on a shared host the
    position alone moved a kernel's time by up to 40%: docs/perf-notes/fractional_pool.md).

    On cuda each timed call runs alone on the device: the warm-up is synchronized outside the
    timed region, and each call is timed with CUDA events recorded around it, after a
    torch.cuda.synchronize() and waited for with another, so a call's time is the device time
    from its first launch to the end of its last kernel (gaps while the host launches included).
    The idle pause (default 0.2 s on cpu, for TF's spinning worker threads) defaults to 0 there.
    """
    cuda = torch.device(device).type == "cuda"
    if pause is None:
        pause = 0.0 if cuda else 0.2
    timed = _cuda_timer() if cuda else _cpu_call_s
    per = {name: [] for name in fns}
    names = list(fns)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            fn = fns[name]
            time.sleep(pause)
            fn()
            if cuda:
                torch.cuda.synchronize()
            times = []
            start = time.perf_counter()
            while len(times) < 3 or time.perf_counter() - start < per_round:
                times.append(timed(fn))
            per[name].append(statistics.median(times))
    return {name: statistics.median(v) * 1e3 for name, v in per.items()}


def _cpu_call_s(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _cuda_timer():
    """A timer of one call on the current CUDA device, in seconds between two events."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def timed(fn):
        torch.cuda.synchronize()
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) * 1e-3

    return timed


def copy_bandwidth_gbs(numel, dtype=torch.float32):
    """Measured bytes/s (read + write) of a plain tensor copy of this many elements."""
    fn = copy_fn(numel, dtype)
    return copy_gbs(numel, median_ms(fn), dtype)


def copy_fn(numel, dtype=torch.float32, device="cpu"):
    """A callable copying `numel` elements between two tensors of their own on `device` (to time
    beside an op in interleaved rounds; see copy_gbs)."""
    src = torch.randn(numel, device=device).to(dtype)
    dst = torch.empty_like(src)
    return lambda: dst.copy_(src)


def last_level_cache_bytes(default=32 << 20):
    """The CPU's L3 size as Linux's sysfs reports it (torch_tfgrads.cpu.l3_bytes), else
    `default`."""
    from torch_tfgrads import cpu

    return cpu.l3_bytes() or default


def device_cache_bytes(device="cpu"):
    """The last-level cache of `device`: the GPU's L2 on cuda, else the CPU's (sysfs)."""
    if torch.device(device).type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return getattr(props, "L2_cache_size", 0) or 64 << 20
    return last_level_cache_bytes()


def dram_copy_numel(dtype=torch.float32, device="cpu"):
    """Elements per array of a copy that measures memory bandwidth, not a cache's: STREAM's rule,
    each array at least 4 times the last-level cache (the GPU's L2 on cuda: its HBM/DRAM)."""
    return 4 * device_cache_bytes(device) // dtype.itemsize


def copy_gbs(numel, ms, dtype=torch.float32):
    """Bytes/s (read + write counted) of a copy of `numel` elements that took `ms`."""
    return 2 * numel * dtype.itemsize / (ms * 1e-3) / 1e9


def run_child(script, args, env_overrides):
    """Runs `script args` in a child process with env overrides; returns its last JSON line."""
    env = dict(os.environ, **env_overrides)
    out = subprocess.run(
        [sys.executable, script, *args], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def fmt_ms(v):
    return f"{v:8.3f}" if v == v else f"{'-':>8}"


def print_table(headers, rows):
    widths = [max(len(str(h)), *(len(str(r[i])) for r in rows)) for i, h in enumerate(headers)]
    line = " | ".join(str(h).rjust(w) for h, w in zip(headers, widths))
    print(line)
    print("-|-".join("-" * w for w in widths))
    for r in rows:
        print(" | ".join(str(c).rjust(w) for c, w in zip(r, widths)))
