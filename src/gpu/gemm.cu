/* The GEMM on the GPU: dt_sgemm's row-major contract by cublasLtMatmul in
 * fp32 (TF32 where dt_gpu_set_tf32 says) or on 16-bit operands, bf16 or
 * fp16 (dt_gpu_gemm16), its column-major arguments from gemm_args.h, and the
 * epilogues the linear layer asks for (lt.h). cuBLASLt is loaded at its
 * first use (dt_gpu_lib_open, dl.c: libcublasLt.so.<the build's major>), so
 * that dtrain needs no CUDA library to start and a machine without cuBLAS
 * is told so by name. One device: the handle and the workspace belong to
 * the device current at that first use. */
#include "gpu/cuda_check.h"
#include "gpu/gemm_args.h"
#include "gpu/gpu.h"
#include "gpu/launch.h"
#include "gpu/lt.h"

#include <cublasLt.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

// The functions of cuBLASLt dtrain calls, resolved from the library.
#define LT_FUNCS(X)                                                                                     \
    X(cublasLtGetVersion) X(cublasLtGetStatusName) X(cublasLtGetStatusString) X(cublasLtCreate)         \
    X(cublasLtMatmulDescCreate) X(cublasLtMatmulDescDestroy) X(cublasLtMatmulDescSetAttribute)          \
    X(cublasLtMatrixLayoutCreate) X(cublasLtMatrixLayoutDestroy) X(cublasLtMatrixLayoutSetAttribute)   \
    X(cublasLtMatmulPreferenceCreate)                                                                   \
    X(cublasLtMatmulPreferenceDestroy) X(cublasLtMatmulPreferenceSetAttribute)                         \
    X(cublasLtMatmulAlgoGetHeuristic) X(cublasLtMatmul)

static const uint64_t WORKSPACE = 32u << 20;  // cuBLASLt's scratch (its kernels' split-K and the like)

static struct {
#define LT_FIELD(f) decltype(&::f) f;
    LT_FUNCS(LT_FIELD)
#undef LT_FIELD
    cublasLtHandle_t handle;
    void *workspace;
    int device;
    dt_status st;  // of the first use: DT_OK, or the error, kept in why
    char why[512];
} lt;
static pthread_once_t lt_once = PTHREAD_ONCE_INIT;
static int g_tf32;

