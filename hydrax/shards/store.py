"""Where shards live: one interface over local files, S3, GCS, HTTP(S) and the Hugging Face Hub.

Everything hydrax reads or writes about shards goes through a :class:`Store`: ``stat``, ranged and
whole reads, streams, listings, writes and deletes, each raising hydrax's own
:class:`~hydrax.errors.StoreError` kinds with the URL and byte offset. What differs between kinds
of store and matters to set-up is asked of the store too (:attr:`Store.listable`,
:meth:`Store.pin`, ...), so that no caller branches on URL schemes.
:func:`hydrax.shards.router.store_for` picks the store for a URL.

This module holds the base class, local files (:class:`LocalStore`), what every store shares
(:class:`ObjectInfo`, the URL scheme helpers, :func:`write_atomic`) and the bridge from
synchronous code to the stores' asynchronous forms (:func:`run_async`, :func:`gather_limited`).
The remote stores have modules of their own: :mod:`hydrax.shards.objstore` (``s3://``, ``gs://``
and ``http(s)://`` through obstore) and :mod:`hydrax.shards.hub` (``hf://``, the Hugging Face
Hub); their settings are in :mod:`hydrax.shards.options`.
"""

from __future__ import annotations

import asyncio
import fnmatch
import glob as globbing
import os
import tempfile
import threading
from dataclasses import dataclass
from typing import Any, AsyncIterator, Sequence

from ..errors import AccessDeniedError, ObjectChangedError, ObjectNotFoundError, StoreError
# Documented here before the options had a module of their own: still found here.
from .options import HFOptions as HFOptions, as_store_options as as_store_options, store_environment as store_environment

#: URL schemes served by an object store.
REMOTE_SCHEMES = ("s3", "gs", "http", "https", "hf")


@dataclass(frozen=True)
class ObjectInfo:
    """One object (or file): its URL, size, version and modification time.

    ``version`` is the ETag for remote objects and ``None`` for local files (which are tied to
    their size and modification time instead).
    """

    url: str
    size: int
    version: str | None
    mtime_ns: int


def scheme_of(url: str) -> str:
    """``"s3"``, ``"gs"``, ``"http"``, ``"https"``, ``"hf"``, or ``"file"`` for local paths and ``file://`` URLs."""
    head, sep, _ = url.partition("://")
    return head.lower() if sep else "file"


def is_remote(url: str) -> bool:
    """Whether ``url`` names an object in a remote store."""
    return scheme_of(url) in REMOTE_SCHEMES


def is_local(url: str) -> bool:
    """Whether ``url`` names a local file (a path, or a ``file://`` URL)."""
    return scheme_of(url) == "file"


def local_path(url: str) -> str:
    """The path of a local ``url`` (``file://`` removed)."""
    return url[len("file://"):] if url.startswith("file://") else url


def pattern_folder(pattern: str) -> str:
    """The folder (ending in ``/``) whose listing holds every match of the shell pattern ``pattern``."""
    cut = min((pattern.find(c) for c in "*?[" if c in pattern), default=len(pattern))
    return pattern[:cut].rpartition("/")[0] + "/"


class Store:
    """The operations hydrax needs from a place shards live; see the module docstring."""

    scheme = "file"
    #: Whether :meth:`list` lists a folder in one request: set-up then needs no HEAD per shard,
    #: and sees which index objects sit beside the shards (else it tries each by name).
    listable = False
    #: Whether this is a bucket (S3, GCS): hydrax writes index objects and folder summaries beside
    #: shards there, and advises ``hydrax shards index`` to do so.
    is_bucket = False
    #: Whether a request for a missing object may be answered with access denied, when the
    #: credentials may not list its folder (S3 does): set-up's errors then say so.
    hides_missing = False

    def pin(self, url: str, pins: dict | None = None) -> str:
        """``url`` at the revision it names now, so that a moved branch changes nothing later (the
        Hub's commit; ``pins`` keeps the revisions resolved during one set-up). A store without
        revisions gives ``url`` as it is."""
        return url

    def stat(self, url: str) -> ObjectInfo:
        raise NotImplementedError

    def list(self, prefix: str) -> list[ObjectInfo]:
        """Every object whose URL starts with ``prefix``, sorted by URL."""
        raise NotImplementedError

    def glob(self, pattern: str) -> list[ObjectInfo]:
        """Objects matching the shell pattern ``pattern`` (``*``, ``?``, ``[...]``), sorted."""
        return [info for info in self.list(pattern_folder(pattern)) if fnmatch.fnmatchcase(info.url, pattern)]

    def read(self, url: str, offset: int = 0, size: int | None = None, *, version: str | None = None):
        """``size`` bytes of ``url`` from ``offset`` (to the end when None), as a bytes-like object."""
        raise NotImplementedError

    def write(self, url: str, data) -> ObjectInfo:
        """Store ``data`` (bytes-like) at ``url`` whole, atomically: readers never see part of it."""
        raise NotImplementedError

    def upload(self, url: str, path: str) -> ObjectInfo:
        """Store the local file ``path`` at ``url``, atomically."""
        with open(path, "rb") as f:
            return self.write(url, f.read())

    def delete(self, url: str) -> None:
        raise NotImplementedError

    # The asynchronous forms serve read-ahead and set-up, which keep many requests in flight.
    async def stat_async(self, url: str) -> ObjectInfo:
        return await asyncio.to_thread(self.stat, url)

    async def read_async(self, url: str, offset: int = 0, size: int | None = None, *, version: str | None = None):
        return await asyncio.to_thread(self.read, url, offset, size, version=version)

    async def stream_async(self, url: str, offset: int, end: int, *, version: str | None = None) -> AsyncIterator[Any]:
        """The bytes ``[offset, end)`` of ``url`` in pieces, as they arrive."""
        yield await self.read_async(url, offset, end - offset, version=version)


