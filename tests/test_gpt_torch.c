/* The GPT against PyTorch: tests/fixtures/gpt_tiny.safetensors, written by
 * tests/fixtures/make_gpt_fixtures.py (gpt-tiny L2 C64 H4, block_size 16,
 * vocab 60 padded to 64; see the script). The initial parameters are a
 * formula both sides compute exactly; this test checks the logits, the loss
 * and the gradient of every tensor for one batch, then replays 10 AdamW
 * steps over 10 batches and checks each step's loss and the final weights,
 * at 1 and 2 threads. */
#include "dtrain/ckpt.h"
#include "dtrain/gpt.h"
#include "dtrain/optim.h"
#include "kernels/kernels.h"
#include "testlib.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FIXTURE "tests/fixtures/gpt_tiny.safetensors"

/* float32 on both sides with different summation orders: agreement to
 * rounding, relative to each tensor's largest element as the floor (single
 * elements can cancel to ~0). After 10 AdamW steps at lr 1e-2 differences
 * of rounding grow to ~2e-4 (Adam divides by sqrt(v): an element whose
 * gradient is near 0 moves by ~lr in a direction that rounding decides). */
#define TOL_LOSS 1e-5
#define TOL_LOGITS 1e-4
#define TOL_GRAD 1e-4
#define TOL_TRAJ 1e-4
#define TOL_FINAL 5e-4

static const dt_st_tensor *need(dt_st_file *f, const char *name) {
    const dt_st_tensor *t = dt_st_find(f, name);
    CHECK(t != NULL, "fixture tensor %s present", name);
    return t;
}

static double meta_num(dt_st_file *f, const char *key) {
    const char *v = dt_st_meta_get(f, key);
    CHECK(v != NULL, "fixture metadata %s present", key);
    return v ? atof(v) : 0;
}

/* max |a-b| / max(max|b|, 1e-6) */
static double tensor_err(const float *a, const float *b, size_t n) {
    double mb = 1e-6, d = 0;
    for (size_t i = 0; i < n; i++) mb = fmax(mb, fabs(b[i]));
    for (size_t i = 0; i < n; i++) d = fmax(d, fabs((double)a[i] - b[i]));
    return isnan(d) ? INFINITY : d / mb;
}

/* The fixture's initial parameters (make_gpt_fixtures.init_value). */
static void init_formula(dt_gpt *m) {
    float *p = dt_gpt_params(m);
    const dt_gpt_config *c = dt_gpt_get_config(m);
    for (int k = 0; k < dt_gpt_num_tensors(m); k++) {
        const dt_tensor_info *ti = dt_gpt_tensor(m, k);
        const char *n = ti->name;
        int lnw = !strcmp(n, "ln1w") || !strcmp(n, "ln2w") || !strcmp(n, "lnfw");
        int bias = !strcmp(n, "ln1b") || !strcmp(n, "qkvb") || !strcmp(n, "attprojb") || !strcmp(n, "ln2b") ||
                   !strcmp(n, "fcb") || !strcmp(n, "fcprojb") || !strcmp(n, "lnfb");
        for (size_t j = 0; j < ti->numel; j++) {
            uint32_t h = (uint32_t)((uint64_t)j * 2654435761u + (uint64_t)(k + 1) * 40503u);
            double u = (double)h / 4294967296.0 - 0.5;
            double v = lnw ? 1.0 + 0.2 * u : bias ? 0.05 * u : 0.2 * u;
            p[ti->offset + j] = (float)v;
        }
        if (k == 0) memset(p + ti->offset + (size_t)c->vocab_size * c->n_embd, 0,
                           sizeof(float) * (ti->numel - (size_t)c->vocab_size * c->n_embd));
    }
}

// Every gradient of m against the file's grad.<name>, each within tol of
// its largest element; returns the worst.
static double grads_err(dt_gpt *m, dt_st_file *f, double tol, const char *what) {
    double worst = 0;
    for (int k = 0; k < dt_gpt_num_tensors(m); k++) {
        const dt_tensor_info *ti = dt_gpt_tensor(m, k);
        char name[64];
        snprintf(name, sizeof name, "grad.%s", ti->name);
        const dt_st_tensor *t = need(f, name);
        if (!t) continue;
        CHECK(t->nbytes == ti->numel * 4, "%s size", name);
        double e = tensor_err(dt_gpt_grads(m) + ti->offset, tl_st_data(f, t), ti->numel);
        worst = fmax(worst, e);
        CHECK(e <= tol, "%s (%s): rel err %.2e", name, what, e);
    }
    return worst;
}

