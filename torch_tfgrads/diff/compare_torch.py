"""compare(): run a torch module against a recording, layer by layer, chained and isolated.

Example (a converted model and a recording made where TensorFlow is installed)::

    import torch_tfgrads.keras, torch_tfgrads.diff as D
    module = torch_tfgrads.keras.load_model("model.keras")
    report = D.compare("recording.npz", module)
    print(report.table())
    report.first_divergence            # "conv2", or None
"""

from __future__ import annotations

import contextlib
import os

import numpy as np
import torch

from .mapping import LayerMap, find_module, map_weights, resolve_map
from .metrics import DEFAULT_RTOL, group_scales, measure, ref_magnitude
from .recording import CallRecord, Recording, load_recording
from .report import DiffReport, LayerDiff, RowDiff
from .torch_run import Chained, TorchCall, run_chained, run_isolated, vjp

_TORCH_DTYPES = {
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "float64": torch.float64,
}


def _is_keras_model(obj) -> bool:
    return any(
        c.__module__.startswith("keras") and c.__name__ in ("Model", "Layer")
        for c in type(obj).__mro__
    )


def _reference(reference, inputs, targets, keras_loss, training, float64) -> Recording:
    if isinstance(reference, Recording):
        return reference
    if isinstance(reference, (str, os.PathLike)):
        return load_recording(reference)
    if _is_keras_model(reference):
        if inputs is None:
            raise ValueError(
                "compare: argument 'inputs' is needed when the reference is a Keras model"
            )
        from .record_keras import record

        return record(
            reference,
            inputs,
            None,
            targets=targets,
            loss=keras_loss,
            training=True if training is None else training,
            float64=float64,
        )
    raise ValueError(
        "compare: argument 'reference' must be a recording path, a Recording or a Keras model, "
        f"got {type(reference).__name__}"
    )


def _module_dtype(module: torch.nn.Module) -> torch.dtype | None:
    for t in list(module.parameters()) + list(module.buffers()):
        if t.is_floating_point():
            return t.dtype
    return None


def _device(module: torch.nn.Module):
    for t in list(module.parameters()) + list(module.buffers()):
        return t.device
    return torch.device("cpu")


@contextlib.contextmanager
def _preserved(module: torch.nn.Module):
    """Give the module back exactly as it was: parameters (the float64 rerun converts them),
    buffers (a training run updates moving statistics) and train/eval flags."""
    params = [(p, p.data) for p in module.parameters()]
    bufs = [
        (m, n, b.data.clone())
        for m in module.modules()
        for n, b in m._buffers.items()
        if b is not None
    ]
    modes = [(m, m.training) for m in module.modules()]
    try:
        yield
    finally:
        for p, data in params:
            p.data = data
        for m, n, data in bufs:
            if m._buffers.get(n) is not None:
                m._buffers[n].data = data
        for m, mode in modes:
            m.training = mode


def _torch_arrays(arrays, dtype, device, grad=False):
    out = []
    for a in arrays:
        t = torch.from_numpy(np.ascontiguousarray(a)).to(device)
        if t.is_floating_point():
            t = t.to(dtype)
            if grad:
                t.requires_grad_(True)
        out.append(t)
    return out


def _keras_layout(t, fn):
    if t is None:
        return None
    t = t.detach()
    return fn(t) if fn is not None and t.is_floating_point() else t


_SKIP = object()  # no metric for this mode (not computed, or not meaningful)


