/*
 * dtrain/nn.h - layers as forward/backward pairs, and sequential models.
 *
 * Layer kernels follow one convention (outputs first, then saved state, then
 * inputs, then parameters, then sizes):
 *
 *   dt_linear_forward(out, inp, w, b, B, C, OC);
 *   dt_linear_backward(dinp, dw, db, dout, inp, w, B, C, OC);
 *
 * Forward saves what backward needs (pool argmax, conv input, layernorm
 * mean/rstd, dropout mask). Backward ACCUMULATES (+=) into every gradient it
 * writes, parameter and input gradients alike, so the caller zeroes them.
 * All tensors are dense row-major fp32; images are NCHW. NULL may be passed
 * for a gradient the caller does not want (dinp of the first layer, db when
 * there is no bias).
 *
 * A dt_model is a sequence of such layers ending in a softmax cross-entropy
 * loss, with ONE contiguous parameter block and ONE gradient block of the same
 * layout (tensor i of layer l sits at a fixed offset), so that data-parallel
 * training is one allreduce over a flat buffer and sharding is an offset and
 * a length.
 */
#ifndef DTRAIN_NN_H
#define DTRAIN_NN_H

#include "dtrain/core.h"
#include "dtrain/spec.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- layer kernels ------------------------------------------------------- */

/* out[B,OC] = inp[B,C] @ w[OC,C]^T + b[OC] (b may be NULL) */
DT_API void dt_linear_forward(float *out, const float *inp, const float *w, const float *b,
                              int B, int C, int OC);
DT_API void dt_linear_backward(float *dinp, float *dw, float *db, const float *dout,
                               const float *inp, const float *w, int B, int C, int OC);

/* 2-D convolution, square kernel K, stride S, zero padding P.
 * inp[B,IC,H,W], w[OC,IC,K,K], b[OC], out[B,OC,OH,OW] with
 * OH = (H + 2P - K)/S + 1. col is scratch of dt_conv2d_col_size() floats,
 * written by forward (the input in the convolution library's layout) and
 * read by backward; dcol is scratch of the same size for backward. The
 * size for B samples also serves every smaller batch. */
DT_API size_t dt_conv2d_col_size(int B, int IC, int H, int W, int OC, int K, int S, int P);
DT_API void dt_conv2d_forward(float *out, float *col, const float *inp, const float *w,
                              const float *b, int B, int IC, int H, int W, int OC,
                              int K, int S, int P);
DT_API void dt_conv2d_backward(float *dinp, float *dw, float *db, float *dcol,
                               const float *dout, const float *col, const float *w,
                               int B, int IC, int H, int W, int OC, int K, int S, int P);

/* Max pooling, window K, stride S, no padding: inp[B,C,H,W] -> out[B,C,OH,OW];
 * argmax[B,C,OH,OW] holds the flat input index of each maximum. */
DT_API void dt_maxpool_forward(float *out, int32_t *argmax, const float *inp,
                               int B, int C, int H, int W, int K, int S);
DT_API void dt_maxpool_backward(float *dinp, const float *dout, const int32_t *argmax,
                                int B, int C, int H, int W, int K, int S);

/* Element-wise, N elements. */
DT_API void dt_relu_forward(float *out, const float *inp, size_t N);
DT_API void dt_relu_backward(float *dinp, const float *dout, const float *inp, size_t N);
/* GELU, tanh approximation (as GPT-2 and PyTorch's approximate='tanh'). */
DT_API void dt_gelu_forward(float *out, const float *inp, size_t N);
DT_API void dt_gelu_backward(float *dinp, const float *dout, const float *inp, size_t N);

/* Layer normalisation over the last dimension C of inp[N,C];
 * mean[N] and rstd[N] are saved for backward. */
DT_API void dt_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                                 const float *w, const float *b, int N, int C, float eps);
DT_API void dt_layernorm_backward(float *dinp, float *dw, float *db, const float *dout,
                                  const float *inp, const float *w, const float *mean,
                                  const float *rstd, int N, int C);

