"""Checking what a :class:`~hydrax.Dataloader` is given, with errors that name the argument.

Each function takes one argument (or a few that go together) as the user passed it and returns
it checked and normalised, or raises the ``TypeError``/``ValueError`` hydrax 0.2.2 raised (its
words, where it had any). :func:`run_policy` turns the run's settings into a
:class:`~hydrax.run.plan.RunPolicy`.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Iterable, Mapping
from typing import Any, Callable

from ..checkpoint import LoaderState
from .group import DataGroup
from .hosts import jax_process_split
from ..procs.processes import is_worker
from .plan import RunPolicy

log = logging.getLogger("hydrax.run.loader")

#: The choices of ``on_item_error``.
ON_ITEM_ERROR = ("drop_batch", "skip_item", "raise")
#: What ``timeout_sec=None`` (and hydrax 0.2.2's 0 or less) means: wait (practically) for ever.
ONE_YEAR_S = 31_536_000
#: Loader processes per CPU beyond which a run is refused (with at least :data:`MIN_LOADER_LIMIT`):
#: loaders waiting on storage may well outnumber the cores, but not by more than this.
LOADERS_PER_CPU = 8
MIN_LOADER_LIMIT = 64


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def check_loader_count(loader_count: int, groups: list[DataGroup], depth: int) -> int:
    """``loader_count``, refused past what this machine can run and cut to what the run can use.

    More than :data:`LOADERS_PER_CPU` per usable CPU (at least :data:`MIN_LOADER_LIMIT`) is refused:
    that many processes would exhaust memory or the process table long before they loaded faster.
    More than the items a run can have in flight (``depth`` batches of the largest batch) is cut to
    that, with a warning: the others would never be given a task.
    """
    limit = max(MIN_LOADER_LIMIT, LOADERS_PER_CPU * usable_cpus())
    if loader_count > limit:
        raise ValueError(f"loader_count is {loader_count}, more loader processes than this machine can run: at most {limit} "
                         f"({LOADERS_PER_CPU} per usable CPU, {usable_cpus()} here); a few per CPU is usually enough")
    in_flight = depth * max(g.batch_size for g in groups)
    if loader_count > in_flight:
        log.warning("[hydrax] loader_count is %d, but at most %d items are ever in flight (depth %d x batch %d): "
                    "starting %d loaders", loader_count, in_flight, depth, in_flight // depth, in_flight)
        return in_flight
    return loader_count


def check_int(name: str, value: Any, minimum: int | None = None) -> int:
    """``value`` as an int (not a bool), at least ``minimum``."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"{name} must be an int, got {value!r}")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value}")
    return value


def check_timeout(value: Any) -> int:
    """``timeout_sec`` in seconds: a positive int, or None for no limit. hydrax 0.2.2 read 0 and
    less as "a year"; a program written for it keeps that meaning, with a warning, since in Python
    a timeout of 0 usually means "do not wait" and a negative one is a mistake."""
    if value is None:
        return ONE_YEAR_S
    seconds = check_int("timeout_sec", value)
    if seconds <= 0:
        # stacklevel 4: this function, run_policy, Dataloader.__init__, then the user's line
        warnings.warn(f"timeout_sec={seconds} means no time limit (as in hydrax 0.2.2), not \"do not wait\"; pass "
                      "timeout_sec=None to say so. Values of 0 or less will be refused in a future release.",
                      FutureWarning, stacklevel=4)
        return ONE_YEAR_S
    return seconds


def check_functions(loader_func: Any, startup_func: Any, placement_func: Any) -> None:
    """Refuse a Dataloader built in a worker, or with functions that cannot be called."""
    if is_worker():
        raise RuntimeError("Dataloader cannot run in a worker process.")
    if not callable(loader_func):
        raise TypeError(f"loader_func must be callable, got {type(loader_func).__name__}")
    for name, func in (("startup_func", startup_func), ("placement_func", placement_func)):
        if func is not None and not callable(func):
            raise TypeError(f"{name} must be callable or None, got {type(func).__name__}")


def as_groups(value: Any, what: str) -> list[DataGroup]:
    """``value`` (a DataGroup or an iterable of them) as a non-empty list of DataGroups."""
    items = [value] if isinstance(value, DataGroup) else value
    if not isinstance(items, Iterable):
        raise TypeError(f"{what} must be a hydrax.DataGroup or an iterable of them, got {type(value).__name__}")
    groups = list(items)
    for group in groups:
        if not isinstance(group, DataGroup):
            raise TypeError(f"data of type {type(group).__name__} is not in a hydrax.DataGroup")
    if not groups:
        raise ValueError(f"{what} needs at least one DataGroup")
    return groups


def parse_validation(validation: Any) -> tuple[str | None, int, list[DataGroup]]:
    """``(mode, interval, groups)`` of the ``validation`` argument; ``(None, 1, [])`` without one."""
    if validation is None:
        return None, 1, []
    try:
        mode, interval, groups = validation
    except (TypeError, ValueError):
        raise TypeError("validation must be a tuple (mode, interval, groups)") from None
    if mode not in ("epoch", "batch"):
        raise ValueError("validation mode must be 'epoch' or 'batch'")
    return mode, check_int("validation interval", interval, 1), as_groups(groups, "validation groups")


