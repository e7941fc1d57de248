"""The Hub's store: :class:`HubStore`, its settings (endpoint and token), and one per setting.

:class:`HubStore` decides what to ask the Hugging Face Hub (a ``resolve`` URL with a ``Range``,
a page of the tree API, a revision) and what its answers mean: the redirects it follows and the
token it sends (to the Hub's origin only), the errors it raises, its retries, the commit a
revision points at (:meth:`HubStore.pin`). How requests are sent and answers read within bounds
is :mod:`hydrax.shards.hub.client`'s; the whole design is told in :mod:`hydrax.shards.hub`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import os
import re
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable

from ...errors import AccessDeniedError, ObjectChangedError, ObjectNotFoundError, StoreConfigError, StoreError, StoreUnavailableError
from ..options import HFOptions
from ..store import ObjectInfo, Store
from .client import (COUNT, MAX_HOPS, REDIRECTS, Connections, Transient, api_json, at_offset, check_encoding, check_range,
                     check_version, excess_error, header_count, host_of, json_shape, next_page, next_url, normal_etag,
                     origin_of, parse_address, read_body, read_piece, release, retry_after_seconds, server_words, subject_of,
                     transient_words, unranged_part, whole_body, within_hub)
from .url import COMMIT, HubURL, parse_url

log = logging.getLogger(__name__)

#: The Hub's address when neither ``HFOptions(endpoint=...)`` nor ``HF_ENDPOINT`` gives one.
DEFAULT_ENDPOINT = "https://huggingface.co"
#: The longest a signed file-store URL the Hub redirected to is reused, in seconds.
LOCATION_SECONDS = 600.0
#: The longest wait a 429's ``Retry-After`` is granted, in seconds.
MAX_RETRY_AFTER = 60.0
#: Pieces of a streamed read.
STREAM_CHUNK = 4 << 20
#: The most pages of one tree listing that are followed (the Hub's pages hold up to a thousand
#: files): a listing whose pages never end is refused.
MAX_PAGES = 10_000
# The path of a repository's API call or read, after the endpoint's own path: a redirect to another
# of these is the Hub's way of saying that a renamed repository lives elsewhere now.
_REPO_PATH = re.compile(r"/(?:api/)?(?:(datasets|models)/)?([^/]+/[^/]+)/(?:revision|tree|resolve|paths-info)/")


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
        parsed = parse_address(endpoint)
    except ValueError:
        host = re.split(r"[/?#]", rest, maxsplit=1)[0].rpartition("@")[2]
        if host.startswith("[") and "]" not in host:
            return "its IPv6 address has no closing ']' (the form is http://[::1]:8080)"
        port = host.rpartition("]")[2].partition(":")[2]
        if port and not (COUNT.fullmatch(port) and int(port) <= 65535):
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


@dataclass(frozen=True)
class Pin:
    """A branch or tag of a repository and the commit it pointed at when a set-up resolved it."""

    endpoint: str
    root: str
    revision: str
    commit: str
    url: str


def _pause(seconds: float) -> None:
    time.sleep(seconds)


class HubStore(Store):
    """Files of Hugging Face Hub repositories (see the module docstring): listing through the
    tree API, ranged reads through ``resolve`` URLs, pinned to commits. Read-only."""

    scheme = "hf"
    listable = True

    def __init__(self, options: HFOptions) -> None:
        self.options = options
        self.endpoint = hub_endpoint(options)
        self._process: Connections | None = None

    def __getstate__(self):
        return {"options": self.options}

    def __setstate__(self, state):
        self.__init__(state["options"])

    def _state(self) -> Connections:
        state = self._process
        if state is None or state.pid != os.getpid():
            # Nothing of another process's (a parent's pool, its threads) is used after a fork.
            state = self._process = Connections(self.options)
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
        return origin_of(target) == origin_of(self.endpoint)

    def _follow(self, hub: HubURL, method: str, headers: dict, url: str, offset: int | None, *, head: bool = False):
        """(the final response, the Hub's own last response's headers, the other host's URL it
        came from or None): the redirects followed here, the token sent to the Hub's origin only."""
        target = hub.resolve(self.endpoint)
        hub_headers: Any = {}
        for _ in range(MAX_HOPS + 1):
            at_hub = self._at_hub(target)
            response = self._send(method, target, headers, auth=at_hub)
            if at_hub:
                hub_headers = response.headers
            location = response.headers.get("Location")
            if head and at_hub and "X-Linked-Size" in response.headers:
                return response, hub_headers, None  # the Hub's redirect says the size: no need to ask the file store
            if response.status not in REDIRECTS or not location:
                try:
                    self._raise_for(response, target, hub, url, offset, at_hub)
                except BaseException:
                    response.close()
                    raise
                return response, hub_headers, None if at_hub else target
            release(response)
            target = self._redirect(target, location, hub, url, offset, f"shard {url!r}: ")
        raise StoreError(f"{at_offset(offset)}more than {MAX_HOPS} redirects from {self.endpoint}", url=url, offset=offset,
                         subject=f"shard {url!r}: ")

    def _redirect(self, target: str, location: str, hub: HubURL, url: str, offset: int | None, subject: str) -> str:
        """The URL the redirect from ``target`` to ``location`` leads to (see :func:`next_url`);
        a :class:`StoreError` when it is none. A renamed repository is noted (:func:`_note_moved`)."""
        try:
            following = next_url(target, location)
        except ValueError as exc:
            raise StoreError(f"{at_offset(offset)}{host_of(target)} redirected to {location[:300]!r}, which hydrax cannot follow: {exc}",
                             url=url, offset=offset, subject=subject) from None
        if self._at_hub(following):
            _note_moved(self.endpoint, hub, following)
        return following

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
            release(response)  # a signed URL that expired, or was withdrawn: ask the Hub again
            state.locations.pop(url, None)
        response, hub_headers, elsewhere = self._follow(hub, "GET", headers, url, offset)
        linked = header_count(hub_headers.get("X-Linked-Size")) if elsewhere is not None else None
        try:
            check_version(hub, hub_headers, url, offset, version)
        except BaseException:
            response.close()
            raise
        if elsewhere is not None:
            state.locations[url] = (elsewhere, time.monotonic() + LOCATION_SECONDS, linked)
        return response, elsewhere or hub.resolve(self.endpoint), linked

    # -- errors --------------------------------------------------------------------------------
    def _raise_for(self, response, target: str, hub: HubURL, url: str, offset: int | None, at_hub: bool,
                   action: str = "read") -> None:
        """Nothing for a success; :class:`Transient` for what may pass; else hydrax's error."""
        status = response.status
        if status < 300:
            return
        host = host_of(target)
        said = server_words(response)
        if status == 429 or status >= 500:
            raise Transient(f"{status} {response.reason} from {host}{said}", retry_after_seconds(response.headers.get("Retry-After")))
        at = "" if action != "read" else at_offset(offset)
        subject = subject_of(action, url)
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
                words = transient_words(exc)
                if words is None:
                    raise
                if attempt + 1 == attempts:
                    raise StoreUnavailableError(f"{at_offset(offset)}the request failed after retries ({attempts} attempts): {words}",
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
        release(response)
        check_version(hub, hub_headers, url, None, None)
        size = header_count(hub_headers.get("X-Linked-Size") or response.headers.get("Content-Length"))
        if size is None:
            raise StoreError(f"the Hub gave no size for it (X-Linked-Size or Content-Length) in its answer to HEAD {hub.resolve(self.endpoint)}",
                             url=url, subject=f"shard {url!r}: ")
        etag = normal_etag(hub_headers.get("X-Linked-Etag") or hub_headers.get("ETag") or response.headers.get("ETag"))
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
            raise StoreError(f"the Hub's answer about revision {revision!r} of {hub.words} names no commit: {json_shape(data)}",
                             url=url, subject=f"hf:// URL {url!r}: ")
        return sha

    # -- revisions -----------------------------------------------------------------------------
    def pin(self, url: str, pins: dict | None = None) -> str:
        """``url`` at the commit its revision (``main`` when it names none) points at now: one
        request per repository and revision (``pins`` keeps them, and the :class:`Pin` s, for a
        set-up); a URL pinned to a commit already is returned as it is."""
        hub = parse_url(url)
        if hub.pinned:
            return url
        revision = hub.revision or "main"
        key = (self.endpoint, hub.at(None).root.lower(), revision)
        pins = {} if pins is None else pins
        pin = pins.get(key)
        if pin is None:
            pin = pins[key] = Pin(self.endpoint, hub.at(None).root, revision, self.commit_of(url), url)
        return hub.at(pin.commit).url

    def _json(self, target: str, hub: HubURL, url: str, action: str = "read", missing_ok: bool = False):
        """(parsed JSON, the next page's URL or None) of an API request; (None, None) for a
        missing folder when ``missing_ok``. Redirects within the Hub's host are followed (the
        Hub's answer for a renamed repository), the token sent on to the Hub's origin only."""
        subject = subject_of(action, url)
        for _ in range(MAX_HOPS + 1):
            at_hub = self._at_hub(target)
            response = self._send("GET", target, {"Accept": "application/json"}, auth=at_hub)
            try:
                location = response.headers.get("Location")
                if response.status in REDIRECTS and location:
                    target = within_hub(self.endpoint, target, self._redirect(target, location, hub, url, None, subject), url, subject)
                    continue
                if missing_ok and response.status == 404 and response.headers.get("X-Error-Code") == "EntryNotFound":
                    return None, None
                self._raise_for(response, target, hub, url, None, at_hub, action)
                data = api_json(response, target, url, subject)
                following = next_page(response.headers.get("Link", ""))
                if following is not None:
                    try:
                        following = next_url(target, following)
                    except ValueError as exc:
                        raise StoreError(f"the Hub's answer to {target} names a next page {following[:300]!r} that hydrax "
                                         f"cannot follow: {exc}", url=url, subject=subject) from None
                    following = within_hub(self.endpoint, target, following, url, subject)
                return data, following
            finally:
                release(response)
        raise StoreError(f"more than {MAX_HOPS} redirects from {self.endpoint} for one request of its API (the last to "
                         f"{target})", url=url, subject=subject)

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
                                 subject=subject_of("list", prefix))
            seen.add(target)
            page, target = self._retry(prefix, None, functools.partial(self._json, target, hub, prefix, "list", True))
            if page is None:
                return []
            if not isinstance(page, list):
                raise StoreError(f"the Hub's tree listing is not a list: {json_shape(page)}", url=prefix, subject=subject_of("list", prefix))
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
                whole = unranged_part(response, target, url, offset, size, self.options.max_unranged_bytes, self._state().warned)
                # None: the whole file was asked for, and _unranged saw that its length is size
                return whole if whole is not None else read_body(response, url, offset, size, f"bytes {offset}-{offset + size - 1}")
            if ranged:
                expected = check_range(response, url, offset, size)
                return read_body(response, url, offset, expected, f"bytes {offset}-{offset + expected - 1}")
            return whole_body(response, target, url, linked)
        except BaseException:
            response.close()  # what is left of the body is not read: the connection is not reused
            raise

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
                    piece = await loop.run_in_executor(pool, read_piece, response, STREAM_CHUNK if left > STREAM_CHUNK else left + 1)
                    if len(piece) > left:
                        raise excess_error(url, offset, f"bytes {offset}-{end - 1}", end - offset, f"went on sending past byte {end - 1}")
                    position += len(piece)
                    yield piece
            except StoreError:
                raise
            except Exception as exc:
                words = transient_words(exc)
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
                whole = unranged_part(response, target, url, start, end - start, self.options.max_unranged_bytes,
                                      self._state().warned)
                if whole is not None:
                    return whole
            else:
                check_range(response, url, start, end - start)
            check_encoding(response, url, start)
            declared = header_count(response.headers.get("Content-Length"))
            if declared is not None and declared > end - start:
                raise excess_error(url, start, f"bytes {start}-{end - 1}", end - start, f"announces {declared} bytes")
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