/* Inverted dropout: mask[i] = 0 or 1/(1-p), drawn from rng; out = inp*mask. */
DT_API void dt_dropout_forward(float *out, float *mask, const float *inp, size_t N, float p,
                               dt_rng *rng);
DT_API void dt_dropout_backward(float *dinp, const float *dout, const float *mask, size_t N);

/* Softmax cross-entropy over logits[B,V] with integer targets[B].
 * probs[B,V] is written; returns the mean loss over the batch.
 * backward: dlogits += (probs - onehot(target)) * dloss / B. */
DT_API float dt_crossentropy_forward(float *probs, const float *logits, const int32_t *targets,
                                     int B, int V);
DT_API void dt_crossentropy_backward(float *dlogits, const float *probs,
                                     const int32_t *targets, int B, int V, float dloss);

/* Batch normalisation per channel of inp[B,C,HW] (HW = H*W: BatchNorm2d;
 * 1 for a flat input: BatchNorm1d). The statistics are sums over every
 * value of a channel, each sample's part taken in double and the parts
 * added in 48-bit fixed point (dt_fixed48_add: an acc pair hi 2^-16 +
 * lo 2^-48), so they are the same bits however the batch is split over
 * workers or threads; summing the acc arrays of several workers as
 * integers gives the whole batch's.
 * stats: acc[4C] = (sum x, sum x^2) of each channel, channel c's pair k
 * at acc[(k C + c) 2]; dsums: (sum dy, sum dy xhat), xhat = (x - mean)
 * rstd. Both return -1 when out of memory. forward: out = xhat w + b,
 * from mean[C], rstd[C]. backward ADDS to dinp the input gradient
 * w rstd (dy - sdy/count - xhat sdyx/count), from the sums over the
 * count values of each channel the statistics came from (the weight and
 * bias gradients are the local sums of dy xhat and dy). */
DT_API void dt_fixed48_add(int64_t acc[2], double x);
DT_API double dt_fixed48_value(const int64_t acc[2]);
DT_API int dt_batchnorm_stats(int64_t *acc, const float *inp, int B, int C, int HW);
DT_API int dt_batchnorm_dsums(int64_t *acc, const float *dout, const float *inp, const float *mean,
                              const float *rstd, int B, int C, int HW);
DT_API void dt_batchnorm_forward(float *out, const float *inp, const float *mean, const float *rstd,
                                 const float *w, const float *b, int B, int C, int HW);
DT_API void dt_batchnorm_backward(float *dinp, const float *dout, const float *inp, const float *w,
                                  const float *mean, const float *rstd, const double *sdy,
                                  const double *sdyx, double count, int B, int C, int HW);
/* Global average pooling: out[B,C] = mean of inp[B,C,HW]; backward adds. */
DT_API void dt_avgpool_forward(float *out, const float *inp, int B, int C, int HW);
DT_API void dt_avgpool_backward(float *dinp, const float *dout, int B, int C, int HW);

/* ---- sequential models --------------------------------------------------- */


typedef struct dt_model dt_model;

/* Builds a model for inputs of shape in_shape = {C, H, W} (an MLP input is
 * {features, 1, 1}) and batches of up to max_batch samples. The last layer's
 * output size is the number of classes. Parameters are zero until
 * dt_model_init(). Fails with DT_ERR_ARG, naming the layer, when shapes do
 * not fit. The caller owns *out and frees it with dt_model_free(). */
DT_API dt_status dt_model_create(dt_model **out, const int in_shape[3],
                                 const dt_layer_spec *layers, int nlayers, int max_batch);
DT_API void dt_model_free(dt_model *m);
/* What dt_model_create() with these arguments would allocate, without
 * allocating it: *nparams floats of parameters (and as many of gradients),
 * and *act_bytes of activations, their gradients and scratch for batches of
 * max_batch. Fails as dt_model_create() does on shapes that do not fit. */
DT_API dt_status dt_model_memory(const int in_shape[3], const dt_layer_spec *layers, int nlayers,
                                 int max_batch, size_t *nparams, size_t *act_bytes);
