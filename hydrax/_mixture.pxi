# Mixture kernel, included by _core.pyx: which source, and which position of its stream, each
# shuffled slot of a mixture's batches holds (see hydrax/mixing.py for the layout).
#
# A batch's slots hold source 0's items first, then source 1's, and so on; ends[s, b] is where
# source s's slots of batch b end. The Python layer computes these tables once per block of
# batches; per position this is a short scan over the sources, which numpy would do with a
# temporary array of sources x positions per step. Every table read is checked, so inconsistent
# tables raise instead of reading out of bounds.

from libc.stdint cimport uint64_t

def mixture_slots(const int64_t[::1] slots not None, int64_t batch_size, const int64_t[:, ::1] ends not None,
                  const int64_t[:, ::1] before not None, const int64_t[::1] epoch_start not None,
                  int64_t[::1] source not None, int64_t[::1] stream not None):
    """Store the source of slot ``slots[i]`` (``b * batch_size + j``: slot ``j`` of batch ``b`` of
    a block) in ``source[i]``, and its position in that source's stream in ``stream[i]``:
    ``epoch_start[s] + before[s, b] + j - (ends[s - 1, b] if s else 0)``.

    ``ends`` and ``before`` are ``(sources, batches)``; each column of ``ends`` ascends to
    ``batch_size``. Raises ValueError for mismatched shapes, a slot outside the block, or a
    column of ``ends`` that does not ascend to ``batch_size`` where a slot reads it.
    """
    cdef Py_ssize_t count = slots.shape[0], sources = ends.shape[0], batches = ends.shape[1]
    if before.shape[0] != sources or before.shape[1] != batches or epoch_start.shape[0] != sources:
        raise ValueError(f"ends {ends.shape[0]}x{ends.shape[1]}, before {before.shape[0]}x{before.shape[1]} and "
                         f"{epoch_start.shape[0]} epoch starts do not match")
    if source.shape[0] != count or stream.shape[0] != count:
        raise ValueError(f"{count} slots but room for {source.shape[0]} sources and {stream.shape[0]} stream positions")
    if batch_size < 1 or sources < 1:
        raise ValueError("a mixture needs a batch size and a source")
    cdef Py_ssize_t i, s, bad = -1
    cdef int64_t b, j, start
    with nogil:
        for i in range(count):
            if slots[i] < 0 or slots[i] // batch_size >= batches:
                bad = i
                break
            b = slots[i] // batch_size
            j = slots[i] % batch_size
            s = 0
            start = 0
            while s < sources and ends[s, b] <= j:
                if ends[s, b] < start:
                    break
                start = ends[s, b]
                s += 1
            if s == sources or ends[s, b] < start or ends[sources - 1, b] != batch_size:
                bad = i
                break
            source[i] = s
            stream[i] = epoch_start[s] + before[s, b] + j - start
    if bad >= 0:
        raise ValueError(f"slot {slots[bad]} (at index {bad}) is outside the block's {batches} batches of {batch_size}, "
                         f"or the layout's tables are inconsistent")


