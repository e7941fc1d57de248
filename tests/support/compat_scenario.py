"""Run one differential-test scenario on a hydrax Dataloader and record what it yields.

Shared by ``tools/compat/record_fixtures.py`` (which runs the scenarios on the original hydrax
0.2.2 and writes ``tests/fixtures/compat_022.json``; it imports this module from ``tests/support/``)
and ``tests/test_compat.py`` (which replays them on our re-implementation). Both have the same
public API, so the hydrax module to use is a parameter; this module imports neither hydrax nor, at
module level, JAX.

Importing this module has no side effects: in particular it does not enable JAX x64. The caller
does that before running a scenario (the fixture's arrays are int64).

Worker processes unpickle ``loader`` and the start-up hook by reference, so they import this
module too: it is found on ``sys.path``, which both ``spawn`` (0.2.2) and our ``fork`` and
``forkserver`` workers get from the parent. Keeping JAX out of the module-level imports keeps that
import cheap.

The scenario and result formats are described in ``tools/compat/record_fixtures.py``'s docstring.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import numpy as np

#: The dtype of the fixture's arrays.
DTYPE = "int64"

# --------------------------------------------------------------------------------------------
# Worker side: module-level, so the loader and the start-up hook pickle by reference for spawn,
# fork and forkserver workers alike.

#: Data values for which the loader raises; set in each worker by ``_set_fail_items`` (passed as
#: the Dataloader's ``startup_func``, a ``functools.partial`` of this module-level function).
FAIL_ITEMS: frozenset = frozenset()


def _set_fail_items(items: frozenset) -> None:
    global FAIL_ITEMS
    FAIL_ITEMS = frozenset(items)


def loader(data, arrays, seed):
    if data in FAIL_ITEMS:
        raise ValueError(f"planned failure {data}")
    arrays["item"][0] = data
    arrays["seed"][0] = -1 if seed is None else seed
    return {"d": data}


# --------------------------------------------------------------------------------------------
# Main-process side


def make_group(hydrax: Any, spec: dict, dtype: str = DTYPE):
    """The ``hydrax.DataGroup`` of a GROUP spec: data ``base .. base + n - 1``, arrays ``item`` and ``seed``."""
    import jax.numpy as jnp

    np_dtype = np.dtype(dtype)
    jnp_dtype = jnp.dtype(dtype)
    return hydrax.DataGroup(
        spec["batch_size"],
        list(range(spec["base"], spec["base"] + spec["n"])),
        loader_arrays={
            "item": ((1,), np_dtype, jnp_dtype),
            "seed": ((1,), np_dtype, jnp_dtype),
        },
        seed=spec["seed"],
        shuffle_first=spec["shuffle_first"],
        shuffle_later=spec["shuffle_later"],
    )


def _ints(xs) -> list[int]:
    return [int(x) for x in np.asarray(xs).reshape(-1)]


def _index_of(groups, g) -> int:
    for i, x in enumerate(groups):
        if x is g:
            return i
    raise AssertionError(f"batch group {g!r} is not one of the Dataloader's groups")


def record_batch(batch, training: list, validation_groups: list) -> dict:
    """One yielded batch in the fixture's BATCH format."""
    rec = {
        "kind": "T" if batch.is_training else "V",
        "group": _index_of(training if batch.is_training else validation_groups, batch.group),
        "group_index": int(batch.group_index),
        "indices": _ints(list(batch.indices)),
        "items": _ints(batch.arrays["item"]),
        "item_seeds": _ints(batch.arrays["seed"]),
        "additional_d": [None if v is None else int(v) for v in batch.get_additional("d")],
    }
    if batch.is_training:
        rec["epoch"] = int(batch.epoch)
        rec["epoch_batch"] = int(batch.epoch_batch)
        rec["batch_num"] = int(batch.batch_num)
        rec["seed"] = int(batch.seed)
        rec["seeds"] = _ints(list(batch.seeds))
    else:
        rec["validation_epoch"] = int(batch.validation_epoch)
        rec["validation_epoch_batch"] = int(batch.validation_epoch_batch)
        rec["validation_batch_num"] = int(batch.validation_batch_num)
    return rec


def run_scenario(
    hydrax: Any,
    sc: dict,
    *,
    placement_func: Callable | None = None,
    deterministic: bool = True,
    loader_count: int | None = None,
    depth: int | None = None,
    dtype: str = DTYPE,
    extra: dict | None = None,
) -> dict:
    """Run scenario ``sc`` on ``hydrax.Dataloader``; the result has the fixture's ``result`` format.

    ``loader_count`` and ``depth`` override the scenario's own; ``placement_func=None`` leaves the
    Dataloader's default placement; ``extra`` adds arguments only this hydrax has.
    """
    training = [make_group(hydrax, g, dtype) for g in sc["training"]]
    validation_groups: list = []
    validation = None
    if sc["validation"] is not None:
        validation_groups = [make_group(hydrax, g, dtype) for g in sc["validation"]["groups"]]
        validation = (sc["validation"]["mode"], sc["validation"]["interval"], validation_groups)
    kw = sc["kwargs"]
    dl = hydrax.Dataloader(
        loader,
        training,
        validation=validation,
        depth=kw["depth"] if depth is None else depth,
        loader_count=kw["loader_count"] if loader_count is None else loader_count,
        start_at=tuple(kw["start_at"]),
        end_at=None if kw["end_at"] is None else tuple(kw["end_at"]),
        interleave_groups=kw["interleave_groups"],
        deterministic=deterministic,
        timeout_sec=30,
        startup_func=functools.partial(_set_fail_items, frozenset(sc["fail_items"])),
        placement_func=placement_func,
        **(extra or {}),
    )
    batches = []
    max_batches = sc["max_batches"]
    with dl:
        for batch in dl:
            batches.append(record_batch(batch, training, validation_groups))
            del batch
            if max_batches is not None and len(batches) >= max_batches:
                break
    return {
        "batches_per_epoch": int(dl.batches_per_epoch),
        "batches_per_validation": int(dl.batches_per_validation),
        "first_batch": int(dl.first_batch),
        "last_batch": None if dl.last_batch is None else int(dl.last_batch),
        "interrupted": bool(dl.interrupted),
        "batches": batches,
    }
