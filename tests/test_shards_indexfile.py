"""Index files beside shards, and wids descriptors."""

import io
import json
import os
import random
import struct
import tarfile
from pathlib import Path

import numpy as np
import pytest

from hydrax.shards import (Sample, ShardFormatError, ShardIndex, build_index, group_samples, index_path, open_index,
                           read_wids_descriptor, scan_members)
from hydrax.shards import indexfile
from hydrax.shards.indexfile import HEADER_SIZE, _to_v1_bytes, count_samples, index_from_bytes


def write_shard(path, folder="img"):
    """50 samples written by webdataset itself, keys ``<folder>/00000``..., some with a json field."""
    wds = pytest.importorskip("webdataset")
    with wds.TarWriter(str(path)) as sink:
        for i in range(50):
            sample = {"__key__": f"{folder}/{i:05d}", "jpg": os.urandom(300 + i), "cls": str(i % 10).encode()}
            if i % 7 == 0:
                sample["json"] = b'{"odd": true}'
            sink.write(sample)
    return path


@pytest.fixture
def shard(tmp_path):
    return write_shard(tmp_path / "train-000000.tar")


def test_an_index_lists_every_sample_with_its_field_locations(shard):
    data = shard.read_bytes()
    index = build_index(shard)
    samples = group_samples(scan_members(data))
    assert len(index) == len(samples) == 50
    for i, sample in enumerate(samples):
        assert index.key(i) == sample.key
        assert index.fields(i) == sample.fields
    offset, size = index.fields(7)["json"]
    assert data[offset : offset + size] == b'{"odd": true}'
    assert index.shard_size == len(data)


def test_an_index_is_built_on_first_use_written_beside_the_shard_and_read_back(shard):
    path = index_path(shard)
    assert not os.path.exists(path)
    first = open_index(shard)
    assert os.path.exists(path)
    again = open_index(shard)
    assert [again.fields(i) for i in range(50)] == [first.fields(i) for i in range(50)]
    assert [again.key(i) for i in range(50)] == [first.key(i) for i in range(50)]
    assert sorted(os.listdir(shard.parent)) == ["train-000000.tar", "train-000000.tar.hidx"]  # no temporaries
    umask = os.umask(0o022)
    os.umask(umask)
    assert os.stat(path).st_mode & 0o777 == 0o666 & ~umask  # as readable as the shard, not private


def test_nothing_is_written_when_asked_not_to(shard):
    open_index(shard, write=False)
    assert not os.path.exists(index_path(shard))


def test_an_index_that_no_longer_matches_its_shard_is_an_error(shard):
    open_index(shard)
    with open(shard, "ab") as f:
        f.write(b"\0" * 512)
    with pytest.raises(ShardFormatError, match=r"train-000000.tar: its index .* was built for a shard of \d+ bytes.*rebuild it"):
        open_index(shard)


def test_a_shard_with_only_a_new_time_keeps_its_index_after_a_header_check(shard):
    first = open_index(shard)
    os.utime(shard, ns=(1_000_000_000, 1_000_000_000))  # as a copy or a git checkout leaves it
    again = open_index(shard)
    assert again.same_samples(first) and again.shard_mtime_ns == 1_000_000_000
    assert ShardIndex.load(index_path(shard)).shard_mtime_ns == 1_000_000_000  # refreshed on disk
    data = bytearray(shard.read_bytes())
    data[512 + 100] ^= 0xFF  # a payload byte of the first member: same size, same headers
    shard.write_bytes(bytes(data))
    assert open_index(shard).same_samples(first)  # the index only describes the headers
    write_shard(shard, "new")  # other keys of the same length: the same size, other contents
    assert shard.stat().st_size == len(data)
    with pytest.raises(ShardFormatError, match="and other contents; delete the index"):
        open_index(shard)


def test_a_damaged_index_file_says_what_to_do(shard):
    with open(index_path(shard), "wb") as f:
        f.write(b"not an index")
    with pytest.raises(ShardFormatError, match="not a readable hydrax index.*delete it"):
        open_index(shard)


