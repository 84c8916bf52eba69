/* The GPU device (docs/gpu.md).
 *
 *   test_gpu        (ctest test_gpu, everywhere): [train] device is
 *                   refused naming what is missing (no CUDA in the build,
 *                   no driver, no such GPU), never run on the CPU instead;
 *                   bad names are refused by the config and by --device;
 *                   cuDNN and NCCL are found at run time, or refused
 *                   naming the file and the version.
 *   test_gpu ops    (ctest test_gpu_ops): every GPU op against the CPU op
 *                   on awkward sizes (1, 255, 257, a prime past 10^5, 2^20
 *                   + 7), five steps each: AdamW (with weight decay and a
 *                   gradient scale), SGD with and without momentum and
 *                   Nesterov; within 1e-6 relative. The GEMM (cuBLASLt)
 *                   against dt_sgemm for every transpose, non-square,
 *                   strided, beta 0 and 1, K = 0, operands aligned to
 *                   4 bytes only: each element within
 *                   1e-5 (fp32) or 4e-3 (TF32) of its sum of |products|.
 *                   The GPT's layers against the CPU's (dtrain/nn.h):
 *                   layernorm (C = 1, 97, 256, 771 over 2 x 37 rows),
 *                   GELU (the sizes above), softmax cross-entropy (V =
 *                   50257 padded to 50304, 257 padded to 260, 1000, 1),
 *                   forward and backward (accumulating), within 1e-5
 *                   relative (floors by op), padding never written.
 *                   The bf16 and fp16 GEMMs (the GEMM's cases, 1e-4). The GPT's
 *                   other ops: the embedding (repeated tokens, a
 *                   vocabulary-sized table), residual, ReLU, the bias's
 *                   forward, the sum of squares and the scale, bf16 and
 *                   fp16 conversions, deterministic mode's fixed point: the
 *                   CPU's bits; the bias's gradient within 1e-5 of each
 *                   column's sum of |terms|, the same bits twice;
 *                   error feedback's rounding to bf16 and fp16
 *                   (dt_gpu_from_f32_ef): dt_from_f32_ef's bits;
 *                   the communication stream (after the kernels, or
 *                   after an event recorded twice: done); attention (T = 1, 37, 70, 257, 1024; head
 *                   sizes 1 to 128 fused, the same bits twice; 258 and
 *                   512 on GEMMs, the upper triangles zeros) within 1e-5
 *                   (normwise where sums cancel), and with its
 *                   products in bf16 and fp16 against the CPU's in that
 *                   precision (1e-2, 2e-3 normwise); the linear layer
 *                   with and without bias and with GELU (cuBLASLt's
 *                   epilogues, or the plain path), on fp32 and on bf16
 *                   and fp16 operands, within 1e-5 of each element's sum
 *                   of |terms| (1e-3 for cuBLASLt's GELU).
 *                   Reported skipped
 *                   (exit 77, the reason said) where no GPU can be used.
 *   test_gpu fault  (ctest test_gpu_fault): DTRAIN_CUDA_SYNC=1 names the
 *                   kernel that faulted; without it the next wait does.
 *                   Skipped likewise. */
#include "core/fixed.h"
#include "dtrain/config.h"
#include "dtrain/gpt.h"
#include "dtrain/nn.h"
#include "dtrain/optim.h"
#include "dtrain/train.h"
#include "gpu/att_plan.h"
#include "gpu/dev.h"
#include "gpu/dev_model.h"
#include "gpu/gpu.h"
#include "kernels/kernels.h"
#include "testlib.h"

#include <dlfcn.h>
#include <unistd.h>
#include <math.h>

#ifndef DT_CUDA_MAJOR
#define DT_CUDA_MAJOR 13  // (a build without CUDA: the toolkit's soname looked for)
#endif
#include <stdlib.h>
#include <string.h>

static char g_out[1 << 14];

static void test_refusals(void) {
    char why[512] = "";
    int n = dt_gpu_count(why, sizeof why);
    printf("this build: %s; GPUs here: %d%s%s%s\n", dt_gpu_build(), n, n ? "" : " (", n ? "" : why, n ? "" : ")");
    dt_config c;
    const char *sets[] = {"train.device=cuda"};
    CHECK(dt_config_load(&c, "configs/fashion-mlp.ini", sets, 1) == DT_OK, "device = cuda parses: %s", dt_last_error());
    dt_status st = dt_train_check_device(&c);
    if (n == 0)
        CHECK(st == DT_ERR_CONFIG && strstr(dt_last_error(), "[train] device = cuda: ") && strstr(dt_last_error(), why),
              "no GPU: device = cuda refused with the reason: %s", dt_last_error());
    else  // (a GPU: every op of the MLP's device step is in the cuda table)
        CHECK(st == DT_OK, "a GPU: device = cuda taken: %s", dt_last_error());
    if (strncmp(dt_gpu_build(), "CUDA ", 5) == 0) {  // a CUDA build (refused before any device call)
        st = dt_gpu_attention_backward(NULL, NULL, NULL, NULL, NULL, NULL, NULL, 1, 1, 96, 5, DT_F32);
        CHECK(st == DT_ERR_ARG && strstr(dt_last_error(), "NH must divide C"), "GPU attention: NH 5 of C 96 refused: %s",
              dt_last_error());
        st = dt_gpu_attention_forward(NULL, NULL, NULL, NULL, 1, 1, 96, 2, DT_I64, NULL);
        CHECK(st == DT_ERR_ARG && strstr(dt_last_error(), "products in type I64 (F32, BF16 or F16 only)"),
              "GPU attention: products in int64 refused: %s", dt_last_error());
        st = dt_gpu_gemm_batched(DT_I64, 0, 0, 1, 1, 1, 1.0f, NULL, 1, 0, NULL, 1, 0, 0.0f, NULL, 1, 0, 2);
        CHECK(st == DT_ERR_ARG && strstr(dt_last_error(), "batched GEMM: operands of type I64"),
              "GPU batched GEMM: int64 operands refused: %s", dt_last_error());
        st = dt_gpu_gemm_batched(DT_F32, 0, 0, 1, 1, 1, 1.0f, NULL, 1, -1, NULL, 1, 0, 0.0f, NULL, 1, 0, 2);
        CHECK(st == DT_ERR_ARG && strstr(dt_last_error(), "batched GEMM: batch 2, strides -1 0 0"),
              "GPU batched GEMM: a negative stride refused: %s", dt_last_error());
        st = dt_gpu_gemm16(DT_F32, 0, 0, 1, 1, 1, 1.0f, NULL, 1, NULL, 1, 0.0f, NULL, 1);
        CHECK(st == DT_ERR_ARG && strstr(dt_last_error(), "16-bit GEMM: operands of type F32 (BF16 or F16 only)"),
              "GPU 16-bit GEMM: fp32 operands refused: %s", dt_last_error());
    }
    const char *far[] = {"train.device=cuda:63"};
    CHECK(dt_config_load(&c, "configs/fashion-mlp.ini", far, 1) == DT_OK && dt_train_check_device(&c) == DT_ERR_CONFIG &&
              strstr(dt_last_error(), "cuda:63"),
          "cuda:63 refused: %s", dt_last_error());
    const char *cpu[] = {"train.device=cpu"};
    CHECK(dt_config_load(&c, "configs/fashion-mlp.ini", cpu, 1) == DT_OK && dt_train_check_device(&c) == DT_OK,
          "cpu is always there: %s", dt_last_error());
    const char *bad[] = {"gpu", "cuda:", "cuda:x", "cuda:01", "cuda:-1", "CUDA", "cuda:0:1", ""};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char set[64];
        snprintf(set, sizeof set, "train.device=%s", bad[i]);
        const char *s1[] = {set};
        CHECK(dt_config_load(&c, "configs/fashion-mlp.ini", s1, 1) == DT_ERR_CONFIG &&
                  strstr(dt_last_error(), "[train] device: expected cpu, cuda or cuda:N"),
              "device '%s' refused by the config: %s", bad[i], dt_last_error());
    }
    // The command line: before any worker starts, exit 2 naming --device.
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s train configs/fashion-mlp.ini --device cuda:x", tl_dtrain());
    int rc = tl_run(cmd, g_out, sizeof g_out);
    CHECK(rc == 2 && strstr(g_out, "--device: expected cpu, cuda or cuda:N"), "--device cuda:x: exit %d\n%s", rc, g_out);
    snprintf(cmd, sizeof cmd, "%s train configs/fashion-mlp.ini --device cuda --workers 2", tl_dtrain());
    rc = tl_run(cmd, g_out, sizeof g_out);
    CHECK(rc == 2 && strstr(g_out, "[train] device = cuda") && !strstr(g_out, "step 1"),
          "--device cuda: refused before a step, never a CPU run: exit %d\n%s", rc, g_out);
}

// The CPU's optimizer and the GPU's on the same values for `steps` steps
// (steps 2 and 3 through a guard: step_scale's skip, then its scale);
// the largest relative difference of the weights and the state.
static double compare(const dt_optim_params *p, size_t n, int steps) {
    dt_optim *o;
    if (dt_optim_create(&o, p, n) != DT_OK) return INFINITY;
    float *w = malloc(sizeof(float) * n), *g = malloc(sizeof(float) * n), *gw = malloc(sizeof(float) * n);
    float *gs0 = malloc(sizeof(float) * n), *gs1 = malloc(sizeof(float) * n);
    void *dw = NULL, *dg = NULL, *d0 = NULL, *d1 = NULL, *dk = NULL;
    float *dguard = NULL;
    double *dsq = NULL;
    int ns = dt_optim_num_states(o);
    dt_status st = dt_gpu_alloc(&dw, sizeof(float) * n);
    if (st == DT_OK) st = dt_gpu_alloc((void **)&dguard, sizeof(float) * 2);
    if (st == DT_OK) st = dt_gpu_alloc((void **)&dsq, 2 * sizeof(double));
    if (st == DT_OK) st = dt_gpu_alloc(&dk, sizeof(dt_optim_k));
    if (st == DT_OK) st = dt_gpu_alloc(&dg, sizeof(float) * n);
    if (st == DT_OK && ns > 0) st = dt_gpu_alloc(&d0, sizeof(float) * n);
    if (st == DT_OK && ns > 1) st = dt_gpu_alloc(&d1, sizeof(float) * n);
    uint64_t x = 88172645463325252ull;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        w[i] = (float)((double)(x >> 11) / 9007199254740992.0 - 0.5);
    }
    if (st == DT_OK) st = dt_gpu_to_device(dw, w, sizeof(float) * n);
    if (st == DT_OK && ns > 0) {  // (the state starts at zero, as the CPU's)
        float *z = calloc(n, sizeof(float));
        st = dt_gpu_to_device(d0, z, sizeof(float) * n);
        if (st == DT_OK && ns > 1) st = dt_gpu_to_device(d1, z, sizeof(float) * n);
        free(z);
    }
    for (int s = 0; s < steps && st == DT_OK; s++) {
        for (size_t i = 0; i < n; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            g[i] = (float)((double)(x >> 11) / 9007199254740992.0 - 0.5) * 0.1f;
        }
        dt_optim_begin_step(o);
        float lr = 1e-3f * (float)(s + 1), scale = 0.5f, gn;
        // steps 2 and 3 through a guard (the step's end on the device): a
        // non-finite sum of squares skips the update, a finite one (norm 2)
        // gives dt_step_scale's scale (clipped to 0.3 after unscale 0.5)
        double sumsq[2] = {s == 2 ? INFINITY : 4.0, 1.5};  // (and a finite loss)
        float *guard = s == 2 || s == 3 ? dguard : NULL;
        if ((st = dt_gpu_to_device(dg, g, sizeof(float) * n)) != DT_OK) break;
        if (guard) st = dt_gpu_to_device(dsq, sumsq, sizeof sumsq);
        if (guard && st == DT_OK) st = dt_gpu_step_scale(guard, dsq, 0.5f, 0.3f);
        dt_optim_k k;  // (the constants in device memory, as the update reads them)
        if (p->kind == DT_OPTIM_ADAMW) k.adamw = dt_optim_adamw_k(o, lr, scale);
        else k.sgd = dt_optim_sgd_k(o, lr, scale);
        if (st == DT_OK) st = dt_gpu_to_device(dk, &k, sizeof k);
        if (st == DT_OK && p->kind == DT_OPTIM_ADAMW)
            st = dt_gpu_adamw(dw, dg, d0, d1, n, (const dt_adamw_k *)dk, guard);
        else if (st == DT_OK)
            st = dt_gpu_sgd(dw, dg, d0, n, (const dt_sgd_k *)dk, guard);
        if (s == 3) scale = dt_step_scale(2.0, 0.5f, 0.3f, &gn);
        if (s == 2) dt_optim_unstep(o);
        else dt_optim_update(o, 0, n, w, g, lr, scale);
    }
    double worst = st == DT_OK ? 0 : INFINITY;
    if (st == DT_OK && (st = dt_gpu_to_host(gw, dw, sizeof(float) * n)) == DT_OK) worst = tl_max_rel(w, gw, n, 1e-6);
    for (int j = 0; j < ns && st == DT_OK; j++) {
        st = dt_gpu_to_host(j ? gs1 : gs0, j ? d1 : d0, sizeof(float) * n);
        double d = st == DT_OK ? tl_max_rel(dt_optim_state(o, j), j ? gs1 : gs0, n, 1e-6) : INFINITY;
        worst = d > worst || isnan(d) ? d : worst;
    }
    if (st != DT_OK) printf("GPU: %s\n", dt_last_error());
    dt_gpu_free(dw), dt_gpu_free(dg), dt_gpu_free(d0), dt_gpu_free(d1), dt_gpu_free(dguard), dt_gpu_free(dsq);
    dt_gpu_free(dk);
    free(w), free(g), free(gw), free(gs0), free(gs1);
    dt_optim_free(o);
    return worst;
}

static float draw(uint64_t *x) {
    *x ^= *x << 13, *x ^= *x >> 7, *x ^= *x << 17;
    return (float)((double)(*x >> 11) / 9007199254740992.0 - 0.5);
}

// n floats to the device, after `off` zeros (a block inside a larger one:
// the pointer to free is the returned one minus off); NULL on failure.
static float *upload_at(const float *h, size_t n, int off) {
    void *d = NULL;
    float *z = calloc(n + off + 1, sizeof(float));
    if (n) memcpy(z + off, h, sizeof(float) * n);
    dt_status st = dt_gpu_alloc(&d, sizeof(float) * (n + off + 1));
    if (st == DT_OK) st = dt_gpu_to_device(d, z, sizeof(float) * (n + off + 1));
    free(z);
    if (st != DT_OK) return dt_gpu_free(d), NULL;
    return (float *)d + off;
}

static float *upload(const float *h, size_t n) { return upload_at(h, n, 0); }

// n floats to the device as t's 16-bit values (dt_from_f32), after `off`
// zeros (the pointer to free: the returned one minus off); NULL on failure.
static uint16_t *upload16_at(const float *h, size_t n, int off, dt_dtype t) {
    void *d = NULL;
    uint16_t *z = calloc(n + off + 1, sizeof(uint16_t));
    dt_from_f32(z + off, h, n, t);
    dt_status st = dt_gpu_alloc(&d, sizeof(uint16_t) * (n + off + 1));
    if (st == DT_OK) st = dt_gpu_to_device(d, z, sizeof(uint16_t) * (n + off + 1));
    free(z);
    if (st != DT_OK) return dt_gpu_free(d), NULL;
    return (uint16_t *)d + off;
}

