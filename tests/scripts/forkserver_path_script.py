"""A training script for runs from a folder that holds a folder named ``hydrax`` (issue 20).

It makes JAX live, so that its workers start from the fork server, loads 8 items with 2 workers
and prints, as JSON, where this process and one of its workers found hydrax (and what that
worker saw of its environment).
"""

import json
import os

import jax.numpy as jnp
import numpy as np
from forkserver_path_loaders import load

import hydrax
import hydrax.shards.shardset as shardset
from hydrax import DataGroup, Dataloader

if __name__ == "__main__":
    jnp.ones(1).block_until_ready()  # a live JAX backend: workers come from the fork server
    group = DataGroup(4, range(8), loader_arrays={"x": ((), np.int32, jnp.int32)})
    with Dataloader(load, group, loader_count=2, end_at=("epoch", 1)) as dl:
        batches = list(dl)
        values = [int(v) for batch in batches for v in batch.arrays["x"]]
        seen = batches[0].get_additional("seen")[0] if batches else None
        method = dl.start_method
        del batches
    here = {"hydrax": hydrax.__file__, "shardset": shardset.__file__,
            "environ": [os.environ.get("PYTHONPATH"), os.environ.get("PYTHONSAFEPATH")]}
    print(json.dumps({"method": method, "values": values, "main": here, "worker": seen}))
