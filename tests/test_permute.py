"""Lazy permutations: the Feistel kernel against its numpy twin and the written-out algorithm,
exact bijections, refused inputs, a fuzz, and the statistics of the orders it makes."""

import math
import pickle

import numpy as np
import pytest

from hydrax import _core
from hydrax import _fallback
from hydrax.order.permute import ROUNDS, LazyPermutation, permute, permute_range, round_keys

try:
    from scipy import stats
except ImportError:  # the chi-square test then uses a fixed bound
    stats = None

MASK64 = (1 << 64) - 1
KEY_SETS = {
    "derived": round_keys(0),
    "derived-2": round_keys(2024, 7),
    "one-round": np.array([0x0123456789ABCDEF], np.uint64),
    "three-rounds": np.array([1, 2, 3], np.uint64),
    "zeros": np.zeros(ROUNDS, np.uint64),
    "random": np.random.default_rng(5).integers(0, 1 << 64, ROUNDS, dtype=np.uint64, endpoint=False),
}
SIZES = [0, 1, 2, 3, 4, 5, 7, 11, 13, 31, 32, 33, 63, 64, 65, 127, 128, 129, 255, 256, 257, 1000, 4093, 65535, 65536,
         65537, 10**6, 2**31 - 1, 2**32 + 1, 10**9 + 7, 10**10, 2**40 - 1, 2**40 + 3, 2**62 + 5, 2**63 - 25, 2**63]


def kernel(n, keys, positions):
    positions = np.ascontiguousarray(positions, np.int64)
    out = np.empty_like(positions)
    _core.feistel_permute(n, keys, positions, out)
    return out


def written_out(n, keys, position):
    """The algorithm as the kernel's docstring states it, on Python ints: the twin's own check."""
    if n <= 1:
        return position
    half = (max(2, (n - 1).bit_length()) + 1) // 2
    mask = (1 << half) - 1

    def mix(z):
        z ^= z >> 30
        z = z * 0xBF58476D1CE4E5B9 & MASK64
        z ^= z >> 27
        z = z * 0x94D049BB133111EB & MASK64
        return z ^ (z >> 31)

    x = position
    while True:
        left, right = x >> half, x & mask
        for k in keys.tolist():
            left, right = right, left ^ (mix(right ^ k) & mask)
        x = (left << half) | right
        if x < n:
            return x


