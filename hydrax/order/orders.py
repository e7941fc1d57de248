"""Item orders: which item each position of an epoch holds, stored or computed.

A group's order in an epoch maps the positions ``[0, N)`` of the epoch to items. With
``permutation="numpy"`` (the default, hydrax 0.2.2's orders bit for bit) it is an array of N
indices, computed in the main process and stored once per host (see :mod:`hydrax.order.orderbook`).
With ``permutation="lazy"`` nothing of size N exists anywhere: the item at a position is computed
when it is needed, by a keyed bijection (:mod:`hydrax.order.permute`) seeded by (seed, epoch), so any
process can find the items of any batch, of any epoch, in time proportional to the batch.

Every kind of order answers :meth:`ItemOrder.local`: the items of this process's share of a batch.

- :class:`IdentityOrder`: no shuffle;
- :class:`ArrayOrder`: a whole epoch's order as an array;
- :class:`ShareOrder`: only this process's share of every batch, as the order book stores it;
- :class:`LazyItems`: a lazy permutation of all items (``shuffle_first``, ``itemwise``);
- :class:`LazyShardwise`: the lazy ``shardwise`` order, with or without partitions, in O(S)
  memory for S shards: shards permuted, items mixed within runs of ``shard_window`` shards;
- :class:`MixtureOrder`: a :class:`hydrax.Mixture`'s epoch, each position's source and item
  computed from the stratified layout of :mod:`hydrax.order.mixing` and each source's lazy passes.

:func:`epoch_order` picks the kind for a plan and an epoch; :class:`EpochOrders` keeps the few
a process is using. :func:`item_order` and :func:`group_item_order` give a whole epoch's order
as an array (O(N): the order book stores those, tests compare with them), and
:func:`host_shards` which shards each host reads.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import replace
from typing import Callable, NamedTuple, Sequence

import numpy as np

from .. import _core
from .mixing import RANDOM_RUN, Layout, run_length
from .permute import permute, permute_windows, round_keys, round_keys_table
from .schedule import (LAZY_ITEMS, LAZY_MIX, LAZY_SHARDS, LAZY_SOURCE, LAZY_WINDOW, GroupPlan, host_positions,
                       lazy_permutation, local_items, order_seed, permutation, share_positions)
from .shardwise import balance_shards, shardwise_order


class ItemOrder:
    """Which item each position of one epoch of a group holds."""

    def at(self, positions: np.ndarray) -> np.ndarray:
        """The items at ``positions`` (an int64 array of positions of the epoch)."""
        raise NotImplementedError

    def local(self, plan: GroupPlan, group_index: int, first: int = 0, end: int | None = None) -> Sequence[int]:
        """The items of this process's share (``plan.share``) of batch ``group_index``, as ints;
        only those at local positions ``[first, end)`` when given."""
        return self.at(local_positions(plan, group_index)[first:end]).tolist()


def local_positions(plan: GroupPlan, group_index: int) -> np.ndarray:
    """The epoch positions of this process's share of batch ``group_index``."""
    first = group_index * plan.batch_size
    positions = share_positions(plan)
    if isinstance(positions, range):
        return np.arange(first + positions.start, first + positions.stop, dtype=np.int64)
    return np.asarray(positions, np.int64) + first


class IdentityOrder(ItemOrder):
    """No shuffle: position ``p`` holds item ``p``."""

    def at(self, positions: np.ndarray) -> np.ndarray:
        return np.asarray(positions, np.int64)

    def local(self, plan: GroupPlan, group_index: int, first: int = 0, end: int | None = None) -> Sequence[int]:
        return local_items(plan, None, group_index)[first:end]


class ArrayOrder(ItemOrder):
    """A whole epoch's order, as an array of item indices (a ``"numpy"`` order)."""

    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    def at(self, positions: np.ndarray) -> np.ndarray:
        return self.array[positions].astype(np.int64, copy=False)

    def local(self, plan: GroupPlan, group_index: int, first: int = 0, end: int | None = None) -> Sequence[int]:
        return local_items(plan, self.array, group_index)[first:end]


