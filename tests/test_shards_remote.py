"""Remote shards at scale: set-up from index objects and manifests, version pinning, retries,
read-ahead through a Dataloader, and multi-host shares, against moto's S3 server behind
tests/support/netproxy.py on 127.0.0.1 (which counts requests and injects faults)."""

import os
import sys
import time
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from hydrax import Dataloader, DataGroup
from hydrax.errors import ObjectChangedError, ObjectNotFoundError, StoreUnavailableError
from hydrax.shards import S3Options, ShardSet, ShardWriter
from hydrax.shards.catalog import resolve
from hydrax.shards.manifest import read_manifest, write_manifest
from hydrax.shards.readahead import ReadAhead
from hydrax.shards.options import StoreOptions
from hydrax.shards.publish import publish_indexes

from support.timing import slack, slack_int

KEYS = {"access_key_id": "testing", "secret_access_key": "testing", "region": "us-east-1"}
SAMPLE_BYTES = 3000


def write_shards(tmp_path, client, count=6, per_shard=20, prefix="shards", indexes=True, options=None, sample_bytes=SAMPLE_BYTES):
    """Upload ``count`` shards of ``per_shard`` samples (fields cls, bin); with index objects."""
    with ShardWriter(str(tmp_path / "w-%03d.tar"), maxcount=per_shard, index=False) as writer:
        for i in range(count * per_shard):
            payload = np.full(sample_bytes // 4, i, np.int32).tobytes()
            writer.write({"__key__": f"k{i:05d}", "cls": str(i), "bin": payload})
    for path in writer.paths:
        client.upload_file(path, "data", f"{prefix}/{os.path.basename(path)}")
    urls = [f"s3://data/{prefix}/{os.path.basename(p)}" for p in writer.paths]
    if indexes:
        publish_indexes(urls, StoreOptions(s3=options))
    return urls


def load_sample(sample, arrays, seed):
    arrays["cls"][...] = int(bytes(sample["cls"]))
    arrays["bin"][:] = np.frombuffer(sample["bin"], np.int32)[:4]


ARRAYS = {"cls": ((), np.int32, jnp.int32), "bin": ((4,), np.int32, jnp.int32)}


def run_epochs(dataset, *, batch=10, loaders=2, start=(0, 0), end=("epoch", 1), load=load_sample, **group):
    seen = []
    groups = DataGroup(batch, dataset, loader_arrays=ARRAYS, **group)
    with Dataloader(load, groups, loader_count=loaders, start_at=start, end_at=end, timeout_sec=slack_int(60)) as loader:
        for batch_ in loader:
            cls = np.asarray(batch_.arrays["cls"]).tolist()
            assert (np.asarray(batch_.arrays["bin"]) == np.array(cls)[:, None]).all()
            seen.append((batch_.batch_num, list(batch_.indices), cls))
            del batch_
    return seen


def test_setup_reads_index_objects_not_the_data(proxied, tmp_path):
    options, proxy, client = proxied
    urls = write_shards(tmp_path, client, options=options)
    keys = [o["Key"] for o in client.list_objects_v2(Bucket="data")["Contents"]]
    assert sorted(k for k in keys if k.endswith(".hidx")) == sorted(u[len("s3://data/"):] + ".hidx" for u in urls)
    proxy.clear()
    dataset = ShardSet("s3://data/shards/w-*.tar", s3=options, cache_dir=str(tmp_path / "cache"))
    assert len(dataset) == 120 and dataset.shard_sizes() == [20] * 6
    methods = proxy.stats()["methods"]
    assert methods.get("HEAD", 0) == 0  # sizes and ETags come from the listing
    shard_gets = proxy.requests_matching(r"\.tar$", method="GET")
    assert shard_gets == []  # no shard was read to set up
    assert proxy.requests_matching(r"\.hidx$", method="GET") == []  # counts from the folder summary
    assert len(proxy.requests_matching(r"hydrax-index.json$", method="GET")) == 1
    # Again, from the cache: one listing, nothing else.
    proxy.clear()
    again = ShardSet("s3://data/shards/w-*.tar", s3=options, cache_dir=str(tmp_path / "cache"))
    assert proxy.requests_matching(r"\.hidx$", method="GET") == [] and again.shard_sizes() == dataset.shard_sizes()
    assert [bytes(s["cls"]) for s in again] == [str(i).encode() for i in range(120)]


def test_a_wrong_count_in_the_folder_summary_is_named_as_the_summary(proxied, tmp_path):
    """A count from the folder summary that the shard's index contradicts: the error names the
    summary file (it used to name "the manifest") and how to rebuild it."""
    import json

    from hydrax.errors import ShardFormatError

    options, proxy, client = proxied
    urls = write_shards(tmp_path, client, count=2, options=options)
    summary = json.loads(client.get_object(Bucket="data", Key="shards/hydrax-index.json")["Body"].read())
    summary["shardlist"][0]["nsamples"] = 21  # the index has 20
    client.put_object(Bucket="data", Key="shards/hydrax-index.json", Body=json.dumps(summary).encode())
    dataset = ShardSet("s3://data/shards/w-*.tar", s3=options, cache_dir=str(tmp_path / "cache"))
    assert dataset.shard_sizes() == [21, 20]  # the summary's counts, taken at set-up
    with pytest.raises(ShardFormatError) as raised:
        dataset[0]["cls"]  # the shard's index loads when a sample is first read
    assert raised.value.url == urls[0]
    assert ("the folder summary s3://data/shards/hydrax-index.json says 21 samples, its index has 20; "
            "rebuild it (hydrax shards index s3://data/shards/)") in str(raised.value)


@pytest.mark.parametrize("listed, problem", [
    ("/etc/passwd", "outside its own store s3://data/"),
    ("s3://elsewhere/x.tar", "outside its own store s3://data/"),
    ("ftp://x/y.tar", "of the unsupported ftp:// scheme"),
])
def test_a_manifest_in_a_bucket_names_only_shards_of_its_bucket(proxied, tmp_path, listed, problem):
    import json

    from hydrax.errors import ShardFormatError

    options, proxy, client = proxied
    write_shards(tmp_path, client, count=1, options=options)
    manifest = {"__kind__": "wids-shard-index-v1", "wids_version": 1,
                "shardlist": [{"url": "w-000.tar", "nsamples": 20}, {"url": listed, "nsamples": 1}]}
    client.put_object(Bucket="data", Key="shards/data.json", Body=json.dumps(manifest).encode())
    with pytest.raises(ShardFormatError, match=f"the manifest lists shard 1, '{listed}', {problem}") as raised:
        ShardSet("s3://data/shards/data.json", s3=options, cache_dir=str(tmp_path / "cache"))
    assert raised.value.url == "s3://data/shards/data.json"
    manifest["shardlist"].pop()  # its own shards, by relative key: fine
    client.put_object(Bucket="data", Key="shards/data.json", Body=json.dumps(manifest).encode())
    assert len(ShardSet("s3://data/shards/data.json", s3=options, cache_dir=str(tmp_path / "cache"))) == 20


@pytest.mark.slow
def test_without_a_folder_summary_index_objects_are_read_concurrently(proxied, tmp_path):
    options, proxy, client = proxied
    write_shards(tmp_path, client, options=options)
    client.delete_object(Bucket="data", Key="shards/hydrax-index.json")
    proxy.clear()
    dataset = ShardSet("s3://data/shards/w-*.tar", s3=options, cache_dir=str(tmp_path / "cache"))
    assert len(dataset) == 120 and proxy.stats()["methods"].get("HEAD", 0) == 0
    assert len(proxy.requests_matching(r"\.hidx$", method="GET")) == 6
    assert proxy.requests_matching(r"\.tar$", method="GET") == []
    assert [int(bytes(s["cls"])) for s in dataset] == list(range(120))


def test_missing_index_objects_are_built_concurrently_and_cached(proxied, tmp_path):
    options, proxy, client = proxied
    write_shards(tmp_path, client, count=4, indexes=False)
    proxy.clear()
    dataset = ShardSet("s3://data/shards/w-{000..003}.tar", s3=options, cache_dir=str(tmp_path / "cache"))
    assert len(dataset) == 80
    assert len(proxy.requests_matching(r"\.tar$", method="GET")) == 4  # one whole read each
    keys = [o["Key"] for o in client.list_objects_v2(Bucket="data")["Contents"]]
    assert not any(k.endswith(".hidx") for k in keys)  # ShardSet never writes into the bucket
    proxy.clear()
    ShardSet("s3://data/shards/w-{000..003}.tar", s3=options, cache_dir=str(tmp_path / "cache"))
    assert proxy.requests_matching(r"\.tar$", method="GET") == []


def test_a_set_up_that_must_read_much_data_to_index_it_says_so_once(proxied, tmp_path, monkeypatch, caplog):
    """Shards without index objects are read whole at set-up, by every host without a cached
    index: past a threshold (here lowered to a shard and a half) set-up says so once, with the
    command that spares it, and that command works as written."""
    import logging
    import re
    import shlex
    import subprocess

    from hydrax.shards import catalog

    options, proxy, client = proxied
    write_shards(tmp_path, client, count=4, indexes=False)
    sizes = [client.head_object(Bucket="data", Key=f"shards/w-{n:03d}.tar")["ContentLength"] for n in range(4)]
    monkeypatch.setattr(catalog, "BUILD_WARNING_BYTES", sizes[0] * 3 // 2, raising=False)  # a rename fails below
    caplog.set_level(logging.WARNING, logger="hydrax.shards")
    pattern = "s3://data/shards/w-{000..003}.tar"

    def warnings() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.name == "hydrax.shards.catalog" and r.levelno == logging.WARNING]

    ShardSet(pattern, s3=options, cache_dir=str(tmp_path / "c1"))
    said = warnings()
    assert len(said) == 1 and said[0].startswith(f"set-up reads 4 shards, {sum(sizes):,} bytes ({sum(sizes) / 2**20:.1f} MiB), in full to index them: "
                                                 "they have no index objects (<shard>.hidx)")
    command = f"hydrax shards index '{pattern}' --endpoint-url {options.endpoint_url}"
    assert said[0].endswith(f"set-ups then read only the indexes: {command}")
    caplog.clear()
    ShardSet(pattern, s3=options, cache_dir=str(tmp_path / "c1"))  # cached: nothing to read
    ShardSet("s3://data/shards/w-000.tar", s3=options, cache_dir=str(tmp_path / "c2"))  # under the threshold
    assert warnings() == []

    env = {**os.environ, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
    words = shlex.split(re.sub(r"^hydrax ", "", command))
    done = subprocess.run([sys.executable, "-m", "hydrax", *words, "--quiet"], capture_output=True, text=True, env=env,
                          timeout=slack(120), check=False)
    assert done.returncode == 0, done.stderr
    proxy.clear()
    ShardSet(pattern, s3=options, cache_dir=str(tmp_path / "c3"))  # another host: the index objects serve
    assert warnings() == [] and proxy.requests_matching(r"\.tar$", method="GET") == []


def load_checked(sample, arrays, seed):
    """:func:`load_sample`, after checking every byte of the sample's payload."""
    value = int(bytes(sample["cls"]))
    payload = np.frombuffer(sample["bin"], np.int32)
    assert len(payload) == SAMPLE_BYTES // 4 and (payload == value).all(), f"sample {value} has the wrong bytes"
    load_sample(sample, arrays, seed)


def folder_bytes(folder) -> int:
    """The bytes of the files read ahead into ``folder`` (not its hidden bookkeeping files)."""
    return sum(f.stat().st_size for f in Path(folder).rglob("*") if f.is_file() and not f.name.startswith("."))


def test_bytes_read_to_index_shards_are_read_ahead_not_fetched_again(proxied, tmp_path):
    """Shards without index objects are read whole at set-up to index them: while the read-ahead
    budget has room, those bytes become its chunk files, so the first epoch (shuffled) reads
    them from there: set-up and epoch together fetch the data about once, not twice."""
    options, proxy, client = proxied
    urls = write_shards(tmp_path, client, count=6, indexes=False)
    total = sum(client.head_object(Bucket="data", Key=u[len("s3://data/"):])["ContentLength"] for u in urls)
    proxy.clear()
    dataset = ShardSet(urls, s3=options, cache_dir=str(tmp_path / "cache"))
    assert len(proxy.requests_matching(r"\.tar$", method="GET")) == 6  # set-up read each shard whole
    assert dataset.readahead_budget.holds_data
    payload = sum(int((ends - starts).sum()) for starts, ends in (dataset.index(s).sample_spans() for s in range(6)))
    assert payload <= folder_bytes(dataset._root) < total  # the samples' bytes, without the tar headers
    seen = run_epochs(dataset, shuffle_first=True, load=load_checked)
    assert sorted(c for _, _, cls in seen for c in cls) == list(range(120))
    down = proxy.stats()["body_bytes_down"]
    assert down <= 1.1 * total, f"set-up and the first epoch fetched {down / total:.2f}x the data"
    stats = dataset.readahead_stats
    assert stats["reused"] == folder_bytes(dataset._root) and stats["requests"] == 0 and stats["held_peak"] <= stats["budget"]


def test_a_budget_below_the_data_keeps_what_it_can_of_the_bytes_read_to_index(proxied, tmp_path):
    """With a read-ahead budget too small for the data, set-up keeps only what the budget holds
    of the shards it reads to index them; the epoch then fetches the rest (some bytes twice),
    evicting within the budget, and delivers every sample once, with its bytes."""
    options, proxy, client = proxied
    urls = write_shards(tmp_path, client, count=6, indexes=False)
    budget = 150_000  # one of the six shards (a chunk each, about 93 kB)
    dataset = ShardSet(urls, s3=options, cache_dir=str(tmp_path / "cache"), readahead=ReadAhead(max_bytes=budget))
    kept = folder_bytes(dataset._root)
    assert 0 < kept <= budget
    seen = run_epochs(dataset, shuffle_first=True, load=load_checked)
    assert sorted(c for _, _, cls in seen for c in cls) == list(range(120))
    stats = dataset.readahead_stats
    assert stats["requests"] > 0 and 0 < stats["held_peak"] <= stats["budget"] == budget


def test_a_manifest_sets_up_with_one_request(proxied, tmp_path):
    options, proxy, client = proxied
    urls = write_shards(tmp_path, client, options=options)
    entries = resolve(urls, StoreOptions(s3=options), str(tmp_path / "c0"), True)
    write_manifest(entries, "s3://data/shards/train.json", StoreOptions(s3=options))
    listed = read_manifest("s3://data/shards/train.json", StoreOptions(s3=options))
    assert [(e.url, e.samples, e.size, e.version) for e in listed] == [(e.url, e.samples, e.size, e.version) for e in entries]
    proxy.clear()
    dataset = ShardSet("s3://data/shards/train.json", s3=options, cache_dir=str(tmp_path / "cache"))
    assert len(dataset) == 120 and proxy.stats()["requests"] == 1
    assert [int(bytes(dataset[i]["cls"])) for i in (0, 59, 119)] == [0, 59, 119]  # indexes load on first use


def test_reads_are_pinned_to_the_indexed_version(proxied, tmp_path):
    options, proxy, client = proxied
    urls = write_shards(tmp_path, client, count=2, options=options)
    dataset = ShardSet(urls, s3=options, cache_dir=str(tmp_path / "cache"), readahead=ReadAhead(enabled=False))
    assert int(bytes(dataset[3]["cls"])) == 3
    # Replace shard 0 with another of the same size (shard 1's bytes): never read as shard 0.
    body = client.get_object(Bucket="data", Key=urls[1][len("s3://data/"):])["Body"].read()
    client.put_object(Bucket="data", Key=urls[0][len("s3://data/"):], Body=body)
    with pytest.raises(ObjectChangedError, match=r"shard 's3://data/shards/w-000.tar' at byte offset \d+: the object was replaced") as info:
        dataset[5]["cls"]
    assert info.value.url == urls[0] and info.value.offset > 0


@pytest.mark.slow
def test_network_failures_are_retried_then_named(proxied, tmp_path):
    options, proxy, client = proxied
    urls = write_shards(tmp_path, client, count=1, options=options)
    dataset = ShardSet(urls, s3=options, cache_dir=str(tmp_path / "cache"), readahead=ReadAhead(enabled=False))
    proxy.truncate_next(1, after_bytes=100, method="GET", ranged=True)
    assert int(bytes(dataset[1]["cls"])) == 1  # a body cut short is read again
    proxy.reset_next(1, method="GET", ranged=True)
    assert int(bytes(dataset[2]["cls"])) == 2  # so is a connection closed on it
    # a read that times out is sent again: the proxy saw the stalled request, then its repeat,
    # sooner than the stall would have ended (patience long enough for the repeat on a busy machine)
    patience = slack(1)
    impatient = ShardSet(urls, s3=S3Options(endpoint_url=options.endpoint_url, read_timeout=patience, **KEYS),
                         cache_dir=str(tmp_path / "cache"), readahead=ReadAhead(enabled=False))
    proxy.clear()
    proxy.stall_next(1, seconds=3 * patience, method="GET", ranged=True)
    started = time.monotonic()
    assert int(bytes(impatient[4]["cls"])) == 4
    assert patience <= time.monotonic() - started < 3 * patience
    stalled, repeat = proxy.requests_matching(r"\.tar$", method="GET", ranged=True)
    assert (stalled.fault, repeat.fault, repeat.status) == ("stall", None, 206)
    assert repeat.range == stalled.range
    proxy.truncate_next(100, after_bytes=10, method="GET", ranged=True)
    with pytest.raises(StoreUnavailableError, match=r"shard 's3://data/shards/w-000.tar' at byte offset \d+: the request failed after retries") as info:
        dataset[3]["cls"]
    assert info.value.url == urls[0]
    proxy.disarm()


def test_data_the_host_can_hold_is_read_once_over_epochs(proxied, tmp_path):
    options, proxy, client = proxied
    urls = write_shards(tmp_path, client, count=6, options=options)
    dataset = ShardSet(urls, s3=options, cache_dir=str(tmp_path / "cache"))
    total = sum(e.size for e in map(dataset.shard_entry, range(6)))
    budget = dataset.readahead_budget
    assert budget.source == "data" and budget.holds_data and budget.bytes < total + (128 << 20)
    proxy.clear()
    seen = run_epochs(dataset, end=("epoch", 3), shuffle_first=True, shuffle_later="itemwise")
    assert sorted(c for _, _, cls in seen for c in cls) == sorted(list(range(120)) * 3)
    # every shard streamed once (and a few samples the first batches needed before their
    # stream began); the second and third epochs came from what was held
    assert len([r for r in proxy.requests_matching(r"\.tar$", method="GET") if r.body_bytes > 50_000]) == 6
    assert proxy.stats()["body_bytes_down"] <= 1.3 * total
    assert dataset.readahead_stats["evicted"] == 0


def test_readahead_streams_whole_shards_in_shardwise_order(proxied, tmp_path):
    options, proxy, client = proxied
    urls = write_shards(tmp_path, client, count=6, options=options)
    dataset = ShardSet(urls, s3=options, cache_dir=str(tmp_path / "cache"))
    proxy.clear()
    seen = run_epochs(dataset, shuffle_later="shardwise", shard_window=2)
    assert sorted(c for _, _, cls in seen for c in cls) == list(range(120))
    gets = proxy.requests_matching(r"\.tar$", method="GET")
    total = sum(e.size for e in map(dataset.shard_entry, range(6)))
    # Whole shards streamed: one request per shard, plus a few samples the first batches needed
    # before their stream began; about the dataset's bytes.
    streams = [r for r in gets if r.body_bytes > 50_000]
    assert len(streams) == 6 and len(gets) <= 6 + 20, [r.range for r in gets]
    assert proxy.stats()["body_bytes_down"] <= 1.3 * total
    assert dataset.readahead_stats["bytes"] > 0.8 * total


@pytest.mark.slow
def test_random_order_reads_ahead_with_coalesced_ranges_or_whole_shards_and_resumes_exactly(proxied, tmp_path):
    options, proxy, client = proxied
    urls = write_shards(tmp_path, client, count=12, options=options)
    shuffled = dict(shuffle_first=True, shuffle_later="itemwise")
    # A read-ahead budget of a few batches: samples come in ranged requests, neighbours coalesced.
    small = ShardSet(urls, s3=options, cache_dir=str(tmp_path / "cache"), readahead=ReadAhead(max_bytes=256 << 10))
    proxy.clear()
    full = run_epochs(small, end=("epoch", 2), **shuffled)
    assert sorted(c for _, _, cls in full[:24] for c in cls) == list(range(240))
    gets = proxy.requests_matching(r"\.tar$", method="GET")
    assert len(gets) < 0.75 * 480, len(gets)  # fewer requests than samples read (2 epochs of 240)
    stats = small.readahead_stats
    assert stats["bytes"] > 0 and 0 < stats["held_peak"] <= stats["budget"] == 256 << 10  # never more than it was given
    # The default budget holds the whole look-ahead: most of every shard is wanted, so it is streamed.
    large = ShardSet(urls, s3=options, cache_dir=str(tmp_path / "cache"))
    proxy.clear()
    assert run_epochs(large, end=("epoch", 2), **shuffled) == full
    assert len([r for r in proxy.requests_matching(r"\.tar$", method="GET") if r.body_bytes > 60_000]) >= 12
    resumed = run_epochs(large, start=(1, 2), end=("epoch", 2), **shuffled)
    assert resumed == full[26:]


def test_a_remote_shardset_starts_the_fork_server_without_the_scripts_imports(proxied, tmp_path):
    # Set-up makes remote requests, after which workers start from the fork server: it is started
    # as set-up begins, with hydrax's worker code only (a run may follow at once; the script's
    # JAX would take a second to import there).
    import subprocess

    options, proxy, client = proxied
    urls = write_shards(tmp_path, client, count=2, options=options)
    script = f"""
import multiprocessing, time
import jax
from multiprocessing import forkserver
from hydrax.shards import S3Options, ShardSet
ShardSet({urls!r}, s3=S3Options(endpoint_url={options.endpoint_url!r}, access_key_id="testing", secret_access_key="testing",
         region="us-east-1"), cache_dir={str(tmp_path / "cache")!r})
deadline = time.monotonic() + 30
while getattr(forkserver._forkserver, "_forkserver_pid", None) is None and time.monotonic() < deadline:
    time.sleep(0.01)
print(forkserver._forkserver._forkserver_pid is not None)  # started by the ShardSet
child = multiprocessing.get_context("forkserver").Process(target=time.sleep, args=(5,))
child.start()  # forked once the server's imports are done: its memory is the server's
with open(f"/proc/{{child.pid}}/maps") as maps:
    print("jaxlib" in maps.read(), flush=True)
child.kill()
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=slack(120))
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["True", "False"]


@pytest.mark.slow
def test_chunks_come_as_batches_need_them_within_a_budget_far_below_the_data(proxied, tmp_path):
    from hydrax.shards.readahead.fetcher import URGENT_BYTES
    from hydrax.shards.readahead.folders import CHUNK_BYTES

    options, proxy, client = proxied
    # 3 shards of 24 samples of 1 MB: 3 chunks each, 72 MB in all
    urls = write_shards(tmp_path, client, count=3, per_shard=24, options=options, sample_bytes=1 << 20)
    total = 3 * 24 * ((1 << 20) + 1536)
    small = ShardSet(urls, s3=options, cache_dir=str(tmp_path / "cache"), readahead=ReadAhead(max_bytes=3 * CHUNK_BYTES))
    proxy.clear()
    seen = run_epochs(small, batch=8, shuffle_later="shardwise", shard_window=1)
    assert sorted(c for _, _, cls in seen for c in cls) == list(range(72))
    stats = small.readahead_stats
    assert 0 < stats["held_peak"] <= stats["budget"] == 3 * CHUNK_BYTES and stats["evicted"] > 0
    down = proxy.stats()["body_bytes_down"]
    assert down <= 1.25 * total + URGENT_BYTES // 4, f"{down / total:.2f}x the data"
    # Fully shuffled with the default budget (the data fits): every batch touches every shard.
    # The first batches' samples come singly (a round trip, not a chunk), then every chunk once.
    large = ShardSet(urls, s3=options, cache_dir=str(tmp_path / "cache"))
    proxy.clear()
    seen = run_epochs(large, batch=8, shuffle_first=True)
    assert sorted(c for _, _, cls in seen for c in cls) == list(range(72))
    gets = [r for r in proxy.requests_matching(r"\.tar$", method="GET")]
    singles = [r for r in gets if r.body_bytes < 2 * (1 << 20)]
    # the fetcher's urgent singles pass URGENT_BYTES by at most one sample; on a busy machine a
    # worker can also reach a sample before the fetcher starts on it and read it itself (read-ahead
    # never blocks): up to a batch (8 samples) of those
    slack = 9 * ((1 << 20) + 1536)
    assert 1 <= len(singles) and sum(r.body_bytes for r in singles) <= URGENT_BYTES + slack
    assert sum(r.body_bytes for r in gets) <= total + URGENT_BYTES + slack
    assert large.readahead_stats["evicted"] == 0


def test_a_store_that_dies_mid_epoch_ends_the_run_with_an_error(proxied, tmp_path):
    options, proxy, client = proxied
    urls = write_shards(tmp_path, client, count=4, options=options)
    dataset = ShardSet(urls, s3=options, cache_dir=str(tmp_path / "cache"), readahead=ReadAhead(enabled=False))
    group = DataGroup(5, dataset, loader_arrays=ARRAYS)
    started = time.monotonic()
    delivered = 0
    with pytest.raises(StoreUnavailableError, match=r"shard 's3://data/shards/w-00\d.tar' at byte offset \d+"):
        with Dataloader(load_sample, group, loader_count=2, depth=2, end_at=("epoch", 1), timeout_sec=slack_int(60)) as loader:
            for batch in loader:
                delivered += 1
                del batch
                if delivered == 2:
                    proxy.down("refuse")
    proxy.up()
    assert delivered < 16 and time.monotonic() - started < slack(45)  # its retries end long before the batch timeout


def test_a_replaced_object_ends_the_run_naming_it(proxied, tmp_path):
    options, proxy, client = proxied
    urls = write_shards(tmp_path, client, count=2, options=options)
    dataset = ShardSet(urls, s3=options, cache_dir=str(tmp_path / "cache"), readahead=ReadAhead(enabled=False))
    body = client.get_object(Bucket="data", Key=urls[1][len("s3://data/"):])["Body"].read()
    client.put_object(Bucket="data", Key=urls[0][len("s3://data/"):], Body=body)
    with pytest.raises(ObjectChangedError, match="w-000.tar"):
        run_epochs(dataset)


def test_a_missing_shard_is_named(proxied, tmp_path):
    options, proxy, client = proxied
    write_shards(tmp_path, client, count=1, options=options)
    with pytest.raises(ObjectNotFoundError, match=r"shard 's3://data/shards/none.tar' does not exist"):
        ShardSet(["s3://data/shards/w-000.tar", "s3://data/shards/none.tar"], s3=options, cache_dir=str(tmp_path / "c"))


def test_hosts_with_partitions_read_disjoint_shards(proxied, tmp_path):
    options, proxy, client = proxied
    urls = write_shards(tmp_path, client, count=8, per_shard=10, options=options)
    dataset = ShardSet(urls, s3=options, cache_dir=str(tmp_path / "cache"))
    group = dict(shuffle_later="shardwise", shard_window=2, shard_partitions=2)
    whole = run_epochs(dataset, batch=8, **group)
    per_host = []
    shares = []
    for host in range(2):
        proxy.clear()
        part = []
        groups = DataGroup(8, dataset, loader_arrays=ARRAYS, **group)
        with Dataloader(load_sample, groups, loader_count=2, end_at=("epoch", 1), process_index=host, process_count=2) as loader:
            for b in loader:
                part.append(np.asarray(b.arrays["cls"]).tolist())
                del b
        shares.append(part)
        per_host.append({r.path.rsplit("/", 1)[1] for r in proxy.requests_matching(r"\.tar$", method="GET")})
        dataset.close()
    assert [a + b for a, b in zip(*shares)] == [cls for _, _, cls in whole]
    assert len(per_host[0] & per_host[1]) <= 2  # only shards of spilled items are shared
    assert len(per_host[0]) <= 6 and len(per_host[1]) <= 6


LOW_LIMIT_SCRIPT = """
import resource, sys
import numpy as np, jax.numpy as jnp
from hydrax import Dataloader, DataGroup
from hydrax.shards import ShardSet

def load(sample, arrays, seed):
    arrays["cls"][...] = int(bytes(sample["cls"]))

if __name__ == "__main__":
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))
    dataset = ShardSet(sys.argv[1] + "/s-*.tar")
    group = DataGroup(50, dataset, loader_arrays={"cls": ((), np.int32, jnp.int32)}, shuffle_first=True)
    seen = []
    with Dataloader(load, group, loader_count=2, end_at=("epoch", 1)) as loader:
        for batch in loader:
            seen += np.asarray(batch.arrays["cls"]).tolist()
            del batch
    print("SAMPLES", len(dataset), len(seen), sorted(seen) == list(range(len(dataset))))
