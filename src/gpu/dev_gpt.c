/* The GPT on the device (dev_model.h): nn/gpt.c's whole-model forward and
 * backward (one copy of the model, no recomputation), kernel for kernel,
 * over the same parameter and gradient blocks. A linear is the bias
 * written first and the GEMM adding onto it, as dt_linear_forward.
 *
 * In bf16 or fp16 the GEMMs and the attention's products take 16-bit
 * operands, as the CPU's GPT in that precision: the four inputs of a
 * layer's linears (ln1, the attention's output, ln2, the GELU's output) and
 * the final layernorm's output are kept in 16 bits (nn/gpt.c keeps the
 * four so too), each written in 16 bits by the kernel that makes it: the
 * layernorms, the attention, GELU (its own kernel after the fc linear's
 * GEMM, in place of cuBLASLt's GELU epilogue); x32 (the backward's dfchg,
 * unused in the forward) the fp32 room of the attention's GEMM plan and,
 * under sequence parallelism, of the layernorms' rows (gathered in fp32,
 * then converted); the output gradients are converted into dout16 (the
 * attention backward's scratch datt, unused by the linears' backward; by
 * the bias gradient's pass where there is a bias), the head's [BT, V] made
 * in 16 bits by the forward's fused cross-entropy (a vocabulary-parallel
 * shard's converted into the probabilities' buffer, which its
 * cross-entropy's backward has read by then).
 *
 * A tensor-parallel shard (dt_gpt_create_shard's model) runs nn/gpt.c's
 * shard: its heads, MLP units and vocabulary rows (Cl = C / ntp, F = 4C /
 * ntp, wte's rows [v0, v0 + Vl)), the row-parallel projections' outputs
 * and the column-parallel linears' and the head's input gradients summed
 * over the shards, the embedding and the cross-entropy
 * vocabulary-parallel, each sum on the device's buffers by the task's
 * collective over the shards (dt_dev_gpt_set_reduce: a GPUs'
 * communicator's). Sequence parallel
 * (dt_gpt_seq): the stream, the layernorms and the residual adds are the
 * shard's rows, gathered and reduce-scattered around the linears as
 * nn/gpt.c's are. */
#include "gpu/att_plan.h"
#include "gpu/dev_model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define TRY(call)                                                                                                  \
    do {                                                                                                           \
        dt_status st_ = (call);                                                                                    \
        if (st_ != DT_OK) return st_;                                                                              \
    } while (0)

enum { WTE, WPE, LN1W, LN1B, QKVW, QKVB, ATTPROJW, ATTPROJB, LN2W, LN2B, FCW, FCB, FCPROJW, FCPROJB, LNFW, LNFB,
       NPT };

typedef struct {  // one layer's saved activations; in 16 bits ln1, atty, ln2, fchg are x32 (unwritten where
                  // made in 16 bits) and *16 are kept
    float *ln1, *ln1_mean, *ln1_rstd, *qkv, *atty, *att, *res2, *ln2, *ln2_mean, *ln2_rstd, *fch, *fchg;
    void *ln1_16, *atty16, *ln2_16, *fchg16;
} layer_acts;

struct dt_dev_gpt {
    dt_dev_blocks b;
    dt_gpt_config c;
    int tp, ntp, seq;           // this shard of ntp (0 of 1: the whole model); seq: sequence parallel
    int Cl, NHl, F, Vl, Vv, v0; // its channels, heads, MLP units, head's columns (and those below V), first row
    dt_gpt_reduce_fn reduce;    // the shards' collectives (ntp > 1), on device values
    void *reduce_user;
    float *mx, *sums;           // ... the vocabulary-parallel cross-entropy's rows' maxima and sums [2 B T]
    size_t off[NPT], len[NPT];  // the tensors' offsets in the blocks, their floats
    dt_grad_ready_fn hook;      // the backward's grad hook (NULL: none)
    void *hook_user;
    int maxB, maxT, B, T;
    float loss_scale;
    float *resid;  // [L + 1, B, T, C] (a stage's: its slots r0 .. r0 + its layers; forward-only: 2, in turn)
    int r0;
    int lnf_made;  // the final layernorm made by the last block's forward (blocks_forward), not head_forward
    int fwd_only;  // the model's own activations serve evaluations alone (model parallel: the stages train):
                   // one block's for every block, two slots of the stream
    layer_acts *la;
    float *lnf, *lnf_mean, *lnf_rstd, *logits, *probs;
    void *dlogits16;  // in 16 bits: the head's output gradient's copy (the shard's: in probs' room)
    void *lnf16;
    int32_t *inputs, *targets;
    float *dresid, *dln, *datty, *dqkv, *dfch, *dfchg, *datt;  // backward's scratch, one layer's
    float *x32;    // in 16 bits: fp32 room, dfchg's, for the attention's GEMM plan's output ([BT, Cl]) and under
                   // sequence parallelism the layernorms' rows ([R, C]) before they are kept
    void *dout16;  // in 16 bits: a linear's output gradient in t ([BT, max(C, F, 3 Cl)]; datt's room)
    void *attw;    // the attention's work (dt_att_room_of: large heads' rounded factors in 16 bits), both passes'
    float *gath;   // sequence parallel: every shard's rows gathered ([BT, C]), or a projection's before its scatter
    void *gath16;  // ... and gath in 16 bits (a column-parallel linear's input)
    float *dlnw;   // ... the layernorms' weight gradients of the shard's rows ([4 C]), summed over the shards
};

// A kept activation from a: fp32 (per layer), or in 16 bits kept in t (its
// fp32 pointer x32, the room where it is made in fp32 first, if at all).
static float *kept(dt_dev_gpt *g, dt_dev_arena *a, void **h, size_t n) {
    if (g->b.t == DT_F32) return *h = NULL, dt_dev_take(a, DT_DEV_ACTS, sizeof(float) * n);
    *h = dt_dev_take(a, DT_DEV_ACTS, 2 * n);
    return g->x32;
}

