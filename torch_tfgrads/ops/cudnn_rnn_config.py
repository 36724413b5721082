"""CudnnRNN sizes in Python: the params size, the canonical shapes and the reserve-space size.

Mirrors csrc/common/cudnn_rnn.{h,cpp} (the C++ is the implementation; this copy serves the fake
kernels, `cudnn_rnn_params_size` and the modules, and tests check that the two agree).
"""

import torch

from ._common import check_value, scalar_type_name, tf_shape

GATES = {"rnn_relu": 1, "rnn_tanh": 1, "lstm": 4, "gru": 3}
_INPUT_MODES = ("linear_input", "skip_input", "auto_select")
_DIRECTIONS = {"unidirectional": 1, "bidirectional": 2}


def check_shape(cond, message):
    """The RuntimeError counterpart of `check_value` (symbolic conditions without message)."""
    if isinstance(cond, torch.SymBool):
        torch._check(cond)
    elif not cond:
        raise RuntimeError(message())


class RnnConfig:
    """L layers, D directions, U units, I input size, P projection (0: none), Hh = P or U.

    The checks of csrc/common/cudnn_rnn.cpp, in its order, with its messages. The sizes are
    arguments of the params ops and the modules (a bad one is a ValueError naming it);
    ``from_shapes=True`` (the forward and backprop ops) means they were read from the tensors'
    shapes, and a bad one is a RuntimeError naming the tensor."""

    def __init__(
        self,
        op,
        rnn_mode,
        input_mode,
        direction,
        num_layers,
        num_units,
        input_size,
        num_proj,
        from_shapes=False,
    ):
        check_value(
            rnn_mode in GATES,
            lambda: (
                f"{op}: argument 'rnn_mode' must be one of rnn_relu, rnn_tanh, lstm, gru, got "
                f"'{rnn_mode}'"
            ),
        )
        check_value(
            direction in _DIRECTIONS,
            lambda: (
                f"{op}: argument 'direction' must be unidirectional or bidirectional, got "
                f"'{direction}'"
            ),
        )
        self.op = op
        self.mode, self.G, self.D = rnn_mode, GATES[rnn_mode], _DIRECTIONS[direction]
        self.L, self.U, self.I, self.P = num_layers, num_units, input_size, num_proj
        if from_shapes:
            units_arg = "input_c" if self.lstm else "input_h"
            check_shape(
                self.L >= 1,
                lambda: f"{op}: argument 'input_h': num_layers must be >= 1, got {self.L}",
            )
            check_shape(
                self.U >= 1,
                lambda: f"{op}: argument '{units_arg}': num_units must be >= 1, got {self.U}",
            )
            check_shape(
                self.I >= 1,
                lambda: f"{op}: argument 'input': input_size must be >= 1, got {self.I}",
            )
        else:
            for name, v in (("num_layers", self.L), ("num_units", self.U), ("input_size", self.I)):
                check_value(v >= 1, lambda: f"{op}: argument '{name}' must be >= 1, got {v}")
        check_value(self.P >= 0, lambda: f"{op}: argument 'num_proj' must be >= 0, got {self.P}")
        check_value(
            self.P == 0 or rnn_mode == "lstm",
            lambda: f"{op}: argument 'num_proj' ({self.P}) is only supported with rnn_mode lstm",
        )
        check_value(
            self.P <= self.U,
            lambda: f"{op}: argument 'num_proj' ({self.P}) must not exceed num_units ({self.U})",
        )
        self.Hh = self.P if self.P else self.U
        check_value(
            input_mode in _INPUT_MODES,
            lambda: (
                f"{op}: argument 'input_mode' must be linear_input, skip_input or auto_select, got "
                f"'{input_mode}'"
            ),
        )
        if input_mode == "skip_input":
            (check_shape if from_shapes else check_value)(
                self.I == self.U,
                lambda: (
                    f"{op}: argument '{'input' if from_shapes else 'input_mode'}': input_mode "
                    f"skip_input adds the input to every gate, so input_size ({self.I}) must equal "
                    f"num_units ({self.U})"
                ),
            )
        self.skip_input = input_mode == "skip_input" or (
            input_mode == "auto_select" and self.I == self.U
        )

    @property
    def lstm(self):
        return self.mode == "lstm"

    def in_width(self, layer):
        return self.I if layer == 0 else self.D * self.Hh

    def has_input_weights(self, layer):
        return not (self.skip_input and layer == 0)

    def act_width(self):
        return 4 * self.U if self.mode in ("lstm", "gru") else self.U

    def params_size(self):
        """Closed form (the layers above the first have the same widths): a huge num_layers
        costs nothing; a size beyond int64 is an error (csrc/common/cudnn_rnn.cpp's)."""
        GU = self.G * self.U

        def w_in(layer):
            return GU * self.in_width(layer) if self.has_input_weights(layer) else 0

        per_layer = GU * self.Hh + 2 * GU + self.P * self.U
        above = (self.L - 1) * w_in(1) if self.L > 1 else 0
        n = self.D * (w_in(0) + above + self.L * per_layer)
        check_value(
            n < 2**63,
            lambda: (
                f"{self.op}: argument 'num_layers': the params of {self.L} layers of {self.U} "
                f"units over {self.I} inputs exceed int64 elements"
            ),
        )
        return n

    def canonical_counts(self):
        """How many weight and bias tensors canonical_shapes lists, without listing them."""
        weights = self.D * (self.L * (2 * self.G + (1 if self.P else 0)))
        return weights - (self.D * self.G if self.skip_input else 0), self.L * self.D * 2 * self.G

    def canonical_shapes(self):
        """(weight shapes, bias shapes) in TF's ParamsToCanonical order."""
        ws = []
        for layer in range(self.L):
            for _ in range(self.D):
                if self.has_input_weights(layer):
                    ws += [(self.U, self.in_width(layer))] * self.G
                ws += [(self.U, self.Hh)] * self.G
                if self.P:
                    ws.append((self.P, self.U))
        return ws, [(self.U,)] * (self.L * self.D * 2 * self.G)

    def reserve_elements(self, T, B, with_dropout):
        """Reserve space in compute-dtype elements (float32 for the half types)."""
        per_pseudo = T * B * (self.act_width() + (self.U if self.lstm else 0) + self.Hh)
        below_top = T * B * self.D * self.Hh * (2 if with_dropout else 1)
        return self.L * self.D * per_pseudo + (self.L - 1) * below_top