// The GPU's GEMM against dt_sgemm on the same operands: the largest
// |difference| of an element over its sum of |products| (and |beta c|), a
// bound of the rounding error of any order of the sums; INFINITY if the GPU
// failed. off: each operand `off` elements into its block (off 1: aligned
// to 4 bytes only, 2 for 16 bits). t DT_BF16 or DT_F16: dt_gpu_gemm16 on
// the operands rounded to t, against dt_sgemm on the same rounded values
// (their products exact in fp32); DT_F32: dt_gpu_sgemm.
static double gemm_case(int ta, int tb, int M, int N, int K, int pad, float beta, int off, dt_dtype t) {
    int h16 = t != DT_F32;
    int lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
    size_t na = (size_t)(ta ? K : M) * lda, nb = (size_t)(tb ? N : K) * ldb, nc = (size_t)M * ldc;
    float *A = malloc(sizeof(float) * (na + nb + 3 * nc)), *B = A + na, *C = B + nb, *Cc = C + nc, *G = Cc + nc;
    uint64_t x = 0x9e3779b97f4a7c15ull ^ (uint64_t)(M * 131 + N * 7 + K);
    for (size_t i = 0; i < na + nb + nc; i++) A[i] = draw(&x);  // (the padding too: initcheck)
    if (h16) dt_round_f32(A, A, na + nb, t);
    memcpy(Cc, C, sizeof(float) * nc);
    float *dA = NULL, *dB = NULL, *dC = upload_at(C, nc, off);
    uint16_t *hA = NULL, *hB = NULL;
    if (h16) hA = upload16_at(A, na, off, t), hB = upload16_at(B, nb, off, t);
    else dA = upload_at(A, na, off), dB = upload_at(B, nb, off);
    dt_status st = (h16 ? hA && hB : dA && dB) && dC ? DT_OK : DT_ERR_INTERNAL;
    if (st == DT_OK && h16) st = dt_gpu_gemm16(t, ta, tb, M, N, K, 1.0f, hA, lda, hB, ldb, beta, dC, ldc);
    else if (st == DT_OK) st = dt_gpu_sgemm(ta, tb, M, N, K, 1.0f, dA, lda, dB, ldb, beta, dC, ldc);
    if (st == DT_OK) st = dt_gpu_to_host(G, dC, sizeof(float) * nc);
    if (st != DT_OK) printf("GPU: %s\n", dt_last_error());
    // (K = 0: C = beta C by BLAS's definition, which the GPU follows; oneDNN's
    // sgemm leaves C as it was for some transposes when beta is 0)
    if (K > 0) dt_sgemm(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, Cc, ldc);
    else
        for (size_t e = 0; e < nc; e++) Cc[e] = (int)(e % ldc) < N ? beta * C[e] : C[e];
    double worst = st == DT_OK ? 0 : INFINITY;
    for (int i = 0; i < M && st == DT_OK; i++)
        for (int j = 0; j < ldc; j++) {
            size_t e = (size_t)i * ldc + j;
            if (j >= N) {  // the padding as it was
                if (G[e] != C[e]) worst = INFINITY;
                continue;
            }
            double mag = beta != 0.0f ? fabs((double)beta * C[e]) : 0.0;
            for (int k = 0; k < K; k++)
                mag += fabs((double)(ta ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k]) *
                            (tb ? B[(size_t)j * ldb + k] : B[(size_t)k * ldb + j]));
            double d = fabs((double)G[e] - Cc[e]) / (mag > 1e-30 ? mag : 1e-30);
            worst = d > worst || isnan(d) ? d : worst;
        }
    dt_gpu_free(dA ? dA - off : NULL), dt_gpu_free(dB ? dB - off : NULL), dt_gpu_free(dC ? dC - off : NULL);
    dt_gpu_free(hA ? hA - off : NULL), dt_gpu_free(hB ? hB - off : NULL);
    free(A);
    return worst;
}

static void test_gemm(void) {
    // (M, N, K, pad): odd and non-square; the GPT's shapes in small (BT = 2
    // x 65 rows, C = 96, 3C, 4C, a vocabulary of 509); strided; K = 0.
    const int shapes[][4] = {{1, 1, 1, 0}, {7, 5, 3, 0}, {3, 130, 17, 5}, {130, 288, 96, 0},
                             {130, 96, 384, 3}, {130, 509, 96, 1}, {255, 257, 33, 0}, {5, 7, 0, 2}};
    const char *names[] = {"sgemm", "sgemm tf32", "bf16 GEMM", "fp16 GEMM"};
    const dt_dtype types[] = {DT_F32, DT_F32, DT_BF16, DT_F16};
    for (int prec = 0; prec < 4; prec++) {  // fp32, TF32, bf16 and fp16 operands
        dt_gpu_set_tf32(prec == 1);
        double tol = prec == 0 ? 1e-5 : prec == 1 ? 4e-3 : 1e-4;
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++)
                for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
                    for (int b = 0; b < 2; b++) {
                        const int *h = shapes[s];
                        int off = (int)(s + b) % 3 == 2;  // some operands aligned to 4 bytes (bf16: 2) only
                        double d = gemm_case(ta, tb, h[0], h[1], h[2], h[3], (float)b, off, types[prec]);
                        CHECK(d >= 0 && d <= tol, "%s ta %d tb %d M %d N %d K %d pad %d beta %d offset %d: GPU "
                              "against dt_sgemm, max |diff| / sum |products| %.3g (<= %g)", names[prec], ta,
                              tb, h[0], h[1], h[2], h[3], b, off, d, tol);
                    }
    }
    dt_gpu_set_tf32(0);
}

// ---- the GPT's layers against the CPU's (dtrain/nn.h)

// n floats uniform in [-r/2, r/2).
static float *randoms(size_t n, float r, uint64_t seed) {
    float *a = malloc(sizeof(float) * (n ? n : 1));
    uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
    for (size_t i = 0; i < n; i++) a[i] = draw(&x) * r;
    return a;
}

// The GPU's block d (n floats) read back; its largest relative difference
// from the CPU's c (floor as tl_max_rel); INFINITY when the read failed.
static double against(const float *c, const float *d, size_t n, double floor) {
    float *g = malloc(sizeof(float) * (n ? n : 1));
    double r = d && dt_gpu_to_host(g, d, sizeof(float) * n) == DT_OK ? tl_max_rel(c, g, n, floor) : INFINITY;
    free(g);
    return r;
}

#define GPU_ERR(st) ((st) == DT_OK ? "" : ": "), ((st) == DT_OK ? "" : dt_last_error())

static void test_layernorm(size_t N, int C) {
    size_t n = N * C;
    float *x = randoms(n, 4.0f, 1), *w = randoms(C, 2.0f, 2), *b = randoms(C, 1.0f, 3), *out = randoms(n, 1, 4);
    float *mean = randoms(N, 1, 5), *rstd = randoms(N, 1, 6), *dout = randoms(n, 1.0f, 7);
    float *dx = randoms(n, 0.1f, 8), *dw = randoms(C, 0.1f, 9), *db = randoms(C, 0.1f, 10);
    // Outputs start as what the CPU's start as (the backward accumulates).
    float *gx = upload(x, n), *gw = upload(w, C), *gb = upload(b, C), *gout = upload(out, n), *gmean = upload(mean, N);
    float *grstd = upload(rstd, N), *gdout = upload(dout, n), *gdx = upload(dx, n), *gdw = upload(dw, C),
          *gdb = upload(db, C);
    dt_layernorm_forward(out, mean, rstd, x, w, b, (int)N, C, 1e-5f);
    dt_status st = gx && gw && gb && gout && gmean && grstd && gdout && gdx && gdw && gdb ? DT_OK : DT_ERR_INTERNAL;
    if (st == DT_OK) st = dt_gpu_layernorm_forward(gout, gmean, grstd, gx, gw, gb, N, C, 1e-5f, NULL, DT_F32);
    double dof = st == DT_OK ? against(out, gout, n, 1.0) : INFINITY;
    double dm = st == DT_OK ? against(mean, gmean, N, 1.0) : INFINITY;
    double dr = st == DT_OK ? against(rstd, grstd, N, 1.0) : INFINITY;
    CHECK(dof <= 1e-5 && dm <= 1e-5 && dr <= 1e-5, "layernorm forward N %zu C %d: out %.3g, mean %.3g, rstd %.3g (<= 1e-5)%s%s",
          N, C, dof, dm, dr, st == DT_OK ? "" : ": ", st == DT_OK ? "" : dt_last_error());
    // The backward on the same saved mean and rstd (the CPU's) on both sides.
    if (st == DT_OK) st = dt_gpu_to_device(gmean, mean, sizeof(float) * N);
    if (st == DT_OK) st = dt_gpu_to_device(grstd, rstd, sizeof(float) * N);
    if (st == DT_OK) st = dt_gpu_layernorm_backward(gdx, gdw, gdb, gdout, gx, gw, gmean, grstd, N, C);
    dt_layernorm_backward(dx, dw, db, dout, x, w, mean, rstd, (int)N, C);
    double ddx = st == DT_OK ? against(dx, gdx, n, 1.0) : INFINITY;
    double ddw = st == DT_OK ? against(dw, gdw, C, 1.0) : INFINITY;
    double ddb = st == DT_OK ? against(db, gdb, C, 1.0) : INFINITY;
    CHECK(ddx <= 1e-5 && ddw <= 1e-5 && ddb <= 1e-5, "layernorm backward N %zu C %d: dinp %.3g, dw %.3g, db %.3g (<= 1e-5)%s%s",
          N, C, ddx, ddw, ddb, st == DT_OK ? "" : ": ", st == DT_OK ? "" : dt_last_error());
    float *hs[] = {x, w, b, out, mean, rstd, dout, dx, dw, db}, *gs[] = {gx, gw, gb, gout, gmean, grstd, gdout, gdx, gdw, gdb};
    for (int i = 0; i < 10; i++) free(hs[i]), dt_gpu_free(gs[i]);
}

static void test_gelu(size_t n) {
    float *x = randoms(n, 12.0f, 11), *out = randoms(n, 1, 12), *dout = randoms(n, 1, 13), *dx = randoms(n, 1, 14);
    float *gx = upload(x, n), *gout = upload(out, n), *gdout = upload(dout, n), *gdx = upload(dx, n);
    dt_status st = gx && gout && gdout && gdx ? DT_OK : DT_ERR_INTERNAL;
    if (st == DT_OK) st = dt_gpu_gelu_forward(gout, gx, n, NULL, DT_F32);
    if (st == DT_OK) st = dt_gpu_gelu_backward(gdx, gdout, gx, n);
    dt_gelu_forward(out, x, n);
    dt_gelu_backward(dx, dout, x, n);
    double df = st == DT_OK ? against(out, gout, n, 1e-3) : INFINITY;
    double db = st == DT_OK ? against(dx, gdx, n, 1e-3) : INFINITY;
    CHECK(df <= 1e-5 && db <= 1e-5, "gelu n %zu (x in [-6, 6)): forward %.3g, backward %.3g (<= 1e-5)%s%s", n, df, db,
          st == DT_OK ? "" : ": ", st == DT_OK ? "" : dt_last_error());
    // its output in bf16 and fp16 (out16): the fp32 output's bits rounded
    uint16_t *h = malloc(2 * n), *want = malloc(2 * n);
    float *back = malloc(sizeof(float) * n);
    void *gh = NULL;
    size_t wrong = 0;
    if (st == DT_OK) st = dt_gpu_to_host(back, gout, sizeof(float) * n);
    if (st == DT_OK) st = dt_gpu_alloc(&gh, 2 * n);
    for (int k = 0; k < 2 && st == DT_OK; k++) {
        dt_dtype t = k ? DT_F16 : DT_BF16;
        st = dt_gpu_gelu_forward(NULL, gx, n, gh, t);
        if (st == DT_OK) st = dt_gpu_to_host(h, gh, 2 * n);
        dt_from_f32(want, back, n, t);
        for (size_t i = 0; i < n && st == DT_OK; i++) wrong += h[i] != want[i];
    }
    CHECK(st == DT_OK && !wrong, "gelu n %zu, its output in bf16 and fp16: %zu elements not the fp32 output's bits "
          "rounded (0)%s%s", n, wrong, GPU_ERR(st));
    free(h), free(want), free(back), dt_gpu_free(gh);
    free(x), free(out), free(dout), free(dx);
    dt_gpu_free(gx), dt_gpu_free(gout), dt_gpu_free(gdout), dt_gpu_free(gdx);
}

// N rows of V logits; the GPU's rows ld apart (a padded vocabulary: the
// padding holds -7 and must keep it, in probs and in dlogits).
static void test_crossentropy(size_t N, int V, size_t ld) {
    size_t n = N * V, nl = N * ld;
    float *l = randoms(n, 8.0f, 15), *p = malloc(sizeof(float) * n), *d = randoms(n, 1e-3f, 16);
    float *pl = malloc(sizeof(float) * nl), *pad = malloc(sizeof(float) * nl);  // (ld apart)
    int32_t *t = malloc(sizeof(int32_t) * N);
    uint64_t x = 17;
    for (size_t i = 0; i < N; i++) t[i] = (int32_t)((draw(&x) + 0.5f) * V) % V;
    for (size_t i = 0; i < nl; i++) pl[i] = i % ld < (size_t)V ? l[i / ld * V + i % ld] : -7.0f, pad[i] = -7.0f;
    float *gl = upload(pl, nl), *gp = upload(pad, nl), *gloss = upload(pad, 1);
    for (size_t i = 0; i < nl; i++) pl[i] = i % ld < (size_t)V ? d[i / ld * V + i % ld] : -7.0f;
    float *gd = upload(pl, nl);
    void *gt = NULL, *grow = NULL;
    dt_status st = gl && gp && gloss && gd ? DT_OK : DT_ERR_INTERNAL;
    if (st == DT_OK) st = dt_gpu_alloc(&gt, sizeof(int32_t) * N);
    if (st == DT_OK) st = dt_gpu_alloc(&grow, sizeof(double) * N);
    if (st == DT_OK) st = dt_gpu_to_device(gt, t, sizeof(int32_t) * N);
    if (st == DT_OK) st = dt_gpu_crossentropy_forward(gp, grow, gloss, gl, gt, N, V, ld);
    float loss = dt_crossentropy_forward(p, l, t, (int)N, V), gloss_h = NAN;
    // probs: the V columns of each row, the padding as it was
    float *back = malloc(sizeof(float) * nl), *rows = malloc(sizeof(float) * n);
    if (st == DT_OK) st = dt_gpu_to_host(back, gp, sizeof(float) * nl);
    if (st == DT_OK) st = dt_gpu_to_host(&gloss_h, gloss, sizeof(float));
    int kept = 1;
    for (size_t i = 0; i < nl && st == DT_OK; i++)
        if (i % ld < (size_t)V) rows[i / ld * V + i % ld] = back[i];
        else kept &= back[i] == -7.0f;
    double dp = st == DT_OK ? tl_max_rel(p, rows, n, 1e-30) : INFINITY;
    double dl = st == DT_OK ? tl_rel(loss, gloss_h, 1e-6) : INFINITY;
    CHECK(dp <= 1e-5 && dl <= 1e-5 && kept, "crossentropy forward N %zu V %d ld %zu: probs %.3g, loss %.9g against %.9g "
          "(%.3g; <= 1e-5), padding %s%s%s", N, V, ld, dp, gloss_h, loss, dl, kept ? "kept" : "WRITTEN",
          st == DT_OK ? "" : ": ", st == DT_OK ? "" : dt_last_error());
    // The backward on the CPU's probabilities on both sides.
    for (size_t i = 0; i < nl; i++) pl[i] = i % ld < (size_t)V ? p[i / ld * V + i % ld] : -7.0f;
    if (st == DT_OK) st = dt_gpu_to_device(gp, pl, sizeof(float) * nl);
    if (st == DT_OK) st = dt_gpu_crossentropy_backward(gd, gp, gt, N, V, ld, 0.75f);
    dt_crossentropy_backward(d, p, t, (int)N, V, 0.75f);
    if (st == DT_OK) st = dt_gpu_to_host(back, gd, sizeof(float) * nl);
    kept = 1;
    for (size_t i = 0; i < nl && st == DT_OK; i++)
        if (i % ld < (size_t)V) rows[i / ld * V + i % ld] = back[i];
        else kept &= back[i] == -7.0f;
    double dd = st == DT_OK ? tl_max_rel(d, rows, n, 1e-6) : INFINITY;
    CHECK(dd <= 1e-5 && kept, "crossentropy backward N %zu V %d ld %zu: dlogits %.3g (<= 1e-5), padding %s%s%s", N, V,
          ld, dd, kept ? "kept" : "WRITTEN", st == DT_OK ? "" : ": ", st == DT_OK ? "" : dt_last_error());
    free(l), free(p), free(d), free(pl), free(pad), free(t), free(back), free(rows);
    dt_gpu_free(gl), dt_gpu_free(gp), dt_gpu_free(gloss), dt_gpu_free(gd), dt_gpu_free(gt), dt_gpu_free(grow);
}

