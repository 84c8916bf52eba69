/* Supervision of a run by `dtrain train --workers N`:
 *
 *   1. The hung rank is the one named: SIGSTOP of rank 1 (2 and 3 workers)
 *      is reported within the heartbeat timeout as rank 1 hung, with the
 *      collective the other ranks wait in; rank 1 is the one killed.
 *   2. One run per run directory: a second run on a directory in use is
 *      refused with the first's PID (with and without --workers) and the
 *      first finishes unaffected; the lock of a run killed with SIGKILL
 *      does not block the next; a run that fails leaves no summary.json of
 *      an earlier run that would look like its own; in a group of
 *      `dtrain run` or mpirun, rank 0 holds the lock and a refused group's
 *      other ranks write nothing.
 *   3. Ctrl-C is the user's stop, never a failure to repair: one SIGINT to
 *      `dtrain train --workers 2 --max-restarts 3` makes every worker
 *      checkpoint and stop at the end of its step, one line names the step
 *      and the checkpoint, the exit status is 130 and nothing restarts; two
 *      stop it at once; the same with a parameter server.
 *   4. A death after the last step (in the final evaluation) names where
 *      the rank was, rank 0 writes the trained weights anyway (bitwise the
 *      uninterrupted run's), and the newest checkpoint is named. */
#include "dtrain/core.h"
#include "testlib.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static char g_tmp[256];
static char g_out[1 << 16];

static const char *tmp(const char *name) { return tl_path(g_tmp, name); }

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

/* Starts `dtrain train run.ini ARGS --run-dir tmp(dir)` in the background,
 * its output in tmp(log); returns its PID (the dtrain process itself). */
static pid_t start(const char *dir, const char *args, const char *log) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "exec %s train %s --quiet --run-dir %s %s >%s 2>&1", tl_dtrain(), tmp("run.ini"),
             tmp(dir), args, tmp(log));
    pid_t pid = fork();
    if (pid == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    return pid;
}

