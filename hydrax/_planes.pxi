# A JPEG's planes into a batch slot, included by _core.pyx: libjpeg-turbo decodes the Y, Cb and Cr
# planes as stored (_libjpeg.h), and one call resamples each on its own grid and converts to RGB
# at the output's size (_planar.h), then through _pixels.pxi's colour conversion into the slot.
# Chroma is never upsampled to the photo's size and colour is converted for the output's pixels
# only; the cost is mostly libjpeg's entropy decoding and inverse DCT.

cdef extern from "_planar.h":
    int hx_planar_level
    int hx_planar_init(int most) noexcept nogil
    void hx_lookup_floats(const unsigned char* codes, Py_ssize_t n, const float* table, Py_ssize_t stride,
                          float* dest) noexcept nogil
    void hx_codes_planes(const unsigned char* r, const unsigned char* g, const unsigned char* b, Py_ssize_t n,
                         const float* lin0, const float* lin1, const float* lin2, const float* m, float steps,
                         const unsigned char* codes, int padded, unsigned char* d0, unsigned char* d1,
                         unsigned char* d2, Py_ssize_t step) noexcept nogil
    void hx_plane_vertical(const unsigned char* src, Py_ssize_t row_stride, Py_ssize_t n, Py_ssize_t count,
                           const int16_t* w, int16_t* dest) noexcept nogil
    void hx_plane_horizontal(const int16_t* src, const int32_t* bounds, Py_ssize_t shift, const int16_t* w,
                             Py_ssize_t kpad, Py_ssize_t out_size, int16_t* dest) noexcept nogil
    void hx_ycc_row(const int16_t* y, const int16_t* cb, const int16_t* cr, Py_ssize_t n,
                    unsigned char* rgb, Py_ssize_t plane) noexcept nogil
    int HX_BLOCK
    int hx_plane_block(const unsigned char* src, Py_ssize_t stride, const int32_t* row_bounds, const int16_t* row_w,
                       Py_ssize_t row_kpad, Py_ssize_t y0, Py_ssize_t out_h, Py_ssize_t first, Py_ssize_t n,
                       const int32_t* col_bounds, const int16_t* col_w, Py_ssize_t col_kpad, Py_ssize_t out_w,
                       int16_t* rows, int16_t* cols, int16_t* across, int16_t* dest) noexcept nogil

cdef extern from "_libjpeg.h":
    ctypedef struct hx_jpeg_api:
        void* handle
        void* read_scanlines
        void* skip_scanlines
        void* crop_scanline
    ctypedef struct hx_jpeg_job:
        pass
    int HX_JPEG_MAX_LINES
    int hx_jpeg_bind(const char* path, hx_jpeg_api* api) noexcept nogil
    int hx_jpeg_planes(const hx_jpeg_api* api, hx_jpeg_job* job, const unsigned char* data, size_t size,
                       unsigned int width, unsigned int height, const int* sampling, unsigned char*** rows,
                       Py_ssize_t imcu_rows, unsigned int max_lines, unsigned int stop, Py_ssize_t skip) noexcept nogil
    int hx_jpeg_region(const hx_jpeg_api* api, hx_jpeg_job* job, const unsigned char* data, size_t size,
                       unsigned int width, unsigned int height, int components, unsigned int denom, unsigned int left,
                       unsigned int right, unsigned int top, unsigned int bottom, unsigned char* dest,
                       Py_ssize_t stride, unsigned int* first_column) noexcept nogil

cdef enum:
    PLANE_ALIGN = 16     # each plane's rows start 16-byte aligned
    JPEG_MAX_SIDE = 65535

hx_planar_init(-1)


def planar_kernels(int most=-1):
    """The plane kernels that run, 0 (scalar loops), 1 (SSE2) or 2 (AVX2): the best this machine
    has, or at most ``most`` from now on (every level gives the same results; tests compare
    them). Returns the level chosen."""
    return hx_planar_init(most)


