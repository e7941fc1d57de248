"""Finding a dataset's shards and their indexes without reading the data.

:func:`expand_urls` turns brace ranges, globs and lists into shard URLs. :func:`resolve` then
gives every shard its size, version and index:

- local shards: ``<shard>.hidx`` beside each (built and written when missing); when every shard
  is local, :func:`resolve_set` gathers them into one set index (:mod:`hydrax.shards.setindex`)
  kept in the cache folder, which later opens of the same, unchanged shards reuse without reading
  any ``.hidx``;
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
  size for, set-up finds it (see :func:`read_checked_manifest`).

A ShardSet holds what is known of its shards compactly, without a Python object per shard: URLs
as a :class:`UrlList` (one byte array), sizes, sample counts and versions as a
:class:`ShardTable` (arrays); :class:`ShardEntry` objects are made on demand.
"""

from __future__ import annotations

import asyncio
import fnmatch
import glob
import hashlib
import json
import logging
import os
import operator
import shlex
import stat
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np

from ..errors import (AccessDeniedError, MissingPermissionError, ObjectChangedError, ObjectNotFoundError, ShardFormatError,
                      StoreError)
from .indexfile import WIDS_KIND, ShardIndex, index_from_bytes, open_index, read_wids_descriptor
from .setindex import SetIndex, build_set_index, set_index_path, urls_digest
from .hub import pin_url, repo_root
from .router import store_for
from .store import (LISTABLE_SCHEMES, REMOTE_SCHEMES, ObjectInfo, StoreOptions, as_store_options, gather_limited, is_remote, local_path,
                    pattern_folder, run_async, scheme_of)

log = logging.getLogger(__name__)

#: Index objects and files sit beside their shard under this suffix.
INDEX_SUFFIX = ".hidx"
#: The folder summary ``hydrax shards index`` writes beside remote shards: a manifest of every
#: indexed shard of the folder, so set-up needs one request per folder instead of one per shard.
SUMMARY_NAME = "hydrax-index.json"
#: Requests in flight while setting up (index objects are small).
SETUP_REQUESTS = 64
#: Whole shards read at once when indexes must be built from them.
BUILD_REQUESTS = 8
#: A set-up that must read more than this many bytes of shards to index them (no index objects,
#: nothing cached) says so once, with the command that writes the index objects.
BUILD_WARNING_BYTES = 256 << 20


