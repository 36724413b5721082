"""tf-keras's ``MirroredStrategy`` semantics for batch-norm moving statistics, for DDP users.

Under ``tf.distribute.MirroredStrategy`` each replica keeps its own copy of a BatchNormalization
layer's ``moving_mean`` / ``moving_variance``, updated from its local batch. What a read or a
checkpoint returns depends on the Keras: tf-keras (Keras 2) makes them ``ON_READ`` variables
with ``MEAN`` aggregation, so reading outside the replica context, or saving, gives the **mean
over the replicas**; Keras 3 (TF >= 2.16) makes them mirrored variables without aggregation, and
a read gives **replica 0's copy** (tests/test_sync_batch_norm_tf.py checks both in TF).

``DistributedDataParallel`` by default copies rank 0's buffers to every rank before each
forward (``forward_sync_buffers=True``, formerly ``broadcast_buffers=True``), so after k steps
rank 0 holds the statistics of its own batches alone (Keras 3's read, when reading or saving on
rank 0) and every other rank holds rank 0's statistics of k - 1 steps updated with its own k-th
batch. For tf-keras's semantics, wrap with ``forward_sync_buffers=False`` (each rank then keeps
its own copy, as a TF replica does; DDP still copies rank 0's initial buffers at construction, as
TF initialises the replicas alike) and take the mean over ranks when reading or saving, with
:func:`replica_mean_state_dict`, or fold it into the modules with :func:`average_buffers_`.
(``broadcast_buffers=False``, deprecated since torch 2.13, also skips that initial copy.)

Only the ``running_mean`` / ``running_var`` of :class:`torch_tfgrads.nn.FusedBatchNorm`
submodules (and subclasses) are averaged: those are the variables TF aggregates this way.
Other buffers, and ``torch.nn.BatchNorm*`` (whose distributed answer is
``torch.nn.SyncBatchNorm``), are left alone.
"""

from __future__ import annotations

from typing import Any, TypeVar

import torch

from ..nn import fused_batch_norm as _fbn  # the module, not the name: nn imports this package

__all__ = ["average_buffers_", "replica_mean_state_dict"]

_STATS = ("running_mean", "running_var")
ModuleT = TypeVar("ModuleT", bound=torch.nn.Module)


def _check_args(fn: str, module: Any, process_group: Any) -> None:
    if not isinstance(module, torch.nn.Module):
        raise TypeError(
            f"{fn}: argument 'module' must be a torch.nn.Module, got {type(module).__name__}"
        )
    if process_group is None:
        return
    dist = torch.distributed
    # new_group() hands the ranks outside the group this marker (an int), not a ProcessGroup.
    outsider = dist.is_available() and type(process_group) is int
    if outsider and process_group == dist.GroupMember.NON_GROUP_MEMBER:
        raise ValueError(
            f"{fn}: this rank is not a member of argument 'process_group' (new_group "
            "returned GroupMember.NON_GROUP_MEMBER here); call it on the group's ranks only"
        )
    if not (dist.is_available() and isinstance(process_group, dist.ProcessGroup)):
        raise TypeError(
            f"{fn}: argument 'process_group' must be a torch.distributed.ProcessGroup or None, "
            f"got {type(process_group).__name__}"
        )


