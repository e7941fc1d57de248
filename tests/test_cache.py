"""The on-disk batch cache (hydrax-api.md section 9): descriptor, file names, load order, direct and
explicit modes, read-only and cache-only groups, bad input, the direct-mode race of 0.2.2, a
SIGKILL mid-write, zero-copy hand-out, several processes and ShardSet groups.

Every test runs real Dataloaders with real worker processes and real JAX. The loader function
``load`` writes each item's value, so every batch's content can be checked against its indices;
``refuse`` fails every item, so a run that uses it proves the loaders were never needed.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from support.timing import slack, slack_int

import hydrax
from hydrax.cache import files as cache_files
from hydrax.cache.writers import CacheWriter
from hydrax.errors import CacheFileError, CacheMismatchError, CacheNotFoundError, HydraxError

ARRAYS = {"x": ((2,), np.float32, jnp.float32), "i": ((1,), np.int64, jnp.int32)}


def load(item, arrays, seed):
    arrays["x"][...] = [item, -item]
    arrays["i"][...] = item
    return {"d": item}


def refuse(item, arrays, seed):
    raise AssertionError(f"the loader ran for item {item}, but the batch should come from the cache")


def run(location, *, func=load, n=10, batch_size=3, epochs=2, arrays=ARRAYS, check=True, **kwargs):
    """Run a direct-mode group over ``location``; each batch as (epoch, group_index, indices, uncached)."""
    group_kw = {key: kwargs.pop(key) for key in ("shuffle_later", "seed", "shuffle_first", "cache_readonly", "cache_arrays") if key in kwargs}
    loader_arrays = kwargs.pop("loader_arrays", arrays)
    group = hydrax.DataGroup(batch_size, list(range(n)), loader_arrays=loader_arrays, cache_location=location, **group_kw)
    kwargs.setdefault("on_item_error", "raise" if func is refuse else "drop_batch")
    kwargs.setdefault("timeout_sec", slack_int(30))
    seen = []
    with hydrax.Dataloader(func, group, end_at=("epoch", epochs), **kwargs) as dl:
        for batch in dl:
            if check:
                expected = np.array(list(batch.indices), np.float32)
                np.testing.assert_array_equal(np.asarray(batch.arrays["x"]), np.stack([expected, -expected], 1))
                assert batch.get_additional("d") == list(batch.indices)
            seen.append((batch.epoch, batch.group_index, list(batch.indices), batch.uncached))
            del batch
    return seen


def dat_files(location):
    return sorted(name for name in os.listdir(location) if name.endswith(".dat"))


# -- the descriptor and the group's rules ----------------------------------------------------------


def test_an_unwritable_cache_location_is_named(tmp_path):
    """A location that cannot be created (here a file is in the way; a read-only file system is
    the same) was a bare OSError from os.makedirs."""
    from hydrax.errors import CacheLocationError

    (tmp_path / "file").write_text("x")
    location = tmp_path / "file" / "cache"
    group = hydrax.DataGroup(3, range(10), loader_arrays={"x": ((1,), "int32", jnp.int32)}, cache_location=location)
    with pytest.raises(CacheLocationError, match=f"cannot write the cache at {location}: .*give a writable cache_location") as raised:
        hydrax.Dataloader(load, group)
    assert raised.value.path == str(location) and isinstance(raised.value, OSError) and raised.value.errno is not None
    again = pickle.loads(pickle.dumps(raised.value))
    assert (type(again), str(again), again.path, again.errno) == (CacheLocationError, str(raised.value), str(location), raised.value.errno)


def test_cache_layouts_use_natural_alignment_and_the_descriptor_is_0_2_2s(tmp_path):
    group = hydrax.DataGroup(3, range(10), loader_arrays={"x": ((1,), "int32", jnp.int32), "s": ((1,), "int64", jnp.int32)},
                             cache_location=tmp_path / "c")
    assert group.shuffle_later == "batchwise"  # "default" with a cache
    assert [lay[3] for lay in group.cache_layouts.values()] == [0, 16] and group.cache_size == 40
    assert [lay[3] for lay in group.loader_layouts.values()] == [0, 64]  # the loaders' memory keeps 64 bytes
    hydrax.Dataloader(load, group)  # creates the descriptor
    text = (tmp_path / "c" / "cache.json").read_text()
    assert json.loads(text) == {
        "_type": "hydrax-cache-v1", "data_len": 10, "batch_size": 3, "seed": 0, "shuffle_first": False,
        "shuffle_later": "batchwise",
        "array_layouts": [{"offset": 0, "dtype": "int32", "count": 3}, {"offset": 16, "dtype": "int64", "count": 3}],
    }
    assert text == json.dumps(json.loads(text), indent=4)


def test_group_cache_arguments_follow_0_2_2s_rules(tmp_path):
    with pytest.raises(ValueError, match="^cache_location is required if no loader_arrays are specified$"):
        hydrax.DataGroup(2, range(4), cache_arrays=ARRAYS)
    with pytest.raises(ValueError, match="^either loader_arrays or cache_arrays must be specified$"):
        hydrax.DataGroup(2, range(4), cache_location=tmp_path)
    plain = hydrax.DataGroup(2, range(4), loader_arrays=ARRAYS)
    assert plain.shuffle_later == "itemwise" and plain.cache_layouts is None and plain.cache_size is None
    in_memory = hydrax.DataGroup(2, range(4), loader_arrays=ARRAYS, cache_arrays={"y": ((1,), np.float16, jnp.float32)})
    assert in_memory.shuffle_later == "itemwise" and in_memory.cache_size == 4
    direct = hydrax.DataGroup(2, range(4), loader_arrays=ARRAYS, cache_location=tmp_path / "d")
    assert {n: lay[:3] for n, lay in direct.cache_layouts.items()} == {n: lay[:3] for n, lay in direct.loader_layouts.items()}
    assert not (tmp_path / "d").exists()  # created by the Dataloader, as 0.2.2's _prepare did


def test_a_descriptor_that_does_not_match_raises_0_2_2s_error_when_the_dataloader_is_created(tmp_path):
    run(tmp_path, epochs=1)
    group = hydrax.DataGroup(3, list(range(10)), loader_arrays=ARRAYS, cache_location=tmp_path, seed=1)  # no error yet
    with pytest.raises(RuntimeError) as raised:
        hydrax.Dataloader(load, group)
    path = os.path.join(tmp_path, "cache.json")
    assert str(raised.value) == f'cache descriptor "{path}" does not match configuration'
    assert isinstance(raised.value, CacheMismatchError) and isinstance(raised.value, HydraxError)
    assert raised.value.path == path and '"seed": 1' in raised.value.expected and '"seed": 0' in raised.value.found
    assert dat_files(tmp_path) == ["e0-b0.dat", "e0-b1.dat", "e0-b2.dat"]  # nothing lost
    # names and shapes are not part of it: a renamed array of the same bytes matches
    renamed = {"y": ((2,), np.float32, jnp.float32), "j": ((1,), np.int64, jnp.int32)}
    hydrax.Dataloader(load, hydrax.DataGroup(3, list(range(10)), loader_arrays=renamed, cache_location=tmp_path))


def test_a_missing_read_only_cache_raises_file_not_found_and_creates_nothing(tmp_path):
    missing = tmp_path / "nowhere"
    for group in (hydrax.DataGroup(2, range(4), loader_arrays=ARRAYS, cache_location=missing, cache_readonly=True),
                  hydrax.DataGroup(2, range(4), cache_arrays=ARRAYS, cache_location=missing)):
        with pytest.raises(FileNotFoundError) as raised:
            hydrax.Dataloader(load, group)
        assert isinstance(raised.value, CacheNotFoundError) and raised.value.path == str(missing / "cache.json")
        assert str(missing / "cache.json") in str(raised.value)
    assert not missing.exists()


def test_cacher_count_is_checked_and_clamped(tmp_path):
    group = hydrax.DataGroup(2, range(4), loader_arrays=ARRAYS, cache_location=tmp_path)
    with pytest.raises(ValueError, match="^cachers are required, cannot provision none$"):
        hydrax.Dataloader(load, group, cacher_count=0)
    with pytest.warns(ResourceWarning, match=r"^ignoring cacher_count \(5\) in excess of depth \(3\)$"):
        hydrax.Dataloader(load, group, cacher_count=5)
    readonly = hydrax.DataGroup(2, range(4), loader_arrays=ARRAYS, cache_location=tmp_path, cache_readonly=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        hydrax.Dataloader(load, readonly, cacher_count=0)


# -- file names and the load order ------------------------------------------------------------------


@pytest.mark.parametrize("mode, names", [
    ("repeat", ["e0-b0.dat", "e0-b1.dat", "e0-b2.dat"]),
    ("batchwise", ["e0-b0.dat", "e0-b1.dat", "e0-b2.dat"]),
    ("reseed", ["e0-b0.dat", "e0-b1.dat", "e0-b2.dat", "e1-b0.dat", "e1-b1.dat", "e1-b2.dat"]),
    ("itemwise", ["e0-b0.dat", "e0-b1.dat", "e0-b2.dat", "e1-b0.dat", "e1-b1.dat", "e1-b2.dat"]),
])
def test_batch_files_are_named_by_the_epoch_their_content_belongs_to(tmp_path, mode, names):
    first = run(tmp_path, shuffle_later=mode, seed=4, shuffle_first=True)
    assert dat_files(tmp_path) == names
    assert all(not uncached for *_, uncached in first)  # direct mode hands out the cached form
    # A second run never calls the loader function, and yields exactly the same batches.
    assert run(tmp_path, func=refuse, shuffle_later=mode, seed=4, shuffle_first=True) == first


def test_validation_batches_use_epoch_0_files(tmp_path):
    train = hydrax.DataGroup(2, list(range(4)), loader_arrays=ARRAYS, cache_location=tmp_path / "t", shuffle_later="itemwise")
    valid = hydrax.DataGroup(2, list(range(10, 14)), loader_arrays=ARRAYS, cache_location=tmp_path / "v", shuffle_later="itemwise")
    with hydrax.Dataloader(load, train, validation=("epoch", 1, valid), end_at=("epoch", 2)) as dl:
        kinds = [b.is_validation for b in dl]
    assert kinds.count(True) == 4
    assert dat_files(tmp_path / "v") == ["e0-b0.dat", "e0-b1.dat"]
    assert dat_files(tmp_path / "t") == ["e0-b0.dat", "e0-b1.dat", "e1-b0.dat", "e1-b1.dat"]


def load_marked(item, arrays, seed):
    arrays["x"][...] = [item + 1000, -item]
    arrays["i"][...] = item
    return {"d": item}


def first_values(location, func, **kwargs):
    group = hydrax.DataGroup(3, list(range(10)), loader_arrays=ARRAYS, cache_location=location, shuffle_later="repeat")
    with hydrax.Dataloader(func, group, end_at=("epoch", 1), on_item_error="raise" if func is refuse else "drop_batch", **kwargs) as dl:
        return [(b.group_index, b.uncached, np.asarray(b.arrays["x"])[:, 0].tolist()) for b in dl]


def test_the_cache_file_comes_first_then_the_loaders(tmp_path):
    run(tmp_path, epochs=1, shuffle_later="repeat")
    os.unlink(tmp_path / "e0-b1.dat")
    # The loaders now write item + 1000: only the missing batch shows it.
    got = first_values(tmp_path, load_marked)
    assert got == [(0, False, [0, 1, 2]), (1, False, [1003, 1004, 1005]), (2, False, [6, 7, 8])]
    assert dat_files(tmp_path) == ["e0-b0.dat", "e0-b1.dat", "e0-b2.dat"]  # written again, from the loaders
    assert first_values(tmp_path, refuse) == got


# -- explicit mode ----------------------------------------------------------------------------------

ENCODED = {"z": ((3,), np.float16, jnp.float32), "k": ((1,), np.uint8, jnp.int32)}


def encode(batch):
    x = batch.arrays["x"]
    return {"z": jnp.concatenate([x, x[:, :1] * 2], axis=1), "k": batch.arrays["i"] % 7}


def test_explicit_mode_checks_caches_and_replays(tmp_path):
    group = hydrax.DataGroup(3, list(range(9)), loader_arrays=ARRAYS, cache_arrays=ENCODED, cache_location=tmp_path, shuffle_later="repeat")
    with hydrax.Dataloader(load, group, end_at=("epoch", 1)) as dl:
        for n, batch in enumerate(dl):
            assert batch.uncached and batch.layouts is group.loader_layouts
            good = encode(batch)
            with pytest.raises(TypeError, match="^arrays has non-dict type list$"):
                batch.cache([good["z"]])
            with pytest.raises(ValueError, match="^array 'k' was not provided$"):
                batch.cache({"z": good["z"]})
            with pytest.raises(TypeError, match="^array 'k' of type ndarray is not a JAX array$"):
                batch.cache({**good, "k": np.zeros((3, 1), np.int32)})
            with pytest.raises(ValueError, match="^array 'w' has unexpected name$"):
                batch.cache({**good, "w": good["k"]})
            with pytest.raises(ValueError, match=r"^array 'z' has shape \(3, 2\), not \(3, 3\)$"):
                batch.cache({**good, "z": good["z"][:, :2]})
            with pytest.raises(ValueError, match="^array 'k' has dtype float32, not int32$"):
                batch.cache({**good, "k": good["k"].astype(jnp.float32)})
            with pytest.raises(ValueError, match="^additional data 'e' has length 2, expected 3$"):
                batch.cache(good, {"e": [1, 2]})
            with pytest.raises(TypeError, match="^additional data 'e' of type tuple is not a list$"):
                batch.cache(good, {"e": (1, 2, 3)})
            assert batch.uncached  # a failed check changes nothing
            batch.cache(good, {"e": [n] * 3} if n != 1 else None, persist=n != 2)
            assert not batch.uncached and batch.layouts is group.cache_layouts
            assert set(batch.arrays) == {"z", "k"}
            with pytest.raises(RuntimeError, match="^batch is already cached$"):
                batch.cache(good)
            del batch
    assert dat_files(tmp_path) == ["e0-b0.dat", "e0-b1.dat"]  # persist=False wrote nothing
    seen = {}
    with hydrax.Dataloader(load, group, end_at=("epoch", 1)) as dl:
        for batch in dl:
            seen[batch.group_index] = batch.uncached
            if not batch.uncached:
                i = np.array(list(batch.indices), np.float32)
                np.testing.assert_array_equal(np.asarray(batch.arrays["z"]), np.stack([i, -i, 2 * i], 1))
                np.testing.assert_array_equal(np.asarray(batch.arrays["k"])[:, 0], i.astype(int) % 7)
                assert batch.arrays["z"].dtype == jnp.float32 and batch.arrays["k"].dtype == jnp.int32
                assert batch.additional == ({"e": [0] * 3} if batch.group_index == 0 else {"d": list(batch.indices)})
                with pytest.raises(RuntimeError, match="^batch is already cached$"):
                    batch.cache(dict(batch.arrays))
            del batch
    assert seen == {0: False, 1: False, 2: True}


def test_cache_without_cache_arrays_raises_cache_layouts_undefined():
    group = hydrax.DataGroup(2, list(range(4)), loader_arrays=ARRAYS)
    with hydrax.Dataloader(load, group, end_at=("epoch", 1)) as dl:
        for batch in dl:
            with pytest.raises(RuntimeError, match="^cache layouts undefined$"):
                batch.cache({"x": batch.arrays["x"], "i": batch.arrays["i"]})
            del batch


def test_a_read_only_cache_is_read_and_never_written(tmp_path):
    group = hydrax.DataGroup(3, list(range(9)), loader_arrays=ARRAYS, cache_arrays=ENCODED, cache_location=tmp_path, shuffle_later="repeat")
    with hydrax.Dataloader(load, group, end_at=("epoch", 1)) as dl:
        for batch in dl:
            if batch.group_index == 0:
                batch.cache(encode(batch))
            del batch
    before = {name: (tmp_path / name).read_bytes() for name in os.listdir(tmp_path)}
    readonly = hydrax.DataGroup(3, list(range(9)), loader_arrays=ARRAYS, cache_arrays=ENCODED, cache_location=tmp_path,
                                shuffle_later="repeat", cache_readonly=True)
    forms = {}
    with hydrax.Dataloader(load, readonly, end_at=("epoch", 1), cacher_count=0) as dl:
        for batch in dl:
            forms[batch.group_index] = batch.uncached
            if batch.uncached:
                batch.cache(encode(batch))  # swaps to the cached form; nothing to write to
                assert not batch.uncached
            del batch
    assert forms == {0: False, 1: True, 2: True}
    assert {name: (tmp_path / name).read_bytes() for name in os.listdir(tmp_path)} == before


def test_a_cache_only_group_loads_exclusively_from_the_cache_and_drops_missing_batches(tmp_path, caplog):
    run(tmp_path, epochs=1, n=12, shuffle_later="repeat")
    os.unlink(tmp_path / "e0-b2.dat")
    group = hydrax.DataGroup(3, list(range(12)), cache_arrays=ARRAYS, cache_location=tmp_path, shuffle_later="repeat")
    with caplog.at_level(logging.WARNING, logger="hydrax"):
        dl = hydrax.Dataloader(refuse, group, end_at=("epoch", 2), loader_count=4)
    assert "[hydrax] loading exclusively from cache" in caplog.text
    with dl, caplog.at_level(logging.WARNING, logger="hydrax"):
        assert dl._engine.pool.processes == []  # no loader process at all
        got = [(b.batch_num, b.group_index, b.uncached) for b in dl]
    # batch 2 of each epoch is dropped, its number skipped, as 0.2.2 does; but not quietly
    assert got == [(0, 0, False), (1, 1, False), (3, 3, False), (4, 0, False), (5, 1, False), (7, 3, False)]
    for batch_num, epoch in ((2, 0), (6, 1)):
        assert (f"batch {batch_num} (epoch {epoch}) is not in the cache ({tmp_path / 'e0-b2.dat'}), and its group has no "
                "loader_arrays: the batch is dropped") in caplog.text


# -- bad input --------------------------------------------------------------------------------------


@pytest.mark.parametrize("damage", ["cut_arrays", "cut_extras", "empty", "foreign_pickle", "garbage", "huge_extras"])
def test_a_damaged_batch_file_is_named_then_loaded_through_the_loaders_and_rewritten(tmp_path, caplog, damage, monkeypatch):
    run(tmp_path, epochs=1, shuffle_later="repeat")
    path = tmp_path / "e0-b1.dat"
    data = path.read_bytes()
    size = 3 * 2 * 4 + 3 * 8  # x (float32 x 2) at 0, i (int64) at 24
    if damage == "cut_arrays":
        data = data[:size - 5]
    elif damage == "cut_extras":
        data = data[:-3]
    elif damage == "empty":
        data = b""
    elif damage == "foreign_pickle":
        data = data[:size] + pickle.dumps(["not", "a", "dict"])
    elif damage == "garbage":
        data = data[:size] + b"\x00garbage"
    else:
        monkeypatch.setattr(cache_files, "MAX_EXTRAS_BYTES", 4)
    path.write_bytes(data)
    with caplog.at_level(logging.WARNING, logger="hydrax"):
        got = run(tmp_path, epochs=1, shuffle_later="repeat")
    assert [g for _, g, _, _ in got] == [0, 1, 2]  # nothing lost
    warning = [r.getMessage() for r in caplog.records if "ignoring cache file" in r.getMessage()]
    assert len(warning) == (3 if damage == "huge_extras" else 1) and any(str(path) in w for w in warning)
    monkeypatch.undo()
    assert cache_files.open_batch_file(str(path), size, 3) is not None  # rewritten whole
    with pytest.raises(CacheFileError) as raised:
        cache_files.open_batch_file(str(path), size + 100, 3)
    assert raised.value.path == str(path) and raised.value.offset == len(path.read_bytes())


# -- the direct-mode race of 0.2.2, and SIGKILL mid-write -------------------------------------------


@pytest.mark.slow
def test_direct_mode_never_reads_a_path_in_flight_200_runs(tmp_path, caplog, monkeypatch):
    # One batch per epoch and a depth of 3: while one epoch's file is written (its slot held),
    # the next epochs need it (0.2.2 failed here with EOFError, then BatchTimeoutError). A half-written file
    # would be skipped with a warning and the batch loaded again: no warning may appear at all.
    # Each write is slowed down mid-file (a slow disk), so that the race window is wide open;
    # the test checks that it was: later epochs found the path in flight.
    write_at = cache_files._write_at

    def slow_write_at(fd, data, offset):
        time.sleep(0.002)
        write_at(fd, data, offset)

    monkeypatch.setattr(cache_files, "_write_at", slow_write_at)
    in_flight = CacheWriter.in_flight
    found_in_flight = []

    def counting_in_flight(self, path):
        busy = in_flight(self, path)
        found_in_flight.append(busy)
        return busy

    monkeypatch.setattr(CacheWriter, "in_flight", counting_in_flight)
    started = time.monotonic()
    caplog.set_level(logging.WARNING, logger="hydrax")
    for n in range(200):
        location = tmp_path / f"r{n}"  # a new cache every run: every run writes while it reads
        seen = run(location, n=2, batch_size=2, epochs=8, depth=3, loader_count=1, shuffle_later="repeat",
                   arrays={"x": ((2,), np.float32, jnp.float32), "i": ((1,), np.int64, jnp.int32)})
        assert [(e, g) for e, g, _, _ in seen] == [(e, 0) for e in range(8)], n
        assert dat_files(location) == ["e0-b0.dat"]
        assert not [name for name in os.listdir(location) if name.endswith(".tmp")]
        assert not caplog.records, (n, [r.getMessage() for r in caplog.records])
    assert sum(found_in_flight) >= 100, f"the race window opened {sum(found_in_flight)} times in 200 runs"
    assert time.monotonic() - started < slack(150)  # about 5 s idle; runs that wait out a timeout take far longer


#: Floats per batch in the SIGKILL test: 64 MB files take long enough to write to be caught mid-way.
BIG = 16 << 20

_KILLED_WRITER = textwrap.dedent("""
    import sys
    import numpy as np, jax.numpy as jnp, hydrax
    def load(item, arrays, seed):
        arrays["x"][...] = item
        return {"d": item}
    if __name__ == "__main__":
        group = hydrax.DataGroup(1, list(range(6)), loader_arrays={"x": ((int(sys.argv[2]),), np.float32, jnp.float32)},
                                 cache_location=sys.argv[1], shuffle_later="repeat")
        with hydrax.Dataloader(load, group, end_at=("epoch", 1), depth=2) as dl:
            for batch in dl:
                del batch
