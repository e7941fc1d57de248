"""Shards on the Hugging Face Hub (``hf://``), against a local Hub and file store
(tests/support/hubserver.py): listing through the tree API, globs, revisions and pinning, private
repositories and tokens, a branch moved under a run, a file store that drops ``Range``, retries,
a Dataloader with workers, and the ``hydrax`` commands; and hostile answers (issue 38): redirects
that would carry the token to another origin, bodies longer than the range asked for, listings
whose pages never end, JSON nested past Python's stack, unusable endpoints, renamed repositories."""

import hashlib
import io
import json
import logging
import os
import pickle
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest

from hydrax import Dataloader, DataGroup
from hydrax.errors import (AccessDeniedError, ObjectChangedError, ObjectNotFoundError, RevisionMovedError, StoreConfigError,
                           StoreError, StoreUnavailableError)
from hydrax.shards import ShardSet, ShardWriter, expand_urls
from hydrax.shards.hub import HubStore, parse_url, pin_url
from hydrax.shards.readahead import ReadAhead
from hydrax.shards.router import store_for
from hydrax.shards.options import HFOptions
from hydrax.shards.store import run_async

from support.hubserver import Answer, HubServer
from support.timing import slack, slack_int

TOKEN = "hf_test_token"
NO_READAHEAD = ReadAhead(enabled=False)


@pytest.fixture
def hub(monkeypatch, tmp_path):
    """The local Hub, named by HF_ENDPOINT; no HF_TOKEN, and a stored login (if any) in this test's HF_HOME only."""
    home = tmp_path / "hf-home"
    home.mkdir()
    with HubServer(token=TOKEN, page_size=2) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        monkeypatch.setenv("HF_HOME", str(home))
        for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_TOKEN_PATH"):
            monkeypatch.delenv(name, raising=False)
        try:  # huggingface_hub read HF_HOME when it was imported: its stored login must be this test's too
            from huggingface_hub import constants

            monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(home / "token"))
        except ImportError:
            pass
        yield server


def write_shards(folder, count=3, per_shard=7, offset=0):
    """``count`` shards of ``per_shard`` samples (cls, and bin: 64 int32s of the sample's number)."""
    folder.mkdir(parents=True, exist_ok=True)
    with ShardWriter(str(folder / "train-%02d.tar"), maxcount=per_shard, index=False) as writer:
        for i in range(count * per_shard):
            n = i + offset
            writer.write({"__key__": f"k{i:04d}", "cls": str(n), "bin": np.full(64, n, np.int32).tobytes()})
    return writer.paths


def repo_files(paths, folder="data"):
    return {f"{folder}/{os.path.basename(p)}": open(p, "rb").read() for p in paths}


@pytest.fixture
def dataset(hub, tmp_path):
    """A public dataset ``org/data``: three shards under data/, a README; returns (commit, local paths)."""
    paths = write_shards(tmp_path / "local")
    sha = hub.create("org/data", {**repo_files(paths), "README.md": b"# shards\n"})
    return sha, paths


def items(shards):
    return [(s.key, {f: bytes(s[f]) for f in s}) for s in shards]


def classes(shards):
    return [int(bytes(s["cls"])) for s in shards]


def no_token_at_the_file_store(hub):
    return all("Authorization" not in r.headers for r in hub.requests("cdn"))


# -- listing, globs, pinning -----------------------------------------------------------------------


def test_a_listed_set_reads_like_its_local_copy_through_pages_of_the_tree(hub, dataset, tmp_path):
    sha, paths = dataset
    remote = ShardSet("hf://datasets/org/data/data/train-*.tar", cache_dir=str(tmp_path / "cache"))
    assert remote.shard_sizes() == [7, 7, 7]
    assert list(remote.urls) == [f"hf://datasets/org/data@{sha}/data/train-{n:02d}.tar" for n in range(3)]
    assert items(remote) == items(ShardSet(paths, cache_dir=str(tmp_path / "local-cache")))
    assert len(hub.requests("hub", r"/revision/main$")) == 1  # resolved once, at set-up
    trees = hub.requests("hub", r"/tree/")
    assert len(trees) == 2 and all(f"/tree/{sha}/data?recursive=true" in r.path for r in trees)  # 3 files, 2 a page
    assert "cursor=2" in trees[1].path
    # Every read names the commit; the file store's signed URL serves a file's later reads.
    resolves = hub.requests("hub", r"/resolve/")
    assert resolves and all(f"/resolve/{sha}/" in r.path for r in resolves)
    assert len(resolves) == 3  # one per shard: its index was built from one whole read, its samples came from the file store
    assert no_token_at_the_file_store(hub)
    # Set up again: indexes from the cache, no shard read.
    hub.log.clear()
    again = ShardSet("hf://datasets/org/data/data/train-*.tar", cache_dir=str(tmp_path / "cache"))
    assert again.shard_sizes() == [7, 7, 7] and hub.requests("cdn") == [] and hub.requests("hub", r"/resolve/") == []


