"""Shards in S3, through a real S3-protocol server (moto's) on 127.0.0.1, started by the tests."""

import contextlib
import logging
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from hydrax import Dataloader, DataGroup
from hydrax.errors import AccessDeniedError, StoreConfigError, StoreUnavailableError
from hydrax.shards import S3Options, ShardFormatError, ShardSet, ShardWriter
from hydrax.shards.shardset import expand_urls

KEYS = {"access_key_id": "testing", "secret_access_key": "testing", "region": "us-east-1"}


@pytest.fixture
def server(s3_store):
    endpoint, client = s3_store
    return S3Options(endpoint_url=endpoint, **KEYS), client


@pytest.fixture
def s3_shards(server, tmp_path):
    options, client = server
    with ShardWriter(str(tmp_path / "train-%02d.tar"), maxcount=9, index=False) as writer:
        for i in range(30):
            writer.write({"__key__": f"k{i:03d}", "cls": str(i), "bin": np.full(4, i, np.int32).tobytes()})
    for path in writer.paths:
        client.upload_file(path, "data", f"shards/{os.path.basename(path)}")
    return options, client, writer.paths


def load_s3_sample(sample, arrays, seed):
    arrays["cls"][...] = int(bytes(sample["cls"]))
    arrays["bin"][:] = np.frombuffer(sample["bin"], np.int32)


def test_s3_shards_read_like_local_ones(s3_shards, tmp_path):
    options, client, paths = s3_shards
    remote = ShardSet("s3://data/shards/train-{00..03}.tar", s3=options, cache_dir=str(tmp_path / "cache"))
    local = ShardSet(paths)
    assert len(remote) == len(local) == 30 and remote.shard_sizes() == [9, 9, 9, 3]
    for a, b in zip(remote, local):
        assert a.key == b.key and a.fields == b.fields
        assert {f: bytes(a[f]) for f in a} == {f: bytes(b[f]) for f in b}
    assert remote[0].url == "s3://data/shards/train-00.tar"
    assert sorted(os.listdir(tmp_path / "cache" / "index")) and len(os.listdir(tmp_path / "cache" / "index")) == 4
    keys = [o["Key"] for o in client.list_objects_v2(Bucket="data")["Contents"]]
    assert all(k.endswith(".tar") for k in keys)  # nothing written into the bucket
    assert ShardSet("s3://data/shards/train-*.tar", s3=options, cache_dir=str(tmp_path / "cache")).urls == remote.urls


@pytest.mark.parametrize("variable", ["AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"])
def test_the_aws_endpoint_variables_are_honoured(s3_shards, tmp_path, monkeypatch, variable):
    """AWS_ENDPOINT_URL (as boto3 and the AWS CLI read it, with MinIO, LocalStack, moto) once
    failed after retries with "builder error": the http endpoint was not allowed."""
    options, client, paths = s3_shards
    for name, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"), ("AWS_DEFAULT_REGION", "us-east-1"),
                        (variable, options.endpoint_url)):
        monkeypatch.setenv(name, value)
    from_env = ShardSet("s3://data/shards/train-*.tar", cache_dir=str(tmp_path / "cache"))
    assert from_env.shard_sizes() == [9, 9, 9, 3] and bytes(from_env[29]["cls"]) == b"29"
    # the variable, not a store made before it was set: a store is keyed by the endpoint it uses
    monkeypatch.setenv(variable, "http://127.0.0.1:9")
    with pytest.raises(StoreUnavailableError, match="cannot reach the S3 endpoint http://127.0.0.1:9"):
        ShardSet("s3://data/shards/train-*.tar", s3=S3Options(max_attempts=1, connect_timeout=2), cache_dir=str(tmp_path / "c2"))


