"""Shards on the Hugging Face Hub: ``hf://datasets/ORG/NAME[@REVISION]/PATH``.

**URLs.** ``hf://datasets/ORG/NAME/PATH`` names a file of a dataset repository;
``hf://ORG/NAME/PATH`` (or ``hf://models/ORG/NAME/PATH``) one of a model repository, as
huggingface_hub's ``HfFileSystem`` writes them. ``@REVISION`` after the name picks a branch, tag
or commit (a ``/`` in a branch name is written ``%2F``: ``@refs%2Fpr%2F3``). PATH may hold globs
and brace ranges; a pattern is matched against one listing of the Hub's tree API.

**Pinning.** :func:`pin_url` turns a URL's revision (``main`` when none is given) into the commit
it points at, with one request to the Hub's revision API, and writes the commit into the URL
(``hf://datasets/ORG/NAME@<sha>/PATH``). Listings, reads and everything that carries shard URLs
(indexes cached by URL, workers that receive a pickled ShardSet, manifests beside the shards)
then name that commit, so a branch that moves during a run changes nothing. A file's version is
its content hash (the LFS sha256, or the git blob id): it is compared with the Hub's ETag whenever
a read asks the Hub, so a read never returns other bytes than were indexed. :func:`check_revisions`
and :func:`record_revisions` keep, beside the cached indexes, the commit a branch pointed at; a
later set-up that finds the branch elsewhere raises :class:`~hydrax.errors.RevisionMovedError`.

**Reads.** ``GET {endpoint}/{datasets/}ORG/NAME/resolve/{sha}/{path}`` with a ``Range`` header.
The Hub answers for a large (LFS or Xet) file with a redirect to a file store on another host.
hydrax follows it itself: the Hub's ETag and commit are on the redirect, the ``Range`` goes on to
the file store. The redirect's target is a signed URL: it serves the file's later reads in this
process (for :data:`LOCATION_SECONDS` at most) and is asked for again when the file store refuses
it, which halves the requests and keeps reads clear of the Hub's rate limit on resolves.

**The token** goes only to the endpoint's origin: the scheme, host and port of a request as
urllib3 connects (every URL, a redirect's ``Location`` included, is read once with urllib3's own
parser, and the request goes to exactly the URL that was judged; default ports count as written).
A redirect to any other origin (the file store, another port, ``http`` for ``https``, another
spelling of the host) is followed without it. Redirects of the API (the Hub's answer for a renamed
repository: a ``307`` to the new name, logged once per repository) and the tree API's next pages
are followed within the Hub's host only; at most five redirects a request.

**Bounds.** A ranged request must be answered with ``206`` and the ``Content-Range`` asked for,
and at most the range's length (and one byte more, to see that there is more) is read of its body:
a body longer than the range, announced or sent, is a :class:`~hydrax.errors.StoreError` naming
the URL and the range. A whole-file read takes at most the size the Hub said (``X-Linked-Size``,
else ``Content-Length``), a stream its range. An answer of the API is read up to
:data:`MAX_API_BYTES`, JSON nested too deep for Python is a ``StoreError``, and a listing's pages
end within :data:`MAX_PAGES` or at the first page named twice. A server or proxy that drops
``Range`` answers ``200`` with the whole object: for an object of at most
``HFOptions.max_unranged_bytes`` the part asked for is cut from it (a warning is logged once per
host); a larger one raises :class:`~hydrax.errors.StoreError` naming the URL and offset before its
body is read. Transient failures (connection errors, truncated bodies, timeouts, 5xx, 429 after
its ``Retry-After``) are retried up to ``max_attempts`` times in all, then raised as
:class:`~hydrax.errors.StoreUnavailableError`; 401 and 403 are
:class:`~hydrax.errors.AccessDeniedError` naming where the token came from, 404
:class:`~hydrax.errors.ObjectNotFoundError`.

**Client.** urllib3, with one pool per process shared by its threads, and a pool of
``HFOptions.connections`` threads for read-ahead's asynchronous reads. Proxies (``HTTPS_PROXY``,
``NO_PROXY``) and CA bundles (``REQUESTS_CA_BUNDLE``, ``SSL_CERT_FILE``; else certifi's) come from
the environment as requests would take them. huggingface_hub, when installed, gives the stored
login (``get_token``). Why these and not obstore, requests or ``HfApi``: see
``docs/object-storage.rst``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import email.utils
import functools
import hashlib
import itertools
import json
import logging
import os
import re
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable

from ..errors import (AccessDeniedError, ObjectChangedError, ObjectNotFoundError, RevisionMovedError, StoreConfigError, StoreError,
                      StoreUnavailableError)
from .store import HFOptions, ObjectInfo, Store, scheme_of, write_atomic

log = logging.getLogger(__name__)

#: The Hub's address when neither ``HFOptions(endpoint=...)`` nor ``HF_ENDPOINT`` gives one.
DEFAULT_ENDPOINT = "https://huggingface.co"
#: The longest a signed file-store URL the Hub redirected to is reused, in seconds.
LOCATION_SECONDS = 600.0
#: The longest wait a 429's ``Retry-After`` is granted, in seconds.
MAX_RETRY_AFTER = 60.0
#: Pieces of a streamed read.
STREAM_CHUNK = 4 << 20
#: A commit id: what a pinned URL's revision is.
COMMIT = re.compile(r"[0-9a-f]{40}")

_KINDS = {"datasets": "dataset", "models": "model"}
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
#: The most bytes of one answer of the Hub's API (a revision, a page of a tree listing) that are
#: read: a page of a thousand files is a few hundred KiB, and a longer answer is refused before it
#: fills memory.
MAX_API_BYTES = 32 << 20
#: The most pages of one tree listing that are followed (the Hub's pages hold up to a thousand
#: files): a listing whose pages never end is refused.
MAX_PAGES = 10_000

_REDIRECTS = (301, 302, 303, 307, 308)
_MAX_HOPS = 5
_DEFAULT_PORTS = {"http": 80, "https": 443}
# The most of an unwanted body (a redirect's, the rest of an error's) read so that its connection
# can serve another request; a longer one (or one that never ends) closes the connection instead.
_DISCARD_BYTES = 64 << 10
# The most one read of a body asks for at once (http.client allocates what it is asked for).
_PIECE = 64 << 20
# At most 19 digits: int() of the 5,000-digit number a hostile header may hold is a ValueError.
_CONTENT_RANGE = re.compile(r"bytes\s+(\d{1,19})-(\d{1,19})/(\d{1,19}|\*)")
_COUNT = re.compile(r"[0-9]{1,19}")
# The path of a repository's API call or read, after the endpoint's own path: a redirect to another
# of these is the Hub's way of saying that a renamed repository lives elsewhere now.
_REPO_PATH = re.compile(r"/(?:api/)?(?:(datasets|models)/)?([^/]+/[^/]+)/(?:revision|tree|resolve|paths-info)/")
_LINK = re.compile(r'<([^>]*)>\s*;\s*rel="?([^";]*)"?.*')


# ---------------------------------------------------------------------------------------------
# URLs


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


# ---------------------------------------------------------------------------------------------
# Settings


def hub_endpoint(options: HFOptions) -> str:
    """The Hub's base URL: ``options.endpoint``, else ``HF_ENDPOINT``, else :data:`DEFAULT_ENDPOINT`."""
    given, origin = options.endpoint, "HFOptions(endpoint=...)"
    if not given:
        given, origin = os.environ.get("HF_ENDPOINT"), "the environment variable HF_ENDPOINT"
    if not given:
        return DEFAULT_ENDPOINT
    problem = _endpoint_problem(given)
    if problem:
        raise StoreConfigError(f"the Hub endpoint URL {given!r}, set by {origin}, is not usable: {problem}; set it to the "
                               f"Hub's URL, like {DEFAULT_ENDPOINT} or http://127.0.0.1:8080", url=str(given), subject="")
    return given.strip().rstrip("/")