def _rows(
    call: CallRecord,
    rec: Recording,
    tc: TorchCall | None,
    valid: bool,
    grads_ok: bool,
    iso,
    weights,
    lmap,
    rtol,
    atol,
    single: bool,
) -> list[RowDiff]:
    """The rows of one layer call (forward, weights and state, then gradients), each measured
    against its kind's group scale. ``tc``: the paired torch call (possibly one that raised);
    ``valid``: it completed; ``grads_ok``: the chained backward ran."""
    specs = []  # (key, kind, ref array, chained tensor | _SKIP, isolated tensor | "same" | _SKIP)
    iso_ok = iso.error is None

    def pick(lst, i):
        return lst[i] if lst is not None and i < len(lst) else None

    for i, key in enumerate(call.outputs):
        ch = _keras_layout(pick(tc.outs, i), lmap.output) if valid else _SKIP
        specs.append(
            (f"output[{i}]", "output", rec.array(key), ch, pick(iso.outs, i) if iso_ok else _SKIP)
        )
    state_i = 0
    # the state before a call is the layer's own only before its first call, in both runs
    first = call.index == 0 and (tc is None or not tc.previous)
    for w, (tensor, fn) in zip(call.weights, weights):
        if w.trainable:
            if first and tensor is not None:
                specs.append(
                    (
                        f"weight/{w.name}",
                        "weight",
                        rec.array(w.value),
                        _keras_layout(tensor, fn),
                        "same",
                    )
                )
            continue
        if tensor is not None:
            before = _keras_layout(pick(tc.state_before, state_i), fn) if tc else _SKIP
            # the state before a later call is what the earlier calls left: chained only
            specs.append(
                (
                    f"state_in/{w.name}",
                    "state",
                    rec.array(w.value),
                    before,
                    "same" if first else _SKIP,
                )
            )
            if w.after is not None:
                after = _keras_layout(pick(tc.state_after, state_i), fn) if valid else _SKIP
                it = _keras_layout(pick(iso.state_after, state_i), fn) if iso_ok else _SKIP
                specs.append((f"state_out/{w.name}", "state", rec.array(w.after), after, it))
        state_i += 1
    grads = valid and grads_ok
    for i, key in enumerate(call.output_grads):
        if key is not None:
            ch = _keras_layout(pick(tc.out_grads, i), lmap.output) if grads else _SKIP
            specs.append((f"output_grad[{i}]", "output_grad", rec.array(key), ch, _SKIP))
    for i, key in enumerate(call.input_grads):
        if key is not None:
            # with an input transform the torch input is in another layout: isolated only
            ch = pick(tc.in_grads, i) if grads and lmap.input is None else _SKIP
            specs.append(
                (
                    f"input_grad[{i}]",
                    "input_grad",
                    rec.array(key),
                    ch,
                    pick(iso.in_grads, i) if iso_ok else _SKIP,
                )
            )
    wg = 0
    for w, (tensor, fn) in zip(call.weights, weights):
        if not w.trainable:
            continue
        key = w.grad if single else w.this_call_grad
        if key is not None and tensor is not None:
            ch = _keras_layout(pick(tc.weight_grads, wg), fn) if grads else _SKIP
            it = _keras_layout(pick(iso.weight_grads, wg), fn) if iso_ok else _SKIP
            specs.append((f"weight_grad/{w.name}", "weight_grad", rec.array(key), ch, it))
        wg += 1
    group = {
        "output": "output",
        "state": "state",
        "weight": "weight",
        "output_grad": "grad",
        "input_grad": "grad",
        "weight_grad": "weight_grad",
    }
    scales = {}
    for g in set(group.values()):
        members = [k for k, s in enumerate(specs) if group[s[1]] == g]
        for k, sc in zip(members, group_scales([ref_magnitude(specs[k][2]) for k in members])):
            scales[k] = sc
    rows = []
    for k, (key, kind, ref, ch, it) in enumerate(specs):
        chained = None if ch is _SKIP else measure(ch, ref, rtol=rtol, atol=atol, scale=scales[k])
        if isinstance(it, str):  # "same": a weight, not changed by the run
            isolated = chained
        else:
            isolated = (
                None if it is _SKIP else measure(it, ref, rtol=rtol, atol=atol, scale=scales[k])
            )
        rows.append(RowDiff(key, kind, list(ref.shape), chained, isolated))
    return rows


