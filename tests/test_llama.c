/* The Llama layers and model against central finite differences: RMSNorm,
 * rotary embeddings, SwiGLU and grouped-query attention, each on random
 * inputs with the loss sum(out * R); then the whole model's gradient on a
 * sample of its parameters, the gradient order and its hook; tensor-parallel
 * shards (threads summing through the reduce function) against the whole
 * model; and configs refused naming the numbers. */
#include "dtrain/config.h"
#include "dtrain/llama.h"
#include "testlib.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RTOL 1e-2
/* The whole model's loss is one float32 mean through two blocks of
 * normalisations and softmaxes: central differences of it carry ~1e-2 of
 * rounding and curvature on elements with small gradients; an error in
 * backward shows as O(1). */
#define MODEL_RTOL 5e-2

static dt_rng g_rng;

static float *randn(size_t n, float scale) {
    float *p = malloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++) p[i] = scale * dt_rng_normal(&g_rng);
    return p;
}

// ---- the harness: a forward that writes out[nout] from the inputs

typedef struct {
    void (*fwd)(void *ctx);
    void *ctx;
    const float *out, *R;
    size_t nout;
} fd_problem;

static double fd_loss(fd_problem *p) {
    p->fwd(p->ctx);
    double s = 0;
    for (size_t i = 0; i < p->nout; i++) s += (double)p->out[i] * p->R[i];
    return s;
}

// g[n] (the backward's) against central differences of x[n], step eps.
static void fd_check(fd_problem *p, float *x, const float *g, size_t n, float eps, double tol, const char *what) {
    double mg = 1e-6, worst = 0;
    for (size_t i = 0; i < n; i++) mg = fmax(mg, fabs(g[i]));
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        float x0 = x[i];
        x[i] = x0 + eps;
        double lp = fd_loss(p);
        x[i] = x0 - eps;
        double lm = fd_loss(p);
        x[i] = x0;
        double num = (lp - lm) / (2.0 * eps);
        double rel = fabs(num - g[i]) / fmax(fmax(fabs(num), fabs(g[i])), 1e-2 * mg);
        bad += rel > tol;
        worst = fmax(worst, rel);
    }
    p->fwd(p->ctx);
    CHECK(bad == 0, "%s: %zu of %zu elements differ from finite differences (worst rel %.2e)", what, bad, n, worst);
    printf("%-28s worst rel %.2e over %zu elements\n", what, worst, n);
}

// ---- RMSNorm

typedef struct { float *out, *rstd, *x, *w; int N, C; } rms_ctx;
static void rms_fwd(void *c) {
    rms_ctx *r = c;
    dt_rmsnorm_forward(r->out, r->rstd, r->x, r->w, r->N, r->C, 1e-5f);
}

static void test_rmsnorm(void) {
    int N = 5, C = 12;
    rms_ctx r = {calloc(N * C, 4), calloc(N, 4), randn(N * C, 1), randn(C, 1), N, C};
    float *R = randn(N * C, 1), *dx = calloc(N * C, 4), *dw = calloc(C, 4);
    rms_fwd(&r);
    dt_rmsnorm_backward(dx, dw, R, r.x, r.w, r.rstd, N, C);
    fd_problem p = {rms_fwd, &r, r.out, R, (size_t)N * C};
    fd_check(&p, r.x, dx, N * C, 1e-2f, RTOL, "rmsnorm dx");
    fd_check(&p, r.w, dw, C, 1e-2f, RTOL, "rmsnorm dw");
    free(r.out), free(r.rstd), free(r.x), free(r.w), free(R), free(dx), free(dw);
}

// ---- rotary embedding: a linear map, its backward the inverse rotation

typedef struct { float *out, *x; int B, T, nh, hs; } rope_ctx;
static void rope_fwd(void *c) {
    rope_ctx *r = c;
    memcpy(r->out, r->x, sizeof(float) * r->B * r->T * r->nh * r->hs);
    dt_rope(r->out, r->B, r->T, r->nh, r->hs, 10000.0f, 1);
}

