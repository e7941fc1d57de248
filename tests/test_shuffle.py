"""The shuffle kernel (``_shuffle.pxi``): numpy's seeded shuffles, run by run, bit for bit."""

import numpy as np
import pytest

from hydrax import _core
from hydrax import _fallback
from hydrax.order.shardwise import seed_words, shardwise_order

KEYS = [(0,), (1, 0), (7, 3), (2**32 - 1, 2**32, 5), (2**40 + 3, 1, 2), (2**64 + 9, 0, 7, 1), (123456789, 2**33, 0, 0, 0, 4)]


def runs_of(rng, count, most=60):
    sizes = rng.integers(0, most, count)
    sizes[::4] = rng.integers(0, 2, len(sizes[::4]))  # runs of 0 and 1 items too
    return np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)


@pytest.mark.parametrize("key", KEYS)
def test_each_run_is_shuffled_as_numpy_shuffles_it(key):
    rng = np.random.default_rng(len(key))
    bounds = runs_of(rng, 40)
    data = rng.integers(-(2**62), 2**62, int(bounds[-1]) + 7, dtype=np.int64)  # a tail past the last run
    fast, slow = data.copy(), data.copy()
    _core.shuffle_runs(fast, bounds, seed_words(key))
    _fallback.shuffle_runs(slow, bounds, key)
    np.testing.assert_array_equal(fast, slow)
    np.testing.assert_array_equal(fast[bounds[-1]:], data[bounds[-1]:])


def test_large_runs_and_many_runs():
    rng = np.random.default_rng(1)
    for bounds in (np.array([0, 300_000], np.int64), runs_of(rng, 3000, most=8)):
        data = np.arange(int(bounds[-1]), dtype=np.int64)
        fast, slow = data.copy(), data.copy()
        _core.shuffle_runs(fast, bounds, seed_words((9, 2)))
        _fallback.shuffle_runs(slow, bounds, (9, 2))
        np.testing.assert_array_equal(fast, slow)


def test_seed_words_are_numpys_coercion():
    for key in KEYS:
        ours = np.random.SeedSequence(seed_words(key)).generate_state(4, np.uint64)
        numpys = np.random.SeedSequence(list(key)).generate_state(4, np.uint64)
        np.testing.assert_array_equal(ours, numpys, err_msg=str(key))
    with pytest.raises(ValueError, match="non-negative"):
        seed_words((1, -1))


def test_numpy_shardwise_orders_are_those_of_numpys_generators():
    """shardwise_order builds every run through the kernel; here it is built the way earlier
    versions built it, a Generator per run."""
    sizes = np.random.default_rng(3).integers(0, 30, 500)
    starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    seed, epoch, window = 11, 4, 3
    shards = np.random.Generator(np.random.PCG64(seed + epoch)).permutation(len(sizes))
    pieces = []
    for run, first in enumerate(range(0, len(shards), window)):
        items = np.concatenate([np.arange(starts[s], starts[s] + sizes[s]) for s in shards[first:first + window]])
        pieces.append(items[np.random.Generator(np.random.PCG64([seed, epoch, run])).permutation(len(items))])
    assert shardwise_order(tuple(sizes.tolist()), seed, epoch, window).tolist() == np.concatenate(pieces).tolist()


def test_bad_calls_are_refused_before_anything_moves():
    data = np.arange(10, dtype=np.int64)
    for bounds in ([0, 5, 3], [0, 11], [-1, 4], [2, 1]):
        with pytest.raises(ValueError, match="bounds"):
            _core.shuffle_runs(data, np.array(bounds, np.int64), seed_words((1,)))
        assert data.tolist() == list(range(10))
    with pytest.raises(ValueError, match="at most 64 words"):
        _core.shuffle_runs(data, np.array([0, 10], np.int64), np.zeros(65, np.uint32))
    _core.shuffle_runs(data, np.zeros(1, np.int64), np.zeros(0, np.uint32))  # no runs, no key: nothing to do
    assert data.tolist() == list(range(10))
    with pytest.raises(ValueError):
        _core.shuffle_runs(data[::2], np.array([0, 5], np.int64), seed_words((1,)))


def test_fuzz_never_crashes_and_keeps_the_values():
    rng = np.random.default_rng(8)
    for case in range(500):
        data = rng.integers(0, 1000, int(rng.integers(0, 200)), dtype=np.int64)
        bounds = rng.integers(-3, len(data) + 3, int(rng.integers(0, 12)), dtype=np.int64)
        if case % 2:
            bounds.sort()
        key = rng.integers(0, 2**32, int(rng.integers(0, 70)), dtype=np.uint64).astype(np.uint32)
        before = data.copy()
        try:
            _core.shuffle_runs(data, bounds, key)
        except ValueError:
            assert data.tolist() == before.tolist()
            continue
        assert sorted(data.tolist()) == sorted(before.tolist())
