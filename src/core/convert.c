/* Element conversions between fp32 and the 16-bit float types (round to
 * nearest even, NaN stays NaN), used by the communication layer's fp16/bf16
 * reductions and the kernels' 16-bit copy of the weights; and the one
 * shard function (core.h). The bf16 element is core/bf16.h's, which the
 * GPU's conversions share. */
#include "core/bf16.h"
#include "core/f16.h"
#include "dtrain/core.h"

#include <stdatomic.h>
#include <string.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif


void dt_to_f32(float *dst, const void *src, size_t n, dt_dtype t) {
    const uint16_t *s = src;
    if (t == DT_BF16)
#pragma omp simd
        for (size_t i = 0; i < n; i++) dst[i] = dt_bf16_to_f32(s[i]);
    else
        for (size_t i = 0; i < n; i++) dst[i] = dt_f16_to_f32(s[i]);
}

static void bf16_from_f32(uint16_t *d, const float *s, size_t n) {
#pragma omp simd
    for (size_t i = 0; i < n; i++) d[i] = dt_f32_to_bf16(s[i]);
}

#if defined(__x86_64__)
/* dt_f32_to_bf16's arithmetic, 16 elements at a time (vpmovdw narrows, which
 * the AVX2 loop above must emulate): the same bits. Not vcvtneps2bf16,
 * which flushes subnormal inputs to zero. */
__attribute__((target("avx512f,avx512bw"))) static void bf16_from_f32_avx512(uint16_t *d, const float *s, size_t n) {
    const __m512i one = _mm512_set1_epi32(1), half = _mm512_set1_epi32(0x7fff), quiet = _mm512_set1_epi32(0x40),
                  abs = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512i u = _mm512_loadu_si512(s + i), hi = _mm512_srli_epi32(u, 16);
        __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, half), _mm512_and_si512(hi, one)), 16);
        __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, abs), inf);
        r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(hi, quiet));
        _mm256_storeu_si256((__m256i *)(d + i), _mm512_cvtepi32_epi16(r));
    }
    bf16_from_f32(d + i, s + i, n - i);
}

typedef void (*bf16_fn)(uint16_t *, const float *, size_t);
static _Atomic(bf16_fn) g_bf16;

/* The conversion for this CPU (DTRAIN_ISA's cap applies), chosen once. */
static bf16_fn bf16_for_cpu(void) {
    bf16_fn f = atomic_load_explicit(&g_bf16, memory_order_relaxed);
    if (!f) {
        f = dt_cpu_get()->isa >= DT_ISA_AVX512 ? bf16_from_f32_avx512 : bf16_from_f32;
        atomic_store_explicit(&g_bf16, f, memory_order_relaxed);
    }
    return f;
}
#else
static void (*bf16_for_cpu(void))(uint16_t *, const float *, size_t) { return bf16_from_f32; }
#endif

void dt_from_f32(void *dst, const float *src, size_t n, dt_dtype t) {
    uint16_t *d = dst;
    if (t == DT_BF16) bf16_for_cpu()(d, src, n);
    else
        for (size_t i = 0; i < n; i++) d[i] = dt_f32_to_f16(src[i]);
}

void dt_round_f32(float *dst, const float *src, size_t n, dt_dtype t) {
    if (t == DT_BF16)
#pragma omp simd
        for (size_t i = 0; i < n; i++) dst[i] = dt_bf16_to_f32(dt_f32_to_bf16(src[i]));
    else
        for (size_t i = 0; i < n; i++) dst[i] = dt_f16_to_f32(dt_f32_to_f16(src[i]));
}

void dt_from_f32_ef(void *dst, float *g, float *res, size_t n, dt_dtype t) {
    enum { PIECE = 1024 };
    float w[PIECE];
    for (size_t a = 0; a < n; a += PIECE) {
        size_t m = n - a < PIECE ? n - a : PIECE;
        for (size_t i = a; i < a + m; i++) g[i] += res[i];
        dt_from_f32((uint16_t *)dst + a, g + a, m, t);
        dt_to_f32(w, (uint16_t *)dst + a, m, t);
        for (size_t i = 0; i < m; i++) res[a + i] = g[a + i] - w[i];
    }
}

void dt_shard_range(size_t n, int rank, int world, size_t *begin, size_t *end) {
    *begin = (size_t)((unsigned __int128)n * (unsigned)rank / (unsigned)world);
    *end = (size_t)((unsigned __int128)n * (unsigned)(rank + 1) / (unsigned)world);
}
