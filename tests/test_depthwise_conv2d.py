"""DepthwiseConv2dNative family without TensorFlow: the three ops against the float64
grouped-convolution reference over every attr combination (dilations, unequal strides, NCHW,
EXPLICIT, depth multipliers, both memory formats), dtypes, layouts, empty inputs, determinism,
autograd (gradcheck/gradgradcheck), opcheck, the Keras-style module and the CUDA kernels where a
GPU is present."""

import pytest
import torch

import torch_tfgrads as T
from helpers import DEVICES, needs_avx512, rel_err, results_at_avx2
from torch_tfgrads.parity.depthwise_conv2d import check_case, ours
from torch_tfgrads.parity.depthwise_conv2d_cases import Case, random_cases, reference

OPS = torch.ops.tfgrads
TOL = {torch.float32: 1e-5, torch.float64: 1e-12}


@pytest.mark.parametrize("case", list(random_cases(160, seed=7)), ids=lambda c: c.name)
def test_matches_float64_reference(case):
    errs = check_case(case, use_tf=False)
    assert max(errs.values()) <= TOL[case.x.dtype], errs


def test_random_cases_cover_the_attr_space():
    cases = list(random_cases(160, seed=7))
    assert {c.data_format for c in cases} == {"NHWC", "NCHW"}
    assert {c.padding for c in cases} == {"SAME", "VALID", "EXPLICIT"}
    assert any(c.strides[0] != c.strides[1] for c in cases)
    assert any(c.dilations != (1, 1) for c in cases)
    assert any(c.f.shape[3] > 1 for c in cases)
    assert any(not c.x.is_contiguous() for c in cases) and any(c.x.is_contiguous() for c in cases)


def make_case(
    N=2,
    H=9,
    W=8,
    C=5,
    M=1,
    k=(3, 3),
    s=(1, 1),
    d=(1, 1),
    padding="SAME",
    explicit=((0, 0), (0, 0)),
    fmt="NHWC",
    dtype=torch.float64,
    seed=0,
):
    from torch_tfgrads.parity.depthwise_conv2d_cases import out_size_and_pads

    g = torch.Generator().manual_seed(seed)
    Ho = out_size_and_pads(H, k[0], s[0], d[0], padding, explicit[0])[0]
    Wo = out_size_and_pads(W, k[1], s[1], d[1], padding, explicit[1])[0]
    x = torch.randn(N, H, W, C, generator=g, dtype=torch.float64)
    f = torch.randn(*k, C, M, generator=g, dtype=torch.float64)
    dy = torch.randn(N, Ho, Wo, C * M, generator=g, dtype=torch.float64)
    if fmt == "NCHW":
        x, dy = x.permute(0, 3, 1, 2).contiguous(), dy.permute(0, 3, 1, 2).contiguous()
    return Case(x.to(dtype), f.to(dtype), dy.to(dtype), s, d, padding, explicit, fmt)


# The vectorised paths: 3x3 / 5x5 sliding windows at stride 1 and 2, wide images (tiles of 8
# and 4 pixels), channel counts with and without a vector tail, depth multipliers.
@pytest.mark.parametrize("fmt", ["NHWC", "NCHW"])
@pytest.mark.parametrize(
    "k,s,d",
    [
        ((3, 3), (1, 1), (1, 1)),
        ((3, 3), (2, 2), (1, 1)),
        ((5, 5), (1, 1), (1, 1)),
        ((5, 5), (2, 2), (1, 1)),
        ((3, 3), (1, 2), (2, 1)),
        ((1, 1), (1, 1), (1, 1)),
        ((2, 4), (3, 1), (1, 3)),
    ],
)
@pytest.mark.parametrize("C,M", [(32, 1), (19, 1), (8, 3)])
def test_fast_paths_match_reference(fmt, k, s, d, C, M):
    # 29 columns: runs of 8-column tiles; 14 columns: 8 + 4 (and overlapping 4-tiles).
    for padding, (H, W) in (("SAME", (23, 29)), ("VALID", (23, 29)), ("SAME", (14, 14))):
        case = make_case(
            N=2,
            H=H,
            W=W,
            C=C,
            M=M,
            k=k,
            s=s,
            d=d,
            padding=padding,
            fmt=fmt,
            dtype=torch.float32,
            seed=C + M,
        )
        errs = check_case(case, use_tf=False)
        assert max(errs.values()) <= 1e-5, (padding, errs)


