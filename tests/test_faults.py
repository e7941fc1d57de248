"""Faults, in real subprocesses: dead and frozen workers, Ctrl+C, a killed parent, start methods."""

import json
import os
import queue
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from support.timing import slack

HEADER = """
import json, os, signal, sys, threading, time
import multiprocessing as mp
import numpy as np
import jax, jax.numpy as jnp
from hydrax import Dataloader, DataGroup, WorkerError

def say(*args):
    print(*args, flush=True)

def group(n=400, bs=4):
    return DataGroup(bs, range(n), loader_arrays={"x": ((), np.int32, jnp.int32)}, shuffle_later="repeat")

def worker_pids():
    return sorted(p.pid for p in mp.active_children() if p.name.startswith("hydrax-loader"))
"""


def script(tmp_path, body: str, name="script.py"):
    path = tmp_path / name
    path.write_text(HEADER + textwrap.dedent(body))
    return path


def run_script(path, timeout=60, **kwargs):
    return subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=slack(timeout), **kwargs)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_gone(pids, seconds=3.0):
    deadline = time.monotonic() + slack(seconds)
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.02)
    return [p for p in pids if alive(p)]


def lines_into(stream, lines: queue.Queue) -> None:
    """Put each line of ``stream`` into ``lines``, then None at its end."""
    for line in stream:
        lines.put(line)
    lines.put(None)


def read_until(process, prefix: str, timeout=30.0) -> str:
    deadline = time.monotonic() + slack(timeout)
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if line.startswith(prefix):
            return line
        if not line and process.poll() is not None:
            break
    raise AssertionError(f"no {prefix!r} line; stderr:\n{process.stderr.read()}")


# the fast tier keeps killed-fork; a frozen worker takes its heartbeat timeout to be noticed
@pytest.mark.parametrize("warm_jax", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["fork", "forkserver"])
@pytest.mark.parametrize(
    "sig, worker, says, within",
    [("SIGKILL", 0, "was killed by SIGKILL while loading item", 1.0),
     pytest.param("SIGSTOP", 1, "stopped responding", 1.25, marks=pytest.mark.slow)],
    ids=["killed", "frozen"],
)
def test_a_dead_or_frozen_worker_is_named_with_its_item(tmp_path, warm_jax, sig, worker, says, within):
    # A frozen worker's heartbeat stops; a dead one's process sentinel fires.
    path = script(tmp_path, f"""
    def load(item, arrays, seed):
        time.sleep(0.2 if item >= 40 else 0.001)
        arrays["x"][...] = item

    if __name__ == "__main__":
        if {warm_jax}:
            jnp.ones(1).block_until_ready()
        with Dataloader(load, group(), loader_count=2, end_at=("epoch", 1)) as dl:
            say("METHOD", dl.start_method)
            try:
                for i, batch in enumerate(dl):
                    if i == 10:
                        time.sleep(0.3)
                        pids = worker_pids()
                        say("PIDS", json.dumps(pids))
                        os.kill(pids[{worker}], signal.{sig})
                        hit = time.monotonic()
                    del batch
            except WorkerError as exc:
                say("ERROR", round(time.monotonic() - hit, 3), exc)
                say("FIELDS", json.dumps({{name: getattr(exc, name) for name in
                    ("process_name", "pid", "exitcode", "signal", "item", "batch", "traceback")}}))
                assert isinstance(exc, KeyboardInterrupt)
    """)
    result = run_script(path)
    assert result.returncode == 0, result.stderr
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines())
    assert lines["METHOD"] == ("forkserver" if warm_jax else "fork")
    elapsed, message = lines["ERROR"].split(" ", 1)
    assert float(elapsed) < slack(within), message
    assert f"loader process hydrax-loader-{worker}" in message and says in message
    fields = json.loads(lines["FIELDS"])
    assert fields["process_name"] == f"hydrax-loader-{worker}" and fields["pid"] == json.loads(lines["PIDS"])[worker]
    assert fields["traceback"] is None  # it died without a word
    if sig == "SIGKILL":
        assert "of training group 0" in message
        assert (fields["exitcode"], fields["signal"]) == (-signal.SIGKILL, "SIGKILL")
        # items from 40 on take 0.2 s: the worker died in the middle of one, and the fields say which
        assert int(fields["item"]) >= 40 and f"({fields['item']}) of training group 0" in message
        assert fields["batch"].startswith("batch ") and fields["batch"].endswith(" (epoch 0)") and fields["batch"] in message
    else:  # frozen, not dead: no exit status yet
        assert (fields["exitcode"], fields["signal"]) == (None, None)
        assert fields["item"] is None or f"({fields['item']})" in message
    # diagnostics go to stderr (the "hydrax" logger; Python's last resort shows them), never stdout
    assert "[hydrax] loader process exited, aborting: loader process hydrax-loader" in result.stderr
    assert "[hydrax]" not in result.stdout
    assert "[hydrax]: dataloader failed" in result.stderr
    assert wait_gone(json.loads(lines["PIDS"])) == []


