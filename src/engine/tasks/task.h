/* A model's side of the run loop: the table the one loop (engine/loop.c)
 * trains through, as ggml_opt takes callbacks. The classifier
 * (engine/tasks/classifier.c: IDX images, dt_model) and the GPT
 * (engine/tasks/gpt.c: token windows, dt_gpt) are two such tables; the loop
 * never names either.
 *
 * A task owns its model, its data and its evaluation; it tells the loop the
 * model's parameter and gradient blocks and their gradient order (for the
 * strategy), its tensors (for checkpoints) and the run's length. Batches are
 * global: every rank sees the same global batch and trains on its share
 * [first, first + share); the strategy cuts the share into micro-batches, and
 * forward takes one of them by its offset in the share. */
#ifndef DT_ENGINE_TASK_H
#define DT_ENGINE_TASK_H

#include "dtrain/ckpt.h"
#include "dtrain/comm.h"
#include "dtrain/config.h"
#include "dtrain/gpt.h"
#include "dtrain/nn.h"
#include "dtrain/train.h"
#include "gpu/dev_model.h"

#include <cjson/cJSON.h>

typedef struct dt_task dt_task;

/* Where a rank's block lies in the whole model's (a tensor-parallel
 * shard's): fill puts the elements of [lo, hi) of the whole block that
 * `local` holds into buf[0, hi - lo) and leaves the others; an element
 * every part holds (a whole tensor) is filled by one part alone (shard 0's),
 * so that each element of a copy of the model has one filler. take sets the
 * elements of `local` that lie in [lo, hi) from buf[0, hi - lo). user:
 * dt_task_info's part_user. */
typedef void (*dt_part_fill_fn)(void *user, const float *local, size_t lo, size_t hi, float *buf);
typedef void (*dt_part_take_fn)(void *user, float *local, size_t lo, size_t hi, const float *buf);

/* What a task tells the loop when it is created. */
typedef struct {
    float *params, *grads;            /* the model's blocks */
    size_t nparams;
    const dt_grad_range *order;       /* gradient order (NULL: the block from its end) */
    int norder;
    const int *order_layer;           /* the layer (as the layer hook numbers them) using each range of
                                         the order; NULL: no layer hook */
    const unsigned char *order_split; /* per range of the order: divided among the tensor-parallel ranks
                                         ([parallel] tensor; NULL: none is) */
    dt_comm_t replicas;               /* the ranks holding the same parameter block as this one (tensor
                                         parallel: those of its tensor rank); NULL: all */
    dt_comm_t tensor_group;           /* tensor parallel: the ranks holding the shards of one copy of the
                                         model (rank in it = its shard); NULL: none. Both owned by the task
                                         (released by close) */
    const dt_grad_matrix *matrices;   /* this block's 2-D tensors, in block order (dt_codec_matrices) */
    int nmatrices;
    const dt_tensor_info *tensors;    /* for checkpoints: the whole model's (also when ranks hold shards) */
    size_t nwhole;                    /* floats of the whole model's block (nparams unless sharded) */
    dt_part_fill_fn part_fill;        /* where this rank's block lies in the whole (NULL unless sharded, or
                                         the model can keep some layers: hold) */
    dt_part_take_fn part_take;
    void *part_user;
    int deferred;                     /* the parameters are set by hold (a pipeline stage's layers), not at
                                         create: the loop does not share them at the start */
    int sliced;                       /* create set this rank's ZeRO-3 slice of the parameters alone
                                         (dt_shard_range over the ranks), every rank its own from the same
                                         stream: the loop does not share them at the start either */
    const dt_grad_range *frozen;      /* ranges of the block the optimizer leaves alone (batch norm's running
                                         statistics: nn.h dt_model_buffer_ranges), in order; NULL, 0: none */
    int nfrozen;
    int tied;                         /* the order's first range is used by the first and the last layer
                                         too (the GPT's wte, its tied head): a pipeline's end stages keep it */
    int ntensors;
    const dt_st_meta *weights_meta;   /* the weights file's metadata (a GPT's shape) */
    int nweights_meta;
    int64_t steps_per_epoch, total_steps;
    int epochs;
    int64_t tokens_per_sample;        /* language models: tokens a sample trains; else 0 */
    int has_eval;                     /* evaluate() has data to run on */
    dt_rng rng;                       /* the data stream's initial state (checkpointed) */
    int tables_remote;                /* the model's embedding tables are on the strategy's servers, not in the
                                         block: the loop pulls and pushes each step's rows (rows) */
    char describe[512];               /* model and data, for the start line */
    dt_dev_blocks *device;            /* [train] device = cuda: the blocks the steps use are these, on the
                                         device (params and grads above are the host's copy, kept current
                                         by the strategy for evaluations and checkpoints); NULL: the CPU */
} dt_task_info;

