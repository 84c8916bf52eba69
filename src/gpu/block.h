/* A block's reductions for the kernels (C++, nvcc only): a fixed tree
 * over the block's DT_THREADS threads, so the same bits every run. */
#ifndef DT_GPU_BLOCK_H
#define DT_GPU_BLOCK_H

#include "gpu/launch.h"

// The block's sum of v (every thread gets it): sh holds DT_THREADS values,
// blockDim.x == DT_THREADS (a power of two). Every thread of the block
// must call it.
template <typename T> __device__ static inline T block_sum(T v, T *sh) {
    sh[threadIdx.x] = v;
    __syncthreads();
    for (unsigned s = DT_THREADS / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) sh[threadIdx.x] += sh[threadIdx.x + s];
        __syncthreads();
    }
    T r = sh[0];
    __syncthreads();  // (before sh is written again)
    return r;
}

// The block's maximum, as the CPU's loop: a NaN never wins.
__device__ static inline float block_max(float v, float *sh) {
    sh[threadIdx.x] = v;
    __syncthreads();
    for (unsigned s = DT_THREADS / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) sh[threadIdx.x] = sh[threadIdx.x + s] > sh[threadIdx.x] ? sh[threadIdx.x + s] : sh[threadIdx.x];
        __syncthreads();
    }
    float r = sh[0];
    __syncthreads();
    return r;
}

#endif
