"""DepthwiseConv2dNative family against TensorFlow 2.21 itself (Eigen kernels): randomised
configurations TF computes (NHWC, equal strides, no dilation), TF's dilation bug in the backprops,
and every case of TF 2.21's bad-input table (docs/ops/depthwise_conv2d.md) run through both TF and us."""

import re

import pytest
import torch

import torch_tfgrads as T
from helpers import rel_err
from torch_tfgrads.parity._tf import to_tf, to_torch
from torch_tfgrads.parity.depthwise_conv2d import check_case
from torch_tfgrads.parity.depthwise_conv2d_cases import Case, random_cases, reference

pytestmark = pytest.mark.needs_tf
TOL = {torch.float32: 1e-5, torch.float64: 1e-12}


@pytest.mark.parametrize(
    "case", list(random_cases(120, seed=2026, tf_only=True)), ids=lambda c: c.name
)
def test_matches_tensorflow(tf, case):
    errs = check_case(case, use_tf=True)
    assert max(errs.values()) <= TOL[case.x.dtype], errs


@pytest.mark.parametrize("padding", ["SAME", "VALID"])
def test_tf_backprops_ignore_dilations_and_ours_do_not(tf, padding):
    """TF's backprop kernels compute the undilated gradient when the shapes happen to agree (A9):
    ours equal the dilated reference, and TF's equal our undilated result."""
    g = torch.Generator().manual_seed(0)
    x, f = (
        torch.randn(2, 9, 9, 3, generator=g, dtype=torch.float64),
        torch.randn(2, 2, 3, 1, generator=g, dtype=torch.float64),
    )
    dil = [1, 2, 2, 1]
    y = T.depthwise_conv2d_native(x, f, [1, 1, 1, 1], padding, dilations=dil)
    dy = torch.randn(y.shape, generator=g, dtype=torch.float64)
    case = Case(x, f, dy, (1, 1), (2, 2), padding, ((0, 0), (0, 0)), "NHWC")
    _, dx_ref, df_ref = reference(case)
    ours_dx = T.depthwise_conv2d_native_backprop_input(
        x.shape, f, dy, [1, 1, 1, 1], padding, dilations=dil
    )
    assert rel_err(ours_dx, dx_ref) <= 1e-12
    ours_df = T.depthwise_conv2d_native_backprop_filter(
        x, f.shape, dy, [1, 1, 1, 1], padding, dilations=dil
    )
    assert rel_err(ours_df, df_ref) <= 1e-12
    try:
        tf_dx = to_torch(
            tf.raw_ops.DepthwiseConv2dNativeBackpropInput(
                input_sizes=list(x.shape),
                filter=to_tf(f),
                out_backprop=to_tf(dy),
                strides=[1, 1, 1, 1],
                padding=padding,
                dilations=dil,
            )
        )
    except Exception as e:  # noqa: BLE001 - VALID: TF's undilated shape check refuses dy
        assert padding == "VALID" and "doesn't match computed" in str(e)
        return
    assert rel_err(tf_dx, dx_ref) > 1e-2  # TF's answer is wrong ...
    undilated = T.depthwise_conv2d_native_backprop_input(x.shape, f, dy, [1, 1, 1, 1], padding)
    assert rel_err(tf_dx, undilated) <= 1e-12  # ... it is the undilated gradient


# ---- bad and edge inputs (bad_inputs_depthwise.md, in its order) ---------------------------------
def C(*shape, dtype=torch.float32, val=1.0):
    return torch.full(shape, val, dtype=dtype)


def I(*v):  # noqa: E743 - the spec's name for an int32 sizes tensor
    return torch.tensor(v, dtype=torch.int32)


S1 = dict(strides=[1, 1, 1, 1], padding="VALID")


def F(**kw):
    return ("DepthwiseConv2dNative", T.depthwise_conv2d_native, kw)


def BI(**kw):
    return ("DepthwiseConv2dNativeBackpropInput", T.depthwise_conv2d_native_backprop_input, kw)


def BF(**kw):
    return ("DepthwiseConv2dNativeBackpropFilter", T.depthwise_conv2d_native_backprop_filter, kw)


