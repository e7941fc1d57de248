"""Dataloader end to end, with real worker processes and real JAX."""

import os
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from support.timing import slack, slack_int

import hydrax
from hydrax import BatchTimeoutError, Dataloader, DataGroup, TrainingBatch, ValidationBatch, is_worker
from hydrax.order.schedule import batch_items, batch_seed, permutation
from hydrax.order.orders import item_order

ARRAYS = {"item": ((), np.int32, jnp.int32), "seed": ((), np.int32, jnp.int32), "vec": ((3,), np.float32, jnp.float32)}


def load(item, arrays, seed):
    arrays["item"][...] = item
    arrays["seed"][...] = -1 if seed is None else seed
    arrays["vec"][:] = (item, item + 0.5, -item)
    return {"even": item} if item % 2 == 0 else None


def load_failing(item, arrays, seed):
    if item == 5:
        raise ValueError("planned failure")
    return load(item, arrays, seed)


def load_always_failing(item, arrays, seed):
    raise ValueError("nothing loads")


def load_slow(item, arrays, seed):
    time.sleep(0.01)
    return load(item, arrays, seed)


def load_stuck(item, arrays, seed):
    if item == 3:
        time.sleep(120)
    return load(item, arrays, seed)


def load_trivial(item, arrays, seed):
    arrays["x"][:] = seed


STARTED = []


def startup():
    STARTED.append(os.getpid())


def load_environment(item, arrays, seed):
    load(item, arrays, seed)
    try:
        Dataloader(load, DataGroup(1, [0], loader_arrays=ARRAYS))
        nested = "allowed"
    except RuntimeError as exc:
        nested = str(exc)
    return {
        "worker": is_worker(),
        "nice": os.nice(0),
        "started": list(STARTED),
        "pid": os.getpid(),
        "prealloc": os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE"),
        "nested": nested,
    }


def load_bad_return(item, arrays, seed):
    load(item, arrays, seed)
    return ["not", "a", "dict"] if item == 2 else None


def run(loader_func=load, groups=None, keep=False, **kwargs):
    """Every batch of a run as plain Python data (and the batches themselves with ``keep``)."""
    groups = groups if groups is not None else DataGroup(4, range(10), loader_arrays=ARRAYS, seed=3)
    kwargs.setdefault("loader_count", 2)
    kwargs.setdefault("end_at", ("epoch", 3))
    kwargs.setdefault("timeout_sec", slack_int(30))
    out, kept = [], []
    with Dataloader(loader_func, groups, **kwargs) as dl:
        for batch in dl:
            out.append(describe(batch))
            if keep:
                kept.append(batch)
            del batch
        interrupted = dl.interrupted
    return (out, kept, interrupted) if keep else out


def describe(batch):
    common = (list(batch.indices), np.asarray(batch.arrays["item"]).tolist(), np.asarray(batch.arrays["seed"]).tolist())
    if isinstance(batch, TrainingBatch):
        return ("T", batch.batch_num, batch.epoch, batch.epoch_batch, batch.group_index, batch.seed, *common)
    return ("V", batch.validation_epoch, batch.validation_epoch_batch, batch.validation_batch_num, batch.group_index, None, *common)


# -- what comes out ------------------------------------------------------------------------------


def test_batches_carry_the_scheduled_items_seeds_and_extras():
    train = DataGroup(4, range(10), loader_arrays=ARRAYS, seed=3)
    valid = DataGroup(2, range(100, 105), loader_arrays=ARRAYS, seed=9, shuffle_first=True)
    seen = []
    with Dataloader(load, train, validation=("epoch", 1, valid), end_at=("epoch", 3), loader_count=2) as dl:
        assert (dl.batches_per_epoch, dl.batches_per_validation, dl.first_batch, dl.last_batch) == (2, 2, 0, 6)
        for batch in dl:
            items = np.asarray(batch.arrays["item"]).tolist()
            if batch.is_training:
                plan = train.plan
                assert list(batch.indices) == list(batch_items(item_order(plan, batch.epoch), 4, batch.group_index))
                assert items == list(batch.indices)
                assert batch.seed == batch_seed(plan, batch.epoch, batch.group_index) == 3 + batch.batch_num * 4
                assert np.asarray(batch.arrays["seed"]).tolist() == list(batch.seeds)
            else:
                order = permutation(9, 5).tolist()
                assert list(batch.indices) == order[batch.group_index * 2 : batch.group_index * 2 + 2]
                assert items == [100 + i for i in batch.indices]
                assert np.asarray(batch.arrays["seed"]).tolist() == [-1, -1]
            np.testing.assert_array_equal(np.asarray(batch.arrays["vec"])[:, 1], np.array(items) + 0.5)
            assert batch.get_additional("even") == [i if i % 2 == 0 else None for i in items]
            seen.append("T" if batch.is_training else "V")
            del batch
    assert seen == ["T", "T", "V", "V"] * 3  # a full validation pass after every epoch
    assert not dl.interrupted


