/* Gradient codecs: how a piece of the gradient block becomes the sum over
 * the ranks, under the data-parallel strategy (engine/strategies/dp.c), like PyTorch
 * DDP's communication hooks.
 *
 * For each contiguous piece grads[lo, hi) of a bucket, dp.c calls start()
 * as soon as backward has finished the piece (it encodes, and starts the
 * first communication round without blocking), and later finish() (it waits,
 * runs any further rounds, and decodes the sum into grads[lo, hi)). A codec
 * owns per-rank state across steps, indexed by position in the block (error
 * feedback residuals, PowerSGD's Q), sized by n at init. Pieces are the same
 * at every step, so lo identifies one. The state goes into checkpoints
 * (dt_codec_state, dt_codec_restore); a codec's random draws are functions
 * of ([train] seed, piece, rank, the piece's step), so they need none.
 *
 * Registered in codec.c's table, one row per [compression] method (the
 * compressing ones in cast.c, quant.c, sparse.c and
 * powersgd.c, docs/compression.md); "fp32" (a plain fp32 sum
 * allreduce, method = none) is the last, the fallback. */
#ifndef DT_ENGINE_CODEC_H
#define DT_ENGINE_CODEC_H

#include "dtrain/ckpt.h"
#include "dtrain/comm.h"
#include "dtrain/config.h"
#include "dtrain/nn.h"

typedef struct dt_codec dt_codec;

typedef struct dt_codec_ops {
    const char *name;
    size_t size;                                 /* of the codec's struct, which starts with dt_codec */
    int (*wants)(const dt_config *c);            /* the registry takes the first that wants c */
    dt_status (*init)(dt_codec *k);              /* may be NULL */
    void (*fini)(dt_codec *k);                   /* may be NULL */
    dt_status (*start)(dt_codec *k, float *grads, size_t lo, size_t hi, dt_request_t *req);
    dt_status (*finish)(dt_codec *k, float *grads, size_t lo, size_t hi, dt_request_t *req);
    /* Point to point, for a parameter server's pushes (NULL: the method has
     * no message of one rank alone). encode: this rank's message for
     * grads[lo, hi), error feedback applied as start() applies it, in the
     * piece's buffer (valid until the piece's next step): *msg and its
     * bytes (0: failed, dt_error set). decode: a message of len values into
     * out[len]; DT_ERR_ARG naming what is wrong when it is not one. */
    size_t (*encode)(dt_codec *k, float *grads, size_t lo, size_t hi, const uint8_t **msg);
    dt_status (*decode)(const dt_config *c, const uint8_t *msg, size_t bytes, size_t len, float *out);
} dt_codec_ops;

/* Per-piece state of the compressing codecs, kept across steps (pieces are
 * the same every step; found by lo). */
typedef struct {
    size_t lo, hi;
    uint8_t *buf;      /* wire buffers (the codec lays them out), grown by dt_codec_buf */
    size_t cap;
    float *q;          /* PowerSGD: the warm-started Qs of the piece's nmat matrices, nq floats */
    size_t nq, nmat;
    uint32_t *perm;    /* random-k: the piece's indices, shuffled afresh at each step */
    dt_rng rng;        /* dt_codec_piece_begin's: seeded from [train] seed, lo, a salt and step */
    int64_t step;      /* steps begun so far (dt_codec_piece_begin) */
    size_t sent;       /* what start() chose for finish() (top-k, random-k: k; top-k 0: a dense warm-up step) */
    dt_request_t *reqs; /* requests start() left in flight besides the one it returned, nreqs (the two-phase
                           quantized sum's point-to-point messages); awaited by finish(), else by dt_codec_free */
    int nreqs;
} dt_codec_piece;

struct dt_codec {
    const dt_codec_ops *ops;
    const dt_config *c;
    dt_comm_t comm;
    size_t n;  /* the gradient block's length */
    dt_grad_matrix *mats; /* the block's 2-D tensors, in block order (a copy) */
    int nmats;
    int rank, world;
    float *residual;   /* error feedback: what was not sent, per position (NULL: off) */
    float *residual2;  /* ... and of the sums this rank re-quantizes in the two-phase quantized sum, at the
                          positions of its chunks (NULL: off, or one phase) */
    float *velocity;   /* top-k momentum correction (NULL: off) */
    dt_codec_piece *pieces;
    int npieces, cappieces;
    int64_t step0;     /* a new piece's step: 0, or the step the restored state had reached */
    char names[6][48]; /* of the state's checkpoint tensors, "codec.METHOD.residual", ... */
    int64_t *table;    /* dt_codec_state's scratch: the pieces' (lo, hi, nq), their Qs packed */
    float *packed;
    int64_t saved_step;
    int refit_warned;
};

