"""Decoding tenbin in memory: the frames of a multipart message, or one buffer in the chunked form.

The arrays decoded are views of the memory given (no copy). Frames and buffers may come from a
peer, so every length is checked against what is there before an array is made, and each error
names the frame or array and, in a buffer, the byte offset of the bad chunk.
"""

from __future__ import annotations

import mmap as _mmap

import numpy as np

from ..errors import TenbinError
from .header import Malformed, parsed_header
from .layout import LEAD, MAGIC, roundup


def infos_result(arrays: list, names: list, infos, url=None):
    """What a decoder returns for its ``infos`` argument: the arrays, ``(arrays, names)``, or the
    arrays once ``names`` are checked against the infos expected."""
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


def as_bytes(obj):
    """``obj`` as something that struct and numpy read as its bytes, and its length in bytes.

    Raises ``Malformed`` for what is not contiguous memory.
    """
    kind = type(obj)
    if kind is bytes or kind is bytearray or kind is _mmap.mmap:
        return obj, len(obj)
    if kind is not memoryview:
        if isinstance(obj, np.ndarray):
            if not obj.flags.c_contiguous:
                raise Malformed("is a numpy array that is not C-contiguous")
            obj = obj.reshape(-1).view(np.uint8)
            return obj, obj.size
        try:
            obj = memoryview(obj)  # a zmq.Frame exports its memory too, and faster than through .buffer
        except TypeError:
            try:
                obj = memoryview(obj.buffer)
            except (AttributeError, TypeError):
                raise Malformed(f"is a {type(obj).__name__}, not bytes or a buffer") from None
    if not obj.c_contiguous:
        raise Malformed("is not contiguous memory")
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
            header, nbytes = as_bytes(frames[k])
        except Malformed as exc:
            raise TenbinError(f"frame {k} {exc}") from None
        try:
            dtype, shape, count, info = parsed_header(header, nbytes)
        except Malformed as exc:
            raise TenbinError(f"frame {k} (header of array {k // 2}): {exc}") from None
        try:
            data, nbytes = as_bytes(frames[k + 1])
        except Malformed as exc:
            raise TenbinError(f"frame {k + 1} {exc}") from None
        if nbytes != count * dtype.itemsize:
            raise TenbinError(f"frame {k + 1} (data of array {k // 2}) holds {nbytes} bytes, "
                              f"its header says {count * dtype.itemsize} ({dtype}, shape {shape})")
        arrays.append(np.frombuffer(data, dtype, count).reshape(shape))
        names.append(info)
    return infos_result(arrays, names, infos)


def data_nbytes(header) -> int:
    """The byte count of the data frame that a multipart message's header frame announces.

    Lets a receiver size (and align) the memory for the data frame before receiving it.

    :param header: a header frame (bytes, memoryview, ``zmq.Frame``, ...), as :func:`decode_list` takes.
    :raises TenbinError: for a malformed header.
    """
    try:
        header, nbytes = as_bytes(header)
        dtype, _, count, _ = parsed_header(header, nbytes)
    except Malformed as exc:
        raise TenbinError(f"header frame: {exc}") from None
    return count * dtype.itemsize


def _chunk(buf, total: int, at: int, index: int, what: str, url, base: int):
    """``(payload start, payload length, next chunk)`` of the chunk at ``at``."""
    if total - at < 16:
        raise TenbinError(f"array {index}: {what} chunk cut short: {total - at} of its 16 lead bytes", url=url, offset=base + at)
    magic, nbytes = LEAD.unpack_from(buf, at)
    if magic != MAGIC:
        raise TenbinError(f"array {index}: {what} chunk does not start with {MAGIC!r} but {magic!r}", url=url, offset=base + at)
    room = total - at - 16
    if nbytes < 0 or roundup(nbytes) > room:
        raise TenbinError(f"array {index}: {what} chunk claims {nbytes} bytes of payload (padded to a multiple of 64), "
                          f"{room} follow", url=url, offset=base + at)
    return at + 16, nbytes, at + 16 + roundup(nbytes)


def decode_chunks(buf, infos, url=None, base: int = 0):
    """:func:`decode_buffer`, naming ``url`` in errors and counting offsets from ``base``."""
    try:
        buf, total = as_bytes(buf)
    except Malformed as exc:
        raise TenbinError(f"the buffer {exc}", url=url) from None
    arrays = []
    names = []
    at = 0
    while at < total:
        index = len(arrays)
        start, nbytes, after = _chunk(buf, total, at, index, "header", url, base)
        try:
            dtype, shape, count, info = parsed_header(buf[start : start + nbytes], nbytes)
        except Malformed as exc:
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
    return infos_result(arrays, names, infos, url)


def decode_buffer(buf, infos=False):
    """Decode a buffer in the chunked form (a single-part message, a ``.ten`` file's bytes).

    :param buf: bytes, bytearray, memoryview, mmap, numpy array: anything with the buffer
        protocol over contiguous memory.
    :param infos: as for :func:`decode_list`.
    :returns: numpy arrays that are views of ``buf`` (no copy), writeable where ``buf`` is.
    :raises TenbinError: for malformed data; ``offset`` is the byte offset of the bad chunk.
    """
    return decode_chunks(buf, infos)
