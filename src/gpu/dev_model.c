/* What every device model keeps (dev_model.h), and the sequential model of
 * dense layers on the device: nn/model.c's forward and backward, kernel for
 * kernel, on the same blocks. */
#include "gpu/dev_model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define TRY(call)                                                                                                  \
    do {                                                                                                           \
        dt_status st_ = (call);                                                                                    \
        if (st_ != DT_OK) return st_;                                                                              \
    } while (0)

dt_dev_blocks dt_dev_blocks_of(const dt_dev *d, dt_dtype t, size_t n, int nstates, dt_dev_part part) {
    size_t lo = 0, hi = 0;
    if (!part.held) dt_shard_range(n, part.shard, part.shards, &lo, &hi);
    return (dt_dev_blocks){.d = d, .arena = {.d = d}, .grads_vm = part.grads_vm || part.held,
                           .params_vm = part.params_vm || part.held, .held = part.held, .t = t, .n = n,
                           .nstates = nstates, .slo = lo, .sn = hi - lo};
}

void dt_dev_blocks_take(dt_dev_blocks *b, int rows) {
    dt_dev_arena *a = &b->arena;
    size_t n = b->n * sizeof(float);
    b->params = b->params_vm ? (float *)b->pvm.base : dt_dev_take(a, DT_DEV_WEIGHTS, n);
    b->w16 = b->t == DT_F32 ? NULL : b->params_vm ? b->hvm.base : dt_dev_take(a, DT_DEV_WEIGHTS, b->n * 2);
    b->grads = b->grads_vm ? (float *)b->gvm.base : dt_dev_take(a, DT_DEV_GRADS, n);
    for (int j = 0; j < 2; j++)  // (the slice's: sn floats; held: n backed on demand)
        b->state[j] = j >= b->nstates ? NULL
                      : b->held       ? (float *)b->svm[j].base
                                      : dt_dev_take(a, DT_DEV_OPTIM, b->sn * sizeof(float));
    b->loss = dt_dev_take(a, DT_DEV_WORK, sizeof(float));
    b->sumsq = dt_dev_take(a, DT_DEV_WORK, 2 * sizeof(double));
    b->guard = dt_dev_take(a, DT_DEV_WORK, 2 * sizeof(float));
    b->k = dt_dev_take(a, DT_DEV_WORK, sizeof(dt_optim_k));
    b->row_loss = dt_dev_take(a, DT_DEV_WORK, sizeof(double) * (size_t)(rows > 0 ? rows : 1));
    dt_dev_ask_scratch(a, DT_ASK_SUMSQ, b->n, 0, NULL);  // (the norm's, over the block or a part of it)
}

size_t dt_dev_blocks_kept(const dt_dev_blocks *b, const dt_dev_vm *v, size_t es) {
    size_t gran = v->gran;
    return gran ? (b->sn * es + gran - 1) / gran * gran + 2 * gran : 0;
}

// The blocks backed on demand reserved (params_vm: the slice's chunks of
// the parameters backed), their slices' chunks within the GPU's room
// beside the arena.
static dt_status vm_open(dt_dev_blocks *b, const char *what) {
    size_t free_b = 0, total = 0, need = 0, f = sizeof(float);
    if (b->grads_vm) TRY(dt_dev_vm_open(&b->gvm, b->d, b->n * f, "gradients", what));
    if (b->params_vm) TRY(dt_dev_vm_open(&b->pvm, b->d, b->n * f, "parameters", what));
    if (b->params_vm && b->t != DT_F32)
        TRY(dt_dev_vm_open(&b->hvm, b->d, b->n * 2, "the parameters' 16-bit copy", what));
    for (int j = 0; b->held && j < b->nstates; j++)
        TRY(dt_dev_vm_open(&b->svm[j], b->d, b->n * f, "the optimizer's state", what));
    need = dt_dev_blocks_kept(b, &b->gvm, f) + dt_dev_blocks_kept(b, &b->pvm, f) + dt_dev_blocks_kept(b, &b->hvm, 2);
    TRY(b->d->mem_info(&free_b, &total));
    if (need > free_b)
        return dt_error(DT_ERR_NOMEM, "%s: this rank's slices of the gradients%s need %zu bytes of GPU memory beside "
                        "the arena, and the GPU has %zu free of %zu: use a smaller model or more ranks", what,
                        b->params_vm ? " and the parameters" : "", need, free_b, total);
    if (b->params_vm) TRY(dt_dev_vm_back(&b->pvm, b->slo * f, b->sn * f));
    return b->hvm.base ? dt_dev_vm_back(&b->hvm, b->slo * 2, b->sn * 2) : DT_OK;
}

dt_status dt_dev_blocks_open(dt_dev_blocks *b, size_t slot_bytes, const char *what) {
    TRY(dt_dev_arena_open(&b->arena, what));
    if (b->grads_vm || b->params_vm) TRY(vm_open(b, what));
    b->pinned_bytes = 2 * slot_bytes + sizeof(dt_optim_k);
    for (int k = 0; k < 2; k++) TRY(b->d->host_alloc(&b->slot[k], slot_bytes));
    for (int k = 0; k < 2; k++) TRY(b->d->event_create(&b->slot_ev[k]));
    TRY(b->d->host_alloc(&b->kpin, sizeof(dt_optim_k)));
    return b->d->event_create(&b->k_ev);
}

dt_status dt_dev_event_wait(const dt_dev *d, void *event, double limit, const char *what) {
    double t0 = dt_now();
    for (int done = 0;;) {
        TRY(d->event_query(event, &done));
        if (done) return DT_OK;
        if (limit > 0 && dt_now() - t0 > limit)
            return dt_error(DT_ERR_TIMEOUT, "the GPU: %s has not run in %.0f s (a kernel hung?)", what, limit);
        struct timespec ts = {0, 50000};
        nanosleep(&ts, NULL);
    }
}

dt_status dt_dev_blocks_stage(dt_dev_blocks *b, void **host) {
    int k = b->next_slot;  // (an event never recorded has run)
    TRY(dt_dev_event_wait(b->d, b->slot_ev[k], DT_DEV_STAGE_WAIT, "the batch copied two batches ago"));
    *host = b->slot[k];
    return DT_OK;
}

