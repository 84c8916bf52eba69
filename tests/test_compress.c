/* Gradient compression ([compression], docs/compression.md): each codec
 * against a serial reference.
 *
 *   1. Settings: bad values are refused naming FILE:LINE [compression] field.
 *   2. One process (a world of 1, the codec called as dp.c calls it):
 *      error feedback conserves the sum (sent + residual = input, step
 *      after step) for every lossy method; QSGD and random-k are unbiased
 *      (a seeded statistical test, which top-k, a biased method, fails);
 *      PowerSGD at full rank returns the gradient, and a rank-1 matrix at
 *      rank 1; top-k with DGC's warm-up, momentum correction and local
 *      clipping against a serial reference of the algorithm.
 *   3. Ranks (this program re-run as `dtrain run -n N -- test_compress rank
 *      METHOD ...`, N = 2, 3, 4): three steps of three pieces (one below
 *      min_bytes) through start/finish; every rank checks the decoded sum
 *      against a serial reference that encodes every rank's input itself
 *      and keeps every rank's residual.
 *   4. Training: the same compressed 2-worker run twice is bitwise equal
 *      (every method, and top-k with all of DGC); every method learns and sends fewer bytes (summary.json's
 *      bytes_sent) than the uncompressed run.
 *   5. Checkpoints: the codec's state saved and resumed. A run stopped by a
 *      failure and resumed on as many workers ends bitwise equal to an
 *      uninterrupted one (top-k inside DGC's warm-up, with momentum;
 *      PowerSGD, QSGD, random-k). A 3-worker checkpoint restored by 2 ranks
 *      (`dtrain run -n 2 -- test_compress reshard ...`) gives each the mean
 *      residual and momentum, so the unsent sum is kept, with the step and
 *      PowerSGD's Q as written; by 3 ranks each gets its own, bitwise. The
 *      lines said when a checkpoint has no codec state, or state this run
 *      does not keep; a byte flipped in a residual is caught by the
 *      checksum (inspect, and resume falls back to the older checkpoint). */
#include "dtrain/config.h"
#include "engine/codecs/codec.h"
#include "testlib.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char g_out[1 << 16];

static const char *const methods[] = {"none", "fp16", "bf16", "int8", "qsgd", "sign", "topk", "randomk", "powersgd"};

static void config(dt_config *c, int method, int ef) {
    dt_config_defaults(c);
    c->comp_method = method;
    c->comp_error_feedback = ef;
}

// The block's matrices the next codec() is given (NULL: none).
static const dt_grad_matrix *g_mats;
static int g_nmats;

// The codec of c over n gradients, world of 1 or the launcher's.
static dt_codec *codec(const dt_config *c, dt_comm_t comm, size_t n) {
    dt_codec *k = NULL;
    if (dt_codec_create(&k, c, comm, n, g_mats, g_nmats) != DT_OK) fprintf(stderr, "codec: %s\n", dt_last_error());
    return k;
}

// One step as dp.c runs it: every piece started, then every piece finished.
static dt_status step(dt_codec *k, float *g, const size_t *cut, int np) {
    dt_request_t req[8] = {0};
    for (int i = 0; i < np; i++) {
        dt_status st = k->ops->start(k, g, cut[i], cut[i + 1], &req[i]);
        if (st != DT_OK) return st;
    }
    for (int i = 0; i < np; i++) {
        dt_status st = k->ops->finish(k, g, cut[i], cut[i + 1], &req[i]);
        if (st != DT_OK) return st;
    }
    return DT_OK;
}

// Rank q's gradient at step s: normals of a varying scale, with exact ties.
static void input(float *x, size_t n, int q, int s) {
    dt_rng r;
    dt_rng_seed(&r, 1000u * (unsigned)q + (unsigned)s + 7);
    for (size_t i = 0; i < n; i++) x[i] = dt_rng_normal(&r) * (float)(1 + i % 7) * 0.01f;
    x[5] = x[6] = 0.5f;  // a tie at the top
}

// ----------------------------------------------------------------------------
// 1. settings

static void bad(const char *text, const char *expect) {
    dt_config c;
    dt_status st = dt_config_parse(&c, text, "bad.ini", NULL, 0);
    CHECK(st == DT_ERR_CONFIG && strstr(dt_last_error(), expect), "'%s' refused with '%s': got %d '%s'", text, expect,
          st, st ? dt_last_error() : "");
}

static void settings(void) {
#define B "[model]\npreset = mlp\n"
    bad(B "[compression]\nmethod = gzip\n", "bad.ini:4: [compression] method: expected one of none, fp16, bf16");
    bad(B "[compression]\nmethod = topk\nratio = 0\n", "bad.ini:5: [compression] ratio: expected");
    bad(B "[compression]\nmethod = topk\nratio = -0.1\n", "bad.ini:5: [compression] ratio: expected");
    bad(B "[compression]\nmethod = topk\nratio = 1.5\n", "bad.ini:5: [compression] ratio: expected");
    bad(B "[compression]\nmethod = powersgd\nrank = 0\n", "bad.ini:5: [compression] rank: expected");
    bad(B "[compression]\nmethod = qsgd\nlevels = 128\n", "bad.ini:5: [compression] levels: expected");
    bad(B "[compression]\nmethod = int8\nmomentum = 0.9\n", "[compression] momentum: only method = topk");
    bad(B "[compression]\nmethod = int8\nwarmup_steps = 5\n", "[compression] warmup_steps: only method = topk (DGC's "
          "warm-up) and powersgd");
    bad(B "[compression]\nmethod = topk\nmomentum = 0.9\nerror_feedback = false\n", "[compression] momentum: momentum correction needs");
    bad(B "[compression]\nmethod = fp16\n[parallel]\ndeterministic = true\n", "[compression] method: 'fp16' cannot be used with [parallel] deterministic");
    bad(B "[compression]\nmethod = topk\nmin_bytes = -1\n", "bad.ini:5: [compression] min_bytes: expected");
    bad(B "[compresion]\nmethod = topk\n", "unknown section [compresion]");
    dt_config c;
    CHECK(dt_config_parse(&c, B "[compression]\nmethod = topk\nratio = 1\nwarmup_steps = 5\nmomentum = 0.9\n", "ok.ini",
                          NULL, 0) == DT_OK && c.comp_method == DT_COMP_TOPK && c.comp_ratio == 1 &&
          c.comp_warmup_steps == 5, "a good [compression] section loads: %s", dt_last_error());
    dt_config e;
    CHECK(dt_config_parse(&e, B "[compression]\nmethod = powersgd\nwarmup_steps = 350\n", "ok.ini", NULL, 0) == DT_OK &&
          e.comp_warmup_steps == 350, "powersgd takes warmup_steps: %s", dt_last_error());
    // The resolved config reads back the same.
    char *text = dt_config_format(&c);
    dt_config d;
    CHECK(text && dt_config_parse(&d, text, "resolved", NULL, 0) == DT_OK && d.comp_method == DT_COMP_TOPK &&
          d.comp_momentum == c.comp_momentum, "the resolved config keeps [compression]");
    free(text);
#undef B
}

// ----------------------------------------------------------------------------
// 2. one process

static void conservation(dt_comm_t comm, int method) {
    dt_config c;
    config(&c, method, 1);
    c.comp_ratio = 0.05f;
    size_t n = 2000, cut[] = {0, 1500, 2000};
    static const dt_grad_matrix mats[] = {{0, 30, 40}, {1300, 20, 30}};  // PowerSGD's, the second across the cut
    g_mats = mats, g_nmats = 2;
    dt_codec *k = codec(&c, comm, n);
    g_mats = NULL, g_nmats = 0;
    float *g = malloc(n * sizeof *g), *want = malloc(n * sizeof *g);
    double worst = 0;
    for (int s = 0; s < 5; s++) {
        input(g, n, 0, s);
        for (size_t i = 0; i < n; i++) want[i] = g[i] + k->residual[i];
        CHECK(step(k, g, cut, 2) == DT_OK, "%s: step %d", methods[method], s);
        for (size_t i = 0; i < n; i++) {
            double e = fabs((double)g[i] + k->residual[i] - want[i]) / (fabs(want[i]) + 1e-3);
            worst = e > worst ? e : worst;
        }
    }
    CHECK(worst < 1e-5, "%s: sent + residual = input over 5 steps (worst relative error %.3g)", methods[method], worst);
    printf("error feedback %-8s: sent + residual = input, worst relative error %.2g\n", methods[method], worst);
    dt_codec_free(k);
    free(g);
    free(want);
}