def test_an_empty_shard_is_reported(tmp_path):
    path = tmp_path / "empty.tar"
    path.write_bytes(b"")
    with pytest.raises(ShardFormatError, match="empty.tar: at byte offset 0: the shard is empty"):
        open_index(path)


def test_an_index_of_no_samples_round_trips(tmp_path):
    index = ShardIndex.from_samples([], 1024, 5)
    index.save(str(tmp_path / "x.hidx"))
    again = ShardIndex.load(str(tmp_path / "x.hidx"))
    assert len(again) == 0 and again.shard_size == 1024 and again.shard_mtime_ns == 5


def test_wids_descriptors_resolve_relative_urls(tmp_path):
    descriptor = {
        "__kind__": "wids-shard-index-v1",
        "wids_version": 1,
        "name": "demo",
        "shardlist": [{"url": "train-000000.tar", "nsamples": 50}, {"url": "s3://bucket/train-000001.tar", "nsamples": 49}],
    }
    path = tmp_path / "train.json"
    path.write_text(json.dumps(descriptor))
    assert read_wids_descriptor(str(path)) == [(f"{tmp_path}/train-000000.tar", 50), ("s3://bucket/train-000001.tar", 49)]
    descriptor["base"] = "https://example.invalid/data/"
    assert read_wids_descriptor(descriptor)[0] == ("https://example.invalid/data/train-000000.tar", 50)
    with pytest.raises(ShardFormatError, match="shardlist entry 0 needs 'url' and 'nsamples'"):
        read_wids_descriptor({"__kind__": "wids-shard-index-v1", "wids_version": 1, "shardlist": [{"url": "a.tar"}]})
    with pytest.raises(ShardFormatError, match="not a wids-shard-index-v1 descriptor"):
        read_wids_descriptor({"shardlist": []})


# -- the v2 file format ----------------------------------------------------------------------------

def test_an_index_round_trips_through_bytes_with_its_etag(shard):
    index = build_index(shard)
    index.etag = '"9b2cf535f27731c974343645a3985328"'
    data = index.to_bytes()
    assert data == index.to_bytes() and data.startswith(b"hydrax-tar-index") and data[16] == 2
    again = ShardIndex.from_bytes(data, "x.hidx")
    assert again.same_samples(index) and again.etag == index.etag
    assert (again.shard_size, again.shard_mtime_ns) == (index.shard_size, index.shard_mtime_ns)
    assert [again.key(i) for i in range(50)] == [index.key(i) for i in range(50)]
    assert count_samples(data[:HEADER_SIZE]) == count_samples(data) == 50
    assert build_index(shard).etag is None


