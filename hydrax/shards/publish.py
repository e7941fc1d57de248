"""Writing index objects and folder summaries beside remote shards (``hydrax shards index``).

:func:`publish_indexes` writes ``<shard>.hidx`` beside every remote shard that lacks a current one,
and the folder summaries (:data:`~hydrax.shards.shardtable.SUMMARY_NAME`) of the buckets' folders,
so that later set-ups read one summary per folder instead of every shard.
"""

from __future__ import annotations

import asyncio
from typing import Sequence

from .indexsource import build_index_async, index_from_object
from .listing import SETUP_REQUESTS, find_shards, list_entries
from .manifest import manifest_json, read_summary
from .options import StoreOptions
from .router import store_for
from .shardtable import INDEX_SUFFIX, SUMMARY_NAME, ShardEntry
from .store import ObjectInfo, gather_limited, is_remote, run_async


def publish_indexes(urls, options: StoreOptions | None = None, *, force: bool = False,
                    on_done=None, summary: bool = True, sizes: str | None = None) -> list[ShardEntry]:
    """Write an index object ``<shard>.hidx`` beside every remote shard of ``urls`` that lacks a
    current one (all of them with ``force``), building the indexes concurrently; returns the
    shards with their indexes. ``on_done(entry)`` is called as each shard is done (a progress bar).
    ``summary=False`` leaves the folder summaries alone, for a caller that indexes a folder in
    parts and writes them once with :func:`write_summaries`. With ``sizes``, a field name, every
    index records that field's image sizes (:mod:`~hydrax.shards.sizecolumn`): an index object
    without them, or with another field's, is built again from the shard's bytes, and each
    entry's ``size_counts`` says how they came out."""
    options = options or StoreOptions()
    shards, listed = find_shards(urls, options)
    entries = [ShardEntry(info.url) for info in shards]
    local = [e.url for e in entries if not is_remote(e.url)]
    if local:
        raise ValueError(f"index objects are for remote shards; {local[0]!r} is local (use hydrax shards index for it)")
    run_async(_publish(entries, listed, options, force, on_done, sizes))
    if summary:
        run_async(_summarise(entries, listed, options))
    return entries


def write_summaries(entries: Sequence[ShardEntry], options: StoreOptions | None = None) -> None:
    """Add ``entries`` (with their sizes, versions and sample counts) to the summaries of their
    folders in object storage, listing each folder once; local shards need none."""
    options = options or StoreOptions()
    listed: dict[str, ObjectInfo] = {}
    for folder in {e.url.rsplit("/", 1)[0] for e in entries if store_for(e.url, options).is_bucket}:
        listed.update((info.url, info) for info in store_for(folder, options).list(folder + "/"))
    run_async(_summarise(list(entries), listed, options))


async def _summarise(entries: list[ShardEntry], listed: dict[str, ObjectInfo], options: StoreOptions) -> None:
    folders: dict[str, list[ShardEntry]] = {}
    for entry in entries:
        folders.setdefault(entry.url.rsplit("/", 1)[0], []).append(entry)
    for folder, done in folders.items():
        if store_for(done[0].url, options).is_bucket:
            await update_summary(folder, done, listed, options)


async def _publish(entries: list[ShardEntry], listed: dict[str, ObjectInfo], options: StoreOptions, force: bool, on_done,
                   sizes: str | None = None) -> None:
    await list_entries(entries, listed, options)

    async def one(entry: ShardEntry) -> None:
        store = store_for(entry.url, options)
        beside = listed.get(entry.url + INDEX_SUFFIX)
        index = await index_from_object(entry, beside, store) if beside is not None and not force else None
        if index is not None and sizes is not None and (index.sizes is None or index.sizes.field != sizes):
            index = None  # the sizes need the shard's bytes: it is read whole, and indexed with them
        if index is None:
            index = await build_index_async(entry, store, sizes=sizes)
            await asyncio.to_thread(store.write, entry.url + INDEX_SUFFIX, index.to_bytes())
        entry.index, entry.samples = index, len(index)
        if sizes is not None:
            entry.size_counts = index.size_counts()
        if on_done is not None:
            on_done(entry)

    await gather_limited([lambda e=e: one(e) for e in entries], SETUP_REQUESTS)


async def update_summary(folder: str, entries: Sequence[ShardEntry], listed: dict[str, ObjectInfo],
                         options: StoreOptions) -> None:
    """Write the folder summary (:data:`SUMMARY_NAME`) of ``folder``: ``entries``, and the shards
    an earlier summary listed that the listing ``listed`` shows unchanged."""
    url = f"{folder}/{SUMMARY_NAME}"
    kept: dict[str, ShardEntry] = {}
    if url in listed:
        for old in await read_summary(url, listed[url], options):
            info = listed.get(old.url)
            if info is not None and (info.size, info.version) == (old.size, old.version):
                kept[old.url] = old
    kept.update((e.url, e) for e in entries)
    text = manifest_json(sorted(kept.values(), key=lambda e: e.url), "hydrax-index", folder)
    await asyncio.to_thread(store_for(url, options).write, url, text.encode("utf-8"))
