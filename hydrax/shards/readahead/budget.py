"""The read-ahead's budget: the most bytes it holds at once, and how it is chosen.

``ReadAhead(max_bytes=...)`` when given; else :func:`choose_budget` sizes it for the run: the
remote data itself when the host can hold it (an epoch is then read once, and later epochs
read nothing), else a share of the host's available memory (or, for a persistent ``cache_dir``,
of its disk), as :func:`host_room` measures them. :class:`Budget` keeps the choice and where it
came from, for ``ShardSet.readahead_budget`` and ``hydrax bench``. Pure functions but for
:func:`host_room`, so the choice is tested without a host of each size.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

#: The least budget :func:`choose_budget` picks: a few chunks for each stream.
MIN_BUDGET = 64 << 20
#: The share of the host's available memory a self-sized budget may take (the workers, the
#: trainer and the page cache need the rest).
MEMORY_SHARE = 0.25
#: The share of free disk space it may take (of a persistent ``cache_dir``, or of a small
#: temporary file system).
DISK_SHARE = 0.5


@dataclass(frozen=True)
class Budget:
    """The read-ahead budget of a ShardSet, and where it came from.

    :param bytes: the most bytes held read ahead at once.
    :param data_bytes: the bytes of the set's remote shards (all that could ever be worth holding).
    :param cap: the most the host allowed (None when ``max_bytes`` was given).
    :param source: ``"given"`` (``ReadAhead(max_bytes=...)``), ``"data"`` (the data fits: every
        byte is read once), ``"memory"`` or ``"disk"`` (the host's share was the limit).
    """

    bytes: int
    data_bytes: int
    cap: int | None
    source: str

    @property
    def holds_data(self) -> bool:
        """Whether the budget holds every remote byte of the set (a whole epoch read ahead)."""
        return self.bytes >= self.data_bytes

    def describe(self) -> str:
        """The budget in words, for a log line or ``hydrax bench``."""
        gb = lambda n: f"{n / 1e9:,.2f} GB"  # noqa: E731
        why = {"given": "given as ReadAhead(max_bytes=...)", "data": f"the data's {gb(self.data_bytes)} and room to spare",
               "memory": f"{MEMORY_SHARE:.0%} of available memory", "disk": f"{DISK_SHARE:.0%} of free disk space"}[self.source]
        held = "holds all" if self.holds_data else f"holds {self.bytes / max(1, self.data_bytes):.0%}"
        return f"read-ahead budget {gb(self.bytes)} ({why}; {held} of the remote data)"


def data_budget(data_bytes: int) -> int:
    """The budget that holds ``data_bytes`` of remote data whole: the data, an eighth more for
    samples read singly before their chunks, and :data:`MIN_BUDGET`."""
    return data_bytes + data_bytes // 8 + MIN_BUDGET


def choose_budget(max_bytes: int | None, data_bytes: int, available_memory: int, free_disk: int, persistent: bool) -> Budget:
    """The read-ahead budget for ``data_bytes`` of remote shards on a host with ``available_memory``
    bytes free and ``free_disk`` bytes free where the files go (a pure function).

    ``max_bytes``, when given, is the budget. Otherwise the data itself, with an eighth more for
    samples read singly before their shard's stream (and :data:`MIN_BUDGET`), when the host can
    hold it: :data:`MEMORY_SHARE` of its available memory for a private folder, :data:`DISK_SHARE`
    of the free space of a persistent ``cache_dir`` (or of a temporary file system smaller than
    that); else that share. Never less than :data:`MIN_BUDGET`.
    """
    if max_bytes is not None:
        return Budget(int(max_bytes), data_bytes, None, "given")
    cap, source = int(DISK_SHARE * free_disk), "disk"
    if not persistent and int(MEMORY_SHARE * available_memory) <= cap:
        cap, source = int(MEMORY_SHARE * available_memory), "memory"
    cap = max(MIN_BUDGET, cap)
    wanted = data_budget(data_bytes)
    if wanted <= cap:
        return Budget(wanted, data_bytes, cap, "data")
    return Budget(cap, data_bytes, cap, source)


def _cgroup_room() -> int | None:
    """What the memory limit of this process's cgroup leaves, where one is set (a container)."""
    for limit_path, used_path in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                  ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            with open(limit_path) as f:
                limit = f.read().strip()
            with open(used_path) as f:
                used = int(f.read().strip())
        except (OSError, ValueError):
            continue
        if limit.isdigit() and int(limit) < 1 << 60:  # "max", or v1's "no limit", is no limit
            return max(0, int(limit) - used)
    return None


def host_room(folder: str) -> tuple[int, int]:
    """``(available memory, free disk space in folder)`` in bytes, as :func:`choose_budget` takes
    them: the kernel's ``MemAvailable``, or less under a cgroup memory limit."""
    available = 0
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        pass
    if not available:
        available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    room = _cgroup_room()
    if room is not None:
        available = min(available, room)
    try:
        stat = os.statvfs(folder)
        free = stat.f_bavail * stat.f_frsize
    except OSError:
        free = available
    return available, free
