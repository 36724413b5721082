"""TF's FusedBatchNormV3 / FusedBatchNormGradV3 (and their second-order gradient) on torch tensors."""

from ._tf import import_tf, to_tf, to_torch


def tf_fused_batch_norm_v3(
    x, scale, offset, mean, variance, epsilon, exponential_avg_factor, data_format, is_training
):
    tf = import_tf()
    outs = tf.raw_ops.FusedBatchNormV3(
        x=to_tf(x),
        scale=to_tf(scale),
        offset=to_tf(offset),
        mean=to_tf(mean),
        variance=to_tf(variance),
        epsilon=epsilon,
        exponential_avg_factor=exponential_avg_factor,
        data_format=data_format,
        is_training=is_training,
    )
    return tuple(to_torch(o) for o in outs)


def tf_fused_batch_norm_grad_v3(
    y_backprop, x, scale, rs1, rs2, rs3, epsilon, data_format, is_training
):
    tf = import_tf()
    outs = tf.raw_ops.FusedBatchNormGradV3(
        y_backprop=to_tf(y_backprop),
        x=to_tf(x),
        scale=to_tf(scale),
        reserve_space_1=to_tf(rs1),
        reserve_space_2=to_tf(rs2),
        reserve_space_3=to_tf(rs3),
        epsilon=epsilon,
        data_format=data_format,
        is_training=is_training,
    )
    return tuple(to_torch(o) for o in outs)


def tf_fused_batch_norm_grad_grad(
    y_backprop,
    x,
    scale,
    rs1,
    rs2,
    rs3,
    g_dx,
    g_dscale,
    g_doffset,
    epsilon,
    data_format,
    is_training,
):
    """d/d(y_backprop, x, scale) of <g, FusedBatchNormGradV3(...)>, by tf.GradientTape (TF's
    registered `_FusedBatchNormGradGrad`)."""
    tf = import_tf()
    dy, xx, sc = to_tf(y_backprop), to_tf(x), to_tf(scale)
    with tf.GradientTape() as tape:
        tape.watch([dy, xx, sc])
        dx, dscale, doffset, _, _ = tf.raw_ops.FusedBatchNormGradV3(
            y_backprop=dy,
            x=xx,
            scale=sc,
            reserve_space_1=to_tf(rs1),
            reserve_space_2=to_tf(rs2),
            reserve_space_3=to_tf(rs3),
            epsilon=epsilon,
            data_format=data_format,
            is_training=is_training,
        )
    grads = tape.gradient(
        [dx, dscale, doffset],
        [dy, xx, sc],
        output_gradients=[to_tf(g_dx), to_tf(g_dscale), to_tf(g_doffset)],
    )
    return tuple(to_torch(g) for g in grads)
