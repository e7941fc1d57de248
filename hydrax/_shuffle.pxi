# Seeded shuffles, bit for bit those of numpy: included by _core.pyx.
#
# A shardwise order of the "numpy" kind permutes the items of every run of a few shards with its
# own generator, Generator(PCG64([*key, run])).permutation(size), an order earlier versions made
# and resumed runs replay. Made in numpy, each run costs a SeedSequence, a PCG64 and a Generator
# (about 40 us of Python objects) before its few hundred items are shuffled, so an epoch of
# 100,000 shards spent a second on objects alone, ten times what it spent on 1,000 shards.
# shuffle_runs computes the same thing with no object per run: numpy's SeedSequence hashing
# (pool of 4 words), PCG64 (128-bit LCG, XSL-RR output, 32-bit draws buffered in halves) and the
# Fisher-Yates shuffle of Generator.shuffle with random_interval's masked rejection sampling.
#
# The reference is numpy itself: the tests compare every run with Generator.permutation. Should
# numpy's streams ever change, the orders stay those of this file (so resume keeps working), and
# the tests tell.

from libc.stdint cimport uint32_t, uint64_t

cdef extern from *:
    """
    typedef unsigned __int128 hydrax_u128;
    """
    ctypedef unsigned long long hydrax_u128


cdef enum:
    _POOL = 4
    _MAX_KEY_WORDS = 64

cdef uint32_t _INIT_A = 0x43b0d7e5
cdef uint32_t _MULT_A = 0x931e8875
cdef uint32_t _INIT_B = 0x8b51f9dd
cdef uint32_t _MULT_B = 0x58f38ded
cdef uint32_t _MIX_L = 0xca01f9dd
cdef uint32_t _MIX_R = 0x4973f715


cdef inline uint32_t _hashmix(uint32_t value, uint32_t* hash_const) noexcept nogil:
    value ^= hash_const[0]
    hash_const[0] *= _MULT_A
    value *= hash_const[0]
    value ^= value >> 16
    return value


cdef inline uint32_t _mix(uint32_t x, uint32_t y) noexcept nogil:
    cdef uint32_t result = _MIX_L * x - _MIX_R * y
    result ^= result >> 16
    return result


cdef void _seed_state(const uint32_t* entropy, Py_ssize_t count, uint64_t* state) noexcept nogil:
    # SeedSequence(entropy).generate_state(4, uint64)
    cdef uint32_t pool[_POOL]
    cdef uint32_t words[2 * _POOL]
    cdef uint32_t hash_const = _INIT_A
    cdef Py_ssize_t i, j
    for i in range(_POOL):
        pool[i] = _hashmix(entropy[i] if i < count else 0, &hash_const)
    for i in range(_POOL):
        for j in range(_POOL):
            if i != j:
                pool[j] = _mix(pool[j], _hashmix(pool[i], &hash_const))
    for i in range(_POOL, count):
        for j in range(_POOL):
            pool[j] = _mix(pool[j], _hashmix(entropy[i], &hash_const))
    hash_const = _INIT_B
    for i in range(2 * _POOL):
        words[i] = pool[i % _POOL] ^ hash_const
        hash_const *= _MULT_B
        words[i] *= hash_const
        words[i] ^= words[i] >> 16
    for i in range(_POOL):
        state[i] = <uint64_t>words[2 * i] | (<uint64_t>words[2 * i + 1] << 32)


cdef struct _Pcg64:
    hydrax_u128 state
    hydrax_u128 inc
    bint has_half
    uint32_t half


cdef inline void _pcg64_step(_Pcg64* g) noexcept nogil:
    cdef hydrax_u128 multiplier = ((<hydrax_u128>2549297995355413924ULL) << 64) | <hydrax_u128>4865540595714422341ULL
    g.state = g.state * multiplier + g.inc


