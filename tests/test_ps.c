/* Parameter servers around the strategy table (whose "ps" rows compare
 * mode sync with plain data parallel; docs/parameter-server.md):
 * checkpoints (a run resumed on other server and worker counts, and one
 * restarted after a killed worker, bitwise equal to an uninterrupted one
 * process run), pushes of the wrong step, version or shape refused with an
 * error naming the server, the worker, the field and what was expected,
 * and the config errors.
 *
 * The data is the small synthetic IDX set of the C tests. */
#include "dtrain/core.h"
#include "testlib.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char g_tmp[256];
static char g_out[1 << 16];

static const char *cfg =
    "[model]\ninput = 784\nlayer = linear out=64\nlayer = relu\nlayer = linear out=32\nlayer = gelu\n"
    "layer = linear out=10\n[optim]\nname = adamw\nlr = 0.002\n[train]\nbatch = 40\nepochs = 3\neval_batch = 100\n"
    "seed = 3\n";

// Trains TMP/mlp.ini into TMP/name with the flags (and environment
// assignments before the command); the exit code, the output in g_out.
static int train(const char *env, const char *name, const char *flags) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s %s train %s/mlp.ini --quiet --run-dir %s/%s %s", env, tl_dtrain(), g_tmp, g_tmp, name,
             flags);
    return tl_run(cmd, g_out, sizeof g_out);
}

static int same(const char *a, const char *b) {
    char pa[600], pb[600];
    int bw = 0;
    snprintf(pa, sizeof pa, "%s/%s/model.safetensors", g_tmp, a);
    snprintf(pb, sizeof pb, "%s/%s/model.safetensors", g_tmp, b);
    return tl_weights_diff(pa, pb, &bw) >= 0 && bw;
}

static void checkpoints(void) {
    int rc = train("", "one", "--deterministic");
    CHECK(rc == 0, "one deterministic process: exit %d\n%s", rc, g_out);
    // 2 servers, 2 workers, a checkpoint every 5 steps (AdamW: the state the
    // servers hold goes into them).
    rc = train("", "ps22", "--deterministic --workers 2 --servers 2 --checkpoint-every 5");
    CHECK(rc == 0 && same("one", "ps22"), "2 servers x 2 workers, checkpoints: exit %d, bitwise one process's\n%s", rc,
          g_out);
    char flags[1024];
    snprintf(flags, sizeof flags, "--deterministic --workers 3 --servers 1 --resume %s/ps22/checkpoints/step-00000015.safetensors",
             g_tmp);
    rc = train("", "ps13", flags);
    CHECK(rc == 0 && same("one", "ps13"), "resumed at step 15 on 1 server x 3 workers: exit %d, bitwise\n%s", rc, g_out);
    // Sharded checkpoints, resumed on 3 servers and one worker.
    rc = train("", "ps22s", "--deterministic --workers 2 --servers 2 --checkpoint-every 5 --checkpoint-sharded");
    snprintf(flags, sizeof flags, "--deterministic --workers 1 --servers 3 --resume %s/ps22s/checkpoints/step-00000015",
             g_tmp);
    if (rc == 0) rc = train("", "ps31", flags);
    CHECK(rc == 0 && same("one", "ps31"), "sharded, resumed at step 15 on 3 servers x 1 worker: exit %d, bitwise\n%s", rc,
          g_out);
    // Worker 1 killed at step 8: the group restarts from step 5's checkpoint.
    char env[600];
    snprintf(env, sizeof env, "DTRAIN_FAULT_STEP=1:8:kill DTRAIN_FAULT_ONCE=%s/once", g_tmp);
    rc = train(env, "killed", "--deterministic --workers 2 --servers 2 --checkpoint-every 5 --max-restarts 1");
    CHECK(rc == 0 && strstr(g_out, "restarting") && same("one", "killed"),
          "a killed worker, restarted from the checkpoint: exit %d, bitwise\n%s", rc, g_out);
}

// DTRAIN_FAULT_PUSH=WORKER:STEP:FIELD makes that worker's pushes of that
// step wrong in that field.
static void refused(void) {
    static const struct {
        const char *field, *text;
    } cases[] = {
        {"step", "refused a push from worker 1 at step 3: step 4, expected step 3"},
        {"version", "refused a push from worker 1 at step 3: computed from weights version 1, expected version 2"},
        {"shape", "refused a push from worker 1 at step 3: shape: elements ["},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char env[128];
        snprintf(env, sizeof env, "DTRAIN_FAULT_PUSH=1:3:%s", cases[i].field);
        double t0 = dt_now();
        int rc = train(env, "refused", "--workers 2 --servers 2");
        CHECK(rc == 1 && strstr(g_out, cases[i].text) && strstr(g_out, "server "),
              "a push of the wrong %s: exit %d, the error names it (%s)\n%s", cases[i].field, rc, cases[i].text, g_out);
        CHECK(dt_now() - t0 < 60, "the run stops at once (%.1f s)", dt_now() - t0);
    }
}

static void config_errors(void) {
    static const struct {
        const char *flags, *text;
        int rc;
    } cases[] = {
        {"--servers 1 --zero 1", "[parallel] servers and [parallel] zero cannot be combined", 2},
        {"--servers 1 --set parallel.sync_every=2", "[parallel] servers and [parallel] sync_every cannot be combined", 2},
        {"--servers 1 --set compression.method=fp16", "[compression] method works with plain data parallel only", 2},
        {"--servers -1", "--servers", 2},
        {"--servers 1 --set ps.mode=fast", "[ps] mode", 2},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        int rc = train("", "bad", cases[i].flags);
        CHECK(rc == cases[i].rc && strstr(g_out, cases[i].text), "%s: exit %d (expected %d), names '%s'\n%s",
              cases[i].flags, rc, cases[i].rc, cases[i].text, g_out);
    }
    // Under a launcher that started no server rank besides the one worker.
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s run -n 1 -- %s train %s/mlp.ini --quiet --run-dir %s/bad1 --servers 1", tl_dtrain(),
             tl_dtrain(), g_tmp, g_tmp);
    int rc = tl_run(cmd, g_out, sizeof g_out);
    CHECK(rc != 0 && strstr(g_out, "none is left to train"), "1 rank, 1 server: exit %d\n%s", rc, g_out);
}

int main(void) {
    snprintf(g_tmp, sizeof g_tmp, "/tmp/dtrain-test-ps-XXXXXX");
    if (!mkdtemp(g_tmp)) return perror("mkdtemp"), 1;
    tl_make_images(g_tmp, "train", 243, 1);
    tl_make_images(g_tmp, "t10k", 100, 2);
    char path[512];
    snprintf(path, sizeof path, "%s/mlp.ini", g_tmp);
    FILE *f = fopen(path, "w");
    fprintf(f, "%s[data]\ndir = %s\n", cfg, g_tmp);
    fclose(f);
    checkpoints();
    refused();
    config_errors();
    tl_cleanup(g_tmp);
    return tl_finish();
}
