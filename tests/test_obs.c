/* Observability: what a run writes besides its model.
 *
 *   1. straggler detection on made-up timings (median, margin, consecutive
 *      steps, the slow phase, one report per episode);
 *   2. the communicator's byte counters on a world of 1 (nothing moves);
 *   3. a 2-worker run with an injected slow rank (DTRAIN_SLOW_RANK), a
 *      trace and JSON progress: every rank's metrics log has one valid
 *      record per step with every field, bytes as a ring allreduce moves
 *      them, an evaluation record; rank 0 warns about the slow rank naming
 *      the phase and logs it; the trace is one valid JSON document with a
 *      process track per rank and spans per phase and per collective;
 *   4. dtrain report on that run, and on bad input (missing directory,
 *      malformed log line), a metrics port already in use, bad flags;
 *   5. the metrics endpoint under 100 idle and 100 slow (a byte a second)
 *      connections: each scrape still answers 200 with the page within
 *      1 s; a request sent in pieces is answered; 400 for a NUL byte in
 *      each part of a request and for a malformed request line, 404, 405,
 *      HEAD; 408 for every idle and slow connection after 10 s; stopping
 *      with connections open;
 *   6. the scaling simulator: its alpha-beta arithmetic on made-up profiles
 *      (ring, halving-doubling and tree between hosts, shm inside, overlap
 *      with backward, ZeRO, weak and strong scaling), its profile from the
 *      2-worker run, `dtrain simulate` on it (table, HTML chart) and on bad
 *      flags; GPU hosts (NVLink inside, a NIC a GPU) against the formulas,
 *      16-bit gradients, a bigger model's profile, a device run's profile
 *      (made up, and the MLP's on the simulated GPU), a model without a
 *      run, their refusals. */
#include "dtrain/comm.h"
#include "dtrain/train.h"
#include "obs/prom.h"
#include "obs/straggler.h"
#include "testlib.h"

#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <cjson/cJSON.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define STEPS 12

static char g_tmp[256];
static char g_out[1 << 17];

// The progress line: steps and epochs; federated averaging's rounds.
static void test_progress_line(void) {
    char buf[256];
    dt_progress p = {.step = 5, .total_steps = 100, .epoch = 1, .epochs = 2, .loss = 0.5f, .lr = 0.1f,
                     .samples_per_sec = 10, .workers = 1, .slowest_stage = -1};
    dt_progress_format(&p, buf, sizeof buf);
    CHECK(!strncmp(buf, "step 5/100 | epoch 1/2 | loss 0.5000", 36), "progress line: %s", buf);
    p.rounds = 1;
    p.epoch = 5, p.epochs = 100;
    dt_progress_format(&p, buf, sizeof buf);
    CHECK(!strncmp(buf, "round 5/100 | loss 0.5000", 25) && !strstr(buf, "epoch"), "federated progress line: %s", buf);
    p.is_eval = 1, p.eval_loss = 0.4f, p.eval_accuracy = 0.9f;
    dt_progress_format(&p, buf, sizeof buf);
    CHECK(!strncmp(buf, "round 5/100 done", 16), "federated evaluation line: %s", buf);
}

static void test_straggler(void) {
    // 4 ranks; rank 2 is 50% slower, in its backward phase (index 2).
    dt_straggler *s = dt_straggler_create(4, 0.2, 3);
    dt_straggler_report rep[4];
    double busy[4], ph[4 * 4];
    int reports = 0, at = -1;
    for (int step = 1; step <= 8; step++) {
        for (int r = 0; r < 4; r++) {
            for (int p = 0; p < 4; p++) ph[r * 4 + p] = 0.010 + 0.001 * p;
            if (r == 2 && step != 2) ph[r * 4 + 2] += 0.030;  // one fast step restarts the count
            busy[r] = ph[r * 4] + ph[r * 4 + 1] + ph[r * 4 + 2] + ph[r * 4 + 3];
        }
        int n = dt_straggler_update(s, busy, ph, 4, rep);
        if (n) {
            reports += n;
            at = step;
            CHECK(rep[0].rank == 2 && rep[0].phase == 2, "straggler: rank %d phase %d, want rank 2 phase 2",
                  rep[0].rank, rep[0].phase);
            CHECK(rep[0].excess > 0.029 && rep[0].excess < 0.031, "straggler: excess %.4f", rep[0].excess);
        }
    }
    CHECK(reports == 1 && at == 5, "straggler: %d reports, last at step %d (want 1 at step 5)", reports, at);
    CHECK(dt_straggler_flagged(s, 2) && !dt_straggler_flagged(s, 0), "straggler: flags");
    // A rank that flips in and out (a shared machine): reported each time,
    // warned of once every DT_STRAGGLER_QUIET steps.
    {
        dt_straggler *f = dt_straggler_create(4, 0.2, 1);
        int shown = 0, total = 0;
        for (int t = 0; t < 3 * DT_STRAGGLER_QUIET; t++) {
            double b[4] = {0.1, 0.1, t % 2 ? 0.2 : 0.1, 0.1}, p4[16] = {0};
            int n = dt_straggler_update(f, b, p4, 4, rep);
            total += n;
            shown += n && rep[0].loud;
        }
        int loud, counted = dt_straggler_reports(f, 2, &loud);
        CHECK(total == 3 * DT_STRAGGLER_QUIET / 2 && counted == total && shown == 3 && loud == 3,
              "straggler flipping every step: %d reports (%d counted), %d loud (want %d, 3)", total, counted, shown,
              3 * DT_STRAGGLER_QUIET / 2);
        dt_straggler_free(f);
    }
    // Back under the margin: the flag clears, and a new episode is reported again.
    for (int r = 0; r < 4; r++) busy[r] = 0.05;
    dt_straggler_update(s, busy, ph, 4, rep);
    CHECK(!dt_straggler_flagged(s, 2), "straggler: flag cleared");
    dt_straggler_free(s);
    // One rank, or steps = 0: never.
    s = dt_straggler_create(1, 0.2, 1);
    busy[0] = 1;
    CHECK(dt_straggler_update(s, busy, ph, 4, rep) == 0, "straggler: one rank");
    dt_straggler_free(s);
    double v[] = {5, 1, 4, 2};
    CHECK(dt_median(v, 4) == 3 && dt_median(v, 3) == 2, "median");
}

static void test_comm_stats(void) {
    dt_comm_t c;
    CHECK(dt_comm_init_env(&c) == DT_OK, "comm init: %s", dt_last_error());
    float x[100] = {0};
    dt_allreduce(x, x, 100, DT_F32, DT_SUM, c);
    dt_comm_stats s;
    dt_comm_get_stats(c, &s);
    CHECK(s.ops == 1 && s.bytes_sent == 0 && s.bytes_recv == 0, "world of 1: %llu ops, %llu/%llu bytes",
          (unsigned long long)s.ops, (unsigned long long)s.bytes_sent, (unsigned long long)s.bytes_recv);
    dt_comm_destroy(c);
}

static double num(const cJSON *j, const char *k) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(j, k);
    return cJSON_IsNumber(x) ? x->valuedouble : -1;
}

static const char *const step_keys[] = {
    "step", "epoch", "time", "loss", "lr", "grad_norm", "samples", "share", "samples_per_sec", "step_seconds",
    "data_seconds", "forward_seconds", "backward_seconds", "comm_exposed_seconds", "comm_hidden_seconds",
    "optimizer_seconds", "bytes_sent", "bytes_recv", "peak_rss_bytes"};

