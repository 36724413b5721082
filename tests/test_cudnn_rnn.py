"""CudnnRNN family: forward and gradients against torch.nn.LSTM/GRU/RNN in float64 (TF has no
CPU kernel), gradcheck, opcheck, dtypes, layouts, dropout, skip_input, params conversion and
the modules. Keras parity is in test_cudnn_rnn_tf.py, bad inputs in test_cudnn_rnn_errors.py.
"""

import pytest
import torch
from torch.autograd import gradcheck, gradgradcheck

import torch_tfgrads as T
from helpers import CUDA_DEVICES, DEVICES, rel_err
from torch_tfgrads.parity.cudnn_rnn_torch import GATES, oracle


class Case:
    def __init__(self, mode, L, D, P=0, time_major=True, lengths=None, T_=6, B=4, I=5, U=7):
        self.mode, self.L, self.D, self.P, self.time_major = mode, L, D, P, time_major
        self.T, self.B, self.I, self.U = T_, B, I, U
        self.lengths = lengths or [T_] * B
        self.Hh = P or U

    @property
    def direction(self):
        return "bidirectional" if self.D == 2 else "unidirectional"

    def __repr__(self):
        return (
            f"{self.mode}-L{self.L}D{self.D}P{self.P}-"
            f"{'tm' if self.time_major else 'bm'}-{'var' if min(self.lengths) < self.T else 'full'}"
        )

    def tensors(self, dtype=torch.float64, device="cpu", seed=0):
        g = torch.Generator().manual_seed(seed)
        LD = self.L * self.D
        n = T.cudnn_rnn_params_size(
            self.L, self.U, self.I, self.mode, direction=self.direction, num_proj=self.P
        )
        x = torch.randn(self.T, self.B, self.I, generator=g, dtype=torch.float64)
        h = torch.randn(LD, self.B, self.Hh, generator=g, dtype=torch.float64) * 0.5
        c = torch.randn(LD, self.B, self.U, generator=g, dtype=torch.float64) * 0.5
        p = torch.randn(n, generator=g, dtype=torch.float64) * 0.4
        if (
            not self.time_major
        ):  # the batch-major states are read as [L*D, B, H] (a reshape, as TF does)
            x = x.transpose(0, 1).contiguous()
            h, c = h.reshape(self.B, LD, self.Hh), c.reshape(self.B, LD, self.U)
        lens = torch.tensor(self.lengths, dtype=torch.int32)
        return [t.to(dtype=dtype, device=device) for t in (x, h, c, p)] + [lens]

    def run(self, x, h, c, p, lens, **kw):
        return T.cudnn_rnn_v3(
            x,
            h,
            c,
            p,
            lens,
            self.mode,
            direction=self.direction,
            num_proj=self.P,
            time_major=self.time_major,
            **kw,
        )


CASES = [
    Case("lstm", 1, 1),
    Case("lstm", 2, 2, time_major=False, lengths=[6, 3, 1, 5]),
    Case("lstm", 3, 2, P=3, lengths=[2, 6, 6, 4]),
    Case("lstm", 2, 1, P=4, time_major=False),
    Case("gru", 2, 2, lengths=[6, 1, 4, 2]),
    Case("gru", 1, 1, time_major=False, lengths=[3, 6, 2, 6]),
    Case("rnn_tanh", 2, 2, time_major=False),
    Case("rnn_relu", 1, 1, lengths=[6, 5, 4, 1]),
    Case("rnn_relu", 2, 2, time_major=False, lengths=[1, 2, 6, 3]),
    # num_units a multiple of 8: float32 takes the CPU's fused-step path (blocked brgemm + cell)
    Case("lstm", 2, 2, time_major=False, lengths=[6, 3, 1, 5], U=16),
    Case("lstm", 1, 1, U=24, B=5, lengths=[6, 6, 2, 6, 4]),
    Case("gru", 2, 2, lengths=[6, 1, 4, 2], U=8),
    Case("rnn_tanh", 1, 2, time_major=False, lengths=[2, 6, 6, 5], U=16),
    Case("rnn_relu", 2, 1, U=8),
    # GEMMs past one 64x64 tile with ragged edges (T*B = 99 rows, G*U = 288, I = 70): the
    # blocked GEMM, its panel copies and transposes, and the concurrent directions.
    Case("lstm", 1, 2, T_=9, B=11, I=70, U=72),
    Case(
        "lstm",
        2,
        2,
        time_major=False,
        T_=9,
        B=11,
        I=70,
        U=72,
        lengths=[9, 3, 8, 1, 9, 5, 7, 9, 2, 6, 4],
    ),
]


def _grads_ours(case, x, h, c, p, lens, dy, dh, dc):
    x, h, c, p = (t.detach().requires_grad_() for t in (x, h, c, p))
    out, oh, oc, _, _ = case.run(x, h, c, p, lens)
    loss = (out * dy).sum() + (oh * dh).sum()
    if case.mode == "lstm":
        loss = loss + (oc * dc).sum()
    inputs = [x, h, p] + ([c] if case.mode == "lstm" else [])
    return (out, oh, oc), torch.autograd.grad(loss, inputs)


