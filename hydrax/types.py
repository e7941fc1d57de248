"""Type aliases of the public API (as in hydrax 0.2.2)."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, Callable

from .layout import ArrayLayout, ArraySpec  # noqa: F401  (re-exported)

#: ``startup_func()``, run once in each worker.
StartupFunc = Callable[[], None]
#: ``loader_func(item, arrays, seed) -> dict | None``, run in a worker once per item.
LoaderFunc = Callable[[Any, MappingProxyType, "int | None"], "dict[str, Any] | None"]
#: ``placement_func(arrays, layouts, additional, group) -> dict[str, jax.Array]``.
PlacementFunc = Callable[[MappingProxyType, MappingProxyType, MappingProxyType, Any], dict]
