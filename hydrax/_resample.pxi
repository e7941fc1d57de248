# Resampling kernels, included by _core.pyx: decoded 8-bit pixels, resized, cropped and mirrored,
# to finished values in a batch slot, in one call.
#
# The arithmetic is Pillow's for 8-bit images (its Resample.c): each output pixel's filter weights
# are computed in double from the box's corners as float32, normalised to sum to one, and kept in
# fixed point with 22 fraction bits; a horizontal pass rounds to 8 bits, then a vertical pass does
# the same. So a slot filled here holds, to the bit, what Pillow's Image.resize(size, filter, box)
# gives for the same pixels, whichever library decoded them. What is ours: both passes read the
# source through its strides (an EXIF rotation is a numpy view, not a copy), only the rows the box
# needs are filtered, and each finished row of the vertical pass goes straight through the colour
# conversion of _pixels.pxi into the slot, so the resized image is never stored whole.

from libc.math cimport ceil, cos, sin, M_PI
from libc.stdint cimport int16_t, int32_t, uintptr_t

# SIMD versions of the two passes (packed RGB rows horizontally, any packed rows vertically), to
# the bit the same as the loops below (the header says how); HX_SIMD is 0 where there are none,
# and the loops then run as they are.
cdef extern from "_simd.h":
    bint HX_SIMD
    int HX_PAIR_INT16
    int hx_split_weights(const int32_t* weights, Py_ssize_t ksize, Py_ssize_t out_size, Py_ssize_t npairs,
                         int16_t* out) noexcept nogil
    void hx_horizontal_rgb(const unsigned char* src, Py_ssize_t row_stride, Py_ssize_t rows, const int32_t* bounds,
                           const int32_t* weights, Py_ssize_t ksize, const int16_t* pairs, Py_ssize_t npairs,
                           Py_ssize_t out_size, Py_ssize_t shift, Py_ssize_t last, unsigned char* dest) noexcept nogil
    void hx_vertical_row(const unsigned char* src, Py_ssize_t row_stride, Py_ssize_t values, Py_ssize_t ymin,
                         Py_ssize_t count, const int32_t* k, const int16_t* pw, unsigned char* dest) noexcept nogil

# The plane kernels' fixed point (_planes.pxi), whose weights Taps also keeps.
cdef extern from "_planar.h":
    int HX_WBITS
    int HX_KPAD

cdef enum:
    RESAMPLE_BITS = 22          # fraction bits of the weights: 8 bits of value and 2 of headroom below 32
    RESAMPLE_MAX_SIDE = 1 << 24  # beyond any image a JPEG, PNG or WebP can hold
    RESAMPLE_MAX_TAPS = 1 << 26  # weights of one axis: 256 MiB, far beyond any real resize

# Pillow's numbers for its filters (Image.Resampling), which callers pass as they are.
cdef enum:
    FILTER_LANCZOS = 1
    FILTER_BILINEAR = 2
    FILTER_BICUBIC = 3
    FILTER_BOX = 4
    FILTER_HAMMING = 5


cdef double _filter_support(int kind) noexcept nogil:
    if kind == FILTER_BOX:
        return 0.5
    if kind == FILTER_BICUBIC:
        return 2.0
    if kind == FILTER_LANCZOS:
        return 3.0
    return 1.0  # bilinear, hamming


cdef inline double _sinc(double x) noexcept nogil:
    if x == 0.0:
        return 1.0
    x = x * M_PI
    return sin(x) / x


cdef inline double _filter_weight(int kind, double x) noexcept nogil:
    if kind == FILTER_BOX:
        return 1.0 if -0.5 < x <= 0.5 else 0.0
    if kind == FILTER_LANCZOS:
        return _sinc(x) * _sinc(x / 3.0) if -3.0 <= x < 3.0 else 0.0
    if x < 0.0:
        x = -x
    if kind == FILTER_BILINEAR:
        return 1.0 - x if x < 1.0 else 0.0
    if kind == FILTER_BICUBIC:  # a = -0.5
        if x < 1.0:
            return (1.5 * x - 2.5) * x * x + 1.0
        return (((x - 5.0) * x + 8.0) * x - 4.0) * -0.5 if x < 2.0 else 0.0
    # hamming; Pillow writes its constants as floats
    if x == 0.0:
        return 1.0
    if x >= 1.0:
        return 0.0
    x = x * M_PI
    return sin(x) / x * (<double>(<float>0.54) + <double>(<float>0.46) * cos(x))