/* dt_model_memory for a shard of ntp (dt_model_create_shard; every shard
 * the same sizes): its parameters and its activations. Fails as
 * dt_model_tensor_parallel_check does on a model ntp cannot split. */
DT_API dt_status dt_model_shard_memory(const int in_shape[3], const dt_layer_spec *layers, int nlayers,
                                       int max_batch, int ntp, size_t *nparams, size_t *act_bytes);
/* Bytes of the model's activations, their gradients and scratch as
 * allocated (dt_model_memory's figure for its max_batch, in the precision
 * it was made in); *saved (when not
 * NULL): what 16-bit activations save in them against fp32. A model made
 * while the kernels run bf16 or fp16 (kernels.h) keeps the output of each
 * layer whose only reader is the linear layer after it (a matmul input,
 * which the GEMMs round to that type anyway) in that type, 2 bytes an
 * element, and must run in it (else forward fails with DT_ERR_ARG);
 * dt_model_memory counts the same in the kernels' precision at the call.
 * docs/mixed-precision.md says which outputs these are. */
DT_API size_t dt_model_act_bytes(const dt_model *m, size_t *saved);

/* Initialises parameters as PyTorch does by default (weights and biases
 * uniform in +-1/sqrt(fan_in); layernorm 1 and 0) from `seed`, which also
 * keys the dropout masks. A tensor-parallel shard gets its part of the
 * whole model's values, bitwise. */
DT_API void dt_model_init(dt_model *m, uint64_t seed);

DT_API size_t dt_model_num_params(const dt_model *m);
DT_API float *dt_model_params(dt_model *m);  /* the flat parameter block */
DT_API float *dt_model_grads(dt_model *m);   /* the flat gradient block */
DT_API int dt_model_num_classes(const dt_model *m);
DT_API int dt_model_input_size(const dt_model *m); /* floats per sample */

/* Dropout masks are a function of (seed, step, sample, layer) alone: sample
 * i of the next forward pass is sample first+i of global step `step`. So a
 * global batch split across ranks or micro-batches draws the same masks as
 * when it is processed whole. Default: step 0, first 0. */
DT_API void dt_model_set_dropout_key(dt_model *m, uint64_t step, int64_t first);

/* dt_model_backward() computes the gradient of s x loss (default s = 1).
 * A data-parallel engine sets s = local samples / global batch, so that the
 * sum of every rank's gradients is the global batch's mean gradient. */
DT_API void dt_model_set_loss_scale(dt_model *m, float s);

/* Called during dt_model_backward() each time a layer with parameters has
 * finished: gradients at offsets >= `offset` of the gradient block are final
 * for this pass (layers run last to first, so the final region grows from
 * the end of the block). Data-parallel engines start communicating there.
 * A model whose backward does not finish its block from the end (dt_gpt)
 * reports positions in its gradient order instead: a list of dt_grad_range
 * whose concatenation backward finishes from the end. */
typedef void (*dt_grad_ready_fn)(size_t offset, void *user);
DT_API void dt_model_set_grad_hook(dt_model *m, dt_grad_ready_fn fn, void *user);
/* The layer hook: called before layer i's forward (phase 0) and before its
 * backward (phase 1), for every layer in the order the pass runs them; a
 * status other than DT_OK stops the pass, which returns it. Meant for
 * gathering a layer's parameters on demand (ZeRO-3). fn NULL: none. */
typedef dt_status (*dt_model_layer_fn)(int layer, int phase, void *user);
DT_API void dt_model_set_layer_hook(dt_model *m, dt_model_layer_fn fn, void *user);
/* Elements [offset, offset + len) of a gradient block. */
typedef struct {
    size_t offset, len;
} dt_grad_range;
/* A parameter tensor seen as a matrix by a gradient codec (PowerSGD):
 * rows x cols floats at offset in the gradient block, row-major. */
typedef struct {
    size_t offset, rows, cols;
} dt_grad_matrix;

/* Named parameter tensors, in block order: "0.weight", "0.bias", "3.weight"
 * (the number is the layer index, as in a PyTorch nn.Sequential). */