dt_status dt_dev_blocks_staged(dt_dev_blocks *b) {
    int k = b->next_slot;
    b->next_slot = 1 - k;
    return b->d->event_record(b->slot_ev[k]);
}

void dt_dev_blocks_close(dt_dev_blocks *b) {
    for (int k = 0; k < 2; k++) {
        if (b->slot[k]) b->d->host_free(b->slot[k]);
        if (b->slot_ev[k]) b->d->event_destroy(b->slot_ev[k]);
        b->slot[k] = b->slot_ev[k] = NULL;
    }
    if (b->kpin) b->d->host_free(b->kpin);
    if (b->k_ev) b->d->event_destroy(b->k_ev);
    b->kpin = b->k_ev = NULL;
    dt_dev_arena_close(&b->arena);
    if (b->grads_vm) dt_dev_vm_close(&b->gvm);
    if (b->params_vm) dt_dev_vm_close(&b->pvm);
    if (b->hvm.base) dt_dev_vm_close(&b->hvm);
    for (int j = 0; j < 2; j++)
        if (b->svm[j].base) dt_dev_vm_close(&b->svm[j]);
}

// The parameters the device keeps between steps: [lo, lo + n) (floats).
static void kept_params(const dt_dev_blocks *b, size_t *lo, size_t *n) {
    *lo = b->params_vm ? b->slo : 0;
    *n = b->params_vm ? b->sn : b->n;
}

dt_status dt_dev_blocks_changed(dt_dev_blocks *b, const dt_grad_range *r, int nr) {
    dt_grad_range all;
    kept_params(b, &all.offset, &all.len);
    if (!r) r = &all, nr = 1;
    for (int i = 0; i < nr && b->t != DT_F32; i++)
        TRY(b->d->to16((uint16_t *)b->w16 + r[i].offset, b->params + r[i].offset, r[i].len, b->t));
    return DT_OK;
}

dt_status dt_dev_blocks_put(dt_dev_blocks *b, const float *params, float *const *states) {
    size_t sn = b->sn * sizeof(float), lo, n;
    kept_params(b, &lo, &n);
    TRY(b->d->to_device(b->params + lo, params + lo, n * sizeof(float)));
    for (int j = 0; states && j < b->nstates; j++) TRY(b->d->to_device(b->state[j], states[j], sn));
    return dt_dev_blocks_changed(b, NULL, 0);
}

dt_status dt_dev_blocks_get(dt_dev_blocks *b, float *params, float *const *states) {
    size_t sn = b->sn * sizeof(float), lo, n;
    kept_params(b, &lo, &n);
    TRY(b->d->to_host(params + lo, b->params + lo, n * sizeof(float)));
    for (int j = 0; states && j < b->nstates; j++) TRY(b->d->to_host(states[j], b->state[j], sn));
    return DT_OK;
}

// A state's element `off` on the device (its blocks hold the slice's).
static float *state_at(const dt_dev_blocks *b, int j, size_t off) { return b->state[j] + (off - b->slo); }

dt_status dt_dev_blocks_put_range(dt_dev_blocks *b, const float *params, float *const *states, size_t off, size_t n,
                                  int grads) {
    size_t f = sizeof(float);
    if (b->held) TRY(dt_dev_vm_back(&b->pvm, off * f, n * f));
    if (b->held && b->hvm.base) TRY(dt_dev_vm_back(&b->hvm, off * 2, n * 2));
    if (b->held && grads) TRY(dt_dev_vm_back(&b->gvm, off * f, n * f));
    for (int j = 0; states && j < b->nstates; j++) {
        if (b->held) TRY(dt_dev_vm_back(&b->svm[j], off * f, n * f));
        TRY(b->d->to_device(state_at(b, j, off), states[j] + off, n * f));
    }
    TRY(b->d->to_device(b->params + off, params + off, n * f));
    return b->t != DT_F32 ? b->d->to16((uint16_t *)b->w16 + off, b->params + off, n, b->t) : DT_OK;
}

dt_status dt_dev_blocks_get_range(dt_dev_blocks *b, float *params, float *const *states, size_t off, size_t n) {
    for (int j = 0; states && j < b->nstates; j++)
        TRY(b->d->to_host(states[j] + off, state_at(b, j, off), n * sizeof(float)));
    return b->d->to_host(params + off, b->params + off, n * sizeof(float));
}

dt_status dt_dev_blocks_drop_range(dt_dev_blocks *b, size_t off, size_t n) {
    if (!b->held) return DT_OK;
    TRY(b->d->sync());  // (the kernels queued may still read them: a GPU unmaps at once)
    TRY(dt_dev_vm_give(&b->pvm, off * sizeof(float), n * sizeof(float)));
    return b->hvm.base ? dt_dev_vm_give(&b->hvm, off * 2, n * 2) : DT_OK;
}

dt_status dt_dev_blocks_keep_only(dt_dev_blocks *b, const dt_grad_range *ranges, int n) {
    dt_dev_vm *vs[2] = {&b->pvm, &b->hvm};
    if (b->held) TRY(b->d->sync());  // (as drop_range)
    for (int k = 0; k < 2 && b->held; k++) {
        dt_dev_vm *v = vs[k];
        size_t per = v->gran / (k ? 2 : sizeof(float));  // (floats a chunk)
        for (size_t c = 0; v->base && c < v->nchunks; c++) {
            int keep = !v->mapped[c];
            for (int r = 0; r < n && !keep; r++)
                keep = c * per < ranges[r].offset + ranges[r].len && (c + 1) * per > ranges[r].offset;
            if (!keep) TRY(dt_dev_vm_give(v, c * v->gran, v->gran));
        }
    }
    return DT_OK;
}

dt_status dt_dev_blocks_zero_grad(dt_dev_blocks *b) {
    return b->grads_vm ? dt_dev_vm_zero(&b->gvm) : b->d->memset0(b->grads, b->n * sizeof(float));
}