// Means of T decoded outputs of one fixed x, against x: returns the largest
// |mean - x| in units of its standard error (per element, from the
// estimator's variance bound sd1[i]) and the overall z of the summed error.
static void bias(dt_comm_t comm, int method, float ratio, int levels, int expect_unbiased) {
    dt_config c;
    config(&c, method, 0);
    c.comp_ratio = ratio;
    c.comp_levels = levels;
    size_t n = 1000, cut[] = {0, 1000};
    int T = 4000;
    dt_codec *k = codec(&c, comm, n);
    float *x = malloc(n * sizeof *x), *g = malloc(n * sizeof *g);
    double *sum = calloc(n, sizeof *sum);
    input(x, n, 3, 0);
    for (int t = 0; t < T; t++) {
        memcpy(g, x, n * sizeof *g);
        if (step(k, g, cut, 1) != DT_OK) break;
        for (size_t i = 0; i < n; i++) sum[i] += g[i];
    }
    double amax = 0;  // the largest |x|: no chunk's is larger
    for (size_t i = 0; i < n; i++) amax = fabs((double)x[i]) > amax ? fabs((double)x[i]) : amax;
    double zmax = 0, esum = 0, vsum = 0;
    for (size_t i = 0; i < n; i++) {
        // per-draw variance bounds: qsgd (s/2)^2 with s the chunk's step; random-k x^2 (1/ratio - 1)
        double var = method == DT_COMP_QSGD ? pow(amax / levels / 2, 2) : (double)x[i] * x[i] * (1 / ratio - 1);
        double e = sum[i] / T - x[i], sd = sqrt(var / T) + 1e-9;
        zmax = fabs(e) / sd > zmax ? fabs(e) / sd : zmax;
        esum += e;
        vsum += var / T;
    }
    double z = fabs(esum) / sqrt(vsum + 1e-30);
    if (expect_unbiased)
        CHECK(zmax < 6 && z < 5, "%s: unbiased: worst element %.2f standard errors, sum z %.2f", methods[method], zmax, z);
    else
        CHECK(zmax > 6, "%s (biased): the test notices, worst element %.2f standard errors", methods[method], zmax);
    printf("bias %-8s ratio %.2g levels %d, %d draws: worst element %.2f standard errors, sum z %.2f\n",
           methods[method], ratio, levels, T, zmax, z);
    dt_codec_free(k);
    free(x);
    free(g);
    free(sum);
}

// A linear layer's gradient and its bias as PowerSGD sees them: W (24 x
// 50, so that a square view of the block, 35 wide, mixes its rows) then b
// (24). W = sum of `rank` outer products u_j v_j^T; b arbitrary.
static const dt_grad_matrix lin[] = {{0, 24, 50}};
static void low_rank(float *x, int rank, int seed) {
    dt_rng r;
    dt_rng_seed(&r, (uint64_t)seed);
    float u[4][24], v[4][50];
    for (int j = 0; j < rank; j++) {
        for (int i = 0; i < 24; i++) u[j][i] = dt_rng_normal(&r);
        for (int c = 0; c < 50; c++) v[j][c] = dt_rng_normal(&r) * 0.01f;
    }
    for (int i = 0; i < 24; i++)
        for (int c = 0; c < 50; c++) {
            float a = 0;
            for (int j = 0; j < rank; j++) a += u[j][i] * v[j][c];
            x[i * 50 + c] = a;
        }
    for (int i = 0; i < 24; i++) x[1200 + i] = dt_rng_normal(&r);
}

static void powersgd_exact(dt_comm_t comm) {
    dt_config c;
    config(&c, DT_COMP_POWERSGD, 1);
    size_t n = 1224, cut[] = {0, 1224};
    float *x = malloc(n * sizeof *x), *g = malloc(n * sizeof *g);
    g_mats = lin, g_nmats = 1;
    // Rank r on a gradient of rank r in its tensor's shape: exact, step
    // after step (r = 24 = min(rows, cols): the matrix goes whole). The
    // steps scale one gradient: a warm-started Q of another gradient's rows
    // can leave M Q ill-conditioned in fp32.
    static const int rk[] = {1, 3, 24};
    for (int t = 0; t < 3; t++) {
        c.comp_rank = rk[t];
        dt_codec *k = codec(&c, comm, n);
        for (int s = 0; s < 3; s++) {
            low_rank(x, rk[t] < 4 ? rk[t] : 4, 10 * t);
            for (size_t i = 0; i < n; i++) x[i] *= (float)(s + 1);
            memcpy(g, x, n * sizeof *g);
            CHECK(step(k, g, cut, 1) == DT_OK, "powersgd rank %d step %d", rk[t], s);
            double d = tl_max_rel(g, x, n, 1e-2);
            CHECK(d < 1e-4, "powersgd rank %d returns a gradient of rank %d in its tensor's shape (step %d: max rel "
                  "diff %.3g)", rk[t], rk[t] < 4 ? rk[t] : 4, s, d);
            if (s == 2) printf("powersgd rank %d on a 24 x 50 weight of rank %d and a bias: max relative difference %.2g\n",
                               rk[t], rk[t] < 4 ? rk[t] : 4, d);
        }
        dt_codec_free(k);
    }
    // The same rank-1 gradient without the tensor's shape (the block as one
    // vector viewed 35 wide, the bias beside the weight) is not exact at rank
    // 1: the test tells the layouts apart.
    c.comp_rank = 1;
    static const dt_grad_matrix square[] = {{0, 34, 36}};
    g_mats = square;
    dt_codec *k = codec(&c, comm, n);
    low_rank(x, 1, 0);
    memcpy(g, x, n * sizeof *g);
    step(k, g, cut, 1);
    CHECK(tl_max_rel(g, x, n, 1e-2) > 1e-2, "powersgd rank 1 of the same values cut 36 wide is not exact");
    dt_codec_free(k);
    // ... nor is a full-rank weight at rank 1.
    g_mats = lin;
    k = codec(&c, comm, n);
    input(x, n, 1, 0);
    memcpy(g, x, n * sizeof *g);
    step(k, g, cut, 1);
    CHECK(tl_max_rel(g, x, n, 1e-2) > 1e-2, "powersgd rank 1 of a random matrix is not exact");
    dt_codec_free(k);
    // warmup_steps = 2: the first two steps are the plain sum, bitwise; the
    // third is compressed.
    c.comp_warmup_steps = 2;
    k = codec(&c, comm, n);
    for (int s = 0; s < 3; s++) {
        input(x, n, 2, s);
        memcpy(g, x, n * sizeof *g);
        CHECK(step(k, g, cut, 1) == DT_OK, "powersgd warmup step %d", s);
        int same = !memcmp(g, x, n * sizeof *g);
        CHECK(same == (s < 2), "powersgd warmup_steps = 2: step %d %s the plain sum", s, same ? "is" : "is not");
    }
    printf("powersgd warmup_steps = 2: steps 0 and 1 the plain sum bitwise, step 2 compressed\n");
    dt_codec_free(k);
    g_mats = NULL, g_nmats = 0;
    free(x);
    free(g);
}

static int cmp_mag(const void *a, const void *b, void *x);

