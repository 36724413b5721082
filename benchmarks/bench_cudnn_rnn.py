"""Benchmark: cudnn_rnn_v3 forward + backward (gradients for input and params) vs torch.nn.LSTM /
GRU on the CPU and Keras LSTM / GRU(reset_after) on TensorFlow's CPU kernels (one tf.function
step with a GradientTape; TF has no CPU kernel for CudnnRNN itself), in this process.

float32, time-major input (Keras gets the same data batch-major), zero initial states, one layer, uni- and
bidirectional, the issue's shapes (T, B, I, U). Prints medians of interleaved rounds in ms and
ours against the faster peer (target <= 1.00), plus our GEMM throughput against a same-run
yardstick: torch.mm on one step's GEMM shape ([B, I + U] x [I + U, G * U]), timed in the same
interleaved rounds, so the recurrent path's efficiency compares across hosts. The header names
the host and the ISA paths; the "path" column says whether the row's steps ran on oneDNN's BRGEMM
micro-kernels or on our register tiles (TFGRADS_DISABLE_BRGEMM=1 forces the latter; step_path).

    python benchmarks/bench_cudnn_rnn.py                 # CPU, against torch.nn and Keras
    python benchmarks/bench_cudnn_rnn.py --device cuda   # GPU, against torch.nn on cuDNN

On cuda (no TF there) the peer is torch.nn.LSTM / GRU on cuDNN, timed for the forward alone and
for forward + backward, at the CPU shapes and larger GPU-sized ones, with TF32 off for matmuls and
cuDNN (so the torch.mm yardstick is a float32 GEMM too). --quick / --shapes restrict the shapes
(see common.add_device_args).
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

SHAPES = [(50, 32, 128, 256), (100, 16, 64, 128), (20, 64, 256, 512)]
GPU_SHAPES = [(100, 64, 512, 1024), (50, 256, 256, 512)]  # added on cuda
# The tfgrads ops these rows time (tests/test_registry.py checks every op has a benchmark row).
TIMED_OPS = (
    "cudnn_rnn_v3",
    "cudnn_rnn_backprop_v3",
    "cudnn_rnn_canonical_to_params_v2",
    "cudnn_rnn_params_to_canonical_v2",
)
MODES = ("lstm", "gru")
DIRECTIONS = ("unidirectional", "bidirectional")


def peer_fns(mode, shape, direction, T=None, tf=None, device="cpu", forward=None):
    """{name: callable}: ours, torch.nn and the torch.mm yardstick on `device` when T is given
    (with `forward`, by default on cuda, the forwards alone too: "ours fwd", "torch fwd"),
    Keras on TF when tf is (the CPU only)."""
    Tn, B, I, U = shape
    D = 2 if direction == "bidirectional" else 1
    g = torch.Generator().manual_seed(0)
    x = torch.randn(Tn, B, I, generator=g, requires_grad=True)
    dy = torch.randn(Tn, B, D * U, generator=g)
    fns = {}
    if T is not None:
        if forward is None:
            forward = torch.device(device).type == "cuda"
        xd = x.detach().to(device).requires_grad_()  # x itself on the CPU
        dyd = dy.to(device)
        n = T.cudnn_rnn_params_size(1, U, I, mode, direction=direction)
        p = (torch.randn(n, generator=g) * 0.05).to(device).requires_grad_()
        h = torch.zeros(D, B, U, device=device)
        lens = torch.full((B,), Tn, dtype=torch.int32)  # on the host, where the kernels read it

        def ours():
            out = T.cudnn_rnn_v3(xd, h, h, p, lens, mode, direction=direction)[0]
            torch.autograd.grad(out, (xd, p), dyd)

        fns["ours"] = ours
        cls = torch.nn.LSTM if mode == "lstm" else torch.nn.GRU
        m = cls(I, U, bidirectional=D == 2).to(device)
        params = list(m.parameters())

        def torch_rnn():
            out, _ = m(xd)
            torch.autograd.grad(out, [xd] + params, dyd)

        fns["torch"] = torch_rnn
        if forward:  # the training forwards alone (inputs needing grad, as in the step)
            fns["ours fwd"] = lambda: T.cudnn_rnn_v3(xd, h, h, p, lens, mode, direction=direction)
            fns["torch fwd"] = lambda: m(xd)
        G = 4 if mode == "lstm" else 3
        a, w = torch.randn(B, I + U, generator=g), torch.randn(I + U, G * U, generator=g)
        a, w = a.to(device), w.to(device)
        fns["mm"] = lambda: torch.mm(a, w)
    if tf is not None:  # the CPU only
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


def direction_weight_bytes(mode, shape):
    """A direction's W and R in float32 bytes: G*U rows of I + U."""
    _, _, I, U = shape
    return (4 if mode == "lstm" else 3) * U * (I + U) * 4


def directions_in_turn(paths, mode, shape):
    """Whether a bidirectional layer of `shape` runs its directions one after the other, each
    over all threads: always on more than two threads, and on two when a direction's W and R
    exceed cpu_paths' rnn_directions_in_turn_above_bytes (else one direction per thread)."""
    above = paths["rnn_directions_in_turn_above_bytes"]
    nt = torch.get_num_threads()
    return nt > 2 or (nt == 2 and above < direction_weight_bytes(mode, shape))


