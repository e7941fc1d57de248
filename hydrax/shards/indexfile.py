"""Per-shard index files.

An index lists a shard's samples: each sample's key and, per field, the payload's byte offset and
size, so a sample can be read with one positional read per field and no scan. It lives next to
the shard as ``<shard>.hidx`` (or beside a remote shard as an object of that name) and is tied to
the shard's size and modification time (or, for a remote shard, its ETag).

File format ``hydrax-tar-index-v2``, little-endian throughout, loaded with one read and no
decompression:

- a 64-byte header: the magic ``b"hydrax-tar-index"`` (16 bytes), the version (uint32, 2), the
  length of the meta text (uint32), the numbers of samples, entries and key bytes (3 int64), a
  CRC-32 (uint32) of header bytes 0-47 followed by everything after the header, 12 zero bytes;
- ``meta``: UTF-8 JSON, ``{"format": "hydrax-tar-index-v2", "shard_size": int,
  "shard_mtime_ns": int, "etag": str | null, "fields": [field names]}``;
- then, each starting at the next multiple of 64 bytes (zero padding between), the arrays:
  ``key_bytes`` (uint8) and ``key_ends`` (int64, one per sample): the keys, UTF-8 encoded and
  concatenated; ``sample_ends`` (int64, one per sample): the end of each sample's run of entries;
  ``entry_field`` (int32), ``entry_offset`` (int64), ``entry_size`` (int64): one per (sample,
  field), the field as an index into ``meta["fields"]``. The file ends with the last array.

Format ``hydrax-tar-index-v3`` is v2 with image sizes (see :mod:`hydrax.shards.sizecolumn`): the
version is 3, ``meta`` is of format ``"hydrax-tar-index-v3"`` and has ``"sizes_field"`` (the field
they were read from), and two more arrays follow, each at the next multiple of 64 bytes:
``width`` and ``height`` (int32, one per sample; 0 and 0 where the sample has no such field or
its header could not be read). An index without sizes is written as v2, byte for byte as before.

The sample count is in the header, so :func:`count_samples` reads 64 bytes. Loading checks the
checksum and every size, end and offset (see :meth:`ShardIndex.from_bytes`), so a damaged file is
a :class:`~hydrax.shards.ShardFormatError` naming it, never a wrong read.

Files of the first format, ``hydrax-tar-index-v1`` (a NumPy ``.npz`` archive of the same arrays
with ``meta`` as a uint8 array holding the JSON, its ``"samples"`` the count), are still read.
"""

from __future__ import annotations

import io
import json
import logging
import mmap
import os
import struct
import sys
import zlib
from stat import S_ISREG
from typing import NamedTuple, Sequence

import numpy as np

from .. import _core
from ..errors import ObjectChangedError
from . import sizecolumn
from .indexcheck import INDEX_PROBLEMS, check_order, fault
from .sizecolumn import SizeColumn, SizeCounts
from .store import write_atomic
from .tarindex import Sample, ShardFormatError, group_samples, scan_error, scan_members

log = logging.getLogger(__name__)

FORMAT = "hydrax-tar-index-v2"
#: The format of an index with image sizes (v2 plus a width and a height per sample).
FORMAT_V3 = "hydrax-tar-index-v3"
FORMAT_V1 = "hydrax-tar-index-v1"
SUFFIX = ".hidx"
MAGIC = b"hydrax-tar-index"
#: Bytes at the start of a v2 index that :func:`count_samples` needs.
HEADER_SIZE = 64
_HEADER = struct.Struct("<16sIIqqqI12x")  # magic, version, meta length, samples, entries, key bytes, crc
_CRC_AT = 48
_ALIGN = 64
_ZIP_MAGIC = b"PK\x03\x04"
# name, dtype, which count sizes it: the arrays of a v2 file, in file order
_ARRAYS = (("key_bytes", "<u1", "keys"), ("key_ends", "<i8", "samples"), ("sample_ends", "<i8", "samples"),
           ("entry_field", "<i4", "entries"), ("entry_offset", "<i8", "entries"), ("entry_size", "<i8", "entries"))
_SIZES = (("width", sizecolumn.DTYPE, "samples"), ("height", sizecolumn.DTYPE, "samples"))  # after _ARRAYS, in v3
_ITEMSIZE = {"<u1": 1, "<i4": 4, "<i8": 8}
_KERNEL_SCAN_ERRORS = (1, 2, 3, 4, 8)  # index_tar statuses that are header errors; 6 and 7 go to the Python rules