cdef class Taps:
    """The weights of one axis of a resize: ``in_size`` pixels, of which the span from ``in0`` to
    ``in1`` (fractions allowed) becomes ``out_size`` pixels through Pillow's filter ``kind``
    (1 Lanczos, 2 bilinear, 3 bicubic, 4 box, 5 Hamming; antialiased when reducing).

    For each output pixel: the first input pixel it reads, how many it reads, and their weights in
    fixed point. ``first`` and ``last`` bound the input pixels any output reads; ``needed`` is
    false where the axis is left as it is (Pillow then skips the pass, so this does too).
    Immutable once built, so the kernel can trust every bound in it.
    """

    cdef readonly Py_ssize_t in_size, out_size, ksize, first, last
    cdef readonly bint needed
    cdef int32_t* bounds
    cdef int32_t* weights
    # The weights split for the SIMD kernels (_simd.h), npairs pairs of taps per output pixel, in
    # pairs_block aligned to 16 bytes; NULL where the scalar loops do the work.
    cdef int16_t* pairs
    cdef void* pairs_block
    cdef Py_ssize_t npairs
    # The weights again with 14 fraction bits, kpad (a multiple of 8) per output pixel, zero past
    # its count, summing to exactly one, for the plane kernels (_planes.pxi); 16-byte aligned.
    cdef int16_t* short_weights
    cdef void* short_block
    cdef Py_ssize_t kpad
    cdef bint split_tried

    def __cinit__(self, Py_ssize_t in_size, double in0, double in1, Py_ssize_t out_size, int kind,
                  Py_ssize_t chroma=0):
        self.bounds = NULL
        self.weights = NULL
        self.pairs = NULL
        self.pairs_block = NULL
        self.short_weights = NULL
        self.short_block = NULL
        if not FILTER_LANCZOS <= kind <= FILTER_HAMMING:
            raise ValueError(f"unsupported resampling filter {kind} (Pillow's numbers 1-5; nearest is not one)")
        if not (0 < in_size <= RESAMPLE_MAX_SIDE and 0 < out_size <= RESAMPLE_MAX_SIDE):
            raise ValueError(f"cannot resample {in_size} pixels into {out_size}")
        # Pillow takes the box as float32 and subtracts in float32.
        cdef float start = <float>in0
        cdef float stop = <float>in1
        if not (0.0 <= start < stop <= in_size):  # also false for NaN
            raise ValueError(f"the span {in0!r}..{in1!r} is not a non-empty part of 0..{in_size}")
        cdef double scale = <double>(stop - start) / out_size
        cdef double filterscale = scale if scale >= 1.0 else 1.0
        cdef double support = _filter_support(kind) * filterscale
        self.ksize = <Py_ssize_t>ceil(support) * 2 + 1
        if self.ksize * out_size > RESAMPLE_MAX_TAPS:
            raise ValueError(f"resampling {in_size} pixels into {out_size} needs too many weights")
        if chroma and not (in_size + 1) // 2 == chroma:
            raise ValueError(f"{in_size} pixels have {(in_size + 1) // 2} chroma samples at half resolution, not {chroma}")
        self.in_size, self.out_size = in_size, out_size
        self.needed = out_size != in_size or start != 0.0 or stop != out_size
        self.bounds = <int32_t*>malloc(2 * out_size * sizeof(int32_t))
        self.weights = <int32_t*>malloc(self.ksize * out_size * sizeof(int32_t))
        cdef double* scratch = <double*>malloc((3 * self.ksize + 8) * sizeof(double))
        if self.bounds == NULL or self.weights == NULL or scratch == NULL:
            free(scratch)
            raise MemoryError()
        _compute_taps(self, start, scale, filterscale, support, kind, scratch, chroma)
        free(scratch)
        self.kpad = _short_pad(self)
        # the short and split weights are made on first use (_short_ready, _pairs_ready): each
        # kernel reads one of the two, and a random crop's taps are mostly used once

    cdef int _short_ready(self) except -1:
        """Make the short weights, once (the plane kernels read them). Called with the GIL held,
        before any kernel reads them, so no two threads make them and none reads a half-made set."""
        if self.short_weights != NULL:
            return 0
        self.short_block = malloc(self.out_size * self.kpad * sizeof(int16_t) + 15)
        if self.short_block == NULL:
            raise MemoryError()
        _shorten_taps(self, <int16_t*>((<uintptr_t>self.short_block + 15) & ~<uintptr_t>15))
        return 0

    cdef void _pairs_ready(self) noexcept:
        """Make the split weights, once, where the SIMD kernels run (resample_into reads them);
        with the GIL held, as :meth:`_short_ready`. Where they cannot be made the scalar loops run."""
        if HX_SIMD and not self.split_tried:
            self.split_tried = True
            _split_taps(self)

    def __dealloc__(self):
        free(self.bounds)
        free(self.weights)
        free(self.pairs_block)
        free(self.short_block)

    def arrays(self):
        """``(bounds, weights)`` as numpy arrays: (out_size, 2) first input pixel and count,
        (out_size, ksize) weights with 22 fraction bits. For tests and inspection."""
        import numpy
        bounds = numpy.empty((self.out_size, 2), numpy.int32)
        weights = numpy.empty((self.out_size, self.ksize), numpy.int32)
        cdef int32_t[:, ::1] b = bounds
        cdef int32_t[:, ::1] w = weights
        memcpy(&b[0, 0], self.bounds, 2 * self.out_size * sizeof(int32_t))
        memcpy(&w[0, 0], self.weights, self.ksize * self.out_size * sizeof(int32_t))
        return bounds, weights


