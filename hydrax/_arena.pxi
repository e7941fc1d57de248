# Arena kernels, included by _core.pyx: the shared memory that batches are built in, and the
# words a worker writes there for the parent to read.
#
# ArenaMap maps that memory and exports it as a buffer; SlotLease exports one batch slot and
# counts the exports alive, so the slot is recycled when its last view is gone; heartbeat,
# mark_item and monotonic_ns write and read the liveness and progress words. They are kernels
# because Python cannot do these jobs: the buffer protocol's export and release hooks exist only
# in C, and a heartbeat must keep beating without the GIL while the worker's Python code holds it.

from cpython.buffer cimport PyBuffer_FillInfo
from libc.errno cimport errno
from posix.mman cimport mmap, munmap, PROT_READ, PROT_WRITE, MAP_SHARED, MAP_FAILED
from posix.time cimport clock_gettime, timespec, CLOCK_MONOTONIC
from posix.unistd cimport usleep

import logging
import os


cdef inline int64_t _now_ns() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return <int64_t>ts.tv_sec * 1000000000 + ts.tv_nsec


cdef class ArenaMap:
    """A ``MAP_SHARED`` mapping of ``size`` bytes of the file ``fd``: read-write, or with
    ``writable=False`` read-only (``PROT_READ``; its buffer exports are read-only too).

    The mapping is page aligned and stays mapped for as long as this object or any buffer
    exported from it (numpy views, leases) is alive; ``munmap`` runs on deallocation only, so a
    ``jax.Array`` that aliases arena memory can never see it vanish.
    """

    cdef char* base
    cdef readonly Py_ssize_t size
    cdef readonly bint writable
    cdef object before_unmap

    def __cinit__(self, int fd, Py_ssize_t size, bint writable=True):
        if size <= 0:
            raise ValueError(f"arena size must be positive, got {size}")
        cdef int prot = PROT_READ | PROT_WRITE if writable else PROT_READ
        cdef void* ptr = mmap(NULL, <size_t>size, prot, MAP_SHARED, fd, 0)
        if ptr == MAP_FAILED:
            raise OSError(errno, f"mmap of {size} bytes failed: {os.strerror(errno)}")
        self.base = <char*>ptr
        self.size = size
        self.writable = writable

    def call_before_unmap(self, callback):
        """Call ``callback()`` just before the memory is unmapped, once nothing uses it any more.

        That is the moment a registration with a device driver (page locking) must end: no view
        of the memory, and so no transfer from it, is left.
        """
        self.before_unmap = callback

    def __dealloc__(self):
        if self.base != NULL:
            if self.before_unmap is not None:
                try:
                    self.before_unmap()
                except BaseException:
                    pass  # nothing can be raised from here; the memory goes all the same
                self.before_unmap = None
            munmap(self.base, <size_t>self.size)
            self.base = NULL

    @property
    def address(self):
        """The address of the first byte of the mapping (page aligned)."""
        return <size_t>self.base

    def __getbuffer__(self, Py_buffer* view, int flags):
        PyBuffer_FillInfo(view, self, self.base, self.size, not self.writable, flags)

    def __releasebuffer__(self, Py_buffer* view):
        pass

    def write_int64(self, Py_ssize_t offset, int64_t value):
        """Store one int64 at ``offset`` (8-byte aligned, inside the mapping)."""
        if not self.writable:
            raise BufferError("the mapping is read-only")
        if offset < 0 or offset + 8 > self.size or offset % 8:
            raise IndexError(f"int64 offset {offset} outside the arena of {self.size} bytes")
        (<int64_t*>(self.base + offset))[0] = value

    def read_int64(self, Py_ssize_t offset):
        """Load one int64 from ``offset`` (8-byte aligned, inside the mapping)."""
        if offset < 0 or offset + 8 > self.size or offset % 8:
            raise IndexError(f"int64 offset {offset} outside the arena of {self.size} bytes")
        return (<int64_t*>(self.base + offset))[0]


cdef class SlotLease:
    """Buffer exporter for one batch slot, with a count of live exports.

    Every ``np.frombuffer(lease, ...)`` takes one export; numpy holds it until that array and
    every view of it are gone, and JAX holds the array for as long as a ``jax.Array`` aliases
    it. After :meth:`seal`, the moment the count drops to zero ``on_free(slot)`` is called once,
    on whichever thread released the last export. Exports taken after that fail, so recycled
    memory can never be handed out twice.
    """

    cdef ArenaMap arena
    cdef Py_ssize_t offset
    cdef Py_ssize_t length
    cdef Py_ssize_t exports
    cdef bint sealed
    cdef bint fired
    cdef object on_free
    cdef readonly int slot

    def __cinit__(self, ArenaMap arena, int slot, Py_ssize_t offset, Py_ssize_t length, on_free):
        if offset < 0 or length < 0 or offset + length > arena.size:
            raise ValueError(f"slot [{offset}, {offset + length}) outside the arena of {arena.size} bytes")
        self.arena = arena
        self.slot = slot
        self.offset = offset
        self.length = length
        self.on_free = on_free

    def __getbuffer__(self, Py_buffer* view, int flags):
        if self.fired:
            raise BufferError("batch memory has been recycled")
        PyBuffer_FillInfo(view, self, self.arena.base + self.offset, self.length, not self.arena.writable, flags)
        self.exports += 1

    def __releasebuffer__(self, Py_buffer* view):
        self.exports -= 1
        if self.exports == 0 and self.sealed:
            self._fire()

    @property
    def exports(self):
        """The number of buffer exports alive now."""
        return self.exports

    @property
    def released(self):
        """True once the slot has been handed back."""
        return self.fired

    def seal(self):
        """No more views will be made by hydrax: recycle as soon as none is alive."""
        self.sealed = True
        if self.exports == 0:
            self._fire()

    cdef void _fire(self) noexcept:
        if self.fired:
            return
        self.fired = True
        callback = self.on_free
        self.on_free = None
        if callback is None:
            return
        try:
            callback(self.slot)
        except BaseException as exc:  # a release can run in any thread; never let it raise there
            logging.getLogger("hydrax.procs.arena").error("[hydrax] error recycling batch slot %d: %r", self.slot, exc)


def heartbeat(ArenaMap arena, Py_ssize_t offset, long period_us):
    """Write the monotonic clock (ns) to the int64 at ``offset`` every ``period_us``.

    Runs without the GIL until the int64 at ``offset + 8`` becomes non-zero. Meant to be the
    target of a daemon thread in a worker process.
    """
    if offset < 0 or offset + 16 > arena.size or offset % 8:
        raise IndexError(f"heartbeat offset {offset} outside the arena of {arena.size} bytes")
    cdef volatile int64_t* word = <volatile int64_t*>(arena.base + offset)
    with nogil:
        while word[1] == 0:
            word[0] = _now_ns()
            usleep(period_us)


def mark_item(ArenaMap arena, Py_ssize_t offset, int64_t task, int64_t position):
    """Record at ``offset`` that this worker started ``position`` of ``task`` now.

    Layout of the three int64 words: task id, position in the batch, start time (ns).
    """
    if offset < 0 or offset + 24 > arena.size or offset % 8:
        raise IndexError(f"status offset {offset} outside the arena of {arena.size} bytes")
    cdef int64_t* word = <int64_t*>(arena.base + offset)
    word[0] = task
    word[1] = position
    word[2] = _now_ns()


def monotonic_ns():
    """CLOCK_MONOTONIC in nanoseconds: the clock :func:`heartbeat` and :func:`mark_item` use."""
    return _now_ns()
