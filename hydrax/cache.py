"""The on-disk batch cache of hydrax 0.2 (the ``cache_*`` arguments of :class:`hydrax.DataGroup`).

A cache is a directory. ``cache.json`` describes the batches it holds (the ``hydrax-cache-v1``
descriptor: data length, batch size, seed, shuffle modes and where each array lies in a batch),
and every batch is one file, ``e{epoch}-b{index}.dat``: the arrays' bytes at their offsets
(``cache_size`` bytes), followed by a pickle of the batch's ``additional`` dict. The format,
the names and the descriptor text are hydrax 0.2.2's, byte for byte, so either library reads
what the other wrote.

This module holds all of it:

- a group's cache arguments as 0.2.2 resolves them (:class:`CacheSettings`), the descriptor
  text (:func:`descriptor_text`), and a run's open cache (:class:`GroupCache`; the run opens it
  from its group: :func:`hydrax.run.plan.open_group_cache`);
- the files: reading a batch file through a read-only mapping, and writing one so that it appears
  under its name only when complete (a temporary name, ``fsync``, ``rename``: a run killed
  mid-write leaves no half file, and a path being written is never read), on writer threads
  (:class:`CacheWriter`);
- what a run does with each batch (:class:`RunCache`): read it from its file, drop it, or load it
  and (direct mode) write it from its slot, and the form a batch is handed out in
  (:class:`BatchForm`, :class:`CacheTarget` for :meth:`hydrax.Batch.cache`).

It knows nothing of workers or JAX placement.

The extras are a pickle, and unpickling runs code named in it: treat a cache directory as
trusted input, as you would a checkpoint. hydrax reads at most :data:`MAX_EXTRAS_BYTES` of it.
"""
from __future__ import annotations

import enum
import errno
import json
import logging
import os
import pickle
import queue
import re
import threading
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Callable, Iterable, Mapping, NamedTuple

import numpy as np

from . import _core
from .errors import CacheFileError, CacheLocationError, CacheMismatchError, CacheNotFoundError
from .layout import ArrayLayout, ArraySpec, layouts_end
from .procs.liveness import process_alive

log = logging.getLogger(__name__)

#: The descriptor's file name in a cache directory.
DESCRIPTOR = "cache.json"
#: The descriptor's ``_type``.
CACHE_TYPE = "hydrax-cache-v1"
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


def descriptor_text(*, data_len: int, batch_size: int, seed: int, shuffle_first: bool, shuffle_later: str,
                    layouts: Iterable[tuple[int, Any, int]], extra: Mapping[str, Any] | None = None) -> str:
    """The descriptor of a cache: hydrax 0.2.2's JSON text (indent 4), layouts sorted by offset.

    ``layouts`` holds ``(offset, numpy dtype, count)`` per array (names and shapes are not part of
    it). ``extra`` appends fields that 0.2.2 has no notion of (hydrax's ``shardwise`` settings, a
    process's share): a descriptor 0.2.2 could have written never has any.
    """
    fields: dict[str, Any] = {
        "_type": CACHE_TYPE,
        "data_len": int(data_len),
        "batch_size": int(batch_size),
        "seed": int(seed),
        "shuffle_first": bool(shuffle_first),
        "shuffle_later": shuffle_later,
        "array_layouts": [
            {"offset": int(offset), "dtype": str(dtype), "count": int(count)}
            for offset, dtype, count in sorted(layouts, key=lambda layout: layout[0])
        ],
    }
    fields.update(extra or {})
    return json.dumps(fields, indent=4)


@dataclass(frozen=True)
class CacheSettings:
    """A group's ``cache_*`` arguments as hydrax 0.2.2 resolves them (see :class:`hydrax.DataGroup`)."""

    #: The cache directory; None: no cache on disk (with ``cache_arrays``, :meth:`hydrax.Batch.cache`
    #: still turns batches into their cached form, in memory only).
    location: str | None
    #: The cache is read, never written: asked for, or forced by a missing location or loader arrays.
    readonly: bool
    #: "Direct" mode: no ``cache_arrays`` and a writable location, so the loader arrays are
    #: written to the cache as they are loaded.
    direct: bool
    #: The arrays of a cached batch: ``cache_arrays``, or the loader arrays in direct mode.
    arrays: Mapping[str, ArraySpec] | None

    @classmethod
    def resolve(cls, loader_arrays: Mapping[str, ArraySpec] | None, cache_arrays: Mapping[str, ArraySpec] | None,
                cache_location: str | os.PathLike | None, cache_readonly: bool) -> CacheSettings:
        """Apply 0.2.2's rules, with its messages for the combinations it refuses."""
        if loader_arrays is None and cache_arrays is None:
            raise ValueError("either loader_arrays or cache_arrays must be specified")
        readonly = bool(cache_readonly)
        if loader_arrays is None:
            if cache_location is None:
                raise ValueError("cache_location is required if no loader_arrays are specified")
            readonly = True
        direct = False
        if cache_location is None:
            readonly = True
        elif cache_arrays is None:
            cache_arrays = loader_arrays
            direct = not readonly
        location = None if cache_location is None else os.fspath(cache_location)
        return cls(location, readonly, direct, None if cache_arrays is None else dict(cache_arrays))

    @property
    def default_shuffle(self) -> str:
        """What ``shuffle_later="default"`` means: ``"batchwise"`` with a cache location (a cached
        batch keeps its items), else ``"itemwise"``."""
        return "batchwise" if self.location is not None else "itemwise"


