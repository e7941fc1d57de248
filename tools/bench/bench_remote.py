"""Remote shards at real latency: hydrax's Dataloader against webdataset streaming, set-up time,
and bytes read per host.

moto's S3 server runs in its own process on 127.0.0.1, behind tests/support/netproxy.py adding a fixed
delay to every request (real S3 first-byte latency is 10-50 ms). For each delay:

- **stream**: webdataset's pipeline streaming every shard once in one process (urllib GETs
  through the proxy), the baseline the goal is stated against;
- **hydrax shardwise**: a Dataloader over ``ShardSet("s3://...")`` with 2 (and 4) loader
  processes in ``shardwise`` order, read-ahead on (whole shards streamed);
- **hydrax random**: fully shuffled order. With the default read-ahead budget the look-ahead
  covers the epoch and whole shards are streamed; with an 8 MiB budget every sample is a ranged
  read, against the ranged-GET ceiling of the server itself (moto copies the whole object for
  every ranged GET, so that ceiling is measured directly: many ranged GETs in flight, without
  the proxy);
- **bytes per host**: with ``shard_partitions=4``, what each of P = 1, 2, 4 hosts downloads in
  one epoch, as a share of the dataset (the hosts run one after another here);
- **set-up**: ``ShardSet`` over 1,000 tiny shards, through the proxy, from an empty cache: with
  the folder summary ``hydrax shards index`` writes, from a manifest, and from the index objects
  alone (one GET each; moto serves about 300 requests/s, so this measures moto).

Every loader function copies the sample's bytes into the batch slot. Samples/s are over one whole
epoch, from entering the Dataloader (or starting webdataset's pipeline) to its last sample, the
ShardSet's set-up excluded; medians of ``--repeat`` runs, interleaved.

    python tools/bench/bench_remote.py [--delays 0.02 0.05] [--repeat 3] [--quick]

``--budgets`` instead compares read-ahead budgets with the defaults a user gets (issue 24's set:
``--shards 32 --per-shard 512 --sample-bytes 100000``): ``shardwise`` with the self-sized budget
against 0.x's fixed 1 GiB, and fully shuffled with the self-sized budget against 4 GiB given by
hand (1 GiB there falls to a ranged request per sample, minutes per epoch), with each run's
first-batch time and the load average.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

# the delaying proxy is a test helper: tests/support/netproxy.py
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from support.netproxy import Proxy  # noqa: E402

KEYS = {"access_key_id": "testing", "secret_access_key": "testing", "region": "us-east-1"}
BUCKET = "bench"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_moto() -> tuple[subprocess.Popen, int]:
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(200):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/moto-api/", timeout=1).read()
            return process, port
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("moto's server did not start")


def boto(endpoint: str):
    import boto3

    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="testing",
                        aws_secret_access_key="testing")


def make_shards(folder: str, count: int, per_shard: int, sample_bytes: int, prefix: str) -> list[str]:
    from hydrax.shards import ShardWriter

    rng = np.random.default_rng(0)
    with ShardWriter(os.path.join(folder, f"{prefix}-%05d.tar"), maxcount=per_shard, index=False) as writer:
        for i in range(count * per_shard):
            writer.write({"__key__": f"{prefix}{i:07d}", "cls": str(i % 1000), "bin": rng.bytes(sample_bytes)})
    return writer.paths


def upload(client, paths: list[str], key_prefix: str) -> list[str]:
    from concurrent.futures import ThreadPoolExecutor

    def one(path):
        client.upload_file(path, BUCKET, f"{key_prefix}/{os.path.basename(path)}")

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(one, paths))
    return [f"s3://{BUCKET}/{key_prefix}/{os.path.basename(p)}" for p in paths]


# -- the contenders ------------------------------------------------------------------------------

def webdataset_stream(urls: list[str], endpoint: str) -> float:
    """Samples/s of webdataset's tar pipeline over every shard, streamed with plain GETs."""
    import webdataset as wds

    http = [endpoint + "/" + url[len("s3://"):] for url in urls]

    def open_streams(source):
        for sample in source:
            yield dict(url=sample["url"], stream=urllib.request.urlopen(sample["url"]))

    pipeline = wds.DataPipeline(wds.SimpleShardList(http), open_streams, wds.tarfile_to_samples())
    started = time.perf_counter()
    n = 0
    sink = np.empty(1 << 20, np.uint8)
    for sample in pipeline:
        data = sample["bin"]
        sink[: len(data)] = np.frombuffer(data, np.uint8)
        n += 1
    return n / (time.perf_counter() - started)


