/* DT_HD marks arithmetic the CPU and the GPU share: a plain static inline
 * function in C, and compiled by nvcc a __host__ __device__ one, so that
 * one definition serves the CPU's loops and the GPU's kernels
 * (optim/elem.h, nn/rows.h). Such a function uses what both sides have:
 * float arithmetic, <math.h>'s functions, no globals. */
#ifndef DT_CORE_HD_H
#define DT_CORE_HD_H

#ifdef __CUDACC__
#define DT_HD __host__ __device__ __forceinline__
#else
#define DT_HD static inline
#endif

#endif
