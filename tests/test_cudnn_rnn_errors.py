"""Every CudnnRNN bad input of docs/ops/cudnn_rnn.md (TF's checks, CVE-2021-41221, ours): a clear error
naming the argument, of the type docs/errors.md gives it, never a crash; the same error under
FakeTensor (what torch.compile and torch.export run) and through torch.compile; the nn layers
name their own arguments."""

import re

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import torch_tfgrads as T


def _f(*shape):
    return torch.zeros(shape)


def _lens(*v):
    return torch.tensor(v, dtype=torch.int32)


def _lstm_params(L=1, U=3, I=2, direction="unidirectional", P=0):
    return torch.zeros(T.cudnn_rnn_params_size(L, U, I, "lstm", direction=direction, num_proj=P))


def _fwd(x, h, c, p, lens, **kw):
    return lambda: T.cudnn_rnn_v3(x, h, c, p, lens, **kw)


P1 = _lstm_params()  # 1 layer, 3 units, input 2
GOOD = dict(x=_f(4, 2, 2), h=_f(1, 2, 3), c=_f(1, 2, 3), p=P1, lens=_lens(4, 4))


def _good(**over):
    a = dict(GOOD, **over)
    return a["x"], a["h"], a["c"], a["p"], a["lens"]


def _backprop(**over):
    x, h, c, p, lens = _good()
    out, oh, oc, reserve, host = T.cudnn_rnn_v3(x, h, c, p, lens)
    args = dict(
        output=out,
        output_h=oh,
        output_c=oc,
        output_backprop=out,
        output_h_backprop=oh,
        output_c_backprop=oc,
        reserve_space=reserve,
    )
    args.update(over)
    return lambda: T.cudnn_rnn_backprop_v3(
        x,
        h,
        c,
        p,
        lens,
        args["output"],
        args["output_h"],
        args["output_c"],
        args["output_backprop"],
        args["output_h_backprop"],
        args["output_c_backprop"],
        args["reserve_space"],
        host,
    )


