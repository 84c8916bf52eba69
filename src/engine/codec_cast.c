/* fp16 and bf16: the piece rounded to 16 bits and summed by one allreduce
 * in that type (the communication layer accumulates in fp32 and rounds the
 * sum once more to 16 bits), like DDP's fp16_compress_hook. Half the bytes
 * of fp32; with error feedback, each rank keeps its rounding error. */
#include "engine/codec.h"

static dt_dtype type_of(const dt_codec *k) { return k->c->comp_method == DT_COMP_FP16 ? DT_F16 : DT_BF16; }

// [parallel] grad_dtype = bf16 under plain data parallel is this codec
// without error feedback (the codec keeps residuals only for a method).
static int cast_wants(const dt_config *c) {
    return c->comp_method == DT_COMP_FP16 || c->comp_method == DT_COMP_BF16 || (c->comp_method == DT_COMP_NONE && c->grad_dtype);
}

static dt_status cast_start(dt_codec *k, float *g, size_t lo, size_t hi, dt_request_t *req) {
    if (dt_codec_small(k, lo, hi)) return dt_codec_plain_start(k, g, lo, hi, req);
    size_t len = hi - lo;
    dt_codec_piece *p = dt_codec_piece_at(k, lo, hi);
    uint8_t *buf = p ? dt_codec_buf(p, len * 2) : NULL;
    if (!buf) return DT_ERR_NOMEM;
    dt_codec_piece_begin(k, p, 0);
    dt_codec_ef_add(k, g, lo, hi);
    dt_from_f32(buf, g + lo, len, type_of(k));
    if (k->residual) {  // what the rank's 16-bit values lost
        float *r = k->residual + lo;
        dt_to_f32(r, buf, len, type_of(k));
        for (size_t i = 0; i < len; i++) r[i] = g[lo + i] - r[i];
    }
    return dt_iallreduce(buf, buf, len, type_of(k), DT_SUM, k->comm, req);
}

static dt_status cast_finish(dt_codec *k, float *g, size_t lo, size_t hi, dt_request_t *req) {
    if (dt_codec_small(k, lo, hi)) return dt_codec_plain_finish(k, g, lo, hi, req);
    dt_status st = dt_wait(req);
    if (st != DT_OK) return st;
    dt_to_f32(g + lo, dt_codec_piece_at(k, lo, hi)->buf, hi - lo, type_of(k));
    return DT_OK;
}

const dt_codec_ops dt_codec_cast16 = {"fp16/bf16", sizeof(dt_codec), cast_wants, NULL, NULL, cast_start, cast_finish};
