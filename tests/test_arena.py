"""The arena: one shared mapping of a status page and ``depth`` slots, recycled when unused."""

import gc
import os

import numpy as np
import pytest

from support.leftovers import new_shm_entries
from support.shmwatch import SHM

from hydrax import _core
from hydrax.procs.arena import PAGE, STATUS_STRIDE, Arena, FdHandle, status_line


def test_slots_are_page_aligned_after_one_status_line_per_worker_and_the_item_lists():
    arena = Arena(depth=3, slot_size=10_000, workers=70)
    try:
        assert arena.slot_offsets[0] == 2 * PAGE  # 70 status lines of 64 bytes need two pages
        assert all(offset % PAGE == 0 for offset in arena.slot_offsets) and arena.slot_stride == 3 * PAGE
        assert arena.size == arena.slot_offsets[-1] + arena.slot_stride and status_line(69) == 69 * STATUS_STRIDE
    finally:
        arena.close()
    arena = Arena(depth=3, slot_size=10_000, workers=2, items=1000)  # 3 lists of 8,000 bytes: 6 pages
    try:
        assert arena.item_offsets == [PAGE, PAGE + 8000, PAGE + 16000] and arena.slot_offsets[0] == 7 * PAGE
        arena.write_items(1, range(5, 1005))
        arena.write_items(2, [7, 8])
        # a worker's mapping of the same memfd reads the lists the main process wrote
        spec = arena.spec()
        lists = spec.item_lists(spec.map(FdHandle(os.dup(arena.handle().fd))))
        assert lists[1].tolist() == list(range(5, 1005)) and lists[2][:2].tolist() == [7, 8]
        with pytest.raises(ValueError, match="does not fit"):
            arena.write_items(0, range(1001))
    finally:
        arena.close()
    with pytest.raises(ValueError, match="depth must be at least 1"):
        Arena(0, 64, 1)


def test_a_slot_comes_back_when_its_last_view_is_gone_and_not_before():
    released = []
    arena = Arena(depth=2, slot_size=4096, workers=1, on_release=released.append)
    try:
        first, second = arena.acquire(), arena.acquire()
        assert (first, second, arena.acquire(), arena.free_count) == (0, 1, None, 0)
        lease = arena.lease(first)
        view = np.frombuffer(lease, dtype=np.uint8)
        lease.seal()
        del lease
        gc.collect()
        assert released == [] and arena.free_count == 0  # the view still holds it
        del view
        gc.collect()
        assert released == [0] and arena.acquire() == 0
        arena.free_now(second)  # a slot that was never leased (a dropped batch)
        assert released == [0, 1] and arena.free_count == 1
    finally:
        arena.close()
    assert arena.acquire() is None  # a closed arena hands out nothing


def test_status_lines_carry_heartbeats_items_and_the_stop_word():
    arena = Arena(depth=1, slot_size=64, workers=2)
    try:
        assert arena.heartbeat(1) == 0 and arena.current_item(1) == (0, 0, 0)
        _core.mark_item(arena.map, status_line(1) + 16, 42, 7)
        task, position, started = arena.current_item(1)
        assert (task, position) == (42, 7) and 0 < started <= _core.monotonic_ns()
        arena.stop_workers(2)
        assert arena.map.read_int64(status_line(0) + 8) == arena.map.read_int64(status_line(1) + 8) == 1
    finally:
        arena.close()


def test_the_memory_is_a_memfd_no_file_in_dev_shm():
    before = set(os.listdir(SHM))
    arena = Arena(depth=2, slot_size=1 << 20, workers=1)
    try:
        link = os.readlink(f"/proc/self/fd/{arena.handle().fd}")
        assert link.startswith("/memfd:hydrax-arena") and new_shm_entries(before) == set()
        arena.close_fd()
        with pytest.raises(RuntimeError, match="already closed"):
            arena.handle()
    finally:
        arena.close()
