"""One process of a (possibly multi-process) training job, for tests/test_sharding.py and test_cache.py.

Run as ``python tests/support/global_batches_job.py CONFIG_JSON`` (one process per JAX process).
It loads a small deterministic dataset with hydrax and writes, as JSON on its last stdout line,
every batch it got: numbering, item indices, seeds and, for each array, every addressable device's
shard (its index in the global array, its values, and whether its buffer lies in hydrax's arena).

Config keys: ``process_id``, ``process_count``, ``devices`` (per process), ``port``, ``mesh``
(``none`` for the plain single-process reference, ``data``, ``interleaved``, ``2d``,
``replicated``, ``items``, ``process_local``: no sharding, a ``placement_func`` that builds global
arrays from this process's rows), ``batch_size``, ``items``, ``start_at``, ``end_at``, ``validation``,
``fail_item`` and ``fail_process`` (the loader raises there), ``keep`` (hold every batch),
``depth``, ``timeout``, ``die_process`` (that process exits hard after its first batch),
``cache`` (the training group's ``cache_location``, direct mode), ``explicit`` (with ``cache``:
explicit mode, the loop caching ``2 * x`` as ``y`` for each uncached batch) and ``refuse`` (the
loader raises for every item: every batch must come from the cache).
"""

import functools
import json
import os
import sys

import numpy as np

FEATURES = 4  # 16 bytes a row: device blocks of a few rows are not 64-byte multiples
config: dict = {}


def load(fail_item, item, arrays, seed):
    if config.get("refuse"):
        raise AssertionError(f"item {item} went to the loader, not the cache")
    if item == fail_item:
        raise ValueError(f"item {item} is broken")
    arrays["x"][...] = item + np.arange(FEATURES, dtype=np.float32) / 10
    arrays["seed"][...] = -1 if seed is None else seed


def arena_ranges():
    """Address ranges of hydrax's shared memory in this process (from /proc/self/maps)."""
    ranges = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            if "hydrax-arena" in line:
                start, stop = (int(x, 16) for x in line.split()[0].split("-"))
                ranges.append((start, stop))
    return ranges


def mesh_and_sharding(kind):
    import jax
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    devices = jax.devices()
    if kind == "interleaved":
        # host 0's first device, host 1's first device, ..., so every host holds non-adjacent rows
        devices = sorted(devices, key=lambda d: (devices.index(d) % config["devices"], d.process_index))
    if kind in ("2d", "items"):
        mesh = Mesh(np.array(devices).reshape(-1, 2), ("data", "model"))
        if kind == "items":  # the item dimension split over "model": no aliasing possible
            return {"x": NamedSharding(mesh, P("data", "model")), "seed": NamedSharding(mesh, P("data"))}
        return NamedSharding(mesh, P("data"))
    mesh = Mesh(np.array(devices), ("data",))
    if kind == "replicated":
        return {"x": NamedSharding(mesh, P("data")), "seed": NamedSharding(mesh, P())}
    return NamedSharding(mesh, P("data"))


def main():
    import jax

    if config["process_count"] > 1:
        jax.distributed.initialize(f"127.0.0.1:{config['port']}", config["process_count"], config["process_id"])
    import jax.numpy as jnp

    from hydrax import BatchFailedError, BatchTimeoutError, Dataloader, DataGroup

    arrays = {"x": ((FEATURES,), np.float32, jnp.float32), "seed": ((), np.int32, jnp.int32)}
    bs = config["batch_size"]
    cache = {"cache_location": config["cache"], "shuffle_later": "itemwise"} if config.get("cache") else {}
    if config.get("explicit"):
        cache["cache_arrays"] = {"y": ((FEATURES,), np.float32, jnp.float32)}
    train = DataGroup(bs, list(range(config["items"])), loader_arrays=arrays, seed=7, **cache)
    kwargs = {}
    if config.get("validation"):
        mode, interval = config["validation"]
        kwargs["validation"] = (mode, interval, DataGroup(bs, list(range(1000, 1000 + 2 * bs)), loader_arrays=arrays))
    if config["mesh"] == "process_local":
        # without sharding=: this process's rows, made global by the user's placement_func
        sharding = mesh_and_sharding("data")
        kwargs["placement_func"] = lambda views, layouts, additional, group: {
            name: jax.make_array_from_process_local_data(sharding, np.asarray(view)) for name, view in views.items()
        }
    elif config["mesh"] != "none":
        kwargs["sharding"] = mesh_and_sharding(config["mesh"])
    out = {"batches": [], "error": None}
    kept = []
    try:
        fail_item = config.get("fail_item") if jax.process_index() == config.get("fail_process", 0) else None
        with Dataloader(
            functools.partial(load, fail_item), train, depth=config.get("depth", 3), loader_count=1, timeout_sec=config.get("timeout", 60),
            start_at=tuple(config.get("start_at", (0, 0))), end_at=tuple(config.get("end_at", ("epoch", 2))), **kwargs,
        ) as loader:
            for batch in loader:
                record = {"kind": "T" if batch.is_training else "V", "indices": list(batch.indices), "arrays": {}}
                if config.get("explicit"):
                    record["uncached"] = batch.uncached
                    if batch.uncached:
                        batch.cache({"y": batch.arrays["x"] * 2})
                if batch.is_training:
                    record.update(num=batch.batch_num, epoch=batch.epoch, seeds=list(batch.seeds))
                else:
                    record.update(num=batch.validation_epoch_batch, run=batch.validation_epoch)
                ranges = arena_ranges()
                for name, array in batch.arrays.items():
                    record["shape"] = list(array.shape)
                    shards = []
                    for shard in array.addressable_shards:
                        pointer = shard.data.unsafe_buffer_pointer()
                        index = [list(s.indices(n)) for s, n in zip(shard.index, array.shape)]
                        shards.append([shard.device.id, index, np.asarray(shard.data).tolist(), any(a <= pointer < b for a, b in ranges)])
                    record["arrays"][name] = shards
                out["batches"].append(record)
                if config.get("keep"):
                    kept.append(batch)
                if config.get("die_process") == jax.process_index():
                    os._exit(3)
                del batch
            out["stats"] = loader.transfer_stats
    except ValueError as exc:
        if not config.get("expect_error"):
            raise
        out["error"] = {"type": type(exc).__name__, "message": str(exc)}
    except (BatchFailedError, BatchTimeoutError) as exc:
        out["error"] = {"type": type(exc).__name__, "message": str(exc), "process": getattr(exc, "process_index", None), "batch": getattr(exc, "batch", None)}
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    config.update(json.loads(sys.argv[1]))
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={config['devices']}"
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    main()
