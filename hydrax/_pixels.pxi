# Pixel kernels, included by _core.pyx: decoded 8-bit pixels to finished values in a batch slot,
# in one pass.
#
# convert_pixels takes each source channel through a 256-entry table to linear light (the
# profile's tone curve), the three channels through one 3x3 matrix (source colorants to the output
# space, composed in Python), then through the output encoding, a per-channel affine map (Coefs)
# and the store. A row at a time: the first stage gathers, the later ones are straight loops the
# compiler vectorises; 8-bit sRGB codes without alpha (a wide-gamut JPEG into a uint8 slot) take
# one pass of SSE2 instead, with the same arithmetic (hx_rgb_to_codes in _simd.h). It is a kernel
# because it touches every channel of every pixel of every image, and in numpy each of those
# stages would be a pass over the whole image with a temporary array of its own.

from libc.stdint cimport int32_t, uint8_t

cdef extern from "_simd.h":
    void hx_code_indices(const float* values, Py_ssize_t n, float steps, int32_t* out) nogil
    void hx_rgb_to_codes(const unsigned char* s, Py_ssize_t channels, Py_ssize_t green, Py_ssize_t blue, Py_ssize_t n,
                         const float* lin0, const float* lin1, const float* lin2, const float* m, float steps,
                         const unsigned char* codes, unsigned char* d0, unsigned char* d1, unsigned char* d2,
                         Py_ssize_t step) nogil


cdef enum:
    PIXELS_ENCODE_SRGB = 0    # clip to [0, 1], then the sRGB curve from a table
    PIXELS_ENCODE_LINEAR = 1  # clip to [0, 1]
    PIXELS_ENCODE_OKLAB = 2   # cube root, then a second matrix; no clipping (Oklab holds any gamut)

cdef enum:
    # Images of more pixels than this convert through a table where they can (see _tabulate):
    # making one costs the conversion of a 256-pixel row.
    PIXELS_TABLE_MIN = 4096

ctypedef fused pixel_out_t:
    uint8_t
    float


cdef inline float _clip01(float v) noexcept nogil:
    # Written so that NaN gives 0: a NaN that got this far must not become a table index.
    return v if 0.0 <= v <= 1.0 else (1.0 if v > 1.0 else 0.0)


cdef bint _all_finite(const float* values, Py_ssize_t count) noexcept nogil:
    cdef Py_ssize_t i
    for i in range(count):
        if not (-3.0e38 <= values[i] <= 3.0e38):  # false for NaN and both infinities
            return False
    return True


cdef inline float _cube_root(float x) noexcept nogil:
    # A bit-level first guess, then two Halley steps (cubic convergence: 5% -> 1e-4 -> 1e-12).
    cdef float sign = 1.0
    cdef float y, y3
    cdef unsigned int bits
    if x == 0.0:
        return 0.0
    if x < 0.0:
        sign = -1.0
        x = -x
    memcpy(&bits, &x, 4)
    bits = bits // 3 + 709921077
    memcpy(&y, &bits, 4)
    y3 = y * y * y
    y = y * (y3 + 2.0 * x) / (2.0 * y3 + x)
    y3 = y * y * y
    y = y * (y3 + 2.0 * x) / (2.0 * y3 + x)
    return sign * y


cdef struct ColourPlan:
    # What _convert_row needs, taken out of the tables once per call.
    const float* lin0
    const float* lin1
    const float* lin2
    float m[9]
    float n[9]
    float sc[4]
    float of[4]
    int encode
    const float* table
    Py_ssize_t intervals
    const unsigned char* codes  # NULL unless 8-bit sRGB output goes straight through byte_curve
    float code_steps
    # Whether codes can be read 3 bytes past its end (a copy the plane kernel makes for its gathers).
    bint codes_padded
    Py_ssize_t channels
    Py_ssize_t out_channels
    # Where the matrix is the identity (and the encoding not Oklab) each output channel depends on
    # one source channel only: the conversion of all 256 codes, stored like an output row, then
    # replaces the arithmetic (see _tabulate). NULL until then.
    const void* lut