def test_verify_checks_index_objects_against_the_shard(s3_shards):
    """A remote index with two keys swapped and a valid checksum passed verify (and delivered two
    samples under the wrong key); the same forgery of a local .hidx was caught."""
    from hydrax.shards import ShardIndex, group_samples, scan_members
    from hydrax.shards.options import StoreOptions
    from hydrax.shards.publish import publish_indexes
    from hydrax.shards.verify import verify_shard

    options, client, paths = s3_shards
    urls = [f"s3://data/shards/{os.path.basename(p)}" for p in paths]
    assert verify_shard(urls[0], s3=options).index == "none"
    publish_indexes(urls, StoreOptions(s3=options))
    report = verify_shard(urls[0], s3=options)
    assert report.ok and report.index == "ok"

    with open(paths[1], "rb") as f:
        samples = group_samples(scan_members(f.read(), paths[1]), paths[1])
    samples[2].key, samples[3].key = samples[3].key, samples[2].key
    head = client.head_object(Bucket="data", Key="shards/train-01.tar")
    forged = ShardIndex.from_samples(samples, head["ContentLength"], 0)
    forged.etag = head["ETag"]  # tied to the shard as it is: only the keys are wrong
    client.put_object(Bucket="data", Key="shards/train-01.tar.hidx", Body=forged.to_bytes())
    report = verify_shard(urls[1], s3=options)
    assert report.index == "differs" and [p.kind for p in report.problems] == ["index"]
    assert "sample 2 has key 'k012' in the index" in report.problems[0].detail

    client.put_object(Bucket="data", Key="shards/train-02.tar", Body=Path(paths[2]).read_bytes() + bytes(1024))
    report = verify_shard(urls[2], s3=options)
    assert report.index == "stale" and report.problems[0].kind == "stale index" and "ETag" in report.problems[0].detail
    client.put_object(Bucket="data", Key="shards/train-00.tar.hidx", Body=b"garbage")
    assert verify_shard(urls[0], s3=options).index == "unreadable"


def test_a_datagroup_over_s3_shards_loads_through_workers(s3_shards, tmp_path):
    options, _, _ = s3_shards
    dataset = ShardSet("s3://data/shards/train-*.tar", s3=options, cache_dir=str(tmp_path / "cache"))
    group = DataGroup(5, dataset, loader_arrays={"cls": ((), np.int32, jnp.int32), "bin": ((4,), np.int32, jnp.int32)})
    seen = []
    with Dataloader(load_s3_sample, group, loader_count=2, end_at=("epoch", 1)) as loader:
        for batch in loader:
            cls = np.asarray(batch.arrays["cls"]).tolist()
            assert cls == [int(dataset[i].key[1:]) for i in batch.indices]
            assert (np.asarray(batch.arrays["bin"]) == np.array(cls)[:, None]).all()
            seen += cls
            del batch
    assert sorted(seen) == list(range(30))


def test_missing_and_damaged_objects_are_named(s3_shards, tmp_path):
    options, client, paths = s3_shards
    with open(paths[0], "rb") as f:
        client.put_object(Bucket="data", Key="bad.tar", Body=f.read()[:700])
    with pytest.raises(ShardFormatError, match=r"s3://data/bad.tar: at byte offset \d+: .*truncated"):
        ShardSet("s3://data/bad.tar", s3=options, cache_dir=str(tmp_path))
    with pytest.raises(FileNotFoundError, match="shard 's3://data/nothing.tar' does not exist"):
        ShardSet("s3://data/nothing.tar", s3=options, cache_dir=str(tmp_path))
    with pytest.raises(FileNotFoundError, match="matches no object"):
        ShardSet("s3://data/none-*.tar", s3=options, cache_dir=str(tmp_path))


def test_an_unreachable_store_is_reported_after_bounded_retries(tmp_path):
    import socket
    import time

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    options = S3Options(endpoint_url=f"http://127.0.0.1:{port}", max_attempts=2, **KEYS)
    started = time.monotonic()
    with pytest.raises(StoreUnavailableError, match=r"shard 's3://data/train-00.tar': .*cannot reach the S3 endpoint .*the request failed after retries"):
        ShardSet("s3://data/train-00.tar", s3=options, cache_dir=str(tmp_path))
    assert time.monotonic() - started < 30


def enforce_auth(endpoint: str, after: str) -> None:
    """Make the server check every request's credentials against its IAM (``after="inf"``: stop)."""
    import urllib.request

    request = urllib.request.Request(f"{endpoint}/moto-api/reset-auth", data=after.encode(), method="POST",
                                     headers={"Content-Type": "text/plain"})
    urllib.request.urlopen(request).read()


