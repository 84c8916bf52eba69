/* Checkpoints inside a training loop: resume at the start, save every K
 * steps / T seconds / at the end from a snapshot on a background thread,
 * and stop at a step boundary when asked (elastic resizing, preemption).
 *
 * The state is what the strategy says this rank holds (dt_ckpt_model's
 * slices, dt_strategy_ckpt_view). Replicated, rank 0 alone reads and writes
 * checkpoint files (or, [checkpoint] sharded, every rank writes its
 * dt_shard_range slice), and on resume rank 0 broadcasts what it loaded.
 * Sharded by the strategy, every rank writes its slice, and on resume rank
 * 0 chooses the checkpoint and every rank reads its own slice of it. Either
 * way a checkpoint does not depend on the number of workers, and a run
 * resumes on any number (docs/checkpoints.md). */
#ifndef DT_ENGINE_CHECKPOINTS_H
#define DT_ENGINE_CHECKPOINTS_H

#include "dtrain/ckpt.h"
#include "dtrain/comm.h"
#include "dtrain/config.h"
#include "obs/obs.h"

typedef struct dt_run_ckpt {
    const dt_config *c;
    dt_comm_t comm;
    dt_ckpt_model model;
    dt_ckpt_writer *writer;   /* rank 0 with a run dir and checkpoints on */
    char *config_text;
    char dir[4096];           /* RUN_DIR/checkpoints, "" without a run dir */
    double last_time;         /* of the last save (or the start) */
    int64_t last_step;
    dt_obs *obs;              /* saves are DT_OBS_CHECKPOINT spans (may be NULL) */
    int rank, world;          /* world > 1: sharded checkpoints */
    char from[4200];          /* the checkpoint resumed, "" none (the same on every rank) */
    int from_parts;           /* the ranks that wrote it (dt_ckpt_open_part) */
    dt_status (*save)(void *user, const dt_train_state *s, char *lost, size_t n);  /* dt_run_ckpt_set_saver */
    char lost[1024];          /* the saver's last checkpoint, given up: why ("": written) */
    void *save_user;
    int wait;                 /* each save waited for: the model's buffers are the live state, no snapshot
                                 (a ZeRO rank's slice under [checkpoint] staging = pieces) */
    int64_t state_opt;        /* the optimizer's step count when the loop's state was last set (the
                                 loop sets it with its state; a sharded strategy's slices must be
                                 taken back to it after a failure: dt_run_ckpt_share) */
} dt_run_ckpt;

/* Saves are made by save(user, s, lost, n) on every rank (a strategy whose
 * own ranks write the files: parameter servers outside mode sync, a model
 * in parts written a piece at a time) instead of this rank's writer,
 * which goes. A checkpoint save gave up (object storage: dt_ckpt_give_up)
 * returns DT_OK with the reason in lost; the run goes on, and ends with
 * an error when its last checkpoint was given up, as the writer's do. */
void dt_run_ckpt_set_saver(dt_run_ckpt *r, dt_status (*save)(void *user, const dt_train_state *s, char *lost, size_t n),
                           void *user);

/* Sets up checkpoints for a loop whose state m describes (m.config is
 * filled in here). run_dir is the run directory on every rank (NULL: no
 * checkpoints); rank 0 alone writes checkpoint files, unless
 * [checkpoint] sharded or the ranks hold slices or state of their own
 * (m.extra), where every rank writes its shard. When c->resume is
 * set, loads the checkpoint it names ("auto": the newest valid one of
 * RUN_DIR/checkpoints; none there: a fresh start) into m's buffers and *s on
 * every rank, and names it in r->from for the state that m.extra
 * saves (dt_strategy_ckpt_restore); otherwise *s is a fresh start (step 0,
 * s->rng as given). */
dt_status dt_run_ckpt_begin(dt_run_ckpt *r, const dt_config *c, const char *run_dir, dt_comm_t comm,
                            const dt_ckpt_model *m, dt_train_state *s);
