/* PowerSGD (Vogels et al. 2019), like PyTorch DDP's powerSGD_hook: each
 * weight matrix of the model in its own shape (dt_codec_create's matrices:
 * a tensor's first dimension x the rest, row-major) is sent as two low-rank
 * factors. Within a piece [lo, hi) of the block, the whole rows of a matrix
 * that lie in the piece form M (rows x cols), of rank r = min(rank, rows,
 * cols):
 *
 *   P = M Q          allreduce (sum) P; orthonormalize its columns
 *   Q = M^T P        allreduce (sum) Q
 *   M ~ P Q^T        the sum over ranks, projected on span(P)
 *
 * The rest of the piece (vectors such as biases and layernorm weights, the
 * partial rows at the piece's edges, and matrices whose factors, (rows +
 * cols) x r floats, would not be smaller than rows x cols, DDP's
 * min_compression_rate) is summed as fp32 in the first allreduce, after
 * the Ps: a piece costs two allreduces.
 *
 * Each matrix's Q (cols x r) is kept transposed, r rows of cols floats, so
 * that the three products below run along M's rows over contiguous memory.
 * It starts random (the same on every rank, from [train] seed
 * and the piece) and is kept for the next step (warm start: one power
 * iteration per step). When r = min(rows, cols), span(P) holds the sum's
 * columns and the result is the sum itself up to rounding. With error
 * feedback each rank keeps M - (P Q^T) / W, its share of what the
 * approximation missed (0 where the values went as fp32). The first
 * [compression] warmup_steps steps of a piece go as a plain fp32 sum (DDP's
 * start_powerSGD_iter). */
#include "engine/codecs/codec.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

// A compressed matrix of a piece: rows x cols at g + at, rank r.
typedef struct {
    size_t at, rows, cols, r;
} mat;

// The compressed matrix of matrix m in [lo, hi); 0 when there is none.
static int mat_in(const dt_codec *k, const dt_grad_matrix *m, size_t lo, size_t hi, mat *out) {
    size_t end = m->offset + m->rows * m->cols;
    if (end <= lo || m->offset >= hi) return 0;
    size_t a = lo > m->offset ? lo : m->offset, b = hi < end ? hi : end;
    size_t r0 = (a - m->offset + m->cols - 1) / m->cols, r1 = (b - m->offset) / m->cols;
    if (r1 <= r0) return 0;
    mat x = {m->offset + r0 * m->cols, r1 - r0, m->cols, (size_t)k->c->comp_rank};
    if (x.r > x.rows) x.r = x.rows;
    if (x.r > x.cols) x.r = x.cols;
    if ((x.rows + x.cols) * x.r >= x.rows * x.cols) return 0;
    *out = x;
    return 1;
}

// The piece's layout: how many matrices, the total lengths of their Ps
// (np) and Qs (nq), of the fp32 values (nplain), and the largest P (most).
typedef struct {
    size_t count, np, nq, nplain, most;
} sizes;

// The piece's layout; each (when not NULL) is called on every matrix with
// the offsets of its P and Q in the wire buffers.
typedef void (*mat_fn)(const mat *m, size_t p_at, size_t q_at, void *user);
static sizes layout(const dt_codec *k, size_t lo, size_t hi, mat_fn each, void *user) {
    sizes z = {0, 0, 0, hi - lo, 0};
    mat m;
    for (int i = 0; i < k->nmats; i++) {
        if (!mat_in(k, &k->mats[i], lo, hi, &m)) continue;
        if (each) each(&m, z.np, z.nq, user);
        z.count++;
        z.np += m.rows * m.r;
        z.nq += m.cols * m.r;
        z.nplain -= m.rows * m.cols;
        if (m.rows * m.r > z.most) z.most = m.rows * m.r;
    }
    return z;
}

