"""``Sender``: the producing side of a Connection: encoding batches, sending them, ending streams.

What a producer owes its consumers, kept apart from receiving: tenbin frames for each batch (one
buffer or multipart), with the hydrax protocol an envelope first (its producer id, sequence
number and topic), the schema announced before the first batch and again to late subscribers,
the shared memory ring's writing side (batch data placed in it, only headers sent), a bound on
the bytes ZeroMQ still holds (``max_queued_bytes``), and the end markers, which a PUSH fan-out
must keep offering until every consumer has hung up.
"""

from __future__ import annotations

import collections
import logging
import os
import time
import uuid
from typing import Any, Iterable

import numpy as np
import zmq

from .. import tenbin
from ..errors import PeerTimeoutError, ServeError
from . import envelope, schema as schemas
from .envelope import DATA, END, SCHEMA
from .link import POLL_MS, Link
from .options import SocketOptions
from .sharedmem import Ring, ring_bytes

log = logging.getLogger(__name__)

#: Dtypes that ``send`` refuses unless ``allow64`` (tensorcom's rule: senders should downcast).
WIDE = ("float64", "int64", "uint64")
#: How often a PUSH fan-out offers another end marker while consumers remain.
END_RETRY_SECONDS = 0.02


class Sender:
    """Sends batches and markers on ``link``'s socket.

    :ivar producer_id: this producer's id in hydrax envelopes (new in every process and Connection).
    :ivar shared_batches: batches sent through shared memory (the others went through the socket).
    """

    def __init__(self, options: SocketOptions, link: Link) -> None:
        self.options = options
        self.link = link
        self.ring: Ring | None = None  # made at the first send
        self.queued: collections.deque[tuple[zmq.MessageTracker, int]] = collections.deque()
        self.shared_batches = 0
        self.announced: list | None = None  # the schema this producer last announced
        self.announced_to = 0  # subscribers at that time (a new one must hear it too)
        self.producer_id = uuid.uuid4().hex[:16]
        self.seq = 0
        self.topics: set[str] = set()  # topics this producer sent on (each gets an end marker)
        self.finished = False

    def wait_for_subscribers(self, count: int | None = None) -> None:
        """On a publisher, wait until ``count`` (default ``subscribers``) subscribers have joined."""
        link = self.link
        socket = link.require_socket()
        if socket.type != zmq.XPUB:
            raise ServeError(f"{link.where()} is not a publisher (zpub, zrpub)", url=link.endpoints[0].url)
        count = self.options.subscribers if count is None else count
        deadline = link.deadline()
        while True:
            link.read_subscriptions()
            if link.subscribed >= count:
                return
            if deadline is not None and time.monotonic() >= deadline:
                raise PeerTimeoutError(f"{link.where()}: {link.subscribed} of {count} subscribers joined within {self.options.timeout:g} s",
                                       url=link.endpoints[0].url)
            if socket.poll(POLL_MS, zmq.POLLIN):
                link.read_subscriptions()

    def send(self, data: Iterable[Any], allow64: bool, names: list[str] | None, multipart: bool, topic: str | None,
             fields: dict[str, Any]) -> int:
        """Send one list of arrays, as :meth:`hydrax.serve.Connection.send` says (``allow64`` and
        ``multipart`` as the Connection has them, ``names`` the infos it sends); the arrays' bytes."""
        self.link.require_socket()
        arrays = [a if isinstance(a, np.ndarray) else np.asarray(a) for a in data]
        if not allow64:
            for i, a in enumerate(arrays):
                if a.dtype.name in WIDE:
                    raise TypeError(f"array {i} is {a.dtype.name}: send(..., allow64=True) sends 64-bit arrays "
                                    "(tensorcom refuses them by default; downcast to save bandwidth)")
        shared_memory = self.options.shared_memory
        if multipart or shared_memory is not None:
            frames = tenbin.encode_list(arrays, names)
        else:
            frames = [tenbin.encode_buffer(arrays, names)]
        nbytes = sum(a.nbytes for a in arrays)
        queued = nbytes
        if self.options.protocol == "hydrax":
            self.announce(arrays, names, topic)
            if shared_memory is not None:
                if self.ring is None:
                    # both ends' queues, the batch the consumer holds, and room to spare
                    self.ring = Ring(ring_bytes(shared_memory, nbytes + 64 * len(arrays), 2 * self.options.hwm + 3))
                placed = self.ring.place(frames[1::2])
                if placed is not None:  # only the headers travel
                    frames, fields, queued = frames[0::2], dict(fields, m=placed), 0
                    self.shared_batches += 1
            frames.insert(0, self.envelope(DATA, topic, fields))
        if self.options.max_queued_bytes is None:
            self.send_frames(frames, "send")
        else:
            self.make_room(queued)
            self.queued.append((self.send_frames(frames, "send", track=True), queued))
        return nbytes

    def announce(self, arrays: list[np.ndarray], names: list[str] | None, topic: str | None) -> None:
        """Announce the batch's schema when it is new, or a subscriber joined since it was announced."""
        described = schemas.describe(arrays, names)
        late_joiner = self.link.socket.type == zmq.XPUB and self.link.subscribed > self.announced_to
        if described != self.announced or late_joiner:
            self.send_frames([self.envelope(SCHEMA, topic, {"arrays": described})], "announcing the schema")
            self.announced, self.announced_to = described, self.link.subscribed

    def envelope(self, kind: str, topic: str | None, fields: dict) -> bytes:
        """The next envelope frame of this producer (``topic`` None: the Connection's)."""
        self.seq += 1
        topic = (self.link.topic or "") if topic is None else topic
        self.topics.add(topic)
        return envelope.pack(kind, topic, p=self.producer_id, s=self.seq, **fields)

    def send_frames(self, frames: list, doing: str, seconds: float | None = None, track: bool = False) -> zmq.MessageTracker | None:
        """Send one message, waiting for room up to ``seconds`` (default ``timeout``)."""
        link = self.link
        socket = link.socket
        if socket.type == zmq.XPUB and self.options.subscribers and link.subscribed < self.options.subscribers:
            self.wait_for_subscribers()
        deadline = link.deadline() if seconds is None else time.monotonic() + seconds
        while True:
            try:
                return socket.send_multipart(frames, flags=zmq.NOBLOCK, copy=False, track=track)
            except zmq.Again:
                link.wait(zmq.POLLOUT, deadline, doing)

    def make_room(self, nbytes: int) -> None:
        """Wait until ZeroMQ has let go of enough earlier batches for ``nbytes`` more to fit the budget."""
        while self.queued and self.queued[0][0].done:
            self.queued.popleft()
        deadline = self.link.deadline()
        while self.queued and sum(n for _, n in self.queued) + nbytes > self.options.max_queued_bytes:
            tracker, _ = self.queued[0]
            try:
                tracker.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
            except zmq.NotDone:
                raise PeerTimeoutError(
                    f"send on {self.link.where()} waited {self.options.timeout:g} s for the {len(self.queued)} queued batches "
                    f"({sum(n for _, n in self.queued)} bytes) to leave, with {self.link.peers} peer(s) connected: the consumer "
                    "is gone, stuck or not reading; raise the timeout if it is only slow",
                    url=self.link.endpoints[0].url,
                ) from None
            self.queued.popleft()

    def mark(self, kind: str, topic: str | None, seconds: float | None, fields: dict[str, Any]) -> None:
        """Send a hydrax marker, as :meth:`hydrax.serve.Connection.mark` says."""
        link = self.link
        link.require_socket()
        if self.options.protocol != "hydrax":
            raise ServeError("markers need protocol='hydrax' (tensorcom's consumers cannot read them)",
                             url=link.endpoints[0].url if link.endpoints else None)
        if kind == END and link.socket.type == zmq.PUSH and link.peers > 1:
            self.end_every_peer(self.envelope(kind, topic, fields), seconds)
            return
        topics = [topic]
        if kind == END and topic is None and link.socket.type == zmq.XPUB:
            # A subscriber gets its own topic's messages only: without an end marker on every
            # topic this producer used, a subscriber of "validation" would wait forever.
            topics = sorted(self.topics | {link.topic or ""})
        for name in topics:
            self.send_frames([self.envelope(kind, name, fields)], "sending a marker", seconds)

    def end_every_peer(self, frame: bytes, seconds: float | None) -> None:
        """End markers to every consumer of a PUSH fan-out, until each has hung up.

        PUSH hands each message to the next consumer with room, so one marker per consumer may
        all land on the same ones. A hydrax consumer hangs up when its stream has ended; so keep
        offering markers (extra ones are ignored) until no consumer is left, or time is up.
        """
        link = self.link
        wait = seconds if seconds is not None else (self.options.timeout or 60.0)
        deadline = time.monotonic() + wait
        while link.peers > 0:
            if time.monotonic() >= deadline:
                log.warning("[hydrax] %d consumer(s) of %s did not hang up within %g s after the end marker", link.peers, link.where(), wait)
                return
            try:
                link.socket.send(frame, zmq.NOBLOCK)
            except zmq.Again:
                pass
            time.sleep(END_RETRY_SECONDS)

    def finish(self, error: str | None = None, seconds: float | None = None) -> None:
        """Tell hydrax consumers that this producer is done, as :meth:`hydrax.serve.Connection.finish` says."""
        link = self.link
        if (self.options.protocol == "hydrax" and not self.finished and link.socket is not None and os.getpid() == link.pid
                and link.socket.type in (zmq.PUSH, zmq.XPUB)):  # a consumer leaving (``with`` on error) has no one to tell
            self.finished = True
            fields = {} if error is None else {"error": error}
            self.mark(END, None, seconds, fields)

    def marker_wait(self, linger: float | None) -> float | None:
        """How long closing waits for room for the end marker: a whole ``timeout`` with a consumer
        connected; with none on a bound socket, none at all (there is no queue until one comes,
        and ``linger`` already waits for it); with none yet on a connecting socket, up to
        ``linger``, because ZeroMQ queues what is sent while the connection is being made, and
        the queue (``hwm``) may be full until it is made."""
        if self.link.peers:
            return None
        if any(not endpoint.bind for endpoint in self.link.endpoints):
            return self.options.default_linger() if linger is None else linger
        return 0.0

    def close_ring(self, linger: float | None) -> None:
        """Wait (up to ``linger``) for consumers to receive the batches in the ring, and close it."""
        if self.ring is None:
            return
        # A consumer maps the ring when it reads a batch from it; a mapping outlives this process,
        # but a batch still queued when the process is gone could not be mapped any more.
        left = self.ring.wait_received(self.options.default_linger() if linger is None else linger, lambda: self.link.peers)
        if left:
            log.warning("[hydrax] %d batch(es) sent through shared memory on %s were not received before closing", left,
                        self.link.where())
        self.ring.close()
        self.ring = None
