"""Property-based fuzzing (hypothesis) of the CPU ops.

* Random shapes and channel counts that reach every kernel path (remainders after whole 8- and
  16-lane vectors, whole vectors, several 64-channel blocks), values full of ties, signed zeros,
  infinities and denormals, and strided views, against the references: TF's loop order for
  fractional pooling (bit for bit), float64 convolution for depthwise.
* Random bad arguments: each must raise one of the four documented exception types with a
  message that starts with the op's name and names an argument (docs/errors.md), never crash.

The examples are derandomized (the same ones every run, so CI cannot flake);
`HYPOTHESIS_PROFILE=explore` searches longer with fresh random examples.
"""

import math
import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import fractional_pool_reference as R
import torch_tfgrads as T

settings.register_profile(
    "ci",
    max_examples=150,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "explore",
    max_examples=1000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    # No "explain" phase: it traces every line, and the Python references then take hours.
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# Channel counts: below one 8-lane vector, one vector plus a remainder, whole 16-lane vectors
# (the AVX-512 kernels), and more than one 64-channel block of the overlapping max gradient.
CHANNELS = [1, 3, 8, 15, 16, 17, 24, 32, 48, 64, 80, 128]
EXTREMES = np.array(
    [-np.inf, np.inf, np.nan, -0.0, 0.0, 3e38, -3e38, 1e-45, -1e-45, 1.0, -1.0, 2.0],
    dtype=np.float64,
)


def _values(shape, kind, dtype, rng):
    if kind == "normal":
        v = rng.standard_normal(shape)
    elif kind == "ties":  # a handful of values, zeros of both signs: many equal maxima
        v = rng.integers(-2, 3, size=shape).astype(np.float64)
        v[(v == 0) & (rng.random(shape) < 0.5)] = -0.0
    else:
        v = rng.choice(EXTREMES, size=shape)
    if not dtype.is_floating_point:
        v = np.nan_to_num(v, posinf=7, neginf=-7).clip(-7, 7)
    return torch.from_numpy(v).to(dtype)


def _layout(x, how):
    """The same values in another memory layout: channels-first storage, or every other
    channel of a wider tensor."""
    if how == "channels_first":
        return x.permute(0, 3, 1, 2).contiguous().permute(0, 2, 3, 1)
    if how == "strided":
        wide = torch.zeros(*x.shape[:3], 2 * x.shape[3], dtype=x.dtype)
        wide[..., ::2] = x
        return wide[..., ::2]
    return x


@st.composite
def pool_cases(draw):
    h, w = draw(st.integers(2, 14)), draw(st.integers(2, 14))
    return dict(
        n=draw(st.integers(1, 2)),
        h=h,
        w=w,
        c=draw(st.sampled_from(CHANNELS)),
        ratio=[
            1.0,
            draw(st.floats(1.0, min(2.9, h), allow_nan=False)),
            draw(st.floats(1.0, min(2.9, w), allow_nan=False)),
            1.0,
        ],
        overlapping=draw(st.booleans()),
        pseudo_random=draw(st.booleans()),
        seeds=(draw(st.integers(1, 2**31 - 1)), draw(st.integers(0, 2**31 - 1))),
        kind=draw(st.sampled_from(["normal", "ties", "extremes"])),
        dtype=draw(st.sampled_from([torch.float32, torch.float32, torch.float64, torch.int32])),
        layout=draw(st.sampled_from(["contiguous", "channels_first", "strided"])),
        data_seed=draw(st.integers(0, 2**32 - 1)),
    )


def _same(actual, expected):
    return np.array_equal(actual.numpy(), expected, equal_nan=True)


def _cells(xn, r, c, ov):
    """Each cell's elements in TF's scan order: ((i, j), [N, elements, C])."""
    N, H, W, C = xn.shape
    for i in range(len(r) - 1):
        r1 = min(r[i + 1] if ov else r[i + 1] - 1, H - 1)
        for j in range(len(c) - 1):
            c1 = min(c[j + 1] if ov else c[j + 1] - 1, W - 1)
            yield (i, j), xn[:, r[i] : r1 + 1, c[j] : c1 + 1, :].reshape(N, -1, C)


def _tf_max_pool(xn, r, c, ov):
    """TF's forward: the output starts at the type's lowest value and takes the elementwise
    maximum, so NaN never enters and a cell of -inf or NaN only gives the lowest finite value."""
    lowest = np.finfo(xn.dtype).min if xn.dtype.kind == "f" else np.iinfo(xn.dtype).min
    out = np.full((xn.shape[0], len(r) - 1, len(c) - 1, xn.shape[3]), lowest, dtype=xn.dtype)
    for (i, j), cell in _cells(xn, r, c, ov):
        for k in range(cell.shape[1]):
            out[:, i, j] = np.where(out[:, i, j] < cell[:, k], cell[:, k], out[:, i, j])
    return out


def _tf_grad_max(xn, r, c, ov):
    """The maximum TF's gradient recomputes: from each cell's first element, `best < v` takes
    v. It must equal orig_output (else TF's "tensor_out_dup is not the same as tensor_out")."""
    out = np.empty((xn.shape[0], len(r) - 1, len(c) - 1, xn.shape[3]), dtype=xn.dtype)
    for (i, j), cell in _cells(xn, r, c, ov):
        best = cell[:, 0].copy()
        for k in range(1, cell.shape[1]):
            best = np.where(best < cell[:, k], cell[:, k], best)
        out[:, i, j] = best
    return out


@given(pool_cases())
@np.errstate(over="ignore", invalid="ignore")  # the references' inf - inf and float32 overflow
def test_fractional_pool_ops_match_tf_loop_order(case):
    rng = np.random.default_rng(case["data_seed"])
    shape = (case["n"], case["h"], case["w"], case["c"])
    x = _layout(_values(shape, case["kind"], case["dtype"], rng), case["layout"])
    ov, pseudo, (seed, seed2) = case["overlapping"], case["pseudo_random"], case["seeds"]
    xn = x.contiguous().numpy()

    y, rows, cols = T.fractional_max_pool(x, case["ratio"], pseudo, ov, True, seed, seed2)
    r, c = rows.tolist(), cols.tolist()
    assert (r, c) == R.fractional_sequences(
        case["h"], case["w"], case["ratio"], pseudo, seed, seed2
    )
    assert _same(y, _tf_max_pool(xn, r, c, ov))
    dy = _values(tuple(y.shape), "normal" if x.is_floating_point() else "ties", x.dtype, rng)
    if not np.array_equal(_tf_grad_max(xn, r, c, ov), y.numpy()):  # -inf or NaN cells
        with pytest.raises(RuntimeError, match="argument 'orig_output': tensor_out_dup"):
            T.fractional_max_pool_grad(x, y, dy, rows, cols, ov)
    else:
        dx = T.fractional_max_pool_grad(x, y, dy, rows, cols, ov)
        assert _same(dx, R.fractional_max_pool_grad_ref(xn, y.numpy(), dy.numpy(), r, c, ov))

    a, arows, acols = T.fractional_avg_pool(x, case["ratio"], pseudo, ov, True, seed, seed2)
    assert arows.tolist() == r and acols.tolist() == c
    assert _same(a, R.fractional_pool_ref(xn, r, c, ov, "avg"))
    da = T.fractional_avg_pool_grad(list(x.shape), dy, rows, cols, ov)
    assert _same(da, R.fractional_avg_pool_grad_ref(x.shape, dy.numpy(), r, c, ov))


@st.composite
def depthwise_cases(draw):
    stride = draw(st.integers(1, 3))
    padding = draw(st.sampled_from(["SAME", "VALID", "EXPLICIT"]))
    return dict(
        n=draw(st.integers(1, 2)),
        h=draw(st.integers(1, 10)),
        w=draw(st.integers(1, 10)),
        c=draw(st.sampled_from([1, 3, 8, 16, 17, 32, 48])),
        multiplier=draw(st.integers(1, 3)),
        kh=draw(st.integers(1, 4)),
        kw=draw(st.integers(1, 4)),
        stride=stride,
        dilation=1 if stride > 1 else draw(st.integers(1, 2)),
        padding=padding,
        pads=[draw(st.integers(0, 2)) for _ in range(4)] if padding == "EXPLICIT" else [0] * 4,
        nchw=draw(st.booleans()),
        dtype=draw(st.sampled_from([torch.float32, torch.float64])),
        kind=draw(st.sampled_from(["normal", "ties"])),
        data_seed=draw(st.integers(0, 2**32 - 1)),
    )


def _out_and_pads(size, k, stride, dilation, padding, before, after):
    """TF's output size and the (before, after) padding of one spatial axis."""
    span = (k - 1) * dilation + 1
    if padding == "SAME":
        out = math.ceil(size / stride)
        total = max((out - 1) * stride + span - size, 0)
        return out, (total // 2, total - total // 2)
    a = size + before + after - span + stride  # C++ division truncates toward zero
    return (a // stride if a >= 0 else -(-a // stride)), (before, after)


@given(depthwise_cases())
def test_depthwise_ops_match_float64_convolution(case):
    rng = np.random.default_rng(case["data_seed"])
    n, h, w, c, m = case["n"], case["h"], case["w"], case["c"], case["multiplier"]
    s, d, kh, kw = case["stride"], case["dilation"], case["kh"], case["kw"]
    pt, pb, pl, pr = case["pads"]
    oh, (pt, pb) = _out_and_pads(h, kh, s, d, case["padding"], pt, pb)
    ow, (pl, pr) = _out_and_pads(w, kw, s, d, case["padding"], pl, pr)
    x = _values((n, h, w, c), case["kind"], case["dtype"], rng)
    f = _values((kh, kw, c, m), "normal", case["dtype"], rng)
    nchw = case["nchw"]
    strides = [1, 1, s, s] if nchw else [1, s, s, 1]
    dilations = [1, 1, d, d] if nchw else [1, d, d, 1]
    explicit = []
    if case["padding"] == "EXPLICIT":
        explicit = [0, 0, 0, 0, pt, pb, pl, pr] if nchw else [0, 0, pt, pb, pl, pr, 0, 0]
    fmt = "NCHW" if nchw else "NHWC"
    xin = x.permute(0, 3, 1, 2).contiguous() if nchw else x
    args = dict(strides=strides, padding=case["padding"], explicit_paddings=explicit)
    args.update(data_format=fmt, dilations=dilations)
    if oh < 0 or ow < 0:  # TF's "Computed output size would be negative"
        with pytest.raises(RuntimeError, match="depthwise_conv2d_native: argument"):
            T.depthwise_conv2d_native(xin, f, **args)
        return
    if oh == 0 or ow == 0:  # an empty output, as TF's
        assert T.depthwise_conv2d_native(xin, f, **args).numel() == 0
        return

    # The reference: float64 grouped convolution on explicitly padded NCHW input.
    xr = x.permute(0, 3, 1, 2).double().requires_grad_()
    wr = f.double().permute(2, 3, 0, 1).reshape(c * m, 1, kh, kw).requires_grad_()
    yr = F.conv2d(F.pad(xr, (pl, pr, pt, pb)), wr, stride=s, dilation=d, groups=c)
    dy = _values(tuple(yr.shape), "normal", case["dtype"], rng)  # NCHW
    yr.backward(dy.double())
    dy_in = dy if nchw else dy.permute(0, 2, 3, 1)

    def nhwc(t):
        return t.permute(0, 2, 3, 1) if nchw else t

    tol = dict(rtol=1e-4, atol=1e-4) if case["dtype"] == torch.float32 else {}
    y = T.depthwise_conv2d_native(xin, f, **args)
    torch.testing.assert_close(nhwc(y).double(), yr.detach().permute(0, 2, 3, 1), **tol)
    dx = T.depthwise_conv2d_native_backprop_input(list(xin.shape), f, dy_in, **args)
    torch.testing.assert_close(nhwc(dx).double(), xr.grad.permute(0, 2, 3, 1), **tol)
    df = T.depthwise_conv2d_native_backprop_filter(xin, list(f.shape), dy_in, **args)
    torch.testing.assert_close(
        df.double(), wr.grad.reshape(c, m, kh, kw).permute(2, 3, 0, 1), **tol
    )


# ---- bad arguments
ERRORS = (TypeError, ValueError, RuntimeError, NotImplementedError)
BAD_TENSORS = [
    torch.ones(3),
    torch.ones(2, 3, 3),
    torch.ones(1, 4, 4, 2, dtype=torch.bool),
    torch.ones(1, 4, 4, 2, dtype=torch.int8),
    torch.ones(1, 4, 4, 2, dtype=torch.complex64),
    torch.zeros(0, 4, 4, 2),
    torch.ones(1, 4, 4, 5),
    torch.ones(2, 7, 7, 2),
    torch.full((1, 4, 4, 2), float("nan")),
]
BAD_VALUES = [
    -1,
    0,
    10**12,
    float("nan"),
    float("inf"),
    -2.5,
    [],
    [1],
    [1, 2, 3],
    [1, 1, 1, 1, 1],
    [1, -1, -1, 1],
    [0, 0, 0, 0],
    [2, 2, 2, 2],
    [float("nan")] * 4,
    "",
    "same",
    "NWHC",
    "SAME",
    "EXPLICIT",
]


def _base_calls():
    """One valid call per op: (fn, kwargs)."""
    x = torch.randn(1, 4, 4, 2)
    f = torch.randn(2, 2, 2, 1)
    dw = dict(strides=[1, 1, 1, 1], padding="SAME")
    y, rows, cols = T.fractional_max_pool(x, [1.0, 1.5, 1.5, 1.0], False, False, True, 1, 2)
    a, _, _ = T.fractional_avg_pool(x, [1.0, 1.5, 1.5, 1.0], False, False, True, 1, 2)
    scale, offset = torch.ones(2), torch.zeros(2)
    _, m, v, r1, r2, r3 = T.fused_batch_norm_v3(x, scale, offset)
    n = T.cudnn_rnn_params_size(1, 2, 3, "lstm")
    rnn = dict(input=torch.randn(2, 1, 3), input_h=torch.zeros(1, 1, 2))
    rnn.update(input_c=torch.zeros(1, 1, 2), params=torch.randn(n))
    weights, biases = T.cudnn_rnn_params_to_canonical_v2(1, 2, 3, rnn["params"], 8, 8)
    sync = dict(y_backprop=x, x=x, scale=scale, mean=m, variance=v)
    sync.update(grad_sums=torch.zeros(2, 2), count=torch.tensor(16.0))
    return {
        "fractional_avg_pool": (
            T.fractional_avg_pool,
            dict(value=x, pooling_ratio=[1.0, 1.5, 1.5, 1.0], pseudo_random=True, overlapping=True),
        ),
        "fractional_pooling_sequence": (
            T.fractional_pooling_sequence,
            dict(input_length=9, output_length=4, pseudo_random=True, seed=3, seed2=4),
        ),
        "fused_batch_norm_sync_stats": (T.fused_batch_norm_sync_stats, dict(x=x)),
        "fused_batch_norm_sync_grad_sums": (
            T.fused_batch_norm_sync_grad_sums,
            dict(y_backprop=x, x=x, mean=m),
        ),
        "fused_batch_norm_sync_backprop_input": (T.fused_batch_norm_sync_backprop_input, sync),
        "cudnn_rnn_v3": (T.cudnn_rnn_v3, rnn),
        "cudnn_rnn_params_size": (
            T.cudnn_rnn_params_size,
            dict(
                num_layers=1, num_units=2, input_size=3, rnn_mode="gru", direction="bidirectional"
            ),
        ),
        "cudnn_rnn_canonical_to_params_v2": (
            T.cudnn_rnn_canonical_to_params_v2,
            dict(num_layers=1, num_units=2, input_size=3, weights=weights, biases=biases),
        ),
        "cudnn_rnn_params_to_canonical_v2": (
            T.cudnn_rnn_params_to_canonical_v2,
            dict(
                num_layers=1,
                num_units=2,
                input_size=3,
                params=rnn["params"],
                num_params_weights=8,
                num_params_biases=8,
            ),
        ),
        "depthwise_conv2d_native": (T.depthwise_conv2d_native, dict(input=x, filter=f, **dw)),
        "depthwise_conv2d_native_backprop_input": (
            T.depthwise_conv2d_native_backprop_input,
            dict(input_sizes=[1, 4, 4, 2], filter=f, out_backprop=x, **dw),
        ),
        "depthwise_conv2d_native_backprop_filter": (
            T.depthwise_conv2d_native_backprop_filter,
            dict(input=x, filter_sizes=[2, 2, 2, 1], out_backprop=x, **dw),
        ),
        "fractional_max_pool": (
            T.fractional_max_pool,
            dict(value=x, pooling_ratio=[1.0, 1.5, 1.5, 1.0], deterministic=True, seed=1),
        ),
        "fractional_max_pool_grad": (
            T.fractional_max_pool_grad,
            dict(
                orig_input=x,
                orig_output=y,
                out_backprop=torch.ones_like(y),
                row_pooling_sequence=rows,
                col_pooling_sequence=cols,
            ),
        ),
        "fractional_avg_pool_grad": (
            T.fractional_avg_pool_grad,
            dict(
                orig_input_tensor_shape=[1, 4, 4, 2],
                out_backprop=torch.ones_like(a),
                row_pooling_sequence=rows,
                col_pooling_sequence=cols,
            ),
        ),
        "fused_batch_norm_v3": (
            T.fused_batch_norm_v3,
            dict(x=x, scale=scale, offset=offset, mean=m, variance=v, is_training=False),
        ),
        "fused_batch_norm_grad_v3": (
            T.fused_batch_norm_grad_v3,
            dict(
                y_backprop=x,
                x=x,
                scale=scale,
                reserve_space_1=r1,
                reserve_space_2=r2,
                reserve_space_3=r3,
            ),
        ),
    }


BASE = _base_calls()


@st.composite
def bad_calls(draw):
    name = draw(st.sampled_from(sorted(BASE)))
    fn, kwargs = BASE[name]
    arg = draw(st.sampled_from(sorted(kwargs)))
    pool = BAD_TENSORS if isinstance(kwargs[arg], torch.Tensor) else BAD_VALUES + BAD_TENSORS
    return name, fn, {**kwargs, arg: draw(st.sampled_from(pool))}, arg


@given(bad_calls())
def test_bad_arguments_raise_documented_errors_naming_an_argument(call):
    name, fn, kwargs, arg = call
    try:
        out = fn(**kwargs)
    except ERRORS as e:
        message = str(e)
        assert message.startswith(name + ": argument '"), (arg, message)
        return
    # Accepted (the replacement can be valid, e.g. a NaN scale): results of the right kind.
    outs = out if isinstance(out, (tuple, list)) else (out,)
    assert all(isinstance(t, (torch.Tensor, int, list)) for t in outs)
