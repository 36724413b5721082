"""Benchmark: fractional_{avg,max}_pool and their gradients (float32, NHWC) vs TensorFlow's raw
ops (Eigen kernels: oneDNN has none for these ops) and, for the max variant, PyTorch's
fractional_max_pool2d(_backward) on the same memory viewed as a channels_last NCHW tensor
(kernel 2, same output size).

Prints medians in ms, ours/TF (target <= 0.5), ours/torch (target <= 1 for max), and our
effective bandwidth (forward reads x and writes y; grad reads dy and writes dx, plus x and y for
max) against a copy of the input's size timed in the same interleaved rounds.

    python benchmarks/bench_fractional_pool.py                 # CPU, against TF and torch
    python benchmarks/bench_fractional_pool.py --device cuda   # GPU, against torch

On cuda (no TF there) the peer is F.fractional_max_pool2d and its backward on the GPU, at the CPU
shapes and larger GPU-sized ones, and the copy runs on the GPU. torch's fractional max pool is
not TF's: it draws its cell boundaries from its own random samples with a fixed 2x2 kernel, so it
is a speed peer at the same output size, not the same computation. --quick / --shapes restrict
the shapes (see common.add_device_args).
"""

import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

# The tfgrads ops these rows time (tests/test_registry.py checks every op has a benchmark row).
TIMED_OPS = (
    "fractional_avg_pool",
    "fractional_max_pool",
    "fractional_avg_pool_grad",
    "fractional_max_pool_grad",
)
SHAPES = [(16, 64, 64, 32), (8, 112, 112, 16)]
GPU_SHAPES = [(64, 112, 112, 64), (128, 56, 56, 128)]  # added on cuda
RATIOS = [1.44, 1.73]
HEADERS = [
    "NHWC shape",
    "ratio",
    "overlap",
    "op",
    "path",
    "ours",
    "TF",
    "torch",
    "ours/TF",
    "ours/torch",
    "ours GB/s",
    "copy GB/s",
    "% copy",
]


def tf_fns(tf, kind, x, out, dy, rows, cols, ratio, overlapping):
    tx, ty, tdy = tf.constant(x.numpy()), tf.constant(out.numpy()), tf.constant(dy.numpy())
    tr, tc = tf.constant(rows.numpy()), tf.constant(cols.numpy())
    pr = [1.0, ratio, ratio, 1.0]
    op = tf.raw_ops.FractionalAvgPool if kind == "avg" else tf.raw_ops.FractionalMaxPool
    fwd = lambda: op(
        value=tx,
        pooling_ratio=pr,
        overlapping=overlapping,  # noqa: E731
        deterministic=True,
        seed=1,
        seed2=2,
    )[0].numpy()
    if kind == "avg":
        shape = tf.constant(list(x.shape), tf.int64)
        grad = lambda: tf.raw_ops.FractionalAvgPoolGrad(  # noqa: E731
            orig_input_tensor_shape=shape,
            out_backprop=tdy,
            row_pooling_sequence=tr,
            col_pooling_sequence=tc,
            overlapping=overlapping,
        ).numpy()
    else:
        grad = lambda: tf.raw_ops.FractionalMaxPoolGrad(  # noqa: E731
            orig_input=tx,
            orig_output=ty,
            out_backprop=tdy,
            row_pooling_sequence=tr,
            col_pooling_sequence=tc,
            overlapping=overlapping,
        ).numpy()
    return {("TF", "forward"): fwd, ("TF", "grad"): grad}


