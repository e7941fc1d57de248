"""A small HTTP/1.1 reverse proxy that puts latency and faults between a client and a local server.

Tests and benchmarks need an object store that is "20-50 ms away", and one that misbehaves. This
proxy sits in front of a server on 127.0.0.1 (moto's S3 server, a GCS emulator, a plain HTTP
server), forwards the bytes unchanged, and understands just enough HTTP/1.1 to find where each
request and each response starts and ends (request line and headers, then a ``Content-Length``
or ``chunked`` body; responses framed by ``Content-Length``, ``chunked`` or the connection
closing; ``100 Continue`` interim responses; ``HEAD``, ``204`` and ``304`` without bodies). So the
delay applies to each *request* (its first-byte latency, counted from when its head arrived), and
keep-alive connections carry many requests. Each client connection is served one exchange at a
time, in order, over its own upstream connection; pipelined requests are answered in order too,
each delayed in turn (HTTP clients don't pipeline). When the server closes its connection after
each answer (werkzeug, so moto's server, always does), the proxy drops that ``Connection: close``
and keeps the client's connection alive, reconnecting upstream for the next request, as a real
store would; ``connect_delay`` adds to the first request of each client connection what a far
store's TCP (and TLS) handshake would cost::

    with Proxy("127.0.0.1", moto_port, delay=0.02) as proxy:
        client = boto3.client("s3", endpoint_url=proxy.url, ...)
        proxy.truncate_next(1, after_bytes=1000, match=r"/data/big")  # the next GET of .../big*
        ...
        assert proxy.methods["HEAD"] == 0 and proxy.bytes_down < 10_000_000

Everything runs in one background thread with its own asyncio event loop; each client connection
gets its own connection to the upstream server. Faults are armed at run time from any thread and
count how often they fired (:attr:`Proxy.fired`):

* ``truncate_next(n, after_bytes)``: forward only the response head and the first ``after_bytes``
  bytes of the next ``n`` response bodies, then close the connection;
* ``reset_next(n)``: close the connection (with a TCP reset) instead of forwarding the request;
* ``stall_next(n, seconds)``: hold the response that long before forwarding it;
* ``delay_next(n, seconds)``: hold the request that much longer before forwarding it;
* ``respond_next(n, status, body)``: answer with a canned response without asking the server
  (an S3 ``AccessDenied`` or ``SlowDown`` error, say);
* ``down(mode)`` / ``up()``: a dead server: refuse connections (``"refuse"``, the port closes),
  reset them (``"reset"``) or accept them and never answer (``"hang"``); live connections drop;
* ``set_hook(fn)``: ``fn(request)`` for every request no armed fault took returns a
  :class:`Fault` (``Fault.reset()``, ``Fault.truncate(n)``, ``Fault.stall(s)``, ``Fault.delay(s)``,
  ``Fault.respond(...)``, :func:`s3_error`) or None.

Each fault takes ``match`` (a regex searched in the request target, or a callable taking the
:class:`Request`), ``method`` and ``ranged`` (True: only requests with a ``Range`` header) to
target specific objects.

Counters: :attr:`Proxy.requests`, :attr:`Proxy.methods` (per method), :attr:`Proxy.connections`
(client connections accepted), :attr:`Proxy.upstream_connections`,
:attr:`Proxy.bytes_down` / :attr:`Proxy.body_bytes_down` (forwarded to clients),
:attr:`Proxy.bytes_up`, and :attr:`Proxy.log`, one :class:`Request` (method, path, range, status,
body bytes, fault) per request. :meth:`Proxy.stats` snapshots them; :meth:`Proxy.clear` zeroes them.

Run as a program it proxies until interrupted, one listening port per ``--delay`` (each new
connection's first request waits as long again, unless ``--connect-delay`` says otherwise)::

    python tests/support/netproxy.py 127.0.0.1:5000 --delay 0.02 --delay 0.05
    # prints "listening 127.0.0.1 41234 41235"

No dependencies beyond the standard library.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import random
import re
import signal
import socket
import struct
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

_READ = 256 * 1024
_HEAD_LIMIT = 1 << 20


@dataclass
class Request:
    """One request that passed the proxy, and what became of its response."""

    method: str
    path: str  #: the request target as sent (path and query)
    headers: dict[str, str]  #: lower-cased names; a repeated header keeps its last value
    range: str | None = None  #: the ``Range`` header, if any
    connection: int = 0  #: which client connection (1, 2, ... in accept order) carried it
    arrived: float = 0.0  #: time.monotonic() when its head had arrived
    status: int | None = None  #: the response status (None: no response reached the client)
    body_bytes: int = 0  #: response body bytes forwarded to the client
    fault: str | None = None  #: the fault applied to it, if any

    def header(self, name: str, default: str | None = None) -> str | None:
        return self.headers.get(name.lower(), default)


@dataclass
class Fault:
    """What to do to one request: see the ``Proxy.*_next`` methods. Returned by hooks."""

    kind: str  #: "truncate", "reset", "stall", "respond" or "delay"
    after_bytes: int = 0
    seconds: float = 0.0
    status: int = 500
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)

    @classmethod
    def truncate(cls, after_bytes: int = 0) -> "Fault":
        return cls("truncate", after_bytes=after_bytes)

    @classmethod
    def reset(cls) -> "Fault":
        return cls("reset")

    @classmethod
    def stall(cls, seconds: float) -> "Fault":
        return cls("stall", seconds=seconds)

    @classmethod
    def delay(cls, seconds: float) -> "Fault":
        """An extra delay before forwarding the request (on top of the proxy's own)."""
        return cls("delay", seconds=seconds)

    @classmethod
    def respond(cls, status: int, body: bytes | str = b"", headers: dict[str, str] | None = None) -> "Fault":
        return cls("respond", status=status, body=body.encode() if isinstance(body, str) else body,
                   headers=dict(headers or {}))


_REASONS = {200: "OK", 206: "Partial Content", 400: "Bad Request", 403: "Forbidden", 404: "Not Found",
            412: "Precondition Failed", 416: "Range Not Satisfiable", 429: "Too Many Requests",
            500: "Internal Server Error", 502: "Bad Gateway", 503: "Service Unavailable", 504: "Gateway Timeout"}


def s3_error(code: str, message: str = "", status: int | None = None) -> Fault:
    """A canned S3-style XML error response (``AccessDenied`` -> 403, ``SlowDown`` -> 503, ...)."""
    if status is None:
        status = {"AccessDenied": 403, "SlowDown": 503, "NoSuchKey": 404, "InternalError": 500,
                  "PreconditionFailed": 412, "InvalidAccessKeyId": 403}.get(code, 400)
    body = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code><Message>{message or code}'
            f'</Message><RequestId>netproxy</RequestId></Error>')
    return Fault.respond(status, body, {"Content-Type": "application/xml"})


