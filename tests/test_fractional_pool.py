"""FractionalPool family without TensorFlow: TF's verified seed table, the reference port of
TF's generator and kernels (tests/fractional_pool_reference.py) bit for bit, TF's documented
examples and tie rules, strides, dtypes, seeds, autograd (gradcheck/gradgradcheck), opcheck,
modules and the CUDA kernels where a GPU is present."""

import numpy as np
import pytest
import torch

import fractional_pool_reference as R
import torch_tfgrads as T
from helpers import DEVICES, needs_avx512, results_at_avx2

OPS = torch.ops.tfgrads

# TF 2.21's sequences for these seeds (every row verified on TF).
SEED_TABLE = [
    (5, 5, 1.5, 1.5, False, 1, 1, [0, 2, 4, 5], [0, 2, 4, 5]),
    (5, 5, 1.5, 1.5, True, 1, 1, [0, 2, 3, 5], [0, 1, 3, 5]),
    (10, 10, 1.44, 1.73, False, 7, 0, [0, 2, 4, 5, 6, 8, 10], [0, 2, 4, 6, 8, 10]),
    (10, 10, 1.44, 1.73, True, 7, 0, [0, 1, 3, 5, 6, 8, 10], [0, 2, 4, 6, 8, 10]),
    (10, 10, 2.0, 2.0, False, 3, 4, [0, 2, 4, 6, 8, 10], [0, 2, 4, 6, 8, 10]),
    (10, 10, 2.0, 2.0, True, 3, 4, [0, 2, 4, 6, 8, 10], [0, 2, 4, 6, 8, 10]),
    (
        20,
        30,
        1.7320508,
        1.4142135,
        False,
        341261001,
        87654321,
        [0, 1, 3, 4, 6, 8, 10, 12, 14, 16, 18, 20],
        [0, 1, 3, 4, 5, 6, 7, 9, 10, 12, 14, 15, 16, 17, 18, 20, 21, 23, 24, 26, 28, 30],
    ),
    (
        20,
        30,
        1.7320508,
        1.4142135,
        True,
        341261001,
        87654321,
        [0, 2, 4, 5, 7, 9, 11, 13, 15, 16, 18, 20],
        [0, 2, 3, 5, 6, 7, 9, 10, 12, 13, 15, 16, 17, 19, 20, 22, 23, 25, 26, 27, 29, 30],
    ),
    (
        23,
        23,
        2.3,
        2.3,
        True,
        0,
        1,
        [0, 2, 5, 7, 9, 11, 14, 16, 18, 21, 23],
        [0, 3, 5, 7, 10, 12, 14, 17, 19, 21, 23],
    ),
    (
        23,
        23,
        2.3,
        2.3,
        False,
        0,
        1,
        [0, 2, 5, 7, 9, 11, 13, 15, 18, 20, 23],
        [0, 3, 5, 8, 10, 12, 14, 16, 18, 21, 23],
    ),
    (13, 7, 3.3166248, 2.6457513, False, -1, 5, [0, 5, 9, 13], [0, 3, 7]),
    (13, 7, 3.3166248, 2.6457513, True, -1, 5, [0, 4, 9, 13], [0, 4, 7]),
    (
        32,
        32,
        1.5,
        1.5,
        False,
        87654321,
        5,
        [0, 2, 3, 4, 6, 8, 9, 11, 12, 13, 15, 16, 17, 18, 20, 22, 24, 26, 27, 29, 31, 32],
        [0, 1, 3, 5, 6, 7, 9, 11, 13, 15, 17, 18, 20, 22, 23, 24, 25, 26, 27, 28, 30, 32],
    ),
    (
        32,
        32,
        1.5,
        1.5,
        True,
        87654321,
        5,
        [0, 1, 3, 4, 6, 7, 9, 10, 12, 13, 15, 16, 18, 19, 21, 23, 24, 26, 27, 29, 30, 32],
        [0, 2, 4, 5, 7, 8, 10, 11, 13, 14, 16, 17, 19, 20, 22, 23, 25, 26, 28, 29, 31, 32],
    ),
    (6, 6, 1.41421354, 1.41421354, False, 341261001, 0, [0, 2, 3, 4, 6], [0, 2, 4, 5, 6]),
]


@pytest.mark.parametrize("row", SEED_TABLE, ids=lambda r: f"{r[0]}x{r[1]}-{r[4]}-{r[5]}-{r[6]}")
@pytest.mark.parametrize("op", [T.fractional_avg_pool, T.fractional_max_pool])
def test_sequences_match_tensorflows_seed_table(row, op):
    H, W, rr, rc, pseudo, seed, seed2, rows, cols = row
    _, r, c = op(torch.zeros(1, H, W, 1), [1, rr, rc, 1], pseudo, False, True, seed, seed2)
    assert r.tolist() == rows and c.tolist() == cols
    assert r.dtype == c.dtype == torch.int64
    # The single-axis generator is the row sequence (a fresh stream).
    assert T.fractional_pooling_sequence(H, len(rows) - 1, pseudo, seed, seed2).tolist() == rows


