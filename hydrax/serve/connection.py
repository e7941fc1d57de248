"""``Connection``: send and receive lists of arrays over ZeroMQ, as tensorcom's class of that name.

A Connection owns one ZeroMQ socket (and its own context, so one made in a parent process is
never used by a forked child: that is refused with an error instead of silently sending nothing,
as tensorcom 0.1.0 did). What it fixes, keeping tensorcom's API:

- messages queued at exit are delivered (``linger``), instead of dropped by ``LINGER=0``;
- queues are bounded (``hwm`` messages each way), so a slow consumer slows its producers;
- publishers never drop a message for a slow subscriber, and can wait for subscribers to join;
- a consumer or producer that waits longer than ``timeout`` raises :class:`PeerTimeoutError`,
  naming how many peers are connected (ZeroMQ heartbeats on senders, TCP keepalive on
  receivers, drop dead TCP peers);
- a malformed or oversize message is a :class:`MessageError` (skipped and counted by default);
- ``total`` stops iteration; uint32, bool, bfloat16, 0-d, big-endian and strided arrays work.

With ``protocol="hydrax"`` messages carry an envelope (:mod:`.envelope`) with topic, epoch and
batch numbers, item indices and end markers; a hydrax consumer reads both kinds. On one host a
hydrax producer can pass batch data through shared memory instead of the socket
(``shared_memory``, :mod:`.sharedmem`); its consumers need no option for it.
"""

from __future__ import annotations

import atexit
import collections
import logging
import os
import time
import uuid
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator

import numpy as np
import zmq

from .. import tenbin
from ..errors import MessageError, PeerTimeoutError, SchemaError, ServeError, TenbinError
from . import envelope, schema as schemas
from .envelope import DATA, END, EPOCH_END, SCHEMA
from .peers import PeerCount
from .security import Curve
from .sharedmem import Mappings, Ring, check_size, ring_bytes
from .stats import Statistics
from .urls import Endpoint, parse_urls

log = logging.getLogger(__name__)

PROTOCOLS = ("tensorcom", "hydrax")
OUTPUTS = ("numpy", "jax")
BAD_MESSAGE = ("skip", "raise")
#: Dtypes that ``send`` refuses unless ``allow64`` (tensorcom's rule: senders should downcast).
WIDE = ("float64", "int64", "uint64")
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
#: How long a producer that is failing waits to tell its consumers, and to deliver what is queued.
FAILING_SECONDS = 2.0
#: How often a PUSH fan-out offers another end marker while consumers remain.
END_RETRY_SECONDS = 0.02
#: ZeroMQ's own limit on one frame is this many times ``max_message_bytes`` (at least
#: :data:`FRAME_GUARD_MIN_BYTES`): a guard on memory, checked on the frame's size before any of it
#: is received. ZeroMQ drops the connection of a frame past it and tells no one why (its monitor
#: reports a plain disconnection), so it cannot be counted: the guard sits well above
#: ``max_message_bytes``, which the Connection itself applies to whole messages, counting them.
FRAME_GUARD_FACTOR = 4
FRAME_GUARD_MIN_BYTES = 64 << 20

_live: weakref.WeakSet = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    # Deliver what is still queued when a program ends without closing (tensorcom lost it).
    for connection in list(_live):
        try:
            connection.close()
        except Exception:  # noqa: BLE001 (exit must go on)
            log.debug("closing a Connection at exit failed", exc_info=True)


@dataclass
class Message:
    """One received message: its arrays, and what a hydrax envelope said about them.

    For tensorcom's messages (no envelope) only ``arrays`` and ``infos`` are set.
    """

    kind: str
    arrays: list = field(default_factory=list)
    infos: list[str] = field(default_factory=list)
    topic: str | None = None
    producer: str | None = None
    seq: int | None = None
    fields: dict[str, Any] = field(default_factory=dict)

    @property
    def epoch(self) -> int | None:
        """The training epoch (or validation run) of the batch, when the producer said."""
        return self.fields.get("epoch")

    @property
    def batch(self) -> int | None:
        """The batch's index within its epoch, when the producer said."""
        return self.fields.get("batch")

    @property
    def items(self) -> list[int] | None:
        """The item indices of the batch's rows, when the producer said."""
        return self.fields.get("items")


def _frame_buffer(frame) -> memoryview:
    return frame.buffer if isinstance(frame, zmq.Frame) else memoryview(frame)


