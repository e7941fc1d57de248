"""Mixture schedules (hydrax.order.mixing, hydrax.order.orders.MixtureOrder): exact shares, passes, purity, O(1) cost."""

from __future__ import annotations

import itertools
import tracemalloc
from dataclasses import replace

import numpy as np
import pytest

from hydrax import _core, _fallback
from hydrax.order.mixing import RANDOM_RUN, Layout, MixturePlan, check_weights, epoch_totals
from hydrax.order.orders import LazyItems, MixtureOrder, epoch_order, local_positions, source_pass
from hydrax.order.permute import round_keys_table
from hydrax.order.schedule import LAZY_SOURCE, GroupPlan, host_share, read_order, share_ranges

WEIGHTS = (0.7, 0.2, 0.1)


def mixture_plan(sizes=(700, 200, 100), weights=WEIGHTS, epoch_size=None, batch_size=20, batching="random", seed=4,
                 shuffle_later="itemwise", shards=(), window=2) -> GroupPlan:
    size = sum(sizes) if epoch_size is None else epoch_size
    return GroupPlan(size=size, batch_size=batch_size, batch_count=size // batch_size, seed=seed, shuffle_first=False,
                     shuffle_later=shuffle_later, shard_window=window, permutation="lazy",
                     mixture=MixturePlan(tuple(sizes), tuple(weights), batching, shards))


def epoch_items(plan: GroupPlan, epoch: int) -> np.ndarray:
    """Every used position's item, batch by batch: shape (batch_count, batch_size)."""
    order = epoch_order(plan, epoch)
    return order.at(np.arange(plan.batch_count * plan.batch_size)).reshape(plan.batch_count, plan.batch_size)


def sources_of(plan: GroupPlan, items: np.ndarray) -> np.ndarray:
    return np.searchsorted(plan.mixture.offsets, items, side="right") - 1


def test_epoch_totals_are_exact_apportionments():
    assert epoch_totals(WEIGHTS, 1000).tolist() == [700, 200, 100]
    assert epoch_totals((1, 1, 1), 100).tolist() == [34, 33, 33]  # ties go to the lower index
    assert epoch_totals((2.0, 1.0), 10).tolist() == [7, 3]  # 6.67, 3.33
    rng = np.random.default_rng(0)
    for _ in range(200):
        weights = rng.random(int(rng.integers(1, 8))) + 1e-3
        used = int(rng.integers(1, 10**12))
        totals = epoch_totals(weights, used)
        assert totals.sum() == used
        assert np.all(np.abs(totals - used * weights / weights.sum()) < 1 + 1e-6 * used)


@pytest.mark.parametrize("trial", range(40))
def test_the_stratified_layout_fills_every_batch_and_counts_in_closed_form(trial):
    rng = np.random.default_rng(trial)
    weights = rng.random(int(rng.integers(1, 6))) * 10 + 0.01
    batch_size, batch_count = int(rng.integers(1, 50)), int(rng.integers(1, 40))
    layout = Layout.of(weights, batch_size, batch_count)
    counts = layout.counts(np.arange(batch_count))
    assert (counts.sum(axis=0) == batch_size).all()  # every batch is full
    assert (counts.sum(axis=1) == layout.totals).all()  # the epoch holds the exact totals
    share = batch_size * weights / weights.sum()
    assert ((counts == np.floor(share)[:, None]) | (counts == np.floor(share)[:, None] + 1)).all()
    running = np.concatenate((np.zeros((len(weights), 1), np.int64), np.cumsum(counts, axis=1)), axis=1)
    assert (layout.before(np.arange(batch_count + 1)) == running).all()  # the closed form is the running sum
    # every slot of the epoch names each source's stream positions of the epoch exactly once
    batches, slots = np.divmod(np.arange(batch_size * batch_count), batch_size)
    source, stream = layout.place(batches, slots, epoch=5)
    for s, total in enumerate(layout.totals):
        assert sorted(stream[source == s].tolist()) == list(range(5 * total, 6 * total))


