"""hydrax.ray: producers as actors of a real local Ray instance, one trainer.

Every run is compared with the same run loaded locally (tests/support/serve_share_job.py):
the same batches, in the same order, with the same numbers, items and seeds.
"""

from __future__ import annotations

import functools
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from hydrax.errors import ServeArgumentError, ServeError
from support import ray_producers
from support.leftovers import assert_nothing_left, snapshot
from support.timing import slack
from test_serve_reliable import local_run, remote_row

ray = pytest.importorskip("ray") if not os.environ.get("HYDRAX_REQUIRE_TEST_EXTRA") else __import__("ray")
from hydrax.ray import serve_on_ray  # noqa: E402

pytestmark = pytest.mark.slow
TESTS = Path(__file__).resolve().parent


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    path = os.pathsep.join([str(TESTS), str(TESTS.parent)])
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=100 * 1024**2, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": path, "JAX_PLATFORMS": "cpu"}})
    try:
        yield
    finally:
        ray.shutdown()


def idle_ray_workers(pids: set[int]) -> set[int]:
    """Those of ``pids`` that are Ray's idle workers, which it keeps for later tasks."""
    idle = set()
    for pid in pids:
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"ray::IDLE"):
                idle.add(pid)
        except OSError:
            pass
    return idle


@pytest.fixture(autouse=True)
def no_leftovers():
    """conftest's check, except for the idle workers Ray keeps for its next tasks: a test's
    actors, their loaders and its tasks' work must be gone."""
    before = snapshot()
    yield
    assert_nothing_left(before, 60, expected=idle_ray_workers)


def rows_of(source) -> list[tuple]:
    with source:
        return [remote_row(message) for message in source]


def test_four_producers_give_the_local_run():
    source = serve_on_ray(ray_producers.make_loader, producers=4, num_cpus=0.25, timeout=slack(60))
    rows = rows_of(source)
    assert rows == local_run()
    assert len(source.reports) == 4 and sum(report.batches for report in source.reports) == len(rows)
    assert source.next_start == (1, 10)
    # every actor is on the trainer's node: the batches came through shared memory, not TCP
    assert sum(report.shared_batches for report in source.reports) == source.collector.shared_batches > len(rows) // 2


def test_producers_asked_for_tcp_send_through_the_socket():
    source = serve_on_ray(ray_producers.make_loader, producers=2, num_cpus=0.25, timeout=slack(60), shared_memory=None)
    assert rows_of(source) == local_run()
    assert source.collector.shared_batches == 0


def test_an_actor_killed_mid_epoch_is_restarted_and_nothing_is_lost_or_repeated():
    source = serve_on_ray(functools.partial(ray_producers.make_loader, delay=0.02), producers=4, num_cpus=0.25, timeout=slack(60), credit=2)
    rows = []
    with source:
        for message in source:
            rows.append(remote_row(message))
            if len(rows) == 5:
                ray.kill(source.actors[1], no_restart=False)
        assert source.restarts >= 1
        assert source.collector.duplicates >= 0
    assert rows == local_run()


def test_resume_at_epoch_batch_gives_the_local_run_from_there():
    rows = rows_of(serve_on_ray(ray_producers.make_loader, producers=2, num_cpus=0.25, start_at=(1, 3), timeout=slack(60)))
    assert rows == local_run((1, 3))
    assert rows[0][:3] == (1, 3, False)


@pytest.mark.parametrize("how", ["loader fails", "actor not restarted"])
def test_a_producer_that_cannot_go_on_ends_the_run_with_its_share_named(how):
    if how == "loader fails":
        source = serve_on_ray(ray_producers.broken_loader, producers=2, num_cpus=0.25, timeout=slack(60))
    else:
        source = serve_on_ray(functools.partial(ray_producers.make_loader, delay=0.02), producers=2, num_cpus=0.25, max_restarts=0,
                              timeout=slack(60))
    started = time.monotonic()
    with source, pytest.raises(ServeError, match=r"share [01] of 2 on Ray failed") as caught:
        for count, _ in enumerate(source):
            if count == 3:
                ray.kill(source.actors[0], no_restart=False)
    assert time.monotonic() - started < slack(30)
    assert ("no shards here" if how == "loader fails" else "Actor") in str(caught.value)


