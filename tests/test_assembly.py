"""Batch assembly: a finished slot becomes a Batch, aliasing it while another slot stays free."""

import gc
import logging

import jax
import numpy as np
import pytest
from support.workbench import workbench

from hydrax import TrainingBatch
from hydrax.run.assembly import BatchAssembler
from hydrax.cache.runcache import RunCache
from hydrax.order.schedule import local_seeds

pytestmark = pytest.mark.cpu_only


def load(item, arrays, seed):
    arrays["item"][...] = item
    arrays["seed"][...] = seed
    return {"double": 2 * item}


def loaded(bench, step, slot):
    """The record of the ``step``-th batch, loaded into ``slot`` by the bench's worker."""
    bench.pool.submit(bench.task(step + 1, step=step, slot=slot))
    done = bench.receive()
    record = bench.record(step + 1, step=step, slot=slot)
    record.take_completion(0, done.ok, done.extras, done.error, done.skipped)
    assert bench.arena.acquire() == slot
    return record


def assembler(bench, **kwargs):
    placer = BatchAssembler(arena=bench.arena, cache=RunCache(None), **{"placement_func": None, "zero_copy": None, **kwargs})
    bench.arena.on_release = placer.slot_released
    placer.start()
    return placer


def address(array):
    return array.addressable_data(0).unsafe_buffer_pointer()


def test_a_batch_aliases_its_slot_while_another_stays_free_and_is_copied_after():
    with workbench(load) as bench:
        placer = assembler(bench)
        assert placer.place_on_consumer and placer.cpu
        first = placer.place(loaded(bench, 0, 0))
        assert isinstance(first, TrainingBatch) and placer.held == {0}
        assert address(first.arrays["item"]) == bench.arena.map.address + bench.arena.slot_offsets[0]
        second = placer.place(loaded(bench, 1, 1))  # slot 0 is held: aliasing slot 1 could stall the loaders
        assert placer.held == {0} and address(second.arrays["item"]) != bench.arena.map.address + bench.arena.slot_offsets[1]
        assert placer.stats.as_dict()["aliased_batches"] == 1 and placer.stats.as_dict()["copied_batches"] == 1
        del first
        gc.collect()
        jax.effects_barrier()
        from hydrax.run.placement import collect_released_buffers

        collect_released_buffers(thorough=True)
        assert placer.held == set()  # the loop let go: the slot is free again


def test_the_batch_carries_its_items_seeds_extras_and_form():
    with workbench(load) as bench:
        placer = assembler(bench, zero_copy=False)
        record = loaded(bench, 1, 0)
        batch = placer.place(record)
        assert list(batch.indices) == list(record.indices) and np.asarray(batch.arrays["item"]).tolist() == list(record.indices)
        assert list(batch.seeds) == list(local_seeds(record.group.plan, 0, 1)) and batch.batch_num == 1
        assert batch.additional["double"] == [2 * i for i in record.indices]
        assert batch.uncached and batch.layouts is record.group.group.loader_layouts
        assert placer.stats.as_dict()["copied_batches"] == 1 and placer.held == set()  # a copy holds no slot


def test_a_placement_func_places_and_a_failing_one_frees_the_slot(monkeypatch):
    def placement(arrays, layouts, additional, group):
        return {name: jax.numpy.asarray(view) for name, view in arrays.items()}

    with workbench(load) as bench:
        placer = assembler(bench, placement_func=placement)
        assert not placer.place_on_consumer
        batch = placer.place(loaded(bench, 0, 0))
        assert placer.stats.as_dict()["custom_batches"] == 1 and np.asarray(batch.arrays["seed"]).shape == (4,)
        del batch
        gc.collect()
        placer = assembler(bench, placement_func=lambda *args: 1 / 0)
        # pytest keeps every log record, and the failure's record holds its traceback, whose
        # frames hold the slot's views: keep it out of pytest's hands
        monkeypatch.setattr(logging.getLogger("hydrax.run.pipeline"), "disabled", True)
        free = bench.arena.free_count
        with pytest.raises(ZeroDivisionError) as failure:
            placer.place(loaded(bench, 1, 1))
        del failure  # its traceback holds the views of the slot
        gc.collect()
        assert bench.arena.free_count == free  # the slot it took came back
