/* The memory a run will need, worked out from its validated sizes before
 * anything large is allocated (dt_check_memory in train.h): the CLI calls it
 * before it starts workers, and each training, evaluation and sampling path
 * before it allocates. Sizes come from the model code (dt_model_memory,
 * dt_gpt_activation_bytes), the data files' headers and sizes, and the
 * optimizer's state count; available memory from dt_mem_available(). */
#include "dtrain/ckpt.h"
#include "dtrain/gpt.h"
#include "dtrain/llama.h"
#include "dtrain/optim.h"
#include "dtrain/recsys.h"
#include "dtrain/train.h"

#include "engine/strategies/strategy.h"
#include "engine/tables.h"
#include "engine/worker.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

// A worker's needs, by part; `field` names the config field behind the
// activations.
typedef struct {
    size_t act, model, data;
    size_t ckpt;         // checkpoints' staging and snapshot, the weights file's pieces, or reading one
    size_t ckpt_pieces;  // ... with checkpoints written without a snapshot: a model in parts' in pieces, a
                         // ZeRO rank's from its live slice (0: neither can be)
    int pieces;          // ckpt is that figure ([checkpoint] staging: staging())
    size_t self;         // this process's resident memory before the run allocates
    size_t np;           // parameters (the model part is dt_memory_model_state of them)
    size_t np_whole;     // ... of the whole model (what checkpoints and the weights file hold)
    int zero;            // the ZeRO stage whose model state is counted (model_needs' zero)
    char field[64], value[64];
    char act_what[128], data_what[600];
    int rows;
} need_t;

static int min_int(int64_t a, int64_t b) { return (int)(a < b ? a : b); }

// The program's own resident memory (code, libraries, the runtime's
// arenas), taken at the first check of this process, before the run
// allocates: what every later estimate of the same process adds.
static size_t baseline(void) {
    static size_t b;
    if (!b) b = dt_mem_resident();
    return b;
}

// a + b and a * b, stopping at SIZE_MAX.
static size_t sat_add(size_t a, size_t b) { return a > SIZE_MAX - b ? SIZE_MAX : a + b; }
static size_t sat_mul(size_t a, size_t b) { return b && a > SIZE_MAX / b ? SIZE_MAX : a * b; }

// Floats of optimizer state per parameter (0, 1 or 2), from a 1-element
// optimizer of the config's kind.
static int optim_states(const dt_config *c) {
    dt_optim *o;
    if (dt_optim_create(&o, &c->optim, 1) != DT_OK) return 2;
    int n = dt_optim_num_states(o);
    dt_optim_free(o);
    return n;
}

// A classifier split's sample count and floats per sample, from the IDX
// headers (or the HDF5 file's description) alone.
static dt_status split_size_of(const dt_config *c, const char *pre, int64_t *n, size_t *ss, char *img, size_t len) {
    if (!strcmp(c->dataset, "hdf5")) {
        const char *name = c->h5_names[strcmp(pre, "train") ? 2 : 0];
        snprintf(img, len, "%s: dataset '%s'", c->data_file, name);
        return dt_hdf5_images_shape(c->data_file, name, n, ss);
    }
    dt_idx h;
    char lab[1100];
    dt_status st = dt_idx_find_split(c->data_dir, pre, img, lab, len < sizeof lab ? len : sizeof lab);
    if (st == DT_OK) st = dt_idx_read_header(img, &h);
    if (st != DT_OK) return st;
    *n = h.dims[0];
    *ss = h.count / (size_t)h.dims[0];
    return DT_OK;
}

// The same, kept: a process asks for each split's size at every estimate,
// and each look is a request where the data is in object storage (the
// files do not change under a run).
static dt_status split_size(const dt_config *c, const char *pre, int64_t *n, size_t *ss, char *img, size_t len) {
    static struct {
        char key[1700], img[1100];
        int64_t n;
        size_t ss;
    } kept[2];
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    char key[1700];
    snprintf(key, sizeof key, "%s|%s|%s|%s|%s|%s", pre, c->dataset, c->data_dir, c->data_file, c->h5_names[0],
             c->h5_names[2]);
    int k = strcmp(pre, "train") != 0;
    pthread_mutex_lock(&mu);
    int hit = !strcmp(kept[k].key, key);
    if (hit) *n = kept[k].n, *ss = kept[k].ss, snprintf(img, len, "%s", kept[k].img);
    pthread_mutex_unlock(&mu);
    if (hit) return DT_OK;
    dt_status st = split_size_of(c, pre, n, ss, img, len);
    if (st != DT_OK) return st;
    pthread_mutex_lock(&mu);
    snprintf(kept[k].key, sizeof kept[k].key, "%s", key);
    snprintf(kept[k].img, sizeof kept[k].img, "%s", img);
    kept[k].n = *n, kept[k].ss = *ss;
    pthread_mutex_unlock(&mu);
    return DT_OK;
}

static size_t file_size(const char *path) {
    struct stat sb;
    return path[0] && stat(path, &sb) == 0 && S_ISREG(sb.st_mode) ? (size_t)sb.st_size : 0;
}

