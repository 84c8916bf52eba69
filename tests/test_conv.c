/* The convolution's two paths (kernels.h): oneDNN's primitives and the
 * portable im2col + GEMM path (conv_portable.c).
 *
 * Paths: on awkward shapes (stride 2, padding, K 1/3/5, IC 1/3/8, odd H
 * and W, batch 1 and 7), forward (bias, relu), backward data (overwritten
 * and accumulated), backward weights and bias (accumulated), in fp32, bf16
 * and fp16, each path against a reference computed here in double from the
 * operands rounded to the precision: |err| <= n 2^-23 sum|a b| + 1e-30 for
 * a sum of n products (fp32 summation of exact products; the bound
 * test_precision uses); the portable path's blocked layouts give its plain
 * results bitwise. Without oneDNN the portable path alone.
 *
 * Routing (oneDNN builds, AVX-512): the tensor-parallel shard of
 * configs/fashion-cnn.ini's second convolution at T = 4 (8 input channels)
 * runs oneDNN's reference kernel for backward weights, which goes portable
 * (mixed), and with a blocked input for forward too (all portable); 16
 * channels stay on oneDNN; a routed plan gives the portable path's bits.
 *
 * Threads: plans made on the main thread run from two threads at once
 * (the same shape or two, one of them on oneDNN's GEMM-based kernel, whose
 * scratchpad was the creating thread's and crashed), bitwise as on the
 * main thread; two whole CNNs in two threads bitwise as one after the
 * other; a CNN's tensor-parallel shards in threads (T = 2 and 4) give the
 * whole model's loss. */
#include "dtrain/nn.h"
#include "kernels/kernels.h"
#include "testlib.h"
#include "tp_net.h"

#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static float frand(dt_rng *r) { return 2.0f * dt_rng_uniform(r) - 1.0f; }

static int out_dim(int n, const dt_conv_shape *s) { return (n + 2 * s->P - s->K) / s->S + 1; }

// ----------------------------------------------------------------------------
// the reference, in double, and the bound

typedef struct {
    double *y, *ya, *dx, *dxa, *dw, *dwa, *db, *dba;  // values and sums of |terms|
    int nf, nd, nw;                                   // terms of each sum
} ref;

static void reference(ref *r, const dt_conv_shape *s, const float *x, const float *w, const float *b,
                      const float *dy) {
    int OH = out_dim(s->H, s), OW = out_dim(s->W, s);
    size_t ni = (size_t)s->B * s->IC * s->H * s->W, nw = (size_t)s->OC * s->IC * s->K * s->K,
           no = (size_t)s->B * s->OC * OH * OW;
    r->y = calloc(no, 8), r->ya = calloc(no, 8), r->dx = calloc(ni, 8), r->dxa = calloc(ni, 8);
    r->dw = calloc(nw, 8), r->dwa = calloc(nw, 8), r->db = calloc(s->OC, 8), r->dba = calloc(s->OC, 8);
    r->nf = s->IC * s->K * s->K + 1, r->nd = s->OC * s->K * s->K, r->nw = s->B * OH * OW;
    for (int n = 0; n < s->B; n++)
        for (int o = 0; o < s->OC; o++)
            for (int oy = 0; oy < OH; oy++)
                for (int ox = 0; ox < OW; ox++) {
                    size_t yi = (((size_t)n * s->OC + o) * OH + oy) * OW + ox;
                    double acc = b[o], aa = fabs(b[o]), d = dy[yi];
                    r->db[o] += d, r->dba[o] += fabs(d);
                    for (int c = 0; c < s->IC; c++)
                        for (int ky = 0; ky < s->K; ky++)
                            for (int kx = 0; kx < s->K; kx++) {
                                int iy = oy * s->S - s->P + ky, ix = ox * s->S - s->P + kx;
                                if (iy < 0 || iy >= s->H || ix < 0 || ix >= s->W) continue;
                                size_t xi = (((size_t)n * s->IC + c) * s->H + iy) * s->W + ix,
                                       wi = (((size_t)o * s->IC + c) * s->K + ky) * s->K + kx;
                                acc += (double)x[xi] * w[wi], aa += fabs((double)x[xi] * w[wi]);
                                r->dx[xi] += d * w[wi], r->dxa[xi] += fabs(d * w[wi]);
                                r->dw[wi] += d * x[xi], r->dwa[wi] += fabs(d * x[xi]);
                            }
                    r->y[yi] = s->relu && acc < 0 ? 0 : acc;
                    r->ya[yi] = aa;
                }
}

