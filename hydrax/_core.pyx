# cython: language_level=3
"""Compiled kernels of hydrax.

Kept narrow on purpose: the Python layer decides, these functions compute. One module, so one
extension to build and ship, with each family of kernels in an include file of its own:

``_arena.pxi``: the shared memory that batches are built in.

- :class:`ArenaMap` maps a shared-memory file descriptor (a memfd), or read-only a batch file of
  the on-disk cache, and exports it as a buffer.
- :class:`SlotLease` exports one batch slot of an arena and counts the buffer exports that are
  alive, so the slot is recycled exactly when the last numpy view or ``jax.Array`` made from it
  is gone (the job hydrax 0.2.2's ``TrackedBuffer`` did in C).
- :func:`heartbeat` runs without the GIL in a worker thread, so a worker whose Python code is
  busy (or holds the GIL in C) still proves it is alive; only a frozen or dead process stops it.
- :func:`mark_item` records which item a worker is loading, in shared memory, at the cost of a
  couple of stores, so the parent can name the item when the worker dies or stalls;
  :func:`monotonic_ns` is the clock both use.

``_tar.pxi``: the structure of a tar shard, from its headers alone.

- :func:`scan_tar` lists the regular members of an archive (ustar prefixes, GNU long names, pax
  records), verifying every header checksum and never reading a payload.
- :func:`index_tar` also groups the members into WebDataset samples, in the same pass: the
  arrays of a shard index, without a Python object per member.
- :func:`check_index` tells, in one pass, whether the arrays of a loaded index hang together.

``_imagesize.pxi``: an encoded image's size, from its header alone.

- :func:`read_image_header` reads a JPEG's, PNG's, WebP's or GIF's width and height (and a
  JPEG's EXIF orientation) without decoding it; :func:`read_image_headers` does so for many
  images in one buffer (a shard's members) without the GIL. Damaged bytes give a status code.

- :func:`scan_jpeg_markers` walks a JPEG's markers to its scan for the decoder's header
  (``hydrax.image.jpeg.read_header``): the frame, where the EXIF block and ICC chunks lie, and
  whether anything there sends the file to Pillow.

``_boxes.pxi``: crop boxes from item seeds.

- :func:`random_resized_draws` draws a random resized crop's boxes (area, aspect, position) from
  a counter-based stream of the item seed, as ``hydrax.image.random_resized_box`` documents.

``_pixels.pxi``: decoded images to batch values.

- :func:`convert_pixels` takes decoded 8-bit pixels through the source profile's curves, a colour
  matrix, the output encoding (sRGB, linear or Oklab) and a per-channel affine map, into a batch
  slot in one pass, uint8 or float32, HWC or CHW.

``_resample.pxi``: decoded images resized into batch slots.

- :class:`Taps` holds one axis's filter weights in fixed point, computed as Pillow computes them.
- :func:`resample_into` resizes, crops and mirrors decoded 8-bit pixels (read through any strides,
  so a rotated view costs nothing) and hands each finished row to the conversion above, so the
  slot is written in one call with the same values Pillow's ``resize`` gives.

``_planes.pxi``: a JPEG's own planes into batch slots.

- :class:`JpegLibrary` opens libjpeg-turbo at run time (the copy Pillow's wheels carry) and
  decodes a JPEG's Y, Cb and Cr planes as stored, laid out as :func:`jpeg_plane_layout` says;
  a damaged file is reported, never half decoded.
- :func:`resample_planes_into` resizes each plane on its own grid and converts YCbCr to RGB for
  the output's pixels only, then hands each row to the conversion above.

``_permute.pxi``: orders computed, not stored.

- :func:`feistel_permute` maps positions to items through a keyed bijection of ``[0, n)`` (a
  Feistel network with cycle walking), so an epoch's order of a billion items costs nothing to
  hold and a few nanoseconds per item to compute (see :mod:`hydrax.order.permute`).
- :func:`feistel_windows` does the same for a stream of shards whose items are permuted within
  runs of a few shards: a batch of a lazy ``shardwise`` order in one call.

``_shuffle.pxi``: numpy's seeded shuffles without numpy's objects.

- :func:`shuffle_runs` shuffles many runs of an array, each exactly as
  ``Generator(PCG64([*key, run])).shuffle`` would, so a ``"numpy"`` shardwise order of 100,000
  shards costs what one of 1,000 shards costs.

``_mixture.pxi``: mixtures of sources.

- :func:`mixture_slots` reads a mixture's stratified layout: the source, and the position in
  that source's stream, of each shuffled slot of a block of batches (see :mod:`hydrax.order.mixing`).
- :func:`mixture_locate` splits a mixture's items into (source, index within it): what a
  worker does to each item of its task.
- :func:`mixture_items` takes those stream positions to items through each source's permuted
  passes: a batch's items of every source and pass in one call.
- :class:`MixtureBlock` holds a block's tables and does the shuffle, the slots and the items of
  a range of positions in one call (:meth:`MixtureBlock.fill`): a worker's share of a batch.

``hydrax/_fallback.py`` has pure-Python twins of the tar, image header, crop box, permutation, shuffle and mixture kernels; the
tests use them as the oracle (and numpy itself for the shuffles).
"""

# The include files share this module's namespace: a name more than one family uses is cimported
# here, any other in the file that uses it.
from libc.stdint cimport int64_t
from libc.stdlib cimport calloc, free, malloc
from libc.string cimport memcpy

include "_arena.pxi"
include "_tar.pxi"
include "_imagesize.pxi"
include "_boxes.pxi"
include "_pixels.pxi"
include "_resample.pxi"
include "_planes.pxi"
include "_permute.pxi"
include "_shuffle.pxi"
include "_mixture.pxi"
