"""Preloaded by the multiprocessing fork server that starts hydrax workers.

It imports the user's main module once, in the server, so that every worker forked from it
already has it (and whatever it imports, such as JAX) instead of importing it again. Python's own
``set_forkserver_preload(["__main__"])`` does not do this on 3.10-3.12: the server is never told
the main module's path. It also imports the modules that hold the loader functions.
"""

import importlib
import os
import sys
from multiprocessing import process, spawn

MAIN_ENV = "HYDRAX_FORKSERVER_MAIN"
MODULES_ENV = "HYDRAX_FORKSERVER_MODULES"
PATH_ENV = "HYDRAX_FORKSERVER_SYS_PATH"


def _preload() -> None:
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
    except BaseException:  # a worker then imports it itself, and reports any error properly
        pass
    finally:
        del current._inheriting
    for name in ["hydrax.workers", *modules]:
        try:
            importlib.import_module(name)
        except BaseException:
            pass


_preload()
