"""Placement: a slot's views become jax.Arrays, aliasing 64-byte aligned memory on the CPU backend."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hydrax.layout import ALIGNMENT, compute_layouts
from hydrax.run.placement import TransferStats, aligned_copy, check_placed, default_placement

pytestmark = pytest.mark.cpu_only

LAYOUTS = compute_layouts(4, {"x": ((2,), np.float32, jnp.float32), "y": ((), np.int64, jnp.int32)})[0]


def aligned(shape, dtype, offset=0):
    raw = np.zeros(int(np.prod(shape)) * np.dtype(dtype).itemsize + 2 * ALIGNMENT, np.uint8)
    start = -raw.ctypes.data % ALIGNMENT + offset
    return raw[start : start + int(np.prod(shape)) * np.dtype(dtype).itemsize].view(dtype).reshape(shape)


def address(array):
    return array.addressable_data(0).unsafe_buffer_pointer()


def test_an_aligned_view_of_the_jax_dtype_becomes_the_array_itself():
    views = {"x": aligned((4, 2), np.float32), "y": aligned((4,), np.int64)}
    arrays, aliased = default_placement(views, LAYOUTS, cpu=True, may_alias=True)
    assert aliased and address(arrays["x"]) == views["x"].ctypes.data
    assert address(arrays["y"]) != views["y"].ctypes.data and arrays["y"].dtype == jnp.int32  # converted: a copy


def test_a_copy_where_aliasing_is_not_allowed_or_not_possible():
    views = {"x": aligned((4, 2), np.float32), "y": aligned((4,), np.int64)}
    arrays, aliased = default_placement(views, LAYOUTS, cpu=True, may_alias=False)
    assert not aliased and address(arrays["x"]) != views["x"].ctypes.data
    views["x"] = aligned((4, 2), np.float32, offset=4)  # off the 64-byte boundary (0.2.2's cache layout)
    arrays, aliased = default_placement({"x": views["x"]}, LAYOUTS, cpu=True, may_alias=True)
    assert not aliased and address(arrays["x"]) % ALIGNMENT == 0


def test_an_aligned_copy_is_aligned_and_converted():
    view = np.arange(12, dtype=np.int64).reshape(3, 4)[:, 1:3]
    copy = aligned_copy(view, np.int32)
    assert copy.ctypes.data % ALIGNMENT == 0 and copy.dtype == np.int32 and copy.tolist() == view.tolist()


def test_what_a_placement_func_returns_is_checked_by_name_shape_and_dtype():
    good = {"x": jnp.zeros((4, 2), jnp.float32), "y": jnp.zeros((4,), jnp.int32)}
    check_placed(good, LAYOUTS)
    check_placed({"x": jnp.zeros((8, 2), jnp.float32), "y": jnp.zeros((8,), jnp.int32)}, LAYOUTS, global_batch=8)
    with pytest.raises(ValueError, match="array 'y' was not provided"):
        check_placed({"x": good["x"]}, LAYOUTS)
    with pytest.raises(TypeError, match="array 'x' from placement_func is ndarray, not a jax.Array"):
        check_placed({**good, "x": np.zeros((4, 2), np.float32)}, LAYOUTS)
    with pytest.raises(ValueError, match=r"has shape \(3, 2\), expected \(4, 2\)"):
        check_placed({**good, "x": jnp.zeros((3, 2), jnp.float32)}, LAYOUTS)
    with pytest.raises(ValueError, match="has dtype int32, expected float32"):
        check_placed({**good, "x": jnp.zeros((4, 2), jnp.int32)}, LAYOUTS)


def test_transfer_stats_count_batches_and_bytes_by_path():
    stats = TransferStats()
    stats.count("aliased", 100)
    stats.count("aliased", 50)
    stats.count("custom", 7)
    assert stats.as_dict() == {"aliased_batches": 2, "copied_batches": 0, "custom_batches": 1, "aliased_bytes": 150,
                               "copied_bytes": 0, "custom_bytes": 7, "pinned": False}
    assert jax.default_backend() == "cpu"
