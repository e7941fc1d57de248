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
    assert again._maps == {} and again._indexes == {} and bytes(again[3]["cls"]) == b"3"
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
