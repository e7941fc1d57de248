"""ShardSet: local shards as a DataGroup's data, read zero-copy in the workers."""

import os
import pickle

import jax.numpy as jnp
import numpy as np
import pytest

from hydrax import Dataloader, DataGroup
from hydrax.errors import HydraxError
from hydrax.shards import SampleRef, ShardSet, expand_urls


@pytest.fixture(autouse=True)
def private_cache(tmp_path_factory, monkeypatch):
    """Set indexes go into a folder of the test's, not the user's cache."""
    folder = tmp_path_factory.mktemp("cache")
    monkeypatch.setenv("HYDRAX_CACHE", str(folder))
    return folder


@pytest.fixture
def shards(tmp_path):
    wds = pytest.importorskip("webdataset")
    for s in range(3):
        with wds.TarWriter(str(tmp_path / f"train-{s:04d}.tar")) as sink:
            for i in range(10 + s):  # uneven shards
                n = s * 100 + i
                sink.write({"__key__": f"k{n:05d}", "cls": str(n).encode(), "bin": np.full(8, n, np.int32).tobytes()})
    return tmp_path


def load_shard_sample(sample, arrays, seed):
    arrays["cls"][...] = int(bytes(sample["cls"]))
    arrays["bin"][:] = np.frombuffer(sample["bin"], np.int32)
    return {"key": sample["__key__"], "url": os.path.basename(sample["__url__"])}


def test_urls_expand_from_braces_globs_and_file_urls(shards):
    brace = expand_urls(f"{shards}/train-{{0000..0002}}.tar")
    assert brace == [f"{shards}/train-{s:04d}.tar" for s in range(3)]
    assert expand_urls(f"file://{shards}/train-*.tar") == brace
    assert expand_urls([brace[2], brace[0]]) == [brace[2], brace[0]]
    with pytest.raises(FileNotFoundError, match="matches no file"):
        expand_urls(f"{shards}/nothing-*.tar")
    with pytest.raises(NotImplementedError, match="the ftp:// scheme is not supported"):
        expand_urls("ftp://host/train-0000.tar")
    assert expand_urls("gs://bucket/train-{0..1}.tar") == ["gs://bucket/train-0.tar", "gs://bucket/train-1.tar"]
    assert expand_urls("s3://bucket/train-{0..1}.tar") == ["s3://bucket/train-0.tar", "s3://bucket/train-1.tar"]


def test_a_shardset_is_a_sequence_of_samples_equal_to_webdataset(shards):
    wds = pytest.importorskip("webdataset")
    dataset = ShardSet(f"{shards}/train-{{0000..0002}}.tar")
    assert len(dataset) == 33 and dataset.shard_sizes() == [10, 11, 12]
    urls = expand_urls(f"{shards}/train-{{0000..0002}}.tar")
    assert dataset.urls == urls and list(dataset.urls) == urls and dataset.urls[1:] == urls[1:] and dataset.urls[-1] == urls[-1]
    theirs = list(wds.WebDataset(f"{shards}/train-{{0000..0002}}.tar", shardshuffle=False))
    for ours, sample in zip(dataset, theirs):
        assert isinstance(ours, SampleRef)
        assert ours.key == ours["__key__"] == sample["__key__"]
        assert ours.url == ours["__url__"] == sample["__url__"]
        assert {f: bytes(ours[f]) for f in ours} == {f: sample[f] for f in ("cls", "bin")}
    assert isinstance(dataset[5]["bin"], memoryview)  # zero-copy view of the mapped shard
    assert dataset[-1].key == "k00211" and [s.key for s in dataset[9:11]] == ["k00009", "k00100"]
    with pytest.raises(KeyError, match="has no field 'jpg'") as caught:
        dataset[0]["jpg"]
    # a KeyError, as for any mapping, but one of hydrax's errors, with the place as fields
    assert isinstance(caught.value, HydraxError) and (caught.value.key, caught.value.field) == ("k00000", "jpg")
    assert caught.value.url.endswith("train-0000.tar") and str(caught.value).startswith("sample 'k00000'")
    assert pickle.loads(pickle.dumps(caught.value)).field == "jpg"
    with pytest.raises(IndexError):
        dataset[33]
    assert sorted(os.listdir(shards)) == sorted([f"train-{s:04d}.tar" for s in range(3)] + [f"train-{s:04d}.tar.hidx" for s in range(3)])