static void lt_load(void) {
    lt.st = DT_ERR_INTERNAL;
    dt_gpu_lib lib;
    if (dt_gpu_lib_open("cublaslt", &lib) != DT_OK) {  // (found, its version checked: dl.c)
        snprintf(lt.why, sizeof lt.why, "GPU: %s", dt_last_error());
        return;
    }
#define LT_SYM(f)                                                                                       \
    if (!(lt.f = (decltype(&::f))dt_gpu_lib_sym(&lib, #f))) {                                           \
        snprintf(lt.why, sizeof lt.why, "GPU: %.400s has no %s", lib.path, #f);                         \
        return;                                                                                         \
    }
    LT_FUNCS(LT_SYM)
#undef LT_SYM
    cudaError_t e = cudaGetDevice(&lt.device);
    if (e == cudaSuccess) e = cudaMalloc(&lt.workspace, WORKSPACE);
    if (e != cudaSuccess) {
        snprintf(lt.why, sizeof lt.why, "GPU: cuBLASLt's workspace: %s (%s)", cudaGetErrorString(e), cudaGetErrorName(e));
        return;
    }
    cublasStatus_t s = lt.cublasLtCreate(&lt.handle);
    if (s != CUBLAS_STATUS_SUCCESS) {
        snprintf(lt.why, sizeof lt.why, "GPU: cublasLtCreate: %s (%s)", lt.cublasLtGetStatusString(s),
                 lt.cublasLtGetStatusName(s));
        return;
    }
    lt.st = DT_OK;
}

#define DT_LT(call)                                                                                     \
    do {                                                                                                \
        cublasStatus_t dt_s_ = lt.call;                                                                 \
        if (dt_s_ != CUBLAS_STATUS_SUCCESS)                                                             \
            return dt_error(DT_ERR_INTERNAL, "GPU: %s: %s (%s)", #call, lt.cublasLtGetStatusString(dt_s_), \
                            lt.cublasLtGetStatusName(dt_s_));                                           \
    } while (0)

// What one matmul creates, destroyed by dt_gpu_lt_run whatever happened.
struct lt_call {
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulPreference_t pref;
};

// cuBLASLt's algorithm kept per call shape: the heuristic's answer for the
// same descriptors and preferences is the same, and asking it costs more
// than a small GEMM (a launch-bound model asks hundreds of times a step).
// The key is everything the descriptors are made of (the layouts, types,
// epilogue, TF32, whether there is a bias or aux, the pointers'
// alignments); LT_CACHE shapes are kept, more are asked each time.
typedef struct {  // (no padding the compiler may leave unset: the key is compared with memcmp)
    dt_cm_gemm g;
    int ab, epilogue, tf32, bias, aux, aux_ld, batch, pad0;
    long long strides[3];
    uint32_t al[3], pad1;
} lt_key;
typedef struct {
    lt_key key;
    int found;
    cublasLtMatmulAlgo_t algo;
} lt_entry;
enum { LT_CACHE = 512 };
static lt_entry lt_cache[LT_CACHE];
static int lt_cached;
static pthread_mutex_t lt_cache_lock = PTHREAD_MUTEX_INITIALIZER;

static lt_key key_of(const dt_lt_op *o, const uint32_t al[3]) {
    lt_key k;
    memset(&k, 0, sizeof k);  // (padding compared too)
    k.g = *o->g;
    k.ab = (int)o->ab, k.epilogue = (int)o->epilogue, k.tf32 = g_tf32, k.bias = o->bias != NULL,
    k.aux = o->aux != NULL, k.aux_ld = o->aux ? o->aux_ld : 0, k.batch = o->batch > 1 ? o->batch : 1;
    k.strides[0] = o->stride_first, k.strides[1] = o->stride_second, k.strides[2] = o->stride_c;
    for (int i = 0; i < 3; i++) k.al[i] = al[i];
    return k;
}

// The kept answer for k (1), or 0.
static int cache_find(const lt_key *k, int *found, cublasLtMatmulAlgo_t *algo) {
    pthread_mutex_lock(&lt_cache_lock);
    int hit = 0;
    for (int i = 0; i < lt_cached && !hit; i++)
        if (!memcmp(&lt_cache[i].key, k, sizeof *k)) {
            *found = lt_cache[i].found, *algo = lt_cache[i].algo;
            hit = 1;
        }
    pthread_mutex_unlock(&lt_cache_lock);
    return hit;
}

static void cache_keep(const lt_key *k, int found, const cublasLtMatmulAlgo_t *algo) {
    pthread_mutex_lock(&lt_cache_lock);
    if (lt_cached < LT_CACHE) {
        lt_entry *e = &lt_cache[lt_cached++];
        e->key = *k, e->found = found, e->algo = *algo;
    }
    pthread_mutex_unlock(&lt_cache_lock);
}

// The alignment of a device pointer, as cuBLASLt's preferences take it:
// the largest power of two up to 256 dividing its address (cuBLASLt assumes
// 256 unless told; a block inside a larger one may be aligned to 4 bytes,
// a bf16 one to 2), and of every matrix of a strided batch (stride bytes
// apart) after it.
static uint32_t alignment(const void *p, long long stride_bytes) {
    uint32_t a = 256;
    while (a > 2 && ((uintptr_t)p % a || (unsigned long long)stride_bytes % a)) a /= 2;
    return a;
}

// A layout of a strided batch (o->batch > 1): its count and stride.
static dt_status batched(cublasLtMatrixLayout_t l, int batch, long long stride) {
    if (batch <= 1) return DT_OK;
    int32_t n = batch;
    int64_t s = stride;
    DT_LT(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &n, sizeof n));
    DT_LT(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &s, sizeof s));
    return DT_OK;
}

// One call: its algorithm from the cache (else cuBLASLt's heuristic, then
// kept), the call queued; a replayed graph step's (dt_gpu_skipping) ends at
// the cache, which its capture filled: no descriptor is made again.
static dt_status lt_matmul(lt_call *x, const dt_lt_op *o, int *found) {
    const dt_cm_gemm *g = o->g;
    long long eb = o->ab == CUDA_R_32F ? 4 : 2;  // (the operands' element bytes; C's 4)
    uint32_t al[3] = {alignment(o->first, eb * o->stride_first), alignment(o->second, eb * o->stride_second),
                      alignment(o->C, 4 * o->stride_c)};
    cublasLtMatmulHeuristicResult_t h;
    memset(&h, 0, sizeof h);
    lt_key key = key_of(o, al);
    int cached = cache_find(&key, found, &h.algo);
    if (cached && (dt_gpu_skipping || *found < 1)) return DT_OK;
    DT_LT(cublasLtMatmulDescCreate(&x->op, g_tf32 && o->ab == CUDA_R_32F ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F,
                                   CUDA_R_32F));
    cublasOperation_t ta = g->transa ? CUBLAS_OP_T : CUBLAS_OP_N, tb = g->transb ? CUBLAS_OP_T : CUBLAS_OP_N;
    DT_LT(cublasLtMatmulDescSetAttribute(x->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    DT_LT(cublasLtMatmulDescSetAttribute(x->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    if (o->epilogue != CUBLASLT_EPILOGUE_DEFAULT) {
        DT_LT(cublasLtMatmulDescSetAttribute(x->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &o->epilogue, sizeof o->epilogue));
        if (o->bias) DT_LT(cublasLtMatmulDescSetAttribute(x->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &o->bias, sizeof o->bias));
        if (o->aux) {
            int64_t ld = o->aux_ld;
            DT_LT(cublasLtMatmulDescSetAttribute(x->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &o->aux, sizeof o->aux));
            DT_LT(cublasLtMatmulDescSetAttribute(x->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld));
            cudaDataType_t at = CUDA_R_32F;  // (fp32 whatever the operands: the plain path's kernels read it too)
            DT_LT(cublasLtMatmulDescSetAttribute(x->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &at, sizeof at));
        }
    }
    DT_LT(cublasLtMatrixLayoutCreate(&x->a, o->ab, g->a.rows, g->a.cols, g->a.ld));
    DT_LT(cublasLtMatrixLayoutCreate(&x->b, o->ab, g->b.rows, g->b.cols, g->b.ld));
    DT_LT(cublasLtMatrixLayoutCreate(&x->c, CUDA_R_32F, g->c.rows, g->c.cols, g->c.ld));
    dt_status bst = batched(x->a, o->batch, o->stride_first);
    if (bst == DT_OK) bst = batched(x->b, o->batch, o->stride_second);
    if (bst == DT_OK) bst = batched(x->c, o->batch, o->stride_c);
    if (bst != DT_OK) return bst;
    DT_LT(cublasLtMatmulPreferenceCreate(&x->pref));
    DT_LT(cublasLtMatmulPreferenceSetAttribute(x->pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &WORKSPACE,
                                               sizeof WORKSPACE));
    DT_LT(cublasLtMatmulPreferenceSetAttribute(x->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al[0], sizeof *al));
    DT_LT(cublasLtMatmulPreferenceSetAttribute(x->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al[1], sizeof *al));
    DT_LT(cublasLtMatmulPreferenceSetAttribute(x->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al[2], sizeof *al));
    DT_LT(cublasLtMatmulPreferenceSetAttribute(x->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al[2], sizeof *al));
    if (!cached) {
        // (no algorithm for this epilogue or layout: NOT_SUPPORTED, or none found)
        cublasStatus_t hs = lt.cublasLtMatmulAlgoGetHeuristic(lt.handle, x->op, x->a, x->b, x->c, x->c, x->pref, 1, &h,
                                                              found);
        if (hs == CUBLAS_STATUS_NOT_SUPPORTED ||
            (hs == CUBLAS_STATUS_SUCCESS && *found > 0 && h.state != CUBLAS_STATUS_SUCCESS))
            *found = 0;
        else if (hs != CUBLAS_STATUS_SUCCESS)
            return dt_error(DT_ERR_INTERNAL, "GPU: cublasLtMatmulAlgoGetHeuristic: %s (%s)",
                            lt.cublasLtGetStatusString(hs), lt.cublasLtGetStatusName(hs));
        *found = *found > 0;
        cache_keep(&key, *found, &h.algo);
    }
    if (*found < 1) return DT_OK;
    if (!dt_gpu_skipping)
        DT_LT(cublasLtMatmul(lt.handle, x->op, &o->alpha, o->first, x->a, o->second, x->b, &o->beta, o->C, x->c, o->C,
                             x->c, &h.algo, lt.workspace, WORKSPACE, dt_cu_stream));
    return DT_OK;
}

// cuBLASLt loaded, on the device this thread uses.
static dt_status lt_ready(void) {
    pthread_once(&lt_once, lt_load);
    if (lt.st != DT_OK) return dt_error(lt.st, "%s", lt.why);
    int dev = -1;
    DT_CUDA(cudaGetDevice(&dev));
    if (dev != lt.device)
        return dt_error(DT_ERR_INTERNAL, "GPU GEMM: cuBLASLt was set up on cuda:%d, this thread uses cuda:%d", lt.device,
                        dev);
    return DT_OK;
}

dt_status dt_gpu_lt_run(const dt_lt_op *o, int *found) {
    *found = 0;
    dt_status st = lt_ready();
    if (st != DT_OK) return st;
    lt_call x = {};
    st = lt_matmul(&x, o, found);
    if (x.pref) lt.cublasLtMatmulPreferenceDestroy(x.pref);
    if (x.c) lt.cublasLtMatrixLayoutDestroy(x.c);
    if (x.b) lt.cublasLtMatrixLayoutDestroy(x.b);
    if (x.a) lt.cublasLtMatrixLayoutDestroy(x.a);
    if (x.op) lt.cublasLtMatmulDescDestroy(x.op);
    if (st == DT_OK && *found) DT_CUDA(cudaGetLastError());
    return st;
}

// The plain GEMM (no epilogue) of g on operands of type ab, over a strided
// batch of `batch` (dtrain's strides: sa of A, sb of B, sc of C; where
// cuBLASLt has no algorithm for the batch, a call a matrix): an error when
// cuBLASLt has no algorithm for it.
static dt_status lt_gemm(const dt_cm_gemm *g, cudaDataType_t ab, float alpha, const void *A, const void *B, float beta,
                         float *C, int batch, long long sa, long long sb, long long sc) {
    dt_lt_op o = {g, ab, CUBLASLT_EPILOGUE_DEFAULT, NULL, NULL, 0, alpha, beta, g->b_first ? B : A, g->b_first ? A : B, C,
                  batch, g->b_first ? sb : sa, g->b_first ? sa : sb, sc};
    int found = 0;
    dt_status st = dt_gpu_lt_run(&o, &found);
    if (st != DT_OK || found) return st;
    if (batch > 1) {  // (no algorithm for the batch: a call a matrix)
        size_t eb = ab == CUDA_R_32F ? 4 : 2;
        for (int i = 0; i < batch && st == DT_OK; i++)
            st = lt_gemm(g, ab, alpha, (const char *)A + i * sa * eb, (const char *)B + i * sb * eb, beta, C + i * sc,
                         1, 0, 0, 0);
        return st;
    }
    return dt_error(DT_ERR_INTERNAL, "GPU: cuBLASLt has no algorithm for the %s GEMM m %d n %d k %d (transa %d, transb %d)",
                    ab == CUDA_R_16BF ? "bf16" : ab == CUDA_R_16F ? "fp16" : "fp32", g->m, g->n, g->k, g->transa,
                    g->transb);
}

// C = beta C over M rows of N (beta 0: zeros, C not read): a product over K = 0.
__global__ static void scale_kernel(float *C, size_t M, size_t N, size_t ldc, float beta) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < M * N; i += (size_t)gridDim.x * blockDim.x) {
        float *c = &C[i / N * ldc + i % N];
        *c = beta == 0.0f ? 0.0f : beta * *c;
    }
}

void dt_gpu_set_tf32(int on) { g_tf32 = on != 0; }
int dt_gpu_tf32(void) { return g_tf32; }

// dt_sgemm's arguments checked and made column-major; *done when nothing
// is left for cuBLASLt (an empty C; K = 0: C = beta C).
static dt_status prepare(const char *what, int ta, int tb, int M, int N, int K, int lda, int ldb, float beta, float *C,
                         int ldc, dt_cm_gemm *g, int *done) {
    *done = 1;
    if (dt_gemm_colmajor(ta, tb, M, N, K, lda, ldb, ldc, g) != 0)
        return dt_error(DT_ERR_ARG, "GPU %s: bad arguments (ta %d tb %d M %d N %d K %d lda %d ldb %d ldc %d)", what, ta,
                        tb, M, N, K, lda, ldb, ldc);
    if (M == 0 || N == 0) return DT_OK;
    if (K == 0) {
        size_t n = (size_t)M * N;
        DT_RUN(scale_kernel, dt_launch_blocks(n, DT_THREADS), DT_THREADS, 0, C, M, N, ldc, beta);
        DT_LAUNCHED(scale_kernel);
        return DT_OK;
    }
    *done = 0;
    return DT_OK;
}

dt_status dt_gpu_sgemm(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                       int ldb, float beta, float *C, int ldc) {
    dt_cm_gemm g;
    int done;
    dt_status st = prepare("sgemm", ta, tb, M, N, K, lda, ldb, beta, C, ldc, &g, &done);
    if (st != DT_OK || done) return st;
    return lt_gemm(&g, CUDA_R_32F, alpha, A, B, beta, C, 1, 0, 0, 0);
}

dt_status dt_gpu_gemm16(dt_dtype t, int ta, int tb, int M, int N, int K, float alpha, const void *A, int lda,
                        const void *B, int ldb, float beta, float *C, int ldc) {
    if (t != DT_BF16 && t != DT_F16)
        return dt_error(DT_ERR_ARG, "GPU 16-bit GEMM: operands of type %s (BF16 or F16 only)", dt_dtype_name(t));
    dt_cm_gemm g;
    int done;
    const char *what = t == DT_BF16 ? "bf16 GEMM" : "fp16 GEMM";
    dt_status st = prepare(what, ta, tb, M, N, K, lda, ldb, beta, C, ldc, &g, &done);
    if (st != DT_OK || done) return st;
    return lt_gemm(&g, dt_lt_type(t), alpha, A, B, beta, C, 1, 0, 0, 0);
}

dt_status dt_gpu_gemm_batched(dt_dtype t, int ta, int tb, int M, int N, int K, float alpha, const void *A, int lda,
                              long long sa, const void *B, int ldb, long long sb, float beta, float *C, int ldc,
                              long long sc, int batch) {
    if (t != DT_F32 && t != DT_BF16 && t != DT_F16)
        return dt_error(DT_ERR_ARG, "GPU batched GEMM: operands of type %s (F32, BF16 or F16 only)", dt_dtype_name(t));
    if (batch < 0 || sa < 0 || sb < 0 || sc < 0)
        return dt_error(DT_ERR_ARG, "GPU batched GEMM: batch %d, strides %lld %lld %lld", batch, sa, sb, sc);
    dt_cm_gemm g;
    int done = 1;
    dt_status st = DT_OK;
    for (int i = 0; i < (K == 0 ? batch : 1) && st == DT_OK; i++)  // (K = 0: C = beta C, a matrix at a time)
        st = prepare("batched GEMM", ta, tb, M, N, K, lda, ldb, beta, C + i * sc, ldc, &g, &done);
    if (st != DT_OK || done || batch == 0) return st;
    return lt_gemm(&g, dt_lt_type(t), alpha, A, B, beta, C, batch, sa, sb, sc);
}
