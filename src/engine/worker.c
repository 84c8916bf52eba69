#include "engine/worker.h"

#include <stdio.h>
#include <stdlib.h>

dt_status dt_worker_init(const dt_config *c, dt_comm_t *comm, int *threads) {
    dt_status st = dt_comm_init_env(comm);
    if (st != DT_OK) return st;
    int t = c->threads;
    if (t <= 0 && c->deterministic) t = 1;
    if (t <= 0) {
        dt_set_threads(0);
        t = dt_get_threads() / dt_comm_local_size(*comm);
        if (t < 1) t = 1;
    }
    dt_set_threads(t);
    *threads = t;
    return DT_OK;
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

dt_status dt_worker_fault(int rank, int64_t step) {
    const char *f = getenv("DTRAIN_FAULT_STEP");
    int r;
    long long s;
    if (f && sscanf(f, "%d:%lld", &r, &s) == 2 && r == rank && s == step)
        return dt_error(DT_ERR_INTERNAL, "injected fault (DTRAIN_FAULT_STEP)");
    return DT_OK;
}
