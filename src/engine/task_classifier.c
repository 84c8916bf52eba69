/* The classifier task (task.h): IDX images -> dt_model -> softmax
 * cross-entropy; the test split evaluated at the end of every epoch; and the
 * classifier's evaluation outside training (dt_evaluate,
 * dt_eval_checkpoint). */
#include "dtrain/ckpt.h"
#include "dtrain/launch.h"
#include "dtrain/train.h"
#include "engine/dynbatch.h"
#include "engine/task.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct dt_task {
    const dt_config *c;
    dt_dataset train, test;
    dt_model *m;
    dt_loader *loader;             // the one in use: full, or a client's over sub
    dt_loader *full;               // over the whole training set
    dt_dataset sub;                // a federated client's samples (set_subset)
    dt_loader *subl;
    dt_tensor_info *tinfo;
    dt_grad_range *order;          // the tensors in block order, and the layer of each
    int *order_layer;
    dt_batch b;                    // the batch in flight: this rank's share
    dt_st_meta wmeta[2];
};

// A split of the classifier's data: IDX files in [data] dir, or datasets of
// the HDF5 [data] file. The test split is always decoded whole (evaluation
// reads it directly); the training split as [data] cache says.
// The splits a spare loaded ahead (cls_warm), for the next create with the
// same config.
static struct {
    const dt_config *c;
    int have[2];
    dt_dataset ds[2];
} g_warm;

static dt_status load_split(const dt_config *c, const char *split, dt_dataset *ds) {
    char img[1024], lab[1024];
    int train = !strcmp(split, "train"), cache = train ? c->cache : 1;
    if (g_warm.c == c && g_warm.have[!train]) {
        *ds = g_warm.ds[!train];
        g_warm.have[!train] = 0;
        return DT_OK;
    }
    dt_status st;
    if (!strcmp(c->dataset, "hdf5")) {
        snprintf(img, sizeof img, "%s: dataset '%s'", c->data_file, c->h5_names[train ? 0 : 2]);
        st = dt_dataset_load_hdf5(ds, c->data_file, c->h5_names[train ? 0 : 2], c->h5_names[train ? 1 : 3], 10,
                                  c->mean, c->std, cache);
    } else {
        st = dt_idx_find_split(c->data_dir, train ? "train" : "t10k", img, lab, sizeof img);
        if (st == DT_OK) st = dt_dataset_load_idx(ds, img, lab, 10, c->mean, c->std, cache);
    }
    if (st != DT_OK) return st;
    int want = c->input[0] * c->input[1] * c->input[2];
    if ((int)dt_dataset_sample_size(ds) != want) {
        st = dt_error(DT_ERR_CONFIG, "[model] input is %dx%dx%d (%d values) but %s samples have %zu",
                      c->input[0], c->input[1], c->input[2], want, img, dt_dataset_sample_size(ds));
        dt_dataset_free(ds);
        return st;
    }
    // The dataset keeps the file's image shape (the augmentation hooks
    // work on it); the model reads the same values as its [model] input.
    return DT_OK;
}

// Sums the loss and counts correct predictions over samples [lo, hi).
static dt_status eval_range(dt_model *m, const dt_dataset *ds, int lo, int hi, int batch, double *loss_sum,
                            long *correct) {
    size_t ss = dt_dataset_sample_size(ds);
    int V = dt_model_num_classes(m);
    *loss_sum = 0;
    *correct = 0;
    for (int i = lo; i < hi; i += batch) {
        int B = hi - i < batch ? hi - i : batch;
        float l;
        dt_heartbeat(-1);
        dt_status st = dt_model_forward(m, ds->x + (size_t)i * ss, ds->y + i, B, 0, &l);
        if (st != DT_OK) return st;
        *loss_sum += (double)l * B;
        const float *p = dt_model_probs(m);
        for (int b = 0; b < B; b++) {
            int arg = 0;
            for (int v = 1; v < V; v++)
                if (p[(size_t)b * V + v] > p[(size_t)b * V + arg]) arg = v;
            *correct += arg == ds->y[i + b];
        }
    }
    return DT_OK;
}