def prepare_location(location: str | os.PathLike, text: str, readonly: bool) -> str:
    """Check (and, unless ``readonly``, create) the cache at ``location`` for descriptor ``text``;
    returns the descriptor's path.

    A writable cache's directory is created if needed, and its descriptor written (complete, and
    fsynced, before it takes its name, so that processes preparing the same cache at once agree).
    An existing descriptor must hold exactly ``text``: otherwise :class:`CacheMismatchError`, with
    0.2.2's message. A read-only cache must exist: otherwise :class:`CacheNotFoundError` (a
    ``FileNotFoundError``, as 0.2.2 raised).
    """
    path = os.path.join(location, DESCRIPTOR)
    if not readonly:
        try:
            os.makedirs(os.path.abspath(location), exist_ok=True)
            remove_stale_temporaries(location)
            if _read_text(path) in (None, ""):
                _publish_descriptor(path, text)
        except OSError as exc:
            raise CacheLocationError(f"cannot write the cache at {location}: {exc.strerror or exc}; give a writable "
                                     "cache_location, or cache_readonly=True to only read an existing cache",
                                     path=location, errno=exc.errno) from exc
    found = _read_text(path)
    if found is None:
        raise CacheNotFoundError(
            f'cache descriptor "{path}" does not exist: a read-only cache (cache_readonly=True, or a group without '
            "loader_arrays) is only read, never created; check cache_location, or fill the cache first with a "
            "writable group",
            path=path,
        )
    if found != text:
        raise CacheMismatchError(path, text, found)
    return path


def _read_text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", newline="") as file:
            return file.read()
    except FileNotFoundError:
        return None


def _publish_descriptor(path: str, text: str) -> None:
    temporary = f"{path}.{os.getpid()}.tmp"
    with open(temporary, "w", encoding="utf-8", newline="") as file:
        file.write(text)
        file.flush()
        os.fsync(file.fileno())
    try:
        if _read_text(path) == "":
            os.replace(temporary, path)  # 0.2.2 treats an empty descriptor as none at all
            return
        try:
            os.link(temporary, path)  # fails if another process got there first; its text is checked next
        except FileExistsError:
            pass
    finally:
        try:
            os.unlink(temporary)
        except FileNotFoundError:
            pass


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
    extras do not unpickle, are longer than :data:`MAX_EXTRAS_BYTES`, or are not a dict of
    per-item lists.
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


