# cython: language_level=3
"""Compiled kernels of hydrax.

Kept narrow on purpose: the Python layer decides, these functions compute.

- :class:`ArenaMap` maps a shared-memory file descriptor (a memfd) and exports it as a buffer.
- :class:`SlotLease` exports one batch slot of an arena and counts the buffer exports that are
  alive, so the slot is recycled exactly when the last numpy view or ``jax.Array`` made from it
  is gone (the job hydrax 0.2.2's ``TrackedBuffer`` did in C).
- :func:`heartbeat` runs without the GIL in a worker thread, so a worker whose Python code is
  busy (or holds the GIL in C) still proves it is alive; only a frozen or dead process stops it.
- :func:`mark_item` records which item a worker is loading, in shared memory, at the cost of a
  couple of stores, so the parent can name the item when the worker dies or stalls.

``hydrax/_fallback.py`` has pure-Python twins of the pure functions; the tests use them as the oracle.
"""

from cpython.buffer cimport PyBuffer_FillInfo
from libc.errno cimport errno
from libc.math cimport cbrtf
from libc.stdint cimport int64_t, uint8_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy
from posix.mman cimport mmap, munmap, PROT_READ, PROT_WRITE, MAP_SHARED, MAP_FAILED
from posix.time cimport clock_gettime, timespec, CLOCK_MONOTONIC
from posix.unistd cimport usleep

import os
import sys


cdef inline int64_t _now_ns() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return <int64_t>ts.tv_sec * 1000000000 + ts.tv_nsec


