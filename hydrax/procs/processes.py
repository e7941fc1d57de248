"""The processes of a run: how workers start, and how they stay tied to the main process.

- **Start method.** A plain ``fork`` while this process has no live JAX backend (milliseconds,
  and a loader defined in ``__main__`` is simply there); otherwise a fork server (see
  :mod:`hydrax.procs.forkserver`), because forking a process with live XLA threads can deadlock the
  child. Other threads that a fork would not carry over (obstore's) are *fork hazards*.
- **Fork server warm-up.** The server is started the moment JAX initialises a backend, with
  hydrax, the main module's imports and the loader's module preloaded, so that its workers start
  in milliseconds. It starts with this process's module path, not with the working directory
  first, so that it and its workers import the hydrax this process imported, whatever folders
  the working directory holds.
- **Parent death.** A worker dies with its parent (``PR_SET_PDEATHSIG``); a fork server's worker
  lets go of the server's "alive" pipe, so the server exits with the main process and takes its
  workers with it.
- The malloc settings of worker processes. (Whether a process named in a file lives is
  :func:`hydrax.procs.liveness.process_alive`, which this module and the read-ahead share.)

What a worker runs, and the pool of them, are in :mod:`hydrax.procs.workers`.
"""

from __future__ import annotations

import ctypes
import json
import logging
import multiprocessing as mp
import os
import signal
import sys
import tempfile
import threading
import types
from typing import Mapping, Sequence

from .liveness import process_alive

log = logging.getLogger(__name__)

#: The name of each run's pipeline thread (see :mod:`hydrax.run.pipeline`): while one runs, it may be
#: initialising JAX, so no process may be forked.
PIPELINE_THREAD = "hydrax-pipeline"


def is_worker() -> bool:
    """True inside any child process (in particular inside hydrax's loader processes)."""
    return mp.parent_process() is not None


def jax_backend_live() -> bool:
    """True when this process has initialised a JAX backend (and so runs XLA threads)."""
    bridge = sys.modules.get("jax._src.xla_bridge")
    return bool(bridge is not None and getattr(bridge, "_backends", None))


#: What the fork server runs as it exits, as "module:function" names, in the order registered.
_server_exit_hooks: list[str] = []


def at_server_exit(function) -> None:
    """Have every fork server started from now on run ``function`` (a module-level function
    that takes no argument) as it exits.

    The layers above register their clean-up here, so that this layer never imports them: the
    read-ahead has the server sweep the folders of main processes that died (the server outlives
    a killed main process by a moment, and no other hydrax process may come). The server imports
    the function's module as it starts, because at exit an import that starts threads fails. A
    server that was already running when a hook is registered does not run it; the next hydrax
    process's own clean-up covers what it would have done.
    """
    name = f"{function.__module__}:{function.__qualname__}"
    if name not in _server_exit_hooks:
        _server_exit_hooks.append(name)


_fork_hazards: set[str] = set()
_warned_hazards: list[bool] = []  # whether forcing fork despite them was warned of


def note_fork_hazard(what: str) -> None:
    """Record that this process now runs threads that a plain ``fork`` would not carry over
    (``what`` says whose), so later runs start their workers from the fork server.

    obstore's request threads are one: a child forked after they started hangs on its first
    request, even with a new client.
    """
    _fork_hazards.add(what)


def fork_hazards() -> tuple[str, ...]:
    """What :func:`note_fork_hazard` recorded in this process, sorted (empty where nothing was)."""
    return tuple(sorted(_fork_hazards))


