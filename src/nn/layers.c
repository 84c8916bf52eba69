/* Layer kernels: forward/backward pairs. See dtrain/nn.h for the
 * conventions (outputs first, backward accumulates with +=). Loops over
 * samples or rows are split across OpenMP threads with a static schedule, and
 * every reduction runs in a fixed order, so results depend only on the
 * thread count. */
#include "dtrain/gpt.h"
#include "dtrain/nn.h"
#include "kernels/kernels.h"
#include "nn/nn_impl.h"
#include "nn/rows.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

// ----------------------------------------------------------------------------
// linear

// out[B,OC] = inp[B,C] @ w[OC,C]^T (+ b): the bias is written first and
// the GEMM accumulates onto it.
static void bias_rows(float *out, const float *b, int B, int OC) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < B; i++) memcpy(out + (size_t)i * OC, b, sizeof(float) * OC);
}

void dt_linear_forward(float *out, const float *inp, const float *w, const float *b, int B,
                       int C, int OC) {
    if (b) bias_rows(out, b, B, OC);
    dt_sgemm(0, 1, B, OC, C, 1.0f, inp, C, w, C, b ? 1.0f : 0.0f, out, OC);
}

void dt_linear_forward16(float *out, const void *inp16, const float *w, const float *b, int B, int C, int OC) {
    dt_dtype t = dt_kernels_precision();
    if (b) bias_rows(out, b, B, OC);
    dt_gemm16(t, 0, 1, B, OC, C, 1.0f, inp16, C, dt_kernels_operand16(1, w, OC, C, C, t), C, b ? 1.0f : 0.0f, out,
              OC);
}

// dinp += dout @ w and dw += dout^T @ inp; the input either fp32 (inp) or
// as kept in the kernels' precision (inp16). In a low precision dout is
// rounded once for both GEMMs and the weights come from their working copy
// (dt_kernels_operand16): the bits of dt_sgemm's rounding at each call.
static void linear_grads(float *dinp, float *dw, const float *dout, const float *inp, const void *inp16,
                         const float *w, int B, int C, int OC) {
    dt_dtype t = dt_kernels_precision();
    if (t == DT_F32) {
        if (dinp) dt_sgemm(0, 0, B, C, OC, 1.0f, dout, OC, w, C, 1.0f, dinp, C);  // dout @ w
        if (dw) dt_sgemm(1, 0, OC, C, B, 1.0f, dout, OC, inp, C, 1.0f, dw, C);    // dout^T @ inp
        return;
    }
    const void *d16 = dt_kernels_operand16(0, dout, B, OC, OC, t);
    if (dinp) dt_gemm16(t, 0, 0, B, C, OC, 1.0f, d16, OC, dt_kernels_operand16(1, w, OC, C, C, t), C, 1.0f, dinp, C);
    if (dw) {
        if (!inp16) inp16 = dt_kernels_operand16(2, inp, B, C, C, t);
        dt_gemm16(t, 1, 0, OC, C, B, 1.0f, d16, OC, inp16, C, 1.0f, dw, C);
    }
}

// Column sums of dout: each thread owns a block of columns and walks the
// rows in order (contiguous reads; the same sums for any thread count).
static void bias_grad(float *db, const float *dout, int B, int OC) {
#pragma omp parallel
    {
        int nt = omp_get_num_threads(), id = omp_get_thread_num();
        int lo = (int)((long)OC * id / nt), hi = (int)((long)OC * (id + 1) / nt);
        for (int i = 0; i < B; i++) {
            const float *d = dout + (size_t)i * OC;
#pragma omp simd
            for (int o = lo; o < hi; o++) db[o] += d[o];
        }
    }
}

void dt_linear_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                        const float *w, int B, int C, int OC) {
    linear_grads(dinp, dw, dout, inp, NULL, w, B, C, OC);
    if (db) bias_grad(db, dout, B, OC);
}

void dt_linear_backward16(float *dinp, float *dw, float *db, const float *dout, const void *inp16,
                          const float *w, int B, int C, int OC) {
    linear_grads(dinp, dw, dout, NULL, inp16, w, B, C, OC);
    if (db) bias_grad(db, dout, B, OC);
}

// ----------------------------------------------------------------------------
// conv2d: src/kernels/conv.c (oneDNN's direct convolutions, or the portable
// path). `col` keeps what forward saves for backward, then forward's
// scratch; `dcol` is backward's.

