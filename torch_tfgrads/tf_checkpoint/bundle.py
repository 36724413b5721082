"""A TensorFlow tensor bundle: the `.index` table's entries and the tensors in the data shards.

A bundle with prefix P is `P.index` (an SSTable, see `sstable.py`) and the shards
`P.data-00000-of-0000N` ... . The index maps the empty key to a `BundleHeaderProto` (number of
shards, byte order, format version) and every tensor's name to a `BundleEntryProto`: dtype,
shape, which shard, byte offset and size there, and the masked CRC-32C of those bytes. Numeric
tensors are stored as their raw little-endian bytes in C order (bool as one byte, bfloat16 as
its 16 bits). A string tensor is stored as the varint64 length of each element, a masked CRC-32C
of those lengths (taken over each length as a uint32, or a uint64 for an element over 4 GiB),
then the elements' bytes; its entry's CRC covers the lengths in that form, the length checksum
and the bytes.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field

import numpy as np
import torch

from . import crc32c as _crc
from .protos import BundleEntryProto, BundleHeaderProto
from .sstable import TableError, read_table

HEADER_KEY = b""
SUPPORTED_VERSION = 1  # TensorFlow's kTensorBundleVersion

# TF DataType enum value -> (name, torch dtype). Types whose bytes torch has no dtype for are
# read as the same-width integer and reinterpreted (bfloat16, the float8 formats).
_DTYPES: dict[int, tuple[str, torch.dtype | None]] = {
    1: ("float32", torch.float32),
    2: ("float64", torch.float64),
    3: ("int32", torch.int32),
    4: ("uint8", torch.uint8),
    5: ("int16", torch.int16),
    6: ("int8", torch.int8),
    7: ("string", None),
    8: ("complex64", torch.complex64),
    9: ("int64", torch.int64),
    10: ("bool", torch.bool),
    14: ("bfloat16", torch.bfloat16),
    17: ("uint16", torch.uint16),
    18: ("complex128", torch.complex128),
    19: ("float16", torch.float16),
    22: ("uint32", torch.uint32),
    23: ("uint64", torch.uint64),
}
for _num, _name in (
    (24, "float8_e5m2"),
    (25, "float8_e4m3fn"),
    (26, "float8_e4m3fnuz"),
    (28, "float8_e5m2fnuz"),
):
    if hasattr(torch, _name):
        _DTYPES[_num] = (_name, getattr(torch, _name))
# Quantized types are stored as their integer representation, and read back as that integer.
_DTYPES.update(
    {
        11: ("qint8", torch.int8),
        12: ("quint8", torch.uint8),
        13: ("qint32", torch.int32),
        15: ("qint16", torch.int16),
        16: ("quint16", torch.uint16),
    }
)
# Names of the other TF types, for messages only.
_OTHER_DTYPES = {
    0: "invalid",
    20: "resource",
    21: "variant",
    27: "float8_e4m3b11fnuz",
    29: "int4",
    30: "uint4",
    31: "int2",
    32: "uint2",
    33: "float4_e2m1fn",
}


class CheckpointError(ValueError):
    """A checkpoint file is missing, truncated, corrupted or not a tensor bundle. The message
    names the file and, where one is concerned, the tensor's key."""


def dtype_name(enum: int) -> str:
    """TensorFlow's name of a DataType enum value ("float32", "bfloat16", "string", ...)."""
    if enum in _DTYPES:
        return _DTYPES[enum][0]
    return _OTHER_DTYPES.get(enum, f"DataType({enum})")


@dataclass(frozen=True)
class Header:
    num_shards: int
    endianness: str  # "little" or "big"
    producer: int
    min_consumer: int
    bad_consumers: tuple[int, ...]


@dataclass(frozen=True)
class Entry:
    """Where and how one tensor is stored."""

    key: str
    dtype: str  # TensorFlow's dtype name
    dtype_enum: int
    shape: tuple[int, ...]
    shard_id: int
    offset: int
    size: int
    crc32c: int  # masked, as stored
    # For a tensor saved in slices (a partitioned variable, or TF's MaxShardSizePolicy
    # splitting a large one across shards): each slice's (start, length) per dimension,
    # length -1 meaning the whole dimension. Each slice is a separate entry under an encoded key.
    slices: tuple[tuple[tuple[int, int], ...], ...] = field(default=())

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