@pytest.fixture
def reader_keys(server):
    """Credentials of an IAM user who may list the bucket but not read objects; the server then checks them."""
    import json
    import uuid

    import boto3

    options, _ = server
    iam = boto3.client("iam", endpoint_url=options.endpoint_url, region_name="us-east-1",
                       aws_access_key_id="testing", aws_secret_access_key="testing")
    user = f"lister-{uuid.uuid4().hex[:8]}"  # the in-process server keeps users from earlier tests
    iam.create_user(UserName=user)
    # Listing objects is s3:ListBucket on AWS. moto 5.1.22 and 5.2.6 name the action after the API call it
    # routes to (s3:ListObjectsV2, which AWS's IAM does not have), so the policy names both: the
    # user may list, whichever name the server checks, and still may not read.
    policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": ["s3:ListBucket", "s3:ListObjectsV2"], "Resource": "*"}]}
    iam.put_user_policy(UserName=user, PolicyName="list-only", PolicyDocument=json.dumps(policy))
    key = iam.create_access_key(UserName=user)["AccessKey"]
    yield S3Options(endpoint_url=options.endpoint_url, region="us-east-1", access_key_id=key["AccessKeyId"],
                    secret_access_key=key["SecretAccessKey"])
    enforce_auth(options.endpoint_url, "inf")


def test_access_denied_names_the_shard_and_the_permission(s3_shards, reader_keys, tmp_path):
    options, _, _ = s3_shards
    enforce_auth(options.endpoint_url, "0")
    assert len(expand_urls("s3://data/shards/train-*.tar", reader_keys)) == 4  # listing is allowed
    with pytest.raises(PermissionError, match=r"shard 's3://data/shards/train-00.tar': access denied .*need s3:GetObject"):
        ShardSet("s3://data/shards/train-00.tar", s3=reader_keys, cache_dir=str(tmp_path / "cache"))
    strangers = S3Options(endpoint_url=options.endpoint_url, region="us-east-1", access_key_id="AKIDUNKNOWN", secret_access_key="x")
    with pytest.raises(PermissionError, match=r"'s3://data/shards/train-\*.tar': the store refused the credentials \(InvalidAccessKeyId\)"):
        ShardSet("s3://data/shards/train-*.tar", s3=strangers, cache_dir=str(tmp_path / "cache"))
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").rglob("*.*"))  # nothing half-made in the cache


@pytest.fixture
def iam_keys(server):
    """A function that makes an IAM user allowed only ``actions`` and gives its S3Options; the
    server stops checking credentials when the test ends."""
    import json
    import uuid

    import boto3

    options, _ = server
    iam = boto3.client("iam", endpoint_url=options.endpoint_url, region_name="us-east-1",
                       aws_access_key_id="testing", aws_secret_access_key="testing")

    def make(actions: list[str]) -> S3Options:
        user = f"user-{uuid.uuid4().hex[:8]}"  # the in-process server keeps users from earlier tests
        iam.create_user(UserName=user)
        policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": actions, "Resource": "*"}]}
        iam.put_user_policy(UserName=user, PolicyName="allowed", PolicyDocument=json.dumps(policy))
        key = iam.create_access_key(UserName=user)["AccessKey"]
        return S3Options(endpoint_url=options.endpoint_url, region="us-east-1", access_key_id=key["AccessKeyId"],
                         secret_access_key=key["SecretAccessKey"])

    yield make
    enforce_auth(options.endpoint_url, "inf")


#: A bucket policy that lets everyone read objects but not list them, as shared datasets often
#: have. AWS checks s3:GetObject for a GET and for a HEAD, and s3:ListBucket for a listing; moto
#: 5.2.6 names the action after the API operation instead (s3:HeadObject for a HEAD,
#: s3:ListObjectsV2 for a listing), so for moto "GetObject only" must allow s3:HeadObject too,
#: and still names no listing.
GET_ONLY = ["s3:GetObject", "s3:HeadObject"]


@contextlib.contextmanager
def served_requests():
    """The request lines the server logs meanwhile, one per request it serves
    (``"GET /data/shards/train-01.tar HTTP/1.1" 206 -``)."""
    class Requests(logging.Handler):
        def __init__(self):
            super().__init__(logging.INFO)
            self.lines = []

        def emit(self, record):
            self.lines.append(re.sub(r"\x1b\[[0-9;]*m", "", record.getMessage()))  # werkzeug colours some

    server_log = logging.getLogger("werkzeug")
    requests, level = Requests(), server_log.level
    server_log.addHandler(requests)
    server_log.setLevel(logging.INFO)
    try:
        yield requests.lines
    finally:
        server_log.removeHandler(requests)
        server_log.setLevel(level)