def test_batch_api():
    group = DataGroup(4, [f"item-{i}" for i in range(8)], loader_arrays={"y": ((), np.float32, jnp.float32)}, shuffle_first=True)
    with Dataloader(load_named, group, end_at=("batch", 1)) as dl:
        batch = next(dl)
        assert isinstance(batch, TrainingBatch) and isinstance(batch, hydrax.Batch) and not isinstance(batch, ValidationBatch)
        assert batch.is_training and not batch.is_validation and len(batch) == 4
        assert batch.group is group and batch.layouts is group.loader_layouts and batch.uncached
        assert list(batch.data) == [group[i] for i in batch.indices] and len(batch.data) == 4
        assert batch.data[-1] == batch.get_data(3) == group[batch.indices[3]]
        assert batch.data[1:3] == [group[i] for i in batch.indices[1:3]]
        assert all(isinstance(i, int) for i in batch.indices)
        assert batch.get_array("y") is batch.arrays["y"] and batch.arrays["y"].shape == (4,)
        np.testing.assert_array_equal(np.asarray(batch.arrays["y"]), [float(s.split("-")[1]) for s in batch.data])
        assert batch.get_additional("name") == list(batch.data)
        assert batch.get_additional("missing", default=0) == [0, 0, 0, 0]
        assert batch.get_additional("missing", -4, default=7) == 7
        with pytest.raises(IndexError, match="index 4 is invalid for batch size 4"):
            batch.get_additional("missing", 4)
        assert batch.get_additional("name", 2) == batch.data[2]
        with pytest.raises(RuntimeError, match="cache layouts undefined"):
            batch.cache({})
        with pytest.raises(TypeError):
            batch.arrays["z"] = 1
        del batch


def load_named(item, arrays, seed):
    arrays["y"][...] = float(item.split("-")[1])  # a 0-d, writable view for item_shape ()
    return {"name": item}


def test_results_do_not_depend_on_workers_depth_or_delivery_order():
    reference = run(loader_count=2, depth=3)
    assert run(loader_count=1, depth=1) == reference
    assert run(loader_count=5, depth=2) == reference
    assert sorted(run(loader_count=3, depth=4, deterministic=False)) == sorted(reference)


def test_resume_equals_the_tail_of_an_uninterrupted_run():
    train = DataGroup(3, range(11), loader_arrays=ARRAYS, seed=8, shuffle_first=True, shuffle_later="batchwise")
    full = run(groups=train, end_at=("epoch", 4))
    for start in [(0, 2), (1, 0), (1, 3), (2, 2), (0, 7)]:
        resumed = run(groups=train, start_at=start, end_at=("epoch", 4))
        first = start[0] * 3 + start[1]
        assert resumed == [b for b in full if b[1] >= first]


def test_interleaved_groups_are_delivered_least_used_first():
    a = DataGroup(2, range(8), loader_arrays=ARRAYS)
    b = DataGroup(2, range(1000, 1004), loader_arrays=ARRAYS)
    got = run(groups=[a, b], end_at=("epoch", 1))
    assert [batch[7][0] >= 1000 for batch in got] == [False, True, False, False, True, False]
    sequential = run(groups=[a, b], end_at=("epoch", 1), interleave_groups=False)
    assert [batch[7][0] >= 1000 for batch in sequential] == [False] * 4 + [True] * 2


