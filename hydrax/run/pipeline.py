"""The pipeline thread: schedule -> workers -> arena -> placement -> ready batches.

One daemon thread in the main process walks the schedule, gives each batch a free slot, splits it
into tasks for the workers, collects their completions, and queues the finished batches in
schedule order (or as they finish, when not deterministic) on :attr:`Pipeline.output`, where
``Dataloader.__next__`` takes them. The thread does the walking and the bookkeeping; its
collaborators own the rest:

- :class:`~hydrax.run.announce.Announcer`: the next steps, announced to data that reads ahead;
- :class:`~hydrax.cache.RunCache`: which batches come from their cache files, and the writes;
- :class:`~hydrax.run.assembly.BatchAssembler`: finished slot -> ``jax.Array`` s -> batch;
- :class:`~hydrax.run.failures.FailureBudget`: dropped batches, failed items, when that ends the run;
- :class:`~hydrax.run.diagnosis.WorkerDiagnosis`: a worker that exits, or whose heartbeat stops,
  ends the run with a :class:`~hydrax.WorkerError` naming the process and the item it was loading.
"""

from __future__ import annotations

import logging
import os
import queue
import selectors
import threading
import time
from dataclasses import dataclass
from typing import Iterator

from .announce import Announcer, batches_ahead
from ..procs.arena import Arena
from .assembly import BatchAssembler
from .batch import Batch
from ..cache.runcache import Outcome, RunCache
from .diagnosis import WorkerDiagnosis
from .failures import FailureBudget
from .hosts import HostAgreement
from .inflight import InFlight
from ..procs.messages import Completion, StartupReport, Task
from ..order.orderbook import RunOrders
from .placement import collect_released_buffers
from ..procs.processes import PIPELINE_THREAD
from .plan import RunGroups, RunPolicy
from ..order.schedule import Step, TrainingStep
from ..procs.workers import WorkerPool

log = logging.getLogger(__name__)

_POLL_S = 0.1
_HELD_POLL_S = 0.005
_HEALTH_CHECK_S = 0.1
_TASK_NS = 2_000_000  # aim for tasks of about 2 ms of loading


class End:
    """Queued after the last batch."""


@dataclass
class Failure:
    """Queued when the run cannot go on; ``__next__`` raises ``error``."""

    error: BaseException


@dataclass
class Ready:
    """A finished slot whose placement waits for ``__next__`` (default placement on the CPU backend).

    Placing there, rather than ahead on the pipeline thread, lets the slot become the
    ``jax.Array`` itself whenever the loop has released its previous batches, because the
    decision is taken when the batch is handed out.
    """

    record: InFlight


#: What the pipeline queues for one batch: the batch, one to place on the consumer's thread,
#: the error that ends the run, or None for a dropped batch.
Queued = Batch | Ready | Failure | None


def chunk_bounds(batch_size: int, chunks: int) -> list[tuple[int, int]]:
    """Split positions ``[0, batch_size)`` into at most ``chunks`` contiguous, near-equal ranges."""
    chunks = max(1, min(chunks, batch_size))
    step, extra = divmod(batch_size, chunks)
    bounds, start = [], 0
    for i in range(chunks):
        end = start + step + (i < extra)
        bounds.append((start, end))
        start = end
    return bounds


