"""One compact index for a whole set of local shards, in one file every process maps read-only.

A :class:`~hydrax.shards.ShardSet` of local shards gathers its shards' indexes (``<shard>.hidx``)
once into a set index, written atomically into ``<cache_dir>/sets/<digest>.hsix`` where the
digest is of the shards' absolute paths, in order. A later ShardSet of the same shards opens that
file instead of every ``.hidx``: it only checks, with one ``stat`` per shard, that every shard
still has the size and modification time the set index recorded (any difference, or a damaged
file, and the set index is built afresh from the shards' indexes, saying why in the log). The
arrays are views of a read-only mapping of the file, so the processes of a host share one copy
through the page cache, and a pickled set index is its path (a worker maps the file again).

File format ``hydrax-set-index-v1``, little-endian throughout:

- a 64-byte header: the magic ``b"hydrax-set-index"`` (16 bytes), the version (uint32, 1), the
  length of the meta text (uint32), the numbers of shards, samples, entries and key bytes
  (4 int64), a CRC-32 (uint32) of header bytes 0-55 followed by everything after the header,
  4 zero bytes;
- ``meta``: UTF-8 JSON, ``{"format": "hydrax-set-index-v1", "urls_sha256": hex digest,
  "fields": [field names of the whole set]}``;
- then, each starting at the next multiple of 64 bytes, the arrays (S shards, N samples, E
  entries, K key bytes): per shard ``shard_size``, ``shard_mtime_ns`` (int64, S);
  ``sample_start``, ``key_start``, ``entry_start`` (int64, S + 1: where each shard's samples,
  key bytes and entries begin in the arrays below, and the totals); per sample ``key_end`` and
  ``entry_end`` (int64, N: ends of the sample's key bytes and of its run of entries, counted from
  its shard's first, so a shard's slices of them are its own index's ``key_ends`` and
  ``sample_ends``); ``key_bytes`` (uint8, K: the keys, UTF-8); per entry ``entry_field`` (int32,
  E: an index into ``meta["fields"]``), ``entry_offset`` and ``entry_size`` (int64, E: the
  payload's place in the shard).

Format ``hydrax-set-index-v2`` is v1 with image sizes, written when every shard's index holds
them for the same field (see :mod:`hydrax.shards.sizecolumn`): the version is 2, ``meta`` is of
format ``"hydrax-set-index-v2"`` and has ``"sizes_field"``, and two more arrays follow, each at
the next multiple of 64 bytes: ``width`` and ``height`` (int32, N), the shards' columns end to
end. A set index without sizes is written as v1, as before; both are read, and the file's name
(the digest) is the same for either.

A sample's span (the bytes one read of all its fields covers) is not stored: its first entry's
offset and its last entry's end give it (:meth:`SetIndex.spans`), and only remote shards, which a
set index does not cover, read by spans; storing them would add 16 bytes per sample to a file
written on a first open.

Every shard index that goes into a set index was checked when it was loaded (see
:meth:`~hydrax.shards.ShardIndex.from_bytes`), and the checksum shows that the file has not
changed since; the process that opens the set index checks the checksum, processes that receive
it pickled check its size and checksum only (the same shards give the same bytes).
"""

from __future__ import annotations

import hashlib
import json
import logging
import mmap
import os
import struct
import zlib
from typing import Sequence

import numpy as np

from ..errors import ObjectChangedError, ShardFormatError
from . import sizecolumn
from .indexfile import ShardIndex
from .sizecolumn import SizeColumn

log = logging.getLogger(__name__)

FORMAT = "hydrax-set-index-v1"
#: The format of a set index with image sizes (v1 plus a width and a height per sample).
FORMAT_V2 = "hydrax-set-index-v2"
MAGIC = b"hydrax-set-index"
#: Set index files are named ``<digest>`` plus this suffix.
SUFFIX = ".hsix"
HEADER_SIZE = 64
_HEADER = struct.Struct("<16sIIqqqqI4x")  # magic, version, meta length, shards, samples, entries, key bytes, crc
_CRC_AT = 56
_ALIGN = 64
# name, dtype, the count that sizes it: the arrays of the file, in file order
_ARRAYS = (("shard_size", "<i8", "shards"), ("shard_mtime_ns", "<i8", "shards"), ("sample_start", "<i8", "shards+1"),
           ("key_start", "<i8", "shards+1"), ("entry_start", "<i8", "shards+1"), ("key_end", "<i8", "samples"), ("entry_end", "<i8", "samples"),
           ("key_bytes", "<u1", "keys"), ("entry_field", "<i4", "entries"), ("entry_offset", "<i8", "entries"),
           ("entry_size", "<i8", "entries"))
