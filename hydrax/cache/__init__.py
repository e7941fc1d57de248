"""The on-disk batch cache of hydrax 0.2 (the ``cache_*`` arguments of :class:`hydrax.DataGroup`).

A cache is a directory. ``cache.json`` describes the batches it holds (the ``hydrax-cache-v1``
descriptor: data length, batch size, seed, shuffle modes and where each array lies in a batch),
and every batch is one file, ``e{epoch}-b{index}.dat``: the arrays' bytes at their offsets
(``cache_size`` bytes), followed by a pickle of the batch's ``additional`` dict. The format,
the names and the descriptor text are hydrax 0.2.2's, byte for byte, so either library reads
what the other wrote.

The package holds one concern a module, and every name is importable from here:

- :mod:`~hydrax.cache.settings`: a group's cache arguments as 0.2.2 resolves them
  (:class:`CacheSettings`);
- :mod:`~hydrax.cache.descriptor`: the descriptor text (:func:`descriptor_text`), and checking
  or creating a cache by it (:func:`prepare_location`);
- :mod:`~hydrax.cache.files`: the batch files: their names, reading one through a read-only
  mapping, and writing one so that it appears under its name only when complete (a temporary
  name, ``fsync``, ``rename``: a run killed mid-write leaves no half file); and a run's open cache
  of one group (:class:`GroupCache`; the run opens it from its group:
  :func:`hydrax.run.plan.open_group_cache`);
- :mod:`~hydrax.cache.writers`: the writer threads, which also know the paths in flight, never
  read (:class:`CacheWriter`);
- :mod:`~hydrax.cache.runcache`: what a run does with each batch (:class:`RunCache`): read it
  from its file, drop it, or load it and (direct mode) write it from its slot, and the form a
  batch is handed out in (:class:`BatchForm`, :class:`CacheTarget` for :meth:`hydrax.Batch.cache`).

It knows nothing of workers or JAX placement.

The extras are a pickle, and unpickling runs code named in it: treat a cache directory as
trusted input, as you would a checkpoint. hydrax reads at most
:data:`~hydrax.cache.files.MAX_EXTRAS_BYTES` of it.
"""

from .descriptor import CACHE_TYPE, DESCRIPTOR, descriptor_text, prepare_location
from .files import (MAX_EXTRAS_BYTES, PER_EPOCH_MODES, PICKLE_PROTOCOL, CachedBatch, GroupCache, batch_file_name, file_epoch,
                    open_batch_file, remove_stale_temporaries, share_directory, temporary_name, write_batch_file)
from .runcache import BatchForm, CacheEntry, CacheTarget, Outcome, RunCache, check_cache_arrays, check_cache_extras
from .settings import CacheSettings
from .writers import CacheWriter

__all__ = [
    "CACHE_TYPE", "DESCRIPTOR", "MAX_EXTRAS_BYTES", "PER_EPOCH_MODES", "PICKLE_PROTOCOL", "BatchForm", "CacheEntry", "CacheSettings",
    "CacheTarget", "CacheWriter", "CachedBatch", "GroupCache", "Outcome", "RunCache", "batch_file_name", "check_cache_arrays",
    "check_cache_extras", "descriptor_text", "file_epoch", "open_batch_file", "prepare_location", "remove_stale_temporaries",
    "share_directory", "temporary_name", "write_batch_file",
]