def index_path(shard: str) -> str:
    """Where the index of the local shard ``shard`` lives."""
    return os.fspath(shard) + SUFFIX


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def _crc(data) -> int:
    """The checksum of a v2 file: header bytes 0-47, then everything after the header."""
    view = memoryview(data)
    return zlib.crc32(view[HEADER_SIZE:], zlib.crc32(view[:_CRC_AT]))


def _bad(where: str, problem: str, offset: int | None = None) -> ShardFormatError:
    """The error for a damaged index file ``where``; ``offset`` is the byte of the file at fault, when known."""
    at = f" at byte offset {offset} of the index" if offset is not None else ""
    # ``offset`` is in the index file, not in a shard: the words place it inside the detail.
    return ShardFormatError(f"not a readable hydrax index ({problem}{at}); delete it, or rebuild it with "
                            "`hydrax shards index --force`", url=where, offset=offset, subject=f"{where}: ")


class ShardIndex:
    """The samples of one shard: keys and field locations, in shard order.

    ``etag`` ties the index of a remote shard to the object version it was built from (None for
    local shards, which are tied to ``shard_size`` and ``shard_mtime_ns``). ``sizes`` holds the
    image sizes of one field of every sample, when recorded (:meth:`measure_sizes`), else None.
    """

    _old_format = False  # loaded from a v1 file: open_index rewrites it

    def __init__(self, shard_size: int, shard_mtime_ns: int, fields: Sequence[str], key_bytes: np.ndarray,
                 key_ends: np.ndarray, sample_ends: np.ndarray, entry_field: np.ndarray,
                 entry_offset: np.ndarray, entry_size: np.ndarray, etag: str | None = None,
                 sizes: SizeColumn | None = None) -> None:
        self.shard_size = int(shard_size)
        self.shard_mtime_ns = int(shard_mtime_ns)
        self.field_names = tuple(fields)
        self.etag = etag
        self._key_bytes = key_bytes
        self._key_ends = key_ends
        self._sample_ends = sample_ends
        self._entry_field = entry_field
        self._entry_offset = entry_offset
        self._entry_size = entry_size
        self.sizes = sizes

    @classmethod
    def from_samples(cls, samples: Sequence[Sample], shard_size: int, shard_mtime_ns: int,
                     etag: str | None = None) -> ShardIndex:
        """An index of ``samples`` (as :func:`group_samples` makes them)."""
        names: dict[str, int] = {}
        keys = [s.key.encode("utf-8", "surrogateescape") for s in samples]
        entries = [(names.setdefault(f, len(names)), o, n) for s in samples for f, (o, n) in s.fields.items()]
        table = np.array(entries, np.int64).reshape(-1, 3)
        return cls(
            shard_size, shard_mtime_ns, list(names),
            np.frombuffer(b"".join(keys), np.uint8).copy(),
            np.cumsum([len(k) for k in keys], dtype=np.int64),
            np.cumsum([len(s.fields) for s in samples], dtype=np.int64),
            table[:, 0].astype(np.int32), table[:, 1].copy(), table[:, 2].copy(), etag,
        )

    def __len__(self) -> int:
        return len(self._sample_ends)

    def key(self, i: int) -> str:
        """The key of sample ``i``."""
        start = int(self._key_ends[i - 1]) if i else 0
        return bytes(self._key_bytes[start : int(self._key_ends[i])]).decode("utf-8", "surrogateescape")

    def fields(self, i: int) -> dict[str, tuple[int, int]]:
        """``field -> (offset, size)`` of sample ``i``."""
        start = int(self._sample_ends[i - 1]) if i else 0
        end = int(self._sample_ends[i])
        names = self.field_names
        return {
            names[f]: (o, n)
            for f, o, n in zip(self._entry_field[start:end].tolist(), self._entry_offset[start:end].tolist(), self._entry_size[start:end].tolist())
        }

    def arrays(self) -> tuple[np.ndarray, ...]:
        """The index's arrays, in file order: ``key_bytes``, ``key_ends``, ``sample_ends``,
        ``entry_field``, ``entry_offset``, ``entry_size`` (see the module docstring)."""
        return self._key_bytes, self._key_ends, self._sample_ends, self._entry_field, self._entry_offset, self._entry_size

    def measure_sizes(self, data, field: str) -> ShardIndex:
        """Record the image sizes of every sample's ``field``, read from ``data``, the bytes of the
        shard (see :mod:`hydrax.shards.sizecolumn`); returns the index."""
        number = sizecolumn.field_number(self.field_names, field)
        self.sizes = SizeColumn(field, *sizecolumn.measure(data, self._sample_ends, self._entry_field, self._entry_offset,
                                                           self._entry_size, number))
        return self

    def size_counts(self) -> SizeCounts:
        """Samples with a size, without the field, and with an unreadable header (all zero without sizes)."""
        if self.sizes is None:
            return SizeCounts()
        number = sizecolumn.field_number(self.field_names, self.sizes.field)
        return sizecolumn.counts(self._sample_ends, self._entry_field, number, self.sizes.widths)

    def sample_spans(self) -> tuple[np.ndarray, np.ndarray]:
        """``(starts, ends)``: per sample, where its first field's payload starts and where its
        last one ends, so one read of ``[starts[i], ends[i])`` brings all of sample ``i``'s fields."""
        if not len(self):
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        firsts = np.concatenate(([0], self._sample_ends[:-1])).astype(np.intp)
        starts = np.minimum.reduceat(self._entry_offset, firsts).astype(np.int64)
        ends = np.maximum.reduceat(self._entry_offset + self._entry_size, firsts).astype(np.int64)
        return starts, ends

    def same_samples(self, other: ShardIndex) -> bool:
        """Whether ``other`` lists the same samples, fields, offsets and sizes (whatever the shard's time)."""
        mine = (self._key_bytes, self._key_ends, self._sample_ends, self._entry_field, self._entry_offset, self._entry_size)
        theirs = (other._key_bytes, other._key_ends, other._sample_ends, other._entry_field, other._entry_offset, other._entry_size)
        return self.field_names == other.field_names and all(np.array_equal(a, b) for a, b in zip(mine, theirs))

    # -- the file format ------------------------------------------------------------------------
    def to_bytes(self) -> bytes:
        """The index in the ``hydrax-tar-index-v2`` format, or v3 with image sizes (see the module
        docstring); the same index always gives the same bytes."""
        version = 2 if self.sizes is None else 3
        meta = {"format": FORMAT if version == 2 else FORMAT_V3, "shard_size": self.shard_size,
                "shard_mtime_ns": self.shard_mtime_ns, "etag": self.etag, "fields": list(self.field_names)}
        arrays = [*self.arrays()]
        if self.sizes is not None:
            meta["sizes_field"] = self.sizes.field
            arrays += [self.sizes.widths, self.sizes.heights]
        meta = json.dumps(meta).encode()
        parts, at = [meta], HEADER_SIZE + len(meta)
        for (_name, dtype, _count), array in zip(_ARRAYS + _SIZES, arrays):
            raw = np.ascontiguousarray(array, dtype).tobytes()
            parts += [bytes(_aligned(at) - at), raw]
            at = _aligned(at) + len(raw)
        body = b"".join(parts)
        counts = (len(meta), len(self), len(self._entry_field), len(self._key_bytes))
        unsealed = _HEADER.pack(MAGIC, version, *counts, 0)
        return _HEADER.pack(MAGIC, version, *counts, zlib.crc32(body, zlib.crc32(unsealed[:_CRC_AT]))) + body

    @classmethod
    def from_bytes(cls, data, where: str = "<index>") -> ShardIndex:
        """An index from the bytes of an index file (either format), checked throughout.

        The checksum, every array's size and place, that keys and samples end in order, that each
        sample has a field, that field numbers are in range and that every field lies inside the
        shard are all verified, and so are image sizes (none negative, a width of 0 exactly where
        the height is); anything wrong raises :class:`~hydrax.shards.ShardFormatError` naming
        ``where``. The arrays of a v2 or v3 index are views of ``data``, not copies.
        """
        head = bytes(data[: len(MAGIC)])
        if head == MAGIC:
            return cls._from_v2(data, where)
        if head.startswith(_ZIP_MAGIC):
            return cls._from_v1(data, where)
        raise _bad(where, "neither a hydrax-tar-index-v2 or v3 file nor a v1 .npz archive")

    @classmethod
    def _from_v2(cls, data, where: str) -> ShardIndex:
        if len(data) < HEADER_SIZE:
            raise _bad(where, f"{len(data)} bytes, shorter than the {HEADER_SIZE}-byte header")
        _magic, version, meta_length, samples, entries, keys, crc = _HEADER.unpack_from(data)
        if version not in (2, 3):
            raise _bad(where, f"format version {version}; this hydrax reads versions 1, 2 and 3", 16)
        if _crc(data) != crc:
            raise _bad(where, "checksum mismatch: the file is damaged or truncated")
        if min(samples, entries, keys) < 0:
            raise _bad(where, f"negative counts in the header ({samples} samples, {entries} entries, {keys} key bytes)", 24)
        counts = {"samples": samples, "entries": entries, "keys": keys}
        at, places = HEADER_SIZE + meta_length, []
        layout = _ARRAYS if version == 2 else _ARRAYS + _SIZES
        for _name, dtype, count in layout:
            at = _aligned(at)
            places.append(at)
            at += counts[count] * _ITEMSIZE[dtype]
        if at != len(data):
            raise _bad(where, f"{len(data)} bytes, but its header describes {at}", 20)
        try:
            meta = json.loads(bytes(memoryview(data)[HEADER_SIZE : HEADER_SIZE + meta_length]).decode())
        except UnicodeDecodeError as exc:
            raise _bad(where, f"its meta data is not UTF-8 text: {exc.reason}", HEADER_SIZE + exc.start) from None
        except json.JSONDecodeError as exc:
            raise _bad(where, f"its meta data is not JSON: {exc.msg}", HEADER_SIZE + exc.pos) from None
        expected = FORMAT if version == 2 else FORMAT_V3
        if not isinstance(meta, dict) or meta.get("format") != expected:
            raise _bad(where, f"meta data {str(meta)[:80]!r} is not of format {expected!r}", HEADER_SIZE)
        arrays = [np.frombuffer(data, dtype, counts[count], place) for (_n, dtype, count), place in zip(layout, places)]
        index = cls._checked(meta, arrays[:6], where, places)
        if version == 3:
            index.sizes = _checked_sizes(meta.get("sizes_field"), *arrays[6:], where, places[6:])
        return index

    @classmethod
    def _from_v1(cls, data, where: str) -> ShardIndex:
        names = [name for name, _dtype, _count in _ARRAYS]
        try:
            with np.load(io.BytesIO(bytes(data)), allow_pickle=False) as archive:
                meta = json.loads(bytes(archive["meta"]).decode())
                arrays = [archive[name] for name in names]
        except Exception as exc:  # zipfile, zlib, numpy and json each raise their own kinds
            raise _bad(where, f"{type(exc).__name__}: {exc}") from None
        if not isinstance(meta, dict) or meta.get("format") != FORMAT_V1:
            raise _bad(where, f"meta data {str(meta)[:80]!r} is not of format {FORMAT_V1!r}")
        for name, array, (_n, dtype, _count) in zip(names, arrays, _ARRAYS):
            want = np.dtype(dtype)
            if not isinstance(array, np.ndarray):  # a member that is not a .npy file reads as its raw bytes
                raise _bad(where, f"{name} is not a NumPy array")
            if array.ndim != 1 or (array.dtype.kind, array.dtype.itemsize) != (want.kind, want.itemsize):
                raise _bad(where, f"{name} is {array.dtype} of shape {array.shape}, not a list of {want}")
        if meta.get("samples") != len(arrays[2]):
            raise _bad(where, f"holds {len(arrays[2])} samples, its header says {meta.get('samples')!r}")
        meta.setdefault("etag", None)
        index = cls._checked(meta, [a.astype(dtype) for a, (_n, dtype, _c) in zip(arrays, _ARRAYS)], where)
        index._old_format = True
        return index

    @classmethod
    def _checked(cls, meta: dict, arrays: list[np.ndarray], where: str, places: list[int] | None = None) -> ShardIndex:
        """An index of ``arrays`` (in file order) after checking them against ``meta`` and each other;
        ``places`` (a v2 file's) are where the arrays start in the file, to name the byte at fault."""
        shard_size, mtime, etag, fields = (meta.get(k) for k in ("shard_size", "shard_mtime_ns", "etag", "fields"))
        meta_at = None if places is None else HEADER_SIZE
        if type(shard_size) is not int or type(mtime) is not int or not (0 <= shard_size < 1 << 62 and abs(mtime) < 1 << 63):
            raise _bad(where, f"shard size {shard_size!r} and modification time {mtime!r} must be whole numbers in range", meta_at)
        if etag is not None and not isinstance(etag, str):
            raise _bad(where, f"etag {etag!r} is not text", meta_at)
        if not isinstance(fields, list) or not all(isinstance(f, str) for f in fields) or len(set(fields)) != len(fields):
            raise _bad(where, f"fields {fields!r:.200} are not distinct names", meta_at)
        key_bytes, key_ends, sample_ends, entry_field, entry_offset, entry_size = arrays
        if sys.byteorder != "little":  # the kernel takes native integers; the files hold little-endian ones
            key_ends, sample_ends, entry_offset, entry_size = (a.astype(np.int64) for a in (key_ends, sample_ends, entry_offset, entry_size))
            entry_field = entry_field.astype(np.int32)
        problem = _core.check_index(key_ends, sample_ends, entry_field, entry_offset, entry_size, len(key_bytes),
                                    len(fields), shard_size)
        if not problem:
            problem = check_order(entry_offset, entry_size)
        if problem:
            at = fault(problem, arrays, len(fields), shard_size)
            offset = None if places is None or at is None else places[at[0]] + at[1] * _ITEMSIZE[_ARRAYS[at[0]][1]]
            raise _bad(where, INDEX_PROBLEMS.get(problem, f"problem {problem}").format(fields=len(fields), shard_size=shard_size),
                       offset)
        return cls(shard_size, mtime, fields, key_bytes, key_ends, sample_ends, entry_field, entry_offset, entry_size, etag=etag)

    def save(self, path: str) -> None:
        """Write the index to ``path`` atomically (a temporary file beside it, then a rename)."""
        write_atomic(path, self.to_bytes(), ".hidx-")

    @classmethod
    def load(cls, path: str) -> ShardIndex:
        """Read an index written by :meth:`save`, in either format (see :meth:`from_bytes`).

        A missing file raises ``FileNotFoundError``; one that cannot be read or is damaged,
        :class:`~hydrax.shards.ShardFormatError`.
        """
        try:
            with open(path, "rb", buffering=0) as f:  # unbuffered: one fstat and one read
                data = f.read()
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise _bad(os.fspath(path), f"cannot read it: {exc}") from None
        return cls.from_bytes(data, os.fspath(path))


