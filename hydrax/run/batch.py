"""Batch, TrainingBatch and ValidationBatch: what the Dataloader hands to the training loop.

A batch holds its ``jax.Array`` s, the per-item extras the loader returned, and where it sits in
the schedule. Do not keep batches longer than one loop iteration unless you need to: on the CPU
backend a batch's arrays may alias the loader's shared memory (see ``Dataloader``).
"""

from __future__ import annotations

from abc import ABC
from collections.abc import Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import numpy as np

from ..cache.runcache import CacheTarget, check_cache_arrays, check_cache_extras

if TYPE_CHECKING:
    import jax

    from .group import DataGroup
    from ..layout import ArrayLayout

D = TypeVar("D")


class _BatchData(Sequence):
    """The item descriptors of a batch, as a read-only sequence."""

    __slots__ = ("_group", "_indices")

    def __init__(self, group: DataGroup, indices: Sequence[int]) -> None:
        self._group = group
        self._indices = indices

    def __len__(self) -> int:
        return len(self._indices)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self._group[i] for i in self._indices[index]]
        return self._group[self._indices[index]]

    def __repr__(self) -> str:
        return f"<batch data of {len(self)} items>"


class Batch(ABC, Generic[D]):
    """A batch of loaded data. Do not derive from or instantiate this class."""

    __slots__ = ("_group", "_group_index", "_indices", "_arrays", "_additional", "_layouts", "_item_errors", "_uncached",
                 "_cache_target", "__weakref__")

    def __init__(
        self,
        group: DataGroup[D],
        group_index: int,
        indices: Sequence[int],
        arrays: dict[str, jax.Array],
        additional: dict[str, list[Any]],
        layouts: MappingProxyType[str, ArrayLayout],
        item_errors: dict[int, str] | None = None,
        *,
        uncached: bool = True,
        cache_target: CacheTarget | None = None,
    ) -> None:
        self._group = group
        self._group_index = group_index
        self._indices = indices
        self._arrays = MappingProxyType(arrays)
        self._additional = MappingProxyType(additional)
        self._layouts = layouts
        self._item_errors = MappingProxyType(dict(sorted((item_errors or {}).items())))
        self._uncached = uncached
        self._cache_target = cache_target

    def __len__(self) -> int:
        # The group's batch size, or this process's share of it when several processes split batches.
        return len(self._indices)

    @property
    def is_training(self) -> bool:
        """True for a :class:`TrainingBatch`."""
        return False

    @property
    def is_validation(self) -> bool:
        """True for a :class:`ValidationBatch`."""
        return False

    @property
    def group(self) -> DataGroup[D]:
        """The DataGroup this batch comes from."""
        return self._group

    @property
    def group_index(self) -> int:
        """The batch's identity within its group (before any batchwise reordering)."""
        return self._group_index

    @property
    def indices(self) -> Sequence[int]:
        """The indices (Python ints) of this batch's items in the group."""
        return self._indices

    @property
    def data(self) -> Sequence[D]:
        """The item descriptors of this batch: ``data[i] == group[indices[i]]``."""
        return _BatchData(self._group, self._indices)

    @property
    def sources(self) -> np.ndarray | None:
        """(hydrax extension) For a group whose data is a :class:`hydrax.Mixture`: the source
        each item came from (an int64 array, one per item, indices into ``Mixture.sources``);
        None for other data."""
        source_of = getattr(self._group.data, "source_of", None)
        return None if source_of is None else source_of(self._indices)

    def get_data(self, index: int) -> D:
        """The descriptor of item ``index`` of this batch."""
        return self._group[self._indices[index]]

    @property
    def arrays(self) -> MappingProxyType[str, jax.Array]:
        """``name -> jax.Array`` with a leading batch dimension."""
        return self._arrays

    def get_array(self, name: str) -> jax.Array:
        """The array called ``name``; same as ``arrays[name]``."""
        return self._arrays[name]

    @property
    def layouts(self) -> MappingProxyType[str, ArrayLayout]:
        """The memory layouts of the arrays: the group's ``loader_layouts`` if :attr:`uncached`,
        else its ``cache_layouts`` (for this process's share of the batch when several processes
        split it, see ``Dataloader``)."""
        return self._layouts

    @property
    def additional(self) -> MappingProxyType[str, list[Any]]:
        """``key -> list`` (one value per item, None where an item did not return the key)."""
        return self._additional

    def get_additional(self, key: str, index: int | None = None, *, default: Any = None) -> Any:
        """Extra data the loader returned under ``key``.

        With ``index`` None, a list with one value per item (``default`` where missing);
        otherwise the value for item ``index`` or ``default``.
        """
        values = self._additional.get(key)
        size = len(self)
        if index is None:
            if values is None:
                return [default] * size
            return [default if v is None else v for v in values]
        if values is None:
            if not -size <= index < size:
                raise IndexError(f"index {index} is invalid for batch size {size}")
            return default
        value = values[index]
        return default if value is None else value

    @property
    def item_errors(self) -> MappingProxyType[int, str]:
        """(hydrax extension) ``position -> error`` for the items of this batch whose loading
        failed, with ``Dataloader(on_item_error="skip_item")``: their places in the arrays are
        zeros and their extras are missing. Empty otherwise."""
        return self._item_errors

    @property
    def item_mask(self) -> np.ndarray:
        """(hydrax extension) One bool per item: False where the item failed and was skipped
        (see :attr:`item_errors`), to weight a loss or a metric with."""
        mask = np.ones(len(self), bool)
        mask[list(self._item_errors)] = False
        return mask

    @property
    def uncached(self) -> bool:
        """True while the batch holds the loader arrays; False once it holds the cache arrays
        (read from the cache, loaded in direct mode, or after :meth:`cache`)."""
        return self._uncached

    def cache(self, arrays: dict[str, jax.Array], additional: dict[str, list[Any]] | None = None, *, persist: bool = True) -> None:
        """Turn this uncached batch into its cached form, and store it in the on-disk cache.

        :param arrays: ``name -> jax.Array`` for every one of the group's ``cache_layouts``, each
            of exactly the layout's shape (with the batch dimension) and JAX dtype.
        :param additional: replaces the batch's extras: ``key -> list`` of one picklable value
            per item. None keeps the loader's.
        :param persist: write the batch file (on a cache writer thread; see ``cacher_count``).
            Nothing is written with False, for a read-only cache, or while the same file is
            already being written.

        The batch then reports ``uncached == False`` and the cache layouts, and later epochs and
        runs read it from the cache instead of loading it. Raises ``RuntimeError("batch is
        already cached")`` for a cached batch, ``RuntimeError("cache layouts undefined")`` for a
        group without cache arrays, and ``TypeError``/``ValueError`` (naming the array) for
        arrays that do not match the layouts.
        """
        if not self._uncached:
            raise RuntimeError("batch is already cached")
        target = self._cache_target
        layouts = None if target is None else target.layouts
        if layouts is None:
            raise RuntimeError("cache layouts undefined")
        check_cache_arrays(arrays, layouts)
        if additional is not None:
            check_cache_extras(additional, len(self))
            self._additional = MappingProxyType(dict(additional))
        self._arrays = MappingProxyType(dict(arrays))
        self._layouts = layouts
        self._uncached = False
        if persist:
            target.persist(self._arrays, self._additional)


