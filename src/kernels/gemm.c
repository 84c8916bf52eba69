/* dt_sgemm on oneDNN (in a build without it, the portable GEMM of
 * gemm_portable.c, fp32 compute in every precision). In fp32 it is
 * oneDNN's sgemm: on this class of CPU (AVX-512) it runs at 150/250
 * GFLOPS on 1/2 cores with no tuning, where Debian's OpenBLAS mis-detects
 * the core type and reaches 20-36 unless told by environment variables
 * (docs/benchmarks.md has the measurements).
 *
 * In a low precision (dt_kernels_set_precision) the operands are first
 * rounded to it, packed into per-thread buffers. Where oneDNN has kernels
 * for the type on this CPU (bf16 on AVX-512 BF16 or AMX) a matmul primitive
 * multiplies them (bf16 in, fp32 accumulation and output; oneDNN's brgemm
 * kernels), made once per shape and kept; elsewhere the rounded values stay
 * fp32 and go to sgemm, which computes the same products (exact in fp32)
 * and sums them in fp32, in its own order. docs/mixed-precision.md. */
#include "kernels/kernels.h"
#ifdef DTRAIN_HAVE_ONEDNN
#include "kernels/onednn.h"
#endif

#include <omp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ----------------------------------------------------------------------------
// the engine and the precision (shared with conv.c through onednn.h)

static dt_dtype g_precision = DT_F32;

#ifdef DTRAIN_HAVE_ONEDNN
static dnnl_engine_t g_engine;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

void dt_onednn_check(dnnl_status_t s, const char *what) {
    if (s == dnnl_success) return;
    fprintf(stderr, "dtrain: internal error: oneDNN %s failed with status %d\n", what, (int)s);
    abort();
}

static void make_engine(void) {
    dt_kernels_init();
    dt_onednn_check(dnnl_engine_create(&g_engine, dnnl_cpu, 0), "engine");
}

dnnl_engine_t dt_onednn_engine(void) {
    pthread_once(&g_once, make_engine);
    return g_engine;
}

int dt_kernels_native(dt_dtype t) {
    // oneDNN 2.x has CPU kernels for bf16 from AVX-512 BF16 on (vdpbf16ps;
    // AMX's tile kernels above it), none for fp16 before AVX-512 FP16, which
    // its 2.6 does not use. The ISA it reports honours DTRAIN_ISA (applied
    // first: oneDNN fixes its ISA when first asked).
    dt_kernels_init();
    dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
    return t == DT_BF16 && (isa & dnnl_cpu_isa_avx512_core_bf16) == dnnl_cpu_isa_avx512_core_bf16;
}

const char *dt_kernels_describe(dt_dtype t) {
    dt_kernels_init();
    dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
    if (t == DT_F32) return "fp32";
    if (!dt_kernels_native(t))
        return t == DT_BF16 ? "bf16 storage, fp32 compute (no AVX-512 BF16 on this CPU)"
                            : "fp16 storage, fp32 compute (no fp16 kernels in oneDNN on this CPU)";
    return (isa & dnnl_cpu_isa_avx512_core_amx) == dnnl_cpu_isa_avx512_core_amx ? "bf16 on AMX (oneDNN brgemm)"
                                                                                 : "bf16 on AVX-512 BF16 (oneDNN brgemm)";
}
#else  // built without oneDNN: the portable GEMM, fp32 compute in every precision
int dt_kernels_native(dt_dtype t) { return (void)t, 0; }

const char *dt_kernels_describe(dt_dtype t) {
    return t == DT_F32   ? "fp32 (portable GEMM: this dtrain was built without oneDNN)"
           : t == DT_BF16 ? "bf16 storage, fp32 compute (portable GEMM: built without oneDNN)"
                          : "fp16 storage, fp32 compute (portable GEMM: built without oneDNN)";
}
#endif

dt_status dt_kernels_set_precision(dt_dtype t) {
    if (t != DT_F32 && t != DT_BF16 && t != DT_F16) return DT_ERR_ARG;
    g_precision = t;
    return DT_OK;
}

dt_dtype dt_kernels_precision(void) { return g_precision; }

