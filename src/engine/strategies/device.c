/* Data parallel on devices, the "device" strategy (strategy.h; docs/gpu.md):
 * taken for [train] device = cuda|cuda:N, whose other strategies are
 * refused (engine/device.c). Plain data parallel, or deterministic
 * ([parallel] deterministic = true): each shard's gradient goes into int64
 * fixed-point sums on the device (the seam's fixed_add, dp_det.c's rules),
 * so the result is the same bits for any number of ranks.
 *
 * With several ranks the gradients (or the fixed-point sums) are summed in
 * buckets of [parallel] bucket_kb by the GPUs' communicator
 * (comm/device.h): NCCL where every rank has a GPU of its own and NCCL is
 * found, else staged through pinned host memory and the host's
 * communicator; which one, and why, is logged. The buckets are summed
 * after backward, one after the other (nothing overlaps backward yet).
 *
 * The task's steps run on the device's blocks (dt_dev_blocks: parameters,
 * gradients, the optimizer's state, in the CPU's layout); the gradient's
 * sum of squares is made there and read back once a step (one double,
 * beside the loss the forward reads): the NaN/Inf check and the global norm
 * come from it, the clipping scale goes into the update, which runs there
 * too, the step's constants from the host's optimizer (its step count).
 * The host's blocks (s->params, the optimizer's state) are the copy that
 * evaluations, checkpoints and the weights file read: params_sync and
 * params_eval bring them up to date, ckpt_restore puts them (the fresh
 * start's, or a checkpoint's) onto the device. */
#include "comm/device.h"
#include "engine/device.h"
#include "engine/strategies/strategy.h"
#include "engine/worker.h"
#include "gpu/dev_model.h"
#include "gpu/gpu.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

typedef struct {
    dt_strategy base;
    double sumsq;  // this step's, from grads_nonfinite
    int have_sumsq;
    dt_comm_t gpus;     // the GPUs' communicator (several ranks)
    int64_t *acc;       // deterministic mode's fixed-point sums, on the device
    dt_status err;      // a micro-batch's fixed-point sum that failed (micro_end cannot say)
    char errmsg[512];
} devs;

static int dev_wants(const dt_config *c) { return dt_device_index(c->device) >= 0; }

static dt_status dev_check(const dt_config *c, int W) {
    return c->deterministic ? dt_strategy_dp_deterministic.check(c, W) : dt_strategy_dp.check(c, W);
}

static int dev_max_micro(const dt_config *c, int W) {
    return c->deterministic ? dt_strategy_dp_deterministic.max_micro(c, W) : dt_strategy_dp.max_micro(c, W);
}

static void states(dt_strategy *s, float *st[2]) {
    for (int j = 0; j < 2; j++) st[j] = j < dt_optim_num_states(s->opt) ? dt_optim_state(s->opt, j) : NULL;
}

// The GPUs' communicator over the ranks (a collective), and the log's line
// on how the gradients travel.
static dt_status open_gpus(dt_strategy *s) {
    devs *d = (devs *)s;
    int index;
    char shared[128], why[1024];
    dt_status st = dt_train_device_for(s->c, s->comm, &index, shared, sizeof shared);
    if (st != DT_OK) return st;
    dt_comm_device_params p = {s->device->d, index, shared[0] ? shared : NULL};
    if ((st = dt_comm_init_device(s->comm, &p, &d->gpus, why, sizeof why)) != DT_OK) return st;
    if (s->rank == 0 && !strcmp(dt_comm_backend(d->gpus), "staging"))
        dt_log(DT_LOG_INFO, "gradients staged through host memory (%s)", why);
    else if (s->rank == 0)
        dt_log(DT_LOG_INFO, "gradients summed on the GPUs by %s", why);
    return DT_OK;
}

