"""The HTTP client under the Hub's store: connections, where a request goes, and reading answers.

One urllib3 pool per process, shared by its threads (:class:`Connections`), and a pool of threads
for asynchronous reads; every URL is read once with urllib3's own parser (:func:`parse_address`),
so that the host judged is the host connected to (see :mod:`hydrax.shards.hub` on where the
token goes). The rest reads answers within bounds: a ranged body is checked against the range
asked for (:func:`check_range`, :func:`read_body`), a whole file against the size the Hub said
(:func:`whole_body`), an answer of the API against :data:`MAX_API_BYTES` (:func:`api_json`), and
a server that drops ``Range`` is handled by :func:`unranged_part`. These are functions of a
response, apart from :class:`~hydrax.shards.hub.store.HubStore`, which decides what to ask.
"""

from __future__ import annotations

import email.utils
import itertools
import json
import logging
import os
import re
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from ...errors import ObjectChangedError, StoreError
from ..options import HFOptions

if TYPE_CHECKING:
    from .url import HubURL

log = logging.getLogger(__name__)

#: The most bytes of one answer of the Hub's API (a revision, a page of a tree listing) that are
#: read: a page of a thousand files is a few hundred KiB, and a longer answer is refused before it
#: fills memory.
MAX_API_BYTES = 32 << 20

#: The statuses of a redirect, and the most redirects followed for one request.
REDIRECTS = (301, 302, 303, 307, 308)
MAX_HOPS = 5
_DEFAULT_PORTS = {"http": 80, "https": 443}
# The most of an unwanted body (a redirect's, the rest of an error's) read so that its connection
# can serve another request; a longer one (or one that never ends) closes the connection instead.
_DISCARD_BYTES = 64 << 10
# The most one read of a body asks for at once (http.client allocates what it is asked for).
_PIECE = 64 << 20
# At most 19 digits: int() of the 5,000-digit number a hostile header may hold is a ValueError.
_CONTENT_RANGE = re.compile(r"bytes\s+(\d{1,19})-(\d{1,19})/(\d{1,19}|\*)")
#: A whole number as a header (or a URL's port) may hold it, in at most 19 digits (see above).
COUNT = re.compile(r"[0-9]{1,19}")
_LINK = re.compile(r'<([^>]*)>\s*;\s*rel="?([^";]*)"?.*')


class Transient(Exception):
    """A failure worth another attempt; ``retry_after``: the wait the server asked for, if any."""

    def __init__(self, words: str, retry_after: float | None = None) -> None:
        super().__init__(words)
        self.retry_after = retry_after


def normal_etag(value: str | None) -> str | None:
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


def parse_address(url: str):
    """``url`` as urllib3 reads it (a ``urllib3.util.Url``; a ValueError when it cannot). urllib3
    picks the host to connect to with this parser; urllib.parse reads some URLs as another host
    (``http://a:1\\@b:2/`` is ``a`` port 1 to urllib3, ``b`` port 2 to urllib.parse), so every
    decision about where a request goes is made on this reading."""
    return _urllib3().util.parse_url(url)


def origin_of(url: str) -> tuple[str, str, int | None]:
    """(scheme, host, port) that a request to ``url`` connects to, default ports written in."""
    parsed = parse_address(url)
    scheme = (parsed.scheme or "").lower()
    port = parsed.port if parsed.port is not None else _DEFAULT_PORTS.get(scheme)
    return scheme, (parsed.host or "").lower(), port


def host_of(url: str) -> str:
    """``host:port`` of ``url`` as a request to it connects, for messages."""
    try:
        scheme, host, port = origin_of(url)
    except ValueError:
        return url[:200]
    return host if port == _DEFAULT_PORTS.get(scheme) else f"{host}:{port}"


def next_url(base: str, location: str) -> str:
    """The URL a redirect's ``Location`` (or a ``Link``) on the answer from ``base`` leads to,
    written as urllib3 reads it: the request is sent to exactly the URL whose origin was judged.
    A ValueError when it is no http(s) URL with a host."""
    parsed = parse_address(urllib.parse.urljoin(base, location))
    if (parsed.scheme or "").lower() not in _DEFAULT_PORTS or not parsed.host:
        raise ValueError("it is no http:// or https:// URL with a host")
    # No user name goes on (none is sent anyway); a fragment is no part of a request.
    return parsed._replace(auth=None, fragment=None).url