class CacheWriter:
    """Writes batch files on ``threads`` background threads, and knows which paths are in flight.

    A path is claimed (:meth:`claim`) before its batch is loaded for the cache or handed to a
    writer, and released once the file is complete or abandoned; while it is claimed no one reads
    it or writes it again. At most ``depth`` writes wait at once: :meth:`submit` blocks beyond.
    After :meth:`close`, writes run on the calling thread.
    """

    def __init__(self, threads: int, depth: int) -> None:
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._room = threading.BoundedSemaphore(max(1, depth))
        self._lock = threading.Lock()
        self._inflight: set[str] = set()
        self._closed = False
        #: Files written, and writes that failed (each logged), so far.
        self.written = 0
        self.failed = 0
        self._threads = [threading.Thread(target=self._run, name=f"hydrax-cacher-{i}", daemon=True) for i in range(threads)]
        for thread in self._threads:
            thread.start()

    def claim(self, path: str) -> bool:
        """Mark ``path`` as in flight; False if it already is."""
        with self._lock:
            if path in self._inflight:
                return False
            self._inflight.add(path)
            return True

    def in_flight(self, path: str) -> bool:
        """Whether ``path`` is being loaded for the cache or written."""
        with self._lock:
            return path in self._inflight

    def release(self, path: str) -> None:
        """``path`` is no longer in flight (written, or abandoned)."""
        with self._lock:
            self._inflight.discard(path)

    def submit(self, path: str, write: Callable[[], None]) -> None:
        """Run ``write()`` (which writes the claimed ``path``) on a writer thread, then release ``path``."""
        if self._closed or not self._threads:
            self._write(path, write)
            return
        self._room.acquire()
        self._queue.put((path, write))

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            try:
                self._write(*job)
            finally:
                # A direct-mode job holds views of a batch slot: drop them before waiting again.
                job = None
                self._room.release()

    def _write(self, path: str, write: Callable[[], None]) -> None:
        try:
            write()
            self.written += 1
        except Exception:
            self.failed += 1
            log.warning("[hydrax] could not write cache file %s; the batch will be loaded again when needed:", path, exc_info=True)
        finally:
            self.release(path)

    @property
    def pending(self) -> int:
        """Paths in flight now."""
        with self._lock:
            return len(self._inflight)

    def close(self) -> None:
        """Finish the queued writes and stop the threads."""
        if self._closed:
            return
        self._closed = True
        for _ in self._threads:
            self._queue.put(None)
        for thread in self._threads:
            thread.join()


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


def check_cache_arrays(arrays: Any, layouts: Mapping[str, ArrayLayout]) -> None:
    """What :meth:`hydrax.Batch.cache` requires of ``arrays``, with 0.2.2's messages: a dict with
    every cache array, each a ``jax.Array`` of the layout's exact shape and JAX dtype, and no
    other names."""
    import jax

    if not isinstance(arrays, dict):
        raise TypeError(f"arrays has non-dict type {type(arrays).__name__}")
    for name in layouts:
        if name not in arrays:
            raise ValueError(f"array '{name}' was not provided")
    for name, array in arrays.items():
        if not isinstance(array, jax.Array):
            raise TypeError(f"array '{name}' of type {type(array).__name__} is not a JAX array")
        expected = layouts.get(name)
        if expected is None:
            raise ValueError(f"array '{name}' has unexpected name")
        if tuple(expected.shape) != tuple(array.shape):
            raise ValueError(f"array '{name}' has shape {tuple(array.shape)}, not {tuple(expected.shape)}")
        if expected.jax_dtype != array.dtype:
            raise ValueError(f"array '{name}' has dtype {array.dtype}, not {expected.jax_dtype}")


def check_cache_extras(additional: Any, batch_size: int) -> None:
    """What :meth:`hydrax.Batch.cache` requires of ``additional``: a dict of lists, one value per item."""
    if not isinstance(additional, dict):
        raise TypeError(f"additional data has non-dict type {type(additional).__name__}")
    for name, values in additional.items():
        if not isinstance(values, list):
            raise TypeError(f"additional data '{name}' of type {type(values).__name__} is not a list")
        if len(values) != batch_size:
            raise ValueError(f"additional data '{name}' has length {len(values)}, expected {batch_size}")


@dataclass
class CacheTarget:
    """Where :meth:`hydrax.Batch.cache` puts a batch: the cache layouts to check against, and,
    unless the cache is read-only or has no location, the file and the run's writer."""

    layouts: MappingProxyType
    cache: GroupCache | None = None
    path: str | None = None
    writer: CacheWriter | None = None

    def persist(self, arrays: Mapping[str, Any], additional: Mapping[str, list]) -> bool:
        """Queue the write of the batch file; False when there is nothing to write to, or the
        path is already being written."""
        cache, path, writer = self.cache, self.path, self.writer
        if cache is None or cache.readonly or path is None or writer is None or not writer.claim(path):
            return False
        arrays, additional = dict(arrays), {key: list(values) for key, values in additional.items()}

        def write() -> None:
            # The conversion (a device-to-host copy off the CPU) runs here, on a writer thread.
            host = [(layout.offset, np.ascontiguousarray(np.asarray(arrays[name], dtype=layout.dtype)))
                    for name, layout in cache.layouts.items()]
            cache.write(path, host, additional)

        writer.submit(path, write)
        return True


class BatchForm(NamedTuple):
    """The form a batch is handed out in: its layouts, whether it holds the loader arrays
    (``uncached``), and where :meth:`hydrax.Batch.cache` would put it (None: nowhere)."""

    layouts: Mapping[str, ArrayLayout]
    uncached: bool
    cache_target: CacheTarget | None


