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
 * Registered in codec.c's table; "fp32" (a plain fp32 sum allreduce) is the
 * first. */
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

struct dt_codec {
    const dt_codec_ops *ops;
    const dt_config *c;
    dt_comm_t comm;
    size_t n;  /* the gradient block's length */
};

/* The codec c asks for, built for a block of n gradients. */
dt_status dt_codec_create(dt_codec **out, const dt_config *c, dt_comm_t comm, size_t n);
void dt_codec_free(dt_codec *k);

#endif
