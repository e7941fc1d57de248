"""Benchmark: what the size of a dataset costs, for hydrax (``"numpy"`` and ``"lazy"`` orders) and Grain.

What is measured
----------------
A training group of N items (``range(N)``), ``shuffle_first=True`` and ``shuffle_later="itemwise"``,
batch 256, 2 loader processes and a trivial ``loader_func`` (one int64 per item), in a process
that has initialised JAX first (workers start from the fork server, as in a training script).
Every measurement runs in a fresh subprocess; per N and order kind:

* **first batch**: seconds from building the ``DataGroup`` to the first batch of epoch 0;
* **resume**: the same for ``start_at=(1, N // 512)``, the first batch of a resumed run, and
  for ``process_count`` P in 1, 8, 64 (this host is ``process_index=1``; batch 256 * 8 for P = 64,
  so that each host loads 32 items);
* **boundary pause**: a run started ``--runup`` seconds' worth of batches before the end of
  epoch 0 (it has that long to prepare epoch 1's order) crosses into epoch 1; the pause is the
  gap from the last batch of epoch 0 to the first of epoch 1, against the median (and 90th
  percentile) of the 200 gaps before it (one batch time). (Without a run-up the order is not
  ready at the boundary and the pipeline waits for it, about the "first batch" time of
  ``"numpy"``, before the last batches of the epoch are delivered.);
* **peak RSS / PSS**: sampled every 0.1 s during the run, for the main process and the largest
  worker; PSS splits shared pages between the processes that map them;
* **CPU per batch by shard count**: a ``shardwise`` group of 10**7 items in 1,000 or 100,000
  shards (a stand-in for a ShardSet: the same ``shard_sizes``, no files), with 1 or 8
  partitions: the main process's CPU time per batch over a whole epoch (from batch 50 on), which
  includes making the next epoch's order (``"numpy"``, on its background thread) or the shard
  order (``"lazy"``) once. Each case runs ``--repeats`` times, the cases in turn; the table
  gives each run, the median and its ratio to 1,000 shards;
* **growth over 10 epochs**: N = ``--epochs-n`` (default 10**6, batch 10,000): total PSS of the
  main process and its workers after epoch 1 and after epoch 10.

Grain (``--grain-python`` names an interpreter with ``grain`` installed; skipped otherwise):
``MapDataset.range(N).shuffle(seed)``: build and read position 0 ("first"), a repeated one at
position 1.5 N ("resume"); ``IndexSampler(N, ShardOptions(1, P), shuffle=True, num_epochs=None)``
record at 1.5 N / P; peak RSS of its process.

The 100,000-shard ShardSet figures (first and second open, by glob and from a manifest, pickle
size, worker PSS with fork and the fork server, first batch) come from
``tools/bench/bench_setindex.py``, which this bench runs last.

How to run
----------
``python tools/bench/bench_scale.py`` (about 15 minutes on 2 cores; ``--quick`` for N up to 10**7).
``--help`` lists the options. This file is also its own subprocess (``--child JSON``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence

RESULT = "BENCH-RESULT "


# -- memory sampling -----------------------------------------------------------------------------
def _status_kb(pid: int, field: str) -> int:
    path = f"/proc/{pid}/smaps_rollup" if field == "Pss:" else f"/proc/{pid}/status"
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(field):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


class Sampler:
    """Peak RSS and PSS of this process and of its loader workers, sampled on a thread."""

    def __init__(self, period: float = 0.1) -> None:
        self.peak = {"main_rss": 0, "main_pss": 0, "worker_rss": 0, "worker_pss": 0}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(period,), daemon=True)
        self._thread.start()

    def sample(self) -> dict[str, int]:
        import multiprocessing

        now = {"main_rss": _status_kb(os.getpid(), "VmRSS:"), "main_pss": _status_kb(os.getpid(), "Pss:")}
        workers = [p.pid for p in multiprocessing.active_children() if p.name.startswith("hydrax-loader")]
        now["worker_rss"] = max((_status_kb(p, "VmRSS:") for p in workers), default=0)
        now["worker_pss"] = max((_status_kb(p, "Pss:") for p in workers), default=0)
        now["total_pss"] = now["main_pss"] + sum(_status_kb(p, "Pss:") for p in workers)
        for key in self.peak:
            self.peak[key] = max(self.peak[key], now[key])
        return now

    def _run(self, period: float) -> None:
        while not self._stop.wait(period):
            self.sample()

    def stop(self) -> dict[str, float]:
        self._stop.set()
        self._thread.join()
        self.sample()
        return {key: round(value / 1024, 1) for key, value in self.peak.items()}


# -- the hydrax child ----------------------------------------------------------------------------
def load(item, arrays, seed):
    arrays["x"][...] = item


def hydrax_child(spec: dict) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np

    jnp.ones(1).block_until_ready()  # JAX initialised: workers start from the fork server
    from hydrax import Dataloader, DataGroup

    n, batch, what = int(spec["n"]), int(spec["batch"]), spec["what"]
    sampler = Sampler()
    started = time.perf_counter()
    group = DataGroup(batch, range(n), loader_arrays={"x": ((), np.int64, jnp.int64)}, seed=1, shuffle_first=True,
                      shuffle_later="itemwise", permutation=spec["permutation"])
    bpe = group.batch_count
    kwargs = {"loader_count": 2, "process_index": spec.get("process_index", 0), "process_count": spec.get("process_count", 1)}
    out: dict = {"n": n, "batch": batch, "what": what, "permutation": spec["permutation"], "P": kwargs["process_count"]}
    if what in ("first", "resume"):
        start = (0, 0) if what == "first" else (1, n // 512)
        with Dataloader(load, group, start_at=start, end_at=("batch", start[0] * bpe + start[1] + 3), **kwargs) as loader:
            for i, b in enumerate(loader):
                jax.block_until_ready(b.arrays["x"])
                if i == 0:
                    out["first_s"] = round(time.perf_counter() - started, 3)
                del b
    elif what == "boundary":
        runup = int(spec["runup_batches"])
        # the last few hundred batches only: a list of the whole run-up (10**5 batches at 10**9)
        # would be the bench's own memory in the main process's peak
        times: deque = deque(maxlen=260)
        with Dataloader(load, group, start_at=(0, bpe - runup), end_at=("batch", bpe + 5), **kwargs) as loader:
            for b in loader:
                jax.block_until_ready(b.arrays["x"])
                times.append((b.batch_num, time.perf_counter()))
                if len(times) == 1:
                    began = times[0][1]
                del b
        times = list(times)
        gaps = {num: t - times[i - 1][1] for i, (num, t) in enumerate(times) if i}
        before = [g for num, g in gaps.items() if num < bpe][-200:]
        out["batch_s"] = round(statistics.median(before), 5)
        out["batch_p90_s"] = round(sorted(before)[int(0.9 * (len(before) - 1))], 5)
        out["pause_s"] = round(gaps[bpe], 5)  # from the last batch of epoch 0 to the first of epoch 1
        out["runup_s"] = round(times[-1][1] - began, 2)
    elif what == "epochs":
        per_epoch = {}
        with Dataloader(load, group, end_at=("epoch", 10), **kwargs) as loader:
            for b in loader:
                epoch, position = divmod(b.batch_num, bpe)
                del b
                if position == bpe - 1:
                    per_epoch[epoch] = sampler.sample()["total_pss"]
        out["pss_after_epoch_mb"] = {e: round(v / 1024, 1) for e, v in per_epoch.items()}
        out["growth_pct"] = round(100 * (per_epoch[9] - per_epoch[0]) / per_epoch[0], 2)
    out.update(sampler.stop())
    return out


class Sharded(Sequence):
    """``n`` items in ``shards`` equal shards, as a ShardSet presents them (what ``shardwise`` needs)."""

    def __init__(self, n: int, shards: int) -> None:
        self.n, self.shards = n, shards

    def shard_sizes(self) -> list[int]:
        base, extra = divmod(self.n, self.shards)
        return [base + (i < extra) for i in range(self.shards)]

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> int:
        return index


def shards_child(spec: dict) -> dict:
    """Main-process CPU per batch of a ``shardwise`` group, by shard count."""
    import resource

    import jax
    import jax.numpy as jnp
    import numpy as np

    jnp.ones(1).block_until_ready()
    from hydrax import Dataloader, DataGroup

    n, shards = int(spec["n"]), int(spec["shards"])
    group = DataGroup(256, Sharded(n, shards), loader_arrays={"x": ((), np.int64, jnp.int64)}, seed=1, shuffle_later="shardwise",
                      shard_partitions=int(spec.get("partitions", 1)), permutation=spec["permutation"])

    def cpu() -> float:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime

    batches = group.batch_count  # a whole epoch: one next-epoch order (numpy) or shard order (lazy) is made meanwhile
    with Dataloader(load, group, loader_count=2, end_at=("batch", batches + 50)) as loader:
        for i, b in enumerate(loader):
            jax.block_until_ready(b.arrays["x"])
            del b
            if i == 49:
                started, wall = cpu(), time.perf_counter()
    spent = cpu() - started
    return {"n": n, "shards": shards, "permutation": spec["permutation"], "partitions": spec.get("partitions", 1),
            "cpu_us_per_batch": round(1e6 * spent / batches, 1), "wall_us_per_batch": round(1e6 * (time.perf_counter() - wall) / batches, 1)}


# -- the Grain child -------------------------------------------------------------------------------
def grain_child(spec: dict) -> dict:
    import resource

    import grain.python as gp

    n, what, count = int(spec["n"]), spec["what"], int(spec.get("process_count", 1))
    started = time.perf_counter()
    if spec["api"] == "mapdataset":
        ds = gp.MapDataset.range(n).shuffle(seed=1)
        if what == "first":
            ds[0]
        else:
            ds.repeat()[n + n // 2]
    else:
        sampler = gp.IndexSampler(num_records=n, shard_options=gp.ShardOptions(shard_index=min(1, count - 1), shard_count=count),
                                  shuffle=True, num_epochs=None, seed=1)
        sampler[0 if what == "first" else (n + n // 2) // count]
    elapsed = time.perf_counter() - started
    return {"n": n, "what": what, "api": spec["api"], "P": count, "first_s": round(elapsed, 4),
            "main_rss": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}


# -- the driver ------------------------------------------------------------------------------------
def run_child(spec: dict, python: str | None = None, timeout: float = 1800) -> dict:
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    try:
        done = subprocess.run([python or sys.executable, __file__, "--child", json.dumps(spec)], capture_output=True, text=True,
                              timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {**spec, "error": f"timed out after {timeout} s"}
    for line in done.stdout.splitlines():
        if line.startswith(RESULT):
            return json.loads(line[len(RESULT):])
    return {**spec, "error": (done.stderr or done.stdout)[-400:]}


def estimate_batch_s(n: int, permutation: str) -> float:
    """One batch's time, from a short boundary run at this N (the run-up needs it)."""
    probe = run_child({"kind": "hydrax", "n": n, "batch": 256, "what": "boundary", "permutation": permutation, "runup_batches": 200})
    return probe.get("batch_s", 0.002)