dt_status dt_dev_blocks_layer(const dt_dev_blocks *b, int layer, int phase) {
    return b->layer_fn ? b->layer_fn(layer, phase, b->layer_user) : DT_OK;
}

dt_status dt_dev_blocks_back(dt_dev_blocks *b, size_t off, size_t n) {  // (held: the strategy backs them)
    return b->grads_vm && !b->held ? dt_dev_vm_back(&b->gvm, off * sizeof(float), n * sizeof(float)) : DT_OK;
}

dt_status dt_dev_blocks_step_values(dt_dev_blocks *b, double v[2]) {
    return b->d->to_host(v, b->sumsq, 2 * sizeof(double));
}

float *dt_dev_loss_out(const dt_dev_blocks *b, float *loss) {
    if (!b->defer_loss) return loss;
    *loss = 0;
    return NULL;
}

// The update's constants (the step's: its learning rate, AdamW's bias
// corrections) go to the device through the pinned kpin, queued: the
// kernel reads them there, so that a step captured as a CUDA graph takes
// each step's own when replayed (the host writes kpin before the graph
// runs; the copy is the graph's).
dt_status dt_dev_blocks_update(dt_dev_blocks *b, const dt_optim *o, float lr, float grad_scale, const float *guard,
                               const dt_grad_range *r, int nr) {
    if (dt_optim_skipping(o)) return DT_OK;
    dt_grad_range slice = {b->slo, b->sn};
    if (!r) r = &slice, nr = 1;
    dt_optim_k *k = b->kpin;
    TRY(dt_dev_event_wait(b->d, b->k_ev, DT_DEV_STAGE_WAIT, "the last update's constants"));
    int adamw = dt_optim_kind_of(o) == DT_OPTIM_ADAMW;
    if (adamw) k->adamw = dt_optim_adamw_k(o, lr, grad_scale);
    else k->sgd = dt_optim_sgd_k(o, lr, grad_scale);
    TRY(b->d->to_device_async(b->k, k, sizeof *k));
    TRY(b->d->event_record(b->k_ev));
    for (int i = 0; i < nr; i++) {
        size_t a = r[i].offset;
        float *w = b->params + a, *s0 = b->nstates ? state_at(b, 0, a) : NULL;
        const float *g = b->grads + a;
        if (adamw) TRY(b->d->adamw(w, g, s0, state_at(b, 1, a), r[i].len, b->k, guard));
        else TRY(b->d->sgd(w, g, s0, r[i].len, b->k, guard));
    }
    return DT_OK;
}

dt_status dt_dev_gemm(const dt_dev_blocks *b, int ta, int tb, int M, int N, int K, float alpha, dt_dev_x A, int lda,
                      dt_dev_x B, int ldb, float beta, float *C, int ldc) {
    if (b->t == DT_F32) return b->d->sgemm(ta, tb, M, N, K, alpha, A.f, lda, B.f, ldb, beta, C, ldc);
    return b->d->gemm16(b->t, ta, tb, M, N, K, alpha, A.h, lda, B.h, ldb, beta, C, ldc);
}

dt_dev_x dt_dev_weights(const dt_dev_blocks *b, size_t w_off) {
    dt_dev_x x = {b->params + w_off, b->w16 ? (const uint16_t *)b->w16 + w_off : NULL};
    return x;
}

// x as the blocks' GEMMs take it: fp32, or its 16-bit copy.
static const void *operand(const dt_dev_blocks *b, dt_dev_x x) { return b->t == DT_F32 ? (const void *)x.f : x.h; }

dt_status dt_dev_linear_forward(const dt_dev_blocks *b, float *out, float *pre, dt_dev_x in, size_t w_off,
                                const float *bias, int N, int C, int OC) {
    const void *w = operand(b, dt_dev_weights(b, w_off));
    return b->d->linear_forward(out, pre, operand(b, in), w, bias, N, C, OC, b->t);
}

dt_status dt_dev_linear_backward(const dt_dev_blocks *b, float *din, const float *pre, size_t w_off, float *db,
                                 const float *dout, void *dout16, dt_dev_x in, int N, int C, int OC) {
    dt_dev_x g = {dout, dout16}, w = dt_dev_weights(b, w_off);
    int half = b->t != DT_F32;  // (dout converted: with a bias, by its column sums' pass)
    if (half && db) TRY(b->d->bias_backward(db, dout, (size_t)N, OC, dout16, b->t));
    else if (half) TRY(b->d->to16(dout16, dout, (size_t)N * OC, b->t));
    if (din && pre) TRY(b->d->linear_dgelu(din, operand(b, g), operand(b, w), pre, N, C, OC, b->t));
    else if (din) TRY(dt_dev_gemm(b, 0, 0, N, C, OC, 1.0f, g, OC, w, C, 0.0f, din, C));
    TRY(dt_dev_gemm(b, 1, 0, OC, C, N, 1.0f, g, OC, in, C, 1.0f, b->grads + w_off, C));
    return db && !half ? b->d->bias_backward(db, dout, (size_t)N, OC, NULL, DT_F32) : DT_OK;
}

void dt_dev_blocks_kinds(const dt_dev_blocks *b, size_t bytes[DT_DEV_KINDS]) {
    for (int i = 0; i < DT_DEV_KINDS; i++) bytes[i] = b->arena.planned[i];
    size_t f = sizeof(float);  // (beside the arena: the slices', kept; held: what is backed now)
    bytes[DT_DEV_GRADS] += b->held ? b->gvm.now : dt_dev_blocks_kept(b, &b->gvm, f);
    bytes[DT_DEV_WEIGHTS] += b->held ? b->pvm.now + b->hvm.now
                                     : dt_dev_blocks_kept(b, &b->pvm, f) + dt_dev_blocks_kept(b, &b->hvm, 2);
    bytes[DT_DEV_ACTS] += b->stage_bytes;
    for (int j = 0; b->held && j < b->nstates; j++) bytes[DT_DEV_OPTIM] += b->svm[j].now;
    bytes[DT_DEV_WORK] += b->d->scratch_bytes(NULL);  // (the ops' own scratch: the device's, beside the arena)
}

