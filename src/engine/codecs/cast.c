/* fp16 and bf16: the piece rounded to 16 bits and summed by one allreduce
 * in that type (the communication layer accumulates in fp32 and rounds the
 * sum once more to 16 bits), like DDP's fp16_compress_hook. Half the bytes
 * of fp32; with error feedback, each rank keeps its rounding error. A
 * parameter server's push is the piece's 16-bit values. */
#include "engine/codecs/codec.h"


// [parallel] grad_dtype = bf16 under plain data parallel is this codec
// without error feedback (the codec keeps residuals only for a method).
static int cast_wants(const dt_config *c) {
    return c->comp_method == DT_COMP_FP16 || c->comp_method == DT_COMP_BF16 || (c->comp_method == DT_COMP_NONE && c->grad_dtype);
}

static dt_dtype type_for(const dt_config *c) { return c->comp_method == DT_COMP_FP16 ? DT_F16 : DT_BF16; }
static dt_dtype type_of(const dt_codec *k) { return type_for(k->c); }

// This rank's 16-bit values of g[lo, hi) in the piece's buffer, error
// feedback kept; NULL when out of memory.
static uint8_t *cast_message(dt_codec *k, float *g, size_t lo, size_t hi) {
    size_t len = hi - lo;
    dt_codec_piece *p = dt_codec_piece_at(k, lo, hi);
    uint8_t *buf = p ? dt_codec_buf(p, len * 2) : NULL;
    if (!buf) return NULL;
    dt_codec_piece_begin(k, p, 0);
    if (k->residual) dt_from_f32_ef(buf, g + lo, k->residual + lo, len, type_of(k));  // (what the values lost)
    else dt_from_f32(buf, g + lo, len, type_of(k));
    return buf;
}

static dt_status cast_start(dt_codec *k, float *g, size_t lo, size_t hi, dt_request_t *req) {
    if (dt_codec_small(k, lo, hi)) return dt_codec_plain_start(k, g, lo, hi, req);
    uint8_t *buf = cast_message(k, g, lo, hi);
    if (!buf) return DT_ERR_NOMEM;
    return dt_iallreduce(buf, buf, hi - lo, type_of(k), DT_SUM, k->comm, req);
}

static dt_status cast_finish(dt_codec *k, float *g, size_t lo, size_t hi, dt_request_t *req) {
    if (dt_codec_small(k, lo, hi)) return dt_codec_plain_finish(k, g, lo, hi, req);
    dt_status st = dt_wait(req);
    if (st != DT_OK) return st;
    dt_to_f32(g + lo, dt_codec_piece_at(k, lo, hi)->buf, hi - lo, type_of(k));
    return DT_OK;
}

static size_t cast_encode(dt_codec *k, float *g, size_t lo, size_t hi, const uint8_t **msg) {
    return (*msg = cast_message(k, g, lo, hi)) ? (hi - lo) * 2 : 0;
}

static dt_status cast_decode(const dt_config *c, const uint8_t *msg, size_t bytes, size_t len, float *out) {
    if (bytes != len * 2)
        return dt_error(DT_ERR_ARG, "a %s message of %zu bytes for %zu values (expected %zu)",
                        dt_comp_method_name(c->comp_method), bytes, len, len * 2);
    dt_to_f32(out, msg, len, type_for(c));
    return DT_OK;
}

const dt_codec_ops dt_codec_cast16 = {"fp16/bf16", sizeof(dt_codec), cast_wants,  NULL,       NULL,
                                      cast_start,  cast_finish,       cast_encode, cast_decode};