def _checked_sizes(field, widths: np.ndarray, heights: np.ndarray, where: str, places: list[int]) -> SizeColumn:
    """The size column of a v3 file after checking it (``places``: where its two arrays start)."""
    if not isinstance(field, str):
        raise _bad(where, f"its image sizes are of field {field!r}, not a field name", HEADER_SIZE)
    if sys.byteorder != "little":
        widths, heights = widths.astype(np.int32), heights.astype(np.int32)
    bad = sizecolumn.first_bad(widths, heights)
    if bad is not None:
        width, height = int(widths[bad]), int(heights[bad])
        raise _bad(where, f"sample {bad} has an image size of {width} x {height}, which cannot be",
                   places[0 if width < 0 or (height >= 0 and width == 0) else 1] + 4 * bad)
    return SizeColumn(field, widths, heights)


def count_samples(source) -> int:
    """The sample count of an index, from its file's path or its first bytes.

    A v2 or v3 index needs only its first :data:`HEADER_SIZE` bytes (so a remote one needs one small
    ranged read), whose header is checked but not the rest; a v1 index is read whole.
    """
    if isinstance(source, (str, os.PathLike)):
        where = os.fspath(source)
        try:
            with open(where, "rb") as f:
                head = f.read(HEADER_SIZE)
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise _bad(where, f"cannot read it: {exc}") from None
        if head.startswith(_ZIP_MAGIC):
            return len(ShardIndex.load(where))
    else:
        where, head = "<index>", bytes(memoryview(source)[:HEADER_SIZE])
        if head.startswith(_ZIP_MAGIC):
            return len(ShardIndex.from_bytes(source, where))
    if len(head) < HEADER_SIZE or not head.startswith(MAGIC):
        raise _bad(where, "no hydrax-tar-index-v2 or v3 header")
    _magic, version, _meta, samples, entries, _keys, _crc32 = _HEADER.unpack(head)
    if version not in (2, 3) or not 0 <= samples <= entries:
        raise _bad(where, f"a header of version {version} with {samples} samples of {entries} fields")
    return samples


