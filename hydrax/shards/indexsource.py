"""Where each shard's index comes from: beside a local shard, the cache, an index object, or its bytes.

A local shard's index is the ``.hidx`` file beside it (:func:`open_local`). A remote shard's comes
from the local cache while the shard's version is unchanged (:func:`cache_path`), else from the
index object ``<shard>.hidx`` beside it (:func:`index_from_object`), else is built from the shard
read whole (:func:`build_index_async`). :func:`load_index` loads one when a shard whose count came
from a manifest is first read, and checks the count.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
from typing import Any, Callable

from ..errors import AccessDeniedError, MissingPermissionError, ObjectChangedError, ObjectNotFoundError, ShardFormatError, StoreError
from .indexfile import ShardIndex, index_from_bytes, open_index
from .options import StoreOptions
from .router import store_for
from .shardtable import INDEX_SUFFIX, ShardEntry, listing_kind
from .store import ObjectInfo, is_remote, run_async

log = logging.getLogger(__name__)

#: Whole shards read at once when indexes must be built from them.
BUILD_REQUESTS = 8
#: Given each shard set-up read whole to index it, while its bytes are still in memory: the
#: shard's entry, its bytes and its new index (a ShardSet cuts them into read-ahead chunks).
BuildSink = Callable[[ShardEntry, Any, ShardIndex], None]


def open_local(entry: ShardEntry, write_index: bool, missing: str, joint: str) -> ShardIndex:
    """The index of the local shard ``entry``; a shard that is not there is an
    :class:`ObjectNotFoundError` saying ``missing`` (after ``shard '<url>'`` and ``joint``)."""
    try:
        return open_index(entry.url, write=write_index)
    except StoreError:
        raise
    except FileNotFoundError:
        if os.path.exists(entry.url):
            raise  # the shard is there: something else is missing
        raise ObjectNotFoundError(missing, url=entry.url, subject=f"shard {entry.url!r}{joint}") from None
    except OSError as exc:  # a folder, a name too long, no permission: a listing can name any of them
        kind = AccessDeniedError if isinstance(exc, PermissionError) else StoreError
        raise kind(f"cannot be read ({exc.strerror or exc}); check the path and its permissions", url=entry.url,
                   subject=f"shard {entry.url!r:.300}: ") from None


def cache_path(cache_dir: str, url: str) -> str:
    """Where the local copy of a remote shard's index is kept."""
    return os.path.join(cache_dir, "index", hashlib.sha256(url.encode()).hexdigest()[:32] + INDEX_SUFFIX)


def _cached(entry: ShardEntry, cache_dir: str) -> ShardIndex | None:
    try:
        index = ShardIndex.load(cache_path(cache_dir, entry.url))
    except (FileNotFoundError, ShardFormatError):
        return None
    if index.shard_size == entry.size and index.etag == entry.version:
        return index
    return None


def keep_index(index: ShardIndex, entry: ShardEntry, cache_dir: str, write_index: bool) -> None:
    if not write_index:
        return
    path = cache_path(cache_dir, entry.url)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    try:
        index.save(path)
    except OSError:
        pass  # a read-only cache: fetch again next time


_build_slots = None


async def index_entry(entry: ShardEntry, options: StoreOptions, cache_dir: str, write_index: bool,
                       sink: BuildSink | None = None) -> None:
    """Give ``entry`` its index, built from the shard's bytes (see :func:`_built_index`), and sample count."""
    entry.index = await _built_index(entry, options, cache_dir, write_index, sink)
    entry.samples = len(entry.index)


async def _entry_index(entry: ShardEntry, listed: dict[str, ObjectInfo], options: StoreOptions, cache_dir: str,
                       write_index: bool) -> ShardIndex:
    """The index of the remote shard ``entry``: the local cache, else the index object beside it, else built."""
    index = await known_index(entry, listed, options, cache_dir, write_index)
    return index if index is not None else await _built_index(entry, options, cache_dir, write_index)


async def known_index(entry: ShardEntry, listed: dict[str, ObjectInfo], options: StoreOptions, cache_dir: str,
                       write_index: bool) -> ShardIndex | None:
    """The index of the remote shard ``entry`` that costs no read of its data: the local cache,
    else the index object beside it (``listed`` shows it; where the store cannot list, it is
    tried); None when there is none to use."""
    index = _cached(entry, cache_dir)
    if index is None:
        store = store_for(entry.url, options)
        beside = listed.get(entry.url + INDEX_SUFFIX)
        if beside is None and not store.listable:
            beside = ObjectInfo(entry.url + INDEX_SUFFIX, -1, None, 0)  # cannot list: try it
        index = await index_from_object(entry, beside, store) if beside is not None else None
        if index is not None:
            keep_index(index, entry, cache_dir, write_index)
    return index


