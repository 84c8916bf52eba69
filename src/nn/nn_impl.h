/* Layer kernels the models use beyond the public ones of dtrain/nn.h. */
#ifndef DT_NN_IMPL_H
#define DT_NN_IMPL_H

#include "dtrain/core.h"

#include <stddef.h>
#include <stdint.h>

/* The backward passes of a model's layers, each the only writer of its
 * input gradient, overwrite it (`set`) rather than add to a cleared buffer:
 * that saves clearing and re-reading the largest activations. */

/* Max pooling on images [B, C, H, W, V]: V channels per pixel side by side,
 * so V = 1 is dt_maxpool_forward's NCHW and V = DT_CONV_BLOCK the blocked
 * layout of kernels/conv.c with C the number of channel blocks. argmax
 * holds flat indices into each [H, W, V] image. With relu_out (the output
 * of a ReLU before the pooling, i.e. the pooling's input), backward also
 * does that ReLU's backward: dinp is then the ReLU's input gradient. */
void dt_maxpool_forward_v(float *out, int32_t *argmax, const float *inp, int B, int C, int H,
                          int W, int K, int S, int V);
void dt_maxpool_backward_v(float *dinp, const float *dout, const int32_t *argmax, int B, int C,
                           int H, int W, int K, int S, int V, int set, const float *relu_out);

void dt_relu_backward_set(float *dinp, const float *dout, const float *inp, size_t N);

/* A matmul input kept in 16 bits (docs/mixed-precision.md, "Activations in
 * 16 bits"): dt_keep16 rounds x[n] into keep as t (DT_BF16 or DT_F16, to
 * nearest even); dt_widen16 writes the kept values back as fp32 into
 * room[n] and returns it. The GEMMs round their operands to t anyway, so a
 * widened input gives them the same bits as the fp32 one. The GPT's four
 * matmul inputs of a layer and the sequential models' linear inputs. */
void dt_keep16(void *keep, const float *x, size_t n, dt_dtype t);
const float *dt_widen16(float *room, const void *kept, size_t n, dt_dtype t);
/* dt_linear_forward and dt_linear_backward with the input as kept by
 * dt_keep16 in the kernels' precision (inp16), read by the GEMMs as it is:
 * the same bits as widening it first. */
void dt_linear_forward16(float *out, const void *inp16, const float *w, const float *b, int B, int C, int OC);
void dt_linear_backward16(float *dinp, float *dw, float *db, const float *dout, const void *inp16,
                          const float *w, int B, int C, int OC);

/* Whether models and sets made from now on keep their linear inputs in 16
 * bits in a low precision (on by default; model.c's plan_half), their
 * convolutions' saved inputs in 16 bits on every CPU, and let outputs only
 * a convolution's forward reads live in their gradient buffers and a
 * convolution's backward use its output buffer as room (plan_drop). Off,
 * they keep every activation in fp32 and in a buffer of its own, with the
 * rest of their plan in the precision: the reference test_precision
 * compares the smaller ones with, bit for bit. */
void dt_model_set_acts16(int on);

#endif
