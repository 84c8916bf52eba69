/* Batch norm, ResNet basic blocks and global average pooling.
 *
 * Against PyTorch: tests/fixtures/{resnet,bn1d}.safetensors, written by
 * tests/fixtures/make_resnet_fixtures.py (see it for what they hold): a
 * training forward and backward (loss, logits, every gradient, the running
 * statistics after it), an eval-mode forward from the running statistics,
 * and three steps of SGD and of AdamW (with weight decay, which must leave
 * the running statistics alone: dt_optim_set_frozen).
 * Against finite differences: every parameter kind of the layers, in
 * training and in eval mode.
 * Synchronized batch norm: two workers (threads, summing through a barrier)
 * on halves of a batch against one model on the whole batch; without sync,
 * the two workers' running statistics must be the same bits.
 * Bad input: a training batch with one value per channel. */
#include "dtrain/ckpt.h"
#include "dtrain/nn.h"
#include "dtrain/optim.h"
#include "testlib.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FIXTURES "tests/fixtures/"

static const dt_layer_spec RESNET[] = {
    {.kind = DT_LAYER_CONV2D, .out = 4, .kernel = 3, .pad = 1, .nobias = 1},
    {.kind = DT_LAYER_BATCHNORM},
    {.kind = DT_LAYER_RELU},
    {.kind = DT_LAYER_BLOCK, .out = 4},
    {.kind = DT_LAYER_BLOCK, .out = 8, .stride = 2},
    {.kind = DT_LAYER_AVGPOOL},
    {.kind = DT_LAYER_LINEAR, .out = 10},
};
static const dt_layer_spec BN1D[] = {
    {.kind = DT_LAYER_FLATTEN},  {.kind = DT_LAYER_LINEAR, .out = 16, .nobias = 1}, {.kind = DT_LAYER_BATCHNORM},
    {.kind = DT_LAYER_RELU},     {.kind = DT_LAYER_LINEAR, .out = 5},
};

typedef struct {
    const char *name;
    const dt_layer_spec *L;
    int n, in[3];
} model_def;

static const model_def DEFS[] = {{"resnet", RESNET, 7, {1, 8, 8}}, {"bn1d", BN1D, 5, {20, 1, 1}}};

// ----------------------------------------------------------------------------
// fixture access

static float *load(const dt_st_file *f, const char *name, dt_dtype t, size_t n) {
    const dt_st_tensor *x = dt_st_find(f, name);
    CHECK(x != NULL, "fixture: no tensor %s", name);
    if (!x) return NULL;
    void *p = malloc(n * 4);
    dt_status st = dt_st_read(f, x, 0, n, t, p);
    CHECK(st == DT_OK, "fixture: %s: %s", name, dt_last_error());
    if (st != DT_OK) free(p), p = NULL;
    return p;
}

// Sets the model's state (parameters and running statistics) from
// "<prefix><name>" for each of its tensors.
static int load_state(dt_model *m, const dt_st_file *f, const char *prefix) {
    float *p = dt_model_params(m);
    for (int i = 0; i < dt_model_num_tensors(m); i++) {
        const dt_tensor_info *ti = dt_model_tensor(m, i);
        char name[96];
        snprintf(name, sizeof name, "%s%s", prefix, ti->name);
        float *v = load(f, name, DT_F32, ti->numel);
        if (!v) return -1;
        memcpy(p + ti->offset, v, sizeof(float) * ti->numel);
        free(v);
    }
    return 0;
}

// The worst relative error of block against "<prefix><name>" over the
// tensors (gradients: the parameters'; running statistics must be 0 there).
static double compare(dt_model *m, const float *block, const dt_st_file *f, const char *prefix, int grads) {
    double worst = 0;
    for (int i = 0; i < dt_model_num_tensors(m); i++) {
        const dt_tensor_info *ti = dt_model_tensor(m, i);
        if (grads && strstr(ti->name, "running_")) {
            size_t nz = 0;
            for (size_t j = 0; j < ti->numel; j++) nz += block[ti->offset + j] != 0.0f;
            CHECK(nz == 0, "%s: gradient of %s is not zero (%zu elements)", prefix, ti->name, nz);
            continue;
        }
        char name[96];
        snprintf(name, sizeof name, "%s%s", prefix, ti->name);
        float *ref = load(f, name, DT_F32, ti->numel);
        if (!ref) continue;
        double mx = 0;
        for (size_t j = 0; j < ti->numel; j++) mx = fmax(mx, fabs(ref[j]));
        double r = tl_max_rel(block + ti->offset, ref, ti->numel, fmax(mx * 1e-2, grads ? 1e-6 : 1e-7));
        CHECK(r <= 1e-4, "%s%s differs from PyTorch: rel %.2e", prefix, ti->name, r);
        worst = fmax(worst, r);
        free(ref);
    }
    return worst;
}