def _world_size(fn: str, process_group: Any) -> int:
    """The group's size, or 1 where there is nothing to average over (no process group)."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return 1
    size = torch.distributed.get_world_size(process_group)
    if size < 1:  # torch's answer for a rank outside the group
        raise ValueError(
            f"{fn}: this rank ({torch.distributed.get_rank()}) is not a member of argument "
            "'process_group'"
        )
    return size


def _batch_norms(module: torch.nn.Module) -> list[_fbn.FusedBatchNorm]:
    return [m for m in module.modules() if isinstance(m, _fbn.FusedBatchNorm)]


def _replica_means(
    bns: list[_fbn.FusedBatchNorm], process_group: Any, world_size: int
) -> dict[tuple[int, str], torch.Tensor]:
    """``{(id(bn), buffer name): mean over ranks}``, with two all-reduces per (device, dtype)."""
    tensors = [(id(bn), name, getattr(bn, name)) for bn in bns for name in _STATS]
    groups: dict[tuple[torch.device, torch.dtype], list[int]] = {}
    for i, (_, _, t) in enumerate(tensors):
        # float16/bfloat16 statistics (a module converted with .half()) are summed in float32:
        # a sum over many ranks could overflow or lose the small ones.
        acc = torch.promote_types(t.dtype, torch.float32)
        groups.setdefault((t.device, acc), []).append(i)
    means = {}
    reduce_op = torch.distributed.ReduceOp
    # The same module structure gives every rank the same groups in the same order, so the
    # all-reduces pair up.
    for (_, acc), idx in groups.items():
        local = torch.cat([tensors[i][2].detach().reshape(-1).to(acc) for i in idx])
        total = local.clone()
        torch.distributed.all_reduce(total, reduce_op.SUM, group=process_group)
        # Where every rank holds the same value (statistics already averaged, or synchronized
        # by SyncFusedBatchNorm) keep it exactly: sum / W can be an ulp off for W = 3. That
        # makes averaging idempotent. (A NaN anywhere makes the sum NaN, hence the mean.)
        hi_lo = torch.cat([local, -local])
        torch.distributed.all_reduce(hi_lo, reduce_op.MAX, group=process_group)
        same = (hi_lo[: local.numel()] == -hi_lo[local.numel() :]) & total.isfinite()
        flat = torch.where(same, local, total / world_size)  # (gloo has no ReduceOp.AVG)
        pieces = flat.split([tensors[i][2].numel() for i in idx])
        for i, piece in zip(idx, pieces):
            key, name, t = tensors[i]
            means[(key, name)] = piece.view_as(t).to(t.dtype)
    return means


@torch.no_grad()
def average_buffers_(module: ModuleT, process_group: Any = None) -> ModuleT:
    """Replace, in place on every rank, the moving statistics of each FusedBatchNorm in
    ``module`` by their mean over the ranks of ``process_group``: tf-keras MirroredStrategy's
    value of an ON_READ / MEAN variable, now held by every replica. Returns ``module``.

    A collective: every rank of the group must call it, with modules of the same structure
    (e.g. before evaluating, or at the end of an epoch). It does nothing when no process group
    is initialised or the group has one rank. ``module`` may be the
    ``DistributedDataParallel`` wrapper or the model inside it.

    Where all ranks already hold the same value (after a previous call, or for a
    SyncFusedBatchNorm, whose statistics are the global batch's) it stays bit for bit.

    Why this is safe in the middle of training: the moving-average update
    ``running <- (1 - f) * running + f * batch_stat`` is linear, so the mean over ranks after
    any later step is ``(1 - f) * mean(running) + f * mean(batch_stat)`` whether or not the
    copies were averaged before it. Averaging changes the per-rank copies, which TF never
    exposes, but not the mean, which is what tf-keras reads and saves.

    Use it with ``DistributedDataParallel(model, forward_sync_buffers=False)``; with the
    default (``True``) the next forward overwrites every rank's statistics with rank 0's
    anyway. As in TF, a rank whose batch was empty holds NaN statistics (the op returns NaN
    batch statistics for an empty batch), and the mean is then NaN.

    Example::

        model = DistributedDataParallel(model, forward_sync_buffers=False)
        for x, y in loader:
            ...  # forward, backward, optimizer step: each rank updates its own statistics
        average_buffers_(model)  # every rank: the statistics tf-keras would read
        model.eval()

    Raises TypeError when ``module`` is not an nn.Module or ``process_group`` not a
    ProcessGroup, ValueError when this rank is not in ``process_group`` (only the group's
    ranks call it).
    """
    _check_args("average_buffers_", module, process_group)
    world_size = _world_size("average_buffers_", process_group)
    bns = _batch_norms(module)
    if world_size == 1 or not bns:
        return module
    means = _replica_means(bns, process_group, world_size)
    for bn in bns:
        for name in _STATS:
            getattr(bn, name).copy_(means[(id(bn), name)])
    return module


def replica_mean_state_dict(module: torch.nn.Module, process_group: Any = None) -> dict:
    """``module.state_dict()`` with the moving statistics of each FusedBatchNorm replaced by
    their mean over the ranks of ``process_group``: what tf-keras's checkpoint of a
    MirroredStrategy model saves. ``module`` itself is not changed.

    A collective: call it on every rank of the group (then save on one), with modules of the
    same structure. Every rank gets the same statistics. Without an initialised process group,
    or with one rank, it is ``module.state_dict()``. Entries other than the averaged statistics
    are what ``state_dict()`` returns (detached tensors sharing the module's storage); the
    averaged ones are new tensors. Keys are ``module``'s: pass ``ddp.module`` rather than the
    ``DistributedDataParallel`` wrapper for keys without the ``module.`` prefix.

    Example::

        model = DistributedDataParallel(net, forward_sync_buffers=False)
        ...  # training
        state = replica_mean_state_dict(net)  # on every rank
        if torch.distributed.get_rank() == 0:
            torch.save(state, "ckpt.pt")

    Raises TypeError when ``module`` is not an nn.Module or ``process_group`` not a
    ProcessGroup, ValueError when this rank is not in ``process_group`` (only the group's
    ranks call it).
    """
    _check_args("replica_mean_state_dict", module, process_group)
    world_size = _world_size("replica_mean_state_dict", process_group)
    state = module.state_dict()
    bns = _batch_norms(module)
    if world_size == 1 or not bns:
        return state
    means = _replica_means(bns, process_group, world_size)
    # remove_duplicate=False: state_dict lists a shared module under each of its paths.
    for path, sub in module.named_modules(remove_duplicate=False):
        if isinstance(sub, _fbn.FusedBatchNorm):
            for name in _STATS:
                key = f"{path}.{name}" if path else name
                if key in state:  # (a state-dict hook may have renamed or dropped it)
                    state[key] = means[(id(sub), name)]
    return state