// The fused pass with its gradient in 16 bits (type t) into room of its
// own: the in-place pass's gradient (grad, on the host, rows ld apart)
// rounded to t bitwise, the room's padding and the logits pl untouched.
static void fused16(const float *pl, const int32_t *gt, const float *grad, size_t N, int V, size_t ld, dt_dtype t) {
    size_t nl = N * ld;
    uint16_t *h = malloc(2 * nl), *want = malloc(2 * nl);
    float *back = malloc(sizeof(float) * nl), *gl = upload(pl, nl), *gloss = upload(pl, 1);
    void *gh = NULL, *grow = NULL;
    for (size_t i = 0; i < nl; i++) h[i] = 0xabcd;
    dt_status st = gl && gloss ? dt_gpu_alloc(&gh, 2 * nl) : DT_ERR_INTERNAL;
    if (st == DT_OK) st = dt_gpu_alloc(&grow, sizeof(double) * N);
    if (st == DT_OK) st = dt_gpu_to_device(gh, h, 2 * nl);
    if (st == DT_OK) st = dt_gpu_crossentropy_fused(gl, grow, gloss, gt, N, V, ld, 0.75f, gh, t);
    if (st == DT_OK) st = dt_gpu_to_host(h, gh, 2 * nl);
    if (st == DT_OK) st = dt_gpu_to_host(back, gl, sizeof(float) * nl);
    dt_from_f32(want, grad, nl, t);
    int ok = st == DT_OK && !memcmp(back, pl, sizeof(float) * nl);
    for (size_t i = 0; i < nl && ok; i++) ok = i % ld < (size_t)V ? h[i] == want[i] : h[i] == 0xabcd;
    CHECK(ok, "crossentropy fused N %zu V %d ld %zu, its gradient in %s: the in-place gradient's bits rounded, the "
          "padding and the logits untouched%s%s", N, V, ld, dt_dtype_name(t), st == DT_OK ? "" : ": ",
          st == DT_OK ? "" : dt_last_error());
    free(h), free(want), free(back);
    dt_gpu_free(gl), dt_gpu_free(gloss), dt_gpu_free(gh), dt_gpu_free(grow);
}

// The loss and its gradient in one pass (dt_gpu_crossentropy_fused, the
// GPT head's): against the CPU's forward and its backward onto zeros
// within 1e-5, and against the GPU's own two ops (forward, backward onto
// zeros) bitwise, the padding kept; and with its gradient in bf16 and fp16
// (fused16).
static void test_crossentropy_fused(size_t N, int V, size_t ld) {
    size_t n = N * V, nl = N * ld;
    float *l = randoms(n, 8.0f, 25), *p = malloc(sizeof(float) * n), *d = calloc(n, sizeof(float));
    float *pl = malloc(sizeof(float) * nl), *zero = calloc(nl, sizeof(float));
    float *back = malloc(sizeof(float) * nl), *two = malloc(sizeof(float) * nl), *rows = malloc(sizeof(float) * n);
    int32_t *t = malloc(sizeof(int32_t) * N);
    uint64_t x = 27;
    for (size_t i = 0; i < N; i++) t[i] = (int32_t)((draw(&x) + 0.5f) * V) % V;
    for (size_t i = 0; i < nl; i++) pl[i] = i % ld < (size_t)V ? l[i / ld * V + i % ld] : -7.0f;
    float *gl = upload(pl, nl), *gp = upload(pl, nl), *gd = upload(zero, nl), *gloss = upload(zero, 2);
    void *gt = NULL, *grow = NULL;
    dt_status st = gl && gp && gd && gloss ? DT_OK : DT_ERR_INTERNAL;
    if (st == DT_OK) st = dt_gpu_alloc(&gt, sizeof(int32_t) * N);
    if (st == DT_OK) st = dt_gpu_alloc(&grow, sizeof(double) * N);
    if (st == DT_OK) st = dt_gpu_to_device(gt, t, sizeof(int32_t) * N);
    // the GPU's two ops: probs (over the copy gp of the logits), then the gradient onto zeros
    if (st == DT_OK) st = dt_gpu_crossentropy_forward(gp, grow, gloss + 1, gl, gt, N, V, ld);
    if (st == DT_OK) st = dt_gpu_crossentropy_backward(gd, gp, gt, N, V, ld, 0.75f);
    if (st == DT_OK) st = dt_gpu_crossentropy_fused(gl, grow, gloss, gt, N, V, ld, 0.75f, NULL, DT_F32);
    float loss = dt_crossentropy_forward(p, l, t, (int)N, V), gls[2] = {NAN, NAN};
    dt_crossentropy_backward(d, p, t, (int)N, V, 0.75f);
    if (st == DT_OK) st = dt_gpu_to_host(back, gl, sizeof(float) * nl);
    if (st == DT_OK) st = dt_gpu_to_host(two, gd, sizeof(float) * nl);
    if (st == DT_OK) st = dt_gpu_to_host(gls, gloss, sizeof gls);
    int kept = 1, same = memcmp(gls, gls + 1, sizeof(float)) == 0;
    for (size_t i = 0; i < nl && st == DT_OK; i++)
        if (i % ld < (size_t)V) rows[i / ld * V + i % ld] = back[i], same &= memcmp(&back[i], &two[i], 4) == 0;
        else kept &= back[i] == -7.0f;
    double dd = st == DT_OK ? tl_max_rel(d, rows, n, 1e-6) : INFINITY;
    double dl = st == DT_OK ? tl_rel(loss, gls[0], 1e-6) : INFINITY;
    CHECK(dd <= 1e-5 && dl <= 1e-5 && kept && same, "crossentropy fused N %zu V %d ld %zu: dlogits %.3g, loss %.9g "
          "against %.9g (%.3g; <= 1e-5), padding %s, the two ops' bits %s%s%s", N, V, ld, dd, gls[0], loss, dl,
          kept ? "kept" : "WRITTEN", same ? "the same" : "NOT the same", st == DT_OK ? "" : ": ",
          st == DT_OK ? "" : dt_last_error());
    if (st == DT_OK) fused16(pl, gt, back, N, V, ld, DT_BF16), fused16(pl, gt, back, N, V, ld, DT_F16);
    free(l), free(p), free(d), free(pl), free(zero), free(back), free(two), free(rows), free(t);
    dt_gpu_free(gl), dt_gpu_free(gp), dt_gpu_free(gd), dt_gpu_free(gloss), dt_gpu_free(gt), dt_gpu_free(grow);
}

// The elements of the GPU's block d (n floats) that differ in their bits
// from the CPU's c; SIZE_MAX when the read failed.
static size_t differ(const float *c, const float *d, size_t n) {
    float *g = malloc(sizeof(float) * (n ? n : 1));
    size_t bad = d && dt_gpu_to_host(g, d, sizeof(float) * n) == DT_OK ? 0 : SIZE_MAX;
    for (size_t i = 0; i < n && bad != SIZE_MAX; i++) bad += memcmp(&c[i], &g[i], sizeof(float)) != 0;
    free(g);
    return bad;
}

// The GPU's block d against the CPU's c, normwise (tl_normwise: max
// |difference| over max |c|); INFINITY when the read failed.
static double against_norm(const float *c, const float *d, size_t n) {
    float *g = malloc(sizeof(float) * (n ? n : 1));
    double r = d && dt_gpu_to_host(g, d, sizeof(float) * n) == DT_OK ? tl_normwise(c, g, n) : INFINITY;
    free(g);
    return r;
}

// The GPU's block d against the CPU's c, each element over its magnitude
// mag (the sum of |terms| of its sums, computed on the CPU).
static double against_mag(const float *c, const float *d, const float *mag, size_t n) {
    float *g = malloc(sizeof(float) * (n ? n : 1));
    double r = INFINITY;
    if (d && dt_gpu_to_host(g, d, sizeof(float) * n) == DT_OK) {
        r = 0;
        for (size_t i = 0; i < n; i++) {
            double e = fabs((double)c[i] - g[i]) / fmax(mag[i], 1e-30);
            r = e > r || isnan(e) ? e : r;
        }
    }
    free(g);
    return r;
}

static int32_t *upload_i32(const int32_t *h, size_t n) {
    void *d = NULL;
    if (dt_gpu_alloc(&d, sizeof(int32_t) * (n ? n : 1)) != DT_OK) return NULL;
    if (n && dt_gpu_to_device(d, h, sizeof(int32_t) * n) != DT_OK) return dt_gpu_free(d), NULL;
    return d;
}


// Both layernorms with their output in t (out16): out (the fp32 output,
// on the host) rounded, bitwise; a + b their input (host), sum its fp32
// sum (host; gsum the device's).
static void layernorm16(const float *out, const float *a, const float *b, const float *sum, const float *gsum,
                        const float *gw, const float *gbias, size_t N, int C, dt_dtype t) {
    size_t n = N * C, bad = 0;
    uint16_t *h = malloc(2 * n), *want = malloc(2 * n);
    float *ga = upload(a, n), *gb = upload(b, n), *gres = upload(a, n), *gm = upload(a, N), *gr = upload(a, N);
    void *gh = NULL;
    dt_from_f32(want, out, n, t);
    dt_status st = ga && gb && gres && gm && gr ? dt_gpu_alloc(&gh, 2 * n) : DT_ERR_INTERNAL;
    for (int res = 0; res < 2 && st == DT_OK; res++) {
        st = res ? dt_gpu_layernorm_residual(NULL, gm, gr, gres, ga, gb, gw, gbias, N, C, 1e-5f, gh, t)
                 : dt_gpu_layernorm_forward(NULL, gm, gr, gsum, gw, gbias, N, C, 1e-5f, gh, t);
        if (st == DT_OK) st = dt_gpu_to_host(h, gh, 2 * n);
        for (size_t i = 0; i < n && st == DT_OK; i++) bad += h[i] != want[i];
    }
    size_t ds = st == DT_OK ? differ(sum, gres, n) : 0;
    bad += ds == SIZE_MAX ? 1 : ds;
    CHECK(st == DT_OK && !bad, "layernorm N %zu C %d, its output in %s (alone, with the residual): the fp32 "
          "output's bits rounded, the sum the same: %zu elements wrong%s%s", N, C, dt_dtype_name(t), bad, GPU_ERR(st));
    free(h), free(want);
    float *gs[] = {ga, gb, gres, gm, gr};
    for (int i = 0; i < 5; i++) dt_gpu_free(gs[i]);
    dt_gpu_free(gh);
}

// The residual add and the layernorm of its sum in one pass
// (dt_gpu_layernorm_residual, in place: res is b) against the two kernels
// one after the other: the same bits (sum, out, mean, rstd); and with its
// output in bf16 and fp16 (layernorm16).
static void test_layernorm_residual(size_t N, int C) {
    size_t n = N * C;
    float *a = randoms(n, 4.0f, 11), *b = randoms(n, 4.0f, 12), *w = randoms(C, 2.0f, 13), *bias = randoms(C, 1.0f, 14);
    float *h[4] = {malloc(sizeof(float) * n), malloc(sizeof(float) * n), malloc(sizeof(float) * N),
                   malloc(sizeof(float) * N)};
    float *ga = upload(a, n), *gb = upload(b, n), *gb2 = upload(b, n), *gw = upload(w, C), *gbias = upload(bias, C);
    float *g1[3] = {upload(a, n), upload(a, N), upload(a, N)}, *g2[3] = {upload(a, n), upload(a, N), upload(a, N)};
    dt_status st = ga && gb && gb2 && gw && gbias && g1[0] && g1[1] && g1[2] && g2[0] && g2[1] && g2[2] ? DT_OK
                                                                                                         : DT_ERR_INTERNAL;
    if (st == DT_OK) st = dt_gpu_residual_forward(gb, ga, gb, n);
    if (st == DT_OK) st = dt_gpu_layernorm_forward(g1[0], g1[1], g1[2], gb, gw, gbias, N, C, 1e-5f, NULL, DT_F32);
    float *got[4] = {gb, g1[0], g1[1], g1[2]};
    size_t sz[4] = {n, n, N, N}, d[4] = {SIZE_MAX, SIZE_MAX, SIZE_MAX, SIZE_MAX};
    for (int i = 0; i < 4 && st == DT_OK; i++) st = dt_gpu_to_host(h[i], got[i], sizeof(float) * sz[i]);
    if (st == DT_OK)
        st = dt_gpu_layernorm_residual(g2[0], g2[1], g2[2], gb2, ga, gb2, gw, gbias, N, C, 1e-5f, NULL, DT_F32);
    float *fused[4] = {gb2, g2[0], g2[1], g2[2]};
    for (int i = 0; i < 4 && st == DT_OK; i++) d[i] = differ(h[i], fused[i], sz[i]);
    CHECK(st == DT_OK && !d[0] && !d[1] && !d[2] && !d[3], "layernorm with the residual N %zu C %d: elements "
          "differing from the two kernels' (sum %zu, out %zu, mean %zu, rstd %zu; 0)%s%s", N, C, d[0], d[1], d[2],
          d[3], GPU_ERR(st));
    for (int k = 0; k < 2 && st == DT_OK; k++)  // (h[0] the sum, h[1] the layernorm's output: the two kernels')
        layernorm16(h[1], a, b, h[0], gb, gw, gbias, N, C, k ? DT_F16 : DT_BF16);
    float *gs[] = {ga, gb, gb2, gw, gbias, g1[0], g1[1], g1[2], g2[0], g2[1], g2[2]};
    for (size_t i = 0; i < sizeof gs / sizeof *gs; i++) dt_gpu_free(gs[i]);
    for (int i = 0; i < 4; i++) free(h[i]);
    free(a), free(b), free(w), free(bias);
}

