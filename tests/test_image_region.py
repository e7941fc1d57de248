"""The random resized crop's region decode (hydrax.image.jpeg.decode_region, and decode_into's
choice of it): only the box's pixels are decoded, and they are the pixels a full decode at the
same scale gives, bit for bit, for every sampling it takes, odd sizes, and boxes on every edge."""

import io
import itertools

import numpy as np
import pytest

Image = pytest.importorskip("PIL.Image")

from hydrax.image import Coefs, decode_into, jpeg, random_resized_box  # noqa: E402
from hydrax.image import decode as decode_module  # noqa: E402
from hydrax.image.resample import resize_into  # noqa: E402

pytestmark = pytest.mark.skipif(jpeg.region_library() is None, reason="no libjpeg-turbo with the scanline calls")

SUBSAMPLINGS = {"4:4:4": 0, "4:2:2": 1, "4:2:0": 2}


def photo(width, height, *, gray=False, seed=0, **options) -> bytes:
    """Photo-like: coarse colour structure and fine grain, so every block differs."""
    rng = np.random.default_rng(seed + width * 7 + height)
    coarse = rng.integers(0, 256, (height // 16 + 2, width // 16 + 2, 3), np.uint8)
    image = Image.fromarray(coarse).resize((width, height), Image.Resampling.BICUBIC)
    pixels = np.clip(np.asarray(image, np.int16) + rng.integers(-20, 21, (height, width, 3)), 0, 255).astype(np.uint8)
    image = Image.fromarray(pixels)
    if gray:
        image = image.convert("L")
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", quality=90, **options)
    return buffer.getvalue()


def full_decode(data: bytes, factor: int) -> np.ndarray:
    """The whole image through Pillow (the same libjpeg-turbo) at 1/factor, as Pillow's draft picks it."""
    image = Image.open(io.BytesIO(data))
    if factor > 1:
        image.draft(image.mode, (max(1, image.width // factor), max(1, image.height // factor)))
    pixels = np.asarray(image)
    return pixels[:, :, None] if pixels.ndim == 2 else pixels


def boxes(width, height, rng, count):
    """Random boxes, and boxes on each edge, in the corners, one pixel wide or high, and the whole."""
    yield 0, 0, width, height
    yield 0, 0, 1, 1
    yield width - 1, height - 1, width, height
    yield 0, height // 3, width, height // 3 + 1  # one row, full width
    yield width // 2, 0, width // 2 + 1, height  # one column, full height
    for _ in range(count):
        left, right = sorted(rng.choice(width + 1, 2, replace=False)) if width > 1 else (0, 1)
        top, bottom = sorted(rng.choice(height + 1, 2, replace=False)) if height > 1 else (0, 1)
        yield int(left), int(top), int(right), int(bottom)


CASES = [(sub, False, False) for sub in SUBSAMPLINGS] + [("4:2:0", False, True), ("4:2:2", False, True),
                                                         ("gray", True, False), ("gray", True, True)]


@pytest.mark.parametrize(("sampling", "gray", "progressive"), CASES)
@pytest.mark.parametrize(("width", "height"), [(333, 251), (160, 120), (97, 83), (35, 17), (9, 300)])
def test_the_region_is_what_a_full_decode_gives_at_every_scale(sampling, gray, progressive, width, height):
    data = photo(width, height, gray=gray, progressive=progressive,
                 **({} if gray else {"subsampling": SUBSAMPLINGS[sampling]}))
    header = jpeg.read_header(memoryview(data))
    rng = np.random.default_rng(width + height)
    for factor in (1, 2, 4, 8):
        expected = full_decode(data, factor)
        scaled = (-(-height // factor), -(-width // factor))
        assert expected.shape[:2] == scaled  # Pillow's draft scales as the region decoder does
        for box in boxes(scaled[1], scaled[0], rng, 25):
            left, top, right, bottom = box
            buffer = jpeg._buffer(expected.size)  # what the last call left: the region must overwrite it
            buffer[:] = 0xA5
            pixels = jpeg.decode_region(memoryview(data), header, factor, box)
            assert pixels is not None and pixels.shape == expected.shape
            np.testing.assert_array_equal(pixels[top:bottom, left:right], expected[top:bottom, left:right],
                                          err_msg=f"factor {factor}, box {box}")


def test_only_the_box_and_its_margin_are_decoded():
    data = photo(400, 300, subsampling=2)
    header = jpeg.read_header(memoryview(data))
    buffer = jpeg._buffer(400 * 300 * 3)
    buffer[: 400 * 300 * 3] = 0xA5
    pixels = jpeg.decode_region(memoryview(data), header, 1, (100, 120, 180, 200))
    written = (pixels != 0xA5).any(axis=2)
    rows, columns = np.nonzero(written)
    assert rows.min() == 120 and rows.max() == 199  # the rows above are skipped, decoding stops below
    # columns from the iMCU column (16 pixels in 4:2:0) at or left of the margin, to the margin's end
    assert columns.min() == 96 and columns.max() == 180


def test_a_box_outside_the_scaled_image_is_refused():
    data = photo(64, 48)
    header = jpeg.read_header(memoryview(data))
    for box in [(0, 0, 33, 24), (0, 0, 32, 25), (5, 5, 5, 6), (-1, 0, 4, 4)]:
        with pytest.raises(ValueError, match="not inside"):
            jpeg.decode_region(memoryview(data), header, 2, box)


def test_samplings_it_does_not_take_and_damage_give_none():
    data = photo(64, 48, subsampling=2)
    header = jpeg.read_header(memoryview(data))
    odd = jpeg.JpegHeader(64, 48, 3, 1, None, ((1, 2), (1, 1), (1, 1)))  # 4:4:0: decoded whole
    assert jpeg.decode_region(memoryview(data), odd, 1, (0, 0, 8, 8)) is None
    cut = data[: len(data) // 2]  # the box's rows are cut off: libjpeg warns, the caller falls back
    assert jpeg.decode_region(memoryview(cut), header, 1, (0, 30, 64, 48)) is None
    # the header says another size than the file: refused before anything is decoded
    other = jpeg.JpegHeader(64, 40, 3, 1, None, header.sampling)
    assert jpeg.decode_region(memoryview(data), other, 1, (0, 0, 8, 8)) is None


def test_the_library_crops_as_it_decodes():
    found = jpeg.region_library()
    assert found is jpeg.library() and found.scanlines
    data = photo(120, 90, subsampling=2)
    buffer = np.zeros(120 * 90 * 3, np.uint8)
    # without the margin the crop's edge columns are upsampled as the image's edges: the reason for it
    status, first = found.decode_region(data, 120, 90, 3, 1, 40, 10, 100, 50, buffer)
    assert (status, first) == (0, 32)
    got = buffer.reshape(90, 120, 3)[10:50]
    expected = full_decode(data, 1)[10:50]
    assert not np.array_equal(got[:, 32], expected[:, 32]) and not np.array_equal(got[:, 99], expected[:, 99])
    np.testing.assert_array_equal(got[:, 33:99], expected[:, 33:99])
    with pytest.raises(ValueError, match="denom"):
        found.decode_region(data, 120, 90, 3, 3, 0, 0, 1, 1, buffer)
    with pytest.raises(ValueError, match="buffer"):
        found.decode_region(data, 120, 90, 3, 1, 0, 0, 1, 1, buffer[:100])
    with pytest.raises(ValueError, match="region"):
        found.decode_region(data, 120, 90, 3, 2, 0, 0, 61, 1, buffer)
    assert found.decode_region(data, 120, 90, 1, 1, 0, 0, 1, 1, buffer)[0] == 2  # not a gray file


def _counted(monkeypatch):
    calls = []
    for name in ("decode", "decode_planes", "decode_region"):
        original = getattr(jpeg, name)
        monkeypatch.setattr(jpeg, name, lambda *a, _f=original, _n=name: calls.append(_n) or _f(*a))
    return calls


@pytest.mark.parametrize(("width", "height", "sampling"), [(500, 375, "4:2:0"), (1600, 1200, "4:2:0"), (640, 480, "4:2:2"),
                                                           (333, 251, "4:4:4"), (801, 603, "gray")])
def test_decode_into_gives_what_decoding_everything_gives(width, height, sampling, monkeypatch):
    """Where the region path decodes (small boxes at full scale; every box DCT-scaled), the slot
    is, to the bit, what the whole image decoded to RGB (or gray) at the same scale and resized
    over the same box gives: that path with the region and plane decoders turned off."""
    gray = sampling == "gray"
    data = photo(width, height, gray=gray, **({} if gray else {"subsampling": SUBSAMPLINGS[sampling]}))
    slots = [(np.zeros((224, 224, 3), np.uint8), {}),
             (np.zeros((3, 96, 128), np.float32), {"layout": "chw", "flip": True, "coefs": Coefs.IMAGENET_SRGB})]
    regions = 0
    for seed, (out, options) in itertools.product(range(40), slots):
        calls = _counted(monkeypatch)
        decode_into(data, out, crop="random_resized", seed=seed, **options)
        monkeypatch.undo()
        if calls[0] != "decode_region":
            assert calls == ["decode_planes"] and not gray  # a large box at full scale: the plane path
            continue
        regions += 1
        expected = np.zeros_like(out)
        with monkeypatch.context() as whole:
            whole.setattr(jpeg, "decode_region", lambda *a: None)
            whole.setattr(jpeg, "decode_planes", lambda *a: None)
            decode_into(data, expected, crop="random_resized", seed=seed, **options)
        np.testing.assert_array_equal(out, expected, err_msg=f"seed {seed}, {out.shape}")
    assert regions >= 20


def test_decode_into_takes_the_region_or_the_planes_by_the_boxs_share(monkeypatch):
    data = photo(500, 375, subsampling=2)
    calls = _counted(monkeypatch)
    out = np.zeros((224, 224, 3), np.uint8)
    for seed in range(60):
        left, top, right, bottom = random_resized_box(500, 375, seed)
        del calls[:]
        decode_into(data, out, crop="random_resized", seed=seed)
        share = (right - left) * (bottom - top) / (500 * bottom)
        assert calls == (["decode_region"] if share < decode_module.REGION_SHARE else ["decode_planes"]), (seed, share)
    # EXIF-turned files keep the path they had: the whole image decoded, then turned
    turned = Image.Exif()
    turned[0x0112] = 6
    buffer = io.BytesIO()
    Image.open(io.BytesIO(data)).save(buffer, "JPEG", quality=90, exif=turned.tobytes())
    for seed in range(10):
        del calls[:]
        decode_into(buffer.getvalue(), out, crop="random_resized", seed=seed)
        assert calls == ["decode"]


def test_a_file_damaged_in_the_box_falls_back_to_the_paths_before(monkeypatch):
    """Damage the region decoder meets makes it decline; the paths after it then decide, as they
    did before it existed (here: Pillow's path, which words the error)."""
    from hydrax.image import ImageError

    data = photo(1600, 1200, subsampling=2)
    cut = data[: len(data) * 3 // 4]
    calls = _counted(monkeypatch)
    out = np.zeros((224, 224, 3), np.uint8)
    outcomes = set()
    for seed in range(30):
        del calls[:]
        try:
            decode_into(cut, out, crop="random_resized", seed=seed)
        except ImageError as exc:
            assert str(exc).startswith(f"bytes of length {len(cut)}: ")
            assert calls[0] == "decode_region" and calls[-1] == "decode"  # (planes between, at full scale)
            outcomes.add("error")
        else:  # the box ends above the cut: decoded, the damage below unseen
            assert calls == ["decode_region"]
            assert random_resized_box(1600, 1200, seed)[3] < 1200 * 0.8
            outcomes.add("slot")
    assert outcomes == {"error", "slot"}


@pytest.mark.parametrize("seed", range(4))
def test_every_edge_of_a_box_the_size_of_the_image_matches(seed):
    """A box touching all four edges (the scale forced to the whole image), odd sizes, each sampling."""
    for (width, height), sampling in itertools.product([(451, 339), (230, 301)], SUBSAMPLINGS):
        data = photo(width, height, subsampling=SUBSAMPLINGS[sampling], seed=seed)
        out, expected = np.zeros((64, 80, 3), np.uint8), np.zeros((64, 80, 3), np.uint8)
        decode_into(data, out, crop="random_resized", seed=seed, scale=(1.0, 1.0), ratio=(width / height,) * 2)
        assert random_resized_box(width, height, seed, (1.0, 1.0), (width / height,) * 2) == (0, 0, width, height)
        header = jpeg.read_header(memoryview(data))
        factor = jpeg.draft_factor(header, *decode_module._draft_size(width, height, max(80 / width, 64 / height), False))
        resize_into(full_decode(data, factor), decode_module._scaled_box((0, 0, width, height), factor, width, height, 1),
                    expected, chw=False, flip=False, kind=2, colour=None)
        np.testing.assert_array_equal(out, expected, err_msg=f"{width}x{height} {sampling}")


def test_without_a_library_the_whole_image_is_decoded(monkeypatch):
    """HYDRAX_LIBJPEG set empty: no plane or region decoder; the crop is what it was before."""
    data = photo(500, 375, subsampling=2)
    out, expected = np.zeros((224, 224, 3), np.uint8), np.zeros((224, 224, 3), np.uint8)
    decode_into(data, expected, crop="random_resized", seed=3)
    monkeypatch.setenv(jpeg.LIBJPEG_ENV, "")
    jpeg.library.cache_clear()
    try:
        assert jpeg.region_library() is None
        assert jpeg.decode_region(memoryview(data), jpeg.read_header(memoryview(data)), 1, (0, 0, 10, 10)) is None
        decode_into(data, out, crop="random_resized", seed=3)
    finally:
        monkeypatch.undo()
        jpeg.library.cache_clear()
    assert jpeg.region_library() is not None
    left, top, right, bottom = random_resized_box(500, 375, 3)
    assert (right - left) * (bottom - top) < decode_module.REGION_SHARE * 500 * bottom  # the region decoder's box
    np.testing.assert_array_equal(out, expected)  # the whole RGB decode, resized over the same box