static dt_model *make(const model_def *d, int B) {
    dt_model *m = NULL;
    dt_status st = dt_model_create(&m, d->in, d->L, d->n, B);
    CHECK(st == DT_OK, "%s: create: %s", d->name, dt_last_error());
    return m;
}

// A training forward and backward, the running statistics after it, and
// an evaluation forward, against the fixture.
static void test_golden(const model_def *d) {
    char path[128];
    snprintf(path, sizeof path, FIXTURES "%s.safetensors", d->name);
    dt_st_file *f = NULL;
    CHECK(dt_st_open(&f, path) == DT_OK, "%s: %s", path, dt_last_error());
    dt_model *m = f ? make(d, 6) : NULL;
    if (!m) goto done;
    int in = dt_model_input_size(m), V = dt_model_num_classes(m);
    float *x = load(f, "x", DT_F32, 6 * (size_t)in), *logits = load(f, "logits", DT_F32, 6 * (size_t)V);
    float *eval = load(f, "eval_logits", DT_F32, 6 * (size_t)V), *loss = load(f, "loss", DT_F32, 1);
    int32_t *y = (int32_t *)load(f, "y", DT_I32, 6);
    if (x && y && logits && eval && loss && load_state(m, f, "init.") == 0) {
        float l = 0;
        dt_status st = dt_model_forward(m, x, y, 6, 0, NULL);
        CHECK(st == DT_OK, "%s: eval forward: %s", d->name, dt_last_error());
        double re = tl_max_rel(dt_model_logits(m), eval, 6 * (size_t)V, 1e-3);
        CHECK(re <= 1e-4, "%s: eval-mode logits differ from PyTorch: rel %.2e", d->name, re);
        dt_model_zero_grad(m);
        st = dt_model_forward(m, x, y, 6, 1, &l);
        if (st == DT_OK) st = dt_model_backward(m);
        CHECK(st == DT_OK, "%s: train step: %s", d->name, dt_last_error());
        CHECK(tl_rel(l, loss[0], 1e-6) <= 1e-5, "%s: loss %.8g, PyTorch %.8g", d->name, l, loss[0]);
        double rl = tl_max_rel(dt_model_logits(m), logits, 6 * (size_t)V, 1e-3);
        CHECK(rl <= 1e-4, "%s: logits differ from PyTorch: rel %.2e", d->name, rl);
        double rg = compare(m, dt_model_grads(m), f, "grad.", 1);
        double ra = compare(m, dt_model_params(m), f, "after.", 0);
        printf("%-7s loss %.6f (torch %.6f), logits rel %.1e, eval logits rel %.1e, grads rel %.1e, state after rel %.1e\n",
               d->name, l, loss[0], rl, re, rg, ra);
    }
    free(x), free(y), free(logits), free(eval), free(loss);
done:
    dt_model_free(m);
    dt_st_close(f);
}

