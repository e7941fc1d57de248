"""The set index: one mapped file for all the local shards of a ShardSet, reused while they are unchanged."""

import gc
import json
import logging
import os
import pickle
import shutil

import cloudpickle
import numpy as np
import pytest
from support.timing import slack_int

from hydrax.errors import ObjectChangedError
from hydrax.procs.pickling import dumps
from hydrax.shards import ShardEntry, ShardIndex, ShardSet, ShardWriter, open_index, write_manifest
from hydrax.shards.shardtable import ShardTable, UrlList
from hydrax.shards.setindex import HEADER_SIZE, SetIndex, set_index_bytes, set_index_path, urls_digest


def write_shards(folder, count=3, per_shard=7, fields=("bin", "cls")):
    """``count`` shards of ``per_shard`` samples (keys k00000...), with their indexes."""
    with ShardWriter(str(folder / "s-%03d.tar"), maxcount=per_shard) as writer:
        for i in range(count * per_shard):
            sample = {"__key__": f"k{i:05d}", **{f: f"{f}{i}" for f in fields}}
            writer.write(sample)
    return writer.paths


def contents(dataset):
    return [(s.key, s.url, {f: bytes(s[f]) for f in s}) for s in dataset]


@pytest.fixture
def shards(tmp_path):
    return write_shards(tmp_path)


def test_local_shards_share_one_set_index_whose_views_equal_each_shards_index(shards, tmp_path):
    dataset = ShardSet(shards, cache_dir=str(tmp_path / "cache"))
    path = set_index_path(str(tmp_path / "cache"), urls_digest(shards))
    assert dataset.set_index.path == path and os.listdir(tmp_path / "cache" / "sets") == [os.path.basename(path)]
    assert len(dataset) == 21 and dataset.shard_sizes() == [7, 7, 7]
    for shard, url in enumerate(shards):
        own, view = open_index(url), dataset.index(shard)
        assert view.same_samples(own) and view.field_names == own.field_names
        assert (view.shard_size, view.shard_mtime_ns) == (own.shard_size, own.shard_mtime_ns)
        assert all(np.array_equal(a, b) for a, b in zip(dataset.set_index.spans(shard), own.sample_spans()))
        assert dataset.shard_entry(shard).samples == 7 and dataset.shard_entry(shard).size == os.path.getsize(url)
    assert dataset[8].key == "k00008" and bytes(dataset[8]["cls"]) == b"cls8" and dataset[8].fields == open_index(shards[1]).fields(1)
    shards_of, within = dataset.locate([0, 6, 7, 20])
    assert shards_of.tolist() == [0, 0, 1, 2] and within.tolist() == [0, 6, 0, 6]


def test_a_second_open_reuses_the_set_index_without_the_shards_own_indexes(shards, tmp_path):
    first = contents(ShardSet(shards, cache_dir=str(tmp_path / "cache")))
    for url in shards:
        os.unlink(url + ".hidx")
    again = ShardSet(shards, cache_dir=str(tmp_path / "cache"))
    assert contents(again) == first
    assert not any(os.path.exists(url + ".hidx") for url in shards)  # not needed, so not rebuilt


def test_a_shard_that_changed_rebuilds_the_set_index_saying_why(shards, tmp_path, caplog):
    cache = str(tmp_path / "cache")
    ShardSet(shards, cache_dir=cache)
    os.unlink(shards[1] + ".hidx")
    with ShardWriter(str(tmp_path / "new-%d.tar"), maxcount=3) as writer:
        for i in range(3):
            writer.write({"__key__": f"n{i}", "txt": "new"})
    shutil.move(writer.paths[0], shards[1])
    with caplog.at_level(logging.INFO, logger="hydrax.shards.catalog"):
        again = ShardSet(shards, cache_dir=cache)
    assert "1 shard(s) changed since it was built, the first" in caplog.text and shards[1] in caplog.text
    assert again.shard_sizes() == [7, 3, 7] and again[7].key == "n0" and bytes(again[7]["txt"]) == b"new"
    assert again.index(1).field_names == ("txt",) and again.index(0).field_names == ("bin", "cls")
    caplog.clear()
    os.utime(shards[0], ns=(1_000_000_000, 1_000_000_000))  # a copy: a new time only
    with caplog.at_level(logging.INFO, logger="hydrax.shards.catalog"):
        assert contents(ShardSet(shards, cache_dir=cache)) == contents(again)
    assert "modified at" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="hydrax.shards.catalog"):
        ShardSet(shards, cache_dir=cache)
    assert "rebuilding" not in caplog.text