size_t dt_conv2d_col_size(int B, int IC, int H, int W, int OC, int K, int S, int P) {
    dt_conv_shape s = {B, IC, H, W, OC, K, S, P, 0, 0, 0, 0, 0, 0};
    size_t save, scratch;
    dt_conv_size(&s, &save, &scratch);
    return save + scratch;
}

void dt_conv2d_forward(float *out, float *col, const float *inp, const float *w, const float *b,
                       int B, int IC, int H, int W, int OC, int K, int S, int P) {
    dt_conv_shape s = {B, IC, H, W, OC, K, S, P, 0, 0, 0, 0, 0, 0};
    size_t save, scratch;
    dt_conv_size(&s, &save, &scratch);
    dt_conv_forward(out, NULL, col, col + save, inp, w, b, &s);
}

void dt_conv2d_backward(float *dinp, float *dw, float *db, float *dcol, const float *dout,
                        const float *col, const float *w, int B, int IC, int H, int W, int OC,
                        int K, int S, int P) {
    dt_conv_shape s = {B, IC, H, W, OC, K, S, P, 0, 0, 0, 0, 0, 0};
    dt_conv_backward(dinp, dw, db, dcol, NULL, dout, col, w, &s, 0);
}

// ----------------------------------------------------------------------------
// max pooling, on images [B, C, H, W, V]: V = 1 is NCHW, V = 16 a blocked
// layout (nn_impl.h) whose 16 channels of a pixel are pooled side by side.

void dt_maxpool_forward_v(float *out, int32_t *argmax, const float *inp, int B, int C, int H,
                          int W, int K, int S, int V) {
    int OH = (H - K) / S + 1, OW = (W - K) / S + 1;
#pragma omp parallel for schedule(static)
    for (int bc = 0; bc < B * C; bc++) {
        const float *x = inp + (size_t)bc * H * W * V;
        for (int oh = 0; oh < OH; oh++)
            for (int ow = 0; ow < OW; ow++) {
                size_t j = ((size_t)bc * OH * OW + oh * OW + ow) * V;
                float *o = out + j;
                int32_t *a = argmax + j;
                int first = (oh * S * W + ow * S) * V;
                if (K == 2 && S == 2) {  // the common case, a vector per window row
                    int idx[4] = {first, first + V, first + W * V, first + W * V + V};
#pragma omp simd
                    for (int v = 0; v < V; v++) {
                        float m = x[first + v];
                        int mi = first + v;
                        for (int j = 1; j < 4; j++) {
                            float xv = x[idx[j] + v];
                            if (xv > m || (isnan(xv) && !isnan(m))) m = xv, mi = idx[j] + v;
                        }
                        o[v] = m;
                        a[v] = mi;
                    }
                    continue;
                }
                for (int v = 0; v < V; v++) o[v] = x[first + v], a[v] = first + v;
                for (int kh = 0; kh < K; kh++)
                    for (int kw = 0; kw < K; kw++) {
                        int i0 = ((oh * S + kh) * W + ow * S + kw) * V;
                        // The first maximum wins; NaN propagates, as in PyTorch.
#pragma omp simd
                        for (int v = 0; v < V; v++) {
                            float xv = x[i0 + v];
                            if (xv > o[v] || (isnan(xv) && !isnan(o[v]))) o[v] = xv, a[v] = i0 + v;
                        }
                    }
            }
    }
}

void dt_maxpool_backward_v(float *dinp, const float *dout, const int32_t *argmax, int B, int C,
                           int H, int W, int K, int S, int V, int set, const float *relu_out) {
    int OH = (H - K) / S + 1, OW = (W - K) / S + 1;
    size_t n = (size_t)OH * OW * V;
    int tiles = K == S && OH * K == H && OW * K == W;  // every input in one window
#pragma omp parallel for schedule(static)
    for (int bc = 0; bc < B * C; bc++) {
        float *dx = dinp + (size_t)bc * H * W * V;
        const float *d = dout + (size_t)bc * n;
        const int32_t *a = argmax + (size_t)bc * n;
        const float *r = relu_out ? relu_out + (size_t)bc * H * W * V : NULL;
        if (tiles && set) {
            // Each input element takes the gradient of its window's maximum
            // when it is that maximum: a vector op per window element
            // instead of V scattered adds, and no clearing first.
            for (int oh = 0; oh < OH; oh++)
                for (int ow = 0; ow < OW; ow++) {
                    size_t j = ((size_t)oh * OW + ow) * V;
                    for (int kh = 0; kh < K; kh++)
                        for (int kw = 0; kw < K; kw++) {
                            int i0 = ((oh * S + kh) * W + ow * S + kw) * V;
#pragma omp simd
                            for (int v = 0; v < V; v++)
                                dx[i0 + v] = a[j + v] == i0 + v && (!r || r[i0 + v] > 0.0f)
                                                 ? d[j + v] : 0.0f;
                        }
                }
            continue;
        }
        if (set) memset(dx, 0, sizeof(float) * H * W * V);
        for (size_t j = 0; j < n; j++)
            if (!r || r[a[j]] > 0.0f) dx[a[j]] += d[j];
    }
}

