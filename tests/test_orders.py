"""Lazy item orders (hydrax.order.orders): exact permutations, the shardwise structure, shares and resume."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from hydrax.order.orders import (ArrayOrder, EpochOrders, IdentityOrder, LazyItems, ShareOrder, epoch_order,
                           local_positions, order_array)
from hydrax.order.permute import LazyPermutation
from hydrax.order.schedule import (LAZY_ITEMS, LAZY_SHARDS, LAZY_WINDOW, GroupPlan, batch_order, host_share,
                                   local_items, read_order, share_positions, share_ranges)
from hydrax.order.shardwise import balance_shards, shardwise_order
from hydrax.order.orders import item_order


def plan_of(size=1000, batch_size=16, shuffle_later="itemwise", shuffle_first=True, seed=3, **kw) -> GroupPlan:
    return GroupPlan(size=size, batch_size=batch_size, batch_count=size // batch_size, seed=seed, shuffle_first=shuffle_first,
                     shuffle_later=shuffle_later, permutation="lazy", **kw)


def shardwise_plan(sizes, batch_size=16, window=3, partitions=1, seed=5) -> GroupPlan:
    total = int(sum(sizes))
    return GroupPlan(size=total, batch_size=batch_size, batch_count=total // batch_size, seed=seed, shuffle_first=False,
                     shuffle_later="shardwise", shard_sizes=tuple(sizes), shard_window=window, shard_partitions=partitions,
                     permutation="lazy")


def reference_lazy_shardwise(sizes, seed, epoch, window, partitions=1, batch_size=0) -> np.ndarray:
    """The lazy shardwise order built whole, the plain way: the structure of shardwise_order with
    every permutation a LazyPermutation materialised."""
    sizes = np.asarray(sizes, np.int64)
    starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    shards = np.asarray(LazyPermutation(len(sizes), seed + epoch, len(sizes), LAZY_SHARDS)[:], np.int64)

    def stream(chosen, words):
        pieces = []
        for run, first in enumerate(range(0, len(chosen), window)):
            items = np.concatenate([np.arange(starts[s], starts[s] + sizes[s]) for s in chosen[first:first + window]])
            pieces.append(items[LazyPermutation(len(items), *words, run, LAZY_WINDOW)[:]])
        return np.concatenate(pieces) if pieces else np.empty(0, np.int64)

    if partitions == 1:
        return stream(shards, (seed, epoch))
    k = batch_size // partitions
    batch_count = int(sizes.sum()) // batch_size
    quota = batch_count * k
    owner = balance_shards(shards, sizes, partitions)[shards]
    streams = [stream(shards[owner == p], (seed, epoch, p)) for p in range(partitions)]
    pool = np.concatenate([s[quota:] for s in streams])
    filled, taken = [], 0
    for s in streams:
        if len(s) >= quota:
            filled.append(s[:quota])
        else:
            filled.append(np.concatenate((s, pool[taken:taken + quota - len(s)])))
            taken += quota - len(s)
    batches = np.stack(filled).reshape(partitions, batch_count, k).transpose(1, 0, 2).reshape(-1)
    return np.concatenate((batches, pool[taken:]))


SIZES = [31, 7, 0, 64, 12, 3, 50, 50, 1, 29, 18, 40, 9, 22, 5]


@pytest.mark.parametrize("n", [1, 2, 3, 5, 7, 8, 16, 17, 97, 128, 1000, 65537])
@pytest.mark.parametrize("mode", ["itemwise", "repeat", "batchwise", "reseed"])
def test_lazy_orders_are_permutations(n, mode):
    plan = plan_of(size=n, batch_size=1, shuffle_later=mode)
    for epoch in (0, 1, 4):
        order = item_order(plan, epoch)
        assert sorted(order.tolist()) == list(range(n))


def test_lazy_orders_follow_the_shuffle_modes():
    itemwise = plan_of()
    orders = [item_order(itemwise, e).tolist() for e in range(3)]
    assert orders[0] != orders[1] != orders[2]
    assert item_order(replace(itemwise, shuffle_first=False), 0) is None  # epoch 0 in file order, as with numpy
    repeat = plan_of(shuffle_later="repeat")
    assert item_order(repeat, 0).tolist() == item_order(repeat, 5).tolist()
    batchwise = plan_of(shuffle_later="batchwise")
    assert batch_order(batchwise, 0) is None
    moved = [int(batch_order(batchwise, 2)[c]) for c in range(batchwise.batch_count)]
    assert sorted(moved) == list(range(batchwise.batch_count)) and moved != list(range(batchwise.batch_count))
    # lazy and numpy are different orders of the same items
    assert item_order(itemwise, 1).tolist() != item_order(replace(itemwise, permutation="numpy"), 1).tolist()


@pytest.mark.parametrize("partitions,batch_size", [(1, 16), (2, 16), (4, 16), (4, 32)])
@pytest.mark.parametrize("epoch", [0, 1, 7])
def test_lazy_shardwise_matches_its_reference(partitions, batch_size, epoch):
    plan = shardwise_plan(SIZES, batch_size=batch_size, partitions=partitions)
    got = item_order(plan, epoch)
    want = reference_lazy_shardwise(SIZES, 5, epoch, 3, partitions, batch_size)
    assert got.tolist() == want.tolist()
    assert sorted(got.tolist()) == list(range(sum(SIZES)))


@pytest.mark.parametrize("partitions", [1, 4])
def test_lazy_shardwise_batches_across_many_runs_match_the_reference(partitions):
    """Shards of 0-3 items: a batch of 64 crosses many runs in one kernel call, read in batches,
    in tasks and one position at a time."""
    sizes = np.random.default_rng(9).integers(0, 4, 700).tolist()
    plan = shardwise_plan(sizes, batch_size=64, window=2, partitions=partitions)
    want = reference_lazy_shardwise(sizes, 5, 3, 2, partitions, 64)
    order = epoch_order(plan, 3)
    got = np.concatenate([order.at(np.arange(a, min(a + 64, plan.size))) for a in range(0, plan.size, 64)])
    assert got.tolist() == want.tolist()
    assert order.local(plan, 5, 10, 50) == want[5 * 64 + 10:5 * 64 + 50].tolist()
    single = np.random.default_rng(1).permutation(plan.size)[:300]
    assert order.at(single).tolist() == want[single].tolist()


def test_lazy_shardwise_reads_few_shards_at_a_time():
    sizes = [20] * 30
    plan = shardwise_plan(sizes, batch_size=10, window=2)
    order = item_order(plan, 2)
    shard = order // 20
    # every run of 40 positions holds the items of exactly two shards
    for start in range(0, 600, 40):
        assert len(set(shard[start:start + 40].tolist())) == 2


@pytest.mark.parametrize("hosts", [1, 2, 4])
def test_lazy_shares_put_the_global_batch_together(hosts):
    for plan in (plan_of(size=960, batch_size=32), shardwise_plan(SIZES, batch_size=16, partitions=4)):
        for epoch in (0, 3):
            whole = epoch_order(plan, epoch)
            for b in range(plan.batch_count):
                parts = []
                for h in range(hosts):
                    share = host_share(plan, h, hosts)
                    parts += list(epoch_order(share, epoch).local(share, b))
                assert parts == list(whole.local(plan, b))


@pytest.mark.parametrize("share", [None, (1, 4), ((3, 9), (20, 30))])
def test_lazy_shardwise_local_items_are_the_reference_order(share):
    """local() takes a short cut for the batches that hold only their partitions' own items; every
    batch, share and task slice must still read the reference order."""
    plan = shardwise_plan(SIZES, batch_size=32, partitions=4)
    if isinstance(share, tuple) and isinstance(share[0], int):
        plan = host_share(plan, *share)
    elif share is not None:
        plan = share_ranges(plan, share)
    want = reference_lazy_shardwise(SIZES, 5, 2, 3, 4, 32)
    order = epoch_order(plan, 2)
    assert 0 < order.own_batches < plan.batch_count  # both paths are taken
    columns = list(share_positions(plan))
    for b in range(plan.batch_count):
        assert order.local(plan, b) == [int(want[b * 32 + c]) for c in columns], b
        assert order.local(plan, b, 2, 5) == [int(want[b * 32 + c]) for c in columns[2:5]], b


def test_local_items_agree_for_every_kind_of_order():
    plan = host_share(plan_of(size=400, batch_size=20), 1, 4)
    array = item_order(plan, 2)
    lazy = epoch_order(plan, 2)
    stored = ShareOrder(array[:400].reshape(20, 20)[:, 5:10])
    for b in (0, 7, 19):
        want = local_items(plan, array, b)
        assert list(lazy.local(plan, b)) == want == list(ArrayOrder(array).local(plan, b)) == stored.local(plan, b)
        assert list(IdentityOrder().local(plan, b)) == list(range(b * 20 + 5, b * 20 + 10))
        assert local_positions(plan, b).tolist() == list(range(b * 20 + 5, b * 20 + 10))


def test_lazy_orders_cost_nothing_of_size_n():
    import tracemalloc

    n = 10**12
    plan = plan_of(size=n, batch_size=4096)
    tracemalloc.start()
    order = epoch_order(plan, 123)
    items = order.local(plan, plan.batch_count - 1)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert len(set(items)) == 4096 and all(0 <= i < n for i in items)
    assert peak < 2_000_000


def test_read_order_needs_no_order():
    assert read_order(plan_of(size=10**15, batch_size=1), 3) == "random"
    assert read_order(plan_of(size=10**15, batch_size=1, shuffle_first=False, shuffle_later="repeat"), 3) == "sequential"
    assert read_order(plan_of(size=10**15, batch_size=1, shuffle_first=False, shuffle_later="batchwise"), 0) == "sequential"
    assert read_order(plan_of(size=10**15, batch_size=1, shuffle_first=False, shuffle_later="batchwise"), 1) == "random"


def test_epoch_orders_keep_two_epochs_per_group():
    made = []

    def make(group, epoch):
        made.append((group, epoch))
        return LazyItems(10, group, epoch)

    orders = EpochOrders(make)
    for epoch in range(5):
        for group in (0, 1):
            orders.get(group, epoch)
            orders.get(group, epoch)
    assert made == [(g, e) for e in range(5) for g in (0, 1)]
    assert sorted(orders._orders) == [(0, 3), (0, 4), (1, 3), (1, 4)]


def test_the_same_shard_order_is_the_one_numpy_balances():
    # balance_shards is what both kinds of shardwise order use to fill the partitions
    shards = np.random.default_rng(1).permutation(len(SIZES))
    owner = balance_shards(shards, SIZES, 3)
    loads = np.bincount(owner, weights=SIZES, minlength=3)
    assert loads.max() - loads.min() <= max(SIZES)
    numpy_plan = replace(shardwise_plan(SIZES), permutation="numpy")
    assert item_order(numpy_plan, 2).tolist() == shardwise_order(tuple(SIZES), 5, 2, 3).tolist()
    assert order_array(IdentityOrder(), 5) is None
    assert order_array(LazyItems(5, 1, 5, LAZY_ITEMS), 5).tolist() == LazyPermutation(5, 1, 5, LAZY_ITEMS)[:].tolist()


def test_an_items_positions_in_consecutive_epochs_are_uncorrelated():
    plan = plan_of(size=100_000, batch_size=100)
    orders = [item_order(plan, e) for e in (3, 4)]
    positions = [np.argsort(order) for order in orders]  # where each item lands
    r = np.corrcoef(positions[0], positions[1])[0, 1]
    assert abs(r) < 0.02
    # and items land uniformly: deciles of the positions of the first 10,000 items
    counts = np.bincount(positions[1][:10_000] * 10 // 100_000, minlength=10)
    chi2 = (((counts - 1000) ** 2) / 1000).sum()
    assert chi2 < 35  # 9 degrees of freedom: p < 1e-4 above 33.7
