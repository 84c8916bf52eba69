/* Sequential models: a list of layers over one flat parameter block and one
 * flat gradient block, with activation buffers sized for max_batch. */
#include "dtrain/nn.h"
#include "kernels/kernels.h"
#include "core/rng_hd.h"
#include "nn/nn_impl.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_SUBS 15  // the most named tensors a layer has (a block with a projection)

typedef struct {
    dt_layer_spec spec;
    int in[3], out[3];     // per-sample shapes {C,H,W}
    size_t w_off, b_off;   // offsets into the blocks (b_off == w_off if no bias)
    size_t w_n, b_n;
    float *act;            // output activations [max_batch, out]; when kept in 16 bits, dact
    float *dact;           // gradient w.r.t. act
    dt_dtype t16;          // DT_BF16/DT_F16: act is kept in 16 bits (act16), since only the linear
                           // layer after it reads it (a matmul input); the forward computes it in
                           // dact (free until the backward), DT_F32: act is the kept buffer
    uint16_t *act16;       // [max_batch, out] in t16
    float *aux;            // conv: its saved input (kernels.h save); layernorm: mean,rstd; dropout: mask
    float *aux2;           // conv: the scratch all the convolutions of the set share (not owned)
    int drop;              // act lives in dact: only the convolution after it reads it, in its forward,
                           // and it keeps its own copy (plan_drop)
    int room;              // conv: its forward may use dact as room, its backward act (kernels.h out_room)
    int keep32;            // conv: saves its input in fp32 (dt_model_set_acts16(0): the reference)
    int32_t *argmax;       // maxpool
    int blk;               // act is blocked by blk channels (kernels.h), 0: NCHW
    int fused;             // conv: applies the relu after it; relu: done by that conv,
                           // whose act it shares (relu(x) > 0 exactly where x > 0)
    int pooled;            // relu: its backward is done by the maxpool after it
    int tp;                // tensor parallel: 1 column-parallel linear or convolution (its outputs
                           // divided among the shards), 2 row-parallel (its inputs; outputs summed);
                           // 0 whole
    int part;              // its output is divided among the shards (a column-parallel layer, and the
                           // layers from it up to its row-parallel one): the shard's part of each
                           // sample is [tp n, (tp + 1) n) of the whole layer's n ntp values
    size_t ww_off, wb_off; // a shard's: the offsets of its tensors in the whole model's block
    double cnt[3];         // batchnorm (block: its bn1, bn2, downsample's): the values per channel of the
                           // last training forward's statistics (over the workers with sync)
} layer_t;

struct dt_model {
    int nlayers, max_batch, in_shape[3];
    layer_t *L;
    size_t nparams;
    unsigned char *held;        // the layers kept (dt_model_set_held; NULL: all)
    dt_grad_range *hranges;     // the block's ranges they take, nheld
    int nheld;
    float *params, *grads;
    float *probs;          // [max_batch, classes]
    const float *input;    // last forward's input
    const int32_t *targets;
    int last_B, last_train;
    int ntensors;
    dt_tensor_info *tensors;
    dt_tensor_info *wtensors;   // as the whole model has them (its shapes and offsets)
    char (*names)[48];
    uint64_t seed, drop_step;   // dropout key (dt_model_set_dropout_key)
    int64_t drop_first;
    dt_grad_ready_fn hook;
    void *hook_user;
    dt_model_layer_fn layer_hook;
    void *layer_hook_user;
    float loss_scale;
    dt_dtype store;        // the kernels' precision at create: 16-bit linear inputs in it
    float *cscratch;       // the convolutions' shared scratch
    size_t act_bytes, act_saved;  // the activations' bytes as allocated (plan_bytes), and those saved
    int tp, ntp;           // tensor parallel: this shard of ntp (0 of 1: the whole model)
    size_t nwhole;         // the whole model's parameters
    dt_model_reduce_fn reduce;
    void *reduce_user;
    dt_model_isum_fn bsum;      // batch norm's sum over the workers (dt_model_set_batch_sum)
    void *bsum_user;
    int bsync;
    int nseg, seg_cap;          // segments of the next training pass (dt_model_set_segments; 0: none)
    int *seg_len;               // [nseg] samples each
    float *seg_scale;           // [nseg] loss scales
    dt_grad_part_fn seg_fn;     // takes each segment's gradient of each tensor
    void *seg_user;
    float *seg_save;            // the convolutions' saves of each segment, at seg_off: [nlayers][3][nseg]
    size_t seg_save_n, *seg_off;
    int64_t *bacc;              // [4 maxC + 2] the sums of one batch norm
    dt_grad_range *bufs;        // the running statistics' ranges, nbufs
    int nbufs;
};

static size_t numel3(const int s[3]) { return (size_t)s[0] * s[1] * s[2]; }

// Floats per sample of a layer's output, channels padded to whole blocks
// when it is blocked.
static size_t out_numel(const layer_t *l) {
    size_t c = l->blk ? (size_t)(l->out[0] + l->blk - 1) / l->blk * l->blk : (size_t)l->out[0];
    return c * l->out[1] * l->out[2];
}

// A block's tensors in its part of the block (offsets from w_off): conv1
// [C, IC, 3, 3], bn1 (weight, bias, running mean, running var: 4C), conv2
// [C, C, 3, 3], bn2, and with a projection (stride > 1 or IC != C) the
// downsample's conv [C, IC, 1, 1] and bn.
typedef struct {
    int proj;
    size_t c1, bn1, c2, bn2, cd, bnd, total;
} block_parts;

static block_parts block_of(const layer_t *l) {
    size_t C = (size_t)l->spec.out, IC = (size_t)l->in[0];
    block_parts p = {(l->spec.stride > 1) || l->in[0] != l->spec.out, 0, 0, 0, 0, 0, 0, 0};
    p.bn1 = C * IC * 9;
    p.c2 = p.bn1 + 4 * C;
    p.bn2 = p.c2 + C * C * 9;
    p.cd = p.bn2 + 4 * C;
    p.bnd = p.cd + (p.proj ? C * IC : 0);
    p.total = p.bnd + (p.proj ? 4 * C : 0);
    return p;
}

// Works out a layer's output shape and parameter count; fails on shapes that
// do not fit, naming the layer.
static dt_status plan_layer(layer_t *l, int idx) {
    const dt_layer_spec *s = &l->spec;
    const char *kn = dt_layer_kind_name(s->kind);
    memcpy(l->out, l->in, sizeof l->out);
    l->w_n = l->b_n = 0;
    switch (s->kind) {
    case DT_LAYER_LINEAR: {
        if (s->out <= 0) return dt_error(DT_ERR_ARG, "layer %d (%s): out must be > 0", idx, kn);
        size_t inf = numel3(l->in);
        if (l->in[1] != 1 || l->in[2] != 1)
            return dt_error(DT_ERR_ARG,
                            "layer %d (%s): input is %dx%dx%d; add a flatten layer before it",
                            idx, kn, l->in[0], l->in[1], l->in[2]);
        l->w_n = (size_t)s->out * inf;
        l->b_n = s->nobias ? 0 : s->out;
        l->out[0] = s->out;
        break;
    }
    case DT_LAYER_CONV2D: {
        int K = s->kernel, S = s->stride ? s->stride : 1, P = s->pad;
        if (s->out <= 0 || K <= 0 || S <= 0 || P < 0)
            return dt_error(DT_ERR_ARG, "layer %d (%s): need out > 0, kernel > 0, stride > 0, pad >= 0",
                            idx, kn);
        int OH = (l->in[1] + 2 * P - K) / S + 1, OW = (l->in[2] + 2 * P - K) / S + 1;
        if (l->in[1] + 2 * P < K || l->in[2] + 2 * P < K)
            return dt_error(DT_ERR_ARG, "layer %d (%s): kernel %d larger than padded input %dx%d",
                            idx, kn, K, l->in[1], l->in[2]);
        l->w_n = (size_t)s->out * l->in[0] * K * K;
        l->b_n = s->nobias ? 0 : s->out;
        l->out[0] = s->out;
        l->out[1] = OH;
        l->out[2] = OW;
        break;
    }
    case DT_LAYER_MAXPOOL: {
        int K = s->kernel, S = s->stride ? s->stride : s->kernel;
        if (K <= 0 || S <= 0 || l->in[1] < K || l->in[2] < K)
            return dt_error(DT_ERR_ARG, "layer %d (%s): window %d does not fit input %dx%d", idx,
                            kn, K, l->in[1], l->in[2]);
        l->out[1] = (l->in[1] - K) / S + 1;
        l->out[2] = (l->in[2] - K) / S + 1;
        break;
    }
    case DT_LAYER_LAYERNORM:
        if (l->in[1] != 1 || l->in[2] != 1)
            return dt_error(DT_ERR_ARG, "layer %d (%s): needs a flat input (add flatten)", idx, kn);
        l->w_n = l->b_n = l->in[0];
        break;
    case DT_LAYER_DROPOUT:
        if (!(s->p >= 0.0f && s->p < 1.0f))
            return dt_error(DT_ERR_ARG, "layer %d (%s): p must be in [0, 1)", idx, kn);
        break;
    case DT_LAYER_FLATTEN:
        l->out[0] = (int)numel3(l->in);
        l->out[1] = l->out[2] = 1;
        break;
    case DT_LAYER_BATCHNORM:
        l->w_n = 4 * (size_t)l->in[0];  // weight, bias, running mean, running var
        break;
    case DT_LAYER_BLOCK: {
        int S = s->stride ? s->stride : 1;
        if (s->out <= 0 || S <= 0)
            return dt_error(DT_ERR_ARG, "layer %d (%s): need out > 0 and stride > 0", idx, kn);
        l->out[0] = s->out;
        l->out[1] = (l->in[1] - 1) / S + 1;
        l->out[2] = (l->in[2] - 1) / S + 1;
        block_parts p = block_of(l);
        l->w_n = p.total;
        break;
    }
    case DT_LAYER_AVGPOOL:
        l->out[1] = l->out[2] = 1;
        break;
    case DT_LAYER_RELU:
    case DT_LAYER_GELU:
        break;
    default:
        return dt_error(DT_ERR_ARG, "layer %d: unknown kind %d", idx, (int)s->kind);
    }
    return DT_OK;
}

// Layer i of L (a model's layers, or a pipeline stage's copy of them).
static dt_conv_shape conv_shape(const layer_t *L, int i, int B) {
    const layer_t *l = &L[i];
    const dt_layer_spec *s = &l->spec;
    dt_conv_shape c = {B, l->in[0], l->in[1], l->in[2], l->out[0], s->kernel,
                       s->stride ? s->stride : 1, s->pad, i > 0 && L[i - 1].blk, l->blk != 0,
                       l->fused, i == 0, l->room, l->keep32};
    return c;
}

// Convolution k of block layer i (0 conv1, 1 conv2, 2 the downsample's).
static dt_conv_shape block_conv(const layer_t *L, int i, int k, int B) {
    const layer_t *l = &L[i];
    int C = l->out[0], S = l->spec.stride ? l->spec.stride : 1;
    dt_conv_shape c = {B, k == 1 ? C : l->in[0], k == 1 ? l->out[1] : l->in[1], k == 1 ? l->out[2] : l->in[2], C,
                       k == 2 ? 1 : 3, k == 1 ? 1 : S, k == 2 ? 0 : 1, 0, 0, 0, i == 0 && k != 1, 0, l->keep32};
    return c;
}

