/* Vector kernels for _resample.pxi (Pillow's 8-bit resampling, to the bit) and _pixels.pxi (linear
 * light to 8-bit sRGB codes), with SSE2.
 *
 * Pillow sums pixel * weight in int32 with weights of 22 fraction bits. SSE2 has no 32-bit
 * multiply, but _mm_madd_epi16 multiplies int16 pairs and adds each pair into an int32, so each
 * weight w is split into hi = w >> 11 (arithmetic) and lo = w & 0x7FF, both int16 for any
 * |w| < 2^26, and sum(p * w) == (sum(p * hi) << 11) + sum(p * lo) in wrapping int32 arithmetic:
 * the same int32 Pillow gets (the sums wrap identically in any order), so the same bytes. One madd
 * does two taps: the bytes of tap x and tap x + 1 are interleaved, against (hi_x, hi_x+1) repeated.
 *
 * SSE2 only (every x86-64 has it), so a wheel runs on baseline x86-64. Elsewhere HX_SIMD is 0 and
 * _resample.pxi keeps its own scalar loops; the functions below still compile there, as scalar
 * code with the same results (build with -DHX_SCALAR_KERNELS to run and test them on x86-64;
 * -DHX_NO_SIMD leaves everything to _resample.pxi's loops, as a baseline).
 */
#ifndef HYDRAX_SIMD_H
#define HYDRAX_SIMD_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if (defined(__SSE2__) || defined(_M_X64) || (defined(_M_IX86_FP) && _M_IX86_FP >= 2)) && \
    !defined(HX_SCALAR_KERNELS) && !defined(HX_NO_SIMD)
#include <emmintrin.h>
#define HX_SSE2 1
#endif

#if (defined(HX_SSE2) || defined(HX_SCALAR_KERNELS)) && !defined(HX_NO_SIMD)
#define HX_SIMD 1
#else
#define HX_SIMD 0
#endif

#define HX_BITS 22  /* RESAMPLE_BITS */
#define HX_SPLIT 11 /* hi = w >> 11 and lo = w & 0x7FF */
/* Per output pixel and pair j of its taps (2j, 2j + 1): 8 int16 (hi_2j, hi_2j+1) x 4, then
 * 8 int16 (lo_2j, lo_2j+1) x 4; 32 bytes, so each vector is 16-byte aligned in an aligned block. */
#define HX_PAIR_INT16 16

static inline int32_t hx_fixed_to_byte(uint32_t sum)
{
    int32_t v = (int32_t)sum >> HX_BITS; /* arithmetic, as Pillow's */
    return v < 0 ? 0 : (v > 255 ? 255 : v);
}

/* Fills out (npairs * HX_PAIR_INT16 int16 per output pixel) from Pillow's int32 weights (ksize per
 * output pixel, zero past each pixel's count). Returns 0, leaving the scalar loops in charge, if
 * a weight is too large for an int16 hi part (never for the weights of a real resize). */
static int hx_split_weights(const int32_t *weights, ptrdiff_t ksize, ptrdiff_t out_size, ptrdiff_t npairs,
                            int16_t *out)
{
    ptrdiff_t xx, j, t, i;
    for (xx = 0; xx < out_size; xx++) {
        for (j = 0; j < npairs; j++) {
            int16_t hi[2], lo[2];
            for (t = 0; t < 2; t++) {
                int32_t w = 2 * j + t < ksize ? weights[xx * ksize + 2 * j + t] : 0;
                if (w < -(1 << 26) || w >= (1 << 26))
                    return 0;
                hi[t] = (int16_t)(w >> HX_SPLIT);
                lo[t] = (int16_t)(w & ((1 << HX_SPLIT) - 1));
            }
            for (i = 0; i < 8; i++) {
                out[i] = hi[i & 1];
                out[8 + i] = lo[i & 1];
            }
            out += HX_PAIR_INT16;
        }
    }
    return 1;
}

/* Pillow's result for count taps from p (stride bytes apart): the same int32 sum (in unsigned
 * arithmetic, so the wrap is defined however this is compiled), rounded and clamped. */
