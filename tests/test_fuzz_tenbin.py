"""Mutation fuzzing of tenbin decoding (``hydrax.tenbin``): buffers, streams and message frames.

Valid encodings (plain arrays, 0-d and zero-size ones, many dims, and headers with extension
records) are mutated: their payloads (header words rewritten with edge values, huge dims, random
dtype codes, extension records added or broken, payloads cut, extended, dropped, repeated or
swapped) and then, for the chunked form, the raw bytes (bits flipped, cut, bytes inserted or
deleted, length words rewritten). For every mutant:

- ``decode_buffer``, ``read`` and ``decode_list`` return arrays or raise ``TenbinError``, never
  anything else, never crash, hang or allocate what the input only claims;
- decoded arrays are views of the input, of a dtype tenbin carries and at most 32 dims;
- ``decode_buffer`` and ``read`` agree: the same arrays and infos, or errors at the same offset;
  so does ``decode_buffer`` on a copy of the bytes that lies misaligned in memory.

``HYDRAX_FUZZ`` sets the mutants per form (see ``tests/support/fuzzing.py``). A failure prints the seed
and mutant number, and ``python tests/test_fuzz_tenbin.py SEED FIRST COUNT`` replays it.
"""

from __future__ import annotations

import io
import random
import struct
import sys

import numpy as np
import pytest

from support.fuzzing import batches, run_isolated

FORMS = ("buffer", "frames")
# numbers on the edges of the checks
EDGES = (0, 1, -1, 2, 7, 8, 9, 10, 31, 32, 33, 63, 64, 65, 2**20, 2**31, 2**32, 2**40, 2**61, 2**62, 2**63 - 1,
         -(2**63), -(2**62))
CODES = (b"f2", b"f4", b"f8", b"i1", b"i2", b"i4", b"i8", b"u1", b"u2", b"u4", b"u8", b"c8", b"b1", b"unit32", b"",
         b"\0f4", b"f4\0\0\0\0\0x", b"\xff\xfe", b"F4", b"~TenBin~")
TAGS = (b"dtype", b"info", b"later", b"", b"\xff", b"dtype\0\0x")
RECORD_TEXTS = (b"bool", b"bfloat16", b"float32", b"", b"\xff\xfe", "ünïcode".encode(), b"x" * 40)


def originals() -> list[tuple[list, list]]:
    """Valid encodings to mutate: (arrays, infos)."""
    import ml_dtypes  # a dependency of JAX, so of hydrax

    rng = np.random.default_rng(3)
    return [
        ([rng.integers(0, 255, (4, 5, 3), dtype=np.uint8), np.arange(7, dtype=np.int32), np.array(1.5, np.float16)], ["img", "", "x"]),
        ([np.zeros((3, 2), bool), (np.arange(5) / 3).astype(ml_dtypes.bfloat16), np.zeros((0, 3)), np.arange(4, dtype=">u4")],
         ["a long segmentation mask", "brün", "", "\0nul"]),
        ([np.arange(2**11, dtype=np.int16).reshape((2,) * 11), np.ones((2, 2), np.float64).T, np.array(-3, np.int64)], ["deep", "t", "s"]),
    ]


def _interesting(rng: random.Random, near: int) -> int:
    value = rng.choice(EDGES + (near + rng.choice((-1, 1, -8, 8, 64)), rng.randrange(-(2**63), 2**63)))
    return (value + 2**63) % 2**64 - 2**63


def _word(rng: random.Random, near: int = 0) -> bytes:
    return struct.pack("=q", _interesting(rng, near))