static void free_ref(ref *r) {
    free(r->y), free(r->ya), free(r->dx), free(r->dxa), free(r->dw), free(r->dwa), free(r->db), free(r->dba);
}

// Worst |got - (want + base)| / bound over n elements (<= 1 passes).
static double worst(const float *got, const double *want, const double *absum, size_t n, int terms, double base) {
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs(got[i] - (want[i] + base)) / (terms * ldexp(absum[i] + fabs(base), -23) + 1e-30);
        if (!(e <= m)) m = e;  // (NaN: worst)
    }
    return m;
}

// ----------------------------------------------------------------------------
// one shape on one path in one precision

typedef struct {
    float *y, *dx, *dxs, *dw, *db;  // dx: accumulated onto 1; dxs: overwritten; dw, db: onto 0.5
} result;

static void run_path(result *o, int portable, const dt_conv_shape *s, const float *x, const float *w,
                     const float *b, const float *dy) {
    int OH = out_dim(s->H, s), OW = out_dim(s->W, s);
    size_t ni = (size_t)s->B * s->IC * s->H * s->W, nw = (size_t)s->OC * s->IC * s->K * s->K,
           no = (size_t)s->B * s->OC * OH * OW, sv, sc;
    if (portable) dt_conv_portable_size(s, &sv, &sc);
    else dt_conv_size(s, &sv, &sc);
    float *save = malloc(4 * sv + 4), *scr = malloc(4 * sc + 4);
    o->y = malloc(4 * no), o->dx = malloc(4 * ni), o->dxs = malloc(4 * ni), o->dw = malloc(4 * nw);
    o->db = malloc(4 * s->OC);
    for (size_t i = 0; i < ni; i++) o->dx[i] = 1.0f, o->dxs[i] = NAN;
    for (size_t i = 0; i < nw; i++) o->dw[i] = 0.5f;
    for (int i = 0; i < s->OC; i++) o->db[i] = 0.5f;
    if (portable) {
        dt_conv_portable_forward(o->y, save, scr, x, w, b, s);
        dt_conv_portable_backward(o->dx, NULL, NULL, scr, NULL, dy, save, w, s, 0);
        dt_conv_portable_backward(o->dxs, o->dw, o->db, scr, NULL, dy, save, w, s, 1);
    } else {
        dt_conv_forward(o->y, NULL, save, scr, x, w, b, s);
        dt_conv_backward(o->dx, NULL, NULL, scr, NULL, dy, save, w, s, 0);
        dt_conv_backward(o->dxs, o->dw, o->db, scr, NULL, dy, save, w, s, 1);
    }
    free(save), free(scr);
}

static void free_result(result *o) { free(o->y), free(o->dx), free(o->dxs), free(o->dw), free(o->db); }

// Sample by sample, plain [B, C, P] as blocked [B, ceil(C/16), P, 16] (zeros past C).
static float *to_blocked(const float *y, int B, int C, int P) {
    int CB = (C + 15) / 16;
    float *x = calloc((size_t)B * CB * 16 * P, 4);
    for (int n = 0; n < B; n++)
        for (int c = 0; c < C; c++)
            for (int p = 0; p < P; p++)
                x[(((size_t)n * CB + c / 16) * P + p) * 16 + c % 16] = y[((size_t)n * C + c) * P + p];
    return x;
}

