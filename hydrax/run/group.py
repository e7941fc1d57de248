"""DataGroup: a sequence of item descriptors with one batch size and one set of array shapes.

A group also owns its seed, its shuffle mode and its cache settings, and computes the memory
layout of one batch (see :mod:`hydrax.layout`): each array C-contiguous and batch-major, every
array starting on a 64-byte boundary so that a slot can be handed to XLA without a copy.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping, Sequence
from os import PathLike
from types import MappingProxyType
from typing import Any, Generic, TypeVar

import numpy as np

from ..cache.settings import CacheSettings
from ..layout import ArrayLayout, ArraySpec, compute_layouts
from ..order.mixture import Mixture
from ..procs.processes import watch_jax_start
from ..order.schedule import PERMUTATIONS, SHUFFLE_MODES, GroupPlan

__all__ = ["ArrayLayout", "ArraySpec", "DataGroup"]  # the layout types, as hydrax 0.2.2 had them here

D = TypeVar("D")

#: The values of ``shuffle_later``: ``"default"`` and the resolved modes of :mod:`hydrax.order.schedule`.
SHUFFLE_LATER = ("default", *SHUFFLE_MODES)


class DataGroup(Sequence[D], Generic[D]):
    """A group of data items sharing a descriptor type, a batch size and array shapes.

    :param batch_size: items per batch; clamped to ``len(data)``. The remainder
        (``len(data) % batch_size`` items) is dropped every epoch.
    :param data: the item descriptors. A ``Sequence`` is kept by reference (do not modify it
        afterwards), and so is a numpy array (or any other buffer, as an array): a ``range`` or an
        array of a billion items costs nothing more. Any other iterable is materialised with
        ``list``. Items are passed to the ``loader_func`` in worker processes. A
        :class:`hydrax.Mixture` mixes several sources by weight: an epoch then has its
        ``epoch_size`` positions, ``shuffle_later`` may be ``"itemwise"`` (the default for it) or
        ``"shardwise"``, and its orders are always computed (``permutation`` does not apply).
    :param loader_arrays: ``name -> (item_shape, numpy_dtype, jax_dtype)`` of the arrays the loader
        fills for each item. Each array of a batch has shape ``(batch_size, *item_shape)``.
    :param cache_arrays: ``name -> (item_shape, numpy_dtype, jax_dtype)`` of the arrays of a
        cached batch (see the "On-disk batch cache" guide). With ``loader_arrays`` too, batches
        come from the loaders *uncached*, and the training loop stores its own arrays (the
        outputs of a frozen encoder, say) with :meth:`Batch.cache`; later epochs and runs read
        them from the cache. Omitted with a writable ``cache_location``: the loader arrays
        themselves are cached ("direct" mode). Without ``loader_arrays``: the group is read from
        the cache only, and batches missing from it are dropped.
    :param cache_location: the cache directory (created unless read-only): a ``cache.json``
        descriptor and one ``e{epoch}-b{index}.dat`` file per batch, in hydrax 0.2.2's format. A
        descriptor that does not match this group raises ``RuntimeError`` (when the Dataloader
        is created).
    :param cache_readonly: read the cache, never write to it (it must exist).
    :param seed: the group's seed: permutations use ``seed + epoch`` and item seeds count up from it.
    :param shuffle_first: shuffle the items once, before the first epoch.
    :param shuffle_later: what changes on each later epoch: ``"repeat"`` (nothing), ``"reseed"``
        (seeds only), ``"itemwise"`` (a new item permutation and new seeds), ``"batchwise"`` (the
        order of fixed batches), or ``"default"`` (itemwise without a cache, batchwise with one).
        hydrax extension: ``"shardwise"`` for a :class:`hydrax.shards.ShardSet`: every epoch
        permutes the shards and mixes items within runs of ``shard_window`` shards, so reads stay
        local (see :func:`hydrax.order.shardwise.shardwise_order`).
    :param shard_window: shards whose items mix, with ``"shardwise"``.
    :param shard_partitions: (hydrax extension, ``"shardwise"`` only) split every epoch's shards
        into this many canonical partitions, balanced by sample count, and fill each global batch
        partition-major: its ``batch_size // shard_partitions`` consecutive positions ``p`` hold
        items of partition ``p`` only. With ``P`` hosts splitting every batch
        (``Dataloader(process_index=..., process_count=P)``, ``P`` dividing
        ``shard_partitions``), each host then reads the shards of its own partitions, about
        ``1/P`` of the data per epoch, instead of every shard. Partitions differ in size by up to a
        shard, so each has a fixed quota of items per epoch and the longer ones pass their last
        items to the shorter ones: these spilled items (about a shard per partition) are the only
        reads from another host's shards. The order depends on ``shard_partitions``, not on the
        number of hosts, so a run resumes exactly with any process count that divides it. It must
        divide ``batch_size``; 1 (default) keeps the order of earlier versions. See
        :func:`hydrax.order.shardwise.shardwise_order` and :func:`hydrax.order.orders.host_shards`.
    :param permutation: (hydrax extension) how the shuffled orders are made. ``"numpy"``
        (default): hydrax 0.2.2's orders, bit for bit; each is an array of N indices, computed
        whole by the main process (O(N) time per epoch) and stored once per host for its
        workers. ``"lazy"``: each position's item is computed when it is needed, with a keyed
        pseudo-random bijection seeded by (seed, epoch) (see :mod:`hydrax.order.orders`), so nothing
        of size N exists in any process, and starting, resuming and crossing an epoch boundary
        cost the same at a billion items as at a thousand. Same shuffle modes, different (but
        equally reproducible) orders. See the "Very large datasets" guide.
    """

    def __init__(
        self,
        batch_size: int,
        data: Iterable[D],
        *,
        loader_arrays: Mapping[str, ArraySpec] | None = None,
        cache_arrays: Mapping[str, ArraySpec] | None = None,
        cache_location: str | PathLike | None = None,
        cache_readonly: bool = False,
        seed: int = 0,
        shuffle_first: bool = False,
        shuffle_later: str = "default",
        shard_window: int = 4,
        shard_partitions: int = 1,
        permutation: str = "numpy",
    ) -> None:
        if type(self) is not DataGroup:
            warnings.warn(f"{type(self).__name__} derives from hydrax.DataGroup. This is not supported.", SyntaxWarning, stacklevel=2)
        if shuffle_later not in SHUFFLE_LATER:
            raise ValueError(
                "shuffle_later must be 'default', 'repeat', 'reseed', 'itemwise', or 'batchwise'"
                " (or 'shardwise', for data that knows its shards such as a hydrax.shards.ShardSet)"
            )
        if permutation not in PERMUTATIONS:
            raise ValueError(f"permutation must be 'numpy' (hydrax 0.2.2's orders, stored) or 'lazy' (computed, O(1) memory), "
                             f"got {permutation!r}")
        self._data = _as_sequence(data)
        mixture = self._data if isinstance(self._data, Mixture) else None
        size = len(self._data) if mixture is None else mixture.epoch_size
        _check_batch_size_and_seed(batch_size, size, seed)
        self._batch_size = min(size, int(batch_size))
        self._batch_count = size // self._batch_size
        self._cache = CacheSettings.resolve(loader_arrays, cache_arrays, cache_location, cache_readonly)
        self._seed = int(seed)
        self._shuffle_first = bool(shuffle_first)
        if mixture is not None:
            _check_mixture_modes(shuffle_first, shuffle_later, shard_partitions)
            shuffle_later, permutation = ("itemwise" if shuffle_later == "default" else shuffle_later), "lazy"
        self._permutation = permutation
        self._shuffle_later = self._cache.default_shuffle if shuffle_later == "default" else shuffle_later
        self._shard_window = int(shard_window)
        self._shard_sizes = _shard_sizes(self._data, shuffle_later, self._shard_window, shard_window)
        self._shard_partitions = _shard_partitions(shard_partitions, shuffle_later, self._batch_size, batch_size, size)
        self._mixture = None if mixture is None else mixture.mixture_plan(shardwise=shuffle_later == "shardwise")
        self._loader_layouts, self._loader_size = _layouts(self._batch_size, loader_arrays)
        self._cache_layouts, self._cache_size = _layouts(self._batch_size, self._cache.arrays, natural=True)
        watch_jax_start()  # JAX is imported now (the layouts use its dtypes)

    # Sequence protocol: the group is its data (for a Mixture, all its sources' items; its
    # epoch holds epoch_size positions).
    def __len__(self) -> int:
        return len(self._data)

    def __getitem__(self, index):
        return self._data[index]

    @property
    def data(self) -> Sequence[D]:
        """The underlying sequence of item descriptors."""
        return self._data

    @property
    def batch_size(self) -> int:
        """Items per batch (after clamping to the data length)."""
        return self._batch_size

    @property
    def batch_count(self) -> int:
        """Full batches per epoch; the remainder is dropped."""
        return self._batch_count

    @property
    def loader_layouts(self) -> MappingProxyType[str, ArrayLayout] | None:
        """``name -> (full_shape, numpy dtype, jax dtype, byte offset, count)`` of the loader arrays."""
        return self._loader_layouts

    @property
    def loader_size(self) -> int | None:
        """Bytes of shared memory one batch of this group occupies."""
        return self._loader_size

    @property
    def cache_layouts(self) -> MappingProxyType[str, ArrayLayout] | None:
        """Layouts of the arrays of a cached batch (None without ``cache_arrays`` or a cache).

        Their offsets are those of the batch files, where each array is on its dtype's natural
        alignment, as in hydrax 0.2.2 (not on 64 bytes, as in the loaders' memory).
        """
        return self._cache_layouts

    @property
    def cache_size(self) -> int | None:
        """Bytes of arrays in one cached batch (its file holds the extras after them), or None."""
        return self._cache_size

    @property
    def seed(self) -> int:
        """The group's seed."""
        return self._seed

    @property
    def shuffle_first(self) -> bool:
        """Whether the items are shuffled once before the first epoch."""
        return self._shuffle_first

    @property
    def shuffle_later(self) -> str:
        """The resolved per-epoch shuffle mode (``"default"`` already resolved)."""
        return self._shuffle_later

    @property
    def shard_partitions(self) -> int:
        """(hydrax extension) Canonical partitions of a ``"shardwise"`` group's shards (1: none)."""
        return self._shard_partitions

    @property
    def shard_window(self) -> int:
        """(hydrax extension) Consecutive shards whose items mix, with ``"shardwise"``."""
        return self._shard_window

    @property
    def permutation(self) -> str:
        """(hydrax extension) How the shuffled orders are made: ``"numpy"`` or ``"lazy"``."""
        return self._permutation

    @property
    def cache_settings(self) -> CacheSettings:
        """(hydrax extension) The group's ``cache_*`` arguments as resolved: the location, whether
        it is read-only, direct mode, and the cache arrays (see the "On-disk batch cache" guide)."""
        return self._cache

    @property
    def plan(self) -> GroupPlan:
        """(hydrax extension) What the schedule knows of the group (sizes, seed, shuffle modes,
        shards): the input of the pure functions of :mod:`hydrax.order.schedule`."""
        return GroupPlan(
            size=len(self._data) if self._mixture is None else self._data.epoch_size,
            batch_size=self._batch_size,
            batch_count=self._batch_count,
            seed=self._seed,
            shuffle_first=self._shuffle_first,
            shuffle_later=self._shuffle_later,
            shard_sizes=self._shard_sizes,
            shard_window=self._shard_window,
            shard_partitions=self._shard_partitions,
            permutation=self._permutation,
            mixture=self._mixture,
        )

    def __repr__(self) -> str:
        return f"DataGroup(batch_size={self._batch_size}, len={len(self._data)}, shuffle_later={self._shuffle_later!r})"


def _as_sequence(data: Any) -> Sequence:
    # A Sequence or an array is kept by reference; any other iterable is materialised.
    if isinstance(data, (Sequence, np.ndarray)):
        return data
    try:
        view = memoryview(data)
    except TypeError:
        pass
    else:
        if view.ndim:
            return np.asarray(data)
    if isinstance(data, Iterable):
        return list(data)
    raise TypeError(f"{type(data)} is not a sequence or iterable")


def _check_batch_size_and_seed(batch_size: Any, length: int, seed: Any) -> None:
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)):
        raise TypeError(f"batch_size must be an int, got {type(batch_size).__name__}")
    if batch_size < 1:
        raise ValueError("batch size must be at least 1")
    if length < 1:
        raise ValueError("batch size must be at least 1 (data is empty: a DataGroup needs at least one item)")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")


