"""ShardSet: the samples of a set of tar shards, as a Sequence a DataGroup can hold.

``DataGroup(256, ShardSet("data/train-{0000..0099}.tar"), loader_arrays=...)`` finds every
shard's index once (see :mod:`hydrax.shards.catalog`: beside local shards, from index objects or
a manifest for remote ones, never by reading the data when those exist), then behaves as a
sequence of light :class:`SampleRef` s. In a worker, ``sample["jpg"]`` is a zero-copy
``memoryview`` of that field's bytes: from a mapping of the local shard (at most ``max_open``
mappings per process, least recently used closed first, so 10,000 shards fit under ``ulimit -n
1024``), or, for remote shards, from what the main process read ahead
(:mod:`hydrax.shards.readahead`), else from one ranged request that brings all of the sample's
fields. Remote reads are pinned to the version each shard was indexed at.
"""

from __future__ import annotations

import mmap
import os
import weakref
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any, Iterator

import numpy as np

from ..errors import FieldNotFoundError, ObjectChangedError
from .catalog import ShardEntry, default_cache_dir, expand_urls, load_index, load_index_async, resolve
from .indexfile import ShardIndex
from .readahead import Fetcher, LocalFiles, ReadAhead, ShardLayout, finalizer, private_root
from .store import GCSOptions, HTTPOptions, S3Options, StoreOptions, is_remote, store_for

__all__ = ["SampleRef", "ShardSet", "default_cache_dir", "expand_urls"]

#: Local shard mappings a process keeps open at most (each holds one file descriptor).
MAX_OPEN = 128