// Top-k with DGC's warm-up, momentum correction and local clipping against
// a serial reference of the paper's algorithm (one piece, a world of 1).
static void dgc(dt_comm_t comm) {
    dt_config c;
    config(&c, DT_COMP_TOPK, 1);
    c.comp_ratio = 0.01f;
    c.comp_warmup_steps = 3;
    c.comp_momentum = 0.9f;
    c.comp_clip_norm = 0.5f;
    size_t n = 3000, cut[] = {0, 3000};
    dt_codec *k = codec(&c, comm, n);
    float *g = malloc(n * sizeof *g), *u = calloc(n, sizeof *u), *v = calloc(n, sizeof *v), *x = malloc(n * sizeof *x);
    uint32_t *idx = malloc(n * sizeof *idx);
    int clipped = 0;
    for (int s = 0; s < 6; s++) {
        input(x, n, 0, s);
        memcpy(g, x, n * sizeof *g);
        CHECK(step(k, g, cut, 1) == DT_OK, "dgc step %d", s);
        double nn = 0;
        for (size_t i = 0; i < n; i++) nn += (double)x[i] * x[i];
        if (sqrt(nn) > 0.5) {  // local clipping to clip_norm (one piece, one worker)
            clipped++;
            for (size_t i = 0; i < n; i++) x[i] *= (float)(0.5 / sqrt(nn));
        }
        for (size_t i = 0; i < n; i++) {
            u[i] = 0.9f * u[i] + x[i];
            v[i] = v[i] + u[i];
        }
        double density = s < 3 ? pow(0.01, (s + 1) / 4.0) : 0.01;
        size_t kk = (size_t)ceil(density * (double)n), nz = 0;
        for (size_t i = 0; i < n; i++) idx[i] = (uint32_t)i;
        qsort_r(idx, n, sizeof *idx, cmp_mag, v);
        double worst = 0;
        for (size_t j = 0; j < kk; j++) {
            size_t i = idx[j];
            worst = fmax(worst, fabs((double)g[i] - v[i]) / (fabs(v[i]) + 1e-6));
            v[i] = u[i] = 0;
        }
        for (size_t i = 0; i < n; i++) nz += g[i] != 0;
        CHECK(nz == kk && worst < 1e-6, "dgc step %d: %zu values sent (expected %zu), worst relative error %.3g", s, nz,
              kk, worst);
        printf("top-k DGC step %d: density %.4f, %zu of %zu sent, matches the reference (worst %.2g)\n", s, density, nz,
               n, worst);
    }
    CHECK(clipped > 0, "dgc: the test's gradients reach the clipping threshold");
    dt_codec_free(k);
    free(g), free(u), free(v), free(x), free(idx);
}

// Top-k on a piece large enough for the sampled threshold (len / 64 >=
// 2048): exactly the k largest |x|, ties taken in index order, as the full
// selection gives; on normals of varying scale, on values mostly tied below
// the k largest (too many pass the sample's threshold: the full selection)
// and on a few large values among many small.
static void topk_sampled(dt_comm_t comm) {
    dt_config c;
    config(&c, DT_COMP_TOPK, 0);
    c.comp_ratio = 0.01f;
    size_t n = 400000, kk = 4000, cut[] = {0, n};
    dt_codec *k = codec(&c, comm, n);
    float *g = malloc(n * sizeof *g), *x = malloc(n * sizeof *x);
    uint32_t *idx = malloc(n * sizeof *idx);
    for (int s = 0; s < 6; s++) {
        input(x, n, 0, s);
        if (s == 4)  // 500 a little over 1.5, then |x| = 1.5 tied (too many pass), the k largest at the end
            for (size_t i = 0; i < n; i++)
                x[i] = i < 500        ? 1.5f + 1e-5f * (float)(i + 1)
                       : i < n - kk ? (i % 2 ? 1.5f : -1.5f)
                                    : 2.0f + 1e-4f * (float)(n - i);
        if (s == 5)
            for (size_t i = 0; i < n; i++) x[i] = i % 20000 ? x[i] * 1e-3f : 100.0f + (float)i;  // 20 large
        memcpy(g, x, n * sizeof *g);
        CHECK(step(k, g, cut, 1) == DT_OK, "top-k sampled step %d", s);
        for (size_t i = 0; i < n; i++) idx[i] = (uint32_t)i;
        qsort_r(idx, n, sizeof *idx, cmp_mag, x);
        size_t wrong = 0;
        for (size_t j = 0; j < n; j++) wrong += g[idx[j]] != (j < kk ? x[idx[j]] : 0.0f);
        CHECK(wrong == 0, "top-k of %zu values, step %d: %zu values differ from the k = %zu largest", n, s, wrong, kk);
    }
    printf("top-k of %zu values (sampled threshold): the exact %zu largest at 6 steps, ties and skews included\n", n,
           kk);
    dt_codec_free(k);
    free(g), free(x), free(idx);
}

// Point-to-point messages (a parameter server's pushes): on a world of 1,
// decode(encode(x)) is bitwise what the collective path gives (the sum of
// one rank's message) and the residuals are the same, over 3 steps of
// error feedback; random-k and PowerSGD have none; a message of the wrong
// size or with an index past the piece is refused, naming it.
static void p2p(dt_comm_t comm) {
    static const int ms[] = {DT_COMP_FP16, DT_COMP_BF16, DT_COMP_INT8, DT_COMP_QSGD, DT_COMP_SIGN, DT_COMP_TOPK};
    size_t n = 3000, cut[] = {0, n};
    float *g = malloc(n * sizeof *g), *h = malloc(n * sizeof *h), *out = malloc(n * sizeof *out);
    for (size_t i = 0; i < sizeof ms / sizeof *ms; i++) {
        dt_config c;
        config(&c, ms[i], 1);
        c.comp_ratio = 0.05f;
        CHECK(dt_codec_p2p(&c), "%s has point-to-point messages", methods[ms[i]]);
        dt_codec *a = codec(&c, comm, n), *b = codec(&c, comm, n);
        size_t diff = 0, rdiff = 0, bytes = 0;
        for (int s = 0; s < 3 && a && b; s++) {
            input(g, n, 0, s);
            memcpy(h, g, n * sizeof *g);
            CHECK(step(a, g, cut, 1) == DT_OK, "%s step %d", methods[ms[i]], s);
            const uint8_t *msg = NULL;
            bytes = b->ops->encode(b, h, 0, n, &msg);
            CHECK(bytes > 0 && dt_codec_decode(&c, msg, bytes, n, out) == DT_OK, "%s: encode and decode: %s",
                  methods[ms[i]], dt_last_error());
            for (size_t j = 0; j < n; j++) diff += memcmp(&out[j], &g[j], sizeof *g) != 0;
            for (size_t j = 0; j < n; j++) rdiff += memcmp(&a->residual[j], &b->residual[j], sizeof *g) != 0;
        }
        CHECK(diff == 0 && rdiff == 0, "%s: a message decoded is the one-rank sum bitwise (%zu values differ), the "
              "residuals alike (%zu differ)", methods[ms[i]], diff, rdiff);
        printf("point to point: %s, %zu bytes for %zu values, decoded bitwise as the collective path\n",
               methods[ms[i]], bytes, n);
        uint8_t junk[64] = {0};
        CHECK(dt_codec_decode(&c, junk, 60, n, out) == DT_ERR_ARG && strstr(dt_last_error(), "message of 60 bytes"),
              "%s: a message of 60 bytes refused: %s", methods[ms[i]], dt_last_error());
        dt_codec_free(a);
        dt_codec_free(b);
    }
    dt_config c;
    config(&c, DT_COMP_TOPK, 1);
    uint8_t bad[8] = {0xff, 0xff, 0, 0, 0, 0, 0x80, 0x3f};  // index 65535 of 3000
    CHECK(dt_codec_decode(&c, bad, 8, n, out) == DT_ERR_ARG && strstr(dt_last_error(), "index 65535 of 3000"),
          "a topk pair past the piece refused: %s", dt_last_error());
    config(&c, DT_COMP_RANDOMK, 1);
    CHECK(!dt_codec_p2p(&c), "random-k has no point-to-point message");
    config(&c, DT_COMP_POWERSGD, 1);
    CHECK(!dt_codec_p2p(&c), "PowerSGD has no point-to-point message");
    free(g), free(h), free(out);
}

// ----------------------------------------------------------------------------
// 3. ranks: the serial reference

typedef struct {
    int method, ef, W;
    float ratio;
    int levels, rank, min_bytes;  // levels: QSGD's; PowerSGD's and top-k's warmup_steps
} setup;

static int cmp_mag(const void *a, const void *b, void *x) {
    const float *v = x;
    uint32_t i = *(const uint32_t *)a, j = *(const uint32_t *)b;
    float fi = fabsf(v[i]), fj = fabsf(v[j]);
    return fi > fj ? -1 : fi < fj ? 1 : (i > j) - (i < j);
}

