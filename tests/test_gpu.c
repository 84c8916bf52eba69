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
 *                   Reported skipped
 *                   (exit 77, the reason said) where no GPU can be used. */
#include "dtrain/config.h"
#include "dtrain/nn.h"
#include "dtrain/optim.h"
#include "dtrain/train.h"
#include "gpu/gpu.h"
#include "kernels/kernels.h"
#include "testlib.h"

#include <dlfcn.h>
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
    else  // (a GPU: the MLP's device step needs kernels whose CUDA versions are not there yet, named)
        CHECK(st == DT_ERR_CONFIG && strstr(dt_last_error(), "the GPU's bias_forward is not in this dtrain yet"),
              "a GPU: device = cuda refused naming the missing op: %s", dt_last_error());
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

// The CPU's optimizer and the GPU's on the same values for `steps` steps;
// the largest relative difference of the weights and the state.
static double compare(const dt_optim_params *p, size_t n, int steps) {
    dt_optim *o;
    if (dt_optim_create(&o, p, n) != DT_OK) return INFINITY;
    float *w = malloc(sizeof(float) * n), *g = malloc(sizeof(float) * n), *gw = malloc(sizeof(float) * n);
    float *gs0 = malloc(sizeof(float) * n), *gs1 = malloc(sizeof(float) * n);
    void *dw = NULL, *dg = NULL, *d0 = NULL, *d1 = NULL;
    int ns = dt_optim_num_states(o);
    dt_status st = dt_gpu_alloc(&dw, sizeof(float) * n);
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
        float lr = 1e-3f * (float)(s + 1), scale = 0.5f;
        if ((st = dt_gpu_to_device(dg, g, sizeof(float) * n)) != DT_OK) break;
        if (p->kind == DT_OPTIM_ADAMW) {
            dt_adamw_k k = dt_optim_adamw_k(o, lr, scale);
            st = dt_gpu_adamw(dw, dg, d0, d1, n, &k);
        } else {
            dt_sgd_k k = dt_optim_sgd_k(o, lr, scale);
            st = dt_gpu_sgd(dw, dg, d0, n, &k);
        }
        dt_optim_update(o, 0, n, w, g, lr, scale);
    }
    double worst = st == DT_OK ? 0 : INFINITY;
    if (st == DT_OK && (st = dt_gpu_to_host(gw, dw, sizeof(float) * n)) == DT_OK) worst = tl_max_rel(w, gw, n, 1e-6);
    for (int j = 0; j < ns && st == DT_OK; j++) {
        st = dt_gpu_to_host(j ? gs1 : gs0, j ? d1 : d0, sizeof(float) * n);
        double d = st == DT_OK ? tl_max_rel(dt_optim_state(o, j), j ? gs1 : gs0, n, 1e-6) : INFINITY;
        worst = d > worst || isnan(d) ? d : worst;
    }
    if (st != DT_OK) printf("GPU: %s\n", dt_last_error());
    dt_gpu_free(dw), dt_gpu_free(dg), dt_gpu_free(d0), dt_gpu_free(d1);
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

// The GPU's GEMM against dt_sgemm on the same operands: the largest
// |difference| of an element over its sum of |products| (and |beta c|), a
// bound of the rounding error of any order of the sums; INFINITY if the GPU
// failed. off: each operand `off` floats into its block (off 1: aligned to
// 4 bytes only).
static double gemm_case(int ta, int tb, int M, int N, int K, int pad, float beta, int off) {
    int lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
    size_t na = (size_t)(ta ? K : M) * lda, nb = (size_t)(tb ? N : K) * ldb, nc = (size_t)M * ldc;
    float *A = malloc(sizeof(float) * (na + nb + 3 * nc)), *B = A + na, *C = B + nb, *Cc = C + nc, *G = Cc + nc;
    uint64_t x = 0x9e3779b97f4a7c15ull ^ (uint64_t)(M * 131 + N * 7 + K);
    for (size_t i = 0; i < na + nb + nc; i++) A[i] = draw(&x);  // (the padding too: initcheck)
    memcpy(Cc, C, sizeof(float) * nc);
    float *dA = upload_at(A, na, off), *dB = upload_at(B, nb, off), *dC = upload_at(C, nc, off);
    dt_status st = dA && dB && dC ? DT_OK : DT_ERR_INTERNAL;
    if (st == DT_OK) st = dt_gpu_sgemm(ta, tb, M, N, K, 1.0f, dA, lda, dB, ldb, beta, dC, ldc);
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
    free(A);
    return worst;
}

