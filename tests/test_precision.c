/* Mixed precision (docs/mixed-precision.md).
 *
 * Kernels: every GEMM shape the layers use (transposes, row strides, alpha,
 * accumulation) and the convolution's three passes, in bf16 and fp16,
 * against two references computed here in double: the product of the
 * operands rounded to the type, which the kernel must give up to fp32
 * summation (|err| <= K 2^-23 sum|a||b|, with K the terms summed), and the
 * exact fp32 product, from which it may differ by the operands' rounding:
 * each operand is off by at most u = 2^-8 relative in bf16 (an 8-bit
 * significand, round to nearest), 2^-11 in fp16, so a product by at most
 * 2u + u^2, and a sum of products by (2u + u^2) sum|a||b|. The kernel
 * must also differ from fp32 (the rounding happened). Whether oneDNN's own
 * bf16 kernels ran is checked against the CPU's flags, and the same run
 * under DTRAIN_ISA=avx2 (ctest test_precision_avx2) checks the
 * fallback: rounded operands, fp32 compute, the same bounds.
 *
 * Activations kept in 16 bits: the GPT's matmul inputs, and the sequential
 * models' linear inputs and convolutions' saved inputs, with their
 * convolutions' shared scratch and dropped inputs (an MLP and two CNNs,
 * whole and as 2 pipeline stage sets), bitwise against the same models
 * keeping every activation in fp32 in a buffer of its own, with the bytes
 * each saves (a CNN in bf16 or fp16 takes less than in fp32); the shipped
 * configs' figures; an MLP run's start line and summary.json.
 *
 * The loss scaler (GradScaler's rule) and the optimizer's skipped step;
 * then runs: fp16 on 2 workers with an overflow injected on rank 1 only
 * (every rank skips that step, the scale halves, metrics and summary.json
 * say so); bf16 and fp16 runs learn; a checkpoint of a bf16 run resumed in
 * fp32 (fp32 master weights: resumed bitwise from the same values). */
#include "dtrain/ckpt.h"
#include "dtrain/nn.h"
#include "dtrain/optim.h"
#include "dtrain/gpt.h"
#include "kernels/kernels.h"
#include "nn/nn_impl.h"
#include "testlib.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef DTRAIN_HAVE_MPI
#define DTRAIN_MPI_BUILT 1
#else
#define DTRAIN_MPI_BUILT 0
#endif

static char g_tmp[256];
static char g_out[1 << 16];

static float frand(dt_rng *r) { return (float)(dt_rng_uniform(r) * 2.0 - 1.0); }

static double unit(dt_dtype t) { return t == DT_BF16 ? 0x1p-8 : 0x1p-11; }

// Worst error against the two references, each as a fraction of its bound.
typedef struct {
    double vs_rounded, vs_exact, max_diff_fp32;
} errs;

static void account(errs *e, double got, double rounded, double exact, double absprod, int K, dt_dtype t) {
    double b1 = K * 0x1p-23 * absprod + 1e-30, u = unit(t), b2 = (2 * u + u * u) * absprod + b1;
    double r1 = fabs(got - rounded) / b1, r2 = fabs(got - exact) / b2;
    if (r1 > e->vs_rounded) e->vs_rounded = r1;
    if (r2 > e->vs_exact) e->vs_exact = r2;
    if (fabs(got - exact) > e->max_diff_fp32) e->max_diff_fp32 = fabs(got - exact);
}

// C = alpha op(A) op(B) + beta C through dt_sgemm in precision t, against
// double references; A, B stored with row strides lda, ldb > their widths.
static void gemm_case(int ta, int tb, int M, int N, int K, float alpha, float beta, dt_dtype t) {
    int ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
    int lda = ac + 3, ldb = bc + 5, ldc = N + 2;
    dt_rng r;
    dt_rng_seed(&r, (uint64_t)(M * 131 + N * 17 + K + ta * 7 + tb * 3));
    float *A = malloc(sizeof(float) * ar * lda), *B = malloc(sizeof(float) * br * ldb);
    float *C = malloc(sizeof(float) * M * ldc), *C0 = malloc(sizeof(float) * M * ldc);
    float *Ar = malloc(sizeof(float) * ar * lda), *Br = malloc(sizeof(float) * br * ldb);
    for (int i = 0; i < ar * lda; i++) A[i] = frand(&r) * 3.0f;
    for (int i = 0; i < br * ldb; i++) B[i] = frand(&r);
    for (int i = 0; i < M * ldc; i++) C0[i] = C[i] = frand(&r);
    dt_round_f32(Ar, A, (size_t)ar * lda, t);
    dt_round_f32(Br, B, (size_t)br * ldb, t);
    dt_kernels_set_precision(t);
    dt_sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    dt_kernels_set_precision(DT_F32);
    errs e = {0, 0, 0};
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = 0, sr = 0, sa = 0;
            for (int k = 0; k < K; k++) {
                size_t ia = ta ? (size_t)k * lda + i : (size_t)i * lda + k, ib = tb ? (size_t)j * ldb + k : (size_t)k * ldb + j;
                s += (double)A[ia] * B[ib];
                sr += (double)Ar[ia] * Br[ib];
                sa += fabs((double)A[ia] * B[ib]);
            }
            double c0 = beta * C0[(size_t)i * ldc + j];
            account(&e, C[(size_t)i * ldc + j], alpha * sr + c0, alpha * s + c0, fabs(alpha) * sa + fabs(c0), K + 1, t);
        }
    // The padding between rows is left alone.
    int pad_ok = 1;
    for (int i = 0; i < M; i++)
        for (int j = N; j < ldc; j++) pad_ok &= C[(size_t)i * ldc + j] == C0[(size_t)i * ldc + j];
    const char *tn = t == DT_BF16 ? "bf16" : "fp16";
    CHECK(e.vs_rounded <= 1 && e.vs_exact <= 1 && e.max_diff_fp32 > 0 && pad_ok,
          "gemm %s ta=%d tb=%d %dx%dx%d alpha %g beta %g: error / bound against the rounded operands %.3g, "
          "against fp32 %.3g (max |diff| %.3g, > 0), padding kept %d",
          tn, ta, tb, M, N, K, alpha, beta, e.vs_rounded, e.vs_exact, e.max_diff_fp32, pad_ok);
    free(A), free(B), free(C), free(C0), free(Ar), free(Br);
}

// out[b,o,y,x] = sum over (c, ky, kx) of inp[b,c,y*S-P+ky,x*S-P+kx] w[o,c,ky,kx], in double; `absval`
// sums the products' magnitudes instead. Backward is checked through its sums: dinp and dw are
// the same products grouped by input element and by weight.
typedef struct {
    int B, IC, H, W, OC, K, S, P, OH, OW;
} cshape;

static void conv_case(const cshape *s, dt_dtype t) {
    size_t ni = (size_t)s->B * s->IC * s->H * s->W, nw = (size_t)s->OC * s->IC * s->K * s->K,
           no = (size_t)s->B * s->OC * s->OH * s->OW;
    dt_rng r;
    dt_rng_seed(&r, 99 + (uint64_t)t);
    float *x = malloc(4 * ni), *w = malloc(4 * nw), *dy = malloc(4 * no), *xr = malloc(4 * ni), *wr = malloc(4 * nw),
          *dyr = malloc(4 * no), *y = malloc(4 * no), *dx = calloc(ni, 4), *dw = calloc(nw, 4), *db = calloc(s->OC, 4);
    for (size_t i = 0; i < ni; i++) x[i] = frand(&r);
    for (size_t i = 0; i < nw; i++) w[i] = frand(&r) * 0.5f;
    for (size_t i = 0; i < no; i++) dy[i] = frand(&r);
    dt_round_f32(xr, x, ni, t);
    dt_round_f32(wr, w, nw, t);
    dt_round_f32(dyr, dy, no, t);
    dt_kernels_set_precision(t);  // the scratch sizes are the plan's in this precision
    size_t col = dt_conv2d_col_size(s->B, s->IC, s->H, s->W, s->OC, s->K, s->S, s->P);
    float *c1 = malloc(4 * col), *c2 = malloc(4 * col);
    dt_conv2d_forward(y, c1, x, w, NULL, s->B, s->IC, s->H, s->W, s->OC, s->K, s->S, s->P);
    dt_conv2d_backward(dx, dw, db, c2, dy, c1, w, s->B, s->IC, s->H, s->W, s->OC, s->K, s->S, s->P);
    dt_kernels_set_precision(DT_F32);
    double *rx = calloc(ni, 8), *ex = calloc(ni, 8), *ax = calloc(ni, 8), *rw = calloc(nw, 8), *ew = calloc(nw, 8),
           *aw = calloc(nw, 8);
    errs ef = {0, 0, 0}, ed = {0, 0, 0}, eg = {0, 0, 0};
    int terms_x = 0, terms_w = s->B * s->OH * s->OW;
    for (int b = 0; b < s->B; b++)
        for (int o = 0; o < s->OC; o++)
            for (int oy = 0; oy < s->OH; oy++)
                for (int ox = 0; ox < s->OW; ox++) {
                    size_t io = (((size_t)b * s->OC + o) * s->OH + oy) * s->OW + ox;
                    double sum = 0, sr = 0, sa = 0;
                    for (int c = 0; c < s->IC; c++)
                        for (int ky = 0; ky < s->K; ky++)
                            for (int kx = 0; kx < s->K; kx++) {
                                int iy = oy * s->S - s->P + ky, ix = ox * s->S - s->P + kx;
                                if (iy < 0 || ix < 0 || iy >= s->H || ix >= s->W) continue;
                                size_t ii = (((size_t)b * s->IC + c) * s->H + iy) * s->W + ix,
                                       iw = (((size_t)o * s->IC + c) * s->K + ky) * s->K + kx;
                                sum += (double)x[ii] * w[iw];
                                sr += (double)xr[ii] * wr[iw];
                                sa += fabs((double)x[ii] * w[iw]);
                                rx[ii] += (double)dyr[io] * wr[iw];
                                ex[ii] += (double)dy[io] * w[iw];
                                ax[ii] += fabs((double)dy[io] * w[iw]);
                                rw[iw] += (double)dyr[io] * xr[ii];
                                ew[iw] += (double)dy[io] * x[ii];
                                aw[iw] += fabs((double)dy[io] * x[ii]);
                            }
                    account(&ef, y[io], sr, sum, sa, s->IC * s->K * s->K, t);
                }
    terms_x = s->OC * s->K * s->K;
    for (size_t i = 0; i < ni; i++) account(&ed, dx[i], rx[i], ex[i], ax[i], terms_x, t);
    for (size_t i = 0; i < nw; i++) account(&eg, dw[i], rw[i], ew[i], aw[i], terms_w, t);
    const char *tn = t == DT_BF16 ? "bf16" : "fp16";
    CHECK(ef.vs_rounded <= 1 && ef.vs_exact <= 1 && ef.max_diff_fp32 > 0,
          "conv %s %dx%dx%dx%d oc %d k%d s%d p%d forward: error / bound %.3g (rounded), %.3g (fp32), max diff %.3g", tn,
          s->B, s->IC, s->H, s->W, s->OC, s->K, s->S, s->P, ef.vs_rounded, ef.vs_exact, ef.max_diff_fp32);
    CHECK(ed.vs_rounded <= 1 && ed.vs_exact <= 1 && ed.max_diff_fp32 > 0,
          "conv %s backward data: error / bound %.3g (rounded), %.3g (fp32), max diff %.3g", tn, ed.vs_rounded,
          ed.vs_exact, ed.max_diff_fp32);
    CHECK(eg.vs_rounded <= 1 && eg.vs_exact <= 1 && eg.max_diff_fp32 > 0,
          "conv %s backward weights: error / bound %.3g (rounded), %.3g (fp32), max diff %.3g", tn, eg.vs_rounded,
          eg.vs_exact, eg.max_diff_fp32);
    printf("conv %s k%d s%d: forward %.2f, backward data %.2f, weights %.2f of the rounded-operand bound\n", tn, s->K,
           s->S, ef.vs_rounded, ed.vs_rounded, eg.vs_rounded);
    free(x), free(w), free(dy), free(xr), free(wr), free(dyr), free(y), free(dx), free(dw), free(db), free(c1), free(c2);
    free(rx), free(ex), free(ax), free(rw), free(ew), free(aw);
}


