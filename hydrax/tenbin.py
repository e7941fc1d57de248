"""The tenbin tensor format of NVlabs tensorcom, read and written by hydrax's own code.

tenbin carries a list of numpy arrays as a ``.ten`` file, as one byte buffer (a single-part
ZeroMQ message), or as the frames of one multipart ZeroMQ message. For every array tensorcom
0.1.0 handles correctly, hydrax writes the same bytes and reads what tensorcom writes; where
tensorcom is wrong or refuses, hydrax does the right thing (see *Differences from tensorcom*).

Layout
------

Every integer is an 8-byte signed integer in the host's native byte order (little-endian on
every host hydrax runs on); a *word* is such an integer. A *str64* is a string of at most 8
ASCII characters padded with NUL bytes to 8 bytes; readers drop NULs at both ends.

An array is two payloads:

- the **header**: the words ``code, info, ndim, dim[0], ..., dim[ndim-1]``, where ``code`` is the
  str64 dtype code (:data:`DTYPE_CODES`), ``info`` a str64 name chosen by the writer (empty by
  default), and the dims the shape; hydrax may append extension records (below);
- the **data**: the elements in C order, exactly ``prod(shape) * itemsize`` bytes.

A 0-d array has ``ndim`` 0, no dims and one element. hydrax accepts up to :data:`MAX_NDIM` dims.

*Multipart form*: frames ``header0, data0, header1, data1, ...`` holding the bare payloads.

*Buffer and file form*: each payload, headers and data alike, becomes a chunk: the 8 bytes
``~TenBin~``, a word giving the payload's length in bytes, the payload, and NUL bytes up to the
next multiple of 64 (none when the length is already one). There is no file header, array count
or end marker, so concatenated ``.ten`` files are a ``.ten`` file holding all their arrays.

Header extension
----------------

tensorcom's reader looks at the first ``3 + ndim`` words of a header and ignores any after them.
hydrax uses that room for what the dtype codes and the 8-byte info word cannot say. After the
dims come zero or more records, each:

- a tag word: a str64, ``dtype`` or ``info``;
- a length word ``L``: the number of payload bytes, ``L >= 0``;
- ``ceil(L / 8)`` words holding the payload, UTF-8 text, padded with NUL bytes.

``dtype`` records name the array's real dtype by its numpy name, ``bool`` or ``bfloat16``
(ml_dtypes'); the code word then holds the unsigned type of the same size (``u1`` for bool, ``u2``
for bfloat16), so a tensorcom reader gets the raw bits as uint8 or uint16. ``info`` records hold
an info string that does not fit the info word (longer than 8 characters, not ASCII, or with a
NUL at either end); the info word then holds its first 8 characters if they are ASCII, and is
empty otherwise. hydrax writes a ``dtype`` record before an ``info`` record, and writes neither
when the word says it all, so that its output stays byte for byte tensorcom's. Readers skip
records with other tags, so later versions may add some. For example, a bool array of shape
(2, 3) with info ``"segmentation"`` has the 96-byte header (words, in order)::

    "u1"  "segmenta"  2  2  3  "dtype"  4  "bool"  "info"  12  "segmenta"  "tion"

Alignment
---------

A chunk takes 16 bytes plus a multiple of 64, so chunk ``k`` starts at an offset that is
``16 * k`` modulo 64 and its payload at ``16 * (k + 1)``: the data of arrays 1, 3, 5, ... starts
64-byte aligned, that of arrays 0, 2, 4, ... only 32-byte aligned. Nothing a writer chooses
changes this: lengths are padded to multiples of 64, and tensorcom's readers pair chunks by
position, so an extra chunk to shift the rest would be read as an array. (The same holds inside
a tar, whose members start on 512-byte boundaries.) :func:`load` reads a file into memory that is
64-byte aligned, or maps it, so its arrays are at least 32-byte aligned in memory; frames and
buffers given to the decoders are used where they lie.

Differences from tensorcom 0.1.0
--------------------------------

- uint32 (code ``u4``) works; tensorcom's table misspells it.
- 0-d arrays decode; tensorcom's decoder fails on them.
- Big-endian arrays are written in native order; tensorcom writes their bytes unchanged under a
  native code, so they decode as other numbers.
- Arrays of any strides are written in C order in every form; tensorcom's ``save`` and ``write``
  fail on or garble arrays that are not C-contiguous.
- Up to :data:`MAX_NDIM` dims; tensorcom refuses 10 or more when writing (but reads them).
- bool, bfloat16, and infos that are long or not ASCII, through the header extension.
- Complex, object, string, structured and other dtypes are refused with :class:`TenbinError`.
- Malformed input raises :class:`~hydrax.errors.TenbinError` saying which array or frame and
  where; a header chunk with no data chunk after it, a data payload whose length is not the
  header's, and a last chunk missing its padding are errors (tensorcom drops, ignores or
  accepts them).
- A list of expected infos given to a decoder is checked, and a matching one accepted (the copy
  of tenbin in webdataset rejects every list).
- A header may take at most 1 MiB, so that a damaged length word cannot make a reader allocate
  or loop without bound; real headers take a few dozen bytes.
"""

