"""TensorFlow as the oracle: importing it on its reference path, and calling its raw ops on
torch tensors.

TF's x86 wheels default to oneDNN kernels, whose numbers and output shapes differ slightly
from the Eigen kernels that define the ops (docs/parity.md). Our reference is the Eigen
path, so TF_ENABLE_ONEDNN_OPTS=0 must be set before TensorFlow is first imported.
"""

import os

import numpy as np
import torch

_TF = None


class TFUnavailable(RuntimeError):
    pass


def import_tf(eigen=True):
    """Imports TensorFlow once, on the Eigen path by default; raises TFUnavailable if missing."""
    global _TF
    if _TF is None:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
        if eigen:
            os.environ["TF_ENABLE_ONEDNN_OPTS"] = "0"
        try:
            import tensorflow as tf
        except ImportError as e:  # pragma: no cover - depends on the environment
            raise TFUnavailable(f"TensorFlow is not installed: {e}") from e
        _TF = tf
    return _TF


def onednn_enabled():
    return os.environ.get("TF_ENABLE_ONEDNN_OPTS", "1") != "0"


_TF_DTYPES = {
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.float32: "float32",
    torch.float64: "float64",
    torch.int32: "int32",
    torch.int64: "int64",
}


def to_tf(t):
    """A torch CPU tensor as a TF tensor of the same dtype (bfloat16 goes through float32)."""
    tf = import_tf()
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        return tf.cast(tf.constant(t.float().numpy()), tf.bfloat16)
    return tf.constant(t.contiguous().numpy())


def to_torch(v):
    """A TF tensor as a torch tensor of the same dtype."""
    tf = import_tf()
    if v.dtype == tf.bfloat16:
        return torch.from_numpy(np.asarray(tf.cast(v, tf.float32).numpy())).to(torch.bfloat16)
    return torch.from_numpy(np.array(v.numpy()))
