/* Federated averaging (dtrain federate, docs/federated.md).
 *
 * 1. Partitions: iid, shards and Dirichlet(alpha) give the promised label
 *    statistics; clients.json holds every client's histogram, and the
 *    report draws them.
 * 2. One client, one local epoch, its whole data as one batch, plain SGD:
 *    FedAvg is plain training on that data.
 * 3. 2 and 3 workers give the bitwise result of one (int64 sums), plain,
 *    with FedAdam and with secure aggregation; so do 2 ranks under mpirun.
 * 4. FedAvgM, FedAdam and FedProx train; mu shrinks the clients' updates.
 * 5. Dropouts: a failed client and one past the deadline are left out
 *    alike; too few reports leave the model unchanged (min_clients).
 * 6. Secure aggregation: one client's masked update is uncorrelated with
 *    its update, the sum is exact, with and without dropped clients; a
 *    secure run ends where a plain one does.
 * 7. Bad config and fault variables refused by name. */
#include "engine/federated/fedparts.h"
#include "testlib.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char g_tmp[256];
static char g_out[1 << 16];

static const char *cfg_base =
    "[model]\ninput = 784\nlayer = linear out=32\nlayer = relu\nlayer = linear out=10\n"
    "[optim]\nname = sgd\nlr = 0.05\n[train]\neval_batch = 100\nseed = 3\nthreads = 1\n"
    "[federated]\nclients = 10\nfraction = 0.5\nrounds = 4\nlocal_epochs = 2\nlocal_batch = 8\n";

// Runs `dtrain CMD` on cfg (with [data] dir added) and flags; exit code.
static int run(const char *cmd, const char *name, const char *cfg, int N, const char *flags) {
    char path[512], line[4096];
    snprintf(path, sizeof path, "%s/%s.ini", g_tmp, name);
    FILE *f = fopen(path, "w");
    fprintf(f, "%s[data]\ndir = %s\n", cfg, g_tmp);
    fclose(f);
    snprintf(line, sizeof line, "%s %s %s --workers %d --quiet --run-dir %s/%s %s 2>&1", tl_dtrain(), cmd, path, N,
             g_tmp, name, flags ? flags : "");
    return tl_run(line, g_out, sizeof g_out);
}

static int fed(const char *name, int N, const char *flags) { return run("federate", name, cfg_base, N, flags); }

static double diff(const char *a, const char *b, int *bitwise) {
    char pa[1024], pb[1024];
    snprintf(pa, sizeof pa, "%s/%s/model.safetensors", g_tmp, a);
    snprintf(pb, sizeof pb, "%s/%s/model.safetensors", g_tmp, b);
    return tl_weights_diff(pa, pb, bitwise);
}

// A number of RUN/summary.json.
static double summary(const char *run, const char *key) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s/summary.json", g_tmp, run);
    return tl_json_number(path, key);
}
// The grad_norm (the server's mean update) of round `round` in rank 0's metrics log.
static double round_norm(const char *run, int round) {
    char path[1024], pat[64];
    snprintf(path, sizeof path, "%s/%s/metrics/rank-00000.jsonl", g_tmp, run);
    snprintf(pat, sizeof pat, "\"type\":\"step\",\"step\":%d,", round);
    char *text = tl_read_file(path, NULL);
    const char *p = text ? strstr(text, pat) : NULL, *v = p ? strstr(p, "\"grad_norm\":") : NULL;
    double x = v ? atof(v + 12) : -1;
    free(text);
    return x;
}

// ---- 1. partitions ---------------------------------------------------------

typedef struct {
    double max_frac;     // mean over clients of the largest class's fraction
    double classes;      // mean number of classes a client has
    int most_classes;    // the most any client has
    int min_n, max_n;    // client sizes
    int covered;         // every sample exactly once
} pstats;

