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
the file store, and the token goes to the Hub's own host only. The redirect's target is a signed
URL: it serves the file's later reads in this process (for :data:`LOCATION_SECONDS` at most) and is
asked for again when the file store refuses it, which halves the requests and keeps reads clear
of the Hub's rate limit on resolves.

A ranged request must be answered with ``206`` and the ``Content-Range`` asked for. A server or
proxy that drops ``Range`` answers ``200`` with the whole object: for an object of at most
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
_REDIRECTS = (301, 302, 303, 307, 308)
_MAX_HOPS = 5
_CONTENT_RANGE = re.compile(r"bytes\s+(\d+)-(\d+)/(\d+|\*)")
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
    parts = urllib.parse.urlsplit(given.strip())
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname or any(c.isspace() for c in given.strip()):
        raise StoreConfigError(f"the Hub endpoint {given!r}, set by {origin}, is not usable: it must be a URL like "
                               f"{DEFAULT_ENDPOINT} or http://127.0.0.1:8080", url=given, subject="")
    return given.strip().rstrip("/")


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


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urllib.parse.urlsplit(url)
    port = parts.port or {"http": 80, "https": 443}.get(parts.scheme.lower())
    return parts.scheme.lower(), (parts.hostname or "").lower(), port


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
        try:
            import urllib3
        except ImportError as exc:
            raise ImportError("hf:// shards need urllib3: pip install 'hydrax[hf]'") from exc
        self.pid = os.getpid()
        self.options = options
        self.settings = {"num_pools": 16, "maxsize": max(1, options.connections), "retries": False,
                         "timeout": urllib3.Timeout(connect=options.connect_timeout, read=options.read_timeout)}
        bundle = _ca_bundle()
        if bundle:
            self.settings["ca_certs"] = bundle
        self.direct = urllib3.PoolManager(**self.settings)
        self.routes: dict[tuple, Any] = {}  # (scheme, host, port) -> the pool manager that reaches it
        self.locations: dict[str, tuple[str, float]] = {}
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
                from ..processes import note_fork_hazard

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
    """Done with a small body (a redirect, an error, JSON): the rest is read so that the
    connection goes back to the pool."""
    response.drain_conn()
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
        came from or None): the redirects followed here, the token sent to the Hub only."""
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
            target = urllib.parse.urljoin(target, location)
        raise StoreError(f"{_at(offset)}more than {_MAX_HOPS} redirects from {self.endpoint}", url=url, offset=offset,
                         subject=f"shard {url!r}: ")

    def _open(self, hub: HubURL, url: str, headers: dict, offset: int | None, version: str | None):
        """(the response to ``GET`` of ``url`` with ``headers``, the URL that answered): from the
        file store the Hub sent this process to before, while it still serves it, else through the Hub."""
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
                return response, known[0]
            _release(response)  # a signed URL that expired, or was withdrawn: ask the Hub again
            state.locations.pop(url, None)
        response, hub_headers, elsewhere = self._follow(hub, "GET", headers, url, offset)
        try:
            self._check_version(hub, hub_headers, url, offset, version)
        except BaseException:
            response.close()
            raise
        if elsewhere is not None:
            state.locations[url] = (elsewhere, time.monotonic() + LOCATION_SECONDS)
        return response, elsewhere or hub.resolve(self.endpoint)

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
        host = urllib.parse.urlsplit(target).netloc
        said = _server_words(response)
        if status == 429 or status >= 500:
            raise _Transient(f"{status} {response.reason} from {host}{said}", _retry_after(response.headers.get("Retry-After")))
        at = "" if action != "read" else _at(offset)
        subject = {"list": f"listing {url!r}: ", "revision": f"hf:// URL {url!r}: "}.get(action, f"shard {url!r}: ")
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
        size = hub_headers.get("X-Linked-Size") or response.headers.get("Content-Length")
        if size is None or not size.isdigit():
            raise StoreError(f"the Hub gave no size for it (X-Linked-Size or Content-Length) in its answer to HEAD {hub.resolve(self.endpoint)}",
                             url=url, subject=f"shard {url!r}: ")
        etag = _normal_etag(hub_headers.get("X-Linked-Etag") or hub_headers.get("ETag") or response.headers.get("ETag"))
        return ObjectInfo(hub.url, int(size), etag, 0)

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
            raise StoreError(f"the Hub's answer about revision {revision!r} of {hub.words} names no commit: {str(data)[:200]}",
                             url=url, subject=f"hf:// URL {url!r}: ")
        return sha

    def _json(self, target: str, hub: HubURL, url: str, action: str = "read", missing_ok: bool = False):
        """(parsed JSON, the next page's URL or None) of an API request; (None, None) for a
        missing folder when ``missing_ok``."""
        response = self._send("GET", target, {"Accept": "application/json"}, auth=self._at_hub(target))
        try:
            if missing_ok and response.status == 404 and response.headers.get("X-Error-Code") == "EntryNotFound":
                return None, None
            self._raise_for(response, target, hub, url, None, self._at_hub(target), action)
            try:
                data = json.loads(response.read())
            except ValueError as exc:
                raise _Transient(f"the Hub's answer to {target} is not JSON ({exc})") from None
            following = _next_page(response.headers.get("Link", ""))
            return data, None if following is None else urllib.parse.urljoin(target, following)
        finally:
            _release(response)

    def list(self, prefix: str) -> list[ObjectInfo]:
        """Every file of the repository whose URL starts with ``prefix``: one recursive listing
        of the folder ``prefix`` is in, page by page, at the revision the URL names."""
        hub = parse_url(prefix)
        folder = hub.path.rpartition("/")[0]
        revision = urllib.parse.quote(hub.revision or "main", safe="")
        target: str | None = f"{hub.api(self.endpoint)}/tree/{revision}" + (f"/{urllib.parse.quote(folder)}" if folder else "")
        target += "?recursive=true"
        found = []
        while target is not None:
            page, target = self._retry(prefix, None, functools.partial(self._json, target, hub, prefix, "list", True))
            if page is None:
                return []
            if not isinstance(page, list):
                raise StoreError(f"the Hub's tree listing is not a list: {str(page)[:200]}", url=prefix, subject=f"listing {prefix!r}: ")
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
        response, target = self._open(hub, url, headers, offset if ranged else None, version)
        try:
            if ranged and response.status == 200:
                whole = self._unranged(response, target, url, offset, size)
                return whole if whole is not None else _body(response, url, offset)
            if ranged:
                _check_range(response, url, offset, size)
            return _body(response, url, offset if ranged else None)
        except BaseException:
            response.close()  # what is left of the body is not read: the connection is not reused
            raise

    def _unranged(self, response, target: str, url: str, offset: int, size: int | None):
        """The part asked for of a whole object sent in answer to a ranged request (see the
        module docstring), or None when the whole object is what was asked for."""
        length = response.headers.get("Content-Length")
        total = int(length) if length and length.isdigit() else None
        if offset == 0 and (size is None or size == total):
            return None
        host = urllib.parse.urlsplit(target).netloc
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
        data = _body(response, url, offset)
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
                    piece = await loop.run_in_executor(pool, _read_piece, response, min(STREAM_CHUNK, end - position))
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
        response, target = self._open(hub, url, headers, start, version)
        try:
            if response.status == 200:
                whole = self._unranged(response, target, url, start, end - start)
                if whole is not None:
                    return whole
            else:
                _check_range(response, url, start, end - start)
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
            said = json.loads(said).get("error", said)
        except (ValueError, AttributeError):
            pass
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


def _check_range(response, url: str, offset: int, size: int | None) -> None:
    """A 206 answer must carry the bytes asked for."""
    if response.status != 206:
        raise StoreError(f"at byte offset {offset}: a ranged request was answered with {response.status} "
                         f"{response.reason}", url=url, offset=offset, subject=f"shard {url!r}: ")
    given = response.headers.get("Content-Range", "")
    match = _CONTENT_RANGE.fullmatch(given.strip())
    first, last = (int(match.group(1)), int(match.group(2))) if match else (None, None)
    if first != offset or (size is not None and last != offset + size - 1):
        asked = f"bytes {offset}-{'' if size is None else offset + size - 1}"
        raise StoreError(f"at byte offset {offset}: asked for {asked}, the server sent Content-Range {given!r}", url=url,
                         offset=offset, subject=f"shard {url!r}: ")


def _body(response, url: str, offset: int | None):
    """The whole body of ``response``; one shorter than its ``Content-Length`` may pass."""
    encoding = response.headers.get("Content-Encoding", "identity").lower()
    if encoding not in ("identity", ""):
        raise StoreError(f"{_at(offset)}the server sent the bytes {encoding}-encoded, though asked not to", url=url, offset=offset,
                         subject=f"shard {url!r}: ")
    data = response.read(decode_content=False)
    length = response.headers.get("Content-Length")
    if length is not None and length.isdigit() and len(data) != int(length):
        raise _Transient(f"the body ended after {len(data)} of {length} bytes")
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
