/*
 * test_comm_faults.c - failure behaviour of the communicator and the
 * launcher, end to end: a killed rank, mismatched arguments, a hung rank,
 * an abort, exit-status propagation, Ctrl-C, a missing program; and the
 * choice of backend (comm/registry.c) with its errors, in process.
 *
 * usage: test_comm_faults DTRUN COMM_WORKER
 */
#include "../testlib.h"
#include "dtrain/comm.h"
#include "dtrain/core.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *dtrun, *worker;
static char out[1 << 16];

static int run(const char *args, double *secs) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s %s", dtrun, args);
    double t0 = dt_now();
    int st = tl_run(cmd, out, sizeof out);
    if (secs) *secs = dt_now() - t0;
    return st;
}

/* Number of lines of out containing s. */
static int count_lines(const char *s) {
    int n = 0;
    for (const char *p = out; (p = strstr(p, s)); p += strlen(s)) n++;
    return n;
}

static void test_kill(int n) {
    char a[512];
    double t;
    snprintf(a, sizeof a, "-n %d -- %s kill", n, worker);
    int st = run(a, &t);
    CHECK(st == 128 + SIGKILL, "kill n=%d: exit status %d, expected %d (first failing rank)\n%s",
          n, st, 128 + SIGKILL, out);
    CHECK(t < 10.0, "kill n=%d: took %.1f s, expected the others to fail within 10 s", n, t);
    /* every survivor reports the dead rank, naming the op and sequence */
    CHECK(count_lines("got expected error: communication error") == n - 1,
          "kill n=%d: %d survivors reported the error, expected %d\n%s", n,
          count_lines("got expected error"), n - 1, out);
    char died[64];
    snprintf(died, sizeof died, "rank %d died", n - 1);
    CHECK(strstr(out, died) && strstr(out, "allreduce (seq"),
          "kill n=%d: message does not name the op/seq and the dead rank\n%s", n, out);
}

/* Spares (dtrun --spares K, dt_comm_rejoin): a rank killed inside a
 * 16 MiB allreduce is replaced, every rank rejoins, and the collectives
 * after it are right on survivors and newcomers alike. */
static void test_spares(void) {
    char a[512];
    double t;
    // two deaths in turn, the second of rank 0 (a newcomer of its own kind)
    snprintf(a, sizeof a, "--spares 2 -n 3 -- %s spare shm 2,0", worker);
    int st = run(a, &t);
    CHECK(st == 0 && strstr(out, "11 checks, 0 failed"), "spares: exit status %d, expected 0 and every check passed\n%s",
          st, out);
    CHECK(strstr(out, "run: rank 2 (pid") && strstr(out, "spare 0 (pid") && strstr(out, "takes its place (1 spare left)") &&
              strstr(out, "run: rank 0 (pid") && strstr(out, "takes its place (0 spares left)"),
          "spares: the launcher does not say who died and who took the place\n%s", out);
    CHECK(strstr(out, "rank 2 died and a new process took its place (generation 1)") &&
              strstr(out, "rank 0 died and a new process took its place (generation 2)"),
          "spares: the survivors' errors do not name the replaced rank\n%s", out);
    CHECK(count_lines("rejoined generation 1") == 2 && count_lines("rejoined generation 2") == 2 &&
              strstr(out, "rank 2 (newcomer): joined generation 1") && strstr(out, "rank 0 (newcomer): joined generation 2"),
          "spares: not every rank rejoined each generation\n%s", out);
    CHECK(t < 20, "spares: took %.1f s", t);
    // two ranks (the pipelined path's two-rank variant); the spare left is released
    snprintf(a, sizeof a, "--spares 2 -n 2 -- %s spare shm 1", worker);
    st = run(a, &t);
    CHECK(st == 0 && strstr(out, "11 checks, 0 failed") && strstr(out, "(1 spare left)"),
          "spares, 2 ranks: exit status %d\n%s", st, out);
    CHECK(t < 10, "spares, 2 ranks: the unused spare was not released at the end (%.1f s)", t);
    // no spare left for the second death: the group stops, the waiting ranks
    // fail at once naming the rank nobody replaces
    snprintf(a, sizeof a, "--spares 1 -n 3 -- %s spare shm 1,1", worker);
    st = run(a, &t);
    CHECK(st == 128 + SIGKILL, "no spare left: exit status %d, expected %d\n%s", st, 128 + SIGKILL, out);
    CHECK(count_lines("rejoin failed: rejoin on rank") == 2 && strstr(out, "rank 1 died (killed by signal 9: Killed) and no process will take its place"),
          "no spare left: the survivors do not say that nobody comes\n%s", out);
    CHECK(t < 10, "no spare left: took %.1f s, expected the survivors to fail at once", t);
    snprintf(a, sizeof a, "--spares -1 -n 2 -- %s spare shm 1", worker);
    CHECK(run(a, NULL) == 2 && strstr(out, "--spares"), "--spares -1: expected a usage error\n%s", out);
}