// The portable path on blocked input and output gives its plain results bitwise.
static void blocked_case(const dt_conv_shape *plain, const result *want, const float *x, const float *w,
                         const float *b, const float *dy) {
    dt_conv_shape s = *plain;
    s.src_blocked = s.dst_blocked = 1;
    int OH = out_dim(s.H, &s), OW = out_dim(s.W, &s), P = s.H * s.W, Q = OH * OW;
    size_t nw = (size_t)s.OC * s.IC * s.K * s.K, sv, sc;
    float *xb = to_blocked(x, s.B, s.IC, P), *dyb = to_blocked(dy, s.B, s.OC, Q), *wy = to_blocked(want->y, s.B, s.OC, Q),
          *wdx = to_blocked(want->dxs, s.B, s.IC, P);
    size_t nib = (size_t)s.B * ((s.IC + 15) / 16) * 16 * P, nob = (size_t)s.B * ((s.OC + 15) / 16) * 16 * Q;
    dt_conv_portable_size(&s, &sv, &sc);
    float *save = malloc(4 * sv + 4), *scr = malloc(4 * sc + 4), *y = malloc(4 * nob), *dx = malloc(4 * nib),
          *dw = malloc(4 * nw), *db = malloc(4 * s.OC);
    for (size_t i = 0; i < nob; i++) y[i] = NAN;
    for (size_t i = 0; i < nib; i++) dx[i] = 0.0f;  // (the padding channels: left alone)
    for (size_t i = 0; i < nw; i++) dw[i] = 0.5f;
    for (int i = 0; i < s.OC; i++) db[i] = 0.5f;
    dt_conv_portable_forward(y, save, scr, xb, w, b, &s);
    dt_conv_portable_backward(dx, dw, db, scr, NULL, dyb, save, w, &s, 1);
    CHECK(!memcmp(y, wy, 4 * nob) && !memcmp(dx, wdx, 4 * nib) && !memcmp(dw, want->dw, 4 * nw) &&
              !memcmp(db, want->db, 4 * s.OC),
          "conv B=%d IC=%d %dx%d OC=%d K=%d S=%d P=%d: the portable path on blocked layouts differs from plain "
          "(y %d dx %d dw %d db %d)", s.B, s.IC, s.H, s.W, s.OC, s.K, s.S, s.P, !memcmp(y, wy, 4 * nob),
          !memcmp(dx, wdx, 4 * nib), !memcmp(dw, want->dw, 4 * nw), !memcmp(db, want->db, 4 * s.OC));
    free(xb), free(dyb), free(wy), free(wdx), free(save), free(scr), free(y), free(dx), free(dw), free(db);
}

#ifdef DTRAIN_HAVE_ONEDNN
// oneDNN's plan of s (its layouts; x, dy in them) with out_room (the
// output-sized copies in the caller's room, dinp set in place, a rounded
// plan's backward weights first) gives the bits of the plan without it.
static void room_case(dt_conv_shape s, const float *x, const float *w, const float *b, const float *dy) {
    int CI = s.src_blocked ? (s.IC + 15) / 16 * 16 : s.IC, CO = s.dst_blocked ? (s.OC + 15) / 16 * 16 : s.OC;
    size_t ni = (size_t)s.B * CI * s.H * s.W, nw = (size_t)s.OC * s.IC * s.K * s.K,
           no = (size_t)s.B * CO * out_dim(s.H, &s) * out_dim(s.W, &s), sv, sc;
    float *y[2], *dx[2], *dw[2], *db[2];
    for (int k = 0; k < 2; k++) {
        s.out_room = k;
        dt_conv_size(&s, &sv, &sc);
        float *save = malloc(4 * sv + 4), *scr = malloc(4 * sc + 4), *room = malloc(4 * no), *out = malloc(4 * no);
        y[k] = malloc(4 * no), dx[k] = calloc(ni, 4), dw[k] = malloc(4 * nw), db[k] = malloc(4 * s.OC);
        for (size_t i = 0; i < no; i++) room[i] = NAN;
        for (size_t i = 0; i < nw; i++) dw[k][i] = 0.5f;
        for (int i = 0; i < s.OC; i++) db[k][i] = 0.5f;
        dt_conv_forward(out, k ? room : NULL, save, scr, x, w, b, &s);
        memcpy(y[k], out, 4 * no);
        dt_conv_backward(dx[k], dw[k], db[k], scr, out, dy, save, w, &s, 1);
        free(save), free(scr), free(room), free(out);
    }
    int oy = !memcmp(y[0], y[1], 4 * no), ox = !memcmp(dx[0], dx[1], 4 * ni), ow = !memcmp(dw[0], dw[1], 4 * nw),
        ob = !memcmp(db[0], db[1], 4 * s.OC);
    CHECK(oy && ox && ow && ob, "conv B=%d IC=%d %dx%d OC=%d K=%d S=%d P=%d blocked %d: with the output's room the "
          "results differ (y %d dx %d dw %d db %d)", s.B, s.IC, s.H, s.W, s.OC, s.K, s.S, s.P, s.src_blocked, oy, ox,
          ow, ob);
    for (int k = 0; k < 2; k++) free(y[k]), free(dx[k]), free(dw[k]), free(db[k]);
}
#endif

