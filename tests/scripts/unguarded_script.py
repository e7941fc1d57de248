"""A script without a main guard that computes with JAX before its Dataloader: its workers come
from the fork server, and no helper process runs this top level again."""

import json

import jax.numpy as jnp
import numpy as np

from hydrax import DataGroup, Dataloader


def load(item, arrays, seed):
    arrays["x"][...] = item * 2


jnp.ones(1).block_until_ready()
with Dataloader(load, DataGroup(4, range(8), loader_arrays={"x": ((), np.int32, jnp.int32)}), loader_count=2, end_at=("epoch", 1)) as dl:
    print(json.dumps({"method": dl.start_method, "values": [int(v) for batch in dl for v in batch.arrays["x"]]}))
