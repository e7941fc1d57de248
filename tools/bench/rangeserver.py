"""A static HTTP/1.1 file server with ``Range`` support, that is also a minimal, unsigned, path-style
S3 endpoint over the same folder, for benchmarks that read shards over http:// or s3://.

hydrax reads ``http(s)://`` shard URLs with a HEAD and ranged GETs; webdataset streams them with
plain GETs. moto's S3 server copies the whole object for every ranged GET (and closes the
connection after each answer), so it costs more CPU than the loaders it serves; this server answers
from the file itself, one thread per connection, keep-alive, and gets out of the way.

Plain HTTP files:

- ``GET`` and ``HEAD`` of any file under the folder (``..`` cannot escape it);
- ``Range: bytes=a-b``, ``bytes=a-`` and ``bytes=-n`` (one range): ``206`` with ``Content-Range``,
  ``416`` with ``Content-Range: bytes */size`` when no byte of it exists; a malformed or
  multi-range header is ignored and the whole file sent (as RFC 9110 allows);
- ``ETag`` (``"{size:x}-{mtime_ns:x}"``), ``Last-Modified``, ``Content-Length``, ``Accept-Ranges:
  bytes``; ``If-Match`` (``412`` on mismatch, as hydrax pins reads to the ETag it indexed) and
  ``If-None-Match`` (``304``); ``If-Range`` (a stale validator sends the whole file).

S3 (path style, ``http://HOST:PORT/BUCKET/KEY``; a bucket is a subfolder of the served folder, a
key a file under it). Requests are not authenticated: ``Authorization`` and the ``x-amz-*``
signing headers are ignored, so any access key works (boto3, obstore, LitData, MosaicML Streaming):

- GetObject / HeadObject: the ``GET`` and ``HEAD`` above (same ETag, ranges, ``If-Match``);
- ListObjectsV2 (``GET /bucket?list-type=2`` with ``prefix``, ``delimiter``, ``max-keys`` (at most
  1000), ``start-after``, ``continuation-token``; keys sorted, ``CommonPrefixes`` for a
  delimiter), ListObjects (v1, ``marker``), ListBuckets (``GET /``);
- PutObject (``PUT /bucket/key``; a ``Content-Length``, ``chunked`` or ``aws-chunked`` body, signed
  or with trailers): written to a temporary file beside the key and renamed into place, parent
  folders created; ``If-None-Match: *`` and ``If-Match`` make it conditional (``412``); the answer
  carries the new ``ETag``;
- multipart uploads (``POST ?uploads``, ``PUT ?partNumber=N&uploadId=U``, ``POST ?uploadId=U``,
  ``DELETE ?uploadId=U``), which boto3's ``upload_file`` and obstore use for large files; parts
  wait under ``.rangeserver-uploads/`` in the served folder;
- DeleteObject (``DELETE /bucket/key``, ``204``), DeleteObjects (``POST /bucket?delete``);
- CreateBucket (``PUT /bucket``, a ``mkdir``), HeadBucket, DeleteBucket (empty buckets only);
- errors are S3's XML (``<Error><Code>NoSuchKey</Code>...``), so clients map them.

Not served: copies, tags, ACLs, versions, checksums (sent ones are ignored, none are returned).
The server's own files (``.rangeserver-*``) are never listed or served. ``GET /.rangeserver-stats``
answers ``{"bytes": N, "gets": M}``: the file bytes sent and the GETs answered with them so far
(what a benchmark reports as bytes fetched).

From Python::

    server, thread = serve("/data/shards", 0)        # port 0: any free port
    url = f"http://127.0.0.1:{server.server_port}/train-00000.tar"
    # or: boto3.client("s3", endpoint_url=f"http://127.0.0.1:{server.server_port}", ...)
    #     with s3://train/... the files under /data/shards/train/
    ...
    server.shutdown(); server.server_close()

``delay`` (``--delay`` from the shell) holds every answer that many seconds from the moment its
request's head arrived: the first-byte latency of a store that far away, without a proxy process
copying every byte (which costs this machine more CPU than the loaders it measures). The body
still goes out with ``sendfile``; each connection answers one request at a time, as a store does.

From the shell (prints ``serving DIR on http://127.0.0.1:PORT``)::

    python tools/bench/rangeserver.py DIR --port 8000 [--host 127.0.0.1] [--delay 0.02]

Standard library only.
"""

from __future__ import annotations