@dataclass
class _Armed:
    fault: Fault
    remaining: int
    test: Callable[[Request], bool]


def _matcher(match: str | re.Pattern | Callable[[Request], bool] | None, method: str | None,
             ranged: bool | None) -> Callable[[Request], bool]:
    if match is None:
        test_match: Callable[[Request], bool] = lambda r: True
    elif callable(match) and not isinstance(match, (str, re.Pattern)):
        test_match = match
    else:
        pattern = re.compile(match) if isinstance(match, str) else match
        test_match = lambda r: pattern.search(r.path) is not None
    wanted = method.upper() if method else None

    def test(request: Request) -> bool:
        if wanted is not None and request.method != wanted:
            return False
        if ranged is not None and (request.range is not None) != ranged:
            return False
        return bool(test_match(request))

    return test


class _Closed(Exception):
    """The connection is over (EOF, reset, or a fault closed it)."""


class _Truncated(Exception):
    """A truncate fault used up its bytes."""


def _parse_head(head: bytes) -> tuple[str, list[tuple[str, str]]]:
    lines = head.decode("latin-1").split("\r\n")
    headers = []
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if sep:
            headers.append((name.strip().lower(), value.strip()))
    return lines[0], headers


def _framing(headers: list[tuple[str, str]]) -> tuple[bool, int | None]:
    """(chunked, content length) from the headers."""
    chunked, length = False, None
    for name, value in headers:
        if name == "transfer-encoding" and "chunked" in value.lower():
            chunked = True
        elif name == "content-length":
            try:
                length = int(value.split(",")[0])
            except ValueError:
                raise _Closed("bad Content-Length") from None
    return chunked, length