# Float layers in whole vectors tile a row's border pixels too, as tiles over the unclipped taps
# that skip the sources in the padding: rows narrower than a tile, paddings wider than the
# filter (pixels with no taps at all), rows ending in 1-3 pixels; 16 channels take the
# 16-lane tiles where ATen runs at AVX512, 24 the 8-lane ones.
@pytest.mark.parametrize(
    "k,s",
    [((5, 5), (1, 1)), ((3, 3), (1, 1)), ((3, 3), (2, 2)), ((5, 5), (2, 2)), ((2, 4), (1, 1))],
)
@pytest.mark.parametrize(
    "W,pads", [(3, (4, 6)), (9, (2, 2)), (13, (0, 5)), (22, (7, 1)), (31, (2, 2))]
)
@pytest.mark.parametrize("C", [16, 24])
def test_border_tiles_skip_the_padding(k, s, W, pads, C):
    case = make_case(
        N=2,
        H=7,
        W=W,
        C=C,
        k=k,
        s=s,
        padding="EXPLICIT",
        explicit=((1, 2), pads),
        dtype=torch.float32,
        seed=W + C,
    )
    errs = check_case(case, use_tf=False)
    assert max(errs.values()) <= 1e-5, errs


@pytest.mark.parametrize(
    "C,H,s",
    [
        (136, 64, 1),
        (20, 120, 1),
        (20, 121, 2),
        (256, 46, 1),
        (512, 33, 1),
        (1024, 23, 1),
        (1040, 23, 1),
        (1060, 23, 1),
    ],
)
def test_large_outputs_streamed_and_chunked_match_reference(C, H, s):
    """Outputs beyond 4 MiB are written with non-temporal stores from a row buffer (also rows that
    are not 32-byte aligned: 20 channels), or straight from the two-vector narrow tiles (256 and
    512 channels); more than 64 channels are processed in chunks of 64 (1040: the last one a
    single 16-lane vector; 1060, in 8 lanes: 36 channels, the last 4 one at a time), except
    that the forward and input gradient take pixels of 4 KiB (1024 channels) whole."""
    case = make_case(
        N=2 if C > 64 else 4,
        H=H,
        W=H,
        C=C,
        k=(3, 3),
        s=(s, s),
        fmt="NHWC",
        dtype=torch.float32,
        seed=C,
    )
    errs = check_case(case, use_tf=False)
    assert max(errs.values()) <= 1e-5, errs


# Few taps per pixel (average <= 4.5, or <= 7 from 128 channels; input gradients of strided
# layers, and forwards of 1x1 and 1xk filters): each pixel over all its channels, runs of
# pixels sharing shifted taps. Unrolled for 1, 2, 3, 4, 6, 9 taps, looped
# otherwise (1x5: 5), zeros where a pixel has none (1x1 at stride 2); outputs over 4 MiB whose
# source and output pass 10 MiB: float pixels of whole 64-byte lines streamed from registers,
# others through staging rows (below 10 MiB they stay in the cache: ordinary stores).
@pytest.mark.parametrize(
    "N,H,C,k,s,dtype",
    [
        (2, 15, 8, (3, 3), (2, 2), torch.float32),  # in place, one vector per pixel
        (2, 46, 256, (3, 3), (2, 2), torch.float32),  # 4.4 MB, with its source 5.5: in cache
        (4, 46, 256, (3, 3), (2, 2), torch.float32),  # streamed from registers (8.9 + 2.3 MB)
        (14, 100, 20, (3, 3), (2, 2), torch.float32),  # staged: 80-byte pixels (11.3 + 2.9 MB)
        (8, 46, 256, (3, 3), (2, 2), torch.bfloat16),  # staged half type (8.9 + 2.3 MB)
        (2, 29, 144, (5, 5), (2, 2), torch.float32),  # 9 / 6 / 4 taps
        (2, 17, 128, (1, 5), (1, 1), torch.float32),  # 5 taps: looped
        (2, 17, 16, (1, 1), (2, 2), torch.float32),  # no taps on odd rows and columns
        (2, 33, 24, (2, 2), (2, 2), torch.float64),
    ],
)
def test_few_taps_per_pixel(N, H, C, k, s, dtype):
    case = make_case(N=N, H=H, W=H + 1, C=C, k=k, s=s, fmt="NHWC", dtype=dtype, seed=C)
    exact = reference(
        Case(
            case.x.double(),
            case.f.double(),
            case.dy.double(),
            case.strides,
            case.dilations,
            case.padding,
            case.explicit,
            case.data_format,
        )
    )
    tol = {torch.float32: 1e-5, torch.float64: 1e-12, torch.bfloat16: 3e-2}[dtype]
    for got, want in zip(ours(case), exact):
        assert got.dtype == dtype and rel_err(got, want) <= tol


