/* Hot spares (--spares K, docs/checkpoints.md "Spares"): a worker killed
 * or hung mid-run is replaced by an idle spare that takes the state of a
 * surviving replica over the communicator (no checkpoint, no disk), the
 * step in flight is redone, and the run ends bitwise equal to an
 * uninterrupted one: rank 1 and rank 0 killed, plain and deterministic
 * data parallel, fp16 (its loss scale), the GPT (its data stream), a hung
 * worker, and a second death with no spare left that falls back to the
 * restart from a checkpoint. ZeRO 1, 2 and 3 (the dead rank's slice from
 * its buddy's in-memory copy), rank 0 under zero 3 with its sharded
 * checkpoints, and two adjacent ranks killed at once, whose lost slice is
 * named before the restart from a checkpoint. Deaths while the run starts
 * (the join barrier, the metrics' start, the initial broadcast; ZeRO 3
 * before its first update), and a resumed run's refusal. Configurations a spare
 * cannot serve are refused before any worker starts. */
#include "testlib.h"
#include "dtrain/ckpt.h"
#include "dtrain/core.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char g_tmp[256];
static char g_out[1 << 17];

static const char *tmp(const char *name) { return tl_path(g_tmp, name); }

static const char *cfg =
    "[model]\ninput = 784\nlayer = linear out=48\nlayer = relu\nlayer = dropout p=0.2\nlayer = linear out=10\n"
    "[optim]\nname = adamw\nlr = 0.003\n[schedule]\nname = cosine\nwarmup_steps = 5\n"
    "[train]\nbatch = 40\nepochs = 0\nmax_steps = 30\neval_batch = 100\nseed = 5\n[parallel]\ndeterministic = true\n";

static int train(const char *name, const char *extra) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s train %s --workers 3 --run-dir %s %s 2>&1", tl_dtrain(), tmp("run.ini"), tmp(name),
             extra ? extra : "");
    return tl_run(cmd, g_out, sizeof g_out);
}

static int same_as(const char *ref, const char *name) {
    int bw;
    double d = tl_runs_diff(g_tmp, ref, name, &bw);
    if (!bw) fprintf(stderr, "%s: max relative difference to %s %.3g\n", name, ref, d);
    return bw;
}

static void faults(const char *steps, const char *once) {
    setenv("DTRAIN_FAULT_STEP", steps, 1);
    setenv("DTRAIN_FAULT_ONCE", tmp(once), 1);
}

static void no_faults(void) {
    unsetenv("DTRAIN_FAULT_STEP");
    unsetenv("DTRAIN_FAULT_ONCE");
}

/* The launcher's "rank R recovered in T s (..., step S); 0 steps lost":
 * T, and S in *step. -1 if absent. */
static double spare_recovery(int rank, int *step) {
    char want[64];
    snprintf(want, sizeof want, "run: rank %d recovered in ", rank);
    const char *s = strstr(g_out, want);
    double t = -1;
    *step = -1;
    if (s && sscanf(s + strlen(want), "%lf s (its death to its replacement's first step, step %d); 0 steps lost", &t,
                    step) != 2)
        t = -1;
    return t;
}

/* Rank R's share of the global batch at step S, from its metrics log (the
 * last record of that step: a redone step's), or -1. */
static int share_at(const char *run, int rank, int step) {
    char path[512], want[32];
    snprintf(path, sizeof path, "%s/%s/metrics/rank-%05d.jsonl", g_tmp, run, rank);
    snprintf(want, sizeof want, "\"step\":%d,", step);
    char *t = tl_read_file(path, NULL), *line = t;
    int share = -1;
    while (line && *line) {
        char *end = strchr(line, '\n'), *sh;
        if (end) *end = 0;
        if (strstr(line, want) && (sh = strstr(line, "\"share\":"))) share = atoi(sh + 8);
        line = end ? end + 1 : NULL;
    }
    free(t);
    return share;
}

