"""The engine of a run: arena, workers, pipeline, cache writers, started and stopped together."""

import os

import pytest
from support.workbench import drain, make_engine

from hydrax.errors import ConfigPicklingError
from hydrax.pipeline import End
from hydrax.processes import start_method
from hydrax.run import RunPolicy



def load(item, arrays, seed):
    arrays["item"][...] = item
    arrays["seed"][...] = seed


def engine(loader=load, policy=None, **group):
    return make_engine(loader, policy, **group)


def test_a_started_engine_runs_the_schedule_and_a_closed_one_leaves_nothing():
    run = engine()
    assert run.pipeline is None and run.method is None
    method = start_method()
    run.start()
    try:
        pids = [p.pid for p in run.pool.processes]
        assert len(pids) == 2 and run.method == method and run.agreement is None and run.cache.writer is None
        out = drain(run)
        assert isinstance(out[-1], End) and sum(out[:-1], []) == list(range(8))
    finally:
        arena = run.arena
        run.close()
    assert run.pool is None and run.arena is None and arena.acquire() is None
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_a_failed_start_can_be_closed(monkeypatch, tmp_path):
    monkeypatch.setenv("HYDRAX_START_METHOD", "forkserver")
    lock = __import__("threading").Lock()
    run = engine(loader=lambda item, arrays, seed: lock)  # a lock cannot be pickled for the fork server
    with pytest.raises(ConfigPicklingError, match="closure variable 'lock'"):
        run.start()
    run.close()
    assert run.pool is None and run.arena is None and run.cache is None


def test_a_writable_cache_gets_its_writers(tmp_path):
    run = engine(policy=RunPolicy(loader_count=1, cacher_count=2), cache_location=tmp_path)
    run.start()
    try:
        assert len(run.cache.writer._threads) == 2
    finally:
        run.close()
    assert run.cache is None
