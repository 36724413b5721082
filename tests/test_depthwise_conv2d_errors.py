"""DepthwiseConv2dNative errors (docs/errors.md): every bad input fails the same way eagerly and
under FakeTensor (the fake kernels that torch.compile and torch.export run), each category of
the policy raises its exception type eagerly and under torch.compile, and the nn module names
its own arguments."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import torch_tfgrads as T
from test_depthwise_conv2d_tf import BAD_INPUTS, EXPECTED_ERROR

S1 = dict(strides=[1, 1, 1, 1], padding="VALID")


def _x(*shape, dtype=torch.float32):
    return torch.ones(shape, dtype=dtype)


def F(**kw):
    return T.depthwise_conv2d_native, kw


def BI(**kw):
    return T.depthwise_conv2d_native_backprop_input, kw


def BF(**kw):
    return T.depthwise_conv2d_native_backprop_filter, kw


# Bad inputs beyond the TF table (test_depthwise_conv2d_tf.BAD_INPUTS): the checks TF lacks or
# words differently, with the exception type the policy gives each.
OWN_CASES = {
    "fwd: int input": (
        F(input=_x(1, 4, 4, 3, dtype=torch.int32), filter=_x(2, 2, 3, 1, dtype=torch.int32), **S1),
        TypeError,
    ),
    "fwd: padding 'same'": (
        F(input=_x(1, 4, 4, 3), filter=_x(2, 2, 3, 1), strides=[1, 1, 1, 1], padding="same"),
        ValueError,
    ),
    "fwd: input smaller than the window": (
        F(input=_x(1, 1, 5, 1), filter=_x(3, 1, 1, 1), **S1),
        RuntimeError,
    ),
    "fwd: NCHW filter depth mismatch": (
        F(input=_x(1, 3, 4, 4), filter=_x(2, 2, 4, 1), data_format="NCHW", **S1),
        RuntimeError,
    ),
    "fwd: huge dilation, SAME": (
        F(
            input=_x(1, 4, 4, 1),
            filter=_x(5, 1, 1, 1),
            strides=[1, 1, 1, 1],
            padding="SAME",
            dilations=[1, 2**62, 1, 1],
        ),
        RuntimeError,
    ),
    "fwd: huge dilation, VALID": (
        F(input=_x(1, 4, 4, 1), filter=_x(5, 1, 1, 1), dilations=[1, 2**62, 1, 1], **S1),
        RuntimeError,
    ),
    "fwd: huge explicit padding": (
        F(
            input=_x(1, 4, 4, 1),
            filter=_x(1, 1, 1, 1),
            strides=[1, 1, 1, 1],
            padding="EXPLICIT",
            explicit_paddings=[0, 0, 2**40, 0, 0, 0, 0, 0],
        ),
        RuntimeError,
    ),
    "bi: out_backprop dtype mismatch": (
        BI(
            input_sizes=[1, 4, 4, 3],
            filter=_x(2, 2, 3, 1),
            out_backprop=_x(1, 3, 3, 3, dtype=torch.float64),
            **S1,
        ),
        TypeError,
    ),
    "bi: float input_sizes tensor": (
        BI(
            input_sizes=torch.tensor([1.0, 4, 4, 3]),
            filter=_x(2, 2, 3, 1),
            out_backprop=_x(1, 3, 3, 3),
            **S1,
        ),
        TypeError,
    ),
    "bi: int filter": (
        BI(
            input_sizes=[1, 4, 4, 3],
            filter=_x(2, 2, 3, 1, dtype=torch.int64),
            out_backprop=_x(1, 3, 3, 3, dtype=torch.int64),
            **S1,
        ),
        TypeError,
    ),
    "bi: input_sizes list of 3": (
        BI(input_sizes=[4, 4, 3], filter=_x(2, 2, 3, 1), out_backprop=_x(1, 3, 3, 3), **S1),
        ValueError,
    ),
    "bi: filter rank 3": (
        BI(input_sizes=[1, 4, 4, 3], filter=_x(2, 2, 3), out_backprop=_x(1, 3, 3, 3), **S1),
        RuntimeError,
    ),
    "bf: filter_sizes list of 5": (
        BF(input=_x(1, 4, 4, 3), filter_sizes=[2, 2, 3, 1, 1], out_backprop=_x(1, 3, 3, 3), **S1),
        ValueError,
    ),
    "bf: out_backprop dtype mismatch": (
        BF(
            input=_x(1, 4, 4, 3),
            filter_sizes=[2, 2, 3, 1],
            out_backprop=_x(1, 3, 3, 3, dtype=torch.float16),
            **S1,
        ),
        TypeError,
    ),
    "bf: cols mismatch (NCHW)": (
        BF(
            input=_x(1, 3, 4, 4),
            filter_sizes=[2, 2, 3, 1],
            out_backprop=_x(1, 3, 3, 2),
            data_format="NCHW",
            **S1,
        ),
        RuntimeError,
    ),
    "bf: bad data_format": (
        BF(
            input=_x(1, 4, 4, 3),
            filter_sizes=[2, 2, 3, 1],
            out_backprop=_x(1, 3, 3, 3),
            data_format="NDHWC",
            **S1,
        ),
        ValueError,
    ),
}

# Every case, as (function, kwargs, expected exception type or None where it computes).
CASES = {name: (fn, kw, EXPECTED_ERROR.get(name)) for name, (_, fn, kw) in BAD_INPUTS.items()}
CASES.update({name: (fn, kw, err) for name, ((fn, kw), err) in OWN_CASES.items()})

# Bad inputs the real kernel rejects and the fake kernel cannot (checks of tensor contents):
# none in this family (its sizes lists are read on the host before the op runs).
DATA_DEPENDENT = {}


def _outcome(fn, kwargs):
    try:
        out = fn(**kwargs)
    except Exception as e:  # noqa: BLE001 - the type is what is compared
        return type(e), str(e), None
    return None, None, out


def _fake_kwargs(mode, kwargs):
    out = {}
    for k, v in kwargs.items():
        if k in ("input_sizes", "filter_sizes"):
            # A sizes tensor is read on the host by the public function (under torch.compile it
            # is a constant): pass what it reads, unless the function rejects the tensor itself.
            if isinstance(v, torch.Tensor) and v.dim() == 1 and not v.is_floating_point():
                v = v.tolist()
        elif isinstance(v, torch.Tensor):
            v = mode.from_tensor(v)
        out[k] = v
    return out


@pytest.mark.parametrize("name", list(CASES))
def test_fake_kernel_fails_like_the_real_one(name):
    fn, kwargs, expected = CASES[name]
    real_type, real_msg, real_out = _outcome(fn, kwargs)
    assert real_type is expected, (real_type, real_msg)
    mode = FakeTensorMode()
    with mode:
        fake_type, fake_msg, fake_out = _outcome(fn, _fake_kwargs(mode, kwargs))
    if name in DATA_DEPENDENT:
        assert real_type is not None and fake_type is None, (real_msg, fake_msg)
        return
    assert (fake_type, fake_msg) == (real_type, real_msg)
    if real_type is None:
        assert fake_out.shape == real_out.shape and fake_out.dtype == real_out.dtype
        assert fake_out.stride() == real_out.stride()


def test_data_dependent_list_names_real_cases():
    assert set(DATA_DEPENDENT) <= set(CASES)


@pytest.mark.parametrize("name", list(OWN_CASES))
def test_own_cases_name_the_argument(name):
    (fn, kwargs), expected = OWN_CASES[name]
    with pytest.raises(expected, match="argument '"):
        fn(**kwargs)


# ---- the policy, eagerly and compiled -----------------------------------------------------------
POLICY = {
    ValueError: "6 fwd: stride in batch dim",
    TypeError: "26 fwd: dtype mismatch",
    RuntimeError: "4 fwd: in_depth mismatch",
}


def assert_dynamo_reports(err, original):
    """Dynamo (torch 2.13) raises its own RuntimeError subclass for an error of a fake kernel
    while tracing (TorchRuntimeError; Unsupported for a TypeError) with the op's exception in
    its cause chain, as docs/errors.md says."""
    assert isinstance(err, torch._dynamo.exc.TorchDynamoException), repr(err)
    seen, todo = set(), [err]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        if type(e) is type(original) and str(e) == str(original):
            return
        seen.add(id(e))
        todo += [e.__cause__, e.__context__]
    raise AssertionError(f"{original!r} is not in the cause chain of {err!r}")


@pytest.mark.parametrize("expected", list(POLICY), ids=lambda t: t.__name__)
def test_policy_types_eager_compiled_and_exported(expected):
    _, fn, kwargs = BAD_INPUTS[POLICY[expected]]
    with pytest.raises(expected) as eager:
        fn(**kwargs)
    tensors = {k: v for k, v in kwargs.items() if isinstance(v, torch.Tensor)}
    attrs = {k: v for k, v in kwargs.items() if not isinstance(v, torch.Tensor)}

    class Call(torch.nn.Module):
        def forward(self, **ts):
            return fn(**ts, **attrs)

    torch._dynamo.reset()
    with pytest.raises(Exception) as compiled:
        torch.compile(Call(), fullgraph=True, backend="eager")(**tensors)
    assert_dynamo_reports(compiled.value, eager.value)
    # torch.export raises the original exception itself.
    with pytest.raises(expected) as exported:
        torch.export.export(Call(), (), tensors)
    assert str(exported.value) == str(eager.value)


# ---- the nn module ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, arg, err",
    [
        (dict(padding="full"), "padding", ValueError),
        (dict(data_format="NHWC"), "data_format", ValueError),
        (dict(kernel_size=(3, 3, 3)), "kernel_size", ValueError),
        (dict(kernel_size=0), "kernel_size", ValueError),
        (dict(kernel_size=2.5), "kernel_size", TypeError),
        (dict(strides=(1, 0)), "strides", ValueError),
        (dict(dilation_rate=-1), "dilation_rate", ValueError),
        (dict(depth_multiplier=0), "depth_multiplier", ValueError),
        (dict(in_channels=0), "in_channels", ValueError),
    ],
)
def test_module_constructor_errors_name_the_argument(kwargs, arg, err):
    args = dict(in_channels=4, kernel_size=3)
    args.update(kwargs)
    with pytest.raises(err, match=f"^DepthwiseConv2d: argument '{arg}' must be"):
        T.nn.DepthwiseConv2d(**args)


def test_module_input_errors_name_the_module_arguments():
    m = T.nn.DepthwiseConv2d(4, 3)  # channels_last
    with pytest.raises(
        RuntimeError, match="argument 'in_channels' is 4.*data_format 'channels_last'"
    ):
        m(torch.randn(2, 4, 9, 9 + 1))  # an NCHW tensor into an NHWC module
    with pytest.raises(RuntimeError, match="^DepthwiseConv2d: the input must be 4-D"):
        m(torch.randn(9, 9, 4))
    with pytest.raises(TypeError, match="^DepthwiseConv2d: the input's dtype torch.float64"):
        m(torch.randn(2, 9, 9, 4, dtype=torch.float64))
    with pytest.raises(RuntimeError, match="^DepthwiseConv2d: .* 'in_channels'"):
        T.nn.DepthwiseConv2d(4, 3, data_format="channels_first")(torch.randn(2, 9, 9, 4))
