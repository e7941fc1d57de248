"""hydrax.image.resample and the resampling kernel: Pillow 13's resize, bit for bit, with the
colour conversion fused in."""

from __future__ import annotations

import itertools

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


# The plane kernels: a JPEG's Y, Cb and Cr resized on their own grids, then made RGB.

def dense(axis: _core.Taps) -> np.ndarray:
    """The (out_size, in_size) matrix of an axis's weights, as fractions."""
    bounds, weights = axis.arrays()
    matrix = np.zeros((axis.out_size, axis.in_size))
    for row, ((first, count), w) in enumerate(zip(bounds, weights)):
        matrix[row, first:first + count] = w[:count] / (1 << 22)
    return matrix


def triangle(size: int, chroma: int) -> np.ndarray:
    """(size, chroma): libjpeg's triangle upsampling of half-resolution chroma, as fractions."""
    matrix = np.zeros((size, chroma))
    for x in range(size):
        near = x // 2
        far = min(max(near - 1 if x % 2 == 0 else near + 1, 0), chroma - 1)
        matrix[x, near] += 0.75
        matrix[x, far] += 0.25
    return matrix


def random_axis(rng, most_in: int, most_out: int) -> tuple[int, int, float, float, int]:
    """An axis to resize: (in size, out size, span start, span stop, chroma samples at half
    resolution), the span a random part of the axis or, three times in ten, all of it."""
    size, out = int(rng.integers(1, most_in)), int(rng.integers(1, most_out))
    start, stop = sorted(rng.uniform(0, size, 2)) if rng.random() < 0.7 else (0.0, float(size))
    if stop - start < 1e-3:
        start, stop = 0.0, float(size)
    return size, out, float(start), float(stop), (size + 1) // 2


@pytest.mark.parametrize("kind", sorted(FILTERS))
def test_folded_taps_weigh_chroma_as_upsampling_then_resizing_would(kind):
    rng = np.random.default_rng(40 + kind)
    for _ in range(80):
        size, out, start, stop, chroma = random_axis(rng, 400, 300)
        folded, luma = taps(size, start, stop, out, kind, chroma), taps(size, start, stop, out, kind)
        assert folded.in_size == chroma and folded.out_size == out
        np.testing.assert_allclose(dense(folded), dense(luma) @ triangle(size, chroma), atol=4 / (1 << 22))
    with pytest.raises(ValueError, match="chroma samples"):
        _core.Taps(10, 0, 10, 4, 2, 6)


@pytest.mark.parametrize("kind", sorted(FILTERS))
def test_chroma_taps_made_right_after_their_luma_taps_are_the_same_weights(kind):
    """The chroma axis of a span reuses the luma axis's weights when that was the last made (a
    memo in the kernel); the weights are those made from scratch, after an unrelated axis."""
    rng = np.random.default_rng(90 + kind)
    for _ in range(200):
        size, out, start, stop, chroma = random_axis(rng, 2000, 400)
        _core.Taps(7, 0.0, 7.0, 3, 2)  # another axis last: the chroma axis is computed from scratch
        fresh = _core.Taps(size, start, stop, out, kind, chroma)
        luma = _core.Taps(size, start, stop, out, kind)
        reused = _core.Taps(size, start, stop, out, kind, chroma)
        assert (reused.first, reused.last, reused.in_size) == (fresh.first, fresh.last, fresh.in_size)
        for ours, theirs in zip(reused.arrays(), fresh.arrays()):
            np.testing.assert_array_equal(ours, theirs)
        assert luma.in_size == size
        # after the luma axis of another span (or size, or filter), the memo is not taken
        _core.Taps(size, start, stop, out, kind)
        for other in ((size, start, (start + stop) / 2, out, kind), (size, start, stop, out + 1, kind),
                      (size, start, stop, out, 1 + kind % 5)):
            if other[2] <= other[1]:
                continue
            _core.Taps(7, 0.0, 7.0, 3, 2)
            expected = _core.Taps(*other, chroma)
            _core.Taps(size, start, stop, out, kind)
            got = _core.Taps(*other, chroma)
            for ours, theirs in zip(got.arrays(), expected.arrays()):
                np.testing.assert_array_equal(ours, theirs)


