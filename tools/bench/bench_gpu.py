"""Benchmark: how fast hydrax batches reach an accelerator, against a plain ``jax.device_put``.

Run on a machine with a GPU JAX backend::

    python tools/bench/bench_gpu.py [--sizes 37,192] [--workers 8] [--depth 6] [--seconds 5]
    python tools/bench/bench_gpu.py --batch 256 ...   # one batch of 256 images instead of --sizes

Batches are uint8 images of 224 x 224 x 3; ``--sizes`` gives batch sizes in MB, each rounded to a
whole number of images (37 MB: 246 images, 192 MB: 1276). For every size, measured side by side
in one process:

1. ``device_put`` of an ordinary (pageable) numpy batch, in a loop, blocking on each: the
   host-to-device ceiling that any loader handing numpy memory to JAX starts from;
2. the same with ``x.sum()`` computed on the device after each transfer, serially: what a naive
   loop that neither overlaps nor prefetches gets;
3. ``device_put`` of a batch that lives in a memfd mapping (as an arena slot does), in a loop;
4. the same mapping page-locked with :func:`hydrax.procs.pinning.pin_host_memory` (when the CUDA
   driver allows it);
5. a full hydrax run: ``--workers`` loader processes fill batches in shared memory with a cheap
   memset-like write, the default placement sends them to the device, and the consumer computes
   ``x.sum()`` on the device per batch and blocks on it; with transfers overlapping that compute
   it should approach (1), not (2).

It prints GB/s and batches/s for each, the ratios to (1), the time to the first batch and the
loader's ``transfer_stats``; every row is also printed as a JSON line prefixed ``RESULT ``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time

import numpy as np

SHAPE = (224, 224, 3)
ITEM_BYTES = int(np.prod(SHAPE))


def fill(item, arrays, seed):
    """A cheap loader: one memset-like write of the item's image."""
    arrays["image"][...] = seed & 0xFF


def items_for(megabytes: float) -> int:
    """Images per batch that come closest to ``megabytes`` (10^6 bytes)."""
    return max(1, round(megabytes * 1e6 / ITEM_BYTES))


def put_loop(array: np.ndarray, seconds: float, compute=None) -> float:
    """Bytes per second of blocking ``device_put`` of ``array`` (then ``compute`` of the result)."""
    import jax

    def step():
        x = jax.device_put(array)
        jax.block_until_ready(x if compute is None else compute(x))

    step()
    count, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        step()
        count += 1
    return count * array.nbytes / (time.perf_counter() - started)


def device_sum():
    """The consumer's per-batch device work: a jitted reduction over the whole batch."""
    import jax
    import jax.numpy as jnp

    return jax.jit(lambda x: jnp.sum(x, dtype=jnp.uint32))


