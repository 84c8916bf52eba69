#include "obs/json.h"

#include "kernels/kernels.h"

#include <stdlib.h>
#include <string.h>

void dt_json_add_parallel(cJSON *o, const dt_train_result *r) {
    cJSON_AddNumberToObject(o, "workers", r->workers);
    cJSON_AddNumberToObject(o, "threads_per_worker", r->threads);
    cJSON_AddNumberToObject(o, "comm_seconds", r->comm_seconds);
    cJSON_AddNumberToObject(o, "comm_exposed_seconds", r->comm_exposed_seconds);
    cJSON_AddNumberToObject(o, "bytes_sent", (double)r->bytes_sent);
    const dt_cpu *cpu = dt_cpu_get();
    cJSON *c = cJSON_AddObjectToObject(o, "cpu");
    cJSON_AddStringToObject(c, "name", cpu->name);
    cJSON_AddStringToObject(c, "vendor", cpu->vendor);
    cJSON_AddNumberToObject(c, "family", cpu->family);
    cJSON_AddNumberToObject(c, "model", cpu->model);
    cJSON_AddStringToObject(c, "isa", dt_isa_name(cpu->isa));
    cJSON_AddStringToObject(c, "isa_found", dt_isa_name(cpu->found));
    cJSON_AddStringToObject(c, "onednn_isa", dt_kernels_isa());
}
