"""Benchmark: cudnn_rnn_v3 forward + backward (gradients for input and params) vs torch.nn.LSTM /
GRU on the CPU and Keras LSTM / GRU(reset_after) on TensorFlow's CPU kernels (one tf.function
step with a GradientTape; TF has no CPU kernel for CudnnRNN itself), in this process.

float32, time-major input (Keras gets the same data batch-major), zero initial states, one layer, uni- and
bidirectional, the issue's shapes (T, B, I, U). Prints medians of interleaved rounds in ms and
ours against the faster peer (target <= 1.00), plus our GEMM throughput against a same-run
yardstick: torch.mm on one step's GEMM shape ([B, I + U] x [I + U, G * U]), timed in the same
interleaved rounds, so the recurrent path's efficiency compares across hosts. The header names
the host and the ISA paths; the "path" column says whether the row ran on oneDNN's BRGEMM
micro-kernels or on the per-step cells with ATen's GEMMs (TFGRADS_DISABLE_BRGEMM=1 forces the
latter).
"""

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

SHAPES = [(50, 32, 128, 256), (100, 16, 64, 128), (20, 64, 256, 512)]
# The tfgrads ops these rows time (tests/test_registry.py checks every op has a benchmark row).
TIMED_OPS = (
    "cudnn_rnn_v3",
    "cudnn_rnn_backprop_v3",
    "cudnn_rnn_canonical_to_params_v2",
    "cudnn_rnn_params_to_canonical_v2",
)
MODES = ("lstm", "gru")
DIRECTIONS = ("unidirectional", "bidirectional")


def peer_fns(mode, shape, direction, T=None, tf=None):
    Tn, B, I, U = shape
    D = 2 if direction == "bidirectional" else 1
    g = torch.Generator().manual_seed(0)
    x = torch.randn(Tn, B, I, generator=g, requires_grad=True)
    dy = torch.randn(Tn, B, D * U, generator=g)
    fns = {}
    if T is not None:
        n = T.cudnn_rnn_params_size(1, U, I, mode, direction=direction)
        p = (torch.randn(n, generator=g) * 0.05).requires_grad_()
        h = torch.zeros(D, B, U)
        lens = torch.full((B,), Tn, dtype=torch.int32)

        def ours():
            out = T.cudnn_rnn_v3(x, h, h, p, lens, mode, direction=direction)[0]
            torch.autograd.grad(out, (x, p), dy)

        fns["ours"] = ours
        cls = torch.nn.LSTM if mode == "lstm" else torch.nn.GRU
        m = cls(I, U, bidirectional=D == 2)
        params = list(m.parameters())

        def torch_rnn():
            out, _ = m(x)
            torch.autograd.grad(out, [x] + params, dy)

        fns["torch"] = torch_rnn
        G = 4 if mode == "lstm" else 3
        a, w = torch.randn(B, I + U, generator=g), torch.randn(I + U, G * U, generator=g)
        fns["mm"] = lambda: torch.mm(a, w)
    if tf is not None:
        os.environ.setdefault("KERAS_BACKEND", "tensorflow")
        import keras

        kw = {"reset_after": True} if mode == "gru" else {}
        cell = (keras.layers.LSTM if mode == "lstm" else keras.layers.GRU)(
            U, return_sequences=True, **kw
        )
        layer = keras.layers.Bidirectional(cell) if D == 2 else cell
        tx = tf.constant(x.detach().transpose(0, 1).contiguous().numpy())  # Keras: batch-major
        tdy = tf.constant(dy.transpose(0, 1).contiguous().numpy())
        layer(tx)

        @tf.function
        def step():
            with tf.GradientTape() as tape:
                tape.watch(tx)
                y = layer(tx)
            return tape.gradient(y, [tx] + layer.trainable_variables, output_gradients=tdy)[0]

        fns["keras"] = lambda: step().numpy()
    return fns


def gemm_flops(mode, shape, D):
    """Multiply-adds x2 of the forward + backward GEMMs (input, recurrent, both weight grads)."""
    Tn, B, I, U = shape
    G = 4 if mode == "lstm" else 3
    fwd = Tn * B * G * U * (I + U)
    return 2 * 3 * fwd * D  # forward, data gradient, weight gradient


def mm_flops(mode, shape):
    """Multiply-adds x2 of the yardstick torch.mm ([B, I + U] x [I + U, G * U])."""
    _, B, I, U = shape
    G = 4 if mode == "lstm" else 3
    return 2 * B * (I + U) * G * U


