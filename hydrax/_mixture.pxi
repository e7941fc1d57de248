# Mixture kernel, included by _core.pyx: which source, and which position of its stream, each
# shuffled slot of a mixture's batches holds (see hydrax/order/mixing.py for the layout).
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
    if batch_size < 1 or sources < 1 or batches < 1:
        raise ValueError("a mixture needs a batch size, a source and a batch")
    cdef Py_ssize_t bad = -1
    if count == 0:
        return
    with nogil:
        bad = _place_slots(&slots[0], count, batch_size, &ends[0, 0], &before[0, 0], sources, batches, &epoch_start[0],
                           &source[0], &stream[0])
    if bad >= 0:
        raise ValueError(f"slot {slots[bad]} (at index {bad}) is outside the block's {batches} batches of {batch_size}, "
                         f"or the layout's tables are inconsistent")


def mixture_locate(const int64_t[::1] items not None, const int64_t[::1] offsets not None,
                   int64_t[::1] source not None, int64_t[::1] local not None):
    """Store the source of each of a mixture's ``items`` in ``source`` and its index within that
    source in ``local``: ``offsets`` holds where each source's items start, then their total,
    ascending; source ``s`` is the last whose start is at most the item (an empty source owns
    nothing). Returns the index of the first item outside ``[0, offsets[-1])``, else -1 (the
    entries from that index on are then unspecified). Raises ValueError for mismatched shapes or
    ``offsets`` that do not start at 0 and ascend."""
    cdef Py_ssize_t count = items.shape[0], bounds = offsets.shape[0], s, bad = -1
    if source.shape[0] != count or local.shape[0] != count:
        raise ValueError(f"{count} items but room for {source.shape[0]} sources and {local.shape[0]} indices")
    if bounds < 2 or offsets[0] != 0:
        raise ValueError("offsets must start at 0 and end with the mixture's length")
    for s in range(1, bounds):
        if offsets[s] < offsets[s - 1]:
            raise ValueError(f"offsets descend at {s}")
    if count:
        with nogil:
            bad = _locate(&items[0], count, &offsets[0], bounds, &source[0], &local[0])
    return bad


cdef Py_ssize_t _locate(const int64_t* items, Py_ssize_t count, const int64_t* offsets, Py_ssize_t bounds,
                        int64_t* source, int64_t* local) noexcept nogil:
    # A binary search per item over the few sources' starts; the first item out of range, or -1.
    cdef Py_ssize_t i, low, high, middle
    cdef int64_t item, total = offsets[bounds - 1]
    for i in range(count):
        item = items[i]
        if item < 0 or item >= total:
            return i
        low, high = 0, bounds - 1  # offsets[low] <= item < offsets[high]
        while high - low > 1:
            middle = (low + high) // 2
            if offsets[middle] <= item:
                low = middle
            else:
                high = middle
        source[i] = low
        local[i] = item - offsets[low]
    return -1


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


