/*
 * dtrain/optim.h - optimizers, learning-rate schedules, gradient clipping.
 *
 * Optimizers update a flat parameter array from a flat gradient array of the
 * same length, so the same code serves a whole model, a ZeRO shard (an offset
 * and a length) or a single tensor; a step can be taken slice by slice
 * (dt_optim_begin_step + dt_optim_update). (A bf16/fp16 run's 16-bit copy
 * of the weights is the kernels', kernels/kernels.h.) Weight decay applies to every element,
 * as PyTorch does for model.parameters() without parameter groups.
 */
#ifndef DTRAIN_OPTIM_H
#define DTRAIN_OPTIM_H

#include "dtrain/core.h"
#include "dtrain/spec.h"

#ifdef __cplusplus
extern "C" {
#endif


typedef struct dt_optim dt_optim;

/* An optimizer for n parameters; allocates its state (momentum, or Adam's
 * m and v), zeroed. Free with dt_optim_free(). */
DT_API dt_status dt_optim_create(dt_optim **out, const dt_optim_params *p, size_t n);
/* The same with the state in a file-backed mapping in state_dir
 * (dt_state_alloc; NULL: in memory). state_dir must outlive the optimizer. */
DT_API dt_status dt_optim_create_at(dt_optim **out, const dt_optim_params *p, size_t n, const char *state_dir);
DT_API void dt_optim_free(dt_optim *o);

/* One update of params[n] from grads[n] with learning rate lr; each gradient
 * is multiplied by grad_scale first (1 normally; the clipping factor from
 * dt_clip_scale; 1/world for an un-averaged sum). The same as
 * dt_optim_begin_step followed by dt_optim_update over the whole state. */
DT_API void dt_optim_step(dt_optim *o, float *params, const float *grads, float lr,
                          float grad_scale);

/* A step in parts, for state that is updated slice by slice (a sharded
 * strategy's slice, or one tensor at a time): dt_optim_begin_step advances
 * the step count once, then each dt_optim_update updates the elements
 * [off, off + len) of the optimizer's n: params[len] and grads[len] are
 * that slice's values (params[0] is element off). Slices of one step must
 * not overlap; the result is bitwise that of dt_optim_step. */
DT_API void dt_optim_begin_step(dt_optim *o);
DT_API void dt_optim_update(dt_optim *o, size_t off, size_t len, float *params,
                            const float *grads, float lr, float grad_scale);

/* skip = 1: the steps from now on are skipped (an fp16 step whose
 * gradients overflowed): dt_optim_begin_step does not count them and
 * dt_optim_update changes neither the parameters nor the state, as
 * torch's GradScaler skips optimizer.step(). skip = 0 (the default): they
 * are taken. */
DT_API void dt_optim_set_skip(dt_optim *o, int skip);

/* Elements the updates leave alone, parameters and state: ranges[2i] is
 * the offset (in the optimizer's n) of a range of ranges[2i + 1] elements,
 * in increasing order (parts past n are dropped). For state that lives in
 * the parameter block without being trained by its gradient: batch norm's
 * running statistics (nn.h dt_model_buffer_ranges). n = 0: none. */
DT_API dt_status dt_optim_set_frozen(dt_optim *o, const size_t *ranges, int n);

/* Optimizer state for checkpoints: the number of steps taken and up to two
 * state arrays of n floats (SGD: momentum buffer; AdamW: m, v). */
DT_API int64_t *dt_optim_step_count(dt_optim *o);
DT_API int dt_optim_num_states(const dt_optim *o);
/* The same for an optimizer of p, before one is made. */
DT_API int dt_optim_params_states(const dt_optim_params *p);
DT_API float *dt_optim_state(dt_optim *o, int i);

/* Row-wise AdaGrad on n rows of an embedding table (the recommender's,
 * docs/recommender.md): for each i, row r = rows[i] of table[., dim] and
 * its gradient g[i, dim]: acc[r] += mean_k g[i,k]^2, then row r -= lr g[i]
 * / (sqrt(acc[r]) + eps). acc NULL: plain SGD (row r -= lr g[i]). A row
 * with a zero gradient is left as it was, so applying it to the rows a
 * batch touched is applying it to the whole table. */
DT_API void dt_adagrad_rows(float *table, float *acc, const int64_t *rows, const float *g, size_t n, int dim,
                            float lr, float eps);

/* Sum of squares of g[n], accumulated in double: the sums of fixed blocks of
 * 4096 elements (each in order, as dt_sum_squares_blocks), added in order,
 * so the result does not depend on the thread count. */
DT_API double dt_sum_squares(const float *g, size_t n);
/* out[b] = the sum of squares of g[4096 b, 4096 (b + 1)) for b < nblocks,
 * each accumulated in double in element order (dt_sum_squares's blocks,
 * bitwise); several blocks run side by side, so a thread is not bound by
 * the latency of one addition after another. */
DT_API void dt_sum_squares_blocks(const float *g, size_t nblocks, double *out);
/* The sums of squares of a slice x[n] of a larger block, x[0] lying
 * `first` elements into one of dt_sum_squares's blocks of 4096: part[k]
 * for each piece of x that one block holds, in order (the first piece,
 * when first > 0, starts from `carry`, the rest from 0), each in element
 * order: the pieces of dt_sum_squares's blocks, bitwise. Returns the
 * number of pieces, (first + n + 4095) / 4096 (0 when n = 0). */
DT_API size_t dt_sum_squares_parts(const float *x, size_t n, size_t first, double carry, double *part);

/* n zeroed floats of optimizer state: dt_alloc'd when dir is NULL, else a
 * shared mapping of a file created in dir and unlinked at once (the kernel
 * pages it to and from the disk as the state is used, in sequential
 * read-ahead), its blocks reserved up front, so a full disk is an error
 * here (DT_ERR_IO naming dir and the bytes) and never later. NULL and a
 * recorded error on failure. Free with dt_state_free(p, n, dir). */
DT_API float *dt_state_alloc(size_t n, const char *dir);
DT_API void dt_state_free(float *p, size_t n, const char *dir);
/* Moves the whole memory pages inside p[0, n) (memory of the caller's) to a
 * shared mapping of a new unlinked file in dir, at the same addresses and
 * with the same contents, so the kernel can write them to disk and drop
 * them under memory pressure (ZeRO stage 3's parameter slice). Returns the
 * bytes moved (0 when no whole page lies inside), or SIZE_MAX with a
 * recorded error naming dir (the memory unchanged). dt_state_unback(p, n)
 * gives the same pages back to anonymous memory, contents kept; call it
 * before the memory is freed. */
DT_API size_t dt_state_back(float *p, size_t n, const char *dir);
DT_API void dt_state_unback(float *p, size_t n);
/* The factor that brings a gradient of global norm `norm` down to
 * `clip_norm` (1 if it is already within, or clip_norm <= 0). */
DT_API float dt_clip_scale(double norm, float clip_norm);

/* ---- dynamic loss scaling (fp16) ------------------------------------------ */

/* torch.cuda.amp.GradScaler's rule: the loss is multiplied by `scale`
 * before backward, so that small gradients survive fp16; the gradients are
 * divided by it before the update. A step whose gradients hold an inf or a
 * NaN anywhere (on any rank: the caller agrees on it) is skipped and the
 * scale halves; after growth_interval clean steps in a row it doubles. */
typedef struct {
    float scale;           /* initial 65536 (2^16) */
    float growth, backoff; /* 2 and 0.5 */
    int growth_interval;   /* 2000 */
    int clean;             /* clean steps since the scale last changed */
    int64_t skipped;       /* steps skipped so far */
} dt_loss_scaler;

DT_API dt_loss_scaler dt_loss_scaler_default(void);
/* After a step: overflow says whether its gradients held an inf or a NaN.
 * Returns 1 when the step is to be taken (the gradients divided by the
 * scale it had before this call), 0 when it is skipped. */
DT_API int dt_loss_scaler_update(dt_loss_scaler *s, int overflow);

/* ---- learning-rate schedules ---------------------------------------------- */


typedef struct {
    dt_sched_kind kind;
    float lr;              /* peak learning rate */
    float min_lr;          /* reached at total_steps (cosine, linear) */
    int64_t warmup_steps;  /* linear ramp from lr/warmup_steps up to lr */
    int64_t total_steps;
} dt_schedule;

/* Learning rate for step `step` (0-based). */
DT_API float dt_schedule_lr(const dt_schedule *s, int64_t step);

#ifdef __cplusplus
}
#endif
#endif