BAD_INPUTS = {
    # CVE-2021-41221's PoC (ranks 1/1/1): rejected before any shape is read.
    "cve_2021_41221_rank1": (
        _fwd(
            torch.tensor([0.1, 0.1]),
            torch.tensor([0.5]),
            torch.tensor([0.1, 0.1, 0.1]),
            torch.tensor([0.5, 0.5]),
            _lens(-1, 0, 1),
        ),
        "argument 'input': RNN input must be a 3-D vector.",
    ),
    "input_rank2": (_fwd(*_good(x=_f(4, 2))), "RNN input must be a 3-D vector"),
    "input_h_rank2": (_fwd(*_good(h=_f(2, 3))), "argument 'input_h': RNN input_h must be a 3-D"),
    "input_c_rank2": (_fwd(*_good(c=_f(2, 3))), "argument 'input_c': RNN input_c must be a 3-D"),
    "params_rank2": (_fwd(*_good(p=P1.view(1, -1))), "argument 'params' must be 1-D"),
    "params_too_short": (
        _fwd(*_good(p=P1[:-1])),
        f"argument 'params' has {P1.numel() - 1} elements but "
        f"cudnn_rnn_params_size of this configuration is {P1.numel()}",
    ),
    "params_too_long": (_fwd(*_good(p=torch.zeros(P1.numel() + 5))), "argument 'params' has"),
    "input_h_dim0_3_bidirectional": (
        _fwd(*_good(h=_f(3, 2, 3), c=_f(3, 2, 3)), direction="bidirectional"),
        re.escape("Invalid input_h shape: [3,2,3] [2,2,3]"),
    ),
    "batch_mismatch": (
        _fwd(*_good(h=_f(1, 3, 3), c=_f(1, 3, 3))),
        re.escape("Invalid input_h shape: [1,3,3] [1,2,3]"),
    ),
    "h_c_differ_without_projection": (
        _fwd(*_good(c=_f(1, 2, 4))),
        re.escape("input_h and input_c must have the same shape w/o projection: [1,2,3] [1,2,4]"),
    ),
    "num_proj_greater_than_units": (
        _fwd(*_good(h=_f(1, 2, 5)), num_proj=5),
        re.escape("Invalid input_h and input_c w/ projection size: 5 [1,2,5] [1,2,3]"),
    ),
    "input_h_dim2_not_num_proj": (
        _fwd(*_good(), num_proj=2),
        re.escape("Invalid input_h and input_c w/ projection size: 2 [1,2,3] [1,2,3]"),
    ),
    "num_proj_with_gru": (
        _fwd(
            _f(4, 2, 2), _f(1, 2, 3), None, torch.zeros(45), _lens(4, 4), rnn_mode="gru", num_proj=2
        ),
        "'num_proj' \\(2\\) is only supported with rnn_mode lstm",
    ),
    "lengths_wrong_size": (
        _fwd(*_good(lens=_lens(4, 4, 4))),
        re.escape("'sequence_lengths' must have shape [batch_size] = [2], got [3]"),
    ),
    "lengths_rank2": (_fwd(*_good(lens=_lens(4, 4).view(1, 2))), "'sequence_lengths' must have"),
    "lengths_negative": (
        _fwd(*_good(lens=_lens(4, -1))),
        re.escape("sequence_lengths[1] = -1 is not in [1, max_time] = [1, 4]"),
    ),
    "lengths_beyond_max_time": (
        _fwd(*_good(lens=_lens(5, 4))),
        re.escape("sequence_lengths[0] = 5 is not in [1, max_time]"),
    ),
    "lengths_zero": (
        _fwd(*_good(lens=_lens(4, 0))),
        re.escape("sequence_lengths[1] = 0 is not in [1, max_time]"),
    ),
    "lengths_float": (
        _fwd(*_good(lens=torch.tensor([4.0, 4.0]))),
        "'sequence_lengths' must be an int32 tensor",
    ),
    "num_layers_zero_empty_input_h": (
        _fwd(*_good(h=_f(0, 2, 3), c=_f(0, 2, 3))),
        "num_layers must be >= 1, got 0",
    ),
    "num_units_zero": (_fwd(*_good(h=_f(1, 2, 0), c=_f(1, 2, 0))), "num_units must be >= 1, got 0"),
    "input_size_zero": (_fwd(*_good(x=_f(4, 2, 0))), "input_size must be >= 1, got 0"),
    "bad_rnn_mode": (_fwd(*_good(), rnn_mode="lstmx"), "argument 'rnn_mode' must be one of"),
    "bad_direction": (_fwd(*_good(), direction="both"), "argument 'direction' must be"),
    "bad_input_mode": (_fwd(*_good(), input_mode="skip"), "argument 'input_mode' must be"),
    "skip_input_size_mismatch": (
        _fwd(*_good(), input_mode="skip_input"),
        "input_size \\(2\\) must equal num_units \\(3\\)",
    ),
    "dropout_one": (_fwd(*_good(), dropout=1.0), "argument 'dropout' must be in \\[0, 1\\)"),
    "dropout_negative": (_fwd(*_good(), dropout=-0.1), "argument 'dropout' must be in"),
    "integer_input": (
        _fwd(*_good(x=torch.zeros(4, 2, 2, dtype=torch.int32))),
        "argument 'input' must be a float16, bfloat16, float32 or float64",
    ),
    "dtype_mismatch_h": (
        _fwd(*_good(h=_f(1, 2, 3).double())),
        "argument 'input_h' must have the dtype of input",
    ),
    "dtype_mismatch_params": (
        _fwd(*_good(p=P1.double())),
        "argument 'params' must have the dtype of input",
    ),
    # CudnnRNNBackpropV3 (B10, TF's messages) and its reserve space (not checked by TF).
    "backprop_output_shape": (
        _backprop(output=_f(4, 2, 4)),
        re.escape("argument 'output': Invalid output shape: [4,2,4] [4,2,3]"),
    ),
    "backprop_output_h_shape": (
        _backprop(output_h=_f(2, 2, 3)),
        re.escape("Invalid output_h shape: [2,2,3] [1,2,3]"),
    ),
    "backprop_output_c_shape": (
        _backprop(output_c=_f(1, 2, 4)),
        re.escape("Invalid output_c shape: [1,2,4] [1,2,3]"),
    ),
    "backprop_output_backprop_shape": (
        _backprop(output_backprop=_f(3, 2, 3)),
        re.escape("Invalid output_backprop shape: [3,2,3]"),
    ),
    "backprop_output_h_backprop_shape": (
        _backprop(output_h_backprop=_f(1, 1, 3)),
        re.escape("Invalid output_h_backprop shape"),
    ),
    "backprop_output_c_backprop_shape": (
        _backprop(output_c_backprop=_f(1, 2, 2)),
        re.escape("Invalid output_c_backprop shape"),
    ),
    "backprop_reserve_wrong_size": (
        _backprop(reserve_space=torch.zeros(7)),
        "argument 'reserve_space' must be the reserve_space of a training-mode cudnn_rnn_v3 call",
    ),
    "backprop_reserve_of_inference": (
        _backprop(reserve_space=torch.zeros(())),
        "is_training must be set to True",
    ),
    # CudnnRNNParamsToCanonicalV2 (TF's messages, typos included) and our size check.
    "p2c_weights_not_multiple": (
        lambda: T.cudnn_rnn_params_to_canonical_v2(2, 3, 2, _lstm_params(2), 15, 16),
        "Number of params \\(weights\\) is not a multipleof num_layers \\* num_dirs.",
    ),
    "p2c_biases_not_multiple": (
        lambda: T.cudnn_rnn_params_to_canonical_v2(2, 3, 2, _lstm_params(2), 16, 15),
        "Number of params \\(biases\\) is not a multipleof num_layers \\* num_dirs.",
    ),
    "p2c_odd_without_projection": (
        lambda: T.cudnn_rnn_params_to_canonical_v2(1, 3, 2, P1, 7, 8),
        "per layer is notan even number with no projection.",
    ),
    "p2c_even_with_projection": (
        lambda: T.cudnn_rnn_params_to_canonical_v2(1, 3, 2, _lstm_params(P=2), 8, 8, num_proj=2),
        "per layer is notan odl number with projection.",
    ),
    "p2c_weight_count": (
        lambda: T.cudnn_rnn_params_to_canonical_v2(1, 3, 2, P1, 6, 8),
        "C Number of params mismatch. Expected 6, got 8",
    ),
    "p2c_bias_count": (
        lambda: T.cudnn_rnn_params_to_canonical_v2(1, 3, 2, P1, 8, 6),
        "A Number of params mismatch. Expected 6, got 8",
    ),
    "p2c_params_too_short": (
        lambda: T.cudnn_rnn_params_to_canonical_v2(1, 3, 2, P1[:10], 8, 8),
        "argument 'params' has 10 elements",
    ),
    "p2c_num_layers_zero": (
        lambda: T.cudnn_rnn_params_to_canonical_v2(0, 3, 2, P1, 8, 8),
        "argument 'num_layers' must be >= 1, got 0",
    ),
    "p2c_num_params_zero": (
        lambda: T.cudnn_rnn_params_to_canonical_v2(1, 3, 2, P1, 0, 8),
        "num_params_weights and num_params_biases must be >= 1",
    ),
    "p2c_skip_input_size_mismatch": (
        lambda: T.cudnn_rnn_params_to_canonical_v2(1, 3, 2, P1, 8, 8, input_mode="skip_input"),
        re.escape(
            "argument 'input_mode': input_mode skip_input adds the input to every gate, "
            "so input_size (2) must equal num_units (3)"
        ),
    ),
    "p2c_params_rank2": (
        lambda: T.cudnn_rnn_params_to_canonical_v2(1, 3, 2, P1.view(1, -1), 8, 8),
        re.escape("argument 'params' must be 1-D, got shape [1,"),
    ),
    "p2c_integer_params": (
        lambda: T.cudnn_rnn_params_to_canonical_v2(1, 3, 2, P1.int(), 8, 8),
        "argument 'params' must be a float16, bfloat16, float32 or float64 tensor, got Int",
    ),
    # CudnnRNNCanonicalToParamsV2 (a CHECK crash in TF).
    "c2p_wrong_count": (
        lambda: T.cudnn_rnn_canonical_to_params_v2(1, 3, 2, [_f(3, 2)] * 7, [_f(3)] * 8),
        "argument 'weights': expected 8 tensors for this configuration",
    ),
    "c2p_wrong_shape": (
        lambda: T.cudnn_rnn_canonical_to_params_v2(1, 3, 2, [_f(3, 2)] * 8, [_f(3)] * 8),
        re.escape("weights[4] must have shape [3,3], got [3,2]"),
    ),
    "c2p_wrong_bias_shape": (
        lambda: T.cudnn_rnn_canonical_to_params_v2(
            1, 3, 2, [_f(3, 2)] * 4 + [_f(3, 3)] * 4, [_f(3)] * 7 + [_f(4)]
        ),
        re.escape("biases[7] must have shape [3], got [4]"),
    ),
    "c2p_empty": (
        lambda: T.cudnn_rnn_canonical_to_params_v2(1, 3, 2, [], []),
        "argument 'weights' must not be empty",
    ),
    "c2p_integer_weights": (
        lambda: T.cudnn_rnn_canonical_to_params_v2(
            1, 3, 2, [_f(3, 2).int()] * 4 + [_f(3, 3).int()] * 4, [_f(3).int()] * 8
        ),
        "argument 'weights' must hold float16, bfloat16, float32 or float64 tensors, got Int",
    ),
    "c2p_dtype_mismatch": (
        lambda: T.cudnn_rnn_canonical_to_params_v2(
            1, 3, 2, [_f(3, 2)] * 4 + [_f(3, 3)] * 4, [_f(3)] * 7 + [_f(3).double()]
        ),
        "argument 'biases': biases\\[7\\] must have dtype Float, got Double",
    ),
    "c2p_bad_direction": (
        lambda: T.cudnn_rnn_canonical_to_params_v2(
            1, 3, 2, [_f(3, 2)] * 8, [_f(3)] * 8, direction="forward"
        ),
        "argument 'direction' must be unidirectional or bidirectional, got 'forward'",
    ),
    "c2p_num_units_zero": (
        lambda: T.cudnn_rnn_canonical_to_params_v2(1, 0, 2, [_f(3, 2)] * 8, [_f(3)] * 8),
        "argument 'num_units' must be >= 1, got 0",
    ),
    # CudnnRNNParamsSize.
    "params_size_non_scalar": (
        lambda: T.cudnn_rnn_params_size(torch.tensor([1]), 3, 2),
        "num_layers is not a scalar",
    ),
    "params_size_num_units_zero": (
        lambda: T.cudnn_rnn_params_size(1, 0, 2),
        "argument 'num_units' must be >= 1, got 0",
    ),
    "params_size_num_units_negative": (
        lambda: T.cudnn_rnn_params_size(1, -3, 2),
        "argument 'num_units' must be >= 1, got -3",
    ),
    "params_size_float_tensor": (
        lambda: T.cudnn_rnn_params_size(torch.tensor(1.0), 3, 2),
        "argument 'num_layers' must be an integer",
    ),
    "params_size_num_proj_negative": (
        lambda: T.cudnn_rnn_params_size(1, 3, 2, num_proj=-1),
        "argument 'num_proj' must be >= 0, got -1",
    ),
    # Dtypes of the backprop's tensors and of the forward's input_c.
    "dtype_mismatch_c": (
        _fwd(*_good(c=_f(1, 2, 3).half())),
        "argument 'input_c' must have the dtype of input \\(Float\\), got Half",
    ),
    "backprop_output_dtype": (
        _backprop(output=_f(4, 2, 3).double()),
        "argument 'output' must have the dtype of input",
    ),
    "backprop_output_c_backprop_dtype": (
        _backprop(output_c_backprop=_f(1, 2, 3).bfloat16()),
        "argument 'output_c_backprop' must have the dtype",
    ),
}