/* After a spare took a dead rank's place and every rank rejoined
 * (dt_comm_rejoin): the replica that got furthest (the highest s->step
 * among the ranks with have = 1; the lowest such rank) gives every rank its
 * training state, parameters, optimizer state and checkpoint schedule
 * (r->last_step); *from = that rank. A collective. When the ranks hold
 * slices (ZeRO), the blocks are not sent: every rank's optimizer step
 * count becomes that rank's r->state_opt, and the strategy's take_over
 * brings every slice to it. A rank's own state (m.extra) cannot be had
 * from another rank: DT_ERR_INTERNAL. A rank that joined (have = 0) starts
 * its checkpoint writer here, once the survivors' writes in flight are
 * over; on rank 0 a sharded checkpoint in flight whose shard is missing is
 * given up (dt_ckpt_writer_abandon). */
dt_status dt_run_ckpt_share(dt_run_ckpt *r, dt_train_state *s, int have, int *from);
/* After a spare took a dead rank's place and every rank rejoined, for a
 * strategy whose ranks hold state that no other rank has a copy of (m.extra:
 * a gradient codec's residuals; local SGD's drift and optimizer state):
 * every rank goes back to the newest complete checkpoint in r->dir, where
 * every rank's state was last saved. The writes in flight end first (one
 * missing a shard is given up); rank 0 finds it and shares it as a resume
 * does (the training state, the path in r->from for the strategy's restore
 * of each rank's own part, the replicated blocks); the steps since are
 * then redone. A rank that joined (have = 0) starts its writer. Where no
 * rank has begun a step (begun: this one has; a death in the start or in
 * the checkpoint of step 0) and there is none, every rank goes on from the
 * start's state: the training state and the replicated blocks of the
 * lowest rank that has one (r->from empty: the strategy's restore makes a
 * fresh start). A collective; DT_ERR_IO on rank 0 when there is no
 * checkpoint and some rank has begun a step. */
dt_status dt_run_ckpt_rollback(dt_run_ckpt *r, dt_train_state *s, int have, int begun);
/* Rank 0's vote for a save by time (T seconds since the last one): the
 * control plane sums the votes (engine/control.h), so that all ranks save at
 * the same step. */
int dt_run_ckpt_vote(const dt_run_ckpt *r);
/* After every step: saves when K steps have passed since the last save,
 * when the votes say so (`timed`), at the end of the run (`end`), and
 * always when the run stops on request (`stop`: even with checkpoints off,
 * the state must survive). Set r->obs after dt_run_ckpt_begin to
 * time the saves. */
dt_status dt_run_ckpt_step(dt_run_ckpt *r, const dt_train_state *s, int end, int stop, int timed);
/* Whether dt_run_ckpt_step saves at step `step` with these flags (the same
 * answer on every rank): for a strategy whose ranks' parameters must be
 * made equal first (dt_strategy_params_sync). */
static inline int dt_run_ckpt_due(const dt_run_ckpt *r, int64_t step, int end, int stop, int timed) {
    int due = end || stop || timed || (r->c->ckpt_every_steps > 0 && step - r->last_step >= r->c->ckpt_every_steps);
    return due && step != r->last_step;
}
/* Waits for the last write and frees everything. Returns the first write
 * error (st when st is already an error). */
dt_status dt_run_ckpt_end(dt_run_ckpt *r, dt_status st);

/* A weights file of the whole model written from what the ranks of comm
 * hold, a piece at a time, so that no rank ever holds the whole block:
 * tensors[n] (whole shapes, their data unread) lie in the whole model's
 * block at their offsets; for each piece [lo, hi) of a tensor,
 * fill(user, lo, hi, buf) puts the elements this rank holds into
 * buf[0, hi - lo), and the pieces are summed onto rank 0 of comm with every
 * other element -0.0 (adding -0.0 changes no value, not even a zero's sign:
 * each element must be filled by exactly one rank), which appends them to
 * `path` (read on rank 0 alone; written atomically). comm NULL: this rank
 * holds everything and writes alone. A collective: every rank of comm calls
 * it; a failed write on rank 0 still takes part in every sum and returns its
 * error at the end. Each rank holds two pieces of at most 16 MiB. */
typedef void (*dt_weights_fill_fn)(void *user, size_t lo, size_t hi, float *buf);
dt_status dt_run_weights_write(const char *path, const dt_tensor_info *tensors, int n, const dt_st_meta *meta,
                               int nmeta, dt_comm_t comm, dt_weights_fill_fn fill, void *user);

#endif
