/* A device for whole training runs on the CUDA kernels (the ones
 * tests/gpu/<source>_emu.cpp compile for emulated threads): the simulated
 * GPU's table (its memory, copies, streams, GEMMs on the CPU's dt_sgemm and
 * dt_gemm16, the linear layer, cuDNN's convolutions as im2col) with every
 * op that has a CUDA kernel of dtrain's own run as that kernel, inside the
 * simulated GPU's bracket (its device memory the host's while the kernel
 * runs). No graphs: a run takes [train] cuda_graph = false. */
#include "emu_names.h"  // (before gpu.h: the emulated kernels' names)
#include "gpu/dev.h"
#include "gpu/gpu.h"

#define EMU(op, params, call)                                                                           \
    static dt_status emu_##op params {                                                                  \
        dt_dev_sim_bracket(1);                                                                          \
        dt_status st = call;                                                                            \
        dt_dev_sim_bracket(0);                                                                          \
        return st;                                                                                      \
    }

EMU(to16, (void *dst, const float *src, size_t n, dt_dtype t), dt_gpu_from_f32(dst, src, n, t))
EMU(from16, (float *dst, const void *src, size_t n, dt_dtype t), dt_gpu_to_f32(dst, src, n, t))
EMU(ef16, (void *dst, float *g, float *res, size_t n, dt_dtype t), dt_gpu_from_f32_ef(dst, g, res, n, t))
EMU(layernorm_forward, (float *out, float *mean, float *rstd, const float *inp, const float *w, const float *b,
                        size_t N, int C, float eps, void *out16, dt_dtype t),
    dt_gpu_layernorm_forward(out, mean, rstd, inp, w, b, N, C, eps, out16, t))
EMU(layernorm_backward, (float *dinp, float *dw, float *db, const float *dout, const float *inp, const float *w,
                         const float *mean, const float *rstd, size_t N, int C),
    dt_gpu_layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C))
EMU(layernorm_residual, (float *out, float *mean, float *rstd, float *res, const float *a, const float *b,
                         const float *w, const float *bias, size_t N, int C, float eps, void *out16, dt_dtype t),
    dt_gpu_layernorm_residual(out, mean, rstd, res, a, b, w, bias, N, C, eps, out16, t))
EMU(gelu_forward, (float *out, const float *inp, size_t n, void *out16, dt_dtype t),
    dt_gpu_gelu_forward(out, inp, n, out16, t))
EMU(gelu_backward, (float *dinp, const float *dout, const float *inp, size_t n), dt_gpu_gelu_backward(dinp, dout, inp, n))
EMU(crossentropy_forward, (float *probs, double *row_loss, float *loss, const float *logits, const int32_t *targets,
                           size_t N, int V, size_t ld),
    dt_gpu_crossentropy_forward(probs, row_loss, loss, logits, targets, N, V, ld))
EMU(crossentropy_backward, (float *dlogits, const float *probs, const int32_t *targets, size_t N, int V, size_t ld,
                            float dloss),
    dt_gpu_crossentropy_backward(dlogits, probs, targets, N, V, ld, dloss))
EMU(crossentropy_fused, (float *logits, double *row_loss, float *loss, const int32_t *targets, size_t N, int V,
                         size_t ld, float dloss, void *d16, dt_dtype t),
    dt_gpu_crossentropy_fused(logits, row_loss, loss, targets, N, V, ld, dloss, d16, t))
EMU(adamw, (float *w, const float *g, float *m, float *v, size_t n, const dt_adamw_k *k, const float *guard),
    dt_gpu_adamw(w, g, m, v, n, k, guard))
EMU(sgd, (float *w, const float *g, float *buf, size_t n, const dt_sgd_k *k, const float *guard),
    dt_gpu_sgd(w, g, buf, n, k, guard))
EMU(step_scale, (float *guard, const double *vals, float unscale, float clip),
    dt_gpu_step_scale(guard, vals, unscale, clip))
EMU(encoder_forward, (float *out, const int32_t *inp, const float *wte, const float *wpe, int B, int T, int C),
    dt_gpu_encoder_forward(out, inp, wte, wpe, B, T, C))
EMU(encoder_backward, (float *dwte, float *dwpe, const float *dout, const int32_t *inp, int B, int T, int C),
    dt_gpu_encoder_backward(dwte, dwpe, dout, inp, B, T, C))
EMU(encoder_split_forward, (float *out, const int32_t *inp, const float *wte, const float *wpe, int B, int T, int C,
                            int v0, int V),
    dt_gpu_encoder_split_forward(out, inp, wte, wpe, B, T, C, v0, V))
EMU(encoder_split_backward, (float *dwte, float *dwpe, const float *dout, const int32_t *inp, int B, int T, int C,
                             int v0, int V),
    dt_gpu_encoder_split_backward(dwte, dwpe, dout, inp, B, T, C, v0, V))
EMU(ce_split_max, (float *mx, const float *logits, size_t N, int V), dt_gpu_ce_split_max(mx, logits, N, V))
EMU(ce_split_exp, (float *probs, float *sums, const float *logits, const float *mx, const int32_t *targets, size_t N,
                   int V),
    dt_gpu_ce_split_exp(probs, sums, logits, mx, targets, N, V))
