"""Read TensorFlow checkpoints (tensor bundles) without TensorFlow.

A tensor bundle is what `tf.train.Checkpoint.write/save`, `tf.compat.v1.train.Saver` (V2 format)
and a SavedModel's `variables/variables` write: `PREFIX.index` plus `PREFIX.data-*-of-*`.

    from torch_tfgrads import tf_checkpoint
    tensors = tf_checkpoint.read("ckpt/model-1")        # {key: torch.Tensor}
    tf_checkpoint.list_variables("ckpt/model-1")        # [(key, shape)], as tf.train.list_variables
    tf_checkpoint.variable_names("ckpt/model-1")        # {key: "sequential/dense/kernel", ...}
    tf_checkpoint.load_cudnn_rnn(cudnn_lstm, "v1/model")  # a TF 1 CudnnLSTM's opaque buffer

Every tensor's CRC-32C is checked; a missing, truncated or corrupted file raises
`CheckpointError` naming the file and the key, and nothing is returned. Needs `protobuf`
(`pip install torch_tfgrads[checkpoint]`), never TensorFlow. See docs/tf_checkpoint.md.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

import torch

from .bundle import Bundle, CheckpointError, Entry, Header
from .cudnn_rnn import load_cudnn_rnn
from .object_graph import (
    OBJECT_GRAPH_KEY,
    Attribute,
    Node,
    SlotVariable,
    key_to_attribute,
    object_paths,
    parse_object_graph,
)

__all__ = [
    "read",
    "list_variables",
    "entries",
    "header",
    "read_object_graph",
    "variable_names",
    "variable_paths",
    "load_weights",
    "load_cudnn_rnn",
    "CheckpointError",
    "Entry",
    "Header",
    "Node",
    "Attribute",
    "SlotVariable",
    "OBJECT_GRAPH_KEY",
]

Prefix = str | os.PathLike


def _prefix(path: Prefix) -> str:
    """Accept a prefix, its `.index` file, or a SavedModel directory."""
    path = os.fspath(path)
    if path.endswith(".index"):
        return path[: -len(".index")]
    if os.path.isdir(path) and os.path.exists(os.path.join(path, "variables", "variables.index")):
        return os.path.join(path, "variables", "variables")
    return path


def entries(prefix: Prefix) -> dict[str, Entry]:
    """Every tensor's `Entry` (dtype, shape, shard, offset, size, stored CRC), by key."""
    return dict(Bundle(_prefix(prefix)).entries)


def header(prefix: Prefix) -> Header:
    """The bundle's header: number of shards, byte order, format version."""
    return Bundle(_prefix(prefix)).header


def list_variables(prefix: Prefix) -> list[tuple[str, list[int]]]:
    """(key, shape) of every tensor, sorted by key: what `tf.train.list_variables` returns."""
    return sorted((k, list(e.shape)) for k, e in Bundle(_prefix(prefix)).entries.items())


def read(prefix: Prefix, keys: Iterable[str] | None = None) -> dict:
    """Every tensor of the checkpoint (or only `keys`), by key, in key order.

    Numeric tensors come back as torch tensors of the same dtype (bfloat16, float16, the float8
    formats, complex and unsigned types included) and shape; string tensors as numpy arrays of
    `bytes` objects. Raises `CheckpointError` (and returns nothing) if any requested tensor is
    missing, truncated or fails its checksum, and `KeyError` for a key not in the checkpoint.
    """
    bundle = Bundle(_prefix(prefix))
    if keys is None:
        wanted = list(bundle.entries.values())
    else:
        keys = list(keys)
        missing = [k for k in keys if k not in bundle.entries]
        if missing:
            raise KeyError(f"{bundle.index_path}: no tensors named {missing}")
        wanted = [bundle.entries[k] for k in keys]
    return bundle.read_tensors(wanted)


