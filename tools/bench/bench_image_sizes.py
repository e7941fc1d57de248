"""Benchmark: image sizes from headers (``hydrax.image.sizes``), in headers per second, per core.

    python tools/bench/bench_image_sizes.py [--images 3000] [--repeat 7]

Generates ``--images`` photo-like JPEGs of assorted sizes (160-800 pixels a side, q85), a third
of them with an EXIF block (orientation 6) and a third with an Adobe RGB (1998) ICC profile, so
the scan skips APP segments as it does in real photos. Pins itself to one core and reads every
image's size by:

- ``_core.read_image_header``, the kernel, called once per image from Python;
- ``image_sizes``, the batch form over a list of ``bytes`` (the kernel per image, plus arrays);
- ``image_sizes_in``, all images in one buffer by offset and length: one kernel call without
  the GIL, what indexing a shard does;
- ``image_size``, the one-image form that raises;
- the kernel's pure-Python twin in ``hydrax/_fallback.py``;
- ``hydrax.image.jpeg.read_header``, the decode fast path's marker reader, for the record;
- ``PIL.Image.open(...).size``, which parses the header (and every marker segment) too.

Each figure is the median over ``--repeat`` passes of images per CPU second
(``time.process_time``); the issue's target for the header scan is 100,000 per second. The
sizes are checked against Pillow's first.
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import time
from pathlib import Path

import numpy as np
from PIL import Image

from hydrax import _core, _fallback
from hydrax.image import image_size, image_sizes, image_sizes_in
from hydrax.image.jpeg import read_header

ICC = Path(__file__).resolve().parents[2] / "tests" / "data" / "icc" / "AdobeRGB1998.icc"


def photos(count: int) -> list[bytes]:
    """Photo-like JPEGs of assorted sizes, some with EXIF, some with an ICC profile."""
    rng = np.random.default_rng(0)
    exif = Image.Exif()
    exif[0x0112] = 6
    profile = ICC.read_bytes()
    out = []
    for i in range(count):
        width, height = (int(v) for v in rng.integers(160, 801, 2))
        coarse = rng.integers(0, 256, (height // 32 + 1, width // 32 + 1, 3), dtype=np.uint8)
        image = Image.fromarray(coarse).resize((width, height), Image.Resampling.BILINEAR)
        extra = [{}, {"exif": exif}, {"icc_profile": profile}][i % 3]
        buffer = io.BytesIO()
        image.save(buffer, "JPEG", quality=85, **extra)
        out.append(buffer.getvalue())
    return out


def rate(run, count: int, repeat: int) -> float:
    """Images per CPU second: the median of ``repeat`` timed passes of ``run()``."""
    rates = []
    for _ in range(repeat):
        start = time.process_time()
        run()
        rates.append(count / max(time.process_time() - start, 1e-9))
    return statistics.median(rates)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=3000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    images = photos(args.images)
    joined = b"".join(images)
    lengths = np.array([len(b) for b in images], np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    pillow = [Image.open(io.BytesIO(b)) for b in images]
    expected = [im.size[::-1] if im.getexif().get(0x0112, 1) >= 5 else im.size for im in pillow]
    sizes = image_sizes_in(joined, offsets, lengths)
    assert list(zip(sizes.widths.tolist(), sizes.heights.tolist())) == expected, "sizes differ from Pillow's"

    ways = {
        "kernel, per image (_core.read_image_header)": lambda: [_core.read_image_header(b) for b in images],
        "image_sizes (list of bytes)": lambda: image_sizes(images),
        "image_sizes_in (one buffer, one kernel call)": lambda: image_sizes_in(joined, offsets, lengths),
        "image_size (per image, raising form)": lambda: [image_size(b) for b in images],
        "twin (_fallback.read_image_header)": lambda: [_fallback.read_image_header(b) for b in images],
        "jpeg.read_header (decode fast path)": lambda: [read_header(memoryview(b)) for b in images],
        "PIL.Image.open(...).size": lambda: [Image.open(io.BytesIO(b)).size for b in images],
    }
    print(f"{args.images} JPEGs, {len(joined) / args.images / 1000:.1f} kB each on average; "
          f"images per CPU second, median of {args.repeat}")
    results = {name: rate(run, args.images, args.repeat) for name, run in ways.items()}
    pil = results["PIL.Image.open(...).size"]
    for name, value in results.items():
        print(f"  {name:48s} {value:>12,.0f}/s  {value / pil:6.1f}x Pillow")


if __name__ == "__main__":
    main()