size_t dt_memory_model_state(const dt_config *c, dt_mem_use use, size_t np, int zero, int W, dt_memory_kinds *k) {
    dt_memory_kinds m = {0};
    // (tensor parallel: a shard's state is sliced over the ranks holding
    // that shard; a pipeline's, over the replicas of its stage)
    if (c->tensor > 1 && W >= c->tensor) W /= c->tensor;
    if (c->pipeline > 1 && W >= c->pipeline) W /= c->pipeline;
    size_t F = sizeof(float), slice = (np + (size_t)W - 1) / (size_t)W;  // the largest slice
    if (W < 1 || zero < 0) W = 1, zero = 0, slice = np;
    m.weights = sat_mul(F, zero >= 3 ? slice : np);
    if (use == DT_MEM_TRAIN) {
        m.gradients = sat_mul(F, zero >= 2 ? slice : np);
        m.optimizer = sat_mul(sat_mul(F, (size_t)optim_states(c)), zero >= 1 ? slice : np);
        // On disk, not in memory: the optimizer state, and at stage 3 the
        // parameter slice (dt_state_back; whole pages of it, counted whole).
        if (c->offload) m.offloaded = m.optimizer + (zero >= 3 && W > 1 ? m.weights : 0);
        if (c->deterministic) m.comm = sat_mul(sizeof(int64_t), np);  // the fixed-point sums
    } else if (use == DT_MEM_EVAL) {
        m.gradients = sat_mul(F, np);  // the model's gradient block (made with it; the weights are read into its parameters)
    }
    if (k) *k = m;
    size_t all = sat_add(sat_add(m.weights, m.gradients), sat_add(m.optimizer, m.comm));
    return all == SIZE_MAX ? all : all - m.offloaded;
}

// What checkpoints and the final weights file add on the worker that holds
// most of them: the background writer's snapshot of what the rank writes
// (a slice of the whole model's np_whole floats and optimizer state when
// the state is sliced or split into parts, else rank 0's whole block; a
// model in parts' staged slice is that snapshot, engine/strategies/pipeline.c),
// and the weights file's pieces (dt_run_weights_write: up to 4 Mi floats,
// or the largest tensor, `big`; rank 0 sums the others' into a second);
// parts: a pipeline's stages keep their layers alone. in_pieces: a model
// in parts writes its checkpoints a piece at a time ([checkpoint] staging
// = pieces): two pieces (what the rank puts in, the sum it writes) instead
// of the slice.
static size_t ckpt_need(const dt_config *c, size_t np_whole, size_t big, int W, int parts, int in_pieces);

// Reading a checkpoint or a weights file ([checkpoint] resume, [model]
// init_from, the weights eval and sample load) holds the headers and one
// piece of DT_ST_PIECE bytes: the streaming pass that verifies the file
// (its checksum, its values finite) goes through it, then the values are
// read straight into what the rank keeps (its slice of the state, its
// stage's blocks), or, for a tensor-parallel shard, a piece of the whole
// block at a time into it. Nothing of the file is held whole. It happens
// before the first step, before any checkpoint is written: the larger of
// this and ckpt_need counts.
static size_t read_need(const dt_config *c, dt_mem_use use) {
    return use != DT_MEM_TRAIN || c->resume[0] || c->init_from[0] ? DT_ST_PIECE : 0;
}

static size_t max_size(size_t a, size_t b) { return a > b ? a : b; }

// Ranks keep parts of the model (tensor-parallel shards, or pipeline
// stages that keep their layers: parts): checkpoints are staged or written
// in pieces ([checkpoint] staging).
static int in_parts(const dt_config *c, int W, int parts) { return parts || (c->tensor > 1 && W >= c->tensor); }

// Checkpoints that may be written without a snapshot ([checkpoint]
// staging): a model in parts' in pieces, a ZeRO rank's slice (of data
// parallel: its own, whole) straight from its live buffers.
static int unstaged(const dt_config *c, int W, int parts) { return in_parts(c, W, parts) || (W > 1 && c->zero > 0); }

static size_t ckpt_need(const dt_config *c, size_t np_whole, size_t big, int W, int parts, int in_pieces) {
    size_t F = sizeof(float), per = (size_t)(1 + optim_states(c)), piece = (size_t)4 << 20;
    int tp = in_parts(c, W, parts);  // (ranks keeping parts: staged slices)
    int sliced = W > 1 && (c->zero > 0 || tp || c->ckpt_sharded);
    size_t pieces = (tp || (W > 1 && c->zero >= 3) ? 2 : 1) * F * (big < piece ? big : piece);
    if (c->ckpt_every_steps <= 0 && c->ckpt_every_seconds <= 0) return pieces;
    size_t slice = sliced ? (np_whole + (size_t)W - 1) / (size_t)W : np_whole;
    if (tp && in_pieces) return sat_add(pieces, 2 * F * (slice < piece ? slice : piece));
    if (in_pieces) return pieces;  // (a ZeRO slice written from the live buffers, the training waiting)
    // (parts: the staged slice is the writer's snapshot; the piece it is assembled in)
    if (tp) pieces += F * (slice < piece ? slice : piece);
    return sat_add(pieces, sat_mul(F * per, slice));
}

// The program's memory as the choice of staging counts it: a constant, so
// that every rank makes the same choice (its own resident memory differs).
#define STAGING_PROGRAM ((size_t)64 << 20)

// [checkpoint] staging for a model in parts (n->ckpt_pieces set): pieces
// when asked, or (auto) when a worker's cap (--memory-limit) is set and the
// staged slice would take its need past it; n->ckpt gets that figure.
static void staging(const dt_config *c, need_t *n) {
    size_t lim = dt_mem_limit(NULL);
    if (!n->ckpt_pieces || c->ckpt_staging == DT_STAGING_SLICE) return;
    size_t with_slice = sat_add(sat_add(sat_add(n->act, n->model), sat_add(n->data, n->ckpt)), STAGING_PROGRAM);
    n->pieces = c->ckpt_staging == DT_STAGING_PIECES || (lim && with_slice > lim);
    if (n->pieces) n->ckpt = n->ckpt_pieces;
}

// Training on a GPU: the activations are the device's (their bytes checked
// against the GPU's before the start, dt_train_check_device); the host
// keeps the batch alone.
static int on_device(const dt_config *c, dt_mem_use use) {
    return use == DT_MEM_TRAIN && dt_device_index(c->device) >= 0;
}

