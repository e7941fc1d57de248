"""Serving batches over ZeroMQ, compatible with NVlabs tensorcom (see the guide "Serving batches").

- :class:`Connection`: tensorcom's class: send and receive lists of arrays, tenbin framing,
  tensorcom's URLs (``zpush``/``zpull``/``zpub``/``zsub`` and the reversed ``zr*`` kinds), with
  bounded queues, timeouts, no loss at exit, and (``protocol="hydrax"``) topics and end markers.
- :func:`serve`: send a :class:`hydrax.Dataloader`'s batches straight from its slots.
- :class:`Collector`: reliable mode: a run served in shares by several producers, each batch
  exactly once and in order, across producer crashes and restarts.
- :class:`Curve`, :func:`curve_keypair`: encryption and authentication across machines.
"""

from ..errors import MessageError, PeerTimeoutError, SchemaError, ServeError
from .connection import Connection
from .receiver import Message
from .producer import ServeReport, serve
from .reliable import Collector
from .security import Curve, curve_keypair
from .stats import Statistics
from .urls import Endpoint, parse_url

__all__ = ["Collector", "Connection", "Curve", "Endpoint", "Message", "MessageError", "PeerTimeoutError", "SchemaError", "ServeError", "ServeReport", "Statistics",
           "curve_keypair", "parse_url", "serve"]
