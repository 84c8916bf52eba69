/* The classifier task (task.h): IDX images -> dt_model -> softmax
 * cross-entropy; the test split evaluated at the end of every epoch; and the
 * classifier's evaluation outside training (dt_evaluate,
 * dt_eval_checkpoint). */
#include "dtrain/ckpt.h"
#include "dtrain/launch.h"
#include "dtrain/train.h"
#include "engine/dynbatch.h"
#include "engine/codecs/codec.h"
#include "engine/device.h"
#include "engine/tasks/task.h"
#include "gpu/dev_model.h"

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
    dt_grad_matrix *mats;          // the block's 2-D tensors (dt_codec_matrices), nmats
    int nmats;
    dt_batch b;                    // the batch in flight: this rank's share
    float *scratch;                // a scratch batch's images and labels (scratch_batch)
    int deferred;                  // the parameters come at hold (a pipeline stage's layers)
    dt_st_meta wmeta[2];
    // [parallel] tensor: this rank's shard tp of ntp (0 of 1: the whole model)
    dt_task_layer_fn layer_fn;     // the loop's layer hook, and its argument
    void *layer_user;
    int tp, ntp;
    dt_comm_t tpc, rest;           // its shard's group (tensor innermost), the ranks of its shard
    dt_comm_t tpg;                 // on a device: a GPUs' communicator over tpc (the device model's sums)
    dt_comm_t bnc;                 // batch norm's sums over the data-parallel workers (a communicator of
                                   // their own: the strategy's may be busy with gradients meanwhile)
    unsigned char *order_split;    // the order's ranges divided among the shards
    size_t act_bytes, act_saved;   // the activation sets made, and what 16-bit linear inputs save in them
    dt_dev_mlp *dm;                // [train] device = cuda: the model's steps and evaluations on the device (m:
                                   // the host copy)
    float *probs;                  // ... an evaluation batch's probabilities, read back
    dt_status dev_err;             // ... the step's zero_grad's failure, returned by its forward (or a stage's)
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

// The loader's place: this rank among the data-parallel world (a model
// parallel replica's ranks take their share together, docs/model-parallel.md's
// layout).
static void loader_place(const dt_config *c, dt_comm_t comm, int *rank, int *world) {
    *rank = dt_comm_rank(comm);
    *world = dt_comm_size(comm);
    if (c->pipeline > 1 || c->tensor > 1) {
        *world /= c->pipeline * c->tensor;
        *rank = *rank / c->tensor % *world;
    }
}

// The training split's shard of rank r of W (dt_loader_shard), where the
// data is read sharded (dt_config_data_sharded); *first = -1: the whole.
static dt_status shard_of(const dt_config *c, const char *img, int r, int W, int *first, int *count) {
    *first = *count = -1;
    if (W < 1 || !dt_config_data_sharded(c)) return DT_OK;
    int64_t n = 0;
    size_t ss;
    dt_idx h;
    dt_status st = !strcmp(c->dataset, "hdf5") ? dt_hdf5_images_shape(c->data_file, c->h5_names[0], &n, &ss)
                                               : dt_idx_read_header(img, &h);
    if (st != DT_OK) return st;
    if (strcmp(c->dataset, "hdf5")) n = h.dims[0];
    if (n > 0x7fffffff) return dt_error(DT_ERR_FORMAT, "%s: %lld samples, at most 2^31 - 1 are read", img, (long long)n);
    dt_loader_shard((int)n, c->batch, W, r, first, count);
    if (r == 0 && W > 1)
        dt_log(DT_LOG_INFO, "data: each of %d ranks reads its shard of %s ([data] shard = %s): rank 0 samples [0, %d) "
                            "of %lld", W, !strcmp(c->dataset, "hdf5") ? c->data_file : c->data_dir,
               c->data_shard == DT_DATA_SHARD_RANKS ? "ranks" : "auto, for s3:// data", *count, (long long)n);
    return DT_OK;
}