def test_arrays_start_on_64_byte_boundaries_and_the_file_ends_with_the_last(shard):
    index = build_index(shard)
    data = index.to_bytes()
    meta_length, samples, entries, keys = struct.unpack_from("<IIqqq", data, 16)[1:]
    meta = json.loads(data[64 : 64 + meta_length])
    assert meta == {"format": "hydrax-tar-index-v2", "shard_size": index.shard_size, "shard_mtime_ns": index.shard_mtime_ns,
                    "etag": None, "fields": ["cls", "jpg", "json"]}
    at = 64 + meta_length
    for array, dtype, count in ((index._key_bytes, "<u1", keys), (index._key_ends, "<i8", samples),
                                (index._sample_ends, "<i8", samples), (index._entry_field, "<i4", entries),
                                (index._entry_offset, "<i8", entries), (index._entry_size, "<i8", entries)):
        at = -(-at // 64) * 64
        assert np.array_equal(np.frombuffer(data, dtype, count, at), array)
        at += count * np.dtype(dtype).itemsize
    assert at == len(data) and (samples, entries) == (50, 108)


def test_field_names_and_keys_that_are_not_plain_text_survive_a_save(tmp_path):
    samples = [Sample("caf\udce9/ключ", {"jp\udcffg": (512, 3), "été": (1536, 4)})]
    index = ShardIndex.from_samples(samples, 4096, 7, etag="v1")
    index.save(str(tmp_path / "x.hidx"))
    again = ShardIndex.load(str(tmp_path / "x.hidx"))
    assert again.key(0) == "caf\udce9/ключ" and again.fields(0) == samples[0].fields and again.etag == "v1"


def test_v1_indexes_are_still_read_and_rewritten_as_v2_by_open_index(shard):
    fresh = open_index(shard)
    path = index_path(shard)
    with open(path, "wb") as f:
        f.write(_to_v1_bytes(fresh))
    old = ShardIndex.load(path)
    assert old.same_samples(fresh) and old.etag is None and count_samples(path) == 50
    assert open_index(shard, write=False).same_samples(fresh)
    assert Path(path).read_bytes()[:4] == b"PK\x03\x04"  # not written
    assert open_index(shard).same_samples(fresh)
    assert Path(path).read_bytes() == fresh.to_bytes()


def test_sample_spans_cover_each_samples_fields(shard):
    index = build_index(shard)
    starts, ends = index.sample_spans()
    for i in (0, 7, 49):
        spans = index.fields(i).values()
        assert (starts[i], ends[i]) == (min(o for o, _ in spans), max(o + n for o, n in spans))
    empty = ShardIndex.from_samples([], 1024, 0).sample_spans()
    assert [len(a) for a in empty] == [0, 0]


def test_index_from_bytes_matches_build_index(shard):
    data = shard.read_bytes()
    stat = shard.stat()
    assert index_from_bytes(data, str(shard), stat.st_size, stat.st_mtime_ns).to_bytes() == build_index(shard).to_bytes()
    assert index_from_bytes(memoryview(data)).shard_size == len(data)


def test_a_damaged_local_shard_is_a_format_error_not_a_buffer_error(tmp_path):
    path = tmp_path / "bad.tar"
    path.write_bytes(b"\0" * 100)
    with pytest.raises(ShardFormatError, match="bad.tar: at byte offset 0: .*truncated"):
        build_index(path)
    path.write_bytes(archive_with_a_duplicate())
    with pytest.raises(ShardFormatError, match="has field 'jpg' twice"):
        build_index(path)


def archive_with_a_duplicate():
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name in ("k.jpg", "k.JPG"):
            info = tarfile.TarInfo(name)
            info.size = 1
            tar.addfile(info, io.BytesIO(b"x"))
    return buffer.getvalue()


def reseal(data: bytearray) -> bytes:
    """``data`` with its header checksum recomputed, so the structure checks behind it are reached."""
    data[48:52] = struct.pack("<I", indexfile._crc(bytes(data)))
    return bytes(data)


def inconsistent(index, v1=False, **arrays):
    """``index`` with some arrays replaced, as file bytes: the writers write whatever it holds."""
    copy = ShardIndex(index.shard_size, index.shard_mtime_ns, index.field_names, index._key_bytes, index._key_ends,
                      index._sample_ends, index._entry_field, index._entry_offset, index._entry_size)
    for name, value in arrays.items():
        setattr(copy, "_" + name, np.asarray(value, getattr(index, "_" + name).dtype))
    return _to_v1_bytes(copy) if v1 else copy.to_bytes()


def test_every_inconsistency_is_named(shard):
    index = build_index(shard)
    ke, se, ef, eo, es = index._key_ends, index._sample_ends, index._entry_field, index._entry_offset, index._entry_size
    cases = [
        (inconsistent(index, key_ends=ke[::-1]), "keys do not end in order"),
        (inconsistent(index, key_ends=ke - 1), "keys do not end in order"),
        (inconsistent(index, sample_ends=np.r_[se[:3], se[2], se[4:]]), "each after at least one field"),
        (inconsistent(index, sample_ends=se + 1), "samples do not end in order"),
        (inconsistent(index, entry_field=np.r_[ef[:-1], 3]), "field numbers outside the 3 fields"),
        (inconsistent(index, entry_field=np.r_[-1, ef[1:]]), "field numbers outside"),
        (inconsistent(index, entry_offset=np.r_[eo[:-1], index.shard_size]), f"a field lies outside the shard of {index.shard_size} bytes"),
        (inconsistent(index, entry_size=np.r_[-1, es[1:]]), "a field lies outside"),
        (inconsistent(index, entry_offset=np.r_[-(2**62), eo[1:]]), "a field lies outside"),
        (inconsistent(index, entry_size=np.r_[2**63 - 1, es[1:]]), "a field lies outside"),
        (inconsistent(index, v1=True, key_ends=ke[:-1]), "differ in length"),  # v2 has one count for both
        (inconsistent(index, v1=True, entry_size=es[:-1]), "differ in length"),
        (inconsistent(index, v1=True, entry_field=np.r_[ef[:-1], 7]), "field numbers outside"),
        (b"hydrax-tar-index" + bytes(10), "shorter than the 64-byte header"),
        (b"GARBAGE" * 20, "neither a hydrax-tar-index-v2 or v3 file nor a v1 .npz archive"),
    ]
    data = index.to_bytes()
    meta_length = struct.unpack_from("<I", data, 20)[0]
    for meta in (b'{"format": "hydrax-tar-index-v3"}', b"[1, 2]", b"\xff\xfe", b'{"format": "hydrax-tar-index-v2", "shard_size": -1}',
                 b'{"format": "hydrax-tar-index-v2", "shard_size": 1e3, "shard_mtime_ns": 0}'):
        meta = meta.ljust(meta_length)
        cases.append((reseal(bytearray(data[:64] + meta + data[64 + meta_length :])), "meta data|JSON|whole numbers"))
    bad_fields = json.loads(data[64 : 64 + meta_length])
    bad_fields["fields"] = ["jpg", "jpg", "cls"]
    text = json.dumps(bad_fields).encode().ljust(meta_length)
    cases.append((reseal(bytearray(data[:64] + text + data[64 + meta_length :])), "are not distinct names"))
    for header_field, value in ((16, 4), (16, 3), (24, 49), (32, 109), (40, 10**6)):
        changed = bytearray(data)
        struct.pack_into("<I" if header_field == 16 else "<q", changed, header_field, value)
        cases.append((reseal(changed), "version 4|bytes, but its header describes|do not end in order"))
    for number, (data_, pattern) in enumerate(cases):
        with pytest.raises(ShardFormatError, match=rf"case{number}.hidx: not a readable hydrax index \((.*)({pattern})"):
            ShardIndex.from_bytes(data_, f"case{number}.hidx")


def test_damaged_index_files_are_format_errors_naming_the_file(shard, tmp_path):
    """Truncations and bit flips of v2 and v1 files, checksums resealed or not: a ShardFormatError
    naming the file, or (when a change leaves the arrays consistent) an index that holds together."""
    rng = random.Random(5)
    index = build_index(shard)
    path = str(tmp_path / "x.hidx")
    for original, resealable in ((index.to_bytes(), True), (_to_v1_bytes(index), False)):
        for attempt in range(400):
            data = bytearray(original)
            if attempt % 4 == 0:
                del data[rng.randrange(len(data)) :]
            else:
                for _ in range(rng.randint(1, 3)):
                    spot = rng.randrange(len(data)) if rng.random() < 0.5 else rng.randrange(min(len(data), 400))
                    data[spot] ^= 1 << rng.randrange(8)
            if resealable and rng.random() < 0.5 and len(data) >= 64:
                data = bytearray(reseal(data))
            with open(path, "wb") as f:
                f.write(data)
            try:
                loaded = ShardIndex.load(path)
            except ShardFormatError as exc:
                assert str(exc).startswith(f"{path}: not a readable hydrax index (")
                continue
            for i in range(len(loaded)):  # a change that kept it consistent: every field inside the shard
                assert all(0 <= o and o + n <= loaded.shard_size for o, n in loaded.fields(i).values())
                loaded.key(i)


def test_arrays_are_the_index_in_file_order(shard):
    index = build_index(shard)
    key_bytes, key_ends, sample_ends, entry_field, entry_offset, entry_size = index.arrays()
    assert bytes(key_bytes[: key_ends[0]]).decode() == index.key(0) and len(sample_ends) == len(index) == 50
    names = index.field_names
    first = {names[f]: (o, n) for f, o, n in zip(entry_field[: sample_ends[0]], entry_offset, entry_size)}
    assert first == index.fields(0)
    assert ShardIndex(index.shard_size, index.shard_mtime_ns, names, *index.arrays()).same_samples(index)