// A block's buffers, carved from its aux for batches of up to B: y1, r1, y2,
// yd (with a projection), g1, g2, g3 ([B, C, OH, OW] each), st (mean and
// rstd of bn1, bn2, the downsample's: 6C), the three convolutions' saves.
// Returns the floats they take (base NULL: sizes alone); *scratch: the
// convolutions' shared scratch they need.
typedef struct {
    float *y1, *r1, *y2, *yd, *g1, *g2, *g3, *st, *s1, *s2, *sd;
} block_bufs;

static size_t block_carve(const layer_t *L, int i, int B, float *base, block_bufs *b, size_t *scratch) {
    const layer_t *l = &L[i];
    block_parts p = block_of(l);
    size_t n = (size_t)B * l->out[0] * l->out[1] * l->out[2], off = 0, sv[3], sc[3];
    for (int k = 0; k < 3; k++) {
        dt_conv_shape cs = block_conv(L, i, k, B);
        sv[k] = sc[k] = 0;
        if (k < 2 || p.proj) dt_conv_size(&cs, &sv[k], &sc[k]);
    }
    *scratch = sc[0] > sc[1] ? sc[0] : sc[1];
    if (sc[2] > *scratch) *scratch = sc[2];
    float **f[] = {&b->y1, &b->r1, &b->y2, &b->yd, &b->g1, &b->g2, &b->g3, &b->st, &b->s1, &b->s2, &b->sd};
    size_t len[] = {n, n, n, p.proj ? n : 0, n, n, n, 6 * (size_t)l->out[0], sv[0], sv[1], sv[2]};
    for (int k = 0; k < 11; k++) {
        *f[k] = base ? base + off : NULL;
        off += (len[k] + 15) / 16 * 16;  // (64-byte aligned parts)
    }
    return off;
}

// Activations stay in the convolutions' blocked layout from a convolution
// through the relu and maxpool layers after it, up to the next convolution
// or a flatten (which reorders to NCHW), where the convolutions work in it:
// this saves two reorders of each such activation per step.
static void plan_layouts(dt_model *m) {
    for (int i = 0; i < m->nlayers; i++) {
        if (m->L[i].spec.kind != DT_LAYER_CONV2D) continue;
        dt_conv_shape s = conv_shape(m->L, i, m->max_batch);
        int src, dst, j = i + 1;
        dt_conv_prefers_blocked(&s, &src, &dst);
        while (j < m->nlayers &&
               (m->L[j].spec.kind == DT_LAYER_RELU || m->L[j].spec.kind == DT_LAYER_MAXPOOL))
            j++;
        if (!dst || j == m->nlayers) continue;
        if (m->L[j].spec.kind == DT_LAYER_CONV2D) {
            s = conv_shape(m->L, j, m->max_batch);
            dt_conv_prefers_blocked(&s, &src, &dst);
            if (!src) continue;
        } else if (m->L[j].spec.kind != DT_LAYER_FLATTEN) {
            continue;
        }
        for (int k = i; k < j; k++) m->L[k].blk = DT_CONV_BLOCK;
    }
    for (int i = 0; i + 1 < m->nlayers; i++)
        // (not a row-parallel one: its relu comes after the sum over the shards)
        if (m->L[i].spec.kind == DT_LAYER_CONV2D && m->L[i].tp != 2 && m->L[i + 1].spec.kind == DT_LAYER_RELU)
            m->L[i].fused = m->L[i + 1].fused = 1;
    for (int i = 1; i + 1 < m->nlayers; i++)
        m->L[i].pooled = m->L[i].spec.kind == DT_LAYER_RELU &&
                         m->L[i + 1].spec.kind == DT_LAYER_MAXPOOL;
}

// Layers whose backward overwrites its input gradient (it is the only
// writer), so that buffer need not be cleared first.
static int sets_din(const layer_t *l) {
    dt_layer_kind k = l->spec.kind;
    return k == DT_LAYER_CONV2D || k == DT_LAYER_RELU || k == DT_LAYER_MAXPOOL ||
           k == DT_LAYER_FLATTEN;
}

// Between a blocked x[B, ceil(C/16), P, 16] and NCHW y[B, C, P] (P = H*W):
// y = x, or x = y when `back` (the padding channels of x are left alone).
static void unblock(float *y, float *x, int B, int C, int P, int back) {
    int V = DT_CONV_BLOCK, CB = (C + V - 1) / V;
#pragma omp parallel for schedule(static)
    for (int b = 0; b < B; b++)
        for (int c = 0; c < C; c++) {
            float *yc = y + ((size_t)b * C + c) * P;
            float *xc = x + ((size_t)b * CB + c / V) * P * V + c % V;
            if (back)
                for (int p = 0; p < P; p++) xc[(size_t)p * V] = yc[p];
            else
                for (int p = 0; p < P; p++) yc[p] = xc[(size_t)p * V];
        }
}

/* A layer's activation buffers; a fused relu's output is its convolution's
 * (owned there) unless own_act; a 16-bit or dropped output's act is its
 * dact; aux2 is the set's. */
static void free_layer_acts(layer_t *l, int own_act) {
    if ((own_act || !(l->spec.kind == DT_LAYER_RELU && l->fused)) && !l->t16 && !l->drop) dt_free(l->act);
    dt_free(l->act16);
    dt_free(l->dact);
    dt_free(l->aux);
    dt_free(l->argmax);
}

void dt_model_free(dt_model *m) {
    if (!m) return;
    free(m->held);
    free(m->hranges);
    for (int i = 0; i < m->nlayers; i++) free_layer_acts(&m->L[i], 0);
    dt_free(m->cscratch);
    free(m->L);
    dt_free(m->params);
    dt_free(m->grads);
    dt_free(m->probs);
    free(m->tensors);
    free(m->wtensors);
    free(m->names);
    free(m->bufs);
    free(m->bacc);
    free(m->seg_len);
    free(m->seg_scale);
    free(m->seg_off);
    dt_free(m->seg_save);
    free(m);
}

// Floats of a layer's buffers for batches of B (argmax: int32s; act16:
// 16-bit elements; act 0 when it shares its convolution's, is kept in 16
// bits or dropped; aux2: the shared scratch this convolution needs).
typedef struct { size_t act, dact, aux, aux2, argmax, act16; } layer_bufs;

static layer_bufs buffer_sizes(const layer_t *L, int i, int B) {
    const layer_t *l = &L[i];
    size_t n_out = (size_t)B * out_numel(l);
    layer_bufs z = {l->spec.kind == DT_LAYER_RELU && l->fused ? 0 : n_out, n_out, 0, 0, 0, 0};
    if (l->t16) z.act16 = n_out, z.act = 0;
    if (l->drop) z.act = 0;
    switch (l->spec.kind) {
    case DT_LAYER_CONV2D: {
        dt_conv_shape cs = conv_shape(L, i, B);
        size_t nc, nc2;
        dt_conv_size(&cs, &nc, &nc2);
        z.aux = nc;    // forward's save, read by backward
        z.aux2 = nc2;  // scratch, shared
        break;
    }
    case DT_LAYER_LAYERNORM: z.aux = 2 * (size_t)B; break;
    case DT_LAYER_BATCHNORM: z.aux = 2 * (size_t)l->in[0]; break;
    case DT_LAYER_BLOCK: {
        block_bufs bb;
        z.aux = block_carve(L, i, B, NULL, &bb, &z.aux2);
        break;
    }
    case DT_LAYER_DROPOUT: z.aux = n_out; break;
    case DT_LAYER_MAXPOOL: z.argmax = n_out; break;
    default: break;
    }
    return z;
}

static int g_acts16 = 1;  // dt_model_set_acts16
void dt_model_set_acts16(int on) { g_acts16 = on; }

// Which outputs of layers [l0, l1) are kept in 16 bits in precision t: an
// output whose only reader is the linear layer after it, whose forward and
// weight gradient round it to t anyway (so the results are the same bits);
// not the last layer's (the stream out of a stage, or the logits), not a
// relu's that shares its convolution's output (that relu's backward reads
// it in fp32). Everything else stays fp32: what relu, gelu, layernorm,
// maxpool and the loss read for their own backward, dropout's mask and
// input, a convolution's input (its forward reads it; the convolution
// keeps its own copy for its backward, kernels.h), the streams.
static void plan_half(layer_t *L, int l0, int l1, dt_dtype t) {
    if (!g_acts16) t = DT_F32;
    for (int i = 0; i < l1; i++)
        L[i].t16 = t != DT_F32 && i >= l0 && i + 1 < l1 && L[i + 1].spec.kind == DT_LAYER_LINEAR &&
                           !(L[i].spec.kind == DT_LAYER_RELU && L[i].fused)
                       ? t : DT_F32;
}

// Which outputs of layers [l0, l1) live in their gradient buffer (drop),
// free until the backward: those only a convolution's forward reads (it
// keeps its own copy of its input, kernels.h), not the stream into a
// stage, not a fused relu's (its convolution's output, which that relu's
// backward reads). And which convolutions' outputs their backward may use
// as room (room): an output the layers after it have read by then, so not
// a dropped one (it is the gradient), nor the stage's output stream or the
// logits (its own, or the fused relu's after it); their forward uses their
// gradient buffer (free until the backward, and not the output's then).
static void plan_drop(layer_t *L, int l0, int l1) {
    for (int i = 0; i < l1; i++) {
        L[i].keep32 = !g_acts16;
        L[i].drop = g_acts16 && i >= l0 && i + 1 < l1 && L[i + 1].spec.kind == DT_LAYER_CONV2D && !L[i].t16 &&
                    !(L[i].spec.kind == DT_LAYER_RELU && L[i].fused);
        L[i].room = 0;
    }
    for (int i = l0; i < l1; i++)
        L[i].room = g_acts16 && L[i].spec.kind == DT_LAYER_CONV2D && !L[i].drop && !L[i].t16 &&
                    i + (L[i].fused ? 2 : 1) < l1;
}

// The shared scratch of the convolutions among layers [l0, l1) of L, for
// batches of B: aux2 of each points into it. *out NULL when there are none.
static dt_status conv_scratch(layer_t *L, int l0, int l1, int B, float **out) {
    size_t n = 0;
    for (int i = l0; i < l1; i++) {
        layer_bufs z = buffer_sizes(L, i, B);
        if (z.aux2 > n) n = z.aux2;
    }
    *out = n ? dt_alloc(sizeof(float) * n) : NULL;
    if (n && !*out) return DT_ERR_NOMEM;
    for (int i = l0; i < l1; i++)
        if (L[i].spec.kind == DT_LAYER_CONV2D || L[i].spec.kind == DT_LAYER_BLOCK) L[i].aux2 = *out;
    return DT_OK;
}

// Bytes of the buffers of layers [l0, l1) of L for batches of B, with the
// stream into l0 (act and gradient, l0 > 0) and, with `classes`, the
// probabilities; *saved: what the 16-bit outputs save against fp32.
static size_t plan_bytes(const layer_t *L, int l0, int l1, int B, int classes, size_t *saved) {
    size_t bytes = sizeof(float) * ((size_t)B * classes), half = 0;
    size_t scratch = 0;
    if (l0 > 0) bytes += 2 * sizeof(float) * B * out_numel(&L[l0 - 1]);
    for (int i = l0; i < l1; i++) {
        layer_bufs z = buffer_sizes(L, i, B);
        bytes += sizeof(float) * (z.act + z.dact + z.aux) + sizeof(int32_t) * z.argmax +
                 sizeof(uint16_t) * z.act16;
        if (z.aux2 > scratch) scratch = z.aux2;
        half += (sizeof(float) - sizeof(uint16_t)) * z.act16;
    }
    if (saved) *saved = half;
    return bytes + sizeof(float) * scratch;
}

