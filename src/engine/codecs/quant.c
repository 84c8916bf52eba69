/* Quantized codecs: int8, qsgd and sign. The piece is cut into chunks of
 * CHUNK values, each sent as one fp32 scale and a small code per value:
 *
 *   int8  code = round(x / s) in [-127, 127], s = max|x| / 127
 *   qsgd  code = +-l, l in [0, levels] drawn so that E[l] = |x| / s exactly
 *         (stochastic rounding, unbiased), s = max|x| / levels (QSGD with
 *         the chunk's max norm: its variance is at most s^2 / 4 a value,
 *         where the 2-norm's s = ||chunk||_2 / levels rounds most values
 *         of a 512-value chunk to 0 or 1 level); four bits per value when
 *         levels <= 7, else eight
 *   sign  one bit per value, +-s with s = mean |x| (scaled sign, EF-SignSGD)
 *
 * decoded: code * s. The sum of W such codes does not fit the code's type.
 * On 2 ranks each rank's message is allgathered (one dt_iallgather of
 * bytes) and each decodes and adds them in rank order: the same sum on
 * both. From 3 ranks on, so that the bytes stay a fixed share of fp32's at
 * any W, the sum takes two phases (1-bit Adam's and BytePS's way): the
 * piece is cut into W chunks, each encoded on its own; rank j receives
 * every rank's message of chunk j (point to point), adds them in rank
 * order, re-quantizes the sum with an error feedback of its own
 * (residual2) and the W re-quantized chunks are allgathered, so every rank
 * decodes the same sum. A rank sends 2 (W - 1) messages of a W-th of the
 * piece: 2 (W - 1) / W of its one-message bytes, as a ring allreduce does
 * of fp32's. With error feedback each rank keeps x - decoded(x) (and its
 * chunks' sum - decoded(sum)). A parameter server's push is the rank's
 * one message. */
#include "engine/codecs/codec.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define CHUNK 512

static int quant_wants(const dt_config *c) {
    return c->comp_method == DT_COMP_INT8 || c->comp_method == DT_COMP_QSGD || c->comp_method == DT_COMP_SIGN;
}

// Bits per value's code.
static int code_bits(int method, int levels) {
    return method == DT_COMP_SIGN ? 1 : method == DT_COMP_QSGD && levels <= 7 ? 4 : 8;
}

// A rank's message for len values: the scales, then the codes, rounded up
// to whole floats.
static size_t msg_bytes(int method, int levels, size_t len) {
    size_t nc = (len + CHUNK - 1) / CHUNK, codes = (len * (size_t)code_bits(method, levels) + 7) / 8;
    return (nc * 4 + codes + 3) / 4 * 4;
}

static void encode(int method, int levels, const float *x, size_t len, uint8_t *out, dt_rng *rng) {
    size_t nc = (len + CHUNK - 1) / CHUNK;
    float *scale = (float *)out;
    uint8_t *code = out + nc * 4;
    int bits = code_bits(method, levels);
    if (bits < 8) memset(code, 0, (len * (size_t)bits + 7) / 8);
    for (size_t c = 0; c < nc; c++) {
        size_t a = c * CHUNK, b = a + CHUNK < len ? a + CHUNK : len;
        double acc = 0;
        for (size_t i = a; i < b; i++) {
            double v = fabs((double)x[i]);
            if (method == DT_COMP_SIGN) acc += v;
            else acc = v > acc ? v : acc;
        }
        float s = method == DT_COMP_INT8 ? (float)(acc / 127)
                  : method == DT_COMP_QSGD ? (float)(acc / levels) : (float)(acc / (double)(b - a));
        scale[c] = s;
        for (size_t i = a; i < b; i++) {
            if (method == DT_COMP_SIGN) {
                if (x[i] >= 0) code[i / 8] |= (uint8_t)(1u << (i % 8));
                continue;
            }
            int q = 0;
            if (s > 0 && method == DT_COMP_INT8) {
                float r = rintf(x[i] / s);
                q = (int)(r > 127 ? 127 : r < -127 ? -127 : r);
            } else if (s > 0) {
                float v = fabsf(x[i]) / s, l = floorf(v);
                if (dt_rng_uniform(rng) < v - l) l += 1;
                q = (int)(l > (float)levels ? (float)levels : l);
                if (x[i] < 0) q = -q;
            }
            if (bits == 4) code[i / 2] |= (uint8_t)((q & 0xf) << (4 * (i % 2)));
            else code[i] = (uint8_t)(int8_t)q;
        }
    }
}

