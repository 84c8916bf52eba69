/* Sparse codecs: topk and randomk send k = ceil(ratio x len) values of a
 * piece.
 *
 * topk sends the k largest |x| (exactly, searched for among the values over
 * a threshold a sample gives, as DGC does) as (uint32 index, fp32 value) pairs; ranks
 * choose different indices, so the pairs are allgathered and every rank adds
 * the W lists in rank order. With DGC's refinements (Lin et al. 2018):
 * momentum correction (the momentum is accumulated locally, u = m u + g,
 * v += u, and both are cleared where v was sent), local clipping (a rank
 * scales a piece whose norm exceeds clip_norm x sqrt(len / n) / sqrt(W)
 * down to it, before accumulating), and a warm-up whose density falls
 * exponentially from ratio^(1/(warmup+1)) to ratio over warmup_steps. A
 * warm-up step whose k is at least 1/W of the piece goes as a plain fp32
 * sum instead (all of it sent: no residual, no momentum kept): W lists of k
 * pairs would carry at least as many bytes as a ring allreduce of the piece,
 * and cost a selection besides.
 *
 * randomk draws its k indices by shuffling the piece's indices with a
 * generator every rank seeds alike (from [train] seed, the piece and the
 * step), so the indices agree and the values are summed by one fp32
 * allreduce of k floats: no indices on the wire. Without error feedback the
 * values are scaled by len / k, which makes it unbiased.
 *
 * With error feedback each rank keeps what it did not send. A parameter
 * server's push is the rank's top-k pairs; random-k has no such message. */
#include "engine/codecs/codec.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int topk_wants(const dt_config *c) { return c->comp_method == DT_COMP_TOPK; }
static int randomk_wants(const dt_config *c) { return c->comp_method == DT_COMP_RANDOMK; }

// k at the piece's step t.
static size_t k_of(const dt_codec *k, int64_t t, size_t len) {
    double d = k->c->comp_ratio;
    int64_t w = k->c->comp_warmup_steps;
    if (k->c->comp_method == DT_COMP_TOPK && t < w) d = pow(d, (double)(t + 1) / (double)(w + 1));
    size_t kk = (size_t)ceil(d * (double)len);
    return kk < 1 ? 1 : kk > len ? len : kk;
}

static void swapf(float *a, float *b) {
    float t = *a;
    *a = *b;
    *b = t;
}

static float median3(float a, float b, float c) {
    return a < b ? (b < c ? b : a < c ? c : a) : (a < c ? a : b < c ? c : b);
}

// The k-th largest (k >= 1) of a[0, n), reordering a.
static float kth_largest(float *a, size_t n, size_t k) {
    size_t lo = 0, hi = n, t = k - 1;
    while (hi - lo > 1) {
        float piv = median3(a[lo], a[lo + (hi - lo) / 2], a[hi - 1]);
        size_t lt = lo, i = lo, gt = hi;  // [lo, lt) > piv, [lt, gt) == piv, [gt, hi) < piv
        while (i < gt) {
            if (a[i] > piv) swapf(&a[lt++], &a[i++]);
            else if (a[i] < piv) swapf(&a[i], &a[--gt]);
            else i++;
        }
        if (t < lt) hi = lt;
        else if (t >= gt) lo = gt;
        else return piv;
    }
    return a[lo];
}

typedef struct {
    uint32_t i;
    float v;
} pair;

// The k largest |x| of x[0, len) (1 <= k <= len), as (index, value) pairs
// in index order to out[k]: those over the k-th largest, then those equal
// to it, first come first. mag[len] floats and idx[2k + 64] are room. On a
// large piece, as Deep Gradient Compression does, the magnitudes of a random
// sample (len / 64 of them, drawn with rng) first give a threshold t a
// little under the k-th largest (3 standard deviations of the sample's
// count), one pass over x collects the values >= t, and the rest runs among
// them only; when fewer than k or more than 2k + 64 pass, among all. The
// pairs are the same either way.
static void topk_select(const float *x, size_t len, size_t k, float *mag, uint32_t *idx, dt_rng *rng, pair *out) {
    size_t s = len / 64, cap = 2 * k + 64, c = 0;
    if (s >= 2048 && k < len / 8) {
        for (size_t i = 0; i < s; i++) mag[i] = fabsf(x[dt_rng_below(rng, (uint32_t)len)]);
        double ks = (double)k * (double)s / (double)len;
        float t = kth_largest(mag, s, (size_t)(ks + 3 * sqrt(ks)) + 2);
        size_t i = 0;
        for (; i + 16 <= len && c + 16 <= cap; i += 16) {  // most blocks of 16 hold none: test them at once
            int any = 0;
            for (int l = 0; l < 16; l++) any |= fabsf(x[i + l]) >= t;
            for (int l = 0; l < 16 && any; l++)
                if (fabsf(x[i + l]) >= t) mag[c] = fabsf(x[i + l]), idx[c++] = (uint32_t)(i + l);
        }
        for (; i < len && c < cap; i++)
            if (fabsf(x[i]) >= t) mag[c] = fabsf(x[i]), idx[c++] = (uint32_t)i;
        for (; i < len && c == cap; i++)  // full: one more passing means too many
            if (fabsf(x[i]) >= t) c++;
        if (c < k || c > cap) c = 0;
    }
    if (!c)
        for (size_t i = 0; i < len; i++) mag[i] = fabsf(x[i]);
    float t = kth_largest(mag, c ? c : len, k);
    size_t m = 0, n = c ? c : len;
    for (int pass = 0; pass < 2; pass++)
        for (size_t j = 0; j < n && m < k; j++) {
            size_t i = c ? idx[j] : j;
            if (pass ? fabsf(x[i]) == t : fabsf(x[i]) > t) out[m++] = (pair){(uint32_t)i, x[i]};
        }
    while (m < k) out[m++] = (pair){0, 0};  // only with NaNs, which the loop reports
}