H13 = torch.full((13,), 1879048192, dtype=torch.int32)
BAD_INPUTS = {
    "1 fwd: input rank 3": F(input=C(4, 4, 3), filter=C(2, 2, 3, 1), **S1),
    "2 fwd: input rank 1": F(input=C(48), filter=C(2, 2, 3, 1), **S1),
    "3 fwd: filter rank 3": F(input=C(1, 4, 4, 3), filter=C(2, 2, 3), **S1),
    "4 fwd: in_depth mismatch": F(input=C(1, 4, 4, 3), filter=C(2, 2, 2, 1), **S1),
    "5 fwd: strides len 3": F(
        input=C(1, 4, 4, 3), filter=C(2, 2, 3, 1), strides=[1, 1, 1], padding="VALID"
    ),
    "6 fwd: stride in batch dim": F(
        input=C(1, 4, 4, 3), filter=C(2, 2, 3, 1), strides=[2, 1, 1, 1], padding="VALID"
    ),
    "7 fwd: stride in depth dim": F(
        input=C(1, 4, 4, 3), filter=C(2, 2, 3, 1), strides=[1, 1, 1, 2], padding="VALID"
    ),
    "8 fwd: unequal strides": F(
        input=C(1, 4, 4, 3), filter=C(2, 2, 3, 1), strides=[1, 1, 2, 1], padding="VALID"
    ),
    "9 fwd: zero stride": F(
        input=C(1, 4, 4, 3), filter=C(2, 2, 3, 1), strides=[1, 0, 0, 1], padding="VALID"
    ),
    "10 fwd: negative stride": F(
        input=C(1, 4, 4, 3), filter=C(2, 2, 3, 1), strides=[1, -1, -1, 1], padding="VALID"
    ),
    "11 fwd: dilations len 3": F(
        input=C(1, 4, 4, 3), filter=C(2, 2, 3, 1), dilations=[1, 1, 1], **S1
    ),
    "12 fwd: dilation 0": F(
        input=C(1, 4, 4, 3), filter=C(2, 2, 3, 1), dilations=[1, 0, 0, 1], **S1
    ),
    "13 fwd: dilation in batch dim": F(
        input=C(1, 4, 4, 3), filter=C(2, 2, 3, 1), dilations=[2, 1, 1, 1], **S1
    ),
    "14 fwd: dilation 2 (NHWC)": F(
        input=C(1, 6, 6, 3), filter=C(2, 2, 3, 1), dilations=[1, 2, 2, 1], **S1
    ),
    "15 fwd: EXPLICIT with 4 paddings": F(
        input=C(1, 4, 4, 3),
        filter=C(2, 2, 3, 1),
        strides=[1, 1, 1, 1],
        padding="EXPLICIT",
        explicit_paddings=[0, 0, 1, 1],
    ),
    "16 fwd: EXPLICIT batch padding": F(
        input=C(1, 4, 4, 3),
        filter=C(2, 2, 3, 1),
        strides=[1, 1, 1, 1],
        padding="EXPLICIT",
        explicit_paddings=[1, 0, 0, 0, 0, 0, 0, 0],
    ),
    "17 fwd: EXPLICIT negative padding": F(
        input=C(1, 4, 4, 3),
        filter=C(2, 2, 3, 1),
        strides=[1, 1, 1, 1],
        padding="EXPLICIT",
        explicit_paddings=[0, 0, -1, 0, 0, 0, 0, 0],
    ),
    "18 fwd: SAME with explicit_paddings": F(
        input=C(1, 4, 4, 3),
        filter=C(2, 2, 3, 1),
        strides=[1, 1, 1, 1],
        padding="SAME",
        explicit_paddings=[0, 0, 1, 1, 1, 1, 0, 0],
    ),
    "19 fwd: filter bigger than input VALID": F(input=C(1, 2, 2, 3), filter=C(3, 3, 3, 1), **S1),
    "20 fwd: filter bigger than input SAME": F(
        input=C(1, 2, 2, 3), filter=C(3, 3, 3, 1), strides=[1, 1, 1, 1], padding="SAME"
    ),
    "21 fwd: empty filter (mult=0)": F(input=C(1, 4, 4, 3), filter=C(2, 2, 3, 0), **S1),
    "22 fwd: empty filter (fh=0)": F(input=C(1, 4, 4, 3), filter=C(0, 2, 3, 1), **S1),
    "23 fwd: empty input batch=0": F(input=C(0, 4, 4, 3), filter=C(2, 2, 3, 1), **S1),
    "24 fwd: empty input C=0": F(input=C(1, 4, 4, 0), filter=C(2, 2, 0, 2), **S1),
    "25 fwd: bad data_format": F(
        input=C(1, 4, 4, 3), filter=C(2, 2, 3, 1), data_format="NCDHW", **S1
    ),
    "26 fwd: dtype mismatch": F(
        input=C(1, 4, 4, 3), filter=C(2, 2, 3, 1, dtype=torch.float64), **S1
    ),
    "27 fwd: bfloat16": F(
        input=C(1, 4, 4, 3, dtype=torch.bfloat16), filter=C(2, 2, 3, 1, dtype=torch.bfloat16), **S1
    ),
    "28 fwd: float16": F(
        input=C(1, 4, 4, 3, dtype=torch.float16), filter=C(2, 2, 3, 1, dtype=torch.float16), **S1
    ),
    "29 fwd: float64": F(
        input=C(1, 4, 4, 3, dtype=torch.float64), filter=C(2, 2, 3, 1, dtype=torch.float64), **S1
    ),
    "30 bi: ok baseline": BI(
        input_sizes=I(1, 4, 4, 3), filter=C(2, 2, 3, 2), out_backprop=C(1, 3, 3, 6), **S1
    ),
    "31 bi: input_sizes len 2 (H,W only)": BI(
        input_sizes=I(4, 4), filter=C(2, 2, 3, 2), out_backprop=C(1, 3, 3, 6), **S1
    ),
    "32 bi: input_sizes rank 2": BI(
        input_sizes=I(1, 4, 4, 3).reshape(1, 4),
        filter=C(2, 2, 3, 2),
        out_backprop=C(1, 3, 3, 6),
        **S1,
    ),
    "33 bi: input_sizes negative": BI(
        input_sizes=I(1, -4, 4, 3), filter=C(2, 2, 3, 2), out_backprop=C(1, 3, 3, 6), **S1
    ),
    "34 bi: input_sizes len 13 huge (TFSA-2022-071 style)": BI(
        input_sizes=H13,
        filter=C(1, 1, 48, 2, val=0.18),
        out_backprop=C(1, 1, 48, 2, val=0.18),
        strides=[1, 1, 1, 1],
        padding="SAME",
    ),
    "35 bi: input_sizes overflow 4 huge": BI(
        input_sizes=I(1879048192, 1879048192, 1879048192, 3),
        filter=C(2, 2, 3, 2),
        out_backprop=C(1, 3, 3, 6),
        **S1,
    ),
    "36 bi: filter rank 1 + strides len 2 (issue #104881)": BI(
        input_sizes=I(1, 2, 2, 1), filter=C(1), out_backprop=C(1), strides=[1, 1], padding="SAME"
    ),
    "37 bi: filter rank 1 (strides ok)": BI(
        input_sizes=I(1, 2, 2, 1),
        filter=C(1),
        out_backprop=C(1, 2, 2, 1),
        strides=[1, 1, 1, 1],
        padding="SAME",
    ),
    "38 bi: out_backprop rank 3": BI(
        input_sizes=I(1, 4, 4, 3), filter=C(2, 2, 3, 2), out_backprop=C(3, 3, 6), **S1
    ),
    "39 bi: batch mismatch": BI(
        input_sizes=I(2, 4, 4, 3), filter=C(2, 2, 3, 2), out_backprop=C(1, 3, 3, 6), **S1
    ),
    "40 bi: rows mismatch": BI(
        input_sizes=I(1, 4, 4, 3), filter=C(2, 2, 3, 2), out_backprop=C(1, 2, 3, 6), **S1
    ),
    "41 bi: cols mismatch": BI(
        input_sizes=I(1, 4, 4, 3), filter=C(2, 2, 3, 2), out_backprop=C(1, 3, 2, 6), **S1
    ),
    "42 bi: out depth != C*M": BI(
        input_sizes=I(1, 4, 4, 3), filter=C(2, 2, 3, 2), out_backprop=C(1, 3, 3, 5), **S1
    ),
    "43 bi: in_depth mismatch": BI(
        input_sizes=I(1, 4, 4, 4), filter=C(2, 2, 3, 2), out_backprop=C(1, 3, 3, 6), **S1
    ),
    "44 bi: empty out_backprop (batch 0)": BI(
        input_sizes=I(0, 4, 4, 3), filter=C(2, 2, 3, 2), out_backprop=C(0, 3, 3, 6), **S1
    ),
    "45 bi: empty filter": BI(
        input_sizes=I(1, 4, 4, 3), filter=C(2, 2, 3, 0), out_backprop=C(1, 3, 3, 0), **S1
    ),
    "46 bi: issue #60201 strides 0, dil len5, bf16": BI(
        strides=[1, 0, 1, 1],
        padding="VALID",
        dilations=[1, 0, 77, 1, 64],
        input_sizes=I(5, -3, 7),
        filter=C(16, 3, 3, 5, dtype=torch.bfloat16),
        out_backprop=C(1, 0, 0, 1, dtype=torch.bfloat16),
    ),
    "47 bi: zero stride": BI(
        input_sizes=I(1, 4, 4, 3),
        filter=C(2, 2, 3, 2),
        out_backprop=C(1, 3, 3, 6),
        strides=[1, 0, 0, 1],
        padding="VALID",
    ),
    "48 bi: bfloat16": BI(
        input_sizes=I(1, 4, 4, 3),
        filter=C(2, 2, 3, 2, dtype=torch.bfloat16),
        out_backprop=C(1, 3, 3, 6, dtype=torch.bfloat16),
        **S1,
    ),
    "49 bf: ok baseline": BF(
        input=C(1, 4, 4, 3), filter_sizes=I(2, 2, 3, 2), out_backprop=C(1, 3, 3, 6), **S1
    ),
    "50 bf: TFSA-2022-071 PoC (filter_sizes len 13 huge)": BF(
        input=C(1, 4, 4, 3),
        filter_sizes=H13,
        out_backprop=C(1, 4, 4, 3),
        strides=[1, 1, 1, 1],
        padding="SAME",
    ),
    "51 bf: filter_sizes len 3": BF(
        input=C(1, 4, 4, 3), filter_sizes=I(2, 2, 3), out_backprop=C(1, 3, 3, 6), **S1
    ),
    "52 bf: filter_sizes rank 2": BF(
        input=C(1, 4, 4, 3),
        filter_sizes=I(2, 2, 3, 2).reshape(1, 4),
        out_backprop=C(1, 3, 3, 6),
        **S1,
    ),
    "53 bf: filter_sizes negative": BF(
        input=C(1, 4, 4, 3), filter_sizes=I(2, -2, 3, 2), out_backprop=C(1, 3, 3, 6), **S1
    ),
    "54 bf: filter_sizes huge (overflow)": BF(
        input=C(1, 4, 4, 3),
        filter_sizes=I(1879048192, 1879048192, 3, 2),
        out_backprop=C(1, 3, 3, 6),
        **S1,
    ),
    "55 bf: input rank 3": BF(
        input=C(4, 4, 3), filter_sizes=I(2, 2, 3, 2), out_backprop=C(1, 3, 3, 6), **S1
    ),
    "56 bf: out_backprop rank 3": BF(
        input=C(1, 4, 4, 3), filter_sizes=I(2, 2, 3, 2), out_backprop=C(3, 3, 6), **S1
    ),
    "57 bf: rows mismatch": BF(
        input=C(1, 4, 4, 3), filter_sizes=I(2, 2, 3, 2), out_backprop=C(1, 2, 3, 6), **S1
    ),
    "58 bf: out depth != C*M": BF(
        input=C(1, 4, 4, 3), filter_sizes=I(2, 2, 3, 2), out_backprop=C(1, 3, 3, 5), **S1
    ),
    "59 bf: in_depth mismatch": BF(
        input=C(1, 4, 4, 3), filter_sizes=I(2, 2, 4, 2), out_backprop=C(1, 3, 3, 8), **S1
    ),
    "60 bf: empty out_backprop, nonempty filter (PR #126484)": BF(
        input=C(0, 4, 4, 3), filter_sizes=I(2, 2, 3, 2), out_backprop=C(0, 3, 3, 6), **S1
    ),
    "61 bf: issue #58180 (scalar input, NCHW, big strides, dil len 3)": BF(
        input=C(),
        filter_sizes=torch.zeros(0, dtype=torch.int32),
        out_backprop=C(1, 1, 1, 1),
        strides=[1, 1, 128, 128],
        padding="VALID",
        data_format="NCHW",
        dilations=[96, 25, 10],
    ),
    "62 bf: bfloat16": BF(
        input=C(1, 4, 4, 3, dtype=torch.bfloat16),
        filter_sizes=I(2, 2, 3, 2),
        out_backprop=C(1, 3, 3, 6, dtype=torch.bfloat16),
        **S1,
    ),
}

