"""Mutation fuzzing of the listings that give shards' sample counts before their indexes load:
wids manifests and folder summaries (``hydrax-index.json``), local, on an HTTP server and in an
S3 bucket, and of the index files and objects whose counts must agree with them.

Valid listings of real shards are mutated: counts forged (0, -1, 10**8, 2**62, floats, text,
null), sizes dropped (so that set-up must find them) or forged, shard URLs made hostile
(``/etc/passwd``, ``file://``, ``ftp://``, ``../..``, other buckets and servers, devices, very
long, unicode, NUL, lone surrogates), every field given wrong types, JSON nested deeper than
Python's stack or holding a 10 MB string, and the bytes damaged; index files and objects are
damaged, or forged to hold a sample fewer or one more than their shard. For every mutant, opening
a ShardSet (a DataGroup over it, and reading the first and last sample of its first shards) must
either succeed with only samples that are in the shards, byte for byte, or raise one of hydrax's
errors naming the listing, a shard it names or that shard's index. Never another exception, a hang
(each mutant runs under an alarm), or the opening of a local file the listing does not name (for a
listing on a server or in a bucket: of any local file but the cache's).

A forged count never sizes anything: set-up under an address-space limit (a child process) refuses
it or holds only real counts. Workers that meet an index disagreeing with its listing's count end
the Dataloader's run with the ShardFormatError (two real runs; the mutants cover set-up).

``HYDRAX_FUZZ`` and ``HYDRAX_FUZZ_SEED`` set the mutants and the seed (``tests/support/fuzzing.py``):
local listings get that many, the HTTP server an eighth, the bucket a tenth (their requests
take milliseconds each). Every mutant's rng derives from (seed, kind, number), and a failure names
all three. Run with ``-s`` to see what the mutants reached (how many were read, or which errors).
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import random
import re
import signal
import subprocess
import sys
import tarfile
import threading
from collections import Counter

import numpy as np
import pytest

from support.fuzzing import MUTANTS, ROOT, SEED

from hydrax import Dataloader, DataGroup
from hydrax.errors import HydraxError, ShardFormatError
from hydrax.shards import (GCSOptions, HTTPOptions, ReadAhead, S3Options, Sample, ShardIndex, ShardSet, ShardWriter, index_path,
                           publish_indexes, read_wids_descriptor, store_for)
from hydrax.shards.manifest import manifest_json
from hydrax.shards.options import StoreOptions
from hydrax.shards.shardtable import SUMMARY_NAME, ShardEntry

pytestmark = pytest.mark.fuzz

ARRAYS = {"cls": ((), np.int32, np.int32)}
#: Stores a listing's hostile URLs may point at: unreachable, and asked once (no retries, no AWS).
NOWHERE = {"s3": S3Options(endpoint_url="http://127.0.0.1:1", region="us-east-1", access_key_id="x", secret_access_key="x",
                           max_attempts=1),
           "gcs": GCSOptions(endpoint_url="http://127.0.0.1:1", anonymous=True, max_attempts=1),
           "http": HTTPOptions(max_attempts=1, connect_timeout=2, read_timeout=5)}
#: Seconds a mutant may take: far above what any takes, far below a hang.
PATIENCE = 20
#: Shards of a mutant's set whose first and last samples are read.
SHARDS_READ = 6
COUNTS = (0, -1, 1, 3, 4, 5, 2**31, 10**8, 2**62 - 1, 2**62, 2**63, 10**30, 1.0, 4.0, 2.5, 1e300, float("nan"), "4", "",
          None, True, False, [], {}, [4])
WRONG = (None, True, False, 0, -1, 2.5, "", "x", "/", [], [1], {}, {"url": 1}, "x" * 300, float("inf"))
# placeholders, replaced in the JSON text: nesting deeper than Python's stack, a 10 MB string
DEEP, HUGE = "\x00deep\x00", "\x00huge\x00"
DEEP_TEXT, HUGE_TEXT = "[" * 100_000 + "]" * 100_000, '"' + "a" * 10_000_000 + '"'
HOSTILE = ("/etc/passwd", "file:///etc/passwd", "ftp://x/y.tar", "../../x.tar", "nosuch.tar", "x" * 5000 + ".tar",
           "é-ü-ß.tar", "日本語/データ.tar", "a\x00b.tar", "\ud800.tar", "\udcff.tar", "/dev/zero", "/dev/stdin", ".", "..", "/",
           "", " ", "s-000.tar/", "s-000.tar.hidx", "train.json", "s3:///x.tar", "gs://", "file://", "HTTP://", "C:\\x.tar",
           "%2e%2e/x.tar", "s-000.tar?x=1", "s-000.tar#f", "s3://other/x.tar", "gs://data/x.tar", "http://127.0.0.1:1/x.tar",
           HUGE, DEEP)


# -- the data -------------------------------------------------------------------------------------

def write_shards(folder: str, name: str = "s", count: int = 11, per_shard: int = 4) -> list[str]:
    """Shards of ``per_shard`` samples (the last shorter), fields cls and bin, with their indexes."""
    with ShardWriter(os.path.join(folder, f"{name}-%03d.tar"), maxcount=per_shard) as writer:
        for i in range(count):
            writer.write({"__key__": f"{name}{i:05d}", "cls": str(i), "bin": bytes([i % 251]) * (50 + 37 * i)})
    return writer.paths


def contents(paths) -> dict[str, dict[str, bytes]]:
    """key -> {field: bytes} of every sample of the shards ``paths``, read with tarfile."""
    found: dict[str, dict[str, bytes]] = {}
    for path in paths:
        with tarfile.open(path) as tar:
            for member in tar:
                key, _, field = member.name.partition(".")
                found.setdefault(key, {})[field] = tar.extractfile(member).read()
    return found


def listing_text(paths, folder: str, sized: bool, name: str = "train") -> str:
    """A manifest of ``paths`` (relative to ``folder``), with their sizes or without."""
    entries = [ShardEntry(p, os.path.getsize(p) if sized else None, None, len(ShardIndex.load(index_path(p)))) for p in paths]
    return manifest_json(entries, name, folder)


def forged_index(index: ShardIndex, how: str) -> ShardIndex:
    """``index`` holding a sample fewer (``drop``) or one more (``split``: the first sample's fields
    as two samples): still tar-shaped and inside its shard, so it loads, but its count is not the
    shard's."""
    samples = [Sample(index.key(i), index.fields(i)) for i in range(len(index))]
    if how == "drop":
        samples = samples[:-1]
    else:
        first = list(samples[0].fields.items())
        samples[:1] = [Sample(samples[0].key, dict(first[:1])), Sample(samples[0].key + "-split", dict(first[1:]))]
    return ShardIndex.from_samples(samples, index.shard_size, index.shard_mtime_ns, index.etag)


