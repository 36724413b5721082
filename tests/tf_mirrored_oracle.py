"""TensorFlow oracle: Keras 3 BatchNormalization trained under tf.distribute.MirroredStrategy.

    python tests/tf_mirrored_oracle.py IN.npz OUT.npz [IN2.npz OUT2.npz ...]

A script, run in a subprocess, because the R logical CPU devices MirroredStrategy needs can be
configured only before TensorFlow initialises, and a pytest process may already have done so.
Several IN/OUT pairs (all with the same R) run in one process, to pay for TF's import once.

IN.npz: ``x`` (the global batch, float32/float64, NHWC 4-D or [N, C]), ``target`` (x's shape),
``gamma``, ``beta``, ``moving_mean``, ``moving_variance`` ([C]), scalars ``replicas`` (R),
``steps``, ``lr``, ``momentum``, ``epsilon``, ``synchronized`` (0/1) and optionally ``splits``
(the per-replica batch sizes, summing to N; default: N split equally). Unequal splits are
supported: each replica gets its own slice through experimental_distribute_values_from_function.

Per step, on every replica r (inside strategy.run): y_r = layer(x_r, training=True),
loss_r = sum(y_r * target_r) / N, and tape gradients of loss_r with respect to x_r, gamma and
beta. TF's all_reduce is differentiable (its gradient is the all-reduce of the upstream
gradients), so with synchronized=True dx_r is the gradient of the *total* loss sum_s loss_s.
The gamma/beta gradients are summed over replicas here with replica_ctx.all_reduce(SUM) -- what
Keras 3's optimizers do with per-replica gradients (TFOptimizer._all_reduce_sum_gradients) --
and plain SGD ``var <- var - lr * summed_grad`` is assigned in cross-replica context, which
writes every replica's copy. (Done by hand rather than through keras.optimizers.SGD so that
neither the reduction nor the update rule is left to an optimizer's distribution logic.)
Everything runs eagerly (no tf.function), so no graph rewrite stands between Keras' ops and
the recorded numbers. The default cross-device ops for CPU replicas are CollectiveAllReduce.

OUT.npz, every array stacked over the steps: ``y`` and ``dx`` (the replicas' slices concatenated
in split order), ``dgamma``/``dbeta`` (the cross-replica sums), ``gamma``/``beta`` (after the
step), ``moving_mean``/``moving_variance`` (after the step, read in cross-replica context) and
``moving_mean_replicas``/``moving_variance_replicas`` ([steps, R, C], every replica's own copy).

Keras 3 creates the moving statistics with aggregation NONE and synchronization AUTO, which
MirroredStrategy makes ON_WRITE MirroredVariables (``moving_stats_variable`` records it), and
TF's _on_write_update_replica updates a NONE-aggregated MirroredVariable assigned in replica
context on that replica's own copy only. So with synchronized=False each replica keeps its own
statistics of its own slice, and a cross-replica read returns the primary (replica 0's) copy,
not the mean over replicas (tf-keras' ON_READ/MEAN variables gave the mean); with
synchronized=True every replica assigns the same values. ``read_is_replica0`` /
``read_is_mean`` record which of the two the read matched.
"""

import os
import sys

os.environ["TF_ENABLE_ONEDNN_OPTS"] = "0"  # the Eigen path, as everywhere in these tests
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"

import numpy as np  # noqa: E402


def configure(replicas):
    """TensorFlow with `replicas` logical CPU devices (before anything initialises it), and Keras."""
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * replicas
    )
    # MirroredStrategy warns on every eager run() that tf.function would be faster; eager is
    # deliberate (see the module docstring).
    tf.get_logger().setLevel("ERROR")
    import keras

    return tf, keras


