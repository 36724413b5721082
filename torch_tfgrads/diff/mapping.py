"""Which torch submodule and which torch tensors stand for a Keras layer and its variables.

A module converted by :func:`torch_tfgrads.keras.load_model` needs no map: its submodules carry
the Keras layer names (a nested model's layers are ``outer.inner``) and list their tensors in
Keras's variable order. A module of your own maps through ``name_map``::

    name_map = {
        "conv1": "features.0",                       # Keras layer -> torch submodule
        "fc": LayerMap(
            "classifier",
            weights={"kernel": ("weight", lambda w: w.T)},   # torch tensor -> Keras layout
        ),
        "conv2": LayerMap("features.3", output=nchw_to_nhwc, input=nhwc_to_nchw),
    }

Transforms must be layout changes (transpose, permute, reshape): they are applied alike to
values and to gradients.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from .recording import WeightRecord

Transform = Callable[[torch.Tensor], torch.Tensor]


@dataclass
class LayerMap:
    """How one Keras layer maps onto a torch submodule.

    ``module``: the submodule's qualified name (``"features.3"``). ``output``: torch output ->
    Keras layout. ``input``: Keras input -> torch layout (for isolated runs). ``weights``: Keras
    variable name (as the recording names it: ``kernel``, ``forward_lstm/lstm_cell/kernel``) ->
    a torch parameter/buffer name below the module, or ``(name, transform)`` with a transform
    from the torch tensor to Keras's layout.
    """

    module: str
    output: Transform | None = None
    input: Transform | None = None
    weights: dict[str, str | tuple[str, Transform]] = field(default_factory=dict)


def resolve_map(name_map, layer: str) -> LayerMap:
    """The LayerMap of a Keras layer path: from ``name_map``, or the path with "." for "/"."""
    entry = (name_map or {}).get(layer)
    if entry is None:
        return LayerMap(layer.replace("/", "."))
    if isinstance(entry, str):
        return LayerMap(entry)
    if isinstance(entry, LayerMap):
        return entry
    raise ValueError(
        f"compare: argument 'name_map': the entry for {layer!r} must be a module name or a "
        f"LayerMap, got {type(entry).__name__}"
    )


def find_module(root: torch.nn.Module, name: str) -> torch.nn.Module | None:
    try:
        return root.get_submodule(name) if name else root
    except AttributeError:
        return None


def _tensor(module: torch.nn.Module, name: str) -> torch.Tensor | None:
    obj = module
    parts = name.replace("/", ".").split(".")
    for part in parts:
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj if isinstance(obj, torch.Tensor) else None


def map_weights(
    module: torch.nn.Module, lmap: LayerMap, weights: list[WeightRecord]
) -> list[tuple[torch.Tensor | None, Transform | None]]:
    """For each recorded variable, the torch tensor holding it (None if not found) and the
    transform to Keras's layout.

    Order of lookup: ``lmap.weights``; a converted module's Keras variable list (same order as
    the recording's, so Bidirectional's ``forward_layer.kernel`` pairs with
    ``forward_lstm/lstm_cell/kernel``); an attribute of the module named like the variable's
    last path component (``kernel``, ``moving_mean``).
    """
    converted = None
    try:
        from ..keras.layers import keras_tensors

        if getattr(module, "keras_variables", ()) or getattr(module, "keras_sublayers", ()):
            pairs = keras_tensors(module)
            if len(pairs) == len(weights):
                converted = [t for _, t in pairs]
    except ImportError:  # pragma: no cover - the keras subpackage ships with this one
        pass
    out = []
    for i, w in enumerate(weights):
        entry = lmap.weights.get(w.name)
        if entry is not None:
            name, fn = (entry, None) if isinstance(entry, str) else entry
            out.append((_tensor(module, name), fn))
        elif converted is not None:
            out.append((converted[i], None))
        else:
            out.append((_tensor(module, w.name.split("/")[-1].split("#")[0]), None))
    return out
