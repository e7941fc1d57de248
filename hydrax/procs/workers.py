"""Loader workers: the loop each worker process runs, and the pool of them.

Workers are started once per run (how, and how they stay tied to the main process, is
:mod:`hydrax.procs.processes`). They receive the groups' data, plans and layouts once, in a
:class:`WorkerConfig`, then take :class:`~hydrax.procs.messages.Task` records from one shared pipe,
each naming a slot, a group, an epoch, a batch and a range of positions in it. A worker computes
each item's index and seed from the schedule itself, calls the user's ``loader_func`` with
writable views of the item's place in the slot, and sends one
:class:`~hydrax.procs.messages.Completion` per task. No descriptor is pickled per item.

A worker that cannot start (what it was sent cannot be unpickled, ``startup_func`` raised)
sends a :class:`~hydrax.procs.messages.StartupReport` before it exits, and a result that cannot be
pickled back (unpicklable extras) fails its item, naming the key, instead of killing the worker.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import pickle
import signal
import sys
import threading
import time
import traceback
import warnings
from dataclasses import dataclass
from multiprocessing.reduction import ForkingPickler
from types import MappingProxyType
from typing import Any, Callable, Sequence

import numpy as np

from .. import _core
from .arena import ITEM_WORDS, STOP_WORD, ArenaSpec, FdHandle, status_line
from ..errors import ConfigPicklingError, ShardFormatError, StoreError
from .messages import TASK_BYTES, Completion, StartupReport, Task
from ..order.mixture import Mixture
from .pickling import SharedBuffers, dumps, loads_shared, unpicklable_part
from .processes import (adopt_environment, die_with_parent, environment_snapshot, release_fork_server, tune_malloc,
                        warm_forkserver)
from ..order.schedule import GroupPlan, local_seeds

log = logging.getLogger(__name__)

HEARTBEAT_PERIOD_US = 100_000
#: Items whose views a worker keeps ready (about 0.5 KB each); beyond that they are rebuilt.
_VIEW_CACHE_ITEMS = 32_768


@dataclass
class GroupSpec:
    """A group as a worker sees it: its data, plan and array places; validation groups have no seeds.

    ``arrays`` maps each name to ``(item_shape, numpy dtype, blocks)``, ``blocks`` being
    ``(byte offset, rows)`` pairs that hold the share's rows in order (see
    :meth:`hydrax.layout.SlotLayout.item_places`): no JAX types, so a worker never has to import JAX.
    """

    data: Sequence[Any]
    plan: GroupPlan
    arrays: dict
    training: bool


@dataclass
class WorkerConfig:
    """Everything a worker needs, sent once when it starts."""

    loader_func: Callable
    startup_func: Callable | None
    loader_nice: int
    groups: list[GroupSpec]
    arena: ArenaSpec
    #: ``on_item_error="skip_item"``: a failed item is zeroed and reported, and its batch goes on.
    skip_failed_items: bool = False
    #: The main process's effective level of the ``hydrax`` logger. A forked worker inherits the
    #: whole logging set-up; one started from the fork server (a fresh interpreter) takes this
    #: level, so that quieting hydrax's messages in the program quiets its workers too.
    log_level: int = logging.NOTSET


def pack_config(config: WorkerConfig, shared: list | None = None) -> bytes:
    """``config`` pickled for workers started from the fork server (its large buffers appended
    to ``shared`` when given, see :func:`hydrax.procs.pickling.dumps`).

    cloudpickle ships functions and classes of ``__main__`` (and lambdas, closures, classes
    defined under the main guard) by value, and those of importable modules by reference, so a
    worker never needs the main module. Raises :class:`ConfigPicklingError` naming the part
    that cannot be pickled.
    """
    try:
        return dumps(config, shared)
    except Exception as exc:
        error = exc
    parts = [("loader_func", config.loader_func), ("startup_func", config.startup_func)]
    training = sum(1 for g in config.groups if g.training)
    for i, spec in enumerate(config.groups):
        kind, number = ("training", i) if spec.training else ("validation", i - training)
        parts.append((f"the data of {kind} group {number}", spec.data))
    where, cause = "loader_func, startup_func or the data", error
    for name, value in parts:
        try:
            dumps(value)
        except Exception as exc:
            where, cause = unpicklable_part(value, name, exc, dumps)
            break
    raise ConfigPicklingError(
        f"cannot send {where} to the loader processes: it cannot be pickled ({type(cause).__name__}: {cause}). "
        "JAX is already initialised in this process, so workers start from a fork server and receive what they "
        "run pickled (functions and classes of the main script by value, with the globals they use). Create "
        "locks, open files, clients and the like in the worker (in startup_func, or on first use) instead of "
        "sending them, or create the Dataloader before the first JAX computation (workers are then forked and "
        "inherit everything)"
    ) from error


def _report_startup_failure(completions, index: int, stage: str, exc: BaseException) -> None:
    """Tell the main process why this worker cannot start; log it where that fails."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    line = "".join(traceback.format_exception_only(type(exc), exc)).strip().splitlines()[-1]
    try:
        completions.send(StartupReport(stage, line, text))
    except Exception:
        log.error("[hydrax] loader process %d could not start:\n%s", index, text.rstrip("\n"))




