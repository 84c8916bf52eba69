/* Layer kernels the models use beyond the public ones of dtrain/nn.h. */
#ifndef DT_NN_IMPL_H
#define DT_NN_IMPL_H

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

#endif
