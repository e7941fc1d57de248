"""A batch in flight: completions fill it in, and its extras come out in item order."""

import jax.numpy as jnp
import numpy as np
from support.workbench import plan_training

from hydrax import DataGroup
from hydrax.run.inflight import InFlight
from hydrax.order.schedule import iter_steps


def record(tasks=2):
    schedule, groups = plan_training(DataGroup(4, range(8), loader_arrays={"x": ((), np.int32, jnp.int32)}))
    step = next(iter_steps(schedule))
    return InFlight(0, step, groups.of(step), 1, groups.of(step).items(step), tasks)


def test_completions_fill_in_extras_errors_and_skips_by_position():
    batch = record()
    batch.take_completion(2, True, [{"b": 2}, {"a": 3, "b": 3}], None, None)  # positions 2 and 3, out of order
    assert batch.remaining == 1 and batch.error is None and not batch.failed
    batch.take_completion(0, True, [None, {"a": 1}], None, [(0, "ValueError: zero")])
    assert batch.remaining == 0 and batch.skipped == {0: "ValueError: zero"} and not batch.failed
    assert batch.additional() == {"a": [None, 1, None, 3], "b": [None, None, 2, 3]}
    assert list(batch.additional()) == ["a", "b"]  # keys in the order of the items that returned them
    assert batch.words() == "batch 0 (epoch 0)"


def test_the_first_error_is_kept_and_a_batch_of_skipped_items_failed():
    batch = record()
    batch.take_completion(0, False, None, "ValueError: first", None)
    batch.take_completion(2, False, None, "ValueError: second", None)
    assert batch.error == "ValueError: first" and batch.failed
    skipped = record(tasks=1)
    skipped.take_completion(0, True, None, None, [(k, "no") for k in range(4)])
    assert skipped.failed and skipped.error is None