// The activations of blocks [l0, l1) from arena a, both passes (counting:
// base NULL, then taking): the residual stream's slots l0 .. l1, with the
// embedding (l0 = 0) the tokens, with the head (l1 = L) its activations and
// the targets; work: the backward's scratch too, first (a stage shares its
// model's): x32 is dfchg (the backward's, free in the forward), dout16
// datt's room (the attention's backward's, free in the linears' backward).
static void acts_take(dt_dev_gpt *g, dt_dev_arena *a, int l0, int l1, int work) {
    size_t BT = (size_t)g->maxB * g->maxT, C = (size_t)g->c.n_embd, f = sizeof(float);
    size_t R = g->seq ? BT / (size_t)g->ntp : BT;  // the stream's rows (sequence parallel: the shard's)
    size_t Cl = (size_t)g->Cl, F = (size_t)g->F, V = (size_t)g->Vl;  // (the head's rows: head_ld)
    size_t CF = C > F ? C : F, wide = CF > 3 * Cl ? CF : 3 * Cl;  // (dout16 holds C, F or 3 Cl)
    size_t h16 = g->b.t != DT_F32 ? 2 * BT * wide : 0;
    dt_att_room att = dt_att_room_of(g->maxB, g->maxT, g->Cl, g->NHl, g->b.t);
    if (work) {
        g->dresid = dt_dev_take(a, DT_DEV_WORK, f * R * C);
        g->dln = dt_dev_take(a, DT_DEV_WORK, f * BT * C);
        g->datty = dt_dev_take(a, DT_DEV_WORK, f * BT * Cl);
        g->dqkv = dt_dev_take(a, DT_DEV_WORK, f * BT * 3 * Cl);
        g->dfch = dt_dev_take(a, DT_DEV_WORK, f * BT * F);
        g->dfchg = dt_dev_take(a, DT_DEV_WORK, f * BT * (h16 ? CF : F));
        g->datt = dt_dev_take(a, DT_DEV_WORK, att.scratch > h16 ? att.scratch : h16);
        g->x32 = h16 ? g->dfchg : NULL;
        g->dout16 = h16 ? g->datt : NULL;
        g->attw = att.work ? dt_dev_take(a, DT_DEV_WORK, att.work) : NULL;
        g->mx = g->ntp > 1 ? dt_dev_take(a, DT_DEV_WORK, f * 3 * BT) : NULL;
        g->sums = g->mx ? g->mx + BT : NULL;
        g->gath = g->seq ? dt_dev_take(a, DT_DEV_WORK, f * BT * C) : NULL;
        g->gath16 = g->seq && h16 ? dt_dev_take(a, DT_DEV_WORK, 2 * BT * C) : NULL;
        g->dlnw = g->seq ? dt_dev_take(a, DT_DEV_WORK, f * 4 * C) : NULL;
        // (the ops' scratch: the biases' column sums over BT rows of 3 Cl, C or F, layernorm's over the
        // stream's rows, the embedding's sort)
        dt_dev_ask_scratch(a, DT_ASK_COLSUM, BT, (int)wide, NULL);
        dt_dev_ask_scratch(a, DT_ASK_LAYERNORM, R, (int)C, NULL);
        dt_dev_ask_scratch(a, DT_ASK_ENCODER, BT, 0, NULL);
    }
    int L = g->c.n_layer;
    g->r0 = l0;
    g->resid = dt_dev_take(a, DT_DEV_ACTS, f * R * C * (size_t)(g->fwd_only ? 2 : l1 - l0 + 1));
    for (int l = l0; l < l1; l++) {
        layer_acts *s = &g->la[l];
        if (g->fwd_only && l > l0) {
            *s = g->la[l0];
            continue;
        }
        s->ln1 = kept(g, a, &s->ln1_16, R * C);
        s->ln1_mean = dt_dev_take(a, DT_DEV_ACTS, f * R);
        s->ln1_rstd = dt_dev_take(a, DT_DEV_ACTS, f * R);
        s->qkv = dt_dev_take(a, DT_DEV_ACTS, f * BT * 3 * Cl);
        s->atty = kept(g, a, &s->atty16, BT * Cl);
        s->att = dt_dev_take(a, DT_DEV_ACTS, att.saved);
        s->res2 = dt_dev_take(a, DT_DEV_ACTS, f * R * C);
        s->ln2 = kept(g, a, &s->ln2_16, R * C);
        s->ln2_mean = dt_dev_take(a, DT_DEV_ACTS, f * R);
        s->ln2_rstd = dt_dev_take(a, DT_DEV_ACTS, f * R);
        s->fch = dt_dev_take(a, DT_DEV_ACTS, f * BT * F);
        s->fchg = kept(g, a, &s->fchg16, BT * F);
    }
    if (l1 == L) {  // (sequence parallel: lnf's rows kept in fp32, gathered for the head both ways, as nn/gpt.c)
        if (g->seq) g->lnf16 = NULL, g->lnf = dt_dev_take(a, DT_DEV_ACTS, f * R * C);
        else g->lnf = kept(g, a, &g->lnf16, BT * C);
        g->lnf_mean = dt_dev_take(a, DT_DEV_ACTS, f * R);
        g->lnf_rstd = dt_dev_take(a, DT_DEV_ACTS, f * R);
        // (the probabilities: a shard's vocabulary-parallel loss alone; else the loss and its gradient are one
        // pass over the logits, crossentropy_fused)
        g->logits = dt_dev_take(a, DT_DEV_ACTS, f * BT * V);
        g->probs = g->ntp > 1 ? dt_dev_take(a, DT_DEV_ACTS, f * BT * V) : NULL;
        // (a shard's in the probabilities' room; none for the forwards alone of evaluations: g->fwd_only)
        g->dlogits16 = g->b.t == DT_F32 || g->fwd_only ? NULL
                       : g->ntp > 1                    ? (void *)g->probs
                                                       : dt_dev_take(a, DT_DEV_ACTS, 2 * BT * V);
    }
    g->inputs = l0 == 0 ? dt_dev_take(a, DT_DEV_ACTS, sizeof(int32_t) * BT) : NULL;
    g->targets = l1 == L ? dt_dev_take(a, DT_DEV_ACTS, sizeof(int32_t) * BT) : NULL;
}

// Both passes of the model's arena.
static void gpt_take(dt_dev_gpt *g) {
    dt_dev_blocks_take(&g->b, g->maxB * g->maxT);
    acts_take(g, &g->b.arena, 0, g->c.n_layer, 1);
}

