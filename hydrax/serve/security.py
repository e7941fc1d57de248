"""CURVE encryption and authentication for serving across machines (ZeroMQ's CurveZMQ).

The side that serves (usually the one that binds) holds a key pair and, optionally, the public
keys of the clients it accepts; each client holds its own key pair and the server's public key.
Keys are the 40-character Z85 text that :func:`curve_keypair` and ``zmq.curve_keypair`` make.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import zmq


def curve_keypair() -> tuple[str, str]:
    """A new ``(public, secret)`` CURVE key pair, as Z85 text."""
    public, secret = zmq.curve_keypair()
    return public.decode("ascii"), secret.decode("ascii")


def _key(value: str | bytes, what: str) -> bytes:
    raw = value.encode("ascii") if isinstance(value, str) else bytes(value)
    if len(raw) != 40:
        raise ValueError(f"{what} must be a 40-character Z85 CURVE key (see hydrax.serve.curve_keypair), got {len(raw)} characters")
    return raw


@dataclass(frozen=True)
class Curve:
    """CURVE settings of one Connection.

    A server gives its own ``public_key`` and ``secret_key`` and leaves ``server_key`` out; with
    ``authorized`` (client public keys) only those clients may connect, else any client that
    knows the server's public key may. A client gives its key pair and the server's public key as
    ``server_key``. Either side may bind or connect.
    """

    public_key: str | bytes
    secret_key: str | bytes
    server_key: str | bytes | None = None
    authorized: Iterable[str | bytes] | None = None

    @property
    def is_server(self) -> bool:
        """Whether this side is the CURVE server (it has no ``server_key``)."""
        return self.server_key is None

    def apply(self, socket: zmq.Socket) -> None:
        """Set the socket's CURVE options (before it binds or connects)."""
        if not zmq.has("curve"):
            raise RuntimeError("this libzmq was built without CURVE support; install pyzmq's wheels")
        socket.curve_publickey = _key(self.public_key, "public_key")
        socket.curve_secretkey = _key(self.secret_key, "secret_key")
        if self.is_server:
            socket.curve_server = True
        else:
            socket.curve_serverkey = _key(self.server_key, "server_key")

    def authenticator(self, context: zmq.Context):
        """A started ZAP authenticator that admits the ``authorized`` keys, or None when any client may connect."""
        if not self.is_server or self.authorized is None:
            return None
        from zmq.auth.thread import ThreadAuthenticator

        allowed = {_key(k, "authorized key") for k in self.authorized}

        class _Keys:
            def callback(self, domain, key):
                # pyzmq hands the client's key already Z85-encoded (40 bytes), as ``allowed`` holds them
                return bytes(key) in allowed

        auth = ThreadAuthenticator(context)
        auth.start()
        auth.configure_curve_callback(domain="*", credentials_provider=_Keys())
        return auth