def _grads_oracle(case, x, h, c, p, lens, dy, dh, dc):
    x, h, c = (t.detach().double().cpu().requires_grad_() for t in (x, h, c))
    out, oh, oc, m = oracle(case.mode, x, h, c, p, case.D, case.P, case.time_major, lens)
    loss = (out * dy.double().cpu()).sum() + (oh * dh.double().cpu()).sum()
    if case.mode == "lstm":
        loss = loss + (oc * dc.double().cpu()).sum()
    params = list(m.parameters())  # registration order = the opaque layout per pseudo-layer
    inputs = [x, h] + params + ([c] if case.mode == "lstm" else [])
    grads = torch.autograd.grad(loss, inputs)
    dp = torch.cat([g.reshape(-1) for g in grads[2 : 2 + len(params)]])
    return (out, oh, oc), (grads[0], grads[1], dp) + tuple(grads[2 + len(params) :])


def _cotangents(case, out_shape, h, c, dtype, device, seed=1):
    g = torch.Generator().manual_seed(seed)
    mk = lambda shape: torch.randn(shape, generator=g, dtype=torch.float64).to(
        dtype=dtype, device=device
    )  # noqa: E731
    return mk(out_shape), mk(h.shape), mk(c.shape)


def _out_shape(case):
    return (
        (case.T, case.B, case.D * case.Hh)
        if case.time_major
        else (case.B, case.T, case.D * case.Hh)
    )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES, ids=repr)
@pytest.mark.parametrize(
    "dtype,tol", [(torch.float64, 1e-12), (torch.float32, 1e-5)], ids=["f64", "f32"]
)
def test_matches_torch_nn(case, dtype, tol, device):
    x, h, c, p, lens = case.tensors(dtype, device)
    dy, dh, dc = _cotangents(case, _out_shape(case), h, c, dtype, device)
    (out, oh, oc), ours = _grads_ours(case, x, h, c, p, lens, dy, dh, dc)
    (r_out, r_oh, r_oc), ref = _grads_oracle(case, x, h, c, p, lens, dy, dh, dc)
    assert rel_err(out, r_out) <= tol
    assert rel_err(oh, r_oh) <= tol
    if case.mode == "lstm":
        assert rel_err(oc, r_oc) <= tol
    for name, a, b in zip(["input", "input_h", "params", "input_c"], ours, ref):
        assert rel_err(a, b) <= tol, name