// Rank q's decoded contribution d[len] of x[len] (deterministic methods).
static void ref_encode(const setup *u, const float *x, size_t len, float *d) {
    dt_dtype t = u->method == DT_COMP_FP16 ? DT_F16 : DT_BF16;
    uint16_t h;
    switch (u->method) {
    case DT_COMP_FP16:
    case DT_COMP_BF16:
        for (size_t i = 0; i < len; i++) dt_from_f32(&h, &x[i], 1, t), dt_to_f32(&d[i], &h, 1, t);
        break;
    case DT_COMP_INT8:
    case DT_COMP_SIGN:
        for (size_t a = 0; a < len; a += 512) {
            size_t b = a + 512 < len ? a + 512 : len;
            double m = 0;
            for (size_t i = a; i < b; i++) m = u->method == DT_COMP_INT8 ? fmax(m, fabs(x[i])) : m + fabs(x[i]);
            float s = u->method == DT_COMP_INT8 ? (float)(m / 127) : (float)(m / (double)(b - a));
            for (size_t i = a; i < b; i++)
                d[i] = u->method == DT_COMP_SIGN ? (x[i] >= 0 ? s : -s) : (s > 0 ? rintf(x[i] / s) * s : 0);
        }
        break;
    case DT_COMP_TOPK: {
        size_t kk = (size_t)ceil((double)u->ratio * (double)len);
        uint32_t *idx = malloc(len * sizeof *idx);
        for (size_t i = 0; i < len; i++) idx[i] = (uint32_t)i;
        qsort_r(idx, len, sizeof *idx, cmp_mag, (void *)x);
        memset(d, 0, len * sizeof *d);
        for (size_t j = 0; j < kk; j++) d[idx[j]] = x[idx[j]];
        free(idx);
        break;
    }
    default: memcpy(d, x, len * sizeof *d);
    }
}

// The rank test's matrices in its block of 3000 (pieces [0, 700), [700,
// 713), [713, 3000)): A 30 x 20 inside the first piece, a vector, B 50 x 40
// across all three (its row 0 alone in the first piece, too small to
// compress, and a partial row; rows 2 to 49 in the third), C 7 x 50.
static const dt_grad_matrix rank_mats[] = {{0, 30, 20}, {650, 50, 40}, {2650, 7, 50}};

// PowerSGD's serial reference over piece [lo, hi) at step `step`, from every
// rank's input xs[W][n] (residuals added): each matrix's whole rows in the
// piece, when their factors are smaller, compressed with the codec's first
// Qs (*qs NULL: drawn as the codec draws them) or the ones kept in *qs; the
// decoded sum into want (the plain sum elsewhere, as want holds), each
// rank's residual into res[W][n] (when not NULL).
static void ref_powersgd(dt_codec *k, int rank, int W, const float *xs, size_t n, size_t lo, size_t hi, int64_t step,
                         float **qs, float *want, float *res) {
    for (int q = 0; q < W && res; q++) memset(res + (size_t)q * n + lo, 0, (hi - lo) * sizeof *res);
    dt_codec_piece first = {.lo = lo, .step = step};
    if (!*qs) {
        *qs = malloc(n * (size_t)rank * sizeof **qs);
        dt_codec_piece_begin(k, &first, 0x905);
    }
    float *Q = *qs;
    for (size_t m = 0; m < sizeof rank_mats / sizeof *rank_mats; m++) {
        size_t C = rank_mats[m].cols, R = 0, at = 0;
        for (size_t j = 0; j < rank_mats[m].rows; j++) {
            size_t a = rank_mats[m].offset + j * C;
            if (a < lo || a + C > hi) continue;
            if (!R++) at = a;
        }
        size_t r = (size_t)rank < R ? (size_t)rank : R;
        r = r < C ? r : C;
        if (!R || (R + C) * r >= R * C) continue;
        if (first.step == step + 1)  // drawn now: the codec's first Qs
            for (size_t i = 0; i < C * r; i++) Q[i] = dt_rng_normal(&first.rng);
        double *P = calloc(R * r, sizeof *P), *Qn = calloc(C * r, sizeof *Qn);
        for (int q = 0; q < W; q++)
            for (size_t i = 0; i < R; i++)
                for (size_t c = 0; c < C; c++)
                    for (size_t j = 0; j < r; j++)
                        P[i * r + j] += (double)xs[(size_t)q * n + at + i * C + c] * Q[j * C + c];
        // P's columns orthonormalized another way than the codec's:
        // Cholesky QR, P L^-T with L L^T = P^T P (r <= 3, well conditioned).
        double L[64][64] = {{0}};
        for (size_t a = 0; a < r; a++)
            for (size_t b = 0; b <= a; b++) {
                double v = 0;
                for (size_t i = 0; i < R; i++) v += P[i * r + a] * P[i * r + b];
                for (size_t e = 0; e < b; e++) v -= L[a][e] * L[b][e];
                L[a][b] = a == b ? sqrt(v) : v / L[b][b];
            }
        for (size_t i = 0; i < R; i++)
            for (size_t a = 0; a < r; a++) {
                for (size_t e = 0; e < a; e++) P[i * r + a] -= P[i * r + e] * L[a][e];
                P[i * r + a] /= L[a][a];
            }
        for (int q = 0; q < W; q++)
            for (size_t i = 0; i < R; i++)
                for (size_t c = 0; c < C; c++)
                    for (size_t j = 0; j < r; j++) Qn[c * r + j] += (double)xs[(size_t)q * n + at + i * C + c] * P[i * r + j];
        for (size_t i = 0; i < R; i++)
            for (size_t c = 0; c < C; c++) {
                double v = 0;
                for (size_t j = 0; j < r; j++) v += P[i * r + j] * Qn[c * r + j];
                want[at + i * C + c] = (float)v;
                for (int q = 0; q < W && res; q++)
                    res[(size_t)q * n + at + i * C + c] = xs[(size_t)q * n + at + i * C + c] - (float)v / (float)W;
            }
        for (size_t c = 0; c < C; c++)  // kept transposed, as the codec keeps it
            for (size_t j = 0; j < r; j++) Q[j * C + c] = (float)Qn[c * r + j];
        Q += C * r;
        free(P), free(Qn);
    }
}

// The two-phase quantized sum's second phase over piece [lo, hi) of W
// chunks: each chunk's sum want (+ its residual res2 with error feedback)
// re-quantized; QSGD: its step added to the bound of the plain sum.
static void phase2(const setup *u, float *want, float *bound, float *res2, size_t lo, size_t hi, int W) {
    size_t len = hi - lo;
    for (int j = 0; j < W; j++) {
        size_t a = lo + len * j / W, b = lo + len * (j + 1) / W;
        if (u->method == DT_COMP_QSGD) {  // |the decoded sum| <= |the plain sum| + the first phase's bound
            for (size_t c = a; c < b; c += 512) {
                size_t e = c + 512 < b ? c + 512 : b;
                double mx = 0;
                for (size_t i = c; i < e; i++) mx = fmax(mx, fabs((double)want[i]) + bound[i]);
                for (size_t i = c; i < e; i++) bound[i] += (float)(mx / u->levels) * 1.0001f;
            }
            continue;
        }
        float *sum = malloc((b - a) * sizeof *sum);
        for (size_t i = a; i < b; i++) sum[i - a] = want[i] + (u->ef ? res2[i] : 0);
        ref_encode(u, sum, b - a, want + a);
        for (size_t i = a; i < b && u->ef; i++) res2[i] = sum[i - a] - want[i];
        free(sum);
    }
}