static void run(dt_st_file *f, int threads) {
    dt_set_threads(threads);
    dt_gpt_config c = {(int)meta_num(f, "n_layer"), (int)meta_num(f, "n_head"), (int)meta_num(f, "n_embd"),
                       (int)meta_num(f, "block_size"), (int)meta_num(f, "vocab_size"),
                       (int)meta_num(f, "padded_vocab_size")};
    int B = (int)meta_num(f, "B"), T = (int)meta_num(f, "T"), steps = (int)meta_num(f, "steps");
    dt_gpt *m;
    if (dt_gpt_create(&m, &c, B, T) != DT_OK) {
        CHECK(0, "create: %s", dt_last_error());
        return;
    }
    init_formula(m);
    const dt_st_tensor *x = need(f, "x"), *y = need(f, "y");
    if (!x || !y) return;
    const int32_t *xs = tl_st_data(f, x), *ys = tl_st_data(f, y);
    float loss;
    dt_gpt_zero_grad(m);
    CHECK(dt_gpt_forward(m, xs, ys, B, T, &loss) == DT_OK, "forward: %s", dt_last_error());
    const dt_st_tensor *tl = need(f, "loss"), *tg = need(f, "logits");
    char what[128];
    snprintf(what, sizeof what, "loss (%d threads)", threads);
    CHECK_NEAR(loss, ((const float *)tl_st_data(f, tl))[0], TOL_LOSS, what);
    double e = tensor_err(dt_gpt_logits(m), tl_st_data(f, tg), (size_t)B * T * c.vocab_size);
    CHECK(e <= TOL_LOGITS, "logits (%d threads): rel err %.2e", threads, e);
    printf("threads %d: loss %.7f (torch %.7f), logits err %.2e\n", threads, loss, ((const float *)tl_st_data(f, tl))[0], e);
    dt_gpt_backward(m);
    snprintf(what, sizeof what, "%d threads", threads);
    double worst = grads_err(m, f, TOL_GRAD, what);
    printf("threads %d: worst gradient err %.2e\n", threads, worst);

    // 10 AdamW steps.
    dt_optim_params op = dt_optim_default_params(DT_OPTIM_ADAMW);
    op.lr = (float)meta_num(f, "lr");
    op.beta1 = (float)meta_num(f, "beta1");
    op.beta2 = (float)meta_num(f, "beta2");
    op.eps = (float)meta_num(f, "eps");
    op.weight_decay = (float)meta_num(f, "weight_decay");
    dt_optim *o;
    dt_optim_create(&o, &op, dt_gpt_num_params(m));
    init_formula(m);
    const float *tlosses = tl_st_data(f, need(f, "losses"));
    worst = 0;
    for (int s = 0; s < steps; s++) {
        dt_gpt_zero_grad(m);
        dt_gpt_forward(m, xs + (size_t)s * B * T, ys + (size_t)s * B * T, B, T, &loss);
        dt_gpt_backward(m);
        dt_optim_step(o, dt_gpt_params(m), dt_gpt_grads(m), op.lr, 1.0f);
        worst = fmax(worst, tl_rel(loss, tlosses[s], 1e-6));
    }
    CHECK(worst <= TOL_TRAJ, "AdamW trajectory losses (%d threads): worst rel err %.2e", threads, worst);
    double wf = 0;
    for (int k = 0; k < dt_gpt_num_tensors(m); k++) {
        const dt_tensor_info *ti = dt_gpt_tensor(m, k);
        char name[64];
        snprintf(name, sizeof name, "final.%s", ti->name);
        const dt_st_tensor *t = need(f, name);
        if (!t) continue;
        const float *a = dt_gpt_params(m) + ti->offset, *b = tl_st_data(f, t);
        if (!strcmp(ti->name, "qkvb")) {
            // The key bias adds q.b_k to every score of a row, which the
            // softmax cancels: its gradient is exactly 0 in exact arithmetic
            // and rounding noise (~1e-9) in practice, which Adam turns into
            // steps of +-lr with a random sign. Compare the query and value
            // biases; for the key bias check only that it stayed in range.
            int C = c.n_embd;
            for (int l = 0; l < c.n_layer; l++) {
                for (int part = 0; part < 3; part += 2) {
                    size_t off = (size_t)l * 3 * C + (size_t)part * C;
                    e = tensor_err(a + off, b + off, (size_t)C);
                    wf = fmax(wf, e);
                    CHECK(e <= TOL_FINAL, "%s layer %d %s (%d threads): rel err %.2e", name, l, part ? "value" : "query", threads, e);
                }
                int in_range = 1;
                for (int i = 0; i < C; i++)
                    in_range &= fabsf(a[(size_t)l * 3 * C + C + i] - b[(size_t)l * 3 * C + C + i]) <= 2 * op.lr * steps;
                CHECK(in_range, "%s layer %d key bias within 2*lr*steps of PyTorch's", name, l);
            }
            continue;
        }
        e = tensor_err(a, b, ti->numel);
        wf = fmax(wf, e);
        CHECK(e <= TOL_FINAL, "%s (%d threads): rel err %.2e", name, threads, e);
    }
    printf("threads %d: trajectory loss err %.2e, final weights err %.2e\n", threads, worst, wf);
    dt_optim_free(o);
    dt_gpt_free(m);
}