// Tokens of a vocabulary of V (repeated: V small against B T) and the
// embedding, forward and backward: the CPU's bits.
static void test_encoder(int B, int T, int C, int V) {
    size_t BT = (size_t)B * T, n = BT * C;
    int32_t *inp = malloc(sizeof(int32_t) * BT);
    uint64_t x = 23;
    for (size_t i = 0; i < BT; i++) inp[i] = (int32_t)((draw(&x) + 0.5f) * V) % V;
    float *wte = randoms((size_t)V * C, 2, 24), *wpe = randoms((size_t)T * C, 2, 25), *out = randoms(n, 1, 26);
    float *dout = randoms(n, 1, 27), *dwte = randoms((size_t)V * C, 0.1f, 28), *dwpe = randoms((size_t)T * C, 0.1f, 29);
    int32_t *gi = upload_i32(inp, BT);
    float *gwte = upload(wte, (size_t)V * C), *gwpe = upload(wpe, (size_t)T * C), *gout = upload(out, n);
    float *gdout = upload(dout, n), *gdwte = upload(dwte, (size_t)V * C), *gdwpe = upload(dwpe, (size_t)T * C);
    dt_status st = gi && gwte && gwpe && gout && gdout && gdwte && gdwpe ? DT_OK : DT_ERR_INTERNAL;
    if (st == DT_OK) st = dt_gpu_encoder_forward(gout, gi, gwte, gwpe, B, T, C);
    if (st == DT_OK) st = dt_gpu_encoder_backward(gdwte, gdwpe, gdout, gi, B, T, C);
    dt_encoder_forward(out, inp, wte, wpe, B, T, C);
    dt_encoder_backward(dwte, dwpe, dout, inp, B, T, C);
    size_t bo = st == DT_OK ? differ(out, gout, n) : SIZE_MAX;
    size_t bt = st == DT_OK ? differ(dwte, gdwte, (size_t)V * C) : SIZE_MAX;
    size_t bp = st == DT_OK ? differ(dwpe, gdwpe, (size_t)T * C) : SIZE_MAX;
    CHECK(bo == 0 && bt == 0 && bp == 0, "encoder B %d T %d C %d V %d: elements differing from the CPU's bits: out "
          "%zu, dwte %zu, dwpe %zu (0)%s%s", B, T, C, V, bo, bt, bp, GPU_ERR(st));
    free(inp), free(wte), free(wpe), free(out), free(dout), free(dwte), free(dwpe);
    dt_gpu_free(gi), dt_gpu_free(gwte), dt_gpu_free(gwpe), dt_gpu_free(gout), dt_gpu_free(gdout), dt_gpu_free(gdwte),
        dt_gpu_free(gdwpe);
}

// A tensor-parallel shard's embedding (wte's rows [v0, v0 + Vl) of a
// vocabulary of V; the other tokens zeros, their rows untouched): the
// CPU's bits.
static void test_encoder_split(int B, int T, int C, int V, int v0, int Vl) {
    size_t BT = (size_t)B * T, n = BT * C, nw = (size_t)Vl * C;
    int32_t *inp = malloc(sizeof(int32_t) * BT);
    uint64_t x = 41;
    for (size_t i = 0; i < BT; i++) inp[i] = (int32_t)((draw(&x) + 0.5f) * V) % V;
    float *wte = randoms(nw, 2, 42), *wpe = randoms((size_t)T * C, 2, 43), *out = randoms(n, 1, 44);
    float *dout = randoms(n, 1, 45), *dwte = randoms(nw, 0.1f, 46), *dwpe = randoms((size_t)T * C, 0.1f, 47);
    int32_t *gi = upload_i32(inp, BT);
    float *gwte = upload(wte, nw), *gwpe = upload(wpe, (size_t)T * C), *gout = upload(out, n), *gdout = upload(dout, n);
    float *gdwte = upload(dwte, nw), *gdwpe = upload(dwpe, (size_t)T * C);
    dt_status st = gi && gwte && gwpe && gout && gdout && gdwte && gdwpe ? DT_OK : DT_ERR_INTERNAL;
    if (st == DT_OK) st = dt_gpu_encoder_split_forward(gout, gi, gwte, gwpe, B, T, C, v0, Vl);
    if (st == DT_OK) st = dt_gpu_encoder_split_backward(gdwte, gdwpe, gdout, gi, B, T, C, v0, Vl);
    dt_encoder_split_forward(out, inp, wte, wpe, B, T, C, v0, Vl);
    dt_encoder_split_backward(dwte, dwpe, dout, inp, B, T, C, v0, Vl);
    size_t bo = st == DT_OK ? differ(out, gout, n) : SIZE_MAX, bt = st == DT_OK ? differ(dwte, gdwte, nw) : SIZE_MAX;
    size_t bp = st == DT_OK ? differ(dwpe, gdwpe, (size_t)T * C) : SIZE_MAX;
    CHECK(bo == 0 && bt == 0 && bp == 0, "encoder of a shard B %d T %d C %d V %d rows [%d, %d): elements differing from "
          "the CPU's bits: out %zu, dwte %zu, dwpe %zu (0)%s%s", B, T, C, V, v0, v0 + Vl, bo, bt, bp, GPU_ERR(st));
    free(inp), free(wte), free(wpe), free(out), free(dout), free(dwte), free(dwpe);
    dt_gpu_free(gi), dt_gpu_free(gwte), dt_gpu_free(gwpe), dt_gpu_free(gout), dt_gpu_free(gdout), dt_gpu_free(gdwte),
        dt_gpu_free(gdwpe);
}

// The vocabulary-parallel cross-entropy's three parts on one shard's N rows
// of V columns (targets shifted: some outside 0..V-1), against the CPU's:
// the maxima bitwise, the sums, the target logits, the probabilities and
// the loss within 1e-5 (the rows' sums in a block's tree).
static void test_ce_split(size_t N, int V) {
    size_t n = N * (size_t)V;
    float *l = randoms(n, 8.0f, 51), *p = malloc(sizeof(float) * n), *mx = malloc(sizeof(float) * 3 * N);
    float *sums = mx + N, *back = malloc(sizeof(float) * (n > 3 * N ? n : 3 * N));
    double *row = malloc(sizeof(double) * N);
    int32_t *t = malloc(sizeof(int32_t) * N);
    uint64_t x = 53;
    for (size_t i = 0; i < N; i++) t[i] = (int32_t)((draw(&x) + 0.5f) * 2 * V) % (2 * V) - V / 2;
    float *gl = upload(l, n), *gp = upload(l, n), *gm = upload(l, 3 * N), *gloss = upload(l, 1), loss_h = NAN;
    void *gt = NULL, *grow = NULL;
    dt_status st = gl && gp && gm && gloss ? DT_OK : DT_ERR_INTERNAL;
    if (st == DT_OK) st = dt_gpu_alloc(&gt, sizeof(int32_t) * N);
    if (st == DT_OK) st = dt_gpu_alloc(&grow, sizeof(double) * N);
    if (st == DT_OK) st = dt_gpu_to_device(gt, t, sizeof(int32_t) * N);
    if (st == DT_OK) st = dt_gpu_ce_split_max(gm, gl, N, V);
    dt_ce_split_max(mx, l, (int)N, V);
    size_t dm = st == DT_OK ? differ(mx, gm, N) : SIZE_MAX;
    if (st == DT_OK) st = dt_gpu_ce_split_exp(gp, gm + N, gl, gm, gt, N, V);
    dt_ce_split_exp(p, sums, l, mx, t, (int)N, V);
    if (st == DT_OK) st = dt_gpu_to_host(back, gm + N, sizeof(float) * 2 * N);
    double ds = st == DT_OK ? tl_max_rel(sums, back, 2 * N, 1e-6) : INFINITY;
    if (st == DT_OK) st = dt_gpu_to_device(gm + N, sums, sizeof(float) * 2 * N);  // (the CPU's on both sides)
    if (st == DT_OK) st = dt_gpu_ce_split_finish(gp, grow, gloss, gm, gm + N, N, V);
    float loss = dt_ce_split_finish(p, row, mx, sums, (int)N, V);
    if (st == DT_OK) st = dt_gpu_to_host(back, gp, sizeof(float) * n);
    if (st == DT_OK) st = dt_gpu_to_host(&loss_h, gloss, sizeof(float));
    double dp = st == DT_OK ? tl_max_rel(p, back, n, 1e-30) : INFINITY, dl = tl_rel(loss, loss_h, 1e-6);
    CHECK(dm == 0 && ds <= 1e-5 && dp <= 1e-5 && dl <= 1e-5, "vocabulary-parallel cross-entropy N %zu V %d: maxima "
          "differing %zu (0), sums %.3g, probs %.3g, loss %.9g against %.9g (%.3g; <= 1e-5)%s%s", N, V, dm, ds, dp,
          loss_h, loss, dl, GPU_ERR(st));
    free(l), free(p), free(mx), free(back), free(row), free(t);
    dt_gpu_free(gl), dt_gpu_free(gp), dt_gpu_free(gm), dt_gpu_free(gloss), dt_gpu_free(gt), dt_gpu_free(grow);
}

// Residual add and ReLU: the CPU's bits (backward accumulating).
static void test_elementwise(size_t n) {
    float *a = randoms(n, 2, 31), *b = randoms(n, 2, 32), *out = randoms(n, 1, 33), *dout = randoms(n, 1, 34);
    float *da = randoms(n, 1, 35), *db = randoms(n, 1, 36), *r = randoms(n, 1, 37), *dr = randoms(n, 1, 38);
    float *ga = upload(a, n), *gb = upload(b, n), *gout = upload(out, n), *gdout = upload(dout, n), *gda = upload(da, n);
    float *gdb = upload(db, n), *gr = upload(r, n), *gdr = upload(dr, n);
    dt_status st = ga && gb && gout && gdout && gda && gdb && gr && gdr ? DT_OK : DT_ERR_INTERNAL;
    if (st == DT_OK) st = dt_gpu_residual_forward(gout, ga, gb, n);
    if (st == DT_OK) st = dt_gpu_residual_backward(gda, gdb, gdout, n);
    if (st == DT_OK) st = dt_gpu_relu_forward(gr, ga, n);
    if (st == DT_OK) st = dt_gpu_relu_backward(gdr, gdout, ga, n);
    dt_residual_forward(out, a, b, n);
    dt_residual_backward(da, db, dout, n);
    dt_relu_forward(r, a, n);
    dt_relu_backward(dr, dout, a, n);
    size_t d[5] = {SIZE_MAX, SIZE_MAX, SIZE_MAX, SIZE_MAX, SIZE_MAX};
    if (st == DT_OK)
        d[0] = differ(out, gout, n), d[1] = differ(da, gda, n), d[2] = differ(db, gdb, n), d[3] = differ(r, gr, n),
        d[4] = differ(dr, gdr, n);
    CHECK(d[0] == 0 && d[1] == 0 && d[2] == 0 && d[3] == 0 && d[4] == 0, "residual, relu n %zu: elements differing "
          "from the CPU's bits: out %zu, da %zu, db %zu, relu %zu, its backward %zu (0)%s%s", n, d[0], d[1], d[2], d[3],
          d[4], GPU_ERR(st));
    float *hs[] = {a, b, out, dout, da, db, r, dr}, *gs[] = {ga, gb, gout, gdout, gda, gdb, gr, gdr};
    for (int i = 0; i < 8; i++) free(hs[i]), dt_gpu_free(gs[i]);
}

// Whether the entries right of the diagonal of the GPU's [BH, T, T] block d
// are all zeros.
static int upper_zero(const float *d, size_t BH, int T) {
    size_t n = BH * T * T;
    float *g = malloc(sizeof(float) * (n ? n : 1));
    int ok = dt_gpu_to_host(g, d, sizeof(float) * n) == DT_OK;
    for (size_t i = 0; i < n && ok; i++) ok = i % T <= i / T % T || g[i] == 0.0f;
    free(g);
    return ok;
}

// The attention's forward again with its output in t (out16, 16-bit):
// the fp32 output gout's bits rounded (the same call's: its bits repeat).
static dt_status out16_same(const float *gout, float *gatt, const float *gq, void *gw, int B, int T, int C, int NH,
                            dt_dtype t) {
    size_t n = (size_t)B * T * C, wrong = 0;
    float *back = calloc(n, sizeof(float)), *room = upload(back, n);
    uint16_t *h = malloc(2 * n), *want = malloc(2 * n);
    void *gh = NULL;
    dt_status st = room ? dt_gpu_alloc(&gh, 2 * n) : DT_ERR_INTERNAL;
    if (st == DT_OK) st = dt_gpu_to_host(back, gout, sizeof(float) * n);
    if (st == DT_OK) st = dt_gpu_attention_forward(room, gatt, gq, gw, B, T, C, NH, t, gh);
    if (st == DT_OK) st = dt_gpu_to_host(h, gh, 2 * n);
    dt_from_f32(want, back, n, t);
    for (size_t i = 0; i < n && st == DT_OK; i++) wrong += h[i] != want[i];
    CHECK(st == DT_OK && !wrong, "attention %s forward B %d T %d C %d NH %d, its output made in 16 bits: %zu elements "
          "not the fp32 output's bits rounded (0)%s%s", dt_dtype_name(t), B, T, C, NH, wrong, GPU_ERR(st));
    free(back), free(h), free(want), dt_gpu_free(room), dt_gpu_free(gh);
    return st;
}

// Attention forward and backward: out and dqkv normwise within 1e-5; where
// the heads take the GEMM plan (past DT_ATT_FUSED_HS columns) the
// probabilities each within 1e-5 relative, datt normwise, the upper
// triangles zeros, and the backward runs on the CPU's probabilities; fused,
// on the forward's own saved rows and its output as the GPT's layer keeps
// it (in 16 bits, rounded to t), and a second run gives the same bits.
// Products in t: against the CPU's attention in t (its GEMMs' precision),
// out and dqkv (and datt) normwise within 1e-2 (bf16) or 2e-3 (fp16): the
// same rounded operands, but a sum made in another order (or the fused
// kernels' unnormalised probabilities) may move a factor across a 16-bit
// rounding boundary, an ulp (2^-8, 2^-11) of it.
static void test_attention(int B, int T, int C, int NH, dt_dtype t) {
    double tol = t == DT_BF16 ? 1e-2 : t == DT_F16 ? 2e-3 : dt_gpu_tf32() ? 5e-3 : 1e-5;
    const char *tn = t == DT_BF16 ? " bf16" : t == DT_F16 ? " fp16" : dt_gpu_tf32() ? " tf32" : "",
               *how = dt_att_fused(C, NH) ? "fused" : "GEMMs";
    int fused = dt_att_fused(C, NH);
    dt_att_room room = dt_att_room_of(B, T, C, NH, t);
    size_t n3 = (size_t)B * T * 3 * C, n = (size_t)B * T * C, na = (size_t)B * NH * T * T;
    size_t ns = room.saved / sizeof(float), nd = room.scratch / sizeof(float);
    float *qkv = randoms(n3, 2, 41), *out = randoms(n, 1, 42), *att = randoms(na, 1, 43), *dout = randoms(n, 1, 44);
    float *dqkv = randoms(n3, 0.1f, 45), *datt = randoms(na, 1, 46), *saved = randoms(ns, 1, 47);
    float *scratch = randoms(nd, 1, 48), *again = malloc(sizeof(float) * n3);
    float *gq = upload(qkv, n3), *gout = upload(out, n), *gatt = upload(saved, ns), *gdout = upload(dout, n);
    float *gdq = upload(dqkv, n3), *gdq2 = upload(dqkv, n3), *gdatt = upload(scratch, nd);
    memset(dqkv, 0, sizeof(float) * n3);  // (the GPU writes gdq whole; the CPU's op adds into zeros)
    void *gw = NULL;  // (the plan's rounded factors in bf16 and fp16)
    dt_status st = gq && gout && gatt && gdout && gdq && gdq2 && gdatt ? DT_OK : DT_ERR_INTERNAL;
    if (st == DT_OK && room.work) st = dt_gpu_alloc(&gw, room.work);
    if (st == DT_OK) st = dt_gpu_attention_forward(gout, gatt, gq, gw, B, T, C, NH, t, NULL);
    if (st == DT_OK && t != DT_F32) st = out16_same(gout, gatt, gq, gw, B, T, C, NH, t);
    dt_kernels_set_precision(t);
    dt_attention_forward(out, att, qkv, B, T, C, NH);
    double dy = st == DT_OK ? against_norm(out, gout, n) : INFINITY;
    double dp = st == DT_OK && !fused ? against(att, gatt, na, 1e-30) : 0.0;
    int z = st == DT_OK && (fused || upper_zero(gatt, (size_t)B * NH, T));
    CHECK(dy <= tol && dp <= 1e-5 && z, "attention%s (%s) forward B %d T %d C %d NH %d: out %.3g (normwise, <= %g), "
          "att %.3g (<= 1e-5), right of the diagonal %s%s%s", tn, how, B, T, C, NH, dy, tol, dp,
          z ? "zeros" : "NOT ZEROS", GPU_ERR(st));
    if (st == DT_OK && !fused) st = dt_gpu_to_device(gatt, att, sizeof(float) * na);
    void *g16 = NULL;  // (the output as kept in 16 bits)
    if (st == DT_OK && t != DT_F32 && (st = dt_gpu_alloc(&g16, 2 * n)) == DT_OK) st = dt_gpu_from_f32(g16, gout, n, t);
    const void *kept = t == DT_F32 ? (const void *)gout : g16;
    if (st == DT_OK) st = dt_gpu_attention_backward(gdq, gdatt, gdout, gq, kept, gatt, gw, B, T, C, NH, t);
    dt_attention_backward(dqkv, datt, dout, qkv, att, B, T, C, NH);
    dt_kernels_set_precision(DT_F32);
    for (size_t i = 0; i < na; i++)  // (the CPU leaves part of its scratch right of the diagonal as it was)
        if (i % T > i / T % T) datt[i] = 0.0f;
    double dq = st == DT_OK ? against_norm(dqkv, gdq, n3) : INFINITY;
    double dd = st == DT_OK && !fused ? against_norm(datt, gdatt, na) : 0.0;
    z = st == DT_OK && (fused || upper_zero(gdatt, (size_t)B * NH, T));
    CHECK(dq <= tol && dd <= tol && z, "attention%s (%s) backward B %d T %d C %d NH %d: dqkv %.3g, datt %.3g "
          "(normwise, <= %g), datt right of the diagonal %s%s%s", tn, how, B, T, C, NH, dq, dd, tol,
          z ? "zeros" : "NOT ZEROS", GPU_ERR(st));
    if (fused) {  // deterministic: the same gradient's bits again
        if (st == DT_OK) st = dt_gpu_attention_backward(gdq2, gdatt, gdout, gq, kept, gatt, gw, B, T, C, NH, t);
        float *first = malloc(sizeof(float) * n3);
        int same = st == DT_OK && dt_gpu_to_host(first, gdq, sizeof(float) * n3) == DT_OK &&
                   dt_gpu_to_host(again, gdq2, sizeof(float) * n3) == DT_OK && !memcmp(first, again, sizeof(float) * n3);
        CHECK(same, "attention%s (fused) backward B %d T %d C %d NH %d: a second run the same bits%s%s", tn, B, T, C,
              NH, GPU_ERR(st));
        free(first);
    }
    float *hs[] = {qkv, out, att, dout, dqkv, datt, saved, scratch, again}, *gs[] = {gq, gout, gatt, gdout, gdq, gdq2, gdatt};
    for (int i = 0; i < 9; i++) free(hs[i]);
    for (int i = 0; i < 7; i++) dt_gpu_free(gs[i]);
    dt_gpu_free(gw);
    dt_gpu_free(g16);
}