# Deliberate departures (README): name -> the argument our error names, "ok" where we compute
# what TF's Eigen kernel refuses (checked against the float64 reference), or "zeros" where TF
# returns uninitialised memory.
DIFFERENT = {
    "8 fwd: unequal strides": "ok",
    "14 fwd: dilation 2 (NHWC)": "ok",
    "11 fwd: dilations len 3": "dilations",  # TF eager accepts [1,1,1]; its graph mode does not
    "12 fwd: dilation 0": "dilations",
    "13 fwd: dilation in batch dim": "dilations",
    "26 fwd: dtype mismatch": "filter",
    "45 bi: empty filter": "zeros",
    "46 bi: issue #60201 strides 0, dil len5, bf16": "dilations",
    "60 bf: empty out_backprop, nonempty filter (PR #126484)": "zeros",
    "61 bf: issue #58180 (scalar input, NCHW, big strides, dil len 3)": "dilations",
}


# The exception type docs/errors.md gives each case we reject (by its number): ValueError for a bad
# attribute or sizes list, TypeError for dtypes, RuntimeError for shapes that do not fit.
_ERROR_NUMBERS = {
    ValueError: (
        5,
        6,
        7,
        9,
        10,
        11,
        12,
        13,
        15,
        16,
        17,
        18,
        25,
        31,
        32,
        33,
        34,
        35,
        36,
        46,
        47,
        50,
        51,
        52,
        53,
        54,
        61,
    ),
    TypeError: (26,),
    RuntimeError: (1, 2, 3, 4, 37, 38, 39, 40, 41, 42, 43, 55, 56, 57, 58, 59),
}
EXPECTED_ERROR = {
    name: err
    for err, numbers in _ERROR_NUMBERS.items()
    for name in BAD_INPUTS
    if int(name.split()[0]) in numbers
}


