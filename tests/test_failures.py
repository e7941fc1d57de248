"""The failure budget: what a run lost, and when that ends it (no processes needed)."""

import jax.numpy as jnp
import numpy as np
import pytest
from support.workbench import plan_training

from hydrax import BatchFailedError, DataGroup
from hydrax.run.failures import FailureBudget
from hydrax.run.inflight import InFlight
from hydrax.procs.messages import Completion
from hydrax.run.plan import RunPolicy
from hydrax.order.schedule import iter_steps

GROUP = DataGroup(2, range(8), loader_arrays={"x": ((), np.int32, jnp.int32)})


def records(n=4, policy=None):
    policy = policy or RunPolicy()
    schedule, groups = plan_training(GROUP, epochs=3, policy=policy)
    steps = list(iter_steps(schedule))[:n]
    return [InFlight(seq, step, groups.of(step), 0, groups.of(step).items(step), 1) for seq, step in enumerate(steps)]


def failed(record, error="ValueError: boom (item 1: 1)"):
    record.take_completion(0, False, None, error, None)
    return record


def test_items_and_dropped_batches_are_counted():
    budget = FailureBudget(RunPolicy())
    budget.count_items(Completion(1, False, error="ValueError: a"))
    budget.count_items(Completion(2, True, skipped=[(0, "x"), (1, "y")]))
    assert (budget.failed_items, budget.last_error) == (3, "ValueError: a")
    record = failed(records(1)[0])
    assert budget.drop(record) is None and budget.dropped_batches == 1


@pytest.mark.parametrize("policy", [RunPolicy(on_item_error="raise"), RunPolicy(never_drop=True, process_count=2, process_index=1)])
def test_a_run_that_must_not_drop_ends_at_the_failed_batch(policy):
    error = FailureBudget(policy).drop(failed(records(1, policy)[0]))
    assert isinstance(error, BatchFailedError) and error.batch == "batch 0 (epoch 0)"
    assert error.reason == "ValueError: boom (item 1: 1)" and error.process_index == policy.process_index
    assert ("never drops a batch" in str(error)) == policy.never_drop


def test_too_many_failed_batches_in_a_row_end_the_run():
    budget = FailureBudget(RunPolicy(max_consecutive_failures=2))
    first, second, third, fourth = records(4)
    assert budget.judge(failed(first)) is None
    assert budget.judge(second) is None  # a good batch resets the count
    assert budget.judge(failed(third)) is None
    error = budget.judge(failed(fourth))
    assert isinstance(error, BatchFailedError) and "2 batches in a row failed to load (max_consecutive_failures=2)" in str(error)


def test_a_batch_whose_every_item_was_skipped_counts_as_failed():
    budget = FailureBudget(RunPolicy(max_consecutive_failures=1))
    record = records(1)[0]
    record.take_completion(0, True, None, None, [(0, "ValueError: a"), (1, "ValueError: b")])
    assert record.failed and "ValueError: a" in str(budget.judge(record))


def test_a_batch_that_ends_the_run_anyway_is_counted_but_not_reported_twice():
    budget = FailureBudget(RunPolicy(max_consecutive_failures=1))
    first, second = records(2)
    assert budget.judge(failed(first), ending=True) is None
    assert budget.judge(second) is None


def test_a_run_where_every_batch_failed_is_an_error_unless_the_budget_is_off():
    budget = FailureBudget(RunPolicy())
    for record in records(3):
        budget.count_items(Completion(0, False, error="KeyError: 'jpg'"))
        budget.drop(failed(record))
    error = budget.every_batch_failed(3)
    assert "every one of the 3 batches of the run failed to load; the last error: KeyError: 'jpg'" in str(error)
    assert budget.every_batch_failed(4) is None
    off = FailureBudget(RunPolicy(max_consecutive_failures=None))
    off.drop(failed(records(1)[0]))
    assert off.every_batch_failed(1) is None