@pytest.mark.parametrize("C,dtype", [(256, torch.float32), (512, torch.float16)])
@pytest.mark.parametrize("s", [1, 2])
def test_channel_widths_that_alias_in_l1_use_narrow_tiles(C, dtype, s):
    """Pixels a multiple of 1 KiB apart take the 4-column tile path."""
    case = make_case(N=2, H=14, W=15, C=C, k=(3, 3), s=(s, s), fmt="NHWC", dtype=dtype, seed=s)
    exact = reference(
        Case(
            case.x.double(),
            case.f.double(),
            case.dy.double(),
            case.strides,
            case.dilations,
            case.padding,
            case.explicit,
            case.data_format,
        )
    )
    tol = 1e-5 if dtype == torch.float32 else 4e-3
    for got, want in zip(ours(case), exact):
        assert rel_err(got, want) <= tol


@pytest.mark.parametrize(
    "dtype,C,narrow",
    [
        (torch.float32, 256, 248),
        (torch.float32, 256, 251),
        (torch.float64, 128, 120),
        (torch.bfloat16, 512, 496),
    ],
)
@pytest.mark.parametrize("W,k", [(10, (3, 3)), (6, (3, 3)), (6, (1, 3)), (9, (5, 5)), (7, (3, 2))])
def test_filter_gradient_by_pixel_equals_the_tiles_bit_for_bit(dtype, C, narrow, W, k):
    """On the 8-lane path, layers whose pixels alias in L1 (C * itemsize a multiple of 1 KiB)
    sum the filter gradient pixel by pixel over all channels; other layers run the tiles. Each
    channel's sums depend on that channel alone, and at these widths both take the same tiles
    (one per run), so the first `narrow` channels must come out the same bits either way. Float
    3-column filters on rows of up to 16 columns (W 6 and 10) take the direct order instead,
    from packed blocks at 256 channels and in place at 248 or 251 (the last three channels one
    at a time): the same bits too."""
    g = torch.Generator().manual_seed(W * 10 + k[1])
    x = torch.randn(3, 5, W, C, generator=g).to(dtype)
    f = torch.randn(k[0], k[1], C, 1, generator=g).to(dtype)
    y = T.depthwise_conv2d_native(x, f, [1, 1, 1, 1], "SAME")
    dy = torch.randn(y.shape, generator=g).to(dtype)
    wide = T.depthwise_conv2d_native_backprop_filter(x, list(f.shape), dy, [1, 1, 1, 1], "SAME")
    xs, dys = x[..., :narrow].contiguous(), dy[..., :narrow].contiguous()
    tiles = T.depthwise_conv2d_native_backprop_filter(
        xs, [k[0], k[1], narrow, 1], dys, [1, 1, 1, 1], "SAME"
    )
    assert torch.equal(wide[:, :, :narrow], tiles)