static dt_status classifier_needs(const dt_config *c, dt_mem_use use, int W, need_t *n) {
    char img[1100];
    int64_t ntest, ntrain = 0;
    size_t ss, ss2;
    dt_status st = split_size(c, "t10k", &ntest, &ss, img, sizeof img);
    if (st == DT_OK && use == DT_MEM_TRAIN) st = split_size(c, "train", &ntrain, &ss2, img, sizeof img);
    if (st != DT_OK) return st;
    // Activations: rows for the largest batch the model really runs, which
    // is never more than the samples there are.
    // A global batch is at most the training set: the micro-batches of one
    // that size. Evaluation shards the test set over the workers (the
    // tensor-parallel shards of one model run the same samples; parameter
    // servers outside mode sync: worker 0 alone, engine/loop.c).
    int EW = c->tensor > 1 && W >= c->tensor ? W / c->tensor : c->ps_servers > 0 && c->ps_mode != 0 ? 1 : W;
    int eval_rows = min_int(c->eval_batch, (ntest + EW - 1) / EW), train_rows = 0;
    if (use == DT_MEM_TRAIN) {
        dt_config cc = *c;
        cc.batch = min_int(c->batch, ntrain);
        train_rows = dt_strategy_for(&cc)->max_micro(&cc, W);
    }
    int ev = eval_rows >= train_rows;
    n->rows = ev ? eval_rows : train_rows;
    snprintf(n->field, sizeof n->field, "train.%s", ev ? "eval_batch" : "batch");
    snprintf(n->value, sizeof n->value, " = %d", ev ? c->eval_batch : c->batch);
    snprintf(n->act_what, sizeof n->act_what, "activations for %d samples", n->rows);
    // A tensor-parallel shard's parameters and activations (its part of the
    // pairs' layers, the rest whole); the checkpoints' slices are the whole
    // model's.
    int ntp = c->tensor > 1 && W >= c->tensor ? c->tensor : 1;
    size_t np, whole, wact;
    if ((st = dt_model_shard_memory(c->input, c->layers, c->nlayers, n->rows, ntp, &np, &n->act)) != DT_OK) return st;
    if (on_device(c, use)) n->act = 0;
    if (ntp == 1) whole = np;
    else if ((st = dt_model_memory(c->input, c->layers, c->nlayers, 1, &whole, &wact)) != DT_OK) return st;
    n->np = np;
    n->np_whole = whole;
    n->model = use == DT_MEM_TRAIN ? dt_memory_model_state(c, use, np, n->zero, W, NULL) : sizeof(float) * np * 2;
    n->ckpt = max_size(read_need(c, use), use == DT_MEM_TRAIN ? ckpt_need(c, whole, whole, W, 0, 0) : 0);
    if (use == DT_MEM_TRAIN && unstaged(c, W, 0))
        n->ckpt_pieces = max_size(read_need(c, use), ckpt_need(c, whole, whole, W, 0, 1));
    // Data: each split as floats and labels; while a split loads, its file
    // uncompressed (see below); the loader's two slots of a rank's share and its order.
    // Read sharded (dt_config_data_sharded), a rank holds its shard of the
    // training split (at most its share of every batch, rounded up) and the
    // loader the shards' order besides the epoch's.
    // The file is freed before the first step: it counts only beyond what
    // the steps add then (activations, checkpoints).
    size_t per = sizeof(float) * ss + sizeof(int32_t);
    int dw = W / (c->tensor * c->pipeline) > 1 ? W / (c->tensor * c->pipeline) : 1, sharded = dt_config_data_sharded(c);
    int64_t held = sharded ? min_int(ntrain, ntrain / dw + ntrain / (c->batch > 0 ? c->batch : 1) + 1) : ntrain;
    size_t loading = (size_t)(held > ntest ? held : ntest) * ss, later = sat_add(n->act, n->ckpt);
    n->data = (size_t)(held + ntest) * per + (loading > later ? loading - later : 0);
    if (use == DT_MEM_TRAIN)
        n->data += 2 * per * (size_t)((min_int(c->batch, ntrain) + W - 1) / W) +
                   sizeof(uint32_t) * (size_t)ntrain * (sharded ? 2 : 1);
    if (!strcmp(c->dataset, "hdf5")) snprintf(n->data_what, sizeof n->data_what, "[data] file = %s", c->data_file);
    else snprintf(n->data_what, sizeof n->data_what, "[data] dir = %s", c->data_dir);
    staging(c, n);
    return DT_OK;
}

// What a rank of a pipeline keeps of its shard's np parameters (the
// pipeline strategy's layout): its stage's share
// of the blocks, ceil(L / P) of them, with the embedding and the head (the
// stage holding both ends, the bound). np = 0: one block with both.
static size_t held_params(const dt_config *c, const dt_gpt_config *gc, int ntp, size_t np, int W) {
    int D = W / (c->tensor * c->pipeline);  // (one replica with spares: every layer, pipeline.c's keep_all)
    if (np && (c->pipeline <= 1 || (D <= 1 && dt_worker_spares() > 0))) return np;
    dt_gpt_config one = *gc, two = *gc;
    one.n_layer = 1;
    two.n_layer = 2;
    size_t block = dt_gpt_shard_num_params(&two, ntp) - dt_gpt_shard_num_params(&one, ntp);
    size_t ends = dt_gpt_shard_num_params(&one, ntp) - block;
    return ends + block * (np ? (size_t)((c->n_layer + c->pipeline - 1) / c->pipeline) : 1);
}

