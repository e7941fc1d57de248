"""A loader whose extras for one item cannot be pickled (defect 4 of issue 11).

``extras_script.py plain|strict fork|forkserver``: ``strict`` splits batches over two (simulated)
processes, so the failed batch raises BatchFailedError; ``forkserver`` makes JAX live first.
"""

import json
import sys
import threading

import jax.numpy as jnp
import numpy as np

from hydrax import BatchFailedError, DataGroup, Dataloader


def load(item, arrays, seed):
    arrays["x"][...] = item
    if item == 5:
        return {"label": item, "handle": threading.Lock()}
    return {"label": item}


if __name__ == "__main__":
    if sys.argv[2] == "forkserver":
        jnp.ones(1).block_until_ready()
    group = DataGroup(4, range(16), loader_arrays={"x": ((), np.int32, jnp.int32)})
    split = {"process_index": 0, "process_count": 2} if sys.argv[1] == "strict" else {}
    delivered, error = [], None
    try:
        with Dataloader(load, group, loader_count=2, end_at=("epoch", 1), **split) as dl:
            method = dl.start_method
            for batch in dl:
                delivered.append(batch.get_additional("label"))
                del batch
    except BatchFailedError as exc:
        error = str(exc)
    print(json.dumps({"method": method, "delivered": delivered, "error": error}))
