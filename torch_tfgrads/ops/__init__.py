"""The ops, one module per family: its public functions, fake kernels and autograd formulas.

Importing this package registers every fake kernel and autograd formula on the ops that the
compiled extension (`torch_tfgrads._C`) defines; `csrc/tfgrads.cpp` names this package with
`set_python_module`, so `torch.ops.tfgrads.*` works under FakeTensor once it is imported.
"""

from .cudnn_rnn import cudnn_rnn_backprop_v3, cudnn_rnn_v3
from .cudnn_rnn_params import (
    cudnn_rnn_canonical_to_params_v2,
    cudnn_rnn_params_size,
    cudnn_rnn_params_to_canonical_v2,
)
from .depthwise_conv2d import (
    depthwise_conv2d_native,
    depthwise_conv2d_native_backprop_filter,
    depthwise_conv2d_native_backprop_input,
)
from .fractional_pool import (
    fractional_avg_pool,
    fractional_avg_pool_grad,
    fractional_max_pool,
    fractional_max_pool_grad,
    fractional_pooling_sequence,
)
from .fused_batch_norm import (
    fused_batch_norm_grad_v3,
    fused_batch_norm_sync_backprop_input,
    fused_batch_norm_sync_grad_sums,
    fused_batch_norm_sync_stats,
    fused_batch_norm_v3,
)
from .tf_seeds import fractional_pool_seeds

__all__ = [
    "fused_batch_norm_v3",
    "fused_batch_norm_grad_v3",
    "fused_batch_norm_sync_stats",
    "fused_batch_norm_sync_grad_sums",
    "fused_batch_norm_sync_backprop_input",
    "fractional_avg_pool",
    "fractional_avg_pool_grad",
    "fractional_max_pool",
    "fractional_max_pool_grad",
    "fractional_pooling_sequence",
    "fractional_pool_seeds",
    "depthwise_conv2d_native",
    "depthwise_conv2d_native_backprop_input",
    "depthwise_conv2d_native_backprop_filter",
    "cudnn_rnn_params_size",
    "cudnn_rnn_canonical_to_params_v2",
    "cudnn_rnn_params_to_canonical_v2",
    "cudnn_rnn_v3",
    "cudnn_rnn_backprop_v3",
]
