/* The fused attention's CUDA kernels (src/gpu/flash.cu) run on CPU threads
 * (cuda_emu.h: each block's threads real threads, its barriers and
 * shuffles real barriers), against the CPU's attention: every build with
 * the CUDA toolkit runs it, so that the kernels' indexing, masks, tiles
 * and barriers are checked where no GPU is (a GPU runs the same rows in
 * test_gpu ops). out and dqkv normwise within 1e-5 in fp32 (5e-3 with
 * TF32), 1e-2 with the products in bf16, 2e-3 in fp16 (test_gpu's
 * tolerances), the backward on the output as the GPT's layer keeps it (in
 * 16 bits rounded to the type), and with TF32 on gradients of 1e-6
 * (fp16's subnormals: the row dots' dout is fp32 there); the backward run
 * twice gives the same bits; shared
 * memory a kernel reads before any thread wrote it would be NaN (the
 * emulator fills it so) and fail the comparison; a barrier in divergent
 * code aborts with its name. */
#include "emu_names.h"  // (before gpu.h: the emulated kernels' names, declared there)
#include "core/fixed.h"
#include "dtrain/gpt.h"
#include "dtrain/optim.h"
#include "optim/elem.h"
#include "gpu/att_plan.h"
#include "gpu/gpu.h"
#include "kernels/kernels.h"
#include "testlib.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static float *randoms(size_t n, float r, uint64_t seed) {
    float *a = malloc(sizeof(float) * (n ? n : 1));
    uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        a[i] = ((float)(x >> 40) / (float)(1 << 24) - 0.5f) * r;
    }
    return a;
}

// gs: dout's scale.
static void test_flash(int B, int T, int C, int NH, dt_dtype t, float gs) {
    double tol = t == DT_BF16 ? 1e-2 : t == DT_F16 ? 2e-3 : dt_gpu_tf32() ? 5e-3 : 1e-5;
    const char *tn = t == DT_BF16 ? "bf16" : t == DT_F16 ? "fp16" : dt_gpu_tf32() ? "fp32 with TF32" : "fp32";
    dt_att_room room = dt_att_room_of(B, T, C, NH, t);
    size_t n3 = (size_t)B * T * 3 * C, n = (size_t)B * T * C, na = (size_t)B * NH * T * T;
    size_t ns = room.saved / sizeof(float), nd = room.scratch / sizeof(float), rows = (size_t)B * NH * T;
    float *qkv = randoms(n3, 2, 41), *dout = randoms(n, gs, 44), *dq0 = randoms(n3, 0.1f * gs, 45);
    float *out = randoms(n, 1, 42), *att = randoms(na, 1, 43), *datt = randoms(na, 1, 46), *dqkv = malloc(sizeof(float) * n3);
    float *eout = randoms(n, 1, 47), *saved = randoms(ns, 1, 48), *scratch = randoms(nd, 1, 49);
    float *edq = malloc(sizeof(float) * n3), *edq2 = malloc(sizeof(float) * n3);
    memcpy(dqkv, dq0, sizeof(float) * n3), memcpy(edq, dq0, sizeof(float) * n3), memcpy(edq2, dq0, sizeof(float) * n3);
    uint16_t *o16 = malloc(2 * n);  // (the output as kept in 16 bits)
    dt_status st = dt_gpu_flash_forward(eout, saved, qkv, B, T, C, NH, t);
    if (t != DT_F32) dt_from_f32(o16, eout, n, t);
    const void *kept = t == DT_F32 ? (const void *)eout : o16;
    if (st == DT_OK) st = dt_gpu_flash_backward(edq, scratch, dout, qkv, kept, saved, B, T, C, NH, t);
    if (st == DT_OK) st = dt_gpu_flash_backward(edq2, scratch, dout, qkv, kept, saved, B, T, C, NH, t);
    dt_kernels_set_precision(t);
    dt_attention_forward(out, att, qkv, B, T, C, NH);
    dt_attention_backward(dqkv, datt, dout, qkv, att, B, T, C, NH);
    dt_kernels_set_precision(DT_F32);
    double dy = tl_normwise(out, eout, n), dq = tl_normwise(dqkv, edq, n3);
    int same = !memcmp(edq, edq2, sizeof(float) * n3);
    (void)rows;
    CHECK(st == DT_OK && dy <= tol && dq <= tol && same,
          "fused attention %s on emulated threads, B %d T %d C %d NH %d (heads of %d), gradients of %g: out %.3g, "
          "dqkv %.3g (normwise, <= %g); a second backward %s%s%s", tn, B, T, C, NH, C / NH, gs, dy, dq, tol,
          same ? "the same bits" : "OTHER BITS", st == DT_OK ? "" : ": ", st == DT_OK ? "" : dt_last_error());
    free(o16);
    float *f[] = {qkv, dout, dq0, out, att, datt, dqkv, eout, saved, scratch, edq, edq2};
    for (size_t i = 0; i < sizeof f / sizeof *f; i++) free(f[i]);
}