// A split of the data; the training split rank r of W's shard of it where
// it is read sharded (W 0: whole).
static dt_status load_split(const dt_config *c, const char *split, int r, int W, dt_dataset *ds) {
    char img[1024], lab[1024];
    int train = !strcmp(split, "train"), cache = train ? c->cache : 1, first, count;
    if (g_warm.c == c && g_warm.have[!train]) {
        *ds = g_warm.ds[!train];
        g_warm.have[!train] = 0;
        return DT_OK;
    }
    dt_status st;
    if (!strcmp(c->dataset, "hdf5")) {
        snprintf(img, sizeof img, "%s: dataset '%s'", c->data_file, c->h5_names[train ? 0 : 2]);
        st = shard_of(c, img, r, train ? W : 0, &first, &count);
        if (st == DT_OK && first < 0)
            st = dt_dataset_load_hdf5(ds, c->data_file, c->h5_names[train ? 0 : 2], c->h5_names[train ? 1 : 3], 10,
                                      c->mean, c->std, cache);
        else if (st == DT_OK)
            st = dt_dataset_load_hdf5_rows(ds, c->data_file, c->h5_names[0], c->h5_names[1], 10, c->mean, c->std, cache,
                                           first, count);
    } else {
        st = dt_idx_find_split(c->data_dir, train ? "train" : "t10k", img, lab, sizeof img);
        if (st == DT_OK) st = shard_of(c, img, r, train ? W : 0, &first, &count);
        if (st == DT_OK && first < 0) st = dt_dataset_load_idx(ds, img, lab, 10, c->mean, c->std, cache);
        else if (st == DT_OK) st = dt_dataset_load_idx_rows(ds, img, lab, 10, c->mean, c->std, cache, first, count);
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

// Sums the loss and counts correct predictions over samples [lo, hi): on
// the CPU's model m, or (dm) on the device's, whose probabilities are read
// back into probs [batch, classes] (host) batch by batch.
static dt_status eval_range(dt_model *m, dt_dev_mlp *dm, float *probs, const dt_dataset *ds, int lo, int hi,
                            int batch, double *loss_sum, long *correct) {
    size_t ss = dt_dataset_sample_size(ds);
    int V = dt_model_num_classes(m);
    *loss_sum = 0;
    *correct = 0;
    for (int i = lo; i < hi; i += batch) {
        int B = hi - i < batch ? hi - i : batch;
        float l;
        dt_heartbeat(-1);
        dt_status st = dm ? dt_dev_mlp_evaluate(dm, ds->x + (size_t)i * ss, ds->y + i, B, &l, probs)
                          : dt_model_forward(m, ds->x + (size_t)i * ss, ds->y + i, B, 0, &l);
        if (st != DT_OK) return st;
        *loss_sum += (double)l * B;
        const float *p = dm ? probs : dt_model_probs(m);
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
    dt_status st = eval_range(m, NULL, NULL, ds, 0, ds->n, batch, &sum, &correct);
    if (st != DT_OK) return st;
    if (loss) *loss = ds->n ? (float)(sum / ds->n) : 0.0f;
    if (accuracy) *accuracy = ds->n ? (float)correct / ds->n : 0.0f;
    return DT_OK;
}

dt_status dt_eval_checkpoint(const dt_config *c, const char *weights, float *loss, float *accuracy, int *n) {
    if (c->gpt && c->arch == DT_ARCH_LLAMA) return dt_llama_eval_checkpoint(c, weights, loss, accuracy, n);
    if (c->gpt) return dt_gpt_eval_checkpoint(c, weights, loss, accuracy, n);
    dt_set_threads(c->threads);
    dt_dataset test = {0};
    dt_model *m = NULL;
    // The weights first: a wrong file is reported before the data loads.
    int rows;
    dt_status st = dt_check_memory(c, DT_MEM_EVAL, 1, 0, &rows);
    if (st == DT_OK) st = dt_model_create(&m, c->input, c->layers, c->nlayers, rows);
    if (st == DT_OK) st = dt_model_load(m, weights);
    if (st == DT_OK) st = load_split(c, "test", 0, 0, &test);
    if (st == DT_OK) st = dt_evaluate(m, &test, c->eval_batch, loss, accuracy);
    if (n) *n = test.n;
    dt_model_free(m);
    dt_dataset_free(&test);
    return st;
}

// ----------------------------------------------------------------------------
// the task

static int cls_wants(const dt_config *c) { return !c->gpt; }

static void cls_close(dt_task *t) {
    dt_comm_destroy(t->tpg);
    dt_comm_destroy(t->tpc);
    dt_comm_destroy(t->rest);
    dt_comm_destroy(t->bnc);
    t->tpc = t->rest = t->bnc = t->tpg = NULL;
}

static dt_status cls_warm(const dt_config *c) {
    for (int k = 0; k < 2; k++)
        if (g_warm.have[k]) dt_dataset_free(&g_warm.ds[k]);
    memset(&g_warm, 0, sizeof g_warm);
    if (!c) return DT_OK;
    // (a shard of the training split is known once the rank is: loaded then)
    dt_status st = dt_config_data_sharded(c) ? DT_OK : load_split(c, "train", 0, 0, &g_warm.ds[0]);
    if (st != DT_OK) return st;
    g_warm.have[0] = !dt_config_data_sharded(c);
    if ((st = load_split(c, "test", 0, 0, &g_warm.ds[1])) != DT_OK) return st;
    g_warm.have[1] = 1;
    g_warm.c = c;
    return DT_OK;
}

static void cls_destroy(dt_task *t) {
    if (!t) return;
    free(t->scratch);
    free(t->order_split);
    free(t->tinfo);
    free(t->order);
    free(t->order_layer);
    free(t->mats);
    dt_dev_mlp_free(t->dm);
    free(t->probs);
    dt_loader_free(t->subl);
    dt_dataset_free(&t->sub);
    dt_loader_free(t->full);
    dt_model_free(t->m);
    dt_dataset_free(&t->train);
    dt_dataset_free(&t->test);
    free(t);
}

// The model's sums over the tensor-parallel shards (dt_model_set_reduce,
// dt_dev_mlp_set_reduce) on the communicator *user (the task's tpc, or on
// a device tpg).
static dt_status tp_reduce(float *buf, size_t n, void *user) {
    dt_status st = dt_allreduce(buf, buf, n, DT_F32, DT_SUM, *(dt_comm_t *)user);
    return st == DT_OK ? DT_OK : dt_error(st, "tensor-parallel allreduce: %s", dt_last_error());
}

static void part_fill(void *user, const float *local, size_t lo, size_t hi, float *buf) {
    dt_task *t = user;
    dt_model_shard_fill(t->m, t->tp, local, lo, hi, buf);
}

static void part_take(void *user, float *local, size_t lo, size_t hi, const float *buf) {
    dt_task *t = user;
    dt_model_shard_take(t->m, t->tp, local, lo, hi, buf);
}

// Batch norm's sums over the workers (dt_model_set_batch_sum).
static dt_status bn_sum(int64_t *buf, size_t n, void *user) {
    dt_task *t = user;
    dt_status st = dt_allreduce(buf, buf, n, DT_I64, DT_SUM, t->bnc);
    return st == DT_OK ? DT_OK : dt_error(st, "batch norm's allreduce: %s", dt_last_error());
}

// The model's groups: tensor parallel's shards, and a model with batch
// norm on several workers its own communicator for the statistics (the
// config refuses batch norm with model parallelism and parameter servers,
// so every rank is a data-parallel worker).
static dt_status tensor_groups(dt_task *t, dt_comm_t comm) {
    dt_status st = dt_task_shard_groups(comm, t->c, &t->ntp, &t->tp, &t->tpc, &t->rest, &t->tpg);
    if (st != DT_OK || !dt_layers_have_batchnorm(t->c->layers, t->c->nlayers) || dt_comm_size(comm) < 2) return st;
    dt_comm_destroy(t->bnc);
    t->bnc = NULL;
    if ((st = dt_comm_split(comm, 0, dt_comm_rank(comm), &t->bnc)) != DT_OK)
        return dt_error(st, "batch norm's communicator: %s", dt_last_error());
    if (t->m) dt_model_set_batch_sum(t->m, bn_sum, t, t->c->sync_bn);
    return DT_OK;
}

static dt_status cls_regroup(dt_task *t, dt_comm_t comm, dt_comm_t *replicas, dt_comm_t *tensor_group) {
    dt_status st = tensor_groups(t, comm);
    *replicas = t->rest;
    *tensor_group = t->tpc;
    return st;
}

// The model, or with [parallel] tensor = T this rank's shard of it: the T
// consecutive ranks from rank - rank % T hold the T shards of one copy of
// the model (docs/model-parallel.md's layout, as the GPT's); the ranks of
// the same shard evaluate together.
static void init_params(dt_task *t);

static dt_status cls_model(dt_task *t, const dt_config *c, dt_comm_t comm, int model_rows) {
    dt_status st = tensor_groups(t, comm);
    if (st != DT_OK) return st;
    if ((st = dt_model_create_shard(&t->m, c->input, c->layers, c->nlayers, model_rows, t->tp, t->ntp)) != DT_OK)
        return st;
    if (dt_model_num_classes(t->m) != t->train.classes)
        return dt_error(DT_ERR_CONFIG, "[model]: the last layer has %d outputs but the dataset has %d classes",
                        dt_model_num_classes(t->m), t->train.classes);
    if (t->ntp > 1) dt_model_set_reduce(t->m, tp_reduce, &t->tpc);
    if (t->bnc) dt_model_set_batch_sum(t->m, bn_sum, t, c->sync_bn);
    // A pipeline's stage keeps its layers alone: their parameters come when
    // the strategy has cut the stages (hold), under ZeRO-1 too.
    t->deferred = c->pipeline > 1;
    if (!t->deferred) init_params(t);
    return DT_OK;
}

// The initial parameters from c's seed (a shard's part of the whole
// model's).
static void init_params(dt_task *t) { dt_model_init(t->m, t->c->seed); }

static dt_status cls_hold(dt_task *t, const unsigned char *held, const dt_grad_range **ranges, int *n) {
    dt_status st = dt_model_set_held(t->m, held);
    if (st == DT_OK) init_params(t);
    *ranges = dt_model_held_ranges(t->m, n);
    return st;
}

// The training split's loader: this rank's share of each batch (a model
// parallel replica's ranks take theirs together).
static dt_status cls_loader(dt_task *t, const dt_config *c, dt_comm_t comm) {
    dt_loader_params lp = dt_loader_default_params();
    lp.batch = c->batch;
    lp.shuffle = c->shuffle;
    lp.drop_last = c->drop_last;
    lp.prefetch = c->prefetch;
    lp.threads = c->loader_threads;
    lp.sampler = c->sampler;
    lp.seed = c->seed;
    loader_place(c, comm, &lp.rank, &lp.world);
    lp.shard = dt_config_data_sharded(c);
    lp.aug.crop_pad = c->crop_pad;
    dt_status st = dt_augment_parse(c->augment, lp.augment, &lp.naugment);
    if (st != DT_OK) return st;
    lp.max_share = c->dynamic_batch ? dt_dynbatch_max_share(c->batch < t->train.n ? c->batch : t->train.n, lp.world) : 0;
    if ((st = dt_loader_create(&t->full, &t->train, &lp)) != DT_OK) return st;
    t->loader = t->full;
    return DT_OK;
}

// The tensors as checkpoints name them (the whole model's), and the
// gradient order for a strategy that gathers layer by layer: the tensors
// in block order (their names start with the layer index), with the
// codecs' matrices.
static dt_status cls_tensors(dt_task *t, int nt) {
    size_t n = nt > 0 ? (size_t)nt : 1;
    t->tinfo = malloc(sizeof *t->tinfo * n);
    t->order = malloc(sizeof *t->order * n);
    t->order_layer = malloc(sizeof(int) * n);
    t->order_split = malloc(n);
    t->mats = malloc(sizeof *t->mats * n);
    if (!t->tinfo || !t->order || !t->order_layer || !t->order_split || !t->mats)
        return dt_error(DT_ERR_NOMEM, "out of memory");
    for (int i = 0; i < nt; i++) {
        const dt_tensor_info *ti = dt_model_tensor(t->m, i);
        t->tinfo[i] = *dt_model_whole_tensor(t->m, i);
        t->nmats += dt_codec_matrices(ti, 0, t->mats + t->nmats);
        t->order[i] = (dt_grad_range){ti->offset, ti->numel};
        t->order_layer[i] = atoi(ti->name);
        t->order_split[i] = (unsigned char)dt_model_tensor_split(t->m, i);
    }
    return DT_OK;
}

// What the loop needs to know of the task, and its line for the run's start.
static void cls_info(dt_task *t, const dt_config *c, int nt, dt_task_info *info) {
    t->wmeta[0] = (dt_st_meta){"format", "dtrain-weights"};
    t->wmeta[1] = (dt_st_meta){"name", c->name};
    int64_t spe = dt_loader_steps_per_epoch(t->loader);
    int64_t total = c->epochs > 0 ? (int64_t)c->epochs * spe : c->max_steps;
    int nfrozen;
    const dt_grad_range *frozen = dt_model_buffer_ranges(t->m, &nfrozen);
    if (c->max_steps > 0 && c->max_steps < total) total = c->max_steps;
    *info = (dt_task_info){.params = dt_model_params(t->m),
                           .grads = dt_model_grads(t->m),
                           .nparams = dt_model_num_params(t->m),
                           .order = t->order,
                           .norder = nt,
                           .order_layer = t->order_layer,
                           .order_split = t->ntp > 1 ? t->order_split : NULL,
                           .matrices = t->mats,
                           .nmatrices = t->nmats,
                           .replicas = t->rest,
                           .tensor_group = t->tpc,
                           .tensors = t->tinfo,
                           .nwhole = dt_model_whole_params(t->m),
                           .part_fill = t->ntp > 1 || t->deferred ? part_fill : NULL,
                           .part_take = t->ntp > 1 || t->deferred ? part_take : NULL,
                           .part_user = t,
                           .deferred = t->deferred,
                           .frozen = frozen,
                           .nfrozen = nfrozen,
                           .ntensors = nt,
                           .weights_meta = t->wmeta,
                           .nweights_meta = 2,
                           .steps_per_epoch = spe,
                           .total_steps = total,
                           .epochs = (int)((total + spe - 1) / spe),
                           .has_eval = 1};
    char shard[96] = "", acts[96] = "";
    if (t->ntp > 1)
        snprintf(shard, sizeof shard, " (%zu on each of %d tensor-parallel ranks)", info->nparams, t->ntp);
    t->act_bytes = dt_model_act_bytes(t->m, &t->act_saved);
    if (t->act_saved)
        snprintf(acts, sizeof acts, "; activations %.1f MiB (%.1f MiB saved: matmul inputs kept in %s)",
                 (double)t->act_bytes / (1 << 20), (double)t->act_saved / (1 << 20),
                 c->precision == DT_F16 ? "fp16" : "bf16");
    snprintf(info->describe, sizeof info->describe, "%zu parameters%s, %d train / %d test samples%s",
             dt_model_whole_params(t->m), shard, t->train.total, t->test.n, acts);
}

// The device's model (the run on a device): its batches are the
// micro-batches and the evaluation's (at most eval_batch of the test
// split), and the evaluation's probabilities come back into t->probs.
static dt_status dev_model(dt_task *t, const dt_config *c, int max_micro, dt_dev_part part) {
    int eb = c->eval_batch < t->test.n ? c->eval_batch : t->test.n, rows = eb > max_micro ? eb : max_micro;
    size_t V = (size_t)dt_model_num_classes(t->m);
    if (!(t->probs = malloc(sizeof(float) * V * (size_t)(eb > 0 ? eb : 1))))
        return dt_error(DT_ERR_NOMEM, "out of memory");
    return dt_dev_mlp_create(&t->dm, dt_dev_get(), t->m, rows, dt_optim_params_states(&c->optim), part,
                             (dt_dtype)c->precision, c->seed);
}

static dt_status cls_create(dt_task **out, const dt_config *c, dt_comm_t comm, int max_micro, int model_rows,
                            dt_task_info *info) {
    dt_task *t = calloc(1, sizeof *t);
    if (!(*out = t)) return dt_error(DT_ERR_NOMEM, "out of memory");
    t->c = c;
    dt_status st;
    int r, W;
    loader_place(c, comm, &r, &W);
    DT_TRY(load_split(c, "train", r, W, &t->train), done);
    DT_TRY(load_split(c, "test", 0, 0, &t->test), done);
    // (a run on a GPU: the activations are the device's, the host's model one row's)
    DT_TRY(cls_model(t, c, comm, dt_device_index(c->device) >= 0 ? 1 : model_rows), done);
    DT_TRY(cls_loader(t, c, comm), done);
    DT_TRY(cls_tensors(t, dt_model_num_tensors(t->m)), done);
    if (dt_device_index(c->device) >= 0) DT_TRY(dev_model(t, c, max_micro, dt_train_device_part(c, comm)), done);
    if (t->dm && t->ntp > 1) {
        dt_dev_mlp_set_reduce(t->dm, tp_reduce, &t->tpg);
        dt_dev_mlp_blocks(t->dm)->shards = dt_comm_backend(t->tpg);
    }
    cls_info(t, c, dt_model_num_tensors(t->m), info);
    info->device = t->dm ? dt_dev_mlp_blocks(t->dm) : NULL;
done:
    if (st != DT_OK) {
        cls_close(t);
        cls_destroy(t);
        *out = NULL;
    }
    return st;
}

static void cls_start_epoch(dt_task *t, int64_t epoch, int64_t batch) {
    dt_loader_start_epoch(t->loader, epoch, batch);
}

static void cls_seek(dt_task *t, int64_t batch, int part) { dt_loader_seek(t->loader, batch, part); }

static dt_status cls_next_batch(dt_task *t, dt_rng *rng, dt_task_batch *b, int *more) {
    (void)rng;
    *more = dt_loader_next(t->loader, &t->b);
    *b = (dt_task_batch){t->b.first, t->b.B, t->b.global_B};
    return DT_OK;
}

static void cls_zero_grad(dt_task *t) {
    if (!t->dm) dt_model_zero_grad(t->m);
    else t->dev_err = dt_dev_blocks_zero_grad(dt_dev_mlp_blocks(t->dm));
}

static dt_status cls_forward(dt_task *t, int64_t step, int off, int len, float loss_scale, float *loss) {
    size_t ss = dt_dataset_sample_size(&t->train);
    if (t->dm && t->dev_err != DT_OK) return t->dev_err;
    if (t->dm)
        return dt_dev_mlp_forward(t->dm, t->b.x + (size_t)off * ss, t->b.y + off, len, loss_scale, (uint64_t)step,
                                  (int64_t)t->b.first + off, dt_dev_loss_out(dt_dev_mlp_blocks(t->dm), loss));
    dt_model_set_dropout_key(t->m, (uint64_t)step, (int64_t)t->b.first + off);
    dt_model_set_loss_scale(t->m, loss_scale);
    return dt_model_forward(t->m, t->b.x + (size_t)off * ss, t->b.y + off, len, 1, loss);
}

// The most micro-batches a rank runs this step: grad_accum, or the largest
// share (ceil(global / workers), the loader's even split) when smaller
// (dt_strategy_plan_accum); the others' batch norm sums are made with zeros.
static dt_status cls_micro_pad(dt_task *t, int done) {
    if (!t->bnc) return DT_OK;
    int W = dt_comm_size(t->bnc), most = (t->b.global_B + W - 1) / W, want = t->c->grad_accum;
    if (most < want) want = most;
    dt_status st = DT_OK;
    for (int k = done; k < want && st == DT_OK; k++) st = dt_model_batch_norm_idle(t->m);
    return st;
}

static dt_status cls_segments(dt_task *t, int n, const int *len, const float *scale, dt_grad_part_fn fn,
                              void *user) {
    return dt_model_set_segments(t->m, n, len, scale, fn, user);
}

static dt_status cls_backward(dt_task *t, dt_grad_ready_fn hook, void *user) {
    if (t->dm) return dt_dev_mlp_backward(t->dm, hook, user);
    dt_model_set_grad_hook(t->m, hook, user);
    dt_model_backward(t->m);
    return DT_OK;
}

static void cls_set_layer_hook(dt_task *t, dt_task_layer_fn fn, void *user) {
    t->layer_fn = fn;
    t->layer_user = user;
    dt_model_set_layer_hook(t->m, fn, user);
    if (t->dm) dt_dev_mlp_blocks(t->dm)->layer_fn = fn, dt_dev_mlp_blocks(t->dm)->layer_user = user;
}

// ----------------------------------------------------------------------------
// pipeline stages: layers [l0, l1) of the model on activations of their own
// (dt_model_acts; on a device the device model's, dt_dev_mlp_stage); the
// share in flight is the replica's

struct dt_task_stage {
    dt_model_acts *a;
    dt_dev_mlp_stage *ds;  // on a device: its activations there (a NULL)
    dt_task *t;
    size_t bytes, saved;  // counted in the task's act_bytes, act_saved while the stage lives
    int l0, l1, off, len;
    int64_t step;
    float scale;
};

static dt_status cls_stage_create(dt_task *t, int l0, int l1, int max_len, dt_task_stage **out) {
    dt_task_stage *st = calloc(1, sizeof *st);
    if (!(*out = st)) return dt_error(DT_ERR_NOMEM, "pipeline stage: out of memory");
    *st = (dt_task_stage){.t = t, .l0 = l0, .l1 = l1};
    if (t->dm) {
        dt_status s = dt_dev_mlp_stage_create(t->dm, l0, l1, &st->ds);
        if (s != DT_OK) free(st), *out = NULL;
        return s;
    }
    dt_status s = dt_model_acts_create(&st->a, t->m, l0, l1, max_len);
    if (s != DT_OK) {
        free(st);
        *out = NULL;
        return s;
    }
    st->bytes = dt_model_acts_bytes(st->a, &st->saved);
    t->act_bytes += st->bytes;
    t->act_saved += st->saved;
    return s;
}

static void cls_stage_free(dt_task_stage *st) {
    if (!st) return;
    dt_dev_mlp_stage_free(st->ds);
    st->t->act_bytes -= st->bytes;
    st->t->act_saved -= st->saved;
    dt_model_acts_free(st->a);
    free(st);
}

static dt_status cls_stage_begin(dt_task *t, dt_task_stage *st, int64_t step, int off, int len, float loss_scale,
                                 float **in, size_t *in_count, float **out, size_t *out_count) {
    if (off < t->b.first || off + len > t->b.first + t->b.B)
        return dt_error(DT_ERR_ARG, "pipeline stage: samples [%d, %d) outside the share [%d, %d)", off, off + len,
                        t->b.first, t->b.first + t->b.B);
    st->off = off - t->b.first;
    st->len = len;
    st->step = step;
    st->scale = loss_scale;
    if (st->ds) {
        dt_dev_mlp_stage_streams(st->ds, in, in_count, out, out_count);
        *in_count *= (size_t)len, *out_count *= (size_t)len;
        return DT_OK;
    }
    *in = dt_model_acts_input(st->a);
    *out = dt_model_acts_output(st->a);
    *in_count = (size_t)len * dt_model_stream_size(t->m, st->l0);
    *out_count = (size_t)len * dt_model_stream_size(t->m, st->l1);
    return DT_OK;
}

static dt_status cls_stage_forward(dt_task *t, dt_task_stage *st, float *loss) {
    size_t ss = dt_dataset_sample_size(&t->train);
    if (st->ds && t->dev_err != DT_OK) return t->dev_err;
    if (st->ds)
        return dt_dev_mlp_stage_forward(st->ds, t->b.x + (size_t)st->off * ss, t->b.y + st->off, st->len, st->scale,
                                        (uint64_t)st->step, (int64_t)t->b.first + st->off,
                                        dt_dev_loss_out(dt_dev_mlp_blocks(t->dm), loss));
    dt_model_set_dropout_key(t->m, (uint64_t)st->step, (int64_t)t->b.first + st->off);
    return dt_model_forward_range(t->m, st->a, st->l0 == 0 ? t->b.x + (size_t)st->off * ss : NULL, t->b.y + st->off,
                                  st->len, 1, loss);
}

static dt_status cls_stage_backward(dt_task *t, dt_task_stage *st, float *d, float **din) {
    if (st->ds) return dt_dev_mlp_stage_backward(st->ds, d, din);
    dt_model_set_loss_scale(t->m, st->scale);
    return dt_model_backward_range(t->m, st->a, d, din);
}

static dt_status cls_scratch_batch(dt_task *t, int len) {
    size_t ss = dt_dataset_sample_size(&t->train);
    free(t->scratch);
    if (!(t->scratch = calloc((size_t)len * (ss + 1), sizeof(float)))) return dt_error(DT_ERR_NOMEM, "out of memory");
    t->b = (dt_batch){t->scratch, (const int32_t *)(t->scratch + (size_t)len * ss), len, len, 0};
    return DT_OK;
}

// Evaluation sharded across the ranks of comm and reduced (comm NULL: all
// of it on this rank).
static dt_status cls_evaluate(dt_task *t, dt_comm_t comm, int64_t step, float train_loss, float *loss,
                              float *accuracy) {
    (void)step, (void)train_loss;
    const dt_dataset *ds = &t->test;
    if (t->ntp > 1) comm = t->rest;  // the shards of one model run the same samples
    int r = comm ? dt_comm_rank(comm) : 0, W = comm ? dt_comm_size(comm) : 1, lo, hi, extra;
    dt_task_eval_share(ds->n, r, W, t->c->eval_batch, &lo, &hi, &extra);
    double sum;
    long correct;
    dt_status st = eval_range(t->m, t->dm, t->probs, ds, lo, hi, t->c->eval_batch, &sum, &correct);
    if (st == DT_OK) st = dt_task_replay(t->layer_fn, t->layer_user, 0, t->c->nlayers - 1, extra);
    if (st != DT_OK) return st;
    float v[2] = {(float)sum, (float)correct};
    if (comm && (st = dt_allreduce(v, v, 2, DT_F32, DT_SUM, comm)) != DT_OK)
        return dt_error(st, "evaluation: %s", dt_last_error());
    *loss = ds->n ? v[0] / ds->n : 0.0f;
    *accuracy = ds->n ? v[1] / ds->n : 0.0f;
    return DT_OK;
}

static dt_status cls_save(dt_task *t, const char *path, dt_comm_t comm, size_t lo, size_t hi) {
    dt_st_meta meta[] = {{"format", "dtrain-weights"}, {"dtrain_version", dt_version()}, {"name", t->c->name}};
    return dt_task_write_weights(path, t->tinfo, dt_model_num_tensors(t->m), meta, 3, dt_model_params(t->m),
                                 t->ntp > 1 || t->deferred ? part_fill : NULL, t, comm, lo, hi);
}

static void cls_summary(dt_task *t, cJSON *o, const dt_train_result *r) {
    cJSON_AddNumberToObject(o, "epochs", r->epochs);
    cJSON_AddNumberToObject(o, "test_loss", r->test_loss);
    cJSON_AddNumberToObject(o, "test_accuracy", r->test_accuracy);
    // The activation sets' bytes as allocated (docs/mixed-precision.md).
    cJSON *pr = cJSON_GetObjectItem(o, "precision");
    if (pr) {
        cJSON_AddNumberToObject(pr, "activation_bytes", (double)t->act_bytes);
        cJSON_AddNumberToObject(pr, "activation_bytes_saved", (double)t->act_saved);
    }
}

static dt_status cls_set_shares(dt_task *t, const int *units, int nunits) {
    return dt_loader_set_shares(t->full, units, nunits);
}

static int cls_train_labels(dt_task *t, int32_t **y) {
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
    .close = cls_close,
    .start_epoch = cls_start_epoch,
    .seek = cls_seek,
    .next_batch = cls_next_batch,
    .zero_grad = cls_zero_grad,
    .forward = cls_forward,
    .backward = cls_backward,
    .micro_pad = cls_micro_pad,
    .segments = cls_segments,
    .set_layer_hook = cls_set_layer_hook,
    .stage_create = cls_stage_create,
    .stage_free = cls_stage_free,
    .stage_begin = cls_stage_begin,
    .stage_forward = cls_stage_forward,
    .stage_backward = cls_stage_backward,
    .scratch_batch = cls_scratch_batch,
    .hold = cls_hold,
    .evaluate = cls_evaluate,
    .save = cls_save,
    .summary = cls_summary,
    .set_shares = cls_set_shares,
    .regroup = cls_regroup,
    .train_labels = cls_train_labels,
    .set_subset = cls_set_subset,
};
