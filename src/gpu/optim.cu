/* The optimizers' kernels over flat device blocks: the CPU's per-element
 * rules (optim/elem.h), a grid-stride loop with 64-bit indices. */
#include "gpu/cuda_check.h"
#include "gpu/gpu.h"
#include "gpu/launch.h"

__global__ static void adamw_kernel(float *w, const float *g, float *m, float *v, size_t n, dt_adamw_k k) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dt_adamw_elem(&w[i], g[i], &m[i], &v[i], &k);
}

__global__ static void sgd_kernel(float *w, const float *g, float *buf, size_t n, dt_sgd_k k) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dt_sgd_elem(&w[i], g[i], buf ? &buf[i] : NULL, &k);
}

dt_status dt_gpu_adamw(float *w, const float *g, float *m, float *v, size_t n, const dt_adamw_k *k) {
    if (n == 0) return DT_OK;
    adamw_kernel<<<dt_launch_blocks(n, DT_THREADS), DT_THREADS>>>(w, g, m, v, n, *k);
    DT_CUDA(cudaGetLastError());
    return DT_OK;
}

dt_status dt_gpu_sgd(float *w, const float *g, float *buf, size_t n, const dt_sgd_k *k) {
    if (n == 0) return DT_OK;
    sgd_kernel<<<dt_launch_blocks(n, DT_THREADS), DT_THREADS>>>(w, g, buf, n, *k);
    DT_CUDA(cudaGetLastError());
    return DT_OK;
}