def test_producers_a_cluster_cannot_run_or_not_an_int_are_refused_at_once_naming_the_argument():
    # Every actor handle is made before serve_on_ray returns: 10**6 of them held the call for
    # minutes, out of reach of `timeout`. The bound is loader_count's: 8 per CPU, at least 64.
    limit = max(64, 8 * int(ray.cluster_resources()["CPU"]))
    for wrong in ("2", 2.0, True):
        with pytest.raises(TypeError) as caught:
            serve_on_ray(ray_producers.make_loader, producers=wrong, num_cpus=0.25, timeout=slack(60))
        assert isinstance(caught.value, ServeArgumentError) and (caught.value.argument, caught.value.value) == ("producers", wrong)
    for number in (10**6, limit + 1, 0):
        started = time.monotonic()
        with pytest.raises(ServeArgumentError, match="producers") as caught:
            serve_on_ray(ray_producers.make_loader, producers=number, num_cpus=0.25, timeout=slack(60))
        assert time.monotonic() - started < slack(5)
        assert isinstance(caught.value, ValueError) and (caught.value.argument, caught.value.value) == ("producers", number)
        assert caught.value.limit == (None if number < 1 else limit)
        assert number < 1 or f"at most {limit}" in str(caught.value)


def test_producers_run_at_the_niceness_asked_not_rays():
    # Ray starts workers at niceness 15; next to a busy trainer such producers got 0.81x the
    # MB/s of plain processes. Raising a priority back needs the right to (root here, or RLIMIT_NICE).
    ray_default = 15
    allowed = os.geteuid() == 0 or resource.getrlimit(resource.RLIMIT_NICE)[0] >= 20
    for nice, expected in ((0, 0 if allowed else ray_default), (None, ray_default), (5, 5 if allowed else ray_default)):
        source = serve_on_ray(ray_producers.make_niceness_loader, producers=2, num_cpus=0.25, timeout=slack(60), nice=nice)
        with source:
            seen = {int(value) for message in source for value in message.arrays[0].tolist()}
        assert seen == {expected}, nice


# -- shard builds on Ray -----------------------------------------------------------------------

def many_samples(root: Path, count: int = 300, bad: tuple[int, ...] = ()) -> list:
    """Samples of one file field of 100-3,000 bytes and a text field; ``bad`` ones name a missing file."""
    from hydrax.shards.build.sources import SourceSample

    rng = np.random.default_rng(7)
    root.mkdir(parents=True, exist_ok=True)
    samples = []
    for k in range(count):
        path = root / f"s{k:04d}.bin"
        if k not in bad:
            path.write_bytes(rng.integers(0, 256, int(rng.integers(100, 3000)), np.uint8).tobytes())
        samples.append(SourceSample(f"s{k:04d}", {"bin": str(path)}, {"txt": f"sample {k}" * (k % 5)}, str(path)))
    return samples


def same_index(a: Path, b: Path) -> bool:
    from hydrax.shards import ShardIndex

    first, second = ShardIndex.load(str(a)), ShardIndex.load(str(b))
    first.shard_mtime_ns = second.shard_mtime_ns  # the only difference two builds may have: when they ran
    return first.to_bytes() == second.to_bytes()