def _to_v1_bytes(index: ShardIndex) -> bytes:
    """``index`` in the old ``hydrax-tar-index-v1`` format: for tests and benchmarks of its reader."""
    meta = {"format": FORMAT_V1, "shard_size": index.shard_size, "shard_mtime_ns": index.shard_mtime_ns,
            "samples": len(index), "fields": list(index.field_names)}
    buffer = io.BytesIO()
    np.savez(buffer, meta=np.frombuffer(json.dumps(meta).encode(), np.uint8), key_bytes=index._key_bytes,
             key_ends=index._key_ends, sample_ends=index._sample_ends, entry_field=index._entry_field,
             entry_offset=index._entry_offset, entry_size=index._entry_size)
    return buffer.getvalue()


# -- building -----------------------------------------------------------------------------------

def index_from_bytes(data, url: str = "<buffer>", size: int | None = None, mtime_ns: int = 0,
                     etag: str | None = None, sizes: str | None = None) -> ShardIndex:
    """Index the tar shard whose bytes are ``data`` (bytes, mmap, memoryview).

    ``size`` (default ``len(data)``), ``mtime_ns`` and ``etag`` are recorded to tie the index to
    that version of the shard; with ``sizes``, a field name, the index records the image size of
    that field of every sample (:meth:`ShardIndex.measure_sizes`). The ``index_tar`` kernel scans and groups in one pass; a shard it
    leaves to Python (a field name with a non-ASCII byte, or a field twice in one sample) goes
    through :func:`~hydrax.shards.scan_members` and :func:`~hydrax.shards.group_samples`, which
    give the same index or raise the error, in the same words.
    """
    # Views are released before anything is raised (see scan_members).
    with memoryview(data) as raw, raw.cast("B") as view:
        length = len(view)
        result = _core.index_tar(view) if length else None
    if result is None:
        raise ShardFormatError("the shard is empty (re-download or rewrite it)", url=url, offset=0)
    size = length if size is None else size
    status, offset, fields, *arrays = result
    if status == 0:
        index = ShardIndex(size, mtime_ns, [f.decode("ascii") for f in fields], *arrays, etag=etag)
    elif status in _KERNEL_SCAN_ERRORS:
        raise scan_error(url, status, offset)
    else:
        index = ShardIndex.from_samples(group_samples(scan_members(data, url), url), size, mtime_ns, etag)
    return index if sizes is None else index.measure_sizes(data, sizes)