#ifdef DTRAIN_HAVE_ONEDNN
dt_dtype dt_onednn_precision(int *native) {
    *native = g_precision != DT_F32 && dt_kernels_native(g_precision);
    return g_precision;
}
#endif

// ----------------------------------------------------------------------------
// fp32

static void sgemm(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B, int ldb,
                  float beta, float *C, int ldc) {
#ifndef DTRAIN_HAVE_ONEDNN
    dt_sgemm_portable(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
#else
    dnnl_status_t s = dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    if (s != dnnl_success) {
        // Only argument errors are possible here: a programmer error.
        fprintf(stderr, "dtrain: internal error: dnnl_sgemm status %d (M=%d N=%d K=%d)\n", (int)s, M, N, K);
        abort();
    }
#endif
}

// ----------------------------------------------------------------------------
// low precision

// A growing buffer of this thread's (the attention kernels call GEMMs from
// inside a parallel region, one per thread).
typedef struct {
    void *p;
    size_t cap;
} tbuf;
static _Thread_local tbuf tl_a, tl_b;

static void *room(tbuf *b, size_t bytes) {
    if (bytes <= b->cap) return b->p;
    free(b->p);
    b->cap = bytes + bytes / 4;
    if (!(b->p = aligned_alloc(64, (b->cap + 63) & ~(size_t)63))) {
        fprintf(stderr, "dtrain: out of memory for a GEMM operand (%zu bytes)\n", b->cap);
        abort();
    }
    return b->p;
}

// The stored matrix X[rows, cols] (row stride ld), rounded to t, packed:
// as t (native) or as fp32 values of t.
static void *pack(tbuf *b, const float *X, int rows, int cols, int ld, dt_dtype t, int native) {
    size_t es = native ? 2 : 4;
    char *d = room(b, (size_t)rows * cols * es);
#pragma omp parallel for schedule(static) if (!omp_in_parallel() && (size_t)rows * cols > 65536)
    for (int i = 0; i < rows; i++) {
        if (native) dt_from_f32(d + (size_t)i * cols * es, X + (size_t)i * ld, (size_t)cols, t);
        else dt_round_f32((float *)(d + (size_t)i * cols * es), X + (size_t)i * ld, (size_t)cols, t);
    }
    return d;
}

// ----------------------------------------------------------------------------
// the weights' working copy (kernels.h)
//
// The parts of the block the GEMMs read (a layer's weight matrix, the GPT's
// head) are few: a list of them, each with the epoch at which it was last
// converted; dt_kernels_weights_changed starts a new epoch. Only the
// calling thread of a forward or backward reads weights (the GEMMs called
// from parallel regions multiply activations), but a lock keeps the list
// sound for any caller.

typedef struct {
    size_t off, len;
    uint64_t epoch;  // of its last conversion
    dt_dtype t;      // to this type
} wpart;

static struct {
    const float *w;
    size_t n;
    uint16_t *copy;
    uint64_t epoch;
    wpart *parts;
    int nparts, cap;
    unsigned long long converted, reused;
} g_wc;
static pthread_mutex_t g_wc_lock = PTHREAD_MUTEX_INITIALIZER;
static _Atomic int g_wc_on;  // a copy is set: GEMMs without one skip the lock

dt_status dt_kernels_set_weights(const float *w, size_t n) {
    pthread_mutex_lock(&g_wc_lock);
    free(g_wc.copy);
    free(g_wc.parts);
    memset(&g_wc, 0, sizeof g_wc);
    g_wc_on = 0;
    dt_status st = DT_OK;
    if (w && n) {
        if ((g_wc.copy = aligned_alloc(64, (n * 2 + 63) & ~(size_t)63))) {
            g_wc.w = w;
            g_wc.n = n;
            g_wc.epoch = 1;
            g_wc_on = 1;
        } else {
            st = dt_error(DT_ERR_NOMEM, "out of memory for the weights' 16-bit working copy (%zu bytes)", n * 2);
        }
    }
    pthread_mutex_unlock(&g_wc_lock);
    return st;
}

void dt_kernels_weights_changed(void) {
    pthread_mutex_lock(&g_wc_lock);
    g_wc.epoch++;
    pthread_mutex_unlock(&g_wc_lock);
}

void dt_kernels_weights_stats(dt_kernels_wstats *s) {
    pthread_mutex_lock(&g_wc_lock);
    s->bytes = g_wc.copy ? g_wc.n * 2 : 0;
    s->converted = g_wc.converted;
    s->reused = g_wc.reused;
    pthread_mutex_unlock(&g_wc_lock);
}

// The working copy's part that is the stored matrix X[rows, cols] (row
// stride ld) in t, converted if stale, when X is a contiguous part of the
// weights; NULL when it is not.
static const uint16_t *copy_part(const float *X, int rows, int cols, int ld, dt_dtype t) {
    if (!g_wc_on || ld != cols) return NULL;
    pthread_mutex_lock(&g_wc_lock);
    uintptr_t x = (uintptr_t)X, w0 = (uintptr_t)g_wc.w;
    size_t off = (x - w0) / sizeof(float), len = (size_t)rows * (size_t)cols;
    if (!g_wc.copy || x < w0 || (x - w0) % sizeof(float) || off >= g_wc.n || len > g_wc.n - off) {
        pthread_mutex_unlock(&g_wc_lock);
        return NULL;
    }
    wpart *p = NULL;
    for (int i = 0; i < g_wc.nparts && !p; i++)
        if (g_wc.parts[i].off == off && g_wc.parts[i].len == len) p = &g_wc.parts[i];
    if (!p && g_wc.nparts == g_wc.cap) {
        int cap = g_wc.cap ? 2 * g_wc.cap : 64;
        wpart *np = realloc(g_wc.parts, (size_t)cap * sizeof *np);
        if (!np) {
            pthread_mutex_unlock(&g_wc_lock);
            return NULL;  // the plain path does the same without the copy
        }
        g_wc.parts = np;
        g_wc.cap = cap;
    }
    if (!p) {
        p = &g_wc.parts[g_wc.nparts++];
        *p = (wpart){off, len, 0, t};
    }
    uint16_t *c = g_wc.copy + off;
    if (p->epoch != g_wc.epoch || p->t != t) {
#pragma omp parallel for schedule(static) if (!omp_in_parallel() && len > 65536)
        for (size_t i = 0; i < len; i += 4096) dt_from_f32(c + i, X + i, len - i < 4096 ? len - i : 4096, t);
        p->epoch = g_wc.epoch;
        p->t = t;
        g_wc.converted += len;
    } else {
        g_wc.reused += len;
    }
    pthread_mutex_unlock(&g_wc_lock);
    return c;
}

// X from the working copy as pack() gives it (t itself when native, else
// its fp32 values); NULL when X is not a contiguous part of the weights.
static const void *from_copy(tbuf *b, const float *X, int rows, int cols, int ld, dt_dtype t, int native) {
    const uint16_t *c = copy_part(X, rows, cols, ld, t);
    if (!c || native) return c;
    size_t len = (size_t)rows * (size_t)cols;
    float *d = room(b, len * sizeof(float));
#pragma omp parallel for schedule(static) if (!omp_in_parallel() && len > 65536)
    for (size_t i = 0; i < len; i += 4096) dt_to_f32(d + i, c + i, len - i < 4096 ? len - i : 4096, t);
    return d;
}

static _Thread_local tbuf tl_slots[DT_OPERAND_SLOTS];

const void *dt_kernels_operand16(int slot, const float *X, int rows, int cols, int ld, dt_dtype t) {
    const uint16_t *c = copy_part(X, rows, cols, ld, t);
    return c ? (const void *)c : pack(&tl_slots[slot], X, rows, cols, ld, t, 1);
}

// ----------------------------------------------------------------------------
// native low-precision products (oneDNN's matmul)

#ifdef DTRAIN_HAVE_ONEDNN
static _Thread_local tbuf tl_scratch;
static _Thread_local dnnl_stream_t tl_stream;

// A matmul primitive of one shape (the operands packed, so their strides
// follow from the shape), made on first use and kept: a hash table of
// lists, never changed after insertion but at a list's head.
typedef struct gplan {
    struct gplan *next;
    int key[10];
    dnnl_memory_desc_t a, b, c, scratch;
    dnnl_primitive_t prim;
} gplan;

#define NBUCKETS 256
static gplan *g_plans[NBUCKETS];
static pthread_mutex_t g_plans_lock = PTHREAD_MUTEX_INITIALIZER;

static gplan *make_gplan(const int key[10], dt_dtype t, float alpha, float beta) {
    int ta = key[0], tb = key[1], ldc = key[5];
    dnnl_dim_t M = key[2], N = key[3], K = key[4];
    gplan *p = calloc(1, sizeof *p);
    if (!p) dt_onednn_check(dnnl_out_of_memory, "matmul plan");
    memcpy(p->key, key, sizeof p->key);
    dnnl_data_type_t lt = t == DT_BF16 ? dnnl_bf16 : dnnl_f16;
    dnnl_dims_t ad = {M, K}, bd = {K, N}, cd = {M, N};
    dnnl_dims_t as = {ta ? 1 : K, ta ? M : 1}, bs = {tb ? 1 : N, tb ? K : 1}, cs = {ldc, 1};
    dt_onednn_check(dnnl_memory_desc_init_by_strides(&p->a, 2, ad, lt, as), "matmul md");
    dt_onednn_check(dnnl_memory_desc_init_by_strides(&p->b, 2, bd, lt, bs), "matmul md");
    dt_onednn_check(dnnl_memory_desc_init_by_strides(&p->c, 2, cd, dnnl_f32, cs), "matmul md");
    dnnl_matmul_desc_t d;
    dt_onednn_check(dnnl_matmul_desc_init(&d, &p->a, &p->b, NULL, &p->c), "matmul descriptor");
    dnnl_primitive_attr_t attr;
    dt_onednn_check(dnnl_primitive_attr_create(&attr), "attr");
    dt_onednn_check(dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user), "scratchpad");
    if (alpha != 1.0f) dt_onednn_check(dnnl_primitive_attr_set_output_scales(attr, 1, 0, &alpha), "scales");
    if (beta != 0.0f) {
        dnnl_post_ops_t ops;
        dt_onednn_check(dnnl_post_ops_create(&ops), "post-ops");
        dt_onednn_check(dnnl_post_ops_append_sum(ops, beta), "sum post-op");
        dt_onednn_check(dnnl_primitive_attr_set_post_ops(attr, ops), "attr post-ops");
        dnnl_post_ops_destroy(ops);
    }
    dnnl_primitive_desc_t pd;
    dt_onednn_check(dnnl_primitive_desc_create(&pd, &d, attr, dt_onednn_engine(), NULL), "matmul");
    p->scratch = *dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    dt_onednn_check(dnnl_primitive_create(&p->prim, pd), "matmul primitive");
    dnnl_primitive_desc_destroy(pd);
    dnnl_primitive_attr_destroy(attr);
    return p;
}

