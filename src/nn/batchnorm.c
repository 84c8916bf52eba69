/* Batch normalisation's kernels (per channel over batch x H x W) and
 * global average pooling, NCHW.
 *
 * The statistics are sums over every value of a channel in the batch. Each
 * sample's part of a sum is taken in double, whole, then added in 48-bit
 * fixed point (dt_fixed48): integer addition does not depend on the order,
 * so the sums are the same bits however the batch is split over workers
 * (synchronized batch norm) or threads. */
#include "dtrain/nn.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

// A double as hi 2^-16 + lo 2^-48 with 0 <= lo <= 2^32 (q - floor(q) is
// exact in double); |x| is clamped to 1.4e11 (hi to 9e15), far above any
// sample's sum of activations, so that thousands of them add without
// overflow.
void dt_fixed48_add(int64_t acc[2], double x) {
    double q = x * 65536.0, f = floor(q);
    if (f > 9.0e15) f = 9.0e15;
    if (f < -9.0e15) f = -9.0e15;
    acc[0] += (int64_t)f;
    acc[1] += (int64_t)llrint((q - f) * 4294967296.0);
}

double dt_fixed48_value(const int64_t acc[2]) {
    return (double)acc[0] / 65536.0 + (double)acc[1] / 281474976710656.0;
}

// Per sample and channel: s[(b C + c) 2 + k] = sum over the channel's HW
// values of f_k (k = 0: x (or dy); k = 1: x^2 (or dy xhat)); then the
// fixed-point sums over the batch into acc[(k C + c) 2 + {0, 1}].
static int sums(int64_t *acc, const float *a, const float *x, const float *mean, const float *rstd, int B, int C,
                int HW) {
    double *s = malloc(sizeof(double) * 2 * (size_t)B * C);
    if (!s) return -1;
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++)
        for (int c = 0; c < C; c++) {
            const float *ap = a + ((size_t)b * C + c) * HW;
            double s0 = 0, s1 = 0;
            // (a vectorised reduction: its order is the build's, the same whatever the split of the batch)
            if (!x) {
#pragma omp simd reduction(+ : s0, s1)
                for (int i = 0; i < HW; i++) s0 += ap[i], s1 += (double)ap[i] * ap[i];
            } else {
                const float *xp = x + ((size_t)b * C + c) * HW;
                float m = mean[c], r = rstd[c];
#pragma omp simd reduction(+ : s0, s1)
                for (int i = 0; i < HW; i++) s0 += ap[i], s1 += (double)ap[i] * ((xp[i] - m) * r);
            }
            s[((size_t)b * C + c) * 2] = s0;
            s[((size_t)b * C + c) * 2 + 1] = s1;
        }
    memset(acc, 0, sizeof(int64_t) * 4 * (size_t)C);
#pragma omp parallel for schedule(static)
    for (int c = 0; c < C; c++)
        for (int b = 0; b < B; b++) {
            dt_fixed48_add(acc + 2 * (size_t)c, s[((size_t)b * C + c) * 2]);
            dt_fixed48_add(acc + 2 * ((size_t)C + c), s[((size_t)b * C + c) * 2 + 1]);
        }
    free(s);
    return 0;
}

int dt_batchnorm_stats(int64_t *acc, const float *inp, int B, int C, int HW) {
    return sums(acc, inp, NULL, NULL, NULL, B, C, HW);
}

int dt_batchnorm_dsums(int64_t *acc, const float *dout, const float *inp, const float *mean, const float *rstd, int B,
                       int C, int HW) {
    return sums(acc, dout, inp, mean, rstd, B, C, HW);
}

void dt_batchnorm_forward(float *out, const float *inp, const float *mean, const float *rstd, const float *w,
                          const float *b, int B, int C, int HW) {
#pragma omp parallel for collapse(2) schedule(static)
    for (int n = 0; n < B; n++)
        for (int c = 0; c < C; c++) {
            const float *x = inp + ((size_t)n * C + c) * HW;
            float *y = out + ((size_t)n * C + c) * HW;
            float m = mean[c], r = rstd[c], g = w[c], bb = b[c];
            for (int i = 0; i < HW; i++) y[i] = (x[i] - m) * r * g + bb;
        }
}

void dt_batchnorm_backward(float *dinp, const float *dout, const float *inp, const float *w, const float *mean,
                           const float *rstd, const double *sdy, const double *sdyx, double count, int B, int C,
                           int HW) {
#pragma omp parallel for collapse(2) schedule(static)
    for (int n = 0; n < B; n++)
        for (int c = 0; c < C; c++) {
            const float *x = inp + ((size_t)n * C + c) * HW, *dy = dout + ((size_t)n * C + c) * HW;
            float *dx = dinp + ((size_t)n * C + c) * HW;
            float m = mean[c], r = rstd[c], k = w[c] * r;
            float a = (float)(sdy[c] / count), bq = (float)(sdyx[c] / count);
            for (int i = 0; i < HW; i++) dx[i] += k * (dy[i] - a - (x[i] - m) * r * bq);
        }
}

void dt_avgpool_forward(float *out, const float *inp, int B, int C, int HW) {
#pragma omp parallel for schedule(static)
    for (size_t j = 0; j < (size_t)B * C; j++) {
        const float *x = inp + j * HW;
        float s = 0;
        for (int i = 0; i < HW; i++) s += x[i];
        out[j] = s / (float)HW;
    }
}

void dt_avgpool_backward(float *dinp, const float *dout, int B, int C, int HW) {
#pragma omp parallel for schedule(static)
    for (size_t j = 0; j < (size_t)B * C; j++) {
        float g = dout[j] / (float)HW;
        for (int i = 0; i < HW; i++) dinp[j * HW + i] += g;
    }
}
