/* Data parallel gives the model one worker would.
 *
 *   1. N = 2, 3, 4 workers (`dtrain train --workers N`) against 1 worker on
 *      the same global batch: the final parameters agree to fp32 tolerance
 *      after 50 steps, for an MLP and a CNN with dropout, with a global batch
 *      that does not divide evenly among the workers, epochs whose last
 *      batch is short (once shorter than the number of workers), and
 *      gradient accumulation.
 *   2. --deterministic: the parameters are bitwise identical for N = 1..4.
 *   3. A worker that fails makes every worker stop, with an error naming it.
 *
 * The data is a small synthetic IDX set written to a temporary directory
 * (243 training samples: with batch 40 an epoch ends in a 3-sample batch). */
#include "dtrain/ckpt.h"
#include "testlib.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char g_tmp[256];
static char g_out[1 << 16];

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

// Largest |a-b| / (max|a| + 1e-3) over all tensors of two weight files;
// -1 if they differ in names or shapes. *bitwise says whether every byte agrees.
static double compare(const char *a, const char *b, int *bitwise) {
    char pa[512], pb[512];
    snprintf(pa, sizeof pa, "%s/%s/model.safetensors", g_tmp, a);
    snprintf(pb, sizeof pb, "%s/%s/model.safetensors", g_tmp, b);
    dt_st_file *fa = NULL, *fb = NULL;
    double worst = -1;
    *bitwise = 0;
    if (dt_st_open(&fa, pa) != DT_OK || dt_st_open(&fb, pb) != DT_OK) {
        fprintf(stderr, "%s\n", dt_last_error());
        goto out;
    }
    if (dt_st_count(fa) != dt_st_count(fb)) goto out;
    worst = 0;
    *bitwise = 1;
    for (int i = 0; i < dt_st_count(fa); i++) {
        const dt_st_tensor *ta = dt_st_get(fa, i), *tb = dt_st_find(fb, ta->name);
        if (!tb || tb->nbytes != ta->nbytes) {
            worst = -1;
            goto out;
        }
        if (memcmp(ta->data, tb->data, ta->nbytes)) *bitwise = 0;
        const float *x = ta->data, *y = tb->data;
        size_t n = ta->nbytes / 4;
        double mx = 1e-3;
        for (size_t j = 0; j < n; j++) mx = fmax(mx, fabs(x[j]));
        for (size_t j = 0; j < n; j++) worst = fmax(worst, fabs(x[j] - y[j]) / mx);
    }
out:
    dt_st_close(fa);
    dt_st_close(fb);
    return worst;
}

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

int main(void) {
    snprintf(g_tmp, sizeof g_tmp, "/tmp/dtrain-test-dp-XXXXXX");
    if (!mkdtemp(g_tmp)) return perror("mkdtemp"), 1;
    tl_make_idx_split(g_tmp, "train", 243, 1);
    tl_make_idx_split(g_tmp, "t10k", 100, 2);

    // 1. same result as one worker (fp32 tolerance: only the order of the
    //    gradient sums differs).
    equivalence("mlp", cfg_mlp, NULL, 1e-4);
    equivalence("cnn", cfg_cnn, NULL, 1e-4);
    equivalence("mlp-accum", cfg_mlp, "--set train.grad_accum=4", 1e-4);
    // The model must actually have trained (not a trivially equal result).
    int bw;
    double moved = compare("mlp-1", "mlp-accum-1", &bw);
    CHECK(moved < 1e-4, "grad_accum=4 on one worker equals plain steps (%.3g)", moved);

    // 2. deterministic mode: bitwise identical for every worker count.
    for (int N = 1; N <= 4; N++) {
        char name[64];
        snprintf(name, sizeof name, "det-%d", N);
        int rc = train(name, cfg_cnn, N, "--deterministic");
        CHECK(rc == 0, "deterministic, %d workers: exit %d", N, rc);
        if (N > 1) {
            double d = compare("det-1", name, &bw);
            CHECK(bw, "deterministic: %d workers not bitwise equal to 1 (max rel diff %.3g)", N, d);
        }
    }
    double d = compare("det-1", "cnn-1", &bw);
    CHECK(d >= 0 && d < 1e-3, "deterministic run close to the normal one (%.3g)", d);

    // The same under mpirun (one worker per MPI rank), when MPI is installed.
    if (access("/usr/bin/mpirun", X_OK) == 0) {
        char cmd[2048];
        snprintf(cmd, sizeof cmd,
                 "mpirun --allow-run-as-root --oversubscribe -np 3 %s train %s/mlp-1.ini --quiet --run-dir %s/mlp-mpi",
                 tl_dtrain(), g_tmp, g_tmp);
        int rc = tl_run(cmd, g_out, sizeof g_out);
        CHECK(rc == 0, "mpirun -np 3: exit %d\n%s", rc, g_out);
        double dm = compare("mlp-1", "mlp-mpi", &bw);
        CHECK(dm >= 0 && dm <= 1e-4, "mpirun -np 3 vs 1 worker: max relative difference %.3g", dm);
    } else {
        printf("mpirun not installed: MPI data-parallel case not run\n");
    }

    // 3. a failing worker stops everyone, named in the error, no hang.
    setenv("DTRAIN_FAULT_STEP", "2:7", 1);
    double t0 = dt_now();
    int rc = train("fault", cfg_mlp, 3, NULL);
    unsetenv("DTRAIN_FAULT_STEP");
    CHECK(rc == 1, "failing worker: exit %d, expected 1", rc);
    CHECK(strstr(g_out, "rank 2, step 7") != NULL, "error names the failing rank and step:\n%s", g_out);
    CHECK(strstr(g_out, "rank 0") && strstr(g_out, "aborted"), "the other ranks report the abort:\n%s", g_out);
    CHECK(dt_now() - t0 < 60, "failure stopped the job in %.1f s", dt_now() - t0);

    // Worker count errors.
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s train configs/fashion-mlp.ini --workers 0", tl_dtrain());
    CHECK(tl_run(cmd, g_out, sizeof g_out) == 2 && strstr(g_out, "--workers"), "--workers 0: usage error\n%s", g_out);

    int failed = tl_failed;
    if (!failed && !getenv("KEEP")) {
        snprintf(cmd, sizeof cmd, "rm -rf %s", g_tmp);
        if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_tmp);
    } else {
        fprintf(stderr, "files kept in %s\n", g_tmp);
    }
    return tl_finish();
}
