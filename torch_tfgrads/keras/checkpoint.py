"""Which tensors of a TF checkpoint belong to which Keras layer of a converted model.

A TF checkpoint of a Keras model (``tf.train.Checkpoint(model=model).write(prefix)`` with Keras
3, or tf-keras's ``model.save_weights(prefix, save_format="tf")``) is a tensor bundle whose object
graph mirrors the model's Python objects. Its checkpoint keys are not a reliable map: a key is the
first path to the variable a breadth-first walk finds, so with an optimizer in the checkpoint a
kernel may be stored as ``optimizer/_trainable_variables/0/...``. The layers are therefore found
by walking the object graph from the model's node, as TensorFlow restores them:

* Keras 3: a Functional model's node has the child ``_operations`` (a Sequential's, the child
  ``_functional`` that has it), whose child ``i`` is the model's ``i``-th operation, which is
  the ``i``-th layer of the model's config (``Functional.get_config`` lists ``operations`` in
  that order). A nested model is one of these and is walked the same way.
* tf-keras: the model's node has the children ``layer_with_weights-k``, the ``k``-th layer that
  has weights, in the order of ``model.layers`` (which is the config's order).

Inside a layer's node, every variable below it is one of the layer's weights, named by the last
part of the variable's own name (``dense/kernel`` -> ``kernel``; Keras 3 stores a Dense kernel
under the attribute ``_kernel`` and the Normalization mean under ``adapt_mean``, so attribute
names are not used); a Bidirectional's variables sit below its ``forward_layer`` and
``backward_layer`` children. The variables are then matched by name to the weights the converted
layer holds (``keras_tensors``, in Keras's order), and the arrays go through the same check and
copy as a `.keras` file's (:func:`torch_tfgrads.keras.load_weights`).
"""

from __future__ import annotations

import os

import torch

from .archive import KerasLoadError
from .layers import MODEL_CLASSES, keras_tensors
from .weights import layer_configs

# Variables a Keras layer may own in a checkpoint that are not Keras weights (not in a `.keras`).
_NOT_WEIGHTS = ("seed_generator_state",)


def is_checkpoint(path) -> bool:
    """Whether ``path`` names a TF tensor bundle: a prefix with a ``.index`` file, the
    ``.index`` file itself, or a SavedModel directory."""
    path = os.fspath(path)
    if path.endswith(".index") and os.path.isfile(path):
        return True
    if os.path.isfile(path + ".index"):
        return True
    return os.path.isdir(path) and os.path.isfile(
        os.path.join(path, "variables", "variables.index")
    )


def _is_model_node(node) -> bool:
    names = {n for n, _ in node.children}
    return bool(names & {"_operations", "_functional", "layer_with_weights-0", "layer-0"})


def _find_model(nodes, root, prefix):
    if root is not None:
        node_id = 0
        for part in [p for p in str(root).split("/") if p]:
            children = dict(nodes[node_id].children)
            if part not in children:
                raise KerasLoadError(
                    f"{prefix}: no object {root!r} in the checkpoint (at {part!r}, the "
                    f"children are {sorted(children)})"
                )
            node_id = children[part]
        if not _is_model_node(nodes[node_id]):
            raise KerasLoadError(f"{prefix}: the object {root!r} is not a Keras model")
        return node_id
    if _is_model_node(nodes[0]):  # tf-keras save_weights: the model is the root
        return 0
    found = [(name, c) for name, c in nodes[0].children if _is_model_node(nodes[c])]
    if len(found) != 1:
        raise KerasLoadError(
            f"{prefix}: {'no' if not found else 'more than one'} Keras model at the top of the "
            f"checkpoint (its objects: {[n for n, _ in nodes[0].children]}); name the model's "
            "object with root=, e.g. root='model' for tf.train.Checkpoint(model=...)"
        )
    return found[0][1]


def _has_weights(module) -> bool:
    if isinstance(module, torch.nn.Module) and hasattr(module, "keras_config"):
        return any(_has_weights(m) for m in module.children())
    return bool(keras_tensors(module))


def _layer_nodes(nodes, node_id, model, path, prefix, out):
    """{layer path: node id} for every layer of the converted ``model`` (a KerasModel)."""
    children = dict(nodes[node_id].children)
    if "_functional" in children and "_operations" not in children:
        children = dict(nodes[children["_functional"]].children)
    layers = layer_configs(model.keras_config)
    where = "/".join(path) or "the model"
    if "_operations" in children:  # Keras 3
        ops = dict(nodes[children["_operations"]].children)
        if len(ops) != len(layers):
            raise KerasLoadError(
                f"{prefix}: {where} has {len(ops)} layers in the checkpoint, {len(layers)} in "
                "the converted model; the checkpoint is of another architecture"
            )
        pairs = [(name, lc, ops.get(str(i))) for i, (name, lc) in enumerate(layers)]
    elif any(n.startswith("layer_with_weights-") or n.startswith("layer-") for n in children):
        # tf-keras: the k-th layer that has weights
        with_weights = [(name, lc) for name, lc in layers if _has_weights(getattr(model, name))]
        saved = sorted(
            int(n.rsplit("-", 1)[1]) for n in children if n.startswith("layer_with_weights-")
        )
        if saved != list(range(len(with_weights))):
            raise KerasLoadError(
                f"{prefix}: {where} has {len(saved)} layers with weights in the checkpoint, "
                f"{len(with_weights)} in the converted model "
                f"({', '.join(n for n, _ in with_weights) or 'none'})"
            )
        index = {name: k for k, (name, _) in enumerate(with_weights)}
        pairs = [
            (
                name,
                lc,
                children[f"layer_with_weights-{index[name]}"] if name in index else None,
            )
            for name, lc in layers
        ]
    else:
        raise KerasLoadError(
            f"{prefix}: the checkpoint's object for {where} is not a Keras model (children "
            f"{sorted(children)})"
        )
    for name, lc, child in pairs:
        if lc["class_name"] in MODEL_CLASSES:
            if child is None:
                raise KerasLoadError(f"{prefix}: nested model {name!r} is not in the checkpoint")
            _layer_nodes(nodes, child, getattr(model, name), path + (name,), prefix, out)
        else:
            out[path + (name,)] = child
    return out


