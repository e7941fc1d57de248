/* Kernels for _planes.pxi: a JPEG's Y, Cb and Cr planes, each resampled on its own grid, then
 * turned into RGB at the output's size. SSE2 where there is SSE2; elsewhere (or with
 * -DHX_SCALAR_KERNELS) the scalar loops, which give the same integers.
 *
 * Fixed point throughout: weights have HX_WBITS fraction bits (int16, so one _mm_madd_epi16 does
 * two taps), resampled values HX_VBITS (int16: 0..255 is 0..16320, with room for the overshoot of
 * Lanczos and bicubic). A vertical pass takes plane bytes to values, a horizontal pass values to
 * values, and hx_ycc_row rounds once, to the final byte, after the colour conversion (JFIF's
 * YCbCr to RGB, the matrix libjpeg applies).
 */
#ifndef HYDRAX_PLANAR_H
#define HYDRAX_PLANAR_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "_simd.h" /* hx_code_index: the scalar arithmetic hx_codes_planes shares with _pixels.pxi */

#if (defined(__SSE2__) || defined(_M_X64)) && !defined(HX_SCALAR_KERNELS) && !defined(HX_NO_SIMD)
#include <emmintrin.h>
#define HX_PLANAR_SSE2 1
/* AVX2 versions too, compiled for AVX2 whatever the build's own target and chosen at run time
 * (hx_planar_init), so a wheel for baseline x86-64 uses them on the machines that have it. */
#if (defined(__GNUC__) || defined(__clang__)) && !defined(HX_NO_AVX2)
#include <immintrin.h>
#define HX_PLANAR_AVX2 1
#define HX_TARGET_AVX2 __attribute__((target("avx2")))
#endif
#endif

#define HX_WBITS 14 /* fraction bits of a weight */
#define HX_VBITS 6  /* fraction bits of a resampled value */
#define HX_KPAD 8   /* taps per output pixel of a horizontal pass: 4, or a multiple of this */
/* JFIF's YCbCr to RGB in HX_WBITS fixed point: 1.402, 0.34414, 0.71414, 1.772 */
#define HX_CR_R 22970
#define HX_CB_G 5638
#define HX_CR_G 11701
#define HX_CB_B 29032
#define HX_ONE (1 << HX_WBITS)
#define HX_CHROMA_ZERO (128 << HX_VBITS)

/* Which kernels run: 0 the scalar loops, 1 SSE2, 2 AVX2 (all give the same integers). */
static int hx_planar_level = 0;
/* Byte k of 48 packed RGB bytes is channel k % 3 of pixel k / 3: for each 16-byte third of them
 * and each channel, the byte pshufb takes from that channel's 16 (-1, which gives 0, for the
 * bytes of other channels). */
static int8_t hx_rgb_masks[3][3][16];

/* The best level this machine and build have; sets it unless asked for less (a test's choice). */
static int hx_planar_init(int most)
{
    int best = 0, third, channel, k;
    for (third = 0; third < 3; third++)
        for (channel = 0; channel < 3; channel++)
            for (k = 0; k < 16; k++)
                hx_rgb_masks[third][channel][k] =
                    (16 * third + k) % 3 == channel ? (int8_t)((16 * third + k) / 3) : (int8_t)-1;
#ifdef HX_PLANAR_SSE2
    best = 1;
#endif
#ifdef HX_PLANAR_AVX2
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2"))
        best = 2;
#endif
    hx_planar_level = most >= 0 && most < best ? most : best;
    return hx_planar_level;
}

static inline int16_t hx_sat16(int32_t v)
{
    return (int16_t)(v < -32768 ? -32768 : (v > 32767 ? 32767 : v));
}

/* Weights j and j + 1 (0 past count) as the two int16 halves of an int32, for _mm_madd_epi16. */
static inline int32_t hx_pair_weights(const int16_t *w, ptrdiff_t j, ptrdiff_t count)
{
    return (int32_t)((uint32_t)(uint16_t)w[j] | ((uint32_t)(uint16_t)(j + 1 < count ? w[j + 1] : 0) << 16));
}

static inline uint8_t hx_sat8(int32_t v)
{
    return (uint8_t)(v < 0 ? 0 : (v > 255 ? 255 : v));
}

#ifdef HX_PLANAR_AVX2
/* hx_plane_vertical's 32 values at a time; returns where it stopped. (AVX2 unpacks and packs
 * within 128-bit lanes; the pack undoes the unpack, and the last permutes put lanes in order.) */
