"""Readable pure-Python twins of the tar kernels of ``_core`` (``_tar.pxi``): the tests' oracle.

Same inputs, same outputs, no speed. A kernel can be rewritten for speed as long as it keeps
agreeing with its twin here. It also holds the numpy twins of the permutation kernels
(``_permute.pxi``), :func:`feistel_permute` and :func:`feistel_windows`, and that of the shuffle
kernel (``_shuffle.pxi``), :func:`shuffle_runs`, made of numpy's own generators, and that of
the mixture kernel (``_mixture.pxi``), :func:`mixture_slots`, those of the image header
kernels (``_imagesize.pxi``), :func:`read_image_header`, :func:`read_image_headers` and
:func:`scan_jpeg_markers`, and that of the crop box kernel (``_boxes.pxi``),
:func:`random_resized_draws`.
"""

from __future__ import annotations

import re
import struct

import numpy as np

BLOCK = 512
OK, BAD_CHECKSUM, TRUNCATED, BAD_NUMBER, BAD_PAX, FULL, DUPLICATE_FIELD, FALLBACK, ZERO_BLOCK = range(9)
#: What a number too large for any archive reads as (the kernel saturates instead of wrapping).
HUGE = 1 << 62


def _number(field: bytes) -> int | None:
    """A header number: leading spaces, octal digits, then a NUL, a space or the field's end."""
    if field[0] & 0x80:  # GNU base-256
        return min(int.from_bytes(bytes([field[0] & 0x3F]) + field[1:], "big"), HUGE)
    text = field.lstrip(b" ")
    digits = re.match(rb"[0-7]*", text).group()
    rest = text[len(digits):]
    if rest and rest[:1] not in (b"\0", b" "):
        return None
    return int(digits or b"0", 8)


def _decimal(digits: bytes) -> int:
    """A pax number; past 2**62 it reads as :data:`HUGE` (and ``int`` refuses over 4,300 digits)."""
    digits = digits.lstrip(b"0")
    return HUGE if len(digits) > 19 else min(int(digits or b"0"), HUGE)


def _checksum_ok(header: bytes, stored: int) -> bool:
    blanked = header[:148] + b" " * 8 + header[156:]
    unsigned = sum(blanked)
    signed = sum(b - 256 if b > 127 else b for b in blanked)
    return stored in (unsigned, signed)


def _header_ok(header: bytes) -> bool:
    stored = _number(header[148:156])
    return stored is not None and _checksum_ok(header, stored)


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
        length = _decimal(record_bytes[pos : pos + digits])
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
            size = _decimal(value)
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
            following = data[pos + BLOCK : pos + 2 * BLOCK]
            if len(following) == BLOCK and following != bytes(BLOCK):
                return rows, ZERO_BLOCK, pos  # a header wiped mid-archive: the end is two zero blocks
            return rows, OK, pos
        if not _header_ok(header):
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


# WebDataset's split of a member path (``hydrax.shards.tarindex`` applies the same pattern to text):
# a key (directory part plus a run of non-dots) and the rest.
_KEY_FIELD = re.compile(rb"^((?:.*/|)[^.]+)[.]([^/]*)$", re.DOTALL)


