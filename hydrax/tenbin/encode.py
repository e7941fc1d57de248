"""Writing arrays in tenbin: the frames of a message, one buffer, a stream or a ``.ten`` file.

Every form starts from the same preparation of each array: its header (dtype code, info word,
dims, and the extension records for what the words cannot say) and its data payload (the array's
own memory when it is C-contiguous and native, else a C-order native copy). Arrays are all
checked before anything is written, so a refused one leaves a stream or file untouched.
"""

from __future__ import annotations

import os

import numpy as np

from ..errors import TenbinError
from .layout import DTYPE_CODES, HEADS, LEAD, MAGIC, MAX_NDIM, check_name, roundup

_ZEROS = bytes(64)
_STORAGE_BY_KIND = {(dtype.kind, dtype.itemsize): dtype for dtype in DTYPE_CODES}
_encode_cache: dict = {}


def _str64(text: str) -> bytes:
    return text.encode("ascii").ljust(8, b"\0")


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
    return LEAD.pack(_str64(tag), len(payload)) + payload.ljust(roundup(len(payload), 8), b"\0")


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
    header = HEADS[array.ndim].pack(code, word, array.ndim, *array.shape) + records
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
    total = sum(32 + roundup(len(header)) + roundup(source.size * storage.itemsize)
                for header, source, storage, _ in prepared)
    out = bytearray(total)
    at = 0
    for header, source, storage, _ in prepared:
        LEAD.pack_into(out, at, MAGIC, len(header))
        out[at + 16 : at + 16 + len(header)] = header
        at += 16 + roundup(len(header))
        nbytes = source.size * storage.itemsize
        LEAD.pack_into(out, at, MAGIC, nbytes)
        if nbytes:
            # straight into the buffer: one pass, which also does the C ordering and byte swap
            target = np.frombuffer(out, storage, source.size, at + 16).reshape(source.shape)
            np.copyto(target, source)
            del target  # a bytearray with a live export cannot be resized by the caller
        at += 16 + roundup(nbytes)
    return out


def _write_chunk(stream, payload) -> None:
    nbytes = payload.nbytes if isinstance(payload, memoryview) else len(payload)
    stream.write(LEAD.pack(MAGIC, nbytes))
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
    check_name(fname, nocheck)
    prepared = _prepare_all(arrays, infos)
    with open(fname, "wb") as stream:
        _write_prepared(stream, prepared)
