# Pixel kernels, included by _core.pyx: decoded 8-bit pixels to finished values in a batch slot,
# in one pass.
#
# convert_pixels takes each source channel through a 256-entry table to linear light (the
# profile's tone curve), the three channels through one 3x3 matrix (source colorants to the output
# space, composed in Python), then through the output encoding, a per-channel affine map (Coefs)
# and the store. A row at a time: the first stage gathers, the later ones are straight loops the
# compiler vectorises. It is a kernel because it touches every channel of every pixel of every
# image, and in numpy each of those stages would be a pass over the whole image with a temporary
# array of its own.

from libc.stdint cimport uint8_t
from libc.stdlib cimport malloc


cdef enum:
    PIXELS_ENCODE_SRGB = 0    # clip to [0, 1], then the sRGB curve from a table
    PIXELS_ENCODE_LINEAR = 1  # clip to [0, 1]
    PIXELS_ENCODE_OKLAB = 2   # cube root, then a second matrix; no clipping (Oklab holds any gamut)

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
    cdef Py_ssize_t height = src.shape[0], width = src.shape[1], channels = src.shape[2]
    cdef Py_ssize_t out_channels = out.shape[0] if chw else out.shape[2]
    cdef Py_ssize_t out_height = out.shape[1] if chw else out.shape[0]
    cdef Py_ssize_t out_width = out.shape[2] if chw else out.shape[1]
    if out_height != height or out_width != width:
        raise ValueError(f"pixels are {height}x{width} but the output is {out_height}x{out_width}")
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
    if height == 0 or width == 0:
        return
    cdef Py_ssize_t green = 1 if channels >= 3 else 0
    cdef Py_ssize_t blue = 2 if channels >= 3 else 0
    cdef Py_ssize_t alpha = 3 if channels == 4 else (1 if channels == 2 else -1)
    cdef Py_ssize_t intervals = curve.shape[0] - 1
    cdef Py_ssize_t plane = height * width
    cdef float m[9]
    cdef float n[9]
    cdef float sc[4]
    cdef float of[4]
    cdef Py_ssize_t k, y, x, c, i
    for k in range(9):
        m[k] = matrix[k // 3, k % 3]
        n[k] = second[k // 3, k % 3] if encode == PIXELS_ENCODE_OKLAB else 0.0
    for k in range(out_channels):
        sc[k] = scale[k]
        of[k] = offset[k]
    # 8-bit sRGB output with no affine map: clipped linear light indexes a table of final codes.
    cdef bint direct = (pixel_out_t is uint8_t and encode == PIXELS_ENCODE_SRGB and byte_curve.shape[0] > 1
                        and sc[0] == 255.0 and sc[1] == 255.0 and sc[2] == 255.0
                        and of[0] == 0.0 and of[1] == 0.0 and of[2] == 0.0)
    cdef const unsigned char* codes = &byte_curve[0] if direct else NULL
    cdef float code_steps = byte_curve.shape[0] - 1
    cdef float position
    cdef const float* lin0 = &lin[0, 0]
    cdef const float* lin1 = &lin[1, 0]
    cdef const float* lin2 = &lin[2, 0]
    cdef const float* table = &curve[0] if curve.shape[0] > 0 else NULL
    cdef float* row = <float*>malloc(4 * width * sizeof(float))
    if row == NULL:
        raise MemoryError()
    cdef const unsigned char* s
    cdef pixel_out_t* o = &out[0, 0, 0]
    cdef pixel_out_t* dest
    cdef float r, g, b, a, scaled
    cdef Py_ssize_t step = 1 if chw else out_channels
    with nogil:
        for y in range(height):
            s = &src[y, 0, 0]
            for x in range(width):  # gather: tables and matrix
                r = lin0[s[0]]
                g = lin1[s[green]]
                b = lin2[s[blue]]
                row[4 * x] = m[0] * r + m[1] * g + m[2] * b
                row[4 * x + 1] = m[3] * r + m[4] * g + m[5] * b
                row[4 * x + 2] = m[6] * r + m[7] * g + m[8] * b
                row[4 * x + 3] = s[alpha] * (1.0 / 255.0) if alpha >= 0 else 1.0
                s += channels
            if encode == PIXELS_ENCODE_OKLAB:
                for x in range(width):
                    r = _cube_root(row[4 * x])
                    g = _cube_root(row[4 * x + 1])
                    b = _cube_root(row[4 * x + 2])
                    row[4 * x] = n[0] * r + n[1] * g + n[2] * b
                    row[4 * x + 1] = n[3] * r + n[4] * g + n[5] * b
                    row[4 * x + 2] = n[6] * r + n[7] * g + n[8] * b
            elif not direct:
                for i in range(4 * width):
                    if i % 4 != 3:
                        row[i] = _clip01(row[i])
                if encode == PIXELS_ENCODE_SRGB:
                    for i in range(4 * width):
                        if i % 4 != 3:
                            position = row[i] * intervals
                            k = <Py_ssize_t>position
                            row[i] = table[k] if k >= intervals else table[k] + (position - k) * (table[k + 1] - table[k])
            for c in range(out_channels):  # store: one channel at a time, HWC or CHW
                dest = o + (c * plane + y * width if chw else (y * width) * out_channels + c)
                if direct and c < 3:
                    for x in range(width):
                        dest[x * step] = codes[<Py_ssize_t>(_clip01(row[4 * x + c]) * code_steps + 0.5)]
                    continue
                for x in range(width):
                    scaled = row[4 * x + c] * sc[c] + of[c]
                    if pixel_out_t is float:
                        dest[x * step] = scaled
                    else:
                        # NaN stores 0: a float-to-int conversion of NaN is undefined behaviour
                        dest[x * step] = <unsigned char>(scaled + 0.5 if 0.0 <= scaled <= 254.5 else (255.0 if scaled > 254.5 else 0.0))
    free(row)