/* Waits up to `seconds` for pid; its exit status, or -1 (then it is killed). */
static int finish(pid_t pid, double seconds) {
    int st = 0;
    for (double t0 = now(); now() - t0 < seconds;) {
        if (waitpid(pid, &st, WNOHANG) == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        usleep(20000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
    return -1;
}

/* Waits until rank `rank` of the run in tmp(dir) has logged `steps` steps. */
static int wait_steps(const char *dir, int rank, int steps) {
    char path[600];
    snprintf(path, sizeof path, "%s/metrics/rank-%05d.jsonl", tmp(dir), rank);
    for (double t0 = now(); now() - t0 < 60;) {
        if (tl_count(path, "\"type\":\"step\"") >= steps) return 1;
        usleep(20000);
    }
    return 0;
}

// ---------------------------------------------------------------------------
// 1: the hung rank is the one named

static void test_hung_rank(int workers) {
    char dir[32], log[32], args[128];
    snprintf(dir, sizeof dir, "hang%d", workers);
    snprintf(log, sizeof log, "hang%d.log", workers);
    snprintf(args, sizeof args, "--workers %d --heartbeat-timeout 3 --set train.max_steps=1000000", workers);
    setenv("DTRAIN_SLOW_RANK", "0:5", 1);  // a step every 5 ms or so, not a busy loop
    pid_t sup = start(dir, args, log);
    unsetenv("DTRAIN_SLOW_RANK");
    int started = wait_steps(dir, 1, 5);
    pid_t r1 = tl_rank_pid(sup, 1);
    CHECK(started && r1 > 0, "%d workers: rank 1 running (pid %d)", workers, (int)r1);
    if (r1 > 0) kill(r1, SIGSTOP);
    int rc = finish(sup, 60);  // (a hang guard)
    char *out = tl_read_file(tmp(log), NULL);
    if (!out) out = calloc(1, 1);
    const char *line = strstr(out, "sent no heartbeat");
    char want[64];
    snprintf(want, sizeof want, "rank 1 (pid %d) sent no heartbeat", (int)r1);
    CHECK(rc == 1, "%d workers, rank 1 stopped: exit %d, expected 1\n%s", workers, rc, out);
    CHECK(strstr(out, want) != NULL, "%d workers: rank 1 named as hung ('%s'):\n%s", workers, want, out);
    // Found by its heartbeats: the silence named is the timeout's, at least.
    double quiet = -1;
    if (line) sscanf(line, "sent no heartbeat for %lf s", &quiet);
    CHECK(quiet >= 3, "%d workers: rank 1 named after %.1f s without a heartbeat (the timeout: 3 s)", workers, quiet);
    // The others wait in a collective for rank 1, and say so.
    // (the gradients' allreduce, or the allgather of the step's metrics)
    const char *waits = workers == 2 ? "; rank 0 waits in " : "; ranks 0, 2 wait in ";
    const char *in = line ? strstr(line, waits) : NULL, *op = in ? in + strlen(waits) : "";
    CHECK(in && (!strncmp(op, "allreduce (seq ", 15) || !strncmp(op, "allgather (seq ", 15)) &&
              strstr(op, ") for rank 1; stopping all ranks"),
          "%d workers: the message names the collective the others wait in ('%s... for rank 1'):\n%s", workers,
          waits, out);
    CHECK(!strstr(out, "rank 0 (pid") && strstr(out, "rank 1 died (killed by signal 9"),
          "%d workers: rank 1 is killed, not rank 0:\n%s", workers, out);
    if (r1 > 0) kill(r1, SIGCONT);  // (it is gone; a no-op unless the check above failed)
    free(out);
}

// ---------------------------------------------------------------------------
// 2: one run per run directory

static void test_lock(void) {
    // A first run, slowed down so that it is still running for the second.
    setenv("DTRAIN_SLOW_RANK", "0:10", 1);
    pid_t first = start("busy", "--workers 2 --set train.max_steps=200", "busy.log");
    int started = wait_steps("busy", 0, 3);
    unsetenv("DTRAIN_SLOW_RANK");
    CHECK(started, "first run started");
    char cmd[2048], want[64];
    snprintf(want, sizeof want, "in use by another dtrain run (pid %d)", (int)first);
    static const char *second[] = {"--workers 2", "", "--workers 3 --max-restarts 2"};
    for (int i = 0; i < 3; i++) {
        snprintf(cmd, sizeof cmd, "%s train %s --quiet --run-dir %s %s", tl_dtrain(), tmp("run.ini"), tmp("busy"),
                 second[i]);
        int rc = tl_run(cmd, g_out, sizeof g_out);
        CHECK(rc == 1 && strstr(g_out, want) && strstr(g_out, tmp("busy")),
              "second run (%s) on a directory in use: exit %d, expected 1 naming the directory and '%s':\n%s",
              second[i], rc, want, g_out);
    }
    int rc = finish(first, 120);
    char *log = tl_read_file(tmp("busy.log"), NULL);
    CHECK(rc == 0, "the first run finished: exit %d\n%s", rc, log ? log : "");
    free(log);
    char path[600];
    snprintf(path, sizeof path, "%s/metrics/rank-00000.jsonl", tmp("busy"));
    int steps = tl_count(path, "\"type\":\"step\""), runs = tl_count(path, "\"type\":\"run\"");
    CHECK(steps == 200 && runs == 1, "the first run's metrics log alone: %d run records, %d steps", runs, steps);
    snprintf(path, sizeof path, "%s/summary.json", tmp("busy"));
    char *sum = tl_read_file(path, NULL);
    CHECK(sum && strstr(sum, "\"steps\":\t200,"), "the first run's summary.json: %s", sum ? sum : "(none)");
    free(sum);

    // A run killed with SIGKILL leaves its lock file, not its lock.
    setenv("DTRAIN_SLOW_RANK", "0:5", 1);
    pid_t killed = start("killed", "--workers 2 --set train.max_steps=1000000", "killed.log");
    unsetenv("DTRAIN_SLOW_RANK");
    CHECK(wait_steps("killed", 0, 3), "run to be killed started");
    kill(killed, SIGKILL);
    finish(killed, 10);
    snprintf(path, sizeof path, "%s/.lock", tmp("killed"));
    char *holder = tl_read_file(path, NULL);
    CHECK(holder && atoi(holder) == (int)killed, "the lock file holds the killed run's PID %d: %s", (int)killed,
          holder ? holder : "(none)");
    free(holder);
    snprintf(cmd, sizeof cmd, "%s train %s --quiet --workers 2 --set train.max_steps=20 --run-dir %s", tl_dtrain(),
             tmp("run.ini"), tmp("killed"));
    rc = tl_run(cmd, g_out, sizeof g_out);
    CHECK(rc == 0, "a stale lock of a killed run does not block: exit %d\n%s", rc, g_out);

    // A run that fails does not leave the previous run's summary in place.
    snprintf(path, sizeof path, "%s/summary.json", tmp("again"));
    for (int workers = 1; workers <= 2; workers++) {
        snprintf(cmd, sizeof cmd, "%s train %s --quiet --workers %d --set train.max_steps=10 --run-dir %s",
                 tl_dtrain(), tmp("run.ini"), workers, tmp("again"));
        rc = tl_run(cmd, g_out, sizeof g_out);
        size_t n_ok = 0;
        char *ok = tl_read_file(path, &n_ok);
        CHECK(rc == 0 && ok, "%d worker(s): a successful run writes summary.json: exit %d\n%s", workers, rc, g_out);
        setenv("DTRAIN_FAULT_STEP", "0:4", 1);
        rc = tl_run(cmd, g_out, sizeof g_out);
        unsetenv("DTRAIN_FAULT_STEP");
        CHECK(rc == 1 && strstr(g_out, "injected fault"), "%d worker(s): failing run: exit %d\n%s", workers, rc,
              g_out);
        struct stat sb;
        CHECK(stat(path, &sb) != 0, "%d worker(s): after a failed run there is no summary.json", workers);
        char prev[600];
        snprintf(prev, sizeof prev, "%s/summary.previous.json", tmp("again"));
        size_t n_prev = 0;
        char *old = tl_read_file(prev, &n_prev);
        CHECK(ok && old && n_ok == n_prev && !memcmp(ok, old, n_ok),
              "%d worker(s): the earlier run's summary is kept as summary.previous.json", workers);
        free(ok);
        free(old);
    }
}

// Groups started by another launcher: rank 0 takes the lock, the other
// ranks neither take it nor touch the directory before rank 0 holds it.
static void test_lock_launched(void) {
    char run[1200], mpi[1200];
    snprintf(run, sizeof run, "%s run -n 2 --", tl_dtrain());
    snprintf(mpi, sizeof mpi, "mpirun --allow-run-as-root --oversubscribe -np 2");
    const char *launchers[] = {run, mpi};
    int nl = system("command -v mpirun >/dev/null 2>&1") == 0 ? 2 : 1;
    CHECK(nl == 2, "mpirun is not installed (scripts/install-deps.sh installs it): only 'dtrain run' was tested");
    for (int i = 0; i < nl; i++) {
        const char *dir = i ? "held-mpi" : "held-run";
        setenv("DTRAIN_SLOW_RANK", "0:10", 1);
        pid_t holder = start(dir, "--set train.max_steps=300", i ? "held-mpi.log" : "held-run.log");
        int started = wait_steps(dir, 0, 3);
        unsetenv("DTRAIN_SLOW_RANK");
        CHECK(started, "%s: the single-process run holding the directory started", dir);
        char cmd[4096], want[64], path[600];
        snprintf(cmd, sizeof cmd, "%s %s train %s -q --set train.max_steps=20 --run-dir %s", launchers[i],
                 tl_dtrain(), tmp("run.ini"), tmp(dir));
        snprintf(want, sizeof want, "in use by another dtrain run (pid %d)", (int)holder);
        int rc = tl_run(cmd, g_out, sizeof g_out);
        CHECK(rc != 0 && strstr(g_out, want), "%s: a 2-rank group on a directory in use: exit %d, expected '%s':\n%s",
              launchers[i], rc, want, g_out);
        snprintf(path, sizeof path, "%s/metrics/rank-00001.jsonl", tmp(dir));
        struct stat sb;
        CHECK(stat(path, &sb) != 0, "%s: the refused group's rank 1 wrote nothing into the directory", launchers[i]);
        rc = finish(holder, 120);
        CHECK(rc == 0, "%s: the holder finished: exit %d", dir, rc);
        rc = tl_run(cmd, g_out, sizeof g_out);
        CHECK(rc == 0 && strstr(g_out, "2 workers"), "%s: once free, the group runs (rank 1 not refused): exit %d\n%s",
              launchers[i], rc, g_out);
    }
}

// ---------------------------------------------------------------------------
// 3: Ctrl-C stops the run; it is never restarted

static void test_interrupt(const char *dir, const char *args, int twice) {
    char log[64], path[700];
    snprintf(log, sizeof log, "%s.log", dir);
    setenv("DTRAIN_SLOW_RANK", "*:20", 1);
    pid_t pid = start(dir, args, log);
    unsetenv("DTRAIN_SLOW_RANK");
    int going = wait_steps(dir, 0, 3);
    kill(pid, SIGINT);
    if (twice) kill(pid, SIGINT);
    int rc = finish(pid, 90);
    char *out = tl_read_file(tmp(log), NULL);
    const char *at = out ? strstr(out, "stopped at step ") : NULL;
    long step = at ? atol(at + 16) : -1;
    snprintf(path, sizeof path, "%s/checkpoints/step-%08ld.safetensors", tmp(dir), step);
    int ckpt = step > 0 && (access(path, F_OK) == 0 || (path[strlen(path) - 12] = 0, access(path, F_OK) == 0));
    CHECK(going && rc == 130 && out && !strstr(out, "restarting") && !strstr(out, "server -1") &&
              (twice || (ckpt && strstr(out, "(checkpoint ") && strstr(out, "continue with --resume auto"))),
          "%s: SIGINT%s: exit %d (expected 130), %s, no restart\n%s", args, twice ? " twice" : "", rc,
          twice ? "stopped" : "the step and its checkpoint named", out ? out : "(no log)");
    free(out);
}

// A worker killed by its memory cgroup's out-of-memory killer is told apart
// from any other SIGKILL (the launcher names it, the cap and the use): a
// child caps itself at 64 MiB (dt_mem_cap) and touches 512 MiB.
static void test_oom_kill(void) {
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        char how[256];
        // ("cgroup v2 DIR (...)"; the fallback, "RLIMIT_DATA (...; no memory cgroup ...)", is no cgroup)
        if (dt_mem_cap(64u << 20, how, sizeof how) != DT_OK || strncmp(how, "cgroup ", 7)) _exit(77);
        size_t n = 512u << 20;
        volatile char *p = malloc(n);
        for (size_t i = 0; p && i < n; i += 4096) p[i] = 1;
        _exit(0);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    if (WIFEXITED(st) && WEXITSTATUS(st) == 77) {
        tl_skip("the out-of-memory report: no memory cgroup can be made here");
        return;
    }
    char why[256] = "";
    int oom = dt_mem_cap_oom((long)pid, why, sizeof why);
    CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL && oom && strstr(why, "out-of-memory killer") &&
              strstr(why, "64.00 MiB"),
          "a child over its 64 MiB cap: killed by SIGKILL (%d), told as its cgroup's OOM kill: %s", st, why);
    printf("out of memory: %s\n", why);
    char ok[256];
    CHECK(dt_mem_cap_oom((long)getpid(), ok, sizeof ok) == 0, "a process without an OOM kill is not one");
    // A process killed by the limit of a cgroup it did not make (a
    // container's): told from the kernel's log, where it is readable.
    if (access("/dev/kmsg", R_OK) != 0) {
        printf("out of memory in a cgroup around the run: not tested (/dev/kmsg is not readable here)\n");
        return;
    }
    int fds[2];
    if (pipe(fds) != 0) return;
    fflush(NULL);
    pid = fork();
    if (pid == 0) {  // caps itself, then its child (in the same cgroup, not its own) goes over
        char how[256], line[256] = "";
        if (dt_mem_cap(64u << 20, how, sizeof how) != DT_OK) _exit(77);
        pid_t g = fork();
        if (g == 0) {
            size_t m = 512u << 20;
            volatile char *q = malloc(m);
            for (size_t i = 0; q && i < m; i += 4096) q[i] = 1;
            _exit(0);
        }
        int gs = 0;
        waitpid(g, &gs, 0);
        int said = dt_mem_cap_oom((long)g, line, sizeof line);
        if (write(fds[1], line, strlen(line) + 1) < 0) _exit(3);
        _exit(said ? 0 : 1);
    }
    close(fds[1]);
    char line[256] = "";
    ssize_t got = read(fds[0], line, sizeof line - 1);
    close(fds[0]);
    line[got > 0 ? got : 0] = 0;
    waitpid(pid, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0 && strstr(line, "a memory cgroup around the run"),
          "a kill by a cgroup around the run, told from the kernel's log: %s", line);
}

// ---------------------------------------------------------------------------
// 4: a death after the last step: named with where the rank was, the
// trained weights written anyway by rank 0, the checkpoint to go on from

static void test_end_death(void) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s train %s --quiet --workers 2 --set train.max_steps=6 --checkpoint-every 2 --run-dir %s",
             tl_dtrain(), tmp("run.ini"), tmp("end-ok"));
    CHECK(tl_run(cmd, g_out, sizeof g_out) == 0, "the uninterrupted run: %s", g_out);
    snprintf(cmd, sizeof cmd, "DTRAIN_FAULT_STEP=1:6:kill:eval %s train %s --quiet --workers 2 --set train.max_steps=6 "
             "--checkpoint-every 2 --run-dir %s", tl_dtrain(), tmp("run.ini"), tmp("end-dead"));
    int rc = tl_run(cmd, g_out, sizeof g_out), bw = 0;
    char ck[700];
    snprintf(ck, sizeof ck, "the newest checkpoint is %s/checkpoints/step-00000004", tmp("end-dead"));
    CHECK(rc == 1 && strstr(g_out, "rank 1") && strstr(g_out, "(in an evaluation after step 6)") &&
              strstr(g_out, "rank 0 wrote the trained weights of step 6") && strstr(g_out, ck),
          "rank 1 killed in the last evaluation: exit %d, where it was, the weights and the checkpoint named\n%s", rc,
          g_out);
    double d = tl_runs_diff(g_tmp, "end-dead", "end-ok", &bw);
    CHECK(d >= 0 && bw, "the weights written after the death are the trained ones (max rel diff %.3g)", d);
}

