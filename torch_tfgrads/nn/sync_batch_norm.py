"""Keras's ``BatchNormalization(synchronized=True)`` as a module, and the converter that makes
a model's batch norms synchronized (torch_tfgrads/distributed/sync_batch_norm.py computes)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from .fused_batch_norm import FusedBatchNorm


def _check_keras_version(keras_version, who):
    if keras_version not in (2, 3):
        raise ValueError(
            f"{who}: argument 'keras_version' must be 2 (tf-keras) or 3, got {keras_version!r}"
        )


def _check_group(process_group, who):
    if process_group is not None and not isinstance(process_group, dist.ProcessGroup):
        raise TypeError(
            f"{who}: argument 'process_group' must be a torch.distributed.ProcessGroup or None, "
            f"got {type(process_group).__name__}"
        )


class SyncFusedBatchNorm(FusedBatchNorm):
    """Batch norm whose training statistics are those of the global batch over all processes.

    Matches ``keras.layers.BatchNormalization(synchronized=True)`` under a TF distribution
    strategy: per-channel ``sum``, ``sum of squares`` and ``count`` summed over the processes of
    ``process_group`` (default: the world) in one all-reduce, ``mean = sum / count`` and the
    biased ``variance = max(E[x^2] - mean^2, 0)``, the moving statistics updated with that biased
    variance and Keras's momentum in the Keras version's rounding order (Keras 3:
    ``moving * momentum + batch * (1 - momentum)``; ``keras_version=2``, tf-keras:
    ``moving - (moving - batch) * decay`` with ``decay`` the float32 ``1 - momentum``, and no
    update on a process whose batch is empty). The backward all-reduces
    ``(sum dy, sum dy * x_hat)`` once; the gradients of ``weight``/``bias`` stay local for DDP to
    average. Every process must run the forward and backward, also one with an empty batch.

    Outside an initialised process group, with a group of one process, or in eval mode it is
    exactly :class:`FusedBatchNorm` (with the biased moving-variance rule).

    Example::

        model = torch_tfgrads.nn.convert_sync_batchnorm(model)  # or build with this class
        model = torch.nn.parallel.DistributedDataParallel(model)
    """

    synchronized = True

    def __init__(
        self,
        num_features: int,
        momentum: float = 0.99,
        epsilon: float = 1e-3,
        center: bool = True,
        scale: bool = True,
        data_format: str = "NHWC",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        process_group: dist.ProcessGroup | None = None,
        keras_version: int = 3,
    ) -> None:
        _check_keras_version(keras_version, "SyncFusedBatchNorm")
        _check_group(process_group, "SyncFusedBatchNorm")
        super().__init__(
            num_features,
            momentum,
            epsilon,
            center,
            scale,
            data_format,
            device=device,
            dtype=dtype,
            moving_variance="biased",
        )
        self.process_group, self.keras_version = process_group, keras_version

    def extra_repr(self):
        return super().extra_repr() + f", keras_version={self.keras_version}"


def convert_sync_batchnorm(
    module: torch.nn.Module,
    process_group: dist.ProcessGroup | None = None,
    keras_version: int | None = None,
) -> torch.nn.Module:
    """Makes every batch norm of ``module`` synchronized over ``process_group`` (default: the
    world), keeping its weights and buffers (the same tensors), like
    ``torch.nn.SyncBatchNorm.convert_sync_batchnorm``.

    A :class:`FusedBatchNorm` is replaced by a :class:`SyncFusedBatchNorm`; a subclass (such as
    the Keras converter's ``BatchNormalization``, which keeps Keras's variable names) is switched
    in place. ``keras_version`` picks the moving averages' Keras (3, or 2 for tf-keras's rounding
    order); by default a layer loaded from a Keras file keeps
    its file's Keras and every other layer gets Keras 3's rule.
    Returns the converted module (a new object when ``module`` itself was a FusedBatchNorm).
    Call it before wrapping the model in DistributedDataParallel.
    """
    _check_group(process_group, "convert_sync_batchnorm")
    if keras_version is not None:
        _check_keras_version(keras_version, "convert_sync_batchnorm")
    if not isinstance(module, torch.nn.Module):
        raise TypeError(
            f"convert_sync_batchnorm: argument 'module' must be a torch.nn.Module, got "
            f"{type(module).__name__}"
        )
    out = module
    if isinstance(module, FusedBatchNorm):
        version = keras_version
        if version is None:
            version = 2 if getattr(module, "keras_major", 3) < 3 else 3
        if type(module) is FusedBatchNorm:
            out = SyncFusedBatchNorm(
                module.num_features,
                module.momentum,
                module.epsilon,
                module.center,
                module.scale,
                module.data_format,
                process_group=process_group,
                keras_version=version,
            )
            with torch.no_grad():
                out.weight, out.bias = module.weight, module.bias
                out.running_mean, out.running_var = module.running_mean, module.running_var
            out.train(module.training)
        else:
            out.synchronized = True
            out.process_group, out.keras_version = process_group, version
    for name, child in module.named_children():
        out.add_module(name, convert_sync_batchnorm(child, process_group, keras_version))
    return out
