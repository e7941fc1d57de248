"""``hf://`` URLs taken apart: :class:`HubURL` and :func:`parse_url`.

``hf://datasets/ORG/NAME[@REVISION]/PATH`` names a file of a dataset repository,
``hf://ORG/NAME/PATH`` (or ``hf://models/...``) one of a model repository; ``@REVISION`` a
branch, tag or commit (see :mod:`hydrax.shards.hub`). Only the grammar lives here: no request,
no setting, so that anything may read a Hub URL without the HTTP client.
"""

from __future__ import annotations

import dataclasses
import os
import re
import urllib.parse
from dataclasses import dataclass

from ..store import scheme_of

#: A commit id: what a pinned URL's revision is.
COMMIT = re.compile(r"[0-9a-f]{40}")

_KINDS = {"datasets": "dataset", "models": "model"}
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


@dataclass(frozen=True)
class HubURL:
    """An ``hf://`` URL taken apart.

    ``kind`` is ``"datasets"`` or ``"models"``; ``written`` the kind as the URL wrote it
    (``"datasets/"``, ``"models/"`` or ``""``); ``revision`` the text after ``@`` (unquoted), or
    None; ``path`` the file, folder or pattern in the repository (``""`` for its root).
    """

    kind: str
    written: str
    repo_id: str
    revision: str | None
    path: str

    @property
    def root(self) -> str:
        """``hf://{kind}/ORG/NAME[@REVISION]``, as written (the revision quoted)."""
        at = "" if self.revision is None else "@" + urllib.parse.quote(self.revision, safe="")
        return f"hf://{self.written}{self.repo_id}{at}"

    @property
    def url(self) -> str:
        return f"{self.root}/{self.path}"

    @property
    def pinned(self) -> bool:
        """Whether the revision is a commit id (which no push moves)."""
        return self.revision is not None and COMMIT.fullmatch(self.revision) is not None

    @property
    def words(self) -> str:
        """``the dataset org/name``."""
        return f"the {_KINDS[self.kind]} {self.repo_id}"

    def at(self, revision: str | None) -> HubURL:
        return dataclasses.replace(self, revision=revision)

    def api(self, endpoint: str) -> str:
        return f"{endpoint}/api/{self.kind}/{self.repo_id}"

    def resolve(self, endpoint: str) -> str:
        """The Hub's URL for the file's bytes (at ``main`` when the URL names no revision)."""
        repo = self.repo_id if self.kind == "models" else f"{self.kind}/{self.repo_id}"
        revision = urllib.parse.quote(self.revision or "main", safe="")
        return f"{endpoint}/{repo}/resolve/{revision}/{urllib.parse.quote(self.path)}"


def parse_url(url: str) -> HubURL:
    """``url`` (``hf://...``) taken apart; a ValueError says what a Hub URL looks like."""
    form = "hf://datasets/ORG/NAME[@REVISION]/PATH (or hf://ORG/NAME/PATH for a model)"
    head, sep, rest = url.partition("://")
    if head.lower() != "hf" or not sep:
        raise ValueError(f"{url!r} is not an hf:// URL; the form is {form}")
    parts = rest.split("/")
    written = ""
    if parts[0] in _KINDS:
        written = parts.pop(0) + "/"
    elif parts[0] == "spaces":
        raise ValueError(f"hf:// URL {url!r}: shards are read from dataset and model repositories, not Spaces")
    if len(parts) < 2:
        raise ValueError(f"hf:// URL {url!r} names no repository; the form is {form}")
    org, (name, at, revision) = parts[0], parts[1].partition("@")
    if not (_NAME.fullmatch(org) and _NAME.fullmatch(name)):
        raise ValueError(f"hf:// URL {url!r}: {org}/{name} is no repository name (a pattern may match files within one repository "
                         f"only); the form is {form}")
    if at and not revision:
        raise ValueError(f"hf:// URL {url!r}: nothing follows '@' (a branch, tag or commit)")
    return HubURL(written[:-1] or "models", written, f"{org}/{name}", urllib.parse.unquote(revision) if at else None,
                  "/".join(parts[2:]))


def with_revision(url: str, revision: str) -> str:
    """``url`` at ``revision`` (a ValueError when the URL names another one)."""
    hub = parse_url(url)
    if hub.revision is not None and hub.revision != revision:
        raise ValueError(f"hf:// URL {url!r} names revision {hub.revision!r}, and revision={revision!r} was given: give one")
    return hub.at(revision).url


def names_hub(urls) -> bool:
    """Whether ``urls`` (a URL, pattern or list, as a ShardSet takes them) holds an ``hf://`` one."""
    specs = [urls] if isinstance(urls, (str, os.PathLike)) else urls
    return any(scheme_of(os.fspath(spec)) == "hf" for spec in specs)


def repo_root(url: str) -> str:
    """``hf://{kind}/ORG/NAME`` of ``url``, without its revision: the repository it belongs to."""
    return parse_url(url).at(None).root