def test_a_build_on_ray_writes_the_local_builds_shards_byte_for_byte(tmp_path):
    from hydrax.ray import build_shards_on_ray
    from hydrax.shards.build import build_shards

    samples = many_samples(tmp_path / "files", bad=(5, 140))
    options = dict(maxcount=40, maxsize=30_000, shuffle_seed=3, skip_bad=True)
    local = build_shards(samples, str(tmp_path / "local" / "t-%04d.tar"), warn=lambda _: None, **options)
    warnings, probed, written = [], [], []
    remote = build_shards_on_ray(samples, str(tmp_path / "ray" / "t-%04d.tar"), warn=warnings.append, chunk=32,
                                 probed=probed.append, progress=written.append, **options)
    names = sorted(p.name for p in (tmp_path / "local").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "ray").iterdir()) and len(names) > 2 * 8  # .tar and .hidx each
    for name in names:
        if name.endswith(".tar"):
            assert (tmp_path / "ray" / name).read_bytes() == (tmp_path / "local" / name).read_bytes(), name
        else:
            assert same_index(tmp_path / "ray" / name, tmp_path / "local" / name), name
    assert (remote.samples, remote.payload_bytes, remote.shard_bytes) == (local.samples, local.payload_bytes, local.shard_bytes)
    assert remote.skipped == local.skipped and len(remote.skipped) == 2 and len(warnings) == 2
    assert sum(probed) == len(samples) and sum(written) == len(samples) - 2 and len(written) > 1


def test_a_build_on_ray_refuses_a_bad_sample_and_leaves_nothing(tmp_path):
    from hydrax.ray import build_shards_on_ray
    from hydrax.shards.build.sources import BuildError

    samples = many_samples(tmp_path / "files", count=100, bad=(77,))
    with pytest.raises(BuildError, match=r"cannot read .*s0077\.bin"):
        build_shards_on_ray(samples, str(tmp_path / "out" / "t-%04d.tar"), maxcount=10, chunk=16)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_a_build_on_ray_to_s3_gives_the_same_objects_and_folder_summary(tmp_path, s3_store):
    from hydrax.ray import build_shards_on_ray
    from hydrax.shards import S3Options, ShardIndex
    from hydrax.shards.build import build_shards

    endpoint, client = s3_store
    options = S3Options(endpoint_url=endpoint, access_key_id="testing", secret_access_key="testing", region="us-east-1")
    samples = many_samples(tmp_path / "files", count=120)
    build_shards(samples, "s3://data/local/t-%04d.tar", maxcount=25, s3_options=options)
    build_shards_on_ray(samples, "s3://data/ray/t-%04d.tar", maxcount=25, s3_options=options, chunk=20)

    def objects(prefix):
        keys = sorted(o["Key"] for o in client.list_objects_v2(Bucket="data", Prefix=prefix)["Contents"])
        return {key[len(prefix):]: client.get_object(Bucket="data", Key=key)["Body"].read() for key in keys}

    local, remote = objects("local/"), objects("ray/")
    assert sorted(local) == sorted(remote) and len(local) == 2 * 5 + 1
    for name in local:
        if name == "hydrax-index.json":
            drop = lambda text: [{k: v for k, v in e.items()} for e in json.loads(text)["shardlist"]]  # noqa: E731
            assert drop(remote[name]) == drop(local[name])
        elif name.endswith(".hidx"):
            ours, theirs = ShardIndex.from_bytes(remote[name]), ShardIndex.from_bytes(local[name])
            assert ours.etag == theirs.etag  # tied to the same object version
            ours.shard_mtime_ns = theirs.shard_mtime_ns  # when the shard was written, before its upload
            assert ours.to_bytes() == theirs.to_bytes(), name
        else:
            assert remote[name] == local[name], name


def test_the_build_command_runs_on_ray(tmp_path):
    samples = many_samples(tmp_path / "files", count=60)
    listing = tmp_path / "files.txt"
    listing.write_text("".join(f"{s.files['bin']}\n" for s in samples))
    address = ray.get_runtime_context().gcs_address
    common = ["--maxcount", "7", "--shuffle", "--seed", "2", "-q"]
    for out, extra in (("local", []), ("ray", ["--ray", address])):
        done = subprocess.run([sys.executable, "-m", "hydrax", "shards", "build", str(listing), str(tmp_path / out / "t-%03d.tar"), *common, *extra],
                              capture_output=True, text=True, timeout=slack(180))
        assert done.returncode == 0, done.stderr
    tars = sorted(p.name for p in (tmp_path / "local").glob("*.tar"))
    assert len(tars) == 9 and tars == sorted(p.name for p in (tmp_path / "ray").glob("*.tar"))
    assert all((tmp_path / "ray" / name).read_bytes() == (tmp_path / "local" / name).read_bytes() for name in tars)


