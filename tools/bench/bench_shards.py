"""Benchmark: tar shard indexing, hydrax's header-scanning kernel against Python's ``tarfile``.

    python tools/bench/bench_shards.py [--samples 20000] [--payload 4096] [--repeat 5]

Part 1 writes one shard of ``--samples`` samples (a ``.jpg`` of about ``--payload`` bytes and a
``.cls``), then times, alternately, from the page cache: ``tarfile`` listing its members; hydrax
indexing it the Python way (``scan_members``, ``group_samples``, ``ShardIndex.from_samples``:
how ``build_index`` worked before the ``index_tar`` kernel); and ``build_index`` itself (headers
and grouping in one kernel pass). Then (``--open-shards N``, default 3000) it writes N small
shards with their indexes and times a second ``ShardSet`` over all of them, with the indexes in
the old ``.npz`` format (v1) and in the current one (v2), alternately; and (``--index-shards N``,
default 200) times ``hydrax shards index --force`` over N shards of 5,000 samples with
``--workers 1`` and ``--workers 2``, alternately.

Part 2 reads every sample's fields from a ShardSet (in order, and in a random order) and reports
samples/s and MB/s. Then it writes a ``--s3-samples`` sample shard (default 2000, about 11 MB),
uploads it to a local S3-protocol server (moto's, in its own process on 127.0.0.1) and reads it
there: one process sample by sample, then a Dataloader with ``--s3-workers`` loader processes.
Each sample is one ranged GET. (moto copies the whole object for every ranged GET, so its cost
grows with the object: about 3 ms at 1 MB and 65 ms at 100 MB here; hence the small shard.)

Part 3 (``--jpegs N``, default 4096) writes N generated 320x320 q90 JPEGs into 8 shards and
times, end to end, the ``webdataset`` package iterating them with a Pillow decode (draft mode,
center crop 256x256; webdataset parallelises only through a torch DataLoader, so it runs in
one process here) against a hydrax DataGroup over a ShardSet with the same decode, with 1 and 2
loader processes, interleaved, up to 3 times.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import multiprocessing
import io
import mmap
import os
import statistics
import tarfile
import tempfile
import time

from hydrax.shards import ShardIndex, build_index, group_samples, scan_members


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


def with_python_grouping(path: str) -> int:
    """An index the way build_index made it before the index_tar kernel."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        stat = os.fstat(f.fileno())
        return len(ShardIndex.from_samples(group_samples(scan_members(mapped, path)), stat.st_size, stat.st_mtime_ns))


def with_kernel(path: str) -> int:
    return len(build_index(path))


def open_many(folder: str, count: int, repeat: int) -> dict[str, list[float]]:
    """Seconds of a second ``ShardSet`` over ``count`` small shards, their indexes in each format."""
    import shutil

    from hydrax.shards import ShardSet, ShardWriter, index_path
    from hydrax.shards.indexfile import _to_v1_bytes

    v2 = os.path.join(folder, "open-v2")
    v1 = os.path.join(folder, "open-v1")
    os.makedirs(v2)
    with ShardWriter(os.path.join(v2, "s-%06d.tar"), maxcount=10) as writer:
        for i in range(10 * count):
            writer.write({"__key__": f"k{i:08d}", "jpg": b"j" * (100 + i % 50), "cls": str(i % 10)})
    shutil.copytree(v2, v1)  # copy2 keeps the modification times the indexes name
    for shard in writer.paths:
        twin = os.path.join(v1, os.path.basename(shard))
        with open(index_path(twin), "wb") as f:
            f.write(_to_v1_bytes(ShardIndex.load(index_path(shard))))
    times: dict[str, list[float]] = {"v1 (.npz)": [], "v2": []}
    # write_index=False: open_index would otherwise rewrite the v1 indexes as v2
    for folder_ in (v1, v2):
        ShardSet(os.path.join(folder_, "*.tar"), write_index=False)  # the first open; the page cache holds the files after it
    for _ in range(repeat):
        for folder_, name in ((v1, "v1 (.npz)"), (v2, "v2")):
            started = time.perf_counter()
            dataset = ShardSet(os.path.join(folder_, "*.tar"), write_index=False)
            times[name].append(time.perf_counter() - started)
            assert len(dataset) == 10 * count
    return times


