/*
 * launch.c - start N local ranks, supervise them, stop them together.
 *
 * The supervisor is a polling loop (waitid(WNOHANG) every 5 ms) rather than
 * a SIGCHLD handler: it keeps the signal handlers trivial (they only set a
 * flag) and makes the escalation timers easy to read. A dead child is
 * reaped only after the segment says what became of its rank (`next_exit`).
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
    _Atomic int32_t phase;                   /* dt_phase */
} beat_slot;

// Where a rank was (dt_phase), for the words on its death.
static const char *phase_words(int p) {
    static const char *const w[] = {"while starting", "in a training step", "in an evaluation",
                                    "while saving a checkpoint", "while writing the final weights", "while ending"};
    return p >= 0 && p <= DT_PHASE_END ? w[p] : "";
}

enum { SPARE_STARTING = 0, SPARE_READY = 1, SPARE_ASSIGNED = 2, SPARE_RELEASED = 3 };

/* A rank's slot as at its start (no step yet, waiting on nobody), its
 * silence counted from now_ns (0: from the launch). */
static void beat_reset(beat_slot *b, int64_t now_ns) {
    atomic_store(&b->start_step, -1);
    atomic_store(&b->step, -1);
    atomic_store(&b->time_ns, now_ns);
    atomic_store(&b->wait_peer, -2);
    atomic_store(&b->phase, DT_PHASE_START);
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

void dt_heartbeat_phase(dt_phase phase) {
    pthread_once(&g_beat_once, beat_attach);
    if (g_beat) atomic_store(&g_beat->phase, (int32_t)phase);
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
 * (rank < 0) gets DTRAIN_SPARE=its index instead of a rank. With
 * p->graceful the terminal's Ctrl-C is the launcher's to pass on (a rank
 * ignores SIGINT and stops on the SIGUSR1 it gets instead). */
static void child_exec(char *const argv[], int rank, int n, const char *shm_name, int beat_fd, pid_t parent,
                       const dt_launch_params *p, int spare) {
    int nspares = p->nspares, alone_from = p->respawn_from;
    signal(SIGINT, p->graceful > 0 ? SIG_IGN : SIG_DFL);
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
    // ranks let in alone (a spare there takes a place as a restart does)
    if (alone_from >= 0) set_env_int("DTRAIN_ALONE_FROM", alone_from);
    else unsetenv("DTRAIN_ALONE_FROM");
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

// ----------------------------------------------------------------------------
// the supervisor: its state, then its parts in the order a pass runs them

typedef struct {
    const dt_launch_params *p;
    char *const *argv;
    dt_launch_result *res;
    int n, K;                 // ranks, spares
    beat_slot *beats;         // the ranks' slots, then the spares'
    int beat_fd;
    size_t beat_size, size;
    void *base;               // the shared-memory segment
    char name[64];
    pid_t self, *pids;        // pids[n + k], alive[n + k]: spare k while it is idle
    int *alive;
    double *replaced_at;      // when a rank's place was taken, until its new process's first step
    int64_t *died_after;      // ... the last step the dead rank had finished
    int *started;             // a rank that reported a step (a process in its place skips the run's start)
    int nalive, nspare;       // ranks, idle spares
    int first_fail;           // the first rank that failed the group (-1: none)
    int forwarded;            // a signal was passed on to every rank
    int unlinked, nstopped, stop_sent, released;
    int hung;                 // the rank killed for its silence, to be replaced when reaped (-1: none)
    double hung_quiet;        // ... and how long it was silent
    double term_at, kill_at, t_start, next_check, spare_kill_at;
    int64_t start_ns;
} sup;

static void signal_all(const sup *s, int sig) {
    for (int r = 0; r < s->n; r++)
        if (s->alive[r]) kill(s->pids[r], sig);
}

static void sup_close(sup *s) {
    if (s->base && s->base != MAP_FAILED) munmap(s->base, s->size);
    if (s->name[0] && !s->unlinked) shm_unlink(s->name);
    if (s->name[0] && s->p->respawn_from >= 0) unlink_splits(s->name);
    if (s->beats && s->beats != MAP_FAILED) munmap(s->beats, s->beat_size);
    if (s->beat_fd >= 0) close(s->beat_fd);
    free(s->pids);
    free(s->alive);
    free(s->replaced_at);
    free(s->died_after);
    free(s->started);
}

// The heartbeat table (inherited by the ranks), the shared-memory segment,
// and the supervisor's own arrays. On failure sup_close undoes what was made.
static dt_status sup_open(sup *s) {
    int n = s->n, K = s->K;
    s->beat_size = sizeof(beat_slot) * (size_t)(n + K);  // the ranks', then the spares'
    s->beat_fd = memfd_create("dtrain-heartbeat", 0);
    if (s->beat_fd >= 0 && ftruncate(s->beat_fd, (off_t)s->beat_size) == 0)
        s->beats = mmap(NULL, s->beat_size, PROT_READ | PROT_WRITE, MAP_SHARED, s->beat_fd, 0);
    if (!s->beats || s->beats == MAP_FAILED)
        return dt_error(DT_ERR_INTERNAL, "dtrain run: cannot create the heartbeat table: %s", strerror(errno));
    for (int r = 0; r < n + K; r++) beat_reset(&s->beats[r], 0);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    char name[64];
    snprintf(name, sizeof name, "/dtrain-%d-%lx", (int)getpid(), (unsigned long)ts.tv_nsec);
    s->size = dt_shm_segment_size(n);
    int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0) return dt_error(DT_ERR_COMM, "dtrain run: cannot create shared memory '%s': %s", name, strerror(errno));
    memcpy(s->name, name, sizeof name);
    if (ftruncate(fd, (off_t)s->size) != 0) {
        int e = errno;
        close(fd);
        return dt_error(DT_ERR_COMM, "dtrain run: cannot size shared memory to %zu bytes: %s", s->size, strerror(e));
    }
    s->base = mmap(NULL, s->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (s->base == MAP_FAILED) return dt_error(DT_ERR_COMM, "dtrain run: mmap of shared memory failed: %s", strerror(errno));
    dt_shm_segment_init(s->base, n);
    if (s->p->respawn_from >= 0) dt_shm_set_respawn(s->base);
    s->pids = calloc((size_t)(n + K), sizeof *s->pids);
    s->alive = calloc((size_t)(n + K), sizeof *s->alive);
    s->replaced_at = calloc((size_t)n, sizeof *s->replaced_at);
    s->died_after = calloc((size_t)n, sizeof *s->died_after);
    s->started = calloc((size_t)n, sizeof *s->started);
    if (!s->pids || !s->alive || !s->replaced_at || !s->died_after || !s->started)
        return dt_error(DT_ERR_NOMEM, "dtrain run: out of memory");
    return DT_OK;
}

// The ranks, then the spares. A failed fork stops the ones started.
static dt_status start_all(sup *s) {
    for (int r = 0; r < s->n + s->K; r++) {
        const char *what = r < s->n ? "rank" : "spare";
        int id = r < s->n ? r : r - s->n;
        pid_t pid = fork();
        if (pid == 0) child_exec(s->argv, r < s->n ? r : -1, s->n, s->name, s->beat_fd, s->self, s->p, id);
        if (pid < 0) {
            g_signal = SIGTERM; /* stop the ranks already started */
            return dt_error(DT_ERR_INTERNAL, "dtrain run: fork of %s %d failed: %s", what, id, strerror(errno));
        }
        s->pids[r] = pid;
        s->alive[r] = 1;
        if (r < s->n) s->nalive++;
        else s->nspare++;
        if (s->p->verbose) dt_log(DT_LOG_INFO, "run: %s %d is pid %d", what, id, (int)pid);
    }
    return DT_OK;
}

/* The spares go when the ranks are done or the group is stopped: released
 * (they exit 0), killed if they do not. */
static void release_spares(sup *s) {
    if (s->nspare > 0 && !s->released && (s->nalive == 0 || s->first_fail >= 0 || s->forwarded)) {
        s->released = 1;
        for (int k = 0; k < s->K; k++) spare_set(&s->beats[s->n + k], SPARE_RELEASED);
        s->spare_kill_at = dt_now() + s->p->term_grace + 1;
    }
    if (s->spare_kill_at && dt_now() >= s->spare_kill_at) {
        for (int k = 0; k < s->K; k++)
            if (s->alive[s->n + k]) kill(s->pids[s->n + k], SIGKILL);
        s->spare_kill_at = 0;
    }
}

// Progress so far, read before an exit is handled so that a failure sees
// the last steps; a replaced rank's new process that finished its first
// step ends that recovery, and the group's first step after a restart of
// the run ends the run's.
static void note_progress(sup *s) {
    const dt_launch_params *p = s->p;
    dt_launch_result *res = s->res;
    for (int r = 0; r < s->n; r++) {
        int64_t s0 = atomic_load(&s->beats[r].start_step), s1 = atomic_load(&s->beats[r].step);
        if (s1 >= 0) s->started[r] = 1;
        if (s->replaced_at[r] && s0 >= 0 && s1 > s0) {
            // (the group goes on from s0 + 1: steps the dead rank had finished
            // past s0 are lost, done again, as after going back to a checkpoint)
            long long lost = s->died_after[r] > s0 ? (long long)(s->died_after[r] - s0) : 0;
            dt_log(DT_LOG_INFO, "run: rank %d recovered in %.2f s (its death to its replacement's first step, step "
                                "%lld); %lld step%s lost",
                   r, dt_now() - s->replaced_at[r], (long long)s0 + 1, lost, lost == 1 ? "" : "s");
            s->replaced_at[r] = 0;
        }
    }
    for (int r = 0; r < s->n; r++) {
        int64_t s0 = atomic_load(&s->beats[r].start_step), s1 = atomic_load(&s->beats[r].step);
        if (s1 > res->last_step) res->last_step = s1;
        if (r == 0 && s0 >= 0) res->start_step = s0;
        if (res->first_step_at || s0 < 0 || s1 <= s0) continue;
        res->first_step_at = dt_now();
        if (p->failed_at > 0 && p->failed_step >= 0)
            dt_log(DT_LOG_INFO, "recovered in %.2f s (failure to the first new step); resumed at step %lld, "
                                "%lld step%s lost (last step before the failure: %lld)",
                   res->first_step_at - p->failed_at, (long long)s0, (long long)(p->failed_step - s0),
                   p->failed_step - s0 == 1 ? "" : "s", (long long)p->failed_step);
        else if (p->failed_at > 0)
            dt_log(DT_LOG_INFO, "recovered in %.2f s (failure to the first new step)", res->first_step_at - p->failed_at);
    }
}

/* Whether a dead rank's place can be taken, and how the others meet the
 * process that takes it. Ranks from respawn_from on (the parameter
 * servers' ranks outside mode sync) are let in alone by their peers: the
 * others go on (*alone = 1), once the rank is past the run's start (it
 * reported a step): a process let in alone skips the start's collectives,
 * in which the others would wait for it. Otherwise every rank meets it in a new
 * generation of the segment (dt_comm_rejoin), which needs a survivor that
 * holds the state. Either way only a death by a signal: a rank that exits
 * with an error said why (a replacement that could not rejoin, a wait that
 * timed out) and aborted the communicator, so a process in its place
 * would find its peers failing; the group restarts instead. */
static int replaceable(const sup *s, int r, int signaled, int *alone) {
    const dt_launch_params *p = s->p;
    *alone = p->respawn_from >= 0;
    if (s->first_fail >= 0 || s->forwarded || !signaled) return 0;
    int started = s->started[r] || atomic_load(&s->beats[r].step) >= 0;
    if (*alone) return r >= p->respawn_from && !s->stop_sent && started;
    return s->n > 1 && !g_signal;
}

// " (in an evaluation after step 5)": where a rank was when it died.
static void where(char *at, size_t n, beat_slot *b) {
    int64_t last = atomic_load(&b->step);
    const char *w = phase_words(atomic_load(&b->phase));
    if (last >= 0) snprintf(at, n, " (%s after step %lld)", w, (long long)last);
    else snprintf(at, n, " (%s, before the first step)", w);
}

// Why a rank's process ended by a signal: its memory cgroup's OOM killer
// (dt_mem_cap_oom: the cap and the use), or the signal.
static void oom_why(char *why, size_t n, pid_t pid, int st) {
    char oom[256];
    if (WTERMSIG(st) == SIGKILL && dt_mem_cap_oom((long)pid, oom, sizeof oom)) snprintf(why, n, "%s", oom);
    else snprintf(why, n, "killed by signal %d (%s)", WTERMSIG(st), strsignal(WTERMSIG(st)));
}

/* The one way a dead rank's place is taken (docs/internals.md,
 * "Replacement"): by a ready spare, else, where ranks are let in alone, by
 * a process started for it (up to max_respawns). Returns 1 when it is. */
static int take_place(sup *s, int r, pid_t pid, int st, int hung) {
    const dt_launch_params *p = s->p;
    dt_launch_result *res = s->res;
    int alone;
    if (!replaceable(s, r, WIFSIGNALED(st), &alone)) {
        if (alone && WIFSIGNALED(st) && r >= p->respawn_from && !s->started[r] && s->first_fail < 0 && !s->forwarded &&
            !s->stop_sent)
            dt_log(DT_LOG_WARN, "run: rank %d died in the run's start, which a process let in alone does not join: "
                                "the group stops", r);
        return 0;
    }
    int k = ready_spare(s->beats, s->pids, s->alive, s->n, s->K);
    if (k < 0 && !(alone && res->respawns < p->max_respawns)) return 0;
    int64_t last = atomic_load(&s->beats[r].step);
    char why[320], who[128], at[96] = "";
    if (!hung) where(at, sizeof at, &s->beats[r]);  // (before the slot is reset for the new process)
    else if (last >= 0 && alone) snprintf(at, sizeof at, " at step %lld", (long long)last);
    int inc = dt_shm_take_place(s->base, r, alone);
    beat_reset(&s->beats[r], mono_ns());
    if (hung) snprintf(why, sizeof why, "hung (no heartbeat for %.1f s), killed", s->hung_quiet);
    else if (WIFSIGNALED(st)) oom_why(why, sizeof why, pid, st);
    else snprintf(why, sizeof why, "exited with status %d", WEXITSTATUS(st));
    if (k < 0) {  // a process started for the place
        res->respawns++;
        snprintf(who, sizeof who, "restarting it alone (restart %d of %d, incarnation %d)", res->respawns,
                 p->max_respawns, inc);
        fflush(NULL);
        pid_t np = fork();
        if (np == 0) child_exec(s->argv, r, s->n, s->name, s->beat_fd, s->self, s->p, -1);
        if (np < 0) {
            dt_log(DT_LOG_ERROR, "run: fork of rank %d failed: %s", r, strerror(errno));
            return 0;
        }
        s->pids[r] = np;
    } else {  // a spare: it wakes with the rank
        s->pids[r] = s->pids[s->n + k];
        s->alive[s->n + k] = 0;
        s->nspare--;
        atomic_store(&s->beats[s->n + k].spare_rank, r);
        spare_set(&s->beats[s->n + k], SPARE_ASSIGNED);
        res->replaced++;
        s->replaced_at[r] = dt_now();
        s->died_after[r] = last;
        snprintf(who, sizeof who, "spare %d (pid %d) takes its place%s (%d spare%s left)", k, (int)s->pids[r],
                 alone ? " alone" : "", s->nspare, s->nspare == 1 ? "" : "s");
    }
    s->alive[r] = 1;
    s->nalive++;
    dt_log(DT_LOG_WARN, "run: rank %d (pid %d) %s%s; %s", r, (int)pid, why, at, who);
    return 1;
}

// The group fails with rank r (the first failure; the others are told
// within `grace`, then stopped).
static void fail(sup *s, int r, pid_t pid, int st, int code) {
    dt_launch_result *res = s->res;
    dt_shm_mark_rank(s->base, r, 2, WIFSIGNALED(st) ? WTERMSIG(st) : -code);
    dt_shm_refuse_rejoin(s->base);  // nobody takes its place: ranks in dt_comm_rejoin fail now
    if (s->first_fail >= 0 || s->forwarded) return;
    s->first_fail = r;
    res->exit_code = code;
    res->failed_rank = r;
    res->signal = WIFSIGNALED(st) ? WTERMSIG(st) : 0;
    res->failed_at = dt_now();
    res->failed_early = atomic_load(&s->beats[r].step) <= atomic_load(&s->beats[r].start_step);
    char why[320], at[96] = "";
    if (WIFSIGNALED(st)) oom_why(why, sizeof why, pid, st);
    if (WIFSIGNALED(st)) where(at, sizeof at, &s->beats[r]);
    if (WIFSIGNALED(st))
        dt_log(DT_LOG_ERROR, "run: rank %d (pid %d) %s%s%s", r, (int)pid, why, at,
               s->nalive ? "; stopping the other ranks" : "");
    else
        dt_log(DT_LOG_ERROR, "run: rank %d (pid %d) exited with status %d%s", r, (int)pid, code,
               s->nalive ? "; stopping the other ranks" : "");
    s->term_at = dt_now() + s->p->grace;
}

// A child's exit: an idle spare's, a rank that finished, a rank whose
// place is taken, or the group's failure.
static void reap(sup *s, pid_t pid, int st) {
    int r = 0;
    while (r < s->n + s->K && (s->pids[r] != pid || !s->alive[r])) r++;
    if (r == s->n + s->K) return;
    s->alive[r] = 0;
    int code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    if (r >= s->n) {  // an idle spare
        s->nspare--;
        if (!s->released)
            dt_log(DT_LOG_WARN, "run: spare %d (pid %d) %s %d while idle; %d spare%s left", r - s->n, (int)pid,
                   WIFSIGNALED(st) ? "killed by signal" : "exited with status", WIFSIGNALED(st) ? WTERMSIG(st) : code,
                   s->nspare, s->nspare == 1 ? "" : "s");
        return;
    }
    s->nalive--;
    int hung = s->hung == r;
    if (hung) s->hung = -1;
    if (code == 0 || (code == DT_EXIT_STOPPED && s->stop_sent)) {
        dt_shm_mark_rank(s->base, r, 1, 0);
        s->nstopped += code == DT_EXIT_STOPPED;
        if (s->p->verbose) dt_log(DT_LOG_INFO, "run: rank %d exited%s", r, code ? " (stopped on request)" : "");
        return;
    }
    if (!take_place(s, r, pid, st, hung)) fail(s, r, pid, st, code);
}

// A silent rank is taken for hung: waiting ranks beat, so the silent one
// is the culprit. The message says what the others wait in, and where it
// was itself; every rank is stopped.
static void hang_fails(sup *s, int r, double quiet, int64_t s0, int64_t s1, int64_t last) {
    dt_launch_result *res = s->res;
    s->first_fail = r;
    res->exit_code = 128 + SIGKILL;
    res->failed_rank = r;
    res->hung = 1;
    res->failed_at = dt_now();
    res->failed_early = s1 <= s0;
    char others[1024], wait[96], own[160] = "before its first step";
    describe_waiters(s->beats, s->alive, s->n, r, others, sizeof others);
    if (s1 >= 0) snprintf(own, sizeof own, "at step %lld", (long long)s1);
    if (beat_waiting(&s->beats[r], wait, sizeof wait))
        snprintf(own + strlen(own), sizeof own - strlen(own), ", itself waiting%s", wait);
    if (last)
        dt_log(DT_LOG_ERROR, "run: rank %d (pid %d) sent no heartbeat for %.1f s (last %s): hung%s; stopping all ranks",
               r, (int)s->pids[r], quiet, own, others);
    else
        dt_log(DT_LOG_ERROR, "run: rank %d (pid %d) sent no heartbeat in the %.1f s since it started: hung%s; "
                             "stopping all ranks",
               r, (int)s->pids[r], quiet, others);
    kill(s->pids[r], SIGKILL);
    dt_shm_mark_rank(s->base, r, 2, SIGKILL);
    dt_shm_refuse_rejoin(s->base);
    s->term_at = dt_now() + s->p->grace;
}

// Heartbeats, ten times a second: a rank silent for heartbeat_timeout is
// killed for a new process to take its place (take_place, when it is
// reaped), or else fails the group.
static void check_heartbeats(sup *s, double now) {
    const dt_launch_params *p = s->p;
    if (now < s->next_check) return;
    s->next_check = now + 0.1;
    int64_t ns = mono_ns();
    for (int r = 0; r < s->n; r++) {
        int64_t s0 = atomic_load(&s->beats[r].start_step), s1 = atomic_load(&s->beats[r].step);
        int64_t last = atomic_load(&s->beats[r].time_ns);
        if (!s->alive[r] || s->first_fail >= 0 || s->forwarded || p->heartbeat_timeout <= 0) continue;
        double quiet = (double)(ns - (last ? last : s->start_ns)) * 1e-9;
        if (quiet < p->heartbeat_timeout || s->hung == r) continue;
        int alone, ready = 0;
        for (int k = 0; k < s->K; k++)
            ready += s->alive[s->n + k] && atomic_load(&s->beats[s->n + k].spare_state) == SPARE_READY;
        if (replaceable(s, r, 1, &alone) && (ready || (alone && s->res->respawns < p->max_respawns))) {
            dt_log(DT_LOG_ERROR, "run: rank %d (pid %d) sent no heartbeat for %.1f s: hung; killing it for %s to "
                                 "take its place",
                   r, (int)s->pids[r], quiet, ready ? "a spare" : "a new process");
            kill(s->pids[r], SIGKILL);
            s->hung = r;
            s->hung_quiet = quiet;
            continue;
        }
        hang_fails(s, r, quiet, s0, s1, last);
    }
}

// Requests to stop (after stop_after, or SIGUSR1: checkpoint and stop),
// signals passed on (with `graceful`, the first as a request to stop), and
// the escalation from SIGTERM to SIGKILL.
static void pass_signals(sup *s, double now) {
    const dt_launch_params *p = s->p;
    if (g_signal && !s->forwarded && !s->res->interrupted) s->res->interrupted = g_signal;
    if (g_signal && !s->forwarded && p->graceful > 0 && g_nsignals == 1 && !s->stop_sent) {
        s->stop_sent = 1;
        dt_log(DT_LOG_WARN, "run: %s: every rank checkpoints and stops at the end of its step (again to stop at once)",
               strsignal(g_signal));
        signal_all(s, SIGUSR1);
        s->term_at = now + p->graceful;  // (bounded: then stopped for good)
    }
    if (p->stop_after > 0 && !s->stop_sent && !s->forwarded && s->first_fail < 0 && now - s->t_start >= p->stop_after) {
        s->stop_sent = 1;
        if (p->verbose) dt_log(DT_LOG_INFO, "run: asking every rank to checkpoint and stop");
        signal_all(s, SIGUSR1);
    }
    if (g_usr1 && !s->forwarded) {  // passed on: every rank checkpoints and stops
        g_usr1 = 0;
        s->stop_sent = s->res->stop_asked = 1;
        dt_log(DT_LOG_INFO, "run: SIGUSR1: asking every rank to checkpoint and stop");
        signal_all(s, SIGUSR1);
    }
    if (g_signal && !s->forwarded && (p->graceful <= 0 || g_nsignals >= 2)) {
        s->forwarded = 1;
        if (s->first_fail < 0) s->res->exit_code = 128 + g_signal;
        dt_log(DT_LOG_WARN, "run: %s, stopping %d ranks", strsignal(g_signal), s->nalive);
        signal_all(s, SIGTERM);
        s->kill_at = now + p->term_grace;
        s->term_at = 0;
    }
    if (s->term_at && now >= s->term_at) {
        signal_all(s, SIGTERM);
        s->term_at = 0;
        s->kill_at = now + p->term_grace;
    }
    if (s->forwarded && g_nsignals >= 2 && s->kill_at) /* a second Ctrl-C: no more waiting */
        s->kill_at = now;
    if (s->kill_at && now >= s->kill_at) {
        signal_all(s, SIGKILL);
        s->kill_at = 0;
    }
}

/* A child that ended, left unreaped (WNOWAIT), and its wait status: 0
 * when none did, -1 when no child is left. Until it is reaped its PID
 * stays taken (kill(pid, 0) finds the zombie), so a survivor asking about
 * the rank sees it alive until `reap` marks the segment: its error names
 * what the launcher decided (a new process in the place, or the death),
 * never a moment in between. */
static pid_t next_exit(int *st) {
    siginfo_t si = {0};
    if (waitid(P_ALL, 0, &si, WEXITED | WNOHANG | WNOWAIT) != 0) return errno == EINTR ? 0 : -1;
    if (!si.si_pid) return 0;
    if (si.si_code == CLD_EXITED) *st = W_EXITCODE(si.si_status & 0xff, 0);
    else *st = W_EXITCODE(0, si.si_status) | (si.si_code == CLD_DUMPED ? 0x80 : 0);  // (killed; dumped core)
    return si.si_pid;
}

// The supervisor's loop: every 5 ms, until no rank or spare is left.
static void supervise(sup *s) {
    s->t_start = dt_now();
    s->start_ns = mono_ns();
    while (s->nalive > 0 || s->nspare > 0) {
        release_spares(s);
        note_progress(s);
        int st = 0;
        pid_t pid = next_exit(&st);
        if (pid > 0) {
            reap(s, pid, st);
            waitpid(pid, NULL, 0); /* already ended: returns at once */
            continue;
        }
        if (pid < 0) break; /* no children left */
        /* once every rank has mapped the segment its name is not needed:
         * unlink it now, so that nothing is left even if we are killed */
        int spares_mapped = 1;
        for (int k = 0; k < s->K; k++)
            if (s->alive[s->n + k] && atomic_load(&s->beats[s->n + k].spare_state) == SPARE_STARTING) spares_mapped = 0;
        if (!s->unlinked && s->p->respawn_from < 0 && spares_mapped && dt_shm_all_attached(s->base)) {
            shm_unlink(s->name);
            s->unlinked = 1;
        }
        double now = dt_now();
        check_heartbeats(s, now);
        pass_signals(s, now);
        struct timespec nap = {0, 5000000};
        nanosleep(&nap, NULL);
    }
}

dt_status dt_launch(const dt_launch_params *p, char *const argv[], dt_launch_result *res) {
    if (!p || !argv || !argv[0] || !res) return dt_error(DT_ERR_ARG, "dt_launch: missing program or parameters");
    if (p->nranks < 1 || p->nranks > 4096)
        return dt_error(DT_ERR_ARG, "dt_launch: %d ranks (expected 1..4096)", p->nranks);
    if (p->nspares < 0 || p->nspares > 4096)
        return dt_error(DT_ERR_ARG, "dt_launch: %d spares (expected 0..4096)", p->nspares);
    memset(res, 0, sizeof *res);
    res->failed_rank = -1;
    res->start_step = res->last_step = -1;
    sup s = {.p = p, .argv = argv, .res = res, .n = p->nranks, .K = p->nspares, .beat_fd = -1, .self = getpid(),
             .first_fail = -1, .hung = -1};
    dt_status rc = sup_open(&s);
    if (rc != DT_OK) {
        sup_close(&s);
        return rc;
    }
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
    rc = start_all(&s);
    supervise(&s);
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    sigaction(SIGHUP, &old_hup, NULL);
    sigaction(SIGUSR1, &old_usr1, NULL);
    res->stopped = s.first_fail < 0 && !s.forwarded && s.nstopped > 0;
    sup_close(&s);
    return rc;
}
