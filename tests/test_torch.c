/* Golden comparison against PyTorch.
 *
 * The files tests/fixtures/{mlp,cnn,ln,traj_*}.safetensors were written by
 * tests/fixtures/make_torch_fixtures.py (PyTorch, float32, one thread; see
 * the script for what each file holds). For each model this test builds the
 * same dt_model, copies PyTorch's initial weights into the flat parameter
 * block by tensor name, and checks the loss, the logits and every parameter
 * gradient; then it replays 10 optimizer steps (SGD with momentum, SGD with
 * Nesterov momentum under a warmup + cosine schedule, AdamW) and checks the
 * loss at every step and the final weights. Hyperparameters come from the
 * files' __metadata__. */
#include "dtrain/ckpt.h"
#include "dtrain/nn.h"
#include "dtrain/optim.h"
#include "kernels/kernels.h"
#include "testlib.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FIXTURES "tests/fixtures/"

/* Tolerances. float32 on both sides with different summation orders (oneDNN
 * vs PyTorch's CPU kernels), so agreement is to rounding: ~1e-6 relative on
 * the loss and logits, ~1e-5 on gradients (relative to the tensor's largest
 * element as a floor, since single gradient elements can cancel to ~0). */
#define TOL_LOSS 1e-5
#define TOL_LOGITS 1e-4
#define TOL_GRAD 1e-4
#define TOL_TRAJ_LOSS 1e-4
#define TOL_FINAL 1e-4

static double g_worst_loss, g_worst_logits, g_worst_grad, g_worst_traj, g_worst_final;

// ----------------------------------------------------------------------------
// the models of make_torch_fixtures.py

typedef struct {
    const char *name;
    int in[3];
    int n;
    dt_layer_spec L[12];
} model_def;

static const model_def MODELS[] = {
    {"mlp", {20, 1, 1}, 6,
     {{.kind = DT_LAYER_FLATTEN},
      {.kind = DT_LAYER_LINEAR, .out = 32},
      {.kind = DT_LAYER_RELU},
      {.kind = DT_LAYER_LINEAR, .out = 32},
      {.kind = DT_LAYER_RELU},
      {.kind = DT_LAYER_LINEAR, .out = 5}}},
    {"cnn", {1, 12, 12}, 10,
     {{.kind = DT_LAYER_CONV2D, .out = 4, .kernel = 5, .pad = 2},
      {.kind = DT_LAYER_RELU},
      {.kind = DT_LAYER_MAXPOOL, .kernel = 2},
      {.kind = DT_LAYER_CONV2D, .out = 6, .kernel = 3, .pad = 1},
      {.kind = DT_LAYER_RELU},
      {.kind = DT_LAYER_MAXPOOL, .kernel = 2},
      {.kind = DT_LAYER_FLATTEN},
      {.kind = DT_LAYER_LINEAR, .out = 16},
      {.kind = DT_LAYER_RELU},
      {.kind = DT_LAYER_LINEAR, .out = 10}}},
    {"ln", {20, 1, 1}, 5,
     {{.kind = DT_LAYER_FLATTEN},
      {.kind = DT_LAYER_LINEAR, .out = 24},
      {.kind = DT_LAYER_LAYERNORM, .eps = 1e-5f},
      {.kind = DT_LAYER_GELU},
      {.kind = DT_LAYER_LINEAR, .out = 5}}},
};

static const model_def *find_model(const char *name) {
    for (size_t i = 0; i < sizeof MODELS / sizeof MODELS[0]; i++)
        if (name && !strcmp(MODELS[i].name, name)) return &MODELS[i];
    return NULL;
}

// ----------------------------------------------------------------------------
// fixture access

static dt_st_file *open_fixture(const char *file) {
    char path[256];
    snprintf(path, sizeof path, FIXTURES "%s", file);
    dt_st_file *f = NULL;
    dt_status st = dt_st_open(&f, path);
    CHECK(st == DT_OK, "%s: %s", path, dt_last_error());
    return st == DT_OK ? f : NULL;
}

static size_t numel(const dt_st_tensor *t) {
    size_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= (size_t)t->shape[d];
    return n;
}

/* A tensor of the given dtype and element count (0 = any), or NULL after a
 * failed CHECK. */
