/* The GPT's layers on the GPU: layernorm, GELU, softmax cross-entropy,
 * ReLU and the bias, each element's arithmetic nn/rows.h's (the CPU's).
 * A row a block of DT_THREADS (the cross-entropy's long rows) or a warp
 * (layernorm's), a row's sums reduced in a fixed tree or butterfly (the
 * same result every run), 64-bit indices everywhere (rows x
 * columns may pass 2^31); launch configurations from launch.h, the block's
 * sums block.h's. tests/test_gpu.c's `ops` compares each with the CPU's;
 * tests/gpu/test_gpu_emu.c runs them on CPU threads. */
#ifdef DT_CUDA_EMU
#include "cuda_emu.h"  // (tests/gpu: these kernels on CPU threads, test_gpu_emu)
#else
#include "gpu/cuda_check.h"
#endif
#include "gpu/block.h"
#include "gpu/gpu.h"
#include "gpu/launch.h"
#include "nn/rows.h"

#include <float.h>

// ---- layernorm

// A warp a row (rows of a few hundred columns: a block's barriers would
// cost more than the row's arithmetic), lane l its columns l, l + 32, ...,
// the sums by butterflies over the lanes (warp_all: the same bits on every
// lane, every run); RES: the row's input made first, res = a + b (the
// residual add's bits; res may be a or b), its sum taken on the way, the
// rest read back from res (each lane its own columns, the ones it wrote),
// so the two kernels' bits in one pass over the row. H 1 or 2: the output
// rounded to bf16 or fp16 into out16 (block.h's narrow) instead of out.
template <bool RES, int H>
__global__ static void __launch_bounds__(DT_THREADS)
    ln_forward_kernel(float *out, uint16_t *out16, float *mean, float *rstd, float *res, const float *inp,
                      const float *a2, const float *w, const float *b, size_t N, int C, float eps) {
    int lane = threadIdx.x % 32;
    EACH_ROW(r, N) {
        const float *x = RES ? res + r * C : inp + r * C;
        float s = 0.0f;
        for (int c = lane; c < C; c += 32) {
            float v = RES ? inp[r * C + c] + a2[r * C + c] : x[c];
            if (RES) res[r * C + c] = v;
            s += v;
        }
        float m = dt_ln_mean(warp_all<false>(s), C);
        float q = 0.0f;
        for (int c = lane; c < C; c += 32) q += dt_ln_sq(x[c], m);
        float rs = dt_ln_rstd(warp_all<false>(q), C, eps);
        float *o = H ? NULL : out + r * C;
        uint16_t *h = H ? out16 + r * C : NULL;
        for (int c = lane; c < C; c += 32) {
            float v = dt_ln_out(x[c], m, rs, w[c], b[c]);
            if (H) h[c] = narrow<H>(v);
            else o[c] = v;
        }
        if (lane == 0) mean[r] = m, rstd[r] = rs;
    }
}

// The same warp a row: dinp += the row's gradient.
__global__ static void __launch_bounds__(DT_THREADS)
    ln_backward_kernel(float *dinp, const float *dout, const float *inp, const float *w, const float *mean,
                       const float *rstd, size_t N, int C) {
    int lane = threadIdx.x % 32;
    EACH_ROW(r, N) {
        const float *x = inp + r * C, *d = dout + r * C;
        float m = mean[r], s = rstd[r], a = 0.0f, an = 0.0f;
        for (int c = lane; c < C; c += 32) {
            float dn = w[c] * d[c];
            a += dn;
            an += dn * dt_ln_norm(x[c], m, s);
        }
        float dn_mean = dt_ln_mean(warp_all<false>(a), C), dnn_mean = dt_ln_mean(warp_all<false>(an), C);
        float *dx = dinp + r * C;
        for (int c = lane; c < C; c += 32) dx[c] += dt_ln_dx(w[c] * d[c], dt_ln_norm(x[c], m, s), dn_mean, dnn_mean, s);
    }
}

// ---- column sums (launch.h): the bias's and layernorm's weight gradients