// A model-parallel run's stages keep activation sets of their layers for
// the micro-batches alive beside the model's whole set (which evaluation
// uses, and a stage of every layer borrows): the busiest rank, stage 0,
// holds M of them (gpipe) or up to P (1f1b, interleaved), each of
// ceil(L / P) layers (docs/model-parallel.md's schedules).
static size_t stage_sets(const dt_config *c, const dt_gpt_config *gc, const dt_gpt_acts_params *whole) {
    if (c->pipeline <= 1 && c->tensor <= 1) return 0;
    int P = c->pipeline, M = c->micro_batches > 0 ? c->micro_batches : P, gpipe = c->pipeline_schedule == 0;
    int sets = gpipe ? M : M < P ? M : P;
    dt_gpt_acts_params p = *whole;
    p.l1 = (c->n_layer + P - 1) / P;
    if (P == 1) sets--;  // (the first is the whole set)
    return sat_mul(dt_gpt_acts_size(gc, &p), (size_t)(sets > 0 ? sets : 0));
}

// A Llama-style model (dtrain/llama.h): its own parameters, activations
// (every layer's, for B x T tokens) and ZeRO-3 gathers over what
// gpt_needs found for the same sizes; the data, the fields' names and the
// staging as the GPT's. (Data parallel and ZeRO alone: it has no shards
// or stages yet.)
static void llama_needs(const dt_config *c, dt_mem_use use, int W, int B, int T, need_t *n) {
    dt_llama_config lc = dt_config_llama(c);
    dt_tensor_info t[DT_LLAMA_NTENSORS];
    dt_llama_param_shapes(&lc, t);
    size_t np = dt_llama_config_num_params(&lc), big = 0, L = (size_t)c->n_layer, layer = 0;
    for (int i = 0; i < DT_LLAMA_NTENSORS; i++) big = t[i].numel > big ? t[i].numel : big;
    for (int i = 1; i <= 9; i++) layer += t[i].numel / L;  // (the stacked tensors' slices of one layer)
    n->np = n->np_whole = np;
    n->act = dt_llama_activation_bytes(&lc, B, T);
    if (use != DT_MEM_SAMPLE) n->act = sat_add(n->act, 2 * sizeof(int32_t) * (size_t)c->batch * T);
    n->model = use == DT_MEM_TRAIN ? dt_memory_model_state(c, use, np, n->zero, W, NULL) : sizeof(float) * np * 3;
    n->ckpt = max_size(read_need(c, use), use == DT_MEM_TRAIN ? ckpt_need(c, np, big, W, 0, 0) : 0);
    n->ckpt_pieces = use == DT_MEM_TRAIN && unstaged(c, W, 0) ? max_size(read_need(c, use), ckpt_need(c, np, big, W, 0, 1)) : 0;
    // ZeRO-3, as the GPT's below: three layers gathered and two layers'
    // gradients in flight, the embedding, the head and the final norm whole
    // twice; with the pages kept, stage 1's model state and the pack buffer
    // of a whole layer its gathers go through.
    size_t block = sizeof(float) * layer / (size_t)W * (size_t)(W - 1);
    size_t ends = sizeof(float) * (t[0].numel + t[10].numel + t[11].numel);
    if (use == DT_MEM_TRAIN && n->zero >= 3 && W > 1) n->model = sat_add(n->model, 5 * block + 2 * ends);
    if (use == DT_MEM_TRAIN && c->zero >= 3 && n->zero < 3 && W > 1) n->model = sat_add(n->model, sizeof(float) * layer);
}

