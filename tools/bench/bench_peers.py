"""Object storage with the defaults: hydrax against LitData and MosaicML Streaming, as a new user
would run each, through a store 20-50 ms away.

The same samples (``--shards`` tar shards of ``--per-shard`` samples of ``--sample-bytes``
random bytes) are served three ways from one folder by ``rangeserver.py`` (a file server that
speaks enough S3 for all three loaders and costs little CPU, unlike moto, which copies the whole
object for every ranged GET): WebDataset tars with hydrax's index objects and folder summary
(written by ``publish_indexes`` through the server), LitData's optimized chunks and MDS shards
(converted by ``peers/run_peer.py``). ``tests/support/netproxy.py`` adds the delay in front of it,
in a process of its own, as the server is: nothing of the store's side shares a process (or the
GIL) with a loader.

Every run is a new process, from an empty cache (in ``/dev/shm``, where hydrax's read-ahead
keeps its files too; the page cache is flushed between runs), 2 loader processes each, one epoch in which
every sample must arrive exactly once; its clock starts when the dataset is made (imports
done, as in a training script) and stops at the last batch, so set-up, the workers' start and
the first requests are included. The first batch's time is from the same start. Runs are
interleaved, ``--repeat`` of each, each repeat starting one case later than the last and every
run after ``--settle`` seconds; the table gives medians and every run (in the order run), with
the load average at each run's end.

Contenders (the peers run in their own venv, see ``peers/README.md``):

- hydrax ``shardwise`` and fully shuffled (``shuffle_first=True``), defaults: the read-ahead
  sizes itself; ``ShardSet("s3://bench/train/*.tar")`` sets up from the folder summary;
- hydrax ``shardwise`` with JAX initialised just before the dataset is made (the fork server,
  started then with the script's imports, is what the workers start from);
- hydrax fully shuffled with read-ahead budgets given by hand (``--budgets 256 1024``: MiB), what
  global shuffling costs when the budget cannot hold the data;
- LitData 0.2.76 ``StreamingDataset`` + ``StreamingDataLoader``, with and without ``shuffle``;
- MosaicML Streaming 0.13.0 ``shuffle=True`` (``--streaming``);
- webdataset's tar pipeline in one process, plain GETs (``--webdataset``).

    python tools/bench/bench_peers.py [--shards 32 --per-shard 512 --sample-bytes 100000]
        [--delays 0.02 0.05] [--repeat 3] [--peers-python /tmp/peers-venv/bin/python] [--streaming]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
KEYS = {"access_key_id": "testing", "secret_access_key": "testing", "region": "us-east-1"}
BUCKET = "bench"


def copy_sample(sample, arrays, seed):
    data = sample["bin"]
    arrays["bin"][: len(data)] = np.frombuffer(data, np.uint8)


def hydrax_run(args) -> None:
    """One epoch of hydrax in this (new) process; prints a JSON line."""
    import jax
    import jax.numpy as jnp

    from hydrax import Dataloader, DataGroup
    from hydrax.shards import ReadAhead, S3Options, ShardSet

    if args.jax_first:
        jax.devices()
    options = S3Options(endpoint_url=args.endpoint, **KEYS)
    cache = tempfile.mkdtemp(prefix="hydrax-bench-index-")
    started = time.perf_counter()
    readahead = ReadAhead(max_bytes=args.budget << 20) if args.budget else None
    dataset = ShardSet(f"s3://{BUCKET}/train/*.tar", s3=options, cache_dir=cache, readahead=readahead)
    order = {"shardwise": {"shuffle_later": "shardwise"}, "random": {"shuffle_first": True}}[args.hydrax_run]
    group = DataGroup(32, dataset, loader_arrays={"bin": ((args.sample_bytes,), np.uint8, jnp.uint8)}, **order)
    seen: list[np.ndarray] = []
    first = None
    with Dataloader(copy_sample, group, loader_count=2, end_at=("epoch", 1), timeout_sec=300) as loader:
        for batch in loader:
            first = first or time.perf_counter() - started
            seen.append(np.asarray(batch.indices))
            del batch
    elapsed = time.perf_counter() - started
    indices = np.concatenate(seen)
    budget = dataset.readahead_budget
    print(json.dumps({"samples": len(indices), "distinct": len(np.unique(indices)), "seconds": elapsed,
                      "first_batch_s": first, "load_average": os.getloadavg()[0],
                      "budget": budget.describe() if budget else None}), flush=True)
    dataset.close()
    shutil.rmtree(cache, ignore_errors=True)


def webdataset_run(args) -> None:
    """webdataset's tar pipeline over every shard in one process, plain GETs; prints a JSON line."""
    import urllib.request

    import webdataset as wds

    names = sorted(n for n in os.listdir(args.tars) if n.endswith(".tar"))
    urls = [f"{args.endpoint}/{BUCKET}/train/{name}" for name in names]

    def open_streams(source):
        for sample in source:
            yield dict(url=sample["url"], stream=urllib.request.urlopen(sample["url"]))

    started = time.perf_counter()
    first = None
    keys = []
    sink = np.empty(args.sample_bytes, np.uint8)
    for sample in wds.DataPipeline(wds.SimpleShardList(urls), open_streams, wds.tarfile_to_samples()):
        data = sample["bin"]
        sink[: len(data)] = np.frombuffer(data, np.uint8)
        keys.append(sample["__key__"])
        if len(keys) == 32 and first is None:
            first = time.perf_counter() - started
    elapsed = time.perf_counter() - started
    print(json.dumps({"samples": len(keys), "distinct": len(set(keys)), "seconds": elapsed, "first_batch_s": first,
                      "load_average": os.getloadavg()[0]}), flush=True)