static void test_replaced(void) {
    int rc = train("ref", "--quiet");
    CHECK(rc == 0, "uninterrupted run: exit %d\n%s", rc, g_out);

    // Rank 1 killed in step 13, no checkpoints at all: the spare gets the
    // state from a replica, the step is redone.
    faults("1:13:kill", "once-1");
    rc = train("spare", "--spares 1");
    no_faults();
    CHECK(rc == 0, "rank 1 killed, one spare: exit %d\n%s", rc, g_out);
    CHECK(strstr(g_out, "run: rank 1 (pid") &&
              strstr(g_out, "killed by signal 9 (Killed) (in a training step after step 12); spare 0 (pid") &&
              strstr(g_out, "takes its place (0 spares left)"),
          "the launcher names the dead rank and the spare:\n%s", g_out);
    int step;
    double t = spare_recovery(1, &step);
    CHECK(t >= 0 && step == 13, "recovery logged with its time, step 13 redone, 0 steps lost (t %.2f, step %d):\n%s",
          t, step, g_out);
    CHECK(strstr(g_out, "spares: every worker rejoined and took rank") && strstr(g_out, "redoing step 13"),
          "rank 0 says whose state and which step is redone:\n%s", g_out);
    CHECK(access(tmp("spare/checkpoints"), F_OK) != 0, "no checkpoint was written or read");
    CHECK(same_as("ref", "spare"), "rank 1 replaced: bitwise equal to the uninterrupted run");

    // Rank 0 (the one that writes checkpoints, the summary and the weights)
    // killed in step 9, with checkpoints on; a second spare stays idle and
    // is released at the end.
    faults("0:9:kill", "once-0");
    rc = train("spare0", "--spares 2 --checkpoint-every 5");
    no_faults();
    CHECK(rc == 0 && strstr(g_out, "takes its place (1 spare left)"), "rank 0 killed, two spares: exit %d\n%s", rc,
          g_out);
    t = spare_recovery(0, &step);
    CHECK(t >= 0 && step == 9, "rank 0's recovery logged, step 9 redone (t %.2f, step %d)", t, step);
    CHECK(same_as("ref", "spare0"), "rank 0 replaced: bitwise equal to the uninterrupted run");
    char **list;
    int n = 0;
    dt_status st = dt_ckpt_list(tmp("spare0/checkpoints"), &list, &n);
    CHECK(st == DT_OK && n == 3 && strstr(list[0], "step-00000030"),
          "the new rank 0 kept writing checkpoints (%d, newest %s)", n, n ? list[0] : "none");
    for (int i = 0; i < n; i++) free(list[i]);
    if (n) free(list);
    CHECK(tl_json_number(tl_path(tmp("spare0"), "summary.json"), "steps") == 30, "summary.json of 30 steps");

    // Plain (not deterministic) data parallel: the same ranks redo the
    // same step on the same state, so it is bitwise too.
    rc = train("refdp", "--quiet --set parallel.deterministic=false");
    CHECK(rc == 0, "uninterrupted dp run: exit %d\n%s", rc, g_out);
    faults("2:7:kill", "once-dp");
    rc = train("sparedp", "--spares 1 --set parallel.deterministic=false");
    no_faults();
    CHECK(rc == 0 && spare_recovery(2, &step) >= 0 && step == 7, "dp, rank 2 killed: exit %d\n%s", rc, g_out);
    CHECK(same_as("refdp", "sparedp"), "dp, rank 2 replaced: bitwise equal to the uninterrupted dp run");

    // Dynamic batching: the spare takes the split in force (rank 1 slowed
    // 4x has the smallest share by then); deterministic sums make any split
    // bitwise the fixed one's, so a spare on another split than the others'
    // (the even one it starts with) would count some samples twice and miss
    // others.
    setenv("DTRAIN_SLOW_RANK", "1:x4", 1);
    faults("2:20:kill", "once-dyn");
    rc = train("sparedyn", "--spares 1 --set train.dynamic_batch=true");
    no_faults();
    unsetenv("DTRAIN_SLOW_RANK");
    int s1 = share_at("sparedyn", 1, 20), s2 = share_at("sparedyn", 2, 25);
    CHECK(rc == 0 && spare_recovery(2, &step) >= 0 && step == 20 && s1 > 0 && s1 < 40 / 3 && s2 > 0,
          "dynamic batch, rank 2 killed in step 20: exit %d, rank 1's share %d of 40, the spare's %d\n%s", rc, s1, s2,
          g_out);
    CHECK(same_as("ref", "sparedyn"), "dynamic batch, rank 2 replaced: bitwise equal to the uninterrupted run");

    // State no replica holds (local SGD's drift and each rank's optimizer
    // state; a codec's residuals): every rank goes back to the newest
    // checkpoint (step 10) and redoes the steps since, as the restart of
    // the whole group from that checkpoint (--max-restarts) does.
    static const struct {
        const char *name, *flags;
    } own[] = {
        {"local-sgd", "--set parallel.deterministic=false --set parallel.sync_every=4"},
        {"int8", "--set parallel.deterministic=false --set compression.method=int8"},
        {"topk", "--set parallel.deterministic=false --set compression.method=topk --set compression.ratio=0.1"},
    };
    for (size_t i = 0; i < sizeof own / sizeof *own; i++) {
        char flags[512], restarted[64], spared[64], once[64];
        snprintf(restarted, sizeof restarted, "restart-%s", own[i].name);
        snprintf(spared, sizeof spared, "spare-%s", own[i].name);
        snprintf(once, sizeof once, "once-r-%s", own[i].name);
        faults("1:13:kill", once);
        snprintf(flags, sizeof flags, "--max-restarts 1 --checkpoint-every 5 %s", own[i].flags);
        rc = train(restarted, flags);
        CHECK(rc == 0 && strstr(g_out, "from the newest checkpoint"), "%s, rank 1 killed, restarted: exit %d\n%s",
              own[i].name, rc, g_out);
        snprintf(once, sizeof once, "once-s-%s", own[i].name);
        faults("1:13:kill", once);
        snprintf(flags, sizeof flags, "--spares 1 --checkpoint-every 5 %s", own[i].flags);
        rc = train(spared, flags);
        no_faults();
        // (step 10's background write may not have finished by the death at
        // step 13 on a loaded machine: then step 5's, the newest complete)
        int back10 = strstr(g_out, "step-00000010") && strstr(g_out, "(step 10) in ");
        int back5 = strstr(g_out, "step-00000010: its writing never finished") && strstr(g_out, "(step 5) in ");
        CHECK(rc == 0 && strstr(g_out, "takes its place (0 spares left)") && strstr(g_out, "went back to ") &&
                  (back10 || back5) && !strstr(g_out, "from the newest checkpoint"),
              "%s, rank 1 killed, a spare: exit %d, every rank back to step 10\n%s", own[i].name, rc, g_out);
        CHECK(same_as(restarted, spared), "%s, rank 1 replaced: bitwise equal to the restart from the checkpoint",
              own[i].name);
    }
    // A death before the first scheduled checkpoint: back to the one such
    // a run makes before its first step.
    faults("1:3:kill", "once-s-early");
    rc = train("spare-int8-early", "--spares 1 --checkpoint-every 5 --set parallel.deterministic=false "
                                   "--set compression.method=int8");
    no_faults();
    CHECK(rc == 0 && strstr(g_out, "step-00000000 (step 0) in ") && same_as("restart-int8", "spare-int8-early"),
          "int8, rank 1 killed at step 3, a spare: every rank back to step 0, bitwise equal to the restarted run: "
          "exit %d\n%s", rc, g_out);
    // A death in that checkpoint of step 0, its write in flight (rank 0,
    // the writer, or rank 2): no checkpoint yet, so every rank goes on from
    // the start's state and the save is made again; a second death, at
    // step 3, goes back to that new checkpoint.
    for (int k = 0; k < 2; k++) {
        char fault[64], name[32], once[32];
        snprintf(fault, sizeof fault, "%d:0:kill:save0%s", 2 * k, k ? ",1:3:kill" : "");
        snprintf(name, sizeof name, "spare-int8-save0-%d", 2 * k);
        snprintf(once, sizeof once, "once-save0-%d", k);
        faults(fault, once);
        rc = train(name, k ? "--spares 2 --checkpoint-every 5 --set parallel.deterministic=false "
                             "--set compression.method=int8"
                           : "--spares 1 --checkpoint-every 5 --set parallel.deterministic=false "
                             "--set compression.method=int8");
        no_faults();
        CHECK(rc == 0 && strstr(g_out, "went back to the start (no checkpoint yet) (step 0) in ") &&
                  (!k || strstr(g_out, "step-00000000 (step 0) in ")) && same_as("restart-int8", name),
              "int8, rank %d killed in the checkpoint of step 0%s, a spare: every rank from the start, bitwise equal "
              "to the restarted run: exit %d\n%s", 2 * k, k ? " and rank 1 at step 3" : "", rc, g_out);
    }

    // fp16: the loss scale (and its count of clean steps) comes with the
    // state; an overflow at step 4 halved it before the kill.
    setenv("DTRAIN_FAULT_OVERFLOW", "0:4", 1);
    rc = train("ref16", "--quiet --set parallel.deterministic=false --set train.precision=fp16");
    CHECK(rc == 0, "uninterrupted fp16 run: exit %d\n%s", rc, g_out);
    faults("1:9:kill", "once-16");
    rc = train("spare16", "--spares 1 --set parallel.deterministic=false --set train.precision=fp16");
    no_faults();
    CHECK(rc == 0 && spare_recovery(1, &step) >= 0 && step == 9, "fp16, rank 1 killed: exit %d\n%s", rc, g_out);
    CHECK(same_as("ref16", "spare16"), "fp16, rank 1 replaced: bitwise equal to the uninterrupted fp16 run");
    unsetenv("DTRAIN_FAULT_OVERFLOW");
    double ls = tl_json_number(tl_path(tmp("spare16"), "summary.json"), "loss_scale");
    CHECK(ls == 32768 && ls == tl_json_number(tl_path(tmp("ref16"), "summary.json"), "loss_scale"),
          "fp16: the same loss scale at the end, halved once (%g)", ls);

    // A hung worker: found by its missing heartbeats, killed, replaced.
    faults("2:11:hang", "once-hang");
    rc = train("sparehang", "--spares 1 --heartbeat-timeout 2");
    no_faults();
    CHECK(rc == 0 && strstr(g_out, "rank 2 (pid") && strstr(g_out, "hung; killing it for a spare to take its place") &&
              spare_recovery(2, &step) >= 0 && step == 11,
          "hung rank 2 replaced: exit %d\n%s", rc, g_out);
    CHECK(same_as("ref", "sparehang"), "hung rank replaced: bitwise equal to the uninterrupted run");

    // Two deaths, one spare: the second falls back to the restart from the
    // newest checkpoint (which starts a fresh spare with the group).
    faults("1:8:kill,2:17:kill", "once-two");
    rc = train("fallback", "--spares 1 --max-restarts 1 --checkpoint-every 5");
    no_faults();
    CHECK(rc == 0, "two deaths, one spare: exit %d\n%s", rc, g_out);
    double ts = spare_recovery(1, &step), tr = -1;
    const char *r = strstr(g_out, "worker 2 Killed at step 16; restarting 3 workers from the newest checkpoint");
    const char *rec = r ? strstr(r, "recovered in ") : NULL;
    int from = -1, lost = -1;
    if (rec) sscanf(rec, "recovered in %lf s (failure to the first new step); resumed at step %d, %d", &tr, &from, &lost);
    CHECK(ts >= 0 && step == 8 && r && tr >= 0 && (from == 15 || from == 10) && lost == 16 - from,
          "the first death taken by the spare, the second by a restart from a checkpoint:\n%s", g_out);
    CHECK(same_as("ref", "fallback"), "spare, then restart: bitwise equal to the uninterrupted run");
    // Figures, not checked (a loaded machine): the same job's two recoveries.
    printf("recovery with a spare %.2f s, 0 steps lost; restart from a checkpoint %.2f s, %d steps lost\n", ts, tr,
           lost);
}