"""


@pytest.mark.slow
def test_ten_thousand_local_shards_under_ulimit_1024(tmp_path):
    """Shard mappings are an LRU per process: 10,000 shards load every sample, in random order,
    through worker processes, with 1,024 file descriptors."""
    import subprocess

    count = 10_000
    with ShardWriter(str(tmp_path / "s-%05d.tar"), maxcount=1) as writer:
        for i in range(count):
            writer.write({"__key__": f"k{i:05d}", "cls": str(i)})
    script = tmp_path / "low_limit.py"
    script.write_text(LOW_LIMIT_SCRIPT)
    out = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, timeout=slack(300))
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"SAMPLES {count} {count} True" in out.stdout


def test_http_shards_read_like_local_ones_and_are_pinned(http_store, tmp_path):
    base, folder = http_store
    with ShardWriter(str(folder / "h-%02d.tar"), maxcount=7) as writer:
        for i in range(20):
            writer.write({"__key__": f"k{i:03d}", "cls": str(i), "bin": np.full(4, i, np.int32).tobytes()})
    local = ShardSet(str(folder / "h-*.tar"))
    remote = ShardSet(f"{base}/h-{{00..02}}.tar", cache_dir=str(tmp_path / "cache"))
    assert remote.shard_sizes() == local.shard_sizes() == [7, 7, 6]
    assert [{f: bytes(s[f]) for f in s} for s in remote] == [{f: bytes(s[f]) for f in s} for s in local]
    seen = run_epochs(remote, batch=5, shuffle_later="shardwise")
    assert sorted(c for _, _, cls in seen for c in cls) == list(range(20))
    pinned = ShardSet(f"{base}/h-{{00..02}}.tar", cache_dir=str(tmp_path / "cache"), readahead=ReadAhead(enabled=False))
    time.sleep(0.01)
    (folder / "h-01.tar").write_bytes((folder / "h-01.tar").read_bytes())  # same bytes, a new version
    with pytest.raises(ObjectChangedError, match="h-01.tar"):
        pinned[9]["cls"]
    fresh = ShardSet(f"{base}/h-{{00..02}}.tar", cache_dir=str(tmp_path / "cache"), readahead=ReadAhead(enabled=False))
    assert int(bytes(fresh[9]["cls"])) == 9


def test_gcs_shards_set_up_from_index_objects_and_load_through_workers(gcs_store, tmp_path):
    from hydrax.shards import GCSOptions
    from hydrax.shards.indexfile import index_from_bytes

    endpoint, upload = gcs_store
    with ShardWriter(str(tmp_path / "g-%02d.tar"), maxcount=8, index=False) as writer:
        for i in range(20):
            writer.write({"__key__": f"k{i:03d}", "cls": str(i), "bin": np.full(4, i, np.int32).tobytes()})
    options = GCSOptions(endpoint_url=endpoint, max_attempts=2)
    for path in writer.paths:
        upload(f"train/{os.path.basename(path)}", Path(path).read_bytes())
    # Index objects beside two of the three shards (the emulator takes uploads only through its
    # JSON API, so they are written here rather than by `hydrax shards index`).
    probe = ShardSet("gs://data/train/g-*.tar", gcs=options, cache_dir=str(tmp_path / "c0"))
    for shard in range(2):
        entry = probe.shard_entry(shard)
        index = index_from_bytes(Path(writer.paths[shard]).read_bytes(), entry.url, entry.size, 0, entry.version)
        upload(f"train/{os.path.basename(writer.paths[shard])}.hidx", index.to_bytes())
    dataset = ShardSet("gs://data/train/g-*.tar", gcs=options, cache_dir=str(tmp_path / "cache"))
    assert dataset.urls == [f"gs://data/train/g-{s:02d}.tar" for s in range(3)] and dataset.shard_sizes() == [8, 8, 4]
    local = ShardSet(writer.paths)
    assert [{f: bytes(s[f]) for f in s} for s in dataset] == [{f: bytes(s[f]) for f in s} for s in local]
    seen = run_epochs(dataset, batch=4, shuffle_later="shardwise")
    assert sorted(c for _, _, cls in seen for c in cls) == list(range(20))
    with pytest.raises(ObjectNotFoundError, match="gs://data/train/none.tar"):
        ShardSet("gs://data/train/none.tar", gcs=options, cache_dir=str(tmp_path / "c1"))


def test_a_disk_cache_lets_later_runs_skip_downloads_within_its_cap(proxied, tmp_path):
    options, proxy, client = proxied
    urls = write_shards(tmp_path, client, count=4, options=options)
    cache = ReadAhead(cache_dir=str(tmp_path / "disk"))
    first = ShardSet(urls, s3=options, cache_dir=str(tmp_path / "cache"), readahead=cache)
    proxy.clear()
    expected = run_epochs(first, shuffle_later="shardwise")
    downloaded = sum(r.body_bytes for r in proxy.requests_matching(r"\.tar$", method="GET"))
    # every sample's bytes came over the wire (whole shards, or ranges that skip the headers and
    # padding, depending on how the read-ahead saw the order)
    payload = sum(int((ends - starts).sum()) for starts, ends in (first.index(s).sample_spans() for s in range(4)))
    first.close()
    assert downloaded >= payload > 0
    again = ShardSet(urls, s3=options, cache_dir=str(tmp_path / "cache"), readahead=cache)
    proxy.clear()
    assert run_epochs(again, shuffle_later="shardwise") == expected
    assert sum(r.body_bytes for r in proxy.requests_matching(r"\.tar$", method="GET")) < 0.05 * downloaded
    # A cap below what it holds: files of earlier runs go first, and reads stay correct.
    small = ShardSet(urls, s3=options, cache_dir=str(tmp_path / "cache"),
                     readahead=ReadAhead(cache_dir=str(tmp_path / "disk"), max_bytes=100_000))
    assert run_epochs(small, shuffle_later="shardwise") == expected
    held = sum(f.stat().st_size for f in (tmp_path / "disk").rglob("*") if f.is_file())
    assert held <= 100_000 + 100_000  # the cap, plus at most a chunk being written when the run ended


def test_the_private_readahead_folder_goes_with_its_shardset_and_after_a_killed_process(proxied, tmp_path):
    import gc
    import glob as globbing
    import signal
    import subprocess
    import tempfile

    from hydrax.shards.readahead.folders import MEMORY_FOLDER, private_bases, private_root

    options, proxy, client = proxied
    urls = write_shards(tmp_path, client, count=2, options=options)
    dataset = ShardSet(urls, s3=options, cache_dir=str(tmp_path / "cache"))
    run_epochs(dataset, shuffle_later="shardwise")
    mine = [f for base in private_bases() for f in globbing.glob(os.path.join(base, f"hydrax-readahead-{os.getpid()}-*"))]
    assert mine and any(os.listdir(folder) for folder in mine)  # read-ahead wrote there
    # in memory, where it has room (this host's /dev/shm holds far more than 2 small shards)
    assert os.path.dirname(mine[0]) == (MEMORY_FOLDER if os.path.isdir(MEMORY_FOLDER) else tempfile.gettempdir())
    del dataset
    gc.collect()
    assert not any(os.path.exists(folder) for folder in mine)
    # A process killed outright leaves its folder; the next one made anywhere sweeps it.
    child = subprocess.Popen([sys.executable, "-c", "import time; from hydrax.shards.readahead import private_root; "
                              "print(private_root(), flush=True); time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    left = child.stdout.readline().strip()
    child.send_signal(signal.SIGKILL)
    child.wait()
    child.stdout.close()
    # (Not checked to be there first: any process making a folder meanwhile, as a test beside this
    # one or its fork server at exit does, may sweep it already.)
    fresh = private_root()
    assert not os.path.exists(left)
    os.rmdir(fresh)
    # A process with a remote ShardSet has a loader fork server, which outlives it by moments
    # and sweeps its folder (in /dev/shm, memory) as it goes, without waiting for a later process.
    script = f"""