// One (column tile, chunk of `rows` rows): lane y of the block's
// DT_THREADS / 32 sums rows y, y + lanes, ... of the chunk in order, then
// lane 0 adds the lanes' sums in order, into part[chunk][C]; LN: also the
// sum of the normalised input times dout, into part2; H 1 or 2: each
// element of dout read also rounded to bf16 or fp16 into d16 (block.h's
// narrow), every element being one thread's.
template <bool LN, int H>
__global__ static void __launch_bounds__(DT_THREADS)
colsum_kernel(float *part, float *part2, uint16_t *d16, const float *dout, const float *inp, const float *mean,
              const float *rstd, size_t N, int C, size_t rows) {
    __shared__ float sh[DT_THREADS], sh2[LN ? DT_THREADS : 1];
    const unsigned lanes = DT_THREADS / 32, x = threadIdx.x % 32, y = threadIdx.x / 32;
    size_t c = blockIdx.x * (size_t)32 + x, r0 = blockIdx.y * rows, r1 = r0 + rows < N ? r0 + rows : N;
    float a = 0.0f, b = 0.0f;
    if (c < (size_t)C)
        for (size_t r = r0 + y; r < r1; r += lanes) {
            float d = dout[r * C + c];
            if (H) d16[r * C + c] = narrow<H>(d);
            a += d;
            if (LN) b += dt_ln_norm(inp[r * C + c], mean[r], rstd[r]) * d;
        }
    sh[threadIdx.x] = a;
    if (LN) sh2[threadIdx.x] = b;
    __syncthreads();
    if (y != 0 || c >= (size_t)C) return;
    for (unsigned k = 1; k < lanes; k++) {
        a += sh[k * 32 + x];
        if (LN) b += sh2[k * 32 + x];
    }
    part[blockIdx.y * (size_t)C + c] = a;
    if (LN) part2[blockIdx.y * (size_t)C + c] = b;
}

// out[c] += the chunks' partial sums of column c, in order.
__global__ static void colsum_total_kernel(float *out, const float *part, size_t chunks, int C) {
    for (size_t c = blockIdx.x * (size_t)blockDim.x + threadIdx.x; c < (size_t)C; c += (size_t)gridDim.x * blockDim.x) {
        float acc = out[c];
        for (size_t k = 0; k < chunks; k++) acc += part[k * C + c];
        out[c] = acc;
    }
}

// out += dout's column sums (N rows, C columns; NULL: skipped) and, LN,
// out2 += the column sums of the normalised input times dout (layernorm's
// weights), in a fixed order; the partial sums in the stream's scratch;
// d16 non-NULL (h its type, dt_launch_h16's; not with LN): dout rounded
// to it there on the way.
template <bool LN>
static dt_status colsum(float *out, float *out2, const float *dout, const float *inp, const float *mean,
                        const float *rstd, size_t N, int C, void *d16 = NULL, int h16 = 0) {
    if (N == 0 || C <= 0 || (!out && !out2)) return DT_OK;
    unsigned chunks = dt_colsum_chunks(N);
    float *part = NULL;
    dt_status st = dt_gpu_scratch((void **)&part, dt_colsum_scratch(N, C, LN));
    if (st != DT_OK) return st;
    float *part2 = LN ? part + (size_t)chunks * C : NULL;
    uint16_t *h = (uint16_t *)d16;
    dim3 grid(dt_launch_blocks((size_t)C, 32), chunks);
    size_t rows = dt_colsum_rows(N);
    dt_with_h16(LN ? 0 : h16, [&](auto H) {
        DT_RUN((colsum_kernel<LN, decltype(H)::value>), grid, DT_THREADS, 0, part, part2, h, dout, inp, mean, rstd, N,
               C, rows);
    });
    st = dt_gpu_launched("colsum_kernel");
    const float *from[2] = {part, part2};
    float *to[2] = {out, out2};
    for (int i = 0; i < 2 && st == DT_OK; i++) {
        if (!to[i]) continue;
        DT_RUN(colsum_total_kernel, dt_launch_blocks((size_t)C, DT_THREADS), DT_THREADS, 0, to[i], from[i], chunks, C);
        st = dt_gpu_launched("colsum_total_kernel");
    }
    dt_gpu_scratch_free(part);
    return st;
}

// Either layernorm's launch: its output in fp32 (out16 NULL) or rounded to t.
template <bool RES>
static dt_status ln_forward(float *out, void *out16, dt_dtype t, float *mean, float *rstd, float *res,
                            const float *inp, const float *a2, const float *w, const float *b, size_t N, int C,
                            float eps) {
    int kind = dt_launch_h16("GPU layernorm", out16, t);
    if (kind < 0) return DT_ERR_ARG;
    if (N == 0 || C <= 0) return DT_OK;
    uint16_t *h = (uint16_t *)out16;
    dt_with_h16(kind, [&](auto H) {
        DT_RUN((ln_forward_kernel<RES, decltype(H)::value>), dt_launch_warp_rows(N), DT_THREADS, 0, out, h, mean, rstd,
               res, inp, a2, w, b, N, C, eps);
    });
    DT_LAUNCHED(ln_forward_kernel);
    return DT_OK;
}

