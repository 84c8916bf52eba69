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
 * windows split unevenly over 3 workers).
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

// The CNN with SGD and momentum, for rows that need an optimizer linear in the gradients.
#define LSGD_SGD "--set optim.name=sgd --set optim.lr=0.05 --set optim.momentum=0.9 --set optim.weight_decay=0"

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
    // local-sgd, H = 1: the mean of the ranks' SGD steps (momentum and
    // Nesterov are linear in the gradients too) is the data-parallel step
    // when the shares are equal: drop_last, and 40 samples over 2 or 4.
    {"local-sgd", "mlp", 2, 0, "--set parallel.sync_every=1 --set data.drop_last=true", "--set data.drop_last=true", 1e-6},
    {"local-sgd", "mlp", 4, 0, "--set parallel.sync_every=1 --set data.drop_last=true", "--set data.drop_last=true", 1e-6},
    {"local-sgd", "cnn", 2, 0, "--set parallel.sync_every=1 --set data.drop_last=true " LSGD_SGD, "--set data.drop_last=true " LSGD_SGD, 1e-6},
    {"local-sgd", "mlp", 2, 1, "--set parallel.sync_every=1 --set data.drop_last=true", "--set data.drop_last=true", 1e-6},
    // One worker: any H is the 1-process run, bitwise.
    {"local-sgd", "mlp", 1, 0, "--set parallel.sync_every=4", "", 0},
    {"local-sgd", "cnn", 1, 0, "--set parallel.sync_every=3", "", 0},
    {"local-sgd", "gpt", 1, 0, "--set parallel.sync_every=5", "", 0},
    // A warm-up longer than the run is plain data parallel (AdamW, 3 uneven shares).
    {"local-sgd", "cnn", 3, 0, "--set parallel.sync_every=4 --set parallel.sync_warmup=1000", "", 1e-4},
};

static const char *model_cfg(const char *model) {
    return !strcmp(model, "mlp") ? cfg_mlp : !strcmp(model, "cnn") ? cfg_cnn : cfg_gpt;
}