def test_globs_braces_and_single_files_match_the_listing(hub, tmp_path):
    paths = write_shards(tmp_path / "local", count=4, per_shard=2)
    files = {**repo_files(paths[:2], "data"), **repo_files(paths[2:3], "data/extra"), **repo_files(paths[3:], "val")}
    sha = hub.create("org/globs", {**files, "data/notes.txt": b"not a shard"})
    root = f"hf://datasets/org/globs@{sha}"

    def names(pattern):
        return [u[len(root) + 1:] for u in expand_urls(pattern)]

    assert names("hf://datasets/org/globs/data/train-0?.tar") == ["data/train-00.tar", "data/train-01.tar"]
    assert names("hf://datasets/org/globs/data/train-0[1-2].tar") == ["data/train-01.tar"]
    assert names("hf://datasets/org/globs/data/*.tar") == ["data/extra/train-02.tar", "data/train-00.tar", "data/train-01.tar"]
    assert names("hf://datasets/org/globs/**/train-*.tar") == ["data/extra/train-02.tar", "data/train-00.tar",
                                                                "data/train-01.tar", "val/train-03.tar"]
    assert names("hf://datasets/org/globs/{data,val}/train-0[03].tar") == ["data/train-00.tar", "val/train-03.tar"]
    assert names("hf://datasets/org/globs/data/train-{00..01}.tar") == ["data/train-00.tar", "data/train-01.tar"]
    with pytest.raises(ObjectNotFoundError, match="matches no object"):
        expand_urls("hf://datasets/org/globs/data/nothing-*.tar")
    with pytest.raises(ObjectNotFoundError, match="matches no object"):
        expand_urls("hf://datasets/org/globs/no-such-folder/*.tar")
    # named directly (brace ranges): sizes and versions from one listing of the folder, no HEAD
    hub.log.clear()
    named = ShardSet("hf://datasets/org/globs/data/train-{00..01}.tar", cache_dir=str(tmp_path / "cache"))
    assert named.shard_sizes() == [2, 2] and hub.requests(method="HEAD") == []
    assert named.shard_entry(0).version == __import__("hashlib").sha256(open(paths[0], "rb").read()).hexdigest()


def test_urls_name_a_repository(hub):
    assert parse_url("hf://datasets/org/data@v1.0/a/b.tar").revision == "v1.0"
    assert parse_url("hf://org/model/w.tar").kind == "models" and parse_url("hf://org/model/w.tar").resolve("E") == (
        "E/org/model/resolve/main/w.tar")
    assert parse_url("hf://datasets/org/data@refs%2Fpr%2F1/x.tar").revision == "refs/pr/1"
    for bad in ("hf://datasets/org", "hf://datasets/org/*/x.tar", "hf://spaces/org/app/x.tar", "hf://datasets/org/data@/x.tar"):
        with pytest.raises(ValueError):
            parse_url(bad)


def test_model_repositories_are_read_too(hub, tmp_path):
    paths = write_shards(tmp_path / "local", count=1)
    sha = hub.create("org/model", repo_files(paths, "shards"), kind="models")
    shards = ShardSet("hf://org/model/shards/*.tar", cache_dir=str(tmp_path / "cache"), readahead=NO_READAHEAD)
    assert list(shards.urls) == [f"hf://org/model@{sha}/shards/train-00.tar"] and classes(shards) == list(range(7))


# -- revisions -------------------------------------------------------------------------------------


def test_revisions_are_branches_tags_or_commits(hub, tmp_path):
    first = write_shards(tmp_path / "v1")
    second = write_shards(tmp_path / "v2", offset=1000)
    old = hub.create("org/data", repo_files(first))
    hub.tag("org/data", "v1.0", old)
    new = hub.commit("org/data", repo_files(second))
    pr = hub.commit("org/data", repo_files(first[:1]), branch="refs/pr/1")

    def shards(url="hf://datasets/org/data/data/*.tar", **kw):
        return ShardSet(url, cache_dir=str(tmp_path / "cache"), readahead=NO_READAHEAD, **kw)

    assert classes(shards()) == list(range(1000, 1021))  # main
    assert classes(shards(revision="v1.0")) == list(range(21))  # a tag
    assert classes(shards(revision=old)) == list(range(21))  # a commit
    assert classes(shards("hf://datasets/org/data@v1.0/data/*.tar")) == list(range(21))  # the revision in the URL
    assert classes(shards(revision="refs/pr/1")) == list(range(7))  # a branch with a slash
    assert shards(revision="refs/pr/1").urls[0] == f"hf://datasets/org/data@{pr}/data/train-00.tar"
    assert shards(revision="main").urls[0] == f"hf://datasets/org/data@{new}/data/train-00.tar"
    with pytest.raises(ObjectNotFoundError, match="the revision 'v9' does not exist in the dataset org/data"):
        shards(revision="v9")
    with pytest.raises(ValueError, match="names revision 'v1.0', and revision='main' was given"):
        shards("hf://datasets/org/data@v1.0/data/*.tar", revision="main")
    with pytest.raises(ValueError, match="revision=.main. is for hf:// URLs"):
        ShardSet(first, revision="main")


