"""Benchmark: tar shard indexing, hydrax's header-scanning kernel against Python's ``tarfile``.

    python tools/bench_shards.py [--samples 20000] [--payload 4096] [--repeat 5]

Writes one shard of ``--samples`` samples (a ``.jpg`` of about ``--payload`` bytes and a
``.cls``), then times, alternately, ``tarfile`` listing its members and hydrax scanning the
headers (``hydrax.shards.scan_members``) and grouping samples, from the page cache. Prints
samples/s, MB/s of shard, and the ratio. (Sample read rates, S3 and end-to-end rates come with
the rest of the shard backend.)
"""

from __future__ import annotations

import argparse
import io
import mmap
import os
import statistics
import tarfile
import tempfile
import time

from hydrax.shards import group_samples, scan_members


def write_shard(path: str, samples: int, payload: int) -> None:
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        blob = os.urandom(payload)
        for i in range(samples):
            for field, data in (("cls", str(i % 1000).encode()), ("jpg", blob[: payload - (i % 97)])):
                info = tarfile.TarInfo(f"sample{i:08d}.{field}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


def with_tarfile(path: str) -> int:
    with tarfile.open(path) as tar:
        return sum(1 for m in tar.getmembers() if m.isreg())


def with_hydrax(path: str) -> int:
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        return len(group_samples(scan_members(mapped, path)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=20000)
    parser.add_argument("--payload", type=int, default=4096)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "shard-000000.tar")
        write_shard(path, args.samples, args.payload)
        size = os.path.getsize(path)
        times: dict[str, list[float]] = {"tarfile": [], "hydrax": []}
        for _ in range(args.repeat):
            for name, func in (("tarfile", with_tarfile), ("hydrax", with_hydrax)):
                started = time.perf_counter()
                func(path)
                times[name].append(time.perf_counter() - started)
    print(f"shard: {args.samples} samples, {2 * args.samples} members, {size / 1e6:.1f} MB; medians of {args.repeat}")
    print(f"{'indexer':8} | {'samples/s':>12} | {'MB/s':>9} | {'vs tarfile':>10}")
    base = statistics.median(times["tarfile"])
    for name, runs in times.items():
        t = statistics.median(runs)
        print(f"{name:8} | {args.samples / t:12,.0f} | {size / 1e6 / t:9,.0f} | {base / t:10.1f}")


if __name__ == "__main__":
    main()
