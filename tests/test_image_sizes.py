"""hydrax.image.sizes: image sizes read from headers, against Pillow's, the kernel against its twin.

Real images of every format and mode Pillow writes (JPEG baseline, progressive, gray, CMYK, with
EXIF orientations 1-8; PNG in every bit depth; WebP lossy, lossless and with alpha; GIF) must
give the size Pillow gives once ``ImageOps.exif_transpose`` has turned them, the kernel
(``_core.read_image_header``) must agree with its twin in ``hydrax/_fallback.py`` on every
output, and on JPEGs with ``hydrax.image.jpeg.read_header`` wherever that reads a header.
"""

from __future__ import annotations

import io
import struct

import numpy as np
import pytest

pytest.importorskip("PIL")
from PIL import Image, ImageOps  # noqa: E402

from hydrax import _core, _fallback  # noqa: E402
from hydrax.image import ImageError, ImageHeader, SizeStatus, image_header, image_size, image_sizes, image_sizes_in  # noqa: E402
from hydrax.image import jpeg  # noqa: E402


def encoded(mode: str, size: tuple[int, int], fmt: str, **options) -> bytes:
    rng = np.random.default_rng(size[0] * 7919 + size[1])
    image = Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), np.uint8)).convert(mode)
    buffer = io.BytesIO()
    image.save(buffer, fmt, **options)
    return buffer.getvalue()


def exif_with(orientation: int) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    return exif.tobytes()


def pillow_size(data: bytes) -> tuple[int, int]:
    """What Pillow says the upright size is (it decodes the image to turn it)."""
    return ImageOps.exif_transpose(Image.open(io.BytesIO(data))).size