import argparse
import base64
import email.utils
import http.server
import json
import os
import posixpath
import re
import shutil
import socket
import threading
import time
import urllib.parse
import uuid
import xml.etree.ElementTree as ElementTree
from xml.sax.saxutils import escape

_CHUNK = 1 << 20
_RANGE = re.compile(r"^\s*bytes\s*=\s*(\d*)\s*-\s*(\d*)\s*$", re.IGNORECASE)
_HIDDEN = ".rangeserver-"  # the server's own files and folders: never listed or served
_UPLOADS = _HIDDEN + "uploads"  # multipart uploads in progress, in the served folder
_S3_NS = "http://s3.amazonaws.com/doc/2006-03-01/"
_XML_HEAD = '<?xml version="1.0" encoding="UTF-8"?>\n'
_MAX_XML_BODY = 16 << 20
_ERROR_CODES = {400: "InvalidRequest", 403: "AccessDenied", 404: "NoSuchKey", 405: "MethodNotAllowed",
                409: "Conflict", 411: "MissingContentLength", 412: "PreconditionFailed", 416: "InvalidRange",
                500: "InternalError", 501: "NotImplemented"}


def parse_range(header: str | None, size: int) -> tuple[int, int] | None | str:
    """``(first, last)`` inclusive for a satisfiable single range, ``"unsatisfiable"``, or None
    (no header, or one this server ignores: malformed, several ranges)."""
    if not header:
        return None
    match = _RANGE.match(header)
    if match is None:
        return None
    first, last = match.groups()
    if first == "" and last == "":
        return None
    if first == "":  # the last n bytes
        n = int(last)
        if n == 0 or size == 0:
            return "unsatisfiable"
        return max(0, size - n), size - 1
    start = int(first)
    end = int(last) if last != "" else size - 1
    if last != "" and end < start:
        return None  # invalid: ignore the header
    if start >= size:
        return "unsatisfiable"
    return start, min(end, size - 1)


def _etag_matches(header: str, etag: str, weak: bool) -> bool:
    tags = [t.strip() for t in header.split(",")]
    if "*" in tags:
        return True
    strip = (lambda t: t[2:] if t.startswith("W/") else t) if weak else (lambda t: t)
    return any(strip(t) == etag for t in tags)


def _etag(stat: os.stat_result) -> str:
    return f'"{stat.st_size:x}-{stat.st_mtime_ns:x}"'


def _x(text: str) -> str:
    """``text`` escaped for an XML element (quotes too, as S3 writes ETags)."""
    return escape(text, {'"': "&quot;"})


def _iso(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(seconds))


class _BodyError(Exception):
    """A request body that ended early or is not framed as its headers say."""


class _Limited:
    """The ``length`` bytes of a request body with a ``Content-Length``."""

    def __init__(self, rfile, length: int):
        self.rfile, self.left = rfile, length

    def read(self, n: int) -> bytes:
        take = min(n, self.left)
        if take <= 0:
            return b""
        data = self.rfile.read(take)
        if len(data) < take:
            raise _BodyError(f"the body ended {self.left - len(data)} bytes early")
        self.left -= take
        return data

    def readline(self) -> bytes:
        if self.left <= 0:
            return b""
        line = self.rfile.readline(min(self.left, 65536))
        self.left -= len(line)
        return line


class _Dechunked:
    """A body framed as HTTP/1.1 ``chunked`` (``hex-size[;extensions]\\r\\n data \\r\\n`` ...,
    ``0\\r\\n``, trailers, ``\\r\\n``), read from ``source``. S3's ``aws-chunked`` content encoding
    is the same framing (``;chunk-signature=...`` extensions, ``x-amz-checksum-*`` trailers), so
    this decodes it too, over a ``Content-Length`` body or over a ``chunked`` one."""

    def __init__(self, source):
        self.source, self.left, self.done = source, 0, False

    def _line(self) -> bytes:
        line = self.source.readline()
        if not line.endswith(b"\n"):
            raise _BodyError("a chunk header or trailer is cut short")
        return line

    def _next_chunk(self) -> None:
        header = self._line().split(b";", 1)[0].strip()
        try:
            size = int(header, 16)
        except ValueError:
            raise _BodyError(f"bad chunk size {header[:40]!r}") from None
        if size < 0:
            raise _BodyError(f"bad chunk size {header[:40]!r}")
        if size == 0:
            while self._line().strip():  # trailers (checksums): ignored
                pass
            self.done = True
        self.left = size

    def read(self, n: int) -> bytes:
        if self.done:
            return b""
        if self.left == 0:
            self._next_chunk()
            if self.done:
                return b""
        data = self.source.read(min(n, self.left))
        if not data:
            raise _BodyError("the body ended inside a chunk")
        self.left -= len(data)
        if self.left == 0:
            end = self.source.read(2)
            if len(end) == 1:  # the source is itself chunked, and cut the CRLF in two
                end += self.source.read(1)
            if end != b"\r\n":
                raise _BodyError("a chunk does not end with CRLF")
        return data

    def readline(self) -> bytes:  # for aws-chunked framing inside HTTP chunks: short lines only
        line = bytearray()
        while len(line) < 65536:
            byte = self.read(1)
            if not byte:
                break
            line += byte
            if byte == b"\n":
                break
        return bytes(line)