static void test_rope(void) {
    int B = 2, T = 6, nh = 3, hs = 8, n = B * T * nh * hs;
    rope_ctx r = {calloc(n, 4), randn(n, 1), B, T, nh, hs};
    float *R = randn(n, 1), *dx = malloc(sizeof(float) * n);
    memcpy(dx, R, sizeof(float) * n);
    dt_rope(dx, B, T, nh, hs, 10000.0f, -1);
    fd_problem p = {rope_fwd, &r, r.out, R, (size_t)n};
    fd_check(&p, r.x, dx, n, 1e-2f, RTOL, "rope dx");
    // Position 0 is not rotated; rotating back gives the input again.
    rope_fwd(&r);
    CHECK(!memcmp(r.out, r.x, sizeof(float) * nh * hs), "rope leaves position 0 unchanged");
    dt_rope(r.out, B, T, nh, hs, 10000.0f, -1);
    CHECK(tl_max_rel(r.out, r.x, n, 1e-3) < 1e-5, "rope back and forth is the identity");
    free(r.out), free(r.x), free(R), free(dx);
}

// ---- SwiGLU

typedef struct { float *h, *g, *u; size_t n; } swi_ctx;
static void swi_fwd(void *c) {
    swi_ctx *s = c;
    dt_swiglu_forward(s->h, s->g, s->u, s->n);
}

static void test_swiglu(void) {
    size_t n = 30;
    swi_ctx s = {calloc(n, 4), randn(n, 2), randn(n, 1), n};
    float *R = randn(n, 1), *dg = calloc(n, 4), *du = calloc(n, 4);
    dt_swiglu_backward(dg, du, R, s.g, s.u, n);
    fd_problem p = {swi_fwd, &s, s.h, R, n};
    fd_check(&p, s.g, dg, n, 1e-2f, RTOL, "swiglu dg");
    fd_check(&p, s.u, du, n, 1e-2f, RTOL, "swiglu du");
    free(s.h), free(s.g), free(s.u), free(R), free(dg), free(du);
}

// ---- grouped-query attention

typedef struct { float *out, *att, *q, *k, *v; int B, T, NH, KV, hs; } gqa_ctx;
static void gqa_fwd(void *c) {
    gqa_ctx *a = c;
    dt_gqa_forward(a->out, a->att, a->q, a->k, a->v, a->B, a->T, a->NH, a->KV, a->hs);
}

static void test_gqa(int NH, int KV) {
    int B = 2, T = 5, hs = 4, nq = B * T * NH * hs, nk = B * T * KV * hs;
    gqa_ctx a = {calloc(nq, 4), calloc((size_t)B * NH * T * T, 4), randn(nq, 1), randn(nk, 1), randn(nk, 1),
                 B, T, NH, KV, hs};
    float *R = randn(nq, 1), *dq = calloc(nq, 4), *dk = calloc(nk, 4), *dv = calloc(nk, 4);
    float *datt = calloc((size_t)B * NH * T * T, 4);
    gqa_fwd(&a);
    dt_gqa_backward(dq, dk, dv, datt, R, a.q, a.k, a.v, a.att, B, T, NH, KV, hs);
    fd_problem p = {gqa_fwd, &a, a.out, R, (size_t)nq};
    char w[64];
    snprintf(w, sizeof w, "gqa NH%d KV%d dq", NH, KV);
    fd_check(&p, a.q, dq, nq, 1e-2f, RTOL, w);
    snprintf(w, sizeof w, "gqa NH%d KV%d dk", NH, KV);
    fd_check(&p, a.k, dk, nk, 1e-2f, RTOL, w);
    snprintf(w, sizeof w, "gqa NH%d KV%d dv", NH, KV);
    fd_check(&p, a.v, dv, nk, 1e-2f, RTOL, w);
    // Causal: the first position's output is its own value row.
    CHECK(!memcmp(a.out, a.v, sizeof(float) * hs), "gqa: position 0 of head 0 attends to itself alone");
    free(a.out), free(a.att), free(a.q), free(a.k), free(a.v), free(R), free(dq), free(dk), free(dv), free(datt);
}

// ---- the whole model

static const dt_llama_config tiny = {2, 4, 2, 16, 24, 8, 11, 10000.0f, 1e-5f};

typedef struct { dt_llama *m; const int32_t *x, *y; int B, T; float loss; } model_ctx;
static void model_fwd(void *c) {
    model_ctx *mc = c;
    dt_llama_forward(mc->m, mc->x, mc->y, mc->B, mc->T, &mc->loss);
}