dt_status dt_gpu_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *w,
                                   const float *b, size_t N, int C, float eps, void *out16, dt_dtype t) {
    return ln_forward<false>(out, out16, t, mean, rstd, NULL, inp, NULL, w, b, N, C, eps);
}

dt_status dt_gpu_layernorm_residual(float *out, float *mean, float *rstd, float *res, const float *a, const float *b,
                                    const float *w, const float *bias, size_t N, int C, float eps, void *out16,
                                    dt_dtype t) {
    return ln_forward<true>(out, out16, t, mean, rstd, res, a, b, w, bias, N, C, eps);
}

dt_status dt_gpu_layernorm_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                                    const float *w, const float *mean, const float *rstd, size_t N, int C) {
    if (N == 0 || C <= 0) return DT_OK;
    if (dinp) {
        DT_RUN(ln_backward_kernel, dt_launch_warp_rows(N), DT_THREADS, 0, dinp, dout, inp, w, mean, rstd, N, C);
        DT_LAUNCHED(ln_backward_kernel);
    }
    return colsum<true>(db, dw, dout, inp, mean, rstd, N, C);
}

// ---- GELU

// H 1 or 2: the output rounded to bf16 or fp16 into out16 (block.h's
// narrow) instead of out.
template <int H> __global__ static void gelu_forward_kernel(float *out, uint16_t *out16, const float *inp, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float v = dt_gelu(inp[i]);
        if (H) out16[i] = narrow<H>(v);
        else out[i] = v;
    }
}

__global__ static void gelu_backward_kernel(float *dinp, const float *dout, const float *inp, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dinp[i] = fmaf(dt_gelu_grad(inp[i]), dout[i], dinp[i]);
}

dt_status dt_gpu_gelu_forward(float *out, const float *inp, size_t n, void *out16, dt_dtype t) {
    int kind = dt_launch_h16("GPU GELU", out16, t);
    if (kind < 0) return DT_ERR_ARG;
    if (n == 0) return DT_OK;
    uint16_t *h = (uint16_t *)out16;
    dt_with_h16(kind, [&](auto H) {
        DT_RUN(gelu_forward_kernel<decltype(H)::value>, dt_launch_blocks(n, DT_THREADS), DT_THREADS, 0, out, h, inp, n);
    });
    DT_LAUNCHED(gelu_forward_kernel);
    return DT_OK;
}

dt_status dt_gpu_gelu_backward(float *dinp, const float *dout, const float *inp, size_t n) {
    if (n == 0) return DT_OK;
    DT_RUN(gelu_backward_kernel, dt_launch_blocks(n, DT_THREADS), DT_THREADS, 0, dinp, dout, inp, n);
    DT_LAUNCHED(gelu_backward_kernel);
    return DT_OK;
}

// ---- softmax cross-entropy

// A row's probabilities and loss (row_loss[r], double); a target outside
// [0, V) gives a NaN loss (the CPU checks the tokens before).
__global__ static void __launch_bounds__(DT_THREADS)
    ce_forward_kernel(float *probs, double *row_loss, const float *logits, const int32_t *targets, size_t N, int V,
                      size_t ld) {
    __shared__ float shf[DT_THREADS];
    __shared__ double shd[DT_THREADS];
    for (size_t r = blockIdx.x; r < N; r += gridDim.x) {
        const float *l = logits + r * ld;
        float *p = probs + r * ld;
        float mx = -FLT_MAX;
        for (int v = threadIdx.x; v < V; v += DT_THREADS) mx = l[v] > mx ? l[v] : mx;
        mx = block_max(mx, shf);
        double s = 0.0;
        for (int v = threadIdx.x; v < V; v += DT_THREADS) {
            float e = dt_ce_exp(l[v], mx);
            p[v] = e;
            s += e;
        }
        s = block_sum(s, shd);
        float inv = dt_ce_inv(s);
        for (int v = threadIdx.x; v < V; v += DT_THREADS) p[v] *= inv;
        if (threadIdx.x == 0) {
            int32_t t = targets[r];
            row_loss[r] = t >= 0 && t < V ? dt_ce_row_loss(mx, s, l[t]) : (double)NAN;
        }
    }
}