static gplan *get_gplan(int ta, int tb, int M, int N, int K, float alpha, float beta, int ldc, dt_dtype t) {
    int key[10] = {ta, tb, M, N, K, ldc, 0, 0, omp_in_parallel() ? 1 : omp_get_max_threads(), (int)t};
    memcpy(&key[6], &alpha, 4);
    memcpy(&key[7], &beta, 4);
    uint32_t h = 2166136261u;
    for (int i = 0; i < 10; i++) h = (h ^ (uint32_t)key[i]) * 16777619u;
    gplan **head = &g_plans[h % NBUCKETS];
    pthread_mutex_lock(&g_plans_lock);
    gplan *p = *head;
    while (p && memcmp(p->key, key, sizeof key)) p = p->next;
    if (!p) {
        p = make_gplan(key, t, alpha, beta);
        p->next = *head;
        *head = p;
    }
    pthread_mutex_unlock(&g_plans_lock);
    return p;
}

dnnl_memory_t dt_onednn_memory(const dnnl_memory_desc_t *md, const void *data) {
    dnnl_memory_t m;
    dt_onednn_check(dnnl_memory_create(&m, md, dt_onednn_engine(), (void *)data), "memory");
    return m;
}

static void matmul(int ta, int tb, int M, int N, int K, float alpha, const void *A, const void *B, float beta,
                   float *C, int ldc, dt_dtype t) {
    gplan *p = get_gplan(ta, tb, M, N, K, alpha, beta, ldc, t);
    if (!tl_stream) dt_onednn_check(dnnl_stream_create(&tl_stream, dt_onednn_engine(), dnnl_stream_default_flags), "stream");
    size_t ss = dnnl_memory_desc_get_size(&p->scratch);
    dnnl_memory_t ma = dt_onednn_memory(&p->a, A), mb = dt_onednn_memory(&p->b, B), mc = dt_onednn_memory(&p->c, C),
                  msc = dt_onednn_memory(&p->scratch, ss ? room(&tl_scratch, ss) : NULL);
    dnnl_exec_arg_t args[] = {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}, {DNNL_ARG_SCRATCHPAD, msc}};
    dt_onednn_check(dnnl_primitive_execute(p->prim, tl_stream, 4, args), "matmul");
    dt_onednn_check(dnnl_stream_wait(tl_stream), "stream wait");
    dnnl_memory_destroy(ma);
    dnnl_memory_destroy(mb);
    dnnl_memory_destroy(mc);
    dnnl_memory_destroy(msc);
}
#else
static void matmul(int ta, int tb, int M, int N, int K, float alpha, const void *A, const void *B, float beta,
                   float *C, int ldc, dt_dtype t) {
    (void)ta, (void)tb, (void)M, (void)N, (void)K, (void)alpha, (void)A, (void)B, (void)beta, (void)C, (void)ldc,
        (void)t;
    abort();  // never: nothing is native without oneDNN
}
#endif

