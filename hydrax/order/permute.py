"""Lazy permutations: a keyed pseudo-random order of [0, n), computed position by position.

A shuffled order of N items held as an array costs 8N bytes (80 GB for 10**10 items) and O(N)
time before the first item can be read. The permutations here cost a few round keys and
compute any position's index on demand, in tens of nanoseconds, so every worker can compute
exactly the positions of its own tasks::

    order = LazyPermutation(n, seed, epoch)
    order[1234]            # one index
    order[4096:8192]       # a task's indices, int64
    order.at(positions)    # any positions

The permutation is a Feistel network with cycle walking (``hydrax/_permute.pxi``); the round
keys come from :func:`round_keys`, so the same ``n`` and words give the same order on every
platform and in every release that keeps that kernel and this key derivation.

Not cryptographic, and not every order is reachable: 8 keys select one of 2**512 orders at
most, and the parity of the permutation is skewed (always even when n is a power of 4 from 16
on, where no cycle walking happens). What the tests check is that the statistics a training
run could notice (where an item lands, correlations between neighbours and epochs, fixed
points, runs) are those of uniformly random orders.
"""

from __future__ import annotations

import operator

import numpy as np

from .. import _core

#: Feistel rounds per permutation. Four is the least for a Feistel network to pass for random
#: against chosen inputs; eight leave a margin, and a position still costs only tens of ns.
ROUNDS = 8
#: The largest order: its indices must fit in int64.
MAX_N = 1 << 63

_MASK64 = (1 << 64) - 1
#: splitmix64's increment (2**64 / golden ratio), and a start that is not zero so that the words
#: ``()`` and ``(0,)`` give different keys.
_GAMMA = 0x9E3779B97F4A7C15
_START = 0x6A09E667F3BCC908


