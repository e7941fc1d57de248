"""The shard-aware order: local reads, pure in (seed, epoch), the same for any worker or host count."""

import jax.numpy as jnp
import numpy as np
import pytest

from hydrax import Dataloader, DataGroup
from collections import Counter

from hydrax.order.schedule import GroupPlan, Plan, batch_items, batch_seed, host_positions, iter_steps
from hydrax.order.shardwise import shardwise_order
from hydrax.order.orders import host_shards, item_order
from hydrax.shards import ShardSet

SIZES = (7, 3, 12, 5, 9, 1, 6, 8)


def shard_of(item: int) -> int:
    return int(np.searchsorted(np.cumsum(SIZES), item, side="right"))


@pytest.mark.parametrize("window", [1, 2, 3, 8])
def test_each_epoch_is_a_permutation_that_reads_few_shards_at_a_time(window):
    for epoch in range(4):
        order = shardwise_order(SIZES, 11, epoch, window)
        assert sorted(order.tolist()) == list(range(sum(SIZES)))
        # walk the runs: each one draws from at most `window` shards
        shard_order = np.random.Generator(np.random.PCG64(11 + epoch)).permutation(len(SIZES))
        position = 0
        for first in range(0, len(SIZES), window):
            run = shard_order[first : first + window]
            length = sum(SIZES[s] for s in run)
            assert {shard_of(i) for i in order[position : position + length].tolist()} == set(run.tolist())
            position += length


