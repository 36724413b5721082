"""Synchronized batch norm on one process: the three local ops against float64 references (and
bit for bit against fused_batch_norm_grad_v3, whose reductions they share), the functional and
the module (gradcheck, the refused double backward, compile/export), convert_sync_batchnorm.
Several processes: tests/test_sync_batch_norm_ddp.py; TensorFlow: test_sync_batch_norm_tf.py."""

import pytest
import torch
from torch.autograd import gradcheck, gradgradcheck

import torch_tfgrads as T
from helpers import CUDA_DEVICES, DEVICES, rel_err
from torch_tfgrads.distributed import keras_moments, sync_fused_batch_norm
from torch_tfgrads.nn import FusedBatchNorm, SyncFusedBatchNorm, convert_sync_batchnorm

TOL = {torch.float64: 1e-12, torch.float32: 2e-6, torch.float16: 2e-6, torch.bfloat16: 2e-6}
# (shape, data_format, how the memory is laid out)
LAYOUTS = [
    ((4, 5, 6, 3), "NHWC", "contiguous"),
    ((4, 3, 5, 6), "NCHW", "contiguous"),
    ((4, 3, 5, 6), "NCHW", "channels_last"),
    ((2, 3, 4, 5, 7), "NDHWC", "contiguous"),
    ((2, 7, 3, 4, 5), "NCDHW", "contiguous"),
    ((4, 5, 6, 3), "NHWC", "strided"),
    ((64, 9, 9, 130), "NHWC", "contiguous"),  # several chunks, > 64 channels
    ((3, 65, 40, 41), "NCHW", "contiguous"),
]


def _make(shape, fmt, how, dtype=torch.float32, device="cpu", seed=0, offset=0.5):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g, dtype=torch.float64) * 2 + offset
    if how == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    elif how == "strided":
        x = torch.randn((shape[0], shape[1] * 2, *shape[2:]), generator=g, dtype=torch.float64)
        x = x[:, ::2]
    return x.to(dtype).to(device)


def _cdim(x, fmt):
    return 1 if fmt.startswith("NC") else x.dim() - 1


def _axes(x, fmt):
    return [d for d in range(x.dim()) if d != _cdim(x, fmt)]


def _bcast(v, x, fmt):
    shape = [1] * x.dim()
    shape[_cdim(x, fmt)] = -1
    return v.reshape(shape)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape,fmt,how", LAYOUTS, ids=lambda v: str(v))
def test_stats_match_float64_sums(device, dtype, shape, fmt, how):
    x = _make(shape, fmt, how, dtype, device)
    out = T.fused_batch_norm_sync_stats(x, fmt)
    pdt = torch.float64 if dtype == torch.float64 else torch.float32
    xd = x.double().cpu()
    C = x.shape[_cdim(x, fmt)]
    assert out.dtype == pdt and out.shape == (2 * C + 1,) and out.device == x.device
    axes = _axes(x, fmt)
    assert rel_err(out[:C], xd.sum(axes)) <= TOL[dtype]
    assert rel_err(out[C : 2 * C], (xd * xd).sum(axes)) <= TOL[dtype]
    assert out[2 * C].item() == x.numel() // C


@pytest.mark.parametrize("shape,fmt,how", LAYOUTS, ids=lambda v: str(v))
def test_sums_are_the_batch_norm_gradient_reductions_bit_for_bit(shape, fmt, how):
    """The sync ops reduce in fused_batch_norm_grad_v3's order: the same numbers, not close ones."""
    x = _make(shape, fmt, how)
    dy = _make(shape, fmt, how, seed=1)
    C = x.shape[_cdim(x, fmt)]
    mean, one = torch.randn(C), torch.ones(C)
    # variance 1 and epsilon 0: the gradient's scale_backprop is its raw sum times exactly 1
    _, gscale, goffset, _, _ = T.fused_batch_norm_grad_v3(
        dy, x, one, mean, one, epsilon=0.0, data_format=fmt, is_training=False
    )
    sums = T.fused_batch_norm_sync_grad_sums(dy, x, mean, fmt)
    assert torch.equal(sums[:C], goffset) and torch.equal(sums[C:], gscale)
    stats = T.fused_batch_norm_sync_stats(x, fmt)
    _, gsq, gsum, _, _ = T.fused_batch_norm_grad_v3(
        x, x, one, torch.zeros(C), one, epsilon=0.0, data_format=fmt, is_training=False
    )
    assert torch.equal(stats[:C], gsum) and torch.equal(stats[C : 2 * C], gsq)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("shape,fmt,how", LAYOUTS[:6], ids=lambda v: str(v))
