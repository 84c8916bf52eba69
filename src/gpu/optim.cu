/* The optimizers' kernels over flat device blocks: the CPU's per-element
 * rules (optim/elem.h), a grid-stride loop with 64-bit indices; the global
 * norm's sum of squares (dt_sum_squares's bits) and the clipping scale.
 * tests/gpu/test_gpu_emu.c runs the sums of squares on CPU threads. */
#include "core/fixed.h"
#ifdef DT_CUDA_EMU
#include "cuda_emu.h"  // (tests/gpu: these kernels on CPU threads, test_gpu_emu)
#else
#include "gpu/cuda_check.h"
#endif
#include "gpu/block.h"
#include "gpu/gpu.h"
#include "gpu/launch.h"

// A guard (the step's end on the device, step_scale): its scale in place
// of k's, or no update at all.
// (k: the constants, in device memory)
__global__ static void adamw_kernel(float *w, const float *g, float *m, float *v, size_t n, const dt_adamw_k *kd,
                                    const float *guard) {
    dt_adamw_k k = *kd;
    if (!dt_guard_scale(guard, &k.grad_scale)) return;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dt_adamw_elem(&w[i], g[i], &m[i], &v[i], &k);
}

__global__ static void sgd_kernel(float *w, const float *g, float *buf, size_t n, const dt_sgd_k *kd,
                                  const float *guard) {
    dt_sgd_k k = *kd;
    if (!dt_guard_scale(guard, &k.grad_scale)) return;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dt_sgd_elem(&w[i], g[i], buf ? &buf[i] : NULL, &k);
}

dt_status dt_gpu_adamw(float *w, const float *g, float *m, float *v, size_t n, const dt_adamw_k *k,
                       const float *guard) {
    if (n == 0) return DT_OK;
    DT_RUN(adamw_kernel, dt_launch_blocks(n, DT_THREADS), DT_THREADS, 0, w, g, m, v, n, k, guard);
    DT_LAUNCHED(adamw_kernel);
    return DT_OK;
}

dt_status dt_gpu_sgd(float *w, const float *g, float *buf, size_t n, const dt_sgd_k *k, const float *guard) {
    if (n == 0) return DT_OK;
    DT_RUN(sgd_kernel, dt_launch_blocks(n, DT_THREADS), DT_THREADS, 0, w, g, buf, n, k, guard);
    DT_LAUNCHED(sgd_kernel);
    return DT_OK;
}

// ---- the global norm's sum of squares, and the clipping scale

// A thread a chunk of DT_SUMSQ_BLOCK elements, summed in order in double
// (dt_sum_squares's blocks: (double)x x is exact, so a fused multiply-add
// gives the same bits).
__global__ static void sumsq_chunks_kernel(double *part, const float *x, size_t n, size_t chunks) {
    for (size_t b = blockIdx.x * (size_t)blockDim.x + threadIdx.x; b < chunks; b += (size_t)gridDim.x * blockDim.x) {
        size_t lo = b * DT_SUMSQ_BLOCK, hi = lo + DT_SUMSQ_BLOCK < n ? lo + DT_SUMSQ_BLOCK : n;
        double s = 0.0;
        for (size_t i = lo; i < hi; i++) s += (double)x[i] * x[i];
        part[b] = s;
    }
}

// The chunks' sums in order (as the CPU): a block.
__global__ static void __launch_bounds__(DT_THREADS) sumsq_total_kernel(double *out, const double *part, size_t chunks) {
    __shared__ double sh[DT_THREADS];
    double s = ordered_sum(part, chunks, 0.0, sh);
    if (threadIdx.x == 0) *out = s;
}

dt_status dt_gpu_sumsq(double *out_dev, const float *x, size_t n) {
    size_t chunks = dt_sumsq_chunks(n);
    if (chunks == 0) {
        DT_QUEUE(cudaMemsetAsync(out_dev, 0, sizeof(double), dt_cu_stream));
        return DT_OK;
    }
    void *part = NULL;
    dt_status st = dt_gpu_scratch(&part, dt_sumsq_scratch(n));
    if (st != DT_OK) return st;
    DT_RUN(sumsq_chunks_kernel, dt_launch_blocks(chunks, DT_THREADS), DT_THREADS, 0, (double *)part, x, n, chunks);
    st = dt_gpu_launched("sumsq_chunks_kernel");
    if (st == DT_OK) {
        DT_RUN(sumsq_total_kernel, 1, DT_THREADS, 0, out_dev, (const double *)part, chunks);
        st = dt_gpu_launched("sumsq_total_kernel");
    }
    dt_gpu_scratch_free(part);
    return st;
}

