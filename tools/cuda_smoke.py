"""Every CUDA kernel of torch_tfgrads once, on shapes large enough for the multi-block paths, for
compute-sanitizer (memcheck, racecheck) in `make gpu-test`. Checks each CUDA result against the
CPU kernel too, so a sanitizer-clean but wrong kernel still fails."""

import os
import sys

import torch

import torch_tfgrads as T


def close(name, got, want, tol):
    got, want = got.detach().cpu().double(), want.detach().cpu().double()
    err = (got - want).abs().max().item() / max(want.abs().max().item(), 1e-30)
    print(f"{name:<48} rel err {err:.2e}")
    return err <= tol


def main():
    # TFGRADS_SMOKE_DEVICE=cpu runs the same calls CPU against CPU (a check of this script).
    dev = os.environ.get("TFGRADS_SMOKE_DEVICE", "cuda")
    assert dev == "cpu" or torch.cuda.is_available(), "no GPU"
    ok = True
    g = torch.Generator().manual_seed(0)

    # FusedBatchNorm: many partial sums per channel, odd C, both layouts, training + grad.
    for shape, fmt in (((64, 33, 35, 65), "NHWC"), ((16, 300, 17, 19), "NCHW")):
        c = shape[3] if fmt == "NHWC" else shape[1]
        x = torch.randn(shape, generator=g)
        s, o = torch.rand(c, generator=g) + 0.5, torch.randn(c, generator=g)
        cpu = T.fused_batch_norm_v3(x, s, o, data_format=fmt)
        gpu = T.fused_batch_norm_v3(x.to(dev), s.to(dev), o.to(dev), data_format=fmt)
        ok &= close(f"fused_batch_norm_v3 {fmt} {shape}", gpu[0], cpu[0], 1e-5)
        dy = torch.randn(shape, generator=g)
        gc = T.fused_batch_norm_grad_v3(dy, x, s, cpu[3], cpu[4], cpu[5], data_format=fmt)
        gg = T.fused_batch_norm_grad_v3(
            dy.to(dev), x.to(dev), s.to(dev), gpu[3], gpu[4], gpu[5], data_format=fmt
        )
        ok &= close(f"fused_batch_norm_grad_v3 {fmt} {shape}", gg[0], gc[0], 1e-5)
        # synchronized batch norm's local ops (the all-reduces are the identity on one process)
        st, sg = (
            T.fused_batch_norm_sync_stats(x, fmt),
            T.fused_batch_norm_sync_stats(x.to(dev), fmt),
        )
        ok &= close(f"fused_batch_norm_sync_stats {fmt} {shape}", sg, st, 1e-5)
        gs = T.fused_batch_norm_sync_grad_sums(dy, x, cpu[3], fmt)
        gsg = T.fused_batch_norm_sync_grad_sums(dy.to(dev), x.to(dev), gpu[3], fmt)
        ok &= close(f"fused_batch_norm_sync_grad_sums {fmt} {shape}", gsg, gs, 1e-5)
        bc = T.fused_batch_norm_sync_backprop_input(
            dy, x, s, cpu[3], cpu[4], gs, st[-1:], 1e-4, fmt
        )
        bg = T.fused_batch_norm_sync_backprop_input(
            dy.to(dev), x.to(dev), s.to(dev), gpu[3], gpu[4], gsg, sg[-1:], 1e-4, fmt
        )
        ok &= close(f"fused_batch_norm_sync_backprop_input {fmt} {shape}", bg, bc, 1e-5)

    # FractionalPool: forward, both grads (bit-exact), overlapping.
    x = torch.randn(4, 67, 71, 40, generator=g)
    for kind in ("avg", "max"):
        fwd = getattr(T, f"fractional_{kind}_pool")
        out, rows, cols = fwd(x, [1, 1.44, 1.73, 1], True, True, True, 3, 4)
        out_d, rows_d, cols_d = fwd(x.to(dev), [1, 1.44, 1.73, 1], True, True, True, 3, 4)
        ok &= close(f"fractional_{kind}_pool", out_d, out, 0.0)
        dy = torch.randn(out.shape, generator=g)
        if kind == "avg":
            want = T.fractional_avg_pool_grad(x.shape, dy, rows, cols, True)
            got = T.fractional_avg_pool_grad(x.shape, dy.to(dev), rows_d, cols_d, True)
        else:
            want = T.fractional_max_pool_grad(x, out, dy, rows, cols, True)
            got = T.fractional_max_pool_grad(x.to(dev), out_d, dy.to(dev), rows_d, cols_d, True)
        ok &= close(f"fractional_{kind}_pool_grad", got, want, 0.0)

    # Depthwise: many filter-gradient chunks, large C*M, stride and dilation, both layouts.
    for fmt in ("NHWC", "NCHW"):
        x = torch.randn(8, 57, 61, 96, generator=g)
        if fmt == "NCHW":
            x = x.permute(0, 3, 1, 2).contiguous()
        f = torch.randn(5, 3, 96, 2, generator=g)
        st = [1, 1, 2, 1] if fmt == "NHWC" else [1, 1, 1, 2]
        dl = [1, 2, 1, 1] if fmt == "NHWC" else [1, 1, 2, 1]
        y = T.depthwise_conv2d_native(x, f, st, "SAME", data_format=fmt, dilations=dl)
        yd = T.depthwise_conv2d_native(
            x.to(dev), f.to(dev), st, "SAME", data_format=fmt, dilations=dl
        )
        ok &= close(f"depthwise_conv2d_native {fmt}", yd, y, 1e-5)
        dy = torch.randn(y.shape, generator=g)
        bi = T.depthwise_conv2d_native_backprop_input(
            x.shape, f, dy, st, "SAME", data_format=fmt, dilations=dl
        )
        bid = T.depthwise_conv2d_native_backprop_input(
            x.shape, f.to(dev), dy.to(dev), st, "SAME", data_format=fmt, dilations=dl
        )
        ok &= close(f"depthwise_conv2d_native_backprop_input {fmt}", bid, bi, 1e-5)
        bf = T.depthwise_conv2d_native_backprop_filter(
            x, f.shape, dy, st, "SAME", data_format=fmt, dilations=dl
        )
        bfd = T.depthwise_conv2d_native_backprop_filter(
            x.to(dev), f.shape, dy.to(dev), st, "SAME", data_format=fmt, dilations=dl
        )
        ok &= close(f"depthwise_conv2d_native_backprop_filter {fmt}", bfd, bf, 1e-4)

    # CudnnRNN: LSTM with projection and lengths, bidirectional GRU, the params conversions.
    torch.backends.cuda.matmul.allow_tf32 = False
    for mode, kw in (("lstm", dict(num_proj=8)), ("gru", dict(direction="bidirectional"))):
        Tn, B, I, U, L = 23, 9, 17, 24, 2
        D = 2 if kw.get("direction") == "bidirectional" else 1
        Hh = kw.get("num_proj") or U
        n = T.cudnn_rnn_params_size(L, U, I, mode, **kw)
        p = torch.randn(n, generator=g) * 0.2
        x = torch.randn(Tn, B, I, generator=g)
        h = torch.randn(L * D, B, Hh, generator=g)
        c = torch.randn(L * D, B, U, generator=g)
        lens = torch.randint(1, Tn + 1, (B,), generator=g, dtype=torch.int32)
        cpu = T.cudnn_rnn_v3(x, h, c, p, lens, mode, **kw)
        gpu = T.cudnn_rnn_v3(x.to(dev), h.to(dev), c.to(dev), p.to(dev), lens.to(dev), mode, **kw)
        ok &= close(f"cudnn_rnn_v3 {mode}", gpu[0], cpu[0], 1e-5)
        dys = [torch.randn(t.shape, generator=g) for t in cpu[:3]]
        bc = T.cudnn_rnn_backprop_v3(x, h, c, p, lens, *cpu[:3], *dys, *cpu[3:], mode, **kw)
        bg = T.cudnn_rnn_backprop_v3(
            x.to(dev),
            h.to(dev),
            c.to(dev),
            p.to(dev),
            lens.to(dev),
            *gpu[:3],
            *(d.to(dev) for d in dys),
            *gpu[3:],
            mode,
            **kw,
        )
        ok &= close(f"cudnn_rnn_backprop_v3 {mode} (params)", bg[3], bc[3], 1e-4)
        G = 4 if mode == "lstm" else 3
        nw = L * D * (2 * G + (1 if kw.get("num_proj") else 0))
        w, b = T.cudnn_rnn_params_to_canonical_v2(L, U, I, p.to(dev), nw, L * D * 2 * G, mode, **kw)
        back = T.cudnn_rnn_canonical_to_params_v2(L, U, I, w, b, mode, **kw)
        ok &= close(f"cudnn_rnn params round trip {mode}", back, p, 0.0)
    if dev == "cuda":
        torch.cuda.synchronize()
    print("cuda smoke:", "OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
