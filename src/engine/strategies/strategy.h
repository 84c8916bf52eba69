/* The engine's strategy seam: who holds which bytes, and which collectives
 * run when.
 *
 * The run loop (engine/loop.c) is the same for every way of distributing a
 * model; a strategy is a table of operations it calls at fixed points of a
 * step, like ggml's backends or NCCL's transports:
 *
 *   s = dt_strategy_create(...)            pick by config (registry below)
 *   per step:
 *     [run_step(s, tops, task, step, batch, &loss_sum)]  when the strategy
 *                                          drives the micro-batches itself
 *                                          (pipeline), instead of:
 *     nm = dt_strategy_plan(s, first, share, global)   micro-batches in s->off/len
 *     for k < nm:                          loss of micro-batch k scaled by len[k] / s->loss_denom x s->loss_scale
 *       [params_needed(s, layer, phase)]   before a layer's forward/backward
 *       forward; backward with the grad hook of dt_strategy_grad_hook(s, k)
 *       dt_strategy_micro_end(s, k)
 *     dt_strategy_sync(s)                  gradients complete where needed
 *     (the control plane agrees on loss, stop and save: engine/control.h)
 *     dt_strategy_grad_norm(s, &norm)      the global gradient norm
 *     dt_strategy_update(s, lr, scale)     the optimizer over the rank's slice
 *   dt_strategy_params_eval(s, 1 / 0)     around an evaluation (which gathers through the layer hook)
 *   dt_strategy_params_sync(s)             before an evaluation, a checkpoint, the final weights
 *   dt_strategy_params_host(s)             before a checkpoint and the final weights (a device's host copy)
 *   dt_strategy_ckpt_stage(s)              before a checkpoint
 *   dt_strategy_ckpt_view(s, &m)           what this rank holds, for checkpoints
 *   dt_strategy_ckpt_restore(s, path, W0)  its own state from the checkpoint resumed
 *
 * Peers today: "dp" (replicated data parallel: gradients summed in buckets
 * during backward through a gradient codec, engine/codecs/codec.h),
 * "dp-deterministic" (int64 fixed-point sums, bitwise equal for any number
 * of ranks), "zero", "zero-deterministic" and "zero-3" (sharded data
 * parallel, engine/strategies/zero.c, docs/zero.md), "model-parallel" (the GPT's
 * tensor-parallel shards and pipeline stages, engine/strategies/pipeline.c), "local-sgd" (each rank steps on its own share's
 * gradient and the parameters are averaged every [parallel] sync_every
 * steps) and "ps" (parameter servers, engine/strategies/ps/: ranks of another role,
 * the servers, which run their own loop through `serve`). A new strategy is a new file with its table, added to the one
 * registry in strategy.c; the loop never names one.
 *
 * Every strategy shards with dt_shard_range (core.h): the slice [lo, hi) of
 * the flat state that this rank's optimizer updates ([0, n) when the state
 * is replicated). */
#ifndef DT_ENGINE_STRATEGY_H
#define DT_ENGINE_STRATEGY_H

#include "core/fixed.h"
#include "dtrain/ckpt.h"
#include "dtrain/comm.h"
#include "dtrain/config.h"
#include "dtrain/nn.h"
#include "dtrain/optim.h"
#include "engine/tasks/task.h"
#include "obs/obs.h"

typedef struct dt_strategy dt_strategy;

/* What a strategy is built over: the model's parameter and gradient blocks
 * (params[n], grads[n]) and the order in which backward finishes the
 * gradients (NULL, 0: the block from its end; see dt_gpt_grad_order). */
typedef struct {
    const dt_config *c;
    dt_comm_t comm;
    float *params, *grads;
    size_t n;
    const dt_grad_range *order;
    int norder;
    dt_obs *obs;                 /* may be NULL */
    const int *order_layer;      /* the layer using each range of the order (NULL: none) */
    dt_comm_t all;               /* every rank of the run (NULL: comm; other than comm with ranks of another role) */
    const unsigned char *order_split; /* ranges divided among tensor-parallel ranks (NULL: none) */
    size_t nwhole;               /* the whole model's floats (n, or 0, unless the blocks are parts of it) */
    dt_part_fill_fn part_fill;   /* where the parts lie in the whole block (task.h) */
    dt_part_take_fn part_take;
    void *part_user;
    dt_comm_t replicas, tensor_group; /* the task's (task.h), NULL without shards */
    const dt_grad_matrix *matrices;   /* the block's 2-D tensors, for the gradient codec (NULL, 0: none) */
    int nmatrices;
    int tied;                    /* the order's first range is used by the first and the last layer (task.h) */
    dt_dev_blocks *device;       /* the task's blocks on a device (task.h; NULL: the CPU's) */
    const dt_grad_range *frozen; /* ranges the optimizer leaves alone (task.h), nfrozen */
    int nfrozen;
} dt_strategy_args;