static float *absolute(const float *a, size_t n) {
    float *r = malloc(sizeof(float) * (n ? n : 1));
    for (size_t i = 0; i < n; i++) r[i] = fabsf(a[i]);
    return r;
}

// The bias: out += b (the CPU's bits of that sum) and its gradient against
// dt_linear_backward's db, within 1e-5 of each column's sum of |terms| (the
// GPU sums chunks of rows in parallel); the same bits on a second run, and
// on runs that round dout to bf16 and fp16 on the way (dout16: to16's
// bits).
static void test_bias(size_t N, int OC) {
    size_t n = N * OC;
    float *out = randoms(n, 2, 51), *b = randoms(OC, 2, 52), *dout = randoms(n, 1, 53), *db = randoms(OC, 1, 54);
    float *mdb = absolute(db, OC), *ad = absolute(dout, n), *once = malloc(sizeof(float) * OC);
    float *gout = upload(out, n), *gb = upload(b, OC), *gdout = upload(dout, n), *gdb = upload(db, OC);
    dt_status st = gout && gb && gdout && gdb ? DT_OK : DT_ERR_INTERNAL;
    if (st == DT_OK) st = dt_gpu_bias_forward(gout, gb, N, OC);
    if (st == DT_OK) st = dt_gpu_bias_backward(gdb, gdout, N, OC, NULL, DT_F32);
    if (st == DT_OK) st = dt_gpu_to_host(once, gdb, sizeof(float) * OC);
    uint16_t *h = malloc(2 * n), *want = malloc(2 * n);
    void *gh = NULL;
    size_t wrong16 = 0;
    if (st == DT_OK) st = dt_gpu_alloc(&gh, 2 * n);
    for (int k = 0; k < 2 && st == DT_OK; k++) {  // (again from the same start, rounding dout to bf16, fp16)
        dt_dtype t = k ? DT_F16 : DT_BF16;
        st = dt_gpu_to_device(gdb, db, sizeof(float) * OC);
        if (st == DT_OK) st = dt_gpu_bias_backward(gdb, gdout, N, OC, gh, t);
        if (st == DT_OK) st = dt_gpu_to_host(h, gh, 2 * n);
        dt_from_f32(want, dout, n, t);
        for (size_t i = 0; i < n && st == DT_OK; i++) wrong16 += h[i] != want[i];
        size_t d = st == DT_OK ? differ(once, gdb, OC) : SIZE_MAX;
        wrong16 += d == SIZE_MAX ? 1 : d;
    }
    free(h), free(want), dt_gpu_free(gh);
    if (st == DT_OK) st = dt_gpu_to_device(gdb, db, sizeof(float) * OC);  // (again from the same start)
    if (st == DT_OK) st = dt_gpu_bias_backward(gdb, gdout, N, OC, NULL, DT_F32);
    for (size_t i = 0; i < n; i++) out[i] += b[i % OC];
    dt_linear_backward(NULL, NULL, db, dout, NULL, NULL, (int)N, 1, OC);
    dt_linear_backward(NULL, NULL, mdb, ad, NULL, NULL, (int)N, 1, OC);
    size_t bo = st == DT_OK ? differ(out, gout, n) : SIZE_MAX, again = st == DT_OK ? differ(once, gdb, OC) : SIZE_MAX;
    double eb = st == DT_OK ? against_mag(db, gdb, mdb, OC) : INFINITY;
    CHECK(bo == 0 && eb <= 1e-5 && again == 0 && wrong16 == 0, "bias N %zu OC %d: forward: %zu elements differ from "
          "the CPU's bits (0); db %.3g (|diff| / sum |terms| <= 1e-5), %zu elements differ between two runs (0), %zu "
          "between the runs rounding dout to bf16 and fp16 and their roundings from to16's (0)%s%s", N, OC, bo, eb, again,
          wrong16, GPU_ERR(st));
    free(out), free(b), free(dout), free(db), free(mdb), free(ad), free(once);
    dt_gpu_free(gout), dt_gpu_free(gb), dt_gpu_free(gdout), dt_gpu_free(gdb);
}

// The linear layer against dt_linear_* (each element within tol of its
// sum of |terms|, the CPU's linear layer on absolute values), the bias's
// gradient too; backward accumulating.
static void test_linear(int B, int C, int OC, int bias) {
    size_t ni = (size_t)B * C, nw = (size_t)OC * C, no = (size_t)B * OC;
    float *inp = randoms(ni, 2, 61), *w = randoms(nw, 2, 62), *b = bias ? randoms(OC, 2, 63) : NULL;
    float *out = randoms(no, 1, 64), *dout = randoms(no, 1, 65), *dinp = randoms(ni, 1, 66), *dw = randoms(nw, 1, 67);
    float *db = randoms(OC, 1, 68);
    float *ai = absolute(inp, ni), *aw = absolute(w, nw), *ab = b ? absolute(b, OC) : NULL, *ad = absolute(dout, no);
    float *mo = malloc(sizeof(float) * no), *mi = absolute(dinp, ni), *mw = absolute(dw, nw);
    float *gi = upload(inp, ni), *gw = upload(w, nw), *gb = b ? upload(b, OC) : NULL, *gout = upload(out, no);
    float *gdout = upload(dout, no), *gdi = upload(dinp, ni), *gdw = upload(dw, nw), *gdb = upload(db, OC);
    dt_status st = gi && gw && (gb || !b) && gout && gdout && gdi && gdw && gdb ? DT_OK : DT_ERR_INTERNAL;
    if (st == DT_OK) st = dt_gpu_linear_forward(gout, NULL, gi, gw, gb, B, C, OC, DT_F32);
    if (st == DT_OK) st = dt_gpu_linear_backward(gdi, gdw, gdb, gdout, gi, gw, B, C, OC);
    dt_linear_forward(out, inp, w, b, B, C, OC);
    dt_linear_forward(mo, ai, aw, ab, B, C, OC);
    float *mdb = absolute(db, OC);
    dt_linear_backward(dinp, dw, db, dout, inp, w, B, C, OC);
    dt_linear_backward(mi, mw, mdb, ad, ai, aw, B, C, OC);
    double eo = st == DT_OK ? against_mag(out, gout, mo, no) : INFINITY;
    double ei = st == DT_OK ? against_mag(dinp, gdi, mi, ni) : INFINITY;
    double ew = st == DT_OK ? against_mag(dw, gdw, mw, nw) : INFINITY;
    double eb = st == DT_OK ? against_mag(db, gdb, mdb, OC) : INFINITY;
    free(mdb);
    CHECK(eo <= 1e-5 && ei <= 1e-5 && ew <= 1e-5 && eb <= 1e-5, "linear B %d C %d OC %d%s: out %.3g, dinp %.3g, dw %.3g, "
          "db %.3g (|diff| / sum |terms| <= 1e-5)%s%s", B, C, OC, bias ? " with bias" : "", eo, ei, ew, eb, GPU_ERR(st));
    float *hs[] = {inp, w, b, out, dout, dinp, dw, db, ai, aw, ab, ad, mo, mi, mw};
    float *gs[] = {gi, gw, gb, gout, gdout, gdi, gdw, gdb};
    for (int i = 0; i < 15; i++) free(hs[i]);
    for (int i = 0; i < 8; i++) dt_gpu_free(gs[i]);
}

// The linear layer on 16-bit operands (t: the device model's bf16 and fp16
// steps), with the bias and with GELU after it (cuBLASLt's BIAS and
// GELU_AUX_BIAS epilogues on 16-bit factors, fp32 sums): against
// dt_linear_forward in fp32 on the factors rounded to t (their products
// exact in fp32), within 1e-5 of the sum of |terms| (GELU's output: 1e-3,
// cuBLASLt's own GELU).
static void test_linear16(int B, int C, int OC, dt_dtype t) {
    size_t ni = (size_t)B * C, nw = (size_t)OC * C, no = (size_t)B * OC;
    float *inp = randoms(ni, 2, 81), *w = randoms(nw, 2, 82), *b = randoms(OC, 2, 83), *pre = malloc(sizeof(float) * no);
    float *out = malloc(sizeof(float) * no), *mo = malloc(sizeof(float) * no), *o1 = malloc(sizeof(float) * no);
    uint16_t *i16 = malloc(2 * ni), *w16 = malloc(2 * nw);
    dt_from_f32(i16, inp, ni, t), dt_from_f32(w16, w, nw, t);
    dt_to_f32(inp, i16, ni, t), dt_to_f32(w, w16, nw, t);  // (the factors as the device has them)
    float *ai = absolute(inp, ni), *aw = absolute(w, nw), *ab = absolute(b, OC);
    void *gi = NULL, *gw = NULL;
    float *gb = upload(b, OC), *gpre = upload(out, no), *gout = upload(out, no), *go1 = upload(out, no);
    dt_status st = gb && gpre && gout && go1 ? dt_gpu_alloc(&gi, 2 * ni) : DT_ERR_INTERNAL;
    if (st == DT_OK) st = dt_gpu_alloc(&gw, 2 * nw);
    if (st == DT_OK) st = dt_gpu_to_device(gi, i16, 2 * ni);
    if (st == DT_OK) st = dt_gpu_to_device(gw, w16, 2 * nw);
    if (st == DT_OK) st = dt_gpu_linear_forward(go1, NULL, gi, gw, gb, B, C, OC, t);
    if (st == DT_OK) st = dt_gpu_linear_forward(gout, gpre, gi, gw, gb, B, C, OC, t);
    dt_linear_forward(pre, inp, w, b, B, C, OC);
    dt_gelu_forward(out, pre, no);
    dt_linear_forward(mo, ai, aw, ab, B, C, OC);
    double e1 = st == DT_OK ? against_mag(pre, go1, mo, no) : INFINITY;
    double ep = st == DT_OK ? against_mag(pre, gpre, mo, no) : INFINITY;
    double eo = st == DT_OK ? against_mag(out, gout, mo, no) : INFINITY;
    double tf = OC % 8 == 0 ? 1e-3 : 2e-5;
    CHECK(e1 <= 1e-5 && ep <= 1e-5 && eo <= tf, "linear on %s operands B %d C %d OC %d: out %.3g, with GELU pre %.3g "
          "(<= 1e-5), out %.3g (<= %g)%s%s", dt_dtype_name(t), B, C, OC, e1, ep, eo, tf, GPU_ERR(st));
    float *hs[] = {inp, w, b, pre, out, mo, o1, ai, aw, ab}, *gs[] = {gb, gpre, gout, go1};
    for (int i = 0; i < 10; i++) free(hs[i]);
    for (int i = 0; i < 4; i++) dt_gpu_free(gs[i]);
    free(i16), free(w16), dt_gpu_free(gi), dt_gpu_free(gw);
}

