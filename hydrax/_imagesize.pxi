# Image header kernels, included by _core.pyx: an encoded image's size without decoding it.
#
# read_image_header reads one image's width and height (and, for a JPEG, its EXIF orientation)
# from the first structures of the file: JPEG frame headers, the PNG IHDR chunk, a WebP file's
# first chunk (VP8, VP8L or VP8X), a GIF's logical screen. read_image_headers does the same for
# many images lying in one buffer (the members of a shard), without the GIL. They are kernels
# because indexing a shard asks this of every sample; ``hydrax.image.sizes`` decides what the
# results mean, and ``hydrax/_fallback.py`` keeps the readable twin.
#
# Every read is checked against the data's length first; a JPEG walk advances by at least one
# byte per step, so any input ends in a status, never a crash or a hang.

from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t

cdef enum:
    IMG_OK = 0
    IMG_UNKNOWN_FORMAT = 1   # no signature this reader knows
    IMG_TRUNCATED = 2        # the data ends before the size
    IMG_BAD_MARKER = 3       # JPEG: no marker where one must be, or one that cannot be there
    IMG_BAD_LENGTH = 4       # a segment or chunk length that cannot be right
    IMG_NO_SIZE = 5          # JPEG: scan or end of image before a frame header; PNG/WebP: another first chunk
    IMG_BAD_SIGNATURE = 6    # WebP: the VP8 start code or VP8L signature/version is wrong
    IMG_BAD_SIZE = 7         # a width or height of 0, or (PNG) over 2**31 - 1
    IMG_OUTSIDE_DATA = 8     # read_image_headers: the span is not inside the buffer

    IMG_FORMAT_NONE = 0
    IMG_JPEG = 1
    IMG_PNG = 2
    IMG_WEBP = 3
    IMG_GIF = 4


cdef struct ImageHead:
    int status
    int format
    int64_t width
    int64_t height
    int orientation          # EXIF orientation 1-8 (1 where there is none); 0 unless status is IMG_OK
    Py_ssize_t where         # the byte offset the status is about (on success: the structure with the size)


cdef inline int _img_fail(ImageHead* h, int status, Py_ssize_t where) noexcept nogil:
    h.status = status
    h.where = where
    h.width = 0
    h.height = 0
    h.orientation = 0
    return status


cdef inline int _img_done(ImageHead* h, int64_t width, int64_t height, int orientation, Py_ssize_t where) noexcept nogil:
    if width <= 0 or height <= 0:
        return _img_fail(h, IMG_BAD_SIZE, where)
    h.status = IMG_OK
    h.width = width
    h.height = height
    h.orientation = orientation
    h.where = where
    return IMG_OK


cdef inline uint32_t _img_u16(const unsigned char* p, bint little) noexcept nogil:
    if little:
        return p[0] | (<uint32_t>p[1] << 8)
    return (<uint32_t>p[0] << 8) | p[1]


cdef inline uint32_t _img_u32(const unsigned char* p, bint little) noexcept nogil:
    if little:
        return p[0] | (<uint32_t>p[1] << 8) | (<uint32_t>p[2] << 16) | (<uint32_t>p[3] << 24)
    return (<uint32_t>p[0] << 24) | (<uint32_t>p[1] << 16) | (<uint32_t>p[2] << 8) | p[3]


cdef inline bint _img_is_frame(unsigned char marker) noexcept nogil:
    # SOF0-3, 5-7, 9-11, 13-15: 0xC4 is DHT, 0xC8 reserved (JPG), 0xCC DAC
    return 0xC0 <= marker <= 0xCF and marker != 0xC4 and marker != 0xC8 and marker != 0xCC