class TrainingBatch(Batch[D]):
    """A batch of training data. Do not derive from or instantiate this class."""

    __slots__ = ("_epoch", "_epoch_batch", "_batch_num", "_seeds")

    def __init__(self, group, group_index, indices, arrays, additional, layouts, item_errors=None, *, epoch: int, epoch_batch: int, batch_num: int, seeds: Sequence[int], **cache: Any) -> None:
        super().__init__(group, group_index, indices, arrays, additional, layouts, item_errors, **cache)
        self._epoch = epoch
        self._epoch_batch = epoch_batch
        self._batch_num = batch_num
        self._seeds = seeds

    @property
    def is_training(self) -> bool:
        return True

    @property
    def epoch(self) -> int:
        """The 0-based training epoch."""
        return self._epoch

    @property
    def epoch_batch(self) -> int:
        """The batch's index within its epoch, counted across groups."""
        return self._epoch_batch

    @property
    def batch_num(self) -> int:
        """The global 0-based batch number, continuous across epochs and resumes."""
        return self._batch_num

    @property
    def seed(self) -> int:
        """The seed of item 0; item k was loaded with ``seed + k`` (``seeds[k]`` when this
        process loads non-adjacent blocks of a global batch, see ``Dataloader(sharding=...)``)."""
        return self._seeds[0]

    @property
    def seeds(self) -> Sequence[int]:
        """The seed of every item (a ``range``, unless this process loads non-adjacent blocks)."""
        return self._seeds

    def __repr__(self) -> str:
        return f"<TrainingBatch epoch={self._epoch} epoch_batch={self._epoch_batch} batch_num={self._batch_num}>"


class ValidationBatch(Batch[D]):
    """A batch of validation data. Do not derive from or instantiate this class."""

    __slots__ = ("_validation_epoch", "_validation_epoch_batch", "_validation_batch_num")

    def __init__(self, group, group_index, indices, arrays, additional, layouts, item_errors=None, *, validation_epoch: int, validation_epoch_batch: int, validation_batch_num: int, **cache: Any) -> None:
        super().__init__(group, group_index, indices, arrays, additional, layouts, item_errors, **cache)
        self._validation_epoch = validation_epoch
        self._validation_epoch_batch = validation_epoch_batch
        self._validation_batch_num = validation_batch_num

    @property
    def is_validation(self) -> bool:
        return True

    @property
    def validation_epoch(self) -> int:
        """Which validation run of this Dataloader run (from 0)."""
        return self._validation_epoch

    @property
    def validation_epoch_batch(self) -> int:
        """The batch's index within its validation run."""
        return self._validation_epoch_batch

    @property
    def validation_batch_num(self) -> int:
        """A counter of validation batches over this Dataloader run."""
        return self._validation_batch_num

    def __repr__(self) -> str:
        return f"<ValidationBatch validation_epoch={self._validation_epoch} validation_epoch_batch={self._validation_epoch_batch}>"