def tf_message(e):
    msg = getattr(e, "message", str(e))
    msg = re.sub(r"^\{\{function_node [^}]*\}\}\s*", "", msg)
    return re.split(r"; NodeDef|\s\[Op:|\n", msg)[0].strip()


def run_tf(tf, tf_op, args):
    kw = {}
    for k, v in args.items():
        if k in ("input_sizes", "filter_sizes"):
            kw[k] = tf.constant(v.numpy(), tf.int32)
        elif isinstance(v, torch.Tensor):
            kw[k] = to_tf(v)
        else:
            kw[k] = v
    return to_torch(getattr(tf.raw_ops, tf_op)(**kw))


def reference_of(args):
    s, d = args["strides"], args.get("dilations", [1, 1, 1, 1])
    x, f = args["input"].double(), args["filter"].double()
    case = Case(
        x, f, torch.zeros(0), (s[1], s[2]), (d[1], d[2]), args["padding"], ((0, 0), (0, 0)), "NHWC"
    )
    y = T.depthwise_conv2d_native(x, f, s, args["padding"], dilations=d)
    case.dy = torch.zeros_like(y)
    return reference(case)[0]


def test_every_case_of_the_spec_table_is_here():
    assert len(BAD_INPUTS) == 62
    assert [int(k.split()[0]) for k in BAD_INPUTS] == list(range(1, 63))


