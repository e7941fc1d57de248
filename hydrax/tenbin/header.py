"""Parsing a tenbin header, which may come from anyone: its words, dims and extension records.

A header arrives from a file or a peer that may be damaged or hostile, so every word is checked
before it is used: the code must be known, ndim in range, dims not negative and their product
within what numpy can build, each extension record's length within the header, and text UTF-8.
What is wrong raises :class:`Malformed` in words; the decoders add which array and where. Short
headers are remembered, since the messages of one stream repeat a few of them.
"""

from __future__ import annotations

import math

import numpy as np

from .layout import CODE_DTYPES, DIMS, DTYPE_CODES, EXTENSION_STORAGE, HEAD, LEAD, MAX_HEADER, MAX_NDIM, roundup

_INT64_MAX = 2**63 - 1
_CODE_WORDS = {code.encode("ascii").ljust(8, b"\0"): dtype for code, dtype in CODE_DTYPES.items()}
_parsed: dict = {}  # header bytes -> what _parse_header makes of them
_REMEMBERED = 512
_REMEMBERED_HEADER = 512
_extension_dtypes: dict = {}


class Malformed(Exception):
    """A problem with a header, in words; the caller adds which array and where."""


def _extension_dtype(name: str) -> np.dtype:
    dtype = _extension_dtypes.get(name)
    if dtype is None:
        if name == "bool":
            dtype = np.dtype(bool)
        else:  # imported on first use: hydrax.tenbin should not cost ml_dtypes' import otherwise
            try:
                import ml_dtypes
            except ImportError as exc:
                raise Malformed(f"dtype {name!r} needs the ml_dtypes package, which is not installed") from exc
            dtype = np.dtype(getattr(ml_dtypes, name))
        _extension_dtypes[name] = dtype
    return dtype


def parsed_header(header, nbytes: int):
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
    if nbytes < 24 or nbytes % 8 or nbytes > MAX_HEADER:
        raise Malformed(f"its {nbytes} bytes are not 3 or more 8-byte words, up to {MAX_HEADER} bytes")
    code, word, ndim = HEAD.unpack_from(buf, start)
    dtype = _CODE_WORDS.get(code)
    if dtype is None:
        dtype = _CODE_WORDS.get(code.strip(b"\0").ljust(8, b"\0"))
        if dtype is None:
            raise Malformed(f"unknown dtype code {_shown(code)}")
    if not 0 <= ndim <= MAX_NDIM:
        raise Malformed(f"ndim {ndim} is not between 0 and {MAX_NDIM}")
    end = 24 + 8 * ndim
    if nbytes < end:
        raise Malformed(f"ndim {ndim} needs {end} bytes, the header has {nbytes}")
    shape = DIMS[ndim].unpack_from(buf, start + 24)
    if ndim and min(shape) < 0:
        raise Malformed(f"negative dimension in shape {shape}")
    count = math.prod(shape)
    if not count:
        count = math.prod(d for d in shape if d)  # numpy refuses a zero-size array whose other dims overflow
        if count * dtype.itemsize > _INT64_MAX:
            raise Malformed(f"shape {shape} is too large for numpy")
        count = 0
    elif count * dtype.itemsize > _INT64_MAX:
        raise Malformed(f"shape {shape} is too large for numpy")
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
                raise Malformed(f"info word {word!r} is not ASCII") from None
    return dtype, shape, count, info


def _parse_records(buf, at: int, left: int, dtype: np.dtype):
    """The dtype and info that the extension records at ``at`` say (info None when none does)."""
    extension = info = None
    while left:
        if left < 16:
            raise Malformed(f"{left} bytes after the dims and records, too few for an extension record")
        tag, length = LEAD.unpack_from(buf, at)
        if not 0 <= length <= left - 16:
            raise Malformed(f"extension record {_shown(tag)} claims {length} bytes, {left - 16} follow")
        step = 16 + roundup(length, 8)
        if step > left:
            raise Malformed(f"extension record {_shown(tag)} needs {step} bytes, {left} follow")
        tag = tag.strip(b"\0")
        if tag in (b"dtype", b"info"):
            try:
                text = bytes(buf[at + 16 : at + 16 + length]).decode("utf-8")
            except UnicodeDecodeError:
                raise Malformed(f"extension record {tag!r} is not UTF-8") from None
            if tag == b"dtype":
                if extension is not None:
                    raise Malformed("two dtype extension records")
                storage = EXTENSION_STORAGE.get(text)
                if storage is None:
                    raise Malformed(f"unknown dtype {text!r} in its dtype extension record")
                if CODE_DTYPES[storage] != dtype:
                    raise Malformed(f"dtype {text!r} is stored as code {storage!r}, the header has {DTYPE_CODES[dtype]!r}")
                extension = _extension_dtype(text)
            else:
                if info is not None:
                    raise Malformed("two info extension records")
                info = text
        at += step
        left -= step
    return (dtype if extension is None else extension), info
