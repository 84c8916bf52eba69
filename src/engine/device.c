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