// Forward and backward in one pass (dt_gpu_crossentropy_fused), a block a
// row: its maximum and sum as ce_forward_kernel's, its loss (the target's
// logit read before any is overwritten), then each logit replaced by
// ce_backward_kernel's gradient onto zero of its probability, recomputed
// (the product rounded on its own, as the stored probability was); H 1
// or 2: the gradient rounded to bf16 or fp16 into d16 instead (block.h's
// narrow, the conversion's bits), the logits only read. STAGE: the row
// kept in the block's shared memory (V floats) by the first pass, which
// the other two read there: the logits read from memory once, not three
// times (a GPT-2 row is 201 KB: the rows of the blocks in flight are far
// more than an L2 holds); the same bits. Its first pass reads 16 bytes a
// load where the row allows (as one block of this size fits an SM, each
// thread keeps several loads in flight); the maximum is exact whichever
// thread finds it, and the sums come after block_max's barriers.
template <int H, bool STAGE>
__global__ static void __launch_bounds__(DT_THREADS) ce_fused_kernel(float *logits, uint16_t *d16, double *row_loss,
                                                                     const int32_t *targets, size_t N, int V, size_t ld,
                                                                     float scale) {
    __shared__ float shf[DT_THREADS];
    __shared__ double shd[DT_THREADS];
    DT_DYN_SHARED __align__(16) float sm[];  // (STAGE: the row)
    for (size_t r = blockIdx.x; r < N; r += gridDim.x) {
        float *l = logits + r * ld;
        const float *x = STAGE ? sm : l;  // (read there after block_max's barriers)
        float mx = -FLT_MAX;
        int v0 = 0;  // (the columns from v0 on: one at a time)
        if (STAGE && (uintptr_t)l % 16 == 0) {
            v0 = V / 4 * 4;
#pragma unroll 4
            for (int v = 4 * threadIdx.x; v < v0; v += 4 * DT_THREADS) {
                float4 e = *(const float4 *)(l + v);
                *(float4 *)(sm + v) = e;
                mx = fmaxf(mx, fmaxf(fmaxf(e.x, e.y), fmaxf(e.z, e.w)));
            }
        }
        for (int v = v0 + threadIdx.x; v < V; v += DT_THREADS) {
            float e = l[v];
            if (STAGE) sm[v] = e;
            mx = e > mx ? e : mx;
        }
        mx = block_max(mx, shf);
        double s = 0.0;
        for (int v = threadIdx.x; v < V; v += DT_THREADS) s += dt_ce_exp(x[v], mx);
        s = block_sum(s, shd);
        float inv = dt_ce_inv(s);
        int32_t t = targets[r];
        if (threadIdx.x == 0) row_loss[r] = t >= 0 && t < V ? dt_ce_row_loss(mx, s, x[t]) : (double)NAN;
        __syncthreads();
        uint16_t *h = H ? d16 + r * ld : NULL;
        for (int v = threadIdx.x; v < V; v += DT_THREADS) {
            float gv = dt_ce_grad(0.0f, __fmul_rn(dt_ce_exp(x[v], mx), inv), v == t, scale);
            if (H) h[v] = narrow<H>(gv);
            else l[v] = gv;
        }
    }
}

// The mean of the rows' losses, summed in order (as the CPU): a block.
__global__ static void __launch_bounds__(DT_THREADS) ce_mean_kernel(float *loss, const double *row_loss, size_t N) {
    __shared__ double sh[DT_THREADS];
    double s = ordered_sum(row_loss, N, 0.0, sh);
    if (threadIdx.x == 0) *loss = (float)(s / N);
}

__global__ static void ce_backward_kernel(float *dlogits, const float *probs, const int32_t *targets, size_t N, int V,
                                          size_t ld, float scale) {
    size_t n = N * (size_t)V;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        size_t r = i / V, v = i % V;
        dlogits[r * ld + v] = dt_ce_grad(dlogits[r * ld + v], probs[r * ld + v], (int64_t)v == targets[r], scale);
    }
}

