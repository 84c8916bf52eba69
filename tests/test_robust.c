/* Robust aggregation, faulty updates and DP-FedAvg (docs/federated.md,
 * docs/parameter-server.md).
 *
 * 1. Every aggregator against hand-computed numbers on five updates, one
 *    of them far off (x3); the screen (NaN, Inf, norm > outlier x median).
 * 2. The RDP accountant against tests/fixtures/rdp_reference.py's values
 *    (exact binomials, 60-digit decimals).
 * 3. End to end, 10 clients a round with 2 of them attacking (f = 20%,
 *    scaled x -10): FedAvg without the screen collapses, median, trimmed
 *    mean and Krum end close to the clean run.
 * 4. Faulty numbers: a NaN client (federated) and a NaN worker (parameter
 *    servers) named in the log and summary.json and left out; an Inf in
 *    data parallel's exchanged gradient skips the step.
 * 5. DP-FedAvg: the epsilon printed each round and in summary.json is the
 *    accountant's; the noise multiplier solved for a target epsilon spends
 *    at most it.
 * 6. Bad input refused at start, naming the numbers. */
#include "engine/federated/privacy.h"
#include "engine/robust/robust.h"
#include "testlib.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char g_tmp[256];
static char g_out[1 << 16];
static const char *g_quiet = "--quiet";  // "" where a test reads the info lines

// ---- 1. the aggregators ----------------------------------------------------

static const float X[5][3] = {{1, 2, 3}, {2, 0, 5}, {3, 4, -1}, {100, -50, 2}, {4, 1, 0}};

static void combine(dt_robust_params p, const double *w, const uint8_t *bad, float *out, uint8_t *chosen) {
    const float *rows[5] = {X[0], X[1], X[2], X[3], X[4]};
    double sq[5], d2[25];
    dt_robust_stats(rows, 5, 0, 3, sq, d2);
    dt_robust_combine(&p, rows, w, 5, 3, sq, d2, bad, out, chosen);
}

#define EXPECT3(name, out, a, b, c)                                                                        \
    CHECK(fabs((out)[0] - (a)) < 1e-5 && fabs((out)[1] - (b)) < 1e-5 && fabs((out)[2] - (c)) < 1e-5,       \
          "%s: [%.7g %.7g %.7g], want [%.7g %.7g %.7g]", name, (out)[0], (out)[1], (out)[2], (double)(a), \
          (double)(b), (double)(c))

