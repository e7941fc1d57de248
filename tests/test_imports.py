"""The import graph of the package: no loop, and no import that goes up a floor.

Every import counts, wherever it sits (a function's lazy import and a ``TYPE_CHECKING`` one as
much as a module's first lines): a loop is two modules that each need the other, however the
import is written. The floors are those docs/design.rst lists between its ``floors-begin`` and
``floors-end`` markers, read from there, so the page and the rule cannot drift apart.
"""

import ast
import re
import shutil
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "hydrax"
DESIGN = PACKAGE.parent / "docs" / "design.rst"
#: Compiled modules, which import nothing of the package.
EXTENSIONS = {"hydrax._core"}


def module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """module -> the package's modules it imports (a package imported by name counts as its ``__init__``)."""
    paths = {module_name(p, package): p for p in package.rglob("*.py")}
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
    assert "hydrax._core" in graph["hydrax.order.shardwise"]  # ``from .. import _core``


def test_the_package_has_no_import_loop():
    assert [sorted(group) for group in loops(import_graph())] == []


def floors(text: str | None = None) -> dict[str, int]:
    """name -> floor, from the numbered list between the markers in docs/design.rst."""
    text = DESIGN.read_text() if text is None else text
    body = text.split(".. floors-begin", 1)[1].split(".. floors-end", 1)[0]
    table = {}
    for number, item in re.findall(r"^(\d+)\. (.*?)(?=^\d+\. |\Z)", body, re.S | re.M):
        for name in re.findall(r"``(hydrax(?:\.\w+)*)``", item):
            assert name not in table, f"{name} is on two floors"
            table[name] = int(number)
    return table


def floor_of(module: str, table: dict[str, int]) -> int | None:
    """The floor of the most specific name that holds ``module``: itself, or a package above it
    (the package ``hydrax`` holds only its own ``__init__``, or every module would have a floor)."""
    name = module
    while name:
        if name in table and (name == module or name != "hydrax"):
            return table[name]
        name = name.rpartition(".")[0]
    return None


def upward_imports(graph: dict[str, set[str]], table: dict[str, int]) -> list[str]:
    found = []
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            here, there = floor_of(module, table), floor_of(target, table)
            if here is not None and there is not None and there > here:
                found.append(f"{module} (floor {here}) imports {target} (floor {there})")
    return found


def test_every_module_is_on_a_floor_and_every_floor_name_exists():
    table, graph = floors(), import_graph()
    assert [m for m in sorted(graph) if floor_of(m, table) is None] == []
    assert [name for name in table if not any(m == name or m.startswith(name + ".") for m in graph)] == []


def test_no_import_goes_up_a_floor():
    assert upward_imports(import_graph(), floors()) == []


def test_the_checks_fail_on_a_planted_upward_import_and_loop(tmp_path):
    # A copy of the package with one import that goes up (an order module importing the pandas
    # helpers, which import nothing back) and one that closes a loop: the checks see each.
    copy = tmp_path / "hydrax"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.c"))
    schedule = copy / "order" / "schedule.py"
    schedule.write_text(schedule.read_text() + "\n\ndef _planted():\n    from .. import pandas  # noqa\n")
    mixing = copy / "order" / "mixing.py"
    mixing.write_text(mixing.read_text() + "\n\nfrom . import schedule  # noqa\n")
    graph = import_graph(copy)
    assert upward_imports(graph, floors()) == ["hydrax.order.schedule (floor 1) imports hydrax.pandas (floor 8)"]
    assert [sorted(group) for group in loops(graph)] == [["hydrax.order.mixing", "hydrax.order.schedule"]]
    # and a module no floor holds, as one added at the top would be
    (copy / "newcomer.py").write_text('"""A module nobody placed."""\n')
    assert floor_of("hydrax.newcomer", floors()) is None and "hydrax.newcomer" in import_graph(copy)