// The cross-entropy's kernels (src/gpu/layers.cu) on emulated threads, N
// rows of V logits ld apart (the padding -7, never written): the forward
// (probabilities, the loss) and the backward onto zeros against the CPU's
// within 1e-5, and the fused pass (dt_gpu_crossentropy_fused: the
// gradient written over the logits) the two kernels' bits; a target
// outside the row a NaN loss.
static void test_ce(size_t N, int V, size_t ld) {
    size_t n = N * (size_t)V, nl = N * ld;
    float *l = randoms(n, 8.0f, 7), *p = malloc(sizeof(float) * n), *d = calloc(n, sizeof(float));
    float *pl = malloc(sizeof(float) * nl), *fl = malloc(sizeof(float) * nl), *ep = malloc(sizeof(float) * nl);
    float *ed = malloc(sizeof(float) * nl), loss2[2];
    double *rows = malloc(sizeof(double) * N), *rows2 = malloc(sizeof(double) * N);
    int32_t *t = malloc(sizeof(int32_t) * N);
    for (size_t i = 0; i < N; i++) t[i] = (int32_t)((i * 7919 + 3) % (size_t)V);
    for (size_t i = 0; i < nl; i++) {
        pl[i] = fl[i] = i % ld < (size_t)V ? l[i / ld * V + i % ld] : -7.0f;
        ep[i] = -7.0f, ed[i] = i % ld < (size_t)V ? 0.0f : -7.0f;
    }
    dt_status st = dt_gpu_crossentropy_forward(ep, rows, &loss2[0], pl, t, N, V, ld);
    if (st == DT_OK) st = dt_gpu_crossentropy_backward(ed, ep, t, N, V, ld, 0.75f);
    if (st == DT_OK) st = dt_gpu_crossentropy_fused(fl, rows2, &loss2[1], t, N, V, ld, 0.75f);
    float loss = dt_crossentropy_forward(p, l, t, (int)N, V);
    dt_crossentropy_backward(d, p, t, (int)N, V, 0.75f);
    float *gp = malloc(sizeof(float) * n), *gd = malloc(sizeof(float) * n);
    int kept = 1, same = !memcmp(&loss2[0], &loss2[1], sizeof(float)) && !memcmp(rows, rows2, sizeof(double) * N);
    for (size_t i = 0; i < nl; i++)
        if (i % ld < (size_t)V) {
            gp[i / ld * V + i % ld] = ep[i], gd[i / ld * V + i % ld] = fl[i];
            same &= !memcmp(&fl[i], &ed[i], sizeof(float));
        } else {
            kept &= ep[i] == -7.0f && fl[i] == -7.0f && ed[i] == -7.0f;
        }
    double dp = tl_max_rel(p, gp, n, 1e-30), dd = tl_max_rel(d, gd, n, 1e-6), dl = tl_rel(loss, loss2[0], 1e-6);
    CHECK(st == DT_OK && dp <= 1e-5 && dd <= 1e-5 && dl <= 1e-5 && kept && same,
          "cross-entropy on emulated threads, N %zu V %d ld %zu: probabilities %.3g, the fused pass's gradient %.3g, "
          "the loss %.3g (<= 1e-5); the fused pass %s the two kernels' bits; padding %s%s%s", N, V, ld, dp, dd, dl,
          same ? "has" : "DOES NOT HAVE", kept ? "kept" : "WRITTEN", st == DT_OK ? "" : ": ",
          st == DT_OK ? "" : dt_last_error());
    t[0] = V;  // (outside the row)
    for (size_t i = 0; i < nl; i++) fl[i] = i % ld < (size_t)V ? l[i / ld * V + i % ld] : -7.0f;
    st = dt_gpu_crossentropy_fused(fl, rows2, &loss2[1], t, N, V, ld, 0.75f);
    CHECK(st == DT_OK && isnan(rows2[0]) && isnan(loss2[1]) && (N < 2 || !isnan(rows2[1])),
          "cross-entropy fused on emulated threads: a target outside the row a NaN loss (row 0 %g, loss %g)", rows2[0],
          loss2[1]);
    float *f[] = {l, p, d, pl, fl, ep, ed, gp, gd};
    for (size_t i = 0; i < sizeof f / sizeof *f; i++) free(f[i]);
    free(rows), free(rows2), free(t);
}

