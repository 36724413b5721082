"""fused_batch_norm_v3 / _grad_v3 against TensorFlow 2.21 itself (Eigen path): randomised
parity of every output and of the second-order gradient, and every FusedBatchNorm bad input of
TF 2.21's bad-input table (docs/ops/fused_batch_norm.md) run through both TF and us."""

import re

import pytest
import torch

import torch_tfgrads as T
from helpers import rel_err
from torch_tfgrads.parity.fused_batch_norm_cases import random_cases
from torch_tfgrads.parity.fused_batch_norm_tf import (
    tf_fused_batch_norm_grad_grad,
    tf_fused_batch_norm_grad_v3,
    tf_fused_batch_norm_v3,
)

pytestmark = pytest.mark.needs_tf
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


@pytest.mark.parametrize("case", list(random_cases(40, seed=2021)), ids=lambda c: c.name)
def test_parity_with_tensorflow(tf, case):
    tol = TOL[case.x.dtype]
    ours = T.fused_batch_norm_v3(*case.forward_args())
    theirs = tf_fused_batch_norm_v3(*case.forward_args())
    n_defined = 5 if case.training else 3  # TF's inference reserve spaces are uninitialised
    for o, t in zip(ours[:n_defined], theirs[:n_defined]):
        assert o.dtype == t.dtype and o.shape == t.shape
        assert rel_err(o, t) <= tol
    assert ours[5].shape == theirs[5].shape == ()

    grad_args = case.grad_args(ours)
    ours_g = T.fused_batch_norm_grad_v3(*grad_args)
    theirs_g = tf_fused_batch_norm_grad_v3(*case.tf_grad_args(ours))
    theirs_g = case.from_tf_grad_layout(theirs_g)
    for o, t in zip(ours_g[:3], theirs_g[:3]):
        assert o.dtype == t.dtype and o.shape == t.shape
        assert rel_err(o, t) <= tol
    assert ours_g[3].shape == theirs_g[3].shape == (0,)

    if case.x.dtype == torch.float32 and not (case.channels_first and not case.training):
        dy, x, scale = (a.clone().requires_grad_() for a in grad_args[:3])
        outs = T.fused_batch_norm_grad_v3(dy, x, scale, *grad_args[3:])
        upstream = case.second_order_upstream()
        ours_gg = torch.autograd.grad(outs[:3], [dy, x, scale], upstream)
        theirs_gg = tf_fused_batch_norm_grad_grad(*grad_args[:6], *upstream, *grad_args[6:])
        for o, t in zip(ours_gg, theirs_gg):
            assert rel_err(o, t) <= tol


# ---- bad and edge inputs ---------------------------------------------------------------------------
# Every FusedBatchNorm row of bad_inputs_batchnorm_fracpool.md. V1/V2-only rows (other ops of the
# family) are replayed on V3, which is the op we provide. Each case runs on TF and on us: where TF
# raises we must raise a message containing TF's (plus the argument name); where TF succeeds we
# must succeed with the same output shapes. DIFFERENT lists our deliberate departures.
def z(*s, dtype=torch.float32):
    return torch.zeros(s, dtype=dtype)


def o(*s, dtype=torch.float32):
    return torch.ones(s, dtype=dtype)


def fwd(x, scale, offset, mean, variance, **kw):
    return ("fwd", (x, scale, offset, mean, variance), kw)


def bwd(dy, x, scale, rs1, rs2, rs3, **kw):
    return ("bwd", (dy, x, scale, rs1, rs2, rs3), kw)


