"""Benchmark: recording image sizes while indexing local shards (``hydrax shards index --sizes jpg``).

    taskset -c 1 python tools/bench/bench_index_sizes.py [--shards 20] [--per-shard 1000] [--repeat 5]

Writes ``--shards`` shards of ``--per-shard`` samples (a photo-like JPEG of 160-800 pixels a side,
a third with EXIF, a third with an ICC profile, as tools/bench/bench_image_sizes.py makes them,
plus a ``cls`` field) into a temporary folder, reads them once (a warm page cache), then times,
interleaved, median of ``--repeat`` passes over every shard, in this process:

- ``plain index``: ``index_file(shard, force=True)``, what ``hydrax shards index --force`` does;
- ``index with sizes``: ``index_file(shard, force=True, sizes="jpg")``;
- ``header scan``: the sizes alone, given the index (``measure_local_sizes``: map the shard, one
  ``image_sizes_in`` call): the part the sizes add, without the tar scan and the file write;
- ``sizes added``: ``index_file(shard, sizes="jpg")`` on a current index without sizes (load it,
  scan the headers, write it again), what ``--sizes`` does to an indexed set.

Each is reported in samples per wall second and per CPU second of this process
(``time.process_time``: user and system time, the page faults of the mappings included, but not
the time other work on the machine took from it); the issue's target for the header scan from
local shards is 100,000 per second. Then the command itself, ``hydrax shards index --force --sizes jpg``
and without ``--sizes``, once each in a subprocess (start-up included). The sizes are checked
against Pillow's first. Say the load average (printed) with the figures.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_image_sizes import photos  # noqa: E402

from hydrax.shards import ShardIndex, ShardWriter, index_file, index_path  # noqa: E402
from hydrax.shards.indexfile import measure_local_sizes  # noqa: E402

DISTINCT = 500  # photos made; the samples cycle through them


def write_shards(folder: Path, shards: int, per_shard: int) -> tuple[list[str], list[bytes]]:
    images = photos(DISTINCT)
    with ShardWriter(str(folder / "bench-%04d.tar"), maxcount=per_shard, index=False) as writer:
        for i in range(shards * per_shard):
            writer.write({"__key__": f"s{i:08d}", "jpg": images[i % DISTINCT], "cls": str(i % 1000)})
    return writer.paths, images


def pillow_sizes(images: list[bytes]) -> list[tuple[int, int]]:
    import io

    from PIL import Image, ImageOps

    return [ImageOps.exif_transpose(Image.open(io.BytesIO(b))).size for b in images]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=20)
    parser.add_argument("--per-shard", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    samples = args.shards * args.per_shard
    with tempfile.TemporaryDirectory(prefix="hydrax-bench-sizes-") as folder:
        paths, images = write_shards(Path(folder), args.shards, args.per_shard)
        data_bytes = sum(os.path.getsize(p) for p in paths)
        for path in paths:  # warm the page cache
            Path(path).read_bytes()
        index_file(paths[0], force=True, sizes="jpg")
        expected = pillow_sizes(images)
        found = ShardIndex.load(index_path(paths[0])).sizes
        got = list(zip(found.widths.tolist(), found.heights.tolist()))
        assert got == [expected[i % DISTINCT] for i in range(args.per_shard)], "sizes differ from Pillow's"
        indexes = [ShardIndex.load(index_path(p)) if index_file(p, force=True).problem is None else None for p in paths]

        def plain() -> None:
            for path in paths:
                index_file(path, force=True)

        def with_sizes() -> None:
            for path in paths:
                index_file(path, force=True, sizes="jpg")

        def scan() -> None:
            for index, path in zip(indexes, paths):
                measure_local_sizes(index, path, "jpg")

        def added() -> tuple[float, float]:
            plain()  # not timed: leaves current indexes without sizes
            start, cpu = time.perf_counter(), time.process_time()
            for path in paths:
                assert index_file(path, sizes="jpg").sizes_added
            return time.perf_counter() - start, time.process_time() - cpu

        ways = {"plain index": plain, "index with sizes": with_sizes, "header scan": scan, "sizes added": added}
        seconds: dict[str, list[float]] = {name: [] for name in ways}
        cpu_seconds: dict[str, list[float]] = {name: [] for name in ways}
        for _ in range(args.repeat):  # interleaved, so a change of load hits every one alike
            for name, run in ways.items():
                start, cpu = time.perf_counter(), time.process_time()
                took = run()
                wall, used = took if took is not None else (time.perf_counter() - start, time.process_time() - cpu)
                seconds[name].append(wall)
                cpu_seconds[name].append(used)
        load = os.getloadavg()
        print(f"{args.shards} shards x {args.per_shard} samples ({samples:,} JPEGs, {data_bytes / samples / 1000:.1f} kB each "
              f"on average), one process, CPUs {sorted(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else '?'}; "
              f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
        print(f"samples per second, median of {args.repeat}: wall, CPU")
        medians = {name: statistics.median(values) for name, values in seconds.items()}
        for name, value in medians.items():
            cpu = statistics.median(cpu_seconds[name])
            print(f"  {name:18s} {samples / value:>10,.0f}/s {samples / cpu:>10,.0f}/s   {value * 1000:7.1f} ms for all")
        extra = medians["index with sizes"] - medians["plain index"]
        print(f"  sizes add {extra * 1000:.1f} ms to a forced index ({extra / medians['plain index'] * 100:.0f}%)")
        for words in (["--sizes", "jpg"], []):
            command = [sys.executable, "-m", "hydrax", "shards", "index", "-q", "--force", *words, *paths]
            start = time.perf_counter()
            subprocess.run(command, check=True)
            print(f"  `hydrax shards index --force {' '.join(words)}` (a new process): {time.perf_counter() - start:.2f} s")


if __name__ == "__main__":
    main()
