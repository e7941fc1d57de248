"""Where shards live: one interface over local files, S3, GCS, HTTP(S) and the Hugging Face Hub.

Everything hydrax reads or writes about shards goes through a :class:`Store`: ``stat``, ranged and
whole reads, streams, listings, writes and deletes, each raising hydrax's own
:class:`~hydrax.errors.StoreError` kinds with the URL and byte offset.
:func:`hydrax.shards.router.store_for` picks the store for a URL.

Remote stores use obstore (Rust's ``object_store``): requests run on its own threads without the
GIL, many at once, and the same code serves ``s3://``, ``gs://`` and ``http(s)://``. It was chosen
by measurement over boto3 with a thread pool and over fsspec/s3fs (see
``docs/object-storage.rst``). Its threads do not survive a ``fork``: once a remote store has been
used in a process, hydrax starts its workers from the fork server instead (see
:func:`hydrax.procs.workers.note_fork_hazard`); a worker makes its own store on first use.

``hf://`` URLs (datasets and models on the Hugging Face Hub) are served by
:class:`hydrax.shards.hub.HubStore`, which speaks the Hub's own API (the router sends them
there); this module holds their :class:`HFOptions`.

Reads may be pinned to an object *version* (the ETag an index was built from): a replaced
object is then an :class:`~hydrax.errors.ObjectChangedError`, never another object's bytes.
Transient failures (connection errors, resets, truncated bodies, 5xx, timeouts) are retried with
backoff up to ``max_attempts`` times, then raised as
:class:`~hydrax.errors.StoreUnavailableError` naming the object and offset. A store set up wrongly
(an endpoint URL that is not one, an ``http://`` endpoint obstore may not use, no credentials, an
option obstore rejects) cannot be cured by waiting: it is a
:class:`~hydrax.errors.StoreConfigError` at the first attempt, naming the setting to fix.
"""

from __future__ import annotations

import asyncio
import dataclasses
import fnmatch
import glob as globbing
import json
import logging
import os
import re
import tempfile
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, AsyncIterator, Sequence

from ..errors import (AccessDeniedError, HydraxError, MissingPermissionError, ObjectChangedError, ObjectNotFoundError,
                      StoreConfigError, StoreError, StoreUnavailableError)

log = logging.getLogger(__name__)

#: URL schemes served by an object store.
REMOTE_SCHEMES = ("s3", "gs", "http", "https", "hf")
#: Remote schemes whose stores list a folder in one request (so set-up needs no HEAD per shard).
LISTABLE_SCHEMES = ("s3", "gs", "hf")
_STREAM_CHUNK = 4 << 20


@dataclass(frozen=True)
class S3Options:
    """How to reach an S3-compatible store; None means the standard AWS default for that setting."""

    endpoint_url: str | None = None
    region: str | None = None
    access_key_id: str | None = None
    secret_access_key: str | None = None
    session_token: str | None = None
    #: Attempts per request before a :class:`~hydrax.errors.StoreUnavailableError`.
    max_attempts: int = 5
    #: Seconds to wait for a connection, and for a whole response, per attempt.
    connect_timeout: float = 10.0
    read_timeout: float = 60.0


@dataclass(frozen=True)
class GCSOptions:
    """How to reach Google Cloud Storage (or an emulator at ``endpoint_url``).

    Credentials come the standard Google way (``GOOGLE_APPLICATION_CREDENTIALS``, the metadata
    server) unless ``service_account_path`` names a key file; ``anonymous`` sends unsigned
    requests (public buckets, emulators).
    """

    endpoint_url: str | None = None
    service_account_path: str | None = None
    anonymous: bool = False
    max_attempts: int = 5
    connect_timeout: float = 10.0
    read_timeout: float = 60.0


@dataclass(frozen=True)
class HTTPOptions:
    """Plain HTTP(S) servers that honour ``Range`` requests (no listing: name shards explicitly)."""

    max_attempts: int = 5
    connect_timeout: float = 10.0
    read_timeout: float = 60.0


@dataclass(frozen=True)
class HFOptions:
    """How to reach the Hugging Face Hub for ``hf://`` URLs (see :mod:`hydrax.shards.hub`).

    ``token`` None takes the ``HF_TOKEN`` environment variable, else the login huggingface_hub
    stored (``hf auth login``); ``endpoint`` None takes ``HF_ENDPOINT``, else
    ``https://huggingface.co``, as huggingface_hub does. The token is left out of the repr.
    """

    token: str | None = field(default=None, repr=False)
    endpoint: str | None = None
    max_attempts: int = 5
    connect_timeout: float = 10.0
    read_timeout: float = 60.0
    #: A server or proxy that ignores ``Range`` answers with the whole object: for an object of at
    #: most this many bytes the part asked for is cut out of it; a larger one is a
    #: :class:`~hydrax.errors.StoreError` (downloading gigabytes for a sample is never silent).
    max_unranged_bytes: int = 8 << 20
    #: Requests in flight at once per process (the connection pool's size, and the threads that
    #: serve read-ahead's asynchronous reads).
    connections: int = 64