@pytest.mark.parametrize(
    "C,s,W,padding",
    [
        (512, 1, 14, "SAME"),
        (512, 1, 9, "VALID"),
        (512, 1, 6, "SAME"),
        (256, 2, 28, "SAME"),
        (256, 2, 15, "VALID"),
        (1024, 1, 7, "SAME"),
    ],
)
def test_correlation_by_pixel_equals_the_tiles_bit_for_bit(C, s, W, padding):
    """On the 8-lane path, float 3x3 layers whose pixels alias in L1 with 512+ channels or
    source step 2 run the forward and the input gradient pixel by pixel; narrower layers run
    the sliding tiles. Each channel depends on itself alone: the first C - 8 channels must be
    the same bits either way (the tiles' tap order, taken over by the pixel path)."""
    g = torch.Generator().manual_seed(C + W + s)
    x = torch.randn(2, 9, W, C, generator=g)
    f = torch.randn(3, 3, C, 1, generator=g)
    st = [1, s, s, 1]
    y = T.depthwise_conv2d_native(x, f, st, padding)
    dy = torch.randn(y.shape, generator=g)
    dx = T.depthwise_conv2d_native_backprop_input(list(x.shape), f, dy, st, padding)
    n = C - 8
    xs, fs, dys = x[..., :n].contiguous(), f[:, :, :n].contiguous(), dy[..., :n].contiguous()
    assert torch.equal(y[..., :n], T.depthwise_conv2d_native(xs, fs, st, padding))
    want = T.depthwise_conv2d_native_backprop_input(list(xs.shape), fs, dys, st, padding)
    assert torch.equal(dx[..., :n], want)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("fmt", ["NHWC", "NCHW"])
def test_half_types_accumulate_in_float(dtype, fmt):
    case = make_case(N=2, H=17, W=18, C=24, M=2, k=(3, 3), s=(2, 2), fmt=fmt, dtype=dtype)
    exact = reference(
        Case(
            case.x.double(),
            case.f.double(),
            case.dy.double(),
            case.strides,
            case.dilations,
            case.padding,
            case.explicit,
            case.data_format,
        )
    )
    tol = 4e-3 if dtype == torch.float16 else 3e-2  # one rounding of the result (+ inputs)
    for got, want in zip(ours(case), exact):
        assert got.dtype == dtype
        assert rel_err(got, want) <= tol


def test_memory_formats_give_identical_results_without_copies():
    """An NCHW op on channels_last memory (and NHWC on channels-first memory) computes in place
    and returns the input's memory format."""
    case = make_case(fmt="NCHW", C=16, dtype=torch.float32)
    a = case.attrs()
    x_cl = case.x.contiguous(memory_format=torch.channels_last)
    y = T.depthwise_conv2d_native(case.x, case.f, *a)
    y_cl = T.depthwise_conv2d_native(x_cl, case.f, *a)
    assert y_cl.is_contiguous(memory_format=torch.channels_last) and y.is_contiguous()
    assert rel_err(y_cl, y) <= 1e-6
    dy_cl = case.dy.contiguous(memory_format=torch.channels_last)
    dx = T.depthwise_conv2d_native_backprop_input(case.x.shape, case.f, case.dy, *a)
    dx_cl = T.depthwise_conv2d_native_backprop_input(case.x.shape, case.f, dy_cl, *a)
    assert dx_cl.is_contiguous(memory_format=torch.channels_last)
    assert rel_err(dx_cl, dx) <= 1e-6
    df = T.depthwise_conv2d_native_backprop_filter(case.x, case.f.shape, case.dy, *a)
    df_mixed = T.depthwise_conv2d_native_backprop_filter(x_cl, case.f.shape, case.dy, *a)
    assert rel_err(df_mixed, df) <= 1e-6


def test_arbitrary_strides_are_accepted():
    case = make_case(H=12, W=10, C=6, dtype=torch.float64)
    big = torch.randn(2, 24, 10, 12, dtype=torch.float64)[:, ::2, :, ::2]  # no dense order
    big.copy_(case.x)
    a = case.attrs()
    assert (
        rel_err(
            T.depthwise_conv2d_native(big, case.f, *a),
            T.depthwise_conv2d_native(case.x, case.f, *a),
        )
        == 0
    )


@pytest.mark.parametrize("fmt", ["NHWC", "NCHW"])
def test_sizes_as_list_size_or_tensor(fmt):
    case = make_case(fmt=fmt)
    a = case.attrs()
    want = T.depthwise_conv2d_native_backprop_input(list(case.x.shape), case.f, case.dy, *a)
    for sizes in (
        case.x.shape,
        torch.tensor(case.x.shape, dtype=torch.int32),
        torch.tensor(case.x.shape),
    ):
        assert torch.equal(
            T.depthwise_conv2d_native_backprop_input(sizes, case.f, case.dy, *a), want
        )
    wf = T.depthwise_conv2d_native_backprop_filter(case.x, list(case.f.shape), case.dy, *a)
    assert torch.equal(
        T.depthwise_conv2d_native_backprop_filter(
            case.x, torch.tensor(case.f.shape, dtype=torch.int32), case.dy, *a
        ),
        wf,
    )