_SIZES = (("width", sizecolumn.DTYPE, "samples"), ("height", sizecolumn.DTYPE, "samples"))  # after _ARRAYS, in v2


def urls_digest(urls: Sequence[str]) -> str:
    """The hex digest that names the set index of the local shards ``urls`` (their absolute
    paths, in order, and the format)."""
    digest = hashlib.sha256(FORMAT.encode())
    if len(urls):
        # os.path.abspath of each, and one update: the same digest in half the time
        cwd, join, normpath = os.getcwd(), os.path.join, os.path.normpath
        paths = [normpath(url if url[:1] == "/" else join(cwd, url)) for url in urls]
        digest.update(("\0" + "\0".join(paths)).encode("utf-8", "surrogateescape"))
    return digest.hexdigest()


def set_index_path(cache_dir: str, digest: str) -> str:
    """Where the set index of the shards with digest ``digest`` (see :func:`urls_digest`) is kept."""
    return os.path.join(cache_dir, "sets", digest[:40] + SUFFIX)


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def _bad(where: str, problem: str) -> ShardFormatError:
    return ShardFormatError(f"not a readable hydrax set index ({problem}); it is rebuilt when deleted",
                            url=where, subject=f"{where}: ")


def _places(meta_length: int, counts: dict[str, int], layout=_ARRAYS) -> tuple[list[int], int]:
    """Where each array of ``layout`` starts in a file of ``counts``, and where the file ends."""
    at, places = HEADER_SIZE + meta_length, []
    for _name, dtype, count in layout:
        at = _aligned(at)
        places.append(at)
        at += counts[count] * np.dtype(dtype).itemsize
    return places, at


def _counts(shards: int, samples: int, entries: int, keys: int) -> dict[str, int]:
    return {"shards": shards, "shards+1": shards + 1, "samples": samples, "entries": entries, "keys": keys}