// The portable GEMM (the build without oneDNN's) against double sums and
// against dt_sgemm (oneDNN's here): every transpose, strided operands,
// sizes past its panels (K > 256, N > 512), beta 0 over NaN, alpha 0, and
// K = 0 (C = beta C, exactly: 0 over NaN where beta is 0).
static void portable_gemm(void) {
    static const int shapes[][3] = {{1, 1, 1}, {7, 5, 3}, {33, 513, 17}, {64, 40, 300}, {129, 600, 515}, {5, 3, 0}};
    static const float ab[][2] = {{1, 0}, {0.5f, 1}, {-2, 0.25f}, {0, 2}};
    int cases = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
        for (int tt = 0; tt < 4; tt++, cases++) {
            int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2], ta = tt & 1, tb = tt >> 1;
            float alpha = ab[(s + tt) % 4][0], beta = ab[(s + tt) % 4][1];
            int lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 1, ldc = N + 2;
            size_t na = (size_t)(ta ? K : M) * lda, nb = (size_t)(tb ? N : K) * ldb, nc = (size_t)M * ldc;
            float *A = malloc(4 * na), *B = malloc(4 * nb), *C = malloc(4 * nc), *D = malloc(4 * nc);
            dt_rng r;
            dt_rng_seed(&r, 7 + s * 4 + (uint64_t)tt);
            for (size_t i = 0; i < na; i++) A[i] = frand(&r);
            for (size_t i = 0; i < nb; i++) B[i] = frand(&r);
            for (size_t i = 0; i < nc; i++) C[i] = D[i] = beta == 0 && i % 7 == 0 ? NAN : frand(&r);
            float *C0 = malloc(4 * nc);
            memcpy(C0, C, 4 * nc);
            dt_sgemm_portable(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
            dt_sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, D, ldc);
            double worst = 0, worst_dnn = 0;
            int pad = 1;
            for (int i = 0; i < M; i++) {
                for (int j = 0; j < N; j++) {
                    double e = 0, mag = 0;
                    for (int k = 0; k < K; k++) {
                        double p = (double)A[ta ? (size_t)k * lda + i : (size_t)i * lda + k] *
                                   B[tb ? (size_t)j * ldb + k : (size_t)k * ldb + j];
                        e += p, mag += fabs(p);
                    }
                    double c0 = beta == 0 ? 0 : beta * (double)C0[(size_t)i * ldc + j];
                    double want = alpha * e + c0, bound = (K + 2) * 0x1p-23 * (fabs(alpha) * mag + fabs(c0)) + 1e-30;
                    double got = C[(size_t)i * ldc + j];
                    worst = fmax(worst, isfinite(got) ? fabs(got - want) / bound : INFINITY);
                    worst_dnn = fmax(worst_dnn, fabs(D[(size_t)i * ldc + j] - want) / bound);
                }
                for (int j = N; j < ldc; j++) pad &= memcmp(&C[(size_t)i * ldc + j], &C0[(size_t)i * ldc + j], 4) == 0;
            }
            CHECK(worst <= 1 && worst_dnn <= 1 && pad,
                  "portable gemm ta=%d tb=%d %dx%dx%d alpha %g beta %g: error / fp32 bound %.3g (dt_sgemm's %.3g), "
                  "padding kept %d", ta, tb, M, N, K, alpha, beta, worst, worst_dnn, pad);
            free(A), free(B), free(C), free(D), free(C0);
        }
    printf("portable gemm: %d cases against double sums and dt_sgemm\n", cases);
}

static void kernels(void) {
    // /proc/cpuinfo's flags, not cpuid's (dt_cpu_get), as the independent reference
    char *info = tl_read_file("/proc/cpuinfo", NULL);
    int has = info && strstr(info, " avx512_bf16");
    free(info);
    const dt_cpu *cpu = dt_cpu_get();
    int expect = has && cpu->isa >= DT_ISA_AVX512_BF16;
#ifndef DTRAIN_HAVE_ONEDNN
    expect = 0;  // the portable GEMM: fp32 compute in every precision
#endif
    CHECK(dt_kernels_native(DT_BF16) == expect, "oneDNN's bf16 kernels %s here (CPU avx512_bf16 %d, used: %s)",
          dt_kernels_native(DT_BF16) ? "run" : "do not run", has, dt_isa_name(cpu->isa));
    CHECK(!dt_kernels_native(DT_F16) && !dt_kernels_native(DT_F32), "fp16 and fp32 are never 'native' low precision");
    CHECK(dt_kernels_set_precision(DT_I32) == DT_ERR_ARG && dt_kernels_precision() == DT_F32,
          "an integer precision is refused");
    printf("bf16: %s\nfp16: %s\n", dt_kernels_describe(DT_BF16), dt_kernels_describe(DT_F16));
    dt_dtype ts[2] = {DT_BF16, DT_F16};
    for (int k = 0; k < 2; k++) {
        gemm_case(0, 1, 37, 29, 61, 1.0f, 0.0f, ts[k]);   // linear forward
        gemm_case(0, 0, 37, 61, 29, 1.0f, 1.0f, ts[k]);   // linear backward, input
        gemm_case(1, 0, 29, 61, 37, 1.0f, 1.0f, ts[k]);   // linear backward, weights
        gemm_case(0, 1, 64, 64, 16, 0.25f, 0.0f, ts[k]);  // attention scores
        gemm_case(1, 1, 8, 5, 300, -0.5f, 2.0f, ts[k]);
        cshape a = {2, 3, 9, 9, 5, 3, 1, 1, 9, 9}, b = {3, 4, 10, 10, 6, 5, 2, 2, 5, 5};
        conv_case(&a, ts[k]);
        conv_case(&b, ts[k]);
    }
}

// ----------------------------------------------------------------------------
// the loss scaler and the skipped step

static void scaler(void) {
    dt_loss_scaler s = dt_loss_scaler_default();
    CHECK(s.scale == 65536.0f && s.growth_interval == 2000, "initial scale 2^16, growth after 2000 clean steps");
    int taken = 0;
    for (int i = 0; i < 1999; i++) taken += dt_loss_scaler_update(&s, 0);
    CHECK(taken == 1999 && s.scale == 65536.0f, "1999 clean steps: taken, scale %g", s.scale);
    taken = dt_loss_scaler_update(&s, 0);
    CHECK(taken && s.scale == 131072.0f && s.clean == 0, "the 2000th doubles it: %g", s.scale);
    taken = dt_loss_scaler_update(&s, 1);
    CHECK(!taken && s.scale == 65536.0f && s.skipped == 1 && s.clean == 0, "an overflow: skipped, halved to %g", s.scale);
    for (int i = 0; i < 1999; i++) dt_loss_scaler_update(&s, 0);
    dt_loss_scaler_update(&s, 1);
    CHECK(s.scale == 32768.0f && s.skipped == 2, "an overflow after 1999 clean steps resets the count: %g", s.scale);

    dt_optim_params p = dt_optim_default_params(DT_OPTIM_ADAMW);
    dt_optim *o;
    float w[4] = {1, 2, 3, 4}, g[4] = {0.1f, -0.2f, INFINITY, 0.4f}, w0[4];
    memcpy(w0, w, sizeof w);
    CHECK(dt_optim_create(&o, &p, 4) == DT_OK, "adamw");
    dt_optim_set_skip(o, 1);
    dt_optim_step(o, w, g, 0.1f, 1.0f);
    CHECK(!memcmp(w, w0, sizeof w) && *dt_optim_step_count(o) == 0 && dt_optim_state(o, 0)[0] == 0 &&
              dt_optim_state(o, 1)[0] == 0,
          "a skipped step changes no parameter, no state, no step count");
    dt_optim_set_skip(o, 0);
    g[2] = 0.3f;
    dt_optim_step(o, w, g, 0.1f, 1.0f);
    CHECK(*dt_optim_step_count(o) == 1 && w[0] < 1, "the next step is taken (step 1)");
    dt_optim_free(o);
}

// ----------------------------------------------------------------------------
// the weights' working copy (kernels.h)

