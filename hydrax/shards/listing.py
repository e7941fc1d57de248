"""Finding shards and what lies beside them: patterns expanded, one LIST per folder, a HEAD where none.

:func:`find_shards` turns brace ranges, globs and lists into shard URLs (a remote pattern is
matched against one listing of its folder). :func:`list_entries` gives remote shards their sizes
and versions with one LIST per folder, which also shows the index objects and folder summaries
beside them; where a store cannot list, or the credentials may not, it sends a HEAD per shard and
looks for the summaries by name. What a store can do is asked of the store
(:attr:`~hydrax.shards.store.Store.listable`, ...), never read from the URL's scheme.
"""

from __future__ import annotations

import asyncio
import fnmatch
import glob
import logging
import os
from typing import Sequence

from ..errors import MissingPermissionError, ObjectNotFoundError, StoreError
from .options import StoreOptions, as_store_options
from .router import store_for
from .shardtable import INDEX_SUFFIX, SUMMARY_NAME, ShardEntry, listing_kind
from .store import ObjectInfo, gather_limited, is_local, is_remote, local_path, pattern_folder, scheme_of

log = logging.getLogger(__name__)

#: Requests in flight while setting up (index objects are small).
SETUP_REQUESTS = 64


def expand_urls(urls: str | Sequence[str], options: StoreOptions | None = None) -> list[str]:
    """Shard URLs from brace ranges (``train-{0000..0099}.tar``), globs and lists, in order."""
    return [info.url for info in find_shards(urls, as_store_options(options))[0]]


def find_shards(urls, options: StoreOptions) -> tuple[list[ObjectInfo], dict[str, ObjectInfo]]:
    """(shards, with what a listing said of them where one was made; everything listed)."""
    from braceexpand import braceexpand

    if isinstance(urls, (str, os.PathLike)):
        urls = [os.fspath(urls)]
    expanded: list[ObjectInfo] = []
    listed: dict[str, ObjectInfo] = {}
    pins: dict = {}  # one revision request per repository of the hf:// URLs
    for spec in urls:
        for url in braceexpand(os.fspath(spec)):
            if is_local(url):
                path = local_path(url)
                if glob.has_magic(path):
                    matches = sorted(p for p in glob.glob(path) if not p.endswith(INDEX_SUFFIX))
                    if not matches:
                        raise ObjectNotFoundError("matches no file", url=url, subject=f"shard pattern {url!r} ")
                    expanded += [ObjectInfo(p, -1, None, 0) for p in matches]
                else:
                    expanded.append(ObjectInfo(path, -1, None, 0))
                continue
            if not is_remote(url):
                raise NotImplementedError(f"shard URL {url!r}: the {scheme_of(url)}:// scheme is not supported; "
                                          "use local paths, s3://, gs://, http(s):// or hf://")
            store = store_for(url, options)
            url = store.pin(url, pins)  # a revision that may move (a Hub branch): the commit it points at now
            if glob.has_magic(url):
                # One listing of the folder serves the pattern and shows the index objects too.
                folder = pattern_folder(url)
                try:
                    found = store.list(folder)
                except StoreError as exc:  # name the pattern the user gave
                    subject = None if exc.subject is None else exc.subject.replace(repr(folder), repr(url))
                    detail = exc.detail
                    if isinstance(exc, MissingPermissionError):  # explicit URLs need no listing: say so
                        detail += (f"; a pattern is matched by listing its folder, which needs {exc.permission}: without it, "
                                   "name the shards, as explicit URLs or a brace list (train-{00..31}.tar), which need "
                                   "only read access")
                    raise exc._replace(url=url, subject=subject, detail=detail) from exc
                listed.update((info.url, info) for info in found)
                matches = [info for info in found if fnmatch.fnmatchcase(info.url, url) and not info.url.endswith(INDEX_SUFFIX)]
                if not matches:
                    raise ObjectNotFoundError("matches no object", url=url, subject=f"shard pattern {url!r} ")
                expanded += matches
            else:
                expanded.append(ObjectInfo(url, -1, None, 0))
    if not expanded:
        raise ValueError(f"no shards in {urls!r}")
    return expanded, listed


async def list_entries(entries: list[ShardEntry], listed: dict[str, ObjectInfo], options: StoreOptions) -> None:
    """Give ``entries`` their sizes and versions: one LIST per folder (not a HEAD per shard; the
    listing, added to ``listed``, also shows index objects and summaries), a HEAD each where a
    store cannot list, or where the credentials may not list it (a bucket that grants
    s3:GetObject but not s3:ListBucket). In that case the folder summary is looked for by name
    (a HEAD per folder), and each shard's index object is added to ``listed`` as a guess, to be
    read if it is there, as for a store that cannot list."""
    listable = _listable_folders([e.url for e in entries if e.url not in listed], options)
    folders = sorted(listable)
    try:
        found, refused = await _list_folders(folders, options)
    except StoreError as exc:
        first = next(e.url for e in entries if e.url.startswith(exc.url or ""))
        raise type(exc)(str(exc), url=first, subject=f"shard {first!r}: ") from exc
    listed.update((info.url, info) for info in found)
    unlisted = list(dict.fromkeys(e.url for e in entries if e.url not in listed
                                  and (folder_of(e.url) not in listable or folder_of(e.url) in refused)))
    if refused:
        _note_refused(refused, sum(1 for url in unlisted if folder_of(url) in refused))
        await _find_summaries(list(refused), listed, options)
        for url in unlisted:
            if folder_of(url) in refused:
                listed.setdefault(url + INDEX_SUFFIX, ObjectInfo(url + INDEX_SUFFIX, -1, None, 0))
    heads = await gather_limited([lambda u=u: _head_shard(u, options, folder_of(u) in refused) for u in unlisted], SETUP_REQUESTS)
    listed.update((info.url, info) for info in heads)
    for entry in entries:
        info = listed.get(entry.url)
        if info is None:
            raise ObjectNotFoundError("does not exist; check the bucket and key", url=entry.url, subject=f"shard {entry.url!r} ")
        entry.size, entry.version = info.size, info.version


