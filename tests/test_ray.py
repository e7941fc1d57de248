"""hydrax.ray: producers as actors of a real local Ray instance, one trainer.

Every run is compared with the same run loaded locally (tests/support/serve_share_job.py):
the same batches, in the same order, with the same numbers, items and seeds.
"""

from __future__ import annotations

import functools
import os
import resource
import time
from pathlib import Path

import pytest

from hydrax.errors import ServeError
from support import ray_producers
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
