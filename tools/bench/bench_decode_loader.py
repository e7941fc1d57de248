"""Benchmark: a loader that decodes JPEG shards into 224x224 slots, end to end.

    python tools/bench/bench_decode_loader.py [--images 2000] [--processes 2] [--repeat 3]

Writes ``--images`` photo-like 500x375 q90 JPEGs (the generator of ``bench_image.py``) into
WebDataset shards once (cached under ``--cache-dir``), then reads a whole epoch of them with a
``Dataloader`` of ``--processes`` loaders over a ``ShardSet``, batch 64, uint8 (224, 224, 3), each
item filled by:

- ``new``: ``decode_into(sample["jpg"], slot)``: the bytes, so the fast JPEG path;
- ``pillow``: ``decode_into(io.BytesIO(sample["jpg"]), slot)``: Pillow's path, which every JPEG
  took before;
- ``cv2``: simplejpeg + ``cv2.resize`` + crop, written by hand (only if OpenCV is installed).

Each run is a fresh subprocess; runs are interleaved and the table shows medians of images/s
over the epoch after the first batch. The same run measures ``decode_into``'s single-core rate on
the same files (one process, pinned), so the loader's figure can be set against ``processes x``
that rate.
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

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_image import photos  # noqa: E402

BATCH = 64
SIDE = 224


def make_shards(folder: Path, count: int) -> list[str]:
    from hydrax.shards.writer import ShardWriter

    done = folder / "done"
    if not done.exists():
        folder.mkdir(parents=True, exist_ok=True)
        with ShardWriter(str(folder / "photos-%04d.tar"), maxcount=500) as writer:
            for number, data in enumerate(photos(count, 500, 375, None)):
                writer.write({"__key__": f"{number:07d}", "jpg": data, "cls": str(number % 10)})
        done.write_text(str(count))
    return sorted(str(path) for path in folder.glob("photos-*.tar"))


def loader_function(mode: str):
    from hydrax.image import decode_into

    if mode == "new":
        def load(sample, arrays, seed):
            decode_into(sample["jpg"], arrays["image"])
    elif mode == "pillow":
        def load(sample, arrays, seed):
            decode_into(io.BytesIO(sample["jpg"]), arrays["image"])
    else:
        import cv2
        import simplejpeg

        cv2.setNumThreads(1)

        def load(sample, arrays, seed):
            image = simplejpeg.decode_jpeg(sample["jpg"])
            height, width = image.shape[:2]
            scale = SIDE / min(height, width)
            resized = cv2.resize(image, (max(SIDE, round(width * scale)), max(SIDE, round(height * scale))),
                                 interpolation=cv2.INTER_LINEAR)
            top, left = (resized.shape[0] - SIDE) // 2, (resized.shape[1] - SIDE) // 2
            arrays["image"][:] = resized[top : top + SIDE, left : left + SIDE]
    return load


def child(mode: str, urls: list[str], processes: int) -> dict:
    import jax.numpy as jnp

    from hydrax import DataGroup, Dataloader
    from hydrax.shards import ShardSet

    group = DataGroup(BATCH, ShardSet(urls), loader_arrays={"image": ((SIDE, SIDE, 3), np.uint8, jnp.uint8)})
    import resource

    first = None
    images = 0
    with Dataloader(loader_function(mode), group, loader_count=processes, end_at=("epoch", 1)) as loader:
        for batch in loader:
            batch.arrays["image"].block_until_ready()
            if first is None:
                first = time.perf_counter()
                cpu = resource.getrusage(resource.RUSAGE_SELF)
                cpu_first = cpu.ru_utime + cpu.ru_stime
            else:
                images += BATCH
            del batch
        elapsed = time.perf_counter() - first
        cpu = resource.getrusage(resource.RUSAGE_SELF)
    return {"images_per_s": images / elapsed, "main_cpu": (cpu.ru_utime + cpu.ru_stime - cpu_first) / elapsed}


def single_core(urls: list[str], limit: int = 300) -> float:
    """decode_into's images/s on one core, over the first ``limit`` samples of the shards."""
    from hydrax.image import decode_into
    from hydrax.shards import ShardSet

    samples = ShardSet(urls)
    data = [bytes(samples[i]["jpg"]) for i in range(min(limit, len(samples)))]
    slot = np.empty((SIDE, SIDE, 3), np.uint8)
    cores = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(cores)})
    try:
        rates = []
        for _ in range(3):
            started = time.process_time()
            for item in data:
                decode_into(item, slot)
            rates.append(len(data) / (time.process_time() - started))
    finally:  # the loader runs started after this inherit the mask
        os.sched_setaffinity(0, cores)
    return statistics.median(rates)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--cache-dir", type=Path, default=Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "hydrax-bench")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    urls = make_shards(args.cache_dir / f"photos-{args.images}", args.images)
    if args.child:
        print(json.dumps(child(args.child, urls, args.processes)))
        return
    modes = ["new", "pillow"]
    try:
        import cv2  # noqa: F401

        modes.append("cv2")
    except ImportError:
        pass
    rates: dict[str, list[float]] = {mode: [] for mode in modes}
    main_cpu: dict[str, list[float]] = {mode: [] for mode in modes}
    single = []
    for _ in range(args.repeat):
        for mode in modes:
            result = subprocess.run([sys.executable, __file__, "--child", mode, "--images", str(args.images), "--processes",
                                     str(args.processes), "--cache-dir", str(args.cache_dir)], capture_output=True, text=True, check=True)
            figures = json.loads(result.stdout.strip().splitlines()[-1])
            rates[mode].append(figures["images_per_s"])
            main_cpu[mode].append(figures["main_cpu"])
        single.append(single_core(urls))
    one = statistics.median(single)
    print(f"{args.images} JPEGs 500x375 q90 in {len(urls)} shards, {args.processes} loaders, batch {BATCH}, uint8 {SIDE}x{SIDE}x3; "
          f"medians of {args.repeat} interleaved runs; load average {os.getloadavg()[0]:.2f}")
    print(f"{'loader function':12} {'images/s':>9} {'vs pillow':>10} {'vs processes x single-core new':>31} {'main process CPU':>17}")
    for mode in modes:
        rate = statistics.median(rates[mode])
        print(f"{mode:12} {rate:9,.0f} {rate / statistics.median(rates['pillow']):9.2f}x {rate / (args.processes * one):30.2f} "
              f"{statistics.median(main_cpu[mode]):16.0%}")
    print(f"single-core decode_into (new): {one:,.0f} images/s")


if __name__ == "__main__":
    main()
