/* summary.json fields shared by the training loops (written with
 * core/file.h's dt_json_write). */
#ifndef DT_OBS_JSON_H
#define DT_OBS_JSON_H

#include "core/file.h"
#include "dtrain/train.h"

#include <cjson/cJSON.h>

/* Adds the data-parallel fields every run's summary.json carries: workers,
 * threads_per_worker, comm_seconds and comm_exposed_seconds (the gradient
 * allreduce windows and the part of them after backward, summed over steps;
 * 0 on one worker), and the CPU: its name, family and model, the
 * instruction set found and the one used (dt_cpu_get), oneDNN's. */
void dt_json_add_parallel(cJSON *o, const dt_train_result *r);

#endif
