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
dt_status dt_gpu_copy(void *dev_to, const void *dev_from, size_t bytes) {
    return (void)dev_to, (void)dev_from, (void)bytes, no_gpu();
}
dt_status dt_gpu_memset0(void *dev, size_t bytes) { return (void)dev, (void)bytes, no_gpu(); }
dt_status dt_gpu_mem_info(size_t *free_bytes, size_t *total) { return *free_bytes = *total = 0, no_gpu(); }
dt_status dt_gpu_host_alloc(void **host, size_t bytes) { return (void)bytes, *host = NULL, no_gpu(); }
void dt_gpu_host_free(void *host) { (void)host; }
dt_status dt_gpu_sync(void) { return no_gpu(); }
dt_status dt_gpu_adamw(float *w, const float *g, float *m, float *v, size_t n, const dt_adamw_k *k) {
    return (void)w, (void)g, (void)m, (void)v, (void)n, (void)k, no_gpu();
}
dt_status dt_gpu_sgd(float *w, const float *g, float *buf, size_t n, const dt_sgd_k *k) {
    return (void)w, (void)g, (void)buf, (void)n, (void)k, no_gpu();
}
dt_status dt_gpu_sgemm(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                       int ldb, float beta, float *C, int ldc) {
    return (void)ta, (void)tb, (void)M, (void)N, (void)K, (void)alpha, (void)A, (void)lda, (void)B, (void)ldb,
           (void)beta, (void)C, (void)ldc, no_gpu();
}
void dt_gpu_set_tf32(int on) { (void)on; }
dt_status dt_gpu_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *w,
                                   const float *b, size_t N, int C, float eps) {
    return (void)out, (void)mean, (void)rstd, (void)inp, (void)w, (void)b, (void)N, (void)C, (void)eps, no_gpu();
}
dt_status dt_gpu_layernorm_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                                    const float *w, const float *mean, const float *rstd, size_t N, int C) {
    return (void)dinp, (void)dw, (void)db, (void)dout, (void)inp, (void)w, (void)mean, (void)rstd, (void)N, (void)C,
           no_gpu();
}
dt_status dt_gpu_gelu_forward(float *out, const float *inp, size_t n) { return (void)out, (void)inp, (void)n, no_gpu(); }
dt_status dt_gpu_gelu_backward(float *dinp, const float *dout, const float *inp, size_t n) {
    return (void)dinp, (void)dout, (void)inp, (void)n, no_gpu();
}
dt_status dt_gpu_crossentropy_forward(float *probs, double *row_loss, float *loss, const float *logits,
                                      const int32_t *targets, size_t N, int V, size_t ld) {
    return (void)probs, (void)row_loss, (void)loss, (void)logits, (void)targets, (void)N, (void)V, (void)ld, no_gpu();
}
dt_status dt_gpu_crossentropy_backward(float *dlogits, const float *probs, const int32_t *targets, size_t N, int V,
                                       size_t ld, float dloss) {
    return (void)dlogits, (void)probs, (void)targets, (void)N, (void)V, (void)ld, (void)dloss, no_gpu();
}
