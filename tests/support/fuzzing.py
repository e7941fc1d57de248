"""What the fuzz suites (``tests/test_fuzz_*.py``) share: mutant counts, and running a batch of
mutants in a child process, so that a crash or a hang fails the test with the mutant that caused
it instead of taking pytest down.

A fuzz module defines ``run(seed, first, count)``, printing ``CASE ...`` before each mutant, and
calls it from ``if __name__ == "__main__"`` with those three arguments; its test calls
:func:`run_isolated`. ``HYDRAX_FUZZ`` sets the mutants per kind (``make fuzz``: 100,000) and
``HYDRAX_FUZZ_SEED`` the seed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

MUTANTS = int(os.environ.get("HYDRAX_FUZZ", "400"))
SEED = int(os.environ.get("HYDRAX_FUZZ_SEED", "1"))
BATCH = 2000  # mutants per child process
ROOT = Path(__file__).resolve().parents[2]  # the repository: the children import its hydrax


def batches() -> range:
    """The first mutant of every child process's batch."""
    return range(0, MUTANTS, BATCH)


def run_isolated(script: str, first: int, seconds_per_mutant: float = 0.05) -> None:
    """Run mutants ``first ..`` of ``script`` in a child; fail with the last case on a crash or hang."""
    count = min(BATCH, MUTANTS - first)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    try:
        done = subprocess.run([sys.executable, script, str(SEED), str(first), str(count)], capture_output=True, text=True,
                              env=env, timeout=60 + count * seconds_per_mutant)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        last = [line for line in out.splitlines() if line.startswith("CASE")][-1:]
        raise AssertionError(f"hang: seed {SEED}, {last}; replay with: python {script} {SEED} FIRST COUNT") from None
    last = [line for line in done.stdout.splitlines() if line.startswith("CASE")][-1:]
    if done.returncode != 0:
        raise AssertionError(f"seed {SEED}, last {last}, status {done.returncode} (negative: killed by that signal):\n{done.stderr[-3000:]}")