static void gpt_needs(const dt_config *c, dt_mem_use use, int W, need_t *n) {
    dt_gpt_config gc = dt_config_gpt(c);
    int T = use == DT_MEM_SAMPLE ? c->block_size : c->seq_len;
    // A training step runs micro-batches of windows drawn with replacement:
    // the model needs all the rows whatever the file's length.
    int B = use == DT_MEM_SAMPLE ? 1 : use == DT_MEM_EVAL ? c->batch : dt_strategy_for(c)->max_micro(c, W);
    n->rows = B;
    int ntp = c->tensor > 1 && W >= c->tensor ? c->tensor : 1;
    size_t np = dt_gpt_shard_num_params(&gc, ntp);
    // A tensor-parallel shard's sets hold its parts (the evaluation's too).
    dt_gpt_acts_params ap = {B, T, 0, c->n_layer, ntp, c->recompute, ntp > 1 && c->sequence, 0};
    n->act = dt_gpt_activation_bytes(&gc, &ap);
    if (use == DT_MEM_TRAIN && c->pipeline > 1) {  // its evaluation's set is forward-only (the default set unused)
        dt_gpt_acts_params fw = ap;
        fw.recompute = 0;
        fw.forward_only = 1;
        n->act = n->act - dt_gpt_acts_size(&gc, &ap) + dt_gpt_acts_size(&gc, &fw);
    }
    if (use == DT_MEM_TRAIN) n->act = sat_add(n->act, stage_sets(c, &gc, &ap));
    if (on_device(c, use)) n->act = 0;
    if (use != DT_MEM_SAMPLE) n->act = sat_add(n->act, 2 * sizeof(int32_t) * (size_t)c->batch * T);  // the global batch
    if (use == DT_MEM_SAMPLE) {
        snprintf(n->field, sizeof n->field, "model.block_size");
        snprintf(n->value, sizeof n->value, " = %d", c->block_size);
    } else {
        snprintf(n->field, sizeof n->field, "train.batch or train.seq_len");
        snprintf(n->value, sizeof n->value, " (%d x %d)", c->batch, T);
    }
    snprintf(n->act_what, sizeof n->act_what, "activations for %d x %d tokens", B, T);
    // Parameters and gradients, the optimizer's state, and a weights file
    // while it loads.
    n->np = np;
    n->np_whole = dt_gpt_config_num_params(&gc);
    n->model = use == DT_MEM_TRAIN ? dt_memory_model_state(c, use, held_params(c, &gc, ntp, np, W), n->zero, W, NULL)
                                   : sizeof(float) * np * 3;
    if (use == DT_MEM_TRAIN && np != held_params(c, &gc, ntp, np, W))  // evaluation: a block, the embedding, the head
        n->model = sat_add(n->model, sizeof(float) * held_params(c, &gc, ntp, 0, W));
    dt_tensor_info t[16];
    dt_gpt_param_shapes(&gc, t);
    size_t big = 0;
    for (int i = 0; i < 16; i++) big = t[i].numel > big ? t[i].numel : big;
    int parts = np != held_params(c, &gc, ntp, np, W);
    n->ckpt = max_size(read_need(c, use),
                       use == DT_MEM_TRAIN ? ckpt_need(c, dt_gpt_config_num_params(&gc), big, W, parts, 0) : 0);
    if (use == DT_MEM_TRAIN && unstaged(c, W, parts))
        n->ckpt_pieces = max_size(read_need(c, use), ckpt_need(c, dt_gpt_config_num_params(&gc), big, W, parts, 1));
    // ZeRO-3 gathers a block's parameters at a time, all but the rank's own
    // slice of it: the one running, the next one prefetched and the last
    // one kept for backward, and the gradients of two blocks in flight to
    // their owners. With the pages kept (dt_memory_zero_held), stage 1's
    // model state, and the gathers go through a pack buffer of a whole
    // block (its 12 tensors are not side by side in the block: one gather
    // a block, engine/strategies/zero.c).
    // The embedding and the head (wte, wpe, lnf) are gathered whole for the
    // step, and their gradients are whole until the step's reduction: on
    // a rank whose slice holds none of them (the worst), twice their bytes.
    size_t C = (size_t)c->n_embd, block = sizeof(float) * (12 * C * C + 13 * C) / (size_t)W * (size_t)(W - 1);
    size_t ends = sizeof(float) * (t[0].numel + t[1].numel + 2 * C);
    if (use == DT_MEM_TRAIN && n->zero >= 3 && W > 1) n->model = sat_add(n->model, 5 * block + 2 * ends);
    if (use == DT_MEM_TRAIN && c->zero >= 3 && n->zero < 3 && W > 1 && ntp == 1)
        n->model = sat_add(n->model, sizeof(float) * (12 * C * C + 13 * C));
    // Token files are read into memory whole; the training file's shard
    // alone where it is read sharded (dt_config_data_sharded).
    const char *val = c->val_file[0] ? c->val_file : c->train_file;
    size_t train = file_size(c->train_file);
    if (dt_config_data_sharded(c) && W > 1) train = train / (size_t)W + 1;
    n->data = use == DT_MEM_SAMPLE ? 0 : use == DT_MEM_EVAL ? file_size(val) : train + file_size(c->val_file);
    snprintf(n->data_what, sizeof n->data_what, "[data] %s = %s",
             use == DT_MEM_EVAL && !c->val_file[0] ? "train_file" : use == DT_MEM_EVAL ? "val_file" : "train_file",
             use == DT_MEM_EVAL ? val : c->train_file);
    if (c->arch == DT_ARCH_LLAMA) llama_needs(c, use, W, B, T, n);
    staging(c, n);
}

// The recommender (docs/recommender.md): its MLPs, and the tables where
// the worker holds them (in the block: weights, gradients and the
// optimizer's state), or with the tables on the parameter servers a
// batch's rows alone (the looked-up values and their gradients); the
// click logs read whole.
static void recsys_needs(const dt_config *c, dt_mem_use use, int W, need_t *n) {
    const dt_dlrm_spec *d = &c->dlrm;
    size_t mlp = dt_dlrm_mlp_params(d), tables = (size_t)dt_dlrm_total_rows(d) * (size_t)d->dim;
    int remote = (c->ps_servers > 0 && c->rs_sparse) || dt_tables_on_workers(c);
    n->np = n->np_whole = remote ? mlp : mlp + tables;
    n->model = use == DT_MEM_TRAIN ? dt_memory_model_state(c, use, n->np, n->zero, W, NULL) : sizeof(float) * n->np;
    if (use == DT_MEM_TRAIN && dt_tables_on_workers(c) && !c->offload)  // its shard of the tables, and its snapshot
        n->model = sat_add(n->model, dt_rows_shard_bytes((dt_dlrm_total_rows(d) + W - 1) / W, d->dim,
                                                         c->rs_table_optim == 0, c->ckpt_every_steps > 0 ||
                                                                                     c->ckpt_every_seconds > 0));
    int B = c->batch > c->eval_batch ? c->batch : c->eval_batch, wide = dt_dlrm_interaction_size(d);
    for (int i = 0; i < d->nbottom; i++) wide += d->bottom[i];
    for (int i = 0; i < d->ntop; i++) wide += d->top[i];
    size_t per = sizeof(float) * ((size_t)wide + 4 * (size_t)d->ntables * d->dim + d->ndense + 8) + 16 * (size_t)d->ntables;
    n->rows = B;
    n->act = per * (size_t)B;
    snprintf(n->field, sizeof n->field, "train.batch or train.eval_batch");
    snprintf(n->value, sizeof n->value, " (%d)", B);
    snprintf(n->act_what, sizeof n->act_what, "activations and looked-up rows for %d records", B);
    n->data = file_size(c->rs_train) + file_size(c->rs_test);
    snprintf(n->data_what, sizeof n->data_what, "the click logs [recsys] train = %.250s and test = %.250s", c->rs_train,
             c->rs_test);
}

// zero: the stage whose model state counts (the config's, or the one a
// rank holds: dt_memory_zero_held).
static dt_status model_needs_at(const dt_config *c, dt_mem_use use, int W, int zero, need_t *n) {
    n->zero = zero;
    if (c->recsys) return recsys_needs(c, use, W, n), DT_OK;
    if (c->gpt) return gpt_needs(c, use, W, n), DT_OK;
    return classifier_needs(c, use, W, n);
}

