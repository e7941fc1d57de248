"""The image sizes of every item of a :class:`~hydrax.shards.ShardSet`, from its shards' indexes.

:meth:`ShardSet.image_sizes <hydrax.shards.ShardSet.image_sizes>` gives ``(widths, heights)``,
one of each per item in item order (int32; 0 x 0 for a sample without the field, or whose header
could not be read), without reading any image where the indexes record them (``hydrax shards
index --sizes FIELD``, ``hydrax shards build --sizes FIELD``; see :mod:`hydrax.shards.sizecolumn`):

- a set of local shards whose set index holds them (every shard's index recorded the same
  field): views of the set index's mapping, no copy;
- otherwise each shard's index is asked (the set index's, or the shard's own ``.hidx`` where it
  is newer; a remote shard's index as set-up found it, else its index object read again, since
  a cached copy may predate the sizes); the columns are joined;
- a local shard whose index lacks them has its image headers read from the shard file (mapped:
  a few bytes of each image), logged once, at INFO, with the command that records them;
- a remote shard whose index lacks them is a :class:`~hydrax.errors.SizesNotRecordedError`
  naming the field and that command: reading its headers would mean reading the shard.

With no field named, the field is the one the indexes recorded (every index that records sizes
must record the same one).
"""

from __future__ import annotations

import copy
import logging
import shlex
from typing import Any, Sequence

import numpy as np

from ..errors import ShardFormatError, SizesNotRecordedError
from .indexfile import ShardIndex, index_path, measure_local_sizes
from .indexsource import index_from_object, keep_index, load_index, load_index_async
from .shardtable import INDEX_SUFFIX, ShardEntry
from .store import ObjectInfo, gather_limited, is_remote, run_async
from .listing import SETUP_REQUESTS
from .router import store_for
from .sizecolumn import SizeColumn

log = logging.getLogger(__name__)


def image_sizes(shards: Any, field: str | None, write_index: bool) -> tuple[np.ndarray, np.ndarray]:
    """``(widths, heights)`` of the items of the ShardSet ``shards`` (see the module docstring);
    ``write_index`` as the ShardSet was made with (whether a remote index read again is cached)."""
    found = shards.set_index
    if found is not None and found.sizes is not None and field in (None, found.sizes.field):
        return found.sizes.widths, found.sizes.heights
    entries = _entries(shards, write_index)
    recorded = [e.index.sizes for e in entries]
    local = [n for n, e in enumerate(entries) if not is_remote(e.url) and (recorded[n] is None or field not in (None, recorded[n].field))]
    for n in local:  # a set index can be older than the shards' own index files
        recorded[n] = _own_sizes(entries[n]) or recorded[n]
    field = field or _recorded_field(recorded, shards.urls)
    columns = [sizes if sizes is not None and sizes.field == field else None for sizes in recorded]
    remote = [n for n, column in enumerate(columns) if column is None and is_remote(entries[n].url)]
    if remote:
        again = run_async(gather_limited([lambda e=entries[n]: _object_column(e, field, shards.options, shards.cache_dir, write_index)
                                          for n in remote], SETUP_REQUESTS))
        lacking = [entries[n].url for n, column in zip(remote, again) if column is None]
        if lacking:
            raise SizesNotRecordedError(
                f"{len(lacking)} of the set's {len(entries)} shards have no image sizes of field {field!r} in their indexes, "
                f"and reading them would read the shards; record them once: {_command(field, lacking, shards.options)}",
                url=lacking[0], field=field, subject=f"image sizes of field {field!r}: ")
        for n, column in zip(remote, again):
            columns[n] = column
    read = [n for n, column in enumerate(columns) if column is None]  # local ones: the remote ones have theirs
    if read:
        for n in read:
            # on a copy: the index held by the set stays as its file has it
            columns[n] = measure_local_sizes(copy.copy(entries[n].index), entries[n].url, field).sizes
        log.info("[hydrax] read the image headers of field %r of %d samples from %d local shard(s) whose indexes lack their "
                 "sizes; record them once: %s", field, sum(len(entries[n].index) for n in read), len(read),
                 _command(field, [entries[n].url for n in read], None))
    widths = np.concatenate([c.widths for c in columns]) if columns else np.zeros(0, np.int32)
    heights = np.concatenate([c.heights for c in columns]) if columns else np.zeros(0, np.int32)
    return widths.astype(np.int32, copy=False), heights.astype(np.int32, copy=False)


def _entries(shards: Any, write_index: bool) -> list[ShardEntry]:
    """Every shard's entry with its index: held ones as they are, a manifest's loaded (remote
    ones many at a time)."""
    entries = [shards.shard_entry(n) for n in range(len(shards.urls))]
    missing = [e for e in entries if e.index is None]
    for entry in missing:
        if not is_remote(entry.url):
            load_index(entry, shards.options, shards.cache_dir, write_index)
    far = [e for e in missing if is_remote(e.url)]
    if far:
        run_async(gather_limited([lambda e=e: load_index_async(e, shards.options, shards.cache_dir, write_index) for e in far],
                                 SETUP_REQUESTS))
    return entries


def _recorded_field(recorded: Sequence[SizeColumn | None], urls) -> str:
    """The one field the indexes record image sizes of, when no field is named."""
    fields = sorted({sizes.field for sizes in recorded if sizes is not None})
    if len(fields) == 1:
        return fields[0]
    what = f"record those of several fields ({', '.join(map(repr, fields))})" if fields else "record none"
    raise SizesNotRecordedError(f"no field named, and the shards' indexes {what}; name the field, as in "
                                "image_sizes('jpg'), or record one: hydrax shards index --sizes FIELD ...",
                                url=urls[0] if len(urls) else None, subject="image sizes: ")


def _own_sizes(entry: ShardEntry) -> SizeColumn | None:
    """The sizes in the index file beside the local shard of ``entry``, when it records some and
    is of the same shard as ``entry.index``."""
    try:
        own = ShardIndex.load(index_path(entry.url))
    except (OSError, ShardFormatError):
        return None
    index = entry.index
    same = (own.shard_size, own.shard_mtime_ns, len(own)) == (index.shard_size, index.shard_mtime_ns, len(index))
    return own.sizes if same else None


async def _object_column(entry: ShardEntry, field: str, options, cache_dir: str, write_index: bool) -> SizeColumn | None:
    """The sizes in the index object beside the remote shard of ``entry``, read again (the index
    at hand may be a cached copy from before they were recorded); it is cached in its place."""
    index = entry.index
    entry.size, entry.version = index.shard_size, entry.version or index.etag  # the version the set reads
    beside = ObjectInfo(entry.url + INDEX_SUFFIX, -1, None, 0)
    fresh = await index_from_object(entry, beside, store_for(entry.url, options))
    if fresh is None or fresh.sizes is None or fresh.sizes.field != field or len(fresh) != len(index):
        return None
    keep_index(fresh, entry, cache_dir, write_index)
    return fresh.sizes


def _command(field: str, urls: Sequence[str], options) -> str:
    """The ``hydrax shards index --sizes`` command for ``urls`` (the first four, when more)."""
    words = ["hydrax", "shards", "index", "--sizes", shlex.quote(field), *(shlex.quote(u) for u in urls[:4])]
    if len(urls) > 4:
        words.append(f"... (all {len(urls)} of them)")
    endpoint = getattr(getattr(options, "s3", None), "endpoint_url", None) if urls and urls[0].startswith("s3://") else None
    if endpoint:
        words += ["--endpoint-url", shlex.quote(endpoint)]
    return " ".join(words)