// Checks one rank's metrics log; returns its straggler records' ranks (bitmask).
static int check_log(int rank, double params) {
    char path[512];
    snprintf(path, sizeof path, "%s/run/metrics/rank-%05d.jsonl", g_tmp, rank);
    FILE *f = fopen(path, "r");
    CHECK(f != NULL, "%s missing", path);
    if (!f) return 0;
    char line[8192];
    int steps = 0, evals = 0, bad = 0, strag = 0, missing = 0, bytes_ok = 0;
    while (fgets(line, sizeof line, f)) {
        cJSON *j = cJSON_Parse(line);
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "type");
        if (!cJSON_IsString(t)) {
            bad++;
        } else if (!strcmp(t->valuestring, "step")) {
            steps++;
            for (size_t k = 0; k < sizeof step_keys / sizeof step_keys[0]; k++)
                if (num(j, step_keys[k]) < 0) missing++;
            // A ring allreduce of the gradients (2 ranks: S each way) plus
            // the allgather of the loss and the step's figures (19 doubles).
            if (num(j, "step") >= 2 && num(j, "bytes_sent") == params * 4 + 152 && num(j, "bytes_recv") == params * 4 + 152)
                bytes_ok++;
            // Model state by kind: replicated SGD (zero = 0, no state).
            const cJSON *mb = cJSON_GetObjectItemCaseSensitive(j, "memory_bytes");
            if (num(mb, "weights") != params * 4 || num(mb, "gradients") != params * 4 || num(mb, "comm_buffers") != 0 ||
                !(num(mb, "activations") > 0))
                missing++;
        } else if (!strcmp(t->valuestring, "eval")) {
            evals++;
            CHECK(num(j, "accuracy") >= 0 && num(j, "loss") > 0, "eval record has loss and accuracy");
        } else if (!strcmp(t->valuestring, "straggler")) {
            const cJSON *ph = cJSON_GetObjectItemCaseSensitive(j, "phase");
            CHECK(cJSON_IsString(ph) && !strcmp(ph->valuestring, "forward"), "straggler record names the forward phase");
            strag |= 1 << (int)num(j, "rank");
        }
        cJSON_Delete(j);
    }
    fclose(f);
    CHECK(bad == 0, "%s: %d lines are not JSON objects with a type", path, bad);
    CHECK(steps == STEPS, "%s: %d step records, want %d", path, steps, STEPS);
    CHECK(missing == 0, "%s: %d missing step fields", path, missing);
    CHECK(bytes_ok == STEPS - 1, "%s: bytes per step as a ring allreduce moves them in %d of %d steps (params %.0f)",
          path, bytes_ok, STEPS - 1, params);
    CHECK(evals == 1, "%s: %d eval records", path, evals);
    return strag;
}

static void check_trace(const char *path) {
    char *text = tl_read_file(path, NULL);
    CHECK(text != NULL, "trace %s missing", path);
    if (!text) return;
    cJSON *j = cJSON_Parse(text);
    free(text);
    const cJSON *ev = cJSON_GetObjectItemCaseSensitive(j, "traceEvents");
    CHECK(cJSON_IsArray(ev), "trace: not a JSON object with a traceEvents array");
    static const char *const phases[] = {"data", "forward", "backward", "comm", "optimizer", "eval"};
    int count[2][6] = {{0}}, named[2] = {0}, coll[2] = {0}, bad = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, ev) {
        const cJSON *ph = cJSON_GetObjectItemCaseSensitive(e, "ph"), *nm = cJSON_GetObjectItemCaseSensitive(e, "name");
        int pid = (int)num(e, "pid"), tid = (int)num(e, "tid");
        if (!cJSON_IsString(ph) || !cJSON_IsString(nm) || pid < 0 || pid > 1) {
            bad++;
            continue;
        }
        if (!strcmp(ph->valuestring, "M")) {
            named[pid] += !strcmp(nm->valuestring, "process_name") || !strcmp(nm->valuestring, "thread_name");
            continue;
        }
        if (strcmp(ph->valuestring, "X") || num(e, "ts") < 0 || num(e, "dur") < 0) {
            bad++;
            continue;
        }
        if (tid == 2 && (!strcmp(nm->valuestring, "allreduce") || !strcmp(nm->valuestring, "allgather"))) coll[pid]++;
        for (int p = 0; p < 6; p++) count[pid][p] += tid == 1 && !strcmp(nm->valuestring, phases[p]);
    }
    CHECK(bad == 0, "trace: %d malformed events", bad);
    for (int r = 0; r < 2; r++) {
        CHECK(named[r] == 3, "trace: rank %d has %d track names, want 3", r, named[r]);
        for (int p = 0; p < 6; p++) {
            int want = p == 5 ? 1 : STEPS;
            CHECK(count[r][p] >= want, "trace: rank %d has %d '%s' spans, want >= %d", r, count[r][p], phases[p], want);
        }
        CHECK(coll[r] >= 2 * STEPS, "trace: rank %d has %d collective spans on the communication track", r, coll[r]);
    }
    cJSON_Delete(j);
    char part[600];
    snprintf(part, sizeof part, "%s.rank-1", path);
    CHECK(access(part, F_OK) != 0, "trace: part %s left behind", part);
}

static void test_run(void) {
    char cfg[512], cmd[4096];
    snprintf(cfg, sizeof cfg, "%s/mlp.ini", g_tmp);
    FILE *f = fopen(cfg, "w");
    fprintf(f, "[model]\ninput = 784\nlayer = linear out=64\nlayer = relu\nlayer = linear out=10\n"
               "[optim]\nname = sgd\nlr = 0.05\n[data]\ndir = %s\n[train]\nbatch = 40\nmax_steps = %d\n"
               "eval_batch = 100\nthreads = 1\nlog_every = 1\nstraggler_steps = 3\nstraggler_margin = 0.2\n",
            g_tmp, STEPS);
    fclose(f);
    // Rank 1 sleeps 40 ms in every forward pass: far slower than these steps.
    snprintf(cmd, sizeof cmd,
             "(DTRAIN_SLOW_RANK=1:40 %s train %s --workers 2 --run-dir %s/run --trace %s/trace.json "
             "--log-format json 2>%s/stderr)",
             tl_dtrain(), cfg, g_tmp, g_tmp, g_tmp);
    int rc = tl_run(cmd, g_out, sizeof g_out);
    char path[512];
    snprintf(path, sizeof path, "%s/stderr", g_tmp);
    char *err = tl_read_file(path, NULL);
    CHECK(rc == 0, "2-worker run: exit %d\n%s\n%s", rc, g_out, err ? err : "");
    // stdout: JSON lines only, ending with the result.
    int lines = 0, json = 0, result = 0;
    for (char *l = strtok(g_out, "\n"); l; l = strtok(NULL, "\n")) {
        lines++;
        cJSON *j = cJSON_Parse(l);
        json += cJSON_IsObject(j);
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "type");
        result += cJSON_IsString(t) && !strcmp(t->valuestring, "result");
        if (cJSON_IsString(t) && !strcmp(t->valuestring, "step") && num(j, "step") > 1)  // (step 1: warm-up)
            CHECK(num(j, "slowest_rank") == 1, "progress: slowest rank %.0f at step %.0f, want 1",
                  num(j, "slowest_rank"), num(j, "step"));
        cJSON_Delete(j);
    }
    CHECK(lines == STEPS + 2 && json == lines && result == 1, "--log-format json: %d lines, %d JSON, %d results",
          lines, json, result);
    CHECK(err && strstr(err, "straggler: rank 1") && strstr(err, "slow phase: forward"),
          "rank 0 warns about rank 1's forward phase:\n%s", err ? err : "");
    free(err);

    snprintf(path, sizeof path, "%s/run/summary.json", g_tmp);
    char *sum = tl_read_file(path, NULL);
    cJSON *s = cJSON_Parse(sum ? sum : "");
    double params = num(s, "params");
    cJSON_Delete(s);
    free(sum);
    int strag0 = check_log(0, params), strag1 = check_log(1, params);
    CHECK(strag0 == 2 && strag1 == 0, "straggler records: rank 0's log names rank 1 only (mask %d), rank 1's none (%d)",
          strag0, strag1);
    snprintf(path, sizeof path, "%s/trace.json", g_tmp);
    check_trace(path);
}

