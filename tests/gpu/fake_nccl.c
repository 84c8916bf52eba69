/* A fake NCCL for the tests (libfake_nccl.so; docs/gpu.md, "Several
 * ranks"): the functions of NCCL that dtrain's nccl backend calls
 * (src/comm/nccl/nccl_api.h), implemented on the CPU over POSIX shared
 * memory, for ranks on dtrain's simulated GPU (whose memory is the
 * host's: dtrain opens it around each call, the seam's host_open).
 *
 * A communicator is a segment named in its unique id: a header, then one
 * slot a rank. Its collectives are non-blocking as NCCL's are with
 * ncclConfig_t.blocking = 0: a collective only records what to do and
 * returns ncclInProgress; ncclCommGetAsyncError moves it along and says
 * ncclInProgress until it is done. Op k (1, 2, ... on each communicator)
 * goes in two steps: once every rank has finished op k - 1, this rank
 * copies what it sends into its slot and says so (posted = k); once every
 * rank has posted k, it computes its result from the slots, reducing in
 * rank order (the shm communicator's order, so the staging path's bits),
 * and says it is done (done = k). Init completes once every rank has
 * attached. ncclSend and ncclRecv are such ops too, on a communicator of
 * two ranks (all a pipeline's streams use): the sender's post is its
 * message, the receiver's result a copy of it, so neither finishes before
 * the other has reached it (NCCL's send waits for its receive); the two
 * must match (send against recv, the count, the peer), else both fail.
 *
 * DTRAIN_FAKE_NCCL_FAULT=KIND:K[:R] breaks op K on rank R (default: the
 * last rank):
 *   hang   rank R never posts op K: every rank's op K stays in progress
 *          (K = 0: the init, which rank R never joins);
 *   error  rank R's ncclCommGetAsyncError says ncclSystemError at op K;
 *   abort  rank R's process aborts (SIGABRT) in its call of op K.
 * DTRAIN_FAKE_NCCL_VERSION: the version it reports (default 22809). */
#include "comm/nccl/nccl_api.h"
#include "core/bf16.h"
#include "core/f16.h"

#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define API __attribute__((visibility("default")))

enum { MAX_RANKS = 64, SLOT = 64 << 20 };  // (slots are sparse: only what a test writes is memory)

typedef struct {
    _Atomic int joined;
    _Atomic uint64_t posted[MAX_RANKS], done[MAX_RANKS];
    int kind[MAX_RANKS];      // each rank's op as posted: its kind, count, root (a send's or recv's peer)
    size_t count[MAX_RANKS];
    int root[MAX_RANKS];
} header;

typedef enum { IDLE, INIT, WAIT_SLOT, WAIT_PEERS, FAILED } phase;

typedef struct {
    int kind;  // 0 allreduce, 1 reduce_scatter, 2 allgather, 3 broadcast, 4 reduce, 5 send, 6 recv
    const void *send;
    void *recv;
    size_t count;
    ncclDataType_t t;
    ncclRedOp_t op;
    int root;
} coll;

struct ncclComm {
    int rank, n;
    char name[NCCL_UNIQUE_ID_BYTES];
    header *h;
    char *slots;
    size_t bytes;
    phase ph;
    uint64_t op;  // the op in flight or the last one
    coll c;
    ncclResult_t err;
    char last[256];
};

static size_t tsize(ncclDataType_t t) {
    return t == ncclInt8 || t == ncclUint8 ? 1 : t == ncclFloat16 || t == ncclBfloat16 ? 2
           : t == ncclInt32 || t == ncclUint32 || t == ncclFloat32 ? 4 : 8;
}

// ---- the fault of DTRAIN_FAKE_NCCL_FAULT ----------------------------------------

static int fault_at(const ncclComm_t c, const char *kind) {
    const char *e = getenv("DTRAIN_FAKE_NCCL_FAULT");
    char k[16];
    unsigned long long op;
    int r = c->n - 1;
    if (!e || sscanf(e, "%15[a-z]:%llu:%d", k, &op, &r) < 2) return 0;
    return !strcmp(k, kind) && op == c->op && r == c->rank;
}

// ---- the API ------------------------------------------------------------------