def test_credentials_that_may_read_but_not_list_read_named_shards(s3_shards, iam_keys, tmp_path, caplog):
    """A bucket that grants s3:GetObject but not s3:ListBucket could not be read even with every
    shard named: set-up listed the folder for the sizes and failed. The refused listing is made up
    for with a HEAD per shard, said once in the log; a pattern, which only a listing can match,
    fails naming the permission and what works without it."""
    import json

    options, client, paths = s3_shards
    reader = iam_keys(GET_ONLY)
    urls = [f"s3://data/shards/{os.path.basename(p)}" for p in paths]
    # a manifest of another writer's, without sizes: set-up finds them to check the counts
    shardlist = [{"url": url, "nsamples": n} for url, n in zip(urls, (9, 9, 9, 3))]
    client.put_object(Bucket="data", Key="shards/other.json",
                      Body=json.dumps({"__kind__": "wids-shard-index-v1", "wids_version": 1, "shardlist": shardlist}).encode())
    enforce_auth(options.endpoint_url, "0")
    caplog.set_level(logging.INFO, logger="hydrax.shards")
    named = ShardSet(urls, s3=reader, cache_dir=str(tmp_path / "c1"))
    local = ShardSet(paths)
    assert named.shard_sizes() == [9, 9, 9, 3]
    assert [(s.key, {f: bytes(s[f]) for f in s}) for s in named] == [(s.key, {f: bytes(s[f]) for f in s}) for s in local]
    said = [r.getMessage() for r in caplog.records if "was refused" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("listing s3://data/shards/ was refused (the credentials lack s3:ListBucket): "
                                                 "finding the sizes of its 4 shards with a HEAD each")

    caplog.clear()  # a brace list, read through worker processes
    braced = ShardSet("s3://data/shards/train-{00..03}.tar", s3=reader, cache_dir=str(tmp_path / "c2"))
    assert len([r for r in caplog.records if "was refused" in r.getMessage()]) == 1
    group = DataGroup(5, braced, loader_arrays={"cls": ((), np.int32, jnp.int32), "bin": ((4,), np.int32, jnp.int32)})
    seen = []
    with Dataloader(load_s3_sample, group, loader_count=2, end_at=("epoch", 1)) as loader:
        for batch in loader:
            cls = np.asarray(batch.arrays["cls"]).tolist()
            assert (np.asarray(batch.arrays["bin"]) == np.array(cls)[:, None]).all()
            seen += cls
            del batch
    assert sorted(seen) == list(range(30))

    with pytest.raises(AccessDeniedError, match=r"listing 's3://data/shards/train-\*.tar': access denied \(AccessDenied\); the "
                       r"credentials need s3:ListBucket on it .*; a pattern is matched by listing its folder, which needs "
                       r"s3:ListBucket: without it, name the shards, as explicit URLs or a brace list \(train-\{00..31\}.tar\)") as info:
        ShardSet("s3://data/shards/train-*.tar", s3=reader, cache_dir=str(tmp_path / "c3"))
    assert info.value.url == "s3://data/shards/train-*.tar" and getattr(info.value, "permission", None) == "s3:ListBucket"
    with pytest.raises(FileNotFoundError, match="shard 's3://data/shards/train-04.tar' does not exist"):
        ShardSet("s3://data/shards/train-{00..04}.tar", s3=reader, cache_dir=str(tmp_path / "c3"))
    caplog.clear()
    manifested = ShardSet("s3://data/shards/other.json", s3=reader, cache_dir=str(tmp_path / "c4"))
    assert manifested.shard_sizes() == [9, 9, 9, 3] and int(bytes(manifested[29]["cls"])) == 29
    assert len([r for r in caplog.records if "was refused" in r.getMessage()]) == 1


def test_without_a_listing_index_objects_and_summaries_are_found_by_name(s3_shards, iam_keys, tmp_path):
    """``hydrax shards index`` of named shards needs s3:PutObject, not s3:ListBucket; and a
    reader that may not list finds what it wrote by name (the folder summary, else each index
    object) and sets up without reading a shard."""
    from hydrax.shards.options import StoreOptions
    from hydrax.shards.publish import publish_indexes

    options, client, paths = s3_shards
    urls = [f"s3://data/shards/{os.path.basename(p)}" for p in paths]
    writer, reader = iam_keys(GET_ONLY + ["s3:PutObject"]), iam_keys(GET_ONLY)
    enforce_auth(options.endpoint_url, "0")
    publish_indexes(urls, StoreOptions(s3=writer))
    with served_requests() as requests:
        summarised = ShardSet(urls, s3=reader, cache_dir=str(tmp_path / "c1"))
    assert summarised.shard_sizes() == [9, 9, 9, 3]
    gets = [line.split('"')[1] for line in requests if '"GET /data/shards/' in line]  # objects, not the (refused) listing
    assert gets == ["GET /data/shards/hydrax-index.json HTTP/1.1"]  # the counts; indexes load when first read
    enforce_auth(options.endpoint_url, "inf")
    assert sorted(o["Key"] for o in client.list_objects_v2(Bucket="data")["Contents"]) == sorted(
        [f"shards/{os.path.basename(p)}{suffix}" for p in paths for suffix in ("", ".hidx")] + ["shards/hydrax-index.json"])
    client.delete_object(Bucket="data", Key="shards/hydrax-index.json")
    enforce_auth(options.endpoint_url, "0")
    with served_requests() as requests:
        indexed = ShardSet(urls, s3=reader, cache_dir=str(tmp_path / "c2"))
    gets = sorted(line.split('"')[1] for line in requests if '"GET /data/shards/' in line)
    assert gets == [f"GET /data/shards/{os.path.basename(p)}.hidx HTTP/1.1" for p in paths]  # no shard read
    assert [int(bytes(s["cls"])) for s in indexed] == list(range(30))


def load_noting_errors(log, sample, arrays, seed):
    try:
        load_s3_sample(sample, arrays, seed)
    except Exception as exc:
        with open(log, "a") as f:
            f.write(f"{type(exc).__name__}: {exc}\n")
        raise


def test_a_read_denied_in_a_worker_ends_the_run_naming_the_shard_and_offset(s3_shards, reader_keys, tmp_path):
    import functools

    from hydrax.shards import ReadAhead

    options, _, _ = s3_shards
    dataset = ShardSet("s3://data/shards/train-00.tar", s3=options, cache_dir=str(tmp_path / "cache"))
    denied = ShardSet("s3://data/shards/train-00.tar", s3=reader_keys, cache_dir=str(tmp_path / "cache"),
                      readahead=ReadAhead(enabled=False))
    assert len(denied) == len(dataset) == 9  # the index came from the cache, built with the good keys
    enforce_auth(options.endpoint_url, "0")
    group = DataGroup(3, denied, loader_arrays={"cls": ((), np.int32, jnp.int32), "bin": ((4,), np.int32, jnp.int32)})
    log = tmp_path / "errors.txt"
    # Every read would fail: the run ends with the store's error instead of dropping every batch.
    with pytest.raises(AccessDeniedError, match=r"shard 's3://data/shards/train-00.tar' at byte offset \d+: access denied "
                       r"\(AccessDenied\); the credentials need s3:GetObject") as info:
        with Dataloader(functools.partial(load_noting_errors, str(log)), group, loader_count=2, end_at=("epoch", 1)) as loader:
            list(loader)
    assert info.value.url == "s3://data/shards/train-00.tar" and info.value.offset > 0
    errors = log.read_text().splitlines()
    # a MissingPermissionError: an AccessDeniedError that names the permission (info.value.permission)
    assert info.value.permission == "s3:GetObject"
    assert errors and all(e.startswith("MissingPermissionError: shard 's3://data/shards/train-00.tar' at byte offset ") for e in errors)


def test_one_ranged_get_per_sample_whatever_fields_are_read(s3_shards, tmp_path):
    from hydrax.shards import ReadAhead

    def read_all(dataset) -> None:
        for sample in dataset:
            assert int(bytes(sample["cls"])) == int(sample.key[1:])
            assert np.frombuffer(sample["bin"], np.int32).tolist() == [int(sample.key[1:])] * 4
            bytes(sample["cls"])  # again: no new request

    options, _, _ = s3_shards
    url = "s3://data/shards/train-01.tar"
    # Set-up read the shard whole to index it (it has no index object) and kept its bytes as
    # read-ahead: the samples are read from there. Without read-ahead it keeps nothing.
    kept = ShardSet(url, s3=options, cache_dir=str(tmp_path / "c1"))
    dataset = ShardSet(url, s3=options, cache_dir=str(tmp_path / "c2"), readahead=ReadAhead(enabled=False))
    with served_requests() as requests:
        read_all(kept)
    assert [line for line in requests if "GET /data/shards/train-01.tar" in line] == []
    with served_requests() as requests:
        read_all(dataset)
    gets = [line for line in requests if "GET /data/shards/train-01.tar" in line]
    assert len(gets) == len(dataset) == 9


# -- configuration errors: raised at once, naming the setting ---------------------------------------


def closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def retries(caplog) -> list[str]:
    """The retries the store logged (one line per attempt after the first)."""
    return [r.getMessage() for r in caplog.records if r.name == "hydrax.shards.objstore" and r.getMessage().startswith("retrying")]


def without_aws_variables(monkeypatch) -> None:
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)


