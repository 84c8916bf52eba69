/* [train] device against this build and this machine (docs/gpu.md). */
#include "dtrain/train.h"
#include "gpu/gpu.h"

#include <stdio.h>

dt_status dt_train_check_device(const dt_config *c) {
    int want = dt_device_index(c->device);
    if (want < 0) return DT_OK;
    char why[512], what[200] = "";
    int n = dt_gpu_count(why, sizeof why);
    if (n == 0) return dt_error(DT_ERR_CONFIG, "[train] device = %s: %s", c->device, why);
    if (want >= n)
        return dt_error(DT_ERR_CONFIG, "[train] device = %s: this machine has %d GPU%s (cuda:0%s%.0d)", c->device, n,
                        n > 1 ? "s" : "", n > 1 ? " to cuda:" : "", n > 1 ? n - 1 : 0);
    dt_gpu_describe(want, what, sizeof what);
    return dt_error(DT_ERR_CONFIG, "[train] device = %s (%s): training on a GPU is not in this dtrain yet; %s has its "
                    "kernels and their tests against the CPU's (docs/gpu.md)", c->device, what, dt_gpu_build());
}

void dt_device_report(char *out, size_t n) {
    char why[512] = "", what[200] = "";
    int gpus = dt_gpu_count(why, sizeof why);
    size_t k = (size_t)snprintf(out, n, "cuda: %s\ngpus: %d", dt_gpu_build(), gpus);
    for (int i = 0; i < gpus && k < n; i++)
        if (dt_gpu_describe(i, what, sizeof what) == DT_OK) k += (size_t)snprintf(out + k, n - k, "%s cuda:%d %s",
                                                                                  i ? ";" : " (", i, what);
    if (k < n) k += (size_t)snprintf(out + k, n - k, "%s", gpus ? ")" : "");
    if (!gpus && k < n) k += (size_t)snprintf(out + k, n - k, " (%s)", why);
    const char *libs[] = {"cublaslt", "cudnn", "nccl"};
    for (int i = 0; i < 3 && k < n; i++) {
        dt_gpu_lib l;
        if (dt_gpu_lib_open(libs[i], &l) == DT_OK) {
            k += (size_t)snprintf(out + k, n - k, "\n%s: %ld.%ld.%ld (%s)", libs[i], l.version / 10000,
                                  l.version / 100 % 100, l.version % 100, l.path);
            dt_gpu_lib_close(&l);
        } else {
            k += (size_t)snprintf(out + k, n - k, "\n%s: %s", libs[i], dt_last_error());
        }
    }
}