static void test_report(void) {
    char cmd[2048], path[512];
    snprintf(cmd, sizeof cmd, "%s report %s/run -o %s/report.html", tl_dtrain(), g_tmp, g_tmp);
    int rc = tl_run(cmd, g_out, sizeof g_out);
    CHECK(rc == 0, "report: exit %d\n%s", rc, g_out);
    snprintf(path, sizeof path, "%s/report.html", g_tmp);
    char *html = tl_read_file(path, NULL);
    CHECK(html != NULL, "report written");
    if (html) {
        static const char *const ids[] = {"loss", "accuracy", "throughput", "breakdown", "straggler"};
        for (int i = 0; i < 5; i++) {
            char want[64];
            snprintf(want, sizeof want, "<svg class=\"chart\" id=\"%s\"", ids[i]);
            CHECK(strstr(html, want) != NULL, "report has the %s chart", ids[i]);
        }
        CHECK(strstr(html, "<script") == NULL, "report has no script");
        CHECK(strstr(html, "rank 1 (flagged)") != NULL, "report flags rank 1");
        // The smoothed train loss beside the raw one; no "-0.0" tick; the
        // breakdown chart tall enough for its five phases' legend.
        CHECK(strstr(html, ">train, smoothed<") != NULL, "report has the smoothed train loss");
        CHECK(strstr(html, ">-0.0<") == NULL && strstr(html, ">-0<") == NULL, "report has no negative zero tick");
        const char *bd = strstr(html, "id=\"breakdown\""), *hh = bd ? strstr(bd, "height=\"") : NULL;
        const char *opt = bd ? strstr(bd, ">optimizer<") : NULL;
        int height = hh ? atoi(hh + 8) : 0;
        double ly = 0;
        for (const char *q = opt; q && q > bd && !ly; q--)
            if (!strncmp(q, " y=\"", 4)) ly = atof(q + 4);
        CHECK(opt && ly > 0 && ly + 4 < height, "the breakdown's 'optimizer' legend (y %.0f) inside its chart (height %d)",
              ly, height);
        free(html);
    }
    // Bad input: clear messages, exit 1 (2 for usage), never a crash.
    snprintf(cmd, sizeof cmd, "%s report %s/nope", tl_dtrain(), g_tmp);
    rc = tl_run(cmd, g_out, sizeof g_out);
    CHECK(rc == 1 && strstr(g_out, "/nope: no such run directory"), "missing run dir: exit %d\n%s", rc, g_out);
    snprintf(cmd, sizeof cmd, "mkdir -p %s/empty && %s report %s/empty", g_tmp, tl_dtrain(), g_tmp);
    rc = tl_run(cmd, g_out, sizeof g_out);
    CHECK(rc == 1 && strstr(g_out, "no metrics logs"), "run dir without logs: exit %d\n%s", rc, g_out);
    snprintf(cmd, sizeof cmd, "cp -r %s/run %s/bad && echo '{\"type\":\"step\",\"step\":' >> %s/bad/metrics/rank-00001.jsonl && %s report %s/bad",
             g_tmp, g_tmp, g_tmp, tl_dtrain(), g_tmp);
    rc = tl_run(cmd, g_out, sizeof g_out);
    char want[64];
    snprintf(want, sizeof want, "rank-00001.jsonl:%d:", STEPS + 3);  // run + steps + eval, then the bad line
    CHECK(rc == 1 && strstr(g_out, want), "malformed log line: exit %d, want '%s'\n%s", rc, want, g_out);
    // A resumed run appends to the logs and repeats steps: the later records win.
    snprintf(cmd, sizeof cmd,
             "cp -r %s/run %s/resumed && (cd %s/resumed/metrics && for f in rank-*.jsonl; do "
             "grep '\"type\":\"step\"' $f | tail -2 > x && cat x >> $f; done) && %s report %s/resumed -o %s/resumed.html",
             g_tmp, g_tmp, g_tmp, tl_dtrain(), g_tmp, g_tmp);
    rc = tl_run(cmd, g_out, sizeof g_out);
    snprintf(path, sizeof path, "%s/resumed.html", g_tmp);
    html = tl_read_file(path, NULL);
    snprintf(want, sizeof want, "2 ranks, %d steps logged", STEPS);
    CHECK(rc == 0 && html && strstr(html, want), "resumed run's report: exit %d, want '%s'\n%s", rc, want, g_out);
    free(html);
    snprintf(cmd, sizeof cmd, "%s report", tl_dtrain());
    CHECK(tl_run(cmd, g_out, sizeof g_out) == 2, "report without RUN_DIR: usage error\n%s", g_out);
}

// The CPU: cpuid's family against the kernel's, the report in --version and
// summary.json, DTRAIN_ISA's cap reaching oneDNN, a bad cap refused.
static void test_cpu(void) {
    const dt_cpu *cpu = dt_cpu_get();
    char *info = tl_read_file("/proc/cpuinfo", NULL), want[64];
    const char *fam = info ? strstr(info, "cpu family") : NULL;
    CHECK(fam && atoi(strchr(fam, ':') + 1) == cpu->family, "cpu family %d, /proc/cpuinfo says %.20s", cpu->family,
          fam ? fam : "?");
    free(info);
    CHECK(cpu->found >= DT_ISA_AVX2 && cpu->name[0], "cpu '%s': instruction set %s (the build needs avx2)", cpu->name,
          dt_isa_name(cpu->found));
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "DTRAIN_ISA=avx2 %s --version", tl_dtrain());
    int rc = tl_run(cmd, g_out, sizeof g_out);
    snprintf(want, sizeof want, "instruction set %s", dt_isa_name(cpu->found));
    CHECK(rc == 0 && strstr(g_out, cpu->name) && strstr(g_out, want), "--version: exit %d, want '%s'\n%s", rc, want,
          g_out);
    CHECK((cpu->found > DT_ISA_AVX2) == (strstr(g_out, "capped to avx2 by DTRAIN_ISA") != NULL),
          "--version names the cap exactly when it lowers the set:\n%s", g_out);
    snprintf(cmd, sizeof cmd, "DTRAIN_ISA=avx2 %s train %s/mlp.ini --run-dir %s/isa --set train.max_steps=2 2>&1",
             tl_dtrain(), g_tmp, g_tmp);
    rc = tl_run(cmd, g_out, sizeof g_out);
    CHECK(rc == 0 && strstr(g_out, "(avx2)"), "capped run: exit %d, the start line names avx2\n%s", rc, g_out);
    char path[512];
    snprintf(path, sizeof path, "%s/isa/summary.json", g_tmp);
    char *sum = tl_read_file(path, NULL);
    cJSON *s = cJSON_Parse(sum ? sum : ""), *c = cJSON_GetObjectItemCaseSensitive(s, "cpu");
    const char *isa = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(c, "isa"));
    const char *found = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(c, "isa_found"));
    const char *dnnl = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(c, "onednn_isa"));
    CHECK(isa && !strcmp(isa, "avx2") && found && !strcmp(found, dt_isa_name(cpu->found)),
          "summary.json cpu: isa %s, isa_found %s", isa ? isa : "-", found ? found : "-");
    CHECK(dnnl && strcasestr(dnnl, "avx2") && !strstr(dnnl, "512"), "oneDNN under the cap: '%s'", dnnl ? dnnl : "-");
    CHECK(num(c, "family") == cpu->family, "summary.json cpu family %.0f", num(c, "family"));
    cJSON_Delete(s);
    free(sum);
    snprintf(cmd, sizeof cmd, "DTRAIN_ISA=sse9 %s train %s/mlp.ini --run-dir %s/isa2 2>&1", tl_dtrain(), g_tmp, g_tmp);
    rc = tl_run(cmd, g_out, sizeof g_out);
    CHECK(rc == 2 && strstr(g_out, "DTRAIN_ISA=sse9: expected one of"), "bad DTRAIN_ISA: exit %d\n%s", rc, g_out);
}