static const dt_st_tensor *need(const dt_st_file *f, const char *file, const char *name,
                                dt_dtype dtype, size_t n) {
    const dt_st_tensor *t = dt_st_find(f, name);
    CHECK(t != NULL, "%s: no tensor '%s'", file, name);
    if (!t) return NULL;
    CHECK(t->dtype == dtype, "%s: '%s' is %s", file, name, dt_dtype_name(t->dtype));
    CHECK(!n || numel(t) == n, "%s: '%s' has %zu elements, expected %zu", file, name, numel(t), n);
    return t->dtype == dtype && (!n || numel(t) == n) ? t : NULL;
}

/* A copy of a tensor's data (the file's bytes need not be aligned). */
static void *load(const dt_st_file *f, const char *file, const char *name, dt_dtype dtype,
                  size_t n) {
    const dt_st_tensor *t = need(f, file, name, dtype, n);
    if (!t) return NULL;
    void *p = malloc(t->nbytes ? t->nbytes : 1);
    if (dt_st_read(f, t, 0, numel(t), dtype, p) != DT_OK) {
        CHECK(0, "%s: '%s': %s", file, name, dt_last_error());
        free(p);
        return NULL;
    }
    return p;
}

static double meta_num(const dt_st_file *f, const char *file, const char *key) {
    const char *v = dt_st_meta_get(f, key);
    CHECK(v != NULL, "%s: no metadata '%s'", file, key);
    return v ? strtod(v, NULL) : NAN;
}

/* Builds the model named in the file's metadata and loads "<prefix><name>"
 * for every parameter tensor; checks that the file holds no other tensors
 * under that prefix. */
static dt_model *build_model(const dt_st_file *f, const char *file, const char *prefix, int B) {
    const model_def *md = find_model(dt_st_meta_get(f, "model"));
    CHECK(md != NULL, "%s: unknown model '%s'", file, dt_st_meta_get(f, "model"));
    if (!md) return NULL;
    dt_model *m;
    dt_status st = dt_model_create(&m, md->in, md->L, md->n, B);
    CHECK(st == DT_OK, "%s: model create: %s", file, dt_last_error());
    if (st != DT_OK) return NULL;
    int in_file = 0, plen = (int)strlen(prefix);
    for (int i = 0; i < dt_st_count(f); i++)
        if (!strncmp(dt_st_get(f, i)->name, prefix, plen)) in_file++;
    CHECK(in_file == dt_model_num_tensors(m), "%s: %d '%s*' tensors, the model has %d", file,
          in_file, prefix, dt_model_num_tensors(m));
    float *params = dt_model_params(m);
    memset(params, 0xff, sizeof(float) * dt_model_num_params(m)); // NaN: catches gaps
    for (int i = 0; i < dt_model_num_tensors(m); i++) {
        const dt_tensor_info *ti = dt_model_tensor(m, i);
        char name[96];
        snprintf(name, sizeof name, "%s%s", prefix, ti->name);
        const dt_st_tensor *t = need(f, file, name, DT_F32, ti->numel);
        if (!t) continue;
        int same = t->ndim == ti->ndim;
        for (int d = 0; same && d < t->ndim; d++) same = t->shape[d] == ti->shape[d];
        CHECK(same, "%s: '%s' has a different shape from the model's", file, name);
        CHECK(dt_st_read(f, t, 0, ti->numel, DT_F32, params + ti->offset) == DT_OK, "%s: %s", file, dt_last_error());
    }
    size_t bad = 0;
    for (size_t j = 0; j < dt_model_num_params(m); j++) bad += !isfinite(params[j]);
    CHECK(bad == 0, "%s: %zu parameters not loaded", file, bad);
    return m;
}

/* Compares a block of model parameters or gradients tensor by tensor with
 * "<prefix><name>"; the floor of each tensor's relative error is
 * floor_frac * its largest reference element. Returns the worst. */
