"""Two Dataloaders in sequence with a lambda and a closure as loaders, and no JAX code of the
script's own (defect 2 of issue 11): the first run initialises JAX, so the second starts its
workers from the fork server."""

import json

import jax.numpy as jnp
import numpy as np

from hydrax import DataGroup, Dataloader


def scaled(factor):
    def load(item, arrays, seed):
        arrays["x"][...] = item * factor

    return load


def run(loader):
    group = DataGroup(4, range(8), loader_arrays={"x": ((), np.int32, jnp.int32)})
    with Dataloader(loader, group, loader_count=2, end_at=("epoch", 1)) as dl:
        values = [int(v) for batch in dl for v in batch.arrays["x"]]
        return dl.start_method, values


if __name__ == "__main__":
    first = run(lambda item, arrays, seed: arrays["x"].fill(item + 1))
    second = run(lambda item, arrays, seed: arrays["x"].fill(item + 2))
    third = run(scaled(3))
    print(json.dumps({"runs": [first, second, third]}))