static void shape_case(dt_conv_shape s, dt_dtype t) {
    int OH = out_dim(s.H, &s), OW = out_dim(s.W, &s);
    size_t ni = (size_t)s.B * s.IC * s.H * s.W, nw = (size_t)s.OC * s.IC * s.K * s.K, no = (size_t)s.B * s.OC * OH * OW;
    dt_rng r;
    dt_rng_seed(&r, 7 + ni + (uint64_t)t);
    float *x = malloc(4 * ni), *w = malloc(4 * nw), *b = malloc(4 * s.OC), *dy = malloc(4 * no), *xr = malloc(4 * ni),
          *wr = malloc(4 * nw), *dyr = malloc(4 * no);
    for (size_t i = 0; i < ni; i++) x[i] = frand(&r);
    for (size_t i = 0; i < nw; i++) w[i] = frand(&r) * 0.5f;
    for (int i = 0; i < s.OC; i++) b[i] = frand(&r) * 0.1f;
    for (size_t i = 0; i < no; i++) dy[i] = frand(&r);
    memcpy(xr, x, 4 * ni), memcpy(wr, w, 4 * nw), memcpy(dyr, dy, 4 * no);
    if (t != DT_F32) dt_round_f32(xr, x, ni, t), dt_round_f32(wr, w, nw, t), dt_round_f32(dyr, dy, no, t);
    ref rf;
    reference(&rf, &s, xr, wr, b, dyr);
    dt_kernels_set_precision(t);
    dt_conv_set_routing(0);  // (oneDNN's primitives for every shape: the path compared)
#ifdef DTRAIN_HAVE_ONEDNN
    int paths = 2;
#else
    int paths = 1;
#endif
    for (int k = 0; k < paths; k++) {
        int portable = k == 0;
        result o;
        run_path(&o, portable, &s, x, w, b, dy);
        // (relu: a zero output's sum may land either side of 0)
        double ey = worst(o.y, rf.y, rf.ya, no, rf.nf, 0), ed = worst(o.dx, rf.dx, rf.dxa, ni, rf.nd, 1.0),
               es = worst(o.dxs, rf.dx, rf.dxa, ni, rf.nd, 0), ew = worst(o.dw, rf.dw, rf.dwa, nw, rf.nw, 0.5),
               eb = worst(o.db, rf.db, rf.dba, s.OC, rf.nw, 0.5);
        CHECK(ey <= 1 && ed <= 1 && es <= 1 && ew <= 1 && eb <= 1,
              "conv %s %s B=%d IC=%d %dx%d OC=%d K=%d S=%d P=%d relu %d: error / bound forward %.3g, dinp added %.3g, "
              "set %.3g, dw %.3g, db %.3g", portable ? "portable" : "oneDNN", dt_dtype_name(t), s.B, s.IC, s.H, s.W,
              s.OC, s.K, s.S, s.P, s.relu, ey, ed, es, ew, eb);
        if (portable) blocked_case(&s, &o, x, w, b, dy);
#ifdef DTRAIN_HAVE_ONEDNN
        else {
            dt_conv_shape sb = s;
            sb.src_blocked = sb.dst_blocked = 1;
            float *xb = to_blocked(x, s.B, s.IC, s.H * s.W), *dyb = to_blocked(dy, s.B, s.OC, OH * OW);
            room_case(s, x, w, b, dy);
            room_case(sb, xb, w, b, dyb);
            free(xb), free(dyb);
        }
#endif
        free_result(&o);
    }
    dt_conv_set_routing(1);
    dt_kernels_set_precision(DT_F32);
    free_ref(&rf);
    free(x), free(w), free(b), free(dy), free(xr), free(wr), free(dyr);
}

