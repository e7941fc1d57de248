"""Mixture: several sources read by weight as the data of one DataGroup.

``DataGroup(256, Mixture([ShardSet(web), ShardSet(curated), synthetic], weights=[0.7, 0.2, 0.1]),
...)`` gives batches in which about 70% of the items are web samples, 20% curated ones and 10%
synthetic ones, every epoch, with each source reshuffled whenever it has been read through. Which
item every position holds is a pure function of (seed, epoch, position) (see
:mod:`hydrax.order.mixing`), so a run resumes exactly at any ``(epoch, batch)`` with any number of
loaders or hosts, and nothing of the epoch's size is ever held.

The mixture is a sequence of all its sources' items, source 0's first: item ``i`` is
``sources[s][i - offsets[s]]``. The loader function receives each source's own item (a
:class:`~hydrax.shards.SampleRef` of a ShardSet, an element of a list...), and a batch's
:attr:`hydrax.Batch.sources` tells which source each of its items came from.
"""

from __future__ import annotations

import bisect
import operator
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from .. import _core
from .mixing import BATCHINGS, MixturePlan, check_epoch, check_weights, proportions


class Mixture(Sequence):
    """Sources mixed by weight, for the ``data`` of a :class:`hydrax.DataGroup`.

    :param sources: the sources, each a sequence of item descriptors (a
        :class:`hydrax.shards.ShardSet`, a list, a ``range``, a numpy array...), each non-empty.
        They are kept by reference, as a DataGroup keeps its data.
    :param weights: one positive number per source; only their ratios count. An epoch holds
        ``round(w * epoch_size)`` items of each source (exactly, by largest remainders). Any
        size works (``1e308``, ``10**400``) as long as each weight's ratio to the largest is a
        float above 0 (see :func:`hydrax.order.mixing.check_weights`).
    :param epoch_size: positions per epoch (default: the sum of the sources' lengths). The
        group's ``batch_size`` divides it into batches; the remainder is dropped, as for any group.
        The schedule counts positions in int64: ``(epoch + 1) * epoch_size`` must not exceed
        ``2**63 - 1`` for any epoch a run reaches, checked here for epoch 0 and by the
        Dataloader for its ``start_at`` and ``end_at`` and as its epochs advance
        (:class:`~hydrax.errors.MixtureRangeError`, naming the epoch size and the epoch).
    :param batching: ``"random"`` (default): positions are shuffled within runs of
        :data:`hydrax.order.mixing.RANDOM_RUN` batches, so a batch's composition varies as random
        draws by weight do (each run of batches still holds its exact shares). ``"stratified"``:
        every batch holds ``floor(w * batch_size)`` items of each source, plus one for the
        sources whose turn it is to take the batch's remaining slots (they rotate), in shuffled
        positions.

    Each source is read in passes: a pass is every item of the source once, in an order drawn
    from the group's seed, the source and the pass; the next pass begins where it ends, in a new
    order, whether in the same epoch (a small source) or in a later one (a large source). In a
    group with ``shuffle_later="shardwise"``, sources that know their shards (ShardSets) are
    read shardwise within each pass (shards permuted, items mixed within ``shard_window``
    shards), so reading stays local; other sources are read in a permuted order.

    A Mixture that reads remote shards forwards the loader's read-ahead announcements to them.
    """

    def __init__(self, sources: Sequence[Sequence[Any]], weights: Sequence[float], *, epoch_size: int | None = None,
                 batching: str = "random") -> None:
        self._sources = tuple(_check_source(i, source) for i, source in enumerate(_as_list(sources)))
        if not self._sources:
            raise ValueError("a Mixture needs at least one source")
        self._weights = check_weights(weights, len(self._sources))
        if batching not in BATCHINGS:
            raise ValueError(f"batching must be 'random' or 'stratified', got {batching!r}")
        self._batching = batching
        self._sizes = tuple(len(source) for source in self._sources)
        self._by_number = np.empty(len(self._sources), object)  # the sources, for fancy indexing
        for i, source in enumerate(self._sources):
            self._by_number[i] = source
        self._offsets = np.concatenate(([0], np.cumsum(self._sizes, dtype=np.int64)))
        self._offsets.setflags(write=False)
        self._starts = self._offsets[:-1].tolist()
        self._length = int(self._offsets[-1])
        if epoch_size is None:
            epoch_size = int(self._offsets[-1])
        if isinstance(epoch_size, bool) or not isinstance(epoch_size, (int, np.integer)) or epoch_size < 1:
            raise ValueError(f"epoch_size must be a positive int (or None for the sum of the sources' lengths), got {epoch_size!r}")
        self._epoch_size = int(epoch_size)
        check_epoch(self._epoch_size, 0, "epoch_size")
        self._announced: dict[Any, list[int]] = {}
        if not self._readers():
            # nothing to pass announcements on to: the loader then makes none (it announces to
            # data whose prefetch and release are callable)
            self.prefetch = self.release = None

    @property
    def sources(self) -> tuple[Sequence[Any], ...]:
        """The sources, in the order given."""
        return self._sources

    @property
    def weights(self) -> tuple[float, ...]:
        """The weights, as given (as floats; each divided by the largest when one is an int too
        large for a float)."""
        return self._weights

    @property
    def proportions(self) -> tuple[float, ...]:
        """The weights normalised to sum to 1 (in exact fractions, so large weights do not overflow)."""
        return proportions(self._weights)

    @property
    def epoch_size(self) -> int:
        """Positions per epoch."""
        return self._epoch_size

    @property
    def batching(self) -> str:
        """``"random"`` or ``"stratified"``."""
        return self._batching

    @property
    def offsets(self) -> np.ndarray:
        """Where each source's items start among the mixture's items, then their total (read-only)."""
        return self._offsets

    def __len__(self) -> int:
        """All the sources' items together (not the epoch size)."""
        return self._length

    def __getitem__(self, index):
        """Source ``s``'s own item ``index - offsets[s]``; a list of them for a slice."""
        if type(index) is int and 0 <= index < self._length:  # what a worker asks, item after item
            source = bisect.bisect_right(self._starts, index) - 1
            return self._sources[source][index - self._starts[source]]
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if isinstance(index, bool) or not isinstance(index, (int, np.integer)):
            raise TypeError(f"Mixture indices must be ints or slices, not {type(index).__name__}")
        index = int(index)
        source, local = self.locate(index + len(self) if index < 0 else index)
        return self._sources[source][local]

    def take(self, indices: Sequence[int]) -> Iterator[Any]:
        """The items ``indices`` (in range), one after the other, each read from its source when
        the iterator reaches it: a worker's way through a task. Every item's source and index in
        it are found in one kernel call (:func:`hydrax._core.mixture_locate`), so an item costs
        its source's own ``__getitem__`` and little more. Raises IndexError naming the first item
        out of range."""
        source, local = self._split(indices)
        return map(operator.getitem, self._by_number[source].tolist(), local.tolist())

    def _split(self, indices) -> tuple[np.ndarray, np.ndarray]:
        """``(source, index within it)`` of each of ``indices``, as int64 arrays, in one kernel call."""
        where = np.ascontiguousarray(indices, np.int64).reshape(-1)
        source, local = np.empty_like(where), np.empty_like(where)
        bad = _core.mixture_locate(where, self._offsets, source, local)
        if bad >= 0:
            raise IndexError(f"item {where[bad]} (at {bad}) is out of range for a Mixture of {len(self)} items")
        return source, local

    def locate(self, index: int) -> tuple[int, int]:
        """``(source, index within that source)`` of the mixture's item ``index``."""
        if not 0 <= index < self._length:
            raise IndexError(f"item {index} is out of range for a Mixture of {len(self)} items")
        # bisect over a list, not numpy: a worker looks up every item it loads
        source = bisect.bisect_right(self._starts, index) - 1
        return source, index - self._starts[source]

    def source_of(self, indices) -> np.ndarray:
        """The source of each of the mixture's items ``indices``, as an int64 array of their shape."""
        shape = np.shape(indices)
        return self._split(indices)[0].reshape(shape)

    def mixture_plan(self, shardwise: bool = False) -> MixturePlan:
        """What the schedule needs (see :class:`hydrax.order.mixing.MixturePlan`); with ``shardwise``,
        the shard sizes of the sources that know them."""
        shards = ()
        if shardwise:
            shards = tuple(tuple(int(n) for n in source.shard_sizes()) if callable(getattr(source, "shard_sizes", None)) else ()
                           for source in self._sources)
        return MixturePlan(self._sizes, self._weights, self._batching, shards)

    # Read-ahead: the loader announces upcoming batches to data with prefetch and release; a
    # mixture passes each source that reads ahead its own items.
    def _readers(self) -> list[int]:
        return [i for i, source in enumerate(self._sources)
                if callable(getattr(source, "prefetch", None)) and callable(getattr(source, "release", None))]

    @property
    def prefetch_items(self) -> int:
        """Upcoming items worth announcing: as many as the most constrained reading source can
        hold of its share (0 when no source reads ahead)."""
        shares = self.proportions
        holds = {i: int(getattr(self._sources[i], "prefetch_items", 0) or 0) for i in self._readers()}
        # held 0: a source that does not read ahead (local shards); share 0.0: a weight so small
        # next to the others that its proportion underflows, and the source is never read
        wanted = [held / shares[i] for i, held in holds.items() if held > 0 and shares[i] > 0]
        return int(min(wanted)) if wanted else 0

    def prefetch(self, key: Any, indices, order: str) -> None:
        """Items ``indices`` will be read soon, for batch ``key``: each source that reads ahead hears of its own."""
        indices = np.asarray(indices, np.int64)
        sources = self.source_of(indices)
        told = []
        for i in self._readers():
            mine = indices[sources == i] - self._offsets[i]
            if len(mine):
                self._sources[i].prefetch(key, mine.tolist(), order)
                told.append(i)
        if told:
            self._announced[key] = told

    def release(self, key: Any) -> None:
        """Batch ``key`` is loaded: the sources told of it may let go of it."""
        for i in self._announced.pop(key, ()):
            self._sources[i].release(key)

    def wait_prefetch(self) -> None:
        """Wait until each source that reads ahead is at work on what it was told (see
        :meth:`hydrax.shards.ShardSet.wait_prefetch`)."""
        for i in self._readers():
            wait = getattr(self._sources[i], "wait_prefetch", None)
            if wait is not None:
                wait()

    def __getstate__(self):
        # what was announced belongs to the process that announced it
        return {**self.__dict__, "_announced": {}}

    def __repr__(self) -> str:
        parts = ", ".join(f"{type(s).__name__}[{n}] x {w:g}" for s, n, w in zip(self._sources, self._sizes, self.proportions))
        return f"Mixture({parts}; epoch_size={self._epoch_size}, batching={self._batching!r})"


def _as_list(sources: Any) -> list:
    if isinstance(sources, (str, bytes)) or not hasattr(sources, "__iter__"):
        raise TypeError(f"sources must be a list of sequences, got {type(sources).__name__}")
    return list(sources)


def _check_source(i: int, source: Any) -> Sequence:
    if isinstance(source, Mixture):
        raise TypeError(f"sources[{i}] is a Mixture: list its sources (with their weights multiplied) in one Mixture instead")
    if isinstance(source, (str, bytes)) or not isinstance(source, (Sequence, np.ndarray)):
        raise TypeError(f"sources[{i}] must be a sequence (a ShardSet, list, range, numpy array...), got {type(source).__name__}")
    if len(source) == 0:
        raise ValueError(f"sources[{i}] is empty: every source of a Mixture needs at least one item")
    return source


__all__ = ["Mixture"]
