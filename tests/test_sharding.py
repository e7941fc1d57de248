"""Global batches over many devices and processes (``Dataloader(sharding=...)``).

Every job runs ``tests/support/global_batches_job.py`` in fresh processes: 8 CPU devices in one process,
or several processes under ``jax.distributed`` on 127.0.0.1. Each process reports every
addressable shard it got; put together, the shards must be the single-process run's batches,
item for item, and every shard must lie in hydrax's shared memory where its block allows.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
from support.timing import slack, slack_int

JOB = Path(__file__).resolve().parent / "support" / "global_batches_job.py"
ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_job(processes: int, devices: int, mesh: str, wall: float = 120, silent: tuple[int, ...] = (), **config) -> list[dict | None]:
    """Run one job of ``processes`` x ``devices``; the report of every process, in process order
    (None for the processes in ``silent``, which are expected to die before reporting). Each
    report gets ``"seconds"``: when it arrived, from the start. ``wall`` (stretched by
    :func:`~support.timing.slack`) bounds the whole job."""
    wall = slack(wall)
    port = _free_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    started = time.monotonic()
    procs = []
    for p in range(processes):
        cfg = dict(config, process_id=p, process_count=processes, devices=devices, port=port, mesh=mesh)
        log = tempfile.TemporaryFile("w+")
        procs.append((subprocess.Popen([sys.executable, str(JOB), json.dumps(cfg)], stdout=subprocess.PIPE, stderr=log,
                                       text=True, env=env, start_new_session=True), log))
    reports = []
    try:
        for p, (proc, log) in enumerate(procs):
            # The report is one line. A process whose peer died may then hang in jax.distributed's
            # shutdown, waiting for that peer: the report is what counts, the process is ended.
            report = None
            for line in proc.stdout:
                if line.startswith("{"):
                    report = json.loads(line)
                    report["seconds"] = time.monotonic() - started
                    break
            if p in silent:
                assert report is None, f"process {p} was expected to die"
            elif report is None:
                proc.wait()
                log.seek(0)
                raise AssertionError(f"process {p} reported nothing (status {proc.returncode}):\n{log.read()[-4000:]}")
            reports.append(report)
    finally:
        for proc, log in procs:
            try:
                proc.wait(timeout=max(1.0, started + wall - time.monotonic()) if not silent else 1.0)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            proc.stdout.close()
            log.close()
    return reports


@functools.lru_cache(maxsize=None)
def _reference(key: str) -> list[dict]:
    config = json.loads(key)
    (report,) = run_job(1, 1, "none", **config)
    assert report["error"] is None, report["error"]
    return report["batches"]


def reference(**config) -> list[dict]:
    """The plain single-process, single-device run of the same job: whole batches."""
    return _reference(json.dumps(config, sort_keys=True))


def assemble(reports: list[dict]) -> list[dict]:
    """The global batches, put together from every process's shards, checked for consistency."""
    counts = {len(r["batches"]) for r in reports}
    assert len(counts) == 1, f"processes got different numbers of batches: {counts}"
    out = []
    for b in range(counts.pop()):
        batches = [r["batches"][b] for r in reports]
        first = batches[0]
        for other in batches[1:]:
            assert {k: other[k] for k in ("kind", "num")} == {k: first[k] for k in ("kind", "num")}, "processes are at different steps"
        arrays = {
            name: {device: (index, np.asarray(values), in_arena)
                   for batch in batches for device, index, values, in_arena in batch["arrays"][name]}
            for name in first["arrays"]
        }
        out.append({"kind": first["kind"], "num": first["num"], "arrays": arrays,
                    "indices": [i for batch in batches for i in batch["indices"]]})
    return out


def check_against(reports: list[dict], expected: list[dict], aliased: bool = True) -> None:
    """Every device shard holds the reference's rows, and lies in the arena when ``aliased``."""
    got = assemble(reports)
    assert [(b["kind"], b["num"]) for b in got] == [(b["kind"], b["num"]) for b in expected]
    for mine, ref in zip(got, expected):
        if not mine["arrays"]["x"].keys() - {0}:  # one device: its process loaded the whole batch
            assert mine["indices"] == ref["indices"]
        assert sorted(set(mine["indices"])) == sorted(ref["indices"])  # every item, by some process
        for name, shards in mine["arrays"].items():
            whole = np.asarray(ref["arrays"][name][0][2])  # the reference has one device: the whole batch
            covered = np.zeros(whole.shape[0], bool)
            for device, (index, values, in_arena) in shards.items():
                window = tuple(slice(*s) for s in index)
                np.testing.assert_array_equal(values, whole[window], err_msg=f"{name} on device {device}, batch {mine['num']}")
                covered[window[0]] = True
                if aliased:
                    assert in_arena, f"{name} on device {device} was copied, batch {mine['num']}"
            assert covered.all(), f"{name}: rows without a device"