@pytest.mark.parametrize("name", list(BAD_INPUTS))
def test_bad_and_edge_inputs_like_tensorflow(tf, name):
    tf_op, ours_fn, args = BAD_INPUTS[name]
    expect = DIFFERENT.get(name)
    tf_error = theirs = None
    try:
        theirs = run_tf(tf, tf_op, args)
    except Exception as e:  # noqa: BLE001 - any TF error class
        tf_error = tf_message(e)
    if (tf_error is not None and expect is None) or expect not in (None, "ok", "zeros"):
        with pytest.raises(Exception) as info:
            ours_fn(**args)
        assert type(info.value) is EXPECTED_ERROR[name], repr(info.value)
        ours_msg = str(info.value)
        assert "argument '" in ours_msg
        if expect is None:
            assert tf_error in ours_msg, (tf_error, ours_msg)
        else:
            assert f"argument '{expect}'" in ours_msg, ours_msg
        return
    assert name not in EXPECTED_ERROR
    ours = ours_fn(**args)
    if expect == "zeros":  # TF: uninitialised memory of the right shape
        assert theirs is not None and ours.shape == theirs.shape and not ours.any()
    elif expect == "ok":  # TF's Eigen kernel refuses; the reference decides
        assert tf_error is not None
        assert rel_err(ours, reference_of(args)) <= 1e-6
    else:  # TF succeeded: same shape and values
        assert ours.shape == theirs.shape and ours.dtype == theirs.dtype
        assert rel_err(ours, theirs) == 0