static dt_status dev_init(dt_strategy *s) {
    dt_dev_blocks *b = s->device;
    if (!b) return dt_error(DT_ERR_CONFIG, "[train] device = %s: this model has no device step", s->c->device);
    if (b->n != s->n) return dt_error(DT_ERR_INTERNAL, "device blocks of %zu floats, the model's %zu", b->n, s->n);
    size_t k[DT_DEV_KINDS];
    dt_dev_blocks_kinds(b, k);
    dt_gpu_set_tf32(s->c->tf32);  // (the CUDA GEMM's; the simulated GPU's is the CPU's fp32)
    double g[DT_DEV_KINDS];
    for (int i = 0; i < DT_DEV_KINDS; i++) g[i] = (double)k[i];
    dt_obs_set_gpu_memory(s->obs, g);
    char half[160] = "";
    if (b->t != DT_F32)
        snprintf(half, sizeof half, "; GEMMs on %s operands with fp32 sums (the weights hold the parameters' %s copy, "
                 "%.1f MiB)", b->t == DT_BF16 ? "bf16" : "fp16", b->t == DT_BF16 ? "bf16" : "fp16",
                 (double)b->n * 2 / 1048576.0);
    if (s->rank == 0)
        dt_log(DT_LOG_INFO, "GPU memory (%s device): %.1f MiB in one arena = weights %.1f + gradients %.1f + optimizer "
               "state %.1f + activations %.1f + workspace %.1f MiB; batches through %.1f MiB of pinned host memory%s",
               b->d->name, (double)b->arena.size / 1048576.0, k[0] / 1048576.0, k[1] / 1048576.0, k[2] / 1048576.0,
               k[3] / 1048576.0, k[4] / 1048576.0, (double)b->pinned_bytes / 1048576.0, half);
    devs *d = (devs *)s;
    dt_status st = DT_OK;
    if (s->c->deterministic) {  // (outside the arena: the strategy's, 8 bytes a parameter)
        DT_TRY(b->d->alloc((void **)&d->acc, sizeof(int64_t) * (s->n ? s->n : 1)), done);
        DT_TRY(b->d->memset0(d->acc, sizeof(int64_t) * s->n), done);
    }
    if (s->world > 1) st = open_gpus(s);
done:
    return st;
}

static void dev_fini(dt_strategy *s) {
    devs *d = (devs *)s;
    dt_comm_destroy(d->gpus);
    if (d->acc) s->device->d->free(d->acc);
}

static int dev_plan(dt_strategy *s, int first, int share, int global) {
    ((devs *)s)->have_sumsq = 0;
    if (s->c->deterministic) return dt_strategy_plan_shards(s, first, share, global);
    return dt_strategy_plan_accum(s, first, share, global);
}

// Deterministic mode: each shard's gradient into the fixed-point sums, and
// the gradient block zero again for the next.
static void dev_micro_end(dt_strategy *s, int k) {
    (void)k;
    devs *d = (devs *)s;
    const dt_dev *dv = s->device->d;
    if (!s->c->deterministic || d->err != DT_OK) return;
    dt_status st = dv->fixed_add(d->acc, s->device->grads, s->n);
    if (st == DT_OK) st = dv->memset0(s->device->grads, sizeof(float) * s->n);
    if (st != DT_OK) {
        d->err = st;
        snprintf(d->errmsg, sizeof d->errmsg, "deterministic mode's sums on the device: %s", dt_last_error());
    }
}

// The block summed over the ranks in buckets of [parallel] bucket_kb.
static dt_status sum_buckets(devs *d, void *block, size_t n, dt_dtype t) {
    size_t es = dt_dtype_size(t), per = (size_t)d->base.c->bucket_kb * 1024 / es;
    if (per == 0) per = 1;
    for (size_t lo = 0; lo < n; lo += per) {
        size_t len = n - lo < per ? n - lo : per;
        dt_status st = dt_allreduce((char *)block + lo * es, (char *)block + lo * es, len, t, DT_SUM, d->gpus);
        if (st != DT_OK) return dt_error(st, "gradient allreduce on the GPUs: %s", dt_last_error());
    }
    return DT_OK;
}

static dt_status dev_sync(dt_strategy *s) {
    devs *d = (devs *)s;
    dt_dev_blocks *b = s->device;
    if (d->err != DT_OK) {
        dt_status e = d->err;
        d->err = DT_OK;
        return dt_error(e, "%s", d->errmsg);
    }
    double t0 = dt_now();
    dt_status st = DT_OK;
    if (s->c->deterministic) {
        if (s->world > 1) st = sum_buckets(d, d->acc, s->n, DT_I64);
        if (st == DT_OK) st = b->d->fixed_to_float(b->grads, d->acc, s->n);
        if (st == DT_OK) st = b->d->memset0(d->acc, sizeof(int64_t) * s->n);
    } else if (s->world > 1) {
        st = sum_buckets(d, b->grads, s->n, DT_F32);
    }
    if (s->world > 1) {  // all of it exposed: nothing overlaps backward
        s->comm_seconds += dt_now() - t0;
        s->comm_exposed_seconds += dt_now() - t0;
    }
    return st;
}

