"""What a run does with each batch of a cached group (:class:`RunCache`), and the form a batch is
handed out in.

A batch is *settled* into an :class:`Outcome`: read from its file, dropped (no file and no
loaders), or loaded, and then in direct mode written from its slot. The batch then goes out cached
or uncached (:class:`BatchForm`); an uncached one may carry a :class:`CacheTarget`, where
:meth:`hydrax.Batch.cache` puts it once the loop has checked its arrays
(:func:`check_cache_arrays`, :func:`check_cache_extras`). It knows nothing of workers or JAX
placement.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Callable, Mapping, NamedTuple

import numpy as np

from .. import _core
from ..layout import ArrayLayout, layouts_end
from .files import CachedBatch, GroupCache
from .writers import CacheWriter


def check_cache_arrays(arrays: Any, layouts: Mapping[str, ArrayLayout]) -> None:
    """What :meth:`hydrax.Batch.cache` requires of ``arrays``, with 0.2.2's messages: a dict with
    every cache array, each a ``jax.Array`` of the layout's exact shape and JAX dtype, and no
    other names."""
    import jax

    if not isinstance(arrays, dict):
        raise TypeError(f"arrays has non-dict type {type(arrays).__name__}")
    for name in layouts:
        if name not in arrays:
            raise ValueError(f"array '{name}' was not provided")
    for name, array in arrays.items():
        if not isinstance(array, jax.Array):
            raise TypeError(f"array '{name}' of type {type(array).__name__} is not a JAX array")
        expected = layouts.get(name)
        if expected is None:
            raise ValueError(f"array '{name}' has unexpected name")
        if tuple(expected.shape) != tuple(array.shape):
            raise ValueError(f"array '{name}' has shape {tuple(array.shape)}, not {tuple(expected.shape)}")
        if expected.jax_dtype != array.dtype:
            raise ValueError(f"array '{name}' has dtype {array.dtype}, not {expected.jax_dtype}")


def check_cache_extras(additional: Any, batch_size: int) -> None:
    """What :meth:`hydrax.Batch.cache` requires of ``additional``: a dict of lists, one value per item."""
    if not isinstance(additional, dict):
        raise TypeError(f"additional data has non-dict type {type(additional).__name__}")
    for name, values in additional.items():
        if not isinstance(values, list):
            raise TypeError(f"additional data '{name}' of type {type(values).__name__} is not a list")
        if len(values) != batch_size:
            raise ValueError(f"additional data '{name}' has length {len(values)}, expected {batch_size}")


@dataclass
class CacheTarget:
    """Where :meth:`hydrax.Batch.cache` puts a batch: the cache layouts to check against, and,
    unless the cache is read-only or has no location, the file and the run's writer."""

    layouts: MappingProxyType
    cache: GroupCache | None = None
    path: str | None = None
    writer: CacheWriter | None = None

    def persist(self, arrays: Mapping[str, Any], additional: Mapping[str, list]) -> bool:
        """Queue the write of the batch file; False when there is nothing to write to, or the
        path is already being written."""
        cache, path, writer = self.cache, self.path, self.writer
        if cache is None or cache.readonly or path is None or writer is None or not writer.claim(path):
            return False
        arrays, additional = dict(arrays), {key: list(values) for key, values in additional.items()}

        def write() -> None:
            # The conversion (a device-to-host copy off the CPU) runs here, on a writer thread.
            host = [(layout.offset, np.ascontiguousarray(np.asarray(arrays[name], dtype=layout.dtype)))
                    for name, layout in cache.layouts.items()]
            cache.write(path, host, additional)

        writer.submit(path, write)
        return True


class BatchForm(NamedTuple):
    """The form a batch is handed out in: its layouts, whether it holds the loader arrays
    (``uncached``), and where :meth:`hydrax.Batch.cache` would put it (None: nowhere)."""

    layouts: Mapping[str, ArrayLayout]
    uncached: bool
    cache_target: CacheTarget | None


class Outcome(enum.Enum):
    """What a run does with a batch of a group that has a cache on disk."""

    #: The batch is read from its file.
    READ = "read"
    #: There is no file and the group has no loaders: the batch is dropped.
    MISSING = "missing"
    #: The loaders load it (in explicit mode the training loop may then cache it itself).
    LOAD = "load"
    #: Direct mode: the loaders load it and it is written from its slot; its path is claimed until then.
    WRITE = "write"
    #: Direct mode: loaded, and its write queued (the writer frees the path when done).
    QUEUED = "queued"