typedef struct dt_strategy_ops {
    const char *name;
    size_t size;                                   /* of the peer's struct, which starts with dt_strategy */
    int (*wants)(const dt_config *c);              /* the registry takes the first that wants c */
    dt_status (*check)(const dt_config *c, int W); /* before anything is built; errors name the field */
    int (*max_micro)(const dt_config *c, int W);   /* the largest micro-batch a rank runs */
    dt_status (*init)(dt_strategy *s);             /* after the base fields are set */
    void (*fini)(dt_strategy *s);
    /* Plans a step over this rank's samples [first, first + share) of a
     * global batch: fills s->off/len/nmicro; the gradient block is zero. */
    int (*plan)(dt_strategy *s, int first, int share, int global);
    /* The gradient-ready hook for micro-batch k's backward (NULL: none). */
    dt_grad_ready_fn (*grad_hook)(dt_strategy *s, int k, void **user);
    /* Parameters needed before layer `layer`'s forward (phase 0) or backward
     * (phase 1), through the task's layer hook (layers as the GPT numbers
     * them: -1 the embedding, L the head); NULL when the strategy keeps
     * every parameter at hand, as both data-parallel peers do. A strategy
     * that has it runs only on a task with a layer hook. */
    dt_status (*params_needed)(dt_strategy *s, int layer, int phase);
    void (*micro_end)(dt_strategy *s, int k);      /* after micro-batch k's backward; may be NULL */
    /* A whole step's forwards and backwards on this rank, in the strategy's
     * own schedule, through the task's stage calls; *loss_sum as the loop's
     * micro-steps give it (this rank's sum of micro-batch loss x size). NULL:
     * the loop runs plan, forward and backward itself. A strategy that has
     * it runs only on a task with stages (checked by its check()). */
    dt_status (*run_step)(dt_strategy *s, const dt_task_ops *tops, dt_task *task, int64_t step,
                          const dt_task_batch *b, double *loss_sum);
    dt_status (*sync)(dt_strategy *s);             /* the gradients this rank updates are the global mean */
    dt_status (*grad_norm)(dt_strategy *s, double *norm);
    /* The synchronised gradient's check for NaN and Inf (*nonfinite),
     * where its blocks are not the host's (a device's); NULL: the loop
     * sums the squares of grads[lo, hi) itself. step: the step's number
     * (from 1), for DTRAIN_FAULT_OVERFLOW (dt_fault_overflow). *loss_sum:
     * the micro-batches' losses summed by the loop (loss times len[k]),
     * which a strategy that keeps the losses on the device (a device's:
     * the task's forward returned 0 for each) replaces with its own sum,
     * read in the same single read as the check. */
    dt_status (*grads_nonfinite)(dt_strategy *s, int64_t step, double *loss_sum, int *nonfinite);
    dt_status (*update)(dt_strategy *s, float lr, float grad_scale);
    /* One rank whose blocks are a device's (NULL: the loop's order, sync,
     * grads_nonfinite, grad_norm, update): the step's end made there,
     * the host reading once, after the update is queued. The norm, the
     * clipping scale (optim/elem.h's dt_step_scale of clip and unscale,
     * 1 / the loss scale) and the NaN/Inf skip computed on the device, the
     * update (lr) skipping itself there; then *loss_sum (as
     * grads_nonfinite's), *norm (before unscale) and *nonfinite (the step
     * was skipped, the optimizer's step count as before it). */
    dt_status (*update_end)(dt_strategy *s, int64_t step, float lr, float clip, float unscale, double *loss_sum,
                            double *norm, int *nonfinite);
    /* Around an evaluation (begin = 1 before, 0 after), which runs whole
     * forwards through the layer hook (params_needed): a strategy whose
     * ranks keep parts of the model gathers the others' there, and gives
     * back what it gathered after it. NULL: a strategy that gathers
     * nothing. */
    dt_status (*params_eval)(dt_strategy *s, int begin);
    /* Makes every rank's parameters the same, before an evaluation, a
     * checkpoint and the final weights; NULL when they always are (every
     * peer but local SGD). */
    dt_status (*params_sync)(dt_strategy *s);
    /* Brings the host's blocks (s->params, the optimizer's state) up to
     * date where the live ones are elsewhere (a device's), before a
     * checkpoint and the final weights file read them; evaluations do not
     * read them. NULL: the host's blocks are the live ones. */
    dt_status (*params_host)(dt_strategy *s);
    /* Before a checkpoint is saved: makes what the checkpoint view shows
     * current (a model in parts assembles this rank's slice of the whole
     * model); a collective. NULL: the view is the live state. */
    dt_status (*ckpt_stage)(dt_strategy *s);
    /* State a rank keeps across steps beyond the blocks (dp's gradient
     * codec), for checkpoints: ckpt_extra is dt_ckpt_model's extra (0
     * tensors: none); ckpt_restore continues from that state in checkpoint
     * path ("": a fresh start), written by `parts` ranks (a collective).
     * NULL: no such state. */
    int (*ckpt_extra)(dt_strategy *s, dt_st_tensor *t, int max);
    dt_status (*ckpt_restore)(dt_strategy *s, const char *path, int parts);
    /* Ranks of another role than worker (the parameter servers): how many
     * of the world's ranks, the first ones, are not workers (NULL: none).
     * The loop splits the world (dt_comm_split): the workers' communicator
     * carries data sharding, the control plane, evaluation and checkpoints;
     * a rank of the other role runs `serve` to the end of the run instead,
     * with the world and its role's communicator. */
    int (*other_ranks)(const dt_config *c);
    dt_status (*serve)(const dt_config *c, dt_comm_t world, dt_comm_t mine, const char *run_dir);
    /* Optional: the first rank whose place a new process can take while
     * the others go on, let in alone by its peers (dt_shm_take_place,
     * docs/internals.md "Replacement"), or -1 when none can under c. */
    int (*alone_from)(const dt_config *c);
    /* Optional: the checkpoint of the loop's state *ts, written by the
     * strategy's own ranks instead of the loop's writer (when
     * s->ckpt_saves), called on every rank at the same steps. A checkpoint
     * given up (object storage failing past its retries: dt_ckpt_give_up)
     * is DT_OK with the reason in lost[n]; lost[0] = 0: written. */
    dt_status (*ckpt_save)(dt_strategy *s, const dt_train_state *ts, char *lost, size_t n);
    /* A recommender's tables held by the strategy's servers (task.h's
     * tables_remote; docs/recommender.md): rows_pull fills vals[n, dim]
     * with rows ids[n] (global numbers, sorted, distinct) as of this
     * rank's step; rows_push sends their gradients g[n, dim] of the step
     * (sent every step, n = 0 too). NULL: a strategy that holds no tables. */
    dt_status (*rows_pull)(dt_strategy *s, const int64_t *ids, size_t n, float *vals);
    dt_status (*rows_push)(dt_strategy *s, const int64_t *ids, size_t n, const float *g);
    /* Fields of its own for rank 0's summary.json (a JSON object; NULL: none). */
    void (*summary)(dt_strategy *s, struct cJSON *o);
    /* 1: every rank holds the whole state (parameters, optimizer state)
     * between steps, so a spare that takes a dead rank's place can have it
     * from any surviving replica (dt_run_ckpt_share, --spares). */
    int replicated;
    /* 1: each rank holds state between steps that no other rank has a copy
     * of (local SGD's drift since the last average, its own optimizer
     * state; ZeRO on a GPU: its slice of the optimizer state, on the
     * device alone), so after a spare took a dead rank's place every rank goes
     * back to the newest checkpoint (dt_run_ckpt_rollback), as it does for
     * a gradient codec's residuals; abandon (below) drops what the failed
     * steps left. */
    int own_state;
    /* Spares for a strategy whose ranks hold slices (not replicated): each
     * rank keeps a copy of a buddy rank's slice, so that a spare in a dead
     * rank's place can have its slice from memory (zero.c). abandon: after
     * a step failed on a peer's death, before dt_comm_rejoin: waits for the
     * strategy's transfers and drops what the interrupted step left
     * (partial sums, gathered layers), so that the step can be redone.
     * take_over: after the rejoin and dt_run_ckpt_share (which set every
     * rank's optimizer step count to the one of the state shared), a
     * collective: every rank's slice at that step, kept or from the copy
     * its buddy holds, the copies refreshed. When a slice is on no
     * surviving rank: *lost = 1 and DT_ERR_COMM naming the rank (a restart
     * from a checkpoint is the way on); another failure meanwhile: *lost =
     * 0 and the comm layer's status. NULL: spares not served, unless
     * replicated. */
    void (*abandon)(dt_strategy *s);
    dt_status (*take_over)(dt_strategy *s, int have, int *lost);
    /* After every rank rejoined in a new generation: the communicators the
     * strategy split from s->comm at init (a pipeline's), which the new
     * generation broke, split again in the same order, so that a spare's
     * init meets them (s->replicas and s->tensor_group are the task's new
     * ones by then). NULL: a strategy that splits none. */
    dt_status (*regroup)(dt_strategy *s);
    /* After the strategy is made, before anything of the model is shared:
     * what this rank keeps of it (a pipeline's stages: the cut, measured
     * through the task's stages, and the task's hold of this rank's layers,
     * which sets their parameters and takes them from the first replica).
     * joining: this rank replaces one that died; it takes what the others
     * decided (they meet it in their regroup) and sets nothing itself, its
     * state comes in take_over. NULL: the rank keeps the whole model, which
     * the loop shares from rank 0 before making the strategy. */
    dt_status (*layout)(dt_strategy *s, const dt_task_ops *tops, dt_task *task, int joining);
} dt_strategy_ops;

