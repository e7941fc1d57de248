"""Global batches: which rows of a batch this process loads, and how its slot maps onto devices.

With ``Dataloader(sharding=...)`` every batch array is one global ``jax.Array`` of the group's
full ``batch_size``, laid out over the devices of a :class:`jax.sharding.Sharding`. Each process
loads only the rows its own (addressable) devices hold, taken from the sharding's device map, so
any mesh works: hosts in contiguous blocks, interleaved device orders, 2-D meshes, replicated
arrays. The rows are cut into blocks at every device boundary and each block starts on a 64-byte
boundary of the slot (:class:`hydrax.layout.SlotLayout`), so on the CPU backend every device's
shard can alias the slot.

This module decides; :mod:`hydrax.run.placement` turns a finished slot into the arrays.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

#: ``(start, stop, step)`` per dimension: a device's index in a global array, in a hashable form.
IndexKey = tuple[tuple[int, int, int], ...]


def index_key(index: tuple[slice, ...], shape: tuple[int, ...]) -> IndexKey:
    """``index`` (a tuple of slices, as JAX gives it) normalised against ``shape``."""
    return tuple(s.indices(n) for s, n in zip(index, shape))


@dataclass(frozen=True)
class DeviceShard:
    """Where one device's data of one array comes from: the rows of span ``span`` (see
    :class:`ArrayPlacement`) and ``rest``, the device's index in the item dimensions (empty
    unless the sharding splits an item dimension)."""

    device: Any
    key: IndexKey
    span: int
    rest: tuple[slice, ...]


@dataclass(frozen=True)
class ArrayPlacement:
    """One array of a group placed with ``sharding``: its global shape, the row spans its devices
    hold (``(first block, last block)``, each span once however many devices hold it), and every
    addressable device's shard, in the sharding's order of addressable devices."""

    sharding: Any
    global_shape: tuple[int, ...]
    spans: tuple[tuple[int, int], ...]
    shards: tuple[DeviceShard, ...]


@dataclass(frozen=True)
class GroupSharding:
    """One group under a sharding: the rows this process loads, their blocks, and every array's
    device shards."""

    #: Global batch positions this process loads, as ``(start, stop)`` ranges in order.
    ranges: tuple[tuple[int, int], ...]
    #: The same rows cut at every device boundary, as ``(start, stop)`` global positions.
    blocks: tuple[tuple[int, int], ...]
    arrays: Mapping[str, ArrayPlacement]

    @property
    def block_rows(self) -> tuple[int, ...]:
        """Rows in each block."""
        return tuple(stop - start for start, stop in self.blocks)

    @property
    def device_starts(self) -> dict[str, set[int]]:
        """Per array, the blocks where one of its devices' rows start (these must be aligned)."""
        return {name: {first for first, _last in placement.spans} for name, placement in self.arrays.items()}


def as_shardings(sharding: Any, names: list[str]) -> dict[str, Any]:
    """``sharding`` (one Sharding for every array, or a dict from array name to Sharding) as a dict
    over ``names``, checked."""
    from jax.sharding import Sharding

    if isinstance(sharding, Sharding):
        return {name: sharding for name in names}
    if not isinstance(sharding, Mapping):
        raise TypeError(f"sharding must be a jax.sharding.Sharding or a dict of them by array name, got {type(sharding).__name__}")
    for name, value in sharding.items():
        if not isinstance(value, Sharding):
            raise TypeError(f"sharding['{name}'] must be a jax.sharding.Sharding, got {type(value).__name__}")
    return dict(sharding)


def _tiling(sharding: Any, ndim: int) -> tuple[int, ...]:
    """How many pieces ``sharding`` cuts each of ``ndim`` dimensions into."""
    n = sharding.num_devices
    probe = (n,) * ndim
    return tuple(n // d for d in sharding.shard_shape(probe))


def plan_group(shardings: Mapping[str, Any], batch_size: int, item_shapes: Mapping[str, tuple[int, ...]], what: str) -> GroupSharding:
    """How the batches of one group (``what`` names it in errors) are split over ``shardings``.

    Raises ValueError when the batch or an item dimension does not divide into the sharding's
    pieces, or when no device of the sharding belongs to this process.
    """
    missing = [name for name in item_shapes if name not in shardings]
    extra = [name for name in shardings if name not in item_shapes]
    if missing or extra:
        raise ValueError(
            f"sharding must name every loader array of {what}: "
            + "; ".join(part for part in (missing and f"missing {missing}", extra and f"unknown {extra}") if part)
        )
    device_rows: dict[str, dict[Any, tuple[IndexKey, tuple[int, int]]]] = {}
    for name, item_shape in item_shapes.items():
        sharding = shardings[name]
        shape = (batch_size, *item_shape)
        try:
            tiling = _tiling(sharding, len(shape))
        except Exception as exc:
            raise ValueError(f"the sharding of array '{name}' cannot lay out {what}'s arrays of rank {len(shape)}: {exc}") from None
        for axis, (size, pieces) in enumerate(zip(shape, tiling)):
            if size % pieces:
                dim = "batch_size" if axis == 0 else f"dimension {axis} of the item shape"
                raise ValueError(
                    f"{what}: array '{name}' has {dim} {size}, which its sharding splits into {pieces} equal "
                    f"pieces: make it a multiple of {pieces}"
                )
        rows = {}
        for device, index in sharding.addressable_devices_indices_map(shape).items():
            key = index_key(index, shape)
            rows[device] = (key, key[0][:2])
        device_rows[name] = rows
    if not any(device_rows.values()):
        raise ValueError(f"{what}: no device of the sharding belongs to this process, so it has nothing to load")
    spans = sorted({span for rows in device_rows.values() for _key, span in rows.values()})
    ranges: list[list[int]] = []
    for start, stop in spans:
        if ranges and start <= ranges[-1][1]:
            ranges[-1][1] = max(ranges[-1][1], stop)
        else:
            ranges.append([start, stop])
    cuts = sorted({p for span in spans for p in span})
    blocks = []
    for start, stop in ranges:
        inner = [p for p in cuts if start <= p <= stop]
        blocks.extend(zip(inner[:-1], inner[1:]))
    first_of = {start: b for b, (start, _stop) in enumerate(blocks)}
    last_of = {stop: b for b, (_start, stop) in enumerate(blocks)}
    arrays = {}
    for name, rows in device_rows.items():
        shape = (batch_size, *item_shapes[name])
        array_spans: list[tuple[int, int]] = []
        shards = []
        for device, (key, (start, stop)) in rows.items():
            span = (first_of[start], last_of[stop])
            if span not in array_spans:
                array_spans.append(span)
            whole = all(k == (0, n, 1) for k, n in zip(key[1:], shape[1:]))
            rest = () if whole else tuple(slice(*k) for k in key[1:])
            shards.append(DeviceShard(device, key, array_spans.index(span), rest))
        arrays[name] = ArrayPlacement(shardings[name], shape, tuple(array_spans), tuple(shards))
    return GroupSharding(tuple((a, b) for a, b in ranges), tuple(blocks), arrays)