def ycc_to_rgb(y, cb, cr):
    return np.stack([y + 1.402 * (cr - 128), y - 0.34414 * (cb - 128) - 0.71414 * (cr - 128), y + 1.772 * (cb - 128)], axis=-1)


def plane_case(rng, across, down, kind):
    height, width = (int(v) for v in rng.integers(2, 120, 2))
    out_h, out_w = (int(v) for v in rng.integers(1, 100, 2))
    x0, x1 = sorted(rng.uniform(0, width, 2))
    y0, y1 = sorted(rng.uniform(0, height, 2))
    if rng.random() < 0.3 or x1 - x0 < 1e-2 or y1 - y0 < 1e-2:
        x0, y0, x1, y1 = 0.0, 0.0, float(width), float(height)
    luma = rng.integers(0, 256, (height, width), np.uint8)
    chroma_shape = ((height + down - 1) // down, (width + across - 1) // across)
    # smooth chroma, mostly inside RGB's range: where clamping does not decide, the result is the arithmetic's
    blue, red = (np.clip(128 + rng.normal(0, 20, chroma_shape), 0, 255).astype(np.uint8) for _ in range(2))
    columns, rows = taps(width, x0, x1, out_w, kind), taps(height, y0, y1, out_h, kind)
    chroma_columns = taps(width, x0, x1, out_w, kind, chroma_shape[1]) if across == 2 else columns
    chroma_rows = taps(height, y0, y1, out_h, kind, chroma_shape[0]) if down == 2 else rows
    expected = ycc_to_rgb(dense(rows) @ luma @ dense(columns).T, dense(chroma_rows) @ blue @ dense(chroma_columns).T,
                          dense(chroma_rows) @ red @ dense(chroma_columns).T)
    return (luma, blue, red), (columns, rows, chroma_columns, chroma_rows), np.clip(expected, 0, 255)


@pytest.mark.parametrize("kind", sorted(FILTERS))
@pytest.mark.parametrize(("across", "down"), [(1, 1), (2, 1), (2, 2), (1, 2)])
def test_resample_planes_into_is_the_exact_result_within_rounding(kind, across, down):
    rng = np.random.default_rng(kind * 10 + across * 3 + down)
    for _ in range(40):
        planes, axes, expected = plane_case(rng, across, down, kind)
        out = np.zeros(expected.shape, np.uint8)
        _core.resample_planes_into(*planes, out, False, False, *axes, None)
        assert np.abs(out - expected).max() <= 1.0, np.abs(out - expected).max()
        # mirrored, and in CHW
        flipped, chw = np.zeros_like(out), np.zeros(out.shape[2:] + out.shape[:2], np.uint8)
        _core.resample_planes_into(*planes, flipped, False, True, *axes, None)
        _core.resample_planes_into(*planes, chw, True, False, *axes, None)
        np.testing.assert_array_equal(flipped, out[:, ::-1])
        np.testing.assert_array_equal(chw, out.transpose(2, 0, 1))


@pytest.fixture(params=[0, 1, 2], ids=["scalar", "sse2", "avx2"])
def kernel_level(request):
    """Each level of the plane kernels this machine has, restoring the best after."""
    best = _core.planar_kernels()
    if request.param > best:
        pytest.skip(f"this machine's plane kernels go to level {best}")
    _core.planar_kernels(request.param)
    yield request.param
    _core.planar_kernels()


@pytest.mark.parametrize(("space", "profile"), [("linear", None), ("srgb", None), ("srgb", "AdobeRGB1998.icc"),
                                                ("oklab", None)])
def test_resample_planes_into_converts_colour_as_convert_pixels_does(space, profile, kernel_level):
    """Through a table per channel (linear, sRGB with coefs), the matrix (Adobe RGB) or Oklab; in
    each layout, mirrored or not, with or without alpha; at every level of the kernels."""
    from pathlib import Path

    rng = np.random.default_rng(77)
    planes, axes, expected = plane_case(rng, 2, 2, 2)
    rgb = np.zeros(expected.shape, np.uint8)
    _core.resample_planes_into(*planes, rgb, False, False, *axes, None)
    icc = (Path(__file__).parent / "data" / "icc" / profile).read_bytes() if profile else None
    transform = transform_for(icc, "RGB", space)
    for dtype, channels, chw, flip in itertools.product((np.uint8, np.float32), (3, 4), (False, True), (False, True)):
        if space == "oklab" and dtype == np.uint8:
            continue
        scale = np.full(4, 255.0 if dtype == np.uint8 else 1.0, np.float32)
        offset = np.zeros(4, np.float32)
        if space == "srgb" and dtype == np.float32:
            scale, offset = np.array([2.0, 3.0, 4.0, 1.0], np.float32), np.array([-1.0, -0.5, 0.25, 0.0], np.float32)
        colour = (transform.lin, transform.matrix, transform.encode, transform.curve, transform.byte_curve,
                  transform.second, scale, offset)
        shape = (channels,) + expected.shape[:2] if chw else expected.shape[:2] + (channels,)
        fused, then = np.zeros(shape, dtype), np.zeros(shape, dtype)
        _core.resample_planes_into(*planes, fused, chw, flip, *axes, colour)
        _core.convert_pixels(np.ascontiguousarray(rgb[:, ::-1] if flip else rgb), then, chw, *colour)
        np.testing.assert_array_equal(fused, then, err_msg=f"{dtype} {channels} chw={chw} flip={flip}")


def test_resample_planes_into_refuses_mismatched_planes_and_taps():
    luma, chroma = np.zeros((20, 30), np.uint8), np.zeros((10, 15), np.uint8)
    columns, rows = taps(30, 0, 30, 10, 2), taps(20, 0, 20, 8, 2)
    chroma_columns, chroma_rows = taps(30, 0, 30, 10, 2, 15), taps(20, 0, 20, 8, 2, 10)
    out = np.zeros((8, 10, 3), np.uint8)
    with pytest.raises(ValueError, match="luma rows"):
        _core.resample_planes_into(luma, chroma, chroma, out, False, False, columns, columns, chroma_columns, chroma_rows, None)
    with pytest.raises(ValueError, match="chroma columns"):
        _core.resample_planes_into(luma, chroma, chroma, out, False, False, columns, rows, columns, chroma_rows, None)
    with pytest.raises(ValueError, match="one shape"):
        _core.resample_planes_into(luma, chroma, chroma[:9], out, False, False, columns, rows, chroma_columns, chroma_rows, None)
    with pytest.raises(ValueError, match="contiguous"):
        _core.resample_planes_into(luma[:, ::2], chroma, chroma, out, False, False, columns, rows, chroma_columns,
                                   chroma_rows, None)
    with pytest.raises(ValueError, match="uint8 RGB"):
        _core.resample_planes_into(luma, chroma, chroma, np.zeros((8, 10, 4), np.uint8), False, False, columns, rows,
                                   chroma_columns, chroma_rows, None)


def test_every_level_of_the_plane_kernels_gives_the_same_bytes():
    """Scalar loops, SSE2 and AVX2 (those this machine has; AVX2 makes 16 rows at a time, through
    transposed blocks), on widths and heights around their strides, every filter."""
    best = _core.planar_kernels()
    rng = np.random.default_rng(8)
    cases = [plane_case(rng, int(rng.choice([1, 2])), int(rng.choice([1, 2])), kind) for kind in sorted(FILTERS)
             for _ in range(12)]
    try:
        results = []
        for level in range(best + 1):
            assert _core.planar_kernels(level) == level
            outs = []
            for planes, axes, expected in cases:
                out = np.zeros(expected.shape, np.uint8)
                _core.resample_planes_into(*planes, out, False, False, *axes, None)
                outs.append(out)
            results.append(outs)
        for outs in results[1:]:
            for ours, scalar in zip(outs, results[0]):
                np.testing.assert_array_equal(ours, scalar)
    finally:
        assert _core.planar_kernels() == best