def test_a_branch_moved_after_setup(hub, tmp_path):
    """Reads stay on the commit of set-up; a new set-up against the cache built from the old
    commit names the branch and both commits; pinning the old commit still reads the old data."""
    old_paths = write_shards(tmp_path / "v1")
    old = hub.create("org/data", repo_files(old_paths))
    cache = str(tmp_path / "cache")
    url = "hf://datasets/org/data/data/train-*.tar"
    running = ShardSet(url, cache_dir=cache, readahead=NO_READAHEAD)
    assert classes(running[:3]) == [0, 1, 2]
    worker_copy = pickle.loads(pickle.dumps(running))  # what a worker started from the fork server receives
    new = hub.commit("org/data", repo_files(write_shards(tmp_path / "v2", offset=500)))  # same names, other bytes
    assert classes(running) == list(range(21)) and classes(worker_copy) == list(range(21))
    assert not any(f"/resolve/{new}/" in r.path or "/resolve/main/" in r.path for r in hub.requests("hub"))

    with pytest.raises(RevisionMovedError) as moved:
        ShardSet(url, cache_dir=cache)
    error = moved.value
    assert isinstance(error, ObjectChangedError) and (error.revision, error.expected, error.actual) == ("main", old, new)
    assert error.url == url and os.path.exists(error.record)
    assert f"'main' of hf://datasets/org/data (at {hub.url}) now points at commit {new}" in str(error)
    assert f"Pass revision={old!r} to keep reading the data they were built from, or delete {error.record}" in str(error)
    assert pickle.loads(pickle.dumps(error)).actual == new

    hub.log.clear()
    pinned = ShardSet(url, cache_dir=cache, revision=old, readahead=NO_READAHEAD)
    assert classes(pinned) == list(range(21)) and list(pinned.urls) == list(running.urls)
    assert hub.requests("hub", r"/revision/") == [] and hub.requests("cdn", method="GET") and all(
        "Range" in r.headers for r in hub.requests("cdn"))  # indexes from the cache: no shard read whole

    os.unlink(error.record)  # what the error says to do to move on
    moved_on = ShardSet(url, cache_dir=cache, readahead=NO_READAHEAD)
    assert classes(moved_on) == list(range(500, 521))
    assert ShardSet(url, cache_dir=cache).urls == moved_on.urls  # recorded again: no error for the new commit


def test_a_read_answered_with_other_content_is_an_object_changed_error(hub, dataset, tmp_path):
    sha, paths = dataset
    shards = ShardSet("hf://datasets/org/data/data/train-00.tar", cache_dir=str(tmp_path / "cache"), readahead=NO_READAHEAD)
    url, version = shards.urls[0], shards.shard_entry(0).version
    store = store_for(url)
    assert bytes(store.read(url, 0, 512, version=version))[:5] == b"k0000"
    fresh = HubStore(HFOptions())  # no signed URL kept: it asks the Hub, which names the content it has
    with pytest.raises(ObjectChangedError, match="the Hub answers with ETag") as changed:
        fresh.read(url, 512, 100, version="0" * 64)
    assert changed.value.url == url and changed.value.offset == 512


# -- tokens ----------------------------------------------------------------------------------------


@pytest.fixture
def private(hub, tmp_path):
    paths = write_shards(tmp_path / "local", count=2)
    hub.create("org/private", repo_files(paths), private=True)
    return "hf://datasets/org/private/data/*.tar"


def test_a_private_repository_needs_the_token(hub, private, tmp_path, monkeypatch):
    cache = str(tmp_path / "cache")
    with pytest.raises(AccessDeniedError) as refused:
        ShardSet(private, cache_dir=cache)
    assert "without a token" in str(refused.value) and "Set HF_TOKEN, log in with `hf auth login`" in str(refused.value)
    assert isinstance(refused.value, PermissionError) and refused.value.url.startswith("hf://datasets/org/private")

    monkeypatch.setenv("HF_TOKEN", "hf_wrong")
    with pytest.raises(AccessDeniedError, match="the Hub refused the token in the environment variable HF_TOKEN"):
        ShardSet(private, cache_dir=cache)

    monkeypatch.setenv("HF_TOKEN", TOKEN)
    shards = ShardSet(private, cache_dir=cache, readahead=NO_READAHEAD)
    assert classes(shards) == list(range(14))
    sent = [r for r in hub.requests("hub") if r.headers.get("Authorization") == f"Bearer {TOKEN}"]
    assert len(sent) == len(hub.requests("hub")) - 2  # all but the two refused above carried it ...
    assert hub.requests("cdn") and no_token_at_the_file_store(hub)  # ... and none went to the file store

    monkeypatch.delenv("HF_TOKEN")
    explicit = ShardSet(private, cache_dir=str(tmp_path / "c2"), hf=HFOptions(token=TOKEN), readahead=NO_READAHEAD)
    assert classes(explicit) == list(range(14))
    with pytest.raises(AccessDeniedError, match=r"refused the token given as HFOptions\(token=...\)"):
        ShardSet(private, cache_dir=str(tmp_path / "c3"), hf=HFOptions(token="hf_other"))
    assert "hf_other" not in repr(HFOptions(token="hf_other"))


def test_huggingface_hubs_stored_login_is_used(hub, private, tmp_path):
    pytest.importorskip("huggingface_hub")
    from huggingface_hub import constants

    with open(constants.HF_TOKEN_PATH, "w") as f:
        f.write("hf_stale\n")
    with pytest.raises(AccessDeniedError, match=r"the token of huggingface_hub's stored login \(.*hf-home/token\)"):
        ShardSet(private, cache_dir=str(tmp_path / "cache"))
    with open(constants.HF_TOKEN_PATH, "w") as f:
        f.write(TOKEN + "\n")
    assert len(ShardSet(private, cache_dir=str(tmp_path / "cache"))) == 14


