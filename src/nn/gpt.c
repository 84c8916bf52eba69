/* The GPT-2 model: parameters in llm.c's layout, forward, backward. The
 * structure follows llm.c's train_gpt2.c (one parameter block, one block of
 * saved activations per dt_gpt_acts set), with the layer kernels of
 * layers.c and attention.c. The forward and backward run in stages
 * (embedding, a range of blocks, head); the whole-model calls chain them
 * over the model's default set. */
#include "dtrain/gpt.h"
#include "kernels/kernels.h"
#include "nn/nn_impl.h"
#include "nn/rows.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NPT 16  // parameter tensors

static const char *const param_names[NPT] = {
    "wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
    "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb"};

enum { WTE, WPE, LN1W, LN1B, QKVW, QKVB, ATTPROJW, ATTPROJB, LN2W, LN2B, FCW, FCB, FCPROJW,
       FCPROJB, LNFW, LNFB };

// One micro-batch's saved activations (llm.c's ActivationTensors) for
// layers [l0, l1), sized for maxB x maxT; per-layer ones are [l1-l0, B, T, ...]
// at the current B x T's stride (recompute: [1, B, T, ...], one layer's). A
// shard's qkv, atty, att, fch, fch_gelu, logits and probs are its heads',
// hidden units' and vocabulary rows' (C/ntp, NH/ntp, 4C/ntp, Vp/ntp); a
// sequence-parallel set's resid, ln1, ln2, residual2, lnf and the layernorm
// statistics are the shard's R = BT/ntp rows. The attention and MLP projections are not
// kept: backward does not read them, so they are summed into the residual
// stream in place. In a low precision (the kernels' when the set is made:
// `store`) the four matmul inputs that only matmuls read, ln1, atty, ln2 and
// fch_gelu, are kept in it (2 bytes an element): the GEMMs round them to it
// anyway, in forward and in backward's weight gradient, so the results are
// the same bits.
struct dt_gpt_acts {
    dt_gpt_config c;
    int l0, l1, maxB, maxT, B, T;
    int ntp;                          // sized for a shard of ntp (1: the whole model)
    int seq;                          // sequence parallel: the stream and the layernorms are R = BT/ntp rows
    int recompute;                    // the per-layer parts below hold one layer: `slot`'s
    int fwd_only;                     // forwards alone: resid is two buffers used in turn (recompute set too)
    int slot;                         // recompute: the layer whose activations they hold (-1: none)
    float *resid;                     // [l1-l0+1, R,C]: the stream before each layer, and after l1-1 (R = BT or BT/ntp);
                                      // forward only: [2, R,C], layer l's input in (l - l0) % 2
    dt_dtype store;                   // of ln1, atty, ln2, fch_gelu: DT_F32, DT_BF16 or DT_F16
    float *ln1, *ln1_mean, *ln1_rstd; // [.., B,T,C], [.., B,T]
    float *qkv;                       // [.., B,T,3C]
    float *atty;                      // [.., B,T,C]
    float *att;                       // [.., B,NH,T,T]
    float *residual2;                 // [.., B,T,C]
    float *ln2, *ln2_mean, *ln2_rstd;
    float *fch, *fch_gelu;            // [.., B,T,4C]
    float *lnf, *lnf_mean, *lnf_rstd; // head only (l1 = L)
    float *logits, *probs;            // [B,T,V], head only
    int32_t *inputs, *targets;        // [B,T]: embedding only (l0 = 0), head only
    float *block;                     // the one allocation all of the above point into
    size_t bytes;
    unsigned char *saved;             // [l1-l0]: the layer ran forward since set_shape
    int have_inputs, have_targets;
};

struct dt_gpt {
    dt_gpt_config c;
    size_t nparams;
    dt_tensor_info tensors[NPT];
    float *params, *grads;
    float *p[NPT], *g[NPT];   // tensor views into the blocks
    dt_grad_range *order;     // the gradient order (dt_gpt_grad_order), 12 L + 4
    dt_gpt_acts *acts;        // the default set (NULL when created with B = T = 0)

    // Backward scratch, one layer's worth for up to scratch_bt tokens and
    // scratch_att attention floats, reused layer after layer and by every
    // activation set; dresidual is the whole-model backward's stream gradient.
    size_t scratch_bt, scratch_att;
    // Sequence parallel: dresidual is the shard's rows, datty and dln hold
    // the gathered rows of a layernorm or a gradient, dlnw [4C] a layer's
    // layernorm weight gradients on their way to the sum over the shards.
    float *dresidual, *dln, *datty, *dqkv, *dfch, *dfch_gelu, *datt, *dlnw;

    // The blocks kept (dt_gpt_set_held; NULL: all) and the ranges of the
    // block they, the embedding and the head take, in block order.
    unsigned char *held;
    dt_grad_range *hranges;
    int nheld;

    // Tensor parallel: this shard is rank tp of ntp (1: the whole model);
    // reduce runs the collectives over the ntp shards; seq: sequence parallel.
    int tp, ntp, seq;
    dt_gpt_reduce_fn reduce;
    void *reduce_user;

    float loss_scale;
    dt_grad_ready_fn hook;
    void *hook_user;
    dt_gpt_layer_fn layer_hook;
    void *layer_hook_user;
};

static void held_ranges(dt_gpt *m);

// ----------------------------------------------------------------------------
// configuration

// Element counts of the 16 tensors and their shapes, in a shard of ntp
// (1: the whole model): wte's rows, the columns of qkvw (per third), fcw
// and their biases, and the rows of attprojw and fcprojw divided by ntp.
static void shard_shapes(const dt_gpt_config *c, int ntp, dt_tensor_info t[NPT]) {
    int64_t L = c->n_layer, C = c->n_embd, Vp = c->padded_vocab_size / ntp, maxT = c->block_size;
    int64_t Cl = C / ntp, F = 4 * C / ntp;
    const int64_t sh[NPT][3] = {{Vp, C}, {maxT, C}, {L, C}, {L, C}, {L, 3 * Cl, C}, {L, 3 * Cl},
                                {L, C, Cl}, {L, C}, {L, C}, {L, C}, {L, F, C}, {L, F},
                                {L, C, F}, {L, C}, {C}, {C}};
    size_t off = 0;
    for (int i = 0; i < NPT; i++) {
        t[i].name = param_names[i];
        t[i].ndim = (i == LNFW || i == LNFB) ? 1 : (i == QKVW || i == ATTPROJW || i == FCW || i == FCPROJW) ? 3 : 2;
        size_t n = 1;
        for (int d = 0; d < 4; d++) t[i].shape[d] = d < t[i].ndim ? sh[i][d] : 0;
        for (int d = 0; d < t[i].ndim; d++) n *= (size_t)sh[i][d];
        t[i].numel = n;
        t[i].offset = off;
        off += n;
    }
}

void dt_gpt_param_shapes(const dt_gpt_config *c, dt_tensor_info t[NPT]) { shard_shapes(c, 1, t); }

size_t dt_gpt_shard_num_params(const dt_gpt_config *c, int ntp) {
    dt_tensor_info t[NPT];
    shard_shapes(c, ntp, t);
    return t[NPT - 1].offset + t[NPT - 1].numel;
}

size_t dt_gpt_config_num_params(const dt_gpt_config *c) { return dt_gpt_shard_num_params(c, 1); }

// ----------------------------------------------------------------------------
// activations

static dt_status check_batch(const dt_gpt_config *c, int B, int T, const char *what) {
    if (B < 1 || T < 1 || T > c->block_size)
        return dt_error(DT_ERR_ARG, "%s: batch %d x context %d: expected B >= 1 and 1 <= T <= block_size (%d)",
                        what, B, T, c->block_size);
    return DT_OK;
}

// Sequence parallel divides the B*T tokens of a batch among the ntp shards.
static dt_status check_seq(int ntp, int B, int T, const char *what) {
    if (ntp < 2)
        return dt_error(DT_ERR_ARG, "%s: sequence parallel needs tensor-parallel shards (ntp = %d)", what, ntp);
    if (((int64_t)B * T) % ntp)
        return dt_error(DT_ERR_ARG, "%s: sequence parallel: %d tensor-parallel shards do not divide the batch's %d x %d = %lld tokens",
                        what, ntp, B, T, (long long)B * T);
    return DT_OK;
}

