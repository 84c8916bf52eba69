/* The GPU device: what a CUDA build offers the engine (docs/gpu.md).
 * The .cu files of src/gpu/ implement it where CMake finds the CUDA toolkit; elsewhere
 * src/gpu/none.c answers that this build has none. Pointers called `dev`
 * are device memory: the host never reads them. Every CUDA call is
 * checked; an error names the call and CUDA's words for it. */
#ifndef DT_GPU_H
#define DT_GPU_H

#include "dtrain/core.h"
#include "optim/elem.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What this build was compiled for: "CUDA 13.0 (sm_90 and its PTX)", or
 * "no CUDA device in this build". */
const char *dt_gpu_build(void);
/* The usable GPUs: their count, or 0 with the reason in why[n] (no CUDA in
 * this build; no driver or one too old for this build's runtime: CUDA's
 * own words; no device). */
int dt_gpu_count(char *why, size_t n);
/* Device `index`'s name and memory ("NVIDIA H100 80GB HBM3, 79.2 GiB,
 * sm_90") into out[n]. */
dt_status dt_gpu_describe(int index, char *out, size_t n);
dt_status dt_gpu_use(int index);

dt_status dt_gpu_alloc(void **dev, size_t bytes);
void dt_gpu_free(void *dev);
dt_status dt_gpu_to_device(void *dev, const void *host, size_t bytes);
dt_status dt_gpu_to_host(void *host, const void *dev, size_t bytes);
dt_status dt_gpu_copy(void *dev_to, const void *dev_from, size_t bytes);
dt_status dt_gpu_memset0(void *dev, size_t bytes);
/* The current device's free and total memory. */
dt_status dt_gpu_mem_info(size_t *free_bytes, size_t *total);
/* Page-locked host memory (cudaMallocHost): the copies' pinned buffers. */
dt_status dt_gpu_host_alloc(void **host, size_t bytes);
void dt_gpu_host_free(void *host);
/* Waits for every launch so far; an error a kernel raised is named here. */
dt_status dt_gpu_sync(void);

/* The optimizers over n elements of device blocks, the CPU's rules
 * (optim/elem.h) with the constants the host computed. m, v, buf: the
 * state (buf NULL: SGD without momentum). */
dt_status dt_gpu_adamw(float *w, const float *g, float *m, float *v, size_t n, const dt_adamw_k *k);
dt_status dt_gpu_sgd(float *w, const float *g, float *buf, size_t n, const dt_sgd_k *k);

/* C = alpha op(A) op(B) + beta C on device blocks: dt_sgemm's row-major
 * contract (ta, tb: A, B transposed; lda, ldb, ldc the row strides), by
 * cuBLASLt (loaded at the first call) in fp32, or TF32 after
 * dt_gpu_set_tf32(1) (the inputs rounded to 10 bits of mantissa, fp32
 * sums). beta 0: C is not read. */
dt_status dt_gpu_sgemm(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                       int ldb, float beta, float *C, int ldc);
void dt_gpu_set_tf32(int on);

/* The GPT's layers on device blocks, the CPU's contracts (dtrain/nn.h:
 * backward accumulates with +=) over N rows, each element's arithmetic
 * nn/rows.h's; a row's sums in a block's fixed tree (the CPU's in order).
 * Layernorm over rows of C (mean, rstd [N]); dinp, dw or db NULL: not
 * computed. */
dt_status dt_gpu_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *w,
                                   const float *b, size_t N, int C, float eps);
dt_status dt_gpu_layernorm_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                                    const float *w, const float *mean, const float *rstd, size_t N, int C);
/* GELU (tanh approximation) over n elements. */
dt_status dt_gpu_gelu_forward(float *out, const float *inp, size_t n);
dt_status dt_gpu_gelu_backward(float *dinp, const float *dout, const float *inp, size_t n);
/* Softmax cross-entropy over N rows of V logits stored ld apart (ld >= V: a
 * padded vocabulary's columns past V are neither read nor written): probs
 * as the logits; row_loss [N] (doubles) each row's loss, *loss (one float,
 * device) their mean in order. A target outside [0, V) gives a NaN loss.
 * Backward: dlogits += (probs - onehot) dloss / N. */
dt_status dt_gpu_crossentropy_forward(float *probs, double *row_loss, float *loss, const float *logits,
                                      const int32_t *targets, size_t N, int V, size_t ld);
dt_status dt_gpu_crossentropy_backward(float *dlogits, const float *probs, const int32_t *targets, size_t N, int V,
                                       size_t ld, float dloss);

/* cuBLASLt, cuDNN and NCCL, loaded at run time (never linked;
 * src/gpu/dl.c, every build): `which` "cublaslt" (libcublasLt.so.<the
 * build's CUDA major>, that major), "cudnn" (libcudnn.so.9, 9.x) or "nccl"
 * (libnccl.so.2, 2.18 or later). Looked for where DTRAIN_CUBLASLT /
 * DTRAIN_CUDNN / DTRAIN_NCCL say (that file only), else on the loader's
 * path, else in PyTorch's packages (nvidia/cublas/lib, nvidia/cudnn/lib,
 * nvidia/nccl/lib under a Python site). A library not
 * found, not loadable, not the library or of another version is an error
 * naming the file and the version. */
typedef struct {
    void *handle;
    char path[1024];
    long version;  // major*10000 + minor*100 + patch
} dt_gpu_lib;
dt_status dt_gpu_lib_open(const char *which, dt_gpu_lib *out);
void *dt_gpu_lib_sym(const dt_gpu_lib *lib, const char *name);
void dt_gpu_lib_close(dt_gpu_lib *lib);

#ifdef __cplusplus
}
#endif
#endif
