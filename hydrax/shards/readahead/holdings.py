"""What a :class:`~hydrax.shards.readahead.fetcher.Fetcher` holds, within its budget.

Every file the fetcher manages (a chunk or a sample of a shard: a :class:`Unit`) goes from
absent to queued, to being written, to present, and back to absent when evicted. A
:class:`Holdings` keeps those units, least recently used first, the bytes they take against the
budget, and the files of earlier runs (a persistent cache's, or those set-up wrote) that count
against it too. It makes room for a file, waiting while everything held is still needed, by
evicting present files no announced batch needs; and it moves a file through its states on
disk (a temporary name while written, named by its writer; renamed when complete).

The fetcher decides what to fetch and when; this class only keeps the account, so the two are
read apart. Both run on the fetcher's event loop, which is what makes the account consistent.
"""

from __future__ import annotations

import asyncio
import os
from collections import OrderedDict
from typing import Callable

from .folders import STALE_PART_S, ShardLayout, claim_writer, held_files, part_name


class Unit:
    """One file the fetcher manages: a chunk or a sample of a shard."""

    __slots__ = ("shard", "name", "size", "refs", "state")

    def __init__(self, shard: int, name: str, size: int) -> None:
        self.shard = shard
        self.name = name
        self.size = size
        self.refs = 0
        self.state = "absent"  # absent -> queued -> writing -> present (-> absent when evicted)


class Holdings:
    """The files a fetcher holds under ``root`` and the room left of ``max_bytes`` (see the
    module docstring). ``layout(shard)`` gives a shard's
    :class:`~hydrax.shards.readahead.folders.ShardLayout` (where its files go); ``stats`` is the
    fetcher's statistics, whose ``held_peak``, ``evicted`` and ``reused`` this counts.
    """

    def __init__(self, max_bytes: int, root: str, layout: Callable[[int], ShardLayout], stats: dict[str, int]) -> None:
        self.max_bytes = max_bytes
        self.root = root
        self.stats = stats
        self.units: OrderedDict[tuple[int, str], Unit] = OrderedDict()  # least recently used first
        self.bytes = 0
        self.room: asyncio.Condition | None = None  # made on the fetcher's loop, when it starts
        self._layout = layout
        self._foreign: OrderedDict[str, int] | None = None  # files of earlier runs in a persistent cache
        self._claimed: set[str] = set()  # the shard folders this process has named itself the writer of

    def unit(self, shard: int, name: str, size: int) -> Unit:
        """The unit of the file ``name`` of ``shard`` (``size`` bytes), made if new, now the most
        recently used."""
        key = (shard, name)
        unit = self.units.get(key)
        if unit is None:
            unit = self.units[key] = Unit(shard, name, size)
            if self._foreign is not None:
                # A persistent cache may hold the file from an earlier run: use it as it is.
                path = os.path.join(self._layout(shard).directory, name)
                if self._foreign.pop(path, None) is not None:
                    unit.state = "present"
                    self.stats["reused"] += size
        else:
            self.units.move_to_end(key)
        return unit

    def forget(self, unit: Unit) -> None:
        """Drop an absent unit no batch needs: the units held stay within what is read ahead,
        whatever the dataset's size."""
        key = (unit.shard, unit.name)
        if self.units.get(key) is unit:
            del self.units[key]

    async def notify(self) -> None:
        """Wake the fetchers waiting for room (a batch was released: its files may be evicted)."""
        async with self.room:
            self.room.notify_all()

    async def reserve(self, unit: Unit, wait: bool = True) -> bool:
        """Make room for ``unit``, waiting while everything held is still needed (unless not
        ``wait``); False when it is larger than the whole budget (workers then read its samples
        themselves), or there is no room and no waiting."""
        async with self.room:
            while self.bytes + unit.size > self.max_bytes:
                if not self._evict(self.bytes + unit.size - self.max_bytes):
                    if unit.size > self.max_bytes or not wait:
                        return False
                    await self.room.wait()
            self.bytes += unit.size
            self.stats["held_peak"] = max(self.stats["held_peak"], self.bytes)
            return True

    async def reserve_needed(self, unit: Unit, wait: bool = True) -> bool:
        """:meth:`reserve` for a chunk some announced batch still needs once there is room;
        False (the chunk left absent) when it is needed no more or larger than the budget (or,
        without ``wait``, when there is no room now)."""
        if unit.refs > 0 and await self.reserve(unit, wait):
            if unit.refs > 0:
                return True
            async with self.room:
                self.bytes -= unit.size
                self.room.notify_all()
        unit.state = "absent"
        if unit.refs <= 0:
            self.forget(unit)
        return False

    def give_back(self, unit: Unit) -> None:
        """Return the room reserved for ``unit``, which will not be written."""
        unit.state = "absent"
        self.bytes -= unit.size
        self.forget(unit)

    def _evict(self, wanted: int) -> bool:
        """Remove present, unreferenced files, least recently used first (files of earlier runs
        before all others), until ``wanted`` bytes are free."""
        freed = self._trim_foreign(wanted) if self._foreign else 0
        for key, unit in list(self.units.items()):
            if freed >= wanted:
                break
            if unit.state != "present" or unit.refs > 0:
                continue
            try:
                os.unlink(os.path.join(self._layout(unit.shard).directory, unit.name))
            except OSError:
                pass
            unit.state = "absent"
            self.bytes -= unit.size
            freed += unit.size
            self.stats["evicted"] += 1
            del self.units[key]
        return freed >= wanted

    def begin(self, unit: Unit, directory: str) -> str:
        """Mark ``unit`` as being written: workers that need it wait for it from now on."""
        if directory not in self._claimed:
            claim_writer(directory)
            self._claimed.add(directory)
        unit.state = "writing"
        part = os.path.join(directory, part_name(unit.name))
        open(part, "wb").close()
        return part

    def finish(self, unit: Unit, directory: str, part: str) -> None:
        os.replace(part, os.path.join(directory, unit.name))
        unit.state = "present"

    def abandon(self, unit: Unit, part: str | None) -> None:
        if part is not None:
            try:
                os.unlink(part)
            except OSError:
                pass
        if unit.state in ("writing", "queued"):
            unit.state = "absent"
            self.bytes -= unit.size if part is not None else 0

    def adopt_existing(self) -> None:
        """Count what a persistent cache already holds (oldest first), so the cap applies to it."""
        self._foreign = OrderedDict(held_files(self.root, STALE_PART_S))  # stale parts: left by a killed process
        self.bytes = sum(self._foreign.values())
        if self.bytes > self.max_bytes:
            self._trim_foreign(self.bytes - self.max_bytes)

    def adopt_held(self, held: dict[str, int]) -> None:
        """Count the files ``held`` (written for this fetcher before it started) as files of an
        earlier run: used as they are when first needed, evicted first, within the budget."""
        if self._foreign is None:
            self._foreign = OrderedDict()
        for path, size in held.items():
            if path not in self._foreign:  # a persistent cache's scan found it already
                self._foreign[path] = size
                self.bytes += size
        if self.bytes > self.max_bytes:
            self._trim_foreign(self.bytes - self.max_bytes)
        self.stats["held_peak"] = max(self.stats["held_peak"], self.bytes)

    def _trim_foreign(self, wanted: int) -> int:
        freed = 0
        while freed < wanted and self._foreign:
            path, size = self._foreign.popitem(last=False)
            try:
                os.unlink(path)
            except OSError:
                pass
            freed += size
            self.bytes -= size
        return freed