def _float32_on_cpu_matches_oracle(case, threads, tol=1e-5, dtype=torch.float32):
    """Outputs, states and every gradient of the float32 (or `dtype`) CPU op on `threads` threads
    within `tol` of the float64 oracle."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        x, h, c, p, lens = case.tensors(dtype, "cpu")
        dy, dh, dc = _cotangents(case, _out_shape(case), h, c, dtype, "cpu")
        (out, oh, oc), ours = _grads_ours(case, x, h, c, p, lens, dy, dh, dc)
        (r_out, r_oh, r_oc), ref = _grads_oracle(case, x, h, c, p, lens, dy, dh, dc)
    finally:
        torch.set_num_threads(before)
    assert rel_err(out, r_out) <= tol and rel_err(oh, r_oh) <= tol
    if case.mode == "lstm":
        assert rel_err(oc, r_oc) <= tol
    for name, a, b in zip(["input", "input_h", "params", "input_c"], ours, ref):
        assert rel_err(a, b) <= tol, name


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(
    "case",
    [
        Case("lstm", 1, 1, T_=5, B=19, I=9, U=64, lengths=[5, 1, 3, 5, 2] * 3 + [4, 5, 1, 2]),
        Case("gru", 1, 1, T_=5, B=16, I=9, U=32),
        Case("rnn_tanh", 1, 1, T_=4, B=17, I=9, U=16),
        # wide layers: on AVX2 the backward's blocks narrow to 32 and 16 units (R's panel)
        Case("lstm", 1, 1, T_=3, B=5, I=8, U=320, lengths=[3, 1, 2, 3, 2]),
        Case("lstm", 1, 1, T_=3, B=4, I=8, U=528),
        # 17 rows and W and R of 3.27 MB, past rnn_tiles_before_brgemm_up_to_bytes: on the
        # 8-lane path BRGEMM's blocks with rows enough for the tiles (the narrower cases with
        # 16-19 rows run on the tiles there)
        Case("lstm", 1, 1, T_=3, B=17, I=8, U=448, lengths=[3, 1, 2] * 5 + [3, 2]),
        # bidirectional, a direction's W and R above rnn_directions_in_turn_above_bytes (the
        # fused steps): on two threads the directions run one after the other, both threads on
        # each
        Case("lstm", 1, 2, T_=3, B=4, I=8, U=448, lengths=[3, 1, 2, 3]),
        Case("gru", 1, 2, T_=3, B=3, I=200, U=448, lengths=[2, 3, 1]),
    ],
    ids=repr,
)
def test_fused_steps_split_rows_or_blocks(case, threads):
    # float32's fused steps split batch rows over the threads when each gets >= 8 rows (19
    # rows: 10 + 9) with AVX-512, else each step's unit blocks; one thread does all. On the
    # 8-lane path, rows enough and small weights run on the tiles instead. Same numbers each
    # way.
    # (Mostly unidirectional: the two directions of a bidirectional layer run one per thread,
    # except the wide ones at the end. Their float32 sums run over G*U = 1344-1792 terms: the
    # step cells' input gradient of the GRU case, TFGRADS_DISABLE_BRGEMM=1, is 1.4e-5 from the
    # oracle.)
    _float32_on_cpu_matches_oracle(case, threads, tol=3e-5 if case.D == 2 else 1e-5)


# The tiled steps (csrc/cpu/cudnn_rnn_rows.cpp) run where BRGEMM does not: float64, float32
# with units that BRGEMM's blocks do not divide (below), and everything under
# TFGRADS_DISABLE_BRGEMM=1 (test_forced_cpu_paths.py reruns this file so). One thread runs
# all rows; two threads own 8 or more rows each (9 + 8 and 10 + 9 here, past the tiles' 6 or
# 12 rows); bidirectional layers run a direction per thread. Gate widths G*U of 28-52 end in
# partial panels (16 or 32 columns). The weight gradients of the case with I = 100 run over two
# chunks of T*B = 312 rows (256 each) and two blocks of I + U + 1 = 110 rows (96 each). The last
# case's direction weights (3.4 MB in float32) exceed rnn_directions_in_turn_above_bytes: on two
# threads its directions take turns, each over both threads' rows.
TILED_CASES = [
    Case("lstm", 1, 1, T_=5, B=19, I=9, U=13, lengths=[5, 1, 3, 5, 2] * 3 + [4, 5, 1, 2]),
    Case("lstm", 1, 2, T_=4, B=17, I=6, U=10, lengths=[4, 2, 1, 3] * 4 + [4]),
    Case("gru", 1, 1, T_=4, B=17, I=5, U=12, lengths=[4, 1, 3] * 5 + [2, 4]),
    Case("gru", 2, 2, T_=3, B=16, I=5, U=11, time_major=False),
    Case("rnn_relu", 2, 1, T_=3, B=16, I=6, U=7),
    Case("rnn_tanh", 1, 2, T_=3, B=18, I=4, U=9, time_major=False),
    Case("lstm", 1, 1, T_=12, B=26, I=100, U=9),
    # dG's rows 4 KiB (float64) or 2 KiB (float32, BRGEMM disabled) apart: the tiles copy them
    # one cache line further apart
    Case("lstm", 1, 1, T_=3, B=16, I=8, U=128, lengths=[3, 2, 1, 3] * 4),
    Case("lstm", 1, 2, T_=2, B=16, I=400, U=300, lengths=[2, 1] * 8),
]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(
    "dtype,tol", [(torch.float32, 2e-5), (torch.float64, 1e-12)], ids=["f32", "f64"]
)
@pytest.mark.parametrize("case", TILED_CASES, ids=repr)
def test_tiled_steps_match_oracle(case, dtype, tol, threads):
    wide = case.U * (case.I + case.U) > 10**5  # float32 sums over thousands of terms
    _float32_on_cpu_matches_oracle(case, threads, tol=tol * (2 if wide else 1), dtype=dtype)


@pytest.mark.parametrize("mode", ["lstm", "gru"])
@pytest.mark.parametrize("batch", [15, 65])
def test_fused_steps_with_few_and_many_rows_per_thread(mode, batch):
    # The fused float32 steps run at every batch size. With AVX-512, 65 rows on two threads are
    # owned 33 and 32 per thread (each runs every step for its rows) and 15 split each step's unit
    # blocks instead; on the 8-lane path 15 split the blocks and 65 run on the tiles, owned the
    # same way (rnn_tiles_before_brgemm_up_to_bytes). Against the float64 oracle, with lengths
    # (rows past theirs carry h and c).
    lengths = [(3 * b) % 6 + 1 for b in range(batch)]
    _float32_on_cpu_matches_oracle(Case(mode, 1, 1, T_=6, B=batch, I=12, U=32, lengths=lengths), 2)


def test_padded_outputs_are_zero_and_states_taken_at_each_length():
    case = Case("lstm", 2, 2, lengths=[6, 2, 4, 1])
    x, h, c, p, lens = case.tensors()
    out, oh, oc, _, _ = case.run(x, h, c, p, lens)
    for b, n in enumerate(case.lengths):
        assert torch.all(out[n:, b] == 0)
        # Running sequence b alone, truncated to its length, gives the same valid outputs and
        # final states (both directions start and end inside the sequence).
        one = Case("lstm", 2, 2, T_=n, B=1, lengths=[n])
        o1, h1, c1, _, _ = one.run(
            x[:n, b : b + 1],
            h[:, b : b + 1],
            c[:, b : b + 1],
            p,
            torch.tensor([n], dtype=torch.int32),
        )
        torch.testing.assert_close(out[:n, b : b + 1], o1, rtol=0, atol=1e-14)
        torch.testing.assert_close(oh[:, b : b + 1], h1, rtol=0, atol=1e-14)
        torch.testing.assert_close(oc[:, b : b + 1], c1, rtol=0, atol=1e-14)


def test_batch_major_states_are_a_reshape_not_a_transpose():
    # TF hands the [B, L*D, H] buffer to cuDNN as [L*D, B, H] (a reshape, as TF does).
    tm = Case("gru", 2, 1, time_major=True)
    x, h, c, p, lens = tm.tensors()
    out, oh, _, _, _ = tm.run(x, h, c, p, lens)
    bm = Case("gru", 2, 1, time_major=False)
    out_b, oh_b, _, _, _ = bm.run(x.transpose(0, 1), h.reshape(tm.B, 2, tm.U), c, p, lens)
    assert torch.equal(out_b, out.transpose(0, 1))
    assert torch.equal(oh_b, oh.reshape(tm.B, 2, tm.U))


GRAD_CASES = [
    Case("lstm", 2, 2, time_major=False, lengths=[4, 2, 3], T_=4, B=3, I=3, U=4),
    Case("lstm", 2, 1, P=2, lengths=[4, 1, 3], T_=4, B=3, I=3, U=4),
    Case("gru", 2, 2, lengths=[4, 2, 3], T_=4, B=3, I=3, U=4),
    Case("rnn_tanh", 1, 2, time_major=False, T_=4, B=3, I=3, U=4),
    Case("rnn_relu", 2, 1, lengths=[3, 4, 1], T_=4, B=3, I=3, U=4),
]


@pytest.mark.parametrize("case", GRAD_CASES, ids=repr)
def test_gradcheck(case):
    x, h, c, p, lens = (t.requires_grad_() if t.is_floating_point() else t for t in case.tensors())
    n_out = 3 if case.mode == "lstm" else 2
    assert gradcheck(lambda *a: case.run(*a, lens)[:n_out], (x, h, c, p))


GRADGRAD_CASES = [
    Case("lstm", 2, 2, lengths=[3, 1], T_=3, B=2, I=2, U=3),
    Case("lstm", 1, 1, P=2, time_major=False, lengths=[2, 3], T_=3, B=2, I=2, U=3),
    Case("gru", 2, 2, time_major=False, lengths=[3, 2], T_=3, B=2, I=2, U=3),
    Case("rnn_tanh", 2, 1, T_=3, B=2, I=2, U=3),
    Case("rnn_relu", 1, 2, lengths=[1, 3], T_=3, B=2, I=2, U=3),
]


@pytest.mark.parametrize("case", GRADGRAD_CASES, ids=repr)
def test_gradgradcheck(case):
    # Second order goes through cudnn_rnn_backprop_v3's own backward.
    x, h, c, p, lens = (t.requires_grad_() if t.is_floating_point() else t for t in case.tensors())
    if case.mode == "lstm":
        assert gradgradcheck(lambda *a: case.run(*a, lens)[:3], (x, h, c, p), fast_mode=True)
    else:
        assert gradgradcheck(
            lambda x, h, p: case.run(x, h, c, p, lens)[:2], (x, h, p), fast_mode=True
        )


def test_gradgradcheck_with_dropout_and_skip_input():
    case = Case("gru", 3, 1, lengths=[3, 2], T_=3, B=2, I=3, U=3)
    x, h, c, p, lens = case.tensors()
    p = torch.randn(T.cudnn_rnn_params_size(3, 3, 3, "gru", "skip_input"), dtype=torch.float64)
    x, h, p = (t.requires_grad_() for t in (x, h, p))
    assert gradgradcheck(
        lambda x, h, p: T.cudnn_rnn_v3(
            x, h, c, p, lens, "gru", "skip_input", dropout=0.5, seed=2, seed2=5
        )[:2],
        (x, h, p),
    )


def test_gradcheck_with_dropout_fixed_seed():
    # A nonzero seed fixes the mask, so the function is deterministic and gradcheck applies;
    # the backward reads the mask back from reserve_space.
    case = Case("lstm", 3, 2, T_=3, B=2, I=3, U=3)
    x, h, c, p, lens = (t.requires_grad_() if t.is_floating_point() else t for t in case.tensors())
    assert gradcheck(lambda *a: case.run(*a, lens, dropout=0.4, seed=3, seed2=9)[:3], (x, h, c, p))


def test_dropout_between_layers_only_and_deterministic():
    case = Case("gru", 3, 1)
    x, h, c, p, lens = case.tensors()
    a = case.run(x, h, c, p, lens, dropout=0.5, seed=1, seed2=2)[0]
    b = case.run(x, h, c, p, lens, dropout=0.5, seed=1, seed2=2)[0]
    other = case.run(x, h, c, p, lens, dropout=0.5, seed=1, seed2=3)[0]
    plain = case.run(x, h, c, p, lens)[0]
    assert torch.equal(a, b) and not torch.equal(a, other) and not torch.equal(a, plain)
    # Not in inference, and never with one layer (dropout only feeds the next layer).
    assert torch.equal(case.run(x, h, c, p, lens, dropout=0.5, seed=1, is_training=False)[0], plain)
    one = Case("gru", 1, 1)
    x1, h1, c1, p1, l1 = one.tensors()
    assert torch.equal(
        one.run(x1, h1, c1, p1, l1, dropout=0.5, seed=1)[0], one.run(x1, h1, c1, p1, l1)[0]
    )
    # Seeds (0, 0) draw from torch's generator: reproducible under torch.manual_seed.
    torch.manual_seed(7)
    s1 = case.run(x, h, c, p, lens, dropout=0.5)[0]
    torch.manual_seed(7)
    assert torch.equal(s1, case.run(x, h, c, p, lens, dropout=0.5)[0])


@pytest.mark.parametrize("mode", ["lstm", "gru", "rnn_tanh"])
def test_skip_input_adds_the_input_to_every_gate(mode):
    # skip_input == linear_input with identity input matrices in layer 0; its buffer omits them.
    case = Case(mode, 2, 2, I=7, U=7, lengths=[6, 2, 5, 3])
    x, h, c, p_lin, lens = case.tensors()
    G = GATES[mode]
    lin_w, lin_b = T.cudnn_rnn_params_to_canonical_v2(
        2, 7, 7, p_lin, 8 * G, 8 * G, mode, "linear_input", case.direction
    )
    eye = torch.eye(7, dtype=torch.float64)
    skip_w, ident_w = [], []
    per = 2 * G
    for pl in range(4):
        mats = lin_w[pl * per : (pl + 1) * per]
        if pl < 2:  # layer 0: drop the input matrices (skip) / replace them by I (linear)
            skip_w += mats[G:]
            ident_w += [eye] * G + mats[G:]
        else:
            skip_w += mats
            ident_w += mats
    p_skip = T.cudnn_rnn_canonical_to_params_v2(
        2, 7, 7, skip_w, lin_b, mode, "skip_input", case.direction
    )
    assert (
        p_skip.numel()
        == T.cudnn_rnn_params_size(2, 7, 7, mode, "skip_input", case.direction)
        == p_lin.numel() - 2 * G * 49
    )
    p_ident = T.cudnn_rnn_canonical_to_params_v2(
        2, 7, 7, ident_w, lin_b, mode, direction=case.direction
    )
    for input_mode in ("skip_input", "auto_select"):
        xs, hs, cs = (t.detach().requires_grad_() for t in (x, h, c))
        got = T.cudnn_rnn_v3(xs, hs, cs, p_skip, lens, mode, input_mode, case.direction)
        xl, hl, cl = (t.detach().requires_grad_() for t in (x, h, c))
        want = T.cudnn_rnn_v3(xl, hl, cl, p_ident, lens, mode, "linear_input", case.direction)
        torch.testing.assert_close(got[0], want[0], rtol=1e-13, atol=1e-13)
        torch.testing.assert_close(got[1], want[1], rtol=1e-13, atol=1e-13)
        (gx_s,) = torch.autograd.grad(got[0].square().sum(), xs)
        (gx_l,) = torch.autograd.grad(want[0].square().sum(), xl)
        torch.testing.assert_close(gx_s, gx_l, rtol=1e-12, atol=1e-12)
    # auto_select with input_size != num_units is linear_input.
    lin = Case(mode, 1, 1, I=5, U=7)
    x5, h5, c5, p5, l5 = lin.tensors()
    assert torch.equal(
        T.cudnn_rnn_v3(x5, h5, c5, p5, l5, mode, "auto_select")[0],
        T.cudnn_rnn_v3(x5, h5, c5, p5, l5, mode, "linear_input")[0],
    )


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_types_compute_in_float32(dtype):
    case = Case("lstm", 2, 2, lengths=[6, 3, 2, 6])
    x, h, c, p, lens = case.tensors(dtype)
    (out, oh, oc), grads = _grads_ours(
        case, x, h, c, p, lens, *_cotangents(case, _out_shape(case), h, c, dtype, "cpu")
    )
    x32, h32, c32, p32 = (t.float() for t in (x, h, c, p))
    dy, dh, dc = (t.float() for t in _cotangents(case, _out_shape(case), h, c, dtype, "cpu"))
    (o32, _, _), g32 = _grads_ours(case, x32, h32, c32, p32, lens, dy, dh, dc)
    assert out.dtype == dtype and all(g.dtype == dtype for g in grads)
    assert rel_err(out, o32) <= 1e-2
    for a, b in zip(grads, g32):
        assert rel_err(a, b) <= 2e-2
    reserve = case.run(x, h, c, p, lens)[3]
    assert reserve.dtype == dtype and reserve.dim() == 1


def test_noncontiguous_inputs():
    case = Case("gru", 2, 2, time_major=False, lengths=[6, 2, 3, 4])
    x, h, c, p, lens = case.tensors()
    ref = case.run(x, h, c, p, lens)
    xs = x.transpose(0, 1).contiguous().transpose(0, 1)  # same values, time-major memory
    ps = torch.stack([p, p], 1)[:, 0]  # strided params
    hs = h.transpose(0, 2).contiguous().transpose(0, 2)
    got = case.run(xs, hs, c, ps, lens)
    for a, b in zip(got[:3], ref[:3]):
        assert torch.equal(a, b)


def test_empty_batch():
    case = Case("lstm", 2, 2, B=0, lengths=[])
    x, h, c, p, lens = (t.requires_grad_() if t.is_floating_point() else t for t in case.tensors())
    out, oh, oc, reserve, _ = case.run(x, h, c, p, lens)
    assert out.shape == (6, 0, 14) and oh.shape == (4, 0, 7) and reserve.numel() == 0
    gx, gp = torch.autograd.grad(out.sum() + oh.sum() + oc.sum(), (x, p))
    assert gx.shape == x.shape and torch.equal(gp, torch.zeros_like(p))


def test_inference_outputs_and_placeholders():
    case = Case("gru", 2, 1)
    x, h, c, p, lens = case.tensors()
    train = case.run(x, h, c, p, lens)
    infer = case.run(x, h, c, p, lens, is_training=False)
    assert torch.equal(train[0], infer[0]) and torch.equal(train[1], infer[1])
    # TF's shapes: output_c (non-LSTM), reserve_space (inference), host_reserved are scalars.
    assert infer[2].shape == () and infer[3].shape == () and infer[4].shape == ()
    assert infer[4].dtype == torch.int8 and float(infer[3]) == 0.0 and float(infer[2]) == 0.0


def test_gradient_of_inference_forward_raises_value_error():
    case = Case("lstm", 1, 1)
    x, h, c, p, lens = case.tensors()
    p.requires_grad_()
    out = case.run(x, h, c, p, lens, is_training=False)[0]
    with pytest.raises(ValueError, match="is_training must be set to True"):
        out.sum().backward()


def test_backprop_op_with_reserve_space_directly():
    case = Case("lstm", 2, 2, P=3, time_major=False, lengths=[6, 4, 1, 2])
    x, h, c, p, lens = case.tensors()
    out, oh, oc, reserve, host = case.run(x, h, c, p, lens)
    dy, dh, dc = _cotangents(case, out.shape, h, c, torch.float64, "cpu")
    dx, dhx, dcx, dp = T.cudnn_rnn_backprop_v3(
        x,
        h,
        c,
        p,
        lens,
        out,
        oh,
        oc,
        dy,
        dh,
        dc,
        reserve,
        host,
        "lstm",
        direction="bidirectional",
        num_proj=3,
        time_major=False,
    )
    _, ref = _grads_oracle(case, x, h, c, p, lens, dy, dh, dc)
    for a, b in zip((dx, dhx, dp, dcx), ref):
        assert rel_err(a, b) <= 1e-12


# ---- params size and conversion ------------------------------------------------------------------
@pytest.mark.parametrize(
    "mode,L,bidir,P",
    [
        ("lstm", 2, True, 0),
        ("lstm", 3, True, 3),
        ("lstm", 2, False, 4),
        ("gru", 2, True, 0),
        ("rnn_tanh", 2, True, 0),
        ("rnn_relu", 1, False, 0),
    ],
)
def test_params_size_is_torch_parameter_count(mode, L, bidir, P):
    I, U = 5, 7
    kw = dict(num_layers=L, bidirectional=bidir)
    if mode == "lstm":
        m = torch.nn.LSTM(I, U, proj_size=P, **kw)
    elif mode == "gru":
        m = torch.nn.GRU(I, U, **kw)
    else:
        m = torch.nn.RNN(I, U, nonlinearity=mode[4:], **kw)
    direction = "bidirectional" if bidir else "unidirectional"
    n = T.cudnn_rnn_params_size(L, U, I, mode, direction=direction, num_proj=P)
    assert n == sum(q.numel() for q in m.parameters())
    # 0-d integer tensors are accepted, like TF's host scalars.
    assert (
        T.cudnn_rnn_params_size(
            torch.tensor(L), torch.tensor(U), torch.tensor(I), mode, direction=direction, num_proj=P
        )
        == n
    )


@pytest.mark.parametrize(
    "mode,L,D,P", [("lstm", 2, 2, 0), ("lstm", 2, 2, 3), ("gru", 3, 1, 0), ("rnn_relu", 1, 2, 0)]
)
def test_canonical_params_round_trip(mode, L, D, P):
    U, I = 6, 4
    direction = "bidirectional" if D == 2 else "unidirectional"
    G, Hh = GATES[mode], P or U
    n = T.cudnn_rnn_params_size(L, U, I, mode, direction=direction, num_proj=P)
    p = torch.randn(n)
    nw, nb = L * D * (2 * G + (1 if P else 0)), L * D * 2 * G
    w, b = T.cudnn_rnn_params_to_canonical_v2(
        L, U, I, p, nw, nb, mode, direction=direction, num_proj=P
    )
    assert len(w) == nw and len(b) == nb
    per = 2 * G + (1 if P else 0)
    for pl in range(L * D):
        in_w = I if pl < D else D * Hh
        shapes = [tuple(t.shape) for t in w[pl * per : (pl + 1) * per]]
        assert shapes == [(U, in_w)] * G + [(U, Hh)] * G + ([(P, U)] if P else [])
    assert all(t.shape == (U,) for t in b)
    back = T.cudnn_rnn_canonical_to_params_v2(L, U, I, w, b, mode, direction=direction, num_proj=P)
    assert torch.equal(back, p)
    assert w[0].data_ptr() != p.data_ptr()  # copies, not views of params


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("threads", [1, 2])
def test_conversions_copy_large_and_strided_tensors(dtype, threads):
    # On the CPU both conversions copy every piece in one parallel region of 64 KiB chunks:
    # pieces straddling chunks, strided params, strided and negated-view weights.
    L, U, I, mode, direction = 2, 96, 50, "lstm", "bidirectional"
    G = GATES[mode]
    n = T.cudnn_rnn_params_size(L, U, I, mode, direction=direction)
    p = torch.randn(2 * n, dtype=torch.float64).to(dtype)[::2]
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        w, b = T.cudnn_rnn_params_to_canonical_v2(
            L, U, I, p, 4 * 2 * G, 4 * 2 * G, mode, direction=direction
        )
        strided = [t.t().contiguous().t() for t in w]
        negated = [torch._neg_view(-t) for t in b]
        back = T.cudnn_rnn_canonical_to_params_v2(
            L, U, I, strided, negated, mode, direction=direction
        )
    finally:
        torch.set_num_threads(before)
    off = 0  # per pseudo-layer: its 2G matrices, then its 2G biases
    for pl in range(L * 2):
        for t in w[pl * 2 * G : (pl + 1) * 2 * G] + b[pl * 2 * G : (pl + 1) * 2 * G]:
            assert t.dtype == dtype and t.is_contiguous()
            assert torch.equal(t.reshape(-1), p[off : off + t.numel()])
            off += t.numel()
    assert off == n
    assert back.dtype == dtype and torch.equal(back, p)


def test_single_layer_buffer_is_keras_concat():
    # One unidirectional layer: concat(flattened weights + biases), as Keras builds it.
    w = [torch.randn(5, 3) for _ in range(4)] + [torch.randn(5, 5) for _ in range(4)]
    b = [torch.randn(5) for _ in range(8)]
    p = T.cudnn_rnn_canonical_to_params_v2(1, 5, 3, w, b)
    assert torch.equal(p, torch.cat([t.reshape(-1) for t in w + b]))


def test_conversions_are_differentiable():
    p = torch.randn(
        T.cudnn_rnn_params_size(2, 3, 2, "gru", direction="bidirectional"),
        dtype=torch.float64,
        requires_grad=True,
    )
    assert gradcheck(
        lambda q: T.cudnn_rnn_params_to_canonical_v2(
            2, 3, 2, q, 24, 24, "gru", direction="bidirectional"
        )[0][7],
        (p,),
    )
    w, b = T.cudnn_rnn_params_to_canonical_v2(
        2, 3, 2, p.detach(), 24, 24, "gru", direction="bidirectional"
    )
    w = [t.requires_grad_() for t in w]
    assert gradcheck(
        lambda *ws: T.cudnn_rnn_canonical_to_params_v2(
            2, 3, 2, list(ws), b, "gru", direction="bidirectional"
        ),
        tuple(w),
    )
    # Second order: each conversion's backward is the other conversion, itself differentiable.
    assert gradgradcheck(
        lambda q: T.cudnn_rnn_params_to_canonical_v2(
            2, 3, 2, q, 24, 24, "gru", direction="bidirectional"
        )[0][7],
        (p,),
    )
    assert gradgradcheck(
        lambda *ws: T.cudnn_rnn_canonical_to_params_v2(
            2, 3, 2, list(ws), b, "gru", direction="bidirectional"
        ),
        tuple(w),
    )


# ---- opcheck -------------------------------------------------------------------------------------
def _op_samples():
    small = dict(T_=3, B=2, I=3, U=3)  # opcheck traces the (Python, per-step) double backward
    yield from [
        (Case("lstm", 2, 2, P=2, lengths=[3, 1], **small), {}),
        (Case("gru", 2, 1, time_major=False, **small), dict(dropout=0.3, seed=1, seed2=2)),
        (Case("rnn_tanh", 1, 2, lengths=[1, 3], **small), dict(is_training=False)),
    ]


# Differentiating an inference forward is an error (TF's ValueError, tested above), so the
# autograd utilities of opcheck do not apply to it.
_INFERENCE_UTILS = ("test_schema", "test_autograd_registration", "test_faketensor")


def opcheck_samples():
    """(op name, args, kwargs) for test_opcheck (and tests/test_registry.py); kwargs may hold
    opcheck's own `test_utils`."""
    for requires_grad in (False, True):
        for case, kw in _op_samples():
            x, h, c, p, lens = case.tensors(torch.float32)
            for t in (x, h, c, p):
                t.requires_grad_(requires_grad)
            attrs = dict(
                rnn_mode=case.mode,
                direction=case.direction,
                num_proj=case.P,
                time_major=case.time_major,
            )
            fwd_kw = dict(attrs, **kw)
            if not fwd_kw.get("is_training", True):
                utils = _INFERENCE_UTILS if requires_grad else None
                yield "cudnn_rnn_v3", (x, h, c, p, lens), dict(fwd_kw, test_utils=utils)
                continue
            yield "cudnn_rnn_v3", (x, h, c, p, lens), fwd_kw
            out, oh, oc, reserve, host = torch.ops.tfgrads.cudnn_rnn_v3(x, h, c, p, lens, **fwd_kw)
            dy, dh, dc = (torch.randn_like(t).requires_grad_(requires_grad) for t in (out, oh, oc))
            bw_kw = {k: v for k, v in fwd_kw.items() if k != "is_training"}
            yield (
                "cudnn_rnn_backprop_v3",
                (
                    x,
                    h,
                    c,
                    p,
                    lens,
                    out.detach(),
                    oh.detach(),
                    oc.detach(),
                    dy,
                    dh,
                    dc,
                    reserve,
                    host,
                ),
                bw_kw,
            )
            G = GATES[case.mode]
            counts = (case.L * case.D * (2 * G + (1 if case.P else 0)), case.L * case.D * 2 * G)
            conv = dict(rnn_mode=case.mode, direction=case.direction, num_proj=case.P)
            yield "cudnn_rnn_params_to_canonical_v2", (case.L, case.U, case.I, p, *counts), conv
            w, b = torch.ops.tfgrads.cudnn_rnn_params_to_canonical_v2(
                case.L, case.U, case.I, p.detach(), *counts, **conv
            )
            w = [t.requires_grad_(requires_grad) for t in w]
            yield "cudnn_rnn_canonical_to_params_v2", (case.L, case.U, case.I, w, b), conv


