"""``Receiver``: the consuming side of a Connection: receiving messages, decoding and checking them.

Everything a consumer must do with what arrives, kept apart from sending: read one message's
frames without letting a hostile or broken peer make it hold more than ``max_message_bytes``
(data frames received into aligned memory when asked), tell a hydrax envelope from a bare tenbin
message, decode the tenbin frames or buffer, map the producer's shared memory ring for batches
sent through it, check names and the schema, and follow the producers' end markers until every
one has ended. :class:`Message` is what it hands back.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import zmq

from .. import tenbin
from ..errors import MessageError, SchemaError, ServeError, TenbinError
from . import envelope, schema as schemas
from .envelope import DATA, END, EPOCH_END, SCHEMA
from .link import Link
from .options import SocketOptions
from .sharedmem import Mappings

log = logging.getLogger(__name__)


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


class Receiver:
    """Receives and decodes messages on ``link``'s socket.

    :ivar schemas: what each hydrax producer announced it sends: producer id -> ``[[name, dtype, shape], ...]``.
    :ivar bad_messages: messages that could not be decoded and were skipped.
    """

    def __init__(self, options: SocketOptions, link: Link) -> None:
        self.options = options
        self.link = link
        self.mappings = Mappings()  # producers' rings this consumer maps
        self.schemas: dict[str, list] = {}
        self.bad_messages = 0
        self.seen: set[str] = set()
        self.ended: dict[str, str | None] = {}

    def recv_message(self, infos: list[str] | None, device: Any) -> Message | None:
        """The next data message or epoch-end marker, as :meth:`hydrax.serve.Connection.recv_message`
        says (``infos`` the names the arrays must have, ``device`` where JAX output goes)."""
        if self.all_ended():
            return None
        link = self.link
        socket = link.require_socket()
        while True:
            if self.all_ended():
                # Hang up: a producer fanning out (zrpush) offers end markers until its
                # consumers have gone, since it cannot address them one by one.
                link.close(0)
                return None
            link.wait(zmq.POLLIN, link.deadline(), "receiving")
            try:
                message = self.receive(socket, infos, device)
            except MessageError as exc:
                self.bad_messages += 1
                if self.options.on_bad_message == "raise":
                    raise
                log.warning("[hydrax] skipped a message: %s", exc)
                continue
            if message is None:
                continue
            if message.kind == END:
                self.ended[message.producer] = message.fields.get("error")
                if message.fields.get("error"):
                    raise ServeError(f"producer {message.producer} on {link.where()} failed: {message.fields['error']}",
                                     url=link.endpoints[0].url)
                continue
            return message

    def all_ended(self) -> bool:
        """Whether every producer expected, and every one heard from, has sent its end marker."""
        return len(self.ended) >= self.options.producers and self.seen <= set(self.ended)

    def receive(self, socket: zmq.Socket, infos: list[str] | None, device: Any) -> Message | None:
        """One message off the socket (it is ready), decoded; None for one to ignore."""
        link = self.link
        first = socket.recv(flags=zmq.NOBLOCK, copy=False)
        frames = [first]
        head = _frame_buffer(first)
        env = shared = None
        if envelope.is_envelope(head):
            try:
                env = envelope.unpack(head)
            except ValueError as exc:
                self.drain(socket)
                raise MessageError(f"message from {link.where()}: {exc}", url=link.endpoints[0].url) from None
            frames = []
            shared = env.fields.pop("m", None)  # the data is in the producer's ring: only headers follow
        self.receive_rest(socket, first, frames, len(head), shared)
        producer = seq = None
        if env is not None:
            producer, seq = env.fields.pop("p", None), env.fields.pop("s", None)
            producer = producer if isinstance(producer, str) else None
            if producer is not None:
                self.seen.add(producer)
            if env.kind in (END, EPOCH_END):
                return Message(env.kind, topic=env.topic, producer=producer, seq=seq, fields=env.fields)
            if env.kind == SCHEMA:
                self.check_schema(env.fields.get("arrays"), f"producer {producer} announces")
                if producer is not None:
                    self.schemas[producer] = env.fields.get("arrays")
                return None
            if env.kind != DATA:
                return None  # a kind from a newer hydrax: not ours to act on
            if not frames:  # a batch of nothing is not a batch: it must not reach a training step as []
                raise MessageError(f"message from {link.where()}: a data envelope with no tenbin frames after it",
                                   url=link.endpoints[0].url)
        if shared is not None:
            frames = self.shared_frames(shared, frames)
        arrays, names = self.decode(frames, infos)
        if self.options.output == "jax":
            import jax

            arrays = [jax.device_put(a, device) for a in arrays]
        message = Message(DATA, arrays, list(names))
        if env is not None:
            message.topic, message.producer, message.seq, message.fields = env.topic, producer, seq, env.fields
        return message

    def receive_rest(self, socket: zmq.Socket, first: zmq.Frame, frames: list, size: int, shared: Any) -> None:
        """Append the frames of the message that follow ``first`` (``size`` bytes so far) to
        ``frames``; past ``max_message_bytes`` in all, drain the rest and raise MessageError."""
        limit = self.options.max_message_bytes
        more = first.more  # the frame knows: no getsockopt call per frame
        if size > limit:  # one frame alone, over the limit: ZeroMQ's guard is higher
            self.drain(socket)
            raise MessageError(f"message from {self.link.where()} is over max_message_bytes ({limit})",
                               url=self.link.endpoints[0].url)
        while more:
            header = None
            # by the message's own shape, not this Connection's sending mode: receiving takes both
            if self.options.aligned and shared is None and (len(frames) % 2) == 1:
                header = frames[-1]
            if header is not None:
                frame, nbytes = self.recv_aligned(socket, header)
                more = socket.getsockopt(zmq.RCVMORE)
            else:
                frame = socket.recv(copy=False)
                nbytes = len(frame.buffer)
                more = frame.more
            frames.append(frame)
            size += nbytes
            if size > limit:
                self.drain(socket)
                raise MessageError(f"message from {self.link.where()} is over max_message_bytes ({limit})",
                                   url=self.link.endpoints[0].url)

    def decode(self, frames: list, infos: list[str] | None) -> tuple[list, list]:
        """The arrays of a data message and their names, checked against ``infos`` and the schema."""
        try:
            if len(frames) == 1 and bytes(_frame_buffer(frames[0])[:8]) == b"~TenBin~":
                arrays, names = tenbin.decode_buffer(_frame_buffer(frames[0]), infos=True)
            else:
                arrays, names = tenbin.decode_list(frames, infos=True)
            if infos is not None and list(names) != list(infos):
                raise TenbinError(f"the arrays are named {names}, not {list(infos)} as the Connection's infos require")
        except TenbinError as exc:
            raise MessageError(f"message from {self.link.where()}: {exc}", url=self.link.endpoints[0].url) from None
        if self.options.schema is not None:
            self.check_schema(schemas.describe(arrays, names), "a batch holds")
        return arrays, names

    def shared_frames(self, shared: Any, headers: list) -> list:
        """``[header, data, ...]`` for a message whose data is in its producer's ring."""
        try:
            return self.mappings.frames(shared, headers, self.link.where())
        except (TenbinError, ValueError) as exc:
            raise MessageError(f"message from {self.link.where()}: {exc}", url=self.link.endpoints[0].url) from None
        except ServeError as exc:
            exc.url = self.link.endpoints[0].url
            raise

    def check_schema(self, described: Any, what: str) -> None:
        """Raise SchemaError when ``described`` differs from the expected schema (if any)."""
        if self.options.schema is None:
            return
        if not isinstance(described, list) or not all(isinstance(a, list) and len(a) == 3 for a in described):
            raise MessageError(f"a schema announcement on {self.link.where()} is malformed: {described!r}", url=self.link.endpoints[0].url)
        difference = schemas.mismatch(self.options.schema, described)
        if difference is not None:
            raise SchemaError(f"{what} other arrays than this consumer expects on {self.link.where()}: {difference}",
                              url=self.link.endpoints[0].url)

    def recv_aligned(self, socket: zmq.Socket, header) -> tuple[np.ndarray | zmq.Frame, int]:
        """Receive a data frame into 64-byte-aligned memory sized from its header frame."""
        try:
            expected = tenbin.data_nbytes(_frame_buffer(header))
        except TenbinError:
            frame = socket.recv(copy=False)  # decoding reports it
            return frame, len(_frame_buffer(frame))
        if expected > self.options.max_message_bytes:
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

    def drain(self, socket: zmq.Socket) -> None:
        """Receive and drop the rest of a message."""
        while socket.getsockopt(zmq.RCVMORE):
            socket.recv(copy=False)