class Outcome(enum.Enum):
    """What a run does with a batch of a group that has a cache on disk."""

    #: The batch is read from its file.
    READ = "read"
    #: There is no file and the group has no loaders: the batch is dropped.
    MISSING = "missing"
    #: The loaders load it (in explicit mode the training loop may then cache it itself).
    LOAD = "load"
    #: Direct mode: the loaders load it and it is written from its slot; its path is claimed until then.
    WRITE = "write"
    #: Direct mode: loaded, and its write queued (the writer frees the path when done).
    QUEUED = "queued"


@dataclass
class CacheEntry:
    """One batch's file in its group's cache, and what the run does with it."""

    cache: GroupCache
    path: str
    outcome: Outcome
    #: The batch read from the file (``READ``), until :meth:`lease` hands it on.
    batch: CachedBatch | None = None

    @property
    def handed_out_cached(self) -> bool:
        """Whether the batch reaches the training loop in its cached form (read, or direct mode)."""
        return self.outcome is Outcome.READ or self.cache.direct

    def lease(self, slot: int, on_free: Callable[[int], object]) -> _core.SlotLease:
        """The lease over the arrays of the batch read from the file (see :meth:`CachedBatch.lease`);
        the lease holds the mapping from then on."""
        batch, self.batch = self.batch, None
        return batch.lease(slot, on_free)


class RunCache:
    """A run's use of its groups' caches: whether each batch is read from its file, dropped, or
    loaded (and then, in direct mode, written from its slot), and the writer threads.

    :param writer: the run's writer threads; None when every cache is read-only.
    """

    def __init__(self, writer: CacheWriter | None) -> None:
        self.writer = writer

    def settle(self, cache: GroupCache, epoch: int, index: int, training: bool) -> CacheEntry:
        """What becomes of batch ``index`` of ``epoch``: read from its file when it is there and
        no one is writing it, dropped when it is not there and the group has no loaders, loaded
        otherwise (and claimed for writing, in direct mode)."""
        path = cache.path(epoch, index, training)
        writer = self.writer
        # A path in flight is being loaded or written right now: never read it (hydrax 0.2.2 did,
        # and unpickled half a file); load the batch again instead.
        if writer is None or not writer.in_flight(path):
            batch = cache.open(path)
            if batch is not None:
                return CacheEntry(cache, path, Outcome.READ, batch)
        if cache.loaderless:
            return CacheEntry(cache, path, Outcome.MISSING)
        if cache.direct and writer is not None and writer.claim(path):
            return CacheEntry(cache, path, Outcome.WRITE)
        return CacheEntry(cache, path, Outcome.LOAD)

    def abandon(self, entry: CacheEntry | None) -> None:
        """The batch will not be written after all (it failed, or was not placed): free its path."""
        if entry is not None and entry.outcome is Outcome.WRITE:
            entry.outcome = Outcome.LOAD
            self.writer.release(entry.path)

    def write_from_slot(self, entry: CacheEntry, lease: _core.SlotLease, layouts: Mapping[str, ArrayLayout],
                        additional: Mapping[str, list[Any]]) -> None:
        """Queue the write of a batch loaded in direct mode, from its slot: the writer's views keep
        the slot from being recycled until the file is written."""
        entry.outcome = Outcome.QUEUED
        cache, path = entry.cache, entry.path
        slot = np.frombuffer(lease, dtype=np.uint8, count=max(layouts_end(layouts), 1))
        chunks = [(cache.layouts[name].offset, slot[layout.offset : layout.end]) for name, layout in layouts.items()]
        del slot
        extras = {key: list(values) for key, values in additional.items()}
        self.writer.submit(path, lambda: cache.write(path, chunks, extras))

    def form(self, cache: GroupCache | None, cache_layouts: Mapping[str, ArrayLayout] | None, entry: CacheEntry | None,
             layouts: Mapping[str, ArrayLayout]) -> BatchForm:
        """The form of a batch with the arrays at ``layouts``: cached when it was read or its group
        caches in direct mode; otherwise uncached, and cacheable by the loop when its group has
        ``cache_layouts`` (what :meth:`hydrax.Batch.cache` checks against)."""
        if entry is not None and entry.handed_out_cached:
            return BatchForm(cache.layouts, False, None)
        if cache_layouts is not None:
            return BatchForm(layouts, True, CacheTarget(cache_layouts, cache, None if entry is None else entry.path, self.writer))
        return BatchForm(layouts, True, None)

    def close(self) -> None:
        """Finish the queued writes (the queued batch files are written, not lost)."""
        if self.writer is not None:
            self.writer.close()
