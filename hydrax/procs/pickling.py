"""Pickling what fork-server workers run, and naming the part that cannot be pickled.

A worker started from the fork server receives the loader, the start-up hook and the groups'
data pickled with cloudpickle, which ships functions and classes of ``__main__`` (lambdas,
closures, classes defined under the main guard) by value and those of importable modules by name.
When that fails, :func:`unpicklable_part` walks into the value to name the innermost part at
fault (a closure variable, a global, an attribute), so the error can say what to change.

Large buffers (numpy arrays of a megabyte or more, wherever they are in the value: a group's
data, an array a loader closes over) do not go into the pickle: :func:`dumps` with a
``shared`` list hands them out of band (pickle protocol 5), :class:`SharedBuffers` copies them
once into a memfd, and every worker maps it (:func:`loads_shared`): one copy per host, shared,
instead of one per worker. Those arrays are read-only in the workers.
"""

from __future__ import annotations

import functools
import io
import marshal
import os
import pickle
import types
from collections import ChainMap
from typing import Any

from .. import _core
from .arena import FdHandle

_Pickler: Any = None
#: Buffers at least this large travel out of band, shared (see :class:`SharedBuffers`).
SHARED_BUFFER_BYTES = 1 << 20
_ALIGN = 64


def dumps(value: Any, shared: list | None = None) -> bytes:
    """``value`` pickled with cloudpickle, keeping the file names of the code it ships by value.

    cloudpickle renames such code ``<dynamic-code>``, which leaves a worker's tracebacks without
    the script's file and lines; a fork server's worker runs the same interpreter, so the code
    objects travel as ``marshal`` data instead, file names included.

    With a list as ``shared``, buffers of :data:`SHARED_BUFFER_BYTES` or more are appended to it
    instead of being pickled (:func:`loads_shared` puts them back).
    """
    global _Pickler
    if _Pickler is None:
        import cloudpickle

        class Pickler(cloudpickle.Pickler):
            dispatch_table = ChainMap({types.CodeType: _reduce_code}, cloudpickle.Pickler.dispatch_table)

        _Pickler = Pickler
    buffer = io.BytesIO()
    callback = None
    if shared is not None:
        def callback(view: pickle.PickleBuffer) -> bool:
            raw = view.raw()
            if raw.nbytes < SHARED_BUFFER_BYTES:
                return True  # in band
            shared.append(raw)
            return False
    _Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL, buffer_callback=callback).dump(value)
    return buffer.getvalue()


class SharedBuffers:
    """The out-of-band buffers of a pickle, copied once into a memfd that workers map read-only.

    :attr:`places` (``(offset, bytes)`` of each buffer) and :attr:`size` travel to the workers
    with the pickle; :meth:`handle` gives them the memfd.
    """

    def __init__(self, buffers: list[memoryview]) -> None:
        self.places: list[tuple[int, int]] = []
        size = 0
        for raw in buffers:
            self.places.append((size, raw.nbytes))
            size += -(-raw.nbytes // _ALIGN) * _ALIGN
        self.size = max(size, _ALIGN)
        self._fd: int | None = os.memfd_create("hydrax-shared", os.MFD_CLOEXEC)
        try:
            os.ftruncate(self._fd, self.size)
            mapping = memoryview(_core.ArenaMap(self._fd, self.size))
            for raw, (offset, nbytes) in zip(buffers, self.places):
                mapping[offset : offset + nbytes] = raw
        except BaseException:
            self.close_fd()
            raise

    def handle(self) -> FdHandle:
        """The memfd, in a form that reaches worker processes."""
        return FdHandle(self._fd)

    def close_fd(self) -> None:
        """Close the memfd once every worker has mapped it."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def loads_shared(payload: bytes, fd: int, size: int, places: list[tuple[int, int]]) -> Any:
    """Unpickle what :func:`dumps` made with ``shared``, its buffers read (not copied) from the
    memfd ``fd`` of :class:`SharedBuffers` (closed afterwards)."""
    try:
        mapping = memoryview(_core.ArenaMap(fd, size, False))
    finally:
        os.close(fd)
    return pickle.loads(payload, buffers=[mapping[offset : offset + nbytes] for offset, nbytes in places])


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
