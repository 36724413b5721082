"""Benchmark: synchronized batch norm (nn.SyncFusedBatchNorm, training forward + backward) on
2 and 4 processes against the local nn.FusedBatchNorm in the same processes and, on GPU,
torch.nn.SyncBatchNorm.

    python benchmarks/bench_sync_batch_norm.py                 # CPU, gloo, 2 and 4 processes
    python benchmarks/bench_sync_batch_norm.py --device cuda   # NCCL, one GPU per process

Every process runs the same fixed number of calls per round (a collective must be entered by all
of them, so time-based loops would deadlock); rounds alternate the contenders, each after a
barrier, and rank 0 prints the median over rounds. The extra cost of synchronizing is the ratio
sync / local. Processes share the host's cores (1 thread each), so on a small host the absolute
times of 4 processes include oversubscription; the ratio of one run stays comparable.
"""

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

# The tfgrads ops these rows time (tests/test_registry.py checks every op has a benchmark row).
TIMED_OPS = (
    "fused_batch_norm_sync_stats",
    "fused_batch_norm_sync_grad_sums",
    "fused_batch_norm_sync_backprop_input",
)
# Per-process NHWC batches.
SHAPES = [(8, 28, 28, 64), (4, 56, 56, 128), (16, 7, 7, 512)]
ROUNDS, CALLS = 7, 5


def _contenders(shape, device):
    import torch_tfgrads as T

    C = shape[-1]
    x = torch.randn(shape, device=device, requires_grad=True)
    dy = torch.randn(shape, device=device)
    sync = T.nn.SyncFusedBatchNorm(C, device=device)
    local = T.nn.FusedBatchNorm(C, device=device, moving_variance="biased")

    def step(m, inp):
        def run():
            y = m(inp)
            y.backward(dy)

        return run

    fns = {"sync": step(sync, x), "local": step(local, x)}
    # The yardstick: the two all-reduces alone (2C + 1 and 2C floats), what synchronizing must
    # cost at least.
    bufs = torch.zeros(2 * C + 1, device=device), torch.zeros(2 * C, device=device)

    def all_reduces():
        for b in bufs:
            dist.all_reduce(b)

    fns["all-reduces"] = all_reduces
    if device != "cpu":  # torch's SyncBatchNorm refuses CPU tensors
        xc = x.detach().permute(0, 3, 1, 2).requires_grad_()
        tsync = torch.nn.SyncBatchNorm(C, eps=1e-3).to(device)
        dyc = dy.permute(0, 3, 1, 2)

        def torch_run():
            tsync(xc).backward(dyc)

        fns["torch SyncBatchNorm"] = torch_run
    return fns


def _worker(rank, world, store, device, out):
    torch.set_num_threads(1)
    common.keep_freed_memory()
    backend = "nccl" if device == "cuda" else "gloo"
    if device == "cuda":
        torch.cuda.set_device(rank)
        device = f"cuda:{rank}"
    dist.init_process_group(backend, init_method=f"file://{store}", rank=rank, world_size=world)
    results = {}
    for shape in SHAPES:
        fns = _contenders(shape, device)
        times = {k: [] for k in fns}
        for fn in fns.values():  # warm-up, the same on every process
            fn()
        for _ in range(ROUNDS):
            for name, fn in fns.items():
                dist.barrier()
                if device != "cpu":
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(CALLS):
                    fn()
                if device != "cpu":
                    torch.cuda.synchronize()
                times[name].append((time.perf_counter() - t0) / CALLS * 1e3)
        results[shape] = {k: statistics.median(v) for k, v in times.items()}
    if rank == 0:
        torch.save(results, out)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--procs", default="2,4", help="comma-separated process counts")
    args = ap.parse_args()
    common.setup_process()
    import torch_tfgrads as T

    common.print_host(T)
    procs = [int(p) for p in args.procs.split(",")]
    if args.device == "cuda":
        procs = [p for p in procs if p <= torch.cuda.device_count()]
        if not procs:
            print("bench_sync_batch_norm: needs as many GPUs as processes; none of", args.procs)
            return
    print(
        f"SyncFusedBatchNorm, float32 NHWC, training forward + backward, {args.device}, "
        f"1 thread per process, torch {torch.__version__}; ms per step (median of {ROUNDS} "
        "interleaved rounds)"
    )
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for world in procs:
            store, out = os.path.join(tmp, f"store{world}"), os.path.join(tmp, f"out{world}")
            mp.spawn(_worker, args=(world, store, args.device, out), nprocs=world, join=True)
            for shape, t in torch.load(out).items():
                C = shape[-1]
                row = [
                    "x".join(map(str, shape)),
                    world,
                    common.fmt_ms(t["sync"]),
                    common.fmt_ms(t["local"]),
                    f"{t['sync'] / t['local']:.2f}",
                    common.fmt_ms(t["all-reduces"]),
                    (2 * C + 1) * 4 + 2 * C * 4,
                ]
                if "torch SyncBatchNorm" in t:
                    row.insert(4, common.fmt_ms(t["torch SyncBatchNorm"]))
                rows.append(row)
    headers = ["NHWC per process", "processes", "sync", "local FusedBatchNorm", "sync/local"]
    if args.device == "cuda":
        headers.insert(4, "torch SyncBatchNorm")
    common.print_table([*headers, "2 all-reduces alone", "bytes all-reduced per step"], rows)
    print(
        "sync = one all-reduce of 2C+1 floats forward and one of 2C floats backward on top of "
        "the local work; sync/local is the price of the global statistics."
    )


if __name__ == "__main__":
    main()
