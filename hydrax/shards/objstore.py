"""S3 buckets, GCS buckets and HTTP(S) servers, through obstore: :class:`ObjectStore`.

obstore (Rust's ``object_store``) runs requests on its own threads without the GIL, many at once,
and the same code serves ``s3://``, ``gs://`` and ``http(s)://``. It was chosen by measurement
over boto3 with a thread pool and over fsspec/s3fs (see ``docs/object-storage.rst``). Its threads
do not survive a ``fork``: once a remote store has been used in a process, hydrax starts its
workers from the fork server instead (see :func:`hydrax.procs.workers.note_fork_hazard`); a worker makes
its own store on first use.

Reads may be pinned to an object *version* (the ETag an index was built from): a replaced
object is then an :class:`~hydrax.errors.ObjectChangedError`, never another object's bytes.
Transient failures (connection errors, resets, truncated bodies, 5xx, timeouts) are retried with
backoff up to ``max_attempts`` times, then raised as
:class:`~hydrax.errors.StoreUnavailableError` naming the object and offset. A store set up wrongly
(an endpoint URL that is not one, an ``http://`` endpoint obstore may not use, no credentials, an
option obstore rejects) cannot be cured by waiting: it is a
:class:`~hydrax.errors.StoreConfigError` at the first attempt, naming the setting to fix. This
module holds that error mapping too (:meth:`ObjectStore.explain`): it reads obstore's words.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import threading
import time
import urllib.parse
from datetime import timedelta
from typing import Any, AsyncIterator

from ..errors import (AccessDeniedError, HydraxError, MissingPermissionError, ObjectChangedError, ObjectNotFoundError,
                      StoreConfigError, StoreError, StoreUnavailableError)
from .options import StoreOptions
from .store import ObjectInfo, Store, scheme_of

log = logging.getLogger(__name__)

_STREAM_CHUNK = 4 << 20

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
    :func:`~hydrax.shards.options.with_environment`), None when it was given in the options or there is none; error
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
    def listable(self) -> bool:
        return self.scheme in ("s3", "gs")

    @property
    def is_bucket(self) -> bool:
        return self.scheme in ("s3", "gs")

    @property
    def hides_missing(self) -> bool:
        return self.scheme == "s3"

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
        misconfigured = _misconfiguration(self, exc, text)
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

        if not self.listable:
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


def _misconfiguration(store: ObjectStore, exc: BaseException, text: str) -> str | None:
    """What setting of ``store`` to fix, when ``exc`` says that no request can succeed as it is set up."""
    from obstore import exceptions as ox

    if isinstance(exc, _Misconfigured):
        return str(exc)
    if _CREDENTIAL_SERVICE.search(text) and not _SERVER_TROUBLE.search(text):
        return _no_credentials(store.scheme, text)
    if store.scheme == "s3" and _REFUSED_SCHEME.search(text) and not store.options.endpoint_url:
        # obstore reads a few variables itself (AWS_ENDPOINT, from the environment or a
        # config file) and may only use http for an endpoint hydrax passes it.
        found = os.environ.get("AWS_ENDPOINT")
        origin = f"AWS_ENDPOINT={found!r}, a variable that obstore reads and hydrax does not" if found else "obstore's own configuration"
        return (f"the request was refused before it was sent: the S3 endpoint came from {origin}, and http:// is "
                "allowed only for an http:// endpoint set by S3Options(endpoint_url=...), --endpoint-url, "
                f"AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL; set one of those instead (obstore: {_short(text)})")
    if isinstance(exc, (ox.UnknownConfigurationKeyError, ox.NotSupportedError, ox.InvalidPathError)) or _MISCONFIGURED.search(text):
        endpoint = getattr(store.options, "endpoint_url", None)
        where = (f"the {store._kind} endpoint URL {endpoint!r} (set by {store._endpoint_origin()}), the bucket {store.container!r} "
                 "and the key" if endpoint else f"the bucket or server {store.container!r} and the key, and {store._settings}")
        return f"the request cannot be made as the store is set up: check {where} (obstore: {_short(text)})"
    return None


def _no_credentials(scheme: str, text: str) -> str:
    if scheme == "gs":
        return ("no Google credentials were found, and the metadata server did not provide any: set "
                "GOOGLE_APPLICATION_CREDENTIALS or GCSOptions(service_account_path=...), or anonymous=True for a public "
                f"bucket (obstore: {_short(text)})")
    return ("no AWS credentials were found, and the instance metadata service did not provide any: set AWS_ACCESS_KEY_ID "
            "and AWS_SECRET_ACCESS_KEY (or S3Options(access_key_id=..., secret_access_key=...)), or run where an instance "
            f"role provides them (obstore: {_short(text)})")


def _check_length(url: str, data, offset: int, size: int | None) -> None:
    if size is not None and len(data) != size:
        # A body cut short by the network, or an object shorter than its index says: retried first.
        raise StoreUnavailableError(f"asked for {size} bytes at byte offset {offset}, got {len(data)}",
                                    url=url, offset=offset, subject=f"shard {url!r}: ")


def _short(text: str, limit: int = 300) -> str:
    # obstore appends a long debug rendering of its error chain: keep the readable part.
    text = " ".join(text.split("Debug source:", 1)[0].split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
