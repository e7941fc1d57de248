"""hydrax.tenbin: round trips in every form, byte identity with tensorcom 0.1.0 where tensorcom is
right, the fixes where it is not (each defect asserted where that is cheap, to document it), the
header extension, zero-copy decoding and alignment, and malformed input."""

from __future__ import annotations

import io
import math
import mmap
import os
import re
import struct

import ml_dtypes  # a dependency of JAX, so of hydrax
import numpy as np
import pytest

from hydrax import tenbin
from hydrax.errors import TenbinError

# what tensorcom 0.1.0 handles (its table misspells uint32)
TC_DTYPES = ("float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint64")
ALL_DTYPES = TC_DTYPES + ("uint32", "bool", ml_dtypes.bfloat16)
LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./ "


@pytest.fixture(scope="module")
def tc():
    return pytest.importorskip("tensorcom.tenbin")


def values(rng: np.random.Generator, shape, dtype) -> np.ndarray:
    """Random values of ``dtype`` (any dtype tenbin carries), in C order."""
    dtype = np.dtype(dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, shape).astype(bool)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)
    return (rng.standard_normal(shape) * 100).astype(dtype)


def shuffled_layout(rng: np.random.Generator, array: np.ndarray) -> np.ndarray:
    """The same logical array in memory that is not C-contiguous (when it has 2+ elements)."""
    kind = rng.integers(3)
    if kind == 0 and array.ndim >= 2:  # transposed storage
        axes = rng.permutation(array.ndim)
        return np.ascontiguousarray(array.transpose(axes)).transpose(np.argsort(axes))
    if kind == 1:  # a reversed view
        return np.ascontiguousarray(array[::-1])[::-1] if array.ndim else array
    padded = np.zeros(array.shape[:-1] + (array.shape[-1] * 2,), array.dtype) if array.ndim else array.copy()
    if array.ndim:
        padded[..., ::2] = array
        return padded[..., ::2]
    return padded


def random_case(rng: np.random.Generator, dtypes=TC_DTYPES, ranks=(1, 9)):
    count = int(rng.integers(1, 4))
    arrays = []
    for _ in range(count):
        rank = int(rng.integers(ranks[0], ranks[1] + 1))
        shape = tuple(int(d) for d in rng.integers(0 if rng.random() < 0.1 else 1, 4 if rank > 4 else 7, rank))
        array = values(rng, shape, dtypes[rng.integers(len(dtypes))])
        arrays.append(shuffled_layout(rng, array) if rng.random() < 0.4 else array)
    infos = None
    if rng.random() < 0.6:
        infos = ["".join(rng.choice(list(LETTERS), int(rng.integers(0, 9)))).strip() for _ in arrays]
    return arrays, infos


def same_arrays(got, want) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype.newbyteorder("="), (g.dtype, w.dtype)
        assert g.shape == w.shape
        assert np.array_equal(bits(g), bits(w))


def bits(array: np.ndarray) -> np.ndarray:
    """``array`` in native order, bfloat16 as its bits (which numpy compares without ml_dtypes' help)."""
    array = np.asarray(array, array.dtype.newbyteorder("="))
    return array.view(f"u{array.dtype.itemsize}") if array.dtype.kind == "V" else array


def frames_bytes(frames) -> list[bytes]:
    return [bytes(frame) for frame in frames]


# -- the format -------------------------------------------------------------------------------------

def test_the_worked_example_byte_for_byte(tc):
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.array([7, -8, 9], np.int16)
    buf = tenbin.encode_buffer([a, b], infos=["img", "lbl"])
    assert len(buf) == 320 and bytes(buf) == bytes(tc.encode_buffer([a, b], infos=["img", "lbl"]))
    words = lambda at, n: struct.unpack_from(f"={n}q", buf, at)  # noqa: E731
    assert buf[0:8] == b"~TenBin~" and words(8, 1) == (40,)
    assert buf[16:24] == b"f4".ljust(8, b"\0") and buf[24:32] == b"img".ljust(8, b"\0") and words(32, 3) == (2, 2, 3)
    assert buf[56:80] == bytes(24)
    assert buf[80:88] == b"~TenBin~" and words(88, 1) == (24,) and bytes(buf[96:120]) == a.tobytes()
    assert words(168, 1) == (32,) and buf[176:184] == b"i2".ljust(8, b"\0") and words(248, 1) == (6,)
    assert bytes(buf[256:262]) == b.tobytes() and buf[262:320] == bytes(58)
    frames = tenbin.encode_list([np.zeros((2, 2), np.uint8)])
    assert [len(bytes(f)) for f in frames] == [40, 4]