// One forward and backward of a model (MLP with a convolution, or GPT) in
// precision t: loss and gradients into *loss, g.
typedef struct {
    dt_model *m;
    dt_gpt *gpt;
    float *x;
    int32_t *y;
} wc_net;

static void wc_pass(wc_net *n, float *loss, float *g) {
    if (n->m) {
        dt_model_zero_grad(n->m);
        CHECK(dt_model_forward(n->m, n->x, n->y, 8, 1, loss) == DT_OK && dt_model_backward(n->m) == DT_OK, "model pass");
        memcpy(g, dt_model_grads(n->m), dt_model_num_params(n->m) * 4);
    } else {
        dt_gpt_zero_grad(n->gpt);
        CHECK(dt_gpt_forward(n->gpt, n->y, n->y + 16, 2, 8, loss) == DT_OK && dt_gpt_backward(n->gpt) == DT_OK,
              "gpt pass");
        memcpy(g, dt_gpt_grads(n->gpt), dt_gpt_num_params(n->gpt) * 4);
    }
}

// The nearest bf16 to the fp32 bits u, ties to even, worked out in double
// from the two candidates (a NaN: quiet, sign and upper payload kept): the
// reference for dt_from_f32, whichever loop this CPU (and DTRAIN_ISA) runs.
static uint16_t bf16_ref(uint32_t u) {
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)(u >> 16 | 0x40);
    if ((u & 0x7fffffffu) == 0x7f800000u) return (uint16_t)(u >> 16);  // infinity
    uint32_t lo = u & 0xffff0000u, hi = lo + 0x10000u;
    if ((lo & 0x7fffffffu) == 0x7f7f0000u) return (uint16_t)((u & 0xffffu) >= 0x8000u ? hi >> 16 : lo >> 16);  // overflow
    float x, a, b;
    memcpy(&x, &u, 4), memcpy(&a, &lo, 4), memcpy(&b, &hi, 4);
    double da = fabs((double)x - a), db = fabs((double)b - x);
    if (da < db || (da == db && !(lo >> 16 & 1))) return (uint16_t)(lo >> 16);
    return (uint16_t)(hi >> 16);
}

// dt_from_f32 to bf16 on lengths 0..80 and 1000 at every offset mod 16 (the
// vector loops' tails), over ties, subnormals, the largest finite values,
// infinities and NaNs as well as random bits.
static void conversions(void) {
    enum { N = 1096 };
    static uint32_t u[N];
    static uint16_t got[N];
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < N; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        uint32_t r = (uint32_t)x, special[] = {0, 0x80000000u, 0x3f808000u, 0x3f818000u, 0x00000001u, 0x807fffffu,
                                              0x7f7f8000u, 0x7f7fffffu, 0xff7f8000u, 0x7f800000u, 0xff800000u,
                                              0x7f800001u, 0xffc12345u, 0x7fa00000u, 0x3f80ffffu, 0x00008000u};
        u[i] = i % 3 ? r : special[(i / 3) % 16];
        if (i % 5 == 1) u[i] = (r & 0x807fffffu);                // subnormals
        if (i % 7 == 2) u[i] = (r & 0xffff0000u) | 0x8000u;      // ties
    }
    int bad = 0, len[] = {0, 1, 7, 15, 16, 17, 31, 32, 33, 47, 63, 64, 65, 80, 1000};
    for (int k = 0; k < (int)(sizeof len / sizeof *len); k++)
        for (int off = 0; off < 16; off++) {
            dt_from_f32(got, (const float *)u + off, (size_t)len[k], DT_BF16);
            for (int i = 0; i < len[k]; i++) bad += got[i] != bf16_ref(u[off + i]);
        }
    const dt_cpu *cpu = dt_cpu_get();
    CHECK(bad == 0, "dt_from_f32 to bf16 (%s loop): %d of the converted elements differ from round-to-nearest-even",
          cpu->isa >= DT_ISA_AVX512 ? "AVX-512" : "AVX2", bad);
}

// With the copy the GEMMs give the same bits as rounding at every call; a
// weight matrix is converted once until the weights change, then read from
// the copy by the backward's GEMM that needs it (the saved conversion).
static void working_copy(void) {
    dt_layer_spec mlp[] = {{DT_LAYER_CONV2D, 4, 3, 1, 1, 0, 0, 0, 0}, {DT_LAYER_RELU, 0, 0, 0, 0, 0, 0, 0, 0},
                           {DT_LAYER_FLATTEN, 0, 0, 0, 0, 0, 0, 0, 0}, {DT_LAYER_LINEAR, 32, 0, 0, 0, 0, 0, 0, 0},
                           {DT_LAYER_GELU, 0, 0, 0, 0, 0, 0, 0, 0},    {DT_LAYER_LINEAR, 10, 0, 0, 0, 0, 0, 0, 0}};
    int shape[3] = {1, 6, 6};
    dt_gpt_config gc = {.n_layer = 2, .n_head = 2, .n_embd = 32, .block_size = 8, .vocab_size = 40, .padded_vocab_size = 48};
    const char *names[2] = {"conv+MLP", "GPT"};
    dt_dtype ts[2] = {DT_BF16, DT_F16};
    for (int ti = 0; ti < 2; ti++)
        for (int k = 0; k < 2; k++) {
            // The models are made in the precision they run in (a
            // convolution's buffers are sized for it).
            dt_kernels_set_precision(ts[ti]);
            dt_rng r;
            dt_rng_seed(&r, 11);
            wc_net nn = {0}, *n = &nn;
            if (k == 0) {
                CHECK(dt_model_create(&n->m, shape, mlp, 6, 8) == DT_OK, "model: %s", dt_last_error());
                dt_model_init(n->m, 5);
                n->x = malloc(8 * 36 * 4);
                n->y = malloc(8 * 4);
                for (int i = 0; i < 8 * 36; i++) n->x[i] = frand(&r);
                for (int i = 0; i < 8; i++) n->y[i] = (int32_t)dt_rng_below(&r, 10);
            } else {
                CHECK(dt_gpt_create(&n->gpt, &gc, 2, 8) == DT_OK && dt_gpt_init(n->gpt, 5) == DT_OK, "gpt: %s",
                      dt_last_error());
                n->y = malloc(32 * 4);
                for (int i = 0; i < 32; i++) n->y[i] = (int32_t)dt_rng_below(&r, 40);
            }
            float *w = n->m ? dt_model_params(n->m) : dt_gpt_params(n->gpt);
            size_t np = n->m ? dt_model_num_params(n->m) : dt_gpt_num_params(n->gpt);
            float *g0 = malloc(np * 4), *g1 = malloc(np * 4), *g2 = malloc(np * 4), l0, l1, l2;
            wc_pass(n, &l0, g0);  // rounded at every call
            CHECK(dt_kernels_set_weights(w, np) == DT_OK, "set weights");
            dt_kernels_weights_changed();
            wc_pass(n, &l1, g1);
            dt_kernels_wstats a, b, c;
            dt_kernels_weights_stats(&a);
            wc_pass(n, &l2, g2);  // no change: nothing converted
            dt_kernels_weights_stats(&b);
            const char *tn = ts[ti] == DT_BF16 ? "bf16" : "fp16";
            CHECK(l0 == l1 && l1 == l2 && !memcmp(g0, g1, np * 4) && !memcmp(g0, g2, np * 4),
                  "%s %s: loss and gradients with the weights' copy bitwise those rounded at every call", names[k], tn);
            CHECK(a.bytes == np * 2 && a.converted > 0 && a.converted < np && a.reused > 0 && b.converted == a.converted &&
                      b.reused == 2 * a.reused + a.converted,
                  "%s %s: %llu weight elements converted in the first pass, %llu read again unconverted; the second "
                  "pass converts none (%llu, %llu)", names[k], tn, a.converted, a.reused, b.converted, b.reused);
            // An update: the next pass must see it (converted again).
            for (size_t i = 0; i < np; i++) w[i] -= 0.01f * g0[i];
            dt_kernels_weights_changed();
            wc_pass(n, &l1, g1);
            dt_kernels_weights_stats(&c);
            CHECK(dt_kernels_set_weights(NULL, 0) == DT_OK, "unset");
            wc_pass(n, &l0, g0);
            CHECK(l0 == l1 && !memcmp(g0, g1, np * 4) && c.converted == 2 * a.converted,
                  "%s %s: after an update the copy is converted again (%llu) and equals rounding at every call",
                  names[k], tn, c.converted);
            printf("weights' working copy, %s %s: %zu bytes; a pass converts %llu weight elements once and reads "
                   "%llu again without converting\n", names[k], tn, (size_t)a.bytes, a.converted, a.reused);
            free(g0), free(g1), free(g2);
            dt_model_free(n->m);
            dt_gpt_free(n->gpt);
            free(n->x), free(n->y);
        }
    dt_kernels_set_precision(DT_F32);
}

// ----------------------------------------------------------------------------
// the GPT's matmul inputs kept in 16 bits

// One GPT pass: loss and gradients.
static dt_status gpt_pass(dt_gpt *m, const int32_t *tok, float *loss, float *g) {
    dt_gpt_zero_grad(m);
    dt_status st = dt_gpt_forward(m, tok, tok + 32, 4, 8, loss);
    if (st == DT_OK) st = dt_gpt_backward(m);
    if (st == DT_OK) memcpy(g, dt_gpt_grads(m), dt_gpt_num_params(m) * 4);
    return st;
}

// The saved bytes the 16-bit parts should give: each of the four parts of
// L x B x T x (C, C, C, 4C) elements in 2 bytes instead of 4 (each part's
// room rounded up to 64 bytes, as the set lays them out).
static size_t want_saved(size_t L, size_t BT, size_t C) {
    size_t parts[4] = {L * BT * C, L * BT * C, L * BT * C, L * BT * 4 * C}, saved = 0;
    for (int i = 0; i < 4; i++) saved += ((parts[i] + 15) / 16 * 16 - ((parts[i] + 1) / 2 + 15) / 16 * 16) * 4;
    return saved;
}