cdef int _img_exif_orientation(const unsigned char* p, Py_ssize_t n) noexcept nogil:
    """The orientation (1-8) in IFD0 of the TIFF block ``p[:n]`` (an APP1 segment after its
    ``Exif\\0\\0``); 1 where the block does not parse, has no such tag, or holds another value."""
    cdef bint little
    cdef int64_t ifd, entry, end
    cdef uint32_t count, kind, number, value
    if n < 8 or not ((p[0] == 0x49 and p[1] == 0x49) or (p[0] == 0x4D and p[1] == 0x4D)):
        return 1
    little = p[0] == 0x49
    if _img_u16(p + 2, little) != 42:
        return 1
    ifd = _img_u32(p + 4, little)
    if ifd < 8 or ifd + 2 > n:
        return 1
    count = _img_u16(p + ifd, little)
    end = ifd + 2 + 12 * <int64_t>count
    if end > n:
        return 1
    entry = ifd + 2
    while entry < end:
        if _img_u16(p + entry, little) == 0x0112:
            kind = _img_u16(p + entry + 2, little)
            number = _img_u32(p + entry + 4, little)
            if number != 1 or (kind != 3 and kind != 4):  # one SHORT or one LONG
                return 1
            value = _img_u16(p + entry + 8, little) if kind == 3 else _img_u32(p + entry + 8, little)
            return <int>value if 1 <= value <= 8 else 1
        entry += 12
    return 1


cdef int _img_jpeg(const unsigned char* p, Py_ssize_t n, ImageHead* h) noexcept nogil:
    """Walk the markers from SOI to the first frame header; the first EXIF APP1 gives the orientation."""
    cdef Py_ssize_t at = 2, mark
    cdef Py_ssize_t length
    cdef unsigned char marker
    cdef int orientation = 1
    cdef bint exif_seen = False
    while True:
        if at >= n:
            return _img_fail(h, IMG_TRUNCATED, at)
        if p[at] != 0xFF:
            return _img_fail(h, IMG_BAD_MARKER, at)
        mark = at
        while at < n and p[at] == 0xFF:  # fill bytes may precede a marker
            at += 1
        if at >= n:
            return _img_fail(h, IMG_TRUNCATED, mark)
        marker = p[at]
        at += 1
        if marker == 0x01 or 0xD0 <= marker <= 0xD7:  # TEM, RSTn: no length follows
            continue
        if marker == 0xD8 or marker == 0xD9 or marker == 0xDA:  # SOI, EOI, SOS before any frame
            return _img_fail(h, IMG_NO_SIZE, mark)
        if marker < 0xC0:  # a stuffed zero or a reserved marker
            return _img_fail(h, IMG_BAD_MARKER, mark)
        if at + 2 > n:
            return _img_fail(h, IMG_TRUNCATED, mark)
        length = _img_u16(p + at, False)
        if length < 2 or (_img_is_frame(marker) and length < 8):
            return _img_fail(h, IMG_BAD_LENGTH, mark)
        if length > n - at:
            return _img_fail(h, IMG_TRUNCATED, mark)
        if _img_is_frame(marker):  # precision, height, width, components
            return _img_done(h, _img_u16(p + at + 5, False), _img_u16(p + at + 3, False), orientation, mark)
        if marker == 0xE1 and not exif_seen and length >= 8 and p[at + 2] == 0x45 and p[at + 3] == 0x78 \
                and p[at + 4] == 0x69 and p[at + 5] == 0x66 and p[at + 6] == 0 and p[at + 7] == 0:  # "Exif\0\0"
            exif_seen = True
            orientation = _img_exif_orientation(p + at + 8, length - 8)
        at += length


cdef int _img_png(const unsigned char* p, Py_ssize_t n, ImageHead* h) noexcept nogil:
    """The IHDR chunk, which must come first: length 13, then width and height, big-endian."""
    cdef uint32_t width, height
    if n < 24:
        return _img_fail(h, IMG_TRUNCATED, 8)
    if not (p[12] == 0x49 and p[13] == 0x48 and p[14] == 0x44 and p[15] == 0x52):  # IHDR
        return _img_fail(h, IMG_NO_SIZE, 8)
    if _img_u32(p + 8, False) != 13:
        return _img_fail(h, IMG_BAD_LENGTH, 8)
    width = _img_u32(p + 16, False)
    height = _img_u32(p + 20, False)
    if width > 0x7FFFFFFF or height > 0x7FFFFFFF:
        return _img_fail(h, IMG_BAD_SIZE, 8)
    return _img_done(h, width, height, 1, 8)