def test_constants():
    assert tenbin.DTYPE_CODES[np.dtype("uint32")] == "u4" and tenbin.CODE_DTYPES["f2"] == np.dtype("float16")
    assert len(tenbin.DTYPE_CODES) == 11 and all(tenbin.CODE_DTYPES[c] == d for d, c in tenbin.DTYPE_CODES.items())
    with pytest.raises(TypeError):
        tenbin.DTYPE_CODES[np.dtype(bool)] = "b1"


# -- round trips ------------------------------------------------------------------------------------

def round_trips(arrays, infos, tmp_path):
    """Every form's decoding of every form's encoding: (form, arrays, infos)."""
    yield "buffer", *tenbin.decode_buffer(tenbin.encode_buffer(arrays, infos), infos=True)
    yield "list", *tenbin.decode_list(frames_bytes(tenbin.encode_list(arrays, infos)), infos=True)
    yield "list, memoryviews", *tenbin.decode_list(tenbin.encode_list(arrays, infos), infos=True)
    stream = io.BytesIO()
    tenbin.write(stream, arrays, infos)
    stream.seek(0)
    yield "stream", *tenbin.read(stream, infos=True)
    path = tmp_path / "a.ten"
    tenbin.save(path, *arrays, infos=infos)
    assert path.read_bytes() == bytes(stream.getvalue())
    yield "file", *tenbin.load(path, infos=True)
    yield "mapped file", *tenbin.load(path, infos=True, mmap=True)


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda d: np.dtype(d).name)
def test_every_dtype_round_trips_in_every_form_and_layout(dtype, tmp_path):
    rng = np.random.default_rng(7)
    arrays = [values(rng, shape, dtype) for shape in ((), (0,), (0, 3), (5,), (3, 4), (2, 0, 5), (2, 3, 4, 1, 2))]
    arrays += [shuffled_layout(rng, values(rng, (3, 4, 5), dtype)) for _ in range(3)]
    arrays += [values(rng, (6, 5), dtype).T, values(rng, (9,), dtype)[::-3], values(rng, (4, 6), dtype)[1:3, ::2]]
    if np.dtype(dtype).itemsize > 1:
        arrays.append(arrays[4].astype(np.dtype(dtype).newbyteorder(">")))
    infos = [f"a{n}" for n in range(len(arrays))]
    for form, got, got_infos in round_trips(arrays, infos, tmp_path):
        same_arrays(got, arrays)
        assert got_infos == infos, form


def test_every_rank_from_0_to_12_and_the_limit(tmp_path):
    arrays = [np.arange(math.prod((2,) * r), dtype=np.int32).reshape((2,) * r) for r in range(13)]
    arrays.append(np.zeros((1,) * 32, np.uint8))
    for _form, got, _ in round_trips(arrays, None, tmp_path):
        same_arrays(got, arrays)
    with pytest.raises(TenbinError, match=r"array 1: 33 dims"):
        tenbin.encode_buffer([np.zeros(1), np.zeros((1,) * 33)])


def test_big_endian_input_is_written_native(tc):
    native = np.arange(-5, 7, dtype=np.int32).reshape(3, 4) * 1000
    for big in (native.astype(">i4"), native.astype(">f8"), native.astype(">u2")[::-1].T):
        want = np.asarray(big, big.dtype.newbyteorder("="))
        assert bytes(tenbin.encode_buffer([big])) == bytes(tenbin.encode_buffer([np.ascontiguousarray(want)]))
        assert np.array_equal(tenbin.decode_buffer(tenbin.encode_buffer([big]))[0], want)
        assert np.array_equal(tenbin.decode_list(tenbin.encode_list([big]))[0], want)
    # tensorcom writes the big-endian bytes under a native code: other numbers come back
    big = native.astype(">i4")
    assert not np.array_equal(tc.decode_buffer(tc.encode_buffer([big]))[0], native)
    bf = np.arange(6).astype(ml_dtypes.bfloat16)
    got = tenbin.decode_buffer(tenbin.encode_buffer([bf.astype(np.dtype(ml_dtypes.bfloat16).newbyteorder(">"))]))[0]
    assert got.dtype == ml_dtypes.bfloat16 and got.tobytes() == bf.tobytes()


