"""Keras 3's optimizers as ``torch.optim.Optimizer``: Keras's formulas, defaults and rounding.

Keras and torch name the same optimizers but not the same updates: Keras's Adam adds epsilon
before the bias correction (torch's after it), Keras's RMSprop adds it under the square root with
``rho=0.9`` (torch: outside, ``alpha=0.99``), Keras folds the learning rate into SGD's and
RMSprop's momentum (torch applies it afterwards, which differs once the rate changes), and
Keras's ``weight_decay`` is decoupled for every optimizer (torch's Adam, RMSprop and SGD add an
L2 term to the gradient). These classes run Keras 3's ``update_step`` (TF backend, Keras 3.15)
with its order of operations, so a float32 run stays within rounding of Keras's and float64
within ~1e-15; docs/training.md has the table and the measurements.

As in Keras, the learning rate is held in float32 (Keras keeps it in a float32 variable and
casts it to each variable's dtype), one iteration counter serves every parameter (a parameter
without a gradient still sees the counter move), and ``clipnorm`` / ``clipvalue`` /
``global_clipnorm`` clip the gradients before the decoupled weight decay and the update.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch

__all__ = ["KerasAdam", "KerasAdamW", "KerasRMSprop", "KerasSGD"]


def _float32(value) -> float:
    """``value`` rounded to float32 (Keras's learning-rate variable), as a Python float."""
    return torch.tensor(float(value), dtype=torch.float32).item()


def _sqrt(x: torch.Tensor) -> torch.Tensor:
    """A correctly rounded square root, as TF's (Eigen's) ``sqrt``.

    torch 2.13's vectorised float32 ``sqrt`` on the CPU is 1 ulp off for about one value in six;
    the float64 square root rounded to float32 is exact (53 >= 2 * 24 + 2 bits).
    """
    if x.dtype == torch.float64 or x.device.type != "cpu":
        return torch.sqrt(x)
    return torch.sqrt(x.double()).to(x.dtype)


def _check_range(name, cls, value, lo, hi, closed_hi=True):
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    ok = ok and lo <= value and (value <= hi if closed_hi else value < hi)
    if not ok:
        bracket = "]" if closed_hi else ")"
        raise ValueError(
            f"{cls}: argument '{name}' must be a number in [{lo}, {hi}{bracket}, got {value!r}"
        )


class _KerasOptimizer(torch.optim.Optimizer):
    """What Keras 3's ``BaseOptimizer.apply`` does around every ``update_step``."""

    def __init__(
        self,
        params,
        defaults: dict[str, Any],
        clipnorm: float | None,
        clipvalue: float | None,
        global_clipnorm: float | None,
        loss_scale_factor: float | None,
        use_ema: bool,
        gradient_accumulation_steps: int | None,
    ) -> None:
        cls = type(self).__name__
        _check_range("learning_rate", cls, defaults["lr"], 0.0, math.inf, closed_hi=False)
        if defaults["weight_decay"] is not None:
            _check_range("weight_decay", cls, defaults["weight_decay"], 0.0, math.inf, False)
        if sum(c is not None for c in (clipnorm, clipvalue, global_clipnorm)) > 1:
            raise ValueError(
                f"{cls}: arguments 'clipnorm', 'clipvalue', 'global_clipnorm': only one can be "
                f"set (as in Keras), got {clipnorm!r}, {clipvalue!r}, {global_clipnorm!r}"
            )
        if use_ema:
            raise ValueError(
                f"{cls}: argument 'use_ema': Keras's moving average of the weights is not "
                "part of this optimizer; keep one with torch.optim.swa_utils.AveragedModel("
                "model, multi_avg_fn=torch.optim.swa_utils.get_ema_multi_avg_fn(0.99)), "
                "which also copies the weights at its first update as Keras does"
            )
        if gradient_accumulation_steps is not None:
            raise ValueError(
                f"{cls}: argument 'gradient_accumulation_steps' is not supported; sum the "
                "gradients of several backward passes, divide by their number and step once"
            )
        self.clipnorm, self.clipvalue = clipnorm, clipvalue
        self.global_clipnorm, self.loss_scale_factor = global_clipnorm, loss_scale_factor
        super().__init__(params, defaults)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        # Keras has one iteration counter for all variables: a later group joins at its value.
        groups = getattr(self, "param_groups", [])
        param_group.setdefault("iterations", groups[0]["iterations"] if groups else 0)
        super().add_param_group(param_group)

    def _gradients(self):
        """(group, params, grads) after Keras's loss-scale division and clipping."""
        cls = type(self).__name__
        found = []
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError(f"{cls} does not support sparse gradients")
                found.append((group, p, p.grad))
        grads = [g for _, _, g in found]
        if self.loss_scale_factor is not None:
            grads = [g / self.loss_scale_factor for g in grads]
        if self.clipnorm:  # tf.clip_by_norm, per variable
            grads = [_clip_by_norm(g, self.clipnorm) for g in grads]
        elif self.global_clipnorm and grads:  # Keras's clip_by_global_norm
            grads = _clip_by_global_norm(grads, self.global_clipnorm)
        elif self.clipvalue:
            grads = [torch.clamp(g, -self.clipvalue, self.clipvalue) for g in grads]
        return [(group, p, g) for (group, p, _), g in zip(found, grads)]

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group, p, g in self._gradients():
            lr = _float32(group["lr"])
            wd = group["weight_decay"]
            if wd is not None:  # decoupled: var -= var * wd * lr, before the update
                p.sub_(p * _float32(wd) * lr)
            self._update(group, p, g.to(p.dtype), lr, self.state[p])
        for group in self.param_groups:
            group["iterations"] += 1
        return loss

    def _update(self, group, p, g, lr, state):  # Keras's update_step
        raise NotImplementedError


def _clip_by_norm(g, clip):
    l2sum = (g * g).sum()
    norm = torch.where(l2sum > 0, _sqrt(l2sum), l2sum)
    return g * clip / torch.clamp(norm, min=clip)


def _clip_by_global_norm(grads, clip):
    norm = _sqrt(torch.stack([(g * g).sum().to(grads[0].dtype) for g in grads]).sum())
    # A non-finite norm makes every gradient NaN, as in Keras.
    scale = clip * torch.minimum(1.0 / norm, torch.tensor(1.0 / clip, dtype=norm.dtype))
    scale = scale + (norm - norm)
    return [g * scale.to(g.dtype) for g in grads]


def _keras_common(
    clipnorm, clipvalue, global_clipnorm, loss_scale_factor, use_ema, gradient_accumulation_steps
):
    return dict(
        clipnorm=clipnorm,
        clipvalue=clipvalue,
        global_clipnorm=global_clipnorm,
        loss_scale_factor=loss_scale_factor,
        use_ema=use_ema,
        gradient_accumulation_steps=gradient_accumulation_steps,
    )


class KerasAdam(_KerasOptimizer):
    """``keras.optimizers.Adam`` in torch: Keras 3's update, defaults and rounding.

    Per step ``t`` (Keras's ``iterations + 1``), in the parameter's dtype::

        alpha = lr * sqrt(1 - beta_2**t) / (1 - beta_1**t)
        m += (g - m) * (1 - beta_1);  v += (g*g - v) * (1 - beta_2)
        v_hat = max(v_hat, v)                           # amsgrad only, used instead of v
        var -= (m * alpha) / (sqrt(v) + epsilon)

    ``torch.optim.Adam`` adds ``eps`` after the bias correction (``sqrt(v)/sqrt(1-beta_2**t) +
    eps``) and defaults to ``eps=1e-8``: other numbers, most visibly for small gradients.

    Args:
        params: parameters or parameter groups (a group may set ``lr``, ``weight_decay``,
            ``beta_1``, ... ; ``weight_decay=None`` in a group excludes it, as Keras's
            ``exclude_from_weight_decay``).
        lr: the learning rate (Keras's ``learning_rate``), rounded to float32 like Keras's.
            torch's schedulers may change it between steps.
        beta_1, beta_2, epsilon, amsgrad: Keras's (``epsilon=1e-7``).
        weight_decay: decoupled, Keras's ``var -= var * weight_decay * lr`` before the update
            (torch's Adam instead adds ``weight_decay * var`` to the gradient).
        clipnorm, clipvalue, global_clipnorm: Keras's gradient clipping (at most one).
        loss_scale_factor: gradients are divided by it first.
        use_ema, gradient_accumulation_steps: Keras options not provided here; anything but
            the default raises ``ValueError`` with the torch way to do it.

    Example::

        model = torch.nn.Linear(4, 2)
        opt = KerasAdam(model.parameters(), lr=1e-3)   # keras.optimizers.Adam(1e-3)
        model(torch.randn(8, 4)).square().mean().backward()
        opt.step()
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        lr: float = 0.001,
        beta_1: float = 0.9,
        beta_2: float = 0.999,
        epsilon: float = 1e-7,
        amsgrad: bool = False,
        weight_decay: float | None = None,
        clipnorm: float | None = None,
        clipvalue: float | None = None,
        global_clipnorm: float | None = None,
        loss_scale_factor: float | None = None,
        use_ema: bool = False,
        gradient_accumulation_steps: int | None = None,
    ) -> None:
        cls = type(self).__name__
        _check_range("beta_1", cls, beta_1, 0.0, 1.0, closed_hi=False)
        _check_range("beta_2", cls, beta_2, 0.0, 1.0, closed_hi=False)
        _check_range("epsilon", cls, epsilon, 0.0, math.inf, closed_hi=False)
        defaults = dict(
            lr=lr,
            beta_1=beta_1,
            beta_2=beta_2,
            epsilon=epsilon,
            amsgrad=amsgrad,
            weight_decay=weight_decay,
        )
        super().__init__(
            params,
            defaults,
            **_keras_common(
                clipnorm,
                clipvalue,
                global_clipnorm,
                loss_scale_factor,
                use_ema,
                gradient_accumulation_steps,
            ),
        )

    def _update(self, group, p, g, lr, state):
        if not state:
            state["momentum"] = torch.zeros_like(p)
            state["velocity"] = torch.zeros_like(p)
            if group["amsgrad"]:
                state["velocity_hat"] = torch.zeros_like(p)
        b1, b2 = group["beta_1"], group["beta_2"]
        # Keras computes the step's scalars as tensors of the variable's dtype (powf for
        # float32): the same here, on the CPU, then used as exact scalars of that dtype. Its
        # ops.cast(beta, dtype) of a Python float goes through float32 first.
        kw = {"dtype": p.dtype}
        t = torch.tensor(float(group["iterations"] + 1), **kw)
        b1p = torch.tensor(_float32(b1), **kw).pow(t)
        b2p = torch.tensor(_float32(b2), **kw).pow(t)
        alpha = (torch.tensor(lr, **kw) * _sqrt(1 - b2p) / (1 - b1p)).item()
        m, v = state["momentum"], state["velocity"]
        m.add_((g - m).mul_(1 - b1))
        v.add_((g * g - v).mul_(1 - b2))
        if group["amsgrad"]:
            v = torch.maximum(state["velocity_hat"], v, out=state["velocity_hat"])
        p.sub_((m * alpha).div_(_sqrt(v).add_(group["epsilon"])))


class KerasAdamW(KerasAdam):
    """``keras.optimizers.AdamW``: :class:`KerasAdam` with ``weight_decay=0.004`` by default.

    Keras's AdamW is its Adam with the (always decoupled) weight decay set; torch's
    ``AdamW`` decays as ``var *= 1 - lr * weight_decay`` (default 0.01) with torch's Adam update.

    Example::

        opt = KerasAdamW(torch.nn.Linear(4, 2).parameters())   # keras.optimizers.AdamW()
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        lr: float = 0.001,
        weight_decay: float = 0.004,
        beta_1: float = 0.9,
        beta_2: float = 0.999,
        epsilon: float = 1e-7,
        amsgrad: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            params,
            lr=lr,
            beta_1=beta_1,
            beta_2=beta_2,
            epsilon=epsilon,
            amsgrad=amsgrad,
            weight_decay=weight_decay,
            **kwargs,
        )


