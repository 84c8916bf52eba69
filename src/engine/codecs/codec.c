/* The gradient codecs (codec.h), their registry, and the parts the
 * compressing codecs share. */
#include "engine/codecs/codec.h"

#include <stdio.h>
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
                                        dt_codec_plain_finish, NULL, NULL};

// ----------------------------------------------------------------------------
// the registry: the first codec that wants the config

// The state's tensors (codec.h), as k->names holds their names.
enum { X_STEP, X_RESIDUAL, X_VELOCITY, X_PIECES, X_Q, X_RESIDUAL2, NX };
static const char *const xnames[NX] = {"step", "residual", "velocity", "pieces", "q", "sum_residual"};
_Static_assert(NX == sizeof ((dt_codec *)0)->names / sizeof ((dt_codec *)0)->names[0], "a name for each tensor");
// The columns of "pieces": lo, hi, the Qs' length, the matrices'.
enum { NT = 4 };

static const dt_codec_ops *const codecs[] = {&dt_codec_cast16,  &dt_codec_quant,    &dt_codec_topk,
                                             &dt_codec_randomk, &dt_codec_powersgd, &codec_fp32};

static const dt_codec_ops *ops_for(const dt_config *c) {
    for (size_t i = 0; i < sizeof codecs / sizeof *codecs; i++)
        if (codecs[i]->wants(c)) return codecs[i];
    return &codec_fp32;
}

int dt_codec_matrices(const dt_tensor_info *t, int64_t layers, dt_grad_matrix *out) {
    int first = layers > 0;  // the dimension of the rows
    if (t->ndim < first + 2 || t->numel == 0) return 0;
    int count = first ? (int)layers : 1;
    size_t rows = (size_t)t->shape[first], each = t->numel / (size_t)count;
    for (int l = 0; out && l < count; l++) out[l] = (dt_grad_matrix){t->offset + (size_t)l * each, rows, each / rows};
    return count;
}