static void test_bad_flags(void) {
    char cmd[2048];
    // A metrics port in use: an error naming it, exit 1.
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    int ok = fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && listen(fd, 1) == 0 &&
             getsockname(fd, (struct sockaddr *)&a, &len) == 0;
    CHECK(ok, "test socket");
    int port = ntohs(a.sin_port);
    snprintf(cmd, sizeof cmd, "%s train %s/mlp.ini --run-dir %s/busy --metrics-port %d", tl_dtrain(), g_tmp, g_tmp, port);
    int rc = tl_run(cmd, g_out, sizeof g_out);
    char want[64];
    snprintf(want, sizeof want, "127.0.0.1:%d: cannot listen", port);
    CHECK(rc == 1 && strstr(g_out, want), "port in use: exit %d, want '%s'\n%s", rc, want, g_out);
    close(fd);
    static const char *const bad[] = {"--log-format xml", "--metrics-port 0", "--metrics-port 70000", "--metrics-port x",
                                      "--trace", "--metrics-addr="};
    for (int i = 0; i < 6; i++) {
        snprintf(cmd, sizeof cmd, "%s train %s/mlp.ini %s", tl_dtrain(), g_tmp, bad[i]);
        rc = tl_run(cmd, g_out, sizeof g_out);
        CHECK(rc == 2, "'%s': exit %d, want 2\n%s", bad[i], rc, g_out);
    }
    snprintf(cmd, sizeof cmd, "%s train %s/mlp.ini --metrics-addr not-an-address --metrics-port 1 --run-dir %s/x",
             tl_dtrain(), g_tmp, g_tmp);
    rc = tl_run(cmd, g_out, sizeof g_out);
    CHECK(rc == 1 && strstr(g_out, "not-an-address"), "bad metrics address: exit %d\n%s", rc, g_out);
}

// ---- the metrics endpoint --------------------------------------------------

#define IDLE 100
#define SLOW 100

static void render_test_page(FILE *f, void *user) {
    (void)user;
    dt_prom_family(f, "dtrain_test_up", "gauge", "Always 1.");
    dt_prom_sample(f, "dtrain_test_up", "", 1);
}

static int connect_to(int port) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

// Reads what fd sends until it closes, for at most `seconds`; returns the
// bytes read (NUL-terminated in out) and the time taken in *took.
static size_t read_answer(int fd, char *out, size_t cap, double seconds, double start, double *took) {
    size_t n = 0;
    while (n + 1 < cap) {
        int left = (int)((start + seconds - dt_now()) * 1000);
        struct pollfd p = {fd, POLLIN, 0};
        if (left <= 0 || poll(&p, 1, left) <= 0) break;
        ssize_t k = recv(fd, out + n, cap - 1 - n, 0);
        if (k <= 0) break;
        n += (size_t)k;
    }
    out[n] = 0;
    *took = dt_now() - start;
    return n;
}

// Sends one whole request on a new connection; the answer is in out.
static void request(int port, const char *req, size_t len, char *out, size_t cap) {
    double took = 0;
    int fd = connect_to(port);
    if (fd < 0 || send(fd, req, len, MSG_NOSIGNAL) != (ssize_t)len) {
        out[0] = 0;
        if (fd >= 0) close(fd);
        return;
    }
    read_answer(fd, out, cap, 30, dt_now(), &took);  // (30 s: a hang guard)
    close(fd);
}

// How many of the n connections fds have been answered or closed by now.
static int answered_now(const int *fds, int n) {
    struct pollfd all[256];
    int k = 0, m = 0;
    for (int i = 0; i < n && k < 256; i++)
        if (fds[i] >= 0) all[k++] = (struct pollfd){fds[i], POLLIN, 0};
    if (poll(all, k, 0) > 0)
        for (int i = 0; i < k; i++) m += (all[i].revents & (POLLIN | POLLHUP)) != 0;
    return m;
}

// Whether the peer closed fd without sending a byte (within 5 s: a hang guard).
static int closed_silently(int fd) {
    struct pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, 5000) <= 0) return 0;
    char c;
    ssize_t k = recv(fd, &c, 1, 0);
    return k == 0 || (k < 0 && errno == ECONNRESET);
}

