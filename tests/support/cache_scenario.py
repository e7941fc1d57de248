"""Run one on-disk cache scenario on a hydrax Dataloader and record what it yields.

Shared by ``tools/compat/record_cache_fixtures.py`` (which runs the scenarios on the original
hydrax 0.2.2 and writes ``tests/fixtures/cache_022.json`` and the cache directories under
``tests/fixtures/cache_022/``; it imports this module from ``tests/support/``) and
``tests/test_cache_compat.py`` (which runs them on ours). Both libraries have the same public API,
so the hydrax module is a parameter; this module imports neither hydrax nor, at module level, JAX.
JAX's x64 mode stays off: the files store int64, uint8 and float16, the arrays are int32 and
float32 (the cache converts between them).

A scenario runs in *phases* over one cache directory: ``write`` (a writable cache: direct mode
writes the loaders' arrays; explicit mode calls ``batch.cache`` with arrays computed from the
loaded ones), ``read`` (the same configuration again, over a complete cache), and for some
``only`` (a group without ``loader_arrays``, so read-only, over the same cache). Each phase records
every batch and how many times the loader function ran.

Worker processes unpickle ``load`` and ``count_calls_to`` by reference, so they import this
module: it must be on ``sys.path`` (0.2.2's spawn and our workers both take the parent's).
"""

from __future__ import annotations

import functools
import os
from typing import Any

import numpy as np

#: Where the loader counts its calls (one byte per call), set in each worker by ``count_calls_to``.
CALLS_PATH: str | None = None


def count_calls_to(path: str) -> None:
    global CALLS_PATH
    CALLS_PATH = path


def load(data, arrays, seed):
    if CALLS_PATH is not None:
        with open(CALLS_PATH, "ab") as f:
            f.write(b".")
    if "tag" in arrays:
        arrays["tag"][...] = [data % 256, (data * 7) % 256, 255 - data]
    if "item" in arrays:
        arrays["item"][...] = data
    if "seed" in arrays:
        arrays["seed"][...] = -1 if seed is None else seed
    if "x" in arrays:
        arrays["x"][...] = data
    return {"d": data}


def place(arrays, layouts, additional, group):
    """A copying placement (0.2.2's default one can alias its shared memory and stall)."""
    import jax.numpy as jnp

    return {k: jnp.asarray(np.array(v, copy=True), dtype=layouts[k][2]) for k, v in arrays.items()}


#: The numpy views of batches placed by ``place_holding``, until ``run_phase`` lets them go.
HELD: list = []


def place_holding(arrays, layouts, additional, group):
    """``place``, keeping the batch's memory alive until ``run_phase`` has seen its file written.

    0.2.2's direct mode finishes a batch file (flush, extras, rename) on a cacher thread, from the
    batch's memory; once a copying placement has let that memory go, the cacher fails ("mmap closed
    or invalid") and leaves a file of arrays without extras, which every later run skips. Keeping
    the views until the file is complete records what 0.2.2 writes when that race goes its way.
    """
    HELD.append(dict(arrays))
    return place(arrays, layouts, additional, group)


def _wait_written(path: str, size: int, timeout: float = 60.0) -> None:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if os.path.getsize(path) > size:
                time.sleep(0.05)  # the rename and the last bytes of the extras
                return
        except FileNotFoundError:
            pass
        time.sleep(0.01)


def scenarios() -> list[dict]:
    """The scenarios: small, deterministic, and free of 0.2.2's direct-mode race (no path is
    needed again while it is written: one epoch per run for files shared by every epoch)."""

    def sc(name, mode, n, batch_size, *, seed=0, shuffle_first=False, shuffle_later="default", epochs=1,
           validation=None, phases=("write", "read")):
        return {"name": name, "mode": mode, "n": n, "batch_size": batch_size, "seed": seed, "shuffle_first": shuffle_first,
                "shuffle_later": shuffle_later, "epochs": epochs, "validation": validation, "phases": list(phases)}

    return [
        # tag (uint8) at 0, item (int64) at 8, seed at 24: offsets that are not 64-byte ones
        sc("direct_repeat", "direct", 9, 2, shuffle_later="repeat"),
        # e{epoch} files, a shuffle_first permutation and an item permutation per epoch
        sc("direct_itemwise", "direct", 8, 3, seed=5, shuffle_first=True, shuffle_later="itemwise", epochs=2),
        # "default" is batchwise with a cache: e0 files; validation files are e0 too
        sc("direct_batchwise_validation", "direct", 10, 4, seed=3, validation={"n": 6, "batch_size": 3}),
        # cache arrays of other dtypes than the loader's, new extras, reseed: e{epoch} files
        sc("explicit_reseed", "explicit", 7, 3, seed=2, shuffle_later="reseed", epochs=2, phases=("write", "read", "only")),
    ]


_ENCODED = {
    "a": ((5,), "uint8", "int32"),
    "b": ((1,), "int64", "int32"),
    "c": ((2,), "float16", "float32"),
}