// Tensor parallel's pairs: a linear layer or a convolution (column-
// parallel, kind 1: its outputs divided among the shards by channel), then
// any layers that act on each channel alone (relu, gelu, max pooling,
// dropout) or keep each channel's values together (flatten: NCHW, channel
// c's H W values contiguous), then a linear layer or a convolution
// (row-parallel, kind 2: its inputs divided, its outputs summed). Any other
// layer between them (layernorm, which mixes the channels) leaves the first
// whole and the search goes on after it. Each layer in one pair at most,
// from the first layer on. Returns the number of pairs.
static int splits(dt_layer_kind k) { return k == DT_LAYER_LINEAR || k == DT_LAYER_CONV2D; }
static int per_channel(dt_layer_kind k) {
    return k == DT_LAYER_RELU || k == DT_LAYER_GELU || k == DT_LAYER_MAXPOOL || k == DT_LAYER_DROPOUT ||
           k == DT_LAYER_FLATTEN;
}

static int find_pairs(const dt_layer_spec *layers, int nlayers, int *kind) {
    int n = 0;
    for (int i = 0; i < nlayers; i++) kind[i] = 0;
    for (int i = 0; i < nlayers; i++) {
        if (!splits(layers[i].kind)) continue;
        int j = i + 1;
        while (j < nlayers && per_channel(layers[j].kind)) j++;
        if (j < nlayers && splits(layers[j].kind)) {
            kind[i] = 1, kind[j] = 2, n++;
            i = j;
        }
    }
    return n;
}

dt_status dt_model_tensor_parallel_check(const dt_layer_spec *layers, int nlayers, int ntp, const char *what) {
    int *kind = malloc(sizeof(int) * (size_t)(nlayers > 0 ? nlayers : 1));
    if (!kind) return dt_error(DT_ERR_NOMEM, "model: out of memory");
    dt_status st = DT_OK;
    if (find_pairs(layers, nlayers, kind) == 0)
        st = dt_error(DT_ERR_CONFIG, "%s = %d: the model has no two linear or conv2d layers with only relu, gelu, maxpool, dropout or flatten layers between them to split (a column-parallel layer, then a row-parallel one)",
                      what, ntp);
    for (int i = 0; i < nlayers && st == DT_OK; i++)
        if (kind[i] == 1 && layers[i].out % ntp)
            st = dt_error(DT_ERR_CONFIG, "%s = %d does not divide the %d %s of layer %d (%s out=%d), which the ranks share",
                          what, ntp, layers[i].out, layers[i].kind == DT_LAYER_CONV2D ? "output channels" : "outputs", i,
                          dt_layer_kind_name(layers[i].kind), layers[i].out);
    free(kind);
    return st;
}

// A model's plan without its buffers: shapes, offsets, layouts.
static dt_status plan_model(dt_model **out, const int in_shape[3], const dt_layer_spec *layers, int nlayers,
                            int max_batch, int tp, int ntp) {
    *out = NULL;
    if (nlayers <= 0 || max_batch <= 0)
        return dt_error(DT_ERR_ARG, "model: need at least one layer and max_batch > 0");
    if (in_shape[0] <= 0 || in_shape[1] <= 0 || in_shape[2] <= 0)
        return dt_error(DT_ERR_ARG, "model: input shape must be positive");
    dt_model *m = calloc(1, sizeof *m);
    if (!m) return dt_error(DT_ERR_NOMEM, "model: out of memory");
    m->max_batch = max_batch;
    m->loss_scale = 1.0f;
    m->tp = tp;
    m->ntp = ntp;
    memcpy(m->in_shape, in_shape, sizeof m->in_shape);
    m->L = calloc(nlayers, sizeof *m->L);
    m->tensors = calloc(MAX_SUBS * (size_t)nlayers, sizeof *m->tensors);
    m->wtensors = calloc(MAX_SUBS * (size_t)nlayers, sizeof *m->wtensors);
    m->names = calloc(MAX_SUBS * (size_t)nlayers, sizeof *m->names);
    if (m->L) m->nlayers = nlayers;
    if (!m->L || !m->tensors || !m->wtensors || !m->names) {
        dt_model_free(m);
        return dt_error(DT_ERR_NOMEM, "model: out of memory");
    }
    if (ntp > 1) {
        int *kind = malloc(sizeof(int) * (size_t)nlayers);
        if (!kind) return dt_model_free(m), dt_error(DT_ERR_NOMEM, "model: out of memory");
        find_pairs(layers, nlayers, kind);
        for (int i = 0, inside = 0; i < nlayers; i++) {
            m->L[i].tp = kind[i];
            inside = kind[i] == 1 || (inside && kind[i] != 2);
            m->L[i].part = inside;
        }
        free(kind);
    }
    size_t off = 0;
    const int *in = in_shape;
    for (int i = 0; i < nlayers; i++) {
        layer_t *l = &m->L[i];
        l->spec = layers[i];
        memcpy(l->in, in, sizeof l->in);
        if (ntp > 1 && l->tp == 1) l->spec.out /= ntp;
        dt_status st = plan_layer(l, i);
        if (st != DT_OK) {
            dt_model_free(m);
            return st;
        }
        l->w_off = off;
        off += l->w_n;
        l->b_off = off;
        off += l->b_n;
        in = l->out;
    }
    const layer_t *last = &m->L[nlayers - 1];
    if (last->out[1] != 1 || last->out[2] != 1)
        return dt_model_free(m), dt_error(DT_ERR_ARG, "model: last layer must produce a flat vector of class scores (end with linear)");
    plan_layouts(m);
    m->store = dt_kernels_precision();
    plan_half(m->L, 0, nlayers, m->store);
    plan_drop(m->L, 0, nlayers);
    m->nparams = m->nwhole = off;
    if (ntp > 1) {  // where a shard's tensors sit in the whole model's block
        dt_model *w;
        dt_status st = plan_model(&w, in_shape, layers, nlayers, 1, 0, 1);
        if (st != DT_OK) return dt_model_free(m), st;
        for (int i = 0; i < nlayers; i++) m->L[i].ww_off = w->L[i].w_off, m->L[i].wb_off = w->L[i].b_off;
        m->nwhole = w->nparams;
        dt_model_free(w);
    }
    *out = m;
    return DT_OK;
}

dt_status dt_model_memory(const int in_shape[3], const dt_layer_spec *layers, int nlayers, int max_batch,
                          size_t *nparams, size_t *act_bytes) {
    return dt_model_shard_memory(in_shape, layers, nlayers, max_batch, 1, nparams, act_bytes);
}

dt_status dt_model_shard_memory(const int in_shape[3], const dt_layer_spec *layers, int nlayers, int max_batch, int ntp,
                                size_t *nparams, size_t *act_bytes) {
    dt_model *m;
    dt_status st = ntp > 1 ? dt_model_tensor_parallel_check(layers, nlayers, ntp, "tensor parallel") : DT_OK;
    if (st == DT_OK) st = plan_model(&m, in_shape, layers, nlayers, max_batch, 0, ntp < 1 ? 1 : ntp);
    if (st != DT_OK) return st;
    *nparams = m->nparams;
    *act_bytes = plan_bytes(m->L, 0, nlayers, max_batch, m->L[nlayers - 1].out[0], NULL);
    dt_model_free(m);
    return DT_OK;
}

dt_status dt_model_create(dt_model **out, const int in_shape[3], const dt_layer_spec *layers,
                          int nlayers, int max_batch) {
    return dt_model_create_shard(out, in_shape, layers, nlayers, max_batch, 0, 1);
}

// Layer l's weight (bias: its bias) at `offset` as k shards of it make it
// (k = 1: a shard's own; the model's ntp: the whole layer's).
static void tensor_of(dt_tensor_info *t, const layer_t *l, int bias, int k, size_t offset) {
    const dt_layer_spec *s = &l->spec;
    int64_t kout = l->tp == 1 ? k : 1, kin = l->tp == 2 ? k : 1;
    *t = (dt_tensor_info){.offset = offset, .numel = (bias ? l->b_n : l->w_n) * (size_t)(bias ? kout : kout * kin)};
    if (!bias && s->kind == DT_LAYER_CONV2D) {
        t->ndim = 4;
        t->shape[0] = s->out * kout;
        t->shape[1] = l->in[0] * kin;
        t->shape[2] = t->shape[3] = s->kernel;
    } else if (!bias && s->kind == DT_LAYER_LINEAR) {
        t->ndim = 2;
        t->shape[0] = s->out * kout;
        t->shape[1] = l->in[0] * kin;
    } else {
        t->ndim = 1;
        t->shape[0] = (int64_t)t->numel;
    }
}

// The named tensors of a batchnorm or block layer (PyTorch's names after
// "<index>."), offsets from its w_off; returns how many (0 for other kinds).
typedef struct {
    char name[32];
    int ndim;
    int64_t shape[4];
    size_t off, n;
} sub_tensor;

static int bn_subs(sub_tensor *t, const char *pre, size_t off, int C) {
    static const char *const nm[] = {"weight", "bias", "running_mean", "running_var"};
    for (int k = 0; k < 4; k++) {
        t[k] = (sub_tensor){.ndim = 1, .shape = {C}, .off = off + (size_t)k * C, .n = (size_t)C};
        snprintf(t[k].name, sizeof t[k].name, "%s%s", pre, nm[k]);
    }
    return 4;
}

static int conv_sub(sub_tensor *t, const char *name, size_t off, int OC, int IC, int K) {
    *t = (sub_tensor){.ndim = 4, .shape = {OC, IC, K, K}, .off = off, .n = (size_t)OC * IC * K * K};
    snprintf(t->name, sizeof t->name, "%s", name);
    return 1;
}

static int layer_subs(const layer_t *l, sub_tensor *t) {
    if (l->spec.kind == DT_LAYER_BATCHNORM) return bn_subs(t, "", 0, l->in[0]);
    if (l->spec.kind != DT_LAYER_BLOCK) return 0;
    block_parts p = block_of(l);
    int C = l->out[0], IC = l->in[0], n = 0;
    n += conv_sub(t + n, "conv1.weight", p.c1, C, IC, 3);
    n += bn_subs(t + n, "bn1.", p.bn1, C);
    n += conv_sub(t + n, "conv2.weight", p.c2, C, C, 3);
    n += bn_subs(t + n, "bn2.", p.bn2, C);
    if (p.proj) {
        n += conv_sub(t + n, "downsample.0.weight", p.cd, C, IC, 1);
        n += bn_subs(t + n, "downsample.1.", p.bnd, C);
    }
    return n;
}

// The running statistics' ranges (the last two tensors of each batch norm).
static dt_status plan_buffers(dt_model *m) {
    sub_tensor t[MAX_SUBS];
    int n = 0, cap = 0;
    for (int i = 0; i < m->nlayers; i++) cap += layer_subs(&m->L[i], t) / 4;
    if (!cap) return DT_OK;
    if (!(m->bufs = malloc(sizeof *m->bufs * (size_t)cap))) return DT_ERR_NOMEM;
    size_t maxc = 0;
    for (int i = 0; i < m->nlayers; i++) {
        int k = layer_subs(&m->L[i], t);
        for (int j = 0; j < k; j++)
            if (strstr(t[j].name, "running_mean")) {
                m->bufs[n++] = (dt_grad_range){m->L[i].w_off + t[j].off, 2 * t[j].n};
                if (t[j].n > maxc) maxc = t[j].n;
            }
    }
    m->nbufs = n;
    return (m->bacc = malloc(sizeof(int64_t) * (4 * maxc + 2))) ? DT_OK : DT_ERR_NOMEM;
}

const dt_grad_range *dt_model_buffer_ranges(const dt_model *m, int *n) {
    *n = m->nbufs;
    return m->bufs;
}