/* Rows [n, dim] of embedding tables by their global numbers ids[n]
 * (sorted, distinct) into vals: where a recommender's tables live. */
typedef dt_status (*dt_task_rows_fn)(void *user, const int64_t *ids, size_t n, float *vals);

/* This rank's part of a global batch. */
typedef struct {
    int first, share, global;
} dt_task_batch;

/* One micro-batch's activations for a pipeline stage's layers [l0, l1). */
typedef struct dt_task_stage dt_task_stage;

/* Called before a layer's forward (phase 0) or backward (phase 1). */
typedef dt_status (*dt_task_layer_fn)(int layer, int phase, void *user);

typedef struct dt_task_ops {
    const char *name;
    int (*wants)(const dt_config *c);  /* the registry takes the first that wants c */
    /* Loads the data and builds the model with room for micro-batches of up
     * to max_micro samples (and model_rows rows in all, dt_check_memory's
     * answer for a classifier); initial parameters from c's seed. */
    dt_status (*create)(dt_task **out, const dt_config *c, dt_comm_t comm, int max_micro, int model_rows,
                        dt_task_info *info);
    void (*destroy)(dt_task *t);
    /* Loads what create will need that does not depend on the rank (the
     * data) and keeps it for the process's next create with the same config
     * (the same pointer): a spare does this while it idles (--spares), so
     * that it trains as soon as it takes a dead worker's place; c == NULL
     * releases what was loaded. NULL: nothing to load ahead. */
    dt_status (*warm)(const dt_config *c);
    /* Releases the sub-communicators the task split from comm, before the
     * loop destroys comm (NULL: it has none). */
    void (*close)(dt_task *t);
    /* Positions the data at batch `batch` of epoch `epoch`. */
    void (*start_epoch)(dt_task *t, int64_t epoch, int64_t batch);
    /* Positions the data of the current epoch at batch `batch`, whose part
     * `part` of the even split among the workers the next next_batch gives
     * (parameter servers' [ps] share = dynamic). NULL: a task whose batches
     * are its rank's share only. */
    void (*seek)(dt_task *t, int64_t batch, int part);
    /* The next global batch (rng: the checkpointed data stream); *more = 0
     * at the end of the epoch. */
    dt_status (*next_batch)(dt_task *t, dt_rng *rng, dt_task_batch *b, int *more);
    void (*zero_grad)(dt_task *t);
    /* Forward over samples [off, off + len) of the share, the loss scaled by
     * loss_scale in the backward that follows; step keys dropout. */
    dt_status (*forward)(dt_task *t, int64_t step, int off, int len, float loss_scale, float *loss);
    /* Backward of the last forward, the hook called as gradients become
     * final; an error only on a device (the step then stops: its buckets
     * would read gradients never written). */
    dt_status (*backward)(dt_task *t, dt_grad_ready_fn hook, void *user);
    /* After a step's `done` micro-batches on this rank (0 for an empty
     * share): a model whose forward and backward sum over the workers
     * (synchronized batch norm) makes the sums of the micro-batches other
     * ranks run and this one has not. NULL: nothing to pair up. */
    dt_status (*micro_pad)(dt_task *t, int done);
    /* The next forward and backward run their samples as n segments of
     * len[k] samples, each with the bits of a pass over it alone, its loss
     * scaled by scale[k], its gradient of each tensor handed to fn (the
     * block left zero): a model with batch norm in deterministic mode
     * (dt_model_set_segments). NULL: a task without batch norm. */
    dt_status (*segments)(dt_task *t, int n, const int *len, const float *scale, dt_grad_part_fn fn, void *user);
    /* Sets the hook before each layer's forward and backward (NULL: the
     * model has no layers to hook, as the classifier). */
    void (*set_layer_hook)(dt_task *t, dt_task_layer_fn fn, void *user);
    /* ---- pipeline stages (NULL: a model without them) ----
     * A stage runs layers [l0, l1) of the model's (the GPT's n_layer blocks,
     * with the embedding when l0 = 0 and the head and loss when l1 =
     * n_layer; a sequential model's [model] layers, the loss after the last)
     * on one micro-batch at a time per dt_task_stage; several may be
     * alive at once (engine/strategies/pipeline.c). */
    dt_status (*stage_create)(dt_task *t, int l0, int l1, int max_len, dt_task_stage **out);
    void (*stage_free)(dt_task_stage *st);
    /* Starts samples [off, off + len) of the global batch of step `step` on
     * st (len >= 1), their loss scaled by loss_scale in the backward: *in
     * (in_count floats) is the stream into the stage (written by the stage
     * before; unused on the first), *out (out_count floats) the stream out
     * of it after stage_forward. */
    dt_status (*stage_begin)(dt_task *t, dt_task_stage *st, int64_t step, int off, int len, float loss_scale,
                             float **in, size_t *in_count, float **out, size_t *out_count);
    /* Forward of the started micro-batch; *loss set on the last stage. */
    dt_status (*stage_forward)(dt_task *t, dt_task_stage *st, float *loss);
    /* Its backward: d[out_count] holds the gradient with respect to *out
     * (unused on the last stage, which starts from the loss; d may be
     * overwritten); *din is set to the gradient with respect to *in
     * (in_count floats, d itself or the stage's own buffer, valid until
     * the stage's next backward); parameter gradients accumulate. */
    dt_status (*stage_backward)(dt_task *t, dt_task_stage *st, float *d, float **din);
    /* Makes the step's batch a scratch one of len samples (zeros), so that
     * the stages can be timed before the first step (stage_begin with off
     * 0; the results are not used). */
    dt_status (*scratch_batch)(dt_task *t, int len);
    /* A model whose parameters create left unset (info's deferred): keeps
     * only the layers held[l] says and sets their parameters (c's seed, or
     * [model] init_from); *ranges (*n of them, owned by the task) are the
     * block's ranges it keeps. NULL: a model that keeps every layer. */
    dt_status (*hold)(dt_task *t, const unsigned char *held, const dt_grad_range **ranges, int *n);
    /* Evaluation sharded over comm's ranks (NULL: the whole set on this
     * rank alone); *accuracy < 0: none. step and
     * train_loss are where the run stands (for the task's history). */
    dt_status (*evaluate)(dt_task *t, dt_comm_t comm, int64_t step, float train_loss, float *loss, float *accuracy);
    /* The final weights file, written a piece at a time
     * (dt_run_weights_write), never from a whole block in one process:
     * called on every rank, path NULL but on the one that writes it (rank 0
     * of the world). This rank's parameter block is valid in [lo, hi) (a
     * strategy's slice: ZeRO-3's; else all of it), the rest is on the other
     * ranks of comm (NULL: none); a model split over tensor-parallel shards
     * gathers them from its shard group (the writer's). */
    dt_status (*save)(dt_task *t, const char *path, dt_comm_t comm, size_t lo, size_t hi);
    /* The task's own fields of summary.json. */
    void (*summary)(dt_task *t, cJSON *o, const dt_train_result *r);
    /* [train] dynamic_batch: the global batches assembled from now on are
     * cut into nunits equal units, of which rank r takes units[r] in rank
     * order (dt_loader_set_shares). NULL: a task whose batches split
     * evenly only. */
    dt_status (*set_shares)(dt_task *t, const int *units, int nunits);
    /* After every rank rejoined in a new generation with a spare in a dead
     * rank's place (dt_comm_rejoin): the communicators the task split from
     * comm at its create (a tensor-parallel model's shard groups), which
     * the new generation broke, split again in the same order, so that a
     * spare's create meets them; *replicas and *tensor_group get the new
     * ones (as dt_task_info's). NULL: a task that splits none. */
    dt_status (*regroup)(dt_task *t, dt_comm_t comm, dt_comm_t *replicas, dt_comm_t *tensor_group);
    /* Federated clients (engine/federated/federate.c); both NULL for a task that
     * cannot have them. The labels of the training samples: *y[n], n
     * returned; the caller may change them (the label-flipping attack that
     * tests and benches simulate, engine/robust/robust.h). */
    int (*train_labels)(dt_task *t, int32_t **y);
    /* Trains, until the next call, on the training samples idx[n] alone, on
     * this rank alone (share = global), in batches of `batch` reshuffled
     * each epoch from seed; n = 0: the whole set as created. */
    dt_status (*set_subset)(dt_task *t, const uint32_t *idx, int n, int batch, uint64_t seed);
    /* A recommender whose tables are on the servers (dt_task_info's
     * tables_remote): the distinct rows this rank's share of the batch
     * touches, which next_batch lists: their global numbers ids[n], the
     * buffer their values go into before forward (vals[n, dim]) and the one
     * backward adds their gradients to (grads[n, dim]; zero_grad clears
     * it). set_rows_source: where evaluation gets its rows. NULL: a model
     * without such tables. */
    void (*rows)(dt_task *t, const int64_t **ids, size_t *n, float **vals, float **grads);
    void (*set_rows_source)(dt_task *t, dt_task_rows_fn fn, void *user);
} dt_task_ops;