class KerasRMSprop(_KerasOptimizer):
    """``keras.optimizers.RMSprop`` in torch: Keras 3's update, defaults and rounding.

    In the parameter's dtype::

        v = rho * v + (1 - rho) * g*g
        a = rho * a + (1 - rho) * g                      # centered only
        den = v - a*a + epsilon  (centered)  or  v + epsilon
        increment = lr * g / sqrt(den)
        mom = momentum * mom + increment;  var -= mom    # momentum > 0
        var -= increment                                 # momentum == 0

    ``torch.optim.RMSprop`` defaults to ``alpha=0.99`` (Keras: ``rho=0.9``) and ``eps=1e-8``
    added *outside* the square root, and applies the learning rate after the momentum buffer.
    tf-keras's RMSprop multiplies by ``rsqrt(den)`` instead of dividing by ``sqrt(den)``: the
    same numbers up to rounding.

    Example::

        opt = KerasRMSprop(torch.nn.Linear(4, 2).parameters())   # keras.optimizers.RMSprop()
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        lr: float = 0.001,
        rho: float = 0.9,
        momentum: float = 0.0,
        epsilon: float = 1e-7,
        centered: bool = False,
        weight_decay: float | None = None,
        clipnorm: float | None = None,
        clipvalue: float | None = None,
        global_clipnorm: float | None = None,
        loss_scale_factor: float | None = None,
        use_ema: bool = False,
        gradient_accumulation_steps: int | None = None,
    ) -> None:
        cls = type(self).__name__
        _check_range("rho", cls, rho, 0.0, 1.0)
        _check_range("momentum", cls, momentum, 0.0, 1.0)
        _check_range("epsilon", cls, epsilon, 0.0, math.inf, closed_hi=False)
        defaults = dict(
            lr=lr,
            rho=rho,
            momentum=momentum,
            epsilon=epsilon,
            centered=centered,
            weight_decay=weight_decay,
        )
        super().__init__(
            params,
            defaults,
            **_keras_common(
                clipnorm,
                clipvalue,
                global_clipnorm,
                loss_scale_factor,
                use_ema,
                gradient_accumulation_steps,
            ),
        )

    def _update(self, group, p, g, lr, state):
        if not state:
            state["velocity"] = torch.zeros_like(p)
            if group["momentum"] > 0:
                state["momentum"] = torch.zeros_like(p)
            if group["centered"]:
                state["average_gradient"] = torch.zeros_like(p)
        rho, eps = group["rho"], group["epsilon"]
        v = state["velocity"]
        torch.add(v * rho, (g * g) * (1 - rho), out=v)
        if group["centered"]:
            a = state["average_gradient"]
            torch.add(a * rho, g * (1 - rho), out=a)
            den = (v - a * a).add_(eps)
        else:
            den = v + eps
        increment = (g * lr).div_(_sqrt(den))
        if group["momentum"] > 0:
            mom = state["momentum"]
            torch.add(mom * group["momentum"], increment, out=mom)
            p.sub_(mom)
        else:
            p.sub_(increment)


class KerasSGD(_KerasOptimizer):
    """``keras.optimizers.SGD`` in torch: the learning rate inside the momentum buffer.

    In the parameter's dtype::

        m = m * momentum - g * lr
        var += m * momentum - g * lr    # nesterov
        var += m                        # otherwise;  var -= g * lr  without momentum

    With a constant learning rate ``torch.optim.SGD(lr, momentum, nesterov=...)`` computes the
    same update (its buffer is Keras's divided by ``-lr``), up to rounding. They part when the
    rate changes (a schedule, ``ReduceLROnPlateau``): Keras's buffer keeps the old rates, torch
    rescales the whole buffer by the new one. And Keras's ``weight_decay`` is decoupled, torch's
    an L2 term in the gradient.

    Example::

        opt = KerasSGD(torch.nn.Linear(4, 2).parameters(), lr=0.1, momentum=0.9)
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        lr: float = 0.01,
        momentum: float = 0.0,
        nesterov: bool = False,
        weight_decay: float | None = None,
        clipnorm: float | None = None,
        clipvalue: float | None = None,
        global_clipnorm: float | None = None,
        loss_scale_factor: float | None = None,
        use_ema: bool = False,
        gradient_accumulation_steps: int | None = None,
    ) -> None:
        _check_range("momentum", type(self).__name__, momentum, 0.0, 1.0)
        defaults = dict(lr=lr, momentum=momentum, nesterov=nesterov, weight_decay=weight_decay)
        super().__init__(
            params,
            defaults,
            **_keras_common(
                clipnorm,
                clipvalue,
                global_clipnorm,
                loss_scale_factor,
                use_ema,
                gradient_accumulation_steps,
            ),
        )

    def _update(self, group, p, g, lr, state):
        momentum = group["momentum"]
        if momentum == 0:
            p.sub_(g * lr)
            return
        if not state:
            state["momentum"] = torch.zeros_like(p)
        m = state["momentum"]
        momentum = _float32(momentum)  # Keras's ops.cast(momentum, dtype): through float32
        torch.sub(m * momentum, g * lr, out=m)
        if group["nesterov"]:
            p.add_(m * momentum - g * lr)
        else:
            p.add_(m)