// The linear layer with GELU after it (forward) and before it (backward:
// dpre written): against dt_linear_* and dt_gelu_*. cuBLASLt's epilogues
// (OC, C multiples of 8; the forward's in exact fp32 not, keeping
// nn/rows.h's GELU) bring their own GELU: within 1e-3 of the sum of
// |terms|; the plain path's is nn/rows.h's: 2e-5.
static void test_linear_gelu(int B, int C, int OC) {
    size_t ni = (size_t)B * C, nw = (size_t)OC * C, no = (size_t)B * OC;
    float *inp = randoms(ni, 2, 71), *w = randoms(nw, 2, 72), *b = randoms(OC, 2, 73), *pre = randoms(no, 1, 74);
    float *out = randoms(no, 1, 75), *mo = malloc(sizeof(float) * no);
    float *ai = absolute(inp, ni), *aw = absolute(w, nw), *ab = absolute(b, OC);
    float *gi = upload(inp, ni), *gw = upload(w, nw), *gb = upload(b, OC), *gpre = upload(pre, no), *gout = upload(out, no);
    dt_status st = gi && gw && gb && gpre && gout ? DT_OK : DT_ERR_INTERNAL;
    if (st == DT_OK) st = dt_gpu_linear_forward(gout, gpre, gi, gw, gb, B, C, OC, DT_F32);
    dt_linear_forward(pre, inp, w, b, B, C, OC);
    dt_gelu_forward(out, pre, no);
    dt_linear_forward(mo, ai, aw, ab, B, C, OC);
    double tf = OC % 8 == 0 ? 1e-3 : 2e-5;
    double ep = st == DT_OK ? against_mag(pre, gpre, mo, no) : INFINITY;
    double eo = st == DT_OK ? against_mag(out, gout, mo, no) : INFINITY;
    CHECK(ep <= 1e-5 && eo <= tf, "linear+gelu forward B %d C %d OC %d: pre %.3g (<= 1e-5), out %.3g (<= %g)%s%s", B, C,
          OC, ep, eo, tf, GPU_ERR(st));
    // Backward of a layer [B,C] -> [B,OC] whose input is gelu(p), p [B,C].
    float *p = randoms(ni, 6, 76), *x = malloc(sizeof(float) * ni), *dout = randoms(no, 1, 77), *dw = randoms(nw, 1, 78);
    float *db = randoms(OC, 1, 79), *tmp = calloc(ni, sizeof(float)), *dp = calloc(ni, sizeof(float));
    float *mt = calloc(ni, sizeof(float)), *ad = absolute(dout, no), *mw = absolute(dw, nw);
    dt_gelu_forward(x, p, ni);
    float *gp = upload(p, ni), *gx = upload(x, ni), *gdout = upload(dout, no), *gdw = upload(dw, nw), *gdb = upload(db, OC);
    float *gdp = upload(dp, ni), *ax = absolute(x, ni);
    if (st == DT_OK) st = gp && gx && gdout && gdw && gdb && gdp ? DT_OK : DT_ERR_INTERNAL;
    if (st == DT_OK) st = dt_gpu_linear_dgelu(gdp, gdout, gw, gp, B, C, OC, DT_F32);
    if (st == DT_OK) st = dt_gpu_linear_backward(NULL, gdw, gdb, gdout, gx, gw, B, C, OC);
    float *mdb = absolute(db, OC);
    dt_linear_backward(tmp, dw, db, dout, x, w, B, C, OC);
    dt_gelu_backward(dp, tmp, p, ni);
    dt_linear_backward(mt, mw, mdb, ad, ax, aw, B, C, OC);
    for (size_t i = 0; i < ni; i++) mt[i] *= 1.2f;  // (|gelu'| < 1.13)
    double tb = C % 8 == 0 ? 1e-3 : 2e-5;
    double ed = st == DT_OK ? against_mag(dp, gdp, mt, ni) : INFINITY;
    double ew = st == DT_OK ? against_mag(dw, gdw, mw, nw) : INFINITY;
    double eb = st == DT_OK ? against_mag(db, gdb, mdb, OC) : INFINITY;
    free(mdb);
    CHECK(ed <= tb && ew <= 1e-5 && eb <= 1e-5, "linear backward through gelu B %d C %d OC %d: dpre %.3g (<= %g), dw "
          "%.3g, db %.3g (<= 1e-5)%s%s", B, C, OC, ed, tb, ew, eb, GPU_ERR(st));
    float *hs[] = {inp, w, b, pre, out, mo, ai, aw, ab, p, x, dout, dw, db, tmp, dp, mt, ad, mw, ax};
    float *gs[] = {gi, gw, gb, gpre, gout, gp, gx, gdout, gdw, gdb, gdp};
    for (int i = 0; i < 20; i++) free(hs[i]);
    for (int i = 0; i < 11; i++) dt_gpu_free(gs[i]);
}

// The sum of squares: dt_sum_squares's bits; the scale read on the device.
static void test_sumsq(size_t n) {
    float *x = randoms(n, 20, 81), s = 0.37f;
    float *gx = upload(x, n), *gs = upload(&s, 1);
    void *gd = NULL;
    dt_status st = gx && gs ? dt_gpu_alloc(&gd, sizeof(double)) : DT_ERR_INTERNAL;
    if (st == DT_OK) st = dt_gpu_sumsq(gd, gx, n);
    double want = dt_sum_squares(x, n), got = NAN;
    if (st == DT_OK) st = dt_gpu_to_host(&got, gd, sizeof(double));
    if (st == DT_OK) st = dt_gpu_scale(gx, n, gs);
    for (size_t i = 0; i < n; i++) x[i] *= s;
    size_t bs = st == DT_OK ? differ(x, gx, n) : SIZE_MAX;
    CHECK(st == DT_OK && memcmp(&want, &got, sizeof want) == 0 && bs == 0, "sum of squares n %zu: %.17g against "
          "dt_sum_squares's %.17g (bitwise); scale: %zu elements differ%s%s", n, got, want, bs, GPU_ERR(st));
    free(x), dt_gpu_free(gx), dt_gpu_free(gs), dt_gpu_free(gd);
}

// The step's losses summed on the device (loss_add: the host loop's bits,
// product and sum unfused), and batches uploaded without waiting from two
// pinned slots, each refilled once its event has run (dt_dev_blocks_stage's
// pattern): every batch arrives whole.
static void test_loss_upload(void) {
    const float losses[] = {2.302585f, 1.9999999f, 0.1234567f, 7.5f};
    const int lens[] = {7, 3, 16, 1};
    double want = 0, got = NAN, *acc = NULL;
    float *gl = NULL;
    dt_status st = dt_gpu_alloc((void **)&acc, sizeof(double));
    if (st == DT_OK) st = dt_gpu_alloc((void **)&gl, sizeof(float) * 4);
    if (st == DT_OK) st = dt_gpu_memset0(acc, sizeof(double));
    for (int k = 0; k < 4 && st == DT_OK; k++) {
        want += (double)losses[k] * lens[k];
        st = dt_gpu_to_device(gl + k, &losses[k], sizeof(float));
        if (st == DT_OK) st = dt_gpu_loss_add(acc, gl + k, (double)lens[k]);
    }
    if (st == DT_OK) st = dt_gpu_to_host(&got, acc, sizeof got);
    CHECK(st == DT_OK && memcmp(&got, &want, sizeof got) == 0, "loss_add: %.17g against the host's %.17g "
          "(bitwise)%s%s", got, want, GPU_ERR(st));
    enum { N = 1 << 20, BATCHES = 6 };
    int32_t *slot[2] = {NULL, NULL}, *dev = NULL;
    void *ev[2] = {NULL, NULL};
    for (int k = 0; k < 2 && st == DT_OK; k++) st = dt_gpu_host_alloc((void **)&slot[k], sizeof(int32_t) * N);
    for (int k = 0; k < 2 && st == DT_OK; k++) st = dt_gpu_event_create(&ev[k]);
    if (st == DT_OK) st = dt_gpu_alloc((void **)&dev, sizeof(int32_t) * N * BATCHES);
    for (int b = 0; b < BATCHES && st == DT_OK; b++) {
        int k = b % 2;
        st = dt_dev_event_wait(&dt_dev_cuda, ev[k], 10, "a slot's last copy");
        for (int i = 0; i < N && st == DT_OK; i++) slot[k][i] = b * N + i;
        if (st == DT_OK) st = dt_gpu_to_device_async(dev + (size_t)b * N, slot[k], sizeof(int32_t) * N);
        if (st == DT_OK) st = dt_gpu_event_record(ev[k]);
    }
    int32_t *back = malloc(sizeof(int32_t) * N * BATCHES);
    size_t bad = 0;
    if (st == DT_OK) st = dt_gpu_to_host(back, dev, sizeof(int32_t) * N * BATCHES);
    for (size_t i = 0; st == DT_OK && i < (size_t)N * BATCHES; i++) bad += back[i] != (int32_t)i;
    CHECK(st == DT_OK && bad == 0, "%d batches of %d values uploaded without waiting through 2 pinned slots: %zu "
          "values wrong%s%s", BATCHES, N, bad, GPU_ERR(st));
    free(back);
    for (int k = 0; k < 2; k++) dt_gpu_host_free(slot[k]), dt_gpu_event_destroy(ev[k]);
    dt_gpu_free(dev), dt_gpu_free(acc), dt_gpu_free(gl);
}

// The sharded norm's pieces of each rank's slice of n over W (ZeRO on a
// device): the CPU's dt_sum_squares_parts bits, each slice's first piece
// from the carry of the slice before.
static void test_sumsq_parts(size_t n, int W) {
    float *x = randoms(n, 20, 83), *gx = upload(x, n);
    size_t most = n / DT_SUMSQ_BLOCK + 2;
    double *want = malloc(sizeof(double) * most), *got = malloc(sizeof(double) * most), carry = 0;
    void *gd = NULL;
    dt_status st = gx ? dt_gpu_alloc(&gd, sizeof(double) * most) : DT_ERR_INTERNAL;
    for (int r = 0; r < W && st == DT_OK; r++) {
        size_t lo, hi, np = 0;
        dt_shard_range(n, r, W, &lo, &hi);
        if (hi > lo) np = dt_sum_squares_parts(x + lo, hi - lo, lo % DT_SUMSQ_BLOCK, carry, want);
        if (np) st = dt_gpu_sumsq_parts(gd, gx + lo, hi - lo, lo % DT_SUMSQ_BLOCK, carry);
        if (st == DT_OK && np) st = dt_gpu_to_host(got, gd, sizeof(double) * np);
        CHECK(st == DT_OK && (!np || !memcmp(got, want, sizeof(double) * np)), "sum of squares' pieces n %zu, rank %d "
              "of %d: the CPU's bits%s%s", n, r, W, GPU_ERR(st));
        carry = np && hi % DT_SUMSQ_BLOCK && hi != n ? want[np - 1] : np ? 0 : carry;
    }
    free(x), free(want), free(got), dt_gpu_free(gx), dt_gpu_free(gd);
}

// Deterministic mode's fixed point: two gradients into the sums, then back
// to floats, the CPU's bits (core/fixed.h), clamping and ties included.
static void test_fixed(size_t n) {
    float *g = randoms(n, 20, 95), *h = randoms(n, 1, 96), *back = malloc(sizeof(float) * n);
    const float special[] = {0.0f, -0.0f, 1e12f, -1e12f, 1e-12f, 0x1p-33f, 0x3p-33f, -0x5p-33f};
    for (size_t i = 0; i < n && i < sizeof special / sizeof *special; i++) g[i] = special[i];
    int64_t *acc = calloc(n ? n : 1, sizeof(int64_t)), *got = malloc(sizeof(int64_t) * (n ? n : 1));
    for (size_t i = 0; i < n; i++) acc[i] = dt_fixed_of(g[i], DT_FIXED_SCALE) + dt_fixed_of(h[i], DT_FIXED_SCALE);
    for (size_t i = 0; i < n; i++) back[i] = dt_fixed_value(acc[i]);
    float *gg = upload(g, n), *gh = upload(h, n), *gback = upload(back, n);
    void *gacc = NULL;
    dt_status st = gg && gh && gback ? dt_gpu_alloc(&gacc, sizeof(int64_t) * (n ? n : 1)) : DT_ERR_INTERNAL;
    if (st == DT_OK) st = dt_gpu_memset0(gacc, sizeof(int64_t) * n);
    if (st == DT_OK) st = dt_gpu_fixed_add(gacc, gg, n);
    if (st == DT_OK) st = dt_gpu_fixed_add(gacc, gh, n);
    if (st == DT_OK) st = dt_gpu_fixed_to_float(gback, gacc, n);
    if (st == DT_OK) st = dt_gpu_to_host(got, gacc, sizeof(int64_t) * n);
    size_t ba = st == DT_OK ? 0 : SIZE_MAX;
    for (size_t i = 0; i < n && st == DT_OK; i++) ba += got[i] != acc[i];
    size_t bb = st == DT_OK ? differ(back, gback, n) : SIZE_MAX;
    CHECK(ba == 0 && bb == 0, "fixed point n %zu: sums %zu differ, floats %zu differ from the CPU's bits (0)%s%s", n, ba,
          bb, GPU_ERR(st));
    free(g), free(h), free(back), free(acc), free(got), dt_gpu_free(gg), dt_gpu_free(gh), dt_gpu_free(gback),
        dt_gpu_free(gacc);
}

// A block backed on demand (CUDA's virtual memory management, ZeRO stage
// 2's gradients): three chunks of the driver's granularity reserved, the
// middle one backed (zeroed) and written, the free memory falling by it,
// given back (rising again), the first backed again: zero.
static void test_vm(void) {
    dt_dev_vm v;
    size_t f0 = 0, f1 = 0, f2 = 0, total = 0;
    dt_status st = dt_dev_vm_open(&v, &dt_dev_cuda, 0, "test", "vm");
    size_t gran = v.gran;
    dt_dev_vm_close(&v);
    if (st == DT_OK) st = dt_dev_vm_open(&v, &dt_dev_cuda, 3 * gran, "test", "vm");
    float one[4] = {1, 2, 3, 4}, got[4] = {9, 9, 9, 9};
    if (st == DT_OK) st = dt_gpu_mem_info(&f0, &total);
    if (st == DT_OK) st = dt_dev_vm_back(&v, gran, 16);
    if (st == DT_OK) st = dt_gpu_to_host(got, v.base + gran, sizeof got);
    int zeroed = st == DT_OK && got[0] == 0 && got[3] == 0;
    if (st == DT_OK) st = dt_gpu_to_device(v.base + gran, one, sizeof one);
    if (st == DT_OK) st = dt_gpu_to_host(got, v.base + gran, sizeof got);
    int kept = st == DT_OK && !memcmp(got, one, sizeof one);
    if (st == DT_OK) st = dt_gpu_mem_info(&f1, &total);
    if (st == DT_OK) st = dt_dev_vm_unused(&v, gran, gran);
    if (st == DT_OK) st = dt_gpu_mem_info(&f2, &total);
    if (st == DT_OK) st = dt_dev_vm_back(&v, 0, gran);
    if (st == DT_OK) st = dt_gpu_to_host(got, v.base, sizeof got);
    CHECK(st == DT_OK && gran >= 4096 && zeroed && kept && f0 - f1 >= gran && f2 > f1 && got[0] == 0 && got[3] == 0 &&
              v.peak == gran && !v.mapped[1],
          "memory backed on demand (chunks of %zu bytes): backed zeroed %d, written %d, free %zu -> %zu -> %zu%s%s",
          gran, zeroed, kept, f0, f1, f2, GPU_ERR(st));
    dt_dev_vm_close(&v);
}

// The communication stream: after the kernels queued so far (ev NULL), or
// after an event recorded after them, twice (reused), then done.
static void test_stream(int event) {
    void *s = NULL, *ev = NULL;
    float x[1000];
    for (int i = 0; i < 1000; i++) x[i] = (float)i;
    float *gx = upload(x, 1000);
    dt_status st = gx ? dt_gpu_stream_create(&s) : DT_ERR_INTERNAL;
    if (st == DT_OK && event) st = dt_gpu_event_create(&ev);
    int done = 0;
    for (int round = 0; round < (event ? 2 : 1) && st == DT_OK; round++) {
        st = dt_gpu_gelu_forward(gx, gx, 1000, NULL, DT_F32);
        if (st == DT_OK) st = event ? dt_gpu_event_record(ev) : dt_gpu_stream_after_compute(s);
        if (st == DT_OK && event) st = dt_gpu_stream_wait_event(s, ev);
        done = 0;
        for (double until = dt_now() + 10; st == DT_OK && !done && dt_now() < until;)
            st = dt_gpu_stream_query(s, &done);
    }
    int ran = !event;  // (the event's kernels run, polled: ZeRO stage 3's give-back)
    for (double until = dt_now() + 10; event && st == DT_OK && !ran && dt_now() < until;)
        st = dt_gpu_event_query(ev, &ran);
    CHECK(st == DT_OK && done && ran, "a communication stream after the kernels%s: done %d, event done %d%s%s",
          event ? " (an event, recorded twice)" : "", done, ran, GPU_ERR(st));
    dt_gpu_event_destroy(ev);
    dt_gpu_stream_destroy(s);
    dt_gpu_free(gx);
}

// fp32 <-> bf16 and fp16 on the device: dt_from_f32 / dt_to_f32's bits (an
// fp16 NaN's payload aside: CUDA's conversions make one NaN, the CPU's keep
// the payload's top), on every kind of value (ties, NaNs with payloads,
// infinities, subnormals, the largest, -0, fp16's overflow and subnormal
// ties) and random ones.
static int is_nan16(uint16_t h, dt_dtype t) {
    return t == DT_BF16 ? (h & 0x7fffu) > 0x7f80u : (h & 0x7fffu) > 0x7c00u;
}