cdef int _plan_colour(ColourPlan* plan, Py_ssize_t channels, Py_ssize_t out_channels, bint byte_output,
                      const float[:, ::1] lin, const float[:, ::1] matrix, int encode, const float[::1] curve,
                      const unsigned char[::1] byte_curve, const float[:, ::1] second, const float[::1] scale,
                      const float[::1] offset) except -1:
    """Check the conversion's tables and fill ``plan``; the arrays must outlive its use."""
    if not 1 <= channels <= 4 or out_channels not in (3, 4):
        raise ValueError(f"cannot convert {channels} channels into {out_channels}")
    if lin.shape[0] != 3 or lin.shape[1] != 256 or matrix.shape[0] != 3 or matrix.shape[1] != 3:
        raise ValueError("lin must be (3, 256) and matrix (3, 3)")
    if encode == PIXELS_ENCODE_SRGB and curve.shape[0] < 2:
        raise ValueError("the sRGB encoding needs a curve table")
    if encode == PIXELS_ENCODE_OKLAB and (second.shape[0] != 3 or second.shape[1] != 3):
        raise ValueError("the Oklab encoding needs a (3, 3) second matrix")
    if not 0 <= encode <= 2:
        raise ValueError(f"unknown encoding {encode}")
    if scale.shape[0] < out_channels or offset.shape[0] < out_channels:
        raise ValueError(f"scale and offset need {out_channels} entries")
    # Non-finite parameters (a damaged profile's curve) would index tables with NaN.
    if not (_all_finite(&lin[0, 0], 3 * 256) and _all_finite(&matrix[0, 0], 9)
            and (curve.shape[0] == 0 or _all_finite(&curve[0], curve.shape[0]))
            and (second.shape[0] * second.shape[1] == 0 or (second.shape[1] == 3 and _all_finite(&second[0, 0], second.shape[0] * 3)))
            and _all_finite(&scale[0], out_channels) and _all_finite(&offset[0], out_channels)):
        raise ValueError("the conversion tables hold NaN or infinite values")
    cdef Py_ssize_t k
    for k in range(9):
        plan.m[k] = matrix[k // 3, k % 3]
        plan.n[k] = second[k // 3, k % 3] if encode == PIXELS_ENCODE_OKLAB else 0.0
    for k in range(out_channels):
        plan.sc[k] = scale[k]
        plan.of[k] = offset[k]
    plan.lin0, plan.lin1, plan.lin2 = &lin[0, 0], &lin[1, 0], &lin[2, 0]
    plan.encode = encode
    plan.table = &curve[0] if curve.shape[0] > 0 else NULL
    plan.intervals = curve.shape[0] - 1
    plan.channels, plan.out_channels = channels, out_channels
    plan.lut = NULL
    # 8-bit sRGB output with no affine map: clipped linear light indexes a table of final codes.
    plan.codes = NULL
    plan.codes_padded = False
    plan.code_steps = byte_curve.shape[0] - 1
    if (byte_output and encode == PIXELS_ENCODE_SRGB and byte_curve.shape[0] > 1
            and plan.sc[0] == 255.0 and plan.sc[1] == 255.0 and plan.sc[2] == 255.0
            and plan.of[0] == 0.0 and plan.of[1] == 0.0 and plan.of[2] == 0.0):
        plan.codes = &byte_curve[0]
    return 0


cdef bint _tabulate(ColourPlan* p, pixel_out_t* table, float* row) noexcept nogil:
    """Where the conversion acts on each channel alone, convert the 256 codes (every channel of
    pixel i is i) into ``table`` (256 * out_channels values; ``row``: 1024 floats of scratch) and
    let ``_convert_row`` look values up there: the same code computes both, so the results are
    the same to the bit. False (and nothing changed) where channels mix."""
    cdef Py_ssize_t i, c
    cdef unsigned char codes[1024]
    if p.encode == PIXELS_ENCODE_OKLAB:
        return False
    for i in range(9):
        if p.m[i] != (1.0 if i % 4 == 0 else 0.0):
            return False
    for i in range(256):
        for c in range(p.channels):
            codes[i * p.channels + c] = <unsigned char>i
    _convert_row(p, codes, table, 256, 0, False, False, row)
    p.lut = table
    return True


cdef void _convert_row(const ColourPlan* p, const unsigned char* s, pixel_out_t* o, Py_ssize_t width,
                       Py_ssize_t plane, bint chw, bint flip, float* row) noexcept nogil:
    """One row of ``width`` source pixels at ``s`` into the output row at ``o`` (pixel 0 of the row;
    channel planes ``plane`` values apart with ``chw``), mirrored with ``flip``; ``row`` holds
    ``4 * width`` floats of scratch."""
    if p.lut != NULL:
        _lookup_row(p, s, <const pixel_out_t*>p.lut, o, width, plane, chw, flip)
        return
    cdef Py_ssize_t channels = p.channels
    cdef Py_ssize_t green = 1 if channels >= 3 else 0
    cdef Py_ssize_t blue = 2 if channels >= 3 else 0
    cdef Py_ssize_t alpha = 3 if channels == 4 else (1 if channels == 2 else -1)
    cdef Py_ssize_t x, c, k
    cdef float r, g, b, position, scaled, v
    cdef Py_ssize_t step = 1 if chw else p.out_channels
    cdef pixel_out_t* dest
    if pixel_out_t is uint8_t:
        if p.codes != NULL and p.out_channels == 3 and channels != 2 and channels != 4:
            # 8-bit sRGB codes, no alpha: the same arithmetic in one pass, without the planes
            if flip:
                o += (width - 1) * step
                step = -step
            hx_rgb_to_codes(s, channels, green, blue, width, p.lin0, p.lin1, p.lin2, p.m, p.code_steps, p.codes, o,
                            o + (plane if chw else 1), o + (2 * plane if chw else 2), step)
            return
    # One plane per channel: the loops between the gather and the store then run over
    # consecutive floats, which the compiler vectorises. The matrix is copied to locals, as the
    # planes could otherwise alias it. Every value sees the same operations in the same order as
    # it would pixel by pixel, so the results do not depend on the layout.
    cdef float* planes[4]
    for c in range(4):
        planes[c] = row + c * width
    cdef float* red = planes[0]
    cdef float* grn = planes[1]
    cdef float* blu = planes[2]
    cdef float m0 = p.m[0], m1 = p.m[1], m2 = p.m[2], m3 = p.m[3], m4 = p.m[4], m5 = p.m[5]
    cdef float m6 = p.m[6], m7 = p.m[7], m8 = p.m[8]
    cdef float* alp = planes[3]
    cdef float* values
    cdef const float* curve = p.table
    cdef Py_ssize_t intervals = p.intervals
    cdef const float* lin0 = p.lin0
    cdef const float* lin1 = p.lin1
    cdef const float* lin2 = p.lin2
    cdef const unsigned char* codes = p.codes
    for x in range(width):  # gather: each code through its channel's table
        red[x] = lin0[s[0]]
        grn[x] = lin1[s[green]]
        blu[x] = lin2[s[blue]]
        alp[x] = s[alpha] * (1.0 / 255.0) if alpha >= 0 else 1.0
        s += channels
    for x in range(width):  # the matrix
        r = red[x]
        g = grn[x]
        b = blu[x]
        red[x] = m0 * r + m1 * g + m2 * b
        grn[x] = m3 * r + m4 * g + m5 * b
        blu[x] = m6 * r + m7 * g + m8 * b
    if p.encode == PIXELS_ENCODE_OKLAB:
        for x in range(width):
            r = _cube_root(red[x])
            g = _cube_root(grn[x])
            b = _cube_root(blu[x])
            red[x] = p.n[0] * r + p.n[1] * g + p.n[2] * b
            grn[x] = p.n[3] * r + p.n[4] * g + p.n[5] * b
            blu[x] = p.n[6] * r + p.n[7] * g + p.n[8] * b
    elif p.codes == NULL:
        for c in range(3):
            values = planes[c]
            for x in range(width):
                values[x] = _clip01(values[x])
            if p.encode == PIXELS_ENCODE_SRGB:
                for x in range(width):
                    position = values[x] * intervals
                    k = <Py_ssize_t>position
                    values[x] = curve[k] if k >= intervals else curve[k] + (position - k) * (curve[k + 1] - curve[k])
    if flip:  # the first value goes last
        o += (width - 1) * step
        step = -step
    cdef float code_steps = p.code_steps, sc, of
    cdef int32_t* index = <int32_t*>alp  # free once alpha is stored, which it is first
    for c in range(p.out_channels - 1, -1, -1):  # store: one channel at a time, HWC or CHW
        dest = o + (c * plane if chw else c)
        values = planes[c]
        if codes != NULL and c < 3:
            # the indices four at a time (the same arithmetic as _clip01 and a scalar product),
            # then the lookups
            hx_code_indices(values, width, code_steps, index)
            for x in range(width):
                dest[x * step] = codes[index[x]]
            continue
        sc = p.sc[c]
        of = p.of[c]
        for x in range(width):
            scaled = values[x] * sc + of
            if pixel_out_t is float:
                dest[x * step] = scaled
            else:
                # NaN stores 0: a float-to-int conversion of NaN is undefined behaviour
                dest[x * step] = <unsigned char>(scaled + 0.5 if 0.0 <= scaled <= 254.5 else (255.0 if scaled > 254.5 else 0.0))


cdef void _lookup_row(const ColourPlan* p, const unsigned char* s, const pixel_out_t* table, pixel_out_t* o,
                      Py_ssize_t width, Py_ssize_t plane, bint chw, bint flip) noexcept nogil:
    """``_convert_row`` through the table ``_tabulate`` made."""
    cdef Py_ssize_t channels = p.channels, out_channels = p.out_channels, x, c
    cdef Py_ssize_t step = 1 if chw else out_channels
    cdef Py_ssize_t source[4]
    cdef const pixel_out_t* column
    cdef pixel_out_t* dest
    for c in range(out_channels):  # the source channel each output channel reads (0: any; alpha is then constant)
        source[c] = (c if channels >= 3 else 0) if c < 3 else (channels - 1 if channels in (2, 4) else 0)
    if flip:
        o += (width - 1) * step
        step = -step
    for c in range(out_channels):
        dest = o + (c * plane if chw else c)
        column = table + c
        for x in range(width):
            dest[x * step] = column[s[x * channels + source[c]] * out_channels]


def convert_pixels(const unsigned char[:, :, ::1] src, pixel_out_t[:, :, ::1] out, bint chw,
                   const float[:, ::1] lin, const float[:, ::1] matrix, int encode,
                   const float[::1] curve, const unsigned char[::1] byte_curve, const float[:, ::1] second,
                   const float[::1] scale, const float[::1] offset):
    """Convert ``src`` (H, W, 1-4 channels of uint8: L, LA, RGB or RGBA) into ``out``.

    ``out`` is (H, W, C) or, with ``chw``, (C, H, W), C-contiguous, uint8 or float32, with C = 3
    or 4 (the 4th channel is alpha, 255 where the source has none). ``lin`` (3, 256) maps each
    code to linear light per channel; ``matrix`` (3, 3) maps linear source RGB to the output
    space; ``encode`` is 0 (sRGB curve: ``curve`` holds the curve at ``len(curve) - 1`` equal
    intervals of [0, 1]), 1 (linear) or 2 (Oklab: cube root, then ``second``). Channel c is then
    stored as ``value * scale[c] + offset[c]``, rounded and saturated for uint8. Values before
    scaling are fractions (1.0 is white, or alpha 255). For uint8 sRGB output with scale 255 and
    offset 0, a non-empty ``byte_curve`` (the final code of clipped linear light at
    ``len(byte_curve) - 1`` equal intervals) replaces the curve, interpolation and rounding.
    """
    cdef Py_ssize_t height = src.shape[0], width = src.shape[1]
    cdef Py_ssize_t out_height = out.shape[1] if chw else out.shape[0]
    cdef Py_ssize_t out_width = out.shape[2] if chw else out.shape[1]
    if out_height != height or out_width != width:
        raise ValueError(f"pixels are {height}x{width} but the output is {out_height}x{out_width}")
    cdef ColourPlan plan
    _plan_colour(&plan, src.shape[2], out.shape[0] if chw else out.shape[2], pixel_out_t is uint8_t, lin, matrix,
                 encode, curve, byte_curve, second, scale, offset)
    if height == 0 or width == 0:
        return
    cdef Py_ssize_t plane = height * width
    cdef float* row = <float*>malloc(4 * max(width, 256) * sizeof(float))
    cdef pixel_out_t* table = <pixel_out_t*>malloc(256 * 4 * sizeof(pixel_out_t))
    if row == NULL or table == NULL:
        free(row)
        free(table)
        raise MemoryError()
    cdef pixel_out_t* o = &out[0, 0, 0]
    cdef Py_ssize_t y
    with nogil:
        if plane > PIXELS_TABLE_MIN:
            _tabulate(&plan, table, row)
        for y in range(height):
            _convert_row(&plan, &src[y, 0, 0], o + (y * width if chw else y * width * plan.out_channels), width, plane,
                         chw, False, row)
    free(row)
    free(table)