def _endpoint_problem(endpoint) -> str | None:
    """Why ``endpoint`` is no base URL for the Hub's requests, or None. It is read as urllib3 reads
    it, since urllib3 is what connects to it (and what decides where the token goes)."""
    if not isinstance(endpoint, str):
        return f"it is a {type(endpoint).__name__}, not a string"
    endpoint = endpoint.strip()
    if any(c.isspace() for c in endpoint):
        return "a URL has no spaces"
    if "\\" in endpoint:
        return "it holds a backslash, which URL parsers read in different ways"
    scheme, sep, rest = endpoint.partition("://")
    if not sep or scheme.lower() not in ("http", "https"):
        return "it must start with http:// or https://"
    try:
        parsed = _parse(endpoint)
    except ValueError:
        host = re.split(r"[/?#]", rest, maxsplit=1)[0].rpartition("@")[2]
        if host.startswith("[") and "]" not in host:
            return "its IPv6 address has no closing ']' (the form is http://[::1]:8080)"
        port = host.rpartition("]")[2].partition(":")[2]
        if port and not (_COUNT.fullmatch(port) and int(port) <= 65535):
            return "its port is not a number from 0 to 65535"
        return "urllib3 cannot read it as a URL (the form is http://host:port)"
    if not parsed.host:
        return "it names no host (the form is http://host:port)"
    if parsed.auth or parsed.query is not None or parsed.fragment is not None:
        return "it may hold only a scheme, a host, a port and a path (no user name, query or fragment)"
    return None


def settled_options(options: HFOptions) -> HFOptions:
    """``options`` with the endpoint this process uses written in: workers started from a fork
    server (whose environment is older than this process's) then reach the same Hub."""
    return dataclasses.replace(options, endpoint=hub_endpoint(options))


def hub_token(options: HFOptions) -> tuple[str | None, str]:
    """(the token to send, or None; where it came from, in words for error messages)."""
    if options.token is not None:
        return options.token or None, "the token given as HFOptions(token=...)"
    token = (os.environ.get("HF_TOKEN") or "").strip()
    if token:
        return token, "the token in the environment variable HF_TOKEN"
    try:
        import huggingface_hub
        from huggingface_hub import constants
    except ImportError:
        return None, ("no token (HF_TOKEN is not set, and huggingface_hub, which reads the login `hf auth login` stores, is "
                      "not installed: pip install 'hydrax[hf]')")
    path = constants.HF_TOKEN_PATH
    try:
        token = huggingface_hub.get_token()
    except Exception as exc:  # an OIDC exchange that failed: its words say what to fix
        raise StoreConfigError(f"huggingface_hub could not give a token: {exc}", url=None, subject="") from exc
    if token:
        return token, f"the token of huggingface_hub's stored login ({path})"
    return None, f"no token (HF_TOKEN is not set, and there is no stored login at {path}; `hf auth login` stores one)"


_stores: dict[tuple, HubStore] = {}
_moved: set[tuple[str, str, str]] = set()  # (endpoint, kind, repository) already logged as renamed


def hub_store(url: str, options: HFOptions | None = None) -> HubStore:
    """The :class:`HubStore` for ``url`` with ``options``: one per process for each endpoint and
    token setting (the variables that pick them are part of the key, so a changed variable gets
    a store of its own)."""
    options = options or HFOptions()
    key = (options, os.environ.get("HF_ENDPOINT"), os.environ.get("HF_TOKEN"), os.environ.get("HF_HOME"),
           os.environ.get("HF_TOKEN_PATH"))
    store = _stores.get(key)
    if store is None:
        store = _stores[key] = HubStore(options)
    return store


# ---------------------------------------------------------------------------------------------
# The store


class _Transient(Exception):
    """A failure worth another attempt; ``retry_after``: the wait the server asked for, if any."""

    def __init__(self, words: str, retry_after: float | None = None) -> None:
        super().__init__(words)
        self.retry_after = retry_after


def _pause(seconds: float) -> None:
    time.sleep(seconds)


def _normal_etag(value: str | None) -> str | None:
    if not value:
        return None
    value = value.strip()
    value = value[2:] if value.startswith("W/") else value
    return value.strip('"') or None


def _urllib3():
    try:
        import urllib3
    except ImportError as exc:
        raise ImportError("hf:// shards need urllib3: pip install 'hydrax[hf]'") from exc
    return urllib3


