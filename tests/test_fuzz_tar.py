"""Mutation fuzzing of the tar scanner kernels (``_core.scan_tar``, ``_core.index_tar``).

Valid shards in every tar dialect hydrax reads (ustar with prefixes, GNU long names, pax records
and global headers) are mutated: bytes flipped, blocks zeroed, cut or spliced, and header fields
rewritten with checksums fixed up, so that the damage reaches the number, pax and name parsers
instead of stopping at the checksum. For every mutant:

- the kernels return, never crash or hang (each batch runs in a child process with a deadline);
- every member they report lies inside the data;
- they agree with their pure-Python twins in ``hydrax/_fallback.py``;
- the Python layer (``scan_members``) gives members or a ``ShardFormatError`` with the offset;
- the same bytes as a shard file on disk (``build_index``, which maps it) give an index whose
  fields lie inside the file, or a ``ShardFormatError`` naming the file.

``HYDRAX_FUZZ`` sets the mutants per dialect (see ``tests/support/fuzzing.py``). A failure prints the seed
and mutant number, and ``python tests/test_fuzz_tar.py SEED FIRST COUNT`` replays it.
"""

from __future__ import annotations

import io
import os
import random
import sys
import tarfile
import tempfile

import numpy as np
import pytest

from support.fuzzing import batches, run_isolated

DIALECTS = ("ustar", "gnu", "pax")


def shard(dialect: str) -> bytes:
    """A small valid shard: three samples with a few fields, long names where the dialect has them."""
    fmt = {"ustar": tarfile.USTAR_FORMAT, "gnu": tarfile.GNU_FORMAT, "pax": tarfile.PAX_FORMAT}[dialect]
    buffer = io.BytesIO()
    extra = {"pax_headers": {"comment": "hydrax fuzz"}} if dialect == "pax" else {}
    with tarfile.open(fileobj=buffer, mode="w", format=fmt, **extra) as tar:
        for k in range(3):
            folder = ("deep/" * 30 if dialect != "ustar" else "some/folder/") + f"s{k:04d}"
            for field, size in (("jpg", 700 + k), ("cls", 2), ("json", 40)):
                info = tarfile.TarInfo(f"{folder}.{field}")
                info.size = size
                tar.addfile(info, io.BytesIO(bytes([k + 1]) * size))
        directory = tarfile.TarInfo("some/dir")
        directory.type = tarfile.DIRTYPE
        tar.addfile(directory)
    return buffer.getvalue()


def _headers(data: bytes) -> list[int]:
    """Offsets of the headers of a valid archive (payloads skipped)."""
    out, pos = [], 0
    while pos + 512 <= len(data) and data[pos : pos + 512] != bytes(512):
        out.append(pos)
        size = int(data[pos + 124 : pos + 136].split(b"\0")[0].strip() or b"0", 8)
        pos += 512 + -(-size // 512) * 512
    return out


def _fix_checksum(block: bytearray, at: int) -> None:
    block[at + 148 : at + 156] = b" " * 8
    total = sum(block[at : at + 512])
    block[at + 148 : at + 156] = b"%06o\0 " % total


def _number(rng: random.Random, width: int) -> bytes:
    kind = rng.randrange(6)
    if kind == 0:  # octal, maybe too wide, maybe huge
        digits = "".join(rng.choice("01234567") for _ in range(rng.randrange(1, width + 3)))
        return digits.encode()[:width].ljust(width, b"\0")
    if kind == 1:  # GNU base-256, positive or negative (0xFF lead), any magnitude
        lead = rng.choice([0x80, 0xFF, 0x80 | rng.randrange(0x80)])
        return bytes([lead]) + bytes(rng.randrange(256) for _ in range(width - 1))
    if kind == 2:  # spaces, NULs and junk
        return bytes(rng.choice(b" \0-+9x7") for _ in range(width))
    if kind == 3:
        return b"-" + b"1" * (width - 2) + b"\0"
    if kind == 4:
        return bytes(width)
    return bytes(rng.randrange(256) for _ in range(width))


def _pax_payload(rng: random.Random) -> bytes:
    records = []
    for _ in range(rng.randrange(1, 4)):
        key = rng.choice([b"path", b"size", b"mtime", b"x", b""])
        value = rng.choice([b"a/b.jpg", b"-100000000", b"9" * rng.randrange(1, 40), b"", b"\0\0", b"1e9"])
        body = b" " + key + b"=" + value + b"\n"
        length = len(body) + len(str(len(body)))
        length_text = rng.choice([str(length).encode(), b"9" * rng.randrange(1, 30), b"0", b"", b"-5", str(length + rng.randrange(-3, 4)).encode()])
        records.append(length_text + body)
    return b"".join(records)


def mutate(data: bytes, rng: random.Random, headers: list[int]) -> bytes:
    """One mutant of ``data``."""
    out = bytearray(data)
    op = rng.randrange(9)
    if op == 0:  # random bit flips anywhere
        for _ in range(rng.randrange(1, 8)):
            i = rng.randrange(len(out))
            out[i] ^= 1 << rng.randrange(8)
    elif op == 1:  # a zeroed block, mid-archive
        at = rng.randrange(len(out) // 512) * 512
        out[at : at + 512] = bytes(512)
    elif op == 2:  # cut
        del out[rng.randrange(len(out)) :]
    elif op == 3:  # splice bytes in or out
        at = rng.randrange(len(out))
        if rng.random() < 0.5:
            del out[at : at + rng.randrange(1, 1500)]
        else:
            out[at:at] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 600)))
    else:  # rewrite header fields, checksum fixed up
        for _ in range(rng.randrange(1, 3)):
            at = rng.choice(headers)
            if at + 512 > len(out):
                continue
            field = rng.randrange(5)
            if field == 0:
                out[at + 124 : at + 136] = _number(rng, 12)
            elif field == 1:
                out[at + 156] = rng.choice(b"0\x007xgLK5123456789")
            elif field == 2:  # names: no NUL, or a NUL in the middle
                out[at : at + 100] = bytes(rng.choice(b"ab./_\0\xff") for _ in range(100))
            elif field == 3:  # a pax record block in this header's payload
                payload = _pax_payload(rng)
                out[at + 156] = rng.choice(b"xg")
                out[at + 124 : at + 136] = b"%011o\0" % len(payload)
                end = at + 512 + len(payload)
                out[at + 512 : end] = payload
            else:  # the ustar magic and prefix
                out[at + 257 : at + 263] = rng.choice([b"ustar\0", b"ustar ", b"\0" * 6])
                out[at + 345 : at + 500] = bytes(rng.choice(b"p/\0\xfe") for _ in range(155))
            _fix_checksum(out, at)
    return bytes(out)