void dt_model_set_batch_sum(dt_model *m, dt_model_isum_fn fn, void *user, int sync) {
    m->bsum = fn;
    m->bsum_user = user;
    m->bsync = fn && sync;
}

int dt_layers_have_batchnorm(const dt_layer_spec *layers, int nlayers) {
    for (int i = 0; i < nlayers; i++)
        if (layers[i].kind == DT_LAYER_BATCHNORM || layers[i].kind == DT_LAYER_BLOCK) return 1;
    return 0;
}

dt_status dt_model_create_shard(dt_model **out, const int in_shape[3], const dt_layer_spec *layers, int nlayers,
                                int max_batch, int tp, int ntp) {
    dt_model *m;
    *out = NULL;
    if (ntp < 1 || tp < 0 || tp >= ntp) return dt_error(DT_ERR_ARG, "model: shard %d of %d", tp, ntp);
    if (ntp > 1) {
        dt_status st = dt_model_tensor_parallel_check(layers, nlayers, ntp, "tensor parallel");
        if (st != DT_OK) return st;
    }
    dt_status st = plan_model(&m, in_shape, layers, nlayers, max_batch, tp, ntp);
    if (st != DT_OK) return st;
    const layer_t *last = &m->L[nlayers - 1];
    size_t off = m->nparams;
    m->params = dt_alloc(sizeof(float) * off);
    m->grads = dt_alloc(sizeof(float) * off);
    m->probs = dt_alloc(sizeof(float) * max_batch * last->out[0]);
    if (!m->params || !m->grads || !m->probs) goto nomem;

    for (int i = 0; i < nlayers; i++) {
        layer_t *l = &m->L[i];
        layer_bufs z = buffer_sizes(m->L, i, max_batch);
        l->dact = dt_alloc(sizeof(float) * z.dact);
        l->act = z.act ? dt_alloc(sizeof(float) * z.act) : l->t16 || l->drop ? l->dact : m->L[i - 1].act;
        if (!l->act || !l->dact || (z.act16 && !(l->act16 = dt_alloc(sizeof(uint16_t) * z.act16)))) goto nomem;
        if ((z.aux && !(l->aux = dt_alloc(sizeof(float) * z.aux))) ||
            (z.argmax && !(l->argmax = dt_alloc(sizeof(int32_t) * z.argmax))))
            goto nomem;
        // Named tensors, PyTorch nn.Sequential style: "<index>.weight".
        sub_tensor sub[MAX_SUBS];
        int nsub = layer_subs(l, sub);
        for (int k = 0; k < nsub; k++) {
            dt_tensor_info *ti = &m->tensors[m->ntensors];
            snprintf(m->names[m->ntensors], sizeof m->names[0], "%d.%.31s", i, sub[k].name);
            *ti = (dt_tensor_info){.name = m->names[m->ntensors], .ndim = sub[k].ndim, .offset = l->w_off + sub[k].off,
                                   .numel = sub[k].n};
            memcpy(ti->shape, sub[k].shape, sizeof ti->shape);
            m->wtensors[m->ntensors++] = *ti;
        }
        for (int bias = 0; bias < 2 && !nsub; bias++) {
            if (!(bias ? l->b_n : l->w_n)) continue;
            snprintf(m->names[m->ntensors], 32, "%d.%s", i, bias ? "bias" : "weight");
            tensor_of(&m->tensors[m->ntensors], l, bias, 1, bias ? l->b_off : l->w_off);
            tensor_of(&m->wtensors[m->ntensors], l, bias, ntp, ntp > 1 ? (bias ? l->wb_off : l->ww_off) : bias ? l->b_off : l->w_off);
            m->tensors[m->ntensors].name = m->wtensors[m->ntensors].name = m->names[m->ntensors];
            m->ntensors++;
        }
    }
    if (conv_scratch(m->L, 0, nlayers, max_batch, &m->cscratch) != DT_OK) goto nomem;
    if (plan_buffers(m) != DT_OK) goto nomem;
    m->act_bytes = plan_bytes(m->L, 0, nlayers, max_batch, m->L[nlayers - 1].out[0], &m->act_saved);
    *out = m;
    return DT_OK;
nomem:
    dt_model_free(m);
    return dt_error(DT_ERR_NOMEM, "model: out of memory allocating parameters and activations for batch %d",
                    max_batch);
}

// Where element j of layer l's whole weight (bias: its bias) lies in shard
// tp's tensor of it; SIZE_MAX: in another shard's.
static size_t local_index(const layer_t *l, int tp, int ntp, int bias, size_t j) {
    size_t n = bias ? l->b_n : l->w_n;
    if (l->tp == 1) return j / n == (size_t)tp ? j % n : SIZE_MAX;
    if (l->tp == 2 && !bias) {  // [out, ntp in] (a convolution's [out, ntp in, K, K])
        size_t in = n / (size_t)l->out[0], row = in * (size_t)ntp, c = j % row;
        return c / in == (size_t)tp ? j / row * in + c % in : SIZE_MAX;
    }
    return j;
}

// Each layer draws the whole layer's values from the one stream in block
// order; a shard keeps its part of them (and a layer the model does not
// keep draws its values all the same), so every value is the whole
// model's.
void dt_model_init(dt_model *m, uint64_t seed) {
    dt_rng r;
    dt_rng_seed(&r, seed);
    for (int i = 0; i < m->nlayers; i++) {
        layer_t *l = &m->L[i];
        float *w = m->params + l->w_off, *b = m->params + l->b_off;
        int keep = !m->held || m->held[i];
        sub_tensor sub[MAX_SUBS];
        int nsub = layer_subs(l, sub);
        for (int k = 0; k < nsub && keep; k++) {  // batch norms 1, 0, 0, 1; convolutions as below
            float *t = w + sub[k].off;
            const char *nm = sub[k].name;
            size_t fan = sub[k].ndim == 4 ? sub[k].n / (size_t)sub[k].shape[0] : 0;
            for (size_t j = 0; j < sub[k].n; j++)
                t[j] = fan ? (2.0f * dt_rng_uniform(&r) - 1.0f) / sqrtf((float)fan)
                           : strstr(nm, "weight") || strstr(nm, "running_var") ? 1.0f : 0.0f;
        }
        for (int k = 0; k < nsub && !keep; k++)  // (the same draws)
            for (size_t j = 0; sub[k].ndim == 4 && j < sub[k].n; j++) dt_rng_uniform(&r);
        if (nsub) continue;
        if (l->spec.kind == DT_LAYER_LAYERNORM) {
            for (size_t j = 0; j < l->w_n && keep; j++) w[j] = 1.0f;
            for (size_t j = 0; j < l->b_n && keep; j++) b[j] = 0.0f;
        } else if (l->w_n) {
            size_t k = l->tp ? (size_t)m->ntp : 1, kout = l->tp == 1 ? k : 1;
            float bound = 1.0f / sqrtf((float)(l->w_n * k / ((size_t)l->spec.out * kout)));  // 1/sqrt(fan in)
            for (int bias = 0; bias < 2; bias++) {
                size_t n = bias ? l->b_n * kout : l->w_n * k;
                float *t = bias ? b : w;
                for (size_t j = 0; j < n; j++) {
                    float v = (2.0f * dt_rng_uniform(&r) - 1.0f) * bound;
                    size_t q = local_index(l, m->tp, m->ntp, bias, j);
                    if (keep && q != SIZE_MAX) t[q] = v;
                }
            }
        }
    }
    m->seed = seed;
}

dt_status dt_model_set_held(dt_model *m, const unsigned char *held) {
    int any = 0, n = 0;
    for (int i = 0; held && i < m->nlayers; i++) any |= held[i];
    if (held && !any) return dt_error(DT_ERR_ARG, "model: keeps none of its %d layers", m->nlayers);
    free(m->held);
    free(m->hranges);
    m->held = held ? malloc((size_t)m->nlayers) : NULL;
    m->hranges = malloc(sizeof *m->hranges * (2 * (size_t)m->nlayers + 1));
    if ((held && !m->held) || !m->hranges) return dt_error(DT_ERR_NOMEM, "model: out of memory");
    if (held) memcpy(m->held, held, (size_t)m->nlayers);
    for (int i = 0; i < m->nlayers; i++) {
        const layer_t *l = &m->L[i];
        size_t r[2][2] = {{l->w_off, l->w_n}, {l->b_off, l->b_n}};
        for (int k = 0; k < 2; k++) {
            if ((held && !held[i]) || !r[k][1]) continue;
            if (n && m->hranges[n - 1].offset + m->hranges[n - 1].len == r[k][0]) m->hranges[n - 1].len += r[k][1];
            else m->hranges[n++] = (dt_grad_range){r[k][0], r[k][1]};
        }
    }
    m->nheld = n;
    if (held) {  // (dt_grad_range is two size_t: the pairs dt_pages_unused takes)
        dt_pages_unused(m->params, sizeof(float), m->nparams, (const size_t *)m->hranges, n);
        dt_pages_unused(m->grads, sizeof(float), m->nparams, (const size_t *)m->hranges, n);
    }
    return DT_OK;
}

const dt_grad_range *dt_model_held_ranges(const dt_model *m, int *n) {
    *n = m->nheld;
    return m->hranges;
}

size_t dt_model_num_params(const dt_model *m) { return m->nparams; }
float *dt_model_params(dt_model *m) { return m->params; }
float *dt_model_grads(dt_model *m) { return m->grads; }
int dt_model_num_classes(const dt_model *m) { return m->L[m->nlayers - 1].out[0]; }
int dt_model_input_size(const dt_model *m) { return (int)numel3(m->in_shape); }
void dt_model_set_dropout_key(dt_model *m, uint64_t step, int64_t first) {
    m->drop_step = step;
    m->drop_first = first;
}

void dt_model_set_loss_scale(dt_model *m, float s) { m->loss_scale = s; }

void dt_model_set_reduce(dt_model *m, dt_model_reduce_fn fn, void *user) {
    m->reduce = fn;
    m->reduce_user = user;
}

size_t dt_model_whole_params(const dt_model *m) { return m->nwhole; }

int dt_model_tensor_split(const dt_model *m, int i) {
    if (i < 0 || i >= m->ntensors || m->ntp == 1) return 0;
    int layer = atoi(m->tensors[i].name);
    const layer_t *l = &m->L[layer];
    // a column-parallel layer's weight and bias; a row-parallel one's weight
    return l->tp == 1 || (l->tp == 2 && m->tensors[i].offset == l->w_off && l->w_n);
}

// Where shard tp's parameters lie in the whole model's block: fn(user,
// local, whole, n) for each run of n floats. sole: the layers every shard
// holds whole are shard 0's alone (none of another shard's runs).
typedef void (*run_fn)(void *user, size_t local, size_t whole, size_t n);
static void shard_runs(const dt_model *m, int tp, int sole, run_fn fn, void *user) {
    for (int i = 0; i < m->nlayers; i++) {
        const layer_t *l = &m->L[i];
        if (m->held && !m->held[i]) continue;
        size_t wo = m->ntp > 1 ? l->ww_off : l->w_off, bo = m->ntp > 1 ? l->wb_off : l->b_off;
        size_t wn = l->w_n, bn = l->b_n;
        if (l->tp == 0 && sole && tp > 0) continue;
        // (a convolution's weight [out, in, K, K] as a matrix [out, in K K])
        if (l->tp == 1) {  // rows [tp out, (tp + 1) out) of [ntp out, in], and that slice of the bias
            wo += (size_t)tp * wn;
            bo += (size_t)tp * bn;
        }
        if (l->tp == 2) {  // columns [tp in, (tp + 1) in) of each of the out rows of [out, ntp in]
            size_t rows = (size_t)l->out[0], in = wn / rows;
            for (size_t r = 0; r < rows; r++) fn(user, l->w_off + r * in, wo + r * in * m->ntp + (size_t)tp * in, in);
            wn = 0;
            if (sole && tp > 0) bn = 0;  // the bias is whole, added by shard 0
        }
        if (wn) fn(user, l->w_off, wo, wn);
        if (bn) fn(user, l->b_off, bo, bn);
    }
}

