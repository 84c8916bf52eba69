/* fp32 <-> bf16 on the GPU (gpu.h): core/bf16.h's element, the CPU's bits. */
#include "core/bf16.h"
#include "gpu/cuda_check.h"
#include "gpu/gpu.h"
#include "gpu/launch.h"

__global__ static void bf16_to_f32_kernel(float *dst, const uint16_t *src, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = dt_bf16_to_f32(src[i]);
}

__global__ static void f32_to_bf16_kernel(uint16_t *dst, const float *src, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = dt_f32_to_bf16(src[i]);
}

static dt_status bf16_only(dt_dtype t) {
    if (t == DT_BF16) return DT_OK;
    return dt_error(DT_ERR_ARG, "GPU conversion: %s is not on the GPU yet (bf16 only)", dt_dtype_name(t));
}

dt_status dt_gpu_to_f32(float *dst, const void *src, size_t n, dt_dtype t) {
    dt_status st = bf16_only(t);
    if (st != DT_OK || n == 0) return st;
    bf16_to_f32_kernel<<<dt_launch_blocks(n, DT_THREADS), DT_THREADS>>>(dst, (const uint16_t *)src, n);
    DT_LAUNCHED(bf16_to_f32_kernel);
    return DT_OK;
}

dt_status dt_gpu_from_f32(void *dst, const float *src, size_t n, dt_dtype t) {
    dt_status st = bf16_only(t);
    if (st != DT_OK || n == 0) return st;
    f32_to_bf16_kernel<<<dt_launch_blocks(n, DT_THREADS), DT_THREADS>>>((uint16_t *)dst, src, n);
    DT_LAUNCHED(f32_to_bf16_kernel);
    return DT_OK;
}