// Three optimizer steps from the fixture's init, against its final state.
static void test_steps(const model_def *d, int adamw) {
    char path[128];
    snprintf(path, sizeof path, FIXTURES "%s.safetensors", d->name);
    dt_st_file *f = NULL;
    CHECK(dt_st_open(&f, path) == DT_OK, "%s: %s", path, dt_last_error());
    dt_model *m = f ? make(d, 6) : NULL;
    dt_optim *o = NULL;
    if (!m || load_state(m, f, "init.")) goto done;
    int in = dt_model_input_size(m);
    dt_optim_params op = dt_optim_default_params(adamw ? DT_OPTIM_ADAMW : DT_OPTIM_SGD);
    op.lr = adamw ? 0.01f : 0.05f;
    op.weight_decay = adamw ? 0.01f : 5e-4f;
    if (!adamw) op.momentum = 0.9f;
    CHECK(dt_optim_create(&o, &op, dt_model_num_params(m)) == DT_OK, "optimizer: %s", dt_last_error());
    int nb;
    const dt_grad_range *bufs = dt_model_buffer_ranges(m, &nb);
    CHECK(nb > 0 && dt_optim_set_frozen(o, (const size_t *)bufs, nb) == DT_OK, "%s: frozen ranges", d->name);
    float *xs = load(f, "steps_x", DT_F32, 3 * 6 * (size_t)in);
    int32_t *ys = (int32_t *)load(f, "steps_y", DT_I32, 18);
    float *losses = load(f, adamw ? "adamw_losses" : "sgd_losses", DT_F32, 3);
    double worst = 0;
    for (int s = 0; s < 3 && xs && ys && losses && o; s++) {
        float l = 0;
        dt_model_zero_grad(m);
        dt_status st = dt_model_forward(m, xs + (size_t)s * 6 * in, ys + s * 6, 6, 1, &l);
        if (st == DT_OK) st = dt_model_backward(m);
        CHECK(st == DT_OK, "%s step %d: %s", d->name, s, dt_last_error());
        worst = fmax(worst, tl_rel(l, losses[s], 1e-6));
        dt_optim_step(o, dt_model_params(m), dt_model_grads(m), op.lr, 1.0f);
    }
    CHECK(worst <= 1e-5, "%s %s: losses differ from PyTorch: rel %.2e", d->name, adamw ? "adamw" : "sgd", worst);
    double rf = compare(m, dt_model_params(m), f, adamw ? "adamw_final." : "sgd_final.", 0);
    printf("%-7s %-5s 3 steps: losses rel %.1e, final state (parameters and running statistics) rel %.1e\n", d->name,
           adamw ? "adamw" : "sgd", worst, rf);
    free(xs), free(ys), free(losses);
done:
    dt_optim_free(o);
    dt_model_free(m);
    dt_st_close(f);
}

// ----------------------------------------------------------------------------
// finite differences

static float loss_at(dt_model *m, const float *x, const int32_t *y, int B, int train) {
    float l = NAN;
    CHECK(dt_model_forward(m, x, y, B, train, &l) == DT_OK, "forward: %s", dt_last_error());
    return l;
}

// Central differences of the loss in every tensor (up to 6 elements each)
// against the backward's gradient, in training (batch statistics) or eval
// (running statistics) mode.
static void test_fd(const model_def *d, int train) {
    enum { B = 5 };
    dt_model *m = make(d, B);
    if (!m) return;
    dt_model_init(m, 7);
    int in = dt_model_input_size(m), V = dt_model_num_classes(m);
    float *p = dt_model_params(m), x[B * 64 > B * 20 ? B * 64 : B * 20];
    int32_t y[B];
    dt_rng r;
    dt_rng_seed(&r, 3);
    for (int i = 0; i < B * in; i++) x[i] = 2.0f * dt_rng_uniform(&r) - 1.0f;
    for (int b = 0; b < B; b++) y[b] = b % V;
    for (int i = 0; i < dt_model_num_tensors(m); i++) {  // batch norms off 1/0, running statistics off 0/1
        const dt_tensor_info *ti = dt_model_tensor(m, i);
        if (ti->ndim != 1 || strstr(ti->name, ".bias") == ti->name + strlen(ti->name) - 5) continue;
        for (size_t j = 0; j < ti->numel; j++) p[ti->offset + j] += 0.4f * dt_rng_uniform(&r) - 0.2f;
    }
    size_t np = dt_model_num_params(m);
    float *keep = malloc(sizeof(float) * np);
    memcpy(keep, p, sizeof(float) * np);
    dt_model_zero_grad(m);
    loss_at(m, x, y, B, train);
    CHECK(dt_model_backward(m) == DT_OK, "backward: %s", dt_last_error());
    memcpy(p, keep, sizeof(float) * np);  // (a training forward moved the running statistics)
    const float *g = dt_model_grads(m);
    double worst = 0, floor = 0;
    // (as test_layers: 1e-2 of the largest gradient; at least 1.5e-3, so 3e-5 absolute: the float
    // loss moves by ulps of ~2.4e-7, 1.2e-5 in a difference at the largest step)
    for (size_t j = 0; j < np; j++) floor = fmax(floor, fmax(1e-2 * fabs(g[j]), 1.5e-3));
    int checked = 0;
    for (int i = 0; i < dt_model_num_tensors(m); i++) {
        const dt_tensor_info *ti = dt_model_tensor(m, i);
        if (strstr(ti->name, "running_")) continue;
        for (int k = 0; k < 6 && (size_t)k < ti->numel; k++) {
            size_t j = ti->offset + (size_t)k * 7919 % ti->numel;
            // (the best of four steps: a small one crosses fewer relu kinks, which the batch
            // statistics put many units near; a larger one is less noisy in the float loss)
            const float hs[4] = {3e-4f, 1e-3f, 3e-3f, 1e-2f};
            double err = INFINITY, num = 0;
            for (int e = 0; e < 4; e++) {
                p[j] = keep[j] + hs[e];
                float lp = loss_at(m, x, y, B, train);
                memcpy(p, keep, sizeof(float) * np);
                p[j] = keep[j] - hs[e];
                float lm = loss_at(m, x, y, B, train);
                memcpy(p, keep, sizeof(float) * np);
                double n = ((double)lp - lm) / (2.0 * hs[e]), r = fabs(n - g[j]) / fmax(fmax(fabs(n), fabs(g[j])), floor);
                if (r < err) err = r, num = n;
            }
            CHECK(err <= 2e-2, "%s %s: d loss / d %s[%zu] = %.6g, finite difference %.6g", d->name,
                  train ? "train" : "eval", ti->name, j - ti->offset, g[j], num);
            worst = fmax(worst, err);
            checked++;
        }
    }
    printf("%-7s %-5s finite differences: %d elements, worst rel %.1e\n", d->name, train ? "train" : "eval", checked,
           worst);
    free(keep);
    dt_model_free(m);
}

