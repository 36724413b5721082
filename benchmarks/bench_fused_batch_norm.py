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
"""

import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

# The tfgrads ops these rows time (tests/test_registry.py checks every op has a benchmark row).
TIMED_OPS = ("fused_batch_norm_v3", "fused_batch_norm_grad_v3")
SHAPES = [(32, 28, 28, 64), (8, 56, 56, 128), (64, 7, 7, 512), (16, 112, 112, 32)]
EPS = 1e-3


OPS = ("forward", "grad")


def peer_fns(shape, T=None, tf=None):
    """{(peer, op): callable} on the same random data: ours and PyTorch's when T (our package)
    is given, TensorFlow's when tf is."""
    C = shape[-1]
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    dy = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    s, o = torch.ones(C), torch.zeros(C)
    fns = {}
    if T is not None:
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
    if tf is not None:
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


def main():
    if "--tf-only" in sys.argv:  # child process: TF timings only (env chooses the TF path)
        import json

        common.setup_process()
        tf = common.import_tf()
        out = {}
        for shape in SHAPES:
            t = common.interleaved_ms(peer_fns(shape, tf=tf))
            out[str(shape)] = [t[("tf", op)] for op in OPS]
        print(json.dumps(out))
        return

    import torch_tfgrads as T

    common.setup_process()
    tf = common.import_tf()
    eigen = {}
    if tf is not None:
        eigen = common.run_child(__file__, ["--tf-only"], {"TF_ENABLE_ONEDNN_OPTS": "0"})
    common.print_host(T)  # one path: AVX2 vectors (float widened from half types)
    print(
        f"FusedBatchNorm, float32, training, {common.THREADS} threads, torch "
        f"{torch.__version__}, TF {tf.__version__ if tf else 'absent'}; ms (median of "
        "interleaved rounds)"
    )
    rows = []
    nan = float("nan")
    dram_numel = common.dram_copy_numel()
    dram_copy = common.copy_fn(dram_numel)
    for shape in SHAPES:
        numel = math.prod(shape)
        copies = {("copy", "tensor"): common.copy_fn(numel), ("copy", "dram"): dram_copy}
        t = common.interleaved_ms({**peer_fns(shape, T=T, tf=tf), **copies})
        tfe = eigen.get(str(shape), [nan] * len(OPS))
        bw = common.copy_gbs(numel, t[("copy", "tensor")])
        bw_dram = common.copy_gbs(dram_numel, t[("copy", "dram")])
        for i, (op, traffic) in enumerate(zip(OPS, (2, 3))):
            ours, pt, tfd = t[("ours", op)], t[("torch", op)], t.get(("tf", op), nan)
            best = min(v for v in (tfd, tfe[i], pt) if v == v)
            gbs = traffic * numel * 4 / (ours * 1e-3) / 1e9
            rows.append(
                [
                    "x".join(map(str, shape)),
                    op,
                    common.fmt_ms(ours),
                    common.fmt_ms(tfd),
                    common.fmt_ms(tfe[i]),
                    common.fmt_ms(pt),
                    f"{ours / best:.2f}",
                    f"{gbs:.1f}",
                    f"{bw:.1f}",
                    f"{100 * gbs / bw:.0f}%",
                    f"{bw_dram:.1f}",
                    f"{100 * gbs / bw_dram:.0f}%",
                ]
            )
    common.print_table(
        [
            "NHWC shape",
            "op",
            "ours",
            "TF default",
            "TF Eigen",
            "torch native",
            "ours/best",
            "ours GB/s",
            "copy GB/s",
            "% copy",
            "DRAM copy GB/s",
            "% DRAM copy",
        ],
        rows,
    )
    print(
        "ours/best < 1 means faster than every peer; TF default = oneDNN kernels on x86. "
        "Peers are timed in alternating rounds, so the ratios of one run are comparable."
    )


if __name__ == "__main__":
    main()