def _shard_sizes(data: Sequence, shuffle_later: str, window: int, given_window: Any) -> tuple[int, ...]:
    """Samples per shard of a ``shardwise`` group's data (empty for the other modes, and for a
    Mixture, whose sources keep their own)."""
    if shuffle_later != "shardwise":
        return ()
    if window < 1:
        raise ValueError(f"shard_window must be at least 1, got {given_window}")
    if isinstance(data, Mixture):
        if not any(callable(getattr(source, "shard_sizes", None)) for source in data.sources):
            raise ValueError("shuffle_later='shardwise' needs a Mixture with at least one source that knows its shards "
                             "(a hydrax.shards.ShardSet); use 'itemwise' for sources without shards")
        return ()
    sizes = getattr(data, "shard_sizes", None)
    if sizes is None:
        raise ValueError("shuffle_later='shardwise' needs data that knows its shards (a hydrax.shards.ShardSet)")
    return tuple(int(n) for n in sizes())


def _check_mixture_modes(shuffle_first: Any, shuffle_later: str, partitions: Any) -> None:
    """A Mixture shuffles every pass of its sources itself: only the modes that say how they are read apply."""
    if shuffle_later not in ("default", "itemwise", "shardwise"):
        raise ValueError(f"shuffle_later={shuffle_later!r} does not apply to a Mixture, which draws new items every epoch: "
                         "use 'itemwise' (the default) or 'shardwise' (sources with shards read shard by shard)")
    if shuffle_first:
        raise ValueError("shuffle_first does not apply to a Mixture: it shuffles every pass of every source itself")
    if partitions != 1:
        raise ValueError("shard_partitions does not apply to a Mixture (its sources' shards are not partitioned by host)")


def _shard_partitions(partitions: Any, shuffle_later: str, batch_size: int, given_batch_size: Any, length: int) -> int:
    if isinstance(partitions, bool) or not isinstance(partitions, (int, np.integer)) or partitions < 1:
        raise ValueError(f"shard_partitions must be a positive int, got {partitions!r}")
    partitions = int(partitions)
    if partitions > 1:
        if shuffle_later != "shardwise":
            raise ValueError(
                f"shard_partitions={partitions} needs shuffle_later='shardwise' (got {shuffle_later!r}); "
                "other shuffle modes have no partitions"
            )
        if batch_size % partitions:
            clamped = f" (batch_size {given_batch_size} clamped to the {length} items)" if batch_size != given_batch_size else ""
            raise ValueError(
                f"batch_size {batch_size}{clamped} is not a multiple of shard_partitions={partitions}: "
                "every batch takes batch_size // shard_partitions items from each partition"
            )
    return partitions


def _layouts(batch_size: int, specs: Mapping[str, ArraySpec] | None,
             natural: bool = False) -> tuple[MappingProxyType[str, ArrayLayout] | None, int | None]:
    if specs is None:
        return None, None
    layouts, size = compute_layouts(batch_size, specs, natural)
    return MappingProxyType(layouts), size
