/* CUDA kernels on CPU threads, for tests on machines without a GPU
 * (tests/gpu/test_gpu_emu.c): a kernel source compiled as C++ with
 * DT_CUDA_EMU defined includes this header in place of gpu/cuda_check.h.
 * A launch (DT_RUN) runs the grid's blocks one after another, each as
 * blockDim.x threads of its own (pthreads) sharing one block of shared
 * memory (`extern __shared__ ... sm[]`, filled with NaNs before each
 * block, so a read of a value no thread wrote shows); __syncthreads and
 * __syncwarp are barriers over the block's and the warp's threads, a
 * shuffle an exchange through the warp's slots between two warp barriers.
 * A barrier some thread never reaches (a __syncthreads or a shuffle in
 * divergent code) is named and the process aborted after 20 s instead of
 * hanging. What it does not find: data races (the threads run truly
 * concurrently, so one may show as a wrong number, or not), and anything
 * about the GPU's own arithmetic (libm's expf is not CUDA's). */
#ifndef DT_TESTS_CUDA_EMU_H
#define DT_TESTS_CUDA_EMU_H

#include "dtrain/core.h"

#include <cuda_fp16.h>  // (host versions of the conversions; host_defines.h: __device__ and the rest empty)
#include <functional>
#include <vector_functions.h>
#include <vector_types.h>

#define __launch_bounds__(...)

extern thread_local dim3 threadIdx, blockIdx;
extern dim3 blockDim, gridDim;
extern float sm[];  // the block's dynamic shared memory (blocks run one at a time)
#define DT_EMU_SHARED_FLOATS (1u << 16)

void __syncthreads();
void __syncwarp(unsigned mask = 0xffffffffu);
float __shfl_sync(unsigned mask, float v, int lane);
float __shfl_xor_sync(unsigned mask, float v, int lane_mask);
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline int min(int a, int b) { return a < b ? a : b; }

/* Runs fn as the kernel of grid g, blocks of b.x threads (a multiple of 32;
 * b.y = b.z = 1), `shared` bytes of dynamic shared memory. */
void dt_emu_launch(dim3 g, dim3 b, size_t shared, const std::function<void()> &fn);

#define DT_RUN(k, g, b, sh, ...) dt_emu_launch(g, b, sh, [=] { k(__VA_ARGS__); })
#define DT_LAUNCHED(kernel) ((void)0)
#define DT_CUDA(call) ((void)0)

#endif