static size_t g_last_pos;
static int g_hooks, g_monotone;
static void pos_hook(size_t pos, void *user) {
    (void)user;
    g_monotone &= g_hooks == 0 || pos <= g_last_pos;
    g_last_pos = pos;
    g_hooks++;
}

static void test_model(void) {
    int B = 2, T = 6;
    dt_llama *m;
    CHECK(dt_llama_create(&m, &tiny, B, T) == DT_OK, "create: %s", dt_last_error());
    dt_llama_init(m, 7);
    // Larger weights than the initialisation's, so that every path carries a gradient.
    float *P = dt_llama_params(m);
    for (size_t i = 0; i < dt_llama_num_params(m); i++) P[i] += 0.2f * dt_rng_normal(&g_rng);
    int32_t x[12], y[12];
    for (int i = 0; i < B * T; i++) x[i] = (int32_t)dt_rng_below(&g_rng, 11), y[i] = (int32_t)dt_rng_below(&g_rng, 11);
    model_ctx mc = {m, x, y, B, T, 0};
    dt_llama_zero_grad(m);
    g_hooks = 0, g_monotone = 1;
    dt_llama_set_grad_hook(m, pos_hook, NULL);
    CHECK(dt_llama_forward(m, x, y, B, T, &mc.loss) == DT_OK, "forward: %s", dt_last_error());
    CHECK(dt_llama_backward(m) == DT_OK, "backward: %s", dt_last_error());
    dt_llama_set_grad_hook(m, NULL, NULL);
    CHECK(g_monotone && g_last_pos == 0 && g_hooks == 1 + 6 * tiny.n_layer + 1,
          "grad hook: %d calls, decreasing %d, last %zu", g_hooks, g_monotone, g_last_pos);
    int n;
    const dt_grad_range *o = dt_llama_grad_order(m, &n);
    size_t covered = 0;
    for (int i = 0; i < n; i++) covered += o[i].len;
    CHECK(n == 9 * tiny.n_layer + 3 && covered == dt_llama_num_params(m), "grad order: %d ranges cover %zu of %zu", n,
          covered, dt_llama_num_params(m));
    // The loss is a mean (one scalar): R = 1 on it.
    float R = 1.0f;
    fd_problem p = {model_fwd, &mc, &mc.loss, &R, 1};
    float *G = malloc(sizeof(float) * dt_llama_num_params(m));
    memcpy(G, dt_llama_grads(m), sizeof(float) * dt_llama_num_params(m));
    for (int i = 0; i < DT_LLAMA_NTENSORS; i++) {
        const dt_tensor_info *t = dt_llama_tensor(m, i);
        size_t k = t->numel < 48 ? t->numel : 48;  // the first elements of each tensor
        char w[64];
        snprintf(w, sizeof w, "model %s", t->name);
        fd_check(&p, P + t->offset, G + t->offset, k, 1e-2f, MODEL_RTOL, w);
    }
    free(G);
    dt_llama_free(m);
}

// ---- tensor parallel: shards in threads against the whole model

typedef struct {
    pthread_barrier_t bar;
    float *bufs[4];
    int ntp;
} tp_group;

typedef struct {
    tp_group *g;
    int r;
    dt_llama *m;
    const int32_t *x, *y;
    float loss;
    dt_status st;
} tp_shard;

// The sum over the shards, in shard order on every shard (the same bits).
static dt_status tp_sum(float *buf, size_t n, void *user) {
    tp_shard *s = user;
    tp_group *g = s->g;
    g->bufs[s->r] = buf;
    pthread_barrier_wait(&g->bar);
    float *tmp = malloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++) {
        float v = g->bufs[0][i];
        for (int r = 1; r < g->ntp; r++) v += g->bufs[r][i];
        tmp[i] = v;
    }
    pthread_barrier_wait(&g->bar);
    memcpy(buf, tmp, sizeof(float) * n);
    free(tmp);
    return DT_OK;
}

static void *tp_run(void *arg) {
    tp_shard *s = arg;
    dt_llama_zero_grad(s->m);
    s->st = dt_llama_forward(s->m, s->x, s->y, 2, 6, &s->loss);
    if (s->st == DT_OK) s->st = dt_llama_backward(s->m);
    return NULL;
}

