/* Gradient codecs: how a piece of the gradient block becomes the sum over
 * the ranks, under the data-parallel strategy (engine/dp.c), like PyTorch
 * DDP's communication hooks.
 *
 * For each contiguous piece grads[lo, hi) of a bucket, dp.c calls start()
 * as soon as backward has finished the piece (it encodes, and starts the
 * first communication round without blocking), and later finish() (it waits,
 * runs any further rounds, and decodes the sum into grads[lo, hi)). A codec
 * owns per-rank state across steps, indexed by position in the block (error
 * feedback residuals, PowerSGD's Q), sized by n at init. Pieces are the same
 * at every step, so lo identifies one.
 *
 * Registered in codec.c's table, one row per [compression] method (the
 * compressing ones in codec_cast.c, codec_quant.c, codec_sparse.c and
 * codec_powersgd.c, docs/compression.md); "fp32" (a plain fp32 sum
 * allreduce, method = none) is the last, the fallback. */
#ifndef DT_ENGINE_CODEC_H
#define DT_ENGINE_CODEC_H

#include "dtrain/comm.h"
#include "dtrain/config.h"

typedef struct dt_codec dt_codec;

typedef struct dt_codec_ops {
    const char *name;
    size_t size;                                 /* of the codec's struct, which starts with dt_codec */
    int (*wants)(const dt_config *c);            /* the registry takes the first that wants c */
    dt_status (*init)(dt_codec *k);              /* may be NULL */
    void (*fini)(dt_codec *k);                   /* may be NULL */
    dt_status (*start)(dt_codec *k, float *grads, size_t lo, size_t hi, dt_request_t *req);
    dt_status (*finish)(dt_codec *k, float *grads, size_t lo, size_t hi, dt_request_t *req);
} dt_codec_ops;

/* Per-piece state of the compressing codecs, kept across steps (pieces are
 * the same every step; found by lo). */
typedef struct {
    size_t lo, hi;
    uint8_t *buf;      /* wire buffers (the codec lays them out), grown by dt_codec_buf */
    size_t cap;
    float *q;          /* PowerSGD: the warm-started Q */
    uint32_t *perm;    /* random-k: a permutation of the piece, the same on every rank */
    dt_rng rng;        /* seeded from [train] seed and lo; the same on every rank */
    int64_t step;      /* start() calls so far */
    size_t sent;       /* what start() chose for finish() (top-k, random-k: k) */
} dt_codec_piece;

struct dt_codec {
    const dt_codec_ops *ops;
    const dt_config *c;
    dt_comm_t comm;
    size_t n;  /* the gradient block's length */
    int rank, world;
    float *residual;   /* error feedback: what was not sent, per position (NULL: off) */
    float *velocity;   /* top-k momentum correction (NULL: off) */
    dt_codec_piece *pieces;
    int npieces, cappieces;
};

/* The codec c asks for, built for a block of n gradients. */
dt_status dt_codec_create(dt_codec **out, const dt_config *c, dt_comm_t comm, size_t n);
void dt_codec_free(dt_codec *k);

/* ---- building blocks of the compressing codecs -------------------------- */

/* The piece starting at lo (created on first use, its rng seeded with salt
 * mixed in); NULL when out of memory (dt_error set). */
dt_codec_piece *dt_codec_piece_at(dt_codec *k, size_t lo, size_t hi, uint64_t salt);
/* p->buf with room for at least bytes (aligned for floats); NULL when out
 * of memory. */
uint8_t *dt_codec_buf(dt_codec_piece *p, size_t bytes);
/* 1 when the piece is below [compression] min_bytes: it goes as fp32. */
int dt_codec_small(const dt_codec *k, size_t lo, size_t hi);
/* The fp32 codec's two halves, for pieces sent uncompressed. */
dt_status dt_codec_plain_start(dt_codec *k, float *g, size_t lo, size_t hi, dt_request_t *req);
dt_status dt_codec_plain_finish(dt_codec *k, float *g, size_t lo, size_t hi, dt_request_t *req);
/* Error feedback: g[lo, hi) += residual (nothing when off). */
void dt_codec_ef_add(dt_codec *k, float *g, size_t lo, size_t hi);

extern const dt_codec_ops dt_codec_cast16;   /* codec_cast.c: fp16, bf16 */
extern const dt_codec_ops dt_codec_quant;    /* codec_quant.c: int8, qsgd, sign */
extern const dt_codec_ops dt_codec_sparse;   /* codec_sparse.c: topk, randomk */
extern const dt_codec_ops dt_codec_powersgd; /* codec_powersgd.c */

#endif
