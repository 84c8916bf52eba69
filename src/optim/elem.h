/* The optimizers' per-element rules, one definition for the CPU loops
 * (optim.c) and the GPU kernels (gpu/optim.cu): compiled by nvcc they are
 * __host__ __device__, so the CPU tests run the same arithmetic the GPU
 * does. The per-step constants (bias corrections) are computed once by the
 * caller, on the host (dt_optim_adamw_k, dt_optim_sgd_k). */
#ifndef DT_OPTIM_ELEM_H
#define DT_OPTIM_ELEM_H

#include "core/hd.h"
#include "dtrain/optim.h"

#include <math.h>

/* dt_sum_squares's blocks: each summed in order in double, then the
 * blocks' sums in order, on the CPU (optim.c) and the GPU (gpu/optim.cu),
 * so that both give the same bits for any thread count. */
#define DT_SUMSQ_BLOCK 4096

/* AdamW's step constants: torch.optim.AdamW's update with its bias
 * corrections folded in (step = lr / bc1, rbc2 = 1 / sqrt(bc2)). */
typedef struct {
    float b1, b2, eps, lr, wd, step, rbc2, grad_scale;
} dt_adamw_k;

/* SGD's: momentum mu (0: none), Nesterov, weight decay; first: the
 * momentum buffer starts as the gradient (the first step). */
typedef struct {
    float lr, mu, wd, grad_scale;
    int nesterov, first;
} dt_sgd_k;

/* Either's room (a device's copy of a step's constants). */
typedef union {
    dt_adamw_k adamw;
    dt_sgd_k sgd;
} dt_optim_k;

/* In these rules every product that feeds a sum is an explicit fmaf, and
 * no other product does: a compiler contracts a * b + c into one rounding
 * where it sees fit (gcc and nvcc each their own way), so left to them the
 * CPU's and the GPU's updates differ in their last bits. */
DT_HD void dt_adamw_elem(float *w, float g, float *m, float *v, const dt_adamw_k *k) {
    g *= k->grad_scale;
    *m = fmaf(k->b1, *m, (1.0f - k->b1) * g);
    *v = fmaf(k->b2, *v, (1.0f - k->b2) * g * g);
    float d = *w * fmaf(-k->lr, k->wd, 1.0f);
    *w = d - k->step * *m / fmaf(sqrtf(*v), k->rbc2, k->eps);
}

/* SGD without momentum, and with its momentum buffer buf. */
DT_HD void dt_sgd_plain_elem(float *w, float g, const dt_sgd_k *k) {
    g = fmaf(k->wd, *w, g * k->grad_scale);
    *w = fmaf(-k->lr, g, *w);
}

DT_HD void dt_sgd_momentum_elem(float *w, float g, float *buf, const dt_sgd_k *k) {
    g = fmaf(k->wd, *w, g * k->grad_scale);
    *buf = k->first ? g : fmaf(k->mu, *buf, g);
    g = k->nesterov ? fmaf(k->mu, *buf, g) : *buf;
    *w = fmaf(-k->lr, g, *w);
}

/* buf NULL: no momentum. */
DT_HD void dt_sgd_elem(float *w, float g, float *buf, const dt_sgd_k *k) {
    if (buf) dt_sgd_momentum_elem(w, g, buf, k);
    else dt_sgd_plain_elem(w, g, k);
}

/* dt_clip_scale's rule: the factor that brings a gradient of this norm
 * down to clip (1 when clip <= 0 or the norm is within it). */
DT_HD float dt_clip_rule(double norm, float clip) {
    if (clip <= 0.0f || !(norm > clip)) return 1.0f;
    return (float)(clip / (norm + 1e-6));
}

/* The update's gradient scale from the gradient's norm before the loss
 * scale is divided out: the clipping on the unscaled norm (*gnorm, as
 * logged), times unscale. The loop's on the host and a device's step end
 * (step_scale) alike: the same bits (no product feeds a sum). */
DT_HD float dt_step_scale(double norm, float unscale, float clip, float *gnorm) {
    *gnorm = (float)(norm * unscale);
    return dt_clip_rule(*gnorm, clip) * unscale;
}

/* The step's end on a device (dev.h's step_scale; the simulated GPU's and
 * the CUDA kernel's): vals the gradient's sum of squares and the step's
 * summed loss; guard[0] the update's scale, guard[1] 1 where the norm or the
 * loss is NaN or Inf (the update skipped), else 0. */
DT_HD void dt_step_guard(float *guard, const double *vals, float unscale, float clip) {
    double norm = sqrt(vals[0]);
    float gnorm;
    guard[0] = dt_step_scale(norm, unscale, clip, &gnorm);
    guard[1] = isfinite(norm) && isfinite(vals[1]) ? 0.0f : 1.0f;
}

/* An update's gradient scale under a guard (NULL: *grad_scale as it is):
 * 0 where the guard skips the update. */
DT_HD int dt_guard_scale(const float *guard, float *grad_scale) {
    if (!guard) return 1;
    if (guard[1] != 0.0f) return 0;
    *grad_scale = guard[0];
    return 1;
}

#ifdef __cplusplus
extern "C" {
#endif
/* The step begun (dt_optim_begin_step) was skipped after all, by a device
 * that found the gradient not finite (the device's step end): the step
 * count as before it. */
void dt_optim_unstep(dt_optim *o);
/* o's constants for its next update (after dt_optim_begin_step). */
dt_adamw_k dt_optim_adamw_k(const dt_optim *o, float lr, float grad_scale);
dt_sgd_k dt_optim_sgd_k(const dt_optim *o, float lr, float grad_scale);
/* o's kind, and whether its steps are skipped (dt_optim_set_skip): an
 * update elsewhere (a device's) follows dt_optim_update's rules. */
dt_optim_kind dt_optim_kind_of(const dt_optim *o);
int dt_optim_skipping(const dt_optim *o);
#ifdef __cplusplus
}
#endif

#endif
