"""Pickling what fork-server workers run, and naming the part that cannot be pickled.

A worker started from the fork server receives the loader, the start-up hook and the groups'
data pickled with cloudpickle, which ships functions and classes of ``__main__`` (lambdas,
closures, classes defined under the main guard) by value and those of importable modules by name.
When that fails, :func:`unpicklable_part` walks into the value to name the innermost part at
fault (a closure variable, a global, an attribute), so the error can say what to change.
"""

from __future__ import annotations

import functools
import io
import marshal
import pickle
import types
from collections import ChainMap
from typing import Any

_Pickler: Any = None


def dumps(value: Any) -> bytes:
    """``value`` pickled with cloudpickle, keeping the file names of the code it ships by value.

    cloudpickle renames such code ``<dynamic-code>``, which leaves a worker's tracebacks without
    the script's file and lines; a fork server's worker runs the same interpreter, so the code
    objects travel as ``marshal`` data instead, file names included.
    """
    global _Pickler
    if _Pickler is None:
        import cloudpickle

        class Pickler(cloudpickle.Pickler):
            dispatch_table = ChainMap({types.CodeType: _reduce_code}, cloudpickle.Pickler.dispatch_table)

        _Pickler = Pickler
    buffer = io.BytesIO()
    _Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(value)
    return buffer.getvalue()


def _reduce_code(code: types.CodeType):
    return marshal.loads, (marshal.dumps(code),)


def _parts(value: Any, path: str):
    """The named parts of ``value`` that pickling it pickles too, for :func:`unpicklable_part`."""
    if isinstance(value, types.MethodType):
        yield f"{path}.__self__", value.__self__
        yield f"{path}.__func__", value.__func__
    elif isinstance(value, types.FunctionType):
        for name, cell in zip(value.__code__.co_freevars, value.__closure__ or ()):
            try:
                yield f"{path}'s closure variable {name!r}", cell.cell_contents
            except ValueError:  # an empty cell
                pass
        names, codes = set(), [value.__code__]
        while codes:
            code = codes.pop()
            names.update(code.co_names)
            codes.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
        for name in sorted(names):
            if name in value.__globals__ and not isinstance(value.__globals__[name], types.ModuleType):
                yield f"{path}'s global {name!r}", value.__globals__[name]
    elif isinstance(value, functools.partial):
        yield f"{path}.func", value.func
        for i, arg in enumerate(value.args):
            yield f"{path}.args[{i}]", arg
        for name, arg in value.keywords.items():
            yield f"{path}.keywords[{name!r}]", arg
    elif isinstance(value, dict):
        for key, item in list(value.items())[:256]:
            yield f"{path}[{key!r}]", item
    elif isinstance(value, (list, tuple, set, frozenset)):
        for i, item in enumerate(list(value)[:256]):
            yield f"{path}[{i}]", item
    elif isinstance(getattr(value, "__dict__", None), dict) and not isinstance(value, (type, types.ModuleType)):
        for name, item in list(vars(value).items())[:256]:
            yield f"{path}.{name}", item


def unpicklable_part(value: Any, path: str, error: BaseException, dumps, depth: int = 0) -> tuple[str, BaseException]:
    """The innermost part of ``value`` (which failed to pickle with ``error``) that fails too, and its error."""
    if depth < 4:
        for part, item in _parts(value, path):
            try:
                dumps(item)
            except Exception as exc:
                return unpicklable_part(item, part, exc, dumps, depth + 1)
    return path, error
