"""hydrax.image.jpeg: the JPEG markers the fast path reads, the files it leaves to Pillow, and
libjpeg-turbo's pixels against Pillow's."""

from __future__ import annotations

import io
import random
import struct
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("PIL")
from PIL import Image, ImageOps  # noqa: E402

from hydrax.image import jpeg  # noqa: E402

ICC = Path(__file__).parent / "data" / "icc"


def photo(width=48, height=32, *, mode="RGB", **options) -> bytes:
    rng = np.random.default_rng(width * 1000 + height)
    coarse = rng.integers(0, 256, (height // 8 + 1, width // 8 + 1, 3), np.uint8)
    image = Image.fromarray(coarse).resize((width, height), Image.Resampling.BICUBIC).convert(mode)
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", quality=90, **options)
    return buffer.getvalue()


def exif_with(orientation: int) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    return exif.tobytes()


def header(data: bytes, max_pixels=None):
    return jpeg.read_header(memoryview(data), max_pixels)


def segment(marker: int, body: bytes) -> bytes:
    return bytes((0xFF, marker)) + struct.pack(">H", 2 + len(body)) + body


def with_segment(data: bytes, marker: int, body: bytes) -> bytes:
    """``data`` with one more marker segment right after SOI."""
    return data[:2] + segment(marker, body) + data[2:]


def test_a_plain_jpeg_gives_its_size_components_and_no_profile():
    found = header(photo(48, 32))
    assert (found.width, found.height, found.components, found.orientation, found.icc_profile) == (48, 32, 3, 1, None)
    assert header(photo(20, 10, mode="L")).components == 1
    assert header(photo(40, 24, progressive=True)).width == 40


@pytest.mark.parametrize("orientation", range(1, 9))
def test_the_exif_orientation_is_read_and_upright_turns_pixels_as_pillow_does(orientation):
    data = photo(40, 24, exif=exif_with(orientation))
    found = header(data)
    assert found.orientation == orientation
    pixels = jpeg.decode(memoryview(data), found)
    expected = np.asarray(ImageOps.exif_transpose(Image.open(io.BytesIO(data))))
    np.testing.assert_array_equal(jpeg.upright(pixels, orientation), expected)


def test_big_endian_exif_is_read_too():
    tiff = b"MM\0\x2a" + struct.pack(">I", 8) + struct.pack(">H", 1) + struct.pack(">HHIHH", 0x0112, 3, 1, 6, 0) + b"\0" * 4
    assert header(with_segment(photo(), 0xE1, b"Exif\0\0" + tiff)).orientation == 6


def test_an_icc_profile_split_over_app2_chunks_is_joined_in_sequence_order():
    profile = (ICC / "AdobeRGB1998.icc").read_bytes()
    base = photo()
    half = len(profile) // 2
    chunks = [b"ICC_PROFILE\0" + bytes((2, 2)) + profile[half:], b"ICC_PROFILE\0" + bytes((1, 2)) + profile[:half]]
    data = with_segment(with_segment(base, 0xE2, chunks[1]), 0xE2, chunks[0])  # the second comes first
    assert header(data).icc_profile == profile
    assert Image.open(io.BytesIO(data)).info["icc_profile"] == profile
    # a wrong count: no profile, as Pillow reads it
    wrong = with_segment(base, 0xE2, b"ICC_PROFILE\0" + bytes((1, 3)) + profile)
    assert header(wrong).icc_profile is None and Image.open(io.BytesIO(wrong)).info["icc_profile"] is None


def _forged_frame(data: bytes, marker: int | None = None, precision: int | None = None, components: int | None = None) -> bytes:
    out = bytearray(data)
    at = data.index(b"\xff\xc0")
    if marker is not None:
        out[at + 1] = marker
    if precision is not None:
        out[at + 4] = precision
    if components is not None:
        out[at + 9] = components
    return bytes(out)


@pytest.mark.parametrize("make", [
    pytest.param(lambda: b"\x89PNG\r\n\x1a\n" + b"\0" * 32, id="png"),
    pytest.param(lambda: photo(mode="CMYK"), id="cmyk"),
    pytest.param(lambda: _forged_frame(photo(), precision=12), id="12-bit"),
    pytest.param(lambda: _forged_frame(photo(), marker=0xC9), id="arithmetic"),
    pytest.param(lambda: _forged_frame(photo(), marker=0xC3), id="lossless"),
    pytest.param(lambda: photo()[:100], id="cut-before-the-scan"),
    pytest.param(lambda: with_segment(photo(exif=exif_with(6)), 0xE1, b"Exif\0\0" + exif_with(3)[6:]), id="two-exif-blocks"),
    pytest.param(lambda: with_segment(photo(), 0xE1, b"http://ns.adobe.com/xap/1.0/\0<x tiff:Orientation=\"6\"/>"), id="xmp-orientation"),
    pytest.param(lambda: with_segment(photo(), 0xE2, b"MPF\0II*\0"), id="multi-picture"),
    pytest.param(lambda: with_segment(photo(), 0xE1, b"Exif\0\0XX*\0"), id="unreadable-exif"),
    pytest.param(lambda: with_segment(photo(), 0xE1, b"Exif\0\0II*\0\x08\0\0\0\x05\0"), id="exif-entries-past-the-end"),
    pytest.param(lambda: photo(exif=exif_with(9)), id="orientation-9"),
    pytest.param(lambda: photo()[:2] + b"\xff\xd0" + photo()[2:], id="stray-restart-marker"),
    pytest.param(lambda: with_segment(photo(), 0xE2, b"ICC_PROFILE\0\x01"), id="icc-chunk-too-short"),
])
def test_files_the_fast_path_leaves_to_pillow(make):
    assert header(make()) is None


def test_more_pixels_than_the_limit_are_left_to_pillow():
    data = photo(48, 32)
    assert header(data, max_pixels=48 * 32) is not None
    assert header(data, max_pixels=48 * 32 - 1) is None


@pytest.mark.parametrize(("size", "wanted"), [((400, 300), (200, 150)), ((400, 300), (201, 150)), ((401, 301), (100, 75)),
                                              ((1000, 700), (120, 80)), ((64, 48), (1, 1)), ((33, 17), (5, 9))])
def test_the_draft_factor_and_decoded_pixels_are_pillows(size, wanted):
    data = photo(*size)
    found = header(data)
    factor = jpeg.draft_factor(found, *wanted)
    image = Image.open(io.BytesIO(data))
    image.draft("RGB", wanted)
    image.load()
    pixels = jpeg.decode(memoryview(data), found, factor)
    assert pixels.shape[:2] == (image.height, image.width)
    np.testing.assert_array_equal(pixels, np.asarray(image))


def test_decode_reuses_the_threads_buffer_and_refuses_damage():
    data = photo(48, 32)
    found = header(data)
    first = jpeg.decode(memoryview(data), found)
    second = jpeg.decode(memoryview(data), found)
    assert np.shares_memory(first, second)
    assert jpeg.decode(memoryview(data[: len(data) // 2]), found) is None  # libjpeg-turbo's warning is enough


def test_gray_decodes_to_one_channel_equal_to_pillows():
    data = photo(30, 20, mode="L")
    pixels = jpeg.decode(memoryview(data), header(data))
    np.testing.assert_array_equal(pixels[:, :, 0], np.asarray(Image.open(io.BytesIO(data))))


def test_read_header_never_raises_on_mutants():
    rng = random.Random(5)
    originals = [photo(exif=exif_with(6), icc_profile=(ICC / "sRGB.icc").read_bytes()), photo(progressive=True)]
    for n in range(3000):
        data = bytearray(rng.choice(originals))
        for _ in range(rng.randint(1, 8)):
            at = rng.randrange(min(len(data), 800))
            data[at] = rng.randrange(256) if rng.random() < 0.7 else 0xFF
        if n % 3 == 0:
            del data[rng.randrange(len(data)) :]
        found = header(bytes(data))
        assert found is None or (found.width >= 1 and found.height >= 1 and 1 <= found.orientation <= 8)