static double compare_tensors(dt_model *m, const float *block, const dt_st_file *f,
                              const char *file, const char *prefix, double floor_frac,
                              double tol) {
    double worst = 0;
    for (int i = 0; i < dt_model_num_tensors(m); i++) {
        const dt_tensor_info *ti = dt_model_tensor(m, i);
        char name[96];
        snprintf(name, sizeof name, "%s%s", prefix, ti->name);
        float *ref = load(f, file, name, DT_F32, ti->numel);
        if (!ref) continue;
        double mx = 0;
        for (size_t j = 0; j < ti->numel; j++) mx = fmax(mx, fabs(ref[j]));
        double r = tl_max_rel(block + ti->offset, ref, ti->numel, fmax(mx * floor_frac, 1e-7));
        CHECK(r <= tol, "%s: %s differs from PyTorch: rel %.2e > %.1e", file, name, r, tol);
        if (r > worst) worst = r;
        free(ref);
    }
    return worst;
}

// ----------------------------------------------------------------------------
// one forward/backward against PyTorch

/* Tolerances of the bf16 fixtures (PyTorch's CPU autocast, bf16): both
 * sides multiply the same bf16-rounded inputs and weights (autocast rounds
 * a linear's output to bf16 where dtrain rounds it as the next layer's
 * operand: the same rounding), but autocast also rounds the logits and
 * every gradient it computes in bf16 once more, to an 8-bit significand
 * (2^-8 = 3.9e-3 relative), where dtrain keeps fp32; and a difference in
 * an fp32 sum can move an operand across a rounding boundary. So: a few
 * 2^-8 on logits (against the tensor's largest element). The gradients
 * differ more, by PyTorch's own rounding: its bf16 convolution's weight
 * gradient is 4.9e-2 from the fp32 one (of the largest element) on this
 * fixture, dtrain's bf16 and fp32 both within 5e-2 of it. dtrain's bf16
 * kernels are checked element by element against bounds in
 * test_precision.c; here the whole step is checked against the reference. */
#define TOL_BF16_LOSS 4e-3
#define TOL_BF16_LOGITS 1e-2
#define TOL_BF16_GRAD 1e-1

// Returns the largest gradient error (or -1 when the file does not load).
// floor: of an element's relative error, as a fraction of its tensor's largest element.
static double test_golden_tol(const char *file, double floor, double tol_loss, double tol_logits, double tol_grad) {
    double rg = -1;
    dt_st_file *f = open_fixture(file);
    if (!f) return rg;
    int B = (int)meta_num(f, file, "batch");
    dt_model *m = build_model(f, file, "init.", B);
    if (!m) {
        dt_st_close(f);
        return rg;
    }
    int in = dt_model_input_size(m), V = dt_model_num_classes(m);
    float *x = load(f, file, "x", DT_F32, (size_t)B * in);
    int32_t *y = load(f, file, "y", DT_I32, B);
    float *logits = load(f, file, "logits", DT_F32, (size_t)B * V);
    float *ref_loss = load(f, file, "loss", DT_F32, 1);
    if (x && y && logits && ref_loss) {
        float loss = NAN;
        dt_model_zero_grad(m);
        dt_status st = dt_model_forward(m, x, y, B, 1, &loss);
        CHECK(st == DT_OK, "%s: forward: %s", file, dt_last_error());
        double rl = tl_rel(loss, ref_loss[0], 1e-6);
        CHECK(rl <= tol_loss, "%s: loss %.8g, PyTorch %.8g (rel %.2e)", file, loss, ref_loss[0], rl);
        double mx = 0;
        for (int i = 0; i < B * V; i++) mx = fmax(mx, fabs(logits[i]));
        double r = tl_max_rel(dt_model_logits(m), logits, (size_t)B * V, floor * mx);
        CHECK(r <= tol_logits, "%s: logits differ from PyTorch: rel %.2e", file, r);
        st = dt_model_backward(m);
        CHECK(st == DT_OK, "%s: backward: %s", file, dt_last_error());
        rg = compare_tensors(m, dt_model_grads(m), f, file, "grad.", floor, tol_grad);
        printf("%-22s loss rel %.1e, logits rel %.1e, gradients rel %.1e\n", file, rl, r, rg);
        if (tol_grad <= TOL_GRAD) {  // the fp32 fixtures' worst
            g_worst_loss = fmax(g_worst_loss, rl);
            g_worst_logits = fmax(g_worst_logits, r);
            g_worst_grad = fmax(g_worst_grad, rg);
        }
    }
    free(x), free(y), free(logits), free(ref_loss);
    dt_model_free(m);
    dt_st_close(f);
    return rg;
}

