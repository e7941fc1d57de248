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


# Hostile profiles built on purpose (issue 38): what the mutations above would rarely hit.

#: sRGB's colorants adapted to D50, as profiles store them.
_COLORANTS = ((0.4361, 0.2225, 0.0139), (0.3851, 0.7169, 0.0971), (0.1431, 0.0606, 0.7141))


def profile_with_curve(entries: int, name: bytes = b"hostile") -> bytes:
    """A matrix/TRC RGB profile whose rTRC, gTRC and bTRC all point to one ``curv`` table of
    ``entries`` samples (a ramp), with sRGB's colorants and the description ``name``."""

    def xyz(values) -> bytes:
        return b"XYZ " + bytes(4) + b"".join(struct.pack(">i", round(v * 65536)) for v in values)

    ramp = (np.arange(entries, dtype=np.uint64) * 65535 // max(entries - 1, 1)).astype(">u2").tobytes()
    tags = [(b"desc", b"desc" + bytes(4) + struct.pack(">I", len(name) + 1) + name + bytes(1 + 4 + 4 + 3 + 67)),
            (b"wtpt", xyz((0.9642, 1.0, 0.8249))),
            *((sig, xyz(colorant)) for sig, colorant in zip((b"rXYZ", b"gXYZ", b"bXYZ"), _COLORANTS)),
            (b"rTRC", b"curv" + bytes(4) + struct.pack(">I", entries) + ramp)]
    table, body = [], b""
    at = 132 + 12 * (len(tags) + 2)
    for sig, data in tags:
        body += bytes(-len(body) % 4)
        table.append((sig, at + len(body), len(data)))
        body += data
    table += [(sig, table[-1][1], table[-1][2]) for sig in (b"gTRC", b"bTRC")]  # one table, three curves
    header = bytearray(128)
    struct.pack_into(">I4sI4s4s4s", header, 0, at + len(body), b"lcms", 0x02100000, b"mntr", b"RGB ", b"XYZ ")
    header[36:40] = b"acsp"
    struct.pack_into(">3i", header, 68, *(round(v * 65536) for v in (0.9642, 1.0, 0.8249)))
    entries_table = b"".join(struct.pack(">4sII", *entry) for entry in table)
    return bytes(header) + struct.pack(">I", len(table)) + entries_table + body


_MEASURE = """
import io, json, sys, warnings
import numpy as np
from hydrax.image import ProfileError, decode_into

def status(key):
    with open("/proc/self/status") as lines:
        return next(int(line.split()[1]) for line in lines if line.startswith(key + ":")) * 1024

results = []
for path, source, bad_profile in json.loads(sys.argv[1]):
    data = open(path, "rb").read()
    out = np.zeros((16, 16, 3), np.uint8)
    try:  # the peak so far forgotten (Linux 4.0 on); else the growth below is the larger, still a bound
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")
    except OSError:
        pass
    before = status("VmRSS")
    found = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            decode_into(data if source == "bytes" else io.BytesIO(data), out, bad_profile=bad_profile)
            found["filled"] = bool(out.any())
        except ProfileError as exc:
            found.update(error=str(exc), profile=exc.profile, tag=exc.tag)
    found["grown"] = status("VmHWM") - before
    found["warnings"] = [str(w.message) for w in caught]
    results.append(found)
    del data
print(json.dumps(results))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the peak memory from /proc/self/status")
def test_a_huge_shared_tone_curve_is_refused_by_name_in_bounded_memory(tmp_path):
    """Issue 38, row 7: a 16 MB profile whose three TRCs share one ``curv`` table of 8 million
    entries made each decode build its samples as Python floats, 1.1 GB more memory on both paths.
    Curves longer than :data:`hydrax.image.icc.MAX_CURVE_ENTRIES` are now refused before anything
    is built from them: a ``ProfileError`` naming the profile and the tag, and what to do; with
    ``bad_profile="warn"`` the image decodes as sRGB. One decode, on either path, grows the
    process by well under 100 MB (the profile's own 16 MB, joined from its JPEG chunks, is most
    of what it takes). Measured in a process of its own, one decode after another."""
    import json
    import subprocess

    Image = pytest.importorskip("PIL.Image")
    from hydrax.image import icc

    def jpeg_with(profile: bytes) -> str:
        buffer = io.BytesIO()
        Image.fromarray(np.full((24, 32, 3), 120, np.uint8)).save(buffer, "JPEG", quality=90, icc_profile=profile)
        path = tmp_path / f"{len(profile)}.jpg"
        path.write_bytes(buffer.getvalue())
        return str(path)

    hostile = profile_with_curve(8_000_000)
    assert len(hostile) > 16_000_000
    hostile_jpeg, usable_jpeg = jpeg_with(hostile), jpeg_with(profile_with_curve(icc.MAX_CURVE_ENTRIES))
    cases = [(path, source, bad_profile) for source in ("bytes", "file")  # the fast path and Pillow's
             for path, bad_profile in ((hostile_jpeg, "raise"), (hostile_jpeg, "warn"), (usable_jpeg, "raise"))]
    result = subprocess.run([sys.executable, "-c", _MEASURE, json.dumps(cases)], capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    for (_path, source, _bad), (refused, warned, usable) in zip(cases[::3], zip(*[iter(json.loads(result.stdout))] * 3)):
        assert refused["grown"] < 100 << 20 and warned["grown"] < 100 << 20, (source, refused["grown"] >> 20,
                                                                             warned["grown"] >> 20)
        assert refused.get("tag") == "rTRC" and refused["profile"] == f"'hostile' ({len(hostile)} bytes)", refused
        for words in ("8000000 entries", f"more than the {icc.MAX_CURVE_ENTRIES}", refused["profile"], "bad_profile='warn'"):
            assert words in refused["error"], (words, refused["error"])
        assert warned.get("filled") and any("8000000 entries" in message for message in warned["warnings"]), warned
        assert usable.get("filled"), usable  # the builder's profiles are otherwise sound


if __name__ == "__main__":
    run(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))


def with_tag_count(count: int) -> bytes:
    """:func:`profile_with_curve`'s profile with its tag table grown to ``count`` entries, the
    added ones (unknown signatures) pointing at its first tag's data."""
    profile = profile_with_curve(256)
    listed = struct.unpack_from(">I", profile, 128)[0]
    table = [struct.unpack_from(">4sII", profile, 132 + 12 * i) for i in range(listed)]
    table += [(struct.pack(">I", 0x7A000000 + i), table[0][1], table[0][2]) for i in range(count - listed)]
    grown = 12 * (count - listed)
    body = profile[132 + 12 * listed:]
    header = bytearray(profile[:128])
    struct.pack_into(">I", header, 0, 132 + 12 * count + len(body))
    return bytes(header) + struct.pack(">I", count) + b"".join(struct.pack(">4sII", s, o + grown, n) for s, o, n in table) + body


@pytest.mark.parametrize("count", [100, 101, 2_000, 1_300_000])
def test_a_tag_table_longer_than_littlecms_reads_is_refused_on_both_paths(count):
    # LittleCMS refuses a profile of more than 100 tags, so Pillow's path refused it while the
    # fast path read every entry: a 16 MB table of 1.3M tags took a second and about 55 MB.
    from PIL import Image

    from hydrax.image import ProfileError, decode_into
    from hydrax.image.icc import MAX_TAGS, parse

    profile = with_tag_count(count)
    if count > MAX_TAGS:
        with pytest.raises(ProfileError, match=f"lists {count} tags, more than the {MAX_TAGS}"):
            parse(profile)
    if len(profile) > 1 << 20:
        return  # more than a PNG's iCCP chunk carries through Pillow: parse is the whole path
    out = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 100, 50)).save(out, "PNG", icc_profile=profile)
    slot = np.zeros((8, 8, 3), np.uint8)
    if count <= MAX_TAGS:
        assert parse(profile) is not None
        decode_into(out.getvalue(), slot)
        return
    with pytest.raises(ProfileError):
        decode_into(out.getvalue(), slot)
    decode_into(out.getvalue(), slot, bad_profile="warn")  # read as sRGB, as any damaged profile