# The normalised weights of the last axis made without chroma, kept so that the chroma axis of
# the same span, which the plane path asks for next, folds them rather than computing them again
# (the division Pillow normalises with is most of the cost). Read and written with the GIL held
# (Taps are made only so), so no two threads share it half made.
cdef double* _memo_weights = NULL
cdef int32_t* _memo_spans = NULL
cdef Py_ssize_t _memo_room = 0, _memo_out = 0, _memo_in = 0, _memo_ksize = 0
cdef int _memo_kind = 0
cdef float _memo_start = 0.0
cdef double _memo_scale = 0.0


cdef bint _memo_reserve(Py_ssize_t out_size, Py_ssize_t ksize) noexcept:
    """Room in the memo for an axis of ``out_size`` pixels of ``ksize`` weights (and, as ksize
    is at least 3, for their two bounds each), the memo emptied; False where memory is short
    (the axis is then not kept)."""
    global _memo_weights, _memo_spans, _memo_room, _memo_out
    _memo_out = 0
    if out_size * ksize > _memo_room:
        free(_memo_weights)
        free(_memo_spans)
        _memo_room = out_size * ksize
        _memo_weights = <double*>malloc(_memo_room * sizeof(double))
        _memo_spans = <int32_t*>malloc(_memo_room * sizeof(int32_t))
        if _memo_weights == NULL or _memo_spans == NULL:
            free(_memo_weights)
            free(_memo_spans)
            _memo_weights, _memo_spans, _memo_room = NULL, NULL, 0
            return False
    return True


