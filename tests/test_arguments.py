"""Checking the Dataloader's arguments: each error names the argument and what it needs."""

import jax.numpy as jnp
import numpy as np
import pytest

from hydrax import DataGroup
from hydrax.run.arguments import (MIN_LOADER_LIMIT, ONE_YEAR_S, as_groups, check_functions, check_int, parse_end, parse_start,
                              parse_validation, process_split, run_policy, usable_cpus)

ARRAYS = {"x": ((1,), np.int32, jnp.int32)}
GROUP = DataGroup(2, range(4), loader_arrays=ARRAYS)
SETTINGS = dict(depth=3, loader_count=1, loader_nice=0, cacher_count=1, deterministic=True, timeout_sec=60, zero_copy=None,
                on_item_error="drop_batch", max_consecutive_failures=10, process_index=None, process_count=None, sharding=None,
                placement_func=None)


def test_ints_are_ints_and_not_bools():
    assert check_int("depth", np.int64(3), 1) == 3
    with pytest.raises(TypeError, match="depth must be an int, got True"):
        check_int("depth", True)
    with pytest.raises(ValueError, match="depth must be at least 1, got 0"):
        check_int("depth", 0, 1)


def test_groups_functions_and_schedule_arguments():
    assert as_groups(GROUP, "training") == [GROUP] and as_groups((GROUP, GROUP), "training") == [GROUP, GROUP]
    with pytest.raises(TypeError, match="data of type range is not in a hydrax.DataGroup"):
        as_groups([range(3)], "training")
    with pytest.raises(ValueError, match="validation groups needs at least one DataGroup"):
        parse_validation(("epoch", 1, []))
    assert parse_validation(None) == (None, 1, []) and parse_validation(("batch", 5, GROUP)) == ("batch", 5, [GROUP])
    with pytest.raises(ValueError, match="validation mode must be 'epoch' or 'batch'"):
        parse_validation(("step", 1, GROUP))
    with pytest.raises(TypeError, match="loader_func must be callable"):
        check_functions(3, None, None)
    with pytest.raises(TypeError, match="placement_func must be callable or None"):
        check_functions(print, None, "no")
    assert parse_start((1, 2)) == (1, 2) and parse_end(("never", 0)) is None and parse_end(("batch", 7)) == ("batch", 7)
    with pytest.raises(TypeError, match=r"start_at must be \(epoch, batch\) ints"):
        parse_start((1.5, 0))
    with pytest.raises(ValueError, match="end_at endpoint must be"):
        parse_end(("steps", 3))


def test_the_process_split_goes_together():
    assert process_split(None, None) == (0, 1)  # no JAX backend, no jax.distributed
    assert process_split(1, 4) == (1, 4)
    with pytest.raises(ValueError, match="go together"):
        process_split(1, None)
    with pytest.raises(ValueError, match="must be below process_count"):
        process_split(4, 4)


def test_a_timeout_of_none_waits_for_ever_and_one_of_zero_or_less_says_what_it_means():
    """0.2.2 read ``timeout_sec <= 0`` as a year without a word; a Python user reads 0 as "do not wait"."""
    assert run_policy([GROUP], **{**SETTINGS, "timeout_sec": None}).timeout_s == ONE_YEAR_S
    for value in (0, -5):
        with pytest.warns(FutureWarning, match=rf"timeout_sec={value} means no time limit .*pass timeout_sec=None"):
            assert run_policy([GROUP], **{**SETTINGS, "timeout_sec": value}).timeout_s == ONE_YEAR_S
    with pytest.raises(TypeError, match="timeout_sec must be an int, got 1.5"):
        run_policy([GROUP], **{**SETTINGS, "timeout_sec": 1.5})
    from hydrax import Dataloader

    with pytest.warns(FutureWarning) as warned:
        Dataloader(lambda item, arrays, seed: None, GROUP, timeout_sec=0)
    assert warned[0].filename == __file__  # the line to change is the caller's


def test_the_policy_holds_the_checked_settings(caplog):
    policy = run_policy([GROUP], **{**SETTINGS, "timeout_sec": None, "process_index": 1, "process_count": 2})
    assert (policy.timeout_s, policy.process_index, policy.process_count, policy.never_drop) == (ONE_YEAR_S, 1, 2, True)
    assert not run_policy([GROUP], **SETTINGS).never_drop
    with pytest.raises(ValueError, match="on_item_error must be one of 'drop_batch', 'skip_item', 'raise'"):
        run_policy([GROUP], **{**SETTINGS, "on_item_error": "ignore"})
    with pytest.raises(ValueError, match="deterministic=False cannot be used with 2 processes"):
        run_policy([GROUP], **{**SETTINGS, "deterministic": False, "process_index": 0, "process_count": 2})
    with pytest.raises(ValueError, match="loaders are required"):
        run_policy([GROUP], **{**SETTINGS, "loader_count": 0})
    with pytest.raises(TypeError, match="zero_copy must be None, True or False"):
        run_policy([GROUP], **{**SETTINGS, "zero_copy": "yes"})


def test_a_runaway_loader_count_is_refused_and_an_unusable_one_cut(caplog):
    """10**6 loaders once forked until the machine ran out of memory; loaders beyond the items in
    flight would never get a task."""
    with pytest.raises(ValueError, match=r"loader_count is 1000000, more loader processes than this machine can run: at most \d+"):
        run_policy([GROUP], **{**SETTINGS, "loader_count": 10**6})
    limit = max(MIN_LOADER_LIMIT, 8 * usable_cpus())
    with pytest.raises(ValueError, match=f"at most {limit} "):
        run_policy([GROUP], **{**SETTINGS, "loader_count": limit + 1})
    big = DataGroup(1000, range(4000), loader_arrays=ARRAYS)
    assert run_policy([big], **{**SETTINGS, "loader_count": limit}).loader_count == limit
    with caplog.at_level("WARNING", logger="hydrax.run.loader"):
        policy = run_policy([GROUP], **{**SETTINGS, "loader_count": 7, "depth": 3})  # batch 2: 6 items in flight
    assert policy.loader_count == 6
    assert "at most 6 items are ever in flight (depth 3 x batch 2): starting 6 loaders" in caplog.text


def test_a_dataloader_with_a_runaway_loader_count_starts_nothing():
    import multiprocessing

    from hydrax import Dataloader

    before = len(multiprocessing.active_children())
    with pytest.raises(ValueError, match="loader_count is 1000000"):
        Dataloader(lambda item, arrays, seed: None, GROUP, loader_count=10**6)
    assert len(multiprocessing.active_children()) == before