def copy_sample(sample, arrays, seed):
    data = sample["bin"]
    arrays["bin"][: len(data)] = np.frombuffer(data, np.uint8)


def hydrax_epoch(urls: list[str], options, cache: str, loaders: int, order: str, sample_bytes: int,
                 batch: int = 32, readahead=None, timings: dict | None = None, **extra) -> tuple[float, int]:
    """(items/s over one epoch, bytes read ahead); ``timings`` gets the first batch's seconds and
    the budget the ShardSet used."""
    import jax.numpy as jnp

    from hydrax import Dataloader, DataGroup
    from hydrax.shards import ShardSet

    dataset = ShardSet(urls, s3=options, cache_dir=cache, readahead=readahead)
    kwargs = {"shuffle_later": "shardwise"} if order == "shardwise" else {"shuffle_first": True}
    kwargs.update(extra)
    group = DataGroup(batch, dataset, loader_arrays={"bin": ((sample_bytes,), np.uint8, jnp.uint8)}, **kwargs)
    n = 0
    started = time.perf_counter()  # the whole epoch, workers' start and the first requests included
    first = None
    with Dataloader(copy_sample, group, loader_count=loaders, end_at=("epoch", 1), timeout_sec=300) as loader:
        for b in loader:
            first = first or time.perf_counter() - started
            n += len(b)
            del b
    elapsed = time.perf_counter() - started
    stats = dataset.readahead_stats
    if timings is not None:
        timings.update(first=first, budget=stats["budget"], peak=stats["held_peak"], load=os.getloadavg()[0])
    dataset.close()
    return n / elapsed, stats["bytes"]


def ranged_ceiling(urls: list[str], endpoint: str, sample_bytes: int, shard_bytes: int, count: int = 600) -> float:
    """Ranged GETs/s the server itself serves, 32 in flight, no proxy."""
    import asyncio

    from hydrax.shards import S3Options
    from hydrax.shards.options import StoreOptions
    from hydrax.shards.router import store_for
    from hydrax.shards.store import gather_limited

    options = StoreOptions(s3=S3Options(endpoint_url=endpoint, **KEYS))
    rng = np.random.default_rng(1)
    picks = [(urls[rng.integers(len(urls))], int(rng.integers(0, shard_bytes - sample_bytes))) for _ in range(count)]

    async def run():
        return await gather_limited([lambda u=u, o=o: store_for(u, options).read_async(u, o, sample_bytes) for u, o in picks], 32)

    started = time.perf_counter()
    asyncio.run(run())
    return count / (time.perf_counter() - started)


def bytes_per_host(urls: list[str], options, cache: str, proxy: Proxy, sample_bytes: int, total: int) -> dict[int, list[float]]:
    import jax.numpy as jnp

    from hydrax import Dataloader, DataGroup
    from hydrax.shards import ShardSet

    shares = {}
    for hosts in (1, 2, 4):
        fractions = []
        for host in range(hosts):
            dataset = ShardSet(urls, s3=options, cache_dir=cache)
            group = DataGroup(32, dataset, loader_arrays={"bin": ((sample_bytes,), np.uint8, jnp.uint8)},
                              shuffle_later="shardwise", shard_window=2, shard_partitions=4)
            proxy.clear()
            with Dataloader(copy_sample, group, loader_count=2, end_at=("epoch", 1), process_index=host,
                            process_count=hosts, timeout_sec=300) as loader:
                for b in loader:
                    del b
            dataset.close()
            fractions.append(proxy.stats()["body_bytes_down"] / total)
        shares[hosts] = fractions
    return shares