def _note_moved(endpoint: str, hub: HubURL, target: str) -> None:
    """Log, once per repository in a process, that the Hub at ``endpoint`` sends the requests for ``hub``'s
    repository to another one (the Hub's answer for a renamed repository): its URLs still work,
    through one more request each, until the old name is taken by a new repository."""
    base = parse_address(endpoint).path or ""
    path = parse_address(target).path or ""
    match = _REPO_PATH.match(path[len(base.rstrip("/")):]) if path.startswith(base.rstrip("/")) else None
    if match is None:
        return
    moved_to = urllib.parse.unquote(match.group(2))
    key = (endpoint, hub.kind, hub.repo_id)
    if moved_to == hub.repo_id or key in _moved:
        return
    _moved.add(key)
    new_url = dataclasses.replace(hub, repo_id=moved_to).url
    log.warning("%s at %s has moved to %s: the Hub redirects each of its requests there until another repository takes "
                "the old name; write %s instead of %s", hub.words, endpoint, moved_to, new_url, hub.url)


def _missing(hub: HubURL, code: str, endpoint: str) -> str:
    if code == "RepoNotFound":
        return f"{hub.words} does not exist at {endpoint} (or is private, and the token sent may not read it)"
    if code == "RevisionNotFound":
        return f"the revision {hub.revision or 'main'!r} does not exist in {hub.words}"
    return f"does not exist in {hub.words} at revision {hub.revision or 'main'!r}"


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