@pytest.mark.parametrize("sample", list(opcheck_samples()), ids=lambda s: s[0])
def test_opcheck(sample):
    name, args, kwargs = sample
    kwargs = dict(kwargs)
    utils = kwargs.pop("test_utils", None) or torch.library._OPCHECK_DEFAULT_UTILS
    torch.library.opcheck(getattr(torch.ops.tfgrads, name).default, args, kwargs, test_utils=utils)


# ---- modules -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "cls,torch_cls,kw",
    [
        (T.nn.CudnnLSTM, torch.nn.LSTM, dict(proj_size=3)),
        (T.nn.CudnnGRU, torch.nn.GRU, {}),
        (T.nn.CudnnRNNTanh, torch.nn.RNN, {}),
        (T.nn.CudnnRNNRelu, torch.nn.RNN, dict(nonlinearity="relu")),
    ],
)
def test_module_from_and_to_torch(cls, torch_cls, kw):
    m = torch_cls(4, 6, 2, bidirectional=True, batch_first=True, dtype=torch.float64, **kw)
    ours = cls.from_torch(m)
    assert not ours.time_major and ours.num_layers == 2
    x = torch.randn(3, 5, 4, dtype=torch.float64)
    want, _ = m(x)
    got, states = ours(x)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    assert len(states) == (2 if cls is T.nn.CudnnLSTM else 1)
    back = ours.to_torch()
    for (k, a), (k2, b) in zip(m.state_dict().items(), back.state_dict().items()):
        assert k == k2 and torch.equal(a, b)
    with pytest.raises(TypeError, match="from_torch expects"):
        cls.from_torch(torch.nn.Linear(2, 2))