class SetIndex:
    """The samples of every shard of a set of local shards (see the module docstring).

    Made by :func:`build_set_index` or :meth:`open`; its arrays are read-only. Pickled, it is the
    path of its file (or, for one that could not be written, its bytes).
    """

    def __init__(self, data, where: str = "<set index>", *, verify: bool = True) -> None:
        self.path: str | None = None
        self._bind(data, where, verify)

    def _bind(self, data, where: str, verify: bool) -> None:
        self._data = data
        if len(data) < HEADER_SIZE:
            raise _bad(where, f"{len(data)} bytes, shorter than its header")
        magic, version, meta_length, shards, samples, entries, keys, crc = _HEADER.unpack_from(data)
        if magic != MAGIC or version not in (1, 2):
            raise _bad(where, f"magic {magic!r} and version {version}, not {MAGIC!r} 1 or 2")
        if min(shards, samples, entries, keys, meta_length) < 0:
            raise _bad(where, "negative counts in its header")
        layout = _ARRAYS if version == 1 else _ARRAYS + _SIZES
        places, end = _places(meta_length, _counts(shards, samples, entries, keys), layout)
        if end != len(data):
            raise _bad(where, f"{len(data)} bytes, but its header describes {end}")
        # The same shards give the same bytes, so processes that build a set index at once may
        # replace each other's file: what tells one content from another is its checksum.
        self._identity = (len(data), crc)
        if verify:
            view = memoryview(data)
            with view[:_CRC_AT] as head, view[HEADER_SIZE:] as body:
                if zlib.crc32(body, zlib.crc32(head)) != crc:
                    raise _bad(where, "checksum mismatch: the file is damaged or truncated")
            if isinstance(data, mmap.mmap) and hasattr(mmap, "MADV_DONTNEED"):
                # The check touched every page: unmap them from this process (they stay in the
                # page cache), so its memory shows only what it reads from now on.
                data.madvise(mmap.MADV_DONTNEED)
        try:
            meta = json.loads(bytes(data[HEADER_SIZE : HEADER_SIZE + meta_length]).decode())
            self.field_names = tuple(meta["fields"])
            self.digest = str(meta["urls_sha256"])
            sizes_field = str(meta["sizes_field"]) if version == 2 else None
        except (ValueError, KeyError, TypeError) as exc:
            raise _bad(where, f"its meta data cannot be read: {exc}") from None
        counts = _counts(shards, samples, entries, keys)
        for (name, dtype, count), place in zip(layout, places):
            setattr(self, name, np.frombuffer(data, dtype, counts[count], place))
        self._names = np.array(self.field_names, object)
        #: the image sizes of every sample of the set (views of the file), when recorded, else None
        self.sizes = SizeColumn(sizes_field, self.width, self.height) if version == 2 else None

    @classmethod
    def open(cls, path: str, *, verify: bool = True) -> SetIndex:
        """Map the set index file ``path`` read-only (checking its checksum with ``verify``).

        A missing file raises ``FileNotFoundError``; a damaged one, :class:`ShardFormatError`.
        """
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_size == 0:
                raise _bad(path, "the file is empty")
            data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        index = cls.__new__(cls)
        index.path = path
        index._bind(data, path, verify)
        return index

    def __len__(self) -> int:
        """The number of shards."""
        return len(self.shard_size)

    @property
    def samples(self) -> int:
        """The number of samples of the whole set."""
        return int(self.sample_start[-1])

    def nbytes(self) -> int:
        """The size of the index in bytes."""
        return len(self._data)

    def __getstate__(self):
        if self.path is None:
            return {"data": bytes(self._data)}
        return {"path": self.path, "identity": self._identity}

    def __setstate__(self, state):
        if "data" in state:
            self.path, self._identity = None, None
            self._bind(state["data"], "<set index>", False)
            return
        try:
            reopened = SetIndex.open(state["path"], verify=False)
        except (FileNotFoundError, ShardFormatError):
            reopened = None
        if reopened is None or reopened._identity != tuple(state["identity"]):
            raise ObjectChangedError("the set index was replaced or removed since this ShardSet opened it (were its "
                                     "shards changed?); open the ShardSet again", url=state["path"])
        self.__dict__.update(reopened.__dict__)

    # -- reading ---------------------------------------------------------------------------------
    def key(self, shard: int, i: int) -> str:
        """The key of sample ``i`` of shard number ``shard``."""
        at = int(self.sample_start[shard]) + i
        base = int(self.key_start[shard])
        start = base + (int(self.key_end[at - 1]) if i else 0)
        return bytes(self.key_bytes[start : base + int(self.key_end[at])]).decode("utf-8", "surrogateescape")

    def fields(self, shard: int, i: int) -> dict[str, tuple[int, int]]:
        """``field -> (offset, size)`` of sample ``i`` of shard number ``shard``."""
        at = int(self.sample_start[shard]) + i
        base = int(self.entry_start[shard])
        start, end = base + (int(self.entry_end[at - 1]) if i else 0), base + int(self.entry_end[at])
        names = self.field_names
        return {names[f]: (o, n) for f, o, n in zip(self.entry_field[start:end].tolist(),
                                                     self.entry_offset[start:end].tolist(),
                                                     self.entry_size[start:end].tolist())}

    def spans(self, shard: int) -> tuple[np.ndarray, np.ndarray]:
        """``(starts, ends)`` of the samples of shard number ``shard``, as
        :meth:`ShardIndex.sample_spans` gives them: a sample's entries are in shard order
        (checked when its shard's index was loaded), so its first starts it and its last ends it."""
        a, b = int(self.sample_start[shard]), int(self.sample_start[shard + 1])
        base = int(self.entry_start[shard])
        ends = self.entry_end[a:b] + base
        if not len(ends):
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        firsts = np.concatenate(([base], ends[:-1]))
        return self.entry_offset[firsts].astype(np.int64), self.entry_offset[ends - 1] + self.entry_size[ends - 1]

    def shard_index(self, shard: int) -> ShardIndex:
        """The :class:`ShardIndex` of shard number ``shard``, its arrays views of this one's (only
        the field numbers are copied, when the shard names fewer fields, or in another order,
        than the set)."""
        a, b = int(self.sample_start[shard]), int(self.sample_start[shard + 1])
        k0, k1 = int(self.key_start[shard]), int(self.key_start[shard + 1])
        e0, e1 = int(self.entry_start[shard]), int(self.entry_start[shard + 1])
        names, field = self._shard_fields(self.entry_field[e0:e1])
        sizes = None if self.sizes is None else SizeColumn(self.sizes.field, self.sizes.widths[a:b], self.sizes.heights[a:b])
        return ShardIndex(int(self.shard_size[shard]), int(self.shard_mtime_ns[shard]), names, self.key_bytes[k0:k1],
                          self.key_end[a:b], self.entry_end[a:b], field, self.entry_offset[e0:e1], self.entry_size[e0:e1],
                          sizes=sizes)

    def _shard_fields(self, field: np.ndarray) -> tuple[tuple[str, ...], np.ndarray]:
        """The field names of one shard, in the order it first has them (as its own index lists
        them), and its entries' field numbers into that list."""
        used, first = np.unique(field, return_index=True)
        order = used[np.argsort(first, kind="stable")]
        if len(order) == len(self.field_names) and (order == np.arange(len(order))).all():
            return self.field_names, field
        renumber = np.zeros(len(self.field_names), np.int32)
        renumber[order] = np.arange(len(order), dtype=np.int32)
        return tuple(self._names[order].tolist()), renumber[field]

    def changed(self, urls: Sequence[str]) -> str | None:
        """Why the set index no longer describes the local shards ``urls`` (a shard missing, or
        with another size or modification time than it recorded), or None when it still does."""
        if len(urls) != len(self):
            return f"it lists {len(self)} shards, not {len(urls)}"
        sizes = np.empty(len(urls), np.int64)
        times = np.empty(len(urls), np.int64)
        stat = os.stat
        for n, url in enumerate(urls):
            try:
                found = stat(url)
            except OSError as exc:
                return f"shard {url!r} cannot be read ({exc.strerror or exc})"
            sizes[n], times[n] = found.st_size, found.st_mtime_ns
        moved = np.flatnonzero((sizes != self.shard_size) | (times != self.shard_mtime_ns))
        if not len(moved):
            return None
        n = int(moved[0])
        return (f"{len(moved)} shard(s) changed since it was built, the first {urls[n]!r}: {int(self.shard_size[n])} bytes "
                f"modified at {int(self.shard_mtime_ns[n])} ns then, {int(sizes[n])} bytes modified at {int(times[n])} ns now")