static void test_mismatch(void) {
    char a[512];
    snprintf(a, sizeof a, "-n 3 -- %s mismatch", worker);
    int st = run(a, NULL);
    CHECK(st == 4, "mismatch: exit status %d, expected 4\n%s", st, out);
    CHECK(count_lines("got expected error") == 3, "mismatch: not every rank reported it\n%s", out);
    CHECK(strstr(out, "argument mismatch") && strstr(out, "count=9") && strstr(out, "count=8") &&
              strstr(out, "seq 2"),
          "mismatch: message does not name both counts and the seq\n%s", out);
}

/* Check mode off: caught by the shm backend's always-on argument check. */
static void test_mismatch_fast(const char *mode, const char *needle) {
    char a[512];
    double t;
    snprintf(a, sizeof a, "-n 3 -- %s %s", worker, mode);
    int st = run(a, &t);
    CHECK(st == 4, "%s: exit status %d, expected 4\n%s", mode, st, out);
    CHECK(count_lines("got expected error") == 3, "%s: not every rank reported it\n%s", mode, out);
    CHECK(strstr(out, needle) != NULL, "%s: no '%s' in the messages\n%s", mode, needle, out);
    CHECK(t < 10.0, "%s: took %.1f s", mode, t);
}

static void test_hang(void) {
    char a[512];
    double t;
    snprintf(a, sizeof a, "-n 3 -- %s hang", worker);
    int st = run(a, &t);
    CHECK(st == 5, "hang: exit status %d, expected 5\n%s", st, out);
    CHECK(strstr(out, "timed out") && strstr(out, "ranks not arrived: 2"),
          "hang: message does not say timed out / which rank\n%s", out);
    CHECK(count_lines("got expected error") == 2, "hang: not every waiting rank reported\n%s", out);
}

/* Point to point: a peer that never comes, and one that dies. */
static void test_p2p(void) {
    char a[512];
    double t;
    snprintf(a, sizeof a, "-n 3 -- %s p2p_hang", worker);
    int st = run(a, &t);
    CHECK(st == 7, "p2p_hang: exit status %d, expected 7\n%s", st, out);
    /* both time out, or (on a busy machine) one does and the other gets
     * its abort first */
    CHECK(count_lines("got expected error") == 2 && strstr(out, "timed out after 0.5 s") &&
              strstr(out, "recv (1048576 x F32, peer 2)") && strstr(out, "ranks not arrived: 2") &&
              (strstr(out, "send (1048576 x F32, peer 2)") || strstr(out, "aborted the communicator")),
          "p2p_hang: the irecv and isend did not time out naming rank 2\n%s", out);
    snprintf(a, sizeof a, "-n 2 -- %s p2p_kill", worker);
    st = run(a, &t);
    CHECK(st == 128 + SIGKILL, "p2p_kill: exit status %d, expected %d\n%s", st, 128 + SIGKILL, out);
    CHECK(strstr(out, "recv (1048576 x F32, peer 1)") && strstr(out, "rank 1 died"),
          "p2p_kill: the irecv did not fail naming the dead rank\n%s", out);
    CHECK(t < 10.0, "p2p_kill: took %.1f s", t);
}