cdef void _compute_taps(Taps taps, float start, double scale, double filterscale, double support, int kind,
                        double* k, Py_ssize_t chroma) noexcept:
    """Each output pixel's weights as Pillow computes them (``k``: 3 x ksize + 8 doubles of scratch),
    folded onto ``chroma`` samples where that is not 0 (see :func:`_fold_taps`): taken from the
    memo where the luma axis of the same span was the last made."""
    global _memo_out, _memo_in, _memo_ksize, _memo_kind, _memo_start, _memo_scale
    cdef Py_ssize_t xx, x, xmin, xmax, ksize = taps.ksize, out_size = taps.out_size
    cdef double center, total, weight
    cdef double ss = 1.0 / filterscale
    cdef int32_t* fixed
    cdef bint reuse = (chroma != 0 and _memo_out == out_size and _memo_in == taps.in_size and _memo_kind == kind
                       and _memo_start == start and _memo_scale == scale and _memo_ksize == ksize)
    cdef bint keep = chroma == 0 and _memo_reserve(out_size, ksize)
    for xx in range(out_size):
        if reuse:
            xmin, xmax = _memo_spans[2 * xx], _memo_spans[2 * xx + 1]
            memcpy(k, _memo_weights + xx * ksize, xmax * sizeof(double))
        else:
            center = start + (xx + 0.5) * scale
            xmin = <Py_ssize_t>(center - support + 0.5)  # truncation, as Pillow rounds
            if xmin < 0:
                xmin = 0
            xmax = <Py_ssize_t>(center + support + 0.5)
            if xmax > taps.in_size:
                xmax = taps.in_size
            xmax -= xmin
            if xmax < 0:
                xmax = 0
            if xmax > ksize:  # cannot happen for these filters; the kernel relies on it
                xmax = ksize
            total = 0.0
            for x in range(xmax):
                weight = _filter_weight(kind, (x + xmin - center + 0.5) * ss)
                k[x] = weight
                total += weight
            if total != 0.0:
                for x in range(xmax):
                    k[x] /= total
            if keep:
                _memo_spans[2 * xx], _memo_spans[2 * xx + 1] = <int32_t>xmin, <int32_t>xmax
                memcpy(_memo_weights + xx * ksize, k, xmax * sizeof(double))
        if chroma:
            xmin, xmax = _fold_taps(k, xmin, xmax, chroma, k + ksize)
            xmax = min(xmax, ksize)  # cannot happen (see _fold_taps); the kernel relies on it
        fixed = taps.weights + xx * ksize
        for x in range(ksize):  # (k is normalised once, as Pillow does: total is now 1.0, or 0.0 for none)
            weight = k[x] if x < xmax else 0.0
            fixed[x] = <int32_t>(weight * (1 << RESAMPLE_BITS) + (0.5 if weight >= 0 else -0.5))
        taps.bounds[2 * xx] = <int32_t>xmin
        taps.bounds[2 * xx + 1] = <int32_t>xmax
    if keep:
        _memo_out, _memo_in, _memo_ksize, _memo_kind, _memo_start, _memo_scale = (out_size, taps.in_size, ksize, kind,
                                                                                  start, scale)
    if chroma:
        taps.in_size = chroma
    taps.first = taps.bounds[0]
    taps.last = taps.bounds[2 * (taps.out_size - 1)] + taps.bounds[2 * (taps.out_size - 1) + 1]


