"""The hydrax command."""

import subprocess
import sys

from hydrax import __version__


def hydrax(*args):
    return subprocess.run([sys.executable, "-m", "hydrax.cli", *args], capture_output=True, text=True, timeout=120)


def test_version_and_help():
    assert hydrax("--version").stdout.strip() == f"hydrax {__version__}"
    result = hydrax()
    assert result.returncode == 2 and "info" in result.stdout and "demo" in result.stdout


def test_info_reports_backend_and_start_method():
    result = hydrax("info")
    assert result.returncode == 0, result.stderr
    import jax

    assert f"default backend {jax.default_backend()}" in result.stdout
    assert "workers start by: fork before JAX initialises, forkserver after\n" in result.stdout
    assert "memfd (supported)" in result.stdout
    from hydrax.pinning import cuda_driver_available

    expected = "available (CUDA driver found)" if cuda_driver_available() else "not available"
    assert f"page-locked slots for GPU transfers: {expected}" in result.stdout


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
    result = hydrax("bench", str(tmp_path / "b-*.tar"), "--seconds", "1.5", "--size", "16", "--batch-size", "8", "-q")
    assert result.returncode == 0, result.stderr
    summary = result.stdout.strip().splitlines()[-1]
    for part in ("items/s", "MB/s", "batches/s", "waited", "first batch"):
        assert part in summary
    assert float(summary.split()[1].replace(",", "")) > 0
    result = hydrax("bench", str(tmp_path / "b-*.tar"), "--field", "txt", "--seconds", "1")
    assert result.returncode == 1 and "no image field txt in sample 'k00'" in result.stderr
    result = hydrax("bench", str(tmp_path / "b-*.tar"), "--decode", "bytes", "--seconds", "1", "-q")
    assert result.returncode == 0 and "items/s" in result.stdout
    with ShardWriter(str(tmp_path / "c-%02d.tar"), maxcount=40) as writer:
        for i in range(40):
            buffer = io.BytesIO()
            Image.fromarray(np.full((20, 24, 3), i, np.uint8)).save(buffer, "PNG")
            writer.write({"__key__": f"k{i:02d}", "png": buffer.getvalue() if i != 3 else b"not a png"})
    result = hydrax("bench", str(tmp_path / "c-*.tar"), "--seconds", "1.5", "--size", "16", "--batch-size", "8", "-q")
    assert result.returncode == 0, result.stderr
    lost = result.stdout.strip().splitlines()[-1]
    assert lost.startswith("failed items ") and int(lost.split()[2].rstrip(",")) >= 1 and "dropped batches" in lost


def test_python_m_hydrax_is_the_command():
    result = subprocess.run([sys.executable, "-m", "hydrax", "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "shards" in result.stdout and "bench" in result.stdout
    for command in (["info"], ["demo"], ["bench"], ["shards", "index"]):
        help_text = subprocess.run([sys.executable, "-m", "hydrax", *command, "--help"], capture_output=True, text=True, timeout=60).stdout
        assert "example: hydrax" in help_text, command


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
    result = subprocess.run([sys.executable, "-m", "hydrax", "bench", "s3://data/bench/r-*.tar", "--decode", "bytes", "--seconds", "1.5",
                             "--batch-size", "10", "-q", "--endpoint-url", endpoint], capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("items/s ") and float(result.stdout.split()[1].replace(",", "")) > 0