/* The codec c asks for, built for a block of n gradients whose 2-D
 * tensors are mats[nmats] (in block order, not overlapping; NULL, 0: none,
 * the block is vectors); DT_ERR_ARG when they are not. */
dt_status dt_codec_create(dt_codec **out, const dt_config *c, dt_comm_t comm, size_t n, const dt_grad_matrix *mats,
                          int nmats);
/* The matrices of parameter tensor t, as PyTorch DDP's PowerSGD hook views
 * a tensor (shape[0] x the product of the rest; none for a vector): layers
 * = 0 a tensor of its own; layers = L > 0 a tensor stacked over L layers
 * (shape[0] = L), L matrices shape[1] x the rest (none when per layer it is
 * a vector). Writes them to out (NULL: only counts) and returns how many. */
int dt_codec_matrices(const dt_tensor_info *t, int64_t layers, dt_grad_matrix *out);
void dt_codec_free(dt_codec *k);
/* Whether c's method has point-to-point messages (ops encode and decode):
 * every one but random-k (its indices are drawn alike by every rank of one
 * allreduce) and PowerSGD (two allreduces over the ranks per piece). */
int dt_codec_p2p(const dt_config *c);
/* The message of another process's dt_codec_ops.encode, of len values, into
 * out[len] (a parameter server's side: no codec needed). */
dt_status dt_codec_decode(const dt_config *c, const uint8_t *msg, size_t bytes, size_t len, float *out);

/* ---- checkpoints (docs/compression.md) ----------------------------------
 *
 * A compressing codec keeps state across steps, saved in this rank's shard
 * of a sharded checkpoint as tensors named codec.METHOD.*: "step" (I64 [1],
 * the steps it has run), "residual" and "velocity" (F32 [n], this rank's
 * error feedback and DGC momentum, when on), and PowerSGD's "pieces" (I64
 * [p, 4]: each piece's lo, hi, the length of its Qs and its number of
 * matrices) and "q" (F32, the Qs one after
 * the other; the same on every rank). The fp32 codec keeps none. */

/* Whether the codec keeps state (every method but none). */
int dt_codec_stateful(const dt_codec *k);
/* Up to max tensors of the state (views of the codec's buffers, valid
 * until its next step), t may be NULL when max is 0; returns how many
 * there are (0: stateless). */
int dt_codec_state(dt_codec *k, dt_st_tensor *t, int max);
/* Continues from the state in checkpoint `path` (a collective: every rank
 * calls it; "" or NULL: a fresh start, nothing is done), written by `parts`
 * ranks (dt_ckpt_open_part), or by `own` workers beside the parameter
 * servers' shards (dt_ckpt_open_own; those win). With parts = world each rank takes its own
 * part's state; otherwise rank 0 reads every part, each rank gets the mean
 * of their residuals and velocities (which keeps the unsent sum (1/W) x
 * sum_r residual_r) and the shared step and Qs. A checkpoint without this
 * method's state leaves the codec fresh, said in one line on rank 0. */
dt_status dt_codec_restore(dt_codec *k, const char *path, int parts);

/* ---- building blocks of the compressing codecs -------------------------- */

/* The piece starting at lo (created on first use; found with another hi, as
 * after a checkpoint cut differently, it starts afresh); NULL when out of
 * memory (dt_error set). */
dt_codec_piece *dt_codec_piece_at(dt_codec *k, size_t lo, size_t hi);
/* A step of piece p begins: seeds p->rng from [train] seed, lo, salt and
 * the step (a function of them, so that a resumed run draws what an
 * uninterrupted one would), counts the step and returns its index. */
int64_t dt_codec_piece_begin(dt_codec *k, dt_codec_piece *p, uint64_t salt);
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

extern const dt_codec_ops dt_codec_cast16;   /* cast.c: fp16, bf16 */
extern const dt_codec_ops dt_codec_quant;    /* quant.c: int8, qsgd, sign */
extern const dt_codec_ops dt_codec_topk;     /* sparse.c */
extern const dt_codec_ops dt_codec_randomk;  /* sparse.c */
extern const dt_codec_ops dt_codec_powersgd; /* powersgd.c */

#endif
