/* dtrain's simulated GPU (dev.h), chosen by DTRAIN_GPU=sim, in every build:
 * a device whose memory the host cannot touch outside its ops. Each
 * allocation is its own mmap, kept PROT_NONE; an op makes every one of them
 * readable and writable, runs the CPU's kernel on them (its twin) and
 * protects them again, so a host read of a device pointer anywhere else
 * dies with SIGSEGV. A run takes one arena, so an op flips one region.
 * DTRAIN_GPU_SIM_MEM (a size: "2G") is the device's memory; else what the
 * host has available. DTRAIN_GPU_SIM_DEVICES (1 to 16, default 1): how many
 * GPUs the machine seems to have (cuda:0, cuda:1, ...: each process has its
 * own simulated memory whichever it uses), so that ranks can take one GPU
 * each as on a machine of several. */
#include "core/fixed.h"
#include "dtrain/gpt.h"
#include "dtrain/nn.h"
#include "dtrain/optim.h"
#include "gpu/att_plan.h"
#include "gpu/dev.h"
#include "gpu/launch.h"
#include "kernels/kernels.h"
#include "nn/rows.h"
#include "gpu/dev_sim_rec.h"

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

enum { MAX_REGIONS = 64 };

// Memory backed on demand (vm_reserve) comes in chunks of VM_GRAN bytes
// (CUDA's is the driver's granularity, 2 MiB on an H100: smaller here so
// that small models show it).
enum { VM_GRAN = 64 << 10 };

static struct {
    pthread_mutex_t mu;
    void *at[MAX_REGIONS];
    size_t len[MAX_REGIONS];
    unsigned char *vm[MAX_REGIONS];  // a vm_reserve's: per chunk, backed (else NULL)
    int open;  // ops inside one another (a twin that calls another op)
} g = {.mu = PTHREAD_MUTEX_INITIALIZER};

// Region i opened (prot) or shut; a vm_reserve's chunks not backed stay
// shut, so that a kernel touching them dies.
static void protect_region(int i, int prot) {
    if (!g.vm[i] || prot == PROT_NONE) {
        if (mprotect(g.at[i], g.len[i], prot) != 0) abort();  // (a region of ours: cannot fail)
        return;
    }
    size_t n = g.len[i] / VM_GRAN;
    for (size_t c = 0; c < n;) {
        if (!g.vm[i][c]) {
            c++;
            continue;
        }
        size_t e = c;  // (a run of backed chunks: one call)
        while (e < n && g.vm[i][e]) e++;
        if (mprotect((char *)g.at[i] + c * VM_GRAN, (e - c) * VM_GRAN, prot) != 0) abort();
        c = e;
    }
}

static void protect(int prot) {
    for (int i = 0; i < MAX_REGIONS; i++)
        if (g.at[i]) protect_region(i, prot);
}

// The bytes region i holds in memory (a vm_reserve's: its chunks backed).
static size_t held(int i) {
    if (!g.vm[i]) return g.len[i];
    size_t b = 0;
    for (size_t c = 0; c < g.len[i] / VM_GRAN; c++) b += g.vm[i][c] ? VM_GRAN : 0;
    return b;
}

// ---- a step as a graph (dev.h's graph_capture and the rest) ---------------
// Each op that queues work starts with REC(op, its arguments): while a
// step is captured, the call is kept (its arguments in dev_sim_rec.h's
// struct, scripts/sim_rec.py's) instead of run; while one is replayed, it
// is compared with the call kept at its place and skipped: another op or
// other arguments is an error (a CUDA graph would run the captured ones;
// an argument that points to host memory, a geometry, is compared by its
// address: its contents must not change from step to step);
// graph_run runs the kept calls in order, as a CUDA graph does (a copy
// reads its pinned host memory then). Any other op inside either (one
// without REC) aborts: it would run at once, which a graph's does not.
enum { REC_NONE, REC_CAPTURE, REC_REPLAY };
typedef struct {
    const char *op;
    dt_status (*run)(const void *args);
    void *args;
    size_t size;
} rec_call;
static struct {
    int mode, running;  // running: graph_run's calls, run as they come
    rec_call *calls;
    size_t n, cap, at;  // at: the replay's place among the n kept
} g_rec;

static void rec_free(void) {
    for (size_t i = 0; i < g_rec.n; i++) free(g_rec.calls[i].args);
    free(g_rec.calls);
    g_rec = (__typeof__(g_rec)){0};
}

static dt_status rec_keep(const char *op, dt_status (*run)(const void *), const void *args, size_t size) {
    if (g_rec.mode == REC_REPLAY) {
        const rec_call *c = g_rec.at < g_rec.n ? &g_rec.calls[g_rec.at] : NULL;
        if (!c || strcmp(c->op, op) || c->size != size || memcmp(c->args, args, size))
            return dt_error(DT_ERR_INTERNAL, "simulated GPU: op %zu of a step replayed as a graph is %s, %s (a CUDA "
                            "graph would run the captured call)", g_rec.at + 1, op,
                            !c ? "past the captured step's ops" : strcmp(c->op, op) ? "not the captured op" :
                            "with other arguments than the captured step's");
        g_rec.at++;
        return DT_OK;
    }
    if (g_rec.n == g_rec.cap) {
        size_t cap = g_rec.cap ? 2 * g_rec.cap : 64;
        rec_call *c = realloc(g_rec.calls, cap * sizeof *c);
        if (!c) return dt_error(DT_ERR_NOMEM, "simulated GPU: out of memory keeping a graph's calls");
        g_rec.calls = c, g_rec.cap = cap;
    }
    void *a = malloc(size);
    if (!a) return dt_error(DT_ERR_NOMEM, "simulated GPU: out of memory keeping a graph's calls");
    memcpy(a, args, size);
    g_rec.calls[g_rec.n++] = (rec_call){op, run, a, size};
    return DT_OK;
}