static void test_golden(const char *file) { test_golden_tol(file, 1e-2, TOL_LOSS, TOL_LOGITS, TOL_GRAD); }

// A step under autocast bf16 against dtrain in bf16.
static void test_golden_bf16(const char *file) {
    dt_kernels_set_precision(DT_BF16);  // before the model: its convolution plans are the precision's
    double e = test_golden_tol(file, 1, TOL_BF16_LOSS, TOL_BF16_LOGITS, TOL_BF16_GRAD);
    dt_kernels_set_precision(DT_F32);
    CHECK(e >= 0, "%s loaded", file);
}

// ----------------------------------------------------------------------------
// optimizer trajectories against PyTorch

static void test_trajectory(const char *file) {
    dt_st_file *f = open_fixture(file);
    if (!f) return;
    int B = (int)meta_num(f, file, "batch"), steps = (int)meta_num(f, file, "steps");
    int fixed = (int)meta_num(f, file, "fixed_batch");
    dt_model *m = build_model(f, file, "init.", B);
    if (!m || steps <= 0) {
        dt_model_free(m);
        dt_st_close(f);
        return;
    }
    int in = dt_model_input_size(m);
    size_t np = dt_model_num_params(m), nb = fixed ? 1 : (size_t)steps;
    float *init = malloc(sizeof(float) * np);
    memcpy(init, dt_model_params(m), sizeof(float) * np);
    float *x = load(f, file, "x", DT_F32, nb * B * in);
    int32_t *y = load(f, file, "y", DT_I32, nb * B);
    float *losses = load(f, file, "losses", DT_F32, steps);
    float *lrs = load(f, file, "lrs", DT_F32, steps);

    const char *opt = dt_st_meta_get(f, "optimizer");
    int adamw = opt && !strcmp(opt, "adamw");
    CHECK(opt && (adamw || !strcmp(opt, "sgd")), "%s: optimizer '%s'", file, opt ? opt : "");
    dt_optim_params op = dt_optim_default_params(adamw ? DT_OPTIM_ADAMW : DT_OPTIM_SGD);
    op.lr = (float)meta_num(f, file, "lr");
    op.weight_decay = (float)meta_num(f, file, "weight_decay");
    if (adamw) {
        op.beta1 = (float)meta_num(f, file, "beta1");
        op.beta2 = (float)meta_num(f, file, "beta2");
        op.eps = (float)meta_num(f, file, "eps");
    } else {
        op.momentum = (float)meta_num(f, file, "momentum");
        op.nesterov = (int)meta_num(f, file, "nesterov");
    }
    const char *sk = dt_st_meta_get(f, "schedule");
    dt_schedule sched = {.kind = DT_SCHED_CONSTANT, .lr = op.lr};
    if (sk && !strcmp(sk, "cosine")) sched.kind = DT_SCHED_COSINE;
    else if (sk && !strcmp(sk, "linear")) sched.kind = DT_SCHED_LINEAR;
    else CHECK(sk && !strcmp(sk, "constant"), "%s: schedule '%s'", file, sk ? sk : "");
    sched.min_lr = (float)meta_num(f, file, "min_lr");
    sched.warmup_steps = (int64_t)meta_num(f, file, "warmup_steps");
    sched.total_steps = (int64_t)meta_num(f, file, "total_steps");

    dt_optim *o = NULL;
    dt_status st = dt_optim_create(&o, &op, np);
    CHECK(st == DT_OK, "%s: optimizer: %s", file, dt_last_error());
    // Beside it, the same steps taken slice by slice as three ranks of a
    // sharded strategy would (dt_shard_range), on a copy of the weights,
    // must give bitwise the same weights.
    enum { SLICES = 3 };
    dt_optim *os[SLICES] = {0};
    float *ps = malloc(sizeof(float) * np);
    memcpy(ps, init, sizeof(float) * np);
    for (int r = 0; r < SLICES; r++) {
        size_t lo, hi;
        dt_shard_range(np, r, SLICES, &lo, &hi);
        CHECK(dt_optim_create(&os[r], &op, hi - lo) == DT_OK, "%s: slice optimizer: %s", file, dt_last_error());
    }
    if (x && y && losses && lrs && o) {
        double worst = 0, worst_lr = 0;
        int failed_at = -1;
        float got_at = 0;
        for (int s = 0; s < steps; s++) {
            const float *xs = x + (fixed ? 0 : (size_t)s * B * in);
            const int32_t *ys = y + (fixed ? 0 : (size_t)s * B);
            float loss = NAN;
            dt_model_zero_grad(m);
            st = dt_model_forward(m, xs, ys, B, 1, &loss);
            if (st == DT_OK) st = dt_model_backward(m);
            CHECK(st == DT_OK, "%s step %d: %s", file, s, dt_last_error());
            double r = tl_rel(loss, losses[s], 1e-6);
            if (r > TOL_TRAJ_LOSS && failed_at < 0) failed_at = s, got_at = loss;
            worst = fmax(worst, r);
            float lr = dt_schedule_lr(&sched, s);
            worst_lr = fmax(worst_lr, tl_rel(lr, lrs[s], 1e-9));
            dt_optim_step(o, dt_model_params(m), dt_model_grads(m), lr, 1.0f);
            for (int r = 0; r < SLICES; r++) {
                size_t lo, hi;
                dt_shard_range(np, r, SLICES, &lo, &hi);
                dt_optim_begin_step(os[r]);
                dt_optim_update(os[r], 0, hi - lo, ps + lo, dt_model_grads(m) + lo, lr, 1.0f);
            }
        }
        CHECK(!memcmp(ps, dt_model_params(m), sizeof(float) * np),
              "%s: the step taken in %d slices is not bitwise the whole step", file, SLICES);
        CHECK(failed_at < 0, "%s: loss leaves PyTorch's trajectory at step %d: %.8g, PyTorch %.8g",
              file, failed_at, got_at, failed_at >= 0 ? losses[failed_at] : 0.0);
        CHECK(worst_lr <= 1e-6, "%s: schedule's learning rates differ from the fixture's: rel %.2e",
              file, worst_lr);
        // The weights must move well beyond the tolerance, or matching the
        // final weights would prove nothing.
        double moved = 0, size = 0;
        for (size_t j = 0; j < np; j++) {
            moved += fabs(dt_model_params(m)[j] - init[j]);
            size += fabs(init[j]);
        }
        CHECK(moved > 0.02 * size, "%s: the weights barely move (%.2e of their L1 norm)", file,
              moved / size);
        double rf = compare_tensors(m, dt_model_params(m), f, file, "final.", 1e-2, TOL_FINAL);
        printf("%-26s %s: loss %.4f -> %.4f, worst loss rel %.1e, final weights rel %.1e\n",
               file, adamw ? "adamw" : op.nesterov ? "sgd nesterov" : "sgd momentum", losses[0],
               losses[steps - 1], worst, rf);
        g_worst_traj = fmax(g_worst_traj, worst);
        g_worst_final = fmax(g_worst_final, rf);
    }
    for (int r = 0; r < SLICES; r++) dt_optim_free(os[r]);
    free(ps);
    dt_optim_free(o);
    free(x), free(y), free(losses), free(lrs), free(init);
    dt_model_free(m);
    dt_st_close(f);
}

int main(void) {
    for (int threads = 1; threads <= 2; threads++) {
        printf("-- %d thread%s\n", threads, threads > 1 ? "s" : "");
        dt_set_threads(threads);
        test_golden("mlp.safetensors");
        test_golden("cnn.safetensors");
        test_golden("ln.safetensors");
        test_golden_bf16("mlp_bf16.safetensors");
        test_golden_bf16("cnn_bf16.safetensors");
        test_trajectory("traj_sgd.safetensors");
        test_trajectory("traj_nesterov.safetensors");
        test_trajectory("traj_adamw.safetensors");
    }
    dt_set_threads(0);
    printf("worst rel: loss %.1e, logits %.1e, gradients %.1e, trajectory losses %.1e, "
           "final weights %.1e\n",
           g_worst_loss, g_worst_logits, g_worst_grad, g_worst_traj, g_worst_final);
    return tl_finish();
}
