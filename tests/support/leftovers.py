"""What a test leaves behind: its processes still running and its entries in /dev/shm (for the
leak checks of tests/conftest.py, and of test modules that must except something, such as Ray's
idle workers)."""

from __future__ import annotations

import os

from support.shmwatch import SHM, ShmWatch, descendants


def multiprocessing_servers() -> set[int]:
    """The long-lived helpers multiprocessing keeps for the whole process (not leaks)."""
    from multiprocessing import forkserver, resource_tracker

    pids = {getattr(forkserver._forkserver, "_forkserver_pid", None), getattr(resource_tracker._resource_tracker, "_pid", None)}
    return {p for p in pids if p}


def stray_processes() -> set[int]:
    """This test run's processes (pytest's descendants) other than multiprocessing's servers:
    other jobs' processes are never counted."""
    servers = multiprocessing_servers()
    return {p for p in descendants() if p not in servers}


_SHM_WATCH = ShmWatch()


def new_shm_entries(before: set[str]) -> set[str]:
    """Entries of /dev/shm that this test run created since ``before`` and that still exist."""
    new = set(os.listdir(SHM)) - before
    return _SHM_WATCH.created_by_us(new) if new else new