H = torch.float16
BAD_INPUTS = {
    "FBN3 x rank 3": fwd(z(2, 3, 4), o(4), z(4), z(0), z(0)),
    "FBN3 x rank 6": fwd(z(1, 2, 2, 2, 2, 4), o(4), z(4), z(0), z(0)),
    "FBN3 scale rank 2": fwd(z(2, 2, 2, 4), o(1, 4), z(4), z(0), z(0)),
    "FBN3 offset rank 0": fwd(z(2, 2, 2, 4), o(4), torch.tensor(0.0), z(0), z(0)),
    "FBN3 mean rank 2 (training, factor 1)": fwd(z(2, 2, 2, 4), o(4), z(4), z(1, 4), z(4)),
    "FBN3 variance rank 2 (training)": fwd(z(2, 2, 2, 4), o(4), z(4), z(4), z(1, 4)),
    "FBN3 scale size 3 vs C 4": fwd(z(2, 2, 2, 4), o(3), z(4), z(0), z(0)),
    "FBN3 offset size 5 vs C 4": fwd(z(2, 2, 2, 4), o(4), z(5), z(0), z(0)),
    "FBN3 NCHW scale size = last dim": fwd(
        z(2, 3, 2, 4), o(4), z(4), z(0), z(0), data_format="NCHW"
    ),
    "FBN3 inference mean size 3 vs C 4": fwd(
        z(2, 2, 2, 4), o(4), z(4), z(3), o(4), is_training=False
    ),
    "FBN3 inference variance empty": fwd(z(2, 2, 2, 4), o(4), z(4), z(4), o(0), is_training=False),
    "FBN3 training factor 0.5 mean size 3": fwd(
        z(2, 2, 2, 4), o(4), z(4), z(3), o(4), exponential_avg_factor=0.5
    ),
    "FBN3 training factor 1 mean size 3 (ignored)": fwd(o(2, 2, 2, 4), o(4), z(4), z(3), o(7)),
    "FBN3 bad data_format": fwd(z(2, 2, 2, 4), o(4), z(4), z(0), z(0), data_format="HWCN"),
    "FBN3 5-D x with data_format NHWC": fwd(o(1, 2, 2, 2, 4), o(4), z(4), z(0), z(0)),
    "FBN3 4-D x with data_format NCDHW": fwd(
        o(1, 4, 2, 2), o(4), z(4), z(0), z(0), data_format="NCDHW"
    ),
    "FBN2 5-D x NHWC (as V3)": fwd(o(1, 2, 2, 2, 4), o(4), z(4), z(0), z(0)),
    "FBN3 half scale (U=half)": fwd(
        z(2, 2, 2, 4, dtype=H), o(4, dtype=H), z(4, dtype=H), z(0, dtype=H), z(0, dtype=H)
    ),
    "FBN3 bf16 x, bf16 U": fwd(
        z(2, 2, 2, 4, dtype=torch.bfloat16),
        o(4, dtype=torch.bfloat16),
        z(4, dtype=torch.bfloat16),
        z(0),
        z(0),
    ),
    "FBN3 negative epsilon (no check)": fwd(
        torch.tensor([[[[1.0], [1.0]]]]), o(1), z(1), z(0), z(0), epsilon=-1.0
    ),
    "FBN3 exponential_avg_factor 0": fwd(
        torch.tensor([[[[1.0], [3.0]]]]),
        o(1),
        z(1),
        torch.tensor([5.0]),
        torch.tensor([7.0]),
        exponential_avg_factor=0.0,
    ),
    "FBN3 inference with factor 0.5 and empty mean": fwd(
        z(2, 2, 2, 4), o(4), z(4), z(0), z(0), exponential_avg_factor=0.5, is_training=False
    ),
    "CVE-2021-29583 PoC1 scale size 1 vs C 6": fwd(
        z(10, 10, 10, 6),
        z(1),
        z(1),
        z(1),
        z(1),
        epsilon=0.0,
        exponential_avg_factor=0.0,
        is_training=False,
    ),
    "CVE-2021-29583 PoC2 empty scale vs C 1": fwd(
        z(10, 10, 10, 1),
        z(0),
        z(0),
        z(0),
        z(0),
        epsilon=0.0,
        exponential_avg_factor=0.0,
        is_training=False,
    ),
    "CVE-2021-29555 PoC C=0": fwd(
        z(1, 1, 1, 0),
        z(0),
        z(0),
        z(0),
        z(0),
        epsilon=0.0,
        exponential_avg_factor=0.0,
        is_training=False,
    ),
    "FBN3 C=0 training": fwd(z(1, 2, 2, 0), z(0), z(0), z(0), z(0)),
    "FBNG3 y_backprop rank 3": bwd(z(2, 2, 4), z(2, 2, 2, 4), o(4), z(4), o(4), z(0)),
    "FBNG3 x rank 3": bwd(z(2, 2, 2, 4), z(2, 2, 4), o(4), z(4), o(4), z(0)),
    "FBNG3 scale rank 2": bwd(z(2, 2, 2, 4), z(2, 2, 2, 4), o(1, 4), z(4), o(4), z(0)),
    "FBNG3 rs1 rank 2": bwd(z(2, 2, 2, 4), z(2, 2, 2, 4), o(4), z(1, 4), o(4), z(0)),
    "FBNG3 rs2 rank 0": bwd(z(2, 2, 2, 4), z(2, 2, 2, 4), o(4), z(4), torch.tensor(1.0), z(0)),
    "FBNG3 x/y_backprop shape mismatch": bwd(z(2, 2, 3, 4), z(2, 2, 2, 4), o(4), z(4), o(4), z(0)),
    "FBNG3 scale size 3 vs C 4": bwd(z(2, 2, 2, 4), z(2, 2, 2, 4), o(3), z(4), o(4), z(0)),
    "FBNG3 rs1 size 3 vs C 4": bwd(z(2, 2, 2, 4), z(2, 2, 2, 4), o(4), z(3), o(4), z(0)),
    "FBNG3 rs2 size 5 vs C 4": bwd(z(2, 2, 2, 4), z(2, 2, 2, 4), o(4), z(4), o(5), z(0)),
    "FBNG3 rs3 arbitrary shape (ignored)": bwd(
        o(2, 2, 2, 4), o(2, 2, 2, 4), o(4), z(4), o(4), z(3, 7)
    ),
    "FBNG3 inference NCHW": bwd(
        o(2, 4, 2, 2), o(2, 4, 2, 2), o(4), z(4), o(4), z(0), data_format="NCHW", is_training=False
    ),
    "FBNG3 scale dtype half": bwd(
        o(2, 2, 2, 4, dtype=H), o(2, 2, 2, 4, dtype=H), o(4, dtype=H), z(4), o(4), z(0)
    ),
    "CVE-2021-41223 PoC NCHW y_backprop(1,1,3,3) x(1,1,1,2)": bwd(
        torch.arange(9.0).reshape(1, 1, 3, 3),
        torch.arange(2.0).reshape(1, 1, 1, 2),
        torch.tensor([1.0, 1.0]),
        torch.tensor([1.0, 1.0]),
        torch.tensor([1.0, 1.0, 1.0]),
        z(0),
        epsilon=1.0,
        data_format="NCHW",
    ),
    "issue#58999 GradV3 empty scale": bwd(o(4, 10, 10, 2), o(4, 10, 10, 2), z(0), o(2), o(2), o(2)),
    "FBNG2 fuzz-style PoC (as V3)": bwd(
        o(1, 2, 2, 2), o(1, 2, 2, 2), o(2), torch.tensor([4.0, 4.0]), torch.tensor([4.0, 4.0]), z(0)
    ),
}