#define REC(op, ...)                                                                                    \
    do {                                                                                                \
        if (g_rec.mode && !g_rec.running) {                                                             \
            op##_a a_;                                                                                  \
            memset(&a_, 0, sizeof a_);                                                                  \
            op##_set(&a_, __VA_ARGS__);                                                                 \
            return rec_keep(#op, op##_run, &a_, sizeof a_);                                             \
        }                                                                                               \
    } while (0)

// A call that waits for the device inside a captured or replayed step.
#define TRY_UNGRAPHED(what)                                                                             \
    do {                                                                                                \
        if (g_rec.mode && !g_rec.running)                                                               \
            return dt_error(DT_ERR_INTERNAL, "simulated GPU: %s inside a step %s as a graph", what,       \
                            g_rec.mode == REC_CAPTURE ? "being captured" : "replayed");                 \
    } while (0)

static void sim_graph_drop(void) { rec_free(); }

static dt_status sim_graph_capture(void) {
    rec_free();
    g_rec.mode = REC_CAPTURE;
    return DT_OK;
}

static dt_status sim_graph_replay(void) {
    if (g_rec.mode || !g_rec.n)
        return dt_error(DT_ERR_INTERNAL, "simulated GPU: a replay of a step's graph %s",
                        g_rec.mode ? "inside another" : "never made");
    g_rec.mode = REC_REPLAY;
    g_rec.at = 0;
    return DT_OK;
}

static dt_status sim_graph_run(void) {
    int mode = g_rec.mode;
    g_rec.mode = REC_NONE;
    if (mode == REC_NONE)
        return dt_error(DT_ERR_INTERNAL, "simulated GPU: a step's graph run outside a capture or a replay");
    if (mode == REC_REPLAY && g_rec.at != g_rec.n)
        return dt_error(DT_ERR_INTERNAL, "simulated GPU: a step replayed as a graph made %zu of the captured step's "
                        "%zu ops", g_rec.at, g_rec.n);
    dt_status st = DT_OK;
    g_rec.running = 1;
    for (size_t i = 0; i < g_rec.n && st == DT_OK; i++) st = g_rec.calls[i].run(g_rec.calls[i].args);
    g_rec.running = 0;
    return st;
}

// An op's bracket: the device memory is the host's between open and shut.
static void open_dev(void) {
    if (g_rec.mode && !g_rec.running) {
        fprintf(stderr, "simulated GPU: an op without REC inside a step captured or replayed as a graph\n");
        abort();
    }
    pthread_mutex_lock(&g.mu);
    if (g.open++ == 0) protect(PROT_READ | PROT_WRITE);
}

static dt_status shut(void) {
    if (--g.open == 0) protect(PROT_NONE);
    pthread_mutex_unlock(&g.mu);
    return DT_OK;
}

void dt_dev_sim_bracket(int open) {
    if (open) open_dev();
    else shut();
}

static size_t mem_bytes(void) {
    const char *e = getenv("DTRAIN_GPU_SIM_MEM");
    size_t b;
    if (e && *e && dt_mem_parse_size(e, &b) == DT_OK) return b;
    return dt_mem_available(NULL);
}

static int sim_count(char *why, size_t n) {
    if (n) why[0] = 0;
    const char *e = getenv("DTRAIN_GPU_SIM_DEVICES");
    int k = e && *e ? atoi(e) : 1;
    return k >= 1 && k <= 16 ? k : 1;
}

static dt_status sim_index(int index) {
    int k = sim_count(NULL, 0);
    if (index >= 0 && index < k) return DT_OK;
    return dt_error(DT_ERR_ARG, "the simulated GPUs are cuda:0 to cuda:%d (DTRAIN_GPU_SIM_DEVICES=%d), not cuda:%d",
                    k - 1, k, index);
}

static dt_status sim_describe(int index, char *out, size_t n) {
    if (sim_index(index) != DT_OK) return DT_ERR_ARG;
    snprintf(out, n, "dtrain's simulated GPU (DTRAIN_GPU=sim: the CPU's kernels on memory the host cannot read "
             "outside them), %.1f GiB", (double)mem_bytes() / (1u << 30));
    return DT_OK;
}

static dt_status sim_use(int index) { return sim_index(index); }

static size_t sim_scratch_bytes(uint64_t *allocs);

// (the ops' scratch counted as CUDA's buffer would take it)
static dt_status sim_mem_info(size_t *free_b, size_t *total) {
    size_t used = sim_scratch_bytes(NULL);
    pthread_mutex_lock(&g.mu);
    for (int i = 0; i < MAX_REGIONS; i++) used += g.at[i] ? held(i) : 0;
    pthread_mutex_unlock(&g.mu);
    *total = mem_bytes();
    *free_b = *total > used ? *total - used : 0;
    return DT_OK;
}

// len bytes of PROT_NONE address space; huge: on 2 MiB boundaries and
// backed by huge pages where the kernel has them, so that an op's flips
// of a large region change a PMD per 2 MiB instead of 512 PTEs (the
// simulated GPU's runs spent most of their time in mprotect); a region
// flipped in parts (a vm_reserve's chunks) stays on small pages.
enum { HUGE = 2 << 20 };
static void *sim_map(size_t len, int huge) {
    int flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
    if (!huge || len < HUGE) return mmap(NULL, len, PROT_NONE, flags, -1, 0);
    char *p = mmap(NULL, len + HUGE, PROT_NONE, flags, -1, 0);
    if (p == MAP_FAILED) return p;
    // (the mapping is [p, p + whole + HUGE), whole = len in pages: kept [a, a + whole))
    size_t page = (size_t)sysconf(_SC_PAGESIZE), whole = (len + page - 1) / page * page;
    char *a = (char *)(((uintptr_t)p + HUGE - 1) & ~(uintptr_t)(HUGE - 1));
    if (a > p) munmap(p, (size_t)(a - p));
    munmap(a + whole, (size_t)(p + HUGE - a));
    madvise(a, len, MADV_HUGEPAGE);  // (a hint: where refused, small pages)
    return a;
}

static dt_status sim_region(void **dev, size_t bytes, int huge) {
    *dev = NULL;
    size_t len = bytes ? bytes : 1;
    void *p = sim_map(len, huge);
    if (p == MAP_FAILED) return dt_error(DT_ERR_NOMEM, "simulated GPU: mmap of %zu bytes failed", bytes);
    pthread_mutex_lock(&g.mu);
    int i = 0;
    while (i < MAX_REGIONS && g.at[i]) i++;
    if (i < MAX_REGIONS) {
        g.at[i] = p;
        g.len[i] = len;
        // (allocated inside an op: open like the others until it ends)
        if (g.open) mprotect(p, len, PROT_READ | PROT_WRITE);
    }
    pthread_mutex_unlock(&g.mu);
    if (i == MAX_REGIONS) {
        munmap(p, len);
        return dt_error(DT_ERR_NOMEM, "simulated GPU: more than %d allocations at once", MAX_REGIONS);
    }
    *dev = p;
    return DT_OK;
}

static dt_status sim_alloc(void **dev, size_t bytes) { return sim_region(dev, bytes, 1); }

static void sim_free(void *dev) {
    if (!dev) return;
    pthread_mutex_lock(&g.mu);
    for (int i = 0; i < MAX_REGIONS; i++)
        if (g.at[i] == dev) {
            munmap(dev, g.len[i]);
            free(g.vm[i]);
            g.at[i] = NULL, g.vm[i] = NULL;
        }
    pthread_mutex_unlock(&g.mu);
}

static dt_status sim_vm_reserve(void **dev, size_t bytes, size_t *gran) {
    *gran = VM_GRAN;
    size_t chunks = (bytes + VM_GRAN - 1) / VM_GRAN;
    unsigned char *map = calloc(chunks ? chunks : 1, 1);
    dt_status st = map ? sim_region(dev, chunks * VM_GRAN, 0) : dt_error(DT_ERR_NOMEM, "simulated GPU: out of host memory");
    if (st != DT_OK) return free(map), st;
    pthread_mutex_lock(&g.mu);
    for (int i = 0; i < MAX_REGIONS; i++)
        if (g.at[i] == *dev) {
            g.vm[i] = map;
            if (g.open) protect_region(i, PROT_NONE);  // (nothing backed yet)
        }
    pthread_mutex_unlock(&g.mu);
    return DT_OK;
}

// Chunks [p, p + bytes) of a vm_reserve's region backed (on = 1: NaNs in
// them, the undefined contents) or given back (their pages freed).
static dt_status vm_set(void *p, size_t bytes, int on) {
    pthread_mutex_lock(&g.mu);
    int i = 0;
    while (i < MAX_REGIONS && !(g.vm[i] && (char *)p >= (char *)g.at[i] && (char *)p < (char *)g.at[i] + g.len[i])) i++;
    size_t off = i < MAX_REGIONS ? (size_t)((char *)p - (char *)g.at[i]) : 0;
    if (i == MAX_REGIONS || off % VM_GRAN || bytes % VM_GRAN || off + bytes > g.len[i]) {
        pthread_mutex_unlock(&g.mu);
        return dt_error(DT_ERR_INTERNAL, "simulated GPU: vm_%s of %zu bytes at %p: not whole chunks of a reserved "
                        "range", on ? "map" : "unmap", bytes, p);
    }
    size_t used = 0;
    for (int r = 0; on && r < MAX_REGIONS; r++) used += g.at[r] ? held(r) : 0;
    if (on && used + bytes > mem_bytes()) {
        pthread_mutex_unlock(&g.mu);
        return dt_error(DT_ERR_NOMEM, "simulated GPU: out of memory (%zu bytes held, %zu more asked, %zu in all)", used,
                        bytes, mem_bytes());
    }
    if (!on) madvise(p, bytes, MADV_DONTNEED);
    if (on && mprotect(p, bytes, PROT_READ | PROT_WRITE) != 0) abort();
    if (on) memset(p, 0xff, bytes);
    mprotect(p, bytes, PROT_NONE);  // (no op is open: it holds the lock; each opens what is backed)
    for (size_t c = off / VM_GRAN; c < (off + bytes) / VM_GRAN; c++) g.vm[i][c] = (unsigned char)on;
    pthread_mutex_unlock(&g.mu);
    return DT_OK;
}

static dt_status sim_vm_map(void *dev, size_t bytes) { return vm_set(dev, bytes, 1); }
static dt_status sim_vm_unmap(void *dev, size_t bytes) { return vm_set(dev, bytes, 0); }
static void sim_vm_free(void *dev, size_t bytes) { (void)bytes, sim_free(dev); }

// The "pinned" host buffers, so that an asynchronous copy from any other
// host memory is refused, as CUDA's graphs refuse it (and CUDA's
// asynchronous copies from pageable memory wait).
typedef struct pinned {
    struct pinned *next;
    char *at;
    size_t len;
} pinned;
static pinned *g_pinned;

static dt_status sim_host_alloc(void **host, size_t bytes) {
    pinned *p = malloc(sizeof *p);
    *host = p ? dt_alloc(bytes ? bytes : 1) : NULL;
    if (!*host) {
        free(p);
        return dt_error(DT_ERR_NOMEM, "simulated GPU: out of host memory for %zu bytes", bytes);
    }
    pthread_mutex_lock(&g.mu);
    *p = (pinned){g_pinned, *host, bytes};
    g_pinned = p;
    pthread_mutex_unlock(&g.mu);
    return DT_OK;
}

static void sim_host_free(void *host) {
    pthread_mutex_lock(&g.mu);
    for (pinned **p = &g_pinned; *p; p = &(*p)->next)
        if ((*p)->at == host) {
            pinned *q = *p;
            *p = q->next;
            free(q);
            break;
        }
    pthread_mutex_unlock(&g.mu);
    dt_free(host);
}

// Whether host[bytes] lies inside one pinned buffer.
static int is_pinned(const void *host, size_t bytes) {
    const char *h = host;
    int in = 0;
    pthread_mutex_lock(&g.mu);
    for (pinned *p = g_pinned; p && !in; p = p->next) in = h >= p->at && h + bytes <= p->at + p->len;
    pthread_mutex_unlock(&g.mu);
    return in;
}

static dt_status sim_memset0(void *dev, size_t bytes) {
    REC(memset0, dev, bytes);
    open_dev();
    memset(dev, 0, bytes);
    return shut();
}

static dt_status sim_to_device(void *dev, const void *host, size_t bytes) {
    TRY_UNGRAPHED("a copy to the device that waits for it (to_device)");
    open_dev();
    memcpy(dev, host, bytes);
    return shut();
}

// (a graph's copy reads `host` when it runs, as CUDA's does)
static dt_status sim_to_device_async(void *dev, const void *host, size_t bytes) {
    if (!is_pinned(host, bytes))
        return dt_error(DT_ERR_INTERNAL, "simulated GPU: to_device_async of %zu bytes from host memory that no "
                        "host_alloc gave (an asynchronous copy needs pinned memory)", bytes);
    REC(to_device_async, dev, host, bytes);
    return sim_to_device(dev, host, bytes);  // (synchronous here)
}

static _Atomic uint64_t g_reads;

static uint64_t sim_reads(void) { return g_reads; }

// ---- the ops' scratch (dev.h's scratch_*) ----------------------------------
// None is taken (the ops use the host's memory), but the bytes CUDA's calls
// would ask for are counted as CUDA's buffer is (cub's sort and cuDNN's
// workspaces aside, which only they can size), so that a run whose plan
// missed a call says so (scratch_bytes' allocs) here too.
static struct {
    pthread_mutex_t mu;
    size_t cap;
    int reserved;
    uint64_t allocs;
} g_scratch = {PTHREAD_MUTEX_INITIALIZER, 0, 0, 0};

static dt_status sim_scratch_reserve(size_t bytes) {
    pthread_mutex_lock(&g_scratch.mu);
    g_scratch.cap = bytes > g_scratch.cap ? bytes : g_scratch.cap;
    g_scratch.reserved = 1;
    pthread_mutex_unlock(&g_scratch.mu);
    return DT_OK;
}

static size_t sim_scratch_bytes(uint64_t *allocs) {
    pthread_mutex_lock(&g_scratch.mu);
    size_t cap = g_scratch.cap;
    if (allocs) *allocs = g_scratch.allocs;
    pthread_mutex_unlock(&g_scratch.mu);
    return cap;
}

// A call's scratch, as CUDA's dt_gpu_scratch: the buffer grown to it, an
// allocation counted after a reservation.
static void scratch_take(dt_dev_ask_op op, size_t n, int C) {
    dt_dev_scratch_ask q = {op, n, C, NULL};
    size_t bytes = dt_dev_scratch_kernels(&q);
    pthread_mutex_lock(&g_scratch.mu);
    if (bytes > g_scratch.cap) g_scratch.cap = bytes, g_scratch.allocs += g_scratch.reserved;
    pthread_mutex_unlock(&g_scratch.mu);
}

static dt_status sim_to_host(void *host, const void *dev, size_t bytes) {
    TRY_UNGRAPHED("a read from the device (to_host)");
    g_reads++;
    open_dev();
    memcpy(host, dev, bytes);
    return shut();
}

static dt_status sim_copy(void *to, const void *from, size_t bytes) {
    REC(copy, to, from, bytes);
    open_dev();
    memmove(to, from, bytes);
    return shut();
}

static dt_status sim_sync(void) {
    TRY_UNGRAPHED("a wait for the device (sync)");
    return DT_OK;
}

// Every op is done when it returns: a stream or an event is a token, always
// done.
static char g_stream_token;

static dt_status sim_stream_create(void **stream) {
    *stream = &g_stream_token;
    return DT_OK;
}

static void sim_stream_destroy(void *stream) { (void)stream; }

static dt_status sim_stream_after_compute(void *stream) { return (void)stream, DT_OK; }

static dt_status sim_stream_query(void *stream, int *done) {
    (void)stream;
    *done = 1;
    return DT_OK;
}

static dt_status sim_event_create(void **event) {
    *event = &g_stream_token;
    return DT_OK;
}

static void sim_event_destroy(void *event) { (void)event; }
static dt_status sim_event_record(void *event) { return (void)event, DT_OK; }
static dt_status sim_event_query(void *event, int *done) { return (void)event, *done = 1, DT_OK; }
static dt_status sim_stream_wait_event(void *stream, void *event) { return (void)stream, (void)event, DT_OK; }

static void sim_host_open(int on) {
    if (on) open_dev();
    else shut();
}

// ---- kernels: the CPU's twins -------------------------------------------------

// The CPU's GEMMs take their precision from the kernels' (process-wide, the
// run's: bf16 in a bf16 run, for the host's model); an op whose products
// are in a precision of its own (sgemm's fp32, the attention's t) sets it
// for its call and puts the run's back. The training thread alone calls
// the kernels meanwhile (the host's model runs between steps), and the
// ops hold the simulated GPU's lock.
static dt_dtype products_in(dt_dtype t) {
    dt_dtype was = dt_kernels_precision();
    dt_kernels_set_precision(t);
    return was;
}

static dt_status sim_sgemm(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                           const float *B, int ldb, float beta, float *C, int ldc) {
    REC(sgemm, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    open_dev();
    dt_dtype was = products_in(DT_F32);
    dt_sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    dt_kernels_set_precision(was);
    return shut();
}

static dt_status sim_gemm16(dt_dtype t, int ta, int tb, int M, int N, int K, float alpha, const void *A, int lda,
                            const void *B, int ldb, float beta, float *C, int ldc) {
    REC(gemm16, t, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    if (t != DT_BF16 && t != DT_F16)
        return dt_error(DT_ERR_ARG, "simulated GPU's 16-bit GEMM: operands of type %s (BF16 or F16 only)",
                        dt_dtype_name(t));
    open_dev();
    dt_gemm16(t, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return shut();
}

static dt_status sim_to16(void *dst, const float *src, size_t n, dt_dtype t) {
    REC(to16, dst, src, n, t);
    if (t != DT_BF16 && t != DT_F16)
        return dt_error(DT_ERR_ARG, "simulated GPU's conversion: type %s is not a 16-bit float (BF16 or F16 only)",
                        dt_dtype_name(t));
    open_dev();
#pragma omp parallel for schedule(static) if (n > 65536)
    for (size_t i = 0; i < n; i += 4096) dt_from_f32((uint16_t *)dst + i, src + i, n - i < 4096 ? n - i : 4096, t);
    return shut();
}

static dt_status sim_from16(float *dst, const void *src, size_t n, dt_dtype t) {
    REC(from16, dst, src, n, t);
    if (t != DT_BF16 && t != DT_F16)
        return dt_error(DT_ERR_ARG, "simulated GPU's conversion: type %s is not a 16-bit float (BF16 or F16 only)",
                        dt_dtype_name(t));
    open_dev();
    dt_to_f32(dst, src, n, t);
    return shut();
}

static dt_status sim_ef16(void *dst, float *g, float *res, size_t n, dt_dtype t) {
    REC(ef16, dst, g, res, n, t);
    if (t != DT_BF16 && t != DT_F16)
        return dt_error(DT_ERR_ARG, "simulated GPU's error feedback: type %s is not a 16-bit float (BF16 or F16 only)",
                        dt_dtype_name(t));
    open_dev();
    dt_from_f32_ef(dst, g, res, n, t);
    return shut();
}

// The CPU's layernorm of inp (res = a + b first where a is non-NULL) into
// out, or with out16 into host rows of the call's own, rounded into out16.
static dt_status sim_ln(float *out, float *mean, float *rstd, float *res, const float *a, const float *b,
                        const float *inp, const float *w, const float *bias, size_t N, int C, float eps, void *out16,
                        dt_dtype t) {
    float *o = out16 ? malloc(sizeof(float) * (N * (size_t)C > 0 ? N * (size_t)C : 1)) : out;
    if (!o) return dt_error(DT_ERR_NOMEM, "simulated GPU: layernorm's rows (%zu floats)", N * C);
    open_dev();
    if (a) dt_residual_forward(res, a, b, N * (size_t)C);
    dt_layernorm_forward(o, mean, rstd, inp, w, bias, (int)N, C, eps);
    if (out16) dt_from_f32(out16, o, N * (size_t)C, t);
    if (out16) free(o);
    return shut();
}

static dt_status sim_ln_forward(float *out, float *mean, float *rstd, const float *inp, const float *w,
                                const float *b, size_t N, int C, float eps, void *out16, dt_dtype t) {
    if (dt_launch_h16("simulated GPU: layernorm", out16, t) < 0) return DT_ERR_ARG;
    REC(ln_forward, out, mean, rstd, inp, w, b, N, C, eps, out16, t);
    return sim_ln(out, mean, rstd, NULL, NULL, NULL, inp, w, b, N, C, eps, out16, t);
}

static dt_status sim_ln_residual(float *out, float *mean, float *rstd, float *res, const float *a, const float *b,
                                 const float *w, const float *bias, size_t N, int C, float eps, void *out16,
                                 dt_dtype t) {
    if (dt_launch_h16("simulated GPU: layernorm", out16, t) < 0) return DT_ERR_ARG;
    REC(ln_residual, out, mean, rstd, res, a, b, w, bias, N, C, eps, out16, t);
    return sim_ln(out, mean, rstd, res, a, b, res, w, bias, N, C, eps, out16, t);
}

static dt_status sim_ln_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                                 const float *w, const float *mean, const float *rstd, size_t N, int C) {
    REC(ln_backward, dinp, dw, db, dout, inp, w, mean, rstd, N, C);
    if (dw || db) scratch_take(DT_ASK_LAYERNORM, N, C);
    open_dev();
    dt_layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, (int)N, C);
    return shut();
}

// The CPU's GELU into out, or with out16 into host room of the call's
// own, rounded into out16.
static dt_status sim_gelu_forward(float *out, const float *inp, size_t n, void *out16, dt_dtype t) {
    if (dt_launch_h16("simulated GPU: GELU", out16, t) < 0) return DT_ERR_ARG;
    REC(gelu_forward, out, inp, n, out16, t);
    float *o = out16 ? malloc(sizeof(float) * (n ? n : 1)) : out;
    if (!o) return dt_error(DT_ERR_NOMEM, "simulated GPU: GELU's output (%zu floats)", n);
    open_dev();
    dt_gelu_forward(o, inp, n);
    if (out16) dt_from_f32(out16, o, n, t), free(o);
    return shut();
}

static dt_status sim_gelu_backward(float *dinp, const float *dout, const float *inp, size_t n) {
    REC(gelu_backward, dinp, dout, inp, n);
    open_dev();
    dt_gelu_backward(dinp, dout, inp, n);
    return shut();
}

// dt_crossentropy_forward over rows stored ld apart (nn/rows.h's steps).
static dt_status sim_ce_forward(float *probs, double *row_loss, float *loss, const float *logits,
                                const int32_t *targets, size_t N, int V, size_t ld) {
    REC(ce_forward, probs, row_loss, loss, logits, targets, N, V, ld);
    open_dev();
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < N; i++) row_loss[i] = dt_ce_row(probs + i * ld, logits + i * ld, V, targets[i]);
    double sum = 0.0;
    for (size_t i = 0; i < N; i++) sum += row_loss[i];
    *loss = N > 0 ? (float)(sum / (double)N) : 0.0f;
    return shut();
}

static dt_status sim_ce_backward(float *dlogits, const float *probs, const int32_t *targets, size_t N, int V,
                                 size_t ld, float dloss) {
    REC(ce_backward, dlogits, probs, targets, N, V, ld, dloss);
    open_dev();
    float scale = dt_ce_scale(dloss, (float)N);
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < N; i++)
        for (int v = 0; v < V; v++) dlogits[i * ld + v] = dt_ce_grad(dlogits[i * ld + v], probs[i * ld + v], v == targets[i], scale);
    return shut();
}

