"""The machinery of one running Dataloader, started together and stopped together, in order.

A run needs an arena (the shared memory of its batch slots), a pool of worker processes, the
pipeline thread, the cache's writer threads and, with several processes, the agreement with the
others. :class:`Engine` builds them from the run's plan, groups and policy when the ``with``
block is entered, and takes them down when it is left, however the run ended: the workers are
told to stop and then ended, the queued cache files are written, and the arena goes when the
last batch that views it does.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

from ..procs.arena import Arena, machine_memory
from ..cache.runcache import RunCache
from ..cache.writers import CacheWriter
from ..errors import ArenaMemoryError, StartMethodError
from .announce import reads_ahead
from .hosts import HostAgreement, distributed_client
from .pipeline import Pipeline
from ..procs.processes import fork_hazards, start_method, warm_forkserver
from .plan import RunGroups, RunPolicy
from ..order.schedule import Plan, iter_steps
from ..procs.workers import GroupSpec, WorkerConfig, WorkerPool


@dataclass(frozen=True)
class RunFunctions:
    """The user's functions of a run (see :class:`~hydrax.Dataloader`)."""

    loader_func: Callable
    startup_func: Callable | None = None
    placement_func: Callable | None = None

    def modules(self) -> list[str | None]:
        """The modules the worker functions come from: the fork server imports them ahead."""
        return [getattr(f, "__module__", None) for f in (self.loader_func, self.startup_func)]


class Engine:
    """The arena, workers, pipeline, cache writers and host agreement of one run.

    Nothing starts before :meth:`start`; :meth:`close` takes everything down and may be called
    after a partial start.
    """

    def __init__(self, plan: Plan, groups: RunGroups, policy: RunPolicy, functions: RunFunctions) -> None:
        self._plan = plan
        self._groups = groups
        self._policy = policy
        self._functions = functions
        self.arena: Arena | None = None
        self.pool: WorkerPool | None = None
        self.pipeline: Pipeline | None = None
        self.agreement: HostAgreement | None = None
        self.cache: RunCache | None = None
        #: How the workers start: ``"fork"`` or ``"forkserver"`` (see :func:`hydrax.procs.processes.start_method`).
        self.method: str | None = None

    def start(self) -> None:
        """Start the run: the first tasks are queued before the workers exist, so the first workers
        start loading while the others are still starting."""
        policy = self._policy
        groups = list(self._groups)
        check_arena_memory(policy.depth, groups)
        self.arena = Arena(policy.depth, max(run.layout.size for run in groups), policy.loader_count,
                           items=max(run.plan.local_batch_size for run in groups))
        config = WorkerConfig(
            self._functions.loader_func, self._functions.startup_func, policy.loader_nice,
            [GroupSpec(run.group.data, run.plan, run.layout.item_places(), run.training) for run in groups],
            self.arena.spec(), skip_failed_items=policy.on_item_error == "skip_item",
            log_level=logging.getLogger("hydrax").getEffectiveLevel(),
        )
        self.method = start_method()
        check_fork_safe(self.method, groups)
        self.pool = WorkerPool(self.method)
        self.cache = RunCache(CacheWriter(policy.cacher_count, policy.depth) if policy.cacher_count else None)
        self.agreement = self._agreement()
        self.pipeline = Pipeline(steps=iter_steps(self._plan), groups=self._groups, policy=policy, arena=self.arena,
                                 pool=self.pool, cache=self.cache, placement_func=self._functions.placement_func,
                                 agreement=self.agreement, stride=self._plan.stream[1] if self._plan.stream else 1)
        self.pipeline.prefill()
        if self.method == "forkserver":
            self.pipeline.announce()
        # With the fork server, what cannot be pickled raises errors.ConfigPicklingError (a
        # TypeError) here, naming the part and what to do.
        if policy.loader_count:
            self.pool.start(policy.loader_count, config, self.arena.handle(), self._functions.modules())
        self.arena.close_fd()
        self.pipeline.start()
        if self.agreement is not None:
            self.agreement.start()

    def _agreement(self) -> HostAgreement | None:
        if self._policy.process_count <= 1:
            return None
        client = distributed_client()
        if client is None:
            return None
        # only a group with loader and cache arrays hands a batch out either uncached or cached
        explicit = any(run.cache is not None and not run.cache.direct and not run.cache.loaderless for run in self._groups)
        return HostAgreement(client, self._policy.process_index, self._policy.process_count, compare_forms=explicit)

    def close(self) -> None:
        """Stop everything that was started, in order."""
        if self.pipeline is not None:
            self.pipeline.stop()
        if self.agreement is not None:
            self.agreement.stop()
        if self.pool is not None:
            if self.arena is not None:
                self.arena.stop_workers(len(self.pool.processes))  # queued tasks are skipped
            self.pool.close(grace=0.5)
            self.pool = None
        if self.cache is not None:
            self.cache.close()  # the queued batch files are finished, not lost
            self.cache = None
        if self.arena is not None:
            self.arena.close()
            self.arena = None


def warm_up(functions: RunFunctions) -> None:
    """Start the fork server now when the run will need it, importing the loader's module (never
    the main one) in the background until the run is entered."""
    if start_method() == "forkserver":
        warm_forkserver(functions.modules())


def check_fork_safe(method: str, groups) -> None:
    """Refuse to fork the workers of a run whose data reads remote shards from a process whose
    request threads a fork does not carry over (only where ``HYDRAX_START_METHOD=fork`` forces
    it): they would hang on their first request, until the batch timeout."""
    hazards = fork_hazards()
    if method != "fork" or not hazards:
        return
    remote = [run.index for run in groups if reads_ahead(run.group.data)]
    if remote:
        raise StartMethodError(
            f"HYDRAX_START_METHOD=fork, but the data of group {remote[0]} reads remote shards and this process "
            f"runs {' and '.join(hazards)}, which forked workers do not inherit: they would hang on their first "
            "request. Unset HYDRAX_START_METHOD (or set it to 'forkserver') to read remote shards.",
            hazards=hazards, group=remote[0])


def check_arena_memory(depth: int, groups) -> None:
    """Refuse a run whose batch slots (``depth`` of its largest batch) exceed the machine's memory,
    naming the group and the array that take the most, before anything is allocated: the mapping
    would otherwise fail with a bare ``OSError`` (or the OS kill the run once the slots fill)."""
    largest = max(groups, key=lambda run: run.layout.size)
    needed, available = depth * largest.layout.size, machine_memory()
    if needed <= available:
        return
    name, array = max(largest.layout.arrays.items(), key=lambda item: item[1].count * item[1].dtype.itemsize)
    raise ArenaMemoryError(
        f"the batch slots need {needed:,} bytes ({depth} x {largest.layout.size:,}), more than this machine's {available:,} "
        f"bytes of memory: array {name!r} of {largest} takes {array.count * array.dtype.itemsize:,} "
        f"bytes a batch (shape {array.shape}, {array.dtype}); lower the batch size, the item shape or depth",
        needed=needed, available=available)
