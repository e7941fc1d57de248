"""The pipeline thread: schedule -> workers -> arena -> placement -> ready batches.

One daemon thread in the main process walks the schedule, gives each batch a free slot, splits it
into tasks for the workers, collects completions, places finished slots into JAX and queues the
batches in schedule order (or as they finish, when not deterministic). It also watches the
workers: a process that exits, or whose heartbeat stops, ends the run with a :class:`WorkerError`
that names the process and the item it was loading.
"""

from __future__ import annotations

import logging
import os
import queue
import selectors
import signal
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from .arena import Arena
from .batch import Batch, TrainingBatch, ValidationBatch
from .cache import CachedBatch, CacheTarget, CacheWriter, GroupCache
from .errors import BatchFailedError, WorkerError
from .group import SlotLayout
from .hosts import HostAgreement
from .placement import TransferStats, collect_released_buffers, custom_placement, default_placement, sharded_placement
from .schedule import (GroupPlan, Step, TrainingStep, item_order, local_items, local_seeds, read_order,
                       validation_item_order)
from .sharding import GroupSharding
from .messages import StartupReport, Task
from .processes import PIPELINE_THREAD
from .workers import WorkerPool

log = logging.getLogger(__name__)

#: A worker whose heartbeat is older than this is frozen (its heartbeat thread runs without the GIL).
HEARTBEAT_STALE_S = 0.75
_POLL_S = 0.1
_PINNED_POLL_S = 0.005
_HEALTH_CHECK_S = 0.1
_TASK_NS = 2_000_000  # aim for tasks of about 2 ms of loading
#: The most batches announced to data that reads ahead, beyond those being loaded.
MAX_LOOKAHEAD = 512


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

    record: _InFlight


@dataclass
class _InFlight:
    seq: int
    step: Step
    group: int
    slot: int
    indices: Sequence[int]
    remaining: int
    extras: dict[int, dict] = field(default_factory=dict)
    error: str | None = None
    prefetch_key: int | None = None
    skipped: dict[int, str] = field(default_factory=dict)  # position -> why (on_item_error="skip_item")
    path: str | None = None  # the batch's file in its group's cache
    cached: CachedBatch | None = None  # read from that file
    from_cache: bool = False  # ``cached`` was read (it is handed to the batch's lease later)
    persist: bool = False  # direct mode: loaded for the cache; the path is claimed until written
    missing: bool = False  # a group without loaders whose batch is not in the cache


def lease_end(layouts) -> int:
    """The end of the last array of ``layouts`` (bytes from the slot start)."""
    return max((offset + count * dtype.itemsize for _shape, dtype, _jax, offset, count in layouts.values()), default=0)