// Both ops (dev.h): the forward's probabilities in host rows of the
// call's own, the gradient's rows zeroed, then the backward onto them:
// the logits', or with d16 host rows of the call's own, rounded into d16.
static dt_status sim_ce_fused(float *logits, double *row_loss, float *loss, const int32_t *targets, size_t N, int V,
                              size_t ld, float dloss, void *d16, dt_dtype t) {
    if (dt_launch_h16("simulated GPU: cross-entropy", d16, t) < 0) return DT_ERR_ARG;
    REC(ce_fused, logits, row_loss, loss, targets, N, V, ld, dloss, d16, t);
    size_t n = N * ld > 0 ? N * ld : 1;
    float *p = malloc(sizeof(float) * n), *g = d16 ? malloc(sizeof(float) * n) : logits;
    if (!p || !g) {
        free(p), free(d16 ? g : NULL);
        return dt_error(DT_ERR_NOMEM, "simulated GPU: the cross-entropy's probabilities (%zu floats)", N * ld);
    }
    dt_status st = sim_ce_forward(p, row_loss, loss, logits, targets, N, V, ld);
    if (st == DT_OK) {
        open_dev();
        for (size_t i = 0; i < N; i++) memset(g + i * ld, 0, sizeof(float) * (size_t)V);
        st = shut();
    }
    if (st == DT_OK) st = sim_ce_backward(g, p, targets, N, V, ld, dloss);
    if (st == DT_OK && d16) {
        open_dev();
        for (size_t i = 0; i < N; i++) dt_from_f32((uint16_t *)d16 + i * ld, g + i * ld, (size_t)V, t);
        st = shut();
    }
    free(p), free(d16 ? g : NULL);
    return st;
}

