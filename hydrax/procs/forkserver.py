"""Preloaded by the multiprocessing fork server that starts hydrax workers.

The server never runs the user's main module. hydrax sends its workers everything they run
pickled with cloudpickle, which ships functions and classes of the main module by value, so a
worker needs nothing of that module; running its top level again would read a command line the
server does not have, and repeat whatever it does (``jax.distributed.initialize``, a log file,
a download).

What the server does instead:

- it starts with the parent's ``sys.path`` as its ``PYTHONPATH`` and without the working
  directory on its path, so that hydrax itself, imported before any of this runs, is the
  parent's copy and not a folder named ``hydrax`` in the working directory;
- it takes the parent's ``sys.argv``, working directory and ``sys.path``, as multiprocessing's
  spawn preparation gives a child, so that whatever it imports sees what the parent saw, and
  puts back the parent's ``PYTHONPATH`` and ``PYTHONSAFEPATH`` in its environment;
- it imports hydrax's worker code, cloudpickle, the modules the parent's main module had
  imported (JAX, numpy, the project's own modules) and the modules of the loader functions, so
  that workers forked from it start in milliseconds;
- it puts a stand-in in ``sys.modules["__main__"]`` that bears the main module's file (or module
  name). multiprocessing's preparation of a child then sees the main module as already there
  and imports nothing. Only a process that looks up a name in it (a process of the user's own,
  started from this shared server with a function of the main module pickled by reference)
  imports the real main module, once, at that moment and exactly as spawn would: its command
  line, directory and path are the parent's by then.

The server's environment is the parent's as the server started (usually when JAX did). A loader
started from it does not keep that: the main process sends its environment as the Dataloader
starts with each start request, and the loader adopts it before anything else runs
(:func:`hydrax.procs.processes.adopt_environment`), as a forked loader would have it. What the modules
preloaded here read from the environment as they were imported (JAX's flags, the BLAS thread
counts numpy's libraries took, huggingface_hub's ``HF_HOME``) stays as the server read it.
"""

from __future__ import annotations

import atexit
import importlib
import importlib.machinery
import json
import logging
import os
import sys
import types
from multiprocessing import process, spawn

from ..errors import MainImportError

#: The environment variable that carries the parent's settings to the server, as JSON.
CONFIG_ENV = "HYDRAX_FORKSERVER_CONFIG"
#: True in the fork server (and the workers it forks): never start another server from there.
SERVING = False
#: Marks the error raised when importing the main module fails in a helper process; the
#: pipeline looks for it before advising the main guard.
MAIN_IMPORT_FAILED = "hydrax: importing the main module in a helper process failed"


def _install_stand_in(kind: str, target: str) -> None:
    stand_in = types.ModuleType("__mp_main__")
    if kind == "path":
        stand_in.__file__ = target
    else:  # python -m target: multiprocessing compares the spec's name
        stand_in.__spec__ = importlib.machinery.ModuleSpec(target, None)
    state = {"loaded": False}

    def __getattr__(name: str):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)  # probes such as __path__ or __loader__ need no import
        if not state["loaded"]:
            state["loaded"] = True
            _import_real_main(stand_in, kind, target)
        try:
            return stand_in.__dict__[name]
        except KeyError:
            raise AttributeError(f"module '__main__' ({target}) has no attribute {name!r}") from None

    stand_in.__getattr__ = __getattr__
    sys.modules["__main__"] = sys.modules["__mp_main__"] = stand_in


def _import_real_main(stand_in: types.ModuleType, kind: str, target: str) -> None:
    """Run the main module as multiprocessing's spawn preparation does, and fill ``stand_in`` with it."""
    sys.modules["__main__"] = sys.modules["__mp_main__"] = types.ModuleType("__mp_main__")
    current = process.current_process()
    inheriting = getattr(current, "_inheriting", False)
    current._inheriting = True  # the main module's `if __name__ == "__main__"` block must not run
    try:
        if kind == "path":
            spawn.import_main_path(target)
        else:
            spawn._fixup_main_from_name(target)
        real = sys.modules["__main__"]
        stand_in.__dict__.update((k, v) for k, v in vars(real).items() if k != "__getattr__")
    except BaseException as exc:
        raise MainImportError(f"{MAIN_IMPORT_FAILED}: {target} raised {type(exc).__name__}: {exc}") from exc
    finally:
        if not inheriting:
            del current._inheriting
        sys.modules["__main__"] = sys.modules["__mp_main__"] = stand_in


def _register_exit_hook(name: str) -> None:
    module, _, function = name.partition(":")
    try:
        target = importlib.import_module(module)
        for part in function.split("."):
            target = getattr(target, part)
    except Exception as exc:  # the clean-up is a courtesy: the server still serves without it
        logging.getLogger(__name__).warning("[hydrax] warning: the fork server cannot run %s at exit: %r", name, exc)
        return
    atexit.register(target)


def _preload() -> None:
    global SERVING
    raw = os.environ.pop(CONFIG_ENV, None)
    if raw is None:
        return  # imported by the parent for the names above, not by the fork server
    SERVING = True
    if raw.startswith("@"):  # too long for the environment: in a file, which is ours to remove
        path = raw[1:]
        try:
            with open(path) as f:
                raw = f.read()
        finally:
            try:
                os.unlink(path)
            except OSError:
                pass
    config = json.loads(raw)
    # The server exits when the main process does, killed or not: the layers above registered
    # what to clean up then (see hydrax.procs.processes.at_server_exit), such as a killed main
    # process's read-ahead folder in /dev/shm. Imported now: at exit, imports that start threads fail.
    for hook in config.get("at_exit", ()):
        _register_exit_hook(hook)
    # The parent set these only to start this server with its module path (see
    # hydrax.procs.processes.warm_forkserver): workers and what they run see its own values.
    for name, value in config.get("environ", {}).items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    # The parent's view of the world, as spawn's preparation gives a child.
    sys.argv[:] = config["argv"]
    sys.path[:] = config["path"]
    try:
        os.chdir(config["cwd"])
    except OSError:
        pass
    if config["main"]:
        kind, target = config["main"]
        _install_stand_in(kind, target)
    # numpy.ma: numpy 2.4 imports it at the first np.unique (15 ms), which the read-ahead's first
    # plan and the workers' orders make; once here rather than in each process on the first batch's way.
    for name in ["hydrax.procs.workers", "cloudpickle", "numpy.ma", *config["modules"]]:
        try:
            importlib.import_module(name)
        except BaseException:  # a worker that needs it reports the error itself
            pass
    bridge = sys.modules.get("jax._src.xla_bridge")
    if bridge is not None and getattr(bridge, "_backends", None):
        # The server is a new interpreter with no logging set up: Python's last resort shows
        # this on stderr. Its workers are forked with os.fork, after which logging renews its
        # locks (os.register_at_fork), so a worker never inherits one held by a server thread.
        logging.getLogger(__name__).warning(
            "[hydrax] warning: importing the modules of the main script initialised a JAX backend in the loader "
            "fork server, so loader workers are forked from a process with live XLA threads"
        )


_preload()
