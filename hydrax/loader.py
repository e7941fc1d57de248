"""Dataloader: the conductor of a run.

It checks the arguments, builds the schedule plan, and inside its ``with`` block owns the arena,
the worker processes and the pipeline thread; ``__next__`` hands out the pipeline's batches and
turns interrupts, timeouts and dead workers into the exceptions hydrax 0.2.2 programs expect.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import queue
import signal
import sys
import threading
import time
import warnings
from collections.abc import Iterable
from typing import Any, Callable, Generic, TypeVar

from .arena import Arena
from .batch import Batch
from .cache import CacheWriter, GroupCache
from .errors import BatchFailedError, BatchTimeoutError
from .group import DataGroup
from .hosts import HostAgreement, distributed_client
from .pipeline import End, Failure, Pipeline, Ready
from .placement import TransferStats, collect_released_buffers
from .schedule import GroupPlan, Plan, host_share, iter_steps, normalise_start, plan_fingerprint, share_ranges
from .sharding import GroupSharding, as_shardings, plan_group
from .messages import TASK_BYTES
from .processes import is_worker, jax_backend_live, start_method, warm_forkserver
from .workers import GroupSpec, WorkerConfig, WorkerPool

D = TypeVar("D")
log = logging.getLogger(__name__)

_ONE_YEAR = 31_536_000
_UNSET = object()
_WAIT_SLICE_S = 0.1
#: The choices of ``on_item_error``.
ON_ITEM_ERROR = ("drop_batch", "skip_item", "raise")
#: Bytes of task records that may sit in the task pipe at once (below the 64 KiB pipe buffer).
_TASK_PIPE_BUDGET = 48 * 1024


def _flush_logs() -> None:
    """Flush every handler of the ``hydrax`` loggers' chain (and stderr) before ``os._exit``."""
    logger: logging.Logger | None = log
    while logger is not None:
        for handler in logger.handlers:
            try:
                handler.flush()
            except Exception:
                pass
        logger = logger.parent if logger.propagate else None
    for stream in (sys.stderr, sys.stdout):
        try:
            stream.flush()
        except Exception:
            pass


def _groups(value: Any, what: str) -> list[DataGroup]:
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


def jax_process_split() -> tuple[int, int]:
    """``(process_index, process_count)`` of this JAX process, without starting a JAX backend.

    From JAX when a backend is live or ``jax.distributed.initialize`` has run; otherwise
    ``(0, 1)``. Starting a backend here would cost the loader its fast fork start.
    """
    jax = sys.modules.get("jax")
    if jax is None:
        return 0, 1
    if jax_backend_live():
        return jax.process_index(), jax.process_count()
    try:
        from jax._src import distributed
    except ImportError:  # pragma: no cover - a JAX without that module
        return 0, 1
    state = distributed.global_state
    if getattr(state, "client", None) is None:
        return 0, 1
    return int(state.process_id), int(state.num_processes)


def _process_split(index: Any, count: Any) -> tuple[int, int]:
    if index is None and count is None:
        return jax_process_split()
    if index is None or count is None:
        raise ValueError("process_index and process_count go together: pass both, or neither to take them from JAX")
    index, count = _int("process_index", index, 0), _int("process_count", count, 1)
    if index >= count:
        raise ValueError(f"process_index must be below process_count ({count}), got {index}")
    return index, count


def _int(name: str, value: Any, minimum: int | None = None) -> int:
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"{name} must be an int, got {value!r}")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value}")
    return value