def sample_positions(n, rng, count=2000):
    if n <= 4096:
        return np.arange(n, dtype=np.int64)
    edges = np.array([0, 1, n // 2, n - 2, n - 1], np.int64)
    return np.concatenate([edges, rng.integers(0, n, count, dtype=np.int64)])


# --- the kernel computes the stated algorithm


@pytest.mark.parametrize("name", sorted(KEY_SETS))
def test_kernel_matches_the_twin(name):
    keys, rng = KEY_SETS[name], np.random.default_rng(1)
    for n in SIZES:
        positions = sample_positions(n, rng)
        fast = kernel(n, keys, positions)
        np.testing.assert_array_equal(fast, _fallback.feistel_permute(n, keys, positions), err_msg=f"n={n}")
        assert ((fast >= 0) & (fast < max(n, 1))).all() or n == 0


def test_the_twin_is_the_written_out_algorithm():
    rng = np.random.default_rng(2)
    for n in SIZES:
        positions = sample_positions(n, rng, count=20)[:40]
        for keys in (KEY_SETS["derived"], KEY_SETS["three-rounds"]):
            expected = [written_out(n, keys, int(p)) for p in positions]
            assert _fallback.feistel_permute(n, keys, positions).tolist() == expected, n


def test_the_order_is_pinned():
    # Orders that a run recorded (a resumed epoch) must replay: these values may never change.
    assert round_keys(0).tolist()[:3] == [17684472107665951097, 565282149297323157, 16834884809002642431]
    assert round_keys().tolist()[0] == 1927618558350093866
    assert LazyPermutation(10, 1)[:].tolist() == [5, 0, 2, 8, 6, 4, 3, 9, 7, 1]
    assert LazyPermutation(10**10, 2024, 1).at([0, 1, 2, 10**10 - 1]).tolist() == [184489626, 3965077767, 5922177598, 4587253793]


@pytest.mark.parametrize("n", [0, 1, 2, 3, 5, 7, 8, 16, 17, 31, 32, 33, 1000, 65537, 10**6])
def test_every_index_exactly_once(n):
    for name in ("derived", "one-round", "zeros", "random"):
        out = kernel(n, KEY_SETS[name], np.arange(n))
        np.testing.assert_array_equal(np.sort(out), np.arange(n), err_msg=name)


def test_out_may_be_the_positions():
    keys, positions = round_keys(3), np.arange(1000, dtype=np.int64)
    expected = kernel(1000, keys, positions)
    _core.feistel_permute(1000, keys, positions, positions)
    np.testing.assert_array_equal(positions, expected)


# --- refused inputs


def test_out_of_range_positions_are_refused_and_nothing_is_written():
    keys = round_keys(1)
    for n, bad in [(10, 10), (10, -1), (10, 2**63 - 1), (1, 1), (0, 0), (2**40, 2**40), (2**63, -(2**63))]:
        positions = np.array([0, 0, bad, 0] if n else [bad], np.int64)
        out = np.full(len(positions), -7, np.int64)
        with pytest.raises(ValueError, match=f"position {bad} .*outside \\[0, {n}\\)"):
            _core.feistel_permute(n, keys, positions, out)
        assert (out == -7).all()
        with pytest.raises(ValueError, match="outside"):
            permute(n, keys, positions)


def test_malformed_calls_are_refused():
    keys, positions = round_keys(1), np.arange(5, dtype=np.int64)
    with pytest.raises(ValueError, match="5 positions but room for 4"):
        _core.feistel_permute(10, keys, positions, np.empty(4, np.int64))
    with pytest.raises(ValueError, match="round key"):
        _core.feistel_permute(10, np.zeros(0, np.uint64), positions, np.empty(5, np.int64))
    with pytest.raises(ValueError, match="2\\*\\*63"):
        _core.feistel_permute(2**63 + 1, keys, positions, np.empty(5, np.int64))
    with pytest.raises(OverflowError):
        _core.feistel_permute(-1, keys, positions, np.empty(5, np.int64))
    with pytest.raises(ValueError):  # buffer dtype mismatch, and a strided view
        _core.feistel_permute(10, keys, positions.astype(np.int32), np.empty(5, np.int64))
    with pytest.raises(ValueError):
        _core.feistel_permute(10, keys, np.arange(10, dtype=np.int64)[::2], np.empty(5, np.int64))
    with pytest.raises(TypeError):
        _core.feistel_permute(10, None, positions, np.empty(5, np.int64))
    read_only = np.zeros(5, np.int64)
    read_only.setflags(write=False)
    with pytest.raises(ValueError):
        _core.feistel_permute(10, keys, positions, read_only)


def test_the_python_layer_refuses_what_it_cannot_convert():
    keys = round_keys(1)
    for n in (-1, 2**63 + 1):
        with pytest.raises(ValueError, match="n must be"):
            permute(n, keys, [0])
        with pytest.raises(ValueError, match="n must be"):
            LazyPermutation(n, 1)
    with pytest.raises(TypeError):
        permute(10.0, keys, [0])
    with pytest.raises(TypeError, match="integers"):
        permute(10, keys, [0.5])
    with pytest.raises(TypeError, match="integers"):
        permute(10, keys, np.array([True]))
    with pytest.raises(ValueError, match="fit in int64"):
        permute(10, keys, np.array([2**63], np.uint64))
    with pytest.raises(ValueError, match="non-empty"):
        permute(10, [], [0])
    with pytest.raises(ValueError, match="outside"):
        permute_range(10, keys, 5, 11)
    with pytest.raises(ValueError, match="non-negative"):
        round_keys(1, -1)
    with pytest.raises(TypeError):
        round_keys(1.0)
    with pytest.raises(IndexError):
        LazyPermutation(10, 1)[10]
    with pytest.raises(IndexError):
        LazyPermutation(10, 1)[-11]


def test_fuzz_never_crashes_and_stays_in_range():
    rng = np.random.default_rng(3)
    for case in range(400):
        n = int(rng.integers(0, 2 ** int(rng.integers(0, 63)) + 1)) if case % 10 else int(rng.integers(0, 1 << 62))
        keys = rng.integers(0, 1 << 64, int(rng.integers(0, 12)), dtype=np.uint64, endpoint=False)
        positions = rng.integers(-5, n + 5, int(rng.integers(0, 300)), dtype=np.int64)
        valid = len(keys) > 0 and ((positions >= 0) & (positions < n)).all()
        out = np.empty_like(positions)
        if not valid:
            with pytest.raises(ValueError):
                _core.feistel_permute(n, keys, positions, out)
            continue
        _core.feistel_permute(n, keys, positions, out)
        assert ((out >= 0) & (out < n)).all(), (case, n)
        if case % 20 == 0:
            np.testing.assert_array_equal(out, _fallback.feistel_permute(n, keys, positions))
        if len(np.unique(positions)) == len(positions):
            assert len(np.unique(out)) == len(out), (case, n)


# --- the public module


def test_round_keys_are_deterministic_and_tell_words_apart():
    keys = round_keys(7, 3)
    assert keys.dtype == np.uint64 and keys.shape == (ROUNDS,)
    np.testing.assert_array_equal(keys, round_keys(7, 3))
    variants = [(), (0,), (0, 0), (7,), (7, 3), (3, 7), (7, 4), (2**64,), (0, 1), (1, 0), (2**64 - 1,), (2**200,)]
    assert len({round_keys(*words).tobytes() for words in variants}) == len(variants)
    assert round_keys(np.int64(5)).tobytes() == round_keys(5).tobytes()


def test_permute_accepts_ranges_lists_and_shapes():
    keys, n = round_keys(9), 1000
    full = permute(n, keys, range(n))
    assert full.dtype == np.int64 and sorted(full.tolist()) == list(range(n))
    np.testing.assert_array_equal(permute(n, keys, range(900, 99, -7)), full[900:99:-7])
    np.testing.assert_array_equal(permute(n, keys, [3, 1, 4]), full[[3, 1, 4]])
    np.testing.assert_array_equal(permute(n, keys, np.array([[3, 1], [4, 1]], np.uint16)), full[[[3, 1], [4, 1]]])
    assert permute(n, keys, 5).shape == () and int(permute(n, keys, 5)) == full[5]
    assert permute(n, keys, []).shape == (0,) and permute(n, keys, range(0)).shape == (0,)
    np.testing.assert_array_equal(permute_range(n, keys, 100, 200), full[100:200])
    assert permute_range(n, keys, 200, 100).shape == (0,)


def test_lazy_permutation_reads_like_a_sequence():
    p = LazyPermutation(500, 11, 2)
    full = p[:]
    assert p.n == len(p) == 500 and full.dtype == np.int64
    assert sorted(full.tolist()) == list(range(500))
    assert p[0] == full[0] and p[-1] == full[-1] and isinstance(p[3], int)
    np.testing.assert_array_equal(p[10:400:3], full[10:400:3])
    np.testing.assert_array_equal(p[::-1], full[::-1])
    np.testing.assert_array_equal(p.at([[1, 2], [3, 499]]), full[[[1, 2], [3, 499]]])
    assert list(p) == full.tolist()
    np.testing.assert_array_equal(np.asarray(p), full)
    np.testing.assert_array_equal(p.keys, round_keys(11, 2))
    with pytest.raises(ValueError):
        p.keys[0] = 1
    assert p == LazyPermutation(500, 11, 2) and hash(p) == hash(LazyPermutation(500, 11, 2))
    assert p != LazyPermutation(500, 11, 3) and p != LazyPermutation(501, 11, 2)
    assert LazyPermutation(0)[:].shape == (0,) and list(LazyPermutation(1, 5)) == [0]


def test_lazy_permutation_is_big_cheap_and_picklable():
    n = 10**10
    p = LazyPermutation(n, 1, 2, 3)
    window = p[n - 1000 :]
    assert ((window >= 0) & (window < n)).all() and len(np.unique(window)) == 1000
    data = pickle.dumps(p)
    assert len(data) < 400
    q = pickle.loads(data)
    assert q == p and q.n == n and not q.keys.flags.writeable
    np.testing.assert_array_equal(q[12345:12400], p[12345:12400])
    assert LazyPermutation(2**63, 1)[2**63 - 1] < 2**63


# --- statistics: the orders look like uniformly random permutations


def test_where_an_item_lands_is_uniform_over_keys():
    for n, seeds in ((64, 20000), (100, 10000)):  # 64: the network's domain exactly; 100: cycle walking
        first, item = np.zeros(n, np.int64), np.zeros(n, np.int64)
        for seed in range(seeds):
            order = LazyPermutation(n, 4242, seed)[:]
            first[order[0]] += 1  # the item at position 0
            item[int(np.flatnonzero(order == 5)[0])] += 1  # the position of item 5
        for counts in (first, item):
            if stats is not None:
                assert stats.chisquare(counts).pvalue > 1e-4, counts
            else:  # the 1e-6 quantile of chi-square with 63 degrees of freedom is 131; with 99, 183
                expected = seeds / n
                assert ((counts - expected) ** 2 / expected).sum() < (140 if n == 64 else 190), counts


def correlation(a, b):
    return float(np.corrcoef(a.astype(np.float64), b.astype(np.float64))[0, 1])


def test_consecutive_items_and_epochs_are_uncorrelated():
    # For independent orders |r| has a standard deviation of 1/sqrt(n) = 0.003: 0.02 is 6 of them.
    n, seed = 10**5, 31337
    orders = [LazyPermutation(n, seed, epoch)[:] for epoch in range(4)]
    positions = [np.argsort(order) for order in orders]  # where each item goes
    for epoch in range(3):
        assert abs(correlation(orders[epoch], orders[epoch + 1])) < 0.02
        assert abs(correlation(positions[epoch], positions[epoch + 1])) < 0.02
    for order, position in zip(orders, positions):
        assert abs(correlation(order[:-1], order[1:])) < 0.02
        assert abs(correlation(position[:-1], position[1:])) < 0.02
        assert abs(correlation(order, np.arange(n))) < 0.02


def test_fixed_points_and_ascending_runs_are_those_of_random_permutations():
    # A uniformly random permutation of n has 1 fixed point on average (Poisson(1): none with
    # probability 1/e), and (n + 1) / 2 ascending runs with variance (n + 1) / 12.
    n, trials = 1000, 2000
    fixed = np.array([int((LazyPermutation(n, 77, t)[:] == np.arange(n)).sum()) for t in range(trials)])
    assert abs(fixed.mean() - 1) < 0.15, fixed.mean()
    assert abs((fixed == 0).mean() - 1 / math.e) < 0.05
    n = 10**5
    for t in range(5):
        order = LazyPermutation(n, 78, t)[:]
        runs = 1 + int((order[1:] < order[:-1]).sum())
        assert abs(runs - (n + 1) / 2) < 6 * math.sqrt((n + 1) / 12), runs


@pytest.mark.parametrize("rows", [0, 1, 7, 40])  # a few rows are computed with Python ints, many with numpy
def test_a_table_of_round_keys_is_round_keys_of_each(rows):
    from hydrax.order.permute import round_keys_table

    edges = [0, 1, 2, 4095, 2**32 + 7, 2**63 + 5, 2**64 - 1]
    values = np.array((edges * 6)[:rows] if rows < 40 else edges + list(range(1000, 1033)), dtype=np.uint64)
    for prefix, suffix in (((), ()), ((5,), (4,)), ((3, 2**70, 0), (4, 9))):
        table = round_keys_table(prefix, values, suffix)
        assert table.shape == (len(values), len(round_keys(0))) and table.dtype == np.uint64
        for row, value in zip(table, values.tolist()):
            assert row.tolist() == round_keys(*prefix, value, *suffix).tolist()
    with pytest.raises(ValueError, match=r"suffix word must be in \[0, 2\*\*64\)"):
        round_keys_table((1,), values, (2**64,))


# --- windowed shard streams (feistel_windows)


def stream_tables(rng, shards, window=None, empty_every=5):
    """A stream's tables: ``shards`` shards of random sizes (some empty), items of shard j from
    ``shard_starts[j]``, runs of ``window`` shards (or of random lengths), random keys."""
    sizes = rng.integers(0, 40, shards, dtype=np.int64)
    sizes[::empty_every] = 0
    cum = np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)
    shard_starts = rng.permutation(np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.int64))
    if window is None:
        cuts = np.unique(rng.integers(1, max(shards, 1), max(shards // 3, 0)))
        run_shards = np.concatenate(([0], cuts, [shards])).astype(np.int64) if shards else np.zeros(1, np.int64)
    else:
        run_shards = np.append(np.arange(0, shards, window, dtype=np.int64), shards)
    keys = rng.integers(0, 1 << 64, (len(run_shards) - 1, ROUNDS), dtype=np.uint64, endpoint=False)
    return cum, shard_starts, run_shards, keys


def starts_of(cum, run_shards):
    return np.ascontiguousarray(cum[np.clip(run_shards[:-1], 0, len(cum) - 1)], np.int64)


def windows_kernel(positions, cum, shard_starts, run_shards, keys, run_starts=None):
    positions = np.ascontiguousarray(positions, np.int64)
    out = np.empty_like(positions)
    run_starts = starts_of(cum, run_shards) if run_starts is None else run_starts
    _core.feistel_windows(positions, cum, shard_starts, run_shards, run_starts, keys, out)
    return out


def windows_written_out(cum, shard_starts, run_shards, keys):
    """Every position's item as the kernel's docstring states it, one run at a time."""
    items = []
    for r in range(len(run_shards) - 1):
        s, e = int(cum[run_shards[r]]), int(cum[run_shards[r + 1]])
        for t in range(s, e):
            o = s + written_out(e - s, keys[r], t - s)
            j = max(j for j in range(run_shards[r], run_shards[r + 1]) if cum[j] <= o)
            items.append(int(shard_starts[j]) + o - int(cum[j]))
    return items


@pytest.mark.parametrize("shards,window", [(1, 1), (7, 1), (12, 4), (13, 4), (40, 3), (25, None), (60, None), (9, 100)])
def test_windows_kernel_is_the_stated_algorithm_and_a_bijection(shards, window):
    rng = np.random.default_rng(shards)
    cum, shard_starts, run_shards, keys = stream_tables(rng, shards, window)
    positions = np.arange(int(cum[-1]), dtype=np.int64)
    got = windows_kernel(positions, cum, shard_starts, run_shards, keys)
    assert got.tolist() == windows_written_out(cum, shard_starts, run_shards, keys)
    sizes = np.diff(cum)
    every_item = np.concatenate([np.arange(a, a + n) for a, n in zip(shard_starts, sizes)] + [np.zeros(0, np.int64)])
    assert sorted(got.tolist()) == sorted(every_item.tolist())
    # each run's items come from its own shards only
    for r in range(len(run_shards) - 1):
        a, b = run_shards[r], run_shards[r + 1]
        own = {int(x) for j in range(a, b) for x in range(shard_starts[j], shard_starts[j] + sizes[j])}
        assert set(got[cum[a]:cum[b]].tolist()) == own


def test_windows_kernel_matches_the_twin_in_any_order_of_positions():
    rng = np.random.default_rng(11)
    for case in range(40):
        cum, shard_starts, run_shards, keys = stream_tables(rng, int(rng.integers(1, 300)), None if case % 2 else int(rng.integers(1, 9)))
        if cum[-1] == 0:
            continue
        positions = rng.integers(0, int(cum[-1]), int(rng.integers(0, 600)), dtype=np.int64)
        if case % 3 == 0:
            positions.sort()
        np.testing.assert_array_equal(windows_kernel(positions, cum, shard_starts, run_shards, keys),
                                      _fallback.feistel_windows(positions, cum, shard_starts, run_shards, starts_of(cum, run_shards), keys),
                                      err_msg=str(case))


def test_windows_kernel_refuses_malformed_calls():
    rng = np.random.default_rng(2)
    cum, shard_starts, run_shards, keys = stream_tables(rng, 12, 4)
    positions = np.arange(int(cum[-1]), dtype=np.int64)
    out = np.empty_like(positions)
    starts = starts_of(cum, run_shards)
    with pytest.raises(ValueError, match="cumulative sizes"):
        _core.feistel_windows(positions, cum[:-1], shard_starts, run_shards, starts, keys, out)
    with pytest.raises(ValueError, match="rows of round keys"):
        _core.feistel_windows(positions, cum, shard_starts, run_shards, starts, keys[:-1], out)
    with pytest.raises(ValueError, match="rows of round keys and starts"):
        _core.feistel_windows(positions, cum, shard_starts, run_shards, starts[:-1], keys, out)
    with pytest.raises(ValueError, match="rows of round keys"):
        _core.feistel_windows(positions, cum, shard_starts, run_shards[:0], starts, keys, out)
    with pytest.raises(ValueError, match="at least one round key"):
        _core.feistel_windows(positions, cum, shard_starts, run_shards, starts, keys[:, :0].copy(), out)
    with pytest.raises(ValueError, match="room for"):
        _core.feistel_windows(positions, cum, shard_starts, run_shards, starts, keys, out[:-1])
    wrong = starts.copy()
    wrong[1] += 1  # a run's start that is not its first shard's
    with pytest.raises(ValueError, match="inconsistent"):
        windows_kernel(positions, cum, shard_starts, run_shards, keys, wrong)
    for bad in (-1, int(cum[-1]), 1 << 62):
        with pytest.raises(ValueError, match=f"position {bad} "):
            windows_kernel(np.array([0, bad], np.int64), cum, shard_starts, run_shards, keys)
    # an empty stream has no position at all; no positions is always fine
    empty = (np.zeros(1, np.int64), np.zeros(0, np.int64), np.zeros(1, np.int64), np.zeros((0, ROUNDS), np.uint64),
             np.zeros(0, np.int64))
    with pytest.raises(ValueError, match="no run"):
        windows_kernel(np.zeros(1, np.int64), *empty)
    assert windows_kernel(np.zeros(0, np.int64), *empty).tolist() == []


def test_windows_kernel_fuzz_never_crashes_or_hangs_on_inconsistent_tables():
    """Tables are O(shards) and read only where a position leads, so they are checked where
    read: garbage in any of them must give ValueError or some output, never a crash or a hang."""
    rng = np.random.default_rng(4)
    for case in range(600):
        shards = int(rng.integers(0, 50))
        span = 1 << int(rng.integers(1, 63))
        cum = rng.integers(-span, span, shards + 1, dtype=np.int64)
        if case % 2:
            cum.sort()
        shard_starts = rng.integers(-span, span, shards, dtype=np.int64)
        runs = int(rng.integers(0, shards + 2))
        run_shards = rng.integers(-2, shards + 3, runs + 1, dtype=np.int64)
        if case % 3:
            run_shards.sort()
        keys = rng.integers(0, 1 << 64, (runs, int(rng.integers(1, 9))), dtype=np.uint64, endpoint=False)
        positions = rng.integers(-span, span, int(rng.integers(0, 200)), dtype=np.int64)
        if case % 4 == 0 and shards:
            positions = rng.integers(min(cum[0], cum[-1]), max(cum[0], cum[-1]) + 1, len(positions), dtype=np.int64)
        starts = rng.integers(-span, span, runs, dtype=np.int64) if case % 5 == 0 else starts_of(cum, run_shards)
        try:
            windows_kernel(positions, cum, shard_starts, run_shards, keys, starts)
        except ValueError:
            pass
