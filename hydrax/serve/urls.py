"""tensorcom's ZeroMQ URL notation: which socket a URL makes, whether it binds, and where.

``<kind>[+<transport>]://<address>[#<topic>]``. The kind picks the socket and its side:

======== ====== ======== ==============================================================
kind     socket binds    use
======== ====== ======== ==============================================================
zpush    PUSH   no       producers connect into one consumer that binds ``zpull``
zpull    PULL   yes
zpub     PUB    yes      one producer publishes to many consumers (``zsub``)
zsub     SUB    no
zrpush   PUSH   yes      reversed: the producer binds and consumers connect
zrpull   PULL   no       (``zrpull``), each batch going to one of them
zrpub    PUB    no       reversed: many publishers connect into one ``zrsub``
zrsub    SUB    yes
======== ====== ======== ==============================================================

The transport is ``tcp`` unless given (``zpull+ipc:///tmp/feed``, ``zpush+ipc://relative``).
Brace ranges expand to several endpoints of one socket (``zsub://host:788{0..3}``), as in
tensorcom 0.1.0 (whose later code kept only the last endpoint). A ``#topic`` fragment sets the
topic of a ``zsub`` or ``zpub`` URL (hydrax's protocol only).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable
from urllib.parse import urlsplit

import zmq
from braceexpand import braceexpand

#: kind -> (socket type, binds)
SCHEMES: dict[str, tuple[int, bool]] = {
    "zpush": (zmq.PUSH, False),
    "zpull": (zmq.PULL, True),
    "zpub": (zmq.PUB, True),
    "zsub": (zmq.SUB, False),
    "zrpush": (zmq.PUSH, True),
    "zrpull": (zmq.PULL, False),
    "zrpub": (zmq.PUB, False),
    "zrsub": (zmq.SUB, True),
}
SENDING = (zmq.PUSH, zmq.PUB)


@dataclass(frozen=True)
class Endpoint:
    """One parsed URL.

    :ivar url: the URL as given (after brace expansion).
    :ivar socket_type: ``zmq.PUSH``, ``zmq.PULL``, ``zmq.PUB`` or ``zmq.SUB``.
    :ivar bind: whether this side binds (else it connects).
    :ivar address: what ZeroMQ binds or connects to (``tcp://127.0.0.1:7880``, ``ipc:///tmp/x``).
    :ivar topic: the ``#fragment``, or None.
    """

    url: str
    socket_type: int
    bind: bool
    address: str
    topic: str | None

    @property
    def sends(self) -> bool:
        """Whether the socket sends (PUSH, PUB) rather than receives."""
        return self.socket_type in SENDING


def parse_url(url: str) -> Endpoint:
    """Parse one URL (no brace expansion); ``ValueError`` naming the URL when it is not one of ours."""
    if not isinstance(url, str):
        raise TypeError(f"a ZeroMQ URL is a string such as 'zpull://127.0.0.1:7880', got {type(url).__name__}")
    parts = urlsplit(url)
    scheme, _, transport = parts.scheme.partition("+")
    if scheme not in SCHEMES:
        raise ValueError(f"{url!r} is not a ZeroMQ URL: the scheme must be one of {', '.join(SCHEMES)} "
                         "(optionally with +ipc or another transport), as in 'zpull://127.0.0.1:7880'")
    transport = transport or "tcp"
    if transport == "ipc":
        address = f"ipc://{parts.netloc}{parts.path}"
    else:
        address = f"{transport}://{parts.netloc}"
        if not parts.netloc:
            raise ValueError(f"{url!r} has no address: write it as '{scheme}://HOST:PORT'")
    if address == f"{transport}://":
        raise ValueError(f"{url!r} has no address")
    socket_type, bind = SCHEMES[scheme]
    topic = parts.fragment if "#" in url else None
    return Endpoint(url, socket_type, bind, address, topic)


def expand_urls(urls: str | Iterable[str], noexpand: bool = False) -> list[str]:
    """One URL or several, with brace ranges expanded unless ``noexpand``."""
    if isinstance(urls, str):
        urls = [urls]
    out: list[str] = []
    for url in urls:
        if not isinstance(url, str):
            raise TypeError(f"a ZeroMQ URL is a string, got {type(url).__name__}")
        out.extend([url] if noexpand else braceexpand(url))
    return out


def parse_urls(urls: str | Iterable[str], noexpand: bool = False) -> list[Endpoint]:
    """Expand and parse; all endpoints of one Connection must make the same kind of socket."""
    endpoints = [parse_url(u) for u in expand_urls(urls, noexpand)]
    if not endpoints:
        raise ValueError("no URL given")
    kinds = {e.socket_type for e in endpoints}
    if len(kinds) > 1:
        raise ValueError(f"the URLs {', '.join(e.url for e in endpoints)} make different kinds of socket; "
                         "one Connection has one socket: use one kind (zpush, zsub, ...) for all of them")
    topics = {e.topic for e in endpoints}
    if len(topics) > 1:
        raise ValueError(f"the URLs {', '.join(e.url for e in endpoints)} name different topics; give one topic")
    return endpoints


def is_zmq_url(text: str) -> bool:
    """Whether ``text`` looks like one of these URLs (for commands that take shards or a URL)."""
    return isinstance(text, str) and text.split("+", 1)[0].split("://", 1)[0] in SCHEMES and "://" in text
