"""Worker diagnosis: a worker that dies, freezes or cannot start is named with what it was doing."""

import contextlib
import os
import signal
import subprocess
import sys
import time

import pytest
from support.timing import slack
from support.workbench import wait_until, workbench

from hydrax.run import diagnosis as diagnosis_module
from hydrax.run.diagnosis import HEARTBEAT_STALE_S, WorkerDiagnosis, process_activity, startup_failure_words
from hydrax.procs.messages import StartupReport


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
            assert frozen is not None and frozen[0] == 1 and frozen[1] > HEARTBEAT_STALE_S and "stopped" in frozen[2]
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
    from hydrax.procs.forkserver import MAIN_IMPORT_FAILED

    main = startup_failure_words(StartupReport("unpickle", "SystemExit: 2", f"{MAIN_IMPORT_FAILED}\nSystemExit: 2"))
    assert 'keep the training code under `if __name__ == "__main__":`' in main


@contextlib.contextmanager
def python_processes(code: str, count: int = 1):
    """``count`` Python processes running ``code``, killed on the way out."""
    processes = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) for _ in range(count)]
    try:
        yield processes
    finally:
        for process in processes:
            process.kill()
            process.wait()


def test_the_kernel_tells_a_running_a_stopped_and_a_sleeping_process_apart():
    with python_processes("while True: pass") as [busy], python_processes("import time; time.sleep(600)") as [idle]:
        wait_until(lambda: process_activity(busy.pid).cpu_ticks > 0)
        running = process_activity(busy.pid)
        assert running.runnable and not running.stopped
        wait_until(lambda: process_activity(busy.pid).cpu_ticks > running.cpu_ticks)
        os.kill(busy.pid, signal.SIGSTOP)
        wait_until(lambda: process_activity(busy.pid).stopped)
        assert not process_activity(busy.pid).runnable
        os.kill(busy.pid, signal.SIGCONT)
        wait_until(lambda: process_activity(idle.pid) is not None and not process_activity(idle.pid).runnable)
        sleeping = process_activity(idle.pid)
        assert not sleeping.stopped
        gone = busy.pid
    assert process_activity(gone) is None


def settled(pid: int):
    """What /proc says of ``pid`` once it sleeps and its CPU time stays put for a moment: a process
    still starting (loading modules, faulting pages in) can be caught between two bursts of work."""
    deadline = time.monotonic() + slack(30)
    while time.monotonic() < deadline:
        before = process_activity(pid)
        time.sleep(0.05)
        after = process_activity(pid)
        if not before.runnable and not after.runnable and before.cpu_ticks == after.cpu_ticks:
            return after
    raise AssertionError(f"process {pid} never settled into a sleep")


def test_a_silent_process_that_uses_no_cpu_time_is_frozen_only_after_the_long_limit(monkeypatch):
    # The heartbeat thread cannot stop in a running process, so the judgement is driven by hand
    # with what /proc says of a real sleeping process (no CPU time) and a busy one. The sleeper
    # says when its start-up is over: CPU time used after the first look (a busy machine stretches
    # start-up) would rightly restart its silence, and the test would judge too early.
    limit = slack(0.5)
    monkeypatch.setattr(diagnosis_module, "SILENT_LIMIT_S", limit)
    with python_processes("import time; print('ready', flush=True); time.sleep(600)") as [idle], \
            python_processes("while True: pass") as [busy]:
        assert idle.stdout.readline() == "ready\n"
        judge = WorkerDiagnosis(None, None, lambda task: None)._judge
        assert judge(0, 1, 1.0, settled(idle.pid)) is None  # silent, but not for long yet
        time.sleep(limit + 0.1)
        assert "no CPU time" in judge(0, 1, limit + 1.1, settled(idle.pid))
        # a process that uses CPU time is judged anew from its last progress, whatever its state
        wait_until(lambda: process_activity(busy.pid).cpu_ticks > 0)
        os.kill(busy.pid, signal.SIGSTOP)
        wait_until(lambda: process_activity(busy.pid).stopped)
        assert "stopped" in judge(1, 1, 1.0, process_activity(busy.pid))
        os.kill(busy.pid, signal.SIGCONT)
        wait_until(lambda: process_activity(busy.pid).runnable)
        assert judge(1, 1, 99.0, process_activity(busy.pid)) is None  # runnable: never frozen, however late
        assert judge(2, 1, 99.0, None) == "the system cannot say what it is doing"


def lowest_priority(pid: int) -> None:
    """Run ``pid``'s threads only when nothing else wants a CPU (SCHED_IDLE): starved by any hog."""
    for task in os.listdir(f"/proc/{pid}/task"):
        os.sched_setscheduler(int(task), os.SCHED_IDLE, os.sched_param(0))


@pytest.mark.slow
def test_a_starved_worker_beats_late_but_is_never_judged_frozen(monkeypatch):
    monkeypatch.setattr(diagnosis_module, "HEARTBEAT_STALE_S", 0.05)
    with workbench(load_stuck_on_3, workers=2) as bench:
        diagnosis = diagnose(bench, {})
        wait_until(lambda: all(bench.arena.heartbeat(i) for i in range(2)))
        for process in bench.pool.processes:
            lowest_priority(process.pid)
        late = 0
        with python_processes("while True: pass", count=2 * (os.cpu_count() or 1)):
            deadline = time.monotonic() + 4
            while time.monotonic() < deadline:
                now = time.monotonic_ns()
                late += any(now - bench.arena.heartbeat(i) > 0.05e9 for i in range(2))
                assert diagnosis.frozen_worker() is None
                time.sleep(0.02)
    # the hogs did hold the workers off their CPUs, or the test proved nothing
    assert late > 0