typedef struct {
    const char *name;
    int ndim;
    int64_t shape[4];
    size_t offset;   /* in floats, into the parameter and gradient blocks */
    size_t numel;
} dt_tensor_info;
DT_API int dt_model_num_tensors(const dt_model *m);
/* Layer i's plan (0 <= i < dt_model_num_layers): its spec, its per-sample
 * input and output sizes and where its weight and bias lie in the blocks
 * (w_n, b_n floats; 0: none). A device's step over the same blocks reads
 * it (gpu/dev_model.c). A tensor-parallel shard's (dt_model_create_shard)
 * layers say their part: tp 1 column-parallel (the input's gradient is
 * summed over the shards), 2 row-parallel (the output is; its bias added
 * by shard 0 alone: add_bias), 0 neither; a dropout's mask of the shard's
 * part of the whole layer's comes after drop_skip draws a sample. */
typedef struct {
    dt_layer_spec spec;
    size_t in, out, w_off, b_off, w_n, b_n;
    int in_shape[3], out_shape[3];  /* {C, H, W} a sample */
    int tp, add_bias;
    size_t drop_skip;
} dt_model_layer_plan;
DT_API int dt_model_num_layers(const dt_model *m);
DT_API void dt_model_layer(const dt_model *m, int i, dt_model_layer_plan *out);
DT_API const dt_tensor_info *dt_model_tensor(const dt_model *m, int i);
/* Tensor i as the whole model has it, for a tensor-parallel shard
 * (dt_model_create_shard): the whole shape, the offset in the whole model's
 * block (dt_model_whole_params floats); dt_model_tensor on the whole model. */
DT_API const dt_tensor_info *dt_model_whole_tensor(const dt_model *m, int i);

/* Forward pass over x[B, input_size]. With targets, computes the mean
 * softmax cross-entropy into *loss (may be NULL otherwise). `train` enables
 * dropout. B must be <= max_batch. */
DT_API dt_status dt_model_forward(dt_model *m, const float *x, const int32_t *targets, int B,
                                  int train, float *loss);
/* Logits [B, classes] and probabilities of the last forward pass. */
DT_API const float *dt_model_logits(const dt_model *m);
DT_API const float *dt_model_probs(const dt_model *m);
/* Backward pass of the last forward (which must have had targets):
 * ACCUMULATES parameter gradients into the gradient block. */
DT_API dt_status dt_model_backward(dt_model *m);
DT_API void dt_model_zero_grad(dt_model *m);

/* ---- batch norm's running statistics and synchronized batch norm --------
 * A batchnorm layer (and each of a block's) holds four tensors in the
 * parameter block: weight, bias, running_mean, running_var (PyTorch's
 * names; "<i>.running_mean", "<i>.bn1.running_mean" in a block). The
 * running statistics are no gradient-trained parameters: their gradient
 * is always zero, a training forward sets them (momentum m, default 0.1:
 * r = (1 - m) r + m batch, the variance unbiased, count/(count - 1)), and
 * the optimizer must leave them alone (dt_optim_set_frozen over
 * dt_model_buffer_ranges). Being in the block, they are saved, resumed,
 * broadcast and sharded with the parameters. A forward with train = 0
 * normalises with them. */
DT_API const dt_grad_range *dt_model_buffer_ranges(const dt_model *m, int *n);
/* Sums buf[n] (int64) in place over the data-parallel workers. */
typedef dt_status (*dt_model_isum_fn)(int64_t *buf, size_t n, void *user);
/* The workers' sum for batch norm in training forwards and backwards
 * (NULL: one worker). sync = 1 (synchronized batch norm): the batch
 * statistics, and the backward's sums of dy and dy xhat, are those of
 * every worker's samples together, bitwise what one process computes on
 * the whole batch. sync = 0: each worker normalises its own samples, and
 * the running statistics are updated with the mean over the workers of
 * each one's batch mean and unbiased variance, so that every worker keeps
 * the same ones. Every worker must run the same number of training
 * forwards. */
DT_API void dt_model_set_batch_sum(dt_model *m, dt_model_isum_fn fn, void *user, int sync);
/* The workers' sums of a training forward and backward with no samples of
 * this worker's (a share, or a micro-batch, that another worker has and
 * this one has not): the same calls with zeros, so that the others' sums
 * pair up. DT_OK at once without a sum function. */
