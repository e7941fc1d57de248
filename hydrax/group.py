"""DataGroup: a sequence of item descriptors with one batch size and one set of array shapes.

A group also owns its seed and shuffle mode, and computes the memory layout of one batch: each
array C-contiguous and batch-major, every array starting on a 64-byte boundary so that a slot can be
handed to XLA without a copy.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from os import PathLike
from types import MappingProxyType
from typing import Any, Generic, TypeVar

import numpy as np

from .cache import GroupCache, descriptor_text, prepare_location, share_directory
from .schedule import GroupPlan
from .processes import watch_jax_start

D = TypeVar("D")

#: ``(item_shape, numpy dtype, jax dtype)``: one array of a group, as the user declares it.
ArraySpec = tuple[tuple[int, ...], Any, Any]
#: ``(full_shape, numpy dtype, jax dtype, byte offset, element count)``: one array of a batch in memory.
ArrayLayout = tuple[tuple[int, ...], np.dtype, Any, int, int]

#: Byte alignment of every array in a batch slot (XLA:CPU aliases 64-byte aligned host memory).
ALIGNMENT = 64

_SHUFFLE_LATER = ("default", "repeat", "reseed", "itemwise", "batchwise", "shardwise")


def align_up(n: int, alignment: int = ALIGNMENT) -> int:
    """``n`` rounded up to a multiple of ``alignment``."""
    return -(-n // alignment) * alignment


def compute_layouts(batch_size: int, specs: Mapping[str, ArraySpec], natural: bool = False) -> tuple[dict[str, ArrayLayout], int]:
    """Layouts of ``specs`` for ``batch_size`` items, and the bytes one batch needs.

    Arrays are placed in insertion order, each on a 64-byte boundary, or with ``natural`` on its
    dtype's own alignment, as hydrax 0.2.2 laid out every batch (the on-disk cache keeps that
    layout, so that its files are 0.2.2's).
    """
    import jax.numpy as jnp

    if not isinstance(specs, Mapping):
        raise TypeError(f"array specs must be a mapping of name -> (shape, dtype, jax_dtype), got {type(specs).__name__}")
    layouts: dict[str, ArrayLayout] = {}
    end = 0
    for name, spec in specs.items():
        if not isinstance(name, str):
            raise TypeError(f"array names must be str, got {name!r}")
        try:
            item_shape, dtype, jax_dtype = spec
        except (TypeError, ValueError):
            raise TypeError(f"array '{name}' must be (item_shape, numpy_dtype, jax_dtype), got {spec!r}") from None
        try:
            item_shape = tuple(int(d) for d in item_shape)
        except TypeError:
            raise TypeError(f"array '{name}' shape must be a tuple of ints, got {item_shape!r}") from None
        full_shape = (batch_size, *item_shape)
        count = int(np.prod(full_shape))
        if count < 1:
            raise ValueError(f"invalid shape for array '{name}': {full_shape}")
        dtype = np.dtype(dtype)
        if dtype.hasobject:
            raise TypeError(f"array '{name}' has dtype {dtype}, which cannot live in shared memory")
        jax_dtype = jnp.dtype(jax_dtype)
        offset = align_up(end, dtype.alignment if natural else ALIGNMENT)
        layouts[name] = (full_shape, dtype, jax_dtype, offset, count)
        end = offset + count * dtype.itemsize
    return layouts, end


@dataclass(frozen=True)
class SlotLayout:
    """Where one process's share of a group's batch lives in a slot.

    The share's rows come in ``blocks`` (row counts, in local order): one block normally, and one
    per device block when the batch is placed with a sharding, so that every device's rows start
    on a 64-byte boundary and the device can alias them. Each array holds its blocks one after
    the other, in ``block_offsets[name]`` (bytes from the slot start), padded to 64 bytes only
    before the blocks where one of that array's devices starts, and only where the bytes before
    are not a multiple of 64.
    """

    #: The arrays as hydrax 0.2.2 describes them: the share's full shape and its first block's offset.
    arrays: MappingProxyType[str, ArrayLayout]
    blocks: tuple[int, ...]
    block_offsets: MappingProxyType[str, tuple[int, ...]]
    #: Bytes of the slot the share needs.
    size: int


def slot_layout(blocks: Sequence[int], specs: Mapping[str, ArraySpec], starts: Mapping[str, Iterable[int]] | None = None) -> SlotLayout:
    """The slot layout of a share of ``sum(blocks)`` rows in ``blocks`` of rows (see :class:`SlotLayout`).

    ``starts[name]`` lists the blocks where a device's rows of that array start (default: every
    block); only those are aligned. With one block this is :func:`compute_layouts`.
    """
    blocks = tuple(int(b) for b in blocks)
    if not blocks or min(blocks) < 1:
        raise ValueError(f"blocks must be positive row counts, got {blocks}")
    layouts, end = compute_layouts(sum(blocks), specs)
    if len(blocks) == 1:
        return SlotLayout(MappingProxyType(layouts), blocks, MappingProxyType({n: (lay[3],) for n, lay in layouts.items()}), end)
    arrays, offsets, end = {}, {}, 0
    for name, (shape, dtype, jax_dtype, _offset, count) in layouts.items():
        row = dtype.itemsize * int(np.prod(shape[1:]))
        aligned = set(range(len(blocks))) if starts is None else {0, *starts[name]}
        places = []
        for b, rows in enumerate(blocks):
            if b in aligned:
                end = align_up(end)
            places.append(end)
            end += rows * row
        arrays[name] = (shape, dtype, jax_dtype, places[0], count)
        offsets[name] = tuple(places)
    return SlotLayout(MappingProxyType(arrays), blocks, MappingProxyType(offsets), end)


class DataGroup(Sequence[D], Generic[D]):
    """A group of data items sharing a descriptor type, a batch size and array shapes.

    :param batch_size: items per batch; clamped to ``len(data)``. The remainder
        (``len(data) % batch_size`` items) is dropped every epoch.
    :param data: the item descriptors. A ``Sequence`` is kept by reference (do not modify it
        afterwards); any other iterable is materialised with ``list``. Items are passed to the
        ``loader_func`` in worker processes.
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
        local (see :func:`hydrax.schedule.shardwise_order`).
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
        :func:`hydrax.schedule.shardwise_order` and :func:`hydrax.schedule.host_shards`.
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
    ) -> None:
        if type(self) is not DataGroup:
            warnings.warn(f"{type(self).__name__} derives from hydrax.DataGroup. This is not supported.", SyntaxWarning, stacklevel=2)
        if shuffle_later not in _SHUFFLE_LATER:
            raise ValueError(
                "shuffle_later must be 'default', 'repeat', 'reseed', 'itemwise', or 'batchwise'"
                " (or 'shardwise', for data that knows its shards such as a hydrax.shards.ShardSet)"
            )
        if isinstance(data, Sequence):
            self._data = data
        elif isinstance(data, Iterable):
            self._data = list(data)
        else:
            raise TypeError(f"{type(data)} is not a sequence or iterable")
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)):
            raise TypeError(f"batch_size must be an int, got {type(batch_size).__name__}")
        if batch_size < 1:
            raise ValueError("batch size must be at least 1")
        if len(self._data) < 1:
            raise ValueError("batch size must be at least 1 (data is empty: a DataGroup needs at least one item)")
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ValueError(f"seed must be a non-negative int, got {seed!r}")
        self._batch_size = min(len(self._data), int(batch_size))
        self._batch_count = len(self._data) // self._batch_size
        if loader_arrays is None and cache_arrays is None:
            raise ValueError("either loader_arrays or cache_arrays must be specified")
        cache_readonly = bool(cache_readonly)
        if loader_arrays is None:
            if cache_location is None:
                raise ValueError("cache_location is required if no loader_arrays are specified")
            cache_readonly = True
        self._cache_direct = False
        if cache_location is None:
            cache_readonly = True
            default = "itemwise"
        else:
            if cache_arrays is None:
                cache_arrays = loader_arrays
                self._cache_direct = not cache_readonly
            default = "batchwise"
        self._cache_location = None if cache_location is None else os.fspath(cache_location)
        self._cache_readonly = cache_readonly
        self._seed = int(seed)
        self._shuffle_first = bool(shuffle_first)
        self._shuffle_later = default if shuffle_later == "default" else shuffle_later
        self._shard_sizes: tuple[int, ...] = ()
        self._shard_window = int(shard_window)
        if shuffle_later == "shardwise":
            sizes = getattr(self._data, "shard_sizes", None)
            if sizes is None:
                raise ValueError("shuffle_later='shardwise' needs data that knows its shards (a hydrax.shards.ShardSet)")
            if self._shard_window < 1:
                raise ValueError(f"shard_window must be at least 1, got {shard_window}")
            self._shard_sizes = tuple(int(n) for n in sizes())
        if isinstance(shard_partitions, bool) or not isinstance(shard_partitions, (int, np.integer)) or shard_partitions < 1:
            raise ValueError(f"shard_partitions must be a positive int, got {shard_partitions!r}")
        self._shard_partitions = int(shard_partitions)
        if self._shard_partitions > 1:
            if shuffle_later != "shardwise":
                raise ValueError(
                    f"shard_partitions={self._shard_partitions} needs shuffle_later='shardwise' (got {shuffle_later!r}); "
                    "other shuffle modes have no partitions"
                )
            if self._batch_size % self._shard_partitions:
                clamped = f" (batch_size {batch_size} clamped to the {len(self._data)} items)" if self._batch_size != batch_size else ""
                raise ValueError(
                    f"batch_size {self._batch_size}{clamped} is not a multiple of shard_partitions={self._shard_partitions}: "
                    "every batch takes batch_size // shard_partitions items from each partition"
                )
        self._loader_arrays = None if loader_arrays is None else dict(loader_arrays)
        self._loader_layouts: MappingProxyType[str, ArrayLayout] | None = None
        self._loader_size: int | None = None
        if loader_arrays is not None:
            layouts, size = compute_layouts(self._batch_size, loader_arrays)
            self._loader_layouts, self._loader_size = MappingProxyType(layouts), size
        self._cache_arrays = None if cache_arrays is None else dict(cache_arrays)
        self._cache_layouts: MappingProxyType[str, ArrayLayout] | None = None
        self._cache_size: int | None = None
        if cache_arrays is not None:
            layouts, size = compute_layouts(self._batch_size, cache_arrays, natural=True)
            self._cache_layouts, self._cache_size = MappingProxyType(layouts), size
        watch_jax_start()  # JAX is imported now (the layouts use its dtypes)

    # Sequence protocol: the group is its data.
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

    def _slot_layout(self, blocks: Sequence[int], starts: Mapping[str, Iterable[int]] | None = None) -> SlotLayout:
        """The slot layout of one process's share of a batch, in ``blocks`` of rows (see :func:`slot_layout`)."""
        layout = slot_layout(blocks, self._loader_arrays or {}, starts)
        if layout.arrays == self._loader_layouts:
            # the same object, so that ``batch.layouts is group.loader_layouts`` as in 0.2.2
            layout = SlotLayout(self._loader_layouts, layout.blocks, layout.block_offsets, layout.size)
        return layout

    def _descriptor(self, layouts: Mapping[str, ArrayLayout], extra: dict | None = None) -> str:
        extra = dict(extra or {})
        if self._shuffle_later == "shardwise":
            # Not part of 0.2.2's descriptor, but they decide a shardwise batch's items.
            extra.update(shard_window=self._shard_window, shard_partitions=self._shard_partitions)
        return descriptor_text(
            data_len=len(self._data), batch_size=self._batch_size, seed=self._seed, shuffle_first=self._shuffle_first,
            shuffle_later=self._shuffle_later, layouts=[(lay[3], lay[1], lay[4]) for lay in layouts.values()], extra=extra,
        )

    def _open_cache(self, plan: GroupPlan, process_index: int = 0, process_count: int = 1) -> GroupCache | None:
        """Check or create this group's cache for a run that loads ``plan``'s share of each batch.

        Raises what :func:`hydrax.cache.prepare_location` raises. With several processes, each
        keeps its share of every batch in a share directory of the cache (see
        :func:`hydrax.cache.share_directory`), with its own descriptor.
        """
        if self._cache_location is None or self._cache_layouts is None:
            return None
        prepare_location(self._cache_location, self._descriptor(self._cache_layouts), self._cache_readonly)
        location, layouts, size, rows = self._cache_location, self._cache_layouts, self._cache_size, self._batch_size
        if process_count > 1:
            rows = plan.local_batch_size
            shared, size = compute_layouts(rows, self._cache_arrays, natural=True)
            layouts = MappingProxyType(shared)
            location = share_directory(self._cache_location, process_index, process_count)
            share = {"process_count": process_count, "share": [list(r) for r in plan.share]}
            prepare_location(location, self._descriptor(layouts, share), self._cache_readonly)
        return GroupCache(location, layouts, int(size), rows, self._shuffle_later, self._cache_readonly,
                          self._cache_direct, self._loader_layouts is None)

    def _plan(self) -> GroupPlan:
        return GroupPlan(
            size=len(self._data),
            batch_size=self._batch_size,
            batch_count=self._batch_count,
            seed=self._seed,
            shuffle_first=self._shuffle_first,
            shuffle_later=self._shuffle_later,
            shard_sizes=self._shard_sizes,
            shard_window=self._shard_window,
            shard_partitions=self._shard_partitions,
        )

    def __repr__(self) -> str:
        return f"DataGroup(batch_size={self._batch_size}, len={len(self._data)}, shuffle_later={self._shuffle_later!r})"