def damaged(data: bytes, rng: random.Random) -> bytes:
    """Raw damage: bits flipped, cut, bytes inserted or deleted."""
    data = bytearray(data)
    op = rng.randrange(4)
    at = rng.randrange(len(data))
    if op == 0:
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    elif op == 1:
        del data[at:]
    elif op == 2:
        data[at:at] = rng.randbytes(rng.randint(1, 32))
    else:
        del data[at : at + rng.randint(1, 32)]
    return bytes(data)


# -- mutating listings ----------------------------------------------------------------------------

def _places(value, path=()):
    """Every place in parsed JSON: (path of keys and positions, value)."""
    yield path, value
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _places(item, path + (key,))
    elif isinstance(value, list):
        for number, item in enumerate(value):
            yield from _places(item, path + (number,))


def _set(descriptor, path, value):
    """``descriptor`` with the value at ``path`` replaced (the whole of it for an empty path)."""
    if not path:
        return value
    parent = descriptor
    for step in path[:-1]:
        parent = parent[step]
    parent[path[-1]] = value
    return descriptor


def pick(rng: random.Random, pool):
    """A value of ``pool``, copied: the pools hold lists and dicts, which later changes to the
    mutant must not reach (they would grow from one mutant to the next)."""
    return copy.deepcopy(rng.choice(pool))


