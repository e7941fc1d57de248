"""ShardSet: the samples of a set of tar shards, as a Sequence a DataGroup can hold.

``DataGroup(256, ShardSet("data/train-{0000..0099}.tar"), loader_arrays=...)`` indexes every
shard once (reading ``<shard>.hidx`` beside it, or building and writing it), then behaves as a
sequence of light :class:`SampleRef` s. In a worker, ``sample["jpg"]`` is a zero-copy
``memoryview`` of that field's bytes in the shard, mapped once per process; nothing is opened or
pickled per item. Local paths, ``file://`` URLs, globs and brace ranges are understood, and so
are ``s3://bucket/key`` URLs: their indexes are built from one GET of each shard and kept in a
local cache (never written into the bucket), and each sample is one ranged GET (all its fields at
once) over a client reused by the process.
"""

from __future__ import annotations

import glob
import hashlib
import mmap
import os
from collections.abc import Mapping, Sequence
from typing import Iterator

import numpy as np

from . import s3
from .indexfile import ShardIndex, open_index
from .s3 import S3Options
from .tarindex import ShardFormatError, group_samples, scan_members


def default_cache_dir() -> str:
    """Where indexes of remote shards are kept: ``$HYDRAX_CACHE``, else ``~/.cache/hydrax``."""
    return os.environ.get("HYDRAX_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "hydrax")


def expand_urls(urls: str | Sequence[str], s3_options: S3Options | None = None) -> list[str]:
    """Shard URLs from brace ranges (``train-{0000..0099}.tar``), globs and lists, in order."""
    from braceexpand import braceexpand

    if isinstance(urls, (str, os.PathLike)):
        urls = [os.fspath(urls)]
    expanded: list[str] = []
    for spec in urls:
        for url in braceexpand(os.fspath(spec)):
            path = url[len("file://"):] if url.startswith("file://") else url
            if path.startswith("s3://"):
                if glob.has_magic(path):
                    matches = s3.glob(path, s3_options or S3Options())
                    if not matches:
                        raise FileNotFoundError(f"shard pattern {url!r} matches no object")
                    expanded.extend(matches)
                else:
                    expanded.append(path)
                continue
            if "://" in path:
                scheme = path.split("://", 1)[0]
                raise NotImplementedError(f"shard URL {url!r}: the {scheme}:// scheme is not supported; use local paths or s3://")
            if glob.has_magic(path):
                matches = sorted(glob.glob(path))
                if not matches:
                    raise FileNotFoundError(f"shard pattern {url!r} matches no file")
                expanded.extend(matches)
            else:
                expanded.append(path)
    if not expanded:
        raise ValueError(f"no shards in {urls!r}")
    return expanded


class ShardSet(Sequence["SampleRef"]):
    """The samples of the tar shards ``urls``, in shard order.

    :param urls: a path, ``file://`` or ``s3://`` URL, glob or brace pattern, or a list of them.
    :param write_index: write a missing index (or refresh one whose shard only has a new
        modification time): ``<shard>.hidx`` beside a local shard, or into
        ``cache_dir`` for a remote one (else only build it in memory).
    :param s3: endpoint, region and credentials for ``s3://`` shards (default: the standard AWS
        configuration).
    :param cache_dir: where indexes of remote shards are kept (default :func:`default_cache_dir`).
    """

    def __init__(self, urls: str | Sequence[str], *, write_index: bool = True, s3: S3Options | None = None,
                 cache_dir: str | None = None) -> None:
        self.s3 = s3 or S3Options()
        self.urls = expand_urls(urls, self.s3)
        self._remote = [url.startswith("s3://") for url in self.urls]
        cache = cache_dir or default_cache_dir()
        indexes = []
        for url, remote in zip(self.urls, self._remote):
            if remote:
                indexes.append(_remote_index(url, self.s3, cache, write_index))
                continue
            if not os.path.exists(url):
                raise FileNotFoundError(f"shard {url!r} does not exist (check the path or pattern)")
            indexes.append(open_index(url, write=write_index))
        self._indexes: list[ShardIndex] = indexes
        self._starts = np.cumsum([0] + [len(i) for i in indexes], dtype=np.int64)
        self._maps: dict[int, mmap.mmap] = {}
        self._remote_sample: tuple[int, int, int, memoryview] | None = None  # (shard, sample, offset, bytes)

    def __len__(self) -> int:
        return int(self._starts[-1])

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if not isinstance(index, (int, np.integer)):
            raise TypeError(f"ShardSet indices must be ints or slices, not {type(index).__name__}")
        total = len(self)
        position = int(index) + total if index < 0 else int(index)
        if not 0 <= position < total:
            raise IndexError(f"sample {index} is out of range for {total} samples")
        shard = int(np.searchsorted(self._starts, position, side="right")) - 1
        return SampleRef(self, shard, position - int(self._starts[shard]))

    def shard_sizes(self) -> list[int]:
        """Samples per shard."""
        return np.diff(self._starts).tolist()

    def _read(self, shard: int, sample: int, offset: int, size: int) -> memoryview:
        if self._remote[shard]:
            # One ranged GET brings all of a sample's fields (they are consecutive in the tar), so
            # a sample costs one round trip however many fields are read from it.
            cached = self._remote_sample
            if cached is None or cached[:2] != (shard, sample):
                spans = self._indexes[shard].fields(sample).values()
                first = min(o for o, _ in spans)
                end = max(o + n for o, n in spans)
                cached = self._remote_sample = (shard, sample, first, memoryview(s3.fetch(self.urls[shard], self.s3, first, end - first)))
            start = offset - cached[2]
            return cached[3][start : start + size]
        mapping = self._maps.get(shard)
        if mapping is None:
            url = self.urls[shard]
            with open(url, "rb") as f:
                if os.fstat(f.fileno()).st_size != self._indexes[shard].shard_size:
                    raise ShardFormatError(f"{url}: the shard changed since it was indexed; delete {url}.hidx and restart")
                mapping = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            self._maps[shard] = mapping
        return memoryview(mapping)[offset : offset + size]

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_maps"] = {}  # mappings are per process
        state["_remote_sample"] = None
        return state

    def __repr__(self) -> str:
        return f"ShardSet({len(self.urls)} shards, {len(self)} samples)"


def _remote_index(url: str, options: S3Options, cache: str, write: bool) -> ShardIndex:
    """The index of a remote shard: from the local cache while the object is unchanged, else
    built from one GET of the whole object."""
    size, mtime_ns = s3.head(url, options)
    path = os.path.join(cache, "index", hashlib.sha256(url.encode()).hexdigest()[:32] + ".hidx")
    try:
        index = ShardIndex.load(path)
        if (index.shard_size, index.shard_mtime_ns) == (size, mtime_ns):
            return index
    except (FileNotFoundError, ShardFormatError):
        pass
    data = s3.fetch(url, options)
    index = ShardIndex.from_samples(group_samples(scan_members(data, url), url), size, mtime_ns)
    if write:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        index.save(path)
    return index


class SampleRef(Mapping[str, memoryview]):
    """One sample of a :class:`ShardSet`: ``sample["jpg"]`` is that field's bytes (a memoryview).

    ``"__key__"`` and ``"__url__"`` give the key and the shard URL, as in WebDataset.
    """

    __slots__ = ("_set", "_shard", "_index")

    def __init__(self, shards: ShardSet, shard: int, index: int) -> None:
        self._set = shards
        self._shard = shard
        self._index = index

    @property
    def key(self) -> str:
        """The sample's key."""
        return self._set._indexes[self._shard].key(self._index)

    @property
    def url(self) -> str:
        """The URL of the shard the sample is in."""
        return self._set.urls[self._shard]

    @property
    def fields(self) -> dict[str, tuple[int, int]]:
        """``field -> (offset, size)`` within the shard."""
        return self._set._indexes[self._shard].fields(self._index)

    def __getitem__(self, field: str):
        if field == "__key__":
            return self.key
        if field == "__url__":
            return self.url
        try:
            offset, size = self.fields[field]
        except KeyError:
            raise KeyError(f"sample {self.key!r} in {self.url} has no field {field!r} (it has {sorted(self.fields)})") from None
        return self._set._read(self._shard, self._index, offset, size)

    def __iter__(self) -> Iterator[str]:
        return iter(self.fields)

    def __len__(self) -> int:
        return len(self.fields)

    def __repr__(self) -> str:
        return f"<sample {self.key!r} of {self.url}: {', '.join(self.fields)}>"
