"""The object graph of an object-based checkpoint (`tf.train.Checkpoint`, Keras, SavedModel).

Such a checkpoint stores, under the key `_CHECKPOINTABLE_OBJECT_GRAPH`, a serialized
`TrackableObjectGraph`: node 0 is the root object; each node lists its children by local name
(attribute names, list indices), the tensors it saved (`attributes`: the attribute name such as
`VARIABLE_VALUE`, the variable's own name such as `sequential/dense/kernel`, and the checkpoint
key under which the tensor is stored) and the optimizer slot variables that belong to it. A
checkpoint key is the first path to the object that a breadth-first walk from the root finds,
followed by `/.ATTRIBUTES/<attribute name>`.
"""

from __future__ import annotations

from dataclasses import dataclass

from .protos import TrackableObjectGraph

OBJECT_GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"


@dataclass(frozen=True)
class Attribute:
    name: str  # e.g. "VARIABLE_VALUE"
    full_name: str  # the variable's own name, e.g. "sequential/dense/kernel" (Keras layer names)
    checkpoint_key: str


@dataclass(frozen=True)
class SlotVariable:
    original_variable_node_id: int
    slot_name: str  # e.g. "m", "v", "momentum"
    slot_variable_node_id: int


@dataclass(frozen=True)
class Node:
    id: int
    children: tuple[tuple[str, int], ...]  # (local name, node id)
    attributes: tuple[Attribute, ...]
    slot_variables: tuple[SlotVariable, ...]
    registered_saver: str | None  # the name of a registered saver, if the object uses one


def parse_object_graph(serialized: bytes) -> list[Node]:
    """The nodes of a serialized `TrackableObjectGraph`, indexed by node id."""
    proto = TrackableObjectGraph()
    proto.ParseFromString(serialized)
    nodes = []
    for i, n in enumerate(proto.nodes):
        nodes.append(
            Node(
                id=i,
                children=tuple((c.local_name, c.node_id) for c in n.children),
                attributes=tuple(
                    Attribute(a.name, a.full_name, a.checkpoint_key) for a in n.attributes
                ),
                slot_variables=tuple(
                    SlotVariable(s.original_variable_node_id, s.slot_name, s.slot_variable_node_id)
                    for s in n.slot_variables
                ),
                registered_saver=n.registered_saver.name
                if n.HasField("registered_saver")
                else None,
            )
        )
    return nodes


def object_paths(nodes: list[Node]) -> dict[int, list[str]]:
    """Every path (local names joined by "/") from the root to each node that visits no node
    twice, breadth-first: the first path of a node is the one its checkpoint keys are made of."""
    paths: dict[int, list[str]] = {0: [""]} if nodes else {}
    frontier: list[tuple[int, str, frozenset[int]]] = [(0, "", frozenset({0}))] if nodes else []
    while frontier:
        nxt = []
        for node_id, path, seen in frontier:
            for name, child in nodes[node_id].children:
                if child in seen or not 0 <= child < len(nodes):
                    continue
                child_path = f"{path}/{name}" if path else name
                paths.setdefault(child, []).append(child_path)
                nxt.append((child, child_path, seen | {child}))
        frontier = nxt
    return paths


def key_to_attribute(nodes: list[Node]) -> dict[str, tuple[int, Attribute]]:
    """Each checkpoint key saved by an object, with that object's node id and the attribute."""
    return {a.checkpoint_key: (n.id, a) for n in nodes for a in n.attributes}
