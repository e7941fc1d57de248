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