def compare(
    reference,
    torch_module: torch.nn.Module,
    inputs=None,
    *,
    name_map: dict | None = None,
    rtol: float | None = None,
    atol: float = 0.0,
    float64: bool = False,
    loss=None,
    targets=None,
    training: bool | None = None,
    keras_loss=None,
) -> DiffReport:
    """Compare ``torch_module`` with a Keras reference, layer by layer, forward and backward.

    Args:
        reference: a recording (a path to a ``.npz``/``.h5`` written by :func:`record`, or a
            :class:`Recording`), or a Keras model (recorded in memory first: needs TensorFlow,
            and ``inputs``).
        torch_module: the port. Each Keras layer path (``conv1``, ``inner/conv``) maps to the
            submodule of the same name (``inner.conv``), as in modules from
            ``torch_tfgrads.keras.load_model``, or through ``name_map``.
        inputs: the model inputs; with a recording they default to (and must equal) the
            recorded ones.
        name_map: ``{keras layer path: module name or LayerMap}`` for a module of your own.
        rtol, atol: a tensor is over tolerance where ``|torch - ref| > atol + rtol * scale``
            (``scale``: the reference's largest magnitude; see :mod:`.metrics`). ``rtol``
            defaults by dtype: 1e-5 float32, 1e-10 float64, 1e-2 float16/bfloat16.
        float64: run the torch side in float64 (``module.double()``, inputs too) against a
            float64 recording (``record(..., float64=True)``; done for you when ``reference`` is
            a Keras model). Errors that vanish in float64 come from float32 conditioning.
        loss: ``loss(y_true, y_pred) -> scalar`` in torch, the same loss as the recording's.
            Without it, the reference's gradient at the model outputs is backpropagated (for
            the default ``sum(output * seed)`` loss that is the loss's gradient exactly).
        targets, training, keras_loss: for a Keras ``reference`` only: the targets, the mode
            (default training) and the TF loss to record with.

    The module is given back as it was (parameters, buffers, train/eval mode). Returns a
    :class:`DiffReport`.
    """
    if not isinstance(torch_module, torch.nn.Module):
        raise ValueError(
            "compare: argument 'torch_module' must be a torch.nn.Module, got "
            f"{type(torch_module).__name__}"
        )
    if rtol is not None and not rtol >= 0:
        raise ValueError(f"compare: argument 'rtol' must be >= 0, got {rtol!r}")
    if not atol >= 0:
        raise ValueError(f"compare: argument 'atol' must be >= 0, got {atol!r}")
    if loss is not None and not callable(loss):
        raise ValueError(f"compare: argument 'loss' must be callable, got {type(loss).__name__}")
    rec = _reference(reference, inputs, targets, keras_loss, training, float64)
    if training is not None and not _is_keras_model(reference) and training != rec.training:
        raise ValueError(
            f"compare: argument 'training' is {training} but the recording was made with "
            f"training={rec.training}"
        )
    if inputs is not None and not _is_keras_model(reference):
        given = inputs if isinstance(inputs, (list, tuple)) else [inputs]
        if len(given) != len(rec.inputs) or not all(
            np.array_equal(np.asarray(a), b) for a, b in zip(given, rec.inputs)
        ):
            raise ValueError(
                "compare: argument 'inputs' differs from the inputs the recording was made "
                "with; leave it out to use the recorded ones"
            )
    rec_dtype = _TORCH_DTYPES.get(rec.dtype)
    if rec_dtype is None:
        raise TypeError(f"compare: the recording's dtype {rec.dtype!r} is not a float dtype")
    mod_dtype = _module_dtype(torch_module)
    if float64 and rec_dtype != torch.float64:
        raise TypeError(
            f"compare: argument 'float64': the recording is {rec.dtype}; compare in float64 "
            "against a float64 recording (record(..., float64=True), or `python -m "
            "torch_tfgrads record --float64`)"
        )
    if not float64 and mod_dtype is not None and mod_dtype != rec_dtype:
        raise TypeError(
            f"compare: the module is {str(mod_dtype).removeprefix('torch.')} and the recording "
            f"{rec.dtype}; pass float64=True to run the module in float64 against a float64 "
            "recording"
        )
    rtol = DEFAULT_RTOL.get(rec.dtype, 1e-5) if rtol is None else float(rtol)
    with _preserved(torch_module):
        if float64:
            torch_module.double()
        report = _compare(rec, torch_module, name_map, rtol, float(atol), loss, rec_dtype)
    report.float64 = float64
    return report


