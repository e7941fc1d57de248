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