static dt_status sim_adamw(float *w, const float *gr, float *m, float *v, size_t n, const dt_adamw_k *k0,
                           const float *guard) {
    REC(adamw, w, gr, m, v, n, k0, guard);
    open_dev();
    dt_adamw_k k[1] = {*k0};
    if (!dt_guard_scale(guard, &k->grad_scale)) return shut();
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) dt_adamw_elem(&w[i], gr[i], &m[i], &v[i], k);
    return shut();
}

static dt_status sim_step_scale(float *guard, const double *vals, float unscale, float clip) {
    REC(step_scale, guard, vals, unscale, clip);
    open_dev();
    dt_step_guard(guard, vals, unscale, clip);
    return shut();
}

static dt_status sim_sgd(float *w, const float *gr, float *buf, size_t n, const dt_sgd_k *k0, const float *guard) {
    REC(sgd, w, gr, buf, n, k0, guard);
    open_dev();
    dt_sgd_k k[1] = {*k0};
    if (!dt_guard_scale(guard, &k->grad_scale)) return shut();
    if (buf) {
#pragma omp parallel for simd schedule(static)
        for (size_t i = 0; i < n; i++) dt_sgd_elem(&w[i], gr[i], &buf[i], k);
    } else {
#pragma omp parallel for simd schedule(static)
        for (size_t i = 0; i < n; i++) dt_sgd_elem(&w[i], gr[i], NULL, k);
    }
    return shut();
}

