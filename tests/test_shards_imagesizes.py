"""ShardSet.image_sizes: every item's image size from the indexes, local (views of the set index,
or the headers read from the shards) and remote (from index objects, against a real S3-protocol server)."""

import logging
import os

import numpy as np
import pytest
from support.imageshards import expected_sizes, write_image_shards

from hydrax.errors import SizesNotRecordedError
from hydrax.shards import ShardEntry, ShardSet, index_file, write_manifest
from hydrax.shards.options import StoreOptions
from hydrax.shards.publish import publish_indexes

pytest.importorskip("PIL")


def test_local_shards_with_recorded_sizes_give_views_of_the_set_index(tmp_path, caplog):
    paths, samples = write_image_shards(tmp_path, count=25, per_shard=10, sizes="img")
    dataset = ShardSet(paths, cache_dir=str(tmp_path / "cache"))
    with caplog.at_level(logging.INFO):
        widths, heights = dataset.image_sizes("img")
        assert dataset.image_sizes()[0] is not None
    assert (widths.tolist(), heights.tolist()) == expected_sizes(samples) and len(widths) == len(dataset) == 25
    assert widths.dtype == heights.dtype == np.int32 and not widths.flags.writeable
    mapping = np.frombuffer(dataset.set_index._data, np.uint8)  # noqa: SLF001  (the test looks inside)
    assert np.shares_memory(widths, mapping) and np.shares_memory(heights, mapping)  # no copy
    assert "read the image headers" not in caplog.text
    assert [(widths[i], heights[i]) for i in (1, 8, 10)] == [(30, 41), (0, 0), (37, 23)]


def test_local_shards_without_sizes_have_their_headers_read_and_logged_once_with_the_command(tmp_path, caplog):
    paths, samples = write_image_shards(tmp_path, count=25, per_shard=10)
    dataset = ShardSet(paths, cache_dir=str(tmp_path / "cache"))
    with caplog.at_level(logging.INFO, logger="hydrax"):
        widths, heights = dataset.image_sizes("img")
    assert (widths.tolist(), heights.tolist()) == expected_sizes(samples)
    logged = [r.getMessage() for r in caplog.records if "image headers" in r.getMessage()]
    assert len(logged) == 1 and "of 25 samples from 3 local shard(s)" in logged[0], logged
    assert f"hydrax shards index --sizes img {paths[0]} {paths[1]} {paths[2]}" in logged[0]
    assert dataset.index(0).sizes is None  # nothing recorded, in memory or on disk, by reading them
    with pytest.raises(SizesNotRecordedError, match="no field named, and the shards' indexes record none"):
        dataset.image_sizes()
    # the shards' own indexes gain sizes after the set index was built: they are used, not the headers
    index_file(paths[1], sizes="img")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="hydrax"):
        assert dataset.image_sizes()[0].tolist() == widths.tolist()  # the one field recorded
    assert "of 15 samples from 2 local shard(s)" in caplog.text


def test_a_manifest_of_local_shards_gathers_the_sizes_of_each_index(tmp_path):
    paths, samples = write_image_shards(tmp_path, count=25, per_shard=10, sizes="img")
    write_manifest([ShardEntry(p, os.path.getsize(p), None, n) for p, n in zip(paths, (10, 10, 5))], str(tmp_path / "set.json"))
    dataset = ShardSet(str(tmp_path / "set.json"), cache_dir=str(tmp_path / "cache"))
    assert dataset.set_index is None
    widths, heights = dataset.image_sizes()
    assert (widths.tolist(), heights.tolist()) == expected_sizes(samples) and widths.dtype == np.int32


def upload(paths, client, prefix="img"):
    for path in paths:
        client.upload_file(path, "data", f"{prefix}/{os.path.basename(path)}")
    return [f"s3://data/{prefix}/{os.path.basename(p)}" for p in paths]


def test_remote_shards_give_the_sizes_their_index_objects_record_without_reading_a_shard(proxied, tmp_path):
    options, proxy, client = proxied
    paths, samples = write_image_shards(tmp_path, count=25, per_shard=10, index=False)
    urls = upload(paths, client)
    entries = publish_indexes(urls, StoreOptions(s3=options), sizes="img")
    assert [e.size_counts.sized for e in entries] == [7, 7, 5]
    cache = str(tmp_path / "cache")
    for source in ("s3://data/img/s-*.tar", urls):  # counts from the folder summary: indexes loaded by image_sizes
        dataset = ShardSet(source, s3=options, cache_dir=cache)
        proxy.clear()
        widths, heights = dataset.image_sizes()
        assert (widths.tolist(), heights.tolist()) == expected_sizes(samples)
        assert proxy.requests_matching(r"\.tar$", method="GET") == []  # no image read


def test_remote_shards_without_sizes_name_the_command_that_records_them(proxied, tmp_path):
    options, proxy, client = proxied
    paths, samples = write_image_shards(tmp_path, count=25, per_shard=10, index=False)
    urls = upload(paths, client)
    publish_indexes(urls, StoreOptions(s3=options))
    cache = str(tmp_path / "cache")
    dataset = ShardSet(urls, s3=options, cache_dir=cache)
    assert len(dataset) == 25  # every index is cached now, without sizes
    with pytest.raises(SizesNotRecordedError) as caught:
        dataset.image_sizes("img")
    command = f"hydrax shards index --sizes img {' '.join(urls)} --endpoint-url {options.endpoint_url}"
    assert command in str(caught.value) and caught.value.url == urls[0] and caught.value.field == "img"
    assert "3 of the set's 3 shards have no image sizes of field 'img'" in str(caught.value)
    # Once recorded, the same ShardSet finds them: its cached indexes predate them, the objects are read again.
    publish_indexes(urls, StoreOptions(s3=options), sizes="img")
    proxy.clear()
    assert dataset.image_sizes("img")[0].tolist() == expected_sizes(samples)[0]
    assert proxy.requests_matching(r"\.tar$", method="GET") == []
    again = ShardSet(urls, s3=options, cache_dir=cache)  # from the cache, which now holds them
    proxy.clear()
    assert again.image_sizes()[1].tolist() == expected_sizes(samples)[1]
    assert proxy.requests_matching(r"\.hidx$", method="GET") == []