def read_object_graph(prefix: Prefix) -> list[Node]:
    """The nodes of an object-based checkpoint's object graph (node 0 is the root), each with
    its children's local names, its saved attributes and slot variables. Raises
    `CheckpointError` for a name-based checkpoint, which has no object graph."""
    bundle = Bundle(_prefix(prefix))
    if OBJECT_GRAPH_KEY not in bundle.entries:
        raise CheckpointError(
            f"{bundle.index_path}: no {OBJECT_GRAPH_KEY} entry (a name-based "
            "checkpoint, e.g. from tf.compat.v1.train.Saver)"
        )
    entry = bundle.entries[OBJECT_GRAPH_KEY]
    value = bundle.read_tensors([entry])[OBJECT_GRAPH_KEY]
    try:
        return parse_object_graph(value.reshape(-1)[0])
    except Exception as e:
        raise CheckpointError(
            f"{bundle.data_path(entry.shard_id)}: key {OBJECT_GRAPH_KEY!r}: "
            f"not a TrackableObjectGraph ({e})"
        ) from None


def variable_names(prefix: Prefix) -> dict[str, str]:
    """Checkpoint key -> the variable's own name (`full_name`; for Keras, the layer's path and
    the weight's name, e.g. "sequential/dense/kernel"), for every tensor the object graph names."""
    return {k: a.full_name for k, (_, a) in key_to_attribute(read_object_graph(prefix)).items()}


def variable_paths(prefix: Prefix) -> dict[str, list[str]]:
    """Checkpoint key -> every path of local names from the root to the object that saved it
    (breadth-first; the first is the one the key is built from), e.g. for a Keras model
    ["model/_functional/_operations/1", "model/_tracked/0", ...]."""
    nodes = read_object_graph(prefix)
    paths = object_paths(nodes)
    return {k: paths.get(node_id, []) for k, (node_id, _) in key_to_attribute(nodes).items()}


def load_weights(
    module: torch.nn.Module,
    prefix: Prefix,
    name_map: Mapping[str, str] | None = None,
    strict: bool = True,
) -> list[str]:
    """Copy checkpoint tensors into `module`'s parameters and buffers; returns the names filled.

    `name_map` maps a state-dict name (e.g. "0.weight") to a checkpoint key or to a variable's
    `full_name` (e.g. "sequential/dense/kernel"); without it, a state-dict name matches the key
    or full name it equals with "." read as "/". Tensors are copied as stored (no transposes:
    converting layouts is the caller's mapping's job); shapes and dtypes must match exactly.
    With `strict`, every mapped name must exist and, without `name_map`, every state-dict entry
    must be matched. All tensors are read and checked before any is copied.
    """
    state = module.state_dict(keep_vars=True)
    bundle_keys = {k for k, _ in list_variables(prefix)}
    try:
        full_names = {v: k for k, v in variable_names(prefix).items()}
    except CheckpointError:
        full_names = {}

    def resolve(ref: str) -> str | None:
        if ref in bundle_keys:
            return ref
        if ref in full_names:
            return full_names[ref]
        if ref + "/.ATTRIBUTES/VARIABLE_VALUE" in bundle_keys:
            return ref + "/.ATTRIBUTES/VARIABLE_VALUE"
        return None

    plan: dict[str, str] = {}
    if name_map is not None:
        for name, ref in name_map.items():
            if name not in state:
                raise KeyError(f"load_weights: {name!r} is not in the module's state dict")
            key = resolve(ref)
            if key is None:
                if strict:
                    raise KeyError(f"load_weights: {ref!r} (for {name!r}) is not in {prefix}")
                continue
            plan[name] = key
    else:
        for name in state:
            key = resolve(name.replace(".", "/"))
            if key is not None:
                plan[name] = key
            elif strict:
                raise KeyError(f"load_weights: no tensor in {prefix} for {name!r}; pass name_map")
    tensors = read(prefix, sorted(set(plan.values())))
    for name, key in plan.items():
        src, dst = tensors[key], state[name]
        if not isinstance(src, torch.Tensor):
            raise TypeError(f"load_weights: {key!r} is a string tensor, not a weight")
        if tuple(src.shape) != tuple(dst.shape) or src.dtype != dst.dtype:
            raise ValueError(
                f"load_weights: {key!r} is {src.dtype}{list(src.shape)}, "
                f"{name!r} is {dst.dtype}{list(dst.shape)}"
            )
    with torch.no_grad():
        for name, key in plan.items():
            state[name].copy_(tensors[key])
    return list(plan)
