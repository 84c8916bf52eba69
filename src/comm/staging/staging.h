/* staging.h - the device communicators' staging backend (comm/device.h):
 * its entry for the registry. */
#ifndef DT_COMM_STAGING_H
#define DT_COMM_STAGING_H

#include "comm/comm_impl.h"
#include "comm/device.h"

/* Makes c (front-end fields set from host) stage each collective through
 * a pinned host buffer and a split of host. */
DT_HIDDEN dt_status dt_staging_init(dt_comm_t c, dt_comm_t host, const dt_comm_device_params *p);

#endif