// Sequence parallel (seq) divides a batch's B T tokens over ntp shards.
static dt_status seq_divides(int seq, int ntp, int B, int T) {
    if (seq && ((size_t)B * T) % (size_t)ntp)
        return dt_error(DT_ERR_ARG, "device gpt: sequence parallel: %d shards do not divide the batch's %d x %d tokens",
                        ntp, B, T);
    return DT_OK;
}

// Sequence parallel: the rows of the B T tokens this shard holds (all of
// them without).
static int rows_of(const dt_dev_gpt *g, int BT) { return g->seq ? BT / g->ntp : BT; }

// The residual stream's slot l (the input of block l; L: the last's
// output), each slot the room of the largest batch: a place that does not
// depend on the batch (a pipeline stage's stream is received into it
// before its forward).
static float *resid(const dt_dev_gpt *g, int l) {
    return g->resid + (size_t)(g->fwd_only ? l % 2 : l - g->r0) * rows_of(g, g->maxB * g->maxT) * g->c.n_embd;
}

dt_status dt_dev_gpt_create(dt_dev_gpt **out, const dt_dev *d, const dt_gpt *m, int B, int T, int nstates,
                            dt_dev_part part, dt_dtype t) {
    int ntp;
    const dt_gpt_config *c = dt_gpt_get_config(m);
    dt_gpt_shard(m, &ntp);
    *out = NULL;
    TRY(seq_divides(dt_gpt_seq(m), ntp, B, T));
    TRY(dt_att_choice_check(c->n_embd / ntp, c->n_head / ntp));
    dt_dev_gpt *g = calloc(1, sizeof *g);
    layer_acts *la = calloc((size_t)c->n_layer, sizeof *la);
    if (!g || !la) {
        free(g);
        free(la);
        *out = NULL;
        return dt_error(DT_ERR_NOMEM, "out of memory");
    }
    *g = (dt_dev_gpt){.b = dt_dev_blocks_of(d, t, dt_gpt_num_params(m), nstates, part), .c = *c,
                      .maxB = B, .maxT = T, .la = la, .fwd_only = part.held};
    g->tp = dt_gpt_shard(m, &g->ntp);
    g->seq = dt_gpt_seq(m);
    g->Cl = c->n_embd / g->ntp, g->NHl = c->n_head / g->ntp, g->F = 4 * c->n_embd / g->ntp;
    g->Vl = c->padded_vocab_size / g->ntp;
    g->b.attention = dt_att_fused(g->Cl, g->NHl) ? "fused" : "gemm";
    g->Vv = dt_gpt_head_vocab(m, &g->v0);
    for (int i = 0; i < NPT; i++) {
        g->off[i] = dt_gpt_tensor(m, i)->offset;
        g->len[i] = dt_gpt_tensor(m, i)->numel;
        size_t one = i >= LN1W && i <= FCPROJB ? g->len[i] / (size_t)c->n_layer : g->len[i];  // (a layer's)
        g->b.largest = one > g->b.largest ? one : g->b.largest;
    }
    g->b.kinds = FCPROJB - LN1W + 1;
    *out = g;
    gpt_take(g);  // (counting)
    size_t pinned = 2 * sizeof(int32_t) * (size_t)B * T;
    dt_status st = dt_dev_blocks_open(&g->b, pinned, "the device model");
    if (st != DT_OK) {
        dt_dev_gpt_free(g);
        *out = NULL;
        return st;
    }
    gpt_take(g);
    if ((st = dt_dev_arena_check(&g->b.arena, "the device model")) != DT_OK) {
        dt_dev_gpt_free(g);
        *out = NULL;
    }
    return st;
}

void dt_dev_gpt_set_reduce(dt_dev_gpt *g, dt_gpt_reduce_fn fn, void *user) {
    g->reduce = fn;
    g->reduce_user = user;
}

// The shards' collective op (nn/gpt.c's dt_gpt_coll) on device buffers.
static dt_status coll(dt_dev_gpt *g, dt_gpt_coll op, const float *send, float *recv, size_t n) {
    if (!g->reduce)
        return dt_error(DT_ERR_ARG, "device gpt: tensor-parallel shard %d of %d has no collective (dt_dev_gpt_set_reduce)",
                        g->tp, g->ntp);
    return g->reduce(op, send, recv, n, g->reduce_user);
}

// x[n] summed (max: maxed) over the shards in place.
static dt_status reduce(dt_dev_gpt *g, float *x, size_t n, int max) {
    return g->ntp == 1 ? DT_OK : coll(g, max ? DT_GPT_MAX : DT_GPT_SUM, x, x, n);
}

// Sequence parallel: every shard's rows[R, C] gathered into gath[BT, C].
static dt_status gather(dt_dev_gpt *g, const float *rows, int BT) {
    return coll(g, DT_GPT_ALLGATHER, rows, g->gath, (size_t)rows_of(g, BT) * g->c.n_embd);
}

// The shards' partial sums part[BT, C] (a row-parallel linear's output, a
// column-parallel one's input gradient) summed: in place over every row,
// or sequence-parallel reduce-scattered into this shard's rows rows[R, C]
// (rows may be part).
static dt_status sum_rows(dt_dev_gpt *g, float *part, float *rows, int BT) {
    size_t C = g->c.n_embd, n = (size_t)rows_of(g, BT) * C;
    if (!g->seq) return reduce(g, part, (size_t)BT * C, 0);
    float *mine = part + (size_t)g->tp * n;  // (in place as NCCL has it: this shard's block of part)
    TRY(coll(g, DT_GPT_REDUCE_SCATTER, part, mine, n));
    return rows == mine ? DT_OK : g->b.d->copy(rows, mine, sizeof(float) * n);
}

// A row-parallel projection's partial output part[BT, C] summed over the
// shards into out (the shard's rows of the sum; out = part without
// sequence parallel), then its bias added (the whole model's GEMM adds it
// first).
static dt_status row_parallel(dt_dev_gpt *g, float *part, float *out, const float *bias, int BT) {
    if (g->ntp == 1) return DT_OK;
    TRY(sum_rows(g, part, out, BT));
    return g->b.d->bias_forward(out, bias, (size_t)rows_of(g, BT), g->c.n_embd);
}

