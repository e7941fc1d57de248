"""Dataset manifests (wids ``wids-shard-index-v1`` descriptors) and folder summaries: read, checked, written.

A manifest lists every shard of a dataset with its sample count (and, when hydrax wrote it, its
size and ETag), so that set-up needs one request; a folder summary (:data:`SUMMARY_NAME`) is one
written beside remote shards. Every count is checked against its shard's size before anything is
sized by it (:func:`read_checked_manifest`), and a listing in an object store may name only
shards of its own bucket or repository.
"""

from __future__ import annotations

import json
import logging
import os
import stat
from typing import Sequence

import numpy as np

from ..errors import AccessDeniedError, ObjectNotFoundError, ShardFormatError, StoreError
from .wids import WIDS_KIND, read_wids_descriptor
from .listing import stat_remote
from .options import StoreOptions, as_store_options
from .router import origin, store_for
from .shardtable import ShardEntry, ShardTable, listing_kind
from .store import ObjectInfo, is_local, is_remote, local_path, run_async, scheme_of

log = logging.getLogger(__name__)


def is_manifest(urls) -> bool:
    """Whether ``urls`` names one dataset manifest (a ``.json`` file or object) rather than shards."""
    return isinstance(urls, (str, os.PathLike)) and os.fspath(urls).endswith(".json")


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
        found.update(run_async(stat_remote(remote, where, options)))
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
        url, kind = table.urls[first], listing_kind(where)
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
        raise kind(f"listed in the {listing_kind(where)} {where}, cannot be read ({exc.strerror or exc}); fix the entry or "
                   "the file", url=url, subject=f"shard {url!r:.300}: ") from None
    if not stat.S_ISREG(found.st_mode):  # a folder, a device, a pipe: reading one would fail, or wait forever
        raise ShardFormatError(f"the {listing_kind(where)} lists {url!r:.300}, which is not a file (a shard is a tar file); "
                               "fix the entry", url=where)
    return ObjectInfo(url, found.st_size, None, found.st_mtime_ns)


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
    home = origin(where) if remote else None
    kind = listing_kind(where)
    for number, shard in enumerate(urls):
        local = is_local(shard)
        unsupported = not local and not is_remote(shard)
        if remote and not unsupported and (local or origin(shard) != home):
            raise ShardFormatError(f"the {kind} lists shard {number}, {shard!r:.200}, outside its own store {home}/: a {kind} "
                                   "in an object store may name only shards of its bucket (relative keys or its own URLs)",
                                   url=where)
        problem = None if local else _url_problem(shard)
        if problem:
            raise ShardFormatError(f"the {kind} lists shard {number}, {shard!r:.200}, {problem}; fix the entry", url=where)


def _url_problem(url: str) -> str | None:
    """What keeps the remote ``url`` from naming an object, or None."""
    scheme = scheme_of(url)
    if not is_remote(url):
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
        raise ShardFormatError(f"the {listing_kind(where)} says shard {urls[i]:.300} holds {int(counts_array[i])} samples, more than "
                               f"its {size} bytes can hold (at most {size // MIN_SAMPLE_BYTES}: every sample takes a "
                               f"{MIN_SAMPLE_BYTES}-byte tar header); rewrite it (hydrax shards index)", url=where)
    total = sum(counts_array.tolist())  # Python ints: an int64 sum could wrap
    if total >= 1 << 62:
        raise ShardFormatError(f"the {listing_kind(where)} claims {total} samples in all, more than any set of shards holds "
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


async def read_summary(url: str, info: ObjectInfo, options: StoreOptions) -> list[ShardEntry]:
    try:
        data = await store_for(url, options).read_async(url, version=info.version)
        return manifest_entries(json.loads(bytes(data).decode("utf-8")), url.rsplit("/", 1)[0], url)
    except (ObjectNotFoundError, ShardFormatError, ValueError, TypeError, AttributeError, KeyError, RecursionError) as exc:
        # a damaged or foreign summary: the index objects still serve
        log.warning("ignoring the folder summary %s: %s", url, exc)
        return []
