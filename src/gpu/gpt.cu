/* The GPT's embedding and residual add on the GPU (gpu.h): the CPU's
 * arithmetic and order of sums (nn/attention.c), so the CPU's bits. The
 * embedding's backward groups the positions by token with a stable radix
 * sort (CUB) and gives each token's row to one block, which adds the
 * positions in order as the CPU does: no float atomics. A tensor-parallel
 * shard's (vocabulary parallel: wte's rows [v0, v0 + V)) are the same
 * kernels given its rows. tests/gpu/test_gpu_emu.c runs them on CPU
 * threads (cub's sort a stable sort on the host there). */
#ifdef DT_CUDA_EMU
#include "cuda_emu.h"  // (tests/gpu: these kernels on CPU threads, test_gpu_emu)
#include "emu_cub.h"
#else
#include "gpu/cuda_check.h"

#include <cub/device/device_radix_sort.cuh>
#endif
#include "gpu/gpu.h"
#include "gpu/launch.h"

// ---- encoder: token + position embedding

// (a tensor-parallel shard's: the tokens of wte's rows [v0, v0 + V), zeros
// for the others; the whole model's: v0 0, V every token)
__global__ static void encoder_forward_kernel(float *out, const int32_t *inp, const float *wte, const float *wpe,
                                              size_t BT, int T, int C, int v0, int V) {
    size_t n = BT * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        size_t bt = i / C, c = i % C, t = bt % T;
        int32_t tok = inp[bt];
        out[i] = tok >= v0 && tok - v0 < V ? wte[(size_t)(tok - v0) * C + c] + wpe[t * C + c] : 0.0f;
    }
}

// Position positions p (ascending) for the stable sort's values.
__global__ static void iota_kernel(int32_t *p, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = (int32_t)i;
}

// tok[n], pos[n]: the positions sorted by token, ascending within one. A
// block at the first position of a token's run owns that token's row of
// dwte and adds the run's gradients to it in order (the CPU's order), the
// run's positions read DT_THREADS at a time into shared memory by the
// block's threads, so that a thread's reads of the gradients' rows do not
// wait on the run's end one position at a time (a frequent token's run of
// text is hundreds of positions long).
__global__ static void __launch_bounds__(DT_THREADS)
    wte_grad_kernel(float *dwte, const float *dout, const int32_t *tok, const int32_t *pos, size_t n, int C, int v0,
                    int V) {
    __shared__ int32_t sp[DT_THREADS];
    for (size_t i = blockIdx.x; i < n; i += gridDim.x) {
        int32_t t = tok[i];
        if (i > 0 && tok[i - 1] == t) continue;  // (the whole block: not a run's start)
        if (t < v0 || t - v0 >= V) continue;     // (another shard's row)
        float *d = dwte + (size_t)(t - v0) * C;
        for (size_t j0 = i, m = DT_THREADS; m == DT_THREADS; j0 += DT_THREADS) {
            size_t j = j0 + threadIdx.x;
            int in = j < n && tok[j] == t;  // (the run is a prefix of the chunk)
            if (in) sp[threadIdx.x] = pos[j];
            m = (size_t)__syncthreads_count(in);
            for (int c = threadIdx.x; c < C; c += DT_THREADS) {
                float acc = d[c];
#pragma unroll 8
                for (size_t k = 0; k < m; k++) acc += dout[(size_t)sp[k] * C + c];
                d[c] = acc;
            }
            __syncthreads();  // (sp read before the next chunk's)
        }
    }
}

// dwpe[t, c] += dout[b, t, c] over the batch in order.
__global__ static void wpe_grad_kernel(float *dwpe, const float *dout, int B, int T, int C) {
    size_t n = (size_t)T * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float acc = dwpe[i];
        for (int b = 0; b < B; b++) acc += dout[(size_t)b * n + i];
        dwpe[i] = acc;
    }
}

dt_status dt_gpu_encoder_split_forward(float *out, const int32_t *inp, const float *wte, const float *wpe, int B,
                                       int T, int C, int v0, int V) {
    if (B <= 0 || T <= 0 || C <= 0) return DT_OK;
    size_t BT = (size_t)B * T;
    DT_RUN(encoder_forward_kernel, dt_launch_blocks(BT * C, DT_THREADS), DT_THREADS, 0, out, inp, wte, wpe, BT, T, C, v0, V);
    DT_LAUNCHED(encoder_forward_kernel);
    return DT_OK;
}

dt_status dt_gpu_encoder_forward(float *out, const int32_t *inp, const float *wte, const float *wpe, int B, int T,
                                 int C) {
    return dt_gpu_encoder_split_forward(out, inp, wte, wpe, B, T, C, 0, INT32_MAX);
}

