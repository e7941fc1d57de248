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

from hydrax.errors import ServeError
from support import ray_producers
from support.leftovers import new_shm_entries, stray_processes
from support.shmwatch import SHM
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


def describe(pids: set[int]) -> list[str]:
    out = []
    for pid in sorted(pids):
        try:
            out.append(f"{pid} {Path(f'/proc/{pid}/cmdline').read_bytes().replace(bytes(1), b' ')[:80].decode(errors='replace')}")
        except OSError:
            out.append(f"{pid} (gone)")
    return out


@pytest.fixture(autouse=True)
def no_leftovers():
    """conftest's check, except for the idle workers Ray keeps for its next tasks: a test's
    actors, their loaders and its tasks' work must be gone."""
    shm_before = set(os.listdir(SHM))
    before = stray_processes()
    yield
    deadline = time.monotonic() + 60
    while (left := stray_processes() - before) - idle_ray_workers(left) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert left - idle_ray_workers(left) == set(), f"a test left processes running: {describe(left - idle_ray_workers(left))}"
    assert new_shm_entries(shm_before) == set(), "a test left files in /dev/shm"


def rows_of(source) -> list[tuple]:
    with source:
        return [remote_row(message) for message in source]


def test_four_producers_give_the_local_run():
    source = serve_on_ray(ray_producers.make_loader, producers=4, num_cpus=0.25, timeout=slack(60))
    rows = rows_of(source)
    assert rows == local_run()
    assert len(source.reports) == 4 and sum(report.batches for report in source.reports) == len(rows)
    assert source.next_start == (1, 10)


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
    from hydrax.shards.build import SourceSample

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
    from hydrax.shards.build import BuildError

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
