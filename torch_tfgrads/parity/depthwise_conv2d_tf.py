"""TensorFlow's DepthwiseConv2dNative raw ops called on torch tensors (the oracle of the tests
and of the parity command)."""

from ._tf import import_tf, to_tf, to_torch


def _attrs(strides, padding, explicit_paddings, data_format, dilations):
    return dict(
        strides=list(strides),
        padding=padding,
        explicit_paddings=list(explicit_paddings),
        data_format=data_format,
        dilations=list(dilations),
    )


def tf_depthwise_conv2d_native(x, f, *attrs):
    tf = import_tf()
    return to_torch(
        tf.raw_ops.DepthwiseConv2dNative(input=to_tf(x), filter=to_tf(f), **_attrs(*attrs))
    )


def tf_depthwise_conv2d_native_backprop_input(input_sizes, f, dy, *attrs):
    tf = import_tf()
    return to_torch(
        tf.raw_ops.DepthwiseConv2dNativeBackpropInput(
            input_sizes=tf.constant(list(input_sizes), tf.int32),
            filter=to_tf(f),
            out_backprop=to_tf(dy),
            **_attrs(*attrs),
        )
    )


def tf_depthwise_conv2d_native_backprop_filter(x, filter_sizes, dy, *attrs):
    tf = import_tf()
    return to_torch(
        tf.raw_ops.DepthwiseConv2dNativeBackpropFilter(
            input=to_tf(x),
            filter_sizes=tf.constant(list(filter_sizes), tf.int32),
            out_backprop=to_tf(dy),
            **_attrs(*attrs),
        )
    )
