/* Models trained on a device (docs/gpu.md): the CPU model's parameter and
 * gradient blocks in the same layout (so checkpoints are the same bytes),
 * the optimizer state, the activations and the workspace in one arena
 * (dev.h) planned at the start; every kernel through the seam.
 *
 *   dt_dev_blocks  what every device model keeps: the blocks, the
 *                  optimizer's state, the step's scalars (the loss, the
 *                  gradient's sum of squares, the step's weighted sum of
 *                  losses), two pinned host slots that
 *                  batches go through and, in bf16 or fp16, the
 *                  parameters' 16-bit copy that the GEMMs read.
 *   dt_dev_mlp     a sequential dt_model (linear, conv2d, maxpool, relu,
 *                  gelu, layernorm, flatten, dropout).
 *   dt_dev_gpt     the GPT (dev_gpt.c).
 *
 * In bf16 or fp16 (the run's [train] precision) every GEMM multiplies
 * 16-bit operands with fp32 sums, as the CPU's dt_sgemm in that precision:
 * the weights from the 16-bit copy, the GEMMs' inputs kept in 16 bits by
 * the forward (for the backward's weight gradients), the output gradients
 * converted before their two GEMMs; everything else fp32 (docs/gpu.md,
 * "Mixed precision"). */
#ifndef DT_GPU_DEV_MODEL_H
#define DT_GPU_DEV_MODEL_H

#include "dtrain/gpt.h"
#include "dtrain/nn.h"
#include "dtrain/optim.h"
#include "gpu/dev.h"

/* Which part of the state a rank's device holds: the optimizer's state over
 * slice `shard` of `shards` (dt_shard_range; 0 of 1: the whole block:
 * ZeRO's stage 1 and up), with grads_vm (stage 2) the gradient block
 * outside the arena, backed on demand (dt_dev_vm): each tensor's chunks
 * before backward writes it, given back by the strategy once reduced; with
 * params_vm (stage 3) the parameter block (and its 16-bit copy) too: the
 * slice's chunks backed throughout, the rest by the strategy while a layer
 * needs them. held (model parallel): both blocks and the optimizer's
 * state backed on demand, over the whole block's offsets, and no slice:
 * the ranges the strategy keeps backed by it (dt_dev_blocks_put_range). */
typedef struct {
    int shard, shards, grads_vm, params_vm, held;
} dt_dev_part;

typedef struct {
    const dt_dev *d;
    dt_dev_arena arena;
    dt_dev_vm gvm;            /* grads_vm: the gradient block's memory (grads is its base) */
    dt_dev_vm pvm;            /* params_vm: the parameter block's (params is its base) */
    dt_dev_vm hvm;            /* ... and in bf16/fp16 their 16-bit copy's (w16 is its base) */
    dt_dev_vm svm[2];         /* held: the optimizer's state blocks' (state[j] is svm[j]'s base) */
    int grads_vm, params_vm, held;
    int step_values;          /* a training step's kernels take values of the step's own (dropout's key): its
                                 calls differ from step to step, so it is not replayed as a graph */
    dt_dtype t;               /* the GEMMs' operands: DT_F32, or DT_BF16 / DT_F16 (16-bit operands) */
    size_t n;                 /* floats of each block */
    size_t largest;           /* floats of the largest tensor (the model's) */
    int kinds;                /* the tensors a layer has, each beside the other layers' same tensor in the block
                                 (the GPT's twelve; 1: a layer's tensors lie together) */
    int nstates;              /* the optimizer's state blocks (AdamW 2, SGD with momentum 1) */
    size_t slo, sn;           /* ... each of sn floats: the state of parameters [slo, slo + sn) (ZeRO: a
                                 rank's dt_shard_range slice; else the whole block, 0 and n; held: 0 and 0,
                                 the state blocks of n floats backed on demand) */
    float *params, *grads, *state[2];
    void *w16;                /* t 16-bit: the parameters in t (n values), converted after each change */
    float *loss;              /* the last forward's loss (one float) */
    double *sumsq;            /* two doubles: the gradient's sum of squares, the step's losses summed
                                 (loss_add; with defer_loss), read together (dt_dev_blocks_step_values) */
    float *guard;             /* two floats: the step's end on the device (step_scale: the update's scale, skip) */
    int defer_loss;           /* a training forward leaves its loss on the device (dt_dev_loss_out): the
                                 strategy sums it there and reads it once a step */
    double *row_loss;         /* the cross-entropy's rows (workspace) */
    void *slot[2];            /* the batches' two pinned slots (dt_dev_blocks_stage; an evaluation's
                                 reads come back through slot[0]) */
    void *slot_ev[2];         /* ... an event a slot: marks its last copies */
    int next_slot;
    void *k, *kpin, *k_ev;    /* the update's constants (dt_adamw_k or dt_sgd_k): on the device, which the
                                 update reads; their pinned copy, written by the host each update; an event
                                 that marks its copy's upload */
    const char *attention;    /* the GPT's causal attention: "fused" or "gemm" (att_plan.h; NULL: none) */
    const char *shards;       /* a tensor-parallel shard's collectives: their GPUs' communicator's backend
                                 (NULL: none) */
    size_t pinned_bytes;      /* every pinned buffer's bytes (the slots') */
    size_t stage_bytes;       /* the activations of pipeline stages alive, beside the arena (dt_dev_mlp_stage) */
    /* Called before each layer's forward (phase 0) and backward (phase 1),
     * training and evaluation alike, as the CPU models' layer hooks are
     * (the same layer numbers: the GPT's -1 embedding, L head); NULL: none.
     * ZeRO stage 3 gathers a layer's parameters there. */
    dt_status (*layer_fn)(int layer, int phase, void *user);
    void *layer_user;
} dt_dev_blocks;

