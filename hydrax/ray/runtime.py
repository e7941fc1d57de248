"""Importing Ray, an optional dependency (``pip install 'hydrax[ray]'``), and connecting to a cluster."""

from __future__ import annotations


def import_ray():
    """The ``ray`` module; ImportError naming the extra when Ray is not installed."""
    try:
        import ray
    except ImportError as exc:
        raise ImportError("hydrax.ray needs Ray: pip install 'hydrax[ray]'") from exc
    return ray


def connect(address: str | None = None, **init_options):
    """The ``ray`` module, connected: unless this process already is, to ``address`` (else
    ``RAY_ADDRESS``, a cluster this machine runs, or a new local instance), with ``ray.init``'s
    other ``init_options``."""
    ray = import_ray()
    if not ray.is_initialized():
        ray.init(address=address or None, **init_options)
    return ray