def test_arrays_of_every_stride_are_written_in_c_order(tc):
    base = np.arange(2 * 3 * 4, dtype=np.int16).reshape(2, 3, 4)
    for view in (base.T, base[:, ::-1], base[::-1, 1:, ::3], base.transpose(1, 0, 2)[..., ::-2]):
        contiguous = np.ascontiguousarray(view)
        want = bytes(tenbin.encode_buffer([contiguous]))
        assert bytes(tenbin.encode_buffer([view])) == want == bytes(tc.encode_buffer([view]))
        assert frames_bytes(tenbin.encode_list([view])) == frames_bytes(tenbin.encode_list([contiguous]))
        stream = io.BytesIO()
        tenbin.write(stream, [view])
        assert stream.getvalue() == want


# -- tensorcom: byte identity and cross-decoding ---------------------------------------------------

def test_byte_identical_to_tensorcom_and_each_decodes_the_other(tc):
    rng = np.random.default_rng(20240611)
    for case in range(150):
        arrays, infos = random_case(rng)
        theirs_buf, ours_buf = tc.encode_buffer(arrays, infos=infos), tenbin.encode_buffer(arrays, infos=infos)
        assert bytes(ours_buf) == bytes(theirs_buf), case
        assert frames_bytes(tenbin.encode_list(arrays, infos)) == frames_bytes(tc.encode_list(arrays, infos=infos)), case
        want_infos = infos or [""] * len(arrays)
        for got, names in (tenbin.decode_buffer(bytes(theirs_buf), infos=True), tc.decode_buffer(bytes(ours_buf), infos=True),
                           tenbin.decode_list(frames_bytes(tc.encode_list(arrays, infos=infos)), infos=True),
                           tc.decode_list(frames_bytes(tenbin.encode_list(arrays, infos)), infos=True)):
            same_arrays(got, arrays)
            assert names == want_infos, case


def test_ten_files_match_tensorcom_and_each_reads_the_others(tc, tmp_path):
    rng = np.random.default_rng(5)
    for case in range(25):
        arrays, infos = random_case(rng)
        arrays = [np.ascontiguousarray(a) for a in arrays]  # tensorcom's save needs C order
        ours, theirs = str(tmp_path / f"ours{case}.ten"), str(tmp_path / f"theirs{case}.ten")
        tenbin.save(ours, *arrays, infos=infos)
        tc.save(theirs, *arrays, infos=infos)
        assert open(ours, "rb").read() == open(theirs, "rb").read(), case
        same_arrays(tenbin.load(theirs), arrays)
        same_arrays(tenbin.load(theirs, mmap=True), arrays)
        same_arrays(tc.load(ours), arrays)
    # tensorcom's save fails on, or garbles, what is not C-contiguous; hydrax's writes C order
    view = np.arange(24, dtype=np.float32).reshape(4, 6).T
    tenbin.save(str(tmp_path / "t.ten"), view)
    try:
        tc.save(str(tmp_path / "tc.ten"), view)
    except Exception:
        pass
    else:
        assert open(tmp_path / "tc.ten", "rb").read() != open(tmp_path / "t.ten", "rb").read()
    assert (tmp_path / "t.ten").read_bytes() == bytes(tc.encode_buffer([view]))
    same_arrays(tc.load(str(tmp_path / "t.ten")), [view])


def test_uint32_works_where_tensorcom_misspells_it(tc):
    a = np.array([0, 1, 2**32 - 1], np.uint32)
    buf = tenbin.encode_buffer([a])
    assert buf[16:24] == b"u4".ljust(8, b"\0")
    assert np.array_equal(tenbin.decode_buffer(buf)[0], a) and tenbin.decode_buffer(buf)[0].dtype == np.uint32
    with pytest.raises(AssertionError):
        tc.encode_buffer([a])
    with pytest.raises(TypeError):
        tc.decode_buffer(buf)


def test_0d_arrays_encode_as_tensorcom_does_and_decode(tc):
    for a in (np.array(3.5, np.float32), np.array(-7, np.int64), np.array(True), np.array(2, np.uint32)):
        buf = tenbin.encode_buffer([a])
        assert struct.unpack_from("=q", buf, 32) == (0,) and struct.unpack_from("=q", buf, 8) == (48 if a.dtype == bool else 24,)
        got = tenbin.decode_buffer(buf)[0]
        assert got.shape == () and got == a
        assert tenbin.decode_list(tenbin.encode_list([a]))[0] == a
    a = np.array(3.5, np.float32)
    assert bytes(tenbin.encode_buffer([a])) == bytes(tc.encode_buffer([a]))
    with pytest.raises(TypeError):  # tensorcom counts the elements of shape () as 1.0
        tc.decode_buffer(tenbin.encode_buffer([a]))


