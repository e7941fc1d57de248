"""Turning a finished slot into a :class:`~hydrax.Batch`: lease, placement, cache form, batch.

When every item of a batch is in its slot (or the batch was read from its cache file), the
:class:`BatchAssembler` leases the memory, has :mod:`hydrax.run.placement` make the ``jax.Array`` s
(the default placement, the user's ``placement_func``, or the run's sharding), queues the write
of a direct-mode cache file from the slot, and builds the :class:`~hydrax.TrainingBatch` or
:class:`~hydrax.ValidationBatch` with the form (cached or not) the cache decides.

It also keeps the set of slots whose batches the training loop still holds: on the CPU backend
a batch may alias its slot, and it does so only while another slot stays free for loading, so a
loop that keeps its batches gets copies instead of a stall.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

import numpy as np

from .. import _core
from ..procs.arena import Arena
from .batch import Batch, TrainingBatch, ValidationBatch
from ..cache.runcache import Outcome, RunCache
from .inflight import InFlight
from ..layout import ArrayLayout
from .placement import TransferStats, custom_placement, default_placement, sharded_placement
from ..order.schedule import TrainingStep, local_seeds

log = logging.getLogger("hydrax.run.pipeline")


class BatchAssembler:
    """Makes the batches of a run from their finished slots.

    :param zero_copy: the Dataloader's ``zero_copy`` (None: allowed).
    """

    def __init__(self, *, arena: Arena, cache: RunCache, placement_func: Callable | None, zero_copy: bool | None) -> None:
        self._arena = arena
        self._cache = cache
        self._placement_func = placement_func
        self._zero_copy = zero_copy
        self.stats = TransferStats()
        #: Slots whose batches the training loop still holds (a lease not yet released).
        self.held: set[int] = set()
        self.cpu = True
        #: Place when the batch is handed out, on the thread calling ``__next__``, rather than
        #: ahead on the pipeline thread (the default placement on the CPU backend: see
        #: :class:`hydrax.run.pipeline.Ready`).
        self.place_on_consumer = False

    def start(self) -> None:
        """Learn the JAX backend (on the pipeline thread: it may be the first to start JAX); on a
        CUDA GPU, page-lock the arena once, so transfers read the slots in place."""
        import jax

        backend = jax.default_backend()
        self.cpu = backend == "cpu"
        if backend in ("gpu", "cuda"):
            # Where pinning is not possible, transfers simply stay pageable.
            self.stats.pinned = self._arena.pin(getattr(jax.local_devices()[0], "local_hardware_id", 0) or 0)
        self._zero_copy = self._zero_copy is not False
        self.place_on_consumer = self.cpu and self._placement_func is None

    def slot_released(self, slot: int) -> None:
        """The training loop let go of the batch in ``slot``."""
        self.held.discard(slot)

    def place(self, record: InFlight) -> Batch:
        """The batch of ``record``; raises what placement raised (the slot is freed then)."""
        # Alias only while another slot stays free for loading: a loop that keeps batches then
        # costs copies instead of stalling the loaders.
        may_alias = bool(self._zero_copy) and len(self.held) < self._arena.depth - 1
        run, entry = record.group, record.cache
        layouts, size, additional = run.layout.arrays, run.layout.size, record.additional()
        if entry is not None and entry.batch is not None:
            layouts, size, additional = entry.cache.layouts, entry.cache.size, entry.batch.additional
            lease = entry.lease(record.slot, self._arena.free_now)
        else:
            lease = self._arena.lease(record.slot)
        try:
            arrays, path = self._arrays(record, lease, layouts, size, additional, may_alias)
        except Exception:
            log.exception("[hydrax] exception while placing %s of group %d:", record.words(), run.index)
            self._cache.abandon(entry)
            lease.seal()
            raise
        if entry is not None and entry.outcome is Outcome.WRITE:
            self._cache.write_from_slot(entry, lease, layouts, additional)
        lease.seal()
        if not lease.released:
            self.held.add(record.slot)
        self.stats.count(path, size)
        return self._batch(record, arrays, additional, layouts)

    def _arrays(self, record: InFlight, lease: _core.SlotLease, layouts: dict[str, ArrayLayout], size: int,
                additional: dict[str, list], may_alias: bool) -> tuple[dict[str, Any], str]:
        """The batch's ``jax.Array`` s, and the path they took (see :class:`~hydrax.run.placement.TransferStats`)."""
        run = record.group
        if run.sharding is not None:
            slot = np.frombuffer(lease, dtype=np.uint8, count=size)
            try:
                arrays, aliased = sharded_placement(slot, run.layout, run.sharding, self.cpu, may_alias)
            finally:
                del slot
            return arrays, "aliased" if aliased else "copied"
        views = {name: np.frombuffer(lease, dtype=lay.dtype, count=lay.count, offset=lay.offset).reshape(lay.shape)
                 for name, lay in layouts.items()}
        try:
            if self._placement_func is None:
                arrays, aliased = default_placement(views, layouts, self.cpu, may_alias)
                return arrays, "aliased" if aliased else "copied"
            return custom_placement(self._placement_func, views, layouts, additional, run.group), "custom"
        finally:
            del views

    def _batch(self, record: InFlight, arrays: dict[str, Any], additional: dict[str, list], layouts: dict[str, ArrayLayout]) -> Batch:
        run, step = record.group, record.step
        form = self._cache.form(run.cache, run.cache_layouts, record.cache, layouts)
        common = (run.group, step.group_index, record.indices, arrays, additional, form.layouts, record.skipped)
        if isinstance(step, TrainingStep):
            return TrainingBatch(
                *common, epoch=step.epoch, epoch_batch=step.epoch_batch, batch_num=step.batch_num,
                seeds=local_seeds(run.plan, step.epoch, step.group_index), uncached=form.uncached, cache_target=form.cache_target,
            )
        return ValidationBatch(
            *common, validation_epoch=step.validation_epoch, validation_epoch_batch=step.validation_epoch_batch,
            validation_batch_num=step.validation_batch_num, uncached=form.uncached, cache_target=form.cache_target,
        )