// acc[i] += alpha * decoded value i.
static void decode_add(int method, int levels, const uint8_t *in, size_t len, float alpha, float *acc) {
    size_t nc = (len + CHUNK - 1) / CHUNK;
    const float *scale = (const float *)in;
    const uint8_t *code = in + nc * 4;
    int bits = code_bits(method, levels);
    for (size_t i = 0; i < len; i++) {
        float s = scale[i / CHUNK], v;
        if (bits == 1) v = code[i / 8] >> (i % 8) & 1 ? s : -s;
        else if (bits == 4) v = (float)(((code[i / 2] >> (4 * (i % 2)) & 0xf) ^ 8) - 8) * s;  // 4-bit two's complement
        else v = (float)(int8_t)code[i] * s;
        acc[i] += alpha * v;
    }
}

// Encodes x[0, len) into out with error feedback r (NULL: none): r = x - decoded.
static void encode_ef(const dt_codec *k, const float *x, size_t len, uint8_t *out, float *r, dt_rng *rng) {
    int m = k->c->comp_method, L = k->c->comp_levels;
    encode(m, L, x, len, out, rng);
    if (!r) return;
    memcpy(r, x, len * sizeof *r);
    decode_add(m, L, out, len, -1, r);
}

// A step's start for piece p: its draws (each rank its own) and the
// residuals added to g[lo, hi).
static void begin_piece(dt_codec *k, float *g, size_t lo, size_t hi, dt_codec_piece *p) {
    dt_codec_piece_begin(k, p, 0x51u + (uint64_t)k->rank * 0x100000001b3ull);
    dt_codec_ef_add(k, g, lo, hi);
}

// This rank's message for g[lo, hi) into out (msg_bytes), error feedback
// kept.
static void quant_message(dt_codec *k, float *g, size_t lo, size_t hi, dt_codec_piece *p, uint8_t *out) {
    begin_piece(k, g, lo, hi, p);
    encode_ef(k, g + lo, hi - lo, out, k->residual ? k->residual + lo : NULL, &p->rng);
}

// ---- the two-phase sum (3 ranks or more) ----

static int two_phase(const dt_codec *k) { return k->world >= 3; }

static dt_status quant_init(dt_codec *k) {
    if (!two_phase(k) || !k->residual) return DT_OK;
    if (!(k->residual2 = calloc(k->n, sizeof(float))))
        return dt_error(DT_ERR_NOMEM, "gradient codec %s: out of memory for %zu residuals", k->ops->name, k->n);
    return DT_OK;
}

// Chunk j of a piece of len values cut in W: [*a, *b) from its start.
static void chunk_of(size_t len, int W, int j, size_t *a, size_t *b) {
    *a = len * (size_t)j / (size_t)W;
    *b = len * (size_t)(j + 1) / (size_t)W;
}

// The bytes of a chunk's message (every chunk's, so that they allgather:
// the largest chunk's).
static size_t chunk_bytes(const dt_codec *k, size_t len) {
    return msg_bytes(k->c->comp_method, k->c->comp_levels, (len + (size_t)k->world - 1) / (size_t)k->world);
}

// Phase 1: the chunks encoded (buf: W messages out, W in, W sums, B bytes
// each), chunk j sent to rank j and this rank's chunk received from each.
static dt_status two_start(dt_codec *k, float *g, size_t lo, size_t hi, dt_request_t *req) {
    int W = k->world, me = k->rank;
    size_t len = hi - lo, B = chunk_bytes(k, len), a, b;
    dt_codec_piece *p = dt_codec_piece_at(k, lo, hi);
    uint8_t *buf = p ? dt_codec_buf(p, 3 * B * (size_t)W) : NULL;
    if (p && !p->reqs) p->reqs = calloc(2 * (size_t)W, sizeof *p->reqs);
    if (!buf || !p->reqs) return dt_error(DT_ERR_NOMEM, "gradient codec %s: out of memory", k->ops->name);
    uint8_t *out = buf, *in = buf + B * (size_t)W;
    begin_piece(k, g, lo, hi, p);
    for (int j = 0; j < W; j++) {
        chunk_of(len, W, j, &a, &b);
        encode_ef(k, g + lo + a, b - a, out + B * (size_t)j, k->residual ? k->residual + lo + a : NULL, &p->rng);
    }
    memcpy(in + B * (size_t)me, out + B * (size_t)me, B);
    dt_status st = DT_OK;
    int n = 0;
    for (int j = 0; j < W && st == DT_OK; j++) {
        if (j == me) continue;
        st = dt_irecv(in + B * (size_t)j, B, DT_U8, j, k->comm, &p->reqs[n++]);
        if (st == DT_OK) st = dt_isend(out + B * (size_t)j, B, DT_U8, j, k->comm, &p->reqs[n++]);
    }
    if (st != DT_OK) {
        p->nreqs = n;  // (awaited by dt_codec_free)
        return st;
    }
    *req = p->reqs[--n];  // (one in flight for dp.c; the rest are the piece's)
    p->reqs[n] = NULL;
    p->nreqs = n;
    return DT_OK;
}