def _clean_traceback(exc: BaseException) -> None:
    # A traceback keeps the loader's frame, and with it the item views, alive.
    traceback.clear_frames(exc.__traceback__)


class _ItemViews:
    """Per (slot, group): writable views of each item's place, built once and reused."""

    __slots__ = ("mappings", "views", "counts")

    def __init__(self, memory: _core.ArenaMap, slot_offset: int, places: dict) -> None:
        rows = []  # per array: the view of every row, over all its blocks
        for item_shape, dtype, blocks in places.values():
            count = int(np.prod(item_shape))
            per_row = []
            for offset, n in blocks:
                block = np.frombuffer(memory, dtype=dtype, count=n * count, offset=slot_offset + offset).reshape(n, *item_shape)
                per_row.extend(block[k, ...] for k in range(n))  # 0-d views for item_shape == ()
            rows.append(per_row)
        names = list(places)
        self.mappings = []
        self.views = []
        for item in zip(*rows):
            self.views.append(item)
            self.mappings.append(MappingProxyType(dict(zip(names, item))))
        del rows, per_row, block  # before the baseline: only the cached views may hold a row
        self.counts = [_refcounts(item) for item in self.views]

    def dangling(self, k: int) -> bool:
        """Whether ``loader_func`` kept a reference to one of item ``k``'s views."""
        return _refcounts(self.views[k]) != self.counts[k]


def _refcounts(views: tuple) -> list[int]:
    # Measured the same way for the baseline and the check, so temporaries cancel out.
    return [sys.getrefcount(v) for v in views]


def worker_main(config: WorkerConfig | bytes, arena: FdHandle, tasks: FdHandle, close: tuple[int, ...], index: int, completions,
                shared: tuple | None = None, environ: dict[str, str] | None = None, report: FdHandle | None = None) -> None:
    """Body of worker process ``index``: load tasks until the task pipe closes.

    ``config`` arrives pickled once for all workers when they start from the fork server (a large
    dataset is then pickled once, not once per worker), its large arrays in the shared memory
    ``shared`` (``(fd, size, places)``, see :class:`hydrax.procs.pickling.SharedBuffers`); ``close``
    lists the parent's ends of our pipes, which a forked worker inherits. ``environ`` is the main
    process's environment as the run started, which a worker from the fork server adopts before
    anything else (the server's own is from when JAX started); a forked worker has it already.
    ``report`` is the run's token for logging the error that ends it (see :class:`WorkerPool`).
    """
    if environ is not None:
        # First of all: what runs next (unpickling the config imports the user's modules, which
        # may read the environment as they load) must see what a forked worker would.
        adopt_environment(environ)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with_parent()
    release_fork_server()
    tune_malloc()
    for fd in close:
        try:
            os.close(fd)
        except OSError:
            pass
    if isinstance(config, bytes):
        try:
            config = pickle.loads(config) if shared is None else loads_shared(config, shared[0].fd, *shared[1:])
        except BaseException as exc:
            _report_startup_failure(completions, index, "unpickle", exc)
            sys.exit(1)
        if config.log_level:
            logging.getLogger("hydrax").setLevel(config.log_level)
    os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    memory = config.arena.map(arena)
    status = status_line(index)
    threading.Thread(target=_core.heartbeat, args=(memory, status, HEARTBEAT_PERIOD_US), name="hydrax-heartbeat", daemon=True).start()
    if config.loader_nice:
        try:
            os.nice(config.loader_nice)
        except OSError as exc:
            log.warning("[hydrax] loader_nice=%s not applied: %s", config.loader_nice, exc)
    if config.startup_func is not None:
        try:
            config.startup_func()
        except BaseException as exc:
            _report_startup_failure(completions, index, "startup_func", exc)
            sys.exit(1)
    _Loop(config, memory, status, tasks.fd, completions, None if report is None else report.fd).run()