// The vocabulary-parallel cross-entropy (dtrain/gpt.h's dt_ce_split_*): a
// block a row, its sums in a block's tree.
__global__ static void __launch_bounds__(DT_THREADS) ce_split_max_kernel(float *mx, const float *logits, size_t N, int V) {
    __shared__ float shf[DT_THREADS];
    for (size_t r = blockIdx.x; r < N; r += gridDim.x) {
        const float *l = logits + r * V;
        float m = -FLT_MAX;
        for (int v = threadIdx.x; v < V; v += DT_THREADS) m = l[v] > m ? l[v] : m;
        m = block_max(m, shf);
        if (threadIdx.x == 0) mx[r] = m;
    }
}

__global__ static void __launch_bounds__(DT_THREADS)
    ce_split_exp_kernel(float *probs, float *sums, const float *logits, const float *mx, const int32_t *targets,
                        size_t N, int V) {
    __shared__ double shd[DT_THREADS];
    for (size_t r = blockIdx.x; r < N; r += gridDim.x) {
        const float *l = logits + r * V;
        float *p = probs + r * V;
        double s = 0.0;
        for (int v = threadIdx.x; v < V; v += DT_THREADS) {
            float e = dt_ce_exp(l[v], mx[r]);
            p[v] = e;
            s += e;
        }
        s = block_sum(s, shd);
        if (threadIdx.x == 0) {
            int32_t t = targets[r];
            sums[r] = (float)s;
            sums[N + r] = t >= 0 && t < V ? l[t] : 0.0f;
        }
    }
}

__global__ static void __launch_bounds__(DT_THREADS)
    ce_split_finish_kernel(float *probs, double *row_loss, const float *mx, const float *sums, size_t N, int V) {
    for (size_t r = blockIdx.x; r < N; r += gridDim.x) {
        float inv = 1.0f / sums[r], *p = probs + r * V;
        for (int v = threadIdx.x; v < V; v += DT_THREADS) p[v] *= inv;
        if (threadIdx.x == 0) row_loss[r] = dt_ce_row_loss(mx[r], (double)sums[r], sums[N + r]);
    }
}

dt_status dt_gpu_ce_split_max(float *mx, const float *logits, size_t N, int V) {
    if (N == 0) return DT_OK;
    DT_RUN(ce_split_max_kernel, dt_launch_rows(N), DT_THREADS, 0, mx, logits, N, V);
    DT_LAUNCHED(ce_split_max_kernel);
    return DT_OK;
}

dt_status dt_gpu_ce_split_exp(float *probs, float *sums, const float *logits, const float *mx, const int32_t *targets,
                              size_t N, int V) {
    if (N == 0) return DT_OK;
    DT_RUN(ce_split_exp_kernel, dt_launch_rows(N), DT_THREADS, 0, probs, sums, logits, mx, targets, N, V);
    DT_LAUNCHED(ce_split_exp_kernel);
    return DT_OK;
}

dt_status dt_gpu_ce_split_finish(float *probs, double *row_loss, float *loss, const float *mx, const float *sums,
                                 size_t N, int V) {
    if (N == 0) {
        DT_QUEUE(cudaMemsetAsync(loss, 0, sizeof(float), dt_cu_stream));
        return DT_OK;
    }
    DT_RUN(ce_split_finish_kernel, dt_launch_rows(N), DT_THREADS, 0, probs, row_loss, mx, sums, N, V);
    DT_LAUNCHED(ce_split_finish_kernel);
    DT_RUN(ce_mean_kernel, 1, DT_THREADS, 0, loss, row_loss, N);
    DT_LAUNCHED(ce_mean_kernel);
    return DT_OK;
}

dt_status dt_gpu_crossentropy_forward(float *probs, double *row_loss, float *loss, const float *logits,
                                      const int32_t *targets, size_t N, int V, size_t ld) {
    if (V <= 0 || ld < (size_t)V) return dt_error(DT_ERR_ARG, "GPU cross-entropy: V %d, row stride %zu", V, ld);
    if (N == 0) {
        DT_QUEUE(cudaMemsetAsync(loss, 0, sizeof(float), dt_cu_stream));
        return DT_OK;
    }
    DT_RUN(ce_forward_kernel, dt_launch_rows(N), DT_THREADS, 0, probs, row_loss, logits, targets, N, V, ld);
    DT_LAUNCHED(ce_forward_kernel);
    DT_RUN(ce_mean_kernel, 1, DT_THREADS, 0, loss, row_loss, N);
    DT_LAUNCHED(ce_mean_kernel);
    return DT_OK;
}

