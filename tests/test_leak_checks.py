"""The suite's own leak checks (conftest.py) count only what the test run itself created."""

import os
import subprocess
import sys
import time
from multiprocessing import shared_memory

from support.shmwatch import SHM, ShmWatch, descendants
from support.workbench import wait_until

# A job that is not ours: its process is re-parented away from pytest (the shell that started it
# exits at once), writes a file in /dev/shm, closes it and keeps running without holding it.
_OTHER_JOB = """
import os, sys, time
name = sys.argv[1]
with open(os.path.join("/dev/shm", name), "wb") as f:
    f.write(b"x")
time.sleep(30)
"""


def test_an_entry_another_job_creates_is_not_ours_and_one_we_create_is():
    watch = ShmWatch()
    name = f"other-job-{os.getpid()}-{time.monotonic_ns()}"
    subprocess.run(["sh", "-c", f'"{sys.executable}" -c \'{_OTHER_JOB}\' {name} >/dev/null 2>&1 &'], check=True)
    mine = shared_memory.SharedMemory(create=True, size=4096)
    try:
        wait_until(lambda: os.path.exists(f"{SHM}/{name}"))
        other = next(pid for pid in _pids_with_arg(name))
        assert other not in descendants()  # not a process of this test run
        # Seen by the watch while we hold it (its thread checks holders when it reads the event,
        # which on a busy machine may come after a close); then no longer held by us: only the
        # watch can tell it is ours.
        wait_until(lambda: mine.name in watch.ours)
        mine.close()
        assert watch.created_by_us({name, mine.name}) == {mine.name}
    finally:
        watch.close()
        mine.unlink()
        for pid in _pids_with_arg(name):
            os.kill(pid, 9)
        os.unlink(f"{SHM}/{name}")


def _pids_with_arg(arg: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if arg.encode() in f.read().split(b"\0"):
                        found.append(int(entry))
            except OSError:
                continue
    return found