static dt_status sim_encoder_forward(float *out, const int32_t *inp, const float *wte, const float *wpe, int B,
                                     int T, int C) {
    REC(encoder_forward, out, inp, wte, wpe, B, T, C);
    open_dev();
    dt_encoder_forward(out, inp, wte, wpe, B, T, C);
    return shut();
}

static dt_status sim_encoder_backward(float *dwte, float *dwpe, const float *dout, const int32_t *inp, int B, int T,
                                      int C) {
    REC(encoder_backward, dwte, dwpe, dout, inp, B, T, C);
    scratch_take(DT_ASK_ENCODER, (size_t)B * T, 0);
    open_dev();
    dt_encoder_backward(dwte, dwpe, dout, inp, B, T, C);
    return shut();
}

static dt_status sim_encoder_split_forward(float *out, const int32_t *inp, const float *wte, const float *wpe, int B,
                                           int T, int C, int v0, int V) {
    REC(encoder_split_forward, out, inp, wte, wpe, B, T, C, v0, V);
    open_dev();
    dt_encoder_split_forward(out, inp, wte, wpe, B, T, C, v0, V);
    return shut();
}

static dt_status sim_encoder_split_backward(float *dwte, float *dwpe, const float *dout, const int32_t *inp, int B,
                                            int T, int C, int v0, int V) {
    REC(encoder_split_backward, dwte, dwpe, dout, inp, B, T, C, v0, V);
    scratch_take(DT_ASK_ENCODER, (size_t)B * T, 0);
    open_dev();
    dt_encoder_split_backward(dwte, dwpe, dout, inp, B, T, C, v0, V);
    return shut();
}

