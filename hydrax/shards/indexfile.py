"""Per-shard index files, and wids dataset descriptors.

An index lists a shard's samples: each sample's key and, per field, the payload's byte offset and
size, so a sample can be read with one positional read per field and no scan. It lives next to
the shard as ``<shard>.hidx`` and is tied to the shard's size and modification time.

File format (``hydrax-tar-index-v1``): a NumPy ``.npz`` archive (no pickles) holding

- ``meta``: UTF-8 JSON, ``{"format": "hydrax-tar-index-v1", "shard_size": int,
  "shard_mtime_ns": int, "samples": int, "fields": [field names]}``;
- ``key_bytes`` (uint8) and ``key_ends`` (int64, one per sample): the keys, UTF-8 encoded and
  concatenated;
- ``sample_ends`` (int64, one per sample): the end of each sample's run of entries;
- ``entry_field`` (int32), ``entry_offset`` (int64), ``entry_size`` (int64): one per (sample,
  field), the field as an index into ``meta["fields"]``.
"""

from __future__ import annotations

import io
import json
import mmap
import os
import tempfile
from typing import Sequence

import numpy as np

from .tarindex import Sample, ShardFormatError, group_samples, scan_members

FORMAT = "hydrax-tar-index-v1"
SUFFIX = ".hidx"
WIDS_KIND = "wids-shard-index-v1"


def index_path(shard: str) -> str:
    """Where the index of the local shard ``shard`` lives."""
    return os.fspath(shard) + SUFFIX