def header_count(value: str | None) -> int | None:
    """A header's whole number (Content-Length, X-Linked-Size), or None when it holds none."""
    value = (value or "").strip()
    return int(value) if COUNT.fullmatch(value) else None


def retry_after_seconds(value: str | None) -> float | None:
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


class Connections:
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
        origin = origin_of(target)
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
                from ...procs.processes import note_fork_hazard

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


def release(response) -> None:
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


def at_offset(offset: int | None) -> str:
    return "" if offset is None else f"at byte offset {offset}: "


def subject_of(action: str, url: str) -> str:
    """How an error's message names what was asked for: a listing, a revision, or a shard."""
    return {"list": f"listing {url!r}: ", "revision": f"hf:// URL {url!r}: "}.get(action, f"shard {url!r}: ")


def json_shape(value) -> str:
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


def api_json(response, target: str, url: str, subject: str):
    """The JSON of an answer of the Hub's API: at most :data:`MAX_API_BYTES` of it read, and
    nesting too deep for Python's parser a :class:`StoreError` (both are answers no retry mends);
    bytes that are not JSON at all may be a body cut short, so they are worth another attempt."""
    declared = header_count(response.headers.get("Content-Length"))
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
        raise Transient(f"the Hub's answer to {target} is not JSON ({exc})") from None


def server_words(response) -> str:
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


def transient_words(exc: BaseException) -> str | None:
    """What a failure that may pass was, in words; None when it will not pass."""
    if isinstance(exc, Transient):
        return str(exc)
    if isinstance(exc, ImportError):  # urllib3 missing: the words say which extra to install
        return None
    import http.client

    import urllib3

    if isinstance(exc, (urllib3.exceptions.HTTPError, http.client.HTTPException, ConnectionError, TimeoutError)):
        return f"{type(exc).__name__}: {exc}"
    return None


def next_page(link: str) -> str | None:
    """The ``rel="next"`` URL of a ``Link`` header (the Hub's pagination), or None."""
    for part in link.split(","):
        match = _LINK.fullmatch(part.strip())
        if match and "next" in match.group(2).split():
            return match.group(1)
    return None


def check_range(response, url: str, offset: int, size: int | None) -> int:
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


def check_encoding(response, url: str, offset: int | None) -> None:
    encoding = response.headers.get("Content-Encoding", "identity").strip().lower()
    if encoding not in ("identity", ""):
        raise StoreError(f"{at_offset(offset)}the server sent the bytes {encoding[:50]}-encoded, though asked not to", url=url,
                         offset=offset, subject=f"shard {url!r}: ")


def excess_error(url: str, offset: int | None, asked: str, expected: int, how: str) -> StoreError:
    return StoreError(f"{at_offset(offset)}asked for {asked} ({expected} bytes), the server {how}: hydrax reads no more than it asked "
                      "for. The server, or a proxy between, does not keep to the range or size of the file", url=url,
                      offset=offset, subject=f"shard {url!r}: ")


def read_body(response, url: str, offset: int | None, expected: int, asked: str):
    """The body of ``response``, which must be ``expected`` bytes (``asked``, in words): at most
    one byte more is read, to see that there is more, so a body that goes on (for gigabytes, or
    without end) costs no more memory than the one asked for. A shorter body may pass: it is
    worth another attempt."""
    check_encoding(response, url, offset)
    declared = header_count(response.headers.get("Content-Length"))
    if declared is not None and declared > expected:
        raise excess_error(url, offset, asked, expected, f"announces {declared} bytes")
    data = _read_upto(response, expected + 1)
    if len(data) > expected:
        raise excess_error(url, offset, asked, expected, "sent more")
    if len(data) < expected:
        raise Transient(f"the body ended after {len(data)} of {expected} bytes")
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


def read_piece(response, size: int):
    piece = response.read(size, decode_content=False)
    if not piece:
        raise Transient("the response ended early")
    return piece


