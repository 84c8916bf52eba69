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

/* Runs dtrun with args; the output is in `out`. That a failure is seen at
 * once is shown by what the ranks say (the dead rank or the mismatch named,
 * and no "timed out": a failure found only by a communicator's timeout, 300
 * s by default and 30 s where the worker sets one, says so), never by the
 * clock; a hang is ctest's timeout. */
static int run(const char *args) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s %s", dtrun, args);
    return tl_run(cmd, out, sizeof out);
}

/* Number of lines of out containing s. */
static int count_lines(const char *s) {
    int n = 0;
    for (const char *p = out; (p = strstr(p, s)); p += strlen(s)) n++;
    return n;
}

static void test_kill(int n) {
    char a[512];
    snprintf(a, sizeof a, "-n %d -- %s kill", n, worker);
    int st = run(a);
    CHECK(st == 128 + SIGKILL, "kill n=%d: exit status %d, expected %d (first failing rank)\n%s",
          n, st, 128 + SIGKILL, out);
    CHECK(!strstr(out, "timed out"), "kill n=%d: the others timed out instead of seeing the death\n%s", n, out);
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
    // two deaths in turn, the second of rank 0 (a newcomer of its own kind)
    snprintf(a, sizeof a, "--spares 2 -n 3 -- %s spare shm 2,0", worker);
    int st = run(a);
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
    CHECK(!strstr(out, "timed out"), "spares: a rank timed out\n%s", out);
    // two ranks (the pipelined path's two-rank variant); the spare left is released
    snprintf(a, sizeof a, "--spares 2 -n 2 -- %s spare shm 1", worker);
    st = run(a);
    CHECK(st == 0 && strstr(out, "11 checks, 0 failed") && strstr(out, "(1 spare left)"),
          "spares, 2 ranks: exit status %d\n%s", st, out);
    // released, the spare says so and exits 0 (not killed after a grace)
    CHECK(count_lines("comm_worker spare: released") == 1, "spares, 2 ranks: the unused spare was not released at the end\n%s",
          out);
    // no spare left for the second death: the group stops, the waiting ranks
    // fail at once naming the rank nobody replaces
    snprintf(a, sizeof a, "--spares 1 -n 3 -- %s spare shm 1,1", worker);
    st = run(a);
    CHECK(st == 128 + SIGKILL, "no spare left: exit status %d, expected %d\n%s", st, 128 + SIGKILL, out);
    CHECK(count_lines("rejoin failed: rejoin on rank") == 2 && strstr(out, "rank 1 died (killed by signal 9: Killed) and no process will take its place"),
          "no spare left: the survivors do not say that nobody comes\n%s", out);
    CHECK(!strstr(out, "timed out"), "no spare left: the survivors timed out instead of failing at once\n%s", out);
    snprintf(a, sizeof a, "--spares -1 -n 2 -- %s spare shm 1", worker);
    CHECK(run(a) == 2 && strstr(out, "--spares"), "--spares -1: expected a usage error\n%s", out);
}

static void test_mismatch(void) {
    char a[512];
    snprintf(a, sizeof a, "-n 3 -- %s mismatch", worker);
    int st = run(a);
    CHECK(st == 4, "mismatch: exit status %d, expected 4\n%s", st, out);
    CHECK(count_lines("got expected error") == 3, "mismatch: not every rank reported it\n%s", out);
    CHECK(strstr(out, "argument mismatch") && strstr(out, "count=9") && strstr(out, "count=8") &&
              strstr(out, "seq 2"),
          "mismatch: message does not name both counts and the seq\n%s", out);
}

/* Check mode off: caught by the shm backend's always-on argument check. */
static void test_mismatch_fast(const char *mode, const char *needle) {
    char a[512];
    snprintf(a, sizeof a, "-n 3 -- %s %s", worker, mode);
    int st = run(a);
    CHECK(st == 4, "%s: exit status %d, expected 4\n%s", mode, st, out);
    CHECK(count_lines("got expected error") == 3, "%s: not every rank reported it\n%s", mode, out);
    CHECK(strstr(out, needle) != NULL, "%s: no '%s' in the messages\n%s", mode, needle, out);
    CHECK(!strstr(out, "timed out"), "%s: a rank timed out instead of seeing the mismatch\n%s", mode, out);
}

static void test_hang(void) {
    char a[512];
    snprintf(a, sizeof a, "-n 3 -- %s hang", worker);
    int st = run(a);
    CHECK(st == 5, "hang: exit status %d, expected 5\n%s", st, out);
    CHECK(strstr(out, "timed out") && strstr(out, "ranks not arrived: 2"),
          "hang: message does not say timed out / which rank\n%s", out);
    CHECK(count_lines("got expected error") == 2, "hang: not every waiting rank reported\n%s", out);
}