// A death in the start's collectives (the barrier as the workers join,
// the metrics' start, the broadcast of the initial parameters): the
// survivors rejoin with the spare there and the start's state comes from
// a replica, as mid-run; under ZeRO before the first step, the newcomer's
// slice is its own (the seeded start's).
static void test_start(void) {
    static const struct { const char *fault, *name, *extra, *ref; int rank; } runs[] = {
        {"0:0:kill:join", "join0", "--spares 1 --checkpoint-every 5", "ref", 0},
        {"2:0:kill:metrics", "metrics2", "--spares 1", "ref", 2},
        {"0:0:kill:start", "start0", "--spares 1", "ref", 0},  // the others wait for its broadcast
        {"1:0:kill:start", "zstart1", "--spares 1 --zero 3", "zref3", 1},  // found in the first step
    };
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
        char once[64];
        snprintf(once, sizeof once, "once-%s", runs[i].name);
        faults(runs[i].fault, once);
        int rc = train(runs[i].name, runs[i].extra), step;
        no_faults();
        CHECK(rc == 0 && strstr(g_out, "killed by signal 9 (Killed) (while starting, before the first step); spare 0 (pid") &&
                  spare_recovery(runs[i].rank, &step) >= 0 && step == 1,
              "%s: rank %d killed at the start, replaced, step 1 its first: exit %d\n%s", runs[i].fault, runs[i].rank,
              rc, g_out);
        CHECK(same_as(runs[i].ref, runs[i].name), "%s: bitwise equal to the uninterrupted run", runs[i].fault);
    }
    // Resumed: only rank 0 read the checkpoint, and its share is a
    // collective the survivors are past; the run says so.
    faults("1:0:kill:start", "once-resume");
    char extra[600];
    snprintf(extra, sizeof extra, "--spares 1 --resume %s", tmp("join0/checkpoints"));
    int rc = train("startresume", extra);
    no_faults();
    CHECK(rc != 0 && strstr(g_out, "a worker died while the run started, before the checkpoint to resume from was "
                                   "shared; a spare cannot resume it (--max-restarts restarts the run)"),
          "resumed, rank 1 killed at the start: exit %d\n%s", rc, g_out);
}

