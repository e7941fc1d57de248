"""Finding a dataset's shards and their indexes without reading the data.

:func:`~hydrax.shards.listing.expand_urls` turns brace ranges, globs and lists into shard URLs.
:func:`resolve` then gives every shard its size, version and index:

- local shards: ``<shard>.hidx`` beside each (built and written when missing); when every shard
  is local, :func:`resolve_set` gathers them into one set index (:mod:`hydrax.shards.setindex`)
  kept in the cache folder, which later opens of the same, unchanged shards reuse without reading
  any ``.hidx`` (one ``stat`` of the first says whether the indexes were rewritten since);
- remote shards (``s3://``, ``gs://``): one LIST per folder gives every shard's size and ETag and
  shows which have an index object ``<shard>.hidx`` beside them (``hydrax shards index`` writes
  them); indexes come from the local cache while the shard's ETag is unchanged, else from the
  index objects, many requests at once, else are built from the shard itself (also
  concurrently; the bytes read go to the caller's sink, see :func:`resolve_set`, so that a
  ShardSet's read-ahead keeps them). Nothing is written into the bucket;
- ``http(s)://`` shards: a HEAD each (such servers cannot list), then as above;
- ``hf://`` shards (the Hugging Face Hub, :mod:`hydrax.shards.hub`): first pinned to the commit
  their revision points at, then one listing of the tree API per folder, then as above;
- a manifest (a wids ``wids-shard-index-v1`` descriptor, local or remote, named instead of
  shards): one request gives every shard, its sample count and, when hydrax wrote it, its size
  and ETag; the indexes are then loaded only when a shard is first read. Every count is checked
  against its shard's size before anything is sized by it: for a shard the manifest gives no
  size for, set-up finds it (see :func:`~hydrax.shards.manifest.read_checked_manifest`).

A ShardSet holds what is known of its shards compactly, without a Python object per shard: URLs
as a :class:`~hydrax.shards.shardtable.UrlList` (one byte array), sizes, sample counts and
versions as a :class:`~hydrax.shards.shardtable.ShardTable` (arrays);
:class:`~hydrax.shards.shardtable.ShardEntry` objects are made on demand.

This module puts set-up together; each step has a module of its own, below it:
:mod:`~hydrax.shards.listing` (patterns, and one LIST per folder or a HEAD per shard),
:mod:`~hydrax.shards.indexsource` (each shard's index: the cache, an index object, or built),
:mod:`~hydrax.shards.manifest` (manifests and folder summaries, their counts checked) and
:mod:`~hydrax.shards.shardtable` (what is known of the shards, compactly).
:mod:`~hydrax.shards.publish` writes what set-up reads beside remote shards. What differs
between stores is asked of the store (:class:`~hydrax.shards.store.Store`), never read from a
URL's scheme here.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shlex
from typing import Callable

from ..errors import ShardFormatError
from .indexfile import ShardIndex, index_path
from .indexsource import BuildSink, index_entry, keep_index, known_index, open_local
from .listing import SETUP_REQUESTS, find_shards, list_entries
from .manifest import read_checked_manifest, read_summary
from .options import StoreOptions
from .router import store_for
from .setindex import SetIndex, build_set_index, set_index_path, urls_digest
from .shardtable import INDEX_SUFFIX, ShardEntry, ShardTable, UrlList, summary_url
from .store import ObjectInfo, gather_limited, is_remote, run_async
# Documented here before they had modules of their own: still found here.
from .indexsource import cache_path as cache_path, load_index as load_index, load_index_async as load_index_async
from .manifest import is_manifest as is_manifest, manifest_entries as manifest_entries, manifest_json as manifest_json
from .publish import update_summary as update_summary
from .shardtable import SUMMARY_NAME as SUMMARY_NAME

log = logging.getLogger(__name__)

#: A set-up that must read more than this many bytes of shards to index them (no index objects,
#: nothing cached) says so once, with the command that writes the index objects.
BUILD_WARNING_BYTES = 256 << 20


def default_cache_dir() -> str:
    """Where indexes of remote shards are kept: ``$HYDRAX_CACHE``, else ``~/.cache/hydrax``."""
    return os.environ.get("HYDRAX_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "hydrax")


#: Called once, when set-up knows every remote shard's size (the first argument) and is about to
#: read the second argument's shards whole to index them: the :data:`BuildSink` for their bytes, or None.
SinkFor = Callable[[list[ShardEntry], list[ShardEntry]], BuildSink | None]
#: Given the remote shards set-up must read whole to index them (after :data:`SinkFor`): their
#: indexes, built elsewhere (a ShardSet's indexing processes), None for one it could not build;
#: or None, and set-up reads and indexes them itself.
Builder = Callable[[list[ShardEntry]], "list[ShardIndex | None] | None"]


def resolve(urls, options: StoreOptions, cache_dir: str, write_index: bool) -> list[ShardEntry]:
    """Every shard of ``urls`` with its size, version and index (or, from a manifest, its count)."""
    if is_manifest(urls):
        return read_checked_manifest(os.fspath(urls), options).entries()
    return _resolve_entries(*find_shards(urls, options), options, cache_dir, write_index, urls)


def _resolve_entries(shards: list[ObjectInfo], listed: dict[str, ObjectInfo], options: StoreOptions, cache_dir: str,
                     write_index: bool, given, sink_for: SinkFor | None = None, builder: Builder | None = None) -> list[ShardEntry]:
    """:func:`resolve` once ``urls`` (``given``, named in advice) are expanded into ``shards``;
    ``sink_for`` and ``builder`` as :func:`resolve_set` takes them."""
    entries = [ShardEntry(info.url) for info in shards]
    for entry in entries:
        if not is_remote(entry.url):
            entry.index = open_local(entry, write_index, "does not exist (check the path or pattern)", " ")
            entry.size, entry.samples = entry.index.shard_size, len(entry.index)
    remote = [e for e in entries if is_remote(e.url)]
    if remote:
        run_async(_resolve_remote(remote, listed, options, cache_dir, write_index, given, sink_for, builder))
    return entries


def resolve_set(urls, options: StoreOptions, cache_dir: str, write_index: bool,
                sink_for: SinkFor | None = None, builder: Builder | None = None) -> ShardTable | list[ShardEntry] | tuple[UrlList, SetIndex]:
    """The shards of ``urls``: of a manifest, its :class:`ShardTable` (no index loaded); when all
    of them are local files, ``(their paths, their set index)`` (see :func:`open_set_index`); else,
    as :func:`resolve` gives them, every shard's :class:`ShardEntry`.

    ``sink_for`` (a :data:`SinkFor`) is called when remote shards must be read whole to index
    them, once their sizes are known and before the first is read; the :data:`BuildSink` it
    returns is given each such shard's bytes, so that they need not be fetched again. ``builder``
    (a :data:`Builder`) is then offered those shards to index elsewhere."""
    if is_manifest(urls):
        return read_checked_manifest(os.fspath(urls), options)
    shards, listed = find_shards(urls, options)
    if any(is_remote(info.url) for info in shards):
        return _resolve_entries(shards, listed, options, cache_dir, write_index, urls, sink_for, builder)
    paths = [info.url for info in shards]
    return UrlList(paths), open_set_index(paths, cache_dir, write_index)


def open_set_index(paths: list[str], cache_dir: str, write_index: bool = True) -> SetIndex:
    """The set index of the local shards ``paths``: the one kept in ``cache_dir`` while every
    shard has the size and modification time it recorded, and the first shard's index file is
    not newer than it; else (none, a damaged one, a shard that changed, or a first index
    rewritten since, as ``hydrax shards index --sizes`` does, said in the log) built from the
    shards' own indexes (see :func:`~hydrax.shards.open_index`) and, with ``write_index``, kept
    in ``cache_dir``."""
    digest = urls_digest(paths)
    path = set_index_path(cache_dir, digest)
    try:
        found = SetIndex.open(path)
    except FileNotFoundError:
        found = None
    except (ShardFormatError, OSError) as exc:
        log.warning("rebuilding the set index of %d shards: %s", len(paths), exc)
        found = None
    if found is not None:
        why = "it was made for other shards" if found.digest != digest else found.changed(paths) or _index_newer(paths, path)
        if why is None:
            return found
        log.info("rebuilding the set index %s of %d shards: %s", path, len(paths), why)
    indexes = [open_local(ShardEntry(p), write_index, "does not exist (check the path or pattern)", " ") for p in paths]
    return build_set_index(indexes, digest, path if write_index else None)


def _index_newer(paths: list[str], path: str) -> str | None:
    """Why the set index ``path`` may lack what the shards' index files now hold: the first one
    was written after it (one ``stat`` of each; rewriting every index, as ``hydrax shards index
    --sizes`` does, rewrites the first). None when it was not, or is not there."""
    try:
        written = os.stat(index_path(paths[0])).st_mtime_ns if paths else 0
        if written > os.stat(path).st_mtime_ns:
            return f"the index of its first shard, {paths[0]!r}, was written after it"
    except OSError:
        pass  # no index beside the shard: the set index is all there is
    return None


async def _resolve_remote(entries: list[ShardEntry], listed: dict[str, ObjectInfo], options: StoreOptions,
                          cache_dir: str, write_index: bool, given=None, sink_for: SinkFor | None = None,
                          builder: Builder | None = None) -> None:
    """Give the remote ``entries`` their sizes, versions and indexes (or counts, from a folder
    summary); ``given``, the URLs as the caller wrote them, goes into advice; ``sink_for`` and
    ``builder`` as :func:`resolve_set` takes them."""
    await list_entries(entries, listed, options)
    # A folder summary written by `hydrax shards index` gives the sample counts of every shard it
    # lists in one request; their indexes then load when first read. The rest read index objects.
    summaries = sorted({summary_url(e.url) for e in entries} & set(listed))
    counted: dict[str, ShardEntry] = {}
    for found in await gather_limited([lambda u=u: read_summary(u, listed[u], options) for u in summaries], SETUP_REQUESTS):
        counted.update((e.url, e) for e in found)
    unindexed = []
    for entry in entries:
        known = counted.get(entry.url)
        if known is not None and (known.size, known.version) == (entry.size, entry.version) and known.samples is not None:
            entry.samples = known.samples
        else:
            unindexed.append(entry)
    # The indexes that cost no read of a shard first, so that a set-up about to read many shards
    # whole can say so before it starts.
    known = await gather_limited([lambda e=e: known_index(e, listed, options, cache_dir, write_index) for e in unindexed],
                                 SETUP_REQUESTS)
    building = []
    for entry, index in zip(unindexed, known):
        if index is None:
            building.append(entry)
        else:
            entry.index, entry.samples = index, len(index)
    _warn_of_building(building, given, options)
    sink = sink_for(entries, building) if sink_for is not None and building else None
    built = await asyncio.to_thread(builder, building) if builder is not None and building else None
    if built is not None:
        for entry, index in zip(building, built):
            if index is not None:
                keep_index(index, entry, cache_dir, write_index)
                entry.index, entry.samples = index, len(index)
        building = [entry for entry, index in zip(building, built) if index is None]
    await gather_limited([lambda e=e: index_entry(e, options, cache_dir, write_index, sink) for e in building], SETUP_REQUESTS)


def _warn_of_building(building: list[ShardEntry], given, options: StoreOptions) -> None:
    """Log once, as a warning, that set-up reads the shards ``building`` whole to index them,
    when they hold more than :data:`BUILD_WARNING_BYTES`: every host that sets up without their
    indexes cached reads them again, where index objects would spare it."""
    sizes = {entry.url: entry.size or 0 for entry in building}  # a shard the set names twice counts once
    total = sum(sizes.values())
    if total <= BUILD_WARNING_BYTES:
        return
    distinct = len(sizes)
    amount = f"{total / 2**30:.1f} GiB" if total >= 2**30 else f"{total / 2**20:.1f} MiB"
    log.warning("set-up reads %d shards, %s bytes (%s), in full to index them: they have no index objects (<shard>%s) "
                "and no index cached in this cache_dir, so every host that sets up reads them again; %s", distinct,
                f"{total:,}", amount, INDEX_SUFFIX, _indexing_advice(building, given, options))


def _indexing_advice(building: list[ShardEntry], given, options: StoreOptions) -> str:
    """What spares set-ups from reading the shards ``building`` (named as ``given``) to index
    them: for buckets, the ``hydrax shards index`` command that writes their index objects."""
    stores = [store_for(entry.url, options) for entry in building]
    if not all(store.is_bucket for store in stores):  # hydrax writes index objects only into buckets
        return (f"put an index file <shard>{INDEX_SUFFIX} beside each shard where they are served from (hydrax shards index "
                "writes them beside a local copy), and set-up reads only the indexes")
    patterns = [given] if isinstance(given, (str, os.PathLike)) else list(given or [])
    patterns = [os.fspath(p) for p in patterns if is_remote(os.fspath(p))]
    if not patterns or len(patterns) > 4:  # a long list of URLs: the shards to index, the first of them
        patterns = list(dict.fromkeys(entry.url for entry in building))
    words = ["hydrax", "shards", "index", *(shlex.quote(p) for p in patterns[:4])]
    if len(patterns) > 4:
        words.append(f"... (all {len(patterns)} of them; a brace list such as train-{{00..31}}.tar names many at once)")
    endpoint = getattr(options.for_scheme(min(store.scheme for store in stores)), "endpoint_url", None)
    if endpoint:
        words += ["--endpoint-url", shlex.quote(endpoint)]
    return (f"write their index objects once (this needs write access to the bucket), and set-ups then read only the "
            f"indexes: {' '.join(words)}")
