"""Agreement between the processes of a run, through jax.distributed on 127.0.0.1."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from support.timing import slack

from hydrax.run.hosts import distributed_client, jax_process_split

JOB = Path(__file__).resolve().parent / "support" / "agreement_job.py"
ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.multiprocess


def run(scenario: str) -> list[dict]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
    procs = [subprocess.Popen([sys.executable, str(JOB), str(p), str(port), scenario], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for p in range(2)]
    reports = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=slack(120))
            lines = [line for line in out.splitlines() if line.startswith("{")]
            assert lines, f"no report (status {proc.returncode}):\n{err[-3000:]}"
            reports.append(json.loads(lines[-1]))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return reports


def test_without_jax_distributed_there_is_one_process_and_no_client():
    assert jax_process_split() == (0, 1) and distributed_client() is None


def test_processes_that_keep_up_hand_out_every_batch():
    first, second = run("agree")
    assert first == {"split": [0, 2], "results": ["ok"] * 4} and second == {"split": [1, 2], "results": ["ok"] * 4}


def test_a_failure_on_one_process_stops_the_other_at_that_batch():
    first, second = run("fail")
    assert first["results"][:2] == ["ok", "ok"] and len(first["results"]) == 3
    assert first["results"][2].startswith("BatchFailedError: process 1 could not deliver batch 2 (epoch 0): ValueError: broken item")
    assert first["results"][2].endswith("[1, batch 2 (epoch 0)]") and second["results"] == ["ok", "ok"]


def test_processes_that_hand_a_batch_out_in_different_forms_stop_there():
    first, second = run("forms")
    for report in (first, second):
        assert report["results"][0] == "ok" and report["results"][1].startswith("BatchFailedError: the processes disagree on batch 1")


def test_a_process_that_falls_silent_is_a_timeout_naming_it():
    first, _ = run("silent")
    assert first["results"][0] == "ok"
    assert first["results"][1].startswith("BatchTimeoutError: batch 1 (epoch 0) is loaded here (process 0), but after 3 s "
                                          "process 1 has loaded only 1 batches")