def _random_configs(n, seed):
    rng = np.random.default_rng(seed)
    for _ in range(n):
        H, W = int(rng.integers(1, 70)), int(rng.integers(1, 70))
        rr = float(rng.uniform(1.0, min(H, 6.5))) if rng.random() < 0.9 else float(min(H, 2))
        rc = float(rng.uniform(1.0, min(W, 6.5))) if rng.random() < 0.9 else 1.0
        seed_choices = [int(rng.integers(-(2**62), 2**62)), int(rng.integers(0, 2**31)), 0, -1]
        yield (
            H,
            W,
            rr,
            rc,
            bool(rng.integers(2)),
            bool(rng.integers(2)),
            seed_choices[int(rng.integers(4))],
            int(rng.integers(0, 2**40)) or 1,
        )


@pytest.mark.parametrize(
    "cfg", list(_random_configs(150, 7)), ids=lambda c: "x".join(map(str, c[:2]))
)
def test_sequences_match_the_reference_generator(cfg):
    H, W, rr, rc, pseudo, _ov, seed, seed2 = cfg
    ratio = [1.0, rr, rc, 1.0]
    _, rows, cols = T.fractional_avg_pool(
        torch.zeros(1, H, W, 1), ratio, pseudo, False, True, seed, seed2
    )
    ref_rows, ref_cols = R.fractional_sequences(
        H, W, [1, np.float32(rr), np.float32(rc), 1], pseudo, seed, seed2
    )
    assert rows.tolist() == ref_rows and cols.tolist() == ref_cols
    assert rows[-1] == H and cols[-1] == W and (rows.diff() > 0).all()


VALUE_DTYPES = [torch.float32, torch.float64, torch.int32, torch.int64]


def _value(shape, dtype, gen):
    x = torch.randn(shape, generator=gen, dtype=torch.float64) * 50
    return x.to(dtype)


@pytest.mark.parametrize("dtype", VALUE_DTYPES, ids=str)
@pytest.mark.parametrize(
    "cfg", list(_random_configs(12, 11)), ids=lambda c: "x".join(map(str, c[:2]))
)
@pytest.mark.parametrize("C", [1, 5, 8, 40])
def test_pool_and_grads_bit_exact_with_reference(dtype, cfg, C):
    H, W, rr, rc, pseudo, ov, seed, seed2 = cfg
    gen = torch.Generator().manual_seed(H * 100 + W)
    x = _value((2, H, W, C), dtype, gen)
    ratio = [1.0, rr, rc, 1.0]
    out, rows, cols = T.fractional_avg_pool(x, ratio, pseudo, ov, True, seed, seed2)
    r, c = rows.tolist(), cols.tolist()
    assert np.array_equal(out.numpy(), R.fractional_pool_ref(x.numpy(), r, c, ov, "avg"))
    mx, mr, mc = T.fractional_max_pool(x, ratio, pseudo, ov, True, seed, seed2)
    assert mr.tolist() == r and mc.tolist() == c
    assert np.array_equal(mx.numpy(), R.fractional_pool_ref(x.numpy(), r, c, ov, "max"))
    dy = _value(out.shape, dtype, gen)
    g = T.fractional_avg_pool_grad(x.shape, dy, rows, cols, ov)
    assert np.array_equal(g.numpy(), R.fractional_avg_pool_grad_ref(x.shape, dy.numpy(), r, c, ov))
    mg = T.fractional_max_pool_grad(x, mx, dy, rows, cols, ov)
    assert np.array_equal(
        mg.numpy(), R.fractional_max_pool_grad_ref(x.numpy(), mx.numpy(), dy.numpy(), r, c, ov)
    )


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_half_types_accumulate_in_float(dtype):
    x = torch.randn(2, 17, 15, 19).to(dtype)
    ratio = [1, 1.6, 1.3, 1]
    out, rows, cols = T.fractional_avg_pool(x, ratio, False, True, True, 5, 6)
    ref = R.fractional_pool_ref(x.float().numpy(), rows.tolist(), cols.tolist(), True, "avg")
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), torch.from_numpy(ref).to(dtype).float(), rtol=0, atol=0)
    mx = T.fractional_max_pool(x, ratio, False, True, True, 5, 6)[0]
    ref = R.fractional_pool_ref(x.float().numpy(), rows.tolist(), cols.tolist(), True, "max")
    assert torch.equal(mx.float(), torch.from_numpy(ref))
    dy = torch.randn(out.shape).to(dtype)
    g = T.fractional_avg_pool_grad(x.shape, dy, rows, cols, True)
    ref = R.fractional_avg_pool_grad_ref(
        x.shape, dy.double().numpy(), rows.tolist(), cols.tolist(), True
    )
    torch.testing.assert_close(g.double(), torch.from_numpy(ref), rtol=1e-2, atol=1e-2)
    mg = T.fractional_max_pool_grad(x, mx, dy, rows, cols, True)
    ref = R.fractional_max_pool_grad_ref(
        x.float().numpy(),
        mx.float().numpy(),
        dy.float().numpy(),
        rows.tolist(),
        cols.tolist(),
        True,
    )
    torch.testing.assert_close(mg.float(), torch.from_numpy(ref), rtol=1e-2, atol=1e-2)


def test_tensorflow_doc_examples():
    # The op docs' example, as verified on TF 2.21.
    v = torch.tensor([20.0, 5, 16, 3, 7]).reshape(1, 1, 5, 1)
    out, rows, cols = T.fractional_avg_pool(v, [1, 1, 2, 1], False, True, True, 1, 0)
    assert cols.tolist() == [0, 2, 5] and rows.tolist() == [0, 1]
    assert out.flatten().tolist() == [np.float32(41 / 3), np.float32(26 / 3)]
    assert T.fractional_max_pool(v, [1, 1, 2, 1], False, True, True, 1, 0)[
        0
    ].flatten().tolist() == [20, 16]
    g = T.fractional_avg_pool_grad(
        [1, 1, 5, 1], torch.full((1, 1, 2, 1), 3.0), [0, 1], [0, 2, 4], True
    )
    assert g.flatten().tolist() == [1, 1, 2, 1, 1]