HX_TARGET_AVX2 static ptrdiff_t hx_plane_vertical_avx2(const uint8_t *src, ptrdiff_t row_stride, ptrdiff_t n,
                                                       ptrdiff_t count, const int16_t *w, int16_t *dest)
{
    const __m256i zero = _mm256_setzero_si256();
    const __m256i half = _mm256_set1_epi32(1 << (HX_WBITS - HX_VBITS - 1));
    ptrdiff_t i = 0, j, next;
    /* the last 32 values again where n is not a multiple of 32: the same sums, stored twice */
    for (; i + 32 <= n; i = next) {
        __m256i s0 = half, s1 = half, s2 = half, s3 = half, p01, p23;
        next = i + 32 <= n - 32 || i + 32 == n ? i + 32 : n - 32;
        for (j = 0; j < count; j += 2) {
            const uint8_t *r0 = src + j * row_stride + i;
            const int two = j + 1 < count;
            const __m256i a = _mm256_loadu_si256((const __m256i *)r0);
            const __m256i b = two ? _mm256_loadu_si256((const __m256i *)(r0 + row_stride)) : zero;
            const __m256i pair = _mm256_set1_epi32(hx_pair_weights(w, j, count));
            const __m256i lo = _mm256_unpacklo_epi8(a, b), hi = _mm256_unpackhi_epi8(a, b);
            s0 = _mm256_add_epi32(s0, _mm256_madd_epi16(_mm256_unpacklo_epi8(lo, zero), pair));
            s1 = _mm256_add_epi32(s1, _mm256_madd_epi16(_mm256_unpackhi_epi8(lo, zero), pair));
            s2 = _mm256_add_epi32(s2, _mm256_madd_epi16(_mm256_unpacklo_epi8(hi, zero), pair));
            s3 = _mm256_add_epi32(s3, _mm256_madd_epi16(_mm256_unpackhi_epi8(hi, zero), pair));
        }
        p01 = _mm256_packs_epi32(_mm256_srai_epi32(s0, HX_WBITS - HX_VBITS), _mm256_srai_epi32(s1, HX_WBITS - HX_VBITS));
        p23 = _mm256_packs_epi32(_mm256_srai_epi32(s2, HX_WBITS - HX_VBITS), _mm256_srai_epi32(s3, HX_WBITS - HX_VBITS));
        _mm256_storeu_si256((__m256i *)(dest + i), _mm256_permute2x128_si256(p01, p23, 0x20));
        _mm256_storeu_si256((__m256i *)(dest + i + 16), _mm256_permute2x128_si256(p01, p23, 0x31));
    }
    return i;
}

/* hx_plane_horizontal's pixels eight at a time for kpad 4; returns where it stopped. */
HX_TARGET_AVX2 static ptrdiff_t hx_plane_horizontal4_avx2(const int16_t *src, const int32_t *bounds, ptrdiff_t shift,
                                                          const int16_t *w, ptrdiff_t out_size, int16_t *dest)
{
    const __m256i half = _mm256_set1_epi32(1 << (HX_WBITS - 1));
    const __m256i order = _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7);
    ptrdiff_t xx = 0, next;
    /* the last 8 pixels again where out_size is not a multiple of 8 (the same values twice) */
    for (; xx + 8 <= out_size; xx = next) {
        __m128i q[4];
        __m256i v0, v1, h;
        int k;
        for (k = 0; k < 4; k++)
            q[k] = _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)(src + bounds[2 * (xx + 2 * k)] - shift)),
                                      _mm_loadl_epi64((const __m128i *)(src + bounds[2 * (xx + 2 * k) + 2] - shift)));
        v0 = _mm256_inserti128_si256(_mm256_castsi128_si256(q[0]), q[1], 1);
        v1 = _mm256_inserti128_si256(_mm256_castsi128_si256(q[2]), q[3], 1);
        /* pixel sums in lane order (0 1 4 5 | 2 3 6 7), then in pixel order */
        h = _mm256_hadd_epi32(_mm256_madd_epi16(v0, _mm256_loadu_si256((const __m256i *)(w + xx * 4))),
                              _mm256_madd_epi16(v1, _mm256_loadu_si256((const __m256i *)(w + xx * 4 + 16))));
        next = xx + 8 <= out_size - 8 || xx + 8 == out_size ? xx + 8 : out_size - 8;
        h = _mm256_srai_epi32(_mm256_add_epi32(_mm256_permutevar8x32_epi32(h, order), half), HX_WBITS);
        _mm_storeu_si128((__m128i *)(dest + xx),
                         _mm_packs_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1)));
    }
    return xx;
}
#endif

/* Rows a block of the plane kernels makes at once (hx_plane_block). */
#define HX_BLOCK 16

#ifdef HX_PLANAR_AVX2
/* Sixteen rows at a time (AVX2 only): the horizontal pass reads one value of sixteen rows in one
 * load when the rows are transposed, where row by row it reads each output pixel's taps apart.
 * HX_BLOCK rows of the vertical pass are transposed (hx_transpose16), filtered across
 * (hx_plane_horizontal16_avx2) and transposed back, with the same integer sums as the row by row
 * kernels, so every level still gives the same values. */

/* The 16 x 16 block of int16 at src (rows src_stride values apart) into dest, transposed (dest's
 * row c, dest_stride values apart, holds src's column c). */