def _mapped(shard: str):
    """The local shard ``shard`` mapped read-only, with its ``os.stat_result``."""
    if not S_ISREG(os.stat(shard).st_mode):  # a folder, a device, a pipe: opening one can wait forever
        raise ShardFormatError("not a file (a shard is a tar file); check the path", url=shard)
    with open(shard, "rb") as f:
        stat = os.fstat(f.fileno())
        if stat.st_size == 0:
            raise ShardFormatError("the shard is empty (re-download or rewrite it)", url=shard, offset=0)
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ), stat


def _unmap(mapped: mmap.mmap) -> None:
    try:
        mapped.close()
    except BufferError:
        pass  # a view is still alive (in a traceback): unmapped when it goes


def build_index(shard: str, sizes: str | None = None) -> ShardIndex:
    """Index the local shard ``shard`` by scanning its headers (and, with ``sizes``, a field
    name, those of that field's images: see :func:`index_from_bytes`)."""
    shard = os.fspath(shard)
    mapped, stat = _mapped(shard)
    try:
        return index_from_bytes(mapped, shard, stat.st_size, stat.st_mtime_ns, sizes=sizes)
    finally:
        _unmap(mapped)


def measure_local_sizes(index: ShardIndex, shard: str, field: str) -> ShardIndex:
    """:meth:`ShardIndex.measure_sizes` of ``index``, from the local shard ``shard`` (mapped); a
    shard whose size is not the one indexed is an :class:`~hydrax.errors.ObjectChangedError`."""
    mapped, stat = _mapped(os.fspath(shard))
    try:
        if stat.st_size != index.shard_size:
            raise ObjectChangedError(f"the shard has {stat.st_size} bytes, its index was built for {index.shard_size}; "
                                     "index it again (hydrax shards index)", url=os.fspath(shard))
        return index.measure_sizes(mapped, field)
    finally:
        _unmap(mapped)


