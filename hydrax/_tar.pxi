# Tar kernels, included by _core.pyx: reading the structure of a tar shard without its payloads.
#
# scan_tar walks the 512-byte headers (ustar prefixes, GNU long names, pax records, checksums);
# index_tar groups the members into WebDataset samples in the same walk; check_index tells whether
# the arrays of a loaded index hang together. They are kernels because their work is per member
# (per header, per entry), and a shard can hold many small members: in C, without the GIL, no
# member costs a Python object. ``hydrax.shards.tarindex`` keeps the readable reference.

from libc.stdint cimport int32_t, uint64_t
from libc.stdlib cimport calloc, realloc
from libc.string cimport memcmp, memset

import numpy as np


# -- tar header scanning -------------------------------------------------------------------------

cdef enum:
    TAR_BLOCK = 512
    TAR_OK = 0
    TAR_BAD_CHECKSUM = 1
    TAR_TRUNCATED = 2
    TAR_BAD_NUMBER = 3
    TAR_BAD_PAX = 4
    TAR_FULL = 5
    TAR_DUPLICATE_FIELD = 6
    TAR_FALLBACK = 7
    TAR_ZERO_BLOCK = 8
    TAR_MEMBER = 100  # _tar_next found a regular file
    TAR_NO_MEMORY = 101

# What a number field too large for any shard reads as. Saturating (instead of wrapping around to
# a negative size, which would move the scan backwards forever) turns an absurd size into
# "truncated", as the Python twin's exact integers do.
cdef int64_t TAR_HUGE = (<int64_t>1) << 62


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
            if value >= (TAR_HUGE >> 8):
                out[0] = TAR_HUGE
                return TAR_OK
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


cdef inline int64_t _tar_decimal_step(int64_t value, unsigned char digit) noexcept nogil:
    # value * 10 + digit, saturating at TAR_HUGE
    if value > (TAR_HUGE - (digit - 0x30)) // 10:
        return TAR_HUGE
    return value * 10 + (digit - 0x30)


cdef inline bint _tar_checksum_ok(const unsigned char* p, int64_t stored) noexcept nogil:
    # The checksum field itself counts as eight spaces; old writers summed signed chars.
    cdef int64_t unsigned_sum = 0
    cdef int64_t signed_sum = 0
    cdef int i
    for i in range(TAR_BLOCK):
        unsigned_sum += p[i]
        signed_sum += <signed char>p[i]
    for i in range(148, 156):
        unsigned_sum += 0x20 - p[i]
        signed_sum += 0x20 - <signed char>p[i]
    return stored == unsigned_sum or stored == signed_sum


cdef inline bint _tar_header_ok(const unsigned char* p) noexcept nogil:
    cdef int64_t stored = 0
    return _tar_number(p + 148, 8, &stored) == TAR_OK and _tar_checksum_ok(p, stored)


cdef inline Py_ssize_t _tar_strnlen(const unsigned char* p, Py_ssize_t width) noexcept nogil:
    cdef Py_ssize_t n = 0
    while n < width and p[n] != 0:
        n += 1
    return n


cdef int _tar_pax(const unsigned char* p, Py_ssize_t length, Py_ssize_t base,
                  int64_t* path_off, int64_t* path_len, int64_t* size) noexcept nogil:
    # Records are "LEN key=value\n", LEN counting the whole record.
    cdef Py_ssize_t pos = 0, k, eq
    cdef int64_t rec
    while pos < length:
        rec = 0
        k = pos
        while k < length and 0x30 <= p[k] <= 0x39:
            rec = _tar_decimal_step(rec, p[k])
            k += 1
        if rec == 0:
            if _tar_strnlen(p + pos, length - pos) == 0:
                return TAR_OK  # NUL padding at the end
            return TAR_BAD_PAX
        if k >= length or p[k] != 0x20 or rec > length - pos or p[pos + rec - 1] != 0x0A:
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
                size[0] = _tar_decimal_step(size[0], p[k])
                k += 1
        pos += rec
    return TAR_OK


cdef struct TarCursor:
    const unsigned char* base
    Py_ssize_t n
    Py_ssize_t pos         # the next header; after the end or an error, the header concerned
    # the regular file found last:
    Py_ssize_t header
    Py_ssize_t payload
    int64_t size
    Py_ssize_t prefix_at   # ustar prefix (0, 0 when none)
    Py_ssize_t prefix_len
    Py_ssize_t name_at     # the header's name, or the GNU long name or pax path that replaced it
    Py_ssize_t name_len


