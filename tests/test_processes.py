"""How workers start and stay tied to the main process: start method, fork hazards, liveness."""

import multiprocessing as mp
import os
import subprocess
import sys
import textwrap

import pytest

from hydrax.processes import is_worker, process_alive, start_method


def child_is_worker(queue):
    queue.put(is_worker())


def run_python(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120,
                          env={k: v for k, v in os.environ.items() if k != "HYDRAX_START_METHOD"})
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.slow
def test_fork_while_no_jax_backend_or_other_hazard_is_live_then_the_fork_server():
    out = run_python("""
        from hydrax.processes import note_fork_hazard, start_method
        import jax
        first = start_method()
        note_fork_hazard("obstore's request threads")
        print(first, start_method())
    """)
    assert out == "fork forkserver"
    assert run_python("""
        import jax, jax.numpy as jnp
        from hydrax.processes import start_method
        jnp.zeros(1).block_until_ready()
        print(start_method())
    """) == "forkserver"


def test_the_environment_forces_a_method_and_refuses_others(monkeypatch):
    monkeypatch.setenv("HYDRAX_START_METHOD", "forkserver")
    assert start_method() == "forkserver"
    monkeypatch.setenv("HYDRAX_START_METHOD", "spawn")
    with pytest.raises(ValueError, match="HYDRAX_START_METHOD must be 'fork' or 'forkserver', got 'spawn'"):
        start_method()


def test_is_worker_is_true_only_in_a_child():
    assert not is_worker()
    context = mp.get_context("spawn")  # JAX may be live in this process: no plain fork
    queue = context.Queue()
    child = context.Process(target=child_is_worker, args=(queue,))
    child.start()
    try:
        assert queue.get(timeout=30) is True
    finally:
        child.join(30)
        queue.close()
        queue.join_thread()


def test_a_dead_process_is_not_alive_and_a_live_one_is():
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True)
    assert process_alive(os.getpid()) and process_alive(1)  # pid 1: another user's counts as alive
    assert not process_alive(int(done.stdout))