def test_a_shardset_pickles_without_its_mappings(shards, private_cache):
    dataset = ShardSet(f"{shards}/train-*.tar")
    bytes(dataset[3]["cls"])
    dataset.index(1)
    packed = pickle.dumps(dataset)
    assert b"k00003" not in packed and len(packed) < 2000  # the set index's path, not the samples
    again = pickle.loads(packed)
    assert again._maps == {} and len(again._held_indexes) == 0 and bytes(again[3]["cls"]) == b"3"
    assert again.set_index.path == dataset.set_index.path and again.set_index.path.startswith(str(private_cache))


def test_a_missing_shard_is_named(shards):
    with pytest.raises(FileNotFoundError, match="shard '.*train-0009.tar' does not exist"):
        ShardSet([f"{shards}/train-0000.tar", f"{shards}/train-0009.tar"])


def test_a_datagroup_over_shards_loads_through_workers(shards):
    dataset = ShardSet(f"{shards}/train-{{0000..0002}}.tar")
    group = DataGroup(4, dataset, loader_arrays={"cls": ((), np.int32, jnp.int32), "bin": ((8,), np.int32, jnp.int32)}, seed=3)
    seen = []
    with Dataloader(load_shard_sample, group, loader_count=2, end_at=("epoch", 2)) as loader:
        for batch in loader:
            cls = np.asarray(batch.arrays["cls"]).tolist()
            assert cls == [int(bytes(dataset[i]["cls"])) for i in batch.indices]
            assert (np.asarray(batch.arrays["bin"]) == np.array(cls)[:, None]).all()
            assert batch.get_additional("key") == [dataset[i].key for i in batch.indices]
            seen += cls
            del batch
    assert len(seen) == 2 * 8 * 4 and len(set(seen)) > 20


# -- manifests that give no shard sizes: counts checked at set-up all the same ---------------------


def write_small_shards(folder, count=2, per_shard=3):
    from hydrax.shards import ShardWriter

    with ShardWriter(str(folder / "p-%03d.tar"), maxcount=per_shard) as writer:
        for i in range(count * per_shard):
            writer.write({"__key__": f"p{i:04d}", "cls": str(i)})
    return writer.paths


def manifest_without_sizes(path, shardlist, **fields):
    """A wids manifest as other writers make them: URLs and counts, no ``filesize``."""
    import json

    path.write_text(json.dumps({"__kind__": "wids-shard-index-v1", "wids_version": 1, **fields, "shardlist": shardlist}))
    return str(path)


@pytest.mark.parametrize("claim", [10**8, 2**62 - 1])
def test_a_count_is_checked_against_its_shard_when_the_manifest_gives_no_size(tmp_path, claim):
    """The count once sized the run's orders unchecked (2**62 samples: an order no memory holds)."""
    import re

    from hydrax.errors import ShardFormatError

    paths = write_small_shards(tmp_path)
    manifest = manifest_without_sizes(tmp_path / "m.json", [{"url": "p-001.tar", "nsamples": claim}])
    words = f"the manifest says shard {paths[1]} holds {claim} samples, more than its {os.path.getsize(paths[1])} bytes can hold"
    with pytest.raises(ShardFormatError, match=re.escape(words)) as raised:
        ShardSet(manifest)
    assert raised.value.url == manifest and str(raised.value).startswith(f"{manifest}: ")
    assert ShardSet(manifest_without_sizes(tmp_path / "ok.json", [{"url": "p-001.tar", "nsamples": 3}])).shard_sizes() == [3]
    # counts that no set of shards holds in all (their running sums would wrap): refused whatever the sizes
    manifest_without_sizes(tmp_path / "m.json", [{"url": "p-000.tar", "nsamples": 2**62 - 1}] * 3)
    with pytest.raises(ShardFormatError, match=f"the manifest claims {3 * (2**62 - 1)} samples in all, more than any set of shards"):
        ShardSet(manifest)


def test_missing_shards_of_a_manifest_may_claim_only_a_bounded_count(tmp_path):
    from hydrax.errors import ObjectNotFoundError
    from hydrax.shards.manifest import UNCHECKED_SAMPLES

    write_small_shards(tmp_path)
    small = manifest_without_sizes(tmp_path / "small.json", [{"url": "p-000.tar", "nsamples": 3}, {"url": "gone.tar", "nsamples": 2}])
    dataset = ShardSet(small)
    assert dataset.shard_sizes() == [3, 2]  # as ever: a missing shard is named when it is read
    with pytest.raises(ObjectNotFoundError, match="gone.tar'?, listed in the manifest, does not exist"):
        _ = dataset[4].key
    claim = UNCHECKED_SAMPLES + 1
    big = manifest_without_sizes(tmp_path / "big.json", [{"url": "p-000.tar", "nsamples": 3}, {"url": "gone.tar", "nsamples": claim}])
    with pytest.raises(ObjectNotFoundError, match=f"listed in the manifest {big} with {claim} samples, does not exist") as raised:
        ShardSet(big)
    assert raised.value.url == str(tmp_path / "gone.tar") and "restore the shards or rewrite the manifest" in str(raised.value)


