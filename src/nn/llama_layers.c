/* The Llama layer kernels (dtrain/llama.h): RMSNorm, rotary embeddings,
 * SwiGLU and causal grouped-query attention. Linear and cross-entropy come
 * from layers.c. */
#include "dtrain/llama.h"
#include "kernels/kernels.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>

// ----------------------------------------------------------------------------
// RMSNorm

void dt_rmsnorm_forward(float *out, float *rstd, const float *x, const float *w, int N, int C, float eps) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        const float *r = x + (size_t)i * C;
        float *o = out + (size_t)i * C;
        float ss = 0.0f;
        for (int c = 0; c < C; c++) ss += r[c] * r[c];
        float s = 1.0f / sqrtf(ss / C + eps);
        for (int c = 0; c < C; c++) o[c] = r[c] * s * w[c];
        rstd[i] = s;
    }
}

// With n = x rstd and dn = w dout: dx = rstd (dn - n mean(dn n)).
void dt_rmsnorm_backward(float *dx, float *dw, const float *dout, const float *x, const float *w,
                         const float *rstd, int N, int C) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        const float *r = x + (size_t)i * C, *d = dout + (size_t)i * C;
        float s = rstd[i], dot = 0.0f;
        for (int c = 0; c < C; c++) dot += w[c] * d[c] * r[c] * s;
        dot /= C;
        float *o = dx + (size_t)i * C;
        for (int c = 0; c < C; c++) o[c] += s * (w[c] * d[c] - r[c] * s * dot);
    }
    for (int i = 0; i < N; i++)  // (rows in order: the same sums for any thread count)
        for (int c = 0; c < C; c++) dw[c] += dout[(size_t)i * C + c] * x[(size_t)i * C + c] * rstd[i];
}

// ----------------------------------------------------------------------------
// rotary position embedding

void dt_rope(float *x, int B, int T, int nh, int hs, float theta, int dir) {
    int half = hs / 2;
#pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++)
        for (int i = 0; i < half; i++) {
            double a = t * pow((double)theta, -2.0 * i / hs);
            float c = (float)cos(a), s = dir > 0 ? (float)sin(a) : -(float)sin(a);
            for (int b = 0; b < B; b++)
                for (int h = 0; h < nh; h++) {
                    float *p = x + ((size_t)b * T + t) * nh * hs + (size_t)h * hs + 2 * i;
                    float x0 = p[0], x1 = p[1];
                    p[0] = x0 * c - x1 * s;
                    p[1] = x0 * s + x1 * c;
                }
        }
}

// ----------------------------------------------------------------------------
// SwiGLU

static float sigmoid(float g) { return 1.0f / (1.0f + expf(-g)); }

void dt_swiglu_forward(float *h, const float *g, const float *u, size_t N) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < N; i++) h[i] = g[i] * sigmoid(g[i]) * u[i];
}

void dt_swiglu_backward(float *dg, float *du, const float *dh, const float *g, const float *u, size_t N) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < N; i++) {
        float sg = sigmoid(g[i]);
        dg[i] += dh[i] * u[i] * sg * (1.0f + g[i] * (1.0f - sg));
        du[i] += dh[i] * g[i] * sg;
    }
}

// ----------------------------------------------------------------------------
// causal grouped-query attention
//
// As dt_attention_forward (attention.c) for one (batch, head) pair, with q
// rows of stride NH hs and k, v rows of stride KV hs: S = q k^T / sqrt(hs),
// A = causal softmax(S) kept in att, y = A v. The work is spread over
// (batch, key/value head) pairs so that backward's sums into a group's dk
// and dv are one thread's, in head order (deterministic).

static void softmax_row(float *r, int t, int T) {
    float mx = -FLT_MAX, s = 0.0f;
    for (int j = 0; j <= t; j++) mx = r[j] > mx ? r[j] : mx;
    for (int j = 0; j <= t; j++) s += r[j] = expf(r[j] - mx);
    for (int j = 0; j <= t; j++) r[j] /= s;
    for (int j = t + 1; j < T; j++) r[j] = 0.0f;
}

void dt_gqa_forward(float *out, float *att, const float *q, const float *k, const float *v, int B, int T, int NH,
                    int KV, int hs) {
    int QC = NH * hs, KC = KV * hs, G = NH / KV;
    float scale = 1.0f / sqrtf((float)hs);
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++)
        for (int g = 0; g < KV; g++) {
            const float *kb = k + (size_t)b * T * KC + g * hs, *vb = v + (size_t)b * T * KC + g * hs;
            for (int h = g * G; h < (g + 1) * G; h++) {
                const float *qb = q + (size_t)b * T * QC + h * hs;
                float *A = att + ((size_t)b * NH + h) * T * T;
                dt_sgemm(0, 1, T, T, hs, scale, qb, QC, kb, KC, 0.0f, A, T);
                for (int t = 0; t < T; t++) softmax_row(A + (size_t)t * T, t, T);
                dt_sgemm(0, 0, T, hs, T, 1.0f, A, T, vb, KC, 0.0f, out + (size_t)b * T * QC + h * hs, QC);
            }
        }
}

void dt_gqa_backward(float *dq, float *dk, float *dv, float *datt, const float *dout, const float *q,
                     const float *k, const float *v, const float *att, int B, int T, int NH, int KV, int hs) {
    int QC = NH * hs, KC = KV * hs, G = NH / KV;
    float scale = 1.0f / sqrtf((float)hs);
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++)
        for (int g = 0; g < KV; g++) {
            size_t ko = (size_t)b * T * KC + g * hs;
            for (int h = g * G; h < (g + 1) * G; h++) {
                size_t qo = (size_t)b * T * QC + h * hs;
                const float *A = att + ((size_t)b * NH + h) * T * T, *dy = dout + qo;
                float *D = datt + ((size_t)b * NH + h) * T * T;
                dt_sgemm(0, 1, T, T, hs, 1.0f, dy, QC, v + ko, KC, 0.0f, D, T);   // dA = dy v^T
                dt_sgemm(1, 0, T, hs, T, 1.0f, A, T, dy, QC, 1.0f, dv + ko, KC);  // dv += A^T dy
                for (int t = 0; t < T; t++) {
                    float *d = D + (size_t)t * T;
                    const float *a = A + (size_t)t * T;
                    float s = 0.0f;
                    for (int j = 0; j <= t; j++) s += d[j] * a[j];
                    for (int j = 0; j < T; j++) d[j] = j <= t ? a[j] * (d[j] - s) * scale : 0.0f;
                }
                dt_sgemm(0, 0, T, hs, T, 1.0f, D, T, k + ko, KC, 1.0f, dq + qo, QC);  // dq += dS k
                dt_sgemm(1, 0, T, hs, T, 1.0f, D, T, q + qo, QC, 1.0f, dk + ko, KC);  // dk += dS^T q
            }
        }
}
