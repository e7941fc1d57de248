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

from ..layout import ALIGNMENT
from ..types import PlacementFunc


@dataclass
class TransferStats:
    """How batches reached JAX in a run, by path: counts of batches and of bytes.

    ``aliased``: the slot itself became the ``jax.Array`` (CPU backend, no copy at all).
    ``copied``: one copy into memory XLA owns (host memory on CPU, device memory otherwise).
    ``custom``: placed by the user's ``placement_func``.
    ``pinned``: the slots were page-locked with the CUDA driver, so copies to a GPU read them in place.
    """

    aliased_batches: int = 0
    copied_batches: int = 0
    custom_batches: int = 0
    aliased_bytes: int = 0
    copied_bytes: int = 0
    custom_bytes: int = 0
    #: Whether the slots are page-locked for GPU transfers (see :meth:`hydrax.procs.arena.Arena.pin`).
    pinned: bool = False

    def count(self, path: str, nbytes: int) -> None:
        """Count one batch of ``nbytes`` that took ``path``."""
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

    On the CPU backend, with ``may_alias``, matching dtypes and a 64-byte aligned view, the slot
    memory itself becomes the array; otherwise the data is copied once (into aligned host memory that XLA then adopts, or
    straight to the device), and the slot is free once XLA no longer reads it.
    """
    import jax

    out = {}
    aliased = False
    for name, view in views.items():
        jax_dtype = layouts[name].jax_dtype
        # XLA:CPU would copy an unaligned view itself (an array of a cache file at 0.2.2's
        # natural offset, say); copying here keeps the count of aliased batches true.
        if view.dtype == jax_dtype and (not cpu or (may_alias and view.ctypes.data % ALIGNMENT == 0)):
            out[name] = jax.device_put(view)
            aliased |= cpu
        elif cpu:
            out[name] = jax.device_put(aligned_copy(view, jax_dtype))
        else:
            out[name] = jax.device_put(view.astype(jax_dtype))
    return out, aliased


def check_placed(result: Any, layouts, global_batch: int | None = None) -> None:
    """Validate what a custom ``placement_func`` returned (run under ``__debug__`` only).

    Arrays have this process's shape of the batch, or (with ``global_batch``, when processes
    split batches) the global batch's: a ``placement_func`` may build global arrays itself.
    """
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
        shape, jax_dtype = layouts[name].shape, layouts[name].jax_dtype
        allowed = {tuple(shape)} | ({(global_batch, *shape[1:])} if global_batch else set())
        if tuple(value.shape) not in allowed:
            expected = " or ".join(str(s) for s in sorted(allowed))
            raise ValueError(f"array '{name}' from placement_func has shape {tuple(value.shape)}, expected {expected}")
        if value.dtype != jax_dtype:
            raise ValueError(f"array '{name}' from placement_func has dtype {value.dtype}, expected {jax_dtype}")


def custom_placement(placement_func: PlacementFunc, views: dict[str, np.ndarray], layouts, additional, group) -> dict[str, Any]:
    """Run the user's ``placement_func`` and check what it returns."""
    result = placement_func(MappingProxyType(views), layouts, MappingProxyType(additional), group)
    if __debug__:
        check_placed(result, layouts, group.batch_size)
    return result


_batched_put: Any = None  # JAX's own per-device put, resolved on first use (False: not available)


def _put_shards(placement, values: list, dtype) -> Any:
    """One global ``jax.Array`` from the numpy ``values`` of ``placement.shards``, in that order.

    JAX's ``batched_device_put`` (what ``device_put`` and ``make_array_from_callback`` end in)
    takes half the time of the public route, which re-derives and re-checks every shard's index
    per call; it is internal, so any JAX where it is missing or different gets the public one.
    """
    global _batched_put
    import jax

    if _batched_put is None:
        try:
            from jax._src import core
            from jax._src.interpreters import pxla

            def put(shape, dtype, sharding, xs, devices):
                aval = core.ShapedArray(shape, dtype)
                update = getattr(core, "update_aval_with_sharding", None)
                if update is not None:
                    aval = update(aval, sharding)
                return pxla.batched_device_put(aval, sharding, xs, devices)

            _batched_put = put
        except ImportError:
            _batched_put = False
    devices = [shard.device for shard in placement.shards]
    if _batched_put:
        try:
            return _batched_put(placement.global_shape, dtype, placement.sharding, values, devices)
        except TypeError:  # another JAX's internals: use the public route from now on
            _batched_put = False
    from .sharding import index_key

    by_index = {shard.key: value for shard, value in zip(placement.shards, values)}
    shape = placement.global_shape
    return jax.make_array_from_callback(shape, placement.sharding, lambda index: by_index[index_key(index, shape)], dtype=dtype)


def sharded_placement(slot: np.ndarray, layout, sharding, cpu: bool, may_alias: bool) -> tuple[dict[str, Any], bool]:
    """Global ``jax.Array`` s of a slot laid out for ``sharding``, and whether they alias the slot.

    ``slot`` is the slot's bytes, ``layout`` its :class:`~hydrax.layout.SlotLayout` and
    ``sharding`` the group's :class:`~hydrax.run.sharding.GroupSharding`. Every addressable device
    gets its own rows: on the CPU backend, with ``may_alias`` and matching dtypes, each device's
    shard is the slot memory itself (its block starts on a 64-byte boundary); otherwise the
    blocks are copied once into memory XLA adopts (CPU) or transferred device by device.
    Devices that hold the same rows (a replicated array, a 2-D mesh) share one copy.
    """
    out: dict[str, Any] = {}
    aliased = True
    blocks = layout.blocks
    for name, array in layout.arrays.items():
        shape, dtype, jax_dtype = array.shape, array.dtype, array.jax_dtype
        placement = sharding.arrays[name]
        copy = dtype != jax_dtype or (cpu and not may_alias)
        keep = not copy
        row = dtype.itemsize * int(np.prod(shape[1:], dtype=np.int64))
        offsets = layout.block_offsets[name]
        spans = []
        for first, last in placement.spans:
            count = sum(blocks[first : last + 1])
            if offsets[last] - offsets[first] == sum(blocks[first:last]) * row:  # no padding between
                span = slot[offsets[first] : offsets[first] + count * row].view(dtype).reshape(count, *shape[1:])
            else:
                keep = False
                span = np.concatenate([slot[offsets[b] : offsets[b] + blocks[b] * row].view(dtype).reshape(blocks[b], *shape[1:]) for b in range(first, last + 1)])
            if copy:
                span = aligned_copy(span, jax_dtype) if cpu else span.astype(jax_dtype)
            spans.append(span)
        values = []
        for shard in placement.shards:
            value = spans[shard.span][(slice(None), *shard.rest)] if shard.rest else spans[shard.span]
            keep = keep and value.flags.c_contiguous
            values.append(value)
        out[name] = _put_shards(placement, values, jax_dtype)
        aliased = aliased and keep
    return out, aliased and cpu