def test_the_order_is_a_pure_function_of_seed_and_epoch():
    assert shardwise_order(SIZES, 3, 2, 2).tolist() == shardwise_order(SIZES, 3, 2, 2).tolist()
    assert shardwise_order(SIZES, 3, 2, 2).tolist() != shardwise_order(SIZES, 3, 1, 2).tolist()
    assert shardwise_order(SIZES, 3, 0, 2).tolist() != list(range(sum(SIZES)))  # epoch 0 is shuffled too
    plan = GroupPlan(sum(SIZES), 4, sum(SIZES) // 4, 3, False, "shardwise", SIZES, 2)
    assert item_order(plan, 2).tolist() == shardwise_order(SIZES, 3, 2, 2).tolist()
    assert batch_seed(plan, 2, 1) == 3 + 2 * plan.batch_count * 4 + 4  # seeds move every epoch


@pytest.mark.parametrize("processes", [1, 2, 4])
def test_hosts_split_every_global_batch_and_run_out_together(processes):
    plan = GroupPlan(sum(SIZES), 8, sum(SIZES) // 8, 5, False, "shardwise", SIZES, 3)
    steps = list(iter_steps(Plan(training=(plan,), end=("epoch", 3))))
    global_items = [list(batch_items(item_order(plan, s.epoch), 8, s.group_index)) for s in steps]
    per_host = [[[batch[k] for k in host_positions(8, p, processes)] for batch in global_items] for p in range(processes)]
    assert len({len(batches) for batches in per_host}) == 1  # the same number of batches everywhere
    for b, batch in enumerate(global_items):
        assert [item for host in per_host for item in host[b]] == batch  # together: the global batch


def test_host_positions_refuse_what_cannot_split():
    with pytest.raises(ValueError, match="multiple of the process count 3"):
        host_positions(8, 0, 3)
    with pytest.raises(ValueError, match=r"process_index must be in \[0, 2\)"):
        host_positions(8, 2, 2)


@pytest.fixture
def shards(tmp_path):
    wds = pytest.importorskip("webdataset")
    for s, size in enumerate(SIZES):
        with wds.TarWriter(str(tmp_path / f"part-{s:02d}.tar")) as sink:
            for i in range(size):
                sink.write({"__key__": f"s{s}_{i:02d}", "shard": str(s).encode()})
    return ShardSet(f"{tmp_path}/part-{{00..07}}.tar")


def load_shard_number(sample, arrays, seed):
    arrays["shard"][...] = int(bytes(sample["shard"]))
    arrays["seed"][...] = seed


def group_of(dataset, batch_size=4, shard_partitions=1):
    return DataGroup(batch_size, dataset, loader_arrays={"shard": ((), np.int32, jnp.int32), "seed": ((), np.int32, jnp.int32)},
                     seed=9, shuffle_later="shardwise", shard_window=2, shard_partitions=shard_partitions)


def run(dataset, shard_partitions=1, **kwargs):
    group = group_of(dataset, shard_partitions=shard_partitions)
    out = []
    with Dataloader(load_shard_number, group, end_at=("epoch", 3), **kwargs) as loader:
        for batch in loader:
            out.append((batch.batch_num, list(batch.indices), np.asarray(batch.arrays["shard"]).tolist(), np.asarray(batch.arrays["seed"]).tolist()))
            del batch
    return out


def test_shardwise_loading_is_independent_of_workers_and_resumes_exactly(shards):
    reference = run(shards, loader_count=1)
    assert len(reference) == 3 * (sum(SIZES) // 4)
    assert run(shards, loader_count=2) == reference
    assert run(shards, loader_count=4, depth=2) == reference
    for start in [(0, 3), (1, 0), (2, 5)]:
        first = start[0] * (sum(SIZES) // 4) + start[1]
        assert run(shards, loader_count=2, start_at=start) == [b for b in reference if b[0] >= first]
    for _, indices, loaded_shards, _ in reference:
        assert loaded_shards == [shard_of(i) for i in indices]


def test_shardwise_needs_data_that_knows_its_shards():
    with pytest.raises(ValueError, match="needs data that knows its shards"):
        DataGroup(2, range(10), loader_arrays={"x": ((), np.int32, jnp.int32)}, shuffle_later="shardwise")


@pytest.mark.parametrize("processes", [2, 4])
def test_processes_share_every_batch_of_uneven_shards(shards, processes):
    reference = run(shards, loader_count=1)
    for start in [(0, 0), (1, 7)]:
        first = start[0] * (sum(SIZES) // 4) + start[1]
        shares = [run(shards, loader_count=2, start_at=start, process_index=p, process_count=processes) for p in range(processes)]
        assert len({len(share) for share in shares}) == 1  # no process runs out before another
        merged = [
            (parts[0][0], *[[v for part in parts for v in part[field]] for field in (1, 2, 3)])
            for parts in zip(*shares)
        ]
        assert merged == [b for b in reference if b[0] >= first]


def test_hosts_with_partitions_load_the_single_process_run_from_their_own_shards(shards):
    """Two hosts, two partitions: together they load the single-process run, each mostly from its own shards."""
    reference = run(shards, shard_partitions=2, loader_count=1)
    plan = group_of(shards, shard_partitions=2).plan
    batches = sum(SIZES) // 4
    assert [list(batch_items(item_order(plan, b[0] // batches), 4, b[0] % batches)) for b in reference] == [b[1] for b in reference]
    for start, loaders in (((0, 0), 2), ((1, 5), 1)):  # a run resumes exactly with a different host count
        first = start[0] * batches + start[1]
        shares = [run(shards, shard_partitions=2, loader_count=loaders, start_at=start, process_index=p, process_count=2) for p in range(2)]
        merged = [(parts[0][0], *[[v for part in parts for v in part[field]] for field in (1, 2, 3)]) for parts in zip(*shares)]
        assert merged == [b for b in reference if b[0] >= first]
        if start == (0, 0):
            for p, share in enumerate(shares):
                for epoch in range(3):
                    loaded = Counter(s for b in share if b[0] // batches == epoch for s in b[2])
                    assert loaded == Counter(host_shards(plan, epoch, p, 2))  # the shards it read: host_shards says which


def test_a_process_count_must_divide_the_partitions(shards):
    group = group_of(shards, batch_size=8, shard_partitions=2)
    with pytest.raises(ValueError, match=r"training group 0 has shard_partitions=2, which process_count=4 does not divide"):
        Dataloader(load_shard_number, group, process_index=0, process_count=4)
    assert Dataloader(load_shard_number, group, process_index=1, process_count=2).process_count == 2
    # validation order has no partitions: any process count that splits the batch will do
    validation = Dataloader(load_shard_number, group_of(shards, 8), validation=("epoch", 1, group), process_index=0, process_count=4)
    assert validation.process_count == 4