// A tensor-parallel shard's cross-entropy (the ce_split kernels, a GPU's
// only in the GPT's vocabulary-parallel head), targets partly outside the
// shard's V columns: the rows' maxima the CPU's bits, the sums and
// probabilities within 1e-5, the finish (on the CPU's sums) the CPU's
// bits.
static void test_ce_split(size_t N, int V) {
    size_t n = N * (size_t)V;
    float *l = randoms(n, 8.0f, 9), *p = malloc(sizeof(float) * n), *ep = malloc(sizeof(float) * n);
    float *mx = malloc(sizeof(float) * N), *emx = malloc(sizeof(float) * N), *sums = malloc(sizeof(float) * 2 * N);
    float *esums = malloc(sizeof(float) * 2 * N), eloss = 0;
    double *rows = malloc(sizeof(double) * N), *erows = malloc(sizeof(double) * N);
    int32_t *t = malloc(sizeof(int32_t) * N);
    for (size_t i = 0; i < N; i++) t[i] = (int32_t)((i * 7919 + 3) % (size_t)(2 * V)) - V / 2;  // (some outside)
    dt_status st = dt_gpu_ce_split_max(emx, l, N, V);
    dt_ce_split_max(mx, l, (int)N, V);
    if (st == DT_OK) st = dt_gpu_ce_split_exp(ep, esums, l, mx, t, N, V);
    dt_ce_split_exp(p, sums, l, mx, t, (int)N, V);
    int same = !memcmp(mx, emx, sizeof(float) * N) && !memcmp(sums + N, esums + N, sizeof(float) * N);
    double dp = tl_max_rel(p, ep, n, 1e-30), ds = tl_max_rel(sums, esums, N, 1e-30);
    memcpy(ep, p, sizeof(float) * n);
    if (st == DT_OK) st = dt_gpu_ce_split_finish(ep, erows, &eloss, mx, sums, N, V);
    dt_ce_split_finish(p, rows, mx, sums, (int)N, V);
    same &= !memcmp(p, ep, sizeof(float) * n) && !memcmp(rows, erows, sizeof(double) * N);
    CHECK(st == DT_OK && same && dp <= 1e-5 && ds <= 1e-5, "vocabulary-parallel cross-entropy on emulated threads, N "
          "%zu V %d: the maxima, the targets' logits and the finish %s; probabilities %.3g, sums %.3g (<= 1e-5)%s%s",
          N, V, same ? "the CPU's bits" : "NOT the CPU's bits", dp, ds, st == DT_OK ? "" : ": ",
          st == DT_OK ? "" : dt_last_error());
    float *f[] = {l, p, ep, mx, emx, sums, esums};
    for (size_t i = 0; i < sizeof f / sizeof *f; i++) free(f[i]);
    free(rows), free(erows), free(t);
}

