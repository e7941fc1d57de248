# Permutation kernel, included by _core.pyx: a keyed pseudo-random permutation of [0, n),
# evaluated one position at a time, in O(1) memory.
#
# feistel_permute runs a balanced Feistel network over the smallest even-width power-of-two
# domain that holds n, and cycle-walks back into [0, n): a Feistel network is a bijection
# whatever its round function, so re-applying it to an output that fell outside [0, n) must come
# back inside. An order of 10^10 items (a dataset of 10^10 samples) then costs 64 bytes of round
# keys instead of 80 GB of shuffled indices, and any worker can compute its own task's slice of
# the order. It is a kernel because a data loader asks for millions of positions per epoch and
# numpy would need a temporary array per step of each round.
#
# The algorithm is fixed by its twin in _fallback.py (feistel_permute): the same n, keys and
# positions must give the same indices there and here, on every platform, for as long as orders
# recorded by a run (a resumed epoch) are expected to replay.

from libc.stdint cimport uint64_t


# The splitmix64 finalizer (Steele, Lea and Flood), the round function: cheap, and every input
# bit reaches every output bit, so masking its output to a half-width keeps it well mixed.
cdef inline uint64_t _splitmix64_mix(uint64_t z) noexcept nogil:
    z ^= z >> 30
    z *= 0xbf58476d1ce4e5b9ULL
    z ^= z >> 27
    z *= 0x94d049bb133111ebULL
    z ^= z >> 31
    return z


# Positions are independent, but one position's rounds are a chain of dependent multiplies: the
# lanes put PERMUTE_LANES chains side by side so the CPU overlaps them (about four times the
# throughput of one position at a time).
cdef enum:
    PERMUTE_LANES = 8


cdef inline void _feistel_lanes(const uint64_t* x, uint64_t* y, const uint64_t* keys, Py_ssize_t rounds,
                                unsigned int half, uint64_t mask) noexcept nogil:
    cdef uint64_t left[PERMUTE_LANES]
    cdef uint64_t right[PERMUTE_LANES]
    cdef uint64_t key, mixed
    cdef Py_ssize_t r, j
    for j in range(PERMUTE_LANES):
        left[j] = x[j] >> half
        right[j] = x[j] & mask
    for r in range(rounds):
        key = keys[r]
        for j in range(PERMUTE_LANES):
            mixed = left[j] ^ (_splitmix64_mix(right[j] ^ key) & mask)
            left[j] = right[j]
            right[j] = mixed
    for j in range(PERMUTE_LANES):
        y[j] = (left[j] << half) | right[j]


cdef void _feistel_stream(const int64_t* positions, int64_t* out, Py_ssize_t count, const uint64_t* keys,
                          Py_ssize_t rounds, unsigned int half, uint64_t mask, uint64_t n) noexcept nogil:
    # Each lane works for one position at a time (slot: the position's index, -1 when there is
    # none left to take): after every pass, a lane whose value is inside [0, n) is finished and
    # takes the next position, one still outside walks on. So a position costs the passes it
    # needs (domain / n on average, under 4) and not those of the slowest lane of its block.
    # Reading position k always precedes writing out[k], so out may alias positions.
    cdef uint64_t x[PERMUTE_LANES]
    cdef Py_ssize_t slot[PERMUTE_LANES]
    cdef Py_ssize_t j, taken = 0, busy = 0
    for j in range(PERMUTE_LANES):
        slot[j] = -1
        x[j] = 0  # an idle lane computes on harmlessly: the network maps the domain into itself
        if taken < count:
            slot[j] = taken
            x[j] = <uint64_t>positions[taken]
            taken += 1
            busy += 1
    while busy:
        _feistel_lanes(x, x, keys, rounds, half, mask)
        for j in range(PERMUTE_LANES):
            if slot[j] < 0 or x[j] >= n:
                continue
            out[slot[j]] = <int64_t>x[j]
            if taken < count:
                slot[j] = taken
                x[j] = <uint64_t>positions[taken]
                taken += 1
            else:
                slot[j] = -1
                busy -= 1


