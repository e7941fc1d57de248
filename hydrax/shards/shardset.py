"""ShardSet: the samples of a set of tar shards, as a Sequence a DataGroup can hold.

``DataGroup(256, ShardSet("data/train-{0000..0099}.tar"), loader_arrays=...)`` finds every
shard's index once (see :mod:`hydrax.shards.catalog`: beside local shards, from index objects or
a manifest for remote ones, never by reading the data when those exist), then behaves as a
sequence of light :class:`SampleRef` s. In a worker, ``sample["jpg"]`` is a zero-copy
``memoryview`` of that field's bytes: from a mapping of the local shard (at most ``max_open``
mappings per process, least recently used closed first, so 10,000 shards fit under ``ulimit -n
1024``), or, for remote shards, from what its fetch process read ahead
(:mod:`hydrax.shards.readahead`, :mod:`hydrax.shards.fetchproc`), else from one ranged request
that brings all of the sample's fields. Remote reads are pinned to the version each shard was
indexed at. A remote shard that set-up reads whole to index it (no index object) goes into the
read-ahead folder as it is read, while the budget has room, so the first epoch does not fetch it
again.

Indexes are held three ways:

- all shards local (paths, globs or lists; not a manifest): one set index for the whole set
  (:mod:`hydrax.shards.setindex`), kept in ``cache_dir`` and mapped read-only, so every process
  of the host shares it through the page cache and a second ShardSet of the same unchanged shards
  opens in about a ``stat`` per shard. Pickled (to workers started from the fork server), the
  ShardSet carries the set index's path, its settings and its URLs, not the index.
  :meth:`ShardSet.index` gives a :class:`ShardIndex` of views into it;
- a manifest (local or remote shards): each shard's index is loaded when the shard is first
  read, and at most ``max_indexes`` of them are held per process (least recently used dropped);
- remote shards named directly: every index is found at set-up, as before, and held.

What a ShardSet knows of every shard is held without a Python object per shard: the URLs as a
:class:`~hydrax.shards.shardtable.UrlList` (one byte array), and, for a manifest or remote shards,
sizes, sample counts and versions in a :class:`~hydrax.shards.shardtable.ShardTable` (arrays);
:meth:`ShardSet.shard_entry` makes a :class:`ShardEntry` on demand. Those arrays are what a
pickled ShardSet carries, so workers started from the fork server map them from one shared copy
(see :mod:`hydrax.procs.pickling`) once they reach a megabyte, about 30,000 shards.
"""

from __future__ import annotations

import dataclasses
import logging
import mmap
import os
import weakref
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any, Iterator

import numpy as np

from ..errors import FieldNotFoundError, ObjectChangedError
from ..procs.processes import start_forkserver_early
from .catalog import default_cache_dir, resolve_set
from .indexsource import BuildSink, load_index, load_index_async
from .listing import expand_urls
from .heldindexes import HeldIndexes
from .imagesizes import image_sizes
from .shardtable import ShardEntry, ShardTable, UrlList
from .indexfile import ShardIndex
from .setindex import SetIndex
from .fetchproc import SERVER_MODULES, make_fetcher
from .indexpool import index_in_processes, pool_size
from .readahead.budget import Budget, choose_budget, data_budget, host_room
from .readahead.fetcher import EMPTY_STATS, Fetcher
from .readahead.folders import ShardLayout, finalizer, private_root, remove_private_root
from .readahead.localfiles import LocalFiles
from .readahead.options import ReadAhead, fetch_process_count
from .readahead.seeder import ChunkSeeder
from .hub.pins import check_revisions, pin_urls, record_revisions
from .hub.store import settled_options
from .hub.url import names_hub
from .options import GCSOptions, HFOptions, HTTPOptions, S3Options, StoreOptions
from .router import store_for
from .store import is_remote

log = logging.getLogger(__name__)

#: The self-sized read-ahead budgets of this process's live ShardSets, by id: each one is sized
#: from the memory the others leave (a Mixture of remote sets must not take a quarter each).
_CLAIMED: dict[int, int] = {}

