"""Public functions: one per op, TF's argument names and defaults, autograd-enabled.

Each is a thin wrapper over `torch.ops.tfgrads.<op>.default` that only fills in conveniences
(e.g. `mean=None`); the semantics are the op's (see ../shared/API.md and README.md).
"""
import torch


def _empty_stats(x):
    dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    return x.new_empty((0,), dtype=dtype)


def fused_batch_norm_v3(x, scale, offset, mean=None, variance=None, epsilon=1e-4,
                        exponential_avg_factor=1.0, data_format="NHWC", is_training=True):
    """TF's `FusedBatchNormV3`: batch normalisation over every dimension but the channels.

    Args:
        x: 4-D or 5-D tensor laid out as ``data_format`` says (float16, bfloat16, float32 or
            float64). Any strides are accepted; NHWC/NCHW memory is used without transposing.
        scale, offset: ``[C]`` float32 (float64 for float64 x).
        mean, variance: ``[C]`` running statistics, read in inference and when
            ``exponential_avg_factor != 1``; ``None`` means "not given" (an empty tensor, as
            ``tf.compat.v1.nn.fused_batch_norm`` passes).
        epsilon: added to the variance (TF's op default 1e-4; Keras uses 1e-3).
        exponential_avg_factor: training only; the returned statistics are
            ``(1-f) * running + f * batch`` (batch variance Bessel-corrected).
        data_format: "NHWC", "NCHW", "NDHWC" or "NCDHW".
        is_training: normalise with the batch statistics (True) or with mean/variance.

    Returns:
        ``(y, batch_mean, batch_variance, reserve_space_1, reserve_space_2, reserve_space_3)``:
        reserve_space_1/2 are the batch mean and *biased* batch variance in training (copies of
        mean/variance in inference), reserve_space_3 a zero scalar. Only ``y`` is
        differentiable (w.r.t. x, scale, offset), as in TF.
    """
    if mean is None:
        mean = _empty_stats(x)
    if variance is None:
        variance = _empty_stats(x)
    return torch.ops.tfgrads.fused_batch_norm_v3.default(
        x, scale, offset, mean, variance, epsilon, exponential_avg_factor, data_format,
        is_training)


def fused_batch_norm_grad_v3(y_backprop, x, scale, reserve_space_1, reserve_space_2,
                             reserve_space_3=None, epsilon=1e-4, data_format="NHWC",
                             is_training=True):
    """TF's `FusedBatchNormGradV3`: gradients of batch norm w.r.t. x, scale and offset.

    ``reserve_space_1/2`` are trusted as the batch mean and biased variance (training) or the
    population mean and variance (inference); ``reserve_space_3`` is ignored, as on TF's CPU.
    Returns ``(x_backprop, scale_backprop, offset_backprop, reserve_space_4, reserve_space_5)``
    with empty placeholders for the last two. Differentiable w.r.t. y_backprop, x and scale
    (TF's second-order gradient).
    """
    if reserve_space_3 is None:
        reserve_space_3 = _empty_stats(x)
    return torch.ops.tfgrads.fused_batch_norm_grad_v3.default(
        y_backprop, x, scale, reserve_space_1, reserve_space_2, reserve_space_3, epsilon,
        data_format, is_training)
