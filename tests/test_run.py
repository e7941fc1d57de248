"""A run's records, settled before anything starts: policy, per-group shares, layouts, caches."""

import warnings

import jax.numpy as jnp
import numpy as np
import pytest

from hydrax import DataGroup
from hydrax.procs.messages import TASK_BYTES
from hydrax.run.plan import TASK_PIPE_BUDGET, RunPolicy, plan_run, share_layout, with_cachers
from hydrax.order.schedule import TrainingStep, ValidationStep, batch_items, iter_steps
from hydrax.order.orders import item_order

ARRAYS = {"x": ((3,), np.float32, jnp.float32)}


def plan(training, validation=(), policy=None, **kwargs):
    policy = policy or RunPolicy()
    kwargs = {"validation_mode": "epoch" if validation else None, "validation_interval": 1, "start_at": (0, 0),
              "end_at": ("epoch", 2), "interleave": True, **kwargs}
    return plan_run(list(training), list(validation), policy, **kwargs)


def test_groups_are_numbered_training_first_and_found_by_step_or_task():
    a, b = DataGroup(2, range(6), loader_arrays=ARRAYS), DataGroup(3, range(6), loader_arrays=ARRAYS, seed=5)
    v = DataGroup(2, range(4), loader_arrays=ARRAYS)
    schedule, groups = plan([a, b], [v])
    assert [(g.index, g.kind, g.number, str(g)) for g in groups] == [
        (0, "training", 0, "training group 0"), (1, "training", 1, "training group 1"), (2, "validation", 0, "validation group 0")]
    assert len(groups) == 3 and groups[2].group is v and groups[1].group is b
    steps = list(iter_steps(schedule))
    for step in steps:
        run = groups.of(step)
        assert run.training == isinstance(step, TrainingStep)
        assert run.group is ([a, b][step.group] if run.training else v)
    assert any(isinstance(s, ValidationStep) for s in steps)


def test_a_groups_items_are_the_schedules_items_of_the_step():
    group = DataGroup(4, range(10), loader_arrays=ARRAYS, seed=3)
    schedule, groups = plan([group])
    run = groups.training[0]
    for step in iter_steps(schedule):
        assert list(run.items(step)) == list(batch_items(item_order(run.plan, step.epoch), 4, step.group_index))
        assert run.epoch_of(step) == step.epoch


def test_each_process_plans_its_share_and_lays_out_only_that():
    group = DataGroup(8, range(32), loader_arrays=ARRAYS)
    _, whole = plan([group])
    _, share = plan([group], policy=RunPolicy(process_index=1, process_count=4))
    assert whole.training[0].plan.share == () and share.training[0].plan.share == ((2, 4),)
    assert share.training[0].layout.arrays["x"].shape == (2, 3)
    # A whole batch's layout is the group's own object, as hydrax 0.2.2 handed it out.
    assert whole.training[0].layout.arrays is group.loader_layouts
    with pytest.raises(ValueError, match="3 processes cannot split evenly"):
        plan([group], policy=RunPolicy(process_index=0, process_count=3))


def test_share_layout_of_a_group_without_loader_arrays_is_empty(tmp_path):
    group = DataGroup(2, range(4), cache_arrays=ARRAYS, cache_location=tmp_path, cache_readonly=True)
    layout = share_layout(group, group.plan)
    assert (dict(layout.arrays), layout.size) == ({}, 0)


def test_a_cache_is_opened_for_the_share_and_refused_with_a_sharding(tmp_path):
    group = DataGroup(4, range(8), loader_arrays=ARRAYS, cache_location=tmp_path)
    _, groups = plan([group], policy=RunPolicy(process_index=1, process_count=2))
    cache = groups.training[0].cache
    assert cache.location == str(tmp_path / "share-1-of-2") and cache.rows == 2 and cache.direct
    assert groups.training[0].cache_layouts is cache.layouts
    import jax

    with pytest.raises(ValueError, match="cannot be placed with sharding"):
        plan([group], sharding=jax.sharding.SingleDeviceSharding(jax.devices()[0]))


def test_tasks_per_batch_fit_the_task_pipe():
    assert RunPolicy(loader_count=4, depth=3).tasks_per_batch == 8
    assert RunPolicy(loader_count=0).tasks_per_batch == 1
    policy = RunPolicy(loader_count=10_000, depth=64)
    assert policy.tasks_per_batch * TASK_BYTES * policy.depth <= TASK_PIPE_BUDGET


def test_cache_writers_follow_the_caches(tmp_path):
    loaders = DataGroup(2, range(4), loader_arrays=ARRAYS)
    _, plain = plan([loaders])
    assert with_cachers(RunPolicy(cacher_count=3), plain).cacher_count == 0
    _, cached = plan([DataGroup(2, range(4), loader_arrays=ARRAYS, cache_location=tmp_path)])
    assert with_cachers(RunPolicy(cacher_count=2), cached).cacher_count == 2
    with pytest.raises(ValueError, match="cachers are required"):
        with_cachers(RunPolicy(cacher_count=0), cached)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert with_cachers(RunPolicy(cacher_count=9, depth=3), cached).cacher_count == 3
    assert "ignoring cacher_count (9) in excess of depth (3)" in str(caught[0].message)
