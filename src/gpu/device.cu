/* The CUDA device: query, memory, copies (gpu.h). */
#include "gpu/cuda_check.h"
#include "gpu/gpu.h"

#include <pthread.h>
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

cudaStream_t dt_cu_stream;
int dt_gpu_skipping;

// ---- a step as a CUDA graph (gpu.h) ----------------------------------------------
// mode: 0 none, CAPTURING (the stream captured into graph), REPLAYING (the
// launch sites skip: dt_gpu_skipping); exec: the graph made at the first
// run, launched at each.
enum { CAPTURING = 1, REPLAYING = 2 };
static struct {
    int mode;
    cudaGraph_t graph;
    cudaGraphExec_t exec;
} g_graph;

// A call that waits for the GPU is an error inside a captured or replayed
// step (CUDA refuses it while capturing; replayed, it would wait for work
// not yet queued).
#define TRY_UNGRAPHED(what)                                                                             \
    do {                                                                                                \
        if (g_graph.mode)                                                                               \
            return dt_error(DT_ERR_INTERNAL, "GPU: %s inside a step %s as a CUDA graph", what,            \
                            g_graph.mode == CAPTURING ? "being captured" : "replayed");                 \
    } while (0)

static void scratch_retired_free(void);

void dt_gpu_graph_drop(void) {
    if (g_graph.mode == CAPTURING) {  // (a capture given up: ended, its graph freed)
        cudaGraph_t g = NULL;
        cudaStreamEndCapture(dt_cu_stream, &g);
        if (g) cudaGraphDestroy(g);
        cudaGetLastError();
    }
    if (g_graph.exec) cudaGraphExecDestroy(g_graph.exec);
    if (g_graph.graph) cudaGraphDestroy(g_graph.graph);
    scratch_retired_free();
    g_graph.exec = NULL, g_graph.graph = NULL, g_graph.mode = 0;
    dt_gpu_skipping = 0;
}

dt_status dt_gpu_graph_capture(void) {
    dt_gpu_graph_drop();
    DT_CUDA(cudaStreamBeginCapture(dt_cu_stream, cudaStreamCaptureModeRelaxed));
    g_graph.mode = CAPTURING;
    return DT_OK;
}

dt_status dt_gpu_graph_replay(void) {
    if (g_graph.mode || !g_graph.exec)
        return dt_error(DT_ERR_INTERNAL, "GPU: a replay of a step's graph %s", g_graph.mode ? "inside another" : "never made");
    g_graph.mode = REPLAYING;
    dt_gpu_skipping = 1;
    return DT_OK;
}

// The capture's end (its graph made: an error names CUDA's reason, the
// capture dropped) or the replay's, then the graph queued.
dt_status dt_gpu_graph_run(void) {
    int mode = g_graph.mode;
    g_graph.mode = 0;
    dt_gpu_skipping = 0;
    if (mode == CAPTURING) {
        cudaError_t e = cudaStreamEndCapture(dt_cu_stream, &g_graph.graph);
        if (e == cudaSuccess) e = cudaGraphInstantiateWithFlags(&g_graph.exec, g_graph.graph, 0);
        if (e != cudaSuccess) {
            cudaGetLastError();  // (said here, not by the next call's check)
            dt_gpu_graph_drop();
            return dt_error(DT_ERR_INTERNAL, "GPU: the step's capture as a CUDA graph: %s (%s)", cudaGetErrorString(e),
                            cudaGetErrorName(e));
        }
    } else if (mode != REPLAYING || !g_graph.exec) {
        return dt_error(DT_ERR_INTERNAL, "GPU: a step's graph run outside a capture or a replay");
    }
    DT_CUDA(cudaGraphLaunch(g_graph.exec, dt_cu_stream));
    return DT_OK;
}

// The kernels' stream of each device, made at its first use (the
// process's threads all use the device its main thread took).
dt_status dt_gpu_use(int index) {
    static cudaStream_t made[64];
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    if (index < 0 || index >= 64) return dt_error(DT_ERR_ARG, "GPU: cuda:%d: at most 64 GPUs", index);
    DT_CUDA(cudaSetDevice(index));
    pthread_mutex_lock(&mu);
    cudaError_t e = made[index] ? cudaSuccess : cudaStreamCreateWithFlags(&made[index], cudaStreamDefault);
    if (e == cudaSuccess) dt_cu_stream = made[index];
    pthread_mutex_unlock(&mu);
    DT_CUDA(e);
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
    TRY_UNGRAPHED("a copy to the GPU that waits for it (to_device)");
    DT_CUDA(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, dt_cu_stream));
    DT_CUDA(cudaStreamSynchronize(dt_cu_stream));
    return DT_OK;
}

