"""Some of a data source's items, as a source of their own that keeps the parent's shards.

An aspect-ratio bucket (see :mod:`hydrax.image.buckets`) is a subset of a data set: each bucket
becomes a DataGroup of its own. A plain list of the bucket's samples would do for an itemwise
shuffle, but it would lose what a :class:`~hydrax.shards.ShardSet` knows: which shard each item
is in (for ``shuffle_later="shardwise"``, which reads shard by shard) and the read-ahead of
remote shards. :class:`Subset` keeps both: its items are the parent's, in the parent's order,
its shards are the parent's shards that hold any of them (each with the number it holds), and
what the loader announces to it is passed on to the parent with the parent's item numbers. Many
subsets of one ShardSet share that set, its indexes and its read-ahead.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


class Subset(Sequence):
    """Items ``items`` of ``source`` (any sequence; a :class:`~hydrax.shards.ShardSet` keeps its
    shards and read-ahead): ``subset[i]`` is ``source[items[i]]``.

    :param source: the data the items are taken from.
    :param items: indices into ``source``, each at most once, in increasing order (so that a
        shard's items stay together, as ``"shardwise"`` reads them).
    :raises ValueError: for indices out of range, repeated or out of order.
    """

    def __init__(self, source: Sequence, items) -> None:
        chosen = np.ascontiguousarray(items, dtype=np.int64)
        if chosen.ndim != 1:
            raise ValueError(f"items must be a 1-d sequence of indices, got shape {chosen.shape}")
        if len(chosen) and (chosen[0] < 0 or chosen[-1] >= len(source)):
            raise ValueError(f"items must be indices of the source's {len(source)} items, got {chosen.min()}..{chosen.max()}")
        if len(chosen) > 1 and not (np.diff(chosen) > 0).all():
            raise ValueError("items must be increasing, each at most once (np.unique gives them so)")
        self._source = source
        self._items = chosen
        self._announced: dict[Any, bool] = {}

    @property
    def source(self) -> Sequence:
        """The data the items are taken from."""
        return self._source

    @property
    def items(self) -> np.ndarray:
        """The items' indices in :attr:`source` (int64, increasing; do not modify)."""
        return self._items

    def __len__(self) -> int:
        return len(self._items)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self._source[int(i)] for i in self._items[index]]
        return self._source[int(self._items[index])]

    def shard_sizes(self) -> list[int]:
        """Items per shard, over the parent's shards that hold any of this subset's items, in the
        parent's shard order. Raises ValueError for a source without shards."""
        sizes, locate = getattr(self._source, "shard_sizes", None), getattr(self._source, "locate", None)
        if not (callable(sizes) and callable(locate)):
            raise ValueError(f"a subset of a {type(self._source).__name__} has no shards: shuffle_later='shardwise' "
                             "needs a subset of data that knows its shards (a hydrax.shards.ShardSet)")
        shards, _ = locate(self._items)
        counts = np.bincount(shards, minlength=len(sizes()))
        return counts[counts > 0].tolist()

    # -- read-ahead: announced items are passed on as the parent's items -------------------------
    @property
    def prefetch_items(self) -> int:
        """As the source's (0 where the source does not read ahead)."""
        return int(getattr(self._source, "prefetch_items", 0) or 0)

    def prefetch(self, key: Any, indices, order: str) -> None:
        """Items ``indices`` of this subset will be read soon, for batch ``key``: the source hears
        of them by its own numbers."""
        prefetch = getattr(self._source, "prefetch", None)
        if prefetch is None:
            return
        prefetch(key, self._items[np.asarray(indices, np.int64)].tolist(), order)
        self._announced[key] = True

    def release(self, key: Any) -> None:
        """Batch ``key`` is loaded: the source may let go of what it read ahead for it."""
        if self._announced.pop(key, None) is not None:
            self._source.release(key)

    def wait_prefetch(self) -> None:
        """As the source's (see :meth:`hydrax.shards.ShardSet.wait_prefetch`)."""
        wait = getattr(self._source, "wait_prefetch", None)
        if wait is not None:
            wait()

    def __getstate__(self):
        # what was announced belongs to the process that announced it
        return {**self.__dict__, "_announced": {}}

    def __repr__(self) -> str:
        return f"Subset({len(self._items)} of {type(self._source).__name__}[{len(self._source)}])"


__all__ = ["Subset"]