def test_grad_sums_and_backprop_input_match_float64(device, dtype, shape, fmt, how):
    x = _make(shape, fmt, how, dtype, device)
    dy = _make(shape, fmt, how, dtype, device, seed=1)
    C = x.shape[_cdim(x, fmt)]
    pdt = torch.float64 if dtype == torch.float64 else torch.float32
    g = torch.Generator().manual_seed(2)
    mean = torch.randn(C, generator=g, dtype=pdt).to(device)
    var = (torch.rand(C, generator=g, dtype=pdt) + 0.5).to(device)
    scale = (torch.rand(C, generator=g, dtype=pdt) + 0.5).to(device)
    sums = T.fused_batch_norm_sync_grad_sums(dy, x, mean, fmt)
    xd, dyd, axes = x.double().cpu(), dy.double().cpu(), _axes(x, fmt)
    md, vd, sd = mean.double().cpu(), var.double().cpu(), scale.double().cpu()
    xc = xd - _bcast(md, xd, fmt)
    tol = 1e-12 if dtype == torch.float64 else 2e-5
    assert rel_err(sums[:C], dyd.sum(axes)) <= tol
    assert rel_err(sums[C:], (dyd * xc).sum(axes)) <= tol
    # global sums from "other processes": anything consistent works for the formula
    gsums = sums * 3 + 1
    count = torch.tensor([x.numel() // C * 3 + 5.0], dtype=pdt, device=device)
    eps = 1e-3
    dx = T.fused_batch_norm_sync_backprop_input(dy, x, scale, mean, var, gsums, count, eps, fmt)
    assert (
        dx.dtype == x.dtype
        and dx.shape == x.shape
        and dx.stride() == x.stride()
        or how in ("strided",)
    )
    n, gd = count.double().cpu(), gsums.double().cpu()
    r = 1.0 / torch.sqrt(vd + eps)
    expect = _bcast(sd * r, xd, fmt) * (
        (dyd - _bcast(gd[:C] / n, xd, fmt)) - xc * _bcast(r * r * gd[C:] / n, xd, fmt)
    )
    assert rel_err(dx, expect) <= {torch.float64: 1e-12, torch.float32: 1e-5}.get(dtype, 2e-2)


def test_backprop_input_with_local_sums_is_the_batch_norm_gradient_bit_for_bit():
    x, dy = _make((8, 5, 5, 70), "NHWC", "contiguous"), _make((8, 5, 5, 70), "NHWC", "", seed=3)
    scale, offset = torch.rand(70) + 0.5, torch.randn(70)
    _, _, _, rs1, rs2, rs3 = T.fused_batch_norm_v3(x, scale, offset, epsilon=1e-3)
    dx_ref = T.fused_batch_norm_grad_v3(dy, x, scale, rs1, rs2, rs3, epsilon=1e-3)[0]
    sums = T.fused_batch_norm_sync_grad_sums(dy, x, rs1)
    count = T.fused_batch_norm_sync_stats(x)[-1:]
    dx = T.fused_batch_norm_sync_backprop_input(dy, x, scale, rs1, rs2, sums, count, 1e-3)
    assert torch.equal(dx, dx_ref)


@pytest.mark.parametrize("device", DEVICES)
def test_empty_batch_counts_zero_and_takes_part(device):
    x = torch.empty(0, 4, 4, 3, device=device)
    stats = T.fused_batch_norm_sync_stats(x)
    assert stats.tolist() == [0.0] * 7
    assert T.fused_batch_norm_sync_stats(torch.empty(2, 3, 0, 5, device=device))[-1].item() == 0
    sums = T.fused_batch_norm_sync_grad_sums(x, x, torch.zeros(3, device=device))
    assert sums.tolist() == [0.0] * 6
    dx = T.fused_batch_norm_sync_backprop_input(
        x, x, *(torch.ones(3, device=device),) * 3, sums, torch.zeros(1, device=device)
    )
    assert dx.shape == x.shape
    # the global count may be 0 too (every process empty): divide_no_nan, no NaN anywhere
    y, mean, var = sync_fused_batch_norm(
        x, torch.ones(3, device=device), torch.zeros(3, device=device)
    )
    assert y.shape == x.shape and mean.tolist() == [0.0] * 3 and var.tolist() == [0.0] * 3


def _keras_reference(x, scale, offset, eps, fmt):
    """Keras's synchronized moments and tf.nn.batch_normalization, in float64."""
    xd, axes = x.double(), _axes(x, fmt)
    n = x.numel() // x.shape[_cdim(x, fmt)]
    mean = xd.sum(axes) / n
    var = (xd * xd).sum(axes) / n - mean * mean
    var = var.clamp_min(0)
    inv = scale.double() / torch.sqrt(var + eps)
    y = xd * _bcast(inv, xd, fmt) + _bcast(offset.double() - mean * inv, xd, fmt)
    return y, mean, var


@pytest.mark.parametrize("fmt", ["NHWC", "NCHW", "NCDHW"])
def test_functional_on_one_process_is_keras_formula(fmt):
    shape = (6, 4, 5, 3) if fmt == "NHWC" else (6, 3, 4, 5) if fmt == "NCHW" else (2, 3, 2, 4, 5)
    x = _make(shape, fmt, "contiguous", offset=3.0)
    C = x.shape[_cdim(x, fmt)]
    scale, offset = torch.rand(C) + 0.5, torch.randn(C)
    y, mean, var = sync_fused_batch_norm(x, scale, offset, 1e-3, fmt)
    ey, em, ev = _keras_reference(x, scale, offset, 1e-3, fmt)
    assert rel_err(y, ey) <= 1e-5 and rel_err(mean, em) <= 1e-6 and rel_err(var, ev) <= 1e-4
    assert not mean.requires_grad and not var.requires_grad


def test_keras_moments_clamp_and_empty():
    total = torch.tensor([2.0, 0.0, 1.0, -1e-7, 2.0])  # C = 2, count 2; channel 1 negative var
    mean, var, count = keras_moments(total, 2)
    assert mean.tolist() == [1.0, 0.0] and var.tolist() == [0.0, 0.0] and count.item() == 2
    m0, v0, _ = keras_moments(torch.zeros(5), 2)  # an empty global batch: divide_no_nan
    assert m0.tolist() == [0.0, 0.0] and v0.tolist() == [0.0, 0.0]


@pytest.mark.parametrize("fmt", ["NHWC", "NCHW"])
def test_gradcheck_float64(fmt):
    shape = (3, 4, 3, 2) if fmt == "NHWC" else (3, 2, 4, 3)
    x = _make(shape, fmt, "contiguous", torch.float64).requires_grad_()
    C = 2
    scale = (torch.rand(C, dtype=torch.float64) + 0.5).requires_grad_()
    offset = torch.randn(C, dtype=torch.float64).requires_grad_()
    assert gradcheck(
        lambda x, s, o: sync_fused_batch_norm(x, s, o, 1e-3, fmt)[0], (x, scale, offset)
    )
    xs = x.detach().clone().requires_grad_()
    assert gradcheck(lambda x: T.fused_batch_norm_sync_stats(x, fmt), (xs,))


def test_gradient_equals_batch_norm_gradient():
    """On one process the synchronized gradient is the ordinary batch-norm gradient."""
    x = _make((8, 5, 5, 6), "NHWC", "contiguous", torch.float64).requires_grad_()
    s, o = torch.rand(6, dtype=torch.float64) + 0.5, torch.randn(6, dtype=torch.float64)
    s.requires_grad_(), o.requires_grad_()
    dy = torch.randn(x.shape, dtype=torch.float64)
    got = torch.autograd.grad(sync_fused_batch_norm(x, s, o)[0], (x, s, o), dy)
    want = torch.autograd.grad(T.fused_batch_norm_v3(x, s, o, epsilon=1e-3)[0], (x, s, o), dy)
    for a, b in zip(got, want):
        assert rel_err(a, b) <= 1e-10


def test_double_backward_is_refused_clearly():
    x = torch.randn(2, 3, 3, 4, dtype=torch.float64, requires_grad=True)
    s, o = torch.ones(4, dtype=torch.float64), torch.zeros(4, dtype=torch.float64)
    y = sync_fused_batch_norm(x, s, o)[0]
    with pytest.raises(NotImplementedError, match="double backward"):
        torch.autograd.grad((y * y).sum(), x, create_graph=True)


def test_bad_keras_version_names_the_argument():
    with pytest.raises(ValueError, match="SyncFusedBatchNorm: argument 'keras_version'"):
        SyncFusedBatchNorm(3, keras_version="3")
    with pytest.raises(TypeError, match="SyncFusedBatchNorm: argument 'process_group'"):
        SyncFusedBatchNorm(3, process_group="world")
    with pytest.raises(TypeError, match="convert_sync_batchnorm: argument 'module'"):
        convert_sync_batchnorm("model")
    with pytest.raises(ValueError, match="convert_sync_batchnorm: argument 'keras_version'"):
        convert_sync_batchnorm(torch.nn.Linear(1, 1), keras_version=4)


@pytest.mark.parametrize("training", [True, False])
def test_module_outside_a_process_group_is_fused_batch_norm(training):
    x = _make((6, 4, 4, 5), "NHWC", "contiguous")
    a, b = SyncFusedBatchNorm(5), FusedBatchNorm(5, moving_variance="biased")
    with torch.no_grad():
        for m in (a, b):
            m.weight.uniform_(0.5, 1.5, generator=torch.Generator().manual_seed(1))
            m.running_var.fill_(2.0)
    a.train(training), b.train(training)
    for _ in range(2):
        assert torch.equal(a(x), b(x))
    assert torch.equal(a.running_mean, b.running_mean)
    assert torch.equal(a.running_var, b.running_var)


def test_convert_sync_batchnorm_swaps_and_keeps_tensors():
    model = torch.nn.Sequential(
        FusedBatchNorm(3),
        torch.nn.Sequential(FusedBatchNorm(3, moving_variance="bessel", center=False)),
    )
    model.eval()
    w, rm = model[0].weight, model[1][0].running_mean
    out = convert_sync_batchnorm(model)
    assert out is model
    assert type(out[0]) is SyncFusedBatchNorm and type(out[1][0]) is SyncFusedBatchNorm
    assert out[0].weight is w and out[1][0].running_mean is rm and out[1][0].bias is None
    assert out[0].keras_version == 3 and out[1][0].keras_version == 3
    assert not out[0].training
    single = convert_sync_batchnorm(FusedBatchNorm(2), keras_version=2)
    assert type(single) is SyncFusedBatchNorm and single.keras_version == 2
    assert list(single.state_dict()) == ["weight", "bias", "running_mean", "running_var"]


def test_compile_fullgraph_dynamic_and_export():
    m = SyncFusedBatchNorm(4)
    x = torch.randn(3, 5, 5, 4)
    ref = FusedBatchNorm(4, moving_variance="biased")
    compiled = torch.compile(
        lambda x, s, o: sync_fused_batch_norm(x, s, o)[0], fullgraph=True, dynamic=True
    )
    s, o = torch.rand(4) + 0.5, torch.randn(4)
    torch.testing.assert_close(compiled(x, s, o), sync_fused_batch_norm(x, s, o)[0])
    torch.testing.assert_close(torch.compile(m, fullgraph=True, dynamic=True)(x), ref(x))
    ep = torch.export.export(m.eval(), (x,))
    torch.testing.assert_close(ep.module()(x), ref.eval()(x))


def sync_opcheck_samples():
    """(op name, args, kwargs) for test_fused_batch_norm.test_opcheck and the registry test."""
    for fmt, shape in (("NHWC", (3, 4, 5, 6)), ("NCHW", (3, 6, 4, 5))):
        for rg in (False, True):
            x = torch.randn(shape).requires_grad_(rg)
            dy = torch.randn(shape)
            C = 6
            mean, var, scale = torch.randn(C), torch.rand(C) + 0.5, torch.rand(C) + 0.5
            yield "fused_batch_norm_sync_stats", (x, fmt), {}
            yield "fused_batch_norm_sync_grad_sums", (dy, x.detach(), mean, fmt), {}
            sums, count = torch.randn(2 * C), torch.tensor([float(x.numel() // C)])
            args = (dy, x.detach(), scale, mean, var, sums, count, 1e-3, fmt)
            yield "fused_batch_norm_sync_backprop_input", args, {}


@pytest.mark.parametrize("device", CUDA_DEVICES)
def test_no_host_synchronization_on_cuda(device):
    """The count travels on the device: forward and backward never wait for the GPU."""
    x = torch.randn(4, 6, 6, 5, device=device, requires_grad=True)
    s = torch.ones(5, device=device, requires_grad=True)
    o = torch.zeros(5, device=device, requires_grad=True)
    dy = torch.randn(4, 6, 6, 5, device=device)
    torch.cuda.set_sync_debug_mode("error")
    try:
        y = sync_fused_batch_norm(x, s, o)[0]
        y.backward(dy)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    ref = T.fused_batch_norm_v3(x.detach().cpu(), s.detach().cpu(), o.detach().cpu(), epsilon=1e-3)
    assert rel_err(y, ref[0]) <= 1e-5


def test_stats_gradgradcheck_float64():
    x = torch.randn(2, 3, 2, 4, dtype=torch.float64, requires_grad=True)
    assert gradgradcheck(lambda x: T.fused_batch_norm_sync_stats(x), (x,))


class _AllThree(torch.nn.Module):
    def forward(self, x, dy, scale, mean, var):
        stats = T.fused_batch_norm_sync_stats(x)
        sums = T.fused_batch_norm_sync_grad_sums(dy, x, mean)
        dx = T.fused_batch_norm_sync_backprop_input(dy, x, scale, mean, var, sums, stats[-1:])
        return stats, sums, dx


def test_export_keeps_each_sync_op():
    args = (torch.randn(3, 4, 4, 5), torch.randn(3, 4, 4, 5), torch.rand(5) + 0.5)
    args += (torch.randn(5), torch.rand(5) + 0.5)
    ep = torch.export.export(_AllThree(), args)
    targets = [n.target for n in ep.graph.nodes if n.op == "call_function"]
    for op in ("stats", "grad_sums", "backprop_input"):
        assert getattr(torch.ops.tfgrads, f"fused_batch_norm_sync_{op}").default in targets, op
    for got, want in zip(ep.module()(*args), _AllThree()(*args)):
        assert torch.equal(got, want)