def start_method() -> str:
    """``"fork"`` when that is safe here, else ``"forkserver"``.

    The environment variable ``HYDRAX_START_METHOD`` (``fork`` or ``forkserver``) overrides the
    choice; ``fork`` where a fork hazard was noted (see :func:`note_fork_hazard`) logs a warning
    once (workers that make remote requests would hang; those of local data do not: a run whose
    data reads remote shards is refused as it starts, with :class:`~hydrax.errors.StartMethodError`).
    """
    forced = os.environ.get("HYDRAX_START_METHOD", "")
    if forced:
        if forced not in ("fork", "forkserver"):
            raise ValueError(f"HYDRAX_START_METHOD must be 'fork' or 'forkserver', got {forced!r}")
        if forced == "fork" and _fork_hazards and not _warned_hazards:
            # Not an error: workers of local data never make requests, and fork serves them well.
            _warned_hazards.append(True)
            log.warning("[hydrax] HYDRAX_START_METHOD=fork, but this process runs %s, which a forked worker does not "
                        "inherit: a worker that makes remote requests will hang on its first one. Unset "
                        "HYDRAX_START_METHOD (or set it to 'forkserver') to read remote shards.",
                        " and ".join(sorted(_fork_hazards)))
        return forced
    # Another run's pipeline thread may be initialising JAX at this very moment: no fork then either.
    busy = any(t.name == PIPELINE_THREAD for t in threading.enumerate())
    return "forkserver" if busy or _fork_hazards or jax_backend_live() else "fork"


_watching = False
#: Set by Ray's raylet in the processes it starts for tasks and actors (never in a driver).
RAY_WORKER_ENV = "RAY_RAYLET_PID"