static void aggregators(void) {
    const float *rows[5] = {X[0], X[1], X[2], X[3], X[4]};
    double sq[5], d2[25];
    dt_robust_stats(rows, 5, 0, 3, sq, d2);
    CHECK(sq[3] == 12504 && d2[0 * 5 + 3] == 12506 && d2[2 * 5 + 4] == 11 && d2[4 * 5 + 2] == 11,
          "stats: sq[3] %g (12504), d2(0,3) %g (12506), d2(2,4) %g (11)", sq[3], d2[3], d2[14]);
    float out[3];
    uint8_t chosen[5];
    double w[5] = {0.1, 0.2, 0.3, 0.1, 0.3};
    combine((dt_robust_params){.kind = DT_AGG_MEAN}, NULL, NULL, out, NULL);
    EXPECT3("mean", out, 22, -8.6, 1.8);
    combine((dt_robust_params){.kind = DT_AGG_MEAN}, w, NULL, out, NULL);
    EXPECT3("weighted mean", out, 12.6, -3.3, 1.2);
    combine((dt_robust_params){.kind = DT_AGG_MEDIAN}, NULL, NULL, out, NULL);
    EXPECT3("median", out, 3, 1, 2);
    combine((dt_robust_params){.kind = DT_AGG_TRIMMED, .trim = 0.2f}, NULL, NULL, out, NULL);
    EXPECT3("trimmed 0.2 (one cut at each end)", out, 3, 1, 5.0 / 3);
    combine((dt_robust_params){.kind = DT_AGG_TRIMMED, .trim = 0.1f}, NULL, NULL, out, NULL);
    EXPECT3("trimmed 0.1 (none cut: the mean)", out, 22, -8.6, 1.8);
    // Krum, f = 1: each scored by its 5 - 1 - 2 = 2 nearest: 28, 39, 35, 23934, 30.
    combine((dt_robust_params){.kind = DT_AGG_KRUM, .krum_f = 1, .krum_m = 1}, w, NULL, out, chosen);
    EXPECT3("krum", out, 1, 2, 3);
    CHECK(chosen[0] && !chosen[1] && !chosen[2] && !chosen[3] && !chosen[4], "krum chose 0 alone");
    combine((dt_robust_params){.kind = DT_AGG_KRUM, .krum_f = 1, .krum_m = 3}, NULL, NULL, out, chosen);
    EXPECT3("multi-krum m = 3 (0, 4, 2)", out, 8.0 / 3, 7.0 / 3, 2.0 / 3);
    CHECK(chosen[0] && !chosen[1] && chosen[2] && !chosen[3] && chosen[4], "multi-krum chose 0, 2, 4");
    combine((dt_robust_params){.kind = DT_AGG_CLIP, .clip = 3}, NULL, NULL, out, NULL);
    EXPECT3("clip 3", out, 1.8548561644875694, 0.6686283545524896, 0.9312179782944435);
    combine((dt_robust_params){.kind = DT_AGG_CLIP, .clip = 3}, w, NULL, out, NULL);
    EXPECT3("clip 3, weighted", out, 1.9739398284859462, 0.9505142766296863, 0.6264823153298892);
    uint8_t bad[5] = {0, 0, 0, 1, 0};
    combine((dt_robust_params){.kind = DT_AGG_MEDIAN}, NULL, bad, out, NULL);
    EXPECT3("median without x3", out, 2.5, 1.5, 1.5);

    // The screen: median norm sqrt(26) = 5.10; x3's 111.8 is above 10 x it, not above 25 x it.
    uint8_t b[5] = {0};
    CHECK(dt_robust_screen(sq, 5, 10, b) == 1 && b[3] && !b[0] && !b[1] && !b[2] && !b[4], "screen at 10: x3 alone");
    memset(b, 0, sizeof b);
    CHECK(dt_robust_screen(sq, 5, 25, b) == 0, "screen at 25: none");
    double s2[5] = {14, NAN, 26, INFINITY, 17};
    uint8_t b2[5] = {0, 0, 0, 0, 1};  // 4 never came: not counted, not in the median
    CHECK(dt_robust_screen(s2, 5, 0, b2) == 2 && b2[1] && b2[3] && !b2[0] && !b2[2] && b2[4],
          "screen: NaN and Inf left out, with the norm rule off");
}

// ---- 2. the accountant -----------------------------------------------------

static void accountant(void) {
    // tests/fixtures/rdp_reference.py
    static const struct { double q, sigma; int alpha; double want; } r[] = {
        {0.01, 1.1, 2, 1.285100816051618e-4},
        {0.01, 1.1, 8, 5.840703355202511e-4},
        {0.1, 2.0, 16, 4.529183908362197e-2},
        {1, 1.5, 10, 2.222222222222222},  // the Gaussian mechanism: alpha / (2 sigma^2)
    };
    for (size_t i = 0; i < sizeof r / sizeof *r; i++) {
        double got = dt_rdp_sampled_gaussian(r[i].q, r[i].sigma, r[i].alpha);
        CHECK(fabs(got - r[i].want) <= 1e-9 * r[i].want, "rdp(q %g, sigma %g, alpha %d) = %.15g, want %.15g", r[i].q,
              r[i].sigma, r[i].alpha, got, r[i].want);
    }
    static const struct { double q, sigma; int T; double want; } e[] = {
        {0.1, 1.0, 50, 6.021491976835691},
        {1, 5.0, 20, 4.161911642354480},
        {256.0 / 60000, 1.1, 14063, 2.597079519656633},  // Abadi et al.'s MNIST setting: 60 epochs of batch 256
    };
    for (size_t i = 0; i < sizeof e / sizeof *e; i++) {
        double got = dt_rdp_epsilon(e[i].q, e[i].sigma, e[i].T, 1e-5, NULL);
        CHECK(fabs(got - e[i].want) <= 1e-8 * e[i].want, "epsilon(q %g, sigma %g, T %d) = %.15g, want %.15g", e[i].q,
              e[i].sigma, e[i].T, got, e[i].want);
    }
    double s = dt_rdp_noise_for(0.1, 50, 1e-5, 6.021491976835691);
    CHECK(fabs(s - 1.0) < 2e-4, "sigma for epsilon 6.0215 at q 0.1, T 50: %.6f, want 1", s);
    CHECK(isinf(dt_rdp_epsilon(0.1, 0, 10, 1e-5, NULL)), "no noise: infinite epsilon");
}

// ---- end to end ----------------------------------------------------------------

