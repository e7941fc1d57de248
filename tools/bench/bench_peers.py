"""Object storage with the defaults: hydrax against LitData and MosaicML Streaming, as a new user
would run each, through a store 20-50 ms away.

The same samples (``--shards`` tar shards of ``--per-shard`` samples of ``--sample-bytes``
random bytes) are served three ways from one folder by ``rangeserver.py`` (a file server that
speaks enough S3 for all three loaders and costs little CPU, unlike moto, which copies the whole
object for every ranged GET): WebDataset tars with hydrax's index objects and folder summary
(written by ``publish_indexes`` through the server), LitData's optimized chunks and MDS shards
(converted by ``peers/run_peer.py``). The delay is the server's own (``--delay-at server``, the
default: every answer waits that long after its request arrived, then goes out with
``sendfile``), or ``tests/support/netproxy.py``'s in front of it (``--delay-at proxy``: a Python
process that copies every byte and costs this machine more CPU than the loaders it measures,
which is how the storage guide's earlier tables were made). Either way the store is processes of its
own: nothing of it shares a process (or the GIL) with a loader. It stands for machines elsewhere,
so it runs under Linux's ``SCHED_IDLE`` policy (``--store-priority idle``, the default): on what
the processes measured leave of the cores, not taking turns with the training process. Its CPU
per GB is printed with the loaders', so a reader sees what the stand-in for the network took.

Every run is a new process, from an empty cache (in ``/dev/shm``, where hydrax's read-ahead
keeps its files too; the page cache is flushed between runs), 2 loader processes each, one epoch in which
every sample must arrive exactly once; its clock starts when the dataset is made (imports
done, as in a training script) and stops at the last batch, so set-up, the workers' start and
the first requests are included. The first batch's time is from the same start. Runs are
interleaved, ``--repeat`` of each, each repeat starting one case later than the last and every
run after ``--settle`` seconds; the table gives medians and every run (in the order run), with
the load average at each run's end, the bytes the server sent per byte of data (set-up
included), and hydrax's CPU per GB delivered by process kind: the training process's own
(``getrusage``, its threads only), its fetch process's, set-up's indexing processes' and the
loaders' (from ``/proc``, sampled 4 times a second).

Contenders (the peers run in their own venv, see ``peers/README.md``):

- hydrax ``shardwise`` and fully shuffled (``shuffle_first=True``), defaults: the read-ahead
  sizes itself; ``ShardSet("s3://bench/train/*.tar")`` sets up from the folder summary;
- hydrax ``shardwise`` with JAX initialised just before the dataset is made (the fork server,
  started then with the script's imports, is what the workers start from);
- hydrax fully shuffled with read-ahead budgets given by hand (``--budgets 256 1024``: MiB), what
  global shuffling costs when the budget cannot hold the data;
- hydrax ``shardwise`` with 1 loader (how a run grows with its loaders);
- hydrax ``shardwise`` with ``--fetch-processes N``: a pool of N fetch processes, with 2 loaders
  and with 1 (the default is one per 12 cores: one, here);
- hydrax ``shardwise`` on an unprepared bucket: the same tars under ``raw/``, with no index
  objects and no folder summary (what a webdataset user has), set-up's indexing included;
- hydrax ``shardwise`` with a training step after each batch (``--step-iters`` of a pure-Python
  loop, about 2-3 ms here, holding the GIL as a training loop's Python does), once over the
  remote shards and once over the same tars on local disk: what the training loop feels of the
  fetching, as the step's mean, p90 and p99; and over the remote shards with
  ``ReadAhead(fetch_nice=19)``;
- LitData 0.2.76 ``StreamingDataset`` + ``StreamingDataLoader``, with and without ``shuffle``;
- MosaicML Streaming 0.13.0 ``shuffle=True`` (``--streaming``);
- webdataset's tar pipeline in one process, plain GETs (``--webdataset``).

    python tools/bench/bench_peers.py [--shards 32 --per-shard 512 --sample-bytes 100000]
        [--delays 0.02 0.05] [--delay-at server|proxy] [--store-priority idle|normal] [--repeat 3]
        [--peers-python /tmp/peers-venv/bin/python] [--streaming]
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
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
KEYS = {"access_key_id": "testing", "secret_access_key": "testing", "region": "us-east-1"}
BUCKET = "bench"


def process_cpu(pid: int) -> float:
    """The CPU seconds process ``pid`` has used so far (0 once it is gone), from ``/proc``."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def copy_sample(sample, arrays, seed):
    data = sample["bin"]
    arrays["bin"][: len(data)] = np.frombuffer(data, np.uint8)