/* The task for a config (the registry in loop.c). */
const dt_task_ops *dt_task_for(const dt_config *c);
/* A model split over [parallel] tensor = T (docs/model-parallel.md's layout):
 * the T consecutive ranks from rank - rank % T hold one copy's T shards
 * (*tpc, whose sums the model runs), the ranks of the same shard evaluate
 * and sum their gradients together (*rest); *tp is this rank's shard of
 * *ntp. gpus (NULL: a model without a device twin): on a device
 * ([train] device = cuda), a GPUs' communicator over *tpc (comm/device.h),
 * on which the device model's sums run. The groups there were go (the
 * task's regroup after a rejoin), new ones are split from comm; with T <=
 * 1 there are none. */
dt_status dt_task_shard_groups(dt_comm_t comm, const dt_config *c, int *ntp, int *tp, dt_comm_t *tpc, dt_comm_t *rest,
                               dt_comm_t *gpus);

/* An evaluation of n items split over W ranks: rank r takes [*lo, *hi) =
 * [n r / W, n (r + 1) / W) in chunks of up to `chunk`; *extra is how many
 * more forwards the busiest rank runs, which this rank must make the layer
 * hook's calls of too where a strategy gathers through it (ZeRO-3: every
 * rank takes part in every gather): dt_task_replay. */