def step_words(step: Step) -> str:
    """A batch of the schedule in words: ``"batch 7 (epoch 1)"`` or ``"validation batch 3 (run 0)"``."""
    if isinstance(step, TrainingStep):
        return f"batch {step.batch_num} (epoch {step.epoch})"
    return f"validation batch {step.validation_batch_num} (run {step.validation_epoch})"


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
    """Runs one Dataloader run's batches from schedule to ready queue on a background thread."""

    def __init__(
        self,
        steps: Iterator[Step],
        groups: list,  # DataGroups: training first, then validation
        plans: list[GroupPlan],
        layouts: list[SlotLayout],  # per group: where this process's share of a batch lives
        training_count: int,
        arena: Arena,
        pool: WorkerPool,
        placement_func: Callable | None,
        deterministic: bool,
        chunks_per_batch: int,
        zero_copy: bool | None,
        shardings: Sequence[GroupSharding | None] = (),
        strict: bool = False,
        agreement: HostAgreement | None = None,
        process_index: int = 0,
        on_item_error: str = "drop_batch",
        max_consecutive_failures: int | None = None,
        caches: Sequence[GroupCache | None] = (),
        cache_writer: CacheWriter | None = None,
    ) -> None:
        self.output: queue.SimpleQueue = queue.SimpleQueue()
        self.stats = TransferStats()
        self._steps = steps
        self._groups = groups
        self._plans = plans
        self._layouts = layouts
        self._training_count = training_count
        self._arena = arena
        self._pool = pool
        self._placement_func = placement_func
        self._deterministic = deterministic
        self._max_chunks = chunks_per_batch
        self._item_ns: float | None = None  # a running mean of the time one item takes to load
        self._zero_copy = zero_copy
        self._shardings = list(shardings) or [None] * len(groups)
        self._caches = list(caches) or [None] * len(groups)
        self._writer = cache_writer
        # What Batch.cache checks against: the cache's layouts of this process's rows, or the
        # group's (a group with cache arrays but no location caches in memory only).
        self._cache_layouts = [c.layouts if c is not None else g.cache_layouts for g, c in zip(groups, self._caches)]
        # A run that splits batches over processes, or builds global arrays, never drops a batch:
        # a failure ends it, at the same batch on every process.
        self._strict = strict
        self.agreement = agreement
        self._process_index = process_index
        self._on_item_error = on_item_error
        self._budget = max_consecutive_failures
        self._failed_in_a_row = 0
        #: Batches dropped because an item failed, and items whose loading failed, so far.
        self.dropped_batches = 0
        self.failed_items = 0
        self._last_error: str | None = None
        self._inflight: dict[int, _InFlight] = {}
        self._task_batch: dict[int, tuple[int, int, int]] = {}  # task -> (batch seq, first, end position)
        self._finished: dict[int, tuple[_InFlight, Batch | Ready | Failure | None]] = {}
        self._next_seq = 0
        self._deliver_seq = 0
        self._task_id = 0
        self._exhausted = False
        self._stopping = threading.Event()
        self._pinned: set[int] = set()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        arena.on_release = self._slot_released
        self._cpu = True
        self.lazy = False
        # Data that reads ahead (``prefetch``/``release``, as ShardSet has) hears of batches
        # ``_lookahead`` ahead of loading; only from the pipeline thread, after the workers have
        # started, because read-ahead may start threads that a forked worker must not inherit.
        self._prefetchers = {g: group.data for g, group in enumerate(groups)
                             if callable(getattr(group.data, "prefetch", None)) and callable(getattr(group.data, "release", None))}
        self._ahead: deque[tuple[Step, int | None]] = deque()
        self._lookahead = self._lookahead_batches()
        self._announcing = False
        self._prefetch_seq = 0
        self._announced: dict[int, int] = {}  # prefetch key -> group
        self.thread = threading.Thread(target=self._run, name=PIPELINE_THREAD, daemon=True)

    # -- control -----------------------------------------------------------------------------
    def prefill(self) -> None:
        """Queue the first batches' tasks, on the calling thread, before the workers exist.

        Not with a cache: a batch read from it would be placed at once, starting JAX in this
        process before the workers are forked.
        """
        if not any(self._caches):
            self._fill()

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        """Stop submitting and return from the thread as soon as possible."""
        self._stopping.set()
        self._wake()
        if self.thread.is_alive() and threading.current_thread() is not self.thread:
            self.thread.join()
        for key in list(self._announced):
            self._release(key)
        fds = (self._wake_r, self._wake_w)
        self._wake_r = self._wake_w = -1  # before closing, so a late release never writes to a reused fd
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass

    def _wake(self) -> None:
        fd = self._wake_w
        if fd < 0:
            return
        try:
            os.write(fd, b"\0")
        except OSError:
            pass

    def _slot_released(self, slot: int) -> None:
        self._pinned.discard(slot)
        self._wake()

    # -- the thread --------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            import jax

            self._cpu = jax.default_backend() == "cpu"
            if not self._cpu and jax.default_backend() in ("gpu", "cuda"):
                # Transfers then read the slots in place instead of through the driver's bounce
                # buffers; where pinning is not possible, they simply stay pageable.
                self.stats.pinned = self._arena.pin(getattr(jax.local_devices()[0], "local_hardware_id", 0) or 0)
            self._zero_copy = self._zero_copy is not False
            self.lazy = self._cpu and self._placement_func is None
            self._start_announcing()
            self._loop()
        except BaseException as exc:  # never die silently: the training loop must hear of it
            log.exception("[hydrax] the pipeline thread failed:")
            self.output.put(Failure(RuntimeError(f"hydrax pipeline thread failed: {exc!r}")))

    def _loop(self) -> None:
        with selectors.DefaultSelector() as selector:
            for i, connection in enumerate(self._pool.connections):
                selector.register(connection, selectors.EVENT_READ, ("completion", i))
            for i, process in enumerate(self._pool.processes):
                selector.register(process.sentinel, selectors.EVENT_READ, ("exit", i))
            selector.register(self._wake_r, selectors.EVENT_READ, ("wake", -1))
            self._serve(selector)

    def _serve(self, selector: selectors.BaseSelector) -> None:
        next_health_check = last_health_check = time.monotonic()
        while not self._stopping.is_set():
            self._fill()
            if self._exhausted and not self._inflight:
                if self._budget is not None and self.dropped_batches and self.dropped_batches == self._next_seq:
                    # Too short a run for the budget, and not one batch came through: an error,
                    # not a run that ended.
                    self.output.put(Failure(BatchFailedError(
                        f"every one of the {self.dropped_batches} batches of the run failed to load; the last error: "
                        f"{self._last_error}", batch="every batch", process_index=self._process_index, reason=self._last_error or "",
                    )))
                else:
                    self.output.put(End())
                return
            timeout = _POLL_S
            if self._pinned and not self._exhausted and self._arena.free_count == 0:
                # Slots held only by dead jax.Arrays come back once XLA collects; keep asking.
                collect_released_buffers(thorough=True)
                timeout = _PINNED_POLL_S
            for key, _events in selector.select(timeout):
                kind, worker = key.data
                if kind == "wake":
                    try:
                        while os.read(self._wake_r, 512):
                            pass
                    except BlockingIOError:
                        pass
                elif kind == "completion":
                    if not self._receive(key.fileobj, worker):
                        return
                else:
                    self._fail_worker(worker, "exited")
                    return
                if self._stopping.is_set():
                    return
            now = time.monotonic()
            if now >= next_health_check:
                # If this thread was itself held up (a paused VM, a stalled host), stale heartbeats
                # prove nothing about the workers: judge only after a check that came on time.
                on_time = now - last_health_check < _HEALTH_CHECK_S + 0.3
                next_health_check, last_health_check = now + _HEALTH_CHECK_S, now
                frozen = self._frozen_worker() if on_time else None
                if frozen is not None:
                    worker, silent = frozen
                    self._fail_worker(worker, f"stopped responding (no heartbeat for {silent:.2f} s)")
                    return

    def _fill(self) -> None:
        while not self._exhausted and not self._stopping.is_set():
            slot = self._arena.acquire()
            if slot is None:
                return
            if not self._ahead and not self._peek():
                self._exhausted = True
                self._arena.free_now(slot)
                return
            step, key = self._ahead.popleft()
            self._submit(step, slot, key)
            self._look_ahead()

    # -- read-ahead announcements ------------------------------------------------------------
    def _lookahead_batches(self) -> int:
        if not self._prefetchers:
            return 0
        wanted = []
        for g, data in self._prefetchers.items():
            items = int(getattr(data, "prefetch_items", 0) or 0)
            wanted.append(-(-items // max(1, self._plans[g].local_batch_size)))
        return max(self._arena.depth, min(MAX_LOOKAHEAD, max(wanted)))

    def _peek(self) -> bool:
        """Take the next step of the schedule into the look-ahead queue; False at the end."""
        try:
            step = next(self._steps)
        except StopIteration:
            return False
        self._ahead.append((step, self._announce(step)))
        return True

    def _look_ahead(self) -> None:
        # Top up in bursts of about a quarter of the look-ahead, so read-ahead can coalesce the
        # samples of many batches into one request.
        if self._announcing and len(self._ahead) <= self._lookahead - max(1, self._lookahead // 4):
            while len(self._ahead) < self._lookahead and self._peek():
                pass

    def _start_announcing(self) -> None:
        if not self._prefetchers:
            return
        self._announcing = True
        for record in self._inflight.values():  # queued before the workers started
            if record.prefetch_key is None:
                record.prefetch_key = self._announce(record.step)
        self._ahead = deque((step, key if key is not None else self._announce(step)) for step, key in self._ahead)
        self._look_ahead()

    def _step_group(self, step: Step) -> tuple[int, int, np.ndarray | None]:
        """(group, epoch, item order) of ``step``."""
        if isinstance(step, TrainingStep):
            return step.group, step.epoch, item_order(self._plans[step.group], step.epoch)
        group = self._training_count + step.group
        return group, 0, validation_item_order(self._plans[group])

    def _announce(self, step: Step) -> int | None:
        if not self._announcing:
            return None
        group, epoch, order = self._step_group(step)
        data = self._prefetchers.get(group)
        if data is None:
            return None
        plan = self._plans[group]
        kind = read_order(plan, epoch, isinstance(step, TrainingStep))
        self._prefetch_seq += 1
        key = self._prefetch_seq
        try:
            data.prefetch(key, local_items(plan, order, step.group_index), kind)
        except Exception:  # read-ahead is an optimisation: the workers still read what they need
            log.warning("[hydrax] read-ahead failed; loading goes on without it:", exc_info=True)
            return None
        self._announced[key] = group
        return key

    def _release(self, key: int | None) -> None:
        group = self._announced.pop(key, None) if key is not None else None
        if group is not None:
            try:
                self._prefetchers[group].release(key)
            except Exception:
                log.warning("[hydrax] read-ahead failed to release batch %d; loading goes on:", key, exc_info=True)

    def _submit(self, step: Step, slot: int, prefetch_key: int | None = None) -> None:
        group, epoch, order = self._step_group(step)
        plan = self._plans[group]
        seq = self._next_seq
        self._next_seq += 1
        size = plan.local_batch_size
        bounds = chunk_bounds(size, self._chunk_count(size))
        record = _InFlight(seq, step, group, slot, local_items(plan, order, step.group_index), len(bounds),
                           prefetch_key=prefetch_key)
        cache = self._caches[group]
        if cache is not None and self._from_cache(record, cache, epoch):
            self._release(prefetch_key)
            self._finish(record)
            return
        self._inflight[seq] = record
        for first, end in bounds:
            self._task_id += 1
            self._task_batch[self._task_id] = (seq, first, end)
            self._pool.submit(Task(self._task_id, slot, group, epoch, step.group_index, first, end))

    def _from_cache(self, record: _InFlight, cache: GroupCache, epoch: int) -> bool:
        """Settle ``record`` from the cache if it can be (read, or dropped for want of loaders);
        otherwise, in direct mode, claim its path so the loaded batch is written there."""
        step = record.step
        record.path = path = cache.path(epoch, step.group_index, isinstance(step, TrainingStep))
        writer = self._writer
        # A path in flight is being loaded or written right now: never read it (hydrax 0.2.2 did,
        # and unpickled half a file); load the batch again instead.
        if writer is None or not writer.in_flight(path):
            record.cached = cache.open(path)
            if record.cached is not None:
                record.from_cache = True
                record.remaining = 0
                return True
        if cache.loaderless:
            record.remaining = 0
            record.missing = True
            return True
        if cache.direct and writer is not None and writer.claim(path):
            record.persist = True
        return False

    def _chunk_count(self, batch_size: int) -> int:
        """How many tasks to split a batch into.

        Until item costs are known, as many as allowed (about two per worker: the first batch
        is spread over every worker). Then tasks of about ``_TASK_NS`` each, so that cheap items
        are not drowned in per-task messages and costly ones still spread over the workers.
        """
        if self._item_ns is None:
            return self._max_chunks
        return max(1, min(self._max_chunks, round(batch_size * self._item_ns / _TASK_NS)))

    def _receive(self, connection, worker: int) -> bool:
        try:
            while connection.poll():
                message = connection.recv()
                if isinstance(message, StartupReport):
                    self._fail_worker(worker, "failed", message)
                    return False
                task, ok, extras, error, elapsed, fatal, skipped = message
                seq, first, end = self._task_batch.pop(task)
                record = self._inflight[seq]
                if fatal is not None:
                    # The data cannot be read (a store that keeps failing, a replaced object):
                    # dropping batch after batch would lose it quietly, so the run ends here.
                    self.output.put(Failure(fatal))
                    return False
                if ok:
                    sample = elapsed / (end - first)
                    self._item_ns = sample if self._item_ns is None else 0.8 * self._item_ns + 0.2 * sample
                record.remaining -= 1
                if not ok:
                    self.failed_items += 1
                    self._last_error = error
                    if record.error is None:
                        record.error = error
                if skipped:
                    self.failed_items += len(skipped)
                    record.skipped.update(skipped)
                if extras:
                    for k, value in enumerate(extras, first):
                        if value:
                            record.extras[k] = value
                if record.remaining == 0:
                    del self._inflight[seq]
                    self._release(record.prefetch_key)
                    self._finish(record)
        except (EOFError, OSError):
            self._fail_worker(worker, "exited")
            return False
        return True

    def _finish(self, record: _InFlight) -> None:
        batch: Batch | Ready | Failure | None = None
        if record.persist and (record.error is not None or record.skipped):
            # Only whole, good batches go to the cache (a skipped item's zeros would stay there).
            record.persist = False
            self._writer.release(record.path)
        if record.missing:
            self._arena.free_now(record.slot)
            log.warning("[hydrax] %s is not in the cache (%s), and its group has no loader_arrays: the batch is dropped",
                        step_words(record.step), record.path)
            if self._strict:
                batch = Failure(self.failure(record, f"the batch is not in the cache ({record.path}), and its group has no loader_arrays"))
        elif record.error is not None:
            self.dropped_batches += 1
            self._arena.free_now(record.slot)
            if self._strict or self._on_item_error == "raise":
                batch = Failure(self.failure(record, record.error))
        elif self.lazy:
            batch = Ready(record)
        else:
            try:
                batch = self.place(record)
            except Exception as exc:
                batch = Failure(self.failure(record, f"placement failed: {exc!r}", exc)) if self._strict else None
        if not self._deterministic:
            self._deliver(record, batch)
            return
        self._finished[record.seq] = (record, batch)
        while self._deliver_seq in self._finished:
            done, ready = self._finished.pop(self._deliver_seq)
            self._deliver_seq += 1
            self._deliver(done, ready)
            if self.agreement is not None and not isinstance(ready, Failure):
                cache = self._caches[done.group]
                # the form the batch is handed out in (direct mode: always cached, read or loaded)
                self.agreement.loaded(self._deliver_seq, cache is not None and (done.from_cache or cache.direct))

    def _deliver(self, record: _InFlight, batch: Batch | Ready | Failure | None) -> None:
        """Queue ``record``'s outcome (None: dropped), counting failed batches in delivery order:
        one that was dropped, or whose every item was skipped, fails."""
        failed = record.error is not None or len(record.skipped) == len(record.indices)
        self._failed_in_a_row = self._failed_in_a_row + 1 if failed else 0
        if failed and not isinstance(batch, Failure) and self._budget is not None and self._failed_in_a_row >= self._budget:
            reason = record.error or next(iter(record.skipped.values()))
            batch = Failure(self.failure(
                record, f"{self._failed_in_a_row} batches in a row failed to load (max_consecutive_failures="
                f"{self._budget}); the last error: {reason}. Whatever fails every item (a wrong field name, a store "
                "that is down, revoked access) would otherwise drop the whole run quietly",
            ))
        if batch is not None:
            self.output.put(batch)

    def failure(self, record: _InFlight, reason: str, cause: BaseException | None = None) -> BatchFailedError:
        """The error that ends the run at ``record``'s batch; the other processes hear of it."""
        batch = step_words(record.step)
        if self.agreement is not None:
            self.agreement.fail(record.seq, batch, reason)
        why = (". A run whose batches are split over processes or placed with a sharding never drops a batch, so it "
               "stops here") if self._strict else ""
        error = BatchFailedError(
            f"{batch} could not be loaded or placed on process {self._process_index}: {reason}{why}",
            batch=batch, process_index=self._process_index, reason=reason,
        )
        error.__cause__ = cause
        return error

    def place(self, item: _InFlight | Ready) -> Batch:
        """Turn a finished slot into a Batch; raises what placement raised (the slot is freed).

        Runs on the pipeline thread, or on the thread calling ``__next__`` for a :class:`Ready`.
        """
        record = item.record if isinstance(item, Ready) else item
        # Alias only while another slot stays free for loading: a loop that keeps batches then
        # costs copies instead of stalling the loaders.
        may_alias = self._zero_copy and len(self._pinned) < self._arena.depth - 1
        group = self._groups[record.group]
        plan = self._plans[record.group]
        layout = self._layouts[record.group]
        cache = self._caches[record.group]
        layouts, size = layout.arrays, layout.size
        additional: dict[str, list[Any]] = {}
        for position in sorted(record.extras):  # item order, so that the extras pickle the same every time
            for key, value in record.extras[position].items():
                additional.setdefault(key, [None] * plan.local_batch_size)[position] = value
        if record.cached is not None:
            layouts, size, additional = cache.layouts, cache.size, record.cached.additional
            lease = record.cached.lease(record.slot, self._arena.free_now)
            record.cached = None  # the lease holds the mapping now
        else:
            lease = self._arena.lease(record.slot)
        try:
            sharding = self._shardings[record.group]
            if sharding is not None:
                slot = np.frombuffer(lease, dtype=np.uint8, count=size)
                try:
                    arrays, aliased = sharded_placement(slot, layout, sharding, self._cpu, may_alias)
                finally:
                    del slot
                path = "aliased" if aliased else "copied"
            else:
                views = {
                    name: np.frombuffer(lease, dtype=dtype, count=count, offset=offset).reshape(shape)
                    for name, (shape, dtype, _jax, offset, count) in layouts.items()
                }
                try:
                    if self._placement_func is None:
                        arrays, aliased = default_placement(views, layouts, self._cpu, may_alias)
                        path = "aliased" if aliased else "copied"
                    else:
                        arrays = custom_placement(self._placement_func, views, layouts, additional, group)
                        path = "custom"
                finally:
                    del views
        except Exception:
            log.exception("[hydrax] exception while placing %s of group %d:", step_words(record.step), record.group)
            if record.persist:
                self._writer.release(record.path)
            lease.seal()
            raise
        cached = cache is not None and (layouts is cache.layouts or cache.direct)
        if record.persist:
            self._persist(record, cache, lease, layouts, additional)
        lease.seal()
        if not lease.released:
            self._pinned.add(record.slot)
        self.stats.count(path, size)
        step = record.step
        form: dict[str, Any] = {"uncached": True, "cache_target": None}
        if cached:
            form["uncached"] = False
            layouts = cache.layouts
        elif self._cache_layouts[record.group] is not None:
            form["cache_target"] = CacheTarget(self._cache_layouts[record.group], cache, record.path, self._writer)
        if isinstance(step, TrainingStep):
            return TrainingBatch(
                group, step.group_index, record.indices, arrays, additional, layouts, record.skipped,
                epoch=step.epoch, epoch_batch=step.epoch_batch, batch_num=step.batch_num,
                seeds=local_seeds(plan, step.epoch, step.group_index), **form,
            )
        return ValidationBatch(
            group, step.group_index, record.indices, arrays, additional, layouts, record.skipped,
            validation_epoch=step.validation_epoch, validation_epoch_batch=step.validation_epoch_batch,
            validation_batch_num=step.validation_batch_num, **form,
        )

    def _persist(self, record: _InFlight, cache: GroupCache, lease, layouts, additional: dict[str, list[Any]]) -> None:
        """Queue the write of a batch loaded in direct mode, from its slot: the writer's views keep
        the slot from being recycled until the file is written."""
        record.persist = False
        path = record.path
        slot = np.frombuffer(lease, dtype=np.uint8, count=max(lease_end(layouts), 1))
        chunks = [(cache.layouts[name][3], slot[offset : offset + count * dtype.itemsize])
                  for name, (_shape, dtype, _jax, offset, count) in layouts.items()]
        del slot
        extras = {key: list(values) for key, values in additional.items()}
        self._writer.submit(path, lambda: cache.write(path, chunks, extras))

    # -- health ------------------------------------------------------------------------------
    def _frozen_worker(self) -> tuple[int, float] | None:
        """A worker whose heartbeat is stale, and for how many seconds, or None."""
        now = time.monotonic_ns()
        for i, process in enumerate(self._pool.processes):
            beat = self._arena.heartbeat(i)
            if beat and now - beat > HEARTBEAT_STALE_S * 1e9 and process.is_alive():
                return i, (now - beat) / 1e9
        return None

    def current_item(self, worker: int) -> _Loading | None:
        """What worker ``worker`` is loading, or None when it is idle."""
        task, position, started = self._arena.current_item(worker)
        seq, _first, _end = self._task_batch.get(task, (None, 0, 0))
        record = self._inflight.get(seq) if seq is not None else None
        if record is None or position < 0:
            return None
        index = record.indices[position]
        kind = "training" if isinstance(record.step, TrainingStep) else "validation"
        group = record.group if kind == "training" else record.group - self._training_count
        try:
            item = repr(self._groups[record.group][index])
        except Exception as exc:
            item = f"<unavailable: {exc!r}>"
        if len(item) > 200:
            item = item[:197] + "..."
        seconds = (time.monotonic_ns() - started) / 1e9
        return _Loading(index, item, kind, group, position, step_words(record.step), seconds)

    def describe_item(self, worker: int) -> str | None:
        """What worker ``worker`` is loading, in words, or None when it is idle."""
        loading = self.current_item(worker)
        return None if loading is None else loading.words()

    def describe_workers(self) -> str:
        """One line per worker: alive or not, and what it is loading; and who holds the slots."""
        lines = []
        if self._pinned and not self._inflight and self._arena.free_count == 0:
            lines.append(
                f"  all {self._arena.depth} batch slots are held by batches still referenced "
                "(hydrax.debug_batch_references() shows by what); release batches, or raise depth"
            )
        for i, process in enumerate(self._pool.processes):
            doing = self.describe_item(i) or "idle"
            state = "alive" if process.is_alive() else f"exited ({process.exitcode})"
            lines.append(f"  {process.name} (pid {process.pid}, {state}): {doing}")
        return "\n".join(lines)

    def _startup_report(self, worker: int) -> tuple | None:
        """The report of a worker that could not start, if it sent one (it does before it exits)."""
        connection = self._pool.connections[worker]
        try:
            while connection.poll(0):
                message = connection.recv()
                if isinstance(message, StartupReport):
                    return message
        except (EOFError, OSError):
            pass
        return None

    def _fail_worker(self, worker: int, what: str, report: tuple | None = None) -> None:
        process = self._pool.processes[worker]
        process.join(0.05)
        code = process.exitcode
        killed_by = None
        if code is not None and code < 0:
            try:
                killed_by = signal.Signals(-code).name
                how = f"was killed by {killed_by}"
            except ValueError:
                how = f"was killed by signal {-code}"
        elif code is not None:
            how = f"exited with status {code}"
        else:
            how = what
        if report is None:
            report = self._startup_report(worker)
        loading = self.current_item(worker)
        if report is not None:
            where = "during start-up: " + startup_failure_words(report)
        elif loading is not None:
            where = f"while loading {loading.words()}"
        elif not self._arena.heartbeat(worker):
            where = "during start-up, before it could say why (its output, if any, is above)"
        else:
            where = "while idle"
        message = f"loader process {process.name} (pid {process.pid}) {how} {where}"
        log.error("[hydrax] loader process exited, aborting: %s", message)
        self.output.put(Failure(WorkerError(
            message, process_name=process.name, pid=process.pid, exitcode=code, signal=killed_by,
            item=None if loading is None else loading.item, batch=None if loading is None else loading.batch,
            traceback=None if report is None else report.traceback,
        )))


@dataclass
class _Loading:
    """What a worker is loading: item ``index`` (``item`` is its repr) at ``position`` of ``batch``."""

    index: int
    item: str
    kind: str  # "training" or "validation"
    group: int
    position: int
    batch: str  # step_words of its batch
    seconds: float

    def words(self) -> str:
        return (f"item {self.index} ({self.item}) of {self.kind} group {self.group}, position {self.position} of "
                f"{self.batch}, for {self.seconds:.1f} s")


def startup_failure_words(report: tuple) -> str:
    """What a worker's start-up failure report says, with what to do about it, and its traceback."""
    from ._forkserver import MAIN_IMPORT_FAILED

    stage, line, text = report
    if stage == "startup_func":
        words = f"startup_func raised {line}"
    else:
        words = f"it could not unpickle what it runs (loader_func, startup_func and the groups' data): {line}"
        if MAIN_IMPORT_FAILED in text:
            words += (
                ". Something it was sent refers to the main module by name, so the worker imported that module, "
                "and its top level failed there: keep the training code under `if __name__ == \"__main__\":`"
            )
        elif any(kind in line for kind in ("ModuleNotFoundError", "ImportError", "AttributeError")):
            words += (
                ". A worker started from the fork server (JAX is already initialised here) receives functions and "
                "classes of the main script by value, but those of other modules by name: such a module must be "
                "importable in a new process with this process's sys.path (a module loaded from a file path is not); "
                "move the function into an importable module or into the main script"
            )
    indented = "\n".join("    " + row for row in text.rstrip().splitlines())
    return f"{words}\n  the worker's traceback:\n{indented}"
