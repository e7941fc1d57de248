"""Read-ahead announcements: data that reads ahead hears of each batch before it is loaded."""

import logging

import jax.numpy as jnp
import numpy as np
from support.workbench import plan_training

from hydrax import DataGroup, Mixture
from hydrax.run.announce import MAX_LOOKAHEAD, Announcer, reads_ahead
from hydrax.run.inflight import InFlight
from hydrax.order.schedule import iter_steps


class Reader(list):
    """A plain list that also records the announcements it hears."""

    def __init__(self, items, prefetch_items=None, fail=False):
        super().__init__(items)
        self.prefetch_items = prefetch_items
        self.fail = fail
        self.heard, self.released = [], []

    def prefetch(self, key, indices, order):
        if self.fail:
            raise OSError("the store is down")
        self.heard.append((key, list(indices), order))

    def release(self, key):
        self.released.append(key)


def setup(data, depth=2, epochs=2):
    group = DataGroup(2, data, loader_arrays={"x": ((), np.int32, jnp.int32)}, seed=1)
    schedule, groups = plan_training(group, epochs=epochs)
    return Announcer(iter_steps(schedule), groups, depth), groups, list(iter_steps(schedule))


def test_every_step_is_taken_in_schedule_order_and_announced_with_its_items():
    data = Reader(range(20), prefetch_items=8)  # 4 batches ahead
    announcer, groups, steps = setup(data)
    announcer.start([])
    taken = []
    while (next_step := announcer.take()) is not None:
        step, key = next_step
        taken.append(step)
        run = groups.of(step)
        assert key is not None and data.heard[key - 1] == (key, list(run.items(step)), run.read_order(step))
        announcer.release(key)
        announcer.top_up()
    assert taken == steps and len(data.heard) == len(steps) == len(data.released)
    assert {order for _, _, order in data.heard} == {"sequential", "random"}  # epoch 0 in order, epoch 1 shuffled


def test_nothing_is_announced_before_start_and_what_was_taken_is_announced_then():
    data = Reader(range(20))
    announcer, groups, steps = setup(data)
    first, key = announcer.take()
    assert key is None and data.heard == []
    record = InFlight(0, first, groups.of(first), 0, groups.of(first).items(first), 1)
    announcer.start([record])
    assert record.prefetch_key == 1 and data.heard[0][1] == list(record.indices)
    assert len(data.heard) >= 2  # the look-ahead (at least the run's depth) was filled at once
    announcer.close()
    assert sorted(data.released) == sorted(key for key, _, _ in data.heard)


def test_the_look_ahead_follows_what_the_data_asks_for_within_bounds():
    greedy = Reader(range(100), prefetch_items=2 * 10**9)
    setup(greedy, epochs=20)[0].start([])
    assert len(greedy.heard) == MAX_LOOKAHEAD  # of 1,000 batches
    modest = Reader(range(100), prefetch_items=11)
    setup(modest, depth=3, epochs=20)[0].start([])
    assert len(modest.heard) == 6  # ceil(11 / 2) batches: more than the depth


def test_data_without_read_ahead_hears_nothing_and_a_failing_read_ahead_is_only_a_warning(caplog):
    assert not reads_ahead(list(range(3))) and reads_ahead(Reader([]))
    # data that says it holds nothing ahead (a ShardSet of local files, a Mixture of such sources)
    # is not announced to: that would compute every batch's items once more for nothing
    assert reads_ahead(Reader([], prefetch_items=1)) and not reads_ahead(Reader([], prefetch_items=0))
    assert not reads_ahead(Mixture([range(5), Reader(range(3), prefetch_items=0)], weights=[1, 1]))
    assert reads_ahead(Mixture([range(5), Reader(range(3), prefetch_items=4)], weights=[1, 1]))
    quiet = Reader(range(20), prefetch_items=0)
    announcer, _, steps = setup(quiet)
    announcer.start([])
    assert [announcer.take() for _ in steps] == [(step, None) for step in steps] and quiet.heard == []
    announcer, _, steps = setup(list(range(20)))
    announcer.start([])
    assert [announcer.take() for _ in steps] == [(step, None) for step in steps]
    data = Reader(range(20), fail=True)
    announcer, _, steps = setup(data)
    with caplog.at_level(logging.WARNING, logger="hydrax"):
        announcer.start([])
        assert announcer.take() == (steps[0], None)
    assert "read-ahead failed; loading goes on without it" in caplog.text
