"""The schedule as pure functions: order, seeds, validation, start and end, resume equality."""

import dataclasses
import itertools

import numpy as np
import pytest

from hydrax.order.schedule import (GroupPlan, Plan, TrainingStep, ValidationStep, batch_items, batch_order, batch_seed,
                             epoch_group_sequence, iter_steps, normalise_start, permutation, read_order,
                             stream_positions)
from hydrax.order.orders import item_order, validation_item_order


def plan(n=8, bs=2, seed=5, first=False, later="itemwise"):
    return GroupPlan(size=n, batch_size=bs, batch_count=n // bs, seed=seed, shuffle_first=first, shuffle_later=later)


def take(steps, limit=10_000):
    return list(itertools.islice(steps, limit))


def training(steps):
    return [s for s in steps if isinstance(s, TrainingStep)]


# -- permutations and seeds: the verified 0.2.2 examples (hydrax-api.md 4.2, 4.3) ------------------


def test_permutations_match_the_verified_pcg64_values():
    assert permutation(6, 8).tolist() == [2, 5, 3, 7, 0, 4, 1, 6]
    assert permutation(5, 8).tolist() == [1, 4, 2, 3, 7, 5, 6, 0]
    assert permutation(6, 4).tolist() == [0, 3, 1, 2]
    assert not permutation(6, 8).flags.writeable


def test_itemwise_epoch_one_batches():
    p = plan()
    order = item_order(p, 1)
    assert [list(batch_items(order, 2, b)) for b in range(4)] == [[2, 5], [3, 7], [0, 4], [1, 6]]
    assert item_order(p, 0) is None


def test_shuffle_first_is_kept_by_every_mode_but_itemwise_after_epoch_zero():
    for later in ("repeat", "reseed", "batchwise"):
        p = plan(first=True, later=later)
        for epoch in range(4):
            assert item_order(p, epoch).tolist() == [1, 4, 2, 3, 7, 5, 6, 0]
    p = plan(first=True, later="itemwise")
    assert item_order(p, 0).tolist() == [1, 4, 2, 3, 7, 5, 6, 0]
    assert item_order(p, 1).tolist() == permutation(6, 8).tolist()


def test_batchwise_order_changes_from_epoch_one():
    p = plan(later="batchwise")
    assert batch_order(p, 0) is None
    assert batch_order(p, 1).tolist() == [0, 3, 1, 2]
    for later in ("repeat", "reseed", "itemwise"):
        assert batch_order(plan(later=later), 3) is None


@pytest.mark.parametrize(
    "later, expected",
    [
        ("reseed", [[5, 7, 9, 11], [13, 15, 17, 19], [21, 23, 25, 27]]),
        ("itemwise", [[5, 7, 9, 11], [13, 15, 17, 19], [21, 23, 25, 27]]),
        ("repeat", [[5, 7, 9, 11]] * 3),
        ("batchwise", [[5, 7, 9, 11], [5, 11, 7, 9], None]),
    ],
)
def test_seed_formulas(later, expected):
    p = plan(later=later)
    steps = training(take(iter_steps(Plan(training=(p,), end=("epoch", 3)))))
    seeds = [[batch_seed(p, s.epoch, s.group_index) for s in steps if s.epoch == e] for e in range(3)]
    for got, want in zip(seeds, expected):
        if want is not None:
            assert got == want


def test_validation_order_ignores_the_epoch():
    p = plan(first=True)
    assert validation_item_order(p).tolist() == permutation(5, 8).tolist()
    assert validation_item_order(plan()) is None


# -- start and end -------------------------------------------------------------------------------


def test_normalise_start():
    assert normalise_start((0, 5), 4) == (1, 1)
    assert normalise_start((1, -1), 4) == (0, 3)
    assert normalise_start((2, 0), 4) == (2, 0)
    with pytest.raises(ValueError, match="start_at must not be negative"):
        normalise_start((0, -1), 4)


def test_plan_numbers():
    p = Plan(training=(plan(), plan(n=6, bs=3)), start=(1, 2), end=("epoch", 3))
    assert p.batches_per_epoch == 6
    assert p.first_batch == 8
    assert p.last_batch == 18
    assert Plan(training=(plan(),), end=("batch", 7)).last_batch == 7
    assert Plan(training=(plan(),)).last_batch is None


def test_end_at_batch_and_epoch():
    p = plan()
    nums = [s.batch_num for s in iter_steps(Plan(training=(p,), end=("batch", 7)))]
    assert nums == list(range(7))
    steps = list(iter_steps(Plan(training=(p,), end=("epoch", 2))))
    assert [s.batch_num for s in steps] == list(range(8))
    assert [s.epoch for s in steps] == [0] * 4 + [1] * 4


@pytest.mark.parametrize("start, end", [((2, 0), ("epoch", 1)), ((2, 0), ("epoch", 2)), ((0, 5), ("batch", 5)), ((1, 1), ("batch", 3))])
def test_end_at_or_before_start_yields_nothing(start, end):
    p = Plan(training=(plan(),), start=normalise_start(start, 4), end=end, validation=(plan(),), validation_mode="batch", validation_interval=1)
    assert list(iter_steps(p)) == []


def test_endless_runs_go_on():
    steps = take(iter_steps(Plan(training=(plan(),))), 1000)
    assert len(steps) == 1000 and steps[-1].batch_num == 999


def test_skipped_batches_keep_their_numbers():
    full = training(iter_steps(Plan(training=(plan(later="batchwise"),), end=("epoch", 3))))
    resumed = list(iter_steps(Plan(training=(plan(later="batchwise"),), start=(1, 1), end=("epoch", 3))))
    assert resumed == full[5:]
    assert resumed[0] == TrainingStep(batch_num=5, epoch=1, epoch_batch=1, group=0, group_index=3)


# -- validation ----------------------------------------------------------------------------------


def test_every_validation_run_is_complete():
    v = (plan(n=6, bs=2, seed=1), plan(n=4, bs=2, seed=2))
    steps = list(iter_steps(Plan(training=(plan(),), validation=v, validation_mode="epoch", validation_interval=1, end=("epoch", 3))))
    runs = [[s for s in steps if isinstance(s, ValidationStep) and s.validation_epoch == r] for r in range(3)]
    for r, run in enumerate(runs):
        assert [(s.group, s.group_index) for s in run] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]
        assert [s.validation_epoch_batch for s in run] == list(range(5))
        assert [s.validation_batch_num for s in run] == list(range(5 * r, 5 * r + 5))
    # validation comes after the last batch of each epoch
    kinds = ["V" if isinstance(s, ValidationStep) else s.epoch for s in steps]
    assert kinds == [0] * 4 + ["V"] * 5 + [1] * 4 + ["V"] * 5 + [2] * 4 + ["V"] * 5


