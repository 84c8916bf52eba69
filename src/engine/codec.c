/* The gradient codecs (codec.h) and their registry. */
#include "engine/codec.h"

#include <stdlib.h>

// ----------------------------------------------------------------------------
// fp32: the piece summed as it is, one non-blocking allreduce.

static int fp32_wants(const dt_config *c) {
    (void)c;
    return 1;
}

static dt_status fp32_start(dt_codec *k, float *g, size_t lo, size_t hi, dt_request_t *req) {
    return dt_iallreduce(g + lo, g + lo, hi - lo, DT_F32, DT_SUM, k->comm, req);
}

static dt_status fp32_finish(dt_codec *k, float *g, size_t lo, size_t hi, dt_request_t *req) {
    (void)k, (void)g, (void)lo, (void)hi;
    return dt_wait(req);
}

static const dt_codec_ops codec_fp32 = {"fp32", sizeof(dt_codec), fp32_wants, NULL, NULL, fp32_start, fp32_finish};

// ----------------------------------------------------------------------------
// the registry: the first codec that wants the config

static const dt_codec_ops *const codecs[] = {&codec_fp32};

dt_status dt_codec_create(dt_codec **out, const dt_config *c, dt_comm_t comm, size_t n) {
    *out = NULL;
    const dt_codec_ops *ops = NULL;
    for (size_t i = 0; i < sizeof codecs / sizeof *codecs && !ops; i++)
        if (codecs[i]->wants(c)) ops = codecs[i];
    if (!ops) return dt_error(DT_ERR_CONFIG, "no gradient codec for this config");
    dt_codec *k = calloc(1, ops->size);
    if (!k) return dt_error(DT_ERR_NOMEM, "gradient codec %s: out of memory", ops->name);
    *k = (dt_codec){ops, c, comm, n};
    dt_status st = ops->init ? ops->init(k) : DT_OK;
    if (st != DT_OK) {
        free(k);
        return st;
    }
    *out = k;
    return DT_OK;
}

void dt_codec_free(dt_codec *k) {
    if (!k) return;
    if (k->ops->fini) k->ops->fini(k);
    free(k);
}
