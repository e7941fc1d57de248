"""Batch memory layouts: 64-byte aligned arrays in slots, 0.2.2's natural alignment for cache files."""

import jax.numpy as jnp
import numpy as np
import pytest

from hydrax.layout import ALIGNMENT, ArrayLayout, compute_layouts, layouts_end, slot_layout

SPECS = {"image": ((2, 3), np.uint8, jnp.uint8), "label": ((), np.int64, jnp.int32)}


def test_an_array_layout_is_still_the_tuple_hydrax_0_2_2_unpacked():
    layouts, size = compute_layouts(5, SPECS)
    shape, dtype, jax_dtype, offset, count = layouts["label"]
    assert (shape, dtype, jax_dtype, offset, count) == ((5,), np.dtype(np.int64), jnp.dtype(jnp.int32), 64, 5)
    assert layouts["label"] == ((5,), np.dtype(np.int64), jnp.dtype(jnp.int32), 64, 5)
    assert isinstance(layouts["label"], tuple) and layouts["label"].offset == layouts["label"][3]
    assert layouts["image"].nbytes == 30 and layouts["label"].end == 64 + 40 == size == layouts_end(layouts)


def test_natural_alignment_is_the_cache_files_layout():
    layouts, size = compute_layouts(5, SPECS, natural=True)
    assert layouts["label"].offset == 32 and size == 72  # after 30 bytes of uint8, on an 8-byte boundary


@pytest.mark.parametrize("blocks", [(4,), (1, 3), (2, 1, 1), (3, 3, 3)])
def test_every_block_of_a_slot_starts_on_a_64_byte_boundary(blocks):
    layout = slot_layout(blocks, SPECS)
    assert layout.blocks == blocks and layout.arrays["image"].shape == (sum(blocks), 2, 3)
    ends = []
    for name, array in layout.arrays.items():
        row = array.nbytes // sum(blocks)
        offsets = layout.block_offsets[name]
        assert all(offset % ALIGNMENT == 0 for offset in offsets) and offsets[0] == array.offset
        ends += [(offset, offset + rows * row) for offset, rows in zip(offsets, blocks)]
    ends.sort()
    assert all(a[1] <= b[0] for a, b in zip(ends, ends[1:])) and ends[-1][1] <= layout.size  # no overlap, all inside


def test_only_the_blocks_where_a_device_starts_are_padded():
    layout = slot_layout((1, 1, 1, 1), {"x": ((3,), np.uint8, jnp.uint8)}, starts={"x": {2}})
    assert layout.block_offsets["x"] == (0, 3, 64, 67)


def test_a_worker_gets_each_arrays_places_without_jax_types():
    layout = slot_layout((2, 1), SPECS)
    places = layout.item_places()
    assert places["label"] == ((), np.dtype(np.int64), ((layout.block_offsets["label"][0], 2), (layout.block_offsets["label"][1], 1)))
    assert all(type(dtype).__module__.startswith("numpy") for _, dtype, _ in places.values())


def test_bad_specs_say_which_array_is_wrong():
    with pytest.raises(TypeError, match="array 'x' must be"):
        compute_layouts(2, {"x": (1, 2)})
    with pytest.raises(ValueError, match="invalid shape for array 'x'"):
        compute_layouts(2, {"x": ((0,), np.uint8, jnp.uint8)})
    with pytest.raises(TypeError, match="cannot live in shared memory"):
        compute_layouts(2, {"x": ((1,), object, jnp.uint8)})
    with pytest.raises(ValueError, match="positive row counts"):
        slot_layout((2, 0), SPECS)
    assert isinstance(compute_layouts(1, {"x": ((1,), np.uint8, jnp.uint8)})[0]["x"], ArrayLayout)