def test_weights_are_checked_with_the_culprit_named():
    assert check_weights([1, 2.5], 2) == (1.0, 2.5)
    with pytest.raises(ValueError, match="3 sources, 2 weights"):
        check_weights([1, 2], 3)
    with pytest.raises(ValueError, match=r"weights\[1\] must be positive and finite, got -1"):
        check_weights([1, -1], 2)
    with pytest.raises(ValueError, match=r"weights\[0\] must be positive and finite, got nan"):
        check_weights([float("nan"), 1], 2)
    with pytest.raises(TypeError, match=r"weights\[0\] must be a number, got bool"):
        check_weights([True, 1], 2)


def test_weights_whose_sum_or_size_passes_a_float_are_kept_exact():
    """Issue 38 row 8: only the weights' ratios count, so no float sum of them is ever taken."""
    from hydrax.order import mixing
    from hydrax.errors import MixtureRangeError

    assert check_weights([1e308, 1e308], 2) == (1e308, 1e308)  # floats are kept as given
    assert check_weights([10**400, 3 * 10**399, 10**100], 3) == (1.0, 0.3, 1e-300)  # ints beyond a float: by the largest
    assert mixing.proportions((1e308, 1e308)) == (0.5, 0.5) and mixing.proportions(WEIGHTS) == pytest.approx(WEIGHTS)
    assert epoch_totals((1e308, 1e308, 5e307), 100).tolist() == [40, 40, 20]
    layout = Layout.of((1e308, 1e308), 10, 3)
    assert layout.base.tolist() == [5, 5] and layout.totals.tolist() == [15, 15]
    with pytest.raises(MixtureRangeError, match=r"weights\[2\] \((np.int64\()?7\)?\) is too small next to weights\[0\]"):
        check_weights([10**400, 1e300, np.int64(7)], 3)


def test_the_schedule_of_a_mixture_ends_after_the_last_epoch_its_positions_count():
    """Issue 38 row 8: epoch_size 2**61 at epoch 8 overflowed silently; the schedule, a pure
    function, stops after epoch 2 ((2 + 1) * 2**61 <= 2**63 - 1), where the Dataloader raises."""
    from hydrax.order.schedule import Plan, iter_steps

    plan = mixture_plan(epoch_size=2**61)
    run = Plan(training=(plan,), start=(2, plan.batch_count - 2))
    steps = [(s.epoch, s.epoch_batch) for s in itertools.islice(iter_steps(run), 3)]
    assert steps == [(2, plan.batch_count - 2), (2, plan.batch_count - 1)]

    from hydrax.errors import MixtureRangeError
    from hydrax.order.mixing import check_epoch, last_epoch
    from hydrax.order.schedule import check_epochs, epoch_limit

    assert last_epoch(2**61) == 2 and last_epoch(2**63 - 1) == 0 and last_epoch(2**63) == -1
    assert epoch_limit(run) == (2**61, 2)
    order = epoch_order(plan, 2)
    source, stream = order.place(np.arange(plan.batch_count * 20 - 20, plan.batch_count * 20))
    assert (stream >= 0).all() and (stream < 3 * order.layout.totals[source]).all()  # no position wrapped
    for start, end, argument, epoch in [((8, 0), None, "start_at", 8), ((2, 0), ("epoch", 4), "end_at", 3)]:
        with pytest.raises(MixtureRangeError, match=f"{argument}: epoch {epoch} of a Mixture with epoch_size {2**61}") as caught:
            check_epochs(Plan(training=(plan,), start=start, end=end))
        assert (caught.value.epoch_size, caught.value.epoch, caught.value.last_epoch) == (2**61, epoch, 2)
    check_epochs(Plan(training=(plan,), start=(2, 0), end=("epoch", 3)))
    check_epochs(Plan(training=(mixture_plan(),), start=(10**15, 0)))  # a small epoch counts far
    check_epoch(2**61, 2, "start_at")
    assert epoch_limit(Plan(training=(replace(plan, mixture=None),))) is None