// Error feedback, with DGC's local clipping and momentum correction: x
// (in place of g[lo, hi)) becomes what this step may send.
static void accumulate(dt_codec *k, float *g, size_t lo, size_t hi) {
    const dt_config *c = k->c;
    if (c->comp_clip_norm > 0) {
        double ss = 0;
        for (size_t i = lo; i < hi; i++) ss += (double)g[i] * g[i];
        double lim = c->comp_clip_norm * sqrt((double)(hi - lo) / (double)k->n) / sqrt((double)k->world);
        if (sqrt(ss) > lim) {
            float f = (float)(lim / sqrt(ss));
            for (size_t i = lo; i < hi; i++) g[i] *= f;
        }
    }
    if (k->velocity) {
        float m = c->comp_momentum, *u = k->velocity;
        for (size_t i = lo; i < hi; i++) {
            u[i] = m * u[i] + g[i];
            g[i] = k->residual[i] + u[i];
        }
    } else {
        dt_codec_ef_add(k, g, lo, hi);
    }
}

// What was sent at piece index j no longer waits in the residual (nor in
// the momentum).
static void sent_at(dt_codec *k, size_t at) {
    if (k->residual) k->residual[at] = 0;
    if (k->velocity) k->velocity[at] = 0;
}

// This rank's kk pairs for g[lo, hi) into mine[kk], error feedback (and
// DGC's momentum) kept; mag: room for len floats and 2 kk + 64 indices.
static void topk_message(dt_codec *k, float *g, size_t lo, size_t hi, dt_codec_piece *p, size_t kk, pair *mine,
                         float *mag) {
    size_t len = hi - lo;
    float *x = g + lo;
    accumulate(k, g, lo, hi);
    topk_select(x, len, kk, mag, (uint32_t *)(mag + len), &p->rng, mine);
    if (k->residual) {
        memcpy(k->residual + lo, x, len * sizeof(float));
        for (size_t j = 0; j < kk; j++) sent_at(k, lo + mine[j].i);
    }
}

// The bytes topk's buffer needs: W messages of kk pairs, then mag's room.
static size_t topk_room(size_t W, size_t kk, size_t len) {
    return W * kk * sizeof(pair) + len * sizeof(float) + (2 * kk + 64) * sizeof(uint32_t);
}

static dt_status topk_start(dt_codec *k, float *g, size_t lo, size_t hi, dt_codec_piece *p, int64_t step,
                            dt_request_t *req) {
    size_t len = hi - lo, kk = k_of(k, step, len), B = kk * sizeof(pair);
    if (step < k->c->comp_warmup_steps && kk * (size_t)k->world >= len) {  // dense: the plain sum (above)
        accumulate(k, g, lo, hi);
        if (k->residual) memset(k->residual + lo, 0, len * sizeof(float));
        if (k->velocity) memset(k->velocity + lo, 0, len * sizeof(float));
        p->sent = 0;
        return dt_codec_plain_start(k, g, lo, hi, req);
    }
    uint8_t *buf = dt_codec_buf(p, topk_room((size_t)k->world, kk, len));
    if (!buf) return DT_ERR_NOMEM;
    pair *mine = (pair *)(buf + B * (size_t)k->rank);
    topk_message(k, g, lo, hi, p, kk, mine, (float *)(buf + B * (size_t)k->world));
    p->sent = kk;
    return dt_iallgather(mine, buf, B, DT_U8, k->comm, req);
}

