"""Benchmark: one training step of a Keras model converted by torch_tfgrads.keras.load_model,
against the same step of the Keras model on TensorFlow (Keras 3, `tf.function`, as `model.fit`
runs it), in one process, interleaved.

    python benchmarks/bench_keras.py                  # MobileNetV2 and the text model
    python benchmarks/bench_keras.py --compile        # also torch.compile of the converted step
    python benchmarks/bench_keras.py --profile mobilenet   # eager vs compiled, by op (why)

A step is forward, loss (mean negative log-likelihood of the labels), backward and an SGD
update, at the batch sizes below; the Keras and torch models start from the same weights.
Ratios below 1 mean the converted module is faster.
"""

import argparse
import os
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

# This benchmark times whole models, not single ops: no op rows of its own.
TIMED_OPS = ()


def _mobilenet(keras, size, batch):
    model = keras.applications.MobileNetV2(
        input_shape=(size, size, 3), alpha=0.35, weights=None, classes=10
    )
    rng = np.random.default_rng(0)
    x = rng.normal(size=(batch, size, size, 3)).astype(np.float32)
    return model, x, rng.integers(0, 10, size=batch)


def _text(keras, steps, batch, vocab=2000, units=64):
    L = keras.layers
    inp = L.Input((steps,), dtype="int32")
    x = L.Embedding(vocab, 64, mask_zero=True, name="emb")(inp)
    x = L.Bidirectional(L.LSTM(units, return_sequences=True), name="bi_lstm")(x)
    x = L.GRU(units, name="gru")(x)
    model = keras.Model(inp, L.Dense(10, activation="softmax", name="out")(x), name="text")
    rng = np.random.default_rng(1)
    x = rng.integers(1, vocab, size=(batch, steps)).astype(np.int32)
    lengths = rng.integers(steps // 2, steps + 1, size=batch)
    x[np.arange(steps)[None] >= lengths[:, None]] = 0  # right padding, as text batches are
    return model, x, rng.integers(0, 10, size=batch)


MODELS = {
    "mobilenet_v2_0.35 96x96 b16": lambda keras: _mobilenet(keras, 96, 16),
    "text emb+bilstm64+gru64 T40 b32": lambda keras: _text(keras, 40, 32),
}


def _keras_step(tf, keras, model, x, labels):
    opt = keras.optimizers.SGD(learning_rate=0.01)
    xt, yt = tf.constant(x), tf.constant(labels)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            p = model(xt, training=True)
            loss = -tf.reduce_mean(tf.math.log(tf.gather(p, yt, batch_dims=1)))
        grads = tape.gradient(loss, model.trainable_weights)
        opt.apply_gradients(zip(grads, model.trainable_weights))
        return loss

    return lambda: step().numpy()


def _torch_step(module, x, labels):
    module.train()
    opt = torch.optim.SGD(module.parameters(), lr=0.01)
    xt, yt = torch.from_numpy(x), torch.from_numpy(labels)
    idx = torch.arange(len(labels))

    def step():
        opt.zero_grad(set_to_none=True)
        p = module(xt)
        loss = -torch.log(p[idx, yt]).mean()
        loss.backward()
        opt.step()
        return loss.detach()

    return step


def _convert(keras, model):
    from torch_tfgrads.keras import load_model

    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "m.keras")
        model.save(path)
        return load_model(path)


def _profile(module, x, labels, compiled):
    """The top ops of a few steps, eager or compiled (the compile slowdown's breakdown)."""
    from torch.profiler import ProfilerActivity, profile

    m = torch.compile(module) if compiled else module
    step = _torch_step(m, x, labels)
    for _ in range(3):
        step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(5):
            step()
    print(f"--- {'compiled' if compiled else 'eager'}: per 5 steps")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=18))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--compile", action="store_true", help="also time torch.compile")
    parser.add_argument("--profile", choices=["mobilenet", "text"], help="profile one model")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    common.setup_process()
    os.environ["KERAS_BACKEND"] = "tensorflow"
    tf = common.import_tf()
    if tf is None:
        sys.exit("this benchmark needs TensorFlow (pip install tensorflow-cpu)")
    import keras

    import torch_tfgrads as T

    common.print_host(T)
    print(
        f"threads: {common.THREADS} (TF intra-op and torch); TF {tf.__version__}, Keras "
        f"{keras.__version__}, torch {torch.__version__}"
    )
    rows = []
    for name, build in MODELS.items():
        if args.profile and not name.startswith(args.profile):
            continue
        model, x, labels = build(keras)
        module = _convert(keras, model)
        if args.profile:
            _profile(module, x, labels, compiled=False)
            _profile(module, x, labels, compiled=True)
            continue
        fns = {
            "keras": _keras_step(tf, keras, model, x, labels),
            "ours": _torch_step(module, x, labels),
        }
        if args.compile:
            fns["compiled"] = _torch_step(torch.compile(module), x, labels)
            for _ in range(3):  # compile outside the timed rounds
                fns["compiled"]()
        ms = common.interleaved_ms(fns, rounds=args.rounds, per_round=0.5)
        row = [
            name,
            common.fmt_ms(ms["keras"]),
            common.fmt_ms(ms["ours"]),
            f"{ms['ours'] / ms['keras']:.2f}",
        ]
        if args.compile:
            row += [common.fmt_ms(ms["compiled"]), f"{ms['compiled'] / ms['keras']:.2f}"]
        rows.append(row)
        print(f"  {name}: {ms}", flush=True)
    if rows:
        headers = ["model (training step)", "Keras/TF ms", "ours ms", "ours/Keras"]
        if args.compile:
            headers += ["compiled ms", "compiled/Keras"]
        common.print_table(headers, rows)


if __name__ == "__main__":
    main()
