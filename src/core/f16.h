/* fp32 <-> IEEE binary16 (fp16) for one element, round to nearest even: the
 * compiler's _Float16 where it has one, else the same bits by hand. For the
 * CPU's conversions (convert.c) and the fake NCCL of the tests. */
#ifndef DT_CORE_F16_H
#define DT_CORE_F16_H

#include <stdint.h>
#include <string.h>

#if defined(__FLT16_MAX__)
static inline float dt_f16_to_f32(uint16_t h) {
    _Float16 x;
    memcpy(&x, &h, 2);
    return (float)x;
}
static inline uint16_t dt_f32_to_f16(float f) {
    _Float16 x = (_Float16)f;
    uint16_t h;
    memcpy(&h, &x, 2);
    return h;
}
#else
/* Portable IEEE binary16 conversions for compilers without _Float16. */
static inline float dt_f16_to_f32(uint16_t h) {
    uint32_t s = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff, u;
    if (e == 0x1f) u = s | 0x7f800000u | (m << 13);
    else if (e) u = s | ((e + 112) << 23) | (m << 13);
    else if (!m) u = s;
    else {
        e = 113;
        while (!(m & 0x400)) { m <<= 1; e--; }
        u = s | (e << 23) | ((m & 0x3ff) << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline uint16_t dt_f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t s = (u >> 16) & 0x8000, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(s | 0x7e00);
    if (a >= 0x477ff000u) return (uint16_t)(s | 0x7c00); /* overflow (after rounding) */
    if (a < 0x38800000u) {                               /* subnormal or zero */
        if (a < 0x33000000u) return (uint16_t)s;
        uint32_t e = a >> 23, m = (a & 0x7fffff) | 0x800000, sh = 126 - e;
        uint32_t r = m >> sh, rem = m & ((1u << sh) - 1), half = 1u << (sh - 1);
        if (rem > half || (rem == half && (r & 1))) r++;
        return (uint16_t)(s | r);
    }
    uint32_t r = a - 0x38000000u; /* rebias exponent 127 -> 15 */
    r += 0xfffu + ((r >> 13) & 1u);
    return (uint16_t)(s | (r >> 13));
}
#endif

#endif
