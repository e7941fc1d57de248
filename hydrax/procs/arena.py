"""The shared-memory arena: one anonymous mapping per run, holding every batch slot.

The arena is a memfd (no name in /dev/shm, so nothing can be left behind however a run ends)
mapped by the main process and by every worker. It holds a small status page (one 64-byte line
per worker: heartbeat and the item being loaded), then each slot's item list (the indices of the
items of the batch being loaded into it, written by the main process before it hands out the
batch's tasks, so that the workers read their items instead of computing the order again),
then ``depth`` page-aligned batch slots.
A slot goes back to the free pool exactly when the last buffer export made from it is released
(see :class:`hydrax._core.SlotLease`), on whatever thread that happens.
"""

from __future__ import annotations

import os
from collections import deque
from typing import Callable, Sequence

import numpy as np

from .. import _core

PAGE = 4096
#: Bytes of status per worker: heartbeat ns, stop flag, task id, position, item start ns.
STATUS_STRIDE = 64
HEARTBEAT_WORD = 0
STOP_WORD = 8
ITEM_WORDS = 16  # task, position, start ns (see _core.mark_item)


def status_line(worker: int) -> int:
    """Byte offset of worker ``worker``'s status line (the status page opens the arena)."""
    return worker * STATUS_STRIDE


def _round_page(n: int) -> int:
    return -(-n // PAGE) * PAGE


class FdHandle:
    """A file descriptor that survives being sent to a worker process.

    Forked workers inherit the number as is; forkserver workers get a duplicate through
    ``multiprocessing.reduction.DupFd`` when the process object is pickled.
    """

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self):
        from multiprocessing import reduction

        return (_rebuild_fd, (reduction.DupFd(self.fd),))


def _rebuild_fd(dup) -> FdHandle:
    return FdHandle(dup.detach())


def machine_memory() -> int:
    """Bytes of memory this machine has (RAM and swap): the most an arena could ever be given."""
    total = 0
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith(("MemTotal:", "SwapTotal:")):
                    total += int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return total or os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


class ArenaSpec:
    """What a worker needs to know of the arena, besides its fd: the size and where things are
    (each slot's list of up to ``items`` int64 item indices at ``item_offsets[slot]``)."""

    def __init__(self, size: int, slot_offsets: list[int], item_offsets: list[int], items: int) -> None:
        self.size = size
        self.slot_offsets = slot_offsets
        self.item_offsets = item_offsets
        self.items = items

    def map(self, fd: FdHandle) -> _core.ArenaMap:
        """Map the arena from ``fd`` in this process (the fd is closed afterwards; the mapping stays)."""
        mapping = _core.ArenaMap(fd.fd, self.size)
        os.close(fd.fd)
        return mapping

    def item_lists(self, mapping: _core.ArenaMap) -> list[np.ndarray]:
        """Each slot's item list as an int64 array over ``mapping`` (a worker reads a task's slice)."""
        return [np.frombuffer(mapping, np.int64, self.items, offset) for offset in self.item_offsets]


