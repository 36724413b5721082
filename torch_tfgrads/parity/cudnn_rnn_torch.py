"""Oracle for the CudnnRNN family: torch.nn.LSTM/GRU/RNN in float64 with the opaque buffer
mapped to torch's weights as docs/ops/cudnn_rnn.md describes, written independently of torch_tfgrads.nn.

Variable lengths go through pack_padded_sequence / pad_packed_sequence (zero padding, final
states at each sequence's last step), batch-major states through TF's reshape (B7).
"""

import torch

GATES = {"lstm": 4, "gru": 3, "rnn_tanh": 1, "rnn_relu": 1}


def make_torch_rnn(mode, I, U, L, D, P, params):
    """The torch module whose parameters are the opaque `params` (linear_input)."""
    kw = dict(input_size=I, hidden_size=U, num_layers=L, bidirectional=D == 2, dtype=torch.float64)
    if mode == "lstm":
        m = torch.nn.LSTM(proj_size=P, **kw)
    elif mode == "gru":
        m = torch.nn.GRU(**kw)
    else:
        m = torch.nn.RNN(nonlinearity=mode[4:], **kw)
    G, Hh = GATES[mode], (P or U)
    flat, off = params.detach().double().cpu(), 0
    state = {}
    for layer in range(L):
        for d in range(D):
            sfx = f"_l{layer}" + ("_reverse" if d else "")
            in_w = I if layer == 0 else D * Hh
            # per pseudo-layer: G input matrices, G recurrent matrices, G+G biases, projection
            for name, shape in (
                (f"weight_ih{sfx}", (G * U, in_w)),
                (f"weight_hh{sfx}", (G * U, Hh)),
                (f"bias_ih{sfx}", (G * U,)),
                (f"bias_hh{sfx}", (G * U,)),
            ):
                n = 1
                for s in shape:
                    n *= s
                state[name] = flat[off : off + n].view(shape)
                off += n
            if P:
                state[f"weight_hr{sfx}"] = flat[off : off + P * U].view(P, U)
                off += P * U
    assert off == flat.numel(), (off, flat.numel())
    m.load_state_dict(state)
    return m


def oracle(mode, x, h0, c0, params, D, P, time_major, lengths):
    """float64 (output, output_h, output_c) in TF's shapes, differentiable w.r.t. x, h0, c0
    and the torch module's parameters (returned last)."""
    if time_major:
        T, B, I = x.shape
    else:
        B, T, I = x.shape
    LD, Hh = (h0.shape[0], h0.shape[2]) if time_major else (h0.shape[1], h0.shape[2])
    L = LD // D
    U = c0.shape[-1] if mode == "lstm" else Hh
    m = make_torch_rnn(mode, I, U, L, D, P, params)
    h = h0.reshape(LD, B, Hh)  # TF's batch-major states: a reshape, not a transpose
    state = (h, c0.reshape(LD, B, U)) if mode == "lstm" else h
    xt = x if time_major else x.transpose(0, 1)
    packed = torch.nn.utils.rnn.pack_padded_sequence(xt, lengths.cpu().long(), enforce_sorted=False)
    out, st = m(packed, state)
    out, _ = torch.nn.utils.rnn.pad_packed_sequence(out, total_length=T)
    hn, cn = st if mode == "lstm" else (st, None)
    if not time_major:
        out = out.transpose(0, 1)
        hn = hn.reshape(B, LD, Hh)
        cn = cn.reshape(B, LD, U) if cn is not None else None
    return out, hn, cn, m
