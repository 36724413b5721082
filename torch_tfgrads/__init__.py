"""torch_tfgrads: TensorFlow's training ops, with TensorFlow's exact forward and gradient
semantics, as PyTorch custom ops (`torch.ops.tfgrads.*`) that work with autograd,
`torch.compile`, `torch.export` and AOTInductor.

Import order matters: torch first, then the extension (its static initialisers define the
ops), then the families' fake kernels and autograd formulas that attach to those ops.
"""

import torch  # noqa: F401  (the extension links against the already-loaded torch)

from . import _loader  # noqa: F401  (checks the build matches this CPU and torch, loads _C)
from . import cpu, nn
from ._version import __version__
from .ops import (
    cudnn_rnn_backprop_v3,
    cudnn_rnn_canonical_to_params_v2,
    cudnn_rnn_params_size,
    cudnn_rnn_params_to_canonical_v2,
    cudnn_rnn_v3,
    depthwise_conv2d_native,
    depthwise_conv2d_native_backprop_filter,
    depthwise_conv2d_native_backprop_input,
    fractional_avg_pool,
    fractional_avg_pool_grad,
    fractional_max_pool,
    fractional_max_pool_grad,
    fractional_pool_seeds,
    fractional_pooling_sequence,
    fused_batch_norm_grad_v3,
    fused_batch_norm_sync_backprop_input,
    fused_batch_norm_sync_grad_sums,
    fused_batch_norm_sync_stats,
    fused_batch_norm_v3,
)

__all__ = [
    "__version__",
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
    "nn",
    "cpu",
]


def __getattr__(name):
    # torch_tfgrads.compare / .record (the layer-by-layer diff of a Keras port, docs/debugging.md)
    # and the .diff subpackage load on first use, so that `import torch_tfgrads` stays free of
    # TensorFlow, h5py and the diff code. They are not in __all__, which lists the ops (every
    # name there is compiled by tests/test_compile_public.py).
    if name in ("compare", "record", "diff"):
        import importlib

        diff = importlib.import_module(".diff", __name__)
        return diff if name == "diff" else getattr(diff, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