static void test_tensor_parallel(int ntp, int kv) {
    dt_llama_config c = tiny;
    c.n_kv_head = kv;
    dt_llama *whole;
    if (dt_llama_create(&whole, &c, 2, 6) != DT_OK || dt_llama_init(whole, 7) != DT_OK) {
        CHECK(0, "whole model: %s", dt_last_error());
        return;
    }
    int32_t x[12], y[12];
    for (int i = 0; i < 12; i++) x[i] = (int32_t)dt_rng_below(&g_rng, 11), y[i] = (int32_t)dt_rng_below(&g_rng, 11);
    float ref;
    dt_llama_zero_grad(whole);
    CHECK(dt_llama_forward(whole, x, y, 2, 6, &ref) == DT_OK && dt_llama_backward(whole) == DT_OK, "whole: %s",
          dt_last_error());
    size_t nw = dt_llama_num_params(whole);
    float *want = malloc(sizeof(float) * nw), *got = calloc(nw, sizeof(float));
    tp_group g = {.ntp = ntp};
    pthread_barrier_init(&g.bar, NULL, (unsigned)ntp);
    tp_shard sh[4];
    pthread_t th[4];
    int ok = 1;
    for (int r = 0; r < ntp && ok; r++) {
        sh[r] = (tp_shard){.g = &g, .r = r, .x = x, .y = y};
        ok = dt_llama_create_shard(&sh[r].m, &c, 2, 6, r, ntp) == DT_OK && dt_llama_init(sh[r].m, 7) == DT_OK;
        CHECK(ok, "shard %d of %d: %s", r, ntp, dt_last_error());
        if (!ok) break;
        dt_llama_set_reduce(sh[r].m, tp_sum, &sh[r]);
        dt_llama_part_take(sh[r].m, want, 0, nw, dt_llama_params(whole));
        CHECK(!memcmp(want, dt_llama_params(sh[r].m), sizeof(float) * dt_llama_num_params(sh[r].m)),
              "T=%d KV%d shard %d: its initialisation is the whole model's, sliced", ntp, kv, r);
    }
    for (int r = 0; r < ntp && ok; r++) pthread_create(&th[r], NULL, tp_run, &sh[r]);
    for (int r = 0; r < ntp && ok; r++) pthread_join(th[r], NULL);
    for (int r = 0; r < ntp && ok; r++) {
        CHECK(sh[r].st == DT_OK && fabsf(sh[r].loss - ref) <= 1e-6f * ref && sh[r].loss == sh[0].loss,
              "T=%d KV%d shard %d: loss %.8g, whole model %.8g", ntp, kv, r, sh[r].loss, ref);
        dt_llama_part_fill(sh[r].m, dt_llama_grads(sh[r].m), 0, nw, got);
    }
    // (summation orders differ: within 1e-5 of the largest gradient)
    const float *gw = dt_llama_grads(whole);
    double mg = 1e-12, e = 0;
    for (size_t i = 0; i < nw; i++) mg = fmax(mg, fabs(gw[i]));
    for (size_t i = 0; i < nw; i++) e = fmax(e, fabs((double)got[i] - gw[i]) / mg);
    CHECK(ok && e <= 1e-5, "T=%d KV%d: the shards' gradients, assembled, are the whole model's (max err %.2e of the largest)",
          ntp, kv, e);
    printf("tensor parallel T=%d KV%d: loss %.8g (whole %.8g), gradients max err %.2e of the largest\n", ntp, kv, sh[0].loss, ref, e);
    for (int r = 0; r < ntp; r++) dt_llama_free(sh[r].m);
    dt_llama *bad = NULL;
    CHECK(dt_llama_create_shard(&bad, &c, 1, 1, 0, 2 * kv) == DT_ERR_ARG && strstr(dt_last_error(), "key/value heads"),
          "T=%d with %d key/value heads refused: %s", 2 * kv, kv, dt_last_error());
    pthread_barrier_destroy(&g.bar);
    free(want), free(got);
    dt_llama_free(whole);
}

