/*
 * wait.c - how a rank waits for its peers without stealing their core.
 *
 * Spinning is the fastest way to see a flag flip, but on a machine with
 * fewer cores than ranks (or with compute threads beside the ranks) a
 * spinning rank burns the very core its peer needs to make progress. So a
 * wait goes through three phases:
 *   1. spin with a pause instruction for up to 10 us, and only when every
 *      rank on this host can have a core of its own;
 *   2. sched_yield(), for about a millisecond;
 *   3. sleep, 20 us growing to 1 ms; or, for the shm backend, block on a
 *      futex that the peers wake when they raise a flag
 *      (dt_waiter_should_block() says when).
 * The caller polls its flag between steps and, when dt_waiter_step() says
 * so, does the slow checks: peer liveness, aborts, the deadline. There it
 * also reports what it waits on (dt_waiter_note) to the process's wait
 * hook, which dtrain's workers point at their launcher heartbeat: a rank
 * waiting for a peer is alive, and says for whom.
 */
#include "comm/comm_impl.h"

#include <sched.h>
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#elif defined(__aarch64__)
#define cpu_relax() __asm__ __volatile__("yield" ::: "memory")
#else
#define cpu_relax() ((void)0)
#endif

static int online_cpus(void) {
    static int n;
    if (!n) {
        long v = sysconf(_SC_NPROCESSORS_ONLN);
        n = v > 0 ? (int)v : 1;
    }
    return n;
}

void dt_waiter_init(dt_waiter *w, double timeout, int nranks_on_host) {
    w->start = dt_now();
    w->deadline = w->start + timeout;
    w->next_check = w->start + 0.01;
    w->iters = 0;
    w->spin_limit = nranks_on_host <= online_cpus() ? 1 : 0;
}

#define SPIN_SECONDS 10e-6  /* a peer that has a core of its own answers well within this */
#define YIELD_SECONDS 2e-3

int dt_waiter_step(dt_waiter *w) {
    unsigned i = w->iters++;
    if (w->spin_limit) {
        cpu_relax();
        if ((i & 63) != 63) return 0;
        if (dt_now() - w->start < SPIN_SECONDS) return 0;
        w->spin_limit = 0;
    } else {
        double el = dt_now() - w->start;
        if (el < YIELD_SECONDS) {
            sched_yield();
        } else {
            long ns = el < 0.05 ? 20000 : el < 1.0 ? 200000 : 1000000;
            struct timespec ts = {0, ns};
            nanosleep(&ts, NULL);
        }
    }
    double now = dt_now();
    if (now >= w->next_check) {
        w->next_check = now + (now - w->start < 1.0 ? 0.01 : 0.05);
        return 1;
    }
    return 0;
}

int dt_waiter_expired(const dt_waiter *w) { return dt_now() >= w->deadline; }

int dt_waiter_should_block(const dt_waiter *w) {
    return !w->spin_limit && dt_now() - w->start >= YIELD_SECONDS;
}

int dt_waiter_tick(dt_waiter *w) {
    double now = dt_now();
    if (now >= w->next_check) {
        w->next_check = now + (now - w->start < 1.0 ? 0.01 : 0.05);
        return 1;
    }
    return 0;
}

static _Atomic(dt_comm_wait_hook) g_wait_hook;
static _Thread_local int t_noted; /* this thread reported a wait not yet over */

void dt_comm_set_wait_hook(dt_comm_wait_hook fn) { atomic_store(&g_wait_hook, fn); }

void dt_waiter_note(const dt_coll_args *a, int peer) {
    dt_comm_wait_hook fn = atomic_load(&g_wait_hook);
    if (!fn) return;
    dt_comm_wait_info w = {dt_coll_name(a->check_of ? (dt_coll)(a->check_of - 1) : a->kind), a->seq, peer};
    fn(&w);
    t_noted = 1;
}

void dt_waiter_note_op(const char *op, uint64_t seq, int peer) {
    dt_comm_wait_hook fn = atomic_load(&g_wait_hook);
    if (!fn) return;
    dt_comm_wait_info w = {op, seq, peer};
    fn(&w);
    t_noted = 1;
}

void dt_waiter_done(void) {
    if (!t_noted) return;
    t_noted = 0;
    dt_comm_wait_hook fn = atomic_load(&g_wait_hook);
    if (fn) fn(NULL);
}