static void gpt_acts16(void) {
    dt_gpt_config gc = {.n_layer = 2, .n_head = 2, .n_embd = 32, .block_size = 8, .vocab_size = 40, .padded_vocab_size = 48};
    dt_rng r;
    dt_rng_seed(&r, 12);
    int32_t tok[64];
    for (int i = 0; i < 64; i++) tok[i] = (int32_t)dt_rng_below(&r, 40);
    dt_dtype ts[2] = {DT_BF16, DT_F16};
    for (int ti = 0; ti < 2; ti++) {
        const char *tn = ts[ti] == DT_BF16 ? "bf16" : "fp16";
        dt_gpt *m16 = NULL, *m32 = NULL;
        dt_kernels_set_precision(ts[ti]);  // m16's set keeps its matmul inputs in 16 bits
        CHECK(dt_gpt_create(&m16, &gc, 4, 8) == DT_OK && dt_gpt_init(m16, 9) == DT_OK, "gpt: %s", dt_last_error());
        dt_kernels_set_precision(DT_F32);  // m32's keeps them in fp32
        CHECK(dt_gpt_create(&m32, &gc, 4, 8) == DT_OK && dt_gpt_init(m32, 9) == DT_OK, "gpt: %s", dt_last_error());
        size_t np = dt_gpt_num_params(m16), saved = dt_gpt_acts_saved(dt_gpt_default_acts(m16));
        size_t b16 = dt_gpt_acts_bytes(dt_gpt_default_acts(m16)), b32 = dt_gpt_acts_bytes(dt_gpt_default_acts(m32));
        CHECK(saved == want_saved(2, 32, 32) && b32 - b16 == saved && dt_gpt_acts_saved(dt_gpt_default_acts(m32)) == 0,
              "%s: the set keeps 4 matmul inputs in 2 bytes: %zu of %zu bytes saved (want %zu)", tn, saved, b32,
              want_saved(2, 32, 32));
        float *g16 = malloc(np * 4), *g32 = malloc(np * 4), *gf = malloc(np * 4), l16, l32, lf;
        // Run in fp32, the fp32 set is the reference; a 16-bit set refuses it.
        CHECK(gpt_pass(m32, tok, &lf, gf) == DT_OK, "fp32 pass");
        dt_status st = gpt_pass(m16, tok, &l16, g16);
        CHECK(st == DT_ERR_ARG && strstr(dt_last_error(), "make the set in the precision it runs in"),
              "%s set run in fp32 is refused: %s", tn, dt_last_error());
        dt_kernels_set_precision(ts[ti]);
        CHECK(gpt_pass(m16, tok, &l16, g16) == DT_OK && gpt_pass(m32, tok, &l32, g32) == DT_OK, "%s passes", tn);
        // The GEMMs round these inputs anyway: the same bits as fp32 storage.
        CHECK(l16 == l32 && !memcmp(g16, g32, np * 4),
              "%s: loss and gradients with the matmul inputs kept in %s bitwise those kept in fp32 (loss %.9g, %.9g)",
              tn, tn, l16, l32);
        // And against fp32 compute, within the operands' rounding.
        double gmax = 0, gdiff = 0;
        for (size_t i = 0; i < np; i++) {
            gmax = fmax(gmax, fabs(gf[i]));
            gdiff = fmax(gdiff, fabs(g16[i] - gf[i]));
        }
        double lrel = fabs(l16 - lf) / fabs(lf);
        CHECK(lrel < (ts[ti] == DT_BF16 ? 4e-3 : 1e-3) && gdiff / gmax < (ts[ti] == DT_BF16 ? 5e-2 : 1e-2) && gdiff > 0,
              "%s against fp32: loss %.3g relative, gradients %.3g of the largest", tn, lrel, gdiff / gmax);
        printf("GPT matmul inputs in %s: %zu of %zu activation bytes saved; against fp32 loss %.2g, gradients %.2g\n", tn,
               saved, b32, lrel, gdiff / gmax);
        free(g16), free(g32), free(gf);
        dt_gpt_free(m16);
        dt_gpt_free(m32);
    }
    // What it saves at sizes that matter (no allocation).
    dt_gpt_config g124;
    CHECK(dt_gpt_preset("gpt2-124m", &g124) == DT_OK, "preset");
    g124.block_size = 1024;
    dt_gpt_acts_params ap = dt_gpt_acts_whole(&g124, 8, 1024);
    dt_kernels_set_precision(DT_F32);
    size_t f32 = dt_gpt_acts_size(&g124, &ap);
    dt_kernels_set_precision(DT_BF16);
    size_t bf = dt_gpt_acts_size(&g124, &ap);
    dt_kernels_set_precision(DT_F32);
    CHECK(f32 - bf == want_saved(12, 8 * 1024, 768), "gpt2-124m B=8 T=1024: %zu saved", f32 - bf);
    printf("gpt2-124m B=8 T=1024 activation set: %.0f MiB in fp32, %.0f MiB in bf16 (%.1f%% saved)\n",
           f32 / 1048576.0, bf / 1048576.0, 100.0 * (f32 - bf) / f32);
}

// ----------------------------------------------------------------------------
// the sequential models' linear inputs kept in 16 bits

// An MLP with each kind of layer before a linear one (flatten, dropout,
// layernorm, gelu, linear: their outputs kept in 16 bits) and a relu and a
// layernorm read by their backward (fp32); a CNN like configs/fashion-cnn.ini.
static const dt_layer_spec seq_mlp[] = {
    {DT_LAYER_FLATTEN, 0, 0, 0, 0, 0, 0, 0, 0}, {DT_LAYER_LINEAR, 48, 0, 0, 0, 0, 0, 0, 0}, {DT_LAYER_RELU, 0, 0, 0, 0, 0, 0, 0, 0},
    {DT_LAYER_DROPOUT, 0, 0, 0, 0, 0.25f, 0, 0, 0}, {DT_LAYER_LINEAR, 40, 0, 0, 0, 0, 0, 0, 0},
    {DT_LAYER_LAYERNORM, 0, 0, 0, 0, 0, 0, 0, 0}, {DT_LAYER_LINEAR, 32, 0, 0, 0, 0, 0, 0, 0}, {DT_LAYER_GELU, 0, 0, 0, 0, 0, 0, 0, 0},
    {DT_LAYER_LINEAR, 24, 0, 0, 0, 0, 0, 0, 0}, {DT_LAYER_LINEAR, 10, 0, 0, 0, 0, 0, 0, 0}};
static const dt_layer_spec seq_cnn[] = {
    {DT_LAYER_CONV2D, 8, 3, 1, 1, 0, 0, 0, 0}, {DT_LAYER_RELU, 0, 0, 0, 0, 0, 0, 0, 0}, {DT_LAYER_MAXPOOL, 0, 2, 0, 0, 0, 0, 0, 0},
    {DT_LAYER_CONV2D, 16, 3, 1, 1, 0, 0, 0, 0}, {DT_LAYER_RELU, 0, 0, 0, 0, 0, 0, 0, 0}, {DT_LAYER_MAXPOOL, 0, 2, 0, 0, 0, 0, 0, 0},
    {DT_LAYER_FLATTEN, 0, 0, 0, 0, 0, 0, 0, 0}, {DT_LAYER_LINEAR, 32, 0, 0, 0, 0, 0, 0, 0}, {DT_LAYER_RELU, 0, 0, 0, 0, 0, 0, 0, 0},
    {DT_LAYER_DROPOUT, 0, 0, 0, 0, 0.4f, 0, 0, 0}, {DT_LAYER_LINEAR, 10, 0, 0, 0, 0, 0, 0, 0}};
// A convolution read by a convolution (its output lives in its gradient
// buffer), one whose fused relu is a stage's output stream, one before a
// gelu (its output buffer the room of its backward), strides and no padding.
static const dt_layer_spec seq_cnn2[] = {
    {DT_LAYER_CONV2D, 8, 3, 1, 1, 0, 0, 0, 0}, {DT_LAYER_CONV2D, 12, 3, 2, 1, 0, 0, 0, 0}, {DT_LAYER_RELU, 0, 0, 0, 0, 0, 0, 0, 0},
    {DT_LAYER_CONV2D, 16, 3, 1, 0, 0, 0, 0, 0}, {DT_LAYER_GELU, 0, 0, 0, 0, 0, 0, 0, 0}, {DT_LAYER_MAXPOOL, 0, 2, 0, 0, 0, 0, 0, 0},
    {DT_LAYER_FLATTEN, 0, 0, 0, 0, 0, 0, 0, 0}, {DT_LAYER_LINEAR, 10, 0, 0, 0, 0, 0, 0, 0}};

typedef struct {
    const char *name;
    const dt_layer_spec *layers;
    int nlayers, shape[3];
    size_t half_width;  // the floats a sample of the outputs kept in 16 bits
    int cut;            // a 2-stage pipeline's split: [0, cut), [cut, nlayers)
    size_t half0, half1;  // of them, each stage's (the stream at the cut stays fp32)
} seq_net;

#define SEQ_B 12

// Three SGD steps with dropout on: the whole model, or (a0, a1) the model
// cut in two stages; *loss the last step's loss; the weights end in m.
static dt_status seq_steps(dt_model *m, dt_model_acts *a0, dt_model_acts *a1, const float *x, const int32_t *y,
                           int cut, float *loss, float *g1) {
    size_t np = dt_model_num_params(m);
    for (int step = 0; step < 3; step++) {
        dt_model_zero_grad(m);
        dt_model_set_dropout_key(m, (uint64_t)step, 0);
        dt_status st;
        if (!a0) {
            st = dt_model_forward(m, x, y, SEQ_B, 1, loss);
            if (st == DT_OK) st = dt_model_backward(m);
        } else {
            float *din;
            st = dt_model_forward_range(m, a0, x, NULL, SEQ_B, 1, NULL);
            if (st == DT_OK) {
                memcpy(dt_model_acts_input(a1), dt_model_acts_output(a0),
                       sizeof(float) * SEQ_B * dt_model_stream_size(m, cut));
                st = dt_model_forward_range(m, a1, NULL, y, SEQ_B, 1, loss);
            }
            if (st == DT_OK) st = dt_model_backward_range(m, a1, NULL, &din);
            if (st == DT_OK) st = dt_model_backward_range(m, a0, din, NULL);
        }
        if (st != DT_OK) return st;
        float *w = dt_model_params(m), *g = dt_model_grads(m);
        if (step == 0 && g1) memcpy(g1, g, np * 4);
        for (size_t i = 0; i < np; i++) w[i] -= 0.05f * g[i];
    }
    return DT_OK;
}