// A run of a shard against a range [lo, hi) of the whole block, copied out
// of the shard (fill) or into it (take).
typedef struct {
    float *local;
    size_t lo, hi;
    float *buf;  // [hi - lo]
    int into;
} range_run;

static void range_one(void *user, size_t local, size_t whole, size_t n) {
    range_run *u = user;
    size_t a = whole > u->lo ? whole : u->lo, b = whole + n < u->hi ? whole + n : u->hi;
    if (a >= b) return;
    float *l = u->local + local + (a - whole), *w = u->buf + (a - u->lo);
    memcpy(u->into ? l : w, u->into ? w : l, sizeof(float) * (b - a));
}

void dt_model_shard_fill(const dt_model *m, int tp, const float *local, size_t lo, size_t hi, float *buf) {
    range_run u = {(float *)local, lo, hi, buf, 0};
    shard_runs(m, tp, 1, range_one, &u);
}

void dt_model_shard_take(const dt_model *m, int tp, float *local, size_t lo, size_t hi, const float *buf) {
    range_run u = {local, lo, hi, (float *)buf, 1};
    shard_runs(m, tp, 0, range_one, &u);
}

void dt_model_set_layer_hook(dt_model *m, dt_model_layer_fn fn, void *user) {
    m->layer_hook = fn;
    m->layer_hook_user = user;
}

void dt_model_set_grad_hook(dt_model *m, dt_grad_ready_fn fn, void *user) {
    m->hook = fn;
    m->hook_user = user;
}
int dt_model_num_tensors(const dt_model *m) { return m->ntensors; }
int dt_model_num_layers(const dt_model *m) { return m->nlayers; }
void dt_model_layer(const dt_model *m, int i, dt_model_layer_plan *out) {
    const layer_t *l = &m->L[i];
    int tp = m->ntp > 1 ? l->tp : 0;
    *out = (dt_model_layer_plan){l->spec,
                                 numel3(l->in),
                                 numel3(l->out),
                                 l->w_off,
                                 l->b_off,
                                 l->w_n,
                                 l->b_n,
                                 {l->in[0], l->in[1], l->in[2]},
                                 {l->out[0], l->out[1], l->out[2]},
                                 tp,
                                 l->b_n && !(tp == 2 && m->tp),
                                 l->part ? (size_t)m->tp * numel3(l->out) : 0};
}
const dt_tensor_info *dt_model_tensor(const dt_model *m, int i) {
    return i >= 0 && i < m->ntensors ? &m->tensors[i] : NULL;
}
const dt_tensor_info *dt_model_whole_tensor(const dt_model *m, int i) {
    return i >= 0 && i < m->ntensors ? &m->wtensors[i] : NULL;
}
const float *dt_model_logits(const dt_model *m) { return m->L[m->nlayers - 1].act; }
const float *dt_model_probs(const dt_model *m) { return m->probs; }

void dt_model_zero_grad(dt_model *m) {
    if (!m->held) memset(m->grads, 0, sizeof(float) * m->nparams);
    for (int i = 0; m->held && i < m->nheld; i++)
        memset(m->grads + m->hranges[i].offset, 0, sizeof(float) * m->hranges[i].len);
}

// ----------------------------------------------------------------------------
// segments (dt_model_set_segments): a batch run in pieces, each with the
// bits of a pass over it alone, batch norm's statistics over all of them

// Convolution k of layer i (a conv2d's: 0; a block's conv1, conv2 and
// downsample's: 0, 1, 2) for batches of B into *cs; 0 when it has none.
static int seg_conv(const layer_t *L, int i, int k, int B, dt_conv_shape *cs) {
    const layer_t *l = &L[i];
    if (l->spec.kind == DT_LAYER_CONV2D && k == 0) return *cs = conv_shape(L, i, B), 1;
    if (l->spec.kind == DT_LAYER_BLOCK && (k < 2 || block_of(l).proj)) return *cs = block_conv(L, i, k, B), 1;
    return 0;
}

dt_status dt_model_set_segments(dt_model *m, int n, const int *len, const float *scale, dt_grad_part_fn fn,
                                void *user) {
    m->nseg = 0;
    if (n <= 0) return DT_OK;
    int B = 0;
    for (int j = 0; j < n; j++) {
        if (len[j] < 1) return dt_error(DT_ERR_ARG, "model: segment %d has %d samples", j, len[j]);
        B += len[j];
    }
    if (!fn || B > m->max_batch)
        return dt_error(DT_ERR_ARG, "model: %d segments of %d samples in all (at most %d)%s", n, B, m->max_batch,
                        fn ? "" : ", no function for their gradients");
    if (n > m->seg_cap) {
        free(m->seg_len), free(m->seg_scale), free(m->seg_off);
        m->seg_len = malloc(sizeof(int) * n), m->seg_scale = malloc(sizeof(float) * n);
        m->seg_off = malloc(sizeof(size_t) * 3 * n * (size_t)m->nlayers);
        m->seg_cap = m->seg_len && m->seg_scale && m->seg_off ? n : 0;
        if (!m->seg_cap) return dt_error(DT_ERR_NOMEM, "model: segments: out of memory");
    }
    size_t off = 0, save, scratch;
    for (int i = 0; i < m->nlayers; i++)
        for (int k = 0; k < 3; k++)
            for (int j = 0; j < n; j++) {
                dt_conv_shape cs;
                m->seg_off[((size_t)i * 3 + k) * n + j] = off;
                if (seg_conv(m->L, i, k, len[j], &cs)) dt_conv_size(&cs, &save, &scratch), off += (save + 15) / 16 * 16;
            }
    if (off > m->seg_save_n) {
        dt_free(m->seg_save);
        m->seg_save_n = (m->seg_save = dt_alloc(sizeof(float) * off)) ? off : 0;
        if (!m->seg_save) return dt_error(DT_ERR_NOMEM, "model: segments: out of memory for %zu floats", off);
    }
    memcpy(m->seg_len, len, sizeof(int) * n);
    memcpy(m->seg_scale, scale, sizeof(float) * n);
    m->seg_fn = fn, m->seg_user = user, m->nseg = n;
    return DT_OK;
}

// The pieces a training pass over B samples runs in: its segments, or
// without any the whole batch, piece j being piece_len samples.
static int pieces(const dt_model *m) { return m->nseg ? m->nseg : 1; }
static int piece_len(const dt_model *m, int j, int B) { return m->nseg ? m->seg_len[j] : B; }

// Hands g[0, n) of the gradient block, the part of a segment just made, to
// the segments' function, and zeroes it (without segments: nothing).
static void seg_take(dt_model *m, float *g, size_t n) {
    if (!m->nseg || !g || !n) return;
    m->seg_fn((size_t)(g - m->grads), n, g, m->seg_user);
    memset(g, 0, sizeof(float) * n);
}

// Floats per sample of a convolution's input and output (layouts as cs).
static size_t conv_numel(const dt_conv_shape *cs, int output) {
    int C = output ? cs->OC : cs->IC, blocked = output ? cs->dst_blocked : cs->src_blocked;
    size_t c = blocked ? (size_t)(C + DT_CONV_BLOCK - 1) / DT_CONV_BLOCK * DT_CONV_BLOCK : (size_t)C;
    if (!output) return c * cs->H * cs->W;
    return c * ((cs->H + 2 * cs->P - cs->K) / cs->S + 1) * ((cs->W + 2 * cs->P - cs->K) / cs->S + 1);
}

// Convolution k of layer i's save for piece j: its own with segments, else save.
static float *piece_save(const dt_model *m, int i, int k, int j, float *save) {
    return m->nseg ? m->seg_save + m->seg_off[((size_t)i * 3 + k) * m->nseg + j] : save;
}

// Convolution k of layer i (seg_conv) forward on B samples, piece by piece
// (room: dt_conv_forward's, NULL unless the convolution has room).
static void conv_fwd(dt_model *m, const layer_t *L, int i, int k, float *out, float *room, float *save,
                     const float *in, const float *w, const float *b, int B) {
    dt_conv_shape cs = {0};
    seg_conv(L, i, k, B, &cs);
    size_t ni = conv_numel(&cs, 0), no = conv_numel(&cs, 1);
    for (int j = 0, o = 0; j < pieces(m); o += piece_len(m, j++, B)) {
        seg_conv(L, i, k, piece_len(m, j, B), &cs);
        dt_conv_forward(out + o * no, room ? room + o * no : NULL, piece_save(m, i, k, j, save), L[i].aux2,
                        in + o * ni, w, b, &cs);
    }
}

// Its backward (dt_conv_backward's arguments); segments: each one's dw and
// db handed over (seg_take).
static void conv_bwd(dt_model *m, const layer_t *L, int i, int k, float *din, float *dw, float *db, float *out,
                     const float *dout, float *save, const float *w, int B, int set_din) {
    dt_conv_shape cs = {0};
    seg_conv(L, i, k, B, &cs);
    size_t ni = conv_numel(&cs, 0), no = conv_numel(&cs, 1), nw = (size_t)cs.OC * cs.IC * cs.K * cs.K;
    for (int j = 0, o = 0; j < pieces(m); o += piece_len(m, j++, B)) {
        seg_conv(L, i, k, piece_len(m, j, B), &cs);
        dt_conv_backward(din ? din + o * ni : NULL, dw, db, L[i].aux2, out + o * no, dout + o * no,
                         piece_save(m, i, k, j, save), w, &cs, set_din);
        seg_take(m, dw, nw);
        seg_take(m, db, (size_t)cs.OC);
    }
}

// The linear layer's backward on B rows of C inputs and OC outputs (any of
// din, dw, inp NULL as dt_linear_backward takes them), piece by piece.
static void linear_bwd(dt_model *m, float *din, float *dw, float *db, const float *dout, const float *inp,
                       const float *w, int B, int C, int OC) {
    for (int j = 0, o = 0; j < pieces(m); o += piece_len(m, j++, B)) {
        dt_linear_backward(din ? din + (size_t)o * C : NULL, dw, db, dout + (size_t)o * OC,
                           inp ? inp + (size_t)o * C : NULL, w, piece_len(m, j, B), C, OC);
        seg_take(m, dw, (size_t)C * OC);
        seg_take(m, db, (size_t)OC);
    }
}

// ----------------------------------------------------------------------------
// batch norm: a batchnorm layer's, or one of a block's three, over x[B, C, HW]
// with its 4C floats w (weight, bias, running mean, running var); ms[2C]
// keeps the mean and rstd it normalised with, *cnt the values per channel
// (over the workers with sync) for the backward.

static float bn_eps(const dt_layer_spec *s) { return s->eps > 0 ? s->eps : 1e-5f; }
static float bn_momentum(const dt_layer_spec *s) { return s->momentum > 0 ? s->momentum : 0.1f; }

