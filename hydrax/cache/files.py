"""A cache's batch files: their names, reading one through a read-only mapping, and writing one
whole; and one group's cache as a run uses it (:class:`GroupCache`).

A batch file, ``e{epoch}-b{index}.dat``, holds the arrays' bytes at their offsets (``cache_size``
bytes), followed by a pickle of the batch's ``additional`` dict, as hydrax 0.2.2 wrote it. A file
is written under a temporary name, ``fsync``-ed and renamed, so it appears under its name only
when complete: a run killed mid-write leaves no half file (a later run removes what it left,
:func:`remove_stale_temporaries`). Unpickling the extras runs code named in them, so hydrax reads
at most :data:`MAX_EXTRAS_BYTES` of them.
"""

from __future__ import annotations

import errno
import logging
import os
import pickle
import re
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Callable, Iterable, Mapping

from .. import _core
from ..errors import CacheFileError
from ..procs.liveness import process_alive

# The name the cache's messages have always had, whichever of its modules logs them.
log = logging.getLogger("hydrax.cache")

#: The pickle protocol of the extras: Python 3.8 to 3.13's default, which hydrax 0.2.2 wrote.
PICKLE_PROTOCOL = 4
#: The most bytes of extras (the pickle after the arrays) hydrax reads from one batch file.
MAX_EXTRAS_BYTES = 256 << 20
#: Shuffle modes whose batches change every epoch, so that each epoch has its own files.
PER_EPOCH_MODES = ("reseed", "itemwise", "shardwise")

_TEMPORARY = re.compile(r"^(?:e\d+-b\d+\.dat|cache\.json)\.(\d+)\.tmp$")


def file_epoch(shuffle_later: str, epoch: int, training: bool = True) -> int:
    """The epoch number in a batch file's name: the real epoch where a group's batches change
    every epoch (``reseed``, ``itemwise``, and hydrax's ``shardwise``), else 0 (``repeat``,
    ``batchwise``, and every validation batch)."""
    return int(epoch) if training and shuffle_later in PER_EPOCH_MODES else 0


def batch_file_name(epoch: int, index: int) -> str:
    """``e{epoch}-b{index}.dat``: the file of batch ``index`` of the group (its identity, before any
    batchwise reordering) in ``epoch`` (see :func:`file_epoch`)."""
    return f"e{epoch}-b{index}.dat"


def temporary_name(path: str) -> str:
    """Where a batch file is written before it is renamed to ``path``: the name says which process
    writes it, so a later run can remove what a killed one left (see :func:`remove_stale_temporaries`)."""
    return f"{path}.{os.getpid()}.tmp"


def remove_stale_temporaries(location: str | os.PathLike) -> list[str]:
    """Remove the temporary batch files (and descriptors) that processes which no longer run left
    in ``location`` (a run killed while writing); returns their paths. Those of live processes stay."""
    removed = []
    try:
        names = os.listdir(location)
    except FileNotFoundError:
        return removed
    for name in names:
        match = _TEMPORARY.match(name)
        if match is None or process_alive(int(match.group(1))):
            continue
        path = os.path.join(location, name)
        try:
            os.unlink(path)
            removed.append(path)
        except FileNotFoundError:
            pass
    return removed


@dataclass
class CachedBatch:
    """A batch read from its file: ``mapping`` is the read-only mapping of the whole file (its
    first ``size`` bytes are the arrays), ``additional`` the unpickled extras."""

    path: str
    mapping: _core.ArenaMap
    size: int
    additional: dict[str, list[Any]]

    def lease(self, slot: int, on_free: Callable[[int], object]) -> _core.SlotLease:
        """A tracking exporter over the arrays' bytes: ``on_free(slot)`` runs once it is sealed and
        the last numpy view or ``jax.Array`` made from it is gone (the mapping goes with it)."""
        return _core.SlotLease(self.mapping, slot, 0, self.size, on_free)


