"""hydrax.shards.indexpool: set-up's indexing of shards without an index, in processes of its own,
against a real S3 server behind the fault proxy."""

import multiprocessing as mp
import os
import threading
import time

import numpy as np
import pytest

from hydrax.errors import AccessDeniedError
from hydrax.shards import ShardSet, indexpool
from hydrax.shards import indexsource
from hydrax.shards.shardtable import ShardEntry
from support.timing import slack
from test_shards_remote import folder_bytes, load_checked, run_epochs, write_shards


@pytest.fixture
def pooled(monkeypatch):
    """Set-up indexes in processes from the first byte (the floor is for real buckets), and this
    process's own indexing is recorded."""
    monkeypatch.setattr(indexpool, "POOL_MIN_BYTES", 0)
    built_here: list[str] = []
    real = indexsource.build_index_async

    async def recorded(entry, store, sink=None):
        built_here.append(entry.url)
        return await real(entry, store, sink)

    monkeypatch.setattr(indexsource, "build_index_async", recorded)
    return built_here


def indexing_processes() -> list:
    return [p for p in mp.active_children() if p.name.startswith("hydrax-index-")]


@pytest.mark.parametrize("fetchers", [1, 3])
def test_indexing_processes_read_each_shard_once_and_their_bytes_become_the_read_ahead(proxied, tmp_path, pooled, fetchers):
    """No shard byte passes through the training process at set-up: the children read each
    shard whole once, send its index (the same as one built here) and keep its chunk files, so
    set-up and the first (shuffled) epoch fetch the data about once; no child is left. With a
    pool of 3 fetch processes, each is given the kept files of its own shards."""
    from hydrax.shards.readahead import ReadAhead

    options, proxy, client = proxied
    urls = write_shards(tmp_path, client, count=6, indexes=False)
    total = sum(client.head_object(Bucket="data", Key=u[len("s3://data/"):])["ContentLength"] for u in urls)
    proxy.clear()
    dataset = ShardSet(urls, s3=options, cache_dir=str(tmp_path / "cache"), readahead=ReadAhead(fetch_processes=fetchers))
    assert pooled == [] and not indexing_processes()
    assert len(proxy.requests_matching(r"\.tar$", method="GET")) == 6
    here = ShardSet(urls, s3=options, cache_dir=str(tmp_path / "cache2"), readahead=None, write_index=False)
    for shard in range(6):
        for mine, theirs in zip(dataset.index(shard).sample_spans(), here.index(shard).sample_spans()):
            assert np.array_equal(mine, theirs)
    payload = sum(int((ends - starts).sum()) for starts, ends in (dataset.index(s).sample_spans() for s in range(6)))
    assert payload <= folder_bytes(dataset._root) < total
    proxy.clear()
    seen = run_epochs(dataset, shuffle_first=True, load=load_checked)
    assert sorted(c for _, _, cls in seen for c in cls) == list(range(120))
    stats = dataset.readahead_stats
    assert stats["reused"] == folder_bytes(dataset._root) and stats["requests"] == 0
    assert proxy.stats()["body_bytes_down"] == 0  # the epoch read only what set-up kept


def test_indexes_built_by_the_processes_are_cached_for_the_next_set_up(proxied, tmp_path, pooled):
    options, proxy, client = proxied
    urls = write_shards(tmp_path, client, count=4, indexes=False)
    ShardSet(urls, s3=options, cache_dir=str(tmp_path / "cache")).close()
    proxy.clear()
    again = ShardSet(urls, s3=options, cache_dir=str(tmp_path / "cache"))
    assert len(again) == 80 and proxy.requests_matching(r"\.tar$", method="GET") == []


def test_an_error_in_an_indexing_process_is_raised_by_set_up_with_its_type(proxied, tmp_path, pooled):
    options, proxy, client = proxied
    urls = write_shards(tmp_path, client, count=4, indexes=False)
    proxy.respond_next(1, 403, b"<Error><Code>AccessDenied</Code><Message>no</Message></Error>",
                       {"Content-Type": "application/xml"}, match=r"w-002\.tar$", method="GET")
    with pytest.raises(AccessDeniedError, match="w-002"):
        ShardSet(urls, s3=options, cache_dir=str(tmp_path / "cache"))
    deadline = time.monotonic() + slack(5)
    while indexing_processes() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not indexing_processes()


def test_shards_of_an_indexing_process_that_died_are_indexed_here(proxied, tmp_path, pooled, caplog):
    """A child killed mid-read: set-up warns, indexes that child's missing shards itself, and the
    epoch still delivers every sample once."""
    options, proxy, client = proxied
    urls = write_shards(tmp_path, client, count=6, indexes=False)
    proxy.delay = 0.3  # the children's reads are in flight when one is killed
    killed = []

    def kill_one():
        deadline = time.monotonic() + slack(20)
        while not killed and time.monotonic() < deadline:
            found = indexing_processes()
            if found:
                os.kill(found[0].pid, 9)
                killed.append(found[0].pid)
            time.sleep(0.01)

    killer = threading.Thread(target=kill_one)
    killer.start()
    with caplog.at_level("WARNING", logger="hydrax.shards.indexpool"):
        dataset = ShardSet(urls, s3=options, cache_dir=str(tmp_path / "cache"))
    killer.join()
    proxy.delay = 0.0
    assert killed and "indexing process died" in caplog.text
    assert pooled and len(pooled) < 6  # only the dead child's shards, not every shard, were read here
    seen = run_epochs(dataset, shuffle_first=True, load=load_checked)
    assert sorted(c for _, _, cls in seen for c in cls) == list(range(120))


def test_a_small_set_up_indexes_in_the_training_process(proxied, tmp_path):
    """Below POOL_MIN_BYTES, starting processes would cost more than it saves."""
    options, proxy, client = proxied
    urls = write_shards(tmp_path, client, count=2, indexes=False)
    entries = [ShardEntry(u) for u in urls]
    for entry in entries:
        entry.size = 10_000
    assert indexpool.pool_size(entries) == 0
    for entry in entries:
        entry.size = indexpool.POOL_MIN_BYTES
    assert indexpool.pool_size(entries) == min(2, os.cpu_count())