static void paths(void) {
    static const dt_conv_shape shapes[] = {
        {1, 1, 7, 9, 3, 3, 2, 1, 0, 0, 0, 0, 0, 0},   {7, 3, 9, 8, 5, 5, 2, 2, 0, 0, 1, 0, 0, 0},
        {7, 8, 11, 7, 4, 1, 1, 0, 0, 0, 0, 0, 0, 0},  {1, 8, 6, 5, 16, 3, 1, 1, 0, 0, 1, 0, 0, 0},
        {7, 1, 13, 13, 8, 5, 1, 2, 0, 0, 0, 0, 0, 0}, {2, 3, 10, 11, 17, 3, 2, 0, 0, 0, 0, 0, 0, 0},
        {1, 3, 5, 5, 2, 5, 1, 0, 0, 0, 0, 0, 0, 0},
    };
    dt_dtype ts[3] = {DT_F32, DT_BF16, DT_F16};
    for (int k = 0; k < 3; k++)
        for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) shape_case(shapes[i], ts[k]);
    printf("paths: %zu shapes x fp32/bf16/fp16 within the bounds (oneDNN's the same bits with the output's room, "
           "plain and blocked)\n", sizeof shapes / sizeof *shapes);
}

// ----------------------------------------------------------------------------
// routing

#ifdef DTRAIN_HAVE_ONEDNN
// The routed plan of s gives the portable path's bits (dw, db: all of them when mixed).
static void routed_bits(const dt_conv_shape *s, int path) {
    size_t ni = (size_t)s->B * ((s->IC + 15) / 16) * 16 * s->H * s->W, nw = (size_t)s->OC * s->IC * s->K * s->K,
           no = (size_t)s->B * ((s->OC + 15) / 16) * 16 * s->H * s->W, sv, sc, psv, psc;
    dt_rng r;
    dt_rng_seed(&r, 3);
    float *x = calloc(ni, 4), *w = malloc(4 * nw), *b = malloc(4 * s->OC), *dy = calloc(no, 4);
    for (size_t i = 0; i < ni; i++) x[i] = frand(&r);
    for (size_t i = 0; i < nw; i++) w[i] = frand(&r);
    for (int i = 0; i < s->OC; i++) b[i] = frand(&r);
    for (size_t i = 0; i < no; i++) dy[i] = frand(&r);
    dt_conv_size(s, &sv, &sc);
    dt_conv_portable_size(s, &psv, &psc);
    CHECK(sv >= psv && sc >= psc, "routing: the plan's sizes (%zu, %zu) cover the portable path's (%zu, %zu)", sv, sc,
          psv, psc);
    float *save = malloc(4 * sv), *scr = malloc(4 * sc), *y[2], *dw[2];
    for (int k = 0; k < 2; k++) {
        y[k] = malloc(4 * no), dw[k] = calloc(nw + s->OC, 4);
        if (k) dt_conv_portable_forward(y[k], save, scr, x, w, b, s);
        else dt_conv_forward(y[k], NULL, save, scr, x, w, b, s);
        if (k) dt_conv_portable_backward(NULL, dw[k], dw[k] + nw, scr, NULL, dy, save, w, s, 1);
        else dt_conv_backward(NULL, dw[k], dw[k] + nw, scr, NULL, dy, save, w, s, 1);
    }
    CHECK(!memcmp(dw[0], dw[1], 4 * (nw + s->OC)) && (path == DT_CONV_MIXED || !memcmp(y[0], y[1], 4 * no)),
          "routing: IC=%d src_blocked %d: the routed plan's results are not the portable path's bits", s->IC,
          s->src_blocked);
    for (int k = 0; k < 2; k++) free(y[k]), free(dw[k]);
    free(x), free(w), free(b), free(dy), free(save), free(scr);
}
#endif

