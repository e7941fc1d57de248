"""Mutation fuzzing of the image header kernels (``_core.read_image_header``, ``_core.read_image_headers``,
``_core.scan_jpeg_markers``).

Valid JPEG (baseline, progressive, gray, with EXIF in either byte order, with fill bytes and
standalone markers), PNG, WebP (lossy, lossless, extended with alpha) and GIF headers are
mutated: bytes flipped, cut, spliced, and the fields the kernel reads rewritten (JPEG marker
codes and segment lengths, frame sizes, the EXIF block's byte order, IFD offset, entry count,
type and value; PNG's IHDR length, type and size; WebP chunk names, sizes, start codes and
signatures; GIF sizes), so that the damage reaches every branch instead of stopping at the
signature. For every mutant:

- the kernels return, never crash or hang (each batch runs in a child process with a deadline);
- they agree with their pure-Python twins in ``hydrax/_fallback.py`` on every output, and so
  does ``_core.scan_jpeg_markers`` (the marker walk of the decoder's ``read_header``);
- a size they report is positive, with an orientation of 1-8; a failure reports no size and an
  offset inside the data;
- the same bytes as a span of a larger buffer, with other bytes after them, give the same
  result: the kernel reads nothing past the span;
- ``hydrax.image.image_size`` gives that size or an ``ImageError``, and a JPEG that
  ``hydrax.image.jpeg.read_header`` reads has the same size and orientation there.

``HYDRAX_FUZZ`` sets the mutants per original (see ``tests/support/fuzzing.py``). A failure prints the
seed and mutant number, and ``python tests/test_fuzz_image_sizes.py SEED FIRST COUNT`` replays it.
"""

from __future__ import annotations

import io
import random
import struct
import sys

import numpy as np
import pytest

from support.fuzzing import batches, run_isolated


def _encoded(mode: str, size: tuple[int, int], fmt: str, **options) -> bytes:
    from PIL import Image

    rng = np.random.default_rng(5)
    image = Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), np.uint8)).convert(mode)
    buffer = io.BytesIO()
    image.save(buffer, fmt, **options)
    return buffer.getvalue()


def _exif(orientation: int, order: str) -> bytes:
    """An EXIF APP1 body: a TIFF block in byte ``order`` with a short IFD0 holding the orientation."""
    mark = b"II" if order == "<" else b"MM"
    entries = [(0x010F, 2, 4, struct.pack(order + "I", 0x1A)), (0x0112, 3, 1, struct.pack(order + "HH", orientation, 0))]
    ifd = struct.pack(order + "H", len(entries)) + b"".join(struct.pack(order + "HHI", t, k, c) + v for t, k, c, v in entries)
    return b"Exif\0\0" + mark + struct.pack(order + "HI", 42, 8) + ifd + bytes(4) + b"cam\0"


def originals() -> dict[str, bytes]:
    """The valid images the mutants start from (only their first few hundred bytes matter)."""
    plain = _encoded("RGB", (40, 24), "JPEG")
    app1 = _exif(6, ">")
    made = {
        "jpeg": plain,
        "jpeg-progressive": _encoded("RGB", (24, 40), "JPEG", progressive=True),
        "jpeg-gray": _encoded("L", (17, 9), "JPEG"),
        "jpeg-exif-ii": _encoded("RGB", (30, 20), "JPEG", exif=_exif(8, "<")),
        "jpeg-exif-mm": plain[:2] + b"\xff\xe1" + struct.pack(">H", 2 + len(app1)) + app1 + plain[2:],
        # fill bytes, a restart marker, TEM, a comment and a DAC before the rest
        "jpeg-markers": plain[:2] + b"\xff\xff\xff\xd3\xff\x01\xff\xfe\x00\x05abc\xff\xcc\x00\x04\x00\x00" + plain[2:],
        "png": _encoded("RGBA", (33, 12), "PNG"),
        "webp": _encoded("RGB", (50, 30), "WEBP", quality=50),
        "webp-lossless": _encoded("RGB", (7, 90), "WEBP", lossless=True),
        "webp-alpha": _encoded("RGBA", (64, 20), "WEBP", quality=50),
        "gif": _encoded("P", (19, 23), "GIF"),
    }
    return made