cdef int _img_webp(const unsigned char* p, Py_ssize_t n, ImageHead* h) noexcept nogil:
    """The first chunk after ``RIFF....WEBP``: VP8 (a lossy key frame), VP8L (lossless) or VP8X
    (extended: the canvas size)."""
    cdef const unsigned char* c = p + 12
    cdef const unsigned char* d = p + 20
    cdef uint32_t size, bits
    if n < 20:
        return _img_fail(h, IMG_TRUNCATED, 12)
    size = _img_u32(c + 4, True)
    if c[0] == 0x56 and c[1] == 0x50 and c[2] == 0x38 and c[3] == 0x20:  # "VP8 "
        if size < 10:
            return _img_fail(h, IMG_BAD_LENGTH, 12)
        if n < 30:
            return _img_fail(h, IMG_TRUNCATED, 12)
        if d[3] != 0x9D or d[4] != 0x01 or d[5] != 0x2A:  # a key frame's start code
            return _img_fail(h, IMG_BAD_SIGNATURE, 23)
        return _img_done(h, _img_u16(d + 6, True) & 0x3FFF, _img_u16(d + 8, True) & 0x3FFF, 1, 12)
    if c[0] == 0x56 and c[1] == 0x50 and c[2] == 0x38 and c[3] == 0x4C:  # "VP8L"
        if size < 5:
            return _img_fail(h, IMG_BAD_LENGTH, 12)
        if n < 25:
            return _img_fail(h, IMG_TRUNCATED, 12)
        bits = _img_u32(d + 1, True)
        if d[0] != 0x2F or bits >> 29 != 0:  # the signature, then version 0
            return _img_fail(h, IMG_BAD_SIGNATURE, 20)
        return _img_done(h, (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1, 1, 12)
    if c[0] == 0x56 and c[1] == 0x50 and c[2] == 0x38 and c[3] == 0x58:  # "VP8X"
        if size < 10:
            return _img_fail(h, IMG_BAD_LENGTH, 12)
        if n < 30:
            return _img_fail(h, IMG_TRUNCATED, 12)
        return _img_done(h, (d[4] | (<int64_t>d[5] << 8) | (<int64_t>d[6] << 16)) + 1,
                         (d[7] | (<int64_t>d[8] << 8) | (<int64_t>d[9] << 16)) + 1, 1, 12)
    return _img_fail(h, IMG_NO_SIZE, 12)


cdef int _img_header(const unsigned char* p, Py_ssize_t n, ImageHead* h) noexcept nogil:
    """Tell the format by its signature, then read its size into ``h``; returns ``h.status``."""
    h.format = IMG_FORMAT_NONE
    if n >= 2 and p[0] == 0xFF and p[1] == 0xD8:
        h.format = IMG_JPEG
        return _img_jpeg(p, n, h)
    if n >= 8 and p[0] == 0x89 and p[1] == 0x50 and p[2] == 0x4E and p[3] == 0x47 and p[4] == 0x0D \
            and p[5] == 0x0A and p[6] == 0x1A and p[7] == 0x0A:
        h.format = IMG_PNG
        return _img_png(p, n, h)
    if n >= 12 and p[0] == 0x52 and p[1] == 0x49 and p[2] == 0x46 and p[3] == 0x46 \
            and p[8] == 0x57 and p[9] == 0x45 and p[10] == 0x42 and p[11] == 0x50:  # RIFF....WEBP
        h.format = IMG_WEBP
        return _img_webp(p, n, h)
    if n >= 6 and p[0] == 0x47 and p[1] == 0x49 and p[2] == 0x46 and p[3] == 0x38 \
            and (p[4] == 0x37 or p[4] == 0x39) and p[5] == 0x61:  # GIF87a, GIF89a
        h.format = IMG_GIF
        if n < 10:
            return _img_fail(h, IMG_TRUNCATED, 6)
        return _img_done(h, _img_u16(p + 6, True), _img_u16(p + 8, True), 1, 6)
    return _img_fail(h, IMG_UNKNOWN_FORMAT, 0)


def read_image_header(const unsigned char[::1] data):
    """Read the size of the encoded image in ``data`` (JPEG, PNG, WebP or GIF) from its header;
    never decode it.

    Returns ``(status, format, width, height, orientation, offset)``: status 0 and the size as
    stored with the EXIF orientation (1-8; 1 for a JPEG without one, and for other formats), or
    an error code with width, height and orientation 0: 1 no known signature, 2 the data ends
    before the size, 3 a JPEG marker missing or out of place, 4 a segment or chunk length that
    cannot be right, 5 no size where it must be (a JPEG's scan or end before any frame header, a
    PNG or WebP file whose first chunk is another), 6 a WebP VP8 start code or VP8L signature
    that is wrong, 7 a width or height of 0 (or a PNG's over 2**31 - 1). ``format`` is 0 (not
    known), 1 JPEG, 2 PNG, 3 WebP, 4 GIF; ``offset`` is the byte offset the status is about.
    """
    cdef ImageHead h
    cdef Py_ssize_t n = data.shape[0]
    with nogil:
        _img_header(&data[0] if n else NULL, n, &h)
    return h.status, h.format, h.width, h.height, h.orientation, h.where


def read_image_headers(const unsigned char[::1] data, const int64_t[::1] starts, const int64_t[::1] lengths,
                       uint8_t[::1] statuses, uint8_t[::1] formats, int32_t[::1] widths, int32_t[::1] heights,
                       uint8_t[::1] orientations, int64_t[::1] offsets):
    """:func:`read_image_header` of each image ``data[starts[i] : starts[i] + lengths[i]]``, into
    row ``i`` of the output arrays, without the GIL. A span that is not inside ``data`` gets status
    8; ``offsets`` are relative to the span's start. Returns the number of images of status 0."""
    cdef Py_ssize_t count = starts.shape[0], n = data.shape[0], i, good = 0
    cdef int64_t start, length
    cdef ImageHead h
    cdef const unsigned char* base = &data[0] if n else NULL
    if lengths.shape[0] != count or statuses.shape[0] < count or formats.shape[0] < count or widths.shape[0] < count \
            or heights.shape[0] < count or orientations.shape[0] < count or offsets.shape[0] < count:
        raise ValueError("starts and lengths must be as long as each other, and every output at least as long")
    with nogil:
        for i in range(count):
            start, length = starts[i], lengths[i]
            if start < 0 or length < 0 or start > n or length > n - start:
                h.format = IMG_FORMAT_NONE
                _img_fail(&h, IMG_OUTSIDE_DATA, 0)
            else:
                _img_header(base + start, length, &h)
            statuses[i] = h.status
            formats[i] = h.format
            widths[i] = <int32_t>h.width
            heights[i] = <int32_t>h.height
            orientations[i] = h.orientation
            offsets[i] = h.where
            good += h.status == IMG_OK
    return good


# The markers a fast JPEG decode needs (hydrax.image.jpeg.read_header): the frame's size and
# sampling, where the EXIF block and the ICC chunks lie, and whether anything in the markers
# sends the file to Pillow instead. A kernel because every decoded JPEG asks it: the Python walk
# cost about 7 us an image, this 3 (most of it building the header). Its readable twin is
# hydrax._fallback.scan_jpeg_markers; both must agree on every input (the image-size fuzzer checks).

cdef bint _starts_with(const unsigned char* p, Py_ssize_t n, const char* prefix, Py_ssize_t k) noexcept nogil:
    return n >= k and memcmp(p, prefix, k) == 0


cdef bint _holds(const unsigned char* p, Py_ssize_t n, const char* word, Py_ssize_t k) noexcept nogil:
    cdef Py_ssize_t i
    for i in range(n - k + 1):
        if memcmp(p + i, word, k) == 0:
            return True
    return False


def scan_jpeg_markers(const unsigned char[::1] data):
    """Walk a JPEG's markers from SOI to its scan: ``(width, height, sampling, exif, icc)``, or
    None where they send the file to Pillow's path (see ``hydrax.image.jpeg.read_header``).

    ``sampling`` is each component's (h, v) factor; ``exif`` the (start, end) of the first EXIF
    block's TIFF data or None; ``icc`` the (start, end) of each ICC_PROFILE APP2 segment's
    contents, in file order. None for: no SOI, a byte where a marker must be, a segment running
    past the data, no frame or two frames, a frame that is not 8-bit Huffman (baseline, extended
    or progressive) with 1 or 3 components sampled 1-4, a marker that has no segment before the
    scan, a second EXIF block, an XMP block naming an orientation, a multi-picture (MPF) block,
    an ICC chunk too short for its sequence numbers."""
    cdef const unsigned char* p = &data[0] if data.shape[0] else NULL
    cdef Py_ssize_t end = data.shape[0], at = 2, length, start, stop, c
    cdef unsigned char marker
    cdef Py_ssize_t width = -1, height = 0, components = 0, frame_at = 0
    cdef Py_ssize_t exif_start = -1, exif_stop = -1
    icc = []
    if end < 4 or p[0] != 0xFF or p[1] != 0xD8 or p[2] != 0xFF:
        return None
    while True:
        if at + 4 > end or p[at] != 0xFF:
            return None
        while at < end and p[at] == 0xFF:  # fill bytes may precede a marker
            at += 1
        if at + 3 > end:
            return None
        marker = p[at]
        length = _img_u16(p + at + 1, False)
        if length < 2 or at + 1 + length > end:
            return None
        start, stop = at + 3, at + 1 + length
        at = stop
        if marker == 0xC4 or marker == 0xDB or marker == 0xDD or marker == 0xE0 or marker == 0xFE:
            continue  # tables, restart interval, JFIF, comment: not read
        if marker == 0xDA:
            break
        if marker == 0xC0 or marker == 0xC1 or marker == 0xC2:
            if width >= 0 or stop - start < 6:
                return None
            height, width = _img_u16(p + start + 1, False), _img_u16(p + start + 3, False)
            components = p[start + 5]
            if (p[start] != 8 or (components != 1 and components != 3) or stop - start < 6 + 3 * components
                    or width < 1 or height < 1):
                return None
            for c in range(components):
                if not (1 <= p[start + 7 + 3 * c] >> 4 <= 4 and 1 <= p[start + 7 + 3 * c] & 15 <= 4):
                    return None
            frame_at = start
        elif _img_is_frame(marker) or marker < 0xC0 or 0xD0 <= marker <= 0xD9:
            return None  # another coding, or a marker that has no segment where one must be
        elif marker == 0xE1:
            if _starts_with(p + start, stop - start, b"Exif\0\0", 6):
                if exif_start >= 0:
                    return None  # several EXIF blocks: Pillow joins them
                exif_start, exif_stop = start + 6, stop
            elif (_starts_with(p + start, stop - start, b"http://ns.adobe.com/xap/1.0/\0", 29)
                    and _holds(p + start, stop - start, b"Orientation", 11)):
                return None  # Pillow reads the orientation from XMP when EXIF has none
        elif marker == 0xE2:
            if _starts_with(p + start, stop - start, b"ICC_PROFILE\0", 12):
                if stop - start < 14:
                    return None
                icc.append((start, stop))
            elif _starts_with(p + start, stop - start, b"MPF\0", 4):
                return None  # a multi-picture file: Pillow opens it as MPO
    if width < 0:
        return None
    sampling = tuple([(p[frame_at + 7 + 3 * c] >> 4, p[frame_at + 7 + 3 * c] & 15) for c in range(components)])
    return width, height, sampling, None if exif_start < 0 else (exif_start, exif_stop), tuple(icc)