class _Sink:
    """Writes to one side, counting, with an optional rate cap and truncation budget."""

    def __init__(self, writer: asyncio.StreamWriter, count: Callable[[int, bool], None],
                 rate: float | None = None, budget: int | None = None):
        self.writer, self.count, self.rate, self.budget = writer, count, rate, budget
        self.body = 0
        self.started = time.monotonic()

    async def head(self, data: bytes) -> None:
        self.writer.write(data)
        self.count(len(data), False)
        await self.writer.drain()

    async def send(self, data: bytes) -> None:
        if self.budget is not None and self.body + len(data) >= self.budget:
            data = data[: self.budget - self.body]
            if data:
                self.writer.write(data)
                self.body += len(data)
                self.count(len(data), True)
            await self.writer.drain()
            raise _Truncated()
        self.writer.write(data)
        self.body += len(data)
        self.count(len(data), True)
        await self.writer.drain()
        if self.rate:
            ahead = self.started + self.body / self.rate - time.monotonic()
            if ahead > 0:
                await asyncio.sleep(ahead)


async def _read_exactly(reader: asyncio.StreamReader, n: int, sink: _Sink, piece: int = _READ) -> None:
    while n > 0:
        data = await reader.read(min(piece, n))
        if not data:
            raise _Closed("EOF inside a body")
        n -= len(data)
        await sink.send(data)