def test_a_failed_item_drops_its_batch_and_leaves_a_gap():
    group = DataGroup(4, range(10), loader_arrays=ARRAYS, seed=3)
    got = run(load_failing, groups=group, end_at=("epoch", 3))
    plan = group.plan
    holding_5 = {e * 2 + b for e in range(3) for b in range(2) if 5 in batch_items(item_order(plan, e), 4, b)}
    assert holding_5 and len(holding_5) < 6
    assert [b[1] for b in got] == [n for n in range(6) if n not in holding_5]


def test_a_run_whose_batches_all_fail_raises_instead_of_ending_quietly():
    with pytest.raises(hydrax.BatchFailedError, match="every one of the 4 batches of the run failed to load; the last error: ValueError: nothing loads"):
        run(load_always_failing, end_at=("epoch", 2))
    assert run(load_always_failing, end_at=("epoch", 2), max_consecutive_failures=None) == []  # 0.2.2's way


def test_a_failure_budget_ends_a_run_that_keeps_failing_and_counts_what_it_lost():
    group = DataGroup(4, range(200), loader_arrays=ARRAYS)  # 50 batches
    with pytest.raises(hydrax.BatchFailedError, match=r"10 batches in a row failed to load \(max_consecutive_failures=10\)") as caught:
        with Dataloader(load_always_failing, group, loader_count=2, end_at=("epoch", 1)) as dl:
            for _batch in dl:
                pass
    assert caught.value.batch == "batch 9 (epoch 0)" and "nothing loads" in caught.value.reason
    assert dl.dropped_batches >= 10 and dl.failed_items >= 10
    # occasional failures are within the budget: dropped and counted, as 0.2.2 drops them
    with Dataloader(load_failing, DataGroup(4, range(40), loader_arrays=ARRAYS), loader_count=2, end_at=("epoch", 3), max_consecutive_failures=2) as dl:
        got = [b.batch_num for b in dl]
        assert len(got) == 27 and dl.dropped_batches == 3 and dl.failed_items == 3


def test_skip_item_keeps_the_batch_with_the_failed_item_zeroed_and_flagged():
    group = DataGroup(4, range(12), loader_arrays=ARRAYS)
    with Dataloader(load_failing, group, loader_count=2, end_at=("epoch", 1), on_item_error="skip_item") as dl:
        batches = list(dl)
        assert [b.batch_num for b in batches] == [0, 1, 2]
        assert dl.dropped_batches == 0 and dl.failed_items == 1
    second = batches[1]  # items 4..7: item 5 failed
    assert dict(second.item_errors).keys() == {1} and "ValueError: planned failure (item 5: 5)" in second.item_errors[1]
    assert second.item_mask.tolist() == [True, False, True, True]
    assert np.asarray(second.arrays["item"]).tolist() == [4, 0, 6, 7]
    assert np.asarray(second.arrays["vec"])[1].tolist() == [0, 0, 0]
    assert second.get_additional("even") == [4, None, 6, None]
    assert not batches[0].item_errors and batches[0].item_mask.all()
    # a batch whose every item is skipped counts as failed: the budget still ends a hopeless run
    delivered = []
    with pytest.raises(hydrax.BatchFailedError, match="3 batches in a row"):
        with Dataloader(load_always_failing, DataGroup(4, range(80), loader_arrays=ARRAYS), loader_count=2,
                        end_at=("epoch", 1), on_item_error="skip_item", max_consecutive_failures=3) as dl:
            delivered.extend(b.item_mask.any() for b in dl)
    assert delivered == [False, False]


def test_raise_ends_the_run_at_the_first_failed_item():
    group = DataGroup(4, range(12), loader_arrays=ARRAYS)
    got = []
    with pytest.raises(hydrax.BatchFailedError, match="planned failure") as caught:
        with Dataloader(load_failing, group, loader_count=2, end_at=("epoch", 1), on_item_error="raise") as dl:
            got.extend(b.batch_num for b in dl)
    assert got == [0] and caught.value.batch == "batch 1 (epoch 0)"
    with pytest.raises(ValueError, match="on_item_error must be one of"):
        Dataloader(load, group, on_item_error="ignore")


def test_a_bad_return_value_drops_the_batch():
    got = run(load_bad_return, end_at=("epoch", 1))
    assert [b[1] for b in got] == [1]  # batch 0 held item 2


