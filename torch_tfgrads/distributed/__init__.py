"""Training on many processes with TensorFlow's numbers (torch.distributed).

Synchronized batch norm (TF/Keras ``BatchNormalization(synchronized=True)``) and the buffer
semantics of TF's ``MirroredStrategy``; see docs/distributed.md. The modules are
``torch_tfgrads.nn.SyncFusedBatchNorm`` and ``torch_tfgrads.nn.convert_sync_batchnorm``.
"""

from .sync_batch_norm import is_synchronizing, keras_moments, sync_fused_batch_norm

__all__ = ["is_synchronizing", "keras_moments", "sync_fused_batch_norm"]
