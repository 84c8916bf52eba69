/* fp32 <-> 16-bit floats on the GPU (gpu.h): bf16 by core/bf16.h's element,
 * the CPU's bits; fp16 by CUDA's round-to-nearest-even conversions (IEEE
 * binary16, as the CPU's: the same bits but for a NaN's payload). */
#include "gpu/block.h"
#ifdef DT_CUDA_EMU
#include "cuda_emu.h"  // (tests/gpu: these kernels on CPU threads, test_gpu_emu)
#else
#include "gpu/cuda_check.h"
#endif
#include "gpu/gpu.h"
#include "gpu/launch.h"


// (block.h's narrow and widen: H 1 bf16, 2 fp16)
#define H16 (BF16 ? 1 : 2)

template <bool BF16> __global__ static void to_f32_kernel(float *dst, const uint16_t *src, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = widen<H16>(src[i]);
}

template <bool BF16> __global__ static void from_f32_kernel(uint16_t *dst, const float *src, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = narrow<H16>(src[i]);
}

// Error feedback (dt_from_f32_ef): the sum and the difference are single
// fp32 operations, so nothing is contracted into an FMA.
template <bool BF16> __global__ static void from_f32_ef_kernel(uint16_t *dst, float *g, float *res, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float v = __fadd_rn(g[i], res[i]);
        uint16_t h = narrow<H16>(v);
        g[i] = v;
        dst[i] = h;
        res[i] = __fsub_rn(v, widen<H16>(h));
    }
}

static dt_status sixteen(dt_dtype t) {
    if (t == DT_BF16 || t == DT_F16) return DT_OK;
    return dt_error(DT_ERR_ARG, "GPU conversion: type %s is not a 16-bit float (BF16 or F16 only)", dt_dtype_name(t));
}

dt_status dt_gpu_to_f32(float *dst, const void *src, size_t n, dt_dtype t) {
    dt_status st = sixteen(t);
    if (st != DT_OK || n == 0) return st;
    if (t == DT_BF16) {
        DT_RUN(to_f32_kernel<true>, dt_launch_blocks(n, DT_THREADS), DT_THREADS, 0, dst, (const uint16_t *)src, n);
        DT_LAUNCHED(to_f32_kernel<bf16>);
    } else {
        DT_RUN(to_f32_kernel<false>, dt_launch_blocks(n, DT_THREADS), DT_THREADS, 0, dst, (const uint16_t *)src, n);
        DT_LAUNCHED(to_f32_kernel<fp16>);
    }
    return DT_OK;
}

dt_status dt_gpu_from_f32(void *dst, const float *src, size_t n, dt_dtype t) {
    dt_status st = sixteen(t);
    if (st != DT_OK || n == 0) return st;
    if (t == DT_BF16) {
        DT_RUN(from_f32_kernel<true>, dt_launch_blocks(n, DT_THREADS), DT_THREADS, 0, (uint16_t *)dst, src, n);
        DT_LAUNCHED(from_f32_kernel<bf16>);
    } else {
        DT_RUN(from_f32_kernel<false>, dt_launch_blocks(n, DT_THREADS), DT_THREADS, 0, (uint16_t *)dst, src, n);
        DT_LAUNCHED(from_f32_kernel<fp16>);
    }
    return DT_OK;
}

dt_status dt_gpu_from_f32_ef(void *dst, float *g, float *res, size_t n, dt_dtype t) {
    dt_status st = sixteen(t);
    if (st != DT_OK || n == 0) return st;
    if (t == DT_BF16) {
        DT_RUN(from_f32_ef_kernel<true>, dt_launch_blocks(n, DT_THREADS), DT_THREADS, 0, (uint16_t *)dst, g, res, n);
        DT_LAUNCHED(from_f32_ef_kernel<bf16>);
    } else {
        DT_RUN(from_f32_ef_kernel<false>, dt_launch_blocks(n, DT_THREADS), DT_THREADS, 0, (uint16_t *)dst, g, res, n);
        DT_LAUNCHED(from_f32_ef_kernel<fp16>);
    }
    return DT_OK;
}