/* The part every strategy shares; a peer's struct begins with it. */
struct dt_strategy {
    const dt_strategy_ops *ops;
    const dt_config *c;
    dt_comm_t comm;
    int rank, world;
    float *params, *grads;
    size_t n;
    const dt_grad_range *order;
    int norder;
    const int *order_layer;
    const unsigned char *order_split;
    const dt_grad_matrix *matrices;
    int nmatrices;
    dt_obs *obs;
    dt_comm_t all;             /* every rank of the run: comm, or comm and the ranks of another role */
    dt_optim *opt;             /* over the slice [lo, hi) */
    size_t lo, hi;             /* the slice of the state this rank updates */
    int nmicro, *off, *len;    /* this step's micro-batches, from its first sample */
    int nseg, *seg_len;        /* ... or, in deterministic mode with batch norm, one micro-batch of nseg fixed
                                  shards of seg_len samples, run together (dt_model_set_segments) */
    int64_t *fixed;            /* deterministic mode: the fixed-point sums the shards' gradients go into */
    int global;                /* samples in this step's global batch */
    int loss_denom;            /* a micro-batch's loss is scaled by len / loss_denom: the global
                                  batch (set before plan), or what plan puts there (local SGD:
                                  the share, whose gradient is then the share's mean) */
    double comm_seconds, comm_exposed_seconds; /* gradient communication windows, summed over steps */
    /* Blocks that are parts of the whole model's (tensor-parallel shards,
     * nwhole > n): checkpoints hold the whole model's tensors, sharded as a
     * sliced run's are: this rank keeps [ckpt_lo, ckpt_hi) =
     * dt_shard_range(nwhole, rank, world) of the whole block and of each
     * optimizer state in ckpt_params and ckpt_states[], which the strategy
     * assembles from the parts before a save (ckpt_stage) and spreads back
     * to them after a resume (ckpt_restore). */
    size_t nwhole, ckpt_lo, ckpt_hi;
    float *ckpt_params, *ckpt_states[2];
    int ckpt_pieces;           /* ... or none of them, the checkpoints written and read a piece at a time by the
                                  strategy (ckpt_save, ckpt_restore: [checkpoint] staging, dt_memory_ckpt_pieces) */
    int ckpt_live;             /* a ZeRO rank's checkpoints written from its live slice, no snapshot: each
                                  save waits for its write (dt_run_ckpt's wait; [checkpoint] staging) */
    dt_part_fill_fn part_fill;
    dt_part_take_fn part_take;
    void *part_user;
    dt_comm_t replicas, tensor_group;  /* the task's: the ranks of this shard, the shards of one copy */
    int grads_zero;            /* the update leaves the gradient block zero: the loop skips the task's zero_grad */
    int params_sliced;         /* only params[lo, hi) is kept between steps (checkpoints hold that) */
    int tied;                  /* the order's first range is used by the first and the last layer (task.h) */
    dt_comm_t copy;            /* the ranks holding one copy of the model with this one, where ranks
                                  keep parts of it (a model-parallel replica); NULL: this rank holds it */
    int copy_first;            /* this rank's copy is the first (rank 0's: it writes the weights file) */
    int has_staleness, staleness; /* of this rank's last gradient as applied (parameter servers; obs.h) */
    int ckpt_saves;            /* checkpoints are the strategy's (ckpt_save), not the loop's writer */
    const dt_ckpt_model *ckpt_model; /* the loop's checkpoint view and directory ("" none), set before ckpt_restore */
    const char *ckpt_dir;
    int64_t start_step;        /* the loop's step at the start (resumed: the checkpoint's), set before ckpt_restore */
    int rejoined;              /* this rank replaces one that died, and goes on from rejoin_step (set by
                                  ckpt_restore; parameter servers outside mode sync) */
    int64_t rejoin_step;
    int rejoin_meet;           /* ... after the meeting that follows that step (evaluation, checkpoint, end;
                                  none if no meeting is due then), which its predecessor may have been in:
                                  the loop runs it, the strategy skips the collectives already made */
    int rejoin_done;           /* its predecessor had finished the run: nothing is left to do (ps/) */
    int failed;                /* the run failed on this rank (set before fini): it tells no peer it ended
                                  well, and the abort that follows carries its error */
    uint64_t skip_barriers;    /* ... the workers' barriers its predecessor had made past its last step,
                                  which it skips: the meetings' (ps/), then the trace's closing one */
    int rejoin_pieces;         /* [ps] share = dynamic: the servers said where it goes on: in epoch
                                  rejoin_epoch with the piece `unit`, or after the meeting at that
                                  epoch's end (unit -1: its pieces were all out); the loop clears it
                                  once that epoch starts */
    int64_t rejoin_epoch;
    int64_t skip_steps;        /* steps made without this rank, which it catches up with: the loop passes
                                  their batches over, untrained (parameter servers, mode backup: ps/) */
    int64_t units;             /* [ps] share = dynamic: the pieces of an epoch's batches (steps x workers),
                                  which the servers hand to whichever worker is free (0: every rank trains
                                  its own share of every batch); set by the loop */
    int64_t unit;              /* ... the piece this rank trains next, numbered over the run (epoch x units +
                                  batch x workers + part); -1: its epoch's are all out (set by the loop at
                                  an epoch's start, by the strategy after each step) */
    int own_pace;              /* the ranks do not wait for each other each step: the control plane is
                                  each rank's own (dt_control_local); they meet only in params_sync and
                                  collectives of the strategy's, and rank 0 evaluates alone */
    uint16_t *wire;            /* [parallel] grad_dtype = bf16: the gradients as sent (dt_strategy_wire) */
    float loss_scale;          /* fp16's dynamic loss scale: every micro-batch's loss is also scaled by it
                                  (1 otherwise); the loop divides it out of the update */
    dt_dev_blocks *device;     /* the blocks the steps use, on a device (params, grads: the host's copy) */
};