def _record(rng: random.Random) -> bytes:
    tag = rng.choice(TAGS).ljust(8, b"\0")[:8]
    text = rng.choice(RECORD_TEXTS)
    length = rng.choice((len(text), len(text), len(text) + 1, len(text) + 9, -1, 2**62, 0))
    body = text.ljust(-(-len(text) // 8) * 8, b"\0")
    return tag + struct.pack("=q", length) + body


def mutate_payloads(payloads: list[bytes], rng: random.Random) -> list[bytes]:
    """The payloads (header, data, header, data, ...) with one or two things changed."""
    out = list(payloads)
    for _ in range(rng.choice((1, 1, 2))):
        if not out:
            out.append(rng.randbytes(rng.choice((0, 8, 24, 40))))
            continue
        k = rng.randrange(len(out))
        headers = [i for i in range(0, len(out), 2) if len(out[i]) >= 24]
        op = rng.randrange(10)
        if op in (0, 1) and headers:  # a header word: code, info, ndim, a dim or a record word
            h = rng.choice(headers)
            data = bytearray(out[h])
            at = 8 * rng.randrange(len(data) // 8)
            data[at : at + 8] = _word(rng, struct.unpack_from("=q", data, at)[0])
            out[h] = bytes(data)
        elif op == 2 and headers:  # another dtype code
            h = rng.choice(headers)
            out[h] = rng.choice(CODES).ljust(8, b"\0")[:8] + out[h][8:]
        elif op == 3 and headers:  # huge, negative or many dims
            h = rng.choice(headers)
            ndim = rng.choice((0, 1, 3, 10, 32, 33, 40))
            dims = [rng.choice((0, 1, 2, 2**31, 2**62, -1, rng.randrange(1, 9))) for _ in range(min(ndim, 34))]
            out[h] = out[h][:16] + struct.pack(f"={1 + len(dims)}q", ndim, *dims)
        elif op == 4 and headers:  # extension records appended (or a stray word)
            h = rng.choice(headers)
            out[h] += b"".join(_record(rng) for _ in range(rng.randint(1, 3))) if rng.random() < 0.8 else _word(rng)
        elif op == 5:  # a payload cut or extended
            if rng.random() < 0.5:
                out[k] = out[k][: rng.randrange(len(out[k]) + 1)]
            else:
                out[k] += rng.randbytes(rng.choice((1, 7, 8, 16, 64)))
        elif op == 6:  # a payload dropped
            del out[k]
        elif op == 7:  # a payload repeated
            out.insert(rng.randrange(len(out) + 1), out[k])
        elif op == 8 and len(out) > 1:  # two payloads swapped
            a, b = rng.sample(range(len(out)), 2)
            out[a], out[b] = out[b], out[a]
        elif out[k]:  # bytes flipped
            data = bytearray(out[k])
            for _ in range(rng.randint(1, 4)):
                data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
            out[k] = bytes(data)
    return out


def chunked(payloads: list[bytes]) -> bytes:
    """The payloads in the chunked form, lengths and padding right."""
    return b"".join(b"~TenBin~" + struct.pack("=q", len(p)) + p + bytes(-len(p) % 64) for p in payloads)


def mutate_bytes(original: bytes, rng: random.Random) -> bytes:
    """Raw damage to a chunked buffer."""
    data = bytearray(original)
    if not data:
        return bytes(rng.randbytes(rng.choice((8, 16, 24))))
    op = rng.randrange(7)
    if op == 0:  # bit flips
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    elif op == 1:  # truncation
        del data[rng.randrange(len(data)) :]
    elif op == 2:  # bytes inserted
        at = rng.randrange(len(data) + 1)
        data[at:at] = rng.randbytes(rng.choice((1, 8, 16, 64, rng.randint(1, 100))))
    elif op == 3:  # bytes deleted
        at = rng.randrange(len(data))
        del data[at : at + rng.choice((1, 8, 16, 64, rng.randint(1, 100)))]
    elif op == 4:  # a chunk's length word rewritten
        at = 0
        lengths = []
        while at + 16 <= len(data):
            lengths.append(at + 8)
            at += 16 + -(-max(0, struct.unpack_from("=q", data, at + 8)[0]) // 64) * 64
        if lengths:
            at = rng.choice(lengths)
            data[at : at + 8] = _word(rng, struct.unpack_from("=q", data, at)[0])
    elif op == 5:  # any aligned word rewritten
        at = 8 * rng.randrange(len(data) // 8) if len(data) >= 8 else 0
        data[at : at + 8] = _word(rng)
    else:  # a range of zeros
        at = rng.randrange(len(data))
        data[at : at + rng.randint(1, 128)] = bytes(len(data[at : at + 128]))
    return bytes(data)


def mutant(form: str, n: int, seed: int, bases: list) -> tuple[str, object]:
    rng = random.Random(f"{seed}/tenbin/{form}/{n}")
    payloads = list(rng.choice(bases))
    if form == "frames" or rng.random() < 0.6:
        payloads = mutate_payloads(payloads, rng)
    if form == "frames":
        kinds = (bytes, bytearray, memoryview, lambda p: np.frombuffer(p, np.uint8))
        return form, [rng.choice(kinds)(bytes(p)) for p in payloads]
    data = chunked(payloads)
    if rng.random() < 0.7:
        data = mutate_bytes(data, rng)
    return form, data


def _outcome(decode, *args):
    from hydrax.errors import TenbinError

    try:
        return decode(*args, infos=True)
    except TenbinError as exc:
        assert exc.url is None and (exc.offset is None or exc.offset >= 0), (exc.url, exc.offset)
        assert type(exc.detail) is str and exc.detail, exc
        return exc


def _check_arrays(arrays, infos, sources) -> None:
    from hydrax import tenbin

    carried = set(tenbin.DTYPE_CODES) | {np.dtype(bool)}
    assert len(arrays) == len(infos)
    for array, info in zip(arrays, infos):
        assert isinstance(array, np.ndarray) and array.ndim <= tenbin.MAX_NDIM and isinstance(info, str)
        assert array.dtype in carried or array.dtype.name == "bfloat16", array.dtype
        if array.nbytes:
            assert any(np.shares_memory(array, source) for source in sources), "a decoded array is not a view"


def check_buffer(data: bytes) -> None:
    from hydrax import tenbin

    source = np.frombuffer(data, np.uint8)
    buffered = _outcome(tenbin.decode_buffer, source)
    streamed = _outcome(tenbin.read, io.BytesIO(data))
    shifted = bytearray(1) + data
    misaligned = _outcome(tenbin.decode_buffer, memoryview(shifted)[1:])
    for other in (streamed, misaligned):
        if isinstance(buffered, Exception):
            assert isinstance(other, Exception) and other.offset == buffered.offset, (buffered, other)
        else:
            assert not isinstance(other, Exception), other
            assert other[1] == buffered[1] and len(other[0]) == len(buffered[0])
            for a, b in zip(other[0], buffered[0]):
                assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    if not isinstance(buffered, Exception):
        _check_arrays(*buffered, [source])
        _check_arrays(*misaligned, [np.frombuffer(shifted, np.uint8)])


def check_frames(frames: list) -> None:
    from hydrax import tenbin

    result = _outcome(tenbin.decode_list, frames)
    if not isinstance(result, Exception):
        _check_arrays(*result, [np.frombuffer(f, np.uint8) for f in frames])
    else:
        assert result.offset is None and "frame" in str(result), result


def run(seed: int, first: int, count: int) -> None:
    """Check mutants ``first .. first + count`` of every form for ``seed`` (in this process)."""
    from hydrax import tenbin

    bases = [[bytes(p) for p in tenbin.encode_list(arrays, infos)] for arrays, infos in originals()]
    for form in FORMS:
        for n in range(first, first + count):
            form, data = mutant(form, n, seed, bases)
            print(f"CASE {form} {n}", flush=True)
            try:
                (check_buffer if form == "buffer" else check_frames)(data)
            except Exception as exc:  # anything: the case must be named to be replayed
                raise AssertionError(f"seed {seed}, {form} mutant {n}: {type(exc).__name__}: {exc}") from exc


@pytest.mark.fuzz
@pytest.mark.parametrize("first", batches())
def test_no_mutant_crashes_hangs_or_escapes_tenbin_error(first):
    run_isolated(__file__, first)


def test_the_valid_encodings_decode_in_every_form():
    from hydrax import tenbin

    for arrays, infos in originals():
        frames = [bytes(p) for p in tenbin.encode_list(arrays, infos)]
        check_frames(frames)
        check_buffer(chunked(frames))
        assert tenbin.decode_buffer(chunked(frames), infos=True)[1] == infos


if __name__ == "__main__":
    run(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
