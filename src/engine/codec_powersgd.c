/* PowerSGD (Vogels et al. 2019), like DDP's powerSGD_hook: a piece of len
 * values is viewed as a rows x cols matrix M, row-major, with cols =
 * ceil(sqrt(len)) and rows = ceil(len / cols) (the tail of the last row
 * padded with zeros), and sent as two low-rank factors of rank r = min(rank,
 * rows, cols):
 *
 *   P = M Q          allreduce (sum) P; orthonormalize its columns
 *   Q = M^T P        allreduce (sum) Q
 *   M ~ P Q^T        the sum over ranks, projected on span(P)
 *
 * Q starts random (the same on every rank, from [train] seed and the piece)
 * and is kept for the next step (warm start: one power iteration per step).
 * When r = min(rows, cols), span(P) holds the sum's columns and the result
 * is the sum itself up to rounding. (rows + cols) x r floats go on the
 * wire instead of len. With error feedback each rank keeps M - (P Q^T) / W,
 * its share of what the approximation missed. */
#include "engine/codec.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    size_t rows, cols, r;
} shape;

static shape shape_of(const dt_codec *k, size_t len) {
    shape s;
    s.cols = (size_t)ceil(sqrt((double)len));
    s.rows = (len + s.cols - 1) / s.cols;
    s.r = (size_t)k->c->comp_rank;
    if (s.r > s.rows) s.r = s.rows;
    if (s.r > s.cols) s.r = s.cols;
    return s;
}

// The piece's buffer: P (rows x r floats), Q (cols x r), then rows x r
// doubles for the orthonormalization, at an 8-byte boundary.
static size_t work_at(shape s) { return ((s.rows + s.cols) * s.r * sizeof(float) + 7) / 8 * 8; }

static int psgd_wants(const dt_config *c) { return c->comp_method == DT_COMP_POWERSGD; }

static dt_status psgd_start(dt_codec *k, float *g, size_t lo, size_t hi, dt_request_t *req) {
    if (dt_codec_small(k, lo, hi)) return dt_codec_plain_start(k, g, lo, hi, req);
    size_t len = hi - lo;
    shape s = shape_of(k, len);
    dt_codec_piece *p = dt_codec_piece_at(k, lo, hi);
    float *P = p ? (float *)dt_codec_buf(p, work_at(s) + s.rows * s.r * sizeof(double)) : NULL;
    if (!P) return DT_ERR_NOMEM;
    dt_codec_piece_begin(k, p, 0x905);
    if (!p->q || p->nq != s.cols * s.r) {  // the first step, or a checkpoint's Q of another rank
        if (p->q && k->rank == 0 && !k->refit_warned++)
            dt_log(DT_LOG_WARN, "powersgd: the checkpoint's Q of piece [%zu, %zu) has %zu values, rank %zu needs %zu: "
                                "a new Q from the seed",
                   lo, hi, p->nq, s.r, s.cols * s.r);
        free(p->q);
        p->nq = 0;
        if (!(p->q = malloc(s.cols * s.r * sizeof(float))))
            return dt_error(DT_ERR_NOMEM, "gradient codec powersgd: out of memory");
        p->nq = s.cols * s.r;
        for (size_t i = 0; i < s.cols * s.r; i++) p->q[i] = dt_rng_normal(&p->rng);
    }
    dt_codec_ef_add(k, g, lo, hi);
    const float *x = g + lo, *Q = p->q;
    memset(P, 0, s.rows * s.r * sizeof(float));
    for (size_t i = 0; i < s.rows; i++)
        for (size_t c = 0; c < s.cols && i * s.cols + c < len; c++) {
            float v = x[i * s.cols + c];
            for (size_t j = 0; j < s.r; j++) P[i * s.r + j] += v * Q[c * s.r + j];
        }
    return dt_iallreduce(P, P, s.rows * s.r, DT_F32, DT_SUM, k->comm, req);
}

// Orthonormalizes the r columns of P (rows x r) by modified Gram-Schmidt
// in double, run twice ("twice is enough" for orthogonality in floating
// point); a column left with under 1e-5 of its norm is dependent on the ones
// before (a sum of lower rank than r) and becomes zero. w: rows x r doubles.
static void orthonormalize(float *P, double *w, size_t rows, size_t r) {
    for (size_t i = 0; i < rows * r; i++) w[i] = P[i];
    for (size_t j = 0; j < r; j++) {
        double n0 = 0;
        for (size_t i = 0; i < rows; i++) n0 += w[i * r + j] * w[i * r + j];
        for (int pass = 0; pass < 2; pass++)
            for (size_t q = 0; q < j; q++) {
                double d = 0;
                for (size_t i = 0; i < rows; i++) d += w[i * r + j] * w[i * r + q];
                for (size_t i = 0; i < rows; i++) w[i * r + j] -= d * w[i * r + q];
            }
        double nn = 0;
        for (size_t i = 0; i < rows; i++) nn += w[i * r + j] * w[i * r + j];
        double f = nn > 1e-10 * n0 && nn > 1e-60 ? 1 / sqrt(nn) : 0;
        for (size_t i = 0; i < rows; i++) w[i * r + j] *= f;
    }
    for (size_t i = 0; i < rows * r; i++) P[i] = (float)w[i];
}

static dt_status psgd_finish(dt_codec *k, float *g, size_t lo, size_t hi, dt_request_t *req) {
    if (dt_codec_small(k, lo, hi)) return dt_codec_plain_finish(k, g, lo, hi, req);
    dt_status st = dt_wait(req);
    if (st != DT_OK) return st;
    size_t len = hi - lo;
    shape s = shape_of(k, len);
    dt_codec_piece *p = dt_codec_piece_at(k, lo, hi);
    float *P = (float *)p->buf, *Q = P + s.rows * s.r, *x = g + lo;
    orthonormalize(P, (double *)(void *)(p->buf + work_at(s)), s.rows, s.r);
    memset(Q, 0, s.cols * s.r * sizeof(float));
    for (size_t i = 0; i < s.rows; i++)
        for (size_t c = 0; c < s.cols && i * s.cols + c < len; c++) {
            float v = x[i * s.cols + c];
            for (size_t j = 0; j < s.r; j++) Q[c * s.r + j] += v * P[i * s.r + j];
        }
    // Queued behind every piece's first round, in the same order on every rank.
    dt_request_t r2 = NULL;
    if ((st = dt_iallreduce(Q, Q, s.cols * s.r, DT_F32, DT_SUM, k->comm, &r2)) != DT_OK) return st;
    if ((st = dt_wait(&r2)) != DT_OK) return st;
    float share = 1.0f / (float)k->world;
    for (size_t i = 0; i < s.rows; i++)
        for (size_t c = 0; c < s.cols && i * s.cols + c < len; c++) {
            float a = 0;
            for (size_t j = 0; j < s.r; j++) a += P[i * s.r + j] * Q[c * s.r + j];
            size_t at = i * s.cols + c;
            if (k->residual) k->residual[lo + at] = x[at] - a * share;
            x[at] = a;
        }
    memcpy(p->q, Q, s.cols * s.r * sizeof(float));
    return DT_OK;
}

const dt_codec_ops dt_codec_powersgd = {"powersgd", sizeof(dt_codec), psgd_wants, NULL, NULL, psgd_start,
                                        psgd_finish};
