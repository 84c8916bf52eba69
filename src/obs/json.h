/* Writing JSON result files (summary.json). */
#ifndef DT_OBS_JSON_H
#define DT_OBS_JSON_H

#include "dtrain/core.h"

#include <cjson/cJSON.h>

/* Prints o (indented, one trailing newline) to `path` atomically and frees
 * o, whether or not the write succeeds. */
dt_status dt_json_write(const char *path, cJSON *o);

#endif
