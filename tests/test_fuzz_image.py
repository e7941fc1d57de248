"""Mutation fuzzing of ``hydrax.image.decode_into``.

Small valid JPEG, PNG and WebP images (and a GIF) made here with Pillow are cut short, bit-flipped,
overwritten with random bytes, and damaged chunk by chunk with the chunk's own checks fixed up
(PNG CRCs recomputed, JPEG segments and WebP RIFF sizes kept plausible), so the damage reaches
the decoders instead of stopping at the first check. Each mutant is decoded into a small slot in
several layouts and dtypes. Every outcome must be a filled slot or an ``ImageError`` whose message
names the data (``bytes of length N``) and holds no object repr; a damaged embedded ICC profile
may also be the documented ``ProfileError``.

The mutants run in child processes (see ``tests/support/fuzzing.py``), so a crash in a decoder or in
hydrax's pixel kernel fails the test with the seed and mutant number instead of killing pytest;
``python tests/test_fuzz_image.py SEED FIRST COUNT`` replays a range.
"""

from __future__ import annotations

import io
import random
import re
import struct
import sys
import zlib

import numpy as np
import pytest

from support.fuzzing import batches, run_isolated

# what Pillow writes into messages about in-memory files, which must not reach ours
OBJECT_REPR = re.compile(r"<[\w.]+ object at 0x[0-9a-fA-F]+>")


def originals() -> dict[str, bytes]:
    """The valid images the mutants start from: 32x24, with colour noise and a gradient."""
    from PIL import Image

    rng = np.random.default_rng(3)
    pixels = rng.integers(0, 256, (24, 32, 3), np.uint8)
    pixels[:, :16] = np.linspace(0, 255, 16, dtype=np.uint8)[None, :, None]
    rgb = Image.fromarray(pixels)
    made = {}
    for name, image, fmt, options in (
        ("jpeg", rgb, "JPEG", {"quality": 80}),
        ("jpeg-progressive", rgb, "JPEG", {"progressive": True, "subsampling": 0}),
        ("jpeg-gray", rgb.convert("L"), "JPEG", {}),
        # the fast path's own reading: EXIF orientation, an ICC profile in two APP2 chunks, DCT scaling
        ("jpeg-exif-icc", rgb, "JPEG", {"exif": _orientation_exif(6), "icc_profile": _adobe_profile()}),
        ("jpeg-large", Image.fromarray(np.tile(pixels, (4, 4, 1))), "JPEG", {"quality": 85, "exif": _orientation_exif(3)}),
        ("png", rgb, "PNG", {}),
        ("png-rgba", rgb.convert("RGBA"), "PNG", {}),
        ("png-palette", rgb.convert("P"), "PNG", {}),
        ("png-16", Image.fromarray(pixels[:, :, 0].astype(np.uint16) * 257), "PNG", {}),
        ("webp", rgb, "WEBP", {"quality": 70}),
        ("webp-lossless", rgb.convert("RGBA"), "WEBP", {"lossless": True}),
        ("gif", rgb.convert("P"), "GIF", {}),
    ):
        buffer = io.BytesIO()
        image.save(buffer, fmt, **options)
        made[name] = buffer.getvalue()
    made["jpeg-exif-icc"] = _split_icc(made["jpeg-exif-icc"])
    return made


def _orientation_exif(value: int) -> bytes:
    from PIL import Image

    exif = Image.Exif()
    exif[0x0112] = value
    return exif.tobytes()


def _adobe_profile() -> bytes:
    from pathlib import Path

    return (Path(__file__).parent / "data" / "icc" / "AdobeRGB1998.icc").read_bytes()


def _split_icc(data: bytes) -> bytes:
    """``data`` with its one ICC APP2 chunk split in two, the second first (readers sort them)."""
    at = data.index(b"ICC_PROFILE\0") - 4
    (length,) = struct.unpack_from(">H", data, at + 2)
    profile = data[at + 18 : at + 2 + length]
    half = len(profile) // 2

    def chunk(number: int, body: bytes) -> bytes:
        return b"\xff\xe2" + struct.pack(">H", 16 + len(body)) + b"ICC_PROFILE\0" + bytes((number, 2)) + body

    return data[:at] + chunk(2, profile[half:]) + chunk(1, profile[:half]) + data[at + 2 + length :]


def _png_chunks(data: bytes) -> list[tuple[int, int]]:
    """(offset, length of the data) of every chunk of a PNG."""
    chunks, at = [], 8
    while at + 12 <= len(data):
        (length,) = struct.unpack_from(">I", data, at)
        chunks.append((at, length))
        at += 12 + length
    return chunks