DT_API dt_status dt_model_batch_norm_idle(dt_model *m);
/* Batch norm in deterministic mode: the next training forward and its
 * backward run their B samples as n consecutive segments of len[0..n)
 * samples (summing to B). Every layer but batch norm runs each segment as
 * a batch of its own, the bits of a forward and backward of that segment
 * alone; batch norm normalises all of them together (with the sum
 * function: every worker's), its sums being exact. Each segment's
 * gradient of each tensor goes to fn(offset, count, values, user), which
 * takes it (the gradient block is zero again afterwards), and its loss
 * gradient is scaled by scale[k] (dt_model_set_loss_scale's, for a
 * segment alone). So the gradient of each segment is what a pass over it
 * alone would make, whatever else is in the batch. n = 0: off; the
 * backward turns it off. */
typedef void (*dt_grad_part_fn)(size_t offset, size_t count, const float *g, void *user);
DT_API dt_status dt_model_set_segments(dt_model *m, int n, const int *len, const float *scale, dt_grad_part_fn fn,
                                       void *user);
/* Whether the layers have a batch norm (a batchnorm layer or a block). */
DT_API int dt_layers_have_batchnorm(const dt_layer_spec *layers, int nlayers);

/* ---- tensor parallel shards of a sequential model -------------------------
 * Two linear or conv2d layers with only relu, gelu, maxpool, dropout or
 * flatten layers between them (layers that act on each channel alone, or
 * keep each channel's values together) form a pair, as Megatron-LM's MLP:
 * the first column-parallel (shard tp of ntp holds output rows (channels)
 * [tp out/ntp, (tp+1) out/ntp) of its weight and bias, so its outputs and
 * the activations after it up to the second are divided by channel), the
 * second row-parallel (the matching input columns of its weight: a
 * convolution's input channels, a linear layer's inputs, channel c's H W
 * of them after a flatten; its bias whole, added by shard 0). A shard sums
 * the second's partial outputs over the shards after its forward, and the
 * first's partial input gradients after its backward, through the reduce
 * function: one sum a pair each way. Pairs are taken from the first layer
 * on, each layer in one at most; a linear or conv2d layer followed by any
 * other layer (layernorm) pairs with nothing. The other layers are whole on
 * every shard. A dropout layer in a pair draws the whole layer's mask and
 * keeps its part. */
/* Sums buf[n] in place over the shards; every shard gets the result. */
typedef dt_status (*dt_model_reduce_fn)(float *buf, size_t n, void *user);
/* DT_ERR_CONFIG, its message starting with `what` (a config field), when
 * the layers have no such pair or ntp does not divide a column-parallel
 * layer's outputs. */
DT_API dt_status dt_model_tensor_parallel_check(const dt_layer_spec *layers, int nlayers, int ntp, const char *what);
/* dt_model_create for shard tp of ntp (0 of 1: dt_model_create). Its
 * tensors keep their names with the shard's shapes (dt_model_tensor; the
 * whole model's shapes and offsets: dt_model_whole_tensor); dt_model_init
 * gives it its part of the whole model's values; ntp > 1 needs a reduce
 * function before a forward. */
DT_API dt_status dt_model_create_shard(dt_model **out, const int in_shape[3], const dt_layer_spec *layers,
                                       int nlayers, int max_batch, int tp, int ntp);
DT_API void dt_model_set_reduce(dt_model *m, dt_model_reduce_fn fn, void *user);
/* The whole model's parameter count (dt_model_num_params on one shard). */
DT_API size_t dt_model_whole_params(const dt_model *m);
/* Whether tensor i is divided among the shards (else every shard holds it
 * whole and computes the same gradient for it). */
DT_API int dt_model_tensor_split(const dt_model *m, int i);
/* The elements [lo, hi) of the whole model's block that shard tp (its block
 * `local`) holds, into buf[0, hi - lo); the others are left as they are.
 * What every shard holds whole counts as shard 0's alone, so each element
 * has one shard that fills it. */
