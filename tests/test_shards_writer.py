"""ShardWriter: webdataset's layout, byte for byte, plus an index beside every shard."""

import os

import pytest

from hydrax.shards import ShardIndex, ShardSet, ShardWriter, group_samples, index_path, scan_members


def samples(count):
    for i in range(count):
        key = f"s{i:05d}" if i % 10 else f"long/{'d' * 120}/s{i:05d}ü"  # some need pax records
        yield {"__key__": key, "txt": f"sample {i}", "bin": bytes([i % 256]) * (50 + i), "cls": str(i % 7).encode()}


def test_shards_are_byte_identical_to_webdatasets_for_the_same_samples(tmp_path):
    wds = pytest.importorskip("webdataset")
    theirs = wds.ShardWriter(str(tmp_path / "wds-%04d.tar"), maxcount=40, mtime=1234, encoder=False, verbose=0)
    with ShardWriter(str(tmp_path / "ours-%04d.tar"), maxcount=40, mtime=1234) as ours:
        for sample in samples(100):
            ours.write(sample)
            theirs.write({k: v.encode() if isinstance(v, str) and k != "__key__" else v for k, v in sample.items()})
    theirs.close()
    assert ours.paths == [str(tmp_path / f"ours-{n:04d}.tar") for n in range(3)]
    for n in range(3):
        assert (tmp_path / f"ours-{n:04d}.tar").read_bytes() == (tmp_path / f"wds-{n:04d}.tar").read_bytes()


def test_webdataset_reads_our_shards_back_as_the_samples_written(tmp_path):
    wds = pytest.importorskip("webdataset")
    written = list(samples(100))
    with ShardWriter(str(tmp_path / "ours-%04d.tar"), maxcount=40) as ours:
        for sample in written:
            ours.write(sample)
    read = list(wds.WebDataset(str(tmp_path / "ours-{0000..0002}.tar"), shardshuffle=False))
    assert [r["__key__"] for r in read] == [s["__key__"] for s in written]
    for r, s in zip(read, written):
        assert r["txt"] == s["txt"].encode() and r["bin"] == s["bin"] and r["cls"] == s["cls"]
        assert set(r) - {"__key__", "__url__", "__local_path__"} == {"txt", "bin", "cls"}


def test_identical_input_gives_identical_shards(tmp_path):
    for name in ("a", "b"):
        with ShardWriter(str(tmp_path / f"{name}-%02d.tar"), maxcount=30) as writer:
            for sample in samples(50):
                writer.write(sample)
    for n in range(2):
        assert (tmp_path / f"a-{n:02d}.tar").read_bytes() == (tmp_path / f"b-{n:02d}.tar").read_bytes()


def test_the_index_written_beside_each_shard_matches_a_scan(tmp_path):
    with ShardWriter(str(tmp_path / "x-%02d.tar"), maxsize=2000) as writer:
        for sample in samples(60):
            writer.write(sample)
    assert len(writer.paths) > 2
    for path in writer.paths:
        index = ShardIndex.load(index_path(path))
        scanned = group_samples(scan_members(open(path, "rb").read()))
        assert [index.key(i) for i in range(len(index))] == [s.key for s in scanned]
        assert [index.fields(i) for i in range(len(index))] == [s.fields for s in scanned]
        assert index.shard_size == os.path.getsize(path)
    dataset = ShardSet([str(p) for p in writer.paths])  # opens the written indexes as they are
    assert [s.key for s in dataset] == [next(iter([sample["__key__"]])) for sample in samples(60)]
    assert bytes(dataset[59]["txt"]) == b"sample 59"


def test_maxsize_counts_payload_bytes_and_rolls_over_before_a_write(tmp_path):
    with ShardWriter(str(tmp_path / "y-%02d.tar"), maxsize=100) as writer:
        for i in range(4):
            writer.write({"__key__": f"k{i}", "bin": b"x" * 60})
    sizes = [len(ShardIndex.load(index_path(p))) for p in writer.paths]
    assert sizes == [2, 2]  # 60 < 100 takes a second sample; 120 >= 100 rolls over


def test_a_writer_that_wrote_nothing_leaves_nothing(tmp_path):
    with ShardWriter(str(tmp_path / "z-%02d.tar")):
        pass
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    "sample, error, message",
    [
        ({"txt": b"x"}, ValueError, "needs a non-empty str '__key__'"),
        ({"__key__": "a.b", "txt": b"x"}, ValueError, "has a '.' after its last '/'"),
        ({"__key__": "k", "txt": 3}, TypeError, "field 'txt' is int; encode it to bytes first"),
        ({"__key__": "k"}, ValueError, "has no fields to write"),
        ({"__key__": "k", "JPG": b"1", "jpg": b"2"}, ValueError, "differ only in case"),
    ],
)
def test_bad_samples_are_refused(tmp_path, sample, error, message):
    with ShardWriter(str(tmp_path / "e-%02d.tar")) as writer:
        with pytest.raises(error, match=message):
            writer.write(sample)


def test_consecutive_samples_with_one_key_are_refused(tmp_path):
    with ShardWriter(str(tmp_path / "d-%02d.tar")) as writer:
        writer.write({"__key__": "same", "txt": b"1"})
        with pytest.raises(ValueError, match="follows a sample with the same key"):
            writer.write({"__key__": "same", "cls": b"2"})


def test_a_pattern_without_a_number_is_refused(tmp_path):
    with pytest.raises(ValueError, match="printf-style number"):
        ShardWriter(str(tmp_path / "plain.tar"))