// Sequence parallel: the layernorms' weight gradients of the shard's rows
// (dlnw [n], n = 2 C a layernorm) summed over the shards and added to the
// gradients at offsets off[n / C] (C floats each), as nn/gpt.c's add_ln_grads.
static dt_status add_ln_grads(dt_dev_gpt *g, const size_t *off, int n) {
    size_t C = g->c.n_embd;
    TRY(reduce(g, g->dlnw, (size_t)n, 0));
    for (int k = 0; k < n / (int)C; k++) {
        float *gr = g->b.grads + off[k];
        TRY(g->b.d->residual_forward(gr, gr, g->dlnw + k * C, C));
    }
    return DT_OK;
}

void dt_dev_gpt_free(dt_dev_gpt *g) {
    if (!g) return;
    dt_dev_blocks_close(&g->b);
    free(g->la);
    free(g);
}

dt_dev_blocks *dt_dev_gpt_blocks(dt_dev_gpt *g) { return &g->b; }

// A tensor's layer l slice: its offset in the blocks (per-layer tensors are
// [L, ...], a shard's its part).
static size_t at(const dt_dev_gpt *g, int i, int l) { return g->off[i] + (size_t)l * (g->len[i] / g->c.n_layer); }

// x (fp32, [n]) as a GEMM's input: in 16 bits converted into the kept h.
static dt_status input(dt_dev_gpt *g, dt_dev_x *in, const float *x, void *h, size_t n) {
    *in = (dt_dev_x){x, h};
    return g->b.t != DT_F32 ? g->b.d->to16(h, x, n, g->b.t) : DT_OK;
}

// Sequence parallel: every shard's rows gathered (gather) as a GEMM's
// input (in 16 bits converted into gath16).
static dt_status gathered(dt_dev_gpt *g, dt_dev_x *x, const float *rows, int BT) {
    TRY(gather(g, rows, BT));
    return input(g, x, g->gath, g->gath16, (size_t)BT * g->c.n_embd);
}

// Where a layernorm writes its 16-bit output itself (its out16): the kept
// h, in 16 bits but for sequence parallel (whose rows are gathered in
// fp32); else NULL (fp32, made in ln).
static void *ln16(const dt_dev_gpt *g, void *h) { return g->b.t != DT_F32 && !g->seq ? h : NULL; }

// The column-parallel linear's input after a layernorm, its rows ln
// (fp32; in 16 bits made at h itself, ln16); sequence parallel (nn/gpt.c's
// ln_linear): the shard's rows made in ln (x32 in 16 bits) and kept
// (converted into h), every shard's gathered into gath for the matmul (in
// 16 bits converted into gath16).
static dt_status ln_input(dt_dev_gpt *g, dt_dev_x *in, const float *ln, void *h, int BT) {
    size_t C = g->c.n_embd;
    if (!g->seq) return *in = (dt_dev_x){ln, h}, DT_OK;
    if (g->b.t != DT_F32) TRY(g->b.d->to16(h, ln, (size_t)rows_of(g, BT) * C, g->b.t));
    return gathered(g, in, ln, BT);
}

// One block (nn/gpt.c's layer_forward): a shard's qkv and fc linears
// column-parallel, its two projections row-parallel (summed, then their
// biases). Sequence parallel: the stream, the layernorms and res2 are the
// shard's R rows; each layernorm's rows gathered for its linear, each
// projection made whole in gath and reduce-scattered into the rows. Each
// residual add makes the next layernorm in the same pass
// (layernorm_residual): its own ln2, and with `next` block l + 1's ln1,
// which that block's forward then takes as made (made), or after the last
// block the final layernorm (head_forward's, then lnf_made).
static dt_status layer_forward(dt_dev_gpt *g, int l, const float *residual, float *out, int made, int next) {
    const dt_dev *d = g->b.d;
    const dt_dev_blocks *b = &g->b;
    int B = g->B, T = g->T, C = g->c.n_embd, BT = B * T, F = g->F, Cl = g->Cl, whole = g->ntp == 1;
    int R = rows_of(g, BT);
    size_t rC = (size_t)R * C;
    layer_acts *s = &g->la[l];
    float *p = g->b.params, *proj = g->seq ? g->gath : s->res2;
    dt_dev_x in;
    if (!made)
        TRY(d->layernorm_forward(s->ln1, s->ln1_mean, s->ln1_rstd, residual, p + at(g, LN1W, l), p + at(g, LN1B, l),
                                 (size_t)R, C, 1e-5f, ln16(g, s->ln1_16), b->t));
    TRY(ln_input(g, &in, s->ln1, s->ln1_16, BT));
    TRY(dt_dev_linear_forward(b, s->qkv, NULL, in, at(g, QKVW, l), p + at(g, QKVB, l), BT, C, 3 * Cl));
    // (in 16 bits its output made in atty16: atty, x32, the GEMM plan's room)
    TRY(d->attention_forward(s->atty, s->att, s->qkv, g->attw, B, T, Cl, g->NHl, b->t, s->atty16));
    in = (dt_dev_x){s->atty, s->atty16};
    TRY(dt_dev_linear_forward(b, proj, NULL, in, at(g, ATTPROJW, l), whole ? p + at(g, ATTPROJB, l) : NULL, BT, Cl, C));
    TRY(row_parallel(g, proj, s->res2, p + at(g, ATTPROJB, l), BT));
    TRY(d->layernorm_residual(s->ln2, s->ln2_mean, s->ln2_rstd, s->res2, residual, s->res2, p + at(g, LN2W, l),
                              p + at(g, LN2B, l), (size_t)R, C, 1e-5f, ln16(g, s->ln2_16), b->t));
    TRY(ln_input(g, &in, s->ln2, s->ln2_16, BT));
    if (b->t == DT_F32) {
        TRY(dt_dev_linear_forward(b, s->fchg, s->fch, in, at(g, FCW, l), p + at(g, FCB, l), BT, C, F));
        in = (dt_dev_x){s->fchg, NULL};
    } else {  // (GELU's output rounded into the kept fchg16 by its own kernel: no fp32 copy)
        TRY(dt_dev_linear_forward(b, s->fch, NULL, in, at(g, FCW, l), p + at(g, FCB, l), BT, C, F));
        TRY(d->gelu_forward(NULL, s->fch, (size_t)BT * F, s->fchg16, b->t));
        in = (dt_dev_x){s->fchg, s->fchg16};
    }
    proj = g->seq ? g->gath : out;
    TRY(dt_dev_linear_forward(b, proj, NULL, in, at(g, FCPROJW, l), whole ? p + at(g, FCPROJB, l) : NULL, BT, F, C));
    TRY(row_parallel(g, proj, out, p + at(g, FCPROJB, l), BT));
    if (!next) return d->residual_forward(out, s->res2, out, rC);
    if (l + 1 == g->c.n_layer)  // (the final layernorm's, head_forward's)
        return d->layernorm_residual(g->lnf, g->lnf_mean, g->lnf_rstd, out, s->res2, out, p + g->off[LNFW],
                                     p + g->off[LNFB], (size_t)R, C, 1e-5f, ln16(g, g->lnf16), b->t);
    layer_acts *n = &g->la[l + 1];
    return d->layernorm_residual(n->ln1, n->ln1_mean, n->ln1_rstd, out, s->res2, out, p + at(g, LN1W, l + 1),
                                 p + at(g, LN1B, l + 1), (size_t)R, C, 1e-5f, ln16(g, n->ln1_16), b->t);
}