/* The first step under PyTorch's CPU autocast in bf16 (gpt_tiny_bf16):
 * dtrain in precision bf16. Tolerances as test_torch.c's bf16 ones: the
 * same bf16-rounded operands on both sides, but PyTorch rounds the logits,
 * attention scores and gradients to bf16 once more (2^-8 relative each). */
static void autocast_step(void) {
    dt_st_file *f;
    if (dt_st_open(&f, "tests/fixtures/gpt_tiny_bf16.safetensors") != DT_OK) {
        CHECK(0, "%s", dt_last_error());
        return;
    }
    dt_kernels_set_precision(DT_BF16);
    dt_gpt_config c = {(int)meta_num(f, "n_layer"), (int)meta_num(f, "n_head"), (int)meta_num(f, "n_embd"),
                       (int)meta_num(f, "block_size"), (int)meta_num(f, "vocab_size"),
                       (int)meta_num(f, "padded_vocab_size")};
    int B = (int)meta_num(f, "B"), T = (int)meta_num(f, "T");
    dt_gpt *m;
    const dt_st_tensor *x = need(f, "x"), *y = need(f, "y"), *tl = need(f, "loss"), *tg = need(f, "logits");
    if (x && y && tl && tg && dt_gpt_create(&m, &c, B, T) == DT_OK) {
        init_formula(m);
        float loss;
        dt_gpt_zero_grad(m);
        CHECK(dt_gpt_forward(m, tl_st_data(f, x), tl_st_data(f, y), B, T, &loss) == DT_OK, "forward: %s", dt_last_error());
        CHECK_NEAR(loss, ((const float *)tl_st_data(f, tl))[0], 4e-3, "bf16 loss against autocast");
        double e = tensor_err(dt_gpt_logits(m), tl_st_data(f, tg), (size_t)B * T * c.vocab_size);
        CHECK(e <= 1e-2, "bf16 logits against autocast: rel err %.2e", e);
        dt_gpt_backward(m);
        double worst = grads_err(m, f, 1e-1, "bf16 against autocast");
        printf("bf16 against autocast bf16: loss %.7f (torch %.7f), logits err %.2e, worst gradient err %.2e\n", loss,
               ((const float *)tl_st_data(f, tl))[0], e, worst);
        dt_gpt_free(m);
    }
    dt_kernels_set_precision(DT_F32);
    dt_st_close(f);
}

int main(void) {
    autocast_step();
    dt_st_file *f;
    if (dt_st_open(&f, FIXTURE) != DT_OK) {
        fprintf(stderr, "%s\n", dt_last_error());
        return 1;
    }
    run(f, 1);
    run(f, 2);
    dt_st_close(f);
    return tl_finish();
}