class Connection:
    """A ZeroMQ socket that sends and receives lists of arrays in tensorcom's tenbin framing.

    The positional parameters and their defaults are tensorcom 0.1.0's; those after ``*`` are
    hydrax's.

    :param url: a URL or list of URLs (see :mod:`hydrax.serve.urls`), or None to ``connect`` later.
    :param epoch: what ``len()`` returns (nothing else), as in tensorcom.
    :param total: stop iterating after this many samples (items of the first array); -1: never.
    :param multipart: frames ``[hdr, data, ...]`` (True) or one tenbin buffer per message.
    :param infos: names sent with the arrays; on receive, names the arrays must have.
    :param device: with ``output="jax"``, the device to place arrays on (default: JAX's default).
    :param allow64: let :meth:`send` send float64/int64/uint64 arrays (tensorcom 0.1.0 stored
        this and ignored it; its ``send(allow64=...)`` works too).
    :param raw: accepted and ignored, as in tensorcom.
    :param batch_transforms: callables applied position-wise to each received list (None skips one).
    :param batch_count: count samples (``len`` of the first array) rather than messages.
    :param converters: callables applied after ``batch_transforms``, or ``"numpy"`` (no change).
    :param report: accepted and ignored; :meth:`items` and :meth:`serve` take their own.
    :param stats_horizon: messages over which recent rates are computed.
    :param noexpand: do not expand brace ranges in URLs.
    :param protocol: ``"tensorcom"`` (bare tenbin frames, what tensorcom reads) or ``"hydrax"``
        (an envelope first: topics, epoch and batch numbers, end markers). Receiving takes both.
    :param topic: on a hydrax publisher, the topic messages go to; on a subscriber, the one topic
        to receive (None: all messages). A ``#topic`` URL fragment sets it too.
    :param timeout: seconds one send or receive may wait before :class:`PeerTimeoutError`; None
        waits forever (tensorcom's behaviour).
    :param hwm: ZeroMQ high-water mark, in messages, for each queue of the socket (and each peer):
        the bound on what waits in memory (about ``hwm`` messages on each side).
    :param linger: seconds :meth:`close` waits for queued messages to leave (default ``timeout``,
        or 60 s when that is None).
    :param max_message_bytes: larger messages are refused: a :class:`MessageError`, skipped and
        counted in :attr:`bad_messages` (or raised, see ``on_bad_message``), and the peer that sent
        one stays connected. One frame past :data:`FRAME_GUARD_FACTOR` times this (at least
        :data:`FRAME_GUARD_MIN_BYTES`) is cut off by ZeroMQ itself, with its connection, before it
        is received: a guard on memory that ZeroMQ gives no reason for, so that one is not counted.
    :param max_queued_bytes: a producer's memory budget: :meth:`send` waits (up to ``timeout``)
        while the batches ZeroMQ still holds would exceed it with the next one (one batch always
        fits). None: only ``hwm`` bounds the queue.
    :param output: ``"numpy"`` arrays or ``"jax"`` arrays.
    :param aligned: receive data frames into 64-byte-aligned memory (one copy out of ZeroMQ's
        buffer, which XLA:CPU then aliases); on by default with ``output="jax"``. Without it numpy
        arrays view ZeroMQ's buffers: no copy, 8-byte alignment.
    :param producers: a hydrax consumer ends when this many producers (and every producer it
        heard from) have sent their end marker.
    :param subscribers: a publisher's first :meth:`send` waits (up to ``timeout``) until this many
        subscribers have subscribed, so that none misses the first messages.
    :param on_bad_message: ``"skip"`` (log and count in :attr:`bad_messages`) or ``"raise"``.
    :param curve: :class:`~hydrax.serve.Curve` settings to encrypt and authenticate.
    :param schema: what a consumer expects: ``[(name, dtype, shape), ...]``, None for any name,
        dtype or dimension. A hydrax producer's announcement, or any batch, that differs raises
        :class:`~hydrax.errors.SchemaError` naming the difference. Producers announce their schema
        to hydrax consumers (:attr:`schemas`) before their first batch.
    :param shared_memory: on a hydrax PUSH producer (``zpush``/``zrpush``) whose consumers run on
        the same host: the size in bytes of a shared memory ring that batch data goes through
        instead of the socket (True: room for ``2 * hwm + 3`` of the first batch, at least
        64 MiB). One copy into the ring, none at the consumer, which gets read-only arrays
        viewing it (see :mod:`hydrax.serve.sharedmem`). A batch that finds the ring full
        (consumers still hold the batches in it) goes through the socket. Consumers on another
        host cannot read such batches and raise :class:`~hydrax.errors.ServeError`.
    """

    def __init__(self, url: str | Iterable[str] | None = None, epoch: int = 100000, total: int = -1, multipart: bool = True,
                 infos: list[str] | None = None, device: Any = None, allow64: bool = False, raw: bool = False,
                 batch_transforms: Any = None, batch_count: bool = True, converters: Any = None, report: int = -1,
                 stats_horizon: int = 1000, noexpand: bool = False, *, protocol: str = "tensorcom", topic: str | None = None,
                 timeout: float | None = 60.0, hwm: int = 4, linger: float | None = None, max_message_bytes: int = 1 << 34,
                 max_queued_bytes: int | None = None,
                 output: str = "numpy", aligned: bool | None = None, producers: int = 1, subscribers: int = 0,
                 on_bad_message: str = "skip", curve: Curve | None = None, schema: Iterable[Any] | None = None,
                 shared_memory: int | bool | None = None) -> None:
        _check_options(protocol, output, on_bad_message, timeout, hwm, shared_memory, curve)
        self.epoch = epoch
        self.total = total
        self.multipart = bool(multipart)
        self.infos = infos
        self.device = device
        self.allow64 = allow64
        self.raw = False
        self.batch_transforms = _listify(batch_transforms)
        self.batch_count = batch_count
        self.converters = _converters(converters)
        self.report = -1
        self.stats = Statistics(stats_horizon)
        self.batch_size: int | None = None
        self.sampler = self.batch_sampler = None
        self.count = 0  # samples received (tensorcom's counter, which ``total`` bounds)
        self.protocol = protocol
        self.topic = topic
        self.timeout = timeout
        self.hwm = hwm
        self.linger = linger
        self.max_message_bytes = int(max_message_bytes)
        if max_queued_bytes is not None and not (isinstance(max_queued_bytes, int) and max_queued_bytes > 0):
            raise ValueError(f"max_queued_bytes must be a positive number of bytes or None, got {max_queued_bytes!r}")
        self.max_queued_bytes = max_queued_bytes
        self._queued: collections.deque[tuple[zmq.MessageTracker, int]] = collections.deque()
        self.output = output
        self.aligned = output == "jax" if aligned is None else bool(aligned)
        self.producers = producers
        self.subscribers = subscribers
        self.on_bad_message = on_bad_message
        self.curve = curve
        self.schema = schemas.parse_schema(schema)
        self.shared_memory = None if shared_memory in (None, False) else check_size(shared_memory)
        self._ring: Ring | None = None  # made at the first send
        self._mappings = Mappings()  # producers' rings this consumer maps
        #: batches this producer sent through shared memory (the others went through the socket)
        self.shared_batches = 0
        #: what each hydrax producer announced it sends: producer id -> ``[[name, dtype, shape], ...]``
        self.schemas: dict[str, list] = {}
        self._announced: list | None = None  # the schema this producer last announced
        self._announced_to = 0  # subscribers at that time (a new one must hear it too)
        #: messages that could not be decoded and were skipped
        self.bad_messages = 0
        #: this producer's id in hydrax envelopes (new in every process and Connection)
        self.producer_id = uuid.uuid4().hex[:16]
        self.endpoints: list[Endpoint] = []
        self.socket: zmq.Socket | None = None
        self.context: zmq.Context | None = None
        self._pid = os.getpid()
        self._peer_count: PeerCount | None = None
        self._auth = None
        self._subscribed = 0
        self._seq = 0
        self._topics: set[str] = set()  # topics this producer sent on (each gets an end marker)
        self._seen: set[str] = set()
        self._ended: dict[str, str | None] = {}
        self._finished = False
        if url is not None:
            self.connect(url, noexpand=noexpand)

    # -- set-up --------------------------------------------------------------------------------
    def connect(self, url: str | Iterable[str], topic: str | None = None, *, noexpand: bool = False) -> None:
        """Bind or connect to more endpoints (all of the socket's kind); ``topic`` as in tensorcom's ``connect``."""
        self._check_process()
        endpoints = parse_urls(url, noexpand)
        if self.endpoints and endpoints[0].socket_type != self.endpoints[0].socket_type:
            raise ValueError(f"{endpoints[0].url} makes another kind of socket than {self.endpoints[0].url}")
        if topic is not None:
            self.topic = topic
        elif endpoints[0].topic is not None:
            self.topic = endpoints[0].topic
        if self.socket is None:
            self._open(endpoints[0].socket_type)
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

    def _open(self, socket_type: int) -> None:
        self.context = zmq.Context()
        if socket_type == zmq.PUB:
            socket_type = zmq.XPUB  # to see subscriptions arrive, and to block rather than drop
        if self.shared_memory is not None and socket_type != zmq.PUSH:
            # a published batch goes to every subscriber: one ring entry could not tell when all let go
            raise ValueError("shared_memory is for PUSH producers (zpush, zrpush), not for this kind of socket")
        socket = self.context.socket(socket_type)
        linger = self._default_linger()
        if socket_type in (zmq.PULL, zmq.SUB):
            # A receiver has nothing of value to deliver at close, only a SUB's queued
            # subscription, which with no publisher up would hold close() for the whole linger.
            linger = 0
        socket.setsockopt(zmq.LINGER, int(linger * 1000))
        socket.setsockopt(zmq.SNDHWM, self.hwm)
        socket.setsockopt(zmq.RCVHWM, self.hwm)
        socket.setsockopt(zmq.MAXMSGSIZE, frame_guard(self.max_message_bytes))
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
            heartbeat_ms = min(int((self.timeout or 30.0) * 1000), HEARTBEAT_MAX_MS)
            socket.setsockopt(zmq.HEARTBEAT_TIMEOUT, heartbeat_ms)
            socket.setsockopt(zmq.HEARTBEAT_TTL, heartbeat_ms)
        if socket_type == zmq.XPUB:
            socket.setsockopt(zmq.XPUB_NODROP, 1)
            socket.setsockopt(zmq.XPUB_VERBOSER, 1)
        if self.curve is not None:
            self._auth = self.curve.authenticator(self.context)
            self.curve.apply(socket)
        self._peer_count = PeerCount(socket)
        self.socket = socket
        _live.add(self)

    def _default_linger(self) -> float:
        """Seconds closing waits for what is queued: ``linger``, else ``timeout``, else 60."""
        return self.linger if self.linger is not None else (self.timeout or 60.0)

    def _check_process(self) -> None:
        if os.getpid() != self._pid:
            raise ServeError(
                f"this Connection was made in process {self._pid} and used in process {os.getpid()} (after a fork): "
                "a ZeroMQ socket cannot cross a fork; make the Connection in the process that uses it",
                url=self.endpoints[0].url if self.endpoints else None,
            )

    def _require_socket(self) -> zmq.Socket:
        self._check_process()
        if self.socket is None:
            raise ServeError("the Connection has no socket: give it a URL, or call connect() first")
        return self.socket

    @property
    def peers(self) -> int:
        """Peers connected right now (ZeroMQ handshakes completed, less disconnections)."""
        return self._peer_count.read() if self._peer_count is not None else 0

    def _read_subscriptions(self) -> None:
        socket = self.socket
        while True:
            try:
                note = socket.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            if note[:1] == b"\x01":
                self._subscribed += 1
            elif note[:1] == b"\x00":
                self._subscribed = max(0, self._subscribed - 1)

    def _where(self) -> str:
        return ", ".join(e.url for e in self.endpoints) or "(no endpoint)"

    def _wait(self, event: int, deadline: float | None, doing: str) -> None:
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
        monitor = self._peer_count.monitor
        if monitor is not None:
            poller.register(monitor, zmq.POLLIN)
        while True:
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                peers = self.peers
                since = now - self._peer_count.changed
                raise PeerTimeoutError(
                    f"{doing} on {self._where()} waited {max(0.0, deadline - started):.3g} s with {peers} peer(s) connected "
                    f"(the last change {since:.1f} s ago): the peer is gone, stuck or not started; "
                    "raise the timeout if it is only slow",
                    url=self.endpoints[0].url if self.endpoints else None,
                )
            slice_ms = XPUB_RETRY_MS if retry_out else POLL_MS
            wait = slice_ms if deadline is None else max(1, min(slice_ms, int((deadline - now) * 1000) + 1))
            ready = dict(poller.poll(wait))
            if monitor is not None and monitor in ready:
                self._peer_count.read()
            if socket.type == zmq.XPUB and socket.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                self._read_subscriptions()
            if retry_out or ready.get(socket, 0) & event:
                return

    def _deadline(self) -> float | None:
        return None if self.timeout is None else time.monotonic() + self.timeout

    # -- sending -------------------------------------------------------------------------------
    def wait_for_subscribers(self, count: int | None = None) -> None:
        """On a publisher, wait until ``count`` (default ``subscribers``) subscribers have joined."""
        socket = self._require_socket()
        if socket.type != zmq.XPUB:
            raise ServeError(f"{self._where()} is not a publisher (zpub, zrpub)", url=self.endpoints[0].url)
        count = self.subscribers if count is None else count
        deadline = self._deadline()
        while True:
            self._read_subscriptions()
            if self._subscribed >= count:
                return
            if deadline is not None and time.monotonic() >= deadline:
                raise PeerTimeoutError(f"{self._where()}: {self._subscribed} of {count} subscribers joined within {self.timeout:g} s",
                                       url=self.endpoints[0].url)
            if socket.poll(POLL_MS, zmq.POLLIN):
                self._read_subscriptions()

    def send(self, data: Iterable[Any], allow64: bool = False, *, topic: str | None = None, infos: list[str] | None = None,
             **fields: Any) -> None:
        """Send one list of arrays (numpy, JAX, anything ``np.asarray`` takes), without copying them.

        ``allow64``: send float64/int64/uint64 (refused otherwise, as tensorcom does). With the
        hydrax protocol, ``topic`` overrides the Connection's (as ``infos`` does its names) and ``fields`` (JSON values such as
        ``epoch=1, batch=7, items=[...]``) travel in the envelope.
        """
        self._require_socket()
        arrays = [a if isinstance(a, np.ndarray) else np.asarray(a) for a in data]
        if not (allow64 or self.allow64):
            for i, a in enumerate(arrays):
                if a.dtype.name in WIDE:
                    raise TypeError(f"array {i} is {a.dtype.name}: send(..., allow64=True) sends 64-bit arrays "
                                    "(tensorcom refuses them by default; downcast to save bandwidth)")
        names = self.infos if infos is None else infos
        if self.multipart or self.shared_memory is not None:
            frames = tenbin.encode_list(arrays, names)
        else:
            frames = [tenbin.encode_buffer(arrays, names)]
        nbytes = sum(a.nbytes for a in arrays)
        queued = nbytes
        if self.protocol == "hydrax":
            self._announce(arrays, names, topic)
            if self.shared_memory is not None:
                if self._ring is None:
                    # both ends' queues, the batch the consumer holds, and room to spare
                    self._ring = Ring(ring_bytes(self.shared_memory, nbytes + 64 * len(arrays), 2 * self.hwm + 3))
                placed = self._ring.place(frames[1::2])
                if placed is not None:  # only the headers travel
                    frames, fields, queued = frames[0::2], dict(fields, m=placed), 0
                    self.shared_batches += 1
            frames.insert(0, self._envelope(DATA, topic, fields))
        if self.max_queued_bytes is None:
            self._send_frames(frames, "send")
        else:
            self._make_room(queued)
            self._queued.append((self._send_frames(frames, "send", track=True), queued))
        self.stats.add(nbytes)

    write = send

    def _announce(self, arrays: list[np.ndarray], names: list[str] | None, topic: str | None) -> None:
        described = schemas.describe(arrays, names)
        late_joiner = self.socket.type == zmq.XPUB and self._subscribed > self._announced_to
        if described != self._announced or late_joiner:
            self._send_frames([self._envelope(SCHEMA, topic, {"arrays": described})], "announcing the schema")
            self._announced, self._announced_to = described, self._subscribed

    def _envelope(self, kind: str, topic: str | None, fields: dict) -> bytes:
        self._seq += 1
        topic = (self.topic or "") if topic is None else topic
        self._topics.add(topic)
        return envelope.pack(kind, topic, p=self.producer_id, s=self._seq, **fields)

    def _send_frames(self, frames: list, doing: str, seconds: float | None = None, track: bool = False) -> zmq.MessageTracker | None:
        socket = self.socket
        if socket.type == zmq.XPUB and self.subscribers and self._subscribed < self.subscribers:
            self.wait_for_subscribers()
        deadline = self._deadline() if seconds is None else time.monotonic() + seconds
        while True:
            try:
                return socket.send_multipart(frames, flags=zmq.NOBLOCK, copy=False, track=track)
            except zmq.Again:
                self._wait(zmq.POLLOUT, deadline, doing)

    def _make_room(self, nbytes: int) -> None:
        """Wait until ZeroMQ has let go of enough earlier batches for ``nbytes`` more to fit the budget."""
        while self._queued and self._queued[0][0].done:
            self._queued.popleft()
        deadline = self._deadline()
        while self._queued and sum(n for _, n in self._queued) + nbytes > self.max_queued_bytes:
            tracker, _ = self._queued[0]
            try:
                tracker.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
            except zmq.NotDone:
                raise PeerTimeoutError(
                    f"send on {self._where()} waited {self.timeout:g} s for the {len(self._queued)} queued batches "
                    f"({sum(n for _, n in self._queued)} bytes) to leave, with {self.peers} peer(s) connected: the consumer "
                    "is gone, stuck or not reading; raise the timeout if it is only slow",
                    url=self.endpoints[0].url,
                ) from None
            self._queued.popleft()

    def mark(self, kind: str, topic: str | None = None, *, seconds: float | None = None, **fields: Any) -> None:
        """Send a hydrax marker: :data:`~hydrax.serve.envelope.EPOCH_END` or ``END`` (hydrax protocol only),
        waiting up to ``seconds`` (default ``timeout``) for room."""
        self._require_socket()
        if self.protocol != "hydrax":
            raise ServeError("markers need protocol='hydrax' (tensorcom's consumers cannot read them)",
                             url=self.endpoints[0].url if self.endpoints else None)
        if kind == END and self.socket.type == zmq.PUSH and self.peers > 1:
            self._end_every_peer(self._envelope(kind, topic, fields), seconds)
            return
        topics = [topic]
        if kind == END and topic is None and self.socket.type == zmq.XPUB:
            # A subscriber gets its own topic's messages only: without an end marker on every
            # topic this producer used, a subscriber of "validation" would wait forever.
            topics = sorted(self._topics | {self.topic or ""})
        for name in topics:
            self._send_frames([self._envelope(kind, name, fields)], "sending a marker", seconds)

    def _end_every_peer(self, frame: bytes, seconds: float | None) -> None:
        """End markers to every consumer of a PUSH fan-out, until each has hung up.

        PUSH hands each message to the next consumer with room, so one marker per consumer may
        all land on the same ones. A hydrax consumer hangs up when its stream has ended; so keep
        offering markers (extra ones are ignored) until no consumer is left, or time is up.
        """
        wait = seconds if seconds is not None else (self.timeout or 60.0)
        deadline = time.monotonic() + wait
        while self.peers > 0:
            if time.monotonic() >= deadline:
                log.warning("[hydrax] %d consumer(s) of %s did not hang up within %g s after the end marker", self.peers, self._where(), wait)
                return
            try:
                self.socket.send(frame, zmq.NOBLOCK)
            except zmq.Again:
                pass
            time.sleep(END_RETRY_SECONDS)

    def finish(self, error: str | None = None, seconds: float | None = None) -> None:
        """Tell hydrax consumers that this producer is done (``error``: it failed, and why);
        ``seconds`` bounds the wait for room (default ``timeout``)."""
        if (self.protocol == "hydrax" and not self._finished and self.socket is not None and os.getpid() == self._pid
                and self.socket.type in (zmq.PUSH, zmq.XPUB)):  # a consumer leaving (``with`` on error) has no one to tell
            self._finished = True
            fields = {} if error is None else {"error": error}
            self.mark(END, seconds=seconds, **fields)

    def serve(self, source: Iterable[Any], report: int = -1) -> None:
        """Send every list of arrays from ``source`` (printing statistics every ``report`` samples)."""
        count, next_report = 0, 0
        for sample in source:
            self.send(sample)
            if report > 0 and count >= next_report:
                print("count", count, self.stats.summary())
                next_report += report
            count += self._batch_size(sample)

    # -- receiving -----------------------------------------------------------------------------
    def recv_message(self) -> Message | None:
        """The next data message or epoch-end marker; None once every producer has ended.

        Raises :class:`PeerTimeoutError` after ``timeout`` seconds with nothing, and
        :class:`MessageError` for a bad message when ``on_bad_message="raise"``.
        """
        if self._all_ended():
            return None
        socket = self._require_socket()
        while True:
            if self._all_ended():
                # Hang up: a producer fanning out (zrpush) offers end markers until its
                # consumers have gone, since it cannot address them one by one.
                self._close_socket(0)
                return None
            self._wait(zmq.POLLIN, self._deadline(), "receiving")
            try:
                message = self._receive(socket)
            except MessageError as exc:
                self.bad_messages += 1
                if self.on_bad_message == "raise":
                    raise
                log.warning("[hydrax] skipped a message: %s", exc)
                continue
            if message is None:
                continue
            if message.kind == END:
                self._ended[message.producer] = message.fields.get("error")
                if message.fields.get("error"):
                    raise ServeError(f"producer {message.producer} on {self._where()} failed: {message.fields['error']}",
                                     url=self.endpoints[0].url)
                continue
            return message

    def _all_ended(self) -> bool:
        return len(self._ended) >= self.producers and self._seen <= set(self._ended)

    def _receive(self, socket: zmq.Socket) -> Message | None:
        """One message off the socket (it is ready), decoded; None for one to ignore."""
        first = socket.recv(flags=zmq.NOBLOCK, copy=False)
        frames = [first]
        head = _frame_buffer(first)
        env = shared = None
        if envelope.is_envelope(head):
            try:
                env = envelope.unpack(head)
            except ValueError as exc:
                self._drain(socket)
                raise MessageError(f"message from {self._where()}: {exc}", url=self.endpoints[0].url) from None
            frames = []
            shared = env.fields.pop("m", None)  # the data is in the producer's ring: only headers follow
        self._receive_rest(socket, first, frames, len(head), shared)
        producer = seq = None
        if env is not None:
            producer, seq = env.fields.pop("p", None), env.fields.pop("s", None)
            producer = producer if isinstance(producer, str) else None
            if producer is not None:
                self._seen.add(producer)
            if env.kind in (END, EPOCH_END):
                return Message(env.kind, topic=env.topic, producer=producer, seq=seq, fields=env.fields)
            if env.kind == SCHEMA:
                self._check_schema(env.fields.get("arrays"), f"producer {producer} announces")
                if producer is not None:
                    self.schemas[producer] = env.fields.get("arrays")
                return None
            if env.kind != DATA:
                return None  # a kind from a newer hydrax: not ours to act on
            if not frames:  # a batch of nothing is not a batch: it must not reach a training step as []
                raise MessageError(f"message from {self._where()}: a data envelope with no tenbin frames after it",
                                   url=self.endpoints[0].url)
        if shared is not None:
            frames = self._shared_frames(shared, frames)
        arrays, infos = self._decode(frames)
        if self.output == "jax":
            import jax

            arrays = [jax.device_put(a, self.device) for a in arrays]
        message = Message(DATA, arrays, list(infos))
        if env is not None:
            message.topic, message.producer, message.seq, message.fields = env.topic, producer, seq, env.fields
        self.stats.add(sum(a.nbytes for a in arrays))
        return message

    def _receive_rest(self, socket: zmq.Socket, first: zmq.Frame, frames: list, size: int, shared: Any) -> None:
        """Append the frames of the message that follow ``first`` (``size`` bytes so far) to
        ``frames``; past ``max_message_bytes`` in all, drain the rest and raise MessageError."""
        more = first.more  # the frame knows: no getsockopt call per frame
        if size > self.max_message_bytes:  # one frame alone, over the limit: ZeroMQ's guard is higher
            self._drain(socket)
            raise MessageError(f"message from {self._where()} is over max_message_bytes ({self.max_message_bytes})",
                               url=self.endpoints[0].url)
        while more:
            header = None
            # by the message's own shape, not this Connection's sending mode: receiving takes both
            if self.aligned and shared is None and (len(frames) % 2) == 1:
                header = frames[-1]
            if header is not None:
                frame, nbytes = self._recv_aligned(socket, header)
                more = socket.getsockopt(zmq.RCVMORE)
            else:
                frame = socket.recv(copy=False)
                nbytes = len(frame.buffer)
                more = frame.more
            frames.append(frame)
            size += nbytes
            if size > self.max_message_bytes:
                self._drain(socket)
                raise MessageError(f"message from {self._where()} is over max_message_bytes ({self.max_message_bytes})",
                                   url=self.endpoints[0].url)

    def _decode(self, frames: list) -> tuple[list, list]:
        """The arrays of a data message and their names, checked against ``infos`` and the schema."""
        try:
            if len(frames) == 1 and bytes(_frame_buffer(frames[0])[:8]) == b"~TenBin~":
                arrays, infos = tenbin.decode_buffer(_frame_buffer(frames[0]), infos=True)
            else:
                arrays, infos = tenbin.decode_list(frames, infos=True)
            if self.infos is not None and list(infos) != list(self.infos):
                raise TenbinError(f"the arrays are named {infos}, not {list(self.infos)} as the Connection's infos require")
        except TenbinError as exc:
            raise MessageError(f"message from {self._where()}: {exc}", url=self.endpoints[0].url) from None
        if self.schema is not None:
            self._check_schema(schemas.describe(arrays, infos), "a batch holds")
        return arrays, infos

    def _shared_frames(self, shared: Any, headers: list) -> list:
        """``[header, data, ...]`` for a message whose data is in its producer's ring."""
        try:
            return self._mappings.frames(shared, headers, self._where())
        except (TenbinError, ValueError) as exc:
            raise MessageError(f"message from {self._where()}: {exc}", url=self.endpoints[0].url) from None
        except ServeError as exc:
            exc.url = self.endpoints[0].url
            raise

    def _check_schema(self, described: Any, what: str) -> None:
        if self.schema is None:
            return
        if not isinstance(described, list) or not all(isinstance(a, list) and len(a) == 3 for a in described):
            raise MessageError(f"a schema announcement on {self._where()} is malformed: {described!r}", url=self.endpoints[0].url)
        difference = schemas.mismatch(self.schema, described)
        if difference is not None:
            raise SchemaError(f"{what} other arrays than this consumer expects on {self._where()}: {difference}",
                              url=self.endpoints[0].url)

    def _recv_aligned(self, socket: zmq.Socket, header) -> tuple[np.ndarray | zmq.Frame, int]:
        """Receive a data frame into 64-byte-aligned memory sized from its header frame."""
        try:
            expected = tenbin.data_nbytes(_frame_buffer(header))
        except TenbinError:
            frame = socket.recv(copy=False)  # decoding reports it
            return frame, len(_frame_buffer(frame))
        if expected > self.max_message_bytes:
            frame = socket.recv(copy=False)
            return frame, len(_frame_buffer(frame))
        try:
            buffer = tenbin.aligned_empty(expected)
        except MemoryError:  # a header that claims more than can be had (the frame itself may be small)
            frame = socket.recv(copy=False)
            return frame, len(_frame_buffer(frame))
        nbytes = socket.recv_into(buffer)
        if nbytes != expected:
            return buffer[:0], nbytes  # too long or short: the decoder finds the mismatch
        return buffer, nbytes

    def _drain(self, socket: zmq.Socket) -> None:
        while socket.getsockopt(zmq.RCVMORE):
            socket.recv(copy=False)

    def recv(self) -> list:
        """The next list of arrays (after ``batch_transforms`` and ``converters``), as tensorcom's ``recv``.

        Past the end of a hydrax stream it raises :class:`~hydrax.errors.ServeError`; iterating
        stops there cleanly instead.
        """
        while True:
            message = self.recv_message()
            if message is None:
                raise ServeError(f"the stream on {self._where()} has ended: every producer sent its end marker",
                                 url=self.endpoints[0].url if self.endpoints else None)
            if message.kind == DATA:
                return self._convert(message.arrays)

    def _convert(self, arrays: list) -> list:
        data = _transform(arrays, self.batch_transforms)
        data = _transform(data, self.converters)
        self.batch_size = self._batch_size(data)
        return data

    def _batch_size(self, data) -> int:
        if not self.batch_count:
            return 1
        return len(data[0]) if data and getattr(data[0], "ndim", 0) else 1

    def messages(self) -> Iterator[Message]:
        """Data messages and epoch-end markers, until every producer has ended (or ``total``)."""
        while not (self.total > 0 and self.count >= self.total):
            message = self.recv_message()
            if message is None:
                return
            if message.kind == DATA:
                message.arrays = self._convert(message.arrays)
                self.count += self.batch_size or 0
            yield message

    def items(self, report: int = -1) -> Iterator[list]:
        """Received lists of arrays until the stream ends or ``total`` samples have come."""
        next_report = 0
        for message in self.messages():
            if message.kind != DATA:
                continue
            if report > 0 and self.count >= next_report:
                print("count", self.count, self.stats.summary())
                next_report += report
            yield message.arrays

    def __iter__(self) -> Iterator[list]:
        return self.items()

    def __len__(self) -> int:
        return self.epoch

    # -- the end -------------------------------------------------------------------------------
    def close(self, linger: float | None = None) -> None:
        """Send the end marker (hydrax protocol), deliver what is queued (up to ``linger`` s), close."""
        if self.socket is None:
            return
        if os.getpid() != self._pid:
            self.socket = None  # the parent's: never touch it here
            return
        try:
            if self.socket.type in (zmq.PUSH, zmq.XPUB):
                self.finish(seconds=self._marker_wait(linger))
        except (ServeError, zmq.ZMQError) as exc:
            log.warning("[hydrax] could not send the end marker on %s: %s", self._where(), exc)
        finally:
            self._close_ring(linger)
            self._close_socket(linger)

    def _marker_wait(self, linger: float | None) -> float | None:
        """How long closing waits for room for the end marker: a whole ``timeout`` with a consumer
        connected; with none on a bound socket, none at all (there is no queue until one comes,
        and ``linger`` already waits for it); with none yet on a connecting socket, up to
        ``linger``, because ZeroMQ queues what is sent while the connection is being made, and
        the queue (``hwm``) may be full until it is made."""
        if self.peers:
            return None
        if any(not endpoint.bind for endpoint in self.endpoints):
            return self._default_linger() if linger is None else linger
        return 0.0

    def _close_ring(self, linger: float | None) -> None:
        if self._ring is None:
            return
        # A consumer maps the ring when it reads a batch from it; a mapping outlives this process,
        # but a batch still queued when the process is gone could not be mapped any more.
        left = self._ring.wait_received(self._default_linger() if linger is None else linger, lambda: self.peers)
        if left:
            log.warning("[hydrax] %d batch(es) sent through shared memory on %s were not received before closing", left,
                        self._where())
        self._ring.close()
        self._ring = None

    def _close_socket(self, linger: float | None) -> None:
        if self.socket is None:
            return
        if linger is not None:
            self.socket.setsockopt(zmq.LINGER, int(linger * 1000))
        if self._peer_count is not None:
            self._peer_count.close()
        self.socket.close()
        if self._auth is not None:
            self._auth.stop()
        self.context.term()  # waits for queued messages, up to LINGER
        self.socket = self.context = None
        _live.discard(self)

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc is None or self.socket is None or os.getpid() != self._pid:
            self.close()
            return
        # Failing: tell consumers why, but do not wait a whole timeout again for a peer that is
        # not taking messages (often the very reason for the failure).
        try:
            self.finish(error=f"{type(exc).__name__}: {exc}", seconds=FAILING_SECONDS)
        except (ServeError, zmq.ZMQError):
            pass
        self.close(linger=FAILING_SECONDS)


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