dt_status dt_codec_create(dt_codec **out, const dt_config *c, dt_comm_t comm, size_t n, const dt_grad_matrix *mats,
                          int nmats) {
    *out = NULL;
    for (int i = 0; mats && i < nmats; i++)
        if (!mats[i].rows || !mats[i].cols || mats[i].offset + mats[i].rows * mats[i].cols > n ||
            (i && mats[i].offset < mats[i - 1].offset + mats[i - 1].rows * mats[i - 1].cols))
            return dt_error(DT_ERR_ARG, "gradient codec: matrix %d (%zu x %zu at %zu) is empty, past the %zu gradients "
                            "or before the end of the one before",
                            i, mats[i].rows, mats[i].cols, mats[i].offset, n);
    const dt_codec_ops *ops = ops_for(c);
    dt_codec *k = calloc(1, ops->size);
    if (!k) return dt_error(DT_ERR_NOMEM, "gradient codec %s: out of memory", ops->name);
    *k = (dt_codec){.ops = ops, .c = c, .comm = comm, .n = n, .rank = dt_comm_rank(comm), .world = dt_comm_size(comm)};
    for (int i = 0; i < NX; i++)
        snprintf(k->names[i], sizeof k->names[i], "codec.%s.%s", dt_comp_method_name(c->comp_method), xnames[i]);
    dt_status st = DT_OK;
    if (mats && nmats > 0) {
        if ((k->mats = malloc(sizeof *mats * (size_t)nmats))) memcpy(k->mats, mats, sizeof *mats * (size_t)nmats), k->nmats = nmats;
        else st = dt_error(DT_ERR_NOMEM, "gradient codec %s: out of memory", ops->name);
    }
    if (st == DT_OK && c->comp_method != DT_COMP_NONE && c->comp_error_feedback && n) {
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

int dt_codec_p2p(const dt_config *c) {
    const dt_codec_ops *o = ops_for(c);
    return o->encode && o->decode;
}

dt_status dt_codec_decode(const dt_config *c, const uint8_t *msg, size_t bytes, size_t len, float *out) {
    if (!dt_codec_p2p(c))
        return dt_error(DT_ERR_CONFIG, "gradient codec %s: no point-to-point messages",
                        dt_comp_method_name(c->comp_method));
    return ops_for(c)->decode(c, msg, bytes, len, out);
}

void dt_codec_free(dt_codec *k) {
    if (!k) return;
    if (k->ops->fini) k->ops->fini(k);
    for (int i = 0; i < k->npieces; i++) {
        for (int j = 0; j < k->pieces[i].nreqs; j++) dt_wait(&k->pieces[i].reqs[j]);
        free(k->pieces[i].reqs);
        free(k->pieces[i].buf);
        free(k->pieces[i].q);
        free(k->pieces[i].perm);
    }
    free(k->pieces);
    free(k->mats);
    free(k->residual);
    free(k->residual2);
    free(k->velocity);
    free(k->table);
    free(k->packed);
    free(k);
}

// ----------------------------------------------------------------------------
// shared by the compressing codecs

dt_codec_piece *dt_codec_piece_at(dt_codec *k, size_t lo, size_t hi) {
    for (int i = 0; i < k->npieces; i++) {
        dt_codec_piece *p = &k->pieces[i];
        if (p->lo != lo) continue;
        if (p->hi != hi) {
            free(p->q);
            free(p->perm);
            p->q = NULL;
            p->perm = NULL;
            p->nq = p->nmat = 0;
            p->hi = hi;
        }
        return p;
    }
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
    p->step = k->step0;
    return p;
}

int64_t dt_codec_piece_begin(dt_codec *k, dt_codec_piece *p, uint64_t salt) {
    dt_rng_seed(&p->rng, k->c->seed ^ (0x9e3779b97f4a7c15ull * (p->lo + 1)) ^ salt ^
                             ((uint64_t)p->step * 0xc2b2ae3d27d4eb4full));
    return p->step++;
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

// ----------------------------------------------------------------------------
// checkpoints: the state as tensors, and back

int dt_codec_stateful(const dt_codec *k) { return k->ops != &codec_fp32; }

int dt_codec_state(dt_codec *k, dt_st_tensor *t, int max) {
    if (!dt_codec_stateful(k)) return 0;
    dt_st_tensor x[NX];
    int n = 0, np = 0;
    size_t nq = 0;
    k->saved_step = k->step0;
    for (int i = 0; i < k->npieces; i++) {
        const dt_codec_piece *p = &k->pieces[i];
        if (p->step > k->saved_step) k->saved_step = p->step;
        if (p->q) np++, nq += p->nq;
    }
    x[n++] = (dt_st_tensor){k->names[X_STEP], DT_I64, 1, {1}, &k->saved_step, sizeof(int64_t)};
    if (k->residual)
        x[n++] = (dt_st_tensor){k->names[X_RESIDUAL], DT_F32, 1, {(int64_t)k->n}, k->residual, k->n * sizeof(float)};
    if (k->velocity)
        x[n++] = (dt_st_tensor){k->names[X_VELOCITY], DT_F32, 1, {(int64_t)k->n}, k->velocity, k->n * sizeof(float)};
    if (k->residual2)
        x[n++] = (dt_st_tensor){k->names[X_RESIDUAL2], DT_F32, 1, {(int64_t)k->n}, k->residual2, k->n * sizeof(float)};
    if (np && max > n) {  // the Qs packed, in the pieces' order
        int64_t *tb = realloc(k->table, sizeof *tb * NT * (size_t)np);
        if (tb) k->table = tb;
        float *q = tb ? realloc(k->packed, sizeof *q * nq) : NULL;
        if (!q) return dt_error(DT_ERR_NOMEM, "gradient codec %s: out of memory for the checkpoint", k->ops->name), -1;
        k->packed = q;
        for (int i = 0, j = 0; i < k->npieces; i++) {
            const dt_codec_piece *p = &k->pieces[i];
            if (!p->q) continue;
            tb[NT * j] = (int64_t)p->lo, tb[NT * j + 1] = (int64_t)p->hi, tb[NT * j + 2] = (int64_t)p->nq;
            tb[NT * j + 3] = (int64_t)p->nmat;
            memcpy(q, p->q, p->nq * sizeof *q);
            q += p->nq;
            j++;
        }
    }
    if (np) {
        x[n++] = (dt_st_tensor){k->names[X_PIECES], DT_I64, 2, {np, NT}, k->table, sizeof(int64_t) * NT * (size_t)np};
        x[n++] = (dt_st_tensor){k->names[X_Q], DT_F32, 1, {(int64_t)nq}, k->packed, sizeof(float) * nq};
    }
    for (int i = 0; i < n && i < max; i++) t[i] = x[i];
    return n;
}

// What a checkpoint held of the state (head[H_FLAGS]).
enum { F_STEP = 1, F_RESIDUAL = 2, F_VELOCITY = 4, F_Q = 8, F_RESIDUAL2 = 16 };
// The state's size and step, as rank 0 broadcasts them before the buffers.
enum { H_FLAGS, H_STEP, H_PIECES, H_Q, NH };

// f's tensor `name` when it has this dtype and d0 elements in its first
// dimension (and d1 in its second, 0: one dimension); else NULL.
static const dt_st_tensor *find(const dt_st_file *f, const char *name, dt_dtype dtype, int64_t d0, int64_t d1) {
    const dt_st_tensor *t = dt_st_find(f, name);
    if (!t || t->dtype != dtype || t->ndim != (d1 ? 2 : 1) || (d0 >= 0 && t->shape[0] != d0) ||
        (d1 && t->shape[1] != d1))
        return NULL;
    return t;
}

// Part 0's step, pieces and Qs into head, *table, *q (malloc'd), checked.
static dt_status load_shared(dt_codec *k, const dt_st_file *f, const char *path, int64_t *head, int64_t **table,
                             float **q) {
    const dt_st_tensor *t = find(f, k->names[X_STEP], DT_I64, 1, 0);
    if (!t) return DT_OK;
    dt_status st = dt_st_read(f, t, 0, 1, DT_I64, &head[H_STEP]);
    if (st != DT_OK) return st;
    if (head[H_STEP] < 0 || head[H_STEP] > ((int64_t)1 << 50))
        return dt_error(DT_ERR_FORMAT, "%s: tensor '%s' is %lld, expected 0 to 2^50", path, k->names[X_STEP],
                        (long long)head[H_STEP]);
    head[H_FLAGS] |= F_STEP;
    const dt_st_tensor *tb = find(f, k->names[X_PIECES], DT_I64, -1, NT), *tq = find(f, k->names[X_Q], DT_F32, -1, 0);
    if (!tb && k->rank == 0 && find(f, k->names[X_PIECES], DT_I64, -1, 3))
        dt_log(DT_LOG_WARN, "%s: PowerSGD's Qs are one per piece viewed as a square matrix (an older layout), not one "
                            "per weight matrix: new Qs from the seed",
               path);
    if (!tb || !tq) return DT_OK;
    int64_t np = tb->shape[0], nq = tq->shape[0], sum = 0;
    if (np < 1) return DT_OK;
    // (the caller frees both on every path)
    *table = malloc(tb->nbytes ? tb->nbytes : 1);
    *q = malloc(tq->nbytes ? tq->nbytes : 1);
    if (!*table || !*q) return dt_error(DT_ERR_NOMEM, "%s: out of memory", path);
    if ((st = dt_st_read(f, tb, 0, tb->nbytes / 8, DT_I64, *table)) != DT_OK ||
        (st = dt_st_read(f, tq, 0, tq->nbytes / 4, DT_F32, *q)) != DT_OK)
        return st;
    const int64_t *r = *table;
    for (int64_t i = 0; i < np; i++) {
        const int64_t *e = r + NT * i;
        if (e[0] < 0 || e[0] >= e[1] || e[1] > (int64_t)k->n || e[2] < 1 || e[2] > nq - sum || e[3] < 1 ||
            e[3] > e[2])
            return dt_error(DT_ERR_FORMAT, "%s: tensor '%s' row %lld (%lld, %lld, %lld, %lld) is not a piece of the %zu "
                            "gradients with a part of the %lld values of '%s' and 1 to that many matrices",
                            path, k->names[X_PIECES], (long long)i, (long long)e[0], (long long)e[1], (long long)e[2],
                            (long long)e[3], k->n, (long long)nq, k->names[X_Q]);
        sum += e[2];
    }
    if (sum != nq)
        return dt_error(DT_ERR_FORMAT, "%s: tensor '%s' gives Qs of %lld values, '%s' has %lld", path,
                        k->names[X_PIECES], (long long)sum, k->names[X_Q], (long long)nq);
    head[H_PIECES] = np;
    head[H_Q] = nq;
    head[H_FLAGS] |= F_Q;
    return DT_OK;
}

// dst[n] += tensor t of f (n floats), read a piece at a time.
static dt_status add_tensor(const dt_st_file *f, const dt_st_tensor *t, float *dst, size_t n, const char *path) {
    enum { PIECE = 1 << 16 };
    float *v = malloc(sizeof(float) * PIECE);
    dt_status st = v ? DT_OK : dt_error(DT_ERR_NOMEM, "%s: out of memory", path);
    for (size_t a = 0, m; a < n && st == DT_OK; a += m) {
        m = n - a < PIECE ? n - a : PIECE;
        if ((st = dt_st_read(f, t, a, m, DT_F32, v)) == DT_OK)
            for (size_t e = 0; e < m; e++) dst[a + e] += v[e];
    }
    free(v);
    return st;
}

// The parts of a checkpoint that hold the ranks' codec states: the
// workers' own files (dt_ckpt_open_own) or its shards (dt_ckpt_open_part).
typedef dt_status (*part_opener)(const char *path, int part, dt_st_file **out, int *parts);

// Parts [first, first + count) of checkpoint path: the shared state from
// the first; the mean of their residuals and velocities into k's buffers
// (the part's own when count is 1). other: the method of any codec state
// there that is not this codec's.
enum { NBUF = 3 };
static dt_status load(dt_codec *k, const char *path, part_opener open, int first, int count, int64_t *head,
                      int64_t **table, float **q, char *other, size_t nother) {
    float *buf[NBUF] = {k->residual, k->velocity, k->residual2};
    int flag[NBUF] = {F_RESIDUAL, F_VELOCITY, F_RESIDUAL2}, x[NBUF] = {X_RESIDUAL, X_VELOCITY, X_RESIDUAL2};
    head[H_FLAGS] = 0;
    for (int j = 0; j < NBUF; j++) head[H_FLAGS] |= buf[j] ? flag[j] : 0;
    dt_status st = DT_OK;
    for (int i = 0; i < count && st == DT_OK; i++) {
        dt_st_file *f;
        int parts;
        if ((st = open(path, first + i, &f, &parts)) != DT_OK) break;
        if (i == 0) st = load_shared(k, f, path, head, table, q);
        for (int e = 0; e < dt_st_count(f) && i == 0 && !(head[H_FLAGS] & F_STEP) && !*other; e++) {
            const char *nm = dt_st_get(f, e)->name, *dot = strncmp(nm, "codec.", 6) ? NULL : strchr(nm + 6, '.');
            if (dot) snprintf(other, nother, "%.*s", (int)(dot - nm - 6), nm + 6);
        }
        for (int j = 0; j < NBUF && st == DT_OK; j++) {
            const dt_st_tensor *t = buf[j] ? find(f, k->names[x[j]], DT_F32, (int64_t)k->n, 0) : NULL;
            if (!t) head[H_FLAGS] &= ~flag[j];
            if (!(head[H_FLAGS] & flag[j])) continue;
            st = i == 0 ? dt_st_read(f, t, 0, k->n, DT_F32, buf[j]) : add_tensor(f, t, buf[j], k->n, path);
        }
        dt_st_close(f);
    }
    if (st != DT_OK) return st;
    if (!(head[H_FLAGS] & F_STEP)) head[H_FLAGS] = 0;  // not this method's state: none of it
    for (int j = 0; j < NBUF; j++) {
        if (!buf[j]) continue;
        if (!(head[H_FLAGS] & flag[j])) memset(buf[j], 0, k->n * sizeof(float));
        else if (count > 1)
            for (size_t e = 0; e < k->n; e++) buf[j][e] /= (float)count;
    }
    return DT_OK;
}

// Rank 0's state (the mean) to every rank.
static dt_status share(dt_codec *k, int64_t *head, int64_t **table, float **q) {
    dt_status st = dt_broadcast(head, head, NH, DT_I64, 0, k->comm);
    if (st == DT_OK && (head[H_FLAGS] & F_RESIDUAL))
        st = dt_broadcast(k->residual, k->residual, k->n, DT_F32, 0, k->comm);
    if (st == DT_OK && (head[H_FLAGS] & F_VELOCITY))
        st = dt_broadcast(k->velocity, k->velocity, k->n, DT_F32, 0, k->comm);
    if (st == DT_OK && (head[H_FLAGS] & F_RESIDUAL2))
        st = dt_broadcast(k->residual2, k->residual2, k->n, DT_F32, 0, k->comm);
    if (st != DT_OK || !(head[H_FLAGS] & F_Q)) return st;
    if (k->rank != 0) {
        *table = malloc(sizeof **table * NT * (size_t)head[H_PIECES]);
        *q = malloc(sizeof **q * (size_t)head[H_Q]);
        if (!*table || !*q) return dt_error(DT_ERR_NOMEM, "gradient codec: out of memory for the checkpoint's Q");
    }
    st = dt_broadcast(*table, *table, NT * (size_t)head[H_PIECES], DT_I64, 0, k->comm);
    if (st == DT_OK) st = dt_broadcast(*q, *q, (size_t)head[H_Q], DT_F32, 0, k->comm);
    return st;
}

dt_status dt_codec_restore(dt_codec *k, const char *path, int parts) {
    if (!path || !*path || !dt_codec_stateful(k)) return DT_OK;
    // The workers' own files when the parameter servers wrote it (outside
    // mode sync), else the shards: each rank's state, as data parallel's.
    int own = 0;
    part_opener open = dt_ckpt_open_part;
    if (dt_ckpt_open_own(path, -1, NULL, &own) == DT_OK && own > 0) parts = own, open = dt_ckpt_open_own;
    int same = parts == k->world;
    int64_t head[NH] = {0}, *table = NULL;
    float *q = NULL;
    char other[40] = "";
    dt_status st = DT_OK;
    if (same || k->rank == 0)
        st = load(k, path, open, same ? k->rank : 0, same ? 1 : parts, head, &table, &q, other, sizeof other);
    if (st == DT_OK && !same) st = share(k, head, &table, &q);
    // Every piece with a Q continues from the step the state had reached.
    k->step0 = head[H_FLAGS] & F_STEP ? head[H_STEP] : 0;
    const float *qp = q;
    for (int64_t i = 0; st == DT_OK && (head[H_FLAGS] & F_Q) && i < head[H_PIECES]; i++) {
        size_t nq = (size_t)table[NT * i + 2];
        dt_codec_piece *p = dt_codec_piece_at(k, (size_t)table[NT * i], (size_t)table[NT * i + 1]);
        float *pq = p ? malloc(nq * sizeof(float)) : NULL;
        if (!pq) {
            st = dt_error(DT_ERR_NOMEM, "gradient codec: out of memory for the checkpoint's Q");
            break;
        }
        free(p->q);
        p->q = memcpy(pq, qp, nq * sizeof(float));
        p->nq = nq;
        p->nmat = (size_t)table[NT * i + 3];
        p->step = k->step0;
        qp += nq;
    }
    free(table);
    free(q);
    if (st != DT_OK || k->rank != 0) return st;
    const char *m = dt_comp_method_name(k->c->comp_method);
    int64_t f = head[H_FLAGS];
    if (!f && *other)
        dt_log(DT_LOG_WARN, "%s: holds the gradient-codec state of compression.method = %s, which does not carry over to "
                            "%s: it starts afresh, as at step 0",
               path, other, m);
    else if (!f)
        dt_log(DT_LOG_INFO, "%s: no gradient-codec state (written without compression): %s starts afresh, as at step 0",
               path, m);
    if (!f) return DT_OK;
    char what[160] = "the step", how[120] = "";
    size_t l = strlen(what);
    if (f & F_RESIDUAL) l += (size_t)snprintf(what + l, sizeof what - l, ", residuals");
    if (f & F_VELOCITY) l += (size_t)snprintf(what + l, sizeof what - l, ", DGC momentum");
    if (f & F_RESIDUAL2) l += (size_t)snprintf(what + l, sizeof what - l, ", the re-quantized sums' residuals");
    if (f & F_Q) l += (size_t)snprintf(what + l, sizeof what - l, ", PowerSGD's Q");
    if ((k->residual && !(f & F_RESIDUAL)) || (k->velocity && !(f & F_VELOCITY)))
        snprintf(what + l, sizeof what - l, "; not there, so from zero: %s%s",
                 k->residual && !(f & F_RESIDUAL) ? "residuals " : "", k->velocity && !(f & F_VELOCITY) ? "momentum" : "");
    if (same) snprintf(how, sizeof how, "each rank its own");
    else if (k->world > 1)
        snprintf(how, sizeof how, "resharded: each of %d ranks has the mean of the %d writers'", k->world, parts);
    else
        snprintf(how, sizeof how, "resharded: the one rank has the mean of the %d writers'", parts);
    dt_log(DT_LOG_INFO, "gradient codec %s: state at step %lld restored from %s: %s (%s)", m, (long long)head[H_STEP],
           path, what, how);
    return DT_OK;
}