def _mutate_entry(entry: dict, rng: random.Random, urls) -> None:
    """A change to one shardlist entry: its count, size or URL, forged or mistyped."""
    op = rng.randrange(6)
    if op == 0:
        entry["nsamples"] = pick(rng, COUNTS)
    elif op == 1:  # no size: set-up must find it to check the count
        entry.pop("filesize", None)
        entry["nsamples"] = rng.choice((2**62 - 1, 10**8, 2**31, 5, 0, pick(rng, COUNTS)))
    elif op == 2:
        entry["filesize"] = pick(rng, COUNTS)
    elif op == 3:  # a size and a count that agree with each other, not with the shard
        entry["filesize"], entry["nsamples"] = rng.choice(((2**40, 2**31), (10**6, 1953), (512, 1), (0, 0)))
    elif op == 4:
        entry["url"] = rng.choice(urls)
    else:
        entry[rng.choice(("url", "nsamples", "filesize", "etag"))] = pick(rng, WRONG)


def _mutate_once(descriptor, rng: random.Random, urls):
    shardlist = descriptor.get("shardlist") if isinstance(descriptor, dict) else None
    entries = [e for e in shardlist if isinstance(e, dict)] if isinstance(shardlist, list) else []
    op = rng.randrange(10)
    if op < 4 and entries:
        _mutate_entry(rng.choice(entries), rng, urls)
    elif op == 4 and entries:  # shards listed again, up to many times
        shardlist.extend(copy.deepcopy(rng.choice(entries)) for _ in range(rng.choice((1, 2, 1000))))
    elif op == 5 and isinstance(descriptor, dict):
        descriptor[rng.choice(("base", "__kind__", "wids_version", "shardlist", "name", "junk"))] = pick(rng, urls + WRONG)
    elif op == 6:
        path, _value = rng.choice(list(_places(descriptor)))
        descriptor = _set(descriptor, path, pick(rng, WRONG))
    elif op == 7:
        places = [p for p, _v in _places(descriptor) if p]
        if places:
            path = rng.choice(places)
            parent = descriptor
            for step in path[:-1]:
                parent = parent[step]
            del parent[path[-1]]
    elif op == 8:
        path, _value = rng.choice(list(_places(descriptor)))
        descriptor = _set(descriptor, path, DEEP if rng.random() < 0.7 else HUGE)
    else:
        descriptor = rng.choice((None, [], "x", 7, [descriptor], {"shardlist": shardlist}, descriptor))
    return descriptor


def mutate_listing(text: str, rng: random.Random, urls) -> bytes:
    """A mutant of the listing ``text``, whose hostile URLs come from ``urls``."""
    if rng.random() < 0.12:
        return damaged(text.encode(), rng)
    descriptor = json.loads(text)
    for _ in range(rng.choice((1, 1, 1, 2, 3))):
        descriptor = _mutate_once(descriptor, rng, urls)
    out = json.dumps(descriptor)
    # once each: a placeholder copied a thousand times must not make a 10 GB mutant
    return out.replace(json.dumps(DEEP), DEEP_TEXT, 1).replace(json.dumps(HUGE), HUGE_TEXT, 1).encode()


# -- the checks -----------------------------------------------------------------------------------

class Hang(BaseException):
    """A mutant ran past :data:`PATIENCE` (a BaseException: no handler of hydrax's takes it)."""


@contextlib.contextmanager
def patience(what: str):
    def ring(_signum, _frame):
        raise Hang(f"hang: {what} ran past {PATIENCE} s")

    previous = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, PATIENCE)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class Opens:
    """The local files this process opens while :attr:`watching` (an audit hook: it cannot be
    removed, so it is added once, and does nothing while not watching)."""

    hooked = False
    watching: list | None = None

    @classmethod
    def watch(cls) -> list:
        if not cls.hooked:
            sys.addaudithook(cls._hook)
            cls.hooked = True
        cls.watching = []
        return cls.watching

    @classmethod
    def _hook(cls, event, args):
        opened = cls.watching
        if opened is None or event != "open" or not isinstance(args[0], (str, bytes)):
            return
        # the test's own HTTP server opens the files it serves: that is the store, not the client
        if "process_request" not in threading.current_thread().name:
            opened.append(os.path.abspath(os.fsdecode(args[0])))


