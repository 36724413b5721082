"""The CUDA kernels' per-element bodies run on the host (tfgrads_test ops over the host-device
functions in csrc/common/*_cells.h) against the CPU kernels: the GPU's arithmetic checked on a
machine without a GPU, at shapes and dtypes the CUDA tests would need a GPU for. Bit for bit
where the ops promise it (fractional pools); at the dtype's rounding where the devices sum in
other orders or use other activations (batch norm, depthwise, CudnnRNN)."""

import itertools

import pytest
import torch

import torch_tfgrads as T
from helpers import rel_err

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


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(1, 3, 600, 8), (2, 4, 5, 2056)], ids=["chunks", "wide"])
def test_max_grad_chunks_of_cells(shape, dtype):
    """The CPU max gradient sweeps a row's disjoint cells in chunks (the argmaxes of a chunk,
    then its stores): several chunks per row (8 channels, 416 cells), and channels beyond one
    chunk's buffer (2056)."""
    x = _value(shape, dtype, seed=3)
    out, rows, cols = T.fractional_max_pool(x, [1, 1.44, 1.44, 1], False, False, True, 1, 2)
    dy = _value(out.shape, dtype, seed=4)
    want = cells("max_grad", [x, out, dy], rows, cols, [], False)
    assert torch.equal(T.fractional_max_pool_grad(x, out, dy, rows, cols, False), want)


def test_fractional_pool_bodies_strided_input_and_mismatch():
    x = _value((2, 30, 30, 8), torch.float32, 1).permute(0, 2, 1, 3)  # other H/W strides
    out, rows, cols = T.fractional_max_pool(x, [1, 1.5, 1.5, 1], True, True, True, 1, 2)
    assert torch.equal(cells("max", [x], rows, cols, [], True), out)
    with pytest.raises(RuntimeError, match="tensor_out_dup is not the same"):
        cells("max_grad", [x, out + 1, out], rows, cols, [], True)


# ---- FusedBatchNorm: the CUDA reductions' partition and merge order, emulated on the host ----
bn_partials = torch.ops.tfgrads_test.fused_batch_norm_partials.default

BN_GEOMETRIES = [
    # shape, data_format, channels_last memory, what it reaches
    ((256, 16, 32, 3), "NHWC", False, "1024 partials of 128 rows"),
    ((65537, 1, 1, 5), "NHWC", False, "1024 partials of 65 rows, the last 15 empty"),
    ((9, 7, 11, 33), "NHWC", False, "two channel groups, 31 idle threads"),
    ((5, 60, 1, 65), "NHWC", False, "5 partials: 11 of the 16 merge rows idle"),
    ((4, 65, 30, 31), "NCHW", True, "channels_last NCHW: the channels-last kernel"),
    ((64, 3, 128, 512), "NCHW", False, "1024 partials of a channel's 4096 elements"),
    ((1023, 2, 4097, 1), "NCHW", False, "1024 partials across image boundaries"),
    ((2, 65, 3, 5, 7), "NCDHW", False, "channels-first 5-D, one partial"),
    ((0, 4, 4, 7), "NHWC", False, "empty batch: NaN statistics"),
]


@pytest.mark.parametrize(
    "shape,data_format,cl,what", BN_GEOMETRIES, ids=[g[3] for g in BN_GEOMETRIES]
)
def test_batch_norm_merge_order_at_gpu_geometries(shape, data_format, cl, what):
    """Moments from the emulated CUDA partials against float64 (Welford and Chan's merge are
    exact up to rounding: 1e-6 relative in float32), every element counted once."""
    gen = torch.Generator().manual_seed(len(what))
    x = torch.randn(shape, generator=gen) * 3 + 10  # a mean offset makes naive sums lose digits
    if cl:
        x = x.contiguous(memory_format=torch.channels_last)
    counts, stats = bn_partials(x, None, None, data_format)
    cdim = 1 if data_format.startswith("NC") else x.dim() - 1
    xd = x.double().movedim(cdim, -1).reshape(-1, x.shape[cdim])
    n = xd.shape[0]
    assert torch.equal(counts.sum(0), torch.full((x.shape[cdim],), float(n), dtype=torch.float64))
    assert torch.equal(stats[0], counts.sum(0))
    if "1024 partials" in what:
        assert counts.shape[0] == 1024
    if "empty" in what and n:
        assert bool((counts == 0).any())
    if n == 0:
        assert bool(stats[1:].isnan().all() | (stats[1:] == 0).all())
        return
    mean = xd.mean(0)
    m2 = (xd - mean).square().sum(0)
    assert torch.allclose(stats[1], mean, rtol=1e-6, atol=0)
    assert torch.allclose(stats[2], m2, rtol=1e-5, atol=0)
    # the CPU kernel's batch statistics (TF-checked) agree as well
    *_, rs1, rs2, _ = T.fused_batch_norm_v3(
        x, torch.ones(x.shape[cdim]), torch.zeros(x.shape[cdim]), data_format=data_format
    )
    assert torch.allclose(stats[1].float(), rs1, rtol=1e-6, atol=1e-6)
    assert torch.allclose((stats[2] / n).float(), rs2, rtol=1e-5, atol=0)