// Phase 2: this rank's chunk summed in rank order, re-quantized, and the W
// sums allgathered and decoded into g[lo, hi).
static dt_status two_finish(dt_codec *k, float *g, size_t lo, size_t hi, dt_request_t *req) {
    int W = k->world, me = k->rank, m = k->c->comp_method, L = k->c->comp_levels;
    dt_codec_piece *p = dt_codec_piece_at(k, lo, hi);
    dt_status st = dt_wait(req);
    for (int j = 0; j < p->nreqs; j++) {
        dt_status s2 = dt_wait(&p->reqs[j]);
        if (st == DT_OK) st = s2;
    }
    p->nreqs = 0;
    if (st != DT_OK) return st;
    size_t len = hi - lo, B = chunk_bytes(k, len), a, b;
    uint8_t *in = p->buf + B * (size_t)W, *sums = p->buf + 2 * B * (size_t)W;
    chunk_of(len, W, me, &a, &b);
    float *s = g + lo + a, *r2 = k->residual2 ? k->residual2 + lo + a : NULL;
    memset(s, 0, (b - a) * sizeof *s);
    for (int j = 0; j < W; j++) decode_add(m, L, in + B * (size_t)j, b - a, 1, s);
    for (size_t e = 0; r2 && e < b - a; e++) s[e] += r2[e];
    encode_ef(k, s, b - a, sums + B * (size_t)me, r2, &p->rng);
    if ((st = dt_allgather(sums + B * (size_t)me, sums, B, DT_U8, k->comm)) != DT_OK) return st;
    memset(g + lo, 0, len * sizeof *g);
    for (int j = 0; j < W; j++) {
        chunk_of(len, W, j, &a, &b);
        decode_add(m, L, sums + B * (size_t)j, b - a, 1, g + lo + a);
    }
    return DT_OK;
}

// ---- the codec ----

static dt_status quant_start(dt_codec *k, float *g, size_t lo, size_t hi, dt_request_t *req) {
    if (dt_codec_small(k, lo, hi)) return dt_codec_plain_start(k, g, lo, hi, req);
    if (two_phase(k)) return two_start(k, g, lo, hi, req);
    size_t B = msg_bytes(k->c->comp_method, k->c->comp_levels, hi - lo);
    dt_codec_piece *p = dt_codec_piece_at(k, lo, hi);
    uint8_t *buf = p ? dt_codec_buf(p, B * (size_t)k->world) : NULL;
    if (!buf) return DT_ERR_NOMEM;
    uint8_t *mine = buf + B * (size_t)k->rank;
    quant_message(k, g, lo, hi, p, mine);
    return dt_iallgather(mine, buf, B, DT_U8, k->comm, req);
}

static dt_status quant_finish(dt_codec *k, float *g, size_t lo, size_t hi, dt_request_t *req) {
    if (dt_codec_small(k, lo, hi)) return dt_codec_plain_finish(k, g, lo, hi, req);
    if (two_phase(k)) return two_finish(k, g, lo, hi, req);
    dt_status st = dt_wait(req);
    if (st != DT_OK) return st;
    int m = k->c->comp_method, L = k->c->comp_levels;
    size_t len = hi - lo, B = msg_bytes(m, L, len);
    const uint8_t *buf = dt_codec_piece_at(k, lo, hi)->buf;
    memset(g + lo, 0, len * sizeof *g);
    for (int r = 0; r < k->world; r++) decode_add(m, L, buf + B * (size_t)r, len, 1, g + lo);
    return DT_OK;
}

static size_t quant_encode(dt_codec *k, float *g, size_t lo, size_t hi, const uint8_t **msg) {
    size_t B = msg_bytes(k->c->comp_method, k->c->comp_levels, hi - lo);
    dt_codec_piece *p = dt_codec_piece_at(k, lo, hi);
    uint8_t *buf = p ? dt_codec_buf(p, B) : NULL;
    if (!buf) return 0;
    quant_message(k, g, lo, hi, p, buf);
    *msg = buf;
    return B;
}

static dt_status quant_decode(const dt_config *c, const uint8_t *msg, size_t bytes, size_t len, float *out) {
    size_t B = msg_bytes(c->comp_method, c->comp_levels, len);
    if (bytes != B)
        return dt_error(DT_ERR_ARG, "a %s message of %zu bytes for %zu values (expected %zu)",
                        dt_comp_method_name(c->comp_method), bytes, len, B);
    memset(out, 0, len * sizeof *out);
    decode_add(c->comp_method, c->comp_levels, msg, len, 1, out);
    return DT_OK;
}

const dt_codec_ops dt_codec_quant = {"int8/qsgd/sign", sizeof(dt_codec), quant_wants,  quant_init,  NULL,
                                     quant_start,      quant_finish,      quant_encode, quant_decode};