static void test_bad_config(void) {
    struct { dt_llama_config c; const char *want; } bad[] = {
        {{2, 4, 3, 16, 24, 8, 11, 10000.0f, 1e-5f}, "n_kv_head = 3 does not divide n_head = 4"},
        {{2, 4, 2, 16, 24, 8, 11, 0.5f, 1e-5f}, "rope_theta = 0.5"},
        {{2, 4, 2, 16, 24, 8, 11, 10000.0f, 0.0f}, "norm_eps = 0"},
        {{2, 4, 2, 16, 24, 8, 11, 10000.0f, 0.5f}, "norm_eps = 0.5"},
        {{2, 3, 1, 16, 24, 8, 11, 10000.0f, 1e-5f}, "n_embd = 16, n_head = 3"},
        {{2, 16, 2, 16, 24, 8, 11, 10000.0f, 1e-5f}, "head size n_embd / n_head to be a whole even number"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        dt_llama *m = NULL;
        dt_status st = dt_llama_create(&m, &bad[i].c, 1, 4);
        CHECK(st == DT_ERR_ARG && m == NULL && strstr(dt_last_error(), bad[i].want), "bad config %zu refused: %s", i,
              dt_last_error());
    }
    dt_llama_config c;
    dt_status st = dt_llama_preset("llama2-7b", &c);
    size_t np = st == DT_OK ? dt_llama_config_num_params(&c) : 0;
    CHECK(np == 6738415616ull, "llama2-7b preset: %zu parameters (Llama-2-7B's 6738415616)", np);
    CHECK(dt_llama_preset("llama-3", &c) == DT_ERR_ARG && strstr(dt_last_error(), "llama-3"), "unknown preset refused");
}

// A GPT's resolved config text (what its checkpoints record and a resume
// compares) has none of the Llama's keys, as before they came, so that a
// GPT checkpoint written before them resumes; a Llama's has them.
static void test_config_text(void) {
    const char *cfgs[] = {"configs/gpt-fortunes.ini", "configs/llama-fortunes.ini"};
    for (int i = 0; i < 2; i++) {
        dt_config c;
        char *t = dt_config_load(&c, cfgs[i], NULL, 0) == DT_OK ? dt_config_format(&c) : NULL;
        int has = t && strstr(t, "\narch = ") && strstr(t, "\nn_kv_head = ") && strstr(t, "\nrope_theta = ");
        int none = t && !strstr(t, "\narch = ") && !strstr(t, "n_kv_head") && !strstr(t, "ffn_hidden") &&
                   !strstr(t, "rope_theta") && !strstr(t, "norm_eps");
        CHECK(i == 0 ? none : has, "%s: the resolved config text %s the Llama's keys (%s)", cfgs[i],
              i == 0 ? "lacks" : "has", t ? "" : dt_last_error());
        free(t);
    }
}

// A Llama run checkpointed at step 6 and resumed (2 workers, ZeRO-1: the
// optimizer state in slices) ends bitwise where the uninterrupted run
// does, on token files of the project's README.
static void test_resume(void) {
    char dir[] = "/tmp/dtrain-llama-XXXXXX", cmd[2048], out[8192], a[600], b[600];
    if (!mkdtemp(dir)) return;
    snprintf(cmd, sizeof cmd, "%s prepare-text README.md -o %s/tok", tl_dtrain(), dir);
    CHECK(tl_run(cmd, out, sizeof out) == 0, "prepare-text: %s", out);
    const char *runs[] = {"whole", "part", "part"}, *extra[] = {"", "--set train.max_steps=6", "--resume auto"};
    for (int i = 0; i < 3; i++) {
        snprintf(cmd, sizeof cmd, "%s train configs/llama-fortunes.ini --workers 2 --zero 1 -q --run-dir %s/%s "
                 "--set data.train_file=%s/tok_train.bin --set data.val_file=%s/tok_val.bin --set train.max_steps=12 "
                 "--set train.eval_every=0 --set train.batch=4 --set train.seq_len=32 --checkpoint-every 6 %s",
                 tl_dtrain(), dir, runs[i], dir, dir, extra[i]);
        CHECK(tl_run(cmd, out, sizeof out) == 0, "llama run %d (%s): %s", i, extra[i], out);
    }
    snprintf(a, sizeof a, "%s/whole/model.safetensors", dir);
    snprintf(b, sizeof b, "%s/part/model.safetensors", dir);
    int bw = 0;
    double d = tl_weights_diff(a, b, &bw);
    CHECK(bw, "llama resumed at step 6 of 12: bitwise the uninterrupted run's weights (max rel diff %.3g)", d);
    // eval and sample read the weights file and the last checkpoint alike.
    char first[2][8192];
    const char *files[] = {"model.safetensors", "checkpoints/step-00000012*"};
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < 2; i++) {
            snprintf(cmd, sizeof cmd, "%s %s configs/llama-fortunes.ini --checkpoint %s/whole/%s --set "
                     "data.train_file=%s/tok_train.bin --set data.val_file=%s/tok_val.bin --set train.batch=4 --set "
                     "train.seq_len=32 %s", tl_dtrain(), k ? "sample" : "eval", dir, files[i], dir, dir,
                     k ? "--prompt 'The ' -n 40 --seed 3" : "");
            int rc = tl_run(cmd, out, sizeof out);
            CHECK(rc == 0 && (k || strstr(out, "validation tokens 1280: next-token accuracy")),
                  "llama %s of %s: exit %d: %s", k ? "sample" : "eval", files[i], rc, out);
            if (i == 0) snprintf(first[k], sizeof first[k], "%s", out);
            else CHECK(!strcmp(first[k], out), "llama %s: the checkpoint's output is the weights file's: %s / %s",
                       k ? "sample" : "eval", first[k], out);
        }
    CHECK(!strncmp(first[1], "The ", 4) && strlen(first[1]) == 4 + 40 + 1, "llama sample: the prompt and 40 bytes: %s",
          first[1]);
    snprintf(cmd, sizeof cmd, "%s eval configs/llama-fortunes.ini --checkpoint %s/whole/model.safetensors --set "
             "data.val_file=%s/tok_val.bin --set model.n_layer=3", tl_dtrain(), dir, dir);
    CHECK(tl_run(cmd, out, sizeof out) == 1 && strstr(out, "weights of n_layer 2, but the model has n_layer = 3"),
          "llama eval of weights of another size: %s", out);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    tl_run(cmd, NULL, 0);
}

