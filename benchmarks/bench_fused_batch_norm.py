"""Benchmark: fused_batch_norm_v3 / fused_batch_norm_grad_v3 (training, float32, NHWC) vs
TensorFlow's raw ops (default oneDNN path in this process, Eigen path in a child process) and
PyTorch's native_batch_norm(_backward) on the same data as a channels_last tensor.

Peers are timed in interleaved rounds (median of round medians). Prints ms, the ratio of ours to
the fastest peer, and our effective bandwidth (minimal traffic: forward reads x and writes y,
grad reads x and dy and writes dx) against two plain copies timed in the same rounds:
- "copy": a copy of one tensor of the shape (the yardstick of the 60%-of-copy target). At 12.8 MB
  its source and destination fit in the L3 together, while the grad's x, dy and dx do not.
- "DRAM copy": a copy of arrays 4x the last-level cache (STREAM's rule), i.e. the machine's
  memory bandwidth, the roof for an op whose data does not stay in the caches.

    python benchmarks/bench_fused_batch_norm.py                 # CPU, against TF and torch
    python benchmarks/bench_fused_batch_norm.py --device cuda   # GPU, against torch and cuDNN

On cuda (no TF: it is not installed there) the peers are torch's native_batch_norm(_backward)
CUDA kernels on the channels_last tensor and cuDNN's batch norm (aten.cudnn_batch_norm and its
backward, which F.batch_norm picks on a GPU when cuDNN can take the input), at the CPU shapes and
larger GPU-sized ones; the copies run on the GPU (the DRAM copy: arrays 4x its L2, i.e. HBM).
--quick / --shapes restrict the shapes (see common.add_device_args).
"""

import argparse
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

# The tfgrads ops these rows time (tests/test_registry.py checks every op has a benchmark row).
TIMED_OPS = ("fused_batch_norm_v3", "fused_batch_norm_grad_v3")
SHAPES = [(32, 28, 28, 64), (8, 56, 56, 128), (64, 7, 7, 512), (16, 112, 112, 32)]
GPU_SHAPES = [(64, 56, 56, 256), (256, 28, 28, 128), (128, 14, 14, 1024)]  # added on cuda
EPS = 1e-3


OPS = ("forward", "grad")


def peer_fns(shape, T=None, tf=None, device="cpu"):
    """{(peer, op): callable} on the same random data: ours and PyTorch's when T (our package)
    is given (on cuda cuDNN's too), TensorFlow's (on the CPU) when tf is."""
    C = shape[-1]
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    dy = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    fns = {}
    if T is not None:
        x, dy = x.to(device), dy.to(device)  # the same tensors on the CPU
        s, o = torch.ones(C, device=device), torch.zeros(C, device=device)
        out = T.fused_batch_norm_v3(x, s, o, epsilon=EPS)
        fns[("ours", "forward")] = lambda: T.fused_batch_norm_v3(x, s, o, epsilon=EPS)
        fns[("ours", "grad")] = lambda: T.fused_batch_norm_grad_v3(
            dy, x, s, out[3], out[4], out[5], epsilon=EPS
        )
        # PyTorch's own kernels on the same memory viewed as channels_last NCHW.
        xc, dyc = x.permute(0, 3, 1, 2), dy.permute(0, 3, 1, 2)
        _, sm, si = torch.ops.aten.native_batch_norm(xc, s, o, None, None, True, 0.0, EPS)
        fns[("torch", "forward")] = lambda: torch.ops.aten.native_batch_norm(
            xc, s, o, None, None, True, 0.0, EPS
        )
        fns[("torch", "grad")] = lambda: torch.ops.aten.native_batch_norm_backward(
            dyc, xc, s, None, None, sm, si, True, EPS, [True, True, True]
        )
        if x.is_cuda and torch.backends.cudnn.is_available():
            fns.update(cudnn_fns(xc, dyc, s, o))
    if tf is not None:  # the CPU only
        tx, tdy = tf.constant(x.numpy()), tf.constant(dy.numpy())
        ts, to, e = tf.ones([C]), tf.zeros([C]), tf.zeros([0])
        tout = tf.raw_ops.FusedBatchNormV3(
            x=tx, scale=ts, offset=to, mean=e, variance=e, epsilon=EPS
        )
        fns[("tf", "forward")] = lambda: tf.raw_ops.FusedBatchNormV3(
            x=tx, scale=ts, offset=to, mean=e, variance=e, epsilon=EPS
        )[0].numpy()
        fns[("tf", "grad")] = lambda: tf.raw_ops.FusedBatchNormGradV3(
            y_backprop=tdy,
            x=tx,
            scale=ts,
            reserve_space_1=tout[3],
            reserve_space_2=tout[4],
            reserve_space_3=tout[5],
            epsilon=EPS,
        )[0].numpy()
    return fns