""")


def kill_mid_write(script, location) -> list[str]:
    """Start the writer, SIGKILL it as soon as a batch file is being written; what is left in ``location``."""
    child = subprocess.Popen([sys.executable, str(script), str(location), str(BIG)], stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + slack(60)
        while time.monotonic() < deadline and child.poll() is None:
            if location.exists() and any(n.endswith(".tmp") and ".dat." in n for n in os.listdir(location)):
                os.kill(child.pid, signal.SIGKILL)
                break
            time.sleep(0.0005)
        child.wait()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    return os.listdir(location)


@pytest.mark.slow
def test_sigkill_during_a_write_leaves_no_readable_half_file(tmp_path):
    location = tmp_path / "c"
    script = tmp_path / "writer.py"
    script.write_text(_KILLED_WRITER)
    for _attempt in range(5):  # until the kill lands mid-write (almost always the first time)
        left = kill_mid_write(script, location)
        if any(n.endswith(".tmp") and ".dat." in n for n in left):
            break
    assert any(n.endswith(".tmp") and ".dat." in n for n in left), f"never caught a write in progress: {left}"
    size = BIG * 4
    for name in dat_files(location):  # whatever has a final name is whole
        cached = cache_files.open_batch_file(str(location / name), size, 1)
        assert cached is not None and cached.additional == {"d": [int(name[4:-4])]}
        del cached
    assert len(dat_files(location)) < 6
    # The next run removes what the dead process left, and loads what is missing.
    group = hydrax.DataGroup(1, list(range(6)), loader_arrays={"x": ((BIG,), np.float32, jnp.float32)},
                             cache_location=location, shuffle_later="repeat")
    with hydrax.Dataloader(_fill_big, group, end_at=("epoch", 1), depth=2) as dl:
        assert not [n for n in os.listdir(location) if n.endswith(".tmp")]
        for batch in dl:
            assert float(batch.arrays["x"][0, 0]) == batch.indices[0] == float(batch.arrays["x"][0, -1])
            del batch
    assert len(dat_files(location)) == 6


def _fill_big(item, arrays, seed):
    arrays["x"][...] = item
    return {"d": item}


# -- zero copy ----------------------------------------------------------------------------------


def test_cached_batches_alias_the_mapping_and_copy_instead_of_stalling(tmp_path):
    arrays = {"x": ((16,), np.float32, jnp.float32), "i": ((1,), np.int64, jnp.int64 if jax.config.jax_enable_x64 else jnp.int32)}
    run(tmp_path, func=_fill_big, epochs=1, n=64, batch_size=4, arrays=arrays, check=False, shuffle_later="repeat")
    group = hydrax.DataGroup(4, list(range(64)), loader_arrays=arrays, cache_location=tmp_path, shuffle_later="repeat")
    with hydrax.Dataloader(refuse, group, end_at=("epoch", 1), depth=3, on_item_error="raise") as dl:
        for batch in dl:
            assert not batch.uncached
            np.testing.assert_array_equal(np.asarray(batch.arrays["x"])[:, 0], list(batch.indices))
            del batch
        stats = dl.transfer_stats
    assert stats["aliased_batches"] == 16  # x at offset 0 of a page-aligned mapping
    kept = []
    with hydrax.Dataloader(refuse, group, end_at=("epoch", 2), depth=2, on_item_error="raise", timeout_sec=slack_int(20)) as dl:
        for batch in dl:
            kept.append(batch)  # the loop keeps every batch: copies instead of a stall
        stats = dl.transfer_stats
    assert len(kept) == 32 and stats["copied_batches"] >= 30
    assert [np.asarray(b.arrays["x"])[0, 0] for b in kept] == [float(4 * (k % 16)) for k in range(32)]


# -- several processes, ShardSet ----------------------------------------------------------------


def test_each_process_caches_its_share(tmp_path):
    def share_run(index, func):
        group = hydrax.DataGroup(4, list(range(12)), loader_arrays=ARRAYS, cache_location=tmp_path, shuffle_later="itemwise")
        with hydrax.Dataloader(func, group, end_at=("epoch", 2), process_index=index, process_count=2,
                               on_item_error="raise" if func is refuse else "drop_batch") as dl:
            out = []
            for b in dl:
                np.testing.assert_array_equal(np.asarray(b.arrays["x"])[:, 0], list(b.indices))
                out.append((b.epoch, b.group_index, list(b.indices), b.uncached, b.layouts["i"][0]))
                del b
            return out

    first = [share_run(i, load) for i in range(2)]
    assert sorted(os.listdir(tmp_path)) == ["cache.json", "share-0-of-2", "share-1-of-2"]
    for i in range(2):
        share = tmp_path / f"share-{i}-of-2"
        assert dat_files(share) == ["e0-b0.dat", "e0-b1.dat", "e0-b2.dat", "e1-b0.dat", "e1-b1.dat", "e1-b2.dat"]
        descriptor = json.loads((share / "cache.json").read_text())
        assert descriptor["share"] == [[2 * i, 2 * i + 2]] and descriptor["process_count"] == 2
        assert descriptor["array_layouts"][1] == {"offset": 16, "dtype": "int64", "count": 2}
    assert [share_run(i, refuse) for i in range(2)] == first
    # together the two shares are the global batches
    for (e0, g0, i0, *_), (e1, g1, i1, *_) in zip(*first):
        assert (e0, g0) == (e1, g1) and len(set(i0 + i1)) == 4
    assert first[0][0][4] == (2, 1)


@pytest.mark.multiprocess
def test_processes_under_jax_distributed_cache_their_shares_of_global_batches(tmp_path):
    from test_sharding import assemble, run_job

    config = {"batch_size": 8, "items": 32, "end_at": ["epoch", 2], "cache": str(tmp_path)}
    written = run_job(2, 2, "process_local", **config)  # 2 processes of 2 CPU devices each, one cache
    assert all(r["error"] is None for r in written), [r["error"] for r in written]
    assert sorted(os.listdir(tmp_path)) == ["cache.json", "share-0-of-2", "share-1-of-2"]
    for i in range(2):
        assert len(dat_files(tmp_path / f"share-{i}-of-2")) == 8  # 4 batches in each of 2 epochs
    replayed = run_job(2, 2, "process_local", refuse=True, **config)  # a loader call would fail the run
    assert all(r["error"] is None for r in replayed), [r["error"] for r in replayed]
    first, second = assemble(written), assemble(replayed)
    assert len(first) == 8
    assert [b["indices"] for b in second] == [b["indices"] for b in first]
    for a, b in zip(first, second):
        for name in a["arrays"]:
            for device, (index, values, _) in a["arrays"][name].items():
                assert b["arrays"][name][device][0] == index
                np.testing.assert_array_equal(b["arrays"][name][device][1], values)
    # the rows are the items: every global batch holds 8 distinct items, every epoch all 32
    for epoch in range(2):
        assert sorted(i for b in first[4 * epoch : 4 * epoch + 4] for i in b["indices"]) == list(range(32))


@pytest.mark.multiprocess
def test_processes_that_disagree_on_a_cached_batch_stop_there_instead_of_diverging(tmp_path):
    # Explicit mode: a step that one process hands out cached and another uncached would send
    # their training loops down different paths (one calls its encoder and Batch.cache, the other
    # not), into different collectives: every process must stop at that batch instead.
    from test_sharding import run_job

    config = {"batch_size": 8, "items": 32, "end_at": ["epoch", 1], "cache": str(tmp_path), "explicit": True}
    filled = run_job(2, 1, "none", **config)
    assert all(r["error"] is None for r in filled), [r["error"] for r in filled]
    assert [[b["uncached"] for b in r["batches"]] for r in filled] == [[True] * 4] * 2
    replayed = run_job(2, 1, "none", refuse=True, **config)
    assert all(r["error"] is None for r in replayed), [r["error"] for r in replayed]
    assert [[b["uncached"] for b in r["batches"]] for r in replayed] == [[False] * 4] * 2
    os.unlink(tmp_path / "share-1-of-2" / "e0-b2.dat")  # process 1 lost one batch of its share
    broken = run_job(2, 1, "none", **config)
    for report in broken:
        assert report["error"] is not None and report["error"]["type"] == "BatchFailedError", report["error"]
        assert "the processes disagree on batch 2 of the run" in report["error"]["message"]
        assert "process 0 has it in its share of the on-disk cache and process 1 does not" in report["error"]["message"]
        assert [b["uncached"] for b in report["batches"]] == [False, False]  # batches 0 and 1, then the stop


def load_sample(sample, arrays, seed):
    arrays["cls"][...] = int(bytes(sample["cls"]))
    return {"key": sample["__key__"]}


def test_a_shardset_group_in_shardwise_order_is_cached(tmp_path):
    wds = pytest.importorskip("webdataset")
    from hydrax.shards import ShardSet

    for s in range(3):
        with wds.TarWriter(str(tmp_path / f"s-{s}.tar")) as sink:
            for i in range(6):
                sink.write({"__key__": f"k{s}{i}", "cls": str(10 * s + i).encode()})
    data = ShardSet(f"{tmp_path}/s-{{0..2}}.tar")

    def go(func):
        group = hydrax.DataGroup(4, data, loader_arrays={"cls": ((), np.int32, jnp.int32)}, cache_location=tmp_path / "c",
                                 shuffle_later="shardwise", shard_window=2)
        with hydrax.Dataloader(func, group, end_at=("epoch", 2), loader_count=2, on_item_error="raise" if func is refuse else "drop_batch") as dl:
            return [(b.epoch, b.group_index, np.asarray(b.arrays["cls"]).tolist(), b.get_additional("key")) for b in dl]

    first = go(load_sample)
    assert dat_files(tmp_path / "c") == [f"e{e}-b{b}.dat" for e in range(2) for b in range(4)]
    for _epoch, _index, cls, keys in first:
        assert cls == [10 * int(key[1]) + int(key[2]) for key in keys]
    assert first[:4] != first[4:]  # each epoch has its own order, and so its own files
    descriptor = json.loads((tmp_path / "c" / "cache.json").read_text())
    assert descriptor["shuffle_later"] == "shardwise" and descriptor["shard_window"] == 2
    assert go(refuse) == first


def test_batch_files_are_mapped_read_only_and_the_lease_frees_its_slot_once(tmp_path):
    run(tmp_path, epochs=1, shuffle_later="repeat")
    size = hydrax.DataGroup(3, list(range(10)), loader_arrays=ARRAYS, cache_location=tmp_path).cache_size
    cached = cache_files.open_batch_file(str(tmp_path / "e0-b1.dat"), size, 3)
    assert cached.additional == {"d": [3, 4, 5]} and not cached.mapping.writable
    with pytest.raises(BufferError):
        cached.mapping.write_int64(0, 1)
    freed = []
    lease = cached.lease(7, freed.append)
    x = np.frombuffer(lease, np.float32, count=6).reshape(3, 2)
    assert not x.flags.writeable and x[:, 0].tolist() == [3, 4, 5]
    with pytest.raises(ValueError):
        x[0, 0] = 1
    lease.seal()
    assert freed == []
    del x
    assert freed == [7]
    assert cache_files.open_batch_file(str(tmp_path / "e9-b9.dat"), size, 3) is None


def test_a_batch_cached_after_the_run_is_written_at_once(tmp_path):
    group = hydrax.DataGroup(3, list(range(3)), loader_arrays=ARRAYS, cache_arrays=ENCODED, cache_location=tmp_path)
    with hydrax.Dataloader(load, group, end_at=("epoch", 1)) as dl:
        kept = list(dl)
    kept[0].cache(encode(kept[0]))
    assert dat_files(tmp_path) == ["e0-b0.dat"]
    cached = cache_files.open_batch_file(str(tmp_path / "e0-b0.dat"), group.cache_size, 3)
    assert cached.additional == {"d": [0, 1, 2]}