@pytest.mark.parametrize("batching", ["random", "stratified"])
def test_proportions_are_exact_over_an_epoch_of_a_hundred_thousand_items(batching):
    plan = mixture_plan(sizes=(50_000, 30_000, 20_000), epoch_size=100_000, batch_size=100, batching=batching)
    sources = sources_of(plan, epoch_items(plan, 1))
    share = np.bincount(sources.ravel(), minlength=3) / sources.size
    assert np.abs(share - WEIGHTS).max() < 0.01  # the bar; in fact exact:
    assert np.bincount(sources.ravel(), minlength=3).tolist() == [70_000, 20_000, 10_000]
    per_batch = np.stack([np.bincount(row, minlength=3) for row in sources])
    if batching == "stratified":
        assert (per_batch == [70, 20, 10]).all()  # exact in every batch
    else:
        # random draws: batches differ, about as independent draws by weight would (binomial sd of
        # the 70% source in a batch of 100: 4.6); every run of RANDOM_RUN batches is exact
        assert len({tuple(row) for row in per_batch.tolist()}) > 50
        assert 3 < per_batch[:, 0].std() < 6.5
        runs = per_batch[: len(per_batch) // RANDOM_RUN * RANDOM_RUN].reshape(-1, RANDOM_RUN, 3).sum(axis=1)
        assert (runs == np.array([70, 20, 10]) * RANDOM_RUN).all()


def test_stratified_remainders_rotate_over_the_batches():
    plan = mixture_plan(sizes=(10, 10, 10), weights=(1, 1, 1), epoch_size=300, batch_size=10, batching="stratified")
    per_batch = np.stack([np.bincount(row, minlength=3) for row in sources_of(plan, epoch_items(plan, 0))])
    assert set(map(tuple, per_batch.tolist())) == {(4, 3, 3), (3, 4, 3), (3, 3, 4)}  # round(10 / 3) = 3, the 10th slot rotates
    assert per_batch.sum(axis=0).tolist() == [100, 100, 100]


@pytest.mark.parametrize("batching", ["random", "stratified"])
def test_each_source_is_read_in_passes_each_in_a_fresh_order(batching):
    # a small source (30 items at 10%: 10 per epoch of 100) makes a third of a pass per epoch; a
    # tiny one (3 items at 30%) makes 10 passes per epoch
    plan = mixture_plan(sizes=(300, 30, 3), weights=(0.6, 0.1, 0.3), epoch_size=100, batch_size=10, batching=batching)
    streams = {s: [] for s in range(3)}
    for epoch in range(9):
        order = MixtureOrder(plan, epoch)
        positions = np.arange(100)
        source, stream = order.place(positions)
        items = order.at(positions)
        for s in range(3):
            mine = np.argsort(stream[source == s])
            streams[s].extend((items[source == s][mine] - plan.mixture.offsets[s]).tolist())
    for s, size in enumerate(plan.mixture.source_sizes):
        passes = [streams[s][i:i + size] for i in range(0, len(streams[s]) - size + 1, size)]
        assert passes and all(sorted(p) == list(range(size)) for p in passes)  # every pass: each item once
        if size > 3:
            assert len({tuple(p) for p in passes}) == len(passes)  # reshuffled at every wrap


def test_the_order_is_a_pure_function_of_seed_and_epoch():
    plan = mixture_plan()
    assert (epoch_items(plan, 2) == epoch_items(plan, 2)).all()
    assert (epoch_items(plan, 2) != epoch_items(plan, 3)).any()
    assert (epoch_items(plan, 2) != epoch_items(replace(plan, seed=5), 2)).any()
    # a validation group's order is epoch 0's, always
    assert (epoch_order(plan, 7, training=False).at(np.arange(40)) == epoch_order(plan, 0).at(np.arange(40))).all()
    assert read_order(plan, 3) == "random" and read_order(replace(plan, shuffle_later="shardwise"), 3) == "shardwise"
    with pytest.raises(ValueError, match="full batches"):
        epoch_order(plan, 0).at(np.array([plan.batch_count * plan.batch_size]))


@pytest.mark.parametrize("batching", ["random", "stratified"])
def test_any_split_of_the_batches_gives_the_same_items(batching):
    plan = mixture_plan(batch_size=24, batching=batching)
    whole = epoch_items(plan, 3)
    for processes in (2, 3, 4, 6):
        for p in range(processes):
            share = host_share(plan, p, processes)
            order = epoch_order(share, 3)
            for b in (0, 7, plan.batch_count - 1):
                positions = local_positions(share, b) - b * 24
                assert order.local(share, b) == whole[b, positions].tolist()
    odd = share_ranges(plan, [(0, 5), (11, 17)])
    assert epoch_order(odd, 3).local(odd, 4) == whole[4, [0, 1, 2, 3, 4, 11, 12, 13, 14, 15, 16]].tolist()


@pytest.mark.parametrize("batching", ["random", "stratified"])
def test_sources_with_shards_are_read_a_few_shards_at_a_time(batching):
    shard_sizes = (40,) * 100  # 4000 items in 100 shards, mixed 4:1 with a plain source
    plan = mixture_plan(sizes=(4000, 50), weights=(0.8, 0.2), epoch_size=3200, batch_size=10, shuffle_later="shardwise",
                        shards=(shard_sizes, ()), window=2, batching=batching)
    run = RANDOM_RUN if batching == "random" else 1
    for epoch in range(3):
        items = epoch_items(plan, epoch)
        sources = sources_of(plan, items)
        for first in range(0, plan.batch_count, run):
            rows, which = items[first:first + run], sources[first:first + run]
            shards = set((rows[which == 0] // 40).tolist())
            # a stretch of the shardwise stream: its shards, plus the window it starts or ends in
            assert len(shards) <= -(-(rows[which == 0].size) // 40) + 3
    # every pass of the sharded source is a shardwise order: each item once
    first = source_pass(plan, 0, 0).at(np.arange(4000))
    assert sorted(first.tolist()) == list(range(4000))
    assert (first != source_pass(plan, 0, 1).at(np.arange(4000))).any()


def test_a_billion_items_cost_no_memory_of_their_size():
    plan = mixture_plan(sizes=(10**9, 3 * 10**8, 7), weights=(5, 3, 1), epoch_size=10**9, batch_size=4096)
    tracemalloc.start()
    try:
        order = epoch_order(plan, 12_345)
        items = order.local(plan, plan.batch_count - 1)
        order.local(plan, 123_456)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20
    assert len(items) == 4096 and all(0 <= i < sum(plan.mixture.source_sizes) for i in items)
    large = [i for i in items if i < 13 * 10**8]
    assert len(set(large)) == len(large)  # the large sources' passes repeat nothing within a batch
    assert len(set(items) - set(large)) == 7  # the 7-item source makes about 65 passes in every batch


# --- the kernels (hydrax._core.mixture_slots, mixture_locate, mixture_items) against their twins


def block_tables(trial: int):
    rng = np.random.default_rng(trial)
    weights = rng.random(int(rng.integers(1, 6))) + 0.05
    batch_size, batch_count = int(rng.integers(1, 40)), int(rng.integers(1, 20))
    layout = Layout.of(weights, batch_size, batch_count)
    batches = np.arange(batch_count)
    ends = np.ascontiguousarray(np.cumsum(layout.counts(batches), axis=0), np.int64)
    return rng, layout, ends, np.ascontiguousarray(layout.before(batches), np.int64)


@pytest.mark.parametrize("trial", range(30))
def test_the_slot_kernel_agrees_with_its_twin_and_the_layout(trial):
    rng, layout, ends, before = block_tables(trial)
    slots = rng.permutation(layout.batch_size * layout.batch_count).astype(np.int64)
    start = rng.integers(0, 10**12, len(layout.totals)).astype(np.int64)
    source, stream = np.empty_like(slots), np.empty_like(slots)
    _core.mixture_slots(slots, layout.batch_size, ends, before, start, source, stream)
    twin = _fallback.mixture_slots(slots, layout.batch_size, ends, before, start)
    assert source.tolist() == twin[0].tolist() and stream.tolist() == twin[1].tolist()
    expected = layout.place(*np.divmod(slots, layout.batch_size), epoch=0)
    assert source.tolist() == expected[0].tolist() and (stream - start[source]).tolist() == expected[1].tolist()


@pytest.mark.parametrize("trial", range(20))
def test_the_locate_kernel_agrees_with_its_twin_and_finds_the_first_item_out_of_range(trial):
    rng = np.random.default_rng(trial)
    sizes = rng.integers(0, 50, int(rng.integers(1, 9)))  # empty sources among them
    sizes[rng.integers(len(sizes))] += 1
    offsets = np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)
    items = rng.integers(0, offsets[-1], int(rng.integers(0, 300))).astype(np.int64)
    source, local = np.empty_like(items), np.empty_like(items)
    assert _core.mixture_locate(items, offsets, source, local) == -1
    twin = _fallback.mixture_locate(items, offsets)
    assert source.tolist() == twin[0].tolist() and local.tolist() == twin[1].tolist() and twin[2] == -1
    assert (sizes[source] > 0).all() and ((0 <= local) & (local < sizes[source])).all()
    assert (offsets[source] + local == items).all()
    if len(items):
        for wrong in (-1, int(offsets[-1]), -(2**63), 2**63 - 1):
            spoiled = items.copy()
            at = int(rng.integers(len(items)))
            spoiled[at:] = wrong
            assert _core.mixture_locate(spoiled, offsets, source, local) == at == _fallback.mixture_locate(spoiled, offsets)[2]


def test_the_locate_kernel_refuses_bad_offsets_and_shapes():
    out = np.empty(2, np.int64), np.empty(2, np.int64)
    items = np.array([0, 1], np.int64)
    for offsets, words in (([0], "start at 0"), ([1, 5], "start at 0"), ([0, 5, 3], "descend at 2")):
        with pytest.raises(ValueError, match=words):
            _core.mixture_locate(items, np.array(offsets, np.int64), *out)
    with pytest.raises(ValueError, match="room for"):
        _core.mixture_locate(items, np.array([0, 5], np.int64), np.empty(1, np.int64), out[1])


def test_the_slot_kernel_refuses_bad_tables_and_slots_without_reading_past_them():
    _, layout, ends, before = block_tables(3)
    start = np.zeros(len(layout.totals), np.int64)
    out = np.empty(1, np.int64), np.empty(1, np.int64)
    total = layout.batch_size * layout.batch_count
    for slot in (-1, total, 2**62):
        with pytest.raises(ValueError, match="outside the block"):
            _core.mixture_slots(np.array([slot], np.int64), layout.batch_size, ends, before, start, *out)
    broken = ends.copy()
    broken[-1, 0] = layout.batch_size - 1  # the last source's slots do not reach the end of the batch
    with pytest.raises(ValueError, match="inconsistent"):
        _core.mixture_slots(np.array([layout.batch_size - 1], np.int64), layout.batch_size, broken, before, start, *out)
    with pytest.raises(ValueError, match="do not match"):
        _core.mixture_slots(np.array([0], np.int64), layout.batch_size, ends, np.ascontiguousarray(before[:-1]), start, *out)
    with pytest.raises(ValueError, match="room for"):
        _core.mixture_slots(np.array([0, 1], np.int64), layout.batch_size, ends, before, start, *out)
    rng = np.random.default_rng(0)
    for _ in range(300):  # hostile tables: an error of its own, never a crash
        junk = rng.integers(-5, layout.batch_size + 5, ends.shape).astype(np.int64)
        try:
            _core.mixture_slots(rng.integers(-3, total + 3, 8).astype(np.int64), layout.batch_size, junk, before, start,
                                np.empty(8, np.int64), np.empty(8, np.int64))
        except ValueError:
            pass


def test_the_item_kernel_agrees_with_its_twin_and_the_lazy_passes():
    rng = np.random.default_rng(5)
    sizes = np.array([1, 7, 1000, 10**9], np.int64)
    offsets = np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.int64)
    first_pass = np.array([3, 0, 2, 0], np.int64)
    wanted = np.array([5, 4, 2, 0])  # source 3 has no rows: left to the caller (-1)
    key_rows = np.concatenate(([0], np.cumsum(wanted))).astype(np.int64)
    keys = np.concatenate([round_keys_table((9, s), np.arange(first_pass[s], first_pass[s] + wanted[s]), (int(sizes[s]), LAZY_SOURCE))
                           for s in range(4) if wanted[s]])
    source = rng.integers(0, 4, 500).astype(np.int64)
    turn = first_pass[source] + rng.integers(0, np.maximum(wanted[source], 1))
    stream = turn * sizes[source] + rng.integers(0, sizes[source])
    out = np.empty_like(source)
    _core.mixture_items(source, stream, sizes, offsets, first_pass, key_rows, keys, out)
    assert out.tolist() == _fallback.mixture_items(source, stream, sizes, offsets, first_pass, key_rows, keys).tolist()
    for i in range(500):
        s, t, o = int(source[i]), int(turn[i]), int(stream[i] % sizes[source[i]])
        expected = -1 if s == 3 else int(offsets[s]) + int(LazyItems(int(sizes[s]), 9, s, t, int(sizes[s]), LAZY_SOURCE).at([o])[0])
        assert out[i] == expected
    with pytest.raises(ValueError, match="no source, pass or key row"):
        _core.mixture_items(np.array([2], np.int64), np.array([1000 * 5], np.int64), sizes, offsets, first_pass, key_rows, keys,
                            np.empty(1, np.int64))
    for bad_source in (-1, 4):
        with pytest.raises(ValueError, match="no source"):
            _core.mixture_items(np.array([bad_source], np.int64), np.array([0], np.int64), sizes, offsets, first_pass, key_rows,
                                keys, np.empty(1, np.int64))
    with pytest.raises(ValueError, match="key rows"):
        _core.mixture_items(source, stream, sizes, offsets, first_pass, key_rows[:-1], keys, out)


def test_the_order_equals_the_layout_read_through_each_pass_one_by_one():
    plan = mixture_plan(sizes=(53, 20, 3), weights=(0.5, 0.3, 0.2), epoch_size=400, batch_size=16)
    for epoch in (0, 5):
        order = MixtureOrder(plan, epoch)
        positions = np.arange(plan.batch_count * 16)
        source, stream = order.place(positions)
        expected = [int(plan.mixture.offsets[s]) + int(source_pass(plan, s, t // plan.mixture.source_sizes[s]).at(
            [t % plan.mixture.source_sizes[s]])[0]) for s, t in zip(source.tolist(), stream.tolist())]
        assert order.at(positions).tolist() == expected


@pytest.mark.parametrize("batching", ["random", "stratified"])
def test_the_one_call_kernel_gives_what_the_order_gives_position_by_position(batching):
    plan = mixture_plan(sizes=(700, 37, 5), weights=(0.6, 0.3, 0.1), epoch_size=1200, batch_size=12, batching=batching)
    for epoch in (0, 3):
        whole = epoch_items(plan, epoch)
        order = MixtureOrder(plan, epoch)  # fresh: nothing cached from epoch_items
        for b in range(plan.batch_count):
            assert order.local(plan, b) == whole[b].tolist()
        odd = share_ranges(plan, [(1, 4), (7, 12)])
        assert MixtureOrder(odd, epoch).local(odd, 70) == whole[70, [1, 2, 3, 7, 8, 9, 10, 11]].tolist()
        # a worker's task computes its slice of the batch only, across the share's ranges too
        part = order.local_array(plan, 9, 3, 8)
        assert part.dtype == np.int64 and part.tolist() == whole[9, 3:8].tolist() == order.local(plan, 9, 3, 8)
        fresh = MixtureOrder(odd, epoch)
        for first, end in ((0, 3), (2, 5), (3, 8), (5, 6), (4, 4)):
            assert fresh.local_array(odd, 70, first, end).tolist() == whole[70, [1, 2, 3, 7, 8, 9, 10, 11][first:end]].tolist()
        assert not fresh._batches  # nothing kept for a slice
        # the main process's whole share is kept, and cannot be written by whoever it is lent to
        kept = order.local_array(plan, 9)
        assert kept is order.local_array(plan, 9) and kept.tolist() == whole[9].tolist()
        with pytest.raises(ValueError, match="read-only"):
            kept[0] = 0
    block = MixtureOrder(plan, 0)
    block.local(plan, 0)
    kernel = next(iter(block._kernels.values()))
    with pytest.raises(ValueError, match="not all in the epoch"):
        kernel.fill(plan.batch_count * 12 - 2, np.empty(4, np.int64))
    with pytest.raises(ValueError, match="outside the block's runs"):
        kernel.fill(12 * 64, np.empty(4, np.int64))  # the first position of the next block
