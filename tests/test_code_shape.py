"""The shape of the code, kept from drifting: short functions, few positional parameters in the
core's constructors, and no private name imported from another module."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "hydrax"
#: The longest a function of the package may be, in lines (docstring included).
MAX_FUNCTION_LINES = 80
#: The loader core (a module, or a package and all its modules): its constructors take at most this
#: many positional parameters (besides self).
CORE = ("loader", "arguments", "run", "engine", "pipeline", "announce", "assembly", "failures", "diagnosis", "inflight",
        "workers", "processes", "arena", "placement", "hosts", "cache", "group", "layout", "batch", "schedule", "messages")
MAX_POSITIONAL = 8
#: Private modules of the package, which others may import by name (not their private names).
PRIVATE_MODULES = {"_core", "_fallback", "_forkserver", "_common"}


def modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path, ast.parse(path.read_text(), filename=str(path))


def test_no_function_is_longer_than_the_limit():
    long = [f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for path, tree in modules() for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert long == []


def test_core_constructors_take_few_positional_parameters():
    wide = []
    for path, tree in modules():
        top = path.relative_to(PACKAGE).parts[0].removesuffix(".py")
        if top not in CORE:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name == "__init__":
                positional = len(node.args.posonlyargs) + len(node.args.args) - 1
                if positional > MAX_POSITIONAL:
                    wide.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} ({positional} positional)")
    assert wide == []


def test_no_private_name_is_imported_from_another_module():
    found = []
    for path, tree in modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    private = alias.name.startswith("_") and alias.name not in PRIVATE_MODULES and not alias.name.startswith("__")
                    if private and (node.module or "").split(".")[0] not in ("__future__",):
                        found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} from {node.module} import {alias.name}")
    assert found == []