/* Point to point: a peer that never comes, and one that dies. */
static void test_p2p(void) {
    char a[512];
    snprintf(a, sizeof a, "-n 3 -- %s p2p_hang", worker);
    int st = run(a);
    CHECK(st == 7, "p2p_hang: exit status %d, expected 7\n%s", st, out);
    /* both time out, or (on a busy machine) one does and the other gets
     * its abort first */
    CHECK(count_lines("got expected error") == 2 && strstr(out, "timed out after 0.5 s") &&
              strstr(out, "recv (1048576 x F32, peer 2)") && strstr(out, "ranks not arrived: 2") &&
              (strstr(out, "send (1048576 x F32, peer 2)") || strstr(out, "aborted the communicator")),
          "p2p_hang: the irecv and isend did not time out naming rank 2\n%s", out);
    snprintf(a, sizeof a, "-n 2 -- %s p2p_kill", worker);
    st = run(a);
    CHECK(st == 128 + SIGKILL, "p2p_kill: exit status %d, expected %d\n%s", st, 128 + SIGKILL, out);
    CHECK(strstr(out, "recv (1048576 x F32, peer 1)") && strstr(out, "rank 1 died"),
          "p2p_kill: the irecv did not fail naming the dead rank\n%s", out);
    CHECK(!strstr(out, "timed out"), "p2p_kill: the irecv timed out instead of seeing the death\n%s", out);
}

static void test_abort(void) {
    char a[512];
    snprintf(a, sizeof a, "-n 3 -- %s abort", worker);
    int st = run(a);
    CHECK(st == 6, "abort: exit status %d, expected 6\n%s", st, out);
    CHECK(count_lines("aborted") >= 3 && strstr(out, "test abort"),
          "abort: ranks did not report the abort with its reason\n%s", out);
}

static void test_launcher(void) {
    int st = run("-n 4 -- sh -c 'exit $(( DTRAIN_RANK == 2 ? 7 : 0 ))'");
    CHECK(st == 7, "launcher: exit status %d, expected 7 from rank 2\n%s", st, out);
    st = run("-n 3 -- sh -c 'echo rank=$DTRAIN_RANK size=$DTRAIN_WORLD_SIZE shm=${DTRAIN_SHM_NAME:+yes}'");
    CHECK(st == 0 && strstr(out, "rank=0 size=3 shm=yes") && strstr(out, "rank=2 size=3 shm=yes"),
          "launcher: environment not passed\n%s", out);
    st = run("-n 2 -- /nonexistent/program");
    CHECK(st == 127 && strstr(out, "cannot execute"), "launcher: missing program gave %d\n%s", st, out);
    st = run("-n 0 -- true");
    CHECK(st == 2 && strstr(out, "-n"), "launcher: -n 0 gave %d\n%s", st, out);
    st = run("-n 2");
    CHECK(st == 2 && strstr(out, "no program"), "launcher: no program gave %d\n%s", st, out);

    /* Ctrl-C: SIGINT to the launcher stops every rank. The signal is sent
     * once a rank has started (the launcher installs its handlers before
     * it forks), which the ranks show by creating a file. */
    char ready[64];
    snprintf(ready, sizeof ready, "/tmp/dtrain-test-ready-%d", (int)getpid());
    unlink(ready);
    // each rank writes its pid (exec keeps it) and sleeps far longer than
    // ctest waits: a launcher that let them run would hang the test
    char script[256];
    snprintf(script, sizeof script, "echo $$ >%s-$DTRAIN_RANK; touch %s; exec sleep 1000", ready, ready);
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open("/dev/null", O_WRONLY);
        dup2(fd, 2);
        execl(dtrun, dtrun, "-n", "3", "--", "sh", "-c", script, (char *)NULL);
        _exit(99);
    }
    for (int i = 0; i < 1000 && access(ready, F_OK) != 0; i++) usleep(10000);
    unlink(ready);
    kill(pid, SIGINT);
    int ws;
    waitpid(pid, &ws, 0);
    CHECK(WIFEXITED(ws) && WEXITSTATUS(ws) == 128 + SIGINT,
          "launcher: after SIGINT exit status %d, expected %d", WEXITSTATUS(ws), 128 + SIGINT);
    // The launcher has ended: none of its ranks that had started may be left.
    int started = 0, left = 0;
    for (int r = 0; r < 3; r++) {
        char path[96];
        snprintf(path, sizeof path, "%s-%d", ready, r);
        FILE *f = fopen(path, "r");
        int rp = 0;
        if (f && fscanf(f, "%d", &rp) == 1 && rp > 0) {
            started++;
            if (kill(rp, 0) == 0) {
                left++;
                kill(rp, SIGKILL);
            }
        }
        if (f) fclose(f);
        unlink(path);
    }
    CHECK(started >= 1 && left == 0, "launcher: after SIGINT %d of the %d ranks started are still running", left, started);
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