def _jpeg_segments(data: bytes) -> list[int]:
    """Offsets of the 0xFF of each marker segment of a valid JPEG, up to its first scan."""
    found, at = [], 2
    while at + 4 <= len(data):
        while at < len(data) and data[at] == 0xFF and data[at + 1] == 0xFF:
            at += 1
        marker = data[at + 1]
        found.append(at)
        if marker == 0x01 or 0xD0 <= marker <= 0xD7:
            at += 2
            continue
        if marker == 0xDA:
            break
        at += 2 + struct.unpack_from(">H", data, at + 2)[0]
    return found


def _rewrite_jpeg(out: bytearray, segments: list[int], rng: random.Random) -> None:
    at = rng.choice(segments)
    field = rng.randrange(6)
    if field == 0:  # the marker code
        out[at + 1] = rng.choice([0x00, 0x01, 0x02, 0xBF, 0xC0, 0xC3, 0xC4, 0xC8, 0xCC, 0xCF, 0xD0, 0xD8, 0xD9, 0xDA, 0xE1,
                                  0xFE, 0xFF, rng.randrange(256)])
    elif field == 1 and at + 4 <= len(out):  # the length
        out[at + 2 : at + 4] = struct.pack(">H", rng.choice([0, 1, 2, 3, 7, 8, 0xFFFF, rng.randrange(0x10000)]))
    elif field == 2 and at + 9 <= len(out):  # a frame's height and width, as if it were one
        out[at + 5 : at + 9] = struct.pack(">HH", rng.choice([0, 1, 0xFFFF, rng.randrange(0x10000)]),
                                           rng.choice([0, 1, 0xFFFF, rng.randrange(0x10000)]))
    elif field == 3:  # fill bytes or standalone markers before it
        out[at:at] = rng.choice([b"\xff" * rng.randrange(1, 9), b"\xff\xd0", b"\xff\x01", b"\x00", b"\xff\x00"])
    else:  # the EXIF block, when there is one
        exif = bytes(out).find(b"Exif\0\0")
        if exif < 0:
            return
        tiff, offset = exif + 6, rng.choice([0, 2, 4, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30, 32])
        value = rng.choice([b"II", b"MM", b"\x2a\x00", b"\x00\x2a", b"\x00\x00", b"\xff\xff", b"\x01\x12", b"\x12\x01",
                            b"\x00\x03", b"\x00\x04", b"\x00\x09", rng.randbytes(2)])
        out[tiff + offset : tiff + offset + 2] = value


def _rewrite_other(out: bytearray, kind: str, rng: random.Random) -> None:
    def word(width: int) -> bytes:
        return rng.choice([bytes(width), b"\xff" * width, rng.randbytes(width), (1).to_bytes(width, "little")])

    if kind == "png":
        at = rng.choice([8, 12, 16, 20])
        out[at : at + 4] = rng.choice([word(4), b"IDAT", b"\0\0\0\x0d", b"\x80\0\0\0", b"\x7f\xff\xff\xff"])
    elif kind.startswith("webp"):
        at = rng.choice([4, 12, 16, 20, 23, 24, 26, 28])
        out[at : at + 4] = rng.choice([word(4), b"VP8 ", b"VP8L", b"VP8X", b"ALPH", b"\x9d\x01\x2a\x00", b"\x2f\xff\xff\xff"])
    else:  # gif
        at = rng.choice([4, 6, 8])
        out[at : at + 2] = word(2)