// Elements (4 bytes: float or int32) of each part of a set, rounded up to
// 64 bytes so that every part starts aligned; returns the bytes in all. With
// half, the 16-bit parts (ln1, atty, ln2, fch_gelu) take half the room.
#define NACTS 20
static size_t acts_sizes(const dt_gpt_config *c, const dt_gpt_acts_params *p, int half, size_t n[NACTS]) {
    size_t head = p->l1 == c->n_layer, embed = p->l0 == 0, nl = (size_t)(p->l1 - p->l0);
    size_t nk = (p->recompute || p->forward_only) && nl ? 1 : nl, ntp = (size_t)p->ntp;  // layers whose activations are kept
    size_t ns = p->forward_only && nl > 0 ? 2 : nl + 1;  // streams kept
    size_t C = c->n_embd, Cl = C / ntp, F = 4 * C / ntp, NHl = c->n_head / ntp;
    size_t V = ntp > 1 ? (size_t)c->padded_vocab_size / ntp : (size_t)c->vocab_size;
    size_t BT = (size_t)p->B * p->T, att = BT * NHl * p->T, R = p->seq ? BT / ntp : BT;  // the stream's rows
    const size_t want[NACTS] = {
        ns * R * C,                                                        // resid
        nk * R * C, nk * R, nk * R, nk * BT * 3 * Cl, nk * BT * Cl,        // ln1, mean, rstd, qkv, atty
        nk * att, nk * R * C, nk * R * C, nk * R, nk * R,                  // att, residual2, ln2, mean, rstd
        nk * BT * F, nk * BT * F,                                          // fch, fch_gelu
        head * R * C, head * R, head * R, head * BT * V, head * BT * V,    // lnf, mean, rstd, logits, probs
        head * BT, embed * BT};                                            // targets, inputs
    size_t total = 0;
    for (int i = 0; i < NACTS; i++) {
        int h = half && (i == 1 || i == 5 || i == 8 || i == 12);
        total += n[i] = ((h ? (want[i] + 1) / 2 : want[i]) + 15) / 16 * 16;
    }
    return total * 4;
}

dt_gpt_acts_params dt_gpt_acts_whole(const dt_gpt_config *c, int B, int T) {
    return (dt_gpt_acts_params){B, T, 0, c->n_layer, 1, 0, 0, 0};
}

void dt_gpt_acts_free(dt_gpt_acts *a) {
    if (!a) return;
    dt_free(a->block);
    free(a->saved);
    free(a);
}

dt_status dt_gpt_acts_create_with(dt_gpt_acts **out, const dt_gpt_config *c, const dt_gpt_acts_params *p) {
    *out = NULL;
    int B = p->B, T = p->T, l0 = p->l0, l1 = p->l1;
    dt_status st = dt_gpt_config_check(c, "gpt activations");
    if (st == DT_OK) st = check_batch(c, B, T, "gpt activations");
    if (st == DT_OK) st = dt_gpt_tensor_parallel_check(c, p->ntp, "gpt activations: tensor-parallel ranks");
    if (st != DT_OK) return st;
    if (l0 < 0 || l0 > l1 || l1 > c->n_layer)
        return dt_error(DT_ERR_ARG, "gpt activations: layers [%d, %d): expected 0 <= l0 <= l1 <= n_layer (%d)",
                        l0, l1, c->n_layer);
    if (p->seq && (st = check_seq(p->ntp, B, T, "gpt activations")) != DT_OK) return st;
    dt_gpt_acts *a = calloc(1, sizeof *a);
    if (!a) return dt_error(DT_ERR_NOMEM, "gpt activations: out of memory");
    *a = (dt_gpt_acts){.c = *c, .l0 = l0, .l1 = l1, .maxB = B, .maxT = T, .B = B, .T = T, .ntp = p->ntp,
                       .seq = p->seq != 0, .recompute = p->recompute || p->forward_only, .fwd_only = p->forward_only != 0,
                       .slot = -1, .store = dt_kernels_precision()};
    // In acts_sizes' order.
    void *parts[NACTS] = {&a->resid, &a->ln1, &a->ln1_mean, &a->ln1_rstd, &a->qkv, &a->atty, &a->att,
                          &a->residual2, &a->ln2, &a->ln2_mean, &a->ln2_rstd, &a->fch, &a->fch_gelu,
                          &a->lnf, &a->lnf_mean, &a->lnf_rstd, &a->logits, &a->probs, &a->targets,
                          &a->inputs};
    size_t n[NACTS];
    a->bytes = acts_sizes(c, p, a->store != DT_F32, n);
    a->block = dt_alloc(a->bytes);
    a->saved = calloc((size_t)(l1 - l0) + 1, 1);
    if (!a->block || !a->saved) {
        dt_gpt_acts_free(a);
        return dt_error(DT_ERR_NOMEM, "gpt activations: out of memory (%zu MiB for layers [%d, %d) at B=%d T=%d)",
                        a->bytes >> 20, l0, l1, B, T);
    }
    float *at = a->block;
    for (int i = 0; i < NACTS; i++) {
        // Parts the set does not hold stay NULL. (memcpy: the int32 parts
        // get the same address as a float pointer would.)
        if (n[i]) memcpy(parts[i], &at, sizeof at);
        at += n[i];
    }
    *out = a;
    return DT_OK;
}

size_t dt_gpt_acts_size(const dt_gpt_config *c, const dt_gpt_acts_params *p) {
    size_t n[NACTS];
    return acts_sizes(c, p, dt_kernels_precision() != DT_F32, n);
}

static dt_gpt_acts_params params_of(const dt_gpt_acts *a) {
    return (dt_gpt_acts_params){a->maxB, a->maxT, a->l0, a->l1, a->ntp, a->recompute && !a->fwd_only, a->seq, a->fwd_only};
}

size_t dt_gpt_acts_saved(const dt_gpt_acts *a) {
    size_t n[NACTS];
    dt_gpt_acts_params p = params_of(a);
    return acts_sizes(&a->c, &p, 0, n) - a->bytes;
}

// The backward scratch a set of B x T of a shard of ntp needs
// (reserve_scratch), in floats.
static size_t scratch_floats(const dt_gpt_config *c, int B, int T, int ntp, int seq) {
    size_t BT = (size_t)B * T, C = c->n_embd, F = 4 * C / ntp, CF = C > F ? C : F, R = seq ? BT / ntp : BT;
    return R * C + BT * C * 2 + BT * 3 * (C / ntp) + BT * (F + CF) + BT * (c->n_head / ntp) * T + 4 * C;
}

size_t dt_gpt_activation_bytes(const dt_gpt_config *c, const dt_gpt_acts_params *p) {
    // Products of valid sizes can pass 2^64 (B and T up to 2^20 each): an
    // upper bound in double first, so that the estimate reports them rather
    // than wrap.
    double BT = (double)p->B * p->T, C = c->n_embd, L = c->n_layer;
    double bound = 4.0 * BT * ((L + 2) * (16 * C + 2.0 * c->n_head * p->T + 8) + 2.0 * c->vocab_size + 64);
    if (!(bound < 0x1p60)) return SIZE_MAX;
    return dt_gpt_acts_size(c, p) + sizeof(float) * scratch_floats(c, p->B, p->T, p->ntp, p->seq);
}

dt_status dt_gpt_acts_create(dt_gpt_acts **out, const dt_gpt_config *c, int B, int T) {
    dt_gpt_acts_params p = dt_gpt_acts_whole(c, B, T);
    return dt_gpt_acts_create_with(out, c, &p);
}

dt_status dt_gpt_acts_set_shape(dt_gpt_acts *a, int B, int T) {
    if (B < 1 || B > a->maxB || T < 1 || T > a->maxT)
        return dt_error(DT_ERR_ARG, "gpt forward: batch %d x context %d exceeds the %d x %d the activations were built for (block_size %d)",
                        B, T, a->maxB, a->maxT, a->c.block_size);
    dt_status st = a->seq ? check_seq(a->ntp, B, T, "gpt forward") : DT_OK;
    if (st != DT_OK) return st;
    a->B = B;
    a->T = T;
    a->slot = -1;
    memset(a->saved, 0, (size_t)(a->l1 - a->l0));
    a->have_inputs = a->have_targets = 0;
    return DT_OK;
}

float *dt_gpt_acts_resid(dt_gpt_acts *a, int l) {
    if (l < a->l0 || l > a->l1) return NULL;
    size_t k = a->fwd_only ? (size_t)(l - a->l0) % 2 : (size_t)(l - a->l0);
    return a->resid + k * a->B * a->T / (a->seq ? a->ntp : 1) * a->c.n_embd;
}
const float *dt_gpt_acts_logits(const dt_gpt_acts *a) { return a->logits; }
size_t dt_gpt_acts_bytes(const dt_gpt_acts *a) { return a->bytes; }

// ----------------------------------------------------------------------------
// create / free

static void free_scratch(dt_gpt *m) {
    float **bufs[] = {&m->dresidual, &m->dln, &m->datty, &m->dqkv, &m->dfch, &m->dfch_gelu, &m->datt, &m->dlnw};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
        dt_free(*bufs[i]);
        *bufs[i] = NULL;
    }
    m->scratch_bt = m->scratch_att = 0;
}