dt_status dt_gpu_to_device_async(void *dev, const void *host, size_t bytes) {
    DT_QUEUE(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, dt_cu_stream));
    return DT_OK;
}

static unsigned long long g_reads;  // (to_host's calls; the host thread's alone)

uint64_t dt_gpu_reads(void) { return __atomic_load_n(&g_reads, __ATOMIC_RELAXED); }

dt_status dt_gpu_to_host(void *host, const void *dev, size_t bytes) {
    TRY_UNGRAPHED("a read from the GPU (to_host)");
    __atomic_fetch_add(&g_reads, 1ULL, __ATOMIC_RELAXED);
    DT_CUDA(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, dt_cu_stream));
    DT_CUDA(cudaStreamSynchronize(dt_cu_stream));
    return DT_OK;
}

dt_status dt_gpu_copy(void *dev_to, const void *dev_from, size_t bytes) {
    DT_QUEUE(cudaMemcpyAsync(dev_to, dev_from, bytes, cudaMemcpyDeviceToDevice, dt_cu_stream));
    return DT_OK;
}

dt_status dt_gpu_memset0(void *dev, size_t bytes) {
    DT_QUEUE(cudaMemsetAsync(dev, 0, bytes, dt_cu_stream));
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
    TRY_UNGRAPHED("a wait for the GPU (sync)");
    DT_CUDA(cudaDeviceSynchronize());
    return DT_OK;
}

// The communication stream: non-blocking, so it waits for the kernels'
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
    cudaError_t e = cudaEventRecord(ev, dt_cu_stream);
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

// (not inside a captured or replayed step: its host waits are the step's
// end; the event keeps its last mark, which has run by then)
dt_status dt_gpu_event_record(void *event) {
    if (g_graph.mode) return DT_OK;
    DT_CUDA(cudaEventRecord((cudaEvent_t)event, dt_cu_stream));
    return DT_OK;
}

dt_status dt_gpu_event_query(void *event, int *done) {
    cudaError_t e = cudaEventQuery((cudaEvent_t)event);
    *done = e == cudaSuccess;
    if (e == cudaErrorNotReady) return DT_OK;
    DT_CUDA(e);
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
    if (e == cudaSuccess && sync_each() && !g_graph.mode) e = cudaDeviceSynchronize();  // (a graph's: at its run)
    if (e != cudaSuccess)
        return dt_error(DT_ERR_INTERNAL, "GPU: %s%s: %s (%s)", kernel, sync_each() ? " (DTRAIN_CUDA_SYNC)" : "",
                        cudaGetErrorString(e), cudaGetErrorName(e));
    return DT_OK;
}

// The device's scratch buffer (one device a process: dt_gpu_use's first,
// which every thread uses), made as large as a run's plan asks before its
// first step (dt_gpu_scratch_reserve). A buffer made too small is kept
// while a graph may still point into it (given back with the graph:
// dt_gpu_graph_drop). allocs: the calls since a reservation that allocated
// (a shape the plan did not count, or a second thread's call).
static struct {
    pthread_mutex_t mu;
    void *p, *old[16];
    size_t cap;
    int held, nold, reserved;
    uint64_t allocs;
} g_scratch = {PTHREAD_MUTEX_INITIALIZER, NULL, {NULL}, 0, 0, 0, 0, 0};

size_t dt_gpu_scratch_bytes(uint64_t *allocs) {
    pthread_mutex_lock(&g_scratch.mu);
    size_t cap = g_scratch.cap;
    if (allocs) *allocs = g_scratch.allocs;
    pthread_mutex_unlock(&g_scratch.mu);
    return cap;
}

// (the graph's memory given back: the buffers it may point into too)
static void scratch_retired_free(void) {
    pthread_mutex_lock(&g_scratch.mu);
    for (int i = 0; i < g_scratch.nold; i++) cudaFree(g_scratch.old[i]);
    g_scratch.nold = 0;
    pthread_mutex_unlock(&g_scratch.mu);
}

