"""The import graph of the package, kept free of loops.

Every import counts, wherever it sits (a function's lazy import and a ``TYPE_CHECKING`` one as
much as a module's first lines): a loop is two modules that each need the other, however the
import is written.
"""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "hydrax"
#: Compiled modules, which import nothing of the package.
EXTENSIONS = {"hydrax._core"}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """module -> the package's modules it imports (a package imported by name counts as its ``__init__``)."""
    paths = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    known = set(paths) | EXTENSIONS

    def owner(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    graph = {name: set() for name in known}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([node.module] if node.module else []))
                # ``from pkg import mod`` imports the module; ``from mod import name``, the module
                targets = [f"{base}.{alias.name}" if owner(f"{base}.{alias.name}") == f"{base}.{alias.name}" else base
                           for alias in node.names]
            else:
                continue
            for target in targets:
                found = owner(target) if target.startswith("hydrax") else None
                if found is not None and found != name:
                    graph[name].add(found)
    return graph


def loops(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm, iteratively)."""
    order, low, on_stack, stack, found = {}, {}, set(), [], []
    for root in sorted(graph):
        if root in order:
            continue
        work = [(root, iter(sorted(graph[root])))]
        order[root] = low[root] = len(order)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in order:
                    order[child] = low[child] = len(order)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], order[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == order[node]:
                group = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.add(member)
                    if member == node:
                        break
                if len(group) > 1:
                    found.append(group)
    return found


def test_the_finder_sees_a_loop_written_any_way():
    assert loops({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]
    assert loops({"a": {"b"}, "b": set()}) == []
    graph = import_graph()
    assert "hydrax.shards.store" in graph["hydrax.shards.router"]  # a relative import
    assert "hydrax.shards.router" in graph["hydrax.shards.fetchproc"]  # one inside a function
    assert "hydrax._core" in graph["hydrax.schedule"]  # ``from . import _core``


def test_the_package_has_no_import_loop():
    assert [sorted(group) for group in loops(import_graph())] == []