// Makes the backward scratch hold a layer of a's current shape. Grows only;
// the model's own set is reserved at create, so its backward never allocates.
static dt_status reserve_scratch(dt_gpt *m, const dt_gpt_acts *a) {
    size_t NHl = (size_t)m->c.n_head / m->ntp, BT = (size_t)a->B * a->T, att = BT * NHl * a->T, C = m->c.n_embd;
    size_t Cl = C / m->ntp, F = 4 * C / m->ntp, CF = C > F ? C : F;
    if (BT <= m->scratch_bt && att <= m->scratch_att) return DT_OK;
    if (m->scratch_bt > BT) BT = m->scratch_bt;
    if (m->scratch_att > att) att = m->scratch_att;
    free_scratch(m);
    // datty and dfch_gelu also hold a whole-width 16-bit input widened, and
    // dfch_gelu a forward's before it is rounded (C floats a token).
    // (In scratch_floats' order.)
    struct { float **p; size_t n; } want[] = {
        {&m->dresidual, (m->seq ? (BT + m->ntp - 1) / m->ntp : BT) * C}, {&m->dln, BT * C}, {&m->datty, BT * C},
        {&m->dqkv, BT * 3 * Cl}, {&m->dfch, BT * F}, {&m->dfch_gelu, BT * CF}, {&m->datt, att}, {&m->dlnw, 4 * C}};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        if (!(*want[i].p = dt_alloc(sizeof(float) * want[i].n))) {
            free_scratch(m);
            return dt_error(DT_ERR_NOMEM, "gpt backward: out of memory for the scratch of %zu tokens", BT);
        }
    m->scratch_bt = BT;
    m->scratch_att = att;
    return DT_OK;
}

void dt_gpt_free(dt_gpt *m) {
    if (!m) return;
    free(m->held);
    free(m->hranges);
    dt_free(m->params);
    dt_free(m->grads);
    free_scratch(m);
    dt_gpt_acts_free(m->acts);
    free(m->order);
    free(m);
}

dt_status dt_gpt_create(dt_gpt **out, const dt_gpt_config *c, int B, int T) {
    dt_gpt_acts_params p = dt_gpt_acts_whole(c, B, T);
    return dt_gpt_create_shard(out, c, &p, 0);
}

dt_status dt_gpt_create_shard(dt_gpt **out, const dt_gpt_config *c, const dt_gpt_acts_params *acts, int tp) {
    *out = NULL;
    int B = acts->B, T = acts->T, ntp = acts->ntp;
    dt_status st = dt_gpt_config_check(c, "gpt");
    if (st == DT_OK) st = dt_gpt_tensor_parallel_check(c, ntp, "gpt: tensor-parallel ranks");
    if (st == DT_OK && acts->seq && ntp < 2) st = check_seq(ntp, 1, 1, "gpt");
    if (st == DT_OK && (tp < 0 || tp >= ntp))
        st = dt_error(DT_ERR_ARG, "gpt: tensor-parallel rank %d of %d: expected 0 <= rank < %d", tp, ntp, ntp);
    if (st != DT_OK) return st;
    int with_acts = B != 0 || T != 0;
    if (with_acts && (st = check_batch(c, B, T, "gpt")) != DT_OK) return st;
    dt_gpt *m = calloc(1, sizeof *m);
    if (!m) return dt_error(DT_ERR_NOMEM, "gpt: out of memory");
    m->c = *c;
    m->loss_scale = 1.0f;
    m->tp = tp;
    m->ntp = ntp;
    m->seq = acts->seq != 0;
    shard_shapes(c, ntp, m->tensors);
    m->nparams = m->tensors[NPT - 1].offset + m->tensors[NPT - 1].numel;
    size_t L = c->n_layer;
    m->params = dt_alloc(sizeof(float) * m->nparams);
    m->grads = dt_alloc(sizeof(float) * m->nparams);
    m->order = malloc(sizeof(dt_grad_range) * (12 * L + 4));
    m->hranges = malloc(sizeof(dt_grad_range) * (12 * L + 4));
    if (!m->params || !m->grads || !m->order || !m->hranges) {
        dt_gpt_free(m);
        return dt_error(DT_ERR_NOMEM, "gpt: out of memory (%zu MiB of parameters and gradients)",
                        m->nparams * 8 >> 20);
    }
    dt_gpt_acts_params whole = *acts;  // the default set: every layer
    whole.l0 = 0;
    whole.l1 = c->n_layer;
    if (with_acts && ((st = dt_gpt_acts_create_with(&m->acts, c, &whole)) != DT_OK ||
                      (st = reserve_scratch(m, m->acts)) != DT_OK)) {
        dt_gpt_free(m);
        return st;
    }
    for (int i = 0; i < NPT; i++) {
        m->p[i] = m->params + m->tensors[i].offset;
        m->g[i] = m->grads + m->tensors[i].offset;
    }
    held_ranges(m);
    // The gradient order: layer by layer, as the block would be laid out if
    // it were not stacked (see grads_final).
    int n = 0;
    for (int i = WTE; i <= WPE; i++) m->order[n++] = (dt_grad_range){m->tensors[i].offset, m->tensors[i].numel};
    for (size_t l = 0; l < L; l++)
        for (int i = LN1W; i <= FCPROJB; i++) {
            size_t len = m->tensors[i].numel / L;
            m->order[n++] = (dt_grad_range){m->tensors[i].offset + l * len, len};
        }
    for (int i = LNFW; i <= LNFB; i++) m->order[n++] = (dt_grad_range){m->tensors[i].offset, m->tensors[i].numel};
    *out = m;
    return DT_OK;
}

const dt_gpt_config *dt_gpt_get_config(const dt_gpt *m) { return &m->c; }
size_t dt_gpt_num_params(const dt_gpt *m) { return m->nparams; }
float *dt_gpt_params(dt_gpt *m) { return m->params; }
float *dt_gpt_grads(dt_gpt *m) { return m->grads; }
void dt_gpt_zero_grad(dt_gpt *m) {
    for (int i = 0; i < m->nheld; i++) memset(m->grads + m->hranges[i].offset, 0, sizeof(float) * m->hranges[i].len);
}
int dt_gpt_num_tensors(const dt_gpt *m) { (void)m; return NPT; }
const dt_tensor_info *dt_gpt_tensor(const dt_gpt *m, int i) {
    return i >= 0 && i < NPT ? &m->tensors[i] : NULL;
}
const float *dt_gpt_logits(const dt_gpt *m) { return m->acts ? m->acts->logits : NULL; }
dt_gpt_acts *dt_gpt_default_acts(dt_gpt *m) { return m->acts; }
void dt_gpt_set_loss_scale(dt_gpt *m, float s) { m->loss_scale = s; }
const dt_grad_range *dt_gpt_grad_order(const dt_gpt *m, int *n) {
    *n = 12 * m->c.n_layer + 4;
    return m->order;
}
void dt_gpt_set_grad_hook(dt_gpt *m, dt_grad_ready_fn fn, void *user) {
    m->hook = fn;
    m->hook_user = user;
}
void dt_gpt_set_layer_hook(dt_gpt *m, dt_gpt_layer_fn fn, void *user) {
    m->layer_hook = fn;
    m->layer_hook_user = user;
}

// ----------------------------------------------------------------------------
// the blocks a model keeps (a pipeline stage's)

static int holds(const dt_gpt *m, int l) { return !m->held || m->held[l]; }
static int holds_embed(const dt_gpt *m) { return holds(m, 0); }
static int holds_head(const dt_gpt *m) { return holds(m, m->c.n_layer - 1); }

// Whether the model keeps element range [off, off + n) of tensor i
// (stacked tensors: whole layers).
static int keeps_tensor(const dt_gpt *m, int i) {
    return i == WTE ? holds_embed(m) || holds_head(m) : i == WPE ? holds_embed(m) : i >= LNFW ? holds_head(m) : 1;
}

static void held_ranges(dt_gpt *m) {
    int L = m->c.n_layer, n = 0;
    dt_grad_range *r = m->hranges;
    for (int i = 0; i < NPT; i++) {
        const dt_tensor_info *t = &m->tensors[i];
        if (!keeps_tensor(m, i) || !t->numel) continue;
        if (i < LN1W || i > FCPROJB) {
            r[n++] = (dt_grad_range){t->offset, t->numel};
            continue;
        }
        size_t per = t->numel / (size_t)L;
        for (int l = 0; l < L;) {
            if (!holds(m, l)) {
                l++;
                continue;
            }
            int e = l;
            while (e < L && holds(m, e)) e++;
            r[n++] = (dt_grad_range){t->offset + (size_t)l * per, (size_t)(e - l) * per};
            l = e;
        }
    }
    // adjacent ranges as one
    int k = 0;
    for (int i = 0; i < n; i++)
        if (k && r[k - 1].offset + r[k - 1].len == r[i].offset) r[k - 1].len += r[i].len;
        else r[k++] = r[i];
    m->nheld = k;
}

dt_status dt_gpt_set_held(dt_gpt *m, const unsigned char *held) {
    int L = m->c.n_layer, any = 0;
    for (int l = 0; held && l < L; l++) any |= held[l];
    if (held && !any) return dt_error(DT_ERR_ARG, "gpt: a model that keeps none of its %d blocks", L);
    free(m->held);
    m->held = NULL;
    if (held && !(m->held = malloc((size_t)L))) return dt_error(DT_ERR_NOMEM, "gpt: out of memory");
    if (held) memcpy(m->held, held, (size_t)L);
    held_ranges(m);
    if (held) {  // (dt_grad_range is two size_t: the pairs dt_pages_unused takes)
        dt_pages_unused(m->params, sizeof(float), m->nparams, (const size_t *)m->hranges, m->nheld);
        dt_pages_unused(m->grads, sizeof(float), m->nparams, (const size_t *)m->hranges, m->nheld);
    }
    return DT_OK;
}

