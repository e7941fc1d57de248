"""hydrax.procs.liveness: whether a process named in a file lives."""

import os
import subprocess
import sys

from hydrax.procs.liveness import process_alive


def test_a_dead_process_is_not_alive_and_a_live_one_is():
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True)
    assert process_alive(os.getpid()) and process_alive(1)  # pid 1: another user's counts as alive
    assert not process_alive(int(done.stdout))
