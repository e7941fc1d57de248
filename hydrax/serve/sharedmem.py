"""Same-host shared memory for serving: batch data skips the socket, the message carries where it is.

Over TCP loopback every byte of a batch is copied twice by the kernel (into the socket, out of
it), and on a small machine those copies are most of the cost of serving. When producer and
consumers share a host, a producer made with ``Connection(..., shared_memory=...)`` instead
copies each batch once into a ring of shared memory (a ``memfd``) and sends only the envelope and
the tenbin header frames; the envelope's ``"m"`` field says which ring, which entry and where
each array's bytes start. The consumer maps the ring once (through ``/proc/<pid>/fd/<fd>`` of the
producer, so it must run on the same host, in the same PID namespace, as the same user) and hands
out read-only arrays that view it: no copy at all on the consumer's side.

The ring lives as long as anyone maps it: a consumer keeps its mapping when the producer exits.

Flow control runs through the ring's own control block, not the socket, so no message travels
back: when a consumer receives an entry it stores the entry's generation in ``received``, and
when the last array viewing the entry is garbage-collected it stores it in ``released``; the
producer reuses the entry's bytes only after that. Generations only grow, so a stale mark never
frees a newer entry. A ring that is full (consumers hold on to their batches, or are slow) is not
waited for: that batch goes through the socket as usual, so a consumer that keeps every batch
(``list(connection)``) can never deadlock its producer, and the socket's high-water marks bound
memory as before.

Layout of the memfd: a 64-byte header (:data:`MAGIC`, a random 16-byte token that the consumer
checks, the data size and the number of entries), then ``received`` and ``released`` (int64 per
entry), then from :data:`DATA_OFFSET` (page-aligned) the data, where every array starts on a
64-byte boundary (XLA:CPU aliases such memory).
"""

from __future__ import annotations

import collections
import logging
import mmap
import os
import struct
import time
import weakref
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from .. import tenbin
from ..errors import ServeError

log = logging.getLogger(__name__)

MAGIC = b"hxshm001"
#: Header: magic, token, data bytes, entries; then at :data:`_MAPPED` a word a consumer sets
#: once it has mapped the ring.
_HEADER = struct.Struct("<8s16sqq")
_MAPPED = _HEADER.size
#: Where the data starts (a multiple of any page size Linux uses, so it can be mapped on its own).
DATA_OFFSET = 1 << 16
#: Batches that may be in flight at once (each holds one entry until its consumer lets go).
ENTRIES = 256
#: Every array's bytes start on a multiple of this.
ALIGN = 64
#: The least ring size that ``shared_memory=True`` makes.
MIN_DEFAULT_BYTES = 64 << 20
#: The name of the ring's memfd (``/proc/<pid>/fd/<fd>`` links to ``/memfd:<name> (deleted)``).
MEMFD_NAME = "hydrax-serve"
#: How often :meth:`Ring.wait_received` looks again.
POLL_SECONDS = 0.005


def host_identity() -> str:
    """What a consumer must share with a producer to map its ring: the host's boot, the PID
    namespace and the user, as one string ("" where this system does not say; then no ring).

    Reliable mode (:class:`~hydrax.serve.Collector`) compares it across the hello, so a producer
    on the collector's host uses shared memory and one elsewhere the socket, without being told.
    """
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return ""
    return f"{boot}/{namespace}/{os.getuid()}"


def _control(buffer, entries: int) -> tuple[np.ndarray, np.ndarray]:
    received = np.frombuffer(buffer, np.int64, entries, 64)
    released = np.frombuffer(buffer, np.int64, entries, 64 + 8 * entries)
    return received, released


def check_size(value: int | bool) -> int | bool:
    """``shared_memory`` as given, when it is True or a size in bytes; ValueError otherwise."""
    if value is not True and (isinstance(value, bool) or not isinstance(value, int) or value < ALIGN):
        raise ValueError(f"shared_memory must be True or a size in bytes (at least {ALIGN}), got {value!r}")
    return value