/* The blocks' layer hook, called (DT_OK without one). */
dt_status dt_dev_blocks_layer(const dt_dev_blocks *b, int layer, int phase);

/* The blocks' description before planning: n floats, nstates state blocks
 * over the part's slice, GEMMs in precision t. */
dt_dev_blocks dt_dev_blocks_of(const dt_dev *d, dt_dtype t, size_t n, int nstates, dt_dev_part part);
/* Planning pass (arena base NULL: counts) and taking pass alike: the
 * blocks of n floats, nstates state blocks, the parameters' 16-bit copy
 * (t 16-bit), the scalars, rows for the cross-entropy of up to `rows` rows. */
void dt_dev_blocks_take(dt_dev_blocks *b, int rows);
/* The host's blocks (params[n], states[nstates][sn]: the state's slice)
 * onto the device (and the parameters' 16-bit copy made), and back (params
 * alone when states is NULL), a copy each; with params_vm the parameters'
 * slice alone. */
dt_status dt_dev_blocks_put(dt_dev_blocks *b, const float *params, float *const *states);
dt_status dt_dev_blocks_get(dt_dev_blocks *b, float *params, float *const *states);
/* Parameters [off, off + n) from the host's params (the same offsets)
 * onto the device, and their 16-bit copy made; with held blocks backed
 * first, with grads their gradients too (the ranges a stage keeps), with
 * states (NULL: none; the host's, laid out as params) the optimizer's
 * state of them. get_range: the parameters (and states) back to the
 * host. */
dt_status dt_dev_blocks_put_range(dt_dev_blocks *b, const float *params, float *const *states, size_t off, size_t n,
                                  int grads);
dt_status dt_dev_blocks_get_range(dt_dev_blocks *b, float *params, float *const *states, size_t off, size_t n);
/* Held blocks: the parameters' chunks wholly inside [off, off + n) given
 * back (a layer an evaluation gathered, which the rank does not keep; a
 * chunk it shares with another range stays), and after the evaluation
 * every chunk that touches none of the n ranges the rank keeps. */
dt_status dt_dev_blocks_drop_range(dt_dev_blocks *b, size_t off, size_t n);
dt_status dt_dev_blocks_keep_only(dt_dev_blocks *b, const dt_grad_range *ranges, int n);
/* The gradient block zero (grads_vm: wherever it is backed). */
dt_status dt_dev_blocks_zero_grad(dt_dev_blocks *b);
/* Gradients [off, off + n) (floats) about to be written by backward:
 * backed first (grads_vm; else, or held, whose strategy backs the ranges
 * it keeps, nothing to do). */
dt_status dt_dev_blocks_back(dt_dev_blocks *b, size_t off, size_t n);
/* The bytes of the chunks the slice spans in v (of es-byte elements), at
 * most (they stay backed: the reduced gradients the update reads, the
 * parameters it updates); 0 for a block in the arena. */