static const char *cfg_fed =
    "[model]\ninput = 784\nlayer = linear out=32\nlayer = relu\nlayer = linear out=10\n"
    "[optim]\nname = sgd\nlr = 0.05\n[train]\neval_batch = 100\nseed = 3\nthreads = 1\n"
    "[federated]\nclients = 10\nfraction = 1\nrounds = 6\nlocal_epochs = 1\nlocal_batch = 8\n";

static const char *cfg_train =
    "[model]\ninput = 784\nlayer = linear out=32\nlayer = relu\nlayer = linear out=10\n"
    "[optim]\nname = sgd\nlr = 0.05\n[train]\nbatch = 24\nepochs = 1\neval_batch = 100\nseed = 3\nthreads = 1\n";

// dtrain CMD on cfg (with [data] dir) into TMP/name, the environment's
// assignments before it; the exit code, the output in g_out.
static int run(const char *env, const char *cmd, const char *cfg, const char *name, const char *flags) {
    char path[512], line[4096];
    snprintf(path, sizeof path, "%s/%s.ini", g_tmp, name);
    FILE *f = fopen(path, "w");
    fprintf(f, "%s[data]\ndir = %s\n", cfg, g_tmp);
    fclose(f);
    snprintf(line, sizeof line, "%s %s %s %s %s --run-dir %s/%s %s 2>&1", env, tl_dtrain(), cmd, path, g_quiet, g_tmp,
             name, flags);
    return tl_run(line, g_out, sizeof g_out);
}

static double summary(const char *run, const char *key) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s/summary.json", g_tmp, run);
    return tl_json_number(path, key);
}

static void poisoned(void) {
    const char *attack = "DTRAIN_ATTACK=scale:0.2";
    int rc = run("", "federate", cfg_fed, "clean", "--workers 2");
    double clean = summary("clean", "test_accuracy");
    CHECK(rc == 0 && clean > 0.8, "clean run: exit %d, accuracy %g\n%s", rc, clean, g_out);
    rc = run(attack, "federate", cfg_fed, "fedavg", "--workers 2 --set federated.outlier=0");
    double fedavg = summary("fedavg", "test_accuracy");
    CHECK(rc == 0 && fedavg < clean - 0.3 && strstr(g_out, "2 of each round's 10 clients attack"),
          "FedAvg, 2 of 10 clients scaled x -10: exit %d, accuracy %g (clean %g): must collapse\n%s", rc, fedavg,
          clean, g_out);
    const char *aggs[] = {"median", "trimmed --set federated.trim=0.3", "krum --set federated.krum_f=2 --set federated.krum_m=4"};
    for (int i = 0; i < 3; i++) {
        char flags[256];
        snprintf(flags, sizeof flags, "--workers 2 --set federated.outlier=0 --set federated.aggregator=%s", aggs[i]);
        rc = run(attack, "federate", cfg_fed, "robust", flags);
        double acc = summary("robust", "test_accuracy");
        CHECK(rc == 0 && acc >= clean - 0.06, "%s, 2 of 10 clients scaled x -10: exit %d, accuracy %g, clean %g\n%s",
              aggs[i], rc, acc, clean, g_out);
    }
    // FedAvg with the default screen (outlier 10) leaves the scaled updates out when they are 10 x the median.
    rc = run(attack, "federate", cfg_fed, "screened", "--workers 2");
    CHECK(rc == 0 && summary("screened", "updates_left_out") > 0 && strstr(g_out, "has a norm above [federated] outlier"),
          "FedAvg with the screen: exit %d, %g left out\n%s", rc, summary("screened", "updates_left_out"), g_out);
}

