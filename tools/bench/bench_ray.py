"""Benchmark: producers on Ray (``hydrax.ray.serve_on_ray``) against the same producers started as
local processes, each serving one share of a run to one trainer's Collector.

    python tools/bench/bench_ray.py [--producers 2] [--batches 500] [--repeat 3]

Every producer builds the same Dataloader: batches of 64 uint8 224x224x3 images (9.6 MB), each
item filled with its index (cheap, so that the figures are the transport's and the set-up's, not
a decode's), one loader process. The trainer receives the whole run in order and touches nothing.
Per run: MB/s at the trainer once every share has delivered two batches, the trainer's CPU
seconds per batch over the same window (all its threads), the seconds to the first batch and
to the end of the run (start-up included). Each way of starting producers runs twice, through TCP
and through shared memory (``shared_memory=True``: the trainer is on the producers' host); runs
alternate, and the table shows medians and the ratios Ray / local per transport. A Ray instance
(``ray.init(num_cpus=...)``) is started once and its start-up is not counted; actors are
started inside the timed run, as a trainer would.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

BATCH = 64
SHAPE = (224, 224, 3)
HERE = Path(__file__).resolve().parent


def fill(item, arrays, seed):
    arrays["image"][...] = item & 0xFF


def make_loader(batches: int = 200, start_at=(0, 0)):
    """The run every producer serves: ``batches`` batches of 9.6 MB in one epoch."""
    import jax.numpy as jnp

    from hydrax import DataGroup, Dataloader

    group = DataGroup(BATCH, range(BATCH * batches), loader_arrays={"image": (SHAPE, np.uint8, jnp.uint8)})
    return Dataloader(fill, group, loader_count=1, start_at=start_at, end_at=("epoch", 1))


def producer_main(url: str, share: int, count: int, batches: int, shared: bool) -> None:
    from hydrax.serve import serve

    serve(make_loader(batches), url, share=(share, count), timeout=120, shared_memory=shared or None)


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def receive(messages, producers: int) -> dict:
    """The trainer's loop. The steady window starts once every share has delivered two batches
    (an actor that starts later than the others would otherwise count as slow transport); the
    whole run, start-up included, is reported too."""
    started = time.perf_counter()
    steady_from = 2 * producers
    first = steady = None
    count = total = 0
    for number, message in enumerate(messages):
        if number == 0:
            first = time.perf_counter()
        if number == steady_from:
            steady, steady_cpu = time.perf_counter(), cpu_seconds()
        elif steady is not None:
            count += 1
            total += sum(array.nbytes for array in message.arrays)
    end = time.perf_counter()
    return {"mb_s": total / 1e6 / (end - steady), "cpu_per_batch_ms": (cpu_seconds() - steady_cpu) / count * 1e3,
            "first_s": first - started, "whole_s": end - started}


def run_local(producers: int, batches: int, shared: bool) -> dict:
    from hydrax.serve import Collector

    with Collector("zpull://127.0.0.1:*", producers, timeout=120) as collector:
        url = "zpush://" + collector.addresses[0].split("://", 1)[1]
        processes = [subprocess.Popen([sys.executable, __file__, "--producer", url, str(k), str(producers), str(batches), str(int(shared))])
                     for k in range(producers)]
        try:
            figures = receive(collector.messages(), producers)
        finally:
            for process in processes:
                process.wait(120)
    return figures


def run_ray(producers: int, batches: int, shared: bool, num_cpus: float) -> dict:
    import functools

    from hydrax.ray import serve_on_ray

    with serve_on_ray(functools.partial(make_loader, batches), producers=producers, num_cpus=num_cpus, timeout=120,
                      shared_memory=shared or None) as source:
        figures = receive(source, producers)
        figures["shared"] = source.collector.shared_batches
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--producers", type=int, default=2)
    parser.add_argument("--batches", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--producer", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.producer:
        url, share, count, batches, shared = args.producer
        producer_main(url, int(share), int(count), int(batches), shared == "1")
        return
    import ray

    cpus = os.cpu_count() or 1
    ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join([str(HERE), *sys.path[1:]]), "JAX_PLATFORMS": "cpu"}})
    import bench_ray  # noqa: F401 - actors import make_loader from this module by name, not from __main__

    bench = sys.modules["bench_ray"]
    ways = {"local tcp": lambda: run_local(args.producers, args.batches, False),
            "ray tcp": lambda: bench.run_ray(args.producers, args.batches, False, cpus / (args.producers + 1)),
            "local shm": lambda: run_local(args.producers, args.batches, True),
            "ray shm": lambda: bench.run_ray(args.producers, args.batches, True, cpus / (args.producers + 1))}
    results: dict[str, list[dict]] = {way: [] for way in ways}
    for _ in range(args.repeat):
        for way, run in ways.items():
            results[way].append(run())
    ray.shutdown()
    keys = ("mb_s", "cpu_per_batch_ms", "first_s", "whole_s")
    median = {way: {key: statistics.median(run[key] for run in runs) for key in keys} for way, runs in results.items()}
    print(f"{args.producers} producers -> 1 trainer, {args.batches} batches of {BATCH * int(np.prod(SHAPE)) / 1e6:.1f} MB, "
          f"medians of {args.repeat} alternating runs; {cpus} CPUs; load average {os.getloadavg()[0]:.2f}")
    print(f"{'producers':10} {'MB/s':>8} {'trainer CPU ms/batch':>21} {'first batch s':>14} {'whole run s':>12}")
    for way, m in median.items():
        print(f"{way:10} {m['mb_s']:8,.0f} {m['cpu_per_batch_ms']:21.2f} {m['first_s']:14.2f} {m['whole_s']:12.2f}")
    for transport in ("tcp", "shm"):
        ray_runs, local_runs = results[f"ray {transport}"], results[f"local {transport}"]
        ratio = median[f"ray {transport}"]["mb_s"] / median[f"local {transport}"]["mb_s"]
        cpu_ratio = median[f"ray {transport}"]["cpu_per_batch_ms"] / median[f"local {transport}"]["cpu_per_batch_ms"]
        each = ", ".join(f"{r['mb_s'] / l_['mb_s']:.2f}" for r, l_ in zip(ray_runs, local_runs))
        print(f"Ray / local over {transport}: MB/s {ratio:.2f}x, trainer CPU per batch {cpu_ratio:.2f}x (each run: {each})")
    shared = [run["shared"] for run in results["ray shm"]]
    print(f"batches through shared memory in the 'ray shm' runs: {shared} of {args.batches} each")


if __name__ == "__main__":
    main()