# -- building -----------------------------------------------------------------------------------

#: Entries and samples gathered at once while writing a set index (the arrays of many small
#: shards are written together; the file is written without holding all of it in memory).
_CHUNK = 1 << 20
#: Which of :meth:`ShardIndex.arrays` each array of the file gathers.
_FROM_SHARDS = {"key_bytes": 0, "key_end": 1, "entry_end": 2, "entry_field": 3, "entry_offset": 4, "entry_size": 5}


def _tables(indexes: Sequence[ShardIndex]) -> tuple[list[str], dict[str, np.ndarray], list[np.ndarray | None]]:
    """The set-wide field names, the per-shard arrays, and for each shard the table that renumbers
    its field numbers into the set's (None where they are the same)."""
    numbers: dict[str, int] = {}
    known: dict[tuple[str, ...], np.ndarray | None] = {}
    renumber = []
    for index in indexes:
        names = index.field_names
        if names not in known:
            table = np.array([numbers.setdefault(name, len(numbers)) for name in names], np.int32)
            known[names] = None if (table == np.arange(len(table))).all() else table
        renumber.append(known[names])
    shards = len(indexes)

    def starts(column: int) -> np.ndarray:
        counts = np.fromiter((len(i.arrays()[column]) for i in indexes), np.int64, shards)
        return np.concatenate(([0], np.cumsum(counts))).astype("<i8")

    small = {"shard_size": np.fromiter((i.shard_size for i in indexes), "<i8", shards),
             "shard_mtime_ns": np.fromiter((i.shard_mtime_ns for i in indexes), "<i8", shards),
             "sample_start": starts(2), "key_start": starts(0), "entry_start": starts(3)}
    return list(numbers), small, renumber


