/*
 * launch.c - start N local ranks, supervise them, stop them together.
 *
 * The supervisor is a polling loop (waitpid(WNOHANG) every 5 ms) rather than
 * a SIGCHLD handler: it keeps the signal handlers trivial (they only set a
 * flag) and makes the escalation timers easy to read.
 */
#include "dtrain/launch.h"
#include "comm/shm/shm_host.h"

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static volatile sig_atomic_t g_signal, g_nsignals, g_usr1;

static void on_usr1(int sig) {
    (void)sig;
    g_usr1 = 1;
}

// ----------------------------------------------------------------------------
// heartbeats: one cache line per rank in a memfd the ranks inherit

typedef struct {
    _Alignas(64) _Atomic int64_t start_step; /* -1 until the first beat */
    _Atomic int64_t step;
    _Atomic int64_t time_ns;                 /* CLOCK_MONOTONIC of the last beat */
    /* what the rank waits on (dt_heartbeat_wait); wait_peer < -1: nothing */
    _Atomic uint64_t wait_seq;
    _Atomic int32_t wait_peer;
    char wait_op[20];
    /* a spare's slot (after the ranks'): SPARE_*, and the rank it takes */
    _Atomic int32_t spare_state;
    _Atomic int32_t spare_rank;
} beat_slot;

enum { SPARE_STARTING = 0, SPARE_READY = 1, SPARE_ASSIGNED = 2, SPARE_RELEASED = 3 };

/* A rank's slot as at its start (no step yet, waiting on nobody), its
 * silence counted from now_ns (0: from the launch). */
static void beat_reset(beat_slot *b, int64_t now_ns) {
    atomic_store(&b->start_step, -1);
    atomic_store(&b->step, -1);
    atomic_store(&b->time_ns, now_ns);
    atomic_store(&b->wait_peer, -2);
}

/* A ready spare's index, or -1. A death early in the run may come while
 * the spares are still starting (mapping the group's segment): then the
 * first to be ready, waited for (bounded) while one is alive. */
static int ready_spare(beat_slot *beats, const pid_t *pids, const int *alive, int n, int K) {
    for (double until = dt_now() + 30;;) {
        int starting = 0;
        for (int k = 0; k < K; k++) {
            if (!alive[n + k]) continue;
            int32_t s = atomic_load(&beats[n + k].spare_state);
            if (s == SPARE_READY) return k;
            siginfo_t si = {0};  // exited but not reaped yet: no longer coming
            starting |= s == SPARE_STARTING &&
                        !(waitid(P_PID, (id_t)pids[n + k], &si, WEXITED | WNOHANG | WNOWAIT) == 0 && si.si_pid);
        }
        if (!starting || dt_now() >= until) return -1;
        usleep(1000);
    }
}

/* A spare's new state, and the wake of a spare asleep on it. */
static void spare_set(beat_slot *b, int32_t state) {
    atomic_store(&b->spare_state, state);
    syscall(SYS_futex, &b->spare_state, FUTEX_WAKE, INT32_MAX, NULL, NULL, 0);
}

static int64_t mono_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static beat_slot *g_beat;  // this rank's slot (worker side)
static pthread_once_t g_beat_once = PTHREAD_ONCE_INIT;