@pytest.mark.parametrize(
    "overlapping,expected",
    [
        (False, [[12, 0, 0, 15], [0, 0, -5, 0], [17, 0, 0, 0], [6, 0, 21, 0]]),
        (True, [[0, 0, 0, 0], [0, 0, 39, 0], [0, 0, 0, 0], [6, 0, 21, 0]]),
    ],
)
def test_max_grad_ties_like_tensorflow(overlapping, expected):
    # TF's testWhenRepeatedMaxValueInPoolingRegion.
    x = torch.tensor([[5, 4, 6, 7], [3, 5, 9, 6], [8, 8, 9, 5], [7, 4, 0, 0]], dtype=torch.float32)
    x = x.reshape(1, 4, 4, 1)
    rows, cols = [0, 1, 3, 4], [0, 2, 4]
    y = torch.from_numpy(R.fractional_pool_ref(x.numpy(), rows, cols, overlapping, "max"))
    dy = torch.tensor([[12.0, 15], [17, -5], [6, 21]]).reshape(1, 3, 2, 1)
    dx = T.fractional_max_pool_grad(x, y, dy, rows, cols, overlapping)
    assert dx.reshape(4, 4).tolist() == expected


@pytest.mark.parametrize("overlapping", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("C", [3, 8, 24])  # scalars; whole vectors (+ a scalar tail at 24 f64)
def test_avg_pool_special_values_and_narrow_cells(overlapping, dtype, C):
    """The vector rows run straight-line code for the widest cell and add a narrower cell's
    repeated last column masked to +0: NaN, infinities of both signs and -0 anywhere, in cells
    1 to 3 wide and high, must give the reference's row-major sums bit for bit (a -0 sum of
    -0 elements, an inf - inf NaN, an inf in a masked column counted once)."""
    g = torch.Generator().manual_seed(C)
    x = torch.randn(2, 17, 19, C, generator=g, dtype=dtype)
    special = torch.rand(x.shape, generator=g, dtype=dtype)
    x[special < 0.03] = float("nan")
    x[(special >= 0.03) & (special < 0.06)] = float("inf")
    x[(special >= 0.06) & (special < 0.09)] = float("-inf")
    x[(special >= 0.09) & (special < 0.2)] = -0.0
    x[1, :4, :5] = -0.0  # whole cells of -0
    for ratio in (1.3, 1.44, 1.73, 2.2):
        y, rows, cols = T.fractional_avg_pool(
            x, [1, ratio, ratio + 0.2, 1], True, overlapping, True, 5, 9
        )
        with np.errstate(invalid="ignore"):  # inf - inf
            ref = R.fractional_pool_ref(x.numpy(), rows.tolist(), cols.tolist(), overlapping, "avg")
        got = y.numpy()
        assert np.array_equal(got, ref, equal_nan=True)  # (a NaN's sign is the CPU's)
        number = ~np.isnan(ref)
        assert np.array_equal(np.signbit(got[number]), np.signbit(ref[number]))  # -0 sums


def test_max_nan_and_integer_semantics():
    nan = float("nan")
    for cell in ([nan, 1, 2, 3], [1, nan, 2, 3], [1, 2, 3, nan]):
        x = torch.tensor(cell).reshape(1, 2, 2, 1)
        assert T.fractional_max_pool(x, [1, 2, 2, 1], False, False, True, 1, 1)[0].item() == 3
    x = torch.tensor([nan, 1, 2, 3]).reshape(1, 2, 2, 1)
    y = torch.tensor([3.0]).reshape(1, 1, 1, 1)
    with pytest.raises(RuntimeError, match="tensor_out_dup is not the same as tensor_out"):
        T.fractional_max_pool_grad(x, y, torch.ones(1, 1, 1, 1), [0, 2], [0, 2])
    # int32: sums wrap, division truncates toward zero.
    x = torch.tensor([-7, 0, 0, 0], dtype=torch.int32).reshape(1, 2, 2, 1)
    assert T.fractional_avg_pool(x, [1, 2, 2, 1], False, False, True, 1, 1)[0].item() == -1
    x = torch.full((1, 2, 2, 1), 2**30, dtype=torch.int32)
    assert T.fractional_avg_pool(x, [1, 2, 2, 1], False, False, True, 1, 1)[0].item() == 0


@pytest.mark.parametrize("overlapping", [False, True])
@pytest.mark.parametrize("C", [3, 16, 32, 40])  # scalars; one, two, five whole vectors
def test_max_grad_checks_every_cell_including_one_wide_last_ones(overlapping, C):
    """Overlapping cells end at the next cell's first index, clamped to the input: here the
    last cell row and column are one element wide, and their only row/column is shared with
    the cells before. Raising or lowering orig_output in any single cell and channel must fail
    TF's check; the unperturbed gradient matches the reference scatter."""
    g = torch.Generator().manual_seed(C)
    x = torch.randn(2, 6, 6, C, generator=g)
    rows, cols = [0, 2, 4, 5, 6], [0, 1, 3, 5, 6]
    y = torch.from_numpy(R.fractional_pool_ref(x.numpy(), rows, cols, overlapping, "max"))
    dy = torch.randn(y.shape, generator=g)
    dx = T.fractional_max_pool_grad(x, y, dy, rows, cols, overlapping)
    ref = R.fractional_max_pool_grad_ref(x.numpy(), y.numpy(), dy.numpy(), rows, cols, overlapping)
    assert np.array_equal(dx.numpy(), ref)
    for i in range(4):
        for j in range(4):
            c = (i * 4 + j) % C
            for delta in (0.5, -0.5):
                bad = y.clone()
                bad[1, i, j, c] += delta
                with pytest.raises(RuntimeError, match="tensor_out_dup is not the same"):
                    T.fractional_max_pool_grad(x, bad, dy, rows, cols, overlapping)


# C: the AVX-512 kernel where C % 16 == 0 and the CPU has it, else the one pass.
@pytest.mark.parametrize("C", [8, 16, 24, 40, 64])
@pytest.mark.parametrize("N,threads", [(1, 2), (1, 3), (2, 3), (1, 8)])
def test_max_grad_bands_of_few_images_equal_whole_images(C, N, threads):
    """Overlapping cells: where the images cannot give the threads equal shares, each is split
    into bands of cell rows, and a band below another recomputes the state (one pass) or the
    argmaxes (AVX-512) of the cell row it starts inside. dx must be bit-identical to the same
    images' dx in a batch that gives every thread one whole image, and a wrong orig_output
    must be caught in every band. (The sanitizer build poisons the kernel's scratch between
    tasks, so a band that read the one before it fails there.)"""
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for seed in range(3):
            g = torch.Generator().manual_seed(seed)
            x = torch.randn(N, 29 + seed, 27, C, generator=g)
            x[:, ::3, ::4] = x[:, 1::3, ::4].max()  # ties: the first maximum in scan order
            y, rows, cols = T.fractional_max_pool(
                x, [1, 1.44 + 0.1 * seed, 1.5, 1], True, True, True, seed + 1, 7
            )
            dy = torch.randn(y.shape, generator=g)
            dx = T.fractional_max_pool_grad(x, y, dy, rows, cols, True)
            many = threads  # N images per thread: equal shares, no bands
            whole = T.fractional_max_pool_grad(
                x.repeat(many, 1, 1, 1),
                y.repeat(many, 1, 1, 1),
                dy.repeat(many, 1, 1, 1),
                rows,
                cols,
                True,
            )
            assert torch.equal(dx, whole[:N])
            ref = R.fractional_max_pool_grad_ref(
                x.numpy(), y.numpy(), dy.numpy(), rows.tolist(), cols.tolist(), True
            )
            assert np.array_equal(dx.numpy(), ref)
            for i in range(y.shape[1]):  # every cell row, so every band
                bad = y.clone()
                bad[i % N, i, (5 * i) % y.shape[2], (3 * i) % C] += 0.5 if i % 2 else -0.5
                with pytest.raises(RuntimeError, match="tensor_out_dup is not the same"):
                    T.fractional_max_pool_grad(x, bad, dy, rows, cols, True)
    finally:
        torch.set_num_threads(old)


def test_zero_seeds_follow_torch_generator():
    x = torch.randn(1, 40, 40, 1)
    torch.manual_seed(3)
    a = T.fractional_avg_pool(x, [1, 1.5, 1.5, 1])[1:]
    b = T.fractional_avg_pool(x, [1, 1.5, 1.5, 1])[1:]
    torch.manual_seed(3)
    c = T.fractional_avg_pool(x, [1, 1.5, 1.5, 1])[1:]
    assert all(torch.equal(p, q) for p, q in zip(a, c))
    assert not all(torch.equal(p, q) for p, q in zip(a, b))
    torch.manual_seed(3)
    s = T.fractional_pooling_sequence(40, 26)
    torch.manual_seed(3)
    assert torch.equal(s, T.fractional_pooling_sequence(40, 26))


def test_strided_inputs_read_in_place():
    base = torch.randn(3, 20, 22, 12)
    ratio, kw = (
        [1, 1.7, 1.4, 1],
        dict(pseudo_random=True, overlapping=True, deterministic=True, seed=4, seed2=2),
    )
    views = [
        base[::2, 1:18, 2:21, :],  # sliced batch/rows/cols
        base.permute(0, 2, 1, 3).contiguous().permute(0, 2, 1, 3),  # H/W strides swapped
        base.permute(0, 3, 1, 2).contiguous().permute(0, 2, 3, 1),  # channels not innermost
        base.permute(0, 3, 1, 2).contiguous(memory_format=torch.channels_last).permute(0, 2, 3, 1),
    ]
    for v in views:
        for op in (T.fractional_avg_pool, T.fractional_max_pool):
            out, rows, cols = op(v, ratio, **kw)
            ref, _, _ = op(v.contiguous(), ratio, **kw)
            assert torch.equal(out, ref) and out.is_contiguous()
        dy = torch.randn(out.shape).permute(0, 2, 1, 3).contiguous().permute(0, 2, 1, 3)
        g = T.fractional_avg_pool_grad(v.shape, dy, rows, cols, True)
        assert torch.equal(
            g, T.fractional_avg_pool_grad(v.shape, dy.contiguous(), rows, cols, True)
        )


def test_orig_shape_as_tensor_list_or_size():
    x = torch.randn(2, 9, 9, 3)
    out, rows, cols = T.fractional_avg_pool(x, [1, 1.5, 1.5, 1], False, False, True, 1, 1)
    dy = torch.randn(out.shape)
    a = T.fractional_avg_pool_grad(x.shape, dy, rows, cols)
    b = T.fractional_avg_pool_grad(torch.tensor(list(x.shape)), dy, rows.tolist(), cols.tolist())
    c = T.fractional_avg_pool_grad(list(x.shape), dy, rows, cols)
    assert torch.equal(a, b) and torch.equal(a, c)


# ---- autograd ---------------------------------------------------------------------------------
def _distinct(shape, seed):
    # Max pooling is differentiable where maxima are unique: distinct, well-separated values.
    g = torch.Generator().manual_seed(seed)
    n = int(np.prod(shape))
    return (torch.randperm(n, generator=g).double() / n).reshape(shape).requires_grad_()


@pytest.mark.parametrize("overlapping", [False, True])
@pytest.mark.parametrize("pseudo_random", [False, True])
def test_gradcheck_and_gradgradcheck(overlapping, pseudo_random):
    ratio = [1, 1.45, 1.8, 1]
    kw = dict(
        pseudo_random=pseudo_random, overlapping=overlapping, deterministic=True, seed=9, seed2=3
    )
    x = _distinct((2, 7, 9, 3), 0)
    avg = lambda v: T.fractional_avg_pool(v, ratio, **kw)[0]  # noqa: E731
    mx = lambda v: T.fractional_max_pool(v, ratio, **kw)[0]  # noqa: E731
    assert torch.autograd.gradcheck(avg, (x,))
    assert torch.autograd.gradgradcheck(avg, (x,))
    assert torch.autograd.gradcheck(mx, (x,))
    assert torch.autograd.gradgradcheck(mx, (x,))
    # The grad ops themselves, w.r.t. out_backprop (linear: exact), and their double backward.
    out, rows, cols = T.fractional_max_pool(x.detach(), ratio, **kw)
    dy = torch.randn(out.shape, dtype=torch.float64, requires_grad=True)
    fa = lambda d: T.fractional_avg_pool_grad(x.shape, d, rows, cols, overlapping)  # noqa: E731
    fm = lambda d: T.fractional_max_pool_grad(x.detach(), out, d, rows, cols, overlapping)  # noqa: E731
    for f in (fa, fm):
        assert torch.autograd.gradcheck(f, (dy,))
        assert torch.autograd.gradgradcheck(f, (dy,))


def test_sequences_are_not_differentiable():
    x = torch.randn(1, 6, 6, 2, requires_grad=True)
    out, rows, cols = T.fractional_max_pool(x, [1, 1.5, 1.5, 1], False, False, True, 1, 2)
    assert out.requires_grad and not rows.requires_grad and not cols.requires_grad


def opcheck_samples():
    """(op name, args, kwargs) for test_opcheck (and tests/test_registry.py)."""
    for name, args in _op_samples():
        yield name, args, {}


def _op_samples():
    x = torch.randn(2, 8, 7, 5, dtype=torch.float64)
    ratio = [1.0, 1.5, 1.3, 1.0]
    for rg in (False, True):
        xv = x.clone().requires_grad_(rg)
        for ov in (False, True):
            yield "fractional_avg_pool", (xv, ratio, False, ov, True, 3, 4)
            yield "fractional_max_pool", (xv, ratio, True, ov, True, 3, 4)
            out, rows, cols = T.fractional_max_pool(x, ratio, True, ov, True, 3, 4)
            dy = torch.randn(out.shape, dtype=torch.float64, requires_grad=rg)
            yield "fractional_avg_pool_grad", (list(x.shape), dy, rows, cols, ov)
            yield "fractional_max_pool_grad", (x, out, dy, rows, cols, ov)
            g = torch.randn(x.shape, dtype=torch.float64, requires_grad=rg)
            yield "_fractional_avg_pool_grad_backward", (g, rows, cols, ov)
            yield "_fractional_max_pool_grad_backward", (x, out, g, rows, cols, ov)
    yield (
        "fractional_avg_pool",
        (torch.randn(1, 9, 9, 4)[:, 1:, :, :], [1.0, 2.0, 1.5, 1.0], False, False, True, 1, 1),
    )
    yield "fractional_pooling_sequence", (17, 9, True, 5, 6)


@pytest.mark.parametrize("sample", list(opcheck_samples()), ids=lambda s: s[0])
def test_opcheck(sample):
    name, args, kwargs = sample
    torch.library.opcheck(getattr(OPS, name).default, args, kwargs)


# ---- modules -----------------------------------------------------------------------------------
def test_modules_keep_sequences_and_tf_arguments():
    x = torch.randn(2, 12, 12, 3)
    m = T.nn.FractionalMaxPool2d(1.5, deterministic=True, seed=3, seed2=4)
    y = m(x)
    ref = T.fractional_max_pool(x, [1, 1.5, 1.5, 1], False, False, True, 3, 4)
    assert torch.equal(y, ref[0]) and torch.equal(m.row_pooling_sequence, ref[1])
    a = T.nn.FractionalAvgPool2d((1.5, 2.0), overlapping=True, deterministic=True)  # zero seeds
    assert a.seed != 0 and torch.equal(a(x), a(x))  # fixed per module, like a TF kernel
    assert a.col_pooling_sequence.tolist() == [0, 2, 4, 6, 8, 10, 12]
    with pytest.raises(NotImplementedError, match="batch nor channel"):
        T.nn.FractionalAvgPool2d([2, 1.5, 1.5, 1])(x)


# ---- devices -----------------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float64, torch.int64, torch.float16], ids=str
)
def test_device_matches_cpu_bit_for_bit(device, dtype):
    x = _value((3, 23, 19, 37), dtype, torch.Generator().manual_seed(0))
    ratio = [1, 1.44, 1.73, 1]
    for ov in (False, True):
        for op in (T.fractional_avg_pool, T.fractional_max_pool):
            out, rows, cols = op(x.to(device), ratio, True, ov, True, 12, 34)
            ref, rr, rc = op(x, ratio, True, ov, True, 12, 34)
            assert out.device.type == rows.device.type == device
            assert torch.equal(out.cpu(), ref) and torch.equal(rows.cpu(), rr)
        dy = _value(ref.shape, dtype, torch.Generator().manual_seed(1))
        g = T.fractional_avg_pool_grad(x.shape, dy.to(device), rows, cols, ov)
        assert torch.equal(g.cpu(), T.fractional_avg_pool_grad(x.shape, dy, rr, rc, ov))
        g = T.fractional_max_pool_grad(x.to(device), out, dy.to(device), rows, cols, ov)
        assert torch.equal(g.cpu(), T.fractional_max_pool_grad(x, ref, dy, rr, rc, ov))