def run(tf, keras, strategy, inp):
    R = strategy.num_replicas_in_sync
    x, target = inp["x"], inp["target"]
    dtype = x.dtype.name
    N = x.shape[0]
    splits = [int(s) for s in inp["splits"]] if "splits" in inp else [N // R] * R
    if sum(splits) != N or len(splits) != R:
        raise ValueError(f"splits {splits} do not split a batch of {N} over {R} replicas")
    bounds = np.cumsum([0, *splits])
    x_parts = [x[bounds[i] : bounds[i + 1]] for i in range(R)]
    t_parts = [target[bounds[i] : bounds[i + 1]] for i in range(R)]

    with strategy.scope():
        layer = keras.layers.BatchNormalization(
            axis=-1,
            momentum=float(inp["momentum"]),
            epsilon=float(inp["epsilon"]),
            synchronized=bool(inp["synchronized"]),
            dtype=dtype,
        )
        layer.build((None, *x.shape[1:]))
        layer.set_weights([inp["gamma"], inp["beta"], inp["moving_mean"], inp["moving_variance"]])

    def per_replica(parts):
        return strategy.experimental_distribute_values_from_function(
            lambda ctx: tf.constant(parts[ctx.replica_id_in_sync_group])
        )

    xs, ts = per_replica(x_parts), per_replica(t_parts)
    n_global = tf.constant(N, dtype=dtype)

    def replica_fn(x_r, t_r):
        ctx = tf.distribute.get_replica_context()
        with tf.GradientTape() as tape:
            tape.watch(x_r)
            y_r = layer(x_r, training=True)
            loss_r = tf.reduce_sum(y_r * t_r) / n_global
        dx_r, dg_r, db_r = tape.gradient(loss_r, [x_r, layer.gamma, layer.beta])
        dg = ctx.all_reduce(tf.distribute.ReduceOp.SUM, dg_r)
        db = ctx.all_reduce(tf.distribute.ReduceOp.SUM, db_r)
        return y_r, dx_r, dg, db

    lr = tf.constant(float(inp["lr"]), dtype=dtype)
    out = {k: [] for k in ("y", "dx", "dgamma", "dbeta", "gamma", "beta")}
    out.update({k: [] for k in ("moving_mean", "moving_variance")})
    out.update({k: [] for k in ("moving_mean_replicas", "moving_variance_replicas")})
    read_is_replica0, read_is_mean = True, True
    for _ in range(int(inp["steps"])):
        y, dx, dg, db = (
            strategy.experimental_local_results(v) for v in strategy.run(replica_fn, (xs, ts))
        )
        # Every replica holds the same all-reduced sum; check rather than assume.
        for g in (dg, db):
            assert all(np.array_equal(g[0].numpy(), gi.numpy()) for gi in g), "replicas disagree"
        layer.gamma.assign(layer.gamma.value - lr * dg[0])
        layer.beta.assign(layer.beta.value - lr * db[0])
        out["y"].append(np.concatenate([v.numpy() for v in y]))
        out["dx"].append(np.concatenate([v.numpy() for v in dx]))
        out["dgamma"].append(dg[0].numpy())
        out["dbeta"].append(db[0].numpy())
        out["gamma"].append(layer.gamma.numpy())
        out["beta"].append(layer.beta.numpy())
        for name in ("moving_mean", "moving_variance"):
            var = getattr(layer, name)
            read = var.numpy()
            copies = np.stack([v.numpy() for v in strategy.experimental_local_results(var.value)])
            read_is_replica0 &= bool(np.array_equal(read, copies[0]))
            read_is_mean &= bool(np.allclose(read, copies.mean(0), rtol=1e-6, atol=0))
            out[name].append(read)
            out[f"{name}_replicas"].append(copies)
    res = {k: np.stack(v) for k, v in out.items()}
    res["read_is_replica0"] = np.array(read_is_replica0)
    res["read_is_mean"] = np.array(read_is_mean)
    res["splits"] = np.array(splits)
    mm = layer.moving_mean.value  # the tf.Variable (a distributed one) under the Keras variable
    res["moving_stats_variable"] = np.array(
        f"{type(mm).__name__} synchronization={mm.synchronization.name} "
        f"aggregation={mm.aggregation.name}"
    )
    return res


def main(argv):
    pairs = list(zip(argv[1::2], argv[2::2]))
    if not pairs or len(argv) % 2 == 0:
        raise SystemExit(f"usage: {argv[0]} IN.npz OUT.npz [IN2.npz OUT2.npz ...]")
    inputs = []
    for path, _ in pairs:
        with np.load(path) as f:
            inputs.append(dict(f))
    replicas = {int(inp["replicas"]) for inp in inputs}
    if len(replicas) != 1:
        raise SystemExit(f"every case of one run needs the same replica count, got {replicas}")
    R = replicas.pop()
    tf, keras = configure(R)
    # One strategy for every case: a second MirroredStrategy over the same CPU devices reuses
    # the first one's collective instance keys, and its all-reduces then meet the first one's.
    strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(R)])
    for inp, (_, out) in zip(inputs, pairs):
        np.savez(out, **run(tf, keras, strategy, inp))


if __name__ == "__main__":
    main(sys.argv)