// The mean over the workers of each one's upd[2C] (its batch mean and
// unbiased variance): sync = 0's running statistics.
static dt_status bn_average(dt_model *m, double *upd, int C, int have) {
    int64_t *acc = m->bacc;
    memset(acc, 0, sizeof(int64_t) * (4 * (size_t)C + 1));
    for (int c = 0; c < 2 * C && have; c++) dt_fixed48_add(acc + 2 * (size_t)c, upd[c]);
    acc[4 * (size_t)C] = have;
    dt_status st = m->bsum(acc, 4 * (size_t)C + 1, m->bsum_user);
    for (int c = 0; c < 2 * C && st == DT_OK; c++) upd[c] = dt_fixed48_value(acc + 2 * (size_t)c) / (double)acc[4 * (size_t)C];
    return st;
}

static dt_status bn_stats(dt_model *m, int idx, float *w, float *ms, double *cnt, const float *x, int B, int C, int HW,
                          const dt_layer_spec *s) {
    int64_t *acc = m->bacc;
    dt_status st = DT_OK;
    double *upd = calloc(2 * (size_t)C, sizeof(double));
    if (x) {
        if (upd && dt_batchnorm_stats(acc, x, B, C, HW)) free(upd), upd = NULL;
    } else {
        memset(acc, 0, sizeof(int64_t) * 4 * (size_t)C);  // (dt_model_batch_norm_idle: no samples here)
    }
    if (!upd) {
        free(upd);
        return dt_error(DT_ERR_NOMEM, "model: layer %d (%s): out of memory", idx, dt_layer_kind_name(s->kind));
    }
    acc[4 * (size_t)C] = (int64_t)B * HW;
    if (m->bsync && (st = m->bsum(acc, 4 * (size_t)C + 1, m->bsum_user)) != DT_OK) goto done;
    double N = (double)acc[4 * (size_t)C];
    if (!x && !m->bsync) {  // an idle worker without sync: the others' mean alone
        if ((st = bn_average(m, upd, C, 0)) != DT_OK) goto done;
        goto update;
    }
    if (N <= 1) {
        st = dt_error(DT_ERR_ARG, "model: layer %d (%s): expected more than 1 value per channel when training, got %.0f "
                      "(batch %d x %d value%s a sample%s); use a larger batch, or sync_bn", idx, dt_layer_kind_name(s->kind),
                      N, B, HW, HW == 1 ? "" : "s", m->bsync ? ", over every worker" : "");
        goto done;
    }
    for (int c = 0; c < C; c++) {
        double mean = dt_fixed48_value(acc + 2 * (size_t)c) / N;
        double var = dt_fixed48_value(acc + 2 * ((size_t)C + c)) / N - mean * mean;
        if (var < 0) var = 0;
        ms[c] = (float)mean;
        ms[C + c] = (float)(1.0 / sqrt(var + bn_eps(s)));
        upd[c] = mean;
        upd[C + c] = var * N / (N - 1);
    }
    if (m->bsum && !m->bsync && (st = bn_average(m, upd, C, 1)) != DT_OK) goto done;
update:;
    float mom = bn_momentum(s), *rm = w + 2 * (size_t)C, *rv = w + 3 * (size_t)C;
    for (int c = 0; c < C; c++) {
        rm[c] = (1.0f - mom) * rm[c] + mom * (float)upd[c];
        rv[c] = (1.0f - mom) * rv[c] + mom * (float)upd[C + c];
    }
    *cnt = N;
done:
    free(upd);
    return st;
}

// out = bn(x): the batch's statistics in training, the running ones else.
static dt_status bn_forward(dt_model *m, int idx, float *out, const float *x, float *w, float *ms, double *cnt, int B,
                            int C, int HW, const dt_layer_spec *s, int train) {
    if (train) {
        dt_status st = bn_stats(m, idx, w, ms, cnt, x, B, C, HW, s);
        if (st != DT_OK) return st;
    } else {
        for (int c = 0; c < C; c++) {
            ms[c] = w[2 * C + c];
            ms[C + c] = 1.0f / sqrtf(w[3 * C + c] + bn_eps(s));
        }
        *cnt = 0;  // (the backward of an evaluation: the statistics are constants)
    }
    dt_batchnorm_forward(out, x, ms, ms + C, w, w + C, B, C, HW);
    return DT_OK;
}

// acc[4C] = the local sums of dy and dy xhat (dt_batchnorm_dsums), dw[0,
// 2C) += those of dy xhat and dy in float; segments: each one's sums into
// dw alone, handed over (seg_take), and added up exactly in acc. 0 when out
// of memory.
static int bn_dsums(dt_model *m, int64_t *acc, float *dw, const float *dout, const float *x, const float *ms, int B,
                    int C, int HW) {
    int64_t *part = m->nseg ? malloc(sizeof(int64_t) * 4 * (size_t)C) : acc;
    size_t per = (size_t)C * HW;
    int ok = part != NULL;
    if (ok && m->nseg) memset(acc, 0, sizeof(int64_t) * 4 * (size_t)C);
    for (int j = 0, o = 0; j < pieces(m) && ok; o += piece_len(m, j++, B)) {
        ok = !dt_batchnorm_dsums(part, dout + o * per, x + o * per, ms, ms + C, piece_len(m, j, B), C, HW);
        for (int c = 0; c < C && ok; c++)
            dw[c] += (float)dt_fixed48_value(part + 2 * ((size_t)C + c)), dw[C + c] += (float)dt_fixed48_value(part + 2 * (size_t)c);
        seg_take(m, dw, 2 * (size_t)C);
        for (size_t q = 0; ok && m->nseg && q < 4 * (size_t)C; q++) acc[q] += part[q];
    }
    if (part != acc) free(part);
    return ok;
}

// Its backward: dw[0, 2C) += the local sums of dy xhat and dy; din (when
// not NULL) += the input gradient, from the sums over the workers with sync.
static dt_status bn_backward(dt_model *m, int idx, float *din, float *dw, const float *dout, const float *x,
                             const float *w, const float *ms, double cnt, int B, int C, int HW) {
    int64_t *acc = m->bacc;
    double *sd = malloc(sizeof(double) * 2 * (size_t)C);
    if (!sd || !bn_dsums(m, acc, dw, dout, x, ms, B, C, HW)) {
        free(sd);
        return dt_error(DT_ERR_NOMEM, "model: layer %d: batch norm backward: out of memory", idx);
    }
    for (int k = 0; k < 2; k++)
        for (int c = 0; c < C; c++) sd[(size_t)k * C + c] = dt_fixed48_value(acc + 2 * ((size_t)k * C + c));
    dt_status st = DT_OK;
    if (cnt > 0 && m->bsync && (st = m->bsum(acc, 4 * (size_t)C, m->bsum_user)) == DT_OK)
        for (int k = 0; k < 2; k++)
            for (int c = 0; c < C; c++) sd[(size_t)k * C + c] = dt_fixed48_value(acc + 2 * ((size_t)k * C + c));
    if (cnt <= 0) memset(sd, 0, sizeof(double) * 2 * (size_t)C), cnt = 1;
    if (din && st == DT_OK) dt_batchnorm_backward(din, dout, x, w, ms, ms + C, sd, sd + C, cnt, B, C, HW);
    free(sd);
    return st;
}

// The batch norms of layer i in the order its forward runs them (a block's
// bn1, bn2, then its downsample's): their 4C floats at w[k], *C channels;
// returns how many.
static int layer_bns(dt_model *m, int i, float **w, int *C) {
    layer_t *l = &m->L[i];
    float *p = m->params + l->w_off;
    if (l->spec.kind == DT_LAYER_BATCHNORM) return *C = l->in[0], w[0] = p, 1;
    if (l->spec.kind != DT_LAYER_BLOCK) return 0;
    block_parts q = block_of(l);
    *C = l->out[0];
    w[0] = p + q.bn1, w[1] = p + q.bn2, w[2] = p + q.bnd;
    return q.proj ? 3 : 2;
}

dt_status dt_model_batch_norm_idle(dt_model *m) {
    dt_status st = DT_OK;
    if (!m->bsum) return DT_OK;
    // forward: the sums with nothing of this worker's, and the running
    // statistics updated as the other workers update theirs
    float *w[3], ms[2 * 4096];
    double cnt;
    int C;
    for (int i = 0; i < m->nlayers && st == DT_OK; i++) {
        int n = layer_bns(m, i, w, &C);
        float *scratch = C <= 4096 ? ms : m->L[i].aux;  // (mean and rstd, unused: no backward of its own)
        for (int k = 0; k < n && st == DT_OK; k++)
            st = bn_stats(m, i, w[k], scratch, &cnt, NULL, 0, C, 1, &m->L[i].spec);
    }
    // backward (sync): last layer first, a block's bn2, bn1, then its downsample's: zeros
    for (int i = m->nlayers - 1; i >= 0 && st == DT_OK && m->bsync; i--)
        for (int k = 0, n = layer_bns(m, i, w, &C); k < n && st == DT_OK; k++) {
            memset(m->bacc, 0, sizeof(int64_t) * 4 * (size_t)C);
            st = m->bsum(m->bacc, 4 * (size_t)C, m->bsum_user);
        }
    return st;
}

// The blocks' element-wise passes, on pointers that alias nothing else
// (so that they vectorise: through the layer's fields they would not).
static void relu_inplace(float *restrict x, size_t n) {
#pragma omp parallel for simd schedule(static)
    for (size_t j = 0; j < n; j++) x[j] = x[j] > 0.0f ? x[j] : 0.0f;
}

// a = relu(a + s)
static void add_relu(float *restrict a, const float *restrict s, size_t n) {
#pragma omp parallel for simd schedule(static)
    for (size_t j = 0; j < n; j++) {
        float v = a[j] + s[j];
        a[j] = v > 0.0f ? v : 0.0f;
    }
}

// g = y > 0 ? d : 0 (the relu's backward from its output y; g may be d)
static void relu_mask(float *g, const float *restrict y, const float *d, size_t n) {
#pragma omp parallel for simd schedule(static)
    for (size_t j = 0; j < n; j++) g[j] = y[j] > 0.0f ? d[j] : 0.0f;
}

static void add_into(float *restrict a, const float *restrict s, size_t n) {
#pragma omp parallel for simd schedule(static)
    for (size_t j = 0; j < n; j++) a[j] += s[j];
}

// A basic block's forward: act = relu(bn2(conv2(relu(bn1(conv1(in))))) + sc),
// sc = in, or bn(conv1x1(in)) with a projection.
static dt_status block_forward(dt_model *m, layer_t *L, int i, const float *in, int B, int train, int max_batch) {
    layer_t *l = &L[i];
    block_parts p = block_of(l);
    block_bufs b;
    size_t sc;
    block_carve(L, i, max_batch, l->aux, &b, &sc);
    float *w = m->params + l->w_off;
    int C = l->out[0], P = l->out[1] * l->out[2];
    size_t n = (size_t)B * C * P;
    conv_fwd(m, L, i, 0, b.y1, NULL, b.s1, in, w + p.c1, NULL, B);
    dt_status st = bn_forward(m, i, b.r1, b.y1, w + p.bn1, b.st, &l->cnt[0], B, C, P, &l->spec, train);
    if (st != DT_OK) return st;
    relu_inplace(b.r1, n);
    conv_fwd(m, L, i, 1, b.y2, NULL, b.s2, b.r1, w + p.c2, NULL, B);
    if ((st = bn_forward(m, i, l->act, b.y2, w + p.bn2, b.st + 2 * C, &l->cnt[1], B, C, P, &l->spec, train)) != DT_OK)
        return st;
    const float *short_cut = in;
    if (p.proj) {
        conv_fwd(m, L, i, 2, b.yd, NULL, b.sd, in, w + p.cd, NULL, B);
        st = bn_forward(m, i, b.g2, b.yd, w + p.bnd, b.st + 4 * C, &l->cnt[2], B, C, P, &l->spec, train);
        if (st != DT_OK) return st;
        short_cut = b.g2;
    }
    add_relu(l->act, short_cut, n);
    return DT_OK;
}