def _backprop_reserve_double():
    x, h, c, p, lens = _good()
    out, oh, oc, reserve, host = T.cudnn_rnn_v3(x, h, c, p, lens)
    return T.cudnn_rnn_backprop_v3(
        x, h, c, p, lens, out, oh, oc, out, oh, oc, reserve.double(), host
    )


BAD_INPUTS["backprop_reserve_dtype"] = (
    _backprop_reserve_double,
    "argument 'reserve_space' must have the dtype of input \\(Float\\), got Double",
)

# The exception type docs/errors.md gives each case: ValueError for a bad value of one
# attribute or size argument, TypeError for dtypes, RuntimeError for everything else here
# (shapes that do not fit, params of the wrong size, invalid sequence_lengths values).
VALUE_ERRORS = {
    "num_proj_with_gru",
    "bad_rnn_mode",
    "bad_direction",
    "bad_input_mode",
    "dropout_one",
    "dropout_negative",
    "p2c_weights_not_multiple",
    "p2c_biases_not_multiple",
    "p2c_odd_without_projection",
    "p2c_even_with_projection",
    "p2c_weight_count",
    "p2c_bias_count",
    "p2c_num_layers_zero",
    "p2c_num_params_zero",
    "p2c_skip_input_size_mismatch",
    "c2p_bad_direction",
    "c2p_num_units_zero",
    "params_size_non_scalar",
    "params_size_num_units_zero",
    "params_size_num_units_negative",
    "params_size_num_proj_negative",
}
TYPE_ERRORS = {
    "lengths_float",
    "integer_input",
    "dtype_mismatch_h",
    "dtype_mismatch_params",
    "dtype_mismatch_c",
    "backprop_output_dtype",
    "backprop_output_c_backprop_dtype",
    "backprop_reserve_dtype",
    "p2c_integer_params",
    "c2p_integer_weights",
    "c2p_dtype_mismatch",
    "params_size_float_tensor",
}