// The buffer made `bytes` long (outside a capture; the old one given back
// once the kernels queued have run, or kept for a graph that may use it).
static dt_status scratch_grow(size_t bytes) {
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess)
        return dt_error(e == cudaErrorMemoryAllocation ? DT_ERR_NOMEM : DT_ERR_INTERNAL,
                        "GPU: scratch of %zu bytes (cudaMalloc): %s", bytes, cudaGetErrorString(e));
    if (g_scratch.p && g_graph.exec) g_scratch.old[g_scratch.nold++] = g_scratch.p;
    else if (g_scratch.p) cudaFree(g_scratch.p);  // (waits for the kernels queued)
    g_scratch.p = p, g_scratch.cap = bytes;
    return DT_OK;
}

// Whether the buffer may be made larger now (its lock held): no call holds
// it, no capture is on (a grown buffer there would be the graph's own
// allocation), and a graph keeps fewer old ones than it may.
static int scratch_may_grow(void) {
    return !g_scratch.held && g_graph.mode != CAPTURING && (!g_graph.exec || g_scratch.nold < 16);
}

dt_status dt_gpu_scratch_reserve(size_t bytes) {
    pthread_mutex_lock(&g_scratch.mu);
    dt_status st = DT_OK;
    if (bytes > g_scratch.cap && !scratch_may_grow())
        st = dt_error(DT_ERR_INTERNAL, "GPU: scratch of %zu bytes reserved while a call holds it or a graph is made",
                      bytes);
    else if (bytes > g_scratch.cap)
        st = scratch_grow((bytes + 255) / 256 * 256);
    if (st == DT_OK) g_scratch.reserved = 1;
    pthread_mutex_unlock(&g_scratch.mu);
    return st;
}

dt_status dt_gpu_scratch(void **p, size_t bytes) {
    *p = NULL;
    if (dt_gpu_skipping) return DT_OK;  // (*p NULL: read only by the calls the replay skips)
    bytes = bytes ? bytes : 1;
    pthread_mutex_lock(&g_scratch.mu);
    dt_status st = DT_OK;
    // (the buffer's, unless another call holds it or it cannot grow now: the stream's pool's then)
    int grow = bytes > g_scratch.cap;
    if (grow ? scratch_may_grow() : !g_scratch.held) {
        if (grow) st = scratch_grow((bytes + 255) / 256 * 256);
        if (st == DT_OK) *p = g_scratch.p, g_scratch.held = 1;
    }
    g_scratch.allocs += g_scratch.reserved && (grow || !*p);  // (an allocation after the plan's)
    pthread_mutex_unlock(&g_scratch.mu);
    if (st != DT_OK || *p) return st;
    cudaError_t e = cudaMallocAsync(p, bytes, dt_cu_stream);
    if (e != cudaSuccess)
        return dt_error(e == cudaErrorMemoryAllocation ? DT_ERR_NOMEM : DT_ERR_INTERNAL,
                        "GPU: scratch of %zu bytes (cudaMallocAsync): %s", bytes, cudaGetErrorString(e));
    return DT_OK;
}

void dt_gpu_scratch_free(void *p) {
    if (!p) return;
    pthread_mutex_lock(&g_scratch.mu);
    int mine = p == g_scratch.p && g_scratch.held;
    if (mine) g_scratch.held = 0;
    pthread_mutex_unlock(&g_scratch.mu);
    if (!mine && !dt_gpu_skipping) cudaFreeAsync(p, dt_cu_stream);
}

// ---- memory backed on demand: CUDA's virtual memory management ----------------
//
// The driver's cuMem* calls, reached through the runtime
// (cudaGetDriverEntryPointByVersion), so that the binary links no libcuda
// of its own. A range is reserved; each vm_map creates physical memory on
// the current device, maps it and lets the device read and write it, the
// handle released at once (the memory goes with its mapping's vm_unmap).

#include <cuda.h>