static void routing(void) {
    // the T = 4 shard of fashion-cnn's second convolution, as the model lays it out, then blocked, then 16 channels
    dt_conv_shape s[3] = {{64, 8, 14, 14, 64, 5, 1, 2, 0, 1, 0, 0, 0, 0},
                          {64, 8, 14, 14, 64, 5, 1, 2, 1, 1, 0, 0, 0, 0},
                          {64, 16, 14, 14, 64, 5, 1, 2, 1, 1, 0, 0, 0, 0}};
#ifndef DTRAIN_HAVE_ONEDNN
    const char *impls = NULL;
    int path = dt_conv_path(&s[0], &impls);
    CHECK(path == DT_CONV_PORTABLE && strstr(impls, "no oneDNN"), "routing: without oneDNN every shape is portable (%s)",
          impls);
    return;
#else
    int want[3] = {DT_CONV_MIXED, DT_CONV_PORTABLE, DT_CONV_ONEDNN};
    int avx512 = dt_cpu_get()->isa >= DT_ISA_AVX512;  // (where oneDNN 2.6's choices were measured)
    for (int i = 0; i < 3; i++) {
        const char *impls;
        dt_conv_shape own = s[i];
        own.src_blocked = own.dst_blocked = 0;
        int path = dt_conv_path(&s[i], &impls), src, dst, own_path = dt_conv_path(&own, NULL);
        dt_conv_prefers_blocked(&s[i], &src, &dst);
        printf("routing: IC=%d src_blocked %d: path %d (%s)\n", s[i].IC, s[i].src_blocked, path, impls);
        const char *wref = strstr(impls, "backward weights ref");
        int refs = (strncmp(impls, "forward ref", 11) == 0) + (strstr(impls, "backward data ref") != NULL) + !!wref;
        CHECK(path == (refs == 0 ? DT_CONV_ONEDNN : refs == 1 && wref && !s[i].src_blocked ? path : DT_CONV_PORTABLE),
              "routing: path %d for oneDNN's %s", path, impls);
        CHECK(!avx512 || path == want[i], "routing: IC=%d src_blocked %d runs path %d, want %d (%s)", s[i].IC,
              s[i].src_blocked, path, want[i], impls);
        CHECK(own_path != DT_CONV_PORTABLE || (!src && !dst), "routing: a portable plan prefers NCHW");
        if (path != DT_CONV_ONEDNN) routed_bits(&s[i], path);
    }
#endif
}

// ----------------------------------------------------------------------------
// threads

typedef struct {
    dt_conv_shape s;
    float *x, *w, *b, *dy;       // inputs
    float *y, *dx, *dw, *db;     // the main thread's results
    int threads, iters, ok;
} job;

static void job_run(const job *j, float *y, float *dx, float *dw, float *db) {
    const dt_conv_shape *s = &j->s;
    size_t sv, sc, nw = (size_t)s->OC * s->IC * s->K * s->K;
    dt_conv_size(s, &sv, &sc);
    float *save = malloc(4 * sv + 4), *scr = malloc(4 * sc + 4);
    memset(dw, 0, 4 * nw), memset(db, 0, 4 * s->OC);
    dt_conv_forward(y, NULL, save, scr, j->x, j->w, j->b, s);
    dt_conv_backward(dx, dw, db, scr, NULL, j->dy, save, j->w, s, 1);
    free(save), free(scr);
}

static void job_make(job *j, dt_conv_shape s) {
    int OH = out_dim(s.H, &s), OW = out_dim(s.W, &s);
    size_t ni = (size_t)s.B * s.IC * s.H * s.W, nw = (size_t)s.OC * s.IC * s.K * s.K, no = (size_t)s.B * s.OC * OH * OW;
    dt_rng r;
    dt_rng_seed(&r, ni);
    *j = (job){s, malloc(4 * ni), malloc(4 * nw), malloc(4 * s.OC), malloc(4 * no), malloc(4 * no), malloc(4 * ni),
               malloc(4 * nw), malloc(4 * s.OC), omp_get_max_threads(), 10, 1};
    for (size_t i = 0; i < ni; i++) j->x[i] = frand(&r);
    for (size_t i = 0; i < nw; i++) j->w[i] = frand(&r);
    for (int i = 0; i < s.OC; i++) j->b[i] = frand(&r);
    for (size_t i = 0; i < no; i++) j->dy[i] = frand(&r);
    job_run(j, j->y, j->dx, j->dw, j->db);  // (makes the plan on this thread)
}

