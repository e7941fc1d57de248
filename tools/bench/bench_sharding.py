"""Benchmark: global batches on 8 CPU devices, three ways of getting a sharded ``jax.Array``.

Every path delivers the same batches (``--batch`` items of ``--features`` float32, 3.1 MB by
default) as one ``jax.Array`` laid out over ``NamedSharding(Mesh(8 devices), P("data"))``, and
the consumer blocks until it is ready, then drops it:

``default + reshard``
    ``Dataloader`` without ``sharding``: the batch is an uncommitted array on device 0, and
    ``jax.device_put(x, sharding)`` reshards it (what ``jit(in_shardings=...)`` does implicitly).
``placement_func``
    a hand-written ``placement_func`` returning ``jax.device_put(view, sharding)`` of the slot's
    views: aliases the slot on every device, but without hydrax's copy-instead-of-stall rule.
``sharding=``
    ``Dataloader(..., sharding=sharding)``.

Each measurement runs in a fresh process with ``XLA_FLAGS=--xla_force_host_platform_device_count=8``;
runs are interleaved and repeated (``--repeat``), and the table shows medians and ratios to the
``sharding=`` path's partners, because the machine may be shared and noisy::

    python tools/bench/bench_sharding.py [--repeat 3] [--seconds 3] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

PATHS = ("default + reshard", "placement_func", "sharding=")


def fill(item, arrays, seed):
    arrays["x"][...] = seed


def child(spec: dict) -> dict:
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from hydrax import Dataloader, DataGroup

    mesh = Mesh(np.array(jax.devices()), ("data",))
    sharding = NamedSharding(mesh, P("data"))
    batch = spec["batch"]
    group = DataGroup(batch, range(batch * 1_000_000), loader_arrays={"x": ((spec["features"],), np.float32, jnp.float32)})
    kwargs = {}
    path = spec["path"]
    if path == "sharding=":
        kwargs["sharding"] = sharding
    elif path == "placement_func":
        kwargs["placement_func"] = lambda views, layouts, additional, group: {n: jax.device_put(v, sharding) for n, v in views.items()}

    def ready(b):
        x = b.arrays["x"]
        if path == "default + reshard":
            x = jax.device_put(x, sharding)
        return x.block_until_ready()

    with Dataloader(fill, group, loader_count=spec["loaders"], depth=spec["depth"], **kwargs) as loader:
        iterator = iter(loader)
        ready(next(iterator))
        started = time.perf_counter()
        count = 0
        while time.perf_counter() - started < spec["seconds"]:
            b = next(iterator)
            x = ready(b)
            del b, x
            count += 1
        elapsed = time.perf_counter() - started
        stats = loader.transfer_stats
    return {"batches_per_s": count / elapsed, "stats": stats}


def measure(spec: dict) -> dict:
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)], capture_output=True, text=True, env=env, timeout=300)
    for line in out.stdout.splitlines():
        if line.startswith("BENCH-RESULT "):
            return json.loads(line[len("BENCH-RESULT "):])
    raise RuntimeError(f"{spec['path']} failed:\n{out.stderr[-3000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--features", type=int, default=49_152, help="float32 per item (16 x 49,152 x 4 B = 3.1 MB)")
    parser.add_argument("--loaders", type=int, default=2)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="one repeat of one second")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print("BENCH-RESULT " + json.dumps(child(json.loads(args.child))), flush=True)
        return
    if args.quick:
        args.repeat, args.seconds = 1, 1.0
    nbytes = args.batch * args.features * 4
    print(f"batch: {args.batch} x {args.features} float32 = {nbytes / 1e6:.1f} MB over 8 CPU devices; "
          f"{args.loaders} loaders, depth {args.depth}; {os.cpu_count()} CPUs; medians of {args.repeat}")
    rates: dict[str, list[float]] = {path: [] for path in PATHS}
    stats = {}
    for _ in range(args.repeat):
        for path in PATHS:
            spec = dict(path=path, batch=args.batch, features=args.features, loaders=args.loaders, depth=args.depth, seconds=args.seconds)
            result = measure(spec)
            rates[path].append(result["batches_per_s"])
            stats[path] = result["stats"]
    sharded = statistics.median(rates["sharding="])
    print(f"{'path':20} | {'batches/s':>9} | {'GB/s':>6} | sharding= is | runs")
    for path in PATHS:
        rate = statistics.median(rates[path])
        runs = ", ".join(f"{r:.0f}" for r in rates[path])
        print(f"{path:20} | {rate:9.1f} | {rate * nbytes / 1e9:6.2f} | {sharded / rate:10.2f}x | {runs}")
    print("transfer_stats of the last runs:", json.dumps({p: {k: v for k, v in s.items() if k.endswith("batches")} for p, s in stats.items()}))


if __name__ == "__main__":
    main()
