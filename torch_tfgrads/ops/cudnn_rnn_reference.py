"""cudnn_rnn_v3's training forward written with differentiable torch ops.

Used for second-order gradients: the backward of `cudnn_rnn_backprop_v3` differentiates this
composite twice (TF has no such gradient; cuDNN cannot provide one). Same math, layout, length
handling and dropout masks (read from the forward's reserve space) as the C++ driver
(csrc/common/cudnn_rnn_driver.cpp), but step by step in Python: slow, only for double backward.
"""

import torch


def _layer_views(cfg, flat):
    """Per pseudo-layer (W or None, R, bW, bR, Wp or None): the opaque layout."""
    views, off = [], 0

    def take(*shape):
        nonlocal off
        n = 1
        for s in shape:
            n *= s
        t = flat[off : off + n].view(shape)
        off += n
        return t

    GU = cfg.G * cfg.U
    for layer in range(cfg.L):
        for _ in range(cfg.D):
            W = take(GU, cfg.in_width(layer)) if cfg.has_input_weights(layer) else None
            R, bW, bR = take(GU, cfg.Hh), take(GU), take(GU)
            Wp = take(cfg.P, cfg.U) if cfg.P else None
            views.append((W, R, bW, bR, Wp))
    return views


def dropout_masks(cfg, reserve, T, B, compute_dtype):
    """The dropout masks [T, B, D*Hh] below the top layer, from the reserve space."""
    flat = reserve if reserve.dtype == compute_dtype else reserve.view(compute_dtype)
    per_pseudo = T * B * (cfg.act_width() + (cfg.U if cfg.lstm else 0) + cfg.Hh)
    width = T * B * cfg.D * cfg.Hh
    masks, off = [], 0
    for _ in range(cfg.L - 1):
        off += cfg.D * per_pseudo + width  # the layer's saved states and its output
        masks.append(flat[off : off + width].view(T, B, cfg.D * cfg.Hh))
        off += width
    return masks


def _cell(cfg, gx, gh, h, c, Wp):
    U = cfg.U
    if cfg.mode == "lstm":
        pre = gx + gh
        i, f = torch.sigmoid(pre[:, :U]), torch.sigmoid(pre[:, U : 2 * U])
        g, o = torch.tanh(pre[:, 2 * U : 3 * U]), torch.sigmoid(pre[:, 3 * U :])
        c = f * c + i * g
        h = o * torch.tanh(c)
        return (h @ Wp.t() if Wp is not None else h), c
    if cfg.mode == "gru":
        r = torch.sigmoid(gx[:, :U] + gh[:, :U])
        z = torch.sigmoid(gx[:, U : 2 * U] + gh[:, U : 2 * U])
        n = torch.tanh(gx[:, 2 * U :] + r * gh[:, 2 * U :])
        return n + z * (h - n), c
    pre = gx + gh
    return (torch.tanh(pre) if cfg.mode == "rnn_tanh" else torch.relu(pre)), c


def forward(cfg, x, h0, c0, params, lengths, time_major, masks):
    """(output, output_h, output_c) in TF's shapes; x/h0/c0/params in the compute dtype."""
    xt = x if time_major else x.transpose(0, 1)
    T, B = xt.shape[0], xt.shape[1]
    LD = cfg.L * cfg.D
    h0 = h0.reshape(LD, B, cfg.Hh)  # TF's batch-major states are a reshape, not a transpose
    c0 = c0.reshape(LD, B, cfg.U) if cfg.lstm else None
    lens = lengths.to(device=x.device, dtype=torch.long)
    steps = torch.arange(T, device=x.device)
    active = (steps[:, None] < lens[None, :])[..., None]  # [T, B, 1]
    # Reverse direction: processing step s of row b is time len_b-1-s (steps past the length
    # stay put); the map is its own inverse.
    rev = torch.where(active[..., 0], lens[None, :] - 1 - steps[:, None], steps[:, None])
    rows = torch.arange(B, device=x.device)[None, :]
    views = _layer_views(cfg, params)
    hn, cn, layer_in = [], [], xt
    for layer in range(cfg.L):
        outs = []
        for d in range(cfg.D):
            W, R, bW, bR, Wp = views[layer * cfg.D + d]
            seq = layer_in if d == 0 else layer_in[rev, rows]
            gx_all = (seq @ W.t() + bW) if W is not None else (seq.repeat(1, 1, cfg.G) + bW)
            h, c = h0[layer * cfg.D + d], (c0[layer * cfg.D + d] if cfg.lstm else None)
            ys = []
            for s in range(T):
                h_new, c_new = _cell(cfg, gx_all[s], h @ R.t() + bR, h, c, Wp)
                a = active[s]
                h = torch.where(a, h_new, h)
                if cfg.lstm:
                    c = torch.where(a, c_new, c)
                ys.append(torch.where(a, h_new, torch.zeros_like(h_new)))
            y = torch.stack(ys)
            outs.append(y if d == 0 else y[rev, rows])
            hn.append(h)
            cn.append(c)
        layer_in = torch.cat(outs, dim=2)
        if layer + 1 < cfg.L and masks:
            layer_in = layer_in * masks[layer]
    out = layer_in if time_major else layer_in.transpose(0, 1)
    h_n = torch.stack(hn).reshape(h0.shape if time_major else (B, LD, cfg.Hh))
    c_n = None
    if cfg.lstm:
        c_n = torch.stack(cn).reshape(c0.shape if time_major else (B, LD, cfg.U))
    return out, h_n, c_n