// The values of g[lo, hi) outside its matrices: to plain[] (dir 1), back
// from it (dir 0), or set to zero (dir -1).
static void plain_copy(const dt_codec *k, float *g, size_t lo, size_t hi, float *plain, int dir) {
    size_t at = lo, n = 0;
    mat m;
    for (int i = 0; i <= k->nmats; i++) {
        int last = i == k->nmats;
        if (!last && !mat_in(k, &k->mats[i], lo, hi, &m)) continue;
        size_t to = last ? hi : m.at, len = (to - at) * sizeof(float);
        if (dir > 0) memcpy(plain + n, g + at, len);
        else if (dir == 0) memcpy(g + at, plain + n, len);
        else memset(g + at, 0, len);
        n += to - at;
        if (!last) at = m.at + m.rows * m.cols;
    }
}

// The wire buffer: the Ps, the plain values, the Qs (floats), then the
// largest matrix's rows x r doubles for the orthonormalization, at an
// 8-byte boundary.
static size_t work_at(sizes z) { return ((z.np + z.nplain + z.nq) * sizeof(float) + 7) / 8 * 8; }

static int psgd_wants(const dt_config *c) { return c->comp_method == DT_COMP_POWERSGD; }

// What the steps over a piece's matrices work on.
typedef struct {
    float *x;        // the piece's gradients (g)
    float *P, *Q;    // the Ps, the Qs
    double *scratch; // the orthonormalization's
    dt_codec_piece *p;
    dt_codec *k;
} walk;

static void fill_q(const mat *m, size_t p_at, size_t q_at, void *user) {
    walk *w = user;
    (void)p_at;
    for (size_t i = 0; i < m->cols * m->r; i++) w->Q[q_at + i] = dt_rng_normal(&w->p->rng);
}

// x . y over n floats, in 16 lanes the compiler keeps in vector registers.
static float dot(const float *restrict x, const float *restrict y, size_t n) {
    float acc[16] = {0};
    size_t c = 0;
    for (; c + 16 <= n; c += 16)
        for (int l = 0; l < 16; l++) acc[l] += x[c + l] * y[c + l];
    for (; c < n; c++) acc[c % 16] += x[c] * y[c];
    float s = 0;
    for (int l = 0; l < 16; l++) s += acc[l];
    return s;
}

// P = M Q: each P[i][j] the dot product of M's row i with Q's column j
// (a row of the r x cols array kept)
static void encode_p(const mat *m, size_t p_at, size_t q_at, void *user) {
    walk *w = user;
    const float *x = w->x + m->at, *Q = w->Q + q_at;
    float *P = w->P + p_at;
    for (size_t i = 0; i < m->rows; i++)
        for (size_t j = 0; j < m->r; j++) P[i * m->r + j] = dot(x + i * m->cols, Q + j * m->cols, m->cols);
}