EMU(ce_split_finish, (float *probs, double *row_loss, float *loss, const float *mx, const float *sums, size_t N, int V),
    dt_gpu_ce_split_finish(probs, row_loss, loss, mx, sums, N, V))
EMU(residual_forward, (float *out, const float *a, const float *b, size_t N), dt_gpu_residual_forward(out, a, b, N))
EMU(residual_backward, (float *da, float *db, const float *dout, size_t N), dt_gpu_residual_backward(da, db, dout, N))
EMU(attention_forward, (float *out, float *att, const float *qkv, void *work, int B, int T, int C, int NH, dt_dtype t,
                        void *out16),
    dt_gpu_attention_forward(out, att, qkv, work, B, T, C, NH, t, out16))
EMU(attention_backward, (float *dqkv, float *datt, const float *dout, const float *qkv, const void *out,
                         const float *att, void *work, int B, int T, int C, int NH, dt_dtype t),
    dt_gpu_attention_backward(dqkv, datt, dout, qkv, out, att, work, B, T, C, NH, t))
EMU(relu_forward, (float *out, const float *inp, size_t N), dt_gpu_relu_forward(out, inp, N))
EMU(relu_backward, (float *dinp, const float *dout, const float *inp, size_t N), dt_gpu_relu_backward(dinp, dout, inp, N))
EMU(bias_forward, (float *out, const float *b, size_t N, int OC), dt_gpu_bias_forward(out, b, N, OC))
EMU(bias_backward, (float *db, const float *dout, size_t N, int OC, void *dout16, dt_dtype t),
    dt_gpu_bias_backward(db, dout, N, OC, dout16, t))
EMU(sumsq, (double *out, const float *x, size_t n), dt_gpu_sumsq(out, x, n))
EMU(sumsq_parts, (double *part, const float *x, size_t n, size_t first, double carry),
    dt_gpu_sumsq_parts(part, x, n, first, carry))
EMU(scale, (float *x, size_t n, const float *s), dt_gpu_scale(x, n, s))
EMU(loss_add, (double *acc, const float *loss, double w), dt_gpu_loss_add(acc, loss, w))
EMU(im2col, (float *col, const float *x, size_t B, const dt_im2col_t *g), dt_gpu_im2col(col, x, B, g))
EMU(col2im, (float *dx, const float *dcol, size_t B, const dt_im2col_t *g), dt_gpu_col2im(dx, dcol, B, g))
EMU(transpose, (float *out, const float *in, size_t nb, size_t R, size_t C), dt_gpu_transpose(out, in, nb, R, C))
EMU(maxpool_forward, (float *out, int32_t *arg, const float *x, size_t images, int H, int W, int K, int S),
    dt_gpu_maxpool_forward(out, arg, x, images, H, W, K, S))
EMU(maxpool_backward, (float *dx, const float *dout, const int32_t *arg, size_t images, int H, int W, int K, int S),
    dt_gpu_maxpool_backward(dx, dout, arg, images, H, W, K, S))
EMU(dropout_forward, (float *out, float *mask, const float *x, int B, size_t n, float p, uint64_t seed, uint64_t step,
                      int64_t first, int layer, size_t skip),
    dt_gpu_dropout_forward(out, mask, x, B, n, p, seed, step, first, layer, skip))
EMU(dropout_backward, (float *dx, const float *dout, const float *mask, size_t N),
    dt_gpu_dropout_backward(dx, dout, mask, N))
EMU(fixed_add, (int64_t *acc, const float *g, size_t n), dt_gpu_fixed_add(acc, g, n))
EMU(fixed_to_float, (float *g, const int64_t *acc, size_t n), dt_gpu_fixed_to_float(g, acc, n))

// (conv2d_ready 0: the device model's convolutions are im2col, the
// emulated kernels', and a GEMM)
static int no_conv2d(char *why, size_t n) {
    if (n) snprintf(why, n, "the emulated kernels' device: im2col and a GEMM");
    return 0;
}

const dt_dev *dt_emu_device(void) {
    static dt_dev d;
    d = dt_dev_sim;
    d.name = "emulated";
    d.conv2d_ready = no_conv2d;
#define SET(op) d.op = emu_##op
    SET(to16), SET(from16), SET(ef16), SET(layernorm_forward), SET(layernorm_backward), SET(layernorm_residual);
    SET(gelu_forward), SET(gelu_backward), SET(crossentropy_forward), SET(crossentropy_backward);
    SET(crossentropy_fused), SET(adamw), SET(sgd), SET(step_scale), SET(encoder_forward), SET(encoder_backward);
    SET(encoder_split_forward), SET(encoder_split_backward), SET(ce_split_max), SET(ce_split_exp);
    SET(ce_split_finish), SET(residual_forward), SET(residual_backward), SET(attention_forward);
    SET(attention_backward), SET(relu_forward), SET(relu_backward), SET(bias_forward), SET(bias_backward);
    SET(sumsq), SET(sumsq_parts), SET(scale), SET(loss_add), SET(im2col), SET(col2im), SET(transpose);
    SET(maxpool_forward), SET(maxpool_backward), SET(dropout_forward), SET(dropout_backward), SET(fixed_add);
    SET(fixed_to_float);
#undef SET
    return &d;
}