/* The strategy the config asks for (the registry in strategy.c). */
const dt_strategy_ops *dt_strategy_for(const dt_config *c);
/* Builds ops over a; the optimizer is created for the slice the strategy
 * updates. */
dt_status dt_strategy_create(dt_strategy **out, const dt_strategy_ops *ops, const dt_strategy_args *a);
void dt_strategy_free(dt_strategy *s);

static inline int dt_strategy_plan(dt_strategy *s, int first, int share, int global) {
    s->loss_denom = global;
    return s->ops->plan(s, first, share, global);
}
static inline dt_grad_ready_fn dt_strategy_grad_hook(dt_strategy *s, int k, void **user) {
    *user = NULL;
    return s->ops->grad_hook ? s->ops->grad_hook(s, k, user) : NULL;
}
static inline void dt_strategy_micro_end(dt_strategy *s, int k) {
    if (s->ops->micro_end) s->ops->micro_end(s, k);
}
static inline dt_status dt_strategy_sync(dt_strategy *s) { return s->ops->sync(s); }
static inline dt_status dt_strategy_grad_norm(dt_strategy *s, double *norm) { return s->ops->grad_norm(s, norm); }
/* Whether the step ends on the device (update_end: one rank), else in the
 * loop's order. */
static inline int dt_strategy_ends_on_device(const dt_strategy *s) {
    return s->ops->update_end && s->world == 1 && !s->own_pace;
}
static inline dt_status dt_strategy_update(dt_strategy *s, float lr, float scale) {
    return s->ops->update(s, lr, scale);
}
static inline dt_status dt_strategy_params_eval(dt_strategy *s, int begin) {
    return s->ops->params_eval ? s->ops->params_eval(s, begin) : DT_OK;
}
static inline dt_status dt_strategy_params_sync(dt_strategy *s) {
    return s->ops->params_sync ? s->ops->params_sync(s) : DT_OK;
}
static inline dt_status dt_strategy_params_host(dt_strategy *s) {
    return s->ops->params_host ? s->ops->params_host(s) : DT_OK;
}
static inline dt_status dt_strategy_ckpt_stage(dt_strategy *s) {
    return s->ops->ckpt_stage ? s->ops->ckpt_stage(s) : DT_OK;
}