class Dataloader(Generic[D]):
    """Loads batches of data with worker processes, straight into shared memory, for JAX.

    Use it as a context manager and iterate it::

        with Dataloader(load, DataGroup(256, paths, loader_arrays={"x": ((32,), np.float32, jnp.float32)})) as dl:
            for batch in dl:
                train_step(batch.arrays["x"])
                del batch

    :param loader_func: ``loader_func(item, arrays, seed)``, called in a worker process once per
        item. ``arrays`` maps each loader array name to a writable numpy view of the item's place
        in the batch; overwrite it completely and keep no reference to it. ``seed`` is an int for
        training items and None for validation. Return None or a dict of picklable extras. When
        this process has already initialised JAX, workers start from a fork server and receive
        it pickled: a function of the main script (a lambda, a closure, a method of a class
        defined under the main guard) travels by value with the globals it uses, one of another
        module by name (that module must be importable); the main module itself never runs again.
    :param training: a DataGroup or an iterable of DataGroups; one pass over all of them is an epoch.
    :param validation: ``(mode, interval, groups)``: after every ``interval`` training ``"batch"``
        es or ``"epoch"`` s, one pass over the validation groups.
    :param depth: batch slots in shared memory: batches loading, waiting, and (on the CPU backend)
        held by the training loop without a copy.
    :param loader_count: worker processes. The items of one batch are spread over all of them.
        None are started when no group has ``loader_arrays`` (every batch comes from a cache).
    :param loader_nice: ``os.nice`` increment applied in each worker.
    :param cacher_count: threads that write batch files of the groups' on-disk caches (at least 1
        when a group's cache is writable; at most ``depth``). 0 when every cache is read-only.
    :param start_at: ``(epoch, batch)`` to start from; batches before it are skipped but numbered,
        shuffled and seeded exactly as in an uninterrupted run, so a resume is bit-exact.
    :param end_at: ``("epoch", n)`` or ``("batch", n)`` to stop before absolute epoch or batch
        ``n``; None or ``("never", ...)`` to run until interrupted.
    :param interleave_groups: with several training groups, pick the least-consumed group before
        every batch; otherwise drain them in order.
    :param deterministic: deliver batches in schedule order; False delivers each as soon as it is ready.
    :param timeout_sec: raise :class:`BatchTimeoutError` when no batch comes for this many seconds
        (``<= 0``: a year).
    :param startup_func: called once in each worker before it loads anything.
    :param placement_func: ``placement_func(arrays, layouts, additional, group)`` returning a dict of
        ``jax.Array`` with the full batch shapes; the default places on the default device.
    :param zero_copy: (hydrax extension) on the CPU backend, let the default placement hand slot
        memory to JAX without a copy while a slot stays free for loading. None (default) and True
        allow it; False always copies. See :attr:`transfer_stats`.
    :param process_index: (hydrax extension) with ``process_count``: this process loads share
        ``process_index`` of ``process_count`` equal, contiguous shares of every batch (with
        ``sharding``, the rows its devices hold instead). A group's
        ``batch_size`` is then the global batch size, and each process gets ``batch_size //
        process_count`` items per batch, with the item indices and seeds those items have in the
        global batch, so the global sequence is the same for any process count and every process
        gets the same number of batches. Both default to JAX's ``process_index()`` and
        ``process_count()`` when a JAX backend is live or ``jax.distributed`` is initialised, else
        to a single process.
    :param process_count: see ``process_index``.
    :param sharding: (hydrax extension) a :class:`jax.sharding.Sharding` (or a dict of them by
        array name) for global arrays: ``batch.arrays[name]`` is then one ``jax.Array`` of the
        group's full ``batch_size``, laid out over the sharding's devices, on every process. Each
        process loads only the rows its own devices hold (from the sharding's device map, so any
        mesh order works), every device's rows start on a 64-byte boundary of the slot, and on
        the CPU backend each device's shard aliases the slot (copies instead when the loop keeps
        batches, as above). Every batch size must divide evenly over the sharding. Not with
        ``placement_func``; ``process_index`` and ``process_count`` come from JAX.
        Runs with ``sharding`` or with several processes never drop a batch: a failed batch
        raises :class:`hydrax.BatchFailedError`, on every process (see the "Multiple devices and
        hosts" guide).
    :param on_item_error: (hydrax extension) what an item whose ``loader_func`` raises does to its
        batch: ``"drop_batch"`` (the default, as in 0.2.2: the batch is dropped and its number
        skipped), ``"skip_item"`` (the item's place is zero-filled, the batch is delivered, and
        :attr:`Batch.item_errors` / :attr:`Batch.item_mask` say which items failed), or
        ``"raise"`` (:class:`hydrax.BatchFailedError` ends the run). hydrax's own errors for data
        that cannot be read (``StoreError``, ``ShardFormatError``) end the run in every mode.
    :param max_consecutive_failures: (hydrax extension) raise :class:`hydrax.BatchFailedError`
        once this many batches in a row have failed (dropped, or every item skipped): a loader
        that fails on every item (a wrong field name, a store that is down) must not end the run
        quietly with no batches. None: never (0.2.2's behaviour). See :attr:`dropped_batches`.
    """

    def __init__(
        self,
        loader_func: Callable[..., Any],
        training: DataGroup[D] | Iterable[DataGroup[D]],
        *,
        validation: tuple[str, int, DataGroup[D] | Iterable[DataGroup[D]]] | None = None,
        depth: int = 3,
        loader_count: int = 1,
        loader_nice: int = 0,
        cacher_count: int = 1,
        start_at: tuple[int, int] = (0, 0),
        end_at: tuple[str, int] | None = None,
        interleave_groups: bool = True,
        deterministic: bool = True,
        timeout_sec: int = 60,
        startup_func: Callable[[], None] | None = None,
        placement_func: Callable[..., dict] | None = None,
        zero_copy: bool | None = None,
        process_index: int | None = None,
        process_count: int | None = None,
        sharding: Any = None,
        on_item_error: str = "drop_batch",
        max_consecutive_failures: int | None = 10,
    ) -> None:
        if type(self) is not Dataloader:
            warnings.warn(f"{type(self).__name__} derives from hydrax.Dataloader. This is not supported.", SyntaxWarning, stacklevel=2)
        if is_worker():
            raise RuntimeError("Dataloader cannot run in a worker process.")
        if not callable(loader_func):
            raise TypeError(f"loader_func must be callable, got {type(loader_func).__name__}")
        for name, func in (("startup_func", startup_func), ("placement_func", placement_func)):
            if func is not None and not callable(func):
                raise TypeError(f"{name} must be callable or None, got {type(func).__name__}")
        self._training = _groups(training, "training")
        self._validation: list[DataGroup] = []
        validation_mode, validation_interval = None, 1
        if validation is not None:
            try:
                validation_mode, validation_interval, validation_groups = validation
            except (TypeError, ValueError):
                raise TypeError("validation must be a tuple (mode, interval, groups)") from None
            if validation_mode not in ("epoch", "batch"):
                raise ValueError("validation mode must be 'epoch' or 'batch'")
            validation_interval = _int("validation interval", validation_interval, 1)
            self._validation = _groups(validation_groups, "validation groups")
        self._depth = _int("depth", depth, 1)
        self._loader_count = _int("loader_count", loader_count)
        groups = self._training + self._validation
        if all(g.loader_layouts is None for g in groups):
            log.warning("[hydrax] loading exclusively from cache")
            self._loader_count = 0
        elif self._loader_count < 1:
            raise ValueError("loaders are required, cannot provision none")
        self._loader_nice = _int("loader_nice", loader_nice)
        self._cacher_count = _int("cacher_count", cacher_count)
        try:
            start_epoch, start_batch = start_at
            start_epoch, start_batch = _int("start_at epoch", start_epoch), _int("start_at batch", start_batch)
        except (TypeError, ValueError) as exc:
            if "must not be negative" in str(exc):
                raise
            raise TypeError(f"start_at must be (epoch, batch) ints, got {start_at!r}") from None
        end = None
        if end_at is not None:
            try:
                kind, value = end_at
            except (TypeError, ValueError):
                raise TypeError(f"end_at must be None or (kind, n), got {end_at!r}") from None
            if kind not in ("never", "epoch", "batch"):
                raise ValueError("end_at endpoint must be 'never', 'epoch', or 'batch'")
            if kind != "never":
                end = (kind, _int("end_at value", value))
        self._deterministic = bool(deterministic)
        self._timeout = _ONE_YEAR if _int("timeout_sec", timeout_sec) <= 0 else int(timeout_sec)
        self._loader_func = loader_func
        self._startup_func = startup_func
        self._placement_func = placement_func
        if zero_copy is not None and not isinstance(zero_copy, bool):
            raise TypeError(f"zero_copy must be None, True or False, got {zero_copy!r}")
        self._zero_copy = zero_copy
        if on_item_error not in ON_ITEM_ERROR:
            raise ValueError(f"on_item_error must be one of {', '.join(map(repr, ON_ITEM_ERROR))}, got {on_item_error!r}")
        self._on_item_error = on_item_error
        self._max_failures = None if max_consecutive_failures is None else _int("max_consecutive_failures", max_consecutive_failures, 1)
        self._process_index, self._process_count = _process_split(process_index, process_count)
        self._sharding = sharding
        if sharding is not None:
            if placement_func is not None:
                raise ValueError("pass sharding or placement_func, not both: with a sharding hydrax places the global arrays itself")
            import jax

            if (self._process_index, self._process_count) != (jax.process_index(), jax.process_count()):
                raise ValueError(
                    f"with a sharding, process_index and process_count are JAX's ({jax.process_index()} of "
                    f"{jax.process_count()}), not {self._process_index} of {self._process_count}: leave them out"
                )
        if self._process_count > 1 and not self._deterministic:
            raise ValueError(
                f"deterministic=False cannot be used with {self._process_count} processes: each process would hand out its "
                "share of a different batch whenever loading times differ, and a global batch would mix rows of "
                "different steps. Leave deterministic=True (the default)"
            )
        # Runs whose batches span processes or devices must not lose a batch quietly.
        self._strict = self._process_count > 1 or sharding is not None
        self._group_shardings: list[GroupSharding | None] = []
        plans = tuple(self._share(g, "training", i) for i, g in enumerate(self._training))
        bpe = sum(p.batch_count for p in plans)
        self._plan = Plan(
            training=plans,
            validation=tuple(self._share(g, "validation", i) for i, g in enumerate(self._validation)),
            validation_mode=validation_mode,
            validation_interval=validation_interval,
            start=normalise_start((start_epoch, start_batch), bpe),
            end=end,
            interleave=bool(interleave_groups) and len(plans) > 1,
        )
        if sharding is not None and any(g._cache_location is not None for g in groups):
            raise ValueError("a group with an on-disk cache (cache_location) cannot be placed with sharding; "
                             "use process_index/process_count (each process caches its share) or placement_func")
        # Checks or creates every cache's descriptor now, as hydrax 0.2.2 did (a mismatch raises here).
        group_plans = self._plan.training + self._plan.validation
        self._caches: list[GroupCache | None] = [g._open_cache(p, self._process_index, self._process_count) for g, p in zip(groups, group_plans)]
        if any(c is not None and not c.readonly for c in self._caches):
            if self._cacher_count < 1:
                raise ValueError("cachers are required, cannot provision none")
            if self._cacher_count > self._depth:
                warnings.warn(f"ignoring cacher_count ({self._cacher_count}) in excess of depth ({self._depth})", ResourceWarning, stacklevel=2)
                self._cacher_count = self._depth
        else:
            self._cacher_count = 0
        self._writer: CacheWriter | None = None
        self._state = "new"  # new -> running -> done
        self._running = False
        self._interrupted = False
        self._abort = False
        self._sigints = 0
        self._first = True
        self._idle_ns = 0
        self._arena: Arena | None = None
        self._pool: WorkerPool | None = None
        self._pipeline: Pipeline | None = None
        self._previous_sigint: Any = _UNSET
        self._method: str | None = None
        self._stats = TransferStats()
        self._handed = 0  # batches (and failures) taken from the pipeline, in schedule order
        if start_method() == "forkserver":
            # It imports the loader's module (never the main one) in the background until __enter__.
            warm_forkserver(self._modules())

    def _share(self, group: DataGroup, kind: str, i: int) -> GroupPlan:
        count = self._process_count
        what = f"{kind} group {i}"
        if group.batch_size % count:
            raise ValueError(
                f"{what} has batch_size {group.batch_size}, which {count} processes cannot split evenly "
                f"(process_count={count}): make every batch size a multiple of the process count"
            )
        if self._sharding is None:
            self._group_shardings.append(None)
            plan = host_share(group._plan(), self._process_index, count)
        else:
            item_shapes = {name: layout[0][1:] for name, layout in group.loader_layouts.items()}
            sharded = plan_group(as_shardings(self._sharding, list(item_shapes)), group.batch_size, item_shapes, what)
            self._group_shardings.append(sharded)
            plan = share_ranges(group._plan(), sharded.ranges)
        partitions = group.shard_partitions
        if kind == "training" and partitions > 1:
            block = group.batch_size // partitions
            if self._sharding is None and partitions % count:
                raise ValueError(
                    f"{what} has shard_partitions={partitions}, which process_count={count} does not divide: "
                    f"each process must load whole partitions to read only its own shards; use a process count that "
                    f"divides {partitions}, or shard_partitions a multiple of {count}"
                )
            if any(start % block or stop % block for start, stop in plan.share):
                raise ValueError(
                    f"{what} has shard_partitions={partitions}, but the sharding gives this process positions "
                    f"{list(plan.share)} of every batch, which cut through partitions (blocks of {block} positions): "
                    f"each process must load whole partitions to read only its own shards; use shard_partitions that "
                    f"divide the sharding's blocks of rows"
                )
        return plan

    def _modules(self) -> list[str]:
        return [getattr(f, "__module__", None) for f in (self._loader_func, self._startup_func)]

    # -- properties ------------------------------------------------------------------------------
    def select_stream(self, index: int, count: int, first: int = 0) -> None:
        """Deliver only this producer's share of the run: stream positions ``first`` and on that
        are ``index`` modulo ``count`` (before entering the ``with`` block).

        The *stream* is the run's batches, training and validation, in schedule order, numbered
        from 0 at ``start_at`` (:func:`hydrax.schedule.stream_positions`). ``count`` producers
        with indexes ``0 .. count-1`` serve disjoint batches that together make the whole run,
        each with the numbers, items and seeds it has in the full run; :func:`hydrax.serve.serve`
        uses this to feed one training job from several machines. Such a run never drops a
        batch (a consumer waits for every position): a batch that fails raises
        :class:`BatchFailedError`, as a multi-process run does.
        """
        if self._state != "new":
            raise RuntimeError("select_stream must be called before the Dataloader is entered")
        count = _int("stream count", count, 1)
        index = _int("stream index", index)
        if index >= count:
            raise ValueError(f"stream index {index} is not below the count {count}")
        self._plan = dataclasses.replace(self._plan, stream=(index, count, _int("stream first", first)))
        self._strict = True

    @property
    def schedule_fingerprint(self) -> str:
        """A digest of what decides this run's batches (groups, sizes, seeds, shuffles,
        validation, ``start_at``, ``end_at``): equal for every producer serving a share of the
        same run (:meth:`select_stream` does not change it)."""
        return plan_fingerprint(self._plan)

    @property
    def batches_per_epoch(self) -> int:
        """Training batches in one epoch (over all training groups)."""
        return self._plan.batches_per_epoch

    @property
    def batches_per_validation(self) -> int:
        """Batches in one validation run (0 without validation)."""
        return self._plan.batches_per_validation

    @property
    def first_batch(self) -> int:
        """The global number of the first training batch of this run."""
        return self._plan.first_batch

    @property
    def last_batch(self) -> int | None:
        """The global number the run stops before, or None when it has no end."""
        return self._plan.last_batch

    @property
    def process_index(self) -> int:
        """(hydrax extension) Which of :attr:`process_count` processes this is; it loads that share of every batch."""
        return self._process_index

    @property
    def process_count(self) -> int:
        """(hydrax extension) How many processes split every batch (1: this process loads whole batches)."""
        return self._process_count

    @property
    def dropped_batches(self) -> int:
        """(hydrax extension) Batches of this run dropped because an item failed (``on_item_error="drop_batch"``)."""
        return self._pipeline.dropped_batches if self._pipeline is not None else 0

    @property
    def failed_items(self) -> int:
        """(hydrax extension) Items of this run whose ``loader_func`` raised (each dropped its batch, or was skipped)."""
        return self._pipeline.failed_items if self._pipeline is not None else 0

    @property
    def deterministic(self) -> bool:
        """Whether batches are delivered in schedule order."""
        return self._deterministic

    @property
    def interrupted(self) -> bool:
        """True after :meth:`interrupt`, a Ctrl+C, or leaving the ``with`` block early."""
        return self._interrupted

    @property
    def start_method(self) -> str | None:
        """(hydrax extension) How the workers of the current or last run started: ``"fork"`` or ``"forkserver"``."""
        return self._method

    @property
    def transfer_stats(self) -> dict[str, int]:
        """(hydrax extension) Batches and bytes by the path they took to JAX.

        ``aliased``: the slot itself became the ``jax.Array`` (CPU backend, no copy; with
        ``sharding``, every device's shard);
        ``copied``: one copy into memory XLA owns (host memory on CPU, device memory otherwise);
        ``custom``: placed by ``placement_func``; ``pinned``: whether the slots are page-locked
        for GPU transfers.
        """
        stats = self._pipeline.stats if self._pipeline is not None else self._stats
        return stats.as_dict()

    def idle_usec(self) -> int:
        """Microseconds ``__next__`` spent waiting for batches since the last call (first batch excluded)."""
        idle, self._idle_ns = self._idle_ns, 0
        return idle // 1000

    def interrupt(self) -> None:
        """Stop delivering batches: the next ``__next__`` ends the iteration."""
        if self._state != "running":
            raise RuntimeError("dataloader is not set up")
        self._interrupted = True

    # -- lifecycle -------------------------------------------------------------------------------
    def __enter__(self) -> Dataloader[D]:
        if self._state != "new":
            raise RuntimeError("dataloader is already set up" if self._state == "running" else "a Dataloader runs only once: create a new one to run again")
        self._state = "running"
        try:
            self._start()
        except BaseException:
            self._shutdown()
            self._state = "done"
            raise
        return self

    def _start(self) -> None:
        groups = self._training + self._validation
        plans = list(self._plan.training + self._plan.validation)
        layouts = [
            g._slot_layout(s.block_rows, s.device_starts) if s is not None else g._slot_layout((p.local_batch_size,))
            for g, p, s in zip(groups, plans, self._group_shardings)
        ]
        slot_size = max(layout.size for layout in layouts)
        self._arena = Arena(self._depth, slot_size, self._loader_count)
        group_specs = [GroupSpec.of(g, p, layout, i < len(self._training)) for i, (g, p, layout) in enumerate(zip(groups, plans, layouts))]
        config = WorkerConfig(self._loader_func, self._startup_func, self._loader_nice, group_specs, self._arena.spec(),
                              skip_failed_items=self._on_item_error == "skip_item",
                              log_level=logging.getLogger("hydrax").getEffectiveLevel())

        self._method = start_method()
        self._pool = WorkerPool(self._method)
        if self._cacher_count:
            self._writer = CacheWriter(self._cacher_count, self._depth)
        # At most about two tasks per worker and batch (the pipeline uses fewer for cheap items),
        # and never more task records than the task pipe holds.
        chunks = max(1, min(2 * self._loader_count, _TASK_PIPE_BUDGET // (TASK_BYTES * self._depth)))
        agreement = None
        if self._process_count > 1:
            client = distributed_client()
            if client is not None:
                # only a group with loader and cache arrays hands a batch out either uncached or cached
                explicit = any(c is not None and not c.direct and not c.loaderless for c in self._caches)
                agreement = HostAgreement(client, self._process_index, self._process_count, compare_forms=explicit)
        self._pipeline = Pipeline(
            iter_steps(self._plan), groups, plans, layouts, len(self._training), self._arena, self._pool,
            self._placement_func, self._deterministic, chunks, self._zero_copy,
            self._group_shardings, self._strict, agreement, self._process_index, self._on_item_error, self._max_failures,
            self._caches, self._writer,
        )
        self._pipeline.prefill()  # the first workers start loading while the others are still starting
        # With the fork server, what cannot be pickled raises errors.ConfigPicklingError (a
        # TypeError) here, naming the part and what to do.
        if self._loader_count:
            self._pool.start(self._loader_count, config, self._arena.handle(), self._modules())
        self._arena.close_fd()
        self._pipeline.start()
        if agreement is not None:
            agreement.start()
        if threading.current_thread() is threading.main_thread():
            self._previous_sigint = signal.signal(signal.SIGINT, self._on_sigint)
        self._running = True

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._running:
            self._interrupted = True
        failed = self._state == "failed"
        if failed:
            workers = self._pipeline.describe_workers() if self._pipeline is not None else ""
            log.error("[hydrax]: dataloader failed%s", "\n" + workers if workers else "")
        elif exc_type is not None:
            log.warning("[hydrax]: shutting down due to %s", exc_type.__name__)
        self._shutdown()
        self._state = "done"

    def _shutdown(self) -> None:
        self._running = False
        if self._pipeline is not None:
            self._pipeline.stop()
            if self._pipeline.agreement is not None:
                self._pipeline.agreement.stop()
        if self._pool is not None:
            if self._arena is not None:
                self._arena.stop_workers(len(self._pool.processes))  # queued tasks are skipped
            self._pool.close(grace=0.5)
            self._pool = None
        if self._writer is not None:
            self._writer.close()  # the queued batch files are finished, not lost
            self._writer = None
        if self._arena is not None:
            self._arena.close()
            self._arena = None
        if self._previous_sigint is not _UNSET and threading.current_thread() is threading.main_thread():
            # None means a handler installed outside Python; the default is the closest we can restore
            signal.signal(signal.SIGINT, signal.SIG_DFL if self._previous_sigint is None else self._previous_sigint)
            self._previous_sigint = _UNSET

    def _on_sigint(self, signum, frame) -> None:
        self._sigints += 1
        # WARNING, so that a program that configured no logging sees them on stderr, as in 0.2.2
        if self._sigints == 1:
            log.warning("[hydrax] KeyboardInterrupt: interrupting, repeat to abort")
            self._interrupted = True
        elif self._sigints == 2:
            log.warning("[hydrax] KeyboardInterrupt: aborting, repeat to terminate")
            self._abort = True
        else:
            log.warning("[hydrax] KeyboardInterrupt: terminating")
            _flush_logs()
            os._exit(1)

    # -- iteration -------------------------------------------------------------------------------
    def __iter__(self) -> Dataloader[D]:
        if not self._running:
            raise RuntimeError("dataloader is not running")
        return self

    def __next__(self) -> Batch[D]:
        if not self._running:
            raise RuntimeError("dataloader is not running")
        output = self._pipeline.output
        collect_released_buffers()  # the batch the loop just dropped frees its slot now
        while True:
            if self._abort:
                self._fail(KeyboardInterrupt())
                raise KeyboardInterrupt
            try:
                item = output.get_nowait()
            except queue.Empty:
                item = self._wait(output)
            if isinstance(item, End):
                self._running = False
                raise StopIteration
            if isinstance(item, Failure):
                self._fail(item.error)
                raise item.error
            if self._interrupted:
                self._end_interrupted()
            seq = self._handed
            self._handed += 1
            if isinstance(item, Ready):
                try:
                    item = self._pipeline.place(item)
                except Exception as exc:
                    if not self._strict:
                        continue  # placement failed: the batch is dropped, as in 0.2.2
                    error = self._pipeline.failure(item.record, f"placement failed: {exc!r}")
                    self._fail(error)
                    raise error from exc
            agreement = self._pipeline.agreement
            if agreement is not None:
                try:
                    agreement.wait_for(seq, lambda item=item: repr(item), self._timeout)
                except BaseException as exc:
                    self._fail(exc)
                    raise
            self._first = False
            return item

    def _wait(self, output: queue.SimpleQueue) -> Any:
        started = time.monotonic_ns()
        try:
            while True:
                if self._abort:
                    self._fail(KeyboardInterrupt())
                    raise KeyboardInterrupt
                if self._interrupted:
                    self._end_interrupted()
                try:
                    return output.get(timeout=_WAIT_SLICE_S)
                except queue.Empty:
                    pass
                if time.monotonic_ns() - started >= self._timeout * 1_000_000_000:
                    error = BatchTimeoutError(
                        f"no batches have been produced in {self._timeout} seconds; the state of the run:\n"
                        + self._pipeline.describe_workers()
                    )
                    self._fail(error)
                    raise error
        finally:
            if not self._first:
                self._idle_ns += time.monotonic_ns() - started

    def _end_interrupted(self) -> None:
        self._running = False
        raise StopIteration

    def _fail(self, error: BaseException) -> None:
        self._running = False
        self._state = "failed"
        agreement = self._pipeline.agreement if self._pipeline is not None else None
        if agreement is not None and not isinstance(error, BatchFailedError):
            # A batch failure was announced where it happened; anything else is news to the others.
            agreement.fail(self._handed, f"batch {self._handed} of the run (counting validation batches)", repr(error))