void dt_task_eval_share(long n, int r, int W, int chunk, int *lo, int *hi, int *extra);
/* The layer hook's calls of `times` forwards of layers first..last (phase
 * 0), without the forwards. fn NULL: none. */
dt_status dt_task_replay(dt_task_layer_fn fn, void *user, int first, int last, int times);

/* A language model's forward over n windows of T tokens x with targets y:
 * their mean loss into *loss, *logits its logits [n T, V]. */
typedef dt_status (*dt_task_lm_fn)(void *user, const int32_t *x, const int32_t *y, int n, int T, float *loss,
                                   const float **logits);
/* The layer hook's calls a rank owes for the forwards it did not run
 * (dt_task_replay's fn, user, first and last). */
typedef struct {
    dt_task_layer_fn fn;
    void *user;
    int first, last;
} dt_task_hook;
/* The mean loss, and the next-token accuracy where acc is not NULL, over
 * `windows` consecutive windows of T tokens of val: this rank's share
 * (dt_task_eval_share) in forwards of up to Bc windows through x and y
 * ([Bc, T] each), then the hook's calls of the forwards the busiest rank
 * runs beyond this one's (hook NULL: none), the sums added over comm (NULL:
 * this rank's alone). */
dt_status dt_task_val_loss(dt_task_lm_fn fwd, void *user, const dt_tokens *val, int windows, int Bc, int T, int V,
                           int32_t *x, int32_t *y, dt_comm_t comm, const dt_task_hook *hook, float *loss, float *acc);
