/* nccl.h - the device communicators' NCCL backend (comm/device.h): its
 * entries for the registry. */
#ifndef DT_COMM_NCCL_H
#define DT_COMM_NCCL_H

#include "comm/comm_impl.h"
#include "comm/device.h"

/* 1 when this rank can use NCCL (the library found, of a version dtrain
 * takes, and a GPU of its own), else 0 with the reason in why[n]. */
DT_HIDDEN int dt_nccl_usable(const dt_comm_device_params *p, char *why, size_t n);
/* Makes c (front-end fields set from host) an NCCL communicator over
 * host's ranks: a collective over host. */
DT_HIDDEN dt_status dt_nccl_init(dt_comm_t c, dt_comm_t host, const dt_comm_device_params *p);

#endif