def check(data: bytes) -> None:
    """Everything that must hold for any input (see the module docstring)."""
    from hydrax import _core, _fallback
    from hydrax.errors import ShardFormatError
    from hydrax.shards.tarindex import scan_members

    rows = np.zeros((len(data) // 512 + 1, 7), np.int64)
    twin_rows = np.zeros_like(rows)
    result = _core.scan_tar(data, rows)
    twin = _fallback.scan_tar(data, twin_rows)
    assert result == twin, f"scan_tar {result} != twin {twin}"
    count = result[0]
    assert (rows[:count] == twin_rows[:count]).all(), "scan_tar rows differ from the twin's"
    for header, payload, size, prefix_at, prefix_len, name_at, name_len in rows[:count].tolist():
        assert 0 <= header < payload <= payload + size <= len(data), (header, payload, size)
        assert 0 <= name_at and name_at + name_len <= len(data) and 0 <= prefix_at and prefix_at + prefix_len <= len(data)
    indexed = _core.index_tar(data)
    twin_indexed = _fallback.index_tar(data)
    assert indexed[:3] == twin_indexed[:3], f"index_tar {indexed[:3]} != twin {twin_indexed[:3]}"
    for ours, theirs in zip(indexed[3:], twin_indexed[3:]):
        assert np.array_equal(np.asarray(ours), np.asarray(theirs)), "index_tar tables differ from the twin's"
    offsets, sizes = np.asarray(indexed[-2]), np.asarray(indexed[-1])
    assert ((offsets >= 0) & (sizes >= 0) & (offsets + sizes <= len(data))).all()
    try:
        members = scan_members(data, "fuzz.tar")
    except ShardFormatError as exc:
        # a truncated shard is reported at the header that would follow, up to a block past the end
        assert exc.url == "fuzz.tar" and exc.offset is not None and 0 <= exc.offset < len(data) + 512
    else:
        assert all(0 <= m.offset and m.offset + m.size <= len(data) for m in members)
    _check_file(data)


_FILE = os.path.join(tempfile.gettempdir(), f"hydrax-fuzz-{os.getpid()}.tar")


def _check_file(data: bytes) -> None:
    from hydrax.errors import ShardFormatError
    from hydrax.shards.indexfile import build_index

    with open(_FILE, "wb") as f:
        f.write(data)
    try:
        index = build_index(_FILE)
    except ShardFormatError as exc:
        assert exc.url == _FILE, exc.url
    else:
        starts, ends = index.sample_spans()
        assert ((starts >= 0) & (starts <= ends) & (ends <= len(data))).all() and index.shard_size == len(data)


def run(seed: int, first: int, count: int) -> None:
    """Check mutants ``first .. first + count`` of every dialect for ``seed`` (in this process)."""
    for dialect in DIALECTS:
        base = shard(dialect)
        headers = _headers(base)
        for n in range(first, first + count):
            rng = random.Random(f"{seed}/{dialect}/{n}")
            data = mutate(base, rng, headers)
            print(f"CASE {dialect} {n}", flush=True)
            try:
                check(data)
            except AssertionError as exc:
                raise AssertionError(f"seed {seed}, {dialect} mutant {n}: {exc}") from None


@pytest.mark.fuzz
@pytest.mark.parametrize("first", batches())
def test_no_mutant_crashes_hangs_or_escapes_the_documented_error(first):
    run_isolated(__file__, first)


def test_the_valid_shards_scan_cleanly():
    for dialect in DIALECTS:
        check(shard(dialect))
        from hydrax.shards.tarindex import scan_members

        assert len(scan_members(shard(dialect))) == 9


if __name__ == "__main__":
    try:
        run(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
    finally:
        if os.path.exists(_FILE):
            os.unlink(_FILE)
