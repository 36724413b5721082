"""CRC-32C (Castagnoli), as TensorFlow and LevelDB checksum their files, in numpy only.

A byte-at-a-time table loop in Python runs at a few MB/s, too slow for checkpoints of hundreds
of MB. CRCs are linear over GF(2), so a long buffer is cut into `lanes` equal pieces whose
(zero-initialised) CRCs are computed together, one numpy table lookup per byte column; the
pieces are then chained: crc(A + B) = shift_len(B)(crc(A)) xor crc0(B), where `shift_n` (the
effect of n zero bytes on the register) is a 32x32 bit matrix computed the same vectorised
way. The result is the standard CRC-32C (init and final xor 0xFFFFFFFF); `extend` continues
one the way TensorFlow's `crc32c::Extend` does.
"""

from __future__ import annotations

import numpy as np

_POLY = 0x82F63B78  # the Castagnoli polynomial, bit-reversed
_MASK_DELTA = 0xA282EAD8


def _make_table() -> np.ndarray:
    table = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        table = np.where(table & 1, (table >> 1) ^ np.uint32(_POLY), table >> 1).astype(np.uint32)
    return table


_TABLE = _make_table()


def _make_table16() -> np.ndarray:
    """The register's change over two zero bytes from each 16-bit start value: two bytes per
    numpy gather instead of one."""
    v = np.arange(65536, dtype=np.uint32)
    r = _TABLE[v & 0xFF] ^ (v >> 8)
    return (_TABLE[r & 0xFF] ^ (r >> 8)).astype(np.uint32)


_TABLE16 = _make_table16()
_SMALL = 4096  # below this many bytes a plain loop is cheaper than the lane machinery


def _raw_lanes(reg: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """Run the registers `reg` (one uint32 per lane) over `cols` (n x lanes uint16: row j holds
    bytes 2j and 2j+1 of every lane, little-endian), with no pre- or post-inversion."""
    reg = reg.copy()
    idx = np.empty_like(reg)
    for row in cols:
        np.bitwise_xor(reg, row, out=idx)
        np.bitwise_and(idx, 0xFFFF, out=idx)
        reg >>= 16
        reg ^= np.take(_TABLE16, idx)
    return reg


def _raw_small(reg: int, data: memoryview | bytes) -> int:
    table = _TABLE.tolist()
    for b in bytes(data):
        reg = table[(reg ^ b) & 0xFF] ^ (reg >> 8)
    return reg


_LANE = 1024  # bytes per lane: long enough to amortise numpy's per-call cost
_LANE_SHIFT: np.ndarray | None = None


def _apply(cols: np.ndarray, regs: np.ndarray) -> np.ndarray:
    """Multiply the registers `regs` by the 32x32 GF(2) matrix whose columns are `cols`."""
    out = np.zeros_like(regs)
    for k in range(32):
        out ^= cols[k] * ((regs >> np.uint32(k)) & np.uint32(1))
    return out


def _lane_shift() -> np.ndarray:
    """The effect of _LANE zero bytes on the register, as the images of the 32 unit registers."""
    global _LANE_SHIFT
    if _LANE_SHIFT is None:
        units = np.left_shift(np.uint32(1), np.arange(32, dtype=np.uint32))
        _LANE_SHIFT = _raw_lanes(units, np.zeros((_LANE // 2, 32), dtype=np.uint16))
    return _LANE_SHIFT


def _raw(reg: int, data: bytes | bytearray | memoryview) -> int:
    """The CRC register after `data`, starting from `reg` (no pre- or post-inversion)."""
    buf = np.frombuffer(data, dtype=np.uint8)
    n = buf.size
    if n < _SMALL:
        return _raw_small(reg, buf.tobytes())
    lanes = n // _LANE
    width = 1 << (lanes - 1).bit_length()  # a power of two, for the pairwise chaining below
    # cols[j, i] is byte j of lane i; the padding lanes go first: zero bytes leave a zero
    # register unchanged, so they do not alter the chained result.
    cols = np.zeros((_LANE // 2, width), dtype=np.uint16)
    body = buf[: lanes * _LANE].view("<u2").reshape(lanes, _LANE // 2)
    cols[:, width - lanes :] = body.T
    # A start register equals xoring it (little-endian) into the first 4 bytes with a zero start.
    cols[:2, width - lanes] ^= np.array([reg & 0xFFFF, reg >> 16], dtype=np.uint16)
    crcs = _raw_lanes(np.zeros(width, dtype=np.uint32), cols)
    shift = _lane_shift()
    while crcs.size > 1:  # crc(A + B) = shift_len(B)(crc(A)) ^ crc(B), pairwise
        crcs = _apply(shift, crcs[0::2]) ^ crcs[1::2]
        shift = _apply(shift, shift)
    return _raw_small(int(crcs[0]), buf[lanes * _LANE :].tobytes())


def extend(crc: int, data: bytes | bytearray | memoryview) -> int:
    """CRC-32C of (the bytes whose CRC-32C is `crc`) followed by `data`; `extend(0, d)` is the
    CRC-32C of `d`."""
    return _raw(crc ^ 0xFFFFFFFF, data) ^ 0xFFFFFFFF


def crc32c(data: bytes | bytearray | memoryview) -> int:
    """The standard CRC-32C of `data` (crc32c(b"123456789") == 0xE3069283)."""
    return extend(0, data)


def mask(crc: int) -> int:
    """TensorFlow's / LevelDB's stored form of a CRC: rotated right by 15 bits plus a constant,
    so that the CRC of data that itself holds CRCs stays well distributed."""
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + _MASK_DELTA) & 0xFFFFFFFF


def unmask(masked: int) -> int:
    rot = (masked - _MASK_DELTA) & 0xFFFFFFFF
    return ((rot >> 17) | (rot << 15)) & 0xFFFFFFFF