// A thread a piece of the slice x[n] that starts `first` into a block:
// piece 0 the rest of that block (from carry), then whole blocks, the
// last cut by the slice's end.
__global__ static void sumsq_parts_kernel(double *part, const float *x, size_t n, size_t first, double carry,
                                          size_t pieces) {
    for (size_t k = blockIdx.x * (size_t)blockDim.x + threadIdx.x; k < pieces; k += (size_t)gridDim.x * blockDim.x) {
        size_t lo = k ? k * DT_SUMSQ_BLOCK - first : 0, hi = (k + 1) * DT_SUMSQ_BLOCK - first;
        double s = k == 0 && first ? carry : 0.0;
        for (size_t i = lo; i < hi && i < n; i++) s += (double)x[i] * x[i];
        part[k] = s;
    }
}

dt_status dt_gpu_sumsq_parts(double *part_dev, const float *x, size_t n, size_t first, double carry) {
    first %= DT_SUMSQ_BLOCK;
    size_t pieces = n ? (first + n + DT_SUMSQ_BLOCK - 1) / DT_SUMSQ_BLOCK : 0;
    if (pieces == 0) return DT_OK;
    DT_RUN(sumsq_parts_kernel, dt_launch_blocks(pieces, DT_THREADS), DT_THREADS, 0, part_dev, x, n, first, carry, pieces);
    DT_LAUNCHED(sumsq_parts_kernel);
    return DT_OK;
}

__global__ static void step_scale_kernel(float *guard, const double *vals, float unscale, float clip) {
    dt_step_guard(guard, vals, unscale, clip);
}

dt_status dt_gpu_step_scale(float *guard, const double *vals, float unscale, float clip) {
    DT_RUN(step_scale_kernel, 1, 1, 0, guard, vals, unscale, clip);
    DT_LAUNCHED(step_scale_kernel);
    return DT_OK;
}

__global__ static void scale_by_kernel(float *x, size_t n, const float *s) {
    float k = *s;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) x[i] *= k;
}

dt_status dt_gpu_scale(float *x, size_t n, const float *s_dev) {
    if (n == 0) return DT_OK;
    DT_RUN(scale_by_kernel, dt_launch_blocks(n, DT_THREADS), DT_THREADS, 0, x, n, s_dev);
    DT_LAUNCHED(scale_by_kernel);
    return DT_OK;
}

__global__ static void loss_add_kernel(double *acc, const float *loss, double w) {
    *acc = __dadd_rn(*acc, __dmul_rn((double)*loss, w));
}

dt_status dt_gpu_loss_add(double *acc, const float *loss, double w) {
    DT_RUN(loss_add_kernel, 1, 1, 0, acc, loss, w);
    DT_LAUNCHED(loss_add_kernel);
    return DT_OK;
}

// ---- deterministic mode's fixed point (core/fixed.h: the CPU's bits)

__global__ static void fixed_add_kernel(int64_t *acc, const float *g, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        acc[i] += dt_fixed_of(g[i], DT_FIXED_SCALE);
}

__global__ static void fixed_to_float_kernel(float *g, const int64_t *acc, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        g[i] = dt_fixed_value(acc[i]);
}

dt_status dt_gpu_fixed_add(int64_t *acc, const float *g, size_t n) {
    if (n == 0) return DT_OK;
    DT_RUN(fixed_add_kernel, dt_launch_blocks(n, DT_THREADS), DT_THREADS, 0, acc, g, n);
    DT_LAUNCHED(fixed_add_kernel);
    return DT_OK;
}

dt_status dt_gpu_fixed_to_float(float *g, const int64_t *acc, size_t n) {
    if (n == 0) return DT_OK;
    DT_RUN(fixed_to_float_kernel, dt_launch_blocks(n, DT_THREADS), DT_THREADS, 0, g, acc, n);
    DT_LAUNCHED(fixed_to_float_kernel);
    return DT_OK;
}
