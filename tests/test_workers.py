"""The worker protocol, without the pipeline: task records in, completions and start-up reports out."""

import os
import subprocess
import sys

import pytest
from support.timing import slack
from support.workbench import wait_until, workbench

from hydrax.errors import StoreError
from hydrax.procs.messages import Completion, StartupReport
from hydrax.order.schedule import local_seeds


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


# -- the error that ends a run is logged once ----------------------------------------------------

UNREADABLE_SCRIPT = """
import logging
import sys

import numpy as np
import jax.numpy as jnp
from hydrax import DataGroup, Dataloader
from hydrax.errors import ShardFormatError

# hydrax's records down to DEBUG, in every process that inherits this set-up (forked workers),
# marked and counted by the test; fork-server workers log at their own level (hydrax's, sent to
# them) through Python's last resort, unmarked, on the same stderr
logging.basicConfig(level=logging.WARNING, format="RECORD %(process)d %(name)s %(levelname)s %(message)s")
logging.getLogger("hydrax").setLevel(logging.DEBUG)


def load(item, arrays, seed):
    raise ShardFormatError("the manifest counts 10 samples, the shard holds 8", url="shard-000.tar")


if __name__ == "__main__":
    if sys.argv[1] == "forkserver":
        jnp.ones(1).block_until_ready()  # JAX is live: workers start from the fork server
    group = DataGroup(6, range(60), loader_arrays={"x": ((), np.int32, jnp.int32)})
    try:
        with Dataloader(load, group, loader_count=3, end_at=("epoch", 1)) as dl:
            print("METHOD", dl.start_method, flush=True)
            for batch in dl:
                pass
    except ShardFormatError as exc:
        print("RAISED", type(exc).__name__, exc.url, flush=True)
"""


@pytest.mark.slow
@pytest.mark.parametrize("method", ["fork", "forkserver"])
def test_an_error_that_ends_the_run_met_by_every_item_in_flight_is_logged_once(tmp_path, method):
    # Unreadable data fails every item in flight, in every worker: each logged its traceback,
    # and a run ended with 10 to 13 identical ones. The first worker to meet it logs it.
    script = tmp_path / "unreadable.py"
    script.write_text(UNREADABLE_SCRIPT)
    env = {k: v for k, v in os.environ.items() if k != "HYDRAX_START_METHOD"}
    done = subprocess.run([sys.executable, str(script), method], capture_output=True, text=True, timeout=slack(120), env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.split() == ["METHOD", method, "RAISED", "ShardFormatError", "shard-000.tar"]
    err = done.stderr
    assert err.count("exception while loading data item") == 1, err[-6000:]
    assert err.count("Traceback (most recent call last)") == 1
    assert err.count("ShardFormatError: shard-000.tar: the manifest counts 10 samples") == 1
    if method == "fork":  # the forked workers' records are marked: one for the error, from one worker
        records = [line for line in err.splitlines() if line.startswith("RECORD") and "exception while loading" in line]
        assert len(records) == 1 and records[0].split()[2] == "hydrax.procs.workers"
