/* A block's and a warp's reductions for the kernels (C++, nvcc only): a
 * fixed tree over the block's DT_THREADS threads or a warp's lanes, so the
 * same bits every run; and the rounding to a 16-bit type. */
#ifndef DT_GPU_BLOCK_H
#define DT_GPU_BLOCK_H

#include "core/bf16.h"
#include "gpu/launch.h"

#include <cuda_fp16.h>
#include <type_traits>

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

// s + x[0] + x[1] + ... + x[n - 1], added in that order (the CPU's loop)
// by thread 0, which alone gets it, from sh (DT_THREADS doubles) that the
// block's threads fill DT_THREADS values at a time (one thread's reads of
// memory, one after another, would each wait their own latency). Every
// thread of the block must call it.
__device__ static inline double ordered_sum(const double *x, size_t n, double s, double *sh) {
    for (size_t i0 = 0; i0 < n; i0 += DT_THREADS) {
        size_t k = n - i0 < DT_THREADS ? n - i0 : DT_THREADS;
        if (threadIdx.x < k) sh[threadIdx.x] = x[i0 + threadIdx.x];
        __syncthreads();
        if (threadIdx.x == 0)
            for (size_t i = 0; i < k; i++) s += sh[i];
        __syncthreads();
    }
    return s;
}

// The sum (or maximum) of v over the warp's lanes, every lane the same
// bits (a butterfly: each step combines the same two values on both sides).
template <bool MAX> __device__ static inline float warp_all(float v) {
    for (int m = 16; m > 0; m >>= 1) {
        float o = __shfl_xor_sync(0xffffffffu, v, m);
        v = MAX ? (o > v ? o : v) : v + o;
    }
    return v;
}

// Each warp's rows of a grid of whole warps: r = its index, then a grid's
// warps apart.
#define EACH_ROW(r, rows)                                                                                  \
    for (size_t r = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) / 32; r < (rows);                      \
         r += (size_t)gridDim.x * blockDim.x / 32)

// x rounded to a 16-bit type (H 1: bf16, 2: fp16; dt_gpu_from_f32's bits).
template <int H> __device__ static inline uint16_t narrow(float x) {
    return H == 1 ? dt_f32_to_bf16(x) : __half_as_ushort(__float2half_rn(x));
}

// A 16-bit value of type H as a float.
template <int H> __device__ static inline float widen(uint16_t h) {
    return H == 1 ? dt_bf16_to_f32(h) : __half2float(__ushort_as_half(h));
}

// fn(std::integral_constant<int, H>()) for h, launch.h's dt_launch_h16's
// H (0, 1 or 2): a kernel template launched at its 16-bit output's type,
// `DT_RUN((k<decltype(H)::value>), ...)` in fn.
template <typename F> static inline void dt_with_h16(int h, F fn) {
    if (h == 1) fn(std::integral_constant<int, 1>());
    else if (h == 2) fn(std::integral_constant<int, 2>());
    else fn(std::integral_constant<int, 0>());
}

// x rounded to the products' type, as a float (H 1, 2: 16 bits; H 0, fp32,
// and 3, tf32, whose fragments round their elements as they are loaded:
// x itself).
template <int H> __device__ static inline float rounded(float x) {
    return H == 1 || H == 2 ? widen<H>(narrow<H>(x)) : x;
}

#endif
