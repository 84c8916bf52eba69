/* fp32 <-> bf16 for one element, one definition for the CPU's conversions
 * (convert.c) and the GPU's (gpu/convert.cu): DT_HD (core/hd.h). Round to
 * nearest even; a NaN stays a NaN, made quiet, its sign and upper payload
 * kept. Branch-free, so that the CPU's loops vectorise (the mixed-precision
 * GEMMs convert every operand). */
#ifndef DT_CORE_BF16_H
#define DT_CORE_BF16_H

#include "core/hd.h"

#include <stdint.h>
#include <string.h>

DT_HD float dt_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

DT_HD uint16_t dt_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16, q = (u >> 16) | 0x40; /* q: quiet NaN */
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? q : r);
}

#endif