// `test_supervise oom` (ctest test_supervise_oom) runs the out-of-memory
// report alone: it needs a memory cgroup, and is reported skipped where
// none can be made.
int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "oom")) {
        test_oom_kill();
        return tl_finish();
    }
    snprintf(g_tmp, sizeof g_tmp, "/tmp/dtrain-test-supervise-XXXXXX");
    if (!mkdtemp(g_tmp)) return perror("mkdtemp"), 1;
    tl_make_images(g_tmp, "train", 243, 1);
    tl_make_images(g_tmp, "t10k", 100, 2);
    FILE *f = fopen(tmp("run.ini"), "w");
    if (!f) return perror("run.ini"), 1;
    fprintf(f,
            "[model]\ninput = 784\nlayer = linear out=32\nlayer = relu\nlayer = linear out=10\n"
            "[optim]\nname = adamw\nlr = 0.003\n[train]\nbatch = 40\nepochs = 0\nmax_steps = 30\n"
            "eval_batch = 100\nseed = 5\nthreads = 1\n[data]\ndir = %s\n",
            g_tmp);
    fclose(f);
    test_hung_rank(2);
    test_hung_rank(3);
    test_lock();
    test_lock_launched();
    const char *sup = "--workers 2 --max-restarts 3 --checkpoint-every 50 --set train.max_steps=100000";
    test_interrupt("int", sup, 0);
    test_interrupt("int2", sup, 1);
    test_interrupt("int-ps", "--workers 2 --servers 1 --set ps.mode=async --max-restarts 3 --set train.max_steps=100000",
                   0);
    test_end_death();
    tl_cleanup(g_tmp);
    return tl_finish();
}
