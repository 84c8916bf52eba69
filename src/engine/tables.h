/* tables.h - the recommender's embedding tables cut by row among the
 * ranks that hold them (docs/recommender.md): the parameter servers
 * (strategies/ps/rows.c), or the workers themselves, the tables under
 * tensor parallel (strategies/rows_tp.c). What both share:
 *
 * - the placement of the rows (dt_rows_layout): the tables' R rows,
 *   numbered globally (table t's row r is offset(t) + r), are given
 *   placed numbers q, and shard j of S holds q in dt_shard_range(R, j, S)
 *   (the project's one shard function). [recsys] placement = range: q is
 *   the row's own number (each shard a contiguous run of the tables);
 *   hash: q = (a g) mod R for a fixed a coprime with R near 0.618 R, a
 *   permutation that scatters every table's rows, and its hot ones,
 *   evenly over the shards (a Weyl sequence);
 * - a step's rows as a rank sends them (dt_rows_plan): its distinct rows
 *   placed, ordered by placed number and cut by shard;
 * - a shard (dt_rows_shard): its rows' values and row-wise AdaGrad's sums
 *   ([recsys] table_optim; in memory, or in files with [parallel]
 *   offload = disk), drawn from the seed row by row, a step's gradients
 *   of several senders summed in the senders' order (so the sum does not
 *   depend on the order they arrive in) and applied, and the shard in a
 *   checkpoint (tensors "tables.range", "tables.rows", "tables.adagrad" in
 *   its rank's file of a sharded checkpoint) read back on any number of
 *   shards. */
#ifndef DT_ENGINE_TABLES_H
#define DT_ENGINE_TABLES_H

#include "dtrain/ckpt.h"
#include "dtrain/comm.h"
#include "dtrain/config.h"

#include <stddef.h>
#include <stdint.h>

typedef struct {
    int64_t R;  // rows of all tables
    int S;      // shards
    int hash;   // [recsys] placement = hash
    uint64_t a, ainv;
} dt_rows_layout;

void dt_rows_layout_init(dt_rows_layout *L, int64_t R, int S, int hash);
/* The placed number of global row g, and back. */
int64_t dt_rows_place(const dt_rows_layout *L, int64_t g);
int64_t dt_rows_global(const dt_rows_layout *L, int64_t q);
/* Shard j's placed numbers [*lo, *hi). */
void dt_rows_range(const dt_rows_layout *L, int j, int64_t *lo, int64_t *hi);

/* A step's rows ids[n] (global, sorted, distinct) as a rank sends them:
 * q[n] their placed numbers in increasing order, q[i] being ids[from[i]]
 * (from NULL: the same order, placement range), shard j's
 * q[cut[j], cut[j + 1]); buf[n, dim] the rows' values or gradients in
 * that order. */
typedef struct {
    int64_t *q;
    int32_t *from;
    size_t *cut;
    float *buf;
    size_t n, cap;
    int S;
} dt_rows_plan;

dt_status dt_rows_plan_make(dt_rows_plan *p, const dt_rows_layout *L, const int64_t *ids, size_t n, int dim);
/* buf's rows into vals (the ids' order), or grads' rows into buf. */
void dt_rows_plan_scatter(const dt_rows_plan *p, float *vals, int dim);
void dt_rows_plan_gather(dt_rows_plan *p, const float *grads, int dim);
void dt_rows_plan_free(dt_rows_plan *p);

typedef struct {
    int64_t lo, n;    // placed numbers [lo, lo + n)
    int dim, adagrad;
    float *tab, *acc; // [n, dim]; AdaGrad's sums [n] (NULL: sgd)
    const char *dir;  // [parallel] offload = disk: tab and acc in files there (NULL: in memory)
    int64_t meta[4];  // "tables.range" of its checkpoint: lo, lo + n, R, hash
    // a step's sum (dt_rows_shard_step): its rows and their gradients
    int64_t *sid;
    float *sg;
    void *keys;
    size_t cap, kcap;
} dt_rows_shard;

/* The bytes a shard of n rows holds (rows and sums; with checkpoints
 * the writer's snapshot of them again). */