HX_TARGET_AVX2 static void hx_transpose16(const int16_t *src, ptrdiff_t src_stride, int16_t *dest, ptrdiff_t dest_stride)
{
    __m256i a[16], b[16];
    int i;
    for (i = 0; i < 16; i++)
        a[i] = _mm256_loadu_si256((const __m256i *)(src + i * src_stride));
    for (i = 0; i < 8; i++) { /* rows 2i and 2i + 1 interleaved: columns 0-3 | 8-11, then 4-7 | 12-15 */
        b[i] = _mm256_unpacklo_epi16(a[2 * i], a[2 * i + 1]);
        b[i + 8] = _mm256_unpackhi_epi16(a[2 * i], a[2 * i + 1]);
    }
    for (i = 0; i < 4; i++) { /* rows 4i..4i+3: columns 0,1 | 8,9; 2,3 | 10,11; 4,5 | 12,13; 6,7 | 14,15 */
        a[i] = _mm256_unpacklo_epi32(b[2 * i], b[2 * i + 1]);
        a[i + 4] = _mm256_unpackhi_epi32(b[2 * i], b[2 * i + 1]);
        a[i + 8] = _mm256_unpacklo_epi32(b[2 * i + 8], b[2 * i + 9]);
        a[i + 12] = _mm256_unpackhi_epi32(b[2 * i + 8], b[2 * i + 9]);
    }
    for (i = 0; i < 4; i++) { /* columns 2i, 2i + 1 (and 8 more): rows 0-7 and rows 8-15, then whole */
        const __m256i *g = a + 4 * i;
        const __m256i c0 = _mm256_unpacklo_epi64(g[0], g[1]), c1 = _mm256_unpackhi_epi64(g[0], g[1]);
        const __m256i d0 = _mm256_unpacklo_epi64(g[2], g[3]), d1 = _mm256_unpackhi_epi64(g[2], g[3]);
        _mm256_storeu_si256((__m256i *)(dest + (2 * i) * dest_stride), _mm256_permute2x128_si256(c0, d0, 0x20));
        _mm256_storeu_si256((__m256i *)(dest + (2 * i + 8) * dest_stride), _mm256_permute2x128_si256(c0, d0, 0x31));
        _mm256_storeu_si256((__m256i *)(dest + (2 * i + 1) * dest_stride), _mm256_permute2x128_si256(c1, d1, 0x20));
        _mm256_storeu_si256((__m256i *)(dest + (2 * i + 9) * dest_stride), _mm256_permute2x128_si256(c1, d1, 0x31));
    }
}

/* hx_plane_horizontal for HX_BLOCK rows at once, from their values transposed (value x of the 16
 * rows at src + 16 * x, readable up to the last pixel's bound + kpad) into dest transposed
 * (output pixel xx of the 16 rows at dest + 16 * xx). kpad is even. */
HX_TARGET_AVX2 static void hx_plane_horizontal16_avx2(const int16_t *src, const int32_t *bounds, ptrdiff_t shift,
                                                      const int16_t *w, ptrdiff_t kpad, ptrdiff_t out_size,
                                                      int16_t *dest)
{
    const __m256i half = _mm256_set1_epi32(1 << (HX_WBITS - 1));
    ptrdiff_t xx, k;
    for (xx = 0; xx < out_size; xx++) {
        const int16_t *p = src + (bounds[2 * xx] - shift) * HX_BLOCK;
        const int16_t *wx = w + xx * kpad;
        __m256i lo = half, hi = half; /* rows 0-3 | 8-11 and 4-7 | 12-15, as unpacking leaves them */
        for (k = 0; k < kpad; k += 2) {
            const __m256i v0 = _mm256_loadu_si256((const __m256i *)(p + k * HX_BLOCK));
            const __m256i v1 = _mm256_loadu_si256((const __m256i *)(p + (k + 1) * HX_BLOCK));
            int32_t pair;
            memcpy(&pair, wx + k, sizeof(pair)); /* taps k and k + 1, as pmaddwd pairs them */
            lo = _mm256_add_epi32(lo, _mm256_madd_epi16(_mm256_unpacklo_epi16(v0, v1), _mm256_set1_epi32(pair)));
            hi = _mm256_add_epi32(hi, _mm256_madd_epi16(_mm256_unpackhi_epi16(v0, v1), _mm256_set1_epi32(pair)));
        }
        _mm256_storeu_si256((__m256i *)(dest + xx * HX_BLOCK),
                            _mm256_packs_epi32(_mm256_srai_epi32(lo, HX_WBITS), _mm256_srai_epi32(hi, HX_WBITS)));
    }
}
#endif

/* One output row of the vertical pass: count rows of n bytes (row_stride apart, the first at src)
 * weighed by w (count weights) into n values. */
static void hx_plane_vertical(const uint8_t *src, ptrdiff_t row_stride, ptrdiff_t n, ptrdiff_t count,
                              const int16_t *w, int16_t *dest)
{
    const int32_t half = 1 << (HX_WBITS - HX_VBITS - 1);
    ptrdiff_t i = 0, j;
#ifdef HX_PLANAR_AVX2
    if (hx_planar_level >= 2)
        i = hx_plane_vertical_avx2(src, row_stride, n, count, w, dest);
#endif
#ifdef HX_PLANAR_SSE2
    const __m128i zero = _mm_setzero_si128();
    for (; hx_planar_level >= 1 && i + 16 <= n; i += 16) {
        __m128i s0 = _mm_set1_epi32(half), s1 = s0, s2 = s0, s3 = s0;
        for (j = 0; j < count; j += 2) {
            const uint8_t *r0 = src + j * row_stride + i;
            const int two = j + 1 < count;
            const __m128i a = _mm_loadu_si128((const __m128i *)r0);
            const __m128i b = two ? _mm_loadu_si128((const __m128i *)(r0 + row_stride)) : zero;
            const __m128i pair = _mm_set1_epi32(hx_pair_weights(w, j, count));
            const __m128i lo = _mm_unpacklo_epi8(a, b), hi = _mm_unpackhi_epi8(a, b);
            s0 = _mm_add_epi32(s0, _mm_madd_epi16(_mm_unpacklo_epi8(lo, zero), pair));
            s1 = _mm_add_epi32(s1, _mm_madd_epi16(_mm_unpackhi_epi8(lo, zero), pair));
            s2 = _mm_add_epi32(s2, _mm_madd_epi16(_mm_unpacklo_epi8(hi, zero), pair));
            s3 = _mm_add_epi32(s3, _mm_madd_epi16(_mm_unpackhi_epi8(hi, zero), pair));
        }
        s0 = _mm_packs_epi32(_mm_srai_epi32(s0, HX_WBITS - HX_VBITS), _mm_srai_epi32(s1, HX_WBITS - HX_VBITS));
        s2 = _mm_packs_epi32(_mm_srai_epi32(s2, HX_WBITS - HX_VBITS), _mm_srai_epi32(s3, HX_WBITS - HX_VBITS));
        _mm_storeu_si128((__m128i *)(dest + i), s0);
        _mm_storeu_si128((__m128i *)(dest + i + 8), s2);
    }
#endif
    for (; i < n; i++) {
        int32_t s = half;
        for (j = 0; j < count; j++)
            s += (int32_t)src[j * row_stride + i] * w[j];
        dest[i] = hx_sat16(s >> (HX_WBITS - HX_VBITS));
    }
}