static void test_abort(void) {
    char a[512];
    snprintf(a, sizeof a, "-n 3 -- %s abort", worker);
    int st = run(a, NULL);
    CHECK(st == 6, "abort: exit status %d, expected 6\n%s", st, out);
    CHECK(count_lines("aborted") >= 3 && strstr(out, "test abort"),
          "abort: ranks did not report the abort with its reason\n%s", out);
}

static void test_launcher(void) {
    int st = run("-n 4 -- sh -c 'exit $(( DTRAIN_RANK == 2 ? 7 : 0 ))'", NULL);
    CHECK(st == 7, "launcher: exit status %d, expected 7 from rank 2\n%s", st, out);
    st = run("-n 3 -- sh -c 'echo rank=$DTRAIN_RANK size=$DTRAIN_WORLD_SIZE shm=${DTRAIN_SHM_NAME:+yes}'", NULL);
    CHECK(st == 0 && strstr(out, "rank=0 size=3 shm=yes") && strstr(out, "rank=2 size=3 shm=yes"),
          "launcher: environment not passed\n%s", out);
    st = run("-n 2 -- /nonexistent/program", NULL);
    CHECK(st == 127 && strstr(out, "cannot execute"), "launcher: missing program gave %d\n%s", st, out);
    st = run("-n 0 -- true", NULL);
    CHECK(st == 2 && strstr(out, "-n"), "launcher: -n 0 gave %d\n%s", st, out);
    st = run("-n 2", NULL);
    CHECK(st == 2 && strstr(out, "no program"), "launcher: no program gave %d\n%s", st, out);

    /* Ctrl-C: SIGINT to the launcher stops every rank. The signal is sent
     * once a rank has started (the launcher installs its handlers before
     * it forks), which the ranks show by creating a file. */
    char ready[64];
    snprintf(ready, sizeof ready, "/tmp/dtrain-test-ready-%d", (int)getpid());
    unlink(ready);
    char script[128];
    snprintf(script, sizeof script, "touch %s; exec sleep 100", ready);
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open("/dev/null", O_WRONLY);
        dup2(fd, 2);
        execl(dtrun, dtrun, "-n", "3", "--", "sh", "-c", script, (char *)NULL);
        _exit(99);
    }
    for (int i = 0; i < 1000 && access(ready, F_OK) != 0; i++) usleep(10000);
    unlink(ready);
    double t0 = dt_now();
    kill(pid, SIGINT);
    int ws;
    waitpid(pid, &ws, 0);
    double t = dt_now() - t0;
    CHECK(WIFEXITED(ws) && WEXITSTATUS(ws) == 128 + SIGINT,
          "launcher: after SIGINT exit status %d, expected %d", WEXITSTATUS(ws), 128 + SIGINT);
    CHECK(t < 5.0, "launcher: SIGINT took %.1f s to stop the ranks", t);
}

/* dt_comm_init with p (env DTRAIN_COMM_BACKEND = env_be, NULL: unset):
 * the status, and the error message or the backend's name. */
static dt_status init_with(const dt_comm_params *p, const char *env_be, char *what, size_t n) {
    if (env_be) setenv("DTRAIN_COMM_BACKEND", env_be, 1);
    else unsetenv("DTRAIN_COMM_BACKEND");
    dt_comm_t c = NULL;
    dt_status st = dt_comm_init(p, &c);
    snprintf(what, n, "%s", st == DT_OK ? dt_comm_backend(c) : dt_last_error());
    if (st == DT_OK) {
        CHECK(dt_comm_rank(c) == 0 && dt_comm_size(c) == 1, "backend choice: rank %d of %d, expected 0 of 1",
              dt_comm_rank(c), dt_comm_size(c));
        dt_comm_destroy(c);
    }
    unsetenv("DTRAIN_COMM_BACKEND");
    return st;
}

