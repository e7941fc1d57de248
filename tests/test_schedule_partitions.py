"""Canonical shard partitions: with P hosts, each reads about 1/P of the shards every epoch.

Pure tests of :func:`hydrax.order.shardwise.shardwise_order` with ``partitions`` > 1,
:func:`~hydrax.order.shardwise.partition_shards` and :func:`~hydrax.order.schedule.host_shards`; the loader
test with real processes is in ``test_shards_sampler.py``.
"""

from collections import Counter

import numpy as np
import pytest

from hydrax.order.schedule import GroupPlan, Plan, batch_items, host_positions, host_share, iter_steps, local_items
from hydrax.order.shardwise import partition_shards, shardwise_order
from hydrax.order.orders import host_shards, item_order

#: Uneven shards: a few large, some tiny, one empty.
SIZES = (23, 7, 31, 12, 5, 18, 27, 9, 14, 3, 21, 16, 11, 25, 8, 19, 0, 13, 22, 6, 17, 10, 29, 15)


def reference_shardwise_order(shard_sizes, seed, epoch, window):
    """The shardwise order as it was before partitions existed (kept here verbatim as the oracle)."""
    sizes = np.asarray(shard_sizes, np.int64)
    starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    shards = np.random.Generator(np.random.PCG64(seed + epoch)).permutation(len(sizes))
    pieces = []
    for run, first in enumerate(range(0, len(shards), window)):
        chosen = shards[first : first + window]
        items = np.concatenate([np.arange(starts[s], starts[s] + sizes[s], dtype=np.int64) for s in chosen])
        rng = np.random.Generator(np.random.PCG64([seed, epoch, run]))
        pieces.append(items[rng.permutation(len(items))])
    return np.concatenate(pieces) if pieces else np.empty(0, np.int64)


def make_plan(sizes=SIZES, batch_size=16, seed=5, window=3, partitions=4):
    return GroupPlan(sum(sizes), batch_size, sum(sizes) // batch_size, seed, False, "shardwise", tuple(sizes), window,
                     shard_partitions=partitions)


def shard_of(sizes, items):
    return np.searchsorted(np.cumsum(sizes), np.asarray(items), side="right")


def partition_streams(plan, epoch):
    """Each partition's positions of every batch, in batch order: the stream it is fed."""
    k = plan.batch_size // plan.shard_partitions
    used = item_order(plan, epoch)[: plan.batch_count * plan.batch_size].reshape(plan.batch_count, plan.shard_partitions, k)
    return [used[:, p, :].ravel() for p in range(plan.shard_partitions)]


# -- one partition: exactly the order of earlier versions -------------------------------------------