# ---- empty and degenerate inputs: zeros, never uninitialised memory ------------------------------
def _poisoned(fn):
    """Runs fn with the allocator's fresh memory filled with NaN-like garbage first."""
    junk = torch.full((1 << 16,), float("nan"))
    del junk
    return fn()


@pytest.mark.parametrize("fmt", ["NHWC", "NCHW"])
def test_empty_and_degenerate_inputs_give_zeros(fmt):
    st = [1, 1, 1, 1]

    def nhwc(*s):
        return (s[0], s[3], s[1], s[2]) if fmt == "NCHW" else s

    x = torch.randn(nhwc(1, 4, 4, 3))
    # filter with a zero spatial size: output [1,5,3,3] (TF's kernel rule), all zero
    y = _poisoned(
        lambda: T.depthwise_conv2d_native(x, torch.ones(0, 2, 3, 1), st, "VALID", data_format=fmt)
    )
    assert y.shape == nhwc(1, 5, 3, 3) and not y.any()
    # multiplier 0 / C=0 / batch 0 / window larger than the input: empty outputs
    assert T.depthwise_conv2d_native(
        x, torch.ones(2, 2, 3, 0), st, "VALID", data_format=fmt
    ).shape == nhwc(1, 3, 3, 0)
    assert T.depthwise_conv2d_native(
        torch.ones(nhwc(1, 4, 4, 0)), torch.ones(2, 2, 0, 2), st, "VALID", data_format=fmt
    ).shape == nhwc(1, 3, 3, 0)
    assert T.depthwise_conv2d_native(
        torch.ones(nhwc(0, 4, 4, 3)), torch.ones(2, 2, 3, 1), st, "VALID", data_format=fmt
    ).shape == nhwc(0, 3, 3, 3)
    assert T.depthwise_conv2d_native(
        torch.ones(nhwc(1, 2, 2, 3)), torch.ones(3, 3, 3, 1), st, "VALID", data_format=fmt
    ).shape == nhwc(1, 0, 0, 3)
    # BackpropInput with multiplier 0 (TF: uninitialised memory) and empty out_backprop
    dx = _poisoned(
        lambda: T.depthwise_conv2d_native_backprop_input(
            nhwc(1, 4, 4, 3),
            torch.ones(2, 2, 3, 0),
            torch.ones(nhwc(1, 3, 3, 0)),
            st,
            "VALID",
            data_format=fmt,
        )
    )
    assert dx.shape == nhwc(1, 4, 4, 3) and not dx.any()
    dx = T.depthwise_conv2d_native_backprop_input(
        nhwc(1, 2, 2, 3),
        torch.ones(3, 3, 3, 1),
        torch.ones(nhwc(1, 0, 0, 3)),
        st,
        "VALID",
        data_format=fmt,
    )
    assert dx.shape == nhwc(1, 2, 2, 3) and not dx.any()
    # BackpropFilter with an empty batch (TF: uninitialised memory, PR #126484)
    df = _poisoned(
        lambda: T.depthwise_conv2d_native_backprop_filter(
            torch.ones(nhwc(0, 4, 4, 3)),
            [2, 2, 3, 2],
            torch.ones(nhwc(0, 3, 3, 6)),
            st,
            "VALID",
            data_format=fmt,
        )
    )
    assert df.shape == (2, 2, 3, 2) and not df.any()


def test_input_smaller_than_window_is_empty_by_the_kernel_rule():
    # H=2, k=3, VALID: trunc((2-3+1)/1) = 0 rows; H=1, k=4, s=2: trunc(-1/2) = 0; H=1,k=3: -1.
    assert T.depthwise_conv2d_native(
        torch.ones(1, 2, 5, 1), torch.ones(3, 1, 1, 1), [1, 1, 1, 1], "VALID"
    ).shape == (1, 0, 5, 1)
    assert T.depthwise_conv2d_native(
        torch.ones(1, 1, 5, 1), torch.ones(4, 1, 1, 1), [1, 2, 1, 1], "VALID"
    ).shape == (1, 0, 5, 1)
    with pytest.raises(RuntimeError, match="Computed output size would be negative: -1"):
        T.depthwise_conv2d_native(
            torch.ones(1, 1, 5, 1), torch.ones(3, 1, 1, 1), [1, 1, 1, 1], "VALID"
        )