static struct {
    int ok;
    CUresult (*gran)(size_t *, const CUmemAllocationProp *, CUmemAllocationGranularity_flags);
    CUresult (*reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
    CUresult (*addr_free)(CUdeviceptr, size_t);
    CUresult (*create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
    CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
    CUresult (*access)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
    CUresult (*unmap)(CUdeviceptr, size_t);
    CUresult (*release)(CUmemGenericAllocationHandle);
} vmm;

static dt_status vmm_find(void) {
    if (vmm.ok) return DT_OK;
    const char *names[] = {"cuMemGetAllocationGranularity", "cuMemAddressReserve", "cuMemAddressFree", "cuMemCreate",
                           "cuMemMap", "cuMemSetAccess", "cuMemUnmap", "cuMemRelease"};
    void **slots[] = {(void **)&vmm.gran, (void **)&vmm.reserve, (void **)&vmm.addr_free, (void **)&vmm.create,
                      (void **)&vmm.map, (void **)&vmm.access, (void **)&vmm.unmap, (void **)&vmm.release};
    for (int i = 0; i < 8; i++) {
        cudaDriverEntryPointQueryResult q;
#if CUDART_VERSION >= 12050
        cudaError_t e = cudaGetDriverEntryPointByVersion(names[i], slots[i], 12000, cudaEnableDefault, &q);
#else
        cudaError_t e = cudaGetDriverEntryPoint(names[i], slots[i], cudaEnableDefault, &q);
#endif
        if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || !*slots[i])
            return dt_error(DT_ERR_INTERNAL, "GPU: the driver's %s (virtual memory management) was not found: %s",
                            names[i], cudaGetErrorString(e));
    }
    vmm.ok = 1;
    return DT_OK;
}

static dt_status vmm_prop(CUmemAllocationProp *p) {
    int dev = 0;
    DT_CUDA(cudaGetDevice(&dev));
    memset(p, 0, sizeof *p);
    p->type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p->location.id = dev;
    return DT_OK;
}

#define DT_CU(call, what)                                                                              \
    do {                                                                                               \
        CUresult r_ = (call);                                                                          \
        if (r_ != CUDA_SUCCESS)                                                                        \
            return dt_error(r_ == CUDA_ERROR_OUT_OF_MEMORY ? DT_ERR_NOMEM : DT_ERR_INTERNAL,           \
                            "GPU: %s (%zu bytes): CUDA driver error %d", what, bytes, (int)r_);        \
    } while (0)

dt_status dt_gpu_vm_reserve(void **dev, size_t bytes, size_t *gran) {
    CUmemAllocationProp p;
    CUdeviceptr at = 0;
    *dev = NULL;
    dt_status st = vmm_find();
    if (st == DT_OK) st = vmm_prop(&p);
    if (st != DT_OK) return st;
    DT_CU(vmm.gran(gran, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM), "cuMemGetAllocationGranularity");
    size_t len = (bytes + *gran - 1) / *gran * *gran;
    DT_CU(vmm.reserve(&at, len, *gran, 0, 0), "cuMemAddressReserve");
    *dev = (void *)at;
    return DT_OK;
}

dt_status dt_gpu_vm_map(void *dev, size_t bytes) {
    CUmemAllocationProp p;
    CUmemGenericAllocationHandle h;
    dt_status st = vmm_prop(&p);
    if (st != DT_OK) return st;
    DT_CU(vmm.create(&h, bytes, &p, 0), "cuMemCreate");
    CUresult r = vmm.map((CUdeviceptr)dev, bytes, 0, h, 0);
    vmm.release(h);  // (the memory lives on in its mapping)
    DT_CU(r, "cuMemMap");
    CUmemAccessDesc a = {};
    a.location = p.location;
    a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    r = vmm.access((CUdeviceptr)dev, bytes, &a, 1);
    if (r != CUDA_SUCCESS) vmm.unmap((CUdeviceptr)dev, bytes);  // (backed but unusable: not left mapped)
    DT_CU(r, "cuMemSetAccess");
    return DT_OK;
}

dt_status dt_gpu_vm_unmap(void *dev, size_t bytes) {
    DT_CU(vmm.unmap((CUdeviceptr)dev, bytes), "cuMemUnmap");
    return DT_OK;
}

void dt_gpu_vm_free(void *dev, size_t bytes) {
    size_t gran = 0;
    CUmemAllocationProp p;
    if (!dev || vmm_prop(&p) != DT_OK || vmm.gran(&gran, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM) != CUDA_SUCCESS) return;
    vmm.addr_free((CUdeviceptr)dev, (bytes + gran - 1) / gran * gran);
}