def cudnn_fns(xc, dyc, s, o):
    """cuDNN's batch norm (what F.batch_norm runs on a GPU when cuDNN takes the input), forward
    and backward called directly so that each is timed alone; {} if this torch refuses it."""
    bn, bnb = torch.ops.aten.cudnn_batch_norm, torch.ops.aten.cudnn_batch_norm_backward
    try:
        _, sm, si, reserve = bn(xc, s, o, None, None, True, 0.0, EPS)
        bnb(xc, dyc, s, None, None, sm, si, EPS, reserve)
    except RuntimeError as e:
        print(f"cuDNN batch norm not timed: {str(e).splitlines()[0]}")
        return {}
    return {
        ("cudnn", "forward"): lambda: bn(xc, s, o, None, None, True, 0.0, EPS),
        ("cudnn", "grad"): lambda: bnb(xc, dyc, s, None, None, sm, si, EPS, reserve),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_device_args(ap)
    ap.add_argument("--tf-only", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    shapes = common.select_shapes(args, SHAPES, GPU_SHAPES)
    timing = common.timing_args(args)
    if args.tf_only:  # child process: TF timings only (env chooses the TF path)
        import json

        common.setup_process()
        tf = common.import_tf()
        out = {}
        for shape in shapes:
            t = common.interleaved_ms(peer_fns(shape, tf=tf), **timing)
            out[str(shape)] = [t[("tf", op)] for op in OPS]
        print(json.dumps(out))
        return

    import torch_tfgrads as T

    device = args.device
    common.setup_device(device, "bench_fused_batch_norm")
    common.setup_process()
    # TF only on the CPU: it has no place on the GPU runs (and is not installed there).
    tf = common.import_tf() if device == "cpu" else None
    eigen = {}
    if tf is not None:
        child_args = ["--tf-only", *(["--quick"] if args.quick else [])]
        child_args += ["--shapes", args.shapes] if args.shapes else []
        eigen = common.run_child(__file__, child_args, {"TF_ENABLE_ONEDNN_OPTS": "0"})
    common.print_device(T, device)  # CPU: one path, AVX2 vectors (float widened from half types)
    where = f"{common.THREADS} threads" if device == "cpu" else "cuda"
    print(
        f"FusedBatchNorm, float32, training, {where}, torch {torch.__version__}, TF "
        f"{tf.__version__ if tf else 'absent'}; ms (median of interleaved rounds)"
    )
    rows = []
    nan = float("nan")
    dram_numel = common.dram_copy_numel(device=device)
    dram_copy = common.copy_fn(dram_numel, device=device)
    for shape in shapes:
        numel = math.prod(shape)
        copies = {
            ("copy", "tensor"): common.copy_fn(numel, device=device),
            ("copy", "dram"): dram_copy,
        }
        t = common.interleaved_ms(
            {**peer_fns(shape, T=T, tf=tf, device=device), **copies}, device=device, **timing
        )
        tfe = eigen.get(str(shape), [nan] * len(OPS))
        bw = common.copy_gbs(numel, t[("copy", "tensor")])
        bw_dram = common.copy_gbs(dram_numel, t[("copy", "dram")])
        for i, (op, traffic) in enumerate(zip(OPS, (2, 3))):
            ours, pt = t[("ours", op)], t[("torch", op)]
            tfd, cud = t.get(("tf", op), nan), t.get(("cudnn", op), nan)
            best = min(v for v in (tfd, tfe[i], pt, cud) if v == v)
            gbs = traffic * numel * 4 / (ours * 1e-3) / 1e9
            peers = [tfd, tfe[i], pt] if device == "cpu" else [pt, cud]
            rows.append(
                [
                    "x".join(map(str, shape)),
                    op,
                    common.fmt_ms(ours),
                    *(common.fmt_ms(v) for v in peers),
                    f"{ours / best:.2f}",
                    f"{gbs:.1f}",
                    f"{bw:.1f}",
                    f"{100 * gbs / bw:.0f}%",
                    f"{bw_dram:.1f}",
                    f"{100 * gbs / bw_dram:.0f}%",
                ]
            )
    if device == "cpu":
        peer_headers = ["TF default", "TF Eigen", "torch native"]
    else:
        peer_headers = ["torch native", "cuDNN"]
    dram = "DRAM" if device == "cpu" else "HBM"
    common.print_table(
        [
            "NHWC shape",
            "op",
            "ours",
            *peer_headers,
            "ours/best",
            "ours GB/s",
            "copy GB/s",
            "% copy",
            f"{dram} copy GB/s",
            f"% {dram} copy",
        ],
        rows,
    )
    if device == "cpu":
        print(
            "ours/best < 1 means faster than every peer; TF default = oneDNN kernels on x86. "
            "Peers are timed in alternating rounds, so the ratios of one run are comparable."
        )
    else:
        print(
            "ours/best < 1 means faster than every peer; torch native = native_batch_norm's CUDA "
            "kernels on the channels_last view, cuDNN = aten.cudnn_batch_norm(_backward) on it; "
            "HBM copy = arrays 4x the GPU's L2. Each call is timed alone with CUDA events."
        )


if __name__ == "__main__":
    main()