def test_filter_gradient_is_deterministic_across_thread_counts():
    case = make_case(N=4, H=40, W=37, C=24, M=1, dtype=torch.float32)
    a = case.attrs()
    old = torch.get_num_threads()
    try:
        results = []
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            results.append(
                T.depthwise_conv2d_native_backprop_filter(case.x, case.f.shape, case.dy, *a)
            )
    finally:
        torch.set_num_threads(old)
    assert all(torch.equal(r, results[0]) for r in results)


def test_dtype_and_device_checks_name_the_argument():
    x, f = torch.randn(1, 4, 4, 3), torch.randn(2, 2, 3, 1)
    with pytest.raises(TypeError, match="argument 'filter' must have the dtype of input"):
        T.depthwise_conv2d_native(x, f.double(), [1, 1, 1, 1], "VALID")
    with pytest.raises(TypeError, match="argument 'input' must be a float16"):
        T.depthwise_conv2d_native(x.int(), f.int(), [1, 1, 1, 1], "VALID")
    with pytest.raises(TypeError, match="argument 'out_backprop' must have the dtype"):
        T.depthwise_conv2d_native_backprop_input(
            [1, 4, 4, 3], f, torch.ones(1, 3, 3, 3).double(), [1, 1, 1, 1], "VALID"
        )
    with pytest.raises(ValueError, match="argument 'padding'"):
        T.depthwise_conv2d_native(x, f, [1, 1, 1, 1], "same")
    with pytest.raises(ValueError, match="argument 'input_sizes'.*1-dim, not 2"):
        T.depthwise_conv2d_native_backprop_input(
            torch.tensor([[1, 4, 4, 3]]), f, torch.ones(1, 3, 3, 3), [1, 1, 1, 1], "VALID"
        )


# ---- autograd ------------------------------------------------------------------------------------
GRAD_CONFIGS = [
    dict(k=(3, 3), s=(1, 1), d=(1, 1), padding="SAME", fmt="NHWC"),
    dict(k=(3, 2), s=(2, 1), d=(1, 2), padding="VALID", fmt="NHWC", M=2),
    dict(
        k=(2, 3), s=(1, 2), d=(2, 1), padding="EXPLICIT", explicit=((1, 2), (0, 1)), fmt="NCHW", M=2
    ),
    dict(k=(3, 3), s=(2, 2), d=(1, 1), padding="SAME", fmt="NCHW"),
]


@pytest.mark.parametrize(
    "cfg",
    GRAD_CONFIGS,
    ids=lambda c: f"{c['fmt']}-{c['padding']}-s{c['s'][0]}{c['s'][1]}-d{c['d'][0]}{c['d'][1]}",
)
def test_gradcheck_and_gradgradcheck(cfg):
    case = make_case(N=2, H=6, W=5, C=3, seed=1, **cfg)
    a = case.attrs()
    x, f, dy = (t.clone().requires_grad_() for t in (case.x, case.f, case.dy))

    def fwd(x, f):
        return T.depthwise_conv2d_native(x, f, *a)

    def bi(f, dy):
        return T.depthwise_conv2d_native_backprop_input(list(case.x.shape), f, dy, *a)

    def bf(x, dy):
        return T.depthwise_conv2d_native_backprop_filter(x, list(case.f.shape), dy, *a)

    for fn, args in ((fwd, (x, f)), (bi, (f, dy)), (bf, (x, dy))):
        assert torch.autograd.gradcheck(fn, args)
        assert torch.autograd.gradgradcheck(fn, args)