def test_a_manifest_of_http_shards_without_sizes_is_checked_with_a_head_each(http_store):
    from hydrax.errors import ShardFormatError
    from hydrax.shards import ReadAhead

    base, folder = http_store
    paths = write_small_shards(folder)
    shardlist = [{"url": os.path.basename(p), "nsamples": 3} for p in paths] * 2  # listed twice: asked once
    manifest_without_sizes(folder / "m.json", shardlist)
    dataset = ShardSet(f"{base}/m.json", readahead=ReadAhead(enabled=False))
    entry = dataset.shard_entry(1)
    assert entry.size == os.path.getsize(paths[1]) and entry.version  # found at set-up: reads are pinned to it
    assert [int(bytes(s["cls"])) for s in dataset] == list(range(6)) * 2
    shardlist[3]["nsamples"] = 10**8
    manifest_without_sizes(folder / "m.json", shardlist)
    with pytest.raises(ShardFormatError, match=f"holds {10**8} samples, more than its") as raised:
        ShardSet(f"{base}/m.json")
    assert raised.value.url == f"{base}/m.json"


@pytest.mark.parametrize("listed, words", [
    ("sub", "which is not a file"),  # a folder: once a raw IsADirectoryError when read
    ("/dev/null", "which is not a file"),  # a device (or a pipe, which could block forever)
    ("s3:///x.tar", "which names no object"),  # once a raw ValueError
    ("https://host/" + "k" * 9000, "longer than any store takes"),  # once a panic in the HTTP client
    ("https://host/\udcff.tar", "it is not UTF-8"),
])
def test_a_manifest_entry_that_can_name_no_shard_is_refused_at_set_up(tmp_path, listed, words):
    from hydrax.errors import ShardFormatError

    (tmp_path / "sub").mkdir()
    manifest = manifest_without_sizes(tmp_path / "m.json", [{"url": listed, "nsamples": 1}])
    with pytest.raises(ShardFormatError, match=words) as raised:
        ShardSet(manifest)
    assert raised.value.url == manifest


def test_a_relative_base_is_relative_to_the_manifest_not_the_current_folder(tmp_path, monkeypatch):
    (tmp_path / "data").mkdir()
    (tmp_path / "elsewhere").mkdir()
    paths = write_small_shards(tmp_path / "data")
    manifest = manifest_without_sizes(tmp_path / "m.json", [{"url": os.path.basename(p), "nsamples": 3} for p in paths], base="data")
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert ShardSet(manifest).urls == paths


def test_json_nested_deeper_than_the_stack_is_a_format_error_naming_the_manifest(tmp_path):
    from hydrax.errors import ShardFormatError
    from hydrax.shards import read_wids_descriptor

    path = tmp_path / "m.json"
    path.write_text('{"__kind__": "wids-shard-index-v1", "wids_version": 1, "shardlist": ' + "[" * 100_000 + "]" * 100_000 + "}")
    for read in (ShardSet, read_wids_descriptor):
        with pytest.raises(ShardFormatError, match="nested too deeply") as raised:
            read(str(path))
        assert raised.value.url == str(path)


def test_file_urls_in_a_manifest_are_local_paths_not_names_in_the_current_folder(tmp_path, monkeypatch):
    """``file:///data/a.tar`` was opened as the relative path ``file:/data/a.tar``."""
    paths = write_small_shards(tmp_path)
    monkeypatch.chdir(tmp_path)
    listed = [{"url": "file://" + paths[0], "nsamples": 3}, {"url": "FILE://" + paths[1], "nsamples": 3}]
    assert ShardSet(manifest_without_sizes(tmp_path / "m.json", listed)).urls == paths
    relative = [{"url": os.path.basename(p), "nsamples": 3} for p in paths]
    assert ShardSet(manifest_without_sizes(tmp_path / "b.json", relative, base=f"file://{tmp_path}")).urls == paths
    assert [int(bytes(s["cls"])) for s in ShardSet(str(tmp_path / "b.json"))] == list(range(6))


def test_a_base_longer_than_any_folder_is_refused_before_it_is_copied_into_every_url(tmp_path):
    from hydrax.errors import ShardFormatError

    manifest = manifest_without_sizes(tmp_path / "m.json", [{"url": "a.tar", "nsamples": 1}] * 1000, base="b" * 10_000)
    with pytest.raises(ShardFormatError, match="has 10000 characters, more than a folder's path or URL takes") as raised:
        ShardSet(manifest)
    assert raised.value.url == manifest