// The same refusals at `dtrain train`'s start, before any data is read:
// exit 1 (a config error; 2 where --workers makes it a usage error) naming
// the numbers; and what is not there yet.
static void test_cli_refusals(void) {
    struct { const char *set, *want; int rc; } bad[] = {
        {"model.arch=gpt --set model.preset=gpt-tiny --set model.ffn_hidden=96",
         "[model] ffn_hidden: only arch = llama has it (the model is a GPT, preset 'gpt-tiny')", 1},
        {"model.n_kv_head=3", "[model]: n_kv_head = 3 does not divide n_head = 4", 1},
        {"model.rope_theta=0.5", "[model]: rope_theta = 0.5: expected 1 <= rope_theta <= 1e9", 1},
        {"model.norm_eps=1", "[model]: norm_eps = 1: expected 0 < norm_eps <= 0.1", 1},
        {"parallel.tensor=4 --workers 4", "[parallel] tensor: 4 tensor-parallel ranks do not divide the model's 4 query "
                                          "heads (n_head), 2 key/value heads (n_kv_head) and 176 hidden units", 2},
        {"parallel.tensor=2 --set parallel.sequence=true --workers 2", "[parallel] sequence: not yet with arch = llama", 1},
        {"parallel.pipeline=2 --set model.init_from=x.safetensors --workers 2",
         "[model] init_from with model parallelism: not yet with arch = llama", 1},
        {"train.recompute=blocks", "[train] recompute: not yet with arch = llama", 1},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char cmd[512], out[4096];
        snprintf(cmd, sizeof cmd, "%s train configs/llama-fortunes.ini --set %s --set data.train_file=/nonexistent",
                 tl_dtrain(), bad[i].set);
        int rc = tl_run(cmd, out, sizeof out);
        CHECK(rc == bad[i].rc && strstr(out, bad[i].want), "dtrain train --set %s: exit %d, %s", bad[i].set, rc, out);
    }
}

int main(void) {
    dt_rng_seed(&g_rng, 42);
    dt_set_threads(1);
    test_rmsnorm();
    test_rope();
    test_swiglu();
    test_gqa(4, 2);
    test_gqa(4, 4);
    test_gqa(4, 1);
    test_model();
    test_tensor_parallel(2, 2);
    test_tensor_parallel(2, 4);
    test_tensor_parallel(4, 4);
    test_bad_config();
    test_config_text();
    test_resume();
    test_cli_refusals();
    return tl_finish();
}