# -- the harness ---------------------------------------------------------------------------------

def start(command: list[str]) -> tuple[subprocess.Popen, str]:
    """Start a server process that prints its address on its first line; (process, that line)."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    line = process.stdout.readline().strip()
    if not line:
        process.kill()
        raise RuntimeError(f"{command[1]} did not start")
    return process, line


def prepare(args, folder: str) -> tuple[subprocess.Popen, str]:
    """Shards, index objects and the peers' formats under ``folder``, served; (server, its URL)."""
    sys.path.insert(0, str(HERE))
    from bench_remote import make_shards

    from hydrax.shards import S3Options
    from hydrax.shards.catalog import publish_indexes
    from hydrax.shards.store import StoreOptions

    served = os.path.join(folder, "served")
    train = os.path.join(served, BUCKET, "train")
    os.makedirs(train)
    args.tars = os.path.join(folder, "tars")
    os.makedirs(args.tars)
    paths = make_shards(args.tars, args.shards, args.per_shard, args.sample_bytes, "train")
    for path in paths:
        os.link(path, os.path.join(train, os.path.basename(path)))
    server, line = start([sys.executable, str(HERE / "rangeserver.py"), served, "--port", "0"])
    endpoint = line.split()[-1]
    publish_indexes([f"s3://{BUCKET}/train/*.tar"], StoreOptions(s3=S3Options(endpoint_url=endpoint, **KEYS)))
    for form, name, case in (("litdata", "lit", "LitData"), ("mds", "mds", "MosaicML")):
        if (form == "mds" and not args.streaming) or (args.only and not any(case.startswith(o) for o in args.only)):
            continue
        subprocess.run([args.peers_python, str(HERE / "peers" / "run_peer.py"), "convert", "--tars", args.tars,
                        "--format", form, "--out", os.path.join(served, BUCKET, name)], check=True, stdout=subprocess.DEVNULL)
    return server, endpoint


def cases(args, endpoint: str) -> dict[str, list[str]]:
    me = [sys.executable, str(Path(__file__).resolve())]
    common = ["--endpoint", endpoint, "--sample-bytes", str(args.sample_bytes)]
    peer = [args.peers_python, str(HERE / "peers" / "run_peer.py"), "load", "--endpoint", endpoint, "--workers", "2",
            "--expect", str(args.shards * args.per_shard)]
    found = {
        "hydrax shardwise, defaults": me + ["--hydrax-run", "shardwise"] + common,
        "hydrax fully shuffled, defaults": me + ["--hydrax-run", "random"] + common,
        "hydrax shardwise, JAX initialised first": me + ["--hydrax-run", "shardwise", "--jax-first"] + common,
        "LitData": peer + ["--format", "litdata", "--remote", f"s3://{BUCKET}/lit"],
        "LitData, shuffle=True": peer + ["--format", "litdata", "--remote", f"s3://{BUCKET}/lit", "--shuffle"],
    }
    for budget in args.budgets or ():
        found[f"hydrax fully shuffled, {budget} MiB budget"] = me + ["--hydrax-run", "random", "--budget", str(budget)] + common
    if args.streaming:
        found["MosaicML Streaming, shuffle=True"] = peer + ["--format", "mds", "--remote", f"s3://{BUCKET}/mds", "--shuffle"]
    if args.webdataset:
        found["webdataset, 1 process"] = me + ["--webdataset-run", "--tars", args.tars] + common
    return found