async def _copy_chunked(reader: asyncio.StreamReader, sink: _Sink, piece: int = _READ) -> None:
    while True:
        try:
            line = await reader.readuntil(b"\r\n")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
            raise _Closed("EOF inside a chunked body") from exc
        try:
            size = int(line.split(b";", 1)[0].strip() or b"0", 16)
        except ValueError:
            raise _Closed("bad chunk size") from None
        await sink.send(line)
        if size == 0:
            while True:  # trailers, then the empty line
                try:
                    line = await reader.readuntil(b"\r\n")
                except (asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
                    raise _Closed("EOF inside chunked trailers") from exc
                await sink.send(line)
                if line == b"\r\n":
                    return
        await _read_exactly(reader, size + 2, sink, piece)


async def _copy_to_eof(reader: asyncio.StreamReader, sink: _Sink, piece: int = _READ) -> None:
    while True:
        data = await reader.read(piece)
        if not data:
            return
        await sink.send(data)


def _abort(writer: asyncio.StreamWriter | None, rst: bool = True) -> None:
    if writer is None:
        return
    transport = writer.transport
    if transport.is_closing():
        return
    if rst:
        sock = writer.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            except OSError:
                pass
        transport.abort()
    else:
        transport.close()


class _Connection:
    def __init__(self, number: int, client_writer: asyncio.StreamWriter):
        self.number = number
        self.client_writer = client_writer
        self.upstream_writer: asyncio.StreamWriter | None = None
        self.task: asyncio.Task | None = None

    def abort(self, rst: bool = True) -> None:
        _abort(self.client_writer, rst)
        _abort(self.upstream_writer, rst)


class Proxy:
    """A delaying, fault-injecting HTTP/1.1 reverse proxy on 127.0.0.1 for ``upstream_host:upstream_port``.

    ``delay``: seconds each request waits, from the arrival of its head, before it is forwarded
    (plus up to ``jitter`` more, at random); the first request of each client connection waits
    ``connect_delay`` more (what a far store's handshakes would cost). ``bandwidth``: a bytes/s
    cap on each response body (None: none). ``port``: where to listen (0: any free port;
    :attr:`port` tells which after :meth:`start`). ``log_limit``: how many requests :attr:`log`
    keeps (the oldest go first). :attr:`delay`, :attr:`jitter`, :attr:`connect_delay` and
    :attr:`bandwidth` may be changed while it runs.
    """

    def __init__(self, upstream_host: str, upstream_port: int, delay: float = 0.02, *, jitter: float = 0.0,
                 connect_delay: float = 0.0, bandwidth: float | None = None, host: str = "127.0.0.1",
                 port: int = 0, log_limit: int = 100_000):
        self.upstream = (upstream_host, int(upstream_port))
        self.delay, self.jitter, self.bandwidth = float(delay), float(jitter), bandwidth
        self.connect_delay = float(connect_delay)
        self.host, self.port = host, int(port)
        self._lock = threading.Lock()
        self._armed: list[_Armed] = []
        self._hook: Callable[[Request], Fault | None] | None = None
        self._down: str | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.base_events.Server | None = None
        self._connections: set[_Connection] = set()
        self._random = random.Random(0)
        self.log: collections.deque[Request] = collections.deque(maxlen=log_limit)
        self.clear()

    # ------------------------------------------------------------------ counters

    def clear(self) -> None:
        """Zero the counters and the log (faults stay armed)."""
        with self._lock:
            self.requests = 0
            self.connections = 0
            self.upstream_connections = 0
            self.bytes_down = 0
            self.body_bytes_down = 0
            self.bytes_up = 0
            self.methods: collections.Counter[str] = collections.Counter()
            self.fired: collections.Counter[str] = collections.Counter()
            self.log.clear()

    def stats(self) -> dict[str, Any]:
        """A snapshot of the counters."""
        with self._lock:
            return {"requests": self.requests, "connections": self.connections,
                    "upstream_connections": self.upstream_connections, "bytes_down": self.bytes_down,
                    "body_bytes_down": self.body_bytes_down, "bytes_up": self.bytes_up,
                    "methods": dict(self.methods), "fired": dict(self.fired)}

    def requests_matching(self, match=None, method: str | None = None, ranged: bool | None = None) -> list[Request]:
        """The logged requests that ``match`` (as for the faults)."""
        test = _matcher(match, method, ranged)
        with self._lock:
            return [r for r in self.log if test(r)]

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    # ------------------------------------------------------------------ faults

    def _arm(self, fault: Fault, n: int, match, method, ranged) -> None:
        if n <= 0:
            return
        with self._lock:
            self._armed.append(_Armed(fault, int(n), _matcher(match, method, ranged)))

    def truncate_next(self, n: int = 1, after_bytes: int = 0, *, match=None, method: str | None = None,
                      ranged: bool | None = None) -> None:
        """Forward only the first ``after_bytes`` body bytes of the next ``n`` matching responses, then close."""
        self._arm(Fault.truncate(after_bytes), n, match, method, ranged)

    def reset_next(self, n: int = 1, *, match=None, method: str | None = None, ranged: bool | None = None) -> None:
        """Reset the connection instead of forwarding the next ``n`` matching requests."""
        self._arm(Fault.reset(), n, match, method, ranged)

    def stall_next(self, n: int = 1, seconds: float = 1.0, *, match=None, method: str | None = None,
                   ranged: bool | None = None) -> None:
        """Hold the responses to the next ``n`` matching requests ``seconds`` before forwarding them."""
        self._arm(Fault.stall(seconds), n, match, method, ranged)

    def delay_next(self, n: int = 1, seconds: float = 1.0, *, match=None, method: str | None = None,
                   ranged: bool | None = None) -> None:
        """Hold the next ``n`` matching requests ``seconds`` more before forwarding them."""
        self._arm(Fault.delay(seconds), n, match, method, ranged)

    def respond_next(self, n: int = 1, status: int | Fault = 503, body: bytes | str = b"",
                     headers: dict[str, str] | None = None, *, match=None, method: str | None = None,
                     ranged: bool | None = None) -> None:
        """Answer the next ``n`` matching requests with a canned response (or the given ``respond`` Fault)."""
        fault = status if isinstance(status, Fault) else Fault.respond(status, body, headers)
        self._arm(fault, n, match, method, ranged)

    def disarm(self) -> None:
        """Forget every armed fault and the hook."""
        with self._lock:
            self._armed.clear()
            self._hook = None

    def armed(self) -> int:
        """How many armed faults are yet to fire."""
        with self._lock:
            return sum(a.remaining for a in self._armed)

    def set_hook(self, hook: Callable[[Request], Fault | None] | None) -> None:
        """Call ``hook(request)`` for every request not taken by an armed fault; it returns a Fault or None."""
        with self._lock:
            self._hook = hook

    def down(self, mode: str = "refuse") -> None:
        """Act as a dead server until :meth:`up`: ``"refuse"`` closes the port (connection refused),
        ``"reset"`` resets every new connection, ``"hang"`` accepts and never answers. Live connections drop."""
        if mode not in ("refuse", "reset", "hang"):
            raise ValueError(f"down mode {mode!r}: use 'refuse', 'reset' or 'hang'")
        with self._lock:
            self._down = mode
        self._call(self._go_down(mode))

    def up(self) -> None:
        """Serve again after :meth:`down` (on the same port)."""
        with self._lock:
            was = self._down
            self._down = None
        if was is not None:
            self._call(self._go_up())

    @property
    def is_down(self) -> bool:
        return self._down is not None

    def _choose(self, request: Request) -> Fault | None:
        with self._lock:
            for armed in self._armed:
                if armed.remaining > 0 and armed.test(request):
                    armed.remaining -= 1
                    self.fired[armed.fault.kind] += 1
                    break
            else:
                armed = None
            self._armed = [a for a in self._armed if a.remaining > 0]
            hook = self._hook
        if armed is not None:
            return armed.fault
        if hook is not None:
            fault = hook(request)
            if fault is not None:
                with self._lock:
                    self.fired[fault.kind] += 1
            return fault
        return None

    # ------------------------------------------------------------------ life cycle

    def start(self) -> int:
        """Start listening (in a background thread); returns the port."""
        if self._thread is not None:
            return self.port
        started = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                loop.run_until_complete(self._listen())
            except BaseException as exc:  # noqa: BLE001 - handed to start()
                failure.append(exc)
                started.set()
                loop.close()
                return
            started.set()
            try:
                loop.run_forever()
            finally:
                loop.close()

        self._thread = threading.Thread(target=run, name=f"netproxy-{self.upstream[1]}", daemon=True)
        self._thread.start()
        started.wait()
        if failure:
            self._thread.join()
            self._thread = None
            raise failure[0]
        return self.port

    def stop(self) -> None:
        """Close the port and every connection, and end the thread."""
        if self._thread is None or self._loop is None:
            return
        try:
            self._call(self._shutdown())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            self._thread = None
            self._loop = None

    def __enter__(self) -> "Proxy":
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def _call(self, coro) -> Any:
        if self._loop is None:
            coro.close()
            return None
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=30)

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._serve, self.host, self.port, backlog=4096,
                                                  limit=_HEAD_LIMIT, reuse_address=True)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _go_down(self, mode: str) -> None:
        if mode == "refuse" and self._server is not None:
            self._server.close()
            self._server = None
        dropped = list(self._connections)
        for connection in dropped:
            connection.abort()
        with self._lock:
            self.fired["down"] += len(dropped)

    async def _go_up(self) -> None:
        for connection in list(self._connections):  # the hung ones
            connection.abort()
        if self._server is None:
            await self._listen()

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        tasks = []
        for connection in list(self._connections):
            connection.abort(rst=False)
            if connection.task is not None:
                connection.task.cancel()
                tasks.append(connection.task)
        if tasks:
            await asyncio.wait(tasks, timeout=5)

    # ------------------------------------------------------------------ the work

    def _count_down(self, n: int, body: bool) -> None:
        with self._lock:
            self.bytes_down += n
            if body:
                self.body_bytes_down += n

    def _count_up(self, n: int, body: bool) -> None:
        with self._lock:
            self.bytes_up += n

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with self._lock:
            self.connections += 1
            number = self.connections
            mode = self._down
        connection = _Connection(number, writer)
        connection.task = asyncio.current_task()
        self._connections.add(connection)
        try:
            if mode == "reset":
                with self._lock:
                    self.fired["down"] += 1
                connection.abort()
                return
            if mode == "hang":
                with self._lock:
                    self.fired["down"] += 1
                while await reader.read(_READ):
                    pass
                return
            await self._exchanges(connection, reader, writer)
        except (_Closed, ConnectionError, OSError, asyncio.IncompleteReadError):
            connection.abort()
        except asyncio.CancelledError:
            pass
        finally:
            connection.abort(rst=False)
            self._connections.discard(connection)

    async def _exchanges(self, connection: _Connection, reader: asyncio.StreamReader,
                         writer: asyncio.StreamWriter) -> None:
        """Serve one client connection: one request and its response at a time, in order."""
        loop = asyncio.get_running_loop()
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        first = True
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError:
                    return  # the client closed the connection
                except asyncio.LimitOverrunError as exc:
                    raise _Closed("request head too long") from exc
                arrived = loop.time()
                line, headers = _parse_head(head)
                parts = line.split(" ")
                if len(parts) < 3:
                    raise _Closed(f"bad request line {line!r}")
                request = Request(method=parts[0].upper(), path=parts[1], headers=dict(headers),
                                  connection=connection.number, arrived=time.monotonic())
                request.range = request.headers.get("range")
                chunked, length = _framing(headers)
                has_body = chunked or bool(length)
                expects_continue = "100-continue" in request.headers.get("expect", "").lower()
                client_close = ("close" in request.headers.get("connection", "").lower()
                                or parts[2].upper() == "HTTP/1.0")
                with self._lock:
                    self.requests += 1
                    self.methods[request.method] += 1
                    self.log.append(request)
                fault = self._choose(request)
                kind = fault.kind if fault is not None else None
                request.fault = kind
                wait = self.delay + (self._random.uniform(0, self.jitter) if self.jitter else 0.0)
                if first:
                    wait += self.connect_delay
                    first = False
                if kind == "delay":
                    wait += fault.seconds
                if kind == "reset":
                    connection.abort(rst=True)
                    raise _Closed("reset fault")
                if kind == "respond":
                    # a client waiting for "100 Continue" sends no body: answer and close, as servers do
                    close = expects_continue or client_close
                    if has_body and not expects_continue:
                        await _read_body(reader, chunked, length, _Null())
                    remaining = arrived + wait - loop.time()
                    if remaining > 0:
                        await asyncio.sleep(remaining)
                    body = fault.body
                    extra = "".join(f"{k}: {v}\r\n" for k, v in fault.headers.items())
                    canned = (f"HTTP/1.1 {fault.status} {_REASONS.get(fault.status, 'Error')}\r\n"
                              f"Content-Length: {len(body)}\r\n{extra}"
                              f"Connection: {'close' if close else 'keep-alive'}\r\n\r\n").encode("latin-1") + body
                    await _Sink(writer, self._count_down).head(canned)
                    request.status = fault.status
                    if close:
                        return
                    continue
                remaining = arrived + wait - loop.time()
                if remaining > 0:
                    await asyncio.sleep(remaining)
                if upstream is None or upstream[0].at_eof() or upstream[1].is_closing():
                    if upstream is not None:
                        _abort(upstream[1], rst=False)
                    try:
                        upstream = await asyncio.open_connection(*self.upstream, limit=_HEAD_LIMIT)
                    except OSError as exc:
                        raise _Closed(f"cannot reach the server: {exc}") from exc
                    connection.upstream_writer = upstream[1]
                    with self._lock:
                        self.upstream_connections += 1
                up_reader, up_writer = upstream
                up = _Sink(up_writer, self._count_up)
                await up.head(head)
                sending = asyncio.ensure_future(_read_body(reader, chunked, length, up)) if has_body else None
                try:
                    close_client, close_upstream = await self._response(
                        request, kind, fault, up_reader, writer, client_close)
                finally:
                    if sending is not None:
                        if not sending.done():
                            # answered before the body was all sent: what is left of it is in the way
                            sending.cancel()
                            close_client = close_upstream = True
                        try:
                            await sending
                        except BaseException:  # noqa: BLE001 - cancelled, or the client went away
                            close_client = close_upstream = True
                if close_upstream:
                    _abort(up_writer, rst=False)
                    upstream = None
                if close_client:
                    return
        finally:
            if upstream is not None:
                _abort(upstream[1], rst=False)

    async def _response(self, request: Request, kind: str | None, fault: Fault | None,
                        up_reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                        client_close: bool) -> tuple[bool, bool]:
        """Forward the response to ``request``; (close the client connection?, close the upstream one?)."""
        if kind == "stall":
            await asyncio.sleep(fault.seconds)
        down = _Sink(writer, self._count_down, rate=self.bandwidth,
                     budget=fault.after_bytes if kind == "truncate" else None)
        while True:
            try:
                head = await up_reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
                raise _Closed("the server closed the connection without an answer") from exc
            line, headers = _parse_head(head)
            try:
                version, status = line.split(" ", 2)[:2]
                status = int(status)
            except ValueError:
                raise _Closed(f"bad status line {line!r}") from None
            if 100 <= status < 200 and status != 101:
                await down.head(head)  # 100 Continue and friends: the final answer follows
                continue
            break
        request.status = status
        chunked, length = _framing(headers)
        no_body = request.method == "HEAD" or status in (204, 304)
        close_delimited = not (no_body or chunked or length is not None)
        connection_header = ",".join(v for n, v in headers if n == "connection").lower()
        close_upstream = ("close" in connection_header or close_delimited
                          or (version.upper() == "HTTP/1.0" and "keep-alive" not in connection_header))
        close_client = client_close or close_delimited
        if close_upstream and not close_client:
            # the server closes after each answer (werkzeug, moto's server, does): keep the client's
            # connection alive all the same, as a real store would, and reconnect upstream for the next
            lines = head.split(b"\r\n")
            kept = [lines[0]] + [h for h in lines[1:] if h and not h.lower().startswith(b"connection:")]
            if version.upper() == "HTTP/1.0":
                kept[0] = b"HTTP/1.1" + kept[0][8:]
            head = b"\r\n".join(kept) + b"\r\n\r\n"
        try:
            await down.head(head)
            if not no_body:
                if close_delimited:
                    await _copy_to_eof(up_reader, down)
                else:
                    await _read_body(up_reader, chunked, length, down)
            if kind == "truncate":
                raise _Truncated()  # a body shorter than the budget: cut after it all the same
        except _Truncated:
            request.body_bytes = down.body
            _abort(writer, rst=False)
            raise _Closed("truncate fault") from None
        request.body_bytes = down.body
        return close_client, close_upstream


