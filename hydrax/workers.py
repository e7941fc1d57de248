"""Loader worker processes: how they start, what they run, and how they report.

Workers are started once per run. They receive the groups' data, plans and layouts once, then
take *tasks* from one shared pipe: fixed-size records naming a slot, a group, an epoch, a batch and
a range of positions in it. A worker computes each item's index and seed from the schedule
itself, calls the user's ``loader_func`` with writable views of the item's place in the slot, and
sends one completion per task. No descriptor is pickled per item.

Start method: a plain fork while this process has no live JAX backend (fast, and a loader
defined in ``__main__`` is simply there); otherwise a fork server (see :mod:`hydrax._forkserver`),
because forking a process with live XLA threads can deadlock the child. The fork server never
runs the main module: its workers receive the loader, the start-up hook and the groups' data
pickled with cloudpickle, which ships functions and classes of ``__main__`` (lambdas, closures,
classes defined under the main guard) by value, and those of importable modules by name.

Workers die with the main process, even when it is SIGKILLed: a forked worker has it as parent
(``PR_SET_PDEATHSIG``); a fork server's worker has the server as parent, and lets go of the
server's "alive" pipe, so the server exits as soon as the main process is gone and takes its
workers with it.

A worker that cannot start (what it was sent cannot be unpickled, ``startup_func`` raised)
reports why on its completion pipe before it exits, and a result that cannot be pickled back
(unpicklable extras) fails its item, naming the key, instead of killing the worker.
"""

from __future__ import annotations

import ctypes
import functools
import io
import json
import logging
import marshal
import multiprocessing as mp
import os
import pickle
import signal
import struct
import sys
import tempfile
import threading
import time
import traceback
import types
import warnings
from collections import ChainMap
from dataclasses import dataclass
from multiprocessing.reduction import ForkingPickler
from types import MappingProxyType
from typing import Any, Callable, Sequence

import numpy as np

from . import _core
from .arena import ITEM_WORDS, STOP_WORD, ArenaSpec, FdHandle, status_line
from .errors import ConfigPicklingError, ShardFormatError, StoreError
from .schedule import GroupPlan, item_order, local_items, local_seeds, validation_item_order

log = logging.getLogger(__name__)

#: task id, slot, group, epoch, batch (group_index), first position, end position
TASK = struct.Struct("<qiiqqii")
HEARTBEAT_PERIOD_US = 100_000
#: Items whose views a worker keeps ready (about 0.5 KB each); beyond that they are rebuilt.
_VIEW_CACHE_ITEMS = 32_768
#: The name of each run's pipeline thread (see hydrax.pipeline).
PIPELINE_THREAD = "hydrax-pipeline"
#: First field of the message a worker sends when it cannot start:
#: ``(STARTUP_FAILED, stage, last line of the error, traceback text)``, ``stage`` being
#: ``"unpickle"`` (what it was sent) or ``"startup_func"``.
STARTUP_FAILED = "hydrax-startup-failed"


@dataclass
class GroupSpec:
    """A group as a worker sees it: its data, plan and array places; validation groups have no seeds.

    ``arrays`` maps each name to ``(item_shape, numpy dtype, blocks)``, ``blocks`` being
    ``(byte offset, rows)`` pairs that hold the share's rows in order (see
    :class:`hydrax.group.SlotLayout`): no JAX types, so a worker never has to import JAX.
    """

    data: Sequence[Any]
    plan: GroupPlan
    arrays: dict
    training: bool

    @classmethod
    def of(cls, group, plan: GroupPlan, layout, training: bool) -> GroupSpec:
        arrays = {
            name: (shape[1:], dtype, tuple(zip(layout.block_offsets[name], layout.blocks)))
            for name, (shape, dtype, _jax, _offset, _count) in layout.arrays.items()
        }
        return cls(group.data, plan, arrays, training)


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


def jax_backend_live() -> bool:
    """True when this process has initialised a JAX backend (and so runs XLA threads)."""
    bridge = sys.modules.get("jax._src.xla_bridge")
    return bool(bridge is not None and getattr(bridge, "_backends", None))