JOB_CONFIG = dict(batch_size=16, items=72, end_at=["epoch", 2], validation=["batch", 3])


@pytest.mark.parametrize("processes,devices", [pytest.param(1, 8, marks=pytest.mark.slow), pytest.param(2, 4, marks=pytest.mark.multiprocess),
                                               pytest.param(4, 2, marks=pytest.mark.multiprocess)])
def test_global_batches_equal_the_single_process_run(processes, devices):
    reports = run_job(processes, devices, "data", **JOB_CONFIG)
    assert all(r["error"] is None for r in reports), [r["error"] for r in reports]
    check_against(reports, reference(**JOB_CONFIG))
    for r in reports:
        assert r["stats"]["copied_batches"] == 0 and r["stats"]["aliased_batches"] == len(r["batches"])
    # seeds are those of the items' global positions, whatever the process
    ref = {b["num"]: b for b in reference(**JOB_CONFIG) if b["kind"] == "T"}
    for r in reports:
        for b in r["batches"]:
            if b["kind"] == "T":
                expected = dict(zip(ref[b["num"]]["indices"], ref[b["num"]]["seeds"]))
                assert [expected[i] for i in b["indices"]] == b["seeds"]


@pytest.mark.multiprocess
@pytest.mark.parametrize("mesh", ["interleaved", "2d", "replicated"])
def test_any_mesh_gives_the_same_global_batches(mesh):
    reports = run_job(2, 4, mesh, **JOB_CONFIG)
    assert all(r["error"] is None for r in reports), [r["error"] for r in reports]
    check_against(reports, reference(**JOB_CONFIG))
    if mesh == "interleaved":
        # each process loads non-adjacent blocks of every batch
        first = reports[0]["batches"][0]["indices"]
        assert first != sorted(first) or first[-1] - first[0] >= len(first)


@pytest.mark.multiprocess
def test_a_placement_func_may_return_global_arrays():
    # hydrax 0.2.2 refused them (shape check) and dropped every batch: 0 batches, status 0
    reports = run_job(2, 4, "process_local", **JOB_CONFIG)
    assert all(r["error"] is None for r in reports), [r["error"] for r in reports]
    check_against(reports, reference(**JOB_CONFIG), aliased=False)
    assert all(r["stats"]["custom_batches"] == len(r["batches"]) > 0 for r in reports)


@pytest.mark.slow
def test_split_item_dimensions_are_copied_but_right():
    reports = run_job(1, 8, "items", **JOB_CONFIG)
    assert reports[0]["error"] is None
    check_against(reports, reference(**JOB_CONFIG), aliased=False)
    assert reports[0]["stats"]["aliased_batches"] == 0


@pytest.mark.slow
def test_a_loop_that_keeps_its_batches_gets_copies_instead_of_a_stall():
    config = dict(JOB_CONFIG, keep=True, timeout=slack_int(20))
    reports = run_job(1, 8, "data", **config)
    assert reports[0]["error"] is None, reports[0]["error"]
    check_against(reports, reference(**JOB_CONFIG), aliased=False)
    stats = reports[0]["stats"]
    assert stats["copied_batches"] > 0 and stats["aliased_batches"] >= 1


@pytest.mark.slow
def test_batch_sizes_that_do_not_divide_over_the_devices_are_refused():
    (report,) = run_job(1, 8, "data", batch_size=12, items=48, expect_error=True)
    assert report["error"]["type"] == "ValueError"
    assert "training group 0" in report["error"]["message"] and "multiple of 8" in report["error"]["message"]


