/* Writing JSON result files (summary.json). */
#ifndef DT_OBS_JSON_H
#define DT_OBS_JSON_H

#include "dtrain/core.h"
#include "dtrain/train.h"

#include <cjson/cJSON.h>

/* Prints o (indented, one trailing newline) to `path` atomically and frees
 * o, whether or not the write succeeds. */
dt_status dt_json_write(const char *path, cJSON *o);

/* Adds the data-parallel fields every run's summary.json carries: workers,
 * threads_per_worker, comm_seconds and comm_exposed_seconds (the gradient
 * allreduce windows and the part of them after backward, summed over steps;
 * 0 on one worker). */
void dt_json_add_parallel(cJSON *o, const dt_train_result *r);

#endif