def expected_type(name):
    if name in VALUE_ERRORS:
        return ValueError
    return TypeError if name in TYPE_ERRORS else RuntimeError


# Cases the real kernel rejects and the fake kernel cannot: checks of tensor contents.
DATA_DEPENDENT = {
    "lengths_negative": "sequence_lengths values are data",
    "lengths_beyond_max_time": "sequence_lengths values are data",
    "lengths_zero": "sequence_lengths values are data",
}


def test_every_case_has_its_type():
    assert (VALUE_ERRORS | TYPE_ERRORS | set(DATA_DEPENDENT)) <= set(BAD_INPUTS)


@pytest.mark.parametrize("name", sorted(BAD_INPUTS))
def test_bad_input_is_a_clear_error(name):
    call, message = BAD_INPUTS[name]
    with pytest.raises(Exception, match=message) as info:
        call()
    assert type(info.value) is expected_type(name), repr(info.value)
    assert "argument '" in str(info.value) or name.startswith("p2c_"), str(info.value)


def _outcome(call):
    try:
        call()
    except Exception as e:  # noqa: BLE001 - the type is what is compared
        return type(e), str(e)
    return None, None


@pytest.mark.parametrize("name", sorted(BAD_INPUTS))
def test_fake_kernel_fails_like_the_real_one(name):
    # Every tensor the call makes or captures becomes a fake tensor at the op boundary
    # (allow_non_fake_inputs converts them, as mode.from_tensor would).
    call, _ = BAD_INPUTS[name]
    real = _outcome(call)
    assert real[0] is expected_type(name)
    with FakeTensorMode(allow_non_fake_inputs=True):
        fake = _outcome(call)
    if name in DATA_DEPENDENT:
        assert fake == (None, None), fake  # the real kernel checks these when it runs
    else:
        assert fake == real