// Batch norm's kernels alone (training statistics), with L = sum(out R) in
// double: no kinks, so one step and a tight tolerance.
typedef struct {
    int B, C, HW;
    float *x, *w, *out, *ms;
    const float *R;
} bn_case;

static double bn_loss(bn_case *k) {
    int64_t acc[4 * 8];
    dt_batchnorm_stats(acc, k->x, k->B, k->C, k->HW);
    double N = (double)k->B * k->HW;
    for (int c = 0; c < k->C; c++) {
        double mean = dt_fixed48_value(acc + 2 * c) / N, var = dt_fixed48_value(acc + 2 * (k->C + c)) / N - mean * mean;
        k->ms[c] = (float)mean, k->ms[k->C + c] = (float)(1.0 / sqrt(var + 1e-5));
    }
    dt_batchnorm_forward(k->out, k->x, k->ms, k->ms + k->C, k->w, k->w + k->C, k->B, k->C, k->HW);
    double L = 0;
    for (int i = 0; i < k->B * k->C * k->HW; i++) L += (double)k->out[i] * k->R[i];
    return L;
}

static void test_bn_kernels(int HW) {
    enum { B = 3, C = 4 };
    int n = B * C * HW;
    float x[B * C * 9], R[B * C * 9], out[B * C * 9], dx[B * C * 9] = {0}, w[2 * C], ms[2 * C], dw[2 * C] = {0};
    dt_rng r;
    dt_rng_seed(&r, 11);
    for (int i = 0; i < n; i++) x[i] = 2.0f * dt_rng_uniform(&r) - 1.0f + 0.3f * (i % C), R[i] = dt_rng_uniform(&r) - 0.5f;
    for (int c = 0; c < 2 * C; c++) w[c] = 0.5f + dt_rng_uniform(&r);
    bn_case k = {B, C, HW, x, w, out, ms, R};
    bn_loss(&k);
    int64_t acc[4 * C];
    double sd[2 * C];
    dt_batchnorm_dsums(acc, R, x, ms, ms + C, B, C, HW);
    for (int q = 0; q < 2 * C; q++) sd[q] = dt_fixed48_value(acc + 2 * q);
    for (int c = 0; c < C; c++) dw[c] = (float)sd[C + c], dw[C + c] = (float)sd[c];
    dt_batchnorm_backward(dx, R, x, w, ms, ms + C, sd, sd + C, (double)B * HW, B, C, HW);
    double worst = 0;
    float *vars[2] = {x, w}, *grads[2] = {dx, dw};
    int lens[2] = {n, 2 * C};
    for (int v = 0; v < 2; v++)
        for (int i = 0; i < lens[v]; i++) {
            float v0 = vars[v][i], h = 1e-2f;
            vars[v][i] = v0 + h;
            double lp = bn_loss(&k);
            vars[v][i] = v0 - h;
            double lm = bn_loss(&k);
            vars[v][i] = v0;
            double num = (lp - lm) / (2.0 * h), rel = fabs(num - grads[v][i]) / fmax(fmax(fabs(num), fabs(grads[v][i])), 1e-3);
            CHECK(rel <= 1e-2, "batchnorm HW=%d: d L / d %s[%d] = %.6g, finite difference %.6g", HW, v ? "w" : "x", i,
                  grads[v][i], num);
            worst = fmax(worst, rel);
        }
    // Global average pooling: its backward spreads dout / HW.
    float pooled[B * C], dp[B * C * 9] = {0};
    dt_avgpool_forward(pooled, x, B, C, HW);
    dt_avgpool_backward(dp, R, B, C, HW);
    double pe = 0;
    for (int j = 0; j < B * C; j++) {
        double s = 0;
        for (int i = 0; i < HW; i++) s += x[j * HW + i];
        pe = fmax(pe, fabs(pooled[j] - s / HW));
        for (int i = 0; i < HW; i++) pe = fmax(pe, fabs(dp[j * HW + i] - R[j] / HW));
    }
    CHECK(pe <= 1e-6, "avgpool HW=%d: off its reference by %.2e", HW, pe);
    printf("batchnorm kernels HW=%d: finite differences of x, weight, bias worst rel %.1e; avgpool %.1e\n", HW, worst, pe);
}