static dt_status model_needs(const dt_config *c, dt_mem_use use, int W, need_t *n) {
    return model_needs_at(c, use, W, c->zero, n);
}

// The machine's room (dt_mem_machine) at this process's first look, so
// that its choices below stay the same for the run.
static size_t machine_room(void) {
    static size_t m;
    if (!m) m = dt_mem_machine(NULL);
    return m;
}

int dt_memory_zero_held(const dt_config *c, int W) {
    if (c->zero < 2 || W < 2 || c->offload || c->zero_release || c->tensor > 1 || c->pipeline > 1) return c->zero;
    need_t n;
    memset(&n, 0, sizeof n);
    if (model_needs_at(c, DT_MEM_TRAIN, W, 1, &n) != DT_OK) return c->zero;
    size_t per = sat_add(sat_add(sat_add(n.act, n.model), sat_add(n.data, n.ckpt)), baseline()), lim = dt_mem_limit(NULL);
    // (all W workers counted on this machine: a local launch's are; under
    // mpirun, fewer may share it, and this errs towards giving back)
    return (!lim || per <= lim / 2) && sat_mul(per, (size_t)W) <= machine_room() / 2 ? 1 : c->zero;
}

size_t dt_memory_worker(const dt_config *c, int W, dt_memory_need *k) {
    need_t n;
    memset(&n, 0, sizeof n);
    if (model_needs_at(c, DT_MEM_TRAIN, W, dt_memory_zero_held(c, W), &n) != DT_OK) return 0;
    dt_memory_need m = {n.act, n.model, n.ckpt, n.data, baseline(), 0, n.pieces};
    m.total = sat_add(sat_add(sat_add(m.activations, m.model), sat_add(m.data, m.checkpoints)), m.program);
    if (k) *k = m;
    return m.total;
}

int dt_memory_ckpt_pieces(const dt_config *c, int W) {
    need_t n;
    memset(&n, 0, sizeof n);
    if (model_needs(c, DT_MEM_TRAIN, W, &n) != DT_OK) return c->ckpt_staging == DT_STAGING_PIECES;
    return n.pieces;
}

size_t dt_memory_activations(const dt_config *c, int W) {
    need_t n;
    memset(&n, 0, sizeof n);
    if (model_needs(c, DT_MEM_TRAIN, W, &n) != DT_OK) return 0;
    return n.act;
}

// Workers of a local launch (dtrain train --workers N, dtrain run) share the
// machine; under mpirun or srun each rank counts alone. --memory-limit is
// every worker's own (dt_mem_cap enforces it).
static int local_workers(void) {
    const char *shm = getenv("DTRAIN_SHM_NAME"), *w = getenv("DTRAIN_WORLD_SIZE");
    int n = shm && w ? atoi(w) : 1;
    return n > 0 ? n : 1;
}

// What a worker may use: `lim` its own (--memory-limit; SIZE_MAX: none),
// `machine` shared by `count` workers (MemAvailable, the memory cgroup).
typedef struct {
    size_t lim, machine;
    int count;
} room_t;

static int fits(const room_t *r, size_t per, int count) {
    return per <= r->lim && sat_mul(per, (size_t)count) <= r->machine;
}

// The smallest ZeRO stage above the config's that fits on W workers, else
// the fewest workers (up to the batch) at which the highest stage fits,
// each bringing its own --memory-limit (local workers also sharing the
// machine); into out as ", or ...", or nothing.
static void suggest_zero(const dt_config *c, int W, const need_t *n, const room_t *r, int local, char *out,
                         size_t len) {
    enum { TOP = 3 };  // the highest stage there is
    size_t rest = sat_add(sat_add(n->act, n->data), n->self);
    char b[64];
    for (int z = c->zero + 1; z <= TOP; z++) {
        size_t per = sat_add(rest, dt_memory_model_state(c, DT_MEM_TRAIN, n->np, z, W, NULL));
        if (fits(r, per, r->count)) {
            snprintf(out, len, ", or shard the state: [parallel] zero = %d (--zero %d) needs %s a worker", z, z,
                     dt_mem_format(per, b, sizeof b));
            return;
        }
    }
    for (int w = W + 1; w <= c->batch && w <= 4096; w++) {
        size_t per = sat_add(rest, dt_memory_model_state(c, DT_MEM_TRAIN, n->np, TOP, w, NULL));
        if (fits(r, per, local ? w : 1)) {
            snprintf(out, len, ", or shard the state over more workers: [parallel] zero = %d on %d workers needs %s a worker",
                     TOP, w, dt_mem_format(per, b, sizeof b));
            return;
        }
    }
}

dt_status dt_check_offload(const dt_config *c) {
    if (!c->offload) return DT_OK;
    const char *d = c->offload_dir;
    struct stat sb;
    if (!d[0]) return dt_error(DT_ERR_CONFIG, "[parallel] offload = disk needs [parallel] offload_dir, a directory on local disk");
    if (stat(d, &sb) != 0) return dt_error(DT_ERR_CONFIG, "[parallel] offload_dir %s: %s", d, strerror(errno));
    if (!S_ISDIR(sb.st_mode)) return dt_error(DT_ERR_CONFIG, "[parallel] offload_dir %s: not a directory", d);
    char probe[1100];
    snprintf(probe, sizeof probe, "%s/.dtrain-probe-XXXXXX", d);
    int fd = mkstemp(probe);
    if (fd < 0) return dt_error(DT_ERR_CONFIG, "[parallel] offload_dir %s: not writable: %s", d, strerror(errno));
    close(fd);
    unlink(probe);
    return DT_OK;
}

