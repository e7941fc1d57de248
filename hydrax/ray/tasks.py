"""hydrax's work as Ray tasks: how it is cut into chunks, retried, and gathered in order.

A task is retried when its worker or node dies, and when it fails with an error that a second
try may not meet: an object store that did not answer (:class:`~hydrax.errors.StoreUnavailableError`,
after the store's own retries), a connection reset, a timeout. The work hydrax hands to tasks
is idempotent (a shard written again is the same bytes, an index built again the same index),
so a retry cannot leave anything twice. Any other error fails the task at once.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from ..errors import HydraxError
from .runtime import import_ray

#: Tries after the first, for a task whose worker died or whose error is in :data:`TRANSIENT`.
TASK_RETRIES = 3
#: Errors worth another try on another worker (a store unavailable is a ConnectionError).
TRANSIENT = (ConnectionError, TimeoutError)


def remote(function: Callable[..., Any]):
    """``function`` as a Ray task with hydrax's retries."""
    return import_ray().remote(function).options(max_retries=TASK_RETRIES, retry_exceptions=list(TRANSIENT))


def chunk_size(count: int, cpus: float, chunk: int | None, least: int) -> int:
    """Items per task: ``chunk`` when given, else about four tasks per CPU of the cluster (so a
    slow node does not hold the end back) of at least ``least`` items each."""
    if chunk is not None:
        return max(1, chunk)
    return max(least, math.ceil(count / max(1.0, 4 * cpus)))


def task_ranges(count: int, chunk: int | None, least: int) -> list[tuple[int, int]]:
    """``(first, end)`` of the items of each task, for ``count`` items cut by :func:`chunk_size`
    for the cluster this process is connected to."""
    size = chunk_size(count, import_ray().cluster_resources().get("CPU", 1), chunk, least)
    return [(first, min(first + size, count)) for first in range(0, count, size)]


def gather(refs: list, sizes: list[int], on_done: Callable[[int], Any] | None) -> list:
    """Each task's result, in order; ``on_done(size)`` as each finishes. A task's error is raised
    as itself (a :class:`~hydrax.errors.HydraxError`, an ``OSError``), not as Ray's wrapper, and
    the tasks still running are cancelled."""
    ray = import_ray()
    results: list = [None] * len(refs)
    where = {ref: k for k, ref in enumerate(refs)}
    pending = list(refs)
    try:
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                k = where[ref]
                try:
                    results[k] = ray.get(ref)
                except ray.exceptions.RayTaskError as exc:
                    cause = getattr(exc, "cause", None)
                    raise (cause if isinstance(cause, (HydraxError, OSError)) else exc) from None
                if on_done is not None:
                    on_done(sizes[k])
    except BaseException:
        for ref in pending:
            ray.cancel(ref, force=True)
        raise
    return results