def folder_of(url: str) -> str:
    """The folder (ending in ``/``) that holds the object ``url``: what set-up lists."""
    return url.rsplit("/", 1)[0] + "/"


def _listable_folders(urls: list[str], options: StoreOptions) -> set[str]:
    """The folders of ``urls`` whose stores list a folder in one request (the store is asked
    once per folder: a set may hold many thousand shards of a few folders)."""
    return {folder for folder in {folder_of(url) for url in urls} if store_for(folder, options).listable}


async def _list_folders(folders: Sequence[str], options: StoreOptions) -> tuple[list[ObjectInfo], dict[str, MissingPermissionError]]:
    """Every object of ``folders`` (a LIST each, concurrently), and the folders the credentials
    may not list, each with its refusal: the caller finds their objects by name instead. Any
    other failure is raised."""
    async def one(folder: str) -> list[ObjectInfo] | MissingPermissionError:
        try:
            return await _list_async(folder, options)
        except MissingPermissionError as exc:
            return exc

    results = await gather_limited([lambda f=f: one(f) for f in folders], SETUP_REQUESTS)
    refused = {folder: result for folder, result in zip(folders, results) if isinstance(result, MissingPermissionError)}
    return [info for result in results if not isinstance(result, MissingPermissionError) for info in result], refused


def _note_refused(refused: dict[str, MissingPermissionError], heads: int) -> None:
    """Say once per set-up that listings were refused, and what set-up does instead."""
    folder, refusal = next(iter(refused.items()))
    more, whose = (f" and {len(refused) - 1} more folders", "their") if len(refused) > 1 else ("", "its")
    log.info("listing %s%s was refused (the credentials lack %s): finding the sizes of %s %d shards with a HEAD each, %d at "
             "a time, and each shard's index object by its name; with %s, one LIST per folder would do", folder, more,
             refusal.permission, whose, heads, SETUP_REQUESTS, refusal.permission)


async def _find_summaries(folders: list[str], listed: dict[str, ObjectInfo], options: StoreOptions) -> None:
    """Add the folder summaries of ``folders`` that exist to ``listed`` (a HEAD each), as a
    listing of the folders would have."""
    async def one(folder: str) -> ObjectInfo | None:
        url = folder + SUMMARY_NAME
        try:
            return await store_for(url, options).stat_async(url)
        except (ObjectNotFoundError, MissingPermissionError):
            # none, or S3's 403 for a missing object to credentials that may not list: each
            # shard's index object still serves
            return None

    for info in await gather_limited([lambda f=f: one(f) for f in folders], SETUP_REQUESTS):
        if info is not None:
            listed[info.url] = info


async def _head_shard(url: str, options: StoreOptions, unlisted: bool) -> ObjectInfo:
    """The size and version of the remote shard ``url``, from a HEAD; ``unlisted``: its folder
    could not be listed, so S3's 403 may mean that there is no such object."""
    store = store_for(url, options)
    try:
        return await store.stat_async(url)
    except MissingPermissionError as exc:
        if not unlisted or not store.hides_missing:
            raise
        raise exc._replace(detail=f"{exc.detail}; to credentials that may not list the bucket (s3:ListBucket), S3 answers "
                                  "a request for an object that does not exist with access denied too: check the key") from exc


async def _list_async(folder: str, options: StoreOptions) -> list[ObjectInfo]:
    return await asyncio.to_thread(store_for(folder, options).list, folder)


async def stat_remote(urls: list[str], where: str, options: StoreOptions) -> dict[str, ObjectInfo | None]:
    """Size and version of each remote shard of ``urls`` (None where it is not there): a LIST per
    folder where the store can list and the credentials may, else a HEAD each."""
    listable = _listable_folders(urls, options)
    folders = sorted(listable)

    async def head(url: str, unlisted: bool) -> ObjectInfo | None:
        try:
            return await _head_shard(url, options, unlisted)
        except ObjectNotFoundError:
            return None

    try:
        listing, refused = await _list_folders(folders, options)
        heads = [url for url in urls if folder_of(url) not in listable or folder_of(url) in refused]
        if refused:
            _note_refused(refused, sum(1 for url in heads if folder_of(url) in refused))
        infos = await gather_limited([lambda u=u: head(u, folder_of(u) in refused) for u in heads], SETUP_REQUESTS)
    except StoreError as exc:  # say which listing sent set-up there
        raise exc._replace(detail=f"{exc.detail} (finding the size of a shard the {listing_kind(where)} {where} lists)") from exc
    found = {info.url: info for info in listing}
    found.update(zip(heads, infos))
    return {url: found.get(url) for url in urls}