void dt_maxpool_forward(float *out, int32_t *argmax, const float *inp, int B, int C, int H,
                        int W, int K, int S) {
    dt_maxpool_forward_v(out, argmax, inp, B, C, H, W, K, S, 1);
}

void dt_maxpool_backward(float *dinp, const float *dout, const int32_t *argmax, int B, int C,
                         int H, int W, int K, int S) {
    dt_maxpool_backward_v(dinp, dout, argmax, B, C, H, W, K, S, 1, 0, NULL);
}

// ----------------------------------------------------------------------------
// activations

void dt_relu_forward(float *out, const float *inp, size_t N) {
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < N; i++) out[i] = dt_relu(inp[i]);
}

void dt_relu_backward(float *dinp, const float *dout, const float *inp, size_t N) {
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < N; i++) dinp[i] += dt_relu_grad(inp[i], dout[i]);
}

void dt_relu_backward_set(float *dinp, const float *dout, const float *inp, size_t N) {
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < N; i++) dinp[i] = dt_relu_grad(inp[i], dout[i]);
}

// ----------------------------------------------------------------------------
// 16-bit activations (nn_impl.h)

void dt_keep16(void *keep, const float *x, size_t n, dt_dtype t) {
#pragma omp parallel for schedule(static) if (n > 65536)
    for (size_t i = 0; i < n; i += 4096) dt_from_f32((uint16_t *)keep + i, x + i, n - i < 4096 ? n - i : 4096, t);
}

const float *dt_widen16(float *room, const void *kept, size_t n, dt_dtype t) {
#pragma omp parallel for schedule(static) if (n > 65536)
    for (size_t i = 0; i < n; i += 4096) dt_to_f32(room + i, (const uint16_t *)kept + i, n - i < 4096 ? n - i : 4096, t);
    return room;
}

// GELU: its arithmetic is nn/rows.h's (dt_gelu, dt_gelu_grad), shared with the GPU.

void dt_gelu_forward(float *out, const float *inp, size_t N) {
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < N; i++) {
        out[i] = dt_gelu(inp[i]);
    }
}

void dt_gelu_backward(float *dinp, const float *dout, const float *inp, size_t N) {
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < N; i++) {
        dinp[i] = fmaf(dt_gelu_grad(inp[i]), dout[i], dinp[i]);
    }
}

// ----------------------------------------------------------------------------
// layernorm: each element's arithmetic and each row's closing step are
// nn/rows.h's, shared with the GPU; the sums run in order here.

void dt_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *w,
                          const float *b, int N, int C, float eps) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        const float *x = inp + (size_t)i * C;
        float m = 0.0f;
        for (int c = 0; c < C; c++) m += x[c];
        m = dt_ln_mean(m, C);
        float v = 0.0f;
        for (int c = 0; c < C; c++) v += dt_ln_sq(x[c], m);
        float s = dt_ln_rstd(v, C, eps);
        float *o = out + (size_t)i * C;
        for (int c = 0; c < C; c++) o[c] = dt_ln_out(x[c], m, s, w[c], b[c]);
        mean[i] = m;
        rstd[i] = s;
    }
}