@pytest.mark.parametrize("overlapping", [False, True])
@pytest.mark.parametrize("C", [8, 16, 40, 48])
def test_max_grad_vector_path_equals_scalar_path_on_ties_nan_inf(overlapping, C):
    """The vectorised max gradient (channel blocks) against the per-channel scalar path (C=1,
    checked against TF above) on data full of ties, NaN and infinities."""
    g = torch.Generator().manual_seed(C)
    x = torch.randint(-3, 4, (2, 11, 13, C), generator=g).float()
    _, rows, cols = T.fractional_max_pool(x, [1, 1.6, 1.4, 1], False, overlapping, True, 5, 6)
    # NaN and -inf anywhere but the first element of a cell: TF's grad takes a cell's first
    # element unconditionally, so a NaN there (or a cell of -inf only, whose forward maximum is
    # lowest()) fails TF's orig_output check; later NaNs are skipped by TF's `best < v`.
    starts = torch.zeros(13, dtype=torch.bool)
    starts[cols[:-1]] = True
    special = torch.rand(x.shape, generator=g)
    free = ~starts.view(1, 1, 13, 1)
    x[(special < 0.08) & free] = float("nan")
    x[(special >= 0.08) & (special < 0.16) & free] = float("-inf")
    x[(special >= 0.16) & (special < 0.18)] = float("inf")
    out = T.fractional_max_pool(x, [1, 1.6, 1.4, 1], False, overlapping, True, 5, 6)[0]
    dy = torch.randn(out.shape, generator=g)
    dx = T.fractional_max_pool_grad(x, out, dy, rows, cols, overlapping)
    gin = torch.randn(x.shape, generator=g)
    back = torch.ops.tfgrads._fractional_max_pool_grad_backward(
        x, out, gin, rows, cols, overlapping
    )
    for c in range(C):
        xc = x[..., c : c + 1].contiguous()
        yc = T.fractional_max_pool(xc, [1, 1.6, 1.4, 1], False, overlapping, True, 5, 6)[0]
        assert torch.equal(yc, out[..., c : c + 1])
        dxc = T.fractional_max_pool_grad(
            xc, yc, dy[..., c : c + 1].contiguous(), rows, cols, overlapping
        )
        assert torch.equal(dxc, dx[..., c : c + 1]), c
        backc = torch.ops.tfgrads._fractional_max_pool_grad_backward(
            xc, yc, gin[..., c : c + 1].contiguous(), rows, cols, overlapping
        )
        assert torch.equal(backc, back[..., c : c + 1]), c