static void beat_attach(void) {
    const char *fd = getenv("DTRAIN_HEARTBEAT_FD"), *rank = getenv(DT_ENV_RANK),
               *n = getenv(DT_ENV_WORLD_SIZE);
    if (!fd || !rank || !n) return;
    int r = atoi(rank), size = atoi(n);
    if (r < 0 || r >= size) return;
    void *p = mmap(NULL, sizeof(beat_slot) * (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED, atoi(fd), 0);
    if (p != MAP_FAILED) g_beat = (beat_slot *)p + r;
}

void dt_heartbeat(int64_t step) {
    pthread_once(&g_beat_once, beat_attach);
    if (!g_beat) return;
    if (step >= 0) {
        int64_t unset = -1;
        atomic_compare_exchange_strong(&g_beat->start_step, &unset, step);
        atomic_store(&g_beat->step, step);
    }
    atomic_store(&g_beat->time_ns, mono_ns());
}

void dt_heartbeat_wait(const char *op, uint64_t seq, int peer) {
    pthread_once(&g_beat_once, beat_attach);
    if (!g_beat) return;
    if (op) {
        atomic_store(&g_beat->wait_peer, -2);  // the launcher reads no half-written name
        snprintf(g_beat->wait_op, sizeof g_beat->wait_op, "%s", op);
        atomic_store(&g_beat->wait_seq, seq);
        atomic_store(&g_beat->wait_peer, peer < -1 ? -1 : peer);
    } else {
        atomic_store(&g_beat->wait_peer, -2);
    }
    atomic_store(&g_beat->time_ns, mono_ns());
}

static int g_spare_rank = -1;

int dt_spare_rank(void) { return g_spare_rank; }

int dt_spare_is(void) {
    const char *k = getenv("DTRAIN_SPARE");
    return k && *k;
}

dt_status dt_spare_wait(int *rank) { return dt_spare_wait_idle(rank, NULL, NULL); }

dt_status dt_spare_wait_idle(int *rank, void (*idle)(void *user), void *user) {
    *rank = -1;
    const char *k = getenv("DTRAIN_SPARE"), *fd = getenv("DTRAIN_HEARTBEAT_FD"), *n = getenv(DT_ENV_WORLD_SIZE),
               *nk = getenv("DTRAIN_SPARES"), *shm = getenv(DT_ENV_SHM_NAME);
    if (!k || !fd || !n || !nk || !shm)
        return dt_error(DT_ERR_CONFIG, "dt_spare_wait: not a spare of dtrain's launcher (DTRAIN_SPARE, "
                                       "DTRAIN_SPARES, DTRAIN_HEARTBEAT_FD, " DT_ENV_WORLD_SIZE " or " DT_ENV_SHM_NAME
                                       " unset)");
    int idx = atoi(k), size = atoi(n), spares = atoi(nk);
    if (size < 1 || idx < 0 || idx >= spares)
        return dt_error(DT_ERR_CONFIG, "dt_spare_wait: spare %d of %d for %d ranks: out of range", idx, spares, size);
    void *p = mmap(NULL, sizeof(beat_slot) * (size_t)(size + spares), PROT_READ | PROT_WRITE, MAP_SHARED, atoi(fd), 0);
    if (p == MAP_FAILED) return dt_error(DT_ERR_IO, "spare %d: cannot map the launcher's table: %s", idx, strerror(errno));
    beat_slot *me = (beat_slot *)p + size + idx;
    // Map the segment while its name exists; dt_comm_init finds it later.
    dt_status st = dt_shm_map_world(shm);
    if (st != DT_OK) {
        munmap(p, sizeof(beat_slot) * (size_t)(size + spares));
        return dt_error(st, "spare %d: %s", idx, dt_last_error());
    }
    // The process's name says what it is (ps, /proc/PID/comm): an idle
    // spare, then the rank it took.
    prctl(PR_SET_NAME, "dtrain spare");
    int32_t starting = SPARE_STARTING;
    atomic_compare_exchange_strong(&me->spare_state, &starting, SPARE_READY);
    if (idle) idle(user);
    // Idle until the launcher gives this process a rank or releases it; the
    // launcher's end (PR_SET_PDEATHSIG) ends it too.
    for (;;) {
        int32_t state = atomic_load(&me->spare_state);
        if (state == SPARE_ASSIGNED) break;
        if (state == SPARE_RELEASED) {
            munmap(p, sizeof(beat_slot) * (size_t)(size + spares));
            return DT_OK;
        }
        // asleep until the launcher changes the state (it wakes the futex)
        struct timespec nap = {0, 100000000};
        syscall(SYS_futex, &me->spare_state, FUTEX_WAIT, state, &nap, NULL, 0);
    }
    int r = atomic_load(&me->spare_rank);
    munmap(p, sizeof(beat_slot) * (size_t)(size + spares));
    if (r < 0 || r >= size) return dt_error(DT_ERR_INTERNAL, "spare %d: given rank %d of %d", idx, r, size);
    char b[32];
    snprintf(b, sizeof b, "dtrain rank %d", r);
    prctl(PR_SET_NAME, b);
    snprintf(b, sizeof b, "%d", r);
    setenv(DT_ENV_RANK, b, 1);
    setenv(DT_ENV_LOCAL_RANK, b, 1);
    unsetenv("DTRAIN_SPARE");
    *rank = g_spare_rank = r;
    return DT_OK;
}

/* For a slot that is waiting: " in OP (seq S) for rank P" into buf, and 1;
 * else 0. */
static int beat_waiting(beat_slot *b, char *buf, size_t n) {
    int peer = atomic_load(&b->wait_peer);
    if (peer < -1) return 0;
    char op[sizeof b->wait_op];
    memcpy(op, b->wait_op, sizeof op);
    op[sizeof op - 1] = 0;
    uint64_t seq = atomic_load(&b->wait_seq);
    if (atomic_load(&b->wait_peer) != peer) return 0;  // changed while read
    int k = snprintf(buf, n, " in %s (seq %llu)", op, (unsigned long long)seq);
    if (peer >= 0 && k > 0 && (size_t)k < n) snprintf(buf + k, n - (size_t)k, " for rank %d", peer);
    return 1;
}

/* The ranks other than `hung` that wait in a collective, grouped by what
 * they wait on: "; rank 0 waits in allreduce (seq 40) for rank 1" or
 * "; ranks 0, 2 wait in ...". */
static void describe_waiters(beat_slot *beats, const int *alive, int n, int hung, char *out, size_t size) {
    size_t len = 0;
    out[0] = 0;
    char *what = calloc((size_t)n, 96);
    if (!what) return;
    for (int r = 0; r < n; r++)
        if (r == hung || !alive[r] || !beat_waiting(&beats[r], what + 96 * r, 96)) what[96 * r] = 0;
    for (int r = 0; r < n && len + 64 < size; r++) {
        if (!what[96 * r]) continue;
        char ranks[256];
        size_t rl = (size_t)snprintf(ranks, sizeof ranks, "%d", r);
        int count = 1;
        for (int q = r + 1; q < n; q++) {
            if (!what[96 * q] || strcmp(what + 96 * q, what + 96 * r)) continue;
            if (rl + 16 < sizeof ranks) rl += (size_t)snprintf(ranks + rl, sizeof ranks - rl, ", %d", q);
            count++;
            what[96 * q] = 0;
        }
        len += (size_t)snprintf(out + len, size - len, "; rank%s %s wait%s%s", count > 1 ? "s" : "", ranks,
                                count > 1 ? "" : "s", what + 96 * r);
    }
    free(what);
}

static void on_signal(int sig) {
    g_signal = sig;
    g_nsignals++;
}

dt_launch_params dt_launch_default_params(void) {
    dt_launch_params p = {.nranks = 1, .grace = 3.0, .term_grace = 2.0, .verbose = 0, .heartbeat_timeout = 0,
                          .stop_after = 0, .failed_at = 0, .failed_step = -1, .respawn_from = -1,
                          .max_respawns = 0, .nspares = 0};
    return p;
}

static void set_env_int(const char *k, int v) {
    char b[32];
    snprintf(b, sizeof b, "%d", v);
    setenv(k, b, 1);
}

/* In the child, after fork: environment, default signals, exec. A spare
 * (rank < 0) gets DTRAIN_SPARE=its index instead of a rank. */
static void child_exec(char *const argv[], int rank, int n, const char *shm_name, int beat_fd, pid_t parent,
                       int nspares, int spare) {
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGHUP, SIG_DFL);
    /* die with the launcher, even if it is killed with SIGKILL */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    if (rank >= 0) {
        set_env_int(DT_ENV_RANK, rank);
        set_env_int(DT_ENV_LOCAL_RANK, rank);
        unsetenv("DTRAIN_SPARE");
    } else {
        unsetenv(DT_ENV_RANK);
        unsetenv(DT_ENV_LOCAL_RANK);
        set_env_int("DTRAIN_SPARE", spare);
    }
    set_env_int(DT_ENV_WORLD_SIZE, n);
    set_env_int(DT_ENV_LOCAL_SIZE, n);
    setenv(DT_ENV_SHM_NAME, shm_name, 1);
    if (nspares > 0) set_env_int("DTRAIN_SPARES", nspares);
    else unsetenv("DTRAIN_SPARES");
    if (beat_fd >= 0) set_env_int("DTRAIN_HEARTBEAT_FD", beat_fd);
    execvp(argv[0], argv);
    if (rank >= 0)
        fprintf(stderr, "dtrain run: rank %d: cannot execute '%s': %s\n", rank, argv[0], strerror(errno));
    else
        fprintf(stderr, "dtrain run: spare %d: cannot execute '%s': %s\n", spare, argv[0], strerror(errno));
    _exit(127);
}