static inline int32_t hx_scalar_taps(const uint8_t *p, ptrdiff_t stride, const int32_t *k, ptrdiff_t count)
{
    uint32_t s = 1u << (HX_BITS - 1);
    ptrdiff_t x;
    for (x = 0; x < count; x++)
        s += (uint32_t)p[x * stride] * (uint32_t)k[x];
    return hx_fixed_to_byte(s);
}

/* The same sum from the split weights of one pair (pw: HX_PAIR_INT16 int16) of one channel. */
static inline void hx_scalar_pair(const uint8_t *a, const uint8_t *b, const int16_t *pw, uint32_t *hi,
                                  uint32_t *lo)
{
    *hi += (uint32_t)((int32_t)*a * pw[0] + (int32_t)*b * pw[1]);
    *lo += (uint32_t)((int32_t)*a * pw[8] + (int32_t)*b * pw[9]);
}

static inline uint8_t hx_combine(uint32_t hi, uint32_t lo)
{
    return (uint8_t)hx_fixed_to_byte((hi << HX_SPLIT) + lo);
}

#ifdef HX_SSE2
#if defined(__GNUC__)
#define HX_INLINE static inline __attribute__((always_inline))
#else
#define HX_INLINE static inline
#endif

/* One output pixel of packed RGB: its taps from p, its split weights at pw; the int32 results
 * (R, G, B, junk), shifted but not yet clamped. */
HX_INLINE __m128i hx_hpixel_sse2(const uint8_t *p, const int16_t *pw, ptrdiff_t npairs)
{
    const __m128i zero = _mm_setzero_si128();
    __m128i hi = zero, lo = _mm_set1_epi32(1 << (HX_BITS - 1));
    ptrdiff_t j;
    for (j = 0; j < npairs; j++, p += 6, pw += HX_PAIR_INT16) {
        int32_t a, b;
        __m128i v;
        memcpy(&a, p, 4);     /* r0 g0 b0 r1 */
        memcpy(&b, p + 3, 4); /* r1 g1 b1 r2 */
        /* r0 r1 g0 g1 b0 b1 r1 r2, as int16; the last pair only feeds the dropped lane */
        v = _mm_unpacklo_epi8(_mm_unpacklo_epi8(_mm_cvtsi32_si128(a), _mm_cvtsi32_si128(b)), zero);
        hi = _mm_add_epi32(hi, _mm_madd_epi16(v, _mm_load_si128((const __m128i *)pw)));
        lo = _mm_add_epi32(lo, _mm_madd_epi16(v, _mm_load_si128((const __m128i *)(pw + 8))));
    }
    return _mm_srai_epi32(_mm_add_epi32(_mm_slli_epi32(hi, HX_SPLIT), lo), HX_BITS);
}

/* Output pixels [0, fast) of one row into d, two at a time; returns where it stopped. Stores 4
 * bytes per pixel (the 4th is the next pixel's, written next), so fast < the row's width. */
HX_INLINE ptrdiff_t hx_hrow_sse2(const uint8_t *line, const int32_t *bounds, const int16_t *pw, ptrdiff_t npairs,
                                 ptrdiff_t fast, uint8_t *d)
{
    ptrdiff_t xx = 0;
    for (; xx + 2 <= fast; xx += 2, pw += 2 * npairs * HX_PAIR_INT16) {
        __m128i s0 = hx_hpixel_sse2(line + 3 * bounds[2 * xx], pw, npairs);
        __m128i s1 = hx_hpixel_sse2(line + 3 * bounds[2 * xx + 2], pw + npairs * HX_PAIR_INT16, npairs);
        /* saturating packs: the clamp to 0..255; R0 G0 B0 x R1 G1 B1 x */
        s0 = _mm_packs_epi32(s0, s1);
        s0 = _mm_packus_epi16(s0, s0);
        {
            uint8_t both[8];
            _mm_storel_epi64((__m128i *)both, s0);
            memcpy(d + 3 * xx, both, 4);
            memcpy(d + 3 * xx + 3, both + 4, 4);
        }
    }
    if (xx < fast) {
        __m128i s0 = hx_hpixel_sse2(line + 3 * bounds[2 * xx], pw, npairs);
        int32_t rgbx = _mm_cvtsi128_si32(_mm_packus_epi16(_mm_packs_epi32(s0, s0), s0));
        memcpy(d + 3 * xx, &rgbx, 4);
        xx++;
    }
    return xx;
}
#endif

