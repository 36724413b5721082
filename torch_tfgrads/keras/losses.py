"""Keras 3's crossentropy losses in torch, with Keras's clipping, normalisation and reduction.

Each function returns what the Keras loss *object* returns (``keras.losses.
SparseCategoricalCrossentropy()(y_true, y_pred)`` and so on): per-sample losses reduced with
``reduction`` (Keras's default ``"sum_over_batch_size"``: the sum divided by the number of
per-sample values). Probabilities are clipped to ``[1e-7, 1 - 1e-7]`` before the log (and, for
the categorical loss, first divided by their sum), as Keras does; torch's ``nll_loss`` of a
``log`` gives ``inf`` at 0 and ``binary_cross_entropy`` clamps the log at -100 instead.

The logits paths follow TF's kernels (``softmax_cross_entropy_with_logits``, its sparse form and
``sigmoid_cross_entropy_with_logits``) in their order of operations.

Keras 3 on TensorFlow computes a crossentropy on the output of a Keras softmax or sigmoid
(``Dense(activation="softmax")``, ``Activation``, ``Softmax``, ``keras.ops.softmax``) *from the
logits* (the ``_keras_logits`` attribute Keras attaches to the output), eagerly and in
``fit``: to reproduce such a loss, pass the logits with ``from_logits=True`` (see
docs/training.md).
"""

from __future__ import annotations

import torch

__all__ = ["binary_crossentropy", "categorical_crossentropy", "sparse_categorical_crossentropy"]

EPSILON = 1e-7  # keras.config.epsilon()
_REDUCTIONS = ("sum_over_batch_size", "mean", "sum", "mean_with_sample_weight", "none", None)


def _check_float(name, fn, t):
    if not t.is_floating_point():
        raise TypeError(f"{fn}: argument '{name}' must be a floating-point tensor, got {t.dtype}")


def _check_reduction(fn, reduction):
    if reduction not in _REDUCTIONS:
        raise ValueError(
            f"{fn}: argument 'reduction' must be one of {list(_REDUCTIONS)}, got {reduction!r}"
        )


def _squeeze_or_expand(x1, x2):
    """keras.src.losses.loss.squeeze_or_expand_to_same_rank (expand_rank_1=True)."""
    r1, r2 = x1.dim(), x2.dim()
    if r1 == r2 + 1 and x1.shape[-1] == 1:
        if r2 == 1:
            x2 = x2.unsqueeze(-1)
        else:
            x1 = x1.squeeze(-1)
    if r2 == r1 + 1 and x2.shape[-1] == 1:
        if r1 == 1:
            x1 = x1.unsqueeze(-1)
        else:
            x2 = x2.squeeze(-1)
    return x1, x2


def _reduce(values, sample_weight, reduction):
    """keras.src.losses.loss.reduce_weighted_values (without masks)."""
    if sample_weight is not None:
        sample_weight = torch.as_tensor(sample_weight, device=values.device).to(values.dtype)
        values, sample_weight = _squeeze_or_expand(values, sample_weight)
        values = values * sample_weight
    if reduction in (None, "none") or values.dim() == 0 or tuple(values.shape) == (0,):
        return values
    loss = values.sum()
    if reduction == "sum":
        return loss
    if reduction == "mean_with_sample_weight" and sample_weight is not None:
        divisor = sample_weight.sum()
    else:
        divisor = torch.tensor(values.numel(), dtype=loss.dtype, device=loss.device)
    # ops.divide_no_nan: 0 where the divisor is 0
    return torch.where(divisor == 0, torch.zeros_like(loss), loss / divisor)


def _clip(p):
    return torch.clamp(p, EPSILON, 1.0 - EPSILON)


def _sparse_xent(labels, logits):
    """TF's SparseSoftmaxCrossEntropyWithLogits: log(sum(exp(l - max))) - (l - max)[label]."""
    shifted = logits - logits.amax(-1, keepdim=True)
    lse = torch.log(torch.exp(shifted).sum(-1))
    return lse - shifted.gather(-1, labels.unsqueeze(-1)).squeeze(-1)