size_t dt_dev_blocks_kept(const dt_dev_blocks *b, const dt_dev_vm *v, size_t es);
/* The step's one read, 16 bytes: v[0] the gradient's sum of squares as
 * the seam's sumsq last left it in b->sumsq (its caller queued it, or
 * ignores it), v[1] the sum of the micro-batches' losses that loss_add
 * kept beside it (its user zeroes it at a step's start). */
dt_status dt_dev_blocks_step_values(dt_dev_blocks *b, double v[2]);
/* Where a training forward puts its loss: loss itself (read back at once),
 * or with b->defer_loss NULL (left on the device, *loss 0 until the step's
 * read). */
float *dt_dev_loss_out(const dt_dev_blocks *b, float *loss);
/* One optimizer step on the device over parameters r[nr] (NULL: the
 * state's slice [slo, slo + sn); held blocks: ranges whose state the
 * strategy put), o's constants for this step (after dt_optim_begin_step),
 * lr and the gradient scale (clipping, loss scale), or with guard
 * (b->guard after step_scale) the scale and the skip made on the device.
 * The caller then calls dt_dev_blocks_changed (ZeRO: after the slices'
 * gather). */
dt_status dt_dev_blocks_update(dt_dev_blocks *b, const dt_optim *o, float lr, float grad_scale, const float *guard,
                               const dt_grad_range *r, int nr);
/* After parameters r[nr] changed on the device (NULL: the whole block, or
 * with params_vm the slice's): their 16-bit copy made again (nothing in
 * fp32). */
dt_status dt_dev_blocks_changed(dt_dev_blocks *b, const dt_grad_range *r, int nr);
/* A GEMM operand in the blocks' precision: fp32 (f) when b->t is DT_F32,
 * else t's 16-bit values (h). */
typedef struct {
    const float *f;
    const void *h;
} dt_dev_x;
/* C = alpha op(A) op(B) + beta C (dt_sgemm's contract) in the blocks'
 * precision: sgemm on A.f, B.f, or gemm16 on A.h, B.h. */
dt_status dt_dev_gemm(const dt_dev_blocks *b, int ta, int tb, int M, int N, int K, float alpha, dt_dev_x A, int lda,
                      dt_dev_x B, int ldb, float beta, float *C, int ldc);
/* The weight matrix at offset w_off of the blocks as an operand (the
 * parameters, or their 16-bit copy). */
dt_dev_x dt_dev_weights(const dt_dev_blocks *b, size_t w_off);
/* dt_linear_forward / _backward on the device, as the CPU's: out[N,OC] =
 * in w^T (+ bias; the seam's linear_forward: cuBLASLt's epilogues), w the
 * matrix [OC,C] at w_off; pre (NULL: none): GELU after it, pre = in w^T +
 * bias and out = gelu(pre); backward din WRITTEN (NULL: not computed;
 * pre: the layer's input was gelu(pre), din the gradient through it: the
 * seam's linear_dgelu), the weights' gradient at w_off of the gradients
 * and db (NULL: no bias) +=. In 16 bits, in is the input in t and dout
 * (fp32) is converted first into dout16 (room for N OC 16-bit values),
 * which both GEMMs read. */
dt_status dt_dev_linear_forward(const dt_dev_blocks *b, float *out, float *pre, dt_dev_x in, size_t w_off,
                                const float *bias, int N, int C, int OC);
dt_status dt_dev_linear_backward(const dt_dev_blocks *b, float *din, const float *pre, size_t w_off, float *db,
                                 const float *dout, void *dout16, dt_dev_x in, int N, int C, int OC);
/* The bytes of each kind (dev.h's order) the arena holds, and beside it
 * with grads_vm the chunks of the slice's gradients (kept backed), with
 * params_vm the parameters', and the pipeline stages' activations. */
void dt_dev_blocks_kinds(const dt_dev_blocks *b, size_t bytes[DT_DEV_KINDS]);
/* Opens the arena after the planning pass (refusing, with the bytes by
 * kind, a plan the device cannot hold) and the two pinned slots of
 * slot_bytes each. */
dt_status dt_dev_blocks_open(dt_dev_blocks *b, size_t slot_bytes, const char *what);
void dt_dev_blocks_close(dt_dev_blocks *b);
/* A batch's way to the device, double-buffered: *host the next of the two
 * pinned slots, once the device has taken what was staged there two
 * batches before (its event polled, within DT_DEV_STAGE_WAIT seconds, a
 * hung kernel's error naming it). The host fills it, queues its copies
 * (to_device_async) and marks them (dt_dev_blocks_staged): so it stages a
 * micro-batch while the device runs the one before, without waiting. */