cdef inline uint64_t _pcg64_next64(_Pcg64* g) noexcept nogil:
    _pcg64_step(g)
    cdef uint64_t value = <uint64_t>(g.state >> 64) ^ <uint64_t>g.state
    cdef unsigned int rotation = <unsigned int>(g.state >> 122)
    return (value >> rotation) | (value << ((64 - rotation) & 63))


cdef inline uint32_t _pcg64_next32(_Pcg64* g) noexcept nogil:
    cdef uint64_t value
    if g.has_half:
        g.has_half = False
        return g.half
    value = _pcg64_next64(g)
    g.has_half = True
    g.half = <uint32_t>(value >> 32)
    return <uint32_t>value


cdef void _pcg64_seed(_Pcg64* g, const uint64_t* seed) noexcept nogil:
    cdef hydrax_u128 initstate = ((<hydrax_u128>seed[0]) << 64) | seed[1]
    cdef hydrax_u128 initseq = ((<hydrax_u128>seed[2]) << 64) | seed[3]
    g.state = 0
    g.inc = (initseq << 1) | 1
    _pcg64_step(g)
    g.state += initstate
    _pcg64_step(g)
    g.has_half = False
    g.half = 0


cdef inline uint64_t _interval(_Pcg64* g, uint64_t top) noexcept nogil:
    # A uniform integer of [0, top]: draws masked to top's bit length until one fits.
    cdef uint64_t mask = top, value
    if top == 0:
        return 0
    mask |= mask >> 1
    mask |= mask >> 2
    mask |= mask >> 4
    mask |= mask >> 8
    mask |= mask >> 16
    mask |= mask >> 32
    if top <= 0xffffffffULL:
        value = _pcg64_next32(g) & mask
        while value > top:
            value = _pcg64_next32(g) & mask
    else:
        value = _pcg64_next64(g) & mask
        while value > top:
            value = _pcg64_next64(g) & mask
    return value


def shuffle_runs(int64_t[::1] data not None, const int64_t[::1] bounds not None, const uint32_t[::1] key not None):
    """Shuffle ``data[bounds[r]:bounds[r + 1]]`` in place for every run ``r``, exactly as
    ``Generator(PCG64(SeedSequence(entropy))).shuffle`` does, where ``entropy`` is the words
    ``key`` (uint32, numpy's coercion of the key's integers) followed by the words of ``r`` (one
    word below 2**32, else two, low first).

    ``bounds`` must be non-negative, ascending and at most ``len(data)``; ``key`` holds at most
    64 words. Raises ValueError otherwise, before anything is moved.
    """
    cdef Py_ssize_t runs = bounds.shape[0] - 1
    cdef Py_ssize_t words = key.shape[0]
    cdef Py_ssize_t r, i, j, a, b
    if words > _MAX_KEY_WORDS:
        raise ValueError(f"a key of at most {_MAX_KEY_WORDS} words, got {words}")
    for r in range(runs + 1):
        if bounds[r] < (bounds[r - 1] if r else 0) or bounds[r] > data.shape[0]:
            raise ValueError(f"bounds must be non-negative, ascending and at most {data.shape[0]}; "
                             f"bounds[{r}] is {bounds[r]}")
    cdef uint32_t entropy[_MAX_KEY_WORDS + 2]
    cdef uint64_t seed[4]
    cdef _Pcg64 generator
    cdef int64_t held
    cdef Py_ssize_t count
    for i in range(words):
        entropy[i] = key[i]
    with nogil:
        for r in range(runs):
            a, b = bounds[r], bounds[r + 1]
            entropy[words] = <uint32_t>r
            count = words + 1
            if (<uint64_t>r) >> 32:
                entropy[words + 1] = <uint32_t>((<uint64_t>r) >> 32)
                count += 1
            _seed_state(entropy, count, seed)
            _pcg64_seed(&generator, seed)
            for i in range(b - a - 1, 0, -1):
                j = <Py_ssize_t>_interval(&generator, <uint64_t>i)
                held = data[a + j]
                data[a + j] = data[a + i]
                data[a + i] = held