def test_placement_func_gets_the_host_arrays_and_its_result_is_checked():
    calls = []

    def place(arrays, layouts, additional, group):
        calls.append((type(arrays).__name__, {k: (type(v).__name__, v.shape, v.flags.writeable) for k, v in arrays.items()}, dict(additional), group))
        return {k: jnp.asarray(np.array(v), dtype=layouts[k][2]) * (2 if k == "vec" else 1) for k, v in arrays.items()}

    group = DataGroup(4, range(8), loader_arrays=ARRAYS)
    with Dataloader(load, group, end_at=("epoch", 1), placement_func=place) as dl:
        batches = [(np.asarray(b.arrays["vec"])[:, 0].tolist(), list(b.indices)) for b in dl]
    assert [v for v, _ in batches] == [[2.0 * i for i in idx] for _, idx in batches]
    kind, arrays, additional, g = calls[0]
    assert kind == "mappingproxy" and g is group
    assert arrays["vec"] == ("ndarray", (4, 3), True)
    assert additional == {"even": [0, None, 2, None]}

    def place_missing(arrays, layouts, additional, group):
        return {"item": jnp.zeros(4, jnp.int32)}

    with Dataloader(load, group, end_at=("epoch", 1), placement_func=place_missing) as dl:
        assert list(dl) == []  # "array 'seed' was not provided": every batch dropped


# -- memory: zero copy, holding batches, no stalls --------------------------------------------------


@pytest.mark.cpu_only
def test_cpu_batches_alias_aligned_slot_memory_when_a_slot_stays_free():
    group = DataGroup(8, range(64), loader_arrays=ARRAYS)
    with Dataloader(load, group, end_at=("epoch", 1), depth=3) as dl:
        pointers = []
        for batch in dl:
            pointers.append(batch.arrays["vec"].unsafe_buffer_pointer())
            del batch
        stats = dl.transfer_stats
    assert stats["aliased_batches"] > 0
    assert stats["aliased_batches"] + stats["copied_batches"] == 8
    assert all(p % 64 == 0 for p in pointers)
    with Dataloader(load, group, end_at=("epoch", 1), zero_copy=False) as dl:
        for batch in dl:
            del batch
        assert dl.transfer_stats["aliased_batches"] == 0 and dl.transfer_stats["copied_batches"] == 8


@pytest.mark.cpu_only
def test_a_loop_that_releases_its_batches_gets_every_batch_without_a_copy():
    group = DataGroup(8, range(96), loader_arrays=ARRAYS)
    with Dataloader(load, group, end_at=("epoch", 2), depth=2, loader_count=2) as dl:
        for batch in dl:
            del batch
        assert dl.transfer_stats["aliased_batches"] == 24 and dl.transfer_stats["copied_batches"] == 0
    with Dataloader(load, group, end_at=("epoch", 2), depth=1, loader_count=2) as dl:
        for batch in dl:
            del batch
        assert dl.transfer_stats["copied_batches"] == 24  # with one slot, aliasing could stall: never


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_keeping_every_batch_never_stalls_and_never_corrupts(depth):
    group = DataGroup(4, range(40), loader_arrays=ARRAYS, seed=1)
    out, kept, _ = run(groups=group, depth=depth, end_at=("epoch", 3), keep=True, loader_count=2, timeout_sec=slack_int(20))
    assert len(kept) == 30
    for described, batch in zip(out, kept):
        assert describe(batch) == described  # memory under kept batches was never reused


@pytest.mark.slow
def test_a_trivial_job_runs_a_hundred_times_without_a_stall():
    # hydrax 0.2.2 stalled in about half of the runs of this job (hydrax-api.md 10.3)
    group = DataGroup(64, range(8192), loader_arrays={"x": ((1,), np.float32, jnp.float32)})
    started = time.monotonic()
    for attempt in range(100):
        with Dataloader(load_trivial, group, end_at=("epoch", 1), loader_count=2, depth=4, timeout_sec=slack_int(10)) as dl:
            count = sum(1 for _ in dl)
        assert count == 128, f"run {attempt} delivered {count} batches"
    assert time.monotonic() - started < slack(240)  # about 8 s idle; stalls of seconds, each short of the timeout, add up here


# -- lifecycle -----------------------------------------------------------------------------------