// ----------------------------------------------------------------------------
// synchronized batch norm: two workers in threads

static pthread_barrier_t g_bar;
static int64_t *g_slot[2];

// The workers' sum: each posts its buffer, both add the two in the same
// order into their own.
static dt_status thread_sum(int64_t *buf, size_t n, void *user) {
    int me = (int)(intptr_t)user;
    g_slot[me] = buf;
    pthread_barrier_wait(&g_bar);
    int64_t *other = g_slot[!me], *tmp = malloc(sizeof(int64_t) * n);
    for (size_t i = 0; i < n; i++) tmp[i] = buf[i] + other[i];
    pthread_barrier_wait(&g_bar);
    memcpy(buf, tmp, sizeof(int64_t) * n);
    free(tmp);
    return DT_OK;
}

typedef struct {
    dt_model *m;
    const float *x;
    const int32_t *y;
    int B;
    dt_status st;
} worker_arg;

static void *worker(void *a) {
    worker_arg *w = a;
    dt_set_threads(1);  // (a thread's own OpenMP setting: the convolutions' scratch is planned for it)
    for (int s = 0; s < 2 && w->st == DT_OK; s++) {  // two steps' forwards and backwards
        dt_model_zero_grad(w->m);
        w->st = dt_model_forward(w->m, w->x, w->y, w->B, 1, NULL);
        if (w->st == DT_OK) w->st = dt_model_backward(w->m);
    }
    return NULL;
}

