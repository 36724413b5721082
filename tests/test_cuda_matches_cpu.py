"""Every op's CUDA result against its CPU result (which the TF parity tests check), on shapes that
reach the CUDA kernels' multi-block paths: batch norm with up to 1024 partial sums per channel,
odd channel counts, every layout, half types and second order; depthwise convolution with many
filter-gradient chunks and large C*M; fractional pooling bit for bit in every dtype; CudnnRNN
with dropout (the same mask on both devices), inference, lengths, projection, half types.

The device compared is ``TFGRADS_MATCH_DEVICE`` (default ``cuda``: skipped without a GPU, or
failed with ``TFGRADS_REQUIRE_CUDA=1``, as ``make gpu-test`` sets). ``TFGRADS_MATCH_DEVICE=cpu``
runs the same comparisons CPU against CPU, which checks the harness itself without a GPU.
Tolerances (normwise relative error, ``helpers.rel_err``) are the ones docs/development.md states.
"""

import os

import pytest
import torch

import torch_tfgrads as T
from helpers import CUDA_DEVICES, rel_err

DEVICE = os.environ.get("TFGRADS_MATCH_DEVICE", "cuda")
pytestmark = CUDA_DEVICES[0].marks if DEVICE == "cuda" else []

# Normwise relative tolerance per dtype of the compared outputs (float64 references the same
# formulas with other summation orders; half types round the stored result).
TOL = {torch.float64: 1e-12, torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def _on(t):
    return t.to(DEVICE) if isinstance(t, torch.Tensor) else t


def _close(got, want, dtype, what):
    got = got.detach().cpu()
    assert got.dtype == want.dtype and got.shape == want.shape, (what, got.shape, want.shape)
    got, want = got.double(), want.detach().double()
    nan = want.isnan()  # e.g. the batch statistics of an empty batch: NaN on both devices
    assert torch.equal(got.isnan(), nan), f"{what}: NaNs differ"
    if want.numel() == 0 or bool(nan.all()):
        return
    err = rel_err(got[~nan], want[~nan])
    assert err <= TOL[dtype], f"{what}: error {err:.2e} > {TOL[dtype]:.0e}"


# ---- FusedBatchNorm --------------------------------------------------------------------------
BN_CASES = [
    # shape, data_format, channels_last memory
    ((64, 64, 64, 3), "NHWC", False),  # 262144 rows per channel: the 1024-partials cap
    ((8, 65, 33, 17), "NCHW", False),
    ((8, 65, 33, 17), "NCHW", True),
    ((16, 9, 9, 300), "NHWC", False),
    ((2, 5, 6, 7, 65), "NDHWC", False),
    ((2, 65, 5, 6, 7), "NCDHW", False),
    ((0, 4, 4, 5), "NHWC", False),  # empty batch
]


def _bn_inputs(shape, data_format, cl, dtype, gen):
    x = (torch.randn(shape, generator=gen) * 2 + 0.5).to(dtype)
    if cl:
        x = x.contiguous(memory_format=torch.channels_last)
    C = shape[1] if data_format.startswith("NC") else shape[-1]
    pdt = torch.float64 if dtype == torch.float64 else torch.float32
    scale = torch.rand(C, generator=gen, dtype=pdt) + 0.5
    offset = torch.randn(C, generator=gen, dtype=pdt)
    mean = torch.randn(C, generator=gen, dtype=pdt)
    var = torch.rand(C, generator=gen, dtype=pdt) + 0.5
    return x, scale, offset, mean, var


@pytest.mark.parametrize("shape,data_format,cl", BN_CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("is_training", [True, False])
def test_fused_batch_norm(shape, data_format, cl, dtype, is_training):
    gen = torch.Generator().manual_seed(hash((shape, data_format)) % 2**31)
    args = _bn_inputs(shape, data_format, cl, dtype, gen)
    x = args[0].clone().requires_grad_()
    xd = _on(args[0]).clone().requires_grad_()
    kw = dict(
        epsilon=1e-3, exponential_avg_factor=0.3, data_format=data_format, is_training=is_training
    )
    want = T.fused_batch_norm_v3(x, *args[1:], **kw)
    got = T.fused_batch_norm_v3(xd, *map(_on, args[1:]), **kw)
    for i in range(3):
        _close(got[i], want[i], dtype if i == 0 else args[1].dtype, f"output {i}")
    dy = torch.randn(shape, generator=gen).to(dtype)
    (gx,) = torch.autograd.grad(want[0], x, dy)
    (gxd,) = torch.autograd.grad(got[0], xd, _on(dy))
    _close(gxd, gx, dtype, "dx")


@pytest.mark.parametrize(
    "shape,data_format", [((32, 40, 40, 65), "NHWC"), ((4, 3, 50, 70), "NCHW")]
)
def test_fused_batch_norm_second_order_and_sync_ops(shape, data_format):
    gen = torch.Generator().manual_seed(5)
    x, scale, offset, mean, var = _bn_inputs(shape, data_format, False, torch.float64, gen)
    dy = torch.randn(shape, generator=gen, dtype=torch.float64)

    def second(dev):
        xs = (x.to(dev) if dev != "cpu" else x).clone().requires_grad_()
        sc = scale.to(dev).clone().requires_grad_()
        y = T.fused_batch_norm_v3(xs, sc, offset.to(dev), data_format=data_format)[0]
        gx, gs = torch.autograd.grad(y, (xs, sc), dy.to(dev), create_graph=True)
        return torch.autograd.grad((gx * gx).sum() + (gs * gs).sum(), (xs, sc))

    for a, b in zip(second(DEVICE), second("cpu")):
        _close(a, b, torch.float64, "second order")
    stats = T.fused_batch_norm_sync_stats(x, data_format)
    _close(T.fused_batch_norm_sync_stats(_on(x), data_format), stats, torch.float64, "sync stats")
    m = mean
    sums = T.fused_batch_norm_sync_grad_sums(dy, x, m, data_format)
    _close(
        T.fused_batch_norm_sync_grad_sums(_on(dy), _on(x), _on(m), data_format),
        sums,
        torch.float64,
        "sync grad sums",
    )
    count = stats[-1:].clone()
    want = T.fused_batch_norm_sync_backprop_input(
        dy, x, scale, m, var, sums, count, 1e-3, data_format
    )
    got = T.fused_batch_norm_sync_backprop_input(
        *map(_on, (dy, x, scale, m, var, sums, count)), 1e-3, data_format
    )
    _close(got, want, torch.float64, "sync backprop input")


# ---- DepthwiseConv2dNative -------------------------------------------------------------------
DW_CASES = [
    # input NHWC, filter [kh, kw, C, M], strides, padding, dilations, data_format
    ((4, 56, 56, 64), (3, 3, 64, 1), 1, "SAME", 1, "NHWC"),
    ((2, 28, 28, 512), (3, 3, 512, 2), 2, "SAME", 1, "NHWC"),  # large C*M
    ((16, 64, 64, 8), (7, 7, 8, 1), 1, "VALID", 2, "NHWC"),  # many filter-gradient chunks
    ((3, 17, 33, 31), (5, 3, 17, 3), (2, 1), "SAME", 1, "NCHW"),
    ((8, 112, 112, 32), (3, 3, 32, 1), 2, "SAME", 1, "NHWC"),
]


def _pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


@pytest.mark.parametrize("ishape,fshape,strides,padding,dil,data_format", DW_CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_depthwise_conv2d(ishape, fshape, strides, padding, dil, data_format, dtype):
    gen = torch.Generator().manual_seed(sum(ishape))
    x = torch.randn(ishape, generator=gen).to(dtype)
    f = (torch.randn(fshape, generator=gen) / fshape[0]).to(dtype)
    sh, sw = _pair(strides)
    dh, dw = _pair(dil)
    nc = data_format == "NCHW"
    s4 = [1, 1, sh, sw] if nc else [1, sh, sw, 1]
    d4 = [1, 1, dh, dw] if nc else [1, dh, dw, 1]
    kw = dict(strides=s4, padding=padding, data_format=data_format, dilations=d4)
    want = T.depthwise_conv2d_native(x, f, **kw)
    got = T.depthwise_conv2d_native(_on(x), _on(f), **kw)
    _close(got, want, dtype, "forward")
    dy = torch.randn(want.shape, generator=gen).to(dtype)
    bi = T.depthwise_conv2d_native_backprop_input(list(ishape), f, dy, **kw)
    _close(
        T.depthwise_conv2d_native_backprop_input(list(ishape), _on(f), _on(dy), **kw),
        bi,
        dtype,
        "backprop input",
    )
    bf = T.depthwise_conv2d_native_backprop_filter(x, list(fshape), dy, **kw)
    # the filter gradient sums N*H*W products: its tolerance scales with that depth
    got_bf = T.depthwise_conv2d_native_backprop_filter(_on(x), list(fshape), _on(dy), **kw)
    _close(got_bf, bf, dtype, "backprop filter")


# ---- FractionalPool: bit for bit --------------------------------------------------------------
@pytest.mark.parametrize("op", ["max", "avg"])
@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64]
)
@pytest.mark.parametrize("overlapping", [False, True])
def test_fractional_pool_bit_for_bit(op, dtype, overlapping):
    if op == "avg" and dtype in (torch.float16, torch.bfloat16):
        pytest.skip("TF's FractionalAvgPool has no half kernels")
    gen = torch.Generator().manual_seed(3)
    shape = (5, 67, 45, 33)
    x = (torch.randn(shape, generator=gen) * 50).to(dtype)
    pool = T.fractional_max_pool if op == "max" else T.fractional_avg_pool
    kw = dict(
        pooling_ratio=[1, 1.44, 1.73, 1],
        pseudo_random=True,
        overlapping=overlapping,
        deterministic=True,
        seed=7,
        seed2=11,
    )
    want = pool(x, **kw)
    got = pool(_on(x), **kw)
    for a, b in zip(got, want):
        assert torch.equal(a.cpu(), b)
    if not dtype.is_floating_point:
        return
    dy = torch.randn(want[0].shape, generator=gen).to(dtype)
    if op == "max":
        gi = T.fractional_max_pool_grad(x, want[0], dy, want[1], want[2], overlapping)
        gd = T.fractional_max_pool_grad(_on(x), got[0], _on(dy), want[1], want[2], overlapping)
    else:
        gi = T.fractional_avg_pool_grad(list(shape), dy, want[1], want[2], overlapping)
        gd = T.fractional_avg_pool_grad(list(shape), _on(dy), want[1], want[2], overlapping)
    if op == "avg" or dtype in (torch.float32, torch.float64):
        assert torch.equal(gd.cpu(), gi)
    else:  # half types: the CUDA kernel accumulates colliding gradients in another order
        _close(gd, gi, dtype, "max pool grad")


def test_fractional_pool_double_backward():
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(2, 20, 20, 3, generator=gen, dtype=torch.float64)

    def grads(dev):
        xs = x.to(dev).requires_grad_()
        y = T.fractional_max_pool(xs, [1, 1.5, 1.5, 1], True, True, True, 1, 2)[0]
        (g,) = torch.autograd.grad(y.square().sum(), xs, create_graph=True)
        return torch.autograd.grad(g.square().sum(), xs)[0]

    assert torch.equal(grads(DEVICE).cpu(), grads("cpu"))


# ---- CudnnRNN ---------------------------------------------------------------------------------
RNN_CASES = [
    # mode, direction, layers, T, B, I, U, proj, dropout, lengths
    ("lstm", "unidirectional", 2, 30, 16, 24, 48, 0, 0.0, False),
    ("lstm", "bidirectional", 2, 20, 8, 16, 32, 0, 0.4, True),  # dropout: the same mask
    ("lstm", "unidirectional", 1, 12, 4, 8, 32, 12, 0.0, True),  # projection
    ("gru", "bidirectional", 3, 15, 8, 10, 20, 0, 0.25, False),
    ("rnn_tanh", "unidirectional", 1, 25, 8, 6, 16, 0, 0.0, True),
    ("rnn_relu", "bidirectional", 2, 10, 3, 5, 7, 0, 0.0, False),
]


@pytest.mark.parametrize(
    "mode,direction,layers,steps,batch,isz,units,proj,dropout,lengths", RNN_CASES
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("is_training", [True, False])
def test_cudnn_rnn(
    mode, direction, layers, steps, batch, isz, units, proj, dropout, lengths, dtype, is_training
):
    # TF32 would change float32 matmuls on an Ampere+ GPU: the comparison pins it off
    torch.backends.cuda.matmul.allow_tf32 = False
    gen = torch.Generator().manual_seed(steps * units)
    D = 2 if direction == "bidirectional" else 1
    n = T.cudnn_rnn_params_size(layers, units, isz, mode, direction=direction, num_proj=proj)
    params = (torch.randn(n, generator=gen) * 0.2).to(dtype)
    x = torch.randn(steps, batch, isz, generator=gen).to(dtype)
    hh = proj or units
    h0 = (torch.randn(layers * D, batch, hh, generator=gen) * 0.1).to(dtype)
    c0 = (torch.randn(layers * D, batch, units, generator=gen) * 0.1).to(dtype)
    seq = None
    if lengths:
        seq = torch.randint(1, steps + 1, (batch,), generator=gen, dtype=torch.int32)
    kw = dict(
        rnn_mode=mode,
        direction=direction,
        dropout=dropout,
        seed=3,
        seed2=9,
        num_proj=proj,
        is_training=is_training,
    )
    inputs = [t.clone().requires_grad_(is_training) for t in (x, h0, c0, params)]
    want = T.cudnn_rnn_v3(*inputs[:3], inputs[3], seq, **kw)
    dinputs = [_on(t).clone().requires_grad_(is_training) for t in (x, h0, c0, params)]
    got = T.cudnn_rnn_v3(*dinputs[:3], dinputs[3], seq, **kw)
    tol_dtype = dtype
    for i, name in ((0, "output"), (1, "output_h")) + (
        ((2, "output_c"),) if mode == "lstm" else ()
    ):
        _close(got[i], want[i], tol_dtype, name)
    if not is_training:
        return
    dy = torch.randn(want[0].shape, generator=gen).to(dtype)
    gw = torch.autograd.grad(want[0], inputs, dy, allow_unused=True)
    gd = torch.autograd.grad(got[0], dinputs, _on(dy), allow_unused=True)
    for name, a, b in zip(("dx", "dh", "dc", "dparams"), gd, gw):
        if b is not None:
            _close(a, b, tol_dtype, name)