SIGINT_SCRIPT = """
def load(item, arrays, seed):
    arrays["x"][...] = item

if __name__ == "__main__":
    status = "none"
    try:
        with Dataloader(load, group(), loader_count=2) as dl:
            for batch in dl:
                if batch.batch_num == 2:
                    say("PIDS", json.dumps(worker_pids()))
                    say("READY")
                time.sleep(STEP_SECONDS)  # a training step
                del batch
            status = f"ended interrupted={dl.interrupted}"
    except KeyboardInterrupt:
        status = "KeyboardInterrupt"
    say("STATUS", status)
"""


@pytest.mark.parametrize("presses", [1, pytest.param(2, marks=pytest.mark.slow), pytest.param(3, marks=pytest.mark.slow)])
def test_ctrl_c_interrupts_then_aborts_then_terminates(tmp_path, presses):
    # Each press waits for the script to say it saw the last one: two signals sent before it runs
    # its handler are one (a pause of 0.1 s between them was too short on a busy machine). The
    # presses must all land within one training step, which is longer there.
    path = script(tmp_path, SIGINT_SCRIPT.replace("STEP_SECONDS", f"{slack(0.3):.2f}"))
    process = subprocess.Popen([sys.executable, str(path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    said: queue.Queue = queue.Queue()
    try:
        pids = json.loads(read_until(process, "PIDS").split(" ", 1)[1])
        read_until(process, "READY")
        reader = threading.Thread(target=lines_into, args=(process.stderr, said), daemon=True)
        reader.start()
        err = ""
        for press in range(presses):
            os.killpg(process.pid, signal.SIGINT)  # the whole group, as a terminal does
            while press < presses - 1:
                line = said.get(timeout=slack(30))
                assert line is not None, err
                err += line
                if "[hydrax] KeyboardInterrupt: " in line:
                    break
        process.wait(timeout=slack(30))
        out = process.stdout.read()
        reader.join(slack(30))
        err += "".join(iter(said.get_nowait, None))
    finally:
        if process.poll() is None:
            process.kill()
    if presses == 1:
        assert process.returncode == 0, err
        assert "STATUS ended interrupted=True" in out
        assert "[hydrax] KeyboardInterrupt: interrupting, repeat to abort" in err
    elif presses == 2:
        assert "STATUS KeyboardInterrupt" in out
        assert "[hydrax] KeyboardInterrupt: aborting, repeat to terminate" in err
    else:
        assert process.returncode == 1 and "STATUS" not in out
        assert "[hydrax] KeyboardInterrupt: terminating" in err
    assert wait_gone(pids) == []


@pytest.mark.parametrize("warm_jax", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["fork", "forkserver"])
def test_workers_die_with_a_sigkilled_parent(tmp_path, warm_jax):
    path = script(tmp_path, f"""
    def load(item, arrays, seed):
        time.sleep(0.005)
        arrays["x"][...] = item

    if __name__ == "__main__":
        if {warm_jax}:
            jnp.ones(1).block_until_ready()
        with Dataloader(load, group(), loader_count=2) as dl:
            for batch in dl:
                if batch.batch_num == 3:
                    say("PIDS", json.dumps(worker_pids()))
                time.sleep(0.05)
                del batch
    """)
    process = subprocess.Popen([sys.executable, str(path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pids = json.loads(read_until(process, "PIDS").split(" ", 1)[1])
    assert len(pids) == 2 and all(alive(p) for p in pids)
    process.kill()
    process.wait()
    assert wait_gone(pids) == []


@pytest.mark.slow
def test_fork_path_reports_loader_errors_and_dangling_references(tmp_path):
    path = script(tmp_path, """
    KEPT = []

    def load(item, arrays, seed):
        if item == 5:
            raise ValueError("bad item five")
        if item == 9:
            KEPT.append(arrays["x"])
        arrays["x"][...] = item

    if __name__ == "__main__":
        with Dataloader(load, group(16), loader_count=2, end_at=("epoch", 1)) as dl:
            say("METHOD", dl.start_method)
            say("BATCHES", [b.batch_num for b in dl])
    """)
    result = run_script(path)
    assert result.returncode == 0, result.stderr
    assert "METHOD fork" in result.stdout and "BATCHES [0, 2, 3]" in result.stdout
    assert "[hydrax] exception while loading data item: 5" in result.stderr
    assert "ValueError: bad item five" in result.stderr
    assert "RuntimeWarning: loader memory has dangling reference" in result.stderr
    assert result.stderr.count("RuntimeWarning: loader memory has dangling reference") == 1  # not for the item that raised


@pytest.mark.slow
def test_forkserver_runs_a_loader_defined_in_main_and_explains_unpicklable_ones(tmp_path):
    path = script(tmp_path, """
    def load(item, arrays, seed):
        arrays["x"][...] = item * 2

    if __name__ == "__main__":
        jnp.ones(1).block_until_ready()  # a live JAX backend: fork is no longer safe
        started = time.monotonic()
        with Dataloader(load, group(16), loader_count=2, end_at=("epoch", 1)) as dl:
            say("METHOD", dl.start_method)
            say("ITEMS", [int(v) for b in dl for v in b.arrays["x"]])
        guard = threading.Lock()  # a global of the script that cannot travel to another process

        def locked(item, arrays, seed):
            with guard:
                arrays["x"][...] = item

        try:
            Dataloader(locked, group(16), end_at=("epoch", 1)).__enter__()
        except TypeError as exc:
            say("CLOSURE", exc)
    """)
    result = run_script(path)
    assert result.returncode == 0, result.stderr
    assert "METHOD forkserver" in result.stdout
    assert "ITEMS " + str([2 * i for i in range(16)]) in result.stdout
    assert "CLOSURE cannot send loader_func's global 'guard'" in result.stdout and "startup_func" in result.stdout, result.stdout


@pytest.mark.slow
def test_nothing_is_left_in_dev_shm_or_the_process_table_after_any_ending(tmp_path):
    path = script(tmp_path, """
    def load(item, arrays, seed):
        arrays["x"][...] = item

    if __name__ == "__main__":
        jnp.ones(1).block_until_ready()
        pids = []
        for ending in ("natural", "break", "exception"):
            try:
                with Dataloader(load, group(64), loader_count=2, end_at=("epoch", 2)) as dl:
                    for batch in dl:
                        pids += worker_pids()
                        if ending == "break":
                            break
                        if ending == "exception":
                            raise RuntimeError("user error")
            except RuntimeError:
                pass
        say("PIDS", json.dumps(sorted(set(pids))))
        say("SHM", json.dumps(sorted(os.listdir("/dev/shm"))))
        say("PID", os.getpid())
    """)
    result = run_script(path)
    assert result.returncode == 0, result.stderr
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines())
    # other xdist workers' remote ShardSets keep read-ahead folders named for their own pids
    others = re.compile(rf"hydrax-readahead-(?!{lines['PID']}-)\d+-")
    assert not [name for name in json.loads(lines["SHM"]) if "hydrax" in name and not others.match(name)]
    assert wait_gone(json.loads(lines["PIDS"])) == []
    assert "resource_tracker" not in result.stderr  # no leaked-segment warnings at exit


@pytest.mark.slow
def test_two_loaders_open_at_once(tmp_path):
    # The second starts while the first one's pipeline thread runs (and JAX is live): no fork then.
    path = script(tmp_path, """
    def load(item, arrays, seed):
        arrays["x"][...] = item

    if __name__ == "__main__":
        with Dataloader(load, group(16), loader_count=2, end_at=("epoch", 1)) as train:
            with Dataloader(load, group(8), loader_count=1, end_at=("epoch", 2)) as valid:
                say("METHODS", train.start_method, valid.start_method)
                say("COUNTS", len(list(train)), len(list(valid)))
    """)
    result = run_script(path)
    assert result.returncode == 0, result.stderr
    assert "METHODS fork forkserver" in result.stdout and "COUNTS 4 4" in result.stdout


@pytest.mark.slow
def test_the_fork_server_starts_when_jax_does(tmp_path):
    from jax._src import xla_bridge

    if not hasattr(xla_bridge, "register_backend_initialization_hook") and not hasattr(xla_bridge, "_init_backend"):
        pytest.skip("this jax has no way to hear of backend initialisation")
    path = script(tmp_path, """
    from multiprocessing import forkserver

    def load(item, arrays, seed):
        arrays["x"][...] = item

    if __name__ == "__main__":
        say("BEFORE", forkserver._forkserver._forkserver_pid is not None)
        jnp.ones(1).block_until_ready()
        say("AFTER", forkserver._forkserver._forkserver_pid is not None)
        server = forkserver._forkserver._forkserver_pid
        time.sleep(3.0)  # the rest of a training script's set-up
        with Dataloader(load, group(64), loader_count=2, end_at=("epoch", 1)) as dl:
            next(dl)
            say("FIRST", dl.start_method, forkserver._forkserver._forkserver_pid == server)
    """)
    result = run_script(path)
    assert result.returncode == 0, result.stderr
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines())
    assert lines["BEFORE"] == "False" and lines["AFTER"] == "True"
    # The loader's workers come from the server JAX's start started, not from one started (and
    # importing) at the loader's first batch. (How long that first batch takes is a benchmark's
    # business: on a busy machine any bound on it fails.)
    assert lines["FIRST"].split() == ["forkserver", "True"]
