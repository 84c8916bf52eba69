/* What the model tables share (task.h): a tensor-parallel model's shard
 * groups, an evaluation's split over the ranks, the weights file. */
#include "engine/tasks/task.h"
#include "engine/checkpoints.h"

#include <string.h>

dt_status dt_task_shard_groups(dt_comm_t comm, int tensor, int *ntp, int *tp, dt_comm_t *tpc, dt_comm_t *rest) {
    int rank = dt_comm_rank(comm);
    dt_comm_destroy(*tpc);
    dt_comm_destroy(*rest);
    *tpc = *rest = NULL;
    *ntp = tensor > 1 ? tensor : 1;
    *tp = rank % *ntp;
    if (*ntp == 1) return DT_OK;
    dt_status st = dt_comm_split(comm, rank / *ntp, *tp, tpc);
    if (st == DT_OK) st = dt_comm_split(comm, *tp, rank, rest);
    return st == DT_OK ? DT_OK : dt_error(st, "tensor parallel: splitting the workers: %s", dt_last_error());
}

void dt_task_eval_share(long n, int r, int W, int chunk, int *lo, int *hi, int *extra) {
    *lo = (int)(n * r / W);
    *hi = (int)(n * (r + 1) / W);
    long most = (n + W - 1) / W, mine = *hi - *lo;
    *extra = (int)((most + chunk - 1) / chunk - (mine + chunk - 1) / chunk);
}

dt_status dt_task_replay(dt_task_layer_fn fn, void *user, int first, int last, int times) {
    dt_status st = DT_OK;
    for (int k = 0; fn && k < times && st == DT_OK; k++)
        for (int l = first; l <= last && st == DT_OK; l++) st = fn(l, 0, user);
    return st;
}

// What of the whole block this rank holds: its parts (fill), or its slice
// [lo, hi) of params.
typedef struct {
    const float *params;
    size_t lo, hi;
    dt_part_fill_fn fill;
    void *user;
} held;

static void fill_held(void *user, size_t lo, size_t hi, float *buf) {
    held *h = user;
    if (h->fill) return h->fill(h->user, h->params, lo, hi, buf);
    size_t a = lo > h->lo ? lo : h->lo, b = hi < h->hi ? hi : h->hi;
    if (a < b) memcpy(buf + (a - lo), h->params + a, sizeof(float) * (b - a));
}

dt_status dt_task_write_weights(const char *path, const dt_tensor_info *tensors, int n, const dt_st_meta *meta,
                                int nmeta, const float *params, dt_part_fill_fn fill, void *user, dt_comm_t comm,
                                size_t lo, size_t hi) {
    if (!path && !comm) return DT_OK;
    held h = {params, lo, hi, fill, user};
    dt_status st = dt_run_weights_write(path, tensors, n, meta, nmeta, comm, fill_held, &h);
    return st == DT_OK ? DT_OK : dt_error(st, "saving the model: %s", dt_last_error());
}