def test_many_dims_encode_and_tensorcom_still_reads_them(tc):
    a = np.arange(2**11, dtype=np.int16).reshape((2,) * 11)
    with pytest.raises(AssertionError):
        tc.encode_buffer([a])
    assert np.array_equal(tc.decode_buffer(tenbin.encode_buffer([a]))[0], a)
    assert np.array_equal(tc.decode_list(frames_bytes(tenbin.encode_list([a])))[0], a)


def test_the_header_extension_byte_for_byte_and_through_tensorcom(tc):
    mask = np.array([[True, False, True], [False, False, True]])
    header = bytes(tenbin.encode_list([mask], infos=["segmentation"])[0])
    words = [header[i : i + 8] for i in range(0, len(header), 8)]
    assert words == [b"u1\0\0\0\0\0\0", b"segmenta", struct.pack("=q", 2), struct.pack("=q", 2), struct.pack("=q", 3),
                     b"dtype\0\0\0", struct.pack("=q", 4), b"bool\0\0\0\0",
                     b"info\0\0\0\0", struct.pack("=q", 12), b"segmenta", b"tion\0\0\0\0"]
    bf = (np.arange(12).reshape(3, 4) / 7).astype(ml_dtypes.bfloat16)
    arrays = [mask, bf, np.arange(3, dtype=np.uint8), np.arange(2.0)]
    infos = ["segmentation", "brün", "short", "\0edge\0"]
    buf = tenbin.encode_buffer(arrays, infos)
    got, names = tenbin.decode_buffer(buf, infos=True)
    assert names == infos and got[0].dtype == bool and got[1].dtype == ml_dtypes.bfloat16
    assert np.array_equal(got[0], mask) and got[1].tobytes() == bf.tobytes()
    for theirs, names in (tc.decode_buffer(bytes(buf), infos=True), tc.decode_list(frames_bytes(tenbin.encode_list(arrays, infos)), infos=True)):
        assert theirs[0].dtype == np.uint8 and np.array_equal(theirs[0], mask.view(np.uint8))
        assert theirs[1].dtype == np.uint16 and theirs[1].tobytes() == bf.tobytes()
        assert names == ["segmenta", "", "short", "edge"]
    # no records when none are needed: an ASCII info of 8 characters is tensorcom's header exactly
    assert bytes(tenbin.encode_list([arrays[2]], infos=["exactly8"])[0]) == bytes(tc.encode_list([arrays[2]], infos=["exactly8"])[0])


def test_records_with_unknown_tags_are_skipped():
    a = np.arange(4, dtype=np.int32)
    header = bytes(tenbin.encode_list([a])[0]) + b"later\0\0\0" + struct.pack("=q", 9) + b"123456789".ljust(16, b"\0")
    assert np.array_equal(tenbin.decode_list([header, a.tobytes()])[0], a)


@pytest.mark.parametrize("bad", [np.zeros(2, np.complex64), np.array([object()]), np.array(["text"]), np.zeros(2, "S3"),
                                 np.zeros(2, [("x", "i4")]), np.zeros(2, "datetime64[s]"), np.zeros(2, np.longdouble),
                                 np.zeros(2, "V2")], ids=lambda a: str(a.dtype))
def test_dtypes_tenbin_cannot_carry_are_refused_naming_the_array(bad, tmp_path):
    for encode in (tenbin.encode_buffer, tenbin.encode_list, lambda arrays: tenbin.write(io.BytesIO(), arrays)):
        with pytest.raises(TenbinError, match="array 1: dtype " + re.escape(str(bad.dtype))):
            encode([np.zeros(1), bad])
    path = tmp_path / "x.ten"
    with pytest.raises(TenbinError):
        tenbin.save(path, np.zeros(1), bad)
    assert not path.exists()


# -- infos ------------------------------------------------------------------------------------------