from __future__ import annotations

import math
import mmap as _mmap
import os
import stat
import struct
from types import MappingProxyType

import numpy as np

from .errors import TenbinError

__all__ = [
    "CODE_DTYPES", "DTYPE_CODES", "MAGIC", "MAX_NDIM", "TenbinError", "aligned_empty", "data_nbytes", "decode_buffer", "decode_list", "encode_buffer",
    "encode_list",
    "load", "read", "save", "write",
]

#: The numpy dtypes tenbin's dtype codes stand for, and their codes.
DTYPE_CODES = MappingProxyType({np.dtype(name): code for name, code in (
    ("float16", "f2"), ("float32", "f4"), ("float64", "f8"),
    ("int8", "i1"), ("int16", "i2"), ("int32", "i4"), ("int64", "i8"),
    ("uint8", "u1"), ("uint16", "u2"), ("uint32", "u4"), ("uint64", "u8"),
)})

#: The reverse of :data:`DTYPE_CODES`: code to numpy dtype.
CODE_DTYPES = MappingProxyType({code: dtype for dtype, code in DTYPE_CODES.items()})

#: The most dims an array may have (numpy 1's limit, so that every reader can build it).
MAX_NDIM = 32

# dtypes carried by a "dtype" extension record, and the code of their storage type
_EXTENSION_STORAGE = MappingProxyType({"bool": "u1", "bfloat16": "u2"})

#: The 8 bytes every chunk of the buffer and file form starts with.
MAGIC = b"~TenBin~"
_LEAD = struct.Struct("=8sq")  # a chunk's magic and length; also a record's tag and length
_HEAD = struct.Struct("=8s8sq")
_DIMS = tuple(struct.Struct(f"={n}q") for n in range(MAX_NDIM + 1))
_HEADS = tuple(struct.Struct(f"=8s8sq{n}q") for n in range(MAX_NDIM + 1))
_ZEROS = bytes(64)
_INT64_MAX = 2**63 - 1
# A header is a few dozen bytes; the cap stops a damaged length word from making a stream reader
# allocate, or the record parser loop, without bound.
_MAX_HEADER = 1 << 20
# Stream reads of payloads bigger than this go in pieces, so that a length word that lies costs
# no more memory than the bytes that are really there.
_READ_STEP = 1 << 26

_CODE_WORDS = {code.encode("ascii").ljust(8, b"\0"): dtype for code, dtype in CODE_DTYPES.items()}
_STORAGE_BY_KIND = {(dtype.kind, dtype.itemsize): dtype for dtype in DTYPE_CODES}
_encode_cache: dict = {}
_parsed: dict = {}  # header bytes -> what _parse_header makes of them
_REMEMBERED = 512
_REMEMBERED_HEADER = 512
_extension_dtypes: dict = {}


class _Malformed(Exception):
    """A problem with a header, in words; the caller adds which array and where."""