def test_a_build_on_ray_retries_a_task_whose_store_did_not_answer(tmp_path, s3_store):
    # The store's own retries are off (max_attempts=1), so the reset upload fails its task, and
    # only Ray's retry of that task can finish the build.
    from hydrax.ray import build_shards_on_ray
    from hydrax.shards import S3Options
    from support.netproxy import Proxy

    endpoint, client = s3_store
    port = int(endpoint.rsplit(":", 1)[1])
    samples = many_samples(tmp_path / "files", count=80)
    with Proxy("127.0.0.1", port, delay=0) as proxy:
        options = S3Options(endpoint_url=proxy.url, access_key_id="testing", secret_access_key="testing", region="us-east-1",
                            max_attempts=1)
        proxy.reset_next(1, match=r"/data/ray/t-0002\.tar$", method="PUT")
        report = build_shards_on_ray(samples, "s3://data/ray/t-%04d.tar", maxcount=20, s3_options=options, chunk=20)
        assert proxy.fired["reset"] == 1
    local = tmp_path / "local"
    from hydrax.shards.build import build_shards

    build_shards(samples, str(local / "t-%04d.tar"), maxcount=20)
    assert len(report.shards) == 4
    for number in range(4):
        body = client.get_object(Bucket="data", Key=f"ray/t-{number:04d}.tar")["Body"].read()
        assert body == (local / f"t-{number:04d}.tar").read_bytes(), number


# -- indexes on Ray ----------------------------------------------------------------------------

@pytest.fixture
def indexed_shards(tmp_path):
    """Eight local shards, with the index ``hydrax shards index`` writes for each (bytes by name)."""
    from hydrax.shards import index_file
    from hydrax.shards.build import build_shards

    report = build_shards(many_samples(tmp_path / "files", count=160), str(tmp_path / "shards" / "t-%04d.tar"), maxcount=20,
                          warn=lambda _: None)
    expected = {}
    for shard in report.shards:
        assert index_file(shard, force=True).problem is None
        expected[shard] = Path(shard + ".hidx").read_bytes()
        os.unlink(shard + ".hidx")
    return report.shards, expected


def test_indexes_on_ray_are_the_local_commands_and_a_bad_shard_is_named(tmp_path, indexed_shards):
    from hydrax.ray import index_files_on_ray

    shards, expected = indexed_shards
    bad = tmp_path / "shards" / "bad.tar"
    bad.write_bytes(b"not a tar file" * 100)
    done = []
    results = index_files_on_ray([*shards, str(bad)], chunk=3, progress=done.append)
    assert [r.samples for r in results] == [20] * 8 + [0] and sum(done) == 9 and len(done) == 3
    assert results[-1].problem is not None and "bad.tar" in results[-1].problem
    assert all(Path(shard + ".hidx").read_bytes() == expected[shard] for shard in shards)
    # the second time only what changed is rebuilt: one stale index
    os.utime(shards[2], ns=(1, 1))
    again = index_files_on_ray(shards, chunk=3)
    assert [r.samples for r in again] == [0, 0, 20, 0, 0, 0, 0, 0] and "its index was stale" in again[2].rebuilt
    from hydrax.shards import ShardIndex
    from hydrax.shards.sizecolumn import SizeCounts

    sized = index_files_on_ray(shards, chunk=3, sizes="bin")  # not images: every one 0 x 0, as the local command records
    assert all(r.sizes_added and r.sizes == SizeCounts(0, 0, 20) for r in sized)
    assert all(ShardIndex.load(shard + ".hidx").sizes.field == "bin" for shard in shards)


