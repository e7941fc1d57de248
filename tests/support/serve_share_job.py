"""One producer of a reliable (sharded) serve, for tests/test_serve_reliable.py.

``python tests/support/serve_share_job.py URL INDEX COUNT START_EPOCH START_BATCH [DELAY]``: serves share
INDEX of COUNT of a small run (2 epochs, validation every epoch) starting at
(START_EPOCH, START_BATCH); DELAY seconds of sleep per item make it slow enough to kill mid-run.
HYDRAX_TEST_SHARED_MEMORY=1 serves with ``shared_memory=True``.
"""

import os
import sys
import time

import jax.numpy as jnp
import numpy as np

from hydrax import DataGroup, Dataloader
from hydrax.serve import Curve, serve

ARRAYS = {"item": ((), np.int32, jnp.int32), "seed": ((), np.uint32, jnp.uint32), "vec": ((3,), np.float32, jnp.float32)}
DELAY = 0.0  # seconds per item; set from the command line


def load(item, arrays, seed):
    if DELAY:
        time.sleep(DELAY)
    arrays["item"][...] = item
    arrays["seed"][...] = (seed or 0) & 0xFFFFFFFF
    arrays["vec"][:] = (item, item * 0.5, -item)


def make_loader(start=(0, 0)):
    """The run every test compares: 2 epochs of 10 batches of 4, and 3 validation batches per epoch."""
    seed = int(os.environ.get("HYDRAX_TEST_SEED", "5"))
    train = DataGroup(4, range(40), loader_arrays=ARRAYS, seed=seed, shuffle_first=True)
    valid = DataGroup(2, range(100, 106), loader_arrays=ARRAYS, seed=9)
    return Dataloader(load, train, validation=("epoch", 1, valid), start_at=start, end_at=("epoch", 2), loader_count=1, depth=2)


if __name__ == "__main__":
    url, index, count, epoch, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    DELAY = float(sys.argv[6]) if len(sys.argv) > 6 else 0.0
    # HYDRAX_TEST_CURVE="public,secret,server_public": serve through CurveZMQ as that client
    keys = os.environ.get("HYDRAX_TEST_CURVE")
    curve = Curve(*keys.split(",")) if keys else None
    loader = make_loader((epoch, batch))
    print("ready", flush=True)  # imports done: tests with short collector timeouts wait for this line
    shared = bool(os.environ.get("HYDRAX_TEST_SHARED_MEMORY"))  # through a shared memory ring, when on the collector's host
    report = serve(loader, url, share=(index, count), timeout=30, curve=curve, shared_memory=shared or None)
    print(f"complete {report.complete} shared {report.shared_batches} served {report.batches}", flush=True)
