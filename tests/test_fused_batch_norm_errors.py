"""FusedBatchNorm errors (docs/errors.md): the fake kernels raise what the real kernels raise
(same type, same message) for every bad input; each kind of mistake has its exception type,
eagerly and under torch.compile; the nn module names its own arguments."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import torch_tfgrads as T
from test_fused_batch_norm_tf import BAD_INPUTS, ERROR_TYPE


def z(*s, dtype=torch.float32):
    return torch.zeros(s, dtype=dtype)


def o(*s, dtype=torch.float32):
    return torch.ones(s, dtype=dtype)


D, I = torch.float64, torch.int64
# Bad inputs beyond TF's table (TF's OpDef rejects most of these dtypes before its kernel runs):
# kind, args, kwargs, the exception type.
EXTRA = {
    "fwd int64 x": ("fwd", (o(2, 2, 2, 4, dtype=I), o(4), z(4), z(0), z(0)), {}, TypeError),
    "fwd float64 x, float32 scale": (
        "fwd",
        (o(2, 2, 2, 4, dtype=D), o(4), z(4, dtype=D), z(0), z(0)),
        {},
        TypeError,
    ),
    "fwd float32 x, float64 offset": (
        "fwd",
        (o(2, 2, 2, 4), o(4), z(4, dtype=D), z(0), z(0)),
        {},
        TypeError,
    ),
    "fwd inference float64 variance": (
        "fwd",
        (o(2, 2, 2, 4), o(4), z(4), z(4), o(4, dtype=D)),
        {"is_training": False},
        TypeError,
    ),
    "fwd factor 0.5 float16 mean": (
        "fwd",
        (o(2, 2, 2, 4), o(4), z(4), z(4, dtype=torch.float16), o(4)),
        {"exponential_avg_factor": 0.5},
        TypeError,
    ),
    "fwd data_format lower case": (
        "fwd",
        (o(2, 2, 2, 4), o(4), z(4), z(0), z(0)),
        {"data_format": "nhwc"},
        ValueError,
    ),
    "fwd NCDHW 5-D scale mismatch": (
        "fwd",
        (o(1, 3, 2, 2, 2), o(4), z(4), z(0), z(0)),
        {"data_format": "NCDHW"},
        RuntimeError,
    ),
    "bwd bad data_format": (
        "bwd",
        (o(2, 2, 2, 4), o(2, 2, 2, 4), o(4), z(4), o(4), z(0)),
        {"data_format": "CHWN"},
        ValueError,
    ),
    "bwd int32 x": (
        "bwd",
        (
            o(2, 2, 2, 4, dtype=torch.int32),
            o(2, 2, 2, 4, dtype=torch.int32),
            o(4),
            z(4),
            o(4),
            z(0),
        ),
        {},
        TypeError,
    ),
    "bwd y_backprop float64, x float32": (
        "bwd",
        (o(2, 2, 2, 4, dtype=D), o(2, 2, 2, 4), o(4), z(4), o(4), z(0)),
        {},
        TypeError,
    ),
    "bwd reserve_space_2 float64": (
        "bwd",
        (o(2, 2, 2, 4), o(2, 2, 2, 4), o(4), z(4), o(4, dtype=D), z(0)),
        {},
        TypeError,
    ),
    "bwd NCHW rs1 size = last dim": (
        "bwd",
        (o(2, 3, 2, 4), o(2, 3, 2, 4), o(3), z(4), o(3), z(0)),
        {"data_format": "NCHW"},
        RuntimeError,
    ),
}

# The synchronized batch norm's local ops (no TF counterpart): each check once.
_x, _c = o(2, 2, 2, 4), o(4)
SYNC = {
    "stats bad data_format": ("stats", (_x,), {"data_format": "NWHC"}, ValueError),
    "stats int32 x": ("stats", (o(2, 2, 2, 4, dtype=torch.int32),), {}, TypeError),
    "stats 3-D x": ("stats", (o(2, 2, 4),), {}, RuntimeError),
    "grad_sums dy float64": ("gsums", (o(2, 2, 2, 4, dtype=D), _x, _c), {}, TypeError),
    "grad_sums dy shape": ("gsums", (o(2, 2, 3, 4), _x, _c), {}, RuntimeError),
    "grad_sums mean size": ("gsums", (_x, _x, o(3)), {}, RuntimeError),
    "grad_sums mean 2-D": ("gsums", (_x, _x, o(1, 4)), {}, RuntimeError),
    "grad_sums mean float64": ("gsums", (_x, _x, o(4, dtype=D)), {}, TypeError),
    "backprop_input variance size": ("bpi", (_x, _x, _c, _c, o(5), o(8), o(1)), {}, RuntimeError),
    "backprop_input scale float64": (
        "bpi",
        (_x, _x, o(4, dtype=D), _c, _c, o(8), o(1)),
        {},
        TypeError,
    ),
    "backprop_input grad_sums size": ("bpi", (_x, _x, _c, _c, _c, o(9), o(1)), {}, RuntimeError),
    "backprop_input count 0-D": ("bpi", (_x, _x, _c, _c, _c, o(8), o()), {}, RuntimeError),
    "backprop_input count float64": (
        "bpi",
        (_x, _x, _c, _c, _c, o(8), o(1, dtype=D)),
        {},
        TypeError,
    ),
    "backprop_input NCHW": (
        "bpi",
        (_x, _x, _c, _c, _c, o(8), o(1)),
        {"data_format": "NCHW"},
        RuntimeError,
    ),
}

CASES = {name: (*BAD_INPUTS[name], ERROR_TYPE.get(name, RuntimeError)) for name in BAD_INPUTS}
CASES.update(EXTRA)
CASES.update(SYNC)
OPS = {
    "fwd": T.fused_batch_norm_v3,
    "bwd": T.fused_batch_norm_grad_v3,
    "stats": T.fused_batch_norm_sync_stats,
    "gsums": T.fused_batch_norm_sync_grad_sums,
    "bpi": T.fused_batch_norm_sync_backprop_input,
}


def run(kind, args, kw, mode=None):
    """(exception or None) of the public function, on real tensors or, with mode, fake ones."""
    try:
        if mode is None:
            OPS[kind](*args, **kw)
        else:
            with mode:
                OPS[kind](*(mode.from_tensor(a) for a in args), **kw)
    except Exception as e:  # noqa: BLE001 - compared below
        return e
    return None


@pytest.mark.parametrize("name", list(CASES))
def test_fake_raises_what_the_kernel_raises(name):
    kind, args, kw, *_ = CASES[name]
    real = run(kind, args, kw)
    fake = run(kind, args, kw, FakeTensorMode())
    if real is None:  # an edge case that TF and we accept
        assert fake is None, repr(fake)
        return
    assert fake is not None, f"the fake kernel accepts what the kernel rejects: {real!r}"
    assert (type(fake), str(fake)) == (type(real), str(real))


@pytest.mark.parametrize("name", [*EXTRA, *SYNC])
def test_exception_type_of_each_extra_case(name):
    # (test_fused_batch_norm_tf.py checks the type of each case of TF's table)
    kind, args, kw, expected = {**EXTRA, **SYNC}[name]
    with pytest.raises(Exception) as info:
        OPS[kind](*args, **kw)
    assert type(info.value) is expected, repr(info.value)
    assert str(info.value).startswith(f"{OPS[kind].__name__}: argument '")


# ---- one case of each kind, eagerly and compiled ----------------------------------------------
POLICY = {
    ValueError: "fwd data_format lower case",
    TypeError: "fwd float64 x, float32 scale",
    RuntimeError: "FBN3 scale size 3 vs C 4",
}


def _compiled_error(kind, args, kw):
    torch._dynamo.reset()

    def f(*a):
        return OPS[kind](*a, **kw)[0] * 2

    with pytest.raises(Exception) as info:
        torch.compile(f, fullgraph=True, backend="eager")(*args)
    return info.value


def _chain(e):
    while e is not None:
        yield e
        e = e.__cause__ or e.__context__


@pytest.mark.parametrize("expected", list(POLICY), ids=lambda t: t.__name__)
def test_policy_eager_and_compiled(expected):
    kind, args, kw, _ = CASES[POLICY[expected]]
    with pytest.raises(Exception) as info:
        OPS[kind](*args, **kw)
    eager = info.value
    assert type(eager) is expected
    compiled = _compiled_error(kind, args, kw)
    # Dynamo runs the fake kernel while tracing and re-raises its error as a
    # torch._dynamo.exc.TorchRuntimeError; the original exception is its cause.
    originals = [e for e in _chain(compiled) if type(e) is expected]
    assert originals, repr(compiled)
    assert str(eager) in str(originals[0])


# ---- the nn module -----------------------------------------------------------------------------
def test_module_input_errors_name_the_module_arguments():
    nhwc = T.nn.FusedBatchNorm(4)
    with pytest.raises(RuntimeError, match="FusedBatchNorm: argument 'num_features' is 4") as info:
        nhwc(torch.randn(2, 4, 3, 5))  # an NCHW tensor: 5 channels last
    assert "'scale'" not in str(info.value)
    with pytest.raises(RuntimeError, match="FusedBatchNorm: argument 'data_format' is 'NHWC'"):
        nhwc(torch.randn(2, 3, 3, 3, 4))
    nchw = T.nn.FusedBatchNorm(4, data_format="NCHW")
    with pytest.raises(RuntimeError, match="FusedBatchNorm: argument 'num_features' is 4"):
        nchw(torch.randn(2, 3, 3, 4))
    with pytest.raises(TypeError, match="fused_batch_norm_v3: argument 'x' must be float16"):
        nhwc(torch.ones(2, 3, 3, 4, dtype=torch.int64))  # passes through: the op's message


@pytest.mark.parametrize(
    "kw, message",
    [
        (
            {"data_format": "HWCN"},
            "FusedBatchNorm: argument 'data_format' must be one of "
            "['NCDHW', 'NCHW', 'NDHWC', 'NHWC'], got 'HWCN'",
        ),
        ({"momentum": 1.5}, "FusedBatchNorm: argument 'momentum' must be in [0, 1], got 1.5"),
        (
            {"num_features": -1},
            "FusedBatchNorm: argument 'num_features' must be a non-negative int, got -1",
        ),
        (
            {"num_features": 2.5},
            "FusedBatchNorm: argument 'num_features' must be a non-negative int, got 2.5",
        ),
    ],
)
def test_module_constructor_errors(kw, message):
    kw = {"num_features": 4, **kw}
    with pytest.raises(ValueError) as info:
        T.nn.FusedBatchNorm(**kw)
    assert str(info.value) == message


def test_module_input_errors_compiled():
    """The module's check is Python code that Dynamo traces: without fullgraph the frame falls
    back to eager and raises the module's RuntimeError itself; with fullgraph=True Dynamo
    refuses the frame (torch._dynamo.exc.Unsupported, "Observed exception") and quotes it."""
    m = T.nn.FusedBatchNorm(4)
    x = torch.randn(2, 4, 3, 5)
    with pytest.raises(RuntimeError) as eager:
        m(x)
    torch._dynamo.reset()
    with pytest.raises(RuntimeError) as compiled:
        torch.compile(m, backend="eager")(x)
    assert type(compiled.value) is RuntimeError and str(compiled.value) == str(eager.value)
    torch._dynamo.reset()
    with pytest.raises(torch._dynamo.exc.Unsupported) as full:
        torch.compile(m, fullgraph=True, backend="eager")(x)
    assert "FusedBatchNorm: argument 'num_features' is 4" in str(full.value)