@pytest.mark.parametrize(
    "shape,data_format,cl,what", BN_GEOMETRIES[:7], ids=[g[3] for g in BN_GEOMETRIES[:7]]
)
def test_batch_norm_gradient_sums_at_gpu_geometries(shape, data_format, cl, what):
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(shape, generator=gen)
    dy = torch.randn(shape, generator=gen)
    if cl:
        x, dy = (t.contiguous(memory_format=torch.channels_last) for t in (x, dy))
    cdim = 1 if data_format.startswith("NC") else x.dim() - 1
    mean = x.double().movedim(cdim, -1).reshape(-1, x.shape[cdim]).mean(0).float()
    _, sums = bn_partials(x, dy, mean, data_format)
    xd = x.double().movedim(cdim, -1).reshape(-1, x.shape[cdim])
    gd = dy.double().movedim(cdim, -1).reshape(-1, x.shape[cdim])
    assert torch.allclose(sums[0], gd.sum(0), rtol=1e-5, atol=1e-3)
    assert torch.allclose(sums[1], (gd * (xd - mean.double())).sum(0), rtol=1e-5, atol=1e-3)


# ---- DepthwiseConv2dNative: the CUDA kernels' bodies and the filter gradient's chunk order ----
dw_cells = torch.ops.tfgrads_test.depthwise_conv2d_cells.default

DW_GEOMETRIES = [
    # input, filter [kh, kw, C, M], strides (H, W), padding, dilations (H, W), format, memory
    ((2, 9, 11, 5), (3, 3, 5, 2), (1, 1), "SAME", (1, 1), "NHWC", False),
    ((3, 4, 12, 10), (2, 3, 4, 1), (2, 1), "VALID", (1, 2), "NCHW", False),
    ((3, 6, 17, 13), (3, 2, 6, 3), (1, 2), "SAME", (1, 1), "NCHW", True),  # channels_last NCHW
    ((64, 64, 64, 3), (3, 3, 3, 1), (1, 1), "SAME", (1, 1), "NHWC", False),  # 128 chunks
    ((8, 4, 130, 126), (3, 3, 4, 2), (2, 2), "VALID", (1, 1), "NCHW", False),  # 15 chunks
]


def _dw_args(fmt, strides, dilations):
    sh, sw = strides
    dh, dw = dilations
    if fmt == "NCHW":
        return dict(strides=[1, 1, sh, sw], dilations=[1, 1, dh, dw])
    return dict(strides=[1, sh, sw, 1], dilations=[1, dh, dw, 1])


# every geometry in float32; the small ones also in float64 and bfloat16
DW_CASES = [(torch.float32, g) for g in DW_GEOMETRIES] + [
    (dtype, g) for dtype in (torch.float64, torch.bfloat16) for g in DW_GEOMETRIES if g[0][0] < 8
]