static dt_status check_tokens(const int32_t *tok, int n, int V, const char *what) {
    for (int i = 0; i < n; i++)
        if (tok[i] < 0 || tok[i] >= V)
            return dt_error(DT_ERR_ARG, "gpt forward: %s token %d at position %d is outside the vocabulary [0, %d)",
                            what, tok[i], i, V);
    return DT_OK;
}

// The tokens' checks and upload (through a pinned slot; NULL: none)
// for a batch of B x T.
static dt_status tokens(dt_dev_gpt *g, const int32_t *inputs, const int32_t *targets, int B, int T) {
    const dt_dev *d = g->b.d;
    int V = g->c.vocab_size, BT = B * T;
    if (B < 1 || B > g->maxB || T < 1 || T > g->maxT)
        return dt_error(DT_ERR_ARG, "device gpt: batch %d x %d outside 1..%d x 1..%d", B, T, g->maxB, g->maxT);
    TRY(seq_divides(g->seq, g->ntp, B, T));
    if (inputs) TRY(check_tokens(inputs, BT, V, "input"));
    if (targets) TRY(check_tokens(targets, BT, V, "target"));
    int32_t *pin;
    TRY(dt_dev_blocks_stage(&g->b, (void **)&pin));
    if (inputs) memcpy(pin, inputs, sizeof(int32_t) * (size_t)BT);
    for (int i = 0; targets && i < BT; i++) pin[BT + i] = targets[i] - g->v0;  // (a shard's columns: nn/gpt.c's)
    if (inputs) TRY(d->to_device_async(g->inputs, pin, sizeof(int32_t) * (size_t)BT));
    if (targets) TRY(d->to_device_async(g->targets, pin + BT, sizeof(int32_t) * (size_t)BT));
    TRY(dt_dev_blocks_staged(&g->b));
    g->B = B;
    g->T = T;
    return DT_OK;
}

// The embedding into slot 0, blocks [l0, l1), the head and its loss (read
// back into *loss), each after its layer hook.
static dt_status embed_forward(dt_dev_gpt *g) {
    float *p = g->b.params;
    int C = g->c.n_embd;
    TRY(dt_dev_blocks_layer(&g->b, DT_GPT_EMBED, 0));
    if (g->ntp == 1) return g->b.d->encoder_forward(resid(g, 0), g->inputs, p + g->off[WTE], p + g->off[WPE], g->B, g->T, C);
    // vocabulary-parallel: summed over the shards (sequence parallel: every row made, then reduce-scattered)
    float *part = g->seq ? g->gath : resid(g, 0);
    TRY(g->b.d->encoder_split_forward(part, g->inputs, p + g->off[WTE], p + g->off[WPE], g->B, g->T, C, g->v0, g->Vl));
    return sum_rows(g, part, resid(g, 0), g->B * g->T);
}

// The row stride of the head's logits and their gradient: the padded
// vocabulary where one rank holds the head (its rows 16-byte aligned for
// the GEMMs, which cuBLASLt's fastest kernels want; the columns from V on
// never written nor read), a shard's columns under tensor parallelism (the
// vocabulary-parallel ops' rows).
static int head_ld(const dt_dev_gpt *g) { return g->ntp > 1 ? g->Vv : g->Vl; }

// Blocks [l0, l1), each after its layer hook; a block's last residual add
// makes the next layernorm too (the next block's first, or after the last
// block the head's, which always follows it) where no hook comes between
// (a hook may gather the next layer's parameters: ZeRO stage 3).
static dt_status blocks_forward(dt_dev_gpt *g, int l0, int l1) {
    int ahead = !g->b.layer_fn, L = g->c.n_layer;
    g->lnf_made = 0;
    for (int l = l0; l < l1; l++) {
        TRY(dt_dev_blocks_layer(&g->b, l, 0));
        int next = ahead && (l + 1 < l1 || l + 1 == L);
        TRY(layer_forward(g, l, resid(g, l), resid(g, l + 1), ahead && l > l0, next));
        g->lnf_made = next && l + 1 == L;
    }
    return DT_OK;
}

