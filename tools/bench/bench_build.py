"""Benchmark: ``hydrax shards build`` against webdataset's ShardWriter driven by a plain loop.

    python tools/bench/bench_build.py [--images 2000] [--maxcount 500] [--repeat 3]

Generates a class-per-subfolder folder of ``--images`` JPEGs (about 320x240, quality 90, 10
classes; photographic-looking noise, so the files are of realistic size), then times, in
interleaved rounds from the page cache:

- ``webdataset``: ``wds.ShardWriter`` fed by the usual recipe, a Python loop over the sorted
  files that reads each one and writes ``{"__key__", "jpg", "cls"}``;
- ``hydrax``: :func:`hydrax.shards.build_shards` over :func:`hydrax.shards.samples_from_folder`
  (listing included), with 1 and 2 workers (``--workers``: with 1, this process reads and checks;
  with more, worker processes read and check ahead of it), with the image check the command does
  by default for a folder (every JPEG decoded, at 1/8 scale) and without it.

hydrax writes a ``label`` field and a ``.hidx`` index per shard besides, and renames each shard
into place; webdataset writes neither. Prints each variant's median images/s and its ratio to
webdataset's.
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import statistics
import tempfile
import time

import numpy as np


def make_folder(root: str, images: int, classes: int = 10) -> None:
    from PIL import Image

    rng = np.random.default_rng(0)
    base = rng.integers(0, 256, (240 // 8, 320 // 8, 3), np.uint8)
    for i in range(images):
        folder = os.path.join(root, f"class{i % classes:02d}")
        os.makedirs(folder, exist_ok=True)
        # Smooth structure plus mild noise compresses like a photo (~20-30 kB at q90).
        image = Image.fromarray(np.roll(base, i, axis=1)).resize((320, 240), Image.BILINEAR)
        pixels = np.asarray(image).astype(np.int16) + rng.integers(-12, 13, (240, 320, 3), dtype=np.int16)
        out = io.BytesIO()
        Image.fromarray(pixels.clip(0, 255).astype(np.uint8)).save(out, "JPEG", quality=90)
        with open(os.path.join(folder, f"img{i:06d}.jpg"), "wb") as f:
            f.write(out.getvalue())


def with_webdataset(root: str, out: str, maxcount: int) -> int:
    import webdataset as wds

    classes = sorted(os.listdir(root))
    count = 0
    with wds.ShardWriter(os.path.join(out, "wds-%06d.tar"), maxcount=maxcount, verbose=0) as sink:
        for index, name in enumerate(classes):
            for file in sorted(os.listdir(os.path.join(root, name))):
                with open(os.path.join(root, name, file), "rb") as f:
                    data = f.read()
                sink.write({"__key__": f"{name}/{os.path.splitext(file)[0]}", "jpg": data, "cls": str(index).encode()})
                count += 1
    return count


def with_hydrax(root: str, out: str, maxcount: int, workers: int, check: bool) -> int:
    from hydrax.shards import build_shards, samples_from_folder

    report = build_shards(samples_from_folder(root), os.path.join(out, "hx-%06d.tar"), maxcount=maxcount,
                          workers=workers, check_images=check, force=True)
    return report.samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--maxcount", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dir", help="where to put the images and shards (default: a temporary folder)")
    args = parser.parse_args()

    work = tempfile.mkdtemp(prefix="bench-build-", dir=args.dir)
    try:
        root = os.path.join(work, "images")
        started = time.perf_counter()
        make_folder(root, args.images)
        size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(root) for f in fs)
        print(f"{args.images} JPEGs, 320x240 q90, {size / args.images / 1e3:.1f} kB each on average "
              f"(made in {time.perf_counter() - started:.1f} s); maxcount {args.maxcount}; {os.cpu_count()} CPUs")
        variants = {
            "webdataset ShardWriter loop": lambda out: with_webdataset(root, out, args.maxcount),
            "hydrax, 1 worker, no check": lambda out: with_hydrax(root, out, args.maxcount, 1, False),
            "hydrax, 2 workers, no check": lambda out: with_hydrax(root, out, args.maxcount, 2, False),
            "hydrax, 1 worker, images checked": lambda out: with_hydrax(root, out, args.maxcount, 1, True),
            "hydrax, 2 workers, images checked": lambda out: with_hydrax(root, out, args.maxcount, 2, True),
        }
        rates: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(args.repeat):
            for name, run in variants.items():  # interleaved, so drift hits every variant alike
                out = os.path.join(work, "out")
                os.makedirs(out)
                started = time.perf_counter()
                count = run(out)
                rates[name].append(count / (time.perf_counter() - started))
                shutil.rmtree(out)
        reference = statistics.median(rates["webdataset ShardWriter loop"])
        print(f"{'variant':36s} {'images/s (median)':>18s} {'vs webdataset':>14s}   runs")
        for name, values in rates.items():
            median = statistics.median(values)
            print(f"{name:36s} {median:18.0f} {median / reference:13.2f}x   {', '.join(f'{v:.0f}' for v in values)}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
