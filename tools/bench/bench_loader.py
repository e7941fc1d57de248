"""Benchmark: hydrax against a plain ``multiprocessing.Pool`` doing the same work.

What is measured
----------------
Two workloads, each with the same per-item function for both loaders:

``trivial``
    16 float32 per item (``arrays["x"][:] = seed``), batch 256. Measures the loader's own
    overhead per item and per batch.
``jpeg``
    Pillow decode of a 320x320 quality-90 JPEG in draft mode (``img.draft("RGB", (256, 256))``),
    centre crop 256x256, written into a uint8 (256, 256, 3) array; batch 64. The files (2,048 by
    default) are generated once, with a fixed seed, into a cache directory: smooth multi-octave
    random colour noise, about 40 KB each, so decoding costs what a real photo of that size costs.

Each workload runs under:

``Pool``
    ``multiprocessing.Pool(processes)`` (fork), ``imap`` over the item list with a chunksize (256
    for trivial items, 16 for JPEGs with 2 processes; ``--chunksize``), the parent copying each
    returned array into a preallocated batch-sized numpy array (the Pool's best case: no
    allocation per batch, no JAX placement).
``hydrax``
    ``Dataloader(load, DataGroup(batch, items, ...), loader_count=processes)``; the consumer calls
    ``jax.block_until_ready`` on the batch's array and then ``del batch``, as a training loop
    would. It runs twice: in a process where JAX is imported but has not computed anything yet
    (workers start by ``fork``), and after ``jnp.ones(1).block_until_ready()`` (a realistic
    training script, JAX already initialised; workers start from a ``forkserver``). The start
    method is read from ``Dataloader.start_method`` and printed.
``Pool, results discarded`` (the work-only ceiling; ``--no-ceiling`` skips it)
    The same Pool, but the workers do the work and send nothing back: what these processes can
    do at most on this machine right now. Printed under the table, with hydrax as a fraction of it.
``hydrax 0.2.2`` (only with ``--hydrax022 PYTHON``)
    The original hydrax 0.2.2, run by the given interpreter (a venv with hydrax==0.2.2, numpy,
    jax and Pillow), with a copying ``placement_func`` (its default aliases shared memory on the
    CPU backend and can stall). It starts its workers with ``spawn``.

Every measurement runs in a fresh subprocess, and runs are interleaved (Pool, hydrax, hydrax
after JAX, [0.2.2], ceiling, Pool, ...) ``--repeat`` times; the table shows medians, because the machine
may be shared and noisy. Per run:

* **first batch / first result**: seconds from just before ``with Dataloader(...)`` (or
  ``with Pool(...)``) to receiving the first batch (for the Pool: its first item, the column the
  table asks for; the Pool's first full batch is in the per-run details).
* **items/s**: steady state. After the first batch, batches are consumed for ``--warmup``
  seconds without counting, then counted for ``--seconds``; items/s = items counted / time.

How to run
----------
``make bench`` runs ``python tools/bench/bench_loader.py`` in the project's venv (a few minutes).
``python tools/bench/bench_loader.py --quick`` is a short run (one repeat, one second per run).
``python tools/bench/bench_loader.py --hydrax022 /work/venv-hydrax022/bin/python`` adds rows for the
original hydrax 0.2.2. ``--help`` lists the rest (``--processes``, ``--repeat``, ``--workloads``...).

This file is also its own subprocess: ``--child SPEC`` runs one measurement and prints one
``BENCH-RESULT {json}`` line. Like a training script it imports JAX at module level (so the fork
server, which imports the main module, pays for that, as it would in real use), imports hydrax
only inside the measurement (so the same file drives 0.2.2 in its own venv), and keeps its
per-item functions at module level, where spawned and fork-server workers find them.
"""

from __future__ import annotations

import argparse
import io
import itertools
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import threading
import sys
import time
from pathlib import Path

