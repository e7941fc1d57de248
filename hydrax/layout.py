"""Where a batch's arrays lie in memory: array layouts, and the layout of a batch slot.

Each array of a batch is C-contiguous and batch-major. In a slot every array starts on a
64-byte boundary (:data:`ALIGNMENT`), because XLA:CPU adopts 64-byte-aligned host memory
without a copy; the on-disk cache keeps hydrax 0.2.2's natural dtype alignment instead, so that
its files stay 0.2.2's. With a sharding, one process's share of a batch is cut into blocks of
rows, one per device, and each device's rows start on a 64-byte boundary too (:class:`SlotLayout`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, NamedTuple

import numpy as np

#: Byte alignment of every array in a batch slot (XLA:CPU aliases 64-byte aligned host memory).
ALIGNMENT = 64

#: ``(item_shape, numpy dtype, jax dtype)``: one array of a group, as the user declares it.
ArraySpec = tuple[tuple[int, ...], Any, Any]


class ArrayLayout(NamedTuple):
    """One array of a batch in memory. A tuple, as in hydrax 0.2.2, so that
    ``shape, dtype, jax_dtype, offset, count = layout`` keeps working."""

    #: The full shape, batch dimension first.
    shape: tuple[int, ...]
    dtype: np.dtype
    jax_dtype: Any
    #: Bytes from the start of the batch's memory.
    offset: int
    #: Elements (the product of ``shape``).
    count: int

    @property
    def nbytes(self) -> int:
        """Bytes the array occupies."""
        return self.count * self.dtype.itemsize

    @property
    def end(self) -> int:
        """The byte just past the array."""
        return self.offset + self.nbytes


def align_up(n: int, alignment: int = ALIGNMENT) -> int:
    """``n`` rounded up to a multiple of ``alignment``."""
    return -(-n // alignment) * alignment


def layouts_end(layouts: Mapping[str, ArrayLayout]) -> int:
    """The end of the last array of ``layouts`` (bytes from the start of the batch)."""
    return max((layout.end for layout in layouts.values()), default=0)


def compute_layouts(batch_size: int, specs: Mapping[str, ArraySpec], natural: bool = False) -> tuple[dict[str, ArrayLayout], int]:
    """Layouts of ``specs`` for ``batch_size`` items, and the bytes one batch needs.

    Arrays are placed in insertion order, each on a 64-byte boundary, or with ``natural`` on its
    dtype's own alignment, as hydrax 0.2.2 laid out every batch (the on-disk cache keeps that
    layout, so that its files are 0.2.2's).
    """
    if not isinstance(specs, Mapping):
        raise TypeError(f"array specs must be a mapping of name -> (shape, dtype, jax_dtype), got {type(specs).__name__}")
    import jax.numpy as jnp

    layouts: dict[str, ArrayLayout] = {}
    end = 0
    for name, spec in specs.items():
        if not isinstance(name, str):
            raise TypeError(f"array names must be str, got {name!r}")
        try:
            item_shape, dtype, jax_dtype = spec
        except (TypeError, ValueError):
            raise TypeError(f"array '{name}' must be (item_shape, numpy_dtype, jax_dtype), got {spec!r}") from None
        try:
            item_shape = tuple(int(d) for d in item_shape)
        except TypeError:
            raise TypeError(f"array '{name}' shape must be a tuple of ints, got {item_shape!r}") from None
        full_shape = (batch_size, *item_shape)
        count = int(np.prod(full_shape))
        if count < 1:
            raise ValueError(f"invalid shape for array '{name}': {full_shape}")
        dtype = np.dtype(dtype)
        if dtype.hasobject:
            raise TypeError(f"array '{name}' has dtype {dtype}, which cannot live in shared memory")
        jax_dtype = jnp.dtype(jax_dtype)
        offset = align_up(end, dtype.alignment if natural else ALIGNMENT)
        layouts[name] = ArrayLayout(full_shape, dtype, jax_dtype, offset, count)
        end = offset + count * dtype.itemsize
    return layouts, end


@dataclass(frozen=True)
class SlotLayout:
    """Where one process's share of a group's batch lives in a slot.

    The share's rows come in ``blocks`` (row counts, in local order): one block normally, and one
    per device block when the batch is placed with a sharding, so that every device's rows start
    on a 64-byte boundary and the device can alias them. Each array holds its blocks one after
    the other, in ``block_offsets[name]`` (bytes from the slot start), padded to 64 bytes only
    before the blocks where one of that array's devices starts, and only where the bytes before
    are not a multiple of 64.
    """

    #: The arrays as hydrax 0.2.2 describes them: the share's full shape and its first block's offset.
    arrays: MappingProxyType[str, ArrayLayout]
    blocks: tuple[int, ...]
    block_offsets: MappingProxyType[str, tuple[int, ...]]
    #: Bytes of the slot the share needs.
    size: int

    def item_places(self) -> dict[str, tuple[tuple[int, ...], np.dtype, tuple[tuple[int, int], ...]]]:
        """``name -> (item_shape, numpy dtype, ((byte offset, rows), ...))``: where a worker writes
        each row, block by block, with no JAX types (a worker never has to import JAX)."""
        return {
            name: (layout.shape[1:], layout.dtype, tuple(zip(self.block_offsets[name], self.blocks)))
            for name, layout in self.arrays.items()
        }


def slot_layout(blocks: Sequence[int], specs: Mapping[str, ArraySpec], starts: Mapping[str, Iterable[int]] | None = None) -> SlotLayout:
    """The slot layout of a share of ``sum(blocks)`` rows in ``blocks`` of rows (see :class:`SlotLayout`).

    ``starts[name]`` lists the blocks where a device's rows of that array start (default: every
    block); only those are aligned. With one block this is :func:`compute_layouts`.
    """
    blocks = tuple(int(b) for b in blocks)
    if not blocks or min(blocks) < 1:
        raise ValueError(f"blocks must be positive row counts, got {blocks}")
    layouts, end = compute_layouts(sum(blocks), specs)
    if len(blocks) == 1:
        return SlotLayout(MappingProxyType(layouts), blocks, MappingProxyType({n: (lay.offset,) for n, lay in layouts.items()}), end)
    arrays, offsets, end = {}, {}, 0
    for name, layout in layouts.items():
        row = layout.dtype.itemsize * int(np.prod(layout.shape[1:]))
        aligned = set(range(len(blocks))) if starts is None else {0, *starts[name]}
        places = []
        for b, rows in enumerate(blocks):
            if b in aligned:
                end = align_up(end)
            places.append(end)
            end += rows * row
        arrays[name] = layout._replace(offset=places[0])
        offsets[name] = tuple(places)
    return SlotLayout(MappingProxyType(arrays), blocks, MappingProxyType(offsets), end)