static void test_backend_choice(void) {
    char m[512];
    dt_comm_params p = dt_comm_default_params();
    unsetenv("DTRAIN_SHM_NAME");
    CHECK(!dt_comm_env_launched(), "backend choice: launched without a launcher's environment");
    CHECK(init_with(&p, NULL, m, sizeof m) == DT_OK && !strcmp(m, "shm"), "auto, no launcher: %s", m);
    CHECK(init_with(&p, "auto", m, sizeof m) == DT_OK && !strcmp(m, "shm"), "DTRAIN_COMM_BACKEND=auto: %s", m);
    CHECK(init_with(&p, "", m, sizeof m) == DT_OK && !strcmp(m, "shm"), "DTRAIN_COMM_BACKEND empty: %s", m);
    CHECK(init_with(&p, "bogus", m, sizeof m) == DT_ERR_CONFIG &&
              !strcmp(m, "DTRAIN_COMM_BACKEND=bogus: expected shm, mpi, hier or auto"),
          "unknown backend in the environment: %s", m);
    p.backend = "nccl";
    CHECK(init_with(&p, "shm", m, sizeof m) == DT_ERR_CONFIG &&
              !strcmp(m, "backend=nccl: expected shm, mpi, hier or auto"),
          "unknown backend in the params (which win over the environment): %s", m);
    p.backend = "shm";
    CHECK(init_with(&p, "bogus", m, sizeof m) == DT_OK && !strcmp(m, "shm"), "params' shm over the environment: %s", m);
    p.rank = 1;
    p.size = 2;
    CHECK(init_with(&p, NULL, m, sizeof m) == DT_ERR_CONFIG &&
              strstr(m, "rank 1 of 2: a world of more than one rank needs a shared-memory segment"),
          "two ranks without a segment: %s", m);
    p.shm_name = "/dtrain-test-no-such-segment";
    p.rank = 2;
    CHECK(init_with(&p, NULL, m, sizeof m) == DT_ERR_CONFIG && strstr(m, "rank 2 of 2") &&
              strstr(m, "expected 0 <= rank < size"),
          "rank outside the world: %s", m);
    setenv("DTRAIN_SHM_NAME", "/dtrain-test-no-such-segment", 1);
    CHECK(dt_comm_env_launched(), "DTRAIN_SHM_NAME set: not seen as launched");
    unsetenv("DTRAIN_SHM_NAME");
    p = dt_comm_default_params();
    // An srun step of several tasks without MPI's environment (srun --mpi=none)
    setenv("SLURM_STEP_NUM_TASKS", "4", 1);
    CHECK(init_with(&p, NULL, m, sizeof m) == DT_ERR_CONFIG && strstr(m, "SLURM_STEP_NUM_TASKS=4: srun started 4 tasks") &&
              strstr(m, "srun --mpi=pmix"),
          "srun step of 4 tasks without MPI: %s", m);
    CHECK(init_with(&p, "shm", m, sizeof m) == DT_OK && !strcmp(m, "shm"), "srun step, shm forced: %s", m);
    setenv("SLURM_STEP_NUM_TASKS", "1", 1);
    CHECK(init_with(&p, NULL, m, sizeof m) == DT_OK && !strcmp(m, "shm"), "srun step of 1 task: %s", m);
    unsetenv("SLURM_STEP_NUM_TASKS");
    // With MPI, mpi and hier need mpirun: the comm_mpi_* and comm_hier_* tests.
#ifndef DTRAIN_HAVE_MPI
    p.backend = "mpi";
    CHECK(init_with(&p, NULL, m, sizeof m) == DT_ERR_CONFIG &&
              !strcmp(m, "backend mpi: this libdtrain was built without MPI"),
          "mpi without MPI: %s", m);
    p.backend = NULL;
    CHECK(init_with(&p, "hier", m, sizeof m) == DT_ERR_CONFIG &&
              !strcmp(m, "backend hier: this libdtrain was built without MPI"),
          "hier without MPI: %s", m);
#endif
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: test_comm_faults DTRUN COMM_WORKER\n");
        return 2;
    }
    dtrun = argv[1];
    worker = argv[2];
    test_backend_choice();
    test_kill(2);
    test_kill(4);
    test_spares();
    test_mismatch();
    test_mismatch_fast("mismatch_fast", "count=8200");
    test_mismatch_fast("mismatch_dtype", "dtype=I32");
    test_hang();
    test_abort();
    test_p2p();
    test_launcher();
    return tl_finish();
}