#ifdef HX_PLANAR_SSE2
/* The four int32 sums of a, b, c and d, in that order. */
static inline __m128i hx_sum4(__m128i a, __m128i b, __m128i c, __m128i d)
{
    const __m128i ab = _mm_add_epi32(_mm_unpacklo_epi32(a, b), _mm_unpackhi_epi32(a, b));
    const __m128i cd = _mm_add_epi32(_mm_unpacklo_epi32(c, d), _mm_unpackhi_epi32(c, d));
    return _mm_add_epi32(_mm_unpacklo_epi64(ab, cd), _mm_unpackhi_epi64(ab, cd));
}

static inline __m128i hx_taps8(const int16_t *p, const int16_t *w, ptrdiff_t kpad)
{
    __m128i s = _mm_madd_epi16(_mm_loadu_si128((const __m128i *)p), _mm_load_si128((const __m128i *)w));
    ptrdiff_t k;
    for (k = HX_KPAD; k < kpad; k += HX_KPAD)
        s = _mm_add_epi32(s, _mm_madd_epi16(_mm_loadu_si128((const __m128i *)(p + k)),
                                            _mm_load_si128((const __m128i *)(w + k))));
    return s;
}
#endif

/* The horizontal pass over one row of values: output pixel xx reads kpad (4 or a multiple of 8) values from
 * src + bounds[2 * xx] - shift (so src must be readable that far: the caller pads the row) and
 * weighs them by w + xx * kpad (zero past the pixel's taps; 16-byte aligned). */
static void hx_plane_horizontal(const int16_t *src, const int32_t *bounds, ptrdiff_t shift, const int16_t *w,
                                ptrdiff_t kpad, ptrdiff_t out_size, int16_t *dest)
{
    const int32_t half = 1 << (HX_WBITS - 1);
    ptrdiff_t xx = 0, k;
#ifdef HX_PLANAR_AVX2
    if (hx_planar_level >= 2 && kpad == 4)
        xx = hx_plane_horizontal4_avx2(src, bounds, shift, w, out_size, dest);
#endif
#ifdef HX_PLANAR_SSE2
    if (hx_planar_level >= 1 && kpad == 4) { /* the common case (a reduction by less than 2x, or an enlargement): two pixels a madd */
        for (; xx + 4 <= out_size; xx += 4) {
            const int16_t *wx = w + xx * 4;
            const __m128i ab = _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)(src + bounds[2 * xx] - shift)),
                                                  _mm_loadl_epi64((const __m128i *)(src + bounds[2 * xx + 2] - shift)));
            const __m128i cd = _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)(src + bounds[2 * xx + 4] - shift)),
                                                  _mm_loadl_epi64((const __m128i *)(src + bounds[2 * xx + 6] - shift)));
            const __m128 p0 = _mm_castsi128_ps(_mm_madd_epi16(ab, _mm_load_si128((const __m128i *)wx)));
            const __m128 p1 = _mm_castsi128_ps(_mm_madd_epi16(cd, _mm_load_si128((const __m128i *)(wx + 8))));
            __m128i s = _mm_add_epi32(_mm_castps_si128(_mm_shuffle_ps(p0, p1, _MM_SHUFFLE(2, 0, 2, 0))),
                                      _mm_castps_si128(_mm_shuffle_ps(p0, p1, _MM_SHUFFLE(3, 1, 3, 1))));
            s = _mm_srai_epi32(_mm_add_epi32(s, _mm_set1_epi32(half)), HX_WBITS);
            _mm_storel_epi64((__m128i *)(dest + xx), _mm_packs_epi32(s, s));
        }
    }
    for (; hx_planar_level >= 1 && kpad % HX_KPAD == 0 && xx + 4 <= out_size; xx += 4) {
        const int16_t *wx = w + xx * kpad;
        __m128i s = hx_sum4(hx_taps8(src + bounds[2 * xx] - shift, wx, kpad),
                            hx_taps8(src + bounds[2 * xx + 2] - shift, wx + kpad, kpad),
                            hx_taps8(src + bounds[2 * xx + 4] - shift, wx + 2 * kpad, kpad),
                            hx_taps8(src + bounds[2 * xx + 6] - shift, wx + 3 * kpad, kpad));
        s = _mm_srai_epi32(_mm_add_epi32(s, _mm_set1_epi32(half)), HX_WBITS);
        _mm_storel_epi64((__m128i *)(dest + xx), _mm_packs_epi32(s, s));
    }