def _umask() -> int:
    """This process's umask, read without changing it (``os.umask`` would, for every thread)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022


def write_atomic(path: str, data, prefix: str = ".hydrax-") -> None:
    """Write ``data`` to the local file ``path`` atomically: a temporary file beside it, then a
    rename, so readers see the old file or the whole new one. The file is as readable as any the
    user writes (the umask applies; ``mkstemp`` alone would make it private)."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, temporary = tempfile.mkstemp(prefix=prefix, dir=folder)
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise


class LocalStore(Store):
    """Files on a local (or network-mounted) file system."""

    scheme = "file"
    listable = True

    def stat(self, url: str) -> ObjectInfo:
        path = local_path(url)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            raise ObjectNotFoundError("does not exist (check the path or pattern)", url=url, subject=f"shard {url!r} ") from None
        except PermissionError as exc:
            raise AccessDeniedError(str(exc.strerror), url=url, subject=f"shard {url!r}: ") from exc
        return ObjectInfo(url, st.st_size, None, st.st_mtime_ns)

    def list(self, prefix: str) -> list[ObjectInfo]:
        return self.glob(globbing.escape(local_path(prefix)) + "*")

    def glob(self, pattern: str) -> list[ObjectInfo]:
        found = []
        for path in sorted(globbing.glob(local_path(pattern))):
            try:
                st = os.stat(path)
            except OSError:
                continue
            if not os.path.isdir(path):
                found.append(ObjectInfo(path, st.st_size, None, st.st_mtime_ns))
        return found

    def read(self, url: str, offset: int = 0, size: int | None = None, *, version: str | None = None):
        path = local_path(url)
        try:
            with open(path, "rb") as f:
                if size is None:
                    f.seek(offset)
                    return f.read()
                data = os.pread(f.fileno(), size, offset)
        except FileNotFoundError:
            raise ObjectNotFoundError("does not exist", url=url, offset=offset, subject=f"shard {url!r} ") from None
        except OSError as exc:
            raise StoreError(f"at byte offset {offset}: {exc}", url=url, offset=offset, subject=f"shard {url!r} ") from exc
        if len(data) != size:
            raise ObjectChangedError(f"asked for {size} bytes at byte offset {offset}, the file has {len(data)} there "
                                     "(it changed since it was indexed)", url=url, offset=offset, subject=f"shard {url!r}: ")
        return data

    def write(self, url: str, data) -> ObjectInfo:
        write_atomic(local_path(url), data)
        return self.stat(local_path(url))

    def delete(self, url: str) -> None:
        try:
            os.unlink(local_path(url))
        except FileNotFoundError:
            pass


def run_async(coroutine):
    """Run ``coroutine`` to completion from synchronous code (in a fresh thread when this thread
    already runs an event loop, as in a notebook)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        running = False
    else:
        running = True
    if not running:  # outside the except clause: the coroutine's errors carry no "no running loop" context
        return asyncio.run(coroutine)
    outcome: list = []

    def target():
        try:
            outcome.append((True, asyncio.run(coroutine)))
        except BaseException as exc:  # raised in the caller's thread, not printed in this one
            outcome.append((False, exc))

    thread = threading.Thread(target=target, name="hydrax-async")
    thread.start()
    thread.join()
    ok, value = outcome[0]
    if not ok:
        raise value
    return value


async def gather_limited(calls: Sequence, limit: int = 64) -> list:
    """Await the zero-argument coroutine functions ``calls`` with at most ``limit`` running at once;
    results in order. The first failure cancels the rest and is raised."""
    semaphore = asyncio.Semaphore(limit)

    async def one(call):
        async with semaphore:
            return await call()

    tasks = [asyncio.ensure_future(one(call)) for call in calls]
    try:
        return await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
