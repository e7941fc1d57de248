"""The examples in ``examples/``, run as their README says: each in its ``--tiny`` mode, as a real
subprocess (``python examples/...``), checking the exit status and what it prints. The two that
make their own photos make them in the test's temporary folder (``--data``).

The classifier is also killed with SIGKILL after its first checkpoint and run again: it must end
with the parameters of an uninterrupted run, bit for bit. Each run starts JAX, Flax and Orbax
afresh (about 3 s of imports on two cores), so these tests are ``slow``: ``make test-all`` runs
them, ``make test`` does not.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.timing import slack

ROOT = Path(__file__).resolve().parents[1]
CLASSIFIER = ROOT / "examples" / "flax_classifier.py"
MIXTURE = ROOT / "examples" / "mixture.py"
TRAINER = ROOT / "examples" / "serving" / "trainer.py"
BUCKETS = ROOT / "examples" / "buckets.py"
RESIZED = ROOT / "examples" / "random_resized_crop.py"
#: The classifier's --tiny run: checkpoints at these steps.
TINY_STEPS, TINY_EVERY = 24, 6
DIGEST = re.compile(r"^\[classifier\] digest ([0-9a-f]{64})$", re.MULTILINE)

pytestmark = pytest.mark.slow
pytest.importorskip("PIL")  # hydrax.image, which every example's loader uses


def needs_training_libraries(*modules: str) -> None:
    for module in modules or ("flax", "optax", "orbax.checkpoint"):
        pytest.importorskip(module)


def environment(**extra: str) -> dict[str, str]:
    # The CPU backend everywhere: bit-identical resumes rely on deterministic XLA:CPU reductions,
    # and forced host devices exist only there.
    env = dict(os.environ, JAX_PLATFORMS="cpu", **extra)
    if "XLA_FLAGS" not in extra:
        env.pop("XLA_FLAGS", None)
    return env


def start(script: Path, *args: str, log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """``python SCRIPT ARGS`` from the repository root, in a session of its own (so that it and
    every process it starts can be killed together), its output (both streams) into ``log``."""
    with open(log, "w") as out:
        return subprocess.Popen([sys.executable, str(script), *args], cwd=ROOT, env=env or environment(), stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)


def finish(proc: subprocess.Popen, log: Path, timeout: float) -> str:
    """What the example printed, once it has exited with status 0."""
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise AssertionError(f"{proc.args} did not end within {timeout:.0f} s:\n{log.read_text()[-4000:]}") from None
    output = log.read_text()
    assert proc.returncode == 0, f"{proc.args} exited with status {proc.returncode}:\n{output[-4000:]}"
    return output


def run(script: Path, *args: str, log: Path, env: dict[str, str] | None = None) -> str:
    return finish(start(script, *args, log=log, env=env), log, slack(240))


def digest_of(output: str) -> str:
    found = DIGEST.findall(output)
    assert len(found) == 1, output[-2000:]
    return found[0]


def checkpoints(directory: Path) -> list[int]:
    """The complete checkpoints' steps (Orbax renames a step's folder to its number when done)."""
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit()) if directory.exists() else []


def test_the_classifier_resumes_after_a_kill_with_the_parameters_of_an_uninterrupted_run(tmp_path):
    needs_training_libraries()
    full = start(CLASSIFIER, "--tiny", "--checkpoint-dir", str(tmp_path / "full"), log=tmp_path / "full.log")
    try:
        killed = start(CLASSIFIER, "--tiny", "--checkpoint-dir", str(tmp_path / "run"), log=tmp_path / "killed.log")
        deadline = time.monotonic() + slack(240)
        try:
            while killed.poll() is None and not checkpoints(tmp_path / "run") and time.monotonic() < deadline:
                time.sleep(0.01)
        finally:
            os.killpg(killed.pid, signal.SIGKILL)  # the run, its loader processes and fork server
            killed.wait()
        output = (tmp_path / "killed.log").read_text()
        assert killed.returncode == -signal.SIGKILL, f"the run ended before it was killed (status {killed.returncode}):\n{output[-4000:]}"
        saved = checkpoints(tmp_path / "run")
        assert saved and max(saved) < TINY_STEPS, f"checkpoints {saved}: the kill came {'before' if not saved else 'after'} the run's"
        reference = finish(full, tmp_path / "full.log", slack(240))
    finally:
        if full.poll() is None:
            os.killpg(full.pid, signal.SIGKILL)
            full.wait()

    for step in range(TINY_EVERY, TINY_STEPS + 1, TINY_EVERY):
        assert re.search(rf"^\[classifier\] step {step}: loss \d+\.\d+ \(checkpoint saved\)$", reference, re.MULTILINE), reference
    assert "1 device(s), global batch 16" in reference and "resumed" not in reference

    resumed = run(CLASSIFIER, "--tiny", "--checkpoint-dir", str(tmp_path / "run"), log=tmp_path / "resumed.log")
    assert f"[classifier] resumed from the checkpoint of step {max(saved)} in " in resumed, resumed
    assert f"steps {max(saved)} to {TINY_STEPS}" in resumed
    assert digest_of(resumed) == digest_of(reference)
    assert checkpoints(tmp_path / "run")[-1] == TINY_STEPS


def test_the_classifier_splits_its_batches_over_eight_devices(tmp_path):
    needs_training_libraries()
    env = environment(XLA_FLAGS="--xla_force_host_platform_device_count=8")
    output = run(CLASSIFIER, "--tiny", "--checkpoint-dir", str(tmp_path / "ckpt"), log=tmp_path / "run.log", env=env)
    assert "8 device(s), global batch 16" in output, output
    assert f"[classifier] step {TINY_STEPS}: loss " in output
    digest_of(output)
    assert checkpoints(tmp_path / "ckpt")[-1] == TINY_STEPS


@pytest.mark.parametrize("batching", ["random", "stratified"])
def test_the_mixture_example_reports_each_sources_share_and_resumes_exactly(tmp_path, batching):
    output = run(MIXTURE, "--tiny", "--batching", batching, log=tmp_path / "run.log")
    shares = {int(source): (float(share), int(low), int(high)) for source, share, low, high in re.findall(
        r"^\[mixture\] source (\d) \(.*\): (\d+\.\d)% of 240 items \(weight \d+\.\d%\); (\d+)-(\d+) per batch$", output, re.MULTILINE)}
    assert sorted(shares) == [0, 1, 2], output
    if batching == "stratified":  # 20 items a batch: exactly 14, 4 and 2 of each source, every batch
        assert shares == {0: (70.0, 14, 14), 1: (20.0, 4, 4), 2: (10.0, 2, 2)}
    else:  # shuffled across batches: about the weights over 12 batches, varying from batch to batch
        assert all(abs(shares[s][0] - weight) <= 5 for s, weight in enumerate((70, 20, 10))), shares
    assert f"batching='{batching}'" in output
    assert "[mixture] resumed at epoch 0, batch 6: the 6 batches after it are identical to the first run's: True" in output


def test_the_serving_example_trains_on_batches_from_two_producers(tmp_path):
    pytest.importorskip("optax")
    output = run(TRAINER, "--tiny", log=tmp_path / "run.log")
    assert re.search(r"^\[trainer\] receiving on zpull://127\.0\.0\.1:\d+ from 2 producer\(s\)$", output, re.MULTILINE), output
    assert sorted(re.findall(r"^\[producer (\d)/2\] served 10 batches", output, re.MULTILINE)) == ["0", "1"], output
    assert "[trainer] trained on 20 batches in " in output
    assert "[trainer] every batch once, in order: True; producers failed: 0" in output
    assert re.search(r"^\[trainer\] digest [0-9a-f]{64}$", output, re.MULTILINE)


def test_the_buckets_example_trains_over_eight_devices_on_every_batch_of_every_bucket(tmp_path):
    needs_training_libraries("flax", "optax")
    env = environment(XLA_FLAGS="--xla_force_host_platform_device_count=8")
    output = run(BUCKETS, "--tiny", "--data", str(tmp_path / "photos"), log=tmp_path / "run.log", env=env)
    assert f"[buckets] wrote 400 photos into {tmp_path / 'photos'} in " in output, output
    assert re.search(r"^\[buckets\] 400 photos in 8 shards, \d+ sizes; 8 device\(s\), 1 loader process\(es\), 2 epochs; "
                     r"the plan:$", output, re.MULTILINE), output
    # the plan's table: slot width x height, aspect, batch size, images, whole batches per epoch
    table = [(int(w), int(h), int(batch), int(batches)) for w, h, batch, batches in re.findall(
        r"^ +(\d+)x(\d+) +\d\.\d{3} +(\d+) +[\d,]+ +(\d+) ", output, re.MULTILINE)]
    assert len(table) >= 3 and len({w * 1000 // h for w, h, _, _ in table}) == len(table), output
    # batches split over 8 devices: every bucket's batch size is a multiple of 8
    assert all(batch % 8 == 0 for _, _, batch, _ in table), table
    # every batch of every bucket, in each of the two epochs, each a global array of the bucket's shape
    delivered = [tuple(map(int, found)) for found in re.findall(
        r"^\[buckets\] bucket (\d+)x(\d+): (\d+) batches \((\d+) per epoch\) of shape \((\d+), (\d+), (\d+), 3\)$",
        output, re.MULTILINE)]
    assert [(w, h, batch, per_epoch) for w, h, _, per_epoch, batch, _, _ in delivered] == table, output
    assert all((height, width) == (h, w) for w, h, _, _, _, height, width in delivered), delivered
    assert all(count == 2 * per_epoch for _, _, count, per_epoch, _, _, _ in delivered), delivered
    # one compilation per bucket, of its (batch, height, width, 3) shape
    compiled = re.search(r"^\[buckets\] the train step was compiled for (\d+) batch shapes .*: (.*)$", output, re.MULTILINE)
    shapes = sorted(tuple(map(int, shape)) for shape in re.findall(r"\((\d+), (\d+), (\d+), 3\)", compiled.group(2)))
    assert int(compiled.group(1)) == len(shapes) == len(table)
    assert shapes == sorted((batch, h, w) for w, h, batch, _ in table)
    losses = [float(loss) for loss in re.findall(r"^\[buckets\] epoch \d: mean loss (\d+\.\d+), tags right ", output, re.MULTILINE)]
    assert len(losses) == 2 and losses[1] < losses[0], output
    assert re.search(r"^\[buckets\] digest [0-9a-f]{64}$", output, re.MULTILINE)


def test_the_random_resized_crop_example_learns_its_classes_well_above_chance(tmp_path):
    needs_training_libraries("flax", "optax")
    output = run(RESIZED, "--tiny", "--data", str(tmp_path / "photos"), log=tmp_path / "run.log")
    assert f"[rrc] wrote 320 photos into {tmp_path / 'photos'} in " in output, output
    assert ("[rrc] 256 training and 64 validation photos, 160-320 px a side, 6 classes; training: random resized crops to "
            "64x64, validation: shorter side 73, centre 64x64; 1 device(s), global batch 16") in output, output
    epochs = re.findall(r"^\[rrc\] epoch (\d): training loss (\d+\.\d+), validation accuracy (\d+\.\d)%$", output, re.MULTILINE)
    assert [int(epoch) for epoch, _, _ in epochs] == [0, 1, 2, 3, 4], output
    losses, accuracies = [float(e[1]) for e in epochs], [float(e[2]) for e in epochs]
    # 6 classes: chance is 16.7%; here about 80% after the fifth epoch (on 64 photos, steps of 1.6%)
    assert losses[-1] < losses[0] / 2 and accuracies[-1] >= 50, epochs
    assert "[rrc] trained 80 steps in " in output
    assert re.search(r"^\[rrc\] digest [0-9a-f]{64}$", output, re.MULTILINE)
