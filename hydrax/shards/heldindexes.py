"""The per-shard indexes one process of a :class:`~hydrax.shards.ShardSet` holds.

A set of remote shards named directly holds every index set-up found; a manifest's shards have
theirs loaded as they are first read, and only the ``limit`` most recently used stay (a set of
10^5 shards must not hold 10^5 indexes in every worker). Loading an index of a shard whose table
lacked its size and version learns them, so a later load, after the index was dropped, reads the
same version without asking the store again. The read-ahead loads indexes from its own thread,
so the recently used ones are kept under a lock.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from .indexfile import ShardIndex
from .shardtable import ShardEntry, ShardTable


class HeldIndexes:
    """Set-up's indexes (``held``, by shard, or None), and the ``limit`` most recently used others."""

    def __init__(self, table: ShardTable | None, held: list[ShardIndex | None] | None, limit: int) -> None:
        self._table = table
        self._held = held
        self._limit = limit
        self._recent: OrderedDict[int, ShardIndex] = OrderedDict()
        self._lock = threading.Lock()
        # (size, version) of remote shards whose table lacks them, found when their indexes load
        self._learned: dict[int, tuple[int, str]] = {}

    def __len__(self) -> int:
        """How many recently used indexes are held (set-up's not counted)."""
        return len(self._recent)

    def shards(self) -> list[int]:
        """The shards whose recently used indexes are held, least recently used first."""
        with self._lock:
            return list(self._recent)

    def known(self, shard: int) -> ShardIndex | None:
        """The index of ``shard`` if this process holds it (found at set-up, or recently used)."""
        if self._held is not None and self._held[shard] is not None:
            return self._held[shard]
        with self._lock:
            index = self._recent.get(shard)
            if index is not None:
                self._recent.move_to_end(shard)
            return index

    def hold(self, shard: int, index: ShardIndex) -> ShardIndex:
        """Keep ``index`` as the most recently used, dropping the least recently used past the limit."""
        with self._lock:
            self._recent[shard] = index
            while len(self._recent) > self._limit:
                self._recent.popitem(last=False)
        return index

    def entry(self, shard: int) -> ShardEntry:
        """A new :class:`~hydrax.shards.shardtable.ShardEntry` of ``shard`` from the table, with the
        size and version an earlier load of its index found when the table lacks them."""
        entry = self._table.entry(shard)
        if entry.version is None and shard in self._learned:
            entry.size, entry.version = self._learned[shard]
        return entry

    def learn(self, shard: int, entry: ShardEntry, index: ShardIndex) -> ShardIndex:
        """Note the size and version ``index`` was built from when ``entry`` lacked them."""
        if entry.version is None and index.etag is not None:
            self._learned[shard] = (index.shard_size, index.etag)
        return index