static void *job_thread(void *a) {
    job *j = a;
    omp_set_num_threads(j->threads);  // (the main thread's count: the same plan)
    const dt_conv_shape *s = &j->s;
    size_t ni = (size_t)s->B * s->IC * s->H * s->W, nw = (size_t)s->OC * s->IC * s->K * s->K,
           no = (size_t)s->B * s->OC * out_dim(s->H, s) * out_dim(s->W, s);
    float *y = malloc(4 * no), *dx = malloc(4 * ni), *dw = malloc(4 * nw), *db = malloc(4 * s->OC);
    for (int it = 0; it < j->iters; it++) {
        job_run(j, y, dx, dw, db);
        j->ok &= !memcmp(y, j->y, 4 * no) && !memcmp(dx, j->dx, 4 * ni) && !memcmp(dw, j->dw, 4 * nw) &&
                 !memcmp(db, j->db, 4 * s->OC);
    }
    free(y), free(dx), free(dw), free(db);
    return NULL;
}

static void kernel_threads(void) {
    // the first: oneDNN's GEMM-based backward weights (x64:gemm:jit) on AVX-512, whose
    // library scratchpad belongs to the thread that made the primitive
    job a, b, c;
    job_make(&a, (dt_conv_shape){4, 8, 4, 4, 2, 3, 1, 0, 0, 0, 0, 0, 0, 0});
    job_make(&b, (dt_conv_shape){8, 3, 28, 28, 16, 5, 1, 2, 0, 0, 0, 0, 0, 0});
    job_make(&c, (dt_conv_shape){16, 8, 14, 14, 64, 5, 1, 2, 0, 1, 0, 0, 0, 0});
    const char *ia;
    dt_conv_path(&a.s, &ia);
    printf("threads: the small shape runs %s\n", ia);
    job *pairs[3][2] = {{&a, &a}, {&a, &b}, {&c, &b}};
    for (int k = 0; k < 3; k++) {
        job j0 = *pairs[k][0], j1 = *pairs[k][1];  // (own ok flags)
        pthread_t t0, t1;
        pthread_create(&t0, NULL, job_thread, &j0);
        pthread_create(&t1, NULL, job_thread, &j1);
        pthread_join(t0, NULL);
        pthread_join(t1, NULL);
        CHECK(j0.ok && j1.ok, "threads: pair %d: two threads' convolutions differ from the main thread's (%d %d)", k,
              j0.ok, j1.ok);
    }
    job *js[3] = {&a, &b, &c};
    for (int k = 0; k < 3; k++) {
        free(js[k]->x), free(js[k]->w), free(js[k]->b), free(js[k]->dy);
        free(js[k]->y), free(js[k]->dx), free(js[k]->dw), free(js[k]->db);
    }
}

enum { NB = 4 };
static float g_x[NB * 3 * 64];
static int32_t g_y[NB] = {1, 4, 0, 3};

typedef struct {
    int r, ntp, threads;
    dt_model *m;
    pthread_barrier_t *bar;
    float **bufs;
    float loss, *grads;
    dt_status st;
} member;

// The shards' sum: every buffer posted, rank 0 adds them in rank order into all.
static dt_status member_sum(float *buf, size_t n, void *user) {
    member *s = user;
    s->bufs[s->r] = buf;
    pthread_barrier_wait(s->bar);
    if (s->r == 0)
        for (size_t i = 0; i < n; i++) {
            float v = s->bufs[0][i];
            for (int r = 1; r < s->ntp; r++) v += s->bufs[r][i];
            for (int r = 0; r < s->ntp; r++) s->bufs[r][i] = v;
        }
    pthread_barrier_wait(s->bar);
    return DT_OK;
}

