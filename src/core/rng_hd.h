/* The rng's arithmetic (xoshiro256** seeded through splitmix64), shared by
 * the CPU (core.c's dt_rng_*) and the GPU's kernels, which draw the same
 * streams (dropout's masks: docs/gpu.md). */
#ifndef DT_CORE_RNG_HD_H
#define DT_CORE_RNG_HD_H

#include "core/hd.h"

#include <stdint.h>

DT_HD uint64_t dt_splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

DT_HD void dt_xoshiro_seed(uint64_t s[4], uint64_t seed) {
    for (int i = 0; i < 4; i++) s[i] = dt_splitmix64(&seed);
}

DT_HD uint64_t dt_xoshiro_rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

DT_HD uint64_t dt_xoshiro_next(uint64_t s[4]) {
    uint64_t result = dt_xoshiro_rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = dt_xoshiro_rotl(s[3], 45);
    return result;
}

/* A uniform float in [0, 1): the top 24 bits. */
DT_HD float dt_xoshiro_uniform(uint64_t s[4]) { return (float)(dt_xoshiro_next(s) >> 40) * (1.0f / 16777216.0f); }

/* The seed of dropout layer `layer`'s stream for sample `sample` at step
 * `step` (nn/model.c's masks; the GPU draws the same). */
DT_HD uint64_t dt_dropout_seed(uint64_t seed, uint64_t step, uint64_t sample, int layer) {
    return seed ^ (step * 0x9e3779b97f4a7c15ULL) ^ (sample * 0xc2b2ae3d27d4eb4fULL) ^ ((uint64_t)layer << 56);
}

#endif
