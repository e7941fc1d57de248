"""Benchmark: what a Mixture costs per item against a plain group of the same size.

    python tools/bench/bench_mixture.py [--items 200000] [--batch 256] [--repeat 5]

Two measurements, each side by side in one run, interleaved, medians of ``--repeat``:

- the schedule alone: the items of every batch of an epoch computed the way the main process
  does (``epoch_order(...).local(plan, b)``), for a plain ``itemwise`` group with
  ``permutation="lazy"`` and for a 3-source mixture (0.7/0.2/0.1) of the same total, both
  batchings; nanoseconds per item;
- end to end: a Dataloader with 2 loaders and a loader function that writes the item into the
  slot (so that the loader's own overhead, not the function, is what is timed), over
  ``--epochs`` epochs, plain group vs mixture: items/s, and CPU microseconds per item summed
  over every process of the run (the main process and its loaders, from /proc), which a shared
  machine disturbs less than the wall clock; and again with a loader function that spends
  20 us per item (a light decode), where the per-batch costs weigh as they do in practice.
  A warm-up run of each comes first (the first run forks its workers, later ones use the fork
  server, which costs a second to start).

Every "vs plain" is the plain group's figure over the mixture's for costs, the mixture's over
the plain group's for rates: 1.00x is the same, 0.90x is 10% worse.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import time

import jax.numpy as jnp
import numpy as np

from hydrax import Dataloader, DataGroup, Mixture
from hydrax.order.orders import epoch_order

ARRAYS = {"x": ((16,), np.int64, jnp.int64)}


def load(item, arrays, seed):
    arrays["x"][:] = item


def load_busy(item, arrays, seed):
    """An item that costs about 20 us, as a small decode or augmentation would."""
    until = time.perf_counter() + 20e-6
    while time.perf_counter() < until:
        pass
    arrays["x"][:] = item


def groups(items: int, batch: int) -> dict[str, DataGroup]:
    sources = [range(items * 7 // 10), range(items * 2 // 10), range(items - items * 9 // 10)]
    return {
        "plain group (itemwise, lazy)": DataGroup(batch, range(items), loader_arrays=ARRAYS, seed=1, shuffle_later="itemwise",
                                                   permutation="lazy"),
        "mixture, random": DataGroup(batch, Mixture(sources, [0.7, 0.2, 0.1]), loader_arrays=ARRAYS, seed=1),
        "mixture, stratified": DataGroup(batch, Mixture(sources, [0.7, 0.2, 0.1], batching="stratified"), loader_arrays=ARRAYS,
                                         seed=1),
    }


def schedule_seconds(group: DataGroup, epoch: int) -> float:
    plan = group.plan
    started = time.perf_counter()
    order = epoch_order(plan, epoch)
    for b in range(plan.batch_count):
        order.local(plan, b)
    return time.perf_counter() - started


def descendants_cpu() -> float:
    """CPU seconds used so far by this process's descendants (the loaders, forked or from the
    fork server) as /proc tells it, and by this process itself."""
    parents, cpu = {}, {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue  # gone meanwhile
            parents[int(entry)] = int(fields[1])
            cpu[int(entry)] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    me, total = os.getpid(), 0.0
    for pid in cpu:
        walk = pid
        while walk > 1 and walk != me:
            walk = parents.get(walk, 0)
        if walk == me and pid != me:
            total += cpu[pid]
    own = resource.getrusage(resource.RUSAGE_SELF)
    return total + own.ru_utime + own.ru_stime


def loader_seconds(group: DataGroup, epochs: int, func=load) -> tuple[float, float]:
    """Wall seconds of a run of ``epochs`` epochs, and CPU seconds of every process in it from
    the moment its loaders are up to the last batch."""
    started = time.perf_counter()
    with Dataloader(func, group, loader_count=2, end_at=("epoch", epochs)) as loader:
        cpu = descendants_cpu()
        for batch in loader:
            del batch
        cpu = descendants_cpu() - cpu
    return time.perf_counter() - started, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    contenders = groups(args.items, args.batch)
    batches = next(iter(contenders.values())).batch_count
    schedule = {name: [] for name in contenders}
    end_to_end = {name: [] for name in contenders}
    busy = {name: [] for name in contenders}
    # JAX is initialised by the first run, so every later run starts its workers from the fork
    # server: one warm-up run each keeps the first contender from being the only one forked
    for group in contenders.values():
        loader_seconds(group, 1)
    for r in range(args.repeat):
        for name, group in contenders.items():
            schedule[name].append(schedule_seconds(group, r + 1))
        for name, group in contenders.items():
            end_to_end[name].append(loader_seconds(group, args.epochs))
        for name, group in contenders.items():
            busy[name].append(loader_seconds(group, 1, load_busy))
    used = args.items // args.batch * args.batch
    print(f"{args.items:,} items, batches of {args.batch} ({batches} per epoch); medians of {args.repeat} interleaved runs; "
          f"load average {os.getloadavg()[0]:.2f}")
    report(contenders, schedule, end_to_end, busy, batches * args.batch, used * args.epochs, used)


def report(contenders, schedule, end_to_end, busy, positions: int, bare_items: int, busy_items: int) -> None:
    """One line per contender: the schedule's cost, then each run's items/s and CPU per item
    (all processes), each against the plain group's from the same run."""
    plain = "plain group (itemwise, lazy)"

    def median(runs, name, part):
        return statistics.median(run[part] for run in runs[name])

    print(f"{'':30} {'schedule ns/item':>16} {'vs plain':>8} | {'bare items/s':>12} {'vs plain':>8} {'CPU us/item':>11} "
          f"{'vs plain':>8} | {'20 us items/s':>13} {'vs plain':>8} {'CPU us/item':>11} {'vs plain':>8}")
    for name in contenders:
        line = f"{name:30} {statistics.median(schedule[name]) / positions * 1e9:16.0f} "
        line += f"{statistics.median(schedule[plain]) / statistics.median(schedule[name]):7.2f}x"
        for runs, items in ((end_to_end, bare_items), (busy, busy_items)):
            seconds, cpu = median(runs, name, 0), median(runs, name, 1)
            line += (f" | {items / seconds:12,.0f} {median(runs, plain, 0) / seconds:7.2f}x {cpu / items * 1e6:11.2f} "
                     f"{median(runs, plain, 1) / cpu:7.2f}x")
        print(line)

if __name__ == "__main__":
    main()
