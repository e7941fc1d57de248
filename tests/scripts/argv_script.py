"""A 0.2.2-style training script whose top level reads the command line (defect 1 of issue 11).

Run as ``argv_script.py N [--offset K]`` with ``HYDRAX_TEST_TRACE`` naming a file: every run of
this file's top level appends its pid there, so the test sees whether any helper process ran it.
"""

import argparse
import json
import os
import sys

import jax.numpy as jnp
import numpy as np
from script_loaders import load_with_context

from hydrax import DataGroup, Dataloader

with open(os.environ["HYDRAX_TEST_TRACE"], "a") as trace:
    trace.write(f"{os.getpid()}\n")

N = int(sys.argv[1])  # crashes a process that imports this file with sys.argv == ['-c']
parser = argparse.ArgumentParser()
parser.add_argument("n", type=int)
parser.add_argument("--offset", type=int, default=0)
ARGS = parser.parse_args()  # silently the defaults with another command line


def load(item, arrays, seed):
    arrays["x"][...] = item * N + ARGS.offset


def group():
    return DataGroup(4, range(8), loader_arrays={"x": ((), np.int32, jnp.int32)})


if __name__ == "__main__":
    jnp.ones(1).block_until_ready()  # a live JAX backend: workers come from the fork server
    with Dataloader(load, group(), loader_count=2, end_at=("epoch", 1)) as dl:
        values = [int(v) for batch in dl for v in batch.arrays["x"]]
        method = dl.start_method
    with Dataloader(load_with_context, group(), loader_count=1, end_at=("epoch", 1)) as dl:
        batches = list(dl)
        imported = [int(v) for batch in batches for v in batch.arrays["x"]]
        context = batches[0].get_additional("argv")[0], batches[0].get_additional("cwd")[0]
        del batches
    print(json.dumps({"method": method, "values": values, "imported": imported, "argv": context[0], "cwd": context[1]}))
