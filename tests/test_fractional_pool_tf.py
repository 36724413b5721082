"""FractionalPool family against TensorFlow 2.21 itself: hundreds of randomised cases (sequences,
outputs and gradients bit-exact), and every fractional-pool bad input of
TF 2.21's bad-input table (docs/ops/fractional_pool.md) run through both TF and us."""

import re

import pytest
import torch

import torch_tfgrads as T
from torch_tfgrads.parity._tf import to_tf
from torch_tfgrads.parity.fractional_pool import check_case
from torch_tfgrads.parity.fractional_pool_cases import random_cases

pytestmark = pytest.mark.needs_tf


@pytest.mark.parametrize("case", list(random_cases(240, seed=2024)), ids=lambda c: c.name)
def test_bit_exact_with_tensorflow(tf, case):
    errs = check_case(case, dy_seed=len(case.name))
    assert errs == {k: 0.0 for k in errs}, errs


def test_random_cases_are_varied():
    cases = list(random_cases(240, seed=2024))
    kinds = {(c.kind, c.x.dtype) for c in cases}
    assert len(kinds) == 8  # both ops x TF's four dtypes
    assert {(c.pseudo_random, c.overlapping) for c in cases} == {
        (a, b) for a in (0, 1) for b in (0, 1)
    }
    assert any(c.seed < 0 for c in cases) and any(c.x.shape[3] >= 8 for c in cases)


# ---- bad and edge inputs -------------------------------------------------------------------------
def z(*s, dtype=torch.float32):
    return torch.zeros(s, dtype=dtype)


def o(*s, dtype=torch.float32):
    return torch.ones(s, dtype=dtype)


def L(*v):
    return torch.tensor(v, dtype=torch.int64)


def fap(value, ratio, **kw):
    return ("FractionalAvgPool", T.fractional_avg_pool, dict(value=value, pooling_ratio=ratio), kw)


def fmp(value, ratio, **kw):
    return ("FractionalMaxPool", T.fractional_max_pool, dict(value=value, pooling_ratio=ratio), kw)