@pytest.mark.parametrize("processes", [pytest.param(1, marks=pytest.mark.slow), pytest.param(2, marks=pytest.mark.multiprocess)])
def test_a_loader_error_raises_on_every_process_at_the_same_batch(processes):
    failing = processes - 1
    # item 40 sits in batch 2 of epoch 0; the failing process loads it (data blocks of 16 / P)
    reports = run_job(processes, 8 // processes, "data", **dict(JOB_CONFIG, fail_item=40, fail_process=failing))
    for r in reports:
        assert r["error"] is not None and r["error"]["type"] == "BatchFailedError", r["error"]
        assert r["error"]["process"] == failing and r["error"]["batch"] == "batch 2 (epoch 0)"
        assert [b["num"] for b in r["batches"] if b["kind"] == "T"] == [0, 1]


@pytest.mark.multiprocess
def test_a_process_that_dies_stops_the_others_within_the_timeout():
    # the timeout must not fire before process 1 dies, on a busy machine too; then the survivor
    # stops by it (its report says so), long before the bound below, which scales alike
    reports = run_job(2, 4, "data", wall=60, silent=(1,), **dict(JOB_CONFIG, die_process=1, timeout=slack_int(4)))
    survivor = reports[0]
    assert survivor["seconds"] < slack(40)
    assert survivor["error"] is not None and survivor["error"]["type"] == "BatchTimeoutError"
    assert "process 1 has loaded only" in survivor["error"]["message"]


@pytest.mark.multiprocess
@pytest.mark.parametrize("before,after", [(1, 2), (2, 1), (2, 4)])
def test_resume_with_another_process_count_is_exact(before, after):
    uninterrupted = reference(**JOB_CONFIG)
    bpe = 72 // 16
    stop = bpe + 2  # mid-epoch 1, on a batch-mode validation boundary (interval 3)
    first = run_job(before, 8 // before, "data", **dict(JOB_CONFIG, end_at=["batch", stop]))
    second = run_job(after, 8 // after, "data", **dict(JOB_CONFIG, start_at=[0, stop]))
    for reports in (first, second):
        assert all(r["error"] is None for r in reports), [r["error"] for r in reports]
    combined = assemble(first) + assemble(second)
    expected = [(b["kind"], b["num"]) for b in uninterrupted]
    # validation numbering restarts in a new run; the runs' validation batches are those of the whole run
    assert [(b["kind"], b["num"]) for b in combined] == expected
    check_against(first, uninterrupted[: len(assemble(first))])
    check_against(second, uninterrupted[len(assemble(first)) :])


def test_several_processes_refuse_non_deterministic_delivery():
    from hydrax import Dataloader, DataGroup

    group = DataGroup(4, list(range(8)), loader_arrays={"x": ((), np.float32, np.float32)})
    with pytest.raises(ValueError, match="deterministic=False cannot be used with 2 processes"):
        Dataloader(print, group, process_index=0, process_count=2, deterministic=False)


# -- in this process, on its one CPU device ------------------------------------------------------


def _one_device_sharding():
    import jax
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    return NamedSharding(Mesh(np.array(jax.devices()[:1]), ("data",)), P("data"))


@pytest.mark.parametrize("route", ["internal", "public"])
def test_placement_aliases_the_slot_by_either_route(route, monkeypatch):
    import jax.numpy as jnp

    from hydrax.run import placement
    from hydrax.layout import slot_layout
    from hydrax.run.sharding import plan_group

    if route == "public":
        monkeypatch.setattr(placement, "_batched_put", False)
    specs = {"x": ((3,), np.float32, jnp.float32), "y": ((), np.int32, jnp.int32)}
    plan = plan_group({"x": _one_device_sharding(), "y": _one_device_sharding()}, 8, {"x": (3,), "y": ()}, "training group 0")
    assert plan.ranges == ((0, 8),) and plan.block_rows == (8,)
    layout = slot_layout(plan.block_rows, specs, plan.device_starts)
    raw = np.zeros(layout.size + 64, np.uint8)
    slot = raw[-raw.ctypes.data % 64 :][: layout.size]
    x = slot[layout.block_offsets["x"][0] :][: 8 * 12].view(np.float32).reshape(8, 3)
    x[...] = np.arange(24).reshape(8, 3)
    arrays, aliased = placement.sharded_placement(slot, layout, plan, cpu=True, may_alias=True)
    assert aliased
    np.testing.assert_array_equal(np.asarray(arrays["x"]), x)
    assert arrays["x"].addressable_shards[0].data.unsafe_buffer_pointer() == x.ctypes.data
    copies, aliased = placement.sharded_placement(slot, layout, plan, cpu=True, may_alias=False)
    assert not aliased and copies["x"].addressable_shards[0].data.unsafe_buffer_pointer() != x.ctypes.data
    np.testing.assert_array_equal(np.asarray(copies["x"]), x)


def test_a_sharding_must_name_every_array_and_excludes_placement_func():
    import jax.numpy as jnp

    from hydrax import Dataloader, DataGroup

    group = DataGroup(4, list(range(8)), loader_arrays={"x": ((), np.float32, jnp.float32), "y": ((), np.int32, jnp.int32)})
    with pytest.raises(ValueError, match=r"sharding must name every loader array of training group 0: missing \['y'\]"):
        Dataloader(print, group, sharding={"x": _one_device_sharding()})
    with pytest.raises(ValueError, match="not both"):
        Dataloader(print, group, sharding=_one_device_sharding(), placement_func=lambda *a: {})
    with pytest.raises(TypeError, match="jax.sharding.Sharding"):
        Dataloader(print, group, sharding="data")