def open_batch_file(path: str, size: int, batch_size: int) -> CachedBatch | None:
    """Map the batch file ``path`` read-only and unpickle its extras; None when it does not exist.

    ``size`` is the bytes of arrays a batch has (``cache_size``), ``batch_size`` the items the
    extras' lists hold. Raises :class:`CacheFileError` for a file that is shorter than that, whose
    extras do not unpickle, are longer than :data:`~hydrax.cache.files.MAX_EXTRAS_BYTES`, or are
    not a dict of per-item lists.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        length = os.fstat(fd).st_size
        if length <= size:
            raise CacheFileError(
                f"the file holds {length} bytes, but a batch's arrays alone take {size}, followed by its extras: "
                "it was cut short, or belongs to another cache", url=path, offset=length)
        if length - size > MAX_EXTRAS_BYTES:
            raise CacheFileError(
                f"{length - size} bytes of extras follow the arrays, more than hydrax reads "
                f"(MAX_EXTRAS_BYTES = {MAX_EXTRAS_BYTES}): not a batch file of this cache", url=path, offset=size)
        # Not MAP_POPULATE: measured on 64 MB files in the page cache, mapping every page up front
        # cost more than the faults of a consumer that reads every page (the kernel maps a
        # whole folio, or 16 pages, per fault), and a consumer that reads less pays for less.
        mapping = _core.ArenaMap(fd, length, False)
    finally:
        os.close(fd)
    view = memoryview(mapping)
    try:
        additional = pickle.loads(view[size:])
    except Exception as exc:
        raise CacheFileError(f"the extras after the arrays cannot be unpickled ({type(exc).__name__}: {exc}): "
                             "the file was cut short, or belongs to another cache", url=path, offset=size) from None
    finally:
        view.release()
    _check_extras(additional, batch_size, path, size)
    return CachedBatch(path, mapping, size, additional)


def _check_extras(additional: Any, batch_size: int, path: str, offset: int) -> None:
    if not isinstance(additional, dict):
        raise CacheFileError(f"the extras are a {type(additional).__name__}, not a dict of per-item lists",
                             url=path, offset=offset)
    for key, values in additional.items():
        if not isinstance(values, list) or len(values) != batch_size:
            what = f"a list of {len(values)}" if isinstance(values, list) else f"a {type(values).__name__}"
            raise CacheFileError(f"the extras' key {key!r} holds {what}, not a list of {batch_size} per-item values",
                                 url=path, offset=offset)


def write_batch_file(path: str, size: int, arrays: Iterable[tuple[int, Any]], additional: Mapping[str, list]) -> None:
    """Write a batch file: each ``(offset, bytes-like)`` of ``arrays`` at its offset, zeros up to
    ``size``, then the pickled extras; then ``fsync`` and rename it to ``path``.

    Until the rename the file has a temporary name (:func:`temporary_name`), so ``path`` never
    holds a partial batch, however the writing process ends.
    """
    temporary = temporary_name(path)
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o666)
    try:
        try:
            for offset, data in arrays:
                _write_at(fd, memoryview(data).cast("B"), offset)
            os.ftruncate(fd, size)
            _write_at(fd, memoryview(pickle.dumps(dict(additional), protocol=PICKLE_PROTOCOL)), size)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(temporary, path)
    except BaseException:
        try:
            os.unlink(temporary)
        except FileNotFoundError:
            pass
        raise


def _write_at(fd: int, data: memoryview, offset: int) -> None:
    while len(data):
        written = os.pwrite(fd, data, offset)
        if written <= 0:
            raise OSError(errno.EIO, "short write")
        data, offset = data[written:], offset + written


@dataclass
class GroupCache:
    """One group's cache as a run uses it: where this process's batch files are and how they look.

    ``location`` is the directory of the batch files (the cache directory, or with several
    processes this process's share directory, see :func:`share_directory`); ``layouts`` and
    ``size`` are the cache layouts of the rows this process loads, ``rows`` their number.
    ``direct``: the loaders' arrays are the cache's (no ``cache_arrays``), so loaded batches are
    written as they are; ``loaderless``: the group has no ``loader_arrays``, so a batch without a
    file is dropped.
    """

    location: str
    layouts: MappingProxyType
    size: int
    rows: int
    shuffle_later: str
    readonly: bool
    direct: bool
    loaderless: bool

    def path(self, epoch: int, index: int, training: bool = True) -> str:
        """The file of batch ``index`` in ``epoch``."""
        return os.path.join(self.location, batch_file_name(file_epoch(self.shuffle_later, epoch, training), index))

    def open(self, path: str) -> CachedBatch | None:
        """The batch at ``path``, or None: missing, or unusable (logged, naming the file and why)."""
        try:
            return open_batch_file(path, self.size, self.rows)
        except (CacheFileError, OSError) as exc:
            log.warning("[hydrax] ignoring cache file %s, loading the batch %s: %s", path,
                        "is dropped (the group has no loader_arrays)" if self.loaderless else "through the loaders", exc)
            return None

    def write(self, path: str, arrays: Iterable[tuple[int, Any]], additional: Mapping[str, list]) -> None:
        """Write the batch file ``path`` (see :func:`write_batch_file`)."""
        write_batch_file(path, self.size, arrays, additional)


def share_directory(location: str | os.PathLike, process_index: int, process_count: int) -> str:
    """Where process ``process_index`` of ``process_count`` keeps its share of a cache's batches:
    ``<location>/share-<index>-of-<count>``, a cache directory of its own."""
    return os.path.join(location, f"share-{process_index}-of-{process_count}")