def setup_times(client, endpoint: str, proxy: Proxy, tmp: str, shards: int) -> dict[str, float]:
    from hydrax.shards import S3Options, ShardSet
    from hydrax.shards.manifest import write_manifest
    from hydrax.shards.options import StoreOptions
    from hydrax.shards.publish import publish_indexes

    paths = make_shards(tmp, shards, 4, 256, "tiny")
    urls = upload(client, paths, "tiny")
    direct = StoreOptions(s3=S3Options(endpoint_url=endpoint, **KEYS))
    entries = publish_indexes(urls, direct)
    write_manifest(entries, f"s3://{BUCKET}/tiny/dataset.json", direct)
    options = S3Options(endpoint_url=proxy.url, **KEYS)
    times = {}
    cases = (("folder summary", f"s3://{BUCKET}/tiny/tiny-*.tar"), ("manifest", f"s3://{BUCKET}/tiny/dataset.json"),
             ("index objects", f"s3://{BUCKET}/tiny/tiny-*.tar"))
    for name, spec in cases:
        if name == "index objects":  # without the summary: one GET per index object
            client.delete_object(Bucket=BUCKET, Key="tiny/hydrax-index.json")
        cache = tempfile.mkdtemp(dir=tmp)
        proxy.clear()
        started = time.perf_counter()
        dataset = ShardSet(spec, s3=options, cache_dir=cache)
        times[name] = time.perf_counter() - started
        times[name + " requests"] = proxy.stats()["requests"]
        assert len(dataset) == shards * 4
    return times


