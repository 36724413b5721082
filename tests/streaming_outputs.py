"""Child script of test_forced_cpu_paths.py::test_streaming_stores_change_no_result: runs every
CPU kernel that writes large outputs with non-temporal stores, on outputs past their size
thresholds (4 MiB; batch norm's forward 8 MiB), and saves the results to the path given.
Run with and without TFGRADS_DISABLE_STREAMING=1, the two files must be equal bit for bit."""

import sys

import torch

import torch_tfgrads as T


def outputs():
    g = torch.Generator().manual_seed(0)
    out = {}
    # Depthwise: 64 float channels stream whole lines from the tiles' registers, 40 through a
    # staged row; the input gradient runs the same correlation with the backward taps.
    for C in (64, 40):
        x = torch.randn(8, 64, 64, C, generator=g)
        f = torch.randn(3, 3, C, 1, generator=g)
        out[f"dw_fwd_{C}"] = T.depthwise_conv2d_native(x, f, [1, 1, 1, 1], "SAME")
        out[f"dw_bi_{C}"] = T.depthwise_conv2d_native_backprop_input(
            list(x.shape), f, x, [1, 1, 1, 1], "SAME"
        )
        x2 = torch.randn(8, 128, 128, C, generator=g)
        out[f"dw_fwd_s2_{C}"] = T.depthwise_conv2d_native(x2, f, [1, 2, 2, 1], "SAME")
    # Fractional max-pool's gradient, disjoint and overlapping cells; 32 channels run the
    # AVX-512 kernel where it is on, 24 the 8-lane one.
    for C in (32, 24):
        x = torch.randn(20, 64, 64, C, generator=g)
        for overlapping in (False, True):
            y, rows, cols = T.fractional_max_pool(
                x,
                [1.0, 1.44, 1.44, 1.0],
                pseudo_random=True,
                overlapping=overlapping,
                deterministic=True,
                seed=7,
            )
            dy = torch.randn(y.shape, generator=g)
            key = f"fmp_grad_{C}_{'overlapping' if overlapping else 'disjoint'}"
            out[key] = T.fractional_max_pool_grad(x, y, dy, rows, cols, overlapping=overlapping)
    # Batch norm, training and inference forwards and the gradient.
    x = torch.randn(17, 64, 64, 32, generator=g)
    scale, offset = torch.rand(32, generator=g) + 0.5, torch.randn(32, generator=g)
    y, mean, var, r1, r2, r3 = T.fused_batch_norm_v3(x, scale, offset)
    out["bn_fwd"] = y
    out["bn_fwd_inference"] = T.fused_batch_norm_v3(x, scale, offset, mean, var, is_training=False)[
        0
    ]
    dy = torch.randn(x.shape, generator=g)
    out["bn_grad_dx"] = T.fused_batch_norm_grad_v3(dy, x, scale, r1, r2, r3)[0]
    return out


if __name__ == "__main__":
    torch.set_num_threads(2)
    torch.save({"streaming": T.cpu.cpu_paths()["streaming_stores"], **outputs()}, sys.argv[1])