#define DT_DEV_STAGE_WAIT 600.0
dt_status dt_dev_blocks_stage(dt_dev_blocks *b, void **host);
dt_status dt_dev_blocks_staged(dt_dev_blocks *b);
/* Polls the event until it has run, within `limit` seconds (0: none),
 * else DT_ERR_TIMEOUT naming `what`. */
dt_status dt_dev_event_wait(const dt_dev *d, void *event, double limit, const char *what);

/* A pipeline stage's own memory (dt_dev_mlp_stage's, dt_dev_gpt_stage's):
 * the arena of its activations, counted in its model's blocks'
 * stage_bytes while it lives. open: after the arena's counting pass
 * (arena.d set), before its taking pass. */
typedef struct {
    dt_dev_blocks *owner;
    dt_dev_arena arena;
} dt_dev_stage_mem;
dt_status dt_dev_stage_mem_open(dt_dev_stage_mem *m, dt_dev_blocks *owner);
void dt_dev_stage_mem_close(dt_dev_stage_mem *m);

typedef struct dt_dev_mlp dt_dev_mlp;
/* The device's twin of the sequential model m (its plan and blocks'
 * layout; m stays the host copy) for batches of up to max_batch (the
 * training's micro-batches and the evaluation's batches), with
 * nstates optimizer blocks over the part's slice (dt_dev_blocks_of),
 * its GEMMs in precision t (DT_F32, DT_BF16, DT_F16: the run's); seed:
 * dropout's, as dt_model_init's. */
dt_status dt_dev_mlp_create(dt_dev_mlp **out, const dt_dev *d, const dt_model *m, int max_batch, int nstates,
                            dt_dev_part part, dt_dtype t, uint64_t seed);
/* A tensor-parallel shard's sums over the shards (m a shard: its
 * row-parallel layers' outputs, its column-parallel ones' input
 * gradients): fn on its device buffers (the task's, on a GPUs'
 * communicator over the shards: comm/device.h); before the stages are
 * made. */
typedef dt_status (*dt_dev_reduce_fn)(float *buf, size_t n, void *user);
void dt_dev_mlp_set_reduce(dt_dev_mlp *dm, dt_dev_reduce_fn fn, void *user);
void dt_dev_mlp_free(dt_dev_mlp *dm);
dt_dev_blocks *dt_dev_mlp_blocks(dt_dev_mlp *dm);
/* dt_model_forward (train = 1) on B samples x[B, in] (host), targets y[B]
 * (host): through a pinned slot to the device; *loss read back (NULL:
 * left on the device, dt_dev_loss_out). step and first: dropout's key
 * (dt_model_set_dropout_key's). */
dt_status dt_dev_mlp_forward(dt_dev_mlp *dm, const float *x, const int32_t *y, int B, float loss_scale,
                             uint64_t step, int64_t first, float *loss);
/* dt_model_forward in inference (train = 0: dropout the identity) on B
 * samples (host), for an evaluation: *loss (the batch's mean) and the
 * probabilities probs[B, classes] (host) read back through the pinned
 * buffer. A backward does not follow it. */
dt_status dt_dev_mlp_evaluate(dt_dev_mlp *dm, const float *x, const int32_t *y, int B, float *loss,
                              float *probs);
/* dt_model_backward on the device. hook (NULL: none) is called as
 * dt_model_set_grad_hook's, after each layer with parameters has its
 * gradient kernels queued: the gradients at offsets >= pos of the block
 * are final once the kernels queued so far have run (the caller marks them
 * with an event: dev.h's event_record). */
dt_status dt_dev_mlp_backward(dt_dev_mlp *dm, dt_grad_ready_fn hook, void *user);
/* A pipeline stage of dm: layers [l0, l1) on an activation set of their
 * own for up to dm's max_batch samples (device memory beside the arena,
 * taken now), over dm's blocks (dt_model_forward_range's and
 * dt_model_backward_range's, kernel for kernel). The streams between
 * stages are device memory of the stage's own: stage_streams gives the
 * buffer the stream in is written into before a forward (unused where l0
 * = 0) and the one the stream out is in after it, until the next forward
 * (unused where l1 is the last layer), and their floats a sample. */