def hydrax(*args, env):
    return subprocess.run([sys.executable, "-m", "hydrax", *args], check=False, capture_output=True, text=True,
                          timeout=slack(120), env={**os.environ, **env})


def test_the_stored_login_is_found_through_hf_home_in_a_new_process(hub, private, tmp_path):
    """A fresh process: huggingface_hub finds the login under HF_HOME as it always does."""
    pytest.importorskip("huggingface_hub")
    home = tmp_path / "elsewhere"
    home.mkdir()
    (home / "token").write_text(TOKEN)
    env = {"HF_HOME": str(home), "HF_ENDPOINT": hub.url, "HYDRAX_CACHE": str(tmp_path / "cache")}
    result = hydrax("shards", "verify", private, env=env)
    assert result.returncode == 0, result.stderr
    assert "2 shards, 14 samples" in result.stdout
    (home / "token").unlink()
    refused = hydrax("shards", "verify", private, env=env)
    assert refused.returncode != 0 and "without a token" in refused.stderr + refused.stdout


# -- reads -----------------------------------------------------------------------------------------


def test_a_file_store_that_drops_range_is_cut_for_small_files_and_refused_for_large_ones(hub, dataset, tmp_path, caplog):
    sha, paths = dataset
    url = "hf://datasets/org/data/data/train-*.tar"
    shards = ShardSet(url, cache_dir=str(tmp_path / "cache"), readahead=NO_READAHEAD)
    hub.drop_range = True
    with caplog.at_level(logging.WARNING, logger="hydrax.shards.hub"):
        assert items(shards) == items(ShardSet(paths, cache_dir=str(tmp_path / "local-cache")))
    assert "ignores Range headers" in caplog.text
    assert all(r.headers.get("Range") for r in hub.requests("cdn")[-3:])  # asked for ranges, was sent whole files

    strict = ShardSet(url, cache_dir=str(tmp_path / "cache"), readahead=NO_READAHEAD, hf=HFOptions(max_unranged_bytes=4096))
    with pytest.raises(StoreError) as refused:
        strict[8]["cls"]
    error = refused.value
    assert error.url == strict.urls[1] and error.offset == int(strict.layout(1).starts[1])
    assert "ignored the Range header and began sending the whole file" in str(error)
    assert "HFOptions(max_unranged_bytes=4096)" in str(error) and not isinstance(error, StoreUnavailableError)


def test_transient_failures_are_retried_then_named(hub, dataset, tmp_path, monkeypatch):
    from hydrax.shards.hub import store as hub_module

    waits = []
    monkeypatch.setattr(hub_module, "_pause", waits.append)
    shards = ShardSet("hf://datasets/org/data/data/train-*.tar", cache_dir=str(tmp_path / "cache"), readahead=NO_READAHEAD)
    hub.fail_next(2, status=503)
    assert classes(shards[:2]) == [0, 1]
    hub.fail_next(1, reset=True)
    assert classes(shards[2:3]) == [2]
    hub.fail_next(1, status=429, retry_after="7", server="hub")
    fresh = HubStore(HFOptions())
    assert bytes(fresh.read(shards.urls[2], 0, 5)) == b"k0014"
    assert waits[-1] == 7.0 and len(waits) == 4  # as the Hub asked, after three backoffs
    hub.fail_next(10, status=502)
    give_up = HubStore(HFOptions(max_attempts=3))
    with pytest.raises(StoreUnavailableError, match=r"at byte offset 100: the request failed after retries \(3 attempts\): 502"):
        give_up.read(shards.urls[1], 100, 10)


def test_missing_files_and_repositories_are_named(hub, dataset, tmp_path):
    sha, _ = dataset
    store = store_for("hf://datasets/org/data/x")
    with pytest.raises(ObjectNotFoundError, match="does not exist in the dataset org/data"):
        store.read(f"hf://datasets/org/data@{sha}/data/none.tar", 0, 10)
    assert store.stat(f"hf://datasets/org/data@{sha}/data/train-00.tar").size == os.path.getsize(dataset[1][0])
    with pytest.raises(AccessDeniedError, match="private or gated, or does not exist"):
        ShardSet("hf://datasets/org/nothing/*.tar", cache_dir=str(tmp_path / "cache"))
    with pytest.raises(StoreError, match="does not write"):
        store.write(f"hf://datasets/org/data@{sha}/x.tar", b"")


def test_many_reads_are_in_flight_at_once(hub, dataset, tmp_path):
    """Read-ahead's asynchronous reads share one pool: four held at the file store pass only together."""
    sha, _ = dataset
    url = f"hf://datasets/org/data@{sha}/data/train-00.tar"
    store = store_for(url)
    store.read(url, 0, 10)  # the signed URL, known from now on
    hub.hold(4, timeout=slack(20), match="blobs")
    before = len(hub.requests("cdn"))

    async def together():
        import asyncio

        return await asyncio.gather(*(store.read_async(url, 512 * n, 512) for n in range(4)))

    assert [len(b) for b in run_async(together())] == [512] * 4
    assert len(hub.requests("cdn")) - before == 4  # none was held alone (answered 504) and sent again

    async def streamed():
        return [bytes(piece) async for piece in store.stream_async(url, 100, 3000)]

    assert b"".join(run_async(streamed())) == open(dataset[1][0], "rb").read()[100:3000]


# -- through a Dataloader, and the commands -------------------------------------------------------


