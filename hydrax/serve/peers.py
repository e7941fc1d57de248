"""How many peers a ZeroMQ socket has right now, from its monitor events.

ZeroMQ hides connections: a PUSH socket with no consumer just waits. The socket's monitor
reports each completed handshake and each disconnection, which is what a timeout needs to say
whether the other side is gone or only slow.
"""

from __future__ import annotations

import time

import zmq
from zmq.utils.monitor import recv_monitor_message

EVENTS = zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED


class PeerCount:
    """Connected peers of ``socket`` (handshakes less disconnections), updated by :meth:`read`.

    :ivar count: peers connected at the last :meth:`read`.
    :ivar changed: ``time.monotonic()`` of the last change (or of creation).
    :ivar monitor: the monitor socket, to poll together with the socket.
    """

    def __init__(self, socket: zmq.Socket) -> None:
        self.socket = socket
        self.monitor: zmq.Socket | None = socket.get_monitor_socket(EVENTS)
        self.count = 0
        self.changed = time.monotonic()

    def read(self) -> int:
        """Take the events that arrived; the peer count."""
        while self.monitor is not None:
            try:
                event = recv_monitor_message(self.monitor, flags=zmq.NOBLOCK)
            except zmq.ZMQError:  # Again: nothing more; others: the monitor is gone
                break
            if event["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self.count += 1
            elif event["event"] == zmq.EVENT_DISCONNECTED:
                self.count = max(0, self.count - 1)
            self.changed = time.monotonic()
        return self.count

    def close(self) -> None:
        """Stop monitoring (before the socket closes)."""
        if self.monitor is not None:
            try:
                self.socket.disable_monitor()
            except zmq.ZMQError:
                pass
            self.monitor.close(linger=0)
            self.monitor = None
