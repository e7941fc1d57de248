"""Importing Ray, an optional dependency (``pip install 'hydrax[ray]'``), with words that say how to get it."""

from __future__ import annotations


def import_ray():
    """The ``ray`` module; ImportError naming the extra when Ray is not installed."""
    try:
        import ray
    except ImportError as exc:
        raise ImportError("hydrax.ray needs Ray: pip install 'hydrax[ray]'") from exc
    return ray
