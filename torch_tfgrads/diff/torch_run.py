"""The torch side: the whole module run once with hooks (chained), and one layer run alone on
the reference's tensors (isolated).

Chained: a forward pre-hook and a forward hook on every mapped submodule capture each call's
arguments, outputs and state (buffers) before and after. Both hooks replace each float tensor
by ``t.view_as(t)``, a new tensor with the same values, so that the gradient captured for an
output is the gradient of this call's output alone (a layer that returns its input unchanged
would otherwise share its input's gradient), and the gradient back to an input flows through
this call alone (one input may also reach the call through another: a residual ``Add``).
After the forward, one ``torch.autograd.grad`` gives d loss / d every captured output, and one
more per call the vector-Jacobian product back to the call's inputs and weights. Nothing
accumulates into ``.grad``.

Isolated: the submodule is called on the reference's recorded inputs (dtype and device of the
tensors it received in the chained run, in the same argument structure), with its buffers set
back to what they were before that call, and the reference's output gradient is propagated
back through it alone.

Example (the argument plumbing of an isolated run)::

    >>> args = (torch.zeros(2), [torch.ones(1), 3])
    >>> [t.tolist() for t in flatten(args)]
    [[0.0, 0.0], [1.0]]
    >>> substitute(args, iter([torch.full((2,), 5.0), torch.zeros(1)]))[0].tolist()
    [5.0, 5.0]
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from .mapping import LayerMap


def flatten(obj) -> list[torch.Tensor]:
    """The tensors of a nested argument (lists, tuples, dicts by key), in order."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for v in obj for t in flatten(v)]
    if isinstance(obj, dict):
        return [t for k in sorted(obj, key=str) for t in flatten(obj[k])]
    return []


def flatten_call(args: tuple, kwargs: dict) -> list[torch.Tensor]:
    """Positional tensor arguments first, then keyword ones by name (as the recording)."""
    return flatten(list(args)) + [t for k in sorted(kwargs) for t in flatten(kwargs[k])]


def substitute(obj, it):
    """``obj`` with its tensors replaced, in flatten order, by the next items of ``it``."""
    if isinstance(obj, torch.Tensor):
        return next(it)
    if isinstance(obj, tuple):
        return tuple(substitute(v, it) for v in obj)
    if isinstance(obj, list):
        return [substitute(v, it) for v in obj]
    if isinstance(obj, dict):
        new = {k: None for k in obj}
        for k in sorted(obj, key=str):
            new[k] = substitute(obj[k], it)
        return new
    return obj


def _map_output(obj):
    """``obj`` with every float tensor that requires grad replaced by a new view of itself (same
    values, its own autograd node, so its own gradient; a tensor appearing twice gets two)."""
    if isinstance(obj, torch.Tensor):
        return obj.view_as(obj) if obj.is_floating_point() and obj.requires_grad else obj
    if isinstance(obj, tuple):
        return tuple(_map_output(v) for v in obj)
    if isinstance(obj, list):
        return [_map_output(v) for v in obj]
    if isinstance(obj, dict):
        return {k: _map_output(v) for k, v in obj.items()}
    return obj


def buffers(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: b.detach().clone() for n, b in module.named_buffers()}


def restore_buffers(module: torch.nn.Module, saved: dict[str, torch.Tensor]) -> None:
    for n, b in module.named_buffers():
        if n in saved:
            b.data = saved[n].clone()


@dataclass(eq=False)
class TorchCall:
    """One call of a mapped submodule in the chained run."""

    module: str
    args: tuple
    kwargs: dict
    ins: list[torch.Tensor]
    buffers_before: dict[str, torch.Tensor]
    state_before: list[torch.Tensor | None] = field(default_factory=list)
    state_after: list[torch.Tensor | None] = field(default_factory=list)
    outs: list[torch.Tensor] = field(default_factory=list)
    out_grads: list[torch.Tensor | None] = field(default_factory=list)
    in_grads: list[torch.Tensor | None] = field(default_factory=list)
    weight_grads: list[torch.Tensor | None] = field(default_factory=list)
    error: str | None = None
    previous: bool = False  # the module ran before this call in the chained run
    done: bool = False  # the call returned


