"""Mutation fuzzing of the random resized crop's region decode (``hydrax.image.jpeg.decode_region``
and ``decode_into(..., crop="random_resized")``).

Small valid JPEGs made here with Pillow (4:2:0, 4:2:2 progressive, 4:4:4, gray, and one large
enough for DCT scaling) are damaged by ``test_fuzz_image``'s mutations. Each mutant is decoded
by the region decoder directly, over a random box at a random scale, which must give None or
pixels of the scaled image's shape; and through ``decode_into`` with a random resized crop, which
must fill the slot or raise an ``ImageError`` naming the data (a damaged profile: the documented
``ProfileError``). The same bytes given as a file object take Pillow's path: where the fast path
raised, Pillow's must have too (the fast path only declines, then the paths before it decide);
where both filled the slot and the region decoder made the pixels, the slots are the same to the
bit (both decode to RGB with libjpeg-turbo and resize with Pillow's arithmetic). Damage below the
box is not seen by the region decoder, so Pillow's path may raise where the fast path filled.

The mutants run in child processes (``tests/support/fuzzing.py``); ``python
tests/test_fuzz_image_region.py SEED FIRST COUNT`` replays a range.
"""

from __future__ import annotations

import io
import random
import sys

import numpy as np
import pytest

from support.fuzzing import batches, run_isolated
from test_fuzz_image import OBJECT_REPR, mutate


def originals() -> dict[str, bytes]:
    """Photo-like JPEGs with every sampling the region decoder takes."""
    from PIL import Image

    rng = np.random.default_rng(5)
    made = {}
    for name, (width, height), options in (("jpeg-420", (96, 72), {"subsampling": 2}),
                                           ("jpeg-422-progressive", (80, 64), {"subsampling": 1, "progressive": True}),
                                           ("jpeg-444", (64, 48), {"subsampling": 0}),
                                           ("jpeg-gray", (72, 56), {}),
                                           ("jpeg-large", (200, 150), {"subsampling": 2})):
        coarse = rng.integers(0, 256, (height // 12 + 2, width // 12 + 2, 3), np.uint8)
        image = Image.fromarray(coarse).resize((width, height), Image.Resampling.BICUBIC)
        if name == "jpeg-gray":
            image = image.convert("L")
        buffer = io.BytesIO()
        image.save(buffer, "JPEG", quality=85, **options)
        made[name] = buffer.getvalue()
    return made


#: The slots: small ones make large boxes DCT-scaled (1/2 to 1/8), the last decodes at full scale.
SLOTS = (((12, 16, 3), np.uint8, "hwc"), ((3, 10, 10), np.float32, "chw"), ((40, 48, 3), np.uint8, "hwc"))


def check_region(data: bytes, rng: random.Random) -> None:
    """The region decoder alone, over a random box at a random scale: None or the scaled image."""
    from hydrax.image import jpeg

    view = memoryview(data)
    header = jpeg.read_header(view)
    if header is None:
        return
    factor = rng.choice((1, 2, 4, 8))
    width, height = -(-header.width // factor), -(-header.height // factor)
    left, right = sorted(rng.sample(range(width + 1), 2)) if width > 1 else (0, 1)
    top, bottom = sorted(rng.sample(range(height + 1), 2)) if height > 1 else (0, 1)
    pixels = jpeg.decode_region(view, header, factor, (left, top, right, bottom))
    assert pixels is None or pixels.shape == (height, width, header.components), pixels.shape


def check(data: bytes, case: int, rng: random.Random) -> None:
    """The region decoder, then decode_into's random resized crop against Pillow's path."""
    from hydrax.image import Coefs, ImageError, ProfileError, decode_into, jpeg

    check_region(data, rng)
    shape, dtype, layout = SLOTS[case % len(SLOTS)]
    options = {"layout": layout, "crop": "random_resized", "flip": True, "seed": case,
               "coefs": Coefs.IMAGENET_SRGB if dtype == np.float32 else None}
    outcomes, regions = [], []
    original = jpeg.decode_region
    jpeg.decode_region = _spy(original, regions)
    try:
        for source in (data, io.BytesIO(data)):
            out = np.full(shape, np.nan if dtype != np.uint8 else 7, dtype)
            try:
                decode_into(source, out, **options)
            except ProfileError:  # (an ImageError too) a damaged embedded profile: documented
                outcomes.append("ProfileError")
            except ImageError as exc:
                message = str(exc)
                assert message.startswith(f"bytes of length {len(data)}: "), message
                assert not OBJECT_REPR.search(message), message
                outcomes.append("ImageError")
            else:
                assert np.isfinite(out.astype(np.float32)).all(), "the slot was not filled"
                outcomes.append(out)
    finally:
        jpeg.decode_region = original
    fast, pillow = outcomes
    if isinstance(fast, str):
        assert fast == pillow, f"the fast path raised {fast}, Pillow's path gave {pillow if isinstance(pillow, str) else 'a slot'}"
    elif not isinstance(pillow, str) and regions == [True]:
        np.testing.assert_array_equal(fast, pillow, err_msg="the region decode's slot differs from Pillow's path")


def _spy(decode_region, made: list):
    """``decode_region`` noting in ``made`` whether each call made the pixels."""
    def spy(*args):
        pixels = decode_region(*args)
        made.append(pixels is not None)
        return pixels
    return spy


def run(seed: int, first: int, count: int) -> None:
    """Check mutants ``first .. first + count`` for ``seed`` (in this process)."""
    images = originals()
    kinds = sorted(images)
    for n in range(first, first + count):
        rng = random.Random(f"{seed}/region/{n}")
        kind = rng.choice(kinds)
        data = mutate(images[kind], kind, rng)
        print(f"CASE {n} {kind}", flush=True)
        try:
            check(data, n, rng)
        except Exception as exc:  # anything: the case must be named to be replayed
            raise AssertionError(f"seed {seed}, region mutant {n} ({kind}): {type(exc).__name__}: {exc}") from exc


@pytest.mark.fuzz
@pytest.mark.parametrize("first", batches())
def test_no_mutant_crashes_or_escapes_image_error(first):
    pytest.importorskip("PIL")
    run_isolated(__file__, first)


def test_the_valid_images_take_the_region_decode():
    pytest.importorskip("PIL")
    from hydrax.image import decode_into, jpeg

    if jpeg.region_library() is None:
        pytest.skip("no libjpeg-turbo with the scanline calls")
    original, made = jpeg.decode_region, []
    for data in originals().values():
        for case, (shape, dtype, layout) in enumerate(SLOTS * 4):
            jpeg.decode_region = _spy(original, made)
            try:
                out = np.full(shape, np.nan if dtype != np.uint8 else 7, dtype)
                decode_into(data, out, layout=layout, crop="random_resized", seed=case)
            finally:
                jpeg.decode_region = original
            assert np.isfinite(out.astype(np.float32)).all()
    assert len(made) >= 30 and all(made), made  # of 60 slots: the others took the plane path


if __name__ == "__main__":
    run(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