def test_forward_gradients_are_the_backprop_ops():
    case = make_case(N=2, H=7, W=6, C=4, M=2, k=(3, 3), s=(2, 1), d=(1, 2), fmt="NCHW")
    a = case.attrs()
    x, f = case.x.clone().requires_grad_(), case.f.clone().requires_grad_()
    T.depthwise_conv2d_native(x, f, *a).backward(case.dy)
    _, dx, df = reference(case)
    assert rel_err(x.grad, dx) <= 1e-12 and rel_err(f.grad, df) <= 1e-12


def opcheck_samples():
    """(op name, args, kwargs) for test_opcheck (and tests/test_registry.py)."""
    for fmt in ("NHWC", "NCHW"):
        case = make_case(N=2, H=6, W=7, C=3, M=2, k=(3, 2), s=(2, 1), d=(1, 2), fmt=fmt)
        a = case.attrs()
        for rg in (False, True):
            x, f, dy = (t.clone().requires_grad_(rg) for t in (case.x, case.f, case.dy))
            yield "depthwise_conv2d_native", (x, f, *a), {}
            yield "depthwise_conv2d_native_backprop_input", (list(x.shape), f, dy, *a), {}
            yield "depthwise_conv2d_native_backprop_filter", (x, list(f.shape), dy, *a), {}


@pytest.mark.parametrize("sample", list(opcheck_samples()), ids=lambda s: f"{s[0]}-{s[1][-2]}")
def test_opcheck(sample):
    name, args, kwargs = sample
    torch.library.opcheck(getattr(OPS, name).default, args, kwargs)


# ---- module --------------------------------------------------------------------------------------
def test_module_matches_the_op_and_keras_layouts():
    m = T.nn.DepthwiseConv2d(
        4, (3, 2), strides=2, padding="same", depth_multiplier=3, dilation_rate=1
    )
    assert m.depthwise_kernel.shape == (3, 2, 4, 3) and m.bias.shape == (12,)
    with torch.no_grad():
        m.bias.uniform_()
    x = torch.randn(2, 9, 8, 4)
    want = T.depthwise_conv2d_native(x, m.depthwise_kernel, [1, 2, 2, 1], "SAME") + m.bias
    assert torch.equal(m(x), want)
    mc = T.nn.DepthwiseConv2d(4, 3, data_format="channels_first", dilation_rate=2, use_bias=False)
    xc = torch.randn(2, 4, 9, 9)
    assert torch.equal(
        mc(xc),
        T.depthwise_conv2d_native(
            xc, mc.depthwise_kernel, [1, 1, 1, 1], "VALID", [], "NCHW", [1, 1, 2, 2]
        ),
    )
    limit = (6 / (3 * 3 * 4 + 3 * 3 * 1)) ** 0.5  # Keras' Glorot uniform bound
    assert mc.depthwise_kernel.abs().max() <= limit and mc.bias is None
    with pytest.raises(ValueError, match="padding"):
        T.nn.DepthwiseConv2d(4, 3, padding="full")


# ---- CUDA ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
def test_device_matches_reference(device, dtype):
    for i, case in enumerate(random_cases(40, seed=11, dtypes=(dtype,))):
        dev = Case(
            *(t.to(device) for t in (case.x, case.f, case.dy)),
            case.strides,
            case.dilations,
            case.padding,
            case.explicit,
            case.data_format,
        )
        got = ours(dev)
        want = reference(case)
        tol = {torch.float32: 1e-5, torch.float64: 1e-12, torch.float16: 4e-3}[dtype]
        for g, w in zip(got, want):
            assert g.device.type == device and rel_err(g, w) <= tol, (i, case.name)


