"""The loader of ``forkserver_path_script.py``, in a module of its own that workers import by name."""

import os

import hydrax

#: The process that ran this module's top level: a worker forked from a fork server that
#: preloaded this module inherits the server's pid here.
IMPORTED_IN = os.getpid()


def load(item, arrays, seed):
    arrays["x"][...] = item * 2
    if item == 0:
        import hydrax.shards.shardset as shardset  # the module the workers could not find

        return {"seen": {"hydrax": hydrax.__file__, "shardset": shardset.__file__, "preloaded": IMPORTED_IN != os.getpid(),
                         "environ": [os.environ.get("PYTHONPATH"), os.environ.get("PYTHONSAFEPATH")]}}
    return None