void dt_layernorm_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                           const float *w, const float *mean, const float *rstd, int N, int C) {
    if (dinp) {
#pragma omp parallel for schedule(static)
        for (int i = 0; i < N; i++) {
            const float *x = inp + (size_t)i * C, *d = dout + (size_t)i * C;
            float m = mean[i], s = rstd[i];
            float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
            for (int c = 0; c < C; c++) {
                float norm = dt_ln_norm(x[c], m, s), dn = w[c] * d[c];
                dnorm_mean += dn;
                dnorm_norm_mean += dn * norm;
            }
            dnorm_mean = dt_ln_mean(dnorm_mean, C);
            dnorm_norm_mean = dt_ln_mean(dnorm_norm_mean, C);
            float *dx = dinp + (size_t)i * C;
            for (int c = 0; c < C; c++)
                dx[c] += dt_ln_dx(w[c] * d[c], dt_ln_norm(x[c], m, s), dnorm_mean, dnorm_norm_mean, s);
        }
    }
    // Parameter gradients: each thread owns a block of channels and walks
    // the rows in order (contiguous reads; the same sums for any thread
    // count).
    if (!dw && !db) return;
#pragma omp parallel
    {
        int nt = omp_get_num_threads(), id = omp_get_thread_num();
        int lo = (int)((long)C * id / nt), hi = (int)((long)C * (id + 1) / nt);
        for (int i = 0; i < N; i++) {
            const float *x = inp + (size_t)i * C, *d = dout + (size_t)i * C;
            float m = mean[i], s = rstd[i];
            if (dw) {
#pragma omp simd
                for (int c = lo; c < hi; c++) dw[c] += dt_ln_norm(x[c], m, s) * d[c];
            }
            if (db) {
#pragma omp simd
                for (int c = lo; c < hi; c++) db[c] += d[c];
            }
        }
    }
}

// ----------------------------------------------------------------------------
// dropout

void dt_dropout_forward(float *out, float *mask, const float *inp, size_t N, float p,
                        dt_rng *rng) {
    float keep = 1.0f / (1.0f - p);
    for (size_t i = 0; i < N; i++) mask[i] = dt_rng_uniform(rng) < p ? 0.0f : keep;
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < N; i++) out[i] = inp[i] * mask[i];
}

void dt_dropout_backward(float *dinp, const float *dout, const float *mask, size_t N) {
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < N; i++) dinp[i] = fmaf(dout[i], mask[i], dinp[i]);
}

// ----------------------------------------------------------------------------
// softmax cross-entropy: each element's and each row's arithmetic are
// nn/rows.h's, shared with the GPU; the sums run in order here.

float dt_crossentropy_forward(float *probs, const float *logits, const int32_t *targets, int B,
                              int V) {
    // Each row's loss is logsumexp(l) - l[target], kept per row and summed in
    // order afterwards so the result does not depend on the thread count.
    double *row_loss = malloc(sizeof(double) * (B > 0 ? B : 1));
    if (!row_loss) return NAN;
#pragma omp parallel for schedule(static)
    for (int i = 0; i < B; i++) row_loss[i] = dt_ce_row(probs + (size_t)i * V, logits + (size_t)i * V, V, targets[i]);
    double loss = 0.0;
    for (int i = 0; i < B; i++) loss += row_loss[i];
    free(row_loss);
    return B > 0 ? (float)(loss / B) : 0.0f;
}

void dt_ce_split_max(float *mx, const float *logits, int N, int V) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        float v = -FLT_MAX;
        for (int j = 0; j < V; j++) v = logits[(size_t)i * V + j] > v ? logits[(size_t)i * V + j] : v;
        mx[i] = v;
    }
}

void dt_ce_split_exp(float *probs, float *sums, const float *logits, const float *mx, const int32_t *targets,
                     int N, int V) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        const float *l = logits + (size_t)i * V;
        float *p = probs + (size_t)i * V;
        double s = 0;
        for (int j = 0; j < V; j++) {
            p[j] = dt_ce_exp(l[j], mx[i]);
            s += p[j];
        }
        sums[i] = (float)s;
        sums[N + i] = targets[i] >= 0 && targets[i] < V ? l[targets[i]] : 0.0f;
    }
}

float dt_ce_split_finish(float *probs, double *row_loss, const float *mx, const float *sums, int N, int V) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        float inv = 1.0f / sums[i];
        for (int j = 0; j < V; j++) probs[(size_t)i * V + j] *= inv;
        row_loss[i] = dt_ce_row_loss(mx[i], (double)sums[i], sums[N + i]);
    }
    double total = 0;
    for (int i = 0; i < N; i++) total += row_loss[i];
    return N > 0 ? (float)(total / N) : 0.0f;
}

void dt_crossentropy_backward(float *dlogits, const float *probs, const int32_t *targets, int B,
                              int V, float dloss) {
    float scale = dt_ce_scale(dloss, (float)B);
#pragma omp parallel for schedule(static)
    for (int i = 0; i < B; i++) {
        float *d = dlogits + (size_t)i * V;
        const float *p = probs + (size_t)i * V;
        for (int v = 0; v < V; v++) d[v] = dt_ce_grad(d[v], p[v], v == targets[i], scale);
    }
}