API ncclResult_t ncclGetVersion(int *version) {
    const char *e = getenv("DTRAIN_FAKE_NCCL_VERSION");
    *version = e && *e ? atoi(e) : 22809;
    return ncclSuccess;
}

API const char *ncclGetErrorString(ncclResult_t r) {
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    }
    return "unknown result code";
}

API const char *ncclGetLastError(ncclComm_t c) { return c ? c->last : ""; }

API ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    static _Atomic int k;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    memset(id, 0, sizeof *id);
    snprintf(id->internal, sizeof id->internal, "/dtrain-fake-nccl-%d-%d-%ld", (int)getpid(), atomic_fetch_add(&k, 1),
             ts.tv_nsec);
    return ncclSuccess;
}

static ncclResult_t fail(ncclComm_t c, ncclResult_t r, const char *msg) {
    snprintf(c->last, sizeof c->last, "fake NCCL: %s", msg);
    c->err = r;
    c->ph = FAILED;
    return r;
}

API ncclResult_t ncclCommInitRankConfig(ncclComm_t *out, int nranks, ncclUniqueId id, int rank, dt_nccl_config *cfg) {
    *out = NULL;
    if (nranks < 1 || nranks > MAX_RANKS || rank < 0 || rank >= nranks) return ncclInvalidArgument;
    if (!cfg || cfg->magic != DT_NCCL_CONFIG_MAGIC || cfg->version < DT_NCCL_CONFIG_VERSION ||
        cfg->size < sizeof *cfg || cfg->blocking != 0)
        return ncclInvalidArgument;  // (dtrain's communicators are non-blocking)
    ncclComm_t c = calloc(1, sizeof *c);
    if (!c) return ncclSystemError;
    c->rank = rank;
    c->n = nranks;
    memcpy(c->name, id.internal, sizeof c->name);
    c->name[sizeof c->name - 1] = 0;
    c->bytes = sizeof(header) + (size_t)nranks * SLOT;
    int fd = shm_open(c->name, O_RDWR | O_CREAT, 0600);
    void *m = MAP_FAILED;
    if (fd >= 0 && ftruncate(fd, (off_t)c->bytes) == 0)
        m = mmap(NULL, c->bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
    if (fd >= 0) close(fd);
    if (m == MAP_FAILED) {
        free(c);
        return ncclSystemError;
    }
    c->h = m;
    c->slots = (char *)m + sizeof(header);
    if (!fault_at(c, "hang")) atomic_fetch_add(&c->h->joined, 1);
    c->ph = INIT;
    *out = c;
    return ncclInProgress;
}

static int all_at_least(_Atomic uint64_t *v, int n, uint64_t k) {
    for (int p = 0; p < n; p++)
        if (atomic_load(&v[p]) < k) return 0;
    return 1;
}

// What rank p's slot holds of op c->c: p's send buffer.
static const char *slot(ncclComm_t c, int p) { return c->slots + (size_t)p * SLOT; }

static size_t send_bytes(ncclComm_t c) {
    size_t b = c->c.count * tsize(c->c.t);
    return c->c.kind == 1 ? b * (size_t)c->n : (c->c.kind == 3 && c->rank != c->c.root) || c->c.kind == 6 ? 0 : b;
}

#define REDUCE(T)                                                                                   \
    for (size_t i = 0; i < len; i++) {                                                              \
        T a = ((const T *)(slot(c, 0) + off))[i];                                                   \
        for (int p = 1; p < c->n; p++) {                                                            \
            T b = ((const T *)(slot(c, p) + off))[i];                                               \
            a = op == ncclMax ? (b > a ? b : a) : op == ncclMin ? (b < a ? b : a) : op == ncclProd ? a * b : a + b; \
        }                                                                                           \
        ((T *)out)[i] = op == ncclAvg ? (T)(a / (T)c->n) : a;                                       \
    }

// A 16-bit float widened, and an fp32 rounded to it (nearest even): bf16
// by core/bf16.h's bits, fp16 by core/f16.h's (IEEE binary16).
static float wide16(uint16_t h, int bf) { return bf ? dt_bf16_to_f32(h) : dt_f16_to_f32(h); }

static uint16_t narrow16(float f, int bf) { return bf ? dt_f32_to_bf16(f) : dt_f32_to_f16(f); }

// 16-bit floats summed as the host's communicator sums them (comm/reduce.c):
// accumulated in fp32 in rank order, the sum rounded once (real NCCL rounds
// each step of its ring: the same bits at 2 ranks).
static ncclResult_t reduce16(ncclComm_t c, void *out, size_t off, size_t len, int bf) {
    if (c->c.op != ncclSum) return fail(c, ncclInvalidArgument, "this fake sums 16-bit floats only");
    for (size_t i = 0; i < len; i++) {
        float a = wide16(((const uint16_t *)(slot(c, 0) + off))[i], bf);
        for (int p = 1; p < c->n; p++) a += wide16(((const uint16_t *)(slot(c, p) + off))[i], bf);
        ((uint16_t *)out)[i] = narrow16(a, bf);
    }
    return ncclSuccess;
}

// out[len] = the ranks' elements [off, off + len bytes) reduced in rank order.
static ncclResult_t reduce(ncclComm_t c, void *out, size_t off, size_t len) {
    ncclRedOp_t op = c->c.op;
    switch (c->c.t) {
    case ncclBfloat16: return reduce16(c, out, off, len, 1);
    case ncclFloat16: return reduce16(c, out, off, len, 0);
    case ncclFloat32: REDUCE(float) break;
    case ncclFloat64: REDUCE(double) break;
    case ncclInt64: REDUCE(int64_t) break;
    case ncclInt32: REDUCE(int32_t) break;
    case ncclUint8: REDUCE(uint8_t) break;
    default:
        return fail(c, ncclInvalidArgument, "this fake reduces float32, float64, int64, int32, uint8, bf16 and fp16 only");
    }
    return ncclSuccess;
}

// A send or recv against its peer's post: the other of the pair, to this
// rank, of the same count.
static ncclResult_t matched(ncclComm_t c) {
    int q = c->c.root, want = c->c.kind == 5 ? 6 : 5;
    if (c->h->kind[q] == want && c->h->root[q] == c->rank && c->h->count[q] == c->c.count) return ncclSuccess;
    char msg[200];
    snprintf(msg, sizeof msg, "rank %d's %s of %zu to rank %d met rank %d's op %d of %zu with rank %d", c->rank,
             c->c.kind == 5 ? "send" : "recv", c->c.count, q, q, c->h->kind[q], c->h->count[q], c->h->root[q]);
    return fail(c, ncclInvalidUsage, msg);
}

static ncclResult_t finish(ncclComm_t c) {
    size_t es = tsize(c->c.t), b = c->c.count * es;
    if (c->c.kind >= 5 && matched(c) != ncclSuccess) return c->err;
    switch (c->c.kind) {
    case 0: return reduce(c, c->c.recv, 0, c->c.count);
    case 1: return reduce(c, c->c.recv, (size_t)c->rank * b, c->c.count);
    case 2:
        for (int p = 0; p < c->n; p++) memcpy((char *)c->c.recv + (size_t)p * b, slot(c, p), b);
        return ncclSuccess;
    case 3: memcpy(c->c.recv, slot(c, c->c.root), b); return ncclSuccess;
    case 5: return ncclSuccess;
    case 6: memcpy(c->c.recv, slot(c, c->c.root), b); return ncclSuccess;
    default: return c->rank == c->c.root ? reduce(c, c->c.recv, 0, c->c.count) : ncclSuccess;
    }
}

// Moves the op in flight along: its post, then its result.
static void progress(ncclComm_t c) {
    if (c->ph == INIT && atomic_load(&c->h->joined) == c->n) {
        if (c->rank == 0) shm_unlink(c->name);  // (every rank has it mapped: the name is no longer needed)
        c->ph = IDLE;
    }
    if (c->ph == WAIT_SLOT && all_at_least(c->h->done, c->n, c->op - 1) && !fault_at(c, "hang")) {
        if (send_bytes(c)) memcpy(c->slots + (size_t)c->rank * SLOT, c->c.send, send_bytes(c));
        c->h->kind[c->rank] = c->c.kind, c->h->count[c->rank] = c->c.count, c->h->root[c->rank] = c->c.root;
        atomic_store(&c->h->posted[c->rank], c->op);
        c->ph = WAIT_PEERS;
    }
    if (c->ph == WAIT_PEERS && all_at_least(c->h->posted, c->n, c->op)) {
        if (finish(c) != ncclSuccess) return;
        atomic_store(&c->h->done[c->rank], c->op);
        c->ph = IDLE;
    }
}

API ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t *state) {
    if (!c) return ncclInvalidArgument;
    progress(c);
    *state = c->ph == FAILED ? c->err : c->ph == IDLE ? ncclSuccess : ncclInProgress;
    return ncclSuccess;
}

