#include "engine/worker.h"
#include "dtrain/launch.h"
#include "kernels/kernels.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A rank blocked in a collective tells the launcher that it is alive and
 * what it waits on, so that only a rank that really stopped looks hung. */
static void wait_beat(const dt_comm_wait_info *w) {
    dt_heartbeat_wait(w ? w->op : NULL, w ? w->seq : 0, w ? w->peer : -1);
}

// Long work inside a call (dt_progress) is a heartbeat.
static void alive_beat(void) { dt_heartbeat(-1); }

static char cap_how[512];

const char *dt_worker_mem_cap(void) { return cap_how; }

dt_status dt_worker_init(const dt_config *c, dt_comm_t *comm, int *threads) {
    dt_comm_set_wait_hook(wait_beat);
    dt_set_alive_hook(alive_beat);
    dt_status st = dt_comm_init_env(comm);
    if (st != DT_OK) return st;
    // A spare in a dead rank's place that every rank meets again joins the
    // running group (dt_comm_rejoin); the start-up collectives are over.
    dt_place place = dt_worker_place(*comm);
    if (place == DT_PLACE_REPLICA && (st = dt_comm_rejoin(*comm, 0)) != DT_OK) {
        st = dt_error(st, "rank %d (a spare in a dead worker's place), joining the group: %s", dt_comm_rank(*comm),
                      dt_last_error());
        dt_worker_exit(*comm, st);
        *comm = NULL;
        return st;
    }
    const char *lname;
    size_t lim = dt_mem_limit(&lname);
    if (lim && !cap_how[0]) {  // --memory-limit: every worker's own, enforced by the kernel
        if ((st = dt_mem_cap(lim, cap_how, sizeof cap_how)) != DT_OK) {
            st = dt_error(st, "rank %d, %s: %s", dt_comm_rank(*comm), lname, dt_last_error());
            dt_worker_exit(*comm, st);
            *comm = NULL;
            return st;
        }
        if (dt_comm_rank(*comm) == 0) {
            char b[64];
            dt_log(DT_LOG_INFO, "memory: each worker capped at %s (%s) by %s", dt_mem_format(lim, b, sizeof b), lname,
                   cap_how);
        }
    }
    int t = c->threads;
    if (t <= 0 && c->deterministic) t = 1;
    if (t <= 0) {
        dt_set_threads(0);
        t = dt_get_threads() / dt_comm_local_size(*comm);
        if (t < 1) t = 1;
    }
    dt_set_threads(t);
    *threads = t;
    dt_kernels_set_precision((dt_dtype)c->precision);
    if (place != DT_PLACE_REPLICA && (st = dt_fault_at(dt_comm_rank(*comm), 0, "join")) != DT_OK) {  // (a test's fault)
        dt_worker_exit(*comm, st);
        *comm = NULL;
        return st;
    }
    // Rank 0 took the run directory (dt_run_dir_lock) before it joined: the
    // others touch nothing there until it has, nor when it was refused.
    // (A rank let in alone, dt_comm_incarnation, joins no start either.)
    // A death here with spares (--spares): the spare in the dead rank's
    // place joins, and the start's state comes from a replica (dt_train).
    if (dt_comm_size(*comm) > 1 && place == DT_PLACE_START) {
        st = dt_barrier(*comm);
        if (dt_worker_recoverable(st)) st = dt_comm_rejoin(*comm, 0);
        if (st != DT_OK) {
            st = dt_error(st, "rank %d, joining the group: %s", dt_comm_rank(*comm), dt_last_error());
            dt_worker_exit(*comm, st);
            *comm = NULL;
            return st;
        }
    }
    if ((st = dt_fault_start(dt_comm_rank(*comm))) != DT_OK) {
        dt_worker_exit(*comm, st);
        *comm = NULL;
    }
    return st;
}

int dt_worker_spares(void) {
    const char *k = getenv("DTRAIN_SPARES");
    return k && atoi(k) > 0 && !getenv("DTRAIN_ALONE_FROM") ? atoi(k) : 0;
}

dt_place dt_worker_place(dt_comm_t comm) {
    return dt_comm_incarnation(comm) > 0 ? DT_PLACE_ALONE : dt_spare_rank() >= 0 ? DT_PLACE_REPLICA : DT_PLACE_START;
}

int dt_worker_recoverable(dt_status st) {
    return (st == DT_ERR_COMM || st == DT_ERR_TIMEOUT) && dt_worker_spares() > 0;
}

dt_status dt_worker_run_dir(const dt_config *c, const char *run_dir) {
    if (!run_dir) return DT_OK;
    dt_status st = dt_make_dirs(run_dir);
    if (st != DT_OK) return st;
    char path[4096];
    snprintf(path, sizeof path, "%s/config.ini", run_dir);
    return dt_config_write(c, path);
}