@pytest.fixture
def store_log(caplog):
    caplog.set_level(logging.DEBUG, logger="hydrax.shards.objstore")
    return caplog


def test_a_transient_failure_is_still_retried(store_log, tmp_path):
    """The counterpart of the tests below: a server that is down may come back, so it is retried
    (here 3 attempts, 2 retries logged) and then reported as unavailable."""
    options = S3Options(endpoint_url=f"http://127.0.0.1:{closed_port()}", max_attempts=3, connect_timeout=2, **KEYS)
    with pytest.raises(StoreUnavailableError, match="cannot reach the S3 endpoint .* after retries \\(3 attempts\\)"):
        ShardSet("s3://data/train-00.tar", s3=options, cache_dir=str(tmp_path))
    assert len(retries(store_log)) == 2


@pytest.mark.parametrize("endpoint, why", [
    ("htp:/x", "it must start with http:// or https://"),
    ("ftp://127.0.0.1:21", "it must start with http:// or https://"),  # obstore: "builder error", retried 20 times before
    ("not a url", "a URL has no spaces"),
    ("http://127.0.0.1:99999", "its port is not a number"),  # obstore panics: InvalidPort
    ("http:/127.0.0.1", "it names no host"),
    ("http://[::1", "its host is not a host name or an address"),  # urllib: "Invalid IPv6 URL", a StoreUnavailableError before
    ("http://127.0.0.1:abc", "its port is not a number"),
    ("http://127.0.0.1:-1", "its port is not a number"),
])
def test_a_malformed_endpoint_argument_fails_at_once_naming_it(s3_store, store_log, tmp_path, endpoint, why):
    """Twenty attempts with back-off would take half a minute; none is retried, and obstore never
    sees the URL (it panicked on the first request, or refused it and was retried)."""
    options = S3Options(endpoint_url=endpoint, max_attempts=20, **KEYS)
    with pytest.raises(StoreConfigError) as info:
        ShardSet("s3://data/shards/train-00.tar", s3=options, cache_dir=str(tmp_path))
    assert retries(store_log) == []
    assert isinstance(info.value, ValueError) and info.value.url == "s3://data/shards/train-00.tar"
    assert f"the S3 endpoint URL {endpoint!r}, set by S3Options(endpoint_url=...) or --endpoint-url, is not usable: {why}" in str(info.value)