static dt_status sim_ce_split_max(float *mx, const float *logits, size_t N, int V) {
    REC(ce_split_max, mx, logits, N, V);
    open_dev();
    dt_ce_split_max(mx, logits, (int)N, V);
    return shut();
}

static dt_status sim_ce_split_exp(float *probs, float *sums, const float *logits, const float *mx,
                                  const int32_t *targets, size_t N, int V) {
    REC(ce_split_exp, probs, sums, logits, mx, targets, N, V);
    open_dev();
    dt_ce_split_exp(probs, sums, logits, mx, targets, (int)N, V);
    return shut();
}

static dt_status sim_ce_split_finish(float *probs, double *row_loss, float *loss, const float *mx, const float *sums,
                                     size_t N, int V) {
    REC(ce_split_finish, probs, row_loss, loss, mx, sums, N, V);
    open_dev();
    *loss = dt_ce_split_finish(probs, row_loss, mx, sums, (int)N, V);
    return shut();
}

static dt_status sim_residual_forward(float *out, const float *a, const float *b, size_t N) {
    REC(residual_forward, out, a, b, N);
    open_dev();
    dt_residual_forward(out, a, b, N);
    return shut();
}

static dt_status sim_residual_backward(float *da, float *db, const float *dout, size_t N) {
    REC(residual_backward, da, db, dout, N);
    open_dev();
    dt_residual_backward(da, db, dout, N);
    return shut();
}

/* The CPU's attention. Where the device's kernels are fused
 * (dt_att_fused: att and datt hold per-row values only), the probabilities
 * [B,NH,T,T] and their gradient live in host scratch of the call's own:
 * the forward leaves att's rows (the fused kernels' log-sum-exp) 0, and the
 * backward makes the probabilities again (the same bits) before the CPU's
 * backward. */
static dt_status sim_attention_forward(float *out, float *att, const float *qkv, void *work, int B, int T, int C,
                                       int NH, dt_dtype t, void *out16) {
    if (dt_launch_h16("simulated GPU: attention", out16, t) < 0) return DT_ERR_ARG;
    REC(attention_forward, out, att, qkv, work, B, T, C, NH, t, out16);
    (void)work;
    open_dev();
    int fused = dt_att_fused(C, NH);
    size_t rows = (size_t)B * NH * T;
    float *p = fused ? malloc(sizeof(float) * (rows * T + 1)) : att;
    if (!p) return shut(), dt_error(DT_ERR_NOMEM, "simulated GPU: attention's probabilities (%zu floats)", rows * T);
    dt_dtype was = products_in(t);
    dt_attention_forward(out, p, qkv, B, T, C, NH);
    dt_kernels_set_precision(was);
    if (out16) dt_from_f32(out16, out, (size_t)B * T * C, t);  // (out the op's room, written)
    if (fused) {  // (the room of the rows' log-sum-exp, which the backward here does not read)
        memset(att, 0, sizeof(float) * rows);
        free(p);
    }
    return shut();
}

// (out unused: the probabilities made again, the CPU's)
static dt_status sim_attention_backward(float *dqkv, float *datt, const float *dout, const float *qkv, const void *out,
                                        const float *att, void *work, int B, int T, int C, int NH, dt_dtype t) {
    REC(attention_backward, dqkv, datt, dout, qkv, out, att, work, B, T, C, NH, t);
    (void)work, (void)out;
    open_dev();
    int fused = dt_att_fused(C, NH);
    size_t na = (size_t)B * NH * T * T, n = (size_t)B * T * C;
    float *p = fused ? malloc(sizeof(float) * (2 * na + n + 1)) : NULL;
    if (fused && !p) return shut(), dt_error(DT_ERR_NOMEM, "simulated GPU: attention's backward (%zu floats)", 2 * na + n);
    dt_dtype was = products_in(t);
    memset(dqkv, 0, sizeof(float) * 3 * n);  // (written: the CPU's op adds)
    if (fused) dt_attention_forward(p + 2 * na, p, qkv, B, T, C, NH);
    dt_attention_backward(dqkv, fused ? p + na : datt, dout, qkv, fused ? p : att, B, T, C, NH);
    dt_kernels_set_precision(was);
    free(p);
    return shut();
}

static dt_status sim_relu_forward(float *out, const float *inp, size_t N) {
    REC(relu_forward, out, inp, N);
    open_dev();
    dt_relu_forward(out, inp, N);
    return shut();
}

static dt_status sim_relu_backward(float *dinp, const float *dout, const float *inp, size_t N) {
    REC(relu_backward, dinp, dout, inp, N);
    open_dev();
    dt_relu_backward(dinp, dout, inp, N);
    return shut();
}

static dt_status sim_bias_forward(float *out, const float *b, size_t N, int OC) {
    REC(bias_forward, out, b, N, OC);
    open_dev();
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < N; i++)
        for (int o = 0; o < OC; o++) out[i * OC + o] += b[o];
    return shut();
}

// The linear layer (dev.h): the bias written first, the GEMM in t adding
// onto it, GELU after (dt_linear_forward's order, then dt_gelu_forward's).
static dt_status sim_linear_forward(float *out, float *pre, const void *inp, const void *w, const float *b, int N,
                                    int C, int OC, dt_dtype t) {
    REC(linear_forward, out, pre, inp, w, b, N, C, OC, t);
    float *y = pre ? pre : out;
    dt_status st = b ? sim_memset0(y, sizeof(float) * (size_t)N * OC) : DT_OK;
    if (st == DT_OK && b) st = sim_bias_forward(y, b, (size_t)N, OC);
    float beta = b ? 1.0f : 0.0f;
    if (st == DT_OK && t == DT_F32) st = sim_sgemm(0, 1, N, OC, C, 1.0f, inp, C, w, C, beta, y, OC);
    else if (st == DT_OK) st = sim_gemm16(t, 0, 1, N, OC, C, 1.0f, inp, C, w, C, beta, y, OC);
    return st == DT_OK && pre ? sim_gelu_forward(out, pre, (size_t)N * OC, NULL, DT_F32) : st;
}