def test_module_training_eval_and_canonical_weights():
    layer = T.nn.CudnnLSTM(2, 5, direction="bidirectional", dropout=0.5, seed=4, input_size=3)
    w, b = layer.canonical_weights()
    assert all(torch.equal(t, torch.zeros_like(t)) for t in b)  # TF's zero bias init
    assert w[0].abs().max() <= (6 / (3 + 5)) ** 0.5  # Glorot-uniform bound
    x = torch.randn(4, 2, 3)
    layer.train()
    out_train, (h, c) = layer(x)
    layer.eval()
    out_eval, _ = layer(x)
    assert not torch.equal(out_train, out_eval)  # dropout in training only
    out_eval.sum().backward()  # eval mode still keeps a reserve space when grads are needed
    assert layer.params.grad is not None and layer.params.grad.abs().sum() > 0
    with torch.no_grad():
        assert layer(x)[0].shape == (4, 2, 10)
    w2 = [t * 2 for t in w]
    layer.set_canonical_weights(w2, b)
    assert torch.equal(layer.canonical_weights()[0][3], w2[3])


# ---- CUDA against CPU ----------------------------------------------------------------------------
@pytest.mark.parametrize("device", CUDA_DEVICES)
@pytest.mark.parametrize("case", CASES[:5], ids=repr)
def test_cuda_matches_cpu(case, device):
    cpu = case.tensors(torch.float64)
    dev = [t.to(device) for t in cpu]
    dy, dh, dc = _cotangents(case, _out_shape(case), cpu[1], cpu[2], torch.float64, "cpu")
    o_cpu, g_cpu = _grads_ours(case, *cpu, dy, dh, dc)
    o_dev, g_dev = _grads_ours(case, *dev, dy.to(device), dh.to(device), dc.to(device))
    for a, b in zip(o_dev + g_dev, o_cpu + g_cpu):
        assert rel_err(a, b) <= 1e-12


def test_random_configurations_float32_within_1e5():
    # The parity command's cases: random modes, layers, directions, projection, lengths and
    # layouts; float32 outputs and all gradients vs the float64 torch oracle.
    import random

    from torch_tfgrads.parity.cudnn_rnn import TOL, check_case, random_case

    rng = random.Random(11)
    for i in range(40):
        case = random_case(rng)
        for op, err in check_case(case, i).items():
            assert err <= TOL, (op, case, err)