class Arena:
    """``depth`` batch slots of ``slot_size`` bytes in one shared mapping, plus worker status and
    each slot's list of up to ``items`` item indices (the largest batch share of the run's groups).

    :param on_release: called (on any thread) after a slot has returned to the free pool.
    """

    def __init__(self, depth: int, slot_size: int, workers: int, on_release: Callable[[int], None] | None = None,
                 items: int = 0) -> None:
        if depth < 1:
            raise ValueError(f"depth must be at least 1, got {depth}")
        self.depth = depth
        self.slot_size = max(64, int(slot_size))
        self.items = max(0, int(items))
        status_size = _round_page(max(1, workers) * STATUS_STRIDE)
        lists_size = _round_page(depth * self.items * 8)
        self.item_offsets = [status_size + i * self.items * 8 for i in range(depth)]
        self.slot_stride = _round_page(self.slot_size)
        self.size = status_size + lists_size + depth * self.slot_stride
        self.slot_offsets = [status_size + lists_size + i * self.slot_stride for i in range(depth)]
        fd = os.memfd_create("hydrax-arena", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, self.size)
            self.map = _core.ArenaMap(fd, self.size)
        except BaseException:
            os.close(fd)
            raise
        self._fd: int | None = fd
        # No lock: a slot can come back inside a garbage collection that runs while this very
        # thread is in the middle of an arena call (XLA frees host buffers from a gc callback), so
        # the pool is a deque whose append and popleft are atomic on their own.
        self._free: deque[int] = deque(range(depth))
        self.on_release = on_release
        self._closed = False
        self._pin = None
        self._item_lists = self.spec().item_lists(self.map)

    def pin(self, device_ordinal: int = 0) -> bool:
        """Page-lock the whole arena with the CUDA driver, so transfers to a GPU read it directly.

        Once per run, from the process that transfers; False (and nothing changed) where that is
        not possible (see :mod:`hydrax.procs.pinning`). The registration ends when the mapping goes,
        after the last view of it (and so the last transfer from it) is gone.
        """
        from .pinning import pin_host_memory

        if self._pin is None:
            self._pin = pin_host_memory(self.map.address, self.size, device_ordinal)
            if self._pin is not None:
                self.map.call_before_unmap(self._pin.release)
        return self._pin is not None

    @property
    def pinned(self) -> bool:
        """Whether the arena is page-locked for GPU transfers (see :meth:`pin`)."""
        return self._pin is not None and not self._pin.released

    def spec(self) -> ArenaSpec:
        """The picklable description of the arena's layout."""
        return ArenaSpec(self.size, self.slot_offsets, self.item_offsets, self.items)

    def write_items(self, slot: int, indices: Sequence[int]) -> None:
        """Store the items of the batch about to be loaded into ``slot``, for its tasks to read."""
        if len(indices) > self.items:
            raise ValueError(f"a batch share of {len(indices)} items does not fit the arena's lists of {self.items}")
        self._item_lists[slot][: len(indices)] = indices

    def handle(self) -> FdHandle:
        """The arena's memfd, in a form that reaches worker processes."""
        if self._fd is None:
            raise RuntimeError("the arena's file descriptor is already closed")
        return FdHandle(self._fd)

    def close_fd(self) -> None:
        """Close the memfd once every worker has its own mapping; the memory lives on."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def acquire(self) -> int | None:
        """Take a free slot, or None when all ``depth`` slots are in use."""
        if self._closed:
            return None
        try:
            return self._free.popleft()
        except IndexError:
            return None

    def lease(self, slot: int) -> _core.SlotLease:
        """A tracking exporter over ``slot``; the slot returns to the pool once it is sealed and unused."""
        return _core.SlotLease(self.map, slot, self.slot_offsets[slot], self.slot_size, self._release)

    def free_now(self, slot: int) -> None:
        """Return a slot that was never leased (for example a dropped batch)."""
        self._release(slot)

    def _release(self, slot: int) -> None:
        if self._closed:
            return
        self._free.append(slot)
        if self.on_release is not None:
            self.on_release(slot)

    @property
    def free_count(self) -> int:
        """Slots free right now."""
        return len(self._free)

    def heartbeat(self, worker: int) -> int:
        """The worker's last heartbeat (monotonic ns), 0 before it started."""
        return self.map.read_int64(status_line(worker) + HEARTBEAT_WORD)

    def current_item(self, worker: int) -> tuple[int, int, int]:
        """``(task id, position, start ns)`` of the item the worker started last."""
        base = status_line(worker) + ITEM_WORDS
        return tuple(self.map.read_int64(base + 8 * i) for i in range(3))  # type: ignore[return-value]

    def stop_workers(self, workers: int) -> None:
        """Tell the workers to take no further task (and their heartbeat threads to end)."""
        for w in range(workers):
            self.map.write_int64(status_line(w) + STOP_WORD, 1)

    def close(self) -> None:
        """Stop handing out slots. The mapping itself goes when the last view of it does (and
        with it any page locking), however long the run's objects live on."""
        self._closed = True
        self._free.clear()
        self.close_fd()
        self._item_lists = []
        self.map = None
