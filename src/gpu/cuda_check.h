/* Every CUDA call checked: DT_CUDA(call) returns its error, named with the
 * call and CUDA's words, from the enclosing function. A sticky error (an
 * illegal address kills the context) comes back from every later call.
 *
 * DT_LAUNCHED(kernel) follows every kernel launch: it returns the launch's
 * error (a bad configuration) naming the kernel, and with DTRAIN_CUDA_SYNC=1
 * in the environment it also waits for the kernel, so that an error the
 * kernel raises (an illegal address) is named with it rather than by a later
 * call (slow: for debugging; CUDA_LAUNCH_BLOCKING=1 makes the launches
 * synchronous too, but the error still surfaces at the next checked call). */
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

/* The kernels' stream: every kernel, copy, memset and library call of
 * the device goes to it (made with the device at dt_gpu_use; the legacy
 * default stream, 0, before), from whichever thread, in the order queued.
 * It waits for the legacy default stream and the other way (a blocking
 * stream), so nothing queued there by a library escapes its order; a step
 * is captured from it as a CUDA graph (dt_gpu_graph_*). */
extern cudaStream_t dt_cu_stream;

/* Set while a step captured as a CUDA graph is replayed (gpu.h's
 * dt_gpu_graph_replay): nothing is queued on the kernels' stream (the
 * graph has it all); every launch, copy, memset and library call that
 * queues work there checks it (DT_RUN, DT_QUEUE, the library calls). */
extern int dt_gpu_skipping;

/* Launches kernel k (a __global__ function or a pointer to one) on grid
 * g, blocks b, sh bytes of dynamic shared memory, on the kernels' stream
 * (not while replaying): k<<<g, b, sh, dt_cu_stream>>>(...); the form that
 * tests/gpu/cuda_emu.h runs on CPU threads too. */
#define DT_RUN(k, g, b, sh, ...)                                                                        \
    do {                                                                                                \
        if (!dt_gpu_skipping) k<<<g, b, sh, dt_cu_stream>>>(__VA_ARGS__);                               \
    } while (0)

/* DT_CUDA(call) for a call that queues work on the kernels' stream: not
 * made while replaying. */
#define DT_QUEUE(call)                                                                                  \
    do {                                                                                                \
        if (!dt_gpu_skipping) DT_CUDA(call);                                                            \
    } while (0)

/* The dynamic shared memory a block may ask for on this GPU (its opt-in
 * limit: 227 KiB on an H100 or H200; 0 where it cannot be asked), and a
 * kernel's launches let have `bytes` of it (past the default 48 KiB it is
 * asked for first). A kernel's dynamic shared array is declared
 * `DT_DYN_SHARED float sm[];` (the emulator's is a host array). */
static inline size_t dt_shared_optin(void) {
    int dev, optin = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess)
        return 0;
    return (size_t)optin;
}
template <typename K> static inline dt_status dt_shared_bytes(K kernel, size_t bytes) {
    if (bytes > 48 * 1024) DT_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
    return DT_OK;
}
#define DT_DYN_SHARED extern __shared__

/* The check after a launch of `kernel` (its name): DT_OK, or the error
 * recorded naming it (device.cu). */
dt_status dt_gpu_launched(const char *kernel);

#define DT_LAUNCHED(kernel)                                                                             \
    do {                                                                                                \
        dt_status dt_l_ = dt_gpu_launched(#kernel);                                                     \
        if (dt_l_ != DT_OK) return dt_l_;                                                               \
    } while (0)

/* Scratch for a call's own use: the device's one scratch buffer (the
 * calls' kernels all run on the kernels' stream, each call's before the
 * next call's, so every call can have all of it), made larger (outside a
 * graph's capture) when a call asks for more than any before; given back
 * with dt_gpu_scratch_free once the call's kernels are queued. A second
 * call's while the first holds it (another thread) comes from the
 * stream's pool (cudaMallocAsync). */
dt_status dt_gpu_scratch(void **p, size_t bytes);
void dt_gpu_scratch_free(void *p);

#endif