cdef int _tar_next(TarCursor* c) noexcept nogil:
    """Walk to the next regular file: TAR_MEMBER (``c`` describes it), TAR_OK at the
    end-of-archive block, else an error code (``c.pos`` is the offending header).

    GNU long names and pax records apply to the next entry only, so they live in this call.
    """
    cdef const unsigned char* h
    cdef int64_t size = 0, long_off = -1, long_len = 0, pax_off = -1, pax_len = 0, pax_size = -1
    cdef Py_ssize_t payload, following
    cdef unsigned char kind
    cdef int status
    cdef bint ustar
    while True:
        if c.pos + TAR_BLOCK > c.n:  # also no end-of-archive block at all: a cut-off shard
            return TAR_TRUNCATED
        h = c.base + c.pos
        if _tar_zero_block(h):
            # The end is two zero blocks (or one at the very end of the data). One zero block
            # with data after it is a header wiped in the middle of the shard, and stopping
            # there would lose every member after it without a word.
            if c.pos + 2 * TAR_BLOCK <= c.n and not _tar_zero_block(h + TAR_BLOCK):
                return TAR_ZERO_BLOCK
            return TAR_OK
        if not _tar_header_ok(h):
            return TAR_BAD_CHECKSUM
        if _tar_number(h + 124, 12, &size) != TAR_OK:
            return TAR_BAD_NUMBER
        kind = h[156]
        if pax_size >= 0 and kind != 0x78:
            size = pax_size
        payload = c.pos + TAR_BLOCK
        if size > c.n - payload:
            return TAR_TRUNCATED
        following = payload + ((size + TAR_BLOCK - 1) // TAR_BLOCK) * TAR_BLOCK
        if kind == 0x4C:  # GNU long name for the next member
            long_off = payload
            long_len = _tar_strnlen(c.base + payload, size)
        elif kind == 0x78:  # pax header for the next member
            status = _tar_pax(c.base + payload, size, payload, &pax_off, &pax_len, &pax_size)
            if status != TAR_OK:
                return status
        elif kind == 0x67 or kind == 0x4B:  # pax global header, GNU long link name: not names of files
            pass
        elif kind == 0x30 or kind == 0 or kind == 0x37:
            c.header = c.pos
            c.payload = payload
            c.size = size
            c.prefix_at = 0
            c.prefix_len = 0
            if pax_off >= 0:
                c.name_at = pax_off
                c.name_len = pax_len
            elif long_off >= 0:
                c.name_at = long_off
                c.name_len = long_len
            else:
                ustar = h[257] == 0x75 and h[258] == 0x73 and h[259] == 0x74 and h[260] == 0x61 and h[261] == 0x72 and h[262] == 0
                if ustar:
                    c.prefix_len = _tar_strnlen(h + 345, 155)
                    c.prefix_at = c.pos + 345 if c.prefix_len else 0
                c.name_at = c.pos
                c.name_len = _tar_strnlen(h, 100)
            c.pos = following
            return TAR_MEMBER
        else:  # directories, links, devices: not samples, and the end of any pending long name
            long_off = -1
            pax_off = -1
            pax_size = -1
        c.pos = following


def scan_tar(const unsigned char[::1] data, int64_t[:, ::1] out):
    """Scan the headers of the tar archive in ``data``; never read a member's payload.

    One row of ``out`` per regular file, in archive order: header offset, payload offset, payload
    size, then where the name is: prefix offset and length (ustar ``prefix``, else 0, 0) and name
    offset and length (the header's ``name``, or the GNU ``L`` or pax ``path`` record that
    replaced it). Returns ``(rows, status, offset)``: status 0 when the archive ended with its
    end-of-archive zero block, else an error code and the byte offset of the offending header
    (1 bad checksum, 2 truncated or no end-of-archive block, 3 bad number field, 4 bad pax
    record, 5 ``out`` is full, 8 a single zero block with data after it: a header wiped in the
    middle of the archive, where the end would be two zero blocks). A number field too large for any archive reads as 2**62.
    """
    cdef TarCursor c
    cdef Py_ssize_t capacity = out.shape[0], rows = 0
    cdef int status = TAR_OK
    if out.shape[1] < 7:
        raise ValueError(f"out must have 7 columns, has {out.shape[1]}")
    c.base = &data[0] if data.shape[0] else NULL
    c.n = data.shape[0]
    c.pos = 0
    with nogil:
        while True:
            status = _tar_next(&c)
            if status != TAR_MEMBER:
                break
            if rows == capacity:
                status = TAR_FULL
                c.pos = c.header
                break
            out[rows, 0] = c.header
            out[rows, 1] = c.payload
            out[rows, 2] = c.size
            out[rows, 3] = c.prefix_at
            out[rows, 4] = c.prefix_len
            out[rows, 5] = c.name_at
            out[rows, 6] = c.name_len
            rows += 1
    return rows, status, c.pos


# -- tar index: headers and WebDataset samples in one pass ---------------------------------------

cdef struct Growing:
    char* data
    size_t used       # bytes
    size_t capacity   # bytes


cdef int _reserve(Growing* b, size_t extra) noexcept nogil:
    # 0, or -1 when memory ran out
    cdef size_t want = b.used + extra
    cdef size_t capacity = b.capacity if b.capacity else 256
    cdef char* grown
    if want <= b.capacity:
        return 0
    if want < b.used or want > (<size_t>-1) // 4:  # more than any archive can need; doubling would wrap
        return -1
    while capacity < want:
        capacity *= 2
    grown = <char*>realloc(b.data, capacity)
    if grown == NULL:
        return -1
    b.data = grown
    b.capacity = capacity
    return 0


cdef inline int _push(Growing* b, const void* item, size_t size) noexcept nogil:
    if _reserve(b, size):
        return -1
    memcpy(b.data + b.used, item, size)
    b.used += size
    return 0


cdef struct TarSamples:
    Growing keys          # key bytes, concatenated
    Growing key_ends      # int64 per sample
    Growing sample_ends   # int64 per sample: the end of its run of entries
    Growing entry_field   # int32 per entry
    Growing entry_offset  # int64 per entry
    Growing entry_size    # int64 per entry
    Growing field_text    # the distinct fields, lower-cased, concatenated
    Growing field_ends    # int64 per field
    Growing field_hash    # uint64 per field
    Growing field_last    # int64 per field: the last sample that has it (duplicates in O(1))
    int32_t* slots        # open addressing over the fields: field id + 1, 0 when free
    size_t slot_count     # a power of two, more than twice the number of fields
    int64_t samples
    int64_t entries
    int64_t fields
    int64_t key_start     # where the last sample's key starts in ``keys``


cdef void _free_samples(TarSamples* t) noexcept nogil:
    free(t.keys.data)
    free(t.key_ends.data)
    free(t.sample_ends.data)
    free(t.entry_field.data)
    free(t.entry_offset.data)
    free(t.entry_size.data)
    free(t.field_text.data)
    free(t.field_ends.data)
    free(t.field_hash.data)
    free(t.field_last.data)
    free(t.slots)


cdef int _grow_slots(TarSamples* t) noexcept nogil:
    cdef size_t count = t.slot_count * 2 if t.slot_count else 64
    cdef int32_t* slots = <int32_t*>calloc(count, sizeof(int32_t))
    cdef const uint64_t* hashes = <const uint64_t*>t.field_hash.data
    cdef int64_t f
    cdef size_t j
    if slots == NULL:
        return -1
    for f in range(t.fields):
        j = hashes[f] & (count - 1)
        while slots[j]:
            j = (j + 1) & (count - 1)
        slots[j] = <int32_t>(f + 1)
    free(t.slots)
    t.slots = slots
    t.slot_count = count
    return 0


cdef int64_t _intern_field(TarSamples* t, const unsigned char* field, Py_ssize_t length, uint64_t hash) noexcept nogil:
    # The id of ``field`` (compared lower-cased), added when new; -1 when memory ran out.
    cdef size_t j
    cdef int64_t f, start
    cdef Py_ssize_t i
    cdef unsigned char c
    cdef const int64_t* ends
    cdef unsigned char* text
    if (t.fields + 1) * 2 > <int64_t>t.slot_count and _grow_slots(t):
        return -1
    ends = <const int64_t*>t.field_ends.data
    j = hash & (t.slot_count - 1)
    while t.slots[j]:
        f = t.slots[j] - 1
        start = ends[f - 1] if f else 0
        if (<const uint64_t*>t.field_hash.data)[f] == hash and ends[f] - start == length:
            text = <unsigned char*>t.field_text.data + start
            i = 0
            while i < length:
                c = field[i]
                if 0x41 <= c <= 0x5A:
                    c += 0x20
                if c != text[i]:
                    break
                i += 1
            if i == length:
                return f
        j = (j + 1) & (t.slot_count - 1)
    f = t.fields
    start = t.field_text.used
    if _reserve(&t.field_text, length):
        return -1
    text = <unsigned char*>t.field_text.data + start
    for i in range(length):
        c = field[i]
        text[i] = c + 0x20 if 0x41 <= c <= 0x5A else c
    t.field_text.used += length
    start += length
    if _push(&t.field_ends, &start, 8) or _push(&t.field_hash, &hash, 8):
        return -1
    start = -1
    if _push(&t.field_last, &start, 8):
        return -1
    t.slots[j] = <int32_t>(f + 1)
    t.fields += 1
    return f


cdef int _group_member(TarSamples* t, const unsigned char* name, Py_ssize_t length,
                       int64_t payload, int64_t size) noexcept nogil:
    # WebDataset's rules for one member (hydrax.shards.group_samples is the reference):
    # TAR_OK (grouped or skipped), TAR_DUPLICATE_FIELD, TAR_FALLBACK or TAR_NO_MEMORY.
    cdef Py_ssize_t i, first = length, slash = -1, dot = -1, field_len
    cdef int64_t f, end
    cdef int32_t field_id
    cdef uint64_t hash = 14695981039346656037ULL  # FNV-1a over the lower-cased field
    cdef unsigned char c
    cdef const unsigned char* field
    for i in range(length):
        if name[i] == 0x2F:
            first = i
            break
    if first > 4 and name[0] == 0x5F and name[1] == 0x5F and name[first - 2] == 0x5F and name[first - 1] == 0x5F:
        return TAR_OK  # metadata such as __index__/...
    i = length - 1
    while i >= 0 and name[i] != 0x2F:
        i -= 1
    slash = i
    for i in range(slash + 1, length):
        if name[i] == 0x2E:
            dot = i
            break
    if dot < 0:
        return TAR_OK  # no extension: not part of a sample
    if dot == slash + 1:
        # A basename that starts with a dot: WebDataset's pattern then makes the folder path the
        # key ("dir/.x.jpg" has key "dir/"), provided the folder's own name has no dot.
        if slash < 0:
            return TAR_OK
        i = slash - 1
        while i >= 0 and name[i] != 0x2F:
            if name[i] == 0x2E:
                return TAR_OK
            i -= 1
    field = name + dot + 1
    field_len = length - dot - 1
    for i in range(field_len):
        c = field[i]
        if c >= 0x80:
            return TAR_FALLBACK  # Python lower-cases non-ASCII letters too: its job
        if 0x41 <= c <= 0x5A:
            c += 0x20
        hash = (hash ^ c) * 1099511628211ULL
    if (t.samples == 0 or <int64_t>t.keys.used - t.key_start != dot
            or memcmp(t.keys.data + t.key_start, name, dot) != 0):
        t.key_start = t.keys.used
        end = t.keys.used + dot
        if _push(&t.keys, name, dot) or _push(&t.key_ends, &end, 8) or _push(&t.sample_ends, &t.entries, 8):
            return TAR_NO_MEMORY
        t.samples += 1
    if t.fields >= 0x7FFFFFFF:
        return TAR_FALLBACK  # more distinct fields than int32 ids
    f = _intern_field(t, field, field_len, hash)
    if f < 0:
        return TAR_NO_MEMORY
    if (<int64_t*>t.field_last.data)[f] == t.samples - 1:
        return TAR_DUPLICATE_FIELD
    (<int64_t*>t.field_last.data)[f] = t.samples - 1
    field_id = <int32_t>f
    if _push(&t.entry_field, &field_id, 4) or _push(&t.entry_offset, &payload, 8) or _push(&t.entry_size, &size, 8):
        return TAR_NO_MEMORY
    t.entries += 1
    (<int64_t*>t.sample_ends.data)[t.samples - 1] = t.entries
    return TAR_OK


cdef object _tar_array(Growing* b, object dtype):
    out = np.empty(b.used // np.dtype(dtype).itemsize, dtype)
    cdef unsigned char[::1] raw
    if b.used:
        raw = out.view(np.uint8)
        memcpy(&raw[0], b.data, b.used)
    return out


def index_tar(const unsigned char[::1] data):
    """Scan the tar archive in ``data`` and group its members into WebDataset samples, in one pass.

    Headers are read as :func:`scan_tar` reads them; the rules are those of
    ``hydrax.shards.group_samples``: the key is the member path up to the first dot of its
    basename, the field the rest, lower-cased; members without such a dot and metadata members
    (first path component ``__…__``) are skipped; consecutive members with one key form a
    sample. Returns ``(status, offset, fields, key_bytes, key_ends, sample_ends, entry_field,
    entry_offset, entry_size)``: the distinct fields (lower-cased bytes, in order of first use),
    then the arrays a ``ShardIndex`` holds (uint8, int64, int64, int32, int64, int64), as far as
    grouping got. Status 0 is success; 1-4 and 8 are :func:`scan_tar`'s errors, at the offending
    header's ``offset``; 6 a field twice in one sample, 7 a field with a non-ASCII byte (left to
    the Python rules), both at that member's payload ``offset``. Grouping stops at the first 6
    or 7 but the scan goes on, so a header error anywhere takes precedence, as it does for
    ``scan_members`` followed by ``group_samples``.
    """
    cdef TarCursor c
    cdef TarSamples t
    cdef int status = TAR_OK, grouped = TAR_OK
    cdef int64_t held_at = 0
    cdef unsigned char joined[257]  # ustar prefix + "/" + name: at most 155 + 1 + 100 bytes
    cdef const unsigned char* name
    cdef Py_ssize_t length
    memset(&t, 0, sizeof(TarSamples))
    c.base = &data[0] if data.shape[0] else NULL
    c.n = data.shape[0]
    c.pos = 0
    try:
        with nogil:
            while True:
                status = _tar_next(&c)
                if status != TAR_MEMBER:
                    break
                if grouped != TAR_OK:
                    continue
                name = c.base + c.name_at
                length = c.name_len
                if c.prefix_len:
                    memcpy(joined, c.base + c.prefix_at, c.prefix_len)
                    joined[c.prefix_len] = 0x2F
                    memcpy(joined + c.prefix_len + 1, name, length)
                    name = joined
                    length += c.prefix_len + 1
                grouped = _group_member(&t, name, length, c.payload, c.size)
                if grouped == TAR_NO_MEMORY:
                    break
                held_at = c.payload
        if grouped == TAR_NO_MEMORY:
            raise MemoryError("out of memory indexing a tar archive")
        offset = c.pos
        if status == TAR_OK and grouped != TAR_OK:
            status = grouped
            offset = held_at
        text = t.field_text.data[:t.field_text.used] if t.field_text.used else b""
        ends = _tar_array(&t.field_ends, np.int64).tolist()
        fields = [text[(ends[f - 1] if f else 0):ends[f]] for f in range(len(ends))]
        return (status, offset, fields, _tar_array(&t.keys, np.uint8), _tar_array(&t.key_ends, np.int64),
                _tar_array(&t.sample_ends, np.int64), _tar_array(&t.entry_field, np.int32),
                _tar_array(&t.entry_offset, np.int64), _tar_array(&t.entry_size, np.int64))
    finally:
        _free_samples(&t)


def check_index(const int64_t[::1] key_ends, const int64_t[::1] sample_ends, const int32_t[::1] entry_field,
                const int64_t[::1] entry_offset, const int64_t[::1] entry_size, int64_t key_bytes, int64_t fields,
                int64_t shard_size):
    """The first thing wrong with the arrays of a shard index, or 0 when they hang together.

    1: ``key_ends`` do not rise (never fall) from 0 to ``key_bytes``; 2: ``sample_ends`` do not
    rise strictly (every sample has a field) to the number of entries; 3: an entry's field number
    is outside ``[0, fields)``; 4: an entry's ``[offset, offset + size)`` is not inside
    ``[0, shard_size)``; 5: ``key_ends`` and ``sample_ends``, or the three entry arrays, differ in
    length. One pass, so loading an index costs microseconds whatever its size.
    """
    cdef Py_ssize_t samples = sample_ends.shape[0], entries = entry_field.shape[0], i
    cdef int64_t previous = 0, offset, size
    cdef int problem = 0
    if key_ends.shape[0] != samples or entry_offset.shape[0] != entries or entry_size.shape[0] != entries:
        return 5
    with nogil:
        for i in range(samples):
            if key_ends[i] < previous:
                problem = 1
                break
            previous = key_ends[i]
        if problem == 0 and previous != key_bytes:
            problem = 1
        previous = 0
        if problem == 0:
            for i in range(samples):
                if sample_ends[i] <= previous:
                    problem = 2
                    break
                previous = sample_ends[i]
            if problem == 0 and previous != entries:
                problem = 2
        if problem == 0:
            for i in range(entries):
                if entry_field[i] < 0 or entry_field[i] >= fields:
                    problem = 3
                    break
        if problem == 0:
            for i in range(entries):
                offset = entry_offset[i]
                size = entry_size[i]
                if offset < 0 or size < 0 or size > shard_size - offset:
                    problem = 4
                    break
    return problem