// ---- the sequential model --------------------------------------------------------
// Its layers as nn/model.c has them, in NCHW: a convolution in fp32 is the
// seam's conv2d (cuDNN's; `direct`), else (16 bits, or no cuDNN) im2col
// (its columns kept for the backward) and a GEMM into NHWC rows, where the
// bias is a row bias, then transposed to NCHW; pooling and dropout
// cnn_hd.h's.

struct dt_dev_mlp {
    dt_dev_blocks b;
    int nl, max_batch, in, V, B;
    int train;             // the forward's mode: 0 (evaluation) runs dropout as the identity
    int direct;            // convolutions by the seam's conv2d (fp32, conv2d_ready), else im2col and a GEMM
    size_t px_n;           // the pinned buffer's floats before the targets: max_batch x max(in, V)
    float loss_scale;
    uint64_t seed, step;   // dropout's key (dt_dev_mlp_forward's step and first sample)
    int64_t first;
    dt_model_layer_plan *L;
    float **act, **dact, **keep;  // per layer: [max_batch, out] each; keep: layernorm's mean and rstd [2,
                                  // max_batch], a convolution's columns (in t in 16 bits), max pooling's
                                  // argmax, dropout's mask
    void **in16;                  // in 16 bits: a linear layer's input [max_batch, in] in t (else NULL)
    float *x, *probs, *rows, *dcol;  // rows, dcol: the convolutions' NHWC rows and column gradients (shared;
                                     // in 16 bits dcol is also the forward's fp32 columns before they are kept)
    void *g16;                    // in 16 bits: a GEMM's output gradient in t (a linear's, a convolution's rows)
    int32_t *y;
    dt_dev_reduce_fn reduce;      // a tensor-parallel shard's sums over the shards, on device values (NULL: none)
    void *reduce_user;
};

// Layer i's convolution geometry (a conv2d's, or for max pooling its
// window in K and S).
static dt_im2col_t geometry(const dt_model_layer_plan *l) {
    const dt_layer_spec *s = &l->spec;
    int pool = s->kind == DT_LAYER_MAXPOOL;
    dt_im2col_t g = {l->in_shape[0], l->in_shape[1], l->in_shape[2], s->kernel,
                     s->stride ? s->stride : pool ? s->kernel : 1, pool ? 0 : s->pad, l->out_shape[1], l->out_shape[2]};
    return g;
}

// Bytes of layer i's kept buffer (es: a convolution's columns' element
// size), and the floats of the shared rows and column gradients it needs
// (*rows, *cols), for batches of mb; direct: a convolution needs none of
// them (the seam's conv2d reads the layer's input).
static size_t keep_bytes(const dt_model_layer_plan *l, size_t mb, size_t es, int direct, size_t *rows, size_t *cols) {
    dt_im2col_t g = geometry(l);
    size_t ckk = (size_t)g.C * g.K * g.K, n = mb * g.OH * g.OW, f = sizeof(float);
    *rows = *cols = 0;
    switch (l->spec.kind) {
    case DT_LAYER_LAYERNORM: return f * 2 * mb;
    case DT_LAYER_CONV2D:
        if (direct) return 0;
        *rows = n * (size_t)l->out_shape[0], *cols = ckk * n;
        return es * ckk * n;
    case DT_LAYER_MAXPOOL: return sizeof(int32_t) * mb * l->out;
    case DT_LAYER_DROPOUT: return l->spec.p > 0 ? f * mb * l->out : 0;
    default: return 0;
    }
}

// The scratch layer l's backward asks for at batches of mb (a bias's
// column sums, layernorm's, a convolution's workspace).
static void scratch_asks(const dt_dev_mlp *dm, dt_dev_arena *a, const dt_model_layer_plan *l, size_t mb) {
    dt_im2col_t g = geometry(l);
    switch (l->spec.kind) {
    case DT_LAYER_LINEAR:
        if (l->b_n) dt_dev_ask_scratch(a, DT_ASK_COLSUM, mb, (int)l->out, NULL);
        break;
    case DT_LAYER_CONV2D:
        if (dm->direct) dt_dev_ask_scratch(a, DT_ASK_CONV, mb, l->out_shape[0], &g);
        else if (l->b_n) dt_dev_ask_scratch(a, DT_ASK_COLSUM, mb * g.OH * g.OW, l->out_shape[0], NULL);
        break;
    case DT_LAYER_LAYERNORM: dt_dev_ask_scratch(a, DT_ASK_LAYERNORM, mb, (int)l->in, NULL); break;
    default: break;
    }
}