static pstats part_stats(const char *partition, int C, double alpha, int shards, const int32_t *y, int n) {
    dt_config c;
    dt_config_defaults(&c);
    c.fed_clients = C;
    c.fed_partition = !strcmp(partition, "iid") ? 0 : !strcmp(partition, "shards") ? 1 : 2;
    c.fed_alpha = (float)alpha;
    c.fed_shards = shards;
    c.seed = 7;
    uint32_t *idx;
    int *start;
    pstats s = {0, 0, 0, n, 0, 1};
    if (dt_fed_partition(&c, y, n, 10, &idx, &start) != DT_OK) {
        CHECK(0, "%s partition: %s", partition, dt_last_error());
        s.covered = 0;
        return s;
    }
    int *seen = calloc((size_t)n, sizeof(int));
    for (int k = 0; k < C; k++) {
        int h[10] = {0}, nk = start[k + 1] - start[k], mx = 0, nc = 0;
        for (int i = start[k]; i < start[k + 1]; i++) h[y[idx[i]]]++, seen[idx[i]]++;
        for (int j = 0; j < 10; j++) mx = h[j] > mx ? h[j] : mx, nc += h[j] > 0;
        s.max_frac += nk ? (double)mx / nk / C : 1.0 / C;
        s.classes += (double)nc / C;
        s.most_classes = nc > s.most_classes ? nc : s.most_classes;
        s.min_n = nk < s.min_n ? nk : s.min_n;
        s.max_n = nk > s.max_n ? nk : s.max_n;
    }
    for (int i = 0; i < n; i++) s.covered &= seen[i] == 1;
    free(seen);
    free(idx);
    free(start);
    return s;
}