/* A language model's token file: [data] train_file (train = 1) or
 * val_file, checked against [train] seq_len; the training file's shard of
 * rank r of W alone where the data is read sharded (dt_config_data_sharded:
 * each rank's windows come from its own shard, dt_tokens_sample). */
dt_status dt_task_open_tokens(dt_tokens *tk, const dt_config *c, int train, int r, int W);
/* `dtrain eval` of a language model (built and loaded by the caller): its
 * loss and next-token accuracy through fwd over eval_batches batches of
 * [data] val_file's windows (train_file's where there is none); *n the
 * tokens. */
dt_status dt_task_eval_tokens(const dt_config *c, dt_task_lm_fn fwd, void *user, float *loss, float *acc, int *n);
/* One evaluation's entry {step, train_loss, val_loss} appended to a
 * language model's val_history. */
void dt_task_history_add(cJSON *history, int64_t step, float train_loss, float val_loss);

/* A task's save (above): the weights file of tensors[n] from params (this
 * rank's block, valid in [lo, hi); or its parts, through fill and user:
 * dt_task_info's part_fill) and what the other ranks of comm hold
 * (dt_run_weights_write). */
dt_status dt_task_write_weights(const char *path, const dt_tensor_info *tensors, int n, const dt_st_meta *meta,
                                int nmeta, const float *params, dt_part_fill_fn fill, void *user, dt_comm_t comm,
                                size_t lo, size_t hi);

/* The layers a model's stages count (stage_create's l0, l1): a language
 * model's blocks, a sequential model's [model] layers. */
int dt_task_layers(const dt_config *c);

/* Each layer's measured forward and backward seconds on a micro-batch of
 * `samples` samples (each the median of DT_TASK_TIME_REPS). */
#define DT_TASK_TIME_REPS 5
typedef struct {
    int layers, samples;
    double *forward, *backward; /* [layers] each (malloc'd: dt_task_layer_times_free) */
} dt_task_layer_times;

/* Times each layer alone before the first step, on every rank of comm at
 * once: a stage of the task's for that layer (stage_create; the first
 * layer's with the embedding or the images, the last one's with the head
 * and the loss) on a scratch batch of `samples` samples (scratch_batch:
 * zeros; the next next_batch replaces it), forward then backward,
 * DT_TASK_TIME_REPS times, the median of each. A GPT's blocks cost the
 * same: its first, second (a block alone) and last layers are timed, the
 * others take the second's. The ranks agree on the largest of each figure
 * (an int64 allreduce max of nanoseconds: exact, so every rank has the
 * same numbers); every rank reaches it, with its error after it. Only one
 * layer's activations exist at a time, and the gradients the measurement
 * leaves in grads[n] are given back (their pages too). What a pipeline's
 * measured balance cuts by and `[train] time_layers` reports. */
dt_status dt_task_time_layers(const dt_task_ops *tops, dt_task *task, const dt_config *c, dt_comm_t comm,
                              int samples, float *grads, size_t n, dt_task_layer_times *out);
void dt_task_layer_times_free(dt_task_layer_times *t);

extern const dt_task_ops dt_task_classifier; /* engine/tasks/classifier.c */
extern const dt_task_ops dt_task_gpt;        /* engine/tasks/gpt.c */
extern const dt_task_ops dt_task_llama;      /* engine/tasks/llama.c */
extern const dt_task_ops dt_task_dlrm;       /* engine/tasks/dlrm.c */

#endif