def _parse(url: str):
    """``url`` as urllib3 reads it (a ``urllib3.util.Url``; a ValueError when it cannot). urllib3
    picks the host to connect to with this parser; urllib.parse reads some URLs as another host
    (``http://a:1\\@b:2/`` is ``a`` port 1 to urllib3, ``b`` port 2 to urllib.parse), so every
    decision about where a request goes is made on this reading."""
    return _urllib3().util.parse_url(url)


def _origin(url: str) -> tuple[str, str, int | None]:
    """(scheme, host, port) that a request to ``url`` connects to, default ports written in."""
    parsed = _parse(url)
    scheme = (parsed.scheme or "").lower()
    port = parsed.port if parsed.port is not None else _DEFAULT_PORTS.get(scheme)
    return scheme, (parsed.host or "").lower(), port


def _where(url: str) -> str:
    """``host:port`` of ``url`` as a request to it connects, for messages."""
    try:
        scheme, host, port = _origin(url)
    except ValueError:
        return url[:200]
    return host if port == _DEFAULT_PORTS.get(scheme) else f"{host}:{port}"


def _next_url(base: str, location: str) -> str:
    """The URL a redirect's ``Location`` (or a ``Link``) on the answer from ``base`` leads to,
    written as urllib3 reads it: the request is sent to exactly the URL whose origin was judged.
    A ValueError when it is no http(s) URL with a host."""
    parsed = _parse(urllib.parse.urljoin(base, location))
    if (parsed.scheme or "").lower() not in _DEFAULT_PORTS or not parsed.host:
        raise ValueError("it is no http:// or https:// URL with a host")
    # No user name goes on (none is sent anyway); a fragment is no part of a request.
    return parsed._replace(auth=None, fragment=None).url


def _count(value: str | None) -> int | None:
    """A header's whole number (Content-Length, X-Linked-Size), or None when it holds none."""
    value = (value or "").strip()
    return int(value) if _COUNT.fullmatch(value) else None