// The activations of layers [l0, l1) from arena a, both passes (counting:
// base NULL, then taking): the input x (l0 > 0: the stream from layer l0
// - 1, which is then that layer's act, and its gradient that layer's
// dact), with the last layer the targets and the probabilities; work: the
// shared workspace too (a stage shares its model's).
static void acts_take(dt_dev_mlp *dm, dt_dev_arena *a, int l0, int l1, int work) {
    int half = dm->b.t != DT_F32;
    size_t mb = (size_t)dm->max_batch, rows = 0, cols = 0, g16 = 0, r, c;
    size_t in = l0 ? dm->L[l0 - 1].out : (size_t)dm->in;
    dm->x = dt_dev_take(a, DT_DEV_ACTS, sizeof(float) * mb * in);
    dm->y = l1 == dm->nl ? dt_dev_take(a, DT_DEV_ACTS, sizeof(int32_t) * mb) : NULL;
    if (l0) dm->act[l0 - 1] = dm->x, dm->dact[l0 - 1] = dt_dev_take(a, DT_DEV_ACTS, sizeof(float) * mb * in);
    for (int i = l0; i < l1; i++) {
        const dt_model_layer_plan *l = &dm->L[i];
        size_t o = sizeof(float) * mb * l->out, k = keep_bytes(l, mb, half ? 2 : sizeof(float), dm->direct, &r, &c);
        int linear = l->spec.kind == DT_LAYER_LINEAR;
        // (a stage's last output is its stream out, sent while its backward writes the gradients: its own)
        int to_linear = i + 1 < l1 && dm->L[i + 1].spec.kind == DT_LAYER_LINEAR;
        dm->dact[i] = dt_dev_take(a, DT_DEV_ACTS, o);
        // (an output only the next linear reads: in 16 bits made in its gradient's room, unused until the
        // backward, and kept in the linear's in16, as nn/model.c's plan_half)
        dm->act[i] = half && to_linear ? dm->dact[i] : dt_dev_take(a, DT_DEV_ACTS, o);
        dm->keep[i] = k ? dt_dev_take(a, DT_DEV_ACTS, k) : NULL;
        dm->in16[i] = half && linear ? dt_dev_take(a, DT_DEV_ACTS, 2 * mb * l->in) : NULL;
        scratch_asks(dm, a, l, mb);
        size_t gn = linear ? mb * l->out : r;  // (a convolution's rows: its output gradient)
        g16 = gn > g16 ? gn : g16;
        rows = r > rows ? r : rows;
        cols = c > cols ? c : cols;
    }
    if (work) {
        dm->rows = rows ? dt_dev_take(a, DT_DEV_WORK, sizeof(float) * rows) : NULL;
        dm->dcol = cols ? dt_dev_take(a, DT_DEV_WORK, sizeof(float) * cols) : NULL;
        dm->g16 = half && g16 ? dt_dev_take(a, DT_DEV_WORK, 2 * g16) : NULL;
    }
    dm->probs = l1 == dm->nl ? dt_dev_take(a, DT_DEV_ACTS, sizeof(float) * mb * (size_t)dm->V) : NULL;
}

// Both passes of the model's arena.
static void mlp_take(dt_dev_mlp *dm) {
    dt_dev_blocks_take(&dm->b, dm->max_batch);
    acts_take(dm, &dm->b.arena, 0, dm->nl, 1);
}

dt_status dt_dev_mlp_create(dt_dev_mlp **out, const dt_dev *d, const dt_model *m, int max_batch, int nstates,
                            dt_dev_part part, dt_dtype t, uint64_t seed) {
    dt_dev_mlp *dm = calloc(1, sizeof *dm);
    int nl = dt_model_num_layers(m);
    if (dm) {
        dm->L = calloc((size_t)nl, sizeof *dm->L);
        dm->act = calloc((size_t)nl * 3, sizeof(float *));
        dm->in16 = calloc((size_t)nl, sizeof(void *));
    }
    if (!(*out = dm) || !dm->L || !dm->act || !dm->in16)
        return dt_dev_mlp_free(dm), *out = NULL, dt_error(DT_ERR_NOMEM, "out of memory");
    dm->dact = dm->act + nl;
    dm->keep = dm->act + 2 * nl;
    *dm = (dt_dev_mlp){.b = dt_dev_blocks_of(d, t, dt_model_num_params(m), nstates, part),
                       .nl = nl, .max_batch = max_batch, .in = dt_model_input_size(m), .V = dt_model_num_classes(m),
                       .seed = seed, .L = dm->L, .act = dm->act, .dact = dm->dact, .keep = dm->keep,
                       .in16 = dm->in16};
    dm->b.kinds = 1;
    int convs = 0;
    for (int i = 0; i < nl; i++) {
        dt_model_layer(m, i, &dm->L[i]);
        size_t big = dm->L[i].w_n > dm->L[i].b_n ? dm->L[i].w_n : dm->L[i].b_n;
        dm->b.largest = big > dm->b.largest ? big : dm->b.largest;
        convs += dm->L[i].spec.kind == DT_LAYER_CONV2D;
        dm->b.step_values |= dm->L[i].spec.kind == DT_LAYER_DROPOUT && dm->L[i].spec.p > 0.0f;
    }
    char why[600] = "";
    dm->direct = convs && t == DT_F32 && d->conv2d_ready(why, sizeof why);
    if (convs && t == DT_F32 && !dm->direct)
        dt_log(DT_LOG_WARN, "the device's convolutions as im2col and a GEMM (slower, more memory): no cuDNN (%s)", why);
    mlp_take(dm);  // (counting)
    // the pinned buffer: a batch's samples (or, read back, its probabilities), then its targets
    dm->px_n = (size_t)max_batch * (size_t)(dm->in > dm->V ? dm->in : dm->V);
    size_t pinned = (dm->px_n + 1) * sizeof(float) + (size_t)max_batch * sizeof(int32_t);
    dt_status st = dt_dev_blocks_open(&dm->b, pinned, "the device model");
    if (st != DT_OK) {
        dt_dev_mlp_free(dm);
        *out = NULL;
        return st;
    }
    mlp_take(dm);
    if ((st = dt_dev_arena_check(&dm->b.arena, "the device model")) != DT_OK) {
        dt_dev_mlp_free(dm);
        *out = NULL;
    }
    return st;
}

void dt_dev_mlp_set_reduce(dt_dev_mlp *dm, dt_dev_reduce_fn fn, void *user) {
    dm->reduce = fn;
    dm->reduce_user = user;
}

void dt_dev_mlp_free(dt_dev_mlp *dm) {
    if (!dm) return;
    dt_dev_blocks_close(&dm->b);
    free(dm->L);
    free(dm->act);
    free(dm->in16);
    free(dm);
}

dt_dev_blocks *dt_dev_mlp_blocks(dt_dev_mlp *dm) { return &dm->b; }