static void faulty(void) {
    // A NaN client each round (1 of 10): named, counted, left out; the model stays finite and learns.
    int rc = run("DTRAIN_ATTACK=nan:0.1", "federate", cfg_fed, "fed-nan", "--workers 2");
    double acc = summary("fed-nan", "test_accuracy"), left = summary("fed-nan", "updates_left_out");
    CHECK(rc == 0 && left == 6 && acc > 0.8 && strstr(g_out, "round 1: client 0 left out: its update holds NaN or Inf"),
          "federated NaN client: exit %d, left out %g (want 6), accuracy %g\n%s", rc, left, acc, g_out);
    // Parameter servers: worker 0 of 3 pushes a NaN every step.
    rc = run("DTRAIN_ATTACK=nan:0.34", "train", cfg_train, "ps-nan", "--workers 3 --servers 2");
    char path[1024];
    snprintf(path, sizeof path, "%s/ps-nan/summary.json", g_tmp);
    char *text = tl_read_file(path, NULL);
    int steps = (int)summary("ps-nan", "steps");
    char want[64];
    snprintf(want, sizeof want, "\"left_out\":\t%d", steps);
    CHECK(rc == 0 && steps > 5 && text && strstr(text, want) && summary("ps-nan", "test_accuracy") > 0.5 &&
              strstr(g_out, "step 1: worker 0 (rank 2) left out: its gradient holds NaN or Inf"),
          "ps NaN worker: exit %d, %d steps, summary %s\n%s", rc, steps, text ? text : "(none)", g_out);
    free(text);
    // Async: each server leaves out the NaN pushes of its range.
    rc = run("DTRAIN_ATTACK=nan:0.34", "train", cfg_train, "ps-async", "--workers 3 --servers 2 --set ps.mode=async");
    steps = (int)summary("ps-async", "steps");
    CHECK(rc == 0 && summary("ps-async", "left_out") > 0 && summary("ps-async", "test_accuracy") > 0.5 &&
              strstr(g_out, "worker 0 (rank 2) left out: its gradient holds NaN or Inf"),
          "ps async NaN worker: exit %d, left out %g\n%s", rc, summary("ps-async", "left_out"), g_out);
    // Data parallel: an Inf in the exchanged gradient of step 3 on rank 1: the step is skipped by both.
    rc = run("DTRAIN_FAULT_OVERFLOW=1:3", "train", cfg_train, "dp-inf", "--workers 2");
    CHECK(rc == 0 && summary("dp-inf", "skipped_steps") == 1 &&
              strstr(g_out, "step 3: the gradient holds NaN or Inf after the gradients' exchange: the step is skipped"),
          "allreduce Inf: exit %d, skipped %g\n%s", rc, summary("dp-inf", "skipped_steps"), g_out);
    rc = run("", "train", cfg_train, "dp-clean", "--workers 2");
    CHECK(rc == 0 && summary("dp-clean", "skipped_steps") < 0, "a clean fp32 run reports no skipped_steps\n%s", g_out);
}

static void private(void) {
    g_quiet = "";
    int rc = run("", "federate", cfg_fed, "dp", "--workers 2 --set federated.dp_clip=0.5 --set federated.dp_noise=1.1");
    g_quiet = "--quiet";
    double want = dt_rdp_epsilon(1.0, 1.1, 6, 1e-5, NULL), got = summary("dp", "epsilon");
    char line[128];
    snprintf(line, sizeof line, "round 6: DP (epsilon, delta) = (%.4f, 1e-05) spent", want);
    CHECK(rc == 0 && fabs(got - want) < 1e-5 * want && strstr(g_out, line) && strstr(g_out, "round 1: DP"),
          "DP run: exit %d, epsilon %.6f, want %.6f ('%s')\n%s", rc, got, want, line, g_out);
    // Under secure aggregation: the same noise on the masked fixed-point sum (2^-24 resolution).
    rc = run("", "federate", cfg_fed, "dp-secure",
             "--workers 2 --set federated.dp_clip=0.5 --set federated.dp_noise=1.1 --set federated.secure=true");
    int bw;
    double d = tl_runs_diff(g_tmp, "dp", "dp-secure", &bw);
    CHECK(rc == 0 && d >= 0 && d < 1e-4 && fabs(summary("dp-secure", "epsilon") - want) < 1e-5 * want,
          "DP under secure aggregation: exit %d, weights within %g of the plain DP run's (want < 1e-4)\n%s", rc, d, g_out);
    // Clients without samples (Dirichlet 0.05 over 243 samples) send nothing: under secure aggregation
    // their pairs' masks are removed as a dropout's, and the run ends where a plain one does.
    const char *dir = "--workers 2 --set federated.partition=dirichlet --set federated.alpha=0.05";
    char flags[256];
    snprintf(flags, sizeof flags, "%s --set federated.secure=true", dir);
    rc = run("", "federate", cfg_fed, "dir-plain", dir);
    int rc2 = run("", "federate", cfg_fed, "dir-secure", flags);
    char path[1024];
    snprintf(path, sizeof path, "%s/dir-plain/clients.json", g_tmp);
    int empty = tl_count(path, "\"samples\":\t0,");
    d = tl_runs_diff(g_tmp, "dir-plain", "dir-secure", &bw);
    CHECK(rc == 0 && rc2 == 0 && empty > 0 && d >= 0 && d < 1e-4,
          "secure with %d clients without samples: exit %d/%d, weights within %g of plain\n%s", empty, rc, rc2, d, g_out);
    rc = run("", "federate", cfg_fed, "dp-eps", "--workers 2 --set federated.dp_clip=0.5 --set federated.dp_epsilon=4");
    got = summary("dp-eps", "epsilon");
    double sigma = summary("dp-eps", "noise_multiplier");
    CHECK(rc == 0 && got <= 4 && got > 3.99 && sigma > 0, "dp_epsilon = 4: exit %d, spent %g with sigma %g\n%s", rc,
          got, sigma, g_out);
}