@dataclass(frozen=True)
class StoreOptions:
    """Settings for every kind of remote store; a URL's scheme picks the part that applies."""

    s3: S3Options = field(default_factory=S3Options)
    gcs: GCSOptions = field(default_factory=GCSOptions)
    http: HTTPOptions = field(default_factory=HTTPOptions)
    hf: HFOptions = field(default_factory=HFOptions)

    def for_scheme(self, scheme: str):
        if scheme == "hf":
            return self.hf
        return self.s3 if scheme == "s3" else self.gcs if scheme == "gs" else self.http


@dataclass(frozen=True)
class ObjectInfo:
    """One object (or file): its URL, size, version and modification time.

    ``version`` is the ETag for remote objects and ``None`` for local files (which are tied to
    their size and modification time instead).
    """

    url: str
    size: int
    version: str | None
    mtime_ns: int


def scheme_of(url: str) -> str:
    """``"s3"``, ``"gs"``, ``"http"``, ``"https"``, ``"hf"``, or ``"file"`` for local paths and ``file://`` URLs."""
    head, sep, _ = url.partition("://")
    return head.lower() if sep else "file"


def is_remote(url: str) -> bool:
    """Whether ``url`` names an object in a remote store."""
    return scheme_of(url) in REMOTE_SCHEMES


def local_path(url: str) -> str:
    """The path of a local ``url`` (``file://`` removed)."""
    return url[len("file://"):] if url.startswith("file://") else url


def pattern_folder(pattern: str) -> str:
    """The folder (ending in ``/``) whose listing holds every match of the shell pattern ``pattern``."""
    cut = min((pattern.find(c) for c in "*?[" if c in pattern), default=len(pattern))
    return pattern[:cut].rpartition("/")[0] + "/"


class Store:
    """The operations hydrax needs from a place shards live; see the module docstring."""

    scheme = "file"

    def stat(self, url: str) -> ObjectInfo:
        raise NotImplementedError

    def list(self, prefix: str) -> list[ObjectInfo]:
        """Every object whose URL starts with ``prefix``, sorted by URL."""
        raise NotImplementedError

    def glob(self, pattern: str) -> list[ObjectInfo]:
        """Objects matching the shell pattern ``pattern`` (``*``, ``?``, ``[...]``), sorted."""
        return [info for info in self.list(pattern_folder(pattern)) if fnmatch.fnmatchcase(info.url, pattern)]

    def read(self, url: str, offset: int = 0, size: int | None = None, *, version: str | None = None):
        """``size`` bytes of ``url`` from ``offset`` (to the end when None), as a bytes-like object."""
        raise NotImplementedError

    def write(self, url: str, data) -> ObjectInfo:
        """Store ``data`` (bytes-like) at ``url`` whole, atomically: readers never see part of it."""
        raise NotImplementedError

    def upload(self, url: str, path: str) -> ObjectInfo:
        """Store the local file ``path`` at ``url``, atomically."""
        with open(path, "rb") as f:
            return self.write(url, f.read())

    def delete(self, url: str) -> None:
        raise NotImplementedError

    # The asynchronous forms serve read-ahead and set-up, which keep many requests in flight.
    async def stat_async(self, url: str) -> ObjectInfo:
        return await asyncio.to_thread(self.stat, url)

    async def read_async(self, url: str, offset: int = 0, size: int | None = None, *, version: str | None = None):
        return await asyncio.to_thread(self.read, url, offset, size, version=version)

    async def stream_async(self, url: str, offset: int, end: int, *, version: str | None = None) -> AsyncIterator[Any]:
        """The bytes ``[offset, end)`` of ``url`` in pieces, as they arrive."""
        yield await self.read_async(url, offset, end - offset, version=version)


def _umask() -> int:
    """This process's umask, read without changing it (``os.umask`` would, for every thread)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022


def write_atomic(path: str, data, prefix: str = ".hydrax-") -> None:
    """Write ``data`` to the local file ``path`` atomically: a temporary file beside it, then a
    rename, so readers see the old file or the whole new one. The file is as readable as any the
    user writes (the umask applies; ``mkstemp`` alone would make it private)."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, temporary = tempfile.mkstemp(prefix=prefix, dir=folder)
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise


