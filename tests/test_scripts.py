"""Training scripts written for hydrax 0.2.2, run as real scripts (issue 11).

Each test runs a script from ``tests/scripts`` in a fresh interpreter, with the working tree's
hydrax first on ``PYTHONPATH``. Most make JAX live before their Dataloader, so that the workers
start from the fork server, the path these defects were on.
"""

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from support.proctable import live_processes
from support.timing import slack

SCRIPTS = Path(__file__).parent / "scripts"
ROOT = Path(__file__).parent.parent


def environment(**extra) -> dict:
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env.pop("HYDRAX_START_METHOD", None)
    env.update(extra)
    return env


def run_script(name, *args, timeout=60, cwd=None, **env):
    return subprocess.run([sys.executable, str(SCRIPTS / name), *args], capture_output=True, text=True,
                          timeout=slack(timeout), cwd=cwd, env=environment(**env))


def last_json(result) -> dict:
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


# -- defect 1: helper processes never run the main module ---------------------------------------
@pytest.mark.slow
def test_a_script_that_reads_its_command_line_at_the_top_runs_once(tmp_path):
    trace = tmp_path / "trace"
    result = run_script("argv_script.py", "7", "--offset", "3", cwd=tmp_path, HYDRAX_TEST_TRACE=str(trace))
    out = last_json(result)
    assert out["method"] == "forkserver"
    assert out["values"] == [7 * i + 3 for i in range(8)]  # N and the parsed --offset, not defaults
    assert out["imported"] == [1000 + i for i in range(8)]  # a loader in an imported module works too
    assert out["argv"] == ["7", "--offset", "3"] and out["cwd"] == str(tmp_path)  # as spawn prepares a child
    assert len(trace.read_text().split()) == 1, "the main module's top level ran in a helper process"
    assert "could not import the main module" not in result.stderr