def test_a_damaged_set_index_is_rebuilt(shards, tmp_path, caplog):
    dataset = ShardSet(shards, cache_dir=str(tmp_path / "cache"))
    path = dataset.set_index.path
    raw = bytearray(open(path, "rb").read())
    raw[-3] ^= 0xFF
    os.unlink(path)  # the mapping keeps the old file
    open(path, "wb").write(bytes(raw))
    with caplog.at_level(logging.WARNING):
        again = ShardSet(shards, cache_dir=str(tmp_path / "cache"))
    assert "checksum mismatch" in caplog.text and contents(again) == contents(dataset)
    SetIndex.open(path)  # rewritten whole


def test_a_pickled_shardset_carries_the_set_index_path_not_the_samples(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    small = ShardSet(write_shards(tmp_path / "a", 4, 5), cache_dir=str(tmp_path / "cache"))
    large = ShardSet(write_shards(tmp_path / "b", 4, 500), cache_dir=str(tmp_path / "cache"))
    small.index(0), large.index(0), bytes(large[3]["cls"])  # views and mappings are not pickled
    sizes = [len(pickle.dumps(s)) for s in (small, large)]
    assert abs(sizes[0] - sizes[1]) < 200, sizes
    packed = cloudpickle.dumps(large)
    assert b"k00003" not in packed and b"ShardIndex" not in packed
    again = pickle.loads(packed)
    assert again.set_index.path == large.set_index.path and contents(again) == contents(large)


def test_a_set_index_replaced_by_another_after_pickling_is_an_error(shards, tmp_path):
    dataset = ShardSet(shards, cache_dir=str(tmp_path / "cache"))
    packed = pickle.dumps(dataset)
    # a process that built the same set index at the same time wrote the same bytes: no harm
    shutil.copy(dataset.set_index.path, str(tmp_path / "copy"))
    os.replace(str(tmp_path / "copy"), dataset.set_index.path)
    assert contents(pickle.loads(packed)) == contents(dataset)
    # one of other contents (a shard changed since) is an error
    indexes = [open_index(url) for url in shards]
    (tmp_path / "other").write_bytes(set_index_bytes(indexes[:2], dataset.set_index.digest))
    os.replace(str(tmp_path / "other"), dataset.set_index.path)
    with pytest.raises(ObjectChangedError, match="the set index was replaced or removed"):
        pickle.loads(packed)
    os.unlink(dataset.set_index.path)
    with pytest.raises(ObjectChangedError, match="the set index was replaced or removed"):
        pickle.loads(packed)


def test_without_write_index_or_a_writable_cache_the_set_index_is_held_in_memory(shards, tmp_path, caplog):
    quiet = ShardSet(shards, cache_dir=str(tmp_path / "cache"), write_index=False)
    assert quiet.set_index.path is None and not os.path.exists(tmp_path / "cache")
    assert contents(pickle.loads(pickle.dumps(quiet))) == contents(quiet)
    (tmp_path / "a-file").write_bytes(b"")  # no folder can be made under it, even by root
    with caplog.at_level(logging.WARNING):
        held = ShardSet(shards, cache_dir=str(tmp_path / "a-file"))
    assert held.set_index.path is None and "could not write the set index" in caplog.text
    assert contents(held) == contents(quiet)


def test_shards_of_other_fields_keep_their_own_field_names(tmp_path):
    first = write_shards(tmp_path, 1, 4, fields=("cls", "jpg"))
    os.makedirs(tmp_path / "b")
    second = write_shards(tmp_path / "b", 1, 4, fields=("json", "cls"))
    empty = str(tmp_path / "empty.tar")
    with open(empty, "wb") as f:
        f.write(bytes(1024))  # a tar of no members
    dataset = ShardSet([first[0], empty, second[0]], cache_dir=str(tmp_path / "cache"))
    assert dataset.set_index.field_names == ("cls", "jpg", "json") and dataset.shard_sizes() == [4, 0, 4]
    for shard, url in enumerate([first[0], empty, second[0]]):
        own = open_index(url)
        assert dataset.index(shard).same_samples(own) and dataset.index(shard).field_names == own.field_names
    assert dataset[5].fields.keys() == {"cls", "json"} and bytes(dataset[5]["json"]) == b"json1"


def test_the_file_is_aligned_checksummed_and_the_same_for_the_same_indexes(shards):
    indexes = [open_index(url) for url in shards]
    data = set_index_bytes(indexes, "d" * 64)
    assert data == set_index_bytes(indexes, "d" * 64) and data[:16] == b"hydrax-set-index"
    index = SetIndex(data)
    assert len(index) == 3 and index.samples == 21 and index.digest == "d" * 64
    for name in ("shard_size", "sample_start", "key_end", "key_bytes", "entry_field", "entry_size"):
        array = getattr(index, name)
        assert (array.ctypes.data - np.frombuffer(data, np.uint8).ctypes.data) % 64 == 0 and not array.flags.writeable
    assert index.entry_start[-1] == len(index.entry_field) == 42 and HEADER_SIZE == 64
    damaged = bytearray(data)
    damaged[HEADER_SIZE + 5] ^= 1
    with pytest.raises(Exception, match="checksum mismatch"):
        SetIndex(bytes(damaged), "x.hsix")
    with pytest.raises(Exception, match="x.hsix: not a readable hydrax set index"):
        SetIndex(data[:-8], "x.hsix")


def test_a_manifest_loads_indexes_lazily_and_holds_a_bounded_number(tmp_path):
    urls = write_shards(tmp_path, 6, 3)
    write_manifest([ShardEntry(u, os.path.getsize(u), None, 3) for u in urls], str(tmp_path / "data.json"))
    dataset = ShardSet(str(tmp_path / "data.json"), max_indexes=2, cache_dir=str(tmp_path / "cache"))
    assert dataset.set_index is None and dataset.shard_sizes() == [3] * 6
    assert contents(dataset) == contents(ShardSet(urls, cache_dir=str(tmp_path / "cache")))
    assert len(dataset._held_indexes) == 2 and all(dataset.shard_entry(s).index is None for s in range(6))
    assert isinstance(dataset.index(0), ShardIndex) and dataset._held_indexes.shards() == [5, 0]
    with pytest.raises(ValueError, match=r"max_indexes=...\) must be a positive int, got 0"):
        ShardSet(urls, max_indexes=0)


def test_a_wrong_count_in_a_manifest_names_the_manifest(tmp_path):
    from hydrax.errors import ShardFormatError

    urls = write_shards(tmp_path, 2, 3)
    manifest = str(tmp_path / "data.json")
    write_manifest([ShardEntry(u, os.path.getsize(u), None, 4 - i) for i, u in enumerate(urls)], manifest)
    dataset = ShardSet(manifest, cache_dir=str(tmp_path / "cache"))
    assert dataset.shard_sizes() == [4, 3]
    sample = dataset[0]
    # what an error handler logs: it must not load the index again (and fail inside the handler)
    assert repr(sample) == f"<sample 0 of {urls[0]} (its shard's index is not loaded)>"
    with pytest.raises(ShardFormatError, match=f"the manifest {manifest} says 4 samples, its index has 3; rewrite the manifest") as raised:
        sample["__key__"]
    assert raised.value.url == urls[0]
    assert repr(dataset[4]) == f"<sample 0 of {urls[1]} (its shard's index is not loaded)>"
    dataset.index(1)
    assert repr(dataset[4]).startswith("<sample '") and urls[1] in repr(dataset[4])


@pytest.mark.parametrize("claim", [10**8, 2**62 - 1])
def test_a_count_the_shard_cannot_hold_is_refused_before_any_order(tmp_path, claim):
    """10**8 samples claimed for a 3-sample shard of the right size once built a 9.6 GB order."""
    import tracemalloc

    from hydrax.errors import ShardFormatError

    urls = write_shards(tmp_path, 2, 3)
    manifest = str(tmp_path / "data.json")
    write_manifest([ShardEntry(u, os.path.getsize(u), None, claim if i else 3) for i, u in enumerate(urls)], manifest)
    # "before any order" as the memory it took (numpy reports its arrays to tracemalloc), not as a
    # time, which failed on a busy machine: an order of 10**8 items alone is 800 MB
    tracemalloc.start()
    try:
        with pytest.raises(ShardFormatError, match=rf"the manifest says shard {urls[1]} holds {claim} samples, more than its "
                                                    rf"\d+ bytes can hold") as raised:
            ShardSet(manifest, cache_dir=str(tmp_path / "cache"))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert raised.value.url == manifest and peak < 64 << 20, f"{peak >> 20} MB"


def load_cls(sample, arrays, seed):
    arrays["x"][...] = len(bytes(sample["cls"]))


def test_a_wrong_count_in_a_worker_ends_the_run_with_the_format_error(tmp_path):
    """In a worker, logging the failed sample used to load its index again inside the handler
    (logging tests a Mapping for emptiness): the worker died and the run ended in a WorkerError."""
    import jax.numpy as jnp

    from hydrax import Dataloader, DataGroup
    from hydrax.errors import ShardFormatError

    urls = write_shards(tmp_path, 2, 3)
    manifest = str(tmp_path / "data.json")
    write_manifest([ShardEntry(u, os.path.getsize(u), None, 4 - i) for i, u in enumerate(urls)], manifest)
    dataset = ShardSet(manifest, cache_dir=str(tmp_path / "cache"))
    group = DataGroup(2, dataset, loader_arrays={"x": ((), np.int32, jnp.int32)})
    with pytest.raises(ShardFormatError, match=f"the manifest {manifest} says 4 samples, its index has 3") as raised:
        with Dataloader(load_cls, group, loader_count=2, timeout_sec=slack_int(60)) as loader:
            for _batch in loader:
                pass
    assert raised.value.url == urls[0]


def test_a_set_index_written_in_many_pieces_is_the_same(shards, monkeypatch):
    from hydrax.shards import setindex

    indexes = [open_index(url) for url in shards] * 3
    whole = set_index_bytes(indexes, "e" * 64)
    monkeypatch.setattr(setindex, "_CHUNK", 10)  # a piece per shard, or two
    assert set_index_bytes(indexes, "e" * 64) == whole
    index = SetIndex(whole)
    for shard, own in enumerate(indexes):
        assert index.shard_index(shard).same_samples(own)
        assert all(np.array_equal(a, b) for a, b in zip(index.spans(shard), own.sample_spans()))
    sized = [ShardIndex.from_bytes(own.to_bytes()).measure_sizes(b"", "cls") for own in indexes]  # all 0 x 0
    for n, own in enumerate(sized):
        own.sizes.widths[:] = own.sizes.heights[:] = np.arange(len(own)) + n
    pieces = set_index_bytes(sized, "e" * 64)
    monkeypatch.setattr(setindex, "_CHUNK", 1 << 20)
    assert set_index_bytes(sized, "e" * 64) == pieces
    assert SetIndex(pieces).sizes.widths.tolist() == [i + n for n, own in enumerate(sized) for i in range(len(own))]


# -- compact per-shard metadata: UrlList and ShardTable ---------------------------------------------


def test_a_url_list_reads_like_a_list_of_str():
    strings = ["a.tar", "", "dir/é-ü.tar", "bad-\udcff.tar", "s3://bucket/x y.tar"]
    urls = UrlList(strings)
    assert len(urls) == 5 and list(urls) == strings and urls == strings and strings == urls and urls == tuple(strings)
    assert [urls[i] for i in range(-5, 5)] == strings * 2 and isinstance(urls[np.int64(2)], str)
    for cut in (slice(None), slice(1, 3), slice(3, 1), slice(None, None, -2), slice(-2, None), slice(10, 20)):
        assert urls[cut] == strings[cut]
    assert urls != strings[:4] and urls != strings[:4] + ["x"] and urls != "a.tar" and UrlList(strings[:4]) != urls
    assert urls == UrlList(strings) and "dir/é-ü.tar" in urls and urls.index("") == 1
    for bad in (5, -6):
        with pytest.raises(IndexError):
            urls[bad]
    with pytest.raises(TypeError):
        urls["a"]
    assert UrlList() == [] and len(UrlList([""])) == 1 and UrlList([""])[0] == ""
    assert repr(UrlList(["a", "b"])) == "UrlList(['a', 'b'])"
    assert repr(urls).startswith("UrlList(['a.tar', '', ..., 's3://bucket/x y.tar'], 5 strings")


def test_a_url_list_pickles_as_one_array_that_can_travel_out_of_band():
    small = UrlList([f"/data/shards/s-{n:06d}.tar" for n in range(100)])
    large = UrlList([f"/data/shards/s-{n:06d}.tar" for n in range(100_000)])
    assert pickle.loads(pickle.dumps(large)) == large and pickle.loads(pickle.dumps(small))[7] == small[7]
    # nothing per string beyond the array: the pickle is the array's bytes and a constant
    overhead = [len(pickle.dumps(u, protocol=5)) - u.nbytes for u in (small, large)]
    assert abs(overhead[0] - overhead[1]) < 64, overhead
    assert large.nbytes < 100_000 * (len(large[0]) + 8) + 64
    buffers = []
    packed = pickle.dumps(large, protocol=5, buffer_callback=buffers.append)
    assert len(packed) < 500 and [b.raw().nbytes for b in buffers] == [large.nbytes]
    again = pickle.loads(packed, buffers=[memoryview(buffers[0].raw().tobytes())])  # read-only, as the memfd gives it
    assert again == large and again[-1] == "/data/shards/s-099999.tar"


def test_a_shard_table_encodes_missing_sizes_and_versions():
    entries = [ShardEntry("s3://b/a.tar", 100, '"e1"', 3), ShardEntry("s3://b/b.tar", None, None, 0),
               ShardEntry("s3://b/c.tar", 7, '"e3"', 5)]
    table = ShardTable.from_entries(entries)
    assert len(table) == 3 and table.urls == [e.url for e in entries] and table.starts.tolist() == [0, 3, 3, 8]
    assert table.sizes.tolist() == [100, -1, 7] and table.version(1) is None and table.version(2) == '"e3"'
    assert table.entries() == entries and table.entry(1) is not table.entry(1)
    unversioned = ShardTable(["a", "b"], [1, 2], ["", ""], [1, 1])
    assert unversioned.versions is None and [e.version for e in unversioned.entries()] == [None, None]
    again = pickle.loads(pickle.dumps(table))
    assert again.entries() == entries and again.versions == table.versions
    with pytest.raises(ValueError, match="2 URLs, 1 sizes"):
        ShardTable(["a", "b"], [1], ["", ""], [1, 1])


def many_shards_manifest(path, count):
    """A manifest of ``count`` local shards that are not there (a ShardSet opens it without them)."""
    shardlist = [{"url": f"s-{n:06d}.tar", "nsamples": 10, "filesize": 10240} for n in range(count)]
    path.write_text(json.dumps({"__kind__": "wids-shard-index-v1", "wids_version": 1, "shardlist": shardlist}))
    return str(path)


def test_a_manifest_shardset_holds_no_object_per_shard(tmp_path):
    source = many_shards_manifest(tmp_path / "big.json", 70_000)
    gc.collect()
    before = sum(isinstance(o, ShardEntry) for o in gc.get_objects())
    dataset = ShardSet(source, cache_dir=str(tmp_path / "cache"))
    gc.collect()
    assert sum(isinstance(o, ShardEntry) for o in gc.get_objects()) == before
    assert not [name for name, value in vars(dataset).items() if isinstance(value, (list, tuple, dict)) and len(value) > 1000]
    assert len(dataset) == 700_000 and dataset.urls[5] == str(tmp_path / "s-000005.tar") and dataset.shard_sizes()[:2] == [10, 10]
    entry = dataset.shard_entry(69_999)
    assert (entry.url, entry.size, entry.version, entry.samples, entry.index) == (str(tmp_path / "s-069999.tar"), 10240, None, 10, None)
    assert dataset.locate([0, 699_999])[0].tolist() == [0, 69_999]
    # to a worker started from the fork server, the tables go out of band, into the shared memfd
    shared = []
    packed = dumps(dataset, shared)
    assert len(packed) < 20_000 and sum(b.nbytes for b in shared) >= 70_000 * (8 + 8 + 8 + len("s-000000.tar"))
    again = loads_shared_copy(packed, shared)
    assert again.urls == dataset.urls and again.shard_sizes() == dataset.shard_sizes()


def loads_shared_copy(packed, shared):
    """Unpickle what :func:`hydrax.procs.pickling.dumps` made, its buffers read-only, as workers get them."""
    return pickle.loads(packed, buffers=[memoryview(bytes(b)) for b in shared])


def test_a_glob_shardset_pickles_its_urls_as_an_array(shards, tmp_path):
    dataset = ShardSet(str(tmp_path / "s-*.tar"), cache_dir=str(tmp_path / "cache"))
    assert isinstance(dataset.urls, UrlList) and dataset.urls == shards and dataset.urls[1:] == shards[1:]
    again = pickle.loads(pickle.dumps(dataset))
    assert again.urls == shards and contents(again) == contents(dataset)


def test_a_manifest_shard_loaded_again_after_its_index_was_dropped_keeps_the_version_first_found(tmp_path, monkeypatch):
    from hydrax.shards import shardset

    urls = write_shards(tmp_path, 2, 3)
    write_manifest([ShardEntry(u, None, None, 3) for u in urls], str(tmp_path / "data.json"))  # no sizes, no ETags
    dataset = ShardSet(str(tmp_path / "data.json"), max_indexes=1, cache_dir=str(tmp_path / "cache"))
    seen, real = [], shardset.load_index

    def load(entry, *args, **kwargs):  # as for a remote shard: the index tells the version it was built for
        seen.append((entry.url, entry.size, entry.version))
        index = real(entry, *args, **kwargs)
        index.etag = f'"v{len(seen)}"'
        return index

    monkeypatch.setattr(shardset, "load_index", load)
    dataset.index(0), dataset.index(1), dataset.index(0)
    size = os.path.getsize(urls[0])
    assert seen == [(urls[0], None, None), (urls[1], None, None), (urls[0], size, '"v1"')]
    assert (dataset.shard_entry(1).size, dataset.shard_entry(1).version) == (os.path.getsize(urls[1]), '"v2"')


# -- image sizes ---------------------------------------------------------------------------------


def test_a_set_index_carries_the_image_sizes_when_every_shard_index_has_them_for_one_field(tmp_path):
    pytest.importorskip("PIL")
    from support.imageshards import expected_sizes, write_image_shards

    paths, samples = write_image_shards(tmp_path, count=25, per_shard=10, sizes="img")
    dataset = ShardSet(paths, cache_dir=str(tmp_path / "cache"))
    found = dataset.set_index
    data = open(found.path, "rb").read()
    meta = json.loads(data[HEADER_SIZE:HEADER_SIZE + int.from_bytes(data[20:24], "little")])
    assert int.from_bytes(data[16:20], "little") == 2 and meta["format"] == "hydrax-set-index-v2" and meta["sizes_field"] == "img"
    widths, heights = expected_sizes(samples)
    assert found.sizes.field == "img" and found.sizes.widths.tolist() == widths and found.sizes.heights.tolist() == heights
    assert not found.sizes.widths.flags.writeable and (found.sizes.heights.ctypes.data - found.sizes.widths.ctypes.data) % 64 == 0
    for shard, url in enumerate(paths):
        own, view = open_index(url), dataset.index(shard)
        assert view.sizes.field == "img" and np.array_equal(view.sizes.widths, own.sizes.widths)
        assert np.array_equal(view.sizes.heights, own.sizes.heights)
    again = SetIndex(set_index_bytes([open_index(url) for url in paths], found.digest))
    assert np.array_equal(again.sizes.widths, found.sizes.widths)
    damaged = bytearray(data)
    damaged[-3] ^= 0x10  # in the heights
    with pytest.raises(Exception, match="x.hsix: not a readable hydrax set index .*checksum mismatch"):
        SetIndex(bytes(damaged), "x.hsix")
    # one shard without sizes, or with another field's: no sizes in the set index, which is v1 as before
    mixed = [open_index(url) for url in paths]
    mixed[1].sizes = None
    plain = set_index_bytes(mixed, "d" * 64)
    assert int.from_bytes(plain[16:20], "little") == 1 and SetIndex(plain).sizes is None
    mixed[1] = open_index(paths[1]).measure_sizes(open(paths[1], "rb").read(), "cls")
    assert SetIndex(set_index_bytes(mixed, "d" * 64)).sizes is None
    for index in mixed:
        index.sizes = None
    assert set_index_bytes(mixed, "d" * 64) == plain


def test_a_set_index_older_than_its_first_shards_index_is_rebuilt_with_their_sizes(tmp_path, caplog):
    pytest.importorskip("PIL")
    from support.imageshards import write_image_shards

    from hydrax.shards import index_file

    paths, _ = write_image_shards(tmp_path, count=25, per_shard=10)
    cache = str(tmp_path / "cache")
    first = ShardSet(paths, cache_dir=cache)
    assert first.set_index.sizes is None  # an old set index: version 1
    for url in paths:
        assert index_file(url, sizes="img").sizes_added
    os.utime(first.set_index.path, ns=(1_000_000_000, 1_000_000_000))  # older than the indexes, whatever the clock's grain
    with caplog.at_level(logging.INFO, logger="hydrax.shards.catalog"):
        again = ShardSet(paths, cache_dir=cache)
    assert f"the index of its first shard, {paths[0]!r}, was written after it" in caplog.text
    assert again.set_index.sizes.field == "img" and again.set_index.path == first.set_index.path
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="hydrax.shards.catalog"):
        assert ShardSet(paths, cache_dir=cache).set_index.sizes.field == "img"
    assert "rebuilding" not in caplog.text
