"""Training on many processes with TensorFlow's numbers (torch.distributed).

Synchronized batch norm (TF/Keras ``BatchNormalization(synchronized=True)``) and the buffer
semantics of TF's ``MirroredStrategy``; see docs/distributed.md. The modules are
``torch_tfgrads.nn.SyncFusedBatchNorm`` and ``torch_tfgrads.nn.convert_sync_batchnorm``.
"""

from .buffers import average_buffers_, replica_mean_state_dict
from .sync_batch_norm import is_synchronizing, keras_moments, sync_fused_batch_norm

__all__ = [
    "average_buffers_",
    "is_synchronizing",
    "keras_moments",
    "replica_mean_state_dict",
    "sync_fused_batch_norm",
]
