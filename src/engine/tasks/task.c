/* What the model tables share (task.h): a tensor-parallel model's shard
 * groups. */
#include "engine/tasks/task.h"

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