// The rank side: three steps, every rank's result checked; exit status.
static int rank_main(const setup *u) {
    dt_comm_t comm;
    if (dt_comm_init_env(&comm) != DT_OK) return fprintf(stderr, "comm: %s\n", dt_last_error()), 1;
    int W = dt_comm_size(comm), me = dt_comm_rank(comm);
    dt_config c;
    config(&c, u->method, u->ef);
    c.comp_ratio = u->ratio;
    c.comp_levels = u->levels;
    c.comp_rank = u->rank;
    c.comp_min_bytes = u->min_bytes;
    if (u->method == DT_COMP_POWERSGD) c.comp_warmup_steps = u->levels, g_mats = rank_mats, g_nmats = 3;
    if (u->method == DT_COMP_TOPK) c.comp_warmup_steps = u->levels;
    size_t n = 3000, cut[] = {0, 700, 713, 3000};  // 713 - 700: 52 bytes, under min_bytes 100
    dt_codec *k = codec(&c, comm, n);
    float *qs[3] = {NULL};
    if (!k) return 1;
    float *g = malloc(n * sizeof *g), *x = malloc(n * sizeof *x), *d = malloc(n * sizeof *d);
    int quant = u->method == DT_COMP_INT8 || u->method == DT_COMP_QSGD || u->method == DT_COMP_SIGN;
    float *res2 = calloc(n, sizeof *res2);  // the re-quantized sums' residuals (each position's owner's)
    float *res = calloc((size_t)W * n, sizeof *res), *xall = malloc((size_t)W * n * sizeof *xall), *want = malloc(n * sizeof *want), *bound = malloc(n * sizeof *bound);
    int bad = 0;
    for (int s = 0; s < 3 && !bad; s++) {
        input(g, n, me, s);
        if (step(k, g, cut, 3) != DT_OK) return fprintf(stderr, "step: %s\n", dt_last_error()), 1;
        memset(want, 0, n * sizeof *want);
        memset(bound, 0, n * sizeof *bound);
        for (int q = 0; q < W; q++) {
            input(x, n, q, s);
            float *r = res + (size_t)q * n;
            for (int p = 0; p < 3; p++) {
                size_t lo = cut[p], len = cut[p + 1] - lo;
                int small = len * 4 < (size_t)u->min_bytes;
                setup at = *u;  // top-k's warm-up: its density at step s; at 1/W or more, the plain sum
                int dense = 0;
                if (u->method == DT_COMP_TOPK && s < u->levels) {
                    at.ratio = (float)pow(u->ratio, (s + 1.0) / (u->levels + 1.0));
                    dense = (size_t)ceil((double)at.ratio * (double)len) * (size_t)W >= len;
                }
                for (size_t i = lo; i < lo + len && !small; i++) x[i] += r[i];
                if (small || dense || u->method == DT_COMP_POWERSGD || u->method == DT_COMP_QSGD ||
                    u->method == DT_COMP_RANDOMK) {
                    memcpy(d + lo, x + lo, len * sizeof *d);  // checked against the plain sum below
                    if (u->method == DT_COMP_QSGD && !small)
                        for (size_t a = lo; a < lo + len; a += 512) {  // one level of the chunk per value
                            size_t b = a + 512 < lo + len ? a + 512 : lo + len;
                            double mx = 0;
                            for (size_t i = a; i < b; i++) mx = fabs((double)x[i]) > mx ? fabs((double)x[i]) : mx;
                            for (size_t i = a; i < b; i++) bound[i] += (float)(mx / u->levels) * 1.0001f;
                        }
                } else if (quant && W >= 3) {  // the two-phase sum: each rank's W chunks encoded alone
                    for (int j = 0; j < W; j++)
                        ref_encode(&at, x + lo + len * j / W, len * (j + 1) / W - len * j / W, d + lo + len * j / W);
                } else {
                    ref_encode(&at, x + lo, len, d + lo);
                }
                if (u->ef && !small && u->method != DT_COMP_RANDOMK && u->method != DT_COMP_POWERSGD)
                    for (size_t i = lo; i < lo + len; i++) r[i] = x[i] - d[i];
            }
            for (size_t i = 0; i < n; i++) want[i] += d[i];
            memcpy(xall + (size_t)q * n, x, n * sizeof *x);
        }
        for (int p = 0; p < 3 && quant && W >= 3; p++)  // ... and each chunk's sum re-quantized
            if ((cut[p + 1] - cut[p]) * 4 >= (size_t)u->min_bytes) phase2(u, want, bound, res2, cut[p], cut[p + 1], W);
        for (int p = 0; p < 3 && u->method == DT_COMP_POWERSGD && s >= u->levels; p++)
            if ((cut[p + 1] - cut[p]) * 4 >= (size_t)u->min_bytes)
                ref_powersgd(k, u->rank, W, xall, n, cut[p], cut[p + 1], s, &qs[p], want, u->ef ? res : NULL);
        if (u->method == DT_COMP_FP16 || u->method == DT_COMP_BF16) {  // the sum is rounded once more
            for (size_t i = 0; i < n; i++) {
                if (cut[1] + 13 > i && i >= cut[1]) continue;
                float t = want[i];
                ref_encode(u, &t, 1, &want[i]);
            }
        }
        double worst = 0, tol = u->method == DT_COMP_FP16 || u->method == DT_COMP_POWERSGD ? 1e-3
                                : u->method == DT_COMP_BF16 ? 8e-3 : 1e-5;
        size_t chosen = 0, kk = (size_t)ceil((double)u->ratio * 2287) + (size_t)ceil((double)u->ratio * 700);
        for (size_t i = 0; i < n; i++) {
            if (u->method == DT_COMP_RANDOMK && !(i >= 700 && i < 713)) {
                // The chosen indices are the nonzeros; there, the plain sum;
                // elsewhere each rank keeps its value.
                for (int q = 0; q < W && u->ef; q++) res[(size_t)q * n + i] = g[i] == 0 ? xall[(size_t)q * n + i] : 0;
                if (g[i] == 0) continue;
                chosen++;
            }
            double e = fabs((double)g[i] - want[i]);
            if (u->method == DT_COMP_QSGD) e = e > bound[i] + 1e-6 ? e : 0;
            else e /= fabs(want[i]) + 1e-2;
            worst = e > worst ? e : worst;
        }
        if (u->method == DT_COMP_RANDOMK) {
            if (chosen != kk) bad = fprintf(stderr, "rank %d step %d: randomk chose %zu values, expected %zu\n", me, s, chosen, kk);
        }
        if (worst > tol)
            bad = fprintf(stderr, "rank %d step %d: %s differs from the serial reference (worst %.3g > %.1g)\n", me, s,
                          methods[u->method], worst, tol);
    }
    dt_codec_free(k);
    dt_comm_destroy(comm);
    if (!bad) printf("rank %d of %d: %s matches the serial reference\n", me, W, methods[u->method]);
    free(res2), free(g), free(x), free(d), free(res), free(xall), free(want), free(bound), free(qs[0]), free(qs[1]), free(qs[2]);
    return bad ? 1 : 0;
}

static void ranks(const char *self, int N, const setup *u) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s run -n %d -- %s rank %d %d %g %d %d %d", tl_dtrain(), N, self, u->method, u->ef,
             u->ratio, u->levels, u->rank, u->min_bytes);
    int rc = tl_run(cmd, g_out, sizeof g_out);
    CHECK(rc == 0, "%d ranks, %s ef=%d: exit %d\n%s", N, methods[u->method], u->ef, rc,
          g_out);
    if (rc == 0)
        printf("%d ranks: %-8s ratio %g levels %d rank %d error_feedback %d: every rank matches the serial reference\n",
               N, methods[u->method], u->ratio, u->levels, u->rank, u->ef);
}

// ----------------------------------------------------------------------------
// bytes: what a worker sends for the quantized sums, at any number of ranks

enum { BYTES_N = 3 * 4096 + 7 };  // one piece, not a multiple of the ranks or of a chunk of 512

// The rank side: two steps of a quantized sum of one piece; prints this
// rank's bytes sent and what fp32's allreduce would send; exit status.
static int bytes_main(int method) {
    dt_comm_t comm;
    if (dt_comm_init_env(&comm) != DT_OK) return fprintf(stderr, "comm: %s\n", dt_last_error()), 1;
    dt_config c;
    config(&c, method, 1);
    dt_codec *k = codec(&c, comm, BYTES_N);
    float *g = malloc(BYTES_N * sizeof *g);
    size_t cut[] = {0, BYTES_N};
    dt_status st = k && g ? DT_OK : DT_ERR_NOMEM;
    for (int s = 0; s < 2 && st == DT_OK; s++) {
        input(g, BYTES_N, dt_comm_rank(comm), s);
        st = step(k, g, cut, 1);
    }
    dt_comm_stats cs;
    dt_comm_get_stats(comm, &cs);
    if (st == DT_OK && dt_comm_rank(comm) == 0) printf("sent %llu\n", (unsigned long long)cs.bytes_sent);
    if (st != DT_OK) fprintf(stderr, "rank %d: %s\n", dt_comm_rank(comm), dt_last_error());
    dt_codec_free(k);
    free(g);
    dt_comm_destroy(comm);
    return st == DT_OK ? 0 : 1;
}

// A message's bytes for len values: an fp32 scale a chunk of 512, the codes.
static double msg(int method, size_t len) {
    size_t bits = method == DT_COMP_SIGN ? 1 : method == DT_COMP_QSGD ? 4 : 8;
    return (double)(((len + 511) / 512 * 4 + (len * bits + 7) / 8 + 3) / 4 * 4);
}