static void partitions(void) {
    int n = 6000;
    int32_t *y = malloc(sizeof(int32_t) * n);
    dt_rng r;
    dt_rng_seed(&r, 11);
    for (int i = 0; i < n; i++) y[i] = (int32_t)dt_rng_below(&r, 10);
    pstats iid = part_stats("iid", 100, 0, 0, y, n);
    CHECK(iid.covered && iid.min_n == 60 && iid.max_n == 60, "iid: 100 clients of 60 (%d..%d)", iid.min_n, iid.max_n);
    CHECK(iid.max_frac < 0.3 && iid.classes > 9, "iid: near the global mix (largest class %.2f, %.1f classes)",
          iid.max_frac, iid.classes);
    pstats sh = part_stats("shards", 100, 0, 2, y, n);
    CHECK(sh.covered && sh.min_n == 60 && sh.max_n == 60, "shards: 100 clients of 2 x 30 (%d..%d)", sh.min_n, sh.max_n);
    // A shard of the label-sorted samples straddles at most one label boundary.
    CHECK(sh.classes <= 2.6 && sh.most_classes <= 4, "shards: about 2 classes per client (mean %.2f, most %d)",
          sh.classes, sh.most_classes);
    pstats d01 = part_stats("dirichlet", 100, 0.1, 0, y, n), d05 = part_stats("dirichlet", 100, 0.5, 0, y, n);
    pstats d100 = part_stats("dirichlet", 100, 100, 0, y, n);
    CHECK(d01.covered && d05.covered && d100.covered, "dirichlet: every sample to one client");
    CHECK(d01.max_frac > 0.6 && d01.max_frac > d05.max_frac && d05.max_frac > d100.max_frac && d100.max_frac < 0.3,
          "dirichlet: label skew falls with alpha (largest class %.2f at 0.1, %.2f at 0.5, %.2f at 100)", d01.max_frac,
          d05.max_frac, d100.max_frac);
    printf("partitions of 6000 samples over 100 clients: largest class fraction iid %.2f, shards %.2f (%.2f classes), "
           "dirichlet 0.1 %.2f, 0.5 %.2f, 100 %.2f\n",
           iid.max_frac, sh.max_frac, sh.classes, d01.max_frac, d05.max_frac, d100.max_frac);
    free(y);

    // clients.json: histograms that add up to each client's count, and to the set.
    CHECK(fed("part", 1, "--set federated.partition=shards --set federated.rounds=1") == 0, "shards run: %s", g_out);
    char path[1024];
    snprintf(path, sizeof path, "%s/part/clients.json", g_tmp);
    char *text = tl_read_file(path, NULL);
    CHECK(text && strstr(text, "\"partition\":\t\"shards\""), "clients.json names the partition");
    int total = 0, clients = 0, ok = 1;
    for (const char *p = text; p && (p = strstr(p, "\"samples\":")); clients++) {
        int ns = atoi(p + 10), sum = 0;
        const char *h = strchr(strstr(p, "\"histogram\":"), '[') + 1;
        for (int j = 0; j < 10; j++) {
            sum += atoi(h);
            h = strpbrk(h, ",]") + 1;
        }
        ok &= sum == ns;
        total += ns;
        p = h;
    }
    CHECK(clients == 10 && total == 243 && ok, "clients.json: 10 histograms of 243 samples in all (%d, %d, %d)",
          clients, total, ok);
    free(text);
    // Strong skew leaves some clients empty: they train nothing and weigh 0.
    CHECK(fed("empty", 2, "--set federated.partition=dirichlet --set federated.alpha=0.02 --set federated.clients=40 --set federated.fraction=1 "
                          "--set federated.rounds=2") == 0,
          "dirichlet 0.02: %s", g_out);
    snprintf(path, sizeof path, "%s/empty/clients.json", g_tmp);
    CHECK(tl_count(path, "\"samples\":\t0") >= 1, "dirichlet 0.02 over 40 clients leaves one empty");
    CHECK(summary("empty", "test_accuracy") > 0.3, "with empty clients the model still trains (%.3f)",
          summary("empty", "test_accuracy"));
    // The report draws them: a bar per client, stacked by class.
    char cmd[2048], html[1100];
    snprintf(html, sizeof html, "%s/part/report.html", g_tmp);
    snprintf(cmd, sizeof cmd, "%s report %s/part -o %s", tl_dtrain(), g_tmp, html);
    CHECK(tl_run(cmd, g_out, sizeof g_out) == 0, "report of a federated run: %s", g_out);
    CHECK(tl_count(html, "id=\"clients\"") == 1 && tl_count(html, "<title>client 9 class") >= 1 &&
              tl_count(html, "(partition shards)") >= 1,
          "the report has the clients chart");
    // Its step records are rounds: the charts' x axis says so.
    CHECK(tl_count(html, "class=\"al\" text-anchor=\"middle\">round</text>") >= 3 &&
              tl_count(html, ">step</text>") == 0 && tl_count(html, "rounds logged") == 1,
          "the report's x axis counts rounds");
}

// ---- 2. one client is plain training ------------------------------------------

static void one_client(void) {
    const char *fl = "--set federated.clients=1 --set federated.fraction=1 --set federated.local_epochs=1 "
                     "--set federated.local_batch=243 --set federated.rounds=6";
    CHECK(fed("one", 1, fl) == 0, "one client: %s", g_out);
    CHECK(run("train", "plain", cfg_base, 1, "--set train.batch=243 --set train.epochs=6") == 0, "plain: %s", g_out);
    int bw;
    double d = diff("one", "plain", &bw);
    CHECK(d >= 0 && d < 1e-5, "one client, E = 1, full batch: plain training within %.3g (1e-5)", d);
    printf("FedAvg of 1 client (E = 1, B = all) vs plain full-batch training, 6 rounds: max rel diff %.3g\n", d);
}

// ---- 3. workers ----------------------------------------------------------------

