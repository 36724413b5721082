"""CudnnRNN family in the parity command. TF 2.21 has no CPU kernel for these ops (every Cudnn*
op raises NotFoundError on TF's CPU), so the oracles are torch.nn.LSTM/GRU/RNN in float64 with
the opaque buffer mapped as docs/ops/cudnn_rnn.md describes
(every mode, layers, directions, projection, lengths, both layouts) and, for single layers,
Keras 3 on TF's CPU kernels through the buffer Keras builds for CudnnRNNV3. Float32 results,
outputs and every gradient, within 1e-5 normwise relative error."""

import random

import torch

import torch_tfgrads as T

from . import Row
from .cudnn_rnn_keras import keras_rnn
from .cudnn_rnn_torch import GATES, oracle

OPS = [
    "cudnn_rnn_v3",
    "cudnn_rnn_backprop_v3",
    "cudnn_rnn_canonical_to_params_v2",
    "cudnn_rnn_params_to_canonical_v2",
]
TOL = 1e-5


def _rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item() if b.numel() else 0.0


def random_case(rng):
    mode = rng.choice(list(GATES))
    L, D = rng.choice([1, 2, 3]), rng.choice([1, 2])
    P = rng.choice([0, 0, 3]) if mode == "lstm" else 0
    T_, B, I, U = rng.randint(1, 7), rng.randint(1, 5), rng.randint(1, 6), rng.randint(4, 8)
    lengths = [rng.randint(1, T_) for _ in range(B)] if rng.random() < 0.6 else [T_] * B
    return dict(
        mode=mode,
        L=L,
        D=D,
        P=P,
        T=T_,
        B=B,
        I=I,
        U=U,
        lengths=lengths,
        time_major=rng.random() < 0.5,
    )


def check_case(c, seed):
    """{op: error} of float32 ours vs the float64 torch oracle, forward and backward."""
    g = torch.Generator().manual_seed(seed)
    Hh, LD = c["P"] or c["U"], c["L"] * c["D"]
    direction = "bidirectional" if c["D"] == 2 else "unidirectional"
    n = T.cudnn_rnn_params_size(
        c["L"], c["U"], c["I"], c["mode"], direction=direction, num_proj=c["P"]
    )
    x = torch.randn(c["T"], c["B"], c["I"], generator=g, dtype=torch.float64)
    h = torch.randn(LD, c["B"], Hh, generator=g, dtype=torch.float64) * 0.5
    cc = torch.randn(LD, c["B"], c["U"], generator=g, dtype=torch.float64) * 0.5
    p = torch.randn(n, generator=g, dtype=torch.float64) * 0.4
    if not c["time_major"]:
        x = x.transpose(0, 1).contiguous()
        h, cc = h.reshape(c["B"], LD, Hh), cc.reshape(c["B"], LD, c["U"])
    lens = torch.tensor(c["lengths"], dtype=torch.int32)
    lstm = c["mode"] == "lstm"
    n_out = 3 if lstm else 2
    # The oracle once, float64, with its gradients: (x, h, [c], params in the opaque layout).
    ref_leaves = [t.clone().requires_grad_() for t in (x, h, cc)]
    out_r, h_r, c_r, module = oracle(
        c["mode"], *ref_leaves, p, c["D"], c["P"], c["time_major"], lens
    )
    cot = [torch.randn(t.shape, generator=g, dtype=torch.float64) for t in (out_r, h_r, cc)]
    params = list(module.parameters())  # registration order = the opaque layout
    wrt = ref_leaves[:2] + ([ref_leaves[2]] if lstm else []) + params
    ref = torch.autograd.grad([out_r, h_r, c_r][:n_out], wrt, cot[:n_out])
    n_state = 3 if lstm else 2
    ref = list(ref[:n_state]) + [torch.cat([r.reshape(-1) for r in ref[n_state:]])]
    # Ours in float32.
    leaves = [t.float().requires_grad_() for t in (x, h, cc, p)]
    out, oh, oc, _, _ = T.cudnn_rnn_v3(
        *leaves, lens, c["mode"], direction=direction, num_proj=c["P"], time_major=c["time_major"]
    )
    ours = torch.autograd.grad(
        [out, oh, oc][:n_out],
        leaves if lstm else leaves[:2] + leaves[3:],
        [t.float() for t in cot[:n_out]],
    )
    return {
        "cudnn_rnn_v3": max(_rel(out, out_r), _rel(oh, h_r), _rel(oc, c_r) if lstm else 0.0),
        "cudnn_rnn_backprop_v3": max(_rel(a, b) for a, b in zip(ours, ref)),
    }