def index_command(folder: str, count: int, repeat: int) -> tuple[int, dict[int, list[float]]]:
    """Shard size, and seconds of ``hydrax shards index --force`` over ``count`` shards by number of workers."""
    import subprocess
    import sys

    pattern = os.path.join(folder, "index-cmd", "s-%04d.tar")
    os.makedirs(os.path.dirname(pattern))
    write_shard(pattern % 0, 5000, 1024)
    for i in range(1, count):
        os.link(pattern % 0, pattern % i)  # the same bytes: indexing reads each name afresh
    times: dict[int, list[float]] = {1: [], 2: []}
    for _ in range(repeat):
        for workers in times:
            started = time.perf_counter()
            subprocess.run([sys.executable, "-m", "hydrax", "shards", "index", "--force", "-q", "--workers", str(workers),
                            os.path.join(os.path.dirname(pattern), "*.tar")], check=True)
            times[workers].append(time.perf_counter() - started)
    return os.path.getsize(pattern % 0), times


def read_rates(path: str, repeat: int) -> list[tuple[str, float, float]]:
    import random

    from hydrax.shards import ShardSet

    dataset = ShardSet(path)
    order = list(range(len(dataset)))
    rows = []
    for name, indices in (("in order", order), ("random order", random.Random(0).sample(order, len(order)))):
        best = None
        for _ in range(repeat):
            started = time.perf_counter()
            total = 0
            for i in indices:
                sample = dataset[i]
                for field in sample:
                    total += len(sample[field])
            elapsed = time.perf_counter() - started
            best = elapsed if best is None else min(best, elapsed)
        rows.append((name, len(indices) / best, total / 1e6 / best))
    return rows


def load_sizes(sample, arrays, seed):
    arrays["bytes"][...] = sum(len(sample[field]) for field in sample)


def s3_read_rates(folder: str, samples: int, payload: int, workers: int) -> tuple[float, list[tuple[str, float, float]]]:
    """Index build seconds, then (reader, samples/s, MB/s) over a shard of ``samples`` samples
    in a local S3-protocol server (moto's, in its own process on 127.0.0.1)."""
    import socket
    import subprocess
    import sys

    import boto3
    import jax.numpy as jnp
    import numpy as np

    from hydrax import DataGroup, Dataloader
    from hydrax.shards import S3Options, ShardSet

    path = os.path.join(folder, "s3-000000.tar")
    write_shard(path, samples, payload)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
                break
            except OSError:
                time.sleep(0.05)
        endpoint = f"http://127.0.0.1:{port}"
        options = S3Options(endpoint_url=endpoint, region="us-east-1", access_key_id="bench", secret_access_key="bench")
        client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="bench", aws_secret_access_key="bench")
        client.create_bucket(Bucket="bench")
        client.upload_file(path, "bench", "shard-000000.tar")
        with tempfile.TemporaryDirectory() as cache:
            started = time.perf_counter()
            dataset = ShardSet("s3://bench/shard-000000.tar", s3=options, cache_dir=cache)
            indexed = time.perf_counter() - started
            megabytes = sum(n for sample in dataset for _, n in sample.fields.values()) / 1e6
            started = time.perf_counter()
            for sample in dataset:
                for field in sample:
                    sample[field]
            elapsed = time.perf_counter() - started
            rows = [("1 process", len(dataset) / elapsed, megabytes / elapsed)]
            group = DataGroup(64, dataset, loader_arrays={"bytes": ((), np.int64, jnp.int64)})
            started = time.perf_counter()
            with Dataloader(load_sizes, group, loader_count=workers, end_at=("epoch", 1)) as loader:
                seen = 0
                for batch in loader:
                    seen += len(batch)
                    del batch
            elapsed = time.perf_counter() - started
            rows.append((f"Dataloader, {workers} loader processes", seen / elapsed, megabytes * seen / len(dataset) / elapsed))
    finally:
        server.terminate()
        server.wait()
    return indexed, rows


