/* Internal file helpers of the core layer that need cJSON (the public ones,
 * dt_write_atomic and dt_read_file_gz, are in dtrain/core.h). */
#ifndef DT_CORE_FILE_H
#define DT_CORE_FILE_H

#include "dtrain/core.h"

#include <cjson/cJSON.h>

/* Prints o (indented, one trailing newline) to `path` atomically and frees
 * o, whether or not the write succeeds. */
dt_status dt_json_write(const char *path, cJSON *o);

#endif