__all__ = ["SampleRef", "ShardSet", "default_cache_dir", "expand_urls"]

#: Local shard mappings a process keeps open at most (each holds one file descriptor).
MAX_OPEN = 128
#: Per-shard indexes a process holds at most, for a ShardSet made from a manifest. An index takes
#: about 26 bytes per sample plus 20 per field: 128 of shards of 10,000 two-field samples, 85 MB.
MAX_INDEXES = 128


class ShardSet(Sequence["SampleRef"]):
    """The samples of the tar shards ``urls``, in shard order.

    :param urls: a path, ``file://``, ``s3://``, ``gs://``, ``http(s)://`` or ``hf://`` URL, glob or
        brace pattern, or a list of them; or one dataset manifest (a wids ``wids-shard-index-v1``
        ``.json`` descriptor, local or remote), which sets up with a single request (and, for
        shards it gives no size for, what finds their sizes: their counts are checked against
        them before anything is sized by them).
    :param write_index: write a missing index (or refresh one whose shard only has a new
        modification time): ``<shard>.hidx`` beside a local shard, or into ``cache_dir`` for a
        remote one (nothing is ever written into a bucket; ``hydrax shards index`` does that),
        and the set index of local shards into ``cache_dir``.
    :param s3: endpoint, region and credentials for ``s3://`` shards (default: the standard AWS
        configuration). ``gcs``, ``http`` and ``hf`` likewise for ``gs://``, ``http(s)://`` and
        ``hf://`` (:class:`~hydrax.shards.options.HFOptions`: token and endpoint of the Hugging Face Hub).
    :param revision: for ``hf://`` URLs that name none (``hf://datasets/ORG/NAME/PATH``), the branch,
        tag or commit to read (default ``"main"``). It is resolved to its commit once, here, and
        every read of the set, in every process, is of that commit; a branch that moved since
        indexes were cached from it is a :class:`~hydrax.errors.RevisionMovedError` (see
        :mod:`hydrax.shards.hub`).
    :param cache_dir: where indexes of remote shards, and set indexes of local ones, are kept
        (default :func:`default_cache_dir`).
    :param readahead: how remote shards are read ahead (:class:`~hydrax.shards.ReadAhead`);
        memory is bounded by its ``max_bytes``, by default sized for the data and the host
        (:attr:`readahead_budget`).
    :param max_open: local shard mappings kept open per process.
    :param max_indexes: per-shard indexes held per process, least recently used dropped first: the
        indexes of a manifest's shards, loaded as they are first read, and the (cheap) views
        :meth:`index` gives of a set index.

    Local shards named as paths, globs or lists share one set index (see the module docstring),
    written into ``cache_dir`` (with ``write_index``; else held in memory) and reused while every
    shard keeps the size and modification time it had. The set index covers only sets of local
    shards: a set with a remote shard, or a manifest, holds per-shard indexes as before.

    :attr:`urls` holds the shards' URLs (paths for local shards) as a
    :class:`~hydrax.shards.shardtable.UrlList`, which reads like a list of str: ``urls[i]``,
    slices (lists), iteration, ``len`` and ``==`` against a list.
    """

    def __init__(self, urls: str | Sequence[str], *, write_index: bool = True, s3: S3Options | None = None,
                 gcs: GCSOptions | None = None, http: HTTPOptions | None = None, cache_dir: str | None = None,
                 readahead: ReadAhead | None = None, max_open: int = MAX_OPEN, max_indexes: int = MAX_INDEXES,
                 hf: HFOptions | None = None, revision: str | None = None) -> None:
        for name, value in (("max_open", max_open), ("max_indexes", max_indexes)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"ShardSet({name}=...) must be a positive int, got {value!r}")
        self.options = StoreOptions(s3 or S3Options(), gcs or GCSOptions(), http or HTTPOptions(), hf or HFOptions())
        self.cache_dir = cache_dir or default_cache_dir()
        self.readahead = readahead or ReadAhead()
        self.max_open = max_open
        self.max_indexes = max_indexes
        self._write_index = write_index
        if _names_remote(urls):
            # Set-up is about to make remote requests, after which workers start from the fork
            # server: start it now, while set-up and the caller's next steps go on, rather
            # than when the first run starts.
            start_forkserver_early(background=True, main_imports=False, modules=SERVER_MODULES)
        pins: dict = {}
        self.options, urls = _pin(urls, revision, self.options, self.cache_dir, pins)
        self._root: str | None = None
        self._seeder: ChunkSeeder | None = None  # what set-up kept of the shards it read to index them
        self._early_budget: Budget | None = None
        self._adopt(resolve_set(urls, self.options, self.cache_dir, write_index,
                                self._seed_readahead if self.readahead.enabled else None, self._build_indexes))
        if pins and write_index:
            record_revisions(pins, self.cache_dir)
        if self._remote is not None and self.readahead.enabled and self._root is None:
            self._root = readahead_root(self, self.readahead, self._remote_bytes())
        self._init_process_state()
        if self._early_budget is not None:
            self._keep_budget(self._early_budget)
            log.info("[hydrax] %s: set-up kept %s bytes of the shards it read to index them as read-ahead", self,
                     f"{self._seeder.bytes:,}")
        self._early_budget = None

    def _seed_readahead(self, remote: list[ShardEntry], building: list[ShardEntry]) -> BuildSink | None:
        """Called by set-up once it knows the sizes of the ``remote`` shards and reads ``building``
        whole to index them: picks the read-ahead folder and budget now (not when a run starts),
        and returns what cuts each of those shards, while its bytes are in memory, into the chunk
        files the fetcher would fetch, while the budget has room (see
        :class:`~hydrax.shards.readahead.seeder.ChunkSeeder`): the first epoch then reads them from there."""
        data_bytes = sum(max(0, entry.size or 0) for entry in remote)  # as _remote_bytes will count them
        self._root = readahead_root(self, self.readahead, data_bytes)
        self._early_budget = self._choose_budget(data_bytes)
        seeder = self._seeder = ChunkSeeder(self._root, self._early_budget.bytes)

        def sink(entry: ShardEntry, data, index: ShardIndex) -> None:
            # pinned to the version the shard was read (and indexed) at, as the fetcher's reads are
            seeder.add(entry.url, entry.version or index.etag, *index.sample_spans(), data)
        return sink

    def _build_indexes(self, building: list[ShardEntry]) -> list[ShardIndex | None] | None:
        """Called by set-up with the remote shards it must read whole to index them: their
        indexes, built by processes of their own when they hold enough bytes (see
        :mod:`hydrax.shards.indexpool`), keeping chunk files in this set's room; else None (set-up
        indexes them in this process)."""
        processes = pool_size(building)
        return index_in_processes(building, self.options, self._seeder, processes) if processes else None

    def _adopt(self, found: ShardTable | list[ShardEntry] | tuple[UrlList, SetIndex]) -> None:
        """Hold what :func:`~hydrax.shards.catalog.resolve_set` found, compactly."""
        self._set: SetIndex | None = None
        self._table: ShardTable | None = None  # a manifest's or remote shards': sizes, counts, versions
        self._held: list[ShardIndex | None] | None = None  # remote shards named directly: indexes found at set-up
        self._remote: np.ndarray | None = None  # which shards are remote; None: every shard is local
        if isinstance(found, tuple):
            self.urls, self._set = found
            return
        if isinstance(found, list):
            held = [entry.index for entry in found]
            self._held = held if any(index is not None for index in held) else None
            found = ShardTable.from_entries(found)
        self._table = found
        self.urls: UrlList = found.urls
        if self.urls.may_contain("://"):  # else every shard is a local path
            remote = np.fromiter(map(is_remote, self.urls), bool, len(self.urls))
            if remote.any():
                self._remote = remote

    def _init_process_state(self) -> None:
        self._starts = self._set.sample_start if self._set is not None else self._table.starts
        self._maps: OrderedDict[int, mmap.mmap] = OrderedDict()
        self._held_indexes = HeldIndexes(self._table, self._held, self.max_indexes)
        self._layouts: dict[int, ShardLayout] = {}
        self._files = LocalFiles(self.max_open)
        self._remote_sample: tuple[int, int, int, Any] | None = None  # (shard, sample, offset, bytes)
        self._fetcher: Any = None  # a FetchProcess or a Fetcher (see make_fetcher)
        self._budget: Budget | None = None

    @property
    def s3(self) -> S3Options:
        """The ``s3://`` settings in use."""
        return self.options.s3

    @property
    def set_index(self) -> SetIndex | None:
        """The set index of a set of local shards (None for a manifest or remote shards)."""
        return self._set

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
        """The index of shard number ``shard``: a view of the set index, or the shard's own index
        (loaded on first use for shards named by a manifest); at most ``max_indexes`` are held."""
        index = self._held_indexes.known(shard)
        if index is not None:
            return index
        if self._set is not None:
            index = self._set.shard_index(shard)
        else:
            entry = self._held_indexes.entry(shard)
            index = self._held_indexes.learn(shard, entry, load_index(entry, self.options, self.cache_dir, self._write_index,
                                                                      keep=False))
        return self._held_indexes.hold(shard, index)

    def sample_key(self, shard: int, sample: int) -> str:
        """The key of sample ``sample`` of shard number ``shard``."""
        if self._set is not None:
            return self._set.key(shard, sample)
        return self.index(shard).key(sample)

    def sample_fields(self, shard: int, sample: int) -> dict[str, tuple[int, int]]:
        """``field -> (offset, size)`` of sample ``sample`` of shard number ``shard``."""
        if self._set is not None:
            return self._set.fields(shard, sample)
        return self.index(shard).fields(sample)

    def shard_entry(self, shard: int) -> ShardEntry:
        """URL, size, version and sample count of shard number ``shard``: a new entry each time,
        made from the compact tables (with its index for a set of local shards, or remote shards
        named directly; without it for a manifest's shards, whose indexes load when read)."""
        if self._set is None:
            entry = self._held_indexes.entry(shard)
            if self._held is not None:
                entry.index = self._held[shard]
            return entry
        return ShardEntry(self.urls[shard], int(self._set.shard_size[shard]), None,
                          int(self._starts[shard + 1] - self._starts[shard]), self.index(shard))

    def locate(self, indices) -> tuple[np.ndarray, np.ndarray]:
        """(shard, sample within the shard) of each of the item ``indices``."""
        items = np.asarray(indices, np.int64)
        shards = np.searchsorted(self._starts, items, side="right") - 1
        return shards, items - self._starts[shards]

    def image_sizes(self, field: str | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``(widths, heights)`` of every item's image ``field`` (default: the field the indexes
        recorded), int32, in item order, 0 x 0 where there is none: from the indexes, where
        ``hydrax shards index --sizes FIELD`` records them (see :mod:`hydrax.shards.imagesizes`)."""
        return image_sizes(self, field, self._write_index)

    # -- reading -----------------------------------------------------------------------------
    def _read(self, shard: int, sample: int, offset: int, size: int) -> memoryview:
        if self._remote is not None and self._remote[shard]:
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
            size = int(self._set.shard_size[shard]) if self._set is not None else self.index(shard).shard_size
            if os.fstat(f.fileno()).st_size != size:
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
            layout = self._make_layout(shard, self.index(shard))
        return layout

    async def layout_async(self, shard: int) -> ShardLayout:
        """:meth:`layout` from an event loop (read-ahead loads many indexes at once)."""
        layout = self._layouts.get(shard)
        if layout is None:
            held = self._held_indexes
            index = held.known(shard)
            if index is None:
                entry = held.entry(shard)
                index = await load_index_async(entry, self.options, self.cache_dir, self._write_index, keep=False)
                index = held.hold(shard, held.learn(shard, entry, index))
            layout = self._make_layout(shard, index)
        return layout

    def _make_layout(self, shard: int, index: ShardIndex) -> ShardLayout:
        if self._set is not None:
            starts, ends = self._set.spans(shard)
            version = None
        else:
            starts, ends = index.sample_spans()
            version = self._held_indexes.entry(shard).version or index.etag  # the version the reads are pinned to
        layout = self._layouts[shard] = ShardLayout(self.urls[shard], version, starts, ends, self._root or "")
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
        remote = self._remote[shards]
        if not remote.any():
            return
        if self._fetcher is None:
            # The fetcher (and what makes its thread) must not keep the ShardSet alive: they see it
            # through weak references.
            me, root = weakref.ref(self), self._root
            options = dataclasses.replace(self.readahead, max_bytes=self.readahead_budget.bytes)
            seeder, self._seeder = self._seeder, None  # the fetcher counts its files from now on, and evicts them
            # The fetcher runs in fetch processes of its own where they can start (the training
            # process then spends no CPU, and holds no GIL, per byte fetched); else as a thread.
            self._fetcher = make_fetcher(
                self, options, root, seeder.held if seeder is not None else None,
                lambda settings, found: Fetcher(settings, root, lambda s: me().layout(s), lambda s: me().layout_async(s),
                                                lambda s: store_for(me().urls[s], me().options), found),
                count=fetch_process_count(options, int(self._remote.sum())), sizes=self._table.sizes,
                held_urls=seeder.urls if seeder is not None else None, first=np.unique(shards[remote]))
            # Closed before the private folder goes (whichever finalizer runs first): a fetch
            # process still writing would make it again.
            private = self._root if self.readahead.cache_dir is None else None
            weakref.finalize(self, _close_fetcher, self._fetcher, private, os.getpid())
        self._fetcher.announce(key, shards[remote], samples[remote], order)

    def release(self, key: Any) -> None:
        """Batch ``key`` is loaded: what was read ahead for it may go."""
        if self._fetcher is not None:
            self._fetcher.release(key)

    def wait_prefetch(self) -> None:
        """Return once the read-ahead has planned the first batch announced (its fetch processes
        start as it is announced; at most :data:`~hydrax.shards.fetchproc.READY_WAIT_S`): the
        Dataloader starts a run's workers then, which would read its samples too if sooner."""
        getattr(self._fetcher, "wait_ready", lambda: None)()

    @property
    def prefetch_items(self) -> int:
        """How many upcoming items are worth announcing: what the read-ahead budget holds when it
        holds all the remote data, else half of that (the other half holds what was loaded)."""
        budget = self.readahead_budget
        if budget is None:
            return 0
        mean = max(1, int(np.maximum(self._table.sizes, 0).sum()) // max(1, len(self)))  # remote: never a set index
        return max(1, (budget.bytes if budget.holds_data else budget.bytes // 2) // mean)

    @property
    def readahead_budget(self) -> Budget | None:
        """The read-ahead budget of this process (None without remote shards or read-ahead):
        ``ReadAhead(max_bytes=...)`` when given, else chosen by
        :func:`~hydrax.shards.readahead.budget.choose_budget` when first asked (as a run starts) from the
        remote shards' bytes and the room the host has then, and kept."""
        if self._root is None:
            return None
        if self._budget is None:
            self._keep_budget(self._choose_budget(self._remote_bytes()))
        return self._budget

    def _choose_budget(self, data_bytes: int) -> Budget:
        """The budget for ``data_bytes`` of remote shards, from the room the host has now (less
        what this process's other ShardSets claimed)."""
        available, free = host_room(self._root)
        available = max(0, available - sum(_CLAIMED.values()))
        return choose_budget(self.readahead.max_bytes, data_bytes, available, free, self.readahead.cache_dir is not None)

    def _keep_budget(self, budget: Budget) -> None:
        self._budget = budget
        if budget.source != "given":
            _CLAIMED[id(self)] = budget.bytes
            weakref.finalize(self, _CLAIMED.pop, id(self), None)
        log.info("[hydrax] %s: %s", self, budget.describe())

    def _remote_bytes(self) -> int:
        return int(np.maximum(self._table.sizes[self._remote], 0).sum())

    @property
    def readahead_stats(self) -> dict[str, int]:
        """Requests, bytes, evictions and failures of this set's read-ahead so far (in its fetch
        processes: one that died counts what it last reported), the most bytes held at once
        (``held_peak``; with a pool of fetch processes, the sum of each one's most), the bytes of
        files it found written already when a batch first needed them (``reused``: kept by set-up
        from the shards it read to index them, left in a persistent cache by an earlier run, or by
        an earlier run's fetch process) and the budget (``budget``, 0 without read-ahead)."""
        stats = dict(self._fetcher.stats if self._fetcher is not None else EMPTY_STATS)
        stats["budget"] = self._budget.bytes if self._budget is not None else 0
        return stats

    def close(self) -> None:
        """Stop reading ahead and close this process's mappings (the ShardSet stays usable)."""
        if self._fetcher is not None:
            self._fetcher.close()
            self._fetcher = None
        self._maps.clear()
        self._files.clear()

    def __getstate__(self):
        # A set index pickles as its file's path: no per-sample data, no per-shard index; the
        # URLs and a table's arrays pickle as arrays (out of band, shared, when large).
        state = dict(self.__dict__)
        for name in ("_starts", "_maps", "_held_indexes", "_layouts", "_files",
                     "_remote_sample", "_fetcher", "_budget", "_seeder", "_early_budget"):
            state.pop(name)  # derived, or per process
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._seeder = self._early_budget = None  # set-up's, in the process that set up
        self._init_process_state()

    def __repr__(self) -> str:
        return f"ShardSet({len(self.urls)} shards, {len(self)} samples)"


def readahead_root(owner: object, readahead: ReadAhead, data_bytes: int) -> str:
    """The read-ahead folder of ``owner`` (a ShardSet) for ``data_bytes`` of remote shards: in the
    persistent cache of ``readahead``, or a private one (removed with ``owner``)."""
    if readahead.cache_dir is not None:
        return os.path.join(readahead.cache_dir, "data")
    # the folder goes in memory when it has room for the budget this set will ask for
    root = private_root(readahead.max_bytes or data_budget(data_bytes))
    finalizer(owner, root)
    return root


def _close_fetcher(fetcher: Any, private_root: str | None, owner: int) -> None:
    """Stop ``fetcher``, then remove the private folder it wrote to (if any): a fetch process
    could otherwise make it again after the folder's own finalizer removed it."""
    fetcher.close()
    if private_root is not None:
        remove_private_root(private_root, owner)


def _pin(urls, revision: str | None, options: StoreOptions, cache_dir: str, pins: dict) -> tuple[StoreOptions, Any]:
    """``urls`` with every ``hf://`` URL pinned to the commit its revision points at now (see
    :func:`~hydrax.shards.hub.pins.pin_urls`), after checking that no branch moved since indexes
    were cached from it, and the options to read them with; ``pins`` receives the branches resolved."""
    if names_hub(urls):
        # Workers started from the fork server have its (older) environment: give them the Hub's address.
        options = dataclasses.replace(options, hf=settled_options(options.hf))
    pinned = pin_urls(urls, revision, options.hf, pins)
    check_revisions(pins, cache_dir)
    return options, pinned


def _names_remote(urls) -> bool:
    """Whether ``urls`` (a URL, pattern or manifest, or a list of them) starts with a remote one.
    Only a sequence is looked into: the first item of a generator is not ours to take."""
    if isinstance(urls, (str, os.PathLike)):
        first = urls
    elif isinstance(urls, Sequence) and len(urls):
        first = urls[0]
    else:
        return False
    return isinstance(first, str) and is_remote(first)


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
        return self._set.sample_key(self._shard, self._index)

    @property
    def url(self) -> str:
        """The URL of the shard the sample is in."""
        return self._set.urls[self._shard]

    @property
    def fields(self) -> dict[str, tuple[int, int]]:
        """``field -> (offset, size)`` within the shard."""
        return self._set.sample_fields(self._shard, self._index)

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
        # Never any I/O: a repr is what an error handler logs, and loading a shard's index there
        # would fail again, inside the handler, for the very reason it is handling.
        if self._set._set is None and self._set._held_indexes.known(self._shard) is None:
            return f"<sample {self._index} of {self.url} (its shard's index is not loaded)>"
        return f"<sample {self.key!r} of {self.url}: {', '.join(self.fields)}>"
