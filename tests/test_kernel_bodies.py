"""The CUDA kernels' per-element bodies run on the host (tfgrads_test ops over the host-device
functions in csrc/common/*_cells.h) against the CPU kernels, bit for bit: the GPU's arithmetic
checked on a machine without a GPU, at shapes and dtypes the CUDA tests would need a GPU for."""

import itertools

import pytest
import torch

import torch_tfgrads as T

cells = torch.ops.tfgrads_test.fractional_pool_cells.default

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64]
CONFIGS = list(
    itertools.product(
        [(3, 23, 17, 5), (2, 9, 40, 33), (1, 64, 64, 1)],  # N, H, W, C
        [(1.44, 1.73), (2.0, 1.5), (1.01, 3.9)],  # row, col ratios
        [False, True],  # overlapping
        [False, True],  # pseudo_random
    )
)


def _value(shape, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        x = torch.randn(shape, generator=gen) * 3
        x[x.abs() < 0.3] = 0.5  # ties in the cells: the first maximum wins
        return x.to(dtype)
    return torch.randint(-(2**20), 2**20, shape, generator=gen, dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,ratios,overlapping,pseudo_random", CONFIGS)
def test_fractional_pool_bodies_equal_cpu_kernels(dtype, shape, ratios, overlapping, pseudo_random):
    if shape[1] / ratios[0] < 1 or shape[2] / ratios[1] < 1:
        pytest.skip("no output rows")
    x = _value(shape, dtype, seed=sum(shape))
    ratio = [1.0, ratios[0], ratios[1], 1.0]
    for kind, pool in (("max", T.fractional_max_pool), ("avg", T.fractional_avg_pool)):
        out, rows, cols = pool(x, ratio, pseudo_random, overlapping, True, 5, 9)
        emulated = cells(kind, [x], rows, cols, [], overlapping)
        assert torch.equal(emulated, out), kind
    if not dtype.is_floating_point and dtype != torch.int64:
        return
    out, rows, cols = T.fractional_max_pool(x, ratio, pseudo_random, overlapping, True, 5, 9)
    dy = _value(out.shape, dtype, seed=7)
    want = T.fractional_max_pool_grad(x, out, dy, rows, cols, overlapping)
    got = cells("max_grad", [x, out, dy], rows, cols, [], overlapping)
    assert torch.equal(got, want)
    want = T.fractional_avg_pool_grad(list(shape), dy, rows, cols, overlapping)
    got = cells("avg_grad", [dy], rows, cols, list(shape), overlapping)
    assert torch.equal(got, want)


def test_fractional_pool_bodies_strided_input_and_mismatch():
    x = _value((2, 30, 30, 8), torch.float32, 1).permute(0, 2, 1, 3)  # other H/W strides
    out, rows, cols = T.fractional_max_pool(x, [1, 1.5, 1.5, 1], True, True, True, 1, 2)
    assert torch.equal(cells("max", [x], rows, cols, [], True), out)
    with pytest.raises(RuntimeError, match="tensor_out_dup is not the same"):
        cells("max_grad", [x, out + 1, out], rows, cols, [], True)