// The reference run of a (model, flags) pair, made once: its run name.
static const char *reference(const char *model, const char *flags) {
    static struct {
        const char *model, *flags;
        char name[64];
    } refs[32];
    static int n;
    for (int i = 0; i < n; i++)
        if (!strcmp(refs[i].model, model) && !strcmp(refs[i].flags, flags)) return refs[i].name;
    if (n == 32) return NULL;
    snprintf(refs[n].name, sizeof refs[n].name, "%s-ref-%d", model, n);
    if (train(refs[n].name, model_cfg(model), 1, flags) != 0) return NULL;
    refs[n].model = model;
    refs[n].flags = flags;
    return refs[n++].name;
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

// Sums a number field over the step records of rank 0's metrics log.
static double metrics_sum(const char *run, const char *key, double *first) {
    char path[1024], pat[64];
    snprintf(path, sizeof path, "%s/%s/metrics/rank-00000.jsonl", g_tmp, run);
    snprintf(pat, sizeof pat, "\"%s\":", key);
    char *text = tl_read_file(path, NULL);
    double total = 0;
    *first = -1;
    for (const char *p = text; p && (p = strstr(p, "\"type\":\"step\"")); p++) {
        const char *v = strstr(p, pat);
        if (!v) break;
        double x = atof(v + strlen(pat));
        if (*first < 0) *first = x;
        total += x;
    }
    free(text);
    return total;
}

static double summary_number(const char *run, const char *key) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s/summary.json", g_tmp, run);
    return tl_json_number(path, key);
}
// Local SGD with H = 4 over 2 workers trains, and moves fewer bytes than
// data parallel; post-local SGD (a warm-up of dp steps) too; a bad
// combination is refused by name.
static void local_sgd(void) {
    const char *both = "--set data.drop_last=true --set train.epochs=10";  // 60 steps
    char flags[256];
    CHECK(train("lsgd-dp", cfg_mlp, 2, both) == 0, "local-sgd: the dp run");
    snprintf(flags, sizeof flags, "%s --set parallel.sync_every=4", both);
    CHECK(train("lsgd-h4", cfg_mlp, 2, flags) == 0, "local-sgd: the H = 4 run");
    snprintf(flags, sizeof flags, "%s --set parallel.sync_every=4 --set parallel.sync_warmup=12", both);
    CHECK(train("lsgd-post", cfg_mlp, 2, flags) == 0, "local-sgd: the post-local run");
    double first, dp_bytes = metrics_sum("lsgd-dp", "bytes_sent", &first);
    double h4_first, h4_bytes = metrics_sum("lsgd-h4", "bytes_sent", &h4_first);
    double post_first, post_bytes = metrics_sum("lsgd-post", "bytes_sent", &post_first);
    double loss_first;
    metrics_sum("lsgd-h4", "loss", &loss_first);
    double h4_loss = summary_number("lsgd-h4", "final_train_loss"), dp_acc = summary_number("lsgd-dp", "test_accuracy");
    double h4_acc = summary_number("lsgd-h4", "test_accuracy");
    CHECK(loss_first > 0 && h4_loss > 0 && h4_loss < 0.7 * loss_first,
          "local-sgd H=4: the loss falls (first step %.4f, last epoch %.4f)", loss_first, h4_loss);
    CHECK(h4_acc > 0.5 && h4_acc > dp_acc - 0.15, "local-sgd H=4: test accuracy %.3f (dp %.3f)", h4_acc, dp_acc);
    // Per 12 steps (2 epochs of 6): dp sums 12 gradients, H = 4 averages the
    // parameters 3 times and once more before the mid-point evaluation.
    CHECK(dp_bytes > 0 && h4_bytes > 0 && h4_bytes * 2.5 < dp_bytes,
          "local-sgd H=4 moves fewer bytes: %.0f against dp's %.0f", h4_bytes, dp_bytes);
    CHECK(post_bytes > h4_bytes && post_bytes < dp_bytes, "post-local SGD: %.0f bytes between H=4's %.0f and dp's %.0f",
          post_bytes, h4_bytes, dp_bytes);
    printf("local-sgd mlp 2 workers, 60 steps: bytes sent by rank 0: dp %.0f, H=4 %.0f, warm-up 12 + H=4 %.0f; "
           "test accuracy dp %.3f, H=4 %.3f\n", dp_bytes, h4_bytes, post_bytes, dp_acc, h4_acc);
    // A checkpoint between two averages holds the workers' mean: the one at
    // step 3 of 6 (H = 1000: no average before it, no evaluation at it) is
    // the final model of the same run stopped at step 3.
    CHECK(train("lsgd-ckpt", cfg_mlp, 2, "--set parallel.sync_every=1000 --set train.epochs=10 --set train.max_steps=6 "
                                          "--checkpoint-every 3") == 0, "local-sgd with checkpoints");
    CHECK(train("lsgd-3", cfg_mlp, 2, "--set parallel.sync_every=1000 --set train.epochs=10 --set train.max_steps=3") == 0,
          "local-sgd, 3 steps");
    char pa[1024], pb[1024];
    snprintf(pa, sizeof pa, "%s/lsgd-3/model.safetensors", g_tmp);
    snprintf(pb, sizeof pb, "%s/lsgd-ckpt/checkpoints/step-00000003.safetensors", g_tmp);
    int bw;
    double d = tl_weights_diff(pa, pb, &bw);
    CHECK(bw, "local-sgd: the checkpoint holds the averaged parameters (max rel diff %.3g)", d);
    CHECK(train("lsgd-det", cfg_mlp, 2, "--set parallel.sync_every=4 --deterministic") == 2 &&
              strstr(g_out, "sync_every") && strstr(g_out, "deterministic"),
          "local-sgd with deterministic: refused by name\n%s", g_out);
}

// test_strategy [STRATEGY]: with an argument, only that strategy's rows and checks.
int main(int argc, char **argv) {
    const char *only = argc > 1 ? argv[1] : NULL;
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
    for (int i = 0; i < (int)(sizeof rows / sizeof *rows); i++)
        if (!only || !strcmp(only, rows[i].strategy)) run_row(i, &rows[i]);

    if (!only || !strcmp(only, "local-sgd")) local_sgd();
    if (only) {
        tl_cleanup(g_tmp);
        return tl_finish();
    }

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