def test_batch_mode_validation_every_interval_and_at_the_end_point():
    steps = list(iter_steps(Plan(training=(plan(),), validation=(plan(n=2, bs=2),), validation_mode="batch", validation_interval=3, end=("batch", 6))))
    kinds = ["V" if isinstance(s, ValidationStep) else s.batch_num for s in steps]
    assert kinds == [0, 1, 2, "V", 3, 4, 5, "V"]


def test_resume_on_a_batch_mode_boundary_does_not_validate_again():
    # 0.2.2 ran the boundary's validation first here, although the run that stopped at batch 3
    # had already run it.
    steps = list(iter_steps(Plan(training=(plan(),), validation=(plan(n=2, bs=2),), validation_mode="batch", validation_interval=3, start=(0, 3), end=("batch", 7))))
    kinds = ["V" if isinstance(s, ValidationStep) else s.batch_num for s in steps]
    assert kinds == [3, 4, 5, "V", 6]
    assert steps[3].validation_epoch == 0 and steps[3].validation_batch_num == 0


def test_a_batch_end_point_at_an_epoch_end_runs_that_epochs_validation():
    # 0.2.2 stopped before it, and the resumed run starts with the next epoch: it was lost.
    steps = list(iter_steps(Plan(training=(plan(),), validation=(plan(n=2, bs=2),), validation_mode="epoch", validation_interval=1, end=("batch", 8))))
    kinds = ["V" if isinstance(s, ValidationStep) else s.batch_num for s in steps]
    assert kinds == [0, 1, 2, 3, "V", 4, 5, 6, 7, "V"]


def _events(steps):
    """Training batches by number, and each validation run as ("V", the batch number it follows)."""
    events, last = [], None
    for s in steps:
        if isinstance(s, TrainingStep):
            events.append(s.batch_num)
            last = s.batch_num
        elif s.validation_epoch_batch == 0:
            events.append(("V", last))
    return events