static void seq_acts16(void) {
    seq_net nets[3] = {{"MLP", seq_mlp, 10, {1, 8, 8}, 64 + 48 + 40 + 32 + 24, 4, 64, 40 + 32 + 24},
                       {"CNN", seq_cnn, 11, {1, 12, 12}, 16 * 3 * 3 + 32, 7, 0, 32},
                       {"CNN (conv -> conv)", seq_cnn2, 8, {1, 12, 12}, 64, 3, 0, 64}};
    dt_dtype ts[2] = {DT_BF16, DT_F16};
    for (int k = 0; k < 3; k++)
        for (int ti = 0; ti < 2; ti++) {
            const seq_net *n = &nets[k];
            dt_dtype t = ts[ti];
            const char *tn = t == DT_BF16 ? "bf16" : "fp16";
            dt_rng r;
            dt_rng_seed(&r, 21);
            int in = n->shape[0] * n->shape[1] * n->shape[2];
            float *x = malloc(sizeof(float) * SEQ_B * in);
            int32_t y[SEQ_B];
            for (int i = 0; i < SEQ_B * in; i++) x[i] = frand(&r);
            for (int i = 0; i < SEQ_B; i++) y[i] = (int32_t)dt_rng_below(&r, 10);
            // m16 (and the pipeline's mp) made in t keep the linear inputs
            // and the convolutions' saved inputs in 16 bits, a
            // convolution's input in its gradient buffer; m32, made in t
            // with that off, keeps them in fp32 and in buffers of their own
            // (its convolutions' other buffers sized for t); mf runs fp32.
            dt_model *m16 = NULL, *m32 = NULL, *mp = NULL, *mf = NULL;
            dt_model_acts *a0 = NULL, *a1 = NULL, *f0 = NULL, *f1 = NULL;
            size_t mem16, mem32, memf, np;
            dt_kernels_set_precision(t);
            CHECK(dt_model_create(&m16, n->shape, n->layers, n->nlayers, SEQ_B) == DT_OK &&
                      dt_model_create(&mp, n->shape, n->layers, n->nlayers, SEQ_B) == DT_OK &&
                      dt_model_acts_create(&a0, mp, 0, n->cut, SEQ_B) == DT_OK &&
                      dt_model_acts_create(&a1, mp, n->cut, n->nlayers, SEQ_B) == DT_OK &&
                      dt_model_memory(n->shape, n->layers, n->nlayers, SEQ_B, &np, &mem16) == DT_OK,
                  "%s %s: %s", n->name, tn, dt_last_error());
            dt_model_set_acts16(0);
            CHECK(dt_model_create(&m32, n->shape, n->layers, n->nlayers, SEQ_B) == DT_OK &&
                      dt_model_acts_create(&f0, m32, 0, n->cut, SEQ_B) == DT_OK &&
                      dt_model_acts_create(&f1, m32, n->cut, n->nlayers, SEQ_B) == DT_OK &&
                      dt_model_memory(n->shape, n->layers, n->nlayers, SEQ_B, &np, &mem32) == DT_OK,
                  "%s %s, fp32 activations: %s", n->name, tn, dt_last_error());
            dt_model_set_acts16(1);
            dt_kernels_set_precision(DT_F32);
            CHECK(dt_model_create(&mf, n->shape, n->layers, n->nlayers, SEQ_B) == DT_OK &&
                      dt_model_memory(n->shape, n->layers, n->nlayers, SEQ_B, &np, &memf) == DT_OK,
                  "%s fp32: %s", n->name, dt_last_error());
            if (!m16 || !m32 || !mp || !mf || !a0 || !a1 || !f0 || !f1) return;
            dt_model_init(m16, 4), dt_model_init(m32, 4), dt_model_init(mp, 4), dt_model_init(mf, 4);
            np = dt_model_num_params(m16);

            // The bytes: 2 bytes an element of the 16-bit linear inputs, the
            // rest as in fp32 for the MLP; less again for the CNNs, and less
            // than in fp32 (their convolutions' saved inputs in 16 bits).
            size_t s16, s32, b16 = dt_model_act_bytes(m16, &s16), b32 = dt_model_act_bytes(m32, &s32);
            size_t want = 2 * SEQ_B * n->half_width, bf = dt_model_act_bytes(mf, NULL);
            CHECK(s16 == want && s32 == 0 && (k == 0 ? b32 - b16 == want : b32 - b16 > want) && b16 == mem16 &&
                      b32 == mem32 && bf == memf && b16 < bf,
                  "%s %s: %zu of %zu activation bytes saved (want %zu), %zu in all, fp32 %zu; dt_model_memory %zu, %zu, %zu",
                  n->name, tn, s16, b32, want, b32 - b16, bf, mem16, mem32, memf);
            size_t p0, p1, q0, q1, sb0 = dt_model_acts_bytes(a0, &p0), sb1 = dt_model_acts_bytes(a1, &p1);
            size_t fb0 = dt_model_acts_bytes(f0, &q0), fb1 = dt_model_acts_bytes(f1, &q1);
            CHECK(p0 == 2 * SEQ_B * n->half0 && p1 == 2 * SEQ_B * n->half1 && q0 == 0 && q1 == 0 &&
                      (k == 0 ? fb0 - sb0 == p0 && fb1 - sb1 == p1 : fb0 - sb0 >= p0 && fb1 - sb1 >= p1),
                  "%s %s: the 2 stages' sets save %zu and %zu bytes (want %zu, %zu; the stream at layer %d stays fp32)",
                  n->name, tn, p0, p1, 2 * SEQ_B * n->half0, 2 * SEQ_B * n->half1, n->cut);

            // A model with 16-bit activations refuses to run in fp32.
            float l16, l32, lp, lf;
            dt_status st = dt_model_forward(m16, x, y, SEQ_B, 1, &l16);
            CHECK(st == DT_ERR_ARG && strstr(dt_last_error(), "make the model or set in the precision it runs in"),
                  "%s %s model run in fp32 is refused: %s", n->name, tn, dt_last_error());
            st = dt_model_forward_range(mp, a1, NULL, y, SEQ_B, 1, &l16);
            CHECK(st == DT_ERR_ARG && strstr(dt_last_error(), "make the model or set in the precision it runs in"),
                  "%s %s stage run in fp32 is refused: %s", n->name, tn, dt_last_error());
            // fp32 compute, for the comparison below.
            float *gf = malloc(np * 4), *g16 = malloc(np * 4), *g32 = malloc(np * 4);
            CHECK(seq_steps(mf, NULL, NULL, x, y, 0, &lf, gf) == DT_OK, "fp32 steps: %s", dt_last_error());

            dt_kernels_set_precision(t);
            CHECK(seq_steps(m16, NULL, NULL, x, y, 0, &l16, g16) == DT_OK &&
                      seq_steps(m32, NULL, NULL, x, y, 0, &l32, g32) == DT_OK &&
                      seq_steps(mp, a0, a1, x, y, n->cut, &lp, NULL) == DT_OK,
                  "%s %s steps: %s", n->name, tn, dt_last_error());
            dt_kernels_set_precision(DT_F32);
            // The linear layers round these inputs anyway: the same bits as fp32 storage.
            CHECK(l16 == l32 && !memcmp(g16, g32, np * 4) && !memcmp(dt_model_params(m16), dt_model_params(m32), np * 4),
                  "%s %s: 3 steps with the linear inputs kept in %s: loss, first gradients and final weights bitwise "
                  "those kept in fp32 (loss %.9g, %.9g)", n->name, tn, tn, l16, l32);
            CHECK(lp == l32 && !memcmp(dt_model_params(mp), dt_model_params(m32), np * 4),
                  "%s %s: 2 stages (cut at layer %d) with 16-bit sets: loss and final weights bitwise the whole model's "
                  "kept in fp32 (loss %.9g, %.9g)", n->name, tn, n->cut, lp, l32);
            double gmax = 0, gdiff = 0;
            for (size_t i = 0; i < np; i++) {
                gmax = fmax(gmax, fabs(gf[i]));
                gdiff = fmax(gdiff, fabs(g16[i] - gf[i]));
            }
            CHECK(gdiff > 0 && gdiff / gmax < (t == DT_BF16 ? 5e-2 : 1e-2),
                  "%s %s: the first gradients differ from fp32 compute (%.3g of the largest): the run computed in %s",
                  n->name, tn, gdiff / gmax, tn);
            printf("%s in %s: activations %zu bytes at batch %d (%zu with them all fp32 in buffers of their own, %zu "
                   "in fp32), of which linear inputs %zu saved; stages %zu + %zu\n",
                   n->name, tn, b16, SEQ_B, b32, bf, s16, p0, p1);
            free(gf), free(g16), free(g32), free(x);
            dt_model_acts_free(a0), dt_model_acts_free(a1), dt_model_acts_free(f0), dt_model_acts_free(f1);
            dt_model_free(m16), dt_model_free(m32), dt_model_free(mp), dt_model_free(mf);
        }
}

