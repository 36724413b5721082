"""Modules with TensorFlow/Keras defaults, for people porting TF models."""

from .cudnn_rnn import CudnnGRU, CudnnLSTM, CudnnRNNRelu, CudnnRNNTanh
from .depthwise_conv2d import DepthwiseConv2d
from .fractional_pool import FractionalAvgPool2d, FractionalMaxPool2d
from .fused_batch_norm import FusedBatchNorm
from .keras_bidirectional import KerasBidirectional
from .keras_rnn import KerasGRU, KerasLSTM, KerasSimpleRNN
from .sync_batch_norm import SyncFusedBatchNorm, convert_sync_batchnorm

__all__ = [
    "FusedBatchNorm",
    "SyncFusedBatchNorm",
    "convert_sync_batchnorm",
    "DepthwiseConv2d",
    "FractionalAvgPool2d",
    "FractionalMaxPool2d",
    "CudnnLSTM",
    "CudnnGRU",
    "CudnnRNNTanh",
    "CudnnRNNRelu",
    "KerasLSTM",
    "KerasGRU",
    "KerasSimpleRNN",
    "KerasBidirectional",
]
