"""Child script of test_forced_cpu_paths.py::test_source_ring_changes_no_result: depthwise
forwards and filter gradients with two or more source rows per output row (stride 2 and 3, rows
only), on sources of 1-2.3 MB, saved to the path given. Run with TFGRADS_L3_BYTES=1048576 these
sources count as larger than the L3 and the tiles read them through the ring of row copies
(SourceRing in csrc/cpu/depthwise_conv2d_row_staging.h; the filter gradient's AVX-512 row pass
of rows up to 32 columns does not take it, the 41-column case does); with a huge
TFGRADS_L3_BYTES they read them in place. The same switch moves layers whose pixels alias in L1
(256 / 512 channels) from sweeps of 64 channels (sources beyond half the L3) to sweeps of 256
(correlation_chunk in csrc/cpu/depthwise_conv2d_cpu.h), the stride-1 case below included. The
two files must be equal bit for bit."""

import sys

import torch

import torch_tfgrads as T

CASES = [
    # N, H, W, C, (kh, kw), strides, padding, dtype
    (4, 46, 47, 64, (3, 3), (2, 2), "SAME", torch.float32),
    (12, 40, 41, 20, (3, 3), (2, 2), "VALID", torch.float32),  # channel tails
    (2, 30, 30, 256, (3, 3), (2, 2), "SAME", torch.float32),  # pixels alias in L1
    (2, 14, 15, 1024, (3, 3), (2, 2), "SAME", torch.float32),  # 4 KiB pixels, swept whole
    (4, 46, 46, 32, (5, 5), (2, 2), "SAME", torch.float32),
    (4, 46, 46, 32, (3, 3), (2, 1), "SAME", torch.float32),  # stride 2 along the rows only
    (4, 46, 46, 32, (3, 3), (3, 3), "VALID", torch.float32),
    (4, 46, 46, 16, (3, 3), (2, 2), "SAME", torch.float64),
    (8, 46, 46, 64, (3, 3), (2, 2), "SAME", torch.bfloat16),
    (2, 80, 81, 32, (3, 3), (2, 2), "SAME", torch.float32),  # 41 output columns
    (2, 21, 22, 512, (3, 3), (1, 1), "SAME", torch.float32),  # 2 sweeps of 256 channels, or 8
]


def outputs():
    g = torch.Generator().manual_seed(0)
    out = {}
    for i, (N, H, W, C, k, s, padding, dtype) in enumerate(CASES):
        x = torch.randn(N, H, W, C, generator=g).to(dtype)
        f = torch.randn(*k, C, 1, generator=g).to(dtype)
        y = T.depthwise_conv2d_native(x, f, [1, *s, 1], padding)
        dy = torch.randn(y.shape, generator=g).to(dtype)
        out[f"fwd{i}"] = y
        out[f"filter{i}"] = T.depthwise_conv2d_native_backprop_filter(
            x, list(f.shape), dy, [1, *s, 1], padding
        )
    return out


if __name__ == "__main__":
    result = outputs()
    result["kernel_l3_bytes"] = T.cpu.cpu_paths()["kernel_l3_bytes"]
    torch.save(result, sys.argv[1])