// W ranks (oversubscribed) for int8, qsgd and sign: rank 0's bytes over two
// steps are the formula's (one message to each peer on 2 ranks; from 3,
// 2 (W - 1) messages of the largest of the W chunks), the same share of
// fp32's at every W.
static void bytes_per_worker(const char *self) {
    static const int ws[] = {2, 3, 4, 8, 16, 64}, ms[] = {DT_COMP_INT8, DT_COMP_QSGD, DT_COMP_SIGN};
    for (size_t i = 0; i < sizeof ms / sizeof *ms; i++) {
        char line[512] = "";
        size_t at = 0;
        for (size_t j = 0; j < sizeof ws / sizeof *ws; j++) {
            int W = ws[j], m = ms[i];
            if (m != DT_COMP_INT8 && W == 64) continue;  // (one 64-rank run is enough)
            char cmd[2048];
            snprintf(cmd, sizeof cmd, "%s run -n %d -- %s bytes %d", tl_dtrain(), W, self, m);
            int rc = tl_run(cmd, g_out, sizeof g_out);
            const char *sent = strstr(g_out, "sent ");
            double got = rc == 0 && sent ? atof(sent + 5) : -1, fp32 = 2.0 * 2 * (W - 1) * BYTES_N * 4 / W;
            double want = 2 * (W <= 2 ? (W - 1) * msg(m, BYTES_N) : 2.0 * (W - 1) * msg(m, (BYTES_N + W - 1) / W));
            CHECK(got == want, "%s on %d ranks: rank 0 sent %.0f bytes in 2 steps, the formula %.0f (exit %d)\n%s",
                  methods[m], W, got, want, rc, g_out);
            at += (size_t)snprintf(line + at, sizeof line - at, " W=%d %.3f", W, got / fp32);
        }
        printf("bytes per worker, %s, of fp32's:%s\n", methods[ms[i]], line);
    }
}

// ----------------------------------------------------------------------------
// 4. training

static char g_tmp[256];

// A 40-step run of N workers (--quiet unless extra has --resume: the
// resume's lines are checked).
static int train(const char *name, int N, const char *extra) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "%s train configs/fashion-mlp.ini --workers %d %s --run-dir %s/%s --set data.dir=%s "
             "--set train.batch=40 --set train.max_steps=40 --set train.epochs=0 --set train.eval_batch=100 %s",
             tl_dtrain(), N, strstr(extra, "--resume") ? "" : "--quiet", g_tmp, name, g_tmp, extra);
    int rc = tl_run(cmd, g_out, sizeof g_out);
    if (rc != 0) fprintf(stderr, "%s\n-> exit %d\n%s\n", cmd, rc, g_out);
    return rc;
}

// A number of the run's summary.json (-1: none).
static double summary(const char *name, const char *key) {
    char path[600], k[64];
    snprintf(path, sizeof path, "%s/%s/summary.json", g_tmp, name);
    snprintf(k, sizeof k, "\"%s\":", key);
    char *s = tl_read_file(path, NULL);
    const char *a = s ? strstr(s, k) : NULL;
    double v = a ? atof(a + strlen(k)) : -1;
    free(s);
    return v;
}

static void training(void) {
    snprintf(g_tmp, sizeof g_tmp, "/tmp/dtrain-test-compress-XXXXXX");
    if (!mkdtemp(g_tmp)) return;
    tl_make_images(g_tmp, "train", 400, 1);
    tl_make_images(g_tmp, "t10k", 100, 2);
    const char *rep = "--set compression.method=topk --set compression.ratio=0.05 --set compression.momentum=0.5 "
                      "--set compression.warmup_steps=5 --set compression.clip_norm=10 --set parallel.bucket_kb=64";
    CHECK(train("topk-a", 2, rep) == 0 && train("topk-b", 2, rep) == 0, "topk runs");
    int bw = 0;
    char a[600], b[600];
    snprintf(a, sizeof a, "%s/topk-a/model.safetensors", g_tmp);
    snprintf(b, sizeof b, "%s/topk-b/model.safetensors", g_tmp);
    double d = tl_weights_diff(a, b, &bw);
    CHECK(bw, "the same top-k run twice is bitwise equal (max rel diff %.3g)", d);
    printf("training: top-k 5%% with DGC, 2 workers, twice: %s\n", bw ? "bitwise equal" : "differs");
    CHECK(train("plain", 2, "--checkpoint-every 40") == 0, "uncompressed run");
    double base = summary("plain", "test_accuracy"), plain_bytes = summary("plain", "bytes_sent");
    CHECK(plain_bytes > 0, "summary.json has bytes_sent (%.0f)", plain_bytes);
    // The wire's share of the uncompressed bytes, per method (2 workers).
    const double share[] = {0.52, 0.52, 0.27, 0.14, 0.05, 0.22, 0.12, 0.02};
    const char *lossy[] = {"fp16", "bf16", "int8", "qsgd", "sign", "topk", "randomk", "powersgd"};
    for (int i = 0; i < 8; i++) {
        char extra[200], name[32];
        snprintf(extra, sizeof extra, "--set compression.method=%s --set compression.ratio=0.1", lossy[i]);
        snprintf(name, sizeof name, "run-%s", lossy[i]);
        int rc = train(name, 2, extra);
        // Repeated, bitwise the same.
        char again[40];
        snprintf(again, sizeof again, "%s-again", name);
        CHECK(train(again, 2, extra) == 0, "%s: the repeat runs", lossy[i]);
        snprintf(a, sizeof a, "%s/%s/model.safetensors", g_tmp, name);
        snprintf(b, sizeof b, "%s/%s/model.safetensors", g_tmp, again);
        d = tl_weights_diff(a, b, &bw);
        CHECK(bw, "%s: the same 2-worker run twice is bitwise equal (max rel diff %.3g)", lossy[i], d);
        double acc = summary(name, "test_accuracy"), bytes = summary(name, "bytes_sent");
        CHECK(rc == 0 && acc > 0.5, "%s: 2 workers train (test accuracy %.3f; uncompressed %.3f)", lossy[i], acc, base);
        CHECK(bytes > 0 && bytes < share[i] * plain_bytes, "%s: bytes sent %.0f, %.3f of uncompressed (expected < %.2f)",
              lossy[i], bytes, bytes / plain_bytes, share[i]);
        printf("training: %-8s 2 workers, 40 steps: test accuracy %.3f (uncompressed %.3f), bytes sent %.3f of "
               "uncompressed, repeat %s\n", lossy[i], acc, base, bytes / plain_bytes, bw ? "bitwise equal" : "differs");
    }
}

// ----------------------------------------------------------------------------
// 5. checkpoints

// Tensor codec.METHOD.WHAT of part p of checkpoint dir, copied (malloc'd,
// *n elements); NULL when it is not there.
static void *part_tensor(const char *dir, int p, const char *method, const char *what, size_t *n) {
    dt_st_file *f;
    int parts;
    *n = 0;
    if (dt_ckpt_open_part(dir, p, &f, &parts) != DT_OK) return NULL;
    char name[64];
    snprintf(name, sizeof name, "codec.%s.%s", method, what);
    const dt_st_tensor *t = dt_st_find(f, name);
    void *v = t ? malloc(t->nbytes + 1) : NULL;
    if (v && dt_st_read(f, t, 0, t->nbytes / dt_dtype_size(t->dtype), t->dtype, v) != DT_OK) {
        free(v);
        v = NULL;
    }
    if (v) *n = t->nbytes / dt_dtype_size(t->dtype);
    dt_st_close(f);
    return v;
}

