"""A two-process JAX job that calls ``jax.distributed.initialize`` at module level (defect 1 of issue 11).

Run as ``distributed_script.py COORDINATOR_ADDRESS PROCESS_ID``. Running this top level again in
any helper process would register the same process id with the coordinator a second time.
"""

import json
import sys

import jax
import jax.numpy as jnp
import numpy as np

from hydrax import DataGroup, Dataloader

jax.distributed.initialize(coordinator_address=sys.argv[1], num_processes=2, process_id=int(sys.argv[2]))


def load(item, arrays, seed):
    arrays["x"][...] = item


if __name__ == "__main__":
    jnp.ones(1).block_until_ready()
    group = DataGroup(4, range(16), loader_arrays={"x": ((), np.int32, jnp.int32)})
    with Dataloader(load, group, loader_count=1, end_at=("epoch", 1), timeout_sec=30) as dl:
        values = [[int(v) for v in batch.arrays["x"]] for batch in dl]
        print(json.dumps({"method": dl.start_method, "process": dl.process_index, "values": values}), flush=True)