def conversion_fns(T, mode, shape, direction):
    """The params conversions against the torch equivalent: one cat of the flattened canonical
    tensors (what packing torch.nn.LSTM's weights into one buffer costs) and its split."""
    _, _, I, U = shape
    n = T.cudnn_rnn_params_size(2, U, I, mode, direction=direction)
    p = torch.randn(n)
    G = 4 if mode == "lstm" else 3
    LD = 2 * (2 if direction == "bidirectional" else 1)
    w, b = T.cudnn_rnn_params_to_canonical_v2(
        2, U, I, p, LD * 2 * G, LD * 2 * G, mode, direction=direction
    )
    flat = w + b
    sizes = [t.numel() for t in flat]
    return {
        "canonical_to_params": lambda: T.cudnn_rnn_canonical_to_params_v2(
            2, U, I, w, b, mode, direction=direction
        ),
        "torch cat": lambda: torch.cat([t.reshape(-1) for t in flat]),
        "params_to_canonical": lambda: T.cudnn_rnn_params_to_canonical_v2(
            2, U, I, p, LD * 2 * G, LD * 2 * G, mode, direction=direction
        ),
        "torch split+clone": lambda: [t.clone() for t in p.split(sizes)],
    }


def main():
    import torch_tfgrads as T

    common.setup_process()
    tf = common.import_tf()
    common.print_host(T)
    path = "BRGEMM" if T.cpu.cpu_paths()["rnn_brgemm"] else "cells"
    print(
        f"CudnnRNN forward+backward, float32, 1 layer, {common.THREADS} threads, torch "
        f"{torch.__version__}, TF {tf.__version__ if tf else 'absent'} (Keras in a "
        "tf.function); ms (median of interleaved rounds)",
        flush=True,
    )
    rows = []
    nan = float("nan")
    for mode in MODES:
        for shape in SHAPES:
            for direction in DIRECTIONS:
                t = common.interleaved_ms(peer_fns(mode, shape, direction, T=T, tf=tf), rounds=5)
                ours, pt, ke = t["ours"], t["torch"], t.get("keras", nan)
                best = min(v for v in (pt, ke) if v == v)
                D = 2 if direction == "bidirectional" else 1
                gflops = gemm_flops(mode, shape, D) / (ours * 1e-3) / 1e9
                mm_gflops = mm_flops(mode, shape) / (t["mm"] * 1e-3) / 1e9
                rows.append(
                    [
                        mode,
                        ",".join(map(str, shape)),
                        direction[:3] if D == 1 else "bi",
                        common.fmt_ms(ours),
                        common.fmt_ms(pt),
                        common.fmt_ms(ke),
                        f"{ours / best:.2f}",
                        path,
                        f"{gflops:.0f}",
                        f"{mm_gflops:.0f}",
                        f"{100 * gflops / mm_gflops:.0f}%",
                    ]
                )
                print("  " + " ".join(str(c) for c in rows[-1]), flush=True)
    common.print_table(
        [
            "mode",
            "T,B,I,U",
            "dir",
            "ours",
            "torch",
            "Keras",
            "ours/best",
            "path",
            "ours GFLOP/s",
            "torch.mm GFLOP/s",
            "% of mm",
        ],
        rows,
    )
    print("Target: ours/best <= 1.00 (best = faster of torch.nn and Keras on TF).")
    rows = []
    for mode in MODES:
        for direction in DIRECTIONS:
            shape = SHAPES[0]
            t = common.interleaved_ms(conversion_fns(T, mode, shape, direction), rounds=5)
            rows.append(
                [
                    mode,
                    ",".join(map(str, shape[2:])),
                    direction[:3] if direction[0] == "u" else "bi",
                    common.fmt_ms(t["canonical_to_params"]),
                    common.fmt_ms(t["torch cat"]),
                    f"{t['canonical_to_params'] / t['torch cat']:.2f}",
                    common.fmt_ms(t["params_to_canonical"]),
                    common.fmt_ms(t["torch split+clone"]),
                    f"{t['params_to_canonical'] / t['torch split+clone']:.2f}",
                ]
            )
    print("\nParams conversions, 2 layers (I,U as above), ms:")
    common.print_table(
        [
            "mode",
            "I,U",
            "dir",
            "canonical->params",
            "torch cat",
            "ratio",
            "params->canonical",
            "torch split",
            "ratio",
        ],
        rows,
    )


if __name__ == "__main__":
    main()
