/* The Llama layers and model against PyTorch: the fixtures written by
 * tests/fixtures/make_llama_fixtures.py (see the script).
 *   llama_layers: RMSNorm, rotary, SwiGLU and grouped-query attention,
 *     forward and backward on the same inputs;
 *   llama_tiny: the model's logits, loss and every gradient for one batch,
 *     then 10 AdamW steps (each step's loss, the final weights), at 1 and
 *     2 threads;
 *   llama_hf: Hugging Face's layout: loaded, it is the fixture's initial
 *     model (bitwise) and gives the logits PyTorch computed from it with
 *     rotate_half; saved again, the same tensors bitwise; files with a
 *     tensor missing, extra or mis-shaped refused naming it; and as a
 *     run's [model] init_from. */
#include "dtrain/ckpt.h"
#include "dtrain/gpt.h"  /* dt_tokens_write */
#include "dtrain/llama.h"
#include "dtrain/optim.h"
#include "testlib.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* float32 on both sides with different summation orders, as
 * test_gpt_torch.c: relative to each tensor's largest element. */
#define TOL_LAYER 1e-5
#define TOL_LOSS 1e-5
#define TOL_LOGITS 1e-4
#define TOL_GRAD 1e-4
#define TOL_TRAJ 1e-4
#define TOL_FINAL 5e-4

static const float *get(dt_st_file *f, const char *name) {
    const dt_st_tensor *t = dt_st_find(f, name);
    CHECK(t != NULL, "fixture tensor %s present", name);
    return t ? tl_st_data(f, t) : NULL;
}

