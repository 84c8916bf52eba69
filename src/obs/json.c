#include "obs/json.h"

#include <stdlib.h>
#include <string.h>

void dt_json_add_parallel(cJSON *o, const dt_train_result *r) {
    cJSON_AddNumberToObject(o, "workers", r->workers);
    cJSON_AddNumberToObject(o, "threads_per_worker", r->threads);
    cJSON_AddNumberToObject(o, "comm_seconds", r->comm_seconds);
    cJSON_AddNumberToObject(o, "comm_exposed_seconds", r->comm_exposed_seconds);
    cJSON_AddNumberToObject(o, "bytes_sent", (double)r->bytes_sent);
}