/* The horizontal pass over packed RGB rows: rows of the source (row_stride apart, the first at
 * src, whose first pixel is input pixel shift) into rows of out_size packed pixels at dest.
 * bounds/weights/ksize are Taps' own; pairs/npairs the split weights, npairs pairs per output
 * pixel (enough for the widest). last bounds the input pixels the rows hold. */
static void hx_horizontal_rgb(const uint8_t *src, ptrdiff_t row_stride, ptrdiff_t rows, const int32_t *bounds,
                              const int32_t *weights, ptrdiff_t ksize, const int16_t *pairs, ptrdiff_t npairs,
                              ptrdiff_t out_size, ptrdiff_t shift, ptrdiff_t last, uint8_t *dest)
{
    ptrdiff_t y, xx, fast = 0;
    /* The vector loop reads each of the 2 * npairs tap pixels as 4 bytes (the 4th is the next
     * pixel's red, weighed into a lane that is dropped), so pixels up to xmin + 2 * npairs - 1
     * and one byte beyond: only for output pixels with xmin + 2 * npairs < last is all of that
     * inside the row (the rows hold input pixels up to last - 1, perhaps no more). It also
     * stores 4 bytes per pixel, so never for the last one of a row. xmin never decreases along
     * the row, so the pixels that qualify are a prefix; it ends at the first that does not, and
     * from there on the scalar loop does the rest, whatever the bounds. */
    while (fast < out_size - 1 && bounds[2 * fast] + 2 * npairs < last)
        fast++;
    for (y = 0; y < rows; y++) {
        const uint8_t *line = src + y * row_stride - 3 * shift;
        uint8_t *d = dest + y * 3 * out_size;
        const int16_t *pw = pairs;
        xx = 0;
#ifdef HX_SSE2
        /* the pair count as a constant where it is small, so the compiler unrolls the taps */
        switch (npairs) {
        case 1: xx = hx_hrow_sse2(line, bounds, pw, 1, fast, d); break;
        case 2: xx = hx_hrow_sse2(line, bounds, pw, 2, fast, d); break;
        case 3: xx = hx_hrow_sse2(line, bounds, pw, 3, fast, d); break;
        case 4: xx = hx_hrow_sse2(line, bounds, pw, 4, fast, d); break;
        default: xx = hx_hrow_sse2(line, bounds, pw, npairs, fast, d); break;
        }
#else
        for (; xx < fast; xx++) {
            const uint8_t *p = line + 3 * bounds[2 * xx];
            uint32_t hi[3] = {0, 0, 0}, lo[3] = {0, 0, 0};
            ptrdiff_t j;
            int c;
            for (j = 0; j < npairs; j++, p += 6, pw += HX_PAIR_INT16)
                for (c = 0; c < 3; c++)
                    hx_scalar_pair(p + c, p + 3 + c, pw, &hi[c], &lo[c]);
            for (c = 0; c < 3; c++)
                d[3 * xx + c] = hx_combine(hi[c], lo[c] + (1u << (HX_BITS - 1)));
        }
#endif
        for (; xx < out_size; xx++) {
            const uint8_t *p = line + 3 * bounds[2 * xx];
            const int32_t *k = weights + xx * ksize;
            d[3 * xx] = (uint8_t)hx_scalar_taps(p, 3, k, bounds[2 * xx + 1]);
            d[3 * xx + 1] = (uint8_t)hx_scalar_taps(p + 1, 3, k, bounds[2 * xx + 1]);
            d[3 * xx + 2] = (uint8_t)hx_scalar_taps(p + 2, 3, k, bounds[2 * xx + 1]);
        }
    }
}