def _jpeg_segments(data: bytes) -> list[tuple[int, int]]:
    """(offset of the marker, length field) of the JPEG's marker segments up to the scan data."""
    segments, at = [], 2
    while at + 4 <= len(data) and data[at] == 0xFF:
        (length,) = struct.unpack_from(">H", data, at + 2)
        segments.append((at, length))
        if data[at + 1] == 0xDA:  # start of scan: entropy-coded data follows
            break
        at += 2 + length
    return segments


def mutate(data: bytes, kind: str, rng: random.Random) -> bytes:
    """One mutant of the ``kind`` image ``data``."""
    out = bytearray(data)
    op = rng.randrange(6)
    if op == 0:  # cut short
        del out[rng.randrange(len(out)) :]
    elif op == 1:  # bit flips
        for _ in range(rng.randint(1, 6)):
            at = rng.randrange(len(out))
            out[at] ^= 1 << rng.randrange(8)
    elif op == 2:  # random or zeroed bytes over a range
        at, span = rng.randrange(len(out)), rng.randint(1, 32)
        out[at : at + span] = rng.randbytes(span) if rng.random() < 0.5 else bytes(span)
        del out[len(data) :]
    elif op == 3:  # bytes inserted or deleted
        at = rng.randrange(len(out))
        if rng.random() < 0.5:
            out[at:at] = rng.randbytes(rng.randint(1, 32))
        else:
            del out[at : at + rng.randint(1, 32)]
    elif kind.startswith("png"):  # a chunk damaged, then its CRC made right again
        at, length = rng.choice(_png_chunks(data))
        body = at + 8
        if length and op == 4:
            for _ in range(rng.randint(1, 4)):
                out[body + rng.randrange(length)] = rng.randrange(256)
        else:  # the length field or IHDR's numbers
            target = rng.choice((at, body, body + 4, body + 8)) if data[at + 4 : at + 8] == b"IHDR" else at
            out[target : target + 4] = struct.pack(">I", rng.choice((0, 1, 2**31 - 1, 2**32 - 1, rng.randrange(2**32))))
        (length,) = struct.unpack_from(">I", out, at)
        if body + length + 4 <= len(out):
            out[body + length : body + length + 4] = struct.pack(">I", zlib.crc32(out[at + 4 : body + length]))
    elif kind.startswith("jpeg"):  # a marker segment's length or contents
        at, length = rng.choice(_jpeg_segments(data))
        if op == 4:
            struct.pack_into(">H", out, at + 2, rng.choice((0, 1, 2, length - 1, length + 1, 0xFFFF)))
        else:
            for _ in range(rng.randint(1, 4)):
                out[at + 4 + rng.randrange(max(1, length - 2))] = rng.randrange(256)
    else:  # RIFF (WebP) and GIF: a size or header field near the start
        at = rng.choice((4, 16, 20, 24, 26, 28)) if kind.startswith("webp") else rng.choice((6, 8, 10, 13))
        struct.pack_into("<I" if kind.startswith("webp") else "<H", out, at,
                         rng.choice((0, 1, 0xFFFF, rng.randrange(0x10000))))
    return bytes(out)


# The small slots reduce the 32x24 images enough for libjpeg to scale them in the DCT domain (the RGB
# decode); the last takes the plane decode.
SLOTS = (((6, 5, 3), np.uint8, "hwc"), ((3, 7, 8), np.float32, "chw"), ((8, 8, 4), np.float16, "hwc"),
         ((20, 28, 3), np.uint8, "hwc"))
#: How far the plane decode may be from Pillow's path (mean, most) in 8-bit levels, for JPEGs whose
#: colours all lie in RGB's range; the slot's units are levels, or fractions of 255 over
#: ImageNet's smallest deviation. The plane decode resizes the values the JPEG stores and clamps
#: to RGB once, at the end, where decoding to RGB first clamps every pixel: mutants full of
#: colours out of RGB's range differ far more (a mean of 4 levels, a pixel by 56), so for them
#: only the outcome is compared.
LEVELS = (1.0, 6)
UNITS = {np.dtype(np.uint8): 1.0, np.dtype(np.float32): 1 / 255 / 0.224, np.dtype(np.float16): 1 / 255 + 1e-4}