// Layernorm's kernels (src/gpu/layers.cu: a block a row; the weights'
// gradients as column sums over chunks of rows, a grid of column tiles x
// chunks) on emulated threads against the CPU's, forward and backward,
// within 1e-5 (relative, absolute below 1, as test_gpu ops); the backward
// adds onto what dinp, dw and db held.
static void test_layernorm(size_t N, int C) {
    size_t n = N * (size_t)C;
    float *x = randoms(n, 4.0f, 31), *w = randoms((size_t)C, 2.0f, 32), *b = randoms((size_t)C, 1.0f, 33);
    float *dout = randoms(n, 1.0f, 34), *out = malloc(sizeof(float) * n), *eout = malloc(sizeof(float) * n);
    float *mean = malloc(sizeof(float) * N), *rstd = malloc(sizeof(float) * N), *em = malloc(sizeof(float) * N);
    float *er = malloc(sizeof(float) * N), *dx = randoms(n, 0.1f, 35), *edx = malloc(sizeof(float) * n);
    float *dw = randoms((size_t)C, 0.1f, 36), *db = randoms((size_t)C, 0.1f, 37);
    float *edw = malloc(sizeof(float) * C), *edb = malloc(sizeof(float) * C);
    memcpy(edx, dx, sizeof(float) * n), memcpy(edw, dw, sizeof(float) * C), memcpy(edb, db, sizeof(float) * C);
    dt_status st = dt_gpu_layernorm_forward(eout, em, er, x, w, b, N, C, 1e-5f);
    dt_layernorm_forward(out, mean, rstd, x, w, b, (int)N, C, 1e-5f);
    if (st == DT_OK) st = dt_gpu_layernorm_backward(edx, edw, edb, dout, x, w, mean, rstd, N, C);
    dt_layernorm_backward(dx, dw, db, dout, x, w, mean, rstd, (int)N, C);
    // (relative, absolute below 1: test_gpu ops' measure)
    double d[6] = {tl_max_rel(out, eout, n, 1.0), tl_max_rel(mean, em, N, 1.0), tl_max_rel(rstd, er, N, 1.0),
                   tl_max_rel(dx, edx, n, 1.0),   tl_max_rel(dw, edw, (size_t)C, 1.0),
                   tl_max_rel(db, edb, (size_t)C, 1.0)};
    double worst = 0;
    for (int i = 0; i < 6; i++) worst = d[i] > worst ? d[i] : worst;
    CHECK(st == DT_OK && worst <= 1e-5, "layernorm on emulated threads, N %zu C %d: out %.3g, mean %.3g, rstd %.3g, "
          "dinp %.3g, dw %.3g, db %.3g (<= 1e-5)%s%s", N, C, d[0], d[1], d[2], d[3], d[4], d[5],
          st == DT_OK ? "" : ": ", st == DT_OK ? "" : dt_last_error());
    float *f[] = {x, w, b, dout, out, eout, mean, rstd, em, er, dx, edx, dw, db, edw, edb};
    for (size_t i = 0; i < sizeof f / sizeof *f; i++) free(f[i]);
}