#ifdef HX_SSE2
/* 8 int16 of two rows' interleaved bytes against one pair's weights, into hi and lo. */
#define HX_MADD2(v, wh, wl, hi, lo)                         \
    do {                                                    \
        hi = _mm_add_epi32(hi, _mm_madd_epi16((v), (wh)));  \
        lo = _mm_add_epi32(lo, _mm_madd_epi16((v), (wl)));  \
    } while (0)

/* (hi << 11) + lo (lo began at the rounding half), then Pillow's arithmetic shift. */
static inline __m128i hx_finish(__m128i hi, __m128i lo)
{
    return _mm_srai_epi32(_mm_add_epi32(_mm_slli_epi32(hi, HX_SPLIT), lo), HX_BITS);
}

/* The vertical pass over values [0, values - values % 8): the rows' bytes interleaved in pairs
 * (an odd count's last pair reads its row twice, against a weight of 0); returns where it stopped. */
HX_INLINE ptrdiff_t hx_vrow_sse2(const uint8_t *first, ptrdiff_t row_stride, ptrdiff_t values, ptrdiff_t count,
                                 ptrdiff_t npairs, const int16_t *pw, uint8_t *dest)
{
    const __m128i zero = _mm_setzero_si128();
    const __m128i half = _mm_set1_epi32(1 << (HX_BITS - 1));
    ptrdiff_t i = 0, j;
    for (; i + 16 <= values; i += 16) {
        __m128i h0 = zero, h1 = zero, h2 = zero, h3 = zero, l0 = half, l1 = half, l2 = half, l3 = half;
        for (j = 0; j < npairs; j++) {
            const uint8_t *r0 = first + 2 * j * row_stride;
            const uint8_t *r1 = 2 * j + 1 < count ? r0 + row_stride : r0;
            const __m128i wh = _mm_load_si128((const __m128i *)(pw + j * HX_PAIR_INT16));
            const __m128i wl = _mm_load_si128((const __m128i *)(pw + j * HX_PAIR_INT16 + 8));
            __m128i a = _mm_loadu_si128((const __m128i *)(r0 + i));
            __m128i b = _mm_loadu_si128((const __m128i *)(r1 + i));
            __m128i ab = _mm_unpacklo_epi8(a, b);
            HX_MADD2(_mm_unpacklo_epi8(ab, zero), wh, wl, h0, l0);
            HX_MADD2(_mm_unpackhi_epi8(ab, zero), wh, wl, h1, l1);
            ab = _mm_unpackhi_epi8(a, b);
            HX_MADD2(_mm_unpacklo_epi8(ab, zero), wh, wl, h2, l2);
            HX_MADD2(_mm_unpackhi_epi8(ab, zero), wh, wl, h3, l3);
        }
        h0 = _mm_packs_epi32(hx_finish(h0, l0), hx_finish(h1, l1));
        h2 = _mm_packs_epi32(hx_finish(h2, l2), hx_finish(h3, l3));
        _mm_storeu_si128((__m128i *)(dest + i), _mm_packus_epi16(h0, h2));
    }
    if (i + 8 <= values) {
        __m128i h0 = zero, h1 = zero, l0 = half, l1 = half;
        for (j = 0; j < npairs; j++) {
            const uint8_t *r0 = first + 2 * j * row_stride;
            const uint8_t *r1 = 2 * j + 1 < count ? r0 + row_stride : r0;
            const __m128i wh = _mm_load_si128((const __m128i *)(pw + j * HX_PAIR_INT16));
            const __m128i wl = _mm_load_si128((const __m128i *)(pw + j * HX_PAIR_INT16 + 8));
            __m128i ab = _mm_unpacklo_epi8(_mm_loadl_epi64((const __m128i *)(r0 + i)),
                                           _mm_loadl_epi64((const __m128i *)(r1 + i)));
            HX_MADD2(_mm_unpacklo_epi8(ab, zero), wh, wl, h0, l0);
            HX_MADD2(_mm_unpackhi_epi8(ab, zero), wh, wl, h1, l1);
        }
        h0 = _mm_packs_epi32(hx_finish(h0, l0), hx_finish(h1, l1));
        _mm_storel_epi64((__m128i *)(dest + i), _mm_packus_epi16(h0, h0));
        i += 8;
    }
    return i;
}
#endif

