"""Benchmark the on-disk batch cache: epochs replayed from it, against what they stand in for.

Two workloads, side by side in one run:

1. **64 MB batches** (16 items of 4 MB of float32): a first run fills the cache in direct mode;
   then epochs from the cache (a Dataloader whose loader function is never called) are timed as
   the bytes of batches handed out per second, and compared with ``np.copyto`` of the same bytes
   between two preallocated 64 MB arrays (a plain memory-to-memory copy, the cost any loader
   that copies a batch pays at least once).
2. **JPEG decode**: a loader function decodes 320x320 JPEGs with Pillow (draft mode, centre crop
   to 256x256 RGB); an epoch through the loaders is compared with an epoch of the same batches
   from the cache.

Each timed epoch starts at the first batch (start-up is excluded) and ends at the last; the rate
is the median over ``--repeat`` runs. Batches are released each iteration and their arrays made
ready (``block_until_ready``), as a training step would. On the CPU backend a cached batch's
arrays alias the file's mapping, whose pages are mapped on first access, so the 64 MB figure is
also given with the loop reading one value of every page (which a training step would do anyway). The cache files go to ``--dir`` (default:
a temporary directory, removed afterwards); the page cache holds them after the first run, as it
would for a cache reused epoch after epoch.

Usage::

    .venv/bin/python tools/bench/bench_cache.py            # a table
    .venv/bin/python tools/bench/bench_cache.py --json     # one JSON object
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

import hydrax

ITEM_FLOATS = 1 << 20  # 4 MB per item
BATCH_ITEMS = 16  # 64 MB per batch
SOURCE = 320
CROP = 256


def fill_item(item, arrays, seed):
    arrays["x"][...] = item


def refuse(item, arrays, seed):
    raise RuntimeError("the loader ran during a cached epoch")


def decode_jpeg(path, arrays, seed):
    from PIL import Image

    with Image.open(path) as img:
        img.draft("RGB", (CROP, CROP))
        img = img.convert("RGB")
        left, top = (img.width - CROP) // 2, (img.height - CROP) // 2
        arrays["image"][...] = np.asarray(img.crop((left, top, left + CROP, top + CROP)))


def make_jpegs(folder: str, count: int) -> list[str]:
    from PIL import Image

    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(0)
    paths = []
    for i in range(count):
        path = os.path.join(folder, f"{i:05d}.jpg")
        coarse = rng.integers(0, 256, (10, 10, 3), dtype=np.uint8)
        image = Image.fromarray(coarse).resize((SOURCE, SOURCE), Image.BICUBIC)
        noisy = np.clip(np.asarray(image, np.int16) + rng.integers(-12, 13, (SOURCE, SOURCE, 3)), 0, 255).astype(np.uint8)
        buffer = io.BytesIO()
        Image.fromarray(noisy).save(buffer, "JPEG", quality=90)
        with open(path, "wb") as f:
            f.write(buffer.getvalue())
        paths.append(path)
    return paths


def touch_pages(array) -> None:
    """Read one value of every 4 KB page of ``array`` (on the CPU backend, in place)."""
    flat = np.asarray(array).reshape(-1).view(np.uint8)
    int(flat[::4096].sum())


def timed_epoch(func, group, *, epochs: int, loader_count: int, depth: int, touch: bool = False) -> tuple[float, int, int]:
    """Seconds from the first batch to the last, bytes handed out after the first, batches.

    With ``touch``, the loop also reads every page of every array once (a cached batch's pages
    are mapped on first access).
    """
    nbytes = 0
    batches = 0
    first = None
    with hydrax.Dataloader(func, group, end_at=("epoch", epochs), loader_count=loader_count, depth=depth,
                           on_item_error="raise", timeout_sec=120) as dl:
        for batch in dl:
            for array in batch.arrays.values():
                array.block_until_ready()
                if touch:
                    touch_pages(array)
            if first is None:
                first = time.perf_counter()
            else:
                nbytes += sum(a.nbytes for a in batch.arrays.values())
            batches += 1
            del batch
    return time.perf_counter() - first, nbytes, batches


def copy_rate(nbytes: int, repeat: int) -> float:
    src = np.random.default_rng(0).random(nbytes // 4, dtype=np.float32)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    times = []
    for _ in range(max(5, repeat * 3)):
        t = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - t)
    return nbytes / statistics.median(times)


def bench_big(root: str, batches: int, repeat: int) -> dict:
    location = os.path.join(root, "big")
    arrays = {"x": ((ITEM_FLOATS,), np.float32, jnp.float32)}

    def group():
        return hydrax.DataGroup(BATCH_ITEMS, list(range(BATCH_ITEMS * batches)), loader_arrays=arrays,
                                cache_location=location, shuffle_later="repeat")

    timed_epoch(fill_item, group(), epochs=1, loader_count=2, depth=4)  # fills the cache
    rates, touched = [], []
    for _ in range(repeat):
        seconds, nbytes, _ = timed_epoch(refuse, group(), epochs=2, loader_count=1, depth=4)
        rates.append(nbytes / seconds)
        seconds, nbytes, _ = timed_epoch(refuse, group(), epochs=2, loader_count=1, depth=4, touch=True)
        touched.append(nbytes / seconds)
    batch_bytes = BATCH_ITEMS * ITEM_FLOATS * 4
    copy = copy_rate(batch_bytes, repeat)
    cached, cached_touched = statistics.median(rates), statistics.median(touched)
    return {"batch_mb": batch_bytes / 1e6, "cached_gb_s": cached / 1e9, "cached_touched_gb_s": cached_touched / 1e9,
            "copy_gb_s": copy / 1e9, "ratio": cached / copy, "ratio_touched": cached_touched / copy}


def bench_jpeg(root: str, images: int, batch_size: int, loaders: int, repeat: int) -> dict:
    paths = make_jpegs(os.path.join(root, "jpeg"), images)
    arrays = {"image": ((CROP, CROP, 3), np.uint8, jnp.uint8)}
    location = os.path.join(root, "jpeg-cache")

    def group(cache: bool):
        return hydrax.DataGroup(batch_size, paths, loader_arrays=arrays, shuffle_later="repeat",
                                cache_location=location if cache else None)

    loaded, cached = [], []
    timed_epoch(decode_jpeg, group(True), epochs=1, loader_count=loaders, depth=4)  # fills the cache
    for _ in range(repeat):
        seconds, _, n = timed_epoch(decode_jpeg, group(False), epochs=1, loader_count=loaders, depth=4)
        loaded.append((n - 1) * batch_size / seconds)
        seconds, _, n = timed_epoch(refuse, group(True), epochs=1, loader_count=1, depth=4)
        cached.append((n - 1) * batch_size / seconds)
    loader_rate, cache_rate = statistics.median(loaded), statistics.median(cached)
    return {"images": images, "batch_size": batch_size, "loaders": loaders, "loader_images_s": loader_rate,
            "cached_images_s": cache_rate, "ratio": cache_rate / loader_rate}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", help="where the caches go (default: a temporary directory, removed afterwards)")
    parser.add_argument("--batches", type=int, default=6, help="64 MB batches per epoch (default 6)")
    parser.add_argument("--images", type=int, default=512, help="JPEGs per epoch (default 512)")
    parser.add_argument("--batch-size", type=int, default=32, help="JPEGs per batch (default 32)")
    parser.add_argument("--loaders", type=int, default=os.cpu_count() or 1, help="loader processes for the JPEG epoch")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per figure; the median is reported")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    args = parser.parse_args(argv)
    root = args.dir or tempfile.mkdtemp(prefix="hydrax-bench-cache-")
    try:
        big = bench_big(root, args.batches, args.repeat)
        jpeg = bench_jpeg(root, args.images, args.batch_size, args.loaders, args.repeat)
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)
    result = {"hydrax": hydrax.__version__ if hasattr(hydrax, "__version__") else None, "jax": jax.__version__,
              "backend": jax.default_backend(), "cpus": os.cpu_count(), "big": big, "jpeg": jpeg,
              "verdict": {"big_ratio_at_least_0.9": big["ratio"] >= 0.9, "big_touched_ratio_at_least_0.9": big["ratio_touched"] >= 0.9, "jpeg_ratio_at_least_5": jpeg["ratio"] >= 5}}
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    rows = [
        ("64 MB batches: epoch from the cache", f"{big['cached_gb_s']:.2f} GB/s"),
        ("64 MB batches: the same, the loop reading every page", f"{big['cached_touched_gb_s']:.2f} GB/s"),
        ("64 MB batches: np.copyto of the same bytes", f"{big['copy_gb_s']:.2f} GB/s"),
        ("  ratio, handed out (>= 0.9 wanted)", f"{big['ratio']:.2f}x"),
        ("  ratio, every page read", f"{big['ratio_touched']:.2f}x"),
        (f"JPEG: epoch through {jpeg['loaders']} loader(s)", f"{jpeg['loader_images_s']:.0f} images/s"),
        ("JPEG: epoch from the cache", f"{jpeg['cached_images_s']:.0f} images/s"),
        ("  ratio (>= 5 wanted)", f"{jpeg['ratio']:.1f}x"),
    ]
    width = max(len(name) for name, _ in rows)
    print(f"hydrax cache benchmark ({result['backend']}, {result['cpus']} CPUs, jax {result['jax']})")
    for name, value in rows:
        print(f"  {name:<{width}}  {value:>16}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