def _variables(nodes, node_id, stop):
    """[(path below the layer's node, Attribute)] of every variable under ``node_id``."""
    out, seen, frontier = [], {node_id}, [(node_id, "")]
    while frontier:
        nxt = []
        for nid, path in frontier:
            out += [(path, a) for a in nodes[nid].attributes if a.name == "VARIABLE_VALUE"]
            for name, child in nodes[nid].children:
                if child in seen or child in stop or not 0 <= child < len(nodes):
                    continue
                seen.add(child)
                nxt.append((child, f"{path}/{name}" if path else name))
        frontier = nxt
    return out


def _weight_name(path, attribute, subs):
    name = attribute.full_name.rsplit("/", 1)[-1].split(":")[0] if attribute.full_name else ""
    name = name or path.rsplit("/", 1)[-1].lstrip("_")
    if subs:
        first = path.split("/", 1)[0]
        return f"{first}.{name}" if first in subs else f"?{path}"
    return name


def _named_layers(model, path=()):
    for name, child in model.named_children():
        if hasattr(child, "keras_config"):
            yield from _named_layers(child, path + (name,))
        else:
            yield path + (name,), child


def checkpoint_arrays(model, prefix, root=None):
    """``{layer path: [arrays in Keras's variable order]}`` for every layer of ``model`` (a
    KerasModel) from the TF checkpoint ``prefix``; every variable is matched, its shape and dtype
    checked and its tensor read (CRC checked) before this returns."""
    from .. import tf_checkpoint

    prefix = os.fspath(prefix)
    try:
        nodes = tf_checkpoint.read_object_graph(prefix)
    except tf_checkpoint.CheckpointError as e:
        if "name-based" not in str(e):
            raise
        raise KerasLoadError(
            f"{prefix}: a name-based checkpoint (tf.compat.v1.train.Saver) has no object graph "
            "to find the Keras layers in; copy its tensors with "
            "torch_tfgrads.tf_checkpoint.load_weights(module, prefix, name_map)"
        ) from None
    model_id = _find_model(nodes, root, prefix)
    where = _layer_nodes(nodes, model_id, model, (), prefix, {})
    stop = {n for n in where.values() if n is not None}
    entries = tf_checkpoint.entries(prefix)
    plan = {}
    for lpath, module in _named_layers(model):
        layer = "/".join(lpath)
        wanted = [(n, t) for n, t in keras_tensors(module)]
        node = where.get(lpath)
        found = {}
        if node is not None:
            subs = getattr(module, "keras_sublayers", ())
            for path, attr in _variables(nodes, node, stop - {node}):
                name = _weight_name(path, attr, subs)
                if name.rsplit(".", 1)[-1] in _NOT_WEIGHTS:
                    continue
                if name in found:
                    raise KerasLoadError(
                        f"{prefix}: layer {layer!r}: two variables named {name!r} "
                        f"({found[name][1].checkpoint_key!r}, {attr.checkpoint_key!r})"
                    )
                found[name] = (path, attr)
        names = [n for n, _ in wanted]
        extra = [n for n in found if n not in names]
        if extra:
            desc = ", ".join(f"{found[n][1].full_name or found[n][0]!r}" for n in extra)
            raise KerasLoadError(
                f"{prefix}: layer {layer!r} ({getattr(module, 'keras_class', '?')}): the "
                f"checkpoint has variables the converted layer lacks: {desc} (it holds "
                f"{', '.join(names) or 'none'})"
            )
        missing = [n for n in names if n not in found]
        if missing:
            raise KerasLoadError(
                f"{prefix}: layer {layer!r} ({getattr(module, 'keras_class', '?')}): no "
                f"variable {', '.join(repr(n) for n in missing)} in the checkpoint (it has "
                f"{', '.join(found) or 'none'} for this layer)"
            )
        for n, t in wanted:
            key = found[n][1].checkpoint_key
            e = entries.get(key)
            if e is None:
                raise KerasLoadError(f"{prefix}: layer {layer!r}: weight {n!r}: no tensor {key!r}")
            if tuple(e.shape) != tuple(t.shape):
                raise KerasLoadError(
                    f"{prefix}: layer {layer!r}: weight {n!r} has shape {list(t.shape)} in the "
                    f"model, {list(e.shape)} in the checkpoint ({key!r})"
                )
        plan[lpath] = [(n, t, found[n][1].checkpoint_key) for n, t in wanted]
    keys = sorted({key for items in plan.values() for _, _, key in items})
    tensors = tf_checkpoint.read(prefix, keys)
    arrays = {}
    for lpath, items in plan.items():
        arrays[lpath] = []
        for n, t, key in items:
            value = tensors[key]
            if not isinstance(value, torch.Tensor) or value.dtype != t.dtype:
                got = value.dtype if isinstance(value, torch.Tensor) else "string"
                raise KerasLoadError(
                    f"{prefix}: layer {'/'.join(lpath)!r}: weight {n!r} is {t.dtype} in the "
                    f"model, {got} in the checkpoint ({key!r})"
                )
            # numpy has no bfloat16/float8: such values travel as float32, exactly
            try:
                arrays[lpath].append(value.numpy())
            except TypeError:
                arrays[lpath].append(value.float().numpy())
    return arrays
