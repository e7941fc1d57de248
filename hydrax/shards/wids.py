"""wids dataset descriptors: a JSON list of a dataset's shards with their sample counts.

A ``wids-shard-index-v1`` descriptor (the format of webdataset's ``wids``) names every shard by
URL or by a path relative to its ``base`` (or to the descriptor's own folder), with the number of
samples it holds. A ShardSet made from one sets up with a single request. The descriptor comes
from the user or from a bucket, so every field is checked before anything is sized by it: a bad
one is a :class:`~hydrax.errors.ShardFormatError` naming the descriptor and the entry at fault.
"""

from __future__ import annotations

import json
import os

from ..errors import ShardFormatError

WIDS_KIND = "wids-shard-index-v1"
#: The longest ``base`` a wids descriptor may give, in characters: a path takes at most 4,096
#: bytes (PATH_MAX), an S3 or GCS key 1,024.
MAX_BASE = 4096


def read_wids_descriptor(source: str | dict, base: str | None = None, where: str | None = None) -> list[tuple[str, int]]:
    """``(url, nsamples)`` of every shard of a wids ``wids-shard-index-v1`` descriptor.

    ``source`` is the descriptor's path or its parsed JSON. Relative shard URLs are resolved
    against the descriptor's ``base`` (a relative one against the folder that follows), else
    ``base``, else the descriptor's own folder. A
    descriptor that is not valid raises :class:`~hydrax.shards.ShardFormatError` naming it
    (``where``, default its path) and the entry at fault.
    """
    if isinstance(source, dict):
        descriptor, here = source, base or ""
    else:
        path = os.fspath(source)
        try:
            with open(path, encoding="utf-8") as f:
                descriptor = json.load(f)
        except ValueError as exc:  # UnicodeDecodeError and JSONDecodeError
            raise ShardFormatError(f"not a JSON {WIDS_KIND} descriptor ({exc})", url=path) from None
        except RecursionError:  # JSON nested deeper than Python's stack: no descriptor is
            raise ShardFormatError(f"not a {WIDS_KIND} descriptor (its JSON is nested too deeply to read); rewrite it "
                                   "(hydrax shards index --manifest writes one)", url=path) from None
        here = base or os.path.dirname(os.path.abspath(path))
    where = where or (None if isinstance(source, dict) else os.fspath(source))

    def bad(problem: str) -> ShardFormatError:
        return ShardFormatError(f"{problem}; rewrite the descriptor (hydrax shards index --manifest writes one)",
                                url=where, subject=None if where else "the descriptor: ")

    if not isinstance(descriptor, dict) or descriptor.get("__kind__") != WIDS_KIND or "wids_version" not in descriptor:
        raise bad(f"not a {WIDS_KIND} descriptor (a JSON object with __kind__ {WIDS_KIND!r} and wids_version is needed)")
    root = descriptor.get("base") or here
    if not isinstance(root, str) or "\0" in root or not _nameable(root):
        raise bad(f"its base {root!r:.80} is not a URL or folder")
    if len(root) > MAX_BASE:  # every relative URL gets a copy: 10 MB of base by 1,000 shards is 10 GB
        raise bad(f"its base {root!r:.80} has {len(root)} characters, more than a folder's path or URL takes (at most "
                  f"{MAX_BASE} here)")
    if root[:7].lower() == "file://":  # a local folder (see the shards' file:// URLs below)
        root = root[7:] or here
    if here and root is not here and "://" not in root and not os.path.isabs(root):
        # a relative base is relative to the descriptor, as its shards are: never to the current folder
        root = here.rstrip("/") + "/" + root
    shardlist = descriptor.get("shardlist", [])
    if not isinstance(shardlist, list):
        raise bad(f"its shardlist is {type(shardlist).__name__} {shardlist!r:.80}, not a list of shards")
    shards = []
    for number, entry in enumerate(shardlist):
        if not isinstance(entry, dict) or "url" not in entry or "nsamples" not in entry:
            raise bad(f"shardlist entry {number} needs 'url' and 'nsamples' (it is {entry!r:.80})")
        url, count = entry["url"], entry["nsamples"]
        if isinstance(url, str) and url[:7].lower() == "file://" and "://" not in root:
            # a local path, as in a shard pattern: kept as a URL it would be opened as a path
            # relative to the current folder (``file:/...``); in a remote descriptor it stays a
            # URL, which names no object of its store
            url = url[7:]
        if not isinstance(url, str) or not url.strip() or url.endswith("/") or "\0" in url or not _nameable(url):
            raise bad(f"shardlist entry {number} has url {url!r:.80}, not the URL or path of a shard")
        if type(count) is not int or not 0 <= count < 1 << 62:  # bool is an int, but not a count
            raise bad(f"shardlist entry {number} ({url}) has nsamples {count!r:.80}, not a whole number of samples")
        if root and "://" not in url and not os.path.isabs(url):
            url = root.rstrip("/") + "/" + url
        shards.append((url, count))
    return shards


def _nameable(text: str) -> bool:
    """Whether ``text`` can name a file or object: JSON allows lone surrogates (``"\\ud800"``),
    which no path or URL encodes (those of ``surrogateescape``, undecodable bytes, aside)."""
    try:
        text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return False
    return True
