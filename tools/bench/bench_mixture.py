"""Benchmark: what a Mixture costs per item against a plain group of the same size.

    python tools/bench/bench_mixture.py [--items 200000] [--batch 256] [--repeat 5]

Two measurements, each side by side in one run, interleaved, medians of ``--repeat``:

- the schedule alone: the items of every batch of an epoch computed the way a worker does
  (``epoch_order(...).local(plan, b)``), for a plain ``itemwise`` group with
  ``permutation="lazy"`` and for a 3-source mixture (0.7/0.2/0.1) of the same total, both
  batchings; microseconds per batch and nanoseconds per item;
- end to end: a Dataloader with 2 loaders and a loader function that writes the item into the
  slot (so that the loader's own overhead, not the function, is what is timed), items/s over
  ``--epochs`` epochs, plain group vs mixture; and again with a loader function that spends
  20 us per item (a light decode), where the per-batch costs weigh as they do in practice.
  A warm-up run of each comes first (the first run forks its workers, later ones use the fork
  server, which costs a second to start).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import jax.numpy as jnp
import numpy as np

from hydrax import Dataloader, DataGroup, Mixture
from hydrax.orders import epoch_order

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


def loader_seconds(group: DataGroup, epochs: int, func=load) -> float:
    started = time.perf_counter()
    with Dataloader(func, group, loader_count=2, end_at=("epoch", epochs)) as loader:
        for batch in loader:
            del batch
    return time.perf_counter() - started


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
    plain = "plain group (itemwise, lazy)"
    print(f"{args.items:,} items, batches of {args.batch} ({batches} per epoch); medians of {args.repeat} interleaved runs; "
          f"load average {os.getloadavg()[0]:.2f}")
    print(f"{'':30} {'schedule us/batch':>17} {'ns/item':>8} {'vs plain':>8} {'items/s, bare':>14} {'vs plain':>8} "
          f"{'items/s, 20 us':>15} {'vs plain':>8}")
    used = args.items // args.batch * args.batch
    for name in contenders:
        s = statistics.median(schedule[name])
        e = statistics.median(end_to_end[name])
        w = statistics.median(busy[name])
        print(f"{name:30} {s / batches * 1e6:17.1f} {s / (batches * args.batch) * 1e9:8.0f} "
              f"{s / statistics.median(schedule[plain]):7.2f}x {used * args.epochs / e:14,.0f} {statistics.median(end_to_end[plain]) / e:7.2f}x "
              f"{used / w:15,.0f} {statistics.median(busy[plain]) / w:7.2f}x")


if __name__ == "__main__":
    main()