// The rank side of a restore from checkpoint dir (top-k with momentum, or
// PowerSGD): each rank's codec against the files: at the same world size its
// own part's residual and momentum, else the mean of the parts' (formed as
// the codec forms it: float sums in part order, divided), and in either case
// the ranks' mean equal to the writers' (the unsent sum kept); the step and
// PowerSGD's Qs as part 0 has them. Exit status.
static int reshard_main(int method, const char *dir) {
    dt_comm_t comm;
    if (dt_comm_init_env(&comm) != DT_OK) return fprintf(stderr, "comm: %s\n", dt_last_error()), 1;
    int W = dt_comm_size(comm), me = dt_comm_rank(comm), parts = 0, bad = 0;
    const char *m = methods[method];
    size_t n = 0, nn, ns;
    float *r0 = dt_ckpt_open_part(dir, -1, NULL, &parts) == DT_OK ? part_tensor(dir, 0, m, "residual", &n) : NULL;
    int64_t *step = part_tensor(dir, 0, m, "step", &ns);
    dt_config c;
    config(&c, method, 1);
    c.comp_momentum = method == DT_COMP_TOPK ? 0.5f : 0;
    dt_codec *k = r0 && step ? codec(&c, comm, n) : NULL;
    if (!k || dt_codec_restore(k, dir, parts) != DT_OK)
        return fprintf(stderr, "rank %d: restore from %s: %s\n", me, dir, dt_last_error()), 1;
    if (k->step0 != step[0])
        bad = fprintf(stderr, "rank %d: step %lld, the checkpoint's %lld\n", me, (long long)k->step0, (long long)step[0]);
    const char *what[2] = {"residual", "velocity"};
    float *have[2] = {k->residual, k->velocity}, *want = malloc(n * sizeof *want), *tot = malloc(n * sizeof *tot);
    double *sum = malloc(n * sizeof *sum);
    for (int j = 0; j < 2 && !bad; j++) {
        if (!have[j]) continue;
        memset(sum, 0, n * sizeof *sum);
        for (int p = 0; p < parts && !bad; p++) {
            float *e = part_tensor(dir, p, m, what[j], &nn);
            if (!e || nn != n) bad = fprintf(stderr, "rank %d: part %d has no %s of %zu values\n", me, p, what[j], n);
            for (size_t i = 0; i < n && !bad; i++) {
                sum[i] += e[i];
                if (parts == W && p == me) want[i] = e[i];
                else if (parts != W) want[i] = p ? want[i] + e[i] : e[i];
            }
            free(e);
        }
        for (size_t i = 0; i < n && parts != W; i++) want[i] /= (float)parts;
        if (!bad && memcmp(want, have[j], n * sizeof *want))
            bad = fprintf(stderr, "rank %d of %d: its %s is not %s\n", me, W, what[j],
                          parts == W ? "its own part's" : "the mean of the parts'");
        // The unsent sum: (1/W) x sum over the ranks = (1/parts) x sum over the writers.
        memcpy(tot, have[j], n * sizeof *tot);
        if (dt_allreduce(tot, tot, n, DT_F32, DT_SUM, comm) != DT_OK) return fprintf(stderr, "%s\n", dt_last_error()), 1;
        double worst = 0, top = 0;
        for (size_t i = 0; i < n; i++) {
            double e = fabs(tot[i] / W - sum[i] / parts);
            worst = e > worst ? e : worst;
            top = fabs(sum[i] / parts) > top ? fabs(sum[i] / parts) : top;
        }
        if (!bad && (worst > 1e-6 * top || top == 0))
            bad = fprintf(stderr, "rank %d: the ranks' mean %s differs from the writers' by %.3g (largest %.3g)\n", me,
                          what[j], worst, top);
    }
    if (method == DT_COMP_POWERSGD && !bad) {
        size_t nt, nq;
        int64_t *tb = part_tensor(dir, 0, m, "pieces", &nt);
        float *q = part_tensor(dir, 0, m, "q", &nq), *at = q;
        for (size_t i = 0; tb && q && i < nt / 4 && !bad; i++) {
            const int64_t *e = tb + 4 * i;  // lo, hi, the Qs' length, the matrices'
            const dt_codec_piece *p = dt_codec_piece_at(k, (size_t)e[0], (size_t)e[1]);
            if (p->nq != (size_t)e[2] || p->nmat != (size_t)e[3] || !p->q || memcmp(p->q, at, p->nq * sizeof *at))
                bad = fprintf(stderr, "rank %d: piece %zu's Qs are not the checkpoint's\n", me, i);
            at += e[2];
        }
        if (!tb || !q || !nt) bad = fprintf(stderr, "rank %d: no Q in %s\n", me, dir);
        free(tb), free(q);
    }
    if (!bad) printf("rank %d of %d: %s state of %d writers restored as expected\n", me, W, m, parts);
    dt_codec_free(k);
    dt_comm_destroy(comm);
    free(r0), free(step), free(want), free(tot), free(sum);
    return bad ? 1 : 0;
}

static void reshard(const char *self, int N, int method, const char *dir) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s run -n %d -- %s reshard %d %s", tl_dtrain(), N, self, method, dir);
    int rc = tl_run(cmd, g_out, sizeof g_out);
    CHECK(rc == 0, "%s state of %s restored on %d ranks: exit %d\n%s", methods[method], dir, N, rc, g_out);
}

// Flips a byte in the middle of tensor `name` of the safetensors file at
// path; 0 when the tensor is not there.
static int flip(const char *path, const char *name) {
    size_t len;
    char *b = tl_read_file(path, &len), key[96];
    uint64_t hl = 0;
    if (b && len > 8) memcpy(&hl, b, 8);
    if (!b || hl > len - 8) return free(b), 0;
    char end = b[8 + hl];
    b[8 + hl] = 0;  // the header's JSON alone
    snprintf(key, sizeof key, "\"%s\"", name);
    char *at = strstr(b + 8, key), *o = at ? strstr(at, "data_offsets") : NULL;
    unsigned long long lo, hi;
    int ok = o && sscanf(o, "data_offsets\" : [ %llu , %llu", &lo, &hi) == 2 && 8 + hl + hi <= len;
    b[8 + hl] = end;
    FILE *f = ok ? fopen(path, "r+b") : NULL;
    if (f) {
        b[8 + hl + (lo + hi) / 2] ^= 0x10;
        fseek(f, (long)(8 + hl + (lo + hi) / 2), SEEK_SET);
        ok = fputc(b[8 + hl + (lo + hi) / 2], f) != EOF && fclose(f) == 0;
    }
    free(b);
    return ok && f;
}