dt_status dt_worker_exit(dt_comm_t comm, dt_status st) {
    if (st != DT_OK && comm && dt_comm_size(comm) > 1) dt_comm_abort(comm, dt_last_error());
    char saved[1024];
    snprintf(saved, sizeof saved, "%s", dt_last_error());
    dt_comm_destroy(comm);
    if (st != DT_OK) dt_error(st, "%s", saved);
    return st;
}

dt_schedule dt_worker_schedule(const dt_config *c, int64_t total) {
    float peak = c->lr_scaling ? c->optim.lr * (float)c->batch / (float)c->base_batch : c->optim.lr;
    return (dt_schedule){c->sched, peak, c->min_lr, c->warmup_steps, total};
}

// DTRAIN_SLOW_RANK's entries for `rank` (a list "R:MS" or "R:xF", R a rank
// or * for every worker): the milliseconds of sleep (factor 0) or the
// factor (factor 1) they add up to; a factor's entries add F - 1 each.
static double slow_rank(int rank, int factor) {
    double sum = 0;
    for (const char *e = getenv("DTRAIN_SLOW_RANK"); e && *e;) {
        int r = rank, n = 0;
        double v;
        if (*e == '*') {
            if (rank < 0) r = rank + 1;  // not the servers (negative ranks)
            n = 1;
        } else if (sscanf(e, "%d%n", &r, &n) != 1)
            break;
        if (e[n] == ':' && r == rank) {
            if (factor && e[n + 1] == 'x' && sscanf(e + n + 2, "%lf", &v) == 1 && v > 1) sum += v - 1;
            if (!factor && e[n + 1] != 'x' && sscanf(e + n + 1, "%lf", &v) == 1 && v > 0) sum += v;
        }
        e = strchr(e, ',');
        if (e) e++;
    }
    return sum;
}

dt_status dt_fault_step(int rank, int64_t step) {
    double ms = slow_rank(rank, 0);
    if (ms > 0) usleep((useconds_t)(ms * 1000));
    return dt_fault_at(rank, step, NULL);
}

dt_status dt_fault_at(int rank, int64_t step, const char *place) {
    const char *f = getenv("DTRAIN_FAULT_STEP"), *once = getenv("DTRAIN_FAULT_ONCE");
    int r;
    long long s;
    // R:S[:KIND[:PLACE]], or several separated by commas (the k-th one's ONCE file is FILE.k)
    char kind[16] = "error", at[16];
    int matched = 0, k = 0;
    for (const char *e = f; e && *e && !matched; k++) {
        char one[64];
        size_t len = strcspn(e, ",");
        snprintf(one, sizeof one, "%.*s", (int)len, e);
        e = e[len] ? e + len + 1 : NULL;
        snprintf(kind, sizeof kind, "error");
        at[0] = 0;
        if (sscanf(one, "%d:%lld:%15[^:]:%15s", &r, &s, kind, at) < 2 || r != rank || s != step) continue;
        if (place ? strcmp(at, place) != 0 : at[0] != 0) continue;
        if (once && *once) {
            char path[4200];
            if (k) snprintf(path, sizeof path, "%s.%d", once, k);
            else snprintf(path, sizeof path, "%s", once);
            int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0644);
            if (fd < 0) continue;  // fired before
            close(fd);
        }
        matched = 1;
    }
    if (!matched) return DT_OK;
    if (!strcmp(kind, "kill")) raise(SIGKILL);
    if (!strcmp(kind, "hang"))
        for (;;) pause();
    if (!strcmp(kind, "stop")) {  // SIGSTOP to itself: the launcher's heartbeat finds it silent and kills it
        raise(SIGSTOP);
        return DT_OK;
    }
    return dt_error(DT_ERR_INTERNAL, "injected fault (DTRAIN_FAULT_STEP%s%s)", place ? " at " : "", place ? place : "");
}

void dt_fault_slow(int rank, double seconds) {
    double more = slow_rank(rank, 1);
    if (more > 0 && seconds > 0) usleep((useconds_t)(more * seconds * 1e6));
}

void dt_fault_slow_layer(int rank, int layer) {
    const char *slow = getenv("DTRAIN_SLOW_LAYER");
    int r, l, ms;
    if (slow && sscanf(slow, "%d:%d:%d", &r, &l, &ms) == 3 && r == rank && l == layer && ms > 0)
        usleep((useconds_t)ms * 1000);
}

int dt_fault_overflow(int rank, int64_t step) {
    const char *f = getenv("DTRAIN_FAULT_OVERFLOW");
    int r;
    long long s;
    return f && sscanf(f, "%d:%lld", &r, &s) == 2 && r == rank && s == step;
}

dt_status dt_fault_start(int rank) {
    const char *f = getenv("DTRAIN_FAULT_START");
    int r, n = 0;
    if (!f || sscanf(f, "%d:%n", &r, &n) != 1 || !n || r != rank || access(f + n, F_OK) != 0) return DT_OK;
    return dt_error(DT_ERR_INTERNAL, "rank %d: injected start failure (DTRAIN_FAULT_START: %s exists)", rank, f + n);
}