def safe_repr(item: Any) -> str:
    """``repr(item)``, or what went wrong making it: an error report must not fail on its item."""
    try:
        return repr(item)
    except Exception as exc:  # noqa: BLE001 - any failure of a user's __repr__
        return f"<{type(item).__name__} whose repr failed: {type(exc).__name__}: {exc}>"


class _Loop:
    """One worker's loop: tasks from the shared pipe, items into the slots, completions back."""

    def __init__(self, config: WorkerConfig, memory: _core.ArenaMap, status: int, tasks: int, completions,
                 report: int | None = None) -> None:
        self.config = config
        self.report = report
        self.tasks = tasks
        self.memory = memory
        self.status = status + ITEM_WORDS
        self.stop = status + STOP_WORD
        self.completions = completions
        self.views: dict[tuple[int, int], _ItemViews] = {}
        # each slot's items, written by the main process before it hands out the batch's tasks
        self.item_lists = config.arena.item_lists(memory)

    def item_views(self, slot: int, group: int) -> _ItemViews:
        """The views of every item's place in ``slot`` for ``group``, built once."""
        key = (slot, group)
        views = self.views.get(key)
        if views is None:
            if sum(len(v.views) for v in self.views.values()) >= _VIEW_CACHE_ITEMS:
                self.views.clear()  # huge batches times many slots: rebuild rather than hoard memory
            views = _ItemViews(self.memory, self.config.arena.slot_offsets[slot], self.config.groups[group].arrays)
            self.views[key] = views
        return views

    def run(self) -> None:
        """Take tasks and send completions until the task pipe closes or the stop word is set."""
        fd = self.tasks
        while True:
            try:
                record = os.read(fd, TASK_BYTES)
            except InterruptedError:
                continue
            if len(record) != TASK_BYTES:
                return  # the parent closed the pipe (or died)
            task = Task.unpack(record)
            if self.memory.read_int64(self.stop):
                return
            result = self.load(task)
            try:
                try:
                    self.completions.send(result)
                except (EOFError, OSError):
                    raise
                except Exception as exc:  # extras that cannot be pickled: nothing was sent
                    self.completions.send(self.unsendable(task, result, exc))
            except (EOFError, OSError):
                return  # the parent stopped listening: the run is over

    def first_to_end_the_run(self) -> bool:
        """Whether this worker is the first of the run to meet an error that ends it, and so the
        one to log it: the run's token (one byte in a pipe all workers share) goes to one reader."""
        if self.report is None:
            return True
        try:
            return os.read(self.report, 1) == b"\0"
        except BlockingIOError:  # taken by another worker: the pipe is empty
            return False
        except OSError:
            return True

    def unsendable(self, task: Task, result: Completion, error: BaseException) -> Completion:
        """The failed result of ``task``, whose ``result`` could not be pickled: names the item and the key."""
        spec = self.config.groups[task.group]
        first, end = task.first, task.end
        indices = self.item_lists[task.slot][first:end].tolist()
        reason = None
        for k, extras in enumerate(result.extras or (), first):
            for key, value in (extras or {}).items():
                try:
                    ForkingPickler.dumps(value)
                except Exception as exc:
                    reason = (
                        f"the extras of item {indices[k - first]} ({_item_repr(spec.data, indices[k - first])}) cannot be sent to the main process: "
                        f"key {key!r} holds {_short_repr(value)}, which cannot be pickled ({type(exc).__name__}: {exc}); "
                        "loader_func must return extras that pickle (numbers, strings, numpy arrays and the like)"
                    )
                    break
            if reason:
                break
        if reason is None:
            reason = (f"the extras of items {list(indices)} cannot be sent to the main process "
                      f"({type(error).__name__}: {error}); loader_func must return dicts that pickle")
        log.error("[hydrax] %s", reason)
        return Completion(task.task_id, False, error=reason)

    def load(self, task: Task) -> Completion:
        """Load the items of ``task`` into their places in its slot."""
        task_id, slot, group, epoch, group_index, first, end = task
        spec = self.config.groups[group]
        plan = spec.plan
        data = spec.data
        # this task's items, as the main process listed them for the slot; a mixture splits them
        # by source at once
        listed = self.item_lists[slot][first:end]
        indices = listed.tolist()
        items = data.take(listed) if isinstance(data, Mixture) else map(data.__getitem__, indices)
        seeds = local_seeds(plan, epoch, group_index) if spec.training else None
        views = self.item_views(slot, group)
        loader = self.config.loader_func
        memory, status = self.memory, self.status
        started = time.perf_counter_ns()
        extras: list | None = None
        skipped: list | None = None  # (position, why) of the items zeroed instead of loaded
        for k in range(first, end):
            _core.mark_item(memory, status, task_id, k)
            item = next(items)
            try:
                result = loader(item, views.mappings[k], None if seeds is None else seeds[k])
                if result is not None and __debug__:
                    result = _check_result(result)
            except BaseException as exc:
                # the item's repr made here, once: logging would test a Mapping item (a ShardSet
                # sample) for emptiness, i.e. load it again inside this handler
                described = safe_repr(item)
                fatal = exc if isinstance(exc, (StoreError, ShardFormatError)) else None
                # 0.2.2's words, with the traceback; a program without logging set up sees them on
                # stderr. An error that ends the run (unreadable data) usually meets every item in
                # flight, in every worker: only the first worker to meet one logs it, or a run
                # ended with ten identical tracebacks, one per item.
                if fatal is None or self.first_to_end_the_run():
                    log.exception("[hydrax] exception while loading data item: %s", described)
                _clean_traceback(exc)
                why = f"{type(exc).__name__}: {exc} (item {indices[k - first]}: {described})"
                if self.config.skip_failed_items and fatal is None and isinstance(exc, Exception):
                    for view in views.views[k]:
                        view[...] = 0  # a defined content for the place of a skipped item
                    if skipped is None:
                        skipped = []
                    skipped.append((k, why))
                    continue
                _core.mark_item(memory, status, 0, -1)
                return Completion(task_id, False, error=why, fatal=fatal)
            if views.dangling(k):
                warnings.warn("loader memory has dangling reference", RuntimeWarning, stacklevel=2)
                del self.views[(slot, group)]
                views = self.item_views(slot, group)
            if result:
                if extras is None:
                    extras = [None] * (end - first)
                extras[k - first] = result
        _core.mark_item(memory, status, 0, -1)
        return Completion(task_id, True, extras, elapsed_ns=time.perf_counter_ns() - started, skipped=skipped)


