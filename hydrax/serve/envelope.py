"""hydrax's envelope: the one frame that hydrax peers put before a message's tenbin frames.

tensorcom's messages are bare tenbin frames (``[hdr0, data0, hdr1, data1, ...]``) with nothing
to say which stream, epoch or batch they belong to, and no way to say that a stream ended. Between
hydrax peers (``protocol="hydrax"``) every message starts with one more frame::

    b"~hx~" + topic (UTF-8) + b"\\0" + JSON object

The topic comes first because ZeroMQ's SUB sockets filter on a prefix of the first frame: a
consumer of topic ``train`` subscribes to ``b"~hx~train\\0"``, and sees no other topic's messages.
A tenbin header frame can never start with ``~hx~`` (it starts with a dtype code such as
``f4``), so a consumer tells the two kinds of message apart by the first four bytes and takes
both. The JSON object holds ``"k"``, the kind (:data:`DATA`, :data:`EPOCH_END`, :data:`END`),
(or :data:`SCHEMA`) and the message's fields; no pickle ever travels, and an envelope over :data:`MAX_ENVELOPE`
bytes is refused.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

MAGIC = b"~hx~"
#: The largest envelope frame a consumer accepts (the item indices of a batch of 100,000 items fit).
MAX_ENVELOPE = 4 << 20
#: How deep the containers of an envelope's JSON may nest (hydrax's own nest four deep at most).
MAX_DEPTH = 32

DATA = "data"  #: a batch; the tenbin frames follow
EPOCH_END = "epoch_end"  #: the producer sent the last batch of an epoch (or validation run) of its topic
END = "end"  #: the producer sent its last message; ``"error"`` says why, when it ended by failing
SCHEMA = "schema"  #: ``"arrays"``: ``[[name, dtype, shape], ...]`` of the producer's next batches


@dataclass
class Envelope:
    """A decoded envelope: its kind, topic and fields (``epoch``, ``batch``, ``items``, ...)."""

    kind: str
    topic: str
    fields: dict[str, Any] = field(default_factory=dict)


def pack(kind: str, topic: str = "", **fields: Any) -> bytes:
    """The envelope frame for a message of ``kind`` on ``topic`` (fields must be JSON values)."""
    if "\0" in topic:
        raise ValueError(f"a topic cannot contain NUL, got {topic!r}")
    fields["k"] = kind
    return MAGIC + topic.encode() + b"\0" + json.dumps(fields, separators=(",", ":")).encode()


def is_envelope(frame: bytes | memoryview) -> bool:
    """Whether a first frame is hydrax's envelope rather than a tenbin header or buffer."""
    return bytes(frame[:4]) == MAGIC


def _depth(value: Any) -> int:
    """How deep containers nest in parsed JSON ``value`` (0 for a scalar), without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is not None:
            deepest = max(deepest, level)
            if level <= MAX_DEPTH:  # deeper is refused anyway: no need to walk it all
                stack.extend((child, level + 1) for child in children)
    return deepest


def unpack(frame: bytes | memoryview) -> Envelope:
    """Decode an envelope frame; ``ValueError`` saying what is wrong with it."""
    if len(frame) > MAX_ENVELOPE:
        raise ValueError(f"envelope frame of {len(frame)} bytes is over the {MAX_ENVELOPE}-byte limit")
    raw = bytes(frame)
    if not raw.startswith(MAGIC):
        raise ValueError("not a hydrax envelope")
    topic, nul, body = raw[len(MAGIC):].partition(b"\0")
    if not nul:
        raise ValueError("envelope has no NUL after its topic")
    try:
        fields = json.loads(body)
        topic_text = topic.decode()
    except (UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"envelope is not UTF-8 JSON: {exc}") from None
    except RecursionError:  # a few kilobytes of brackets reach Python's recursion limit
        raise ValueError(f"envelope JSON nests deeper than {MAX_DEPTH} levels") from None
    if not isinstance(fields, dict) or not isinstance(fields.get("k"), str):
        raise ValueError("envelope JSON is not an object with a string 'k'")
    if _depth(fields) > MAX_DEPTH:
        raise ValueError(f"envelope JSON nests deeper than {MAX_DEPTH} levels")
    kind = fields.pop("k")
    return Envelope(kind, topic_text, fields)


def subscription(topic: str | None) -> bytes:
    """What a SUB socket subscribes to: a hydrax topic, or everything (``None``)."""
    return b"" if topic is None else MAGIC + topic.encode() + b"\0"