def _dense_xent(labels, logits):
    """TF's SoftmaxCrossEntropyWithLogits on the last axis: sum(y * (log(sum(exp)) - shifted))."""
    shifted = logits - logits.amax(-1, keepdim=True)
    lse = torch.log(torch.exp(shifted).sum(-1, keepdim=True))
    return (labels * (lse - shifted)).sum(-1)


def sparse_categorical_crossentropy(
    y_true: torch.Tensor,
    y_pred: torch.Tensor,
    from_logits: bool = False,
    *,
    reduction: str | None = "sum_over_batch_size",
    sample_weight: torch.Tensor | None = None,
) -> torch.Tensor:
    """``keras.losses.SparseCategoricalCrossentropy(from_logits)(y_true, y_pred)``.

    Args:
        y_true: integer class indices, shaped like ``y_pred`` without its last axis (a trailing
            axis of 1 is dropped, and float labels are truncated to int64, as in Keras).
        y_pred: probabilities (clipped to ``[1e-7, 1 - 1e-7]``, then ``log``, then Keras's
            softmax crossentropy of those log-probabilities, which renormalises them) or, with
            ``from_logits=True``, logits. Classes on the last axis.
        reduction: ``"sum_over_batch_size"`` / ``"mean"`` (Keras's default: sum / number of
            values), ``"sum"``, ``"mean_with_sample_weight"`` or ``"none"`` (per-sample values,
            what the function ``keras.losses.sparse_categorical_crossentropy`` returns).
        sample_weight: optional weights broadcast against the per-sample losses.

    Computed in ``y_pred``'s dtype (the Keras loss object computes in ``floatx``, float32, unless
    made with ``dtype="float64"``).

    Example::

        logits = torch.randn(8, 5, requires_grad=True)
        labels = torch.randint(0, 5, (8,))
        loss = sparse_categorical_crossentropy(labels, logits, from_logits=True)
        loss.backward()
    """
    fn = "sparse_categorical_crossentropy"
    _check_float("y_pred", fn, y_pred)
    _check_reduction(fn, reduction)
    labels = torch.as_tensor(y_true, device=y_pred.device)
    if labels.dim() == y_pred.dim() and labels.shape[-1] == 1:
        labels = labels.squeeze(-1)
    if tuple(labels.shape) != tuple(y_pred.shape[:-1]):
        raise RuntimeError(
            f"{fn}: argument 'y_true' must have y_pred's shape without its last axis, got "
            f"{list(labels.shape)} for y_pred {list(y_pred.shape)}"
        )
    labels = labels.to(torch.int64)
    logits = y_pred if from_logits else torch.log(_clip(y_pred))
    return _reduce(_sparse_xent(labels, logits), sample_weight, reduction)


def categorical_crossentropy(
    y_true: torch.Tensor,
    y_pred: torch.Tensor,
    from_logits: bool = False,
    *,
    label_smoothing: float = 0.0,
    axis: int = -1,
    reduction: str | None = "sum_over_batch_size",
    sample_weight: torch.Tensor | None = None,
) -> torch.Tensor:
    """``keras.losses.CategoricalCrossentropy(from_logits, label_smoothing, axis)(y_true, y_pred)``.

    Probabilities are divided by their sum over ``axis``, clipped to ``[1e-7, 1 - 1e-7]`` and
    ``-sum(y_true * log(p))`` is taken; logits go through TF's softmax crossentropy. With
    ``label_smoothing`` the targets become ``y_true * (1 - s) + s / num_classes`` (Keras takes
    ``num_classes`` from the last axis). ``reduction`` and ``sample_weight`` as in
    :func:`sparse_categorical_crossentropy`.

    Example::

        probs = torch.tensor([[0.9, 0.1, 0.0], [0.0, 0.0, 1.0]])
        onehot = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
        categorical_crossentropy(onehot, probs)   # (0.10536 + 16.1181) / 2, 0 clipped to 1e-7
    """
    fn = "categorical_crossentropy"
    _check_float("y_pred", fn, y_pred)
    _check_reduction(fn, reduction)
    target = torch.as_tensor(y_true, device=y_pred.device).to(y_pred.dtype)
    if target.shape != y_pred.shape:
        raise RuntimeError(
            f"{fn}: argument 'y_true' must have y_pred's shape, got {list(target.shape)} for "
            f"y_pred {list(y_pred.shape)}"
        )
    if label_smoothing:
        target = target * (1.0 - label_smoothing) + label_smoothing / target.shape[-1]
    if from_logits:
        values = _dense_xent(target.movedim(axis, -1), y_pred.movedim(axis, -1))
    else:
        p = _clip(y_pred / y_pred.sum(axis, keepdim=True))
        values = -(target * torch.log(p)).sum(axis)
    return _reduce(values, sample_weight, reduction)