def _short_repr(value: Any) -> str:
    try:
        text = repr(value)
    except Exception as exc:
        text = f"<repr failed: {exc!r}>"
    return f"{type(value).__name__} {text[:97] + '...' if len(text) > 100 else text}"


def _item_repr(data: Sequence[Any], index: int) -> str:
    try:
        text = repr(data[index])
    except Exception as exc:
        text = f"<unavailable: {exc!r}>"
    return text[:197] + "..." if len(text) > 200 else text


def _check_result(result):
    if not isinstance(result, dict):
        raise TypeError(f"loader_func must return a dict or None, got {type(result).__name__}")
    for key, value in result.items():
        if isinstance(value, np.ndarray) or type(value).__module__.startswith(("jax", "jaxlib")):
            warnings.warn(f"additional data '{key}' has array type {type(value)}", RuntimeWarning, stacklevel=2)
    return result


class WorkerPool:
    """``count`` worker processes sharing one task pipe, each with its own completion pipe."""

    def __init__(self, method: str) -> None:
        """Make the task pipe; :meth:`start` starts the processes (tasks may be queued before)."""
        self.method = method
        self._task_r, self._task_w = os.pipe()
        os.set_blocking(self._task_w, True)
        # The run's token for logging the error that ends it: one byte, which only one worker's
        # read gets; the others find the pipe empty (non-blocking: a process forked meanwhile by
        # another thread may hold the write end, so an empty pipe need not read as its end).
        self._report_r, report_w = os.pipe()
        os.write(report_w, b"\0")
        os.close(report_w)
        os.set_blocking(self._report_r, False)
        self.processes: list[mp.process.BaseProcess] = []
        self.connections = []

    def start(self, count: int, config: WorkerConfig, arena: FdHandle, preload: Sequence[str] = ()) -> None:
        """Start ``count`` workers; with tasks already queued the first ones start loading at once."""
        method = self.method
        if method == "forkserver":
            warm_forkserver(preload)
        ctx = mp.get_context(method)
        task_r, task_w = self._task_r, self._task_w
        close_in_child = (task_w,) if method == "fork" else ()
        buffers: list = []
        payload = config if method == "fork" else pack_config(config, buffers)
        shared = SharedBuffers(buffers) if buffers else None
        share = (shared.handle(), shared.size, shared.places) if shared is not None else None
        # A forked worker has this process's environment; one from the fork server would have the
        # server's, as it was when JAX started (before a notebook set HF_TOKEN, say).
        environ = environment_snapshot() if method != "fork" else None
        report = FdHandle(self._report_r)
        try:
            with warnings.catch_warnings():
                # numpy's BLAS threads make Python 3.12 warn about fork; they are fork-safe, and
                # fork is only chosen while no JAX backend (the unsafe kind of thread) is live.
                warnings.filterwarnings("ignore", message=".*use of fork\\(\\) may lead to deadlocks.*", category=DeprecationWarning)
                for i in range(count):
                    receive, send = ctx.Pipe(duplex=False)
                    process = ctx.Process(target=worker_main, args=(payload, arena, FdHandle(task_r), close_in_child, i, send, share, environ, report), name=f"hydrax-loader-{i}", daemon=True)
                    process.start()
                    send.close()
                    self.processes.append(process)
                    self.connections.append(receive)
        finally:
            os.close(task_r)
            self._task_r = -1
            os.close(self._report_r)  # every worker has its own copy now
            self._report_r = -1
            if shared is not None:
                shared.close_fd()

    def submit(self, task: Task) -> None:
        """Queue one task; fixed-size records below PIPE_BUF are written and read atomically."""
        if self._task_w is None:
            raise RuntimeError("the worker pool is closed")
        os.write(self._task_w, task.pack())

    def close(self, grace: float = 1.0) -> None:
        """Stop the workers: end of tasks, then SIGTERM and SIGKILL for any still running after ``grace``."""
        if self._task_r >= 0:
            os.close(self._task_r)
            self._task_r = -1
        if self._report_r >= 0:
            os.close(self._report_r)
            self._report_r = -1
        if self._task_w is not None:
            os.close(self._task_w)
            self._task_w = None
        for p in self.processes:
            p.join(grace)
            grace = 0.05
        for p in self.processes:
            if p.is_alive():
                p.terminate()
        for p in self.processes:
            p.join(1.0)
            if p.is_alive():
                p.kill()
                p.join()
        for c in self.connections:
            c.close()
        for p in self.processes:
            p.close()
        self.processes = []
        self.connections = []