dt_status dt_evaluate(dt_model *m, const dt_dataset *ds, int batch, float *loss, float *accuracy) {
    double sum;
    long correct;
    dt_status st = eval_range(m, ds, 0, ds->n, batch, &sum, &correct);
    if (st != DT_OK) return st;
    if (loss) *loss = ds->n ? (float)(sum / ds->n) : 0.0f;
    if (accuracy) *accuracy = ds->n ? (float)correct / ds->n : 0.0f;
    return DT_OK;
}

dt_status dt_eval_checkpoint(const dt_config *c, const char *weights, float *loss, float *accuracy, int *n) {
    if (c->gpt) return dt_gpt_eval_checkpoint(c, weights, loss, accuracy, n);
    dt_set_threads(c->threads);
    dt_dataset test = {0};
    dt_model *m = NULL;
    // The weights first: a wrong file is reported before the data loads.
    int rows;
    dt_status st = dt_check_memory(c, DT_MEM_EVAL, 1, 0, &rows);
    if (st == DT_OK) st = dt_model_create(&m, c->input, c->layers, c->nlayers, rows);
    if (st == DT_OK) st = dt_model_load(m, weights);
    if (st == DT_OK) st = load_split(c, "test", &test);
    if (st == DT_OK) st = dt_evaluate(m, &test, c->eval_batch, loss, accuracy);
    if (n) *n = test.n;
    dt_model_free(m);
    dt_dataset_free(&test);
    return st;
}

// ----------------------------------------------------------------------------
// the task

static int cls_wants(const dt_config *c) { return !c->gpt; }

static dt_status cls_warm(const dt_config *c) {
    for (int k = 0; k < 2; k++)
        if (g_warm.have[k]) dt_dataset_free(&g_warm.ds[k]);
    memset(&g_warm, 0, sizeof g_warm);
    if (!c) return DT_OK;
    dt_status st = load_split(c, "train", &g_warm.ds[0]);
    if (st != DT_OK) return st;
    g_warm.have[0] = 1;
    if ((st = load_split(c, "test", &g_warm.ds[1])) != DT_OK) return st;
    g_warm.have[1] = 1;
    g_warm.c = c;
    return DT_OK;
}

static void cls_destroy(dt_task *t) {
    if (!t) return;
    free(t->tinfo);
    free(t->order);
    free(t->order_layer);
    dt_loader_free(t->subl);
    dt_dataset_free(&t->sub);
    dt_loader_free(t->full);
    dt_model_free(t->m);
    dt_dataset_free(&t->train);
    dt_dataset_free(&t->test);
    free(t);
}