def check_version(hub: HubURL, headers, url: str, offset: int | None, version: str | None) -> None:
    """An answer from another commit, or with other content than was indexed, is an
    :class:`~hydrax.errors.ObjectChangedError`, as a replaced object is in S3."""
    commit = headers.get("X-Repo-Commit")
    if hub.pinned and commit and commit != hub.revision:
        raise ObjectChangedError(f"{at_offset(offset)}the Hub answered from commit {commit}, not the pinned commit {hub.revision}",
                                 url=url, offset=offset, subject=f"shard {url!r}: ")
    etag = normal_etag(headers.get("X-Linked-Etag") or headers.get("ETag"))
    if version is not None and etag is not None and etag != version:
        raise ObjectChangedError(f"{at_offset(offset)}the Hub answers with ETag {etag}, but the file was indexed as version "
                                 f"{version}: it serves another file than was indexed; set the ShardSet up again", url=url,
                                 offset=offset, subject=f"shard {url!r}: ")


def whole_body(response, target: str, url: str, linked: int | None):
    """The body of the answer to a read of a whole file: as long as the Hub said the file is
    (``X-Linked-Size`` on its redirect, else the answer's ``Content-Length``), and not a byte
    more is read; an answer of no stated size is refused rather than read without end."""
    if response.status != 200:
        raise StoreError(f"a read of the whole file was answered with {response.status} {response.reason} from "
                         f"{host_of(target)}", url=url, subject=f"shard {url!r}: ")
    declared = header_count(response.headers.get("Content-Length"))
    expected = linked if linked is not None else declared
    if expected is None:
        raise StoreError(f"{host_of(target)} sent the whole file without saying its size (no X-Linked-Size from the Hub, no "
                         "Content-Length): hydrax reads no body of unknown length. A proxy between may have dropped the "
                         "header", url=url, subject=f"shard {url!r}: ")
    said = "the Hub said" if linked is not None else "its Content-Length said"
    return read_body(response, url, None, expected, f"the whole file ({expected} bytes, as {said})")


def unranged_part(response, target: str, url: str, offset: int, size: int | None, limit: int, warned: set):
    """The part asked for of a whole object sent in answer to a ranged request (see the
    :mod:`hydrax.shards.hub` docstring), or None when the whole object is what was asked for.
    ``limit``: ``HFOptions.max_unranged_bytes``; ``warned``: the hosts already warned of."""
    total = header_count(response.headers.get("Content-Length"))
    if offset == 0 and total is not None and (size is None or size == total):
        return None
    host = host_of(target)
    if total is None or total > limit:
        raise StoreError(f"at byte offset {offset}: {host} ignored the Range header and began sending the whole file "
                         f"({'of unknown size' if total is None else f'{total} bytes'}); hydrax downloads a whole file for "
                         f"part of it only up to HFOptions(max_unranged_bytes={limit}). A proxy between here and {host} may "
                         "drop Range headers", url=url, offset=offset, subject=f"shard {url!r}: ")
    if host not in warned:
        warned.add(host)
        log.warning("%s ignores Range headers: files of up to %d bytes are downloaded whole and cut (first seen for %s)",
                    host, limit, url)
    data = read_body(response, url, offset, total, f"the whole file ({total} bytes, as its Content-Length said)")
    end = len(data) if size is None else offset + size
    if end > len(data):
        raise ObjectChangedError(f"at byte offset {offset}: the file has {len(data)} bytes, fewer than the {end} its index "
                                 "says", url=url, offset=offset, subject=f"shard {url!r}: ")
    return memoryview(data)[offset:end]


def within_hub(endpoint: str, target: str, following: str, url: str, subject: str) -> str:
    """``following`` (a redirect or next page of an API answer from ``target``) when it is on
    the Hub's host; a :class:`StoreError` otherwise: the Hub's API answers on its own host."""
    if origin_of(following)[1] != origin_of(endpoint)[1]:
        raise StoreError(f"the Hub's answer to {target} sends this API request on to another host ({host_of(following)}); "
                         f"hydrax follows the API's redirects and pages within {host_of(endpoint)} only. Check "
                         "HF_ENDPOINT (or HFOptions(endpoint=...)), and any proxy between", url=url, subject=subject)
    return following