class IndexResult(NamedTuple):
    """What :func:`index_file` did for one shard."""

    #: samples newly indexed (0 when its index was current)
    samples: int
    #: why the shard could not be indexed, or None
    problem: str | None
    #: why an existing index was rebuilt (stale or damaged), or None
    rebuilt: str | None
    #: with ``sizes``: how the shard's image sizes came out (:class:`~hydrax.shards.sizecolumn.SizeCounts`)
    sizes: SizeCounts = SizeCounts()
    #: whether image sizes were added to an index that was otherwise current
    sizes_added: bool = False


def index_file(shard: str, force: bool = False, sizes: str | None = None) -> IndexResult:
    """Write the index of the local ``shard`` beside it unless it has a current one (or ``force``).

    What ``hydrax shards index`` runs for each shard, in worker processes or Ray tasks: a shard
    that cannot be indexed is reported in the result, not raised, so one bad shard does not stop
    the others. An index is current when it reads and was built for the shard's present size and
    modification time, as loaders demand (they rescan, or refuse, any other). With ``sizes``, a
    field name, the index must also hold that field's image sizes: a current index without them
    (or with another field's) gets them, read from the shard's image headers.
    """
    path = index_path(shard)
    try:
        index, why = (None, None) if force else _current_index(shard, path)
        if index is None:
            index = build_index(shard, sizes)
            index.save(path)
            return IndexResult(len(index), None, why, index.size_counts())
        if sizes is None or (index.sizes is not None and index.sizes.field == sizes):
            return IndexResult(0, None, None, index.size_counts() if sizes else SizeCounts())
        measure_local_sizes(index, shard, sizes).save(path)
        return IndexResult(0, None, None, index.size_counts(), True)
    except (OSError, ShardFormatError) as exc:
        return IndexResult(0, str(exc), None)


