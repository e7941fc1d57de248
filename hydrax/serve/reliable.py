"""Reliable, ordered serving: every batch of a run exactly once, across producer crashes.

``count`` producers each serve one share of a run's *stream* (its batches, training and
validation, in schedule order, numbered from 0 at ``start_at``): producer ``k`` serves positions
``k, k + count, ...`` (:meth:`hydrax.Dataloader.select_stream`). One :class:`Collector` takes
them over a ROUTER socket and yields them exactly once, in stream order (``ordered=True``, so a
run fed remotely is the local run, resumable at any ``(epoch, batch)``) or as they come.

The exchange, each message a hydrax envelope (:mod:`.envelope`) with tenbin frames after DATA:

1. the producer (a DEALER) says ``hello`` with its share (``share``, ``shares``) and the run's
   ``fingerprint``;
2. the collector answers ``welcome`` with ``first``, the first position of that share it has not
   received, and ``credit``, how many batches the producer may send ahead; or ``refuse`` with why;
3. the producer sends ``data`` (with ``pos``) while it has credit, a ``beat`` every second it has
   nothing to send, and ``end`` with ``next`` (the first position it will never serve);
4. the collector returns one ``credit`` for each batch it hands out;
5. the collector answers ``end`` with ``received`` once it holds every batch of the share, and
   only then does the producer close its socket. A process that exits with messages it has not
   read (credits sent late) resets its TCP connection, and the receiving side may then drop
   the batches it had not read from the connection yet: the last batches of the share, lost
   without a word, before this step existed.

A producer made with ``shared_memory`` says its host (:func:`~.sharedmem.host_identity`) in its
hello; when it is the collector's, the welcome says ``shm`` and the producer copies each batch into
a shared memory ring (:mod:`.sharedmem`) and sends only the envelope and tenbin headers. A
message whose ring the collector cannot map (its producer died before the collector mapped it,
or closed it) is not received: the collector drops it and refuses that producer, and the share
resumes from it like after any crash.

A producer that dies loses nothing: its batches in flight were never counted as received, and
the producer restarted in its place is welcomed at the first missing position. Batches from a
share's earlier producer, and any position other than the next one expected of the share, are
dropped, so nothing is delivered twice. A collector waiting on a share that has been silent
(no data, no beat) for ``timeout`` raises :class:`PeerTimeoutError`; a producer whose collector
is gone for ``timeout`` does too. The queue of each side is bounded by the credit.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator

import numpy as np
import zmq

from .. import tenbin
from ..errors import MessageError, PeerTimeoutError, SchemaError, ServeError
from . import envelope, schema as schemas
from .peers import PeerCount
from .receiver import Message
from .security import Curve
from .sharedmem import Mappings, Ring, check_size, host_identity, ring_bytes
from .urls import Endpoint, parse_urls

log = logging.getLogger(__name__)

HELLO, WELCOME, REFUSE, BEAT, CREDIT, RECEIVED = "hello", "welcome", "refuse", "beat", "credit", "received"
BEAT_SECONDS = 1.0
#: How long a closing collector keeps trying to deliver its last replies (a ``received``).
_CLOSE_LINGER_MS = 1000
POLL_MS = 100


def _open(context: zmq.Context, socket_type: int, endpoints: list[Endpoint], hwm: int, identity: bytes | None = None,
          curve: Curve | None = None, bound: list[str] | None = None) -> zmq.Socket:
    """A socket bound or connected to every endpoint; the addresses it bound at (the ports a
    ``*`` port became) are appended to ``bound``."""
    socket = context.socket(socket_type)
    if curve is not None:
        curve.apply(socket)
    socket.setsockopt(zmq.LINGER, 10_000)
    socket.setsockopt(zmq.SNDHWM, hwm)
    socket.setsockopt(zmq.RCVHWM, hwm)
    socket.setsockopt(zmq.HEARTBEAT_IVL, 1000)
    socket.setsockopt(zmq.HEARTBEAT_TIMEOUT, 10_000)
    if identity is not None:
        socket.setsockopt(zmq.ROUTING_ID, identity)
    for endpoint in endpoints:
        try:
            if endpoint.bind:
                socket.bind(endpoint.address)
                if bound is not None:
                    bound.append(socket.getsockopt_string(zmq.LAST_ENDPOINT))
            else:
                socket.connect(endpoint.address)
        except zmq.ZMQError as exc:
            socket.close(linger=0)
            raise ServeError(f"cannot {'bind' if endpoint.bind else 'connect'} {endpoint.url}: {exc}", url=endpoint.url) from exc
    return socket


@dataclass
class _Share:
    """What the collector knows of one share of the stream."""

    index: int
    identity: bytes | None = None
    next: int = 0  # the next position expected
    end: int | None = None  # the first position the share will never serve, once it ended
    heard: float = field(default_factory=time.monotonic)
    fingerprint: str | None = None
    ring: str | None = None  # the token of the producer's shared memory ring, once it used one
    shared_batches: int = 0


class Collector:
    """Receive a stream served by ``shares`` producers, each batch exactly once.

    :param url: where producers reach it: ``zpull://HOST:PORT`` (binds; a ``*`` port lets the
        system choose one, which :attr:`addresses` then says) or ``zrpull://`` (connects).
    :param shares: how many producers split the stream (their ``share`` indexes are ``0 .. shares-1``).
    :param ordered: yield batches in stream order (the local run's order); False: as they come.
    :param first: the stream position to start from (0: the producers' ``start_at``).
    :param credit: batches each producer may have in flight or waiting here.
    :param timeout: seconds a share may stay silent while the collector waits for it.
    :param schema: the arrays expected, as :class:`~hydrax.serve.Connection`'s ``schema``; a batch
        that differs raises :class:`~hydrax.errors.SchemaError` naming its share.
    :param curve: :class:`~hydrax.serve.Curve` encryption and authentication.
    :param watch: called about every 100 ms while the collector waits for batches; an exception
        it raises ends the wait. :mod:`hydrax.ray` uses it to notice a producer that cannot be
        restarted, instead of waiting ``timeout`` for it.

    Producers on this host that were made with ``shared_memory`` send their batches through shared
    memory (no option is needed here); the arrays of such batches are read-only views of the
    producer's ring, and :attr:`shared_batches` counts them.
    """

    def __init__(self, url: str | Iterable[str], shares: int, *, ordered: bool = True, first: int = 0, credit: int = 4,
                 timeout: float | None = 60.0, noexpand: bool = False, schema: Iterable[Any] | None = None,
                 curve: Curve | None = None, watch: Callable[[], None] | None = None) -> None:
        if not (isinstance(shares, int) and shares >= 1):
            raise ValueError(f"shares must be a positive int, got {shares!r}")
        if not (isinstance(credit, int) and credit >= 1):
            raise ValueError(f"credit must be a positive int, got {credit!r}")
        self.endpoints = parse_urls(url, noexpand)
        if self.endpoints[0].socket_type != zmq.PULL:
            raise ValueError(f"a Collector receives: use a zpull:// or zrpull:// URL, not {self.endpoints[0].url}")
        self.shares = [_Share(k, next=first + (k - first) % shares) for k in range(shares)]
        self.count = shares
        self.ordered = ordered
        self.credit = credit
        self.timeout = timeout
        self.position = first  # the next position to hand out, when ordered
        self.schema = schemas.parse_schema(schema)
        self.duplicates = 0  # batches dropped as already received or stale
        #: how many times a share's producer was replaced by another (a restart) and welcomed
        self.rejoined = 0
        self.watch = watch
        self.bad_messages = 0
        self._pending: dict[int, Message] = {}  # position -> message, received but not handed out
        self._arrivals: list[int] = []  # positions in arrival order (unordered mode)
        self._pid = os.getpid()
        self._host = host_identity()
        self._mappings = Mappings()
        self.context = zmq.Context()
        self._auth = curve.authenticator(self.context) if curve is not None else None
        self._bound: list[str] = []
        self.socket = _open(self.context, zmq.ROUTER, self.endpoints, hwm=max(16, 4 * credit * shares), curve=curve, bound=self._bound)
        self.socket.setsockopt(zmq.ROUTER_MANDATORY, 0)

    @property
    def addresses(self) -> list[str]:
        """The addresses the collector is bound at (``tcp://10.0.0.5:41235``), with the port the
        system chose for a ``*`` port; empty for ``zrpull://`` (it connects)."""
        return list(self._bound)

    @property
    def shared_batches(self) -> int:
        """Batches received through a producer's shared memory ring (producers on this host)."""
        return sum(s.shared_batches for s in self.shares)

    def _where(self) -> str:
        return ", ".join(e.url for e in self.endpoints)

    def _reply(self, identity: bytes, kind: str, **fields: Any) -> None:
        self.socket.send_multipart([identity, envelope.pack(kind, **fields)])

    def _handle(self, frames: list) -> None:
        identity, head = frames[0].bytes, frames[1].buffer if len(frames) > 1 else b""
        try:
            env = envelope.unpack(head)
        except ValueError as exc:
            self.bad_messages += 1
            log.warning("[hydrax] collector on %s skipped a message: %s", self._where(), exc)
            return
        share = self._share_of(identity, env)
        if env.kind == HELLO:
            self._welcome(identity, env)
            return
        if share is None:
            return  # a producer that was replaced, or never said hello: nothing it sends counts
        share.heard = time.monotonic()
        if env.kind == envelope.DATA:
            position = env.fields.get("pos")
            if position != share.next:
                self.duplicates += 1
                return
            decoded = self._decode(share, identity, position, env.fields.get("m"), frames[2:])
            if decoded is None:
                return
            arrays, infos = decoded
            if self.schema is not None:
                difference = schemas.mismatch(self.schema, schemas.describe(arrays, infos))
                if difference is not None:
                    raise SchemaError(f"share {share.index} on {self._where()} sends other arrays than expected: {difference}",
                                      url=self.endpoints[0].url)
            fields = {k: v for k, v in env.fields.items() if k not in ("p", "s", "m")}
            self._pending[position] = Message(envelope.DATA, arrays, list(infos), topic=env.topic, producer=env.fields.get("p"),
                                              seq=position, fields=fields)
            self._arrivals.append(position)
            share.next = position + self.count
        elif env.kind == envelope.END:
            if env.fields.get("error"):
                raise ServeError(f"the producer of share {share.index} on {self._where()} failed: {env.fields['error']}",
                                 url=self.endpoints[0].url)
            end = env.fields.get("next")
            if end == share.next:
                share.end = end
                self._forget_ring(share)
                self._reply(identity, RECEIVED)

    def _decode(self, share: _Share, identity: bytes, position: int, shared: Any, frames: list) -> tuple[list, list] | None:
        """A data message's arrays and names; None when its ring cannot be mapped (the batch is
        then not received, and its producer refused)."""
        try:
            if shared is not None:
                frames = self._mappings.frames(shared, frames, self._where())
            arrays, infos = tenbin.decode_list(frames, infos=True)
        except ServeError as exc:
            log.warning("[hydrax] collector on %s could not map the shared memory of share %d's batch %d; that producer is "
                        "refused and the share resumes from this batch: %s", self._where(), share.index, position, exc)
            self._reply(identity, REFUSE, error=f"the collector could not map this producer's shared memory ({exc}); "
                        "serve without shared_memory")
            return None
        except ValueError as exc:  # TenbinError, or a malformed shared memory field
            raise MessageError(f"batch {position} from share {share.index} on {self._where()}: {exc}", url=self.endpoints[0].url) from None
        if shared is not None:
            share.ring = shared["t"]
            share.shared_batches += 1
        return arrays, infos

    def _forget_ring(self, share: _Share) -> None:
        # Its producer is gone or done: arrays that still view the ring keep it mapped.
        if share.ring is not None:
            self._mappings.forget(share.ring)
            share.ring = None

    def _share_of(self, identity: bytes, env: envelope.Envelope) -> _Share | None:
        for share in self.shares:
            if share.identity == identity:
                return share
        return None

    def _welcome(self, identity: bytes, env: envelope.Envelope) -> None:
        k, n, fingerprint = env.fields.get("share"), env.fields.get("shares"), env.fields.get("fingerprint")
        if n != self.count or not isinstance(k, int) or not 0 <= k < self.count:
            self._reply(identity, REFUSE, error=f"this collector takes {self.count} shares, not share {k} of {n}")
            return
        known = {s.fingerprint for s in self.shares if s.fingerprint is not None}
        if known and fingerprint not in known:
            self._reply(identity, REFUSE, error=f"share {k} serves another run ({fingerprint}) than the others ({known.pop()})")
            return
        share = self.shares[k]
        if share.identity is not None and share.identity != identity:
            log.warning("[hydrax] share %d on %s has a new producer; it resumes at position %d", k, self._where(), share.next)
            self.rejoined += 1
            self._forget_ring(share)
        share.identity, share.fingerprint, share.heard = identity, fingerprint, time.monotonic()
        waiting = sum(1 for p in self._pending if p % self.count == k % self.count)
        same_host = bool(self._host) and env.fields.get("host") == self._host
        self._reply(identity, WELCOME, first=share.next, credit=max(1, self.credit - waiting), shm=same_host, window=self.credit)

    def _done(self) -> bool:
        if any(s.end is None for s in self.shares):
            return False
        end = min(s.end for s in self.shares)
        return not self._pending and (not self.ordered or self.position >= end)

    def _ready(self) -> Message | None:
        if self.ordered:
            return self._pending.pop(self.position, None)
        while self._arrivals:
            message = self._pending.pop(self._arrivals.pop(0), None)
            if message is not None:
                return message
        return None

    def _hand_out(self, message: Message) -> Message:
        position = message.seq
        if self.ordered:
            self.position = position + 1
        share = self.shares[position % self.count]
        if share.identity is not None:
            self._reply(share.identity, CREDIT, n=1)
        return message

    def _check_silence(self) -> None:
        if self.timeout is None:
            return
        now = time.monotonic()
        waiting_on = [self.shares[self.position % self.count]] if self.ordered else [s for s in self.shares if s.end is None]
        silent = [s for s in waiting_on if s.end is None and now - s.heard > self.timeout]
        if silent and len(silent) == len([s for s in waiting_on if s.end is None]):
            words = ", ".join(f"share {s.index} ({'never connected' if s.identity is None else f'silent {now - s.heard:.0f} s'})" for s in silent)
            raise PeerTimeoutError(f"collector on {self._where()} waited {self.timeout:g} s for {words}: restart that producer "
                                   "(it resumes where it stopped) or raise timeout", url=self.endpoints[0].url)

    def messages(self) -> Iterator[Message]:
        """Each batch of the stream once (as :class:`~hydrax.serve.Message`, ``seq`` = its position), until every share ended."""
        if os.getpid() != self._pid:
            raise ServeError("this Collector was made in another process; make it where it is used", url=self.endpoints[0].url)
        while True:
            message = self._ready()
            if message is not None:
                yield self._hand_out(message)
                continue
            if self._done():
                return
            if self.socket.poll(POLL_MS, zmq.POLLIN):
                while True:
                    try:
                        frames = self.socket.recv_multipart(zmq.NOBLOCK, copy=False)
                    except zmq.Again:
                        break
                    self._handle(frames)
            # also while other shares keep talking: the one awaited may be the silent one
            self._check_silence()
            if self.watch is not None:
                self.watch()

    def __iter__(self) -> Iterator[list]:
        return (m.arrays for m in self.messages())

    def close(self) -> None:
        """Close the socket (waiting up to a second for the last ``received`` to go out)."""
        if self.socket is not None and os.getpid() == self._pid:
            self.socket.close(linger=_CLOSE_LINGER_MS)
            if self._auth is not None:
                self._auth.stop()
            self.context.term()
        self.socket = None

    def __enter__(self) -> Collector:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class ShareSender:
    """The producer's end: a thread that owns a DEALER socket, says hello, and sends within credit.

    :meth:`start` returns the first position the collector wants from this share; :meth:`put`
    queues one batch (frames and fields); :meth:`end` sends the end marker after them and waits for
    it to go; :meth:`fail` sends a failure at once; :meth:`abandon` stops at once without a marker.
    With ``shared_memory`` (True, or a ring size in bytes) batches go through a shared memory ring
    when the collector is on this host (it says so in its welcome), else through the socket.
    """

    def __init__(self, url: str | Iterable[str], share: int, shares: int, fingerprint: str, *, timeout: float | None = 60.0,
                 noexpand: bool = False, curve: Curve | None = None, shared_memory: int | bool | None = None) -> None:
        self.endpoints = parse_urls(url, noexpand)
        if self.endpoints[0].socket_type != zmq.PUSH:
            raise ValueError(f"a reliable producer sends: use a zpush:// or zrpush:// URL, not {self.endpoints[0].url}")
        self.share, self.shares, self.fingerprint, self.timeout, self.curve = share, shares, fingerprint, timeout, curve
        self.identity = uuid.uuid4().hex.encode()
        self.shared_memory = None if shared_memory in (None, False) else check_size(shared_memory)
        #: batches sent through the shared memory ring
        self.shared_batches = 0
        self._ring: Ring | None = None
        self._use_ring = False  # the collector shares this host
        self._window = 1  # the collector's credit per share, which sizes the ring
        self._queue: queue.Queue = queue.Queue(maxsize=2)
        self._welcome = threading.Event()
        self._first: int | None = None
        self.error: BaseException | None = None
        # set by fail() or abandon(): acted on before anything queued, which may wait for credit
        self._abort: tuple | None = None
        self._thread = threading.Thread(target=self._run, name=f"hydrax-serve-share-{share}", daemon=True)

    def start(self) -> int:
        """Connect and wait for the collector's welcome; the first position to serve."""
        self._thread.start()
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        while not self._welcome.wait(0.1):
            self._raise_error()
            if deadline is not None and time.monotonic() > deadline:
                raise PeerTimeoutError(f"no collector answered on {self.endpoints[0].url} within {self.timeout:g} s", url=self.endpoints[0].url)
        self._raise_error()
        return self._first

    def _raise_error(self) -> None:
        if self.error is not None:
            raise self.error

    def put(self, position: int, arrays: list[np.ndarray], infos: list[str], fields: dict,
            cancelled: Callable[[], bool] | None = None) -> bool:
        """Queue one batch (its arrays are sent without a copy and held until sent); False, and
        nothing queued, once ``cancelled()`` says so while it waits for room (a Ctrl+C)."""
        frames = tenbin.encode_list(arrays, infos)
        return self._put(("data", position, frames, fields), cancelled)

    def _put(self, item, cancelled: Callable[[], bool] | None = None) -> bool:
        while True:
            self._raise_error()
            if not self._thread.is_alive():
                raise ServeError(f"the sender for share {self.share} has stopped", url=self.endpoints[0].url)
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                if cancelled is not None and cancelled():
                    return False

    def end(self, next_position: int) -> None:
        """Send the end marker after the queued batches (``next_position``: the first position this
        share will not serve) and wait until the collector confirms it holds them all."""
        self._put(("end", next_position, None))
        self._thread.join(None if self.timeout is None else self.timeout + 15)
        self._raise_error()

    def fail(self, next_position: int, error: str) -> None:
        """Tell the collector at once, ahead of the queued batches, that this share failed and why."""
        self._abort = ("end", next_position, error)
        self._thread.join(10)

    def abandon(self) -> None:
        """Stop at once without an end marker (as a crash would): the collector keeps the share
        open for a restarted producer, which resumes at the first batch it lacks."""
        self._abort = ("stop",)
        self._thread.join(10)

    def _run(self) -> None:
        context = zmq.Context()
        socket = peers = auth = None
        try:
            auth = self.curve.authenticator(context) if self.curve is not None else None
            socket = _open(context, zmq.DEALER, self.endpoints, hwm=16, identity=self.identity, curve=self.curve)
            peers = PeerCount(socket)
            self._loop(socket, peers)
        except BaseException as exc:  # noqa: BLE001 (handed to the producer's thread)
            self.error = exc
        finally:
            if self._ring is not None:  # the collector has mapped it, or the share resumes without it
                self._ring.close()
            if peers is not None:
                peers.close()
            if socket is not None:
                socket.close()
            if auth is not None:
                auth.stop()
            context.term()

    def _await_receipt(self, socket: zmq.Socket) -> None:
        """Read (and drop) credits until the collector says ``received``: closing before that can
        lose the last batches (see the module's notes)."""
        url = self.endpoints[0].url
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        while self._abort is None:
            if socket.poll(POLL_MS, zmq.POLLIN):
                env = envelope.unpack(socket.recv_multipart()[0])
                if env.kind == RECEIVED:
                    return
                if env.kind == REFUSE:
                    raise ServeError(f"the collector on {url} refused share {self.share}: {env.fields.get('error')}", url=url)
            elif deadline is not None and time.monotonic() > deadline:
                raise PeerTimeoutError(f"the collector on {url} did not confirm the end of share {self.share} within {self.timeout:g} s; "
                                       "it may not have received the share's last batches", url=url)

    def _place(self, frames: list, fields: dict) -> tuple[list, dict]:
        """A batch's frames and fields as sent: through the ring when the collector shares this
        host and the ring has room (only the headers travel), else as they are."""
        if not self._use_ring:
            return frames, fields
        if self._ring is None:
            nbytes = sum(memoryview(f).nbytes for f in frames[1::2]) + 64 * len(frames)
            try:
                # what the collector holds and queues, the batches its user holds, and room to spare
                self._ring = Ring(ring_bytes(self.shared_memory, nbytes, 2 * self._window + 3))
            except OSError as exc:
                log.warning("[hydrax] share %d sends through the socket: no shared memory ring (%s)", self.share, exc)
                self._use_ring = False
                return frames, fields
        placed = self._ring.place(frames[1::2])
        if placed is None:
            return frames, fields
        self.shared_batches += 1
        return frames[0::2], dict(fields, m=placed)

    def _send(self, socket: zmq.Socket, kind: str, frames: list | None = None, **fields: Any) -> None:
        socket.send_multipart([envelope.pack(kind, p=self.identity.decode(), **fields)] + (frames or []), copy=False)

    def _loop(self, socket: zmq.Socket, peers: PeerCount) -> None:
        hello = {"share": self.share, "shares": self.shares, "fingerprint": self.fingerprint}
        if self.shared_memory is not None:
            hello["host"] = host_identity()
        self._send(socket, HELLO, **hello)
        credit = 0
        heard = last_sent = time.monotonic()
        url = self.endpoints[0].url
        while True:
            if self._abort is not None:
                if self._abort[0] == "end":
                    self._send(socket, envelope.END, next=self._abort[1], error=self._abort[2])
                return
            if socket.poll(POLL_MS, zmq.POLLIN):
                env = envelope.unpack(socket.recv_multipart()[0])
                heard = time.monotonic()
                if env.kind == REFUSE:
                    raise ServeError(f"the collector on {url} refused share {self.share}: {env.fields.get('error')}", url=url)
                if env.kind == WELCOME:
                    credit = int(env.fields["credit"])
                    self._first = int(env.fields["first"])
                    self._use_ring = self.shared_memory is not None and env.fields.get("shm") is True
                    self._window = max(1, int(env.fields.get("window", credit)))
                    self._welcome.set()
                elif env.kind == CREDIT:
                    credit += int(env.fields.get("n", 1))
            now = time.monotonic()
            if not self._welcome.is_set():
                if self.timeout is not None and now - heard > self.timeout:
                    raise PeerTimeoutError(f"no collector answered share {self.share}'s hello on {url} within {self.timeout:g} s", url=url)
                if now - last_sent > 2.0:  # the collector may have bound after our hello was queued elsewhere
                    self._send(socket, HELLO, **hello)
                    last_sent = now
                continue
            while self._queue.queue:
                kind = self._queue.queue[0][0]
                if kind == "data" and credit == 0:
                    break
                item = self._queue.get_nowait()
                if kind == "end":
                    self._send(socket, envelope.END, next=item[1])
                    self._await_receipt(socket)
                    return
                _, position, frames, fields = item
                frames, fields = self._place(frames, fields)
                self._send(socket, envelope.DATA, frames, pos=position, **fields)
                credit -= 1
                last_sent = time.monotonic()
            now = time.monotonic()
            if now - last_sent >= BEAT_SECONDS:
                self._send(socket, BEAT)
                last_sent = now
            if self.timeout is not None and credit == 0 and now - heard > self.timeout:
                # Waiting for credit is normal (a slow consumer); only a collector gone for good is an error.
                peers.read()
                if peers.count == 0 and now - peers.changed > self.timeout:
                    raise PeerTimeoutError(f"the collector on {url} has been gone for {self.timeout:g} s", url=url)