@pytest.mark.parametrize("overlapping", [False, True])
@pytest.mark.parametrize(
    "ratio",
    [(1.0, 1.0), (1.2, 1.44), (1.73, 1.3), (1.99, 1.99), (2.5, 1.5), (1.44, 3.1), (4.2, 2.0)],
    ids=str,
)
@pytest.mark.parametrize("C", [24, 32])  # 32: the AVX-512 gradient where the CPU has it
def test_max_grad_every_cell_shape_against_reference(ratio, overlapping, C):
    """Cells up to 3x3 run straight-line code per cell-row height and widest cell (narrower
    cells repeat their last column), in the max forward and gradient; larger ones the loops.
    Every combination against TF's reference pooling and scatter, with ties so that the
    first-maximum rule matters."""
    g = torch.Generator().manual_seed(int(ratio[0] * 100 + ratio[1] * 10 + overlapping))
    x = torch.randint(-2, 3, (2, 23, 19, C), generator=g).float()
    for pseudo in (False, True):
        out, rows, cols = T.fractional_max_pool(x, [1, *ratio, 1], pseudo, overlapping, True, 3, 4)
        assert np.array_equal(
            out.numpy(),
            R.fractional_pool_ref(x.numpy(), rows.tolist(), cols.tolist(), overlapping, "max"),
        )
        dy = torch.randn(out.shape, generator=g)
        dx = T.fractional_max_pool_grad(x, out, dy, rows, cols, overlapping)
        ref = R.fractional_max_pool_grad_ref(
            x.numpy(), out.numpy(), dy.numpy(), rows.tolist(), cols.tolist(), overlapping
        )
        assert np.array_equal(dx.numpy(), ref)
        # Its double backward is the adjoint: each output element takes grad at its argmax.
        gin = torch.randn(x.shape, generator=g)
        back = torch.ops.tfgrads._fractional_max_pool_grad_backward(
            x, out, gin, rows, cols, overlapping
        )
        assert torch.equal(
            back, _select_at_argmax(x, gin, rows.tolist(), cols.tolist(), overlapping)
        )