// The input gradient through GELU (dev.h): g w into zeros (the room of a
// call of its own), then the CPU's GELU gradient into dpre's zeros, the
// device model's former calls.
static dt_status sim_linear_dgelu(float *dpre, const void *g, const void *w, const float *pre, int N, int C, int OC,
                                  dt_dtype t) {
    REC(linear_dgelu, dpre, g, w, pre, N, C, OC, t);
    size_t n = (size_t)N * C;
    float *tmp = calloc(n ? n : 1, sizeof(float));
    if (!tmp) return dt_error(DT_ERR_NOMEM, "simulated GPU: the GELU's input gradient (%zu floats)", n);
    dt_status st = t == DT_F32 ? sim_sgemm(0, 0, N, C, OC, 1.0f, g, OC, w, C, 1.0f, tmp, C)
                               : sim_gemm16(t, 0, 0, N, C, OC, 1.0f, g, OC, w, C, 1.0f, tmp, C);
    if (st == DT_OK) st = sim_memset0(dpre, sizeof(float) * n);
    if (st == DT_OK) st = sim_gelu_backward(dpre, tmp, pre, n);
    free(tmp);
    return st;
}

// The column sums with the rows in order, as dt_linear_backward's.
static dt_status bias_sums(float *db, const float *dout, size_t N, int OC) {
    open_dev();
    for (size_t i = 0; i < N; i++)
        for (int o = 0; o < OC; o++) db[o] += dout[i * OC + o];
    return shut();
}

static dt_status sim_bias_backward(float *db, const float *dout, size_t N, int OC, void *dout16, dt_dtype t) {
    if (dt_launch_h16("simulated GPU: bias gradient", dout16, t) < 0) return DT_ERR_ARG;
    REC(bias_backward, db, dout, N, OC, dout16, t);
    scratch_take(DT_ASK_COLSUM, N, OC);
    dt_status st = bias_sums(db, dout, N, OC);
    if (st != DT_OK || !dout16) return st;
    open_dev();
    dt_from_f32(dout16, dout, N * (size_t)OC, t);
    return shut();
}

static dt_status sim_sumsq(double *out, const float *x, size_t n) {
    REC(sumsq, out, x, n);
    scratch_take(DT_ASK_SUMSQ, n, 0);
    open_dev();
    *out = dt_sum_squares(x, n);
    return shut();
}

static dt_status sim_sumsq_parts(double *part, const float *x, size_t n, size_t first, double carry) {
    REC(sumsq_parts, part, x, n, first, carry);
    open_dev();
    dt_sum_squares_parts(x, n, first, carry, part);
    return shut();
}

static dt_status sim_loss_add(double *acc, const float *loss, double w) {
    REC(loss_add, acc, loss, w);
    open_dev();
    *acc += (double)*loss * w;  // (C11 without contraction: loop.c's sum)
    return shut();
}

static dt_status sim_scale(float *x, size_t n, const float *s) {
    REC(scale, x, n, s);
    open_dev();
    float k = *s;
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) x[i] *= k;
    return shut();
}

// The CNN's: im2col, its inverse and the transpose have no CPU twin (the
// CPU's convolutions are oneDNN's): cnn_hd.h's elements in loops, as the
// kernels run them; max pooling the CPU's own; dropout's masks cnn_hd.h's
// streams, which nn/model.c's draws equal.
static dt_status sim_im2col(float *col, const float *x, size_t B, const dt_im2col_t *g) {
    REC(im2col, col, x, B, g);
    open_dev();
    size_t ncol = B * g->OH * g->OW, n = (size_t)g->C * g->K * g->K * ncol;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) col[i] = dt_im2col_at(x, g, i / ncol, i % ncol);
    return shut();
}

static dt_status sim_col2im(float *dx, const float *dcol, size_t B, const dt_im2col_t *g) {
    REC(col2im, dx, dcol, B, g);
    open_dev();
    size_t n = B * g->C * g->H * g->W;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) dx[i] += dt_col2im_at(dcol, g, B, i);
    return shut();
}

static dt_status sim_transpose(float *out, const float *in, size_t nb, size_t R, size_t C) {
    REC(transpose, out, in, nb, R, C);
    open_dev();
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < nb * R * C; i++) out[i] = in[dt_transpose_src(i, R, C)];
    return shut();
}

// A convolution whole, as the device model's im2col path makes it (its
// ops, so the same bits), the columns and the NHWC rows in host scratch,
// the columns made again from the input for the backward.
// DTRAIN_GPU_SIM_CONV=im2col: as a GPU without cuDNN (the device model's
// own im2col path, tested so).
static int sim_conv2d_ready(char *why, size_t n) {
    const char *e = getenv("DTRAIN_GPU_SIM_CONV");
    if (!e || strcmp(e, "im2col") != 0) return 1;
    if (n) snprintf(why, n, "DTRAIN_GPU_SIM_CONV=im2col");
    return 0;
}

static dt_status sim_conv2d_forward(float *out, const float *inp, const float *w, const float *b, size_t B,
                                    const dt_im2col_t *g, int OC) {
    REC(conv2d_forward, out, inp, w, b, B, g, OC);
    size_t R = (size_t)g->OH * g->OW, N = B * R;
    int ckk = g->C * g->K * g->K;
    float *col = malloc(sizeof(float) * (ckk * N + 1)), *rows = malloc(sizeof(float) * (N * OC + 1));
    if (!col || !rows) return free(col), free(rows), dt_error(DT_ERR_NOMEM, "simulated GPU: out of memory");
    sim_im2col(col, inp, B, g);
    sim_sgemm(1, 1, (int)N, OC, ckk, 1.0f, col, (int)N, w, ckk, 0.0f, rows, OC);
    if (b) sim_bias_forward(rows, b, N, OC);
    sim_transpose(out, rows, B, R, (size_t)OC);
    free(col), free(rows);
    return DT_OK;
}

