"""fused_batch_norm_v3 / fused_batch_norm_grad_v3 against the float64 reference: layouts, dtypes,
strides, edge cases, autograd (gradcheck / gradgradcheck), opcheck and the nn module."""

import pytest
import torch
from torch.autograd import gradcheck, gradgradcheck

import fused_batch_norm_reference as ref
import torch_tfgrads as T
from helpers import DEVICES, rel_err
from test_fused_batch_norm_sync import sync_opcheck_samples

FORMATS_4D = ["NHWC", "NCHW"]
FORMATS_5D = ["NDHWC", "NCDHW"]
TOL = {torch.float64: 1e-12, torch.float32: 1e-5, torch.float16: 3e-3, torch.bfloat16: 2e-2}


def make_inputs(shape, data_format, dtype=torch.float32, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    cdim = 1 if data_format.startswith("NC") else len(shape) - 1
    C = shape[cdim]
    pdt = torch.float64 if dtype == torch.float64 else torch.float32
    x = (torch.randn(shape, generator=g, dtype=torch.float64) * 2 + 0.5).to(dtype).to(device)

    def p(lo, hi):
        return (torch.rand(C, generator=g, dtype=torch.float64) * (hi - lo) + lo).to(pdt).to(device)

    return x, p(0.5, 1.5), p(-1, 1), p(-1, 1), p(0.5, 2.0)


def check_forward(x, scale, offset, mean, var, eps, factor, fmt, training):
    out = T.fused_batch_norm_v3(x, scale, offset, mean, var, eps, factor, fmt, training)
    exp = ref.fused_batch_norm_v3(x, scale, offset, mean, var, eps, factor, fmt, training)
    tol = TOL[x.dtype]
    assert out[0].dtype == x.dtype and out[0].shape == x.shape
    assert rel_err(out[0], exp[0]) <= tol
    for o, e in zip(out[1:5], exp[1:]):
        assert o.dtype == scale.dtype
        assert rel_err(o, e) <= max(tol, 1e-5 if x.dtype != torch.float64 else tol)
    assert out[5].shape == () and out[5].item() == 0
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize(
    "fmt,shape",
    [
        ("NHWC", (3, 5, 6, 19)),
        ("NCHW", (3, 19, 5, 6)),
        ("NDHWC", (2, 3, 4, 5, 11)),
        ("NCDHW", (2, 11, 3, 4, 5)),
    ],
)
@pytest.mark.parametrize("training,factor", [(True, 1.0), (True, 0.3), (False, 1.0)])
def test_forward_and_grad_match_reference(device, dtype, fmt, shape, training, factor):
    x, scale, offset, mean, var = make_inputs(shape, fmt, dtype, device)
    out = check_forward(x, scale, offset, mean, var, 1e-3, factor, fmt, training)
    dy = torch.randn(shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    dy = dy.to(dtype).to(device)
    rs1, rs2 = (out[3], out[4]) if training else (mean, var)
    dx, dscale, doffset, rs4, rs5 = T.fused_batch_norm_grad_v3(
        dy, x, scale, rs1, rs2, out[5], 1e-3, fmt, training
    )
    edx, edscale, edoffset = ref.fused_batch_norm_grad_v3(
        dy, x, scale, rs1, rs2, 1e-3, fmt, training
    )
    tol = TOL[dtype]
    assert dx.dtype == dtype and rel_err(dx, edx) <= tol
    assert rel_err(dscale, edscale) <= max(tol, 1e-5 if dtype != torch.float64 else tol)
    assert rel_err(doffset, edoffset) <= max(tol, 1e-5 if dtype != torch.float64 else tol)
    assert rs4.shape == (0,) and rs5.shape == (0,)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("C", [1, 3, 8, 17, 24, 40, 64, 300])
def test_channel_counts_and_chunking(C, dtype):
    # Many rows (several chunks and L1 tiles per thread) and C not a multiple of the vector
    # width. The channels-last sums sweep blocks of up to 4 channel vectors (the gradient's only
    # up to 64 channels, row by row above): these C leave every narrower last block (1, 2, 3
    # vectors), a scalar tail, and C = 300 takes the gradient's row-by-row sums.
    for fmt, shape in (("NHWC", (4, 37, 29, C)), ("NCHW", (4, C, 37, 29))):
        x, scale, offset, mean, var = make_inputs(shape, fmt, dtype)
        for training in (True, False):
            out = check_forward(x, scale, offset, mean, var, 1e-4, 1.0, fmt, training)
            dy = torch.randn(shape, generator=torch.Generator().manual_seed(C)).to(dtype)
            rs1, rs2 = (out[3], out[4]) if training else (mean, var)
            got = T.fused_batch_norm_grad_v3(dy, x, scale, rs1, rs2, out[5], 1e-4, fmt, training)
            exp = ref.fused_batch_norm_grad_v3(dy, x, scale, rs1, rs2, 1e-4, fmt, training)
            tol = max(TOL[dtype], 1e-5)
            assert rel_err(got[0], exp[0]) <= tol, (fmt, training)
            # The channel sums cancel (C = 1: one sum of 4292 terms of either sign): their
            # error is bounded relative to the sum of the terms' magnitudes.
            cdim = 1 if fmt == "NCHW" else 3
            dims = [d for d in range(4) if d != cdim]
            view = [-1 if d == cdim else 1 for d in range(4)]
            xhat = (x.double() - rs1.double().view(view)) * (rs2.double().view(view) + 1e-4).rsqrt()
            mag = (dy.double().abs() * (1 + xhat.abs())).sum(dims)
            for o, e in zip(got[1:3], exp[1:]):
                assert ((o.double() - e).abs() <= tol * mag).all(), (fmt, training)


@pytest.mark.parametrize(
    "fmt,shape",
    [
        ("NCHW", (3, 5, 150, 130)),  # planes of 19500: parts of 16384 and 3116 elements
        ("NCDHW", (2, 3, 4, 70, 70)),  # planes of 19600 over 3 spatial dims
        ("NHWC", (2, 33, 45, 515)),  # 2970 rows in chunks of 31, the last of 25
    ],
)
def test_statistics_merge_parts_of_unequal_size(fmt, shape):
    # The statistics are per-part moments merged with Chan's formula, for all channels at once:
    # channels-first planes split into parts of unequal size, channels-last chunks with a short
    # last one. Checked against float64 statistics computed directly.
    g = torch.Generator().manual_seed(11)
    x = torch.randn(shape, generator=g) * 3 + 5
    cdim = 1 if fmt.startswith("NC") else x.dim() - 1
    C = shape[cdim]
    out = T.fused_batch_norm_v3(x, torch.ones(C), torch.zeros(C), epsilon=1e-3, data_format=fmt)
    dims = [d for d in range(x.dim()) if d != cdim]
    xd = x.double()
    assert rel_err(out[1].double(), xd.mean(dims)) < 1e-6  # batch_mean
    assert rel_err(out[2].double(), xd.var(dims, unbiased=True)) < 1e-5  # batch_variance
    assert rel_err(out[4].double(), xd.var(dims, unbiased=False)) < 1e-5  # reserve_space_2


def test_large_mean_no_cancellation():
    # E[x^2]-E[x]^2 in float32 would return garbage (even negative variance) here.
    x = 1e4 + torch.randn(8, 32, 32, 16, dtype=torch.float64)
    ones, zeros = torch.ones(16), torch.zeros(16)
    out = T.fused_batch_norm_v3(x.float(), ones, zeros, is_training=True)
    exp = ref.fused_batch_norm_v3(x.float(), ones, zeros, None, None, 1e-4, 1.0, "NHWC", True)
    assert rel_err(out[4], exp[4]) < 1e-3  # biased variance ~1, data rounded to float32 at 1e4
    assert (out[4] > 0.9).all()


@pytest.mark.parametrize("fmt", FORMATS_4D)
def test_strided_inputs_use_their_layout_without_copies(fmt):
    # NCHW data_format with a channels_last tensor, NHWC data_format with a permuted NCHW
    # buffer, and a plainly non-contiguous slice: all computed correctly; the outputs keep the
    # input's physical layout (and the fake kernel agrees, see opcheck below).
    base = torch.randn(4, 6, 7, 10)
    if fmt == "NCHW":
        views = [base.contiguous(memory_format=torch.channels_last), base[:, :, ::2]]
    else:
        views = [base.permute(0, 2, 3, 1), base.permute(0, 2, 3, 1)[:, ::2]]
    for x in views:
        C = x.shape[1] if fmt == "NCHW" else x.shape[-1]
        scale, offset = torch.rand(C) + 0.5, torch.randn(C)
        out = check_forward(x, scale, offset, torch.empty(0), torch.empty(0), 1e-4, 1.0, fmt, True)
        if (
            x.is_contiguous(memory_format=torch.channels_last)
            or x.permute(0, 3, 1, 2).is_contiguous()
        ):
            assert out[0].stride() == x.stride()
        dy = torch.randn(x.shape)  # contiguous: different strides from x
        got = T.fused_batch_norm_grad_v3(dy, x, scale, out[3], out[4], out[5], 1e-4, fmt, True)
        exp = ref.fused_batch_norm_grad_v3(dy, x, scale, out[3], out[4], 1e-4, fmt, True)
        for g, e in zip(got[:3], exp):
            assert rel_err(g, e) <= 1e-5


def test_single_element_per_channel():
    # n == 1: variance 0, Bessel factor 1 (no division by zero), y == offset.
    x = torch.tensor([[[[1.5, -2.0, 3.0]]]])
    offset = torch.tensor([0.25, 0.5, -1.0])
    y, bm, bv, rs1, rs2, _ = T.fused_batch_norm_v3(x, torch.ones(3), offset)
    assert torch.equal(bv, torch.zeros(3)) and torch.equal(rs2, torch.zeros(3))
    torch.testing.assert_close(y.reshape(-1), offset)
    torch.testing.assert_close(bm, x.reshape(-1))


def test_exponential_avg_factor_zero_keeps_running_stats():
    x = torch.tensor([[[[1.0], [3.0]]]])
    out = T.fused_batch_norm_v3(
        x,
        torch.ones(1),
        torch.zeros(1),
        torch.tensor([5.0]),
        torch.tensor([7.0]),
        exponential_avg_factor=0.0,
    )
    assert out[1].item() == 5.0 and out[2].item() == 7.0
    assert out[3].item() == 2.0 and out[4].item() == 1.0  # batch mean / biased variance


@pytest.mark.parametrize("training", [True, False])
def test_empty_batch(training):
    x = torch.empty(0, 4, 4, 3)
    mean, var = torch.tensor([1.0, 2.0, 3.0]), torch.tensor([4.0, 5.0, 6.0])
    y, bm, bv, rs1, rs2, rs3 = T.fused_batch_norm_v3(
        x, torch.ones(3), torch.zeros(3), mean, var, is_training=training
    )
    assert y.shape == x.shape
    assert torch.isnan(bm).all() and torch.isnan(bv).all()  # TF: NaN statistics
    if training:
        assert torch.isnan(rs1).all() and torch.isnan(rs2).all()
    else:  # defined (TF's Eigen kernel returns uninitialised memory here)
        assert torch.equal(rs1, mean) and torch.equal(rs2, var)
    dx, ds, do, _, _ = T.fused_batch_norm_grad_v3(
        torch.empty(0, 4, 4, 3), x, torch.ones(3), mean, var, rs3, is_training=training
    )
    assert (
        dx.shape == x.shape and torch.equal(ds, torch.zeros(3)) and torch.equal(do, torch.zeros(3))
    )


def test_zero_channels():
    x = torch.zeros(1, 2, 2, 0)
    outs = T.fused_batch_norm_v3(x, torch.zeros(0), torch.zeros(0))
    assert [tuple(o.shape) for o in outs] == [(1, 2, 2, 0), (0,), (0,), (0,), (0,), ()]


def test_inference_reserve_spaces_are_defined_copies():
    x, scale, offset, mean, var = make_inputs((2, 3, 3, 5), "NHWC")
    _, bm, bv, rs1, rs2, _ = T.fused_batch_norm_v3(x, scale, offset, mean, var, is_training=False)
    for o, e in ((bm, mean), (bv, var), (rs1, mean), (rs2, var)):
        assert torch.equal(o, e) and o.data_ptr() != e.data_ptr()


# ---- autograd ----------------------------------------------------------------------------------
GRAD_CASES = [
    ("NHWC", (2, 3, 4, 3), True),
    ("NCHW", (2, 3, 4, 3), True),
    ("NHWC", (2, 3, 2, 3), False),
    ("NCHW", (3, 2, 2, 3), False),
    ("NCDHW", (2, 2, 2, 3, 2), True),
    ("NDHWC", (2, 2, 2, 3, 2), False),
]


@pytest.mark.parametrize("fmt,shape,training", GRAD_CASES)
def test_gradcheck_and_gradgradcheck(fmt, shape, training):
    x, scale, offset, mean, var = make_inputs(shape, fmt, torch.float64)
    x.requires_grad_()
    scale.requires_grad_()
    offset.requires_grad_()

    def f(x, scale, offset):
        return T.fused_batch_norm_v3(x, scale, offset, mean, var, 1e-3, 1.0, fmt, training)[0]

    assert gradcheck(f, (x, scale, offset))
    assert gradgradcheck(f, (x, scale, offset))


@pytest.mark.parametrize("fmt,shape,training", GRAD_CASES[:2] + GRAD_CASES[3:4])
def test_grad_op_gradcheck(fmt, shape, training):
    # The grad op on its own. In training its x-derivative is TF's (mean/variance recomputed
    # from x), so the reserve spaces must be the true batch moments and only y_backprop and
    # scale are checked; in inference every input is checked.
    x, scale, _, mean, var = make_inputs(shape, fmt, torch.float64)
    if training:
        _, _, _, mean, var, _ = T.fused_batch_norm_v3(x, scale, scale, mean, var, 1e-3, 1.0, fmt)
    dy = torch.randn(shape, dtype=torch.float64, requires_grad=True)
    scale.requires_grad_()
    xs = x.requires_grad_(not training)

    def f(dy, x, scale):
        return T.fused_batch_norm_grad_v3(dy, x, scale, mean, var, None, 1e-3, fmt, training)[:3]

    assert gradcheck(f, (dy, xs, scale))
    assert gradgradcheck(f, (dy, xs, scale))


def test_statistics_outputs_are_not_differentiable():
    x = torch.randn(2, 3, 3, 4, requires_grad=True)
    y, bm, bv, rs1, rs2, rs3 = T.fused_batch_norm_v3(x, torch.ones(4), torch.zeros(4))
    assert y.requires_grad
    assert not any(t.requires_grad for t in (bm, bv, rs1, rs2, rs3))


def test_half_double_backward_matches_float32():
    x, scale, offset, mean, var = make_inputs((2, 4, 4, 8), "NHWC")
    w = torch.randn(x.shape)
    results = []
    for dtype in (torch.float32, torch.float16):
        xi = x.to(dtype).float().to(dtype).requires_grad_()
        s = scale.clone().requires_grad_()
        y = T.fused_batch_norm_v3(xi, s, offset, mean, var)[0]
        (gx,) = torch.autograd.grad((y.float() * w).sum(), xi, create_graph=True)
        gg = torch.autograd.grad((gx.float() * w).sum() + gx.float().pow(2).sum(), [xi, s])
        results.append([g.float() for g in gg])
    for a, b in zip(*results):
        assert rel_err(b, a) < 2e-2


# ---- opcheck -------------------------------------------------------------------------------------
def _bn_inputs():
    for fmt, shape, training, factor in [
        ("NHWC", (2, 3, 4, 5), True, 1.0),
        ("NCHW", (2, 5, 3, 4), True, 0.5),
        ("NHWC", (2, 3, 4, 5), False, 1.0),
        ("NDHWC", (1, 2, 3, 2, 4), True, 1.0),
        ("NCHW", (2, 5, 3, 4), False, 1.0),
    ]:
        x, scale, offset, mean, var = make_inputs(shape, fmt)
        yield x, scale, offset, mean, var, 1e-3, factor, fmt, training
    x, scale, offset, mean, var = make_inputs((2, 5, 3, 4), "NCHW")
    yield (
        x.contiguous(memory_format=torch.channels_last),
        scale,
        offset,
        mean,
        var,
        1e-3,
        1.0,
        "NCHW",
        True,
    )
    yield x[:, :, ::2], scale, offset, mean, var, 1e-3, 1.0, "NCHW", True


def opcheck_samples():
    """(op name, args, kwargs) for test_opcheck (and tests/test_registry.py)."""
    for requires_grad in (False, True):
        for x, scale, offset, mean, var, eps, factor, fmt, training in _bn_inputs():
            x, scale, offset = (
                t.detach().requires_grad_(requires_grad) for t in (x, scale, offset)
            )
            yield (
                "fused_batch_norm_v3",
                (x, scale, offset, mean, var, eps, factor, fmt, training),
                {},
            )
            out = T.fused_batch_norm_v3(
                x.detach(), scale.detach(), offset.detach(), mean, var, eps, factor, fmt, training
            )
            rs1, rs2 = (out[3], out[4]) if training else (mean, var)
            dy = torch.randn(x.shape).requires_grad_(requires_grad)
            xs = x.detach().requires_grad_(requires_grad and not training)
            yield (
                "fused_batch_norm_grad_v3",
                (dy, xs, scale, rs1, rs2, out[5], eps, fmt, training),
                {},
            )
    yield from sync_opcheck_samples()


@pytest.mark.parametrize("sample", list(opcheck_samples()), ids=lambda s: s[0])
def test_opcheck(sample):
    name, args, kwargs = sample
    torch.library.opcheck(getattr(torch.ops.tfgrads, name).default, args, kwargs)


# ---- module ----------------------------------------------------------------------------------------
def test_module_keras_running_average():
    m = T.nn.FusedBatchNorm(4)
    assert (m.momentum, m.epsilon) == (0.99, 1e-3)
    x = torch.randn(8, 5, 5, 4) * 3 + 2
    m.train()
    y = m(x)
    exp = ref.fused_batch_norm_v3(
        x, torch.ones(4), torch.zeros(4), torch.zeros(4), torch.ones(4), 1e-3, 0.01, "NHWC", True
    )
    assert rel_err(y, exp[0]) <= 1e-5
    assert rel_err(m.running_mean, exp[1]) <= 1e-5 and rel_err(m.running_var, exp[2]) <= 1e-5
    m.eval()
    y2 = m(x)
    exp2 = ref.fused_batch_norm_v3(
        x, torch.ones(4), torch.zeros(4), m.running_mean, m.running_var, 1e-3, 1.0, "NHWC", False
    )
    assert rel_err(y2, exp2[0]) <= 1e-5


def test_module_nchw_half_and_no_affine():
    m = T.nn.FusedBatchNorm(3, data_format="NCHW", center=False, scale=False)
    assert m.weight is None and m.bias is None
    y = m(torch.randn(2, 3, 4, 4).half())
    assert y.dtype == torch.float16 and m.running_mean.dtype == torch.float32
    with pytest.raises(ValueError, match="data_format"):
        T.nn.FusedBatchNorm(3, data_format="HWCN")


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("fmt,shape", [("NHWC", (6, 64, 64, 96)), ("NCHW", (6, 96, 64, 64))])
def test_large_float_forward_streams_same_values(fmt, shape, training):
    """A float32 y beyond 8 MiB is written with non-temporal stores; it must agree with the
    float64 computation like any other, in training and in inference."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(shape, generator=g) * 2 + 1
    c = shape[-1] if fmt == "NHWC" else shape[1]
    scale, offset = torch.rand(c, generator=g) + 0.5, torch.randn(c, generator=g)
    mean, var = torch.randn(c, generator=g), torch.rand(c, generator=g) + 0.5
    args = (1e-3, 1.0, fmt, training)
    out = T.fused_batch_norm_v3(x, scale, offset, mean, var, *args)
    ref64 = T.fused_batch_norm_v3(
        x.double(), scale.double(), offset.double(), mean.double(), var.double(), *args
    )
    assert out[0].numel() * 4 > 8 << 20
    for a, b in zip(out[:3], ref64[:3]):
        assert rel_err(a.double(), b) < 1e-5


@pytest.mark.parametrize("fmt,shape", [("NHWC", (6, 64, 64, 96)), ("NCHW", (6, 96, 64, 64))])
def test_large_float_grad_streams_same_values(fmt, shape):
    """A float32 training gradient beyond 8 MiB is written with non-temporal stores; it must
    agree with the float64 computation like any other."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(shape, generator=g) * 2 + 1
    dy = torch.randn(shape, generator=g)
    c = shape[-1] if fmt == "NHWC" else shape[1]
    scale = torch.rand(c, generator=g) + 0.5
    dims = (0, 1, 2) if fmt == "NHWC" else (0, 2, 3)
    mean, var = x.mean(dims), x.var(dims, unbiased=False)
    args = (torch.empty(0), 1e-3, fmt, True)
    out = T.fused_batch_norm_grad_v3(dy, x, scale, mean, var, *args)
    ref64 = T.fused_batch_norm_grad_v3(
        dy.double(), x.double(), scale.double(), mean.double(), var.double(), *args
    )
    assert out[0].numel() * 4 > 8 << 20
    for a, b in zip(out[:3], ref64[:3]):
        assert rel_err(a.double(), b) < 1e-5