def _check_options(protocol: str, output: str, on_bad_message: str, timeout: float | None, hwm: int,
                   shared_memory: int | bool | None, curve: Curve | None) -> None:
    """Refuse :class:`Connection` options out of range or that do not go together, before any is set."""
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol must be one of {PROTOCOLS}, got {protocol!r}")
    if output not in OUTPUTS:
        raise ValueError(f"output must be one of {OUTPUTS}, got {output!r}")
    if on_bad_message not in BAD_MESSAGE:
        raise ValueError(f"on_bad_message must be one of {BAD_MESSAGE}, got {on_bad_message!r}")
    if timeout is not None and not timeout > 0:
        raise ValueError(f"timeout must be positive seconds or None, got {timeout!r}")
    if not (isinstance(hwm, int) and hwm >= 1):
        raise ValueError(f"hwm must be a positive number of messages, got {hwm!r}")
    if shared_memory not in (None, False) and protocol != "hydrax":
        raise ValueError("shared_memory needs protocol='hydrax' (tensorcom's consumers cannot read such batches)")
    if curve is not None and not isinstance(curve, Curve):
        raise TypeError(f"curve must be a hydrax.serve.Curve, got {type(curve).__name__}")


def _listify(x: Any) -> list | None:
    if x is None:
        return None
    return list(x) if isinstance(x, (list, tuple)) else [x]


def _converters(value: Any) -> list | None:
    if value == "numpy":
        return None
    if isinstance(value, str):
        raise ValueError(f"converters {value!r} is not available in hydrax (only 'numpy', or callables); "
                         "tensorcom's 'torch' presets need torch: pass torch.as_tensor yourself")
    return _listify(value)


def _transform(sample: list, functions: list[Callable] | None) -> list:
    if not functions:
        return sample
    result = list(sample)
    for i in range(len(result)):
        f = functions[i % len(functions)]
        if f is not None:
            result[i] = f(result[i])
    return result