@dataclass
class Chained:
    calls: dict[str, list[TorchCall]]
    outputs: list[torch.Tensor]
    loss: torch.Tensor | None
    error: str | None  # the forward raised
    backward_error: str | None = None  # the backward raised (the forward is still compared)


def _values(tensors):
    return [None if t is None else t.detach().clone() for t in tensors]


def run_chained(
    root: torch.nn.Module,
    inputs: list[torch.Tensor],
    modules: dict[str, tuple[torch.nn.Module, list]],
    *,
    loss_fn,
    targets: list[torch.Tensor],
    top_grads: list[torch.Tensor | None],
) -> Chained:
    """Run ``root(*inputs)`` with hooks on ``modules`` ({name: (module, state tensors)}) and
    backpropagate: through ``loss_fn(y_true, y_pred)`` if given, else ``top_grads`` at the
    float outputs. Buffers are changed by the run (training); the caller restores them."""
    calls: dict[str, list[TorchCall]] = {n: [] for n in modules}
    stack: list[TorchCall] = []
    handles = []
    for name, (mod, state) in modules.items():

        def pre(m, args, kwargs, name=name, state=state):
            # fresh views of the float inputs: the call's input gradient is then its own even
            # where one input also reaches the call through another (a residual Add)
            args, kwargs = _map_output(args), _map_output(kwargs)
            tc = TorchCall(name, args, kwargs, flatten_call(args, kwargs), buffers(m))
            tc.state_before = _values(state)
            calls[name].append(tc)
            stack.append(tc)
            return args, kwargs

        def post(m, args, kwargs, output, state=state):
            tc = stack.pop()
            output = _map_output(output)
            tc.outs = flatten(output)
            tc.state_after = _values(state)
            tc.done = True
            return output

        handles.append(mod.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(mod.register_forward_hook(post, with_kwargs=True))
    try:
        out = root(*inputs)
    except Exception as e:  # the report names the layer that raised
        if stack:
            stack[-1].error = f"{type(e).__name__}: {e}"
        return Chained(calls, [], None, f"{type(e).__name__}: {e}")
    finally:
        for h in handles:
            h.remove()
    outs = flatten(out)
    all_calls = [c for cs in calls.values() for c in cs]
    captured = [t for c in all_calls for t in c.outs if t.is_floating_point() and t.requires_grad]
    loss = None
    if loss_fn is not None:
        y_true = targets[0] if len(targets) == 1 else (targets or None)
        loss = loss_fn(y_true, outs[0] if len(outs) == 1 else outs)
        heads, head_grads = [loss], [None]
    else:
        pairs = [
            (o, g)
            for o, g in zip(outs, top_grads)
            if g is not None and o.is_floating_point() and o.requires_grad and o.shape == g.shape
        ]
        heads, head_grads = [p[0] for p in pairs], [p[1] for p in pairs]
    if not heads:
        return Chained(
            calls,
            outs,
            loss,
            None,
            "no model output to backpropagate from (none "
            "is a float tensor of the recorded shape that requires grad)",
        )
    grads = {}
    if captured:
        try:
            got = torch.autograd.grad(
                heads, captured, head_grads, retain_graph=True, allow_unused=True
            )
        except RuntimeError as e:  # the report says so; the forward is still compared
            return Chained(calls, outs, loss, None, f"{type(e).__name__}: {e}")
        grads = {id(t): g for t, g in zip(captured, got)}
    for c in all_calls:
        c.out_grads = [
            (grads.get(id(t)) if grads.get(id(t)) is not None else torch.zeros_like(t))
            if t.is_floating_point()
            else None
            for t in c.outs
        ]
    return Chained(calls, outs, loss, None)


def vjp(
    outs: list[torch.Tensor],
    dys: list[torch.Tensor | None],
    ins: list[torch.Tensor],
    params: list[torch.Tensor | None],
) -> tuple[list[torch.Tensor | None], list[torch.Tensor | None]]:
    """The gradients flowing back from ``outs`` (given ``dys``) to ``ins`` and ``params``; None
    for a source that is not a float tensor requiring grad, zeros for one that is unreached."""
    pairs = [
        (o, g)
        for o, g in zip(outs, dys)
        if g is not None and o.is_floating_point() and o.requires_grad and o.shape == g.shape
    ]
    sources = [
        t
        for t in list(ins) + list(params)
        if t is not None and t.is_floating_point() and t.requires_grad
    ]
    got = {}
    if pairs and sources:
        res = torch.autograd.grad(
            [p[0] for p in pairs],
            sources,
            [p[1] for p in pairs],
            retain_graph=True,
            allow_unused=True,
        )
        got = {id(s): g for s, g in zip(sources, res)}

    def pick(t):
        if t is None or not (t.is_floating_point() and t.requires_grad):
            return None
        g = got.get(id(t))
        return torch.zeros_like(t) if g is None else g

    return [pick(t) for t in ins], [pick(t) for t in params]


@dataclass
class Isolated:
    outs: list[torch.Tensor] = field(default_factory=list)
    state_after: list[torch.Tensor | None] = field(default_factory=list)
    in_grads: list[torch.Tensor | None] = field(default_factory=list)
    weight_grads: list[torch.Tensor | None] = field(default_factory=list)
    error: str | None = None
    note: str = ""


def _to_torch(a: np.ndarray, like: torch.Tensor | None, dtype: torch.dtype, device) -> torch.Tensor:
    t = torch.from_numpy(np.ascontiguousarray(a))
    if like is not None:
        return t.to(dtype=like.dtype, device=like.device)
    return t.to(dtype=dtype if t.is_floating_point() else t.dtype, device=device)


def run_isolated(
    module: torch.nn.Module,
    lmap: LayerMap,
    template: TorchCall | None,
    ref_inputs: list[np.ndarray],
    ref_dys: list[np.ndarray | None],
    state: list[torch.Tensor | None],
    params: list[torch.Tensor | None],
    *,
    dtype: torch.dtype,
    device,
    ref_state: list[np.ndarray | None] | None = None,
) -> Isolated:
    """Call ``module`` alone on the reference inputs and, where ``ref_state`` gives them, the
    reference's values of its state tensors before the call (otherwise its own buffers before
    the chained call), and backpropagate the reference output gradients. Outputs and gradients come back in
    Keras's layout (``lmap.output``); the input gradients are with respect to the reference
    inputs as given (Keras's layout)."""
    res = Isolated()
    likes = template.ins if template is not None else [None] * len(ref_inputs)
    if template is not None and len(template.ins) != len(ref_inputs):
        res.error = (
            f"the torch call took {len(template.ins)} tensor arguments, the Keras call "
            f"{len(ref_inputs)}; cannot feed it the reference inputs"
        )
        return res
    leaves = []
    for a, like in zip(ref_inputs, likes):
        t = _to_torch(a, like, dtype, device)
        if t.is_floating_point():
            t.requires_grad_(True)
        leaves.append(t)
    fed = [lmap.input(t) if lmap.input is not None and t.is_floating_point() else t for t in leaves]
    if template is not None:
        it = iter(fed)
        args, kwargs = substitute(template.args, it), substitute(template.kwargs, it)
        restore_buffers(module, template.buffers_before)
    else:  # not reached in the chained run: the Keras call's tensors, positionally
        args, kwargs = (tuple(fed) if len(fed) == 1 else (fed,)), {}
        res.note = "not reached in the torch run; called with the reference inputs positionally"
    with torch.no_grad():  # the reference's state before the call (moving statistics)
        for t, a in zip(state, ref_state or []):
            if t is not None and a is not None and tuple(t.shape) == a.shape:
                t.copy_(torch.from_numpy(np.array(a)).to(t))  # (ascontiguousarray makes 0-d 1-d)
    try:
        with torch.enable_grad():
            out = module(*args, **kwargs)
            outs = flatten(out)
            if lmap.output is not None:
                outs = [lmap.output(t) if t.is_floating_point() else t for t in outs]
    except Exception as e:  # noqa: BLE001 - reported as the layer's error
        res.error = f"{type(e).__name__}: {e}"
        return res
    res.outs = outs
    res.state_after = _values(state)
    dys = [
        None if g is None or i >= len(outs) else _to_torch(g, outs[i], dtype, device)
        for i, g in enumerate(ref_dys)
    ]
    try:
        res.in_grads, res.weight_grads = vjp(outs, dys, leaves, params)
    except RuntimeError as e:  # reported as the layer's error
        res.error = f"backward: {type(e).__name__}: {e}"
    return res
