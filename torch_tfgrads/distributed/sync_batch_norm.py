"""Synchronized FusedBatchNorm: Keras's ``BatchNormalization(synchronized=True)`` over
``torch.distributed``.

Forward: every process computes its per-channel ``[sum x | sum x^2 | count]``
(``fused_batch_norm_sync_stats``), one SUM all-reduce of that ``2C + 1`` buffer, Keras's
statistics ``mean = sum / count``, ``variance = max(sum_sq / count - mean^2, 0)`` (Keras 3 and
tf-keras 2.21 alike), then this library's batch-norm kernel normalises with them. Backward: the
local ``[sum dy | sum dy * (x - mean)]`` (``fused_batch_norm_sync_grad_sums``), one all-reduce of
that ``2C`` buffer, the input gradient from the global sums
(``fused_batch_norm_sync_backprop_input``); the scale/offset gradients stay local, as DDP
averages them. Under ``torch.compile`` the collectives are torch's functional ones, so the step
stays one graph; nothing waits on the host for a value.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..ops import (
    fused_batch_norm_sync_backprop_input,
    fused_batch_norm_sync_grad_sums,
    fused_batch_norm_sync_stats,
    fused_batch_norm_v3,
)


def is_synchronizing(process_group: dist.ProcessGroup | None = None) -> bool:
    """Whether statistics are summed over processes: torch.distributed is initialised and the
    group (default: the world) has more than one process."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size(process_group) > 1


def _all_reduce_sum(t: torch.Tensor, group) -> torch.Tensor:
    """The SUM over the group of a buffer this module owns: torch's functional collective under
    torch.compile (traceable, one graph), the in-place c10d collective on a copy in eager mode
    (the functional one costs an extra wait round trip per call in eager; docs/benchmarks.md,
    "Synchronized batch norm")."""
    if not is_synchronizing(group):
        return t  # Keras's default replica context: the all-reduce of one replica
    if torch.compiler.is_compiling():
        from torch.distributed import _functional_collectives as funcol

        return funcol.all_reduce(t, "sum", group if group is not None else dist.group.WORLD)
    out = t.clone()
    dist.all_reduce(out, group=group)
    return out


def keras_moments(
    total: torch.Tensor, channels: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Keras's global ``(mean, variance, count)`` from the all-reduced ``[sum | sum_sq | count]``:
    ``divide_no_nan`` by the count and ``maximum(E[x^2] - E[x]^2, 0)`` (Keras 3 and tf-keras 2.21
    alike; an empty global batch gives 0)."""
    C = channels
    count = total[2 * C :]
    # [sum | sum_sq] / count in one division; divide_no_nan as a select (count is one value)
    means = torch.where(count == 0, 0.0, total[: 2 * C] / count)
    mean, sq_mean = means[:C], means[C:]
    return mean, torch.clamp_min(sq_mean - mean * mean, 0.0), count


class _SyncFusedBatchNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, scale, offset, epsilon, data_format, group):
        C = scale.shape[0]
        total = _all_reduce_sum(fused_batch_norm_sync_stats(x, data_format), group)
        mean, var, count = keras_moments(total, C)
        y = fused_batch_norm_v3(
            x, scale, offset, mean, var, epsilon, data_format=data_format, is_training=False
        )[0]
        ctx.save_for_backward(x, scale, mean, var, count)
        ctx.epsilon, ctx.data_format, ctx.group = epsilon, data_format, group
        ctx.mark_non_differentiable(mean, var)
        return y, mean, var

    @staticmethod
    def backward(ctx, dy, _g_mean, _g_var):
        x, scale, mean, var, count = ctx.saved_tensors
        if torch.is_grad_enabled() and (dy.requires_grad or x.requires_grad):
            raise NotImplementedError(
                "sync_fused_batch_norm: double backward (create_graph=True through a "
                "synchronized batch norm) is not supported; use FusedBatchNorm outside a "
                "process group, whose gradient is twice differentiable"
            )
        C = scale.shape[0]
        local = fused_batch_norm_sync_grad_sums(dy, x, mean, ctx.data_format)
        total = _all_reduce_sum(local, ctx.group)
        dx = fused_batch_norm_sync_backprop_input(
            dy, x, scale, mean, var, total, count, ctx.epsilon, ctx.data_format
        )
        inv = 1.0 / torch.sqrt(var + ctx.epsilon)
        return dx, local[C:] * inv, local[:C], None, None, None


def sync_fused_batch_norm(
    x: torch.Tensor,
    scale: torch.Tensor,
    offset: torch.Tensor,
    epsilon: float = 1e-3,
    data_format: str = "NHWC",
    process_group: dist.ProcessGroup | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Batch norm in training with statistics over every process of ``process_group``.

    Returns ``(y, mean, variance)``: the output and the global batch mean and biased variance
    (Keras's formula; not differentiable). Differentiable w.r.t. ``x``, ``scale`` and
    ``offset`` once (the backward takes one all-reduce; double backward raises
    NotImplementedError). Every process of the group must call it, also one whose batch is
    empty (it contributes a count of 0). Outside an initialised process group, or with one
    process, the all-reduces are the identity and the result is Keras's synchronized layer on
    one replica.

    Example (inside a process started by ``torchrun``)::

        y, mean, var = sync_fused_batch_norm(x, gamma, beta, epsilon=1e-3)
    """
    return _SyncFusedBatchNorm.apply(x, scale, offset, epsilon, data_format, process_group)
