/* The strategy table: every distributed strategy gives the model one
 * process would, on the same global batch (in the spirit of ggml's
 * test-backend-ops).
 *
 * Each row of `rows` is {strategy, model, workers, launcher, flags,
 * reference flags, tolerance}: the row's run and a 1-process run with the
 * reference flags train the same global batches for 50 steps; the final
 * parameters must agree bitwise (tolerance 0) or to the relative tolerance.
 * A new strategy adds its rows. The models: an MLP and a CNN with dropout
 * (global batch 40 over 243 samples, so an epoch ends in a 3-sample batch,
 * once shorter than the number of workers), and a tiny GPT (buckets of
 * 4 KiB, so most of them start from its grad hook during backward; its 40
 * windows split unevenly over 3 workers). Rows with [compression] settings
 * run the data-parallel strategy through a compressing codec.
 *
 * Around the table: a worker that fails makes every worker stop with an
 * error naming it; linear learning-rate scaling; worker-count errors.
 *
 * The data is a small synthetic IDX set written to a temporary directory,
 * and token files of a sequence the GPT can learn. */
#include "dtrain/ckpt.h"
#include "dtrain/gpt.h"
#include "testlib.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char g_tmp[256];
static char g_out[1 << 16];

// Tokens that mostly follow t -> 5t + 3 (mod 32), with random jumps.
static void make_tokens(const char *name, size_t n, uint64_t seed) {
    uint16_t *t = malloc(sizeof(uint16_t) * n);
    dt_rng r;
    dt_rng_seed(&r, seed);
    t[0] = 0;
    for (size_t i = 1; i < n; i++)
        t[i] = dt_rng_below(&r, 8) ? (uint16_t)((5 * t[i - 1] + 3) % 32) : (uint16_t)dt_rng_below(&r, 32);
    char path[512];
    snprintf(path, sizeof path, "%s/%s", g_tmp, name);
    if (dt_tokens_write(path, t, n) != DT_OK) fprintf(stderr, "%s\n", dt_last_error());
    free(t);
}

static const char *cfg_mlp =
    "[model]\ninput = 784\nlayer = linear out=64\nlayer = relu\nlayer = linear out=32\nlayer = gelu\n"
    "layer = linear out=10\n[optim]\nname = sgd\nlr = 0.05\nmomentum = 0.9\n";
static const char *cfg_cnn =
    "[model]\nlayer = conv2d out=6 kernel=5 pad=2\nlayer = relu\nlayer = maxpool kernel=2\n"
    "layer = conv2d out=8 kernel=3 stride=2\nlayer = relu\nlayer = flatten\nlayer = linear out=32\n"
    "layer = relu\nlayer = dropout p=0.3\nlayer = linear out=10\n[optim]\nname = adamw\nlr = 0.002\n"
    "weight_decay = 0.01\n";

// Trains with N workers; returns the exit code. The run dir is TMP/name.
static int train(const char *name, const char *cfg, int N, const char *extra) {
    char path[512], cmd[2048];
    snprintf(path, sizeof path, "%s/%s.ini", g_tmp, name);
    FILE *f = fopen(path, "w");
    fprintf(f, "%s[data]\ndir = %s\n[train]\nbatch = 40\nmax_steps = 50\neval_batch = 100\nseed = 3\n", cfg, g_tmp);
    fclose(f);
    snprintf(cmd, sizeof cmd, "%s train %s --workers %d --quiet --run-dir %s/%s %s", tl_dtrain(), path, N, g_tmp,
             name, extra ? extra : "");
    int rc = tl_run(cmd, g_out, sizeof g_out);
    if (rc != 0) fprintf(stderr, "%s\n-> exit %d\n%s\n", cmd, rc, g_out);
    return rc;
}

static double compare(const char *a, const char *b, int *bitwise) {
    char pa[1400], pb[1400];
    snprintf(pa, sizeof pa, "%s/%s/model.safetensors", g_tmp, a);
    snprintf(pb, sizeof pb, "%s/%s/model.safetensors", g_tmp, b);
    return tl_weights_diff(pa, pb, bitwise);
}

// The GPT's config (its [data] dir, from train(), goes unused). SGD, not
// AdamW: the key bias's gradient is zero but for rounding, which AdamW
// would normalise into full steps of noise.
static char cfg_gpt[1024];

typedef struct {
    const char *strategy; // what the row tests (the strategy the flags select)
    const char *model;    // "mlp", "cnn", "gpt"
    int workers;
    int mpi;              // 1: mpirun -np workers instead of --workers
    const char *flags;    // the row's run
    const char *ref;      // the 1-process reference run
    double tol;           // 0: bitwise
} row;