def torch_max_fns(x, out_hw):
    xc = x.permute(0, 3, 1, 2)  # channels_last NCHW view of the same memory
    samples = torch.rand(x.shape[0], x.shape[3], 2).to(x.device)
    y, idx = F.fractional_max_pool2d(
        xc, 2, output_size=out_hw, return_indices=True, _random_samples=samples
    )
    gy = torch.randn_like(y)
    return {
        ("torch", "forward"): lambda: F.fractional_max_pool2d(
            xc, 2, output_size=out_hw, return_indices=True, _random_samples=samples
        ),
        ("torch", "grad"): lambda: torch.ops.aten.fractional_max_pool2d_backward(
            gy, xc, [2, 2], list(out_hw), idx
        ),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_device_args(ap)
    args = ap.parse_args()
    import torch_tfgrads as T

    device = args.device
    common.setup_device(device, "bench_fractional_pool")
    shapes = common.select_shapes(args, SHAPES, GPU_SHAPES)
    timing = {"rounds": 5, **common.timing_args(args)}
    common.setup_process()
    tf = common.import_tf() if device == "cpu" else None  # TF only on the CPU
    common.print_device(T, device)
    avx512 = T.cpu.cpu_paths()["avx512_kernels"]
    where = f"{common.THREADS} threads" if device == "cpu" else "cuda"
    print(
        f"FractionalPool, float32 NHWC, {where}, torch {torch.__version__}, "
        f"TF {tf.__version__ if tf else 'absent'}; ms (median of interleaved rounds)"
    )
    # no TF columns on the GPU
    shown = [i for i, h in enumerate(HEADERS) if device == "cpu" or "TF" not in h]
    rows_out = []
    for shape in shapes:
        x = torch.randn(shape).to(device)
        copy_x = {("copy", "x"): common.copy_fn(x.numel(), device=device)}
        for ratio in RATIOS:
            pr = [1.0, ratio, ratio, 1.0]
            for overlapping in (False, True):
                for kind in ("avg", "max"):
                    fwd = T.fractional_avg_pool if kind == "avg" else T.fractional_max_pool
                    out, rows, cols = fwd(x, pr, False, overlapping, True, 1, 2)
                    dy = torch.randn(out.shape).to(device)
                    fns = {("ours", "forward"): lambda: fwd(x, pr, False, overlapping, True, 1, 2)}
                    if kind == "avg":
                        fns[("ours", "grad")] = lambda: T.fractional_avg_pool_grad(
                            x.shape, dy, rows, cols, overlapping
                        )
                    else:
                        fns[("ours", "grad")] = lambda: T.fractional_max_pool_grad(
                            x, out, dy, rows, cols, overlapping
                        )
                        fns.update(torch_max_fns(x, out.shape[1:3]))
                    if tf is not None:
                        fns.update(tf_fns(tf, kind, x, out, dy, rows, cols, ratio, overlapping))
                    t = common.interleaved_ms({**fns, **copy_x}, device=device, **timing)
                    bw = common.copy_gbs(x.numel(), t[("copy", "x")])
                    nan = float("nan")
                    ours_f, ours_g = t[("ours", "forward")], t[("ours", "grad")]
                    tf_f, tf_g = t.get(("TF", "forward"), nan), t.get(("TF", "grad"), nan)
                    pt_f, pt_g = t.get(("torch", "forward"), nan), t.get(("torch", "grad"), nan)
                    nx, ny = x.numel() * 4, out.numel() * 4
                    traffic = {
                        "forward": nx + ny,
                        "grad": (ny + nx) if kind == "avg" else (2 * ny + 2 * nx),
                    }
                    for op, ours, tfv, ptv in (
                        ("forward", ours_f, tf_f, pt_f),
                        ("grad", ours_g, tf_g, pt_g),
                    ):
                        gbs = traffic[op] / (ours * 1e-3) / 1e9
                        if device != "cpu":
                            path = "CUDA"
                        # only the max gradient has an AVX-512 kernel (C % 16 == 0)
                        elif (kind, op) == ("max", "grad") and avx512 and shape[3] % 16 == 0:
                            path = "AVX-512"
                        else:
                            path = "AVX2"
                        row = [  # HEADERS
                            "x".join(map(str, shape)),
                            f"{ratio}",
                            "yes" if overlapping else "no",
                            f"{kind} {op}",
                            path,
                            common.fmt_ms(ours),
                            common.fmt_ms(tfv),
                            common.fmt_ms(ptv),
                            f"{ours / tfv:.2f}" if tfv == tfv else "-",
                            f"{ours / ptv:.2f}" if ptv == ptv else "-",
                            f"{gbs:.1f}",
                            f"{bw:.1f}",
                            f"{100 * gbs / bw:.0f}%",
                        ]
                        rows_out.append([row[i] for i in shown])
    common.print_table([HEADERS[i] for i in shown], rows_out)
    if device == "cpu":
        print(
            "Targets: ours/TF <= 0.50 everywhere; ours/torch <= 1.00 for max. torch = "
            "F.fractional_max_pool2d (kernel 2) on the channels_last view; % copy = our bytes/s "
            "against a copy of x timed in the same rounds."
        )
    else:
        print(
            "torch = F.fractional_max_pool2d (kernel 2, same output size) and its backward on the "
            "GPU, on the channels_last view: NOT TF's semantics (its own random cell boundaries), "
            "a speed peer only. % copy = our bytes/s against a GPU copy of x timed in the same "
            "rounds; each call is timed alone with CUDA events."
        )


if __name__ == "__main__":
    main()
