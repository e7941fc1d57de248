"""Time bounds that hold on a busy machine: ``slack(seconds)`` stretches a bound by how slow this
machine is now.

A test that checks a time against a fixed number fails on a machine that is merely busy (two
cores shared by jobs with a load average of 8 made ``make test`` fail on such numbers). Every
upper bound on a time in the tests, and every short duration a test hands to hydrax that must be
long enough for the work to happen (a ``timeout_sec``, ``--seconds``, a connection's timeout in a
test that expects success), goes through :func:`slack`::

    assert time.monotonic() - started < slack(10)  # a hang, not a slow machine
    Dataloader(..., timeout_sec=slack_int(1))  # timeout_sec takes whole seconds

Lower bounds (``took >= delay``) need nothing: a slow machine only makes a time longer.

:func:`factor`, measured once per process at first use (once per test session in pytest's
process; a helper process that calls :func:`slack` itself measures for itself), is

    max(1, best time of :func:`workload` now / :data:`REFERENCE_SECONDS`) * max(1, load average / cores)

The workload is a fixed, short CPU job (a pure-Python loop and a numpy sort, about 17 ms on the
reference machine, best of three runs); :data:`REFERENCE_SECONDS` is its best time on that
machine while idle. The first term says how fast a core is for this process now (a slower CPU,
a CPU-quota'd container, contention at this very moment); the second, how crowded the cores have
been for the last minute, which a 17 ms sample can miss by landing in a quiet moment. The two
overlap on a loaded machine, which errs towards longer bounds: only a hang has to be caught. On
the reference machine with four busy loops on its two cores, the factor was about 2.3 as they
started and 6 to 7 once the load average had caught up; idle, 1 to 1.1.

``HYDRAX_TEST_TIME_SCALE`` (a positive number) replaces the measured factor, to make every bound
longer on a machine known to be slow (say 5 under valgrind), or shorter than the measurement would
(values below 1 are taken as given, to check that a bound still holds without slack).
"""

from __future__ import annotations

import functools
import math
import os
import time

import numpy as np

#: The best of three times of :func:`workload` on the idle reference machine (2 cores of a cloud
#: VM's Intel Xeon, Python 3.11, load average under 1 when measured), in seconds.
REFERENCE_SECONDS = 0.017


@functools.cache
def _values() -> np.ndarray:
    # made at first use: the worker processes that import a test module never time anything
    return np.random.default_rng(0).random(500_000)


def workload() -> int:
    """The fixed CPU job timed by :func:`factor`: interpreter work and numpy work, as the tests'
    own waits are made of."""
    total = 0
    for i in range(350_000):
        total += i * i % 7
    return total + int(np.sort(_values())[-1] > 0)


def measure(runs: int = 3) -> float:
    """The best time of ``runs`` runs of :func:`workload` (the best: one of them may have been
    preempted; the machine's speed is what the fastest shows)."""
    workload()  # the first run pays for cold caches and page faults, not for a slow machine
    best = float("inf")
    for _ in range(runs):
        started = time.perf_counter()
        workload()
        best = min(best, time.perf_counter() - started)
    return best


def load_ratio() -> float:
    """The one-minute load average per core (0 where the system cannot say)."""
    try:
        return os.getloadavg()[0] / (os.cpu_count() or 1)
    except OSError:
        return 0.0


@functools.cache
def factor() -> float:
    """How many times slower than the reference machine this one is now: at least 1, measured
    once per process, or ``HYDRAX_TEST_TIME_SCALE`` when set."""
    override = os.environ.get("HYDRAX_TEST_TIME_SCALE", "").strip()
    if override:
        value = float(override)
        if not value > 0:
            raise ValueError(f"HYDRAX_TEST_TIME_SCALE must be a positive number of times, got {override!r}")
        return value
    return max(1.0, measure() / REFERENCE_SECONDS) * max(1.0, load_ratio())


def slack(seconds: float) -> float:
    """``seconds``, a bound on a time this machine takes, stretched by :func:`factor`."""
    return seconds * factor()


def slack_int(seconds: float) -> int:
    """:func:`slack` rounded up to whole seconds, for what takes an int (``timeout_sec``)."""
    return math.ceil(slack(seconds))