// ---- 6. bad input ----------------------------------------------------------

static void bad_input(void) {
    static const struct { const char *cmd, *flags, *want1, *want2; } v[] = {
        {"federate", "--set federated.aggregator=trimmed --set federated.trim=0.5",
         "[federated] trim = 0.5", "floor(0.5 x 10) = 5 updates at each end of 10 leaves none"},
        {"federate", "--set federated.aggregator=krum --set federated.krum_f=4",
         "[federated] krum_f = 4", "more than 2 f + 2 = 10 updates a step, it has 10"},
        {"federate", "--set federated.aggregator=krum --set federated.krum_f=2 --set federated.krum_m=9",
         "[federated] krum_m = 9", "at most n - f = 10 - 2 = 8"},
        {"federate", "--set federated.aggregator=clip", "[federated] clip_bound = 0", "finite, positive"},
        {"federate", "--set federated.aggregator=median --set federated.secure=true",
         "[federated] aggregator = median: cannot combine with secure aggregation", "in the clear"},
        {"federate", "--set federated.dp_noise=1", "[federated] dp_clip = 0", "dp_noise = 1"},
        {"federate", "--set federated.dp_clip=1", "[federated] dp_clip = 1", "exactly one of dp_noise"},
        {"federate", "--set federated.dp_clip=1 --set federated.dp_noise=1 --set federated.aggregator=median",
         "[federated] aggregator = median", "use aggregator = mean"},
        {"federate", "--set federated.dp_noise=-1", "dp_noise", "expected"},
        {"federate", "--set federated.dp_clip=13 --set federated.dp_noise=1 --set federated.secure=true",
         "[federated] dp_clip = 13", "sum of the 10 clipped updates must stay within"},
        {"federate", "--set federated.dp_clip=nan", "dp_clip", "expected"},
        {"train", "--servers 1 --workers 2 --set ps.aggregator=median --set ps.mode=async",
         "[ps] aggregator = median", "mode = sync (mode is async)"},
        {"train", "--servers 1 --workers 4 --set ps.aggregator=krum", "[ps] krum_f = 1",
         "more than 2 f + 2 = 4 updates a step, it has 4"},
    };
    for (size_t i = 0; i < sizeof v / sizeof *v; i++) {
        int rc = run("", v[i].cmd, !strcmp(v[i].cmd, "train") ? cfg_train : cfg_fed, "bad", v[i].flags);
        CHECK(rc == 2 && strstr(g_out, v[i].want1) && strstr(g_out, v[i].want2), "%s: exit %d (want 2) naming '%s', '%s':\n%s",
              v[i].flags, rc, v[i].want1, v[i].want2, g_out);
    }
    int rc = run("DTRAIN_ATTACK=flip:0.2", "federate", cfg_fed, "bad", "--workers 2");
    CHECK(rc != 0 && strstr(g_out, "DTRAIN_ATTACK: expected KIND:FRACTION"), "DTRAIN_ATTACK=flip:0.2: exit %d\n%s",
          rc, g_out);
}

int main(int argc, char **argv) {
    snprintf(g_tmp, sizeof g_tmp, "/tmp/dtrain-test-robust-XXXXXX");
    if (!mkdtemp(g_tmp)) return perror("mkdtemp"), 1;
    tl_make_images(g_tmp, "train", 243, 1);
    tl_make_images(g_tmp, "t10k", 100, 2);
    const char *only = argc > 1 ? argv[1] : NULL;
    if (!only || !strcmp(only, "units")) aggregators(), accountant();
    if (!only || !strcmp(only, "poisoned")) poisoned();
    if (!only || !strcmp(only, "faulty")) faulty();
    if (!only || !strcmp(only, "private")) private();
    if (!only || !strcmp(only, "bad")) bad_input();
    tl_cleanup(g_tmp);
    return tl_finish();
}
