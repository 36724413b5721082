"""Benchmark: depthwise_conv2d_native and its two backprops (float32, NHWC, depth multiplier 1)
vs TensorFlow's raw ops (default oneDNN path in this process, Eigen path in a child process) and
PyTorch's grouped convolution (groups=C) on the same memory viewed as channels_last NCHW:
aten.convolution for the forward, aten.convolution_backward (input-only / weight-only masks) for
the backprops.

Shapes (N, H, W, C, k, s): the first four are the issue's, the fifth is MobileNetV1's last
depthwise layer (1024 channels, 4 KiB pixels); padding SAME. Prints medians in ms, ours
against the faster peer (target <= 1.00 everywhere), and our bytes/s (minimal traffic: each
tensor read or written once) against a measured copy of the input's size.

    python benchmarks/bench_depthwise_conv2d.py                 # CPU, against TF and torch
    python benchmarks/bench_depthwise_conv2d.py --device cuda   # GPU, against torch

On cuda (no TF there) the peer is the same grouped convolution on the GPU (cuDNN or torch's own
depthwise kernels, whichever torch picks for channels_last), at the CPU shapes and larger
GPU-sized ones; the copy runs on the GPU. --quick / --shapes restrict the shapes (see
common.add_device_args).
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

# The tfgrads ops these rows time (tests/test_registry.py checks every op has a benchmark row).
TIMED_OPS = (
    "depthwise_conv2d_native",
    "depthwise_conv2d_native_backprop_input",
    "depthwise_conv2d_native_backprop_filter",
)
SHAPES = [
    (32, 56, 56, 64, 3, 1),
    (32, 28, 28, 256, 3, 2),
    (16, 112, 112, 32, 5, 1),
    (64, 14, 14, 512, 3, 1),
    (32, 7, 7, 1024, 3, 1),
]
GPU_SHAPES = [(64, 112, 112, 32, 3, 1), (32, 28, 28, 512, 5, 2)]  # added on cuda
OPS = ("forward", "backprop_input", "backprop_filter")
HEADERS = [
    "N,H,W,C,k,s",
    "op",
    "path",
    "ours",
    "TF default",
    "TF Eigen",
    "torch",
    "ours/best",
    "ours GB/s",
    "copy GB/s",
    "% copy",
]


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


def peer_fns(shape, T=None, tf=None, device="cpu"):
    """{(peer, op): callable} for one shape: ours (if T) and PyTorch's on `device`, TensorFlow
    (if tf; the CPU only)."""
    N, H, W, C, k, s = shape
    x, f, dy = tensors(shape)
    st = [1, s, s, 1]
    fns = {}
    if T is not None:
        x, f, dy = x.to(device), f.to(device), dy.to(device)  # the same tensors on the CPU
        fns[("ours", "forward")] = lambda: T.depthwise_conv2d_native(x, f, st, "SAME")
        fns[("ours", "backprop_input")] = lambda: T.depthwise_conv2d_native_backprop_input(
            [N, H, W, C], f, dy, st, "SAME"
        )
        fns[("ours", "backprop_filter")] = lambda: T.depthwise_conv2d_native_backprop_filter(
            x, [k, k, C, 1], dy, st, "SAME"
        )
        # PyTorch's depthwise convolution (groups=C) on channels_last views of the same memory.
        # TF's SAME padding is symmetric for these shapes except the stride-2 one, where
        # PyTorch pads one more on the top/left (same work, same output size).
        xc, dyc = x.permute(0, 3, 1, 2), dy.permute(0, 3, 1, 2)
        w = f.permute(2, 3, 0, 1).contiguous(memory_format=torch.channels_last)  # [C,1,k,k]
        p = (k - 1) // 2 if s == 1 else k // 2
        conv, cb = torch.ops.aten.convolution, torch.ops.aten.convolution_backward
        assert conv(xc, w, None, [s, s], [p, p], [1, 1], False, [0, 0], C).shape == dyc.shape
        args = (dyc, xc, w, None, [s, s], [p, p], [1, 1], False, [0, 0], C)
        fns[("torch", "forward")] = lambda: conv(
            xc, w, None, [s, s], [p, p], [1, 1], False, [0, 0], C
        )
        fns[("torch", "backprop_input")] = lambda: cb(*args, [True, False, False])
        fns[("torch", "backprop_filter")] = lambda: cb(*args, [False, True, False])
    if tf is not None:  # the CPU only
        tx, tfl, tdy = (tf.constant(t.numpy()) for t in (x, f, dy))
        isz, fsz = tf.constant([N, H, W, C], tf.int32), tf.constant([k, k, C, 1], tf.int32)
        fns[("tf", "forward")] = lambda: tf.raw_ops.DepthwiseConv2dNative(
            input=tx, filter=tfl, strides=st, padding="SAME"
        ).numpy()
        fns[("tf", "backprop_input")] = lambda: tf.raw_ops.DepthwiseConv2dNativeBackpropInput(
            input_sizes=isz, filter=tfl, out_backprop=tdy, strides=st, padding="SAME"
        ).numpy()
        fns[("tf", "backprop_filter")] = lambda: tf.raw_ops.DepthwiseConv2dNativeBackpropFilter(
            input=tx, filter_sizes=fsz, out_backprop=tdy, strides=st, padding="SAME"
        ).numpy()
    return fns


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
    common.setup_device(device, "bench_depthwise_conv2d")
    common.setup_process()
    tf = common.import_tf() if device == "cpu" else None  # TF only on the CPU
    eigen = {}
    if tf is not None:
        child_args = ["--tf-only", *(["--quick"] if args.quick else [])]
        child_args += ["--shapes", args.shapes] if args.shapes else []
        eigen = common.run_child(__file__, child_args, {"TF_ENABLE_ONEDNN_OPTS": "0"})
    common.print_device(T, device)
    avx512 = T.cpu.cpu_paths()["avx512_kernels"]
    where = f"{common.THREADS} threads" if device == "cpu" else "cuda"
    print(
        f"DepthwiseConv2dNative, float32 NHWC, SAME, multiplier 1, {where}, "
        f"torch {torch.__version__}, TF {tf.__version__ if tf else 'absent'}; ms (median of "
        "interleaved rounds)"
    )
    # no TF columns on the GPU
    shown = [i for i, h in enumerate(HEADERS) if device == "cpu" or "TF" not in h]
    rows = []
    nan = float("nan")
    for shape in shapes:
        N, H, W, C, k, s = shape
        # The copy of x is timed in the same rounds as the ops, so it meets the same machine.
        copy_x = {("copy", "x"): common.copy_fn(N * H * W * C, device=device)}
        t = common.interleaved_ms(
            {**peer_fns(shape, T=T, tf=tf, device=device), **copy_x}, device=device, **timing
        )
        tfe = eigen.get(str(shape), [nan] * 3)
        bw = common.copy_gbs(N * H * W * C, t[("copy", "x")])
        Ho = -(-H // s)
        # the 16-lane kernels take float32 with C % 16 == 0
        cpu_path = "AVX-512" if avx512 and C % 16 == 0 else "AVX2"
        path = cpu_path if device == "cpu" else "CUDA"
        nx, ny, nf = N * H * W * C * 4, N * Ho * Ho * C * 4, k * k * C * 4
        for i, op in enumerate(OPS):
            ours, pt, tfd = t[("ours", op)], t[("torch", op)], t.get(("tf", op), nan)
            best = min(v for v in (tfd, tfe[i], pt) if v == v)
            gbs = (nx + ny + nf) / (ours * 1e-3) / 1e9  # each tensor read or written once
            row = [  # HEADERS
                ",".join(map(str, shape)),
                op,
                path,
                common.fmt_ms(ours),
                common.fmt_ms(tfd),
                common.fmt_ms(tfe[i]),
                common.fmt_ms(pt),
                f"{ours / best:.2f}",
                f"{gbs:.1f}",
                f"{bw:.1f}",
                f"{100 * gbs / bw:.0f}%",
            ]
            rows.append([row[i] for i in shown])
    common.print_table([HEADERS[i] for i in shown], rows)
    if device == "cpu":
        print(
            "Target: ours/best <= 1.00 (best = fastest of TF default (oneDNN), TF Eigen, torch); "
            "% copy = our minimal bytes/s against a measured copy of x."
        )
    else:
        print(
            "torch = aten.convolution / convolution_backward (input-only, weight-only masks) with "
            "groups=C on the channels_last views, on the GPU; % copy = our minimal bytes/s "
            "against a GPU copy of x timed in the same rounds; each call is timed alone with "
            "CUDA events."
        )


if __name__ == "__main__":
    main()
