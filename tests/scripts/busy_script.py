"""A run whose workers are busy in a long item when the test kills this process (defect 3 of issue 11).

``busy_script.py fork|forkserver``: each worker, once inside ``load``, leaves a file named by its
pid in the directory ``HYDRAX_TEST_DIR`` names.
"""

import os
import sys
import time

import jax.numpy as jnp
import numpy as np

from hydrax import DataGroup, Dataloader


def load(item, arrays, seed):
    open(os.path.join(os.environ["HYDRAX_TEST_DIR"], str(os.getpid())), "w").close()
    time.sleep(60)
    arrays["x"][...] = item


if __name__ == "__main__":
    if sys.argv[1] == "forkserver":
        jnp.ones(1).block_until_ready()
    group = DataGroup(4, range(64), loader_arrays={"x": ((), np.int32, jnp.int32)})
    with Dataloader(load, group, loader_count=2, timeout_sec=120) as dl:
        print("METHOD", dl.start_method, flush=True)
        next(dl)