#endif
    for (; xx < out_size; xx++) {
        const int16_t *p = src + bounds[2 * xx] - shift;
        int32_t s = half;
        for (k = 0; k < kpad; k++)
            s += (int32_t)p[k] * w[xx * kpad + k];
        dest[xx] = hx_sat16(s >> HX_WBITS);
    }
}

/* Output rows y0 .. y0 + HX_BLOCK - 1 of one plane (rows past out_h - 1 repeat that one), made as
 * hx_plane_vertical and hx_plane_horizontal make them row by row, with the same values: the
 * vertical pass of each into rows (HX_BLOCK rows of n16 values, n16 = n rounded up to 16, zero
 * past n), transposed into cols (n16 + kpad columns of HX_BLOCK values, zero past n16), the
 * horizontal pass into across (out16 columns, out16 = out_w rounded up to 16, zero past out_w),
 * transposed back into dest (HX_BLOCK rows of out16 values). The vertical pass reads columns
 * first .. first + n - 1 of src, the rows' taps say which rows. Returns 0, with nothing made,
 * where the AVX2 kernels do not run (the caller goes row by row). */
static int hx_plane_block(const uint8_t *src, ptrdiff_t stride, const int32_t *row_bounds, const int16_t *row_w,
                          ptrdiff_t row_kpad, ptrdiff_t y0, ptrdiff_t out_h, ptrdiff_t first, ptrdiff_t n,
                          const int32_t *col_bounds, const int16_t *col_w, ptrdiff_t col_kpad, ptrdiff_t out_w,
                          int16_t *rows, int16_t *cols, int16_t *across, int16_t *dest)
{
#ifdef HX_PLANAR_AVX2
    const ptrdiff_t n16 = (n + 15) / 16 * 16, out16 = (out_w + 15) / 16 * 16;
    ptrdiff_t r, x;
    if (hx_planar_level < 2 || col_kpad % 2 != 0)
        return 0;
    for (r = 0; r < HX_BLOCK; r++) {
        const ptrdiff_t yy = y0 + r < out_h ? y0 + r : out_h - 1;
        hx_plane_vertical(src + row_bounds[2 * yy] * stride + first, stride, n, row_bounds[2 * yy + 1],
                          row_w + yy * row_kpad, rows + r * n16);
    }
    for (x = 0; x < n16; x += 16)
        hx_transpose16(rows + x, n16, cols + x * HX_BLOCK, HX_BLOCK);
    hx_plane_horizontal16_avx2(cols, col_bounds, first, col_w, col_kpad, out_w, across);
    for (x = 0; x < out16; x += 16)
        hx_transpose16(across + x * HX_BLOCK, HX_BLOCK, dest + x, out16);
    return 1;
#else
    (void)src; (void)stride; (void)row_bounds; (void)row_w; (void)row_kpad; (void)y0; (void)out_h; (void)first;
    (void)n; (void)col_bounds; (void)col_w; (void)col_kpad; (void)out_w; (void)rows; (void)cols; (void)across;
    (void)dest;
    return 0;
#endif
}

#ifdef HX_PLANAR_AVX2

/* hx_ycc_row 16 pixels at a time; returns where it stopped. */
HX_TARGET_AVX2 static ptrdiff_t hx_ycc_row_avx2(const int16_t *y, const int16_t *cb, const int16_t *cr, ptrdiff_t n,
                                                uint8_t *rgb, ptrdiff_t plane)
{
    const __m256i zero_chroma = _mm256_set1_epi16(HX_CHROMA_ZERO);
    const __m256i rounding = _mm256_set1_epi32(1 << (HX_WBITS + HX_VBITS - 1));
    const __m256i kr = _mm256_set1_epi32(HX_ONE | (HX_CR_R << 16));
    const __m256i kb = _mm256_set1_epi32(HX_ONE | (HX_CB_B << 16));
    const __m256i kg = _mm256_set1_epi32(HX_ONE | ((uint32_t)(uint16_t)(-HX_CB_G) << 16));
    const __m256i kg2 = _mm256_set1_epi32((uint16_t)(-HX_CR_G));
    const __m256i zero = _mm256_setzero_si256();
    __m128i masks[3][3];
    ptrdiff_t i = 0;
    int t, c;
    if (n < 16)
        return 0;
    for (t = 0; t < 3; t++)
        for (c = 0; c < 3; c++)
            masks[t][c] = _mm_loadu_si128((const __m128i *)hx_rgb_masks[t][c]);
    ptrdiff_t next;
    /* the last 16 pixels again where n is not a multiple of 16 (the same bytes twice) */
    for (; i + 16 <= n; i = next) {
        const __m256i vy = _mm256_loadu_si256((const __m256i *)(y + i));
        const __m256i vb = _mm256_sub_epi16(_mm256_loadu_si256((const __m256i *)(cb + i)), zero_chroma);
        const __m256i vr = _mm256_sub_epi16(_mm256_loadu_si256((const __m256i *)(cr + i)), zero_chroma);
        __m256i r, g, b, rg;
        __m128i channels[3];
        /* unpack and pack both work within lanes, so the 16-bit results come out in pixel order */
#define HX_FINISH8(lo, hi) \
    _mm256_packs_epi32(_mm256_srai_epi32(_mm256_add_epi32(lo, rounding), HX_WBITS + HX_VBITS), \
                       _mm256_srai_epi32(_mm256_add_epi32(hi, rounding), HX_WBITS + HX_VBITS))
        r = HX_FINISH8(_mm256_madd_epi16(_mm256_unpacklo_epi16(vy, vr), kr),
                       _mm256_madd_epi16(_mm256_unpackhi_epi16(vy, vr), kr));
        g = HX_FINISH8(_mm256_add_epi32(_mm256_madd_epi16(_mm256_unpacklo_epi16(vy, vb), kg),
                                        _mm256_madd_epi16(_mm256_unpacklo_epi16(vr, zero), kg2)),
                       _mm256_add_epi32(_mm256_madd_epi16(_mm256_unpackhi_epi16(vy, vb), kg),
                                        _mm256_madd_epi16(_mm256_unpackhi_epi16(vr, zero), kg2)));
        b = HX_FINISH8(_mm256_madd_epi16(_mm256_unpacklo_epi16(vy, vb), kb),
                       _mm256_madd_epi16(_mm256_unpackhi_epi16(vy, vb), kb));
#undef HX_FINISH8
        /* bytes: (r0-7 g0-7 | r8-15 g8-15), then the 64-bit quarters reordered to (r0-15 | g0-15) */
        rg = _mm256_permute4x64_epi64(_mm256_packus_epi16(r, g), 0xD8);
        b = _mm256_permute4x64_epi64(_mm256_packus_epi16(b, b), 0xD8);
        channels[0] = _mm256_castsi256_si128(rg);
        channels[1] = _mm256_extracti128_si256(rg, 1);
        channels[2] = _mm256_castsi256_si128(b);
        next = i + 16 <= n - 16 || i + 16 == n ? i + 16 : n - 16;
        if (plane) {
            for (t = 0; t < 3; t++)
                _mm_storeu_si128((__m128i *)(rgb + t * plane + i), channels[t]);
            continue;
        }
        for (t = 0; t < 3; t++)
            _mm_storeu_si128((__m128i *)(rgb + 3 * i + 16 * t),
                             _mm_or_si128(_mm_or_si128(_mm_shuffle_epi8(channels[0], masks[t][0]),
                                                       _mm_shuffle_epi8(channels[1], masks[t][1])),
                                          _mm_shuffle_epi8(channels[2], masks[t][2])));
    }
    return i;
}
#endif

