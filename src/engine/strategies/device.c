/* One worker on a device, the "device" strategy (strategy.h; docs/gpu.md):
 * taken for [train] device = cuda|cuda:N, whose other strategies and
 * more than one worker are refused (engine/device.c, check below).
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
#include "engine/strategies/strategy.h"
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
} devs;

static int dev_wants(const dt_config *c) { return dt_device_index(c->device) >= 0; }

static dt_status dev_check(const dt_config *c, int W) {
    if (W > 1)
        return dt_error(DT_ERR_CONFIG, "[train] device = %s with %d workers: training on a GPU is one worker in this "
                        "dtrain (several workers on GPUs are not in it yet; docs/gpu.md)", c->device, W);
    return DT_OK;
}

static int dev_max_micro(const dt_config *c, int W) {
    (void)W;
    return (c->batch + c->grad_accum - 1) / c->grad_accum;
}

static void states(dt_strategy *s, float *st[2]) {
    for (int j = 0; j < 2; j++) st[j] = j < dt_optim_num_states(s->opt) ? dt_optim_state(s->opt, j) : NULL;
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
    dt_log(DT_LOG_INFO, "GPU memory (%s device): %.1f MiB in one arena = weights %.1f + gradients %.1f + optimizer "
           "state %.1f + activations %.1f + workspace %.1f MiB; batches through %.1f MiB of pinned host memory",
           b->d->name, (double)b->arena.size / 1048576.0, k[0] / 1048576.0, k[1] / 1048576.0, k[2] / 1048576.0,
           k[3] / 1048576.0, k[4] / 1048576.0, (double)b->pinned_bytes / 1048576.0);
    return DT_OK;
}

static int dev_plan(dt_strategy *s, int first, int share, int global) {
    ((devs *)s)->have_sumsq = 0;
    return dt_strategy_plan_accum(s, first, share, global);
}

static dt_status dev_sync(dt_strategy *s) { return (void)s, DT_OK; }

static dt_status dev_nonfinite(dt_strategy *s, int *nonfinite) {
    devs *d = (devs *)s;
    dt_status st = dt_dev_blocks_sumsq(s->device, &d->sumsq);
    d->have_sumsq = st == DT_OK;
    *nonfinite = st == DT_OK && !isfinite(d->sumsq);
    return st;
}

static dt_status dev_norm(dt_strategy *s, double *norm) {
    devs *d = (devs *)s;
    dt_status st = d->have_sumsq ? DT_OK : dev_nonfinite(s, &(int){0});
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
    cJSON_AddBoolToObject(g, "tf32", s->c->tf32 && !strcmp(b->d->name, "cuda"));
    cJSON_AddNumberToObject(g, "arena_bytes", (double)b->arena.size);
    for (int i = 0; i < DT_DEV_KINDS; i++) {
        char key[64];
        snprintf(key, sizeof key, "%s_bytes", dt_dev_kind_names[i]);
        cJSON_AddNumberToObject(g, key, (double)k[i]);
    }
    cJSON_AddNumberToObject(g, "pinned_host_bytes", (double)b->pinned_bytes);
}

const dt_strategy_ops dt_strategy_device = {
    .name = "device",
    .size = sizeof(devs),
    .wants = dev_wants,
    .check = dev_check,
    .max_micro = dev_max_micro,
    .init = dev_init,
    .plan = dev_plan,
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