def reserve_numel(cfg, T, B, dtype, dropout, is_training=True):
    """numel of the reserve_space tensor (dtype `dtype`) that cudnn_rnn_v3 returns."""
    if not is_training:
        return None
    widen = 2 if dtype in (torch.float16, torch.bfloat16) else 1
    return cfg.reserve_elements(T, B, dropout > 0 and cfg.L > 1) * widen


# ---- shared by the family's public functions and fake kernels (cudnn_rnn.py,
# cudnn_rnn_params.py)
RNN_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)

RNN_ATTRS_DOC = """
    ``rnn_mode``: "lstm" (gates i, f, c, o), "gru" (r, z, h; the reset gate applied after the
    recurrent matmul, Keras ``reset_after=True``), "rnn_tanh", "rnn_relu". ``input_mode``:
    "linear_input"; "skip_input" (input_size == num_units: layer 0 adds x to every gate instead
    of W x, and the buffer has no layer-0 input matrices); "auto_select" (skip_input exactly
    when input_size == num_units). ``direction``: "unidirectional" or "bidirectional".
    ``num_proj`` > 0 (LSTM only): h = Wp (o * tanh(c)), Wp ``[num_proj, num_units]``.
"""


def check_float(op, t, name):
    torch._check_type(
        t.dtype in RNN_DTYPES,
        lambda: (
            f"{op}: argument '{name}' must be a float16, bfloat16, float32 or float64 tensor, got "
            f"{scalar_type_name(t.dtype)}"
        ),
    )


def config_text(cfg):
    """The sizes of a configuration, as the C++ checks print them."""
    return (
        f"num_layers={cfg.L}, num_units={cfg.U}, input_size={cfg.I}, directions={cfg.D}, "
        f"num_proj={cfg.P}"
    )


def check_params_size(op, params, cfg, with_config=False):
    """params is 1-D with cfg.params_size() elements (the C++ checks' messages; the conversion
    op's names the configuration's sizes)."""
    torch._check(
        params.dim() == 1,
        lambda: f"{op}: argument 'params' must be 1-D, got shape {tf_shape(params.shape)}",
    )
    expected = cfg.params_size()
    torch._check(
        params.shape[0] == expected,
        lambda: (
            f"{op}: argument 'params' has {params.shape[0]} elements but cudnn_rnn_params_size of "
            f"this configuration{f' ({config_text(cfg)})' if with_config else ''} is {expected}"
        ),
    )