const dt_grad_range *dt_gpt_held_ranges(const dt_gpt *m, int *n) {
    *n = m->nheld;
    return m->hranges;
}

// ----------------------------------------------------------------------------
// tensor parallel: shards of the whole block

int dt_gpt_tensor_split(int i) {
    return i == WTE || i == QKVW || i == QKVB || i == ATTPROJW || i == FCW || i == FCB || i == FCPROJW;
}

// Where shard tp of ntp's part of tensor i lies: fn(user, local, whole, n)
// for each run of n floats at offset `local` of the shard's tensor and
// `whole` of the whole model's, in increasing order of both.
typedef void (*run_fn)(void *user, size_t local, size_t whole, size_t n);
static void shard_runs(const dt_gpt_config *c, int tp, int ntp, int i, run_fn fn, void *user) {
    size_t L = c->n_layer, C = c->n_embd, Cl = C / ntp, F = 4 * C / ntp, r = tp;
    size_t row = (i == QKVW || i == FCW) ? C : 1;
    dt_tensor_info w[NPT];
    shard_shapes(c, 1, w);
    switch (ntp > 1 ? i : -1) {
    case WTE: fn(user, 0, r * (w[i].numel / ntp), w[i].numel / ntp); break;
    case QKVW:
    case QKVB:  // each of q, k, v: the columns of this rank's heads
        for (size_t l = 0; l < L; l++)
            for (size_t part = 0; part < 3; part++)
                fn(user, (l * 3 + part) * Cl * row, (l * 3 * C + part * C + r * Cl) * row, Cl * row);
        break;
    case FCW:
    case FCB:
        for (size_t l = 0; l < L; l++) fn(user, l * F * row, (l * 4 * C + r * F) * row, F * row);
        break;
    case ATTPROJW:  // the rows of the inputs this rank holds
        for (size_t l = 0; l < L; l++)
            for (size_t o = 0; o < C; o++) fn(user, (l * C + o) * Cl, (l * C + o) * C + r * Cl, Cl);
        break;
    case FCPROJW:
        for (size_t l = 0; l < L; l++)
            for (size_t o = 0; o < C; o++) fn(user, (l * C + o) * F, (l * C + o) * 4 * C + r * F, F);
        break;
    default: fn(user, 0, 0, w[i].numel);  // replicated (or the whole model)
    }
}

// The runs of tensor i that model m keeps (dt_gpt_set_held): shard_runs
// cut to the held ranges of its block.
typedef struct {
    run_fn fn;
    void *user;
    const dt_gpt *m;
    size_t base;  // the tensor's offset in m's block
} held_run;

static void held_one(void *user, size_t local, size_t whole, size_t n) {
    held_run *u = user;
    size_t a0 = u->base + local, b0 = a0 + n;
    for (int k = 0; k < u->m->nheld; k++) {
        const dt_grad_range *h = &u->m->hranges[k];
        size_t a = h->offset > a0 ? h->offset : a0, b = h->offset + h->len < b0 ? h->offset + h->len : b0;
        if (a < b) u->fn(u->user, local + (a - a0), whole + (a - a0), b - a);
    }
}

static void held_runs(const dt_gpt *m, int i, run_fn fn, void *user) {
    if (!keeps_tensor(m, i)) return;
    held_run u = {fn, user, m, m->tensors[i].offset};
    shard_runs(&m->c, m->tp, m->ntp, i, m->held ? held_one : fn, m->held ? (void *)&u : user);
}

// A run of a part against a range [lo, hi) of the whole block: the part
// of [base + whole, base + whole + n) inside it, copied out of the part
// (fill) or into it (take).
typedef struct {
    float *local;
    size_t base, lo, hi;  // the tensor's offset in the whole block; the range
    float *buf;           // [hi - lo]
    int into;             // take: into the part
} range_run;

static void range_one(void *user, size_t local, size_t whole, size_t n) {
    range_run *u = user;
    size_t a = u->base + whole, b = a + n;
    a = a > u->lo ? a : u->lo;
    b = b < u->hi ? b : u->hi;
    if (a >= b) return;
    float *l = u->local + local + (a - u->base - whole), *w = u->buf + (a - u->lo);
    memcpy(u->into ? l : w, u->into ? w : l, sizeof(float) * (b - a));
}

// (fill: what every shard holds whole is shard 0's alone, and the tied wte
// the embedding's, where the model keeps the head without it)
static void part_range(const dt_gpt *m, float *local, size_t lo, size_t hi, float *buf, int into) {
    dt_tensor_info w[NPT];
    shard_shapes(&m->c, 1, w);
    for (int i = 0; i < NPT; i++) {
        if (w[i].offset >= hi || w[i].offset + w[i].numel <= lo) continue;
        if (!into && ((m->tp > 0 && !dt_gpt_tensor_split(i)) || (i == WTE && !holds_embed(m)))) continue;
        range_run u = {local + m->tensors[i].offset, w[i].offset, lo, hi, buf, into};
        held_runs(m, i, range_one, &u);
    }
}

// The runs in whole-block coordinates: the tensor's offsets added.
typedef struct {
    dt_gpt_run_fn fn;
    void *user;
    size_t local, whole;  // tensor i's offset in m's block and in the whole model's
} block_run;

static void block_one(void *user, size_t local, size_t whole, size_t n) {
    block_run *u = user;
    u->fn(u->user, u->local + local, u->whole + whole, n);
}

void dt_gpt_part_runs(const dt_gpt *m, dt_gpt_run_fn fn, void *user) {
    dt_tensor_info w[NPT];
    shard_shapes(&m->c, 1, w);
    for (int i = 0; i < NPT; i++) {
        block_run u = {fn, user, m->tensors[i].offset, w[i].offset};
        held_runs(m, i, block_one, &u);
    }
}

void dt_gpt_part_fill(const dt_gpt *m, const float *local, size_t lo, size_t hi, float *buf) {
    part_range(m, (float *)local, lo, hi, buf, 0);
}

void dt_gpt_part_take(const dt_gpt *m, float *local, size_t lo, size_t hi, const float *buf) {
    part_range(m, local, lo, hi, (float *)buf, 1);
}

// ----------------------------------------------------------------------------
// initialisation

// A piece [lo, lo + n) of a whole tensor, and the part's copy of what of
// it falls in its runs and in the block's elements [wlo, whi)
// (dt_gpt_init_range).
typedef struct {
    const float *piece;
    size_t lo, n;
    float *params;  // the block; the tensor's local part starts at base in it
    size_t base, wlo, whi;
} init_run;

static void init_one(void *user, size_t local, size_t whole, size_t n) {
    init_run *u = user;
    size_t a = whole > u->lo ? whole : u->lo, b = whole + n < u->lo + u->n ? whole + n : u->lo + u->n;
    if (a >= b) return;
    size_t at = u->base + local - whole;  // (whole element e sits at e + at of the block)
    size_t x = a + at > u->wlo ? a + at : u->wlo, y = b + at < u->whi ? b + at : u->whi;
    if (x < y) memcpy(u->params + x, u->piece + (x - at - u->lo), sizeof(float) * (y - x));
}

#define INIT_PIECE ((size_t)1 << 18)  // floats of the whole model's values made at a time

// GPT-2's initialisation: the whole model's values drawn in block order
// from one stream (a shard, or a model that keeps some blocks, keeps its
// parts of them, drawing the rest: the same numbers as the whole model's,
// without ever holding it).
static void init_shard(dt_gpt *m, uint64_t seed, float *piece, size_t wlo, size_t whi) {
    const dt_gpt_config *c = &m->c;
    dt_tensor_info w[NPT];
    shard_shapes(c, 1, w);
    dt_rng r;
    dt_rng_seed(&r, seed);
    float resid_std = 0.02f / sqrtf(2.0f * c->n_layer);
    for (int i = 0; i < m->nheld; i++) {
        size_t a = m->hranges[i].offset, b = a + m->hranges[i].len;
        a = a > wlo ? a : wlo;
        b = b < whi ? b : whi;
        if (a < b) memset(m->params + a, 0, sizeof(float) * (b - a));
    }
    for (int i = 0; i < NPT; i++) {
        size_t n = i == WTE ? (size_t)c->vocab_size * c->n_embd : w[i].numel;  // wte's padding rows stay 0
        int one = i == LN1W || i == LN2W || i == LNFW;
        int normal = i == WTE || i == WPE || i == QKVW || i == FCW || i == ATTPROJW || i == FCPROJW;
        float sd = (i == ATTPROJW || i == FCPROJW) ? resid_std : 0.02f;
        for (size_t lo = 0; (one || normal) && lo < n; lo += INIT_PIECE) {
            init_run u = {piece, lo, n - lo < INIT_PIECE ? n - lo : INIT_PIECE, m->params,
                          (size_t)(m->p[i] - m->params), wlo, whi};
            for (size_t j = 0; j < u.n; j++) piece[j] = one ? 1.0f : sd * dt_rng_normal(&r);
            held_runs(m, i, init_one, &u);
            dt_alive();  // (drawing a large model's stream goes on: not a hang)
        }
    }
}