static void test_endpoint(void) {
    dt_prom *p = NULL;
    CHECK(dt_prom_start(&p, "127.0.0.1", 0, render_test_page, NULL) == DT_OK, "endpoint: %s", dt_last_error());
    if (!p) return;
    int port = dt_prom_port(p);
    static const char slow_req[] = "GET /metrics HTTP/1.1\r\nHost: slow\r\n\r\n";
    static const char scrape[] = "GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: text/plain\r\n\r\n";
    int idle[IDLE], slow[SLOW], opened = 0;
    for (int i = 0; i < IDLE; i++) opened += (idle[i] = connect_to(port)) >= 0;
    for (int i = 0; i < SLOW; i++) opened += (slow[i] = connect_to(port)) >= 0;
    CHECK(opened == IDLE + SLOW, "endpoint: %d of %d connections opened", opened, IDLE + SLOW);
    // One more client sends a whole request in three pieces, one a round.
    int pieces = connect_to(port);
    const char *piece[3] = {"GET /met", "rics HTTP/1.1\r\nHo", "st: p\r\n\r\n"};
    // Three rounds a second apart: every slow connection sends one more byte,
    // then a scrape is answered in full while the idle and slow connections
    // are all still open and unanswered (a server they held up would answer
    // it only after their 408s, 10 s after they connected).
    int held[IDLE + SLOW];
    double took[3];
    memcpy(held, idle, sizeof idle);
    memcpy(held + IDLE, slow, sizeof slow);
    for (int round = 0; round < 3; round++) {
        double t0 = dt_now();
        for (int i = 0; i < SLOW; i++)
            if (slow[i] >= 0) send(slow[i], slow_req + round, 1, MSG_NOSIGNAL);
        send(pieces, piece[round], strlen(piece[round]), MSG_NOSIGNAL);
        int before = answered_now(held, IDLE + SLOW);
        double t_req = dt_now();
        request(port, scrape, sizeof scrape - 1, g_out, sizeof g_out);
        took[round] = dt_now() - t_req;
        int after = answered_now(held, IDLE + SLOW);
        CHECK(!strncmp(g_out, "HTTP/1.1 200 ", 13) && strstr(g_out, "text/plain; version=0.0.4") &&
                  strstr(g_out, "\r\n\r\n# HELP dtrain_test_up Always 1.\n# TYPE dtrain_test_up gauge\ndtrain_test_up 1\n"),
              "endpoint: scrape %d: want 200 with the page, got:\n%.300s", round, g_out);
        CHECK(before == 0 && after == 0,
              "endpoint: scrape %d answered with %d idle and %d slow connections open: %d of them answered before "
              "it was sent, %d by the time it was answered (want 0: it did not wait for them)",
              round, IDLE, SLOW, before, after);
        double rest = t0 + 1 - dt_now();
        if (rest > 0) usleep((useconds_t)(rest * 1e6));
    }
    printf("endpoint: scrapes with %d idle and %d slow connections open answered in %.3f, %.3f, %.3f s (not "
           "asserted)\n", IDLE, SLOW, took[0], took[1], took[2]);
    double tk;
    read_answer(pieces, g_out, sizeof g_out, 30, dt_now(), &tk);  // (a hang guard)
    CHECK(!strncmp(g_out, "HTTP/1.1 200 ", 13) && strstr(g_out, "dtrain_test_up 1\n"),
          "endpoint: a request sent in 3 pieces: want 200, got:\n%.300s", g_out);
    close(pieces);

    // Each answer's status line, and a word of its body for a 400.
    static const struct {
        const char *req;
        size_t len;
        const char *status, *body;
    } cases[] = {
#define REQ(s) s, sizeof s - 1
        {REQ("GET /met\0rics HTTP/1.1\r\nHost: x\r\n\r\n"), "HTTP/1.1 400 ", "NUL byte"},
        {REQ("GET /metrics\0 HTTP/1.1\r\nHost: x\r\n\r\n"), "HTTP/1.1 400 ", "NUL byte"},
        {REQ("G\0ET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"), "HTTP/1.1 400 ", "NUL byte"},
        {REQ("\0GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"), "HTTP/1.1 400 ", "NUL byte"},
        {REQ("GET /metrics HTTP/1.1\0\r\nHost: x\r\n\r\n"), "HTTP/1.1 400 ", "NUL byte"},
        {REQ("GET /metrics HTTP/1.1\r\nHost: x\0y\r\n\r\n"), "HTTP/1.1 400 ", "NUL byte"},
        {REQ("GET /metrics HTTP/1.1\r\nHo\0st: x\r\n\r\n"), "HTTP/1.1 400 ", "NUL byte"},
        {REQ("GET /metrics HTTP/1.1\r\nHost: x\r\n\0\r\n\r\n"), "HTTP/1.1 400 ", "NUL byte"},
        {REQ("GET /metrics HTTP/1.1\r\nHost: x\r\nX: \0"), "HTTP/1.1 400 ", "NUL byte"},  // (header not ended)
        {REQ("garbage\r\n\r\n"), "HTTP/1.1 400 ", "malformed request line"},
        {REQ("GET /metrics\r\n\r\n"), "HTTP/1.1 400 ", "malformed request line"},
        {REQ("GET  HTTP/1.1\r\n\r\n"), "HTTP/1.1 400 ", "malformed request line"},
        {REQ("GET /nope HTTP/1.1\r\nHost: x\r\n\r\n"), "HTTP/1.1 404 ", "/metrics"},
        {REQ("POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc"), "HTTP/1.1 405 ", "GET and HEAD"},
        {REQ("GET /metrics?x=1 HTTP/1.0\r\n\r\n"), "HTTP/1.1 200 ", "dtrain_test_up 1"},
        {REQ("GET /metrics HTTP/1.0\n\n"), "HTTP/1.1 200 ", "dtrain_test_up 1"},
#undef REQ
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        request(port, cases[i].req, cases[i].len, g_out, sizeof g_out);
        const char *body = strstr(g_out, "\r\n\r\n");
        CHECK(!strncmp(g_out, cases[i].status, strlen(cases[i].status)) && body && strstr(body, cases[i].body),
              "endpoint: request %zu: want '%s' and '%s', got:\n%.300s", i, cases[i].status, cases[i].body, g_out);
    }
    static const char head[] = "HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
    request(port, head, sizeof head - 1, g_out, sizeof g_out);
    const char *end = strstr(g_out, "\r\n\r\n");
    CHECK(!strncmp(g_out, "HTTP/1.1 200 ", 13) && end && !end[4], "endpoint: HEAD: want 200 without a body, got:\n%.300s",
          g_out);

    // 10 s after connecting, idle and slow connections alike (a byte a
    // second is no excuse) get 408 and are closed: keep the slow ones
    // sending until then.
    struct pollfd all[IDLE + SLOW];
    int answered = 0;
    for (int round = 3; round < 16 && answered < IDLE + SLOW; round++) {
        for (int i = 0; i < SLOW; i++)
            if (slow[i] >= 0) send(slow[i], slow_req + round, 1, MSG_NOSIGNAL);
        usleep(1000000);
        answered = 0;
        for (int i = 0; i < IDLE + SLOW; i++) all[i] = (struct pollfd){i < IDLE ? idle[i] : slow[i - IDLE], POLLIN, 0};
        if (poll(all, IDLE + SLOW, 0) > 0)
            for (int i = 0; i < IDLE + SLOW; i++) answered += (all[i].revents & (POLLIN | POLLHUP)) != 0;
    }
    CHECK(answered == IDLE + SLOW, "endpoint: %d of %d idle or slow connections answered after 10 s", answered,
          IDLE + SLOW);
    for (int k = 0; k < 2; k++) {
        read_answer(k ? slow[0] : idle[0], g_out, sizeof g_out, 1, dt_now(), &tk);
        CHECK(!strncmp(g_out, "HTTP/1.1 408 ", 13), "endpoint: %s connection after 10 s: want 408, got:\n%.300s",
              k ? "a slow" : "an idle", g_out);
    }
    for (int i = 0; i < IDLE; i++)
        if (idle[i] >= 0) close(idle[i]);
    // Stopping does not wait for the connections still open: it closes
    // them without an answer (waiting for them would have ended in their
    // 408s, 10 s later).
    for (int i = 0; i < SLOW; i++) slow[i] = connect_to(port);
    for (int i = 0; i < SLOW; i++)
        if (slow[i] >= 0) send(slow[i], "G", 1, MSG_NOSIGNAL);
    dt_prom_stop(p);
    int silent = 0;
    for (int i = 0; i < SLOW; i++)
        if (slow[i] >= 0) silent += closed_silently(slow[i]), close(slow[i]);
    CHECK(silent == SLOW, "endpoint: stopping closed %d of %d open connections without an answer", silent, SLOW);
}


static int near(double a, double b) { return fabs(a - b) <= 1e-9 * fmax(1, fabs(b)); }

// `dtrain simulate RUN_DIR FLAGS` for each bad[i] = {FLAGS, the error's text}: exit 2 and the text.
static void simulate_refused(const char *dir, const char *const (*bad)[2], size_t n) {
    char cmd[2048];
    for (size_t i = 0; i < n; i++) {
        snprintf(cmd, sizeof cmd, "%s simulate %s %s", tl_dtrain(), dir, bad[i][0]);
        int rc = tl_run(cmd, g_out, sizeof g_out);
        CHECK(rc == 2 && strstr(g_out, bad[i][1]), "simulate %s: exit %d, want '%s'\n%s", bad[i][0], rc, bad[i][1],
              g_out);
    }
}