static dt_status cls_create(dt_task **out, const dt_config *c, dt_comm_t comm, int max_micro, int model_rows,
                            dt_task_info *info) {
    (void)max_micro;
    dt_task *t = calloc(1, sizeof *t);
    if (!(*out = t)) return dt_error(DT_ERR_NOMEM, "out of memory");
    t->c = c;
    dt_status st;
    DT_TRY(load_split(c, "train", &t->train), done);
    DT_TRY(load_split(c, "test", &t->test), done);
    DT_TRY(dt_model_create(&t->m, c->input, c->layers, c->nlayers, model_rows), done);
    if (dt_model_num_classes(t->m) != t->train.classes) {
        st = dt_error(DT_ERR_CONFIG, "[model]: the last layer has %d outputs but the dataset has %d classes",
                      dt_model_num_classes(t->m), t->train.classes);
        goto done;
    }
    dt_model_init(t->m, c->seed);
    dt_loader_params lp = dt_loader_default_params();
    lp.batch = c->batch;
    lp.shuffle = c->shuffle;
    lp.drop_last = c->drop_last;
    lp.prefetch = c->prefetch;
    lp.threads = c->loader_threads;
    lp.sampler = c->sampler;
    lp.seed = c->seed;
    lp.rank = dt_comm_rank(comm);
    lp.world = dt_comm_size(comm);
    lp.aug.crop_pad = c->crop_pad;
    DT_TRY(dt_augment_parse(c->augment, lp.augment, &lp.naugment), done);
    lp.max_share = c->dynamic_batch ? dt_dynbatch_max_share(c->batch < t->train.n ? c->batch : t->train.n, lp.world) : 0;
    DT_TRY(dt_loader_create(&t->full, &t->train, &lp), done);
    t->loader = t->full;
    int nt = dt_model_num_tensors(t->m);
    if (!(t->tinfo = malloc(sizeof *t->tinfo * (nt > 0 ? nt : 1)))) {
        st = dt_error(DT_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (int i = 0; i < nt; i++) t->tinfo[i] = *dt_model_tensor(t->m, i);
    // The gradient order for a strategy that gathers layer by layer: the
    // tensors in block order (their names start with the layer index).
    t->order = malloc(sizeof *t->order * (nt > 0 ? nt : 1));
    t->order_layer = malloc(sizeof(int) * (nt > 0 ? nt : 1));
    if (!t->order || !t->order_layer) {
        st = dt_error(DT_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (int i = 0; i < nt; i++) {
        t->order[i] = (dt_grad_range){t->tinfo[i].offset, t->tinfo[i].numel};
        t->order_layer[i] = atoi(t->tinfo[i].name);
    }
    t->wmeta[0] = (dt_st_meta){"format", "dtrain-weights"};
    t->wmeta[1] = (dt_st_meta){"name", c->name};
    int64_t spe = dt_loader_steps_per_epoch(t->loader);
    int64_t total = c->epochs > 0 ? (int64_t)c->epochs * spe : c->max_steps;
    if (c->max_steps > 0 && c->max_steps < total) total = c->max_steps;
    *info = (dt_task_info){.params = dt_model_params(t->m),
                           .grads = dt_model_grads(t->m),
                           .nparams = dt_model_num_params(t->m),
                           .order = t->order,
                           .norder = nt,
                           .order_layer = t->order_layer,
                           .tensors = t->tinfo,
                           .ntensors = nt,
                           .weights_meta = t->wmeta,
                           .nweights_meta = 2,
                           .steps_per_epoch = spe,
                           .total_steps = total,
                           .epochs = (int)((total + spe - 1) / spe),
                           .has_eval = 1};
    snprintf(info->describe, sizeof info->describe, "%zu parameters, %d train / %d test samples", info->nparams,
             t->train.n, t->test.n);
done:
    if (st != DT_OK) {
        cls_destroy(t);
        *out = NULL;
    }
    return st;
}

static void cls_start_epoch(dt_task *t, int64_t epoch, int64_t batch) {
    dt_loader_start_epoch(t->loader, epoch, batch);
}

static dt_status cls_next_batch(dt_task *t, dt_rng *rng, dt_task_batch *b, int *more) {
    (void)rng;
    *more = dt_loader_next(t->loader, &t->b);
    *b = (dt_task_batch){t->b.first, t->b.B, t->b.global_B};
    return DT_OK;
}

static void cls_zero_grad(dt_task *t) { dt_model_zero_grad(t->m); }

static dt_status cls_forward(dt_task *t, int64_t step, int off, int len, float loss_scale, float *loss) {
    size_t ss = dt_dataset_sample_size(&t->train);
    dt_model_set_dropout_key(t->m, (uint64_t)step, (int64_t)t->b.first + off);
    dt_model_set_loss_scale(t->m, loss_scale);
    return dt_model_forward(t->m, t->b.x + (size_t)off * ss, t->b.y + off, len, 1, loss);
}

static void cls_backward(dt_task *t, dt_grad_ready_fn hook, void *user) {
    dt_model_set_grad_hook(t->m, hook, user);
    dt_model_backward(t->m);
}

static void cls_set_layer_hook(dt_task *t, dt_task_layer_fn fn, void *user) { dt_model_set_layer_hook(t->m, fn, user); }

// Evaluation sharded across the ranks of comm and reduced.
static dt_status cls_evaluate(dt_task *t, dt_comm_t comm, int64_t step, float train_loss, float *loss,
                              float *accuracy) {
    (void)step, (void)train_loss;
    const dt_dataset *ds = &t->test;
    int r = dt_comm_rank(comm), W = dt_comm_size(comm);
    int lo = (int)((long)ds->n * r / W), hi = (int)((long)ds->n * (r + 1) / W);
    double sum;
    long correct;
    dt_status st = eval_range(t->m, ds, lo, hi, t->c->eval_batch, &sum, &correct);
    if (st != DT_OK) return st;
    float v[2] = {(float)sum, (float)correct};
    if ((st = dt_allreduce(v, v, 2, DT_F32, DT_SUM, comm)) != DT_OK)
        return dt_error(st, "evaluation: %s", dt_last_error());
    *loss = ds->n ? v[0] / ds->n : 0.0f;
    *accuracy = ds->n ? v[1] / ds->n : 0.0f;
    return DT_OK;
}

static dt_status cls_save(dt_task *t, const char *path) {
    if (!path) return DT_OK;
    dt_st_meta meta[] = {{"format", "dtrain-weights"}, {"dtrain_version", dt_version()}, {"name", t->c->name}};
    return dt_model_save(t->m, path, meta, 3);
}

static void cls_summary(dt_task *t, cJSON *o, const dt_train_result *r) {
    (void)t;
    cJSON_AddNumberToObject(o, "epochs", r->epochs);
    cJSON_AddNumberToObject(o, "test_loss", r->test_loss);
    cJSON_AddNumberToObject(o, "test_accuracy", r->test_accuracy);
}

static dt_status cls_set_shares(dt_task *t, const int *units, int nunits) {
    return dt_loader_set_shares(t->full, units, nunits);
}

static int cls_train_labels(dt_task *t, const int32_t **y) {
    *y = t->train.y;
    return t->train.n;
}

// A client's samples copied into their own dataset, with a one-rank loader.
static dt_status cls_set_subset(dt_task *t, const uint32_t *idx, int n, int batch, uint64_t seed) {
    dt_loader_free(t->subl);
    t->subl = NULL;
    dt_dataset_free(&t->sub);
    t->loader = t->full;
    if (n == 0) return DT_OK;
    size_t ss = dt_dataset_sample_size(&t->train);
    dt_dataset *d = &t->sub;
    memcpy(d->shape, t->train.shape, sizeof d->shape);
    d->classes = t->train.classes;
    d->x = dt_alloc(sizeof(float) * ss * (size_t)n);
    d->y = malloc(sizeof(int32_t) * (size_t)n);
    if (!d->x || !d->y) {
        dt_dataset_free(d);
        return dt_error(DT_ERR_NOMEM, "a client's %d samples: out of memory", n);
    }
    d->n = n;
    for (int i = 0; i < n; i++) {
        dt_dataset_sample(&t->train, (int)idx[i], d->x + (size_t)i * ss);
        d->y[i] = t->train.y[idx[i]];
    }
    dt_loader_params lp = dt_loader_default_params();
    lp.batch = batch;
    lp.shuffle = 1;
    lp.drop_last = 0;
    lp.prefetch = 0;
    lp.seed = seed;
    lp.rank = 0;
    lp.world = 1;
    dt_status st = dt_loader_create(&t->subl, d, &lp);
    if (st == DT_OK) t->loader = t->subl;
    return st;
}

const dt_task_ops dt_task_classifier = {
    .name = "classifier",
    .wants = cls_wants,
    .warm = cls_warm,
    .create = cls_create,
    .destroy = cls_destroy,
    .start_epoch = cls_start_epoch,
    .next_batch = cls_next_batch,
    .zero_grad = cls_zero_grad,
    .forward = cls_forward,
    .backward = cls_backward,
    .set_layer_hook = cls_set_layer_hook,
    .evaluate = cls_evaluate,
    .save = cls_save,
    .summary = cls_summary,
    .set_shares = cls_set_shares,
    .train_labels = cls_train_labels,
    .set_subset = cls_set_subset,
};
