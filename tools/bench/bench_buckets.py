"""Benchmark: aspect-ratio buckets against one fixed-size group, same photos, same pixels per batch.

    python tools/bench/bench_buckets.py [--samples 20000] [--loaders 2] [--repeat 2] [--epochs 1]

Makes ``--samples`` photo-like JPEGs (q90, 12 aspect ratios, sides of about 150-450 pixels) in
shards of 1,000 (once, cached under ``--cache``), then, interleaved ``--repeat`` times, runs an
epoch of each:

- **buckets**: ``plan_buckets(..., pixels=224 * 224, step=32, pixels_per_batch=64 * 224 * 224)``
  and :func:`hydrax.bucket_groups` over the ShardSet, ``shuffle_later="shardwise"``, each slot
  filled by ``decode_into`` (cover, centre crop);
- **fixed**: one DataGroup of 224 x 224 slots, batch 64, the same ShardSet and order mode, the
  same ``decode_into``.

Each run is its own subprocess (a fresh Dataloader, nothing warm but the page cache). It
reports images/s over the epoch (first batch included), and the CPU seconds per 1,000 images of
the loader processes and of the main process (from /proc, so only our own processes count), with
the load average. The planning itself (sizes, plan, groups) is timed apart. The issue's bar:
buckets within 10% of the fixed group's images/s.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ASPECTS = [(9, 16), (2, 3), (3, 4), (4, 5), (1, 1), (5, 4), (4, 3), (3, 2), (16, 10), (16, 9), (2, 1), (21, 9)]


def make_shards(folder: Path, samples: int) -> str:
    """Photo-like JPEGs in 12 aspects, 1,000 a shard (kept between runs)."""
    import numpy as np
    from PIL import Image

    from hydrax.shards.writer import ShardWriter

    pattern = f"{folder}/photos-{{00..{(samples - 1) // 1000:02d}}}.tar"
    done = folder / f"done-{samples}"
    if done.exists():
        return pattern
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    with ShardWriter(str(folder / "photos-%02d.tar"), maxcount=1000) as sink:
        for i in range(samples):
            aw, ah = ASPECTS[i % len(ASPECTS)]
            scale = 150 / min(aw, ah) * rng.uniform(1, 3)
            width, height = max(16, int(aw * scale)), max(16, int(ah * scale))
            coarse = rng.integers(0, 256, (max(2, height // 24), max(2, width // 24), 3), dtype=np.uint8)
            image = Image.fromarray(coarse).resize((width, height), Image.Resampling.BICUBIC)
            noisy = np.clip(np.asarray(image, np.int16) + rng.integers(-12, 13, (height, width, 3)), 0, 255)
            buffer = io.BytesIO()
            Image.fromarray(noisy.astype(np.uint8)).save(buffer, "JPEG", quality=90)
            sink.write({"__key__": f"{i:06d}", "jpg": buffer.getvalue()})
    done.touch()
    return pattern


def load(sample, arrays, seed):
    from hydrax.image import decode_into

    decode_into(sample["jpg"], arrays["image"])


def cpu_seconds(pids) -> float:
    """User + system CPU seconds of the processes ``pids`` (those that still exist)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / ticks


def descendants() -> set[int]:
    """Our processes below this one (loaders, fork server), from /proc."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                parents[int(entry)] = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    found, frontier = set(), {os.getpid()}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def one_run(kind: str, pattern: str, loaders: int, epochs: int) -> dict:
    """An epoch of ``kind`` in this process: images/s, CPU per 1,000 images by process kind."""
    import jax.numpy as jnp
    import numpy as np

    import hydrax
    from hydrax.image import plan_buckets
    from hydrax.shards import ShardSet

    started = time.perf_counter()
    shards = ShardSet(pattern)
    if kind == "buckets":
        widths, heights = shards.image_sizes("jpg")
        plan = plan_buckets(widths, heights, pixels=224 * 224, step=32, pixels_per_batch=64 * 224 * 224)
        groups = hydrax.bucket_groups(plan, shards, lambda h, w: {"image": ((h, w, 3), np.uint8, jnp.uint8)},
                                      shuffle_later="shardwise")
        shapes = len(plan.buckets)
    else:
        groups = [hydrax.DataGroup(64, shards, loader_arrays={"image": ((224, 224, 3), np.uint8, jnp.uint8)},
                                   shuffle_later="shardwise")]
        shapes = 1
    planned = time.perf_counter() - started
    main_before = time.process_time()
    images = 0
    begun = time.perf_counter()
    workers: set[int] = set()
    with hydrax.Dataloader(load, groups, loader_count=loaders, end_at=("epoch", epochs), timeout_sec=600) as loader:
        for batch in loader:
            images += len(batch.indices)
            if not workers:
                workers = descendants()
            del batch
        worker_cpu = cpu_seconds(workers | descendants())
    elapsed = time.perf_counter() - begun
    return {"kind": kind, "images": images, "seconds": elapsed, "rate": images / elapsed, "planned": planned,
            "shapes": shapes, "worker_cpu_per_k": worker_cpu / images * 1e3,
            "main_cpu_per_k": (time.process_time() - main_before) / images * 1e3}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=20_000)
    parser.add_argument("--loaders", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--cache", default=os.path.expanduser("~/.cache/hydrax/bench-buckets"))
    parser.add_argument("--run", help=argparse.SUPPRESS)  # one measurement, in a subprocess
    args = parser.parse_args()
    pattern = make_shards(Path(args.cache), args.samples)
    if args.run:
        print(json.dumps(one_run(args.run, pattern, args.loaders, args.epochs)))
        return
    print(f"aspect-ratio buckets vs one fixed group: {args.samples:,} JPEGs in 12 aspects, {args.loaders} loaders, "
          f"{args.epochs} epoch(s) a run, {args.repeat} interleaved rounds; {os.cpu_count()} CPUs")
    results: dict[str, list[dict]] = {"buckets": [], "fixed": []}
    for _ in range(args.repeat):
        for kind in results:
            out = subprocess.run([sys.executable, __file__, "--samples", str(args.samples), "--loaders", str(args.loaders),
                                  "--epochs", str(args.epochs), "--cache", args.cache, "--run", kind],
                                 capture_output=True, text=True, check=True)
            results[kind].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(f"  {kind:8} {results[kind][-1]['rate']:8,.0f} images/s  (load average {os.getloadavg()[0]:.2f})")
    print(f"{'group(s)':10} {'shapes':>6} {'images/s':>16} {'loader CPU s/1k':>16} {'main CPU s/1k':>14} {'plan s':>7}")
    for kind, runs in results.items():
        rates = [r["rate"] for r in runs]
        print(f"{kind:10} {runs[0]['shapes']:6d} {min(rates):7,.0f}-{max(rates):<8,.0f} "
              f"{statistics.median(r['worker_cpu_per_k'] for r in runs):16.2f} "
              f"{statistics.median(r['main_cpu_per_k'] for r in runs):14.3f} "
              f"{statistics.median(r['planned'] for r in runs):7.2f}")
    ratio = statistics.median(r["rate"] for r in results["buckets"]) / statistics.median(r["rate"] for r in results["fixed"])
    print(f"buckets / fixed images/s (medians): {ratio:.3f}; load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