def _in_rgb_range(data: bytes) -> bool:
    """Whether every pixel of the JPEG ``data``, as libjpeg decodes it to YCbCr, is an RGB colour
    (within rounding) before clamping: where the plane decode must agree closely."""
    from PIL import Image

    try:
        image = Image.open(io.BytesIO(data))
        if image.mode != "RGB":
            return True
        image.draft("YCbCr", image.size)
        ycc = np.asarray(image, np.float64)
    except Exception:  # anything Pillow trips over; the outcomes are compared anyway
        return False
    luma, blue, red = ycc[..., 0], ycc[..., 1] - 128, ycc[..., 2] - 128
    rgb = np.stack([luma + 1.402 * red, luma - 0.34414 * blue - 0.71414 * red, luma + 1.772 * blue])
    return bool(((rgb > -1.5) & (rgb < 256.5)).all())


def check(data: bytes, case: int) -> None:
    """Decode ``data`` into a few slots: each a filled slot, an ImageError naming it, or ProfileError."""
    from hydrax.image import Coefs, ImageError, ProfileError, decode_into

    shape, dtype, layout = SLOTS[case % len(SLOTS)]
    out = np.full(shape, np.nan if dtype != np.uint8 else 7, dtype)
    try:
        decode_into(data, out, layout=layout, crop="random", flip=True, seed=case,
                    coefs=Coefs.IMAGENET_SRGB if dtype == np.float32 else None)
    except ProfileError:  # (an ImageError too) a damaged embedded profile: documented, raised unless bad_profile="warn"
        pass
    except ImageError as exc:
        message = str(exc)
        assert message.startswith(f"bytes of length {len(data)}: "), message
        assert not OBJECT_REPR.search(message), message
    else:
        assert np.isfinite(out.astype(np.float32)).all(), "the slot was not filled"
    if data[:3] == b"\xff\xd8\xff":
        _same_as_pillow_path(data, out, case)


def _same_as_pillow_path(data: bytes, fast: np.ndarray, case: int) -> None:
    """A JPEG given as bytes may take the fast path; as a file object it takes Pillow's. Both must
    give the same slot (within rounding where the fast path decoded planes), or both raise."""
    from hydrax.image import Coefs, ImageError, ProfileError, decode_into

    shape, dtype, layout = SLOTS[case % len(SLOTS)]
    out = np.full(shape, np.nan if dtype != np.uint8 else 7, dtype)
    outcomes = []
    for source, slot in ((data, fast.copy()), (io.BytesIO(data), out)):
        try:
            decode_into(source, slot, layout=layout, crop="random", flip=True, seed=case,
                        coefs=Coefs.IMAGENET_SRGB if dtype == np.float32 else None)
            outcomes.append(slot)
        except (ImageError, ProfileError) as exc:
            outcomes.append(type(exc).__name__)
    fast_outcome, pillow_outcome = outcomes
    if isinstance(fast_outcome, str) or isinstance(pillow_outcome, str):
        assert fast_outcome == pillow_outcome if isinstance(fast_outcome, str) and isinstance(pillow_outcome, str) else False, (
            f"the fast path gave {fast_outcome if isinstance(fast_outcome, str) else 'a slot'}, "
            f"Pillow's {pillow_outcome if isinstance(pillow_outcome, str) else 'a slot'}")
    else:
        diff = np.abs(fast_outcome.astype(np.float64) - pillow_outcome.astype(np.float64)) / UNITS[np.dtype(dtype)]
        if _in_rgb_range(data):
            assert diff.mean() <= LEVELS[0] and diff.max() <= LEVELS[1], f"the slots differ by {diff.mean()}, at most {diff.max()}"


def run(seed: int, first: int, count: int) -> None:
    """Check mutants ``first .. first + count`` for ``seed`` (in this process)."""
    images = originals()
    kinds = sorted(images)
    for n in range(first, first + count):
        rng = random.Random(f"{seed}/image/{n}")
        kind = rng.choice(kinds)
        data = mutate(images[kind], kind, rng)
        print(f"CASE {n} {kind}", flush=True)
        try:
            check(data, n)
        except Exception as exc:  # anything: the case must be named to be replayed
            raise AssertionError(f"seed {seed}, image mutant {n} ({kind}): {type(exc).__name__}: {exc}") from exc


@pytest.mark.fuzz
@pytest.mark.parametrize("first", batches())
def test_no_mutant_crashes_or_escapes_image_error(first):
    pytest.importorskip("PIL")
    run_isolated(__file__, first)


def test_the_valid_images_decode_into_every_slot():
    pytest.importorskip("PIL")
    from hydrax.image import decode_into

    for data in originals().values():
        for shape, dtype, layout in SLOTS:
            out = np.full(shape, np.nan if dtype != np.uint8 else 7, dtype)
            decode_into(data, out, layout=layout)
            assert np.isfinite(out.astype(np.float32)).all()


if __name__ == "__main__":
    run(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