def mutate(data: bytes, kind: str, rng: random.Random) -> bytes:
    """One mutant of the ``kind`` image ``data``; damage falls mostly on its first bytes."""
    out = bytearray(data)
    near = min(len(out), 400)
    op = rng.randrange(6)
    if op == 0:  # cut short
        del out[rng.randrange(near) :]
    elif op == 1:  # bit flips
        for _ in range(rng.randint(1, 6)):
            out[rng.randrange(near)] ^= 1 << rng.randrange(8)
    elif op == 2:  # bytes inserted, deleted or overwritten
        at, span = rng.randrange(near), rng.randint(1, 24)
        choice = rng.randrange(3)
        if choice == 0:
            out[at:at] = rng.randbytes(span)
        elif choice == 1:
            del out[at : at + span]
        else:
            out[at : at + span] = rng.randbytes(span)
    else:  # the fields the kernel reads, rewritten (and then perhaps cut)
        segments = _jpeg_segments(data) if kind.startswith("jpeg") else []
        for _ in range(rng.randint(1, 3)):
            if segments:
                _rewrite_jpeg(out, segments, rng)
            else:
                _rewrite_other(out, kind, rng)
        if rng.random() < 0.3:
            del out[rng.randrange(min(len(out), 400) or 1) :]
    return bytes(out)


def check(data: bytes, rng: random.Random) -> None:
    """Everything that must hold for any input (see the module docstring)."""
    from hydrax import _core, _fallback
    from hydrax.image import ImageError, image_size
    from hydrax.image.jpeg import read_header

    result = _core.read_image_header(data)
    twin = _fallback.read_image_header(data)
    assert result == twin, f"kernel {result} != twin {twin}"
    status, fmt, width, height, orientation, offset = result
    if status == 0:
        assert width > 0 and height > 0 and 1 <= orientation <= 8 and fmt != 0, result
    else:
        assert width == height == orientation == 0 and 0 <= offset <= len(data), result
    # the same bytes as a span of a larger buffer, with a valid image after them
    before, after = rng.randbytes(rng.randrange(4)), b"\xff\xc0\x00\x11\x08\x00\x10\x00\x10" + bytes(64)
    outputs = [np.zeros(1, dtype) for dtype in (np.uint8, np.uint8, np.int32, np.int32, np.uint8, np.int64)]
    _core.read_image_headers(before + data + after, np.array([len(before)], np.int64), np.array([len(data)], np.int64),
                             *outputs)
    assert tuple(int(column[0]) for column in outputs) == result, "the span's result differs: read past its end?"
    try:
        size = image_size(data)
    except ImageError as exc:
        assert status != 0 and str(exc).startswith(f"bytes of length {len(data)}: "), (result, str(exc))
    else:
        assert status == 0 and size == ((height, width) if orientation >= 5 else (width, height))
    markers = _core.scan_jpeg_markers(data)
    assert markers == _fallback.scan_jpeg_markers(data), f"markers {markers} != twin {_fallback.scan_jpeg_markers(data)}"
    if fmt == 1:
        header = read_header(memoryview(data))
        if header is not None:
            assert status == 0 and (header.width, header.height, header.orientation) == (width, height, orientation), result


def run(seed: int, first: int, count: int) -> None:
    """Check mutants ``first .. first + count`` of every original for ``seed`` (in this process)."""
    for kind, data in originals().items():
        for n in range(first, first + count):
            rng = random.Random(f"{seed}/{kind}/{n}")
            mutant = mutate(data, kind, rng)
            print(f"CASE {kind} {n}", flush=True)
            try:
                check(mutant, rng)
            except AssertionError as exc:
                raise AssertionError(f"seed {seed}, {kind} mutant {n}: {exc}") from None


@pytest.mark.fuzz
@pytest.mark.parametrize("first", batches())
def test_no_mutant_crashes_hangs_or_disagrees_with_the_twin(first):
    run_isolated(__file__, first)


def test_the_originals_read_cleanly():
    from hydrax import _core

    for kind, data in originals().items():
        check(data, random.Random(kind))
        assert _core.read_image_header(data)[0] == 0, kind


if __name__ == "__main__":
    run(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
