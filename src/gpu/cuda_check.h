/* Every CUDA call checked: DT_CUDA(call) returns its error, named with the
 * call and CUDA's words, from the enclosing function. A sticky error (an
 * illegal address kills the context) comes back from every later call. */
#ifndef DT_GPU_CUDA_CHECK_H
#define DT_GPU_CUDA_CHECK_H

#include "dtrain/core.h"

#include <cuda_runtime.h>

#define DT_CUDA(call)                                                                                   \
    do {                                                                                                \
        cudaError_t dt_e_ = (call);                                                                     \
        if (dt_e_ != cudaSuccess)                                                                       \
            return dt_error(DT_ERR_INTERNAL, "GPU: %s: %s (%s)", #call, cudaGetErrorString(dt_e_),      \
                            cudaGetErrorName(dt_e_));                                                   \
    } while (0)

#endif
