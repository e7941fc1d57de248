"""Benchmark the lazy permutation: nanoseconds per position, three ways of getting the indices
at some positions of a shuffled order of n items.

``kernel``
    ``_core.feistel_permute`` (what :mod:`hydrax.order.permute` calls): O(1) memory, each position on
    its own.
``twin``
    ``_fallback.feistel_permute``, the same permutation in numpy (the tests' oracle).
``numpy``
    ``Generator(PCG64(seed)).permutation(n)[positions]``: the whole order of n items is made
    (8n bytes) to read the positions wanted; skipped where that would take over ``--max-numpy``
    items.

Two kinds of rows: every position of the order (``all``), and a task's positions (a run of
``--task`` consecutive positions somewhere in the order, what a worker asks for). The times are
medians over ``--repeat`` runs; the ratios are to the kernel. The machine may be shared, so small
differences are noise::

    .venv/bin/python tools/bench/bench_permute.py [--repeat 5] [--task 4096] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from hydrax import _core, _fallback
from hydrax.order.permute import permute_range, round_keys

#: (n, positions): "all" for every position, else a count of consecutive positions.
CASES = [(1000, "all"), (10**6, "all"), (10**6, "task"), (10**7, "task"), (2**32 + 1, "task"), (2**32 + 1, 10**6),
         (10**10, "task"), (10**10, 10**6)]


def median_seconds(run, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def positions_for(n: int, kind, task: int) -> np.ndarray:
    count = n if kind == "all" else (task if kind == "task" else kind)
    start = (n - count) // 3  # somewhere inside the order, not at its start
    return np.arange(start, start + count, dtype=np.int64)


def measure(n: int, kind, args) -> dict:
    keys = round_keys(args.seed)
    positions = positions_for(n, kind, args.task)
    out = np.empty_like(positions)
    row = {"n": n, "positions": len(positions), "kind": kind if kind in ("all", "task") else "run"}
    row["kernel"] = median_seconds(lambda: _core.feistel_permute(n, keys, positions, out), args.repeat) / len(positions) * 1e9
    np.testing.assert_array_equal(out, permute_range(n, keys, int(positions[0]), int(positions[-1]) + 1))
    row["twin"] = median_seconds(lambda: _fallback.feistel_permute(n, keys, positions), args.repeat) / len(positions) * 1e9
    if n <= args.max_numpy:
        generator = lambda: np.random.Generator(np.random.PCG64(args.seed)).permutation(n)[positions]
        row["numpy"] = median_seconds(generator, args.repeat) / len(positions) * 1e9
    return row


def table(rows: list[dict]) -> str:
    lines = [f"{'n':>14} {'positions':>14} {'kernel ns':>10} {'twin ns':>10} {'numpy ns':>12} {'twin/kernel':>12} {'numpy/kernel':>13}"]
    for row in rows:
        numpy_ns = row.get("numpy")
        numpy_text = f"{numpy_ns:12.1f}" if numpy_ns is not None else f"{'-':>12}"
        ratio = f"{numpy_ns / row['kernel']:13.1f}" if numpy_ns is not None else f"{'-':>13}"
        where = f"{row['positions']:,} ({row['kind']})"
        lines.append(f"{row['n']:>14,} {where:>14} {row['kernel']:10.1f} {row['twin']:10.1f} {numpy_text} "
                     f"{row['twin'] / row['kernel']:12.1f} {ratio}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5, help="runs per measurement (the median is shown)")
    parser.add_argument("--task", type=int, default=4096, help="positions of a task's row")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-numpy", type=int, default=10**7, help="largest n to build a numpy permutation of")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")
    args = parser.parse_args()
    rows = [measure(n, kind, args) for n, kind in CASES]
    print(json.dumps(rows, indent=1) if args.json else table(rows))


if __name__ == "__main__":
    main()