def jpeg_plane_layout(Py_ssize_t width, Py_ssize_t height, tuple sampling):
    """Where :meth:`JpegLibrary.decode_planes` puts the planes of a ``width`` x ``height`` JPEG
    whose components have the sampling factors ``sampling`` ((h, v) for Y, Cb, Cr; each 1-4):
    ``(planes, size)``, ``planes`` holding for each component ``(offset, rows, stride, height,
    width)`` (its rows padded to whole iMCU rows, its stride to whole blocks and 16 bytes more)
    and ``size`` the bytes of the buffer they need."""
    if not (0 < width <= JPEG_MAX_SIDE and 0 < height <= JPEG_MAX_SIDE):
        raise ValueError(f"a JPEG is 1 to 65535 pixels a side, not {width}x{height}")
    if len(sampling) != 3 or any(len(pair) != 2 or not all(1 <= f <= 4 for f in pair) for pair in sampling):
        raise ValueError(f"sampling must be three (h, v) pairs of 1-4, got {sampling!r}")
    cdef Py_ssize_t hmax = max(h for h, v in sampling), vmax = max(v for h, v in sampling)
    # (rounding up with cdivision's truncating division: every number here is positive)
    cdef Py_ssize_t imcu_rows = (height + 8 * vmax - 1) // (8 * vmax), offset = 0
    cdef Py_ssize_t plane_w, plane_h, stride, rows
    planes = []
    for h, v in sampling:
        plane_w, plane_h = (width * h + hmax - 1) // hmax, (height * v + vmax - 1) // vmax
        # libjpeg writes whole blocks of the component's own width, all rows of each iMCU row
        stride = ((plane_w + 7) // 8 * 8 + PLANE_ALIGN - 1) // PLANE_ALIGN * PLANE_ALIGN + PLANE_ALIGN
        rows = imcu_rows * 8 * v
        planes.append((offset, rows, stride, plane_h, plane_w))
        offset += rows * stride
    return tuple(planes), offset + PLANE_ALIGN


cdef class JpegLibrary:
    """libjpeg-turbo (libjpeg's ABI 6.2, 64-bit), opened from ``path`` (a shared library such as
    the one Pillow's wheels carry) to decode the planes of YCbCr JPEGs. Raises OSError where the
    library does not open or lacks a function this needs."""

    cdef hx_jpeg_api api
    cdef readonly str path

    def __cinit__(self, path):
        self.path = str(path)
        encoded = self.path.encode()
        if hx_jpeg_bind(encoded, &self.api) != 0:
            raise OSError(f"cannot use {self.path!r} as libjpeg-turbo: it does not open, or lacks libjpeg's functions")

    def decode_planes(self, const unsigned char[::1] data, Py_ssize_t width, Py_ssize_t height, tuple sampling,
                      unsigned char[::1] buffer, Py_ssize_t stop=-1, Py_ssize_t start=0):
        """Decode the JPEG ``data`` (``width`` x ``height``, YCbCr, components sampled as
        ``sampling``) into ``buffer`` (at least :func:`jpeg_plane_layout`'s size, 16-byte
        aligned) as that layout says. With ``stop`` (1 to ``height``), only the iMCU rows up to
        the one holding luma row ``stop - 1`` are decoded (the planes' rows below are then not
        written, and any damage there goes unseen). With ``start``, the iMCU rows above the one
        holding luma row ``start`` are read but not transformed: their rows in the planes are
        not written (chroma rows too: a caller reading chroma row r of a plane at 1/k of luma's
        height must give a ``start`` of at most k * r). Returns 0, 1 where libjpeg reported an error or a warning
        (the planes are then not usable), or 2 where the file is not what the arguments say (its
        size, components, colour space or sampling factors: nothing is then written)."""
        planes, size = jpeg_plane_layout(width, height, sampling)
        if buffer.shape[0] < size or (<uintptr_t>&buffer[0]) % PLANE_ALIGN:
            raise ValueError(f"the buffer must be 16-byte aligned and hold {size} bytes, not {buffer.shape[0]}")
        if stop == 0:
            raise ValueError("stop must be a positive number of rows, or -1 for all")
        if stop < 0 or stop > height:
            stop = height
        if start < 0:
            raise ValueError("start must be a row of the image, or 0")
        if data.shape[0] == 0:
            return 2
        cdef Py_ssize_t vmax = max(v for h, v in sampling)
        cdef Py_ssize_t imcu_rows = planes[0][1] // (8 * sampling[0][1])  # the layout's rows are whole iMCU rows
        cdef Py_ssize_t count = imcu_rows * HX_JPEG_MAX_LINES, c, m, k, row, offset, rows, stride, lines
        cdef unsigned char** pointers = <unsigned char**>malloc(3 * count * sizeof(unsigned char*))
        cdef unsigned char** components[3]
        cdef hx_jpeg_job* job = <hx_jpeg_job*>malloc(sizeof(hx_jpeg_job))
        if pointers == NULL or job == NULL:
            free(pointers)
            free(job)
            raise MemoryError()
        cdef int factors[6]
        for c in range(3):
            factors[2 * c], factors[2 * c + 1] = sampling[c][0], sampling[c][1]
            offset, rows, stride = planes[c][0], planes[c][1], planes[c][2]
            lines = 8 * sampling[c][1]
            components[c] = pointers + c * count
            # every pointer lands in the plane, even those libjpeg should never use
            for m in range(imcu_rows):
                for k in range(HX_JPEG_MAX_LINES):
                    row = min(m * lines + k, rows - 1)
                    components[c][m * HX_JPEG_MAX_LINES + k] = &buffer[offset + row * stride]
        cdef int status
        with nogil:
            status = hx_jpeg_planes(&self.api, job, &data[0], data.shape[0], width, height, factors, components,
                                    imcu_rows, 8 * vmax, stop, start // (8 * vmax))
        free(pointers)
        free(job)
        return status

    @property
    def scanlines(self):
        """Whether the library has the scanline calls :meth:`decode_region` needs (skipping and
        cropping: libjpeg-turbo 1.5 and later)."""
        return (self.api.read_scanlines != NULL and self.api.skip_scanlines != NULL
                and self.api.crop_scanline != NULL)

    def decode_region(self, const unsigned char[::1] data, Py_ssize_t width, Py_ssize_t height, int components,
                      int denom, Py_ssize_t left, Py_ssize_t top, Py_ssize_t right, Py_ssize_t bottom,
                      unsigned char[::1] buffer):
        """Decode rows ``top``..``bottom - 1`` and columns ``left``..``right - 1`` of the JPEG
        ``data`` (``width`` x ``height``, ``components`` 1: gray, or 3: YCbCr, decoded to RGB)
        scaled by 1/``denom`` (1, 2, 4 or 8; each side rounded up) into ``buffer``, laid out as
        the whole scaled image: row r at ``r * scaled_width * components`` bytes. libjpeg moves
        the left edge down to its iMCU column, and makes the crop's edges and the first rows
        after the skip as it makes the image's edges (callers decode a margin). Returns
        ``(status, first_column)``: status 0, 1 where libjpeg reported an error or a warning, or
        2 where the file is not what the arguments say or the library cannot crop (nothing
        usable is then written)."""
        if components not in (1, 3) or denom not in (1, 2, 4, 8):
            raise ValueError(f"components must be 1 or 3 and denom 1, 2, 4 or 8, not {components} and {denom}")
        if not (0 < width <= JPEG_MAX_SIDE and 0 < height <= JPEG_MAX_SIDE):
            raise ValueError(f"a JPEG is 1 to 65535 pixels a side, not {width}x{height}")
        cdef Py_ssize_t scaled_w = (width + denom - 1) // denom, scaled_h = (height + denom - 1) // denom
        if not (0 <= left < right <= scaled_w and 0 <= top < bottom <= scaled_h):
            raise ValueError(f"the region {left}, {top}, {right}, {bottom} is not inside {scaled_w}x{scaled_h}")
        cdef Py_ssize_t stride = scaled_w * components
        if buffer.shape[0] < scaled_h * stride:
            raise ValueError(f"the buffer must hold {scaled_h * stride} bytes, not {buffer.shape[0]}")
        if data.shape[0] == 0:
            return 2, left
        cdef hx_jpeg_job* job = <hx_jpeg_job*>malloc(sizeof(hx_jpeg_job))
        if job == NULL:
            raise MemoryError()
        cdef unsigned int first = left
        cdef int status
        with nogil:
            status = hx_jpeg_region(&self.api, job, &data[0], data.shape[0], width, height, components, denom, left,
                                    right, top, bottom, &buffer[0], stride, &first)
        free(job)
        return status, first


def resample_planes_into(const unsigned char[:, :] y, const unsigned char[:, :] cb, const unsigned char[:, :] cr,
                         pixel_out_t[:, :, ::1] out, bint chw, bint flip, Taps luma_columns, Taps luma_rows,
                         Taps chroma_columns, Taps chroma_rows, tuple colour):
    """Resize YCbCr planes into ``out`` (as for :func:`resample_into`) as RGB: ``y`` through the
    ``luma_`` taps, ``cb`` and ``cr`` (same shape) through the ``chroma_`` taps, all four making
    the slot's size, each plane's rows contiguous. ``colour`` as for :func:`resample_into`."""
    cdef Py_ssize_t out_channels = out.shape[0] if chw else out.shape[2]
    cdef Py_ssize_t out_height = out.shape[1] if chw else out.shape[0]
    cdef Py_ssize_t out_width = out.shape[2] if chw else out.shape[1]
    if y.strides[1] != 1 or cb.strides[1] != 1 or cr.strides[1] != 1 or cb.shape[0] != cr.shape[0] or cb.shape[1] != cr.shape[1]:
        raise ValueError("the planes' rows must be contiguous, and the chroma planes of one shape")
    for name, taps, size, made in (("luma columns", luma_columns, y.shape[1], out_width),
                                   ("luma rows", luma_rows, y.shape[0], out_height),
                                   ("chroma columns", chroma_columns, cb.shape[1], out_width),
                                   ("chroma rows", chroma_rows, cb.shape[0], out_height)):
        if taps.in_size != size or taps.out_size != made:
            raise ValueError(f"the {name}' taps take {taps.in_size} pixels to {taps.out_size}, not {size} to {made}")
    for taps in (luma_columns, luma_rows, chroma_columns, chroma_rows):
        (<Taps>taps)._short_ready()
    cdef ColourPlan plan
    if colour is None:
        if pixel_out_t is not uint8_t or out_channels != 3:
            raise ValueError("without a colour conversion the output must be uint8 RGB")
    else:
        if len(colour) != 8:
            raise ValueError("colour must hold lin, matrix, encode, curve, byte_curve, second, scale, offset")
        _plan_colour(&plan, 3, out_channels, pixel_out_t is uint8_t, colour[0], colour[1], colour[2], colour[3],
                     colour[4], colour[5], colour[6], colour[7])
    cdef Py_ssize_t luma_span = luma_columns.last - luma_columns.first + luma_columns.kpad
    cdef Py_ssize_t chroma_span = chroma_columns.last - chroma_columns.first + chroma_columns.kpad
    # three rows of vertically filtered values, three of finished values, the RGB row
    cdef int16_t* values = <int16_t*>calloc(luma_span + 2 * chroma_span + 3 * out_width, sizeof(int16_t))
    # the RGB row (and hx_ycc_row's spare byte), then room for it reversed (_lookup_planes)
    cdef unsigned char* line = <unsigned char*>malloc(6 * out_width + 1)
    cdef Py_ssize_t row_floats = 4 * max(out_width, 256)
    cdef float* scratch = <float*>malloc((row_floats + 4 * 256) * sizeof(float))
    if values == NULL or line == NULL or scratch == NULL:
        _release(values, line, scratch, NULL)
        raise MemoryError()
    # the codes table again with 3 bytes to spare, for the AVX2 kernel's 4-byte gathers
    cdef unsigned char* codes = NULL
    if colour is not None and plan.codes != NULL:
        codes = <unsigned char*>malloc(<Py_ssize_t>plan.code_steps + 1 + 4)
        if codes == NULL:
            _release(values, line, scratch, NULL)
            raise MemoryError()
        memcpy(codes, plan.codes, <Py_ssize_t>plan.code_steps + 1)
        memset(codes + <Py_ssize_t>plan.code_steps + 1, 0, 4)
        plan.codes = codes
        plan.codes_padded = True
    cdef const unsigned char* sources[3]
    cdef Py_ssize_t strides[3]
    sources[0], sources[1], sources[2] = &y[0, 0], &cb[0, 0], &cr[0, 0]
    strides[0], strides[1], strides[2] = y.strides[0], cb.strides[0], cr.strides[0]
    with nogil:
        if colour is not None and out_height * out_width > PIXELS_TABLE_MIN:
            _tabulate(&plan, <pixel_out_t*>(scratch + row_floats), scratch)
        _planes_rows(sources, strides, luma_columns, luma_rows, chroma_columns, chroma_rows, values, luma_span,
                     chroma_span, line, scratch, &out[0, 0, 0], chw, flip, NULL if colour is None else &plan)
    _release(values, line, scratch, codes)


cdef void _plane_row(const unsigned char* src, Py_ssize_t stride, Taps columns, Taps rows, Py_ssize_t yy,
                     int16_t* filtered, int16_t* dest) noexcept nogil:
    """Output row ``yy`` of one plane: its rows filtered over the columns the horizontal pass
    reads into ``filtered``, then that pass into ``dest``."""
    cdef Py_ssize_t ymin = rows.bounds[2 * yy]
    hx_plane_vertical(src + ymin * stride + columns.first, stride, columns.last - columns.first,
                      rows.bounds[2 * yy + 1], rows.short_weights + yy * rows.kpad, filtered)
    hx_plane_horizontal(filtered, columns.bounds, columns.first, columns.short_weights, columns.kpad,
                        columns.out_size, dest)


cdef void _planes_rows(const unsigned char** sources, const Py_ssize_t* strides, Taps luma_columns, Taps luma_rows,
                       Taps chroma_columns, Taps chroma_rows, int16_t* values, Py_ssize_t luma_span,
                       Py_ssize_t chroma_span, unsigned char* line, float* scratch, pixel_out_t* out, bint chw,
                       bint flip, const ColourPlan* plan) noexcept nogil:
    cdef Py_ssize_t out_width = luma_columns.out_size, out_height = luma_rows.out_size, yy
    cdef int16_t* filtered_cb = values + luma_span
    cdef int16_t* filtered_cr = filtered_cb + chroma_span
    cdef int16_t* finished = filtered_cr + chroma_span
    if _planes_blocks(sources, strides, luma_columns, luma_rows, chroma_columns, chroma_rows, line, scratch, out, chw,
                      flip, plan):
        return
    for yy in range(out_height):
        _plane_row(sources[0], strides[0], luma_columns, luma_rows, yy, values, finished)
        _plane_row(sources[1], strides[1], chroma_columns, chroma_rows, yy, filtered_cb, finished + out_width)
        _plane_row(sources[2], strides[2], chroma_columns, chroma_rows, yy, filtered_cr, finished + 2 * out_width)
        _finish_row(finished, finished + out_width, finished + 2 * out_width, yy, line, scratch, out, chw, flip, plan,
                    out_width, out_height)


cdef bint _planes_blocks(const unsigned char** sources, const Py_ssize_t* strides, Taps luma_columns, Taps luma_rows,
                         Taps chroma_columns, Taps chroma_rows, unsigned char* line, float* scratch, pixel_out_t* out,
                         bint chw, bint flip, const ColourPlan* plan) noexcept nogil:
    """What :func:`_planes_rows` does, HX_BLOCK rows at a time (hx_plane_block: the same values);
    False, with nothing written, where those kernels do not run or memory is short."""
    cdef Py_ssize_t out_width = luma_columns.out_size, out_height = luma_rows.out_size, y0, r, c
    cdef Py_ssize_t out16 = (out_width + 15) // 16 * 16
    cdef Py_ssize_t kpad = max(luma_columns.kpad, chroma_columns.kpad)
    cdef Py_ssize_t n16 = (max(luma_columns.last - luma_columns.first, chroma_columns.last - chroma_columns.first)
                           + 15) // 16 * 16
    if hx_planar_level < 2 or HX_BLOCK != 16 or luma_columns.kpad % 2 or chroma_columns.kpad % 2:
        return False
    # the vertical rows, their columns, the horizontal pass's columns, each plane's finished rows
    cdef int16_t* block = <int16_t*>calloc(HX_BLOCK * (2 * n16 + kpad + out16 + 3 * out16), sizeof(int16_t))
    if block == NULL:
        return False
    cdef int16_t* rows_buffer = block
    cdef int16_t* cols_buffer = rows_buffer + HX_BLOCK * n16
    cdef int16_t* across = cols_buffer + HX_BLOCK * (n16 + kpad)
    cdef int16_t* finished = across + HX_BLOCK * out16
    for y0 in range(0, out_height, 16):  # HX_BLOCK, as a constant Cython can count with
        _plane_block(sources[0], strides[0], luma_columns, luma_rows, y0, rows_buffer, cols_buffer, across, finished)
        for c in range(1, 3):
            _plane_block(sources[c], strides[c], chroma_columns, chroma_rows, y0, rows_buffer, cols_buffer, across,
                         finished + c * HX_BLOCK * out16)
        for r in range(min(HX_BLOCK, out_height - y0)):
            _finish_row(finished + r * out16, finished + HX_BLOCK * out16 + r * out16,
                        finished + 2 * HX_BLOCK * out16 + r * out16, y0 + r, line, scratch, out, chw, flip, plan,
                        out_width, out_height)
    free(block)
    return True


cdef void _plane_block(const unsigned char* src, Py_ssize_t stride, Taps columns, Taps rows, Py_ssize_t y0,
                       int16_t* rows_buffer, int16_t* cols_buffer, int16_t* across, int16_t* dest) noexcept nogil:
    """HX_BLOCK output rows of one plane from ``y0`` on into ``dest`` (see hx_plane_block)."""
    hx_plane_block(src, stride, rows.bounds, rows.short_weights, rows.kpad, y0, rows.out_size, columns.first,
                   columns.last - columns.first, columns.bounds, columns.short_weights, columns.kpad, columns.out_size,
                   rows_buffer, cols_buffer, across, dest)


cdef void _finish_row(const int16_t* y, const int16_t* cb, const int16_t* cr, Py_ssize_t yy, unsigned char* line,
                      float* scratch, pixel_out_t* out, bint chw, bint flip, const ColourPlan* plan,
                      Py_ssize_t out_width, Py_ssize_t out_height) noexcept nogil:
    """Output row ``yy`` from its resampled Y, Cb and Cr: converted to RGB, then through the
    colour ``plan`` (or as they are) into the slot."""
    cdef Py_ssize_t plane = out_width * out_height
    cdef Py_ssize_t out_channels = plan.out_channels if plan != NULL else 3
    if plan != NULL and plan.lut != NULL:  # a table per channel: look each up in its own row
        hx_ycc_row(y, cb, cr, out_width, line, out_width)
        _lookup_planes(plan, line, <const pixel_out_t*>plan.lut,
                       out + (yy * out_width if chw else yy * out_width * out_channels), out_width, plane, chw, flip)
        return
    if pixel_out_t is uint8_t:
        if plan != NULL and plan.codes != NULL and out_channels == 3 and hx_planar_level >= 2:
            # wide-gamut into 8-bit sRGB: the matrix and codes from rows of their own, eight pixels a time
            hx_ycc_row(y, cb, cr, out_width, line, out_width)
            _codes_planes(plan, line, out + (yy * out_width if chw else yy * out_width * 3), out_width, plane, chw, flip)
            return
    hx_ycc_row(y, cb, cr, out_width, line, 0)
    if plan == NULL:
        if pixel_out_t is uint8_t:  # resample_planes_into allows no other
            _copy_row(line, out + (yy * out_width if chw else yy * out_width * 3), out_width, 3, plane, chw, flip)
    else:
        _convert_row(plan, line, out + (yy * out_width if chw else yy * out_width * out_channels), out_width, plane,
                     chw, flip, scratch)


cdef void _lookup_planes(const ColourPlan* p, const unsigned char* rgb, const pixel_out_t* table, pixel_out_t* o,
                         Py_ssize_t width, Py_ssize_t plane, bint chw, bint flip) noexcept nogil:
    """What ``_lookup_row`` does, from R, G and B in rows of their own (``width`` bytes apart)."""
    cdef Py_ssize_t out_channels = p.out_channels, x, c
    cdef Py_ssize_t step = 1 if chw else out_channels
    cdef const pixel_out_t* column
    cdef const unsigned char* codes
    cdef pixel_out_t* dest
    if pixel_out_t is float:
        if chw:  # rows of floats: eight lookups at a time (a mirrored row's codes reversed first)
            if flip:
                rgb = _reversed_rows(rgb, width)
            for c in range(out_channels):
                hx_lookup_floats(rgb + (c if c < 3 else 0) * width, width, table + c, out_channels, o + c * plane)
            return
    if flip:
        o += (width - 1) * step
        step = -step
    for c in range(out_channels):
        dest = o + (c * plane if chw else c)
        column = table + c
        codes = rgb + (c if c < 3 else 0) * width  # alpha: 255 whatever the code, so any row
        for x in range(width):
            dest[x * step] = column[codes[x] * out_channels]


cdef void _codes_planes(const ColourPlan* p, const unsigned char* rgb, unsigned char* o, Py_ssize_t width,
                        Py_ssize_t plane, bint chw, bint flip) noexcept nogil:
    """What ``_convert_row`` does for 8-bit sRGB codes without alpha, from R, G and B rows (a
    mirrored row's reversed first, into the room after them, so the stores go forwards)."""
    if flip:
        rgb = _reversed_rows(rgb, width)
    hx_codes_planes(rgb, rgb + width, rgb + 2 * width, width, p.lin0, p.lin1, p.lin2, p.m, p.code_steps, p.codes,
                    p.codes_padded, o, o + (plane if chw else 1), o + (2 * plane if chw else 2), 1 if chw else 3)


cdef const unsigned char* _reversed_rows(const unsigned char* rgb, Py_ssize_t width) noexcept nogil:
    """The R, G and B rows at ``rgb`` (``width`` bytes each), each reversed into the room after
    them (the row buffer has it): a mirrored row, so the stores after can go forwards."""
    cdef unsigned char* reversed_rows = <unsigned char*>rgb + 3 * width
    cdef Py_ssize_t x, c
    for c in range(3):
        for x in range(width):
            reversed_rows[c * width + x] = rgb[c * width + width - 1 - x]
    return reversed_rows