import time
from multiprocessing import forkserver
from hydrax.shards import S3Options, ShardSet
dataset = ShardSet({urls!r}, s3=S3Options(endpoint_url={options.endpoint_url!r}, access_key_id="testing",
                   secret_access_key="testing", region="us-east-1"), cache_dir={str(tmp_path / "cache")!r})
while getattr(forkserver._forkserver, "_forkserver_pid", None) is None:
    time.sleep(0.01)
print(dataset._root, flush=True)
time.sleep(60)
"""
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    left = child.stdout.readline().strip()
    assert os.path.isdir(left)
    child.send_signal(signal.SIGKILL)
    child.wait()
    child.stdout.close()
    deadline = time.monotonic() + slack(20)
    while os.path.exists(left) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(left)


def test_a_run_whose_fetches_fail_transiently_delivers_every_sample_once(proxied, tmp_path):
    """Resets, bodies cut short and 503s on the fetch process's reads (and the workers' own):
    retried, or read again by the worker that needs the sample; every sample comes once, with
    its bytes, and the faults did fire."""
    options, proxy, client = proxied
    urls = write_shards(tmp_path, client, count=6, per_shard=40, options=options)
    dataset = ShardSet(urls, s3=options, cache_dir=str(tmp_path / "cache"))
    proxy.clear()
    proxy.reset_next(3, method="GET", ranged=True)
    proxy.truncate_next(3, after_bytes=1000, method="GET", ranged=True)
    proxy.respond_next(3, 503, b"<Error><Code>SlowDown</Code><Message>later</Message></Error>",
                       {"Content-Type": "application/xml"}, method="GET", ranged=True)
    seen = run_epochs(dataset, shuffle_first=True, load=load_checked)
    assert sorted(c for _, _, cls in seen for c in cls) == list(range(240))
    assert proxy.armed() == 0
    faults = [r.fault for r in proxy.requests_matching(r"\.tar$", method="GET", ranged=True) if r.fault]
    assert len(faults) == 9
    dataset.close()