static dt_status randomk_start(dt_codec *k, float *g, size_t lo, size_t hi, dt_codec_piece *p, int64_t step,
                               dt_request_t *req) {
    size_t len = hi - lo, kk = k_of(k, step, len);
    float *vals = (float *)dt_codec_buf(p, kk * sizeof(float));
    if (!vals) return DT_ERR_NOMEM;
    if (!p->perm && !(p->perm = malloc(len * sizeof *p->perm)))
        return dt_error(DT_ERR_NOMEM, "gradient codec randomk: out of memory");
    for (size_t i = 0; i < len; i++) p->perm[i] = (uint32_t)i;
    for (size_t j = 0; j < kk; j++) {  // a partial Fisher-Yates shuffle: k random indices of the step
        size_t r = j + dt_rng_below(&p->rng, (uint32_t)(len - j));
        uint32_t t = p->perm[j];
        p->perm[j] = p->perm[r];
        p->perm[r] = t;
    }
    accumulate(k, g, lo, hi);
    float scale = k->residual ? 1 : (float)((double)len / (double)kk);
    for (size_t j = 0; j < kk; j++) vals[j] = g[lo + p->perm[j]] * scale;
    if (k->residual) {
        memcpy(k->residual + lo, g + lo, len * sizeof(float));
        for (size_t j = 0; j < kk; j++) sent_at(k, lo + p->perm[j]);
    }
    p->sent = kk;
    return dt_iallreduce(vals, vals, kk, DT_F32, DT_SUM, k->comm, req);
}

static dt_status sparse_start(dt_codec *k, float *g, size_t lo, size_t hi, dt_request_t *req) {
    if (dt_codec_small(k, lo, hi)) return dt_codec_plain_start(k, g, lo, hi, req);
    dt_codec_piece *p = dt_codec_piece_at(k, lo, hi);
    if (!p) return DT_ERR_NOMEM;
    int64_t t = dt_codec_piece_begin(k, p, 0);  // random-k: the same indices on every rank
    return k->c->comp_method == DT_COMP_TOPK ? topk_start(k, g, lo, hi, p, t, req)
                                             : randomk_start(k, g, lo, hi, p, t, req);
}

static dt_status sparse_finish(dt_codec *k, float *g, size_t lo, size_t hi, dt_request_t *req) {
    if (dt_codec_small(k, lo, hi)) return dt_codec_plain_finish(k, g, lo, hi, req);
    dt_status st = dt_wait(req);
    if (st != DT_OK) return st;
    const dt_codec_piece *p = dt_codec_piece_at(k, lo, hi);
    size_t kk = p->sent;
    if (!kk) return DT_OK;  // top-k's dense warm-up step: the plain sum, in place
    memset(g + lo, 0, (hi - lo) * sizeof *g);
    if (k->c->comp_method == DT_COMP_RANDOMK) {
        const float *vals = (const float *)p->buf;
        for (size_t j = 0; j < kk; j++) g[lo + p->perm[j]] = vals[j];
        return DT_OK;
    }
    const pair *all = (const pair *)p->buf;
    for (size_t j = 0; j < kk * (size_t)k->world; j++) g[lo + all[j].i] += all[j].v;
    return DT_OK;
}

// Top-k's point-to-point message: its kk pairs (random-k has none: its
// indices are drawn alike by the ranks of one allreduce).
static size_t topk_encode(dt_codec *k, float *g, size_t lo, size_t hi, const uint8_t **msg) {
    dt_codec_piece *p = dt_codec_piece_at(k, lo, hi);
    if (!p) return 0;
    size_t len = hi - lo, kk = k_of(k, dt_codec_piece_begin(k, p, 0), len);
    uint8_t *buf = dt_codec_buf(p, topk_room(1, kk, len));
    if (!buf) return 0;
    topk_message(k, g, lo, hi, p, kk, (pair *)buf, (float *)(buf + kk * sizeof(pair)));
    *msg = buf;
    return kk * sizeof(pair);
}

static dt_status topk_decode(const dt_config *c, const uint8_t *msg, size_t bytes, size_t len, float *out) {
    (void)c;
    if (bytes % sizeof(pair) || bytes / sizeof(pair) > len)
        return dt_error(DT_ERR_ARG, "a topk message of %zu bytes for %zu values (expected whole 8-byte pairs, at "
                                    "most one a value)",
                        bytes, len);
    memset(out, 0, len * sizeof *out);
    for (size_t j = 0; j < bytes / sizeof(pair); j++) {
        pair q;
        memcpy(&q, msg + j * sizeof q, sizeof q);
        if (q.i >= len) return dt_error(DT_ERR_ARG, "a topk message's pair %zu: index %u of %zu values", j, q.i, len);
        out[q.i] += q.v;
    }
    return DT_OK;
}

const dt_codec_ops dt_codec_topk = {"topk",       sizeof(dt_codec), topk_wants, NULL,       NULL,
                                    sparse_start, sparse_finish,    topk_encode, topk_decode};
const dt_codec_ops dt_codec_randomk = {"randomk",    sizeof(dt_codec), randomk_wants, NULL, NULL,
                                       sparse_start, sparse_finish,    NULL,          NULL};