class LocalStore(Store):
    """Files on a local (or network-mounted) file system."""

    scheme = "file"

    def stat(self, url: str) -> ObjectInfo:
        path = local_path(url)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            raise ObjectNotFoundError("does not exist (check the path or pattern)", url=url, subject=f"shard {url!r} ") from None
        except PermissionError as exc:
            raise AccessDeniedError(str(exc.strerror), url=url, subject=f"shard {url!r}: ") from exc
        return ObjectInfo(url, st.st_size, None, st.st_mtime_ns)

    def list(self, prefix: str) -> list[ObjectInfo]:
        return self.glob(globbing.escape(local_path(prefix)) + "*")

    def glob(self, pattern: str) -> list[ObjectInfo]:
        found = []
        for path in sorted(globbing.glob(local_path(pattern))):
            try:
                st = os.stat(path)
            except OSError:
                continue
            if not os.path.isdir(path):
                found.append(ObjectInfo(path, st.st_size, None, st.st_mtime_ns))
        return found

    def read(self, url: str, offset: int = 0, size: int | None = None, *, version: str | None = None):
        path = local_path(url)
        try:
            with open(path, "rb") as f:
                if size is None:
                    f.seek(offset)
                    return f.read()
                data = os.pread(f.fileno(), size, offset)
        except FileNotFoundError:
            raise ObjectNotFoundError("does not exist", url=url, offset=offset, subject=f"shard {url!r} ") from None
        except OSError as exc:
            raise StoreError(f"at byte offset {offset}: {exc}", url=url, offset=offset, subject=f"shard {url!r} ") from exc
        if len(data) != size:
            raise ObjectChangedError(f"asked for {size} bytes at byte offset {offset}, the file has {len(data)} there "
                                     "(it changed since it was indexed)", url=url, offset=offset, subject=f"shard {url!r}: ")
        return data

    def write(self, url: str, data) -> ObjectInfo:
        write_atomic(local_path(url), data)
        return self.stat(local_path(url))

    def delete(self, url: str) -> None:
        try:
            os.unlink(local_path(url))
        except FileNotFoundError:
            pass


# ---------------------------------------------------------------------------------------------
# Remote stores through obstore


_PERMISSION = {"read": ("s3:GetObject", "storage.objects.get"), "list": ("s3:ListBucket", "storage.objects.list"),
               "write": ("s3:PutObject", "storage.objects.create"), "delete": ("s3:DeleteObject", "storage.objects.delete")}
_CODE = re.compile(r"<Code>\s*([A-Za-z]+)\s*</Code>|\"reason\"\s*:\s*\"([A-Za-z]+)\"")
_CONNECT = re.compile(r"error sending request|[Cc]onnection refused|tcp connect error|dns error")
_REFUSED_CODES = ("InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken", "ExpiredToken", "AuthenticationRequired")
# What reqwest, the url crate, http's Uri and object_store say about a request that cannot be made
# as configured; seen against a real S3 server: "HTTP error: builder error" (an http:// URL where
# http is not allowed, or another scheme), "Generic Config error: failed to parse ...", "Could not
# parse path: ...", and panics "request valid: InvalidUri(InvalidUri(InvalidFormat))" and
# "called `Result::unwrap()` on an `Err` value: InvalidPort" for an endpoint or bucket that makes
# no URL. Waiting never changes these, so they are not retried.
_MISCONFIGURED = re.compile(r"builder error|URL scheme is not allowed|relative URL without a base|empty host|invalid port number|"
                            r"invalid (?:IPv[46] address|domain character|international domain name)|Generic Config error|"
                            r"[Cc]ould not parse path|InvalidUri\(|InvalidPort")
_REFUSED_SCHEME = re.compile(r"builder error|URL scheme is not allowed")
# Fetching credentials from an EC2, ECS or Google metadata service: when no credentials are set,
# object_store asks there, and one that does not answer means none are set up on this machine.
_CREDENTIAL_SERVICE = re.compile(r"/latest/api/token|/latest/meta-data/iam|169\.254\.170\.2|/computeMetadata/")
# ... unless the service itself answered that it is busy or failing, which may pass.
_SERVER_TROUBLE = re.compile(r"status code: (?:5\d\d|429)\b")


def split_url(url: str, need_key: bool = True) -> tuple[str, str, str]:
    """(scheme, container, key): the bucket for s3/gs, ``scheme://host`` for http(s)."""
    scheme = scheme_of(url)
    rest = url.split("://", 1)[1]
    container, _, key = rest.partition("/")
    if not container or (need_key and not key):
        raise ValueError(f"shard URL {url!r} must look like {scheme}://{'bucket' if scheme in ('s3', 'gs') else 'host'}/key")
    return scheme, container, key


def _seconds(value: float) -> timedelta:
    return timedelta(seconds=float(value))


