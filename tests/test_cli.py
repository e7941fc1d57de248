"""The hydrax command."""

import re
import subprocess
import sys

import pytest
from support.timing import slack

from hydrax import __version__


def hydrax(*args):
    return subprocess.run([sys.executable, "-m", "hydrax.cli", *args], capture_output=True, text=True, timeout=slack(120))


def seconds(at_least: float) -> str:
    """A ``--seconds`` for a run that must see batches: ``at_least`` on an idle machine, longer on a
    busy one, where the first batches take longer to come (bench ends with "no batch came" then)."""
    return f"{slack(at_least):.1f}"


def test_version_and_help():
    assert hydrax("--version").stdout.strip() == f"hydrax {__version__}"
    result = hydrax()
    assert result.returncode == 2 and "info" in result.stdout and "demo" in result.stdout


@pytest.mark.slow
def test_info_reports_backend_and_start_method():
    result = hydrax("info")
    assert result.returncode == 0, result.stderr
    import jax

    assert f"default backend {jax.default_backend()}" in result.stdout
    assert "workers start by: fork before JAX initialises, forkserver after\n" in result.stdout
    assert "memfd (supported)" in result.stdout
    from hydrax.procs.pinning import cuda_driver_available

    expected = "available (CUDA driver found)" if cuda_driver_available() else "not available"
    assert f"page-locked slots for GPU transfers: {expected}" in result.stdout


@pytest.mark.slow
def test_demo_trains_on_the_bundled_digits_and_resumes_exactly():
    result = hydrax("demo", "--epochs", "6")
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    accuracies = [float(line.rsplit(" ", 1)[1].rstrip("%")) for line in lines if line.startswith("[demo] epoch ")]
    assert len(accuracies) == 6 and accuracies[-1] >= 95.0
    assert "bit-identical to the uninterrupted run: True" in result.stdout and "[demo] OK" in result.stdout
    assert "items/s" in result.stdout


def test_shards_index_builds_indexes_ahead_of_time(tmp_path):
    from hydrax.shards import ShardWriter, index_path, open_index

    with ShardWriter(str(tmp_path / "t-%02d.tar"), maxcount=5, index=False) as writer:
        for i in range(12):
            writer.write({"__key__": f"k{i:02d}", "txt": f"{i}"})
    result = hydrax("shards", "index", str(tmp_path / "t-{00..02}.tar"))
    assert result.returncode == 0, result.stderr
    assert "indexed 3 of 3 shards (12 samples newly indexed)" in result.stdout
    assert [len(open_index(p)) for p in writer.paths] == [5, 5, 2]
    assert all((tmp_path / f"t-{n:02d}.tar.hidx").exists() for n in range(3)) and index_path(writer.paths[0])
    (tmp_path / "t-01.tar").write_bytes(b"\0" * 100)  # now broken
    result = hydrax("shards", "index", "--force", "-q", str(tmp_path / "t-*.tar"))
    assert result.returncode == 1 and "t-01.tar: at byte offset 0" in result.stderr


@pytest.mark.slow
def test_bench_measures_a_loader_over_shards(tmp_path):
    import io

    import numpy as np
    from PIL import Image

    from hydrax.shards import ShardWriter

    with ShardWriter(str(tmp_path / "b-%02d.tar"), maxcount=20) as writer:
        for i in range(40):
            buffer = io.BytesIO()
            Image.fromarray(np.full((20, 24, 3), i * 6, np.uint8)).save(buffer, "PNG")
            writer.write({"__key__": f"k{i:02d}", "png": buffer.getvalue(), "cls": str(i % 4)})
    result = hydrax("bench", str(tmp_path / "b-*.tar"), "--seconds", seconds(1.5), "--size", "16", "--batch-size", "8", "-q")
    assert result.returncode == 0, result.stderr
    summary = result.stdout.strip().splitlines()[-1]
    for part in ("items/s", "MB/s", "batches/s", "waited", "first batch"):
        assert part in summary
    assert float(summary.split()[1].replace(",", "")) > 0
    result = hydrax("bench", str(tmp_path / "b-*.tar"), "--field", "txt", "--seconds", "1")
    assert result.returncode == 1 and "no image field txt in sample 'k00'" in result.stderr
    result = hydrax("bench", str(tmp_path / "b-*.tar"), "--decode", "bytes", "--seconds", seconds(1), "-q")
    assert result.returncode == 0 and "items/s" in result.stdout
    with ShardWriter(str(tmp_path / "c-%02d.tar"), maxcount=40) as writer:
        for i in range(40):
            buffer = io.BytesIO()
            Image.fromarray(np.full((20, 24, 3), i, np.uint8)).save(buffer, "PNG")
            writer.write({"__key__": f"k{i:02d}", "png": buffer.getvalue() if i != 3 else b"not a png"})
    result = hydrax("bench", str(tmp_path / "c-*.tar"), "--seconds", seconds(1.5), "--size", "16", "--batch-size", "8", "-q")
    assert result.returncode == 0, result.stderr
    lost = result.stdout.strip().splitlines()[-1]
    # a longer run (--seconds grows on a busy machine) fails the bad item more often: "1,312"
    assert lost.startswith("failed items ") and int(lost.split()[2].rstrip(",").replace(",", "")) >= 1 and "dropped batches" in lost