def _sizes_field(indexes: Sequence[ShardIndex]) -> str | None:
    """The field whose image sizes every one of ``indexes`` holds, or None (some have none, or another field's)."""
    fields = {None if index.sizes is None else index.sizes.field for index in indexes}
    return fields.pop() if len(fields) == 1 else None


def _pieces(indexes: Sequence[ShardIndex], renumber: list, small: dict[str, np.ndarray], name: str):
    """The array ``name`` of the file, in pieces of consecutive shards (about :data:`_CHUNK` items each)."""
    if name in ("width", "height"):
        def part(n: int) -> np.ndarray:
            sizes = indexes[n].sizes
            return sizes.widths if name == "width" else sizes.heights
    else:
        column = _FROM_SHARDS[name]

        def part(n: int) -> np.ndarray:
            array = indexes[n].arrays()[column]
            return array if column != 3 or renumber[n] is None else renumber[n][array]
    weight = small["sample_start"] + small["entry_start"]
    first = 0
    while first < len(indexes):
        last = max(first + 1, int(np.searchsorted(weight, weight[first] + _CHUNK, side="right")) - 1)
        parts = [part(n) for n in range(first, min(last, len(indexes)))]
        yield parts[0] if len(parts) == 1 else np.concatenate(parts)
        first = last


def _write(f, indexes: Sequence[ShardIndex], digest: str) -> None:
    """Write the set index of ``indexes`` to the binary file ``f`` (positioned at its start)."""
    fields, small, renumber = _tables(indexes)
    sizes_field = _sizes_field(indexes)
    version, layout = (1, _ARRAYS) if sizes_field is None else (2, _ARRAYS + _SIZES)
    meta = {"format": FORMAT if version == 1 else FORMAT_V2, "urls_sha256": digest, "fields": fields}
    if sizes_field is not None:
        meta["sizes_field"] = sizes_field
    meta = json.dumps(meta).encode()
    counts = (len(indexes), int(small["sample_start"][-1]), int(small["entry_start"][-1]), int(small["key_start"][-1]))
    unsealed = _HEADER.pack(MAGIC, version, len(meta), *counts, 0)
    f.write(unsealed)
    crc, at = zlib.crc32(meta, zlib.crc32(unsealed[:_CRC_AT])), HEADER_SIZE + len(meta)
    f.write(meta)
    for name, dtype, _count in layout:
        pad = bytes(_aligned(at) - at)
        crc = zlib.crc32(pad, crc)
        f.write(pad)
        at = _aligned(at)
        for piece in [small[name]] if name in small else _pieces(indexes, renumber, small, name):
            raw = memoryview(np.ascontiguousarray(piece, dtype)).cast("B")
            crc = zlib.crc32(raw, crc)
            f.write(raw)
            at += len(raw)
    f.seek(0)
    f.write(_HEADER.pack(MAGIC, version, len(meta), *counts, crc))


def set_index_bytes(indexes: Sequence[ShardIndex], digest: str) -> bytes:
    """The set index of the shard indexes ``indexes`` (in shard order), as the bytes of its file."""
    import io

    buffer = io.BytesIO()
    _write(buffer, indexes, digest)
    return buffer.getvalue()


def write_set_index(path: str, indexes: Sequence[ShardIndex], digest: str) -> None:
    """Write the set index of ``indexes`` to ``path`` atomically (a temporary file beside it, then
    a rename; as readable as any file the user writes). Raises ``OSError`` when it cannot."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    temporary = os.path.join(folder, f".hsix-{os.getpid()}-{os.urandom(6).hex()}")
    # os.open applies the umask to 0o666, as for any file the user writes (mkstemp's would be private)
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            _write(f, indexes, digest)
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise


def build_set_index(indexes: Sequence[ShardIndex], digest: str, path: str | None = None) -> SetIndex:
    """The set index of ``indexes`` (shard order), written to ``path`` and mapped from there; held
    in memory instead when ``path`` is None or cannot be written (saying so in the log)."""
    if path is not None:
        try:
            write_set_index(path, indexes, digest)
        except OSError as exc:
            log.warning("could not write the set index %s (%s); holding it in memory, so it is built again by each "
                        "ShardSet of these shards and sent whole to workers started from the fork server",
                        path, exc.strerror or exc)
        else:
            return SetIndex.open(path, verify=False)
    return SetIndex(set_index_bytes(indexes, digest), verify=False)