class _Reasons(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def pin(address: int, nbytes: int):
    """``(PinnedRange or None, reason)``: the reason is what hydrax.procs.pinning logged on failure."""
    from hydrax.procs.pinning import pin_host_memory

    log = logging.getLogger("hydrax.procs.pinning")
    handler, level = _Reasons(), log.level
    log.addHandler(handler)
    log.setLevel(logging.DEBUG)
    try:
        pinned = pin_host_memory(address, nbytes)
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
    return pinned, (handler.messages[-1] if handler.messages else "pin_host_memory returned None")


def hydrax_run(batch: int, workers: int, depth: int, seconds: float, compute) -> tuple[float, float, dict]:
    import jax
    import jax.numpy as jnp

    from hydrax import DataGroup, Dataloader

    group = DataGroup(batch, range(batch * 20_000), loader_arrays={"image": (SHAPE, np.uint8, jnp.uint8)})
    nbytes = group.loader_size
    started = time.perf_counter()
    with Dataloader(fill, group, loader_count=workers, depth=depth) as loader:
        count, first, t0 = 0, None, None
        for b in loader:
            jax.block_until_ready(compute(b.arrays["image"]))
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


def bench_size(items: int, args, backend: str) -> list[dict]:
    """Every path for one batch size; rows as dicts (``gbps`` None where a path could not run)."""
    from hydrax import _core

    nbytes = items * ITEM_BYTES
    mb = round(nbytes / 1e6, 2)
    compute = device_sum()
    plain = np.full((items, *SHAPE), 7, np.uint8)
    rows: list[dict] = []

    def row(path: str, label: str, rate: float | None, **extra) -> None:
        rows.append({"size_mb": mb, "items": items, "path": path, "label": label, "backend": backend,
                     "gbps": None if rate is None else round(rate / 1e9, 3),
                     "batches_per_s": None if rate is None else round(rate / nbytes, 2), **extra})

    row("device_put", "device_put, ordinary numpy batch", put_loop(plain, args.seconds))
    row("device_put_sum", "device_put + x.sum(), serial", put_loop(plain, args.seconds, compute))
    del plain

    fd = os.memfd_create("hydrax-bench", os.MFD_CLOEXEC)
    os.ftruncate(fd, nbytes)
    arena = _core.ArenaMap(fd, nbytes)
    os.close(fd)
    slot = np.frombuffer(arena, np.uint8, count=nbytes).reshape(items, *SHAPE)
    slot[...] = 7
    row("device_put_memfd", "device_put, batch in a memfd mapping", put_loop(slot, args.seconds))
    pinned, reason = pin(arena.address, nbytes)
    if pinned is None:
        row("device_put_pinned", "device_put, same mapping pinned", None, unavailable=reason)
    else:
        try:
            # put_loop blocks on every transfer, so none is in flight when the range is released.
            row("device_put_pinned", "device_put, same mapping pinned", put_loop(slot, args.seconds))
        finally:
            pinned.release()
    del slot, arena

    rate, first, stats = hydrax_run(items, args.workers, args.depth, args.seconds, compute)
    row("hydrax_sum", f"hydrax + x.sum(), {args.workers} loaders, depth {args.depth}", rate,
        first_batch_s=round(first, 3), transfer_stats=stats)
    base = rows[0]["gbps"]
    for r in rows:
        r["vs_device_put"] = None if r["gbps"] is None or not base else round(r["gbps"] / base, 3)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="37,192", help="batch sizes in MB, comma separated (default 37,192)")
    parser.add_argument("--batch", type=int, default=None, help="images per batch; replaces --sizes with this one size")
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--depth", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=5.0, help="seconds per measured path")
    args = parser.parse_args()
    if args.batch is not None:
        counts = [args.batch]
    else:
        counts = [items_for(float(s)) for s in args.sizes.split(",") if s.strip()]
    if not counts or min(counts) < 1:
        parser.error("need at least one positive batch size")

    import jax

    backend = jax.default_backend()
    print(f"JAX {jax.__version__}, backend {backend}, devices {jax.devices()}, {os.cpu_count()} CPUs")
    if backend == "cpu":
        print("no accelerator: these figures only measure host copies")
    print(f"{'MB':>7} | {'path':48} | {'GB/s':>7} | {'batches/s':>9} | {'vs put':>6} | first batch (s)")
    for items in counts:
        rows = bench_size(items, args, backend)
        for r in rows:
            gbps = "n/a" if r["gbps"] is None else f"{r['gbps']:.2f}"
            bps = "n/a" if r["batches_per_s"] is None else f"{r['batches_per_s']:.1f}"
            ratio = "" if r["vs_device_put"] is None else f"{r['vs_device_put']:.2f}"
            first = "" if r.get("first_batch_s") is None else f"{r['first_batch_s']:.3f}"
            print(f"{r['size_mb']:7.2f} | {r['label']:48} | {gbps:>7} | {bps:>9} | {ratio:>6} | {first}")
        print(f"{rows[0]['size_mb']:7.2f} | {items} x {SHAPE} uint8; hydrax transfer_stats: {rows[-1]['transfer_stats']}")
        for r in rows:
            if "unavailable" in r:
                print(f"{r['size_mb']:7.2f} | pinning unavailable: {r['unavailable']}")
        for r in rows:
            print("RESULT " + json.dumps(r, sort_keys=True))


if __name__ == "__main__":
    main()