def test_lifecycle_errors():
    dl = Dataloader(load, DataGroup(2, range(4), loader_arrays=ARRAYS), end_at=("epoch", 1))
    with pytest.raises(RuntimeError, match="dataloader is not running: start it with 'with Dataloader"):
        iter(dl)
    with pytest.raises(RuntimeError, match="dataloader is not running"):
        next(dl)
    with pytest.raises(RuntimeError, match="dataloader is not set up"):
        dl.interrupt()
    with dl:
        with pytest.raises(RuntimeError, match="dataloader is already set up"):
            dl.__enter__()
        assert len(list(dl)) == 2
        with pytest.raises(RuntimeError, match="dataloader is not running"):
            next(dl)
        # a second loop in the same block: the message says the run ended and what to do
        with pytest.raises(RuntimeError, match=r"its run has ended .*runs once: for more batches, build a new one with start_at"):
            for _batch in dl:
                pass
    with pytest.raises(RuntimeError, match="its 'with' block was left"):
        next(dl)
    assert not dl.interrupted
    with pytest.raises(RuntimeError, match="runs only once"):
        with dl:
            pass


def test_interrupt_ends_the_iteration_after_the_current_batch():
    with Dataloader(load, DataGroup(2, range(40), loader_arrays=ARRAYS), loader_count=2) as dl:
        numbers = []
        for batch in dl:
            numbers.append(batch.batch_num)
            if batch.batch_num == 3:
                dl.interrupt()
            del batch
        assert numbers == [0, 1, 2, 3] and dl.interrupted
        with pytest.raises(RuntimeError, match="dataloader is not running"):
            next(dl)


def test_leaving_the_block_early_counts_as_interrupted():
    with Dataloader(load, DataGroup(2, range(40), loader_arrays=ARRAYS)) as dl:
        for _batch in dl:
            break
    assert dl.interrupted


def test_an_exception_in_the_loop_shuts_everything_down(caplog):
    # Logged to "hydrax.run.loader" as a warning: a program without logging set up sees it on stderr
    # (tests/test_errors.py checks that); under pytest it is captured here.
    with pytest.raises(ZeroDivisionError):
        with Dataloader(load, DataGroup(2, range(40), loader_arrays=ARRAYS), loader_count=2) as dl:
            for _batch in dl:
                _ = 1 / 0
    said = [(r.name, r.levelname, r.getMessage()) for r in caplog.records]
    assert ("hydrax.run.loader", "WARNING", "[hydrax]: shutting down due to ZeroDivisionError") in said


def test_idle_time_counts_blocking_waits_only():
    with Dataloader(load_slow, DataGroup(4, range(40), loader_arrays=ARRAYS), end_at=("epoch", 1), loader_count=1) as dl:
        next(dl)
        assert dl.idle_usec() == 0  # the first batch is not counted
        for batch in dl:
            del batch
        idle = dl.idle_usec()
        assert idle > 30_000  # nine batches of four 10 ms items, loaded by one worker
        assert dl.idle_usec() == 0  # reset on read


def test_a_stuck_item_times_out_with_a_message_naming_it():
    # Long enough for the first batch (items 0 and 1) to come on a busy machine: the timeout must be
    # the stuck item's; and then the run must end by it, well before the item's 120 s are up.
    timeout = slack_int(1)
    started = time.monotonic()
    with pytest.raises(BatchTimeoutError, match=rf"no batches have been produced in {timeout} seconds(.|\n)*item 3 \(3\) of training group 0"):
        with Dataloader(load_stuck, DataGroup(2, range(8), loader_arrays=ARRAYS, shuffle_later="repeat"), loader_count=1,
                        timeout_sec=timeout) as dl:
            for batch in dl:
                del batch
    assert time.monotonic() - started < timeout + slack(9)


def place_aliasing(arrays, layouts, additional, group):
    return {name: jax.device_put(view) for name, view in arrays.items()}  # on CPU this pins the slot


@pytest.mark.cpu_only
def test_a_timeout_with_every_slot_held_says_so():
    group = DataGroup(2, range(40), loader_arrays={"x": ((1,), np.float32, jnp.float32)})
    kept = []
    # the timeout must not come before the two batches that take the slots, on a busy machine too
    with pytest.raises(BatchTimeoutError, match="all 2 batch slots are held by batches still referenced"):
        with Dataloader(load_trivial, group, end_at=("epoch", 1), placement_func=place_aliasing, depth=2, timeout_sec=slack_int(1)) as dl:
            for batch in dl:
                kept.append(batch)  # a custom placement that aliases, and a loop that keeps everything
    assert len(kept) == 2