def budget_runs(urls: list[str], port: int, tmp: str, args) -> None:
    """``--budgets``: the self-sized read-ahead budget against fixed ones, runs interleaved."""
    from hydrax.shards import ReadAhead, S3Options

    print("| delay | order, budget | samples/s | first batch | budget | held at most | load average | runs |")
    print("|---|---|---|---|---|---|---|---|")
    for delay in args.delays:
        with Proxy("127.0.0.1", port, delay=delay) as proxy:
            options = S3Options(endpoint_url=proxy.url, **KEYS)
            cases = {"shardwise, 1 GiB (0.x default)": ("shardwise", ReadAhead(max_bytes=1 << 30)),
                     "shardwise, self-sized (default)": ("shardwise", None),
                     "random, 4 GiB by hand": ("random", ReadAhead(max_bytes=4 << 30)),
                     "random, self-sized (default)": ("random", None)}
            results: dict[str, list[tuple[float, dict]]] = {name: [] for name in cases}
            for _ in range(args.repeat):
                for name, (order, readahead) in cases.items():
                    timings: dict = {}
                    rate, _ = hydrax_epoch(urls, options, tempfile.mkdtemp(dir=tmp), 2, order, args.sample_bytes,
                                           readahead=readahead, timings=timings)
                    results[name].append((rate, timings))
            for name, runs in results.items():
                middle = sorted(runs, key=lambda r: r[0])[len(runs) // 2]
                rate, timings = middle
                print(f"| {delay * 1000:.0f} ms | {name} | {rate:,.0f} | {timings['first']:.2f} s | {timings['budget'] / 2**30:.2f} GiB | "
                      f"{timings['peak'] / 2**30:.2f} GiB | {timings['load']:.2f} | {', '.join(f'{r:,.0f}' for r, _ in runs)} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--delays", type=float, nargs="+", default=[0.02, 0.05])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--per-shard", type=int, default=250)
    parser.add_argument("--sample-bytes", type=int, default=40_000)
    parser.add_argument("--setup-shards", type=int, default=1000)
    parser.add_argument("--quick", action="store_true", help="one repeat, no 4-loader or random runs")
    parser.add_argument("--setup-only", action="store_true", help="only the set-up times")
    parser.add_argument("--budgets", action="store_true", help="only the read-ahead budgets: self-sized against fixed")
    args = parser.parse_args()
    if args.quick:
        args.repeat = 1

    from hydrax.shards import ReadAhead, S3Options

    moto, port = start_moto()
    endpoint = f"http://127.0.0.1:{port}"
    client = boto(endpoint)
    client.create_bucket(Bucket=BUCKET)
    tmp = tempfile.mkdtemp(prefix="hydrax-bench-remote-")
    try:
        if args.setup_only:
            with Proxy("127.0.0.1", port, delay=args.delays[0]) as proxy:
                setup = setup_times(client, endpoint, proxy, tmp, args.setup_shards)
            print(", ".join(f"{name} {setup[name]:.2f} s ({setup[name + ' requests']} requests)"
                            for name in ("folder summary", "manifest", "index objects")))
            return
        paths = make_shards(tmp, args.shards, args.per_shard, args.sample_bytes, "train")
        urls = upload(client, paths, "train")
        from hydrax.shards.options import StoreOptions
        from hydrax.shards.publish import publish_indexes

        publish_indexes(urls, StoreOptions(s3=S3Options(endpoint_url=endpoint, **KEYS)))
        total = sum(os.path.getsize(p) for p in paths)
        shard_bytes = min(os.path.getsize(p) for p in paths)
        print(f"{len(urls)} shards x {args.per_shard} samples of {args.sample_bytes} bytes ({total / 1e6:.1f} MB) in moto's S3 server")
        if args.budgets:
            hydrax_epoch(urls[:1], S3Options(endpoint_url=endpoint, **KEYS), tempfile.mkdtemp(dir=tmp), 2, "shardwise", args.sample_bytes)
            budget_runs(urls, port, tmp, args)
            return
        ceiling = statistics.median(ranged_ceiling(urls, endpoint, args.sample_bytes, shard_bytes) for _ in range(args.repeat))
        print(f"moto's own ranged-GET ceiling (32 in flight, no proxy): {ceiling:,.0f} requests/s")
        # An untimed run first: the fork server hydrax starts its workers from (once a process has
        # used a remote store) starts here, as it would once per training script.
        hydrax_epoch(urls[:1], S3Options(endpoint_url=endpoint, **KEYS), tempfile.mkdtemp(dir=tmp), 2, "shardwise", args.sample_bytes)
        rows = []
        for delay in args.delays:
            with Proxy("127.0.0.1", port, delay=delay) as proxy:
                options = S3Options(endpoint_url=proxy.url, **KEYS)
                cases = {"webdataset stream, 1 process": lambda: webdataset_stream(urls, proxy.url)}
                for loaders in ((2,) if args.quick else (2, 4)):
                    cases[f"hydrax shardwise, {loaders} loaders"] = (
                        lambda n=loaders, options=options: hydrax_epoch(urls, options, tempfile.mkdtemp(dir=tmp), n, "shardwise", args.sample_bytes)[0])
                if not args.quick:
                    cases["hydrax random order, 2 loaders"] = (
                        lambda options=options: hydrax_epoch(urls, options, tempfile.mkdtemp(dir=tmp), 2, "random", args.sample_bytes)[0])
                    # A read-ahead budget far below the dataset: shuffled samples read one ranged request each.
                    small = ReadAhead(max_bytes=8 << 20)
                    cases["hydrax random order, 2 loaders, 8 MiB read-ahead (ranged reads)"] = (
                        lambda options=options, small=small: hydrax_epoch(urls, options, tempfile.mkdtemp(dir=tmp), 2, "random",
                                                                          args.sample_bytes, readahead=small)[0])
                results = {name: [] for name in cases}
                for _ in range(args.repeat):
                    for name, case in cases.items():
                        results[name].append(case())
                base = statistics.median(results["webdataset stream, 1 process"])
                for name, values in results.items():
                    rate = statistics.median(values)
                    rows.append((f"{delay * 1000:.0f} ms", name, rate, rate / base, values))
                if delay == args.delays[0]:
                    shares = bytes_per_host(urls, options, tempfile.mkdtemp(dir=tmp), proxy, args.sample_bytes, total)
                    setup = setup_times(client, endpoint, proxy, tmp, args.setup_shards)
        print()
        print("| delay | reader | samples/s | vs webdataset | runs |")
        print("|---|---|---|---|---|")
        for delay, name, rate, ratio, values in rows:
            print(f"| {delay} | {name} | {rate:,.0f} | {ratio:.2f}x | {', '.join(f'{v:,.0f}' for v in values)} |")
        print()
        print(f"random order against the server's ranged-GET ceiling ({ceiling:,.0f}/s): see the rows above")
        print()
        print("| hosts (shard_partitions=4) | bytes read per host / dataset |")
        print("|---|---|")
        for hosts, fractions in shares.items():
            print(f"| {hosts} | {', '.join(f'{f:.2f}' for f in fractions)} (ideal {1 / hosts:.2f}) |")
        print()
        print(f"set-up, {args.setup_shards} shards, {args.delays[0] * 1000:.0f} ms proxy, empty cache: "
              + ", ".join(f"{name} {setup[name]:.2f} s ({setup[name + ' requests']} requests)"
                          for name in ("folder summary", "manifest", "index objects")))
    finally:
        moto.kill()
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
