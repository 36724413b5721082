"""TensorFlow's FractionalPool raw ops called on torch tensors (the oracle of tests and parity)."""

from ._tf import import_tf, to_tf, to_torch


def tf_fractional_pool(kind, value, pooling_ratio, pseudo_random, overlapping, seed, seed2):
    """TF's FractionalAvgPool/FractionalMaxPool with deterministic=True: (out, rows, cols)."""
    tf = import_tf()
    op = tf.raw_ops.FractionalAvgPool if kind == "avg" else tf.raw_ops.FractionalMaxPool
    res = op(
        value=to_tf(value),
        pooling_ratio=[float(r) for r in pooling_ratio],
        pseudo_random=pseudo_random,
        overlapping=overlapping,
        deterministic=True,
        seed=seed,
        seed2=seed2,
    )
    return tuple(to_torch(t) for t in res)


def tf_fractional_avg_pool_grad(shape, dy, rows, cols, overlapping):
    tf = import_tf()
    return to_torch(
        tf.raw_ops.FractionalAvgPoolGrad(
            orig_input_tensor_shape=tf.constant(list(shape), tf.int64),
            out_backprop=to_tf(dy),
            row_pooling_sequence=to_tf(rows),
            col_pooling_sequence=to_tf(cols),
            overlapping=overlapping,
        )
    )


def tf_fractional_max_pool_grad(x, y, dy, rows, cols, overlapping):
    tf = import_tf()
    return to_torch(
        tf.raw_ops.FractionalMaxPoolGrad(
            orig_input=to_tf(x),
            orig_output=to_tf(y),
            out_backprop=to_tf(dy),
            row_pooling_sequence=to_tf(rows),
            col_pooling_sequence=to_tf(cols),
            overlapping=overlapping,
        )
    )