def watch_jax_start() -> None:
    """Start the fork server as soon as JAX initialises a backend, if JAX is imported already.

    From that moment on every new run needs the fork server, and starting it then, rather than
    when the run begins, takes the server's imports (JAX and the main module's other modules)
    off the time to the first batch (a training script usually spends seconds between
    initialising JAX and its first loader). Not while a run is loading: its workers need the CPU;
    nor in a Ray worker, whose tasks (a shard build's) import hydrax without loading through it:
    each one started a server. A Dataloader made there starts the server when it needs one.
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
    start_forkserver_early()


def start_forkserver_early(background: bool = False, main_imports: bool = True, modules: Sequence[str] = ()) -> None:
    """Start the fork server ahead of the run that will need it (JAX was just initialised, or a
    dataset made remote reads that a forked worker could not make), so that its imports are
    not on the way to the first batch; ``background`` starts it from a thread, so the caller
    does not wait the tenth of a second a start takes; ``main_imports=False`` imports only
    hydrax's worker code there (a run may follow at once: workers then import what else they
    use themselves, rather than wait for the server to import all the main module has, JAX
    included); ``modules`` are imported there too. Never in a worker, a Ray worker or the server
    itself, nor while a run is loading.
    """
    from . import forkserver as server_preload

    if (os.environ.get("HYDRAX_START_METHOD") == "fork" or server_preload.SERVING or RAY_WORKER_ENV in os.environ
            or mp.parent_process() is not None):
        return
    if any(t.name == PIPELINE_THREAD for t in threading.enumerate()):
        # A run is loading (its first batch is what initialises JAX): the server's imports would
        # take seconds of CPU from its workers, on a small host a fifth of the epoch. The next
        # run starts the server when it is made, as it would without this hook.
        return

    def start() -> None:
        try:
            warm_forkserver(modules, main_imports=main_imports)
        except Exception:  # the run will start it later and report any problem then
            pass

    if background:
        threading.Thread(target=start, name="hydrax-forkserver-start", daemon=True).start()
    else:
        start()


def warm_forkserver(modules: Sequence[str | None] = (), main_imports: bool = True) -> None:
    """Start the fork server now (if it is not running), with hydrax, cloudpickle, the modules
    the main module has imported (unless ``main_imports`` is False) and ``modules`` imported in
    it (never the main module itself).

    Workers forked from it then start in milliseconds instead of importing JAX and the rest
    each. Modules named after the server has started are imported by each worker instead, as
    it unpickles what it runs. Cheap to call again: the server is started once per process.

    The server imports hydrax from where this process did (see :func:`_server_environment`);
    where it cannot (Python 3.10, or ``python -E``, with a stale copy of hydrax in the working
    directory), this raises :class:`~hydrax.errors.ForkServerImportError` naming both copies rather than
    let workers run the other one.
    """
    from multiprocessing import forkserver

    from . import forkserver as server_preload
    from .forkserver import CONFIG_ENV

    if server_preload.SERVING:
        return  # the server itself (importing a module that makes a run): never a server of a server
    mp.get_context("forkserver").set_forkserver_preload(["hydrax.procs.forkserver"])
    server = forkserver._forkserver
    running = getattr(server, "_forkserver_pid", None)
    path = _child_sys_path()
    environment = _server_environment(path)
    if running is None or not process_alive(running):
        _check_server_finds_this_hydrax(environment["PYTHONPATH"].split(os.pathsep))
    preload = [m for m in dict.fromkeys([*(_main_imports() if main_imports else ()), *modules])
               if m and m not in ("__main__", "__mp_main__")]
    text = json.dumps({"main": _main_target(), "argv": list(sys.argv), "cwd": os.getcwd(), "path": path, "modules": preload,
                       "at_exit": _server_exit_hooks, "environ": {name: os.environ.get(name) for name in environment}})
    spill = None
    if len(text) > _CONFIG_ENV_LIMIT:
        # A long command line (thousands of file names) would not fit in one environment
        # variable: a new server reads it from a file instead, and removes it.
        fd, spill = tempfile.mkstemp(prefix="hydrax-forkserver-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            f.write(text)
        text = "@" + spill
    environment[CONFIG_ENV] = text
    # The environment is the whole process's: two threads starting the server at once would
    # hand one of them the other's settings, or none.
    with _server_start_lock:
        saved = {name: os.environ.get(name) for name in environment}
        os.environ.update(environment)
        try:
            server.ensure_running()
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
            if spill is not None and getattr(server, "_forkserver_pid", None) == running:
                os.unlink(spill)  # no server was started to read it


_server_start_lock = threading.Lock()


def environment_snapshot() -> dict[str, str]:
    """This process's environment as it is now, for a worker started from the fork server to
    adopt (see :func:`adopt_environment`).

    Taken while no thread is starting the fork server: that start sets the server's module path
    (and its settings) in this process's environment for a moment, which no worker must see.
    """
    with _server_start_lock:
        return dict(os.environ)


def adopt_environment(snapshot: Mapping[str, str]) -> None:
    """Make this process's environment exactly ``snapshot``: variables it lacks are removed, the
    others set (through ``os.environ``, so that C code reading ``getenv`` sees them too).

    A worker from the fork server runs this first: the server kept the environment of the
    moment it started (when JAX started, in a notebook before ``os.environ["HF_TOKEN"] = ...``),
    while a forked worker, and every worker of hydrax 0.2.2, has the main process's as the
    Dataloader starts. Only ``os.environ`` can be renewed: what the server's modules read from
    the environment as they were imported (JAX's flags, huggingface_hub's ``HF_HOME`` and
    ``HF_ENDPOINT``, the BLAS thread counts numpy's libraries took, glibc's ``MALLOC_*``, the
    interpreter's ``PYTHON*``) stays as the server read it.
    """
    for name in [name for name in os.environ if name not in snapshot]:
        del os.environ[name]
    for name, value in snapshot.items():
        if os.environ.get(name) != value:
            os.environ[name] = value

#: The folder of the ``hydrax`` package this process imported.
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # hydrax/, above procs/


def _server_environment(path: list[str]) -> dict[str, str]:
    """``PYTHONPATH`` and ``PYTHONSAFEPATH`` for a new fork server (the server puts this
    process's values back as it starts, so its workers see the environment unchanged).

    multiprocessing starts the server with ``python -c``, which puts the working directory
    first on its module path, and it imports ``hydrax.procs.forkserver`` before anything of ours
    can set the path: a folder named ``hydrax`` there (a clone, a stale copy, even an empty
    folder, which hides an editable install's hydrax as a namespace package) would be the
    hydrax of the server and of every worker. ``PYTHONSAFEPATH`` (Python 3.11+) leaves the
    working directory out, and ``PYTHONPATH`` gives the server this process's path, in this
    process's order, before its own defaults. The folder of this process's hydrax comes last:
    a hydrax that an import hook found (``pip install -e``) is then also a plain entry, which a
    namespace package in the working directory cannot hide on Python 3.10 either.
    """
    entries = [p for p in path if os.pathsep not in p]  # such an entry cannot be written in PYTHONPATH
    home = os.path.dirname(_PACKAGE)
    if home not in entries:
        entries.append(home)
    joined = os.pathsep.join(entries)
    if len(joined) > _CONFIG_ENV_LIMIT:
        joined = home  # the server sets the whole path itself once hydrax is imported
    return {"PYTHONPATH": joined, "PYTHONSAFEPATH": "1"}


def _check_server_finds_this_hydrax(entries: list[str]) -> None:
    """Raise :class:`~hydrax.errors.ForkServerImportError` when a new fork server, searching ``entries``
    (the ``PYTHONPATH`` it gets), would import another hydrax than this process's.

    Import hooks (an editable install's) come after the path entries, so only a path entry can
    hold another copy: the one that comes first wins, a regular package before a namespace one.
    """
    from importlib.machinery import PathFinder

    from ..errors import ForkServerImportError

    honoured = not sys.flags.ignore_environment
    safe = getattr(sys.flags, "safe_path", False) or (honoured and sys.version_info >= (3, 11))
    search = ([] if safe else [os.getcwd()]) + (entries if honoured else _child_sys_path())
    spec = PathFinder.find_spec("hydrax", search)
    if spec is None:
        return  # only an import hook finds hydrax: the same one as here
    ours = os.path.realpath(_PACKAGE)
    if spec.origin is not None and os.path.realpath(os.path.dirname(spec.origin)) == ours:
        return
    other = os.path.dirname(spec.origin) if spec.origin else ", ".join(spec.submodule_search_locations or ())
    if safe:
        cause = "that folder comes first on this process's sys.path, which changed after hydrax was imported"
    else:
        cause = ("the server starts with the working directory first on its module path (Python 3.10, or python -E): "
                 "run the script from another directory, or rename that folder")
    raise ForkServerImportError(f"hydrax's loader fork server would import hydrax from {other}, not from {ours} where this "
                      f"process imported it, and its workers would run that copy: {cause}")


#: The longest settings passed to the fork server in its environment (Linux allows 128 KiB per variable).
_CONFIG_ENV_LIMIT = 64 * 1024


def _main_target() -> list[str] | None:
    """``["name", module]`` or ``["path", file]``: how multiprocessing names this main module to a child.

    The fork server's stand-in main module bears the same, so that a child's preparation finds
    it in place and imports nothing (see :mod:`hydrax.procs.forkserver`).
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


def release_fork_server() -> None:
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


def helpers_allowed() -> bool:
    """Whether hydrax may start helper processes (read-ahead's fetch process, set-up's indexing
    processes) from the fork server here: not where workers are forked
    (``HYDRAX_START_METHOD=fork``: no fork server), nor in a daemonic process (which may have no
    children)."""
    return os.environ.get("HYDRAX_START_METHOD") != "fork" and not mp.current_process().daemon


def die_with_parent() -> None:
    """Have the kernel send this process SIGKILL when its parent dies (``PR_SET_PDEATHSIG``)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def run_behind(nice: int) -> None:
    """Let this process yield its cores to the training process: Linux's ``SCHED_BATCH`` policy
    (waking up, it does not preempt a process that is running) and ``os.nice(nice)``. Both hold for
    the calling thread and the threads it starts afterwards, so a helper calls this first, before
    it starts any. ``nice`` 0 changes nothing. A refusal (not Linux, a sandbox) is logged at DEBUG."""
    if nice <= 0:
        return
    try:
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
        os.nice(nice)
    except (OSError, AttributeError) as exc:
        log.debug("[hydrax] this helper keeps its CPU priority: %s", exc)


#: glibc malloc settings in workers: blocks below 16 MiB come from the heap, and up to 32 MiB of
#: free heap is kept. By default glibc maps and unmaps each large block (a decoded image, say) and
#: trims the heap after it, so every item pays for fresh pages: JPEG decoding ran at 0.45x
#: (tools/bench/bench_shards.py, Pillow, 320x320) in a process that had not happened to raise glibc's
#: adaptive threshold first. Set ``HYDRAX_MALLOC_TUNING=0``, or glibc's own ``MALLOC_*_``
#: variables or ``GLIBC_TUNABLES``, to keep other settings.
MALLOC_MMAP_THRESHOLD = 16 << 20
MALLOC_TRIM_THRESHOLD = 32 << 20
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


def tune_malloc() -> None:
    """Apply :data:`MALLOC_MMAP_THRESHOLD` and :data:`MALLOC_TRIM_THRESHOLD` in this (worker)
    process, unless the environment asks for other settings."""
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