class ShareOrder(ItemOrder):
    """This process's share of every batch of an epoch: ``rows[b]`` holds the items of batch ``b``'s
    share, in local order (what :class:`hydrax.order.orderbook.OrderBook` stores, O(N/P) per host).

    :param check: called after the items are read, to make sure they were not overwritten meanwhile.
    """

    def __init__(self, rows: np.ndarray, check: Callable[[], None] | None = None) -> None:
        self.rows = rows
        self._check = check

    def at(self, positions: np.ndarray) -> np.ndarray:
        raise TypeError("a ShareOrder holds only this process's share of each batch; use local()")

    def local(self, plan: GroupPlan, group_index: int, first: int = 0, end: int | None = None) -> Sequence[int]:
        items = self.rows[group_index, first:end].tolist()
        if self._check is not None:
            self._check()
        return items


class LazyItems(ItemOrder):
    """A lazy permutation of ``n`` items, keyed by ``words`` (see :func:`hydrax.order.permute.round_keys`)."""

    def __init__(self, n: int, *words: int) -> None:
        self.n = int(n)
        self.keys = round_keys(*words)

    def at(self, positions: np.ndarray) -> np.ndarray:
        return permute(self.n, self.keys, positions)


class _WindowStream:
    """The items of some shards, taken in a given order, permuted within each run of ``window``
    consecutive shards (run ``r`` keyed by ``(*words, r)``): held as O(shards) numbers, the tables
    of :func:`hydrax.order.permute.permute_windows`."""

    def __init__(self, shards: np.ndarray, starts: np.ndarray, sizes: np.ndarray, window: int, words: tuple[int, ...]) -> None:
        self.cum = np.concatenate(([0], np.cumsum(sizes[shards], dtype=np.int64)))
        self.shard_starts = np.ascontiguousarray(starts[shards], np.int64)
        self.run_shards = np.append(np.arange(0, len(shards), window, dtype=np.int64), len(shards))
        # every run's round keys at once (64 bytes a run): one at a time they cost more than
        # permuting a batch, and a batch of small shards crosses several runs
        self.keys = round_keys_table(words, np.arange(len(self.run_shards) - 1), (LAZY_WINDOW,))
        self.run_starts = self.cum[self.run_shards[:-1]]
        self.length = int(self.cum[-1])

    def joined(self, others: Sequence[_WindowStream]) -> _WindowStream:
        """One stream of this one's positions, then each of ``others``'s in turn, each keeping
        its runs and keys, so that positions of several streams go to one kernel call."""
        streams = [self, *others]
        joined = object.__new__(_WindowStream)
        position_base = np.cumsum([0] + [s.length for s in streams[:-1]])
        shard_base = np.cumsum([0] + [len(s.shard_starts) for s in streams[:-1]])
        joined.cum = np.concatenate([[0]] + [s.cum[1:] + base for s, base in zip(streams, position_base)]).astype(np.int64)
        joined.shard_starts = np.concatenate([s.shard_starts for s in streams])
        joined.run_shards = np.concatenate([[0]] + [s.run_shards[1:] + base for s, base in zip(streams, shard_base)]).astype(np.int64)
        joined.keys = np.concatenate([s.keys for s in streams])
        joined.run_starts = joined.cum[joined.run_shards[:-1]]
        joined.length = int(joined.cum[-1])
        return joined

    def at(self, t: np.ndarray) -> np.ndarray:
        """The items at positions ``t`` (all below :attr:`length`) of the stream: one kernel
        call, which searches only the runs' shards, so a batch costs the same whatever the shard
        count and however many runs it crosses."""
        return permute_windows(t, self.cum, self.shard_starts, self.run_shards, self.keys, self.run_starts)