ARRAYS = {"cls": ((), np.int32, jnp.int32), "bin": ((4,), np.int32, jnp.int32)}


def load_sample(sample, arrays, seed):
    arrays["cls"][...] = int(bytes(sample["cls"]))
    arrays["bin"][:] = np.frombuffer(sample["bin"], np.int32)[:4]


def batches(dataset):
    seen = []
    group = DataGroup(4, dataset, loader_arrays=ARRAYS, seed=5, shuffle_first=True)
    with Dataloader(load_sample, group, loader_count=2, end_at=("epoch", 1), timeout_sec=slack_int(60)) as loader:
        for batch in loader:
            seen.append((list(batch.indices), np.asarray(batch.arrays["cls"]).tolist(), np.asarray(batch.arrays["bin"]).tolist()))
            del batch
    return seen


def test_a_dataloader_with_two_workers_yields_the_items_of_the_local_copy(hub, dataset, tmp_path):
    sha, paths = dataset
    remote = ShardSet("hf://datasets/org/data/data/train-*.tar", cache_dir=str(tmp_path / "cache"))
    local = ShardSet(paths, cache_dir=str(tmp_path / "local-cache"))
    through_hub, through_disk = batches(remote), batches(local)
    assert through_hub == through_disk and len(through_hub) == 5
    assert len({c for _, cls, _ in through_hub for c in cls}) == 20
    assert no_token_at_the_file_store(hub) and all(f"/resolve/{sha}/" in r.path for r in hub.requests("hub", "/resolve/"))


def png_shards(folder):
    folder.mkdir(parents=True, exist_ok=True)
    from PIL import Image

    rng = np.random.default_rng(3)
    with ShardWriter(str(folder / "img-%02d.tar"), maxcount=5, index=False) as writer:
        for i in range(8):
            buffer = io.BytesIO()
            Image.fromarray(rng.integers(0, 256, (6, 7, 3), np.uint8)).save(buffer, "PNG")
            writer.write({"__key__": f"k{i:03d}", "png": buffer.getvalue(), "cls": ("cat", "dog")[i % 2]})
    return writer.paths


@pytest.mark.slow
def test_the_commands_read_hf_urls(hub, tmp_path):
    pytest.importorskip("PIL")
    paths = png_shards(tmp_path / "local")
    sha = hub.create("org/images", repo_files(paths))
    env = {"HF_ENDPOINT": hub.url, "HYDRAX_CACHE": str(tmp_path / "cache")}
    url = "hf://datasets/org/images/data/img-*.tar"

    verify = hydrax("shards", "verify", "--decode", url, env=env)
    assert verify.returncode == 0, verify.stderr
    assert "2 shards, 8 samples, 8 images decoded: 2 ok" in verify.stdout
    assert f"hf://datasets/org/images@{sha}/data/img-00.tar" in verify.stdout

    stat = hydrax("stat", "--json", "-q", url, env=env)
    assert stat.returncode == 0, stat.stderr
    found = json.loads(stat.stdout)
    assert found["samples"] == 8 and found["fields"]["png"]["count"] == 8

    out = tmp_path / "grid.png"
    show = hydrax("show", "--count", "4", url, "--out", str(out), env=env)
    assert show.returncode == 0, show.stderr
    assert out.exists() and out.stat().st_size > 0
    assert no_token_at_the_file_store(hub)


def test_pin_url_asks_once_per_repository(hub, dataset):
    sha, _ = dataset
    pins = {}
    urls = [pin_url(f"hf://datasets/org/data/data/train-0{n}.tar", HFOptions(), pins) for n in range(3)]
    assert urls[2] == f"hf://datasets/org/data@{sha}/data/train-02.tar" and len(pins) == 1
    assert pin_url(urls[0], HFOptions(), pins) == urls[0] and len(hub.requests("hub", "/revision/")) == 1


def test_a_manifest_in_the_repository_is_pinned_with_its_shards(hub, tmp_path):
    paths = write_shards(tmp_path / "local", count=2)
    shardlist = [{"url": os.path.basename(p), "nsamples": 7} for p in paths]
    manifest = json.dumps({"__kind__": "wids-shard-index-v1", "wids_version": 1, "shardlist": shardlist}).encode()
    sha = hub.create("org/listed", {**repo_files(paths), "data/train.json": manifest})
    shards = ShardSet("hf://datasets/org/listed/data/train.json", cache_dir=str(tmp_path / "cache"), readahead=NO_READAHEAD)
    assert list(shards.urls) == [f"hf://datasets/org/listed@{sha}/data/{os.path.basename(p)}" for p in paths]
    assert classes(shards) == list(range(14))
    assert all(f"/resolve/{sha}/" in r.path for r in hub.requests("hub", "/resolve/"))