@pytest.mark.multiprocess
def test_module_level_jax_distributed_initialize_runs_once_per_process(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [
        subprocess.Popen([sys.executable, str(SCRIPTS / "distributed_script.py"), f"127.0.0.1:{port}", str(p)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment(), cwd=tmp_path)
        for p in range(2)
    ]
    outputs = []
    try:
        for proc in procs:
            stdout, stderr = proc.communicate(timeout=slack(90))
            assert proc.returncode == 0, stderr[-4000:]
            outputs.append(json.loads(stdout.strip().splitlines()[-1]))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert [o["method"] for o in outputs] == ["forkserver", "forkserver"]
    assert [o["process"] for o in outputs] == [0, 1]
    merged = [a + b for a, b in zip(outputs[0]["values"], outputs[1]["values"])]
    assert merged == [[4 * k + i for i in range(4)] for k in range(4)]


def test_a_script_without_a_main_guard_runs_from_the_fork_server():
    out = last_json(run_script("unguarded_script.py"))
    assert out == {"method": "forkserver", "values": [2 * i for i in range(8)]}


@pytest.mark.slow
def test_the_scripts_own_forkserver_processes_still_get_the_main_module():
    # hydrax's fork server never runs the main module for its workers, but a process of the
    # script's own that needs a function of it gets it imported as spawn would, command line included.
    out = last_json(run_script("methods_script.py", "pool"))
    assert out["method"] == "forkserver" and out["values"] == list(range(8))
    assert out["pool"] == [["pool", 4], ["pool", 9]]


# -- defect 2: lambdas and closures, in every run of a process --------------------------------------
@pytest.mark.slow
def test_lambda_and_closure_loaders_work_in_every_run_of_a_script():
    out = last_json(run_script("two_loaders.py"))
    (m1, v1), (m2, v2), (m3, v3) = out["runs"]
    assert v1 == [i + 1 for i in range(8)] and v2 == [i + 2 for i in range(8)] and v3 == [3 * i for i in range(8)]
    assert m1 == "fork" and m2 == m3 == "forkserver"  # the first run made JAX live


# -- defect 3: nothing outlives a killed main process ----------------------------------------------
def session_processes(session: int) -> list[int]:
    """Live (not zombie) processes of ``session``, from /proc."""
    return sorted(pid for pid, fields in live_processes().items() if int(fields[3]) == session)


def lines_of(stream) -> queue.Queue:
    """The lines of ``stream`` as they come, read on a thread (a reader never blocks the test)."""
    lines: queue.Queue = queue.Queue()

    def read():
        for line in stream:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    return lines


@pytest.mark.slow
@pytest.mark.parametrize("method", ["forkserver", "fork"])
@pytest.mark.parametrize("sig", ["SIGKILL", "SIGTERM"])
def test_nothing_outlives_a_killed_main_process_while_workers_are_busy(tmp_path, method, sig):
    process = subprocess.Popen([sys.executable, str(SCRIPTS / "busy_script.py"), method], stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True, env=environment(HYDRAX_TEST_DIR=str(tmp_path)),
                               start_new_session=True)
    session = process.pid
    try:
        lines = lines_of(process.stdout)
        line = lines.get(timeout=slack(60))
        assert line == f"METHOD {method}\n", line
        deadline = time.monotonic() + slack(30)
        while len(os.listdir(tmp_path)) < 2:  # both workers inside a long item
            assert time.monotonic() < deadline and process.poll() is None, "the workers never got busy"
            time.sleep(0.02)
        busy = {int(name) for name in os.listdir(tmp_path)}
        before = session_processes(session)
        assert busy <= set(before) and len(before) >= (5 if method == "forkserver" else 3)  # + server and tracker
        os.kill(process.pid, getattr(signal, sig))
        process.wait(timeout=slack(10))
        deadline = time.monotonic() + slack(5)  # the kernel kills them with their parent: at once
        while session_processes(session) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert session_processes(session) == [], f"left running after {sig} of the main process"
    finally:
        for pid in session_processes(session):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if process.poll() is None:
            process.kill()
            process.wait()


# -- defect 4: what cannot be sent, and what a worker cannot start with ---------------------------
@pytest.mark.slow
@pytest.mark.parametrize("method", ["fork", "forkserver"])
def test_unpicklable_extras_fail_their_item_with_the_key_named(method):
    result = run_script("extras_script.py", "plain", method)
    out = last_json(result)
    assert out["method"] == method and out["error"] is None
    # the batch of item 5 is dropped, as any batch with a failed item is; the run goes on
    assert out["delivered"] == [[0, 1, 2, 3], [8, 9, 10, 11], [12, 13, 14, 15]]
    assert "exited with status" not in result.stdout + result.stderr
    assert "item 5" in result.stderr and "'handle'" in result.stderr and "lock" in result.stderr


@pytest.mark.slow
def test_unpicklable_extras_fail_a_strict_run_at_their_batch_with_the_key_named():
    out = last_json(run_script("extras_script.py", "strict", "forkserver"))
    assert out["delivered"] == [[0, 1]]
    assert "batch 1 (epoch 0) could not be loaded" in out["error"]
    assert "item 5" in out["error"] and "'handle'" in out["error"] and "cannot be pickled" in out["error"]


@pytest.mark.slow
def test_a_bound_method_of_a_class_defined_under_the_main_guard_loads():
    out = last_json(run_script("methods_script.py", "bound"))
    assert out == {"method": "forkserver", "values": [5 * i for i in range(8)]}


@pytest.mark.slow
def test_startup_func_and_loader_of_the_script_share_their_globals_in_each_worker():
    out = last_json(run_script("methods_script.py", "state"))
    assert out == {"method": "forkserver", "values": [100 + i for i in range(8)]}


@pytest.mark.slow
def test_a_loader_a_worker_cannot_import_is_reported_with_its_cause(tmp_path):
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    result = run_script("methods_script.py", "hidden", HYDRAX_TEST_DIR=str(hidden))
    error = last_json(result)["error"]
    assert "during start-up" in error and "No module named 'hidden_loaders'" in error
    assert "importable" in error  # what to do
    assert "__main__" not in error  # the main guard has nothing to do with it


@pytest.mark.slow
def test_a_failing_startup_func_is_reported_with_its_error():
    out = last_json(run_script("methods_script.py", "startup"))
    error, fields = out["error"], out["fields"]
    assert "startup_func" in error and "RuntimeError: the start-up hook cannot find its model" in error
    assert "__main__" not in error
    # the worker's own traceback, as a field too
    assert fields["traceback"].startswith("Traceback (most recent call last):")
    assert "in failing_startup" in fields["traceback"]
    assert fields["traceback"].rstrip().endswith("RuntimeError: the start-up hook cannot find its model")
    assert fields["process_name"].startswith("hydrax-loader-") and isinstance(fields["pid"], int)
    assert fields["exitcode"] in (None, 1) and fields["signal"] is None  # sys.exit(1), if it is over yet
    assert fields["item"] is None and fields["batch"] is None  # it never loaded anything


@pytest.mark.slow
def test_a_loader_that_cannot_be_pickled_is_refused_naming_the_culprit():
    error = last_json(run_script("methods_script.py", "lock"))["type_error"]
    assert error.startswith("cannot send loader_func's closure variable 'guard' to the loader processes")
    assert "_thread.lock" in error and "startup_func" in error  # what to do
