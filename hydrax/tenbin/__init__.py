"""The tenbin tensor format of NVlabs tensorcom, read and written by hydrax's own code.

tenbin carries a list of numpy arrays as a ``.ten`` file, as one byte buffer (a single-part
ZeroMQ message), or as the frames of one multipart ZeroMQ message. For every array tensorcom
0.1.0 handles correctly, hydrax writes the same bytes and reads what tensorcom writes; where
tensorcom is wrong or refuses, hydrax does the right thing (see *Differences from tensorcom*).

The code is split by concern: :mod:`.layout` (dtype codes and the words of the format),
:mod:`.encode` (writing arrays in every form), :mod:`.header` (parsing a header, which may come
from anyone), :mod:`.decode` (frames and buffers) and :mod:`.streams` (streams and files). This
package holds only the format's description and the public names.

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

from ..errors import TenbinError
from . import layout
from .decode import data_nbytes, decode_buffer, decode_list
from .encode import encode_buffer, encode_list, save, write
from .streams import aligned_empty, load, read

__all__ = [
    "CODE_DTYPES", "DTYPE_CODES", "MAGIC", "MAX_NDIM", "TenbinError", "aligned_empty", "data_nbytes", "decode_buffer", "decode_list", "encode_buffer",
    "encode_list",
    "load", "read", "save", "write",
]

# The format's public constants, named here with their documentation (autodoc reads the comments
# of the module it documents, and this is the public one); :mod:`.layout` defines them.
#: The numpy dtypes tenbin's dtype codes stand for, and their codes.
DTYPE_CODES = layout.DTYPE_CODES
#: The reverse of :data:`DTYPE_CODES`: code to numpy dtype.
CODE_DTYPES = layout.CODE_DTYPES
#: The most dims an array may have (numpy 1's limit, so that every reader can build it).
MAX_NDIM = layout.MAX_NDIM
#: The 8 bytes every chunk of the buffer and file form starts with.
MAGIC = layout.MAGIC
