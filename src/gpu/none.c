/* A build without CUDA: no GPU device, said so wherever one is asked for. */
#include "gpu/gpu.h"

#include <stdio.h>

static const char none[] = "this dtrain was built without CUDA (build it where the CUDA toolkit is, "
                           "cmake -DDTRAIN_CUDA=ON; docs/gpu.md)";

const char *dt_gpu_build(void) { return "no CUDA device in this build"; }

int dt_gpu_count(char *why, size_t n) {
    snprintf(why, n, "%s", none);
    return 0;
}

static dt_status no_gpu(void) { return dt_error(DT_ERR_ARG, "%s", none); }

dt_status dt_gpu_describe(int index, char *out, size_t n) {
    (void)index;
    if (n) out[0] = 0;
    return no_gpu();
}
dt_status dt_gpu_use(int index) { return (void)index, no_gpu(); }
dt_status dt_gpu_alloc(void **dev, size_t bytes) { return (void)bytes, *dev = NULL, no_gpu(); }
void dt_gpu_free(void *dev) { (void)dev; }
dt_status dt_gpu_to_device(void *dev, const void *host, size_t bytes) {
    return (void)dev, (void)host, (void)bytes, no_gpu();
}
dt_status dt_gpu_to_host(void *host, const void *dev, size_t bytes) {
    return (void)host, (void)dev, (void)bytes, no_gpu();
}
dt_status dt_gpu_sync(void) { return no_gpu(); }
dt_status dt_gpu_adamw(float *w, const float *g, float *m, float *v, size_t n, const dt_adamw_k *k) {
    return (void)w, (void)g, (void)m, (void)v, (void)n, (void)k, no_gpu();
}
dt_status dt_gpu_sgd(float *w, const float *g, float *buf, size_t n, const dt_sgd_k *k) {
    return (void)w, (void)g, (void)buf, (void)n, (void)k, no_gpu();
}