def python_step(iterations: int) -> float:
    """A training step's fixed pure-Python work (it holds the GIL throughout); its seconds."""
    started = time.perf_counter()
    total = 0
    for i in range(iterations):
        total += i * i
    return time.perf_counter() - started


def children_cpu(seen: dict[tuple[str, int], float]) -> None:
    """Record in ``seen`` ((kind, pid) -> CPU seconds) what each of this process's helper
    processes (loaders, fetch and indexing processes) has used so far, from ``/proc``."""
    import multiprocessing as mp

    for child in mp.active_children():
        kind = child.name.rstrip("0123456789-")
        seen[(kind, child.pid)] = max(seen.get((kind, child.pid), 0.0), process_cpu(child.pid))


def hydrax_run(args) -> None:
    """One epoch of hydrax in this (new) process; prints a JSON line."""
    import resource

    import jax
    import jax.numpy as jnp

    from hydrax import Dataloader, DataGroup
    from hydrax.shards import ReadAhead, S3Options, ShardSet

    if args.jax_first:
        jax.devices()
    options = S3Options(endpoint_url=args.endpoint, **KEYS)
    cache = tempfile.mkdtemp(prefix="hydrax-bench-index-")
    if args.local:
        urls = sorted(os.path.join(args.tars, n) for n in os.listdir(args.tars) if n.endswith(".tar"))
    else:
        urls = f"s3://{BUCKET}/{'raw' if args.raw else 'train'}/*.tar"
    helpers: dict[tuple[str, int], float] = {}
    done = threading.Event()

    def sample_helpers() -> None:  # they come and go (set-up's indexing processes): looked at 4 times a second
        while not done.wait(0.25):
            children_cpu(helpers)

    threading.Thread(target=sample_helpers, daemon=True).start()
    started = time.perf_counter()
    cpu = resource.getrusage(resource.RUSAGE_SELF)  # this process's threads only, not its children
    settings = {"max_bytes": args.budget << 20} if args.budget else {}
    settings.update({"fetch_processes": args.fetchers} if args.fetchers else {})
    settings.update({"fetch_nice": args.fetch_nice} if args.fetch_nice else {})
    readahead = ReadAhead(**settings) if settings else None
    dataset = ShardSet(urls, s3=options, cache_dir=cache, readahead=readahead)
    order = {"shardwise": {"shuffle_later": "shardwise"}, "random": {"shuffle_first": True}}[args.hydrax_run]
    group = DataGroup(32, dataset, loader_arrays={"bin": ((args.sample_bytes,), np.uint8, jnp.uint8)}, **order)
    seen: list[np.ndarray] = []
    steps: list[float] = []
    first = None
    with Dataloader(copy_sample, group, loader_count=args.loaders, end_at=("epoch", 1), timeout_sec=300) as loader:
        for batch in loader:
            if first is None:
                first = time.perf_counter() - started
                at_first = resource.getrusage(resource.RUSAGE_SELF)
            seen.append(np.asarray(batch.indices))
            del batch
            if args.run_step_iters:
                steps.append(python_step(args.run_step_iters))
        children_cpu(helpers)
    done.set()
    elapsed = time.perf_counter() - started
    used = resource.getrusage(resource.RUSAGE_SELF)
    by_kind: dict[str, float] = {}
    for (kind, _), seconds in helpers.items():
        by_kind[kind] = by_kind.get(kind, 0.0) + seconds
    indices = np.concatenate(seen)
    budget = dataset.readahead_budget
    print(json.dumps({"samples": len(indices), "distinct": len(np.unique(indices)), "seconds": elapsed,
                      "first_batch_s": first, "load_average": os.getloadavg()[0],
                      "training_cpu_s": used.ru_utime - cpu.ru_utime + used.ru_stime - cpu.ru_stime,
                      # from the first batch on: the cost per GB that grows with the data, start-up aside
                      "training_cpu_steady_s": used.ru_utime - at_first.ru_utime + used.ru_stime - at_first.ru_stime,
                      "steady_bytes": (len(indices) - len(seen[0])) * args.sample_bytes,
                      "delivered_bytes": len(indices) * args.sample_bytes, "steps": steps, "helpers_cpu_s": by_kind,
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

def start(command: list[str], idle: bool = False) -> tuple[subprocess.Popen, str]:
    """Start a server process that prints its address on its first line; (process, that line).
    ``idle``: under Linux's ``SCHED_IDLE`` policy, so it runs on what the machine leaves."""
    def behind() -> None:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))

    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, preexec_fn=behind if idle else None)
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
    from hydrax.shards.options import StoreOptions
    from hydrax.shards.publish import publish_indexes

    served = args.served = os.path.join(folder, "served")
    train = os.path.join(served, BUCKET, "train")
    os.makedirs(train)
    args.tars = os.path.join(folder, "tars")
    os.makedirs(args.tars)
    paths = make_shards(args.tars, args.shards, args.per_shard, args.sample_bytes, "train")
    raw = os.path.join(served, BUCKET, "raw")  # the same tars, unprepared: no index objects, no summary
    os.makedirs(raw)
    for path in paths:
        os.link(path, os.path.join(train, os.path.basename(path)))
        os.link(path, os.path.join(raw, os.path.basename(path)))
    server, line = start([sys.executable, str(HERE / "rangeserver.py"), served, "--port", "0"], args.store_priority == "idle")
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
        "hydrax shardwise, 1 loader": me + ["--hydrax-run", "shardwise", "--loaders", "1"] + common,
        "hydrax shardwise, unprepared bucket": me + ["--hydrax-run", "shardwise", "--raw"] + common,
        "hydrax shardwise, local shards": me + ["--hydrax-run", "shardwise", "--local", "--tars", args.tars] + common,
        "hydrax shardwise + training step": me + ["--hydrax-run", "shardwise", "--run-step-iters", str(args.step_iters)] + common,
        "hydrax shardwise + training step, local shards": me + ["--hydrax-run", "shardwise", "--local", "--tars", args.tars,
                                                               "--run-step-iters", str(args.step_iters)] + common,
        "hydrax shardwise + training step, fetch_nice=19": me + ["--hydrax-run", "shardwise", "--fetch-nice", "19",
                                                                "--run-step-iters", str(args.step_iters)] + common,
        "LitData": peer + ["--format", "litdata", "--remote", f"s3://{BUCKET}/lit"],
        "LitData, shuffle=True": peer + ["--format", "litdata", "--remote", f"s3://{BUCKET}/lit", "--shuffle"],
    }
    if args.baseline:
        for name in [n for n in found if n.startswith("hydrax shardwise") and "fetch processes" not in n
                     and "fetch_nice" not in n]:
            found[f"{name} (baseline)"] = found[name] + ["--hydrax-tree", args.baseline]
    for count in args.fetch_processes or ():
        found[f"hydrax shardwise, {count} fetch processes"] = me + ["--hydrax-run", "shardwise", "--fetchers", str(count)] + common
        found[f"hydrax shardwise, 1 loader, {count} fetch processes"] = (
            me + ["--hydrax-run", "shardwise", "--loaders", "1", "--fetchers", str(count)] + common)
    for budget in args.budgets or ():
        found[f"hydrax fully shuffled, {budget} MiB budget"] = me + ["--hydrax-run", "random", "--budget", str(budget)] + common
    if args.streaming:
        found["MosaicML Streaming, shuffle=True"] = peer + ["--format", "mds", "--remote", f"s3://{BUCKET}/mds", "--shuffle"]
    if args.webdataset:
        found["webdataset, 1 process"] = me + ["--webdataset-run", "--tars", args.tars] + common
    return found