static void test_sync(int sync) {
    enum { B = 8 };
    const model_def *d = &DEFS[0];
    dt_model *whole = make(d, B), *half[2] = {make(d, B / 2), make(d, B / 2)};
    if (!whole || !half[0] || !half[1]) goto done;
    int in = dt_model_input_size(whole);
    float x[B * 64];
    int32_t y[B];
    dt_rng r;
    dt_rng_seed(&r, 5);
    for (int i = 0; i < B * in; i++) x[i] = 2.0f * dt_rng_uniform(&r) - 1.0f;
    for (int b = 0; b < B; b++) y[b] = (b * 3) % 10;
    dt_model_init(whole, 9);
    worker_arg w[2];
    pthread_t th[2];
    pthread_barrier_init(&g_bar, NULL, 2);
    for (int k = 0; k < 2; k++) {
        dt_model_init(half[k], 9);
        dt_model_set_loss_scale(half[k], 0.5f);
        dt_model_set_batch_sum(half[k], thread_sum, (void *)(intptr_t)k, sync);
        w[k] = (worker_arg){half[k], x + (size_t)k * (B / 2) * in, y + k * (B / 2), B / 2, DT_OK};
        pthread_create(&th[k], NULL, worker, &w[k]);
    }
    for (int k = 0; k < 2; k++) pthread_join(th[k], NULL);
    pthread_barrier_destroy(&g_bar);
    CHECK(w[0].st == DT_OK && w[1].st == DT_OK, "sync_bn workers: %s", dt_last_error());
    worker_arg one = {whole, x, y, B, DT_OK};
    worker(&one);
    CHECK(one.st == DT_OK, "whole batch: %s", dt_last_error());
    size_t np = dt_model_num_params(whole);
    int nb;
    const dt_grad_range *bufs = dt_model_buffer_ranges(whole, &nb);
    // The running statistics: the same bits on both workers; with sync those
    // of the whole batch.
    int same = 1;
    double rs = 0;
    for (int i = 0; i < nb; i++) {
        const float *a = dt_model_params(half[0]) + bufs[i].offset, *b = dt_model_params(half[1]) + bufs[i].offset;
        same &= !memcmp(a, b, sizeof(float) * bufs[i].len);
        rs = fmax(rs, tl_max_rel(a, dt_model_params(whole) + bufs[i].offset, bufs[i].len, 1e-3));
    }
    CHECK(same, "sync_bn = %d: the two workers' running statistics differ", sync);
    if (sync) {
        float *sum = malloc(sizeof(float) * np);
        for (size_t j = 0; j < np; j++) sum[j] = dt_model_grads(half[0])[j] + dt_model_grads(half[1])[j];
        double rg = tl_max_rel(sum, dt_model_grads(whole), np, 1e-3);
        double rl = fmax(tl_max_rel(dt_model_logits(half[0]), dt_model_logits(whole), 4 * 10, 1e-3),
                         tl_max_rel(dt_model_logits(half[1]), dt_model_logits(whole) + 40, 4 * 10, 1e-3));
        CHECK(rg <= 1e-5 && rl <= 1e-5 && rs <= 1e-5,
              "sync_bn, 2 workers vs the whole batch: gradients rel %.2e, logits %.2e, running statistics %.2e", rg, rl, rs);
        printf("sync_bn 2 workers vs one on the whole batch (2 steps): gradients rel %.1e, logits %.1e, running stats %.1e\n",
               rg, rl, rs);
        free(sum);
    } else {
        printf("no sync, 2 workers: running statistics the same bits on both (%.1e from the whole batch's)\n", rs);
    }
done:
    dt_model_free(whole);
    dt_model_free(half[0]);
    dt_model_free(half[1]);
}

// One value per channel in training: refused as PyTorch does.
static void test_one_value(void) {
    dt_model *m = make(&DEFS[1], 4);
    if (!m) return;
    dt_model_init(m, 1);
    float x[20] = {0};
    int32_t y[1] = {0};
    dt_status st = dt_model_forward(m, x, y, 1, 1, NULL);
    CHECK(st == DT_ERR_ARG && strstr(dt_last_error(), "expected more than 1 value per channel when training"),
          "batch 1 through batchnorm in training: status %d, '%s'", st, dt_last_error());
    CHECK(dt_model_forward(m, x, y, 1, 0, NULL) == DT_OK, "batch 1 in eval mode: %s", dt_last_error());
    dt_model_free(m);
}

int main(void) {
    for (int threads = 1; threads <= 2; threads++) {
        printf("-- %d thread%s\n", threads, threads > 1 ? "s" : "");
        dt_set_threads(threads);
        for (int i = 0; i < 2; i++) {
            test_golden(&DEFS[i]);
            test_steps(&DEFS[i], 0);
            test_steps(&DEFS[i], 1);
        }
    }
    dt_set_threads(1);
    test_bn_kernels(1);
    test_bn_kernels(9);
    for (int i = 0; i < 2; i++) {
        test_fd(&DEFS[i], 1);
        test_fd(&DEFS[i], 0);
    }
    test_sync(1);
    test_sync(0);
    test_one_value();
    dt_set_threads(0);
    return tl_finish();
}