static dt_status head_forward(dt_dev_gpt *g, float loss_scale, float *loss) {
    const dt_dev *d = g->b.d;
    int C = g->c.n_embd, V = g->c.vocab_size, L = g->c.n_layer, BT = g->B * g->T;
    float *p = g->b.params;
    TRY(dt_dev_blocks_layer(&g->b, L, 0));
    if (!g->lnf_made)
        TRY(d->layernorm_forward(g->lnf, g->lnf_mean, g->lnf_rstd, resid(g, L), p + g->off[LNFW], p + g->off[LNFB],
                                 (size_t)rows_of(g, BT), C, 1e-5f, ln16(g, g->lnf16), g->b.t));
    dt_dev_x in = {g->lnf, g->lnf16};  // (in 16 bits made there; sequence parallel: every token's row, gathered)
    if (g->seq) TRY(gathered(g, &in, g->lnf, BT));
    int ld = head_ld(g);
    if (g->Vv > 0)  // (the tied head: logits [BT, Vv], rows ld apart)
        TRY(dt_dev_gemm(&g->b, 0, 1, BT, g->Vv, C, 1.0f, in, C, dt_dev_weights(&g->b, g->off[WTE]), C, 0.0f,
                        g->logits, ld));
    if (g->ntp == 1) {  // (in 16 bits the gradient made in dlogits16, for the head's GEMMs: head_backward)
        TRY(d->crossentropy_fused(g->logits, g->b.row_loss, g->b.loss, g->targets, (size_t)BT, V, (size_t)ld,
                                  loss_scale, g->dlogits16, g->b.t));
    } else {  // vocabulary-parallel: the rows' maxima, then their sums, over the shards
        TRY(d->ce_split_max(g->mx, g->logits, (size_t)BT, g->Vv));
        TRY(reduce(g, g->mx, (size_t)BT, 1));
        TRY(d->ce_split_exp(g->probs, g->sums, g->logits, g->mx, g->targets, (size_t)BT, g->Vv));
        TRY(reduce(g, g->sums, 2 * (size_t)BT, 0));
        TRY(d->ce_split_finish(g->probs, g->b.row_loss, g->b.loss, g->mx, g->sums, (size_t)BT, g->Vv));
    }
    g->loss_scale = loss_scale;
    if (!loss) return DT_OK;  // (left on the device: dt_dev_loss_out)
    float l;
    TRY(d->to_host(&l, g->b.loss, sizeof l));
    *loss = l;
    if (!isfinite(l)) return dt_error(DT_ERR_NUMERIC, "gpt forward: loss is %g", l);
    return DT_OK;
}

dt_status dt_dev_gpt_forward(dt_dev_gpt *g, const int32_t *inputs, const int32_t *targets, int B, int T,
                             float loss_scale, float *loss) {
    TRY(tokens(g, inputs, targets, B, T));
    TRY(embed_forward(g));
    TRY(blocks_forward(g, 0, g->c.n_layer));
    return head_forward(g, loss_scale, loss);
}

// The grad hook, after layer l's gradient kernels of the tensors from k (in
// block order) on are queued: the gradient order (dt_gpt_grad_order) is
// final from that slice to its end (nn/gpt.c's grads_final; k = LNFW, l =
// L - 1: lnfw's).
static void grads_final(dt_dev_gpt *g, int k, int l) {
    if (!g->hook) return;
    size_t pos = g->len[WTE] + g->len[WPE];
    for (int i = LN1W; i <= FCPROJB; i++) pos += (size_t)(i < k ? l + 1 : l) * (g->len[i] / g->c.n_layer);
    g->hook(pos, g->hook_user);
}

// Layer l's gradients backed before its backward writes them (ZeRO stage
// 2's block backed on demand; else nothing to do).
static dt_status back_layer(dt_dev_gpt *g, int l) {
    for (int i = LN1W; i <= FCPROJB; i++) TRY(dt_dev_blocks_back(&g->b, at(g, i, l), g->len[i] / g->c.n_layer));
    return DT_OK;
}

// The column-parallel linear's input as its weight gradient reads it, the
// layernorm's rows x as the forward kept them: without sequence parallel
// x itself; sequence parallel (nn/gpt.c's ln_linear_back), the rows (in 16
// bits widened into wide, free until after the linear's backward) gathered
// into gath, in 16 bits converted into gath16.
static dt_status ln_x(dt_dev_gpt *g, dt_dev_x *x, dt_dev_x rows, float *wide, int BT) {
    size_t C = g->c.n_embd, n = (size_t)rows_of(g, BT) * C;
    *x = rows;
    if (!g->seq) return DT_OK;
    const float *r = rows.f;
    if (g->b.t != DT_F32) {
        TRY(g->b.d->from16(wide, rows.h, n, g->b.t));
        r = wide;
    }
    return gathered(g, x, r, BT);
}

// The row-parallel linear's output gradient: dresid (the shard's rows
// gathered into gath, sequence parallel).
static dt_status out_grad(dt_dev_gpt *g, const float **dout, int BT) {
    *dout = g->dresid;
    if (!g->seq) return DT_OK;
    *dout = g->gath;
    return gather(g, g->dresid, BT);
}

