/* One cuBLASLt matmul with an epilogue, for the .cu files beside gemm.cu
 * (the GEMM's and the linear layer's): cuBLASLt is loaded and set up there.
 * C++ (nvcc) only. */
#ifndef DT_GPU_LT_H
#define DT_GPU_LT_H

#include "dtrain/core.h"
#include "gpu/gemm_args.h"

#include <cublasLt.h>

/* C = epilogue(alpha op(first) op(second) + beta C) in column-major terms
 * (g: dt_gemm_colmajor's call; first and second as it says), fp32
 * accumulation and output; first and second of type ab (CUDA_R_32F,
 * TF32 after dt_gpu_set_tf32(1), or CUDA_R_16BF). bias [g->m]: the BIAS
 * epilogues' vector, added to every column; aux (aux_ld apart, a multiple
 * of 8): GELU_AUX's output, DGELU's input, shaped as C. batch > 1: a
 * strided batch, matrix i at first + i stride_first elements (second's
 * and C's likewise; no epilogue). */
typedef struct {
    const dt_cm_gemm *g;
    cudaDataType_t ab;
    cublasLtEpilogue_t epilogue;
    const float *bias;
    float *aux;
    int aux_ld;
    float alpha, beta;
    const void *first, *second;
    float *C;
    int batch;
    long long stride_first, stride_second, stride_c;
} dt_lt_op;

/* The operands' cuBLASLt type for t (DT_F32, DT_BF16, DT_F16). */
static inline cudaDataType_t dt_lt_type(dt_dtype t) {
    return t == DT_BF16 ? CUDA_R_16BF : t == DT_F16 ? CUDA_R_16F : CUDA_R_32F;
}

/* Runs o; *found 0 (and nothing run, DT_OK) when cuBLASLt has no algorithm
 * for it (its heuristic finds none or answers NOT_SUPPORTED: an epilogue
 * with this layout), for the caller's plain path. */
dt_status dt_gpu_lt_run(const dt_lt_op *o, int *found);

#endif
