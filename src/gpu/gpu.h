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
/* Waits for every launch so far; an error a kernel raised is named here. */
dt_status dt_gpu_sync(void);

/* The optimizers over n elements of device blocks, the CPU's rules
 * (optim/elem.h) with the constants the host computed. m, v, buf: the
 * state (buf NULL: SGD without momentum). */
dt_status dt_gpu_adamw(float *w, const float *g, float *m, float *v, size_t n, const dt_adamw_k *k);
dt_status dt_gpu_sgd(float *w, const float *g, float *buf, size_t n, const dt_sgd_k *k);

/* cuDNN and NCCL, loaded at run time (never linked; src/gpu/dl.c, every
 * build): `which` "cudnn" (libcudnn.so.9, 9.x) or "nccl" (libnccl.so.2,
 * 2.18 or later). Looked for where DTRAIN_CUDNN / DTRAIN_NCCL say (that
 * file only), else on the loader's path, else in PyTorch's packages
 * (nvidia/cudnn/lib, nvidia/nccl/lib under a Python site). A library not
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