# Where we deliberately differ from TF's Eigen kernel (README "Deliberate differences"):
#   inference grads accept NCHW (TF's oneDNN kernel does too; TF's autograd transposes to NHWC);
#   half scale/statistics are rejected with our own dtype message (TF's is an OpDef message).
DIFFERENT = {
    "FBNG3 inference NCHW": "ok",
    "FBNG3 scale dtype half": "scale",
    "FBN3 half scale (U=half)": "scale",
    "FBN3 bf16 x, bf16 U": "scale",
}

# The exception type of each rejected case (docs/errors.md); every other rejection is a
# RuntimeError (shapes that do not fit).
ERROR_TYPE = {
    "FBN3 bad data_format": ValueError,
    "FBNG3 scale dtype half": TypeError,
    "FBN3 half scale (U=half)": TypeError,
    "FBN3 bf16 x, bf16 U": TypeError,
}


def run_tf(tf, kind, args, kw):
    if kind == "fwd":
        names = ("x", "scale", "offset", "mean", "variance")
        op = tf.raw_ops.FusedBatchNormV3
    else:
        names = (
            "y_backprop",
            "x",
            "scale",
            "reserve_space_1",
            "reserve_space_2",
            "reserve_space_3",
        )
        op = tf.raw_ops.FusedBatchNormGradV3
    from torch_tfgrads.parity._tf import to_tf

    return op(**{n: to_tf(a) for n, a in zip(names, args)}, **kw)