// Its backward: a shard's column-parallel linears' input gradients summed
// over the shards before their layernorms' backward. Sequence parallel
// (nn/gpt.c's layer_backward): dresid and the layernorms are the shard's
// rows, the row-parallel linears read every row's output gradient
// (gathered), the column-parallel weight gradients every row of their input
// (gathered again), the input gradients' sums are reduce-scattered into the
// rows, and the layernorms' weight gradients (the shard's rows', in dlnw:
// ln2w, ln2b, ln1w, ln1b) are summed over the shards at the layer's end,
// their grad hooks after it.
static dt_status layer_backward(dt_dev_gpt *g, int l, const float *residual) {
    const dt_dev *d = g->b.d;
    const dt_dev_blocks *b = &g->b;
    int B = g->B, T = g->T, C = g->c.n_embd, BT = B * T, F = g->F, Cl = g->Cl, seq = g->seq, R = rows_of(g, BT);
    size_t f = sizeof(float);
    layer_acts *s = &g->la[l];
    float *p = g->b.params, *gr = g->b.grads;
    void *h = g->dout16;
    const float *dout;
    dt_dev_x fchg = {s->fchg, s->fchg16}, atty = {s->atty, s->atty16}, x;
    float *ln2w = seq ? g->dlnw : gr + at(g, LN2W, l), *ln2b = seq ? g->dlnw + C : gr + at(g, LN2B, l);
    float *ln1w = seq ? g->dlnw + 2 * C : gr + at(g, LN1W, l), *ln1b = seq ? g->dlnw + 3 * C : gr + at(g, LN1B, l);
    TRY(back_layer(g, l));
    if (seq) TRY(d->memset0(g->dlnw, f * 4 * C));
    TRY(out_grad(g, &dout, BT));
    TRY(dt_dev_linear_backward(b, g->dfch, s->fch, at(g, FCPROJW, l), gr + at(g, FCPROJB, l), dout, h, fchg, BT, F,
                               C));  // (through GELU: dfch written)
    grads_final(g, FCPROJW, l);
    TRY(ln_x(g, &x, (dt_dev_x){s->ln2, s->ln2_16}, g->dfchg, BT));
    TRY(dt_dev_linear_backward(b, g->dln, NULL, at(g, FCW, l), gr + at(g, FCB, l), g->dfch, h, x, BT, C, F));
    grads_final(g, FCW, l);
    TRY(sum_rows(g, g->dln, g->dln, BT));
    TRY(d->layernorm_backward(g->dresid, ln2w, ln2b, g->dln, s->res2, p + at(g, LN2W, l), s->ln2_mean, s->ln2_rstd,
                              (size_t)R, C));
    if (!seq) grads_final(g, LN2W, l);
    TRY(out_grad(g, &dout, BT));
    TRY(dt_dev_linear_backward(b, g->datty, NULL, at(g, ATTPROJW, l), gr + at(g, ATTPROJB, l), dout, h, atty, BT, Cl,
                               C));
    if (!seq) grads_final(g, ATTPROJW, l);
    const void *out = b->t == DT_F32 ? (const void *)s->atty : s->atty16;  // (the attention's output as kept)
    TRY(d->attention_backward(g->dqkv, g->datt, g->datty, s->qkv, out, s->att, g->attw, B, T, Cl, g->NHl, b->t));
    TRY(ln_x(g, &x, (dt_dev_x){s->ln1, s->ln1_16}, g->dfchg, BT));
    TRY(dt_dev_linear_backward(b, g->dln, NULL, at(g, QKVW, l), gr + at(g, QKVB, l), g->dqkv, h, x, BT, C, 3 * Cl));
    if (!seq) grads_final(g, QKVW, l);
    TRY(sum_rows(g, g->dln, g->dln, BT));
    TRY(d->layernorm_backward(g->dresid, ln1w, ln1b, g->dln, residual, p + at(g, LN1W, l), s->ln1_mean, s->ln1_rstd,
                              (size_t)R, C));
    if (seq) {
        const size_t off[4] = {at(g, LN2W, l), at(g, LN2B, l), at(g, LN1W, l), at(g, LN1B, l)};
        TRY(add_ln_grads(g, off, 4 * C));
        grads_final(g, LN2W, l);
        grads_final(g, ATTPROJW, l);
        grads_final(g, QKVW, l);
    }
    grads_final(g, LN1W, l);
    return DT_OK;
}

// The head's backward into dresid (its gradients backed first: the tied
// wte's and the final layernorm's; the layers' are back_layer's, wpe's
// embed_backward's), the grad hook's first position. Sequence parallel:
// lnf's rows gathered for the head's weight gradient, its input gradient
// reduce-scattered into the rows, lnf's weight gradients summed over the
// shards.
static dt_status head_backward(dt_dev_gpt *g) {
    const dt_dev *d = g->b.d;
    int C = g->c.n_embd, L = g->c.n_layer, BT = g->B * g->T, R = rows_of(g, BT), seq = g->seq;
    size_t sC = (size_t)BT * C, f = sizeof(float);
    float *p = g->b.params, *gr = g->b.grads, *dlogits = g->logits;  // (the logits, or already their gradient)
    dt_dev_x lnf = {g->lnf, g->lnf16};
    TRY(dt_dev_blocks_layer(&g->b, L, 1));
    static const int head[] = {WTE, LNFW, LNFB};
    for (int i = 0; i < 3; i++) TRY(dt_dev_blocks_back(&g->b, g->off[head[i]], g->len[head[i]]));
    if (seq) TRY(gathered(g, &lnf, g->lnf, BT));
    int Vv = g->Vv, ld = head_ld(g);  // (a shard's columns: nn/gpt.c's head backward)
    // (a whole head's gradient the forward's crossentropy_fused made: over the logits, or in 16 bits in dlogits16
    // alone, which the GEMMs read with no fp32 copy)
    if (g->ntp > 1) TRY(d->memset0(dlogits, f * (size_t)BT * Vv));
    if (g->ntp == 1 && g->dlogits16) dlogits = NULL;
    if (g->ntp > 1 && Vv > 0)
        TRY(d->crossentropy_backward(dlogits, g->probs, g->targets, (size_t)BT, Vv, (size_t)Vv, g->loss_scale));
    // (a shard's in 16 bits converted, into the probabilities' room, read by now)
    if (g->dlogits16 && dlogits) TRY(d->to16(g->dlogits16, dlogits, (size_t)BT * Vv, g->b.t));
    dt_dev_x dl = {dlogits, g->dlogits16}, w = dt_dev_weights(&g->b, g->off[WTE]);
    if (Vv > 0) {  // (the tied head's GEMMs: dln = dlogits wte, wte's gradient += dlogits^T lnf)
        TRY(dt_dev_gemm(&g->b, 0, 0, BT, C, Vv, 1.0f, dl, ld, w, C, 0.0f, g->dln, C));
        TRY(dt_dev_gemm(&g->b, 1, 0, Vv, C, BT, 1.0f, dl, ld, lnf, C, 1.0f, gr + g->off[WTE], C));
    } else {
        TRY(d->memset0(g->dln, f * sC));
    }
    TRY(sum_rows(g, g->dln, g->dln, BT));
    TRY(d->memset0(g->dresid, f * (size_t)R * C));
    if (seq) TRY(d->memset0(g->dlnw, f * 2 * C));
    TRY(d->layernorm_backward(g->dresid, seq ? g->dlnw : gr + g->off[LNFW], seq ? g->dlnw + C : gr + g->off[LNFB],
                              g->dln, resid(g, L), p + g->off[LNFW], g->lnf_mean, g->lnf_rstd, (size_t)R, C));
    if (seq) {
        const size_t off[2] = {g->off[LNFW], g->off[LNFB]};
        TRY(add_ln_grads(g, off, 2 * C));
    }
    grads_final(g, LNFW, L - 1);
    return DT_OK;
}

