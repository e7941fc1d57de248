"""The words of the tenbin format that writers and readers share: dtype codes and struct layouts.

What a ``.ten`` file, a buffer or a message's frames are made of (the package's docstring
describes it), as constants both sides use, so that the encoder and the decoder cannot disagree
on a code, a word's layout or a limit.
"""

from __future__ import annotations

import struct
from types import MappingProxyType

import numpy as np

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

#: dtypes carried by a "dtype" extension record, and the code of their storage type
EXTENSION_STORAGE = MappingProxyType({"bool": "u1", "bfloat16": "u2"})

#: The 8 bytes every chunk of the buffer and file form starts with.
MAGIC = b"~TenBin~"
LEAD = struct.Struct("=8sq")  # a chunk's magic and length; also a record's tag and length
HEAD = struct.Struct("=8s8sq")  # a header's code, info and ndim words
DIMS = tuple(struct.Struct(f"={n}q") for n in range(MAX_NDIM + 1))
HEADS = tuple(struct.Struct(f"=8s8sq{n}q") for n in range(MAX_NDIM + 1))
#: A header is a few dozen bytes; the cap stops a damaged length word from making a stream reader
#: allocate, or the record parser loop, without bound.
MAX_HEADER = 1 << 20


def roundup(n: int, k: int = 64) -> int:
    """``n`` rounded up to a multiple of ``k`` (chunks pad to 64 bytes, record payloads to 8)."""
    return -(-n // k) * k


def check_name(fname, nocheck: bool) -> None:
    """Refuse a file name that does not end in ``.ten`` (unless ``nocheck``), as tensorcom does."""
    if not nocheck and not str(fname).endswith(".ten"):
        raise ValueError(f"{fname!r} does not end in '.ten' (pass nocheck=True to use another name)")
