"""Index files beside shards, and wids descriptors."""

import json
import os

import pytest

from hydrax.shards import ShardFormatError, ShardIndex, build_index, group_samples, index_path, open_index, read_wids_descriptor, scan_members


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