static const row rows[] = {
    {"dp", "mlp", 2, 0, "", "", 1e-4},
    {"dp", "mlp", 3, 0, "", "", 1e-4},
    {"dp", "mlp", 4, 0, "", "", 1e-4},
    {"dp", "cnn", 2, 0, "", "", 1e-4},
    {"dp", "cnn", 3, 0, "", "", 1e-4},
    {"dp", "cnn", 4, 0, "", "", 1e-4},
    {"dp", "mlp", 1, 0, "--set train.grad_accum=4", "", 1e-4},
    {"dp", "mlp", 2, 0, "--set train.grad_accum=4", "", 1e-4},
    {"dp", "mlp", 3, 0, "--set train.grad_accum=4", "", 1e-4},
    {"dp", "mlp", 4, 0, "--set train.grad_accum=4", "", 1e-4},
    {"dp", "mlp", 3, 1, "", "", 1e-4},
    {"dp-deterministic", "cnn", 1, 0, "--deterministic", "", 1e-3},
    {"dp-deterministic", "cnn", 2, 0, "--deterministic", "--deterministic", 0},
    {"dp-deterministic", "cnn", 3, 0, "--deterministic", "--deterministic", 0},
    {"dp-deterministic", "cnn", 4, 0, "--deterministic", "--deterministic", 0},
    {"dp", "gpt", 2, 0, "", "", 1e-4},
    {"dp", "gpt", 3, 0, "", "", 1e-4},
    {"dp", "gpt", 4, 0, "", "", 1e-4},
    {"dp", "gpt", 3, 1, "", "", 1e-4},
    {"dp", "gpt", 1, 0, "--set train.grad_accum=4", "", 1e-4},
    {"dp", "gpt", 3, 0, "--set train.grad_accum=4", "", 1e-4},
    {"dp-deterministic", "gpt", 1, 0, "--deterministic", "", 1e-3},
    {"dp-deterministic", "gpt", 2, 0, "--deterministic", "--deterministic", 0},
    {"dp-deterministic", "gpt", 3, 0, "--deterministic", "--deterministic", 0},
    {"dp-deterministic", "gpt", 4, 0, "--deterministic", "--deterministic", 0},
    // Gradient compression (docs/compression.md): the settings that send
    // everything are exact; the lossy ones stay close over 50 steps.
    {"dp+topk", "mlp", 3, 0, "--set compression.method=topk --set compression.ratio=1", "", 1e-4},
    {"dp+topk", "gpt", 3, 0, "--set compression.method=topk --set compression.ratio=1", "", 1e-4},
    {"dp+randomk", "gpt", 2, 0, "--set compression.method=randomk --set compression.ratio=1 --set compression.error_feedback=false", "", 1e-4},
    {"dp+powersgd", "mlp", 2, 0, "--set compression.method=powersgd --set compression.rank=1024", "", 1e-3},
    // (the GPT's pieces span tensors whose gradients differ by orders of
    // magnitude, as the key bias's rounding-only one; the projection's
    // rounding, relative to the piece's largest values, moves the small ones)
    {"dp+powersgd", "gpt", 3, 0, "--set compression.method=powersgd --set compression.rank=1024", "", 3e-2},
    {"dp+fp16", "mlp", 2, 0, "--set compression.method=fp16", "", 1e-2},
    {"dp+bf16", "cnn", 2, 0, "--set compression.method=bf16", "", 5e-2},
    {"dp+int8", "mlp", 4, 0, "--set compression.method=int8", "", 5e-2},
    {"dp+fp16", "mlp", 3, 1, "--set compression.method=fp16", "", 1e-2},
};

static const char *model_cfg(const char *model) {
    return !strcmp(model, "mlp") ? cfg_mlp : !strcmp(model, "cnn") ? cfg_cnn : cfg_gpt;
}

// The reference run of a (model, flags) pair, made once: its run name.
static const char *reference(const char *model, const char *flags) {
    static char names[16][64];
    static int n;
    char name[64];
    snprintf(name, sizeof name, "%s-ref-%s", model, *flags ? "det" : "plain");
    for (int i = 0; i < n; i++)
        if (!strcmp(names[i], name)) return names[i];
    if (train(name, model_cfg(model), 1, flags) != 0) return NULL;
    snprintf(names[n], sizeof names[n], "%s", name);
    return names[n++];
}