static void workers(void) {
    static const struct { const char *name, *flags; } v[] = {
        {"w-avg", ""},
        {"w-adam", "--set federated.algorithm=fedadam --set federated.server_lr=0.01"},
        {"w-sec", "--set federated.secure=true --set federated.mu=0.1"},
    };
    for (int i = 0; i < 3; i++) {
        char n1[64];
        snprintf(n1, sizeof n1, "%s-1", v[i].name);
        CHECK(fed(n1, 1, v[i].flags) == 0, "%s, 1 worker: %s", v[i].name, g_out);
        for (int N = 2; N <= 3; N++) {
            char nn[64];
            snprintf(nn, sizeof nn, "%s-%d", v[i].name, N);
            CHECK(fed(nn, N, v[i].flags) == 0, "%s, %d workers: %s", v[i].name, N, g_out);
            int bw;
            double d = diff(n1, nn, &bw);
            CHECK(bw, "%s: %d workers are bitwise 1 worker (max rel diff %.3g)", v[i].name, N, d);
        }
    }
    CHECK(summary("w-avg-2", "bytes_sent_per_round") > 0, "2 workers: bytes per round in summary.json");
    // Across hosts: the ranks of an MPI job are the workers.
    if (access("/usr/bin/mpirun", X_OK) != 0) {
        CHECK(0, "mpirun is not installed (scripts/install-deps.sh installs it)");
        return;
    }
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "mpirun --allow-run-as-root --oversubscribe -np 2 %s federate %s/w-avg-1.ini --quiet "
             "--run-dir %s/w-mpi 2>&1", tl_dtrain(), g_tmp, g_tmp);
    CHECK(tl_run(cmd, g_out, sizeof g_out) == 0, "federate under mpirun: %s", g_out);
    int bw;
    double d = diff("w-avg-1", "w-mpi", &bw);
    CHECK(bw, "2 MPI ranks are bitwise 1 worker (%.3g)", d);
}

// ---- 4. server and client algorithms --------------------------------------------

static void algorithms(void) {
    const char *more = "--set federated.rounds=8 ";
    char fl[512];
    double acc[4];
    const char *names[] = {"a-avg", "a-avgm", "a-adam", "a-prox"};
    const char *flags[] = {"", "--set federated.algorithm=fedavgm --set federated.server_momentum=0.5",
                           "--set federated.algorithm=fedadam --set federated.server_lr=0.01",
                           "--set federated.mu=2"};
    for (int i = 0; i < 4; i++) {
        snprintf(fl, sizeof fl, "%s%s", more, flags[i]);
        CHECK(fed(names[i], 1, fl) == 0, "%s: %s", names[i], g_out);
        acc[i] = summary(names[i], "test_accuracy");
        CHECK(acc[i] > 0.8, "%s trains: test accuracy %.3f", names[i], acc[i]);
    }
    int bw;
    double dm = diff("a-avg", "a-avgm", &bw);
    CHECK(!bw && dm > 0, "fedavgm's server momentum changes the model (max rel diff %.3g)", dm);
    // FedProx: the proximal term pulls a client back to the global model,
    // so round 1's mean update is shorter.
    double n0 = round_norm("a-avg", 1), n1 = round_norm("a-prox", 1);
    CHECK(n0 > 0 && n1 > 0 && n1 < 0.9 * n0, "FedProx mu = 2 shrinks round 1's update: %.4f against %.4f", n1, n0);
    printf("8 rounds, 5 of 10 iid clients: test accuracy fedavg %.3f, fedavgm %.3f, fedadam %.3f, fedprox %.3f; "
           "round-1 update norm %.4f, with mu 2 %.4f\n",
           acc[0], acc[1], acc[2], acc[3], n0, n1);
}

// ---- 5. dropouts ---------------------------------------------------------------