static void test_simulate(void) {
    // 1e6 params = 4 MB of gradients; 1 ms compute per sample, 60% backward
    dt_sim_profile p = {.compute_s = 1e-3, .backward_share = 0.6, .data_s = 0, .optimizer_s = 2e-3,
                        .params = 1e6, .batch = 64, .workers = 1, .bucket_bytes = 1e6};
    dt_sim_params s = {.hosts = 1, .ranks_per_host = 1, .link_bytes_per_s = 1e9, .link_latency_s = 0,
                       .host_bytes_per_s = 4e9};
    dt_sim_point o;
    dt_sim_predict(&p, &s, &o);
    CHECK(o.ranks == 1 && near(o.local_batch, 64) && near(o.comm_s, 0) && near(o.step_s, 64e-3 + 2e-3) &&
              !strcmp(o.algo, "none"),
          "simulate, 1 rank: %d ranks, batch %g, comm %g, step %g, %s", o.ranks, o.local_batch, o.comm_s, o.step_s,
          o.algo);
    // 4 hosts, no latency: ring = rhd = 2*3/4*4e6/1e9 = 6 ms; 16 samples = 16 ms compute, 9.6 ms backward
    s.hosts = 4;
    dt_sim_predict(&p, &s, &o);
    CHECK(near(o.comm_s, 6e-3) && !strcmp(o.algo, "ring") && near(o.local_batch, 16) &&
              near(o.exposed_s, 6e-3 * 0.25) && near(o.step_s, 16e-3 + 1.5e-3 + 2e-3),
          "simulate, 4 hosts: comm %g (%s), exposed %g, step %g", o.comm_s, o.algo, o.exposed_s, o.step_s);
    // latency 1 ms: rhd (2 log2 4 = 4 alphas) beats ring (6 alphas), paid by
    // each of the 4 buckets: 4 x (4 + 1.5) = 22 ms against 9.6 ms of backward
    s.link_latency_s = 1e-3;
    dt_sim_predict(&p, &s, &o);
    CHECK(near(o.comm_s, 22e-3) && !strcmp(o.algo, "rhd") && near(o.exposed_s, 22e-3 - 9.6e-3),
          "simulate, latency: comm %g (%s), exposed %g", o.comm_s, o.algo, o.exposed_s);
    // 3 hosts, a 40-byte gradient: the tree (2 log2 3 -> 4 alphas + 4 S/beta)
    // against rhd (4 alphas + 2*2/3 S/beta) and ring (4 alphas + 2*2/3 S/beta)
    dt_sim_profile tiny = p;
    tiny.params = 10;
    s.hosts = 3;
    dt_sim_predict(&tiny, &s, &o);
    CHECK(!strcmp(o.algo, "ring") && near(o.comm_s, 4e-3 + 2.0 * 2 / 3 * 40 / 1e9), "simulate, 3 hosts: comm %g (%s)",
          o.comm_s, o.algo);
    s.hosts = 4;
    // 2 ranks per host add the shm stage: 2 x 4 MB / 4 GB/s = 2 ms
    s.link_latency_s = 0;
    s.ranks_per_host = 2;
    dt_sim_predict(&p, &s, &o);
    CHECK(o.ranks == 8 && near(o.local_batch, 8) && near(o.comm_s, 8e-3), "simulate, 2 per host: %d ranks, comm %g",
          o.ranks, o.comm_s);
    // ZeRO: the optimizer on 1/8, the allgather half never hidden
    s.zero = 1;
    dt_sim_predict(&p, &s, &o);
    double bwd = 8 * 1e-3 * 0.6, rs = 4e-3;
    CHECK(near(o.exposed_s, fmax(rs - bwd, rs * 0.25) + 4e-3) && near(o.step_s, 8e-3 + o.exposed_s + 2e-3 / 8),
          "simulate, zero: exposed %g, step %g", o.exposed_s, o.step_s);
    // weak scaling keeps 64 samples per rank
    s.zero = 0;
    s.weak = 1;
    dt_sim_predict(&p, &s, &o);
    CHECK(near(o.local_batch, 64) && near(o.samples_per_s, 64 * 8 / o.step_s), "simulate, weak: batch %g",
          o.local_batch);

    // one allreduce as the model has it: 4 hosts x 2 ranks, 4 MB: 2 ms shm + 6 ms ring
    const char *algo = NULL;
    CHECK(near(dt_sim_allreduce(4e6, &s, &algo), 8e-3) && !strcmp(algo, "ring"), "dt_sim_allreduce: %s",
          algo ? algo : "");
    char line[256];
    snprintf(line, sizeof line, "%s simulate --allreduce 1M,64M --hosts 2,4 --link 1gbit,0us", tl_dtrain());
    int rc0 = tl_run(line, g_out, sizeof g_out);
    // 2 hosts, 64 MiB: 2*1/2*67108864 B / 125e6 B/s = 536870.9 us at 0.125 GB/s busbw
    CHECK(rc0 == 0 && strstr(g_out, "     2      2     67108864     536870.9      0.125   ring"),
          "simulate --allreduce: exit %d\n%s", rc0, g_out);

    // The profile of the 2-worker run, and the command.
    char dir[512], cmd[2048], path[512];
    snprintf(dir, sizeof dir, "%s/run", g_tmp);
    dt_sim_profile q;
    CHECK(dt_sim_profile_load(dir, &q) == DT_OK, "profile of the run: %s", dt_last_error());
    CHECK(q.params == 64 * 784 + 64 + 64 * 10 + 10 && q.batch == 40 && q.workers == 2 && q.compute_s > 0 &&
              q.backward_share > 0 && q.backward_share < 1 && q.bucket_bytes == 2048 * 1024,
          "profile: %g params, batch %d, %d workers, %g s/sample, backward %g, bucket %g", q.params, q.batch,
          q.workers, q.compute_s, q.backward_share, q.bucket_bytes);
    snprintf(cmd, sizeof cmd, "%s simulate %s --hosts 1..8 --link 10gbit,50us --strategy dp,zero --html %s/sim.html",
             tl_dtrain(), dir, g_tmp);
    int rc = tl_run(cmd, g_out, sizeof g_out);
    CHECK(rc == 0 && strstr(g_out, "\ndp\n") && strstr(g_out, "\nzero\n") && strstr(g_out, "     8      8 "),
          "dtrain simulate: exit %d\n%s", rc, g_out);
    snprintf(cmd, sizeof cmd, "%s simulate %s --hosts 64 --batch 4096", tl_dtrain(), dir);
    rc = tl_run(cmd, g_out, sizeof g_out);
    CHECK(rc == 0 && strstr(g_out, "batch 4096 on 1 rank(s)") && strstr(g_out, "    64     64     64.00 "),
          "simulate --batch 4096: exit %d\n%s", rc, g_out);
    // --compute-scale 2: twice the profile's compute on every host count
    double c1 = 0, c2 = 0;
    for (int k = 1; k <= 2; k++) {
        snprintf(cmd, sizeof cmd, "%s simulate %s --hosts 1 --compute-scale %d", tl_dtrain(), dir, k);
        rc = tl_run(cmd, g_out, sizeof g_out);
        const char *row = strstr(g_out, "\n     1      1 ");
        double b = 0, c = 0;
        CHECK(rc == 0 && row && sscanf(row, " 1 1 %lf %lf", &b, &c) == 2, "simulate --compute-scale %d: exit %d\n%s",
              k, rc, g_out);
        *(k == 1 ? &c1 : &c2) = c;
    }
    CHECK(c1 > 0 && fabs(c2 - 2 * c1) <= 2e-3, "simulate --compute-scale 2: compute %g ms, at 1 %g ms", c2, c1); /* printed to 1 us */
    snprintf(path, sizeof path, "%s/sim.html", g_tmp);
    char *html = tl_read_file(path, NULL);
    CHECK(html && strstr(html, "<svg class=\"chart\"") && strstr(html, "<td>8</td>"), "simulate --html: chart and table");
    free(html);
    static const char *const bad[][2] = {
        {"--link 10gbit", "--link: expected BW,LATENCY"},  {"--link fast,5us", "--link: expected BW,LATENCY"},
        {"--link 1gbit,5parsecs", "--link: expected"},     {"--hosts 0", "--hosts: expected host counts"},
        {"--hosts 8..2", "--hosts: expected"},             {"--hosts 1,x", "--hosts: expected"},
        {"--strategy tp", "--strategy: 'tp': expected dp or zero"},
        {"--ranks-per-host 0", "--ranks-per-host"},       {"--frobnicate", "unknown option '--frobnicate'"},
        {"--allreduce 1M", "--allreduce takes no RUN_DIR"}, {"--batch 0", "--batch"},
        {"--compute-scale 0", "--compute-scale"},
    };
    simulate_refused(dir, bad, sizeof bad / sizeof bad[0]);
    snprintf(cmd, sizeof cmd, "%s simulate %s/nope", tl_dtrain(), g_tmp);
    rc = tl_run(cmd, g_out, sizeof g_out);
    CHECK(rc == 1 && strstr(g_out, "/nope: no such run directory"), "simulate, missing run: exit %d\n%s", rc, g_out);
    snprintf(cmd, sizeof cmd, "%s simulate --allreduce 1X", tl_dtrain());
    rc = tl_run(cmd, g_out, sizeof g_out);
    CHECK(rc == 2 && strstr(g_out, "--allreduce: '1X': expected sizes"), "simulate --allreduce 1X: exit %d\n%s", rc,
          g_out);
    // hex, a leading zero and inf: refused by the one decimal rule (dt_decimal_scan)
    const char *odd[][2] = {{"--allreduce 0x10", "--allreduce: '0x10'"}, {"--allreduce 010M", "--allreduce: '010M'"},
                            {"--allreduce 1M --link 0x10gbit,1us", "--link"}, {"--allreduce 1M --link 1gbit,infus", "--link"}};
    for (int i = 0; i < 4; i++) {
        snprintf(cmd, sizeof cmd, "%s simulate %s", tl_dtrain(), odd[i][0]);
        rc = tl_run(cmd, g_out, sizeof g_out);
        CHECK(rc == 2 && strstr(g_out, odd[i][1]), "simulate %s: exit %d\n%s", odd[i][0], rc, g_out);
    }
    snprintf(cmd, sizeof cmd, "%s simulate", tl_dtrain());
    CHECK(tl_run(cmd, g_out, sizeof g_out) == 2 && strstr(g_out, "missing RUN_DIR"), "simulate without RUN_DIR\n%s",
          g_out);
}