dt_status dt_gpt_init(dt_gpt *m, uint64_t seed) { return dt_gpt_init_range(m, seed, 0, SIZE_MAX); }

dt_status dt_gpt_init_range(dt_gpt *m, uint64_t seed, size_t lo, size_t hi) {
    float *piece = malloc(sizeof(float) * INIT_PIECE);
    if (!piece) return dt_error(DT_ERR_NOMEM, "gpt init: out of memory");
    init_shard(m, seed, piece, lo, hi);
    free(piece);
    return DT_OK;
}

int dt_gpt_shard(const dt_gpt *m, int *ntp) {
    *ntp = m->ntp;
    return m->tp;
}

int dt_gpt_seq(const dt_gpt *m) { return m->seq; }

void dt_gpt_set_reduce(dt_gpt *m, dt_gpt_reduce_fn fn, void *user) {
    m->reduce = fn;
    m->reduce_user = user;
}

// A collective over the shards (dt_gpt_coll); nothing for the whole model.
static dt_status tp_coll(dt_gpt *m, dt_gpt_coll op, const float *send, float *recv, size_t n) {
    if (m->ntp == 1) return DT_OK;
    if (!m->reduce)
        return dt_error(DT_ERR_ARG, "gpt: tensor-parallel shard %d of %d has no reduce function (dt_gpt_set_reduce)",
                        m->tp, m->ntp);
    return m->reduce(op, send, recv, n, m->reduce_user);
}

// Sums (max = 1: maxes) buf over the shards in place.
static dt_status tp_reduce(dt_gpt *m, float *buf, size_t n, int max) {
    return tp_coll(m, max ? DT_GPT_MAX : DT_GPT_SUM, buf, buf, n);
}

// Sequence parallel: the rows of the B*T tokens this shard holds (all of
// them without).
static int stream_rows(const dt_gpt *m, int BT) { return m->seq ? BT / m->ntp : BT; }

// Sequence parallel: every shard's rows[R, C] into whole[BT, C] (the
// input of a column-parallel linear, or a row-parallel linear's output
// gradient); returns the rows to read: whole, or rows themselves without.
static dt_status gather_rows(dt_gpt *m, const float *rows, float *whole, int BT, const float **out) {
    *out = rows;
    if (!m->seq) return DT_OK;
    *out = whole;
    return tp_coll(m, DT_GPT_ALLGATHER, rows, whole, (size_t)stream_rows(m, BT) * m->c.n_embd);
}

// The shards' partial sums part[BT, C] (a row-parallel linear's output, or
// a column-parallel linear's input gradient) summed: over all the rows in
// place, or sequence-parallel reduce-scattered into this shard's rows
// rows[R, C] (rows may be part).
static dt_status sum_rows(dt_gpt *m, float *part, float *rows, int BT) {
    size_t C = m->c.n_embd;
    if (!m->seq) return tp_reduce(m, part, (size_t)BT * C, 0);
    return tp_coll(m, DT_GPT_REDUCE_SCATTER, part, rows, (size_t)stream_rows(m, BT) * C);
}

// Sequence parallel: the layernorm weights' gradients of the shard's rows,
// dlnw[n] (n = 2C a layernorm), summed over the shards and added to the
// gradients g[k] (k = 0..n/C-1, C floats each): the same on every shard.
static dt_status add_ln_grads(dt_gpt *m, float *const *g, int n) {
    dt_status st = tp_reduce(m, m->dlnw, (size_t)n, 0);
    size_t C = m->c.n_embd;
    for (int k = 0; st == DT_OK && k < n / (int)C; k++)
        for (size_t i = 0; i < C; i++) g[k][i] += m->dlnw[k * C + i];
    return st;
}

// ----------------------------------------------------------------------------
// stages: checks, views and hooks

// One layer's parameters (or gradients: the same views into the other block).
typedef struct {
    float *ln1w, *ln1b, *qkvw, *qkvb, *attprojw, *attprojb, *ln2w, *ln2b, *fcw, *fcb, *fcprojw, *fcprojb;
} layer_params;

// In a shard of ntp: qkvw [L,3C/ntp,C], attprojw [L,C,C/ntp], fcw
// [L,4C/ntp,C], fcprojw [L,C,4C/ntp] and their split biases.
static layer_params layer_params_of(float *const t[NPT], int l, size_t C, int ntp) {
    size_t lC = (size_t)l * C, Cl = C / ntp;
    return (layer_params){t[LN1W] + lC, t[LN1B] + lC, t[QKVW] + lC * 3 * Cl, t[QKVB] + 3 * l * Cl,
                          t[ATTPROJW] + lC * Cl, t[ATTPROJB] + lC, t[LN2W] + lC, t[LN2B] + lC,
                          t[FCW] + lC * 4 * Cl, t[FCB] + 4 * l * Cl, t[FCPROJW] + lC * 4 * Cl, t[FCPROJB] + lC};
}

// One layer's saved activations at the set's current shape. ln1, atty,
// ln2 and fchg are floats, or 16-bit elements of the set's store.
typedef struct {
    float *ln1_mean, *ln1_rstd, *qkv, *att, *res2, *ln2_mean, *ln2_rstd, *fch;
    void *ln1, *atty, *ln2, *fchg;
} layer_acts;

static layer_acts layer_acts_of(const dt_gpt_acts *a, int l) {
    size_t i = a->recompute ? 0 : (size_t)(l - a->l0), BT = (size_t)a->B * a->T, C = a->c.n_embd;
    size_t R = a->seq ? BT / a->ntp : BT, rC = R * C;  // the stream's rows
    size_t sCl = BT * C / a->ntp, sF = 4 * sCl, es = a->store == DT_F32 ? 4 : 2;
    size_t satt = BT * (a->c.n_head / a->ntp) * a->T;
    return (layer_acts){a->ln1_mean + i * R, a->ln1_rstd + i * R, a->qkv + i * 3 * sCl, a->att + i * satt,
                        a->residual2 + i * rC, a->ln2_mean + i * R, a->ln2_rstd + i * R, a->fch + i * sF,
                        (char *)a->ln1 + i * rC * es, (char *)a->atty + i * sCl * es, (char *)a->ln2 + i * rC * es,
                        (char *)a->fch_gelu + i * sF * es};
}

// a belongs to m and holds the part a stage needs: the embedding, the head,
// or layers [l0, l1), a non-empty range.
enum { EMBED, LAYERS, HEAD };
static dt_status check_stage(const dt_gpt *m, const dt_gpt_acts *a, int part, int l0, int l1, const char *what) {
    int L = m->c.n_layer;
    if (memcmp(&a->c, &m->c, sizeof m->c))
        return dt_error(DT_ERR_ARG, "%s: the activations were created for another model config", what);
    if (a->ntp != m->ntp)
        return dt_error(DT_ERR_ARG, "%s: the activations were sized for %d tensor-parallel shards, the model is one of %d",
                        what, a->ntp, m->ntp);
    if (a->seq != m->seq)
        return dt_error(DT_ERR_ARG, "%s: the activations were made %s sequence parallel, the model %s", what,
                        a->seq ? "for" : "without", m->seq ? "runs it" : "does not run it");
    if (part == EMBED && a->l0 != 0)
        return dt_error(DT_ERR_ARG, "%s: the activations hold layers [%d, %d), without the embedding (only a set from layer 0 has it)",
                        what, a->l0, a->l1);
    if (part == HEAD && a->l1 != L)
        return dt_error(DT_ERR_ARG, "%s: the activations hold layers [%d, %d), without the head (only a set up to layer %d has it)",
                        what, a->l0, a->l1, L);
    if (part == LAYERS && (l0 >= l1 || l0 < a->l0 || l1 > a->l1))
        return dt_error(DT_ERR_ARG, "%s: layers [%d, %d): expected a non-empty range within the activations' layers [%d, %d)",
                        what, l0, l1, a->l0, a->l1);
    return DT_OK;
}

// A backward call's set: one that keeps what backward reads.
static dt_status backward_set(const dt_gpt_acts *a, const char *what) {
    return a->fwd_only ? dt_error(DT_ERR_ARG, "%s: the activations are a forward-only set (forward_only = 1)", what) : DT_OK;
}

static dt_status layer_hook(dt_gpt *m, int layer, dt_gpt_phase phase) {
    return m->layer_hook ? m->layer_hook(layer, phase, m->layer_hook_user) : DT_OK;
}