// Room on the offload directory's file system for the offloaded state of
// `count` workers.
static dt_status check_disk(const dt_config *c, const need_t *n, int W, int count) {
    dt_memory_kinds k;
    dt_memory_model_state(c, DT_MEM_TRAIN, n->np, c->zero, W, &k);
    struct statvfs vf;
    if (statvfs(c->offload_dir, &vf) != 0)
        return dt_error(DT_ERR_IO, "[parallel] offload_dir %s: %s", c->offload_dir, strerror(errno));
    size_t free_b = sat_mul((size_t)vf.f_bavail, (size_t)vf.f_frsize), need = sat_mul(k.offloaded, (size_t)count);
    char a[64], b[64];
    if (need > free_b)
        return dt_error(DT_ERR_IO, "[parallel] offload_dir %s: the offloaded state needs %s (%zu bytes)%s, but its file system has %s free",
                        c->offload_dir, dt_mem_format(need, a, sizeof a), need, count > 1 ? " for all workers" : "",
                        dt_mem_format(free_b, b, sizeof b));
    return DT_OK;
}

// The checkpoints a run writes that are on disk at once: keep of them and
// the one being written, fewer where the run saves fewer (every
// every_steps up to max_steps, and at its end); those already in dir count
// as written.
static size_t ckpts_at_once(const dt_config *c, const char *dir) {
    if (c->ckpt_every_steps <= 0 && c->ckpt_every_seconds <= 0) return 0;
    size_t n = (size_t)c->ckpt_keep + 1;  // (keep >= 1: the config's range)
    if (c->ckpt_every_seconds <= 0 && c->max_steps > 0) {
        size_t saves = (size_t)(c->max_steps / c->ckpt_every_steps) + (c->max_steps % c->ckpt_every_steps != 0);
        n = saves < n ? saves : n;
    }
    char **paths;
    int have = 0;
    if (dt_ckpt_list(dir, &paths, &have) == DT_OK) {
        for (int i = 0; i < have; i++) free(paths[i]);
        free(paths);
    }
    return n > (size_t)have ? n - (size_t)have : 0;
}

dt_status dt_check_disk(const dt_config *c, const char *run_dir) {
    need_t n;
    memset(&n, 0, sizeof n);
    if (model_needs(c, DT_MEM_TRAIN, 1, &n) != DT_OK) return DT_OK;  // (the workers report it in full)
    char dir[4200];
    dt_config_ckpt_dir(c, run_dir, dir, sizeof dir);
    // (checkpoints in object storage take no room here)
    size_t F = sizeof(float), ck = sat_mul(F * (size_t)(1 + optim_states(c)), n.np_whole),
           k = dt_path_remote(dir) ? 0 : ckpts_at_once(c, dir);
    if (c->recsys && c->rs_sparse && (c->ps_servers > 0 || dt_tables_on_workers(c)))  // the tables' shards go in them too
        ck = sat_add(ck, dt_rows_shard_bytes(dt_dlrm_total_rows(&c->dlrm), c->dlrm.dim, c->rs_table_optim == 0, 0));
    size_t need = sat_add(sat_mul(ck, k), F * n.np_whole);  // (and the weights file at the end)
    struct statvfs vf;
    const char *at = access(dir, F_OK) == 0 ? dir : run_dir;
    if (statvfs(at, &vf) != 0 && statvfs(".", &vf) != 0) return DT_OK;  // (not made yet: its parent's, or the work dir's)
    size_t free_b = sat_mul((size_t)vf.f_bavail, (size_t)vf.f_frsize);
    if (need <= free_b) return DT_OK;
    char a[64], b[64], w[64], f[64];
    return dt_error(DT_ERR_IO, "not enough disk for the run directory %s: %zu checkpoint%s of %s each ([checkpoint] "
                    "keep = %d, and the one being written) and the weights file of %s need %s, but its file system "
                    "has %s free; lower [checkpoint] keep or every_steps, or choose another --run-dir",
                    run_dir, k, k == 1 ? "" : "s", dt_mem_format(ck, a, sizeof a), c->ckpt_keep,
                    dt_mem_format(F * n.np_whole, w, sizeof w), dt_mem_format(need, b, sizeof b),
                    dt_mem_format(free_b, f, sizeof f));
}

// ---- the parameter servers holding the recommender's tables ----------------

// The bytes of the largest shard of the tables among S servers (rows and
// AdaGrad's sums), into *rows its row count.
static size_t shard_bytes(const dt_config *c, int S, int64_t *rows) {
    int64_t R = dt_dlrm_total_rows(&c->dlrm);
    *rows = (R + S - 1) / S;  // (dt_shard_range's largest)
    return dt_rows_shard_bytes(*rows, c->dlrm.dim, c->rs_table_optim == 0, 0);
}

// A server's memory with S servers and W workers: its shard of the tables
// (none in memory with offload = disk), its range of the MLPs' block
// (weights, summed gradient, optimizer state, a push buffer a worker) and
// the program.
static size_t server_bytes(const dt_config *c, int S, int W) {
    int64_t rows;
    size_t tab = c->offload ? 0 : shard_bytes(c, S, &rows), mlp = dt_dlrm_mlp_params(&c->dlrm);
    size_t range = (mlp + (size_t)S - 1) / (size_t)S;
    return sat_add(sat_add(tab, sizeof(float) * range * (size_t)(2 + W + optim_states(c))), baseline());
}