// Its backward from l->dact; din (NULL for the first layer) += the input's.
static dt_status block_backward(dt_model *m, layer_t *L, int i, float *din, int B, int max_batch) {
    layer_t *l = &L[i];
    block_parts p = block_of(l);
    block_bufs b;
    size_t sc;
    block_carve(L, i, max_batch, l->aux, &b, &sc);
    const float *w = m->params + l->w_off;
    float *dw = m->grads + l->w_off;
    int C = l->out[0], P = l->out[1] * l->out[2];
    size_t n = (size_t)B * C * P;
    relu_mask(b.g2, l->act, l->dact, n);
    memset(b.g1, 0, sizeof(float) * n);
    dt_status st = bn_backward(m, i, b.g1, dw + p.bn2, b.g2, b.y2, w + p.bn2, b.st + 2 * C, l->cnt[1], B, C, P);
    if (st != DT_OK) return st;
    conv_bwd(m, L, i, 1, b.g3, dw + p.c2, NULL, b.y2, b.g1, b.s2, w + p.c2, B, 1);
    relu_mask(b.g3, b.r1, b.g3, n);
    memset(b.g1, 0, sizeof(float) * n);
    if ((st = bn_backward(m, i, b.g1, dw + p.bn1, b.g3, b.y1, w + p.bn1, b.st, l->cnt[0], B, C, P)) != DT_OK) return st;
    conv_bwd(m, L, i, 0, din, dw + p.c1, NULL, b.y1, b.g1, b.s1, w + p.c1, B, 0);
    if (p.proj) {
        memset(b.g1, 0, sizeof(float) * n);
        st = bn_backward(m, i, b.g1, dw + p.bnd, b.g2, b.yd, w + p.bnd, b.st + 4 * C, l->cnt[2], B, C, P);
        if (st != DT_OK) return st;
        conv_bwd(m, L, i, 2, din, dw + p.cd, NULL, b.yd, b.g1, b.sd, w + p.cd, B, 0);
    } else if (din) {
        add_into(din, b.g2, n);
    }
    return DT_OK;
}

// Layers [l0, l1) of L on B samples (L: the model's layers, or a pipeline
// stage's copy, dt_model_acts): their input is x when l0 = 0, else layer
// l0 - 1's act; buffers sized for max_batch. hooks: call the model's layer
// hook.
static dt_status forward_layers(dt_model *m, layer_t *L, int l0, int l1, const float *x, int B, int train,
                                int max_batch, int hooks) {
    const float *in = l0 > 0 ? L[l0 - 1].act : x;
    for (int i = l0; i < l1; i++) {
        layer_t *l = &L[i];
        const dt_layer_spec *s = &l->spec;
        const float *w = m->params + l->w_off, *b = m->params + l->b_off;
        dt_status st = hooks && m->layer_hook ? m->layer_hook(i, 0, m->layer_hook_user) : DT_OK;
        if (st != DT_OK) return st;
        size_t n = (size_t)B * out_numel(l);
        int V = l->blk ? l->blk : 1;
        switch (s->kind) {
        case DT_LAYER_LINEAR:
            // row-parallel: the shards' partial outputs are summed, the bias added once
            for (int j = 0, o = 0; j < pieces(m); o += piece_len(m, j++, B))
                dt_linear_forward(l->act + (size_t)o * l->out[0], in + (size_t)o * l->in[0], w,
                                  (l->tp == 2 && m->tp) || !l->b_n ? NULL : b, piece_len(m, j, B), l->in[0], l->out[0]);
            // its input, made in fp32 in the gradient buffer, kept in 16 bits for the backward
            if (i > 0 && L[i - 1].t16) dt_keep16(L[i - 1].act16, in, (size_t)B * l->in[0], L[i - 1].t16);
            break;
        case DT_LAYER_CONV2D:  // (row-parallel: as the linear layer's; with room, its gradient buffer is it)
            conv_fwd(m, L, i, 0, l->act, l->room ? l->dact : NULL, l->aux, in, w, (l->tp == 2 && m->tp) || !l->b_n ? NULL : b, B);
            break;
        case DT_LAYER_BATCHNORM:
            st = bn_forward(m, i, l->act, in, m->params + l->w_off, l->aux, &l->cnt[0], B, l->in[0],
                            l->in[1] * l->in[2], s, train);
            if (st != DT_OK) return st;
            break;
        case DT_LAYER_BLOCK:
            if ((st = block_forward(m, L, i, in, B, train, max_batch)) != DT_OK) return st;
            break;
        case DT_LAYER_AVGPOOL: dt_avgpool_forward(l->act, in, B, l->in[0], l->in[1] * l->in[2]); break;
        case DT_LAYER_MAXPOOL:
            dt_maxpool_forward_v(l->act, l->argmax, in, B, (l->in[0] + V - 1) / V, l->in[1],
                                 l->in[2], s->kernel, s->stride ? s->stride : s->kernel, V);
            break;
        case DT_LAYER_RELU:
            if (!l->fused) dt_relu_forward(l->act, in, n);
            break;
        case DT_LAYER_GELU: dt_gelu_forward(l->act, in, n); break;
        case DT_LAYER_LAYERNORM:
            dt_layernorm_forward(l->act, l->aux, l->aux + max_batch, in, w, b, B, l->in[0],
                                 s->eps > 0 ? s->eps : 1e-5f);
            break;
        case DT_LAYER_DROPOUT:
            if (train && s->p > 0.0f) {
                // (a shard's part of a sample: the whole layer's mask there, its draws skipped to)
                size_t ns = numel3(l->out), skip = l->part ? (size_t)m->tp * ns : 0;
#pragma omp parallel for schedule(static)
                for (int j = 0; j < B; j++) {
                    dt_rng r;
                    dt_rng_seed(&r, dt_dropout_seed(m->seed, m->drop_step, (uint64_t)(m->drop_first + j), i));
                    for (size_t k = 0; k < skip; k++) dt_rng_uniform(&r);
                    dt_dropout_forward(l->act + j * ns, l->aux + j * ns, in + j * ns, ns, s->p, &r);
                }
            } else {
                memcpy(l->act, in, sizeof(float) * n);
            }
            break;
        case DT_LAYER_FLATTEN:
            if (i > 0 && L[i - 1].blk)
                unblock(l->act, (float *)in, B, l->in[0], l->in[1] * l->in[2], 0);
            else
                memcpy(l->act, in, sizeof(float) * n);
            break;
        }
        // row-parallel: the shards' partial outputs summed (the bias added by shard 0 alone)
        if (l->tp == 2 && m->reduce && (st = m->reduce(l->act, n, m->reduce_user)) != DT_OK) return st;
        in = l->act;
    }
    return DT_OK;
}

// The mean softmax cross-entropy of logits[B, V] into probs.
static dt_status loss_forward(float *probs, const float *logits, const int32_t *targets, int B, int V,
                              float *loss) {
    for (int i = 0; i < B; i++)
        if (targets[i] < 0 || targets[i] >= V)
            return dt_error(DT_ERR_ARG, "model: target %d of sample %d outside 0..%d", (int)targets[i], i, V - 1);
    float l = dt_crossentropy_forward(probs, logits, targets, B, V);
    if (loss) *loss = l;
    if (!isfinite(l))
        return dt_error(DT_ERR_NUMERIC, "model: loss is %s (diverged: lower the learning rate or clip gradients)",
                        isnan(l) ? "NaN" : "Inf");
    return DT_OK;
}

// Activations with 16-bit parts must run in the precision they keep them in
// (in fp32 the linear layers would read them rounded).
static dt_status check_store(dt_dtype store) {
    if (store != DT_F32 && dt_kernels_precision() != store)
        return dt_error(DT_ERR_ARG, "model forward: the activations keep linear inputs in %s, the kernels run %s "
                        "(make the model or set in the precision it runs in)", dt_dtype_name(store),
                        dt_dtype_name(dt_kernels_precision()));
    return DT_OK;
}

dt_status dt_model_forward(dt_model *m, const float *x, const int32_t *targets, int B, int train,
                           float *loss) {
    if (B <= 0 || B > m->max_batch)
        return dt_error(DT_ERR_ARG, "model: batch %d outside 1..%d", B, m->max_batch);
    if (check_store(m->store) != DT_OK) return DT_ERR_ARG;
    if (!train) m->nseg = 0;  // (segments are a training pass's)
    int segs = 0;
    for (int j = 0; j < m->nseg; j++) segs += m->seg_len[j];
    if (m->nseg && segs != B)
        return dt_error(DT_ERR_ARG, "model: a batch of %d samples in segments of %d in all", B, segs);
    dt_status st = forward_layers(m, m->L, 0, m->nlayers, x, B, train, m->max_batch, 1);
    if (st != DT_OK) return st;
    m->input = x;
    m->targets = targets;
    m->last_B = B;
    m->last_train = train;
    if (!targets) return DT_OK;
    return loss_forward(m->probs, m->L[m->nlayers - 1].act, targets, B, dt_model_num_classes(m), loss);
}

// Backward of layers [l0, l1) of L (as forward_layers), from the gradient
// in L[l1 - 1].dact; the input gradient goes to L[l0 - 1].dact (l0 > 0).
static dt_status backward_layers(dt_model *m, layer_t *L, int l0, int l1, const float *x, int B, int train,
                                 int max_batch, int hooks) {
    for (int i = l0 > 0 ? l0 - 1 : 0; i + 1 < l1; i++)
        if (!sets_din(&L[i + 1])) memset(L[i].dact, 0, sizeof(float) * B * out_numel(&L[i]));
    for (int i = l1 - 1; i >= l0; i--) {
        layer_t *l = &L[i];
        const dt_layer_spec *s = &l->spec;
        const float *in = i > 0 ? L[i - 1].act : x;
        float *din = i > 0 ? L[i - 1].dact : NULL;
        const float *w = m->params + l->w_off;
        float *dw = m->grads + l->w_off, *db = l->b_n ? m->grads + l->b_off : NULL;
        dt_status st = hooks && m->layer_hook ? m->layer_hook(i, 1, m->layer_hook_user) : DT_OK;
        if (st != DT_OK) return st;
        size_t n = (size_t)B * out_numel(l);
        int V = l->blk ? l->blk : 1;
        switch (s->kind) {
        case DT_LAYER_LINEAR:
            if (din && L[i - 1].t16) {
                // The input kept in 16 bits, widened into the input gradient's
                // buffer for the weight gradient, which the input gradient
                // then overwrites (cleared: it accumulates). The two GEMMs are
                // independent: the same bits in this order.
                size_t ni = (size_t)B * l->in[0];
                linear_bwd(m, NULL, dw, db, l->dact, dt_widen16(din, L[i - 1].act16, ni, L[i - 1].t16), w, B,
                           l->in[0], l->out[0]);
                memset(din, 0, sizeof(float) * ni);
                linear_bwd(m, din, NULL, NULL, l->dact, NULL, w, B, l->in[0], l->out[0]);
            } else {
                linear_bwd(m, din, dw, db, l->dact, in, w, B, l->in[0], l->out[0]);
            }
            break;
        case DT_LAYER_CONV2D: conv_bwd(m, L, i, 0, din, dw, db, l->act, l->dact, l->aux, w, B, 1); break;
        case DT_LAYER_BATCHNORM:
            st = bn_backward(m, i, din, dw, l->dact, in, w, l->aux, l->cnt[0], B, l->in[0], l->in[1] * l->in[2]);
            if (st != DT_OK) return st;
            break;
        case DT_LAYER_BLOCK:
            if ((st = block_backward(m, L, i, din, B, max_batch)) != DT_OK) return st;
            break;
        case DT_LAYER_AVGPOOL:
            if (din) dt_avgpool_backward(din, l->dact, B, l->in[0], l->in[1] * l->in[2]);
            break;
        case DT_LAYER_MAXPOOL: {
            // Through the relu before it, when that one leaves its backward here.
            int fold = din && L[i - 1].pooled;
            if (din)
                dt_maxpool_backward_v(fold ? L[i - 2].dact : din, l->dact, l->argmax, B,
                                      (l->in[0] + V - 1) / V, l->in[1], l->in[2], s->kernel,
                                      s->stride ? s->stride : s->kernel, V, 1, fold ? in : NULL);
            break;
        }
        case DT_LAYER_RELU:
            if (din && !l->pooled) dt_relu_backward_set(din, l->dact, in, n);
            break;
        case DT_LAYER_GELU:
            if (din) dt_gelu_backward(din, l->dact, in, n);
            break;
        case DT_LAYER_LAYERNORM:
            for (int j = 0, o = 0, C = l->in[0]; j < pieces(m); o += piece_len(m, j++, B)) {
                dt_layernorm_backward(din ? din + (size_t)o * C : NULL, dw, db, l->dact + (size_t)o * C,
                                      in + (size_t)o * C, w, l->aux + o, l->aux + max_batch + o, piece_len(m, j, B), C);
                seg_take(m, dw, (size_t)C);
                seg_take(m, db, (size_t)C);
            }
            break;
        case DT_LAYER_DROPOUT:
            if (!din) break;
            if (train && s->p > 0.0f) dt_dropout_backward(din, l->dact, l->aux, n);
            else
                for (size_t j = 0; j < n; j++) din[j] += l->dact[j];
            break;
        case DT_LAYER_FLATTEN:
            if (din && L[i - 1].blk)
                unblock(l->dact, din, B, l->in[0], l->in[1] * l->in[2], 1);
            else if (din)
                memcpy(din, l->dact, sizeof(float) * n);
            break;
        }
        // column-parallel: each shard's input gradient is a part of the sum
        if (l->tp == 1 && din && m->reduce &&
            (st = m->reduce(din, (size_t)B * out_numel(&L[i - 1]), m->reduce_user)) != DT_OK)
            return st;
        if (hooks && m->hook && (l->w_n || l->b_n)) m->hook(l->w_off, m->hook_user);
    }
    return DT_OK;
}