// The shipped classifiers (configs/fashion-mlp.ini: the mlp preset,
// flatten, 784-1024-1024-10, batch 256; configs/fashion-cnn.ini, batch 64),
// also for the 1000 rows a run of them makes its model for (eval_batch): what
// dt_model_memory gives in fp32 and bf16 (no allocation). bf16 takes less
// than fp32, the CNN too, on every CPU (test_precision_avx2 checks the other
// path); the MLP saves its linear inputs' 2 bytes an element exactly.
static void shipped_sizes(void) {
    dt_layer_spec mlp[] = {{DT_LAYER_FLATTEN, 0, 0, 0, 0, 0, 0, 0, 0},
                           {DT_LAYER_LINEAR, 1024, 0, 0, 0, 0, 0, 0, 0}, {DT_LAYER_RELU, 0, 0, 0, 0, 0, 0, 0, 0},
                           {DT_LAYER_LINEAR, 1024, 0, 0, 0, 0, 0, 0, 0}, {DT_LAYER_RELU, 0, 0, 0, 0, 0, 0, 0, 0},
                           {DT_LAYER_LINEAR, 10, 0, 0, 0, 0, 0, 0, 0}};
    dt_layer_spec cnn[] = {{DT_LAYER_CONV2D, 32, 5, 1, 2, 0, 0, 0, 0}, {DT_LAYER_RELU, 0, 0, 0, 0, 0, 0, 0, 0},
                           {DT_LAYER_MAXPOOL, 0, 2, 0, 0, 0, 0, 0, 0},  {DT_LAYER_CONV2D, 64, 5, 1, 2, 0, 0, 0, 0},
                           {DT_LAYER_RELU, 0, 0, 0, 0, 0, 0, 0, 0},     {DT_LAYER_MAXPOOL, 0, 2, 0, 0, 0, 0, 0, 0},
                           {DT_LAYER_FLATTEN, 0, 0, 0, 0, 0, 0, 0, 0},  {DT_LAYER_LINEAR, 1024, 0, 0, 0, 0, 0, 0, 0},
                           {DT_LAYER_RELU, 0, 0, 0, 0, 0, 0, 0, 0},     {DT_LAYER_DROPOUT, 0, 0, 0, 0, 0.4f, 0, 0, 0},
                           {DT_LAYER_LINEAR, 10, 0, 0, 0, 0, 0, 0, 0}};
    struct { const char *name; dt_layer_spec *l; int n, shape[3], B; size_t half; } c[4] = {
        {"fashion-mlp", mlp, 6, {1, 28, 28}, 256, 784 + 2 * 1024}, {"fashion-cnn", cnn, 11, {1, 28, 28}, 64, 3136 + 1024},
        {"fashion-mlp", mlp, 6, {1, 28, 28}, 1000, 784 + 2 * 1024},
        {"fashion-cnn", cnn, 11, {1, 28, 28}, 1000, 3136 + 1024}};
    for (int i = 0; i < 4; i++) {
        size_t np, f32, bf32, bf, hf;
        dt_kernels_set_precision(DT_F16);
        dt_status s4 = dt_model_memory(c[i].shape, c[i].l, c[i].n, c[i].B, &np, &hf);
        dt_kernels_set_precision(DT_F32);
        dt_status s1 = dt_model_memory(c[i].shape, c[i].l, c[i].n, c[i].B, &np, &f32);
        dt_kernels_set_precision(DT_BF16);
        dt_model_set_acts16(0);
        dt_status s2 = dt_model_memory(c[i].shape, c[i].l, c[i].n, c[i].B, &np, &bf32);
        dt_model_set_acts16(1);
        dt_status s3 = dt_model_memory(c[i].shape, c[i].l, c[i].n, c[i].B, &np, &bf);
        dt_kernels_set_precision(DT_F32);
        int cnn_ = c[i].l == cnn;
        CHECK(s1 == DT_OK && s2 == DT_OK && s3 == DT_OK && s4 == DT_OK && bf < f32 && hf < f32 &&
                  (cnn_ ? bf32 - bf > 2 * c[i].B * c[i].half : bf32 - bf == 2 * c[i].B * c[i].half),
              "%s at batch %d: bf16 %zu bytes, fp16 %zu, fp32 %zu; %zu saved against bf16 without the savings (want %s %zu)",
              c[i].name, c[i].B, bf, hf, f32, bf32 - bf, cnn_ ? "more than" : "", 2 * c[i].B * c[i].half);
        printf("%s at batch %d (%s): activations %zu bytes in fp32; in bf16 %zu, %zu with every activation fp32 "
               "in a buffer of its own (%zu saved, %.1f%%; %.1f%% less than fp32); fp16 %zu\n", c[i].name, c[i].B, dt_kernels_isa(), f32, bf,
               bf32, bf32 - bf, 100.0 * (bf32 - bf) / bf32, 100.0 * (f32 - bf) / f32, hf);
    }
}

// ----------------------------------------------------------------------------
// runs

static const char *cfg_mlp =
    "[model]\ninput = 784\nlayer = linear out=64\nlayer = relu\nlayer = linear out=10\n"
    "[optim]\nname = adamw\nlr = 0.003\n";

// A run of N local workers, or under mpirun of -N ranks (N < 0).
static int train(const char *name, const char *extra_env, int N, const char *flags) {
    char path[512], cmd[2048];
    snprintf(path, sizeof path, "%s/%s.ini", g_tmp, name);
    FILE *f = fopen(path, "w");
    fprintf(f, "%s[data]\ndir = %s\n[train]\nbatch = 40\nepochs = 3\nmax_steps = 30\neval_batch = 100\nseed = 3\n", cfg_mlp, g_tmp);
    fclose(f);
    if (N < 0)  // under mpirun, -N ranks
        snprintf(cmd, sizeof cmd, "%s mpirun --allow-run-as-root --oversubscribe -np %d %s train %s --quiet --run-dir %s/%s %s",
                 extra_env ? extra_env : "", -N, tl_dtrain(), path, g_tmp, name, flags);
    else
        snprintf(cmd, sizeof cmd, "%s %s train %s --workers %d --quiet --run-dir %s/%s %s", extra_env ? extra_env : "",
                 tl_dtrain(), path, N, g_tmp, name, flags);
    int rc = tl_run(cmd, g_out, sizeof g_out);
    if (rc != 0) fprintf(stderr, "%s\n-> exit %d\n%s\n", cmd, rc, g_out);
    return rc;
}

// The metrics record of `step` in a rank's log, as text (NULL: none).
static char *step_record(const char *run, int rank, int step, char *buf, size_t n) {
    char path[700], key[64];
    snprintf(path, sizeof path, "%s/%s/metrics/rank-%05d.jsonl", g_tmp, run, rank);
    char *s = tl_read_file(path, NULL);
    snprintf(key, sizeof key, "\"type\":\"step\",\"step\":%d,", step);
    char *at = s ? strstr(s, key) : NULL;
    if (!at) {
        free(s);
        return NULL;
    }
    char *end = strchr(at, '\n');
    snprintf(buf, n, "%.*s", end ? (int)(end - at) : (int)strlen(at), at);
    free(s);
    return buf;
}

static void overflow_run(void) {
    // Rank 1 alone sees an inf at step 7, after the gradients were summed:
    // without the agreement rank 0 would take the step and the ranks' weights
    // would part.
    int rc = train("fp16-ovf", "DTRAIN_FAULT_OVERFLOW=1:7", 2, "--precision fp16");
    CHECK(rc == 0, "fp16, 2 workers, an overflow injected on rank 1 at step 7: exit %d", rc);
    int ok = 1;
    for (int rank = 0; rank < 2; rank++)
        for (int step = 5; step <= 9; step++) {
            char b[4096];
            const char *r = step_record("fp16-ovf", rank, step, b, sizeof b);
            int skipped = r && strstr(r, "\"skipped\":true") != NULL;
            double scale = r && strstr(r, "\"loss_scale\":") ? atof(strstr(r, "\"loss_scale\":") + 13) : -1;
            double want = step < 7 ? 65536 : 32768;
            if (!r || skipped != (step == 7) || scale != want) {
                ok = 0;
                fprintf(stderr, "rank %d step %d: %s\n", rank, step, r ? r : "(no record)");
            }
        }
    CHECK(ok, "both ranks skip step 7 alone, and the scale halves there (65536 -> 32768)");
    const char *sp = tl_path(g_tmp, "fp16-ovf/summary.json");
    CHECK(tl_json_number(sp, "skipped_steps") == 1 && tl_json_number(sp, "loss_scale") == 32768,
          "summary.json: skipped_steps %g, loss_scale %g", tl_json_number(sp, "skipped_steps"),
          tl_json_number(sp, "loss_scale"));
    // The same run without the fault on one process takes step 7: the two
    // runs' weights then differ, while a one-process run with the fault
    // injected (rank 0 of 1) gives rank 0's weights... of the skipped run.
    rc = train("fp16-ovf1", "DTRAIN_FAULT_OVERFLOW=0:7", 1, "--precision fp16");
    int bw;
    double d = tl_weights_diff(tl_path(g_tmp, "fp16-ovf/model.safetensors"), tl_path(g_tmp, "fp16-ovf1/model.safetensors"), &bw);
    CHECK(rc == 0 && d >= 0 && d < 1e-4, "2 workers with the skip = 1 process with the skip (max rel diff %.3g)", d);
    rc = train("fp16-clean", NULL, 1, "--precision fp16");
    double d2 = tl_weights_diff(tl_path(g_tmp, "fp16-clean/model.safetensors"), tl_path(g_tmp, "fp16-ovf1/model.safetensors"), &bw);
    CHECK(rc == 0 && d2 > 1e-3, "a step skipped changes the result (max rel diff %.3g to the clean run)", d2);
    printf("fp16 overflow on rank 1 at step 7: both ranks skipped it, scale 65536 -> 32768; vs 1 process %.3g, vs clean %.3g\n",
           d, d2);
}

