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

from hydrax import _core, _fallback  # noqa: E402
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
    data = make()
    assert header(data) is None
    assert _core.scan_jpeg_markers(data) == _fallback.scan_jpeg_markers(data)  # the kernel and its twin


def test_the_marker_walk_kernel_and_its_twin_agree_on_what_they_keep():
    """EXIF blocks, ICC chunks and frames: the spans the kernel finds are its twin's."""
    profile = (ICC / "AdobeRGB1998.icc").read_bytes()
    files = [photo(), photo(mode="L"), photo(progressive=True), photo(exif=exif_with(6)),
             with_segment(with_segment(photo(), 0xE2, b"ICC_PROFILE\0" + bytes((1, 2)) + profile[:900]), 0xE2,
                          b"ICC_PROFILE\0" + bytes((2, 2)) + profile[900:]),
             with_segment(photo(), 0xE1, b"http://ns.adobe.com/xap/1.0/\0<x/>"), with_segment(photo(), 0xE2, b"other")]
    for data in files:
        found = _core.scan_jpeg_markers(data)
        assert found is not None and found == _fallback.scan_jpeg_markers(data)
    width, height, sampling, exif, icc = _core.scan_jpeg_markers(files[4])
    assert (width, height, len(icc), exif) == (header(files[4]).width, header(files[4]).height, 2, None)
    assert _core.scan_jpeg_markers(files[3])[3] is not None


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


# The plane decode: libjpeg-turbo's own Y, Cb and Cr, through the library Pillow brings.

