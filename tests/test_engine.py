"""The engine of a run: arena, workers, pipeline, cache writers, started and stopped together."""

import multiprocessing
import os

import pytest
from support.workbench import drain, make_engine

from hydrax.errors import ConfigPicklingError
from hydrax.run.pipeline import End
from hydrax.procs.processes import start_method
from hydrax.run.plan import RunPolicy



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


class Announced(list):
    """A list that reads ahead: it records how many workers had started at each announcement."""

    def __init__(self, items):
        super().__init__(items)
        self.workers_then = []

    def prefetch(self, key, indices, order):
        self.workers_then.append(len(multiprocessing.active_children()))

    def release(self, key):
        pass

    def __reduce__(self):  # workers get a plain list: only the main process hears announcements
        return list, (list(self),)


def test_from_the_fork_server_the_first_batches_are_announced_before_the_workers_start(monkeypatch):
    # Their bytes are then on the way while the workers start. (Forked workers must not inherit
    # the threads read-ahead starts: then the pipeline announces once they exist.)
    monkeypatch.setenv("HYDRAX_START_METHOD", "forkserver")
    data = Announced(range(8))
    run = engine(data=data)
    run.start()
    try:
        out = drain(run)
        assert isinstance(out[-1], End) and sum(out[:-1], []) == list(range(8))
    finally:
        run.close()
    assert data.workers_then == [0, 0, 0, 0]  # the whole run (4 batches) heard of before any worker


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


def test_slots_larger_than_the_machine_are_refused_naming_the_array():
    """An item of (200000, 200000) float32 once failed in mmap with a bare OSError naming nothing."""
    import jax.numpy as jnp
    import numpy as np

    from hydrax import Dataloader, DataGroup
    from hydrax.procs.arena import machine_memory
    from hydrax.errors import ArenaMemoryError

    group = DataGroup(2, range(4), loader_arrays={"small": ((3,), np.int32, jnp.int32),
                                                    "huge": ((200_000, 200_000), np.float32, jnp.float32)})
    with pytest.raises(ArenaMemoryError, match=r"the batch slots need [\d,]+ bytes \(3 x [\d,]+\), more than this machine's "
                                               r"[\d,]+ bytes of memory: array 'huge' of training group 0 takes "
                                               r"320,000,000,000 bytes a batch \(shape \(2, 200000, 200000\), float32\)") as raised:
        with Dataloader(lambda item, arrays, seed: None, group):
            pass
    assert raised.value.available == machine_memory() and raised.value.needed > raised.value.available
    assert isinstance(raised.value, MemoryError)


def test_forced_fork_of_workers_that_would_hang_on_remote_reads_is_refused_before_any_starts(proxied, tmp_path, monkeypatch):
    """HYDRAX_START_METHOD=fork after remote shards were read here (obstore's threads run): the
    workers' first request would hang until the batch timeout, so the run is refused as it
    starts, naming the variable, the group and the threads; local data still forks."""
    import jax.numpy as jnp
    import numpy as np

    from hydrax import DataGroup, Dataloader
    from hydrax.errors import StartMethodError
    from hydrax.procs.processes import fork_hazards
    from hydrax.shards import ShardSet
    from test_shards_remote import ARRAYS, write_shards

    options, proxy, client = proxied
    remote = ShardSet(write_shards(tmp_path, client, count=2, options=options), s3=options, cache_dir=str(tmp_path / "cache"))
    assert fork_hazards()  # its set-up made requests from this process
    monkeypatch.setenv("HYDRAX_START_METHOD", "fork")
    before = set(multiprocessing.active_children())
    local = DataGroup(4, list(range(8)), loader_arrays={"item": ((), np.int64, jnp.int64)})
    with pytest.raises(StartMethodError, match="HYDRAX_START_METHOD=fork.*group 1 reads remote shards") as caught:
        with Dataloader(lambda *a: None, [local, DataGroup(10, remote, loader_arrays=ARRAYS)], loader_count=2, timeout_sec=30):
            pass
    assert caught.value.group == 1 and "obstore" in " ".join(caught.value.hazards)
    assert set(multiprocessing.active_children()) == before  # no worker was forked
    seen = []
    with Dataloader(load_item, local, loader_count=2, end_at=("epoch", 1), timeout_sec=30) as loader:
        seen = [int(i) for batch in loader for i in batch.indices]
    assert sorted(seen) == list(range(8))
    remote.close()


def load_item(item, arrays, seed):
    arrays["item"][...] = item