class _Misconfigured(HydraxError):
    """The client could not be made as configured; the words say which setting to fix."""


def _is_failure(exc: BaseException) -> bool:
    """Whether ``exc``, raised by a request, is the request's failure to explain (an ``Exception``,
    or a panic of obstore's over a URL it cannot form), rather than an interrupt to pass on."""
    if isinstance(exc, Exception):
        return True
    # pyo3 panics derive from BaseException and have no importable class.
    return type(exc).__name__ == "PanicException" and bool(_MISCONFIGURED.search(str(exc)))


def _endpoint_problem(endpoint: str) -> str | None:
    """Why ``endpoint`` is no URL to send requests to, or None. Checked before obstore sees it,
    which otherwise panics on the first request (``InvalidUri``) or refuses it (``builder error``)."""
    if any(c.isspace() for c in endpoint):
        return "a URL has no spaces"
    try:
        parts = urllib.parse.urlsplit(endpoint)
    except ValueError:  # urllib's word for an unclosed IPv6 bracket ("http://[::1")
        return "its host is not a host name or an address (an IPv6 address goes in brackets: http://[::1]:9000)"
    if parts.scheme.lower() not in ("http", "https"):
        return "it must start with http:// or https://"
    try:
        port_ok = parts.port is None or parts.port >= 0
    except ValueError:  # urllib's word for a port that is no number below 65536
        port_ok = False
    if not port_ok:
        return "its port is not a number from 0 to 65535"
    if not parts.hostname:
        return "it names no host (the form is http://host:port)"
    return None