cdef class ArenaMap:
    """A read-write ``MAP_SHARED`` mapping of ``size`` bytes of the file ``fd``.

    The mapping is page aligned and stays mapped for as long as this object or any buffer
    exported from it (numpy views, leases) is alive; ``munmap`` runs on deallocation only, so a
    ``jax.Array`` that aliases arena memory can never see it vanish.
    """

    cdef char* base
    cdef readonly Py_ssize_t size

    def __cinit__(self, int fd, Py_ssize_t size):
        if size <= 0:
            raise ValueError(f"arena size must be positive, got {size}")
        cdef void* ptr = mmap(NULL, <size_t>size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
        if ptr == MAP_FAILED:
            raise OSError(errno, f"mmap of {size} bytes failed: {os.strerror(errno)}")
        self.base = <char*>ptr
        self.size = size

    def __dealloc__(self):
        if self.base != NULL:
            munmap(self.base, <size_t>self.size)
            self.base = NULL

    @property
    def address(self):
        """The address of the first byte of the mapping (page aligned)."""
        return <size_t>self.base

    def __getbuffer__(self, Py_buffer* view, int flags):
        PyBuffer_FillInfo(view, self, self.base, self.size, 0, flags)

    def __releasebuffer__(self, Py_buffer* view):
        pass

    def write_int64(self, Py_ssize_t offset, int64_t value):
        """Store one int64 at ``offset`` (8-byte aligned, inside the mapping)."""
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
        PyBuffer_FillInfo(view, self, self.arena.base + self.offset, self.length, 0, flags)
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
            print(f"[hydrax] error recycling batch slot {self.slot}: {exc!r}", file=sys.stderr)


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


# -- tar header scanning -------------------------------------------------------------------------

cdef enum:
    TAR_BLOCK = 512
    TAR_OK = 0
    TAR_BAD_CHECKSUM = 1
    TAR_TRUNCATED = 2
    TAR_BAD_NUMBER = 3
    TAR_BAD_PAX = 4
    TAR_FULL = 5


cdef inline bint _tar_zero_block(const unsigned char* p) noexcept nogil:
    cdef int i
    for i in range(TAR_BLOCK):
        if p[i] != 0:
            return False
    return True


cdef inline int _tar_number(const unsigned char* p, int width, int64_t* out) noexcept nogil:
    # Octal ASCII, or GNU base-256 when the top bit of the first byte is set.
    cdef int64_t value = 0
    cdef int i = 0
    cdef unsigned char c
    if p[0] & 0x80:
        value = p[0] & 0x3F
        for i in range(1, width):
            value = (value << 8) | p[i]
        out[0] = value
        return TAR_OK
    while i < width and (p[i] == 0x20 or p[i] == 0):
        if p[i] == 0:
            out[0] = 0
            return TAR_OK
        i += 1
    while i < width:
        c = p[i]
        if c == 0 or c == 0x20:
            break
        if c < 0x30 or c > 0x37:
            return TAR_BAD_NUMBER
        value = value * 8 + (c - 0x30)
        i += 1
    out[0] = value
    return TAR_OK


cdef inline bint _tar_checksum_ok(const unsigned char* p, int64_t stored) noexcept nogil:
    cdef int64_t unsigned_sum = 0
    cdef int64_t signed_sum = 0
    cdef int i
    for i in range(TAR_BLOCK):
        if 148 <= i < 156:
            unsigned_sum += 0x20
            signed_sum += 0x20
        else:
            unsigned_sum += p[i]
            signed_sum += <signed char>p[i]
    return stored == unsigned_sum or stored == signed_sum


cdef inline Py_ssize_t _tar_strnlen(const unsigned char* p, Py_ssize_t width) noexcept nogil:
    cdef Py_ssize_t n = 0
    while n < width and p[n] != 0:
        n += 1
    return n


cdef int _tar_pax(const unsigned char* p, Py_ssize_t length, Py_ssize_t base,
                  int64_t* path_off, int64_t* path_len, int64_t* size) noexcept nogil:
    # Records are "LEN key=value\n", LEN counting the whole record.
    cdef Py_ssize_t pos = 0, rec, k, eq
    while pos < length:
        rec = 0
        k = pos
        while k < length and 0x30 <= p[k] <= 0x39:
            rec = rec * 10 + (p[k] - 0x30)
            k += 1
        if rec == 0:
            if _tar_strnlen(p + pos, length - pos) == 0:
                return TAR_OK  # NUL padding at the end
            return TAR_BAD_PAX
        if k >= length or p[k] != 0x20 or pos + rec > length or p[pos + rec - 1] != 0x0A:
            return TAR_BAD_PAX
        k += 1
        eq = k
        while eq < pos + rec and p[eq] != 0x3D:
            eq += 1
        if eq >= pos + rec:
            return TAR_BAD_PAX
        if eq - k == 4 and p[k] == 0x70 and p[k + 1] == 0x61 and p[k + 2] == 0x74 and p[k + 3] == 0x68:  # path
            path_off[0] = base + eq + 1
            path_len[0] = pos + rec - 1 - (eq + 1)
        elif eq - k == 4 and p[k] == 0x73 and p[k + 1] == 0x69 and p[k + 2] == 0x7A and p[k + 3] == 0x65:  # size
            size[0] = 0
            k = eq + 1
            while k < pos + rec - 1:
                if p[k] < 0x30 or p[k] > 0x39:
                    return TAR_BAD_PAX
                size[0] = size[0] * 10 + (p[k] - 0x30)
                k += 1
        pos += rec
    return TAR_OK


def scan_tar(const unsigned char[::1] data, int64_t[:, ::1] out):
    """Scan the headers of the tar archive in ``data``; never read a member's payload.

    One row of ``out`` per regular file, in archive order: header offset, payload offset, payload
    size, then where the name is: prefix offset and length (ustar ``prefix``, else 0, 0) and name
    offset and length (the header's ``name``, or the GNU ``L`` or pax ``path`` record that
    replaced it). Returns ``(rows, status, offset)``: status 0 when the archive ended with its
    end-of-archive zero block, else an error code and the byte offset of the offending header
    (1 bad checksum, 2 truncated or no end-of-archive block, 3 bad number field, 4 bad pax
    record, 5 ``out`` is full).
    """
    cdef Py_ssize_t n = data.shape[0]
    cdef Py_ssize_t capacity = out.shape[0]
    cdef Py_ssize_t pos = 0, rows = 0, payload, name_len, prefix_len
    cdef const unsigned char* base = &data[0] if n else NULL
    cdef const unsigned char* h
    cdef int64_t size, stored, long_off = -1, long_len = 0, pax_off = -1, pax_len = 0, pax_size = -1
    cdef int status = TAR_OK
    cdef unsigned char kind
    cdef bint ustar
    if out.shape[1] < 7:
        raise ValueError(f"out must have 7 columns, has {out.shape[1]}")
    with nogil:
        while True:
            if pos + TAR_BLOCK > n:  # also no end-of-archive block at all: a cut-off shard
                status = TAR_TRUNCATED
                break
            h = base + pos
            if _tar_zero_block(h):
                break
            if _tar_number(h + 148, 8, &stored) != TAR_OK or not _tar_checksum_ok(h, stored):
                status = TAR_BAD_CHECKSUM
                break
            if _tar_number(h + 124, 12, &size) != TAR_OK:
                status = TAR_BAD_NUMBER
                break
            kind = h[156]
            if pax_size >= 0 and kind != 0x78:
                size = pax_size
            payload = pos + TAR_BLOCK
            if payload + size > n:
                status = TAR_TRUNCATED
                break
            if kind == 0x4C:  # GNU long name for the next member
                long_off = payload
                long_len = _tar_strnlen(base + payload, size)
            elif kind == 0x78:  # pax header for the next member
                status = _tar_pax(base + payload, size, payload, &pax_off, &pax_len, &pax_size)
                if status != TAR_OK:
                    break
            elif kind == 0x67 or kind == 0x4B:  # pax global header, GNU long link name: not names of files
                pass
            else:
                if kind == 0x30 or kind == 0 or kind == 0x37:
                    if rows == capacity:
                        status = TAR_FULL
                        break
                    out[rows, 0] = pos
                    out[rows, 1] = payload
                    out[rows, 2] = size
                    ustar = h[257] == 0x75 and h[258] == 0x73 and h[259] == 0x74 and h[260] == 0x61 and h[261] == 0x72 and h[262] == 0
                    if pax_off >= 0:
                        out[rows, 3] = 0
                        out[rows, 4] = 0
                        out[rows, 5] = pax_off
                        out[rows, 6] = pax_len
                    elif long_off >= 0:
                        out[rows, 3] = 0
                        out[rows, 4] = 0
                        out[rows, 5] = long_off
                        out[rows, 6] = long_len
                    else:
                        prefix_len = _tar_strnlen(h + 345, 155) if ustar else 0
                        out[rows, 3] = pos + 345 if prefix_len else 0
                        out[rows, 4] = prefix_len
                        out[rows, 5] = pos
                        out[rows, 6] = _tar_strnlen(h, 100)
                    rows += 1
                long_off = -1
                pax_off = -1
                pax_size = -1
            pos = payload + ((size + TAR_BLOCK - 1) // TAR_BLOCK) * TAR_BLOCK
    return rows, status, pos


# -- pixels: decoded 8-bit pixels to finished values in a batch slot, in one pass ---------------
#
# Each source channel goes through a 256-entry table to linear light (the profile's tone curve),
# the three channels through one 3x3 matrix (source colorants to the output space, composed in
# Python), then through the output encoding, a per-channel affine map (Coefs) and the store. A row
# at a time: the first stage gathers, the later ones are straight loops the compiler vectorises.

cdef enum:
    PIXELS_ENCODE_SRGB = 0    # clip to [0, 1], then the sRGB curve from a table
    PIXELS_ENCODE_LINEAR = 1  # clip to [0, 1]
    PIXELS_ENCODE_OKLAB = 2   # cube root, then a second matrix; no clipping (Oklab holds any gamut)

ctypedef fused pixel_out_t:
    uint8_t
    float


cdef inline float _clip01(float v) noexcept nogil:
    return 0.0 if v < 0.0 else (1.0 if v > 1.0 else v)


cdef inline float _cube_root(float x) noexcept nogil:
    # A bit-level first guess, then two Halley steps (cubic convergence: 5% -> 1e-4 -> 1e-12).
    cdef float sign = 1.0
    cdef float y, y3
    cdef unsigned int bits
    if x == 0.0:
        return 0.0
    if x < 0.0:
        sign = -1.0
        x = -x
    memcpy(&bits, &x, 4)
    bits = bits // 3 + 709921077
    memcpy(&y, &bits, 4)
    y3 = y * y * y
    y = y * (y3 + 2.0 * x) / (2.0 * y3 + x)
    y3 = y * y * y
    y = y * (y3 + 2.0 * x) / (2.0 * y3 + x)
    return sign * y


def convert_pixels(const unsigned char[:, :, ::1] src, pixel_out_t[:, :, ::1] out, bint chw,
                   const float[:, ::1] lin, const float[:, ::1] matrix, int encode,
                   const float[::1] curve, const unsigned char[::1] byte_curve, const float[:, ::1] second,
                   const float[::1] scale, const float[::1] offset):
    """Convert ``src`` (H, W, 1-4 channels of uint8: L, LA, RGB or RGBA) into ``out``.

    ``out`` is (H, W, C) or, with ``chw``, (C, H, W), C-contiguous, uint8 or float32, with C = 3
    or 4 (the 4th channel is alpha, 255 where the source has none). ``lin`` (3, 256) maps each
    code to linear light per channel; ``matrix`` (3, 3) maps linear source RGB to the output
    space; ``encode`` is 0 (sRGB curve: ``curve`` holds the curve at ``len(curve) - 1`` equal
    intervals of [0, 1]), 1 (linear) or 2 (Oklab: cube root, then ``second``). Channel c is then
    stored as ``value * scale[c] + offset[c]``, rounded and saturated for uint8. Values before
    scaling are fractions (1.0 is white, or alpha 255). For uint8 sRGB output with scale 255 and
    offset 0, a non-empty ``byte_curve`` (the final code of clipped linear light at
    ``len(byte_curve) - 1`` equal intervals) replaces the curve, interpolation and rounding.
    """
    cdef Py_ssize_t height = src.shape[0], width = src.shape[1], channels = src.shape[2]
    cdef Py_ssize_t out_channels = out.shape[0] if chw else out.shape[2]
    cdef Py_ssize_t out_height = out.shape[1] if chw else out.shape[0]
    cdef Py_ssize_t out_width = out.shape[2] if chw else out.shape[1]
    if out_height != height or out_width != width:
        raise ValueError(f"pixels are {height}x{width} but the output is {out_height}x{out_width}")
    if not 1 <= channels <= 4 or out_channels not in (3, 4):
        raise ValueError(f"cannot convert {channels} channels into {out_channels}")
    if lin.shape[0] != 3 or lin.shape[1] != 256 or matrix.shape[0] != 3 or matrix.shape[1] != 3:
        raise ValueError("lin must be (3, 256) and matrix (3, 3)")
    if encode == PIXELS_ENCODE_SRGB and curve.shape[0] < 2:
        raise ValueError("the sRGB encoding needs a curve table")
    if encode == PIXELS_ENCODE_OKLAB and (second.shape[0] != 3 or second.shape[1] != 3):
        raise ValueError("the Oklab encoding needs a (3, 3) second matrix")
    if not 0 <= encode <= 2:
        raise ValueError(f"unknown encoding {encode}")
    if scale.shape[0] < out_channels or offset.shape[0] < out_channels:
        raise ValueError(f"scale and offset need {out_channels} entries")
    if height == 0 or width == 0:
        return
    cdef Py_ssize_t green = 1 if channels >= 3 else 0
    cdef Py_ssize_t blue = 2 if channels >= 3 else 0
    cdef Py_ssize_t alpha = 3 if channels == 4 else (1 if channels == 2 else -1)
    cdef Py_ssize_t intervals = curve.shape[0] - 1
    cdef Py_ssize_t plane = height * width
    cdef float m[9]
    cdef float n[9]
    cdef float sc[4]
    cdef float of[4]
    cdef Py_ssize_t k, y, x, c, i
    for k in range(9):
        m[k] = matrix[k // 3, k % 3]
        n[k] = second[k // 3, k % 3] if encode == PIXELS_ENCODE_OKLAB else 0.0
    for k in range(out_channels):
        sc[k] = scale[k]
        of[k] = offset[k]
    # 8-bit sRGB output with no affine map: clipped linear light indexes a table of final codes.
    cdef bint direct = (pixel_out_t is uint8_t and encode == PIXELS_ENCODE_SRGB and byte_curve.shape[0] > 1
                        and sc[0] == 255.0 and sc[1] == 255.0 and sc[2] == 255.0
                        and of[0] == 0.0 and of[1] == 0.0 and of[2] == 0.0)
    cdef const unsigned char* codes = &byte_curve[0] if direct else NULL
    cdef float code_steps = byte_curve.shape[0] - 1
    cdef float position
    cdef const float* lin0 = &lin[0, 0]
    cdef const float* lin1 = &lin[1, 0]
    cdef const float* lin2 = &lin[2, 0]
    cdef const float* table = &curve[0] if curve.shape[0] > 0 else NULL
    cdef float* row = <float*>malloc(4 * width * sizeof(float))
    if row == NULL:
        raise MemoryError()
    cdef const unsigned char* s
    cdef pixel_out_t* o = &out[0, 0, 0]
    cdef pixel_out_t* dest
    cdef float r, g, b, a, scaled
    cdef Py_ssize_t step = 1 if chw else out_channels
    with nogil:
        for y in range(height):
            s = &src[y, 0, 0]
            for x in range(width):  # gather: tables and matrix
                r = lin0[s[0]]
                g = lin1[s[green]]
                b = lin2[s[blue]]
                row[4 * x] = m[0] * r + m[1] * g + m[2] * b
                row[4 * x + 1] = m[3] * r + m[4] * g + m[5] * b
                row[4 * x + 2] = m[6] * r + m[7] * g + m[8] * b
                row[4 * x + 3] = s[alpha] * (1.0 / 255.0) if alpha >= 0 else 1.0
                s += channels
            if encode == PIXELS_ENCODE_OKLAB:
                for x in range(width):
                    r = _cube_root(row[4 * x])
                    g = _cube_root(row[4 * x + 1])
                    b = _cube_root(row[4 * x + 2])
                    row[4 * x] = n[0] * r + n[1] * g + n[2] * b
                    row[4 * x + 1] = n[3] * r + n[4] * g + n[5] * b
                    row[4 * x + 2] = n[6] * r + n[7] * g + n[8] * b
            elif not direct:
                for i in range(4 * width):
                    if i % 4 != 3:
                        row[i] = _clip01(row[i])
                if encode == PIXELS_ENCODE_SRGB:
                    for i in range(4 * width):
                        if i % 4 != 3:
                            position = row[i] * intervals
                            k = <Py_ssize_t>position
                            row[i] = table[k] if k >= intervals else table[k] + (position - k) * (table[k + 1] - table[k])
            for c in range(out_channels):  # store: one channel at a time, HWC or CHW
                dest = o + (c * plane + y * width if chw else (y * width) * out_channels + c)
                if direct and c < 3:
                    for x in range(width):
                        dest[x * step] = codes[<Py_ssize_t>(_clip01(row[4 * x + c]) * code_steps + 0.5)]
                    continue
                for x in range(width):
                    scaled = row[4 * x + c] * sc[c] + of[c]
                    if pixel_out_t is float:
                        dest[x * step] = scaled
                    else:
                        dest[x * step] = <unsigned char>(0.0 if scaled < 0.0 else (255.0 if scaled > 254.5 else scaled + 0.5))
    free(row)
