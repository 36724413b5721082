"""FractionalPool errors (docs/errors.md): the fake kernels raise what the real kernels raise
(same type, same message) for every bad input whose fault is visible without reading tensor
values; each kind of mistake has its exception type, eagerly and under torch.compile; the nn
modules name their own arguments."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import torch_tfgrads as T
from test_fractional_pool_tf import BAD_INPUTS, error_type

OPS = torch.ops.tfgrads


def z(*s, dtype=torch.float32):
    return torch.zeros(s, dtype=dtype)


def o(*s, dtype=torch.float32):
    return torch.ones(s, dtype=dtype)


def L(*v, dtype=torch.int64):
    return torch.tensor(v, dtype=dtype)


R4 = [1.0, 1.5, 1.5, 1.0]
S024 = L(0, 2, 4)
I32 = torch.int32


def fap(value, ratio, **kw):
    return T.fractional_avg_pool, dict(value=value, pooling_ratio=ratio), kw


def fmp(value, ratio, **kw):
    return T.fractional_max_pool, dict(value=value, pooling_ratio=ratio), kw


def fapg(shape, dy, rows, cols, **kw):
    return (
        T.fractional_avg_pool_grad,
        dict(
            orig_input_tensor_shape=shape,
            out_backprop=dy,
            row_pooling_sequence=rows,
            col_pooling_sequence=cols,
        ),
        kw,
    )


def fmpg(x, y, dy, rows, cols, **kw):
    return (
        T.fractional_max_pool_grad,
        dict(
            orig_input=x,
            orig_output=y,
            out_backprop=dy,
            row_pooling_sequence=rows,
            col_pooling_sequence=cols,
        ),
        kw,
    )


def seq(n_in, n_out, **kw):
    return T.fractional_pooling_sequence, dict(input_length=n_in, output_length=n_out), kw


def avg_back(grad, rows, cols):
    return (
        OPS._fractional_avg_pool_grad_backward,
        dict(grad=grad, row_pooling_sequence=rows, col_pooling_sequence=cols),
        {},
    )


def max_back(x, y, grad, rows, cols):
    return (
        OPS._fractional_max_pool_grad_backward,
        dict(
            orig_input=x,
            orig_output=y,
            grad=grad,
            row_pooling_sequence=rows,
            col_pooling_sequence=cols,
        ),
        {},
    )


y22 = torch.tensor([[[[5.0], [7.0]], [[13.0], [15.0]]]])
ar16 = torch.arange(16.0).reshape(1, 4, 4, 1)
# Bad inputs beyond TF's table (mostly dtypes, which TF's OpDef rejects before its kernel runs,
# and the internal double-backward ops): (fn, args, kwargs), the exception type.
EXTRA = {
    "FAP bool value": (fap(o(1, 4, 4, 1, dtype=torch.bool), R4), TypeError),
    "FMP int8 value": (fmp(o(1, 4, 4, 1, dtype=torch.int8), R4), TypeError),
    "FMP 2-D value": (fmp(o(4, 4), R4), RuntimeError),
    "FAP ratio len 2": (fap(o(1, 4, 4, 1), [1.5, 1.5]), ValueError),
    "FAPG orig list of 3": (fapg([1, 4, 4], o(1, 2, 2, 1), S024, S024), ValueError),
    "FAPG orig list negative": (fapg([1, 4, -4, 1], o(1, 2, 2, 1), S024, S024), ValueError),
    "FAPG bool out_backprop": (
        fapg([1, 4, 4, 1], o(1, 2, 2, 1, dtype=torch.bool), S024, S024),
        TypeError,
    ),
    "FAPG int32 row seq": (
        fapg([1, 4, 4, 1], o(1, 2, 2, 1), L(0, 2, 4, dtype=I32), S024),
        TypeError,
    ),
    "FAPG int32 col seq, short row seq": (
        fapg([1, 4, 4, 1], o(1, 2, 2, 1), L(0, 2), L(0, 2, 4, dtype=I32)),
        TypeError,
    ),
    "FMPG float64 orig_output": (fmpg(ar16, y22.double(), o(1, 2, 2, 1), S024, S024), TypeError),
    "FMPG int32 out_backprop": (fmpg(ar16, y22, o(1, 2, 2, 1, dtype=I32), S024, S024), TypeError),
    "FMPG bool orig_input": (
        fmpg(ar16.bool(), y22.bool(), o(1, 2, 2, 1, dtype=torch.bool), S024, S024),
        TypeError,
    ),
    "FMPG int32 col seq, short row seq": (
        fmpg(ar16, y22, o(1, 2, 2, 1), L(0, 2), L(0, 2, 4, dtype=I32)),
        TypeError,
    ),
    "FMPG col seq too long": (fmpg(ar16, y22, o(1, 2, 2, 1), S024, L(0, 1, 2, 4)), RuntimeError),
    "FMPG orig_output depth 2": (
        fmpg(ar16, o(1, 2, 2, 2), o(1, 2, 2, 2), S024, S024),
        RuntimeError,
    ),
    "sequence output_length 0": (seq(5, 0), ValueError),
    "sequence output_length > input_length": (seq(5, 6), ValueError),
    "avg back grad 3-D": (avg_back(o(4, 4, 1), S024, S024), RuntimeError),
    "avg back bool grad": (avg_back(o(1, 4, 4, 1, dtype=torch.bool), S024, S024), TypeError),
    "avg back row seq of 1": (avg_back(o(1, 4, 4, 1), L(0), S024), RuntimeError),
    "avg back int32 col seq": (avg_back(o(1, 4, 4, 1), S024, L(0, 2, 4, dtype=I32)), TypeError),
    "avg back grad without rows": (avg_back(o(1, 0, 4, 1), S024, S024), RuntimeError),
    "avg back seq beyond grad": (avg_back(o(1, 4, 4, 1), L(0, 2, 5), S024), RuntimeError),
    "max back orig_output rank 3": (
        max_back(ar16, o(2, 2, 1), o(1, 4, 4, 1), S024, S024),
        RuntimeError,
    ),
    "max back grad shape": (max_back(ar16, y22, o(1, 2, 2, 1), S024, S024), RuntimeError),
    "max back grad dtype": (
        max_back(ar16, y22, o(1, 4, 4, 1, dtype=torch.float64), S024, S024),
        RuntimeError,
    ),
    "max back orig_output int32": (max_back(ar16, y22.int(), o(1, 4, 4, 1), S024, S024), TypeError),
    "max back decreasing seq": (max_back(ar16, y22, o(1, 4, 4, 1), L(0, 3, 2), S024), RuntimeError),
}

CASES = {name: (fn, args, kw, error_type(name)) for name, (_, fn, args, kw) in BAD_INPUTS.items()}
CASES.update({name: (*c, t) for name, (c, t) in EXTRA.items()})

# Rejected by the kernel for the values inside a tensor, which a fake tensor does not have:
# the fake kernel accepts these (and the real kernel rejects them when the compiled code runs).
DATA_DEPENDENT = {
    "73 FAPG negative row seq (CVE-2022-21730)": "row_pooling_sequence values are negative",
    "74 FAPG negative col seq": "col_pooling_sequence values are negative",
    "78 FAPG row seq beyond input": "row_pooling_sequence values run past the input's rows",
    "79 FAPG decreasing seq": "row_pooling_sequence values are not increasing",
    "93 FMPG orig_output inconsistent with input": "orig_output's values are not the maxima of "
    "orig_input's cells",
    "avg back seq beyond grad": "row_pooling_sequence values run past grad's rows",
    "max back decreasing seq": "row_pooling_sequence values are not increasing",
}


def fake_args(args, mode):
    """args on fake tensors. A tensor orig_input_tensor_shape is data to the op's wrapper (it
    reads the sizes with tolist), so a well-formed one goes in as the list it holds."""
    out = {}
    for k, v in args.items():
        if (
            k == "orig_input_tensor_shape"
            and isinstance(v, torch.Tensor)
            and v.dim() == 1
            and v.numel() == 4
        ):
            v = v.tolist()
        out[k] = mode.from_tensor(v) if isinstance(v, torch.Tensor) else v
    return out


def run(fn, args, kw, mode=None):
    """(exception or None) of fn, on real tensors or, with mode, on fake ones."""
    try:
        if mode is None:
            fn(**args, **kw)
        else:
            with mode:
                fn(**fake_args(args, mode), **kw)
    except Exception as e:  # noqa: BLE001 - compared below
        return e
    return None


@pytest.mark.parametrize("name", list(CASES))
def test_fake_raises_what_the_kernel_raises(name):
    fn, args, kw, _ = CASES[name]
    real = run(fn, args, kw)
    fake = run(fn, args, kw, FakeTensorMode())
    if name in DATA_DEPENDENT:
        assert type(real) is RuntimeError, repr(real)
        assert fake is None, f"listed as data-dependent but the fake kernel raises {fake!r}"
        return
    if real is None:  # an edge case that TF and we accept
        assert fake is None, repr(fake)
        return
    assert fake is not None, f"the fake kernel accepts what the kernel rejects: {real!r}"
    assert (type(fake), str(fake)) == (type(real), str(real))


@pytest.mark.parametrize("name", list(EXTRA))
def test_exception_type_of_each_extra_case(name):
    # (test_fractional_pool_tf.py checks the type of each case of TF's table)
    fn, args, kw, expected = CASES[name]
    with pytest.raises(Exception) as info:
        fn(**args, **kw)
    assert type(info.value) is expected, repr(info.value)
    op = getattr(fn, "__name__", None) or fn._opname
    assert str(info.value).startswith(f"{op}: argument '"), str(info.value)


def test_fake_checks_devices():
    """The gradients' tensors must be on one device; the fake kernel says so as the CUDA kernel
    does (this machine may have no GPU: fake CUDA tensors need none)."""
    with FakeTensorMode():
        x = torch.empty(1, 4, 4, 1, device="cuda")
        y, dy = torch.empty(1, 2, 2, 1), torch.empty(1, 2, 2, 1, device="cuda")
        rows = cols = torch.empty(3, dtype=torch.int64)
        with pytest.raises(RuntimeError) as info:
            T.fractional_max_pool_grad(x, y, dy, rows, cols)
    assert str(info.value) == (
        "fractional_max_pool_grad: argument 'orig_output' is on cpu but 'orig_input' is on "
        "cuda:0; all tensors must be on one device"
    )


# ---- one case of each kind, eagerly and compiled ----------------------------------------------
POLICY = {
    ValueError: "48 FAP ratio < 1 (CVE-2022-41900)",
    TypeError: "FAPG int32 row seq",
    RuntimeError: "45 FAP value rank 3",
    NotImplementedError: "51 FAP batch ratio 2 (CVE-2023-25801)",
}


def _chain(e):
    while e is not None:
        yield e
        e = e.__cause__ or e.__context__


def _compiled_error(fn, args, kw):
    torch._dynamo.reset()
    tensors = {k: v for k, v in args.items() if isinstance(v, torch.Tensor)}
    constants = {k: v for k, v in args.items() if k not in tensors}

    def f(**t):
        return fn(**t, **constants, **kw)

    with pytest.raises(Exception) as info:
        torch.compile(f, fullgraph=True, backend="eager")(**tensors)
    return info.value


@pytest.mark.parametrize("expected", list(POLICY), ids=lambda t: t.__name__)
def test_policy_eager_and_compiled(expected):
    fn, args, kw, _ = CASES[POLICY[expected]]
    with pytest.raises(Exception) as info:
        fn(**args, **kw)
    eager = info.value
    assert type(eager) is expected
    compiled = _compiled_error(fn, args, kw)
    # Dynamo runs the fake kernel while tracing and re-raises its error as a
    # torch._dynamo.exc.TorchRuntimeError; the original exception is in the chain.
    originals = [e for e in _chain(compiled) if type(e) is expected]
    assert originals, repr(compiled)
    assert str(eager) in str(originals[0])


def test_data_dependent_error_compiled_is_the_kernels():
    """A check on sequence values is made by the kernel when the compiled code runs: the
    kernel's own RuntimeError, unwrapped."""
    dy = torch.arange(1.0, 13.0).reshape(1, 2, 3, 2)
    rows, cols = L(-10, 1, 2, 3), L(1, 2, 3, 4)
    with pytest.raises(RuntimeError) as eager:
        T.fractional_avg_pool_grad([2, 2, 2, 2], dy, rows, cols, True)
    torch._dynamo.reset()
    f = torch.compile(
        lambda d, r, c: T.fractional_avg_pool_grad([2, 2, 2, 2], d, r, c, True),
        fullgraph=True,
        backend="eager",
    )
    with pytest.raises(RuntimeError) as compiled:
        f(dy, rows, cols)
    assert type(compiled.value) is RuntimeError and str(compiled.value) == str(eager.value)


