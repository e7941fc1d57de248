"""hydrax.image.resample and the resampling kernel: Pillow 13's resize, bit for bit, with the
colour conversion fused in."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("PIL")
from PIL import Image  # noqa: E402

from hydrax import _core  # noqa: E402
from hydrax.image.resample import FILTERS, resize_into, taps  # noqa: E402
from hydrax.image.transform import transform_for  # noqa: E402


def pillow_resize(pixels: np.ndarray, size: tuple[int, int], kind: int, box) -> np.ndarray:
    image = Image.fromarray(pixels[:, :, 0] if pixels.shape[2] == 1 else pixels)
    resized = np.asarray(image.resize(size, kind, box=box))
    return resized[:, :, None] if resized.ndim == 2 else resized


def random_case(rng, largest=90):
    height, width = (int(v) for v in rng.integers(1, largest, 2))
    channels = int(rng.choice([1, 3]))
    out_h, out_w = (int(v) for v in rng.integers(1, largest, 2))
    x0, x1 = sorted(rng.uniform(0, width, 2))
    y0, y1 = sorted(rng.uniform(0, height, 2))
    if rng.random() < 0.3 or x1 - x0 < 1e-3 or y1 - y0 < 1e-3:
        x0, y0, x1, y1 = 0.0, 0.0, float(width), float(height)
    return rng.integers(0, 256, (height, width, channels), np.uint8), (out_w, out_h), (x0, y0, x1, y1)


@pytest.mark.parametrize("kind", sorted(FILTERS))
def test_resize_into_equals_pillows_resize_for_random_sizes_and_boxes(kind):
    rng = np.random.default_rng(kind)
    for _ in range(120):
        pixels, (out_w, out_h), box = random_case(rng)
        out = np.zeros((out_h, out_w, pixels.shape[2]), np.uint8)
        resize_into(pixels, box, out, chw=False, flip=False, kind=kind, colour=None)
        np.testing.assert_array_equal(out, pillow_resize(pixels, (out_w, out_h), kind, box))


def test_photo_sized_downscales_in_both_pass_orders_equal_pillows():
    rng = np.random.default_rng(3)
    for height, width in ((375, 500), (500, 375), (300, 300), (640, 120)):
        pixels = rng.integers(0, 256, (height, width, 3), np.uint8)
        for out_h, out_w in ((224, 224), (100, 37), (299, 61)):
            box = (width * 0.07, height * 0.11, width * 0.93, height * 0.95)
            out = np.zeros((out_h, out_w, 3), np.uint8)
            resize_into(pixels, box, out, chw=False, flip=False, kind=2, colour=None)
            np.testing.assert_array_equal(out, pillow_resize(pixels, (out_w, out_h), 2, box))


def test_strided_sources_chw_and_flips_give_the_same_pixels():
    rng = np.random.default_rng(4)
    for _ in range(60):
        pixels, (out_w, out_h), box = random_case(rng)
        expected = pillow_resize(pixels, (out_w, out_h), 2, box)
        stored = np.ascontiguousarray(pixels[::-1, ::-1].transpose(1, 0, 2))
        turned = stored.transpose(1, 0, 2)[::-1, ::-1]  # the same values through negative, transposed strides
        assert np.array_equal(turned, pixels) and turned.strides[0] < 0 < turned.strides[2]
        out = np.zeros((pixels.shape[2], out_h, out_w), np.uint8)
        resize_into(turned, box, out, chw=True, flip=True, kind=2, colour=None)
        np.testing.assert_array_equal(out.transpose(1, 2, 0)[:, ::-1], expected)


def _colour(space: str, dtype, channels: int = 3, mode: str = "RGB", profile=None):
    transform = transform_for(profile, mode, space)
    full = 255.0 if dtype == np.uint8 else 1.0
    scale = np.full(4, full, np.float32)
    return (transform.lin, transform.matrix, transform.encode, transform.curve, transform.byte_curve, transform.second,
            scale, np.zeros(4, np.float32))


@pytest.mark.parametrize(("space", "dtype"), [("srgb", np.uint8), ("srgb", np.float32), ("linear", np.uint8),
                                             ("linear", np.float32), ("oklab", np.float32)])
def test_the_fused_conversion_equals_resizing_then_convert_pixels(space, dtype):
    from pathlib import Path

    profile = (Path(__file__).parent / "data" / "icc" / "AdobeRGB1998.icc").read_bytes()
    rng = np.random.default_rng(5)
    for source_profile in (None, profile):
        colour = _colour(space, dtype, profile=source_profile)
        for _ in range(20):
            pixels, (out_w, out_h), box = random_case(rng, largest=120)
            pixels = np.repeat(pixels[:, :, :1], 3, axis=2) if pixels.shape[2] == 1 else pixels
            resized = pillow_resize(pixels, (out_w, out_h), 2, box)
            for channels, chw in ((3, False), (4, True)):
                shape = (channels, out_h, out_w) if chw else (out_h, out_w, channels)
                fused, reference = np.zeros(shape, dtype), np.zeros(shape, dtype)
                resize_into(pixels, box, fused, chw=chw, flip=False, kind=2, colour=colour)
                _core.convert_pixels(np.ascontiguousarray(resized), reference, chw, *colour)
                np.testing.assert_array_equal(fused, reference)
                mirrored = np.zeros(shape, dtype)
                resize_into(pixels, box, mirrored, chw=chw, flip=True, kind=2, colour=colour)
                np.testing.assert_array_equal(mirrored, reference[..., ::-1] if chw else reference[:, ::-1])


def test_the_tabulated_conversion_equals_the_computed_one():
    """convert_pixels looks values up in a table for images over 4096 pixels when the channels do
    not mix: a big image must convert exactly as its small tiles do."""
    rng = np.random.default_rng(6)
    pixels = rng.integers(0, 256, (128, 96, 3), np.uint8)
    for space, dtype in (("srgb", np.uint8), ("srgb", np.float32), ("linear", np.float32), ("oklab", np.float32)):
        colour = list(_colour(space, dtype))
        colour[6] = np.array([58.4, 57.1, 57.4, 255.0], np.float32)[: 4] * (1.0 if dtype != np.uint8 else 1.0)
        colour[7] = np.array([-2.1, -2.0, -1.8, 0.0], np.float32)
        whole = np.zeros((128, 96, 4), dtype)
        _core.convert_pixels(pixels, whole, False, *colour)
        for top in range(0, 128, 32):
            tile = np.zeros((32, 96, 4), dtype)
            _core.convert_pixels(np.ascontiguousarray(pixels[top : top + 32]), tile, False, *colour)
            np.testing.assert_array_equal(whole[top : top + 32], tile)


def test_taps_refuse_what_is_not_a_resize():
    with pytest.raises(ValueError, match="filter"):
        _core.Taps(10, 0, 10, 5, 0)  # nearest
    with pytest.raises(ValueError, match="span"):
        _core.Taps(10, 0, 11, 5, 2)
    with pytest.raises(ValueError, match="span"):
        _core.Taps(10, 4, 4, 5, 2)
    with pytest.raises(ValueError, match="span"):
        _core.Taps(10, float("nan"), 4, 5, 2)
    with pytest.raises(ValueError, match="pixels"):
        _core.Taps(0, 0, 1, 5, 2)
    with pytest.raises(ValueError, match="too many"):
        _core.Taps(1 << 24, 0, 1 << 24, 1 << 20, 1)
    bounds, weights = taps(500, 0.0, 500.0, 224, 2).arrays()
    assert (bounds[:, 0] >= 0).all() and (bounds.sum(axis=1) <= 500).all()
    assert (np.abs(weights.sum(axis=1) - (1 << 22)) <= weights.shape[1]).all()


def test_resample_into_refuses_mismatched_taps_and_outputs():
    pixels = np.zeros((20, 30, 3), np.uint8)
    columns, rows = _core.Taps(30, 0, 30, 10, 2), _core.Taps(20, 0, 20, 8, 2)
    with pytest.raises(ValueError, match="taps are for"):
        _core.resample_into(pixels, np.zeros((8, 10, 3), np.uint8), False, False, rows, columns, None)
    with pytest.raises(ValueError, match="output is"):
        _core.resample_into(pixels, np.zeros((9, 10, 3), np.uint8), False, False, columns, rows, None)
    with pytest.raises(ValueError, match="without a colour conversion"):
        _core.resample_into(pixels, np.zeros((8, 10, 3), np.float32), False, False, columns, rows, None)
    with pytest.raises(ValueError, match="colour must hold"):
        _core.resample_into(pixels, np.zeros((8, 10, 3), np.uint8), False, False, columns, rows, (1, 2))
