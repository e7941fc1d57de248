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
from .store import write_atomic
from .tarindex import Sample, ShardFormatError, group_samples, scan_error, scan_members

log = logging.getLogger(__name__)

FORMAT = "hydrax-tar-index-v2"
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
_OUT_OF_ORDER = 6  # found by _check_order, after check_index
_TAR_BLOCK = 512
_SMALL = 40  # entries up to which _check_order runs in Python
_INDEX_PROBLEMS = {  # what _core.check_index finds
    1: "its keys do not end in order inside the key bytes",
    2: "its samples do not end in order, each after at least one field",
    3: "field numbers outside the {fields} fields it names",
    4: "a field lies outside the shard of {shard_size} bytes",
    5: "its arrays of samples, or of fields, differ in length",
    _OUT_OF_ORDER: "fields overlap, or are not in the order of the shard, each after its 512-byte tar header",
}
_ITEMSIZE = {"<u1": 1, "<i4": 4, "<i8": 8}
_KERNEL_SCAN_ERRORS = (1, 2, 3, 4, 8)  # index_tar statuses that are header errors; 6 and 7 go to the Python rules


def _check_order(entry_offset: np.ndarray, entry_size: np.ndarray) -> int:
    """:data:`_OUT_OF_ORDER` unless every field's bytes start on a tar block after a header (so at
    512 or later) and after the blocks of the field before: how any tar lays out its members."""
    if not len(entry_offset):
        return 0
    if len(entry_offset) <= _SMALL:
        # the same rule in plain Python, which beats numpy's cost per call on small shards
        end = 0  # where the blocks of the field before end (no field: its header needs the first block)
        for offset, size in zip(entry_offset.tolist(), entry_size.tolist()):
            if offset % _TAR_BLOCK or offset < end + _TAR_BLOCK:
                return _OUT_OF_ORDER
            end = -(-(offset + size) // _TAR_BLOCK) * _TAR_BLOCK
        return 0
    # check_index bounded every field by the shard's size (< 2**62), so these sums cannot overflow
    blocks_end = -(-(entry_offset + entry_size) // _TAR_BLOCK) * _TAR_BLOCK
    if entry_offset[0] < _TAR_BLOCK or (entry_offset % _TAR_BLOCK).any() or (entry_offset[1:] < blocks_end[:-1] + _TAR_BLOCK).any():
        return _OUT_OF_ORDER
    return 0


def _first(bad: np.ndarray) -> int | None:
    found = np.flatnonzero(bad)
    return int(found[0]) if len(found) else None


def _fault(problem: int, arrays: list[np.ndarray], fields: int, shard_size: int) -> tuple[int, int] | None:
    """(array number in file order, item) at which the arrays show ``problem``, or None when no one
    item is at fault; only called once a problem is found, so it may take its time."""
    _keys, key_ends, sample_ends, entry_field, entry_offset, entry_size = (a.astype(np.int64) for a in arrays)
    if problem in (1, 2):  # an end that falls back (or, for samples, stands still), else the last, which is not the total
        ends = key_ends if problem == 1 else sample_ends
        steps = np.diff(ends, prepend=0)
        fell = _first(steps < 0 if problem == 1 else steps <= 0)
        found = (problem, fell if fell is not None else len(ends) - 1) if len(ends) else None
    elif problem == 3:
        found = (3, _first((entry_field < 0) | (entry_field >= fields)))
    elif problem == 4:
        negative = _first(entry_offset < 0)
        # with no negative offset, shard_size - entry_offset cannot overflow
        found = (4, negative) if negative is not None else (5, _first((entry_size < 0) | (entry_size > shard_size - entry_offset)))
    elif problem == _OUT_OF_ORDER and len(entry_offset):
        blocks_end = -(-(entry_offset + entry_size) // _TAR_BLOCK) * _TAR_BLOCK
        early = np.r_[entry_offset[0] < _TAR_BLOCK, entry_offset[1:] < blocks_end[:-1] + _TAR_BLOCK]
        found = (4, _first(early | (entry_offset % _TAR_BLOCK != 0)))
    else:
        found = None
    return found if found is not None and found[1] is not None else None


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
    local shards, which are tied to ``shard_size`` and ``shard_mtime_ns``).
    """

    _old_format = False  # loaded from a v1 file: open_index rewrites it

    def __init__(self, shard_size: int, shard_mtime_ns: int, fields: Sequence[str], key_bytes: np.ndarray,
                 key_ends: np.ndarray, sample_ends: np.ndarray, entry_field: np.ndarray,
                 entry_offset: np.ndarray, entry_size: np.ndarray, etag: str | None = None) -> None:
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
        """The index in the ``hydrax-tar-index-v2`` format (see the module docstring); the same
        index always gives the same bytes."""
        meta = json.dumps({"format": FORMAT, "shard_size": self.shard_size, "shard_mtime_ns": self.shard_mtime_ns,
                           "etag": self.etag, "fields": list(self.field_names)}).encode()
        arrays = (self._key_bytes, self._key_ends, self._sample_ends, self._entry_field, self._entry_offset, self._entry_size)
        parts, at = [meta], HEADER_SIZE + len(meta)
        for (_name, dtype, _count), array in zip(_ARRAYS, arrays):
            raw = np.ascontiguousarray(array, dtype).tobytes()
            parts += [bytes(_aligned(at) - at), raw]
            at = _aligned(at) + len(raw)
        body = b"".join(parts)
        counts = (len(meta), len(self), len(self._entry_field), len(self._key_bytes))
        unsealed = _HEADER.pack(MAGIC, 2, *counts, 0)
        return _HEADER.pack(MAGIC, 2, *counts, zlib.crc32(body, zlib.crc32(unsealed[:_CRC_AT]))) + body

    @classmethod
    def from_bytes(cls, data, where: str = "<index>") -> ShardIndex:
        """An index from the bytes of an index file (either format), checked throughout.

        The checksum, every array's size and place, that keys and samples end in order, that each
        sample has a field, that field numbers are in range and that every field lies inside the
        shard are all verified; anything wrong raises :class:`~hydrax.shards.ShardFormatError`
        naming ``where``. The arrays of a v2 index are views of ``data``, not copies.
        """
        head = bytes(data[: len(MAGIC)])
        if head == MAGIC:
            return cls._from_v2(data, where)
        if head.startswith(_ZIP_MAGIC):
            return cls._from_v1(data, where)
        raise _bad(where, "neither a hydrax-tar-index-v2 file nor a v1 .npz archive")

    @classmethod
    def _from_v2(cls, data, where: str) -> ShardIndex:
        if len(data) < HEADER_SIZE:
            raise _bad(where, f"{len(data)} bytes, shorter than the {HEADER_SIZE}-byte header")
        _magic, version, meta_length, samples, entries, keys, crc = _HEADER.unpack_from(data)
        if version != 2:
            raise _bad(where, f"format version {version}; this hydrax reads versions 1 and 2", 16)
        if _crc(data) != crc:
            raise _bad(where, "checksum mismatch: the file is damaged or truncated")
        if min(samples, entries, keys) < 0:
            raise _bad(where, f"negative counts in the header ({samples} samples, {entries} entries, {keys} key bytes)", 24)
        counts = {"samples": samples, "entries": entries, "keys": keys}
        at, places = HEADER_SIZE + meta_length, []
        for _name, dtype, count in _ARRAYS:
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
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            raise _bad(where, f"meta data {str(meta)[:80]!r} is not of format {FORMAT!r}", HEADER_SIZE)
        arrays = [np.frombuffer(data, dtype, counts[count], place) for (_n, dtype, count), place in zip(_ARRAYS, places)]
        return cls._checked(meta, arrays, where, places)

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
            problem = _check_order(entry_offset, entry_size)
        if problem:
            at = _fault(problem, arrays, len(fields), shard_size)
            offset = None if places is None or at is None else places[at[0]] + at[1] * _ITEMSIZE[_ARRAYS[at[0]][1]]
            raise _bad(where, _INDEX_PROBLEMS.get(problem, f"problem {problem}").format(fields=len(fields), shard_size=shard_size),
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


def count_samples(source) -> int:
    """The sample count of an index, from its file's path or its first bytes.

    A v2 index needs only its first :data:`HEADER_SIZE` bytes (so a remote one needs one small
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
        raise _bad(where, "no hydrax-tar-index-v2 header")
    _magic, version, _meta, samples, entries, _keys, _crc32 = _HEADER.unpack(head)
    if version != 2 or not 0 <= samples <= entries:
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
                     etag: str | None = None) -> ShardIndex:
    """Index the tar shard whose bytes are ``data`` (bytes, mmap, memoryview).

    ``size`` (default ``len(data)``), ``mtime_ns`` and ``etag`` are recorded to tie the index to
    that version of the shard. The ``index_tar`` kernel scans and groups in one pass; a shard it
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
        return ShardIndex(size, mtime_ns, [f.decode("ascii") for f in fields], *arrays, etag=etag)
    if status in _KERNEL_SCAN_ERRORS:
        raise scan_error(url, status, offset)
    return ShardIndex.from_samples(group_samples(scan_members(data, url), url), size, mtime_ns, etag)


def build_index(shard: str) -> ShardIndex:
    """Index the local shard ``shard`` by scanning its headers."""
    shard = os.fspath(shard)
    if not S_ISREG(os.stat(shard).st_mode):  # a folder, a device, a pipe: opening one can wait forever
        raise ShardFormatError("not a file (a shard is a tar file); check the path", url=shard)
    with open(shard, "rb") as f:
        stat = os.fstat(f.fileno())
        if stat.st_size == 0:
            raise ShardFormatError("the shard is empty (re-download or rewrite it)", url=shard, offset=0)
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        return index_from_bytes(mapped, shard, stat.st_size, stat.st_mtime_ns)
    finally:
        try:
            mapped.close()
        except BufferError:
            pass  # a view is still alive (in a traceback): unmapped when it goes


class IndexResult(NamedTuple):
    """What :func:`index_file` did for one shard."""

    #: samples newly indexed (0 when its index was current)
    samples: int
    #: why the shard could not be indexed, or None
    problem: str | None
    #: why an existing index was rebuilt (stale or damaged), or None
    rebuilt: str | None


def index_file(shard: str, force: bool = False) -> IndexResult:
    """Write the index of the local ``shard`` beside it unless it has a current one (or ``force``).

    What ``hydrax shards index`` runs for each shard, in worker processes or Ray tasks: a shard
    that cannot be indexed is reported in the result, not raised, so one bad shard does not stop
    the others. An index is current when it reads and was built for the shard's present size and
    modification time, as loaders demand (they rescan, or refuse, any other).
    """
    path = index_path(shard)
    try:
        needed, why = (True, None) if force else _needs_index(shard, path)
        if needed:
            index = build_index(shard)
            index.save(path)
            return IndexResult(len(index), None, why)
        return IndexResult(0, None, None)
    except (OSError, ShardFormatError) as exc:
        return IndexResult(0, str(exc), None)


def _needs_index(shard: str, path: str) -> tuple[bool, str | None]:
    """Whether ``shard`` needs its index ``path`` built, and why an existing one will not do."""
    try:
        index = ShardIndex.load(path)
    except FileNotFoundError:
        return True, None
    except ShardFormatError as exc:
        return True, f"its index was damaged ({str(exc).removeprefix(f'{path}: ')})"
    stat = os.stat(shard)
    if (index.shard_size, index.shard_mtime_ns) == (stat.st_size, stat.st_mtime_ns):
        return False, None
    return True, (f"its index was stale (built for a shard of {index.shard_size} bytes modified at {index.shard_mtime_ns} ns; "
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
        fresh = build_index(shard)
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