def index_tar(data) -> tuple:
    """Twin of :func:`hydrax._core.index_tar`: :func:`scan_tar`, then the WebDataset grouping."""
    data = bytes(data)
    rows = np.zeros((len(data) // BLOCK + 1, 7), np.int64)
    count, status, offset = scan_tar(data, rows)
    fields: dict[bytes, int] = {}
    keys: list[bytes] = []
    sample_ends: list[int] = []
    entries: list[tuple[int, int, int]] = []
    in_sample: set[int] = set()
    held = None
    for _header, payload, size, prefix_at, prefix_len, name_at, name_len in rows[:count].tolist():
        name = data[name_at : name_at + name_len]
        if prefix_len:
            name = data[prefix_at : prefix_at + prefix_len] + b"/" + name
        first = name.split(b"/", 1)[0]
        if len(first) > 4 and first.startswith(b"__") and first.endswith(b"__"):
            continue
        match = _KEY_FIELD.match(name)
        if match is None:
            continue
        key, field = match.groups()
        if not field.isascii():
            held = (FALLBACK, payload)
            break
        if not keys or keys[-1] != key:
            keys.append(key)
            sample_ends.append(len(entries))
            in_sample = set()
        number = fields.setdefault(field.lower(), len(fields))
        if number in in_sample:
            held = (DUPLICATE_FIELD, payload)
            break
        in_sample.add(number)
        entries.append((number, payload, size))
        sample_ends[-1] = len(entries)
    if status == OK and held is not None:
        status, offset = held
    table = np.array(entries, np.int64).reshape(-1, 3)
    return (status, offset, list(fields), np.frombuffer(b"".join(keys), np.uint8),
            np.cumsum([len(k) for k in keys], dtype=np.int64), np.array(sample_ends, np.int64),
            table[:, 0].astype(np.int32), table[:, 1].copy(), table[:, 2].copy())


def check_index(key_ends, sample_ends, entry_field, entry_offset, entry_size, key_bytes: int, fields: int,
                shard_size: int) -> int:
    """Twin of :func:`hydrax._core.check_index`."""
    key_ends, sample_ends = [int(e) for e in key_ends], [int(e) for e in sample_ends]
    if len(key_ends) != len(sample_ends) or not len(entry_field) == len(entry_offset) == len(entry_size):
        return 5
    if [0, *key_ends] != sorted([0, *key_ends]) or (key_ends[-1] if key_ends else 0) != key_bytes:
        return 1
    if any(b <= a for a, b in zip([0, *sample_ends], sample_ends)) or (sample_ends[-1] if sample_ends else 0) != len(entry_field):
        return 2
    if any(not 0 <= int(f) < fields for f in entry_field):
        return 3
    if any(o < 0 or n < 0 or o + n > shard_size for o, n in zip(entry_offset.tolist(), entry_size.tolist())):
        return 4
    return 0


# The permutation kernel's twin (``_permute.pxi``), in numpy: every position moves through the
# network at once, and only the positions that landed outside [0, n) go round again.
_MIX_1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX_2 = np.uint64(0x94D049BB133111EB)


def _splitmix64_mix(z: np.ndarray) -> np.ndarray:
    """The splitmix64 finalizer on a uint64 array (numpy's array products wrap mod 2**64)."""
    z = z ^ (z >> np.uint64(30))
    z = z * _MIX_1
    z = z ^ (z >> np.uint64(27))
    z = z * _MIX_2
    return z ^ (z >> np.uint64(31))


def _feistel_network(x: np.ndarray, keys: np.ndarray, half: int) -> np.ndarray:
    shift, mask = np.uint64(half), np.uint64((1 << half) - 1)
    left, right = x >> shift, x & mask
    for key in keys:
        left, right = right, left ^ (_splitmix64_mix(right ^ key) & mask)
    return (left << shift) | right


def feistel_permute(n: int, keys, positions) -> np.ndarray:
    """Twin of :func:`hydrax._core.feistel_permute`, returning the int64 indices instead of
    filling ``out``."""
    n = int(n)
    keys = np.asarray(keys, np.uint64).reshape(-1)
    positions = np.asarray(positions, np.int64).reshape(-1)
    if len(keys) == 0:
        raise ValueError("a permutation needs at least one round key")
    if n > 1 << 63:
        raise ValueError(f"n = {n} is more than 2**63: the indices would not fit in int64")
    outside = np.flatnonzero((positions < 0) | (positions.astype(np.uint64) >= np.uint64(n)))
    if len(outside):
        bad = int(outside[0])
        raise ValueError(f"position {positions[bad]} (at index {bad}) is outside [0, {n})")
    if n <= 1:
        return positions.copy()
    half = (max(2, (n - 1).bit_length()) + 1) // 2
    x = positions.astype(np.uint64)
    walking = np.arange(len(x))
    while len(walking):
        x[walking] = _feistel_network(x[walking], keys, half)
        walking = walking[x[walking] >= np.uint64(n)]
    return x.astype(np.int64)


def feistel_windows(positions, cum, shard_starts, run_shards, run_starts, keys) -> np.ndarray:
    """Twin of :func:`hydrax._core.feistel_windows`, returning the items instead of filling
    ``out``: each run's positions through :func:`feistel_permute`, then a search for the shard."""
    positions = np.asarray(positions, np.int64).reshape(-1)
    cum, shard_starts, run_shards = (np.asarray(a, np.int64) for a in (cum, shard_starts, run_shards))
    keys = np.asarray(keys, np.uint64).reshape(len(run_shards) - 1, -1)
    if not np.array_equal(run_starts, cum[run_shards[:-1]]):
        raise ValueError("run_starts must be cum[run_shards[:-1]]")
    run_starts, run_ends = cum[run_shards[:-1]], cum[run_shards[1:]]
    run = np.searchsorted(run_starts, positions, side="right") - 1
    if len(positions) and (run.min() < 0 or (positions >= run_ends[run]).any()):
        raise ValueError("a position is in no run of the stream")
    out = np.empty_like(positions)
    for r in np.unique(run).tolist():
        chosen = run == r
        offset = feistel_permute(run_ends[r] - run_starts[r], keys[r], positions[chosen] - run_starts[r]) + run_starts[r]
        run_cum = cum[run_shards[r] : run_shards[r + 1] + 1]
        shard = np.searchsorted(run_cum, offset, side="right") - 1
        out[chosen] = shard_starts[run_shards[r] + shard] + offset - run_cum[shard]
    return out


def shuffle_runs(data: np.ndarray, bounds, key) -> None:
    """Twin of :func:`hydrax._core.shuffle_runs`, with numpy's own generators (a Python object
    per run): ``key`` here is the integers themselves, not their words."""
    bounds = np.asarray(bounds, np.int64)
    for run in range(len(bounds) - 1):
        a, b = int(bounds[run]), int(bounds[run + 1])
        data[a:b] = data[a:b][np.random.Generator(np.random.PCG64([*key, run])).permutation(b - a)]


def mixture_slots(slots, batch_size: int, ends, before, epoch_start) -> tuple[np.ndarray, np.ndarray]:
    """Twin of :func:`hydrax._core.mixture_slots`, returning ``(source, stream)``: each slot's
    batch and place, the first source whose slots end after that place, and its stream position."""
    slots = np.asarray(slots, np.int64).reshape(-1)
    ends, before = np.asarray(ends, np.int64), np.asarray(before, np.int64)
    batch, place = np.divmod(slots, batch_size)
    if len(slots) and (slots.min() < 0 or batch.max() >= ends.shape[1]):
        raise ValueError("a slot is outside the block")
    if (np.diff(ends, axis=0) < 0).any() or (ends[-1] != batch_size).any():
        raise ValueError("the layout's tables are inconsistent")
    source = (place[None, :] >= ends[:, batch]).sum(axis=0)
    start = np.where(source > 0, ends[np.maximum(source - 1, 0), batch], 0)
    return source, np.asarray(epoch_start, np.int64)[source] + before[source, batch] + place - start


def mixture_locate(items, offsets) -> tuple[np.ndarray, np.ndarray, int]:
    """Twin of :func:`hydrax._core.mixture_locate`, returning ``(source, local, bad)``: the last
    source starting at or before each item, the item's index in it, and the first item out of
    range (-1 if none; the entries from there on are then unspecified)."""
    items, offsets = np.asarray(items, np.int64).reshape(-1), np.asarray(offsets, np.int64)
    if len(offsets) < 2 or offsets[0] != 0 or (np.diff(offsets) < 0).any():
        raise ValueError("offsets must start at 0 and ascend")
    outside = np.flatnonzero((items < 0) | (items >= offsets[-1]))
    source = np.clip(np.searchsorted(offsets, items, side="right") - 1, 0, len(offsets) - 2)
    return source, items - offsets[source], int(outside[0]) if len(outside) else -1


def mixture_items(source, stream, sizes, offsets, first_pass, key_rows, keys) -> np.ndarray:
    """Twin of :func:`hydrax._core.mixture_items`, returning the items: each (source, pass)
    through :func:`feistel_permute` with its row of keys; -1 for a source without rows."""
    source, stream = np.asarray(source, np.int64), np.asarray(stream, np.int64)
    sizes, offsets, first_pass, key_rows = (np.asarray(a, np.int64) for a in (sizes, offsets, first_pass, key_rows))
    out = np.full(len(source), -1, np.int64)
    if len(source) and (source.min() < 0 or source.max() >= len(sizes) or stream.min() < 0):
        raise ValueError("an item has no source")
    for s in np.unique(source).tolist():
        if key_rows[s] == key_rows[s + 1]:
            continue
        chosen = source == s
        turn, offset = np.divmod(stream[chosen], sizes[s])
        rows = key_rows[s] + turn - first_pass[s]
        if rows.min() < key_rows[s] or rows.max() >= key_rows[s + 1]:
            raise ValueError("a pass has no key row")
        mine = np.empty_like(offset)
        for r in np.unique(rows).tolist():
            now = rows == r
            mine[now] = feistel_permute(sizes[s], np.asarray(keys)[r], offset[now])
        out[chosen] = offsets[s] + mine
    return out


# -- image headers (``_imagesize.pxi``) -----------------------------------------------------------

#: Statuses of :func:`read_image_header`, as the kernel numbers them.
(IMAGE_OK, IMAGE_UNKNOWN_FORMAT, IMAGE_TRUNCATED, IMAGE_BAD_MARKER, IMAGE_BAD_LENGTH, IMAGE_NO_SIZE, IMAGE_BAD_SIGNATURE,
 IMAGE_BAD_SIZE, IMAGE_OUTSIDE_DATA) = range(9)
#: Formats, as the kernel numbers them.
FORMAT_NONE, FORMAT_JPEG, FORMAT_PNG, FORMAT_WEBP, FORMAT_GIF = range(5)
_JPEG_FRAMES = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}  # SOFn; not DHT, JPG, DAC
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


class _Failed(Exception):
    """A header that does not give a size: ``status`` and the byte ``offset`` it is about."""

    def __init__(self, status: int, offset: int) -> None:
        super().__init__(status, offset)
        self.status, self.offset = status, offset


def _sized(width: int, height: int, orientation: int, offset: int) -> tuple[int, int, int, int]:
    if width <= 0 or height <= 0:
        raise _Failed(IMAGE_BAD_SIZE, offset)
    return width, height, orientation, offset


def exif_orientation(block: bytes) -> int:
    """The EXIF orientation (1-8) that IFD0 of a TIFF-structured ``block`` holds, as one SHORT or
    LONG; 1 where the block does not parse, lacks the tag or holds any other value."""
    if len(block) < 8 or block[:2] not in (b"II", b"MM"):
        return 1
    order = "<" if block[:2] == b"II" else ">"
    magic, ifd = struct.unpack_from(order + "HI", block, 2)
    if magic != 42 or ifd < 8 or ifd + 2 > len(block):
        return 1
    (count,) = struct.unpack_from(order + "H", block, ifd)
    if ifd + 2 + 12 * count > len(block):
        return 1
    for entry in range(ifd + 2, ifd + 2 + 12 * count, 12):
        tag, kind, number = struct.unpack_from(order + "HHI", block, entry)
        if tag == 0x0112:
            if number != 1 or kind not in (3, 4):
                return 1
            (value,) = struct.unpack_from(order + ("H" if kind == 3 else "I"), block, entry + 8)
            return value if 1 <= value <= 8 else 1
    return 1


def _jpeg_size(data: bytes) -> tuple[int, int, int, int]:
    """Walk a JPEG's marker segments to its first frame header (SOFn)."""
    at, orientation, exif_seen = 2, 1, False
    while True:
        if at >= len(data):
            raise _Failed(IMAGE_TRUNCATED, at)
        if data[at] != 0xFF:
            raise _Failed(IMAGE_BAD_MARKER, at)
        mark = at
        while at < len(data) and data[at] == 0xFF:  # fill bytes
            at += 1
        if at >= len(data):
            raise _Failed(IMAGE_TRUNCATED, mark)
        marker = data[at]
        at += 1
        if marker == 0x01 or 0xD0 <= marker <= 0xD7:  # TEM and RSTn stand alone
            continue
        if marker in (0xD8, 0xD9, 0xDA):
            raise _Failed(IMAGE_NO_SIZE, mark)
        if marker < 0xC0:
            raise _Failed(IMAGE_BAD_MARKER, mark)
        if at + 2 > len(data):
            raise _Failed(IMAGE_TRUNCATED, mark)
        (length,) = struct.unpack_from(">H", data, at)
        if length < 2 or (marker in _JPEG_FRAMES and length < 8):
            raise _Failed(IMAGE_BAD_LENGTH, mark)
        if at + length > len(data):
            raise _Failed(IMAGE_TRUNCATED, mark)
        segment = data[at + 2 : at + length]
        if marker in _JPEG_FRAMES:
            height, width = struct.unpack_from(">HH", segment, 1)
            return _sized(width, height, orientation, mark)
        if marker == 0xE1 and not exif_seen and segment[:6] == b"Exif\0\0":
            exif_seen = True
            orientation = exif_orientation(segment[6:])
        at += length


def _png_size(data: bytes) -> tuple[int, int, int, int]:
    """The IHDR chunk, first after the signature."""
    if len(data) < 24:
        raise _Failed(IMAGE_TRUNCATED, 8)
    length, kind, width, height = struct.unpack_from(">I4sII", data, 8)
    if kind != b"IHDR":
        raise _Failed(IMAGE_NO_SIZE, 8)
    if length != 13:
        raise _Failed(IMAGE_BAD_LENGTH, 8)
    if width >= 1 << 31 or height >= 1 << 31:
        raise _Failed(IMAGE_BAD_SIZE, 8)
    return _sized(width, height, 1, 8)


def _webp_size(data: bytes) -> tuple[int, int, int, int]:
    """The first chunk of a WebP file: VP8, VP8L or VP8X."""
    if len(data) < 20:
        raise _Failed(IMAGE_TRUNCATED, 12)
    kind, size = struct.unpack_from("<4sI", data, 12)
    need = {b"VP8 ": 10, b"VP8L": 5, b"VP8X": 10}.get(kind)
    if need is None:
        raise _Failed(IMAGE_NO_SIZE, 12)
    if size < need:
        raise _Failed(IMAGE_BAD_LENGTH, 12)
    if len(data) < 20 + need:
        raise _Failed(IMAGE_TRUNCATED, 12)
    body = data[20 : 20 + need]
    if kind == b"VP8 ":  # frame tag (3 bytes), start code, 14-bit width and height (2 scale bits above)
        if body[3:6] != b"\x9d\x01\x2a":
            raise _Failed(IMAGE_BAD_SIGNATURE, 23)
        width, height = struct.unpack_from("<HH", body, 6)
        return _sized(width & 0x3FFF, height & 0x3FFF, 1, 12)
    if kind == b"VP8L":  # signature 0x2f, then width-1 and height-1 in 14 bits each, alpha, version
        (bits,) = struct.unpack_from("<I", body, 1)
        if body[0] != 0x2F or bits >> 29:
            raise _Failed(IMAGE_BAD_SIGNATURE, 20)
        return _sized((bits & 0x3FFF) + 1, (bits >> 14 & 0x3FFF) + 1, 1, 12)
    # VP8X: flags, 3 reserved bytes, canvas width-1 and height-1 in 24 bits each
    return _sized(int.from_bytes(body[4:7], "little") + 1, int.from_bytes(body[7:10], "little") + 1, 1, 12)


def read_image_header(data) -> tuple[int, int, int, int, int, int]:
    """Twin of :func:`hydrax._core.read_image_header`: ``(status, format, width, height,
    orientation, offset)``."""
    data = bytes(data)
    if data[:2] == b"\xff\xd8":
        fmt, read = FORMAT_JPEG, _jpeg_size
    elif data[:8] == _PNG_SIGNATURE:
        fmt, read = FORMAT_PNG, _png_size
    elif len(data) >= 12 and data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        fmt, read = FORMAT_WEBP, _webp_size
    elif data[:6] in (b"GIF87a", b"GIF89a"):
        fmt = FORMAT_GIF

        def read(data):
            if len(data) < 10:
                raise _Failed(IMAGE_TRUNCATED, 6)
            return _sized(*struct.unpack_from("<HH", data, 6), 1, 6)
    else:
        return IMAGE_UNKNOWN_FORMAT, FORMAT_NONE, 0, 0, 0, 0
    try:
        width, height, orientation, offset = read(data)
    except _Failed as failed:
        return failed.status, fmt, 0, 0, 0, failed.offset
    return IMAGE_OK, fmt, width, height, orientation, offset


def read_image_headers(data, starts, lengths) -> tuple[np.ndarray, ...]:
    """Twin of :func:`hydrax._core.read_image_headers`, returning its output arrays (statuses,
    formats, widths, heights, orientations, offsets) instead of filling them."""
    data = bytes(data)
    rows = []
    for start, length in zip(np.asarray(starts).tolist(), np.asarray(lengths).tolist()):
        if start < 0 or length < 0 or start + length > len(data):
            rows.append((IMAGE_OUTSIDE_DATA, FORMAT_NONE, 0, 0, 0, 0))
        else:
            rows.append(read_image_header(data[start : start + length]))
    columns = list(zip(*rows)) or [()] * 6
    dtypes = (np.uint8, np.uint8, np.int32, np.int32, np.uint8, np.int64)
    return tuple(np.array(column, dtype) for column, dtype in zip(columns, dtypes))


#: Start-of-frame markers the fast JPEG decode takes (baseline, extended, progressive Huffman);
#: the others of _JPEG_FRAMES send a file to Pillow.
_DECODED_FRAMES = (0xC0, 0xC1, 0xC2)
#: Segments the walk steps over unread: tables, restart interval, JFIF, comment.
_JPEG_UNREAD = frozenset({0xC4, 0xDB, 0xDD, 0xE0, 0xFE})


def scan_jpeg_markers(data) -> tuple | None:
    """Twin of ``_core.scan_jpeg_markers``: ``(width, height, sampling, exif, icc)`` from a
    JPEG's markers up to its scan, or None where they send the file to Pillow's path."""
    data = bytes(data)
    if len(data) < 4 or data[0] != 0xFF or data[1] != 0xD8 or data[2] != 0xFF:
        return None
    frame, exif, icc = None, None, []
    at, end = 2, len(data)
    while True:
        if at + 4 > end or data[at] != 0xFF:
            return None
        while at < end and data[at] == 0xFF:  # fill bytes may precede a marker
            at += 1
        if at + 3 > end:
            return None
        marker = data[at]
        length = (data[at + 1] << 8) | data[at + 2]
        if length < 2 or at + 1 + length > end:
            return None
        start, at = at + 3, at + 1 + length
        segment = data[start:at]
        if marker in _JPEG_UNREAD:
            continue
        if marker == 0xDA:  # start of scan: the entropy-coded data follows
            break
        if marker in _DECODED_FRAMES:
            if frame is not None:
                return None
            frame = _jpeg_frame(segment)
            if frame is None:
                return None
        elif marker in _JPEG_FRAMES or not 0xC0 <= marker <= 0xFE or 0xD0 <= marker <= 0xD9:
            return None  # another coding, or a marker that has no segment where one must be
        elif marker == 0xE1 and segment[:6] == b"Exif\0\0":
            if exif is not None:
                return None
            exif = (start + 6, at)
        elif marker == 0xE1 and segment[:29] == b"http://ns.adobe.com/xap/1.0/\0" and b"Orientation" in segment:
            return None
        elif marker == 0xE2 and segment[:12] == b"ICC_PROFILE\0":
            if len(segment) < 14:
                return None
            icc.append((start, at))
        elif marker == 0xE2 and segment[:4] == b"MPF\0":
            return None
    if frame is None:
        return None
    return (*frame, exif, tuple(icc))


def _jpeg_frame(segment: bytes) -> tuple[int, int, tuple[tuple[int, int], ...]] | None:
    """(width, height, sampling factors) of an 8-bit frame of 1 or 3 components, else None."""
    if len(segment) < 6:
        return None
    precision, height, width, components = segment[0], (segment[1] << 8) | segment[2], (segment[3] << 8) | segment[4], segment[5]
    if precision != 8 or components not in (1, 3) or len(segment) < 6 + 3 * components or width < 1 or height < 1:
        return None
    sampling = tuple((segment[7 + 3 * c] >> 4, segment[7 + 3 * c] & 15) for c in range(components))
    if not all(1 <= h <= 4 and 1 <= v <= 4 for h, v in sampling):
        return None
    return width, height, sampling


def _splitmix(seed: int, stream: int) -> int:
    """SplitMix64's finaliser of (seed, stream), modulo 2**64 (``hydrax.image.boxes.mix_seed``)."""
    z = (seed * 0x9E3779B97F4A7C15 + stream * 0xBF58476D1CE4E5B9 + 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return z ^ (z >> 31)


def random_resized_draws(seed: int, stream: int, tries: int, width: int, height: int, low_scale: float,
                         high_scale: float, low_ratio: float, high_ratio: float) -> tuple[int, int, int, int] | None:
    """Twin of ``_core.random_resized_draws``: up to ``tries`` draws of an area (uniform in
    ``low_scale``..``high_scale`` of the image's) and an aspect (log-uniform in the ratio
    range), each keyed by ``(seed, stream)`` and the draw's number; the first box that fits, at a
    uniform position, or None."""
    import math

    key = _splitmix(seed, stream)

    def unit(draw: int) -> float:  # 53 random bits, uniform in [0, 1)
        return (_splitmix(key, draw) >> 11) * 2.0**-53

    def below(draw: int, count: int) -> int:  # uniform in 0..count-1
        return (_splitmix(key, draw) * count) >> 64

    area = width * height
    log_low, log_high = math.log(low_ratio), math.log(high_ratio)
    for draw in range(0, 4 * tries, 4):
        target = area * (low_scale + (high_scale - low_scale) * unit(draw))
        aspect = math.exp(log_low + (log_high - log_low) * unit(draw + 1))
        w, h = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            top, left = below(draw + 2, height - h + 1), below(draw + 3, width - w + 1)
            return left, top, left + w, top + h
    return None