# ---- the nn modules ----------------------------------------------------------------------------
@pytest.mark.parametrize("module", [T.nn.FractionalAvgPool2d, T.nn.FractionalMaxPool2d])
def test_module_input_errors_name_the_module_arguments(module):
    name = module.__name__
    with pytest.raises(RuntimeError) as info:
        module(1.5)(torch.randn(4, 6, 6))
    assert str(info.value).startswith(
        f"{name}: argument 'x' must be a 4-D NHWC tensor, got shape [4, 6, 6]"
    )
    # Arguments the module hands to the op unchanged: the op's message.
    with pytest.raises(NotImplementedError, match="batch nor channel"):
        module([2, 1.5, 1.5, 1])(torch.randn(4, 6, 6, 1))
    with pytest.raises(RuntimeError, match="Pooling ratio is higher than input dimension size"):
        module(3.0)(torch.randn(1, 2, 6, 1))


@pytest.mark.parametrize("module", [T.nn.FractionalAvgPool2d, T.nn.FractionalMaxPool2d])
@pytest.mark.parametrize(
    "kw, argument",
    [
        ({"pooling_ratio": [1.0, 1.5, 1.5]}, "pooling_ratio"),
        ({"pooling_ratio": 0.5}, "pooling_ratio"),
        ({"pooling_ratio": (1.5, float("nan"))}, "pooling_ratio"),
        ({"pooling_ratio": "1.5x"}, "pooling_ratio"),
        ({"pooling_ratio": 1.5, "seed": 3}, "seed"),
        ({"pooling_ratio": 1.5, "seed2": 3}, "seed"),
    ],
)
def test_module_constructor_errors(module, kw, argument):
    with pytest.raises(ValueError) as info:
        module(**kw)
    assert str(info.value).startswith(f"{module.__name__}: argument '{argument}'")