@pytest.mark.parametrize("mode,interval", [("batch", 1), ("batch", 3), ("epoch", 1), ("epoch", 2)])
def test_validation_runs_exactly_once_across_any_stop_and_resume(mode, interval):
    groups = (plan(n=8, bs=2), plan(n=6, bs=2, later="batchwise"))  # 7 batches per epoch
    validation = (plan(n=4, bs=2),)
    base = dict(training=groups, validation=validation, validation_mode=mode, validation_interval=interval)
    whole = _events(iter_steps(Plan(**base, end=("epoch", 4))))
    bpe = Plan(**base).batches_per_epoch
    stops = [("batch", n) for n in range(1, 4 * bpe)] + [("epoch", e) for e in range(1, 4)]
    for kind, n in stops:
        first = _events(iter_steps(Plan(**base, end=(kind, n))))
        stop = n if kind == "batch" else n * bpe
        resumed = _events(iter_steps(Plan(**base, start=normalise_start((0, stop), bpe), end=("epoch", 4))))
        # a resumed run's first validation follows a batch of the earlier run
        resumed = [("V", stop - 1) if e == ("V", None) else e for e in resumed]
        assert first + resumed == whole, (kind, n)


def test_resume_at_an_epoch_start_does_not_repeat_the_previous_validation():
    steps = list(iter_steps(Plan(training=(plan(),), validation=(plan(n=2, bs=2),), validation_mode="epoch", validation_interval=1, start=(1, 0), end=("epoch", 2))))
    kinds = ["V" if isinstance(s, ValidationStep) else s.batch_num for s in steps]
    assert kinds == [4, 5, 6, 7, "V"]


def test_epoch_interval_two():
    steps = list(iter_steps(Plan(training=(plan(),), validation=(plan(n=2, bs=2),), validation_mode="epoch", validation_interval=2, end=("epoch", 4))))
    kinds = ["V" if isinstance(s, ValidationStep) else s.epoch for s in steps]
    assert kinds == [0] * 4 + [1] * 4 + ["V"] + [2] * 4 + [3] * 4 + ["V"]


# -- several training groups ---------------------------------------------------------------------


def test_sequential_groups():
    p = Plan(training=(plan(), plan(n=4, bs=2)), interleave=False)
    assert epoch_group_sequence(p) == [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1)]


def test_interleaved_groups_pick_the_least_consumed():
    p = Plan(training=(plan(), plan(n=4, bs=2)), interleave=True)
    assert [g for g, _ in epoch_group_sequence(p)] == [0, 1, 0, 0, 1, 0]
    p = Plan(training=(plan(n=6, bs=2), plan(n=6, bs=2), plan(n=2, bs=2)), interleave=True)
    assert [g for g, _ in epoch_group_sequence(p)] == [0, 1, 2, 0, 1, 0, 1]


def test_group_numbering_runs_across_groups():
    p = Plan(training=(plan(later="reseed"), plan(n=4, bs=2, seed=100, later="repeat")), interleave=True, end=("epoch", 2))
    steps = list(iter_steps(p))
    assert [s.epoch_batch for s in steps] == list(range(6)) * 2
    assert [s.batch_num for s in steps] == list(range(12))
    for epoch in range(2):
        per_group = sorted((s.group, s.group_index) for s in steps if s.epoch == epoch)
        assert per_group == [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1)]


# -- exhaustive resume equality ------------------------------------------------------------------

GROUP_SETS = [
    (plan(n=8, bs=2),),
    (plan(n=9, bs=2, first=True, later="batchwise"),),
    (plan(n=7, bs=3, later="reseed"), plan(n=5, bs=2, seed=9, first=True, later="repeat")),
    (plan(n=6, bs=2, later="batchwise"), plan(n=8, bs=2, seed=3, first=True, later="itemwise"), plan(n=3, bs=3, seed=1)),
]