// [parallel] grad_dtype = bf16 sends half the gradient bytes (dp through
// the bf16 codec, ZeRO's reduce-scatter, the pipeline's allreduce) and
// trains as well.
static void grad_dtype(void) {
    const char *modes[3] = {"", "--zero 2", "--set parallel.sync_every=2 --set parallel.sync_warmup=100"};
    for (int i = 0; i < 3; i++) {
        char a[64], b[64], flags[256];
        snprintf(a, sizeof a, "gd-fp32-%d", i);
        snprintf(b, sizeof b, "gd-bf16-%d", i);
        int r1 = train(a, NULL, 2, modes[i]);
        snprintf(flags, sizeof flags, "%s --set parallel.grad_dtype=bf16", modes[i]);
        int r2 = train(b, NULL, 2, flags);
        char pa[128], pb[128];
        snprintf(pa, sizeof pa, "%s/summary.json", a);
        snprintf(pb, sizeof pb, "%s/summary.json", b);
        double b32 = tl_json_number(tl_path(g_tmp, pa), "bytes_sent"), b16 = tl_json_number(tl_path(g_tmp, pb), "bytes_sent");
        double acc = tl_json_number(tl_path(g_tmp, pb), "test_accuracy");
        // Half the gradients' bytes (the per-step control allreduce is the
        // same in both); ZeRO also allgathers the fp32 parameters, as many
        // bytes as its fp32 gradients: (1/2 + 1) / 2 of them.
        double want = i == 1 ? 0.75 : 0.5;
        CHECK(r1 == 0 && r2 == 0 && b16 > (want - 0.05) * b32 && b16 < (want + 0.05) * b32 && acc > 0.9,
              "grad_dtype = bf16 %s: %.0f bytes sent against %.0f in fp32 (%.2f), test accuracy %.3f", modes[i], b16,
              b32, b32 > 0 ? b16 / b32 : 0, acc);
        printf("grad_dtype bf16 %-60s: %.0f / %.0f bytes (%.2f), accuracy %.3f\n", *modes[i] ? modes[i] : "(dp)", b16, b32,
               b32 > 0 ? b16 / b32 : 0, acc);
    }
    // Under mpirun on the mpi backend the bf16 gradients travel in 16 bits
    // too (src/comm/mpi/mpi.c; the bytes handed to MPI: ctest comm_mpi_wire_*),
    // summed in fp32 and rounded once as the shared-memory backend does: the
    // same weights, bit for bit, as 2 local workers, for dp's allreduce and
    // ZeRO's reduce-scatter.
#ifndef DTRAIN_HAVE_MPI
    printf("grad_dtype bf16 under mpirun: not run (built without MPI)\n");
#endif
    for (int i = 0; i < 2 * DTRAIN_MPI_BUILT; i++) {
        char name[64], flags[256];
        snprintf(name, sizeof name, "gd-mpi-%d", i);
        snprintf(flags, sizeof flags, "%s --set parallel.grad_dtype=bf16", modes[i]);
        if (access("/usr/bin/mpirun", X_OK) != 0) {
            CHECK(0, "mpirun is not installed (scripts/install-deps.sh installs it)");
            break;
        }
        int r = train(name, "DTRAIN_COMM_BACKEND=mpi", -2, flags);
        char pa[128], pb[128];
        snprintf(pa, sizeof pa, "gd-bf16-%d/model.safetensors", i);
        snprintf(pb, sizeof pb, "%s/model.safetensors", name);
        int bw;
        double d = tl_weights_diff(tl_path(g_tmp, pa), tl_path(g_tmp, pb), &bw);
        CHECK(r == 0 && d == 0 && bw, "grad_dtype = bf16 %s under mpirun (mpi backend) = 2 local workers: exit %d, max rel diff %.3g",
              modes[i], r, d);
    }
    int rc = train("gd-det", NULL, 2, "--deterministic --set parallel.grad_dtype=bf16");
    CHECK(rc == 2 && strstr(g_out, "[parallel] grad_dtype = bf16 cannot be combined with deterministic = true"),
          "grad_dtype = bf16 with deterministic sums is refused: exit %d\n%s", rc, g_out);
}

static void learn_and_resume(void) {
    // Each precision learns the labels (the images show them).
    const char *ps[3] = {"fp32", "bf16", "fp16"};
    double acc[3];
    for (int i = 0; i < 3; i++) {
        char name[32], flags[64];
        snprintf(name, sizeof name, "learn-%s", ps[i]);
        snprintf(flags, sizeof flags, "--precision %s", ps[i]);
        int rc = train(name, NULL, 1, flags);
        snprintf(name, sizeof name, "learn-%s/summary.json", ps[i]);
        acc[i] = tl_json_number(tl_path(g_tmp, name), "test_accuracy");
        CHECK(rc == 0 && acc[i] > 0.9, "%s: test accuracy %.3f after 30 steps", ps[i], acc[i]);
    }
    printf("test accuracy after 30 steps: fp32 %.3f, bf16 %.3f, fp16 %.3f\n", acc[0], acc[1], acc[2]);
    // Checkpoints hold the fp32 master weights: a bf16 run's checkpoint at
    // step 10, resumed in fp32, goes on from exactly those weights (its
    // first steps equal an fp32 run's from the same point: resumed twice, bitwise).
    int rc = train("ck-bf16", NULL, 1, "--precision bf16 --checkpoint-every 10 --keep 5");
    CHECK(rc == 0, "bf16 run with checkpoints: exit %d", rc);
    char flags[700];
    snprintf(flags, sizeof flags, "--precision fp32 --resume %s/ck-bf16/checkpoints/step-00000010.safetensors", g_tmp);
    int r1 = train("ck-fp32a", NULL, 1, flags), r2 = train("ck-fp32b", NULL, 1, flags);
    int bw;
    double d = tl_weights_diff(tl_path(g_tmp, "ck-fp32a/model.safetensors"), tl_path(g_tmp, "ck-fp32b/model.safetensors"), &bw);
    double d2 = tl_weights_diff(tl_path(g_tmp, "ck-fp32a/model.safetensors"), tl_path(g_tmp, "ck-bf16/model.safetensors"), &bw);
    CHECK(r1 == 0 && r2 == 0 && d == 0, "a bf16 checkpoint resumed in fp32: exit %d/%d, repeatable (%.3g)", r1, r2, d);
    CHECK(d2 > 0 && d2 < 0.05, "... it continues the bf16 run (max rel diff %.3g to bf16 throughout)", d2);
    char ck[700];
    snprintf(ck, sizeof ck, "%s inspect %s/ck-bf16/checkpoints/step-00000010.safetensors", tl_dtrain(), g_tmp);
    tl_run(ck, g_out, sizeof g_out);
    CHECK(strstr(g_out, "F32") && !strstr(g_out, "BF16"), "the checkpoint's tensors are F32:\n%.2000s", g_out);
    // dtrain export --dtype bf16: the fp32 export's values rounded, as BF16.
    char cmd[2200];
    const char *ckp = tl_path(g_tmp, "ck-bf16/checkpoints/step-00000020.safetensors");
    snprintf(cmd, sizeof cmd, "%s export %s -o %s/w32.safetensors && %s export %s -o %s/w16.safetensors --dtype bf16",
             tl_dtrain(), ckp, g_tmp, tl_dtrain(), ckp, g_tmp);
    rc = tl_run(cmd, g_out, sizeof g_out);
    dt_st_file *a = NULL, *b = NULL;
    int same = rc == 0 && dt_st_open(&a, tl_path(g_tmp, "w32.safetensors")) == DT_OK &&
               dt_st_open(&b, tl_path(g_tmp, "w16.safetensors")) == DT_OK && dt_st_count(a) == dt_st_count(b);
    size_t bytes32 = 0, bytes16 = 0;
    for (int i = 0; same && i < dt_st_count(a); i++) {
        const dt_st_tensor *x = dt_st_get(a, i), *y = dt_st_get(b, i);
        size_t n = x->nbytes / 4;
        float *f = malloc(4 * n), *g = malloc(4 * n);
        memcpy(f, tl_st_data(a, x), 4 * n);
        dt_round_f32(f, f, n, DT_BF16);
        same = x->dtype == DT_F32 && y->dtype == DT_BF16 && y->nbytes == 2 * n && !strcmp(x->name, y->name);
        if (same) dt_to_f32(g, tl_st_data(b, y), n, DT_BF16);
        same = same && !memcmp(f, g, 4 * n);
        bytes32 += x->nbytes, bytes16 += y->nbytes;
        free(f), free(g);
    }
    CHECK(same && bytes16 * 2 == bytes32, "export --dtype bf16: every tensor BF16, the fp32 values rounded (%zu -> %zu bytes)\n%s",
          bytes32, bytes16, g_out);
    dt_st_close(a), dt_st_close(b);
    snprintf(cmd, sizeof cmd, "%s export %s -o %s/w8.safetensors --dtype fp8", tl_dtrain(), ckp, g_tmp);
    rc = tl_run(cmd, g_out, sizeof g_out);
    CHECK(rc == 2 && strstr(g_out, "--dtype needs fp32, bf16 or fp16, got 'fp8'"), "export --dtype fp8: exit %d\n%s", rc, g_out);
    // Bad values are refused by name.
    rc = train("bad", NULL, 1, "--precision fp8");
    CHECK(rc == 2 && strstr(g_out, "precision") && strstr(g_out, "fp8"), "--precision fp8: exit %d\n%s", rc, g_out);
    rc = train("bad16", NULL, 2, "--precision fp16 --deterministic");
    CHECK(rc == 2 && strstr(g_out, "[train] precision = fp16 cannot be combined with [parallel] deterministic = true"),
          "fp16 with deterministic sums is refused: exit %d\n%s", rc, g_out);
}

// The loss scale of a step's metrics record (-1: no record or no scale).
static double record_scale(const char *run, int step) {
    char b[4096];
    const char *r = step_record(run, 0, step, b, sizeof b);
    const char *at = r ? strstr(r, "\"loss_scale\":") : NULL;
    return at ? atof(at + 13) : -1;
}

