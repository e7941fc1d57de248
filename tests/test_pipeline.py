"""The pipeline thread: batches out in schedule order (or as they come), losses counted, errors queued."""

import time

import pytest
from support.workbench import drain, make_engine

from hydrax.errors import StoreError, WorkerError
from hydrax.run.pipeline import End, Failure, chunk_bounds
from hydrax.run.plan import RunPolicy


def load(item, arrays, seed):
    arrays["item"][...] = item
    arrays["seed"][...] = seed


def load_first_batch_slowly(item, arrays, seed):
    if item < 2:
        time.sleep(1.0)
    load(item, arrays, seed)


def load_failing_on_5(item, arrays, seed):
    if item == 5:
        raise ValueError("five")
    load(item, arrays, seed)


def load_from_a_dead_store(item, arrays, seed):
    if item == 3:
        raise StoreError("connection refused", url="s3://b/x.tar", offset=512)
    load(item, arrays, seed)


def load_dying(item, arrays, seed):
    if item == 3:
        import os

        os._exit(3)
    load(item, arrays, seed)


def run(loader, policy=None, **kwargs):
    engine = make_engine(loader, policy, **kwargs)
    engine.start()
    try:
        return engine, drain(engine)
    finally:
        engine.close()


@pytest.mark.parametrize("batch_size, chunks", [(1, 4), (7, 3), (64, 8), (5, 5), (3, 1)])
def test_chunks_cover_the_batch_in_near_equal_ranges(batch_size, chunks):
    bounds = chunk_bounds(batch_size, chunks)
    assert bounds[0][0] == 0 and bounds[-1][1] == batch_size and len(bounds) == min(chunks, batch_size)
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
    sizes = [end - start for start, end in bounds]
    assert max(sizes) - min(sizes) <= 1


def test_a_slow_batch_still_comes_first_and_a_non_deterministic_run_does_not_wait_for_it():
    # The first batch is spread over every worker: with 4 workers, its 2 slow items hold 2 of
    # them, and the other 2 load the next batches meanwhile.
    _, ordered = run(load_first_batch_slowly, RunPolicy(loader_count=4, depth=4))
    assert ordered[:-1] == [[0, 1], [2, 3], [4, 5], [6, 7]] and isinstance(ordered[-1], End)
    _, loose = run(load_first_batch_slowly, RunPolicy(loader_count=4, depth=4, deterministic=False))
    assert sorted(loose[:-1]) == [[0, 1], [2, 3], [4, 5], [6, 7]] and loose[0] != [0, 1]


def test_a_dropped_batch_leaves_a_gap_and_is_counted():
    engine, out = run(load_failing_on_5)
    assert out[:-1] == [[0, 1], [2, 3], [6, 7]] and isinstance(out[-1], End)
    assert (engine.pipeline.budget.dropped_batches, engine.pipeline.budget.failed_items) == (1, 1)


def test_a_run_that_never_drops_queues_the_failure_instead():
    _, out = run(load_failing_on_5, RunPolicy(loader_count=2, never_drop=True))
    assert out[:-1] == [[0, 1], [2, 3]] and isinstance(out[-1], Failure) and out[-1].error.batch == "batch 2 (epoch 0)"


def test_data_that_cannot_be_read_ends_the_run_with_its_own_error():
    _, out = run(load_from_a_dead_store)
    error = out[-1].error
    assert isinstance(out[-1], Failure) and isinstance(error, StoreError) and (error.url, error.offset) == ("s3://b/x.tar", 512)


def test_a_worker_that_dies_ends_the_run_naming_it():
    _, out = run(load_dying, RunPolicy(loader_count=1))
    error = out[-1].error
    assert isinstance(error, WorkerError) and error.exitcode == 3 and error.item == "3" and error.batch == "batch 1 (epoch 0)"