def run_case(command: list[str], total: int) -> dict:
    # The peers' local copies go to memory, as hydrax's read-ahead does: on a disk their
    # writeback would go on into the next run. What is written is flushed before the next.
    cache = tempfile.mkdtemp(dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    if "run_peer.py" in command[1]:
        command = command + ["--cache", os.path.join(cache, "c")]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
        os.sync()
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        raise RuntimeError(f"{' '.join(command[:4])} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    record = json.loads(lines[-1])
    distinct = record.get("distinct", record["samples"])
    # hydrax's batches are whole (the last partial batch of an epoch is dropped, as in 0.2.2)
    expected = total - total % 32 if "--hydrax-run" in command else total
    if record["samples"] != expected or distinct != expected:
        raise RuntimeError(f"{command[:4]}: {record['samples']} samples, {distinct} distinct, expected {expected} once each")
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shards", type=int, default=32)
    parser.add_argument("--per-shard", type=int, default=512)
    parser.add_argument("--sample-bytes", type=int, default=100_000)
    parser.add_argument("--delays", type=float, nargs="+", default=[0.02, 0.05])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--peers-python", default="/tmp/peers-venv/bin/python")
    parser.add_argument("--streaming", action="store_true", help="MosaicML Streaming too (about 30 s a run)")
    parser.add_argument("--webdataset", action="store_true", help="webdataset in one process too")
    parser.add_argument("--settle", type=float, default=5.0, help="seconds between runs")
    parser.add_argument("--budgets", type=int, nargs="+", help="hydrax fully shuffled with these read-ahead budgets (MiB) too")
    parser.add_argument("--only", nargs="+", help="run only the cases whose names start with these")
    # one run, in a new process (the harness starts these)
    parser.add_argument("--hydrax-run", choices=("shardwise", "random"), help=argparse.SUPPRESS)
    parser.add_argument("--jax-first", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--budget", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--webdataset-run", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--endpoint", help=argparse.SUPPRESS)
    parser.add_argument("--tars", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.hydrax_run:
        return hydrax_run(args)
    if args.webdataset_run:
        return webdataset_run(args)

    folder = tempfile.mkdtemp(prefix="hydrax-bench-peers-")
    processes = []
    try:
        server, endpoint = prepare(args, folder)
        processes.append(server)
        os.sync()
        proxy, line = start([sys.executable, str(ROOT / "tests" / "support" / "netproxy.py"), endpoint.split("//")[1]]
                            + [f"--delay={d}" for d in args.delays])
        processes.append(proxy)
        ports = line.split()[2:]
        total = args.shards * args.per_shard
        size = sum(os.path.getsize(os.path.join(args.tars, n)) for n in os.listdir(args.tars))
        print(f"{args.shards} shards x {args.per_shard} samples x {args.sample_bytes:,} bytes ({size / 1e9:.2f} GB), "
              f"served by rangeserver.py behind netproxy.py, {os.cpu_count()} cores")
        print()
        print("| delay | loader | samples/s | vs LitData | first batch | load average | runs (samples/s) |")
        print("|---|---|---|---|---|---|---|")
        for delay, port in zip(args.delays, ports):
            named = cases(args, f"http://127.0.0.1:{port}")
            if args.only:
                named = {k: v for k, v in named.items() if any(k.startswith(o) for o in args.only)}
            results: dict[str, list[dict]] = {name: [] for name in named}
            order = list(named)
            for repeat in range(args.repeat):
                # Each repeat starts one case later, so no loader always follows the same one
                # (a run's teardown, the page cache it leaves), and settles first.
                for name in order[repeat % len(order):] + order[: repeat % len(order)]:
                    time.sleep(args.settle)
                    record = run_case(named[name], total)
                    record["rate"] = record["samples"] / record["seconds"]
                    results[name].append(record)
            base = statistics.median(r["rate"] for r in results.get("LitData", [])) if results.get("LitData") else None
            for name, runs in results.items():
                rate = statistics.median(r["rate"] for r in runs)
                first = statistics.median(r["first_batch_s"] for r in runs)
                loads = ", ".join(f"{r['load_average']:.1f}" for r in runs)
                ratio = f"{rate / base:.2f}x" if base else "-"
                each = ", ".join(f"{r['rate']:,.0f}" for r in runs)
                print(f"| {delay * 1000:.0f} ms | {name} | {rate:,.0f} | {ratio} | {first:.2f} s | {loads} | {each} |", flush=True)
        budget = next((r.get("budget") for runs in results.values() for r in runs if r.get("budget")), None)
        if budget:
            print(f"\nhydrax chose: {budget}")
    finally:
        for process in processes:
            process.kill()
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
