"""The few protobuf messages of a TF checkpoint, built at import time from descriptors.

No generated `_pb2` modules and no TensorFlow: the messages are declared below as a
`FileDescriptorProto` in a private `DescriptorPool` (so they never clash with TensorFlow's own
classes when both are loaded) and turned into classes with `message_factory`. Field numbers and
wire types are TensorFlow's (tensor_bundle.proto, tensor_shape.proto, tensor_slice.proto,
versions.proto, trackable_object_graph.proto); enums (`DataType`, `Endianness`) are declared as
`int32`, which has the same varint encoding, so unknown future enum values still decode. The
test suite checks every field against TensorFlow's generated descriptors.
"""

from __future__ import annotations

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_F = descriptor_pb2.FieldDescriptorProto
_OPT, _REP = _F.LABEL_OPTIONAL, _F.LABEL_REPEATED
_PACKAGE = "torch_tfgrads.tf_checkpoint"

# message name -> [(field name, number, type, label, message type or None)]
_MESSAGES: dict[str, list[tuple[str, int, int, int, str | None]]] = {
    "VersionDef": [
        ("producer", 1, _F.TYPE_INT32, _OPT, None),
        ("min_consumer", 2, _F.TYPE_INT32, _OPT, None),
        ("bad_consumers", 3, _F.TYPE_INT32, _REP, None),
    ],
    "BundleHeaderProto": [
        ("num_shards", 1, _F.TYPE_INT32, _OPT, None),
        ("endianness", 2, _F.TYPE_INT32, _OPT, None),  # enum: 0 LITTLE, 1 BIG
        ("version", 3, _F.TYPE_MESSAGE, _OPT, "VersionDef"),
    ],
    "TensorShapeProto.Dim": [
        ("size", 1, _F.TYPE_INT64, _OPT, None),
        ("name", 2, _F.TYPE_STRING, _OPT, None),
    ],
    "TensorShapeProto": [
        ("dim", 2, _F.TYPE_MESSAGE, _REP, "TensorShapeProto.Dim"),
        ("unknown_rank", 3, _F.TYPE_BOOL, _OPT, None),
    ],
    "TensorSliceProto.Extent": [
        ("start", 1, _F.TYPE_INT64, _OPT, None),
        ("length", 2, _F.TYPE_INT64, _OPT, None),  # in oneof has_length: absent means "all"
    ],
    "TensorSliceProto": [
        ("extent", 1, _F.TYPE_MESSAGE, _REP, "TensorSliceProto.Extent"),
    ],
    "BundleEntryProto": [
        ("dtype", 1, _F.TYPE_INT32, _OPT, None),  # enum DataType
        ("shape", 2, _F.TYPE_MESSAGE, _OPT, "TensorShapeProto"),
        ("shard_id", 3, _F.TYPE_INT32, _OPT, None),
        ("offset", 4, _F.TYPE_INT64, _OPT, None),
        ("size", 5, _F.TYPE_INT64, _OPT, None),
        ("crc32c", 6, _F.TYPE_FIXED32, _OPT, None),
        ("slices", 7, _F.TYPE_MESSAGE, _REP, "TensorSliceProto"),
    ],
    "BoolValue": [("value", 1, _F.TYPE_BOOL, _OPT, None)],  # google.protobuf.BoolValue
    "RegisteredSaver": [
        ("name", 1, _F.TYPE_STRING, _OPT, None),
        ("object_name", 2, _F.TYPE_STRING, _OPT, None),
    ],
    "TrackableObjectGraph.TrackableObject.ObjectReference": [
        ("node_id", 1, _F.TYPE_INT32, _OPT, None),
        ("local_name", 2, _F.TYPE_STRING, _OPT, None),
    ],
    "TrackableObjectGraph.TrackableObject.SerializedTensor": [
        ("name", 1, _F.TYPE_STRING, _OPT, None),
        ("full_name", 2, _F.TYPE_STRING, _OPT, None),
        ("checkpoint_key", 3, _F.TYPE_STRING, _OPT, None),
    ],
    "TrackableObjectGraph.TrackableObject.SlotVariableReference": [
        ("original_variable_node_id", 1, _F.TYPE_INT32, _OPT, None),
        ("slot_name", 2, _F.TYPE_STRING, _OPT, None),
        ("slot_variable_node_id", 3, _F.TYPE_INT32, _OPT, None),
    ],
    "TrackableObjectGraph.TrackableObject": [
        (
            "children",
            1,
            _F.TYPE_MESSAGE,
            _REP,
            "TrackableObjectGraph.TrackableObject.ObjectReference",
        ),
        (
            "attributes",
            2,
            _F.TYPE_MESSAGE,
            _REP,
            "TrackableObjectGraph.TrackableObject.SerializedTensor",
        ),
        (
            "slot_variables",
            3,
            _F.TYPE_MESSAGE,
            _REP,
            "TrackableObjectGraph.TrackableObject.SlotVariableReference",
        ),
        ("registered_saver", 4, _F.TYPE_MESSAGE, _OPT, "RegisteredSaver"),
        ("has_checkpoint_values", 5, _F.TYPE_MESSAGE, _OPT, "BoolValue"),
    ],
    "TrackableObjectGraph": [
        ("nodes", 1, _F.TYPE_MESSAGE, _REP, "TrackableObjectGraph.TrackableObject"),
    ],
}


def _build_file() -> descriptor_pb2.FileDescriptorProto:
    fd = descriptor_pb2.FileDescriptorProto(
        name="torch_tfgrads/tf_checkpoint.proto", package=_PACKAGE, syntax="proto3"
    )
    made: dict[str, descriptor_pb2.DescriptorProto] = {}
    for full in sorted(_MESSAGES, key=lambda n: n.count(".")):  # parents before nested types
        parent, _, name = full.rpartition(".")
        msg = (made[parent].nested_type if parent else fd.message_type).add(name=name)
        made[full] = msg
        for fname, number, ftype, label, type_name in _MESSAGES[full]:
            field = msg.field.add(name=fname, number=number, type=ftype, label=label)
            if type_name is not None:
                field.type_name = f".{_PACKAGE}.{type_name}"
        if full == "TensorSliceProto.Extent":  # length's presence matters (absent = full extent)
            msg.oneof_decl.add(name="has_length")
            msg.field[1].oneof_index = 0
    return fd


_POOL = descriptor_pool.DescriptorPool()
_POOL.Add(_build_file())


def _cls(name: str):
    desc = _POOL.FindMessageTypeByName(f"{_PACKAGE}.{name}")
    if hasattr(message_factory, "GetMessageClass"):  # protobuf >= 4.22
        return message_factory.GetMessageClass(desc)
    return message_factory.MessageFactory(_POOL).GetPrototype(desc)  # older protobuf


BundleHeaderProto = _cls("BundleHeaderProto")
BundleEntryProto = _cls("BundleEntryProto")
TensorShapeProto = _cls("TensorShapeProto")
TrackableObjectGraph = _cls("TrackableObjectGraph")

__all__ = ["BundleHeaderProto", "BundleEntryProto", "TensorShapeProto", "TrackableObjectGraph"]
