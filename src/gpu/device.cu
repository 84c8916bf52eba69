/* The CUDA device: query, memory, copies (gpu.h). */
#include "gpu/cuda_check.h"
#include "gpu/gpu.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *dt_gpu_build(void) {
    static char b[64];
    snprintf(b, sizeof b, "CUDA %d.%d (sm_90 and its PTX)", CUDART_VERSION / 1000, CUDART_VERSION % 1000 / 10);
    return b;
}

int dt_gpu_count(char *why, size_t n) {
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        snprintf(why, n, "no usable GPU: %s (%s)", cudaGetErrorString(e), cudaGetErrorName(e));
        return 0;
    }
    if (count == 0) snprintf(why, n, "no usable GPU: the CUDA driver sees no device");
    return count;
}

dt_status dt_gpu_describe(int index, char *out, size_t n) {
    cudaDeviceProp p;
    DT_CUDA(cudaGetDeviceProperties(&p, index));
    snprintf(out, n, "%s, %.1f GiB, sm_%d%d", p.name, (double)p.totalGlobalMem / (1u << 30), p.major, p.minor);
    return DT_OK;
}

dt_status dt_gpu_use(int index) {
    DT_CUDA(cudaSetDevice(index));
    return DT_OK;
}

dt_status dt_gpu_alloc(void **dev, size_t bytes) {
    *dev = NULL;
    cudaError_t e = cudaMalloc(dev, bytes ? bytes : 1);
    if (e != cudaSuccess)
        return dt_error(e == cudaErrorMemoryAllocation ? DT_ERR_NOMEM : DT_ERR_INTERNAL,
                        "GPU: cudaMalloc of %zu bytes: %s", bytes, cudaGetErrorString(e));
    return DT_OK;
}

void dt_gpu_free(void *dev) {
    if (dev) cudaFree(dev);
}

dt_status dt_gpu_to_device(void *dev, const void *host, size_t bytes) {
    DT_CUDA(cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice));
    return DT_OK;
}

dt_status dt_gpu_to_host(void *host, const void *dev, size_t bytes) {
    DT_CUDA(cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost));
    return DT_OK;
}

dt_status dt_gpu_copy(void *dev_to, const void *dev_from, size_t bytes) {
    DT_CUDA(cudaMemcpy(dev_to, dev_from, bytes, cudaMemcpyDeviceToDevice));
    return DT_OK;
}

dt_status dt_gpu_memset0(void *dev, size_t bytes) {
    DT_CUDA(cudaMemset(dev, 0, bytes));
    return DT_OK;
}

dt_status dt_gpu_mem_info(size_t *free_bytes, size_t *total) {
    DT_CUDA(cudaMemGetInfo(free_bytes, total));
    return DT_OK;
}

dt_status dt_gpu_host_alloc(void **host, size_t bytes) {
    *host = NULL;
    cudaError_t e = cudaMallocHost(host, bytes ? bytes : 1);
    if (e != cudaSuccess)
        return dt_error(DT_ERR_NOMEM, "GPU: cudaMallocHost of %zu bytes (pinned host memory): %s", bytes,
                        cudaGetErrorString(e));
    return DT_OK;
}

void dt_gpu_host_free(void *host) {
    if (host) cudaFreeHost(host);
}

dt_status dt_gpu_sync(void) {
    DT_CUDA(cudaDeviceSynchronize());
    return DT_OK;
}

// The communication stream: non-blocking, so it waits for the default
// stream only where told (an event: the gradients' kernels queued so far).
dt_status dt_gpu_stream_create(void **stream) {
    cudaStream_t s = NULL;
    *stream = NULL;
    DT_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    *stream = (void *)s;
    return DT_OK;
}

void dt_gpu_stream_destroy(void *stream) {
    if (stream) cudaStreamDestroy((cudaStream_t)stream);
}

dt_status dt_gpu_stream_after_compute(void *stream) {
    cudaEvent_t ev;
    DT_CUDA(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    cudaError_t e = cudaEventRecord(ev, 0);
    if (e == cudaSuccess) e = cudaStreamWaitEvent((cudaStream_t)stream, ev, 0);
    cudaEventDestroy(ev);  // (released once the wait queued on it is done)
    DT_CUDA(e);
    return DT_OK;
}

dt_status dt_gpu_stream_query(void *stream, int *done) {
    cudaError_t e = cudaStreamQuery((cudaStream_t)stream);
    *done = e == cudaSuccess;
    if (e == cudaErrorNotReady) return DT_OK;
    DT_CUDA(e);
    return DT_OK;
}

dt_status dt_gpu_event_create(void **event) {
    cudaEvent_t ev = NULL;
    *event = NULL;
    DT_CUDA(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    *event = (void *)ev;
    return DT_OK;
}

void dt_gpu_event_destroy(void *event) {
    if (event) cudaEventDestroy((cudaEvent_t)event);
}

dt_status dt_gpu_event_record(void *event) {
    DT_CUDA(cudaEventRecord((cudaEvent_t)event, 0));
    return DT_OK;
}

dt_status dt_gpu_stream_wait_event(void *stream, void *event) {
    DT_CUDA(cudaStreamWaitEvent((cudaStream_t)stream, (cudaEvent_t)event, 0));
    return DT_OK;
}

// DTRAIN_CUDA_SYNC=1: every launch waited for (read once; cuda_check.h).
static int sync_each(void) {
    static int on = -1;  // (a race here writes the same value)
    if (on < 0) {
        const char *e = getenv("DTRAIN_CUDA_SYNC");
        on = e && e[0] && strcmp(e, "0") != 0;
    }
    return on;
}

dt_status dt_gpu_launched(const char *kernel) {
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess && sync_each()) e = cudaDeviceSynchronize();
    if (e != cudaSuccess)
        return dt_error(DT_ERR_INTERNAL, "GPU: %s%s: %s (%s)", kernel, sync_each() ? " (DTRAIN_CUDA_SYNC)" : "",
                        cudaGetErrorString(e), cudaGetErrorName(e));
    return DT_OK;
}

dt_status dt_gpu_scratch(void **p, size_t bytes) {
    *p = NULL;
    cudaError_t e = cudaMallocAsync(p, bytes ? bytes : 1, 0);
    if (e != cudaSuccess)
        return dt_error(e == cudaErrorMemoryAllocation ? DT_ERR_NOMEM : DT_ERR_INTERNAL,
                        "GPU: scratch of %zu bytes (cudaMallocAsync): %s", bytes, cudaGetErrorString(e));
    return DT_OK;
}

void dt_gpu_scratch_free(void *p) {
    if (p) cudaFreeAsync(p, 0);
}