/* A model whose ranks keep parts of it (the task's part_fill): this
 * rank's slice of the whole model's checkpoint (ckpt_params ...), made
 * once; or, when the strategy has a ckpt_save and the checkpoints go in
 * pieces (dt_memory_ckpt_pieces), none: ckpt_pieces and ckpt_saves set. */
dt_status dt_strategy_ckpt_slices(dt_strategy *s);
/* The checkpoint view of what this rank holds: the parameter block and
 * the optimizer state (its slice [lo, hi) of each), the step count, and
 * any state of the strategy's own (ckpt_extra). Fills those fields of m;
 * the caller fills the model's (tensors, meta). */
void dt_strategy_ckpt_view(dt_strategy *s, dt_ckpt_model *m);
/* After a resume from path (written by `parts` ranks; "" none), on every
 * rank: the strategy's own state from it. */
static inline dt_status dt_strategy_ckpt_restore(dt_strategy *s, const char *path, int parts) {
    return s->ops->ckpt_restore ? s->ops->ckpt_restore(s, path, parts) : DT_OK;
}

/* ---- building blocks the peers share ------------------------------------ */

/* grad_accum parts of the share (train.grad_accum). */
int dt_strategy_plan_accum(dt_strategy *s, int first, int share, int global);
/* Deterministic mode's micro-batches: the [parallel] micro_shards fixed
 * shards of the global batch (the same cut for any number of workers) that
 * fall inside the share; with batch norm, one micro-batch whose segments
 * they are (nseg, seg_len). */