def tf_message(e):
    msg = getattr(e, "message", str(e))
    msg = re.sub(r"^\{\{function_node [^}]*\}\}\s*", "", msg)
    return re.split(r"; NodeDef|\s\[Op:", msg)[0].strip()


@pytest.mark.parametrize("name", list(BAD_INPUTS))
def test_bad_and_edge_inputs_like_tensorflow(tf, name):
    kind, args, kw = BAD_INPUTS[name]
    ours_fn = T.fused_batch_norm_v3 if kind == "fwd" else T.fused_batch_norm_grad_v3
    try:
        theirs = run_tf(tf, kind, args, kw)
        tf_error = None
    except Exception as e:  # noqa: BLE001 - any TF error class
        tf_error = tf_message(e)
    expect = DIFFERENT.get(name)
    if tf_error is not None and expect != "ok":
        with pytest.raises(Exception) as info:
            ours_fn(*args, **kw)
        assert type(info.value) is ERROR_TYPE.get(name, RuntimeError), repr(info.value)
        ours_msg = str(info.value)
        assert "argument '" in ours_msg
        if expect is None:
            assert tf_error in ours_msg, (tf_error, ours_msg)
        else:
            assert f"argument '{expect}'" in ours_msg
        return
    ours = ours_fn(*args, **kw)
    if tf_error is None:
        assert [tuple(t.shape) for t in ours] == [tuple(t.shape) for t in theirs]
        assert (
            rel_err(ours[0], torch.from_numpy(theirs[0].numpy())) <= 1e-6
            or torch.isnan(ours[0]).all()
        )
    else:  # accepted although TF's Eigen kernel refuses: compare with TF's NHWC computation
        assert name == "FBNG3 inference NCHW"
        nhwc = [a.permute(0, 2, 3, 1) if a.dim() == 4 else a for a in args]
        theirs = run_tf(tf, kind, nhwc, {**kw, "data_format": "NHWC"})
        assert rel_err(ours[0], torch.from_numpy(theirs[0].numpy()).permute(0, 3, 1, 2)) <= 1e-6
        assert rel_err(ours[1], torch.from_numpy(theirs[1].numpy())) <= 1e-6


def test_float64_is_an_extension_tf_rejects(tf):
    # TF: "Value for attr 'T' of double is not in the list ...". We accept float64 (gradcheck).
    x = torch.randn(2, 2, 2, 4, dtype=torch.float64)
    with pytest.raises(Exception, match="double"):
        run_tf(tf, "fwd", (x, o(4), z(4), z(0), z(0)), {})
    y = T.fused_batch_norm_v3(x, o(4, dtype=torch.float64), z(4, dtype=torch.float64))[0]
    assert y.dtype == torch.float64


def test_random_cases_are_varied():
    cases = list(random_cases(40, seed=2021))
    assert {c.data_format for c in cases} == {"NHWC", "NCHW", "NDHWC", "NCDHW"}
    assert {c.training for c in cases} == {True, False}
    assert len({c.x.dtype for c in cases}) == 3