def _roundup(n: int, k: int = 64) -> int:
    return -(-n // k) * k


def _str64(text: str) -> bytes:
    return text.encode("ascii").ljust(8, b"\0")


def _extension_dtype(name: str) -> np.dtype:
    dtype = _extension_dtypes.get(name)
    if dtype is None:
        if name == "bool":
            dtype = np.dtype(bool)
        else:  # imported on first use: hydrax.tenbin should not cost ml_dtypes' import otherwise
            try:
                import ml_dtypes
            except ImportError as exc:
                raise _Malformed(f"dtype {name!r} needs the ml_dtypes package, which is not installed") from exc
            dtype = np.dtype(getattr(ml_dtypes, name))
        _extension_dtypes[name] = dtype
    return dtype


def _encoding(dtype: np.dtype):
    """``(code word, extension name or None, native storage dtype, storage dtype as given)`` for
    arrays of ``dtype``, or None when tenbin cannot carry it."""
    found = _encode_cache.get(dtype)
    if found is not None:
        return found
    extension = None
    storage = None
    if dtype.names is None and dtype.subdtype is None:
        if dtype.kind in "fiu":
            storage = _STORAGE_BY_KIND.get((dtype.kind, dtype.itemsize))
        elif dtype.kind == "b":
            extension, storage = "bool", np.dtype(np.uint8)
        elif dtype.kind == "V" and dtype.name == "bfloat16" and dtype.itemsize == 2 and dtype.type.__module__.startswith("ml_dtypes"):
            extension, storage = "bfloat16", np.dtype(np.uint16)
    if storage is None:
        return None
    # the storage type in the array's own byte order: viewing the array as it and copying into
    # the native storage type is what turns big-endian input into native bytes
    given = storage if dtype.isnative else storage.newbyteorder(">" if np.little_endian else "<")
    found = (_str64(DTYPE_CODES[storage]), extension, storage, given)
    _encode_cache[dtype] = found
    return found


def _record(tag: str, payload: bytes) -> bytes:
    return _LEAD.pack(_str64(tag), len(payload)) + payload.ljust(_roundup(len(payload), 8), b"\0")


def _check_infos(arrays: list, infos) -> list:
    if infos is None:
        return [""] * len(arrays)
    if isinstance(infos, str) or len(infos) != len(arrays):
        count = "a string" if isinstance(infos, str) else f"{len(infos)} infos"
        raise TenbinError(f"{count} given for {len(arrays)} arrays; infos must be a list of one string per array")
    return list(infos)


def _prepare_all(arrays, infos) -> list:
    arrays = list(arrays)
    return [_prepare(index, array, info) for index, (array, info) in enumerate(zip(arrays, _check_infos(arrays, infos)))]


def _prepare(index: int, array, info):
    """Header bytes and what the data payload is made from, for array number ``index``.

    Returns ``(header, source, storage, direct)``: ``source`` is the array viewed as its storage
    type, ``direct`` whether its memory already is the payload (C-contiguous, native order).
    """
    if not isinstance(array, np.ndarray):
        array = np.asarray(array)
    encoding = _encoding(array.dtype)
    if encoding is None:
        raise TenbinError(f"array {index}: dtype {array.dtype} cannot be stored in tenbin "
                          "(it carries float16/32/64, int8-64, uint8-64, bool and bfloat16)")
    code, extension, storage, given = encoding
    if array.ndim > MAX_NDIM:
        raise TenbinError(f"array {index}: {array.ndim} dims; tenbin carries at most {MAX_NDIM}")
    if not isinstance(info, str):
        raise TenbinError(f"array {index}: info {info!r} is not a string")
    records = b""
    if extension is not None:
        records = _record("dtype", extension.encode("ascii"))
    if len(info) <= 8 and info.isascii() and not info.startswith("\0") and not info.endswith("\0"):
        word = info.encode("ascii")
    else:
        try:
            records += _record("info", info.encode("utf-8"))
        except UnicodeEncodeError:
            raise TenbinError(f"array {index}: info {info!r} cannot be written as UTF-8") from None
        word = info[:8].encode("ascii") if info[:8].isascii() else b""
    header = _HEADS[array.ndim].pack(code, word, array.ndim, *array.shape) + records
    source = array if extension is None and given is storage else array.view(given)
    return header, source, storage, given is storage and array.flags.c_contiguous


def _payload(source: np.ndarray, storage: np.dtype, direct: bool) -> memoryview:
    """The data payload as a flat byte view: the array's own memory, or a C-order native copy."""
    if not direct:
        copy = np.empty(source.shape, storage)
        np.copyto(copy, source)
        source = copy
    return memoryview(source.reshape(-1).view(np.uint8))


def encode_list(arrays, infos=None) -> list:
    """Encode arrays as the frames of one multipart message: ``[header0, data0, header1, ...]``.

    :param arrays: numpy arrays (anything else is converted with :func:`numpy.asarray`).
    :param infos: None (every info empty), or one string per array.
    :returns: a list of ``2 * len(arrays)`` frames. Headers are ``bytes``. A data frame is a flat
        byte :class:`memoryview` of the array itself when the array is C-contiguous and in native
        byte order, and of a C-order native copy otherwise.
    :raises TenbinError: for a dtype tenbin cannot carry, more than :data:`MAX_NDIM` dims, or
        infos that are not one string per array.
    """
    frames = []
    for header, source, storage, direct in _prepare_all(arrays, infos):
        frames += (header, _payload(source, storage, direct))
    return frames


def encode_buffer(arrays, infos=None) -> bytearray:
    """Encode arrays as one buffer, byte for byte the contents of a ``.ten`` file.

    :param arrays: numpy arrays (anything else is converted with :func:`numpy.asarray`).
    :param infos: None (every info empty), or one string per array.
    :returns: the chunks of all headers and data payloads, in order.
    :raises TenbinError: as :func:`encode_list`.
    """
    prepared = _prepare_all(arrays, infos)
    total = sum(32 + _roundup(len(header)) + _roundup(source.size * storage.itemsize)
                for header, source, storage, _ in prepared)
    out = bytearray(total)
    at = 0
    for header, source, storage, _ in prepared:
        _LEAD.pack_into(out, at, MAGIC, len(header))
        out[at + 16 : at + 16 + len(header)] = header
        at += 16 + _roundup(len(header))
        nbytes = source.size * storage.itemsize
        _LEAD.pack_into(out, at, MAGIC, nbytes)
        if nbytes:
            # straight into the buffer: one pass, which also does the C ordering and byte swap
            target = np.frombuffer(out, storage, source.size, at + 16).reshape(source.shape)
            np.copyto(target, source)
            del target  # a bytearray with a live export cannot be resized by the caller
        at += 16 + _roundup(nbytes)
    return out


def _write_chunk(stream, payload) -> None:
    nbytes = payload.nbytes if isinstance(payload, memoryview) else len(payload)
    stream.write(_LEAD.pack(MAGIC, nbytes))
    if nbytes:
        stream.write(payload)
    if nbytes % 64:
        stream.write(_ZEROS[: 64 - nbytes % 64])


def write(stream, arrays, infos=None) -> None:
    """Write arrays to a binary stream in the chunked (``.ten`` file) form.

    Every array is checked before anything is written, so a refused array leaves the stream as
    it was. Arrays that are C-contiguous and native are written from their own memory, others
    one at a time through a C-order copy.

    :param stream: a binary file object (anything with ``write``).
    :param arrays: numpy arrays.
    :param infos: None, or one string per array.
    :raises TenbinError: as :func:`encode_list`.
    """
    _write_prepared(stream, _prepare_all(arrays, infos))


def _write_prepared(stream, prepared: list) -> None:
    for header, source, storage, direct in prepared:
        _write_chunk(stream, header)
        _write_chunk(stream, _payload(source, storage, direct))


def save(fname, *arrays, infos=None, nocheck: bool = False) -> None:
    """Save arrays to a ``.ten`` file (replacing it).

    :param fname: the file's path; it must end in ``.ten`` unless ``nocheck``.
    :param arrays: the arrays, as separate arguments.
    :param infos: None, or one string per array.
    :raises ValueError: for a name that does not end in ``.ten``.
    :raises TenbinError: as :func:`encode_list`; the file is then not touched.
    """
    fname = os.fspath(fname)
    _check_name(fname, nocheck)
    prepared = _prepare_all(arrays, infos)
    with open(fname, "wb") as stream:
        _write_prepared(stream, prepared)


def _check_name(fname, nocheck: bool) -> None:
    if not nocheck and not str(fname).endswith(".ten"):
        raise ValueError(f"{fname!r} does not end in '.ten' (pass nocheck=True to use another name)")


# -- decoding --------------------------------------------------------------------------------------

def _parsed_header(header, nbytes: int):
    """:func:`_parse_header` of a whole header payload, remembered for short ones: the messages of
    one stream repeat a few headers, and a lookup costs a fraction of a parse."""
    if nbytes > _REMEMBERED_HEADER:
        return _parse_header(header, 0, nbytes)
    key = header if type(header) is bytes else bytes(header)
    found = _parsed.get(key)
    if found is None:
        found = _parse_header(key, 0, nbytes)
        if len(_parsed) >= _REMEMBERED:
            _parsed.clear()
        _parsed[key] = found
    return found


def _shown(word: bytes) -> str:
    return repr(word.rstrip(b"\0"))


def _parse_header(buf, start: int, nbytes: int):
    """``(dtype, shape, count, info)`` from the header payload of ``nbytes`` at ``start`` of ``buf``."""
    if nbytes < 24 or nbytes % 8 or nbytes > _MAX_HEADER:
        raise _Malformed(f"its {nbytes} bytes are not 3 or more 8-byte words, up to {_MAX_HEADER} bytes")
    code, word, ndim = _HEAD.unpack_from(buf, start)
    dtype = _CODE_WORDS.get(code)
    if dtype is None:
        dtype = _CODE_WORDS.get(code.strip(b"\0").ljust(8, b"\0"))
        if dtype is None:
            raise _Malformed(f"unknown dtype code {_shown(code)}")
    if not 0 <= ndim <= MAX_NDIM:
        raise _Malformed(f"ndim {ndim} is not between 0 and {MAX_NDIM}")
    end = 24 + 8 * ndim
    if nbytes < end:
        raise _Malformed(f"ndim {ndim} needs {end} bytes, the header has {nbytes}")
    shape = _DIMS[ndim].unpack_from(buf, start + 24)
    if ndim and min(shape) < 0:
        raise _Malformed(f"negative dimension in shape {shape}")
    count = math.prod(shape)
    if not count:
        count = math.prod(d for d in shape if d)  # numpy refuses a zero-size array whose other dims overflow
        if count * dtype.itemsize > _INT64_MAX:
            raise _Malformed(f"shape {shape} is too large for numpy")
        count = 0
    elif count * dtype.itemsize > _INT64_MAX:
        raise _Malformed(f"shape {shape} is too large for numpy")
    info = None
    if nbytes > end:
        dtype, info = _parse_records(buf, start + end, nbytes - end, dtype)
    if info is None:
        if word == b"\0\0\0\0\0\0\0\0":
            info = ""
        else:
            try:
                info = word.strip(b"\0").decode("ascii")
            except UnicodeDecodeError:
                raise _Malformed(f"info word {word!r} is not ASCII") from None
    return dtype, shape, count, info


def _parse_records(buf, at: int, left: int, dtype: np.dtype):
    """The dtype and info that the extension records at ``at`` say (info None when none does)."""
    extension = info = None
    while left:
        if left < 16:
            raise _Malformed(f"{left} bytes after the dims and records, too few for an extension record")
        tag, length = _LEAD.unpack_from(buf, at)
        if not 0 <= length <= left - 16:
            raise _Malformed(f"extension record {_shown(tag)} claims {length} bytes, {left - 16} follow")
        step = 16 + _roundup(length, 8)
        if step > left:
            raise _Malformed(f"extension record {_shown(tag)} needs {step} bytes, {left} follow")
        tag = tag.strip(b"\0")
        if tag in (b"dtype", b"info"):
            try:
                text = bytes(buf[at + 16 : at + 16 + length]).decode("utf-8")
            except UnicodeDecodeError:
                raise _Malformed(f"extension record {tag!r} is not UTF-8") from None
            if tag == b"dtype":
                if extension is not None:
                    raise _Malformed("two dtype extension records")
                storage = _EXTENSION_STORAGE.get(text)
                if storage is None:
                    raise _Malformed(f"unknown dtype {text!r} in its dtype extension record")
                if CODE_DTYPES[storage] != dtype:
                    raise _Malformed(f"dtype {text!r} is stored as code {storage!r}, the header has {DTYPE_CODES[dtype]!r}")
                extension = _extension_dtype(text)
            else:
                if info is not None:
                    raise _Malformed("two info extension records")
                info = text
        at += step
        left -= step
    return (dtype if extension is None else extension), info


def _infos_result(arrays: list, names: list, infos, url=None):
    if infos is False or infos is None:
        return arrays
    if infos is True:
        return arrays, names
    if not isinstance(infos, (list, tuple)):
        raise TypeError(f"infos must be False, None, True or a list of the expected infos, not {infos!r}")
    if len(infos) != len(names):
        raise TenbinError(f"{len(names)} arrays, {len(infos)} infos expected", url=url)
    for index, (expected, actual) in enumerate(zip(infos, names)):
        if expected != actual:
            raise TenbinError(f"array {index} has info {actual!r}, {expected!r} expected", url=url)
    return arrays


def _as_bytes(obj):
    """``obj`` as something that struct and numpy read as its bytes, and its length in bytes.

    Raises ``_Malformed`` for what is not contiguous memory.
    """
    kind = type(obj)
    if kind is bytes or kind is bytearray or kind is _mmap.mmap:
        return obj, len(obj)
    if kind is not memoryview:
        if isinstance(obj, np.ndarray):
            if not obj.flags.c_contiguous:
                raise _Malformed("is a numpy array that is not C-contiguous")
            obj = obj.reshape(-1).view(np.uint8)
            return obj, obj.size
        try:
            obj = memoryview(obj)  # a zmq.Frame exports its memory too, and faster than through .buffer
        except TypeError:
            try:
                obj = memoryview(obj.buffer)
            except (AttributeError, TypeError):
                raise _Malformed(f"is a {type(obj).__name__}, not bytes or a buffer") from None
    if not obj.c_contiguous:
        raise _Malformed("is not contiguous memory")
    if obj.ndim != 1 or obj.format != "B":
        try:
            obj = obj.cast("B")
        except TypeError:  # a format memoryview cannot recast; numpy can still see its bytes
            obj = np.frombuffer(obj, np.uint8)
            return obj, obj.size
    return obj, obj.nbytes


def decode_list(frames, infos=False):
    """Decode the frames of one multipart message into arrays.

    :param frames: the frames, ``[header0, data0, header1, data1, ...]``: bytes, bytearrays,
        memoryviews, C-contiguous numpy arrays, or objects with a ``.buffer`` (``zmq.Frame``).
    :param infos: False or None to return the arrays; True to return ``(arrays, infos)``; a list
        of the infos expected, which are checked, to return the arrays.
    :returns: numpy arrays that are views of the data frames (no copy), writeable where a frame
        is writeable memory.
    :raises TenbinError: for malformed frames (the message names the frame and its array), or
        infos other than those expected.
    """
    if not isinstance(frames, (list, tuple)):
        frames = list(frames)
    if len(frames) % 2:
        raise TenbinError(f"{len(frames)} frames: tenbin frames come in pairs (header, data)")
    arrays = []
    names = []
    for k in range(0, len(frames), 2):
        try:
            header, nbytes = _as_bytes(frames[k])
        except _Malformed as exc:
            raise TenbinError(f"frame {k} {exc}") from None
        try:
            dtype, shape, count, info = _parsed_header(header, nbytes)
        except _Malformed as exc:
            raise TenbinError(f"frame {k} (header of array {k // 2}): {exc}") from None
        try:
            data, nbytes = _as_bytes(frames[k + 1])
        except _Malformed as exc:
            raise TenbinError(f"frame {k + 1} {exc}") from None
        if nbytes != count * dtype.itemsize:
            raise TenbinError(f"frame {k + 1} (data of array {k // 2}) holds {nbytes} bytes, "
                              f"its header says {count * dtype.itemsize} ({dtype}, shape {shape})")
        arrays.append(np.frombuffer(data, dtype, count).reshape(shape))
        names.append(info)
    return _infos_result(arrays, names, infos)


def data_nbytes(header) -> int:
    """The byte count of the data frame that a multipart message's header frame announces.

    Lets a receiver size (and align) the memory for the data frame before receiving it.

    :param header: a header frame (bytes, memoryview, ``zmq.Frame``, ...), as :func:`decode_list` takes.
    :raises TenbinError: for a malformed header.
    """
    try:
        header, nbytes = _as_bytes(header)
        dtype, _, count, _ = _parsed_header(header, nbytes)
    except _Malformed as exc:
        raise TenbinError(f"header frame: {exc}") from None
    return count * dtype.itemsize

def _chunk(buf, total: int, at: int, index: int, what: str, url, base: int):
    """``(payload start, payload length, next chunk)`` of the chunk at ``at``."""
    if total - at < 16:
        raise TenbinError(f"array {index}: {what} chunk cut short: {total - at} of its 16 lead bytes", url=url, offset=base + at)
    magic, nbytes = _LEAD.unpack_from(buf, at)
    if magic != MAGIC:
        raise TenbinError(f"array {index}: {what} chunk does not start with {MAGIC!r} but {magic!r}", url=url, offset=base + at)
    room = total - at - 16
    if nbytes < 0 or _roundup(nbytes) > room:
        raise TenbinError(f"array {index}: {what} chunk claims {nbytes} bytes of payload (padded to a multiple of 64), "
                          f"{room} follow", url=url, offset=base + at)
    return at + 16, nbytes, at + 16 + _roundup(nbytes)


def _decode_chunks(buf, infos, url=None, base: int = 0):
    try:
        buf, total = _as_bytes(buf)
    except _Malformed as exc:
        raise TenbinError(f"the buffer {exc}", url=url) from None
    arrays = []
    names = []
    at = 0
    while at < total:
        index = len(arrays)
        start, nbytes, after = _chunk(buf, total, at, index, "header", url, base)
        try:
            dtype, shape, count, info = _parsed_header(buf[start : start + nbytes], nbytes)
        except _Malformed as exc:
            raise TenbinError(f"array {index}: header: {exc}", url=url, offset=base + at) from None
        if after >= total:
            raise TenbinError(f"array {index}: the header chunk is not followed by a data chunk", url=url, offset=base + after)
        at = after
        start, nbytes, after = _chunk(buf, total, at, index, "data", url, base)
        if nbytes != count * dtype.itemsize:
            raise TenbinError(f"array {index}: data chunk holds {nbytes} bytes, its header says {count * dtype.itemsize} "
                              f"({dtype}, shape {shape})", url=url, offset=base + at)
        arrays.append(np.frombuffer(buf, dtype, count, start).reshape(shape))
        names.append(info)
        at = after
    return _infos_result(arrays, names, infos, url)


def decode_buffer(buf, infos=False):
    """Decode a buffer in the chunked form (a single-part message, a ``.ten`` file's bytes).

    :param buf: bytes, bytearray, memoryview, mmap, numpy array: anything with the buffer
        protocol over contiguous memory.
    :param infos: as for :func:`decode_list`.
    :returns: numpy arrays that are views of ``buf`` (no copy), writeable where ``buf`` is.
    :raises TenbinError: for malformed data; ``offset`` is the byte offset of the bad chunk.
    """
    return _decode_chunks(buf, infos)


def aligned_empty(nbytes: int) -> np.ndarray:
    """``nbytes`` of new, uninitialised, writeable memory starting on a 64-byte boundary (what
    XLA:CPU uses in place)."""
    raw = np.empty(nbytes + 64, np.uint8)
    skip = -raw.ctypes.data % 64
    return raw[skip : skip + nbytes]


def _fill(stream, target) -> int:
    """Read into ``target`` (a byte memoryview) until it is full or the stream ends; bytes read."""
    done = 0
    size = target.nbytes
    readinto = getattr(stream, "readinto", None)
    while done < size:
        if readinto is not None:
            got = readinto(target[done:])
            if got is None:
                raise TenbinError("the stream has no data ready (non-blocking)")
        else:
            piece = stream.read(size - done)
            got = len(piece)
            target[done : done + got] = piece
        if not got:
            break
        done += got
    return done


def _read_bytes(stream, n: int) -> bytes:
    """Up to ``n`` bytes: fewer only at the end of the stream (pipes and sockets return short reads)."""
    data = stream.read(n)
    while data and len(data) < n:
        more = stream.read(n - len(data))
        if not more:
            break
        data += more
    return data or b""


def _remaining(stream):
    """Bytes left in a stream over a regular file, or None when that cannot be told."""
    try:
        st = os.fstat(stream.fileno())
        if not stat.S_ISREG(st.st_mode):
            return None
        return st.st_size - stream.tell()
    except (AttributeError, OSError, ValueError):
        return None


def _read_payload(stream, nbytes: int, url, at: int, what: str):
    """The ``nbytes`` payload that follows in ``stream``, in 64-byte aligned memory."""
    left = _remaining(stream)
    if left is not None and left < nbytes:
        raise TenbinError(f"{what} chunk claims {nbytes} bytes of payload, {left} follow", url=url, offset=at)
    if nbytes <= _READ_STEP or left is not None:
        out = aligned_empty(nbytes)
        got = _fill(stream, memoryview(out))
    else:
        pieces = []
        got = 0
        while got < nbytes:
            piece = np.empty(min(_READ_STEP, nbytes - got), np.uint8)
            step = _fill(stream, memoryview(piece))
            pieces.append(piece[:step])
            got += step
            if step < piece.size:
                break
        if got == nbytes:
            out = aligned_empty(nbytes)
            np.concatenate(pieces, out=out)
    if got < nbytes:
        raise TenbinError(f"{what} chunk cut short: {got} of its {nbytes} payload bytes", url=url, offset=at)
    return out


def _read_chunk(stream, at: int, index: int, what: str, url, limit=None):
    """The payload of the chunk at ``at`` in ``stream``, and the offset after it; None at EOF."""
    lead = _read_bytes(stream, 16)
    if not lead and what == "header":
        return None
    if len(lead) < 16:
        raise TenbinError(f"array {index}: {what} chunk cut short: {len(lead)} of its 16 lead bytes", url=url, offset=at)
    magic, nbytes = _LEAD.unpack(lead)
    if magic != MAGIC:
        raise TenbinError(f"array {index}: {what} chunk does not start with {MAGIC!r} but {magic!r}", url=url, offset=at)
    if nbytes < 0:
        raise TenbinError(f"array {index}: {what} chunk claims {nbytes} bytes of payload", url=url, offset=at)
    if limit is not None and nbytes != limit:
        raise TenbinError(f"array {index}: data chunk holds {nbytes} bytes, its header says {limit}", url=url, offset=at)
    if what == "header" and nbytes > _MAX_HEADER:
        raise TenbinError(f"array {index}: header chunk claims {nbytes} bytes, more than the {_MAX_HEADER} a header may have",
                          url=url, offset=at)
    payload = _read_payload(stream, nbytes, url, at, f"array {index}: {what}")
    pad = _roundup(nbytes) - nbytes
    if pad:
        got = len(_read_bytes(stream, pad))
        if got < pad:
            raise TenbinError(f"array {index}: {what} chunk cut short: {got} of its {pad} padding bytes", url=url, offset=at)
    return payload, at + 16 + _roundup(nbytes)


def read(stream, n=None, infos=False):
    """Read arrays from a binary stream in the chunked (``.ten`` file) form.

    :param stream: a binary file object, read from where it stands.
    :param n: the most arrays to read; None reads to the end of the stream.
    :param infos: as for :func:`decode_list`.
    :returns: the arrays, each in its own writeable, 64-byte aligned memory.
    :raises TenbinError: for malformed or cut-short data; ``offset`` is the bad chunk's position
        in the stream (for a stream that cannot tell its position, counted from where it stood).
    """
    name = getattr(stream, "name", None)
    url = name if isinstance(name, str) else None
    try:
        at = stream.tell()
    except (AttributeError, OSError, ValueError):
        at = 0
    arrays = []
    names = []
    while n is None or len(arrays) < n:
        index = len(arrays)
        found = _read_chunk(stream, at, index, "header", url)
        if found is None:
            break
        header, after = found
        try:
            dtype, shape, count, info = _parsed_header(header, header.size)
        except _Malformed as exc:
            raise TenbinError(f"array {index}: header: {exc}", url=url, offset=at) from None
        data, at = _read_chunk(stream, after, index, "data", url, limit=count * dtype.itemsize)
        arrays.append(np.frombuffer(data, dtype, count).reshape(shape))
        names.append(info)
    return _infos_result(arrays, names, infos, url)


def load(fname, infos=False, nocheck: bool = False, mmap: bool = False):
    """Load the arrays of a ``.ten`` file.

    :param fname: the file's path; it must end in ``.ten`` unless ``nocheck``.
    :param infos: as for :func:`decode_list`.
    :param mmap: map the file read-only and return arrays that are views of the mapping (no
        copy; pages are read when touched); otherwise read it into one 64-byte aligned buffer
        that the (writeable) arrays are views of.
    :returns: the arrays (and infos, as asked), each at least 32-byte aligned in memory.
    :raises ValueError: for a name that does not end in ``.ten``.
    :raises TenbinError: for a malformed file; ``url`` is ``fname``, ``offset`` the bad chunk's.
    """
    fname = os.fspath(fname)
    _check_name(fname, nocheck)
    with open(fname, "rb") as stream:
        size = os.fstat(stream.fileno()).st_size
        if not size:
            buf = b""
        elif mmap:
            buf = _mmap.mmap(stream.fileno(), 0, access=_mmap.ACCESS_READ)
        else:
            buf = aligned_empty(size)
            got = _fill(stream, memoryview(buf))
            if got < size:
                raise TenbinError(f"the file shrank while it was read ({got} of {size} bytes)", url=fname, offset=got)
    return _decode_chunks(buf, infos, url=fname)