cdef (Py_ssize_t, Py_ssize_t) _fold_taps(double* k, Py_ssize_t xmin, Py_ssize_t count, Py_ssize_t chroma,
                                         double* folded) noexcept:
    """Weights ``k`` of luma pixels ``xmin``.. (``count`` of them) moved onto the chroma samples
    they are made of when libjpeg upsamples chroma of half resolution with its triangle filter
    (luma pixel 2m: 3/4 of sample m and 1/4 of m - 1; 2m + 1: 3/4 of m and 1/4 of m + 1; the
    edges repeat): so resampling the chroma plane with the folded weights gives what resampling
    libjpeg's upsampled chroma would, without upsampling it. Returns (first sample, count), the
    weights in ``k``: at most count // 2 + 2 of them, which is never more than ksize (``folded``
    has room for count // 2 + 4)."""
    if count == 0:
        return 0, 0
    cdef Py_ssize_t x, near, far, low = max(xmin // 2 - 1, 0), high = min((xmin + count - 1) // 2 + 1, chroma - 1)
    for x in range(high - low + 1):
        folded[x] = 0.0
    for x in range(xmin, xmin + count):
        near = x // 2
        far = near - 1 if x % 2 == 0 else near + 1
        far = min(max(far, 0), chroma - 1)
        folded[near - low] += 0.75 * k[x - xmin]
        folded[far - low] += 0.25 * k[x - xmin]
    while high > low and folded[high - low] == 0.0:
        high -= 1
    x = 0
    while low + x < high and folded[x] == 0.0:
        x += 1
    low += x
    for near in range(high - low + 1):
        k[near] = folded[near + x]
    return low, high - low + 1


cdef Py_ssize_t _short_pad(Taps taps) noexcept:
    """The short weights' count per pixel: the most taps any pixel has, rounded up to 4 or to a
    multiple of 8 (what the kernels read at once)."""
    cdef Py_ssize_t xx, most = 1
    for xx in range(taps.out_size):
        most = max(most, taps.bounds[2 * xx + 1])
    return 4 if most <= 4 else (most + HX_KPAD - 1) // HX_KPAD * HX_KPAD


cdef void _shorten_taps(Taps taps, int16_t* short_weights) noexcept:
    """The short weights from the fixed-point ones into ``short_weights`` (out_size x kpad,
    16-byte aligned), then made the taps' own: each rounded to 14 fraction bits, and what
    rounding took from the sum given to the largest, so a flat area stays flat."""
    cdef Py_ssize_t xx, x, count, largest
    cdef int32_t total, weight
    cdef const int32_t* k
    cdef int16_t* w
    for xx in range(taps.out_size):
        k = taps.weights + xx * taps.ksize
        w = short_weights + xx * taps.kpad
        count = taps.bounds[2 * xx + 1]
        total = 0
        largest = 0
        for x in range(taps.kpad):
            weight = (k[x] + (1 << (RESAMPLE_BITS - HX_WBITS - 1))) >> (RESAMPLE_BITS - HX_WBITS) if x < count else 0
            weight = max(-32768, min(32767, weight))  # for any real filter, far inside
            w[x] = <int16_t>weight
            total += weight
            if x < count and k[x] > k[largest]:
                largest = x
        if count > 0:
            w[largest] = <int16_t>max(-32768, min(32767, w[largest] + (1 << HX_WBITS) - total))
    taps.short_weights = short_weights  # only now complete


cdef void _split_taps(Taps taps) noexcept:
    """The weights again as the SIMD kernels take them, if they fit (they do for real resizes)."""
    cdef Py_ssize_t xx, most = 0
    for xx in range(taps.out_size):
        most = max(most, taps.bounds[2 * xx + 1])
    cdef Py_ssize_t npairs = (most + 1) // 2
    # 32 bytes a pair: beyond 64 MiB (no real resize comes near) the scalar loops do without
    if npairs == 0 or taps.out_size * npairs > (1 << 21):
        return
    cdef void* block = malloc(taps.out_size * npairs * HX_PAIR_INT16 * sizeof(int16_t) + 15)
    if block == NULL:
        return  # the scalar loops need no more memory
    cdef int16_t* pairs = <int16_t*>((<uintptr_t>block + 15) & ~<uintptr_t>15)
    if not hx_split_weights(taps.weights, taps.ksize, taps.out_size, npairs, pairs):
        free(block)
        return
    taps.pairs_block, taps.pairs, taps.npairs = block, pairs, npairs


cdef inline unsigned char _clip_fixed(int32_t value) noexcept nogil:
    value >>= RESAMPLE_BITS  # an arithmetic shift: rounds towards minus infinity, as Pillow's does
    return <unsigned char>(0 if value < 0 else (255 if value > 255 else value))


cdef void _horizontal(const unsigned char* src, Py_ssize_t row_stride, Py_ssize_t pixel_stride,
                      Py_ssize_t channel_stride, Py_ssize_t channels, Py_ssize_t rows, Taps taps,
                      Py_ssize_t shift, unsigned char* dest) noexcept nogil:
    """``rows`` source rows (the first at ``src``, whose first pixel is input pixel ``shift``)
    through ``taps`` into packed rows at ``dest``."""
    if channels == 3 and pixel_stride == 3 and channel_stride == 1:
        _horizontal_rgb(src, row_stride, rows, taps, shift, dest)
        return
    cdef Py_ssize_t y, xx, x, c, xmin, xmax, out_size = taps.out_size, ksize = taps.ksize
    cdef const int32_t* k
    cdef const unsigned char* p
    cdef int32_t s0
    for y in range(rows):
        for xx in range(out_size):
            xmin = taps.bounds[2 * xx] - shift
            xmax = taps.bounds[2 * xx + 1]
            k = taps.weights + xx * ksize
            p = src + y * row_stride + xmin * pixel_stride
            for c in range(channels):
                s0 = 1 << (RESAMPLE_BITS - 1)
                for x in range(xmax):
                    s0 += p[x * pixel_stride + c * channel_stride] * k[x]
                dest[c] = _clip_fixed(s0)
            dest += channels


cdef void _horizontal_rgb(const unsigned char* src, Py_ssize_t row_stride, Py_ssize_t rows, Taps taps,
                          Py_ssize_t shift, unsigned char* dest) noexcept nogil:
    """:func:`_horizontal` for packed RGB, the common case: the SIMD kernel where there is one,
    else two taps at a time (the sums wrap the same in any order, so they equal Pillow's)."""
    if HX_SIMD and taps.pairs != NULL:
        hx_horizontal_rgb(src, row_stride, rows, taps.bounds, taps.weights, taps.ksize, taps.pairs, taps.npairs,
                          taps.out_size, shift, taps.last, dest)
        return
    cdef Py_ssize_t y, xx, x, xmin, xmax, out_size = taps.out_size, ksize = taps.ksize
    # locals, not the object's fields: stores through dest (a char pointer) may alias anything
    cdef const int32_t* bounds = taps.bounds
    cdef const int32_t* weights = taps.weights
    cdef const int32_t* k
    cdef const unsigned char* p
    cdef const unsigned char* line
    cdef int32_t s0, s1, s2, w0, w1
    for y in range(rows):
        line = src + y * row_stride - 3 * shift
        for xx in range(out_size):
            xmin = bounds[2 * xx]
            xmax = bounds[2 * xx + 1]
            k = weights + xx * ksize
            p = line + 3 * xmin
            s0 = s1 = s2 = 1 << (RESAMPLE_BITS - 1)
            x = 0
            while x + 2 <= xmax:
                w0 = k[x]
                w1 = k[x + 1]
                s0 += p[0] * w0 + p[3] * w1
                s1 += p[1] * w0 + p[4] * w1
                s2 += p[2] * w0 + p[5] * w1
                p += 6
                x += 2
            if x < xmax:
                w0 = k[x]
                s0 += p[0] * w0
                s1 += p[1] * w0
                s2 += p[2] * w0
            dest[0] = _clip_fixed(s0)
            dest[1] = _clip_fixed(s1)
            dest[2] = _clip_fixed(s2)
            dest += 3


cdef void _vertical_row(const unsigned char* src, Py_ssize_t row_stride, Py_ssize_t values, Taps taps,
                        Py_ssize_t yy, Py_ssize_t shift, int32_t* sums, unsigned char* dest) noexcept nogil:
    """Output row ``yy`` of ``taps`` from rows of ``values`` packed bytes (``row_stride`` apart,
    the first at ``src``, which is input row ``shift``) into ``dest``."""
    cdef Py_ssize_t i, y = 0, ymin = taps.bounds[2 * yy] - shift, ymax = taps.bounds[2 * yy + 1]
    cdef const int32_t* k = taps.weights + yy * taps.ksize
    cdef const unsigned char* row
    cdef const unsigned char* next_row
    cdef int32_t weight, next_weight
    if HX_SIMD and taps.pairs != NULL:
        hx_vertical_row(src, row_stride, values, ymin, ymax, k, taps.pairs + yy * taps.npairs * HX_PAIR_INT16, dest)
        return
    for i in range(values):
        sums[i] = 1 << (RESAMPLE_BITS - 1)
    while y + 2 <= ymax:  # two rows at a time: half the passes over sums
        row = src + (ymin + y) * row_stride
        next_row = row + row_stride
        weight = k[y]
        next_weight = k[y + 1]
        for i in range(values):
            sums[i] += row[i] * weight + next_row[i] * next_weight
        y += 2
    if y < ymax:
        row = src + (ymin + y) * row_stride
        weight = k[y]
        for i in range(values):
            sums[i] += row[i] * weight
    for i in range(values):
        dest[i] = _clip_fixed(sums[i])


cdef void _gather_row(const unsigned char* src, Py_ssize_t pixel_stride, Py_ssize_t channel_stride,
                      Py_ssize_t channels, Py_ssize_t width, unsigned char* dest) noexcept nogil:
    cdef Py_ssize_t x, c
    for x in range(width):
        for c in range(channels):
            dest[x * channels + c] = src[x * pixel_stride + c * channel_stride]


cdef void _copy_row(const unsigned char* row, unsigned char* o, Py_ssize_t width, Py_ssize_t channels,
                    Py_ssize_t plane, bint chw, bint flip) noexcept nogil:
    """A packed row of 8-bit pixels stored as it is (the slot has as many channels)."""
    cdef Py_ssize_t x, c, at
    if not chw and not flip:
        memcpy(o, row, width * channels)
        return
    for x in range(width):
        at = width - 1 - x if flip else x
        for c in range(channels):
            if chw:
                o[c * plane + at] = row[x * channels + c]
            else:
                o[at * channels + c] = row[x * channels + c]


def resample_into(const unsigned char[:, :, :] src, pixel_out_t[:, :, ::1] out, bint chw, bint flip,
                  Taps columns, Taps rows, tuple colour):
    """Resize ``src`` (H, W, 1-4 channels of uint8, any strides) into ``out`` and convert it.

    ``columns`` and ``rows`` are the :class:`Taps` of the two axes (their input sizes W and H,
    their output sizes the slot's width and height). ``out`` is as for :func:`convert_pixels`;
    ``flip`` mirrors it left-right. ``colour`` is ``convert_pixels``'s arguments from ``lin`` to
    ``offset``, as a tuple, or None to store the resized 8-bit values as they are (the slot uint8
    with as many channels as ``src``). The passes run in the order Pillow 13 runs them.
    """
    cdef Py_ssize_t height = src.shape[0], width = src.shape[1], channels = src.shape[2]
    cdef Py_ssize_t out_channels = out.shape[0] if chw else out.shape[2]
    cdef Py_ssize_t out_height = out.shape[1] if chw else out.shape[0]
    cdef Py_ssize_t out_width = out.shape[2] if chw else out.shape[1]
    if columns.in_size != width or rows.in_size != height:
        raise ValueError(f"the taps are for {rows.in_size}x{columns.in_size} pixels, not {height}x{width}")
    if columns.out_size != out_width or rows.out_size != out_height:
        raise ValueError(f"the taps make {rows.out_size}x{columns.out_size} pixels, but the output is {out_height}x{out_width}")
    if not 1 <= channels <= 4:
        raise ValueError(f"cannot resample {channels} channels")
    cdef ColourPlan plan
    if colour is None:
        if pixel_out_t is not uint8_t or out_channels != channels:
            raise ValueError(f"without a colour conversion the output must be uint8 with {channels} channels")
    else:
        if len(colour) != 8:
            raise ValueError("colour must hold lin, matrix, encode, curve, byte_curve, second, scale, offset")
        _plan_colour(&plan, channels, out_channels, pixel_out_t is uint8_t, colour[0], colour[1], colour[2], colour[3],
                     colour[4], colour[5], colour[6], colour[7])
    # Pillow 13 filters columns first unless the height shrinks by more than twice what the width does.
    cdef bint vertical_first = (columns.needed and rows.needed and height - out_height > 0
                                and height - out_height > 2 * (width - out_width))
    cdef Py_ssize_t wide = (columns.last - columns.first) * channels  # one vertically filtered row
    cdef Py_ssize_t values = out_width * channels
    cdef Py_ssize_t temp_size = (rows.last - rows.first) * values if columns.needed and not vertical_first else 0
    cdef unsigned char* temp = <unsigned char*>malloc(temp_size + (wide if vertical_first else 0) + 1)
    cdef int32_t* sums = <int32_t*>malloc(max(values, wide) * sizeof(int32_t))
    cdef unsigned char* line = <unsigned char*>malloc(values)
    # the conversion's scratch row (256 pixels at least, for _tabulate), then room for its table
    cdef Py_ssize_t row_floats = 4 * max(out_width, 256)
    cdef float* scratch = <float*>malloc((row_floats + 4 * 256) * sizeof(float))
    if temp == NULL or sums == NULL or line == NULL or scratch == NULL:
        _release(temp, sums, line, scratch)
        raise MemoryError()
    cdef Py_ssize_t strides[3]
    strides[0], strides[1], strides[2] = src.strides[0], src.strides[1], src.strides[2]
    columns._pairs_ready()
    rows._pairs_ready()
    with nogil:
        if colour is not None and out_height * out_width > PIXELS_TABLE_MIN:
            _tabulate(&plan, <pixel_out_t*>(scratch + row_floats), scratch)
        _resample_rows(&src[0, 0, 0], strides, channels, columns, rows, vertical_first, temp, sums, line, scratch,
                       &out[0, 0, 0], chw, flip, NULL if colour is None else &plan)
    _release(temp, sums, line, scratch)


cdef void _release(void* a, void* b, void* c, void* d) noexcept:
    free(a)
    free(b)
    free(c)
    free(d)


cdef void _resample_rows(const unsigned char* src, const Py_ssize_t* strides, Py_ssize_t channels, Taps columns,
                         Taps rows, bint vertical_first, unsigned char* temp, int32_t* sums, unsigned char* line,
                         float* scratch, pixel_out_t* out, bint chw, bint flip, const ColourPlan* plan) noexcept nogil:
    """The two passes, one output row at a time where the order allows, and the store."""
    cdef Py_ssize_t out_width = columns.out_size, out_height = rows.out_size
    cdef Py_ssize_t values = out_width * channels, plane = out_width * out_height, yy
    cdef Py_ssize_t out_channels = plan.out_channels if plan != NULL else channels
    cdef Py_ssize_t span = columns.last - columns.first
    cdef const unsigned char* row
    if columns.needed and not vertical_first:
        # only the rows the vertical pass reads (all of them where it does not run)
        _horizontal(src + rows.first * strides[0], strides[0], strides[1], strides[2], channels,
                    rows.last - rows.first, columns, 0, temp)
    for yy in range(out_height):
        if vertical_first:  # this row of the columns the horizontal pass reads, then that pass
            _vertical_rows_strided(src + columns.first * strides[1], strides[0], strides[1], strides[2], channels,
                                   span, rows, yy, 0, sums, temp)
            _horizontal(temp, 0, channels, 1, channels, 1, columns, columns.first, line)
            row = line
        elif rows.needed and columns.needed:
            _vertical_row(temp, values, values, rows, yy, rows.first, sums, line)
            row = line
        elif rows.needed:  # the source's own rows, read through its strides
            _vertical_rows_strided(src, strides[0], strides[1], strides[2], channels, out_width, rows, yy, 0, sums, line)
            row = line
        elif columns.needed:
            row = temp + yy * values
        else:
            _gather_row(src + yy * strides[0], strides[1], strides[2], channels, out_width, line)
            row = line
        if plan == NULL:
            if pixel_out_t is uint8_t:  # resample_into allows no other
                _copy_row(row, out + (yy * out_width if chw else yy * out_width * channels), out_width, channels, plane,
                          chw, flip)
        else:
            _convert_row(plan, row, out + (yy * out_width if chw else yy * out_width * out_channels), out_width, plane,
                         chw, flip, scratch)


cdef void _vertical_rows_strided(const unsigned char* src, Py_ssize_t row_stride, Py_ssize_t pixel_stride,
                                 Py_ssize_t channel_stride, Py_ssize_t channels, Py_ssize_t width, Taps taps,
                                 Py_ssize_t yy, Py_ssize_t shift, int32_t* sums, unsigned char* dest) noexcept nogil:
    """As :func:`_vertical_row`, reading the source image itself through its strides (``src`` is
    input row ``shift``) into ``width`` packed pixels."""
    if pixel_stride == channels and channel_stride == 1:
        _vertical_row(src, row_stride, width * channels, taps, yy, shift, sums, dest)
        return
    cdef Py_ssize_t x, c, y, ymin = taps.bounds[2 * yy] - shift, ymax = taps.bounds[2 * yy + 1]
    cdef const int32_t* k = taps.weights + yy * taps.ksize
    cdef const unsigned char* row
    for x in range(width * channels):
        sums[x] = 1 << (RESAMPLE_BITS - 1)
    for y in range(ymax):
        row = src + (ymin + y) * row_stride
        for x in range(width):
            for c in range(channels):
                sums[x * channels + c] += row[x * pixel_stride + c * channel_stride] * k[y]
    for x in range(width * channels):
        dest[x] = _clip_fixed(sums[x])