@pytest.mark.parametrize(
    "dtype,geometry",
    DW_CASES,
    ids=lambda v: (
        str(v).replace("torch.", "") if isinstance(v, torch.dtype) else f"{v[0]}-{v[1]}-{v[5]}"
    ),
)
def test_depthwise_bodies_and_filter_grad_order(dtype, geometry):
    """The CUDA bodies replayed on the host against the CPU kernels (other summation orders:
    compared at the dtype's rounding), and the filter gradient's plan: chunks within their
    limits, the partials' workspace at most 64 MiB."""
    ishape, fshape, strides, padding, dil, fmt, cl = geometry
    gen = torch.Generator().manual_seed(sum(ishape))
    x = torch.randn(ishape, generator=gen).to(dtype)
    if cl:
        x = x.contiguous(memory_format=torch.channels_last)
    f = (torch.randn(fshape, generator=gen) / (fshape[0] * fshape[1])).to(dtype)
    kw = _dw_args(fmt, strides, dil)
    common = (kw["strides"], padding, [], fmt, kw["dilations"])
    tol = {torch.float32: 2e-6, torch.float64: 1e-13, torch.bfloat16: 1e-2}[dtype]
    want = T.depthwise_conv2d_native(x, f, kw["strides"], padding, (), fmt, kw["dilations"])
    got, _ = dw_cells("forward", x, f, [], *common)
    assert got.stride() == want.stride() and rel_err(got.double(), want.double()) <= tol
    dy = torch.randn(want.shape, generator=gen).to(dtype)
    want = T.depthwise_conv2d_native_backprop_input(
        list(ishape), f, dy, kw["strides"], padding, (), fmt, kw["dilations"]
    )
    got, _ = dw_cells("backprop_input", f, dy, list(ishape), *common)
    assert rel_err(got.double(), want.double()) <= tol
    want = T.depthwise_conv2d_native_backprop_filter(
        x, list(fshape), dy, kw["strides"], padding, (), fmt, kw["dilations"]
    )
    got, plan = dw_cells("backprop_filter", x, dy, list(fshape), *common)
    assert rel_err(got.double(), want.double()) <= tol * 10  # sums over N * Ho * Wo pixels
    chunks, per_chunk, workspace = plan.tolist()
    P = dy.numel() // (fshape[2] * fshape[3])  # output pixels
    assert 1 <= chunks <= 1024 and (chunks - 1) * per_chunk < P <= chunks * per_chunk
    acc_bytes = 8 if dtype == torch.float64 else 4
    assert workspace == chunks * fshape[0] * fshape[1] * fshape[2] * fshape[3] * acc_bytes
    assert workspace <= 64 << 20
    assert chunks == {64: 128, 8: 15}.get(ishape[0], 1)  # 2048 pixels per chunk at least


# ---- CudnnRNN: the CUDA cell kernels' per-element bodies through the shared driver ----------
rnn_cells = torch.ops.tfgrads_test.cudnn_rnn_host_cells.default
RNN_CASES = [
    # mode, layers, directions, projection, lengths (T = 6)
    ("lstm", 1, 1, 0, [6, 6, 6]),
    ("lstm", 2, 2, 0, [6, 1, 4, 3]),
    ("lstm", 1, 2, 3, [2, 6, 5]),
    ("gru", 2, 1, 0, [6, 3, 1]),
    ("gru", 1, 2, 0, [4, 6]),
    ("rnn_tanh", 2, 2, 0, [1, 6, 2]),
    ("rnn_relu", 1, 1, 0, [5, 6, 3, 6]),
]


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 2e-5)])
@pytest.mark.parametrize("training", [True, False], ids=["training", "inference"])
@pytest.mark.parametrize("mode,L,D,P,lengths", RNN_CASES, ids=lambda v: str(v))
def test_rnn_cell_bodies_match_the_cpu_cells(mode, L, D, P, lengths, training, dtype, tol):
    """The element bodies the CUDA kernels run (CUDA's exp/tanh, the GPU's indexing and length
    handling) against the CPU op (TF-checked, vectorised cells with TF's fast activations):
    outputs, states and all four gradients, with rows past their length and projection."""
    gen = torch.Generator().manual_seed(L * 10 + D + P)
    Tn, B, I, U = 6, len(lengths), 5, 7
    Hh, LD = P or U, L * D
    direction = "bidirectional" if D == 2 else "unidirectional"
    n = T.cudnn_rnn_params_size(L, U, I, mode, direction=direction, num_proj=P)
    x, h, c, p = (
        torch.randn(s, generator=gen, dtype=torch.float64).to(dtype)
        for s in ((Tn, B, I), (LD, B, Hh), (LD, B, U), (int(n),))
    )
    p = p * 0.4
    lens = torch.tensor(lengths, dtype=torch.int32)
    ours = torch.ops.tfgrads.cudnn_rnn_v3(
        x, h, c, p, lens, mode, "linear_input", direction, 0.0, 0, 0, P, training, True
    )
    dy, dh, dc = (
        torch.randn(t.shape, generator=gen, dtype=torch.float64).to(dtype) for t in ours[:3]
    )
    got = rnn_cells(x, h, c, p, lens, dy, dh, dc, mode, direction, P, training)
    want = list(ours[:3])
    if training:
        want += torch.ops.tfgrads.cudnn_rnn_backprop_v3(
            x,
            h,
            c,
            p,
            lens,
            *ours[:3],
            dy,
            dh,
            dc,
            ours[3],
            ours[4],
            mode,
            "linear_input",
            direction,
            0.0,
            0,
            0,
            P,
            True,
        )
    assert len(got) == len(want) == (7 if training else 3)
    for name, g, w in zip(["y", "h", "c", "dx", "dh0", "dc0", "dparams"], got, want):
        assert g.shape == w.shape and g.dtype == w.dtype, name
        assert rel_err(g, w) < tol, (name, rel_err(g, w))