def _wide_calls():
    """Float channels-last layers whose sliding-window tiles take 16-lane vectors (C % 16 == 0):
    every tile width (12 for 3 taps, 10 for 5, 8, 4, and the 4-column two-vector tiles of
    layers whose pixels alias in L1), source steps 1 and 2, 1-5 column taps, SAME / VALID /
    EXPLICIT padding, depth multiplier 2, channel tails after 64-channel chunks (C = 80, 1040),
    whole 4 KiB pixels (1024), a non-contiguous input, outputs large enough for non-temporal
    stores, and filter-gradient 3x3 runs of every length up to 16 at source steps 1 and 2,
    aliasing in L1 (256 / 512) or not. The filter gradients of 3-column filters on rows of up
    to 32 columns take whole-row passes on the AVX-512 path (filter_row_3x3): 1, 2 and 3 tap
    rows, edge tiles of 1 and 2 column taps (SAME, EXPLICIT), source steps 1 and 2; at step 2
    two channel vectors at a time (a 16-channel tail after the pairs at C = 80). At source
    step 1, and at step 2 where pixels do not alias in L1, those rows sum in the direct order on
    both paths (the 8-lane path reading packed blocks at 256 / 512 / 1024 channels, in place at
    16-64 and 1040)."""
    g = torch.Generator().manual_seed(7)
    layers = [  # N, H, W, C, kh, kw, stride, padding, multiplier
        (2, 13, 29, 16, 3, 3, 1, "SAME", 1),
        (2, 11, 31, 32, 5, 5, 1, "SAME", 1),
        (1, 9, 27, 48, 1, 5, 2, "VALID", 1),
        (2, 8, 19, 80, 2, 4, 1, "SAME", 1),
        (2, 7, 14, 256, 3, 3, 1, "SAME", 1),
        (1, 6, 9, 512, 3, 3, 1, "VALID", 1),
        (2, 10, 23, 16, 3, 3, 2, "EXPLICIT", 1),
        (2, 9, 17, 16, 3, 3, 1, "SAME", 2),
        (8, 56, 56, 64, 3, 3, 1, "SAME", 1),
        (4, 64, 64, 32, 5, 5, 1, "SAME", 1),
        (12, 14, 14, 512, 3, 3, 1, "SAME", 1),
        (2, 8, 28, 256, 3, 3, 2, "SAME", 1),
        (2, 6, 35, 32, 3, 3, 2, "VALID", 1),
        (2, 9, 26, 32, 5, 5, 1, "EXPLICIT", 1),
        (2, 5, 7, 1040, 3, 3, 1, "SAME", 1),
        (2, 5, 7, 1024, 3, 3, 1, "SAME", 1),
        (2, 6, 12, 48, 1, 3, 1, "SAME", 1),
        (2, 7, 10, 64, 2, 3, 2, "SAME", 1),
        (2, 8, 11, 32, 3, 3, 1, "EXPLICIT", 1),
        (2, 6, 12, 48, 2, 3, 1, "SAME", 1),
        (2, 9, 40, 80, 3, 3, 2, "SAME", 1),
        (2, 7, 14, 512, 3, 3, 2, "EXPLICIT", 1),
    ]
    calls = []
    for N, H, W, C, kh, kw, s, padding, M in layers:
        x = torch.randn(N, H, W, C, generator=g)
        if C == 80:
            x = torch.randn(N, H, W + 3, C, generator=g)[:, :, 1:-2]  # non-contiguous
        f = torch.randn(kh, kw, C, M, generator=g)
        st = [1, s, s, 1]
        pads = [0, 0, 1, 2, 2, 0, 0, 0] if padding == "EXPLICIT" else []
        y = T.depthwise_conv2d_native(x, f, st, padding, pads)
        dy = torch.randn(y.shape, generator=g)
        calls += [
            ("depthwise_conv2d_native", (x, f, st, padding, pads)),
            ("depthwise_conv2d_native_backprop_input", (list(x.shape), f, dy, st, padding, pads)),
            ("depthwise_conv2d_native_backprop_filter", (x, list(f.shape), dy, st, padding, pads)),
        ]
    return calls


@needs_avx512
def test_avx512_tiles_equal_avx2_tiles_bit_for_bit(tmp_path):
    """Where ATen runs at AVX512, float layers with C % 16 == 0 take 16-lane sliding-window
    tiles (the same FMAs per lane in the same order as the AVX2 tiles, which the parity tests
    check against TF); ATEN_CPU_CAPABILITY=avx2 selects the AVX2 tiles. Same bits."""
    calls = _wide_calls()
    avx2 = results_at_avx2(calls, tmp_path)
    for (name, args), theirs in zip(calls, avx2):
        ours = getattr(T, name)(*args)
        assert torch.equal(ours.view(torch.int32), theirs.view(torch.int32)), name
        exact = getattr(T, name)(*[a.double() if torch.is_tensor(a) else a for a in args])
        assert rel_err(ours, exact) < 1e-5, name