// GPU hosts: NCCL's hierarchy (a ring reduce-scatter and allgather over
// NVLink, each GPU's 1/G between hosts on its own NIC), 16-bit gradients,
// a bigger model's profile; each against the formula written out here.
static void test_simulate_gpu_model(void) {
    const double nv = 450e9, anv = 1e-6, nic = 50e9, a = 5e-6;
    dt_sim_params s = {.hosts = 4, .gpus_per_host = 8, .nvlink_bytes_per_s = nv, .nvlink_latency_s = anv,
                       .link_bytes_per_s = nic, .link_latency_s = a, .ranks_per_host = 3, .host_bytes_per_s = 1};
    const char *algo = NULL;
    // 8 GPUs x 4 hosts, 1 GB: 14 NVLink steps of 1/8 GB; 125 MB a NIC, rhd's 4 alphas beat ring's 6
    double t = dt_sim_allreduce(1e9, &s, &algo), want = 14 * (anv + 1.25e8 / nv) + 4 * a + 1.5 * 1.25e8 / nic;
    CHECK(near(t, want) && !strcmp(algo, "rhd"), "GPU allreduce, 8 x 4, 1 GB: %g s (%s), want %g", t, algo, want);
    // 4 GPUs x 3 hosts, 64 MB: ring and rhd tie (4 alphas each), ring kept
    s.gpus_per_host = 4, s.hosts = 3;
    t = dt_sim_allreduce(64e6, &s, &algo), want = 6 * (anv + 16e6 / nv) + 4 * a + 2.0 * 2 / 3 * 16e6 / nic;
    CHECK(near(t, want) && !strcmp(algo, "ring"), "GPU allreduce, 4 x 3, 64 MB: %g s (%s), want %g", t, algo, want);
    // one host: NVLink alone (ranks_per_host and host_bytes_per_s unused)
    s.gpus_per_host = 8, s.hosts = 1;
    t = dt_sim_allreduce(1e9, &s, &algo), want = 14 * (anv + 1.25e8 / nv);
    CHECK(near(t, want) && !strcmp(algo, "none"), "GPU allreduce, one host: %g s (%s), want %g", t, algo, want);
    // one GPU a host: the whole gradient on the NIC, no NVLink
    s.gpus_per_host = 1, s.hosts = 2;
    t = dt_sim_allreduce(1e9, &s, &algo), want = 2 * a + 1e9 / nic;
    CHECK(near(t, want), "GPU allreduce, 1 GPU x 2 hosts: %g s, want %g", t, want);

    // a step: 1e6 params, 1 ms a sample (2/3 backward), 64 samples, buckets of 1 MB, no latency
    dt_sim_profile p = {.compute_s = 1e-3, .backward_share = 2.0 / 3, .optimizer_s = 2e-3, .params = 1e6,
                        .batch = 64, .workers = 1, .bucket_bytes = 1e6};
    s = (dt_sim_params){.hosts = 2, .gpus_per_host = 8, .nvlink_bytes_per_s = 1e9, .link_bytes_per_s = 1e8};
    dt_sim_point o4, o2;
    dt_sim_predict(&p, &s, &o4);
    // 4 MB in 4 buckets: 4 x (2 x 7/8 x 1 MB / 1 GB/s + 2 x 1/2 x 125 KB / 100 MB/s) = 4 x 3 ms; 4 samples
    CHECK(o4.ranks == 16 && near(o4.local_batch, 4) && near(o4.comm_s, 12e-3) &&
              near(o4.exposed_s, 12e-3 - 4e-3 * 2 / 3) && near(o4.step_s, 4e-3 + o4.exposed_s + 2e-3),
          "GPU step, fp32: %d ranks, comm %g, exposed %g, step %g", o4.ranks, o4.comm_s, o4.exposed_s, o4.step_s);
    s.grad_bytes = 2;  // half the bytes in as many buckets (cut in fp32 elements)
    dt_sim_predict(&p, &s, &o2);
    CHECK(near(o2.comm_s, 6e-3) && near(o2.comm_s, o4.comm_s / 2), "GPU step, 2-byte gradients: comm %g (fp32 %g)",
          o2.comm_s, o4.comm_s);
    // with latencies (1 us an NVLink step, 5 us a NIC's): each of the 4
    // buckets pays 14 x 1 us + 2 x 5 us whatever its bytes, so 2-byte
    // gradients save the bandwidth's half alone
    s.nvlink_latency_s = 1e-6, s.link_latency_s = 5e-6;
    dt_sim_predict(&p, &s, &o2);
    s.grad_bytes = 4;
    dt_sim_predict(&p, &s, &o4);
    CHECK(near(o4.comm_s, 4 * (24e-6 + 3e-3)) && near(o2.comm_s, 4 * (24e-6 + 1.5e-3)),
          "GPU step with latencies: comm fp32 %g (want %g), 2-byte %g (want %g)", o4.comm_s, 4 * (24e-6 + 3e-3),
          o2.comm_s, 4 * (24e-6 + 1.5e-3));
    s.nvlink_latency_s = s.link_latency_s = 0, s.grad_bytes = 2;
    // 1e7 params: compute and optimizer x 10, 10 x the bytes (20 MB in 2 bytes: 40 buckets of 0.5 MB, cut in fp32)
    dt_sim_profile q = p;
    dt_sim_profile_scale(&q, 1e7);
    dt_sim_predict(&q, &s, &o2);
    CHECK(near(q.compute_s, 1e-2) && near(q.optimizer_s, 2e-2) && q.params == 1e7 && near(q.backward_share, 2.0 / 3) &&
              near(o2.compute_s, 4e-2) && near(o2.comm_s, 40 * (14 * 0.5e6 / 8 / 1e9 + 2 * 0.5 * 0.5e6 / 8 / 1e8)),
          "--model-params 1e7: compute %g, optimizer %g, step compute %g, comm %g", q.compute_s, q.optimizer_s,
          o2.compute_s, o2.comm_s);
}