cdef class MixtureBlock:
    """The tables of one block of a mixture's batches, held for :meth:`fill` (a worker fills a
    batch's items with one call that converts no arrays): the shuffle keys of the block's runs
    (row 0: run ``first_run``), the layout's ``ends`` and ``before`` from batch
    ``block_first_batch`` on, each source's epoch start, size, first item and passes' keys (as
    for :func:`mixture_items`). Every source must be permuted item by item.
    """

    cdef readonly int64_t batch_size, run_batches, batch_count, block_first_batch, first_run
    cdef const uint64_t[:, ::1] shuffle_keys
    cdef const int64_t[:, ::1] ends
    cdef const int64_t[:, ::1] before
    cdef const int64_t[::1] epoch_start
    cdef const int64_t[::1] sizes
    cdef const int64_t[::1] offsets
    cdef const int64_t[::1] first_pass
    cdef const int64_t[::1] key_rows
    cdef const uint64_t[:, ::1] pass_keys

    def __init__(self, int64_t batch_size, int64_t run_batches, int64_t batch_count, int64_t block_first_batch,
                 int64_t first_run, const uint64_t[:, ::1] shuffle_keys not None, const int64_t[:, ::1] ends not None,
                 const int64_t[:, ::1] before not None, const int64_t[::1] epoch_start not None,
                 const int64_t[::1] sizes not None, const int64_t[::1] offsets not None,
                 const int64_t[::1] first_pass not None, const int64_t[::1] key_rows not None,
                 const uint64_t[:, ::1] pass_keys not None):
        cdef Py_ssize_t sources = ends.shape[0]
        if batch_size < 1 or run_batches < 1 or sources < 1 or ends.shape[1] < 1 or shuffle_keys.shape[0] == 0 or \
                shuffle_keys.shape[1] == 0:
            raise ValueError("a mixture needs a batch size, runs of batches, a source, a batch and shuffle keys")
        if before.shape[0] != sources or before.shape[1] != ends.shape[1] or epoch_start.shape[0] != sources:
            raise ValueError("the layout's tables do not match")
        if sizes.shape[0] != sources or offsets.shape[0] != sources or first_pass.shape[0] != sources or \
                key_rows.shape[0] != sources + 1:
            raise ValueError(f"{sources} sources need as many sizes, offsets and first passes and {sources + 1} key rows")
        self.batch_size, self.run_batches, self.batch_count = batch_size, run_batches, batch_count
        self.block_first_batch, self.first_run = block_first_batch, first_run
        self.shuffle_keys, self.ends, self.before, self.epoch_start = shuffle_keys, ends, before, epoch_start
        self.sizes, self.offsets, self.first_pass, self.key_rows, self.pass_keys = sizes, offsets, first_pass, key_rows, pass_keys

    def fill(self, int64_t first, int64_t[::1] out not None):
        """Store in ``out`` the items at epoch positions ``first`` to ``first + len(out) - 1``:
        what :func:`feistel_permute` (each run shuffled with its keys), :func:`mixture_slots` and
        :func:`mixture_items` give one after the other. Raises ValueError for positions outside
        the epoch or the block's runs, and whatever those kernels refuse."""
        cdef Py_ssize_t count = out.shape[0], sources = self.ends.shape[0], batches = self.ends.shape[1], bad = -1
        cdef Py_ssize_t rows = self.pass_keys.shape[0]
        cdef int64_t total = self.batch_count * self.batch_size
        if count == 0:
            return
        if first < 0 or first + count > total:
            raise ValueError(f"positions {first} to {first + count - 1} are not all in the epoch's {total}")
        cdef int64_t* slots = <int64_t*>malloc(count * sizeof(int64_t))
        cdef int64_t* source = <int64_t*>malloc(count * sizeof(int64_t))
        cdef int64_t* stream = <int64_t*>malloc(count * sizeof(int64_t))
        cdef int64_t* scratch = <int64_t*>malloc(3 * count * sizeof(int64_t) + (rows + 2) * sizeof(int64_t))
        if slots == NULL or source == NULL or stream == NULL or scratch == NULL:
            _free_all(slots, source, stream, scratch)
            raise MemoryError()
        with nogil:
            bad = _shuffle_runs(first, count, self.batch_size, self.run_batches * self.batch_size, total,
                                self.block_first_batch * self.batch_size, self.first_run, &self.shuffle_keys[0, 0],
                                self.shuffle_keys.shape[0], self.shuffle_keys.shape[1], slots)
            if bad < 0:
                bad = _place_slots(slots, count, self.batch_size, &self.ends[0, 0], &self.before[0, 0], sources, batches,
                                   &self.epoch_start[0], source, stream)
            if bad < 0:
                bad = _mixture_rows(source, stream, count, &self.sizes[0], &self.first_pass[0], &self.key_rows[0], sources,
                                    rows, scratch, &out[0])
            if bad < 0:
                _mixture_permute(stream, &self.sizes[0], &self.offsets[0], source, count, scratch, rows,
                                 &self.pass_keys[0, 0] if rows else NULL, self.pass_keys.shape[1], scratch + count,
                                 scratch + 2 * count, scratch + 3 * count, &out[0])
        _free_all(slots, source, stream, scratch)
        if bad >= 0:
            raise ValueError(f"position {first + bad} is outside the block's runs, or the layout's tables are inconsistent")


cdef Py_ssize_t _shuffle_runs(int64_t first, int64_t count, int64_t batch_size, int64_t span, int64_t total,
                              int64_t block_first, int64_t first_run, const uint64_t* keys, Py_ssize_t runs,
                              Py_ssize_t rounds, int64_t* slots) noexcept nogil:
    # Each position's slot in the block: shuffled within its run (runs of consecutive positions,
    # so a segment per run); the index of the first bad position, or -1.
    cdef Py_ssize_t i = 0, end, k
    cdef int64_t r, run_first, width
    cdef uint64_t n, top
    cdef unsigned int bits, half
    while i < count:
        r = (first + i) // span
        run_first = r * span
        width = min(span, total - run_first)
        end = min(count, run_first + width - first)
        if r - first_run < 0 or r - first_run >= runs or run_first < block_first:
            return i
        for k in range(i, end):
            slots[k] = first + k - run_first
        n = <uint64_t>width
        if n > 1:
            bits = 0
            top = n - 1
            while top:
                bits += 1
                top >>= 1
            half = (max(bits, 2) + 1) // 2
            _feistel_stream(&slots[i], &slots[i], end - i, keys + (r - first_run) * rounds, rounds, half,
                            ((<uint64_t>1) << half) - 1, n)
        for k in range(i, end):
            slots[k] += run_first - block_first
        i = end
    return -1


cdef Py_ssize_t _place_slots(const int64_t* slots, Py_ssize_t count, int64_t batch_size, const int64_t* ends,
                             const int64_t* before, Py_ssize_t sources, Py_ssize_t batches, const int64_t* epoch_start,
                             int64_t* source, int64_t* stream) noexcept nogil:
    # mixture_slots over raw tables ((sources, batches), row-major); the first bad index, or -1.
    cdef Py_ssize_t i, s
    cdef int64_t b, j, start
    for i in range(count):
        if slots[i] < 0 or slots[i] // batch_size >= batches:
            return i
        b = slots[i] // batch_size
        j = slots[i] % batch_size
        s = 0
        start = 0
        while s < sources and ends[s * batches + b] <= j:
            if ends[s * batches + b] < start:
                break
            start = ends[s * batches + b]
            s += 1
        if s == sources or ends[s * batches + b] < start or ends[(sources - 1) * batches + b] != batch_size:
            return i
        source[i] = s
        stream[i] = epoch_start[s] + before[s * batches + b] + j - start
    return -1