def test_worker_environment():
    group = DataGroup(2, range(4), loader_arrays=ARRAYS)
    with Dataloader(load_environment, group, end_at=("epoch", 1), loader_count=2, loader_nice=3, startup_func=startup) as dl:
        extras = [e for b in dl for e in b.additional["worker"] and b.get_additional("pid")]
        assert not is_worker()
    with Dataloader(load_environment, group, end_at=("epoch", 1), loader_count=1, loader_nice=3, startup_func=startup) as dl:
        batch = next(dl)
        assert batch.get_additional("worker") == [True, True]
        assert batch.get_additional("nested", 0) == "Dataloader cannot run in a worker process."
        assert batch.get_additional("prealloc", 0) == "false"
        assert batch.get_additional("nice", 0) >= os.nice(0) + 3 or batch.get_additional("nice", 0) == 19
        pid = batch.get_additional("pid", 0)
        assert batch.get_additional("started", 0) == [pid]  # startup_func ran once, in that worker
        del batch
    assert len(set(extras)) >= 1


def test_more_loaders_than_slots_is_fine():
    assert len(run(loader_count=4, depth=1, end_at=("epoch", 1))) == 2


# -- arguments -----------------------------------------------------------------------------------

GROUP = DataGroup(2, range(4), loader_arrays=ARRAYS)


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"training": [GROUP, "x"]}, TypeError, "data of type str is not in a hydrax.DataGroup"),
        ({"training": []}, ValueError, "training needs at least one DataGroup"),
        ({"validation": ("step", 1, GROUP)}, ValueError, "validation mode must be 'epoch' or 'batch'"),
        ({"validation": ("epoch", 0, GROUP)}, ValueError, "validation interval must be at least 1"),
        ({"validation": ("epoch", 1)}, TypeError, r"validation must be a tuple \(mode, interval, groups\)"),
        ({"loader_count": 0}, ValueError, "loaders are required, cannot provision none"),
        ({"depth": 0}, ValueError, "depth must be at least 1"),
        ({"depth": 2.0}, TypeError, "depth must be an int"),
        ({"start_at": (0, -1)}, ValueError, "start_at must not be negative"),
        ({"start_at": 3}, TypeError, r"start_at must be \(epoch, batch\)"),
        ({"end_at": ("step", 3)}, ValueError, "end_at endpoint must be 'never', 'epoch', or 'batch'"),
        ({"loader_func": None}, TypeError, "loader_func must be callable"),
        ({"placement_func": 3}, TypeError, "placement_func must be callable or None"),
        ({"zero_copy": "yes"}, TypeError, "zero_copy must be None, True or False"),
    ],
)
def test_bad_arguments_say_what_is_wrong(kwargs, error, message):
    args = {"loader_func": load, "training": GROUP, **kwargs}
    with pytest.raises(error, match=message):
        Dataloader(args.pop("loader_func"), args.pop("training"), **args)


def test_properties_and_normalisation():
    dl = Dataloader(load, [GROUP, DataGroup(1, range(3), loader_arrays=ARRAYS)], start_at=(0, 7), end_at=("epoch", 4))
    assert dl.batches_per_epoch == 5 and dl.first_batch == 7 and dl.last_batch == 20
    assert dl.deterministic and not dl.interrupted and dl.batches_per_validation == 0
    assert Dataloader(load, GROUP, end_at=("never", 0)).last_batch is None
    assert Dataloader(load, GROUP, end_at=("batch", 9)).last_batch == 9
    assert not Dataloader(load, GROUP, deterministic=False).deterministic


def test_subclassing_warns_but_works():
    class Mine(Dataloader):
        pass

    with pytest.warns(SyntaxWarning, match="Mine derives from hydrax.Dataloader. This is not supported."):
        dl = Mine(load, GROUP, end_at=("epoch", 1))
    with dl:
        assert len(list(dl)) == 2