SIZES = [(1, 1), (37, 5), (5, 300), (640, 481)]
CASES = {
    **{f"jpeg-{w}x{h}": encoded("RGB", (w, h), "JPEG") for w, h in SIZES},
    "jpeg-progressive": encoded("RGB", (99, 61), "JPEG", progressive=True),
    "jpeg-gray": encoded("L", (31, 70), "JPEG"),
    "jpeg-cmyk": encoded("CMYK", (40, 23), "JPEG"),
    "jpeg-444": encoded("RGB", (50, 20), "JPEG", subsampling=0, quality=95),
    "jpeg-optimized": encoded("RGB", (66, 44), "JPEG", optimize=True),
    **{f"jpeg-orientation-{o}": encoded("RGB", (48, 30), "JPEG", exif=exif_with(o)) for o in range(1, 9)},
    **{f"jpeg-progressive-orientation-{o}": encoded("RGB", (33, 71), "JPEG", exif=exif_with(o), progressive=True)
       for o in (3, 6, 8)},
    **{f"png-{mode}": encoded(mode, (45, 27), "PNG") for mode in ("1", "L", "LA", "P", "RGB", "RGBA", "I;16")},
    "png-wide": encoded("L", (70000, 1), "PNG"),
    "png-optimized": encoded("RGB", (21, 34), "PNG", optimize=True),
    **{f"webp-lossy-{w}x{h}": encoded("RGB", (w, h), "WEBP", quality=70) for w, h in SIZES},
    "webp-lossless": encoded("RGB", (77, 13), "WEBP", lossless=True),
    "webp-lossless-alpha": encoded("RGBA", (13, 77), "WEBP", lossless=True),
    "webp-alpha": encoded("RGBA", (64, 48), "WEBP", quality=60),  # VP8X, then ALPH and VP8
    "webp-large": encoded("RGB", (16383, 2), "WEBP", quality=10),
    "gif": encoded("P", (90, 45), "GIF"),
    "gif-gray": encoded("L", (3, 200), "GIF"),
    "gif-transparent": encoded("P", (8, 9), "GIF", transparency=0),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_size_is_pillows_upright_size_and_the_kernel_agrees_with_its_twin(name):
    data = CASES[name]
    assert image_size(data) == pillow_size(data)
    assert _core.read_image_header(data) == _fallback.read_image_header(data)
    assert image_header(data).format.upper() == Image.open(io.BytesIO(data)).format


@pytest.mark.parametrize("name", sorted(name for name in CASES if name.startswith("jpeg")))
def test_jpegs_agree_with_the_fast_paths_marker_reader(name):
    data = CASES[name]
    found = jpeg.read_header(memoryview(data))
    header = image_header(data)
    if found is not None:
        assert (header.width, header.height, header.orientation) == (found.width, found.height, found.orientation)
    assert (header.width, header.height) == Image.open(io.BytesIO(data)).size


@pytest.mark.parametrize("orientation", range(1, 9))
def test_orientations_five_to_eight_swap_width_and_height(orientation):
    header = image_header(CASES[f"jpeg-orientation-{orientation}"])
    assert header == ImageHeader("JPEG", 48, 30, orientation)
    assert header.upright_size == ((30, 48) if orientation >= 5 else (48, 30))


def _tiff(order: str, kind: int, count: int, value: int) -> bytes:
    """A TIFF block whose IFD0 holds one orientation entry of the given type, count and value."""
    value_field = struct.pack(order + ("HH" if kind == 3 else "I"), *((value, 0) if kind == 3 else (value,)))
    return (b"II" if order == "<" else b"MM") + struct.pack(order + "HIHHHI", 42, 8, 1, 0x0112, kind, count) + value_field + bytes(4)


def _with_app1(data: bytes, body: bytes) -> bytes:
    return data[:2] + b"\xff\xe1" + struct.pack(">H", 2 + len(body)) + body + data[2:]


@pytest.mark.parametrize("order", ["<", ">"])
@pytest.mark.parametrize("kind, count, value, expected", [
    (3, 1, 6, 6), (4, 1, 8, 8), (3, 1, 0, 1), (3, 1, 9, 1), (3, 2, 6, 1), (5, 1, 6, 1),
])
def test_exif_orientations_are_read_as_pillow_reads_them(order, kind, count, value, expected):
    data = _with_app1(encoded("RGB", (20, 10), "JPEG"), b"Exif\0\0" + _tiff(order, kind, count, value))
    assert _core.read_image_header(data) == _fallback.read_image_header(data)
    assert image_header(data).orientation == expected
    if kind in (3, 4) and count == 1:  # Pillow also turns by the first of several values (with a warning)
        assert image_size(data) == pillow_size(data)


def test_only_the_first_exif_block_counts_and_damaged_ones_read_as_upright():
    plain = encoded("RGB", (20, 10), "JPEG")
    twice = _with_app1(_with_app1(plain, b"Exif\0\0" + _tiff("<", 3, 1, 3)), b"Exif\0\0" + _tiff("<", 3, 1, 6))
    assert image_header(twice).orientation == 6
    for body in (b"Exif\0\0", b"Exif\0\0XX*\0", b"Exif\0\0II*\0\xff\xff\xff\xff", b"Exif\0\0II+\0\x08\0\0\0"):
        assert image_header(_with_app1(plain, body)) == ImageHeader("JPEG", 20, 10, 1)


def _jpeg_with_frame(marker: int, width: int, height: int, before: bytes = b"") -> bytes:
    frame = bytes([0xFF, marker]) + struct.pack(">HBHHB", 11, 8, height, width, 1) + b"\x01\x11\x00"
    scan = b"\xff\xda" + struct.pack(">HB", 8, 1) + b"\x01\x00\x00\x3f\x00"
    return b"\xff\xd8" + before + frame + scan + b"\x00" * 4 + b"\xff\xd9"


@pytest.mark.parametrize("marker", [0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF])
def test_every_start_of_frame_marker_gives_the_size(marker):
    data = _jpeg_with_frame(marker, 300, 7)
    assert image_header(data) == ImageHeader("JPEG", 300, 7, 1)
    assert _core.read_image_header(data) == _fallback.read_image_header(data)
    assert Image.open(io.BytesIO(data)).size == (300, 7)


def test_tables_fill_bytes_and_standalone_markers_before_the_frame_are_skipped():
    dht, dac, jpg = (bytes([0xFF, m]) + struct.pack(">H", 6) + b"abcd" for m in (0xC4, 0xCC, 0xC8))
    before = dht + b"\xff\xff\xff" + dac + b"\xff\xd0\xff\x01" + jpg + b"\xff\xfe\x00\x04hi"  # COM too
    data = _jpeg_with_frame(0xC0, 12, 34, before)
    assert image_header(data) == ImageHeader("JPEG", 12, 34, 1)
    assert _core.read_image_header(data) == _fallback.read_image_header(data)


@pytest.mark.parametrize("data, status, offset", [
    (b"", SizeStatus.UNKNOWN_FORMAT, 0),
    (b"BM\0\0\0\0", SizeStatus.UNKNOWN_FORMAT, 0),
    (b"\xff\xd8", SizeStatus.TRUNCATED, 2),
    (b"\xff\xd8\x00", SizeStatus.BAD_MARKER, 2),
    (b"\xff\xd8\xff\xe0\x00\x10JFIF", SizeStatus.TRUNCATED, 2),
    (b"\xff\xd8\xff\xe0\x00\x01", SizeStatus.BAD_LENGTH, 2),
    (b"\xff\xd8\xff\xc0\x00\x07\x08\x00\x01\x00\x01", SizeStatus.BAD_LENGTH, 2),
    (b"\xff\xd8\xff\xd9", SizeStatus.NO_SIZE, 2),
    (b"\xff\xd8\xff\x00", SizeStatus.BAD_MARKER, 2),
    (b"\xff\xd8\xff\x02\x00\x02", SizeStatus.BAD_MARKER, 2),
    (_jpeg_with_frame(0xC0, 0, 10), SizeStatus.BAD_SIZE, 2),
    (_jpeg_with_frame(0xC2, 10, 0), SizeStatus.BAD_SIZE, 2),
    (b"\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR\0\0", SizeStatus.TRUNCATED, 8),
    (b"\x89PNG\r\n\x1a\n\0\0\0\x0dIDAT" + bytes(8), SizeStatus.NO_SIZE, 8),
    (b"\x89PNG\r\n\x1a\n\0\0\0\x0cIHDR" + bytes(3) + b"\x05\0\0\0\x05", SizeStatus.BAD_LENGTH, 8),
    (b"\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR" + bytes(4) + b"\0\0\0\x05", SizeStatus.BAD_SIZE, 8),
    (b"\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR\x80\0\0\0\0\0\0\x05", SizeStatus.BAD_SIZE, 8),
    (b"RIFF\0\0\0\0WEBPVP8 ", SizeStatus.TRUNCATED, 12),
    (b"RIFF\0\0\0\0WEBPALPH\x10\0\0\0" + bytes(16), SizeStatus.NO_SIZE, 12),
    (b"RIFF\0\0\0\0WEBPVP8 \x04\0\0\0" + bytes(16), SizeStatus.BAD_LENGTH, 12),
    (b"RIFF\0\0\0\0WEBPVP8 \x10\0\0\0" + bytes(16), SizeStatus.BAD_SIGNATURE, 23),
    (b"RIFF\0\0\0\0WEBPVP8L\x10\0\0\0\x2e" + bytes(15), SizeStatus.BAD_SIGNATURE, 20),
    (b"RIFF\0\0\0\0WEBPVP8L\x10\0\0\0\x2f\0\0\0\x20" + bytes(11), SizeStatus.BAD_SIGNATURE, 20),
    (b"RIFF\0\0\0\0WEBPVP8X\x0a\0\0\0" + bytes(5), SizeStatus.TRUNCATED, 12),
    (b"GIF89a\x05\0", SizeStatus.TRUNCATED, 6),
    (b"GIF87a\0\0\x05\0", SizeStatus.BAD_SIZE, 6),
])
def test_damaged_headers_give_a_status_and_an_offset(data, status, offset):
    assert _core.read_image_header(data) == _fallback.read_image_header(data)
    assert _core.read_image_header(data)[0] == status and _core.read_image_header(data)[5] == offset
    with pytest.raises(ImageError) as caught:
        image_size(data)
    message = str(caught.value)
    assert message.startswith(f"bytes of length {len(data)}: ")
    if status != SizeStatus.UNKNOWN_FORMAT:
        assert f"at byte offset {offset}" in message


def test_the_words_say_what_is_wrong():
    with pytest.raises(ImageError, match="truncated JPEG: the data ends before the image's size"):
        image_size(CASES["jpeg-37x5"][:100])
    with pytest.raises(ImageError, match="not a JPEG, PNG, WebP or GIF"):
        image_size(b"hello world")
    with pytest.raises(ImageError, match="no data"):
        image_size(b"")
    with pytest.raises(ImageError, match="its first chunk, at byte offset 8, is not IHDR"):
        image_size(b"\x89PNG\r\n\x1a\n\0\0\0\x0dIDAT" + bytes(8))


def test_any_buffer_is_read():
    data = CASES["jpeg-orientation-6"]
    array = np.frombuffer(data, np.uint8)
    strided = np.repeat(array, 2)[::2]
    assert not strided.flags.c_contiguous
    for form in (data, bytearray(data), memoryview(data), array, strided, array.reshape(1, -1), array.view(np.int8)):
        assert image_size(form) == (30, 48)


def test_the_batch_forms_give_a_status_per_image_and_never_raise():
    names = sorted(CASES)
    buffers = [CASES[name] for name in names] + [b"", b"junk", CASES["png-RGB"][:20]]
    sizes = image_sizes(buffers)
    assert sizes.widths.dtype == np.int32 and sizes.heights.dtype == np.int32 and sizes.statuses.dtype == np.uint8
    assert list(zip(sizes.widths.tolist(), sizes.heights.tolist()))[: len(names)] == [pillow_size(CASES[n]) for n in names]
    assert sizes.statuses.tolist() == [0] * len(names) + [SizeStatus.UNKNOWN_FORMAT, SizeStatus.UNKNOWN_FORMAT,
                                                          SizeStatus.TRUNCATED]
    assert (sizes.widths[len(names):] == 0).all() and (sizes.heights[len(names):] == 0).all()

    joined = b"".join(buffers)
    ends = np.cumsum([len(b) for b in buffers])
    offsets, lengths = np.concatenate([[0], ends[:-1]]), np.array([len(b) for b in buffers])
    spans = image_sizes_in(joined, offsets, lengths)
    for ours, theirs in zip(spans, sizes):
        assert np.array_equal(ours, theirs)
    assert image_sizes([]).widths.shape == (0,)


def test_spans_outside_the_buffer_are_reported_and_the_kernel_matches_its_twin():
    data = b"\0" * 8 + CASES["gif"] + CASES["webp-alpha"]
    starts = np.array([8, 8 + len(CASES["gif"]), -1, 0, len(data), len(data) + 1, 5, 2**62], np.int64)
    lengths = np.array([len(CASES["gif"]), len(CASES["webp-alpha"]), 5, len(data) + 1, 0, 0, 2**63 - 1, 2**62], np.int64)
    outputs = [np.zeros(len(starts), dtype) for dtype in (np.uint8, np.uint8, np.int32, np.int32, np.uint8, np.int64)]
    assert _core.read_image_headers(data, starts, lengths, *outputs) == 2
    for ours, theirs in zip(outputs, _fallback.read_image_headers(data, starts, lengths)):
        assert np.array_equal(ours, theirs)
    assert outputs[0].tolist() == [0, 0] + [SizeStatus.OUTSIDE_DATA] * 2 + [SizeStatus.UNKNOWN_FORMAT] + [SizeStatus.OUTSIDE_DATA] * 3
    assert outputs[2][:2].tolist() == [90, 64] and outputs[3][:2].tolist() == [45, 48]
    with pytest.raises(ValueError):
        image_sizes_in(data, [0, 1], [3])
    with pytest.raises(ValueError):
        _core.read_image_headers(data, starts, lengths[:3], *outputs)