def step_path(paths, mode, shape, D):
    """Where a float32 row's steps run on the CPU: "BRGEMM" (oneDNN's micro-kernels), else
    "tiles" (our register tiles, each thread owning its batch rows: one direction per thread, or
    every thread at least rnn_tiled_steps_min_rows_per_thread rows) or "cells" (the driver's
    loop, a GEMM per step); "in turn": a bidirectional layer's directions one after the other,
    each over all threads (BRGEMM's blocks, or the tiles with rows enough for each thread).
    Where BRGEMM runs, a direction that the threads share goes to the tiles while its W and R
    take at most rnn_tiles_before_brgemm_up_to_bytes (the 8-lane path; 0 elsewhere)."""
    nt = torch.get_num_threads()
    turn = D == 2 and directions_in_turn(paths, mode, shape)
    rows = shape[1] // nt  # per thread, when they share a direction
    enough = rows >= paths["rnn_tiled_steps_min_rows_per_thread"]
    if paths["rnn_brgemm"]:
        small = direction_weight_bytes(mode, shape) <= paths["rnn_tiles_before_brgemm_up_to_bytes"]
        if nt > 1 and (D == 1 or turn) and enough and small:
            return "tiles in turn" if turn else "tiles"
        return "BRGEMM in turn" if turn else "BRGEMM"
    if not enough:
        return "tiles" if D == 2 else "cells"  # a direction per thread, or the per-step GEMMs
    return "tiles in turn" if turn else "tiles"


def mm_flops(mode, shape):
    """Multiply-adds x2 of the yardstick torch.mm ([B, I + U] x [I + U, G * U])."""
    _, B, I, U = shape
    G = 4 if mode == "lstm" else 3
    return 2 * B * (I + U) * G * U


def conversion_fns(T, mode, shape, direction, device="cpu"):
    """The params conversions against the torch equivalent: one cat of the flattened canonical
    tensors (what packing torch.nn.LSTM's weights into one buffer costs) and its split."""
    _, _, I, U = shape
    n = T.cudnn_rnn_params_size(2, U, I, mode, direction=direction)
    p = torch.randn(n).to(device)
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
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_device_args(ap)
    args = ap.parse_args()
    import torch_tfgrads as T

    device = args.device
    cuda = device == "cuda"
    common.setup_device(device, "bench_cudnn_rnn")
    shapes = common.select_shapes(args, SHAPES, GPU_SHAPES)
    timing = {"rounds": 5, **common.timing_args(args)}
    common.setup_process()
    tf = None if cuda else common.import_tf()  # TF only on the CPU
    common.print_device(T, device)
    if cuda:
        path, where, note = "CUDA", "cuda", " (torch.nn on cuDNN)"
    else:
        paths = T.cpu.cpu_paths()
        where, note = f"{common.THREADS} threads", ""
    tf_part = f"TF {tf.__version__} (Keras in a tf.function)" if tf else "TF absent"
    print(
        f"CudnnRNN forward+backward, float32, 1 layer, {where}, torch {torch.__version__}{note}, "
        f"{tf_part}; ms (median of interleaved rounds)",
        flush=True,
    )
    rows = []
    nan = float("nan")
    for mode in MODES:
        for shape in shapes:
            for direction in DIRECTIONS:
                fns = peer_fns(mode, shape, direction, T=T, tf=tf, device=device)
                t = common.interleaved_ms(fns, device=device, **timing)
                ours, pt, ke = t["ours"], t["torch"], t.get("keras", nan)
                best = min(v for v in (pt, ke) if v == v)
                D = 2 if direction == "bidirectional" else 1
                gflops = gemm_flops(mode, shape, D) / (ours * 1e-3) / 1e9
                mm_gflops = mm_flops(mode, shape) / (t["mm"] * 1e-3) / 1e9
                row = [mode, ",".join(map(str, shape)), direction[:3] if D == 1 else "bi"]
                if cuda:
                    f_ours, f_pt = t["ours fwd"], t["torch fwd"]
                    row += [common.fmt_ms(f_ours), common.fmt_ms(f_pt), f"{f_ours / f_pt:.2f}"]
                row += [common.fmt_ms(ours), common.fmt_ms(pt)]
                row += [] if cuda else [common.fmt_ms(ke)]
                if not cuda:
                    path = step_path(paths, mode, shape, D)
                row += [
                    f"{ours / best:.2f}",
                    path,
                    f"{gflops:.0f}",
                    f"{mm_gflops:.0f}",
                    f"{100 * gflops / mm_gflops:.0f}%",
                ]
                rows.append(row)
                print("  " + " ".join(str(c) for c in rows[-1]), flush=True)
    if cuda:
        peer_headers = ["ours fwd", "torch fwd", "fwd ours/torch", "ours", "torch", "ours/torch"]
    else:
        peer_headers = ["ours", "torch", "Keras", "ours/best"]
    common.print_table(
        [
            "mode",
            "T,B,I,U",
            "dir",
            *peer_headers,
            "path",
            "ours GFLOP/s",
            "torch.mm GFLOP/s",
            "% of mm",
        ],
        rows,
    )
    if cuda:
        print(
            "ours / torch = forward + backward (gradients for the input and the params); fwd = "
            "the training forward alone. torch = torch.nn.LSTM/GRU on cuDNN, TF32 off. Each call "
            "is timed alone with CUDA events."
        )
    else:
        print(
            'Target: ours/best <= 1.00 (best = faster of torch.nn and Keras on TF). Path "in '
            'turn": the two directions run one after the other, each over all threads (else '
            "one per thread, on two threads)."
        )
    rows = []
    for mode in MODES:
        for direction in DIRECTIONS:
            shape = shapes[0]
            fns = conversion_fns(T, mode, shape, direction, device=device)
            t = common.interleaved_ms(fns, device=device, **timing)
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
    print(f"\nParams conversions, 2 layers (I,U as above), {where}, ms:")
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