class LazyShardwise(ItemOrder):
    """The lazy ``shardwise`` order of a group in ``epoch``: the structure of
    :func:`hydrax.order.shardwise.shardwise_order` (partitions, quotas, spills and all), with every
    permutation lazy, so it costs O(S) memory for S shards and O(batch) time per batch."""

    def __init__(self, plan: GroupPlan, epoch: int) -> None:
        sizes = np.asarray(plan.shard_sizes, np.int64)
        starts = np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.int64)
        count = len(sizes)
        shards = lazy_permutation(plan.seed + epoch, count, LAZY_SHARDS)[:]
        self.partitions = partitions = plan.shard_partitions
        window = plan.shard_window
        if partitions == 1:
            self.stream = _WindowStream(shards, starts, sizes, window, (plan.seed, epoch))
            return
        owner = balance_shards(shards, sizes, partitions)[shards]
        streams = [_WindowStream(shards[owner == p], starts, sizes, window, (plan.seed, epoch, p)) for p in range(partitions)]
        # every partition's stream in one, partition p's from stream_base[p] on
        self.stream = streams[0].joined(streams[1:])
        lengths = np.array([s.length for s in streams], np.int64)
        self.stream_base = np.concatenate(([0], np.cumsum(lengths)[:-1]))
        self.batch_size = plan.batch_size
        self.k = plan.batch_size // partitions
        batch_count = int(sizes.sum()) // plan.batch_size
        self.quota = quota = batch_count * self.k
        self.used = batch_count * plan.batch_size
        self.lengths = lengths
        self.own = np.minimum(lengths, quota)
        # batches below this one hold only their partitions' own items: column c of batch b is
        # then position column_base[c] + b * k of the joined stream
        self.own_batches = int(self.own.min()) // self.k
        columns = np.arange(plan.batch_size, dtype=np.int64)
        self.column_base = self.stream_base[columns // self.k] + columns % self.k
        surplus = np.maximum(lengths - quota, 0)
        deficit = np.maximum(quota - lengths, 0)
        self.pool_starts = np.concatenate(([0], np.cumsum(surplus)))
        self.deficit_starts = np.concatenate(([0], np.cumsum(deficit)[:-1]))
        self.taken = int(deficit.sum())

    def local(self, plan: GroupPlan, group_index: int, first: int = 0, end: int | None = None) -> Sequence[int]:
        if self.partitions == 1 or group_index >= self.own_batches:
            return super().local(plan, group_index, first, end)
        columns = share_positions(plan)[first:end]
        if isinstance(columns, range):
            columns = slice(columns.start, columns.stop)
        return self.stream.at(self.column_base[columns] + group_index * self.k).tolist()

    def at(self, positions: np.ndarray) -> np.ndarray:
        positions = np.asarray(positions, np.int64)
        if self.partitions == 1:
            return self.stream.at(positions)
        # Where each position is read in the joined stream, with array arithmetic whatever the
        # partitions: batch b's columns [p*k, (p+1)*k) are partition p's items [b*k, (b+1)*k)
        # while its stream lasts (its own items), then the pool's (the other partitions' spills,
        # past their quotas); positions past the batches are the rest of the pool.
        batch, column = np.divmod(positions, self.batch_size)
        partition, row = np.divmod(column, self.k)
        t = batch * self.k + row
        tail = positions >= self.used
        own = ~tail & (t < self.own[partition])
        pool = np.where(tail, positions - self.used + self.taken, t - self.lengths[partition] + self.deficit_starts[partition])
        source = np.maximum(np.searchsorted(self.pool_starts, pool, side="right") - 1, 0)
        spilled = self.stream_base[source] + pool - self.pool_starts[source] + self.quota
        return self.stream.at(np.where(own, self.stream_base[partition] + t, spilled))


class _Block(NamedTuple):
    """What a block of a mixture's batches needs computed once: the shuffle keys of its runs, its
    batches' slot ends and items before (``(sources, batches)``), and the round keys of every
    pass of a permuted source it reads (source ``s``'s passes from ``first_pass[s]`` on, in rows
    ``key_rows[s]`` to ``key_rows[s + 1]`` of ``pass_keys``)."""

    shuffle_keys: np.ndarray
    ends: np.ndarray
    before: np.ndarray
    first_pass: np.ndarray
    key_rows: np.ndarray
    pass_keys: np.ndarray


class MixtureOrder(ItemOrder):
    """A mixture's order in ``epoch``: position ``p`` is shuffled within its run of batches (one
    batch for ``"stratified"``), lands on a slot of the stratified layout, which names a source
    and a position in that source's stream of passes; the pass's own lazy order (shardwise for a
    source with shards in a shardwise group) gives the item. O(S) memory for S sources, and a
    batch costs the same whatever the sizes: one call of :meth:`hydrax._core.MixtureBlock.fill`
    per range of this process's share (with a shardwise source, the shuffle and
    :func:`hydrax._core.mixture_slots`, :func:`hydrax._core.mixture_items`, then that source's
    windowed passes), the tables they read being computed once per block of :attr:`BLOCK` batches."""

    #: Passes of shardwise sources kept: a batch touches one or two passes of each.
    KEEP_PASSES = 16
    #: Batches whose tables are computed together (two such blocks are kept): one run of
    #: ``"random"`` batching, 64 batches of ``"stratified"``.
    BLOCK = RANDOM_RUN
    #: Whole shares of batches kept for the main process, which asks for a batch's items when it
    #: announces the batch and again when it delivers it.
    KEEP_BATCHES = 8

    def __init__(self, plan: GroupPlan, epoch: int) -> None:
        self.plan = plan
        self.epoch = int(epoch)
        mixture = plan.mixture
        self.layout = Layout.of(mixture.weights, plan.batch_size, plan.batch_count)
        self.run = run_length(mixture.batching)
        self.sizes = np.asarray(mixture.source_sizes, np.int64)
        self.offsets = mixture.offsets
        self._starts = np.ascontiguousarray(self.offsets[:-1])
        self._epoch_start = self.epoch * self.layout.totals
        # the sources read shardwise: their passes are windowed streams, permuted one by one
        shards = mixture.source_shards or ((),) * len(self.sizes)
        self._windowed = [s for s, sizes in enumerate(shards) if sizes and plan.shuffle_later == "shardwise"]
        self._passes: OrderedDict[tuple[int, int], ItemOrder] = OrderedDict()
        self._blocks: OrderedDict[int, _Block] = OrderedDict()
        self._kernels: dict[int, object] = {}  # the block a worker's batches are in, ready for its kernel
        # whole shares of batches, (group_index, share) -> items
        self._batches: OrderedDict[tuple, np.ndarray] = OrderedDict()

    def local(self, plan: GroupPlan, group_index: int, first: int = 0, end: int | None = None) -> Sequence[int]:
        return self.local_array(plan, group_index, first, end).tolist()

    def local_array(self, plan: GroupPlan, group_index: int, first: int = 0, end: int | None = None) -> np.ndarray:
        """:meth:`local` as an int64 array (a whole share is kept, read-only: the main process
        asks for a batch's items when it announces the batch and again when it loads it)."""
        first, end, _ = slice(first, end).indices(plan.local_batch_size)
        if first > 0 or end < plan.local_batch_size:  # a part: computed alone
            return self._batch(plan, group_index, first, end)
        # the whole share, asked for by the main process more than once (indices, read-ahead)
        key = (group_index, plan.share)
        items = self._batches.get(key)
        if items is None:
            items = self._batches[key] = self._batch(plan, group_index, first, end)
            items.setflags(write=False)
            if len(self._batches) > self.KEEP_BATCHES:
                self._batches.popitem(last=False)
        return items

    def _batch(self, plan: GroupPlan, group_index: int, first: int, end: int) -> np.ndarray:
        """Items ``first`` to ``end - 1`` of this process's share of batch ``group_index``: one
        kernel call per range of the share (:meth:`hydrax._core.MixtureBlock.fill`) where every
        source is permuted item by item."""
        if self._windowed:
            return self.at(local_positions(plan, group_index)[first:end])
        batch_size = self.plan.batch_size
        block = group_index // self.BLOCK
        kernel = self._kernels.get(block)
        if kernel is None:
            tables = self._block(block)
            kernel = _core.MixtureBlock(batch_size, self.run, self.plan.batch_count, block * self.BLOCK, block * self.BLOCK // self.run,
                                        tables.shuffle_keys, tables.ends, tables.before, self._epoch_start, self.sizes, self._starts,
                                        tables.first_pass, tables.key_rows, tables.pass_keys)
            self._kernels = {block: kernel}  # the blocks come one after the other
        out = np.empty(max(end - first, 0), np.int64)
        done = offset = 0  # items written; where the range starts in the share
        for start, stop in plan.share or ((0, batch_size),):
            low, high = max(first, offset), min(end, offset + stop - start)
            if low < high:
                kernel.fill(group_index * batch_size + start + low - offset, out[done:done + high - low])
                done += high - low
            offset += stop - start
        return out

    def place(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The source of each of ``positions`` (a 1-d int array) and its position in that source's stream."""
        return self._by_block(positions, self._place_block)

    def at(self, positions: np.ndarray) -> np.ndarray:
        where = np.asarray(positions, np.int64)
        return self._by_block(where.reshape(-1), self._items_block)[0].reshape(where.shape)

    def _by_block(self, positions, compute) -> tuple[np.ndarray, ...]:
        """``compute(block, positions)`` for the positions of each block (a batch's are in one)."""
        flat = np.asarray(positions, np.int64)
        batch_size, batch_count = self.plan.batch_size, self.plan.batch_count
        if not flat.size:
            return flat.copy(), flat.copy()
        low, high = int(flat.min()), int(flat.max())
        if low < 0 or high >= batch_size * batch_count:
            raise ValueError(f"a mixture's positions are those of its {batch_count} full batches of {batch_size}")
        span = batch_size * self.BLOCK
        if low // span == high // span:
            return compute(low // span, flat)
        outs = (np.empty_like(flat), np.empty_like(flat))
        blocks = flat // span
        for b in np.unique(blocks).tolist():
            chosen = blocks == b
            for out, part in zip(outs, compute(b, flat[chosen])):
                out[chosen] = part
        return outs

    def _place_block(self, block: int, flat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Source and stream position of positions of block ``block``: shuffled within their run, then read off the layout."""
        batch_size = self.plan.batch_size
        tables = self._block(block)
        first = block * self.BLOCK * batch_size
        slots = np.empty_like(flat)
        run_span = self.run * batch_size
        low, high = (int(flat.min()) - first) // run_span, (int(flat.max()) - first) // run_span
        runs = (flat - first) // run_span if low != high else None  # a batch's positions are in one run
        for r in range(low, high + 1):
            chosen = slice(None) if runs is None else runs == r
            run_first = first + r * run_span
            width = min(run_span, batch_size * self.plan.batch_count - run_first)
            slots[chosen] = r * run_span + permute(width, tables.shuffle_keys[r], flat[chosen] - run_first)
        source, stream = np.empty_like(slots), np.empty_like(slots)
        _core.mixture_slots(slots, batch_size, tables.ends, tables.before, self._epoch_start, source, stream)
        return source, stream

    def _items_block(self, block: int, flat: np.ndarray) -> tuple[np.ndarray]:
        source, stream = self._place_block(block, flat)
        tables = self._block(block)
        items = np.empty_like(flat)
        _core.mixture_items(source, stream, self.sizes, self._starts, tables.first_pass, tables.key_rows, tables.pass_keys, items)
        for s in self._windowed:
            chosen = source == s
            turn, offset = np.divmod(stream[chosen], self.sizes[s])
            mine = np.empty_like(offset)
            for t in np.unique(turn).tolist():
                now = turn == t
                mine[now] = self._pass(s, t).at(offset[now])
            items[chosen] = self.offsets[s] + mine
        return (items,)

    def _block(self, block: int) -> _Block:
        tables = self._blocks.get(block)
        if tables is None:
            tables = self._blocks[block] = self._make_block(block)
            if len(self._blocks) > 2:
                self._blocks.popitem(last=False)
        return tables

    def _make_block(self, block: int) -> _Block:
        first = block * self.BLOCK
        batches = np.arange(first, min(first + self.BLOCK, self.plan.batch_count), dtype=np.int64)
        runs = np.arange(first // self.run, -(-(first + len(batches)) // self.run), dtype=np.int64)
        counts = self.layout.counts(batches)
        before = np.ascontiguousarray(self.layout.before(batches), np.int64)
        # the stream positions the block reads of each source, so the passes they fall in
        low = self._epoch_start + before[:, 0]
        high = np.maximum(self._epoch_start + before[:, -1] + counts[:, -1] - 1, low)
        first_pass, last_pass = low // self.sizes, high // self.sizes
        wanted = last_pass - first_pass + 1
        wanted[self._windowed] = 0
        keys = [round_keys_table((self.plan.seed, s), np.arange(first_pass[s], last_pass[s] + 1), (int(self.sizes[s]), LAZY_SOURCE))
                for s in range(len(self.sizes)) if wanted[s]]
        return _Block(
            shuffle_keys=round_keys_table((self.plan.seed, self.epoch), runs, (LAZY_MIX,)),
            ends=np.ascontiguousarray(np.cumsum(counts, axis=0), np.int64),
            before=before,
            first_pass=np.ascontiguousarray(first_pass, np.int64),
            key_rows=np.concatenate(([0], np.cumsum(wanted))).astype(np.int64),
            pass_keys=np.concatenate(keys) if keys else np.zeros((0, 1), np.uint64),
        )

    def _pass(self, source: int, turn: int) -> ItemOrder:
        """Source ``source``'s order in its pass ``turn``."""
        key = (source, turn)
        order = self._passes.get(key)
        if order is None:
            order = self._passes[key] = source_pass(self.plan, source, turn)
            if len(self._passes) > self.KEEP_PASSES:
                self._passes.popitem(last=False)
        else:
            self._passes.move_to_end(key)
        return order


def source_pass(plan: GroupPlan, source: int, turn: int) -> ItemOrder:
    """The order of a mixture's source ``source`` in its pass ``turn``: its shards permuted and
    items mixed within windows (a shardwise group and a source with shards), else all its items
    permuted; keyed by the group's seed, the source and the pass."""
    mixture = plan.mixture
    size = mixture.source_sizes[source]
    shards = mixture.source_shards[source] if mixture.source_shards else ()
    if shards and plan.shuffle_later == "shardwise":
        seed = int(round_keys(plan.seed, source, LAZY_SOURCE)[0]) >> 2
        own = GroupPlan(size=size, batch_size=1, batch_count=size, seed=seed, shuffle_first=False, shuffle_later="shardwise",
                        shard_sizes=shards, shard_window=plan.shard_window, permutation="lazy")
        return LazyShardwise(own, turn)
    return LazyItems(size, plan.seed, source, turn, size, LAZY_SOURCE)


def epoch_order(plan: GroupPlan, epoch: int, training: bool = True) -> ItemOrder:
    """The order of ``plan`` in ``epoch`` (training) or of a validation group: computed for
    ``"lazy"`` (cheap), else the ``"numpy"`` array (O(N) to build; the loader keeps those in
    the order book instead). A mixture's is always computed."""
    if plan.mixture is not None:
        return MixtureOrder(plan, epoch if training else 0)
    if plan.permutation == "lazy":
        if training and plan.shuffle_later == "shardwise":
            return LazyShardwise(plan, epoch)
        seed = order_seed(plan, epoch, training)
        return IdentityOrder() if seed is None else LazyItems(plan.size, seed, plan.size, LAZY_ITEMS)
    array = group_item_order(plan, epoch, training)
    return IdentityOrder() if array is None else ArrayOrder(array)


def order_array(order: ItemOrder, size: int) -> np.ndarray | None:
    """``order`` as a whole array of ``size`` items (None for the identity): O(N), for tests and
    tools that ask for it."""
    if isinstance(order, IdentityOrder):
        return None
    array = order.at(np.arange(size, dtype=np.int64))
    array.setflags(write=False)
    return array


def item_order(plan: GroupPlan, epoch: int) -> np.ndarray | None:
    """The item permutation a training group uses in ``epoch``, as a whole array (None means the
    identity). With ``permutation="lazy"`` it is computed in full, which costs O(N): the loader
    itself never asks for it (see :func:`epoch_order`)."""
    if plan.permutation == "lazy":
        return order_array(epoch_order(plan, epoch), plan.size)
    if plan.shuffle_later == "shardwise":
        if plan.shard_partitions == 1:
            return shardwise_order(plan.shard_sizes, plan.seed, epoch, plan.shard_window)
        return shardwise_order(plan.shard_sizes, plan.seed, epoch, plan.shard_window, plan.shard_partitions, plan.batch_size)
    seed = order_seed(plan, epoch)
    return None if seed is None else permutation(seed, plan.size)


def validation_item_order(plan: GroupPlan) -> np.ndarray | None:
    """Validation groups are only ever shuffled once, by ``shuffle_first``."""
    return group_item_order(plan, 0, training=False)


def group_item_order(plan: GroupPlan, epoch: int, training: bool = True) -> np.ndarray | None:
    """The item order a batch of ``epoch`` takes its items from: :func:`item_order` for a training
    group, :func:`validation_item_order` (the same every time) for a validation group."""
    if training:
        return item_order(plan, epoch)
    return item_order(replace(plan, shuffle_later="repeat"), 0)


def host_shards(plan: GroupPlan, epoch: int, process_index: int, process_count: int) -> dict[int, int]:
    """Which shards process ``process_index`` of ``process_count`` reads in ``epoch`` of a shardwise
    training group: ``{shard: items of it the process loads}``, in shard order.

    Only ``plan``'s global batch size counts (not a share it may already carry). With
    ``shard_partitions`` C and a process count dividing C, a process reads the shards of its own
    partitions, plus the few items spilled into them from other partitions' shards.
    """
    if plan.shuffle_later != "shardwise":
        raise ValueError(f"host_shards needs a shardwise group, this one is {plan.shuffle_later!r}")
    positions = host_positions(plan.batch_size, process_index, process_count)
    used = item_order(plan, epoch)[: plan.batch_count * plan.batch_size].reshape(plan.batch_count, plan.batch_size)
    items = used[:, positions.start : positions.stop]
    shard = np.searchsorted(np.cumsum(plan.shard_sizes), items.ravel(), side="right")
    counts = np.bincount(shard, minlength=len(plan.shard_sizes))
    return {int(s): int(counts[s]) for s in np.flatnonzero(counts)}


class EpochOrders:
    """The orders a process is using, by ``(group, epoch)``: at most ``keep`` per group, the
    oldest dropped first, so memory does not grow epoch after epoch.

    :param make: builds the order of ``(group, epoch)``.
    """

    def __init__(self, make: Callable[[int, int], ItemOrder], keep: int = 2) -> None:
        self._make = make
        self._keep = keep
        self._orders: OrderedDict[tuple[int, int], ItemOrder] = OrderedDict()

    def get(self, group: int, epoch: int) -> ItemOrder:
        """The order of ``group`` in ``epoch``."""
        key = (group, epoch)
        order = self._orders.get(key)
        if order is None:
            order = self._orders[key] = self._make(group, epoch)
            mine = [k for k in self._orders if k[0] == group]
            for old in mine[: max(0, len(mine) - self._keep)]:
                del self._orders[old]
        else:
            self._orders.move_to_end(key)
        return order