static void test_convert(dt_dtype t) {
    const uint32_t special[] = {0x00000000u, 0x80000000u, 0x3f808000u, 0x3f818000u, 0x3f80c000u, 0x7f7fffffu,
                                0xff7fffffu, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00001u, 0x7f800001u,
                                0x7fbfffffu, 0x00000001u, 0x807fffffu, 0x00400000u, 0x7f7f8000u, 0x3f7fffffu,
                                0x477fe000u, 0x477ff000u, 0x477fefffu, 0x33000000u, 0x33000001u, 0x387fc000u,
                                0x3f801000u, 0x3f803000u};
    size_t ns = sizeof special / sizeof *special, n = 100003 + ns;
    const char *tn = t == DT_BF16 ? "bf16" : "fp16";
    float *x = randoms(n, t == DT_BF16 ? 1e4f : 1e3f, 91), *back = malloc(sizeof(float) * n);
    memcpy(x, special, sizeof special);
    uint16_t *h = malloc(sizeof(uint16_t) * n), *g = malloc(sizeof(uint16_t) * n);
    float *gbf = malloc(sizeof(float) * n);
    dt_from_f32(h, x, n, t);
    dt_to_f32(back, h, n, t);
    float *gx = upload(x, n), *gback = upload(back, n);
    void *gh = NULL, *gb16 = NULL;
    dt_status st = gx && gback ? dt_gpu_alloc(&gh, sizeof(uint16_t) * n) : DT_ERR_INTERNAL;
    if (st == DT_OK) st = dt_gpu_alloc(&gb16, sizeof(uint16_t) * n);
    if (st == DT_OK) st = dt_gpu_from_f32(gh, gx, n, t);
    if (st == DT_OK) st = dt_gpu_to_host(g, gh, sizeof(uint16_t) * n);
    if (st == DT_OK) st = dt_gpu_to_device(gb16, h, sizeof(uint16_t) * n);  // (the CPU's values widened)
    if (st == DT_OK) st = dt_gpu_to_f32(gback, gb16, n, t);
    if (st == DT_OK) st = dt_gpu_to_host(gbf, gback, sizeof(float) * n);
    size_t bh = st == DT_OK ? 0 : SIZE_MAX, bb = 0;
    for (size_t i = 0; i < n && st == DT_OK; i++) bh += h[i] != g[i] && !(is_nan16(h[i], t) && is_nan16(g[i], t));
    for (size_t i = 0; i < n && st == DT_OK; i++)
        bb += memcmp(&back[i], &gbf[i], 4) && !(isnan(back[i]) && isnan(gbf[i]));
    CHECK(st == DT_OK && bh == 0 && bb == 0, "%s conversions, %zu values (%zu special): to %s %zu differ, back %zu "
          "differ (0)%s%s", tn, n, ns, tn, bh, bb, GPU_ERR(st));
    CHECK(dt_gpu_from_f32(gh, gx, 1, DT_F32) == DT_ERR_ARG && strstr(dt_last_error(), "type F32 is not a 16-bit float"),
          "fp32 refused as a 16-bit type: %s", dt_last_error());
    free(x), free(back), free(h), free(g), free(gbf);
    dt_gpu_free(gx), dt_gpu_free(gback), dt_gpu_free(gh), dt_gpu_free(gb16);
}

// Error feedback's rounding on the device (dt_gpu_from_f32_ef): two steps
// on one residual, the 16-bit values, the gradient with the residual added
// and the residual bitwise dt_from_f32_ef's (finite values: no NaN payload
// to set fp16 apart).
static void test_convert_ef(dt_dtype t, size_t n) {
    const char *tn = t == DT_BF16 ? "bf16" : "fp16";
    float *g[2] = {randoms(n, t == DT_BF16 ? 1e4f : 1e3f, 97), randoms(n, 1e-2f, 98)};
    float *res = calloc(n ? n : 1, sizeof(float)), *gres = upload(res, n);
    uint16_t *h = malloc(sizeof(uint16_t) * (n ? n : 1)), *gh16 = malloc(sizeof(uint16_t) * (n ? n : 1));
    void *dh = NULL;
    dt_status st = gres ? dt_gpu_alloc(&dh, sizeof(uint16_t) * (n ? n : 1)) : DT_ERR_INTERNAL;
    size_t bad = 0;
    for (int k = 0; k < 2 && st == DT_OK; k++) {
        float *gg = upload(g[k], n);
        st = gg ? dt_gpu_from_f32_ef(dh, gg, gres, n, t) : DT_ERR_INTERNAL;
        dt_from_f32_ef(h, g[k], res, n, t);
        if (st == DT_OK) st = dt_gpu_to_host(gh16, dh, sizeof(uint16_t) * n);
        for (size_t i = 0; i < n && st == DT_OK; i++) bad += h[i] != gh16[i];
        if (st == DT_OK) bad += differ(g[k], gg, n) + differ(res, gres, n);
        dt_gpu_free(gg);
    }
    size_t nz = 0;
    for (size_t i = 0; i < n; i++) nz += res[i] != 0;
    CHECK(st == DT_OK && bad == 0 && (n < 100 || nz > n / 2), "%s error feedback, n %zu, 2 steps: %zu values differ "
          "from the CPU's bits (0); %zu residuals not zero%s%s", tn, n, bad, nz, GPU_ERR(st));
    free(g[0]), free(g[1]), free(res), free(h), free(gh16), dt_gpu_free(gres), dt_gpu_free(dh);
}

static void test_gpt_ops(void) {
    // Repeated tokens (V 7 against B T 74), a vocabulary-sized table, T = 1.
    test_encoder(2, 37, 97, 7);
    test_encoder(3, 65, 64, 50257);
    test_encoder(1, 1, 1, 1);
    test_encoder_split(2, 37, 97, 50, 25, 25);
    test_encoder_split(3, 65, 64, 50257, 0, 25152);
    test_ce_split(2 * 37, 25152);
    test_ce_split(5, 1000);
    const size_t ns[] = {1, 255, 257, 100003, (1u << 20) + 7};
    for (size_t i = 0; i < sizeof ns / sizeof *ns; i++) test_elementwise(ns[i]);
    // (B, T, C, NH): T not a multiple of 32, past a warp's 32 lanes and
    // the CPU's 64-row blocks; T = 1; head sizes 1, 18, 32, 64, 100, 128
    // (the fused kernels' 1, 2 and 4 columns a lane), 258 and 512 (the
    // GEMM plan); GPT-2 124M's layer (T 1024, 12 heads of 64).
    const int att[][4] = {{2, 37, 96, 3}, {1, 1, 64, 2}, {3, 70, 72, 4}, {1, 257, 128, 2}, {2, 5, 1024, 2}, {1, 33, 5, 5},
                          {2, 100, 256, 2}, {1, 45, 300, 3}, {1, 40, 258, 1}, {1, 1024, 768, 12}};
    for (size_t i = 0; i < sizeof att / sizeof *att; i++)
        test_attention(att[i][0], att[i][1], att[i][2], att[i][3], DT_F32);
    for (int h = 0; h < 2; h++) {  // products in bf16 and fp16: T past the CPU's 64-row blocks, head sizes 5 to 64
        test_attention(2, 37, 96, 3, h ? DT_F16 : DT_BF16);
        test_attention(3, 70, 72, 4, h ? DT_F16 : DT_BF16);
        test_attention(1, 33, 5, 1, h ? DT_F16 : DT_BF16);
        test_attention(2, 100, 256, 2, h ? DT_F16 : DT_BF16);
        test_attention(1, 40, 258, 1, h ? DT_F16 : DT_BF16);
        test_attention(1, 1024, 768, 12, h ? DT_F16 : DT_BF16);
    }
    dt_gpu_set_tf32(1);  // fp32 with TF32: heads of 64 on the tensor cores (5e-3), others on the CUDA cores
    test_attention(2, 100, 128, 2, DT_F32);
    test_attention(1, 1024, 768, 12, DT_F32);
    test_attention(1, 45, 300, 3, DT_F32);
    dt_gpu_set_tf32(0);
    test_bias(74, 1), test_bias(37, 97), test_bias(3, 50257), test_bias(1, 768), test_bias(1000, 97);
    // (B, C, OC): the epilogues' shapes (multiples of 8), odd ones (the plain
    // path), a vocabulary-wide one, one of each.
    const int lin[][3] = {{130, 96, 288}, {37, 97, 51}, {1, 1, 1}, {7, 64, 50304}, {74, 96, 384}, {5, 384, 96}};
    for (size_t i = 0; i < sizeof lin / sizeof *lin; i++) {
        test_linear(lin[i][0], lin[i][1], lin[i][2], 1);
        test_linear(lin[i][0], lin[i][1], lin[i][2], 0);
        test_linear_gelu(lin[i][0], lin[i][1], lin[i][2]);
        test_linear16(lin[i][0], lin[i][1], lin[i][2], i % 2 ? DT_F16 : DT_BF16);
    }
    const size_t sq[] = {0, 1, 4095, 4097, 100003, (1u << 20) + 7};
    for (size_t i = 0; i < sizeof sq / sizeof *sq; i++) test_sumsq(sq[i]);
    for (size_t i = 0; i < sizeof sq / sizeof *sq; i++) test_sumsq_parts(sq[i], 3);
    for (size_t i = 0; i < sizeof sq / sizeof *sq; i++) test_fixed(sq[i]);
    test_stream(0);
    test_stream(1);
    test_convert(DT_BF16);
    test_convert(DT_F16);
    for (size_t i = 0; i < sizeof ns / sizeof *ns; i++) test_convert_ef(DT_BF16, ns[i]), test_convert_ef(DT_F16, ns[i]);
}

// The CNN's ops against their host loops over cnn_hd.h's elements (the
// simulated GPU's, whose CNN run equals the CPU's: test_gpu_sim), max
// pooling and dropout against the CPU's own kernels: bitwise. Shapes with
// padding, stride 2, odd sizes; an image past 2^31 is not tried here.
static void test_cnn_ops(int B, int C, int H, int W, int K, int S, int P) {
    dt_im2col_t g = {C, H, W, K, S, P, (H + 2 * P - K) / S + 1, (W + 2 * P - K) / S + 1};
    size_t nx = (size_t)B * C * H * W, ncol = (size_t)B * g.OH * g.OW, nc = (size_t)C * K * K * ncol;
    float *x = randoms(nx, 2, 61), *col = calloc(nc, sizeof(float)), *dx = randoms(nx, 1, 62), *t = calloc(nc, sizeof(float));
    float *gx = upload(x, nx), *gcol = upload(col, nc), *gdx = upload(dx, nx), *gt = upload(t, nc);
    dt_status st = gx && gcol && gdx && gt ? DT_OK : DT_ERR_INTERNAL;
    for (size_t i = 0; i < nc; i++) col[i] = dt_im2col_at(x, &g, i / ncol, i % ncol);
    if (st == DT_OK) st = dt_gpu_im2col(gcol, gx, (size_t)B, &g);
    size_t d1 = st == DT_OK ? differ(col, gcol, nc) : SIZE_MAX;
    for (size_t i = 0; i < nx; i++) dx[i] += dt_col2im_at(col, &g, (size_t)B, i);
    if (st == DT_OK) st = dt_gpu_col2im(gdx, gcol, (size_t)B, &g);
    size_t d2 = st == DT_OK ? differ(dx, gdx, nx) : SIZE_MAX;
    for (size_t i = 0; i < nc; i++) t[i] = col[dt_transpose_src(i, (size_t)C * K * K, ncol)];
    if (st == DT_OK) st = dt_gpu_transpose(gt, gcol, 1, (size_t)C * K * K, ncol);
    size_t d3 = st == DT_OK ? differ(t, gt, nc) : SIZE_MAX;
    CHECK(d1 == 0 && d2 == 0 && d3 == 0, "im2col B %d C %d %dx%d K %d S %d P %d: elements differing from the host's: "
          "columns %zu, their gradient back %zu, transposed %zu (0)%s%s", B, C, H, W, K, S, P, d1, d2, d3, GPU_ERR(st));
    // max pooling (K x K, stride K) and dropout p = 0.3 on the same values
    int OH = (H - K) / K + 1, OW = (W - K) / K + 1;
    size_t no = (size_t)B * C * OH * OW;
    float *out = calloc(no + nx, sizeof(float)), *mask = calloc(nx, sizeof(float)), *dy = randoms(no, 1, 63);
    int32_t *arg = calloc(no, sizeof(int32_t));
    float *gout = upload(out, no), *gdy = upload(dy, no), *gmask = upload(mask, nx), *gdrop = upload(out, nx);
    int32_t *garg = upload_i32(arg, no);
    if (st == DT_OK) st = gout && gdy && gmask && gdrop && garg ? DT_OK : DT_ERR_INTERNAL;
    dt_maxpool_forward(out, arg, x, B, C, H, W, K, K);
    dt_maxpool_backward(dx, dy, arg, B, C, H, W, K, K);
    if (st == DT_OK) st = dt_gpu_maxpool_forward(gout, garg, gx, (size_t)B * C, H, W, K, K);
    if (st == DT_OK) st = dt_gpu_maxpool_backward(gdx, gdy, garg, (size_t)B * C, H, W, K, K);
    size_t d4 = st == DT_OK ? differ(out, gout, no) : SIZE_MAX, d5 = st == DT_OK ? differ(dx, gdx, nx) : SIZE_MAX;
    size_t per = (size_t)C * H * W;
    for (int j = 0; j < B; j++) {  // (each sample's mask after 7 draws: a tensor-parallel shard's part)
        dt_rng r;
        dt_rng_seed(&r, dt_dropout_seed(5, 9, (uint64_t)(40 + j), 3));
        for (int k = 0; k < 7; k++) dt_rng_uniform(&r);
        dt_dropout_forward(out + (size_t)j * per, mask + (size_t)j * per, x + (size_t)j * per, per, 0.3f, &r);
    }
    if (st == DT_OK) st = dt_gpu_dropout_forward(gdrop, gmask, gx, B, per, 0.3f, 5, 9, 40, 3, 7);
    size_t d6 = st == DT_OK ? differ(mask, gmask, nx) : SIZE_MAX, d7 = st == DT_OK ? differ(out, gdrop, nx) : SIZE_MAX;
    CHECK(d4 == 0 && d5 == 0 && d6 == 0 && d7 == 0, "max pooling and dropout B %d C %d %dx%d K %d: elements differing "
          "from the CPU's bits: pooled %zu, its gradient %zu, masks %zu, dropped %zu (0)%s%s", B, C, H, W, K, d4, d5, d6,
          d7, GPU_ERR(st));
    free(x), free(col), free(dx), free(t), free(out), free(mask), free(dy), free(arg);
    dt_gpu_free(gx), dt_gpu_free(gcol), dt_gpu_free(gdx), dt_gpu_free(gt), dt_gpu_free(gout), dt_gpu_free(gdy);
    dt_gpu_free(gmask), dt_gpu_free(gdrop), dt_gpu_free(garg);
}