static dt_status psgd_start(dt_codec *k, float *g, size_t lo, size_t hi, dt_request_t *req) {
    if (dt_codec_small(k, lo, hi)) return dt_codec_plain_start(k, g, lo, hi, req);
    dt_codec_piece *p = dt_codec_piece_at(k, lo, hi);
    if (!p) return DT_ERR_NOMEM;
    sizes z = layout(k, lo, hi, NULL, NULL);
    p->sent = dt_codec_piece_begin(k, p, 0x905) >= k->c->comp_warmup_steps && z.count > 0;
    if (!p->sent) return dt_codec_plain_start(k, g, lo, hi, req);
    walk w = {g, NULL, NULL, NULL, p, k};
    if (!p->q || p->nq != z.nq || p->nmat != z.count) {  // the first step, or a checkpoint's Qs of another layout
        if (p->q && k->rank == 0 && !k->refit_warned++)
            dt_log(DT_LOG_WARN, "powersgd: the checkpoint's Qs of piece [%zu, %zu) are %zu values for %zu matrices, "
                                "rank %d needs %zu for %zu: new Qs from the seed",
                   lo, hi, p->nq, p->nmat, k->c->comp_rank, z.nq, z.count);
        free(p->q);
        p->nq = p->nmat = 0;
        if (!(p->q = malloc(z.nq * sizeof(float))))
            return dt_error(DT_ERR_NOMEM, "gradient codec powersgd: out of memory for piece [%zu, %zu)", lo, hi);
        p->nq = z.nq, p->nmat = z.count;
        w.Q = p->q;
        layout(k, lo, hi, fill_q, &w);
    }
    float *P = (float *)dt_codec_buf(p, work_at(z) + z.most * sizeof(double));
    if (!P) return DT_ERR_NOMEM;
    dt_codec_ef_add(k, g, lo, hi);
    w.P = P, w.Q = p->q;
    layout(k, lo, hi, encode_p, &w);
    plain_copy(k, g, lo, hi, P + z.np, 1);
    return dt_iallreduce(P, P, z.np + z.nplain, DT_F32, DT_SUM, k->comm, req);
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

// y += a x over n floats
static void axpy(float a, const float *restrict x, float *restrict y, size_t n) {
    for (size_t c = 0; c < n; c++) y[c] += a * x[c];
}

// Orthonormalized P, then Q = M^T P: Q's column j (a row of the r x cols
// array) the sum over M's rows i of P[i][j] M[i]
static void encode_q(const mat *m, size_t p_at, size_t q_at, void *user) {
    walk *w = user;
    const float *x = w->x + m->at;
    float *P = w->P + p_at, *Q = w->Q + q_at;
    orthonormalize(P, w->scratch, m->rows, m->r);
    memset(Q, 0, m->cols * m->r * sizeof(float));
    for (size_t i = 0; i < m->rows; i++)
        for (size_t j = 0; j < m->r; j++) axpy(P[i * m->r + j], x + i * m->cols, Q + j * m->cols, m->cols);
}

// M = P Q^T, row by row, and what it missed of this rank's share
static void decode(const mat *m, size_t p_at, size_t q_at, void *user) {
    walk *w = user;
    const float *P = w->P + p_at, *Q = w->Q + q_at;
    float share = 1.0f / (float)w->k->world;
    for (size_t i = 0; i < m->rows; i++) {
        float *x = w->x + m->at + i * m->cols;
        float *res = w->k->residual ? w->k->residual + m->at + i * m->cols : NULL;
        if (res) memcpy(res, x, m->cols * sizeof(float));
        memset(x, 0, m->cols * sizeof(float));
        for (size_t j = 0; j < m->r; j++) axpy(P[i * m->r + j], Q + j * m->cols, x, m->cols);
        if (res) axpy(-share, x, res, m->cols);
    }
}

static dt_status psgd_finish(dt_codec *k, float *g, size_t lo, size_t hi, dt_request_t *req) {
    if (dt_codec_small(k, lo, hi)) return dt_codec_plain_finish(k, g, lo, hi, req);
    dt_codec_piece *p = dt_codec_piece_at(k, lo, hi);
    if (!p->sent) return dt_codec_plain_finish(k, g, lo, hi, req);
    dt_status st = dt_wait(req);
    if (st != DT_OK) return st;
    sizes z = layout(k, lo, hi, NULL, NULL);
    float *P = (float *)p->buf;
    walk w = {g, P, P + z.np + z.nplain, (double *)(void *)(p->buf + work_at(z)), p, k};
    layout(k, lo, hi, encode_q, &w);
    // Queued behind every piece's first round, in the same order on every rank.
    dt_request_t r2 = NULL;
    if ((st = dt_iallreduce(w.Q, w.Q, z.nq, DT_F32, DT_SUM, k->comm, &r2)) != DT_OK) return st;
    if ((st = dt_wait(&r2)) != DT_OK) return st;
    layout(k, lo, hi, decode, &w);
    plain_copy(k, g, lo, hi, P + z.np, 0);
    if (k->residual) plain_copy(k, k->residual, lo, hi, NULL, -1);
    memcpy(p->q, w.Q, z.nq * sizeof(float));
    return DT_OK;
}

const dt_codec_ops dt_codec_powersgd = {"powersgd", sizeof(dt_codec), psgd_wants, NULL, NULL, psgd_start,
                                        psgd_finish, NULL, NULL};  // its rounds are allreduces: no message alone