int dt_strategy_plan_shards(dt_strategy *s, int first, int share, int global);
/* The norm of a replicated gradient block: every rank computes it alone. */
dt_status dt_strategy_norm_replicated(dt_strategy *s, double *norm);
/* acc[i] += round(g[i] x scale), clamped to +-4e18 so that a diverging run
 * cannot overflow: int64 fixed-point sums, whose addition (and so an int64
 * allreduce of them) gives the same bits in any order. */
void dt_fixed_add(int64_t *acc, const float *g, size_t n, double scale);
/* [parallel] grad_dtype = bf16: a bf16 buffer of the gradient block's n
 * elements, made on first use and kept (NULL and a recorded error when out
 * of memory). */
uint16_t *dt_strategy_wire(dt_strategy *s);
/* The whole gradient block summed over the ranks in place, timed as the
 * step's communication (nothing overlaps it): in fp32, or under grad_dtype
 * = bf16 sent as bf16 and summed in fp32 by the comm layer. `who` names
 * the strategy in an error. */
dt_status dt_strategy_sum_grads(dt_strategy *s, dt_comm_t comm, const char *who);
/* The gradient order (s->order; NULL: the block itself) cut into buckets
 * of bucket_floats, from its end towards its start (dp.c, device.c): b[0]
 * holds the END of the order (final first) and starts at position b[0].pos
 * of it; bucket i is the pieces p[b[i].first .. b[i].first + b[i].n) of the
 * block, merged where they touch. During the last micro-batch's backward a
 * bucket can be sent once the grad hook's pos is <= its pos. */