// A convolution whole by cuDNN (fp32, FMA math: TF32 off) against the
// CPU's dt_conv2d_forward / _backward: the output, and the input's, the
// filters' and the bias's gradients added to what was there.
static void test_conv(int B, int C, int H, int W, int OC, int K, int S, int P) {
    char why[600];
    if (!dt_gpu_conv2d_ready(why, sizeof why)) {
        CHECK(0, "cuDNN for the convolutions: %s", why);
        return;
    }
    dt_im2col_t g = {C, H, W, K, S, P, (H + 2 * P - K) / S + 1, (W + 2 * P - K) / S + 1};
    size_t nx = (size_t)B * C * H * W, nw = (size_t)OC * C * K * K, ny = (size_t)B * OC * g.OH * g.OW;
    size_t ncol = dt_conv2d_col_size(B, C, H, W, OC, K, S, P);
    float *x = randoms(nx, 2, 71), *w = randoms(nw, 1, 72), *b = randoms(OC, 1, 73), *dy = randoms(ny, 1, 74);
    float *dx = randoms(nx, 1, 75), *dw = randoms(nw, 1, 76), *db = randoms(OC, 1, 77), *y = calloc(ny, sizeof(float));
    float *col = calloc(ncol, sizeof(float)), *dcol = calloc(ncol, sizeof(float));
    float *gx = upload(x, nx), *gw = upload(w, nw), *gb = upload(b, OC), *gdy = upload(dy, ny), *gdx = upload(dx, nx);
    float *gdw = upload(dw, nw), *gdb = upload(db, OC), *gy = upload(y, ny);
    dt_status st = gx && gw && gb && gdy && gdx && gdw && gdb && gy ? DT_OK : DT_ERR_INTERNAL;
    dt_gpu_set_tf32(0);
    dt_conv2d_forward(y, col, x, w, b, B, C, H, W, OC, K, S, P);
    dt_conv2d_backward(dx, dw, db, dcol, dy, col, w, B, C, H, W, OC, K, S, P);
    if (st == DT_OK) st = dt_gpu_conv2d_forward(gy, gx, gw, gb, (size_t)B, &g, OC);
    if (st == DT_OK) st = dt_gpu_conv2d_backward(gdx, gdw, gdb, gdy, gx, gw, (size_t)B, &g, OC);
    double e[4] = {INFINITY, INFINITY, INFINITY, INFINITY};
    const float *want[4] = {y, dx, dw, db}, *got[4] = {gy, gdx, gdw, gdb};
    size_t n[4] = {ny, nx, nw, (size_t)OC};
    for (int k = 0; k < 4 && st == DT_OK; k++) e[k] = against_norm(want[k], got[k], n[k]);  // (a gradient's sums cancel)
    CHECK(st == DT_OK && e[0] <= 1e-5 && e[1] <= 1e-5 && e[2] <= 1e-5 && e[3] <= 1e-5,
          "cuDNN's convolution B %d C %d %dx%d OC %d K %d S %d P %d against the CPU's: output %.3g, input gradient "
          "%.3g, filters' %.3g, bias's %.3g (max |diff| / max |CPU's|, 1e-5)%s%s", B, C, H, W, OC, K, S, P, e[0], e[1], e[2], e[3],
          GPU_ERR(st));
    free(x), free(w), free(b), free(dy), free(dx), free(dw), free(db), free(y), free(col), free(dcol);
    dt_gpu_free(gx), dt_gpu_free(gw), dt_gpu_free(gb), dt_gpu_free(gdy), dt_gpu_free(gdx), dt_gpu_free(gdw);
    dt_gpu_free(gdb), dt_gpu_free(gy);
}

static void test_layers(void) {
    test_conv(3, 5, 13, 11, 7, 3, 2, 1);
    test_conv(2, 6, 28, 28, 16, 5, 1, 2);
    test_conv(1, 1, 7, 9, 3, 2, 1, 0);
    test_conv(64, 32, 16, 16, 64, 3, 1, 1);
    test_cnn_ops(3, 5, 13, 11, 3, 2, 1);
    test_cnn_ops(2, 6, 28, 28, 5, 1, 2);
    test_cnn_ops(1, 1, 7, 9, 2, 1, 0);
    // Rows B x T with T = 37 (not a multiple of 32); C odd, below, at and
    // above a block of 256; one row of one channel.
    const int Cs[] = {1, 97, 256, 771};
    for (size_t i = 0; i < sizeof Cs / sizeof *Cs; i++) test_layernorm(2 * 37, Cs[i]);
    test_layernorm(1, 771);
    test_layernorm(600, 96);  // (chunks of rows: the column sums' partials)
    test_layernorm_residual(2 * 37, 771);
    test_layernorm_residual(3, 1);
    const size_t ns[] = {1, 255, 257, 100003, (1u << 20) + 7};
    for (size_t i = 0; i < sizeof ns / sizeof *ns; i++) test_gelu(ns[i]);
    // GPT-2's vocabulary padded as the GPT pads it (50257 to 50304), a small
    // one padded, one unpadded, one column.
    test_crossentropy(2 * 37, 50257, 50304);
    test_crossentropy(3, 257, 260);
    test_crossentropy(5, 1000, 1000);
    test_crossentropy_fused(2 * 37, 50257, 50304);
    test_crossentropy_fused(3, 257, 260);
    test_crossentropy(4, 1, 1);
    test_loss_upload();
}

// GPU 0 taken for `what` (1), or the test skipped where there is none (0).
static int gpu0(const char *what) {
    char why[512];
    if (dt_gpu_count(why, sizeof why) == 0) {
        tl_skip("no GPU to %s: %s", what, why);
        return 0;
    }
    CHECK(dt_gpu_use(0) == DT_OK, "GPU 0: %s", dt_last_error());
    return 1;
}

static void test_ops(void) {
    char what[200] = "";
    if (!gpu0("run the ops on")) return;
    CHECK(dt_gpu_describe(0, what, sizeof what) == DT_OK, "GPU 0: %s", dt_last_error());
    printf("GPU 0: %s (%s)\n", what, dt_gpu_build());
    const size_t sizes[] = {1, 255, 257, 100003, (1u << 20) + 7};
    struct { const char *name; dt_optim_kind kind; float momentum, wd; int nesterov; } opts[] = {
        {"adamw", DT_OPTIM_ADAMW, 0, 0.01f, 0},
        {"sgd", DT_OPTIM_SGD, 0, 0, 0},
        {"sgd momentum", DT_OPTIM_SGD, 0.9f, 1e-4f, 0},
        {"sgd nesterov", DT_OPTIM_SGD, 0.9f, 0, 1},
    };
    for (size_t a = 0; a < sizeof opts / sizeof *opts; a++)
        for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
            dt_optim_params p = dt_optim_default_params(opts[a].kind);
            p.momentum = opts[a].momentum;
            p.weight_decay = opts[a].wd;
            p.nesterov = opts[a].nesterov;
            double d = compare(&p, sizes[i], 5);
            CHECK(d >= 0 && d <= 1e-6, "%s, n = %zu, 5 steps: GPU against CPU, max rel diff %.3g", opts[a].name,
                  sizes[i], d);
        }
    test_gemm();
    test_layers();
    test_gpt_ops();
    test_vm();
    CHECK(dt_gpu_sync() == DT_OK, "no error left on the device: %s", dt_last_error());
}

// cuBLASLt, cuDNN and NCCL found at run time: the machine's own where the
// loader finds them (this machine's CUDA toolkit has all three), a user's file (DTRAIN_CUDNN,
// DTRAIN_NCCL), PyTorch's packages under a Python site, and the refusals: a
// missing file, a library that is not the one asked for, another version.
static void test_libs(void) {
    const char *names[] = {"cudnn", "nccl", "cublaslt"}, *sonames[] = {"libcudnn.so.9", "libnccl.so.2", NULL};
    const char *fns[] = {"cudnnGetVersion", "ncclGetVersion", "cublasLtGetVersion"};
    const long lows[] = {90000, 21800, 10000};
    char lt[32];
    snprintf(lt, sizeof lt, "libcublasLt.so.%d", DT_CUDA_MAJOR);
    sonames[2] = lt;
    for (int i = 0; i < 3; i++) {
        void *ref = dlopen(sonames[i], RTLD_NOW | RTLD_LOCAL);  // the loader's own answer, independently
        dt_gpu_lib l;
        dt_status st = dt_gpu_lib_open(names[i], &l);
        if (ref)
            CHECK(st == DT_OK && strstr(l.path, sonames[i]) && l.version >= lows[i] && dt_gpu_lib_sym(&l, fns[i]),
                  "%s on the loader's path: found (%s, version %ld): %s", names[i], l.path, l.version,
                  st ? dt_last_error() : "");
        else
            printf("%s: not on this machine's loader path (%s)\n", names[i], st ? dt_last_error() : l.path);
        printf("%s: %s\n", names[i], st == DT_OK ? l.path : dt_last_error());
        dt_gpu_lib_close(&l);
        if (ref) dlclose(ref);
    }
    dt_gpu_lib l;
    struct { const char *env, *file, *which, *want; } bad[] = {
        {"DTRAIN_CUDNN", "/nonexistent/libcudnn.so.9", "cudnn", "DTRAIN_CUDNN=/nonexistent/libcudnn.so.9: cannot load it"},
        {"DTRAIN_NCCL", FAKE_CUDNN9, "nccl", "no ncclGetVersion: not NCCL"},
        {"DTRAIN_CUDNN", FAKE_CUDNN8, "cudnn", "is version 8.9.2; dtrain needs 9.0 or later, before 10"},
    };
    for (int i = 0; i < 3; i++) {
        setenv(bad[i].env, bad[i].file, 1);
        dt_status st = dt_gpu_lib_open(bad[i].which, &l);
        CHECK(st == DT_ERR_IO && strstr(dt_last_error(), bad[i].want) && !l.handle, "%s=%s refused: %s", bad[i].env,
              bad[i].file, dt_last_error());
        unsetenv(bad[i].env);
    }
    setenv("DTRAIN_CUDNN", FAKE_CUDNN9, 1);
    CHECK(dt_gpu_lib_open("cudnn", &l) == DT_OK && l.version == 90100 && strstr(l.path, "fake_cudnn_90100"),
          "DTRAIN_CUDNN names the file taken: %s", l.path);
    dt_gpu_lib_close(&l);
    unsetenv("DTRAIN_CUDNN");
    CHECK(dt_gpu_lib_open("cublas", &l) == DT_ERR_ARG, "an unknown library is refused: %s", dt_last_error());
}

// DTRAIN_CUDA_SYNC=1: a kernel's fault is named with the kernel, at its
// launch; without it, at the next wait. In a child process each (the
// fault ends the CUDA context): `test_gpu fault-child` reads through a bad
// device pointer.
static int fault_child(void) {
    if (dt_gpu_use(0) != DT_OK) return printf("GPU: %s\n", dt_last_error()), 2;
    float *bad = (float *)(uintptr_t)0x100;
    dt_status st = dt_gpu_residual_forward(bad, bad, bad, 1024);
    if (st == DT_OK) st = dt_gpu_sync();
    printf("status %d: %s\n", (int)st, st == DT_OK ? "no error" : dt_last_error());
    return st == DT_OK ? 0 : 1;
}

static void test_fault(void) {
    char why[512], self[1024];
    if (dt_gpu_count(why, sizeof why) == 0) {
        tl_skip("no GPU to fault on: %s", why);
        return;
    }
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    self[len > 0 ? len : 0] = 0;
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "DTRAIN_CUDA_SYNC=1 %s fault-child", self);
    int rc = tl_run(cmd, g_out, sizeof g_out);
    CHECK(rc == 1 && strstr(g_out, "GPU: residual_forward_kernel (DTRAIN_CUDA_SYNC): an illegal memory access"),
          "DTRAIN_CUDA_SYNC=1: the fault named with its kernel: exit %d\n%s", rc, g_out);
    snprintf(cmd, sizeof cmd, "DTRAIN_CUDA_SYNC=0 %s fault-child", self);
    rc = tl_run(cmd, g_out, sizeof g_out);
    CHECK(rc == 1 && strstr(g_out, "GPU: cudaDeviceSynchronize(): an illegal memory access"),
          "without it: the fault found at the next wait: exit %d\n%s", rc, g_out);
}

// The fused attention's rows on small shapes alone (every column count a
// lane holds, T past a tile, fp32 and bf16, the tensor cores' kernels at
// heads of 64), for compute-sanitizer's
// racecheck and synccheck over its shared memory and barriers, which are
// too slow for the whole table.
static void test_attention_small(void) {
    if (!gpu0("run the attention on")) return;
    test_attention(2, 37, 96, 3, DT_F32);
    test_attention(1, 33, 5, 5, DT_F32);
    test_attention(2, 70, 256, 2, DT_F32);
    test_attention(1, 45, 300, 3, DT_BF16);
    test_attention(1, 70, 128, 2, DT_BF16);  // (the tensor cores')
}

// The attention's forward and backward alone at GPT-2 124M's layer (B 16,
// T 1024, 12 heads of 64), fp32 (the CUDA cores' fused kernels) and bf16
// (the tensor cores'): milliseconds a call, after warm-up, each timed over
// 10 calls ended by a wait; one JSON line (tests/gpu/run.sh's attention
// stage, beside bench/torch_attention.py's PyTorch figures). A benchmark,
// not a check: it asserts nothing but that the calls succeed.
static void bench_attention(void) {
    if (!gpu0("time the attention on")) return;
    const int B = 16, T = 1024, C = 768, NH = 12, reps = 10;
    size_t n3 = (size_t)B * T * 3 * C, n = (size_t)B * T * C;
    float *h = randoms(n3, 2, 7), *gq = upload(h, n3), *gdq = upload(h, n3), *gout = upload(h, n), *gdy = upload(h, n);
    printf("{\"B\": %d, \"T\": %d, \"C\": %d, \"NH\": %d", B, T, C, NH);
    for (int k = 0; k < 2; k++) {
        dt_dtype t = k ? DT_BF16 : DT_F32;
        dt_att_room room = dt_att_room_of(B, T, C, NH, t);
        void *saved = NULL, *scratch = NULL;
        dt_status st = gq && gdq && gout && gdy ? dt_gpu_alloc(&saved, room.saved) : DT_ERR_NOMEM;
        if (st == DT_OK) st = dt_gpu_alloc(&scratch, room.scratch);
        double ms[2] = {0, 0};
        for (int pass = 0; pass < 2 && st == DT_OK; pass++)  // forward, backward
            for (int r = -3; r < reps && st == DT_OK; r++) {
                if (r == 0) st = dt_gpu_sync(), ms[pass] = dt_now();
                if (st != DT_OK) break;
                st = pass ? dt_gpu_attention_backward(gdq, scratch, gdy, gq, gout, saved, NULL, B, T, C, NH, t)
                          : dt_gpu_attention_forward(gout, saved, gq, NULL, B, T, C, NH, t, NULL);
                if (st == DT_OK && r == reps - 1 && (st = dt_gpu_sync()) == DT_OK)
                    ms[pass] = (dt_now() - ms[pass]) * 1e3 / reps;
            }
        CHECK(st == DT_OK, "attention %s at B %d T %d C %d NH %d timed: %s", dt_dtype_name(t), B, T, C, NH,
              st == DT_OK ? "ok" : dt_last_error());
        printf(", \"%s_forward_ms\": %.3f, \"%s_backward_ms\": %.3f", k ? "bf16" : "fp32", ms[0], k ? "bf16" : "fp32",
               ms[1]);
        dt_gpu_free(saved), dt_gpu_free(scratch);
    }
    printf("}\n");
    free(h);
    float *g[] = {gq, gdq, gout, gdy};
    for (int i = 0; i < 4; i++) dt_gpu_free(g[i]);
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);  // each line in the log as it comes (a stage may be stopped at its limit)
    if (argc > 1 && !strcmp(argv[1], "fault-child")) return fault_child();
    if (argc > 1 && !strcmp(argv[1], "fault")) test_fault();
    else if (argc > 1 && !strcmp(argv[1], "ops")) test_ops();
    else if (argc > 1 && !strcmp(argv[1], "attention")) test_attention_small();
    else if (argc > 1 && !strcmp(argv[1], "bench-attention")) bench_attention();
    else test_refusals(), test_libs();
    return tl_finish();
}