@pytest.mark.parametrize("variable", ["AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"])
def test_a_malformed_endpoint_variable_fails_at_once_naming_the_variable(s3_store, store_log, monkeypatch, tmp_path, variable):
    without_aws_variables(monkeypatch)
    monkeypatch.setenv(variable, "not a url")
    options = S3Options(max_attempts=20, **KEYS)
    with pytest.raises(StoreConfigError, match=f"listing 's3://data/shards/train-\\*.tar': the S3 endpoint URL 'not a url', "
                                               f"set by the environment variable {variable}, is not usable"):
        expand_urls("s3://data/shards/train-*.tar", options)
    with pytest.raises(StoreConfigError, match=f"the S3 endpoint URL 'not a url', set by the environment variable {variable}, "):
        ShardSet("s3://data/x.tar", s3=options, cache_dir=str(tmp_path))
    assert retries(store_log) == []


def test_an_http_endpoint_obstore_may_not_use_fails_at_once(s3_shards, store_log, monkeypatch, tmp_path):
    """obstore reads AWS_ENDPOINT itself, but may use http only for an endpoint hydrax passes it:
    reqwest refuses the request ("builder error"), which was retried max_attempts times."""
    options, _, _ = s3_shards
    without_aws_variables(monkeypatch)
    monkeypatch.setenv("AWS_ENDPOINT", options.endpoint_url)
    with pytest.raises(StoreConfigError, match=r"the S3 endpoint came from AWS_ENDPOINT='http://127.0.0.1:\d+', a variable that obstore "
                                               r"reads and hydrax does not, and http:// is allowed only for an http:// endpoint set by "
                                               r".*--endpoint-url, AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL; .*HTTP error: builder error"):
        ShardSet("s3://data/shards/train-00.tar", s3=S3Options(max_attempts=20, **KEYS), cache_dir=str(tmp_path))
    assert retries(store_log) == []
    # an http endpoint hydrax is given is allowed, whatever the case of its scheme
    upper = S3Options(endpoint_url=options.endpoint_url.replace("http://", "HTTP://"), max_attempts=20, **KEYS)
    assert ShardSet("s3://data/shards/train-03.tar", s3=upper, cache_dir=str(tmp_path)).shard_sizes() == [3]


