"""Pinning ``hf://`` URLs to commits, and keeping the commit a cache was built from.

:func:`pin_url` and :func:`pin_urls` write into URLs the commit their revision points at now
(:meth:`~hydrax.shards.hub.store.HubStore.pin` asks the Hub), so that a branch that moves during a
run changes nothing. :func:`record_revisions` keeps, beside the cached indexes, the commit each
branch pointed at; :func:`check_revisions` finds a later set-up's branch elsewhere and raises
:class:`~hydrax.errors.RevisionMovedError` (see :mod:`hydrax.shards.hub`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os

from ...errors import RevisionMovedError
from ..options import HFOptions
from ..store import scheme_of, write_atomic
from .store import Pin, hub_store
from .url import names_hub, parse_url, with_revision

log = logging.getLogger(__name__)


def pin_url(url: str, options: HFOptions | None = None, pins: dict | None = None) -> str:
    """``url`` at the commit its revision (``main`` when it names none) points at now: one request
    per repository and revision (``pins`` keeps them, and the
    :class:`~hydrax.shards.hub.store.Pin` s, for a set-up); a URL
    pinned to a commit already is returned as it is."""
    if parse_url(url).pinned:  # no store is made for it (nor its settings checked)
        return url
    return hub_store(url, options).pin(url, pins)


def pin_urls(urls, revision: str | None = None, options: HFOptions | None = None, pins: dict | None = None):
    """``urls`` (a URL, pattern or list, as a ShardSet takes them) with every ``hf://`` one pinned
    (see :func:`pin_url`), at ``revision`` where it names none; others are left as they are. A
    ``revision`` with no ``hf://`` URL to apply to is a ValueError."""
    from braceexpand import braceexpand

    if not names_hub(urls):
        if revision is not None:
            raise ValueError(f"revision={revision!r} is for hf:// URLs (the Hugging Face Hub), and none was given")
        return urls
    single = isinstance(urls, (str, os.PathLike))
    specs = [os.fspath(urls)] if single else [os.fspath(u) for u in urls]
    pinned: list[str] = []
    for spec in specs:
        if scheme_of(spec) != "hf":
            pinned.append(spec)
            continue
        for url in braceexpand(spec):
            pinned.append(pin_url(url if revision is None else with_revision(url, revision), options, pins))
    return pinned[0] if single and len(pinned) == 1 else pinned


def record_path(cache_dir: str, pin: Pin) -> str:
    """Where the commit ``pin``'s branch pointed at, when indexes were cached from it, is kept."""
    digest = hashlib.sha256("\n".join((pin.endpoint, pin.root, pin.revision)).encode()).hexdigest()[:32]
    return os.path.join(cache_dir, "hf", digest + ".json")


def check_revisions(pins: dict, cache_dir: str) -> None:
    """Raise :class:`~hydrax.errors.RevisionMovedError` for a branch of ``pins`` that points at
    another commit than the one recorded when indexes were cached from it."""
    for pin in pins.values():
        path = record_path(cache_dir, pin)
        try:
            with open(path, encoding="utf-8") as f:
                recorded = json.load(f)["commit"]
        except FileNotFoundError:
            continue
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("ignoring the damaged revision record %s: %s", path, exc)
            continue
        if recorded != pin.commit:
            raise RevisionMovedError(
                f"{pin.revision!r} of {pin.root} (at {pin.endpoint}) now points at commit {pin.commit}, but the indexes cached in "
                f"{cache_dir} were built from commit {recorded}. Pass revision={recorded!r} to keep reading the data they were built "
                f"from, or delete {path} (or the cache folder) to set up from commit {pin.commit}", url=pin.url,
                subject=f"hf:// shards {pin.url!r}: ", revision=pin.revision, expected=recorded, actual=pin.commit, record=path)


def record_revisions(pins: dict, cache_dir: str) -> None:
    """Record, for each branch of ``pins``, the commit the indexes now cached were built from."""
    for pin in pins.values():
        path = record_path(cache_dir, pin)
        text = json.dumps({"endpoint": pin.endpoint, "repository": pin.root, "revision": pin.revision, "commit": pin.commit,
                           "url": pin.url}, indent=1)
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            write_atomic(path, text.encode("utf-8"))
        except OSError as exc:  # a read-only cache: nothing was cached there either
            log.debug("could not record the commit of %s in %s: %s", pin.url, path, exc)