def _select_at_argmax(x, gin, rows, cols, overlapping):
    """gin at TF's argmax of every cell and channel (first maximum in scan order)."""
    N, H, W, C = x.shape
    out = torch.empty(N, len(rows) - 1, len(cols) - 1, C, dtype=gin.dtype)
    for i in range(len(rows) - 1):
        r1 = min(rows[i + 1] if overlapping else rows[i + 1] - 1, H - 1)
        for j in range(len(cols) - 1):
            c1 = min(cols[j + 1] if overlapping else cols[j + 1] - 1, W - 1)
            cell = x[:, rows[i] : r1 + 1, cols[j] : c1 + 1].reshape(N, -1, C)
            k = cell.argmax(dim=1)  # torch.argmax returns the first maximal index
            gcell = gin[:, rows[i] : r1 + 1, cols[j] : c1 + 1].reshape(N, -1, C)
            out[:, i, j] = gcell.gather(1, k.unsqueeze(1)).squeeze(1)
    return out


@pytest.mark.parametrize("overlapping", [False, True])
@pytest.mark.parametrize("C", [40, 32])  # 32: the AVX-512 gradient where the CPU has it
def test_max_grad_large_float_input_streams_same_values(overlapping, C):
    """A float32 gradient beyond 4 MiB is written with non-temporal stores; it must equal the
    float64 computation on the same values (integer-valued dy: the sums on shared boundaries
    of overlapping cells are exact) and the reference scatter."""
    g = torch.Generator().manual_seed(0)
    x = torch.randint(-50, 50, (4, 96, 96, C), generator=g).float()
    out, rows, cols = T.fractional_max_pool(x, [1, 1.44, 1.73, 1], False, overlapping, True, 1, 2)
    dy = torch.randint(1, 9, out.shape, generator=g).float()
    dx = T.fractional_max_pool_grad(x, out, dy, rows, cols, overlapping)
    dx64 = T.fractional_max_pool_grad(
        x.double(), out.double(), dy.double(), rows, cols, overlapping
    )
    assert dx.numel() * 4 > 4 << 20
    assert torch.equal(dx, dx64.float())
    assert dx.sum() == dy.sum()  # every cell's gradient lands exactly once
    if overlapping:
        ref = R.fractional_max_pool_grad_ref(
            x[:1].numpy(), out[:1].numpy(), dy[:1].numpy(), rows.tolist(), cols.tolist(), True
        )
        assert np.array_equal(dx[:1].numpy(), ref)
    else:
        assert (dx != 0).sum() == (dy != 0).sum()  # one element per cell and channel


