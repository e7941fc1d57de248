"""``Link``: one Connection's ZeroMQ socket, from its URLs to its close.

A Connection's sending and receiving both need the same socket and the same answers about it:
is it open, in this process, which endpoints it has, how many peers are connected, and how to
wait on it without missing peer changes or Ctrl+C. That is kept here, apart from what is sent or
received: the socket's own context (one made in a parent process is never used by a forked
child), the options set when it opens (queues, limits, heartbeats or keepalive, security),
binding and connecting its URLs, counting peers and a publisher's subscribers, waiting with a
timeout that names the peers, and closing.
"""

from __future__ import annotations

import os
import time
from typing import Iterable

import zmq

from ..errors import PeerTimeoutError, ServeError
from . import envelope
from .options import SocketOptions
from .peers import PeerCount
from .urls import Endpoint, parse_urls

#: Slice of a blocking wait, so that peer changes and Ctrl+C are seen.
POLL_MS = 200
#: How often a publisher blocked by a full subscriber tries its send again.
XPUB_RETRY_MS = 2
#: ZeroMQ heartbeat interval: a TCP peer that stops answering for ``timeout`` is dropped.
HEARTBEAT_MS = 1000
#: The longest heartbeat TTL libzmq takes, in ms.
HEARTBEAT_MAX_MS = 6553599
#: A receiver's TCP keepalive (it sends no heartbeats): a silent connection is probed after
#: this many seconds, every interval, and dropped after this many unanswered probes (25 s).
KEEPALIVE_IDLE_S, KEEPALIVE_INTERVAL_S, KEEPALIVE_PROBES = 10, 5, 3
#: ZeroMQ's own limit on one frame is this many times ``max_message_bytes`` (at least
#: :data:`FRAME_GUARD_MIN_BYTES`): a guard on memory, checked on the frame's size before any of it
#: is received. ZeroMQ drops the connection of a frame past it and tells no one why (its monitor
#: reports a plain disconnection), so it cannot be counted: the guard sits well above
#: ``max_message_bytes``, which the Connection itself applies to whole messages, counting them.
FRAME_GUARD_FACTOR = 4
FRAME_GUARD_MIN_BYTES = 64 << 20


