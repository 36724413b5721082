"""One converter per Keras layer class: Keras config + weight arrays -> an nn.Module.

Every module takes and returns channels-last tensors like Keras, holds its weights under the Keras
variable names (``kernel``, ``bias``, ``gamma``, ``moving_mean``, ...) in Keras's layouts, and
lists them in Keras's variable order in ``keras_variables`` (the order of ``layer.weights``, which
is the order of the ``vars/<i>`` datasets of a `.keras` file and of ``weight_names`` in a `.h5`).
"""

from .layer_base import (  # noqa: F401  (re-exported: the loader and graph import them here)
    CELL_LAYERS,
    MASK_CONSUMERS,
    MODEL_CLASSES,
    Context,
    KerasLayer,
    assign,
    keras_tensors,
)
from .layers_conv import (
    BatchNormalization,
    Conv,
    Dense,
    DepthwiseConv2D,
    InputLayer,
    LayerNormalization,
    SeparableConv2D,
)
from .layers_misc import (
    Activation,
    Concatenate,
    Cropping2D,
    Dropout,
    Embedding,
    Flatten,
    GlobalPooling,
    LeakyReLU,
    Merge,
    Normalization,
    Permute,
    Pooling,
    PReLU,
    ReLU,
    Rescaling,
    Reshape,
    Softmax,
    UpSampling2D,
    ZeroPadding2D,
)
from .layers_recurrent import Any, Bidirectional, NotEqual, Recurrent
from .layers_time import Masking, TimeDistributed


def _conv(rank):
    return lambda cfg, ctx: Conv(cfg, ctx, rank)


def _gpool(rank, kind):
    return lambda cfg, ctx: GlobalPooling(cfg, ctx, rank, kind)


def _pool(rank, kind):
    return lambda cfg, ctx: Pooling(cfg, ctx, rank, kind)


CONVERTERS = {
    "InputLayer": lambda cfg, ctx: (ctx.take([]), InputLayer(ctx.class_name))[1],
    "Conv1D": _conv(1),
    "Conv2D": _conv(2),
    "Conv3D": _conv(3),
    "DepthwiseConv2D": DepthwiseConv2D,
    "SeparableConv2D": SeparableConv2D,
    "Dense": Dense,
    "BatchNormalization": BatchNormalization,
    "LayerNormalization": LayerNormalization,
    "Activation": Activation,
    "ReLU": ReLU,
    "LeakyReLU": LeakyReLU,
    "Softmax": Softmax,
    "ZeroPadding2D": ZeroPadding2D,
    "Cropping2D": Cropping2D,
    **{k: Merge for k in ("Add", "Subtract", "Multiply", "Average", "Maximum", "Minimum")},
    "Concatenate": Concatenate,
    "GlobalAveragePooling1D": _gpool(1, "avg"),
    "GlobalAveragePooling2D": _gpool(2, "avg"),
    "GlobalMaxPooling1D": _gpool(1, "max"),
    "GlobalMaxPooling2D": _gpool(2, "max"),
    "MaxPooling1D": _pool(1, "max"),
    "MaxPooling2D": _pool(2, "max"),
    "AveragePooling1D": _pool(1, "avg"),
    "AveragePooling2D": _pool(2, "avg"),
    "Flatten": Flatten,
    "Reshape": Reshape,
    "Permute": Permute,
    "Dropout": Dropout,
    "SpatialDropout1D": lambda cfg, ctx: Dropout(cfg, ctx, 1),
    "SpatialDropout2D": lambda cfg, ctx: Dropout(cfg, ctx, 2),
    "Rescaling": Rescaling,
    "UpSampling2D": UpSampling2D,
    "Embedding": Embedding,
    "Normalization": Normalization,
    "PReLU": PReLU,
    "LSTM": Recurrent,
    "GRU": Recurrent,
    "SimpleRNN": Recurrent,
    "Bidirectional": Bidirectional,
    "NotEqual": NotEqual,
    "Any": Any,
    "Masking": Masking,
    "TimeDistributed": TimeDistributed,
}

#: Layers that take a Keras mask (recorded as mask=<tensor> in a Keras 3 graph).