// The GPT: its token windows come from the loop's generator, which comes
// with the state (its spare loads the token files ahead).
static void test_gpt(void) {
    char cmd[4096], txt[600];
    snprintf(txt, sizeof txt, "%s", tmp("corpus.txt"));
    FILE *f = fopen(txt, "w");
    for (int i = 0; i < 400; i++) fprintf(f, "the cat sat on the mat. %d\n", i % 10);
    fclose(f);
    snprintf(cmd, sizeof cmd, "%s prepare-text %s -o %s 2>&1", tl_dtrain(), txt, tmp("corpus"));
    int rc = tl_run(cmd, g_out, sizeof g_out);
    CHECK(rc == 0, "prepare-text: exit %d\n%s", rc, g_out);
    f = fopen(tmp("gpt.ini"), "w");
    fprintf(f,
            "[model]\npreset = gpt\nn_layer = 1\nn_head = 2\nn_embd = 16\nblock_size = 32\nvocab_size = 256\n"
            "[data]\ndataset = tokens\ntrain_file = %s_train.bin\nval_file = %s_val.bin\n"
            "[optim]\nname = adamw\nlr = 0.01\n[train]\nbatch = 6\nseq_len = 32\nmax_steps = 30\neval_every = 10\n"
            "eval_batches = 2\nthreads = 1\n",
            tmp("corpus"), tmp("corpus"));
    fclose(f);
    // data parallel on 3 workers; tensor parallel (the heads split in two) on 4
    const char *runs[] = {"gptref", "gptspare", "gpttpref", "gpttpspare"};
    const char *layout[] = {"--workers 3", "--workers 4 --set parallel.tensor=2"};
    for (int i = 0; i < 4; i++) {
        if (i % 2) faults("2:14:kill", i < 2 ? "once-gpt" : "once-gpttp");
        snprintf(cmd, sizeof cmd, "%s train %s %s --run-dir %s %s 2>&1", tl_dtrain(), tmp("gpt.ini"), layout[i / 2],
                 tmp(runs[i]), i % 2 ? "--spares 1" : "--quiet");
        rc = tl_run(cmd, g_out, sizeof g_out);
        no_faults();
        CHECK(rc == 0, "GPT %s: exit %d\n%s", runs[i], rc, g_out);
        int step;
        if (i % 2)
            CHECK(spare_recovery(2, &step) >= 0 && step == 14, "GPT %s: rank 2 replaced, step 14 redone\n%s",
                  layout[i / 2], g_out);
    }
    CHECK(same_as("gptref", "gptspare"), "GPT, rank 2 replaced: bitwise equal to the uninterrupted run");
    CHECK(same_as("gpttpref", "gpttpspare"), "GPT tensor = 2, rank 2 replaced: bitwise equal to the uninterrupted run");
}

