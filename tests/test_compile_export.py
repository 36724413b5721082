"""torch.compile(fullgraph=True, dynamic=True) and torch.export of models using our ops."""

import pytest
import torch

import torch_tfgrads as T


class ConvBN(torch.nn.Module):
    """conv (NCHW) -> FusedBatchNorm in NCHW -> relu -> FusedBatchNorm in NHWC."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = T.nn.FusedBatchNorm(8, data_format="NCHW")
        self.bn2 = T.nn.FusedBatchNorm(8, data_format="NHWC")

    def forward(self, x):
        h = torch.relu(self.bn1(self.conv(x)))
        return self.bn2(h.permute(0, 2, 3, 1))


def _run(model, x):
    y = model(x)
    grads = torch.autograd.grad(y.square().sum() + y.sum(), [x, *model.parameters()])
    return y, grads


@pytest.mark.parametrize("training", [True, False])
def test_compile_fullgraph_dynamic_matches_eager(training):
    # float64: in float32, Inductor's fused reductions reorder sums that batch norm's gradient
    # amplifies (2-3e-5 apart on some hosts), which would hide a real mismatch in the noise.
    torch._dynamo.reset()
    model = ConvBN().double().train(training)
    compiled = torch.compile(model, fullgraph=True, dynamic=True)
    for shape in [(2, 3, 6, 6), (3, 3, 5, 7)]:
        x = torch.randn(shape, dtype=torch.float64, requires_grad=True)
        state = {k: v.clone() for k, v in model.state_dict().items()}
        y_e, g_e = _run(model, x)
        stats_e = {k: v.clone() for k, v in model.state_dict().items()}
        model.load_state_dict(state)
        y_c, g_c = _run(compiled, x)
        torch.testing.assert_close(y_c, y_e, rtol=1e-10, atol=1e-10)
        for a, b in zip(g_c, g_e):
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)
        for k, v in model.state_dict().items():  # running statistics updated identically
            torch.testing.assert_close(v, stats_e[k])


def test_compile_double_backward():
    torch._dynamo.reset()

    def f(x, s, o):
        y = T.fused_batch_norm_v3(x, s, o, data_format="NCHW")[0]
        (gx,) = torch.autograd.grad((y * y * y).sum(), x, create_graph=True)
        return gx

    x = torch.randn(2, 4, 3, 3, dtype=torch.float64, requires_grad=True)
    s, o = torch.rand(4, dtype=torch.float64) + 0.5, torch.randn(4, dtype=torch.float64)
    eager = f(x, s, o)
    # create_graph through a compiled backward needs donated buffers off (a torch rule).
    with torch._functorch.config.patch(donated_buffer=False):
        compiled = torch.compile(f, fullgraph=False, dynamic=True)(x, s, o)
    torch.testing.assert_close(compiled, eager)


def test_export_keeps_one_node_per_op():
    model = ConvBN().eval()
    x = torch.randn(2, 3, 6, 6)
    batch = torch.export.Dim("batch", min=1, max=64)
    ep = torch.export.export(model, (x,), dynamic_shapes={"x": {0: batch}})
    targets = [n.target for n in ep.graph.nodes if n.op == "call_function"]
    assert targets.count(torch.ops.tfgrads.fused_batch_norm_v3.default) == 2
    x2 = torch.randn(5, 3, 6, 6)
    torch.testing.assert_close(ep.module()(x2), model(x2))


# ---- FractionalPool -----------------------------------------------------------------------------
class ConvFractionalPool(torch.nn.Module):
    """conv (NCHW) -> NHWC view -> fractional max pool -> fractional avg pool (overlapping)."""

    def __init__(self, seeded=True):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        seeds = dict(deterministic=True, seed=7, seed2=3) if seeded else {}
        self.max_pool = T.nn.FractionalMaxPool2d(1.44, pseudo_random=True, **seeds)
        self.avg_pool = T.nn.FractionalAvgPool2d((1.3, 1.7), overlapping=True, **seeds)

    def forward(self, x):
        h = self.conv(x).permute(0, 2, 3, 1)
        return self.avg_pool(torch.relu(self.max_pool(h)))


@pytest.mark.parametrize("seeded", [True, False])
def test_compile_fractional_pool_fullgraph_dynamic(seeded):
    torch._dynamo.reset()
    model = ConvFractionalPool(seeded)
    compiled = torch.compile(model, fullgraph=True, dynamic=True)
    for shape in [(2, 3, 12, 12), (5, 3, 12, 12), (3, 3, 11, 14)]:
        x = torch.randn(shape, requires_grad=True)
        torch.manual_seed(1)  # zero seeds: the sequences come from torch's generator
        y_e, g_e = _run(model, x)
        rows_e = model.avg_pool.row_pooling_sequence
        torch.manual_seed(1)
        y_c, g_c = _run(compiled, x)
        assert torch.equal(model.avg_pool.row_pooling_sequence, rows_e)
        torch.testing.assert_close(y_c, y_e)
        for a, b in zip(g_c, g_e):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_compile_fractional_pool_double_backward():
    torch._dynamo.reset()

    def f(x):
        y = T.fractional_avg_pool(x, [1, 1.5, 1.5, 1], False, True, True, 1, 2)[0]
        (gx,) = torch.autograd.grad((y**3).sum(), x, create_graph=True)
        return gx

    x = torch.randn(2, 9, 9, 3, dtype=torch.float64, requires_grad=True)
    with torch._functorch.config.patch(donated_buffer=False):
        compiled = torch.compile(f, fullgraph=False, dynamic=True)(x)
    torch.testing.assert_close(compiled, f(x))


def test_export_fractional_pool():
    model = ConvFractionalPool().eval()
    x = torch.randn(2, 3, 12, 12)
    batch = torch.export.Dim("batch", min=1, max=64)
    ep = torch.export.export(model, (x,), dynamic_shapes={"x": {0: batch}})
    targets = [n.target for n in ep.graph.nodes if n.op == "call_function"]
    assert torch.ops.tfgrads.fractional_max_pool.default in targets
    assert torch.ops.tfgrads.fractional_avg_pool.default in targets
    x2 = torch.randn(5, 3, 12, 12)
    torch.testing.assert_close(ep.module()(x2), model(x2))


# ---- DepthwiseConv2dNative ----------------------------------------------------------------------
class MobileNetBlock(torch.nn.Module):
    """NHWC depthwise (stride 2, SAME) -> relu -> NCHW depthwise (dilated, multiplier 2)."""

    def __init__(self):
        super().__init__()
        self.dw1 = T.nn.DepthwiseConv2d(4, 3, strides=2, padding="same")
        self.dw2 = T.nn.DepthwiseConv2d(
            4, 3, padding="same", depth_multiplier=2, dilation_rate=2, data_format="channels_first"
        )

    def forward(self, x):
        h = torch.relu(self.dw1(x))
        return self.dw2(h.permute(0, 3, 1, 2))


def test_compile_depthwise_fullgraph_dynamic():
    torch._dynamo.reset()
    model = MobileNetBlock()
    compiled = torch.compile(model, fullgraph=True, dynamic=True)
    for shape in [(2, 9, 9, 4), (3, 12, 10, 4), (1, 7, 16, 4)]:
        x = torch.randn(shape, requires_grad=True)
        y_e, g_e = _run(model, x)
        y_c, g_c = _run(compiled, x)
        torch.testing.assert_close(y_c, y_e)
        for a, b in zip(g_c, g_e):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_compile_depthwise_double_backward():
    torch._dynamo.reset()
    st, dil = [1, 2, 1, 1], [1, 1, 2, 1]

    def f(x, w):
        y = T.depthwise_conv2d_native(x, w, st, "SAME", dilations=dil)
        gx, gw = torch.autograd.grad((y**3).sum(), (x, w), create_graph=True)
        return gx, gw

    x = torch.randn(2, 7, 8, 3, dtype=torch.float64, requires_grad=True)
    w = torch.randn(3, 3, 3, 2, dtype=torch.float64, requires_grad=True)
    with torch._functorch.config.patch(donated_buffer=False):
        compiled = torch.compile(f, fullgraph=False, dynamic=True)(x, w)
    for a, b in zip(compiled, f(x, w)):
        torch.testing.assert_close(a, b)


def test_export_depthwise():
    model = MobileNetBlock().eval()
    x = torch.randn(2, 9, 9, 4)
    batch = torch.export.Dim("batch", min=1, max=64)
    ep = torch.export.export(model, (x,), dynamic_shapes={"x": {0: batch}})
    targets = [n.target for n in ep.graph.nodes if n.op == "call_function"]
    assert targets.count(torch.ops.tfgrads.depthwise_conv2d_native.default) == 2
    x2 = torch.randn(5, 9, 9, 4)
    torch.testing.assert_close(ep.module()(x2), model(x2))


def test_compile_depthwise_bad_stride_is_a_clean_error():
    """TF's graph mode dies of SIGFPE on BackpropInput with strides [1,0,0,1]; a
    compiled call must fail with the op's message instead (the fake checks before dividing)."""
    torch._dynamo.reset()

    def f(w, dy):
        return T.depthwise_conv2d_native_backprop_input([1, 4, 4, 3], w, dy, [1, 0, 0, 1], "VALID")

    with pytest.raises(Exception, match="Stride must be > 0, but got 0"):
        torch.compile(f, fullgraph=True, dynamic=True)(
            torch.ones(2, 2, 3, 2), torch.ones(1, 3, 3, 6)
        )