class Link:
    """The socket of one Connection: opened at the first :meth:`connect`, closed by :meth:`close`.

    :ivar socket: the ZeroMQ socket (None before the first URL and after closing).
    :ivar context: its own ZeroMQ context.
    :ivar endpoints: the endpoints bound or connected, in order.
    :ivar topic: the Connection's topic (a publisher's default, a subscriber's subscription).
    :ivar subscribed: subscribers a publisher has seen join (and not leave).
    """

    def __init__(self, options: SocketOptions, topic: str | None) -> None:
        self.options = options
        self.topic = topic
        self.endpoints: list[Endpoint] = []
        self.socket: zmq.Socket | None = None
        self.context: zmq.Context | None = None
        self.pid = os.getpid()
        self.peer_count: PeerCount | None = None
        self.auth = None
        self.subscribed = 0

    def connect(self, url: str | Iterable[str], topic: str | None = None, *, noexpand: bool = False) -> None:
        """Bind or connect to more endpoints (all of the socket's kind), opening the socket at the first."""
        self.check_process()
        endpoints = parse_urls(url, noexpand)
        if self.endpoints and endpoints[0].socket_type != self.endpoints[0].socket_type:
            raise ValueError(f"{endpoints[0].url} makes another kind of socket than {self.endpoints[0].url}")
        if topic is not None:
            self.topic = topic
        elif endpoints[0].topic is not None:
            self.topic = endpoints[0].topic
        if self.socket is None:
            self.open(endpoints[0].socket_type)
        for endpoint in endpoints:
            try:
                if endpoint.bind:
                    self.socket.bind(endpoint.address)
                else:
                    self.socket.connect(endpoint.address)
            except zmq.ZMQError as exc:
                raise ServeError(f"cannot {'bind' if endpoint.bind else 'connect'} {endpoint.url} ({endpoint.address}): {exc}",
                                 url=endpoint.url) from exc
            self.endpoints.append(endpoint)
        if self.socket.type == zmq.SUB:
            self.socket.setsockopt(zmq.SUBSCRIBE, envelope.subscription(self.topic))

    def open(self, socket_type: int) -> None:
        """Make the context and the socket, with the options set before any endpoint."""
        self.context = zmq.Context()
        if socket_type == zmq.PUB:
            socket_type = zmq.XPUB  # to see subscriptions arrive, and to block rather than drop
        if self.options.shared_memory is not None and socket_type != zmq.PUSH:
            # a published batch goes to every subscriber: one ring entry could not tell when all let go
            raise ValueError("shared_memory is for PUSH producers (zpush, zrpush), not for this kind of socket")
        socket = self.context.socket(socket_type)
        linger = self.options.default_linger()
        if socket_type in (zmq.PULL, zmq.SUB):
            # A receiver has nothing of value to deliver at close, only a SUB's queued
            # subscription, which with no publisher up would hold close() for the whole linger.
            linger = 0
        socket.setsockopt(zmq.LINGER, int(linger * 1000))
        socket.setsockopt(zmq.SNDHWM, self.options.hwm)
        socket.setsockopt(zmq.RCVHWM, self.options.hwm)
        socket.setsockopt(zmq.MAXMSGSIZE, frame_guard(self.options.max_message_bytes))
        if socket_type in (zmq.PULL, zmq.SUB):
            # No ZMTP heartbeats on a receiver: libzmq (4.3.x) asserts (!_io_error), or drops the
            # connection and what is queued on it, when a heartbeat comes due while the
            # receiver's queue is full, i.e. whenever the consumer is slower than its producers
            # (libzmq issues 3596, 3937, 4767). The kernel's keepalive finds a vanished peer
            # instead; a peer that exits or is killed closes its connection anyway.
            socket.setsockopt(zmq.TCP_KEEPALIVE, 1)
            socket.setsockopt(zmq.TCP_KEEPALIVE_IDLE, KEEPALIVE_IDLE_S)
            socket.setsockopt(zmq.TCP_KEEPALIVE_INTVL, KEEPALIVE_INTERVAL_S)
            socket.setsockopt(zmq.TCP_KEEPALIVE_CNT, KEEPALIVE_PROBES)
        else:
            socket.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_MS)
            # libzmq refuses a TTL over 6553.599 s (it travels in deciseconds, in 16 bits): a longer
            # timeout (hours, for a slow producer) must not make the Connection fail to open
            heartbeat_ms = min(int((self.options.timeout or 30.0) * 1000), HEARTBEAT_MAX_MS)
            socket.setsockopt(zmq.HEARTBEAT_TIMEOUT, heartbeat_ms)
            socket.setsockopt(zmq.HEARTBEAT_TTL, heartbeat_ms)
        if socket_type == zmq.XPUB:
            socket.setsockopt(zmq.XPUB_NODROP, 1)
            socket.setsockopt(zmq.XPUB_VERBOSER, 1)
        if self.options.curve is not None:
            self.auth = self.options.curve.authenticator(self.context)
            self.options.curve.apply(socket)
        self.peer_count = PeerCount(socket)
        self.socket = socket

    def check_process(self) -> None:
        """Refuse a socket used in another process than the one it was made in (after a fork)."""
        if os.getpid() != self.pid:
            raise ServeError(
                f"this Connection was made in process {self.pid} and used in process {os.getpid()} (after a fork): "
                "a ZeroMQ socket cannot cross a fork; make the Connection in the process that uses it",
                url=self.endpoints[0].url if self.endpoints else None,
            )

    def require_socket(self) -> zmq.Socket:
        """The socket, in the process that made it; ServeError when there is none."""
        self.check_process()
        if self.socket is None:
            raise ServeError("the Connection has no socket: give it a URL, or call connect() first")
        return self.socket

    @property
    def peers(self) -> int:
        """Peers connected right now (ZeroMQ handshakes completed, less disconnections)."""
        return self.peer_count.read() if self.peer_count is not None else 0

    def read_subscriptions(self) -> None:
        """Take a publisher's subscription notes that arrived: each joins or leaves a subscriber."""
        socket = self.socket
        while True:
            try:
                note = socket.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            if note[:1] == b"\x01":
                self.subscribed += 1
            elif note[:1] == b"\x00":
                self.subscribed = max(0, self.subscribed - 1)

    def where(self) -> str:
        """The endpoints' URLs, for messages."""
        return ", ".join(e.url for e in self.endpoints) or "(no endpoint)"

    def deadline(self) -> float | None:
        """When a wait that starts now times out (None: never)."""
        return None if self.options.timeout is None else time.monotonic() + self.options.timeout

    def wait(self, event: int, deadline: float | None, doing: str) -> None:
        """Wait until the socket can ``event`` (POLLIN/POLLOUT), or raise at ``deadline``."""
        socket = self.socket
        started = time.monotonic()
        if socket.type != zmq.XPUB:
            # The common case, a batch within one slice, with one poll of the socket alone: the
            # poller below (with the monitor) costs about 0.1 ms a message. Peer events wait.
            first = POLL_MS if deadline is None else max(0, min(POLL_MS, int((deadline - started) * 1000)))
            if zmq.zmq_poll([(socket, event)], first):
                return
        poller = zmq.Poller()
        # An XPUB always polls ready for POLLOUT (libzmq cannot say that a subscriber is at its
        # high-water mark under XPUB_NODROP), so waiting for it would spin at full CPU: wait a
        # short slice instead (taking subscriptions meanwhile) and let the caller try again.
        retry_out = socket.type == zmq.XPUB and event == zmq.POLLOUT
        poller.register(socket, zmq.POLLIN if retry_out else event)
        monitor = self.peer_count.monitor
        if monitor is not None:
            poller.register(monitor, zmq.POLLIN)
        while True:
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                peers = self.peers
                since = now - self.peer_count.changed
                raise PeerTimeoutError(
                    f"{doing} on {self.where()} waited {max(0.0, deadline - started):.3g} s with {peers} peer(s) connected "
                    f"(the last change {since:.1f} s ago): the peer is gone, stuck or not started; "
                    "raise the timeout if it is only slow",
                    url=self.endpoints[0].url if self.endpoints else None,
                )
            slice_ms = XPUB_RETRY_MS if retry_out else POLL_MS
            wait = slice_ms if deadline is None else max(1, min(slice_ms, int((deadline - now) * 1000) + 1))
            ready = dict(poller.poll(wait))
            if monitor is not None and monitor in ready:
                self.peer_count.read()
            if socket.type == zmq.XPUB and socket.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                self.read_subscriptions()
            if retry_out or ready.get(socket, 0) & event:
                return

    def close(self, linger: float | None) -> None:
        """Close the socket, its monitor, authenticator and context (which waits for queued
        messages, up to ``linger`` seconds when given, else the socket's own LINGER)."""
        if self.socket is None:
            return
        if linger is not None:
            self.socket.setsockopt(zmq.LINGER, int(linger * 1000))
        if self.peer_count is not None:
            self.peer_count.close()
        self.socket.close()
        if self.auth is not None:
            self.auth.stop()
        self.context.term()  # waits for queued messages, up to LINGER
        self.socket = self.context = None


def frame_guard(max_message_bytes: int) -> int:
    """ZeroMQ's limit on one frame (``ZMQ_MAXMSGSIZE``) for a Connection of ``max_message_bytes``.

    Not ``max_message_bytes`` itself: ZeroMQ drops the peer of a frame over its limit without a
    word, and the message could not be counted in ``bad_messages`` as documented. Above it, by
    :data:`FRAME_GUARD_FACTOR` (at least :data:`FRAME_GUARD_MIN_BYTES`), the Connection sees such a
    message and refuses it itself; the guard still spares memory a frame that claims gigabytes.
    """
    if max_message_bytes < 0:
        return -1  # no limit, as ZeroMQ reads -1
    return min(max(FRAME_GUARD_FACTOR * max_message_bytes, FRAME_GUARD_MIN_BYTES), 2**63 - 1)