def test_infos_true_a_checked_list_and_wrong_counts():
    arrays = [np.zeros(2, np.uint8), np.ones(3, np.float32)]
    buf, frames = tenbin.encode_buffer(arrays, ["a", "b"]), tenbin.encode_list(arrays, ["a", "b"])
    for decode, data in ((tenbin.decode_buffer, buf), (tenbin.decode_list, frames)):
        assert decode(data, infos=["a", "b"])[1].shape == (3,)
        assert decode(data, infos=("a", "b"))[0].shape == (2,)
        assert decode(data, infos=True)[1] == ["a", "b"] and len(decode(data, infos=None)) == 2
        with pytest.raises(TenbinError, match="array 1 has info 'b', 'c' expected"):
            decode(data, infos=["a", "c"])
        with pytest.raises(TenbinError, match="2 arrays, 1 infos expected"):
            decode(data, infos=["a"])
    for infos in (["a"], "ab", [1, 2]):
        with pytest.raises(TenbinError):
            tenbin.encode_buffer(arrays, infos)
    with pytest.raises(TenbinError, match="UTF-8"):
        tenbin.encode_list(arrays, ["a", "\udcff"])


# -- zero copy, alignment ---------------------------------------------------------------------------

def test_encode_list_does_not_copy_contiguous_arrays():
    big = np.arange(1 << 20, dtype=np.float32).reshape(1024, 1024)
    header, data = tenbin.encode_list([big])
    assert type(header) is bytes and isinstance(data, memoryview) and data.nbytes == big.nbytes
    assert np.shares_memory(np.frombuffer(data, np.uint8), big)
    for mask in (np.zeros((4, 5), bool), np.zeros(6, ml_dtypes.bfloat16)):
        assert np.shares_memory(np.frombuffer(tenbin.encode_list([mask])[1], np.uint8), mask)
    # what must be reordered or swapped is copied, once
    for other in (big.T, big.astype(">f4")):
        assert not np.shares_memory(np.frombuffer(tenbin.encode_list([other])[1], np.uint8), other)


def test_decode_list_views_the_frames():
    a, b = np.arange(12, dtype=np.int16).reshape(3, 4), np.arange(5, dtype=np.float64)
    frames = [bytearray(f) for f in frames_bytes(tenbin.encode_list([a, b]))]
    got = tenbin.decode_list(frames)
    assert got[0].flags.writeable and np.shares_memory(got[0], np.frombuffer(frames[1], np.uint8))
    got[0][0, 0] = 99
    assert struct.unpack_from("=h", frames[1]) == (99,)
    readonly = tenbin.decode_list([bytes(f) for f in frames])
    assert not readonly[1].flags.writeable and np.array_equal(readonly[1], b)
    as_numpy = [np.frombuffer(f, np.uint8) for f in frames]
    assert np.shares_memory(tenbin.decode_list(as_numpy)[1], as_numpy[3])
    as_words = [np.frombuffer(frames[0], np.int64), frames[1], memoryview(frames[2]), frames[3]]
    assert np.array_equal(tenbin.decode_list(as_words)[1], b)


def test_decode_list_takes_zmq_frames():
    zmq = pytest.importorskip("zmq")
    a = np.arange(10, dtype=np.uint16)
    frames = [zmq.Frame(f) for f in frames_bytes(tenbin.encode_list([a], ["z"]))]
    got, names = tenbin.decode_list(frames, infos=True)
    assert np.array_equal(got[0], a) and names == ["z"]

    class OnlyBuffer:  # an object that is not itself a buffer, but has one
        def __init__(self, data):
            self.buffer = memoryview(data)

    assert np.array_equal(tenbin.decode_list([OnlyBuffer(bytes(f)) for f in frames])[0], a)


def test_decode_buffer_views_the_buffer_wherever_it_lies():
    arrays = [np.arange(7, dtype=np.float64), np.arange(3, dtype=np.int32)]
    buf = tenbin.encode_buffer(arrays)
    got = tenbin.decode_buffer(buf)
    assert got[0].flags.writeable and np.shares_memory(got[0], np.frombuffer(buf, np.uint8))
    del got
    odd = bytearray(b"x") + buf  # misaligned memory still decodes
    same_arrays(tenbin.decode_buffer(memoryview(odd)[1:]), arrays)
    same_arrays(tenbin.decode_buffer(np.frombuffer(bytes(buf), np.uint8)), arrays)


def _owner(array):
    while isinstance(array, np.ndarray) and array.base is not None:
        array = array.base
    return array.obj if isinstance(array, memoryview) else array