def median_rate(results: dict[str, list[dict]], name: str) -> float | None:
    """The median samples/s of the case ``name``, None when it did not run."""
    return statistics.median(r["rate"] for r in results[name]) if results.get(name) else None


def bytes_served(server: str) -> int:
    """The object bytes ``server`` (rangeserver.py) has sent so far."""
    with urllib.request.urlopen(server + "/.rangeserver-stats") as answer:
        return json.load(answer)["bytes"]


def run_case(command: list[str], total: int, server: str, store: list[subprocess.Popen]) -> dict:
    # The peers' local copies go to memory, as hydrax's read-ahead does: on a disk their
    # writeback would go on into the next run. What is written is flushed before the next.
    cache = tempfile.mkdtemp(dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    if "run_peer.py" in command[1]:
        command = command + ["--cache", os.path.join(cache, "c")]
    served = bytes_served(server)
    store_cpu = sum(process_cpu(p.pid) for p in store)
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
        os.sync()
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        raise RuntimeError(f"{' '.join(command[:4])} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    record = json.loads(lines[-1])
    record["fetched_bytes"] = bytes_served(server) - served
    record["store_cpu_s"] = sum(process_cpu(p.pid) for p in store) - store_cpu
    distinct = record.get("distinct", record["samples"])
    # hydrax's batches are whole (the last partial batch of an epoch is dropped, as in 0.2.2)
    expected = total - total % 32 if "--hydrax-run" in command else total
    if record["samples"] != expected or distinct != expected:
        raise RuntimeError(f"{command[:4]}: {record['samples']} samples, {distinct} distinct, expected {expected} once each")
    return record


def delayed_stores(args, endpoint: str, processes: list) -> list[tuple[str, str, list[subprocess.Popen]]]:
    """For each of ``args.delays``: (the URL the loaders read, the URL that counts the bytes sent,
    the store's processes), with the delay in a server of its own over the same folder, or in one
    proxy in front of ``endpoint`` (``processes[0]``, the server ``prepare`` started)."""
    if args.delay_at == "proxy":
        proxy, line = start([sys.executable, str(ROOT / "tests" / "support" / "netproxy.py"), endpoint.split("//")[1]]
                            + [f"--delay={d}" for d in args.delays], args.store_priority == "idle")
        processes.append(proxy)
        return [(f"http://127.0.0.1:{port}", endpoint, [processes[0], proxy]) for port in line.split()[2:]]
    stores = []
    for delay in args.delays:
        server, line = start([sys.executable, str(HERE / "rangeserver.py"), args.served, "--port", "0", "--delay", str(delay)],
                             args.store_priority == "idle")
        processes.append(server)
        url = line.split()[-1]
        stores.append((url, url, [server]))
    return stores


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
    parser.add_argument("--delay-at", choices=("server", "proxy"), default="server",
                        help="where the delay is added: in the file server, or in netproxy.py in front of it")
    parser.add_argument("--store-priority", choices=("idle", "normal"), default="idle",
                        help="the store's processes under SCHED_IDLE (they stand for machines elsewhere), or as any process")
    parser.add_argument("--settle", type=float, default=5.0, help="seconds between runs")
    parser.add_argument("--budgets", type=int, nargs="+", help="hydrax fully shuffled with these read-ahead budgets (MiB) too")
    parser.add_argument("--fetch-processes", type=int, nargs="+",
                        help="hydrax shardwise with these ReadAhead(fetch_processes=...) too, with 2 loaders and with 1")
    parser.add_argument("--only", nargs="+", help="run only the cases whose names start with these")
    parser.add_argument("--baseline", help="a checkout of an earlier hydrax (its _core built, or copied from this one): "
                                           "its 'hydrax shardwise' cases run too, named '(baseline)'")
    parser.add_argument("--step-iters", type=int, default=40_000,
                        help="the training step's pure-Python loop (about 2-3 ms here) in the '+ training step' cases")
    # one run, in a new process (the harness starts these)
    parser.add_argument("--hydrax-run", choices=("shardwise", "random"), help=argparse.SUPPRESS)
    parser.add_argument("--jax-first", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--budget", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--loaders", type=int, default=2, help=argparse.SUPPRESS)
    parser.add_argument("--fetchers", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--fetch-nice", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--run-step-iters", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--hydrax-tree", help=argparse.SUPPRESS)
    parser.add_argument("--local", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--raw", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--webdataset-run", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--endpoint", help=argparse.SUPPRESS)
    parser.add_argument("--tars", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.hydrax_run:
        if args.hydrax_tree:  # an earlier hydrax, side by side (its workers inherit the path)
            sys.path.insert(0, args.hydrax_tree)
        return hydrax_run(args)
    if args.webdataset_run:
        return webdataset_run(args)

    folder = tempfile.mkdtemp(prefix="hydrax-bench-peers-")
    processes = []
    try:
        server, endpoint = prepare(args, folder)
        processes.append(server)
        os.sync()
        stores = delayed_stores(args, endpoint, processes)
        total = args.shards * args.per_shard
        size = sum(os.path.getsize(os.path.join(args.tars, n)) for n in os.listdir(args.tars))
        where = ("behind netproxy.py" if args.delay_at == "proxy" else "with the delay in the server") + (
            ", under SCHED_IDLE" if args.store_priority == "idle" else "")
        print(f"{args.shards} shards x {args.per_shard} samples x {args.sample_bytes:,} bytes ({size / 1e9:.2f} GB), "
              f"served by rangeserver.py {where}, {os.cpu_count()} cores")
        print()
        print("| delay | loader | samples/s | vs webdataset | vs LitData | first batch | training process CPU s/GB "
              "| fetched / data | load average | runs (samples/s) |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        steps_table, cpu_table = [], []
        for delay, (url, stats_url, store) in zip(args.delays, stores):
            named = cases(args, url)
            if args.only:
                named = {k: v for k, v in named.items() if any(k.startswith(o) for o in args.only)}
            results: dict[str, list[dict]] = {name: [] for name in named}
            order = list(named)
            for repeat in range(args.repeat):
                # Each repeat starts one case later, so no loader always follows the same one
                # (a run's teardown, the page cache it leaves), and settles first.
                for name in order[repeat % len(order):] + order[: repeat % len(order)]:
                    time.sleep(args.settle)
                    record = run_case(named[name], total, stats_url, store)
                    record["rate"] = record["samples"] / record["seconds"]
                    results[name].append(record)

            lit, web = median_rate(results, "LitData"), median_rate(results, "webdataset, 1 process")
            for name, runs in results.items():
                rate = median_rate(results, name)
                first = statistics.median(r["first_batch_s"] for r in runs)
                loads = ", ".join(f"{r['load_average']:.1f}" for r in runs)
                each = ", ".join(f"{r['rate']:,.0f}" for r in runs)
                cpu = (f"{statistics.median(r['training_cpu_s'] / r['delivered_bytes'] * 1e9 for r in runs):.2f}"
                       if "training_cpu_s" in runs[0] else "-")
                fetched = f"{statistics.median(r['fetched_bytes'] for r in runs) / size:.3f}x"
                print(f"| {delay * 1000:.0f} ms | {name} | {rate:,.0f} | {f'{rate / web:.2f}x' if web else '-'} "
                      f"| {f'{rate / lit:.2f}x' if lit else '-'} | {first:.2f} s | {cpu} | {fetched} | {loads} | {each} |", flush=True)
                if runs[0].get("steps"):
                    steps_table.append((delay, name, runs))
                if "helpers_cpu_s" in runs[0]:
                    cpu_table.append((delay, name, runs))
        if cpu_table:
            print("\nCPU seconds per GB delivered, by process kind (medians over runs; loaders together):\n")
            print("| delay | hydrax | training process | training process after the first batch | fetch process "
                  "| indexing processes | loaders | the store (server and proxy) |")
            print("|---|---|---|---|---|---|---|---|")
            for delay, name, runs in cpu_table:
                def per_gb(kind, runs=runs):
                    values = [(r["training_cpu_s"] if kind is None else r["helpers_cpu_s"].get(kind, 0.0))
                              / r["delivered_bytes"] * 1e9 for r in runs]
                    return f"{statistics.median(values):.2f}"
                steady = statistics.median(r["training_cpu_steady_s"] / r["steady_bytes"] * 1e9 for r in runs)
                print(f"| {delay * 1000:.0f} ms | {name} | {per_gb(None)} | {steady:.2f} | {per_gb('hydrax-fetch')} "
                      f"| {per_gb('hydrax-index')} | {per_gb('hydrax-loader')} "
                      f"| {statistics.median(r['store_cpu_s'] / r['delivered_bytes'] * 1e9 for r in runs):.2f} |")
        if steps_table:
            print("\nThe training step (fixed pure-Python work after each batch), milliseconds; medians over runs:\n")
            print("| delay | beside | mean | p90 | p99 | load average |")
            print("|---|---|---|---|---|---|")
            for delay, name, runs in steps_table:
                stats = [np.percentile(np.array(r["steps"]) * 1e3, [50, 90, 99]).tolist() + [1e3 * statistics.mean(r["steps"])]
                         for r in runs]
                mean, p90, p99 = (statistics.median(s[i] for s in stats) for i in (3, 1, 2))
                loads = ", ".join(f"{r['load_average']:.1f}" for r in runs)
                print(f"| {delay * 1000:.0f} ms | {name} | {mean:.2f} | {p90:.2f} | {p99:.2f} | {loads} |")
        budget = next((r.get("budget") for runs in results.values() for r in runs if r.get("budget")), None)
        if budget:
            print(f"\nhydrax chose: {budget}")
    finally:
        for process in processes:
            process.kill()
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