def ring_bytes(value: int | bool, batch_bytes: int, in_flight: int) -> int:
    """The ring size for ``shared_memory=value``: True sizes it from the first batch, for the
    ``in_flight`` batches that queues and the consumer can hold at once (at least
    :data:`MIN_DEFAULT_BYTES`)."""
    if value is True:
        return max(MIN_DEFAULT_BYTES, in_flight * (-(-batch_bytes // DATA_OFFSET) * DATA_OFFSET))
    return value


@dataclass
class _Entry:
    index: int
    generation: int
    start: int
    end: int


class Ring:
    """The producer's side: a memfd of ``nbytes`` data bytes that batches are copied into."""

    def __init__(self, nbytes: int, entries: int = ENTRIES) -> None:
        self.size = nbytes
        self.entries = entries
        self.token = os.urandom(16)
        self.fd = os.memfd_create(MEMFD_NAME, os.MFD_CLOEXEC)
        self.pid = os.getpid()
        try:
            os.ftruncate(self.fd, DATA_OFFSET + nbytes)
            self._map = mmap.mmap(self.fd, DATA_OFFSET + nbytes)
        except OSError:
            os.close(self.fd)
            raise
        _HEADER.pack_into(self._map, 0, MAGIC, self.token, nbytes, entries)
        self._received, self._released = _control(self._map, entries)
        self._data = np.frombuffer(self._map, np.uint8, nbytes, DATA_OFFSET)
        # Oldest first. Entries are released in the order they were taken, so those in flight have
        # consecutive generations, and ``generation % entries`` gives each its own index.
        self._in_flight: collections.deque[_Entry] = collections.deque()
        self._generation = 0
        self._head = 0  # where the next batch goes
        self._warned = False

    def _reclaim(self) -> None:
        # Entries are reused in the order they were taken; one held longer holds those after it.
        while self._in_flight and self._released[self._in_flight[0].index] == self._in_flight[0].generation:
            self._in_flight.popleft()
        if not self._in_flight:
            self._head = 0

    def _allocate(self, nbytes: int) -> int | None:
        if not self._in_flight:
            return 0
        oldest = self._in_flight[0].start
        if self._in_flight[-1].start < oldest:  # wrapped: free is [head, oldest)
            return self._head if oldest - self._head >= nbytes else None
        if self.size - self._head >= nbytes:  # free is [head, size) and [0, oldest)
            return self._head
        return 0 if nbytes <= oldest else None

    def place(self, payloads: list) -> dict[str, Any] | None:
        """Copy each data payload (bytes-like) into the ring; the envelope's ``"m"`` field, or
        None when the ring has no room (the caller sends the batch through the socket)."""
        self._reclaim()
        sizes = [memoryview(p).nbytes for p in payloads]
        offsets, total = [], 0
        for n in sizes:
            offsets.append(total)
            total += -(-n // ALIGN) * ALIGN
        total = max(total, ALIGN)
        if total > self.size:
            if not self._warned:
                self._warned = True
                log.warning("[hydrax] a %d-byte batch does not fit the %d-byte shared memory ring: such batches go "
                            "through the socket (raise shared_memory)", total, self.size)
            return None
        if len(self._in_flight) >= self.entries:
            return None
        start = self._allocate(total)
        if start is None:
            return None
        self._generation += 1
        entry = _Entry(self._generation % self.entries, self._generation, start, start + total)
        for payload, offset, n in zip(payloads, offsets, sizes):
            if n:
                self._data[start + offset : start + offset + n] = np.frombuffer(payload, np.uint8, n)
        self._in_flight.append(entry)
        self._head = entry.end
        return {"t": self.token.hex(), "pid": self.pid, "fd": self.fd, "e": entry.index, "g": entry.generation,
                "o": [start + o for o in offsets]}

    @property
    def unreceived(self) -> int:
        """Entries sent that no consumer has received yet."""
        return sum(1 for e in self._in_flight if self._received[e.index] != e.generation)

    @property
    def mapped(self) -> bool:
        """Whether a consumer has mapped the ring (its mapping outlives this process)."""
        return bool(self._map is not None and struct.unpack_from("<q", self._map, _MAPPED)[0])

    def wait_received(self, seconds: float, connected: Callable[[], int]) -> int:
        """Before this process lets go of the ring: wait up to ``seconds``, while consumers are
        ``connected``, until every sent entry has been received; entries still not received.

        A consumer opens the ring through this process, so one that has not mapped it yet
        could not once the process is gone. One consumer that has mapped it needs no wait.
        """
        deadline = time.monotonic() + seconds
        while self.unreceived:
            peers = connected()
            if peers == 1 and self.mapped:
                return 0
            if peers == 0 or time.monotonic() >= deadline:
                break
            time.sleep(POLL_SECONDS)
        return self.unreceived

    def close(self) -> None:
        """Unmap and close this process's handle (consumers' mappings stay valid)."""
        if self.fd < 0:
            return
        self._received = self._released = self._data = None
        try:
            self._map.close()
        except BufferError:
            log.debug("the shared memory ring is still viewed; it is unmapped when collected")
        self._map = None
        os.close(self.fd)
        self.fd = -1


class _Held(np.ndarray):
    """A received entry's bytes. Its own type stops numpy from collapsing view bases past it, so
    every array made from it, and every view of those, keeps it alive: it dies with the last one."""


class _Mapping:
    def __init__(self, pid: int, fd: int, token: bytes) -> None:
        path = f"/proc/{pid}/fd/{fd}"
        # The message names the file: open nothing but a ring (a device or FIFO could act on open).
        if not os.readlink(path).startswith(f"/memfd:{MEMFD_NAME} "):
            raise ValueError(f"{path} is not a hydrax shared memory ring")
        handle = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        try:
            size = os.fstat(handle).st_size
            if size < DATA_OFFSET:
                raise ValueError(f"{path} is not a hydrax shared memory ring ({size} bytes)")
            control = mmap.mmap(handle, DATA_OFFSET)
            magic, found, nbytes, entries = _HEADER.unpack_from(control, 0)
            if magic != MAGIC or found != token or 64 + 16 * entries > DATA_OFFSET or size < DATA_OFFSET + nbytes:
                control.close()
                raise ValueError(f"{path} is not the producer's shared memory ring (another process or host has that pid)")
            self.data = mmap.mmap(handle, nbytes, access=mmap.ACCESS_READ, offset=DATA_OFFSET)
        finally:
            os.close(handle)
        struct.pack_into("<q", control, _MAPPED, 1)
        self.control = control
        self.size = nbytes
        self.entries = entries
        self.received, self.released = _control(control, entries)


_HEX = set("0123456789abcdef")


def _word(value: Any) -> bool:
    """Whether a JSON value is an int that an int64 word of the ring holds, and not negative."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 63


def _release(released: np.ndarray, index: int, generation: int) -> None:
    released[index] = generation


class Mappings:
    """The consumer's side: the rings of the producers it hears from, mapped once each."""

    def __init__(self) -> None:
        self._rings: dict[str, _Mapping] = {}

    def forget(self, token: str) -> None:
        """Drop the ring with this token (its producer is gone): arrays that view it keep it mapped."""
        self._rings.pop(token, None)

    def frames(self, field: Any, headers: list, where: str) -> list:
        """``[header, data, header, data, ...]`` of a message whose data is in its producer's
        ring: ``headers`` are its tenbin header frames, ``field`` its envelope's ``"m"``.

        :raises ValueError: (or :class:`~hydrax.errors.TenbinError`) for a malformed field or header.
        :raises ServeError: when the ring cannot be mapped.
        """
        sizes = [tenbin.data_nbytes(h) for h in headers]
        buffers = self.buffers(field, sizes, where)
        return [frame for pair in zip(headers, buffers) for frame in pair]

    def buffers(self, field: Any, sizes: list[int], where: str) -> list[np.ndarray]:
        """The data buffers an envelope's ``"m"`` field points at, one per size; they keep the
        entry held until the last array made from them is gone.

        :raises ValueError: for a malformed field or one pointing outside the ring.
        :raises ServeError: when the ring cannot be mapped (not the same host, PID namespace or user).
        """
        if not isinstance(field, dict):
            raise ValueError("its shared memory field is not an object")
        token, pid, fd, index, generation, offsets = (field.get(k) for k in ("t", "pid", "fd", "e", "g", "o"))
        if not (isinstance(token, str) and len(token) == 32 and set(token) <= _HEX and isinstance(offsets, list) and len(offsets) == len(sizes)
                and all(_word(v) for v in (pid, fd, index, generation, *offsets))):
            raise ValueError(f"its shared memory field is malformed: {field!r}")
        ring = self._rings.get(token)
        if ring is None:
            try:
                ring = _Mapping(pid, fd, bytes.fromhex(token))
            except (OSError, ValueError) as exc:
                raise ServeError(
                    f"the producer (pid {pid}) on {where} sends batches through shared memory, which this consumer cannot map "
                    f"({exc}): producer and consumer must run on one host, in one PID namespace, as one user; "
                    "otherwise make the producer's Connection without shared_memory") from None
            self._rings[token] = ring
        if index >= ring.entries:
            raise ValueError(f"its shared memory entry {index} is past the ring's {ring.entries}")
        spans = [(o, o + n) for o, n in zip(offsets, sizes)]
        if any(o % ALIGN or e > ring.size for o, e in spans):
            raise ValueError(f"its shared memory offsets {offsets} fall outside the {ring.size}-byte ring or off 64-byte boundaries")
        ring.received[index] = generation
        start = min((o for o, _ in spans), default=0)
        end = max((e for _, e in spans), default=0)
        held = np.frombuffer(ring.data, np.uint8, end - start, start).view(_Held)
        weakref.finalize(held, _release, ring.released, index, generation)
        return [held[o - start : e - start].view(np.ndarray) for o, e in spans]