def test_load_maps_the_file_read_only_and_aligned(tmp_path):
    arrays = [np.arange(n + 1, dtype=np.float32) for n in range(6)]
    path = tmp_path / "m.ten"
    tenbin.save(path, *arrays)
    mapped = tenbin.load(path, mmap=True)
    same_arrays(mapped, arrays)
    for n, array in enumerate(mapped):
        assert not array.flags.writeable and isinstance(_owner(array), mmap.mmap)
        assert array.ctypes.data % 32 == 0 and (n % 2 == 0 or array.ctypes.data % 64 == 0)
    read = tenbin.load(path)
    assert all(a.flags.writeable and a.ctypes.data % 32 == 0 for a in read)
    stream = io.BytesIO(path.read_bytes())
    assert all(a.flags.writeable and a.ctypes.data % 64 == 0 for a in tenbin.read(stream))
    (tmp_path / "empty.ten").write_bytes(b"")
    assert tenbin.load(tmp_path / "empty.ten", mmap=True) == [] == tenbin.load(tmp_path / "empty.ten")


def test_the_data_offsets_alternate_32_and_64_aligned():
    arrays = [np.zeros(n * 13 + 1, np.uint8) for n in range(8)]
    buf = tenbin.encode_buffer(arrays)
    base = np.frombuffer(buf, np.uint8).ctypes.data
    offsets = [a.ctypes.data - base for a in tenbin.decode_buffer(buf)]
    assert [o % 64 for o in offsets] == [32, 0] * 4


# -- files and streams ------------------------------------------------------------------------------

def test_read_at_most_n_arrays_and_concatenated_files(tmp_path):
    first = [np.arange(3, dtype=np.int8), np.ones((2, 2), np.float16), np.array(5, np.uint64)]
    stream = io.BytesIO()
    tenbin.write(stream, first, ["x", "y", "z"])
    stream.seek(0)
    assert tenbin.read(stream, 0) == []
    got, names = tenbin.read(stream, 2, infos=True)
    same_arrays(got, first[:2])
    assert names == ["x", "y"]
    same_arrays(tenbin.read(stream, 5), first[2:])
    assert tenbin.read(stream) == [] and tenbin.read(io.BytesIO()) == []
    second = [np.zeros((0, 4), np.int32), np.arange(4, dtype=np.uint32)]
    tenbin.save(tmp_path / "1.ten", *first)
    tenbin.save(tmp_path / "2.ten", *second)
    (tmp_path / "both.ten").write_bytes((tmp_path / "1.ten").read_bytes() + (tmp_path / "2.ten").read_bytes())
    same_arrays(tenbin.load(tmp_path / "both.ten"), first + second)
    same_arrays(tenbin.load(str(tmp_path / "both.ten"), mmap=True), first + second)


def test_file_names_must_end_in_ten_unless_unchecked(tmp_path):
    path = str(tmp_path / "arrays.bin")
    with pytest.raises(ValueError, match="arrays.bin"):
        tenbin.save(path, np.zeros(2))
    assert not os.path.exists(path)
    tenbin.save(path, np.zeros(2), nocheck=True)
    with pytest.raises(ValueError, match="arrays.bin"):
        tenbin.load(path)
    assert tenbin.load(path, nocheck=True)[0].shape == (2,)


def test_a_stream_without_readinto_or_size_is_read_in_pieces():
    class Pipe:
        def __init__(self, data):
            self._data = io.BytesIO(data)

        def read(self, n=-1):
            return self._data.read(min(n, 7) if n > 0 else n)  # short reads, as a pipe gives

    arrays = [np.arange(100, dtype=np.int32), np.zeros((3, 0)), np.arange(5, dtype=np.float16)]
    same_arrays(tenbin.read(Pipe(bytes(tenbin.encode_buffer(arrays)))), arrays)


# -- malformed input --------------------------------------------------------------------------------

def small_buffer() -> bytes:
    return bytes(tenbin.encode_buffer([np.arange(3, dtype=np.int16), np.zeros((2, 2), bool), np.array(1.5, np.float32)],
                                      ["one", "a long info", ""]))


