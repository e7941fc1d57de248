"""Which /dev/shm names this test run created, told apart from other jobs' (for the leak checks).

Other programs on a shared machine create and remove /dev/shm entries at any time, and an entry
that nobody holds open when a test ends says nothing of who made it. So a thread watches
/dev/shm with inotify and, as each entry appears, looks at once whether a process of this test
run (pytest and its descendants) has it open or mapped: POSIX semaphores and shared memory are
held by their creator from the moment they exist. Entries first seen held by other processes are
theirs; only ours can be leaks of ours.
"""

from __future__ import annotations

import ctypes
import os
import select
import struct
import threading

from .proctable import live_processes

SHM = "/dev/shm"
_IN_NONBLOCK = os.O_NONBLOCK
_IN_CLOEXEC = os.O_CLOEXEC
_IN_CREATE = 0x100
_IN_MOVED_TO = 0x80
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len; then len bytes of name


def descendants(root: int | None = None) -> set[int]:
    """Pids of every live process below ``root`` (default: this one), from /proc."""
    root = os.getpid() if root is None else root
    parents = {pid: int(fields[1]) for pid, fields in live_processes().items()}
    found, frontier = set(), {root}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def holders(names: set[str], pids) -> set[str]:
    """The entries among ``names`` that any of ``pids`` has open or mapped."""
    held = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps") as f:
                # a mapping's line ends with its path (and " (deleted)" once it is unlinked)
                fields = [line.rstrip("\n").split(None, 5) for line in f]
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue  # gone meanwhile, or not ours to read
        opened = {f[5].removesuffix(" (deleted)") for f in fields if len(f) == 6}
        for fd in fds:
            try:
                opened.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
            except OSError:
                continue  # closed meanwhile (the listing's own descriptor, for one)
        held |= {n for n in names if f"{SHM}/{n}" in opened}
    return held


class ShmWatch:
    """Names created in /dev/shm while this watch runs that this process tree held at creation."""

    def __init__(self) -> None:
        self.ours: set[str] = set()
        self._lock = threading.Lock()
        libc = ctypes.CDLL(None, use_errno=True)
        self._fd = libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if self._fd < 0 or libc.inotify_add_watch(self._fd, SHM.encode(), _IN_CREATE | _IN_MOVED_TO) < 0:
            raise OSError(ctypes.get_errno(), f"cannot watch {SHM} with inotify")
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="shm-watch", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop watching (the session's watch runs until the process ends)."""
        self._stopped.set()
        self._thread.join()
        os.close(self._fd)

    def created_by_us(self, names: set[str]) -> set[str]:
        """The entries among ``names`` that this process tree created (or holds now)."""
        with self._lock:
            seen = names & self.ours
        return seen | holders(names - seen, descendants() | {os.getpid()})

    def _watch(self) -> None:
        while not self._stopped.is_set():
            if not select.select([self._fd], [], [], 0.2)[0]:
                continue
            try:
                data = os.read(self._fd, 65536)
            except BlockingIOError:
                continue
            names, at = set(), 0
            while at + _EVENT.size <= len(data):
                _wd, _mask, _cookie, length = _EVENT.unpack_from(data, at)
                names.add(data[at + _EVENT.size: at + _EVENT.size + length].rstrip(b"\0").decode(errors="replace"))
                at += _EVENT.size + length
            ours = holders(names, descendants() | {os.getpid()})
            with self._lock:
                self.ours |= ours