# ---- the policy through torch.compile ------------------------------------------------------------
POLICY = {
    ValueError: (dict(dropout=1.0), {}),
    TypeError: ({}, dict(h=_f(1, 2, 3).double())),
    RuntimeError: ({}, dict(p=P1[:-1])),
}


@pytest.mark.parametrize("expected", list(POLICY), ids=lambda t: t.__name__)
def test_policy_types_eager_compiled_and_exported(expected):
    from test_depthwise_conv2d_errors import assert_dynamo_reports

    attrs, over = POLICY[expected]
    args = _good(**over)
    with pytest.raises(expected) as eager:
        T.cudnn_rnn_v3(*args, **attrs)

    class Call(torch.nn.Module):
        def forward(self, x, h, c, p, lens):
            return T.cudnn_rnn_v3(x, h, c, p, lens, **attrs)

    torch._dynamo.reset()
    with pytest.raises(Exception) as compiled:
        torch.compile(Call(), fullgraph=True, backend="eager")(*args)
    assert_dynamo_reports(compiled.value, eager.value)
    with pytest.raises(expected) as exported:
        torch.export.export(Call(), args)
    assert str(exported.value) == str(eager.value)


# ---- the nn layers -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "cls, kwargs, arg",
    [
        (T.nn.CudnnLSTM, dict(num_layers=0), "num_layers"),
        (T.nn.CudnnGRU, dict(num_units=0), "num_units"),
        (T.nn.CudnnRNNTanh, dict(input_size=0), "input_size"),
        (T.nn.CudnnLSTM, dict(direction="both"), "direction"),
        (T.nn.CudnnRNNRelu, dict(input_mode="skip"), "input_mode"),
        (T.nn.CudnnLSTM, dict(input_mode="skip_input"), "input_mode"),
        (T.nn.CudnnLSTM, dict(dropout=1.0), "dropout"),
        (T.nn.CudnnLSTM, dict(num_proj=-1), "num_proj"),
        (T.nn.CudnnLSTM, dict(num_proj=4), "num_proj"),
    ],
)
def test_layer_constructor_errors_name_the_argument(cls, kwargs, arg):
    args = dict(num_layers=1, num_units=3, input_size=2)
    args.update(kwargs)
    with pytest.raises(ValueError, match=f"^{cls.__name__}: argument '{arg}'"):
        cls(**args)