void dt_sgemm(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B, int ldb,
              float beta, float *C, int ldc) {
    dt_kernels_init();
    if (M == 0 || N == 0) return;
    dt_dtype t = g_precision;
    if (K == 0) {  // C = beta C, as BLAS defines it (dnnl_sgemm leaves C as it was for some transposes)
        dt_sgemm_portable(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    if (t == DT_F32) {
        sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    int native = dt_kernels_native(t);
    // The stored matrices: A is M x K (K x M when transposed), B K x N (N x K).
    int ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
    const void *pa = from_copy(&tl_a, A, ar, ac, lda, t, native), *pb = from_copy(&tl_b, B, br, bc, ldb, t, native);
    if (!pa) pa = pack(&tl_a, A, ar, ac, lda, t, native);
    if (!pb) pb = pack(&tl_b, B, br, bc, ldb, t, native);
    if (native) matmul(ta, tb, M, N, K, alpha, pa, pb, beta, C, ldc, t);
    else sgemm(ta, tb, M, N, K, alpha, pa, ac, pb, bc, beta, C, ldc);
}

// The stored matrix X[rows, cols] of t's 16-bit values (row stride ld)
// packed as pack() packs its fp32 values: t itself (native: X where it is
// packed already) or widened.
static const void *pack16(tbuf *b, const uint16_t *X, int rows, int cols, int ld, dt_dtype t, int native) {
    if (native && ld == cols) return X;  // packed already
    size_t es = native ? 2 : 4;
    char *d = room(b, (size_t)rows * cols * es);
#pragma omp parallel for schedule(static) if (!omp_in_parallel() && (size_t)rows * cols > 65536)
    for (int i = 0; i < rows; i++) {
        if (native) memcpy(d + (size_t)i * cols * es, X + (size_t)i * ld, (size_t)cols * es);
        else dt_to_f32((float *)(d + (size_t)i * cols * es), X + (size_t)i * ld, (size_t)cols, t);
    }
    return d;
}

void dt_gemm16(dt_dtype t, int ta, int tb, int M, int N, int K, float alpha, const void *A, int lda, const void *B,
               int ldb, float beta, float *C, int ldc) {
    dt_kernels_init();
    if (M == 0 || N == 0) return;
    if (K == 0) {  // C = beta C (dt_sgemm's)
        dt_sgemm_portable(ta, tb, M, N, K, alpha, NULL, lda, NULL, ldb, beta, C, ldc);
        return;
    }
    int native = dt_kernels_native(t);
    int ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
    const void *pa = pack16(&tl_a, A, ar, ac, lda, t, native), *pb = pack16(&tl_b, B, br, bc, ldb, t, native);
    if (native) matmul(ta, tb, M, N, K, alpha, pa, pb, beta, C, ldc, t);
    else sgemm(ta, tb, M, N, K, alpha, pa, ac, pb, bc, beta, C, ldc);
}