/* One output row of the vertical pass: count rows of values packed bytes (row_stride apart, the
 * first at src + ymin * row_stride) weighed by k (int32) or pw (their split pairs) into dest. */
static void hx_vertical_row(const uint8_t *src, ptrdiff_t row_stride, ptrdiff_t values, ptrdiff_t ymin,
                            ptrdiff_t count, const int32_t *k, const int16_t *pw, uint8_t *dest)
{
    ptrdiff_t i = 0, y, npairs = (count + 1) / 2;
    const uint8_t *first = src + ymin * row_stride;
#ifdef HX_SSE2
    /* the pair count as a constant where it is small: the row pointers and weights stay in
     * registers across the row */
    switch (npairs) {
    case 1: i = hx_vrow_sse2(first, row_stride, values, count, 1, pw, dest); break;
    case 2: i = hx_vrow_sse2(first, row_stride, values, count, 2, pw, dest); break;
    case 3: i = hx_vrow_sse2(first, row_stride, values, count, 3, pw, dest); break;
    default: i = hx_vrow_sse2(first, row_stride, values, count, npairs, pw, dest); break;
    }
#else
    for (; i < values; i++) {
        uint32_t hi = 0, lo = 1u << (HX_BITS - 1);
        ptrdiff_t j;
        for (j = 0; j < npairs; j++) {
            const uint8_t *r0 = first + 2 * j * row_stride + i;
            hx_scalar_pair(r0, 2 * j + 1 < count ? r0 + row_stride : r0, pw + j * HX_PAIR_INT16, &hi, &lo);
        }
        dest[i] = hx_combine(hi, lo);
    }
#endif
    for (; i < values; i++) { /* the last few values, in Pillow's own arithmetic */
        uint32_t s = 1u << (HX_BITS - 1);
        for (y = 0; y < count; y++)
            s += (uint32_t)first[y * row_stride + i] * (uint32_t)k[y];
        dest[i] = (uint8_t)hx_fixed_to_byte(s);
    }
}

#ifdef HX_SSE2
/* (int32)((double)v + 0.5) for floats 0 <= v < 2^24, exactly: the conversion rounds to nearest
 * with ties to even, and a tie (v minus that is +-0.5; the difference is exact, the two being
 * that close) then goes up. Summing in double is exact too, but costs four conversions per four
 * values. Assumes the default rounding mode, which Python and numpy leave alone. */
static inline __m128i hx_round_half_up(__m128 v)
{
    __m128i nearest = _mm_cvtps_epi32(v);
    __m128 tie = _mm_cmpeq_ps(_mm_sub_ps(v, _mm_cvtepi32_ps(nearest)), _mm_set1_ps(0.5f));
    return _mm_sub_epi32(nearest, _mm_castps_si128(tie)); /* tie lanes are -1 */
}
#endif

/* The index into _pixels.pxi's table of final 8-bit sRGB codes for one linear-light value: clipped
 * to [0, 1] (NaN to 0), times steps in float, plus one half in double, truncated. */
static inline int32_t hx_code_index(float v, float steps)
{
    v = (v >= 0.0f && v <= 1.0f) ? v : (v > 1.0f ? 1.0f : 0.0f);
    return (int32_t)((double)(v * steps) + 0.5);
}

/* hx_code_index of n values, four at a time (see hx_round_half_up; max then min give NaN and
 * -0.0 the index 0 the scalar clip gives them). */
static inline void hx_code_indices(const float *values, ptrdiff_t n, float steps, int32_t *out)
{
    ptrdiff_t x = 0;
#ifdef HX_SSE2
    const __m128 zero = _mm_setzero_ps(), one = _mm_set1_ps(1.0f), scale = _mm_set1_ps(steps);
    for (; x + 4 <= n; x += 4) {
        __m128 v = _mm_mul_ps(_mm_min_ps(_mm_max_ps(_mm_loadu_ps(values + x), zero), one), scale);
        _mm_storeu_si128((__m128i *)(out + x), hx_round_half_up(v));
    }
#endif
    for (; x < n; x++)
        out[x] = hx_code_index(values[x], steps);
}