dt_status dt_model_backward(dt_model *m) {
    if (!m->targets) return dt_error(DT_ERR_ARG, "model: backward needs a forward with targets");
    int B = m->last_B;
    layer_t *last = &m->L[m->nlayers - 1];
    int V = last->out[0];
    memset(last->dact, 0, sizeof(float) * B * out_numel(last));
    for (int j = 0, o = 0; j < pieces(m); o += piece_len(m, j++, B))
        dt_crossentropy_backward(last->dact + (size_t)o * V, m->probs + (size_t)o * V, m->targets + o,
                                 piece_len(m, j, B), V, m->nseg ? m->seg_scale[j] : m->loss_scale);
    dt_status st = backward_layers(m, m->L, 0, m->nlayers, m->input, B, m->last_train, m->max_batch, 1);
    m->nseg = 0;
    return st;
}

// ----------------------------------------------------------------------------
// pipeline stages: layers [l0, l1) on activations of their own

struct dt_model_acts {
    int l0, l1, max_batch, B, train;
    dt_dtype store;        // the kernels' precision at create (plan_half)
    size_t bytes, saved;   // as allocated (plan_bytes), and those saved
    layer_t *L;            // [l1]: the model's plan of layers [0, l1); buffers for [l0, l1), and for
                           // l0 > 0 layer l0 - 1's output and its gradient (the stage's input stream)
    float *probs;          // the last stage: [max_batch, classes]
    float *cscratch;       // the convolutions' shared scratch
    const float *x;        // l0 = 0: the last forward's input
    const int32_t *targets;
};

size_t dt_model_stream_size(const dt_model *m, int l) {
    if (l <= 0) return numel3(m->in_shape);
    return out_numel(&m->L[(l < m->nlayers ? l : m->nlayers) - 1]);
}

void dt_model_acts_free(dt_model_acts *a) {
    if (!a) return;
    for (int i = a->l0 > 0 ? a->l0 - 1 : 0; i < a->l1 && a->L; i++) free_layer_acts(&a->L[i], i < a->l0);
    free(a->L);
    dt_free(a->cscratch);
    dt_free(a->probs);
    free(a);
}

dt_status dt_model_acts_create(dt_model_acts **out, const dt_model *m, int l0, int l1, int max_batch) {
    *out = NULL;
    if (l0 < 0 || l1 <= l0 || l1 > m->nlayers || max_batch <= 0)
        return dt_error(DT_ERR_ARG, "model: stage of layers [%d, %d) of %d, batch %d", l0, l1, m->nlayers, max_batch);
    dt_model_acts *a = calloc(1, sizeof *a);
    if (!a) return dt_error(DT_ERR_NOMEM, "model: out of memory");
    *a = (dt_model_acts){.l0 = l0, .l1 = l1, .max_batch = max_batch, .store = dt_kernels_precision()};
    if (!(a->L = calloc((size_t)l1, sizeof *a->L))) goto nomem;
    for (int i = 0; i < l1; i++) {  // the plan, without buffers
        layer_t *l = &a->L[i];
        *l = m->L[i];
        l->act = l->dact = l->aux = l->aux2 = NULL;
        l->argmax = NULL;
        l->act16 = NULL;
        // A relu whose backward the maxpool after it does must have that
        // maxpool in the stage; the stream's layer runs nothing here.
        if (i + 1 >= l1 || i < l0) l->pooled = 0;
        if (i < l0) l->fused = 0;
    }
    plan_half(a->L, l0, l1, a->store);
    plan_drop(a->L, l0, l1);
    if (l0 > 0) {
        size_t n = (size_t)max_batch * out_numel(&a->L[l0 - 1]);
        a->L[l0 - 1].act = dt_alloc(sizeof(float) * n);
        a->L[l0 - 1].dact = dt_alloc(sizeof(float) * n);
        if (!a->L[l0 - 1].act || !a->L[l0 - 1].dact) goto nomem;
    }
    for (int i = l0; i < l1; i++) {
        layer_t *l = &a->L[i];
        layer_bufs z = buffer_sizes(a->L, i, max_batch);
        l->dact = dt_alloc(sizeof(float) * z.dact);
        l->act = z.act ? dt_alloc(sizeof(float) * z.act) : l->t16 || l->drop ? l->dact : i > 0 ? a->L[i - 1].act : NULL;
        if (!l->act || !l->dact || (z.act16 && !(l->act16 = dt_alloc(sizeof(uint16_t) * z.act16)))) goto nomem;
        if ((z.aux && !(l->aux = dt_alloc(sizeof(float) * z.aux))) ||
            (z.argmax && !(l->argmax = dt_alloc(sizeof(int32_t) * z.argmax))))
            goto nomem;
    }
    if (conv_scratch(a->L, l0, l1, max_batch, &a->cscratch) != DT_OK) goto nomem;
    if (l1 == m->nlayers && !(a->probs = dt_alloc(sizeof(float) * max_batch * a->L[l1 - 1].out[0]))) goto nomem;
    a->bytes = plan_bytes(a->L, l0, l1, max_batch, l1 == m->nlayers ? a->L[l1 - 1].out[0] : 0, &a->saved);
    *out = a;
    return DT_OK;
nomem:
    dt_model_acts_free(a);
    return dt_error(DT_ERR_NOMEM, "model: out of memory for the activations of layers [%d, %d), batch %d", l0, l1,
                    max_batch);
}

size_t dt_model_acts_bytes(const dt_model_acts *a, size_t *saved) {
    if (saved) *saved = a->saved;
    return a->bytes;
}

size_t dt_model_act_bytes(const dt_model *m, size_t *saved) {
    if (saved) *saved = m->act_saved;
    return m->act_bytes;
}

float *dt_model_acts_input(dt_model_acts *a) { return a->l0 > 0 ? a->L[a->l0 - 1].act : NULL; }
float *dt_model_acts_output(dt_model_acts *a) { return a->L[a->l1 - 1].act; }

dt_status dt_model_forward_range(dt_model *m, dt_model_acts *a, const float *x, const int32_t *targets, int B,
                                 int train, float *loss) {
    if (B <= 0 || B > a->max_batch)
        return dt_error(DT_ERR_ARG, "model: batch %d outside 1..%d", B, a->max_batch);
    if (a->l0 == 0 && !x) return dt_error(DT_ERR_ARG, "model: the first stage needs its input");
    if (a->l1 == m->nlayers && !targets) return dt_error(DT_ERR_ARG, "model: the last stage needs the targets");
    if (check_store(a->store) != DT_OK) return DT_ERR_ARG;
    dt_status st = forward_layers(m, a->L, a->l0, a->l1, x, B, train, a->max_batch, 0);
    if (st != DT_OK) return st;
    a->x = x;
    a->targets = targets;
    a->B = B;
    a->train = train;
    if (a->l1 < m->nlayers) return DT_OK;
    return loss_forward(a->probs, a->L[a->l1 - 1].act, targets, B, dt_model_num_classes(m), loss);
}

dt_status dt_model_backward_range(dt_model *m, dt_model_acts *a, const float *dout, float **din) {
    int B = a->B;
    if (B <= 0) return dt_error(DT_ERR_ARG, "model: stage backward needs a forward first");
    layer_t *last = &a->L[a->l1 - 1];
    size_t n = (size_t)B * out_numel(last);
    if (a->l1 == m->nlayers) {
        memset(last->dact, 0, sizeof(float) * n);
        dt_crossentropy_backward(last->dact, a->probs, a->targets, B, last->out[0], m->loss_scale);
    } else if (dout != last->dact) {
        memcpy(last->dact, dout, sizeof(float) * n);
    }
    dt_status st = backward_layers(m, a->L, a->l0, a->l1, a->x, B, a->train, a->max_batch, 0);
    if (din) *din = a->l0 > 0 ? a->L[a->l0 - 1].dact : NULL;
    return st;
}

// Forward FLOPs a sample of each layer, from the planned shapes.
dt_status dt_model_layer_costs(const int in_shape[3], const dt_layer_spec *layers, int nlayers, double *flops) {
    dt_model *m;
    dt_status st = plan_model(&m, in_shape, layers, nlayers, 1, 0, 1);
    if (st != DT_OK) return st;
    for (int i = 0; i < nlayers; i++) {
        const layer_t *l = &m->L[i];
        double outn = (double)numel3(l->out);
        switch (l->spec.kind) {
        case DT_LAYER_LINEAR:
        case DT_LAYER_CONV2D: flops[i] = 2.0 * (double)l->w_n * (double)l->out[1] * l->out[2]; break;
        case DT_LAYER_MAXPOOL: flops[i] = outn * l->spec.kernel * l->spec.kernel; break;
        case DT_LAYER_LAYERNORM: flops[i] = 8.0 * outn; break;
        case DT_LAYER_BATCHNORM: flops[i] = 8.0 * outn; break;
        case DT_LAYER_BLOCK: flops[i] = 2.0 * (double)l->w_n * outn / l->out[0] + 24.0 * outn; break;
        case DT_LAYER_AVGPOOL: flops[i] = (double)numel3(l->in); break;
        default: flops[i] = outn; break;  // element-wise: one a value
        }
    }
    dt_model_free(m);
    return DT_OK;
}