DT_API void dt_model_shard_fill(const dt_model *m, int tp, const float *local, size_t lo, size_t hi, float *buf);
/* The elements of shard tp's block `local` that lie in [lo, hi) of the
 * whole model's block, from buf[0, hi - lo) (the whole layers too). */
DT_API void dt_model_shard_take(const dt_model *m, int tp, float *local, size_t lo, size_t hi, const float *buf);
/* Keeps only the layers held[l] says (NULL: all; a pipeline stage's): the
 * parameters and gradients of the rest are never touched (their pages of
 * the blocks are never made) by dt_model_init (which draws their values
 * all the same, so the kept ones are the whole model's),
 * dt_model_zero_grad, dt_model_shard_fill and _take; the caller runs
 * stages of its layers only. Before dt_model_init. DT_ERR_ARG when it
 * keeps none. dt_model_held_ranges: the block's ranges they take, in
 * block order (*n of them; owned by m; after dt_model_set_held). */
DT_API dt_status dt_model_set_held(dt_model *m, const unsigned char *held);
DT_API const dt_grad_range *dt_model_held_ranges(const dt_model *m, int *n);

/* ---- pipeline stages of a sequential model --------------------------------
 * A stage runs layers [l0, l1) of a model on activations of its own, one
 * set per micro-batch in flight (engine/strategies/pipeline.c), with the model's
 * parameters and gradient block. The stream into layer l (the output of
 * layer l - 1, in the layout that layer keeps: a convolution's may be
 * blocked, dt_model_stream_size counts its padding) is what one stage sends
 * the next; the computation is the whole model's, layer by layer. */
typedef struct dt_model_acts dt_model_acts;
/* Floats a sample of the stream into layer l (l = 0: the input; l =
 * nlayers: the class scores). */
DT_API size_t dt_model_stream_size(const dt_model *m, int l);
/* A set of activations for layers [l0, l1) of m and batches up to
 * max_batch; the caller owns *out (dt_model_acts_free). */
DT_API dt_status dt_model_acts_create(dt_model_acts **out, const dt_model *m, int l0, int l1, int max_batch);
DT_API void dt_model_acts_free(dt_model_acts *a);
/* The set's bytes as allocated and *saved (when not NULL), as
 * dt_model_act_bytes; a set keeps the same outputs in 16 bits (not the
 * streams), in the kernels' precision when it was made, and must run in it. */
DT_API size_t dt_model_acts_bytes(const dt_model_acts *a, size_t *saved);
/* The stage's input stream [max_batch, stream_size(l0)] (NULL when l0 = 0:
 * it reads x) and its output [max_batch, stream_size(l1)]. */
DT_API float *dt_model_acts_input(dt_model_acts *a);
DT_API float *dt_model_acts_output(dt_model_acts *a);
/* Forward of the stage on B samples: x[B, input_size] when l0 = 0, else
 * the input stream; with l1 = nlayers the mean cross-entropy against
 * targets into *loss. Dropout takes the model's key
 * (dt_model_set_dropout_key) at the call. */
DT_API dt_status dt_model_forward_range(dt_model *m, dt_model_acts *a, const float *x, const int32_t *targets,
                                        int B, int train, float *loss);
/* Its backward: from dout[B, stream_size(l1)] (the last stage: from the
 * loss, scaled by the model's loss scale, dout unused); ACCUMULATES the
 * stage's parameter gradients; *din (when not NULL) is set to the gradient
 * of the input stream (NULL when l0 = 0), inside a, valid until its next
 * backward. */
DT_API dt_status dt_model_backward_range(dt_model *m, dt_model_acts *a, const float *dout, float **din);
/* Forward FLOPs of one sample through each layer, flops[nlayers], from the
 * shapes (2 x weights x output positions for linear and convolution layers,
 * one a value for the element-wise ones): a pipeline's cost per layer. */
DT_API dt_status dt_model_layer_costs(const int in_shape[3], const dt_layer_spec *layers, int nlayers,
                                      double *flops);

#ifdef __cplusplus
}
#endif
#endif
