/* Which GPU a rank trains on (engine/device.c; docs/gpu.md, "Several
 * ranks"): [train] device = cuda:N puts every rank of a host on GPU N;
 * cuda spreads them over the host's GPUs by local rank, one GPU each where
 * there are enough. */
#ifndef DT_ENGINE_DEVICE_H
#define DT_ENGINE_DEVICE_H

#include "dtrain/comm.h"
#include "dtrain/config.h"
#include "gpu/dev_model.h"

#include <stddef.h>

/* This rank's GPU under c, over comm's ranks (*index), and shared[n]: ""
 * when no other rank of this host uses it, else why ("2 ranks of this host
 * on 1 GPU"). */
dt_status dt_train_device_for(const dt_config *c, dt_comm_t comm, int *index, char *shared, size_t n);
/* A GPUs' communicator (comm/device.h) over the ranks of `over` (a
 * collective over them), this rank's GPU and whether it shares it as
 * dt_train_device_for says over world; why[n]: its backend and why. */
dt_status dt_train_device_comm(const dt_config *c, dt_comm_t world, dt_comm_t over, dt_comm_t *out, char *why,
                               size_t n);
/* Logs (info) how `what` travels on c, made by dt_train_device_comm with
 * why: "<what> on the GPUs (<why>)" or "<what> staged through host memory
 * (<why>)". */
void dt_train_device_comm_said(const char *what, dt_comm_t c, const char *why);
/* The same, made this process's device (the seam's use), before anything
 * is allocated on it. A CPU run: nothing. */
dt_status dt_train_device_use(const dt_config *c, dt_comm_t comm);
/* The part of the state a rank keeps on its device: under [parallel] zero
 * the optimizer's state of its dt_shard_range slice over comm (else the
 * whole: 0 of 1), and at zero = 2 and 3 with several ranks the gradients
 * backed on demand, at 3 the parameters too; model parallel: held (the
 * ranges a stage keeps backed, by the strategy, the optimizer's state
 * too). */
dt_dev_part dt_train_device_part(const dt_config *c, dt_comm_t comm);
/* The device's memory by kind (k: dt_dev_blocks_kinds') into the metrics. */
struct dt_obs;
void dt_train_device_metrics(struct dt_obs *obs, const size_t k[DT_DEV_KINDS]);
/* summary.json's "gpu" object in o, with what every device run has (the
 * device, its name, the GEMMs' operands, the memory by kind), returned for
 * the strategy's own fields. */
struct cJSON;
struct cJSON *dt_train_device_summary(struct cJSON *o, const dt_config *c, const dt_dev_blocks *b);

#endif