dt_status dt_gpu_crossentropy_fused(float *logits, double *row_loss, float *loss, const int32_t *targets, size_t N,
                                    int V, size_t ld, float dloss, void *d16, dt_dtype t) {
    if (V <= 0 || ld < (size_t)V) return dt_error(DT_ERR_ARG, "GPU cross-entropy: V %d, row stride %zu", V, ld);
    int kind = dt_launch_h16("GPU cross-entropy", d16, t);
    if (kind < 0) return DT_ERR_ARG;
    if (N == 0) {
        DT_QUEUE(cudaMemsetAsync(loss, 0, sizeof(float), dt_cu_stream));
        return DT_OK;
    }
    uint16_t *h = (uint16_t *)d16;
    float s = dt_ce_scale(dloss, (float)N);
    size_t row = sizeof(float) * (size_t)V;  // (staged where a block may have it beside its sums' arrays)
    bool stage = row + DT_THREADS * (sizeof(float) + sizeof(double)) <= dt_shared_optin();
    size_t sh = stage ? row : 0;
    dt_status st = DT_OK;
    dt_with_h16(kind, [&](auto H) {
        auto k = stage ? ce_fused_kernel<decltype(H)::value, true> : ce_fused_kernel<decltype(H)::value, false>;
        if ((st = dt_shared_bytes(k, sh)) == DT_OK)
            DT_RUN(k, dt_launch_rows(N), DT_THREADS, sh, logits, h, row_loss, targets, N, V, ld, s);
    });
    if (st != DT_OK) return st;
    DT_LAUNCHED(ce_fused_kernel);
    DT_RUN(ce_mean_kernel, 1, DT_THREADS, 0, loss, row_loss, N);
    DT_LAUNCHED(ce_mean_kernel);
    return DT_OK;
}

dt_status dt_gpu_crossentropy_backward(float *dlogits, const float *probs, const int32_t *targets, size_t N, int V,
                                       size_t ld, float dloss) {
    if (V <= 0 || ld < (size_t)V) return dt_error(DT_ERR_ARG, "GPU cross-entropy: V %d, row stride %zu", V, ld);
    if (N == 0) return DT_OK;
    DT_RUN(ce_backward_kernel, dt_launch_blocks(N * (size_t)V, DT_THREADS), DT_THREADS, 0, dlogits, probs, targets, N, V, ld,
                                                                                     dt_ce_scale(dloss, (float)N));
    DT_LAUNCHED(ce_backward_kernel);
    return DT_OK;
}

// ---- ReLU

__global__ static void relu_forward_kernel(float *out, const float *inp, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = dt_relu(inp[i]);
}

__global__ static void relu_backward_kernel(float *dinp, const float *dout, const float *inp, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dinp[i] += dt_relu_grad(inp[i], dout[i]);
}

dt_status dt_gpu_relu_forward(float *out, const float *inp, size_t N) {
    if (N == 0) return DT_OK;
    DT_RUN(relu_forward_kernel, dt_launch_blocks(N, DT_THREADS), DT_THREADS, 0, out, inp, N);
    DT_LAUNCHED(relu_forward_kernel);
    return DT_OK;
}

dt_status dt_gpu_relu_backward(float *dinp, const float *dout, const float *inp, size_t N) {
    if (N == 0) return DT_OK;
    DT_RUN(relu_backward_kernel, dt_launch_blocks(N, DT_THREADS), DT_THREADS, 0, dinp, dout, inp, N);
    DT_LAUNCHED(relu_backward_kernel);
    return DT_OK;
}

// ---- bias

__global__ static void bias_forward_kernel(float *out, const float *b, size_t n, int OC) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] += b[i % OC];
}

dt_status dt_gpu_bias_forward(float *out, const float *b, size_t N, int OC) {
    if (N == 0 || OC <= 0) return DT_OK;
    DT_RUN(bias_forward_kernel, dt_launch_blocks(N * OC, DT_THREADS), DT_THREADS, 0, out, b, N * OC, OC);
    DT_LAUNCHED(bias_forward_kernel);
    return DT_OK;
}

dt_status dt_gpu_bias_backward(float *db, const float *dout, size_t N, int OC, void *dout16, dt_dtype t) {
    int kind = dt_launch_h16("GPU bias gradient", dout16, t);
    if (kind < 0) return DT_ERR_ARG;
    return colsum<false>(db, NULL, dout, NULL, NULL, NULL, N, OC, dout16, kind);
}
