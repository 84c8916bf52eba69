/* src/gpu/attention.cu's kernels (the GEMM plan's softmax and its
 * backward) on CPU threads (cuda_emu.h, emu_host.h), under names of their
 * own beside the library's; its strided batches of GEMMs (cuBLASLt's on a
 * GPU) the CPU's dt_sgemm and dt_gemm16 here, on the operands att_plan.c
 * gives them. */
#define DT_CUDA_EMU 1
#include "cuda_emu.h"
#include "emu_host.h"
#include "emu_names.h"
#include "gpu/attention.cu"
extern "C" {
#include "kernels/kernels.h"
}

dt_status dt_gpu_gemm_batched(dt_dtype t, int ta, int tb, int M, int N, int K, float alpha, const void *A, int lda,
                              long long sa, const void *B, int ldb, long long sb, float beta, float *C, int ldc,
                              long long sc, int batch) {
    size_t es = t == DT_F32 ? sizeof(float) : sizeof(uint16_t);
    for (int i = 0; i < batch; i++) {
        const char *a = (const char *)A + (size_t)(i * sa) * es, *b = (const char *)B + (size_t)(i * sb) * es;
        if (t == DT_F32)
            dt_sgemm(ta, tb, M, N, K, alpha, (const float *)a, lda, (const float *)b, ldb, beta, C + i * sc, ldc);
        else
            dt_gemm16(t, ta, tb, M, N, K, alpha, a, lda, b, ldb, beta, C + i * sc, ldc);
    }
    return DT_OK;
}