// The backward's scratch for n positions in *bytes: its three int arrays,
// then the room cub's sort of n (token, position) pairs asks for (*sort).
static cudaError_t encoder_room(size_t n, size_t *sort, size_t *bytes) {
    *sort = *bytes = 0;
    cudaError_t e = cub::DeviceRadixSort::SortPairs(NULL, *sort, (const int32_t *)NULL, (int32_t *)NULL,
                                                    (const int32_t *)NULL, (int32_t *)NULL, (int)n, 0, 32, dt_cu_stream);
    *bytes = sizeof(int32_t) * dt_encoder_scratch_ints(n) + *sort;
    return e;
}

size_t dt_gpu_encoder_scratch(size_t n) {
    size_t sort = 0, bytes = 0;
    if (n == 0 || n > INT32_MAX || encoder_room(n, &sort, &bytes) != cudaSuccess) return 0;  // (the call says why)
    return bytes;
}

// dwte's part (rows [v0, v0 + V) of the tokens): the positions sorted by
// token in scratch, then one block a run.
static dt_status wte_grad(float *dwte, const float *dout, const int32_t *inp, size_t n, int C, int v0, int V) {
    if (n > INT32_MAX) return dt_error(DT_ERR_ARG, "GPU encoder backward: %zu positions (at most 2^31 - 1)", n);
    size_t sort_bytes = 0, bytes = 0;
    cudaError_t e = encoder_room(n, &sort_bytes, &bytes);
    if (e != cudaSuccess)
        return dt_error(DT_ERR_INTERNAL, "GPU encoder backward: the sort's size: %s", cudaGetErrorString(e));
    size_t ints = dt_encoder_scratch_ints(n);  // (the sort's scratch 256-byte aligned after them)
    void *scratch = NULL;
    dt_status st = dt_gpu_scratch(&scratch, bytes);
    if (st != DT_OK) return st;
    int32_t *tok = (int32_t *)scratch, *pos = tok + n, *seq = pos + n;
    DT_RUN(iota_kernel, dt_launch_blocks(n, DT_THREADS), DT_THREADS, 0, seq, n);
    st = dt_gpu_launched("iota_kernel");
    if (st == DT_OK && !dt_gpu_skipping) {
        e = cub::DeviceRadixSort::SortPairs((int32_t *)scratch + ints, sort_bytes, inp, tok, seq, pos, (int)n, 0, 32,
                                            dt_cu_stream);
        if (e != cudaSuccess) st = dt_error(DT_ERR_INTERNAL, "GPU encoder backward: the sort: %s", cudaGetErrorString(e));
    }
    if (st == DT_OK) {
        DT_RUN(wte_grad_kernel, dt_launch_rows(n), DT_THREADS, 0, dwte, dout, tok, pos, n, C, v0, V);
        st = dt_gpu_launched("wte_grad_kernel");
    }
    dt_gpu_scratch_free(scratch);
    return st;
}

dt_status dt_gpu_encoder_split_backward(float *dwte, float *dwpe, const float *dout, const int32_t *inp, int B, int T,
                                        int C, int v0, int V) {
    if (B <= 0 || T <= 0 || C <= 0) return DT_OK;
    if (dwte) {
        dt_status st = wte_grad(dwte, dout, inp, (size_t)B * T, C, v0, V);
        if (st != DT_OK) return st;
    }
    if (dwpe) {
        DT_RUN(wpe_grad_kernel, dt_launch_blocks((size_t)T * C, DT_THREADS), DT_THREADS, 0, dwpe, dout, B, T, C);
        DT_LAUNCHED(wpe_grad_kernel);
    }
    return DT_OK;
}

dt_status dt_gpu_encoder_backward(float *dwte, float *dwpe, const float *dout, const int32_t *inp, int B, int T, int C) {
    return dt_gpu_encoder_split_backward(dwte, dwpe, dout, inp, B, T, C, 0, INT32_MAX);
}

// ---- residual

__global__ static void residual_forward_kernel(float *out, const float *a, const float *b, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = a[i] + b[i];
}

__global__ static void residual_backward_kernel(float *da, float *db, const float *dout, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        if (da) da[i] += dout[i];
        if (db) db[i] += dout[i];
    }
}

dt_status dt_gpu_residual_forward(float *out, const float *a, const float *b, size_t N) {
    if (N == 0) return DT_OK;
    DT_RUN(residual_forward_kernel, dt_launch_blocks(N, DT_THREADS), DT_THREADS, 0, out, a, b, N);
    DT_LAUNCHED(residual_forward_kernel);
    return DT_OK;
}

dt_status dt_gpu_residual_backward(float *da, float *db, const float *dout, size_t N) {
    if (N == 0 || (!da && !db)) return DT_OK;
    DT_RUN(residual_backward_kernel, dt_launch_blocks(N, DT_THREADS), DT_THREADS, 0, da, db, dout, N);
    DT_LAUNCHED(residual_backward_kernel);
    return DT_OK;
}
