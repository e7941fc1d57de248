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

The class itself keeps tensorcom's signature, attributes and conversions, and hands the rest to
its parts: :class:`~.options.SocketOptions` (hydrax's keyword settings, checked once),
:class:`~.link.Link` (the socket, its URLs, peers, waiting and closing), :class:`~.sender.Sender`
and :class:`~.receiver.Receiver`.
"""

from __future__ import annotations

import atexit
import logging
import os
import weakref
from typing import Any, Callable, Iterable, Iterator

import zmq

from ..errors import ServeError
from .envelope import DATA
from .link import Link
from .options import SocketOptions, check_options
from .receiver import Message, Receiver
from .security import Curve
from .sender import Sender
from .stats import Statistics

log = logging.getLogger(__name__)

#: How long a producer that is failing waits to tell its consumers, and to deliver what is queued.
FAILING_SECONDS = 2.0

_live: weakref.WeakSet = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    # Deliver what is still queued when a program ends without closing (tensorcom lost it).
    for connection in list(_live):
        try:
            connection.close()
        except Exception:  # noqa: BLE001 (exit must go on)
            log.debug("closing a Connection at exit failed", exc_info=True)


def _forward(part: str, name: str, doc: str | None = None, settable: bool = False) -> property:
    """An attribute of the Connection that is attribute ``name`` of its ``part`` (options, link,
    sender or receiver): read where it lives, so that the parts and the Connection never differ."""

    def get(self):
        return getattr(getattr(self, part), name)

    def put(self, value) -> None:
        setattr(getattr(self, part), name, value)

    return property(get, put if settable else None, doc=doc)


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
        one stays connected. One frame past :data:`~hydrax.serve.link.FRAME_GUARD_FACTOR` times this (at least
        :data:`~hydrax.serve.link.FRAME_GUARD_MIN_BYTES`) is cut off by ZeroMQ itself, with its connection, before it
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
        check_options(protocol, output, on_bad_message, timeout, hwm, shared_memory, curve)
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
        self._options = SocketOptions.checked(
            protocol=protocol, timeout=timeout, hwm=hwm, linger=linger, max_message_bytes=max_message_bytes,
            max_queued_bytes=max_queued_bytes, output=output, aligned=aligned, producers=producers, subscribers=subscribers,
            on_bad_message=on_bad_message, curve=curve, schema=schema, shared_memory=shared_memory)
        self._link = Link(self._options, topic)
        self._sender = Sender(self._options, self._link)
        self._receiver = Receiver(self._options, self._link)
        if url is not None:
            self.connect(url, noexpand=noexpand)

    # hydrax's keyword settings (documented above), fixed when the Connection is made
    protocol = _forward("_options", "protocol")
    timeout = _forward("_options", "timeout")
    hwm = _forward("_options", "hwm")
    linger = _forward("_options", "linger")
    max_message_bytes = _forward("_options", "max_message_bytes")
    max_queued_bytes = _forward("_options", "max_queued_bytes")
    output = _forward("_options", "output")
    aligned = _forward("_options", "aligned")
    producers = _forward("_options", "producers")
    subscribers = _forward("_options", "subscribers")
    on_bad_message = _forward("_options", "on_bad_message")
    curve = _forward("_options", "curve")
    schema = _forward("_options", "schema")
    shared_memory = _forward("_options", "shared_memory")
    # the socket, and what sending and receiving count
    topic = _forward("_link", "topic", settable=True)
    endpoints = _forward("_link", "endpoints")
    socket = _forward("_link", "socket")
    context = _forward("_link", "context")
    shared_batches = _forward("_sender", "shared_batches", "batches this producer sent through shared memory (the others went through the socket)",
                              settable=True)
    schemas = _forward("_receiver", "schemas", "what each hydrax producer announced it sends: producer id -> ``[[name, dtype, shape], ...]``")
    bad_messages = _forward("_receiver", "bad_messages", "messages that could not be decoded and were skipped", settable=True)
    producer_id = _forward("_sender", "producer_id", "this producer's id in hydrax envelopes (new in every process and Connection)")

    # -- set-up --------------------------------------------------------------------------------
    def connect(self, url: str | Iterable[str], topic: str | None = None, *, noexpand: bool = False) -> None:
        """Bind or connect to more endpoints (all of the socket's kind); ``topic`` as in tensorcom's ``connect``."""
        try:
            self._link.connect(url, topic, noexpand=noexpand)
        finally:
            if self._link.socket is not None:  # closed at exit if the program does not close it
                _live.add(self)

    @property
    def peers(self) -> int:
        """Peers connected right now (ZeroMQ handshakes completed, less disconnections)."""
        return self._link.peers

    # -- sending -------------------------------------------------------------------------------
    def wait_for_subscribers(self, count: int | None = None) -> None:
        """On a publisher, wait until ``count`` (default ``subscribers``) subscribers have joined."""
        self._sender.wait_for_subscribers(count)

    def send(self, data: Iterable[Any], allow64: bool = False, *, topic: str | None = None, infos: list[str] | None = None,
             **fields: Any) -> None:
        """Send one list of arrays (numpy, JAX, anything ``np.asarray`` takes), without copying them.

        ``allow64``: send float64/int64/uint64 (refused otherwise, as tensorcom does). With the
        hydrax protocol, ``topic`` overrides the Connection's (as ``infos`` does its names) and ``fields`` (JSON values such as
        ``epoch=1, batch=7, items=[...]``) travel in the envelope.
        """
        names = self.infos if infos is None else infos
        self.stats.add(self._sender.send(data, allow64 or self.allow64, names, self.multipart, topic, fields))

    write = send

    def mark(self, kind: str, topic: str | None = None, *, seconds: float | None = None, **fields: Any) -> None:
        """Send a hydrax marker: :data:`~hydrax.serve.envelope.EPOCH_END` or ``END`` (hydrax protocol only),
        waiting up to ``seconds`` (default ``timeout``) for room."""
        self._sender.mark(kind, topic, seconds, fields)

    def finish(self, error: str | None = None, seconds: float | None = None) -> None:
        """Tell hydrax consumers that this producer is done (``error``: it failed, and why);
        ``seconds`` bounds the wait for room (default ``timeout``)."""
        self._sender.finish(error, seconds)

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
        message = self._receiver.recv_message(self.infos, self.device)
        if message is not None and message.kind == DATA:
            self.stats.add(sum(a.nbytes for a in message.arrays))
        return message

    def recv(self) -> list:
        """The next list of arrays (after ``batch_transforms`` and ``converters``), as tensorcom's ``recv``.

        Past the end of a hydrax stream it raises :class:`~hydrax.errors.ServeError`; iterating
        stops there cleanly instead.
        """
        while True:
            message = self.recv_message()
            if message is None:
                raise ServeError(f"the stream on {self._link.where()} has ended: every producer sent its end marker",
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
        link = self._link
        if link.socket is None:
            return
        if os.getpid() != link.pid:
            link.socket = None  # the parent's: never touch it here
            return
        try:
            if link.socket.type in (zmq.PUSH, zmq.XPUB):
                self.finish(seconds=self._sender.marker_wait(linger))
        except (ServeError, zmq.ZMQError) as exc:
            log.warning("[hydrax] could not send the end marker on %s: %s", link.where(), exc)
        finally:
            self._sender.close_ring(linger)
            if link.socket is not None:
                link.close(linger)
                _live.discard(self)

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc is None or self._link.socket is None or os.getpid() != self._link.pid:
            self.close()
            return
        # Failing: tell consumers why, but do not wait a whole timeout again for a peer that is
        # not taking messages (often the very reason for the failure).
        try:
            self.finish(error=f"{type(exc).__name__}: {exc}", seconds=FAILING_SECONDS)
        except (ServeError, zmq.ZMQError):
            pass
        self.close(linger=FAILING_SECONDS)


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
