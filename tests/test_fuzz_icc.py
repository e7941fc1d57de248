"""Mutation fuzzing of ICC profile handling: the parser, the transforms and the colour kernel.

Real profiles (``tests/data/icc``) are mutated: bytes flipped, the tag table and tag sizes
rewritten, tone curves replaced by parametric curves with absurd parameters or tables of any
length, colorants set to extreme values. Each mutant is embedded in a small PNG and decoded with
``decode_into`` into uint8 and float32 slots, for every output space. Every outcome must be a
filled slot of finite values or a ``ProfileError`` (a damaged profile) — and never a crash or a
hang (batches run in child processes, see ``tests/support/fuzzing.py``).
"""

from __future__ import annotations

import io
import random
import struct
import sys
from pathlib import Path

import numpy as np
import pytest

from support.fuzzing import batches, run_isolated

ICC = Path(__file__).resolve().parent / "data" / "icc"
PROFILES = sorted(p for p in ICC.glob("*.icc") if p.name != "Gray.icc")


def _tags(profile: bytes) -> list[tuple[int, int, int]]:
    """(entry position, offset, size) of every tag of a well-formed profile."""
    count = struct.unpack_from(">I", profile, 128)[0]
    return [(132 + 12 * i, *struct.unpack_from(">II", profile, 136 + 12 * i)) for i in range(count)]


def _para(rng: random.Random) -> bytes:
    function = rng.randrange(6)
    count = {0: 1, 1: 3, 2: 4, 3: 5, 4: 7}.get(function, rng.randrange(8))
    values = [rng.choice([0, 1, -1, 0x7FFFFFFF, -0x80000000, rng.randrange(-2**31, 2**31)]) for _ in range(count)]
    return b"para" + bytes(4) + struct.pack(">HH", function, 0) + b"".join(struct.pack(">i", v) for v in values)


def _curv(rng: random.Random) -> bytes:
    length = rng.choice([0, 1, 2, 3, 4096, rng.randrange(70000)])
    values = bytes(rng.randrange(256) for _ in range(2 * min(length, 5000)))
    return b"curv" + bytes(4) + struct.pack(">I", length) + values


def mutate(profile: bytes, rng: random.Random) -> bytes:
    data = bytearray(profile)
    tags = _tags(profile)
    op = rng.randrange(6)
    if op == 0:
        for _ in range(rng.randrange(1, 10)):
            i = rng.randrange(len(data))
            data[i] ^= 1 << rng.randrange(8)
    elif op == 1:  # a tag entry pointing anywhere, with any size
        entry, _offset, _size = rng.choice(tags)
        struct.pack_into(">II", data, entry + 4, rng.choice([0, len(data) - 4, rng.randrange(2**32)]), rng.choice([0, 4, 12, rng.randrange(2**32)]))
    elif op == 2:  # a TRC replaced (appended, so the other tags stay as they are)
        curve = _para(rng) if rng.random() < 0.6 else _curv(rng)
        data += bytes(-len(data) % 4)
        at = len(data)
        data += curve
        for entry, _offset, _size in tags:
            if data[entry : entry + 4] in (b"rTRC", b"gTRC", b"bTRC") and rng.random() < 0.7:
                struct.pack_into(">II", data, entry + 4, at, rng.choice([len(curve), len(curve) // 2, 12]))
    elif op == 3:  # colorants: extreme s15Fixed16 numbers
        for entry, offset, _size in tags:
            if data[entry : entry + 4] in (b"rXYZ", b"gXYZ", b"bXYZ", b"wtpt") and offset + 20 <= len(data):
                for k in range(3):
                    struct.pack_into(">i", data, offset + 8 + 4 * k, rng.choice([0, 0x7FFFFFFF, -0x80000000, rng.randrange(-2**31, 2**31)]))
    elif op == 4:  # a tag count out of all proportion, or the header size field
        struct.pack_into(">I", data, rng.choice([0, 128]), rng.choice([0, 1, 2**31, rng.randrange(2**32)]))
    else:  # cut
        del data[rng.randrange(len(data)) :]
    return bytes(data)


def _png(profile: bytes) -> bytes:
    from PIL import Image

    pixels = np.arange(6 * 7 * 3, dtype=np.uint8).reshape(6, 7, 3) * 5
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "PNG", icc_profile=profile)
    return buffer.getvalue()


def check(image: bytes) -> None:
    from hydrax.image import ImageError, ProfileError, decode_into

    for space, dtype in (("srgb", np.uint8), ("srgb", np.float32), ("linear", np.uint8), ("linear", np.float32), ("oklab", np.float32)):
        out = np.full((6, 7, 3), 7, dtype)
        try:
            decode_into(image, out, space=space)
        except (ProfileError, ImageError):
            continue
        assert np.isfinite(out).all(), f"{space} {dtype.__name__}: non-finite output"


def run(seed: int, first: int, count: int) -> None:
    import warnings

    warnings.simplefilter("ignore")  # numpy overflow warnings from absurd curves
    bases = [p.read_bytes() for p in PROFILES]
    for n in range(first, first + count):
        rng = random.Random(f"{seed}/icc/{n}")
        profile = mutate(rng.choice(bases), rng)
        print(f"CASE icc {n}", flush=True)
        try:
            check(_png(profile))
        except AssertionError as exc:
            raise AssertionError(f"seed {seed}, icc mutant {n}: {exc}") from None


needs_profiles = pytest.mark.skipif(not PROFILES, reason=f"the ICC test profiles are not in {ICC}")


@pytest.mark.fuzz
@needs_profiles
@pytest.mark.parametrize("first", batches())
def test_no_mutant_profile_crashes_hangs_or_escapes_the_documented_errors(first):
    pytest.importorskip("PIL")
    run_isolated(__file__, first, seconds_per_mutant=0.2)


if __name__ == "__main__":
    run(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
