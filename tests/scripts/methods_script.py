"""Loaders and start-up hooks that a fork-server worker must receive by value, or cannot receive.

``methods_script.py MODE`` with MODE one of:

- ``bound``: the loader is a bound method of a class defined under the main guard (defect 4);
- ``hidden``: the loader lives in a module loaded from a file outside ``sys.path``, which a
  worker cannot import: the WorkerError must name that cause, not the main guard;
- ``startup``: ``startup_func`` raises: the WorkerError must carry its error;
- ``state``: ``startup_func`` sets globals of this script that the loader reads, the 0.2.2 way
  of keeping per-worker state: both travel by value, and still share their globals;
- ``lock``: the loader is a closure over a lock, which cannot be pickled: the TypeError must
  name it;
- ``pool``: after a hydrax run, the script's own forkserver Pool maps a function of this script:
  the fork server hydrax started still gives such processes the main module, with this
  process's command line, as multiprocessing's spawn preparation does.
"""

import importlib.util
import json
import multiprocessing as mp
import os
import sys
import threading

import jax.numpy as jnp
import numpy as np

from hydrax import DataGroup, Dataloader, WorkerError

HIDDEN = '''
def load(item, arrays, seed):
    arrays["x"][...] = item
'''
MODE = sys.argv[1]  # the main module reads its command line at the top


def group():
    return DataGroup(4, range(8), loader_arrays={"x": ((), np.int32, jnp.int32)})


def run(loader, **kwargs):
    try:
        with Dataloader(loader, group(), loader_count=2, end_at=("epoch", 1), timeout_sec=20, **kwargs) as dl:
            return {"method": dl.start_method, "values": [int(v) for batch in dl for v in batch.arrays["x"]]}
    except WorkerError as exc:
        return {"error": str(exc), "fields": {name: getattr(exc, name) for name in
                                              ("process_name", "pid", "exitcode", "signal", "item", "batch", "traceback")}}


def mode_and_square(n):
    return MODE, n * n


def locked_loader():
    guard = threading.Lock()

    def load(item, arrays, seed):
        with guard:
            arrays["x"][...] = item

    return load


OFFSET = None  # set in each worker by start_worker


def start_worker():
    global OFFSET, WORKER_PID
    OFFSET = 100
    WORKER_PID = os.getpid()  # a global this script never defines itself


def load_with_state(item, arrays, seed):
    assert WORKER_PID == os.getpid()
    arrays["x"][...] = item + OFFSET


def failing_startup():
    raise RuntimeError("the start-up hook cannot find its model")


if __name__ == "__main__":
    jnp.ones(1).block_until_ready()
    if MODE == "bound":

        class Scaler:
            def __init__(self, factor):
                self.factor = factor

            def load(self, item, arrays, seed):
                arrays["x"][...] = item * self.factor

        result = run(Scaler(5).load)
    elif MODE == "hidden":
        path = os.path.join(os.environ["HYDRAX_TEST_DIR"], "hidden_loaders.py")
        with open(path, "w") as f:
            f.write(HIDDEN)
        spec = importlib.util.spec_from_file_location("hidden_loaders", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules["hidden_loaders"] = module
        spec.loader.exec_module(module)
        result = run(module.load)
    elif MODE == "startup":
        result = run(lambda item, arrays, seed: None, startup_func=failing_startup)
    elif MODE == "state":
        result = run(load_with_state, startup_func=start_worker)
    elif MODE == "lock":
        try:
            result = run(locked_loader())
        except TypeError as exc:
            result = {"type_error": str(exc)}
    else:
        result = run(lambda item, arrays, seed: arrays["x"].fill(item))
        with mp.get_context("forkserver").Pool(1) as pool:
            result["pool"] = pool.map(mode_and_square, [2, 3])
    print(json.dumps(result))