def mixture_items(const int64_t[::1] source not None, const int64_t[::1] stream not None,
                  const int64_t[::1] sizes not None, const int64_t[::1] offsets not None,
                  const int64_t[::1] first_pass not None, const int64_t[::1] key_rows not None,
                  const uint64_t[:, ::1] keys not None, int64_t[::1] out not None):
    """Store in ``out[i]`` the mixture's item at position ``stream[i]`` of source ``source[i]``'s
    stream of passes: ``offsets[s] + P(stream % sizes[s])``, ``P`` being :func:`feistel_permute`'s
    permutation of ``[0, sizes[s])`` with the round keys of pass ``t = stream // sizes[s]``, row
    ``key_rows[s] + t - first_pass[s]`` of ``keys``. A source with no rows
    (``key_rows[s] == key_rows[s + 1]``) is left to the caller: ``out[i] = -1``.

    The items are grouped by row before they are permuted, so a call costs one pass of the
    kernel per row however the rows interleave. Raises ValueError for mismatched shapes, a
    source outside the tables, a negative stream position, or a pass without a row.
    """
    cdef Py_ssize_t count = source.shape[0], sources = sizes.shape[0], rows = keys.shape[0]
    cdef Py_ssize_t rounds = keys.shape[1]
    if stream.shape[0] != count or out.shape[0] != count:
        raise ValueError(f"{count} sources, {stream.shape[0]} stream positions and room for {out.shape[0]} items")
    if offsets.shape[0] != sources or first_pass.shape[0] != sources or key_rows.shape[0] != sources + 1:
        raise ValueError(f"{sources} sources need as many offsets and first passes and {sources + 1} key rows")
    if rows and rounds == 0:
        raise ValueError("a permutation needs at least one round key")
    if count == 0:
        return
    cdef int64_t* row = <int64_t*>malloc(count * sizeof(int64_t))
    cdef int64_t* grouped = <int64_t*>malloc(count * sizeof(int64_t))
    cdef int64_t* work = <int64_t*>malloc(count * sizeof(int64_t))
    cdef int64_t* starts = <int64_t*>malloc((rows + 2) * sizeof(int64_t))
    if row == NULL or grouped == NULL or work == NULL or starts == NULL:
        _free_all(row, grouped, work, starts)
        raise MemoryError()
    cdef Py_ssize_t bad = -1
    with nogil:
        bad = _mixture_rows(&source[0], &stream[0], count, &sizes[0], &first_pass[0], &key_rows[0], sources, rows, row, &out[0])
        if bad < 0:
            _mixture_permute(&stream[0], &sizes[0], &offsets[0], &source[0], count, row, rows, &keys[0, 0] if rows else NULL,
                             rounds, grouped, work, starts, &out[0])
    _free_all(row, grouped, work, starts)
    if bad >= 0:
        raise ValueError(f"item {bad} (source {source[bad]}, stream position {stream[bad]}) has no source, pass or key row")


cdef void _free_all(void* a, void* b, void* c, void* d) noexcept:
    free(a)
    free(b)
    free(c)
    free(d)


cdef Py_ssize_t _mixture_rows(const int64_t* source, const int64_t* stream, Py_ssize_t count, const int64_t* sizes,
                              const int64_t* first_pass, const int64_t* key_rows, Py_ssize_t sources, Py_ssize_t rows,
                              int64_t* row, int64_t* out) noexcept nogil:
    # Each item's key row (-1 for a source left to the caller); the index of the first bad item, or -1.
    cdef Py_ssize_t i
    cdef int64_t s, r
    for i in range(count):
        s = source[i]
        if s < 0 or s >= sources or sizes[s] < 1 or stream[i] < 0:
            return i
        if key_rows[s] == key_rows[s + 1]:
            row[i] = -1
            out[i] = -1
            continue
        r = key_rows[s] + stream[i] // sizes[s] - first_pass[s]
        if r < key_rows[s] or r >= key_rows[s + 1] or key_rows[s + 1] > rows:
            return i
        row[i] = r
    return -1


cdef void _mixture_permute(const int64_t* stream, const int64_t* sizes, const int64_t* offsets, const int64_t* source,
                           Py_ssize_t count, const int64_t* row, Py_ssize_t rows, const uint64_t* keys, Py_ssize_t rounds,
                           int64_t* grouped, int64_t* work, int64_t* starts, int64_t* out) noexcept nogil:
    # A counting sort of the items by row, then each row's offsets through the Feistel lanes.
    cdef Py_ssize_t i, r, first, end, k
    cdef int64_t s
    cdef uint64_t n, top
    cdef unsigned int bits, half
    for r in range(rows + 2):
        starts[r] = 0
    for i in range(count):
        if row[i] >= 0:
            starts[row[i] + 2] += 1
    for r in range(2, rows + 2):
        starts[r] += starts[r - 1]
    for i in range(count):  # starts[r + 1]: the next free place of row r
        if row[i] >= 0:
            grouped[starts[row[i] + 1]] = i
            starts[row[i] + 1] += 1
    for r in range(rows):
        first, end = starts[r], starts[r + 1]
        if first == end:
            continue
        s = source[grouped[first]]
        n = <uint64_t>sizes[s]
        for k in range(first, end):
            work[k] = stream[grouped[k]] % sizes[s]
        if n > 1:
            bits = 0
            top = n - 1
            while top:
                bits += 1
                top >>= 1
            half = (max(bits, 2) + 1) // 2
            _feistel_stream(&work[first], &work[first], end - first, keys + r * rounds, rounds, half,
                            ((<uint64_t>1) << half) - 1, n)
        for k in range(first, end):
            out[grouped[k]] = offsets[s] + work[k]