static ncclResult_t enqueue(ncclComm_t c, coll k) {
    if (!c) return ncclInvalidArgument;
    if (c->ph == FAILED) return c->err;
    if (c->ph != IDLE) return fail(c, ncclInvalidUsage, "a collective while the previous one is in progress");
    if (send_bytes(c) > SLOT) return fail(c, ncclInvalidArgument, "a message larger than the fake's slot");
    c->op++;
    c->c = k;
    c->ph = WAIT_SLOT;
    if (fault_at(c, "abort")) {
        fprintf(stderr, "fake NCCL: rank %d aborts in op %llu (DTRAIN_FAKE_NCCL_FAULT)\n", c->rank,
                (unsigned long long)c->op);
        abort();
    }
    if (fault_at(c, "error")) {
        char msg[128];
        snprintf(msg, sizeof msg, "an error injected at op %llu on rank %d (DTRAIN_FAKE_NCCL_FAULT)",
                 (unsigned long long)c->op, c->rank);
        fail(c, ncclSystemError, msg);
        return ncclInProgress;  // (said by ncclCommGetAsyncError, as NCCL says an asynchronous error)
    }
    progress(c);
    return ncclInProgress;
}

API ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t t, ncclRedOp_t op,
                               ncclComm_t c, cudaStream_t_ stream) {
    (void)stream;
    return enqueue(c, (coll){0, send, recv, count, t, op, 0});
}

API ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t count, ncclDataType_t t, ncclRedOp_t op,
                                   ncclComm_t c, cudaStream_t_ stream) {
    (void)stream;
    return enqueue(c, (coll){1, send, recv, count, t, op, 0});
}

API ncclResult_t ncclAllGather(const void *send, void *recv, size_t count, ncclDataType_t t, ncclComm_t c,
                               cudaStream_t_ stream) {
    (void)stream;
    return enqueue(c, (coll){2, send, recv, count, t, ncclSum, 0});
}

API ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, ncclDataType_t t, int root, ncclComm_t c,
                               cudaStream_t_ stream) {
    (void)stream;
    return enqueue(c, (coll){3, send, recv, count, t, ncclSum, root});
}

API ncclResult_t ncclReduce(const void *send, void *recv, size_t count, ncclDataType_t t, ncclRedOp_t op, int root,
                            ncclComm_t c, cudaStream_t_ stream) {
    (void)stream;
    return enqueue(c, (coll){4, send, recv, count, t, op, root});
}

// A send's or recv's peer: the other rank of a communicator of two.
static ncclResult_t p2p(ncclComm_t c, coll k) {
    if (!c) return ncclInvalidArgument;
    if (c->n != 2 || k.root != 1 - c->rank)
        return fail(c, ncclInvalidArgument, "this fake sends and receives between the two ranks of a communicator of 2");
    return enqueue(c, k);
}

API ncclResult_t ncclSend(const void *send, size_t count, ncclDataType_t t, int peer, ncclComm_t c,
                          cudaStream_t_ stream) {
    (void)stream;
    return p2p(c, (coll){5, send, NULL, count, t, ncclSum, peer});
}

API ncclResult_t ncclRecv(void *recv, size_t count, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t_ stream) {
    (void)stream;
    return p2p(c, (coll){6, NULL, recv, count, t, ncclSum, peer});
}

static ncclResult_t release(ncclComm_t c) {
    if (!c) return ncclInvalidArgument;
    if (c->ph == INIT && c->rank == 0) shm_unlink(c->name);
    munmap(c->h, c->bytes);
    free(c);
    return ncclSuccess;
}

API ncclResult_t ncclCommAbort(ncclComm_t c) { return release(c); }
API ncclResult_t ncclCommDestroy(ncclComm_t c) { return release(c); }