// The norm's sums of squares (src/gpu/optim.cu) on emulated threads:
// the whole block's (dt_gpu_sumsq) and a slice's pieces from `first` into
// a block with its carry (dt_gpu_sumsq_parts, ZeRO's sharded norm), the
// CPU's dt_sum_squares and dt_sum_squares_parts bitwise; and deterministic
// mode's fixed point (fixed_add twice, fixed_to_float) core/fixed.h's
// element by element.
static void test_sumsq(size_t n, size_t first) {
    float *x = randoms(n, 3.0f, 41), *back = malloc(sizeof(float) * (n ? n : 1));
    size_t np = (first % DT_SUMSQ_BLOCK + n + DT_SUMSQ_BLOCK - 1) / DT_SUMSQ_BLOCK + 1;
    double *part = calloc(np, sizeof(double)), *epart = calloc(np, sizeof(double)), whole = -1;
    int64_t *acc = calloc(n ? n : 1, sizeof(int64_t));
    dt_status st = dt_gpu_sumsq(&whole, x, n);
    size_t k = dt_sum_squares_parts(x, n, first, 0.25, part);
    if (st == DT_OK) st = dt_gpu_sumsq_parts(epart, x, n, first, 0.25);
    int same = !memcmp(&(double){dt_sum_squares(x, n)}, &whole, sizeof(double)) &&
               !memcmp(part, epart, sizeof(double) * np) && (n == 0 || k == np - 1);
    for (int r = 0; r < 2 && st == DT_OK; r++) st = dt_gpu_fixed_add(acc, x, n);
    if (st == DT_OK) st = dt_gpu_fixed_to_float(back, acc, n);
    for (size_t i = 0; i < n; i++) {
        int64_t want = dt_fixed_of(x[i], DT_FIXED_SCALE) * 2;
        float v = dt_fixed_value(want);
        same &= acc[i] == want && !memcmp(&v, &back[i], sizeof v);
    }
    CHECK(st == DT_OK && same, "sums of squares on emulated threads, n %zu, a slice %zu into its block: the whole "
          "block's, the slice's %zu pieces and the fixed point %s%s%s", n, first % DT_SUMSQ_BLOCK, k,
          same ? "the CPU's bits" : "NOT the CPU's bits", st == DT_OK ? "" : ": ", st == DT_OK ? "" : dt_last_error());
    free(x), free(back), free(part), free(epart), free(acc);
}

// The optimizers' kernels (src/gpu/optim.cu) on emulated threads: three
// steps of AdamW (weight decay, a gradient scale) and of SGD with
// Nesterov momentum, with the host's optimizer's constants for each step
// (dt_optim_adamw_k, dt_optim_sgd_k, as the device's update takes them),
// against the CPU's optimizer over the same block: the parameters and the
// state the CPU's bits.
static void test_optim(dt_optim_kind kind, size_t n) {
    dt_optim_params op = {kind, 0.01f, 0.1f, 0.9f, 1, 0.9f, 0.95f, 1e-8f, 0};
    dt_optim *o = NULL;
    float *w = randoms(n, 1.0f, 51), *ew = malloc(sizeof(float) * n), *g = randoms(n, 0.5f, 52);
    float *m = calloc(n, sizeof(float)), *v = calloc(n, sizeof(float));
    memcpy(ew, w, sizeof(float) * n);
    dt_status st = dt_optim_create(&o, &op, n);
    int adamw = kind == DT_OPTIM_ADAMW, same = st == DT_OK;
    for (int step = 0; step < 3 && st == DT_OK; step++) {
        dt_optim_begin_step(o);
        dt_optim_k k;
        if (adamw) k.adamw = dt_optim_adamw_k(o, 0.01f, 0.5f);
        else k.sgd = dt_optim_sgd_k(o, 0.01f, 0.5f);
        st = adamw ? dt_gpu_adamw(ew, g, m, v, n, &k.adamw, NULL) : dt_gpu_sgd(ew, g, m, n, &k.sgd, NULL);
        dt_optim_update(o, 0, n, w, g, 0.01f, 0.5f);
    }
    for (int j = 0; st == DT_OK && j < dt_optim_num_states(o); j++)
        same &= !memcmp(dt_optim_state(o, j), j ? v : m, sizeof(float) * n);
    same &= st == DT_OK && !memcmp(w, ew, sizeof(float) * n);
    CHECK(st == DT_OK && same, "%s on emulated threads, n %zu, 3 steps: the parameters and the state %s%s%s",
          adamw ? "AdamW" : "SGD with Nesterov momentum", n, same ? "the CPU's bits" : "NOT the CPU's bits",
          st == DT_OK ? "" : ": ", st == DT_OK ? "" : dt_last_error());
    dt_optim_free(o);
    free(w), free(ew), free(g), free(m), free(v);
}