def _retry_after(value: str | None) -> float | None:
    """Seconds a ``Retry-After`` header asks for (a number or an HTTP date), or None."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


class _Process:
    """One process's connections: urllib3 pools shared by its threads (one per proxy the
    environment names, usually none), signed file-store URLs the Hub redirected to, and threads
    for asynchronous reads."""

    def __init__(self, options: HFOptions) -> None:
        urllib3 = _urllib3()
        self.pid = os.getpid()
        self.options = options
        self.settings = {"num_pools": 16, "maxsize": max(1, options.connections), "retries": False,
                         "timeout": urllib3.Timeout(connect=options.connect_timeout, read=options.read_timeout)}
        bundle = _ca_bundle()
        if bundle:
            self.settings["ca_certs"] = bundle
        self.direct = urllib3.PoolManager(**self.settings)
        self.routes: dict[tuple, Any] = {}  # (scheme, host, port) -> the pool manager that reaches it
        self.locations: dict[str, tuple[str, float, int | None]] = {}  # url -> (signed URL, until, X-Linked-Size)
        self.warned: set[str] = set()
        self.token: tuple[str | None, str] | None = None

    def manager(self, target: str):
        """The pool manager for ``target``: through the proxy the environment names for its host
        (``HTTPS_PROXY``, ``HTTP_PROXY``, ``NO_PROXY``), found once per host, else direct."""
        origin = _origin(target)
        found = self.routes.get(origin)
        if found is None:
            import urllib.request

            import urllib3

            scheme, host, port = origin
            proxy = None if urllib.request.proxy_bypass(f"{host}:{port}") else urllib.request.getproxies().get(scheme)
            found = self.routes[origin] = self.direct if not proxy else urllib3.ProxyManager(proxy, **self.settings)
        return found

    def pool(self) -> ThreadPoolExecutor:
        return _threads(max(1, self.options.connections))


_executor: tuple[int, int, ThreadPoolExecutor] | None = None  # (process, threads, executor)
_executor_lock = threading.Lock()


def _threads(size: int) -> ThreadPoolExecutor:
    """The threads that run this process's asynchronous Hub requests (one set for every store, so
    that stores made for other settings add no idle threads), at least ``size`` of them."""
    global _executor
    found = _executor
    if found is None or found[0] != os.getpid() or found[1] < size:
        with _executor_lock:
            found = _executor
            if found is None or found[0] != os.getpid() or found[1] < size:
                # A smaller set left behind finishes what it runs, then idles.
                found = _executor = (os.getpid(), size, ThreadPoolExecutor(size, thread_name_prefix="hydrax-hub"))
                from ..procs.processes import note_fork_hazard

                note_fork_hazard("the Hugging Face Hub store's request threads")
    return found[2]


def _ca_bundle() -> str | None:
    """The CA certificates to trust: those the environment names, else certifi's (as requests and
    huggingface_hub do), else None (the system's)."""
    for name in ("REQUESTS_CA_BUNDLE", "SSL_CERT_FILE", "CURL_CA_BUNDLE"):
        if os.environ.get(name):
            return os.environ[name]
    try:
        import certifi
    except ImportError:
        return None
    return certifi.where()


def _release(response) -> None:
    """Done with a body that is not wanted (a redirect's, what is left of an error's or of JSON):
    a short rest is read so that the connection goes back to the pool; a longer one, which could
    be gigabytes or never end, closes the connection instead of being read."""
    ended = False
    try:
        left = _DISCARD_BYTES
        while left > 0:
            piece = response.read(min(left, 16 << 10), decode_content=False)
            if not piece:
                ended = True
                break
            left -= len(piece)
    except Exception:  # a body that fails as it is thrown away only costs its connection
        ended = False
    if not ended:
        response.close()
    response.release_conn()


class HubStore(Store):
    """Files of Hugging Face Hub repositories (see the module docstring): listing through the
    tree API, ranged reads through ``resolve`` URLs, pinned to commits. Read-only."""

    scheme = "hf"

    def __init__(self, options: HFOptions) -> None:
        self.options = options
        self.endpoint = hub_endpoint(options)
        self._process: _Process | None = None

    def __getstate__(self):
        return {"options": self.options}

    def __setstate__(self, state):
        self.__init__(state["options"])

    def _state(self) -> _Process:
        state = self._process
        if state is None or state.pid != os.getpid():
            # Nothing of another process's (a parent's pool, its threads) is used after a fork.
            state = self._process = _Process(self.options)
        return state

    def token(self) -> tuple[str | None, str]:
        """(token, where it came from), found once per process."""
        state = self._state()
        if state.token is None:
            state.token = hub_token(self.options)
        return state.token

    # -- requests ------------------------------------------------------------------------------
    def _send(self, method: str, target: str, headers: dict, *, auth: bool):
        """One request, no redirect followed, its body not read yet; the token only when ``auth``
        (the Hub's own host). ~/.netrc and the like are never read: no other credentials are sent."""
        headers = dict(headers)
        if auth:
            token = self.token()[0]
            if token:
                headers["Authorization"] = f"Bearer {token}"
        return self._state().manager(target).request(method, target, headers=headers, redirect=False, preload_content=False)

    def _at_hub(self, target: str) -> bool:
        return _origin(target) == _origin(self.endpoint)

    def _follow(self, hub: HubURL, method: str, headers: dict, url: str, offset: int | None, *, head: bool = False):
        """(the final response, the Hub's own last response's headers, the other host's URL it
        came from or None): the redirects followed here, the token sent to the Hub's origin only."""
        target = hub.resolve(self.endpoint)
        hub_headers: Any = {}
        for _ in range(_MAX_HOPS + 1):
            at_hub = self._at_hub(target)
            response = self._send(method, target, headers, auth=at_hub)
            if at_hub:
                hub_headers = response.headers
            location = response.headers.get("Location")
            if head and at_hub and "X-Linked-Size" in response.headers:
                return response, hub_headers, None  # the Hub's redirect says the size: no need to ask the file store
            if response.status not in _REDIRECTS or not location:
                try:
                    self._raise_for(response, target, hub, url, offset, at_hub)
                except BaseException:
                    response.close()
                    raise
                return response, hub_headers, None if at_hub else target
            _release(response)
            target = self._redirect(target, location, hub, url, offset, f"shard {url!r}: ")
        raise StoreError(f"{_at(offset)}more than {_MAX_HOPS} redirects from {self.endpoint}", url=url, offset=offset,
                         subject=f"shard {url!r}: ")

    def _redirect(self, target: str, location: str, hub: HubURL, url: str, offset: int | None, subject: str) -> str:
        """The URL the redirect from ``target`` to ``location`` leads to (see :func:`_next_url`);
        a :class:`StoreError` when it is none. A renamed repository is noted (:meth:`_note_moved`)."""
        try:
            following = _next_url(target, location)
        except ValueError as exc:
            raise StoreError(f"{_at(offset)}{_where(target)} redirected to {location[:300]!r}, which hydrax cannot follow: {exc}",
                             url=url, offset=offset, subject=subject) from None
        if self._at_hub(following):
            self._note_moved(hub, following)
        return following

    def _note_moved(self, hub: HubURL, target: str) -> None:
        """Log, once per repository in a process, that the Hub sends the requests for ``hub``'s
        repository to another one (the Hub's answer for a renamed repository): its URLs still work,
        through one more request each, until the old name is taken by a new repository."""
        base = _parse(self.endpoint).path or ""
        path = _parse(target).path or ""
        match = _REPO_PATH.match(path[len(base.rstrip("/")):]) if path.startswith(base.rstrip("/")) else None
        if match is None:
            return
        moved_to = urllib.parse.unquote(match.group(2))
        key = (self.endpoint, hub.kind, hub.repo_id)
        if moved_to == hub.repo_id or key in _moved:
            return
        _moved.add(key)
        new_url = dataclasses.replace(hub, repo_id=moved_to).url
        log.warning("%s at %s has moved to %s: the Hub redirects each of its requests there until another repository takes "
                    "the old name; write %s instead of %s", hub.words, self.endpoint, moved_to, new_url, hub.url)

    def _open(self, hub: HubURL, url: str, headers: dict, offset: int | None, version: str | None):
        """(the response to ``GET`` of ``url`` with ``headers``, the URL that answered, the file's
        size as the Hub said it on its redirect or None): from the file store the Hub sent this
        process to before, while it still serves it, else through the Hub."""
        state = self._state()
        known = state.locations.get(url)
        if known is not None and known[1] > time.monotonic():
            response = self._send("GET", known[0], headers, auth=False)
            status = response.status
            if status < 300 or status in (416, 429) or status >= 500:
                try:
                    self._raise_for(response, known[0], hub, url, offset, False)
                except BaseException:
                    response.close()
                    raise
                return response, known[0], known[2]
            _release(response)  # a signed URL that expired, or was withdrawn: ask the Hub again
            state.locations.pop(url, None)
        response, hub_headers, elsewhere = self._follow(hub, "GET", headers, url, offset)
        linked = _count(hub_headers.get("X-Linked-Size")) if elsewhere is not None else None
        try:
            self._check_version(hub, hub_headers, url, offset, version)
        except BaseException:
            response.close()
            raise
        if elsewhere is not None:
            state.locations[url] = (elsewhere, time.monotonic() + LOCATION_SECONDS, linked)
        return response, elsewhere or hub.resolve(self.endpoint), linked

    def _check_version(self, hub: HubURL, headers, url: str, offset: int | None, version: str | None) -> None:
        """An answer from another commit, or with other content than was indexed, is an
        :class:`~hydrax.errors.ObjectChangedError`, as a replaced object is in S3."""
        commit = headers.get("X-Repo-Commit")
        if hub.pinned and commit and commit != hub.revision:
            raise ObjectChangedError(f"{_at(offset)}the Hub answered from commit {commit}, not the pinned commit {hub.revision}",
                                     url=url, offset=offset, subject=f"shard {url!r}: ")
        etag = _normal_etag(headers.get("X-Linked-Etag") or headers.get("ETag"))
        if version is not None and etag is not None and etag != version:
            raise ObjectChangedError(f"{_at(offset)}the Hub answers with ETag {etag}, but the file was indexed as version "
                                     f"{version}: it serves another file than was indexed; set the ShardSet up again", url=url,
                                     offset=offset, subject=f"shard {url!r}: ")

    # -- errors --------------------------------------------------------------------------------
    def _raise_for(self, response, target: str, hub: HubURL, url: str, offset: int | None, at_hub: bool,
                   action: str = "read") -> None:
        """Nothing for a success; :class:`_Transient` for what may pass; else hydrax's error."""
        status = response.status
        if status < 300:
            return
        host = _where(target)
        said = _server_words(response)
        if status == 429 or status >= 500:
            raise _Transient(f"{status} {response.reason} from {host}{said}", _retry_after(response.headers.get("Retry-After")))
        at = "" if action != "read" else _at(offset)
        subject = _subject(action, url)
        code = response.headers.get("X-Error-Code", "")
        if at_hub and status in (401, 403):
            raise AccessDeniedError(f"{at}{self._refusal(hub, status, said)}", url=url, offset=offset, subject=subject)
        if status == 404 and at_hub:
            raise ObjectNotFoundError(f"{at}{_missing(hub, code, self.endpoint)}{said}", url=url, offset=offset, subject=subject)
        if status == 416:
            raise ObjectChangedError(f"{at}the range asked for lies beyond the end of the file (416 from {host}): it is shorter "
                                     "than its index says", url=url, offset=offset, subject=subject)
        raise StoreError(f"{at}{status} {response.reason} from {host}{said}", url=url, offset=offset, subject=subject)

    def _refusal(self, hub: HubURL, status: int, said: str) -> str:
        token, source = self.token()
        self._state().token = None  # looked up again next time: a login renewed meanwhile is then used
        if token is None:
            return (f"the Hub refused access to {hub.words} without a token ({status}{said}): it is private or gated, or does "
                    f"not exist; the store used {source}. Set HF_TOKEN, log in with `hf auth login`, or pass "
                    "HFOptions(token=...)")
        return (f"the Hub refused {source} for {hub.words} ({status}{said}): check that the token is valid and may read the "
                "repository (a gated one also needs its access request accepted on its page)")

    def _retry(self, url: str, offset: int | None, call: Callable[[], Any]):
        attempts = max(1, int(self.options.max_attempts))
        for attempt in range(attempts):
            try:
                return call()
            except StoreError:
                raise
            except Exception as exc:
                words = _transient_words(exc)
                if words is None:
                    raise
                if attempt + 1 == attempts:
                    raise StoreUnavailableError(f"{_at(offset)}the request failed after retries ({attempts} attempts): {words}",
                                                url=url, offset=offset, subject=f"shard {url!r}: ") from exc
                _pause(self._wait(exc, attempt))
        raise AssertionError("unreachable")

    def _wait(self, exc: BaseException, attempt: int) -> float:
        asked = getattr(exc, "retry_after", None)
        if asked is None:
            return min(2.0, 0.1 * 2 ** attempt)
        if asked > 1:
            log.warning("the Hub at %s asks to wait %.0f s before another request (%s)", self.endpoint, min(asked, MAX_RETRY_AFTER), exc)
        return min(asked, MAX_RETRY_AFTER)

    # -- the operations ------------------------------------------------------------------------
    def stat(self, url: str) -> ObjectInfo:
        hub = parse_url(url)
        return self._retry(url, None, lambda: self._head(hub, url))

    def _head(self, hub: HubURL, url: str) -> ObjectInfo:
        response, hub_headers, _ = self._follow(hub, "HEAD", {"Accept-Encoding": "identity"}, url, None, head=True)
        _release(response)
        self._check_version(hub, hub_headers, url, None, None)
        size = _count(hub_headers.get("X-Linked-Size") or response.headers.get("Content-Length"))
        if size is None:
            raise StoreError(f"the Hub gave no size for it (X-Linked-Size or Content-Length) in its answer to HEAD {hub.resolve(self.endpoint)}",
                             url=url, subject=f"shard {url!r}: ")
        etag = _normal_etag(hub_headers.get("X-Linked-Etag") or hub_headers.get("ETag") or response.headers.get("ETag"))
        return ObjectInfo(hub.url, size, etag, 0)

    async def stat_async(self, url: str) -> ObjectInfo:
        return await asyncio.get_running_loop().run_in_executor(self._state().pool(), self.stat, url)

    def commit_of(self, url: str) -> str:
        """The commit the revision of ``url`` (``main`` when it names none) points at now."""
        hub = parse_url(url)
        revision = hub.revision or "main"
        target = f"{hub.api(self.endpoint)}/revision/{urllib.parse.quote(revision, safe='')}"
        data, _ = self._retry(url, None, lambda: self._json(target, hub, url, "revision"))
        sha = data.get("sha") if isinstance(data, dict) else None
        if not isinstance(sha, str) or not COMMIT.fullmatch(sha):
            raise StoreError(f"the Hub's answer about revision {revision!r} of {hub.words} names no commit: {_shape(data)}",
                             url=url, subject=f"hf:// URL {url!r}: ")
        return sha

    def _json(self, target: str, hub: HubURL, url: str, action: str = "read", missing_ok: bool = False):
        """(parsed JSON, the next page's URL or None) of an API request; (None, None) for a
        missing folder when ``missing_ok``. Redirects within the Hub's host are followed (the
        Hub's answer for a renamed repository), the token sent on to the Hub's origin only."""
        subject = _subject(action, url)
        for _ in range(_MAX_HOPS + 1):
            at_hub = self._at_hub(target)
            response = self._send("GET", target, {"Accept": "application/json"}, auth=at_hub)
            try:
                location = response.headers.get("Location")
                if response.status in _REDIRECTS and location:
                    target = self._within_hub(target, self._redirect(target, location, hub, url, None, subject), url, subject)
                    continue
                if missing_ok and response.status == 404 and response.headers.get("X-Error-Code") == "EntryNotFound":
                    return None, None
                self._raise_for(response, target, hub, url, None, at_hub, action)
                data = _api_json(response, target, url, subject)
                following = _next_page(response.headers.get("Link", ""))
                if following is not None:
                    try:
                        following = _next_url(target, following)
                    except ValueError as exc:
                        raise StoreError(f"the Hub's answer to {target} names a next page {following[:300]!r} that hydrax "
                                         f"cannot follow: {exc}", url=url, subject=subject) from None
                    following = self._within_hub(target, following, url, subject)
                return data, following
            finally:
                _release(response)
        raise StoreError(f"more than {_MAX_HOPS} redirects from {self.endpoint} for one request of its API (the last to "
                         f"{target})", url=url, subject=subject)

    def _within_hub(self, target: str, following: str, url: str, subject: str) -> str:
        """``following`` (a redirect or next page of an API answer from ``target``) when it is on
        the Hub's host; a :class:`StoreError` otherwise: the Hub's API answers on its own host."""
        if _origin(following)[1] != _origin(self.endpoint)[1]:
            raise StoreError(f"the Hub's answer to {target} sends this API request on to another host ({_where(following)}); "
                             f"hydrax follows the API's redirects and pages within {_where(self.endpoint)} only. Check "
                             "HF_ENDPOINT (or HFOptions(endpoint=...)), and any proxy between", url=url, subject=subject)
        return following

    def list(self, prefix: str) -> list[ObjectInfo]:
        """Every file of the repository whose URL starts with ``prefix``: one recursive listing
        of the folder ``prefix`` is in, page by page, at the revision the URL names."""
        hub = parse_url(prefix)
        folder = hub.path.rpartition("/")[0]
        revision = urllib.parse.quote(hub.revision or "main", safe="")
        target: str | None = f"{hub.api(self.endpoint)}/tree/{revision}" + (f"/{urllib.parse.quote(folder)}" if folder else "")
        target += "?recursive=true"
        found = []
        seen: set[str] = set()  # the pages asked for: a page named again would start a cycle
        while target is not None:
            if target in seen or len(seen) >= MAX_PAGES:
                again = target in seen
                raise StoreError(f"the Hub's tree listing {'names the page ' + target + ' again' if again else f'runs past {MAX_PAGES} pages'}"
                                 f" (after {len(seen)} pages, {len(found)} files): its pages would never end. The Hub's own "
                                 "listings end; check HF_ENDPOINT (or HFOptions(endpoint=...)) and any proxy between", url=prefix,
                                 subject=_subject("list", prefix))
            seen.add(target)
            page, target = self._retry(prefix, None, functools.partial(self._json, target, hub, prefix, "list", True))
            if page is None:
                return []
            if not isinstance(page, list):
                raise StoreError(f"the Hub's tree listing is not a list: {_shape(page)}", url=prefix, subject=_subject("list", prefix))
            for entry in page:
                info = _listed(hub, entry)
                if info is not None and info.url.startswith(prefix):
                    found.append(info)
        return sorted(found, key=lambda info: info.url)

    def read(self, url: str, offset: int = 0, size: int | None = None, *, version: str | None = None):
        if size == 0:
            return b""
        hub = parse_url(url)
        at = offset if size is not None or offset else None
        return self._retry(url, at, lambda: self._read_once(hub, url, offset, size, version))

    def _read_once(self, hub: HubURL, url: str, offset: int, size: int | None, version: str | None):
        ranged = size is not None or offset > 0
        headers = {"Accept-Encoding": "identity"}
        if ranged:
            headers["Range"] = f"bytes={offset}-{'' if size is None else offset + size - 1}"
        response, target, linked = self._open(hub, url, headers, offset if ranged else None, version)
        try:
            if ranged and response.status == 200:
                whole = self._unranged(response, target, url, offset, size)
                # None: the whole file was asked for, and _unranged saw that its length is size
                return whole if whole is not None else _body(response, url, offset, size, f"bytes {offset}-{offset + size - 1}")
            if ranged:
                expected = _check_range(response, url, offset, size)
                return _body(response, url, offset, expected, f"bytes {offset}-{offset + expected - 1}")
            return self._whole(response, target, url, linked)
        except BaseException:
            response.close()  # what is left of the body is not read: the connection is not reused
            raise

    def _whole(self, response, target: str, url: str, linked: int | None):
        """The body of the answer to a read of a whole file: as long as the Hub said the file is
        (``X-Linked-Size`` on its redirect, else the answer's ``Content-Length``), and not a byte
        more is read; an answer of no stated size is refused rather than read without end."""
        if response.status != 200:
            raise StoreError(f"a read of the whole file was answered with {response.status} {response.reason} from "
                             f"{_where(target)}", url=url, subject=f"shard {url!r}: ")
        declared = _count(response.headers.get("Content-Length"))
        expected = linked if linked is not None else declared
        if expected is None:
            raise StoreError(f"{_where(target)} sent the whole file without saying its size (no X-Linked-Size from the Hub, no "
                             "Content-Length): hydrax reads no body of unknown length. A proxy between may have dropped the "
                             "header", url=url, subject=f"shard {url!r}: ")
        said = "the Hub said" if linked is not None else "its Content-Length said"
        return _body(response, url, None, expected, f"the whole file ({expected} bytes, as {said})")

    def _unranged(self, response, target: str, url: str, offset: int, size: int | None):
        """The part asked for of a whole object sent in answer to a ranged request (see the
        module docstring), or None when the whole object is what was asked for."""
        total = _count(response.headers.get("Content-Length"))
        if offset == 0 and total is not None and (size is None or size == total):
            return None
        host = _where(target)
        limit = self.options.max_unranged_bytes
        if total is None or total > limit:
            raise StoreError(f"at byte offset {offset}: {host} ignored the Range header and began sending the whole file "
                             f"({'of unknown size' if total is None else f'{total} bytes'}); hydrax downloads a whole file for "
                             f"part of it only up to HFOptions(max_unranged_bytes={limit}). A proxy between here and {host} may "
                             "drop Range headers", url=url, offset=offset, subject=f"shard {url!r}: ")
        if host not in self._state().warned:
            self._state().warned.add(host)
            log.warning("%s ignores Range headers: files of up to %d bytes are downloaded whole and cut (first seen for %s)",
                        host, limit, url)
        data = _body(response, url, offset, total, f"the whole file ({total} bytes, as its Content-Length said)")
        end = len(data) if size is None else offset + size
        if end > len(data):
            raise ObjectChangedError(f"at byte offset {offset}: the file has {len(data)} bytes, fewer than the {end} its index "
                                     "says", url=url, offset=offset, subject=f"shard {url!r}: ")
        return memoryview(data)[offset:end]

    async def read_async(self, url: str, offset: int = 0, size: int | None = None, *, version: str | None = None):
        call = functools.partial(self.read, url, offset, size, version=version)
        return await asyncio.get_running_loop().run_in_executor(self._state().pool(), call)

    async def stream_async(self, url: str, offset: int, end: int, *, version: str | None = None) -> AsyncIterator[Any]:
        """The bytes ``[offset, end)`` of ``url`` in pieces of a few MiB, as they arrive; a stream
        cut short is resumed where it stopped, up to ``max_attempts`` times in all."""
        loop = asyncio.get_running_loop()
        pool = self._state().pool()
        hub = parse_url(url)
        position, failures = offset, 0
        while position < end:
            response = None
            try:
                response = await loop.run_in_executor(pool, self._open_stream, hub, url, position, end, version)
                if isinstance(response, (bytes, bytearray, memoryview)):  # a small file sent whole, already cut
                    position = end
                    yield response
                    return
                while position < end:
                    left = end - position
                    # The last piece asks for a byte more: a body that goes on past the range is caught.
                    piece = await loop.run_in_executor(pool, _read_piece, response, STREAM_CHUNK if left > STREAM_CHUNK else left + 1)
                    if len(piece) > left:
                        raise _excess(url, offset, f"bytes {offset}-{end - 1}", end - offset, f"went on sending past byte {end - 1}")
                    position += len(piece)
                    yield piece
            except StoreError:
                raise
            except Exception as exc:
                words = _transient_words(exc)
                failures += 1
                if words is None:
                    raise
                if failures >= max(1, self.options.max_attempts):
                    raise StoreUnavailableError(f"at byte offset {position}: the stream failed after retries ({failures} "
                                                f"attempts): {words}", url=url, offset=position, subject=f"shard {url!r}: ") from exc
                await asyncio.sleep(self._wait(exc, failures))
            finally:
                if response is not None and not isinstance(response, (bytes, bytearray, memoryview)):
                    response.close()

    def _open_stream(self, hub: HubURL, url: str, start: int, end: int, version: str | None):
        """A response positioned at ``start`` whose body runs to ``end``, or the bytes of a small
        file that came whole."""
        headers = {"Accept-Encoding": "identity", "Range": f"bytes={start}-{end - 1}"}
        response, target, _ = self._open(hub, url, headers, start, version)
        try:
            if response.status == 200:
                whole = self._unranged(response, target, url, start, end - start)
                if whole is not None:
                    return whole
            else:
                _check_range(response, url, start, end - start)
            _check_encoding(response, url, start)
            declared = _count(response.headers.get("Content-Length"))
            if declared is not None and declared > end - start:
                raise _excess(url, start, f"bytes {start}-{end - 1}", end - start, f"announces {declared} bytes")
        except BaseException:
            response.close()
            raise
        return response

    def write(self, url: str, data) -> ObjectInfo:
        raise StoreError("hydrax reads from the Hugging Face Hub but does not write to it; upload with huggingface_hub "
                         "(HfApi.upload_folder, or `hf upload`)", url=url, subject=f"{url}: ")

    def upload(self, url: str, path: str) -> ObjectInfo:
        return self.write(url, b"")

    def delete(self, url: str) -> None:
        self.write(url, b"")


def _at(offset: int | None) -> str:
    return "" if offset is None else f"at byte offset {offset}: "


def _subject(action: str, url: str) -> str:
    """How an error's message names what was asked for: a listing, a revision, or a shard."""
    return {"list": f"listing {url!r}: ", "revision": f"hf:// URL {url!r}: "}.get(action, f"shard {url!r}: ")


def _shape(value) -> str:
    """Parsed JSON ``value`` described in a few words for a message. Never its repr: a hostile
    answer may nest deeper than repr can go, or be megabytes long."""
    if isinstance(value, dict):
        keys = [k[:40] for k in itertools.islice(value, 8)]
        return f"an object with the keys {keys}" + (" and more" if len(value) > 8 else "")
    if isinstance(value, list):
        return f"a list of {len(value)} items"
    if isinstance(value, str):
        return f"the string {value[:100]!r}" + ("..." if len(value) > 100 else "")
    return repr(value)[:100]  # a number, true, false or null


def _api_json(response, target: str, url: str, subject: str):
    """The JSON of an answer of the Hub's API: at most :data:`MAX_API_BYTES` of it read, and
    nesting too deep for Python's parser a :class:`StoreError` (both are answers no retry mends);
    bytes that are not JSON at all may be a body cut short, so they are worth another attempt."""
    declared = _count(response.headers.get("Content-Length"))
    if declared is not None and declared > MAX_API_BYTES:
        raise StoreError(f"the Hub's answer to {target} announces {declared} bytes, more than the {MAX_API_BYTES} hydrax reads of "
                         "an answer of its API", url=url, subject=subject)
    text = _read_upto(response, MAX_API_BYTES + 1)
    if len(text) > MAX_API_BYTES:
        raise StoreError(f"the Hub's answer to {target} is longer than the {MAX_API_BYTES} bytes hydrax reads of an answer of its "
                         "API", url=url, subject=subject)
    try:
        return json.loads(text)
    except RecursionError:  # a few kilobytes of brackets reach Python's recursion limit
        raise StoreError(f"the Hub's answer to {target} nests JSON deeper than Python can parse: it is no answer of the Hub's API",
                         url=url, subject=subject) from None
    except ValueError as exc:
        raise _Transient(f"the Hub's answer to {target} is not JSON ({exc})") from None


def _server_words(response) -> str:
    """What the server said about a failure, briefly: ``": <message>"``, or ``""``."""
    said = response.headers.get("X-Error-Message")
    if not said:
        try:
            text = response.read(1024, decode_content=True)
            said = text.decode("utf-8", "replace") if isinstance(text, bytes) else ""
        except Exception:  # the body of a failure is only words for the message
            said = ""
        try:
            error = json.loads(said).get("error")
        except (ValueError, AttributeError, RecursionError):  # not the Hub's {"error": ...}: the text itself
            error = None
        said = error if isinstance(error, str) else said
    said = " ".join(str(said).split())[:300]
    return f": {said}" if said else ""


def _missing(hub: HubURL, code: str, endpoint: str) -> str:
    if code == "RepoNotFound":
        return f"{hub.words} does not exist at {endpoint} (or is private, and the token sent may not read it)"
    if code == "RevisionNotFound":
        return f"the revision {hub.revision or 'main'!r} does not exist in {hub.words}"
    return f"does not exist in {hub.words} at revision {hub.revision or 'main'!r}"


def _transient_words(exc: BaseException) -> str | None:
    """What a failure that may pass was, in words; None when it will not pass."""
    if isinstance(exc, _Transient):
        return str(exc)
    if isinstance(exc, ImportError):  # urllib3 missing: the words say which extra to install
        return None
    import http.client

    import urllib3

    if isinstance(exc, (urllib3.exceptions.HTTPError, http.client.HTTPException, ConnectionError, TimeoutError)):
        return f"{type(exc).__name__}: {exc}"
    return None


def _next_page(link: str) -> str | None:
    """The ``rel="next"`` URL of a ``Link`` header (the Hub's pagination), or None."""
    for part in link.split(","):
        match = _LINK.fullmatch(part.strip())
        if match and "next" in match.group(2).split():
            return match.group(1)
    return None


def _check_range(response, url: str, offset: int, size: int | None) -> int:
    """A 206 answer must carry the bytes asked for; returns how many its ``Content-Range`` says."""
    if response.status != 206:
        raise StoreError(f"at byte offset {offset}: a ranged request was answered with {response.status} "
                         f"{response.reason}", url=url, offset=offset, subject=f"shard {url!r}: ")
    given = response.headers.get("Content-Range", "")
    match = _CONTENT_RANGE.fullmatch(given.strip())
    first, last = (int(match.group(1)), int(match.group(2))) if match else (None, None)
    total = int(match.group(3)) if match and match.group(3) != "*" else None
    if (first != offset or last is None or last < offset or (size is not None and last != offset + size - 1)
            or (total is not None and last >= total)):
        asked = f"bytes {offset}-{'' if size is None else offset + size - 1}"
        raise StoreError(f"at byte offset {offset}: asked for {asked}, the server sent Content-Range {given[:200]!r}", url=url,
                         offset=offset, subject=f"shard {url!r}: ")
    return last - offset + 1


def _check_encoding(response, url: str, offset: int | None) -> None:
    encoding = response.headers.get("Content-Encoding", "identity").strip().lower()
    if encoding not in ("identity", ""):
        raise StoreError(f"{_at(offset)}the server sent the bytes {encoding[:50]}-encoded, though asked not to", url=url,
                         offset=offset, subject=f"shard {url!r}: ")


def _excess(url: str, offset: int | None, asked: str, expected: int, how: str) -> StoreError:
    return StoreError(f"{_at(offset)}asked for {asked} ({expected} bytes), the server {how}: hydrax reads no more than it asked "
                      "for. The server, or a proxy between, does not keep to the range or size of the file", url=url,
                      offset=offset, subject=f"shard {url!r}: ")


def _body(response, url: str, offset: int | None, expected: int, asked: str):
    """The body of ``response``, which must be ``expected`` bytes (``asked``, in words): at most
    one byte more is read, to see that there is more, so a body that goes on (for gigabytes, or
    without end) costs no more memory than the one asked for. A shorter body may pass: it is
    worth another attempt."""
    _check_encoding(response, url, offset)
    declared = _count(response.headers.get("Content-Length"))
    if declared is not None and declared > expected:
        raise _excess(url, offset, asked, expected, f"announces {declared} bytes")
    data = _read_upto(response, expected + 1)
    if len(data) > expected:
        raise _excess(url, offset, asked, expected, "sent more")
    if len(data) < expected:
        raise _Transient(f"the body ended after {len(data)} of {expected} bytes")
    return data


def _read_upto(response, limit: int):
    """The body of ``response`` up to ``limit`` bytes (all of it when shorter), read in pieces of
    at most :data:`_PIECE` bytes: a size a server states (a lie, maybe, of petabytes) is never
    allocated before its bytes arrive, and a long body is gathered in one growing buffer."""
    first = response.read(min(limit, _PIECE), decode_content=False)
    if not first or len(first) >= limit:
        return first
    more = response.read(min(limit - len(first), _PIECE), decode_content=False)
    if not more:  # the usual end: the body was what the first read returned, kept as it is
        return first
    data = bytearray(first)
    del first
    data += more
    del more
    while len(data) < limit:
        piece = response.read(min(limit - len(data), _PIECE), decode_content=False)
        if not piece:
            break
        data += piece
    return data


def _read_piece(response, size: int):
    piece = response.read(size, decode_content=False)
    if not piece:
        raise _Transient("the response ended early")
    return piece


def _listed(hub: HubURL, entry) -> ObjectInfo | None:
    """The file a tree listing's ``entry`` describes, with its content hash as version; None for a folder."""
    if not isinstance(entry, dict) or entry.get("type") != "file" or not isinstance(entry.get("path"), str):
        return None
    lfs = entry.get("lfs") if isinstance(entry.get("lfs"), dict) else None
    size = (lfs or entry).get("size", entry.get("size"))
    version = (lfs or {}).get("oid") or entry.get("oid")
    if type(size) is not int or size < 0:
        return None
    return ObjectInfo(f"{hub.root}/{entry['path']}", size, version if isinstance(version, str) else None, 0)


# ---------------------------------------------------------------------------------------------
# Revisions: pinning, and what the cache was built from


@dataclass(frozen=True)
class Pin:
    """A branch or tag of a repository and the commit it pointed at when a set-up resolved it."""

    endpoint: str
    root: str
    revision: str
    commit: str
    url: str


def pin_url(url: str, options: HFOptions | None = None, pins: dict | None = None) -> str:
    """``url`` at the commit its revision (``main`` when it names none) points at now: one request
    per repository and revision (``pins`` keeps them, and the :class:`Pin` s, for a set-up); a URL
    pinned to a commit already is returned as it is."""
    hub = parse_url(url)
    if hub.pinned:
        return url
    store = hub_store(url, options)
    revision = hub.revision or "main"
    key = (store.endpoint, hub.at(None).root.lower(), revision)
    pins = {} if pins is None else pins
    pin = pins.get(key)
    if pin is None:
        pin = pins[key] = Pin(store.endpoint, hub.at(None).root, revision, store.commit_of(url), url)
    return hub.at(pin.commit).url


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