class _Null:
    async def send(self, data: bytes) -> None:
        pass


async def _read_body(reader: asyncio.StreamReader, chunked: bool, length: int | None, sink) -> None:
    if chunked:
        await _copy_chunked(reader, sink)
    elif length:
        await _read_exactly(reader, length, sink)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="A delaying HTTP/1.1 proxy in front of HOST:PORT on 127.0.0.1.")
    parser.add_argument("upstream", help="HOST:PORT of the server to proxy")
    parser.add_argument("--delay", type=float, action="append",
                        help="seconds added to each request; repeat for one port per delay (default 0.02)")
    parser.add_argument("--jitter", type=float, default=0.0, help="up to this many seconds more, at random")
    parser.add_argument("--connect-delay", type=float, default=None,
                        help="seconds more for the first request of each connection (default: the delay)")
    parser.add_argument("--bandwidth", type=float, default=None, help="bytes/s per response body")
    args = parser.parse_args(argv)
    host, _, port = args.upstream.rpartition(":")
    proxies = [Proxy(host or "127.0.0.1", int(port), d, jitter=args.jitter, bandwidth=args.bandwidth,
                     connect_delay=d if args.connect_delay is None else args.connect_delay)
               for d in (args.delay or [0.02])]
    for proxy in proxies:
        proxy.start()
    print("listening 127.0.0.1 " + " ".join(str(p.port) for p in proxies), flush=True)
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    done.wait()
    for proxy in proxies:
        proxy.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