int main(void) {
    // The cross-entropy's: 3 rows of 257 padded to 260, 5 of 1000, 2 of
    // GPT-2's 50257 padded to 50304.
    test_ce(3, 257, 260);
    test_ce(5, 1000, 1000);
    test_ce(2, 50257, 50304);
    test_ce_split(5, 1000);
    test_ce_split(2, 25152);
    // Layernorm's: C of 1, 97 (a column tile partly filled) and 256 (whole
    // tiles), rows past one chunk of the column sums.
    test_layernorm(3, 1);
    test_layernorm(37, 97);
    test_layernorm(70, 256);
    // The sums of squares: a block of 4096 (DT_SUMSQ_BLOCK) less one, one,
    // and one more; several blocks; slices that begin inside a block.
    const size_t sq[][2] = {{1, 0}, {4095, 0}, {4096, 0}, {4097, 0}, {5 * 4096 + 3, 0}, {10, 4090},
                            {3 * 4096, 1}, {2 * 4096 + 7, 4095}, {4096, 2048}};
    for (size_t i = 0; i < sizeof sq / sizeof *sq; i++) test_sumsq(sq[i][0], sq[i][1]);
    test_optim(DT_OPTIM_ADAMW, 1000);
    test_optim(DT_OPTIM_SGD, 1000);
    // (B, T, C, NH): T = 1, T not a multiple of the 32-row tiles, past
    // several tiles; heads of 1, 18, 32, 64, 100, 128 columns (a lane's 1,
    // 2 and 4 columns, the last partly filled).
    const int rows[][4] = {{1, 1, 64, 2}, {2, 37, 96, 3}, {1, 70, 72, 4}, {1, 33, 5, 5},
                           {1, 100, 128, 2}, {1, 45, 300, 3}, {1, 66, 256, 2}};
    for (size_t i = 0; i < sizeof rows / sizeof *rows; i++)
        test_flash(rows[i][0], rows[i][1], rows[i][2], rows[i][3], DT_F32, 1);
    // Products in bf16: heads of 32 and 5 on the CUDA cores, of 64 and 128
    // on the tensor cores (wmma, emulated), T = 1 and past two 64-row
    // tiles; in fp16 one of each kind.
    test_flash(2, 37, 96, 3, DT_BF16, 1);
    test_flash(1, 33, 5, 1, DT_BF16, 1);
    test_flash(2, 70, 128, 2, DT_BF16, 1);
    test_flash(1, 130, 256, 2, DT_BF16, 1);
    test_flash(1, 1, 64, 1, DT_BF16, 1);
    test_flash(2, 37, 96, 3, DT_F16, 1);
    test_flash(2, 70, 128, 2, DT_F16, 1);
    // fp32 with TF32 on: heads of 64 on the tensor cores (tf32 fragments,
    // k steps of 8), against the CPU's fp32 within 5e-3 (10 bits of
    // mantissa a factor); other heads stay on the CUDA cores (fp32 bits).
    dt_gpu_set_tf32(1);
    test_flash(2, 70, 128, 2, DT_F32, 1);
    test_flash(2, 70, 128, 2, DT_F32, 1e-6f);
    test_flash(1, 37, 96, 3, DT_F32, 1);
    dt_gpu_set_tf32(0);
    dt_status st = dt_gpu_flash_forward(NULL, NULL, NULL, 1, 4, 258, 1, DT_F32);
    CHECK(st == DT_ERR_ARG && strstr(dt_last_error(), "heads of 258 columns"),
          "a head of 258 columns refused by the fused kernels: %s", dt_last_error());
    return tl_finish();
}