static dt_status sim_conv2d_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                                     const float *w, size_t B, const dt_im2col_t *g, int OC) {
    REC(conv2d_backward, dinp, dw, db, dout, inp, w, B, g, OC);
    size_t R = (size_t)g->OH * g->OW, N = B * R;
    int ckk = g->C * g->K * g->K;
    float *col = malloc(sizeof(float) * (ckk * N + 1)), *rows = malloc(sizeof(float) * (N * OC + 1));
    float *dcol = dinp ? malloc(sizeof(float) * (ckk * N + 1)) : NULL;
    if (!col || !rows || (dinp && !dcol))
        return free(col), free(rows), free(dcol), dt_error(DT_ERR_NOMEM, "simulated GPU: out of memory");
    sim_im2col(col, inp, B, g);
    sim_transpose(rows, dout, B, (size_t)OC, R);
    if (db) bias_sums(db, rows, N, OC);  // (cuDNN's: no column sums' scratch)
    sim_sgemm(1, 1, OC, ckk, (int)N, 1.0f, rows, OC, col, (int)N, 1.0f, dw, ckk);
    if (dinp) sim_sgemm(1, 1, ckk, (int)N, OC, 1.0f, w, ckk, rows, OC, 0.0f, dcol, (int)N);
    if (dinp) sim_col2im(dinp, dcol, B, g);
    free(col), free(rows), free(dcol);
    return DT_OK;
}

static dt_status sim_maxpool_forward(float *out, int32_t *arg, const float *x, size_t images, int H, int W, int K,
                                     int S) {
    REC(maxpool_forward, out, arg, x, images, H, W, K, S);
    open_dev();
    dt_maxpool_forward(out, arg, x, 1, (int)images, H, W, K, S);
    return shut();
}

static dt_status sim_maxpool_backward(float *dx, const float *dout, const int32_t *arg, size_t images, int H, int W,
                                      int K, int S) {
    REC(maxpool_backward, dx, dout, arg, images, H, W, K, S);
    open_dev();
    dt_maxpool_backward(dx, dout, arg, 1, (int)images, H, W, K, S);
    return shut();
}

static dt_status sim_dropout_forward(float *out, float *mask, const float *x, int B, size_t n, float p, uint64_t seed,
                                     uint64_t step, int64_t first, int layer, size_t skip) {
    REC(dropout_forward, out, mask, x, B, n, p, seed, step, first, layer, skip);
    open_dev();
#pragma omp parallel for schedule(static)
    for (int j = 0; j < B; j++) {
        dt_dropout_mask(mask + (size_t)j * n, n, p, seed, step, (uint64_t)(first + j), layer, skip);
        for (size_t i = (size_t)j * n; i < (size_t)(j + 1) * n; i++) out[i] = x[i] * mask[i];
    }
    return shut();
}

static dt_status sim_dropout_backward(float *dx, const float *dout, const float *mask, size_t N) {
    REC(dropout_backward, dx, dout, mask, N);
    open_dev();
    dt_dropout_backward(dx, dout, mask, N);
    return shut();
}

static dt_status sim_fixed_add(int64_t *acc, const float *gr, size_t n) {
    REC(fixed_add, acc, gr, n);
    open_dev();
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) acc[i] += dt_fixed_of(gr[i], DT_FIXED_SCALE);
    return shut();
}

static dt_status sim_fixed_to_float(float *gr, const int64_t *acc, size_t n) {
    REC(fixed_to_float, gr, acc, n);
    open_dev();
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) gr[i] = dt_fixed_value(acc[i]);
    return shut();
}

const dt_dev dt_dev_sim = {
    .name = "sim",
    .count = sim_count,
    .describe = sim_describe,
    .use = sim_use,
    .mem_info = sim_mem_info,
    .alloc = sim_alloc,
    .free = sim_free,
    .host_alloc = sim_host_alloc,
    .host_free = sim_host_free,
    .memset0 = sim_memset0,
    .vm_reserve = sim_vm_reserve,
    .vm_map = sim_vm_map,
    .vm_unmap = sim_vm_unmap,
    .vm_free = sim_vm_free,
    .to_device = sim_to_device,
    .to_device_async = sim_to_device_async,
    .reads = sim_reads,
    .scratch_of = dt_dev_scratch_kernels,
    .scratch_reserve = sim_scratch_reserve,
    .scratch_bytes = sim_scratch_bytes,
    .to_host = sim_to_host,
    .copy = sim_copy,
    .sync = sim_sync,
    .stream_create = sim_stream_create,
    .stream_destroy = sim_stream_destroy,
    .stream_after_compute = sim_stream_after_compute,
    .stream_query = sim_stream_query,
    .event_create = sim_event_create,
    .event_destroy = sim_event_destroy,
    .event_record = sim_event_record,
    .event_query = sim_event_query,
    .stream_wait_event = sim_stream_wait_event,
    .graph_capture = sim_graph_capture,
    .graph_replay = sim_graph_replay,
    .graph_run = sim_graph_run,
    .graph_drop = sim_graph_drop,
    .host_open = sim_host_open,
    .sgemm = sim_sgemm,
    .gemm16 = sim_gemm16,
    .to16 = sim_to16,
    .from16 = sim_from16,
    .ef16 = sim_ef16,
    .layernorm_forward = sim_ln_forward,
    .layernorm_backward = sim_ln_backward,
    .layernorm_residual = sim_ln_residual,
    .gelu_forward = sim_gelu_forward,
    .gelu_backward = sim_gelu_backward,
    .crossentropy_forward = sim_ce_forward,
    .crossentropy_backward = sim_ce_backward,
    .crossentropy_fused = sim_ce_fused,
    .linear_forward = sim_linear_forward,
    .linear_dgelu = sim_linear_dgelu,
    .adamw = sim_adamw,
    .sgd = sim_sgd,
    .step_scale = sim_step_scale,
    .encoder_forward = sim_encoder_forward,
    .encoder_backward = sim_encoder_backward,
    .encoder_split_forward = sim_encoder_split_forward,
    .encoder_split_backward = sim_encoder_split_backward,
    .ce_split_max = sim_ce_split_max,
    .ce_split_exp = sim_ce_split_exp,
    .ce_split_finish = sim_ce_split_finish,
    .residual_forward = sim_residual_forward,
    .residual_backward = sim_residual_backward,
    .attention_forward = sim_attention_forward,
    .attention_backward = sim_attention_backward,
    .relu_forward = sim_relu_forward,
    .relu_backward = sim_relu_backward,
    .bias_forward = sim_bias_forward,
    .bias_backward = sim_bias_backward,
    .sumsq = sim_sumsq,
    .sumsq_parts = sim_sumsq_parts,
    .loss_add = sim_loss_add,
    .scale = sim_scale,
    .im2col = sim_im2col,
    .col2im = sim_col2im,
    .transpose = sim_transpose,
    .conv2d_ready = sim_conv2d_ready,
    .conv2d_forward = sim_conv2d_forward,
    .conv2d_backward = sim_conv2d_backward,
    .maxpool_forward = sim_maxpool_forward,
    .maxpool_backward = sim_maxpool_backward,
    .dropout_forward = sim_dropout_forward,
    .dropout_backward = sim_dropout_backward,
    .fixed_add = sim_fixed_add,
    .fixed_to_float = sim_fixed_to_float,
};