static void run_row(int i, const row *r) {
    const char *ref = reference(r->model, r->ref);
    if (!ref) {
        CHECK(0, "row %d (%s, %s): the 1-process reference run failed", i, r->strategy, r->model);
        return;
    }
    char name[64];
    snprintf(name, sizeof name, "%s-row%d", r->model, i);
    int rc;
    if (r->mpi) {
        if (access("/usr/bin/mpirun", X_OK) != 0) {
            CHECK(0, "row %d: mpirun is not installed (scripts/install-deps.sh installs it)", i);
            return;
        }
        // The reference's config, one worker per MPI rank.
        char cmd[4096];
        snprintf(cmd, sizeof cmd,
                 "mpirun --allow-run-as-root --oversubscribe -np %d %s train %s/%s.ini --quiet --run-dir %s/%s %s",
                 r->workers, tl_dtrain(), g_tmp, ref, g_tmp, name, r->flags);
        rc = tl_run(cmd, g_out, sizeof g_out);
    } else {
        rc = train(name, model_cfg(r->model), r->workers, r->flags);
    }
    CHECK(rc == 0, "row %d (%s, %s, %d workers%s %s): exit %d\n%s", i, r->strategy, r->model, r->workers,
          r->mpi ? " under mpirun" : "", r->flags, rc, g_out);
    if (rc != 0) return;
    int bw;
    double d = compare(ref, name, &bw);
    if (r->tol == 0)
        CHECK(bw, "row %d (%s, %s, %d workers): not bitwise equal to one process (max rel diff %.3g)", i,
              r->strategy, r->model, r->workers, d);
    else
        CHECK(d >= 0 && d <= r->tol, "row %d (%s, %s, %d workers%s %s): max relative difference %.3g to one process (tolerance %.1g)",
              i, r->strategy, r->model, r->workers, r->mpi ? " under mpirun" : "", r->flags, d, r->tol);
    printf("%-17s %-3s %d worker%s%-13s %-26s vs 1 process %-14s: %s (max rel diff %.3g)\n", r->strategy, r->model,
           r->workers, r->workers > 1 ? "s" : " ", r->mpi ? " (mpirun)" : "", r->flags, *r->ref ? r->ref : "(plain)",
           bw ? "bitwise" : "within tolerance", d);
}

// Rank 2 of 3 fails at step 7: everyone stops, named in the error, no hang.
static void fault(const char *model, const char *cfg) {
    char name[64];
    snprintf(name, sizeof name, "%s-fault", model);
    setenv("DTRAIN_FAULT_STEP", "2:7", 1);
    double t0 = dt_now();
    int rc = train(name, cfg, 3, NULL);
    unsetenv("DTRAIN_FAULT_STEP");
    CHECK(rc == 1, "%s, failing worker: exit %d, expected 1", model, rc);
    CHECK(strstr(g_out, "rank 2, step 7") != NULL, "%s: error names the failing rank and step:\n%s", model, g_out);
    CHECK(strstr(g_out, "rank 0") && strstr(g_out, "aborted"), "%s: the other ranks report the abort:\n%s", model, g_out);
    CHECK(dt_now() - t0 < 60, "%s: failure stopped the job in %.1f s", model, dt_now() - t0);
}

int main(void) {
    snprintf(g_tmp, sizeof g_tmp, "/tmp/dtrain-test-strategy-XXXXXX");
    if (!mkdtemp(g_tmp)) return perror("mkdtemp"), 1;
    tl_make_images(g_tmp, "train", 243, 1);
    tl_make_images(g_tmp, "t10k", 100, 2);

    make_tokens("tok_train.bin", 4000, 5);
    make_tokens("tok_val.bin", 1000, 6);
    snprintf(cfg_gpt, sizeof cfg_gpt,
             "[model]\npreset = gpt\nn_layer = 2\nn_head = 2\nn_embd = 16\nblock_size = 8\nvocab_size = 32\n"
             "[data]\ndataset = tokens\ntrain_file = %s/tok_train.bin\nval_file = %s/tok_val.bin\n"
             "[optim]\nname = sgd\nlr = 0.1\nmomentum = 0.9\n[parallel]\nbucket_kb = 4\n[train]\nseq_len = 8\n"
             "eval_batches = 1\n",
             g_tmp, g_tmp);

    // The table.
    for (int i = 0; i < (int)(sizeof rows / sizeof *rows); i++) run_row(i, &rows[i]);

    // 3. a failing worker stops everyone, named in the error, no hang.
    fault("mlp", cfg_mlp);

    fault("gpt", cfg_gpt);
    // Linear scaling: lr 0.1 x batch 40 / base 20 is lr 0.2 (with warmup).
    train("gpt-lr2", cfg_gpt, 1, "--set optim.lr=0.2 --set schedule.warmup_steps=10");
    train("gpt-scaled", cfg_gpt, 1, "--set optim.lr_scaling=linear --set optim.base_batch=20 --set schedule.warmup_steps=10");
    int bw;
    double d = compare("gpt-lr2", "gpt-scaled", &bw);
    CHECK(d >= 0 && d < 1e-4, "gpt: lr_scaling = linear scales the rate (%.3g)", d);

    // Worker count errors.
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s train configs/fashion-mlp.ini --workers 0", tl_dtrain());
    CHECK(tl_run(cmd, g_out, sizeof g_out) == 2 && strstr(g_out, "--workers"), "--workers 0: usage error\n%s", g_out);

    tl_cleanup(g_tmp);
    return tl_finish();
}