/* The segments of the world's splits, kept for replacements
 * (dt_shm_set_respawn): every /dev/shm name that starts with the world's
 * name and a dot. */
static void unlink_splits(const char *name) {
    DIR *d = opendir("/dev/shm");
    if (!d) return;
    size_t len = strlen(name + 1);
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, name + 1, len) || e->d_name[len] != '.') continue;
        char nm[300];
        snprintf(nm, sizeof nm, "/%s", e->d_name);
        shm_unlink(nm);
    }
    closedir(d);
}

static void signal_all(const pid_t *pids, const int *alive, int n, int sig) {
    for (int r = 0; r < n; r++)
        if (alive[r]) kill(pids[r], sig);
}

dt_status dt_launch(const dt_launch_params *p, char *const argv[], dt_launch_result *res) {
    if (!p || !argv || !argv[0] || !res)
        return dt_error(DT_ERR_ARG, "dt_launch: missing program or parameters");
    int n = p->nranks, K = p->nspares;
    if (n < 1 || n > 4096) return dt_error(DT_ERR_ARG, "dt_launch: %d ranks (expected 1..4096)", n);
    if (K < 0 || K > 4096) return dt_error(DT_ERR_ARG, "dt_launch: %d spares (expected 0..4096)", K);
    memset(res, 0, sizeof *res);
    res->failed_rank = -1;
    res->start_step = res->last_step = -1;
    int *exit_code = &res->exit_code;

    // ---- the heartbeat table (inherited by the ranks) --------------------------
    size_t beat_size = sizeof(beat_slot) * (size_t)(n + K);  // the ranks', then the spares'
    int beat_fd = memfd_create("dtrain-heartbeat", 0);
    beat_slot *beats = MAP_FAILED;
    if (beat_fd >= 0 && ftruncate(beat_fd, (off_t)beat_size) == 0)
        beats = mmap(NULL, beat_size, PROT_READ | PROT_WRITE, MAP_SHARED, beat_fd, 0);
    if (beats == MAP_FAILED) {
        if (beat_fd >= 0) close(beat_fd);
        return dt_error(DT_ERR_INTERNAL, "dtrain run: cannot create the heartbeat table: %s", strerror(errno));
    }
    for (int r = 0; r < n + K; r++) {
        beat_reset(&beats[r], 0);
    }

    // ---- the shared-memory segment -----------------------------------------
    char name[64];
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    snprintf(name, sizeof name, "/dtrain-%d-%lx", (int)getpid(), (unsigned long)ts.tv_nsec);
    size_t size = dt_shm_segment_size(n);
    int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0) {
        int e = errno;
        munmap(beats, beat_size);
        close(beat_fd);
        return dt_error(DT_ERR_COMM, "dtrain run: cannot create shared memory '%s': %s", name, strerror(e));
    }
    if (ftruncate(fd, (off_t)size) != 0) {
        int e = errno;
        close(fd);
        shm_unlink(name);
        munmap(beats, beat_size);
        close(beat_fd);
        return dt_error(DT_ERR_COMM, "dtrain run: cannot size shared memory to %zu bytes: %s",
                        size, strerror(e));
    }
    void *base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (base == MAP_FAILED) {
        int e = errno;
        shm_unlink(name);
        munmap(beats, beat_size);
        close(beat_fd);
        return dt_error(DT_ERR_COMM, "dtrain run: mmap of shared memory failed: %s", strerror(e));
    }
    dt_shm_segment_init(base, n);
    if (p->respawn_from >= 0) dt_shm_set_respawn(base);

    // pids[n + k], alive[n + k]: spare k while it is idle
    pid_t *pids = calloc((size_t)(n + K), sizeof *pids);
    int *alive = calloc((size_t)(n + K), sizeof *alive);
    double *replaced_at = calloc((size_t)n, sizeof *replaced_at);
    if (!pids || !alive || !replaced_at) {
        free(pids);
        free(alive);
        free(replaced_at);
        munmap(base, size);
        shm_unlink(name);
        munmap(beats, beat_size);
        close(beat_fd);
        return dt_error(DT_ERR_NOMEM, "dtrain run: out of memory");
    }

    // ---- signals and fork ----------------------------------------------------
    struct sigaction sa, old_int, old_term, old_hup, old_usr1;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    g_signal = 0;
    g_nsignals = 0;
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    sigaction(SIGHUP, &sa, &old_hup);
    sa.sa_handler = on_usr1;
    g_usr1 = 0;
    sigaction(SIGUSR1, &sa, &old_usr1);
    fflush(NULL);

    dt_status rc = DT_OK;
    pid_t self = getpid();
    int nalive = 0, nspare = 0;  // ranks, idle spares
    for (int r = 0; r < n + K; r++) {
        pid_t pid = fork();
        if (pid == 0) child_exec(argv, r < n ? r : -1, n, name, beat_fd, self, K, r - n);
        if (pid < 0) {
            rc = dt_error(DT_ERR_INTERNAL, "dtrain run: fork of %s %d failed: %s", r < n ? "rank" : "spare",
                          r < n ? r : r - n, strerror(errno));
            g_signal = SIGTERM; /* stop the ranks already started */
            break;
        }
        pids[r] = pid;
        alive[r] = 1;
        if (r < n) nalive++;
        else nspare++;
        if (p->verbose) dt_log(DT_LOG_INFO, "run: %s %d is pid %d", r < n ? "rank" : "spare", r < n ? r : r - n, (int)pid);
    }

    // ---- supervise -------------------------------------------------------------
    int first_fail = -1, forwarded = 0, unlinked = 0, nstopped = 0, stop_sent = 0, released = 0, respawn_hung = -1;
    double term_at = 0, kill_at = 0, t_start = dt_now(), next_check = 0, spare_kill_at = 0;
    int64_t start_ns = mono_ns();
    while (nalive > 0 || nspare > 0) {
        /* The spares go when the ranks are done or the group is stopped:
         * released (they exit 0), killed if they do not. */
        if (nspare > 0 && !released && (nalive == 0 || first_fail >= 0 || forwarded)) {
            released = 1;
            for (int k = 0; k < K; k++) spare_set(&beats[n + k], SPARE_RELEASED);
            spare_kill_at = dt_now() + p->term_grace + 1;
        }
        if (spare_kill_at && dt_now() >= spare_kill_at) {
            for (int k = 0; k < K; k++)
                if (alive[n + k]) kill(pids[n + k], SIGKILL);
            spare_kill_at = 0;
        }
        // A replaced rank's newcomer finished its first step: the recovery's end.
        for (int r = 0; r < n; r++) {
            if (!replaced_at[r]) continue;
            int64_t s0 = atomic_load(&beats[r].start_step), s1 = atomic_load(&beats[r].step);
            if (s0 < 0 || s1 <= s0) continue;
            dt_log(DT_LOG_INFO, "run: rank %d recovered in %.2f s (its death to its replacement's first step, step %lld); "
                                "0 steps lost",
                   r, dt_now() - replaced_at[r], (long long)s0 + 1);
            replaced_at[r] = 0;
        }
        // Progress so far, read before an exit is handled so that a failure
        // sees the last steps.
        for (int r = 0; r < n; r++) {
            int64_t s0 = atomic_load(&beats[r].start_step), s1 = atomic_load(&beats[r].step);
            if (s1 > res->last_step) res->last_step = s1;
            if (r == 0 && s0 >= 0) res->start_step = s0;
            if (!res->first_step_at && s0 >= 0 && s1 > s0) {
                res->first_step_at = dt_now();
                if (p->failed_at > 0 && p->failed_step >= 0)
                    dt_log(DT_LOG_INFO, "recovered in %.2f s (failure to the first new step); resumed at step %lld, "
                                        "%lld step%s lost (last step before the failure: %lld)",
                           res->first_step_at - p->failed_at, (long long)s0, (long long)(p->failed_step - s0),
                           p->failed_step - s0 == 1 ? "" : "s", (long long)p->failed_step);
                else if (p->failed_at > 0)
                    dt_log(DT_LOG_INFO, "recovered in %.2f s (failure to the first new step)",
                           res->first_step_at - p->failed_at);
            }
        }
        int st;
        pid_t pid = waitpid(-1, &st, WNOHANG);
        if (pid > 0) {
            int r = 0;
            while (r < n + K && (pids[r] != pid || !alive[r])) r++;
            if (r == n + K) continue;
            alive[r] = 0;
            int code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
            if (r >= n) {  // an idle spare
                nspare--;
                if (!released)
                    dt_log(DT_LOG_WARN, "run: spare %d (pid %d) %s %d while idle; %d spare%s left", r - n, (int)pid,
                           WIFSIGNALED(st) ? "killed by signal" : "exited with status",
                           WIFSIGNALED(st) ? WTERMSIG(st) : code, nspare, nspare == 1 ? "" : "s");
                continue;
            }
            nalive--;
            /* A rank killed (or hung, and killed for it) while a spare is
             * ready: the spare takes its place, the others rejoin. */
            int spare = -1;
            if (WIFSIGNALED(st) && n > 1 && first_fail < 0 && !forwarded && !g_signal)  // a survivor has the state
                spare = ready_spare(beats, pids, alive, n, K);
            if (spare >= 0) {
                dt_shm_mark_rank(base, r, 2, WTERMSIG(st));
                beat_reset(&beats[r], mono_ns());
                dt_shm_replace_rank(base, r);
                pids[r] = pids[n + spare];
                alive[r] = 1;
                alive[n + spare] = 0;
                nalive++;
                nspare--;
                atomic_store(&beats[n + spare].spare_rank, r);
                spare_set(&beats[n + spare], SPARE_ASSIGNED);
                replaced_at[r] = dt_now();
                res->replaced++;
                dt_log(DT_LOG_WARN, "run: rank %d (pid %d) killed by signal %d (%s); spare %d (pid %d) takes its place "
                                    "(%d spare%s left)",
                       r, (int)pid, WTERMSIG(st), strsignal(WTERMSIG(st)), spare, (int)pids[r], nspare,
                       nspare == 1 ? "" : "s");
                continue;
            }
            if (code == 0 || (code == DT_EXIT_STOPPED && stop_sent)) {
                dt_shm_mark_rank(base, r, 1, 0);
                nstopped += code == DT_EXIT_STOPPED;
                if (p->verbose) dt_log(DT_LOG_INFO, "run: rank %d exited%s", r, code ? " (stopped on request)" : "");
                continue;
            }
            int hung = respawn_hung == r;
            if (hung) respawn_hung = -1;
            if (p->respawn_from >= 0 && r >= p->respawn_from && res->respawns < p->max_respawns && first_fail < 0 &&
                !forwarded && !stop_sent) {
                // Restarted alone: the others go on and take it back.
                res->respawns++;
                int inc = dt_shm_restart_rank(base, r);
                char why[96];
                if (hung) snprintf(why, sizeof why, "hung (no heartbeat for %.1f s), killed", p->heartbeat_timeout);
                else if (WIFSIGNALED(st)) snprintf(why, sizeof why, "killed by signal %d (%s)", WTERMSIG(st), strsignal(WTERMSIG(st)));
                else snprintf(why, sizeof why, "exited with status %d", code);
                char at[48] = "";
                int64_t last = atomic_load(&beats[r].step);
                if (last >= 0) snprintf(at, sizeof at, " at step %lld", (long long)last);
                dt_log(DT_LOG_WARN, "run: rank %d (pid %d) %s%s; restarting it alone (restart %d of %d, incarnation %d)",
                       r, (int)pid, why, at, res->respawns, p->max_respawns, inc);
                beat_reset(&beats[r], mono_ns());
                fflush(NULL);
                pid_t np = fork();
                if (np == 0) child_exec(argv, r, n, name, beat_fd, self, K, -1);
                if (np > 0) {
                    pids[r] = np;
                    alive[r] = 1;
                    nalive++;
                    continue;
                }
                dt_log(DT_LOG_ERROR, "run: fork of rank %d failed: %s", r, strerror(errno));
            }
            dt_shm_mark_rank(base, r, 2, WIFSIGNALED(st) ? WTERMSIG(st) : -code);
            dt_shm_refuse_rejoin(base);  // nobody takes its place: ranks in dt_comm_rejoin fail now
            if (first_fail < 0 && !forwarded) {
                first_fail = r;
                *exit_code = code;
                res->failed_rank = r;
                res->signal = WIFSIGNALED(st) ? WTERMSIG(st) : 0;
                res->failed_at = dt_now();
                res->failed_early = atomic_load(&beats[r].step) <= atomic_load(&beats[r].start_step);
                if (WIFSIGNALED(st))
                    dt_log(DT_LOG_ERROR, "run: rank %d (pid %d) killed by signal %d (%s)%s",
                           r, (int)pid, WTERMSIG(st), strsignal(WTERMSIG(st)),
                           nalive ? "; stopping the other ranks" : "");
                else
                    dt_log(DT_LOG_ERROR, "run: rank %d (pid %d) exited with status %d%s", r,
                           (int)pid, code, nalive ? "; stopping the other ranks" : "");
                term_at = dt_now() + p->grace;
            }
            continue;
        }
        if (pid < 0 && errno != EINTR) break; /* no children left */

        /* once every rank has mapped the segment its name is not needed:
         * unlink it now, so that nothing is left even if we are killed */
        int spares_mapped = 1;
        for (int k = 0; k < K; k++)
            if (alive[n + k] && atomic_load(&beats[n + k].spare_state) == SPARE_STARTING) spares_mapped = 0;
        if (!unlinked && p->respawn_from < 0 && spares_mapped && dt_shm_all_attached(base)) {
            shm_unlink(name);
            unlinked = 1;
        }
        double now = dt_now();
        if (now >= next_check) {  // heartbeats, ten times a second
            next_check = now + 0.1;
            int64_t ns = mono_ns();
            for (int r = 0; r < n; r++) {
                int64_t s0 = atomic_load(&beats[r].start_step), s1 = atomic_load(&beats[r].step);
                int64_t last = atomic_load(&beats[r].time_ns);
                if (!alive[r] || first_fail >= 0 || forwarded || p->heartbeat_timeout <= 0) continue;
                double quiet = (double)(ns - (last ? last : start_ns)) * 1e-9;
                if (quiet < p->heartbeat_timeout) continue;
                if (p->respawn_from >= 0 && r >= p->respawn_from && res->respawns < p->max_respawns) {
                    // killed here, restarted alone when reaped
                    if (respawn_hung != r) kill(pids[r], SIGKILL);
                    respawn_hung = r;
                    continue;
                }
                int ready = 0;
                for (int k = 0; k < K; k++)
                    ready += alive[n + k] && atomic_load(&beats[n + k].spare_state) == SPARE_READY;
                if (ready) {  // killed here, replaced when reaped (above)
                    dt_log(DT_LOG_ERROR, "run: rank %d (pid %d) sent no heartbeat for %.1f s: hung; killing it for a spare "
                                         "to take its place",
                           r, (int)pids[r], quiet);
                    kill(pids[r], SIGKILL);
                    atomic_store(&beats[r].time_ns, ns);
                    continue;
                }
                first_fail = r;
                *exit_code = 128 + SIGKILL;
                res->failed_rank = r;
                res->hung = 1;
                res->failed_at = now;
                res->failed_early = s1 <= s0;
                // Waiting ranks beat, so the silent one is the culprit;
                // say what the others wait in, and where it was itself.
                char others[1024], wait[96], own[160] = "before its first step";
                describe_waiters(beats, alive, n, r, others, sizeof others);
                if (s1 >= 0) snprintf(own, sizeof own, "at step %lld", (long long)s1);
                if (beat_waiting(&beats[r], wait, sizeof wait))
                    snprintf(own + strlen(own), sizeof own - strlen(own), ", itself waiting%s", wait);
                if (last)
                    dt_log(DT_LOG_ERROR, "run: rank %d (pid %d) sent no heartbeat for %.1f s (last %s): hung%s; stopping all ranks",
                           r, (int)pids[r], quiet, own, others);
                else
                    dt_log(DT_LOG_ERROR, "run: rank %d (pid %d) sent no heartbeat in the %.1f s since it started: hung%s; stopping all ranks",
                           r, (int)pids[r], quiet, others);
                kill(pids[r], SIGKILL);
                dt_shm_mark_rank(base, r, 2, SIGKILL);
                dt_shm_refuse_rejoin(base);
                term_at = now + p->grace;
            }
        }
        if (p->stop_after > 0 && !stop_sent && !forwarded && first_fail < 0 && now - t_start >= p->stop_after) {
            stop_sent = 1;
            if (p->verbose) dt_log(DT_LOG_INFO, "run: asking every rank to checkpoint and stop");
            signal_all(pids, alive, n, SIGUSR1);
        }
        if (g_usr1 && !forwarded) {  // passed on: every rank checkpoints and stops
            g_usr1 = 0;
            stop_sent = res->stop_asked = 1;
            dt_log(DT_LOG_INFO, "run: SIGUSR1: asking every rank to checkpoint and stop");
            signal_all(pids, alive, n, SIGUSR1);
        }
        if (g_signal && !forwarded) {
            forwarded = 1;
            if (first_fail < 0) *exit_code = 128 + g_signal;
            dt_log(DT_LOG_WARN, "run: %s, stopping %d ranks", strsignal(g_signal), nalive);
            signal_all(pids, alive, n, SIGTERM);
            kill_at = now + p->term_grace;
            term_at = 0;
        }
        if (term_at && now >= term_at) {
            signal_all(pids, alive, n, SIGTERM);
            term_at = 0;
            kill_at = now + p->term_grace;
        }
        if (forwarded && g_nsignals >= 2 && kill_at) /* a second Ctrl-C: no more waiting */
            kill_at = now;
        if (kill_at && now >= kill_at) {
            signal_all(pids, alive, n, SIGKILL);
            kill_at = 0;
        }
        struct timespec nap = {0, 5000000};
        nanosleep(&nap, NULL);
    }

    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    sigaction(SIGHUP, &old_hup, NULL);
    sigaction(SIGUSR1, &old_usr1, NULL);
    munmap(base, size);
    if (!unlinked) shm_unlink(name);
    if (p->respawn_from >= 0) unlink_splits(name);
    res->stopped = first_fail < 0 && !forwarded && nstopped > 0;
    munmap(beats, beat_size);
    close(beat_fd);
    free(pids);
    free(alive);
    free(replaced_at);
    return rc;
}
