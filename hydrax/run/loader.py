"""Dataloader: the conductor of a run.

It checks the arguments (:mod:`hydrax.run.arguments`) and settles the run (:mod:`hydrax.run.plan`) when
it is built; inside its ``with`` block an :class:`~hydrax.run.engine.Engine` runs the arena, the
worker processes and the pipeline thread, and ``__next__`` hands out the pipeline's batches,
turning interrupts, timeouts and dead workers into the exceptions hydrax 0.2.2 programs expect.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import logging
import warnings
from collections.abc import Iterable
from typing import Any, Callable, Generic, TypeVar

from .arguments import (as_groups, check_functions, parse_end, parse_resume, parse_start, parse_stream, parse_validation,
                        run_policy)
from .batch import Batch
from ..checkpoint import LoaderState, check_resume, dataset_fingerprint, dataset_summary, schedule_start
from ..order.position import LoopPosition
from .engine import Engine, RunFunctions, warm_up
from ..errors import BatchFailedError, MixtureRangeError
from .group import DataGroup
from .interrupts import Interrupts
from .pipeline import End, Failure, Pipeline, Ready
from .placement import TransferStats, collect_released_buffers
from .plan import plan_run, with_cachers
from ..order.schedule import check_epoch_reached, check_epochs, plan_fingerprint

D = TypeVar("D")
log = logging.getLogger(__name__)



class Lifecycle(enum.Enum):
    """Where a Dataloader is in its one run."""

    #: Built, not entered yet.
    NEW = "new"
    #: Inside the ``with`` block, handing out batches.
    RUNNING = "running"
    #: Inside the ``with`` block, the iteration over: the run reached its end, or was interrupted.
    ENDED = "ended"
    #: Inside the ``with`` block, the run raised (a dead worker, a timeout, a failed batch).
    FAILED = "failed"
    #: The ``with`` block was left: the run cannot be entered again.
    CLOSED = "closed"


# Why a Dataloader that is not running refuses to iterate; 0.2.2's words first, for code that
# matches them. A second ``for`` loop over an ended run is the usual way to get here.
_ONCE = "a Dataloader runs once: for more batches, build a new one with start_at=(epoch, batch) of the next batch"
_NOT_RUNNING = {
    Lifecycle.NEW: "dataloader is not running: start it with 'with Dataloader(...) as loader:' and iterate inside the block",
    Lifecycle.ENDED: f"dataloader is not running: its run has ended (it reached end_at, or was interrupted); {_ONCE}",
    Lifecycle.FAILED: f"dataloader is not running: its run failed with the error raised before; {_ONCE}",
    Lifecycle.CLOSED: f"dataloader is not running: its 'with' block was left; {_ONCE}",
}


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
        More than ``depth`` x the batch size would idle: only that many start (with a warning).
        More than 8 per usable CPU (at least 64) raises ValueError.
        None are started when no group has ``loader_arrays`` (every batch comes from a cache).
    :param loader_nice: ``os.nice`` increment applied in each worker.
    :param cacher_count: threads that write batch files of the groups' on-disk caches (at least 1
        when a group's cache is writable; at most ``depth``). 0 when every cache is read-only.
    :param start_at: ``(epoch, batch)`` to start from; batches before it are skipped but numbered,
        shuffled and seeded exactly as in an uninterrupted run, so a resume is bit-exact. Or a
        :class:`hydrax.checkpoint.LoaderState` from :meth:`state` (or the dict of its
        ``to_dict()``): the run resumes right after the last batch the saving run's loop
        received, a validation run it stopped inside included, and refuses a state saved for
        another dataset with :class:`hydrax.errors.CheckpointMismatchError` (see the
        "Checkpoints and exact resume" guide).
    :param end_at: ``("epoch", n)`` or ``("batch", n)`` to stop before absolute epoch or batch
        ``n``; None or ``("never", ...)`` to run until interrupted.
    :param interleave_groups: with several training groups, pick the least-consumed group before
        every batch; otherwise drain them in order.
    :param deterministic: deliver batches in schedule order; False delivers each as soon as it is ready.
    :param timeout_sec: raise :class:`BatchTimeoutError` when no batch comes for this many seconds;
        None: no limit. (0 or less also means no limit, as in hydrax 0.2.2, with a ``FutureWarning``.)
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
        start_at: tuple[int, int] | LoaderState = (0, 0),
        end_at: tuple[str, int] | None = None,
        interleave_groups: bool = True,
        deterministic: bool = True,
        timeout_sec: int | None = 60,
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
        check_functions(loader_func, startup_func, placement_func)
        training_groups = as_groups(training, "training")
        validation_mode, validation_interval, validation_groups = parse_validation(validation)
        policy = run_policy(
            training_groups + validation_groups, depth=depth, loader_count=loader_count, loader_nice=loader_nice,
            cacher_count=cacher_count, deterministic=deterministic, timeout_sec=timeout_sec, zero_copy=zero_copy,
            on_item_error=on_item_error, max_consecutive_failures=max_consecutive_failures, process_index=process_index,
            process_count=process_count, sharding=sharding, placement_func=placement_func,
        )
        resume = parse_resume(start_at)
        start, self._skip = schedule_start(resume) if resume is not None else (parse_start(start_at), 0)
        # Checks or creates every cache's descriptor, as hydrax 0.2.2 did (a mismatch raises here).
        self._plan, self._groups = plan_run(
            training_groups, validation_groups, policy, validation_mode=validation_mode, validation_interval=validation_interval,
            start_at=start, end_at=parse_end(end_at), interleave=bool(interleave_groups), sharding=sharding,
        )
        if resume is not None:
            check_resume(resume, self._plan, policy.process_index, policy.process_count)
        check_epochs(self._plan)  # a mixture's positions past int64, from start_at or end_at
        if self._skip:
            # a resume inside a validation run: the schedule starts at the training batch before it
            self._plan = dataclasses.replace(self._plan, stream=(0, 1, self._skip))
        self._position = LoopPosition(self._plan, resume.validation_batch if resume is not None else None)
        self._policy = with_cachers(policy, self._groups)
        self._functions = RunFunctions(loader_func, startup_func, placement_func)
        self._state = Lifecycle.NEW
        self._engine: Engine | None = None
        self._pipeline: Pipeline | None = None  # the engine's, once it started
        self._interrupts = Interrupts()
        self._handed = 0  # batches (and failures) taken from the pipeline, in schedule order
        self._delivered = 0  # batches handed to the loop
        warm_up(self._functions)

    # -- the run's facts ------------------------------------------------------------------------------
    def select_stream(self, index: int, count: int, first: int = 0) -> None:
        """Deliver only this producer's share of the run: stream positions ``first`` and on that
        are ``index`` modulo ``count`` (before entering the ``with`` block).

        The *stream* is the run's batches, training and validation, in schedule order, numbered
        from 0 at ``start_at`` (:func:`hydrax.order.schedule.stream_positions`). ``count`` producers
        with indexes ``0 .. count-1`` serve disjoint batches that together make the whole run,
        each with the numbers, items and seeds it has in the full run; :func:`hydrax.serve.serve`
        uses this to feed one training job from several machines. Such a run never drops a
        batch (a consumer waits for every position): a batch that fails raises
        :class:`BatchFailedError`, as a multi-process run does.
        """
        if self._state is not Lifecycle.NEW:
            raise RuntimeError("select_stream must be called before the Dataloader is entered")
        index, count, first = parse_stream(index, count, first)
        # Positions count from start_at: past the batches a resume inside a validation run skips.
        skip = self._skip
        self._plan = dataclasses.replace(self._plan, stream=((index + skip) % count, count, first + skip))
        self._policy = dataclasses.replace(self._policy, never_drop=True)

    @property
    def schedule_fingerprint(self) -> str:
        """A digest of what decides this run's batches (groups, sizes, seeds, shuffles,
        validation, ``start_at``, ``end_at``): equal for every producer serving a share of the
        same run (:meth:`select_stream` does not change it). See :attr:`dataset_fingerprint` for
        what a resume checks."""
        fingerprint = plan_fingerprint(self._plan)
        if self._skip:
            fingerprint = hashlib.sha256(f"{fingerprint} skip {self._skip}".encode()).hexdigest()[:16]
        return fingerprint

    @property
    def dataset_fingerprint(self) -> str:
        """(hydrax extension) A digest of what decides this run's batches (groups, sizes, seeds,
        shuffle modes, validation), but not of ``start_at``, ``end_at``, the process count or
        the stream share: a resumed run has its original's, which :meth:`state` records and
        ``start_at=state`` checks."""
        return self._dataset_facts[0]

    @functools.cached_property
    def _dataset_facts(self) -> tuple[str, dict]:
        return dataset_fingerprint(self._plan), dataset_summary(self._plan)

    def state(self) -> LoaderState:
        """(hydrax extension) Where the training loop stands, for ``Dataloader(..., start_at=state)``:
        the next batch it has not received, in a :class:`hydrax.checkpoint.LoaderState` (small,
        JSON-serialisable: save it with the model's checkpoint, see :mod:`hydrax.checkpoint`).

        Call it after the step that used the last batch: every batch ``__next__`` has returned
        counts as consumed, and the batches loaded ahead of the loop do not. Inside a validation
        run (or right after the training batch it follows) the state says which validation batch
        comes next, and the resumed run starts with the rest of that run. Any lifecycle: before
        the run it is ``start_at``; after it ended or failed, the position after the last batch.

        Raises ``RuntimeError`` with ``deterministic=False`` (batches come out of order, so no
        position says which were received) and for a Dataloader serving a share of a stream
        (:meth:`select_stream`).
        """
        if not self._policy.deterministic:
            raise RuntimeError("state() needs deterministic=True: with deterministic=False batches are delivered out of "
                               "schedule order, so no position says which of them the loop has received")
        if self._plan.stream is not None and self._plan.stream[1] > 1:
            raise RuntimeError("state() has no position to give for a Dataloader serving one share of a stream "
                               "(select_stream): save the position of the run the consumer takes its batches from")
        number, pending = self._position.current()
        bpe = self._plan.batches_per_epoch
        fingerprint, summary = self._dataset_facts
        return LoaderState(epoch=number // bpe, batch=number % bpe, fingerprint=fingerprint, validation_batch=pending,
                           process_index=self._policy.process_index, process_count=self._policy.process_count, dataset=summary)

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
        return self._plan.first_batch + (1 if self._skip else 0)

    @property
    def last_batch(self) -> int | None:
        """The global number the run stops before, or None when it has no end."""
        return self._plan.last_batch

    @property
    def process_index(self) -> int:
        """(hydrax extension) Which of :attr:`process_count` processes this is; it loads that share of every batch."""
        return self._policy.process_index

    @property
    def process_count(self) -> int:
        """(hydrax extension) How many processes split every batch (1: this process loads whole batches)."""
        return self._policy.process_count

    @property
    def dropped_batches(self) -> int:
        """(hydrax extension) Batches of this run dropped because an item failed (``on_item_error="drop_batch"``)."""
        return self._pipeline.budget.dropped_batches if self._pipeline is not None else 0

    @property
    def failed_items(self) -> int:
        """(hydrax extension) Items of this run whose ``loader_func`` raised (each dropped its batch, or was skipped)."""
        return self._pipeline.budget.failed_items if self._pipeline is not None else 0

    @property
    def deterministic(self) -> bool:
        """Whether batches are delivered in schedule order."""
        return self._policy.deterministic

    @property
    def interrupted(self) -> bool:
        """True after :meth:`interrupt`, a Ctrl+C, or leaving the ``with`` block early."""
        return self._interrupts.interrupted

    @property
    def start_method(self) -> str | None:
        """(hydrax extension) How the workers of the current or last run started: ``"fork"`` or ``"forkserver"``."""
        return self._engine.method if self._engine is not None else None

    @property
    def transfer_stats(self) -> dict[str, int]:
        """(hydrax extension) Batches and bytes by the path they took to JAX.

        ``aliased``: the slot itself became the ``jax.Array`` (CPU backend, no copy; with
        ``sharding``, every device's shard);
        ``copied``: one copy into memory XLA owns (host memory on CPU, device memory otherwise);
        ``custom``: placed by ``placement_func``; ``pinned``: whether the slots are page-locked
        for GPU transfers.
        """
        stats = self._pipeline.stats if self._pipeline is not None else TransferStats()
        return stats.as_dict()

    def idle_usec(self) -> int:
        """Microseconds ``__next__`` spent waiting for batches since the last call (first batch excluded)."""
        idle, self._interrupts.idle_ns = self._interrupts.idle_ns, 0
        return idle // 1000

    def interrupt(self) -> None:
        """Stop delivering batches: the next ``__next__`` ends the iteration."""
        if self._state not in (Lifecycle.RUNNING, Lifecycle.ENDED):
            raise RuntimeError("dataloader is not set up")
        self._interrupts.interrupted = True

    # -- lifecycle -------------------------------------------------------------------------------
    def __enter__(self) -> Dataloader[D]:
        if self._state is not Lifecycle.NEW:
            running = self._state in (Lifecycle.RUNNING, Lifecycle.ENDED)
            raise RuntimeError("dataloader is already set up" if running else "a Dataloader runs only once: create a new one to run again")
        self._state = Lifecycle.RUNNING
        self._engine = Engine(self._plan, self._groups, self._policy, self._functions)
        try:
            self._engine.start()
            self._pipeline = self._engine.pipeline
            self._interrupts.install()
        except BaseException:
            self._shutdown()
            self._state = Lifecycle.CLOSED
            raise
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._state is Lifecycle.RUNNING:
            self._interrupts.interrupted = True
        if self._state is Lifecycle.FAILED:
            workers = self._pipeline.describe_workers() if self._pipeline is not None else ""
            log.error("[hydrax]: dataloader failed%s", "\n" + workers if workers else "")
        elif exc_type is not None:
            log.warning("[hydrax]: shutting down due to %s", exc_type.__name__)
        self._shutdown()
        self._state = Lifecycle.CLOSED

    def _shutdown(self) -> None:
        if self._engine is not None:
            self._engine.close()
        self._interrupts.restore()

    # -- iteration -------------------------------------------------------------------------------
    def __iter__(self) -> Dataloader[D]:
        if self._state is not Lifecycle.RUNNING:
            raise RuntimeError(_NOT_RUNNING[self._state])
        return self

    def __next__(self) -> Batch[D]:
        if self._state is not Lifecycle.RUNNING:
            raise RuntimeError(_NOT_RUNNING[self._state])
        collect_released_buffers()  # the batch the loop just dropped frees its slot now
        while True:
            item = self._take()
            seq = self._handed
            self._handed += 1
            if isinstance(item, Ready):
                item = self._place(item)
                if item is None:
                    continue  # placement failed: the batch is dropped, as in 0.2.2
            agreement = self._engine.agreement
            if agreement is not None:
                try:
                    agreement.wait_for(seq, lambda item=item: repr(item), self._policy.timeout_s)
                except BaseException as exc:
                    self._fail(exc)
                    raise
            self._delivered += 1
            self._position.delivered(item)
            return item

    def _take(self) -> Any:
        """The pipeline's next batch (or :class:`Ready` one); raises at the end, on an interrupt or a failure."""
        try:
            item = self._interrupts.next_output(self._pipeline.output, self._policy.timeout_s, self._pipeline.describe_workers,
                                                idle=self._delivered > 0)
        except StopIteration:
            self._state = Lifecycle.ENDED
            raise
        except BaseException as exc:  # aborted, or no batch within the timeout
            self._fail(exc)
            raise
        if isinstance(item, End):
            try:
                # a run without an end stops where a mixture's positions would pass int64: say so
                check_epoch_reached(self._plan)
            except MixtureRangeError as exc:
                self._fail(exc)
                raise
            self._state = Lifecycle.ENDED
            raise StopIteration
        if isinstance(item, Failure):
            self._fail(item.error)
            raise item.error
        if self._interrupts.interrupted:
            self._state = Lifecycle.ENDED
            raise StopIteration
        return item

    def _place(self, ready: Ready) -> Batch | None:
        """Place a batch on this thread; None when placement failed and the batch may be dropped."""
        try:
            return self._pipeline.place(ready)
        except Exception as exc:
            if not self._policy.never_drop:
                return None
            error = self._pipeline.budget.failure(ready.record, f"placement failed: {exc!r}")
            self._fail(error)
            raise error from exc

    def _fail(self, error: BaseException) -> None:
        self._state = Lifecycle.FAILED
        agreement = self._engine.agreement if self._engine is not None else None
        if agreement is not None and not isinstance(error, BatchFailedError):
            # A batch failure was announced where it happened; anything else is news to the others.
            agreement.fail(self._handed, f"batch {self._handed} of the run (counting validation batches)", repr(error))