def data_path(prefix: str, shard: int, num_shards: int) -> str:
    return f"{prefix}.data-{shard:05d}-of-{num_shards:05d}"


def _decode_entry(key: str, value: bytes, index_path: str) -> Entry:
    proto = BundleEntryProto()
    try:
        proto.ParseFromString(value)
    except Exception as e:  # protobuf's DecodeError; no partial entry is kept
        raise CheckpointError(f"{index_path}: key {key!r}: corrupted entry ({e})") from None
    if proto.shape.unknown_rank or any(d.size < 0 for d in proto.shape.dim):
        raise CheckpointError(f"{index_path}: key {key!r}: entry has no fully known shape")
    slices = tuple(
        tuple((e.start, e.length if e.HasField("length") else -1) for e in s.extent)
        for s in proto.slices
    )
    return Entry(
        key,
        dtype_name(proto.dtype),
        proto.dtype,
        tuple(d.size for d in proto.shape.dim),
        proto.shard_id,
        proto.offset,
        proto.size,
        proto.crc32c,
        slices,
    )


class Bundle:
    """The index of a tensor bundle, read and checked on construction; tensors read on demand.

    `entries` maps each key (in the index's order) to its `Entry`; partitioned variables' slice
    entries (whose binary keys start with a NUL byte) are not among them.
    """

    def __init__(self, prefix: str | os.PathLike):
        self.prefix = os.fspath(prefix)
        self.index_path = self.prefix + ".index"
        try:
            with open(self.index_path, "rb") as f:
                data = f.read()
        except OSError as e:
            raise CheckpointError(
                f"{self.index_path}: cannot read the index ({e.strerror})"
            ) from None
        try:
            items = read_table(data, self.index_path)
        except TableError as e:
            raise CheckpointError(str(e)) from None
        if not items or items[0][0] != HEADER_KEY:
            raise CheckpointError(f"{self.index_path}: no bundle header (not a tensor bundle?)")
        self.header = self._decode_header(items[0][1])
        self.entries: dict[str, Entry] = {}
        self._slice_values: dict[bytes, bytes] = {}
        for raw_key, value in items[1:]:
            if raw_key.startswith(b"\x00"):  # one slice of a sliced tensor, under an encoded key
                self._slice_values[raw_key] = value
                continue
            key = raw_key.decode("utf-8", errors="surrogateescape")
            entry = _decode_entry(key, value, self.index_path)
            if not 0 <= entry.shard_id < self.header.num_shards:
                raise CheckpointError(
                    f"{self.index_path}: key {key!r}: shard {entry.shard_id} "
                    f"of {self.header.num_shards}"
                )
            self.entries[key] = entry

    def _decode_header(self, value: bytes) -> Header:
        proto = BundleHeaderProto()
        try:
            proto.ParseFromString(value)
        except Exception as e:
            raise CheckpointError(f"{self.index_path}: corrupted bundle header ({e})") from None
        v = proto.version
        if v.min_consumer > SUPPORTED_VERSION or SUPPORTED_VERSION in v.bad_consumers:
            raise CheckpointError(
                f"{self.index_path}: bundle format version {v.producer} "
                f"(min consumer {v.min_consumer}) is newer than this reader"
            )
        if proto.endianness not in (0, 1):
            raise CheckpointError(f"{self.index_path}: unknown byte order {proto.endianness}")
        if proto.num_shards < 1:
            raise CheckpointError(f"{self.index_path}: header says {proto.num_shards} shards")
        return Header(
            proto.num_shards,
            "big" if proto.endianness == 1 else "little",
            v.producer,
            v.min_consumer,
            tuple(v.bad_consumers),
        )

    def data_path(self, shard: int) -> str:
        return data_path(self.prefix, shard, self.header.num_shards)

    def read_bytes(self, entries: list[Entry]) -> dict[str, bytearray]:
        """The checked raw bytes of `entries`, read shard by shard in file order."""
        out: dict[str, bytes] = {}
        by_shard: dict[int, list[Entry]] = {}
        for e in entries:
            by_shard.setdefault(e.shard_id, []).append(e)
        for shard, group in sorted(by_shard.items()):
            path = self.data_path(shard)
            try:
                f = open(path, "rb")  # noqa: SIM115 (closed by the `with f` below)
            except OSError as err:
                raise CheckpointError(
                    f"{path}: cannot read the data shard needed for key "
                    f"{group[0].key!r} ({err.strerror})"
                ) from None
            with f:
                file_size = os.fstat(f.fileno()).st_size
                for e in sorted(group, key=lambda e: e.offset):
                    if e.offset < 0 or e.size < 0 or e.offset + e.size > file_size:
                        raise CheckpointError(
                            f"{path}: key {e.key!r}: bytes {e.offset}..{e.offset + e.size} lie "
                            f"past the end of the file ({file_size} bytes; truncated?)"
                        )
                    f.seek(e.offset)
                    buf = bytearray(e.size)  # decoded in place by torch.frombuffer, no copy
                    if f.readinto(buf) != e.size:
                        raise CheckpointError(f"{path}: key {e.key!r}: short read (truncated?)")
                    if e.dtype_enum != 7 and _crc.mask(_crc.crc32c(buf)) != e.crc32c:
                        raise CheckpointError(
                            f"{path}: key {e.key!r}: checksum mismatch (corrupted data)"
                        )
                    out[e.key] = buf
        return out

    def slice_entries(self, entry: Entry) -> list[tuple[tuple[tuple[int, int], ...], Entry]]:
        """The stored slices of a sliced tensor, each with its extents."""
        out = []
        for extents in entry.slices:
            raw_key = encode_slice_key(entry.key, extents)
            if raw_key not in self._slice_values:
                raise CheckpointError(
                    f"{self.index_path}: key {entry.key!r}: slice {extents} "
                    "is missing from the index"
                )
            sub = _decode_entry(
                f"{entry.key} (slice {list(extents)})", self._slice_values[raw_key], self.index_path
            )
            if not 0 <= sub.shard_id < self.header.num_shards:
                raise CheckpointError(f"{self.index_path}: key {sub.key!r}: shard {sub.shard_id}")
            want = tuple(d if n == -1 else n for (_, n), d in zip(extents, entry.shape))
            if sub.dtype_enum != entry.dtype_enum or sub.shape != want:
                raise CheckpointError(
                    f"{self.index_path}: key {sub.key!r}: {sub.dtype}"
                    f"{list(sub.shape)} does not fit the tensor"
                )
            out.append((extents, sub))
        return out

    def read_tensors(self, entries: list[Entry]) -> dict:
        """The tensors of `entries` by key, every byte read and checked before any is decoded."""
        plan: list[tuple[Entry, list]] = []
        to_read: list[Entry] = []
        for e in entries:
            parts = self.slice_entries(e) if e.slices else []
            plan.append((e, parts))
            to_read.extend(sub for _, sub in parts) if parts else to_read.append(e)
        raw = self.read_bytes(to_read)
        out = {}
        for e, parts in plan:
            if not parts:
                out[e.key] = self.decode(e, raw[e.key])
                continue
            if e.dtype_enum == 7:
                raise CheckpointError(
                    f"{self.index_path}: key {e.key!r}: sliced string tensors are not supported"
                )
            full = torch.zeros(e.shape, dtype=self.decode(parts[0][1], raw[parts[0][1].key]).dtype)
            covered = torch.zeros(e.shape, dtype=torch.bool)
            for extents, sub in parts:
                index = tuple(slice(None) if n == -1 else slice(s, s + n) for s, n in extents)
                full[index] = self.decode(sub, raw[sub.key])
                covered[index] = True
            if not bool(covered.all()):
                raise CheckpointError(
                    f"{self.index_path}: key {e.key!r}: its slices do not cover the tensor"
                )
            out[e.key] = full
        return out

    def decode(self, entry: Entry, buf: bytearray):
        """The tensor of `entry` from its raw bytes (checked by `read_bytes`): a torch tensor,
        or for a string tensor a numpy object array of `bytes`."""
        where = f"{self.data_path(entry.shard_id)}: key {entry.key!r}"
        if entry.dtype_enum == 7:
            return _decode_strings(entry, buf, where)
        if entry.dtype_enum not in _DTYPES:
            raise CheckpointError(f"{where}: dtype {entry.dtype} is not supported")
        dtype = _DTYPES[entry.dtype_enum][1]
        itemsize = torch.empty((), dtype=dtype).element_size()
        if entry.size != entry.numel * itemsize:
            raise CheckpointError(
                f"{where}: {entry.size} bytes for {entry.numel} elements of {entry.dtype}"
            )
        if entry.numel == 0:
            return torch.empty(entry.shape, dtype=dtype)
        t = torch.frombuffer(buf, dtype=torch.uint8)
        if self.header.endianness == "big" and itemsize > 1:
            lanes = 2 if dtype.is_complex else 1
            t = t.view(-1, itemsize // lanes).flip(-1).reshape(-1)
        return t.view(dtype).reshape(entry.shape)


def _decode_strings(entry: Entry, buf: bytearray, where: str) -> np.ndarray:
    n, pos, lengths = entry.numel, 0, []
    for _ in range(n):
        length, shift = 0, 0
        while True:
            if pos >= len(buf) or shift > 63:
                raise CheckpointError(f"{where}: corrupted string lengths")
            b = buf[pos]
            pos += 1
            length |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                break
        lengths.append(length)
    # Each length enters the checksum as a little-endian uint32 (uint64 beyond 4 GiB).
    crc = _crc.crc32c(b"".join(struct.pack("<I" if x <= 0xFFFFFFFF else "<Q", x) for x in lengths))
    if pos + 4 > len(buf):
        raise CheckpointError(f"{where}: truncated string tensor")
    stored_len_crc = buf[pos : pos + 4]
    crc = _crc.extend(crc, stored_len_crc)
    pos += 4
    if sum(lengths) != len(buf) - pos:
        raise CheckpointError(f"{where}: string lengths do not match the entry's size")
    crc = _crc.extend(crc, buf[pos:])
    if _crc.mask(crc) != entry.crc32c:
        raise CheckpointError(f"{where}: checksum mismatch (corrupted data)")
    out = np.empty(n, dtype=object)
    for i, length in enumerate(lengths):
        out[i] = bytes(buf[pos : pos + length])
        pos += length
    return out.reshape(entry.shape)


def _ordered_string(s: bytes) -> bytes:
    """OrderedCode's order-preserving string encoding: 0x00 -> 00 FF, 0xFF -> FF 00, then 00 01."""
    out = bytearray()
    for b in s:
        out += b"\x00\xff" if b == 0 else b"\xff\x00" if b == 0xFF else bytes([b])
    return bytes(out) + b"\x00\x01"


def _ordered_uint(n: int) -> bytes:
    """OrderedCode's increasing encoding of an unsigned number: byte count, then big-endian."""
    body = n.to_bytes((n.bit_length() + 7) // 8, "big") if n else b""
    return bytes([len(body)]) + body


def _ordered_int(v: int) -> bytes:
    """OrderedCode's increasing encoding of a signed 64-bit number: L bytes, two's complement
    big-endian, whose top L bits are flipped (set for v >= 0) to say the length."""
    x = ~v if v < 0 else v
    n = (x.bit_length() + 1 + 6) // 7  # L bytes hold 7L - 1 magnitude bits
    header = ((1 << n) - 1) << (7 * n)
    return ((v % (1 << (8 * n))) ^ header).to_bytes(n, "big")


def encode_slice_key(name: str, extents: tuple[tuple[int, int], ...]) -> bytes:
    """The index key under which one slice of tensor `name` is stored (TensorFlow's
    EncodeTensorNameSlice): 0, the name, the rank, then each dimension's start and length."""
    out = _ordered_uint(0) + _ordered_string(name.encode("utf-8", errors="surrogateescape"))
    out += _ordered_uint(len(extents))
    for start, length in extents:
        out += _ordered_int(start) + _ordered_int(length)
    return out
