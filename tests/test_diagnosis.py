"""Worker diagnosis: a worker that dies, freezes or cannot start is named with what it was doing."""

import os
import signal
import time

from support.workbench import wait_until, workbench

from hydrax.diagnosis import HEARTBEAT_STALE_S, WorkerDiagnosis, startup_failure_words
from hydrax.messages import StartupReport


def load_stuck_on_3(item, arrays, seed):
    if item == 3:
        time.sleep(60)
    arrays["item"][...] = item


def broken_startup():
    raise RuntimeError("no GPU here")


def diagnose(bench, records):
    return WorkerDiagnosis(bench.arena, bench.pool, lambda task: records.get(task))


def test_a_killed_worker_is_named_with_the_item_it_was_loading():
    with workbench(load_stuck_on_3, data=range(8)) as bench:
        bench.pool.submit(bench.task(1))
        records = {1: bench.record(1)}
        diagnosis = diagnose(bench, records)
        wait_until(lambda: diagnosis.current_item(0) is not None)
        loading = diagnosis.current_item(0)
        assert (loading.index, loading.item, loading.kind, loading.group, loading.batch) == (3, "3", "training", 0, "batch 0 (epoch 0)")
        assert "idle" not in diagnosis.describe_workers() and "item 3 (3) of training group 0" in diagnosis.describe_workers()
        os.kill(bench.pool.processes[0].pid, signal.SIGKILL)
        bench.pool.processes[0].join(10)
        error = diagnosis.worker_error(0, "exited")
    assert str(error).startswith(f"loader process hydrax-loader-0 (pid {error.pid}) was killed by SIGKILL while loading item 3 (3)")
    assert (error.signal, error.exitcode, error.item, error.batch, error.traceback) == ("SIGKILL", -9, "3", "batch 0 (epoch 0)", None)


def test_a_stopped_worker_is_found_frozen_and_an_idle_one_is_not():
    with workbench(load_stuck_on_3, workers=2) as bench:
        diagnosis = diagnose(bench, {})
        wait_until(lambda: all(bench.arena.heartbeat(i) for i in range(2)))
        assert diagnosis.frozen_worker() is None and diagnosis.describe_workers().count(": idle") == 2
        os.kill(bench.pool.processes[1].pid, signal.SIGSTOP)
        try:
            time.sleep(HEARTBEAT_STALE_S + 0.3)
            frozen = diagnosis.frozen_worker()
            assert frozen is not None and frozen[0] == 1 and frozen[1] > HEARTBEAT_STALE_S
            error = diagnosis.worker_error(1, "stopped responding")
            assert "stopped responding while idle" in str(error) and error.exitcode is None
        finally:
            os.kill(bench.pool.processes[1].pid, signal.SIGCONT)


def test_a_worker_that_could_not_start_is_reported_with_its_traceback():
    with workbench(load_stuck_on_3, startup=broken_startup) as bench:
        bench.pool.processes[0].join(10)
        error = diagnose(bench, {}).worker_error(0, "exited")
    assert "exited with status 1 during start-up: startup_func raised RuntimeError: no GPU here" in str(error)
    assert "the worker's traceback:" in str(error) and "broken_startup" in error.traceback


def test_start_up_words_say_what_to_do():
    unpickle = StartupReport("unpickle", "ModuleNotFoundError: No module named 'mine'", "Traceback\n  ...\nModuleNotFoundError")
    words = startup_failure_words(unpickle)
    assert words.startswith("it could not unpickle what it runs") and "must be importable in a new process" in words
    assert words.endswith("  the worker's traceback:\n    Traceback\n      ...\n    ModuleNotFoundError")
    from hydrax._forkserver import MAIN_IMPORT_FAILED

    main = startup_failure_words(StartupReport("unpickle", "SystemExit: 2", f"{MAIN_IMPORT_FAILED}\nSystemExit: 2"))
    assert 'keep the training code under `if __name__ == "__main__":`' in main