static void *member_step(void *a) {
    member *s = a;
    omp_set_num_threads(s->threads);
    for (int it = 0; it < 3 && s->st == DT_OK; it++) {
        dt_model_zero_grad(s->m);
        dt_model_set_dropout_key(s->m, 5, 20);
        s->st = dt_model_forward(s->m, g_x, g_y, NB, 1, &s->loss);
        if (s->st == DT_OK) s->st = dt_model_backward(s->m);
    }
    if (s->grads) memcpy(s->grads, dt_model_grads(s->m), sizeof(float) * dt_model_num_params(s->m));
    return NULL;
}

static void model_threads(void) {
    for (size_t i = 0; i < sizeof g_x / sizeof *g_x; i++) g_x[i] = (float)((i * 7) % 13) / 13.0f - 0.5f;
    // two whole models in two threads, bitwise as one after the other
    member w[2] = {{0}};
    size_t np = 0;
    for (int k = 0; k < 2; k++) {
        CHECK(dt_model_create(&w[k].m, TP_IN, TP_NET, TP_N, NB) == DT_OK, "model: %s", dt_last_error());
        dt_model_init(w[k].m, 11 + k);
        np = dt_model_num_params(w[k].m);
        w[k].threads = omp_get_max_threads();
        w[k].grads = malloc(sizeof(float) * np);
        member_step(&w[k]);
    }
    float loss[2] = {w[0].loss, w[1].loss}, *g[2] = {w[0].grads, w[1].grads};
    w[0].grads = malloc(sizeof(float) * np), w[1].grads = malloc(sizeof(float) * np);
    pthread_t t[4];
    for (int k = 0; k < 2; k++) dt_model_init(w[k].m, 11 + k), pthread_create(&t[k], NULL, member_step, &w[k]);
    for (int k = 0; k < 2; k++) pthread_join(t[k], NULL);
    for (int k = 0; k < 2; k++) {
        CHECK(w[k].st == DT_OK && w[k].loss == loss[k] && !memcmp(w[k].grads, g[k], sizeof(float) * np),
              "threads: model %d in a thread: loss %.9g vs %.9g alone, gradients %s", k, w[k].loss, loss[k],
              memcmp(w[k].grads, g[k], sizeof(float) * np) ? "differ" : "bitwise");
        free(w[k].grads), free(g[k]);
    }
    dt_model_free(w[1].m);
    // tensor-parallel shards in threads against the whole model (w[0], one step)
    w[0].grads = NULL;
    dt_model_init(w[0].m, 11);
    dt_model_zero_grad(w[0].m);
    dt_model_set_dropout_key(w[0].m, 5, 20);
    float whole = NAN;
    CHECK(dt_model_forward(w[0].m, g_x, g_y, NB, 1, &whole) == DT_OK, "whole model: %s", dt_last_error());
    for (int ntp = 2; ntp <= 4; ntp += 2) {
        pthread_barrier_t bar;
        pthread_barrier_init(&bar, NULL, ntp);
        float *bufs[4];
        member sh[4];
        for (int r = 0; r < ntp; r++) {
            sh[r] = (member){r, ntp, omp_get_max_threads(), NULL, &bar, bufs, NAN, NULL, DT_OK};
            CHECK(dt_model_create_shard(&sh[r].m, TP_IN, TP_NET, TP_N, NB, r, ntp) == DT_OK, "shard: %s",
                  dt_last_error());
            dt_model_init(sh[r].m, 11);
            dt_model_set_reduce(sh[r].m, member_sum, &sh[r]);
        }
        for (int r = 0; r < ntp; r++) pthread_create(&t[r], NULL, member_step, &sh[r]);
        for (int r = 0; r < ntp; r++) pthread_join(t[r], NULL);
        for (int r = 0; r < ntp; r++) {
            CHECK(sh[r].st == DT_OK && fabsf(sh[r].loss - whole) <= 1e-5f * fabsf(whole),
                  "threads: tensor %d shard %d: loss %.9g, the whole model's %.9g", ntp, r, sh[r].loss, whole);
            dt_model_free(sh[r].m);
        }
        pthread_barrier_destroy(&bar);
        printf("threads: tensor %d shards in threads, loss %.9g (whole %.9g)\n", ntp, sh[0].loss, whole);
    }
    dt_model_free(w[0].m);
}

int main(void) {
    paths();
    routing();
    kernel_threads();
    model_threads();
    return tl_finish();
}
