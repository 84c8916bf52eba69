#include "engine/worker.h"

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