async def _built_index(entry: ShardEntry, options: StoreOptions, cache_dir: str, write_index: bool,
                       sink: BuildSink | None = None) -> ShardIndex:
    """The index of the remote shard ``entry``, built from its bytes (read whole, then given to
    ``sink`` with the index), and cached."""
    index = await build_index_async(entry, store_for(entry.url, options), sink)
    keep_index(index, entry, cache_dir, write_index)
    return index


async def index_from_object(entry: ShardEntry, beside: ObjectInfo, store) -> ShardIndex | None:
    """The index object ``beside`` the shard of ``entry``, or None when it is missing, damaged or
    was written for another version of the shard (the index is then built afresh). ``beside``
    of size -1 is a guess, no listing having shown it."""
    try:
        index = ShardIndex.from_bytes(await store.read_async(beside.url, version=beside.version), beside.url)
    except ObjectNotFoundError:
        return None
    except MissingPermissionError:
        if beside.size >= 0:
            raise
        # To credentials that may not list the bucket, S3 answers access denied for an object
        # that does not exist: most likely there is none, and building serves either way.
        return None
    except ShardFormatError as exc:
        log.warning("ignoring a damaged index object (building the index afresh): %s", exc)
        return None
    if (index.shard_size, index.etag) != (entry.size, entry.version):
        log.warning("ignoring the stale index object %s (building the index afresh): it was built for a shard of %d bytes "
                    "with ETag %s, the shard has %s bytes and ETag %s", beside.url, index.shard_size, index.etag,
                    entry.size, entry.version)
        return None
    return index


async def build_index_async(entry: ShardEntry, store, sink: BuildSink | None = None, sizes: str | None = None) -> ShardIndex:
    """The index of the remote shard ``entry``, read whole from ``store`` (at most
    :data:`BUILD_REQUESTS` at once per event loop); ``sink`` is given its bytes with it. With
    ``sizes``, a field name, the index records that field's image sizes, read from those bytes."""
    global _build_slots
    loop = asyncio.get_running_loop()
    if _build_slots is None or _build_slots[0] is not loop:
        _build_slots = (loop, asyncio.Semaphore(BUILD_REQUESTS))
    async with _build_slots[1]:
        data = await store.read_async(entry.url, version=entry.version)
    if len(data) != entry.size:
        raise ObjectChangedError(f"listed with {entry.size} bytes, read {len(data)}", url=entry.url, subject=f"shard {entry.url!r}: ")
    index = index_from_bytes(data, entry.url, entry.size, 0, entry.version, sizes)
    if sink is not None:
        sink(entry, data, index)  # while the bytes are in memory: the caller keeps what it may use
    return index


def load_index(entry: ShardEntry, options: StoreOptions, cache_dir: str, write_index: bool = True, *,
               keep: bool = True) -> ShardIndex:
    """Load the index of ``entry`` now (a shard whose count came from a manifest, when it is first
    read). With ``keep``, ``entry.index`` holds it from then on; else the caller keeps it (a
    :class:`~hydrax.shards.ShardSet` keeps a bounded number) and ``entry`` is left as it was."""
    if entry.index is not None:
        return entry.index
    if is_remote(entry.url):
        return run_async(load_index_async(entry, options, cache_dir, write_index, keep=keep))
    index = open_local(entry, write_index, f"listed in the {listing_kind(entry.counted_by or '')}, does not exist", ", ")
    _check_count(entry, index)
    if keep:
        entry.index = index
    return index


async def load_index_async(entry: ShardEntry, options: StoreOptions, cache_dir: str, write_index: bool = True, *,
                           keep: bool = True) -> ShardIndex:
    """:func:`load_index` for a remote shard, from an event loop."""
    if entry.index is not None:
        return entry.index
    if entry.size is None or entry.version is None:
        info = await store_for(entry.url, options).stat_async(entry.url)
        entry.size, entry.version = info.size, info.version
    # No listing at hand: try the index object beside the shard (a missing one is built).
    probe = {entry.url + INDEX_SUFFIX: ObjectInfo(entry.url + INDEX_SUFFIX, -1, None, 0)}
    index = await _entry_index(entry, probe, options, cache_dir, write_index)
    _check_count(entry, index)
    if keep:
        entry.index = index
    return index


def _check_count(entry: ShardEntry, index: ShardIndex) -> None:
    if entry.samples is None or len(index) == entry.samples:
        return
    source = entry.counted_by or "the manifest"
    if listing_kind(source) == "folder summary":
        raise ShardFormatError(f"the folder summary {source} says {entry.samples} samples, its index has {len(index)}; "
                               f"rebuild it (hydrax shards index {source.rsplit('/', 1)[0]}/)", url=entry.url)
    raise ShardFormatError(f"the manifest {source} says {entry.samples} samples, its index has {len(index)}; "
                           "rewrite the manifest (hydrax shards index --manifest)", url=entry.url)
