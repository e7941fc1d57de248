"""Placement: turning a finished slot's numpy views into ``jax.Array`` s.

The default placement hands the slot to JAX without a copy where that is safe. On the CPU backend
``jax.device_put`` of 64-byte aligned memory aliases it, so the slot stays pinned for as long as
the user keeps the batch; the pipeline therefore allows that only while at least one other slot
stays free for loading, and copies otherwise, so a loop that holds on to batches slows down
instead of stalling (hydrax 0.2.2 stalls there). Other backends copy to the device, and the slot
is recycled as soon as the transfer no longer needs it.
"""

from __future__ import annotations

import gc
import sys
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import numpy as np

from .group import ALIGNMENT
from .types import PlacementFunc


@dataclass
class TransferStats:
    """How batches reached JAX in a run, by path: counts of batches and of bytes.

    ``aliased``: the slot itself became the ``jax.Array`` (CPU backend, no copy at all).
    ``copied``: one copy into memory XLA owns (host memory on CPU, device memory otherwise).
    ``custom``: placed by the user's ``placement_func``.
    """

    aliased_batches: int = 0
    copied_batches: int = 0
    custom_batches: int = 0
    aliased_bytes: int = 0
    copied_bytes: int = 0
    custom_bytes: int = 0

    def count(self, path: str, nbytes: int) -> None:
        setattr(self, f"{path}_batches", getattr(self, f"{path}_batches") + 1)
        setattr(self, f"{path}_bytes", getattr(self, f"{path}_bytes") + nbytes)

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


def _find_collector():
    """XLA's own collector of host buffers released by dead arrays (its name moves between jaxlib versions)."""
    for module, attribute in (("jax._src.lib", "_jax"), ("jax._src.lib", "_xla"), ("jaxlib.xla_extension", None)):
        found = sys.modules.get(module)
        if found is not None and attribute is not None:
            found = getattr(found, attribute, None)
        collect = getattr(found, "collect_garbage", None)
        if collect is not None:
            return collect
    return None


_collector = None


def collect_released_buffers(thorough: bool = False) -> None:
    """Let JAX drop the host arrays of ``jax.Array`` s that are already gone.

    XLA releases the numpy array behind a dead ``jax.Array`` lazily, at its next garbage
    collection point; until then the slot under it counts as in use. hydrax 0.2.2 waited for that
    without ever causing it, which is how its runs stalled. The call costs a few microseconds.
    Where a jaxlib has no such entry point, ``thorough`` falls back to a full ``gc.collect()``
    (which also runs XLA's collector from its gc callback); it is only worth that while waiting.
    """
    global _collector
    if _collector is None:
        if "jax._src.lib" not in sys.modules:
            return
        _collector = _find_collector() or False
    if _collector:
        _collector()
    elif thorough:
        gc.collect()


def aligned_copy(view: np.ndarray, dtype: Any) -> np.ndarray:
    """A private copy of ``view`` in ``dtype`` whose data starts on a 64-byte boundary.

    Handing this to ``jax.device_put`` costs one copy in all: XLA:CPU adopts aligned memory, and
    the slot itself is not referenced afterwards.
    """
    dtype = np.dtype(dtype)
    nbytes = view.size * dtype.itemsize
    raw = np.empty(nbytes + ALIGNMENT, np.uint8)
    start = -raw.ctypes.data % ALIGNMENT
    out = raw[start : start + nbytes].view(dtype).reshape(view.shape)
    np.copyto(out, view, casting="unsafe")
    return out


def default_placement(views: dict[str, np.ndarray], layouts, cpu: bool, may_alias: bool) -> tuple[dict[str, Any], bool]:
    """``jax.Array`` s for ``views`` on the default device, and whether any aliases the slot.

    On the CPU backend, with ``may_alias`` and matching dtypes, the slot memory itself becomes the
    array; otherwise the data is copied once (into aligned host memory that XLA then adopts, or
    straight to the device), and the slot is free once XLA no longer reads it.
    """
    import jax

    out = {}
    aliased = False
    for name, view in views.items():
        jax_dtype = layouts[name][2]
        if view.dtype == jax_dtype and (may_alias or not cpu):
            out[name] = jax.device_put(view)
            aliased |= cpu
        elif cpu:
            out[name] = jax.device_put(aligned_copy(view, jax_dtype))
        else:
            out[name] = jax.device_put(view.astype(jax_dtype))
    return out, aliased


def check_placed(result: Any, layouts) -> None:
    """Validate what a custom ``placement_func`` returned (run under ``__debug__`` only)."""
    import jax

    if not isinstance(result, dict):
        raise TypeError(f"placement_func must return a dict of jax.Array, got {type(result).__name__}")
    for name in layouts:
        if name not in result:
            raise ValueError(f"array '{name}' was not provided")
    for name, value in result.items():
        if name not in layouts:
            raise ValueError(f"placement_func result has unexpected name '{name}'")
        if not isinstance(value, jax.Array):
            raise TypeError(f"array '{name}' from placement_func is {type(value).__name__}, not a jax.Array")
        shape, _dtype, jax_dtype, _offset, _count = layouts[name]
        if tuple(value.shape) != tuple(shape):
            raise ValueError(f"array '{name}' from placement_func has shape {tuple(value.shape)}, expected {tuple(shape)}")
        if value.dtype != jax_dtype:
            raise ValueError(f"array '{name}' from placement_func has dtype {value.dtype}, expected {jax_dtype}")


def custom_placement(placement_func: PlacementFunc, views: dict[str, np.ndarray], layouts, additional, group) -> dict[str, Any]:
    """Run the user's ``placement_func`` and check what it returns."""
    result = placement_func(MappingProxyType(views), layouts, MappingProxyType(additional), group)
    if __debug__:
        check_placed(result, layouts)
    return result