// ZeRO: each rank keeps a copy of rank + 1's slice (parameters, optimizer
// state); the spare in a dead rank's place gets its slice from there.
static void test_zero(void) {
    char ref[64], name[64], extra[256];
    int rc, step;
    for (int z = 1; z <= 3; z++) {
        snprintf(ref, sizeof ref, "zref%d", z);
        snprintf(extra, sizeof extra, "--quiet --zero %d", z);
        rc = train(ref, extra);
        CHECK(rc == 0, "uninterrupted zero %d run: exit %d\n%s", z, rc, g_out);
        // Rank 1 killed in step 13: its slice comes from rank 0's copy.
        snprintf(name, sizeof name, "zspare%d", z);
        char once[32];
        snprintf(once, sizeof once, "once-z%d", z);
        faults("1:13:kill", once);
        snprintf(extra, sizeof extra, "--spares 1 --zero %d", z);
        rc = train(name, extra);
        no_faults();
        CHECK(rc == 0 && strstr(g_out, "killed by signal 9 (Killed) (in a training step after step 12); spare 0 (pid"),
              "zero %d, rank 1 killed, one spare: exit %d\n%s", z, rc, g_out);
        CHECK(spare_recovery(1, &step) >= 0 && step == 13, "zero %d: rank 1 recovered, step 13 redone, 0 lost:\n%s", z,
              g_out);
        CHECK(same_as(ref, name), "zero %d, rank 1 replaced: bitwise equal to the uninterrupted run", z);
    }

    // Rank 0 killed under zero 3 with checkpoints (ZeRO's are sharded:
    // every rank writes its slice), its slice from rank 2's copy; the new
    // rank 0 goes on writing them.
    faults("0:9:kill", "once-z0");
    rc = train("zspare0", "--spares 1 --zero 3 --checkpoint-every 5");
    no_faults();
    CHECK(rc == 0 && spare_recovery(0, &step) >= 0 && step == 9, "zero 3, rank 0 killed: exit %d\n%s", rc, g_out);
    CHECK(same_as("zref3", "zspare0"), "zero 3, rank 0 replaced: bitwise equal to the uninterrupted run");
    char **list;
    int n = 0;
    dt_status st = dt_ckpt_list(tmp("zspare0/checkpoints"), &list, &n);
    CHECK(st == DT_OK && n == 3 && strstr(list[0], "step-00000030"),
          "zero 3: the sharded checkpoints went on after rank 0's replacement (%d, newest %s)", n, n ? list[0] : "none");
    for (int i = 0; i < n; i++) free(list[i]);
    if (n) free(list);

    // Plain (not deterministic) zero 2, rank 2 killed: its slice from rank
    // 1's copy; the same ranks redo the same step, bitwise.
    rc = train("zrefdp", "--quiet --zero 2 --set parallel.deterministic=false");
    CHECK(rc == 0, "uninterrupted plain zero 2 run: exit %d\n%s", rc, g_out);
    faults("2:7:kill", "once-zdp");
    rc = train("zsparedp", "--spares 1 --zero 2 --set parallel.deterministic=false");
    no_faults();
    CHECK(rc == 0 && spare_recovery(2, &step) >= 0 && step == 7, "plain zero 2, rank 2 killed: exit %d\n%s", rc, g_out);
    CHECK(same_as("zrefdp", "zsparedp"), "plain zero 2, rank 2 replaced: bitwise equal to the uninterrupted run");

    // Ranks 1 and 2 killed at once: rank 2's slice was only on rank 1 (and
    // rank 1's own): not in memory any more. The run says so and restarts
    // from the newest checkpoint.
    faults("1:13:kill,2:13:kill", "once-ztwo");
    rc = train("ztwo", "--spares 2 --zero 1 --max-restarts 1 --checkpoint-every 5");
    no_faults();
    CHECK(rc == 0, "zero 1, two adjacent ranks killed at once: exit %d\n%s", rc, g_out);
    CHECK(strstr(g_out, "spares: rank 2's slice of the ZeRO state (optimizer step 12) is on no surviving rank: rank 1, "
                        "which kept its copy, died too") &&
              strstr(g_out, "restarting 3 workers from the newest checkpoint"),
          "zero 1: the lost slice named, then the restart from a checkpoint:\n%s", g_out);
    CHECK(same_as("zref1", "ztwo"), "zero 1, restarted from a checkpoint: bitwise equal to the uninterrupted run");
}