class ShardSet(Sequence["SampleRef"]):
    """The samples of the tar shards ``urls``, in shard order.

    :param urls: a path, ``file://``, ``s3://``, ``gs://`` or ``http(s)://`` URL, glob or brace
        pattern, or a list of them; or one dataset manifest (a wids ``wids-shard-index-v1``
        ``.json`` descriptor, local or remote), which sets up with a single request.
    :param write_index: write a missing index (or refresh one whose shard only has a new
        modification time): ``<shard>.hidx`` beside a local shard, or into ``cache_dir`` for a
        remote one (nothing is ever written into a bucket; ``hydrax shards index`` does that).
    :param s3: endpoint, region and credentials for ``s3://`` shards (default: the standard AWS
        configuration). ``gcs`` and ``http`` likewise for ``gs://`` and ``http(s)://``.
    :param cache_dir: where indexes of remote shards are kept (default :func:`default_cache_dir`).
    :param readahead: how remote shards are read ahead (:class:`~hydrax.shards.readahead.ReadAhead`);
        memory is bounded by its ``max_bytes``.
    :param max_open: local shard mappings kept open per process.
    """

    def __init__(self, urls: str | Sequence[str], *, write_index: bool = True, s3: S3Options | None = None,
                 gcs: GCSOptions | None = None, http: HTTPOptions | None = None, cache_dir: str | None = None,
                 readahead: ReadAhead | None = None, max_open: int = MAX_OPEN) -> None:
        if not isinstance(max_open, int) or max_open < 1:
            raise ValueError(f"ShardSet(max_open=...) must be a positive int, got {max_open!r}")
        self.options = StoreOptions(s3 or S3Options(), gcs or GCSOptions(), http or HTTPOptions())
        self.cache_dir = cache_dir or default_cache_dir()
        self.readahead = readahead or ReadAhead()
        self.max_open = max_open
        self._write_index = write_index
        self._entries: list[ShardEntry] = resolve(urls, self.options, self.cache_dir, write_index)
        self.urls = [e.url for e in self._entries]
        self._remote = [is_remote(url) for url in self.urls]
        self._remote_mask = np.asarray(self._remote, bool)
        self._starts = np.cumsum([0] + [e.samples for e in self._entries], dtype=np.int64)
        self._root: str | None = None
        if any(self._remote) and self.readahead.enabled:
            if self.readahead.cache_dir is not None:
                self._root = os.path.join(self.readahead.cache_dir, "data")
            else:
                self._root = private_root()
                finalizer(self, self._root)
        self._init_process_state()

    def _init_process_state(self) -> None:
        self._maps: OrderedDict[int, mmap.mmap] = OrderedDict()
        self._layouts: dict[int, ShardLayout] = {}
        self._files = LocalFiles(self.max_open)
        self._remote_sample: tuple[int, int, int, Any] | None = None  # (shard, sample, offset, bytes)
        self._fetcher: Fetcher | None = None

    @property
    def s3(self) -> S3Options:
        """The ``s3://`` settings in use."""
        return self.options.s3

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

    def index(self, shard: int) -> ShardIndex:
        """The index of shard number ``shard`` (loaded on first use for shards named by a manifest)."""
        entry = self._entries[shard]
        return entry.index if entry.index is not None else load_index(entry, self.options, self.cache_dir, self._write_index)

    def shard_entry(self, shard: int) -> ShardEntry:
        """URL, size, version and sample count of shard number ``shard``."""
        return self._entries[shard]

    def locate(self, indices) -> tuple[np.ndarray, np.ndarray]:
        """(shard, sample within the shard) of each of the item ``indices``."""
        items = np.asarray(indices, np.int64)
        shards = np.searchsorted(self._starts, items, side="right") - 1
        return shards, items - self._starts[shards]

    # -- reading -----------------------------------------------------------------------------
    def _read(self, shard: int, sample: int, offset: int, size: int) -> memoryview:
        if self._remote[shard]:
            return self._read_remote(shard, sample, offset, size)
        mapping = self._maps.get(shard)
        if mapping is None:
            mapping = self._map(shard)
        else:
            self._maps.move_to_end(shard)
        return memoryview(mapping)[offset : offset + size]

    def _map(self, shard: int) -> mmap.mmap:
        url = self.urls[shard]
        with open(url, "rb") as f:
            if os.fstat(f.fileno()).st_size != self.index(shard).shard_size:
                raise ObjectChangedError(f"the shard changed since it was indexed; delete {url}.hidx and restart", url=url)
            mapping = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self._maps[shard] = mapping
        while len(self._maps) > self.max_open:
            # Dropping the last reference closes the mapping and its descriptor (a view a loader
            # still holds keeps it open until that view goes).
            self._maps.popitem(last=False)
        return mapping

    def layout(self, shard: int) -> ShardLayout:
        """Where shard ``shard``'s samples are, and where read-ahead puts them."""
        layout = self._layouts.get(shard)
        if layout is None:
            self.index(shard)
            layout = self._make_layout(shard)
        return layout

    async def layout_async(self, shard: int) -> ShardLayout:
        """:meth:`layout` from an event loop (read-ahead loads many indexes at once)."""
        layout = self._layouts.get(shard)
        if layout is None:
            entry = self._entries[shard]
            if entry.index is None:
                await load_index_async(entry, self.options, self.cache_dir, self._write_index)
            layout = self._make_layout(shard)
        return layout

    def _make_layout(self, shard: int) -> ShardLayout:
        entry = self._entries[shard]
        starts, ends = entry.index.sample_spans()
        layout = self._layouts[shard] = ShardLayout(entry.url, entry.version, starts, ends, self._root or "")
        return layout

    def _read_remote(self, shard: int, sample: int, offset: int, size: int):
        # A sample's fields are consecutive in the tar: one read brings all of them.
        cached = self._remote_sample
        if cached is None or cached[:2] != (shard, sample):
            layout = self.layout(shard)
            found = self._files.find(layout, sample) if self._root else None
            if found is None:
                start, end = int(layout.starts[sample]), int(layout.ends[sample])
                data = store_for(layout.url, self.options).read(layout.url, start, end - start, version=layout.version)
                found = (data, start)
            cached = self._remote_sample = (shard, sample, found[1], memoryview(found[0]))
        start = offset - cached[2]
        return cached[3][start : start + size]

    # -- read-ahead (the Dataloader calls these in the main process) -------------------------
    def prefetch(self, key: Any, indices, order: str) -> None:
        """Items ``indices`` will be read soon, for batch ``key``, in ``order`` (``"sequential"``,
        ``"shardwise"`` or ``"random"``): fetch their remote shards or samples ahead."""
        if self._root is None:
            return
        shards, samples = self.locate(indices)
        remote = self._remote_mask[shards]
        if not remote.any():
            return
        if self._fetcher is None:
            # The fetcher's thread must not keep the ShardSet alive: it sees it through weak references.
            me = weakref.ref(self)
            self._fetcher = Fetcher(self.readahead, self._root, lambda s: me().layout(s), lambda s: me().layout_async(s),
                                    lambda s: store_for(me().urls[s], me().options))
            weakref.finalize(self, self._fetcher.close)
        self._fetcher.announce(key, shards[remote], samples[remote], order)

    def release(self, key: Any) -> None:
        """Batch ``key`` is loaded: what was read ahead for it may go."""
        if self._fetcher is not None:
            self._fetcher.release(key)

    @property
    def prefetch_items(self) -> int:
        """How many upcoming items are worth announcing: what half the read-ahead memory holds."""
        if self._root is None:
            return 0
        mean = max(1, sum(e.size or 0 for e in self._entries) // max(1, len(self)))
        return max(1, self.readahead.max_bytes // 2 // mean)

    @property
    def readahead_stats(self) -> dict[str, int]:
        """Requests, bytes, evictions and failures of read-ahead in this process so far."""
        return dict(self._fetcher.stats) if self._fetcher is not None else {"requests": 0, "bytes": 0, "evicted": 0, "failed": 0}

    def close(self) -> None:
        """Stop reading ahead and close this process's mappings (the ShardSet stays usable)."""
        if self._fetcher is not None:
            self._fetcher.close()
            self._fetcher = None
        self._maps.clear()
        self._files.clear()

    def __getstate__(self):
        state = dict(self.__dict__)
        for name in ("_maps", "_layouts", "_files", "_remote_sample", "_fetcher"):
            state.pop(name)  # per process
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._init_process_state()

    def __repr__(self) -> str:
        return f"ShardSet({len(self.urls)} shards, {len(self)} samples)"


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
        return self._set.index(self._shard).key(self._index)

    @property
    def url(self) -> str:
        """The URL of the shard the sample is in."""
        return self._set.urls[self._shard]

    @property
    def fields(self) -> dict[str, tuple[int, int]]:
        """``field -> (offset, size)`` within the shard."""
        return self._set.index(self._shard).fields(self._index)

    def __getitem__(self, field: str):
        if field == "__key__":
            return self.key
        if field == "__url__":
            return self.url
        try:
            offset, size = self.fields[field]
        except KeyError:
            raise FieldNotFoundError(f"sample {self.key!r} in {self.url} has no field {field!r} (it has {sorted(self.fields)})",
                                     url=self.url, key=self.key, field=field) from None
        return self._set._read(self._shard, self._index, offset, size)

    def __iter__(self) -> Iterator[str]:
        return iter(self.fields)

    def __len__(self) -> int:
        return len(self.fields)

    def __repr__(self) -> str:
        return f"<sample {self.key!r} of {self.url}: {', '.join(self.fields)}>"

