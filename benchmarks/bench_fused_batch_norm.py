"""Benchmark: fused_batch_norm_v3 / fused_batch_norm_grad_v3 (training, float32, NHWC) vs
TensorFlow's raw ops (default oneDNN path in this process, Eigen path in a child process) and
PyTorch's native_batch_norm(_backward) on the same data as a channels_last tensor.

Prints medians in ms, the ratio of ours to the fastest peer, and our effective bandwidth
(minimal traffic: forward reads x and writes y, grad reads x and dy and writes dx) against a
measured copy of the same size.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

SHAPES = [(32, 28, 28, 64), (8, 56, 56, 128), (64, 7, 7, 512), (16, 112, 112, 32)]
EPS = 1e-3


def tf_times(tf, shape):
    import numpy as np
    rng = np.random.default_rng(0)
    C = shape[-1]
    x = tf.constant(rng.standard_normal(shape, dtype=np.float32))
    dy = tf.constant(rng.standard_normal(shape, dtype=np.float32))
    s, o = tf.ones([C]), tf.zeros([C])
    e = tf.zeros([0])
    out = tf.raw_ops.FusedBatchNormV3(x=x, scale=s, offset=o, mean=e, variance=e, epsilon=EPS)
    fwd = common.median_ms(lambda: tf.raw_ops.FusedBatchNormV3(
        x=x, scale=s, offset=o, mean=e, variance=e, epsilon=EPS)[0].numpy())
    bwd = common.median_ms(lambda: tf.raw_ops.FusedBatchNormGradV3(
        y_backprop=dy, x=x, scale=s, reserve_space_1=out[3], reserve_space_2=out[4],
        reserve_space_3=out[5], epsilon=EPS)[0].numpy())
    return fwd, bwd


def main():
    if "--tf-only" in sys.argv:  # child process: TF timings only (env chooses the TF path)
        import json
        common.setup_process()
        tf = common.import_tf()
        print(json.dumps({str(s): tf_times(tf, s) for s in SHAPES}))
        return

    import torch_tfgrads as T
    common.setup_process()
    tf = common.import_tf()
    eigen = {}
    if tf is not None:
        eigen = common.run_child(__file__, ["--tf-only"], {"TF_ENABLE_ONEDNN_OPTS": "0"})
    print(f"FusedBatchNorm, float32, training, {common.THREADS} threads, torch "
          f"{torch.__version__}, TF {tf.__version__ if tf else 'absent'}; times in ms (median)")
    rows = []
    for shape in SHAPES:
        C = shape[-1]
        x = torch.randn(shape)
        dy = torch.randn(shape)
        s, o = torch.ones(C), torch.zeros(C)
        out = T.fused_batch_norm_v3(x, s, o, epsilon=EPS)
        ours_f = common.median_ms(lambda: T.fused_batch_norm_v3(x, s, o, epsilon=EPS))
        ours_b = common.median_ms(lambda: T.fused_batch_norm_grad_v3(
            dy, x, s, out[3], out[4], out[5], epsilon=EPS))
        # PyTorch's own kernels on the same memory viewed as channels_last NCHW.
        xc, dyc = x.permute(0, 3, 1, 2), dy.permute(0, 3, 1, 2)
        _, sm, si = torch.ops.aten.native_batch_norm(xc, s, o, None, None, True, 0.0, EPS)
        pt_f = common.median_ms(lambda: torch.ops.aten.native_batch_norm(
            xc, s, o, None, None, True, 0.0, EPS))
        pt_b = common.median_ms(lambda: torch.ops.aten.native_batch_norm_backward(
            dyc, xc, s, None, None, sm, si, True, EPS, [True, True, True]))
        tf_f, tf_b = tf_times(tf, shape) if tf is not None else (float("nan"),) * 2
        ef, eb = eigen.get(str(shape), (float("nan"), float("nan")))
        bw = common.copy_bandwidth_gbs(x.numel())
        nbytes = x.numel() * 4
        for op, ours, tfd, tfe, pt, traffic in (("forward", ours_f, tf_f, ef, pt_f, 2),
                                                ("grad", ours_b, tf_b, eb, pt_b, 3)):
            best = min(v for v in (tfd, tfe, pt) if v == v)
            gbs = traffic * nbytes / (ours * 1e-3) / 1e9
            rows.append(["x".join(map(str, shape)), op, common.fmt_ms(ours), common.fmt_ms(tfd),
                         common.fmt_ms(tfe), common.fmt_ms(pt), f"{ours / best:.2f}",
                         f"{gbs:.1f}", f"{bw:.1f}", f"{100 * gbs / bw:.0f}%"])
    common.print_table(["NHWC shape", "op", "ours", "TF default", "TF Eigen", "torch native",
                        "ours/best", "ours GB/s", "copy GB/s", "% copy"], rows)
    print("ours/best < 1 means faster than every peer; TF default = oneDNN kernels on x86.")


if __name__ == "__main__":
    main()