static void test_refused(void) {
    static const struct {
        const char *extra, *want;
    } bad[] = {
        {"--spares 1 --set parallel.deterministic=false --set compression.method=int8",
         "--spares with [compression] method: each rank's codec state (residuals) is its own"},
        {"--spares 1 --set parallel.deterministic=false --set parallel.sync_every=4",
         "--spares with [parallel] sync_every (local SGD): each rank's drift since the last average is its own"},
        {"--spares 1 --set parallel.pipeline=3 --zero 1", "--spares with model parallelism and [parallel] zero = 1"},
        {"--spares 1 --checkpoint-every 5 --checkpoint-sharded", "--spares with [checkpoint] sharded = true"},
        {"--spares 1 --servers 1 --set ps.mode=sync", "--spares: strategy ps is not supported"},
        {"--spares -1", "--spares"},
        {"--spares x", "--spares"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int rc = train("refused", bad[i].extra);
        CHECK(rc == 2 && strstr(g_out, bad[i].want), "%s: exit %d (expected 2) naming '%s':\n%s", bad[i].extra, rc,
              bad[i].want, g_out);
        CHECK(access(tmp("refused/metrics"), F_OK) != 0, "%s: no worker started", bad[i].extra);
    }
    // One worker has no survivor to take the state from; under another
    // launcher there are no spares.
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s train %s --workers 1 --spares 1 --run-dir %s 2>&1", tl_dtrain(), tmp("run.ini"),
             tmp("refused"));
    int rc = tl_run(cmd, g_out, sizeof g_out);
    CHECK(rc == 2 && strstr(g_out, "--spares: a spare takes the state of a surviving worker; it needs --workers 2 or more"),
          "--workers 1 --spares 1: exit %d\n%s", rc, g_out);
    snprintf(cmd, sizeof cmd, "%s run -n 2 -- %s train %s --spares 1 --run-dir %s 2>&1", tl_dtrain(), tl_dtrain(),
             tmp("run.ini"), tmp("refused"));
    rc = tl_run(cmd, g_out, sizeof g_out);
    CHECK(rc == 2 && strstr(g_out, "--spares: spares are dtrain's own launcher's"), "--spares under dtrain run: exit %d\n%s",
          rc, g_out);
}