/* One row of n source pixels (channels bytes apart; red, green and blue at offsets 0, green and
 * blue) to 8-bit codes: each channel through its table to linear light (lin0..2, 256 floats),
 * the 3x3 matrix m (row-major), then clipped linear light to an index of codes (steps + 1
 * entries). The arithmetic of _convert_row's plane loops and hx_code_index value for value,
 * four pixels at a time with SSE2, but in one pass with no planes in between. Channel c of pixel
 * x goes to dc[x * step] (a negative step mirrors the row). */
static inline void hx_rgb_to_codes(const uint8_t *s, ptrdiff_t channels, ptrdiff_t green, ptrdiff_t blue, ptrdiff_t n,
                                   const float *lin0, const float *lin1, const float *lin2, const float *m,
                                   float steps, const uint8_t *codes, uint8_t *d0, uint8_t *d1, uint8_t *d2,
                                   ptrdiff_t step)
{
    ptrdiff_t x = 0;
#ifdef HX_SSE2
    const __m128 m0 = _mm_set1_ps(m[0]), m1 = _mm_set1_ps(m[1]), m2 = _mm_set1_ps(m[2]);
    const __m128 m3 = _mm_set1_ps(m[3]), m4 = _mm_set1_ps(m[4]), m5 = _mm_set1_ps(m[5]);
    const __m128 m6 = _mm_set1_ps(m[6]), m7 = _mm_set1_ps(m[7]), m8 = _mm_set1_ps(m[8]);
    const __m128 zero = _mm_setzero_ps(), one = _mm_set1_ps(1.0f), scale = _mm_set1_ps(steps);
    int32_t index[12];
    for (; x + 4 <= n; x += 4) {
        const uint8_t *p = s + x * channels;
        const ptrdiff_t c1 = channels, c2 = 2 * channels, c3 = 3 * channels;
        __m128 r = _mm_setr_ps(lin0[p[0]], lin0[p[c1]], lin0[p[c2]], lin0[p[c3]]);
        __m128 g = _mm_setr_ps(lin1[p[green]], lin1[p[c1 + green]], lin1[p[c2 + green]], lin1[p[c3 + green]]);
        __m128 b = _mm_setr_ps(lin2[p[blue]], lin2[p[c1 + blue]], lin2[p[c2 + blue]], lin2[p[c3 + blue]]);
        __m128 out[3];
        out[0] = _mm_add_ps(_mm_add_ps(_mm_mul_ps(m0, r), _mm_mul_ps(m1, g)), _mm_mul_ps(m2, b));
        out[1] = _mm_add_ps(_mm_add_ps(_mm_mul_ps(m3, r), _mm_mul_ps(m4, g)), _mm_mul_ps(m5, b));
        out[2] = _mm_add_ps(_mm_add_ps(_mm_mul_ps(m6, r), _mm_mul_ps(m7, g)), _mm_mul_ps(m8, b));
        for (int c = 0; c < 3; c++) {
            __m128 v = _mm_mul_ps(_mm_min_ps(_mm_max_ps(out[c], zero), one), scale);
            _mm_storeu_si128((__m128i *)(index + 4 * c), hx_round_half_up(v));
        }
        for (int k = 0; k < 4; k++) {
            const ptrdiff_t at = (x + k) * step;
            d0[at] = codes[index[k]];
            d1[at] = codes[index[4 + k]];
            d2[at] = codes[index[8 + k]];
        }
    }
#endif
    for (; x < n; x++) {
        const uint8_t *p = s + x * channels;
        const float r = lin0[p[0]], g = lin1[p[green]], b = lin2[p[blue]];
        float v[3];
        v[0] = m[0] * r + m[1] * g + m[2] * b;
        v[1] = m[3] * r + m[4] * g + m[5] * b;
        v[2] = m[6] * r + m[7] * g + m[8] * b;
        d0[x * step] = codes[hx_code_index(v[0], steps)];
        d1[x * step] = codes[hx_code_index(v[1], steps)];
        d2[x * step] = codes[hx_code_index(v[2], steps)];
    }
}

#endif /* HYDRAX_SIMD_H */
