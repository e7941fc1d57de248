"""The shape of the code, kept from drifting: short modules, classes and functions (the kernels'
too), few positional parameters in the core's constructors, an opening docstring in every
module, and no private name of one module used by another."""

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "hydrax"
#: The longest a function of the package may be, in lines (docstring included).
MAX_FUNCTION_LINES = 80
#: The longest a compiled kernel's function may be (``.pxi``): it declares each local with its C
#: type on a line of its own, which a Python function does not.
MAX_KERNEL_FUNCTION_LINES = 100
#: The longest a module may be, in lines, and a class; the Python twins of the kernels
#: (``_fallback.py``) are as long as the kernels they mirror.
MAX_MODULE_LINES = 600
MAX_CLASS_LINES = 400
LONG_MODULES = {"_fallback.py"}
#: The loader core (these subpackages and modules): its constructors take at most this many
#: positional parameters (besides self).
CORE = ("order", "procs", "run", "cache", "layout")
MAX_POSITIONAL = 8
#: Private modules of the package, which others may import by name (not their private names).
PRIVATE_MODULES = {"_core", "_fallback", "_common"}
#: Names with a leading underscore that are public by convention: namedtuple's methods.
NAMEDTUPLE_METHODS = {"_replace", "_asdict", "_fields", "_make", "_field_defaults"}


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



def test_every_module_opens_by_saying_what_it_owns():
    assert [str(path.relative_to(PACKAGE.parent)) for path, tree in modules() if not ast.get_docstring(tree)] == []


def test_no_module_or_class_is_longer_than_the_limit():
    long = [f"{path.relative_to(PACKAGE.parent)} ({len(path.read_text().splitlines())} lines)" for path, _ in modules()
            if path.name not in LONG_MODULES and len(path.read_text().splitlines()) > MAX_MODULE_LINES]
    long += [f"{path.relative_to(PACKAGE.parent)}:{node.lineno} class {node.name} ({node.end_lineno - node.lineno + 1} lines)"
             for path, tree in modules() for node in ast.walk(tree)
             if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > MAX_CLASS_LINES]
    assert long == []


#: A kernel function's first line: ``def``, ``cdef`` or ``cpdef``, a return type, a name and "(".
KERNEL_FUNCTION = re.compile(r"^(\s*)(?:cdef|cpdef|def)\s+(?!extern\b|class\b|struct\b)[\w\[\], .*]*?(\w+)\s*\(")


def kernel_functions(text: str):
    """(name, first line, length in lines) of each function in Cython source, by indentation."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        match = KERNEL_FUNCTION.match(line)
        if not match or "=" in line.split("(", 1)[0]:
            continue  # not a function, or a typed local with a call as its value
        indent, end = len(match.group(1)), i + 1
        while end < len(lines) and (not lines[end].strip() or len(lines[end]) - len(lines[end].lstrip()) > indent
                                    or lines[end].startswith(" " * indent + ")")):
            end += 1
        while not lines[end - 1].strip():
            end -= 1
        yield match.group(2), i + 1, end - i


def test_kernel_functions_are_short():
    sample = "cdef inline int f(int a,\n        int b) nogil:\n    cdef int c = g(a)\n\n    return c\n\ncdef int h():\n    pass\n"
    assert list(kernel_functions(sample)) == [("f", 1, 5), ("h", 7, 2)]
    long = [f"{path.name}:{line} {name} ({length} lines)" for path in sorted(PACKAGE.glob("*.p[yx]*"))
            for name, line, length in kernel_functions(path.read_text()) if length > MAX_KERNEL_FUNCTION_LINES]
    assert long == []


def private_names(tree: ast.AST) -> set[str]:
    """The names with one leading underscore that a module defines: functions, classes, module
    and instance attributes, ``__slots__`` entries."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__slots__" for t in node.targets):
            names.update(c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant) and isinstance(c.value, str))
    return {name for name in names if name.startswith("_") and not name.startswith("__")}


def test_no_private_attribute_of_another_module_is_used():
    """``thing._name`` outside ``self``/``cls``, where ``_name`` is one of the package's private
    names and not one the module itself defines: another module's insides."""
    trees = dict(modules())
    defined = {path: private_names(tree) for path, tree in trees.items()}
    ours = set().union(*defined.values()) - NAMEDTUPLE_METHODS
    found = []
    for path, tree in trees.items():
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute) or node.attr not in ours or node.attr in defined[path]:
                continue
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                continue
            found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {ast.unparse(node)}")
    assert found == []