// Blocks [l0, l1) backward from dresid, then the embedding's (wte, wpe).
static dt_status blocks_backward(dt_dev_gpt *g, int l0, int l1) {
    for (int l = l1 - 1; l >= l0; l--) {
        TRY(dt_dev_blocks_layer(&g->b, l, 1));
        TRY(layer_backward(g, l, resid(g, l)));
    }
    return DT_OK;
}

static dt_status embed_backward(dt_dev_gpt *g) {
    float *gr = g->b.grads;
    TRY(dt_dev_blocks_layer(&g->b, DT_GPT_EMBED, 1));
    TRY(dt_dev_blocks_back(&g->b, g->off[WTE], g->len[WTE]));  // (the head backed wte already where it ran)
    TRY(dt_dev_blocks_back(&g->b, g->off[WPE], g->len[WPE]));
    const float *dout;  // (sequence parallel: every token's row of the gradient, gathered)
    TRY(out_grad(g, &dout, g->B * g->T));
    if (g->ntp == 1)
        TRY(g->b.d->encoder_backward(gr + g->off[WTE], gr + g->off[WPE], dout, g->inputs, g->B, g->T, g->c.n_embd));
    else
        TRY(g->b.d->encoder_split_backward(gr + g->off[WTE], gr + g->off[WPE], dout, g->inputs, g->B, g->T,
                                           g->c.n_embd, g->v0, g->Vl));
    if (g->hook) g->hook(0, g->hook_user);
    return DT_OK;
}

dt_status dt_dev_gpt_backward(dt_dev_gpt *g, dt_grad_ready_fn hook, void *user) {
    if (g->fwd_only)
        return dt_error(DT_ERR_ARG, "device gpt: its own activations are forward-only (model parallel trains in stages)");
    if (!g->B) return dt_error(DT_ERR_ARG, "device gpt: backward needs a forward first");
    g->hook = hook;
    g->hook_user = user;
    dt_status st = head_backward(g);
    if (st == DT_OK) st = blocks_backward(g, 0, g->c.n_layer);
    if (st == DT_OK) st = embed_backward(g);
    g->hook = NULL;
    g->B = 0;
    return st;
}

// ---- pipeline stages: blocks [l0, l1) on activations of their own ----------
// As the sequential model's (dev_model.c): a twin of the model over its
// blocks and workspace, with the residual stream's slots l0 .. l1 and its
// blocks' activations (the embedding's tokens on the first stage, the
// head's on the last) in an arena of its own; the streams between stages
// (the residual stream, [B, T, C]) are its slots l0 and l1, on the device,
// and the gradients of the streams the caller's (in place, as nn/gpt.c's).

struct dt_dev_gpt_stage {
    dt_dev_gpt g;            // the twin
    dt_dev_stage_mem mem;    // its activations' arena
    int l0, l1;
};

dt_status dt_dev_gpt_stage_create(dt_dev_gpt *g, int l0, int l1, dt_dev_gpt_stage **out) {
    dt_dev_gpt_stage *s = calloc(1, sizeof *s);
    layer_acts *la = calloc((size_t)g->c.n_layer, sizeof *la);
    *out = NULL;
    if (!s || !la) {
        free(s), free(la);
        return dt_error(DT_ERR_NOMEM, "pipeline stage on the device: out of memory");
    }
    s->g = *g;  // (the blocks, the tensors' places, the backward's scratch: the model's)
    s->g.la = la;
    s->g.fwd_only = 0;
    s->mem.arena = (dt_dev_arena){.d = g->b.d};
    s->l0 = l0, s->l1 = l1;
    acts_take(&s->g, &s->mem.arena, l0, l1, 0);  // (counting)
    dt_status st = dt_dev_stage_mem_open(&s->mem, &g->b);
    if (st != DT_OK) {
        dt_dev_gpt_stage_free(s);
        return st;
    }
    acts_take(&s->g, &s->mem.arena, l0, l1, 0);
    if ((st = dt_dev_arena_check(&s->mem.arena, "a pipeline stage's activations")) != DT_OK) {
        dt_dev_gpt_stage_free(s);
        return st;
    }
    *out = s;
    return DT_OK;
}

void dt_dev_gpt_stage_free(dt_dev_gpt_stage *s) {
    if (!s) return;
    dt_dev_stage_mem_close(&s->mem);
    free(s->g.la);
    free(s);
}

void dt_dev_gpt_stage_streams(dt_dev_gpt_stage *s, float **in, float **out) {
    *in = resid(&s->g, s->l0);
    *out = resid(&s->g, s->l1);
}

dt_status dt_dev_gpt_stage_forward(dt_dev_gpt_stage *s, const int32_t *inputs, const int32_t *targets, int B, int T,
                                   float loss_scale, float *loss) {
    dt_dev_gpt *g = &s->g;
    int L = g->c.n_layer;
    g->B = 0;
    TRY(tokens(g, s->l0 == 0 ? inputs : NULL, s->l1 == L ? targets : NULL, B, T));
    if (s->l0 == 0) TRY(embed_forward(g));  // (else the stream in is in its slot already)
    TRY(blocks_forward(g, s->l0, s->l1));
    return s->l1 == L ? head_forward(g, loss_scale, loss) : DT_OK;
}

dt_status dt_dev_gpt_stage_backward(dt_dev_gpt_stage *s, float *d, float **din) {
    dt_dev_gpt *g = &s->g;
    const dt_dev *dv = g->b.d;
    if (!g->B) return dt_error(DT_ERR_ARG, "device gpt: backward needs a forward first");
    size_t bytes = sizeof(float) * (size_t)rows_of(g, g->B * g->T) * g->c.n_embd;  // (the stream: the shard's rows)
    dt_status st = s->l1 == g->c.n_layer ? head_backward(g) : dv->copy(g->dresid, d, bytes);
    if (st == DT_OK) st = blocks_backward(g, s->l0, s->l1);
    if (st == DT_OK) st = s->l0 == 0 ? embed_backward(g) : dv->copy(d, g->dresid, bytes);
    *din = s->l0 == 0 ? NULL : d;  // (dresid is the model's scratch: the gradient in d, which the caller keeps)
    g->B = 0;
    return st;
}
