"""``SocketOptions``: the settings of a :class:`~hydrax.serve.Connection` that are hydrax's own.

tensorcom's Connection takes a dozen positional parameters; hydrax adds as many keyword ones
(protocol, timeouts, queue bounds, size limits, security, schema, shared memory). They are fixed
when the Connection is made, and its socket, sender and receiver all read them, so they live
here as one frozen value, checked once, rather than as attributes each part could change under
the others. tensorcom's own parameters stay attributes of the Connection, as tensorcom has them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from . import schema as schemas
from .schema import ArraySchema
from .security import Curve
from .sharedmem import check_size

PROTOCOLS = ("tensorcom", "hydrax")
OUTPUTS = ("numpy", "jax")
BAD_MESSAGE = ("skip", "raise")


@dataclass(frozen=True)
class SocketOptions:
    """hydrax's keyword settings of one Connection, as :class:`~hydrax.serve.Connection` documents
    them: ``schema`` parsed, ``shared_memory`` None when off, ``aligned`` decided."""

    protocol: str = "tensorcom"
    timeout: float | None = 60.0
    hwm: int = 4
    linger: float | None = None
    max_message_bytes: int = 1 << 34
    max_queued_bytes: int | None = None
    output: str = "numpy"
    aligned: bool = False
    producers: int = 1
    subscribers: int = 0
    on_bad_message: str = "skip"
    curve: Curve | None = None
    schema: list[ArraySchema] | None = None
    shared_memory: int | bool | None = None

    @classmethod
    def checked(cls, *, protocol: str, timeout: float | None, hwm: int, linger: float | None, max_message_bytes: int,
                max_queued_bytes: int | None, output: str, aligned: bool | None, producers: int, subscribers: int,
                on_bad_message: str, curve: Curve | None, schema: Iterable[Any] | None,
                shared_memory: int | bool | None) -> SocketOptions:
        """The options as a Connection's keyword parameters give them, once :func:`check_options`
        has passed them: converted, and the rest checked (in this order, so the first error is
        the one a Connection always reported)."""
        max_message_bytes = int(max_message_bytes)
        if max_queued_bytes is not None and not (isinstance(max_queued_bytes, int) and max_queued_bytes > 0):
            raise ValueError(f"max_queued_bytes must be a positive number of bytes or None, got {max_queued_bytes!r}")
        return cls(protocol=protocol, timeout=timeout, hwm=hwm, linger=linger, max_message_bytes=max_message_bytes,
                   max_queued_bytes=max_queued_bytes, output=output, aligned=output == "jax" if aligned is None else bool(aligned),
                   producers=producers, subscribers=subscribers, on_bad_message=on_bad_message, curve=curve,
                   schema=schemas.parse_schema(schema),
                   shared_memory=None if shared_memory in (None, False) else check_size(shared_memory))

    def default_linger(self) -> float:
        """Seconds closing waits for what is queued: ``linger``, else ``timeout``, else 60."""
        return self.linger if self.linger is not None else (self.timeout or 60.0)


def check_options(protocol: str, output: str, on_bad_message: str, timeout: float | None, hwm: int,
                  shared_memory: int | bool | None, curve: Curve | None) -> None:
    """Refuse :class:`~hydrax.serve.Connection` options out of range or that do not go together, before any is set."""
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