def listed(data: bytes, folder: str) -> set[str]:
    """The URLs a listing (its bytes) names, as set-up resolves them; with their indexes and folders."""
    try:
        descriptor = json.loads(data)
        pairs = read_wids_descriptor(descriptor, folder) if isinstance(descriptor, dict) else []
    except (ValueError, RecursionError):
        return set()
    # as written (errors name them so) and as opened (the audit hook sees absolute paths)
    urls = {url for url, _count in pairs} | {os.path.abspath(url) for url, _count in pairs if "://" not in url}
    return urls | {url + ".hidx" for url in urls} | {url.rsplit("/", 1)[0] + "/" for url in urls}


def read_some(shards: ShardSet, truth: dict, regrouped: bool = False, reads: int = SHARDS_READ) -> str:
    """Check the set's counts and a DataGroup over it, then read the first and last sample of its
    first ``reads`` shards (each read of a remote one takes a request): each must be a sample of
    the shards, byte for byte. With ``regrouped``, an index was forged (:func:`forged_index`): a
    listing forged to agree with it lets it regroup a shard's fields (loading checks counts, not
    the shard's headers, as ``hydrax shards verify`` does), so a sample read need only hold fields
    of the sample it was split from."""
    sizes = shards.shard_sizes()
    assert len(sizes) == len(shards.urls) and min(sizes, default=0) >= 0 and len(shards) == sum(sizes) < 1 << 62
    if not len(shards):
        with pytest.raises(ValueError, match="data is empty"):
            DataGroup(2, shards, loader_arrays=ARRAYS)
        return "empty"
    assert len(DataGroup(2, shards, loader_arrays=ARRAYS)) == len(shards)
    start = 0
    for count in sizes[:reads]:
        for position in sorted({start, start + count - 1}) if count else ():
            sample = shards[position]
            key = sample.key
            fields = {field: bytes(sample[field]) for field in sample}
            if regrouped:
                real = truth.get(key.removesuffix("-split"), {})
                assert fields and all(real.get(field) == data for field, data in fields.items()), key
            else:
                assert truth.get(key) == fields, key
        start += count
    return "read"


def check_listing(source: str, data: bytes, folder: str, truth: dict, allowed, regrouped: bool = False, reads: int = SHARDS_READ,
                  **options) -> str:
    """Open the listing ``source`` (whose bytes are ``data``; relative URLs resolve against
    ``folder``) as the module docstring says; return the outcome. Files under ``allowed`` (and
    those the listing names) may be opened."""
    opened = Opens.watch()
    try:
        shards = ShardSet(source, write_index=False, readahead=ReadAhead(enabled=False), **options)
        outcome = read_some(shards, truth, regrouped, reads)
    except HydraxError as exc:
        named = {source, source.rsplit("/", 1)[0] + "/"} | listed(data, folder)
        assert exc.url in named, f"{type(exc).__name__} names {exc.url!r:.200}: {exc!s:.300}"
        assert exc.url[:40] in str(exc) or repr(exc.url)[1:40] in str(exc), str(exc)[:300]
        outcome = type(exc).__name__
    finally:
        Opens.watching = None
    named = listed(data, folder)
    strays = [p for p in opened if not p.startswith(allowed) and p not in named]
    assert not strays, f"opened {strays[:3]!r:.300}, which the listing does not name"
    return outcome


def python_files() -> tuple[str, ...]:
    """What the interpreter may open as it imports lazily, and JAX as it starts (it reads the
    kernel's descriptions of the machine): never data."""
    return tuple({os.path.abspath(p) + os.sep for p in (sys.prefix, sys.base_prefix, os.path.dirname(os.__file__),
                                                         ROOT / "hydrax", "/sys", "/proc")})


