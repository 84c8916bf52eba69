/* The gradient codecs (codec.h), their registry, and the parts the
 * compressing codecs share. */
#include "engine/codec.h"

#include <stdlib.h>
#include <string.h>

// ----------------------------------------------------------------------------
// fp32: the piece summed as it is, one non-blocking allreduce.

static int fp32_wants(const dt_config *c) {
    (void)c;
    return 1;
}

dt_status dt_codec_plain_start(dt_codec *k, float *g, size_t lo, size_t hi, dt_request_t *req) {
    return dt_iallreduce(g + lo, g + lo, hi - lo, DT_F32, DT_SUM, k->comm, req);
}

dt_status dt_codec_plain_finish(dt_codec *k, float *g, size_t lo, size_t hi, dt_request_t *req) {
    (void)k, (void)g, (void)lo, (void)hi;
    return dt_wait(req);
}

static const dt_codec_ops codec_fp32 = {"fp32", sizeof(dt_codec), fp32_wants, NULL, NULL, dt_codec_plain_start,
                                        dt_codec_plain_finish};

// ----------------------------------------------------------------------------
// the registry: the first codec that wants the config

static const dt_codec_ops *const codecs[] = {&dt_codec_cast16, &dt_codec_quant, &dt_codec_sparse,
                                             &dt_codec_powersgd, &codec_fp32};

dt_status dt_codec_create(dt_codec **out, const dt_config *c, dt_comm_t comm, size_t n) {
    *out = NULL;
    const dt_codec_ops *ops = NULL;
    for (size_t i = 0; i < sizeof codecs / sizeof *codecs && !ops; i++)
        if (codecs[i]->wants(c)) ops = codecs[i];
    if (!ops) return dt_error(DT_ERR_CONFIG, "no gradient codec for this config");
    dt_codec *k = calloc(1, ops->size);
    if (!k) return dt_error(DT_ERR_NOMEM, "gradient codec %s: out of memory", ops->name);
    *k = (dt_codec){ops, c, comm, n, dt_comm_rank(comm), dt_comm_size(comm), NULL, NULL, NULL, 0, 0};
    dt_status st = DT_OK;
    if (c->comp_method != DT_COMP_NONE && c->comp_error_feedback && n) {
        k->residual = calloc(n, sizeof(float));
        if (c->comp_momentum > 0) k->velocity = calloc(n, sizeof(float));
        if (!k->residual || (c->comp_momentum > 0 && !k->velocity))
            st = dt_error(DT_ERR_NOMEM, "gradient codec %s: out of memory for %zu residuals", ops->name, n);
    }
    if (st == DT_OK && ops->init) st = ops->init(k);
    if (st != DT_OK) {
        dt_codec_free(k);
        return st;
    }
    *out = k;
    return DT_OK;
}

void dt_codec_free(dt_codec *k) {
    if (!k) return;
    if (k->ops->fini) k->ops->fini(k);
    for (int i = 0; i < k->npieces; i++) {
        free(k->pieces[i].buf);
        free(k->pieces[i].q);
        free(k->pieces[i].perm);
    }
    free(k->pieces);
    free(k->residual);
    free(k->velocity);
    free(k);
}

// ----------------------------------------------------------------------------
// shared by the compressing codecs

dt_codec_piece *dt_codec_piece_at(dt_codec *k, size_t lo, size_t hi, uint64_t salt) {
    for (int i = 0; i < k->npieces; i++)
        if (k->pieces[i].lo == lo) return &k->pieces[i];
    if (k->npieces == k->cappieces) {
        int cap = k->cappieces ? 2 * k->cappieces : 16;
        dt_codec_piece *p = realloc(k->pieces, sizeof *p * (size_t)cap);
        if (!p) return dt_error(DT_ERR_NOMEM, "gradient codec %s: out of memory", k->ops->name), NULL;
        k->pieces = p;
        k->cappieces = cap;
    }
    dt_codec_piece *p = &k->pieces[k->npieces++];
    memset(p, 0, sizeof *p);
    p->lo = lo;
    p->hi = hi;
    dt_rng_seed(&p->rng, k->c->seed ^ (0x9e3779b97f4a7c15ull * (lo + 1)) ^ salt);
    return p;
}

uint8_t *dt_codec_buf(dt_codec_piece *p, size_t bytes) {
    if (bytes <= p->cap) return p->buf;
    free(p->buf);
    p->cap = 0;
    p->buf = malloc(bytes);
    if (!p->buf) return dt_error(DT_ERR_NOMEM, "gradient codec: out of memory for %zu bytes", bytes), NULL;
    p->cap = bytes;
    return p->buf;
}

int dt_codec_small(const dt_codec *k, size_t lo, size_t hi) {
    return (hi - lo) * sizeof(float) < (size_t)k->c->comp_min_bytes;
}

void dt_codec_ef_add(dt_codec *k, float *g, size_t lo, size_t hi) {
    if (!k->residual) return;
    for (size_t i = lo; i < hi; i++) g[i] += k->residual[i];
}
