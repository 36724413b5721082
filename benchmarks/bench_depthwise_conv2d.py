"""Benchmark: depthwise_conv2d_native and its two backprops (float32, NHWC, depth multiplier 1)
vs TensorFlow's raw ops (default oneDNN path in this process, Eigen path in a child process) and
PyTorch's grouped convolution (groups=C) on the same memory viewed as channels_last NCHW:
aten.convolution for the forward, aten.convolution_backward (input-only / weight-only masks) for
the backprops.

Shapes (N, H, W, C, k, s) are the issue's; padding SAME. Prints medians in ms, ours against the
faster peer (target <= 1.00 everywhere), and our bytes/s (minimal traffic: each tensor read or
written once) against a measured copy of the input's size.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

SHAPES = [(32, 56, 56, 64, 3, 1), (32, 28, 28, 256, 3, 2), (16, 112, 112, 32, 5, 1),
          (64, 14, 14, 512, 3, 1)]
OPS = ("forward", "backprop_input", "backprop_filter")


def same_pads(size, k, s):
    out = -(-size // s)
    total = max((out - 1) * s + k - size, 0)
    return out, total // 2, total - total // 2


def tensors(shape, seed=0):
    N, H, W, C, k, s = shape
    g = torch.Generator().manual_seed(seed)
    Ho, _, _ = same_pads(H, k, s)
    Wo, _, _ = same_pads(W, k, s)
    x = torch.randn(N, H, W, C, generator=g)
    f = torch.randn(k, k, C, 1, generator=g)
    dy = torch.randn(N, Ho, Wo, C, generator=g)
    return x, f, dy


def tf_times(tf, shape):
    N, H, W, C, k, s = shape
    x, f, dy = (tf.constant(t.numpy()) for t in tensors(shape))
    st = [1, s, s, 1]
    isz, fsz = tf.constant([N, H, W, C], tf.int32), tf.constant([k, k, C, 1], tf.int32)
    fwd = common.median_ms(lambda: tf.raw_ops.DepthwiseConv2dNative(
        input=x, filter=f, strides=st, padding="SAME").numpy())
    bi = common.median_ms(lambda: tf.raw_ops.DepthwiseConv2dNativeBackpropInput(
        input_sizes=isz, filter=f, out_backprop=dy, strides=st, padding="SAME").numpy())
    bf = common.median_ms(lambda: tf.raw_ops.DepthwiseConv2dNativeBackpropFilter(
        input=x, filter_sizes=fsz, out_backprop=dy, strides=st, padding="SAME").numpy())
    return fwd, bi, bf


def torch_times(shape):
    """PyTorch's depthwise convolution (groups=C) on channels_last views of the same memory.
    TF's SAME padding is symmetric for these shapes except the stride-2 one, where PyTorch pads
    one more on the top/left (same amount of work, same output size)."""
    N, H, W, C, k, s = shape
    x, f, dy = tensors(shape)
    xc, dyc = x.permute(0, 3, 1, 2), dy.permute(0, 3, 1, 2)
    w = f.permute(2, 3, 0, 1).contiguous(memory_format=torch.channels_last)  # [C,1,k,k]
    p = (k - 1) // 2 if s == 1 else k // 2
    conv = torch.ops.aten.convolution
    fwd = common.median_ms(lambda: conv(xc, w, None, [s, s], [p, p], [1, 1], False, [0, 0], C))
    assert conv(xc, w, None, [s, s], [p, p], [1, 1], False, [0, 0], C).shape == dyc.shape
    cb = torch.ops.aten.convolution_backward
    args = (dyc, xc, w, None, [s, s], [p, p], [1, 1], False, [0, 0], C)
    bi = common.median_ms(lambda: cb(*args, [True, False, False]))
    bf = common.median_ms(lambda: cb(*args, [False, True, False]))
    return fwd, bi, bf


def ours_times(T, shape):
    N, H, W, C, k, s = shape
    x, f, dy = tensors(shape)
    st = [1, s, s, 1]
    fwd = common.median_ms(lambda: T.depthwise_conv2d_native(x, f, st, "SAME"))
    bi = common.median_ms(lambda: T.depthwise_conv2d_native_backprop_input(
        [N, H, W, C], f, dy, st, "SAME"))
    bf = common.median_ms(lambda: T.depthwise_conv2d_native_backprop_filter(
        x, [k, k, C, 1], dy, st, "SAME"))
    return fwd, bi, bf


def main():
    if "--tf-only" in sys.argv:  # child process: TF timings only (env chooses the TF path)
        import json
        common.setup_threads()
        tf = common.import_tf()
        print(json.dumps({str(s): tf_times(tf, s) for s in SHAPES}))
        return
    import torch_tfgrads as T
    common.setup_threads()
    tf = common.import_tf()
    eigen = {}
    if tf is not None:
        eigen = common.run_child(__file__, ["--tf-only"], {"TF_ENABLE_ONEDNN_OPTS": "0"})
    print(f"DepthwiseConv2dNative, float32 NHWC, SAME, multiplier 1, {common.THREADS} threads, "
          f"torch {torch.__version__}, TF {tf.__version__ if tf else 'absent'}; ms (median)")
    rows = []
    nan3 = (float("nan"),) * 3
    for shape in SHAPES:
        N, H, W, C, k, s = shape
        ours = ours_times(T, shape)
        pt = torch_times(shape)
        tfd = tf_times(tf, shape) if tf is not None else nan3
        tfe = eigen.get(str(shape), nan3)
        bw = common.copy_bandwidth_gbs(N * H * W * C)
        Ho = -(-H // s)
        nx, ny, nf = N * H * W * C * 4, N * Ho * Ho * C * 4, k * k * C * 4
        traffic = {"forward": nx + nf + ny, "backprop_input": ny + nf + nx,
                   "backprop_filter": nx + ny + nf}
        for i, op in enumerate(OPS):
            best = min(v for v in (tfd[i], tfe[i], pt[i]) if v == v)
            gbs = traffic[op] / (ours[i] * 1e-3) / 1e9
            rows.append([",".join(map(str, shape)), op, common.fmt_ms(ours[i]),
                         common.fmt_ms(tfd[i]), common.fmt_ms(tfe[i]), common.fmt_ms(pt[i]),
                         f"{ours[i] / best:.2f}", f"{gbs:.1f}", f"{100 * gbs / bw:.0f}%"])
    common.print_table(["N,H,W,C,k,s", "op", "ours", "TF default", "TF Eigen", "torch",
                        "ours/best", "ours GB/s", "% copy"], rows)
    print("Target: ours/best <= 1.00 (best = fastest of TF default (oneDNN), TF Eigen, torch); "
          "% copy = our minimal bytes/s against a measured copy of x.")


if __name__ == "__main__":
    main()