@pytest.mark.parametrize("groups", GROUP_SETS, ids=lambda g: f"{len(g)}groups")
@pytest.mark.parametrize("interleave", [False, True])
@pytest.mark.parametrize("validation", [None, ("epoch", 1), ("epoch", 2), ("batch", 3)])
def test_every_resume_point_reproduces_the_uninterrupted_run(groups, interleave, validation):
    mode, interval = validation or (None, 1)
    vgroups = (plan(n=4, bs=2, seed=11, first=True),) if mode else ()
    base = Plan(training=groups, validation=vgroups, validation_mode=mode, validation_interval=interval, interleave=interleave, end=("epoch", 4))
    full = list(iter_steps(base))
    full_training = training(full)
    bpe = base.batches_per_epoch
    for start in range(4 * bpe):
        epoch, offset = divmod(start, bpe)
        # the same point, named two ways, must give the same run
        resumed = list(iter_steps(Plan(**{**base.__dict__, "start": normalise_start((0, start), bpe)})))
        assert resumed == list(iter_steps(Plan(**{**base.__dict__, "start": (epoch, offset)})))
        assert training(resumed) == [s for s in full_training if s.batch_num >= start]
        # validation passes keep their content; counters restart with the run
        runs = [s for s in resumed if isinstance(s, ValidationStep)]
        assert [(s.group, s.group_index) for s in runs] == [(0, b) for _ in range(len(runs) // 2) for b in range(2)]
        assert [s.validation_batch_num for s in runs] == list(range(len(runs)))


def test_items_and_seeds_are_pure_functions_of_seed_and_epoch():
    p = plan(n=10, bs=3, seed=7, first=True)
    a = [(list(batch_items(item_order(p, e), 3, b)), batch_seed(p, e, b)) for e in range(5) for b in range(3)]
    b = [(list(batch_items(item_order(p, e), 3, b)), batch_seed(p, e, b)) for e in reversed(range(5)) for b in range(3)]
    assert sorted(a) == sorted(b)
    for e in range(5):
        items = np.concatenate([batch_items(item_order(p, e), 3, b) for b in range(3)])
        assert len(set(items.tolist())) == 9  # one dropped remainder item, no repeats


def test_read_order_tells_read_ahead_how_batches_read_their_items():
    sharded = GroupPlan(size=8, batch_size=2, batch_count=4, seed=5, shuffle_first=False, shuffle_later="shardwise",
                        shard_sizes=(4, 4))
    assert read_order(sharded, 0) == "shardwise"
    assert read_order(plan(later="itemwise"), 0) == "sequential" and read_order(plan(later="itemwise"), 1) == "random"
    assert read_order(plan(later="batchwise"), 0) == "sequential" and read_order(plan(later="batchwise"), 1) == "random"
    assert read_order(plan(first=True, later="repeat"), 3) == "random"
    assert read_order(plan(first=True), 0, training=False) == "random" and read_order(plan(), 0, training=False) == "sequential"


@pytest.mark.parametrize("count", [1, 2, 3])
@pytest.mark.parametrize("first", [0, 4])
def test_stream_shares_are_disjoint_and_make_the_whole_run(count, first):
    whole = Plan(training=(plan(), plan(n=6, bs=3)), validation=(plan(n=4, bs=2),), validation_mode="epoch",
                 start=(1, 1), end=("epoch", 3))
    steps = list(iter_steps(whole))
    shares = [list(iter_steps(dataclasses.replace(whole, stream=(k, count, first)))) for k in range(count)]
    merged = [None] * len(steps)
    for k, share in enumerate(shares):
        positions = list(itertools.islice(stream_positions(k, count, first), len(share)))
        assert all(p % count == k and p >= first for p in positions)
        for p, step in zip(positions, share):
            merged[p] = step
    assert merged[first:] == steps[first:]
    assert sum(len(s) for s in shares) == len(steps) - first


@pytest.mark.parametrize("counts", [[5], [3, 7], [4, 4, 4], [1, 9, 2], [6, 10, 15], [2, 3, 5, 7, 11], [1, 1], [12, 8]])
@pytest.mark.parametrize("interleave", [True, False])
def test_an_epoch_resumes_anywhere_by_arithmetic(counts, interleave):
    from hydrax.order.schedule import epoch_sequence, interleaved_cursors

    whole = list(epoch_sequence(counts, interleave))
    assert sorted(whole) == sorted((g, c) for g, n in enumerate(counts) for c in range(n))
    for first in range(len(whole) + 1):
        assert list(epoch_sequence(counts, interleave, first)) == whole[first:]
        if interleave:
            taken = [sum(1 for g, _ in whole[:first] if g == h) for h in range(len(counts))]
            assert interleaved_cursors(counts, first) == taken


def test_resuming_a_billion_item_epoch_walks_nothing():
    from hydrax.order.schedule import epoch_sequence, interleaved_cursors

    counts = [10**9 // 256, 10**8 // 256, 3 * 10**7 // 64]
    half = sum(counts) // 2
    cursors = interleaved_cursors(counts, half)
    assert sum(cursors) == half
    # each group is half way through its batches, up to one batch of rounding
    assert all(abs(c - n / 2) <= 1 for c, n in zip(cursors, counts))
    # and the sequence goes on from there: the group furthest behind its share comes next
    g, c = next(epoch_sequence(counts, True, half))
    assert c == cursors[g]