@pytest.mark.parametrize("args, flag", [
    (("bench", "x.tar", "--size", "0"), "--size"),
    (("bench", "x.tar", "--workers", "0"), "--workers"),
    (("bench", "x.tar", "--batch-size", "-3"), "--batch-size"),
    (("bench", "x.tar", "--seconds", "0"), "--seconds"),
    (("serve", "x.tar", "--depth", "0"), "--depth"),
    (("demo", "--workers", "0"), "--workers"),
    (("shards", "build", "x", "o-%d.tar", "--workers", "0"), "--workers"),
])
def test_counts_and_sizes_below_one_are_usage_errors_naming_the_flag(args, flag):
    """--size 0 was a traceback and --workers 0 a run-time failure, both exit 1."""
    result = hydrax(*args)
    assert result.returncode == 2, result.stderr
    assert f"argument {flag}: not a positive" in result.stderr and "Traceback" not in result.stderr


def test_python_m_hydrax_is_the_command():
    result = subprocess.run([sys.executable, "-m", "hydrax", "--help"], capture_output=True, text=True, timeout=slack(60))
    assert result.returncode == 0 and "shards" in result.stdout and "bench" in result.stdout
    for command in (["info"], ["demo"], ["bench"], ["shards", "index"]):
        help_text = subprocess.run([sys.executable, "-m", "hydrax", *command, "--help"], capture_output=True, text=True, timeout=slack(60)).stdout
        assert "example: hydrax" in help_text, command


