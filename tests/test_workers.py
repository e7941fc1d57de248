"""The worker protocol, without the pipeline: task records in, completions and start-up reports out."""

import pytest
from support.workbench import wait_until, workbench

from hydrax.errors import StoreError
from hydrax.messages import Completion, StartupReport
from hydrax.schedule import local_seeds


def load(item, arrays, seed):
    arrays["item"][...] = item
    arrays["seed"][...] = seed
    return {"odd": item} if item % 2 else None


def load_failing_on_5(item, arrays, seed):
    if item == 5:
        raise ValueError("five")
    return load(item, arrays, seed)


def load_store_error(item, arrays, seed):
    raise StoreError("the bucket is gone", url="s3://b/x.tar")


def broken_startup():
    raise RuntimeError("no GPU here")


@pytest.mark.parametrize("method", [None, "forkserver"], ids=["as-a-run-starts-them", "forkserver"])
def test_a_task_fills_its_positions_with_the_schedules_items_and_seeds(method):
    with workbench(load, method=method, queued=1) as bench:
        done = bench.receive()  # queued before the worker started
        assert isinstance(done, Completion) and (done.task_id, done.ok, done.error, done.fatal) == (1, True, None, None)
        record = bench.record(1)
        slot = bench.slot(0)
        assert slot["item"].tolist() == list(record.indices)
        assert slot["seed"].tolist() == list(local_seeds(record.group.plan, 0, 0))
        assert done.extras == [{"odd": i} if i % 2 else None for i in record.indices] and done.elapsed_ns > 0
        bench.pool.submit(bench.task(2, step=1, slot=1, first=1, end=3))
        part = bench.receive()
        assert part.task_id == 2 and len(part.extras or [None, None]) == 2
        assert bench.slot(1)["item"].tolist()[1:3] == list(bench.record(2, step=1).indices)[1:3]


def test_a_failed_item_fails_its_task_naming_the_item():
    with workbench(load_failing_on_5, data=range(8)) as bench:
        for task_id, step in ((1, 0), (2, 1)):
            bench.pool.submit(bench.task(task_id, step=step, slot=step))  # a slot per batch, as in a run
        results = {done.task_id: done for done in (bench.receive(), bench.receive())}
    failed = [done for done in results.values() if not done.ok]
    assert len(failed) == 1 and failed[0].error.startswith("ValueError: five (item 5: 5)") and failed[0].fatal is None


def test_skip_mode_zeroes_the_failed_items_place_and_reports_it():
    with workbench(load_failing_on_5, skip_failed_items=True, data=range(8), batch_size=8) as bench:
        bench.pool.submit(bench.task(1))
        done = bench.receive()
        slot = bench.slot(0)
    position = list(bench.record(1).indices).index(5)
    assert done.ok and [k for k, _ in done.skipped] == [position] and "ValueError: five" in done.skipped[0][1]
    assert slot["item"][position] == 0 and slot["seed"][position] == 0


def test_data_that_cannot_be_read_is_fatal():
    with workbench(load_store_error) as bench:
        bench.pool.submit(bench.task(1))
        done = bench.receive()
    assert not done.ok and isinstance(done.fatal, StoreError) and done.fatal.url == "s3://b/x.tar"


def test_a_worker_that_cannot_start_says_why_and_exits():
    with workbench(load, startup=broken_startup) as bench:
        report = bench.receive()
        bench.pool.processes[0].join(10)
        assert bench.pool.processes[0].exitcode == 1
    assert isinstance(report, StartupReport) and report.stage == "startup_func"
    assert report.line == "RuntimeError: no GPU here" and "broken_startup" in report.traceback


def test_a_worker_that_reads_a_task_after_the_stop_word_exits_without_loading_it():
    with workbench(load, workers=2) as bench:
        bench.arena.stop_workers(2)
        bench.pool.submit(bench.task(1))
        wait_until(lambda: any(p.exitcode is not None for p in bench.pool.processes))
        assert [p.exitcode for p in bench.pool.processes if p.exitcode is not None] == [0]
        stopped = next(i for i, p in enumerate(bench.pool.processes) if p.exitcode is not None)
        with pytest.raises(EOFError):  # it sent nothing: the task was not loaded
            bench.pool.connections[stopped].recv()
        assert not bench.pool.connections[1 - stopped].poll(0.2)