#ifdef HX_PLANAR_AVX2
/* hx_code_index of 8 values at once: clipped to [0, 1] (NaN to 0), scaled, rounded half up. */
HX_TARGET_AVX2 static inline __m256i hx_code_index8(__m256 v, __m256 steps)
{
    __m256i nearest;
    v = _mm256_mul_ps(_mm256_min_ps(_mm256_max_ps(v, _mm256_setzero_ps()), _mm256_set1_ps(1.0f)), steps);
    nearest = _mm256_cvtps_epi32(v); /* to even on a tie; a tie then goes up */
    return _mm256_sub_epi32(nearest, _mm256_castps_si256(_mm256_cmp_ps(_mm256_sub_ps(v, _mm256_cvtepi32_ps(nearest)),
                                                                       _mm256_set1_ps(0.5f), _CMP_EQ_OQ)));
}

/* hx_rgb_to_codes (_simd.h) from R, G and B in rows of their own, eight pixels at a time; returns
 * where it stopped. The same arithmetic in the same order, so the same codes. */
HX_TARGET_AVX2 static ptrdiff_t hx_codes_planes_avx2(const uint8_t *r, const uint8_t *g, const uint8_t *b, ptrdiff_t n,
                                                     const float *lin0, const float *lin1, const float *lin2,
                                                     const float *m, float steps, const uint8_t *codes, int padded,
                                                     uint8_t *d0, uint8_t *d1, uint8_t *d2, ptrdiff_t step)
{
    const __m256 m0 = _mm256_set1_ps(m[0]), m1 = _mm256_set1_ps(m[1]), m2 = _mm256_set1_ps(m[2]);
    const __m256 m3 = _mm256_set1_ps(m[3]), m4 = _mm256_set1_ps(m[4]), m5 = _mm256_set1_ps(m[5]);
    const __m256 m6 = _mm256_set1_ps(m[6]), m7 = _mm256_set1_ps(m[7]), m8 = _mm256_set1_ps(m[8]);
    const __m256 scale = _mm256_set1_ps(steps);
    const __m256i low = _mm256_set1_epi32(0xFF);
    /* per lane: R R R R G G G G B B B B 0 0 0 0 (four pixels) to R G B R G B ... */
    const __m256i packed = _mm256_setr_epi8(0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11, -1, -1, -1, -1,
                                            0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11, -1, -1, -1, -1);
    const __m256i planes = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    int32_t index[24];
    ptrdiff_t x = 0;
    int k;
    if (padded) { /* the codes gathered too, four bytes at each index (the table is padded), and stored whole */
        for (; x + 8 <= n && (step == 1 || (step == 3 && x + 10 <= n)); x += 8) {
            const __m256 vr = _mm256_i32gather_ps(lin0, _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(r + x))), 4);
            const __m256 vg = _mm256_i32gather_ps(lin1, _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(g + x))), 4);
            const __m256 vb = _mm256_i32gather_ps(lin2, _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(b + x))), 4);
            const __m256i cr = _mm256_and_si256(low, _mm256_i32gather_epi32((const int *)codes, hx_code_index8(
                _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(m0, vr), _mm256_mul_ps(m1, vg)), _mm256_mul_ps(m2, vb)), scale), 1));
            const __m256i cg = _mm256_and_si256(low, _mm256_i32gather_epi32((const int *)codes, hx_code_index8(
                _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(m3, vr), _mm256_mul_ps(m4, vg)), _mm256_mul_ps(m5, vb)), scale), 1));
            const __m256i cb = _mm256_and_si256(low, _mm256_i32gather_epi32((const int *)codes, hx_code_index8(
                _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(m6, vr), _mm256_mul_ps(m7, vg)), _mm256_mul_ps(m8, vb)), scale), 1));
            /* per lane (pixels 0-3 | 4-7): R R R R G G G G B B B B 0 0 0 0 */
            const __m256i bytes = _mm256_packus_epi16(_mm256_packus_epi32(cr, cg),
                                                      _mm256_packus_epi32(cb, _mm256_setzero_si256()));
            if (step == 3) { /* 12 bytes a lane, stored 16 at a time: the 4 over are the next pixels' */
                const __m256i rgb = _mm256_shuffle_epi8(bytes, packed);
                _mm_storeu_si128((__m128i *)(d0 + 3 * x), _mm256_castsi256_si128(rgb));
                _mm_storeu_si128((__m128i *)(d0 + 3 * x + 12), _mm256_extracti128_si256(rgb, 1));
            } else { /* R0-7 G0-7 B0-7 */
                const __m256i rows = _mm256_permutevar8x32_epi32(bytes, planes);
                _mm_storel_epi64((__m128i *)(d0 + x), _mm256_castsi256_si128(rows));
                _mm_storel_epi64((__m128i *)(d1 + x), _mm_srli_si128(_mm256_castsi256_si128(rows), 8));
                _mm_storel_epi64((__m128i *)(d2 + x), _mm256_extracti128_si256(rows, 1));
            }
        }
        return x;
    }
    for (; x + 8 <= n; x += 8) {
        const __m256 vr = _mm256_i32gather_ps(lin0, _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(r + x))), 4);
        const __m256 vg = _mm256_i32gather_ps(lin1, _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(g + x))), 4);
        const __m256 vb = _mm256_i32gather_ps(lin2, _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(b + x))), 4);
        _mm256_storeu_si256((__m256i *)index, hx_code_index8(
            _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(m0, vr), _mm256_mul_ps(m1, vg)), _mm256_mul_ps(m2, vb)), scale));
        _mm256_storeu_si256((__m256i *)(index + 8), hx_code_index8(
            _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(m3, vr), _mm256_mul_ps(m4, vg)), _mm256_mul_ps(m5, vb)), scale));
        _mm256_storeu_si256((__m256i *)(index + 16), hx_code_index8(
            _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(m6, vr), _mm256_mul_ps(m7, vg)), _mm256_mul_ps(m8, vb)), scale));
        for (k = 0; k < 8; k++) {
            const ptrdiff_t at = (x + k) * step;
            d0[at] = codes[index[k]];
            d1[at] = codes[index[8 + k]];
            d2[at] = codes[index[16 + k]];
        }
    }
    return x;
}
#endif

