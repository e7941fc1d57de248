"""Several processes splitting every batch: each loads its share, together they load the global run."""

import json
import os
import socket
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest

from hydrax import Dataloader, DataGroup
from hydrax.run.hosts import jax_process_split

ARRAYS = {"item": ((), np.int32, jnp.int32), "seed": ((), np.int32, jnp.int32), "pair": ((2,), np.float32, jnp.float32)}


def load(item, arrays, seed):
    arrays["item"][...] = item
    arrays["seed"][...] = -1 if seed is None else seed
    arrays["pair"][:] = (item, -item)
    return {"odd": item} if item % 2 else None


def run(end_at=("epoch", 3), permutation="numpy", **kwargs):
    """Every batch of a run with a shuffled training group and a validation group, as plain values."""
    training = DataGroup(8, range(100), loader_arrays=ARRAYS, seed=4, shuffle_first=True, shuffle_later="itemwise",
                         permutation=permutation)
    validation = DataGroup(4, range(1000, 1018), loader_arrays=ARRAYS, seed=9, shuffle_first=True, permutation=permutation)
    out = []
    with Dataloader(load, training, validation=("epoch", 1, validation), end_at=end_at, **kwargs) as loader:
        for batch in loader:
            arrays = {name: np.asarray(array) for name, array in batch.arrays.items()}
            assert {name: a.shape for name, a in arrays.items()} == {name: layout[0] for name, layout in batch.layouts.items()}
            out.append({
                "kind": "training" if batch.is_training else "validation",
                "number": batch.batch_num if batch.is_training else batch.validation_batch_num,
                "indices": list(batch.indices),
                "data": list(batch.data),
                "seeds": list(batch.seeds) if batch.is_training else None,
                "item": arrays["item"].tolist(), "seed": arrays["seed"].tolist(), "pair": arrays["pair"].tolist(),
                "odd": batch.get_additional("odd"),
            })
            del batch
    return out


def merge(shares):
    """The global batches, put together from each process's share of them."""
    assert len({len(share) for share in shares}) == 1  # every process gets the same number of batches
    merged = []
    for parts in zip(*shares):
        assert len({(p["kind"], p["number"]) for p in parts}) == 1
        whole = dict(parts[0])
        for key in ("indices", "data", "item", "seed", "pair", "odd") + (("seeds",) if whole["seeds"] is not None else ()):
            whole[key] = [value for p in parts for value in p[key]]
        merged.append(whole)
    return merged


@pytest.mark.parametrize("processes,permutation", [(2, "numpy"), (4, "numpy"), (2, "lazy"), (4, "lazy")])
def test_shares_put_together_are_the_single_process_run(processes, permutation):
    reference = run(loader_count=2, permutation=permutation)
    assert len(reference) == 3 * (12 + 4)
    shares = [run(loader_count=2, process_index=p, process_count=processes, permutation=permutation) for p in range(processes)]
    for share in shares:
        assert {len(b["indices"]) for b in share} == {8 // processes, 4 // processes}
        for b in share:
            assert b["item"] == b["data"] and (b["seeds"] is None or b["seed"] == b["seeds"])
    assert merge(shares) == reference


@pytest.mark.parametrize("permutation", ["numpy", "lazy"])
def test_a_share_resumes_exactly(permutation):
    full = run(loader_count=1, process_index=1, process_count=2, permutation=permutation)
    resumed = run(loader_count=2, process_index=1, process_count=2, start_at=(1, 5), permutation=permutation)
    first = 12 + 5
    # validation batch numbers count within one Dataloader run; the contents must match
    expected = [b for b in full if b["kind"] == "validation" and b["number"] >= 4 or b["kind"] == "training" and b["number"] >= first]
    strip = lambda batches: [dict(b, number=None) if b["kind"] == "validation" else b for b in batches]  # noqa: E731
    assert strip(resumed) == strip(expected)


def test_bad_splits_are_refused_with_the_reason():
    group = DataGroup(6, range(60), loader_arrays=ARRAYS)
    with pytest.raises(ValueError, match=r"training group 0 has batch_size 6, which 4 processes cannot split evenly"):
        Dataloader(load, group, process_index=0, process_count=4)
    with pytest.raises(ValueError, match="validation group 0 has batch_size 6"):
        Dataloader(load, DataGroup(4, range(8), loader_arrays=ARRAYS), validation=("epoch", 1, group), process_index=0, process_count=4)
    with pytest.raises(ValueError, match=r"process_index must be below process_count \(2\), got 2"):
        Dataloader(load, group, process_index=2, process_count=2)
    with pytest.raises(ValueError, match="go together"):
        Dataloader(load, group, process_count=2)
    with pytest.raises(ValueError, match="process_count must be at least 1"):
        Dataloader(load, group, process_index=0, process_count=0)


def test_a_single_process_loads_whole_batches_by_default():
    assert jax_process_split() == (0, 1)
    loader = Dataloader(load, DataGroup(6, range(60), loader_arrays=ARRAYS))
    assert (loader.process_index, loader.process_count) == (0, 1)


DISTRIBUTED = """
import json, sys
import jax
from tests.test_loader_processes import run

if __name__ == "__main__":
    jax.distributed.initialize(coordinator_address=sys.argv[1], num_processes=int(sys.argv[2]), process_id=int(sys.argv[3]))
    print(json.dumps(run(end_at=("epoch", 2), loader_count=2)))
"""


@pytest.mark.multiprocess
def test_the_split_comes_from_jax_distributed(tmp_path):
    """Two real JAX processes joined by jax.distributed: each loads its half without being told."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = tmp_path / "distributed_run.py"
    script.write_text(DISTRIBUTED)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]), JAX_PLATFORMS="cpu")
    procs = [
        subprocess.Popen([sys.executable, str(script), f"127.0.0.1:{port}", "2", str(p)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        for p in range(2)
    ]
    outputs = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 0, stderr[-3000:]
        outputs.append(json.loads(stdout.strip().splitlines()[-1]))
    assert {len(b["indices"]) for b in outputs[0]} == {4, 2}
    assert merge(outputs) == run(end_at=("epoch", 2), loader_count=2)