def test_layer_input_errors_name_the_layer_arguments():
    layer = T.nn.CudnnLSTM(1, 3, input_size=2)
    with pytest.raises(RuntimeError, match="^CudnnLSTM: argument 'input_size' is 2"):
        layer(_f(4, 2, 5))
    with pytest.raises(RuntimeError, match="^CudnnLSTM: the input must be 3-D"):
        layer(_f(4, 2))
    with pytest.raises(TypeError, match="^CudnnLSTM: the input's dtype torch.float64"):
        layer(_f(4, 2, 2).double())
    with pytest.raises(
        RuntimeError,
        match=re.escape(
            "CudnnLSTM: argument 'initial_state': c must have shape [1, 2, 3] for this input, "
            "got [1, 2, 4]"
        ),
    ):
        layer(_f(4, 2, 2), (_f(1, 2, 3), _f(1, 2, 4)))
    with pytest.raises(
        ValueError,
        match=re.escape("CudnnLSTM: argument 'initial_state' must hold (h, c), got 1 tensor(s)"),
    ):
        layer(_f(4, 2, 2), (_f(1, 2, 3),))
    with pytest.raises(TypeError, match="^CudnnLSTM: argument 'initial_state': h has dtype"):
        layer(_f(4, 2, 2), (_f(1, 2, 3).double(), _f(1, 2, 3)))
    with pytest.raises(RuntimeError, match="^cudnn_rnn_v3: argument 'sequence_lengths'"):
        layer(_f(4, 2, 2), sequence_lengths=_lens(4, 4, 4))  # passed through unchanged


def test_gradient_through_inference_forward_is_a_value_error():
    x, h, c, p, lens = _good()
    p = p.clone().requires_grad_()
    out = T.cudnn_rnn_v3(x, h, c, p, lens, is_training=False)[0]
    with pytest.raises(
        ValueError, match="To use CudnnRNNV3 in gradients, is_training must be set to True."
    ):
        out.sum().backward()