def chunk_offsets(buf: bytes) -> list[int]:
    out, at = [], 0
    while at < len(buf):
        out.append(at)
        at += 16 + -(-struct.unpack_from("=q", buf, at + 8)[0] // 64) * 64
    return out


def decoded_everywhere(data: bytes, tmp_path):
    """What the buffer, stream and file decoders make of ``data``: arrays, or the TenbinError."""
    results = []
    path = tmp_path / "d.ten"
    path.write_bytes(data)
    for decode in (tenbin.decode_buffer, lambda d: tenbin.read(io.BytesIO(d)), lambda d: tenbin.load(path),
                   lambda d: tenbin.load(path, mmap=True)):
        try:
            results.append(decode(data))
        except TenbinError as exc:
            results.append(exc)
    return results


def test_a_cut_at_every_byte_is_an_error_unless_it_falls_between_arrays(tmp_path):
    buf = small_buffer()
    chunks = chunk_offsets(buf)
    boundaries = {0: 0, chunks[2]: 1, chunks[4]: 2, len(buf): 3}
    for cut in range(len(buf) + 1):
        for result in decoded_everywhere(buf[:cut], tmp_path):
            if cut in boundaries:
                assert isinstance(result, list) and len(result) == boundaries[cut], cut
            else:  # reported at the chunk the cut falls in, or at the missing data chunk
                chunk = cut if cut in chunks else max(c for c in chunks if c < cut)
                assert isinstance(result, TenbinError) and result.offset == chunk, (cut, result)
                assert f"array {chunks.index(chunk) // 2}: " in str(result), (cut, result)


def test_damaged_chunk_leads_name_the_array_and_chunk(tmp_path):
    buf = small_buffer()
    chunks = chunk_offsets(buf)
    for k, at in enumerate(chunks):
        bad = bytearray(buf)
        bad[at : at + 8] = b"~TenBun~"
        for result in decoded_everywhere(bytes(bad), tmp_path):
            assert isinstance(result, TenbinError) and result.offset == at and f"array {k // 2}:" in str(result)
            assert "does not start with b'~TenBin~'" in str(result)
        for nbytes in (-1, -(2**63), 2**62, 2**63 - 1, len(buf)):
            bad = bytearray(buf)
            struct.pack_into("=q", bad, at + 8, nbytes)
            for result in decoded_everywhere(bytes(bad), tmp_path):
                assert isinstance(result, TenbinError) and result.offset == at, (k, nbytes, result)
    path = tmp_path / "d.ten"
    assert str(decoded_everywhere(buf[:-1], tmp_path)[2]).startswith(f"{path}: at byte offset {chunks[-1]}: array 2: data chunk")


def header_frames(words, data: bytes = b"") -> list:
    return [struct.pack(f"={len(words)}q", *[struct.unpack("=q", w)[0] if isinstance(w, bytes) else w for w in words]), data]


CODE = b"f4\0\0\0\0\0\0"
BAD_HEADERS = [
    ([CODE, 0], "not 3 or more 8-byte words"),
    ([b"c8\0\0\0\0\0\0", 0, 1, 2], "unknown dtype code b'c8'"),
    ([b"\xff" * 8, 0, 1, 2], "unknown dtype code"),
    ([CODE, 0, -1], "ndim -1 is not between 0 and 32"),
    ([CODE, 0, 33] + [1] * 33, "ndim 33"),
    ([CODE, 0, 2**62], "ndim"),
    ([CODE, 0, 3, 1, 1], "ndim 3 needs 48 bytes, the header has 40"),
    ([CODE, 0, 2, 3, -2], "negative dimension"),
    ([CODE, 0, 3, -1, -1, 2], r"negative dimension in shape \(-1, -1, 2\)"),
    ([CODE, 0, 3, 2**40, 2**40, 2**40], r"shape \(1099511627776, 1099511627776, 1099511627776\) is too large"),
    ([CODE, 0, 2, 2**31, 2**30], r"shape \(2147483648, 1073741824\) is too large"),
    ([CODE, 0, 3, 2**62, 2**62, 0], "too large for numpy"),
    ([CODE, 0, 2, 2**63 - 1, 2**63 - 1], "too large"),
    ([CODE, 0, 2, 2**30, 2**29], "holds 0 bytes, its header says 2305843009213693952"),
    ([CODE, b"\xc3\xa9t\xc3\xa9\0\0\0", 1, 0], "info word .* is not ASCII"),
    ([CODE, 0, 1, 0, b"dtype\0\0\0"], "too few for an extension record"),
    ([CODE, 0, 1, 0, b"dtype\0\0\0", 9, 0], "claims 9 bytes, 8 follow"),
    ([CODE, 0, 1, 0, b"dtype\0\0\0", -1, 0], "claims -1 bytes"),
    ([CODE, 0, 1, 0, b"dtype\0\0\0", 4, b"bool\0\0\0\0"], "dtype 'bool' is stored as code 'u1', the header has 'f4'"),
    ([CODE, 0, 1, 0, b"dtype\0\0\0", 7, b"float32\0"], "unknown dtype 'float32'"),
    ([CODE, 0, 1, 0, b"info\0\0\0\0", 2, b"\xff\xfe\0\0\0\0\0\0"], "not UTF-8"),
    ([CODE, 0, 1, 0, b"info\0\0\0\0", 1, b"a\0\0\0\0\0\0\0", b"info\0\0\0\0", 1, b"b\0\0\0\0\0\0\0"], "two info"),
]


@pytest.mark.parametrize("words,words_said", BAD_HEADERS, ids=[w for _, w in BAD_HEADERS])
def test_malformed_headers_are_tenbin_errors_naming_frame_and_array(words, words_said, tmp_path):
    frames = [*tenbin.encode_list([np.zeros(2, np.uint8)]), *header_frames(words)]
    with pytest.raises(TenbinError, match=words_said) as caught:
        tenbin.decode_list(frames)
    assert "frame 2 (header of array 1)" in str(caught.value) or "frame 3 (data of array 1)" in str(caught.value)
    assert caught.value.offset is None and caught.value.url is None
    buf = bytes(tenbin.encode_buffer([np.zeros(2, np.uint8)]))
    header = frames[2]
    chunked = buf + b"~TenBin~" + struct.pack("=q", len(header)) + header.ljust(-(-len(header) // 64) * 64, b"\0")
    chunked += b"~TenBin~" + bytes(8)
    for result in decoded_everywhere(chunked, tmp_path):
        assert isinstance(result, TenbinError) and result.offset in (len(buf), len(buf) + 16 + -(-len(header) // 64) * 64), result
        assert "array 1:" in str(result)


def test_frames_that_do_not_pair_or_are_not_buffers():
    frames = frames_bytes(tenbin.encode_list([np.zeros(2), np.ones(3)]))
    with pytest.raises(TenbinError, match="3 frames"):
        tenbin.decode_list(frames[:3])
    with pytest.raises(TenbinError, match="frame 3 .data of array 1. holds 23 bytes, its header says 24"):
        tenbin.decode_list(frames[:3] + [frames[3][:-1]])
    with pytest.raises(TenbinError, match="frame 3 .data of array 1. holds 25 bytes"):
        tenbin.decode_list(frames[:3] + [frames[3] + b"\0"])
    with pytest.raises(TenbinError, match="frame 1 is a int"):
        tenbin.decode_list([frames[0], 5])
    with pytest.raises(TenbinError, match="frame 0 is not contiguous"):
        tenbin.decode_list([memoryview(frames[0] * 2)[::2], frames[1]])
    assert tenbin.decode_list([]) == [] and np.array_equal(tenbin.decode_list(iter(frames[:2]))[0], np.zeros(2))
    with pytest.raises(TenbinError, match="the buffer is a int"):
        tenbin.decode_buffer(5)
    with pytest.raises(TenbinError, match="the buffer is not contiguous"):
        tenbin.decode_buffer(memoryview(bytes(64))[::2])


def test_a_header_without_data_and_a_data_size_mismatch_in_a_buffer(tmp_path):
    buf = bytes(tenbin.encode_buffer([np.zeros(4, np.int32)]))
    header_only = buf[:80]
    for result in decoded_everywhere(header_only, tmp_path):
        assert isinstance(result, TenbinError) and result.offset == 80 and "array 0" in str(result)
    bad = bytearray(buf)
    struct.pack_into("=q", bad, 88, 12)
    for result in decoded_everywhere(bytes(bad), tmp_path):
        assert isinstance(result, TenbinError) and result.offset == 80 and "holds 12 bytes, its header says 16" in str(result)


def test_a_lying_length_costs_no_memory_on_a_stream():
    header = b"u1".ljust(16, b"\0") + struct.pack("=3q", 2, 1 << 20, 1 << 20)
    data = b"~TenBin~" + struct.pack("=q", header.__len__()) + header.ljust(64, b"\0") + b"~TenBin~" + struct.pack("=q", 1 << 40)

    class Pipe(io.RawIOBase):  # not seekable: its size cannot be told in advance
        def __init__(self, data):
            self._data = io.BytesIO(data + b"\1" * 1000)

        def readable(self):
            return True

        def readinto(self, b):
            return self._data.readinto(b)

    with pytest.raises(TenbinError, match=r"array 0: data chunk cut short: 1000 of its 1099511627776"):
        tenbin.read(Pipe(data))
    with pytest.raises(TenbinError, match="claims 1099511627776 bytes"):
        tenbin.decode_buffer(data + b"\1" * 1000)