def _sigmoid_xent(labels, logits):
    """tf.nn.sigmoid_cross_entropy_with_logits: max(x, 0) - x * z + log1p(exp(-|x|))."""
    cond = logits >= 0
    zeros = torch.zeros_like(logits)
    relu_logits = torch.where(cond, logits, zeros)
    neg_abs_logits = torch.where(cond, -logits, logits)
    return (relu_logits - logits * labels) + torch.log1p(torch.exp(neg_abs_logits))


def binary_crossentropy(
    y_true: torch.Tensor,
    y_pred: torch.Tensor,
    from_logits: bool = False,
    *,
    label_smoothing: float = 0.0,
    reduction: str | None = "sum_over_batch_size",
    sample_weight: torch.Tensor | None = None,
    tf_keras: bool = False,
) -> torch.Tensor:
    """``keras.losses.BinaryCrossentropy(from_logits, label_smoothing)(y_true, y_pred)``.

    Per element ``-(y * log(p) + (1 - y) * log(1 - p))`` of the clipped probability ``p`` (or
    TF's ``sigmoid_cross_entropy_with_logits`` of logits), averaged over the last axis (Keras's
    per-sample loss), then reduced. ``label_smoothing`` makes the targets
    ``y * (1 - s) + 0.5 * s``. A ``y_true`` of shape ``[N]`` with a ``y_pred`` of ``[N, 1]``
    (or the reverse) is matched as Keras does.

    ``tf_keras=True``: tf-keras's (Keras 2's) formula, which also adds ``1e-7`` inside both logs
    after clipping (``log(p + 1e-7)``, ``log(1 - p + 1e-7)``): about 1e-7 apart from Keras 3's
    for confident predictions, but ``-log(2e-7) = 15.42`` instead of ``-log(1e-7) = 16.12`` for a
    prediction of 0 with target 1.

    Example::

        binary_crossentropy(torch.tensor([1.0, 0.0]), torch.tensor([1.0, 1.0]))  # 7.971 (1 clipped)
    """
    fn = "binary_crossentropy"
    _check_float("y_pred", fn, y_pred)
    _check_reduction(fn, reduction)
    target = torch.as_tensor(y_true, device=y_pred.device).to(y_pred.dtype)
    target, y_pred = _squeeze_or_expand(target, y_pred)
    if target.shape != y_pred.shape:
        raise RuntimeError(
            f"{fn}: argument 'y_true' must have y_pred's shape, got {list(target.shape)} for "
            f"y_pred {list(y_pred.shape)}"
        )
    if label_smoothing:
        target = target * (1.0 - label_smoothing) + 0.5 * label_smoothing
    if from_logits:
        elements = _sigmoid_xent(target, y_pred)
    else:
        p = _clip(y_pred)
        q = 1 - p
        if tf_keras:
            p, q = p + EPSILON, q + EPSILON
        # Keras's order: bce = y * log(p); bce += (1 - y) * log(1 - p); -bce
        bce = target * torch.log(p)
        bce = bce + (1 - target) * torch.log(q)
        elements = -bce
    values = elements.mean(-1) if elements.dim() > 0 else elements
    return _reduce(values, sample_weight, reduction)
