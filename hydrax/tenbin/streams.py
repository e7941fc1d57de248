"""Reading tenbin from a stream or a ``.ten`` file, into aligned memory or a mapping.

A stream is read chunk by chunk, each payload into its own 64-byte aligned memory; a length word
that lies costs no more memory than the bytes really there (a regular file's size is checked
first, and other streams are read in pieces). :func:`load` reads a whole file into one aligned
buffer, or maps it, and decodes it as a buffer.
"""

from __future__ import annotations

import mmap as _mmap
import os
import stat

import numpy as np

from ..errors import TenbinError
from .decode import decode_chunks, infos_result
from .header import Malformed, parsed_header
from .layout import LEAD, MAGIC, MAX_HEADER, check_name, roundup

# Stream reads of payloads bigger than this go in pieces, so that a length word that lies costs
# no more memory than the bytes that are really there.
_READ_STEP = 1 << 26


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
    magic, nbytes = LEAD.unpack(lead)
    if magic != MAGIC:
        raise TenbinError(f"array {index}: {what} chunk does not start with {MAGIC!r} but {magic!r}", url=url, offset=at)
    if nbytes < 0:
        raise TenbinError(f"array {index}: {what} chunk claims {nbytes} bytes of payload", url=url, offset=at)
    if limit is not None and nbytes != limit:
        raise TenbinError(f"array {index}: data chunk holds {nbytes} bytes, its header says {limit}", url=url, offset=at)
    if what == "header" and nbytes > MAX_HEADER:
        raise TenbinError(f"array {index}: header chunk claims {nbytes} bytes, more than the {MAX_HEADER} a header may have",
                          url=url, offset=at)
    payload = _read_payload(stream, nbytes, url, at, f"array {index}: {what}")
    pad = roundup(nbytes) - nbytes
    if pad:
        got = len(_read_bytes(stream, pad))
        if got < pad:
            raise TenbinError(f"array {index}: {what} chunk cut short: {got} of its {pad} padding bytes", url=url, offset=at)
    return payload, at + 16 + roundup(nbytes)


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
            dtype, shape, count, info = parsed_header(header, header.size)
        except Malformed as exc:
            raise TenbinError(f"array {index}: header: {exc}", url=url, offset=at) from None
        data, at = _read_chunk(stream, after, index, "data", url, limit=count * dtype.itemsize)
        arrays.append(np.frombuffer(data, dtype, count).reshape(shape))
        names.append(info)
    return infos_result(arrays, names, infos, url)


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
    check_name(fname, nocheck)
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
    return decode_chunks(buf, infos, url=fname)