static void checkpoints(const char *self) {
    // Stopped by a failure, resumed on as many workers: bitwise the
    // uninterrupted run of section 4. Top-k resumes at step 2 or 4 (the
    // newest whose write was complete), inside DGC's warm-up of 5 steps.
    const char *dgc = "--set compression.method=topk --set compression.ratio=0.05 --set compression.momentum=0.5 "
                      "--set compression.warmup_steps=5 --set compression.clip_norm=10 --set parallel.bucket_kb=64";
    static const struct {
        const char *ref, *method;
        int every, fault;
    } rs[] = {{"topk-a", NULL, 2, 5}, {"run-powersgd", "powersgd", 10, 25}, {"run-qsgd", "qsgd", 10, 25},
              {"run-randomk", "randomk", 10, 25}};
    char extra[1600], name[64], a[800], b[800];
    for (size_t i = 0; i < sizeof rs / sizeof *rs; i++) {
        char set[300], fault[32];
        if (rs[i].method) snprintf(set, sizeof set, "--set compression.method=%s --set compression.ratio=0.1", rs[i].method);
        else snprintf(set, sizeof set, "%s", dgc);
        snprintf(name, sizeof name, "%s-resumed", rs[i].ref);
        snprintf(extra, sizeof extra, "%s --checkpoint-every %d", set, rs[i].every);
        snprintf(fault, sizeof fault, "1:%d", rs[i].fault);
        setenv("DTRAIN_FAULT_STEP", fault, 1);
        int rc1 = train(name, 2, extra);
        unsetenv("DTRAIN_FAULT_STEP");
        snprintf(extra, sizeof extra, "%s --resume auto", set);
        int rc2 = train(name, 2, extra);
        snprintf(a, sizeof a, "%s/%s/model.safetensors", g_tmp, rs[i].ref);
        snprintf(b, sizeof b, "%s/%s/model.safetensors", g_tmp, name);
        int bw = 0;
        double d = tl_weights_diff(a, b, &bw);
        const char *from = strstr(g_out, "resuming from");
        int at = from && strstr(from, ": step ") ? atoi(strstr(from, ": step ") + 7) : -1;
        CHECK(rc1 != 0 && rc2 == 0 && at > 0 && bw && strstr(g_out, "restored from") && strstr(g_out, "each rank its own"),
              "%s: failed at step %d (exit %d), resumed from step %d (exit %d): bitwise the uninterrupted run (max rel "
              "diff %.3g)\n%s",
              rs[i].ref, rs[i].fault, rc1, at, rc2, d, g_out);
        printf("checkpoints: %-12s failed at step %d, resumed on 2 workers from step %d: %s\n", rs[i].ref, rs[i].fault,
               at, bw ? "bitwise the uninterrupted run" : "differs");
    }

    // int8's two-phase sum on 3 workers: both residuals in the checkpoint,
    // the resumed run bitwise the uninterrupted one.
    const char *i8 = "--set compression.method=int8";
    CHECK(train("int8-w3", 3, i8) == 0, "an int8 run on 3 workers");
    snprintf(extra, sizeof extra, "%s --checkpoint-every 10", i8);
    setenv("DTRAIN_FAULT_STEP", "1:25", 1);
    int rc1 = train("int8-w3-resumed", 3, extra), bw = 0;
    unsetenv("DTRAIN_FAULT_STEP");
    snprintf(extra, sizeof extra, "%s --resume auto", i8);
    int rc2 = train("int8-w3-resumed", 3, extra);
    snprintf(a, sizeof a, "%s/int8-w3/model.safetensors", g_tmp);
    snprintf(b, sizeof b, "%s/int8-w3-resumed/model.safetensors", g_tmp);
    double d = tl_weights_diff(a, b, &bw);
    CHECK(rc1 != 0 && rc2 == 0 && bw && strstr(g_out, "the re-quantized sums' residuals"),
          "int8 on 3 workers failed at step 25 (exit %d), resumed (exit %d) with both residuals: bitwise the "
          "uninterrupted run (max rel diff %.3g)\n%s", rc1, rc2, d, g_out);
    printf("checkpoints: int8 on 3 workers (two phases) failed at step 25, resumed: %s\n",
           bw ? "bitwise the uninterrupted run" : "differs");

    // 3 writers, restored on 2 (the mean), on 3 (each its own) and on 1.
    snprintf(extra, sizeof extra, "%s --checkpoint-every 10 --set train.max_steps=20", dgc);
    CHECK(train("w3", 3, extra) == 0, "a 3-worker top-k run with checkpoints");
    char ck[600], ck10[600];
    snprintf(ck, sizeof ck, "%s/w3/checkpoints/step-00000020", g_tmp);
    snprintf(ck10, sizeof ck10, "%s/w3/checkpoints/step-00000010", g_tmp);
    for (int N = 1; N <= 3; N++) reshard(self, N, DT_COMP_TOPK, ck);
    snprintf(a, sizeof a, "%s/run-powersgd-resumed/checkpoints/step-00000010", g_tmp);
    reshard(self, 3, DT_COMP_POWERSGD, a);
    printf("checkpoints: top-k state of 3 writers restored on 1, 2 (the mean) and 3 ranks (each its own), PowerSGD's of 2 "
           "on 3: as expected\n");
    snprintf(extra, sizeof extra, "%s --resume %s --set train.max_steps=25", dgc, ck);
    int rc = train("w3to2", 2, extra);
    CHECK(rc == 0 && strstr(g_out, "resharded: each of 2 ranks has the mean of the 3 writers'"),
          "3 -> 2 workers: exit %d, resharded\n%s", rc, g_out);

    // Without compression the state is ignored, said once; a checkpoint
    // without codec state leaves the codec fresh, said once.
    snprintf(extra, sizeof extra, "--resume %s --set train.max_steps=25", ck);
    rc = train("w3-plain", 2, extra);
    CHECK(rc == 0 && strstr(g_out, "holds state this run does not keep (codec.topk.step, codec.topk.residual, "
                                   "codec.topk.velocity): ignored"),
          "a compressed checkpoint resumed without compression: exit %d\n%s", rc, g_out);
    snprintf(extra, sizeof extra, "--set compression.method=powersgd --resume %s/plain/checkpoints --set train.max_steps=42",
             g_tmp);
    rc = train("plain-psgd", 2, extra);
    CHECK(rc == 0 && strstr(g_out, "no gradient-codec state (written without compression): powersgd starts afresh"),
          "an uncompressed checkpoint resumed with compression: exit %d\n%s", rc, g_out);
    snprintf(extra, sizeof extra, "--set compression.method=int8 --resume %s --set train.max_steps=25", ck);
    rc = train("w3-int8", 2, extra);
    CHECK(rc == 0 && strstr(g_out, "holds the gradient-codec state of compression.method = topk, which does not carry "
                                   "over to int8"),
          "a top-k checkpoint resumed with int8: exit %d\n%s", rc, g_out);

    // A byte of rank 1's residual flipped: the checksum says so; the resume
    // falls back to the older checkpoint, whose state it restores.
    snprintf(a, sizeof a, "%s/shard-00001-of-00003.safetensors", ck);
    CHECK(flip(a, "codec.topk.residual"), "a byte of %s's codec.topk.residual flipped", a);
    snprintf(extra, sizeof extra, "%s inspect %s", tl_dtrain(), a);
    rc = tl_run(extra, g_out, sizeof g_out);
    CHECK(rc == 1 && strstr(g_out, "checksum mismatch"), "inspect of the damaged shard: exit %d\n%s", rc, g_out);
    snprintf(extra, sizeof extra, "%s --resume %s/w3/checkpoints --set train.max_steps=25", dgc, g_tmp);
    rc = train("w3-damaged", 3, extra);
    CHECK(rc == 0 && strstr(g_out, "skipping damaged checkpoint") && strstr(g_out, "checksum mismatch") &&
              strstr(g_out, "state at step 10 restored from") && strstr(g_out, ck10),
          "resume past the damaged residual: exit %d\n%s", rc, g_out);
    printf("checkpoints: resharded 3 -> 2; state ignored without compression, fresh from an uncompressed or int8 "
           "checkpoint, a flipped residual byte caught by the checksum\n");
}

int main(int argc, char **argv) {
    if (argc == 4 && !strcmp(argv[1], "reshard")) return reshard_main(atoi(argv[2]), argv[3]);
    if (argc == 3 && !strcmp(argv[1], "bytes")) return bytes_main(atoi(argv[2]));
    if (argc == 8 && !strcmp(argv[1], "rank")) {
        setup u = {atoi(argv[2]), atoi(argv[3]), 0, (float)atof(argv[4]), atoi(argv[5]), atoi(argv[6]), atoi(argv[7])};
        return rank_main(&u);
    }
    settings();

    dt_comm_t comm;
    CHECK(dt_comm_init_env(&comm) == DT_OK, "a world of 1: %s", dt_last_error());
    for (int m = DT_COMP_FP16; m <= DT_COMP_POWERSGD; m++) conservation(comm, m);
    bias(comm, DT_COMP_QSGD, 1, 2, 1);
    bias(comm, DT_COMP_QSGD, 1, 16, 1);
    bias(comm, DT_COMP_RANDOMK, 0.1f, 16, 1);
    bias(comm, DT_COMP_TOPK, 0.1f, 16, 0);
    powersgd_exact(comm);
    dgc(comm);
    topk_sampled(comm);
    p2p(comm);
    dt_comm_destroy(comm);

    char self[1024];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    self[len > 0 ? len : 0] = 0;
    static const setup us[] = {
        {DT_COMP_FP16, 1, 0, 0.01f, 16, 2, 100},  {DT_COMP_BF16, 0, 0, 0.01f, 16, 2, 100},
        {DT_COMP_INT8, 1, 0, 0.01f, 16, 2, 100},  {DT_COMP_SIGN, 1, 0, 0.01f, 16, 2, 100},
        {DT_COMP_QSGD, 0, 0, 0.01f, 8, 2, 100},   {DT_COMP_QSGD, 0, 0, 0.01f, 3, 2, 100},
        {DT_COMP_TOPK, 1, 0, 0.05f, 0, 2, 100},
        {DT_COMP_TOPK, 0, 0, 0.01f, 0, 2, 0},     {DT_COMP_RANDOMK, 1, 0, 0.05f, 16, 2, 100},
        // top-k's warm-up: steps at 38% (pairs on 2 ranks, the plain sum on 3), 14%, 5.3%
        {DT_COMP_TOPK, 1, 0, 0.02f, 3, 2, 100},   {DT_COMP_INT8, 0, 0, 0.01f, 16, 2, 100},
        {DT_COMP_POWERSGD, 1, 0, 0.01f, 0, 64, 100}, {DT_COMP_POWERSGD, 1, 0, 0.01f, 0, 2, 100},
        {DT_COMP_POWERSGD, 0, 0, 0.01f, 1, 3, 100},
    };
    for (int N = 2; N <= 4; N++)
        for (size_t i = 0; i < sizeof us / sizeof *us; i++)
            if (N == 3 || i % 2 == (size_t)(N / 2) % 2) ranks(self, N, &us[i]);

    bytes_per_worker(self);
    training();
    checkpoints(self);
    tl_cleanup(g_tmp);
    return tl_finish();
}