class Tagger(torch.nn.Module):
    """A bidirectional two-layer CudnnLSTM (variable lengths) -> linear: a sequence tagger."""

    def __init__(self):
        super().__init__()
        self.rnn = T.nn.CudnnLSTM(2, 6, direction="bidirectional", input_size=4, time_major=False)
        self.head = torch.nn.Linear(12, 3)

    def forward(self, x, lengths):
        out, (h, c) = self.rnn(x, sequence_lengths=lengths)
        return self.head(out), h


def test_compile_cudnn_lstm_fullgraph_dynamic():
    # torch.nn.LSTM graph-breaks under torch.compile; our op is one node.
    torch._dynamo.reset()
    model = Tagger()
    compiled = torch.compile(model, fullgraph=True, dynamic=True)
    for B, T_ in [(3, 5), (4, 7), (2, 9)]:
        x = torch.randn(B, T_, 4, requires_grad=True)
        lengths = torch.randint(1, T_ + 1, (B,), dtype=torch.int32)
        outs = []
        for m in (model, compiled):
            y, h = m(x, lengths)
            grads = torch.autograd.grad(y.square().sum() + h.sum(), [x, *model.parameters()])
            outs.append((y, h, grads))
        (y_e, h_e, g_e), (y_c, h_c, g_c) = outs
        torch.testing.assert_close(y_c, y_e)
        torch.testing.assert_close(h_c, h_e)
        for a, b in zip(g_c, g_e):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_compile_cudnn_rnn_double_backward():
    torch._dynamo.reset()
    lengths = torch.tensor([3, 1], dtype=torch.int32)

    def f(x, p, h):
        out, hn, _, _, _ = T.cudnn_rnn_v3(x, h, None, p, lengths, "gru")
        gx, gp = torch.autograd.grad(out.square().sum() + hn.sum(), (x, p), create_graph=True)
        return gx, gp

    x = torch.randn(3, 2, 3, dtype=torch.float64, requires_grad=True)
    p = torch.randn(
        T.cudnn_rnn_params_size(1, 4, 3, "gru"), dtype=torch.float64, requires_grad=True
    )
    h = torch.randn(1, 2, 4, dtype=torch.float64, requires_grad=True)
    with torch._functorch.config.patch(donated_buffer=False):
        compiled = torch.compile(f, fullgraph=False, dynamic=True)(x, p, h)
    for a, b in zip(compiled, f(x, p, h)):
        torch.testing.assert_close(a, b)


def test_export_cudnn_lstm():
    model = Tagger().eval()
    x, lengths = torch.randn(3, 5, 4), torch.tensor([5, 2, 4], dtype=torch.int32)
    batch = torch.export.Dim("batch", min=1, max=64)
    ep = torch.export.export(
        model, (x, lengths), dynamic_shapes={"x": {0: batch}, "lengths": {0: batch}}
    )
    targets = [n.target for n in ep.graph.nodes if n.op == "call_function"]
    assert targets.count(torch.ops.tfgrads.cudnn_rnn_v3.default) == 1
    x2, l2 = torch.randn(6, 5, 4), torch.tensor([1, 5, 3, 2, 5, 4], dtype=torch.int32)
    for a, b in zip(ep.module()(x2, l2), model(x2, l2)):
        torch.testing.assert_close(a, b)
