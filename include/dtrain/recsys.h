/*
 * dtrain/recsys.h - the recommender: click logs and a DLRM-style model.
 *
 * A click log (docs/recommender.md has the format) is a header and
 * fixed-size records: a label (clicked or not), `ndense` non-negative
 * dense features and one id per categorical feature, each below its
 * table's row count. dt_clicks_generate writes one from a planted model,
 * so that the best achievable AUC is known; dt_clicks_load reads one and
 * refuses a bad record naming the file, the record and the field.
 *
 * The model (dt_dlrm) holds the MLPs in one flat block, as dt_model does;
 * the embedding tables are apart from it: the caller looks the rows up
 * (wherever they live: a local table, or rows pulled from parameter
 * servers) into emb[B, T, dim] and gets their gradient back from backward.
 *
 *   dt_dlrm_forward(m, dense, emb, labels, B, &loss);
 *   dt_dlrm_backward(m, demb, scale);   // parameter gradients +=, demb =
 */
#ifndef DTRAIN_RECSYS_H
#define DTRAIN_RECSYS_H

#include "dtrain/core.h"
#include "dtrain/nn.h"
#include "dtrain/spec.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- click logs (src/data/clicks.c) ------------------------------------- */

#define DT_CLICKS_MAGIC "DTCLICK1"

typedef struct {
    int64_t n;                          /* records */
    int ndense, ntables;
    int64_t rows[DT_DLRM_MAX_TABLES];   /* the header's row count of each table */
    uint8_t *label;                     /* [n] 0 or 1 */
    float *dense;                       /* [n, ndense] */
    uint32_t *ids;                      /* [n, ntables] */
} dt_clicks;

/* Reads a click log whole. With spec non-NULL the file must have its
 * ndense and ntables, and every id must be below spec->rows of its table
 * (else below the header's). Refused (DT_ERR_FORMAT, nothing kept): a bad
 * header, a record cut short, a label other than 0 or 1, a dense feature
 * negative or not finite, an id out of its table's range, each named
 * "FILE: record R: field F: ...". */
DT_API dt_status dt_clicks_load(dt_clicks *out, const char *path, const dt_dlrm_spec *spec);
DT_API void dt_clicks_free(dt_clicks *c);
/* Bytes of one record: 1 + 4 ndense + 4 ntables. */
DT_API size_t dt_clicks_record_bytes(int ndense, int ntables);

/* The planted model's knobs (dt_clicks_gen_default). */
typedef struct {
    int ntables;
    int64_t rows[DT_DLRM_MAX_TABLES];
    int ndense;
    int64_t train, test;  /* records of each file */
    double zipf;          /* ids' power law: P(rank k) ~ 1 / (k + 1)^zipf */
    int rank;             /* the planted embeddings' width */
    float scale;          /* the planted weights' spread (the AUC grows with it) */
    uint64_t seed;
} dt_clicks_gen;

DT_API dt_clicks_gen dt_clicks_gen_default(void);
/* Writes the train and test logs (test_path NULL: none) from one planted
 * model: logit = bias + w . log1p(x) + sum_t a_t[id_t] + sum_{t<u}
 * <e_t[id_t], e_u[id_u]>, label ~ Bernoulli(sigmoid(logit)). *auc gets
 * the planted model's own AUC on the test records (the train ones when
 * there is no test file): the best any model can expect. */
DT_API dt_status dt_clicks_generate(const dt_clicks_gen *g, const char *train_path, const char *test_path,
                                    double *auc);

/* The area under the ROC curve of scores against labels (ties count a
 * half); 0.5 when either class is absent. */
DT_API double dt_auc(const float *score, const uint8_t *label, int64_t n);

/* ---- the model (src/nn/dlrm.c) ------------------------------------------ */

typedef struct dt_dlrm dt_dlrm;

/* Width of the top MLP's input: dim + (T + 1) T / 2. */
DT_API int dt_dlrm_interaction_size(const dt_dlrm_spec *s);
/* The MLPs' parameters (the block), without the tables. */
DT_API size_t dt_dlrm_mlp_params(const dt_dlrm_spec *s);
/* Rows of all tables together (table t's row r is global row
 * offset(t) + r, dt_dlrm_row_offset). */
DT_API int64_t dt_dlrm_total_rows(const dt_dlrm_spec *s);
DT_API int64_t dt_dlrm_row_offset(const dt_dlrm_spec *s, int t);

DT_API dt_status dt_dlrm_create(dt_dlrm **out, const dt_dlrm_spec *s, int max_batch);
DT_API void dt_dlrm_free(dt_dlrm *m);
DT_API float *dt_dlrm_params(dt_dlrm *m);
DT_API float *dt_dlrm_grads(dt_dlrm *m);
DT_API size_t dt_dlrm_num_params(const dt_dlrm *m);
/* The MLPs' tensors, in block order: "bottom.0.weight", ... "top.K.bias". */
DT_API int dt_dlrm_num_tensors(const dt_dlrm *m);
DT_API const dt_tensor_info *dt_dlrm_tensor(const dt_dlrm *m, int i);
/* The MLPs' initial weights from seed (PyTorch's nn.Linear rule). */
DT_API void dt_dlrm_init(dt_dlrm *m, uint64_t seed);
/* Rows [first, first + n) of the tables (global numbering) as a run of
 * seed starts them, each row from its own number alone (so a server
 * holding a slice draws the same values as a process holding all):
 * uniform in [-1/sqrt(dim), 1/sqrt(dim)). out[n, dim]. */
DT_API void dt_dlrm_init_rows(float *out, int64_t first, int64_t n, int dim, uint64_t seed);

/* Forward over B records (B <= max_batch): dense[B, ndense] (log1p is
 * taken inside), emb[B, ntables, dim] their looked-up rows; labels[B]
 * (NULL: no loss) gives *loss, the mean logistic loss. The click
 * probabilities stay in dt_dlrm_probs until the next forward. */
DT_API dt_status dt_dlrm_forward(dt_dlrm *m, const float *dense, const float *emb, const uint8_t *labels, int B,
                                 float *loss);
DT_API const float *dt_dlrm_probs(const dt_dlrm *m);
/* Backward of the last forward, its mean loss times scale: the MLPs'
 * gradients accumulate (+=), demb[B, ntables, dim] is overwritten with
 * the gradient of the looked-up rows. */
DT_API void dt_dlrm_backward(dt_dlrm *m, float *demb, float scale);

#ifdef __cplusplus
}
#endif
#endif