# Imported at module level, as a training script does: hydrax's fork server (and 0.2.2's spawned
# workers) import this main module, so its imports are part of the start-up being measured.
import jax
import jax.numpy as jnp
import numpy as np
from PIL import Image

RESULT_TAG = "BENCH-RESULT "
CROP = 256
SOURCE_SIZE = 320
JPEG_QUALITY = 90

WORKLOADS = {
    # name: array name, item shape, numpy dtype, batch size, Pool chunksize (None: see pool_chunksize)
    "trivial": ("x", (16,), "float32", 256, 256),
    "jpeg": ("image", (CROP, CROP, 3), "uint8", 64, None),
}


def pool_chunksize(workload: str, processes: int) -> int:
    """The Pool's default chunksize: one batch for trivial items (cheap items need big chunks),
    half a batch's share per process for JPEGs (16 for 2 processes: the best measured here)."""
    _, _, _, batch_size, fixed = WORKLOADS[workload]
    return fixed or max(1, batch_size // (2 * processes))


# -- per-item functions (module level: picklable, importable by spawned/forkserver workers) ------
def trivial_item(value: int) -> np.ndarray:
    """Pool side of the trivial workload."""
    return np.full(16, value, np.float32)


def trivial_load(item, arrays, seed) -> None:
    """hydrax side of the trivial workload."""
    arrays["x"][:] = seed


def jpeg_decode(path: str) -> np.ndarray:
    """Decode ``path`` in draft mode and centre-crop it to CROP x CROP RGB."""
    with Image.open(path) as img:
        img.draft("RGB", (CROP, CROP))
        img = img.convert("RGB")
        w, h = img.size
        left, top = (w - CROP) // 2, (h - CROP) // 2
        return np.asarray(img.crop((left, top, left + CROP, top + CROP)))


def jpeg_load(path, arrays, seed) -> None:
    """hydrax side of the JPEG workload."""
    arrays["image"][:] = jpeg_decode(path)


def place_copy(arrays, layouts, additional, group):
    """A copying placement for hydrax 0.2.2 (its default aliases shared memory and can stall)."""
    return {k: jnp.asarray(np.array(v, copy=True), dtype=layouts[k][2]) for k, v in arrays.items()}


def trivial_discard(value: int) -> None:
    """Pool ceiling of the trivial workload: the work, but nothing sent back."""
    trivial_item(value)


def jpeg_discard(path: str) -> None:
    """Pool ceiling of the JPEG workload: the decode, but nothing sent back."""
    jpeg_decode(path)


POOL_FUNCS = {"trivial": trivial_item, "jpeg": jpeg_decode}
DISCARD_FUNCS = {"trivial": trivial_discard, "jpeg": jpeg_discard}
LOAD_FUNCS = {"trivial": trivial_load, "jpeg": jpeg_load}


# -- JPEG files ----------------------------------------------------------------------------------
def _make_jpeg(args: tuple[str, int, int]) -> None:
    path, seed, index = args
    rng = np.random.default_rng([seed, index])
    img = np.full((SOURCE_SIZE, SOURCE_SIZE, 3), 128.0, np.float32)
    # Octaves of smooth noise: large colour regions, edges and some fine texture.
    for cells, amplitude in ((4, 90.0), (16, 50.0), (64, 28.0), (SOURCE_SIZE, 8.0)):
        noise = rng.normal(0.0, 1.0, (cells, cells, 3)).astype(np.float32)
        if cells != SOURCE_SIZE:
            noise = np.stack(
                [np.asarray(Image.fromarray(noise[..., c]).resize((SOURCE_SIZE, SOURCE_SIZE), Image.BICUBIC)) for c in range(3)],
                axis=-1,
            )
        img += amplitude * noise
    out = io.BytesIO()
    Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(out, "JPEG", quality=JPEG_QUALITY)
    Path(path).write_bytes(out.getvalue())


def jpeg_paths(folder: str | Path, count: int) -> list[str]:
    return [str(Path(folder) / f"{i:06d}.jpg") for i in range(count)]


def jpeg_folder(cache_dir: Path, count: int, seed: int, processes: int) -> Path:
    """The folder of ``count`` generated JPEGs, made once (deterministically) under ``cache_dir``."""
    folder = cache_dir / f"jpeg-{SOURCE_SIZE}px-q{JPEG_QUALITY}-n{count}-seed{seed}"
    paths = jpeg_paths(folder, count)
    if (folder / "COMPLETE").exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    print(f"generating {count} JPEGs in {folder} ...", file=sys.stderr, flush=True)
    with mp.get_context("fork").Pool(processes) as pool:
        pool.map(_make_jpeg, [(p, seed, i) for i, p in enumerate(paths)], chunksize=16)
    (folder / "COMPLETE").write_text(f"{count}\n")
    print(f"  done in {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
    return folder


# -- one measurement (runs in a child process) ---------------------------------------------------
class Clock:
    """Steady-state accounting shared by every loader: first batch, warm-up, counted window."""

    def __init__(self, t0: float, warmup: float, seconds: float) -> None:
        self.t0 = t0
        self.warmup = warmup
        self.seconds = seconds
        self.first_batch: float | None = None
        self.window_start: float | None = None
        self.items = 0
        self.batches = 0
        self.elapsed = 0.0

    def batch_done(self, size: int) -> bool:
        """Account one received batch; False once the counted window is over."""
        now = time.perf_counter()
        if self.first_batch is None:
            self.first_batch = now - self.t0
            return True
        if self.window_start is None:
            if now - self.t0 - self.first_batch >= self.warmup:
                self.window_start = now
            return True
        self.items += size
        self.batches += 1
        self.elapsed = now - self.window_start
        return self.elapsed < self.seconds

    def result(self) -> dict:
        return {
            "first_batch_s": self.first_batch,
            "items_per_s": self.items / self.elapsed if self.elapsed > 0 else None,
            "counted_items": self.items,
            "counted_batches": self.batches,
            "counted_s": self.elapsed,
        }


def _items(spec: dict) -> list:
    if spec["workload"] == "jpeg":
        return jpeg_paths(spec["jpeg_dir"], spec["jpeg_count"])
    return list(range(spec["trivial_items"]))


def run_pool(spec: dict) -> dict:
    name, shape, dtype, batch_size, _ = WORKLOADS[spec["workload"]]
    discard = spec["impl"] == "pool-discard"
    func = (DISCARD_FUNCS if discard else POOL_FUNCS)[spec["workload"]]
    items = _items(spec)
    batch = np.empty((batch_size, *shape), dtype)
    clock = Clock(0.0, spec["warmup"], spec["seconds"])
    first_result = None
    clock.t0 = time.perf_counter()
    # Bounded prefetch, like a real loader: imap alone feeds its workers without limit, and
    # at 16 processes the unconsumed results then swamp the parent (a run never finishes).
    ahead = threading.Semaphore(batch_size * max(3, spec["depth"]))
    done = threading.Event()

    def feed():
        for item in itertools.islice(itertools.cycle(items), 10**9):
            while not ahead.acquire(timeout=0.05):
                if done.is_set():
                    return  # lets Pool.__exit__ join its task thread
            yield item

    with mp.get_context("fork").Pool(spec["processes"]) as pool:
        results = pool.imap(func, feed(), chunksize=spec["chunksize"])
        going = True
        while going:
            for k in range(batch_size):
                result = next(results)
                ahead.release()
                if not discard:
                    batch[k] = result
                if first_result is None:
                    first_result = time.perf_counter() - clock.t0
            going = clock.batch_done(batch_size)
        done.set()
        exit_started = time.perf_counter()
    out = clock.result()
    out.update(first_result_s=first_result, shutdown_s=time.perf_counter() - exit_started, start_method="fork")
    return out


def _version(module) -> str:
    try:
        from importlib.metadata import version

        return version("hydrax")
    except Exception:
        return getattr(module, "__version__", "?")


def run_hydrax(spec: dict) -> dict:
    import hydrax
    from hydrax import DataGroup, Dataloader

    name, shape, dtype, batch_size, _ = WORKLOADS[spec["workload"]]
    group = DataGroup(batch_size, _items(spec), loader_arrays={name: (shape, np.dtype(dtype), jnp.dtype(dtype))})
    kwargs = dict(loader_count=spec["processes"], depth=spec["depth"], end_at=None, timeout_sec=60)
    if spec["impl"] == "hydrax022":
        kwargs["placement_func"] = place_copy
    clock = Clock(0.0, spec["warmup"], spec["seconds"])
    clock.t0 = time.perf_counter()
    with Dataloader(LOAD_FUNCS[spec["workload"]], group, **kwargs) as loader:
        going = True
        for batch in loader:
            jax.block_until_ready(batch.arrays[name])
            del batch
            going = clock.batch_done(batch_size)
            if not going:
                break
        stats = getattr(loader, "transfer_stats", None)
        method = getattr(loader, "start_method", None) or ("spawn" if spec["impl"] == "hydrax022" else "?")
        exit_started = time.perf_counter()
    out = clock.result()
    out.update(
        shutdown_s=time.perf_counter() - exit_started,
        start_method=method,
        transfer_stats=stats,
        hydrax_version=_version(hydrax),
        hydrax_file=hydrax.__file__,
        completed=not going,
    )
    return out


def child_main(spec: dict) -> None:
    import faulthandler

    if spec.get("watchdog_s"):
        faulthandler.dump_traceback_later(spec["watchdog_s"], exit=True)  # a hang reports where it hangs
    if spec["jax"] == "initialised":
        jnp.ones(1).block_until_ready()
    run = run_pool if spec["impl"].startswith("pool") else run_hydrax
    out = run(spec)
    out["backend"] = jax.default_backend()
    print(RESULT_TAG + json.dumps(out), flush=True)
    sys.stdout.flush()
    os._exit(0)  # skip interpreter teardown: it is not part of the measurement


# -- orchestration (parent) ----------------------------------------------------------------------
ROWS = [
    # impl, JAX state before the loader, label
    ("hydrax", "imported", "hydrax"),
    ("hydrax", "initialised", "hydrax"),
    ("hydrax022", "initialised", "hydrax 0.2.2"),
]


def measure(python: str, spec: dict, timeout: float) -> dict:
    env = dict(os.environ)
    if spec["impl"] == "hydrax022":
        env.pop("PYTHONPATH", None)  # its own hydrax, never ours
    try:
        proc = subprocess.run(
            [python, os.path.abspath(__file__), "--child", json.dumps(spec)],
            capture_output=True, text=True, timeout=timeout, env=env,
        )
    except subprocess.TimeoutExpired as exc:
        err = exc.stderr or ""
        if isinstance(err, bytes):
            err = err.decode(errors="replace")
        return {"error": f"timed out after {timeout:.0f} s", "stderr": err[-3000:]}
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT_TAG):
            return json.loads(line[len(RESULT_TAG):])
    tail = (proc.stderr or proc.stdout)[-3000:]
    return {"error": f"exit status {proc.returncode}", "stderr": tail}


def median(runs: list[dict], key: str) -> float | None:
    values = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(values) if values else None


def fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--processes", type=int, default=2, help="worker processes for both loaders (default 2)")
    parser.add_argument("--repeat", type=int, default=None, help="interleaved repetitions; the table shows medians (default 3, --quick 1)")
    parser.add_argument("--seconds", type=float, default=None, help="counted steady-state seconds per run (default 2.5, --quick 1)")
    parser.add_argument("--warmup", type=float, default=None, help="seconds after the first batch before counting (default 0.5, --quick 0.2)")
    parser.add_argument("--workloads", default="trivial,jpeg", help="comma-separated: trivial, jpeg (default both)")
    parser.add_argument("--depth", type=int, default=3, help="hydrax depth (batch slots; default 3, hydrax's default)")
    parser.add_argument("--chunksize", type=int, default=None, help="Pool imap chunksize (default: 256 trivial, batch/(2*processes) = 16 jpeg)")
    parser.add_argument("--jpeg-count", type=int, default=2048, help="generated JPEG files (default 2048)")
    parser.add_argument("--trivial-items", type=int, default=256 * 64, help="items in the trivial data set (default 16384)")
    parser.add_argument("--cache-dir", type=Path, default=Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "hydrax-bench",
                        help="where the generated JPEGs are kept (default ~/.cache/hydrax-bench)")
    parser.add_argument("--hydrax022", metavar="PYTHON", help="also run hydrax 0.2.2 with this interpreter (a venv with hydrax==0.2.2 and Pillow)")
    parser.add_argument("--no-jax-initialised", action="store_true", help="skip the hydrax runs made after a JAX computation")
    parser.add_argument("--no-ceiling", action="store_true", help="skip the Pool runs that discard results (the work-only ceiling)")
    parser.add_argument("--details", action="store_true", help="print every run, not only the medians")
    parser.add_argument("--quick", action="store_true", help="short run: 1 repeat, 1 s counted per run")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds before a single run is abandoned (default 120)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child_main(json.loads(args.child))
        return 0

    repeat = args.repeat if args.repeat is not None else (1 if args.quick else 3)
    seconds = args.seconds if args.seconds is not None else (1.0 if args.quick else 2.5)
    warmup = args.warmup if args.warmup is not None else (0.2 if args.quick else 0.5)
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    for w in workloads:
        if w not in WORKLOADS:
            parser.error(f"unknown workload {w!r}; choose from {', '.join(WORKLOADS)}")
    rows = [r for r in ROWS if (r[0] != "hydrax022" or args.hydrax022) and not (args.no_jax_initialised and r[0] == "hydrax" and r[1] == "initialised")]

    print(f"hydrax loader benchmark: {os.cpu_count()} CPUs (load average {os.getloadavg()[0]:.1f} at start), {args.processes} processes, {repeat} interleaved repeats, "
          f"steady state = {seconds:g} s counted after the first batch + {warmup:g} s warm-up, medians shown", flush=True)
    started = time.perf_counter()
    results: dict[tuple, list[dict]] = {}
    for workload in workloads:
        base = dict(workload=workload, processes=args.processes, seconds=seconds, warmup=warmup, depth=args.depth,
                    chunksize=args.chunksize or pool_chunksize(workload, args.processes), trivial_items=args.trivial_items,
                    jpeg_count=args.jpeg_count, jpeg_dir=None, watchdog_s=max(10.0, args.timeout - 5))
        if workload == "jpeg":
            base["jpeg_dir"] = str(jpeg_folder(args.cache_dir, args.jpeg_count, 0, max(1, os.cpu_count() or 1)))
        plan = [("pool", "imported", "Pool")] + rows + ([] if args.no_ceiling else [("pool-discard", "imported", "Pool, results discarded")])
        for r in range(repeat):
            for impl, jax_state, _label in plan:
                python = args.hydrax022 if impl == "hydrax022" else sys.executable
                out = measure(python, dict(base, impl=impl, jax=jax_state), args.timeout)
                results.setdefault((workload, impl, jax_state), []).append(out)
                if "error" in out:
                    print(f"  [{workload} {impl} jax {jax_state} run {r + 1}] FAILED: {out['error']}\n    "
                          + out.get("stderr", "").strip().replace("\n", "\n    "), file=sys.stderr, flush=True)
                elif args.details:
                    print(f"  [{workload} {impl} jax {jax_state} run {r + 1}] {fmt(out.get('items_per_s'), ',.0f')} items/s, "
                          f"first batch {fmt(out.get('first_batch_s'), '.3f')} s, first result {fmt(out.get('first_result_s'), '.3f')} s, "
                          f"shutdown {fmt(out.get('shutdown_s'), '.3f')} s, {out.get('counted_batches')} batches in "
                          f"{fmt(out.get('counted_s'), '.2f')} s, {out.get('start_method')}, {out.get('transfer_stats')}", flush=True)

    header = ["workload", "loader", "JAX before loader", "start method", "processes", "Pool items/s", "hydrax items/s",
              "ratio hydrax/Pool", "hydrax first batch (s)", "Pool first result (s)"]
    table = []
    notes = []
    for workload in workloads:
        pool_runs = results[(workload, "pool", "imported")]
        pool_rate = median(pool_runs, "items_per_s")
        pool_first = median(pool_runs, "first_result_s")
        for impl, jax_state, label in rows:
            runs = results[(workload, impl, jax_state)]
            ok = [r for r in runs if "error" not in r]
            rate = median(ok, "items_per_s")
            methods = sorted({r.get("start_method", "?") for r in ok}) or ["-"]
            failed = len(runs) - len(ok)
            table.append([
                workload, label + (f" ({failed}/{len(runs)} failed)" if failed else ""),
                "imported" if jax_state == "imported" else "computed", "/".join(methods), str(args.processes),
                fmt(pool_rate, ",.0f"), fmt(rate, ",.0f"),
                fmt(rate / pool_rate if rate and pool_rate else None, ".2f"),
                fmt(median(ok, "first_batch_s"), ".3f"), fmt(pool_first, ".3f"),
            ])
            if impl == "hydrax":
                aliased = sum((r.get("transfer_stats") or {}).get("aliased_batches", 0) for r in ok)
                copied = sum((r.get("transfer_stats") or {}).get("copied_batches", 0) for r in ok)
                notes.append(f"{workload:8s} hydrax, JAX {'imported' if jax_state == 'imported' else 'computed'}: "
                             f"{aliased} batches aliased, {copied} copied (over {len(ok)} runs)")
    widths = [max(len(h), *(len(row[i]) for row in table)) for i, h in enumerate(header)]
    print()
    print(" | ".join(h.ljust(w) for h, w in zip(header, widths)))
    print("-+-".join("-" * w for w in widths))
    for row in table:
        print(" | ".join(c.ljust(w) if i < 4 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))))
    print()
    print("hydrax transfer_stats (batches handed to JAX without a copy vs copied):")
    for line in notes:
        print("  " + line)
    if not args.no_ceiling:
        print("\nwork-only ceiling (same Pool, workers send nothing back), median items/s: " + ", ".join(
            f"{w} {fmt(median(results[(w, 'pool-discard', 'imported')], 'items_per_s'), ',.0f')}" for w in workloads))
        for w in workloads:
            ceiling = median(results[(w, "pool-discard", "imported")], "items_per_s")
            parts = []
            for impl, jax_state, label in rows:
                rate = median([r for r in results[(w, impl, jax_state)] if "error" not in r], "items_per_s")
                if rate and ceiling:
                    parts.append(f"{label} ({'imported' if jax_state == 'imported' else 'computed'}) {rate / ceiling:.2f}")
            print(f"  {w}: hydrax / ceiling: " + ", ".join(parts))
    print("\nPool first full batch (s), median: " + ", ".join(
        f"{w} {fmt(median(results[(w, 'pool', 'imported')], 'first_batch_s'), '.3f')}" for w in workloads))
    tested = sorted({(r.get("hydrax_version"), r.get("hydrax_file"), r.get("backend")) for runs in results.values() for r in runs if r.get("hydrax_file")})
    for version, where, backend in tested:
        print(f"hydrax {version} from {os.path.dirname(where)}, JAX backend {backend}")
    print(f"total time {time.perf_counter() - started:.0f} s, load average {os.getloadavg()[0]:.1f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