def _compare(rec, root, name_map, rtol, atol, loss, dtype) -> DiffReport:
    device = _device(root)
    root.train(rec.training)
    modules = {}
    # which module, tensors and transforms stand for each recorded layer
    plan: dict[str, tuple] = {}
    for call in rec.calls:
        if call.layer in plan:
            continue
        lmap = resolve_map(name_map, call.layer)
        mod = find_module(root, lmap.module)
        weights = map_weights(mod, lmap, call.weights) if mod is not None else []
        plan[call.layer] = (lmap, mod, weights)
        if mod is not None and mod is not root:
            # the non-trainable variables (moving statistics), snapshotted around each call
            state = [t for (t, _), w in zip(weights, call.weights) if not w.trainable]
            modules[lmap.module] = (mod, state)
    inputs = _torch_arrays(rec.inputs, dtype, device, grad=True)
    targets = _torch_arrays(rec.targets, dtype, device)
    top = [
        None if a is None else t
        for a, t in zip(
            rec.output_grads,
            _torch_arrays(
                [g if g is not None else np.zeros(0) for g in rec.output_grads], dtype, device
            ),
        )
    ]
    chained = run_chained(root, inputs, modules, loss_fn=loss, targets=targets, top_grads=top)
    n_calls: dict[str, int] = {}
    for call in rec.calls:
        n_calls[call.layer] = n_calls.get(call.layer, 0) + 1
    pairs = _pair_calls(rec, plan, chained)
    layers = []
    for call in rec.calls:
        lmap, mod, weights = plan[call.layer]
        lay = LayerDiff(call.id, call.layer, call.class_name, lmap.module if mod else None)
        layers.append(lay)
        if mod is None:
            lay.status = "unmapped"
            lay.notes.append(f"no torch submodule {lmap.module!r}; map it with name_map")
            continue
        if mod is root:
            lay.notes.append("maps onto the root module: not compared")
            lay.status = "unmapped"
            continue
        tcs = chained.calls.get(lmap.module, [])
        tc = pairs.get(call.id)
        if tc is not None:
            tc.previous = next(i for i, t in enumerate(tcs) if t is tc) > 0
        missing = [w.name for w, (t, _) in zip(call.weights, weights) if t is None]
        if missing:
            lay.notes.append(f"weights not found in the torch module: {', '.join(missing)}")
        params = [t for (t, _), w in zip(weights, call.weights) if w.trainable]
        grads_ok = chained.error is None and chained.backward_error is None
        if tc is not None and tc.done and grads_ok:
            try:
                tc.in_grads, tc.weight_grads = vjp(tc.outs, tc.out_grads, tc.ins, params)
            except RuntimeError as e:
                lay.notes.append(f"the chained backward through it raised {e}")
        if tc is None:
            lay.notes.append(
                f"the torch module was called {len(tcs)} time(s), the Keras layer "
                f"{n_calls[call.layer]}"
            )
        elif tc.error is not None:
            lay.notes.append(f"the chained torch run raised here: {tc.error}")
        state = [t for (t, _), w in zip(weights, call.weights) if not w.trainable]
        ref_state = [
            rec.array(w.value) if fn is None else None
            for (_, fn), w in zip(weights, call.weights)
            if not w.trainable
        ]
        iso = run_isolated(
            mod,
            lmap,
            tc,
            [rec.array(k) for k in call.inputs],
            [rec.array(k) for k in call.output_grads],
            state,
            params,
            dtype=dtype,
            device=device,
            ref_state=ref_state,
        )
        if iso.note:
            lay.notes.append(iso.note)
        valid = tc is not None and tc.done
        lay.rows = _rows(
            call,
            rec,
            tc,
            valid,
            grads_ok,
            iso,
            weights,
            lmap,
            rtol,
            atol,
            n_calls[call.layer] == 1,
        )
        if iso.error is not None:
            lay.status = "error"
            lay.notes.insert(0, f"run alone on the reference inputs, it raised {iso.error}")
        elif lay.over_rows("isolated"):
            lay.status = "diverges"
        elif lay.over_rows("chained") or (tc is not None and tc.error is not None):
            lay.status = "inherited"
    notes = []
    if chained.error is not None:
        notes.append(f"the chained torch run raised {chained.error}")
    if chained.backward_error is not None:
        notes.append(f"the chained backward raised {chained.backward_error}")
    return DiffReport(
        layers,
        dtype=rec.dtype,
        training=rec.training,
        rtol=rtol,
        atol=atol,
        model_rows=_model_rows(rec, chained, rtol, atol),
        reference={
            "versions": rec.versions,
            "loss": rec.loss.get("description"),
            "model": rec.meta.get("model", {}),
        },
        notes=notes,
    )