// A device run's profile: its whole step (its phases are launch times),
// from a made-up log (left in g_tmp/devlog) and from the MLP on the
// simulated GPU; one of 2 ranks refused.
static void test_simulate_device_profile(void) {
    char dir[512], cmd[2048], path[600];
    snprintf(dir, sizeof dir, "%s/devlog", g_tmp);
    snprintf(path, sizeof path, "mkdir -p %s/metrics", dir);
    CHECK(system(path) == 0, "mkdir %s", dir);
    snprintf(path, sizeof path, "%s/metrics/rank-00000.jsonl", dir);
    FILE *f = fopen(path, "w");
    const double step_s[] = {0.5, 0.5, 0.10, 0.12, 0.11};  // after the 2 warm-up steps: median 0.11
    for (int i = 0; i < 5; i++)
        fprintf(f, "{\"type\":\"step\",\"step\":%d,\"time\":%d,\"loss\":1,\"step_seconds\":%g,\"data_seconds\":0.001,"
                   "\"forward_seconds\":0.002,\"backward_seconds\":0.003,\"comm_exposed_seconds\":0.01,"
                   "\"optimizer_seconds\":0.004}\n", i + 1, i + 1, step_s[i]);
    fclose(f);
    snprintf(path, sizeof path, "%s/summary.json", dir);
    f = fopen(path, "w");
    fputs("{\"params\":1000000,\"batch\":16,\"workers\":2,\"gpu\":{\"device\":\"cuda\"}}\n", f);
    fclose(f);
    dt_sim_profile p;
    CHECK(dt_sim_profile_load(dir, &p) == DT_ERR_FORMAT && strstr(dt_last_error(), "/devlog: a run on the GPU of 2 "
          "ranks: its exchange waits for the device's backward"), "device profile of 2 ranks: %s", dt_last_error());
    f = fopen(path, "w");
    fputs("{\"params\":1000000,\"batch\":8,\"workers\":1,\"gpu\":{\"device\":\"cuda\"}}\n", f);
    fclose(f);
    CHECK(dt_sim_profile_load(dir, &p) == DT_OK, "device profile: %s", dt_last_error());
    CHECK(p.device == 1 && near(p.compute_s, 0.11 / 8) && near(p.backward_share, 2.0 / 3) &&
              p.data_s == 0 && p.optimizer_s == 0 && p.params == 1e6 && p.layers == 0,
          "device profile: device %d, compute %g s a sample, backward %g, data %g, optimizer %g", p.device,
          p.compute_s, p.backward_share, p.data_s, p.optimizer_s);
    // The MLP on the simulated GPU: summary.json's "gpu" read as a device run.
    snprintf(cmd, sizeof cmd, "DTRAIN_GPU=sim %s train %s/mlp.ini --device cuda --run-dir %s/devrun "
             "--set train.max_steps=6 --set train.straggler_steps=0 2>&1", tl_dtrain(), g_tmp, g_tmp);
    int rc = tl_run(cmd, g_out, sizeof g_out);
    snprintf(path, sizeof path, "%s/devrun", g_tmp);
    CHECK(rc == 0 && dt_sim_profile_load(path, &p) == DT_OK && p.device == 1 && p.compute_s > 0,
          "the simulated GPU's run: exit %d, device %d, compute %g\n%s", rc, p.device, p.compute_s, g_out);
}

// `dtrain simulate` on GPU hosts (the made-up device log; no run; one
// allreduce) and its refusals.
static void test_simulate_gpu_cli(void) {
    char dir[512], cmd[2048];
    snprintf(dir, sizeof dir, "%s/devlog", g_tmp);
    // 8 GPUs x 2 hosts, a sample each (0.11 s / 8 = 13.75 ms), 2-byte gradients, links with no latency:
    // one bucket of 2 MB, 14 x 250 KB / 4 GB/s + 2 x 1/2 x 250 KB / 1 GB/s = 1.125 ms
    snprintf(cmd, sizeof cmd, "%s simulate %s --gpus-per-host 8 --hosts 2 --nvlink 32gbit,0us --link 8gbit,0us "
             "--grad-bytes 2 --batch 16", tl_dtrain(), dir);
    int rc = tl_run(cmd, g_out, sizeof g_out);
    const char *row = strstr(g_out, "\n     2     16 ");
    double b = 0, comp = 0, comm = 0;
    int got = row ? sscanf(row, " 2 16 %lf %lf %lf", &b, &comp, &comm) : 0;
    CHECK(rc == 0 && got == 3 && b == 1 &&
              fabs(comp - 13.75) <= 1e-3 && fabs(comm - (14 * 0.25e6 / 4e9 + 0.25e6 / 1e9) * 1e3) <= 1e-3 &&
              strstr(g_out, "a GPU run: its whole step") && strstr(g_out, "8 GPUs a host"),
          "simulate a device run on GPU hosts: exit %d, batch %g, compute %g ms, comm %g ms\n%s", rc, b, comp, comm,
          g_out);
    // No run: 1e6 params, 1 ms a sample, as a model of 1e7 (x 10), 64 samples on 8 GPUs x 1 host:
    // 8 samples x 10 ms; 40 MB in 20 buckets (2 MiB at most): 20 x 14 x 2 MB / 8 / 4 GB/s = 17.5 ms
    snprintf(cmd, sizeof cmd, "%s simulate --params 1e6 --compute-ms-per-sample 1 --optimizer-ms 2 --batch 64 "
             "--model-params 1e7 --gpus-per-host 8 --nvlink 32gbit,0us --hosts 1", tl_dtrain());
    rc = tl_run(cmd, g_out, sizeof g_out);
    row = strstr(g_out, "\n     1      8 ");
    got = row ? sscanf(row, " 1 8 %lf %lf %lf", &b, &comp, &comm) : 0;
    CHECK(rc == 0 && got == 3 && b == 8 &&
              fabs(comp - 80) <= 1e-3 && fabs(comm - 17.5) <= 1e-3 && strstr(g_out, "optimizer 20.00 ms per step"),
          "simulate --params --model-params: exit %d, compute %g ms, comm %g ms\n%s", rc, comp, comm, g_out);
    static const char *const bad[][2] = {
        {"--gpus-per-host 8 --ranks-per-host 2", "--ranks-per-host and --host-bw are the CPU hosts'"},
        {"--gpus-per-host 8 --host-bw 3", "--gpus-per-host: a rank a GPU"},
        {"--nvlink 3600gbit,1us", "--nvlink needs --gpus-per-host"},
        {"--gpus-per-host 8 --nvlink 450GB,1us", "--nvlink: expected BW,LATENCY"},
        {"--gpus-per-host 0", "--gpus-per-host"},
        {"--grad-bytes 3", "--grad-bytes: expected 4 (fp32) or 2"},
        {"--grad-bytes 8", "--grad-bytes"},
        {"--model-params 0", "--model-params"},
        {"--bucket-kb 1", "--bucket-kb"},
        {"--params 1e6", "not with RUN_DIR"},
    };
    simulate_refused(dir, bad, sizeof bad / sizeof bad[0]);
    snprintf(cmd, sizeof cmd, "%s simulate --params 1e6 --compute-ms-per-sample 1", tl_dtrain());
    rc = tl_run(cmd, g_out, sizeof g_out);
    CHECK(rc == 2 && strstr(g_out, "needs --params, --compute-ms-per-sample and --batch (missing --batch)"),
          "simulate --params without --batch: exit %d\n%s", rc, g_out);
    snprintf(cmd, sizeof cmd, "%s simulate --allreduce 1G --hosts 1,4 --gpus-per-host 8 --nvlink 3600gbit,0us "
             "--link 400gbit,0us", tl_dtrain());
    rc = tl_run(cmd, g_out, sizeof g_out);
    // 1 GiB, 1 host: 14 x 1/8 GiB / 450 GB/s = 4175.7 us, busbw 450; 4 hosts: + 1.5 x 1/8 GiB / 50 GB/s
    CHECK(rc == 0 && strstr(g_out, "     1      8   1073741824       4175.7    450.000   none") &&
              strstr(g_out, "     4     32   1073741824       8202.2"),
          "simulate --allreduce on GPU hosts: exit %d\n%s", rc, g_out);
}

int main(void) {
    snprintf(g_tmp, sizeof g_tmp, "/tmp/dtrain-test-obs-XXXXXX");
    if (!mkdtemp(g_tmp)) return perror("mkdtemp"), 1;
    tl_make_images(g_tmp, "train", 480, 1);
    tl_make_images(g_tmp, "t10k", 100, 2);
    test_straggler();
    test_progress_line();
    test_comm_stats();
    test_run();
    test_report();
    test_simulate();
    test_simulate_gpu_model();
    test_simulate_device_profile();
    test_simulate_gpu_cli();
    test_cpu();
    test_bad_flags();
    test_endpoint();
    tl_cleanup(g_tmp);
    return tl_finish();
}