def decode(data):
    import numpy as np
    from PIL import Image

    image = Image.open(io.BytesIO(data))
    image.draft("RGB", (256, 256))
    image = image.convert("RGB")
    left, top = (image.width - 256) // 2, (image.height - 256) // 2
    return np.asarray(image.crop((left, top, left + 256, top + 256)))


def load_jpeg(sample, arrays, seed):
    arrays["image"][...] = decode(bytes(sample["jpg"]))


def write_jpeg_shards(folder: str, count: int) -> str:
    import numpy as np
    from PIL import Image

    from hydrax.shards import ShardWriter

    rng = np.random.default_rng(0)
    small = rng.integers(0, 255, (count, 10, 10, 3), dtype=np.uint8)
    with ShardWriter(os.path.join(folder, "img-%02d.tar"), maxcount=-(-count // 8)) as writer:
        for i in range(count):
            buffer = io.BytesIO()
            Image.fromarray(small[i]).resize((320, 320), Image.BICUBIC).save(buffer, "JPEG", quality=90)
            writer.write({"__key__": f"img{i:06d}", "jpg": buffer.getvalue(), "cls": str(i % 10)})
    return os.path.join(folder, "img-{00..07}.tar")


def webdataset_rate(pattern: str, tuned_malloc: bool = False) -> float:
    """items/s of the ``webdataset`` package reading ``pattern`` with :func:`decode`, in this process."""
    import webdataset as wds

    if tuned_malloc:
        from hydrax.procs.processes import tune_malloc

        tune_malloc()
    started = time.perf_counter()
    seen = 0
    for sample in wds.WebDataset(pattern, shardshuffle=False):
        decode(sample["jpg"])
        seen += 1
    return seen / (time.perf_counter() - started)


def glibc_default_malloc() -> None:
    """Undo hydrax's worker malloc settings: glibc's initial thresholds (128 KiB)."""
    import ctypes

    libc = ctypes.CDLL(None)
    libc.mallopt(-3, 128 * 1024)  # M_MMAP_THRESHOLD
    libc.mallopt(-1, 128 * 1024)  # M_TRIM_THRESHOLD


def end_to_end(pattern: str, repeat: int) -> list[tuple[str, list[float]]]:
    """items/s of each way of reading ``pattern`` with the same decode, runs interleaved."""
    import jax.numpy as jnp
    import numpy as np
    from hydrax import DataGroup, Dataloader
    from hydrax.shards import ShardSet

    dataset = ShardSet(pattern)
    arrays = {"image": ((256, 256, 3), np.uint8, jnp.uint8)}
    # One untimed run first: JAX starts, and with it the fork server later runs start from, as in
    # a training script; otherwise the first timed run would pay a one-time process start-up.
    with Dataloader(load_jpeg, DataGroup(64, dataset[:64], loader_arrays=arrays), loader_count=1, end_at=("epoch", 1)) as loader:
        for batch in loader:
            del batch
    time.sleep(2)  # the fork server finishes its imports, as it would during model set-up

    def hydrax_run(workers: int, startup=None) -> float:
        group = DataGroup(64, dataset, loader_arrays=arrays, shuffle_later="repeat")
        started = time.perf_counter()
        seen = 0
        with Dataloader(load_jpeg, group, loader_count=workers, end_at=("epoch", 1), startup_func=startup) as loader:
            for batch in loader:
                seen += len(batch)
                del batch
        return seen / (time.perf_counter() - started)

    # A helper process for webdataset with hydrax's worker malloc settings: the main process keeps its own.
    helper = concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("forkserver"))
    runs = [
        ("webdataset, 1 process", lambda: webdataset_rate(pattern)),
        ("webdataset, hydrax's malloc settings", lambda: helper.submit(webdataset_rate, pattern, True).result()),
        ("hydrax, 1 loader process", lambda: hydrax_run(1)),
        ("hydrax, 2 loader processes", lambda: hydrax_run(2)),
        ("hydrax, 2, glibc malloc defaults", lambda: hydrax_run(2, glibc_default_malloc)),
    ]
    rates: dict[str, list[float]] = {name: [] for name, _ in runs}
    with helper:
        for _ in range(repeat):
            for name, run in runs:
                rates[name].append(run())
    return list(rates.items())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=20000)
    parser.add_argument("--payload", type=int, default=4096)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--open-shards", type=int, default=3000, help="small shards opened by a ShardSet (0 skips it)")
    parser.add_argument("--index-shards", type=int, default=200, help="shards for `hydrax shards index --workers` (0 skips it)")
    parser.add_argument("--jpegs", type=int, default=4096, help="samples for the end-to-end part (0 skips it)")
    parser.add_argument("--s3-samples", type=int, default=2000, help="samples of the shard read through local S3 (0 skips it)")
    parser.add_argument("--s3-workers", type=int, default=4, help="loader processes reading from S3")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:  # everything written here goes when done
        path = os.path.join(folder, "shard-000000.tar")
        write_shard(path, args.samples, args.payload)
        size = os.path.getsize(path)
        indexers = (("tarfile", with_tarfile), ("hydrax, Python grouping (before)", with_python_grouping),
                    ("hydrax build_index (index_tar)", with_kernel))
        times: dict[str, list[float]] = {name: [] for name, _ in indexers}
        for _ in range(args.repeat):
            for name, func in indexers:
                started = time.perf_counter()
                func(path)
                times[name].append(time.perf_counter() - started)
        opened = open_many(folder, args.open_shards, args.repeat) if args.open_shards else None
        commands = index_command(folder, args.index_shards, max(1, min(args.repeat, 3))) if args.index_shards else None
        reads = read_rates(path, args.repeat)
        remote = s3_read_rates(folder, args.s3_samples, args.payload, args.s3_workers) if args.s3_samples else None
        if args.jpegs:
            jpeg_rows = end_to_end(write_jpeg_shards(folder, args.jpegs), max(1, min(args.repeat, 3)))
    print(f"shard: {args.samples} samples, {2 * args.samples} members, {size / 1e6:.1f} MB; medians of {args.repeat}")
    print(f"{'indexer':32} | {'seconds':>8} | {'samples/s':>12} | {'MB/s':>9} | {'vs tarfile':>10}")
    base = statistics.median(times["tarfile"])
    for name, runs in times.items():
        t = statistics.median(runs)
        print(f"{name:32} | {t:8.4f} | {args.samples / t:12,.0f} | {size / 1e6 / t:9,.0f} | {base / t:10.1f}")
    if opened:
        print(f"\nShardSet over {args.open_shards} local shards of 10 samples, indexes present (second open; medians of {args.repeat}):")
        for name, runs in opened.items():
            t = statistics.median(runs)
            print(f"  indexes {name:10} {t:7.3f} s  {t / args.open_shards * 1e6:7.1f} us per shard")
    if commands:
        shard_size, commands = commands
        print(f"\nhydrax shards index --force over {args.index_shards} shards of 5,000 samples, {shard_size / 1e6:.1f} MB each "
              f"(one file, hard-linked; medians of {len(commands[1])}):")
        for workers, runs in commands.items():
            print(f"  --workers {workers}  {statistics.median(runs):7.2f} s")
    print("\nreading every field of every sample from the local shard (best of the repeats):")
    for name, rate, mbps in reads:
        print(f"  {name:13} {rate:12,.0f} samples/s {mbps:9,.0f} MB/s")
    if remote:
        indexed, rows = remote
        print(f"\nfrom a local S3 server, a {args.s3_samples}-sample shard (index built from one GET in {indexed:.2f} s; one ranged GET per sample):")
        for name, rate, mbps in rows:
            print(f"  {name:33} {rate:9,.0f} samples/s {mbps:7,.1f} MB/s")
    if args.jpegs:
        runs = len(jpeg_rows[0][1])
        print(f"\nend to end, {args.jpegs} JPEG samples in 8 shards, decode + crop to 256x256 (median of {runs} interleaved runs):")
        reference = statistics.median(jpeg_rows[0][1])
        for name, rates in jpeg_rows:
            rate = statistics.median(rates)
            spread = ", ".join(f"{r:,.0f}" for r in rates)
            print(f"  {name:36} {rate:9,.0f} items/s {rate / reference:6.2f}x   (runs: {spread})")


if __name__ == "__main__":
    main()