static size_t numel(dt_st_file *f, const char *name) {
    const dt_st_tensor *t = dt_st_find(f, name);
    return t ? t->nbytes / 4 : 0;
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

static void expect(const float *got, dt_st_file *f, const char *name, double tol) {
    const float *want = get(f, name);
    if (!want) return;
    double e = tensor_err(got, want, numel(f, name));
    CHECK(e <= tol, "%s: rel err %.2e", name, e);
    printf("%-20s rel err %.2e\n", name, e);
}

// ---- layers

static void layers(void) {
    dt_st_file *f;
    if (dt_st_open(&f, "tests/fixtures/llama_layers.safetensors") != DT_OK) {
        CHECK(0, "%s", dt_last_error());
        return;
    }
    float out[448], d1[448], d2[448], d3[448], rstd[8], att[2 * 4 * 7 * 7], datt[2 * 4 * 7 * 7];
    memset(d1, 0, sizeof d1), memset(d2, 0, sizeof d2), memset(d3, 0, sizeof d3);
    dt_rmsnorm_forward(out, rstd, get(f, "rms.x"), get(f, "rms.w"), 6, 16, 1e-5f);
    dt_rmsnorm_backward(d1, d2, get(f, "rms.dout"), get(f, "rms.x"), get(f, "rms.w"), rstd, 6, 16);
    expect(out, f, "rms.out", TOL_LAYER), expect(d1, f, "rms.dx", TOL_LAYER), expect(d2, f, "rms.dw", TOL_LAYER);

    memcpy(out, get(f, "rope.x"), sizeof(float) * 240);
    dt_rope(out, 2, 5, 3, 8, 10000.0f, 1);
    memcpy(d1, get(f, "rope.dout"), sizeof(float) * 240);
    dt_rope(d1, 2, 5, 3, 8, 10000.0f, -1);
    expect(out, f, "rope.out", TOL_LAYER), expect(d1, f, "rope.dx", TOL_LAYER);

    memset(d1, 0, sizeof d1), memset(d2, 0, sizeof d2);
    dt_swiglu_forward(out, get(f, "swiglu.g"), get(f, "swiglu.u"), 40);
    dt_swiglu_backward(d1, d2, get(f, "swiglu.dh"), get(f, "swiglu.g"), get(f, "swiglu.u"), 40);
    expect(out, f, "swiglu.h", TOL_LAYER), expect(d1, f, "swiglu.dg", TOL_LAYER), expect(d2, f, "swiglu.du", TOL_LAYER);

    memset(d1, 0, sizeof d1), memset(d2, 0, sizeof d2), memset(d3, 0, sizeof d3);
    const float *q = get(f, "gqa.q"), *k = get(f, "gqa.k"), *v = get(f, "gqa.v");
    dt_gqa_forward(out, att, q, k, v, 2, 7, 4, 2, 8);
    dt_gqa_backward(d1, d2, d3, datt, get(f, "gqa.dout"), q, k, v, att, 2, 7, 4, 2, 8);
    expect(out, f, "gqa.out", TOL_LAYER), expect(d1, f, "gqa.dq", TOL_LAYER);
    expect(d2, f, "gqa.dk", TOL_LAYER), expect(d3, f, "gqa.dv", TOL_LAYER);
    dt_st_close(f);
}

// ---- the model

static dt_llama_config fixture_config(dt_st_file *f) {
    return (dt_llama_config){(int)meta_num(f, "n_layer"), (int)meta_num(f, "n_head"), (int)meta_num(f, "n_kv_head"),
                             (int)meta_num(f, "n_embd"), (int)meta_num(f, "ffn_hidden"), (int)meta_num(f, "block_size"),
                             (int)meta_num(f, "vocab_size"), (float)meta_num(f, "rope_theta"),
                             (float)meta_num(f, "norm_eps")};
}

/* The fixture's initial parameters (make_llama_fixtures.init_value). */
static void init_formula(dt_llama *m) {
    float *p = dt_llama_params(m);
    for (int k = 0; k < DT_LLAMA_NTENSORS; k++) {
        const dt_tensor_info *ti = dt_llama_tensor(m, k);
        int norm = strstr(ti->name, "norm") != NULL;
        for (size_t j = 0; j < ti->numel; j++) {
            uint32_t h = (uint32_t)((uint64_t)j * 2654435761u + (uint64_t)(k + 1) * 40503u);
            double u = (double)h / 4294967296.0 - 0.5;
            p[ti->offset + j] = (float)(norm ? 1.0 + 0.2 * u : 0.2 * u);
        }
    }
}

static void expect_tensors(dt_llama *m, const float *block, dt_st_file *f, const char *prefix, double tol) {
    for (int k = 0; k < DT_LLAMA_NTENSORS; k++) {
        const dt_tensor_info *ti = dt_llama_tensor(m, k);
        char name[64];
        snprintf(name, sizeof name, "%s%s", prefix, ti->name);
        CHECK(numel(f, name) == ti->numel, "%s: %zu elements", name, numel(f, name));
        if (numel(f, name) == ti->numel) expect(block + ti->offset, f, name, tol);
    }
}

/* The final weights. An element whose first gradient is at rounding level
 * (not 0, below 1e-5 of its tensor's largest: w_up has one of 2.5e-9 against
 * 0.029) takes a first AdamW step of +-lr whose sign rounding decides, on
 * either side alike; those are checked to stay within 2 lr steps of
 * PyTorch's, the rest within TOL_FINAL. */
static void expect_final(dt_llama *m, dt_st_file *f, double travel) {
    int noisy = 0;
    for (int k = 0; k < DT_LLAMA_NTENSORS; k++) {
        const dt_tensor_info *ti = dt_llama_tensor(m, k);
        char name[64], gname[64];
        snprintf(name, sizeof name, "final.%s", ti->name);
        snprintf(gname, sizeof gname, "grad.%s", ti->name);
        const float *want = get(f, name), *g0 = get(f, gname), *got = dt_llama_params(m) + ti->offset;
        if (!want || !g0 || numel(f, name) != ti->numel) continue;
        double mg = 0, mw = 1e-6, e = 0;
        for (size_t i = 0; i < ti->numel; i++) mg = fmax(mg, fabs(g0[i])), mw = fmax(mw, fabs(want[i]));
        int in_range = 1;
        for (size_t i = 0; i < ti->numel; i++) {
            double d = fabs((double)got[i] - want[i]);
            if (g0[i] != 0 && fabs(g0[i]) < 1e-5 * mg) noisy++, in_range &= d <= 2 * travel;
            else e = fmax(e, d / mw);
        }
        CHECK(e <= TOL_FINAL && in_range, "%s: rel err %.2e, rounding-level elements in range %d", name, e, in_range);
        printf("%-20s rel err %.2e\n", name, e);
    }
    printf("%d elements with a first gradient at rounding level\n", noisy);
}

static void model(dt_st_file *f, int threads) {
    dt_set_threads(threads);
    printf("-- %d threads\n", threads);
    dt_llama_config c = fixture_config(f);
    int B = (int)meta_num(f, "B"), T = (int)meta_num(f, "T"), steps = (int)meta_num(f, "steps");
    dt_llama *m;
    if (dt_llama_create(&m, &c, B, T) != DT_OK) {
        CHECK(0, "create: %s", dt_last_error());
        return;
    }
    init_formula(m);
    const int32_t *xs = (const int32_t *)get(f, "x"), *ys = (const int32_t *)get(f, "y");
    float loss;
    dt_llama_zero_grad(m);
    CHECK(dt_llama_forward(m, xs, ys, B, T, &loss) == DT_OK, "forward: %s", dt_last_error());
    CHECK_NEAR(loss, get(f, "loss")[0], TOL_LOSS, "loss");
    printf("loss %.7f (torch %.7f)\n", loss, get(f, "loss")[0]);
    expect(dt_llama_logits(m), f, "logits", TOL_LOGITS);
    CHECK(dt_llama_backward(m) == DT_OK, "backward: %s", dt_last_error());
    expect_tensors(m, dt_llama_grads(m), f, "grad.", TOL_GRAD);

    dt_optim_params op = dt_optim_default_params(DT_OPTIM_ADAMW);
    op.lr = (float)meta_num(f, "lr");
    op.beta1 = (float)meta_num(f, "beta1");
    op.beta2 = (float)meta_num(f, "beta2");
    op.eps = (float)meta_num(f, "eps");
    op.weight_decay = (float)meta_num(f, "weight_decay");
    dt_optim *o;
    dt_optim_create(&o, &op, dt_llama_num_params(m));
    init_formula(m);
    const float *tlosses = get(f, "losses");
    double worst = 0;
    for (int s = 0; s < steps; s++) {
        dt_llama_zero_grad(m);
        dt_llama_forward(m, xs + (size_t)s * B * T, ys + (size_t)s * B * T, B, T, &loss);
        dt_llama_backward(m);
        dt_optim_step(o, dt_llama_params(m), dt_llama_grads(m), op.lr, 1.0f);
        worst = fmax(worst, tl_rel(loss, tlosses[s], 1e-6));
    }
    CHECK(worst <= TOL_TRAJ, "AdamW trajectory losses: worst rel err %.2e", worst);
    printf("AdamW %d steps: worst loss rel err %.2e\n", steps, worst);
    expect_final(m, f, op.lr * steps);
    dt_optim_free(o);
    dt_llama_free(m);
}

// ---- Hugging Face's layout

// A copy of the HF fixture with tensor `drop` left out, or `add` added, or
// tensor `reshape` given one row fewer.
static void write_variant(const char *out, const char *drop, const char *add, const char *reshape) {
    dt_st_file *f;
    if (dt_st_open(&f, "tests/fixtures/llama_hf.safetensors") != DT_OK) return;
    int n = dt_st_count(f), k = 0;
    dt_st_tensor *t = calloc((size_t)n + 1, sizeof *t);
    for (int i = 0; i < n; i++) {
        const dt_st_tensor *s = dt_st_get(f, i);
        if (drop && !strcmp(s->name, drop)) continue;
        t[k] = *s;
        t[k].data = tl_st_data(f, s);
        if (reshape && !strcmp(s->name, reshape)) {
            t[k].nbytes -= (size_t)t[k].shape[1] * 4;
            t[k].shape[0]--;
        }
        k++;
    }
    if (add) t[k] = t[0], t[k++].name = add;
    CHECK(dt_st_write(out, t, k, NULL, 0) == DT_OK, "write %s: %s", out, dt_last_error());
    free(t);
    dt_st_close(f);
}

static void hf(dt_st_file *tiny) {
    dt_set_threads(1);
    dt_llama_config c = fixture_config(tiny);
    int B = (int)meta_num(tiny, "B"), T = (int)meta_num(tiny, "T");
    dt_llama *a, *b;
    if (dt_llama_create(&a, &c, B, T) != DT_OK || dt_llama_create(&b, &c, 1, 1) != DT_OK) {
        CHECK(0, "create: %s", dt_last_error());
        return;
    }
    init_formula(a);
    CHECK(dt_llama_load_hf(b, "tests/fixtures/llama_hf.safetensors") == DT_OK, "load hf: %s", dt_last_error());
    CHECK(!memcmp(dt_llama_params(a), dt_llama_params(b), 4 * dt_llama_num_params(a)),
          "the HF file loads as the fixture's initial model, bitwise");
    CHECK(dt_llama_load_hf(a, "tests/fixtures/llama_hf.safetensors") == DT_OK, "load hf: %s", dt_last_error());
    const int32_t *xs = (const int32_t *)get(tiny, "x");
    CHECK(dt_llama_forward(a, xs, NULL, B, T, NULL) == DT_OK, "forward: %s", dt_last_error());
    expect(dt_llama_logits(a), tiny, "hf.logits", TOL_LOGITS);
    const char *out = "build/llama_hf_resaved.safetensors";
    CHECK(dt_llama_save_hf(b, out) == DT_OK, "save hf: %s", dt_last_error());
    dt_st_file *x, *y;
    if (dt_st_open(&x, "tests/fixtures/llama_hf.safetensors") == DT_OK && dt_st_open(&y, out) == DT_OK) {
        int same = dt_st_count(x) == dt_st_count(y);
        for (int i = 0; same && i < dt_st_count(x); i++) {
            const dt_st_tensor *t = dt_st_get(x, i), *u = dt_st_find(y, t->name);
            same = u && u->nbytes == t->nbytes && !memcmp(tl_st_data(x, t), tl_st_data(y, u), t->nbytes);
        }
        CHECK(same, "saved in HF layout: the same %d tensors as PyTorch's file, bitwise", dt_st_count(x));
        dt_st_close(x), dt_st_close(y);
    }
    struct { const char *drop, *add, *reshape, *want; } bad[] = {
        {"model.layers.1.mlp.up_proj.weight", NULL, NULL, "tensor model.layers.1.mlp.up_proj.weight is missing"},
        {NULL, "model.layers.2.mlp.up_proj.weight", NULL, "tensor model.layers.2.mlp.up_proj.weight is not one of"},
        {NULL, NULL, "model.layers.0.self_attn.k_proj.weight", "tensor model.layers.0.self_attn.k_proj.weight: expected"},
    };
    for (int i = 0; i < 3; i++) {
        write_variant(out, bad[i].drop, bad[i].add, bad[i].reshape);
        dt_status st = dt_llama_load_hf(b, out);
        CHECK(st == DT_ERR_FORMAT && strstr(dt_last_error(), bad[i].want), "bad HF file %d refused: %s", i,
              dt_last_error());
    }
    remove(out);
    dt_llama_free(a);
    dt_llama_free(b);
}

// [model] init_from = the HF fixture: a run of 2 SGD steps at lr 1e-12 ends
// with the fixture's initial model in its weights file (dtrain's names), to
// 1e-9 (the steps' bound; q and k rows in a wrong order would be O(0.1) off).
static void init_from(dt_st_file *tiny) {
    const char *dir = "build/llama-init-from";
    char cmd[1024], out[4096], tok[256], cfg[256];
    snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir -p %s", dir, dir);
    CHECK(tl_run(cmd, out, sizeof out) == 0, "%s", out);
    snprintf(tok, sizeof tok, "%s/tok.bin", dir);
    snprintf(cfg, sizeof cfg, "%s/llama.ini", dir);
    uint16_t t[512];
    for (int i = 0; i < 512; i++) t[i] = (uint16_t)(i * 7 % 60);
    CHECK(dt_tokens_write(tok, t, 512) == DT_OK, "tokens: %s", dt_last_error());
    FILE *f = fopen(cfg, "w");
    if (!f) return;
    fprintf(f, "[model]\narch = llama\npreset = llama\nn_layer = 2\nn_head = 4\nn_kv_head = 2\nn_embd = 64\n"
               "ffn_hidden = 96\nblock_size = 16\nvocab_size = 60\ninit_from = tests/fixtures/llama_hf.safetensors\n"
               "[data]\ndataset = tokens\ntrain_file = %s\n[optim]\nname = sgd\nlr = 1e-12\nweight_decay = 0\n"
               "[train]\nbatch = 2\nseq_len = 16\nmax_steps = 2\n", tok);
    fclose(f);
    snprintf(cmd, sizeof cmd, "%s train %s --run-dir %s/run", tl_dtrain(), cfg, dir);
    int rc = tl_run(cmd, out, sizeof out);
    CHECK(rc == 0, "init_from run: exit %d: %s", rc, out);
    char w[256];
    snprintf(w, sizeof w, "%s/run/model.safetensors", dir);
    dt_st_file *wf;
    dt_llama *m;
    dt_llama_config c = fixture_config(tiny);
    if (rc != 0 || dt_st_open(&wf, w) != DT_OK || dt_llama_create(&m, &c, 0, 0) != DT_OK) return;
    init_formula(m);
    double worst = 0;
    for (int k = 0; k < DT_LLAMA_NTENSORS; k++) {
        const dt_tensor_info *ti = dt_llama_tensor(m, k);
        const dt_st_tensor *st = dt_st_find(wf, ti->name);
        if (!st || st->nbytes != 4 * ti->numel) {
            worst = INFINITY;
            continue;
        }
        const float *a = tl_st_data(wf, st), *b = dt_llama_params(m) + ti->offset;
        for (size_t i = 0; i < ti->numel; i++) worst = fmax(worst, fabs((double)a[i] - b[i]));
    }
    CHECK(worst <= 1e-9, "init_from the HF file: the run's weights are the fixture's initial model (max |diff| %.2e)", worst);
    printf("init_from the HF file: max |diff| %.2e from the fixture's initial model\n", worst);
    dt_st_close(wf);
    dt_llama_free(m);
}

int main(void) {
    layers();
    dt_st_file *f;
    if (dt_st_open(&f, "tests/fixtures/llama_tiny.safetensors") != DT_OK) {
        fprintf(stderr, "%s\n", dt_last_error());
        return 1;
    }
    model(f, 1);
    model(f, 2);
    hf(f);
    init_from(f);
    dt_st_close(f);
    return tl_finish();
}
