/* Data parallel gives the model one worker would.
 *
 *   1. N = 2, 3, 4 workers (`dtrain train --workers N`) against 1 worker on
 *      the same global batch: the final parameters agree to fp32 tolerance
 *      after 50 steps, for an MLP and a CNN with dropout, with a global batch
 *      that does not divide evenly among the workers, epochs whose last
 *      batch is short (once shorter than the number of workers), and
 *      gradient accumulation; also 3 MPI ranks under mpirun.
 *   2. --deterministic: the parameters are bitwise identical for N = 1..4.
 *   3. A worker that fails makes every worker stop, with an error naming it.
 *   4. The same for a tiny GPT (buckets of 4 KiB, so that most of them
 *      start from its grad hook during backward), on a global batch that
 *      splits unevenly over 3 workers, with gradient accumulation, under
 *      mpirun, and linear learning-rate scaling.
 *
 * The data is a small synthetic IDX set written to a temporary directory
 * (243 training samples: with batch 40 an epoch ends in a 3-sample batch),
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
    char pa[512], pb[512];
    snprintf(pa, sizeof pa, "%s/%s/model.safetensors", g_tmp, a);
    snprintf(pb, sizeof pb, "%s/%s/model.safetensors", g_tmp, b);
    return tl_weights_diff(pa, pb, bitwise);
}

// The GPT's config (its [data] dir, from train(), goes unused). SGD, not
// AdamW: the key bias's gradient is zero but for rounding, which AdamW
// would normalise into full steps of noise.
static char cfg_gpt[1024];

static void equivalence(const char *model, const char *cfg, const char *extra, double tol) {
    char base[64], name[64];
    snprintf(base, sizeof base, "%s-1", model);
    if (train(base, cfg, 1, extra) != 0) {
        CHECK(0, "%s: 1-worker run failed", model);
        return;
    }
    for (int N = 2; N <= 4; N++) {
        snprintf(name, sizeof name, "%s-%d", model, N);
        int rc = train(name, cfg, N, extra);
        CHECK(rc == 0, "%s: %d workers exit %d", model, N, rc);
        int bw;
        double d = compare(base, name, &bw);
        CHECK(d >= 0 && d <= tol, "%s: %d workers vs 1: max relative difference %.3g (tolerance %.1g)", model, N, d, tol);
        printf("%s %s: %d workers vs 1: max rel diff %.3g\n", model, extra ? extra : "", N, d);
    }
}

// Gradient accumulation: N workers with grad_accum = 4 match 1, which
// matches plain steps.
static void accumulation(const char *model, const char *cfg) {
    char name[64], base[64];
    snprintf(name, sizeof name, "%s-accum", model);
    equivalence(name, cfg, "--set train.grad_accum=4", 1e-4);
    snprintf(base, sizeof base, "%s-1", model);
    snprintf(name, sizeof name, "%s-accum-1", model);
    int bw;
    double d = compare(base, name, &bw);
    CHECK(d >= 0 && d < 1e-4, "%s: grad_accum=4 on one worker equals plain steps (%.3g)", model, d);
}

// --deterministic: bitwise identical for every worker count, and close to
// the plain 1-worker run.
static void deterministic(const char *model, const char *cfg) {
    char name[64], first[64], plain[64];
    snprintf(first, sizeof first, "%s-det-1", model);
    snprintf(plain, sizeof plain, "%s-1", model);
    int bw;
    for (int N = 1; N <= 4; N++) {
        snprintf(name, sizeof name, "%s-det-%d", model, N);
        int rc = train(name, cfg, N, "--deterministic");
        CHECK(rc == 0, "%s deterministic, %d workers: exit %d", model, N, rc);
        if (N > 1) {
            double d = compare(first, name, &bw);
            CHECK(bw, "%s deterministic: %d workers not bitwise equal to 1 (max rel diff %.3g)", model, N, d);
        }
    }
    double d = compare(first, plain, &bw);
    CHECK(d >= 0 && d < 1e-3, "%s: deterministic run close to the normal one (%.3g)", model, d);
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

// Under mpirun (one worker per MPI rank, when MPI is installed), 3 ranks
// give the 1-worker model of equivalence() (its config, MODEL-1.ini).
static void mpi(const char *model) {
    if (access("/usr/bin/mpirun", X_OK) != 0) {
        printf("mpirun not installed: MPI data-parallel case of %s not run\n", model);
        return;
    }
    char cmd[2048], base[64], name[64];
    snprintf(base, sizeof base, "%s-1", model);
    snprintf(name, sizeof name, "%s-mpi", model);
    snprintf(cmd, sizeof cmd,
             "mpirun --allow-run-as-root --oversubscribe -np 3 %s train %s/%s.ini --quiet --run-dir %s/%s",
             tl_dtrain(), g_tmp, base, g_tmp, name);
    int rc = tl_run(cmd, g_out, sizeof g_out), bw;
    CHECK(rc == 0, "%s, mpirun -np 3: exit %d\n%s", model, rc, g_out);
    double d = compare(base, name, &bw);
    CHECK(d >= 0 && d <= 1e-4, "%s, mpirun -np 3 vs 1 worker: max relative difference %.3g", model, d);
    printf("%s: mpirun -np 3 vs 1 worker: max rel diff %.3g\n", model, d);
}

int main(void) {
    snprintf(g_tmp, sizeof g_tmp, "/tmp/dtrain-test-dp-XXXXXX");
    if (!mkdtemp(g_tmp)) return perror("mkdtemp"), 1;
    tl_make_images(g_tmp, "train", 243, 1);
    tl_make_images(g_tmp, "t10k", 100, 2);

    // 1. same result as one worker (fp32 tolerance: only the order of the
    //    gradient sums differs).
    equivalence("mlp", cfg_mlp, NULL, 1e-4);
    equivalence("cnn", cfg_cnn, NULL, 1e-4);
    accumulation("mlp", cfg_mlp);

    // 2. deterministic mode: bitwise identical for every worker count.
    deterministic("cnn", cfg_cnn);

    // The same under mpirun (one worker per MPI rank).
    mpi("mlp");

    // 3. a failing worker stops everyone, named in the error, no hang.
    fault("mlp", cfg_mlp);

    // 4. the GPT loop: the same engine, the same guarantees. Its global
    //    batch of 40 windows splits unevenly over 3 workers.
    make_tokens("tok_train.bin", 4000, 5);
    make_tokens("tok_val.bin", 1000, 6);
    snprintf(cfg_gpt, sizeof cfg_gpt,
             "[model]\npreset = gpt\nn_layer = 2\nn_head = 2\nn_embd = 16\nblock_size = 8\nvocab_size = 32\n"
             "[data]\ndataset = tokens\ntrain_file = %s/tok_train.bin\nval_file = %s/tok_val.bin\n"
             "[optim]\nname = sgd\nlr = 0.1\nmomentum = 0.9\n[parallel]\nbucket_kb = 4\n[train]\nseq_len = 8\n"
             "eval_batches = 1\n",
             g_tmp, g_tmp);
    equivalence("gpt", cfg_gpt, NULL, 1e-4);
    mpi("gpt");
    accumulation("gpt", cfg_gpt);
    deterministic("gpt", cfg_gpt);
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