#ifdef HX_PLANAR_AVX2
/* hx_lookup_floats eight values at a time; returns where it stopped. */
HX_TARGET_AVX2 static ptrdiff_t hx_lookup_floats_avx2(const uint8_t *codes, ptrdiff_t n, const float *table,
                                                      ptrdiff_t stride, float *dest)
{
    const __m256i across = _mm256_set1_epi32((int32_t)stride);
    ptrdiff_t x = 0;
    for (; x + 8 <= n; x += 8) {
        const __m256i at = _mm256_mullo_epi32(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(codes + x))), across);
        _mm256_storeu_ps(dest + x, _mm256_i32gather_ps(table, at, 4));
    }
    return x;
}
#endif

/* dest[x] = table[codes[x] * stride] for n values: a channel's row of a tabulated conversion. */
static void hx_lookup_floats(const uint8_t *codes, ptrdiff_t n, const float *table, ptrdiff_t stride, float *dest)
{
    ptrdiff_t x = 0;
#ifdef HX_PLANAR_AVX2
    if (hx_planar_level >= 2)
        x = hx_lookup_floats_avx2(codes, n, table, stride, dest);
#endif
    for (; x < n; x++)
        dest[x] = table[codes[x] * stride];
}

/* hx_rgb_to_codes from R, G and B rows: what the plane path uses where AVX2 gathers help; the
 * scalar arithmetic past them (and everywhere without AVX2). With padded, codes can be read 3
 * bytes past its end, and the output is packed RGB (step 3, d1 = d0 + 1, d2 = d0 + 2) or rows
 * (step 1). */
static void hx_codes_planes(const uint8_t *r, const uint8_t *g, const uint8_t *b, ptrdiff_t n, const float *lin0,
                            const float *lin1, const float *lin2, const float *m, float steps, const uint8_t *codes,
                            int padded, uint8_t *d0, uint8_t *d1, uint8_t *d2, ptrdiff_t step)
{
    ptrdiff_t x = 0;
#ifdef HX_PLANAR_AVX2
    if (hx_planar_level >= 2)
        x = hx_codes_planes_avx2(r, g, b, n, lin0, lin1, lin2, m, steps, codes, padded, d0, d1, d2, step);
#endif
    for (; x < n; x++) {
        const float vr = lin0[r[x]], vg = lin1[g[x]], vb = lin2[b[x]];
        d0[x * step] = codes[hx_code_index(m[0] * vr + m[1] * vg + m[2] * vb, steps)];
        d1[x * step] = codes[hx_code_index(m[3] * vr + m[4] * vg + m[5] * vb, steps)];
        d2[x * step] = codes[hx_code_index(m[6] * vr + m[7] * vg + m[8] * vb, steps)];
    }
}