// fp16's loss scaler is in the checkpoints: a run stopped at step 10 and
// resumed goes on as the uninterrupted run, scale and clean-step count
// included; a checkpoint without a scaler (a bf16 run's, as those written
// before it was kept) resumes fp16 at the defaults.
static void fp16_resume(void) {
    // An overflow at step 3 halves the scale: the checkpoint of step 10
    // holds 32768, not the default 65536.
    int rc = train("fp16-full", "DTRAIN_FAULT_OVERFLOW=0:3", 1, "--precision fp16 --checkpoint-every 10 --keep 5");
    CHECK(rc == 0, "fp16 run with an overflow at step 3 and checkpoints: exit %d", rc);
    char flags[700];
    snprintf(flags, sizeof flags, "--precision fp16 --checkpoint-every 10 --keep 5 --resume %s/fp16-full/checkpoints/step-00000010.safetensors",
             g_tmp);
    rc = train("fp16-res", NULL, 1, flags);
    CHECK(rc == 0, "the fp16 run resumed at step 10: exit %d", rc);
    int bw, ok = 1;
    double d = tl_weights_diff(tl_path(g_tmp, "fp16-full/model.safetensors"), tl_path(g_tmp, "fp16-res/model.safetensors"), &bw);
    CHECK(d == 0 && bw, "resumed at step 10, the fp16 run ends bitwise as the uninterrupted one (max rel diff %.3g)", d);
    for (int step = 11; step <= 30; step++) {
        double a = record_scale("fp16-full", step), b = record_scale("fp16-res", step);
        if (a != 32768 || b != a) {
            ok = 0;
            fprintf(stderr, "step %d: loss scale %g uninterrupted, %g resumed\n", step, a, b);
        }
    }
    CHECK(ok, "steps 11-30 run at the checkpoint's scale 32768 in both runs");
    const char *sf = tl_path(g_tmp, "fp16-full/summary.json");
    double skipped = tl_json_number(sf, "skipped_steps");
    sf = tl_path(g_tmp, "fp16-res/summary.json");
    CHECK(skipped == 1 && tl_json_number(sf, "skipped_steps") == 1 && tl_json_number(sf, "loss_scale") == 32768,
          "summary.json of both: 1 skipped step (%g, %g), scale %g", skipped, tl_json_number(sf, "skipped_steps"),
          tl_json_number(sf, "loss_scale"));
    // The scaler as both runs' step-30 checkpoints hold it: the same scale,
    // clean steps in a row (27, since step 3) and skipped steps.
    dt_st_file *fa = NULL, *fb = NULL;
    const char *va = NULL, *vb = NULL;
    if (dt_st_open(&fa, tl_path(g_tmp, "fp16-full/checkpoints/step-00000030.safetensors")) == DT_OK)
        va = dt_st_meta_get(fa, "loss_scaler");
    if (dt_st_open(&fb, tl_path(g_tmp, "fp16-res/checkpoints/step-00000030.safetensors")) == DT_OK)
        vb = dt_st_meta_get(fb, "loss_scaler");
    CHECK(va && vb && !strcmp(va, "0x1p+15 27 1") && !strcmp(va, vb),
          "step 30's checkpoints hold loss_scaler '%s' (uninterrupted) and '%s' (resumed), want '0x1p+15 27 1'",
          va ? va : "(none)", vb ? vb : "(none)");
    dt_st_close(fa), dt_st_close(fb);
    char cmd[900];
    snprintf(cmd, sizeof cmd, "%s inspect %s/fp16-res/checkpoints/step-00000030.safetensors", tl_dtrain(), g_tmp);
    rc = tl_run(cmd, g_out, sizeof g_out);
    CHECK(rc == 0 && strstr(g_out, "loss_scaler     0x1p+15 27 1 (scale, clean steps, skipped steps)"),
          "inspect shows the scaler:\n%.2000s", g_out);
    // A bf16 run's checkpoint has no scaler: fp16 resumes from it at 2^16.
    snprintf(cmd, sizeof cmd, "%s inspect %s/ck-bf16/checkpoints/step-00000010.safetensors", tl_dtrain(), g_tmp);
    tl_run(cmd, g_out, sizeof g_out);
    CHECK(!strstr(g_out, "loss_scaler"), "a bf16 run's checkpoint holds no loss scaler");
    snprintf(flags, sizeof flags, "--precision fp16 --resume %s/ck-bf16/checkpoints/step-00000010.safetensors", g_tmp);
    rc = train("fp16-from-bf16", NULL, 1, flags);
    CHECK(rc == 0 && record_scale("fp16-from-bf16", 11) == 65536,
          "fp16 resumed from a checkpoint without a scaler: exit %d, scale %g at step 11 (the default 65536)", rc,
          record_scale("fp16-from-bf16", 11));
}

// A GPT run in bf16 states both savings at its start and in summary.json:
// the activation set's bytes and what its 16-bit matmul inputs saved (the
// set's own figures), the weights' copy (2 bytes a parameter) and the
// conversions it saved.
static void gpt_run(void) {
    uint16_t tok[4096];
    for (int i = 0; i < 4096; i++) tok[i] = (uint16_t)((i * 7 + i / 13) % 32);
    CHECK(dt_tokens_write(tl_path(g_tmp, "tok_train.bin"), tok, 4096) == DT_OK &&
              dt_tokens_write(tl_path(g_tmp, "tok_val.bin"), tok, 1024) == DT_OK, "token files");
    char path[512], cmd[2048];
    snprintf(path, sizeof path, "%s/gpt.ini", g_tmp);
    FILE *f = fopen(path, "w");
    fprintf(f, "[model]\npreset = gpt\nn_layer = 2\nn_head = 2\nn_embd = 32\nblock_size = 16\nvocab_size = 32\n"
               "[data]\ndataset = tokens\ntrain_file = %s/tok_train.bin\nval_file = %s/tok_val.bin\n"
               "[optim]\nname = adamw\nlr = 0.001\n[train]\nbatch = 8\nseq_len = 16\nmax_steps = 4\neval_batches = 1\n",
            g_tmp, g_tmp);
    fclose(f);
    snprintf(cmd, sizeof cmd, "%s train %s --run-dir %s/gpt-bf16 --precision bf16", tl_dtrain(), path, g_tmp);
    int rc = tl_run(cmd, g_out, sizeof g_out);
    dt_gpt_config gc = {.n_layer = 2, .n_head = 2, .n_embd = 32, .block_size = 16, .vocab_size = 32, .padded_vocab_size = 32};
    dt_gpt_acts_params ap = dt_gpt_acts_whole(&gc, 8, 16);
    dt_kernels_set_precision(DT_F32);
    size_t b32 = dt_gpt_acts_size(&gc, &ap);
    dt_kernels_set_precision(DT_BF16);
    size_t b16 = dt_gpt_acts_size(&gc, &ap);
    dt_kernels_set_precision(DT_F32);
    const char *sp = tl_path(g_tmp, "gpt-bf16/summary.json");
    double ab = tl_json_number(sp, "activation_bytes"), as = tl_json_number(sp, "activation_bytes_saved");
    CHECK(rc == 0 && strstr(g_out, "saved: matmul inputs kept in bf16") && strstr(g_out, "weights' bf16 copy"),
          "a GPT run in bf16 names its savings on the start line: exit %d\n%.1500s", rc, g_out);
    CHECK(ab == (double)b16 && as == (double)(b32 - b16) && as > 0,
          "summary.json: activation_bytes %.0f (want %zu), activation_bytes_saved %.0f (want %zu)", ab, b16, as, b32 - b16);
    double wb = tl_json_number(sp, "bytes"), conv = tl_json_number(sp, "converted"),
           saved = tl_json_number(sp, "conversions_saved"), np = tl_json_number(sp, "params");
    CHECK(wb == 2 * np && conv > 0 && saved > 0 && saved <= conv,
          "summary.json weight_copy: %.0f bytes for %.0f parameters, %.0f elements converted, %.0f conversions saved",
          wb, np, conv, saved);
    printf("GPT run in bf16: activations %.0f bytes (%.0f saved), weights' copy %.0f bytes, %.0f conversions, %.0f saved\n",
           ab, as, wb, conv, saved);
}

// An MLP run in bf16 states its activations' saving at its start and in
// summary.json, as the GPT's: the model made for 100 rows (eval_batch, the
// 100 test samples) keeps the relu's output (64 wide, the second linear's
// input) in 2 bytes: 100 x 64 x 2 bytes saved, the rest as dt_model_memory
// plans it in bf16.
static void mlp_run(void) {
    char path[512], cmd[2048];
    snprintf(path, sizeof path, "%s/mlp-run.ini", g_tmp);
    FILE *f = fopen(path, "w");
    fprintf(f, "%s[data]\ndir = %s\n[train]\nbatch = 40\nepochs = 1\nmax_steps = 3\neval_batch = 100\nseed = 3\n",
            cfg_mlp, g_tmp);
    fclose(f);
    const char *ts[2] = {"bf16", "fp16"};
    for (int i = 0; i < 2; i++) {
        snprintf(cmd, sizeof cmd, "%s train %s --run-dir %s/mlp-%s --precision %s", tl_dtrain(), path, g_tmp, ts[i],
                 ts[i]);
        int rc = tl_run(cmd, g_out, sizeof g_out);
        char want[64], sp[64];
        snprintf(want, sizeof want, "saved: matmul inputs kept in %s", ts[i]);
        CHECK(rc == 0 && strstr(g_out, want), "an MLP run in %s names its activations' saving on the start line: exit %d\n%.1500s",
              ts[i], rc, g_out);
        dt_layer_spec l[3] = {{DT_LAYER_LINEAR, 64, 0, 0, 0, 0, 0, 0, 0}, {DT_LAYER_RELU, 0, 0, 0, 0, 0, 0, 0, 0},
                              {DT_LAYER_LINEAR, 10, 0, 0, 0, 0, 0, 0, 0}};
        int shape[3] = {784, 1, 1};
        size_t np, b16 = 0;
        dt_kernels_set_precision(i == 0 ? DT_BF16 : DT_F16);
        dt_model_memory(shape, l, 3, 100, &np, &b16);
        dt_kernels_set_precision(DT_F32);
        snprintf(sp, sizeof sp, "mlp-%s/summary.json", ts[i]);
        double ab = tl_json_number(tl_path(g_tmp, sp), "activation_bytes"),
               as = tl_json_number(tl_path(g_tmp, sp), "activation_bytes_saved");
        CHECK(ab == (double)b16 && as == 100 * 64 * 2,
              "MLP %s summary.json: activation_bytes %.0f (want %zu), activation_bytes_saved %.0f (want %d)", ts[i], ab,
              b16, as, 100 * 64 * 2);
        printf("MLP run in %s: activations %.0f bytes (%.0f saved)\n", ts[i], ab, as);
    }
}

int main(int argc, char **argv) {
    const char *only = argc > 1 ? argv[1] : NULL;
    conversions();
    portable_gemm();
    kernels();
    working_copy();
    gpt_acts16();
    seq_acts16();
    shipped_sizes();
    scaler();
    if (only && !strcmp(only, "kernels")) return tl_finish();
    snprintf(g_tmp, sizeof g_tmp, "/tmp/dtrain-test-precision-XXXXXX");
    if (!mkdtemp(g_tmp)) return perror("mkdtemp"), 1;
    tl_make_images(g_tmp, "train", 400, 1);
    tl_make_images(g_tmp, "t10k", 100, 2);
    overflow_run();
    grad_dtype();
    learn_and_resume();
    fp16_resume();
    gpt_run();
    mlp_run();
    tl_cleanup(g_tmp);
    return tl_finish();
}