def feistel_permute(uint64_t n, const uint64_t[::1] keys not None, const int64_t[::1] positions not None,
                    int64_t[::1] out not None):
    """Store ``P(positions[i])`` in ``out[i]``, where ``P`` is the permutation of [0, n) that the
    round ``keys`` (uint64, one per Feistel round) select.

    ``n`` is at most 2**63 (the indices are int64). For ``n <= 1`` the positions are copied.
    Otherwise, with ``bits = max(2, bit_length(n - 1))`` and ``half = (bits + 1) // 2``, each
    position goes through a balanced Feistel network on ``2 * half`` bits (round ``k``:
    ``(L, R) = (R, L ^ (splitmix64_mix(R ^ k) & mask))``), again and again until the result is
    below ``n``. Raises ValueError, before writing anything, when a position is outside [0, n),
    when ``out`` and ``positions`` differ in length, or when there are no keys. ``out`` may be
    ``positions`` itself.
    """
    cdef Py_ssize_t count = positions.shape[0]
    cdef Py_ssize_t rounds = keys.shape[0]
    if out.shape[0] != count:
        raise ValueError(f"{count} positions but room for {out.shape[0]} results")
    if rounds == 0:
        raise ValueError("a permutation needs at least one round key")
    if n > (<uint64_t>1) << 63:
        raise ValueError(f"n = {n} is more than 2**63: the indices would not fit in int64")
    cdef const uint64_t* round_keys = &keys[0]
    cdef unsigned int bits = 0
    cdef uint64_t top = n - 1 if n > 0 else 0
    while top:
        bits += 1
        top >>= 1
    cdef unsigned int half = (max(bits, 2) + 1) // 2
    cdef uint64_t mask = ((<uint64_t>1) << half) - 1
    cdef Py_ssize_t i
    cdef Py_ssize_t bad = -1
    with nogil:
        # Every position is checked before any is written: a caller that catches the error keeps
        # its output buffer as it was.
        for i in range(count):
            if positions[i] < 0 or <uint64_t>positions[i] >= n:
                bad = i
                break
        if bad < 0 and n <= 1:
            for i in range(count):
                out[i] = positions[i]
        elif bad < 0 and count > 0:
            _feistel_stream(&positions[0], &out[0], count, round_keys, rounds, half, mask, n)
    if bad >= 0:
        raise ValueError(f"position {positions[bad]} (at index {bad}) is outside [0, {n})")


# A lazy shardwise order reads a stream of shards whose items are permuted within each run of a
# few consecutive shards, each run with its own keys. A batch of small shards crosses several
# runs, and doing that in numpy (a search, a mask and a kernel call per run) cost more than the
# permutation itself, and more the smaller the shards; here a batch is one call whatever it spans.
# The tables are O(shards) long, so nothing here walks them: every entry read is checked where it
# is read, and a call costs O(positions * log(shards)).

cdef enum:
    _LINEAR_SHARDS = 16


cdef inline Py_ssize_t _last_at_or_before(const int64_t* values, Py_ssize_t low, Py_ssize_t high,
                                          int64_t value) noexcept nogil:
    # The last k in [low, high) with values[k] <= value; low - 1 if there is none.
    cdef Py_ssize_t middle
    while low < high:
        middle = low + (high - low) // 2
        if values[middle] <= value:
            low = middle + 1
        else:
            high = middle
    return low - 1