def table(rows: list[dict], columns: list[tuple[str, str]]) -> str:
    lines = [" | ".join(title for title, _ in columns), " | ".join("---" for _ in columns)]
    for row in rows:
        lines.append(" | ".join(str(row.get(key, "")) for _, key in columns))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--sizes", default="1e6,1e7,1e8", help="N for both order kinds")
    parser.add_argument("--lazy-sizes", default="1e9", help="extra N for 'lazy' (and Grain) only")
    parser.add_argument("--hosts", default="1,8,64", help="process counts for the resume row")
    parser.add_argument("--runup", type=float, default=30.0, help="seconds of batches before the epoch boundary")
    parser.add_argument("--epochs-n", type=float, default=1e6, help="N of the 10-epoch memory run")
    parser.add_argument("--grain-python", help="an interpreter with grain installed (default: this one, if it has grain)")
    parser.add_argument("--quick", action="store_true", help="N up to 10**7, a short run-up")
    parser.add_argument("--parts", default="orders,grain,epochs,shards,shardset", help="which tables to make")
    parser.add_argument("--repeats", type=int, default=5, help="runs of each case of the CPU-by-shard-count table, taken in turn")
    args = parser.parse_args()
    if args.child:
        spec = json.loads(args.child)
        result = {"hydrax": hydrax_child, "grain": grain_child, "shards": shards_child}[spec["kind"]](spec)
        print(RESULT + json.dumps(result), flush=True)
        return
    sizes = [int(float(s)) for s in args.sizes.split(",")]
    lazy_sizes = [int(float(s)) for s in args.lazy_sizes.split(",") if s]
    if args.quick:
        sizes, lazy_sizes, args.runup = [s for s in sizes if s <= 10**7], [], 5.0
    hosts = [int(p) for p in args.hosts.split(",")]
    parts = set(args.parts.split(","))
    rows = []
    for n in sorted(set(sizes + lazy_sizes)) if "orders" in parts else ():
        for permutation in ("numpy", "lazy"):
            if n not in sizes and permutation == "numpy":
                continue
            rows.append(measure(n, permutation, hosts, args.runup))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    grain = grain_rows(sorted(set(sizes + lazy_sizes)), hosts, args.grain_python) if "grain" in parts else []
    epochs = [run_child({"kind": "hydrax", "n": int(args.epochs_n), "batch": 10_000, "what": "epochs", "permutation": p})
              for p in ("numpy", "lazy") if "epochs" in parts]
    per_shard = shard_rows(args.repeats) if "shards" in parts else []
    print("\n## hydrax: set-up, resume, boundary and memory by N (2 loaders, fork server, batch 256)\n")
    print(table(rows, [("N", "n"), ("permutation", "permutation"), ("first batch s", "first_s"),
                       *[(f"resume s (P={p})", f"resume_s_P{p}") for p in hosts],
                       ("batch s (median)", "batch_s"), ("batch s (p90)", "batch_p90_s"), ("boundary pause s (run-up)", "pause_s"), ("run-up s", "runup_s"),
                       ("peak RSS main MB", "main_rss"),
                       ("peak PSS main MB", "main_pss"), ("peak RSS worker MB", "worker_rss"), ("peak PSS worker MB", "worker_pss")]))
    print("\n## Grain, same N (its process's peak RSS)\n")
    print(table(grain, [("N", "n"), ("API", "api"), ("P", "P"), ("first s", "first_s"), ("resume s", "resume_s"),
                        ("peak RSS MB", "main_rss"), ("note", "error")]))
    print("\n## main-process CPU per batch of a shardwise group of 10**7 items, by shard count\n")
    print(table(per_shard, [("permutation", "permutation"), ("partitions", "partitions"), ("shards", "shards"),
                            ("CPU us/batch (median)", "cpu_us_per_batch"), ("each run", "runs"), ("vs 1,000 shards", "ratio"),
                            ("wall us/batch", "wall_us_per_batch"), ("note", "error")]))
    print("\n## total PSS (main + workers) over 10 epochs\n")
    for e in epochs:
        print(f"- {e.get('permutation')}, N = {e.get('n')}: growth {e.get('growth_pct')}% "
              f"(after each epoch, MB: {e.get('pss_after_epoch_mb', e.get('error'))})")
    if "shardset" in parts:
        # A ShardSet of 100,000 local shards x 10 samples, by glob and from a manifest: its own bench.
        print("\n## ShardSet of 100,000 local shards (tools/bench/bench_setindex.py)\n", flush=True)
        subprocess.run([sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench_setindex.py")], check=False)


def measure(n: int, permutation: str, hosts: list[int], runup_s: float) -> dict:
    """Every figure of one row: first batch, resume for each host count, boundary pause, memory."""
    base = {"kind": "hydrax", "n": n, "batch": 256, "permutation": permutation}
    row = run_child({**base, "what": "first"})
    for count in hosts:
        batch = 256 * 8 if count > 32 else 256
        resumed = run_child({**base, "batch": batch, "what": "resume", "process_index": 1 if count > 1 else 0, "process_count": count})
        row[f"resume_s_P{count}"] = resumed.get("first_s", resumed.get("error", "?")[:40])
        for key in ("main_rss", "main_pss", "worker_rss", "worker_pss"):
            row[key] = max(row.get(key, 0), resumed.get(key, 0))
    batch_s = estimate_batch_s(n, permutation)
    warm = run_child({**base, "what": "boundary", "runup_batches": max(20, min(n // 256 - 1, int(runup_s / max(batch_s, 1e-4))))})
    for key in ("batch_s", "batch_p90_s", "pause_s", "runup_s", "error"):
        if key in warm:
            row[key] = warm[key]
    for key in ("main_rss", "main_pss", "worker_rss", "worker_pss"):
        row[key] = max(row.get(key, 0), warm.get(key, 0))
    return row


def shard_rows(repeats: int) -> list[dict]:
    """The CPU-per-batch table: every case run ``repeats`` times, the cases in turn (so that a
    busy spell of the machine falls on all of them), the median of each and its ratio to the
    same case with 1,000 shards."""
    cases = [(p, c, shards) for p in ("numpy", "lazy") for c in (1, 8) for shards in (1000, 100_000)]
    runs: dict[tuple, list[dict]] = {case: [] for case in cases}
    for _ in range(repeats):
        for p, c, shards in cases:
            runs[(p, c, shards)].append(run_child({"kind": "shards", "n": 10**7, "shards": shards, "permutation": p, "partitions": c}))
    rows = []
    for (_, _, shards), results in runs.items():
        good = [r for r in results if "cpu_us_per_batch" in r]
        if not good:
            rows.append(results[-1])
            continue
        row = {**good[0], "runs": " / ".join(str(r["cpu_us_per_batch"]) for r in good),
               "cpu_us_per_batch": round(statistics.median(r["cpu_us_per_batch"] for r in good), 1),
               "wall_us_per_batch": round(statistics.median(r["wall_us_per_batch"] for r in good), 1)}
        if shards != 1000 and rows and "cpu_us_per_batch" in rows[-1]:
            row["ratio"] = round(row["cpu_us_per_batch"] / rows[-1]["cpu_us_per_batch"], 3)
        rows.append(row)
    return rows


def grain_rows(sizes: list[int], hosts: list[int], python: str | None) -> list[dict]:
    if python is None:
        try:
            import grain  # noqa: F401
        except ImportError:
            return [{"n": "-", "api": "-", "error": "grain is not installed here (pass --grain-python)"}]
    rows = []
    for n in sizes:
        for api, counts in (("mapdataset", [1]), ("indexsampler", hosts)):
            for count in counts:
                first = run_child({"kind": "grain", "api": api, "n": n, "what": "first", "process_count": count}, python)
                resumed = run_child({"kind": "grain", "api": api, "n": n, "what": "resume", "process_count": count}, python)
                first["resume_s"] = resumed.get("first_s")
                first["main_rss"] = max(first.get("main_rss", 0), resumed.get("main_rss", 0))
                rows.append(first)
                print(json.dumps(first), file=sys.stderr, flush=True)
    return rows


if __name__ == "__main__":
    main()