_fork_hazards: set[str] = set()


def note_fork_hazard(what: str) -> None:
    """Record that this process now runs threads that a plain ``fork`` would not carry over
    (``what`` says whose), so later runs start their workers from the fork server.

    obstore's request threads are one: a child forked after they started hangs on its first
    request, even with a new client.
    """
    _fork_hazards.add(what)


def start_method() -> str:
    """``"fork"`` when that is safe here, else ``"forkserver"``.

    The environment variable ``HYDRAX_START_METHOD`` (``fork`` or ``forkserver``) overrides the choice.
    """
    forced = os.environ.get("HYDRAX_START_METHOD", "")
    if forced:
        if forced not in ("fork", "forkserver"):
            raise ValueError(f"HYDRAX_START_METHOD must be 'fork' or 'forkserver', got {forced!r}")
        return forced
    # Another run's pipeline thread may be initialising JAX at this very moment: no fork then either.
    busy = any(t.name == PIPELINE_THREAD for t in threading.enumerate())
    return "forkserver" if busy or _fork_hazards or jax_backend_live() else "fork"


_watching = False


def watch_jax_start() -> None:
    """Start the fork server as soon as JAX initialises a backend, if JAX is imported already.

    From that moment on every new run needs the fork server, and starting it then, rather than
    when the run begins, takes the server's imports (JAX and the main module's other modules)
    off the time to the first batch (a training script usually spends seconds between
    initialising JAX and its first loader).
    Uses jax's ``register_backend_initialization_hook`` where it exists, else wraps the private
    ``_init_backend`` (jax 0.12 dropped the hook); with neither, nothing happens.
    """
    global _watching
    bridge = sys.modules.get("jax._src.xla_bridge")
    if _watching or bridge is None or mp.parent_process() is not None:
        return
    register = getattr(bridge, "register_backend_initialization_hook", None)
    init = getattr(bridge, "_init_backend", None)
    if register is not None:
        register(_on_backend)
    elif callable(init):

        def init_backend(*args, **kwargs):
            backend = init(*args, **kwargs)
            _on_backend(backend)
            return backend

        bridge._init_backend = init_backend
    else:
        return
    _watching = True


def _on_backend(_backend) -> None:
    # Runs inside JAX's backend initialisation: start a process, call nothing of JAX.
    from . import _forkserver

    if os.environ.get("HYDRAX_START_METHOD") == "fork" or _forkserver.SERVING:
        return
    try:
        warm_forkserver()
    except Exception:  # the run will start it later and report any problem then
        pass