def run_mutants(kind: str, count: int, one) -> Counter:
    """Mutants ``0 .. count`` of ``kind``, each through ``one(case, rng)``; failures name the case."""
    tally: Counter = Counter()
    for case in range(count):
        rng = random.Random(f"{SEED}/{kind}/{case}")
        try:
            with patience(f"{kind} mutant {case}"):
                tally[one(case, rng)] += 1
        except (Exception, Hang) as exc:
            raise AssertionError(f"seed {SEED}, {kind} mutant {case}: {type(exc).__name__}: {exc!s:.2000}") from exc
    print(f"{kind}: {count} mutants, outcomes {dict(tally)}")  # shown with -s: what the mutants reached
    return tally


@pytest.fixture(scope="module", autouse=True)
def started():
    """What starts on first use (JAX reads package metadata then) starts before any mutant is watched."""
    DataGroup(1, [0], loader_arrays=ARRAYS)


# -- local listings -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def local(tmp_path_factory):
    """(dataset folder, its shards, the truth, a shard outside the folder)."""
    root = tmp_path_factory.mktemp("fuzz_listings")
    folder, outside = str(root / "data"), str(root / "outside")
    os.makedirs(folder)
    os.makedirs(outside)
    paths = write_shards(folder)
    secret = write_shards(outside, "secret", 2)
    return folder, paths, contents(paths + secret), secret[0]


def test_the_valid_local_listings_open(local, tmp_path):
    folder, paths, truth, _secret = local
    for sized in (True, False):
        for name in ("train.json", SUMMARY_NAME):
            path = os.path.join(folder, name)
            with open(path, "w") as f:
                f.write(listing_text(paths, folder, sized))
            shards = ShardSet(path, write_index=False, cache_dir=str(tmp_path))
            assert shards.shard_sizes() == [4, 4, 3] and read_some(shards, truth) == "read"
            assert [s.key for s in shards] == sorted(k for k in truth if not k.startswith("secret"))


def one_local(local, cache: str):
    folder, paths, truth, secret = local
    urls = HOSTILE + tuple(os.path.relpath(p, folder) for p in paths) + (secret, os.path.relpath(secret, folder), paths[1])
    texts = {sized: listing_text(paths, folder, sized) for sized in (True, False)}
    indexes = {p: open(index_path(p), "rb").read() for p in paths}
    allowed = python_files() + (folder + os.sep, cache + os.sep)

    def one(case: int, rng: random.Random) -> str:
        path = os.path.join(folder, rng.choice(("train.json", SUMMARY_NAME)))
        data = mutate_listing(texts[rng.random() < 0.5], rng, urls)
        with open(path, "wb") as f:
            f.write(data)
        with tampered_index(indexes, rng, intact=6) as how:
            return check_listing(path, data, folder, truth, allowed, how in ("drop", "split"), cache_dir=cache, **NOWHERE)
    return one


@contextlib.contextmanager
def tampered_index(indexes: dict[str, bytes], rng: random.Random, intact: int):
    """One shard's index file, of ``indexes`` (path -> its bytes), left intact (``intact`` times
    in ``intact + 4``), damaged, forged to drop or split a sample, or missing, while the body runs;
    yields how; the file is put back afterwards."""
    shard = rng.choice(sorted(indexes))
    how = rng.choice(("intact",) * intact + ("damaged", "drop", "split", "missing"))
    if how == "damaged":
        with open(index_path(shard), "wb") as f:
            f.write(damaged(indexes[shard], rng))
    elif how == "missing":
        os.unlink(index_path(shard))
    elif how != "intact":
        forged_index(ShardIndex.from_bytes(indexes[shard]), how).save(index_path(shard))
    try:
        yield how
    finally:
        if how != "intact":
            with open(index_path(shard), "wb") as f:
                f.write(indexes[shard])


def test_damaged_local_listings_open_with_real_counts_or_are_named_errors(local, tmp_path):
    tally = run_mutants("local", MUTANTS, one_local(local, str(tmp_path)))
    assert tally["read"] and sum(tally.values()) - tally["read"] - tally["empty"], tally


# -- over HTTP ------------------------------------------------------------------------------------

def publish_http(folder: str, base: str) -> list[str]:
    """Shards in the server's ``folder``, with index objects for the versions it serves."""
    paths = write_shards(folder)
    for path in paths:
        index = ShardIndex.load(index_path(path))
        url = f"{base}/{os.path.basename(path)}"
        index.etag = store_for(url).stat(url).version
        index.save(index_path(path))
    return paths