class Pipeline:
    """Runs one Dataloader run's batches from schedule to ready queue on a background thread.

    :param steps: the run's schedule (see :func:`hydrax.order.schedule.iter_steps`).
    :param pool: the workers; tasks may be queued before they start (see :meth:`prefill`).
    :param cache: the run's use of its groups' caches.
    :param agreement: the other processes of a multi-process run.
    :param stride: batches of the schedule from one of this run's batches to the next (a share
        of a stream, see :meth:`hydrax.Dataloader.select_stream`, loads every count-th).
    """

    def __init__(self, *, steps: Iterator[Step], groups: RunGroups, policy: RunPolicy, arena: Arena, pool: WorkerPool,
                 cache: RunCache, placement_func=None, agreement: HostAgreement | None = None, stride: int = 1) -> None:
        self.output: queue.SimpleQueue = queue.SimpleQueue()
        self._groups = groups
        self._policy = policy
        self._arena = arena
        self._pool = pool
        self._cache = cache
        self._agreement = agreement
        #: The item orders of the groups (the book of stored ones is shared with the workers). A
        #: share of a stream loads every stride-th batch, so the batches it has in flight and
        #: announced reach stride times as far back in the schedule.
        self.orders = RunOrders(groups, (arena.depth + batches_ahead(groups, arena.depth)) * stride)
        self._announcer = Announcer(steps, groups, arena.depth, self.orders.items)
        self.assembler = BatchAssembler(arena=arena, cache=cache, placement_func=placement_func, zero_copy=policy.zero_copy)
        self.budget = FailureBudget(policy, agreement)
        self.diagnosis = WorkerDiagnosis(arena, pool, self._batch_of_task)
        self._item_ns: float | None = None  # a running mean of the time one item takes to load
        self._inflight: dict[int, InFlight] = {}
        self._task_batch: dict[int, tuple[int, int, int]] = {}  # task -> (batch seq, first, end position)
        self._finished: dict[int, tuple[InFlight, Queued]] = {}
        self._next_seq = self._deliver_seq = self._task_id = 0
        self._exhausted = False
        self._no_readers = False  # every worker has exited: tasks cannot be sent
        self._stopping = threading.Event()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        arena.on_release = self._slot_released
        self.thread = threading.Thread(target=self._run, name=PIPELINE_THREAD, daemon=True)

    @property
    def stats(self):
        """How batches reached JAX (see :class:`~hydrax.run.placement.TransferStats`)."""
        return self.assembler.stats

    # -- control -----------------------------------------------------------------------------
    def prefill(self) -> None:
        """Queue the first batches' tasks, on the calling thread, before the workers exist.

        Not with a cache: a batch read from it would be placed at once, starting JAX in this
        process before the workers are forked.
        """
        if not any(run.cache is not None for run in self._groups):
            self._fill()

    def announce(self) -> None:
        """Tell data that reads ahead of the first batches now, so their bytes are on the way while
        the workers start. Only for workers started from the fork server: a forked worker must
        not inherit the read-ahead's threads (the thread announces then, once they exist). Returns
        once the read-ahead is at work on them: workers started sooner would read them too."""
        self._announcer.start(self._inflight.values())
        self._announcer.wait_started()

    def start(self) -> None:
        """Start the pipeline thread (the workers are started by then)."""
        self.thread.start()

    def stop(self) -> None:
        """Stop submitting and return from the thread as soon as possible."""
        self._stopping.set()
        self._wake()
        if self.thread.is_alive() and threading.current_thread() is not self.thread:
            self.thread.join()
        self._announcer.close()
        self.orders.close()
        fds = (self._wake_r, self._wake_w)
        self._wake_r = self._wake_w = -1  # before closing, so a late release never writes to a reused fd
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass

    def place(self, ready: Ready) -> Batch:
        """Place a batch handed out as :class:`Ready` (on the thread calling ``__next__``)."""
        return self.assembler.place(ready.record)

    def describe_workers(self) -> str:
        """One line per worker (alive or not, what it is loading), and who holds the slots."""
        all_held = bool(self.assembler.held) and not self._inflight and self._arena.free_count == 0
        return self.diagnosis.describe_workers(all_held)

    def _wake(self) -> None:
        fd = self._wake_w
        if fd < 0:
            return
        try:
            os.write(fd, b"\0")
        except OSError:
            pass

    def _slot_released(self, slot: int) -> None:
        self.assembler.slot_released(slot)
        self._wake()

    def _batch_of_task(self, task: int) -> InFlight | None:
        seq = self._task_batch.get(task, (None,))[0]
        return self._inflight.get(seq) if seq is not None else None

    # -- the thread --------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self.assembler.start()
            self._announcer.start(self._inflight.values())
            with selectors.DefaultSelector() as selector:
                for i, connection in enumerate(self._pool.connections):
                    selector.register(connection, selectors.EVENT_READ, ("completion", i))
                for i, process in enumerate(self._pool.processes):
                    selector.register(process.sentinel, selectors.EVENT_READ, ("exit", i))
                selector.register(self._wake_r, selectors.EVENT_READ, ("wake", -1))
                self._serve(selector)
        except BaseException as exc:  # never die silently: the training loop must hear of it
            log.exception("[hydrax] the pipeline thread failed:")
            self.output.put(Failure(RuntimeError(f"hydrax pipeline thread failed: {exc!r}")))

    def _serve(self, selector: selectors.BaseSelector) -> None:
        health = _HealthClock()
        while not self._stopping.is_set():
            self._fill()
            if self._exhausted and not self._inflight:
                error = self.budget.every_batch_failed(self._next_seq)
                self.output.put(End() if error is None else Failure(error))
                return
            timeout = _POLL_S
            if self.assembler.held and not self._exhausted and self._arena.free_count == 0:
                # Slots held only by dead jax.Arrays come back once XLA collects; keep asking.
                collect_released_buffers(thorough=True)
                timeout = _HELD_POLL_S
            for key, _events in selector.select(timeout):
                if not self._on_event(*key.data, key.fileobj) or self._stopping.is_set():
                    return
            if health.due():
                frozen = self.diagnosis.frozen_worker()
                if frozen is not None:
                    worker, silent, why = frozen
                    self._fail_worker(worker, f"stopped responding (no heartbeat for {silent:.2f} s; {why})")
                    return

    def _on_event(self, kind: str, worker: int, source) -> bool:
        """Handle one ready source of the selector; False when the run ends."""
        if kind == "wake":
            try:
                while os.read(self._wake_r, 512):
                    pass
            except BlockingIOError:
                pass
            return True
        if kind == "completion":
            return self._receive(source, worker)
        self._fail_worker(worker, "exited")
        return False

    def _fill(self) -> None:
        while not self._exhausted and not self._no_readers and not self._stopping.is_set():
            slot = self._arena.acquire()
            if slot is None:
                return
            taken = self._announcer.take()
            if taken is None:
                self._exhausted = True
                self._arena.free_now(slot)
                return
            try:
                self._submit(*taken, slot)
            except BrokenPipeError:
                # No worker is left to read tasks. Each exit makes its sentinel readable, so the
                # selector reports which worker died and on which item, as for any other death.
                self._no_readers = True
                return
            self._announcer.top_up()

    # -- batches in ----------------------------------------------------------------------------
    def _submit(self, step: Step, prefetch_key: int | None, slot: int) -> None:
        run = self._groups.of(step)
        seq = self._next_seq
        self._next_seq += 1
        bounds = chunk_bounds(run.plan.local_batch_size, self._chunk_count(run.plan.local_batch_size))
        record = InFlight(seq, step, run, slot, self.orders.items(run, step), len(bounds), prefetch_key=prefetch_key)
        epoch = run.epoch_of(step)
        if run.cache is not None:
            record.cache = self._cache.settle(run.cache, epoch, step.group_index, isinstance(step, TrainingStep))
            if record.cache.outcome in (Outcome.READ, Outcome.MISSING):
                record.remaining = 0
                self._announcer.release(prefetch_key)
                self._finish(record)
                return
        self._inflight[seq] = record
        self._arena.write_items(slot, record.indices)  # the workers read their items there
        for first, end in bounds:
            self._task_id += 1
            self._task_batch[self._task_id] = (seq, first, end)
            self._pool.submit(Task(self._task_id, slot, run.index, epoch, step.group_index, first, end))

    def _chunk_count(self, batch_size: int) -> int:
        """How many tasks to split a batch into.

        Until item costs are known, as many as allowed (about two per worker: the first batch
        is spread over every worker). Then tasks of about ``_TASK_NS`` each, so that cheap items
        are not drowned in per-task messages and costly ones still spread over the workers.
        """
        most = self._policy.tasks_per_batch
        if self._item_ns is None:
            return most
        return max(1, min(most, round(batch_size * self._item_ns / _TASK_NS)))

    def _receive(self, connection, worker: int) -> bool:
        """Take every completion waiting on ``connection``; False when the run ends."""
        try:
            while connection.poll():
                message = connection.recv()
                if isinstance(message, StartupReport):
                    self._fail_worker(worker, "failed", message)
                    return False
                if not self._complete(message):
                    return False
        except (EOFError, OSError):
            self._fail_worker(worker, "exited")
            return False
        return True

    def _complete(self, done: Completion) -> bool:
        seq, first, end = self._task_batch.pop(done.task_id)
        record = self._inflight[seq]
        if done.fatal is not None:
            # The data cannot be read (a store that keeps failing, a replaced object):
            # dropping batch after batch would lose it quietly, so the run ends here.
            self.output.put(Failure(done.fatal))
            return False
        if done.ok:
            sample = done.elapsed_ns / (end - first)
            self._item_ns = sample if self._item_ns is None else 0.8 * self._item_ns + 0.2 * sample
        self.budget.count_items(done)
        record.take_completion(first, done.ok, done.extras, done.error, done.skipped)
        if record.remaining == 0:
            del self._inflight[seq]
            self._announcer.release(record.prefetch_key)
            self._finish(record)
        return True

    # -- batches out ---------------------------------------------------------------------------
    def _finish(self, record: InFlight) -> None:
        if record.error is not None or record.skipped:
            # Only whole, good batches go to the cache (a skipped item's zeros would stay there).
            self._cache.abandon(record.cache)
        self._queue(record, self._outcome(record))

    def _outcome(self, record: InFlight) -> Queued:
        """What to queue for a batch whose items are all in (or that was settled by its cache)."""
        if record.cache is not None and record.cache.outcome is Outcome.MISSING:
            self._arena.free_now(record.slot)
            log.warning("[hydrax] %s is not in the cache (%s), and its group has no loader_arrays: the batch is dropped",
                        record.words(), record.cache.path)
            if self._policy.never_drop:
                return Failure(self.budget.failure(
                    record, f"the batch is not in the cache ({record.cache.path}), and its group has no loader_arrays"))
            return None
        if record.error is not None:
            self._arena.free_now(record.slot)
            error = self.budget.drop(record)
            return None if error is None else Failure(error)
        if self.assembler.place_on_consumer:
            return Ready(record)
        try:
            return self.assembler.place(record)
        except Exception as exc:
            if not self._policy.never_drop:
                return None
            return Failure(self.budget.failure(record, f"placement failed: {exc!r}", exc))

    def _queue(self, record: InFlight, outcome: Queued) -> None:
        """Queue ``outcome`` in schedule order (as it comes, when not deterministic)."""
        if not self._policy.deterministic:
            self._deliver(record, outcome)
            return
        self._finished[record.seq] = (record, outcome)
        while self._deliver_seq in self._finished:
            done, outcome = self._finished.pop(self._deliver_seq)
            self._deliver_seq += 1
            self._deliver(done, outcome)
            if self._agreement is not None and not isinstance(outcome, Failure):
                # the form the batch is handed out in (direct mode: always cached, read or loaded)
                self._agreement.loaded(self._deliver_seq, done.cache is not None and done.cache.handed_out_cached)

    def _deliver(self, record: InFlight, outcome: Queued) -> None:
        """Queue ``record``'s outcome (None: dropped), counting failed batches in delivery order."""
        error = self.budget.judge(record, ending=isinstance(outcome, Failure))
        if error is not None:
            outcome = Failure(error)
        if outcome is not None:
            self.output.put(outcome)

    def _fail_worker(self, worker: int, what: str, report: StartupReport | None = None) -> None:
        error = self.diagnosis.worker_error(worker, what, report)
        log.error("[hydrax] loader process exited, aborting: %s", error)
        self.output.put(Failure(error))


class _HealthClock:
    """When to check the workers' heartbeats: every ``_HEALTH_CHECK_S``, and only after a check
    that came on time. If the pipeline thread was itself held up (a paused VM, a stalled host),
    stale heartbeats prove nothing about the workers."""

    def __init__(self) -> None:
        self._next = self._last = time.monotonic()

    def due(self) -> bool:
        """Whether the heartbeats are to be checked now."""
        now = time.monotonic()
        if now < self._next:
            return False
        on_time = now - self._last < _HEALTH_CHECK_S + 0.3
        self._next, self._last = now + _HEALTH_CHECK_S, now
        return on_time