class ObjectStore(Store):
    """An S3 bucket, a GCS bucket or an HTTP(S) server, through obstore.

    The obstore client is made on first use in each process (a client never crosses a fork).
    ``endpoint_variable`` names the environment variable the S3 endpoint came from (see
    :func:`with_environment`), None when it was given in the options or there is none; error
    messages name it.
    """

    def __init__(self, scheme: str, container: str, options: StoreOptions, endpoint_variable: str | None = None) -> None:
        self.scheme = scheme
        self.container = container
        self.options = options.for_scheme(scheme)
        self.endpoint_variable = endpoint_variable
        self._client: Any = None
        self._pid = -1
        self._lock = threading.Lock()

    def __getstate__(self):
        return {"scheme": self.scheme, "container": self.container, "options": self.options,
                "endpoint_variable": self.endpoint_variable}

    def __setstate__(self, state):
        self.__init__(state["scheme"], state["container"], StoreOptions(), state.get("endpoint_variable"))
        self.options = state["options"]

    @property
    def _prefix(self) -> str:
        return f"{self.scheme}://{self.container}/"

    def client(self):
        """This process's obstore client."""
        if self._pid == os.getpid():
            return self._client
        with self._lock:
            if self._pid != os.getpid():
                self._check_settings()
                try:
                    self._client = self._make_client()
                except ImportError:
                    raise
                except Exception as exc:  # building a client sends nothing: only the settings can be wrong
                    raise _Misconfigured(f"the {self._kind} store could not be set up: {_short(str(exc))}; "
                                         f"check {self._settings}") from exc
                self._pid = os.getpid()
                from ..procs.processes import note_fork_hazard

                note_fork_hazard("obstore's request threads (used for remote shards)")
        return self._client

    @property
    def _kind(self) -> str:
        return {"s3": "S3", "gs": "GCS"}.get(self.scheme, "HTTP")

    @property
    def _settings(self) -> str:
        """Where this store's settings come from, in words a user can act on."""
        if self.scheme == "s3":
            return ("S3Options (or --endpoint-url and --region) and the AWS_* environment variables "
                    "(AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, AWS_REGION, AWS_ACCESS_KEY_ID, ...)")
        if self.scheme == "gs":
            return "GCSOptions (or --endpoint-url) and GOOGLE_APPLICATION_CREDENTIALS"
        return f"the server URL {self.scheme}://{self.container}"

    def _endpoint_origin(self) -> str:
        """Where the endpoint URL was set."""
        if self.endpoint_variable:
            return f"the environment variable {self.endpoint_variable}"
        return f"{'S3Options' if self.scheme == 's3' else 'GCSOptions'}(endpoint_url=...) or --endpoint-url"

    def _check_settings(self) -> None:
        """Refuse an endpoint or region that makes no URL before obstore panics over it."""
        endpoint = getattr(self.options, "endpoint_url", None)
        problem = _endpoint_problem(endpoint) if endpoint else None
        if problem:
            raise _Misconfigured(f"the {self._kind} endpoint URL {endpoint!r}, set by {self._endpoint_origin()}, is not usable: "
                                 f"{problem}; set it to the server's URL, like http://127.0.0.1:9000")
        region = getattr(self.options, "region", None) or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
        if self.scheme == "s3" and not endpoint and region and not re.fullmatch(r"[A-Za-z0-9.-]+", region):
            origin = "S3Options(region=...) or --region" if self.options.region else "AWS_REGION or AWS_DEFAULT_REGION"
            raise _Misconfigured(f"the S3 region {region!r}, set by {origin}, is not a region name (like us-east-1)")

    def _make_client(self):
        try:
            from obstore.store import GCSStore, HTTPStore, S3Store
        except ImportError as exc:  # pragma: no cover - obstore is a dependency
            raise ImportError("remote shards need obstore: pip install obstore") from exc
        o = self.options
        client_options: dict[str, Any] = {"connect_timeout": _seconds(o.connect_timeout), "timeout": _seconds(o.read_timeout),
                                          "pool_max_idle_per_host": "64"}
        # This class retries every transient failure itself (bodies cut short and resets mid-stream
        # too, which obstore does not), so max_attempts counts attempts in all.
        retry = {"max_retries": 0, "retry_timeout": _seconds(o.read_timeout)}
        if self.scheme == "s3":
            config: dict[str, Any] = {}
            if o.endpoint_url:
                config["endpoint"] = o.endpoint_url
                client_options["allow_http"] = o.endpoint_url.lower().startswith("http://")
            region = o.region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
            if region:
                config["region"] = region
            if o.access_key_id:
                config["access_key_id"] = o.access_key_id
                config["secret_access_key"] = o.secret_access_key or ""
                if o.session_token:
                    config["session_token"] = o.session_token
            return S3Store(self.container, client_options=client_options, retry_config=retry, **config)
        if self.scheme == "gs":
            config = {}
            if o.service_account_path:
                config["service_account"] = o.service_account_path
            elif o.endpoint_url:
                # An emulator: a key that names its URL and asks for no OAuth token (object_store's
                # convention; a bare base URL would still fetch a token from the metadata server).
                config["service_account_key"] = json.dumps({"gcs_base_url": o.endpoint_url.rstrip("/"), "disable_oauth": True,
                                                            "client_email": "", "private_key": "", "private_key_id": ""})
            if o.endpoint_url:
                client_options["allow_http"] = o.endpoint_url.lower().startswith("http://")
            if o.anonymous:
                config["skip_signature"] = True
            return GCSStore(self.container, client_options=client_options, retry_config=retry, **config)
        client_options["allow_http"] = self.scheme == "http"
        return HTTPStore.from_url(f"{self.scheme}://{self.container}", client_options=client_options, retry_config=retry)

    def _key(self, url: str) -> str:
        scheme, container, key = split_url(url)
        if (scheme, container) != (self.scheme, self.container):
            raise ValueError(f"{url!r} is not in {self._prefix}")
        return key

    # -- errors ------------------------------------------------------------------------------
    def explain(self, url: str, exc: BaseException, action: str = "read", offset: int | None = None,
                version: str | None = None) -> StoreError:
        """hydrax's error for ``exc``, raised by obstore while doing ``action`` on ``url``."""
        from obstore import exceptions as ox

        if isinstance(exc, StoreError):
            return exc
        # "shard 'u' at byte offset N: what" or "shard 'u': what"; ``subject`` names the shard
        at = "" if offset is None else f"at byte offset {offset}: "
        shard = f"shard {url!r} " if at else f"shard {url!r}: "
        subject = f"listing {url!r}: " if action == "list" else shard
        where = "" if action == "list" else at
        text = str(exc)
        misconfigured = self._misconfiguration(exc, text)
        if misconfigured:
            return StoreConfigError(misconfigured, url=url, offset=offset, subject=f"listing {url!r}: " if action == "list" else f"shard {url!r}: ")
        match = _CODE.search(text)
        code = next((g for g in match.groups() if g), "") if match else ""
        permission = _PERMISSION[action][self.scheme == "gs"] if self.scheme in ("s3", "gs") else "read access"
        if isinstance(exc, (FileNotFoundError, ox.NotFoundError)) or code in ("NoSuchKey", "NoSuchBucket", "NotFound"):
            if code == "NoSuchBucket":
                return ObjectNotFoundError(f"the bucket {self.container!r} does not exist (NoSuchBucket)", url=url, offset=offset,
                                           subject=f"{url}: ")
            return ObjectNotFoundError(f"does not exist{f' ({code})' if code else ''}; check the bucket and key",
                                       url=url, offset=offset, subject=f"shard {url!r} ")
        if isinstance(exc, ox.PreconditionError) or code == "PreconditionFailed":
            return ObjectChangedError(
                f"{at}the object was replaced after it was indexed (it is no longer version {version}); "
                "rebuild its index (hydrax shards index --force) and restart", url=url, offset=offset, subject=shard)
        if code in _REFUSED_CODES or isinstance(exc, ox.UnauthenticatedError):
            return AccessDeniedError(f"{at}the store refused the credentials ({code or 'unauthenticated'}); "
                                     "check the access key, secret and session token", url=url, offset=offset, subject=shard)
        if isinstance(exc, ox.PermissionDeniedError) or code in ("AccessDenied", "Forbidden") or " 403 " in text:
            if self.scheme in ("s3", "gs"):  # the permission is known: set-up may work around a missing one
                return MissingPermissionError(f"{at}access denied ({code or 'AccessDenied'}); the credentials need {permission} on "
                                              "it (check the IAM and bucket policies)", url=url, offset=offset, subject=subject,
                                              permission=permission)
            return AccessDeniedError(f"{at}access denied ({code or 'AccessDenied'}); the credentials need "
                                     f"{permission} on it (check the IAM and bucket policies)", url=url, offset=offset, subject=shard)
        if _CONNECT.search(text):
            endpoint = getattr(self.options, "endpoint_url", None) or {"s3": "(the AWS default)", "gs": "(the Google default)"}.get(
                self.scheme, f"{self.scheme}://{self.container}")
            kind = {"s3": "S3 endpoint", "gs": "GCS endpoint"}.get(self.scheme, "server")
            return StoreUnavailableError(f"{where}cannot reach the {kind} {endpoint}: {_short(text)}; the request failed "
                                         f"after retries ({self._attempts()} attempts)", url=url, offset=offset, subject=subject)
        return StoreUnavailableError(f"{where}the request failed after retries: {_short(text)}", url=url, offset=offset,
                                     subject=subject)

    def _misconfiguration(self, exc: BaseException, text: str) -> str | None:
        """What setting to fix, when ``exc`` says that no request can succeed as the store is set up."""
        from obstore import exceptions as ox

        if isinstance(exc, _Misconfigured):
            return str(exc)
        if _CREDENTIAL_SERVICE.search(text) and not _SERVER_TROUBLE.search(text):
            return self._no_credentials(text)
        if self.scheme == "s3" and _REFUSED_SCHEME.search(text) and not self.options.endpoint_url:
            # obstore reads a few variables itself (AWS_ENDPOINT, from the environment or a
            # config file) and may only use http for an endpoint hydrax passes it.
            found = os.environ.get("AWS_ENDPOINT")
            origin = f"AWS_ENDPOINT={found!r}, a variable that obstore reads and hydrax does not" if found else "obstore's own configuration"
            return (f"the request was refused before it was sent: the S3 endpoint came from {origin}, and http:// is "
                    "allowed only for an http:// endpoint set by S3Options(endpoint_url=...), --endpoint-url, "
                    f"AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL; set one of those instead (obstore: {_short(text)})")
        if isinstance(exc, (ox.UnknownConfigurationKeyError, ox.NotSupportedError, ox.InvalidPathError)) or _MISCONFIGURED.search(text):
            endpoint = getattr(self.options, "endpoint_url", None)
            where = (f"the {self._kind} endpoint URL {endpoint!r} (set by {self._endpoint_origin()}), the bucket {self.container!r} "
                     "and the key" if endpoint else f"the bucket or server {self.container!r} and the key, and {self._settings}")
            return f"the request cannot be made as the store is set up: check {where} (obstore: {_short(text)})"
        return None

    def _no_credentials(self, text: str) -> str:
        if self.scheme == "gs":
            return ("no Google credentials were found, and the metadata server did not provide any: set "
                    "GOOGLE_APPLICATION_CREDENTIALS or GCSOptions(service_account_path=...), or anonymous=True for a public "
                    f"bucket (obstore: {_short(text)})")
        return ("no AWS credentials were found, and the instance metadata service did not provide any: set AWS_ACCESS_KEY_ID "
                "and AWS_SECRET_ACCESS_KEY (or S3Options(access_key_id=..., secret_access_key=...)), or run where an instance "
                f"role provides them (obstore: {_short(text)})")

    def _attempts(self):
        return max(1, int(self.options.max_attempts))

    def _retry(self, url: str, action: str, offset: int | None, version: str | None, call):
        attempts = self._attempts()
        for attempt in range(attempts):
            try:
                return call()
            except BaseException as exc:
                if not _is_failure(exc):
                    raise
                error = self.explain(url, exc, action, offset, version)
                if not isinstance(error, StoreUnavailableError) or attempt + 1 == attempts:
                    raise error from exc
                log.debug("retrying %s of %s (attempt %d): %s", action, url, attempt + 2, exc)
                time.sleep(min(2.0, 0.1 * 2 ** attempt))
        raise AssertionError("unreachable")

    async def _retry_async(self, url: str, action: str, offset: int | None, version: str | None, call):
        attempts = self._attempts()
        for attempt in range(attempts):
            try:
                return await call()
            except BaseException as exc:
                if not _is_failure(exc):
                    raise
                error = self.explain(url, exc, action, offset, version)
                if not isinstance(error, StoreUnavailableError) or attempt + 1 == attempts:
                    raise error from exc
                await asyncio.sleep(min(2.0, 0.1 * 2 ** attempt))
        raise AssertionError("unreachable")

    # -- operations --------------------------------------------------------------------------
    def _info(self, meta: dict) -> ObjectInfo:
        modified = meta.get("last_modified")
        return ObjectInfo(self._prefix + meta["path"], int(meta["size"]), meta.get("e_tag"),
                          int(modified.timestamp() * 1e9) if modified is not None else 0)

    def stat(self, url: str) -> ObjectInfo:
        import obstore

        key = self._key(url)
        return self._retry(url, "read", None, None, lambda: self._info(obstore.head(self.client(), key)))

    async def stat_async(self, url: str) -> ObjectInfo:
        import obstore

        key = self._key(url)
        return await self._retry_async(url, "read", None, None, lambda: self._head_async(obstore, key))

    async def _head_async(self, obstore, key):
        return self._info(await obstore.head_async(self.client(), key))

    def list(self, prefix: str) -> list[ObjectInfo]:
        import obstore

        if self.scheme not in ("s3", "gs"):
            raise StoreError(f"{self.scheme}:// servers cannot be listed; name the shards (brace ranges work)", url=prefix)
        key_prefix = prefix[len(self._prefix):] if prefix.startswith(self._prefix) else ""
        # obstore lists by path segments: list the folder, then keep the names that match.
        folder = key_prefix.rpartition("/")[0]

        def run():
            found = []
            for batch in obstore.list(self.client(), prefix=folder or None, chunk_size=1000):
                found += [self._info(meta) for meta in batch if meta["path"].startswith(key_prefix)]
            return found

        return sorted(self._retry(prefix, "list", None, None, run), key=lambda info: info.url)

    def _get_options(self, offset: int, size: int | None, version: str | None) -> dict:
        options: dict[str, Any] = {}
        if size is not None:
            options["range"] = (offset, offset + size)
        elif offset:
            options["range"] = {"offset": offset}
        if version is not None:
            options["if_match"] = version
        return options

    def read(self, url: str, offset: int = 0, size: int | None = None, *, version: str | None = None):
        import obstore

        if size == 0:
            return b""
        key = self._key(url)
        options = self._get_options(offset, size, version)

        def run():
            data = obstore.get(self.client(), key, options=options).bytes()
            _check_length(url, data, offset, size)
            return data

        return self._retry(url, "read", offset if size is not None or offset else None, version, run)

    async def read_async(self, url: str, offset: int = 0, size: int | None = None, *, version: str | None = None):
        import obstore

        if size == 0:
            return b""
        key = self._key(url)
        options = self._get_options(offset, size, version)

        async def run():
            result = await obstore.get_async(self.client(), key, options=options)
            data = await result.bytes_async()
            _check_length(url, data, offset, size)
            return data

        return await self._retry_async(url, "read", offset if size is not None or offset else None, version, run)

    async def stream_async(self, url: str, offset: int, end: int, *, version: str | None = None) -> AsyncIterator[Any]:
        """The bytes ``[offset, end)`` of ``url`` in pieces of a few MiB, as they arrive.

        A stream cut short is resumed from where it stopped (one more request), up to
        ``max_attempts`` times in all.
        """
        import obstore

        key = self._key(url)
        position = offset
        failures = 0
        while position < end:
            try:
                result = await obstore.get_async(self.client(), key, options=self._get_options(position, end - position, version))
                async for piece in result.stream(min_chunk_size=_STREAM_CHUNK):
                    if len(piece) > end - position:
                        raise StoreUnavailableError("the server sent more bytes than asked for", url=url, offset=position,
                                                                subject=f"shard {url!r}: ")
                    position += len(piece)
                    yield piece
                if position < end:
                    raise ConnectionError(f"the response ended after {position - offset} of {end - offset} bytes")
            except BaseException as exc:
                if not _is_failure(exc):
                    raise
                error = self.explain(url, exc, "read", position, version)
                failures += 1
                if not isinstance(error, StoreUnavailableError) or failures >= self._attempts():
                    raise error from exc
                await asyncio.sleep(min(2.0, 0.1 * 2 ** failures))

    def write(self, url: str, data) -> ObjectInfo:
        import obstore

        key = self._key(url)
        self._retry(url, "write", None, None, lambda: obstore.put(self.client(), key, data))
        return self.stat(url)

    def upload(self, url: str, path: str) -> ObjectInfo:
        import obstore

        key = self._key(url)

        def run():
            with open(path, "rb") as f:
                obstore.put(self.client(), key, f, chunk_size=8 << 20)

        self._retry(url, "write", None, None, run)
        return self.stat(url)

    def delete(self, url: str) -> None:
        import obstore

        key = self._key(url)
        try:
            self._retry(url, "delete", None, None, lambda: obstore.delete(self.client(), key))
        except ObjectNotFoundError:
            pass