static void dropouts(void) {
    const char *fl = "--set federated.clients=4 --set federated.fraction=1 --set federated.rounds=2";
    char f2[512];
    CHECK(fed("d-all", 2, fl) == 0, "no dropout: %s", g_out);
    setenv("DTRAIN_FED_FAIL", "1:2", 1);
    CHECK(fed("d-fail", 2, fl) == 0, "client 2 fails in round 1: %s", g_out);
    unsetenv("DTRAIN_FED_FAIL");
    // (a deadline far above a client's few milliseconds of work, so that a
    // loaded or sanitized build does not drop the others too)
    setenv("DTRAIN_FED_DELAY", "1:2:8", 1);
    snprintf(f2, sizeof f2, "%s --set federated.deadline=5", fl);
    CHECK(fed("d-late", 2, f2) == 0, "client 2 misses the deadline in round 1: %s", g_out);
    unsetenv("DTRAIN_FED_DELAY");
    int bw;
    double d = diff("d-fail", "d-late", &bw);
    CHECK(bw, "a failed client and a late one are left out alike (%.3g)", d);
    d = diff("d-all", "d-fail", &bw);
    CHECK(!bw && d > 1e-4, "leaving a client out changes the round (%.3g)", d);
    // The same dropout under secure aggregation: its masks are removed.
    setenv("DTRAIN_FED_FAIL", "1:2", 1);
    snprintf(f2, sizeof f2, "%s --set federated.secure=true", fl);
    CHECK(fed("d-sec", 3, f2) == 0, "secure aggregation with a dropout: %s", g_out);
    d = diff("d-fail", "d-sec", &bw);
    CHECK(d >= 0 && d < 1e-4, "secure aggregation with a dropped client ends where the plain sum does (%.3g)", d);
    // Three of four fail with min_clients = 2: the round leaves the model unchanged.
    setenv("DTRAIN_FED_FAIL", "1:0,1:1,1:3", 1);
    snprintf(f2, sizeof f2, "%s --set federated.min_clients=2 --set federated.rounds=1", fl);
    CHECK(fed("d-few", 2, f2) == 0, "too few clients: %s", g_out);
    unsetenv("DTRAIN_FED_FAIL");
    CHECK(summary("d-few", "rounds_skipped") == 1, "the round is skipped (rounds_skipped %g)",
          summary("d-few", "rounds_skipped"));
    CHECK(fed("d-init", 1, "--set federated.clients=4 --set federated.fraction=1 --set federated.rounds=1 "
                           "--set optim.lr=1e-12") == 0,
          "a run that barely moves: %s", g_out);
    d = diff("d-few", "d-init", &bw);
    CHECK(d >= 0 && d < 1e-6, "the skipped round left the initial model (%.3g)", d);
    // A client whose local training diverges (its loss no longer finite:
    // here client 0's, at lr 1000) is a failed client: left out, named, and
    // the run goes on, bitwise as when the same client is made to fail; so
    // are clients whose update is too large for the fixed-point sum (the
    // others, at that rate).
    const char *hot = "--set federated.clients=4 --set federated.fraction=1 --set federated.rounds=1 "
                      "--set optim.lr=1000 --set federated.local_epochs=5";
    CHECK(fed("d-nan", 2, hot) == 0 && strstr(g_out, "client 0 left out") && strstr(g_out, "loss is NaN") &&
              strstr(g_out, "too large to sum"),
          "a diverging client is left out, not the end of the run: %s", g_out);
    setenv("DTRAIN_FED_FAIL", "1:0", 1);
    CHECK(fed("d-nan-fail", 2, hot) == 0, "the same client failing: %s", g_out);
    unsetenv("DTRAIN_FED_FAIL");
    d = diff("d-nan", "d-nan-fail", &bw);
    CHECK(bw, "a diverged client and a failed one are left out alike (%.3g)", d);
    printf("dropouts: failed == late (bitwise), secure with a dropout vs plain %.3g, min_clients skips a round\n",
           diff("d-fail", "d-sec", &bw));
}

// ---- 6. secure aggregation ----------------------------------------------------

