"""Datasets of a billion items, through the real Dataloader: nothing of size N, exact resume, flat memory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Sequence

import jax.numpy as jnp
import numpy as np
import pytest
from support.timing import slack

from hydrax import Dataloader, DataGroup
from hydrax.order.orders import epoch_order

ARRAYS = {"item": ((), np.int64, jnp.int64)}


def load(item, arrays, seed):
    arrays["item"][...] = item


class Sharded(Sequence):
    """Items in shards, as a ShardSet gives them (what ``shardwise`` needs), without the files."""

    def __init__(self, sizes):
        self.sizes = list(sizes)
        self.total = sum(self.sizes)

    def shard_sizes(self):
        return self.sizes

    def __len__(self):
        return self.total

    def __getitem__(self, index):
        if not 0 <= index < self.total:
            raise IndexError(index)
        return int(index)


def indices_of(group, **kwargs):
    with Dataloader(load, group, **kwargs) as loader:
        out = []
        for batch in loader:
            assert np.asarray(batch.arrays["item"]).tolist() == list(batch.indices)
            out.append((batch.batch_num, list(batch.indices), list(batch.seeds)))
            del batch
    return out


SHARDS = [37, 3, 100, 0, 55, 12, 64, 64, 9, 41] * 4


@pytest.mark.parametrize("loaders", [1, 3])
def test_lazy_shardwise_with_partitions_resumes_exactly(loaders):
    group = lambda: DataGroup(16, Sharded(SHARDS), loader_arrays=ARRAYS, seed=3, shuffle_later="shardwise",  # noqa: E731
                              shard_window=2, shard_partitions=4, permutation="lazy")
    whole = indices_of(group(), end_at=("epoch", 3), loader_count=1)
    assert len(whole) == 3 * (sum(SHARDS) // 16)
    for epoch in range(3):
        items = [i for n, batch, _ in whole if n // (sum(SHARDS) // 16) == epoch for i in batch]
        assert len(set(items)) == len(items)  # every item at most once per epoch
    resumed = indices_of(group(), start_at=(1, 7), end_at=("epoch", 3), loader_count=loaders)
    assert resumed == whole[len(whole) // 3 + 7:]
    shares = [indices_of(group(), end_at=("epoch", 3), loader_count=loaders, process_index=p, process_count=2) for p in range(2)]
    assert [(n, a + b, s + t) for (n, a, s), (_, b, t) in zip(*shares)] == whole


SCRIPT = textwrap.dedent("""
    import json, resource, sys
    import numpy as np
    import jax.numpy as jnp
    from hydrax import Dataloader, DataGroup
    from hydrax.order.orders import epoch_order

    def load(item, arrays, seed):
        arrays["item"][...] = item

    n = 10**9
    group = DataGroup(4096, range(n), loader_arrays={"item": ((), np.int64, jnp.int64)}, seed=11, shuffle_first=True,
                      shuffle_later="itemwise", permutation="lazy")
    bpe = group.batch_count
    seen = []
    with Dataloader(load, group, loader_count=2, start_at=(7, bpe // 2), end_at=("batch", 7 * bpe + bpe // 2 + 3)) as loader:
        for batch in loader:
            want = epoch_order(group.plan, 7).local(group.plan, batch.group_index)
            assert np.asarray(batch.arrays["item"]).tolist() == list(batch.indices) == list(want)
            seen.append(batch.batch_num)
            del batch
    # VmHWM is this process's own peak: ru_maxrss also keeps the peak of the process it was forked
    # from before exec (pytest, hundreds of MB late in a run, when subprocess forks)
    peak_kb = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
    print(json.dumps({"batches": seen, "maxrss_mb": peak_kb / 1024,
                      "children_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}))
""")


def test_a_billion_items_cost_no_memory_of_their_size():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=slack(300),
                          env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    bpe = 10**9 // 4096
    assert report["batches"] == [7 * bpe + bpe // 2 + k for k in range(3)]
    # an order of 10**9 items would be 8 GB; the process (JAX included) stays a few hundred MB
    assert report["maxrss_mb"] < 700 and report["children_mb"] < 700, report


def _pss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith("Pss:"):
                return int(line.split()[1])
    return 0


def _loader_processes() -> list[int]:
    """This process and its loader workers (not the fork server, which may be importing in the background)."""
    import multiprocessing

    return [os.getpid()] + [p.pid for p in multiprocessing.active_children() if p.name.startswith("hydrax-loader")]


@pytest.mark.slow
@pytest.mark.parametrize("method", ["fork", "forkserver"])
@pytest.mark.parametrize("permutation", ["numpy", "lazy"])
def test_memory_stays_flat_epoch_after_epoch(permutation, method, monkeypatch):
    """12 epochs of an itemwise group of 400,000 items: an order kept per epoch (3.2 MB) in the
    main process or a worker would show as growth after the first epochs."""
    monkeypatch.setenv("HYDRAX_START_METHOD", method)
    n, batch = 400_000, 20_000
    group = DataGroup(batch, np.arange(n, dtype=np.int64), loader_arrays=ARRAYS, shuffle_first=True, shuffle_later="itemwise",
                      permutation=permutation)
    samples = {}
    with Dataloader(lambda item, arrays, seed: None, group, loader_count=2, end_at=("epoch", 12), depth=2) as loader:
        for batch_ in loader:
            epoch, position = divmod(batch_.batch_num, n // batch)
            del batch_
            if position == n // batch - 1 and epoch in (2, 11):
                samples[epoch] = sum(_pss_kb(pid) for pid in _loader_processes())
    growth = samples[11] - samples[2]
    assert growth < 0.05 * samples[2] + 4096, samples  # KB: under 5% (and 4 MB of noise)


def test_a_numpy_array_is_kept_as_an_array():
    data = np.arange(10**7, dtype=np.int64)
    group = DataGroup(1000, data, loader_arrays=ARRAYS)
    assert group.data is data
    assert isinstance(DataGroup(10, memoryview(bytearray(100)), loader_arrays=ARRAYS).data, memoryview)


def test_lazy_orders_are_the_same_with_any_loader_count():
    group = lambda: DataGroup(32, range(3000), loader_arrays=ARRAYS, seed=5, shuffle_first=True, shuffle_later="itemwise",  # noqa: E731
                              permutation="lazy")
    one = indices_of(group(), end_at=("epoch", 2), loader_count=1)
    assert one == indices_of(group(), end_at=("epoch", 2), loader_count=3)
    plan = group().plan
    assert [b for _, b, _ in one[:3]] == [list(epoch_order(plan, 0).local(plan, g)) for g in range(3)]