static dt_status check_tokens(const int32_t *tok, int n, int V, const char *what) {
    for (int i = 0; i < n; i++)
        if (tok[i] < 0 || tok[i] >= V)
            return dt_error(DT_ERR_ARG, "gpt forward: %s token %d at position %d is outside the vocabulary [0, %d)",
                            what, tok[i], i, V);
    return DT_OK;
}

// ----------------------------------------------------------------------------
// forward

dt_status dt_gpt_embed_forward(dt_gpt *m, dt_gpt_acts *a, const int32_t *inputs, float *resid_out) {
    dt_status st = check_stage(m, a, EMBED, 0, 0, "gpt embed forward");
    int BT = a->B * a->T;
    if (st == DT_OK) st = check_tokens(inputs, BT, m->c.vocab_size, "input");
    if (st == DT_OK) st = layer_hook(m, DT_GPT_EMBED, DT_GPT_FORWARD);
    if (st == DT_OK && m->seq) st = reserve_scratch(m, a);
    if (st != DT_OK) return st;
    memcpy(a->inputs, inputs, sizeof(int32_t) * BT);
    if (m->ntp == 1) dt_encoder_forward(resid_out, inputs, m->p[WTE], m->p[WPE], a->B, a->T, m->c.n_embd);
    else {  // vocab-parallel: the rank that holds a token's row writes it, the others 0, summed
        // (sequence parallel: every row made, then reduce-scattered into the shard's)
        int C = m->c.n_embd, Vl = m->c.padded_vocab_size / m->ntp, v0 = m->tp * Vl;
        float *part = m->seq ? m->datty : resid_out;
        dt_encoder_split_forward(part, inputs, m->p[WTE], m->p[WPE], a->B, a->T, C, v0, Vl);
        if ((st = sum_rows(m, part, resid_out, BT)) != DT_OK) return st;
    }
    a->have_inputs = 1;
    return DT_OK;
}

// out[N,C] += b[C] on every row.
static void add_bias(float *out, const float *b, int N, int C) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++)
        for (int c = 0; c < C; c++) out[(size_t)i * C + c] += b[c];
}

// A row-parallel linear's output: the shards' partial products part[BT, C]
// summed into out (the shard's rows of the sum; out = part without
// sequence parallel), then the bias (the whole model adds it in the GEMM).
static dt_status row_parallel_sum(dt_gpt *m, float *part, float *out, const float *b, int BT, int C) {
    if (m->ntp == 1) return DT_OK;
    dt_status st = sum_rows(m, part, out, BT);
    if (st == DT_OK) add_bias(out, b, stream_rows(m, BT), C);
    return st;
}

// A linear's forward on its input x (made in fp32) that the set keeps in
// t's 16 bits at keep when t is not DT_F32: rounded once, kept, and read
// by the GEMM as kept (the bits of the GEMM's own rounding).
static void keep_linear(float *out, const float *x, void *keep, dt_dtype t, const float *w, const float *b, int BT,
                        int C, int OC) {
    if (t == DT_F32) {
        dt_linear_forward(out, x, w, b, BT, C, OC);
        return;
    }
    dt_keep16(keep, x, (size_t)BT * C, t);
    dt_linear_forward16(out, keep, w, b, BT, C, OC);
}

// The column-parallel linear after a layernorm, on its output ln (kept at
// keep). Sequence parallel: ln is the shard's rows, gathered into datty
// for the matmul, and the rows kept after it.
static dt_status ln_linear(dt_gpt *m, float *out, const float *ln, void *keep, dt_dtype t, const float *w,
                           const float *b, int BT, int OC) {
    int C = m->c.n_embd;
    if (!m->seq) {
        keep_linear(out, ln, keep, t, w, b, BT, C, OC);
        return DT_OK;
    }
    const float *x;
    dt_status st = gather_rows(m, ln, m->datty, BT, &x);
    if (st != DT_OK) return st;
    dt_linear_forward(out, x, w, b, BT, C, OC);
    if (t != DT_F32) dt_keep16(keep, ln, (size_t)stream_rows(m, BT) * C, t);
    return DT_OK;
}

// One block: out = x + attn(ln1(x)) + mlp(ln2(...)), x = residual. The
// projections are written straight into the residual sums (res2, out) and
// the add is done in place: backward never reads them. In a shard of ntp
// (Megatron's layout) the qkv and fc linears are column-parallel (this
// rank's heads, its 4C / ntp of the MLP's hidden units), the two projections
// row-parallel: one sum over the shards after each (attention, MLP).
// Sequence parallel: residual, out, the layernorms and res2 are the shard's
// R rows; each layernorm's rows are gathered (into datty, free in a
// forward and in a recomputation) for its column-parallel linear, and each
// projection is made whole there and reduce-scattered into the rows.
static dt_status layer_forward(dt_gpt *m, dt_gpt_acts *a, int l, const float *residual, float *out) {
    int B = a->B, T = a->T, C = m->c.n_embd, BT = B * T, ntp = m->ntp, R = stream_rows(m, BT);
    int Cl = C / ntp, NHl = m->c.n_head / ntp, F = 4 * C / ntp;
    size_t rC = (size_t)R * C;
    layer_acts s = layer_acts_of(a, l);
    layer_params p = layer_params_of(m->p, l, C, ntp);
    // 16-bit matmul inputs are made in fp32 in the backward scratch (free
    // during a forward), kept rounded, and read by the matmul as kept.
    dt_dtype t = a->store;
    float *tmp = m->dfch_gelu;
    float *ln1 = t != DT_F32 ? tmp : s.ln1;
    dt_layernorm_forward(ln1, s.ln1_mean, s.ln1_rstd, residual, p.ln1w, p.ln1b, R, C, 1e-5f);
    dt_status st = ln_linear(m, s.qkv, ln1, s.ln1, t, p.qkvw, p.qkvb, BT, 3 * Cl);
    if (st != DT_OK) return st;
    float *atty = t != DT_F32 ? tmp : s.atty, *proj = m->seq ? m->datty : s.res2;
    dt_attention_forward(atty, s.att, s.qkv, B, T, Cl, NHl);
    keep_linear(proj, atty, s.atty, t, p.attprojw, ntp == 1 ? p.attprojb : NULL, BT, Cl, C);
    if ((st = row_parallel_sum(m, proj, s.res2, p.attprojb, BT, C)) != DT_OK) return st;
    dt_residual_forward(s.res2, residual, s.res2, rC);
    float *ln2 = t != DT_F32 ? tmp : s.ln2;
    dt_layernorm_forward(ln2, s.ln2_mean, s.ln2_rstd, s.res2, p.ln2w, p.ln2b, R, C, 1e-5f);
    if ((st = ln_linear(m, s.fch, ln2, s.ln2, t, p.fcw, p.fcb, BT, F)) != DT_OK) return st;
    float *fchg = t != DT_F32 ? tmp : s.fchg;
    proj = m->seq ? m->datty : out;
    dt_gelu_forward(fchg, s.fch, (size_t)BT * F);
    keep_linear(proj, fchg, s.fchg, t, p.fcprojw, ntp == 1 ? p.fcprojb : NULL, BT, F, C);
    if ((st = row_parallel_sum(m, proj, out, p.fcprojb, BT, C)) != DT_OK) return st;
    dt_residual_forward(out, s.res2, out, rC);
    return DT_OK;
}

dt_status dt_gpt_forward_range(dt_gpt *m, dt_gpt_acts *a, int l0, int l1, const float *resid_in,
                               float *resid_out) {
    dt_status st = check_stage(m, a, LAYERS, l0, l1, "gpt forward_range");
    if (st != DT_OK) return st;
    if (a->store != DT_F32 && dt_kernels_precision() != a->store)
        return dt_error(DT_ERR_ARG, "gpt forward_range: the activations keep matmul inputs in %s, the kernels run %s "
                        "(make the set in the precision it runs in)", dt_dtype_name(a->store),
                        dt_dtype_name(dt_kernels_precision()));
    // (the 16-bit inputs' room; sequence parallel: the gathered rows')
    if ((a->store != DT_F32 || m->seq) && (st = reserve_scratch(m, a)) != DT_OK) return st;
    if (resid_in == resid_out && !a->fwd_only)  // (forwards alone: only each layer's own input and output differ)
        return dt_error(DT_ERR_ARG, "gpt forward_range: resid_in and resid_out are the same buffer (backward needs the input)");
    // Layer l reads the stream before it from the set (resid_in for l0) and
    // writes the one after it there (resid_out for l1-1).
    for (int l = l0; l < l1; l++) {
        if ((st = layer_hook(m, l, DT_GPT_FORWARD)) != DT_OK) return st;
        st = layer_forward(m, a, l, l == l0 ? resid_in : dt_gpt_acts_resid(a, l),
                           l == l1 - 1 ? resid_out : dt_gpt_acts_resid(a, l + 1));
        if (st != DT_OK) return st;
        a->saved[l - a->l0] = 1;
        a->slot = l;
    }
    return DT_OK;
}