// A convolution: direct, the seam's conv2d; else the columns, out rows
// [B OH OW, OC] = columns^T w^T (+ b), transposed into act [B, OC, OH OW].
// In 16 bits the columns are made in the shared dcol and kept in t.
static dt_status conv_forward(dt_dev_mlp *dm, int i, const float *in, int B) {
    const dt_dev *d = dm->b.d;
    const dt_model_layer_plan *l = &dm->L[i];
    dt_im2col_t g = geometry(l);
    int OC = l->out_shape[0], ckk = g.C * g.K * g.K, N = B * g.OH * g.OW;
    if (dm->direct)
        return d->conv2d_forward(dm->act[i], in, dm->b.params + l->w_off, l->add_bias ? dm->b.params + l->b_off : NULL,
                                 (size_t)B, &g, OC);
    float *cols = dm->b.t == DT_F32 ? dm->keep[i] : dm->dcol;
    dt_dev_x c = {cols, dm->keep[i]};
    TRY(d->im2col(cols, in, (size_t)B, &g));
    if (dm->b.t != DT_F32) TRY(d->to16(dm->keep[i], cols, (size_t)ckk * N, dm->b.t));
    TRY(dt_dev_gemm(&dm->b, 1, 1, N, OC, ckk, 1.0f, c, N, dt_dev_weights(&dm->b, l->w_off), ckk, 0.0f, dm->rows, OC));
    if (l->add_bias) TRY(d->bias_forward(dm->rows, dm->b.params + l->b_off, (size_t)N, OC));
    return d->transpose(dm->act[i], dm->rows, (size_t)B, (size_t)g.OH * g.OW, (size_t)OC);
}

// Its backward: direct, the seam's conv2d; else dout to NHWC rows; db, dw
// += from them; din += the columns' gradient gathered back.
static dt_status conv_backward(dt_dev_mlp *dm, int i, const float *in, float *din, int B) {
    const dt_dev *d = dm->b.d;
    const dt_model_layer_plan *l = &dm->L[i];
    dt_im2col_t g = geometry(l);
    int OC = l->out_shape[0], ckk = g.C * g.K * g.K, N = B * g.OH * g.OW;
    if (dm->direct)
        return d->conv2d_backward(din, dm->b.grads + l->w_off, l->b_n ? dm->b.grads + l->b_off : NULL, dm->dact[i], in,
                                  dm->b.params + l->w_off, (size_t)B, &g, OC);
    dt_dev_x r = {dm->rows, dm->g16}, c = {dm->keep[i], dm->keep[i]};
    TRY(d->transpose(dm->rows, dm->dact[i], (size_t)B, (size_t)OC, (size_t)g.OH * g.OW));
    void *g16 = dm->b.t != DT_F32 ? dm->g16 : NULL;  // (the rows in 16 bits: by the bias's pass where there is one)
    if (l->b_n) TRY(d->bias_backward(dm->b.grads + l->b_off, dm->rows, (size_t)N, OC, g16, dm->b.t));
    else if (g16) TRY(d->to16(g16, dm->rows, (size_t)N * OC, dm->b.t));
    TRY(dt_dev_gemm(&dm->b, 1, 1, OC, ckk, N, 1.0f, r, OC, c, N, 1.0f, dm->b.grads + l->w_off, ckk));
    if (!din) return DT_OK;
    TRY(dt_dev_gemm(&dm->b, 1, 1, ckk, N, OC, 1.0f, dt_dev_weights(&dm->b, l->w_off), ckk, r, OC, 0.0f, dm->dcol, N));
    return d->col2im(din, dm->dcol, (size_t)B, &g);
}

static dt_status layer_forward(dt_dev_mlp *dm, int i, const float *in, int B) {
    const dt_dev *d = dm->b.d;
    const dt_model_layer_plan *l = &dm->L[i];
    const float *w = dm->b.params + l->w_off, *b = dm->b.params + l->b_off;
    float *act = dm->act[i];
    size_t n = (size_t)B * l->out;
    dt_im2col_t g = geometry(l);
    dt_dev_x x = {in, dm->in16[i]};
    switch (l->spec.kind) {
    case DT_LAYER_LINEAR:  // (in 16 bits its input kept in t for the backward)
        if (dm->in16[i]) TRY(d->to16(dm->in16[i], in, (size_t)B * l->in, dm->b.t));
        return dt_dev_linear_forward(&dm->b, act, NULL, x, l->w_off, l->add_bias ? b : NULL, B, (int)l->in,
                                     (int)l->out);
    case DT_LAYER_CONV2D: return conv_forward(dm, i, in, B);
    case DT_LAYER_MAXPOOL:
        return d->maxpool_forward(act, (int32_t *)dm->keep[i], in, (size_t)B * g.C, g.H, g.W, g.K, g.S);
    case DT_LAYER_DROPOUT:
        if (l->spec.p <= 0.0f || !dm->train) return d->copy(act, in, n * sizeof(float));
        return d->dropout_forward(act, dm->keep[i], in, B, l->out, l->spec.p, dm->seed, dm->step, dm->first, i,
                                  l->drop_skip);
    case DT_LAYER_RELU: return d->relu_forward(act, in, n);
    case DT_LAYER_GELU: return d->gelu_forward(act, in, n, NULL, DT_F32);
    case DT_LAYER_LAYERNORM:
        return d->layernorm_forward(act, dm->keep[i], dm->keep[i] + dm->max_batch, in, w, b, (size_t)B, (int)l->in,
                                    l->spec.eps > 0 ? l->spec.eps : 1e-5f, NULL, DT_F32);
    default: return d->copy(act, in, n * sizeof(float));  // flatten (NCHW: the same order)
    }
}

// A tensor-parallel shard's n values x summed over the shards (through
// the host: the task's sum, as the CPU model's).
static dt_status reduce(dt_dev_mlp *dm, float *x, size_t n) { return dm->reduce(x, n, dm->reduce_user); }

// Layers [l0, l1) forward on B samples from x (a row-parallel layer's
// output summed over the shards).
static dt_status layers_forward(dt_dev_mlp *dm, int l0, int l1, int B) {
    for (int i = l0; i < l1; i++) {
        TRY(dt_dev_blocks_layer(&dm->b, i, 0));
        TRY(layer_forward(dm, i, i ? dm->act[i - 1] : dm->x, B));
        if (dm->L[i].tp == 2 && dm->reduce) TRY(reduce(dm, dm->act[i], (size_t)B * dm->L[i].out));
    }
    return DT_OK;
}