@pytest.mark.slow
def test_bench_reads_shards_from_s3(s3_store, tmp_path):
    import os

    from hydrax.shards import ShardWriter

    endpoint, client = s3_store
    with ShardWriter(str(tmp_path / "r-%02d.tar"), maxcount=50) as writer:
        for i in range(100):
            writer.write({"__key__": f"k{i:03d}", "bin": bytes([i]) * 100, "cls": str(i % 3)})
    for path in writer.paths:
        client.upload_file(path, "data", f"bench/{os.path.basename(path)}")
    env = dict(os.environ, AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1",
               HYDRAX_CACHE=str(tmp_path / "cache"))
    result = subprocess.run([sys.executable, "-m", "hydrax", "bench", "s3://data/bench/r-*.tar", "--decode", "bytes", "--seconds", seconds(1.5),
                             "--batch-size", "10", "-q", "--endpoint-url", endpoint], capture_output=True, text=True, timeout=slack(120), env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("items/s ") and float(result.stdout.split()[1].replace(",", "")) > 0


def _image_folder(root, count=24):
    """An image folder of two classes whose files alternate between PNG and JPEG (x000.png,
    x001.jpg, ...), as photos collected from several sources are."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(4)
    for label in ("a", "b"):
        (root / label).mkdir(parents=True)
        for i in range(count):
            image = Image.fromarray(rng.integers(0, 256, (30, 40, 3), np.uint8))
            image.save(root / label / f"x{i:03d}.{'jpg' if i % 2 else 'png'}")
    return root


@pytest.mark.slow
def test_bench_decodes_each_samples_own_image_field(tmp_path):
    import time

    built = hydrax("shards", "build", str(_image_folder(tmp_path / "photos")), str(tmp_path / "mixed-%02d.tar"), "--maxcount", "30", "-q")
    assert built.returncode == 0, built.stderr
    shards = str(tmp_path / "mixed-*.tar")
    result = hydrax("bench", shards, "--seconds", seconds(1.5), "--size", "16", "--batch-size", "8", "--shuffle", "itemwise")
    assert result.returncode == 0, result.stderr
    assert "decoding each sample's image field into 16x16" in result.stdout
    summary = result.stdout.strip().splitlines()[-1]
    assert summary.startswith("items/s ") and float(summary.split()[1].replace(",", "")) > 0
    assert "failed items" not in result.stdout and "has no field" not in result.stderr and "Traceback" not in result.stderr
    # --field: every sample must have it; the first JPEG sample ends the run, named with its fields,
    # well before --seconds would (both stretched alike on a busy machine)
    started = time.monotonic()
    result = hydrax("bench", shards, "--field", "png", "--seconds", seconds(20), "--size", "16", "--batch-size", "8", "--shuffle", "none", "-q")
    assert result.returncode == 1 and time.monotonic() - started < slack(15), result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("hydrax bench: ") and "has no field 'png' (it has ['cls', 'jpg', 'label'])" in last, result.stderr
    assert re.search(r"sample 'a/x0\d\d' has no field", last) and "--field png" in last
    # a field the first sample lacks is refused before the run starts
    result = hydrax("bench", shards, "--field", "jpg", "--seconds", "1")
    assert result.returncode == 1 and "no image field jpg in sample 'a/x000'" in result.stderr
    assert "(it has ['cls', 'label', 'png'])" in result.stderr


def _slow_png(side):
    """A ``side`` x ``side`` RGB PNG of one colour: small, but inflating it takes a second or so."""
    import struct
    import zlib

    def chunk(kind, body):
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    rows = (b"\x00" + bytes([10, 200, 30]) * side) * side
    header = struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows, 6)) + chunk(b"IEND", b"")


@pytest.mark.slow
def test_bench_seconds_bound_a_run_whose_batches_keep_failing(tmp_path):
    """Every item is a large PNG cut short: each fails after a second or so of decoding, so no
    batch ever comes. --seconds ends the run all the same (it used to go on until ten batches in a
    row had failed, about 12 s here, or until the 20 s timeout), with status 1 and what was lost."""
    import os
    import time

    import numpy as np

    from hydrax.image import decode_into
    from hydrax.shards import ShardWriter

    truncated = _slow_png(9000)[:-1000]
    with ShardWriter(str(tmp_path / "slow-%02d.tar"), maxcount=100) as writer:
        for i in range(40):
            writer.write({"__key__": f"k{i:02d}", "png": truncated})
    # --seconds must see some items fail (the message counts them) but fewer than ten batches in a
    # row (max_consecutive_failures would end the run first): about four items' time, as this
    # machine decodes one now, whatever its speed. The quickest of three: one decode slowed by
    # another job (a CI run once timed 2.9 s where the worker then took 1.1 s an item) would
    # give a limit that ten failures beat.
    took = []
    for _ in range(3):
        started = time.monotonic()
        with pytest.raises(ValueError, match="truncated"):
            decode_into(truncated, np.zeros((16, 16, 3), np.uint8))
        took.append(time.monotonic() - started)
    limit = f"{max(1.0, 4 * min(took)):.1f}"
    process = subprocess.Popen([sys.executable, "-m", "hydrax", "bench", str(tmp_path / "slow-00.tar"), "--seconds", limit,
                                "--workers", "1", "--batch-size", "1", "--size", "16", "--shuffle", "none"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    try:
        header = process.stdout.readline()  # printed just before the loader starts
        started = time.monotonic()
        out, err = process.communicate(timeout=slack(120))
        took = time.monotonic() - started
    finally:
        process.kill()
    assert header.startswith("40 samples in 1 shards"), header + err
    assert process.returncode == 1, out + err
    # The words say that --seconds ended it, not ten failed batches in a row or the batch timeout;
    # the time, that the end did not wait for those either (the stop takes well under 3.5 s idle).
    last = err.strip().splitlines()[-1]
    assert re.fullmatch(rf"hydrax bench: no batch came in {re.escape(f'{float(limit):g}')} s: failed items [1-9]\d*, "
                        r"dropped batches [1-9]\d* \(their errors are above\)", last), err
    assert took < float(limit) + slack(3.5), f"the run took {took:.1f} s after the loader started, for --seconds {limit}"


def _descendants(pid):
    """The pids of the processes below ``pid``, with their parent's pid, from /proc."""
    import os

    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    parents[int(entry)] = int(stat.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                pass
    found, frontier = {}, [pid]
    while frontier:
        parent = frontier.pop()
        for child, ppid in parents.items():
            if ppid == parent and child not in found:
                found[child] = ppid
                frontier.append(child)
    return found


@pytest.mark.slow
def test_bench_reports_a_dead_worker_and_exits_1(tmp_path):
    """A loader process killed mid-run ends bench with the WorkerError's words and status 1 (it
    printed "interrupted" and exited 130, as for a Ctrl+C, since WorkerError is a KeyboardInterrupt)."""
    import os
    import signal
    import time

    assert hydrax("shards", "build", str(_image_folder(tmp_path / "photos")), str(tmp_path / "w-%02d.tar"), "-q").returncode == 0
    # the kill must end the run long before --seconds would: both scale alike with a busy machine
    process = subprocess.Popen([sys.executable, "-m", "hydrax", "bench", str(tmp_path / "w-*.tar"), "--seconds", seconds(60),
                                "--batch-size", "4", "--size", "16"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    try:
        assert "samples in 1 shards" in process.stdout.readline()
        workers = []
        deadline = time.monotonic() + slack(30)
        while len(workers) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
            workers = []
            for pid, ppid in _descendants(process.pid).items():
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        helper = ppid == process.pid and b"multiprocessing" in f.read()  # resource tracker, fork server
                except OSError:
                    continue
                if not helper:
                    workers.append(pid)
        assert len(workers) == 2, workers
        time.sleep(1.0)  # measuring now
        os.kill(workers[0], signal.SIGKILL)
        killed = time.monotonic()
        out, err = process.communicate(timeout=slack(120))
        took = time.monotonic() - killed
    finally:
        process.kill()
    assert process.returncode == 1, out + err
    assert took < slack(10), took  # the process sentinel fires at once; not the end of --seconds
    last = err.strip().splitlines()[-1]
    assert last.startswith("hydrax bench: loader process hydrax-loader-") and f"(pid {workers[0]}) was killed by SIGKILL" in last, err
    assert "interrupted" not in err