def test_no_file_descriptors_leak_across_runs():
    """No descriptor opened during the runs is still open after. (Earlier tests in this process
    may leave objects whose descriptors the collector closes during the runs: fewer is fine.)"""
    import gc

    run(end_at=("epoch", 1))
    gc.collect()
    before = set(os.listdir("/proc/self/fd"))
    for _ in range(3):
        run(end_at=("epoch", 1))
    gc.collect()
    # A descriptor another thread holds for a moment (the /dev/shm watch lists its folder) is not
    # a leak: only one still open after a while is.
    deadline = time.monotonic() + 2
    after = set(os.listdir("/proc/self/fd"))
    while not after <= before and time.monotonic() < deadline:
        time.sleep(0.05)
        after = set(os.listdir("/proc/self/fd"))

    def target(fd):
        try:
            return os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return "(closed)"

    # what each new descriptor is, and the threads that may hold it, should this ever fail
    assert after <= before and len(after) <= len(before), ({fd: target(fd) for fd in sorted(after - before)},
                                                           [t.name for t in threading.enumerate()])


@pytest.mark.cpu_only
def test_debug_batch_references_names_the_holder(capsys):
    group = DataGroup(2, range(8), loader_arrays=ARRAYS)
    with Dataloader(load, group, end_at=("epoch", 1), depth=3) as dl:
        held = [b for b in dl]
        aliased = dl.transfer_stats["aliased_batches"]
        hydrax.debug_batch_references()
        del held
    err = capsys.readouterr().err
    if aliased:
        assert "[hydrax] remaining references to batch slot" in err


def load_heap_check(item, arrays, seed):
    """Whether a fresh 8 MB block comes from the heap (not a fresh mapping) in this worker."""
    block = np.empty(8 << 20, np.uint8)
    address = block.ctypes.data
    with open("/proc/self/maps") as f:
        # A worker forked from the fork server may see its heap as several mappings (what it
        # inherited and what it grew since): any of them counts.
        heap = [[int(x, 16) for x in line.split()[0].split("-")] for line in f if line.rstrip().endswith("[heap]")]
    arrays["item"][...] = any(start <= address < end for start, end in heap)
    return None


def test_workers_keep_large_blocks_on_the_heap(monkeypatch):
    """glibc would map and unmap every large block (a decoded image) afresh; workers raise its thresholds."""
    monkeypatch.setenv("HYDRAX_START_METHOD", "forkserver")  # a fresh process, not this one's malloc state
    group = DataGroup(4, range(8), loader_arrays=ARRAYS)
    with Dataloader(load_heap_check, group, loader_count=2, end_at=("epoch", 1)) as loader:
        assert [np.asarray(b.arrays["item"]).tolist() for b in loader] == [[1] * 4, [1] * 4]


def test_select_stream_loads_one_share_and_never_drops_a_batch():
    group = DataGroup(2, range(10), loader_arrays=ARRAYS)
    loader = Dataloader(load, group, end_at=("epoch", 1))
    with pytest.raises(ValueError, match="stream index 2 is not below the count 2"):
        loader.select_stream(2, 2)
    loader.select_stream(1, 2)
    with loader:
        assert [batch.batch_num for batch in loader] == [1, 3]
    with pytest.raises(RuntimeError, match="before the Dataloader is entered"):
        loader.select_stream(0, 2)
    # a share must not lose a batch quietly: its consumer waits for every position
    failing = Dataloader(load_failing, DataGroup(2, range(10), loader_arrays=ARRAYS), end_at=("epoch", 1))
    failing.select_stream(0, 1)
    with pytest.raises(hydrax.BatchFailedError, match="planned failure"):
        with failing:
            for _ in failing:
                pass


@pytest.mark.parametrize("count", [2, 3])
def test_a_stream_share_of_stored_orders_crosses_many_epochs(count):
    """A share loads every count-th batch, so its batches in flight reach count times further back
    in the schedule: the stored orders must stay in the book that long (they were overwritten
    by the epoch after next, at the third epoch boundary, before)."""
    group = DataGroup(2, range(60), loader_arrays=ARRAYS, seed=5, shuffle_later="itemwise")
    whole = run(groups=group, loader_count=2, end_at=("epoch", 4))
    for index in range(count):
        # slow items keep tasks waiting in the pipe while the schedule runs ahead
        loader = Dataloader(load_slow, group, loader_count=1, depth=8, end_at=("epoch", 4), timeout_sec=slack_int(30))
        loader.select_stream(index, count)
        with loader:
            share = [describe(batch) for batch in loader]
        assert share == whole[index::count]