typedef struct dt_dev_mlp_stage dt_dev_mlp_stage;
dt_status dt_dev_mlp_stage_create(dt_dev_mlp *dm, int l0, int l1, dt_dev_mlp_stage **out);
void dt_dev_mlp_stage_free(dt_dev_mlp_stage *s);
void dt_dev_mlp_stage_streams(dt_dev_mlp_stage *s, float **in, size_t *in_floats, float **out, size_t *out_floats);
/* Forward of B samples in training mode: x[B, in] (host; l0 = 0) or the
 * stream in, targets y[B] (host; the last stage, which sets *loss);
 * loss_scale for the backward; step and first: dropout's key. */
dt_status dt_dev_mlp_stage_forward(dt_dev_mlp_stage *s, const float *x, const int32_t *y, int B, float loss_scale,
                                   uint64_t step, int64_t first, float *loss);
/* Its backward from dout (device: the gradient of the stream out; unused
 * on the last stage), parameter gradients accumulating; *din: the
 * gradient of the stream in (device, the stage's own, valid until the next
 * backward; NULL where l0 = 0). */
dt_status dt_dev_mlp_stage_backward(dt_dev_mlp_stage *s, const float *dout, float **din);

typedef struct dt_dev_gpt dt_dev_gpt;
/* The device's twin of m for B x T tokens, nstates optimizer blocks over
 * the part's slice, its GEMMs and the attention's products in precision t.
 * A held part (model parallel, whose stages train: dt_dev_gpt_stage) keeps
 * one block's activations for the evaluations' forwards (backward
 * refused). */
dt_status dt_dev_gpt_create(dt_dev_gpt **out, const dt_dev *d, const dt_gpt *m, int B, int T, int nstates,
                            dt_dev_part part, dt_dtype t);
void dt_dev_gpt_free(dt_dev_gpt *g);
/* A tensor-parallel shard's collectives over the shards (m a shard:
 * dt_gpt_create_shard, sequence parallel or not: nn/gpt.c's sums, maxima,
 * reduce-scatters and allgathers): fn on its device buffers, as
 * dt_dev_mlp_set_reduce's; before the stages are made. */
void dt_dev_gpt_set_reduce(dt_dev_gpt *g, dt_gpt_reduce_fn fn, void *user);
dt_dev_blocks *dt_dev_gpt_blocks(dt_dev_gpt *g);
/* dt_gpt_forward on tokens inputs, targets [B, T] (host); loss NULL: left
 * on the device (dt_dev_loss_out). */
dt_status dt_dev_gpt_forward(dt_dev_gpt *g, const int32_t *inputs, const int32_t *targets, int B, int T,
                             float loss_scale, float *loss);
/* dt_gpt_backward on the device; hook (NULL: none) as dt_gpt_set_grad_hook's
 * (positions in dt_gpt_grad_order), called when the kernels are queued, as
 * dt_dev_mlp_backward's. */
dt_status dt_dev_gpt_backward(dt_dev_gpt *g, dt_grad_ready_fn hook, void *user);
/* A pipeline stage of g: blocks [l0, l1) (with the embedding where l0 = 0,
 * the head and the loss where l1 is the last), as dt_dev_mlp_stage's: an
 * activation set of its own for up to g's batch, the streams (the
 * residual stream [B, T, C] in and out: the shard's rows under sequence
 * parallel) in its own device memory, stage_streams's places (which do not
 * depend on the batch), nn/gpt.c's stage calls kernel for kernel. */
typedef struct dt_dev_gpt_stage dt_dev_gpt_stage;
dt_status dt_dev_gpt_stage_create(dt_dev_gpt *g, int l0, int l1, dt_dev_gpt_stage **out);
void dt_dev_gpt_stage_free(dt_dev_gpt_stage *s);
void dt_dev_gpt_stage_streams(dt_dev_gpt_stage *s, float **in, float **out);
/* Forward of B x T tokens: inputs (host; the first stage) or the stream
 * in, targets (host; the last stage, which sets *loss). */
dt_status dt_dev_gpt_stage_forward(dt_dev_gpt_stage *s, const int32_t *inputs, const int32_t *targets, int B, int T,
                                   float loss_scale, float *loss);
/* Its backward from d (device: the gradient of the stream out; unused on
 * the last stage); *din the gradient of the stream in, written over d (NULL
 * on the first stage). */
dt_status dt_dev_gpt_stage_backward(dt_dev_gpt_stage *s, float *d, float **din);

#endif
