"""Readable pure-Python twins of the kernels in ``_core.pyx``: the tests' oracle.

Same inputs, same outputs, no speed. A kernel can be rewritten for speed as long as it keeps
agreeing with its twin here.
"""

from __future__ import annotations

import numpy as np

BLOCK = 512
OK, BAD_CHECKSUM, TRUNCATED, BAD_NUMBER, BAD_PAX, FULL = range(6)


def _number(field: bytes) -> int | None:
    if field[0] & 0x80:  # GNU base-256
        return int.from_bytes(bytes([field[0] & 0x3F]) + field[1:], "big")
    text = field.split(b"\0", 1)[0].strip(b" ")
    if not text:
        return 0
    try:
        return int(text, 8)
    except ValueError:
        return None


def _checksum_ok(header: bytes, stored: int) -> bool:
    blanked = header[:148] + b" " * 8 + header[156:]
    unsigned = sum(blanked)
    signed = sum(b - 256 if b > 127 else b for b in blanked)
    return stored in (unsigned, signed)


def _pax(record_bytes: bytes, base: int) -> tuple[int, int, int, int] | None:
    """(path offset, path length, size or -1, ok) from pax records; None when malformed."""
    pos, path_off, path_len, size = 0, -1, 0, -1
    while pos < len(record_bytes):
        digits = 0
        while pos + digits < len(record_bytes) and record_bytes[pos + digits : pos + digits + 1].isdigit():
            digits += 1
        if digits == 0:
            if record_bytes[pos:].split(b"\0", 1)[0] == b"":
                break
            return None
        length = int(record_bytes[pos : pos + digits])
        record = record_bytes[pos : pos + length]
        if length == 0 or record_bytes[pos + digits : pos + digits + 1] != b" " or len(record) < length or not record.endswith(b"\n"):
            return None
        key, eq, value = record[digits + 1 : -1].partition(b"=")
        if not eq:
            return None
        if key == b"path":
            path_off, path_len = base + pos + digits + 1 + len(key) + 1, len(value)
        elif key == b"size":
            if not value.isdigit() and value != b"":
                return None
            size = int(value or b"0")
        pos += length
    return path_off, path_len, size, 1


def scan_tar(data, out: np.ndarray) -> tuple[int, int, int]:
    """Twin of :func:`hydrax._core.scan_tar`."""
    data = bytes(data)
    n, pos, rows = len(data), 0, 0
    long_name = pax_name = None
    pax_size = -1
    while True:
        if pos + BLOCK > n:
            return rows, TRUNCATED, pos
        header = data[pos : pos + BLOCK]
        if header == bytes(BLOCK):
            return rows, OK, pos
        stored = _number(header[148:156])
        if stored is None or not _checksum_ok(header, stored):
            return rows, BAD_CHECKSUM, pos
        size = _number(header[124:136])
        if size is None:
            return rows, BAD_NUMBER, pos
        kind = header[156:157]
        if pax_size >= 0 and kind != b"x":
            size = pax_size
        payload = pos + BLOCK
        if payload + size > n:
            return rows, TRUNCATED, pos
        if kind == b"L":
            long_name = (payload, len(data[payload : payload + size].split(b"\0", 1)[0]))
        elif kind == b"x":
            parsed = _pax(data[payload : payload + size], payload)
            if parsed is None:
                return rows, BAD_PAX, pos
            if parsed[0] >= 0:
                pax_name = (parsed[0], parsed[1])
            if parsed[2] >= 0:
                pax_size = parsed[2]
        elif kind in (b"g", b"K"):
            pass
        else:
            if kind in (b"0", b"\0", b"7"):
                if rows == len(out):
                    return rows, FULL, pos
                if pax_name is not None:
                    where = (0, 0, *pax_name)
                elif long_name is not None:
                    where = (0, 0, *long_name)
                else:
                    prefix = header[345:500].split(b"\0", 1)[0] if header[257:263] == b"ustar\0" else b""
                    name = header[:100].split(b"\0", 1)[0]
                    where = (pos + 345 if prefix else 0, len(prefix), pos, len(name))
                out[rows] = (pos, payload, size, *where)
                rows += 1
            long_name = pax_name = None
            pax_size = -1
        pos = payload + -(-size // BLOCK) * BLOCK
