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
uint64_t dt_gpu_reads(void) { return 0; }
size_t dt_gpu_scratch_bytes(uint64_t *allocs) { return allocs ? *allocs = 0 : 0; }
dt_status dt_gpu_scratch_reserve(size_t bytes) { return (void)bytes, no_gpu(); }
size_t dt_gpu_encoder_scratch(size_t n) { return (void)n, 0; }
size_t dt_gpu_conv2d_scratch(size_t B, const dt_im2col_t *g, int OC) { return (void)B, (void)g, (void)OC, 0; }
dt_status dt_gpu_to_device_async(void *dev, const void *host, size_t bytes) {
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
dt_status dt_gpu_vm_reserve(void **dev, size_t bytes, size_t *gran) { return (void)bytes, *dev = NULL, *gran = 1, no_gpu(); }
dt_status dt_gpu_vm_map(void *dev, size_t bytes) { return (void)dev, (void)bytes, no_gpu(); }
dt_status dt_gpu_vm_unmap(void *dev, size_t bytes) { return (void)dev, (void)bytes, no_gpu(); }
void dt_gpu_vm_free(void *dev, size_t bytes) { (void)dev, (void)bytes; }
dt_status dt_gpu_host_alloc(void **host, size_t bytes) { return (void)bytes, *host = NULL, no_gpu(); }
void dt_gpu_host_free(void *host) { (void)host; }
dt_status dt_gpu_sync(void) { return no_gpu(); }
dt_status dt_gpu_stream_create(void **stream) { return *stream = NULL, no_gpu(); }
void dt_gpu_stream_destroy(void *stream) { (void)stream; }
dt_status dt_gpu_stream_after_compute(void *stream) { return (void)stream, no_gpu(); }
dt_status dt_gpu_stream_query(void *stream, int *done) { return (void)stream, *done = 0, no_gpu(); }
dt_status dt_gpu_event_create(void **event) { return *event = NULL, no_gpu(); }
void dt_gpu_event_destroy(void *event) { (void)event; }
dt_status dt_gpu_event_record(void *event) { return (void)event, no_gpu(); }
dt_status dt_gpu_event_query(void *event, int *done) { return (void)event, *done = 0, no_gpu(); }
dt_status dt_gpu_stream_wait_event(void *stream, void *event) { return (void)stream, (void)event, no_gpu(); }
dt_status dt_gpu_graph_capture(void) { return no_gpu(); }
dt_status dt_gpu_graph_replay(void) { return no_gpu(); }
dt_status dt_gpu_graph_run(void) { return no_gpu(); }
void dt_gpu_graph_drop(void) {}
dt_status dt_gpu_fixed_add(int64_t *acc, const float *g, size_t n) { return (void)acc, (void)g, (void)n, no_gpu(); }
dt_status dt_gpu_fixed_to_float(float *g, const int64_t *acc, size_t n) {
    return (void)g, (void)acc, (void)n, no_gpu();
}
dt_status dt_gpu_adamw(float *w, const float *g, float *m, float *v, size_t n, const dt_adamw_k *k,
                       const float *guard) {
    return (void)w, (void)g, (void)m, (void)v, (void)n, (void)k, (void)guard, no_gpu();
}
dt_status dt_gpu_sgd(float *w, const float *g, float *buf, size_t n, const dt_sgd_k *k, const float *guard) {
    return (void)w, (void)g, (void)buf, (void)n, (void)k, (void)guard, no_gpu();
}
dt_status dt_gpu_step_scale(float *guard, const double *vals, float unscale, float clip) {
    return (void)guard, (void)vals, (void)unscale, (void)clip, no_gpu();
}
dt_status dt_gpu_sgemm(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                       int ldb, float beta, float *C, int ldc) {
    return (void)ta, (void)tb, (void)M, (void)N, (void)K, (void)alpha, (void)A, (void)lda, (void)B, (void)ldb,
           (void)beta, (void)C, (void)ldc, no_gpu();
}
void dt_gpu_set_tf32(int on) { (void)on; }
int dt_gpu_tf32(void) { return 0; }
dt_status dt_gpu_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *w,
                                   const float *b, size_t N, int C, float eps, void *out16, dt_dtype t) {
    return (void)out, (void)mean, (void)rstd, (void)inp, (void)w, (void)b, (void)N, (void)C, (void)eps, (void)out16,
           (void)t, no_gpu();
}
dt_status dt_gpu_layernorm_residual(float *out, float *mean, float *rstd, float *res, const float *a, const float *b,
                                    const float *w, const float *bias, size_t N, int C, float eps, void *out16,
                                    dt_dtype t) {
    return (void)out, (void)mean, (void)rstd, (void)res, (void)a, (void)b, (void)w, (void)bias, (void)N, (void)C,
           (void)eps, (void)out16, (void)t, no_gpu();
}
dt_status dt_gpu_layernorm_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                                    const float *w, const float *mean, const float *rstd, size_t N, int C) {
    return (void)dinp, (void)dw, (void)db, (void)dout, (void)inp, (void)w, (void)mean, (void)rstd, (void)N, (void)C,
           no_gpu();
}
dt_status dt_gpu_gelu_forward(float *out, const float *inp, size_t n, void *out16, dt_dtype t) {
    return (void)out, (void)inp, (void)n, (void)out16, (void)t, no_gpu();
}
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
dt_status dt_gpu_crossentropy_fused(float *logits, double *row_loss, float *loss, const int32_t *targets, size_t N,
                                    int V, size_t ld, float dloss, void *d16, dt_dtype t) {
    return (void)logits, (void)row_loss, (void)loss, (void)targets, (void)N, (void)V, (void)ld, (void)dloss, (void)d16,
           (void)t, no_gpu();
}
dt_status dt_gpu_encoder_forward(float *out, const int32_t *inp, const float *wte, const float *wpe, int B, int T,
                                 int C) {
    return (void)out, (void)inp, (void)wte, (void)wpe, (void)B, (void)T, (void)C, no_gpu();
}
dt_status dt_gpu_encoder_backward(float *dwte, float *dwpe, const float *dout, const int32_t *inp, int B, int T, int C) {
    return (void)dwte, (void)dwpe, (void)dout, (void)inp, (void)B, (void)T, (void)C, no_gpu();
}
dt_status dt_gpu_encoder_split_forward(float *out, const int32_t *inp, const float *wte, const float *wpe, int B,
                                       int T, int C, int v0, int V) {
    return (void)out, (void)inp, (void)wte, (void)wpe, (void)B, (void)T, (void)C, (void)v0, (void)V, no_gpu();
}
dt_status dt_gpu_encoder_split_backward(float *dwte, float *dwpe, const float *dout, const int32_t *inp, int B, int T,
                                        int C, int v0, int V) {
    return (void)dwte, (void)dwpe, (void)dout, (void)inp, (void)B, (void)T, (void)C, (void)v0, (void)V, no_gpu();
}
dt_status dt_gpu_ce_split_max(float *mx, const float *logits, size_t N, int V) {
    return (void)mx, (void)logits, (void)N, (void)V, no_gpu();
}
dt_status dt_gpu_ce_split_exp(float *probs, float *sums, const float *logits, const float *mx, const int32_t *targets,
                              size_t N, int V) {
    return (void)probs, (void)sums, (void)logits, (void)mx, (void)targets, (void)N, (void)V, no_gpu();
}
dt_status dt_gpu_ce_split_finish(float *probs, double *row_loss, float *loss, const float *mx, const float *sums,
                                 size_t N, int V) {
    return (void)probs, (void)row_loss, (void)loss, (void)mx, (void)sums, (void)N, (void)V, no_gpu();
}
dt_status dt_gpu_residual_forward(float *out, const float *a, const float *b, size_t N) {
    return (void)out, (void)a, (void)b, (void)N, no_gpu();
}
dt_status dt_gpu_residual_backward(float *da, float *db, const float *dout, size_t N) {
    return (void)da, (void)db, (void)dout, (void)N, no_gpu();
}
dt_status dt_gpu_attention_forward(float *out, float *att, const float *qkv, void *work, int B, int T, int C, int NH,
                                   dt_dtype t, void *out16) {
    return (void)out, (void)att, (void)qkv, (void)work, (void)B, (void)T, (void)C, (void)NH, (void)t, (void)out16,
           no_gpu();
}
dt_status dt_gpu_attention_backward(float *dqkv, float *datt, const float *dout, const float *qkv, const void *out,
                                    const float *att, void *work, int B, int T, int C, int NH, dt_dtype t) {
    return (void)dqkv, (void)datt, (void)dout, (void)qkv, (void)out, (void)att, (void)work, (void)B, (void)T, (void)C,
           (void)NH, (void)t, no_gpu();
}
dt_status dt_gpu_im2col(float *col, const float *x, size_t B, const dt_im2col_t *g) {
    return (void)col, (void)x, (void)B, (void)g, no_gpu();
}
dt_status dt_gpu_col2im(float *dx, const float *dcol, size_t B, const dt_im2col_t *g) {
    return (void)dx, (void)dcol, (void)B, (void)g, no_gpu();
}
int dt_gpu_conv2d_ready(char *why, size_t n) {
    if (n) snprintf(why, n, "this dtrain was built without CUDA");
    return 0;
}
dt_status dt_gpu_conv2d_forward(float *out, const float *inp, const float *w, const float *b, size_t B,
                                const dt_im2col_t *g, int OC) {
    return (void)out, (void)inp, (void)w, (void)b, (void)B, (void)g, (void)OC, no_gpu();
}
dt_status dt_gpu_conv2d_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                                 const float *w, size_t B, const dt_im2col_t *g, int OC) {
    return (void)dinp, (void)dw, (void)db, (void)dout, (void)inp, (void)w, (void)B, (void)g, (void)OC, no_gpu();
}
dt_status dt_gpu_transpose(float *out, const float *in, size_t nb, size_t R, size_t C) {
    return (void)out, (void)in, (void)nb, (void)R, (void)C, no_gpu();
}
dt_status dt_gpu_maxpool_forward(float *out, int32_t *arg, const float *x, size_t images, int H, int W, int K, int S) {
    return (void)out, (void)arg, (void)x, (void)images, (void)H, (void)W, (void)K, (void)S, no_gpu();
}
dt_status dt_gpu_maxpool_backward(float *dx, const float *dout, const int32_t *arg, size_t images, int H, int W, int K,
                                  int S) {
    return (void)dx, (void)dout, (void)arg, (void)images, (void)H, (void)W, (void)K, (void)S, no_gpu();
}
dt_status dt_gpu_dropout_forward(float *out, float *mask, const float *x, int B, size_t n, float p, uint64_t seed,
                                 uint64_t step, int64_t first, int layer, size_t skip) {
    return (void)out, (void)mask, (void)x, (void)B, (void)n, (void)p, (void)seed, (void)step, (void)first, (void)layer,
           (void)skip, no_gpu();
}
dt_status dt_gpu_dropout_backward(float *dx, const float *dout, const float *mask, size_t N) {
    return (void)dx, (void)dout, (void)mask, (void)N, no_gpu();
}
dt_status dt_gpu_relu_forward(float *out, const float *inp, size_t N) { return (void)out, (void)inp, (void)N, no_gpu(); }
dt_status dt_gpu_relu_backward(float *dinp, const float *dout, const float *inp, size_t N) {
    return (void)dinp, (void)dout, (void)inp, (void)N, no_gpu();
}
dt_status dt_gpu_bias_forward(float *out, const float *b, size_t N, int OC) {
    return (void)out, (void)b, (void)N, (void)OC, no_gpu();
}
dt_status dt_gpu_bias_backward(float *db, const float *dout, size_t N, int OC, void *dout16, dt_dtype t) {
    return (void)db, (void)dout, (void)N, (void)OC, (void)dout16, (void)t, no_gpu();
}
dt_status dt_gpu_linear_forward(float *out, float *pre, const void *inp, const void *w, const float *b, int B, int C,
                                int OC, dt_dtype t) {
    return (void)out, (void)pre, (void)inp, (void)w, (void)b, (void)B, (void)C, (void)OC, (void)t, no_gpu();
}
dt_status dt_gpu_linear_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                                 const float *w, int B, int C, int OC) {
    return (void)dinp, (void)dw, (void)db, (void)dout, (void)inp, (void)w, (void)B, (void)C, (void)OC, no_gpu();
}
dt_status dt_gpu_linear_dgelu(float *dpre, const void *dout, const void *w, const float *pre, int B, int C, int OC,
                              dt_dtype t) {
    return (void)dpre, (void)dout, (void)w, (void)pre, (void)B, (void)C, (void)OC, (void)t, no_gpu();
}
dt_status dt_gpu_sumsq(double *out_dev, const float *x, size_t n) { return (void)out_dev, (void)x, (void)n, no_gpu(); }
dt_status dt_gpu_loss_add(double *acc, const float *loss, double w) { return (void)acc, (void)loss, (void)w, no_gpu(); }
dt_status dt_gpu_sumsq_parts(double *part_dev, const float *x, size_t n, size_t first, double carry) {
    return (void)part_dev, (void)x, (void)n, (void)first, (void)carry, no_gpu();
}
dt_status dt_gpu_scale(float *x, size_t n, const float *s_dev) { return (void)x, (void)n, (void)s_dev, no_gpu(); }
dt_status dt_gpu_gemm16(dt_dtype t, int ta, int tb, int M, int N, int K, float alpha, const void *A, int lda,
                        const void *B, int ldb, float beta, float *C, int ldc) {
    return (void)t, (void)ta, (void)tb, (void)M, (void)N, (void)K, (void)alpha, (void)A, (void)lda, (void)B, (void)ldb,
           (void)beta, (void)C, (void)ldc, no_gpu();
}
dt_status dt_gpu_gemm_batched(dt_dtype t, int ta, int tb, int M, int N, int K, float alpha, const void *A, int lda,
                              long long sa, const void *B, int ldb, long long sb, float beta, float *C, int ldc,
                              long long sc, int batch) {
    return (void)t, (void)ta, (void)tb, (void)M, (void)N, (void)K, (void)alpha, (void)A, (void)lda, (void)sa, (void)B,
           (void)ldb, (void)sb, (void)beta, (void)C, (void)ldc, (void)sc, (void)batch, no_gpu();
}
dt_status dt_gpu_to_f32(float *dst, const void *src, size_t n, dt_dtype t) {
    return (void)dst, (void)src, (void)n, (void)t, no_gpu();
}
dt_status dt_gpu_from_f32(void *dst, const float *src, size_t n, dt_dtype t) {
    return (void)dst, (void)src, (void)n, (void)t, no_gpu();
}
dt_status dt_gpu_from_f32_ef(void *dst, float *g, float *res, size_t n, dt_dtype t) {
    return (void)dst, (void)g, (void)res, (void)n, (void)t, no_gpu();
}
