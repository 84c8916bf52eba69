/* devcomm.c - device communicators (comm/device.h): which backend, agreed
 * by every rank, and the communicator made over the host's. */
#include "comm/registry.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// The backend DTRAIN_GPU_COMM forces (its index), -1 for auto.
static dt_status forced(const dt_comm_device_entry *t, int nb, int *out) {
    const char *want = getenv("DTRAIN_GPU_COMM");
    *out = -1;
    if (!want || !*want || !strcmp(want, "auto")) return DT_OK;
    for (int i = 0; i < nb; i++)
        if (!strcmp(want, t[i].name)) *out = i;
    if (*out >= 0) return DT_OK;
    char names[128] = "";
    size_t k = 0;
    for (int i = 0; i < nb && k < sizeof names; i++) k += (size_t)snprintf(names + k, sizeof names - k, "%s, ", t[i].name);
    return dt_error(DT_ERR_CONFIG, "DTRAIN_GPU_COMM=%s: expected %sor auto", want, names);
}

// The first backend from `from` that every rank can use (each rank asks
// its own; an allreduce finds the first rank that cannot), why[n] saying
// what it is and why those before it were passed over.
static dt_status choose(dt_comm_t host, const dt_comm_device_params *p, const dt_comm_device_entry *t, int nb,
                        int force, int *pick, char *why, size_t n) {
    char skipped[700] = "", mine[512];
    size_t k = 0;
    for (int i = force >= 0 ? force : 0; i < nb; i++) {
        int ok = t[i].usable(p, mine, sizeof mine);
        int64_t first = ok ? dt_comm_size(host) : dt_comm_rank(host);
        dt_status st = dt_allreduce(&first, &first, 1, DT_I64, DT_MIN, host);
        if (st != DT_OK) return dt_error(st, "the GPUs' communicator, agreeing on its backend: %s", dt_last_error());
        if (first == dt_comm_size(host)) {
            *pick = i;
            snprintf(why, n, "%s%s%s", mine, k ? "; not " : "", skipped);
            return DT_OK;
        }
        char other[64];
        snprintf(other, sizeof other, "rank %lld cannot use it", (long long)first);
        const char *because = first == dt_comm_rank(host) ? mine : other;
        if (force >= 0)
            return dt_error(DT_ERR_CONFIG, "DTRAIN_GPU_COMM=%s on rank %d: %s", t[i].name, dt_comm_rank(host), because);
        if (k < sizeof skipped)
            k += (size_t)snprintf(skipped + k, sizeof skipped - k, "%s%s: %s", k ? "; " : "", t[i].name, because);
    }
    return dt_error(DT_ERR_CONFIG, "no backend for the GPUs' communicator: %s", skipped);
}

dt_status dt_comm_init_device(dt_comm_t host, const dt_comm_device_params *p, dt_comm_t *out, char *why, size_t n) {
    *out = NULL;
    int nb, force, pick = -1;
    const dt_comm_device_entry *t = dt_comm_device_backends(&nb);
    dt_status st = forced(t, nb, &force);
    if (st == DT_OK) st = choose(host, p, t, nb, force, &pick, why, n);
    if (st != DT_OK) return st;
    dt_comm_t c = dt_comm_alloc();
    if (!c) return dt_error(DT_ERR_NOMEM, "the GPUs' communicator: out of memory");
    c->rank = host->rank;
    c->size = host->size;
    c->local_rank = host->local_rank;
    c->local_size = host->local_size;
    c->node = host->node;
    c->nnodes = host->nnodes;
    c->world_rank = host->world_rank;
    c->timeout = host->timeout;
    c->check = 0;  // (the staging's host communicator checks its own collectives; NCCL has no check)
    if ((st = t[pick].init(c, host, p)) != DT_OK) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", dt_last_error());
        dt_comm_destroy(c);
        return dt_error(st, "%s", msg);
    }
    *out = c;
    return DT_OK;
}

dt_status dt_iallreduce_after(const void *send, void *recv, size_t count, dt_dtype dtype, dt_redop op, void *event,
                              dt_comm_t c, dt_request_t *req) {
    if (!req) return dt_error(DT_ERR_ARG, "iallreduce: req is NULL");
    dt_coll_args a = {.kind = DT_COLL_ALLREDUCE, .send = send, .recv = recv, .count = count, .dtype = dtype,
                      .op = op, .after = event};
    return dt_comm_submit(c, &a, req);
}

dt_status dt_ireduce_after(const void *send, void *recv, size_t count, dt_dtype dtype, dt_redop op, int root,
                           void *event, dt_comm_t c, dt_request_t *req) {
    if (!req) return dt_error(DT_ERR_ARG, "ireduce: req is NULL");
    dt_coll_args a = {.kind = DT_COLL_REDUCE, .send = send, .recv = recv, .count = count, .dtype = dtype,
                      .op = op, .root = root, .after = event};
    return dt_comm_submit(c, &a, req);
}