// The cross-entropy of the last layer's output, *loss read back (loss
// NULL: left on the device, dt_dev_loss_out).
static dt_status loss_forward(dt_dev_mlp *dm, int B, float *loss) {
    const dt_dev *d = dm->b.d;
    TRY(d->crossentropy_forward(dm->probs, dm->b.row_loss, dm->b.loss, dm->act[dm->nl - 1], dm->y, (size_t)B, dm->V,
                                (size_t)dm->V));
    if (!loss) return DT_OK;
    float l;
    TRY(d->to_host(&l, dm->b.loss, sizeof l));
    *loss = l;
    if (!isfinite(l))
        return dt_error(DT_ERR_NUMERIC, "model: loss is %s (diverged: lower the learning rate or clip gradients)",
                        isnan(l) ? "NaN" : "Inf");
    return DT_OK;
}

// The samples x[B] (NULL: none) and their targets y[B] checked and put on
// the device through the next pinned slot, without waiting
// (dt_dev_blocks_stage).
static dt_status batch_in(dt_dev_mlp *dm, const float *x, const int32_t *y, int B) {
    const dt_dev *d = dm->b.d;
    for (int i = 0; y && i < B; i++)
        if (y[i] < 0 || y[i] >= dm->V)
            return dt_error(DT_ERR_ARG, "model: target %d of sample %d outside 0..%d", (int)y[i], i, dm->V - 1);
    float *px;
    TRY(dt_dev_blocks_stage(&dm->b, (void **)&px));
    int32_t *py = (int32_t *)(px + dm->px_n);
    size_t nx = (size_t)B * dm->in;
    if (x) memcpy(px, x, nx * sizeof(float));
    if (y) memcpy(py, y, (size_t)B * sizeof(int32_t));
    if (x) TRY(d->to_device_async(dm->x, px, nx * sizeof(float)));
    if (y) TRY(d->to_device_async(dm->y, py, (size_t)B * sizeof(int32_t)));
    return dt_dev_blocks_staged(&dm->b);
}

// The forward of B samples in mode train (dt_model_forward's), the batch
// through a pinned slot; *loss read back (NULL: left on the device).
static dt_status mlp_forward(dt_dev_mlp *dm, const float *x, const int32_t *y, int B, int train, float *loss) {
    if (B <= 0 || B > dm->max_batch) return dt_error(DT_ERR_ARG, "device model: batch %d outside 1..%d", B, dm->max_batch);
    TRY(batch_in(dm, x, y, B));
    dm->train = train;
    TRY(layers_forward(dm, 0, dm->nl, B));
    return loss_forward(dm, B, loss);
}

dt_status dt_dev_mlp_forward(dt_dev_mlp *dm, const float *x, const int32_t *y, int B, float loss_scale,
                             uint64_t step, int64_t first, float *loss) {
    dm->B = 0;
    dm->step = step;
    dm->first = first;
    TRY(mlp_forward(dm, x, y, B, 1, loss));
    dm->B = B;
    dm->loss_scale = loss_scale;
    return DT_OK;
}

dt_status dt_dev_mlp_evaluate(dt_dev_mlp *dm, const float *x, const int32_t *y, int B, float *loss,
                              float *probs) {
    dm->B = 0;  // (no backward after it)
    TRY(mlp_forward(dm, x, y, B, 0, loss));
    size_t n = (size_t)B * dm->V;
    TRY(dm->b.d->to_host(dm->b.slot[0], dm->probs, n * sizeof(float)));
    memcpy(probs, dm->b.slot[0], n * sizeof(float));
    return DT_OK;
}

static dt_status layer_backward(dt_dev_mlp *dm, int i, int B) {
    const dt_dev *d = dm->b.d;
    const dt_model_layer_plan *l = &dm->L[i];
    const float *in = i > 0 ? dm->act[i - 1] : dm->x, *w = dm->b.params + l->w_off, *dout = dm->dact[i];
    float *din = i > 0 ? dm->dact[i - 1] : NULL, *dw = dm->b.grads + l->w_off, *db = dm->b.grads + l->b_off;
    size_t n = (size_t)B * l->out;
    int C = (int)l->in, OC = (int)l->out;
    dt_im2col_t g = geometry(l);
    dt_dev_x x = {in, dm->in16[i]};
    TRY(dt_dev_blocks_back(&dm->b, l->w_off, l->w_n));
    TRY(dt_dev_blocks_back(&dm->b, l->b_off, l->b_n));
    switch (l->spec.kind) {
    case DT_LAYER_LINEAR:
        return dt_dev_linear_backward(&dm->b, din, NULL, l->w_off, l->b_n ? db : NULL, dout, dm->g16, x, B, C, OC);
    case DT_LAYER_CONV2D: return conv_backward(dm, i, in, din, B);
    case DT_LAYER_MAXPOOL:
        return din ? d->maxpool_backward(din, dout, (const int32_t *)dm->keep[i], (size_t)B * g.C, g.H, g.W, g.K, g.S)
                   : DT_OK;
    case DT_LAYER_DROPOUT:
        if (din && l->spec.p > 0.0f) return d->dropout_backward(din, dout, dm->keep[i], n);
        return din ? d->copy(din, dout, n * sizeof(float)) : DT_OK;  // (din is zero: += is a copy)
    case DT_LAYER_RELU: return din ? d->relu_backward(din, dout, in, n) : DT_OK;
    case DT_LAYER_GELU: return din ? d->gelu_backward(din, dout, in, n) : DT_OK;
    case DT_LAYER_LAYERNORM:
        return d->layernorm_backward(din, dw, db, dout, in, w, dm->keep[i], dm->keep[i] + dm->max_batch, (size_t)B, C);
    default: return din ? d->copy(din, dout, n * sizeof(float)) : DT_OK;  // (din is zero: += is a copy)
    }
}