def test_one_partition_is_bit_identical_to_the_earlier_order():
    rng = np.random.default_rng(2024)
    cases = 0
    for _ in range(400):
        sizes = tuple(int(n) for n in rng.integers(0, 40, int(rng.integers(0, 40))))
        seed = int(rng.choice([0, 1, 7, 2**31 - 1, 2**40 + 3, int(rng.integers(0, 2**62))]))
        epoch, window = int(rng.integers(0, 50)), int(rng.integers(1, 9))
        want = reference_shardwise_order(sizes, seed, epoch, window)
        got = shardwise_order(sizes, seed, epoch, window)
        assert got.dtype == want.dtype and np.array_equal(got, want)
        if sum(sizes) >= 4:
            batch_size = int(rng.integers(1, min(sum(sizes), 64) + 1))
            plan = GroupPlan(sum(sizes), batch_size, sum(sizes) // batch_size, seed, False, "shardwise", sizes, window)
            assert plan.shard_partitions == 1
            assert np.array_equal(item_order(plan, epoch), want)
            cases += 1
    assert cases > 300


# -- the partitions ---------------------------------------------------------------------------------


def greedy(sizes, seed, epoch, partitions):
    """The assignment rule, spelled out slowly."""
    loads, owner = [0] * partitions, [None] * len(sizes)
    for s in np.random.Generator(np.random.PCG64(seed + epoch)).permutation(len(sizes)).tolist():
        p = min(range(partitions), key=lambda q: (loads[q], q))
        owner[s] = p
        loads[p] += sizes[s]
    return owner


@pytest.mark.parametrize("partitions", [1, 2, 3, 4, 8])
def test_shards_go_to_the_lightest_partition_in_the_epochs_order(partitions):
    for epoch in range(6):
        owner = partition_shards(SIZES, 5, epoch, partitions)
        assert owner.tolist() == greedy(SIZES, 5, epoch, partitions)
        assert not owner.flags.writeable
        loads = np.bincount(owner, weights=SIZES, minlength=partitions)
        assert loads.max() - loads.min() <= max(SIZES)  # balanced to within one shard
    assert partition_shards(SIZES, 5, 0, 4).tolist() != partition_shards(SIZES, 5, 1, 4).tolist()  # new every epoch
    with pytest.raises(ValueError, match="partitions must be at least 1"):
        partition_shards(SIZES, 5, 0, 0)


@pytest.mark.parametrize("partitions, batch_size, window", [(2, 8, 1), (4, 16, 3), (4, 4, 2), (3, 12, 4), (8, 24, 2), (24, 24, 1)])
def test_each_epoch_is_a_permutation_fed_partition_by_partition(partitions, batch_size, window):
    plan = make_plan(batch_size=batch_size, window=window, partitions=partitions)
    size, k = sum(SIZES), batch_size // partitions
    quota = plan.batch_count * k
    for epoch in range(4):
        order = item_order(plan, epoch)
        assert sorted(order.tolist()) == list(range(size)) and not order.flags.writeable
        owner = partition_shards(SIZES, plan.seed, epoch, partitions)
        lengths = np.bincount(owner, weights=SIZES, minlength=partitions).astype(int)
        streams = partition_streams(plan, epoch)
        spilled = set()  # items a partition passes on: the tails of its stream beyond the quota
        for p, stream in enumerate(streams):
            own = owner[shard_of(SIZES, stream)] == p
            n = min(lengths[p], quota)
            # a partition is fed its own items first, then (when short) the spill of others
            assert own[:n].all() and not own[n:].any()
            assert len(stream) - n == max(0, quota - lengths[p])
            # its own items come in runs of `window` of its shards, in the epoch's shard order
            shards = [s for s in np.random.Generator(np.random.PCG64(plan.seed + epoch)).permutation(len(SIZES)).tolist() if owner[s] == p]
            position = 0
            for first in range(0, len(shards), window):
                run = shards[first : first + window]
                length = min(sum(SIZES[s] for s in run), n - position)
                if length <= 0:
                    break
                assert set(shard_of(SIZES, stream[position : position + length]).tolist()) <= set(run)
                position += length
            mine = np.flatnonzero(owner == p)
            spilled |= set(np.flatnonzero(np.isin(shard_of(SIZES, np.arange(size)), mine)).tolist()) - set(stream[:n].tolist())
        # top-ups and dropped items are exactly the spill; the drop is the remainder, at the end
        topped_up = [item for p, stream in enumerate(streams) for item in stream[min(lengths[p], quota):].tolist()]
        dropped = order[plan.batch_count * batch_size :].tolist()
        assert len(dropped) == size - plan.batch_count * batch_size
        assert sorted(topped_up + dropped) == sorted(spilled)
        assert len(topped_up) <= partitions * max(SIZES)


def slow_order(sizes, seed, epoch, window, partitions, batch_size):
    """The partitioned order, spelled out with lists from its documented rules."""
    owner = greedy(sizes, seed, epoch, partitions)
    perm = np.random.Generator(np.random.PCG64(seed + epoch)).permutation(len(sizes)).tolist()
    starts = [sum(sizes[:s]) for s in range(len(sizes))]
    k, batch_count = batch_size // partitions, sum(sizes) // batch_size
    quota = batch_count * k
    streams = []
    for p in range(partitions):
        shards = [s for s in perm if owner[s] == p]
        stream = []
        for run, first in enumerate(range(0, len(shards), window)):
            items = [i for s in shards[first : first + window] for i in range(starts[s], starts[s] + sizes[s])]
            stream += [items[j] for j in np.random.Generator(np.random.PCG64([seed, epoch, p, run])).permutation(len(items))]
        streams.append(stream)
    pool = [i for stream in streams for i in stream[quota:]]  # spills of partitions 0, 1, ... in order
    fed = []
    for stream in streams:  # short partitions take from the front of the pool, 0, 1, ... in turn
        need = max(0, quota - len(stream))
        fed.append(stream[:quota] + pool[:need])
        pool = pool[need:]
    return [i for b in range(batch_count) for p in range(partitions) for i in fed[p][b * k : (b + 1) * k]] + pool


def test_the_order_follows_its_rules_exactly():
    rng = np.random.default_rng(7)
    cases = 0
    while cases < 200:
        sizes = tuple(int(n) for n in rng.integers(0, 30, int(rng.integers(1, 20))))
        partitions = int(rng.integers(2, 7))
        batch_size = partitions * int(rng.integers(1, 5))
        if sum(sizes) < batch_size:
            continue
        seed, epoch, window = int(rng.integers(0, 2**40)), int(rng.integers(0, 9)), int(rng.integers(1, 5))
        got = shardwise_order(sizes, seed, epoch, window, partitions, batch_size).tolist()
        assert got == slow_order(sizes, seed, epoch, window, partitions, batch_size)
        cases += 1


def test_a_small_example_by_hand():
    # shards of 10, 6 and 2 samples, two partitions, batch 4 (k = 2): 4 batches, a quota of 8 items
    sizes = (10, 6, 2)
    order = shardwise_order(sizes, 1, 0, 2, 2, 4)
    owner = partition_shards(sizes, 1, 0, 2).tolist()
    big = owner[0]
    assert owner.count(big) == 1  # the 10-sample shard alone; 6 + 2 = 8 samples in the other
    streams = partition_streams(make_plan(sizes=sizes, batch_size=4, seed=1, window=2, partitions=2), 0)
    assert set(streams[1 - big].tolist()) == set(range(10, 18))  # exactly its quota: nothing spilled in
    assert set(streams[big].tolist()) < set(range(10)) and len(streams[big]) == 8
    # the big partition's last 2 items spill; nobody needs them, so they are dropped (the remainder)
    assert len(order) == 18 and set(order[16:].tolist()) == set(range(10)) - set(streams[big].tolist())


def test_partitions_need_a_batch_size_they_divide():
    with pytest.raises(ValueError, match=r"batch_size \(6\) must be a positive multiple of the partitions \(4\)"):
        shardwise_order(SIZES, 1, 0, 2, 4, 6)
    with pytest.raises(ValueError, match=r"batch_size \(0\)"):
        shardwise_order(SIZES, 1, 0, 2, 2)


def test_the_order_is_pure():
    plan = make_plan()
    first = item_order(plan, 3)
    assert item_order(plan, 3).tolist() == first.tolist()  # not cached here: each process keeps its own (hydrax.order.orders.EpochOrders)
    assert first.tolist() == shardwise_order(SIZES, 5, 3, 3, 4, 16).tolist()
    assert first.tolist() != item_order(plan, 2).tolist()
    assert first.tolist() != item_order(make_plan(partitions=2), 3).tolist()
    assert item_order(make_plan(partitions=1), 3).tolist() == reference_shardwise_order(SIZES, 5, 3, 3).tolist()


# -- hosts ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("epoch", [0, 1, 5])
def test_hosts_read_their_own_partitions(epoch):
    plan = make_plan(partitions=4)
    used = plan.batch_count * plan.batch_size
    owner = partition_shards(SIZES, plan.seed, epoch, 4)
    order = item_order(plan, epoch)
    global_batches = [list(batch_items(order, plan.batch_size, b)) for b in range(plan.batch_count)]
    spill = set()
    for p, stream in enumerate(partition_streams(plan, epoch)):
        spill |= {i for i in stream.tolist() if owner[shard_of(SIZES, i)] != p}
    for processes in (1, 2, 4):
        reads = [host_shards(plan, epoch, h, processes) for h in range(processes)]
        # every host loads its equal share; together they load the epoch's items
        assert [sum(r.values()) for r in reads] == [used // processes] * processes
        total = Counter()
        for r in reads:
            total.update(r)
        assert total == Counter(shard_of(SIZES, order[:used]).tolist())
        # the global batches are the same for every host count: the shares put together are them
        shares = [host_share(plan, h, processes) for h in range(processes)]
        for b, batch in enumerate(global_batches):
            assert [i for share in shares for i in local_items(share, item_order(share, epoch), b)] == batch
        for h, r in enumerate(reads):
            mine = set(range(h * 4 // processes, (h + 1) * 4 // processes))
            positions = host_positions(plan.batch_size, h, processes)
            items = [i for batch in global_batches for i in batch[positions.start : positions.stop]]
            foreign = [i for i in items if owner[shard_of(SIZES, i)] not in mine]
            assert set(foreign) <= spill  # the only reads of other hosts' shards: spilled items
            for other in range(processes):
                if other != h:
                    # a shard two hosts both read is this host's, or one it only takes spilled items from
                    shared = set(r) & set(reads[other])
                    assert all(owner[s] in mine or s in set(shard_of(SIZES, foreign).tolist()) for s in shared)
            # it reads its own partitions' shards, and from the others only the items spilled to it
            assert sum(n for s, n in r.items() if owner[s] not in mine) == len(foreign)


def test_each_host_reads_about_its_share_of_the_data():
    """Streaming every shard it touches whole, each of P hosts reads about 1/P of the data per
    epoch with partitions (its own partitions, plus the few shards spilled items come from), and
    nearly all of it without (the problem partitions solve)."""
    sizes = tuple(int(n) for n in np.random.default_rng(3).integers(50, 151, 200))
    total = sum(sizes)

    def read(plan, epoch, h, processes):
        return sum(sizes[s] for s in host_shards(plan, epoch, h, processes)) / total

    for processes in (2, 4):
        partitioned = make_plan(sizes=sizes, batch_size=64, window=4, partitions=4)
        unpartitioned = make_plan(sizes=sizes, batch_size=64, window=4, partitions=1)
        for epoch in range(4):
            for h in range(processes):
                assert read(partitioned, epoch, h, processes) < 1.2 / processes
                assert read(unpartitioned, epoch, h, processes) > 0.95


def test_a_run_resumes_with_any_host_count_dividing_the_partitions():
    plan = make_plan(partitions=4)
    steps = list(iter_steps(Plan(training=(plan,), end=("epoch", 3))))
    reference = [list(batch_items(item_order(plan, s.epoch), plan.batch_size, s.group_index)) for s in steps]
    for processes, start in ((1, (0, 0)), (2, (1, 3)), (4, (2, 1))):
        shares = [host_share(plan, h, processes) for h in range(processes)]
        resumed = list(iter_steps(Plan(training=(shares[0],), start=start, end=("epoch", 3))))
        first = start[0] * plan.batch_count + start[1]
        got = [[i for share in shares for i in local_items(share, item_order(share, s.epoch), s.group_index)] for s in resumed]
        assert got == reference[first:]


def test_host_shards_needs_a_shardwise_group():
    plan = GroupPlan(16, 4, 4, 0, False, "itemwise")
    with pytest.raises(ValueError, match="host_shards needs a shardwise group, this one is 'itemwise'"):
        host_shards(plan, 0, 0, 1)
    with pytest.raises(ValueError, match="multiple of the process count 3"):
        host_shards(make_plan(), 0, 0, 3)
