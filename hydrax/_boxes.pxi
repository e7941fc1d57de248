# Crop boxes drawn from item seeds, included by _core.pyx: random_resized_box's draws.
#
# hydrax.image.boxes decides (checks the arguments, takes the centred fallback); this computes
# the ten tries of an Inception-style random resized crop with the same operations, in the same
# order, on the same doubles as its readable twin hydrax._fallback.random_resized_draws, so the two
# give the same box for every seed (a test compares them over 10^5 draws). A kernel because every
# decoded image asks it: the Python draws cost about 6 us an image, this 0.6.

from libc.math cimport exp, isfinite, log, rint, sqrt
from libc.stdint cimport uint64_t

# 2**-53: a draw's top 53 bits to a double in [0, 1)
cdef double UNIT_53 = 1.0 / 9007199254740992.0


cdef inline uint64_t _splitmix(uint64_t seed, uint64_t stream) noexcept nogil:
    """SplitMix64's finaliser of (seed, stream), modulo 2**64 throughout (hydrax.image.boxes.mix_seed)."""
    cdef uint64_t z = seed * <uint64_t>0x9E3779B97F4A7C15ULL + stream * <uint64_t>0xBF58476D1CE4E5B9ULL \
        + <uint64_t>0x94D049BB133111EBULL
    z = (z ^ (z >> 30)) * <uint64_t>0xBF58476D1CE4E5B9ULL
    z = (z ^ (z >> 27)) * <uint64_t>0x94D049BB133111EBULL
    return z ^ (z >> 31)


cdef inline uint64_t _high_product(uint64_t a, uint64_t b) noexcept nogil:
    """The upper 64 bits of the 128-bit product a * b."""
    cdef uint64_t a_lo = a & 0xFFFFFFFFULL, a_hi = a >> 32, b_lo = b & 0xFFFFFFFFULL, b_hi = b >> 32
    cdef uint64_t low = a_lo * b_lo, cross1 = a_hi * b_lo, cross2 = a_lo * b_hi
    cdef uint64_t middle = (low >> 32) + (cross1 & 0xFFFFFFFFULL) + (cross2 & 0xFFFFFFFFULL)
    return a_hi * b_hi + (cross1 >> 32) + (cross2 >> 32) + (middle >> 32)


def random_resized_draws(uint64_t seed, uint64_t stream, int tries, long long width, long long height,
                         double low_scale, double high_scale, double low_ratio, double high_ratio):
    """The box ``(left, top, right, bottom)`` of the first of up to ``tries`` draws of area and
    aspect that fits a ``width`` x ``height`` image (1 to 2**31 - 1 a side), or None when none
    fits (the caller then takes the centred box). The draws are keyed by ``(seed, stream)``, the
    item seed modulo 2**64; the ranges are positive and finite, low <= high. Raises
    OverflowError where a side rounds to infinity, as Python's ``round`` does."""
    if not (0 < width < 2**31 and 0 < height < 2**31):
        raise ValueError(f"the image must be 1 to 2**31 - 1 pixels a side, got {width}x{height}")
    cdef uint64_t key = _splitmix(seed, stream), draw
    cdef double area = <double>(width * height)
    cdef double log_low = log(low_ratio), log_high = log(high_ratio), target, aspect, w, h
    cdef long long top, left
    for draw in range(0, 4 * <uint64_t>max(tries, 0), 4):
        target = area * (low_scale + (high_scale - low_scale) * (<double>(_splitmix(key, draw) >> 11) * UNIT_53))
        aspect = exp(log_low + (log_high - log_low) * (<double>(_splitmix(key, draw + 1) >> 11) * UNIT_53))
        w = rint(sqrt(target * aspect))  # round half to even, as Python's round
        h = rint(sqrt(target / aspect))
        if not (isfinite(w) and isfinite(h)):
            raise OverflowError("cannot convert float infinity to integer")
        if 0 < w <= width and 0 < h <= height:
            top = <long long>_high_product(_splitmix(key, draw + 2), <uint64_t>(height - <long long>h + 1))
            left = <long long>_high_product(_splitmix(key, draw + 3), <uint64_t>(width - <long long>w + 1))
            return left, top, left + <long long>w, top + <long long>h
    return None