// Layers [l0, l1) backward from the gradient of layer l1 - 1's output
// (the last layer's: the loss's; else dout, on the device) into their parameters'
// gradients and, l0 > 0, the gradient of x.
static dt_status layers_backward(dt_dev_mlp *dm, int l0, int l1, const float *dout, dt_grad_ready_fn hook,
                                 void *user) {
    const dt_dev *d = dm->b.d;
    int B = dm->B;
    if (!B) return dt_error(DT_ERR_ARG, "device model: backward needs a forward first");
    for (int i = l0 ? l0 - 1 : 0; i < l1; i++) TRY(d->memset0(dm->dact[i], sizeof(float) * (size_t)B * dm->L[i].out));
    if (l1 == dm->nl)
        TRY(d->crossentropy_backward(dm->dact[dm->nl - 1], dm->probs, dm->y, (size_t)B, dm->V, (size_t)dm->V,
                                     dm->loss_scale));
    else
        TRY(d->copy(dm->dact[l1 - 1], dout, sizeof(float) * (size_t)B * dm->L[l1 - 1].out));
    for (int i = l1 - 1; i >= l0; i--) {
        TRY(dt_dev_blocks_layer(&dm->b, i, 1));
        TRY(layer_backward(dm, i, B));
        if (dm->L[i].tp == 1 && i > 0 && dm->reduce)  // (a column-parallel layer's input gradient: summed)
            TRY(reduce(dm, dm->dact[i - 1], (size_t)B * dm->L[i - 1].out));
        if (hook && (dm->L[i].w_n || dm->L[i].b_n)) hook(dm->L[i].w_off, user);
    }
    dm->B = 0;
    return DT_OK;
}

dt_status dt_dev_mlp_backward(dt_dev_mlp *dm, dt_grad_ready_fn hook, void *user) {
    return layers_backward(dm, 0, dm->nl, NULL, hook, user);
}

// ---- pipeline stages: layers [l0, l1) on activations of their own ----------
// A stage is a twin of the model: the same blocks (parameters, gradients,
// scalars) and workspace, its own activation set in an arena of its own,
// layer l0 - 1's output and gradient its input x and dx (dact[l0 - 1]),
// so that its layers run as the whole model's do; the streams in and out
// (x and layer l1 - 1's output) and the gradient of in (dx) are those
// buffers, on the device.

dt_status dt_dev_stage_mem_open(dt_dev_stage_mem *m, dt_dev_blocks *owner) {
    TRY(dt_dev_arena_open(&m->arena, "a pipeline stage's activations on the device"));
    m->owner = owner;
    owner->stage_bytes += m->arena.size;
    return DT_OK;
}

void dt_dev_stage_mem_close(dt_dev_stage_mem *m) {
    if (m->owner) m->owner->stage_bytes -= m->arena.size;
    dt_dev_arena_close(&m->arena);
    m->owner = NULL;
}

struct dt_dev_mlp_stage {
    dt_dev_mlp m;            // the twin
    dt_dev_stage_mem mem;    // its activations' arena
    int l0, l1;
    size_t in, out;          // floats a sample of the streams
};

static size_t stream_floats(const dt_dev_mlp *dm, int l) { return l ? dm->L[l - 1].out : (size_t)dm->in; }

dt_status dt_dev_mlp_stage_create(dt_dev_mlp *dm, int l0, int l1, dt_dev_mlp_stage **out) {
    dt_dev_mlp_stage *s = calloc(1, sizeof *s);
    float **arrays = calloc((size_t)dm->nl * 3, sizeof(float *));
    void **in16 = calloc((size_t)dm->nl, sizeof(void *));
    *out = NULL;
    if (!s || !arrays || !in16) {
        free(s), free(arrays), free(in16);
        return dt_error(DT_ERR_NOMEM, "pipeline stage on the device: out of memory");
    }
    s->m = *dm;  // (the blocks, the layers' plan, the workspace: the model's)
    s->m.act = arrays, s->m.dact = arrays + dm->nl, s->m.keep = arrays + 2 * dm->nl, s->m.in16 = in16;
    s->mem.arena = (dt_dev_arena){.d = dm->b.d};
    s->l0 = l0, s->l1 = l1, s->in = stream_floats(dm, l0), s->out = stream_floats(dm, l1);
    acts_take(&s->m, &s->mem.arena, l0, l1, 0);  // (counting)
    dt_status st = dt_dev_stage_mem_open(&s->mem, &dm->b);
    if (st != DT_OK) {
        dt_dev_mlp_stage_free(s);
        return st;
    }
    acts_take(&s->m, &s->mem.arena, l0, l1, 0);
    if ((st = dt_dev_arena_check(&s->mem.arena, "a pipeline stage's activations")) != DT_OK) {
        dt_dev_mlp_stage_free(s);
        return st;
    }
    *out = s;
    return DT_OK;
}

void dt_dev_mlp_stage_free(dt_dev_mlp_stage *s) {
    if (!s) return;
    dt_dev_stage_mem_close(&s->mem);
    free(s->m.act);
    free(s->m.in16);
    free(s);
}

void dt_dev_mlp_stage_streams(dt_dev_mlp_stage *s, float **in, size_t *in_floats, float **out, size_t *out_floats) {
    *in = s->m.x, *in_floats = s->in;
    *out = s->m.act[s->l1 - 1], *out_floats = s->out;
}

dt_status dt_dev_mlp_stage_forward(dt_dev_mlp_stage *s, const float *x, const int32_t *y, int B, float loss_scale,
                                   uint64_t step, int64_t first, float *loss) {
    dt_dev_mlp *m = &s->m;
    if (B <= 0 || B > m->max_batch) return dt_error(DT_ERR_ARG, "device model: batch %d outside 1..%d", B, m->max_batch);
    m->B = 0;
    m->train = 1, m->step = step, m->first = first, m->loss_scale = loss_scale;
    // (the stream in, l0 > 0, is in x already)
    if (s->l0 == 0 || s->l1 == m->nl) TRY(batch_in(m, s->l0 == 0 ? x : NULL, s->l1 == m->nl ? y : NULL, B));
    TRY(layers_forward(m, s->l0, s->l1, B));
    if (s->l1 == m->nl) TRY(loss_forward(m, B, loss));
    m->B = B;
    return DT_OK;
}

dt_status dt_dev_mlp_stage_backward(dt_dev_mlp_stage *s, const float *dout, float **din) {
    TRY(layers_backward(&s->m, s->l0, s->l1, dout, NULL, NULL));
    *din = s->l0 ? s->m.dact[s->l0 - 1] : NULL;
    return DT_OK;
}
