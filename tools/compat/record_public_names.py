"""Record the public names of hydrax's public modules, as tests/fixtures/public_names.json.

Run with the tree to record on the path (``PYTHONPATH=<checkout> python tools/compat/record_public_names.py
<commit> > tests/fixtures/public_names.json``). ``tests/test_public_names.py`` then checks that
every name is still importable from the same module: moving code between modules must not move
a public import path. A module's names are its ``__all__``, or else the names its own top level defines.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import sys

MODULES = ["hydrax", "hydrax.tqdm", "hydrax.pandas", "hydrax.image", "hydrax.shards", "hydrax.serve", "hydrax.checkpoint",
           "hydrax.ray", "hydrax.cache", "hydrax.tenbin", "hydrax.shards.build"]


def public_names(name: str) -> list[str]:
    module = importlib.import_module(name)
    names = getattr(module, "__all__", None)
    if names is None:  # what its own top level defines (not what it imports)
        names = set()
        for node in ast.parse(inspect.getsource(module)).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names.update(t.id for t in targets if isinstance(t, ast.Name))
        names = [n for n in names if not n.startswith("_") and n not in ("log", "logger")]  # its logger is not API
    return sorted(names)


if __name__ == "__main__":
    recorded = {"recorded": f"the public names of each module at {sys.argv[1] if len(sys.argv) > 1 else 'this tree'}, by "
                            "tools/compat/record_public_names.py",
                "modules": {name: public_names(name) for name in MODULES}}
    json.dump(recorded, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
