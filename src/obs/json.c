#include "obs/json.h"

#include <stdlib.h>
#include <string.h>

dt_status dt_json_write(const char *path, cJSON *o) {
    char *s = cJSON_Print(o);
    cJSON_Delete(o);
    if (!s) return dt_error(DT_ERR_NOMEM, "%s: out of memory", path);
    size_t n = strlen(s);
    const void *parts[] = {s, "\n"};
    size_t sizes[] = {n, 1};
    dt_status st = dt_write_atomic(path, parts, sizes, 2);
    free(s);
    return st;
}

void dt_json_add_parallel(cJSON *o, const dt_train_result *r) {
    cJSON_AddNumberToObject(o, "workers", r->workers);
    cJSON_AddNumberToObject(o, "threads_per_worker", r->threads);
    cJSON_AddNumberToObject(o, "comm_seconds", r->comm_seconds);
    cJSON_AddNumberToObject(o, "comm_exposed_seconds", r->comm_exposed_seconds);
}
