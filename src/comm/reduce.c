/*
 * reduce.c - the elementwise reduction kernels every backend shares.
 *
 * Determinism rule: sources are always combined in the order given (the
 * backends pass them in rank order), so the same inputs give the same bits
 * on every rank and in every run. fp16/bf16 accumulate in fp32 and round
 * to nearest even exactly once, at the end.
 *
 * The loops are written plainly so that the compiler vectorises them
 * (-O3 -march=native): one pass per source over a block that stays in L1.
 */
#include "comm/comm_impl.h"

#include <string.h>

// ----------------------------------------------------------------------------
// kernels, one per element type

#define BLOCK 1024 /* elements per L1-resident block */

#define DEFINE_REDUCE(NAME, T, DIV)                                                      \
    static void NAME(T *dst, T *dst2, const void *const *src, int nsrc, size_t n,        \
                     dt_redop op, int avg_div) {                                         \
        T acc[BLOCK];                                                                    \
        for (size_t b = 0; b < n; b += BLOCK) {                                          \
            size_t m = n - b < BLOCK ? n - b : BLOCK;                                    \
            const T *s0 = (const T *)src[0] + b;                                         \
            for (size_t i = 0; i < m; i++) acc[i] = s0[i];                               \
            for (int k = 1; k < nsrc; k++) {                                             \
                const T *s = (const T *)src[k] + b;                                      \
                switch (op) {                                                            \
                case DT_SUM:                                                             \
                case DT_AVG:                                                             \
                    for (size_t i = 0; i < m; i++) acc[i] += s[i];                       \
                    break;                                                               \
                case DT_MAX:                                                             \
                    for (size_t i = 0; i < m; i++) acc[i] = s[i] > acc[i] ? s[i] : acc[i]; \
                    break;                                                               \
                case DT_MIN:                                                             \
                    for (size_t i = 0; i < m; i++) acc[i] = s[i] < acc[i] ? s[i] : acc[i]; \
                    break;                                                               \
                }                                                                        \
            }                                                                            \
            if (op == DT_AVG) {                                                          \
                T d = (T)avg_div;                                                        \
                for (size_t i = 0; i < m; i++) acc[i] = DIV;                             \
            }                                                                            \
            memcpy(dst + b, acc, m * sizeof(T));                                         \
            if (dst2) memcpy(dst2 + b, acc, m * sizeof(T));                              \
        }                                                                                \
    }

DEFINE_REDUCE(reduce_i32, int32_t, acc[i] / d)
DEFINE_REDUCE(reduce_i64, int64_t, acc[i] / d)
DEFINE_REDUCE(reduce_u8, uint8_t, (uint8_t)(acc[i] / d))
DEFINE_REDUCE(reduce_f32_blocked, float, acc[i] / d)

/* The common case, two fp32 sources summed: one fused pass, no block copy. */
static void reduce_f32(float *dst, float *dst2, const void *const *src, int nsrc, size_t n,
                       dt_redop op, int avg_div) {
    if (nsrc == 2 && op == DT_SUM) {
        const float *a = src[0], *b = src[1];
        if (dst2) {
            for (size_t i = 0; i < n; i++) {
                float v = a[i] + b[i];
                dst[i] = v;
                dst2[i] = v;
            }
        } else {
            for (size_t i = 0; i < n; i++) dst[i] = a[i] + b[i];
        }
        return;
    }
    reduce_f32_blocked(dst, dst2, src, nsrc, n, op, avg_div);
}

static void reduce_half(void *dst, void *dst2, const void *const *src, int nsrc, size_t n,
                        dt_dtype t, dt_redop op, int avg_div) {
    float acc[BLOCK], tmp[BLOCK];
    for (size_t b = 0; b < n; b += BLOCK) {
        size_t m = n - b < BLOCK ? n - b : BLOCK;
        dt_to_f32(acc, (const uint16_t *)src[0] + b, m, t);
        for (int k = 1; k < nsrc; k++) {
            dt_to_f32(tmp, (const uint16_t *)src[k] + b, m, t);
            switch (op) {
            case DT_SUM:
            case DT_AVG:
                for (size_t i = 0; i < m; i++) acc[i] += tmp[i];
                break;
            case DT_MAX:
                for (size_t i = 0; i < m; i++) acc[i] = tmp[i] > acc[i] ? tmp[i] : acc[i];
                break;
            case DT_MIN:
                for (size_t i = 0; i < m; i++) acc[i] = tmp[i] < acc[i] ? tmp[i] : acc[i];
                break;
            }
        }
        if (op == DT_AVG)
            for (size_t i = 0; i < m; i++) acc[i] /= (float)avg_div;
        dt_from_f32((uint16_t *)dst + b, acc, m, t);
        if (dst2) memcpy((uint16_t *)dst2 + b, (uint16_t *)dst + b, m * 2);
    }
}

void dt_reduce_kernel2(void *dst, void *dst2, const void *const *src, int nsrc, size_t n,
                       dt_dtype t, dt_redop op, int avg_div) {
    if (n == 0) return;
    if (nsrc == 1 && op != DT_AVG) {
        size_t bytes = n * dt_dtype_size(t);
        if (dst != src[0]) memmove(dst, src[0], bytes);
        if (dst2 && dst2 != dst) memmove(dst2, dst, bytes);
        return;
    }
    switch (t) {
    case DT_F32: reduce_f32(dst, dst2, src, nsrc, n, op, avg_div); break;
    case DT_F16:
    case DT_BF16: reduce_half(dst, dst2, src, nsrc, n, t, op, avg_div); break;
    case DT_I32: reduce_i32(dst, dst2, src, nsrc, n, op, avg_div); break;
    case DT_I64: reduce_i64(dst, dst2, src, nsrc, n, op, avg_div); break;
    case DT_U8: reduce_u8(dst, dst2, src, nsrc, n, op, avg_div); break;
    }
}

void dt_reduce_kernel(void *dst, const void *const *src, int nsrc, size_t n, dt_dtype t,
                      dt_redop op, int avg_div) {
    dt_reduce_kernel2(dst, NULL, src, nsrc, n, t, op, avg_div);
}

void dt_avg_finish(void *buf, size_t n, dt_dtype t, int nranks) {
    if (!n) return;
    const void *src[1] = {buf};
    dt_reduce_kernel(buf, src, 1, n, t, DT_AVG, nranks);
}
