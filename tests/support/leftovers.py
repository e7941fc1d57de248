"""What a test leaves behind: its processes still running and its entries in /dev/shm (for the
leak checks of tests/conftest.py, and of test modules that must except something, such as Ray's
idle workers)."""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from pathlib import Path
from typing import Callable

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


def snapshot() -> tuple[set[str], set[int]]:
    """What is there before a test: /dev/shm's entries and this run's processes."""
    return set(os.listdir(SHM)), stray_processes()


def describe(pids: set[int]) -> list[str]:
    """Each process as its pid and the start of its command line."""
    out = []
    for pid in sorted(pids):
        try:
            out.append(f"{pid} {Path(f'/proc/{pid}/cmdline').read_bytes().replace(bytes(1), b' ')[:80].decode(errors='replace')}")
        except OSError:
            out.append(f"{pid} (gone)")
    return out


def assert_nothing_left(before: tuple[set[str], set[int]], grace: float,
                        expected: Callable[[set[int]], set[int]] = lambda pids: set()) -> None:
    """After a test: none of its processes still running (after up to ``grace`` seconds for them
    to exit) except those ``expected(pids)`` picks, no multiprocessing children, and none of its
    entries left in /dev/shm."""
    shm_before, strays_before = before

    def left() -> set[int]:
        pids = stray_processes() - strays_before
        return pids - expected(pids)

    deadline = time.monotonic() + grace
    # The listing that ends the wait is the one judged: a leak is in every listing, while one
    # taken again could catch a helper that was only starting (Ray replaces its idle workers).
    remaining = left()
    while (remaining or mp.active_children()) and time.monotonic() < deadline:
        time.sleep(0.05)
        remaining = left()
    assert not mp.active_children(), "a test left multiprocessing children running"
    assert remaining == set(), f"a test left processes running: {describe(remaining)}"
    assert new_shm_entries(shm_before) == set(), "a test left files in /dev/shm"