def _input_distance(tc: TorchCall, call: CallRecord, rec: Recording) -> float:
    refs = [rec.array(k) for k in call.inputs]
    if len(refs) != len(tc.ins):
        return float("inf")
    total = 0.0
    for t, r in zip(tc.ins, refs):
        if tuple(t.shape) != r.shape:
            return float("inf")
        a, b = t.detach().cpu().double().numpy(), r.astype(np.float64)
        total += float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30)) if b.size else 0.0
    return total


def _pair_calls(rec: Recording, plan: dict, chained: Chained) -> dict[str, TorchCall | None]:
    """The torch call that stands for each recorded call: the k-th call of a layer called
    once or whose torch calls cannot be told apart; otherwise the torch call whose inputs are
    closest to the recorded call's (Keras and the converter may run the calls of a shared
    layer in another order when they do not depend on each other)."""
    by_layer: dict[str, list[CallRecord]] = {}
    for call in rec.calls:
        by_layer.setdefault(call.layer, []).append(call)
    out: dict[str, TorchCall | None] = {}
    for layer, calls in by_layer.items():
        lmap, mod, _ = plan[layer]
        tcs = chained.calls.get(lmap.module, []) if mod is not None else []
        if len(calls) > 1 and len(tcs) > 1:
            costs = sorted(
                (_input_distance(tc, c, rec), i, j)
                for i, c in enumerate(calls)
                for j, tc in enumerate(tcs)
            )
            used_c, used_t = set(), set()
            for _, i, j in costs:
                if i not in used_c and j not in used_t:
                    out[calls[i].id] = tcs[j]
                    used_c.add(i)
                    used_t.add(j)
        for k, c in enumerate(calls):
            out.setdefault(c.id, tcs[k] if k < len(tcs) else None)
    return out


def _model_rows(rec: Recording, chained: Chained, rtol, atol) -> list[RowDiff]:
    rows = []
    for i, ref in enumerate(rec.outputs):
        got = chained.outputs[i] if i < len(chained.outputs) else None
        rows.append(
            RowDiff(
                f"model output[{i}]",
                "output",
                list(ref.shape),
                measure(got, ref, rtol=rtol, atol=atol),
                None,
            )
        )
    value = rec.array(rec.loss.get("value")) if rec.loss.get("value") else None
    got = chained.loss
    if got is None and rec.loss.get("kind") == "seed" and chained.outputs:
        seeds = [rec.array(k) for k in rec.meta.get("seeds", [])]
        terms = [
            (o.detach() * torch.from_numpy(s).to(o)).sum()
            for o, s in zip(chained.outputs, seeds)
            if s is not None and tuple(o.shape) == s.shape
        ]
        got = sum(terms) if terms else None
    if value is not None and got is not None:
        rows.append(
            RowDiff(
                "loss",
                "output",
                [],
                measure(got.detach().reshape(value.shape), value, rtol=rtol, atol=atol),
            )
        )
    return rows


__all__ = ["compare", "LayerMap"]