def test_missing_credentials_fail_at_once_naming_the_variables(s3_store, store_log, monkeypatch, tmp_path):
    """Without keys, obstore asks the instance metadata service (pointed here at a closed port on
    this machine); that it does not answer was reported as the S3 endpoint being unreachable."""
    endpoint, _ = s3_store
    without_aws_variables(monkeypatch)
    monkeypatch.setenv("AWS_METADATA_ENDPOINT", f"http://127.0.0.1:{closed_port()}")
    options = S3Options(endpoint_url=endpoint, region="us-east-1", max_attempts=20)
    with pytest.raises(StoreConfigError, match=r"no AWS credentials were found, .*: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
                                               r".*\(obstore: .*PUT http://127.0.0.1:\d+/latest/api/token .*error sending request\)"):
        ShardSet("s3://data/x.tar", s3=options, cache_dir=str(tmp_path))
    assert retries(store_log) == []


@pytest.mark.parametrize("url, said", [
    ("s3://data/shards//train-00.tar", "Could not parse path: Path \"shards//train-00.tar\" contained empty path segment"),
    ("s3://Bad Bucket!/train-00.tar", "request valid: InvalidUri(InvalidUri(InvalidUriChar))"),  # a panic of obstore's
])
def test_a_url_obstore_cannot_request_fails_at_once(s3_store, store_log, url, said):
    from hydrax.shards.router import store_for

    endpoint, _ = s3_store
    with pytest.raises(StoreConfigError) as info:
        store_for(url, S3Options(endpoint_url=endpoint, max_attempts=20, **KEYS)).stat(url)
    assert retries(store_log) == []
    assert str(info.value) == (f"shard {url!r}: the request cannot be made as the store is set up: check the S3 endpoint URL "
                               f"{endpoint!r} (set by S3Options(endpoint_url=...) or --endpoint-url), the bucket {url[5:].split('/')[0]!r} "
                               f"and the key (obstore: {said})")


def test_the_cli_names_a_malformed_endpoint_in_one_line(s3_store):
    endpoint, _ = s3_store
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
    result = subprocess.run([sys.executable, "-m", "hydrax", "shards", "verify", "-q", "s3://data/x.tar", "--endpoint-url", "htp:/x"],
                            capture_output=True, text=True, timeout=120, env=env, check=False)
    assert result.returncode == 1 and "Traceback" not in result.stderr and "panicked" not in result.stderr
    assert result.stderr.splitlines() == ["hydrax shards verify: s3://data/x.tar: the S3 endpoint URL 'htp:/x', set by "
                                          "S3Options(endpoint_url=...) or --endpoint-url, is not usable: it must start with "
                                          "http:// or https://; set it to the server's URL, like http://127.0.0.1:9000"]


def test_run_async_inside_a_running_loop_raises_the_coroutines_own_error_in_the_caller(capfd):
    """In a notebook an event loop already runs: the coroutine runs in a thread of its own, and its
    failure must reach the caller as it is, not die in that thread (an IndexError came back)."""
    import asyncio

    from hydrax.errors import ObjectNotFoundError
    from hydrax.shards.store import run_async

    async def failing():
        raise ObjectNotFoundError("does not exist", url="s3://data/x.tar")

    async def succeeding():
        return 42

    async def notebook_cell():
        assert run_async(succeeding()) == 42
        with pytest.raises(ObjectNotFoundError, match="does not exist") as raised:
            run_async(failing())
        return raised.value

    error = asyncio.run(notebook_cell())
    assert error.url == "s3://data/x.tar" and "Exception in thread" not in capfd.readouterr().err
    with pytest.raises(ObjectNotFoundError) as raised:  # no loop running: asyncio.run directly
        run_async(failing())
    assert raised.value.__context__ is None  # not "during handling of RuntimeError: no running event loop"