// The gradient's sum of squares, made on the device and read once a step:
// the NaN/Inf check (fp16's loss scaler skips the step and halves its
// scale on it), the norm and the clipping come from it.
// DTRAIN_FAULT_OVERFLOW=RANK:STEP puts an inf among the gradients first.
static dt_status dev_nonfinite(dt_strategy *s, int64_t step, int *nonfinite) {
    devs *d = (devs *)s;
    dt_dev_blocks *b = s->device;
    static const float inf = INFINITY;
    dt_status st = b->n && dt_fault_overflow(s->rank, step) ? b->d->to_device(b->grads, &inf, sizeof inf) : DT_OK;
    if (st == DT_OK) st = dt_dev_blocks_sumsq(b, &d->sumsq);
    d->have_sumsq = st == DT_OK;
    *nonfinite = st == DT_OK && !isfinite(d->sumsq);
    return st;
}

static dt_status dev_norm(dt_strategy *s, double *norm) {
    devs *d = (devs *)s;
    dt_status st = d->have_sumsq ? DT_OK : dev_nonfinite(s, 0, &(int){0});
    *norm = sqrt(d->sumsq);
    return st;
}

static dt_status dev_update(dt_strategy *s, float lr, float scale) {
    dt_optim_begin_step(s->opt);
    return dt_dev_blocks_update(s->device, s->opt, lr, scale);
}

// The host's copy: the parameters before an evaluation, with the
// optimizer's state before a checkpoint and the weights file.
static dt_status dev_params_eval(dt_strategy *s, int begin) {
    return begin ? dt_dev_blocks_get(s->device, s->params, NULL) : DT_OK;
}

static dt_status dev_params_sync(dt_strategy *s) {
    float *st[2];
    states(s, st);
    return dt_dev_blocks_get(s->device, s->params, st);
}

// After the start or a resume: the host's blocks (initial, or read from
// the checkpoint) onto the device.
static dt_status dev_restore(dt_strategy *s, const char *path, int parts) {
    (void)path, (void)parts;
    float *st[2];
    states(s, st);
    return dt_dev_blocks_put(s->device, s->params, st);
}

static void dev_summary(dt_strategy *s, cJSON *o) {
    dt_dev_blocks *b = s->device;
    size_t k[DT_DEV_KINDS];
    dt_dev_blocks_kinds(b, k);
    char what[300] = "";
    int idx = dt_device_index(s->c->device);
    b->d->describe(idx, what, sizeof what);
    cJSON *g = cJSON_AddObjectToObject(o, "gpu");
    cJSON_AddStringToObject(g, "device", s->c->device);
    cJSON_AddStringToObject(g, "implementation", b->d->name);
    cJSON_AddStringToObject(g, "name", what);
    cJSON_AddBoolToObject(g, "tf32", s->c->tf32 && !strcmp(b->d->name, "cuda") && b->t == DT_F32);
    cJSON_AddStringToObject(g, "gemm_operands", b->t == DT_BF16 ? "bf16" : b->t == DT_F16 ? "fp16" : "fp32");
    cJSON_AddNumberToObject(g, "arena_bytes", (double)b->arena.size);
    for (int i = 0; i < DT_DEV_KINDS; i++) {
        char key[64];
        snprintf(key, sizeof key, "%s_bytes", dt_dev_kind_names[i]);
        cJSON_AddNumberToObject(g, key, (double)k[i]);
    }
    cJSON_AddNumberToObject(g, "pinned_host_bytes", (double)b->pinned_bytes);
    devs *d = (devs *)s;
    cJSON_AddStringToObject(g, "collectives", d->gpus ? dt_comm_backend(d->gpus) : "none");
}

const dt_strategy_ops dt_strategy_device = {
    .name = "device",
    .size = sizeof(devs),
    .wants = dev_wants,
    .check = dev_check,
    .max_micro = dev_max_micro,
    .init = dev_init,
    .fini = dev_fini,
    .plan = dev_plan,
    .micro_end = dev_micro_end,
    .sync = dev_sync,
    .grad_norm = dev_norm,
    .grads_nonfinite = dev_nonfinite,
    .update = dev_update,
    .params_eval = dev_params_eval,
    .params_sync = dev_params_sync,
    .ckpt_restore = dev_restore,
    .summary = dev_summary,
    .replicated = 1,
};