static double corr(const double *a, const double *b, int n) {
    double ma = 0, mb = 0, sab = 0, saa = 0, sbb = 0;
    for (int i = 0; i < n; i++) ma += a[i] / n, mb += b[i] / n;
    for (int i = 0; i < n; i++) {
        sab += (a[i] - ma) * (b[i] - mb);
        saa += (a[i] - ma) * (a[i] - ma);
        sbb += (b[i] - mb) * (b[i] - mb);
    }
    return sab / sqrt(saa * sbb);
}

static void secure(void) {
    enum { N = 20000, M = 5 };
    int clients[M] = {3, 8, 17, 40, 41};
    double w[M] = {0.1, 0.3, 0.2, 0.25, 0.15};
    float *x = malloc(sizeof(float) * N * M);
    uint32_t *masked = malloc(sizeof(uint32_t) * N), *sum = calloc(N, sizeof(uint32_t));
    uint32_t *plain = calloc(N, sizeof(uint32_t)), *alone = malloc(sizeof(uint32_t) * N);
    uint32_t *surv_sum = calloc(N, sizeof(uint32_t)), *surv_plain = calloc(N, sizeof(uint32_t));
    double *a = malloc(sizeof(double) * N), *b = malloc(sizeof(double) * N);
    dt_rng r;
    dt_rng_seed(&r, 5);
    for (int i = 0; i < N * M; i++) x[i] = dt_rng_normal(&r) * 0.01f + (i % N < N / 2 ? 0.02f : -0.02f);
    uint64_t key = 0x1234;
    double worst_corr = 0;
    for (int j = 0; j < M; j++) {
        dt_secagg_mask(masked, x + (size_t)j * N, N, w[j], clients[j], clients, M, key);
        dt_secagg_mask(alone, x + (size_t)j * N, N, w[j], clients[j], clients + j, 1, key);  // no other client: no mask
        for (int i = 0; i < N; i++) {
            sum[i] += masked[i];
            plain[i] += alone[i];
            if (j != 2) surv_sum[i] += masked[i], surv_plain[i] += alone[i];  // client 17 drops
            a[i] = (double)(int32_t)masked[i];
            b[i] = x[(size_t)j * N + i];
        }
        double cm = fabs(corr(a, b, N));
        for (int i = 0; i < N; i++) a[i] = (double)(int32_t)alone[i];
        double cp = corr(a, b, N);
        CHECK(cm < 0.03, "client %d: masked update uncorrelated with its update (|r| = %.4f)", clients[j], cm);
        CHECK(cp > 0.99, "client %d: its unmasked fixed-point update correlates (r = %.4f)", clients[j], cp);
        worst_corr = cm > worst_corr ? cm : worst_corr;
    }
    CHECK(!memcmp(sum, plain, sizeof(uint32_t) * N), "the masked sum is exactly the sum of the updates");
    int surv[M - 1] = {3, 8, 40, 41}, dropped[1] = {17};
    CHECK(memcmp(surv_sum, surv_plain, sizeof(uint32_t) * N), "without unmasking, a dropout leaves masks in the sum");
    dt_secagg_unmask(surv_sum, N, surv, M - 1, dropped, 1, key);
    CHECK(!memcmp(surv_sum, surv_plain, sizeof(uint32_t) * N), "after unmasking, the survivors' sum is exact");
    float *dec = malloc(sizeof(float) * N);
    dt_secagg_decode(plain, dec, N);
    double err = 0;
    for (int i = 0; i < N; i++) {
        double want = 0;
        for (int j = 0; j < M; j++) want += w[j] * x[(size_t)j * N + i];
        err = fmax(err, fabs(dec[i] - want));
    }
    CHECK(err < 4e-6, "decoded sum within fixed-point rounding of the weighted sum (%.3g)", err);
    printf("secure aggregation, 5 clients x 20000 values: |corr(masked, update)| <= %.4f, sum exact, "
           "dropout unmasked exactly, decode error %.2g\n", worst_corr, err);
    free(x), free(masked), free(sum), free(plain), free(alone), free(surv_sum), free(surv_plain), free(a), free(b);
    free(dec);

    // End to end: a secure run ends where a plain one does.
    CHECK(fed("s-sec", 2, "--set federated.secure=true") == 0, "secure run: %s", g_out);
    CHECK(fed("s-plain", 2, "") == 0, "plain run: %s", g_out);
    int bw;
    double d = diff("s-sec", "s-plain", &bw);
    CHECK(d >= 0 && d < 1e-4, "secure vs plain aggregation: %.3g", d);
}

