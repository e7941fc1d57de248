"""Benchmark: how fast hydrax batches reach an accelerator, against a plain ``jax.device_put``.

Run on a machine with a GPU JAX backend::

    python tools/bench_gpu.py [--batch 256] [--workers 8] [--seconds 5]

Measured, side by side in one process:

1. ``device_put`` of an ordinary (pageable) numpy batch, in a loop: the host-to-device ceiling
   that any loader handing numpy memory to JAX starts from;
2. ``device_put`` of a batch that lives in a hydrax arena slot (memfd mapping), in a loop;
3. a full hydrax run: ``--workers`` loader processes fill uint8 image batches
   (``--batch`` x 224 x 224 x 3) in shared memory, the default placement sends them to the
   device, and the loop blocks until each batch is on the device.

It prints GB/s and batches/s for each, the ratios to (1), and the time to the first batch.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

SHAPE = (224, 224, 3)


def fill(item, arrays, seed):
    """A cheap loader: one memset-like write of the item's image."""
    arrays["image"][...] = seed & 0xFF


def put_loop(array: np.ndarray, seconds: float) -> float:
    import jax

    jax.block_until_ready(jax.device_put(array))
    count, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        jax.block_until_ready(jax.device_put(array))
        count += 1
    return count * array.nbytes / (time.perf_counter() - started)


def hydrax_run(batch: int, workers: int, depth: int, seconds: float) -> tuple[float, float, dict]:
    import jax
    import jax.numpy as jnp

    from hydrax import Dataloader, DataGroup

    group = DataGroup(batch, range(batch * 100_000), loader_arrays={"image": (SHAPE, np.uint8, jnp.uint8)})
    nbytes = group.loader_size
    started = time.perf_counter()
    with Dataloader(fill, group, loader_count=workers, depth=depth) as loader:
        count, first, t0 = 0, None, None
        for b in loader:
            jax.block_until_ready(b.arrays["image"])
            now = time.perf_counter()
            if first is None:
                first, t0 = now - started, now
            else:
                count += 1
            del b
            if t0 is not None and now - t0 >= seconds:
                break
        rate = count * nbytes / (time.perf_counter() - t0)
        stats = loader.transfer_stats
    return rate, first, stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--depth", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()

    import jax

    print(f"JAX {jax.__version__}, backend {jax.default_backend()}, devices {jax.devices()}, {os.cpu_count()} CPUs")
    if jax.default_backend() == "cpu":
        print("no accelerator: these numbers would only measure host copies")
    nbytes = args.batch * int(np.prod(SHAPE))
    plain = np.full((args.batch, *SHAPE), 7, np.uint8)

    from hydrax import _core

    fd = os.memfd_create("hydrax-bench", os.MFD_CLOEXEC)
    os.ftruncate(fd, nbytes + 4096)
    arena = _core.ArenaMap(fd, nbytes + 4096)
    os.close(fd)
    slot = np.frombuffer(arena, np.uint8, count=nbytes).reshape(plain.shape)
    slot[...] = 7

    rows = []
    rate = put_loop(plain, args.seconds)
    rows.append(("device_put, ordinary numpy batch", rate, None))
    rows.append(("device_put, batch in an arena slot", put_loop(slot, args.seconds), None))
    del slot
    rate_h, first, stats = hydrax_run(args.batch, args.workers, args.depth, args.seconds)
    rows.append((f"hydrax, {args.workers} loaders, depth {args.depth}", rate_h, first))

    print(f"batch: {args.batch} x {SHAPE} uint8 = {nbytes / 1e6:.1f} MB")
    print(f"{'path':44} | {'GB/s':>6} | {'batches/s':>9} | {'vs plain':>8} | first batch (s)")
    for name, r, f in rows:
        print(f"{name:44} | {r / 1e9:6.2f} | {r / nbytes:9.1f} | {r / rate:8.2f} | {'' if f is None else f'{f:.3f}'}")
    print("hydrax transfer_stats:", stats)


if __name__ == "__main__":
    main()
