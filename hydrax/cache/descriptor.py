"""A cache's descriptor, ``cache.json``: its text, and checking (or creating) a cache by it.

The descriptor says which batches a cache holds (the ``hydrax-cache-v1`` fields: data length,
batch size, seed, shuffle modes and where each array lies in a batch); its text is hydrax 0.2.2's,
byte for byte, and a run opens a cache only when the descriptor it finds is exactly the one it
would write (:func:`prepare_location`).
"""

from __future__ import annotations

import json
import os
from typing import Any, Iterable, Mapping

from ..errors import CacheLocationError, CacheMismatchError, CacheNotFoundError
from .files import remove_stale_temporaries

#: The descriptor's file name in a cache directory.
DESCRIPTOR = "cache.json"
#: The descriptor's ``_type``.
CACHE_TYPE = "hydrax-cache-v1"


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