static void test_gemm(void) {
    // (M, N, K, pad): odd and non-square; the GPT's shapes in small (BT = 2
    // x 65 rows, C = 96, 3C, 4C, a vocabulary of 509); strided; K = 0.
    const int shapes[][4] = {{1, 1, 1, 0}, {7, 5, 3, 0}, {3, 130, 17, 5}, {130, 288, 96, 0},
                             {130, 96, 384, 3}, {130, 509, 96, 1}, {255, 257, 33, 0}, {5, 7, 0, 2}};
    for (int tf32 = 0; tf32 < 2; tf32++) {
        dt_gpu_set_tf32(tf32);
        double tol = tf32 ? 4e-3 : 1e-5;
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++)
                for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
                    for (int b = 0; b < 2; b++) {
                        const int *h = shapes[s];
                        int off = (int)(s + b) % 3 == 2;  // some operands aligned to 4 bytes only
                        double d = gemm_case(ta, tb, h[0], h[1], h[2], h[3], (float)b, off);
                        CHECK(d >= 0 && d <= tol, "sgemm%s ta %d tb %d M %d N %d K %d pad %d beta %d offset %d: GPU "
                              "against dt_sgemm, max |diff| / sum |products| %.3g (<= %g)", tf32 ? " tf32" : "", ta,
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
    if (st == DT_OK) st = dt_gpu_layernorm_forward(gout, gmean, grstd, gx, gw, gb, N, C, 1e-5f);
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
    if (st == DT_OK) st = dt_gpu_gelu_forward(gout, gx, n);
    if (st == DT_OK) st = dt_gpu_gelu_backward(gdx, gdout, gx, n);
    dt_gelu_forward(out, x, n);
    dt_gelu_backward(dx, dout, x, n);
    double df = st == DT_OK ? against(out, gout, n, 1e-3) : INFINITY;
    double db = st == DT_OK ? against(dx, gdx, n, 1e-3) : INFINITY;
    CHECK(df <= 1e-5 && db <= 1e-5, "gelu n %zu (x in [-6, 6)): forward %.3g, backward %.3g (<= 1e-5)%s%s", n, df, db,
          st == DT_OK ? "" : ": ", st == DT_OK ? "" : dt_last_error());
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

static void test_layers(void) {
    // Rows B x T with T = 37 (not a multiple of 32); C odd, below, at and
    // above a block of 256; one row of one channel.
    const int Cs[] = {1, 97, 256, 771};
    for (size_t i = 0; i < sizeof Cs / sizeof *Cs; i++) test_layernorm(2 * 37, Cs[i]);
    test_layernorm(1, 771);
    const size_t ns[] = {1, 255, 257, 100003, (1u << 20) + 7};
    for (size_t i = 0; i < sizeof ns / sizeof *ns; i++) test_gelu(ns[i]);
    // GPT-2's vocabulary padded as the GPT pads it (50257 to 50304), a small
    // one padded, one unpadded, one column.
    test_crossentropy(2 * 37, 50257, 50304);
    test_crossentropy(3, 257, 260);
    test_crossentropy(5, 1000, 1000);
    test_crossentropy(4, 1, 1);
}

static void test_ops(void) {
    char why[512], what[200] = "";
    if (dt_gpu_count(why, sizeof why) == 0) {
        tl_skip("no GPU to run the ops on: %s", why);
        return;
    }
    CHECK(dt_gpu_use(0) == DT_OK && dt_gpu_describe(0, what, sizeof what) == DT_OK, "GPU 0: %s", dt_last_error());
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

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "ops")) test_ops();
    else test_refusals(), test_libs();
    return tl_finish();
}