def test_max_grad_cells_beyond_float_positions_stay_exact():
    """A cell of more than 2^24 elements: in-cell positions are no longer exact float32 values,
    so the gradient (and its double backward) take exact integer positions. The maximum sits
    at an odd position above 2^24 that float32 rounds down onto its neighbour's position."""
    side = 4100  # one 4100x4100 cell per image: 16.81M positions
    p = side * side - 3  # 16809997 = 2 * 8404998 + 1: rounds (to even) to 16809996
    assert float(torch.tensor(float(p), dtype=torch.float32)) == p - 1
    x = torch.zeros(1, side, side, 8)
    x[0, -1, -3, :] = 1.0  # position p
    x[0, -1, -4, :] = 0.5  # position p - 1
    out, rows, cols = T.fractional_max_pool(x, [1, side, side, 1], False, False, True, 1, 2)
    assert out.shape == (1, 1, 1, 8) and rows.tolist() == [0, side]
    dy = torch.arange(1.0, 9.0).view(1, 1, 1, 8)
    dx = T.fractional_max_pool_grad(x, out, dy, rows, cols, False)
    nz = dx.nonzero()
    assert nz.shape[0] == 8 and (nz[:, 1] == side - 1).all() and (nz[:, 2] == side - 3).all()
    assert torch.equal(dx[0, -1, -3], dy.view(8))
    back = torch.ops.tfgrads._fractional_max_pool_grad_backward(x, out, dx, rows, cols, False)
    assert torch.equal(back, dy)