def test_damaged_listings_on_a_server_name_only_its_shards(http_store, tmp_path):
    base, www = http_store
    folder = str(www)
    paths = publish_http(folder, base)
    truth = contents(paths)
    names = [os.path.basename(p) for p in paths]
    urls = HOSTILE + tuple(names) + (f"{base}/{names[1]}", f"{base}/../../etc/passwd", f"{base}/{names[0]}.hidx",
                                     f"{base}/nosuch.tar", f"{base.replace('127.0.0.1', 'localhost')}/{names[0]}")
    texts = {sized: listing_text(paths, folder, sized) for sized in (True, False)}
    indexes = {p: open(index_path(p), "rb").read() for p in paths}
    allowed = python_files() + (str(tmp_path / "cache") + os.sep,)

    def one(case: int, rng: random.Random) -> str:
        data = mutate_listing(texts[rng.random() < 0.5], rng, urls)
        (www / "train.json").write_bytes(data)
        with tampered_index(indexes, rng, intact=4) as how:
            return check_listing(f"{base}/train.json", data, base, truth, allowed, how in ("drop", "split"), 2,
                                 cache_dir=str(tmp_path / "cache"), **NOWHERE)

    tally = run_mutants("http", max(1, MUTANTS // 8), one)
    assert tally["read"], tally


# -- in a bucket ----------------------------------------------------------------------------------

def test_damaged_listings_in_a_bucket_name_only_its_shards(s3_store, tmp_path):
    endpoint, client = s3_store
    s3 = S3Options(endpoint_url=endpoint, region="us-east-1", access_key_id="testing", secret_access_key="testing",
                   max_attempts=1, read_timeout=10)
    paths = write_shards(str(tmp_path))
    for path in paths:
        client.upload_file(path, "data", f"shards/{os.path.basename(path)}")
    shard_urls = [f"s3://data/shards/{os.path.basename(p)}" for p in paths]
    publish_indexes(shard_urls, StoreOptions(s3=s3))  # index objects and the folder summary
    truth = contents(paths)
    summary = client.get_object(Bucket="data", Key=f"shards/{SUMMARY_NAME}")["Body"].read().decode()
    # relative URLs, which resolve against the bucket's folder
    texts = {sized: listing_text(paths, str(tmp_path), sized) for sized in (True, False)}
    urls = HOSTILE + ("s-000.tar", shard_urls[1], "s3://data/other/x.tar", "s3://DATA/shards/s-000.tar",
                      "S3://data/shards/s-001.tar", "s3://data/shards/../shards/s-000.tar", "s3://data/shards//s-000.tar")
    allowed = python_files() + (str(tmp_path / "cache") + os.sep,)

    def one(case: int, rng: random.Random) -> str:
        in_summary = rng.random() < 0.4  # else a manifest beside the shards
        data = mutate_listing(summary if in_summary else texts[rng.random() < 0.5], rng, urls)
        key = f"shards/{SUMMARY_NAME}" if in_summary else "shards/train.json"
        client.put_object(Bucket="data", Key=key, Body=data)
        source = "s3://data/shards/s-*.tar" if in_summary else "s3://data/shards/train.json"
        try:
            return check_listing(source, data, "s3://data/shards", truth, allowed, cache_dir=str(tmp_path / "cache"), s3=s3)
        finally:
            if in_summary:
                client.put_object(Bucket="data", Key=key, Body=summary.encode())

    tally = run_mutants("s3", max(1, MUTANTS // 10), one)
    assert tally["read"], tally


# -- a forged count sizes nothing -----------------------------------------------------------------

#: Run in a child under an address-space limit of what it holds once imported, plus 512 MiB: a
#: set-up sized by a forged count (8 bytes a sample for its order) would fail there.
BOUNDED = r"""
import json, resource, sys
import numpy as np
from hydrax import DataGroup
from hydrax.errors import HydraxError
from hydrax.order.schedule import permutation
from hydrax.shards import ShardSet

with open("/proc/self/status") as f:
    held = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
resource.setrlimit(resource.RLIMIT_AS, (held + (512 << 20), held + (512 << 20)))
results = {}
for name, source in json.loads(sys.argv[1]).items():
    try:
        shards = ShardSet(source, write_index=False, cache_dir=sys.argv[2])
        group = DataGroup(2, shards, loader_arrays={"x": ((), np.int32, np.int32)})
        order = permutation(0, len(group))  # what the group's first order takes
        results[name] = ["ok", len(shards)]
    except HydraxError as exc:
        results[name] = [type(exc).__name__, str(exc)]
    except BaseException as exc:
        results[name] = ["raw " + type(exc).__name__, str(exc)]
print(json.dumps(results))
"""


def test_a_forged_count_never_sizes_set_up(local, http_store, tmp_path):
    folder, paths, _truth, _secret = local
    base, www = http_store
    served = publish_http(str(www), base)
    cases = {}

    def listing(name: str, entries, where=tmp_path, prefix=folder):
        shardlist = [{"url": f"{prefix}/{url}", "nsamples": count} for url, count in entries]
        (where / f"{name}.json").write_text(json.dumps({"__kind__": "wids-shard-index-v1", "wids_version": 1, "shardlist": shardlist}))
        cases[name] = str(where / f"{name}.json") if where is tmp_path else f"{base}/{name}.json"

    for claim in (2**62 - 1, 10**8):
        listing(f"unsized-{claim}", [("s-000.tar", 4), ("s-001.tar", claim)])
        listing(f"missing-{claim}", [("s-000.tar", 4), ("gone.tar", claim)])
        listing(f"http-{claim}", [(os.path.basename(served[0]), claim)], www, base)
    listing("overflow", [("s-000.tar", 2**62 - 1)] * 3)
    listing("missing-but-small", [("s-000.tar", 4), ("gone.tar", 3)])
    # Set-up alone, within its memory: no loader fork server (a remote ShardSet starts one, from a
    # thread whose stack and malloc arena this address-space limit would count).
    done = subprocess.run([sys.executable, "-c", BOUNDED, json.dumps(cases), str(tmp_path / "cache")], capture_output=True,
                          text=True, timeout=120, env=dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu",
                                                           HYDRAX_START_METHOD="fork"))
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    assert results.pop("missing-but-small") == ["ok", 7]
    for name, (outcome, words) in results.items():
        assert outcome in ("ShardFormatError", "ObjectNotFoundError"), (name, outcome, words)
        assert f"{name}.json" in words, (name, words)


# -- workers meet an index that contradicts the listing -------------------------------------------

def load_cls(sample, arrays, seed):
    arrays["cls"][...] = int(bytes(sample["cls"]))


@pytest.mark.parametrize("where, how", [("local", "drop"), ("http", "split")])
def test_workers_meeting_an_index_that_contradicts_the_listing_end_the_run_with_the_format_error(http_store, tmp_path, where, how):
    base, www = http_store
    folder = str(www) if where == "http" else str(tmp_path)
    paths = publish_http(folder, base) if where == "http" else write_shards(folder)
    manifest = os.path.join(folder, "train.json")
    with open(manifest, "w") as f:
        f.write(listing_text(paths, folder, sized=True))
    forged_index(ShardIndex.load(index_path(paths[0])), how).save(index_path(paths[0]))
    source = f"{base}/train.json" if where == "http" else manifest
    # read-ahead off: the workers themselves load the index; and no stream is cut off at the end,
    # which the test's HTTP server would report with a traceback from a thread of its own, later
    shards = ShardSet(source, cache_dir=str(tmp_path / "cache"), write_index=False, readahead=ReadAhead(enabled=False))
    group = DataGroup(2, shards, loader_arrays=ARRAYS)
    shard = f"{base}/{os.path.basename(paths[0])}" if where == "http" else paths[0]
    claimed, holds = (4, 3) if how == "drop" else (4, 5)
    with pytest.raises(ShardFormatError, match=re.escape(f"the manifest {source} says {claimed} samples, its index has {holds}")) as raised:
        with Dataloader(load_cls, group, loader_count=2, timeout_sec=60) as loader:
            for _batch in loader:
                pass
    assert raised.value.url == shard