def _umask() -> int:
    """This process's umask, read without changing it (``os.umask`` would, for every thread)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022


class ShardIndex:
    """The samples of one shard: keys and field locations, in shard order."""

    def __init__(self, shard_size: int, shard_mtime_ns: int, fields: Sequence[str], key_bytes: np.ndarray,
                 key_ends: np.ndarray, sample_ends: np.ndarray, entry_field: np.ndarray,
                 entry_offset: np.ndarray, entry_size: np.ndarray) -> None:
        self.shard_size = int(shard_size)
        self.shard_mtime_ns = int(shard_mtime_ns)
        self.field_names = tuple(fields)
        self._key_bytes = key_bytes
        self._key_ends = key_ends
        self._sample_ends = sample_ends
        self._entry_field = entry_field
        self._entry_offset = entry_offset
        self._entry_size = entry_size

    @classmethod
    def from_samples(cls, samples: Sequence[Sample], shard_size: int, shard_mtime_ns: int) -> ShardIndex:
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
            table[:, 0].astype(np.int32), table[:, 1].copy(), table[:, 2].copy(),
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

    def same_samples(self, other: ShardIndex) -> bool:
        """Whether ``other`` lists the same samples, fields, offsets and sizes (whatever the shard's time)."""
        mine = (self._key_bytes, self._key_ends, self._sample_ends, self._entry_field, self._entry_offset, self._entry_size)
        theirs = (other._key_bytes, other._key_ends, other._sample_ends, other._entry_field, other._entry_offset, other._entry_size)
        return self.field_names == other.field_names and all(np.array_equal(a, b) for a, b in zip(mine, theirs))

    def save(self, path: str) -> None:
        """Write the index to ``path`` atomically (a temporary file beside it, then a rename)."""
        meta = {"format": FORMAT, "shard_size": self.shard_size, "shard_mtime_ns": self.shard_mtime_ns,
                "samples": len(self), "fields": list(self.field_names)}
        folder = os.path.dirname(os.path.abspath(path))
        fd, temporary = tempfile.mkstemp(prefix=".hidx-", dir=folder)
        try:
            # mkstemp makes the file private; an index is as readable as any file the user writes
            os.fchmod(fd, 0o666 & ~_umask())
            with os.fdopen(fd, "wb") as f:
                np.savez(f, meta=np.frombuffer(json.dumps(meta).encode(), np.uint8), key_bytes=self._key_bytes,
                         key_ends=self._key_ends, sample_ends=self._sample_ends, entry_field=self._entry_field,
                         entry_offset=self._entry_offset, entry_size=self._entry_size)
            os.replace(temporary, path)
        except BaseException:
            if os.path.exists(temporary):
                os.unlink(temporary)
            raise

    @classmethod
    def load(cls, path: str) -> ShardIndex:
        """Read an index written by :meth:`save`."""
        try:
            with open(path, "rb") as f, np.load(io.BytesIO(f.read()), allow_pickle=False) as arrays:
                meta = json.loads(bytes(arrays["meta"]).decode())
                if meta.get("format") != FORMAT:
                    raise ValueError(f"format {meta.get('format')!r}, expected {FORMAT!r}")
                index = cls(meta["shard_size"], meta["shard_mtime_ns"], meta["fields"], arrays["key_bytes"], arrays["key_ends"],
                            arrays["sample_ends"], arrays["entry_field"], arrays["entry_offset"], arrays["entry_size"])
        except (OSError, KeyError, ValueError) as exc:
            if isinstance(exc, FileNotFoundError):
                raise
            raise ShardFormatError(f"{path}: not a readable hydrax index ({exc}); delete it, or rebuild it with `hydrax shards index`") from exc
        if len(index) != meta["samples"]:
            raise ShardFormatError(f"{path}: holds {len(index)} samples, its header says {meta['samples']}; delete it to rebuild it")
        return index


def build_index(shard: str) -> ShardIndex:
    """Index the local shard ``shard`` by scanning its headers."""
    shard = os.fspath(shard)
    with open(shard, "rb") as f:
        stat = os.fstat(f.fileno())
        if stat.st_size == 0:
            raise ShardFormatError(f"{shard}: at byte offset 0: the shard is empty (re-download or rewrite it)")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            samples = group_samples(scan_members(mapped, shard), shard)
    return ShardIndex.from_samples(samples, stat.st_size, stat.st_mtime_ns)


def open_index(shard: str, *, write: bool = True) -> ShardIndex:
    """The index of the local shard ``shard``: read from beside it, or built (and written, with
    ``write``) when there is none. An index that no longer matches its shard is an error; one whose
    shard only has a new modification time (copied, checked out) is checked against the shard's
    headers and, when they agree, refreshed."""
    shard = os.fspath(shard)
    path = index_path(shard)
    try:
        index = ShardIndex.load(path)
    except FileNotFoundError:
        index = build_index(shard)
        if write:
            index.save(path)
        return index
    stat = os.stat(shard)
    if (index.shard_size, index.shard_mtime_ns) == (stat.st_size, stat.st_mtime_ns):
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
        f"{shard}: its index {path} was built for a shard of {index.shard_size} bytes modified at "
        f"{index.shard_mtime_ns} ns, but the shard now has {stat.st_size} bytes, modified at {stat.st_mtime_ns} ns, "
        "and other contents; delete the index, or rebuild it with `hydrax shards index --force`"
    )


def read_wids_descriptor(source: str | dict, base: str | None = None) -> list[tuple[str, int]]:
    """``(url, nsamples)`` of every shard of a wids ``wids-shard-index-v1`` descriptor.

    ``source`` is the descriptor's path or its parsed JSON. Relative shard URLs are resolved
    against the descriptor's ``base``, else ``base``, else the descriptor's own folder.
    """
    if isinstance(source, dict):
        descriptor, here = source, base or ""
    else:
        with open(source, encoding="utf-8") as f:
            descriptor = json.load(f)
        here = base or os.path.dirname(os.path.abspath(source))
    where = source if isinstance(source, str) else "the descriptor"
    if descriptor.get("__kind__") != WIDS_KIND or "wids_version" not in descriptor:
        raise ShardFormatError(f"{where}: not a {WIDS_KIND} descriptor (needs __kind__ {WIDS_KIND!r} and wids_version)")
    root = descriptor.get("base") or here
    shards = []
    for number, entry in enumerate(descriptor.get("shardlist", [])):
        if "url" not in entry or "nsamples" not in entry:
            raise ShardFormatError(f"{where}: shardlist entry {number} needs 'url' and 'nsamples', has {sorted(entry)}")
        url = entry["url"]
        if root and "://" not in url and not os.path.isabs(url):
            url = root.rstrip("/") + "/" + url
        shards.append((url, int(entry["nsamples"])))
    return shards