def warm_forkserver(modules: Sequence[str | None] = ()) -> None:
    """Start the fork server now (if it is not running), with hydrax, cloudpickle, the modules
    the main module has imported and ``modules`` imported in it (never the main module itself).

    Workers forked from it then start in milliseconds instead of importing JAX and the rest
    each. Modules named after the server has started are imported by each worker instead, as
    it unpickles what it runs. Cheap to call again: the server is started once per process.
    """
    from multiprocessing import forkserver

    from ._forkserver import CONFIG_ENV

    mp.get_context("forkserver").set_forkserver_preload(["hydrax._forkserver"])
    preload = [m for m in dict.fromkeys([*_main_imports(), *modules]) if m and m not in ("__main__", "__mp_main__")]
    text = json.dumps({"main": _main_target(), "argv": list(sys.argv), "cwd": os.getcwd(), "path": _child_sys_path(), "modules": preload})
    spill = None
    if len(text) > _CONFIG_ENV_LIMIT:
        # A long command line (thousands of file names) would not fit in one environment
        # variable: a new server reads it from a file instead, and removes it.
        fd, spill = tempfile.mkstemp(prefix="hydrax-forkserver-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            f.write(text)
        text = "@" + spill
    server = forkserver._forkserver
    running = getattr(server, "_forkserver_pid", None)
    os.environ[CONFIG_ENV] = text
    try:
        server.ensure_running()
    finally:
        os.environ.pop(CONFIG_ENV, None)
        if spill is not None and getattr(server, "_forkserver_pid", None) == running:
            os.unlink(spill)  # no server was started to read it


#: The longest settings passed to the fork server in its environment (Linux allows 128 KiB per variable).
_CONFIG_ENV_LIMIT = 64 * 1024


def _main_target() -> list[str] | None:
    """``["name", module]`` or ``["path", file]``: how multiprocessing names this main module to a child.

    The fork server's stand-in main module bears the same, so that a child's preparation finds
    it in place and imports nothing (see :mod:`hydrax._forkserver`).
    """
    main = sys.modules.get("__main__")
    name = getattr(getattr(main, "__spec__", None), "name", None)
    if name is not None:
        return ["name", name]
    path = getattr(main, "__file__", None)
    if not isinstance(path, str):
        return None  # an interactive session, ``python -c``: a child imports nothing either
    if not os.path.isabs(path) and mp.process.ORIGINAL_DIR is not None:
        path = os.path.join(mp.process.ORIGINAL_DIR, path)
    return ["path", os.path.normpath(path)]


def _child_sys_path() -> list[str]:
    # As multiprocessing gives a child: the current directory entry ("") made absolute.
    origin = mp.process.ORIGINAL_DIR or os.getcwd()
    return [origin if p == "" else p for p in sys.path if isinstance(p, str)]


def _main_imports() -> list[str]:
    """The modules whose names the main module holds (``import jax``, ``from x import f``)."""
    main = sys.modules.get("__main__")
    found = []
    for value in list(vars(main).values()) if main is not None else ():
        if isinstance(value, types.ModuleType):
            name = value.__name__
        elif isinstance(value, (type, types.FunctionType, types.BuiltinFunctionType)):
            name = getattr(value, "__module__", None)
        else:
            continue
        if isinstance(name, str) and name in sys.modules and name != "builtins":
            found.append(name)
    return found


_Pickler: Any = None


def _dumps(value: Any) -> bytes:
    """``value`` pickled with cloudpickle, keeping the file names of the code it ships by value.

    cloudpickle renames such code ``<dynamic-code>``, which leaves a worker's tracebacks without
    the script's file and lines; a fork server's worker runs the same interpreter, so the code
    objects travel as ``marshal`` data instead, file names included.
    """
    global _Pickler
    if _Pickler is None:
        import cloudpickle

        class Pickler(cloudpickle.Pickler):
            dispatch_table = ChainMap({types.CodeType: _reduce_code}, cloudpickle.Pickler.dispatch_table)

        _Pickler = Pickler
    buffer = io.BytesIO()
    _Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(value)
    return buffer.getvalue()


def _reduce_code(code: types.CodeType):
    return marshal.loads, (marshal.dumps(code),)


def pack_config(config: WorkerConfig) -> bytes:
    """``config`` pickled for workers started from the fork server.

    cloudpickle ships functions and classes of ``__main__`` (and lambdas, closures, classes
    defined under the main guard) by value, and those of importable modules by reference, so a
    worker never needs the main module. Raises :class:`ConfigPicklingError` naming the part
    that cannot be pickled.
    """
    try:
        return _dumps(config)
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
            _dumps(value)
        except Exception as exc:
            where, cause = _unpicklable_part(value, name, exc, _dumps)
            break
    raise ConfigPicklingError(
        f"cannot send {where} to the loader processes: it cannot be pickled ({type(cause).__name__}: {cause}). "
        "JAX is already initialised in this process, so workers start from a fork server and receive what they "
        "run pickled (functions and classes of the main script by value, with the globals they use). Create "
        "locks, open files, clients and the like in the worker (in startup_func, or on first use) instead of "
        "sending them, or create the Dataloader before the first JAX computation (workers are then forked and "
        "inherit everything)"
    ) from error


def _parts(value: Any, path: str):
    """The named parts of ``value`` that pickling it pickles too, for :func:`_unpicklable_part`."""
    if isinstance(value, types.MethodType):
        yield f"{path}.__self__", value.__self__
        yield f"{path}.__func__", value.__func__
    elif isinstance(value, types.FunctionType):
        for name, cell in zip(value.__code__.co_freevars, value.__closure__ or ()):
            try:
                yield f"{path}'s closure variable {name!r}", cell.cell_contents
            except ValueError:  # an empty cell
                pass
        names, codes = set(), [value.__code__]
        while codes:
            code = codes.pop()
            names.update(code.co_names)
            codes.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
        for name in sorted(names):
            if name in value.__globals__ and not isinstance(value.__globals__[name], types.ModuleType):
                yield f"{path}'s global {name!r}", value.__globals__[name]
    elif isinstance(value, functools.partial):
        yield f"{path}.func", value.func
        for i, arg in enumerate(value.args):
            yield f"{path}.args[{i}]", arg
        for name, arg in value.keywords.items():
            yield f"{path}.keywords[{name!r}]", arg
    elif isinstance(value, dict):
        for key, item in list(value.items())[:256]:
            yield f"{path}[{key!r}]", item
    elif isinstance(value, (list, tuple, set, frozenset)):
        for i, item in enumerate(list(value)[:256]):
            yield f"{path}[{i}]", item
    elif isinstance(getattr(value, "__dict__", None), dict) and not isinstance(value, (type, types.ModuleType)):
        for name, item in list(vars(value).items())[:256]:
            yield f"{path}.{name}", item


def _unpicklable_part(value: Any, path: str, error: BaseException, dumps, depth: int = 0) -> tuple[str, BaseException]:
    """The innermost part of ``value`` (which failed to pickle with ``error``) that fails too, and its error."""
    if depth < 4:
        for part, item in _parts(value, path):
            try:
                dumps(item)
            except Exception as exc:
                return _unpicklable_part(item, part, exc, dumps, depth + 1)
    return path, error


def _release_fork_server() -> None:
    """Close this process's copy of the fork server's "alive" pipe.

    multiprocessing gives every child of the fork server the write end of that pipe, and the
    server exits only once every copy is closed. Kept here, it would keep the server alive
    after the main process is killed, and the server would keep this worker alive (our
    ``PR_SET_PDEATHSIG`` watches the server, our parent): both would outlive the main process.
    """
    module = sys.modules.get("multiprocessing.forkserver")
    server = getattr(module, "_forkserver", None)
    fd = getattr(server, "_forkserver_alive_fd", None)
    if isinstance(fd, int):
        try:
            os.close(fd)
        except OSError:
            pass
        server._forkserver_alive_fd = None


def _report_startup_failure(completions, index: int, stage: str, exc: BaseException) -> None:
    """Tell the main process why this worker cannot start; log it where that fails."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    line = "".join(traceback.format_exception_only(type(exc), exc)).strip().splitlines()[-1]
    try:
        completions.send((STARTUP_FAILED, stage, line, text))
    except Exception:
        log.error("[hydrax] loader process %d could not start:\n%s", index, text.rstrip("\n"))


def _die_with_parent() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


#: glibc malloc settings in workers: blocks below 16 MiB come from the heap, and up to 32 MiB of
#: free heap is kept. By default glibc maps and unmaps each large block (a decoded image, say) and
#: trims the heap after it, so every item pays for fresh pages: JPEG decoding ran at 0.45x
#: (tools/bench_shards.py, Pillow, 320x320) in a process that had not happened to raise glibc's
#: adaptive threshold first. Set ``HYDRAX_MALLOC_TUNING=0``, or glibc's own ``MALLOC_*_``
#: variables or ``GLIBC_TUNABLES``, to keep other settings.
MALLOC_MMAP_THRESHOLD = 16 << 20
MALLOC_TRIM_THRESHOLD = 32 << 20
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


def _tune_malloc() -> None:
    if os.environ.get("HYDRAX_MALLOC_TUNING") == "0":
        return
    if any(name in os.environ for name in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES")):
        return
    try:
        libc = ctypes.CDLL(None)
        libc.mallopt(_M_MMAP_THRESHOLD, MALLOC_MMAP_THRESHOLD)
        libc.mallopt(_M_TRIM_THRESHOLD, MALLOC_TRIM_THRESHOLD)
    except (OSError, AttributeError):  # not glibc
        pass


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
        return _refcounts(self.views[k]) != self.counts[k]


def _refcounts(views: tuple) -> list[int]:
    # Measured the same way for the baseline and the check, so temporaries cancel out.
    return [sys.getrefcount(v) for v in views]


def worker_main(config: WorkerConfig | bytes, arena: FdHandle, tasks: FdHandle, close: tuple[int, ...], index: int, completions) -> None:
    """Body of worker process ``index``: load tasks until the task pipe closes.

    ``config`` arrives pickled once for all workers when they start from the fork server (a large
    dataset is then pickled once, not once per worker); ``close`` lists the parent's ends of our
    pipes, which a forked worker inherits.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent()
    _release_fork_server()
    _tune_malloc()
    for fd in close:
        try:
            os.close(fd)
        except OSError:
            pass
    if isinstance(config, bytes):
        try:
            config = pickle.loads(config)
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
    _Loop(config, memory, status, tasks.fd, completions).run()


class _Loop:
    def __init__(self, config: WorkerConfig, memory: _core.ArenaMap, status: int, tasks: int, completions) -> None:
        self.config = config
        self.tasks = tasks
        self.memory = memory
        self.status = status + ITEM_WORDS
        self.stop = status + STOP_WORD
        self.completions = completions
        self.views: dict[tuple[int, int], _ItemViews] = {}
        self.orders: dict[tuple[int, int], Any] = {}

    def item_views(self, slot: int, group: int) -> _ItemViews:
        key = (slot, group)
        views = self.views.get(key)
        if views is None:
            if sum(len(v.views) for v in self.views.values()) >= _VIEW_CACHE_ITEMS:
                self.views.clear()  # huge batches times many slots: rebuild rather than hoard memory
            views = _ItemViews(self.memory, self.config.arena.slot_offsets[slot], self.config.groups[group].arrays)
            self.views[key] = views
        return views

    def order(self, group: int, epoch: int):
        key = (group, epoch)
        if key not in self.orders:
            spec = self.config.groups[group]
            if len(self.orders) > 8:
                self.orders.clear()
            self.orders[key] = item_order(spec.plan, epoch) if spec.training else validation_item_order(spec.plan)
        return self.orders[key]

    def run(self) -> None:
        fd = self.tasks
        while True:
            try:
                message = os.read(fd, TASK.size)
            except InterruptedError:
                continue
            if len(message) != TASK.size:
                return  # the parent closed the pipe (or died)
            task = TASK.unpack(message)
            if self.memory.read_int64(self.stop):
                return
            result = self.load(*task)
            try:
                try:
                    self.completions.send(result)
                except (EOFError, OSError):
                    raise
                except Exception as exc:  # extras that cannot be pickled: nothing was sent
                    self.completions.send(self.unsendable(task, result, exc))
            except (EOFError, OSError):
                return  # the parent stopped listening: the run is over

    def unsendable(self, task: tuple, result: tuple, error: BaseException) -> tuple:
        """The failed result of ``task``, whose ``result`` could not be pickled: names the item and the key."""
        task_id, _slot, group, epoch, group_index, first, end = task
        spec = self.config.groups[group]
        indices = local_items(spec.plan, self.order(group, epoch), group_index)
        reason = None
        for k, extras in enumerate(result[2] or (), first):
            for key, value in (extras or {}).items():
                try:
                    ForkingPickler.dumps(value)
                except Exception as exc:
                    reason = (
                        f"the extras of item {indices[k]} ({_item_repr(spec.data, indices[k])}) cannot be sent to the main process: "
                        f"key {key!r} holds {_short_repr(value)}, which cannot be pickled ({type(exc).__name__}: {exc}); "
                        "loader_func must return extras that pickle (numbers, strings, numpy arrays and the like)"
                    )
                    break
            if reason:
                break
        if reason is None:
            reason = (f"the extras of items {list(indices[first:end])} cannot be sent to the main process "
                      f"({type(error).__name__}: {error}); loader_func must return dicts that pickle")
        log.error("[hydrax] %s", reason)
        return (task_id, False, None, reason, 0, None, None)

    def load(self, task: int, slot: int, group: int, epoch: int, group_index: int, first: int, end: int):
        spec = self.config.groups[group]
        plan = spec.plan
        indices = local_items(plan, self.order(group, epoch), group_index)
        seeds = local_seeds(plan, epoch, group_index) if spec.training else None
        views = self.item_views(slot, group)
        loader = self.config.loader_func
        data = spec.data
        memory, status = self.memory, self.status
        started = time.perf_counter_ns()
        extras: list | None = None
        skipped: list | None = None  # (position, why) of the items zeroed instead of loaded
        for k in range(first, end):
            _core.mark_item(memory, status, task, k)
            item = data[indices[k]]
            try:
                result = loader(item, views.mappings[k], None if seeds is None else seeds[k])
                if result is not None and __debug__:
                    result = _check_result(result)
            except BaseException as exc:
                # 0.2.2's words, with the traceback; a program without logging set up sees them on stderr
                log.exception("[hydrax] exception while loading data item: %r", item)
                _clean_traceback(exc)
                why = f"{type(exc).__name__}: {exc} (item {indices[k]}: {item!r})"
                fatal = exc if isinstance(exc, (StoreError, ShardFormatError)) else None
                if self.config.skip_failed_items and fatal is None and isinstance(exc, Exception):
                    for view in views.views[k]:
                        view[...] = 0  # a defined content for the place of a skipped item
                    if skipped is None:
                        skipped = []
                    skipped.append((k, why))
                    continue
                _core.mark_item(memory, status, 0, -1)
                return (task, False, None, why, 0, fatal, None)
            if views.dangling(k):
                warnings.warn("loader memory has dangling reference", RuntimeWarning, stacklevel=2)
                del self.views[(slot, group)]
                views = self.item_views(slot, group)
            if result:
                if extras is None:
                    extras = [None] * (end - first)
                extras[k - first] = result
        _core.mark_item(memory, status, 0, -1)
        return (task, True, extras, None, time.perf_counter_ns() - started, None, skipped)


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
        payload = config if method == "fork" else pack_config(config)
        try:
            with warnings.catch_warnings():
                # numpy's BLAS threads make Python 3.12 warn about fork; they are fork-safe, and
                # fork is only chosen while no JAX backend (the unsafe kind of thread) is live.
                warnings.filterwarnings("ignore", message=".*use of fork\\(\\) may lead to deadlocks.*", category=DeprecationWarning)
                for i in range(count):
                    receive, send = ctx.Pipe(duplex=False)
                    process = ctx.Process(target=worker_main, args=(payload, arena, FdHandle(task_r), close_in_child, i, send), name=f"hydrax-loader-{i}", daemon=True)
                    process.start()
                    send.close()
                    self.processes.append(process)
                    self.connections.append(receive)
        finally:
            os.close(task_r)
            self._task_r = -1

    @property
    def sentinels(self) -> list[int]:
        return [p.sentinel for p in self.processes]

    def submit(self, task: int, slot: int, group: int, epoch: int, group_index: int, first: int, end: int) -> None:
        """Queue one task; fixed-size records below PIPE_BUF are written and read atomically."""
        if self._task_w is None:
            raise RuntimeError("the worker pool is closed")
        os.write(self._task_w, TASK.pack(task, slot, group, epoch, group_index, first, end))

    def close(self, grace: float = 1.0) -> None:
        """Stop the workers: end of tasks, then SIGTERM and SIGKILL for any still running after ``grace``."""
        if self._task_r >= 0:
            os.close(self._task_r)
            self._task_r = -1
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


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (one of another user counts as alive): what decides if
    a file named after the process that writes it is a dead process's leftover."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