typedef struct {
    size_t lo, hi;      /* a contiguous part of the gradient block */
    dt_request_t req;   /* its collective in flight (NULL: none) */
} dt_grad_piece;
typedef struct {
    size_t pos;         /* where the bucket starts in the gradient order */
    int first, n;       /* its pieces */
} dt_grad_bucket;
typedef struct {
    int nb, np;
    dt_grad_bucket *b;
    dt_grad_piece *p;
} dt_grad_buckets;
/* Cuts s's order of s->n gradients (DT_ERR_ARG, naming `who`, where it does
 * not cover them). */
dt_status dt_grad_buckets_cut(dt_grad_buckets *g, const dt_strategy *s, size_t bucket_floats, const char *who);
void dt_grad_buckets_free(dt_grad_buckets *g);
/* ZeRO stage 3's blocks: the ranges of order o[no] (order_layer: each
 * one's layer) of block l (its layer l; l < 0: those of no layer in
 * [0, L), the embedding's and the head's) as spans of the parameter block
 * (ranges that touch are one span), from the lowest offset up, into sp
 * (pairs lo, hi; room for no + 1 pairs); their count. */
int dt_layer_spans(const dt_grad_range *o, int no, const int *order_layer, int L, int l, size_t *sp);
/* One optimizer step over [lo, hi) of the parameter block. */
dt_status dt_strategy_update_slice(dt_strategy *s, float lr, float scale);
/* The norm of a gradient block of which each rank holds only its slice
 * [lo, hi) (dt_shard_range): bitwise the value dt_sum_squares would give
 * over the whole block, for any number of ranks (its fixed blocks are
 * summed in the same order; a block cut by a slice boundary passes its
 * partial sum to the next rank). A collective: every rank calls it. */
dt_status dt_strategy_norm_sharded(dt_strategy *s, double *norm);
/* The same over comm's ranks, each holding slice = block[lo, hi) of a
 * block of n (its dt_shard_range slice over comm). */
dt_status dt_norm_sharded(const float *slice, size_t n, size_t lo, size_t hi, dt_comm_t comm, double *norm);
/* The same where the slice is not the host's (a device's): parts(user,
 * hi - lo, first, carry, part) fills the host's part[] with the slice's
 * pieces, as dt_sum_squares_parts does (the device strategies' ZeRO). */
typedef dt_status (*dt_norm_parts_fn)(void *user, size_t n, size_t first, double carry, double *part);
dt_status dt_norm_sharded_by(dt_norm_parts_fn parts, void *user, size_t n, size_t lo, size_t hi, dt_comm_t comm,
                             double *norm);
/* Deterministic mode's fixed point (core/fixed.h's rules, which the GPU
 * shares): gradients go in with dt_fixed_add(acc, g, n, DT_FIXED_SCALE)
 * and come back as g[i] = acc[i] / 2^32. Integer sums do not depend on
 * their order. */
void dt_fixed_to_float(float *g, const int64_t *acc, size_t n);
/* A pipeline's stages from the costs of its layers (engine/strategies/pipeline.c):
 * bounds[0..P] cut costs[L] into P contiguous non-empty stages (1 <= P <=
 * L), stage s = layers [bounds[s], bounds[s + 1]), the cut whose most
 * expensive stage costs least (for the same costs, always the same cut). */
dt_status dt_pipeline_balance(const double *costs, int L, int P, int *bounds);

extern const dt_strategy_ops dt_strategy_dp;               /* engine/strategies/dp.c */
extern const dt_strategy_ops dt_strategy_dp_deterministic; /* engine/strategies/dp_det.c */
extern const dt_strategy_ops dt_strategy_pipeline;         /* engine/strategies/pipeline.c */
extern const dt_strategy_ops dt_strategy_zero;             /* engine/strategies/zero.c */
extern const dt_strategy_ops dt_strategy_zero_deterministic; /* engine/strategies/zero.c */
extern const dt_strategy_ops dt_strategy_zero3;            /* engine/strategies/zero.c */
extern const dt_strategy_ops dt_strategy_local_sgd;        /* engine/strategies/localsgd.c */
extern const dt_strategy_ops dt_strategy_ps;               /* engine/strategies/ps/ */
extern const dt_strategy_ops dt_strategy_device;           /* engine/strategies/device.c */
extern const dt_strategy_ops dt_strategy_device_zero;      /* engine/strategies/device.c */

#endif