// ---- 7. bad input --------------------------------------------------------------

static void bad_input(void) {
    static const struct { const char *flags, *env, *want1, *want2; int rc; } v[] = {
        {"--set federated.min_clients=6", NULL, "[federated] min_clients = 6", "5 clients sampled", 2},
        {"--set federated.clients=300 --set federated.fraction=0.01", NULL, "[federated] clients = 300", "243", 1},
        {"--set federated.partition=zipf", NULL, "federated", "partition", 2},
        {"--set federated.fraction=0", NULL, "[federated] fraction", "expected", 2},
        {"--set federated.partition=shards --set federated.shards=30", NULL, "[federated] shards = 30", "243", 1},
        {"--set parallel.sync_every=2", NULL, "[parallel] sync_every", "dtrain train", 2},
        {"--set checkpoint.every_steps=5", NULL, "[checkpoint]", "federate", 2},
        // dtrain train's settings: refused by name, never ignored
        {"--servers 1", NULL, "[parallel] servers", "not to dtrain federate", 2},
        {"--zero 2", NULL, "[parallel] zero", "not to dtrain federate", 2},
        {"--set parallel.tensor=2", NULL, "[parallel] tensor", "not to dtrain federate", 2},
        {"--set parallel.pipeline=2", NULL, "[parallel] pipeline", "not to dtrain federate", 2},
        {"--set compression.method=qsgd", NULL, "[compression] method", "not to dtrain federate", 2},
        {"--set train.max_steps=3", NULL, "[train] max_steps", "not to dtrain federate", 2},
        {"", "1:x", "DTRAIN_FED_FAIL", "ROUND:CLIENT", 1},
        {"", "0:1", "DTRAIN_FED_FAIL", "R >= 1", 1},
    };
    for (size_t i = 0; i < sizeof v / sizeof *v; i++) {
        if (v[i].env) setenv("DTRAIN_FED_FAIL", v[i].env, 1);
        int rc = fed("bad", 2, v[i].flags);
        unsetenv("DTRAIN_FED_FAIL");
        CHECK(rc == v[i].rc && strstr(g_out, v[i].want1) && strstr(g_out, v[i].want2),
              "%s %s: exit %d (want %d) naming '%s', '%s':\n%s", v[i].flags, v[i].env ? v[i].env : "", rc, v[i].rc,
              v[i].want1, v[i].want2, g_out);
    }
    CHECK(fed("bad", 2, "--max-restarts 2") == 2 && strstr(g_out, "--max-restarts"), "--max-restarts refused:\n%s", g_out);
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s federate --help", tl_dtrain());
    CHECK(tl_run(cmd, g_out, sizeof g_out) == 0 && strstr(g_out, "clients.json") && strstr(g_out, "[federated]"),
          "federate --help\n%s", g_out);
}

int main(void) {
    snprintf(g_tmp, sizeof g_tmp, "/tmp/dtrain-test-federated-XXXXXX");
    if (!mkdtemp(g_tmp)) return perror("mkdtemp"), 1;
    tl_make_images(g_tmp, "train", 243, 1);
    tl_make_images(g_tmp, "t10k", 100, 2);
    partitions();
    one_client();
    workers();
    algorithms();
    dropouts();
    secure();
    bad_input();
    tl_cleanup(g_tmp);
    return tl_finish();
}
