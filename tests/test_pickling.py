"""Pickling what fork-server workers run: code keeps its file names, and a failure names its part."""

import os
import pickle
import threading

import pytest

from hydrax.procs.pickling import dumps, unpicklable_part


def make_closure():
    lock = threading.Lock()

    def load(item, arrays, seed):
        with lock:
            return item

    return load


class Holder:
    def __init__(self):
        self.name = "ok"
        self.lock = threading.Lock()


def test_a_function_travels_by_value_with_its_file_name():
    source = "def load(item, arrays, seed):\n    return item + 1\n"
    namespace = {"__name__": "__main__"}
    exec(compile(source, "/srv/train.py", "exec"), namespace)  # as if defined in a training script
    again = pickle.loads(dumps(namespace["load"]))
    assert again(1, None, None) == 2 and again.__code__.co_filename == "/srv/train.py"


def test_the_innermost_unpicklable_part_is_named():
    closure = make_closure()
    try:
        dumps(closure)
    except Exception as exc:
        where, cause = unpicklable_part(closure, "loader_func", exc, dumps)
    assert where == "loader_func's closure variable 'lock'" and "lock" in str(cause)
    holder = Holder()
    with pytest.raises(TypeError) as info:
        dumps({"data": [1, holder]})
    where, _ = unpicklable_part({"data": [1, holder]}, "the data", info.value, dumps)
    assert where == "the data['data'][1].lock"


def test_large_buffers_travel_once_in_shared_memory():
    import numpy as np

    from hydrax.procs.pickling import SHARED_BUFFER_BYTES, SharedBuffers, dumps, loads_shared

    big = np.arange(SHARED_BUFFER_BYTES // 4, dtype=np.int64)  # 2 MB
    small = np.arange(10, dtype=np.int32)
    value = {"big": big, "small": small, "view": big[::2], "fn": lambda i: int(big[i])}
    buffers: list = []
    payload = dumps(value, buffers)
    assert len(buffers) == 1 and len(payload) < big.nbytes  # big once (the closure shares it); the small view in band
    shared = SharedBuffers(buffers)
    fd = os.dup(shared.handle().fd)
    shared.close_fd()
    back = loads_shared(payload, fd, shared.size, shared.places)
    assert np.array_equal(back["big"], big) and np.array_equal(back["small"], small) and np.array_equal(back["view"], big[::2])
    assert not back["big"].flags.owndata and not back["big"].flags.writeable  # a view of the shared mapping
    assert back["fn"](12345) == 12345


def test_a_forkserver_worker_maps_a_large_array_instead_of_copying_it(monkeypatch):
    import multiprocessing

    import jax.numpy as jnp
    import numpy as np

    from hydrax import Dataloader, DataGroup

    monkeypatch.setenv("HYDRAX_START_METHOD", "forkserver")
    data = np.arange(4 << 20, dtype=np.int64)  # 32 MB
    group = DataGroup(512, data, loader_arrays={"x": ((), np.int64, jnp.int64)}, shuffle_first=True)
    # loaders of an earlier test in this process may still be exiting: only this run's count
    before = {p.pid for p in multiprocessing.active_children()}
    # worker -> seen with the mapping, looked at while the run is on (a worker that exits unmaps it)
    mapped: dict[int, bool] = {}
    with Dataloader(_copy_item, group, loader_count=2, end_at=("batch", 4)) as loader:
        for batch in loader:
            assert np.asarray(batch.arrays["x"]).tolist() == list(batch.indices)
            del batch
            for p in multiprocessing.active_children():
                if p.name.startswith("hydrax-loader") and p.pid not in before and not mapped.get(p.pid):
                    try:
                        with open(f"/proc/{p.pid}/maps") as f:
                            mapped[p.pid] = "memfd:hydrax-shared" in f.read()
                    except OSError:
                        pass
    assert len(mapped) == 2 and all(mapped.values()), mapped


def _copy_item(item, arrays, seed):
    arrays["x"][...] = item
