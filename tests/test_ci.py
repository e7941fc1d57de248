"""What CI (``.ci/run``) enforces besides the tests: lint, no test skipped for a missing package, and
installs from the committed constraints."""

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from support.timing import slack

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent


def pins() -> dict[str, str]:
    """constraints.txt's version for each package, for this Python (its markers evaluated here)."""
    found = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        requirement = Requirement(line)
        if requirement.marker is None or requirement.marker.evaluate():
            [spec] = requirement.specifier  # one exact version a line
            assert spec.operator == "==", line
            found[canonicalize_name(requirement.name)] = spec.version
    return found


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


@pytest.mark.skipif(sys.version_info < (3, 11), reason="reads pyproject.toml with tomllib (Python 3.11)")
def test_every_requirement_is_pinned_for_this_python():
    import tomllib

    # A dependency added to pyproject.toml without `make constraints` would install at whatever
    # version the registry has on the day: the next new machine could differ from this one.
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    wanted = list(project["build-system"]["requires"]) + list(project["project"]["dependencies"])
    for extra in ("test", "docs", "all", "examples"):
        wanted += project["project"]["optional-dependencies"][extra]
    locked = pins()
    missing = []
    for text in wanted:
        requirement = Requirement(text)
        if requirement.marker is not None and not requirement.marker.evaluate():
            continue
        name = canonicalize_name(requirement.name)
        if name not in locked or locked[name] not in requirement.specifier:
            missing.append(f"{text} (constraints.txt: {locked.get(name)})")
    assert not missing, f"run `make constraints` and commit constraints.txt: {missing}"


@pytest.mark.skipif(not os.environ.get("PIP_CONSTRAINT"), reason="runs where the Makefile installed the packages (it sets PIP_CONSTRAINT)")
def test_the_installed_packages_are_the_pinned_ones():
    # make installs with PIP_CONSTRAINT; a package at another version means the environment was
    # made another way, and a pass here says nothing about a new machine.
    assert Path(os.environ["PIP_CONSTRAINT"]).resolve() == (ROOT / "constraints.txt").resolve()
    drifted = []
    for name, version in pins().items():
        try:
            installed = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue  # pinned for an extra this environment did not install
        if installed != version:
            drifted.append(f"{name} {installed} (pinned {version})")
    assert not drifted, f"installed versions differ from constraints.txt (make reinstalls when it changes): {drifted}"