def _keras_errors(rng, seed):
    """Single-layer LSTM/GRU/SimpleRNN against Keras, with masks: {op: error}."""
    from ..nn.cudnn_rnn import keras_to_canonical

    errs = {}
    for mode in ("lstm", "gru", "rnn_tanh"):
        g = torch.Generator().manual_seed(seed + rng.randint(0, 1000))
        B, T_, I, U = 3, 5, 4, 6
        G = GATES[mode]
        kernel = torch.randn(I, G * U, generator=g, dtype=torch.float64) * 0.5
        rec = torch.randn(U, G * U, generator=g, dtype=torch.float64) * 0.5
        bias = (
            torch.randn((2, G * U) if mode == "gru" else (G * U,), generator=g, dtype=torch.float64)
            * 0.3
        )
        x = torch.randn(B, T_, I, generator=g, dtype=torch.float64)
        lens = torch.tensor([5, 2, 4], dtype=torch.int32)
        zeros = torch.zeros(B, U, dtype=torch.float64)
        k_out, k_h, _, _ = keras_rnn(
            mode, x, lens, kernel, rec, bias, (torch.zeros(B, T_, U), zeros, zeros), zeros, zeros
        )
        w, b = keras_to_canonical(mode, kernel.float(), rec.float(), bias.float())
        p = T.cudnn_rnn_canonical_to_params_v2(1, U, I, w, b, mode)
        out, h, _, _, _ = T.cudnn_rnn_v3(
            x.float(),
            zeros[:, None].float(),
            zeros[:, None].float(),
            p,
            lens,
            mode,
            time_major=False,
        )
        valid = (torch.arange(T_)[None, :] < lens[:, None])[..., None]
        errs[f"cudnn_rnn_v3 vs Keras {mode}"] = max(
            _rel(out * valid, k_out * valid), _rel(h[:, 0], k_h)
        )
    return errs


def run(tf, n_cases, seed, log):
    rng = random.Random(seed)
    worst, counts = {}, {}
    for i in range(n_cases):
        for op, err in check_case(random_case(rng), seed + i).items():
            worst[op] = max(worst.get(op, 0.0), err)
            counts[op] = counts.get(op, 0) + 1
    # The conversions are exact inverses (bit-identical round trips on every case above's
    # configuration family).
    conv = 0.0
    for _ in range(n_cases):
        c = random_case(rng)
        direction = "bidirectional" if c["D"] == 2 else "unidirectional"
        n = T.cudnn_rnn_params_size(
            c["L"], c["U"], c["I"], c["mode"], direction=direction, num_proj=c["P"]
        )
        p = torch.randn(n)
        G, LD = GATES[c["mode"]], c["L"] * c["D"]
        w, b = T.cudnn_rnn_params_to_canonical_v2(
            c["L"],
            c["U"],
            c["I"],
            p,
            LD * (2 * G + (1 if c["P"] else 0)),
            LD * 2 * G,
            c["mode"],
            direction=direction,
            num_proj=c["P"],
        )
        back = T.cudnn_rnn_canonical_to_params_v2(
            c["L"], c["U"], c["I"], w, b, c["mode"], direction=direction, num_proj=c["P"]
        )
        conv = max(conv, 0.0 if torch.equal(back, p) else float("inf"))
    for op in ("cudnn_rnn_canonical_to_params_v2", "cudnn_rnn_params_to_canonical_v2"):
        worst[op], counts[op] = conv, n_cases
    for op, err in _keras_errors(rng, seed).items():
        worst[op], counts[op] = err, 1
    log(
        f"{n_cases} random configurations (modes, layers, directions, projection, lengths, "
        "layouts) vs torch.nn float64; single layers vs Keras 3 on TF"
    )
    rows = []
    for k in sorted(worst):
        tol = 0.0 if "params" in k else TOL
        rows.append(Row(k, counts[k], worst[k], tol))
    return rows