def _mix(z: int) -> int:
    """The splitmix64 finalizer on a Python int (the kernel's round function, here for the keys)."""
    z ^= z >> 30
    z = (z * 0xBF58476D1CE4E5B9) & _MASK64
    z ^= z >> 27
    z = (z * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def round_keys(*words: int) -> np.ndarray:
    """:data:`ROUNDS` uint64 round keys derived from ``words``: non-negative ints of any size.

    Python ints throughout, so the keys are the same on every platform. Each word is folded into
    a splitmix64 state 64 bits at a time, then its number of 64-bit pieces, so no two different
    lists of words fold the same pieces (``(2**64,)`` is not ``(0, 1)``). Each key is then the
    next splitmix64 output of that state.
    """
    return np.array(_keys_from(_START, words), np.uint64)


def _keys_from(state: int, words) -> list[int]:
    """The :data:`ROUNDS` keys of the splitmix64 ``state`` after folding in ``words``."""
    for word in words:
        state = _fold(state, word)
    keys = []
    for _ in range(ROUNDS):
        state = (state + _GAMMA) & _MASK64
        keys.append(_mix(state))
    return keys


def _mix_array(z: np.ndarray) -> np.ndarray:
    """:func:`_mix` on a uint64 array (numpy's uint64 arithmetic wraps as the kernel's does)."""
    z = z ^ (z >> np.uint64(30))
    z = z * np.uint64(0xBF58476D1CE4E5B9)
    z = z ^ (z >> np.uint64(27))
    z = z * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _fold(state: int, word: int) -> int:
    """The splitmix64 state after folding in ``word`` (its 64-bit pieces, then their count)."""
    word = operator.index(word)
    if word < 0:
        raise ValueError(f"key words must be non-negative, got {word}")
    pieces = 0
    while True:
        state = _mix(((state ^ (word & _MASK64)) + _GAMMA) & _MASK64)
        word >>= 64
        pieces += 1
        if not word:
            break
    return _mix(((state ^ pieces) + _GAMMA) & _MASK64)


#: Up to this many rows, :func:`round_keys_table` computes with Python ints (measured crossover
#: with numpy's array arithmetic: about 15 rows).
_SMALL_TABLE = 12


def round_keys_table(prefix: tuple[int, ...], values, suffix: tuple[int, ...] = ()) -> np.ndarray:
    """``round_keys(*prefix, v, *suffix)`` for every ``v`` of ``values`` (non-negative, below
    2**64), as a ``(len(values), ROUNDS)`` uint64 array: many rows with array arithmetic (the
    keys of every run of an epoch cost microseconds, not a Python loop each), a few with Python
    ints (a mixture's block of batches needs one or two rows per source)."""
    values = np.asarray(values, np.uint64)
    suffix = tuple(operator.index(word) for word in suffix)
    for word in suffix:
        if not 0 <= word <= _MASK64:
            raise ValueError(f"a suffix word must be in [0, 2**64), got {word}")
    state = _START
    for word in prefix:
        state = _fold(state, word)
    if len(values) <= _SMALL_TABLE:
        # numpy's fixed cost per operation (~70 of them) outweighs Python ints for a few rows,
        # the common case of a mixture's block of batches
        return np.array([_keys_from(state, (int(v), *suffix)) for v in values.tolist()], np.uint64).reshape(len(values), ROUNDS)
    gamma = np.uint64(_GAMMA)
    with np.errstate(over="ignore"):
        states = _mix_array(((np.uint64(state) ^ values) + gamma))
        states = _mix_array((states ^ np.uint64(1)) + gamma)  # one 64-bit piece
        for word in suffix:
            states = _mix_array((states ^ np.uint64(word)) + gamma)
            states = _mix_array((states ^ np.uint64(1)) + gamma)
        keys = np.empty((len(values), ROUNDS), np.uint64)
        for i in range(ROUNDS):
            states = states + gamma
            keys[:, i] = _mix_array(states)
    return keys


def _check_n(n) -> int:
    n = operator.index(n)
    if not 0 <= n <= MAX_N:
        raise ValueError(f"a permutation's n must be in [0, 2**63], got {n}")
    return n


def _as_positions(positions) -> np.ndarray:
    """``positions`` as an int64 array (same shape), refusing what would not convert exactly."""
    if isinstance(positions, range):
        # A task's positions: never a list of Python ints on the way.
        return np.arange(positions.start, positions.stop, positions.step, dtype=np.int64)
    array = np.asarray(positions)
    if array.size == 0:
        return np.zeros(array.shape, np.int64)
    if array.dtype.kind == "u" and int(array.max()) >= MAX_N:
        raise ValueError(f"position {int(array.max())} does not fit in int64")
    if array.dtype.kind not in "iu":
        raise TypeError(f"positions must be integers, got an array of {array.dtype}")
    return array.astype(np.int64, copy=False)


def permute(n: int, keys: np.ndarray, positions) -> np.ndarray:
    """The indices at ``positions`` (int array-like of any shape, or a ``range``) of the
    permutation of [0, n) that ``keys`` (from :func:`round_keys`) select, as int64 of the same
    shape. Raises ValueError if a position is outside [0, n).
    """
    n = _check_n(n)
    keys = np.ascontiguousarray(keys, np.uint64)
    if keys.ndim != 1 or len(keys) == 0:
        raise ValueError(f"keys must be a non-empty 1-d array, got shape {keys.shape}")
    where = _as_positions(positions)
    flat = np.ascontiguousarray(where.reshape(-1))
    out = np.empty(flat.shape, np.int64)
    _core.feistel_permute(n, keys, flat, out)
    return out.reshape(where.shape)


def permute_range(n: int, keys: np.ndarray, start: int, stop: int) -> np.ndarray:
    """The indices at positions ``start`` to ``stop - 1`` (none when ``stop <= start``)."""
    return permute(n, keys, range(operator.index(start), operator.index(stop)))


def permute_windows(positions, cum: np.ndarray, shard_starts: np.ndarray, run_shards: np.ndarray, keys: np.ndarray,
                    run_starts: np.ndarray | None = None) -> np.ndarray:
    """The items at ``positions`` of a stream of shards whose items are permuted within runs of
    shards, as int64: shard ``j`` of the stream holds positions ``[cum[j], cum[j + 1])`` and items
    from ``shard_starts[j]`` on; run ``r`` is shards ``[run_shards[r], run_shards[r + 1])``, its
    positions permuted with the round keys ``keys[r]`` (see :func:`hydrax._core.feistel_windows`).
    ``run_starts`` is ``cum[run_shards[:-1]]``, made here when not given (a caller that reads the
    same stream many times keeps it). Raises ValueError for a position in no run."""
    where = np.ascontiguousarray(_as_positions(positions).reshape(-1))
    out = np.empty(where.shape, np.int64)
    if run_starts is None:
        run_starts = np.ascontiguousarray(cum[run_shards[:-1]], np.int64)
    _core.feistel_windows(where, cum, shard_starts, run_shards, run_starts, keys, out)
    return out


class LazyPermutation:
    """A pseudo-random permutation of [0, n), selected by ``words`` (see :func:`round_keys`),
    that reads like a read-only sequence of its indices and is never stored.

    ``p[i]`` is the index at position ``i`` (negative ``i`` counts from the end, as for a list),
    ``p[a:b:c]`` the indices at those positions as int64, ``p.at(positions)`` those at any array
    of positions. It holds ``n`` and the keys only, so it pickles in a few hundred bytes and
    every process that unpickles it computes the same order. ``len(p)`` fails past
    ``sys.maxsize`` items, as for ``range``; :attr:`n` does not.
    """

    __slots__ = ("n", "keys")

    def __init__(self, n: int, *words: int):
        #: The number of items permuted.
        self.n = _check_n(n)
        #: The round keys (uint64, read-only).
        self.keys = round_keys(*words)
        self.keys.setflags(write=False)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index):
        """One index (an int) for an int, the int64 indices for a slice."""
        # range does the bounds checks and slice arithmetic of a sequence of length n.
        positions = range(self.n)[index]
        if isinstance(positions, range):
            return permute(self.n, self.keys, positions)
        return int(permute(self.n, self.keys, np.array([positions], np.int64))[0])

    def __iter__(self):
        # Item by item through __getitem__ would cost one kernel call each.
        step = 1 << 14
        for start in range(0, self.n, step):
            yield from permute_range(self.n, self.keys, start, min(start + step, self.n)).tolist()

    def __array__(self, dtype=None, copy=None):
        """Every index, in order: O(n) time and memory, for when the whole order is wanted."""
        return self[:] if dtype is None else self[:].astype(dtype)

    def at(self, positions) -> np.ndarray:
        """The indices at ``positions`` (int array-like or ``range``; each in [0, n)), as int64
        of the same shape."""
        return permute(self.n, self.keys, positions)

    def __eq__(self, other) -> bool:
        if not isinstance(other, LazyPermutation):
            return NotImplemented
        return self.n == other.n and bool((self.keys == other.keys).all())

    def __hash__(self) -> int:
        return hash((self.n, self.keys.tobytes()))

    def __repr__(self) -> str:
        return f"LazyPermutation(n={self.n}, keys=[{', '.join(hex(int(k)) for k in self.keys)}])"

    def __getstate__(self):
        # Python ints, not the array's bytes: a pickle made here must unpickle to the same keys
        # on a machine of the other byte order.
        return self.n, tuple(int(k) for k in self.keys)

    def __setstate__(self, state):
        self.n, keys = state
        self.keys = np.array(keys, np.uint64)
        self.keys.setflags(write=False)