def _check_length(url: str, data, offset: int, size: int | None) -> None:
    if size is not None and len(data) != size:
        # A body cut short by the network, or an object shorter than its index says: retried first.
        raise StoreUnavailableError(f"asked for {size} bytes at byte offset {offset}, got {len(data)}",
                                    url=url, offset=offset, subject=f"shard {url!r}: ")


def _short(text: str, limit: int = 300) -> str:
    # obstore appends a long debug rendering of its error chain: keep the readable part.
    text = " ".join(text.split("Debug source:", 1)[0].split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def as_store_options(options: StoreOptions | S3Options | GCSOptions | HTTPOptions | HFOptions | None) -> StoreOptions:
    """``options`` as :class:`StoreOptions` (one scheme's options stand for that scheme)."""
    if options is None:
        return StoreOptions()
    if isinstance(options, HFOptions):
        return StoreOptions(hf=options)
    if isinstance(options, S3Options):
        return StoreOptions(s3=options)
    if isinstance(options, GCSOptions):
        return StoreOptions(gcs=options)
    if isinstance(options, HTTPOptions):
        return StoreOptions(http=options)
    return options


#: The AWS SDKs' variables for an S3 endpoint (MinIO, LocalStack, moto, other clouds), most
#: specific first, as boto3 and the AWS CLI read them.
ENDPOINT_VARIABLES = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")


#: Prefixes of the environment variables the stores' clients read (obstore's AWS_* and GOOGLE_*
#: credentials, regions and endpoints; the Hugging Face Hub's HF_*).
ENVIRONMENT_PREFIXES = ("AWS_", "GOOGLE_", "HF_")


def store_environment() -> dict[str, str]:
    """This process's variables that the stores' clients read (:data:`ENVIRONMENT_PREFIXES`):
    what a process reading for it elsewhere needs (``hydrax shards ... --ray`` hands them to
    its Ray tasks, whose workers start from the cluster's environment, not this shell's)."""
    return {name: value for name, value in os.environ.items() if name.startswith(ENVIRONMENT_PREFIXES)}


def endpoint_variable(options: StoreOptions, scheme: str) -> str | None:
    """The variable of :data:`ENDPOINT_VARIABLES` that :func:`with_environment` takes the S3
    endpoint from, or None (another scheme, an endpoint in ``options``, no variable set)."""
    if scheme != "s3" or options.s3.endpoint_url:
        return None
    return next((v for v in ENDPOINT_VARIABLES if os.environ.get(v)), None)


def with_environment(options: StoreOptions, scheme: str) -> StoreOptions:
    """``options`` with an S3 endpoint from :data:`ENDPOINT_VARIABLES` when none is given: the
    store is then built with it explicitly (http allowed for an http endpoint), and keyed by it."""
    variable = endpoint_variable(options, scheme)
    if variable is None:
        return options
    return dataclasses.replace(options, s3=dataclasses.replace(options.s3, endpoint_url=os.environ[variable]))


def run_async(coroutine):
    """Run ``coroutine`` to completion from synchronous code (in a fresh thread when this thread
    already runs an event loop, as in a notebook)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        running = False
    else:
        running = True
    if not running:  # outside the except clause: the coroutine's errors carry no "no running loop" context
        return asyncio.run(coroutine)
    outcome: list = []

    def target():
        try:
            outcome.append((True, asyncio.run(coroutine)))
        except BaseException as exc:  # raised in the caller's thread, not printed in this one
            outcome.append((False, exc))

    thread = threading.Thread(target=target, name="hydrax-async")
    thread.start()
    thread.join()
    ok, value = outcome[0]
    if not ok:
        raise value
    return value


async def gather_limited(calls: Sequence, limit: int = 64) -> list:
    """Await the zero-argument coroutine functions ``calls`` with at most ``limit`` running at once;
    results in order. The first failure cancels the rest and is raised."""
    semaphore = asyncio.Semaphore(limit)

    async def one(call):
        async with semaphore:
            return await call()

    tasks = [asyncio.ensure_future(one(call)) for call in calls]
    try:
        return await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
