"""Modules with TensorFlow/Keras defaults, for people porting TF models."""
from .batch_norm import FusedBatchNorm
from .fractional_pool import FractionalAvgPool2d, FractionalMaxPool2d

__all__ = ["FusedBatchNorm", "FractionalAvgPool2d", "FractionalMaxPool2d"]