def _current_index(shard: str, path: str) -> tuple[ShardIndex | None, str | None]:
    """The current index ``path`` of ``shard``, or None and why an existing one will not do."""
    try:
        index = ShardIndex.load(path)
    except FileNotFoundError:
        return None, None
    except ShardFormatError as exc:
        return None, f"its index was damaged ({str(exc).removeprefix(f'{path}: ')})"
    stat = os.stat(shard)
    if (index.shard_size, index.shard_mtime_ns) == (stat.st_size, stat.st_mtime_ns):
        return index, None
    return None, (f"its index was stale (built for a shard of {index.shard_size} bytes modified at {index.shard_mtime_ns} ns; "
                  f"the shard has {stat.st_size} bytes, modified at {stat.st_mtime_ns} ns)")


def open_index(shard: str, *, write: bool = True) -> ShardIndex:
    """The index of the local shard ``shard``: read from beside it, or built (and written, with
    ``write``) when there is none. An index that no longer matches its shard is an error; one whose
    shard only has a new modification time (copied, checked out) is checked against the shard's
    headers and, when they agree, refreshed. With ``write``, an index in the old v1 format is
    rewritten in the current one."""
    shard = os.fspath(shard)
    path = index_path(shard)
    try:
        index = ShardIndex.load(path)
    except FileNotFoundError:
        index = build_index(shard)
        if write:
            try:
                index.save(path)
            except OSError as exc:  # a read-only data folder: the index serves from memory
                log.warning("could not write the index %s (%s); indexing %s in memory, again each time it is opened",
                            path, exc.strerror or exc, shard)
        return index
    stat = os.stat(shard)
    if (index.shard_size, index.shard_mtime_ns) == (stat.st_size, stat.st_mtime_ns):
        if write and index._old_format:
            try:
                index.save(path)  # in the current format, which loads about 10x faster
            except OSError:
                pass  # a read-only data folder: the old file still works
        return index
    if index.shard_size == stat.st_size:
        # A copy or a git checkout changes the modification time alone: let the headers decide.
        fresh = build_index(shard, index.sizes.field if index.sizes is not None else None)  # keeping its sizes
        if fresh.same_samples(index):
            if write:
                try:
                    fresh.save(path)  # with the new time, so the next open skips the scan
                except OSError:
                    pass  # a read-only data folder: scan again next time
            return fresh
    raise ShardFormatError(
        f"its index {path} was built for a shard of {index.shard_size} bytes modified at "
        f"{index.shard_mtime_ns} ns, but the shard now has {stat.st_size} bytes, modified at {stat.st_mtime_ns} ns, "
        "and other contents; delete the index, or rebuild it with `hydrax shards index`", url=path, subject=f"{shard}: "
    )