// Before the start, with the tables on the servers: each of the S servers
// against its own limit, and the S servers and W workers (each needing
// `worker`) against the machine; with offload = disk, their shards
// against the offload directory's file system. Refused naming the bytes,
// and the number of servers that would fit, or offload.
static dt_status check_servers(const dt_config *c, int W, size_t worker, const room_t *r) {
    int S = c->ps_servers;
    int64_t rows;
    size_t tab = shard_bytes(c, S, &rows), per = server_bytes(c, S, W);
    char a[64], b[64], d[64], t[64], more[256] = "";
    if (c->offload) {
        struct statvfs vf;
        size_t all = sat_mul(tab, (size_t)S), free_b = 0;
        if (statvfs(c->offload_dir, &vf) == 0) free_b = sat_mul((size_t)vf.f_bavail, (size_t)vf.f_frsize);
        if (all > free_b)
            return dt_error(DT_ERR_IO, "[parallel] offload_dir %s: the %d servers' shards of the tables need %s (%zu "
                            "bytes), but its file system has %s free", c->offload_dir, S,
                            dt_mem_format(all, a, sizeof a), all, dt_mem_format(free_b, b, sizeof b));
    }
    int on_lim = per > r->lim;
    if (!on_lim && sat_add(sat_mul(per, (size_t)S), sat_mul(worker, (size_t)W)) <= r->machine) return DT_OK;
    for (int s = S + 1; on_lim && s <= 4096; s++) {  // what would fit: more servers, each a smaller shard
        size_t p = server_bytes(c, s, W);
        if (p <= r->lim && sat_add(sat_mul(p, (size_t)s), sat_mul(worker, (size_t)W)) <= r->machine) {
            snprintf(more, sizeof more, "%d servers would fit (%s each), or ", s, dt_mem_format(p, d, sizeof d));
            break;
        }
    }
    size_t avail = on_lim ? r->lim : r->machine;
    return dt_error(DT_ERR_NOMEM, "not enough memory for the %d parameter server%s: a server holds up to %lld rows of the "
                    "tables (%d floats%s a row: %s) and its range of the MLPs, %s in all%s, but %s is available (%s); "
                    "%sset [parallel] offload = disk to keep the rows in files",
                    S, S > 1 ? "s" : "", (long long)rows, c->dlrm.dim, c->rs_table_optim == 0 ? " and an AdaGrad sum" : "",
                    dt_mem_format(tab, t, sizeof t), dt_mem_format(per, a, sizeof a),
                    on_lim ? "" : ", with the workers, on this machine", dt_mem_format(avail, b, sizeof b),
                    on_lim ? "--memory-limit, each process" : "the machine", more);
}

dt_status dt_check_memory(const dt_config *c, dt_mem_use use, int workers, int starting, int *model_rows) {
    need_t n;
    memset(&n, 0, sizeof n);
    int W = workers > 0 ? workers : 1;
    // Before the start: all W workers against the machine, each against its
    // limit. In a worker: its own need, against both.
    int count = starting ? W : 1, share = starting ? 1 : local_workers();
    dt_status mst = model_needs(c, use, W, &n);
    if (mst != DT_OK) return mst;
    if (model_rows) *model_rows = n.rows;
    if (use == DT_MEM_TRAIN && c->offload) {
        dt_status st = check_disk(c, &n, W, starting ? W : 1);
        if (st != DT_OK) return st;
    }
    // This process's own memory (program, libraries) comes on top; before the
    // start the launcher's stands for each worker's.
    n.self = baseline();
    size_t per = sat_add(sat_add(sat_add(n.act, n.model), sat_add(n.data, n.ckpt)), n.self);
    size_t total = sat_mul(per, (size_t)count);
    const char *src, *lname;
    size_t lim = dt_mem_limit(&lname);
    room_t room = {lim ? lim : SIZE_MAX, dt_mem_machine(&src), count};
    char srcbuf[256];
    size_t avail = room.machine;
    if (per > room.lim) {  // over its own limit (that cgroup, in a capped worker, is this limit too)
        snprintf(srcbuf, sizeof srcbuf, "%s, each worker", lname);
        avail = room.lim;
        src = srcbuf;
        total = per;
    } else if (count == 1 && share > 1) {
        snprintf(srcbuf, sizeof srcbuf, "%s, with %d workers on this machine", src, share);
        src = srcbuf;
    }
    if (fits(&room, per, count))
        return starting && use == DT_MEM_TRAIN && c->recsys && c->rs_sparse && c->ps_servers > 0
                   ? check_servers(c, W, per, &room)
                   : DT_OK;
    // Name what weighs most: the batch field, the model, or the data.
    char a[64], b[64], t[64], v[64], part[800], times[96] = "";
    const char *fix = n.field;
    if (n.act >= n.model && n.act >= n.data) {
        snprintf(part, sizeof part, "%s%s needs %s of %s", n.field, n.value, dt_mem_format(n.act, a, sizeof a),
                 n.act_what);
    } else if (n.model >= n.data) {
        snprintf(part, sizeof part, "the model's parameters, gradients and optimizer state need %s",
                 dt_mem_format(n.model, a, sizeof a));
        fix = "the [model] sizes";
    } else {
        snprintf(part, sizeof part, "%s needs %s", n.data_what, dt_mem_format(n.data, a, sizeof a));
        fix = "the data";
    }
    if (count > 1 && total > per) snprintf(times, sizeof times, ", x %d workers = %s", count, dt_mem_format(total, t, sizeof t));
    char zero[300] = "";
    if (use == DT_MEM_TRAIN) suggest_zero(c, W, &n, &room, starting || share > 1, zero, sizeof zero);
    return dt_error(DT_ERR_NOMEM,
                    "not enough memory: %s; in all a worker needs %s (activations %zu, model %zu, checkpoints %zu, data "
                    "%zu, the program %zu bytes)%s, but %s is available (%s). Lower %s%s%s",
                    part, dt_mem_format(per, b, sizeof b), n.act, n.model, n.ckpt, n.data, n.self, times,
                    dt_mem_format(avail, v, sizeof v), src, fix, count > 1 && per <= room.lim ? " or the number of workers" : "",
                    zero);
}
