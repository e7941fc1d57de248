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


def test_demo_trains_and_resumes_exactly():
    result = hydrax("demo")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "identical to the first run: True" in result.stdout and "[demo] OK" in result.stdout


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
