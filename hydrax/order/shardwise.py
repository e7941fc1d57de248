"""The shardwise item order of an epoch, as the ``"numpy"`` orders store it, and shard partitions.

A shardwise order keeps reads within a few shards at a time: the shards are permuted, then the
items of each run of ``window`` shards are permuted among themselves. With partitions, each host
reads only the shards of its own partitions. Everything here is a pure function of the shard
sizes, the seed and the epoch; :mod:`hydrax.order.orders` builds the groups' orders on it (the
``"lazy"`` form of the same order is :class:`~hydrax.order.orders.LazyShardwise`).
"""

from __future__ import annotations

import heapq
from typing import Sequence

import numpy as np

from .. import _core
from .schedule import permutation


def partition_shards(shard_sizes: Sequence[int], seed: int, epoch: int, partitions: int) -> np.ndarray:
    """The partition (in ``[0, partitions)``) of every shard in ``epoch``, indexed by shard.

    The shards are taken in the epoch's order, ``perm(seed + epoch, shards)``, and each goes to the
    partition with the fewest samples so far (ties to the lowest index). So the partitions change
    every epoch, and any two of them differ by at most the largest shard's sample count.
    """
    if partitions < 1:
        raise ValueError(f"partitions must be at least 1, got {partitions}")
    return balance_shards(permutation(seed + epoch, len(shard_sizes)), shard_sizes, partitions)


def balance_shards(shards: np.ndarray, shard_sizes: Sequence[int], partitions: int) -> np.ndarray:
    """The partition of every shard (indexed by shard) when the shards, taken in the order
    ``shards``, each go to the partition with the fewest samples so far (ties to the lowest index)."""
    sizes = np.asarray(shard_sizes, np.int64).tolist()
    owner = np.zeros(len(sizes), np.int64)
    if partitions > 1:
        loads = [(0, p) for p in range(partitions)]  # a heap: the lightest partition, then the lowest index
        for s in np.asarray(shards).tolist():
            load, p = loads[0]
            owner[s] = p
            heapq.heapreplace(loads, (load + sizes[s], p))
    owner.setflags(write=False)
    return owner


def seed_words(key: Sequence[int]) -> np.ndarray:
    """The uint32 words numpy's ``SeedSequence`` makes of the non-negative integers ``key``: each
    integer's 32-bit words, lowest first (one word for 0)."""
    words = []
    for value in key:
        value = int(value)
        if value < 0:
            raise ValueError(f"a seed must be non-negative, got {value}")
        words.append(value & 0xFFFFFFFF)
        while value > 0xFFFFFFFF:
            value >>= 32
            words.append(value & 0xFFFFFFFF)
    return np.array(words, np.uint32)


def _window_stream(shards: np.ndarray, starts: np.ndarray, sizes: np.ndarray, window: int, key: tuple[int, ...]) -> np.ndarray:
    """The items of ``shards`` (in that order), permuted within each run of ``window`` shards; run
    ``r`` is permuted as ``Generator(PCG64([*key, r])).permutation`` would (by
    :func:`hydrax._core.shuffle_runs`, with no numpy object per run)."""
    counts = sizes[shards]
    ends = np.cumsum(counts)
    # the items of the shards, in that order, all at once: each shard's start, counted up
    items = np.repeat(starts[shards] - (ends - counts), counts) + np.arange(int(ends[-1]) if len(ends) else 0, dtype=np.int64)
    bounds = np.concatenate(([0], ends[window - 1 :: window], ends[-1:] if len(shards) % window else ends[:0])).astype(np.int64)
    _core.shuffle_runs(items, bounds, seed_words(key))
    return items


def shardwise_order(shard_sizes: tuple[int, ...], seed: int, epoch: int, window: int, partitions: int = 1,
                    batch_size: int = 0) -> np.ndarray:
    """The item order of a sharded group in ``epoch``: reads stay within a few shards at a time.

    With one partition (the default): the shards are permuted with ``perm(seed + epoch, shards)``;
    then the items of each run of ``window`` consecutive shards (in that order) are permuted among
    themselves, with a generator seeded by (seed, epoch, run).

    With ``partitions`` C > 1 (``batch_size`` must then be a multiple of C), the order is built
    over C canonical partitions, so that a host loading a contiguous share of every batch reads only
    the shards of its own partitions:

    - the shards, in the permuted order above, are assigned to the partitions by
      :func:`partition_shards` (balanced by sample count);
    - each partition's items form a stream: its shards in the permuted order, items permuted within
      each run of ``window`` of them, with a generator seeded by (seed, epoch, partition, run);
    - each partition has a quota of ``batch_count * k`` items, ``k = batch_size // C`` and
      ``batch_count = sum(shard_sizes) // batch_size``. A stream longer than its quota spills its
      last items; the spills of partitions 0, 1, ... (in that order) form a pool, which tops up
      the streams shorter than their quota, partitions 0, 1, ... in turn, from its front. What is
      left of the pool is dropped (it comes at the end of the order, like the remainder with one
      partition). Spilled items are the only items a partition takes from another partition's
      shards; balancing keeps them to about one shard per partition;
    - global batch ``b`` is partition-major: its positions ``[p*k, (p+1)*k)`` hold items
      ``[b*k, (b+1)*k)`` of partition ``p``'s (topped-up) stream.

    Every epoch, epoch 0 included, is shuffled. The result, a permutation of all items whose first
    ``batch_count * batch_size`` entries are the epoch's batches, depends on nothing but its
    arguments, so it is the same for any number of workers or hosts; with one partition it is
    exactly the order of earlier versions.
    """
    sizes = np.asarray(shard_sizes, np.int64)
    starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    shards = permutation(seed + epoch, len(sizes))
    if partitions == 1:
        order = _window_stream(shards, starts, sizes, window, (seed, epoch))
        order.setflags(write=False)
        return order
    if partitions < 1 or batch_size < 1 or batch_size % partitions:
        raise ValueError(f"batch_size ({batch_size}) must be a positive multiple of the partitions ({partitions})")
    k = batch_size // partitions
    batch_count = int(sizes.sum()) // batch_size
    quota = batch_count * k
    owner = partition_shards(shard_sizes, seed, epoch, partitions)[shards]
    streams = [_window_stream(shards[owner == p], starts, sizes, window, (seed, epoch, p)) for p in range(partitions)]
    filled = np.empty((partitions, quota), np.int64)
    spills = []
    for p, stream in enumerate(streams):
        if len(stream) >= quota:
            filled[p] = stream[:quota]
            spills.append(stream[quota:])
    pool = np.concatenate(spills)
    taken = 0
    for p, stream in enumerate(streams):
        n = len(stream)
        if n < quota:
            filled[p, :n] = stream
            filled[p, n:] = pool[taken : taken + quota - n]
            taken += quota - n
    batches = filled.reshape(partitions, batch_count, k).transpose(1, 0, 2).reshape(-1)
    order = np.concatenate((batches, pool[taken:]))
    order.setflags(write=False)
    return order