@dataclass
class CacheEntry:
    """One batch's file in its group's cache, and what the run does with it."""

    cache: GroupCache
    path: str
    outcome: Outcome
    #: The batch read from the file (``READ``), until :meth:`lease` hands it on.
    batch: CachedBatch | None = None

    @property
    def handed_out_cached(self) -> bool:
        """Whether the batch reaches the training loop in its cached form (read, or direct mode)."""
        return self.outcome is Outcome.READ or self.cache.direct

    def lease(self, slot: int, on_free: Callable[[int], object]) -> _core.SlotLease:
        """The lease over the arrays of the batch read from the file (see :meth:`CachedBatch.lease`);
        the lease holds the mapping from then on."""
        batch, self.batch = self.batch, None
        return batch.lease(slot, on_free)


class RunCache:
    """A run's use of its groups' caches: whether each batch is read from its file, dropped, or
    loaded (and then, in direct mode, written from its slot), and the writer threads.

    :param writer: the run's writer threads; None when every cache is read-only.
    """

    def __init__(self, writer: CacheWriter | None) -> None:
        self.writer = writer

    def settle(self, cache: GroupCache, epoch: int, index: int, training: bool) -> CacheEntry:
        """What becomes of batch ``index`` of ``epoch``: read from its file when it is there and
        no one is writing it, dropped when it is not there and the group has no loaders, loaded
        otherwise (and claimed for writing, in direct mode)."""
        path = cache.path(epoch, index, training)
        writer = self.writer
        # A path in flight is being loaded or written right now: never read it (hydrax 0.2.2 did,
        # and unpickled half a file); load the batch again instead.
        if writer is None or not writer.in_flight(path):
            batch = cache.open(path)
            if batch is not None:
                return CacheEntry(cache, path, Outcome.READ, batch)
        if cache.loaderless:
            return CacheEntry(cache, path, Outcome.MISSING)
        if cache.direct and writer is not None and writer.claim(path):
            return CacheEntry(cache, path, Outcome.WRITE)
        return CacheEntry(cache, path, Outcome.LOAD)

    def abandon(self, entry: CacheEntry | None) -> None:
        """The batch will not be written after all (it failed, or was not placed): free its path."""
        if entry is not None and entry.outcome is Outcome.WRITE:
            entry.outcome = Outcome.LOAD
            self.writer.release(entry.path)

    def write_from_slot(self, entry: CacheEntry, lease: _core.SlotLease, layouts: Mapping[str, ArrayLayout],
                        additional: Mapping[str, list[Any]]) -> None:
        """Queue the write of a batch loaded in direct mode, from its slot: the writer's views keep
        the slot from being recycled until the file is written."""
        entry.outcome = Outcome.QUEUED
        cache, path = entry.cache, entry.path
        slot = np.frombuffer(lease, dtype=np.uint8, count=max(layouts_end(layouts), 1))
        chunks = [(cache.layouts[name].offset, slot[layout.offset : layout.end]) for name, layout in layouts.items()]
        del slot
        extras = {key: list(values) for key, values in additional.items()}
        self.writer.submit(path, lambda: cache.write(path, chunks, extras))

    def form(self, cache: GroupCache | None, cache_layouts: Mapping[str, ArrayLayout] | None, entry: CacheEntry | None,
             layouts: Mapping[str, ArrayLayout]) -> BatchForm:
        """The form of a batch with the arrays at ``layouts``: cached when it was read or its group
        caches in direct mode; otherwise uncached, and cacheable by the loop when its group has
        ``cache_layouts`` (what :meth:`hydrax.Batch.cache` checks against)."""
        if entry is not None and entry.handed_out_cached:
            return BatchForm(cache.layouts, False, None)
        if cache_layouts is not None:
            return BatchForm(layouts, True, CacheTarget(cache_layouts, cache, None if entry is None else entry.path, self.writer))
        return BatchForm(layouts, True, None)

    def close(self) -> None:
        """Finish the queued writes (the queued batch files are written, not lost)."""
        if self.writer is not None:
            self.writer.close()