def test_index_objects_on_ray_survive_a_store_that_did_not_answer(tmp_path, indexed_shards, s3_store):
    from hydrax.ray import publish_indexes_on_ray
    from hydrax.shards import S3Options, publish_indexes
    from support.netproxy import Proxy

    shards, _ = indexed_shards
    endpoint, client = s3_store
    for shard in shards:
        client.upload_file(shard, "data", f"idx/{Path(shard).name}")
    urls = [f"s3://data/idx/{Path(shard).name}" for shard in shards]

    def objects():
        keys = sorted(o["Key"] for o in client.list_objects_v2(Bucket="data", Prefix="idx/")["Contents"])
        return {key: client.get_object(Bucket="data", Key=key)["Body"].read() for key in keys if not key.endswith(".tar")}

    port = int(endpoint.rsplit(":", 1)[1])
    with Proxy("127.0.0.1", port, delay=0) as proxy:
        options = S3Options(endpoint_url=proxy.url, access_key_id="testing", secret_access_key="testing", region="us-east-1",
                            max_attempts=1)
        proxy.reset_next(1, match=r"/data/idx/t-0005\.tar$", method="GET")
        entries = publish_indexes_on_ray(urls, options, chunk=3)
        assert proxy.fired["reset"] == 1
    on_ray = objects()
    assert [e.samples for e in entries] == [20] * 8 and all(e.index is None and e.version for e in entries)
    local_options = S3Options(endpoint_url=endpoint, access_key_id="testing", secret_access_key="testing", region="us-east-1")
    publish_indexes(urls, local_options, force=True)
    local = objects()
    assert sorted(on_ray) == sorted(local) == sorted([f"idx/t-{k:04d}.tar.hidx" for k in range(8)] + ["idx/hydrax-index.json"])
    assert on_ray == local  # the index objects byte for byte, and one summary listing all eight


def test_the_index_command_runs_on_ray(indexed_shards, s3_store):
    shards, expected = indexed_shards
    address = ray.get_runtime_context().gcs_address
    done = subprocess.run([sys.executable, "-m", "hydrax", "shards", "index", *shards, "--ray", address],
                          capture_output=True, text=True, timeout=slack(180))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "indexed 8 of 8 shards (160 samples newly indexed)"
    assert all(Path(shard + ".hidx").read_bytes() == expected[shard] for shard in shards)
    # remote shards: index objects, one folder summary and the manifest
    endpoint, client = s3_store
    for shard in shards:
        client.upload_file(shard, "data", f"cli/{Path(shard).name}")
    env = dict(os.environ, AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1")
    remote = subprocess.run([sys.executable, "-m", "hydrax", "shards", "index", "s3://data/cli/t-*.tar", "--endpoint-url", endpoint,
                             "--manifest", "s3://data/cli/train.json", "--ray", address], capture_output=True, text=True, env=env,
                            timeout=slack(180))
    assert remote.returncode == 0, remote.stderr
    assert remote.stdout.splitlines()[-1].startswith("indexed 8 shards (160 samples) in ")
    keys = {o["Key"] for o in client.list_objects_v2(Bucket="data", Prefix="cli/")["Contents"]}
    assert {"cli/hydrax-index.json", "cli/train.json"} | {f"cli/t-{k:04d}.tar.hidx" for k in range(8)} <= keys
    manifest = json.loads(client.get_object(Bucket="data", Key="cli/train.json")["Body"].read())
    assert [entry["nsamples"] for entry in manifest["shardlist"]] == [20] * 8
    refused = subprocess.run([sys.executable, "-m", "hydrax", "shards", "index", *shards, "--ray", address, "--workers", "2"],
                             capture_output=True, text=True, timeout=slack(60))
    assert refused.returncode == 2 and "--workers does not apply with --ray" in refused.stderr