def _fancy_upsample(plane: np.ndarray, across: int, down: int, height: int, width: int) -> np.ndarray:
    """libjpeg's "fancy" (triangle) upsampling of a chroma plane, in its integer arithmetic: 3/4 of
    the nearer sample and 1/4 of the next, edges repeated; both axes summed before rounding."""
    p = plane.astype(np.int32)
    if down == 2:
        above, below = np.vstack([p[:1], p[:-1]]), np.vstack([p[1:], p[-1:]])
        p = np.stack([3 * p + above, 3 * p + below], axis=1).reshape(-1, p.shape[1])
    scale = 16 if down == 2 else 4
    if across == 2:
        left, right = np.hstack([p[:, :1], p[:, :-1]]), np.hstack([p[:, 1:], p[:, -1:]])
        bias = (8, 7) if down == 2 else (1, 2)
        p = np.stack([(3 * p + left + bias[0]) // scale, (3 * p + right + bias[1]) // scale], axis=2).reshape(p.shape[0], -1)
    elif down == 2:
        p = np.stack([(p[0::2] + 1) // 4, (p[1::2] + 2) // 4], axis=1).reshape(-1, p.shape[1])  # h1v2
    return p[:height, :width]


@pytest.mark.parametrize("subsampling", [0, 1, 2], ids=["4:4:4", "4:2:2", "4:2:0"])
@pytest.mark.parametrize("size", [(48, 32), (33, 17), (501, 377), (7, 300)])
def test_the_planes_are_what_libjpeg_upsamples_and_converts(subsampling, size):
    if jpeg.library() is None:
        pytest.skip("no libjpeg-turbo of libjpeg's ABI 6.2 beside Pillow")
    data = photo(*size, subsampling=subsampling, progressive=size[0] == 33)
    found = header(data)
    assert jpeg.planar(found)
    luma, blue, red = jpeg.decode_planes(memoryview(data), found)
    (h, v), (ch, cv) = found.sampling[:2]
    assert luma.shape == size[::-1] and blue.shape == red.shape == (-(-size[1] * cv // v), -(-size[0] * ch // h))
    image = Image.open(io.BytesIO(data))
    image.draft("YCbCr", image.size)  # libjpeg's YCbCr, chroma upsampled, no colour conversion
    expected = np.asarray(image)
    np.testing.assert_array_equal(luma, expected[:, :, 0])
    for c, plane in ((1, blue), (2, red)):
        if (h, v) == (ch, cv):
            np.testing.assert_array_equal(plane, expected[:, :, c])
        else:
            np.testing.assert_array_equal(_fancy_upsample(plane, h // ch, v // cv, *size[::-1]), expected[:, :, c])


def test_files_without_ycbcr_planes_are_refused_and_damage_is_reported():
    if jpeg.library() is None:
        pytest.skip("no libjpeg-turbo of libjpeg's ABI 6.2 beside Pillow")
    gray, plain = photo(30, 20, mode="L"), photo(48, 32)
    assert not jpeg.planar(header(gray)) and jpeg.decode_planes(memoryview(gray), header(gray)) is None
    rgb = io.BytesIO()  # stored as R, G and B (Adobe's transform 0): libjpeg says so, the planes are refused
    Image.open(io.BytesIO(plain)).save(rgb, "JPEG", keep_rgb=True, quality=90)
    assert header(rgb.getvalue()).components == 3
    assert jpeg.decode_planes(memoryview(rgb.getvalue()), header(rgb.getvalue())) is None
    found = header(plain)
    for damaged in (plain[: len(plain) // 2], plain[:-2], plain[:200] + bytes(50) + plain[250:]):
        assert jpeg.decode_planes(memoryview(damaged), found) is None
    wrong = jpeg.JpegHeader(found.width + 8, found.height, 3, 1, None, found.sampling)
    assert jpeg.decode_planes(memoryview(plain), wrong) is None  # the file is not what the header said
    understated = jpeg.JpegHeader(found.width, found.height, 3, 1, None, ((1, 1),) * 3)  # 4:2:0 said to be 4:4:4
    assert jpeg.planar(understated) and jpeg.decode_planes(memoryview(plain), understated) is None
    from hydrax import _core

    layout, size = _core.jpeg_plane_layout(found.width, found.height, ((1, 1), (1, 1), (2, 2)))
    block = np.zeros(size + 16, np.uint8)
    buffer = block[-block.__array_interface__["data"][0] % 16:][:size]
    assert jpeg.library().decode_planes(memoryview(plain), found.width, found.height, ((1, 1), (1, 1), (2, 2)), buffer) == 2
    first = jpeg.decode_planes(memoryview(plain), found)
    assert np.shares_memory(first[0], jpeg.decode_planes(memoryview(plain), found)[0])


def test_the_library_and_layout_refuse_what_they_cannot_use(tmp_path):
    from hydrax import _core

    with pytest.raises(OSError, match="cannot use"):
        _core.JpegLibrary(str(tmp_path / "missing.so"))
    not_jpeg = tmp_path / "libnotjpeg.so"
    not_jpeg.write_bytes(b"\x7fELF not really")
    with pytest.raises(OSError, match="cannot use"):
        _core.JpegLibrary(str(not_jpeg))
    for sampling in (((2, 2), (1, 1)), ((5, 1), (1, 1), (1, 1)), ((0, 1), (1, 1), (1, 1))):
        with pytest.raises(ValueError, match="sampling"):
            _core.jpeg_plane_layout(10, 10, sampling)
    with pytest.raises(ValueError, match="65535"):
        _core.jpeg_plane_layout(70000, 10, ((1, 1),) * 3)
    planes, size = _core.jpeg_plane_layout(33, 17, ((2, 2), (1, 1), (1, 1)))
    assert [p[3:] for p in planes] == [(17, 33), (9, 17), (9, 17)] and all(p[0] % 16 == 0 and p[2] % 16 == 0 for p in planes)
    if jpeg.library() is not None:
        with pytest.raises(ValueError, match="16-byte aligned"):
            jpeg.library().decode_planes(memoryview(photo()), 48, 32, ((2, 2), (1, 1), (1, 1)), np.zeros(64, np.uint8))


def test_a_libjpeg_named_in_the_environment_that_cannot_be_used_is_warned_of_once(tmp_path, monkeypatch, caplog):
    """Issue 38, row 15: ``HYDRAX_LIBJPEG`` naming a file that does not exist, or one that is no
    libjpeg, used to turn the plane path off with a DEBUG line only. Now one WARNING per process
    and path names the variable and the path (and what to do); JPEGs still decode, to RGB. With
    the variable empty (none asked for) or unset, nothing is said."""
    import logging

    from hydrax.image import decode_into

    caplog.set_level(logging.DEBUG, logger=jpeg.__name__)
    not_jpeg = tmp_path / "libnotjpeg.so.62"
    not_jpeg.write_bytes(b"\x7fELF not really")
    missing = tmp_path / "missing" / "libjpeg.so.62"
    data = photo(48, 32)
    try:
        for path, reason in ((missing, "no such file"), (not_jpeg, "cannot use")):
            monkeypatch.setenv(jpeg.LIBJPEG_ENV, str(path))
            for attempt in range(2):  # asked again in this process (the choice found afresh): still said once
                caplog.clear()
                jpeg.library.cache_clear()
                assert jpeg.library() is None
                slot, pillows = np.zeros((24, 40, 3), np.uint8), np.zeros((24, 40, 3), np.uint8)
                decode_into(data, slot)  # the RGB path: Pillow's pixels exactly
                decode_into(io.BytesIO(data), pillows)
                np.testing.assert_array_equal(slot, pillows)
                warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
                if attempt == 0:
                    assert len(warnings) == 1, warnings
                    assert jpeg.LIBJPEG_ENV in warnings[0] and str(path) in warnings[0] and reason in warnings[0], warnings
                else:
                    assert warnings == [], warnings
        monkeypatch.setenv(jpeg.LIBJPEG_ENV, "")  # none asked for: the RGB path, silently
        caplog.clear()
        jpeg.library.cache_clear()
        assert jpeg.library() is None and not [r for r in caplog.records if r.levelno >= logging.WARNING]
    finally:
        monkeypatch.delenv(jpeg.LIBJPEG_ENV, raising=False)
        jpeg.library.cache_clear()
    caplog.clear()
    jpeg.library()  # Pillow's own copy, found or not: never a warning
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_the_abi_offsets_are_those_of_an_installed_jpeglib(tmp_path):
    """The byte offsets _libjpeg.h uses, against a compiler's reading of jpeglib.h where both are
    here (a 64-bit system with libjpeg's development files)."""
    import re
    import shutil
    import subprocess

    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None or not Path("/usr/include/jpeglib.h").exists():
        pytest.skip("needs a C compiler and jpeglib.h")
    source = (Path(__file__).parents[1] / "hydrax" / "_libjpeg.h").read_text()
    ours = {name: int(value) for name, value in re.findall(r"#define (HX_J(?:PEG|CS)_[A-Z_]+) (\d+)", source)}
    fields = {"HX_JPEG_ERR": "err", "HX_JPEG_IMAGE_WIDTH": "image_width", "HX_JPEG_IMAGE_HEIGHT": "image_height",
              "HX_JPEG_NUM_COMPONENTS": "num_components", "HX_JPEG_COLOR_SPACE": "jpeg_color_space",
              "HX_JPEG_OUT_COLOR_SPACE": "out_color_space", "HX_JPEG_SCALE_NUM": "scale_num",
              "HX_JPEG_SCALE_DENOM": "scale_denom", "HX_JPEG_OUTPUT_COMPONENTS": "output_components",
              "HX_JPEG_RAW_DATA_OUT": "raw_data_out", "HX_JPEG_DCT_METHOD": "dct_method",
              "HX_JPEG_OUTPUT_WIDTH": "output_width", "HX_JPEG_OUTPUT_HEIGHT": "output_height",
              "HX_JPEG_OUTPUT_SCANLINE": "output_scanline"}
    fields["HX_JPEG_COMP_INFO"] = "comp_info"
    lines = [f'printf("{name} %zu\\n", offsetof(struct jpeg_decompress_struct, {field}));' for name, field in fields.items()]
    lines += ['printf("HX_JPEG_COMPONENT_SIZE %zu\\n", sizeof(jpeg_component_info));',
              'printf("HX_JPEG_H_SAMP %zu\\n", offsetof(jpeg_component_info, h_samp_factor));',
              'printf("HX_JPEG_V_SAMP %zu\\n", offsetof(jpeg_component_info, v_samp_factor));',
              'printf("HX_JPEG_COMPONENT_NEEDED %zu\\n", offsetof(jpeg_component_info, component_needed));']
    lines += ['printf("HX_JPEG_STRUCT_SIZE %zu\\n", sizeof(struct jpeg_decompress_struct));',
              'printf("HX_JPEG_ERROR_SIZE %zu\\n", sizeof(struct jpeg_error_mgr));',
              'printf("HX_JPEG_ERROR_EXIT %zu\\n", offsetof(struct jpeg_error_mgr, error_exit));',
              'printf("HX_JPEG_EMIT_MESSAGE %zu\\n", offsetof(struct jpeg_error_mgr, emit_message));',
              'printf("HX_JPEG_ABI %d\\n", JPEG_LIB_VERSION);',
              'printf("HX_JCS_GRAYSCALE %d\\n", (int)JCS_GRAYSCALE);', 'printf("HX_JCS_RGB %d\\n", (int)JCS_RGB);',
              'printf("HX_JCS_YCBCR %d\\n", (int)JCS_YCbCr);']
    program = tmp_path / "offsets.c"
    program.write_text("#include <stdio.h>\n#include <stddef.h>\n#include <jpeglib.h>\nint main(void) {\n"
                       + "\n".join(lines) + "\nreturn 0;\n}\n")
    subprocess.run([compiler, str(program), "-o", str(tmp_path / "offsets")], check=True)
    theirs = dict(line.split() for line in subprocess.run([str(tmp_path / "offsets")], capture_output=True, text=True,
                                                          check=True).stdout.splitlines())
    if theirs["HX_JPEG_ABI"] != "62":
        pytest.skip(f"the installed jpeglib.h is libjpeg's ABI {theirs['HX_JPEG_ABI']}, not 6.2")
    assert {name: int(value) for name, value in theirs.items()} == {name: ours[name] for name in theirs}
