"""Modules with TensorFlow/Keras defaults, for people porting TF models."""
from .batch_norm import FusedBatchNorm

__all__ = ["FusedBatchNorm"]