def fapg(shape, dy, rows, cols, **kw):
    return (
        "FractionalAvgPoolGrad",
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
        "FractionalMaxPoolGrad",
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


R4 = [1.0, 1.5, 1.5, 1.0]
S024 = L(0, 2, 4)
ar16 = torch.arange(16.0).reshape(1, 4, 4, 1)
y5_15 = torch.tensor([[[[5.0], [7.0]], [[13.0], [15.0]]]])
BAD_INPUTS = {
    "45 FAP value rank 3": fap(z(4, 4, 1), R4),
    "46 FAP pooling_ratio len 3": fap(z(1, 4, 4, 1), [1.0, 1.5, 1.5]),
    "47 FAP pooling_ratio len 5": fap(z(1, 4, 4, 1), [1.0, 1.5, 1.5, 1.0, 1.0]),
    "48 FAP ratio < 1 (CVE-2022-41900)": fap(z(1, 4, 4, 1), [1.0, 0.5, 1.5, 1.0]),
    "49 FAP ratio NaN": fap(z(1, 4, 4, 1), [1.0, float("nan"), 1.5, 1.0]),
    "50 FAP ratio inf": fap(z(1, 4, 4, 1), [1.0, float("inf"), 1.5, 1.0]),
    "51 FAP batch ratio 2 (CVE-2023-25801)": fap(z(4, 4, 4, 1), [2.0, 1.5, 1.5, 1.0]),
    "52 FAP channel ratio 1.5": fap(z(1, 4, 4, 4), [1.0, 1.5, 1.5, 1.5]),
    "53 FAP ratio > dim (CVE-2021-29550)": fap(
        torch.tensor([60], dtype=torch.int32).reshape(1, 1, 1, 1),
        [1.0, 1.0000014345305555, 1.0, 1.0],
    ),
    "54 FAP empty batch": fap(z(0, 4, 4, 1), R4),
    "55 FAP seed without deterministic": fap(z(1, 4, 4, 1), R4, seed=1, seed2=0),
    "56 FAP float16 value": fap(z(1, 4, 4, 1, dtype=torch.float16), R4),
    "57 FAP ratio exactly dim (out=1)": fap(
        torch.arange(20.0).reshape(1, 4, 5, 1),
        [1.0, 4.0, 5.0, 1.0],
        deterministic=True,
        seed=1,
        seed2=1,
    ),
    "58 FAP int32 negative truncation": fap(
        torch.tensor([[[[-7], [0]], [[0], [0]]]], dtype=torch.int32),
        [1.0, 2.0, 2.0, 1.0],
        deterministic=True,
        seed=1,
        seed2=1,
    ),
    "59 FMP CVE-2022-21735": fmp(
        torch.tensor([[[[1, 4, 2, 3]]]], dtype=torch.int64), [1.0, 1.44, 1.73, 1.0]
    ),
    "60 FMP channel ratio 2": fmp(z(1, 4, 4, 4), [1.0, 1.5, 1.5, 2.0]),
    "61 FMP ratio < 1": fmp(z(1, 4, 4, 1), [1.0, 1.5, 0.9, 1.0]),
    "62 FMP seed without deterministic": fmp(z(1, 4, 4, 1), R4, seed=0, seed2=5),
    "63 FAPG orig shape 3 elems": fapg(L(1, 4, 4), o(1, 2, 2, 1), S024, S024),
    "64 FAPG orig shape 2-D": fapg(L(1, 4, 4, 1).reshape(1, 4), o(1, 2, 2, 1), S024, S024),
    "65 FAPG out_backprop rank 3": fapg(L(1, 4, 4, 1), o(2, 2, 1), S024, S024),
    "66 FAPG out_backprop zero dim": fapg(L(1, 4, 4, 1), o(1, 2, 0, 1), S024, S024),
    "67 FAPG row seq too short": fapg(L(1, 4, 4, 1), o(1, 2, 2, 1), L(0, 2), S024),
    "68 FAPG col seq too short": fapg(L(1, 4, 4, 1), o(1, 2, 2, 1), S024, L(0)),
    "69 FAPG orig batch 0": fapg(L(0, 4, 4, 1), o(1, 2, 2, 1), S024, S024),
    "70 FAPG orig depth 0": fapg(L(1, 4, 4, 0), o(1, 2, 2, 1), S024, S024),
    "71 FAPG orig negative dim": fapg(L(1, -4, 4, 1), o(1, 2, 2, 1), S024, S024),
    "72 FAPG orig overflow dims": fapg(L(2**40, 2**40, 1, 1), o(1, 2, 2, 1), S024, S024),
    "73 FAPG negative row seq (CVE-2022-21730)": fapg(
        L(2, 2, 2, 2),
        torch.arange(1.0, 13.0).reshape(1, 2, 3, 2),
        L(-10, 1, 2, 3),
        L(1, 2, 3, 4),
        overlapping=True,
    ),
    "74 FAPG negative col seq": fapg(
        L(2, 2, 2, 2),
        torch.arange(1.0, 13.0).reshape(1, 2, 3, 2),
        L(10, 1, 2, 3),
        L(1, 2, -3, 4),
        overlapping=True,
    ),
    "75 FAPG CVE-2021-29578": fapg(
        L(1, 3, 2, 3), torch.tensor([2]).reshape(1, 1, 1, 1), L(1), L(1)
    ),
    "76 FAPG CVE-2021-37651": fapg(
        L(0, 1, 2, 3),
        torch.full((1, 2, 2, 1), 541),
        L(0, 0, 0, 0, 0),
        L(-2, 0, 0, 2, 0),
        overlapping=True,
    ),
    "77 FAPG CVE-2022-35963": fapg(
        torch.full((4,), -1879048192, dtype=torch.int64),
        z(0, 0, 0, 0, dtype=torch.float64),
        L(1, 1, 1, 1),
        L(1, 1, 1, 1),
        overlapping=True,
    ),
    "78 FAPG row seq beyond input": fapg(L(1, 4, 4, 1), o(1, 2, 2, 1), L(0, 9, 12), S024),
    "79 FAPG decreasing seq": fapg(L(1, 4, 4, 1), o(1, 2, 2, 1), L(3, 1, 0), S024),
    "80 FAPG out_backprop batch > orig batch": fapg(L(1, 4, 4, 1), o(64, 2, 2, 1), S024, S024),
    "81 FAPG out_backprop depth > orig depth": fapg(L(1, 4, 4, 1), o(1, 2, 2, 64), S024, S024),
    "82 FAPG out_backprop rows fewer than seq": fapg(L(1, 4, 4, 1), o(1, 1, 2, 1), S024, S024),
    "83 FAPG seq as 2-D tensor": fapg(
        L(1, 4, 4, 1), o(1, 2, 2, 1), S024.reshape(1, 3), S024.reshape(3, 1)
    ),
    "84 FMPG orig_input rank 3": fmpg(o(4, 4, 1), o(1, 2, 2, 1), o(1, 2, 2, 1), S024, S024),
    "85 FMPG orig_input empty": fmpg(o(0, 4, 4, 1), o(1, 2, 2, 1), o(1, 2, 2, 1), S024, S024),
    "86 FMPG orig_output rank 2": fmpg(o(1, 4, 4, 1), o(2, 2), o(1, 2, 2, 1), S024, S024),
    "87 FMPG orig_output empty": fmpg(o(1, 4, 4, 1), o(1, 0, 2, 1), o(1, 2, 2, 1), S024, S024),
    "88 FMPG seq too long (region > input)": fmpg(
        o(1, 4, 4, 1), o(1, 2, 2, 1), o(1, 2, 2, 1), torch.arange(6), torch.arange(6)
    ),
    "89 FMPG row seq not vector": fmpg(
        o(1, 4, 4, 1), o(1, 2, 2, 1), o(1, 2, 2, 1), S024.reshape(1, 3), S024
    ),
    "90 FMPG CVE-2021-29580 PoC1": fmpg(
        torch.tensor([2, 3]).reshape(1, 1, 1, 2),
        torch.tensor([], dtype=torch.int64),
        torch.zeros(2, 3, 6, 6, dtype=torch.int64),
        L(0),
        L(0),
    ),
    "91 FMPG CVE-2021-29580 PoC2": fmpg(L(1), L(1), L(1, 1).reshape(2, 1, 1, 1), L(1), L(1)),
    "92 FMPG CVE-2022-35981": fmpg(
        torch.full((1, 7, 13, 1), 0.453409232),
        torch.full((1, 7, 13, 1), 0.453409232),
        torch.full((1, 7, 13, 1), 0.453409232),
        torch.zeros(5, dtype=torch.int64),
        torch.zeros(5, dtype=torch.int64),
        overlapping=True,
    ),
    "93 FMPG orig_output inconsistent with input": fmpg(
        o(1, 4, 4, 1), z(1, 2, 2, 1), o(1, 2, 2, 1), S024, S024
    ),
    "94 FMPG out_backprop smaller than orig_output": fmpg(ar16, y5_15, o(1, 1, 1, 1), S024, S024),
    "95 FMPG out_backprop larger than orig_output": fmpg(ar16, y5_15, o(1, 40, 40, 1), S024, S024),
    "96 FMPG seq shorter than orig_output rows": fmpg(ar16, y5_15, o(1, 2, 2, 1), L(0, 2), S024),
    "97 FMPG seq longer than orig_output": fmpg(
        torch.arange(64.0).reshape(1, 8, 8, 1),
        torch.tensor([[[[63.0]]]]),
        o(1, 1, 1, 1),
        torch.arange(8),
        torch.arange(8),
    ),
    "98 FMPG orig_output batch smaller than orig_input": fmpg(
        torch.arange(64.0).reshape(4, 4, 4, 1), y5_15, o(1, 2, 2, 1), S024, S024
    ),
}

# TF aborts (heap corruption) or reads out of bounds on these: never run them in TF.
CRASH_TF = {
    "80 FAPG out_backprop batch > orig batch",
    "81 FAPG out_backprop depth > orig depth",
    "95 FMPG out_backprop larger than orig_output",
    "97 FMPG seq longer than orig_output",
    "98 FMPG orig_output batch smaller than orig_input",
}
# Deliberate departures (README): name -> the argument our error names, or "tf-dtype" where we
# accept what TF refuses. Float16 is our extension; TF's "Pooling region" check is replaced by
# exact sequence checks; out-of-range / non-increasing sequences and mismatched shapes, which TF
# silently accepts, are errors; TF's DebugString details are not reproduced (prefix compared).
DIFFERENT = {
    "56 FAP float16 value": "ok",
    "64 FAPG orig shape 2-D": "orig_input_tensor_shape",
    "78 FAPG row seq beyond input": "row_pooling_sequence",
    "82 FAPG out_backprop rows fewer than seq": "ok",
    "88 FMPG seq too long (region > input)": "row_pooling_sequence",
    "94 FMPG out_backprop smaller than orig_output": "out_backprop",
    "96 FMPG seq shorter than orig_output rows": "row_pooling_sequence",
    "92 FMPG CVE-2022-35981": "row_pooling_sequence",
    "80 FAPG out_backprop batch > orig batch": "out_backprop",
    "81 FAPG out_backprop depth > orig depth": "out_backprop",
    "95 FMPG out_backprop larger than orig_output": "out_backprop",
    "97 FMPG seq longer than orig_output": "row_pooling_sequence",
    "98 FMPG orig_output batch smaller than orig_input": "orig_output",
}

# The exception type of each rejected case (docs/errors.md): a bad attribute or a bad
# orig_input_tensor_shape list is a ValueError, pooling over batch/channels is
# NotImplementedError (TF: Unimplemented), every other rejection a RuntimeError (shapes that do
# not fit, the input too small for the ratio, invalid sequence contents).
VALUE_ERRORS = {"46", "47", "48", "49", "55", "61", "62", "63", "64", "69", "70", "71", "72", "76"}
NOT_IMPLEMENTED = {"51", "52", "60"}


def error_type(name):
    number = name.split()[0]
    if number in VALUE_ERRORS:
        return ValueError
    return NotImplementedError if number in NOT_IMPLEMENTED else RuntimeError


def tf_message(e):
    msg = getattr(e, "message", str(e))
    msg = re.sub(r"^\{\{function_node [^}]*\}\}\s*", "", msg)
    msg = re.split(r"; NodeDef|\s\[Op:", msg)[0].strip()
    return msg.split("Tensor<")[0].strip()  # TF's DebugString values are not reproduced


def run_tf(tf, tf_op, args, kw):
    tf_kw = {k: (to_tf(v) if isinstance(v, torch.Tensor) else v) for k, v in args.items()}
    if tf_op in ("FractionalAvgPool", "FractionalMaxPool"):
        tf_kw["deterministic"] = kw.get("deterministic", False)
    for k in ("seed", "seed2", "overlapping"):
        if k in kw:
            tf_kw[k] = kw[k]
    return getattr(tf.raw_ops, tf_op)(**tf_kw)


@pytest.mark.parametrize("name", list(BAD_INPUTS))
def test_bad_and_edge_inputs_like_tensorflow(tf, name):
    tf_op, ours_fn, args, kw = BAD_INPUTS[name]
    expect = DIFFERENT.get(name)
    tf_error = theirs = None
    if name not in CRASH_TF:
        try:
            theirs = run_tf(tf, tf_op, args, kw)
        except Exception as e:  # noqa: BLE001 - any TF error class
            tf_error = tf_message(e)
    should_fail = (tf_error is not None and expect != "ok") or (expect not in (None, "ok"))
    if should_fail:
        with pytest.raises(Exception) as info:
            ours_fn(**args, **kw)
        assert type(info.value) is error_type(name), repr(info.value)
        ours_msg = str(info.value)
        assert "argument '" in ours_msg
        if expect is None:
            assert tf_error in ours_msg, (tf_error, ours_msg)
        else:
            assert f"argument '{expect}'" in ours_msg, ours_msg
        return
    ours = ours_fn(**args, **kw)
    if tf_error is None:  # TF succeeded: same values
        theirs = theirs if isinstance(theirs, (list, tuple)) else [theirs]
        ours = ours if isinstance(ours, (list, tuple)) else [ours]
        for a, b in zip(ours, theirs):
            assert a.tolist() == b.numpy().tolist()


def test_float16_is_an_extension_tf_rejects(tf):
    x = torch.randn(1, 6, 6, 2)
    with pytest.raises(Exception, match="half"):
        run_tf(tf, "FractionalAvgPool", dict(value=x.half(), pooling_ratio=R4), {})
    out = T.fractional_avg_pool(x.half(), R4, False, False, True, 1, 1)[0]
    ref = T.fractional_avg_pool(x.half().float(), R4, False, False, True, 1, 1)[0]
    torch.testing.assert_close(out.float(), ref, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("overlapping", [False, True])
@pytest.mark.parametrize("C", [5, 16])  # scalar channels only; whole vectors
def test_grads_negative_zero_like_tensorflow(tf, overlapping, C):
    """TF zero-fills the gradients, then adds dy (max: at each argmax; avg: dy / n over the
    cell): a -0.0 in dy lands as +0.0. Compared bit for bit (sign of zero included) with TF."""
    g = torch.Generator().manual_seed(C + overlapping)
    x = torch.randint(-3, 4, (2, 9, 11, C), generator=g).float()
    y, rows, cols = T.fractional_max_pool(x, [1, 1.44, 1.6, 1], False, overlapping, True, 3, 4)
    dy = torch.randint(-2, 3, y.shape, generator=g).float()
    dy[torch.rand(y.shape, generator=g) < 0.5] = -0.0
    ours = T.fractional_max_pool_grad(x, y, dy, rows, cols, overlapping)
    theirs = torch.from_numpy(
        tf.raw_ops.FractionalMaxPoolGrad(
            orig_input=x.numpy(),
            orig_output=y.numpy(),
            out_backprop=dy.numpy(),
            row_pooling_sequence=rows.numpy(),
            col_pooling_sequence=cols.numpy(),
            overlapping=overlapping,
        ).numpy()
    )
    assert torch.equal(ours.view(torch.int32), theirs.view(torch.int32))
    assert (dy.signbit() & (dy == 0)).any() and not ours.signbit()[ours == 0].any()
    avg = T.fractional_avg_pool_grad(x.shape, dy, rows, cols, overlapping)
    theirs = torch.from_numpy(
        tf.raw_ops.FractionalAvgPoolGrad(
            orig_input_tensor_shape=list(x.shape),
            out_backprop=dy.numpy(),
            row_pooling_sequence=rows.numpy(),
            col_pooling_sequence=cols.numpy(),
            overlapping=overlapping,
        ).numpy()
    )
    assert torch.equal(avg.view(torch.int32), theirs.view(torch.int32))