/* n pixels of resampled Y, Cb and Cr values to 8-bit RGB: packed (plane 0; rgb has room for
 * 3 * n + 1 bytes), or as three rows plane bytes apart (plane >= n). */
static void hx_ycc_row(const int16_t *y, const int16_t *cb, const int16_t *cr, ptrdiff_t n, uint8_t *rgb,
                       ptrdiff_t plane)
{
    const int32_t half = 1 << (HX_WBITS + HX_VBITS - 1);
    const ptrdiff_t step = plane ? 1 : 3, second = plane ? plane : 1;
    ptrdiff_t i = 0;
#ifdef HX_PLANAR_AVX2
    if (hx_planar_level >= 2)
        i = hx_ycc_row_avx2(y, cb, cr, n, rgb, plane);
#endif
#ifdef HX_PLANAR_SSE2
    const __m128i zero_chroma = _mm_set1_epi16(HX_CHROMA_ZERO);
    const __m128i rounding = _mm_set1_epi32(half);
    const __m128i kr = _mm_set1_epi32(HX_ONE | (HX_CR_R << 16));
    const __m128i kb = _mm_set1_epi32(HX_ONE | (HX_CB_B << 16));
    const __m128i kg = _mm_set1_epi32(HX_ONE | ((uint32_t)(uint16_t)(-HX_CB_G) << 16));
    const __m128i kg2 = _mm_set1_epi32((uint16_t)(-HX_CR_G));
    const __m128i zero = _mm_setzero_si128();
    for (; hx_planar_level >= 1 && i + 8 <= n; i += 8) {
        const __m128i vy = _mm_loadu_si128((const __m128i *)(y + i));
        const __m128i vb = _mm_sub_epi16(_mm_loadu_si128((const __m128i *)(cb + i)), zero_chroma);
        const __m128i vr = _mm_sub_epi16(_mm_loadu_si128((const __m128i *)(cr + i)), zero_chroma);
        __m128i out[3], rg, bz, quad;
        int k;
#define HX_FINISH(lo, hi) \
    _mm_packus_epi16(_mm_packs_epi32(_mm_srai_epi32(_mm_add_epi32(lo, rounding), HX_WBITS + HX_VBITS), \
                                     _mm_srai_epi32(_mm_add_epi32(hi, rounding), HX_WBITS + HX_VBITS)), zero)
        out[0] = HX_FINISH(_mm_madd_epi16(_mm_unpacklo_epi16(vy, vr), kr), _mm_madd_epi16(_mm_unpackhi_epi16(vy, vr), kr));
        out[1] = HX_FINISH(_mm_add_epi32(_mm_madd_epi16(_mm_unpacklo_epi16(vy, vb), kg),
                                         _mm_madd_epi16(_mm_unpacklo_epi16(vr, zero), kg2)),
                           _mm_add_epi32(_mm_madd_epi16(_mm_unpackhi_epi16(vy, vb), kg),
                                         _mm_madd_epi16(_mm_unpackhi_epi16(vr, zero), kg2)));
        out[2] = HX_FINISH(_mm_madd_epi16(_mm_unpacklo_epi16(vy, vb), kb), _mm_madd_epi16(_mm_unpackhi_epi16(vy, vb), kb));
#undef HX_FINISH
        if (plane) {
            for (k = 0; k < 3; k++)
                _mm_storel_epi64((__m128i *)(rgb + k * plane + i), out[k]);
            continue;
        }
        /* R G B 0 per pixel, stored 4 bytes at a time 3 apart: each store's 0 is overwritten by the
         * next pixel's red (the row has a byte to spare after its last pixel) */
        rg = _mm_unpacklo_epi8(out[0], out[1]);
        bz = _mm_unpacklo_epi8(out[2], zero);
        for (k = 0; k < 8; k++) {
            int32_t pixel;
            quad = k < 4 ? _mm_unpacklo_epi16(rg, bz) : _mm_unpackhi_epi16(rg, bz);
            switch (k & 3) {
            case 0: pixel = _mm_cvtsi128_si32(quad); break;
            case 1: pixel = _mm_cvtsi128_si32(_mm_srli_si128(quad, 4)); break;
            case 2: pixel = _mm_cvtsi128_si32(_mm_srli_si128(quad, 8)); break;
            default: pixel = _mm_cvtsi128_si32(_mm_srli_si128(quad, 12)); break;
            }
            memcpy(rgb + 3 * (i + k), &pixel, 4);
        }
    }
#endif
    for (; i < n; i++) {
        const int32_t vy = (int32_t)y[i] * HX_ONE + half;
        const int32_t vb = (int16_t)(cb[i] - HX_CHROMA_ZERO), vr = (int16_t)(cr[i] - HX_CHROMA_ZERO);
        rgb[step * i] = hx_sat8((vy + vr * HX_CR_R) >> (HX_WBITS + HX_VBITS));
        rgb[step * i + second] = hx_sat8((vy - vb * HX_CB_G - vr * HX_CR_G) >> (HX_WBITS + HX_VBITS));
        rgb[step * i + 2 * second] = hx_sat8((vy + vb * HX_CB_B) >> (HX_WBITS + HX_VBITS));
    }
}

#endif
