"""Reading the `.index` file of a tensor bundle: an immutable sorted table (SSTable) in LevelDB's
table format, as TensorFlow's `table::TableBuilder` writes it.

Layout (all integers little-endian, varints are LEB128):

* data blocks, each a run of entries ``varint shared | varint non_shared | varint value_len |
  key bytes[non_shared] | value bytes``: a key is the first `shared` bytes of the previous key
  followed by its own bytes (prefix compression); every `restart interval` entries the full key
  is stored (shared == 0), and the block ends with the offsets of those restart entries
  (uint32 each) and their count (uint32);
* after each block a 5-byte trailer: the compression type (0 none, 1 snappy) and the masked
  CRC-32C of the block's bytes plus that type byte;
* a metaindex block (empty in TensorFlow's files) and an index block whose entries map a key
  >= every key of a data block (and < every key of the next) to that block's handle
  ``varint offset | varint size``;
* a 48-byte footer: the metaindex and index handles, zero padding to 40 bytes, and the magic
  number 0xdb4775248b80fb57 (as two uint32, low half first).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

from . import crc32c as _crc

MAGIC = 0xDB4775248B80FB57
FOOTER_SIZE = 48
_TRAILER = 5
_NO_COMPRESSION, _SNAPPY = 0, 1


class TableError(ValueError):
    """The table is truncated, corrupted, or not an SSTable."""


def _varint(buf: bytes, pos: int, end: int, what: str) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise TableError(f"bad varint in {what}")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def _handle(buf: bytes, pos: int, end: int, what: str) -> tuple[tuple[int, int], int]:
    offset, pos = _varint(buf, pos, end, what)
    size, pos = _varint(buf, pos, end, what)
    return (offset, size), pos


def snappy_decompress(data: bytes) -> bytes:
    """Decode a raw snappy stream (the block format, not the framed one). TensorFlow writes its
    tables uncompressed; this exists so that a table written with snappy still reads."""
    n, pos = _varint(data, 0, len(data), "snappy length")
    out = bytearray()
    end = len(data)
    while pos < end:
        tag = data[pos]
        pos += 1
        kind = tag & 3
        if kind == 0:  # literal
            length = tag >> 2
            if length >= 60:
                nbytes = length - 59
                if pos + nbytes > end:
                    raise TableError("truncated snappy literal")
                length = int.from_bytes(data[pos : pos + nbytes], "little")
                pos += nbytes
            length += 1
            if pos + length > end:
                raise TableError("truncated snappy literal")
            out += data[pos : pos + length]
            pos += length
            continue
        if kind == 1:  # copy with 1-byte offset
            if pos >= end:
                raise TableError("truncated snappy copy")
            length = 4 + ((tag >> 2) & 7)
            offset = ((tag >> 5) << 8) | data[pos]
            pos += 1
        else:  # copy with 2- or 4-byte offset
            nbytes = 2 if kind == 2 else 4
            if pos + nbytes > end:
                raise TableError("truncated snappy copy")
            length = (tag >> 2) + 1
            offset = int.from_bytes(data[pos : pos + nbytes], "little")
            pos += nbytes
        if offset == 0 or offset > len(out):
            raise TableError("bad snappy copy offset")
        start = len(out) - offset
        for i in range(length):  # byte by byte: a copy may overlap its own output
            out.append(out[start + i])
    if len(out) != n:
        raise TableError(f"snappy stream decodes to {len(out)} bytes, header says {n}")
    return bytes(out)


def _read_block(data: bytes, handle: tuple[int, int], what: str) -> bytes:
    offset, size = handle
    if offset + size + _TRAILER > len(data) - FOOTER_SIZE:
        raise TableError(
            f"{what} at {offset} (+{size} bytes) runs past the end of the table (truncated file?)"
        )
    block = data[offset : offset + size]
    ctype = data[offset + size]
    (stored,) = struct.unpack_from("<I", data, offset + size + 1)
    if _crc.mask(_crc.extend(_crc.crc32c(block), bytes([ctype]))) != stored:
        raise TableError(f"checksum mismatch in {what} at offset {offset} (corrupted file)")
    if ctype == _NO_COMPRESSION:
        return block
    if ctype == _SNAPPY:
        return snappy_decompress(block)
    raise TableError(f"{what} at offset {offset} has unknown compression type {ctype}")


def _block_entries(block: bytes, what: str) -> Iterator[tuple[bytes, bytes]]:
    if len(block) < 4:
        raise TableError(f"{what} is too short")
    (num_restarts,) = struct.unpack_from("<I", block, len(block) - 4)
    limit = len(block) - 4 - 4 * num_restarts  # where the restart array starts
    if num_restarts == 0 or limit < 0:
        raise TableError(f"{what} has a bad restart array")
    pos, key = 0, b""
    while pos < limit:
        shared, pos = _varint(block, pos, limit, what)
        non_shared, pos = _varint(block, pos, limit, what)
        value_len, pos = _varint(block, pos, limit, what)
        if shared > len(key) or pos + non_shared + value_len > limit:
            raise TableError(f"{what} has a corrupted entry at byte {pos}")
        key = key[:shared] + block[pos : pos + non_shared]
        pos += non_shared
        yield key, block[pos : pos + value_len]
        pos += value_len


def read_table(data: bytes, name: str = "table") -> list[tuple[bytes, bytes]]:
    """Every (key, value) of the SSTable held in `data`, in key order. Raises `TableError`
    (starting with `name`) for a bad magic number, a truncated file, a checksum mismatch or keys
    out of order."""
    try:
        return _read_table(data)
    except TableError as e:
        raise TableError(f"{name}: {e}") from None


def _read_table(data: bytes) -> list[tuple[bytes, bytes]]:
    if len(data) < FOOTER_SIZE:
        raise TableError(f"{len(data)} bytes, shorter than a table footer (truncated?)")
    footer = data[-FOOTER_SIZE:]
    lo, hi = struct.unpack_from("<II", footer, FOOTER_SIZE - 8)
    if (hi << 32) | lo != MAGIC:
        raise TableError("bad magic number (not an SSTable, or truncated)")
    _metaindex, pos = _handle(footer, 0, 40, "footer")
    index_handle, _ = _handle(footer, pos, 40, "footer")
    index = _read_block(data, index_handle, "index block")
    out: list[tuple[bytes, bytes]] = []
    for _sep, value in _block_entries(index, "index block"):
        handle, _ = _handle(value, 0, len(value), "index entry")
        what = "data block"
        for key, val in _block_entries(_read_block(data, handle, what), what):
            if out and key <= out[-1][0]:
                raise TableError(f"keys out of order ({out[-1][0]!r}, {key!r})")
            out.append((key, val))
    return out