def feistel_windows(const int64_t[::1] positions not None, const int64_t[::1] cum not None,
                    const int64_t[::1] shard_starts not None, const int64_t[::1] run_shards not None,
                    const int64_t[::1] run_starts not None, const uint64_t[:, ::1] keys not None,
                    int64_t[::1] out not None):
    """Store in ``out[i]`` the item at stream position ``positions[i]`` of a stream of shards
    whose items are permuted within runs of shards.

    The stream holds ``M = len(shard_starts)`` shards in order; shard ``j`` has positions
    ``[cum[j], cum[j + 1])`` and its items start at ``shard_starts[j]``. Run ``r`` is shards
    ``[run_shards[r], run_shards[r + 1])`` (``run_shards`` ascending, from 0 to ``M``), positions
    ``[s, e) = [cum[run_shards[r]], cum[run_shards[r + 1]])``. A position ``t`` of run ``r`` moves
    to ``o = s + P(t - s)``, ``P`` being :func:`feistel_permute`'s permutation of ``[0, e - s)``
    with the round keys ``keys[r]``, and its item is ``shard_starts[j] + o - cum[j]`` for the
    shard ``j`` of the run that holds ``o``. ``run_starts[r]`` is ``s`` (``cum[run_shards[r]]``,
    one array to search instead of two).

    Raises ValueError when the shapes disagree (``len(cum) == M + 1``, one row of keys and one
    start per run, at least one key per row, ``len(out) == len(positions)``), or when a position
    lies in no run or the tables read on its way are inconsistent (then what ``out`` holds is
    unspecified). ``out`` must not be ``positions``.
    """
    cdef Py_ssize_t count = positions.shape[0]
    cdef Py_ssize_t shards = shard_starts.shape[0]
    cdef Py_ssize_t runs = run_shards.shape[0] - 1
    if cum.shape[0] != shards + 1:
        raise ValueError(f"{shards} shards need {shards + 1} cumulative sizes, got {cum.shape[0]}")
    if runs < 0 or keys.shape[0] != runs or run_starts.shape[0] != runs:
        raise ValueError(f"{max(runs, 0)} runs need as many rows of round keys and starts, got {keys.shape[0]} "
                         f"and {run_starts.shape[0]}")
    if runs and keys.shape[1] == 0:
        raise ValueError("a permutation needs at least one round key")
    if out.shape[0] != count:
        raise ValueError(f"{count} positions but room for {out.shape[0]} results")
    if count == 0:
        return
    cdef const int64_t* c = &cum[0]
    cdef const int64_t* bounds = &run_shards[0]
    cdef const int64_t* firsts = &run_starts[0] if runs else NULL
    cdef Py_ssize_t rounds = keys.shape[1] if runs else 0
    cdef Py_ssize_t i = 0, first, j, k, run = -1, low_shard = 0, high_shard = 0, shard, bad = -1
    cdef int64_t t, start = 0, end = 0, offset
    cdef uint64_t n, top
    cdef unsigned int bits, half
    cdef uint64_t mask
    with nogil:
        while i < count and bad < 0:
            # A segment: consecutive positions in one run (the next run is looked up only when a
            # position leaves this one), whose local offsets go through the lanes in one pass.
            t = positions[i]
            if run < 0 or not (start <= t < end):
                run = _last_at_or_before(firsts, 0, runs, t)
                if run < 0:
                    bad = i
                    break
                low_shard, high_shard = bounds[run], bounds[run + 1]
                if not (0 <= low_shard <= high_shard <= shards):
                    bad = i
                    break
                start, end = c[low_shard], c[high_shard]
                if start != firsts[run] or not (start <= t < end):
                    bad = i
                    break
            first = i
            while i < count and start <= positions[i] < end:
                out[i] = <int64_t>(<uint64_t>positions[i] - <uint64_t>start)
                i += 1
            n = <uint64_t>end - <uint64_t>start
            if n > (<uint64_t>1) << 63:
                bad = first
                break
            if n > 1:
                bits = 0
                top = n - 1
                while top:
                    bits += 1
                    top >>= 1
                half = (max(bits, 2) + 1) // 2
                mask = ((<uint64_t>1) << half) - 1
                _feistel_stream(&out[first], &out[first], i - first, &keys[run, 0], rounds, half, mask, n)
            for j in range(first, i):
                offset = <int64_t>(<uint64_t>out[j] + <uint64_t>start)
                if high_shard - low_shard <= _LINEAR_SHARDS:
                    # a few shards (the usual window): counting beats a search's mispredictions
                    shard = low_shard
                    for k in range(low_shard + 1, high_shard):
                        shard += c[k] <= offset
                else:
                    shard = _last_at_or_before(c, low_shard, high_shard, offset)
                if shard < low_shard or not (c[shard] <= offset < c[shard + 1]):
                    bad = j
                    break
                out[j] = <int64_t>(<uint64_t>shard_starts[shard] + <uint64_t>offset - <uint64_t>c[shard])
    if bad >= 0:
        raise ValueError(f"position {positions[bad]} (at index {bad}) is in no run of the stream, or the stream's tables "
                         f"are inconsistent")