int dt_gpt_head_vocab(const dt_gpt *m, int *v0) {
    int Vl = m->c.padded_vocab_size / m->ntp, left = m->c.vocab_size - m->tp * Vl;
    *v0 = m->tp * Vl;
    return left < 0 ? 0 : left < Vl ? left : Vl;
}

// Softmax cross-entropy over logits [N, V] that the shards hold in columns
// of Vl each (targets[N] shifted to this shard's columns): the row maxima
// and then the sums of exponentials and the target logits are reduced over
// the shards, so no rank holds a whole row. probs as dt_crossentropy_forward.
static dt_status parallel_crossentropy(dt_gpt *m, float *probs, const float *logits, const int32_t *targets,
                                       int N, int Vl, float *loss) {
    float *mx = malloc(sizeof(float) * 3 * (size_t)N), *sum = mx + N;  // sum[N], target logit[N]
    double *row = malloc(sizeof(double) * (size_t)N);
    dt_status st = mx && row ? DT_OK : dt_error(DT_ERR_NOMEM, "gpt forward: out of memory");
    if (st == DT_OK) dt_ce_split_max(mx, logits, N, Vl);
    if (st == DT_OK) st = tp_reduce(m, mx, (size_t)N, 1);
    if (st == DT_OK) dt_ce_split_exp(probs, sum, logits, mx, targets, N, Vl);
    if (st == DT_OK) st = tp_reduce(m, sum, 2 * (size_t)N, 0);
    if (st == DT_OK) *loss = dt_ce_split_finish(probs, row, mx, sum, N, Vl);
    free(mx);
    free(row);
    return st;
}

dt_status dt_gpt_head_forward(dt_gpt *m, dt_gpt_acts *a, const float *resid_in, const int32_t *targets,
                              float *loss) {
    int L = m->c.n_layer, BT = a->B * a->T, C = m->c.n_embd, V = m->c.vocab_size;
    dt_status st = check_stage(m, a, HEAD, 0, 0, "gpt head forward");
    if (st == DT_OK && targets) st = check_tokens(targets, BT, V, "target");
    if (st == DT_OK) st = layer_hook(m, L, DT_GPT_FORWARD);
    if (st == DT_OK && m->seq) st = reserve_scratch(m, a);
    a->have_targets = 0;
    if (st != DT_OK) return st;
    dt_layernorm_forward(a->lnf, a->lnf_mean, a->lnf_rstd, resid_in, m->p[LNFW], m->p[LNFB], stream_rows(m, BT), C,
                         1e-5f);
    // Tied head: the first V rows of wte are the output projection (of a
    // shard's rows, those below V: logits [BT, Vv]), on every token's row
    // (sequence parallel: gathered).
    const float *lnf;
    if ((st = gather_rows(m, a->lnf, m->datty, BT, &lnf)) != DT_OK) return st;
    int v0, Vv = dt_gpt_head_vocab(m, &v0);
    if (Vv > 0) dt_linear_forward(a->logits, lnf, m->p[WTE], NULL, BT, C, Vv);
    if (targets) {
        // The targets as this shard's columns (outside [0, Vv): another's).
        for (int i = 0; i < BT; i++) a->targets[i] = targets[i] - v0;
        a->have_targets = 1;
        float l = 0;
        if (m->ntp == 1) l = dt_crossentropy_forward(a->probs, a->logits, targets, BT, V);
        else if ((st = parallel_crossentropy(m, a->probs, a->logits, a->targets, BT, Vv, &l)) != DT_OK) return st;
        if (!isfinite(l)) return dt_error(DT_ERR_NUMERIC, "gpt forward: loss is %g", l);
        if (loss) *loss = l;
    }
    return DT_OK;
}

static dt_status no_default_acts(const char *what) {
    return dt_error(DT_ERR_ARG, "gpt %s: the model was created without activations (B = T = 0): use a dt_gpt_acts and the stage calls",
                    what);
}

dt_status dt_gpt_forward(dt_gpt *m, const int32_t *inputs, const int32_t *targets, int B, int T,
                         float *loss) {
    if (!m->acts) return no_default_acts("forward");
    return dt_gpt_forward_with(m, m->acts, inputs, targets, B, T, loss);
}

dt_status dt_gpt_forward_with(dt_gpt *m, dt_gpt_acts *a, const int32_t *inputs, const int32_t *targets, int B, int T,
                              float *loss) {
    int L = m->c.n_layer;
    dt_status st = dt_gpt_acts_set_shape(a, B, T);
    if (st == DT_OK) st = dt_gpt_embed_forward(m, a, inputs, dt_gpt_acts_resid(a, 0));
    if (st == DT_OK) st = dt_gpt_forward_range(m, a, 0, L, dt_gpt_acts_resid(a, 0), dt_gpt_acts_resid(a, L));
    if (st == DT_OK) st = dt_gpt_head_forward(m, a, dt_gpt_acts_resid(a, L), targets, loss);
    return st;
}

// ----------------------------------------------------------------------------
// backward

// Tells the grad hook that layer l's slices of the per-layer tensors from k
// (in block order) on have just been computed. Backward runs lnf, then the
// layers from L-1 down, each visiting its tensors in decreasing block order,
// then the embedding, which also completes wte (the tied head's gradient was
// its first part): so the gradient order (wte, wpe, layer 0's slices in block
// order, ..., layer L-1's, lnfw, lnfb) is final from slice (k, l) to its end.
// Its position there: wte, wpe, the l layers below and, in layer l, the
// tensors before k. (k = LNFW, l = L-1 gives lnfw's.)
static void grads_final(dt_gpt *m, int k, int l) {
    if (!m->hook) return;
    size_t L = m->c.n_layer, pos = m->tensors[WTE].numel + m->tensors[WPE].numel;
    for (int i = LN1W; i <= FCPROJB; i++) pos += (size_t)(i < k ? l + 1 : l) * (m->tensors[i].numel / L);
    m->hook(pos, m->hook_user);
}

dt_status dt_gpt_head_backward(dt_gpt *m, dt_gpt_acts *a, const float *resid_in, float *dresid) {
    int L = m->c.n_layer, BT = a->B * a->T, C = m->c.n_embd;
    dt_status st = check_stage(m, a, HEAD, 0, 0, "gpt head backward");
    if (st == DT_OK) st = backward_set(a, "gpt head backward");
    if (st == DT_OK && !a->have_targets)
        st = dt_error(DT_ERR_ARG, "gpt backward: the last forward had no targets (or was already backpropagated)");
    if (st == DT_OK) st = reserve_scratch(m, a);
    if (st == DT_OK) st = layer_hook(m, L, DT_GPT_BACKWARD);
    if (st != DT_OK) return st;
    size_t sC = (size_t)BT * C;
    int R = stream_rows(m, BT);
    // dlogits overwrites the logits (no longer needed).
    float *dlogits = a->logits;
    int v0, Vv = dt_gpt_head_vocab(m, &v0);
    const float *lnf;
    if ((st = gather_rows(m, a->lnf, m->datty, BT, &lnf)) != DT_OK) return st;
    memset(dlogits, 0, sizeof(float) * BT * Vv);
    dt_crossentropy_backward(dlogits, a->probs, a->targets, BT, Vv, m->loss_scale);
    memset(m->dln, 0, sizeof(float) * sC);
    if (Vv > 0) dt_linear_backward(m->dln, m->g[WTE], NULL, dlogits, lnf, m->p[WTE], BT, C, Vv);
    if ((st = sum_rows(m, m->dln, m->dln, BT)) != DT_OK) return st;
    memset(dresid, 0, sizeof(float) * R * C);
    // (sequence parallel: the weights' gradients of the shard's rows, then summed)
    float *dw = m->seq ? memset(m->dlnw, 0, sizeof(float) * 2 * C) : m->g[LNFW], *db = m->seq ? dw + C : m->g[LNFB];
    dt_layernorm_backward(dresid, dw, db, m->dln, resid_in, m->p[LNFW], a->lnf_mean, a->lnf_rstd, R, C);
    if (m->seq && (st = add_ln_grads(m, (float *[]){m->g[LNFW], m->g[LNFB]}, 2 * C)) != DT_OK) return st;
    grads_final(m, LNFW, L - 1);
    a->have_targets = 0;  // the logits are gone: a second backward would be wrong
    return DT_OK;
}

// A linear's backward on its input x as the set keeps it: t's 16-bit
// values (read by the weight gradient's GEMM as they are) or fp32.
static void linear_back(float *dinp, float *dw, float *db, const float *dout, const void *x, dt_dtype t,
                        const float *w, int BT, int C, int OC) {
    if (t != DT_F32) dt_linear_backward16(dinp, dw, db, dout, x, w, BT, C, OC);
    else dt_linear_backward(dinp, dw, db, dout, x, w, BT, C, OC);
}

