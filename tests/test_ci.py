"""What CI (``.ci/run``) enforces besides the tests: lint, and no test skipped for a missing package."""

import os
import subprocess
import sys
from pathlib import Path

from support.timing import slack

TESTS = Path(__file__).resolve().parent


def test_a_skip_for_a_missing_package_fails_in_ci(tmp_path):
    probe = TESTS / f"test_zz_probe_{os.getpid()}.py"  # inside tests/: its conftest applies
    probe.write_text("import pytest\n\ndef test_needs_it():\n    pytest.importorskip('no_such_package_for_hydrax')\n")
    try:
        def run(**env):
            base = {k: v for k, v in os.environ.items() if k != "HYDRAX_REQUIRE_TEST_EXTRA"}  # CI sets it for this run too
            return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(probe)],
                                  capture_output=True, text=True, env=dict(base, **env), cwd=TESTS.parent, timeout=slack(120))

        assert run().returncode == 0  # a developer without the package gets a skip
        ci = run(HYDRAX_REQUIRE_TEST_EXTRA="1")
        assert ci.returncode == 1 and "1 failed" in ci.stdout
    finally:
        probe.unlink()


def test_the_code_passes_the_linter():
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "hydrax", "tests", "tools"], capture_output=True, text=True,
                          cwd=TESTS.parent, timeout=slack(120))
    assert done.returncode == 0, done.stdout + done.stderr