def default_cache_dir() -> str:
    """Where indexes of remote shards are kept: ``$HYDRAX_CACHE``, else ``~/.cache/hydrax``."""
    return os.environ.get("HYDRAX_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "hydrax")


@dataclass
class ShardEntry:
    """One shard: its URL, size, version (ETag; None for local files), sample count and index.

    ``index`` is None until loaded (a manifest gives counts first); ``size`` and ``version`` may
    be None too until then.
    """

    url: str
    size: int | None = None
    version: str | None = None
    samples: int | None = None
    index: ShardIndex | None = None
    #: The manifest or folder summary that gave ``samples`` (named when the shard's index disagrees);
    #: where a count came from does not make two entries different.
    counted_by: str | None = field(default=None, compare=False)


class UrlList(Sequence[str]):
    """A list of strings (shard URLs or paths, ETags) held compactly, and read like a list of str.

    All of it is one uint8 array: the count (int64), the ends of the strings (int64, count + 1,
    the first 0), then the strings, UTF-8 (``surrogateescape``, so any path goes through). Pickled
    it is that array: at a megabyte or more, workers started from the fork server map it from
    shared memory (see :mod:`hydrax.procs.pickling`) instead of each holding a Python list of strings.
    ``urls[i]`` gives a new str; a slice, a list of them. It compares equal to a list (or tuple)
    of the same strings, and to a :class:`UrlList` of them.
    """

    __slots__ = ("_data", "_count", "_ends", "_text")

    def __init__(self, strings: Iterable[str] = ()) -> None:
        strings = strings if isinstance(strings, (list, tuple)) else list(strings)
        text = "".join(strings).encode("utf-8", "surrogateescape")
        lengths = list(map(len, strings))
        if len(text) != sum(lengths):  # not a byte per character: encode each
            lengths = [len(s.encode("utf-8", "surrogateescape")) for s in strings]
        count = len(lengths)
        head = 8 * (count + 2)
        data = np.empty(head + len(text), np.uint8)
        numbers = data[:head].view(np.int64)
        numbers[:2] = (count, 0)
        np.cumsum(np.array(lengths, np.int64), out=numbers[2:])
        data[head:] = np.frombuffer(text, np.uint8)
        self._bind(data)

    def _bind(self, data: np.ndarray) -> None:
        self._data = data
        self._count = int(data[:8].view(np.int64)[0])
        head = 8 * (self._count + 2)
        self._ends = data[8:head].view(np.int64)
        self._text = memoryview(data[head:])

    @property
    def nbytes(self) -> int:
        """The size of the list's array in bytes."""
        return self._data.nbytes

    def __len__(self) -> int:
        return self._count

    def __getitem__(self, index):
        if isinstance(index, slice):
            start, stop, step = index.indices(self._count)
            if step != 1:
                return [self[i] for i in range(start, stop, step)]
            return list(self._strings(start, max(start, stop)))
        n = operator.index(index)
        if n < 0:
            n += self._count
        if not 0 <= n < self._count:
            raise IndexError(f"string {index} is out of range for {self._count} strings")
        return str(self._text[self._ends.item(n) : self._ends.item(n + 1)], "utf-8", "surrogateescape")

    def may_contain(self, text: str) -> bool:
        """False when no string contains ``text`` (True may also mean that two adjacent ones
        make it up): a quick test before looking at every string."""
        return text.encode("utf-8", "surrogateescape") in self._text.tobytes()

    def _strings(self, start: int, stop: int) -> Iterator[str]:
        ends, text = self._ends[start : stop + 1].tolist(), self._text
        for a, b in zip(ends, ends[1:]):
            yield str(text[a:b], "utf-8", "surrogateescape")

    def __iter__(self) -> Iterator[str]:
        return self._strings(0, self._count)

    def __eq__(self, other) -> bool:
        if isinstance(other, UrlList):
            return self._count == other._count and np.array_equal(self._data, other._data)
        if isinstance(other, (list, tuple)):
            return len(other) == self._count and all(a == b for a, b in zip(self, other))
        return NotImplemented

    __hash__ = None  # like a list

    def __getstate__(self):
        return {"data": self._data}

    def __setstate__(self, state) -> None:
        self._bind(state["data"])

    def __repr__(self) -> str:
        if self._count <= 4:
            return f"UrlList({list(self)!r})"
        return f"UrlList([{self[0]!r}, {self[1]!r}, ..., {self[-1]!r}], {self._count} strings, {self.nbytes} bytes)"


class ShardTable:
    """What is known of each shard of a set before its index is loaded, compactly (no Python
    object per shard): :attr:`urls` and :attr:`versions` (ETags; None when no shard has one) as
    :class:`UrlList` s, and one int64 array of the sample counts (as their running sums,
    :attr:`starts`) and the sizes (:attr:`sizes`). A missing size is -1, a missing version ``""``.

    :meth:`entry` makes the :class:`ShardEntry` of one shard, on demand.
    """

    def __init__(self, urls: Sequence[str], sizes: Sequence[int], versions: Sequence[str], samples: Sequence[int],
                 counted_by: str | None = None) -> None:
        #: The manifest or folder summary whose counts these are; None: each remote shard's
        #: folder summary (a set of remote shards whose counts came from their folders' summaries).
        self.counted_by = counted_by
        self.urls = urls if isinstance(urls, UrlList) else UrlList(urls)
        count = len(self.urls)
        if not len(sizes) == len(versions) == len(samples) == count:
            raise ValueError(f"{count} URLs, {len(sizes)} sizes, {len(versions)} versions and {len(samples)} counts")
        numbers = np.empty((2, count + 1), np.int64)  # one array: pickled out of band from ~65,000 shards
        numbers[0, 0] = 0
        np.cumsum(np.asarray(samples, np.int64), out=numbers[0, 1:])
        numbers[1, :count] = np.asarray(sizes, np.int64)
        numbers[1, count] = -1
        self._numbers = numbers
        self.versions = UrlList(versions) if any(versions) else None

    @classmethod
    def from_entries(cls, entries: Sequence[ShardEntry]) -> ShardTable:
        """The table of ``entries`` (each with its sample count)."""
        return cls([e.url for e in entries], [-1 if e.size is None else e.size for e in entries],
                   [e.version or "" for e in entries], [e.samples for e in entries])

    def __len__(self) -> int:
        return len(self.urls)

    @property
    def starts(self) -> np.ndarray:
        """Where each shard's samples begin in the set, and the total (int64, shards + 1)."""
        return self._numbers[0]

    @property
    def sizes(self) -> np.ndarray:
        """Each shard's size in bytes, -1 where unknown (int64)."""
        return self._numbers[1, :-1]

    def version(self, shard: int) -> str | None:
        """The version (ETag) of shard number ``shard``, or None."""
        return None if self.versions is None else self.versions[shard] or None

    def entry(self, shard: int) -> ShardEntry:
        """A new :class:`ShardEntry` of shard number ``shard`` (without its index)."""
        size = self._numbers.item(1, shard)
        url = self.urls[shard]
        return ShardEntry(url, None if size < 0 else size, self.version(shard),
                          self._numbers.item(0, shard + 1) - self._numbers.item(0, shard),
                          counted_by=self.counted_by or summary_url(url))

    def entries(self) -> list[ShardEntry]:
        """Every shard's :class:`ShardEntry`."""
        return [self.entry(n) for n in range(len(self))]


def expand_urls(urls: str | Sequence[str], options: StoreOptions | None = None) -> list[str]:
    """Shard URLs from brace ranges (``train-{0000..0099}.tar``), globs and lists, in order."""
    return [info.url for info in _expand(urls, as_store_options(options))[0]]


def _expand(urls, options: StoreOptions) -> tuple[list[ObjectInfo], dict[str, ObjectInfo]]:
    """(shards, with what a listing said of them where one was made; everything listed)."""
    from braceexpand import braceexpand

    if isinstance(urls, (str, os.PathLike)):
        urls = [os.fspath(urls)]
    expanded: list[ObjectInfo] = []
    listed: dict[str, ObjectInfo] = {}
    pins: dict = {}  # one revision request per repository of the hf:// URLs
    for spec in urls:
        for url in braceexpand(os.fspath(spec)):
            scheme = scheme_of(url)
            if scheme == "hf":
                url = pin_url(url, options.hf, pins)
            if scheme == "file":
                path = local_path(url)
                if glob.has_magic(path):
                    matches = sorted(p for p in glob.glob(path) if not p.endswith(INDEX_SUFFIX))
                    if not matches:
                        raise ObjectNotFoundError("matches no file", url=url, subject=f"shard pattern {url!r} ")
                    expanded += [ObjectInfo(p, -1, None, 0) for p in matches]
                else:
                    expanded.append(ObjectInfo(path, -1, None, 0))
                continue
            if scheme not in REMOTE_SCHEMES:
                raise NotImplementedError(f"shard URL {url!r}: the {scheme}:// scheme is not supported; "
                                          "use local paths, s3://, gs://, http(s):// or hf://")
            if glob.has_magic(url):
                # One listing of the folder serves the pattern and shows the index objects too.
                folder = pattern_folder(url)
                try:
                    found = store_for(url, options).list(folder)
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


def is_manifest(urls) -> bool:
    """Whether ``urls`` names one dataset manifest (a ``.json`` file or object) rather than shards."""
    return isinstance(urls, (str, os.PathLike)) and os.fspath(urls).endswith(".json")


def _open_local(entry: ShardEntry, write_index: bool, missing: str, joint: str) -> ShardIndex:
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


#: Given each shard set-up read whole to index it, while its bytes are still in memory: the
#: shard's entry, its bytes and its new index (a ShardSet cuts them into read-ahead chunks).
BuildSink = Callable[[ShardEntry, Any, ShardIndex], None]
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
    return _resolve_entries(*_expand(urls, options), options, cache_dir, write_index, urls)


def _resolve_entries(shards: list[ObjectInfo], listed: dict[str, ObjectInfo], options: StoreOptions, cache_dir: str,
                     write_index: bool, given, sink_for: SinkFor | None = None, builder: Builder | None = None) -> list[ShardEntry]:
    """:func:`resolve` once ``urls`` (``given``, named in advice) are expanded into ``shards``;
    ``sink_for`` and ``builder`` as :func:`resolve_set` takes them."""
    entries = [ShardEntry(info.url) for info in shards]
    for entry in entries:
        if not is_remote(entry.url):
            entry.index = _open_local(entry, write_index, "does not exist (check the path or pattern)", " ")
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
    shards, listed = _expand(urls, options)
    if any(is_remote(info.url) for info in shards):
        return _resolve_entries(shards, listed, options, cache_dir, write_index, urls, sink_for, builder)
    paths = [info.url for info in shards]
    return UrlList(paths), open_set_index(paths, cache_dir, write_index)


def open_set_index(paths: list[str], cache_dir: str, write_index: bool = True) -> SetIndex:
    """The set index of the local shards ``paths``: the one kept in ``cache_dir`` while every
    shard has the size and modification time it recorded; else (none, a damaged one, or a shard
    that changed, said in the log) built from the shards' own indexes (see
    :func:`~hydrax.shards.open_index`) and, with ``write_index``, kept in ``cache_dir``."""
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
        why = "it was made for other shards" if found.digest != digest else found.changed(paths)
        if why is None:
            return found
        log.info("rebuilding the set index %s of %d shards: %s", path, len(paths), why)
    indexes = [_open_local(ShardEntry(p), write_index, "does not exist (check the path or pattern)", " ") for p in paths]
    return build_set_index(indexes, digest, path if write_index else None)


async def _resolve_remote(entries: list[ShardEntry], listed: dict[str, ObjectInfo], options: StoreOptions,
                          cache_dir: str, write_index: bool, given=None, sink_for: SinkFor | None = None,
                          builder: Builder | None = None) -> None:
    """Give the remote ``entries`` their sizes, versions and indexes (or counts, from a folder
    summary); ``given``, the URLs as the caller wrote them, goes into advice; ``sink_for`` and
    ``builder`` as :func:`resolve_set` takes them."""
    await _list_entries(entries, listed, options)
    # A folder summary written by `hydrax shards index` gives the sample counts of every shard it
    # lists in one request; their indexes then load when first read. The rest read index objects.
    summaries = sorted({summary_url(e.url) for e in entries} & set(listed))
    counted: dict[str, ShardEntry] = {}
    for found in await gather_limited([lambda u=u: _read_summary(u, listed[u], options) for u in summaries], SETUP_REQUESTS):
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
    known = await gather_limited([lambda e=e: _known_index(e, listed, options, cache_dir, write_index) for e in unindexed],
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
                _keep(index, entry, cache_dir, write_index)
                entry.index, entry.samples = index, len(index)
        building = [entry for entry, index in zip(building, built) if index is None]
    await gather_limited([lambda e=e: _index_entry(e, options, cache_dir, write_index, sink) for e in building], SETUP_REQUESTS)


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
    schemes = sorted({scheme_of(entry.url) for entry in building})
    if not set(schemes) <= {"s3", "gs"}:  # hydrax writes index objects only into buckets
        return (f"put an index file <shard>{INDEX_SUFFIX} beside each shard where they are served from (hydrax shards index "
                "writes them beside a local copy), and set-up reads only the indexes")
    patterns = [given] if isinstance(given, (str, os.PathLike)) else list(given or [])
    patterns = [os.fspath(p) for p in patterns if is_remote(os.fspath(p))]
    if not patterns or len(patterns) > 4:  # a long list of URLs: the shards to index, the first of them
        patterns = list(dict.fromkeys(entry.url for entry in building))
    words = ["hydrax", "shards", "index", *(shlex.quote(p) for p in patterns[:4])]
    if len(patterns) > 4:
        words.append(f"... (all {len(patterns)} of them; a brace list such as train-{{00..31}}.tar names many at once)")
    endpoint = getattr(options.for_scheme(schemes[0]), "endpoint_url", None)
    if endpoint:
        words += ["--endpoint-url", shlex.quote(endpoint)]
    return (f"write their index objects once (this needs write access to the bucket), and set-ups then read only the "
            f"indexes: {' '.join(words)}")


async def _list_entries(entries: list[ShardEntry], listed: dict[str, ObjectInfo], options: StoreOptions) -> None:
    """Give ``entries`` their sizes and versions: one LIST per folder (not a HEAD per shard; the
    listing, added to ``listed``, also shows index objects and summaries), a HEAD each where a
    store cannot list, or where the credentials may not list it (a bucket that grants
    s3:GetObject but not s3:ListBucket). In that case the folder summary is looked for by name
    (a HEAD per folder), and each shard's index object is added to ``listed`` as a guess, to be
    read if it is there, as for a store that cannot list."""
    folders = sorted({_folder(e.url) for e in entries if e.url not in listed and scheme_of(e.url) in LISTABLE_SCHEMES})
    try:
        found, refused = await _list_folders(folders, options)
    except StoreError as exc:
        first = next(e.url for e in entries if e.url.startswith(exc.url or ""))
        raise type(exc)(str(exc), url=first, subject=f"shard {first!r}: ") from exc
    listed.update((info.url, info) for info in found)
    unlisted = list(dict.fromkeys(e.url for e in entries if e.url not in listed
                                  and (scheme_of(e.url) not in LISTABLE_SCHEMES or _folder(e.url) in refused)))
    if refused:
        _note_refused(refused, sum(1 for url in unlisted if _folder(url) in refused))
        await _find_summaries(list(refused), listed, options)
        for url in unlisted:
            if _folder(url) in refused:
                listed.setdefault(url + INDEX_SUFFIX, ObjectInfo(url + INDEX_SUFFIX, -1, None, 0))
    heads = await gather_limited([lambda u=u: _head_shard(u, options, _folder(u) in refused) for u in unlisted], SETUP_REQUESTS)
    listed.update((info.url, info) for info in heads)
    for entry in entries:
        info = listed.get(entry.url)
        if info is None:
            raise ObjectNotFoundError("does not exist; check the bucket and key", url=entry.url, subject=f"shard {entry.url!r} ")
        entry.size, entry.version = info.size, info.version


def _folder(url: str) -> str:
    """The folder (ending in ``/``) that holds the object ``url``: what set-up lists."""
    return url.rsplit("/", 1)[0] + "/"


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
    try:
        return await store_for(url, options).stat_async(url)
    except MissingPermissionError as exc:
        if not unlisted or scheme_of(url) != "s3":
            raise
        raise exc._replace(detail=f"{exc.detail}; to credentials that may not list the bucket (s3:ListBucket), S3 answers "
                                  "a request for an object that does not exist with access denied too: check the key") from exc


async def _read_summary(url: str, info: ObjectInfo, options: StoreOptions) -> list[ShardEntry]:
    try:
        data = await store_for(url, options).read_async(url, version=info.version)
        return manifest_entries(json.loads(bytes(data).decode("utf-8")), url.rsplit("/", 1)[0], url)
    except (ObjectNotFoundError, ShardFormatError, ValueError, TypeError, AttributeError, KeyError, RecursionError) as exc:
        # a damaged or foreign summary: the index objects still serve
        log.warning("ignoring the folder summary %s: %s", url, exc)
        return []


async def _list_async(folder: str, options: StoreOptions) -> list[ObjectInfo]:
    return await asyncio.to_thread(store_for(folder, options).list, folder)


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


def _keep(index: ShardIndex, entry: ShardEntry, cache_dir: str, write_index: bool) -> None:
    if not write_index:
        return
    path = cache_path(cache_dir, entry.url)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    try:
        index.save(path)
    except OSError:
        pass  # a read-only cache: fetch again next time


_build_slots = None


async def _index_entry(entry: ShardEntry, options: StoreOptions, cache_dir: str, write_index: bool,
                       sink: BuildSink | None = None) -> None:
    """Give ``entry`` its index, built from the shard's bytes (see :func:`_built_index`), and sample count."""
    entry.index = await _built_index(entry, options, cache_dir, write_index, sink)
    entry.samples = len(entry.index)


async def _entry_index(entry: ShardEntry, listed: dict[str, ObjectInfo], options: StoreOptions, cache_dir: str,
                       write_index: bool) -> ShardIndex:
    """The index of the remote shard ``entry``: the local cache, else the index object beside it, else built."""
    index = await _known_index(entry, listed, options, cache_dir, write_index)
    return index if index is not None else await _built_index(entry, options, cache_dir, write_index)


async def _known_index(entry: ShardEntry, listed: dict[str, ObjectInfo], options: StoreOptions, cache_dir: str,
                       write_index: bool) -> ShardIndex | None:
    """The index of the remote shard ``entry`` that costs no read of its data: the local cache,
    else the index object beside it (``listed`` shows it; where the store cannot list, it is
    tried); None when there is none to use."""
    index = _cached(entry, cache_dir)
    if index is None:
        beside = listed.get(entry.url + INDEX_SUFFIX)
        if beside is None and scheme_of(entry.url) not in LISTABLE_SCHEMES:
            beside = ObjectInfo(entry.url + INDEX_SUFFIX, -1, None, 0)  # cannot list: try it
        index = await _index_from_object(entry, beside, store_for(entry.url, options)) if beside is not None else None
        if index is not None:
            _keep(index, entry, cache_dir, write_index)
    return index


async def _built_index(entry: ShardEntry, options: StoreOptions, cache_dir: str, write_index: bool,
                       sink: BuildSink | None = None) -> ShardIndex:
    """The index of the remote shard ``entry``, built from its bytes (read whole, then given to
    ``sink`` with the index), and cached."""
    index = await build_index_async(entry, store_for(entry.url, options), sink)
    _keep(index, entry, cache_dir, write_index)
    return index


async def _index_from_object(entry: ShardEntry, beside: ObjectInfo, store) -> ShardIndex | None:
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


async def build_index_async(entry: ShardEntry, store, sink: BuildSink | None = None) -> ShardIndex:
    """The index of the remote shard ``entry``, read whole from ``store`` (at most
    :data:`BUILD_REQUESTS` at once per event loop); ``sink`` is given its bytes with it."""
    global _build_slots
    loop = asyncio.get_running_loop()
    if _build_slots is None or _build_slots[0] is not loop:
        _build_slots = (loop, asyncio.Semaphore(BUILD_REQUESTS))
    async with _build_slots[1]:
        data = await store.read_async(entry.url, version=entry.version)
    if len(data) != entry.size:
        raise ObjectChangedError(f"listed with {entry.size} bytes, read {len(data)}", url=entry.url, subject=f"shard {entry.url!r}: ")
    index = index_from_bytes(data, entry.url, entry.size, 0, entry.version)
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
    index = _open_local(entry, write_index, f"listed in the {_listing_kind(entry.counted_by or '')}, does not exist", ", ")
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


def summary_url(url: str) -> str:
    """The folder summary (:data:`SUMMARY_NAME`) of the folder that holds ``url``."""
    return url.rsplit("/", 1)[0] + "/" + SUMMARY_NAME


def _listing_kind(url: str) -> str:
    """What lists shards at ``url``: ``"folder summary"`` (:data:`SUMMARY_NAME`) or ``"manifest"``."""
    return "folder summary" if url.endswith("/" + SUMMARY_NAME) else "manifest"


def _check_count(entry: ShardEntry, index: ShardIndex) -> None:
    if entry.samples is None or len(index) == entry.samples:
        return
    source = entry.counted_by or "the manifest"
    if _listing_kind(source) == "folder summary":
        raise ShardFormatError(f"the folder summary {source} says {entry.samples} samples, its index has {len(index)}; "
                               f"rebuild it (hydrax shards index {source.rsplit('/', 1)[0]}/)", url=entry.url)
    raise ShardFormatError(f"the manifest {source} says {entry.samples} samples, its index has {len(index)}; "
                           "rewrite the manifest (hydrax shards index --manifest)", url=entry.url)


# ---------------------------------------------------------------------------------------------
# Manifests


def read_manifest(url: str, options: StoreOptions | None = None) -> list[ShardEntry]:
    """The shards of a wids ``wids-shard-index-v1`` descriptor at ``url`` (a path or remote URL).

    Each shardlist entry gives ``url`` and ``nsamples``; hydrax also reads ``filesize`` and its
    own ``etag`` when present. Relative shard URLs are resolved against the descriptor's
    ``base``, else its own folder. (:func:`read_manifest_table` gives them compactly.) Counts are
    checked against the sizes the descriptor gives; :func:`read_checked_manifest` (what a
    ShardSet reads) also finds the sizes it does not give.
    """
    return read_manifest_table(url, options).entries()


def read_manifest_table(url: str, options: StoreOptions | None = None) -> ShardTable:
    """:func:`read_manifest` as a :class:`ShardTable`: no Python object per shard."""
    options = options or StoreOptions()
    try:
        if is_remote(url):
            raw = bytes(store_for(url, options).read(url))
            folder = url.rsplit("/", 1)[0]
        else:
            with open(local_path(url), "rb") as f:
                raw = f.read()
            folder = os.path.dirname(os.path.abspath(local_path(url)))
        descriptor = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ShardFormatError(f"not a JSON dataset manifest ({exc})", url=url) from exc
    except RecursionError:  # JSON nested deeper than Python's stack: no manifest is
        raise ShardFormatError("not a dataset manifest (its JSON is nested too deeply to read); rewrite it "
                               "(hydrax shards index --manifest writes one)", url=url) from None
    except FileNotFoundError as exc:
        raise ObjectNotFoundError("does not exist", url=url, subject=f"manifest {url!r} ") from exc
    except StoreError:
        raise
    except OSError as exc:  # a folder, no permission
        raise StoreError(f"cannot be read ({exc.strerror or exc}); check the path", url=url, subject=f"manifest {url!r}: ") from exc
    table = manifest_table(descriptor, folder, url)
    if not len(table):
        raise ShardFormatError("the manifest lists no shards", url=url)
    return table


#: The most samples a listing may claim, in all, for shards that set-up cannot find: their sizes,
#: and so their counts, cannot be checked (reading them fails anyway, as it always has), and this
#: bounds the orders those counts size (8 bytes a sample: 8 MiB).
UNCHECKED_SAMPLES = 1 << 20


def read_checked_manifest(url: str, options: StoreOptions | None = None) -> ShardTable:
    """:func:`read_manifest_table`, with every count checked against its shard's size before
    anything is sized by it (what a ShardSet opens).

    A manifest that gives a shard's size (hydrax's do) is checked as it is read. For the shards
    it gives no size for (other wids writers, a damaged ``filesize``), set-up finds it: a ``stat``
    per local shard, one LIST per folder of ``s3://`` and ``gs://`` shards, a HEAD per
    ``http(s)://`` shard (as for shards named directly). Those it cannot find may claim at most
    :data:`UNCHECKED_SAMPLES` in all; their reads fail as before, when first made.
    """
    options = as_store_options(options)
    table = read_manifest_table(url, options)
    unsized = np.flatnonzero(table.sizes < 0).tolist()
    return _sized_table(table, unsized, url, options) if unsized else table


def _sized_table(table: ShardTable, unsized: list[int], where: str, options: StoreOptions) -> ShardTable:
    """``table`` after checking the counts of shards ``unsized`` against their sizes, found now;
    remote shards keep the size and version found (their reads are pinned to it), local ones
    are tied to their files as ever, by their indexes."""
    urls = [table.urls[i] for i in unsized]
    distinct = list(dict.fromkeys(urls))  # a shard listed many times is asked about once
    found = {url: _stat_listed(url, where) for url in distinct if not is_remote(url)}
    remote = [url for url in distinct if is_remote(url)]
    if remote:
        found.update(run_async(_stat_remote(remote, where, options)))
    counts = np.diff(table.starts)
    checked, sizes = table.sizes.copy(), table.sizes.copy()
    versions = list(table.versions) if table.versions is not None else [""] * len(table)
    missing = []
    for shard, url in zip(unsized, urls):
        info = found[url]
        if info is None:
            missing.append(shard)
            continue
        checked[shard] = info.size
        if is_remote(url):
            sizes[shard], versions[shard] = info.size, versions[shard] or info.version or ""
    _check_claims(counts, checked, table.urls, where)
    unchecked = sum(int(counts[shard]) for shard in missing)
    if unchecked > UNCHECKED_SAMPLES:
        first = next(shard for shard in missing if counts[shard])
        url, kind = table.urls[first], _listing_kind(where)
        raise ObjectNotFoundError(f"listed in the {kind} {where} with {int(counts[first])} samples, does not exist; the {kind} "
                                  f"claims {unchecked} samples of shards that cannot be found, more than the {UNCHECKED_SAMPLES} "
                                  f"set-up lets go unchecked: restore the shards or rewrite the {kind}", url=url,
                                  subject=f"shard {url!r:.300} ")
    if not remote:
        return table
    return ShardTable(table.urls, sizes, versions, counts, counted_by=table.counted_by)


def _stat_listed(url: str, where: str) -> ObjectInfo | None:
    """The size of the local shard ``url`` a listing names, or None when it is not there."""
    try:
        found = os.stat(url)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        kind = AccessDeniedError if isinstance(exc, PermissionError) else StoreError
        raise kind(f"listed in the {_listing_kind(where)} {where}, cannot be read ({exc.strerror or exc}); fix the entry or "
                   "the file", url=url, subject=f"shard {url!r:.300}: ") from None
    if not stat.S_ISREG(found.st_mode):  # a folder, a device, a pipe: reading one would fail, or wait forever
        raise ShardFormatError(f"the {_listing_kind(where)} lists {url!r:.300}, which is not a file (a shard is a tar file); "
                               "fix the entry", url=where)
    return ObjectInfo(url, found.st_size, None, found.st_mtime_ns)


async def _stat_remote(urls: list[str], where: str, options: StoreOptions) -> dict[str, ObjectInfo | None]:
    """Size and version of each remote shard of ``urls`` (None where it is not there): a LIST per
    folder where the store can list and the credentials may, else a HEAD each."""
    folders = sorted({_folder(url) for url in urls if scheme_of(url) in LISTABLE_SCHEMES})

    async def head(url: str, unlisted: bool) -> ObjectInfo | None:
        try:
            return await _head_shard(url, options, unlisted)
        except ObjectNotFoundError:
            return None

    try:
        listing, refused = await _list_folders(folders, options)
        heads = [url for url in urls if scheme_of(url) not in LISTABLE_SCHEMES or _folder(url) in refused]
        if refused:
            _note_refused(refused, sum(1 for url in heads if _folder(url) in refused))
        infos = await gather_limited([lambda u=u: head(u, _folder(u) in refused) for u in heads], SETUP_REQUESTS)
    except StoreError as exc:  # say which listing sent set-up there
        raise exc._replace(detail=f"{exc.detail} (finding the size of a shard the {_listing_kind(where)} {where} lists)") from exc
    found = {info.url: info for info in listing}
    found.update(zip(heads, infos))
    return {url: found.get(url) for url in urls}


def manifest_entries(descriptor, folder: str, url: str) -> list[ShardEntry]:
    """The shards a parsed wids descriptor lists (relative URLs resolved against ``folder``)."""
    return manifest_table(descriptor, folder, url).entries()


def manifest_table(descriptor, folder: str, url: str) -> ShardTable:
    """:func:`manifest_entries` as a :class:`ShardTable`."""
    if not isinstance(descriptor, dict):
        raise ShardFormatError(f"not a {WIDS_KIND} descriptor (a JSON object is needed)", url=url)
    pairs = read_wids_descriptor(descriptor, folder, where=url)
    sizes, etags = [], []
    for raw_entry in descriptor.get("shardlist", []):
        # hydrax's own additions: a damaged one only costs the check it allows
        size = raw_entry.get("filesize")
        etag = raw_entry.get("etag")
        sizes.append(size if type(size) is int and 0 <= size < 1 << 62 else -1)
        etags.append(etag if isinstance(etag, str) else "")
    urls, counts = [u for u, _ in pairs], [c for _, c in pairs]
    _check_origins(urls, url)
    _check_claims(counts, sizes, urls, url)
    return ShardTable(urls, sizes, etags, counts, counted_by=url)


def _origin(url: str) -> str:
    """``scheme://bucket`` (or host) of a remote URL; ``hf://datasets/ORG/NAME`` for the Hub's."""
    scheme, _, rest = url.partition("://")
    if scheme.lower() == "hf":
        try:
            return repo_root(url).lower()
        except ValueError:
            return url
    return scheme.lower() + "://" + rest.split("/", 1)[0]


#: The longest remote shard URL a listing may give, in bytes: S3 and GCS keys take at most 1,024,
#: HTTP servers commonly refuse request lines past 8 KiB, and the HTTP client panics (a Rust
#: panic, printed with its backtrace) on a URL past 64 KiB.
MAX_URL_BYTES = 8192


def _check_origins(urls: Sequence[str], where: str) -> None:
    """Refuse shards a listing may not name: any of an unknown scheme, or no URL a store takes;
    and, for a listing in an object store, any outside its own bucket (a local path such as
    /etc/passwd, another store), which a listing in someone else's bucket could otherwise make
    this process open."""
    remote = is_remote(where)
    home = _origin(where) if remote else None
    kind = _listing_kind(where)
    for number, shard in enumerate(urls):
        scheme = scheme_of(shard)
        unsupported = scheme != "file" and scheme not in REMOTE_SCHEMES
        if remote and not unsupported and (scheme == "file" or _origin(shard) != home):
            raise ShardFormatError(f"the {kind} lists shard {number}, {shard!r:.200}, outside its own store {home}/: a {kind} "
                                   "in an object store may name only shards of its bucket (relative keys or its own URLs)",
                                   url=where)
        problem = None if scheme == "file" else _url_problem(shard, scheme)
        if problem:
            raise ShardFormatError(f"the {kind} lists shard {number}, {shard!r:.200}, {problem}; fix the entry", url=where)


def _url_problem(url: str, scheme: str) -> str | None:
    """What keeps the remote ``url`` from naming an object, or None."""
    if scheme not in REMOTE_SCHEMES:
        return f"of the unsupported {scheme:.40}:// scheme (local paths, s3://, gs://, http(s):// and hf:// are)"
    try:
        size = len(url.encode("utf-8"))
    except UnicodeEncodeError:  # undecodable bytes of a path (surrogateescape): no key is made of them
        return "which holds text no store takes (it is not UTF-8)"
    if size > MAX_URL_BYTES:
        return f"a URL of {size} bytes, longer than any store takes (at most {MAX_URL_BYTES} here)"
    if not all(url.split("://", 1)[1].partition("/")[::2]):
        return f"which names no object (a shard URL is {scheme}://bucket-or-host/key)"
    return None


#: The fewest bytes a sample takes in a tar: one member's 512-byte header (an empty payload).
MIN_SAMPLE_BYTES = 512


def _check_claims(counts: Sequence[int], sizes: Sequence[int], urls: Sequence[str], where: str) -> None:
    """Refuse a listing that claims more samples for a shard than its size can hold: a forged or
    corrupted count would otherwise size the run's orders (10**8 samples for a small shard once
    took 9.6 GB) long before the shard's own index could contradict it. Shards of unknown size
    (-1) are left to :func:`read_checked_manifest`; but no set of shards holds 2**62 samples, and
    their running sums must fit an int64, so a total beyond that is refused whatever the sizes."""
    counts_array, sizes_array = np.asarray(counts, np.int64), np.asarray(sizes, np.int64)
    impossible = np.flatnonzero((sizes_array >= 0) & (counts_array > sizes_array // MIN_SAMPLE_BYTES))
    if len(impossible):
        i = int(impossible[0])
        size = int(sizes_array[i])
        raise ShardFormatError(f"the {_listing_kind(where)} says shard {urls[i]:.300} holds {int(counts_array[i])} samples, more than "
                               f"its {size} bytes can hold (at most {size // MIN_SAMPLE_BYTES}: every sample takes a "
                               f"{MIN_SAMPLE_BYTES}-byte tar header); rewrite it (hydrax shards index)", url=where)
    total = sum(counts_array.tolist())  # Python ints: an int64 sum could wrap
    if total >= 1 << 62:
        raise ShardFormatError(f"the {_listing_kind(where)} claims {total} samples in all, more than any set of shards holds "
                               "(each takes a tar header); rewrite it (hydrax shards index)", url=where)


def manifest_json(entries: Sequence[ShardEntry], name: str = "dataset", base: str | None = None) -> str:
    """A wids ``wids-shard-index-v1`` descriptor listing ``entries`` (URLs relative to ``base`` when under it)."""
    shardlist = []
    for entry in entries:
        url = entry.url
        if base and url.startswith(base.rstrip("/") + "/"):
            url = url[len(base.rstrip("/")) + 1:]
        item = {"url": url, "nsamples": int(entry.samples if entry.samples is not None else len(entry.index))}
        if entry.size is not None:
            item["filesize"] = int(entry.size)
        if entry.version is not None:
            item["etag"] = entry.version
        shardlist.append(item)
    return json.dumps({"__kind__": WIDS_KIND, "wids_version": 1, "name": name, "shardlist": shardlist}, indent=1) + "\n"


def write_manifest(entries: Sequence[ShardEntry], url: str, options: StoreOptions | None = None) -> None:
    """Write a manifest of ``entries`` to ``url`` (a path or remote URL), atomically; shard URLs
    in the manifest's folder are written relative to it."""
    base = url.rsplit("/", 1)[0] if is_remote(url) else os.path.dirname(os.path.abspath(local_path(url)))
    text = manifest_json(entries, os.path.basename(url).rsplit(".", 1)[0], base)
    try:
        store_for(url, options).write(url, text.encode("utf-8"))
    except StoreError:
        raise
    except OSError as exc:
        raise StoreError(str(exc), url=url, subject=f"manifest {url!r}: ") from exc


# ---------------------------------------------------------------------------------------------
# Index objects in the bucket


def publish_indexes(urls, options: StoreOptions | None = None, *, force: bool = False,
                    on_done=None, summary: bool = True) -> list[ShardEntry]:
    """Write an index object ``<shard>.hidx`` beside every remote shard of ``urls`` that lacks a
    current one (all of them with ``force``), building the indexes concurrently; returns the
    shards with their indexes. ``on_done(entry)`` is called as each shard is done (a progress bar).
    ``summary=False`` leaves the folder summaries alone, for a caller that indexes a folder in
    parts and writes them once with :func:`write_summaries`."""
    options = options or StoreOptions()
    shards, listed = _expand(urls, options)
    entries = [ShardEntry(info.url) for info in shards]
    local = [e.url for e in entries if not is_remote(e.url)]
    if local:
        raise ValueError(f"index objects are for remote shards; {local[0]!r} is local (use hydrax shards index for it)")
    run_async(_publish(entries, listed, options, force, on_done))
    if summary:
        run_async(_summarise(entries, listed, options))
    return entries


def write_summaries(entries: Sequence[ShardEntry], options: StoreOptions | None = None) -> None:
    """Add ``entries`` (with their sizes, versions and sample counts) to the summaries of their
    folders in object storage, listing each folder once; local shards need none."""
    options = options or StoreOptions()
    listed: dict[str, ObjectInfo] = {}
    for folder in {e.url.rsplit("/", 1)[0] for e in entries if scheme_of(e.url) in ("s3", "gs")}:
        listed.update((info.url, info) for info in store_for(folder, options).list(folder + "/"))
    run_async(_summarise(list(entries), listed, options))


async def _summarise(entries: list[ShardEntry], listed: dict[str, ObjectInfo], options: StoreOptions) -> None:
    folders: dict[str, list[ShardEntry]] = {}
    for entry in entries:
        folders.setdefault(entry.url.rsplit("/", 1)[0], []).append(entry)
    for folder, done in folders.items():
        if scheme_of(folder) in ("s3", "gs"):
            await update_summary(folder, done, listed, options)


async def _publish(entries: list[ShardEntry], listed: dict[str, ObjectInfo], options: StoreOptions, force: bool, on_done) -> None:
    await _list_entries(entries, listed, options)

    async def one(entry: ShardEntry) -> None:
        store = store_for(entry.url, options)
        beside = listed.get(entry.url + INDEX_SUFFIX)
        index = await _index_from_object(entry, beside, store) if beside is not None and not force else None
        if index is None:
            index = await build_index_async(entry, store)
            await asyncio.to_thread(store.write, entry.url + INDEX_SUFFIX, index.to_bytes())
        entry.index, entry.samples = index, len(index)
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
        for old in await _read_summary(url, listed[url], options):
            info = listed.get(old.url)
            if info is not None and (info.size, info.version) == (old.size, old.version):
                kept[old.url] = old
    kept.update((e.url, e) for e in entries)
    text = manifest_json(sorted(kept.values(), key=lambda e: e.url), "hydrax-index", folder)
    await asyncio.to_thread(store_for(url, options).write, url, text.encode("utf-8"))