// Model parallel: every rank of a tensor rank holds the same shard (T = 1:
// every rank the whole block), so the spare in a dead rank's place takes its
// shard from a twin and the stages' cut from a survivor, after every rank
// split the pipelines' and the shard groups' communicators again; bitwise
// equal to the uninterrupted run in each layout. (The tensor-parallel MLP has
// no dropout between its linear layers: tp.ini.)
static void test_model_parallel(void) {
    static const struct {
        const char *name, *ini, *layout;
        int workers, kill;
    } runs[] = {
        {"pp3", "run.ini", "--set parallel.pipeline=3", 3, 1},
        {"tp2", "tp.ini", "--set parallel.tensor=2", 4, 1},
        {"tp2pp2", "tp.ini", "--set parallel.tensor=2 --set parallel.pipeline=2", 4, 2},
    };
    for (size_t i = 0; i < sizeof runs / sizeof *runs; i++) {
        char cmd[4096], ref[64], spare[64], once[64];
        snprintf(ref, sizeof ref, "ref-%s", runs[i].name);
        snprintf(spare, sizeof spare, "spare-%s", runs[i].name);
        snprintf(once, sizeof once, "once-%s", runs[i].name);
        for (int k = 0; k < 2; k++) {
            char f[32];
            snprintf(f, sizeof f, "%d:13:kill", runs[i].kill);
            if (k) faults(f, once);
            snprintf(cmd, sizeof cmd, "%s train %s --workers %d %s --run-dir %s %s 2>&1", tl_dtrain(),
                     tmp(runs[i].ini), runs[i].workers, runs[i].layout, tmp(k ? spare : ref),
                     k ? "--spares 1" : "--quiet");
            int rc = tl_run(cmd, g_out, sizeof g_out);
            no_faults();
            CHECK(rc == 0, "%s %s: exit %d\n%s", runs[i].layout, k ? "with a spare" : "uninterrupted", rc, g_out);
        }
        int step;
        CHECK(spare_recovery(runs[i].kill, &step) >= 0 && step == 13, "%s: rank %d replaced, step 13 redone\n%s",
              runs[i].layout, runs[i].kill, g_out);
        CHECK(same_as(ref, spare), "%s, rank %d replaced: bitwise equal to the uninterrupted run", runs[i].layout,
              runs[i].kill);
    }
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s train %s --workers 3 --set parallel.tensor=3 --spares 1 --run-dir %s 2>&1",
             tl_dtrain(), tmp("tp.ini"), tmp("refused"));
    int rc = tl_run(cmd, g_out, sizeof g_out);
    CHECK(rc == 2 && strstr(g_out, "--spares with [parallel] tensor = 3 on 3 workers: each shard is on one worker alone"),
          "tensor = 3 on 3 workers with a spare: exit %d, refused by name\n%s", rc, g_out);
}

int main(void) {
    snprintf(g_tmp, sizeof g_tmp, "/tmp/dtrain-test-spares-XXXXXX");
    if (!mkdtemp(g_tmp)) return perror("mkdtemp"), 1;
    tl_make_images(g_tmp, "train", 243, 1);
    tl_make_images(g_tmp, "t10k", 100, 2);
    FILE *f = fopen(tmp("run.ini"), "w");
    fprintf(f, "%s[data]\ndir = %s\n", cfg, g_tmp);
    fclose(f);
    char tp[1024];  // the same without the dropout: tensor parallel splits linear layers with only relu between
    snprintf(tp, sizeof tp, "%s", cfg);
    char *drop = strstr(tp, "layer = dropout p=0.2\n");
    memmove(drop, drop + strlen("layer = dropout p=0.2\n"), strlen(drop + strlen("layer = dropout p=0.2\n")) + 1);
    f = fopen(tmp("tp.ini"), "w");
    fprintf(f, "%s[data]\ndir = %s\n", tp, g_tmp);
    fclose(f);
    test_refused();
    test_zero();
    test_replaced();
    test_start();
    test_gpt();
    test_model_parallel();
    tl_cleanup(g_tmp);
    return tl_finish();
}