@pytest.mark.parametrize("overlapping", [False, True])
@pytest.mark.parametrize("C", [5, 16])  # scalar channels only; whole vectors
def test_grads_with_rows_and_columns_no_cell_covers(overlapping, C):
    """Sequences may start after 0 and end before the input's size (TF accepts them): the rows
    and columns no cell covers get a zero gradient, the rest TF's values (avg and max)."""
    g = torch.Generator().manual_seed(C + 2 * overlapping)
    x = torch.randint(-3, 4, (2, 7, 9, C), generator=g).float()
    rows, cols = [1, 3, 5], [2, 4, 7]
    y = torch.from_numpy(R.fractional_pool_ref(x.numpy(), rows, cols, overlapping, "max"))
    dy = torch.randn(y.shape, generator=g)
    r, c = torch.tensor(rows), torch.tensor(cols)
    avg = T.fractional_avg_pool_grad(x.shape, dy, r, c, overlapping)
    assert np.array_equal(
        avg.numpy(), R.fractional_avg_pool_grad_ref(x.shape, dy.numpy(), rows, cols, overlapping)
    )
    mx = T.fractional_max_pool_grad(x, y, dy, r, c, overlapping)
    assert np.array_equal(
        mx.numpy(),
        R.fractional_max_pool_grad_ref(x.numpy(), y.numpy(), dy.numpy(), rows, cols, overlapping),
    )
    for grad in (avg, mx):
        assert not grad[:, 0].any() and not grad[:, :, :2].any()


def _max_grad_cases():
    """Float inputs whose channel counts take the AVX-512 max gradient (multiples of 16; 48
    and 80 make channel blocks of 3 and 4 + 1 vectors), every cell-shape path (straight-line
    2x2 to 3x3, runtime sizes for 4.2), ties, NaN and -inf (not first in a cell), inf, -0 dy,
    a dx beyond 4 MiB (non-temporal stores), and orig_outputs off by one lane (errors)."""
    g = torch.Generator().manual_seed(2024)
    cases = []
    for shape, ratio in [
        ((2, 23, 19, 16), (1.44, 1.73)),
        ((2, 17, 29, 32), (1.2, 2.6)),
        ((1, 31, 37, 48), (2.5, 1.5)),
        ((1, 13, 11, 80), (1.73, 1.3)),
        ((1, 40, 44, 16), (4.2, 2.0)),
        ((4, 96, 96, 32), (1.44, 1.73)),
    ]:
        for ov in (False, True):
            x = torch.randint(-3, 4, shape, generator=g).float()
            y, rows, cols = T.fractional_max_pool(x, [1, *ratio, 1], False, ov, True, 5, 6)
            starts = torch.zeros(shape[1], shape[2], dtype=torch.bool)
            starts[rows[:-1].view(-1, 1), cols[:-1].view(1, -1)] = True
            special = torch.rand(shape, generator=g)
            free = ~starts.view(1, shape[1], shape[2], 1)
            x[(special < 0.05) & free] = float("nan")
            x[(special >= 0.05) & (special < 0.1) & free] = float("-inf")  # (all--inf cells
            # have the forward's lowest() as maximum: an orig_output mismatch in TF's grad)
            x[(special >= 0.1) & (special < 0.12)] = float("inf")
            y = T.fractional_max_pool(x, [1, *ratio, 1], False, ov, True, 5, 6)[0]
            dy = torch.randn(y.shape, generator=g)
            dy[torch.rand(y.shape, generator=g) < 0.1] = -0.0
            cases.append((x, y, dy, rows, cols, ov))
            bad = y.clone()
            v = bad.view(-1)[17]  # channel 1 or 17 of the first cells: a lower "maximum"
            bad.view(-1)[17] = v - 1 if torch.isfinite(v) else 0.5
            cases.append((x, bad, dy, rows, cols, ov))
    return cases


@needs_avx512
def test_max_grad_avx512_kernel_equals_avx2_kernel_bit_for_bit(tmp_path):
    """The float max gradient has an AVX-512 kernel (another argmax search, 16 lanes) chosen
    at run time; ATEN_CPU_CAPABILITY=avx2 selects the AVX2 kernel, which the tests above check
    against TF's reference. Both must give the same bits and the same errors."""
    cases = _max_grad_cases()
    avx2 = results_at_avx2([("fractional_max_pool_grad", c) for c in cases], tmp_path)
    errors = 0
    for (x, y, dy, rows, cols, ov), theirs in zip(cases, avx2):
        try:
            ours = T.fractional_max_pool_grad(x, y, dy, rows, cols, ov)
        except RuntimeError as e:
            assert str(e) == theirs
            assert "tensor_out_dup is not the same as tensor_out" in str(e)
            errors += 1
            continue
        assert not isinstance(theirs, str), theirs
        assert torch.equal(ours.view(torch.int32), theirs.view(torch.int32))
        assert (ours != 0).any()
    assert errors == len(cases) // 2  # every perturbed orig_output, and only those


@pytest.mark.parametrize("cls", [T.nn.FractionalAvgPool2d, T.nn.FractionalMaxPool2d])
def test_module_accepts_an_empty_batch_the_op_refuses(cls):
    """A DDP rank without data: an empty output of the pooled size, an empty gradient, and the
    sequences a non-empty call with the same seeds draws."""
    m = cls([1.5, 1.4], overlapping=True, deterministic=True, seed=3, seed2=4)
    x = torch.randn(0, 9, 7, 2, requires_grad=True)
    with pytest.raises(RuntimeError, match="for dimension 0"):
        cls._op(x, m.pooling_ratio, False, True, True, 3, 4)
    y = m(x)
    rows, cols = m.row_pooling_sequence, m.col_pooling_sequence
    full = m(torch.randn(2, 9, 7, 2))
    assert y.shape == (0, *full.shape[1:])
    assert torch.equal(rows, m.row_pooling_sequence) and torch.equal(cols, m.col_pooling_sequence)
    y.sum().backward()
    assert x.grad.shape == x.shape