// The backward of the column-parallel linear after a layernorm, its input
// gradient into dln. Sequence parallel: ln is the shard's rows, widened
// into dfch_gelu (free until after this) when kept in 16 bits, then
// gathered into datty.
static dt_status ln_linear_back(dt_gpt *m, const void *ln, dt_dtype t, const float *dout, float *dw, float *db,
                                const float *w, int BT, int OC) {
    int C = m->c.n_embd;
    if (!m->seq) {
        linear_back(m->dln, dw, db, dout, ln, t, w, BT, C, OC);
        return DT_OK;
    }
    size_t n = (size_t)stream_rows(m, BT) * C;
    const float *rows = t != DT_F32 ? dt_widen16(m->dfch_gelu, ln, n, t) : ln, *x;
    dt_status st = gather_rows(m, rows, m->datty, BT, &x);
    if (st == DT_OK) dt_linear_backward(m->dln, dw, db, dout, x, w, BT, C, OC);
    return st;
}

// dresid carries the gradient of the residual stream down: a residual add
// passes it through unchanged to both of its inputs, so it is both
// d(fcproj) and, after the MLP branch adds in, d(residual2).
// In a shard, the gradients of the column-parallel linears' inputs are the
// shards' partial sums: one sum over them in each of the two halves.
// Sequence parallel: dresid and the layernorms are the shard's rows. The
// row-parallel linears' backward reads every row's output gradient
// (gathered), the column-parallel weight gradients every row of their
// input (the layernorm's rows gathered again), and the input gradients'
// sums are reduce-scattered into the rows; the layernorms' weight
// gradients, of the shard's rows, are summed over the shards at the end of
// the layer, and their grad hooks wait for it.
static dt_status layer_backward(dt_gpt *m, dt_gpt_acts *a, int l, const float *residual, float *dresid) {
    int B = a->B, T = a->T, C = m->c.n_embd, BT = B * T, ntp = m->ntp, R = stream_rows(m, BT);
    int Cl = C / ntp, NHl = m->c.n_head / ntp, F = 4 * C / ntp, seq = m->seq;
    size_t sC = (size_t)BT * C, sF = (size_t)BT * F;
    layer_acts s = layer_acts_of(a, l);
    layer_params p = layer_params_of(m->p, l, C, ntp), g = layer_params_of(m->g, l, C, ntp);
    // The layernorms' weight gradients: into dlnw [ln2w, ln2b, ln1w, ln1b]
    // first, sequence-parallel.
    float *ln2w = seq ? memset(m->dlnw, 0, sizeof(float) * 4 * C) : g.ln2w, *ln2b = seq ? ln2w + C : g.ln2b;
    float *ln1w = seq ? ln2w + 2 * C : g.ln1w, *ln1b = seq ? ln2w + 3 * C : g.ln1b;

    // A 16-bit matmul input is read by its weight gradient's GEMM as kept;
    // a sequence-parallel layernorm's rows are widened into a scratch buffer
    // free until after its matmul's backward (dfch_gelu, then gathered into
    // datty).
    dt_dtype t = a->store;
    const float *dout;
    dt_status st = gather_rows(m, dresid, m->datty, BT, &dout);
    if (st != DT_OK) return st;
    memset(m->dfch_gelu, 0, sizeof(float) * sF);
    linear_back(m->dfch_gelu, g.fcprojw, g.fcprojb, dout, s.fchg, t, p.fcprojw, BT, F, C);
    grads_final(m, FCPROJW, l);
    memset(m->dfch, 0, sizeof(float) * sF);
    dt_gelu_backward(m->dfch, m->dfch_gelu, s.fch, sF);
    memset(m->dln, 0, sizeof(float) * sC);
    if ((st = ln_linear_back(m, s.ln2, t, m->dfch, g.fcw, g.fcb, p.fcw, BT, F)) != DT_OK) return st;
    grads_final(m, FCW, l);
    if ((st = sum_rows(m, m->dln, m->dln, BT)) != DT_OK) return st;
    dt_layernorm_backward(dresid, ln2w, ln2b, m->dln, s.res2, p.ln2w, s.ln2_mean, s.ln2_rstd, R, C);
    if (!seq) grads_final(m, LN2W, l);

    if ((st = gather_rows(m, dresid, m->dln, BT, &dout)) != DT_OK) return st;  // (dln is free again)
    memset(m->datty, 0, sizeof(float) * (size_t)BT * Cl);
    linear_back(m->datty, g.attprojw, g.attprojb, dout, s.atty, t, p.attprojw, BT, Cl, C);
    if (!seq) grads_final(m, ATTPROJW, l);
    memset(m->dqkv, 0, sizeof(float) * 3 * (size_t)BT * Cl);
    dt_attention_backward(m->dqkv, m->datt, m->datty, s.qkv, s.att, B, T, Cl, NHl);
    memset(m->dln, 0, sizeof(float) * sC);
    if ((st = ln_linear_back(m, s.ln1, t, m->dqkv, g.qkvw, g.qkvb, p.qkvw, BT, 3 * Cl)) != DT_OK) return st;
    if (!seq) grads_final(m, QKVW, l);
    if ((st = sum_rows(m, m->dln, m->dln, BT)) != DT_OK) return st;
    dt_layernorm_backward(dresid, ln1w, ln1b, m->dln, residual, p.ln1w, s.ln1_mean, s.ln1_rstd, R, C);
    if (seq) {
        if ((st = add_ln_grads(m, (float *[]){g.ln2w, g.ln2b, g.ln1w, g.ln1b}, 4 * C)) != DT_OK) return st;
        grads_final(m, LN2W, l);
        grads_final(m, ATTPROJW, l);
        grads_final(m, QKVW, l);
    }
    grads_final(m, LN1W, l);
    return DT_OK;
}

// Recomputation: layer l's activations made again from the stream before
// it (the same kernels on the same input: the same bits), its output into
// dln, free until the layer's backward. The layer hook has already run for
// the backward (ZeRO-3 gathered the layer).
static dt_status recompute(dt_gpt *m, dt_gpt_acts *a, int l, const float *residual) {
    if (!a->recompute || a->slot == l) return DT_OK;
    dt_status st = layer_forward(m, a, l, residual, m->dln);
    if (st == DT_OK) a->slot = l;
    return st;
}

dt_status dt_gpt_backward_range(dt_gpt *m, dt_gpt_acts *a, int l0, int l1, const float *resid_in,
                                float *dresid) {
    dt_status st = check_stage(m, a, LAYERS, l0, l1, "gpt backward_range");
    if (st == DT_OK) st = backward_set(a, "gpt backward_range");
    for (int l = l0; st == DT_OK && l < l1; l++)
        if (!a->saved[l - a->l0])
            st = dt_error(DT_ERR_ARG, "gpt backward_range: layer %d has not run forward on these activations", l);
    if (st == DT_OK) st = reserve_scratch(m, a);
    for (int l = l1 - 1; st == DT_OK && l >= l0; l--) {
        const float *in = l == l0 ? resid_in : dt_gpt_acts_resid(a, l);
        if ((st = layer_hook(m, l, DT_GPT_BACKWARD)) == DT_OK && (st = recompute(m, a, l, in)) == DT_OK)
            st = layer_backward(m, a, l, in, dresid);
    }
    return st;
}

dt_status dt_gpt_embed_backward(dt_gpt *m, dt_gpt_acts *a, const float *dresid) {
    dt_status st = check_stage(m, a, EMBED, 0, 0, "gpt embed backward");
    if (st == DT_OK) st = backward_set(a, "gpt embed backward");
    if (st == DT_OK && !a->have_inputs)
        st = dt_error(DT_ERR_ARG, "gpt embed backward: the embedding has not run forward on these activations");
    if (st == DT_OK) st = layer_hook(m, DT_GPT_EMBED, DT_GPT_BACKWARD);
    if (st == DT_OK && m->seq) st = reserve_scratch(m, a);
    // (sequence parallel: every token's row of the gradient, gathered)
    if (st == DT_OK) st = gather_rows(m, dresid, m->datty, a->B * a->T, &dresid);
    if (st != DT_OK) return st;
    if (m->ntp == 1) dt_encoder_backward(m->g[WTE], m->g[WPE], dresid, a->inputs, a->B, a->T, m->c.n_embd);
    else {  // this shard's rows of wte; wpe whole
        int Vl = m->c.padded_vocab_size / m->ntp;
        dt_encoder_split_backward(m->g[WTE], m->g[WPE], dresid, a->inputs, a->B, a->T, m->c.n_embd, m->tp * Vl, Vl);
    }
    if (m->hook) m->hook(0, m->hook_user);
    return DT_OK;
}

dt_status dt_gpt_backward(dt_gpt *m) {
    dt_gpt_acts *a = m->acts;
    if (!a) return no_default_acts("backward");
    int L = m->c.n_layer;
    // Reserved at create (a no-op): m->dresidual does not move below.
    dt_status st = reserve_scratch(m, a);
    if (st == DT_OK) st = dt_gpt_head_backward(m, a, dt_gpt_acts_resid(a, L), m->dresidual);
    if (st == DT_OK) st = dt_gpt_backward_range(m, a, 0, L, dt_gpt_acts_resid(a, 0), m->dresidual);
    if (st == DT_OK) st = dt_gpt_embed_backward(m, a, m->dresidual);
    return st;
}
