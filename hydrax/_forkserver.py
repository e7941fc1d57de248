"""Preloaded by the multiprocessing fork server that starts hydrax workers.

It imports the user's main module once, in the server, so that every worker forked from it
already has it (and whatever it imports, such as JAX) instead of importing it again. Python's own
``set_forkserver_preload(["__main__"])`` does not do this on 3.10-3.12: the server is never told
the main module's path. It also imports the modules that hold the loader functions.
"""

import importlib
import os
import sys
import types
from multiprocessing import process, spawn

MAIN_ENV = "HYDRAX_FORKSERVER_MAIN"
MODULES_ENV = "HYDRAX_FORKSERVER_MODULES"
PATH_ENV = "HYDRAX_FORKSERVER_SYS_PATH"
#: True in the fork server (and the workers it forks): never start another server from there.
SERVING = False


def _preload() -> None:
    global SERVING
    if MAIN_ENV not in os.environ:
        return  # imported by the parent for the names above, not by the fork server
    SERVING = True
    kind, _, target = os.environ.pop(MAIN_ENV, "").partition(":")
    modules = [m for m in os.environ.pop(MODULES_ENV, "").split(",") if m]
    path = os.environ.pop(PATH_ENV, "")
    if path:  # the server is not given the parent's sys.path on 3.10-3.12 either
        sys.path[:] = path.split(os.pathsep)
    current = process.current_process()
    current._inheriting = True  # the main module's `if __name__ == "__main__"` block must not run
    try:
        if kind == "path":
            spawn.import_main_path(target)
        elif kind == "name":
            spawn._fixup_main_from_name(target)
    except BaseException as exc:
        print(f"[hydrax] the loader fork server could not import the main module {target!r}: {exc!r}", file=sys.stderr)
        if kind == "path":
            # Leave an empty stand-in, so workers fail fast with a clear error instead of
            # importing it again after the fork (which hangs if its top level initialised CUDA).
            stand_in = types.ModuleType("__mp_main__")
            stand_in.__file__ = target
            sys.modules["__main__"] = sys.modules["__mp_main__"] = stand_in
    finally:
        del current._inheriting
    bridge = sys.modules.get("jax._src.xla_bridge")
    if bridge is not None and getattr(bridge, "_backends", None):
        print(
            f"[hydrax] warning: importing {target!r} initialises a JAX backend, so loader workers are forked "
            "from a process with live XLA threads; move JAX computations under `if __name__ == \"__main__\":`",
            file=sys.stderr,
        )
    for name in ["hydrax.workers", *modules]:
        try:
            importlib.import_module(name)
        except BaseException:
            pass


_preload()
