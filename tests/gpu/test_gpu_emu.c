/* dtrain's own CUDA kernels run on emulated threads (cuda_emu.h: a
 * block's threads fibers run from barrier to barrier) against the CPU's
 * ops, each op alone on awkward shapes, then whole training runs with
 * every op the kernel (emu_device.c) against the CPU's run: every build
 * with the CUDA toolkit runs it, so that the kernels' indexing, masks,
 * tiles and barriers are checked where no GPU is (a GPU runs the same rows
 * in test_gpu ops). The fused attention's (src/gpu/flash.cu): out and dqkv normwise within 1e-5 in fp32 (5e-3 with
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
#include "gpu/dev.h"
#include "dtrain/config.h"
#include "dtrain/nn.h"
#include "dtrain/train.h"
#include "kernels/kernels.h"
#include "testlib.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const dt_dev *dt_emu_device(void);  // (emu_device.c)
extern size_t dt_emu_optin;         // (cuda_emu.cpp: the shared memory a block may ask for)
extern int dt_emu_reversed;         // (cuda_emu.cpp: a block's threads run from the last)

static float *randoms(size_t n, float r, uint64_t seed) {
    float *a = malloc(sizeof(float) * (n ? n : 1));
    uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        a[i] = ((float)(x >> 40) / (float)(1 << 24) - 0.5f) * r;
    }
    return a;
}

static float *fdup(const float *a, size_t n) {
    float *b = malloc(sizeof(float) * (n ? n : 1));
    memcpy(b, a, sizeof(float) * n);
    return b;
}

// The elements of a and b whose bits differ.
static size_t differ(const float *a, const float *b, size_t n) {
    size_t d = 0;
    for (size_t i = 0; i < n; i++) d += memcmp(&a[i], &b[i], sizeof(float)) != 0;
    return d;
}

#define EMU_ERR(st) (st) == DT_OK ? "" : ": ", (st) == DT_OK ? "" : dt_last_error()

// The attention's forward again with its output in t (out16, 16-bit;
// fused: the kernels alone, out NULL, else the seam's op with room for
// the plan's fp32 output): want's bits (the fp32 output rounded).
static size_t attention16(const uint16_t *want, const float *qkv, void *work, int B, int T, int C, int NH, dt_dtype t,
                          int fused, dt_status *st) {
    size_t n = (size_t)B * T * C, bad = 0;
    dt_att_room room = dt_att_room_of(B, T, C, NH, t);
    float *saved = malloc(room.saved + 4), *out = fused ? NULL : malloc(sizeof(float) * n);
    uint16_t *h = malloc(2 * n);
    *st = fused ? dt_gpu_flash_forward(NULL, saved, qkv, B, T, C, NH, t, h)
                : dt_gpu_attention_forward(out, saved, qkv, work, B, T, C, NH, t, h);
    for (size_t i = 0; i < n && *st == DT_OK; i++) bad += h[i] != want[i];
    free(saved), free(out), free(h);
    return bad;
}

// gs: dout's scale; qkv g_qkv_off floats into its allocation (1: its rows
// not 16-byte aligned, which the tile loads take a float at a time).
static int g_qkv_off;
static void test_flash(int B, int T, int C, int NH, dt_dtype t, float gs) {
    double tol = t == DT_BF16 ? 1e-2 : t == DT_F16 ? 2e-3 : dt_gpu_tf32() ? 5e-3 : 1e-5;
    const char *tn = t == DT_BF16 ? "bf16" : t == DT_F16 ? "fp16" : dt_gpu_tf32() ? "fp32 with TF32" : "fp32";
    dt_att_room room = dt_att_room_of(B, T, C, NH, t);
    size_t n3 = (size_t)B * T * 3 * C, n = (size_t)B * T * C, na = (size_t)B * NH * T * T;
    size_t ns = room.saved / sizeof(float), nd = room.scratch / sizeof(float), rows = (size_t)B * NH * T;
    float *qkv0 = randoms(n3 + 1, 2, 41), *qkv = qkv0 + g_qkv_off, *dout = randoms(n, gs, 44);
    float *dq0 = randoms(n3, 0.1f * gs, 45), *out = randoms(n, 1, 42), *att = randoms(na, 1, 43);
    float *datt = randoms(na, 1, 46), *dqkv = malloc(sizeof(float) * n3);
    float *eout = randoms(n, 1, 47), *saved = randoms(ns, 1, 48), *scratch = randoms(nd, 1, 49);
    float *edq = malloc(sizeof(float) * n3), *edq2 = malloc(sizeof(float) * n3);
    // (the kernels write dqkv whole: their room starts as garbage, the CPU's op adds into zeros)
    memset(dqkv, 0, sizeof(float) * n3), memcpy(edq, dq0, sizeof(float) * n3), memcpy(edq2, dq0, sizeof(float) * n3);
    uint16_t *o16 = malloc(2 * n);  // (the output as kept in 16 bits)
    dt_status st = dt_gpu_flash_forward(eout, saved, qkv, B, T, C, NH, t, NULL);
    if (t != DT_F32) dt_from_f32(o16, eout, n, t);
    size_t bad16 = st == DT_OK && t != DT_F32 ? attention16(o16, qkv, NULL, B, T, C, NH, t, 1, &st) : 0;
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
    CHECK(st == DT_OK && dy <= tol && dq <= tol && same && !bad16,
          "fused attention %s on emulated threads, B %d T %d C %d NH %d (heads of %d%s), gradients of %g: out %.3g, "
          "dqkv %.3g (normwise, <= %g); a second backward %s; out made in 16 bits: %zu elements not its bits rounded"
          "%s%s", tn, B, T, C, NH, C / NH, g_qkv_off ? ", rows not 16-byte aligned" : "", gs, dy, dq, tol,
          same ? "the same bits" : "OTHER BITS", bad16,
          st == DT_OK ? "" : ": ", st == DT_OK ? "" : dt_last_error());
    free(o16);
    float *f[] = {qkv0, dout, dq0, out, att, datt, dqkv, eout, saved, scratch, edq, edq2};
    for (size_t i = 0; i < sizeof f / sizeof *f; i++) free(f[i]);
}

// The cross-entropy's kernels (src/gpu/layers.cu) on emulated threads, N
// rows of V logits ld apart (the padding -7, never written): the forward
// (probabilities, the loss) and the backward onto zeros against the CPU's
// within 1e-5, and the fused pass (dt_gpu_crossentropy_fused: the
// gradient written over the logits) the two kernels' bits, and with its
// gradient in bf16 and fp16 (room of its own) that gradient's bits
// rounded, the logits and the room's padding untouched; a target outside
// the row a NaN loss.
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
    if (st == DT_OK) st = dt_gpu_crossentropy_fused(fl, rows2, &loss2[1], t, N, V, ld, 0.75f, NULL, DT_F32);
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
          "the loss %.3g (<= 1e-5); the fused pass (%s) %s the two kernels' bits; padding %s%s%s", N, V, ld, dp, dd,
          dl, dt_emu_optin ? "its row in shared memory" : "its row read from memory three times",
          same ? "has" : "DOES NOT HAVE", kept ? "kept" : "WRITTEN", st == DT_OK ? "" : ": ",
          st == DT_OK ? "" : dt_last_error());
    uint16_t *h = malloc(2 * nl), *want = malloc(2 * nl);
    float *l2 = fdup(pl, nl), loss3;
    for (int k = 0; k < 2; k++) {
        dt_dtype t16 = k ? DT_F16 : DT_BF16;
        for (size_t i = 0; i < nl; i++) h[i] = 0xabcd;
        st = dt_gpu_crossentropy_fused(l2, rows, &loss3, t, N, V, ld, 0.75f, h, t16);
        dt_from_f32(want, fl, nl, t16);
        int ok = st == DT_OK && !memcmp(l2, pl, sizeof(float) * nl) && !memcmp(rows, rows2, sizeof(double) * N) &&
                 !memcmp(&loss3, &loss2[1], sizeof loss3);
        for (size_t i = 0; i < nl && ok; i++) ok = i % ld < (size_t)V ? h[i] == want[i] : h[i] == 0xabcd;
        CHECK(ok, "cross-entropy fused on emulated threads, N %zu V %d ld %zu, its gradient in %s: the fused pass's "
              "bits rounded, the losses the same, the logits and the padding untouched%s%s", N, V, ld,
              dt_dtype_name(t16), EMU_ERR(st));
    }
    free(h), free(want), free(l2);
    t[0] = V;  // (outside the row)
    for (size_t i = 0; i < nl; i++) fl[i] = i % ld < (size_t)V ? l[i / ld * V + i % ld] : -7.0f;
    st = dt_gpu_crossentropy_fused(fl, rows2, &loss2[1], t, N, V, ld, 0.75f, NULL, DT_F32);
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

// Layernorm's outputs in 16 bits (out16; alone and with the residual):
// the fp32 output's bits rounded to t, the fp32 out not written, the sum
// the same.
static void layernorm16(const float *x, const float *w, const float *b, const float *dout, size_t N, int C,
                        dt_dtype t) {
    size_t n = N * (size_t)C, bad = 0;
    float *o = malloc(sizeof(float) * n), *m = malloc(sizeof(float) * N), *r = malloc(sizeof(float) * N);
    float *r1 = fdup(dout, n), *r2 = fdup(dout, n);
    uint16_t *h = malloc(2 * n), *want = malloc(2 * n);
    dt_status st = DT_OK;
    for (int res = 0; res < 2 && st == DT_OK; res++) {
        st = res ? dt_gpu_layernorm_residual(o, m, r, r1, x, r1, w, b, N, C, 1e-5f, NULL, DT_F32)
                 : dt_gpu_layernorm_forward(o, m, r, x, w, b, N, C, 1e-5f, NULL, DT_F32);
        dt_from_f32(want, o, n, t);
        for (size_t i = 0; i < n; i++) o[i] = 7.0f;
        if (st == DT_OK)
            st = res ? dt_gpu_layernorm_residual(o, m, r, r2, x, r2, w, b, N, C, 1e-5f, h, t)
                     : dt_gpu_layernorm_forward(o, m, r, x, w, b, N, C, 1e-5f, h, t);
        for (size_t i = 0; i < n; i++) bad += h[i] != want[i] || o[i] != 7.0f;
    }
    bad += differ(r1, r2, n);
    CHECK(st == DT_OK && !bad, "layernorm on emulated threads, N %zu C %d, its output in %s (alone, with the "
          "residual): the fp32 output's bits rounded, out not written, the sum the same: %zu elements wrong%s%s", N, C,
          dt_dtype_name(t), bad, EMU_ERR(st));
    free(o), free(m), free(r), free(r1), free(r2), free(h), free(want);
}

// Layernorm's kernels (src/gpu/layers.cu: a block a row; the weights'
// gradients as column sums over chunks of rows, a grid of column tiles x
// chunks) on emulated threads against the CPU's, forward and backward,
// within 1e-5 (relative, absolute below 1, as test_gpu ops); the backward
// adds onto what dinp, dw and db held; the output in bf16 and fp16
// (layernorm16).
static void test_layernorm(size_t N, int C) {
    size_t n = N * (size_t)C;
    float *x = randoms(n, 4.0f, 31), *w = randoms((size_t)C, 2.0f, 32), *b = randoms((size_t)C, 1.0f, 33);
    float *dout = randoms(n, 1.0f, 34), *out = malloc(sizeof(float) * n), *eout = malloc(sizeof(float) * n);
    float *mean = malloc(sizeof(float) * N), *rstd = malloc(sizeof(float) * N), *em = malloc(sizeof(float) * N);
    float *er = malloc(sizeof(float) * N), *dx = randoms(n, 0.1f, 35), *edx = malloc(sizeof(float) * n);
    float *dw = randoms((size_t)C, 0.1f, 36), *db = randoms((size_t)C, 0.1f, 37);
    float *edw = malloc(sizeof(float) * C), *edb = malloc(sizeof(float) * C);
    memcpy(edx, dx, sizeof(float) * n), memcpy(edw, dw, sizeof(float) * C), memcpy(edb, db, sizeof(float) * C);
    dt_status st = dt_gpu_layernorm_forward(eout, em, er, x, w, b, N, C, 1e-5f, NULL, DT_F32);
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
    // with the residual in the same pass, in place (res is b, then a): the two kernels' bits
    float *sum = fdup(dout, n), *fo = malloc(sizeof(float) * n), *fm = malloc(sizeof(float) * N);
    float *fr = malloc(sizeof(float) * N), *res = fdup(dout, n), *res2 = fdup(x, n);
    if (st == DT_OK) st = dt_gpu_residual_forward(sum, x, sum, n);
    if (st == DT_OK) st = dt_gpu_layernorm_forward(eout, em, er, sum, w, b, N, C, 1e-5f, NULL, DT_F32);
    if (st == DT_OK) st = dt_gpu_layernorm_residual(fo, fm, fr, res, x, res, w, b, N, C, 1e-5f, NULL, DT_F32);
    size_t f4[4] = {differ(sum, res, n), differ(eout, fo, n), differ(em, fm, N), differ(er, fr, N)};
    if (st == DT_OK) st = dt_gpu_layernorm_residual(fo, fm, fr, res2, res2, dout, w, b, N, C, 1e-5f, NULL, DT_F32);
    f4[0] += differ(sum, res2, n), f4[1] += differ(eout, fo, n), f4[2] += differ(em, fm, N), f4[3] += differ(er, fr, N);
    CHECK(st == DT_OK && !f4[0] && !f4[1] && !f4[2] && !f4[3], "layernorm with the residual on emulated threads, N %zu "
          "C %d: elements differing from the two kernels' (sum %zu, out %zu, mean %zu, rstd %zu; 0)%s%s", N, C, f4[0],
          f4[1], f4[2], f4[3], EMU_ERR(st));
    free(sum), free(fo), free(fm), free(fr), free(res), free(res2);
    layernorm16(x, w, b, dout, N, C, DT_BF16);
    layernorm16(x, w, b, dout, N, C, DT_F16);
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

// The embedding's kernels (src/gpu/gpt.cu: the positions sorted by token,
// cub's stable sort on a GPU, a host sort here; a block a token's run) on
// emulated threads: forward, and backward onto what the gradients held,
// the CPU's bits; Vl > 0: a tensor-parallel shard's rows [v0, v0 + Vl) of
// a vocabulary of V (other tokens zeros, their rows untouched).
static void test_encoder(int B, int T, int C, int V, int v0, int Vl) {
    size_t BT = (size_t)B * T, n = BT * C, nw = (size_t)(Vl ? Vl : V) * C, np = (size_t)T * C;
    int32_t *inp = malloc(sizeof(int32_t) * BT);
    float *r = randoms(BT, 1.0f, 21);
    for (size_t i = 0; i < BT; i++) inp[i] = (int32_t)((r[i] + 0.5f) * (float)V) % V;  // (repeated tokens)
    float *wte = randoms(nw, 2, 24), *wpe = randoms(np, 2, 25), *out = randoms(n, 1, 26), *dout = randoms(n, 1, 27);
    float *dwte = randoms(nw, 0.1f, 28), *dwpe = randoms(np, 0.1f, 29);
    float *eout = fdup(out, n), *edwte = fdup(dwte, nw), *edwpe = fdup(dwpe, np);
    dt_status st;
    if (Vl) {
        st = dt_gpu_encoder_split_forward(eout, inp, wte, wpe, B, T, C, v0, Vl);
        if (st == DT_OK) st = dt_gpu_encoder_split_backward(edwte, edwpe, dout, inp, B, T, C, v0, Vl);
        dt_encoder_split_forward(out, inp, wte, wpe, B, T, C, v0, Vl);
        dt_encoder_split_backward(dwte, dwpe, dout, inp, B, T, C, v0, Vl);
    } else {
        st = dt_gpu_encoder_forward(eout, inp, wte, wpe, B, T, C);
        if (st == DT_OK) st = dt_gpu_encoder_backward(edwte, edwpe, dout, inp, B, T, C);
        dt_encoder_forward(out, inp, wte, wpe, B, T, C);
        dt_encoder_backward(dwte, dwpe, dout, inp, B, T, C);
    }
    size_t d[3] = {differ(out, eout, n), differ(dwte, edwte, nw), differ(dwpe, edwpe, np)};
    CHECK(st == DT_OK && !d[0] && !d[1] && !d[2], "the embedding on emulated threads, B %d T %d C %d V %d, rows [%d, "
          "%d): elements differing from the CPU's bits: out %zu, dwte %zu, dwpe %zu (0)%s%s", B, T, C, V, v0,
          Vl ? v0 + Vl : V, d[0], d[1], d[2], EMU_ERR(st));
    float *f[] = {r, wte, wpe, out, dout, dwte, dwpe, eout, edwte, edwpe};
    for (size_t i = 0; i < sizeof f / sizeof *f; i++) free(f[i]);
    free(inp);
}

// The elementwise kernels (gpt.cu's residual, layers.cu's ReLU, GELU and
// bias) on emulated threads: the CPU's bits (GELU: within 1e-5 as test_gpu
// ops, its bits said); the bias's gradient (column sums over chunks of
// rows) within 1e-5 of each column's sum of |terms|, the same bits twice.
static void test_elementwise(size_t n, int OC) {
    size_t N = n / (size_t)OC;
    float *a = randoms(n, 12, 31), *b = randoms(n, 2, 32), *dout = randoms(n, 1, 34), *bias = randoms((size_t)OC, 2, 35);
    float *out = randoms(n, 1, 33), *da = randoms(n, 1, 36), *db = randoms(n, 1, 37), *db2 = randoms((size_t)OC, 1, 38);
    float *e[6], *c[6], *cdb = fdup(db, n);
    for (int i = 0; i < 6; i++) c[i] = fdup(i < 3 ? out : da, n), e[i] = fdup(c[i], n);
    dt_status st = dt_gpu_residual_forward(e[0], a, b, n);
    if (st == DT_OK) st = dt_gpu_relu_forward(e[1], a, n);
    if (st == DT_OK) st = dt_gpu_gelu_forward(e[2], a, n, NULL, DT_F32);
    if (st == DT_OK) st = dt_gpu_residual_backward(e[3], db, dout, n);
    if (st == DT_OK) st = dt_gpu_relu_backward(e[4], dout, a, n);
    if (st == DT_OK) st = dt_gpu_gelu_backward(e[5], dout, a, n);
    dt_residual_forward(c[0], a, b, n);
    dt_relu_forward(c[1], a, n);
    dt_gelu_forward(c[2], a, n);
    dt_residual_backward(c[3], cdb, dout, n);
    dt_relu_backward(c[4], dout, a, n);
    dt_gelu_backward(c[5], dout, a, n);
    size_t d[6];
    for (int i = 0; i < 6; i++) d[i] = differ(c[i], e[i], n);
    size_t dres = differ(cdb, db, n);  // (the emulated residual backward added dout to db too)
    double g[2] = {tl_max_rel(c[2], e[2], n, 1.0), tl_max_rel(c[5], e[5], n, 1.0)};
    CHECK(st == DT_OK && !d[0] && !d[1] && !d[3] && !d[4] && !dres && g[0] <= 1e-5 && g[1] <= 1e-5,
          "residual, ReLU, GELU on emulated threads, n %zu: elements differing from the CPU's bits: residual %zu, its "
          "backward %zu and %zu, ReLU %zu, its backward %zu (0); GELU %.3g, backward %.3g (<= 1e-5; %zu and %zu "
          "elements not the CPU's bits)%s%s", n, d[0], d[3], dres, d[1], d[4], g[0], g[1], d[2], d[5], EMU_ERR(st));
    // GELU's output in bf16 and fp16 (out16): the fp32 output's bits rounded, out not written
    uint16_t *h16 = malloc(2 * n), *w16 = malloc(2 * n);
    float *o7 = malloc(sizeof(float) * n);
    size_t wrong = 0;
    for (int k = 0; k < 2 && st == DT_OK; k++) {
        dt_dtype t = k ? DT_F16 : DT_BF16;
        for (size_t i = 0; i < n; i++) o7[i] = 7.0f;
        st = dt_gpu_gelu_forward(o7, a, n, h16, t);
        dt_from_f32(w16, e[2], n, t);
        for (size_t i = 0; i < n; i++) wrong += h16[i] != w16[i] || o7[i] != 7.0f;
    }
    CHECK(st == DT_OK && !wrong, "GELU on emulated threads, n %zu, its output in bf16 and fp16: %zu elements not the "
          "fp32 output's bits rounded, or out written (0)%s%s", n, wrong, EMU_ERR(st));
    free(h16), free(w16), free(o7);
    // the bias: out += b, db += dout's column sums (twice from the same start: the same bits; and rounding dout
    // to bf16 and fp16 on the way: to16's bits)
    float *eo = fdup(out, N * OC), *edb = fdup(db2, (size_t)OC), *edb2 = fdup(db2, (size_t)OC), *mag = calloc((size_t)OC, 4);
    if (st == DT_OK) st = dt_gpu_bias_forward(eo, bias, N, OC);
    if (st == DT_OK) st = dt_gpu_bias_backward(edb, dout, N, OC, NULL, DT_F32);
    if (st == DT_OK) st = dt_gpu_bias_backward(edb2, dout, N, OC, NULL, DT_F32);
    uint16_t *h = malloc(2 * N * OC), *want = malloc(2 * N * OC);
    size_t wrong16 = 0;
    for (int k = 0; k < 2 && st == DT_OK; k++) {
        dt_dtype t = k ? DT_F16 : DT_BF16;
        float *edb3 = fdup(db2, (size_t)OC);
        st = dt_gpu_bias_backward(edb3, dout, N, OC, h, t);
        dt_from_f32(want, dout, N * OC, t);
        wrong16 += differ(edb, edb3, (size_t)OC);
        for (size_t i = 0; i < N * OC; i++) wrong16 += h[i] != want[i];
        free(edb3);
    }
    free(h), free(want);
    CHECK(st == DT_OK && wrong16 == 0, "the bias's gradient on emulated threads, N %zu OC %d, rounding dout to bf16 "
          "and fp16 on the way: %zu elements of db or of the roundings differ (0)%s%s", N, OC, wrong16, EMU_ERR(st));
    double worst = 0;
    size_t bo = 0;
    for (size_t i = 0; i < N * OC; i++) {
        float x = out[i] + bias[i % OC];
        bo += memcmp(&x, &eo[i], sizeof x) != 0;
        db2[i % OC] += dout[i], mag[i % OC] += fabsf(dout[i]);
    }
    for (int o = 0; o < OC; o++) {
        double r = fabs((double)edb[o] - db2[o]) / (mag[o] + 1e-30);
        worst = r > worst ? r : worst;
    }
    CHECK(st == DT_OK && bo == 0 && worst <= 1e-5 && !differ(edb, edb2, (size_t)OC), "the bias on emulated threads, N "
          "%zu OC %d: forward %zu elements not the CPU's bits (0); its gradient %.3g (|diff| / sum |terms| <= 1e-5), "
          "%s twice%s%s", N, OC, bo, worst, differ(edb, edb2, (size_t)OC) ? "OTHER BITS" : "the same bits", EMU_ERR(st));
    float *f[] = {a, b, dout, bias, out, da, db, db2, cdb, eo, edb, edb2, mag};
    for (size_t i = 0; i < sizeof f / sizeof *f; i++) free(f[i]);
    for (int i = 0; i < 6; i++) free(e[i]), free(c[i]);
}

// The 16-bit conversions (src/gpu/convert.cu) on emulated threads: to t
// and back, and error feedback's rounding twice on one residual,
// dt_from_f32's, dt_to_f32's and dt_from_f32_ef's bits (specials: zeros,
// ties, the largest finite, infinities, NaNs (any NaN for a NaN),
// subnormals).
static void test_convert(dt_dtype t, size_t n) {
    const uint32_t special[] = {0x00000000u, 0x80000000u, 0x3f808000u, 0x3f818000u, 0x7f7fffffu, 0x7f800000u,
                                0xff800000u, 0x7fc00000u, 0x00000001u, 0x807fffffu, 0x477fe000u, 0x477ff000u,
                                0x33000000u, 0x33000001u, 0x387fc000u, 0x3f801000u};
    size_t ns = sizeof special / sizeof *special;
    float *x = randoms(n + ns, t == DT_BF16 ? 1e4f : 1e3f, 91), *back = malloc(sizeof(float) * (n + ns));
    float *eback = malloc(sizeof(float) * (n + ns));
    memcpy(x, special, sizeof special);
    uint16_t *h = malloc(2 * (n + ns)), *eh = malloc(2 * (n + ns));
    dt_status st = dt_gpu_from_f32(eh, x, n + ns, t);
    dt_from_f32(h, x, n + ns, t);
    if (st == DT_OK) st = dt_gpu_to_f32(eback, h, n + ns, t);
    dt_to_f32(back, h, n + ns, t);
    size_t bh = 0, bb = 0;
    for (size_t i = 0; i < n + ns; i++) {
        bh += h[i] != eh[i] && !(isnan(back[i]) && (t == DT_BF16 ? (eh[i] & 0x7fff) > 0x7f80 : (eh[i] & 0x7fff) > 0x7c00));
        bb += memcmp(&back[i], &eback[i], 4) && !(isnan(back[i]) && isnan(eback[i]));
    }
    float *g[2] = {randoms(n, t == DT_BF16 ? 1e4f : 1e3f, 97), randoms(n, 1e-2f, 98)};
    float *res = calloc(n, sizeof(float)), *eres = calloc(n, sizeof(float));
    size_t bad = 0;
    for (int k = 0; k < 2 && st == DT_OK; k++) {
        float *eg = fdup(g[k], n);
        st = dt_gpu_from_f32_ef(eh, eg, eres, n, t);
        dt_from_f32_ef(h, g[k], res, n, t);
        for (size_t i = 0; i < n; i++) bad += h[i] != eh[i];
        bad += differ(g[k], eg, n) + differ(res, eres, n);
        free(eg);
    }
    const char *tn = t == DT_BF16 ? "bf16" : "fp16";
    CHECK(st == DT_OK && !bh && !bb && !bad, "%s conversions on emulated threads, %zu values (%zu special): to %s %zu "
          "differ, back %zu differ, error feedback's two steps %zu differ (0)%s%s", tn, n + ns, ns, tn, bh, bb, bad,
          EMU_ERR(st));
    free(x), free(back), free(eback), free(h), free(eh), free(g[0]), free(g[1]), free(res), free(eres);
}

// The CNN's kernels (src/gpu/cnn.cu) on emulated threads: im2col, col2im
// (adding), a transpose, max pooling (K x K, stride K) forward and
// backward, dropout p = 0.3 (each sample's stream, after 7 draws: a
// tensor-parallel shard's part) and its backward, the CPU's bits.
static void test_cnn(int B, int C, int H, int W, int K, int S, int P) {
    dt_im2col_t g = {C, H, W, K, S, P, (H + 2 * P - K) / S + 1, (W + 2 * P - K) / S + 1};
    size_t nx = (size_t)B * C * H * W, ncol = (size_t)B * g.OH * g.OW, ck = (size_t)C * K * K, nc = ck * ncol;
    float *x = randoms(nx, 2, 61), *col = calloc(nc, 4), *ecol = calloc(nc, 4), *dx = randoms(nx, 1, 62);
    float *edx = fdup(dx, nx), *t = calloc(nc, 4), *et = calloc(nc, 4);
    for (size_t i = 0; i < nc; i++) col[i] = dt_im2col_at(x, &g, i / ncol, i % ncol);
    dt_status st = dt_gpu_im2col(ecol, x, (size_t)B, &g);
    for (size_t i = 0; i < nx; i++) dx[i] += dt_col2im_at(col, &g, (size_t)B, i);
    if (st == DT_OK) st = dt_gpu_col2im(edx, col, (size_t)B, &g);
    for (size_t i = 0; i < nc; i++) t[i] = col[dt_transpose_src(i, ck, ncol)];
    if (st == DT_OK) st = dt_gpu_transpose(et, col, 1, ck, ncol);
    size_t d[7] = {differ(col, ecol, nc), differ(dx, edx, nx), differ(t, et, nc)};
    int OH = (H - K) / K + 1, OW = (W - K) / K + 1;
    size_t no = (size_t)B * C * OH * OW, per = (size_t)C * H * W;
    float *out = calloc(no, 4), *eout = calloc(no, 4), *dy = randoms(no, 1, 63), *px = randoms(nx, 1, 64);
    float *epx = fdup(px, nx), *mask = calloc(nx, 4), *emask = calloc(nx, 4), *dr = calloc(nx, 4), *edr = calloc(nx, 4);
    float *bx = randoms(nx, 1, 65), *ebx = fdup(bx, nx);
    int32_t *arg = calloc(no, 4), *earg = calloc(no, 4);
    dt_maxpool_forward(out, arg, x, B, C, H, W, K, K);
    dt_maxpool_backward(px, dy, arg, B, C, H, W, K, K);
    if (st == DT_OK) st = dt_gpu_maxpool_forward(eout, earg, x, (size_t)B * C, H, W, K, K);
    if (st == DT_OK) st = dt_gpu_maxpool_backward(epx, dy, earg, (size_t)B * C, H, W, K, K);
    d[3] = differ(out, eout, no) + (size_t)(memcmp(arg, earg, 4 * no) != 0), d[4] = differ(px, epx, nx);
    for (int j = 0; j < B; j++) {
        dt_rng r;
        dt_rng_seed(&r, dt_dropout_seed(5, 9, (uint64_t)(40 + j), 3));
        for (int k = 0; k < 7; k++) dt_rng_uniform(&r);
        dt_dropout_forward(dr + (size_t)j * per, mask + (size_t)j * per, x + (size_t)j * per, per, 0.3f, &r);
    }
    if (st == DT_OK) st = dt_gpu_dropout_forward(edr, emask, x, B, per, 0.3f, 5, 9, 40, 3, 7);
    if (st == DT_OK) st = dt_gpu_dropout_backward(ebx, dx, emask, nx);
    dt_dropout_backward(bx, dx, mask, nx);
    d[5] = differ(mask, emask, nx) + differ(dr, edr, nx), d[6] = differ(bx, ebx, nx);
    CHECK(st == DT_OK && !d[0] && !d[1] && !d[2] && !d[3] && !d[4] && !d[5] && !d[6], "the CNN's kernels on emulated "
          "threads, B %d C %d %dx%d K %d S %d P %d: elements differing from the CPU's bits: columns %zu, their gradient "
          "back %zu, transposed %zu, pooled %zu, its gradient %zu, dropout %zu, its gradient %zu (0)%s%s", B, C, H, W, K,
          S, P, d[0], d[1], d[2], d[3], d[4], d[5], d[6], EMU_ERR(st));
    float *f[] = {x, col, ecol, dx, edx, t, et, out, eout, dy, px, epx, mask, emask, dr, edr, bx, ebx};
    for (size_t i = 0; i < sizeof f / sizeof *f; i++) free(f[i]);
    free(arg), free(earg);
}

// The attention of heads too large for the fused kernels
// (src/gpu/attention.cu: att_plan.c's GEMMs, the CPU's GEMMs here, and the
// softmax's kernels, a warp a row) on emulated threads against the CPU's:
// out and dqkv normwise within 1e-5 in fp32 (1e-2 bf16, 2e-3 fp16, on the
// CPU's attention in that precision), the probabilities each within 1e-5
// and datt normwise, the entries right of the diagonal zeros; the backward
// on the CPU's probabilities.
static void test_attention(int B, int T, int C, int NH, dt_dtype t) {
    double tol = t == DT_BF16 ? 1e-2 : t == DT_F16 ? 2e-3 : 1e-5;
    dt_att_room room = dt_att_room_of(B, T, C, NH, t);
    size_t n3 = (size_t)B * T * 3 * C, n = (size_t)B * T * C, na = (size_t)B * NH * T * T;
    float *qkv = randoms(n3, 2, 41), *out = randoms(n, 1, 42), *att = randoms(na, 1, 43), *dout = randoms(n, 1, 44);
    float *dqkv = randoms(n3, 0.1f, 45), *datt = randoms(na, 1, 46), *eatt = randoms(room.saved / 4 + na, 1, 47);
    float *eout = fdup(out, n), *edq = fdup(dqkv, n3), *edatt = randoms(room.scratch / 4 + na, 1, 48);
    memset(dqkv, 0, sizeof(float) * n3);  // (the plan writes edq whole; the CPU's op adds into zeros)
    void *work = malloc(room.work + 1);
    uint16_t *o16 = malloc(2 * n);
    dt_status st = dt_att_fused(C, NH) ? DT_ERR_ARG : DT_OK;
    if (st == DT_OK) st = dt_gpu_attention_forward(eout, eatt, qkv, work, B, T, C, NH, t, NULL);
    dt_kernels_set_precision(t);
    dt_attention_forward(out, att, qkv, B, T, C, NH);
    dt_kernels_set_precision(DT_F32);
    double dy = tl_normwise(out, eout, n), dp = tl_max_rel(att, eatt, na, 1e-30);
    size_t upper = 0;
    for (size_t i = 0; i < na; i++) upper += i % T > i / T % T && eatt[i] != 0.0f;
    memcpy(eatt, att, sizeof(float) * na);
    if (t != DT_F32) dt_from_f32(o16, eout, n, t);
    size_t bad16 = st == DT_OK && t != DT_F32 ? attention16(o16, qkv, work, B, T, C, NH, t, 0, &st) : 0;
    if (st == DT_OK)
        st = dt_gpu_attention_backward(edq, edatt, dout, qkv, t == DT_F32 ? (const void *)eout : o16, eatt, work, B, T,
                                       C, NH, t);
    dt_kernels_set_precision(t);
    dt_attention_backward(dqkv, datt, dout, qkv, att, B, T, C, NH);
    dt_kernels_set_precision(DT_F32);
    for (size_t i = 0; i < na; i++) {  // (the CPU leaves its scratch right of the diagonal as it was)
        if (i % T > i / T % T) upper += edatt[i] != 0.0f, datt[i] = 0.0f;
    }
    double dq = tl_normwise(dqkv, edq, n3), dd = tl_normwise(datt, edatt, na);
    const char *tn = t == DT_BF16 ? "bf16" : t == DT_F16 ? "fp16" : "fp32";
    CHECK(st == DT_OK && dy <= tol && dp <= 1e-5 && dq <= tol && dd <= tol && !upper && !bad16, "the attention's "
          "GEMM plan (%s) on emulated threads, B %d T %d C %d NH %d (heads of %d): out %.3g, dqkv %.3g, datt %.3g "
          "(normwise, <= %g), att %.3g (<= 1e-5), %zu entries right of the diagonal not zero (0); out made in 16 "
          "bits: %zu elements not its bits rounded (0)%s%s", tn, B, T, C, NH, C / NH, dy, dq, dd, tol, dp, upper,
          bad16, EMU_ERR(st));
    float *f[] = {qkv, out, att, dout, dqkv, datt, eatt, eout, edq, edatt};
    for (size_t i = 0; i < sizeof f / sizeof *f; i++) free(f[i]);
    free(work), free(o16);
}

// ---- whole runs on the kernels: the device model's steps, each op the CUDA
// kernel (emu_device.c), against the CPU's run in this process ----------------

enum { RUN_STEPS = 20 };
static char g_dir[64];

static void step_loss(const dt_progress *p, void *user) {
    if (p->step >= 1 && p->step <= RUN_STEPS) ((double *)user)[p->step] = p->loss;
}

// A run of the config `text` (with extra "section.key=value"s) on the CPU
// or (emulated) on the kernels; its steps' losses in loss[1..].
static dt_status run(const char *text, const char *const *extra, int n, int emulated, double *loss) {
    char path[128];
    snprintf(path, sizeof path, "%s/run.ini", g_dir);
    FILE *f = fopen(path, "w");
    if (!f || fputs(text, f) < 0 || fclose(f)) return dt_error(DT_ERR_IO, "%s: cannot write", path);
    const char *over[8] = {emulated ? "train.device=cuda" : "train.device=cpu", "train.cuda_graph=false"};
    n = n < 6 ? n : 6;
    for (int i = 0; i < n; i++) over[2 + i] = extra[i];
    dt_config c;
    dt_status st = dt_config_load(&c, path, over, 2 + n);
    if (st != DT_OK) return st;
    dt_dev_set(emulated ? dt_emu_device() : NULL);
    dt_train_result r;
    st = dt_train(&c, NULL, step_loss, loss, &r);
    dt_dev_set(NULL);
    return st;
}

// The run on the kernels against the CPU's: every step's loss within tol
// of the CPU's (step 1 within 1e-5, as the GPU's runs are held to). The
// GEMMs are the CPU's here, so the differences are the kernels' sums'
// order: fp32 held to 1e-5 (measured: 0 for the GPT and the CNN, 1.2e-7
// for the MLP), bf16 to the GPU's 1e-2 (2.1e-4).
static void train_on_kernels(const char *what, const char *text, const char *const *extra, int n, double tol) {
    double a[RUN_STEPS + 1] = {0}, b[RUN_STEPS + 1] = {0}, worst = 0, t0 = dt_now();
    dt_status sa = run(text, extra, n, 0, a);
    double t1 = dt_now();
    char err[300] = "";
    if (sa != DT_OK) snprintf(err, sizeof err, "the CPU's run: %s", dt_last_error());
    dt_status sb = sa == DT_OK ? run(text, extra, n, 1, b) : sa;
    double t2 = dt_now();
    if (sa == DT_OK && sb != DT_OK) snprintf(err, sizeof err, "the kernels' run: %s", dt_last_error());
    int s1 = fabs(b[1] - a[1]) <= 1e-5 * fabs(a[1]);
    for (int s = 1; s <= RUN_STEPS; s++) {
        double r = fabs(b[s] - a[s]) / fabs(a[s]);
        worst = r > worst ? r : worst;
    }
    CHECK(sb == DT_OK && a[RUN_STEPS] > 0 && s1 && worst <= tol, "%s, %d steps on the CUDA kernels (emulated threads) "
          "against the CPU: step 1's loss %.9g and %.9g (within 1e-5), the worst step's relative difference %.3g (<= %g)"
          "%s%s", what, RUN_STEPS, b[1], a[1], worst, tol, *err ? ": " : "", err);
    printf("%s on the kernels: step 1's loss %.9g (the CPU's %.9g), step %d's %.9g (%.9g); the worst step's relative "
           "difference %.3g (%.1f s, the CPU's %.1f s)\n", what, b[1], a[1], RUN_STEPS, b[RUN_STEPS], a[RUN_STEPS], worst,
           t2 - t1, t1 - t0);
}

static void test_training(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/dtrain-test-gpu-emu-XXXXXX");
    if (!mkdtemp(g_dir)) {
        CHECK(0, "mkdtemp: %s", g_dir);
        return;
    }
    enum { N = 4000 };
    uint16_t *t = malloc(sizeof(uint16_t) * N);
    float *u = randoms(N, 1.0f, 71);
    t[0] = 0;  // (a learnable sequence with noise)
    for (size_t i = 1; i < N; i++)
        t[i] = u[i] > -0.3f ? (uint16_t)((5 * t[i - 1] + 3) % 32) : (uint16_t)((u[i] + 0.5f) * 64.0f) % 32;
    char train[128], val[128], text[2048];
    snprintf(train, sizeof train, "%s/train.bin", g_dir);
    snprintf(val, sizeof val, "%s/val.bin", g_dir);
    CHECK(dt_tokens_write(train, t, N) == DT_OK && dt_tokens_write(val, t, 1000) == DT_OK, "token files: %s",
          dt_last_error());
    free(t), free(u);
    snprintf(text, sizeof text,
             "[model]\npreset = gpt\nn_layer = 2\nn_head = 2\nn_embd = 16\nblock_size = 8\nvocab_size = 32\n"
             "[data]\ndataset = tokens\ntrain_file = %s\nval_file = %s\n"
             "[optim]\nname = adamw\nlr = 0.01\nclip_norm = 1.0\n[schedule]\nname = cosine\nwarmup_steps = 5\n"
             "[train]\nbatch = 6\nseq_len = 8\nmax_steps = %d\neval_every = 10\neval_batches = 1\nseed = 5\n",
             train, val, RUN_STEPS);
    train_on_kernels("a tiny GPT (AdamW, clipping)", text, NULL, 0, 1e-5);
    const char *bf16[] = {"train.precision=bf16"};
    train_on_kernels("a tiny GPT in bf16", text, bf16, 1, 1e-2);
    // its heads of 8 on the GEMM plan ([train] attention = gemm), in fp32 and bf16 (the plan's rounded copies)
    const char *gemm[] = {"train.attention=gemm", "train.precision=bf16"};
    train_on_kernels("a tiny GPT, attention = gemm", text, gemm, 1, 1e-5);
    train_on_kernels("a tiny GPT in bf16, attention = gemm", text, gemm, 2, 1e-2);
    // heads of 130: the attention's GEMM plan (a smaller step: at 0.01 this width's losses jump about from step
    // to step, and a last bit's difference grows to percents in 20 steps, on the CPU's kernels too)
    const char *wide[] = {"model.n_embd=260", "model.n_layer=1", "optim.lr=0.0005"};
    train_on_kernels("a GPT of heads of 130", text, wide, 3, 1e-5);
    tl_make_images(g_dir, "train", 400, 1);
    tl_make_images(g_dir, "t10k", 64, 2);
    snprintf(text, sizeof text,
             "[model]\nlayer = flatten\nlayer = linear out=48\nlayer = relu\nlayer = layernorm\nlayer = linear "
             "out=24\nlayer = gelu\nlayer = dropout p=0\nlayer = linear out=10\n"
             "[train]\nbatch = 16\nepochs = 1\nmax_steps = %d\nseed = 3\n"
             "[optim]\nname = adamw\nlr = 0.003\nweight_decay = 0.01\nclip_norm = 0.5\n[data]\ndir = %s\n",
             RUN_STEPS, g_dir);
    train_on_kernels("the MLP (AdamW, clipping)", text, NULL, 0, 1e-5);
    const char *sgd[] = {"optim.name=sgd", "optim.lr=0.05", "optim.momentum=0.9", "optim.nesterov=true"};
    train_on_kernels("the MLP (SGD, Nesterov momentum)", text, sgd, 4, 1e-5);
    snprintf(text, sizeof text, "%s[data]\ndir = %s\n[train]\nbatch = 16\nmax_steps = %d\nseed = 7\n", tl_cfg_cnn,
             g_dir, RUN_STEPS);
    train_on_kernels("the CNN (im2col, max pooling, dropout)", text, NULL, 0, 1e-5);
    tl_cleanup(g_dir);
}

// Past 2^31 elements (the kernels' indices are 64-bit: docs/gpu.md), by
// hand only (`test_gpu_emu large`: 13 GB of memory, minutes of one core):
// GPT-2's head at 42800 rows (B T past 41 x 1024) of 50257 logits 50304
// apart, 2.153e9 floats, through the fused cross-entropy, its gradient
// first in bf16 into room of its own, then over the logits; the rows that
// hold element 2^31, the next and the last each against the same kernel
// on that row alone (its bits: a row read or written at a wrapped index
// differs), every row's loss in the mean (summed in order on the host,
// its bits), the padding untouched; then the gradient's 2.153e9 floats
// rounded to bf16 (about 2^31 and at the end against the CPU's bits) and
// their sum of squares (the CPU's dt_sum_squares's bits).
static void test_large(void) {
    enum { V = 50257 };
    const size_t N = 42800, ld = 50304, nl = N * ld, two31 = (size_t)1 << 31;
    const size_t pick[3] = {two31 / ld, two31 / ld + 1, N - 1};
    float *l = malloc(sizeof(float) * nl), *one[3];
    double *rows = malloc(sizeof(double) * N);
    int32_t *t = malloc(sizeof(int32_t) * N);
    uint16_t *h = malloc(2 * nl), *hc = malloc(2 * 4096);
    if (!l || !rows || !t || !h || !hc) {
        CHECK(0, "past 2^31: %zu bytes of host memory", 6 * nl);
        return;
    }
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < nl; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        l[i] = i % ld < V ? ((float)(x >> 40) / (float)(1 << 24) - 0.5f) * 8.0f : -7.0f;
    }
    for (size_t r = 0; r < N; r++) t[r] = (int32_t)((r * 7919 + 3) % V);
    for (int k = 0; k < 3; k++) one[k] = fdup(l + pick[k] * ld, ld);
    float loss = 0, l1;
    double r1, s = 0;
    uint16_t *h1 = malloc(2 * ld);
    dt_status st = dt_gpu_crossentropy_fused(l, rows, &loss, t, N, V, ld, 0.75f, h, DT_BF16);
    int same16 = st == DT_OK;
    for (int k = 0; k < 3 && same16; k++) {  // (the logits untouched, each row's gradient the row alone's bits)
        st = dt_gpu_crossentropy_fused(one[k], &r1, &l1, t + pick[k], 1, V, ld, 0.75f / (float)N, h1, DT_BF16);
        same16 &= st == DT_OK && !memcmp(one[k], l + pick[k] * ld, sizeof(float) * V) &&
                  !memcmp(h1, h + pick[k] * ld, 2 * (size_t)V);
    }
    free(h1);
    CHECK(same16, "past 2^31: the fused cross-entropy's gradient in bf16 over %zu rows of %d: rows %zu, %zu and %zu "
          "the row alone's bits, the logits untouched%s%s", N, V, pick[0], pick[1], pick[2], EMU_ERR(st));
    if (st == DT_OK) st = dt_gpu_crossentropy_fused(l, rows, &loss, t, N, V, ld, 0.75f, NULL, DT_F32);
    int same = st == DT_OK, pad = 1;
    for (int k = 0; k < 3 && same; k++) {  // (dloss so that the row's scale is the call's, 0.75 / N: nn/rows.h's dt_ce_scale)
        st = dt_gpu_crossentropy_fused(one[k], &r1, &l1, t + pick[k], 1, V, ld, 0.75f / (float)N, NULL, DT_F32);
        same &= st == DT_OK && !memcmp(one[k], l + pick[k] * ld, sizeof(float) * V) && !memcmp(&r1, &rows[pick[k]], 8);
    }
    for (size_t r = 0; r < N; r++) s += rows[r];
    for (size_t r = 0; r < N; r += 997) pad &= l[r * ld + V] == -7.0f && l[r * ld + ld - 1] == -7.0f;
    pad &= l[nl - 1] == -7.0f;
    CHECK(same && pad && (float)(s / N) == loss, "past 2^31: the fused cross-entropy over %zu rows of %d (%zu floats): "
          "rows %zu, %zu and %zu the row alone's bits %s, the loss %.9g the rows' mean %s, padding %s%s%s", N, V, nl,
          pick[0], pick[1], pick[2], same ? "yes" : "NO", loss, (float)(s / N) == loss ? "yes" : "NO",
          pad ? "kept" : "WRITTEN", EMU_ERR(st));
    st = dt_gpu_from_f32(h, l, nl, DT_BF16);
    const size_t at[2] = {two31 - 2048, nl - 4096};
    for (int k = 0; k < 2 && st == DT_OK; k++) {
        dt_from_f32(hc, l + at[k], 4096, DT_BF16);
        same &= !memcmp(hc, h + at[k], 2 * 4096);
    }
    double whole = -1, want = dt_sum_squares(l, nl);
    if (st == DT_OK) st = dt_gpu_sumsq(&whole, l, nl);
    CHECK(st == DT_OK && same && !memcmp(&whole, &want, sizeof want), "past 2^31: %zu floats rounded to bf16 (the "
          "CPU's bits about 2^31 and at the end: %s) and their sum of squares %.17g (the CPU's %.17g)%s%s", nl,
          same ? "yes" : "NO", whole, want, EMU_ERR(st));
    for (int k = 0; k < 3; k++) free(one[k]);
    free(l), free(rows), free(t), free(h), free(hc);
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "large")) {
        double t0 = dt_now();
        test_large();
        printf("past 2^31: %.0f s\n", dt_now() - t0);
        return tl_finish();
    }
    // `reversed`: the whole table again with a block's threads taken from
    // the last (a missing barrier between two threads shows in one order
    // or the other: cuda_emu.h).
    if (argc > 1 && !strcmp(argv[1], "reversed")) dt_emu_reversed = 1;
    // The cross-entropy's: 3 rows of 257 padded to 260, 5 of 1000, 2 of
    // GPT-2's 50257 padded to 50304, 300 of 33 (the rows' losses added
    // 256 at a time), 3 of 257 unpadded; the fused pass with each row in
    // shared memory, then where a block may not have that much (read from
    // memory in each of its passes).
    test_ce(3, 257, 260);
    test_ce(5, 1000, 1000);
    test_ce(2, 50257, 50304);
    test_ce(300, 33, 36);
    test_ce(3, 257, 257);  // (rows past the first not 16-byte aligned: staged a float at a time)
    size_t optin = dt_emu_optin;
    dt_emu_optin = 0;
    test_ce(3, 257, 260);
    test_ce(2, 50257, 50304);
    dt_emu_optin = optin;
    test_ce_split(5, 1000);
    test_ce_split(2, 25152);
    // Layernorm's: C of 1, 97 (a column tile partly filled) and 256 (whole
    // tiles), rows past one chunk of the column sums.
    test_layernorm(3, 1);
    test_layernorm(37, 97);
    test_layernorm(70, 256);
    test_layernorm(48, 516);
    // The sums of squares: a block of 4096 (DT_SUMSQ_BLOCK) less one, one,
    // and one more; several blocks, more than a thread block's (the blocks'
    // sums added 256 at a time); slices that begin inside a block.
    const size_t sq[][2] = {{1, 0}, {4095, 0}, {4096, 0}, {4097, 0}, {5 * 4096 + 3, 0}, {300 * 4096 + 5, 0},
                            {10, 4090}, {3 * 4096, 1}, {2 * 4096 + 7, 4095}, {4096, 2048}};
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
    // on the tensor cores (mma.sync and wmma, emulated), T = 1 and past two
    // 64-row tiles; in fp16 one of each kind, and a tile's T exactly.
    test_flash(2, 37, 96, 3, DT_BF16, 1);
    test_flash(1, 33, 5, 1, DT_BF16, 1);
    test_flash(2, 70, 128, 2, DT_BF16, 1);
    test_flash(1, 130, 256, 2, DT_BF16, 1);
    test_flash(1, 1, 64, 1, DT_BF16, 1);
    test_flash(2, 37, 96, 3, DT_F16, 1);
    test_flash(2, 70, 128, 2, DT_F16, 1);
    test_flash(1, 64, 256, 2, DT_F16, 1);   // (heads of 128, T a whole tile)
    test_flash(1, 1, 128, 1, DT_BF16, 1);
    g_qkv_off = 1;
    test_flash(2, 70, 128, 2, DT_BF16, 1);
    g_qkv_off = 0;
    // GPT-2's heads (12 of 64 columns) over 4 tiles of rows and a partial fifth
    test_flash(1, 300, 768, 12, DT_BF16, 1);
    // fp32 with TF32 on: heads of 64 on the tensor cores (tf32 fragments,
    // k steps of 8), against the CPU's fp32 within 5e-3 (10 bits of
    // mantissa a factor); other heads stay on the CUDA cores (fp32 bits).
    dt_gpu_set_tf32(1);
    test_flash(2, 70, 128, 2, DT_F32, 1);
    test_flash(2, 70, 128, 2, DT_F32, 1e-6f);
    test_flash(1, 37, 96, 3, DT_F32, 1);
    test_flash(1, 300, 768, 12, DT_F32, 1);
    dt_gpu_set_tf32(0);
    // The embedding: tokens repeated (a vocabulary of 50 over 2 x 37), one
    // position, a shard's rows at either end and inside.
    test_encoder(2, 37, 24, 50, 0, 0);
    test_encoder(1, 1, 7, 3, 0, 0);
    test_encoder(2, 37, 24, 50, 0, 17);
    test_encoder(2, 37, 24, 50, 17, 17);
    test_encoder(3, 19, 9, 40, 20, 20);
    test_encoder(6, 8, 516, 32, 0, 0);
    test_encoder(2, 400, 300, 2, 0, 0);  // (runs of about 400 positions: a block's positions in chunks of 256)
    // The elementwise kernels: a block's 256 less one, more than one block
    // (grid-stride), columns of the bias 1, 3 and 97 (rows past a chunk).
    test_elementwise(255, 1);
    test_elementwise(3 * 1031, 3);
    test_elementwise(97 * 300, 97);
    test_elementwise(1548 * 48, 1548);
    test_convert(DT_BF16, 5000);
    test_convert(DT_F16, 5000);
    test_cnn(3, 5, 13, 11, 3, 2, 1);
    test_cnn(2, 3, 12, 12, 5, 1, 2);
    test_cnn(1, 1, 7, 9, 2, 1, 0);
    // The attention past the fused kernels' heads: heads of 258 and 300,
    // T = 1, 37 (rows of a warp not multiples of 32) and 70.
    test_attention(1, 37, 258, 1, DT_F32);
    test_attention(2, 1, 516, 2, DT_F32);
    test_attention(1, 70, 600, 2, DT_F32);
    test_attention(1, 37, 258, 1, DT_BF16);
    test_attention(1, 37, 258, 1, DT_F16);
    test_training();
    dt_status st = dt_gpu_flash_forward(NULL, NULL, NULL, 1, 4, 258, 1, DT_F32, NULL);
    CHECK(st == DT_ERR_ARG && strstr(dt_last_error(), "heads of 258 columns"),
          "a head of 258 columns refused by the fused kernels: %s", dt_last_error());
    return tl_finish();
}