size_t dt_rows_shard_bytes(int64_t n, int dim, int adagrad, int ckpt);
/* Shard j of L, its rows drawn from the seed (dt_dlrm_init_rows by
 * global row). DT_ERR_NOMEM / DT_ERR_IO (offload) naming the rows. */
dt_status dt_rows_shard_create(dt_rows_shard *sh, const dt_rows_layout *L, int j, int dim, int adagrad,
                               uint64_t seed, const char *offload_dir);
void dt_rows_shard_free(dt_rows_shard *sh);
/* Rows q[k] (placed numbers inside the shard) into out[k, dim]. */
void dt_rows_shard_read(const dt_rows_shard *sh, const int64_t *q, size_t k, float *out);
/* Gradients applied at once: rows q[k], g[k, dim] (async). */
void dt_rows_shard_apply(dt_rows_shard *sh, const int64_t *q, const float *g, size_t k, float lr, float eps);
/* A step's gradients from N senders (sender i: rows q[i][k[i]],
 * increasing, and g[i][k[i], dim]): each row's sum in the senders' order,
 * then applied once. Returns the distinct rows applied via *rows. */
dt_status dt_rows_shard_step(dt_rows_shard *sh, int N, int64_t *const *q, float *const *g, const size_t *k, float lr,
                             float eps, size_t *rows);
/* dt_ckpt_model's extra: the shard's tensors (views of its buffers). */
int dt_rows_shard_tensors(dt_rows_shard *sh, dt_st_tensor *t, int max);
/* The shard's rows and sums from checkpoint path (written on any number
 * of shards, with L's placement and rows; verified by whoever chose it).
 * DT_ERR_CONFIG naming the file: another placement, other tables, no
 * AdaGrad sums where they are needed, no rows at all. */
dt_status dt_rows_shard_load(dt_rows_shard *sh, const dt_rows_layout *L, const char *path);

/* ---- the tables under tensor parallel -------------------------------------
 *
 * [recsys] shard = workers, without servers (as TorchRec's and HugeCTR's
 * row-wise sharding): each of the W workers of comm holds shard r of the
 * rows (dt_rows_shard, placement as above) while the MLPs are data
 * parallel. A step is an all-to-all, point to point over comm, of the
 * rows each worker's share touches: the placed numbers to their owners
 * (after an allgather of the W x W counts), the rows back; after
 * backward the rows' gradients to their owners, each of which sums a
 * row's gradients in worker order and applies row-wise AdaGrad (or sgd)
 * once, as a parameter server does in mode sync: the same rows and sums
 * as the tables on servers, or one process's. Pulls and pushes are
 * collectives: every worker calls them the same number of times (an
 * evaluation's pulls too: a worker with fewer chunks pulls no rows). */
typedef struct dt_tp_tables dt_tp_tables;

/* Whether c puts the tables on the workers. */
int dt_tables_on_workers(const dt_config *c);
/* The combinations it is refused with, naming the key. */
dt_status dt_tables_tp_check(const dt_config *c);
/* This worker's shard, from the seed. */
dt_status dt_tp_tables_create(dt_tp_tables **out, const dt_config *c, dt_comm_t comm);
void dt_tp_tables_free(dt_tp_tables *t);
/* Rows ids[n] (global, sorted, distinct) into vals[n, dim]; then their
 * gradients g[n, dim] (the same rows) applied by their owners. */
dt_status dt_tp_tables_pull(dt_tp_tables *t, const int64_t *ids, size_t n, float *vals);
dt_status dt_tp_tables_push(dt_tp_tables *t, const int64_t *ids, size_t n, const float *g);
/* The shard as checkpoint tensors (dt_ckpt_model's extra), and back from
 * checkpoint path (written on any number of workers). */
int dt_tp_tables_tensors(dt_tp_tables *t, dt_st_tensor *tt, int max);
dt_status dt_tp_tables_restore(dt_tp_tables *t, const char *path);
/* summary.json's figures: the tables' bytes this worker sent and received
 * a step, the rows it asked of each worker a step (W of them, into per),
 * their most over their mean. */
void dt_tp_tables_stats(const dt_tp_tables *t, double *bytes, double *per, double *balance);

#endif