#: The path of the server's byte count (see the module docstring).
STATS_PATH = "/.rangeserver-stats"
_SENT = {"bytes": 0, "gets": 0}
_SENT_LOCK = threading.Lock()


class RangeHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive
    server_version = "rangeserver/1"
    root = "."  # set by serve()
    lock = threading.Lock()  # serializes writes' checks and renames; serve() gives each server its own
    timeout = 120  # an idle keep-alive connection is closed after this many seconds
    delay = 0.0  # seconds each answer waits after its request's head arrived; set by serve()

    def log_message(self, format, *args):  # quiet: a benchmark makes thousands of requests
        pass

    # -- the request ---------------------------------------------------------------------------
    def parse_request(self) -> bool:
        parsed = super().parse_request()
        if parsed and self.delay > 0 and self.path != STATS_PATH:
            time.sleep(self.delay)  # the head has just been read: the store's first-byte latency
        return parsed

    def _split(self) -> tuple[str, str, dict[str, str]]:
        """(bucket, key, query): the first path segment, the rest, and the query's last values."""
        url = urllib.parse.urlsplit(self.path)
        query = dict(urllib.parse.parse_qsl(url.query, keep_blank_values=True))
        path = urllib.parse.unquote(url.path).lstrip("/")
        bucket, _, key = path.partition("/")
        return bucket, key, query

    def _path(self) -> str | None:
        path = urllib.parse.urlsplit(self.path).path
        path = posixpath.normpath(urllib.parse.unquote(path))
        parts = [p for p in path.split("/") if p and p not in (".", "..")]
        if any(p.startswith(_HIDDEN) for p in parts):
            return None
        full = os.path.join(self.root, *parts)
        return full if os.path.isfile(full) else None

    def _bucket_dir(self, bucket: str) -> str | None:
        """The bucket's folder, or None for a name that cannot be one (the folder may not exist)."""
        if not bucket or bucket in (".", "..") or bucket.startswith(".") or "\\" in bucket:
            return None
        return os.path.join(self.root, bucket)

    def _key_path(self, bucket: str, key: str) -> str | None:
        """The file of ``key`` in ``bucket``, or None for a key no file can hold."""
        folder = self._bucket_dir(bucket)
        parts = key.split("/")
        if folder is None or not key or any(p in ("", ".", "..") or p.startswith(_HIDDEN) or "\0" in p for p in parts):
            return None
        return os.path.join(folder, *parts)

    def _body(self):
        """A reader (``read(n)``) of the request body, its framing undone."""
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            body = _Dechunked(self.rfile)
        else:
            try:
                length = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                raise _BodyError("bad Content-Length") from None
            body = _Limited(self.rfile, length)
        encoding = self.headers.get("Content-Encoding", "").lower()
        if "aws-chunked" in encoding or self.headers.get("x-amz-content-sha256", "").upper().startswith("STREAMING-"):
            body = _Dechunked(body)
        return body

    def _read_body(self, limit: int = _MAX_XML_BODY) -> bytes:
        body, data = self._body(), bytearray()
        while True:
            piece = body.read(_CHUNK)
            if not piece:
                return bytes(data)
            data += piece
            if len(data) > limit:
                raise _BodyError("the body is too large")

    def _body_to_file(self, folder: str) -> str:
        """The request body, written to a new temporary file in ``folder`` (made if missing)."""
        os.makedirs(folder, exist_ok=True)
        temp = os.path.join(folder, f"{_HIDDEN}tmp-{uuid.uuid4().hex}")
        try:
            body, written = self._body(), 0
            with open(temp, "wb") as f:
                while True:
                    piece = body.read(_CHUNK)
                    if not piece:
                        break
                    f.write(piece)
                    written += len(piece)
            decoded = self.headers.get("x-amz-decoded-content-length")
            if decoded is not None and decoded.strip().isdigit() and int(decoded) != written:
                raise _BodyError(f"x-amz-decoded-content-length says {decoded} bytes, the chunks held {written}")
        except BaseException:
            _unlink(temp)
            raise
        return temp

    # -- answers -------------------------------------------------------------------------------
    def _error(self, status: int, extra: dict[str, str] | None = None, code: str | None = None,
               message: str | None = None, **fields: str) -> None:
        """An S3 error (XML; HTTP clients see the status). ``fields``: ``Key``, ``BucketName``..."""
        reason = self.responses.get(status, ("",))[0]
        code = code or _ERROR_CODES.get(status, reason.replace(" ", "") or "Error")
        parts = [f"<Code>{_x(code)}</Code><Message>{_x(message or reason)}</Message>"]
        parts += [f"<{name}>{_x(value)}</{name}>" for name, value in fields.items() if value is not None]
        parts.append(f"<Resource>{_x(urllib.parse.urlsplit(self.path).path)}</Resource><RequestId>0</RequestId>")
        body = (_XML_HEAD + "<Error>" + "".join(parts) + "</Error>\n").encode()
        self.send_response(status)
        for name, value in (extra or {}).items():
            self.send_header(name, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body) if self.command != "HEAD" else 0))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _xml(self, text: str, status: int = 200, extra: dict[str, str] | None = None) -> None:
        body = (_XML_HEAD + text + "\n").encode()
        self.send_response(status)
        for name, value in (extra or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body) if self.command != "HEAD" else 0))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _empty(self, status: int, extra: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for name, value in (extra or {}).items():
            self.send_header(name, value)
        if status != 204:
            self.send_header("Content-Length", "0")
        self.end_headers()

    def _missing(self, bucket: str, key: str) -> None:
        folder = self._bucket_dir(bucket)
        if folder is None or not os.path.isdir(folder):
            self._error(404, code="NoSuchBucket", message="The specified bucket does not exist", BucketName=bucket)
        else:
            self._error(404, message="The specified key does not exist.", Key=key or None, BucketName=bucket or None)

    # -- methods -------------------------------------------------------------------------------
    def do_HEAD(self) -> None:
        self._guarded(self._get)

    def do_GET(self) -> None:
        self._guarded(self._get)

    def do_PUT(self) -> None:
        self._guarded(self._put)

    def do_POST(self) -> None:
        self._guarded(self._post)

    def do_DELETE(self) -> None:
        self._guarded(self._delete)

    def _guarded(self, method) -> None:
        try:
            method()
        except _BodyError as exc:  # the rest of the body cannot be found: drop the connection after this answer
            self.close_connection = True
            self._error(400, code="IncompleteBody", message=str(exc))
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except OSError as exc:  # a key against a file where a folder should be, a full disk...
            self.close_connection = True
            status = 409 if isinstance(exc, (FileExistsError, NotADirectoryError, IsADirectoryError)) else 500
            self._error(status, message=f"{type(exc).__name__}: {exc.strerror or exc}")

    def _get(self) -> None:
        if self.path == STATS_PATH:
            with _SENT_LOCK:
                body = json.dumps(_SENT).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        path = self._path()
        if path is not None:
            self._answer(path)
            return
        bucket, key, query = self._split()
        if not bucket:  # ListBuckets
            self._list_buckets()
            return
        folder = self._bucket_dir(bucket)
        if not key and folder is not None and os.path.isdir(folder):
            if self.command == "HEAD":  # HeadBucket
                self._empty(200, {"x-amz-bucket-region": "us-east-1"})
            else:
                self._list(bucket, folder, query)
            return
        self._missing(bucket, key)

    def _answer(self, path: str) -> None:
        try:
            handle = open(path, "rb")
        except OSError:
            self._error(404)
            return
        with handle:
            stat = os.fstat(handle.fileno())
            size = stat.st_size
            etag = _etag(stat)
            modified = email.utils.formatdate(stat.st_mtime, usegmt=True)
            validators = {"ETag": etag, "Last-Modified": modified, "Accept-Ranges": "bytes"}
            if_match = self.headers.get("If-Match")
            if if_match is not None and not _etag_matches(if_match, etag, weak=False):
                self._error(412, validators)
                return
            if_none = self.headers.get("If-None-Match")
            if if_none is not None and _etag_matches(if_none, etag, weak=True):
                self.send_response(304)
                for name, value in validators.items():
                    self.send_header(name, value)
                self.end_headers()
                return
            wanted = parse_range(self.headers.get("Range"), size)
            if_range = self.headers.get("If-Range")
            if wanted is not None and if_range is not None and if_range.strip() not in (etag, modified):
                wanted = None  # the client's copy is stale: send the whole file
            if wanted == "unsatisfiable":
                self._error(416, {**validators, "Content-Range": f"bytes */{size}"})
                return
            if wanted is None:
                start, length = 0, size
                self.send_response(200)
            else:
                start, last = wanted
                length = last - start + 1
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{last}/{size}")
            for name, value in validators.items():
                self.send_header(name, value)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(length))
            self.end_headers()
            if self.command == "HEAD" or length == 0:
                return
            self._send_file(handle, start, length)

    # -- listings ------------------------------------------------------------------------------
    def _list_buckets(self) -> None:
        buckets = []
        for entry in sorted(os.scandir(self.root), key=lambda e: e.name):
            if entry.is_dir() and self._bucket_dir(entry.name) is not None:
                created = _iso(entry.stat().st_mtime)
                buckets.append(f"<Bucket><Name>{_x(entry.name)}</Name><CreationDate>{created}</CreationDate></Bucket>")
        self._xml(f'<ListAllMyBucketsResult xmlns="{_S3_NS}"><Owner><ID>rangeserver</ID><DisplayName>rangeserver'
                  f'</DisplayName></Owner><Buckets>{"".join(buckets)}</Buckets></ListAllMyBucketsResult>')

    @staticmethod
    def _keys(folder: str, prefix: str) -> dict[str, str]:
        """{key: file} for every file under ``folder`` whose key starts with ``prefix``."""
        start = folder
        parts = prefix.rpartition("/")[0].split("/") if "/" in prefix else []
        if parts and not any(p in ("", ".", "..") for p in parts):
            start = os.path.join(folder, *parts)  # only the folder the prefix names can hold its keys
        found = {}
        for here, folders, files in os.walk(start):
            folders[:] = [f for f in folders if not f.startswith(_HIDDEN)]
            rel = os.path.relpath(here, folder)
            head = "" if rel == "." else rel.replace(os.sep, "/") + "/"
            for name in files:
                key = head + name
                if not name.startswith(_HIDDEN) and key.startswith(prefix):
                    found[key] = os.path.join(here, name)
        return found

    def _list(self, bucket: str, folder: str, query: dict[str, str]) -> None:
        """ListObjectsV2 (``list-type=2``), else ListObjects (v1)."""
        v2 = query.get("list-type") == "2"
        prefix, delimiter = query.get("prefix", ""), query.get("delimiter", "")
        try:
            max_keys = max(0, min(1000, int(query.get("max-keys") or 1000)))
        except ValueError:
            self._error(400, code="InvalidArgument", message="max-keys is not an integer")
            return
        # Where this page starts: past a key (start-after, marker), or past the last entry of the page
        # before (the continuation token: "K" + key or "P" + common prefix).
        after, skip_prefix = (query.get("start-after", "") if v2 else query.get("marker", "")), None
        if v2 and query.get("continuation-token"):
            try:
                token = base64.urlsafe_b64decode(query["continuation-token"].encode()).decode()
            except ValueError:
                self._error(400, code="InvalidArgument", message="The continuation token provided is incorrect")
                return
            if token[:1] not in ("K", "P"):
                self._error(400, code="InvalidArgument", message="The continuation token provided is incorrect")
                return
            after, skip_prefix = token[1:], (token[1:] if token[0] == "P" else None)
        elif not v2 and delimiter and after.endswith(delimiter):
            skip_prefix = after
        found = self._keys(folder, prefix)
        entries: list[tuple[str, bool]] = []  # (key or common prefix, is a prefix)
        rolled = set()
        for key in sorted(found):
            if key <= after or (skip_prefix is not None and key.startswith(skip_prefix)):
                continue
            if delimiter:
                cut = key.find(delimiter, len(prefix))
                if cut >= 0:
                    common = key[: cut + len(delimiter)]
                    if common not in rolled:
                        rolled.add(common)
                        entries.append((common, True))
                    continue
            entries.append((key, False))
        page, truncated = entries[:max_keys], len(entries) > max_keys
        out = [f'<ListBucketResult xmlns="{_S3_NS}"><Name>{_x(bucket)}</Name><Prefix>{_x(prefix)}</Prefix>']
        if v2:
            out.append(f"<KeyCount>{len(page)}</KeyCount>")
            for name in ("continuation-token", "start-after"):
                if query.get(name):
                    tag = "ContinuationToken" if name == "continuation-token" else "StartAfter"
                    out.append(f"<{tag}>{_x(query[name])}</{tag}>")
        else:
            out.append(f"<Marker>{_x(query.get('marker', ''))}</Marker>")
        out.append(f"<MaxKeys>{max_keys}</MaxKeys>")
        if delimiter:
            out.append(f"<Delimiter>{_x(delimiter)}</Delimiter>")
        out.append(f"<IsTruncated>{'true' if truncated else 'false'}</IsTruncated>")
        if truncated and page:
            last, is_prefix = page[-1]
            if v2:
                token = base64.urlsafe_b64encode((("P" if is_prefix else "K") + last).encode()).decode()
                out.append(f"<NextContinuationToken>{token}</NextContinuationToken>")
            else:
                out.append(f"<NextMarker>{_x(last)}</NextMarker>")
        for name, is_prefix in page:
            if is_prefix:
                continue
            try:
                stat = os.stat(found[name])
            except OSError:  # deleted since the walk
                continue
            out.append(f"<Contents><Key>{_x(name)}</Key><LastModified>{_iso(stat.st_mtime)}</LastModified>"
                       f"<ETag>{_x(_etag(stat))}</ETag><Size>{stat.st_size}</Size>"
                       "<StorageClass>STANDARD</StorageClass></Contents>")
        out += [f"<CommonPrefixes><Prefix>{_x(name)}</Prefix></CommonPrefixes>" for name, is_prefix in page if is_prefix]
        out.append("</ListBucketResult>")
        self._xml("".join(out))

    # -- writes --------------------------------------------------------------------------------
    def _commit(self, temp: str, final: str) -> os.stat_result | int:
        """Rename ``temp`` to ``final`` if the request's ``If-None-Match`` / ``If-Match`` allow it:
        the new file's stat, or the status refusing it (412, 404: If-Match on a missing key)."""
        if_none, if_match = self.headers.get("If-None-Match"), self.headers.get("If-Match")
        with self.lock:
            try:
                old = os.stat(final)
            except FileNotFoundError:
                old = None
            refused = None
            if old is not None and if_none is not None and _etag_matches(if_none, _etag(old), weak=True):
                refused = 412
            elif if_match is not None and old is None:
                refused = 404
            elif if_match is not None and not _etag_matches(if_match, _etag(old), weak=False):
                refused = 412
            if refused is not None:
                _unlink(temp)
                return refused
            new = os.stat(temp)
            if old is not None and new.st_size == old.st_size and new.st_mtime_ns <= old.st_mtime_ns:
                # a coarse clock: give the new version a later mtime, so a different ETag
                os.utime(temp, ns=(new.st_atime_ns, old.st_mtime_ns + 1))
            os.replace(temp, final)
            return os.stat(final)

    def _refused(self, status: int, bucket: str, key: str) -> None:
        if status == 404:
            self._missing(bucket, key)
        else:
            self._error(412, message="At least one of the pre-conditions you specified did not hold", Key=key)

    def _put(self) -> None:
        bucket, key, query = self._split()
        folder = self._bucket_dir(bucket)
        if folder is None:
            self._read_body()
            self._error(400, code="InvalidBucketName", message="The specified bucket is not valid", BucketName=bucket)
            return
        if not key:  # CreateBucket (its body, a location constraint, is ignored)
            self._read_body()
            os.makedirs(folder, exist_ok=True)
            self._empty(200, {"Location": "/" + bucket})
            return
        if "x-amz-copy-source" in self.headers or {"acl", "tagging", "retention", "legal-hold"} & set(query):
            self._read_body()
            self._error(501, message="This server stores objects only: no copies, tags or ACLs")
            return
        path = self._key_path(bucket, key)
        if path is None or key.endswith("/"):
            self._read_body()
            self._error(400, code="InvalidKey", message="This server keeps keys as files: no empty, '.' or '..' segments",
                        Key=key)
            return
        if not os.path.isdir(folder):
            self._read_body()
            self._missing(bucket, key)
            return
        if "uploadId" in query:
            self._upload_part(bucket, key, query)
            return
        temp = self._body_to_file(os.path.dirname(path))
        stat = self._commit(temp, path)
        if isinstance(stat, int):
            self._refused(stat, bucket, key)
            return
        self._empty(200, {"ETag": _etag(stat)})

    def _delete(self) -> None:
        bucket, key, query = self._split()
        folder = self._bucket_dir(bucket)
        if folder is None or not os.path.isdir(folder):
            self._error(404, code="NoSuchBucket", message="The specified bucket does not exist", BucketName=bucket)
            return
        if not key:  # DeleteBucket
            try:
                os.rmdir(folder)
            except OSError:
                self._error(409, code="BucketNotEmpty", message="The bucket you tried to delete is not empty",
                            BucketName=bucket)
                return
            self._empty(204)
            return
        if "uploadId" in query:  # AbortMultipartUpload
            upload = self._upload_dir(query["uploadId"])
            if upload is not None:
                shutil.rmtree(upload, ignore_errors=True)
            self._empty(204)
            return
        path = self._key_path(bucket, key)
        if path is not None:
            with self.lock:
                if os.path.isfile(path):
                    _unlink(path)
        self._empty(204)

    def _post(self) -> None:
        bucket, key, query = self._split()
        folder = self._bucket_dir(bucket)
        if folder is None or not os.path.isdir(folder):
            self._read_body()
            self._error(404, code="NoSuchBucket", message="The specified bucket does not exist", BucketName=bucket)
            return
        if not key and "delete" in query:
            self._delete_objects(bucket)
            return
        path = self._key_path(bucket, key) if key else None
        if path is None:
            self._read_body()
            self._error(501 if not key else 400, message="Not supported here")
            return
        if "uploads" in query:  # CreateMultipartUpload
            self._read_body()
            upload_id = uuid.uuid4().hex
            upload = os.path.join(self.root, _UPLOADS, upload_id)
            os.makedirs(upload)
            with open(os.path.join(upload, "target"), "w", encoding="utf-8") as f:
                f.write(f"{bucket}/{key}")
            self._xml(f'<InitiateMultipartUploadResult xmlns="{_S3_NS}"><Bucket>{_x(bucket)}</Bucket><Key>{_x(key)}</Key>'
                      f"<UploadId>{upload_id}</UploadId></InitiateMultipartUploadResult>")
            return
        if "uploadId" in query:
            self._complete_upload(bucket, key, path, query["uploadId"])
            return
        self._read_body()
        self._error(501, message="Not supported here")

    def _delete_objects(self, bucket: str) -> None:
        try:
            request = ElementTree.fromstring(self._read_body())
        except ElementTree.ParseError:
            self._error(400, code="MalformedXML", message="The XML you provided was not well-formed")
            return
        quiet = any(_local(e.tag) == "Quiet" and (e.text or "").strip().lower() == "true" for e in request)
        deleted = []
        for element in request:
            if _local(element.tag) != "Object":
                continue
            key = next((c.text or "" for c in element if _local(c.tag) == "Key"), "")
            path = self._key_path(bucket, key)
            if path is not None:
                with self.lock:
                    if os.path.isfile(path):
                        _unlink(path)
            if not quiet:
                deleted.append(f"<Deleted><Key>{_x(key)}</Key></Deleted>")
        self._xml(f'<DeleteResult xmlns="{_S3_NS}">{"".join(deleted)}</DeleteResult>')

    # -- multipart uploads ---------------------------------------------------------------------
    def _upload_dir(self, upload_id: str) -> str | None:
        if not re.fullmatch(r"[0-9a-f]{32}", upload_id or ""):
            return None
        upload = os.path.join(self.root, _UPLOADS, upload_id)
        return upload if os.path.isdir(upload) else None

    def _no_upload(self, upload_id: str) -> None:
        self._error(404, code="NoSuchUpload", message="The specified multipart upload does not exist",
                    UploadId=upload_id)

    def _upload_part(self, bucket: str, key: str, query: dict[str, str]) -> None:
        upload = self._upload_dir(query["uploadId"])
        number = query.get("partNumber", "")
        if upload is None:
            self._read_body()
            self._no_upload(query["uploadId"])
            return
        if not number.isdigit() or not 1 <= int(number) <= 10000:
            self._read_body()
            self._error(400, code="InvalidArgument", message="Part number must be an integer between 1 and 10000")
            return
        temp = self._body_to_file(upload)
        part = os.path.join(upload, f"part-{int(number):05d}")
        os.replace(temp, part)
        self._empty(200, {"ETag": _etag(os.stat(part))})

    def _complete_upload(self, bucket: str, key: str, path: str, upload_id: str) -> None:
        body = self._read_body()
        upload = self._upload_dir(upload_id)
        if upload is None:
            self._no_upload(upload_id)
            return
        try:
            request = ElementTree.fromstring(body)
        except ElementTree.ParseError:
            self._error(400, code="MalformedXML", message="The XML you provided was not well-formed")
            return
        parts = []
        for element in request:
            if _local(element.tag) != "Part":
                continue
            fields = {_local(c.tag): (c.text or "").strip() for c in element}
            number = fields.get("PartNumber", "")
            part = os.path.join(upload, f"part-{int(number):05d}") if number.isdigit() else None
            try:
                etag = _etag(os.stat(part)) if part else None
            except FileNotFoundError:
                etag = None
            if etag is None or ("ETag" in fields and fields["ETag"] != etag):
                self._error(400, code="InvalidPart", message=f"part {number!r} was not uploaded, or has another ETag")
                return
            parts.append(part)
        if not parts:
            self._error(400, code="MalformedXML", message="The XML you provided named no parts")
            return
        folder = os.path.dirname(path)
        os.makedirs(folder, exist_ok=True)
        temp = os.path.join(folder, f"{_HIDDEN}tmp-{uuid.uuid4().hex}")
        try:
            with open(temp, "wb") as out:
                for part in parts:
                    with open(part, "rb") as f:
                        shutil.copyfileobj(f, out, _CHUNK)
        except BaseException:
            _unlink(temp)
            raise
        stat = self._commit(temp, path)
        if isinstance(stat, int):
            self._refused(stat, bucket, key)
            return
        shutil.rmtree(upload, ignore_errors=True)
        self._xml(f'<CompleteMultipartUploadResult xmlns="{_S3_NS}"><Location>/{_x(bucket)}/{_x(key)}</Location>'
                  f"<Bucket>{_x(bucket)}</Bucket><Key>{_x(key)}</Key><ETag>{_x(_etag(stat))}</ETag>"
                  "</CompleteMultipartUploadResult>")

    def _send_file(self, handle, start: int, length: int) -> None:
        try:
            sent = 0
            try:  # zero-copy where the socket allows it
                self.wfile.flush()
                while sent < length:
                    n = os.sendfile(self.connection.fileno(), handle.fileno(), start + sent, min(length - sent, 16 * _CHUNK))
                    if n == 0:
                        break
                    sent += n
            except (AttributeError, OSError, ValueError) as exc:
                if isinstance(exc, (BrokenPipeError, ConnectionResetError)):
                    raise
                handle.seek(start + sent)
                remaining = length - sent
                while remaining > 0:
                    data = handle.read(min(remaining, _CHUNK))
                    if not data:
                        break
                    self.wfile.write(data)
                    remaining -= len(data)
                sent = length - remaining
            with _SENT_LOCK:
                _SENT["bytes"] += sent
                _SENT["gets"] += 1
            if sent < length:  # the file shrank under us: the framing is broken, drop the connection
                self.close_connection = True
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _local(tag: str) -> str:
    """An XML tag without its namespace."""
    return tag.rpartition("}")[2]


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def server_bind(self) -> None:
        self.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        super().server_bind()


def serve(folder: str, port: int = 0, host: str = "127.0.0.1",
          delay: float = 0.0) -> tuple[http.server.ThreadingHTTPServer, threading.Thread]:
    """Serve ``folder`` on ``host:port`` (0: a free port, see ``server.server_port``) from a daemon
    thread, each answer ``delay`` seconds after its request; stop with ``server.shutdown();
    server.server_close()``."""
    handler = type("Handler", (RangeHandler,), {"root": os.path.abspath(folder), "lock": threading.Lock(),
                                                "delay": delay})
    server = _Server((host, port), handler)
    thread = threading.Thread(target=server.serve_forever, name="rangeserver", daemon=True)
    thread.start()
    return server, thread


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds each answer waits after its request")
    args = parser.parse_args()
    if not os.path.isdir(args.folder):
        parser.error(f"{args.folder!r} is not a folder")
    server, thread = serve(args.folder, args.port, args.host, args.delay)
    print(f"serving {os.path.abspath(args.folder)} on http://{args.host}:{server.server_port}", flush=True)
    try:
        thread.join()
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
        server.server_close()


if __name__ == "__main__":
    main()