def _specs(mode: str, role: str):
    import jax.numpy as jnp

    def spec(shape, np_dtype, jax_dtype):
        return (shape, np.dtype(np_dtype), jnp.dtype(jax_dtype))

    if mode == "direct":
        return {"tag": spec((3,), "uint8", "int32"), "item": spec((1,), "int64", "int32"), "seed": spec((1,), "int64", "int32")}
    if role == "loader":
        return {"x": spec((1,), "int32", "int32")}
    return {name: spec(*value) for name, value in _ENCODED.items()}


def make_groups(hydrax: Any, sc: dict, location: str, phase: str):
    """The training group and the validation groups (or None) of ``sc`` over the cache at ``location``."""
    only = phase == "only"
    loader_arrays = None if only else _specs(sc["mode"], "loader")
    cache_arrays = _specs(sc["mode"], "cache") if sc["mode"] == "explicit" else None
    training = hydrax.DataGroup(
        sc["batch_size"], list(range(sc["n"])), loader_arrays=loader_arrays, cache_arrays=cache_arrays,
        cache_location=os.path.join(location, "train"), seed=sc["seed"], shuffle_first=sc["shuffle_first"],
        shuffle_later=sc["shuffle_later"],
    )
    validation = None
    if sc["validation"] is not None:
        v = sc["validation"]
        validation = [hydrax.DataGroup(v["batch_size"], list(range(100, 100 + v["n"])), loader_arrays=loader_arrays,
                                       cache_arrays=cache_arrays, cache_location=os.path.join(location, "valid"))]
    return training, validation


def encode(batch) -> tuple[dict, dict]:
    """The cache arrays an explicit-mode scenario stores for an uncached batch, and its new extras."""
    import jax.numpy as jnp

    x = batch.arrays["x"]
    arrays = {
        "a": (x * 3 + jnp.arange(5, dtype=jnp.int32)[None, :]) % 256,
        "b": x * 1000 + 7,
        "c": jnp.concatenate([x / 4, -x / 4], axis=1).astype(jnp.float32),
    }
    d = batch.get_additional("d")
    return arrays, {"d": list(d), "sq": [v * v for v in d]}


def _values(array) -> list:
    a = np.asarray(array)
    return a.tolist()


def record_batch(batch) -> dict:
    rec = {
        "kind": "T" if batch.is_training else "V",
        "group_index": int(batch.group_index),
        "indices": [int(i) for i in batch.indices],
        "uncached": bool(batch.uncached),
        "arrays": {name: _values(batch.arrays[name]) for name in sorted(batch.arrays)},
        "additional": {key: list(batch.additional[key]) for key in sorted(batch.additional)},
    }
    if not batch.uncached:
        rec["offsets"] = {name: int(batch.layouts[name][3]) for name in sorted(batch.layouts)}
    if batch.is_training:
        rec["epoch"] = int(batch.epoch)
        rec["batch_num"] = int(batch.batch_num)
    else:
        rec["validation_epoch"] = int(batch.validation_epoch)
    return rec


def batch_path(sc: dict, location: str, batch) -> str:
    """The file of ``batch`` in the scenario's cache (the names of hydrax-api.md section 9)."""
    mode = "batchwise" if sc["shuffle_later"] == "default" else sc["shuffle_later"]
    epoch = batch.epoch if batch.is_training and mode in ("reseed", "itemwise") else 0
    return os.path.join(location, "train" if batch.is_training else "valid", f"e{epoch}-b{batch.group_index}.dat")


def run_phase(hydrax: Any, sc: dict, location: str, phase: str, *, placement_func=None, extra: dict | None = None) -> dict:
    """Run one phase of ``sc`` over the cache at ``location``; its batches and the loader's call count.

    With ``placement_func=place_holding`` each batch's memory is kept until its file is written.
    """
    calls = os.path.join(location, f"calls-{phase}")
    open(calls, "wb").close()
    training, validation = make_groups(hydrax, sc, location, phase)
    dl = hydrax.Dataloader(
        load, training, validation=None if validation is None else ("epoch", 1, validation),
        depth=3, loader_count=2, end_at=("epoch", sc["epochs"]), timeout_sec=30,
        startup_func=functools.partial(count_calls_to, calls), placement_func=placement_func, **(extra or {}),
    )
    batches = []
    with dl:
        for batch in dl:
            if sc["mode"] == "explicit" and batch.uncached:
                arrays, additional = encode(batch)
                batch.cache(arrays, additional)
            batches.append(record_batch(batch))
            if HELD:
                _wait_written(batch_path(sc, location, batch), batch.group.cache_size)
                HELD.clear()
            del batch
    with open(calls, "rb") as f:
        count = len(f.read())
    os.unlink(calls)
    return {"batches": batches, "loader_calls": count}


def cache_files(location: str) -> dict[str, bytes]:
    """Every file of the cache directories under ``location``, by relative path (temporary files excluded)."""
    files = {}
    for root, _dirs, names in os.walk(location):
        for name in names:
            if name.endswith(".tmp") or name.startswith("calls-"):
                continue
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                files[os.path.relpath(path, location)] = f.read()
    return dict(sorted(files.items()))