def parse_start(start_at: Any) -> tuple[int, int]:
    """``start_at`` as ``(epoch, batch)`` ints (see :func:`parse_resume` for a saved state)."""
    try:
        epoch, batch = start_at
        return check_int("start_at epoch", epoch), check_int("start_at batch", batch)
    except (TypeError, ValueError) as exc:
        if "must not be negative" in str(exc):
            raise
        raise TypeError(f"start_at must be (epoch, batch) ints or a hydrax.checkpoint.LoaderState, got {start_at!r}") from None


def parse_resume(start_at: Any) -> LoaderState | None:
    """``start_at`` as a saved position: a :class:`~hydrax.checkpoint.LoaderState`, or the dict
    of its ``to_dict()`` (a newer format raises :class:`~hydrax.errors.CheckpointFormatError`);
    None when it is ``(epoch, batch)``. A mapping is never read as a pair: unpacking one would
    give its first two keys."""
    if isinstance(start_at, LoaderState):
        return start_at
    if isinstance(start_at, Mapping):
        return LoaderState.from_dict(start_at)
    return None


def parse_stream(index: Any, count: Any, first: Any) -> tuple[int, int, int]:
    """``select_stream``'s share of a stream: ``index`` of ``count`` producers, from position ``first``."""
    count = check_int("stream count", count, 1)
    index = check_int("stream index", index)
    if index >= count:
        raise ValueError(f"stream index {index} is not below the count {count}")
    return index, count, check_int("stream first", first)


def parse_end(end_at: Any) -> tuple[str, int] | None:
    """``end_at`` as ``("epoch" | "batch", n)``, or None for a run without an end."""
    if end_at is None:
        return None
    try:
        kind, value = end_at
    except (TypeError, ValueError):
        raise TypeError(f"end_at must be None or (kind, n), got {end_at!r}") from None
    if kind not in ("never", "epoch", "batch"):
        raise ValueError("end_at endpoint must be 'never', 'epoch', or 'batch'")
    return None if kind == "never" else (kind, check_int("end_at value", value))


def process_split(index: Any, count: Any) -> tuple[int, int]:
    """``(process_index, process_count)``: both given, or both from JAX."""
    if index is None and count is None:
        return jax_process_split()
    if index is None or count is None:
        raise ValueError("process_index and process_count go together: pass both, or neither to take them from JAX")
    index, count = check_int("process_index", index, 0), check_int("process_count", count, 1)
    if index >= count:
        raise ValueError(f"process_index must be below process_count ({count}), got {index}")
    return index, count


def run_policy(groups: list[DataGroup], *, depth: Any, loader_count: Any, loader_nice: Any, cacher_count: Any,
               deterministic: Any, timeout_sec: Any, zero_copy: Any, on_item_error: Any, max_consecutive_failures: Any,
               process_index: Any, process_count: Any, sharding: Any, placement_func: Callable | None) -> RunPolicy:
    """The checked settings of a run over ``groups`` (see :class:`~hydrax.Dataloader`)."""
    depth = check_int("depth", depth, 1)
    loader_count = check_int("loader_count", loader_count)
    if all(g.loader_layouts is None for g in groups):
        log.warning("[hydrax] loading exclusively from cache")
        loader_count = 0
    elif loader_count < 1:
        raise ValueError("loaders are required, cannot provision none")
    else:
        loader_count = check_loader_count(loader_count, groups, depth)
    loader_nice = check_int("loader_nice", loader_nice)
    cacher_count = check_int("cacher_count", cacher_count)
    timeout = check_timeout(timeout_sec)
    if zero_copy is not None and not isinstance(zero_copy, bool):
        raise TypeError(f"zero_copy must be None, True or False, got {zero_copy!r}")
    if on_item_error not in ON_ITEM_ERROR:
        raise ValueError(f"on_item_error must be one of {', '.join(map(repr, ON_ITEM_ERROR))}, got {on_item_error!r}")
    if max_consecutive_failures is not None:
        max_consecutive_failures = check_int("max_consecutive_failures", max_consecutive_failures, 1)
    index, count = process_split(process_index, process_count)
    _check_processes(index, count, bool(deterministic), sharding, placement_func)
    return RunPolicy(
        depth=depth, loader_count=loader_count, loader_nice=loader_nice, cacher_count=cacher_count,
        deterministic=bool(deterministic), timeout_s=timeout, zero_copy=zero_copy, on_item_error=on_item_error,
        max_consecutive_failures=max_consecutive_failures, process_index=index, process_count=count,
        # Runs whose batches span processes or devices must not lose a batch quietly.
        never_drop=count > 1 or sharding is not None,
    )


def _check_processes(index: int, count: int, deterministic: bool, sharding: Any, placement_func: Callable | None) -> None:
    if sharding is not None:
        if placement_func is not None:
            raise ValueError("pass sharding or placement_func, not both: with a sharding hydrax places the global arrays itself")
        import jax

        if (index, count) != (jax.process_index(), jax.process_count()):
            raise ValueError(
                f"with a sharding, process_index and process_count are JAX's ({jax.process_index()} of "
                f"{jax.process_count()}), not {index} of {count}: leave them out"
            )
    if count > 1 and not deterministic:
        raise ValueError(
            f"deterministic=False cannot be used with {count} processes: each process would hand out its "
            "share of a different batch whenever loading times differ, and a global batch would mix rows of "
            "different steps. Leave deterministic=True (the default)"
        )