def test_the_hub_needs_its_extra_only_when_used():
    """``import hydrax.shards`` imports neither urllib3 nor huggingface_hub; without urllib3, an
    hf:// read says which extra to install; without huggingface_hub, HF_TOKEN still serves."""
    code = (
        "import sys\n"
        "import hydrax.shards\n"
        "assert 'urllib3' not in sys.modules and 'huggingface_hub' not in sys.modules\n"
        "sys.modules['urllib3'] = None\n"
        "sys.modules['huggingface_hub'] = None\n"
        "from hydrax.shards.hub import HubStore, hub_token\n"
        "from hydrax.shards.options import HFOptions\n"
        "print(hub_token(HFOptions())[1])\n"
        "try:\n"
        "    HubStore(HFOptions()).read('hf://datasets/org/data@' + 'a' * 40 + '/x.tar', 0, 10)\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    env = {name: value for name, value in os.environ.items() if name not in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=slack(60), env=env)
    assert result.returncode == 0, result.stderr
    assert "huggingface_hub, which reads the login `hf auth login` stores, is not installed: pip install 'hydrax[hf]'" in result.stdout
    assert "hf:// shards need urllib3: pip install 'hydrax[hf]'" in result.stdout


def test_an_expired_file_store_url_is_asked_for_again(hub, dataset, tmp_path):
    """The file store's signed URL serves a file's reads until it is refused; then the Hub is asked again."""
    sha, paths = dataset
    shards = ShardSet("hf://datasets/org/data/data/train-00.tar", cache_dir=str(tmp_path / "cache"), readahead=NO_READAHEAD)
    assert classes(shards[:2]) == [0, 1]
    resolves = len(hub.requests("hub", "/resolve/"))
    hub.expire_signatures()
    assert classes(shards[2:4]) == [2, 3]
    assert len(hub.requests("hub", "/resolve/")) == resolves + 1  # once, for the new URL, which then served both reads
    refused = [r for r in hub.requests("cdn") if "sig=s0" in r.path and r.headers.get("Range")]
    assert refused and no_token_at_the_file_store(hub)


# -- hostile answers (issue 38) --------------------------------------------------------------------


def port_of(url):
    return url.rsplit(":", 1)[1]


def only_the_hub_saw_the_token(hub):
    return hub.token_origins() <= {f"hub 127.0.0.1:{port_of(hub.url)}"}


@pytest.fixture
def private_shard(hub, tmp_path):
    """(a URL pinned to a commit of the private dataset org/secret, the shard's bytes)."""
    paths = write_shards(tmp_path / "local", count=1)
    sha = hub.create("org/secret", repo_files(paths), private=True)
    return f"hf://datasets/org/secret@{sha}/data/train-00.tar", open(paths[0], "rb").read()


# The Location a redirect names: {other} and {hub} are ports of 127.0.0.1, {other6} one of [::1];
# every one but the last two leads to another origin than the Hub's as urllib3 connects.
HOSTILE_LOCATIONS = [
    "http://127.0.0.1:{other}\\@127.0.0.1:{hub}/blobs/{digest}",  # urllib.parse reads the Hub's host and port here
    "http://127.0.0.1:{other}\\\\@127.0.0.1:{hub}/blobs/{digest}",
    "http://127.0.0.1:{other}\\x@127.0.0.1:{hub}/blobs/{digest}",
    "http://127.0.0.1:{hub}@127.0.0.1:{other}/blobs/{digest}",  # userinfo that looks like the Hub
    "http://hf_user:hf_pass@127.0.0.1:{other}/blobs/{digest}",
    "http://%31%32%37.0.0.1:{other}/blobs/{digest}",  # percent-encoded host
    "http://127.0.0.1:{other}#@127.0.0.1:{hub}/blobs/{digest}",
    "http://127.0.0.1:{other}?@127.0.0.1:{hub}/blobs/{digest}",
    "http://[::1]:{other6}/blobs/{digest}",  # IPv6
    "http://[::ffff:127.0.0.1]:{hub}/blobs/{digest}",  # the Hub's address, written as another host
    "http://127.0.0.1.:{hub}/blobs/{digest}",  # a trailing dot: another host name
    "http://%31%32%37.0.0.1:{hub}/blobs/{digest}",  # the Hub's own origin, percent-encoded: it may have the token
    "/blobs/{digest}\\@127.0.0.1:{other}",  # relative: the same origin as the redirect
]


@pytest.mark.parametrize("source", ["cdn", "hub"])
@pytest.mark.parametrize("location", HOSTILE_LOCATIONS)
def test_the_token_goes_only_to_the_hubs_origin_as_urllib3_connects(hub, private_shard, location, source):
    """Issue 38 row 1: a redirect whose host urllib.parse and urllib3 read differently never
    carries the token to the origin urllib3 connects to (unless that is the Hub's own)."""
    url, data = private_shard
    digest = hashlib.sha256(data).hexdigest()
    other6 = port_of(hub.other6_url) if hub.other6_url else "1"
    target = location.format(hub=port_of(hub.url), other=port_of(hub.other_url), other6=other6, digest=digest)
    hub.answer_next(None, Answer(302, {"Location": target}), server=source, match="/blobs/|/resolve/")
    store = HubStore(HFOptions(token=TOKEN, max_attempts=1))
    try:
        got = store.read(url, 100, 50)
    except StoreError:
        pass
    else:
        assert bytes(got) == data[100:150]
    assert only_the_hub_saw_the_token(hub), hub.token_origins()
    assert len(hub.requests("hub")) >= 1


def test_the_headline_redirect_reaches_another_origin_without_the_token(hub, private_shard):
    url, data = private_shard
    digest = hashlib.sha256(data).hexdigest()
    hub.answer_next(None, Answer(302, {"Location": f"http://127.0.0.1:{port_of(hub.other_url)}\\@127.0.0.1:{port_of(hub.url)}/blobs/{digest}"}),
                    server="cdn", match="/blobs/")
    assert bytes(HubStore(HFOptions(token=TOKEN, max_attempts=1)).read(url, 100, 50)) == data[100:150]
    other = hub.requests("other")
    assert other and all("Authorization" not in r.headers for r in other)  # urllib3 went to the other port, tokenless
    assert only_the_hub_saw_the_token(hub)


def lfs_shard(hub, dataset):
    sha, paths = dataset
    return f"hf://datasets/org/data@{sha}/data/train-00.tar", open(paths[0], "rb").read()


HUGE = 64 << 20
BLOCK = b"x" * (64 << 10)


def content_range(start, end, total):
    return {"Content-Range": f"bytes {start}-{end}/{total}"}


@pytest.mark.parametrize("framing", ["length", "chunked", "close"])
def test_a_range_answered_with_a_longer_body_is_refused_after_the_range(hub, dataset, framing):
    """Issue 38 row 2: a 206 with the right Content-Range and a 64 MiB body for 100 bytes."""
    url, data = lfs_shard(hub, dataset)
    length = {"length": "auto", "chunked": None, "close": None}[framing]
    hub.answer_next(None, Answer(206, content_range(100, 199, len(data)), BLOCK, HUGE // len(BLOCK), length, framing == "chunked"),
                    server="cdn", match="/blobs/")
    with pytest.raises(StoreError) as refused:
        HubStore(HFOptions(max_attempts=2)).read(url, 100, 100)
    error = refused.value
    assert not isinstance(error, StoreUnavailableError) and error.url == url and error.offset == 100
    assert "asked for bytes 100-199 (100 bytes)" in str(error)
    assert all(r.sent < HUGE // 2 for r in hub.requests("cdn"))  # the reader stopped: it did not take the body in


def test_a_whole_file_read_stops_at_the_size_the_hub_said(hub, dataset):
    """Issue 38 row 2: a 200 for a whole-file read whose body runs on past X-Linked-Size."""
    url, data = lfs_shard(hub, dataset)
    hub.answer_next(None, Answer(200, {}, BLOCK, HUGE // len(BLOCK), None, True), server="cdn", match="/blobs/")
    with pytest.raises(StoreError) as refused:
        HubStore(HFOptions(max_attempts=2)).read(url)
    assert not isinstance(refused.value, StoreUnavailableError) and refused.value.url == url
    assert f"the whole file ({len(data)} bytes, as the Hub said)" in str(refused.value)
    assert all(r.sent < HUGE // 2 for r in hub.requests("cdn"))


def test_a_stream_stops_at_the_end_of_its_range(hub, dataset):
    """Issue 38 row 2, streamed: the bytes of the range, then a StoreError for the body that goes on."""
    url, data = lfs_shard(hub, dataset)

    def longer(request):
        body = data[100:3000] + BLOCK * (HUGE // len(BLOCK))
        return Answer(206, content_range(100, 2999, len(data)), body, 1, None, True)

    hub.answer_next(None, longer, server="cdn", match="/blobs/")
    store = HubStore(HFOptions(max_attempts=2))
    got = []

    async def streamed():
        async for piece in store.stream_async(url, 100, 3000):
            got.append(bytes(piece))

    with pytest.raises(StoreError, match=r"asked for bytes 100-2999 \(2900 bytes\), the server went on sending past byte 2999") as refused:
        run_async(streamed())
    assert refused.value.url == url and b"".join(got) == data[100:3000][: len(b"".join(got))]
    announced = Answer(206, {**content_range(100, 2999, len(data)), "Content-Length": HUGE}, data[100:3000], length=None)
    hub.answer_next(None, announced, server="cdn", match="/blobs/")
    with pytest.raises(StoreError, match=f"announces {HUGE} bytes"):
        run_async(streamed())


def tree_pages(hub, following):
    """Tree answers of one file each, whose Link names ``following(request, n)`` (None: no more)."""
    served = []

    def page(request):
        served.append(request.path)
        entry = {"type": "file", "oid": "0" * 40, "size": 10, "path": f"data/f{len(served):05d}.tar"}
        nxt = following(request, len(served))
        return Answer(200, {"Content-Type": "application/json", **({"Link": f'<{nxt}>; rel="next"'} if nxt else {})},
                      json.dumps([entry]).encode())

    hub.answer_next(None, page, server="hub", match="/tree/")
    return served


def test_a_tree_listing_that_names_its_own_page_again_is_refused(hub, dataset):
    """Issue 38 row 3: ``Link: <same page>; rel="next"``."""
    sha, _ = dataset
    served = tree_pages(hub, lambda request, n: hub.url + request.path if n < 50 else None)
    prefix = f"hf://datasets/org/data@{sha}/data/"
    with pytest.raises(StoreError, match="names the page .* again") as refused:
        store_for(prefix).list(prefix)
    assert refused.value.url == prefix and len(served) == 1


def test_a_tree_listing_whose_pages_never_end_is_refused(hub, dataset, monkeypatch):
    """Issue 38 row 3: every page names a new next one."""
    from hydrax.shards.hub import store as hub_module

    monkeypatch.setattr(hub_module, "MAX_PAGES", 20, raising=False)
    sha, _ = dataset
    served = tree_pages(hub, lambda request, n: f"{hub.url}{request.path.split('?')[0]}?recursive=true&cursor={n}" if n < 60 else None)
    prefix = f"hf://datasets/org/data@{sha}/data/"
    with pytest.raises(StoreError, match="runs past 20 pages") as refused:
        store_for(prefix).list(prefix)
    assert refused.value.url == prefix and len(served) == 20


DEEP = b"[" * 200_000 + b"]" * 200_000


@pytest.mark.parametrize("api", ["revision", "tree"])
def test_json_nested_past_pythons_stack_is_a_store_error(hub, dataset, api):
    """Issue 38 row 4: a 200,000-deep answer of the revision or tree API."""
    sha, _ = dataset
    hub.answer_next(None, Answer(200, {"Content-Type": "application/json"}, DEEP), server="hub", match=f"/{api}/")
    url = "hf://datasets/org/data/data/train-00.tar" if api == "revision" else f"hf://datasets/org/data@{sha}/data/"
    store = store_for(url)
    with pytest.raises(StoreError, match="nests JSON deeper than Python can parse") as refused:
        store.commit_of(url) if api == "revision" else store.list(url)
    assert refused.value.url == url and not isinstance(refused.value, StoreUnavailableError)


def test_an_api_answer_is_read_up_to_a_bound(hub, dataset, monkeypatch):
    """Issue 38 row 4: at most MAX_API_BYTES of an answer of the API is read."""
    from hydrax.shards.hub import client as hub_module

    monkeypatch.setattr(hub_module, "MAX_API_BYTES", 1 << 20, raising=False)
    sha, _ = dataset
    url = f"hf://datasets/org/data@{sha}/data/"
    hub.answer_next(1, Answer(200, {}, b"[" + b'"aaaaaaa",' * (1 << 20) + b'"a"]', length=None, chunked=True), server="hub", match="/tree/")
    with pytest.raises(StoreError, match=f"longer than the {1 << 20} bytes"):
        store_for(url).list(url)
    hub.answer_next(1, Answer(200, {}, b"[]" + b" " * (2 << 20)), server="hub", match="/tree/")
    with pytest.raises(StoreError, match=f"announces {(2 << 20) + 2} bytes"):
        store_for(url).list(url)
    assert all(r.sent < (8 << 20) for r in hub.requests("hub"))


BAD_ENDPOINTS = [("http://127.0.0.1:99999", "its port is not a number from 0 to 65535"),
                 ("http://127.0.0.1:abc", "its port is not a number from 0 to 65535"),
                 ("http://127.0.0.1:-1", "its port is not a number from 0 to 65535"),
                 ("http://[::1", "its IPv6 address has no closing ']'"),
                 ("http://[::1]:70000", "its port is not a number from 0 to 65535"),
                 ("http://127.0.0.1:1\\@127.0.0.1:2", "it holds a backslash"),
                 ("http://user@127.0.0.1:8080", "it may hold only a scheme, a host, a port and a path (no user name")]


@pytest.mark.parametrize("where", ["option", "environment"])
@pytest.mark.parametrize("endpoint, why", BAD_ENDPOINTS)
def test_an_unusable_endpoint_is_a_config_error_naming_where_it_was_set(monkeypatch, endpoint, why, where):
    """Issue 38 row 5, in the words the S3 store uses for its endpoints."""
    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    if where == "environment":
        monkeypatch.setenv("HF_ENDPOINT", endpoint)
    options = HFOptions(token="", endpoint=endpoint if where == "option" else None, max_attempts=1)
    origin = "HFOptions(endpoint=...)" if where == "option" else "the environment variable HF_ENDPOINT"
    with pytest.raises(StoreConfigError) as refused:
        HubStore(options).stat("hf://datasets/org/data@" + "a" * 40 + "/x.tar")
    assert f"the Hub endpoint URL {endpoint!r}, set by {origin}, is not usable: {why}" in str(refused.value)
    assert isinstance(refused.value, ValueError) and "set it to the Hub's URL" in str(refused.value)


def test_a_renamed_repository_is_followed_with_the_token_and_its_new_name_logged_once(hub, tmp_path, caplog, monkeypatch):
    """Issue 38 row 16: the Hub answers for a renamed repository with a 307 to the new name."""
    from hydrax.shards.hub import store as hub_module

    monkeypatch.setattr(hub_module, "_moved", set(), raising=False)  # what this process has logged so far
    paths = write_shards(tmp_path / "local", count=2)
    sha = hub.create("org/old", repo_files(paths), private=True)
    hub.rename("org/old", "neworg/newname")
    url = "hf://datasets/org/old/data/*.tar"
    with caplog.at_level(logging.WARNING, logger="hydrax.shards.hub"):
        shards = ShardSet(url, cache_dir=str(tmp_path / "cache"), readahead=NO_READAHEAD, hf=HFOptions(token=TOKEN))
        assert classes(shards) == list(range(14))
        assert list(shards.urls)[0] == f"hf://datasets/org/old@{sha}/data/train-00.tar"
    moved = [r for r in caplog.records if "has moved to neworg/newname" in r.getMessage()]
    assert len(moved) == 1, caplog.text
    assert "write hf://datasets/neworg/newname/data/*.tar instead of hf://datasets/org/old/data/*.tar" in moved[0].getMessage()
    redirected = hub.requests("hub", "/org/old/")
    assert redirected and all(r.headers.get("Authorization") == f"Bearer {TOKEN}" for r in hub.requests("hub"))
    assert only_the_hub_saw_the_token(hub) and hub.requests("cdn")
