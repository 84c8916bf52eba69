/* Run configs: INI text read with libinih, every key looked up in one field
 * table that also drives validation, defaults and dt_config_write(). */
#include "dtrain/config.h"
#include "dtrain/data.h"
#include "dtrain/llama.h"

#include <ctype.h>
#include <errno.h>
#include <ini.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

// ----------------------------------------------------------------------------
// numbers: the one reader of config values and command-line flags

// Checks that s is, whole, a decimal number; NULL if so, else what is
// wrong (dt_decimal_scan's rules). *digits: it is only digits (with a
// sign), so strtoull reads it exactly.
static const char *decimal_syntax(const char *s, int *digits) {
    const char *end, *why = dt_decimal_scan(s, &end, digits);
    return why ? why : *end ? "" : NULL;
}

// Formats the range "from LO to HI" of a message.
static void range_text(char *buf, size_t n, double lo, double hi) {
    snprintf(buf, n, "from %.15g to %.15g", lo, hi);
}

static dt_status parse_decimal(const char *what, const char *text, double lo, double hi, int whole, double *out,
                               int *digits) {
    char range[100];
    range_text(range, sizeof range, lo, hi);
    const char *kind = whole ? "a whole number" : "a number";
    if (!text || !*text) return dt_error(DT_ERR_CONFIG, "%s: expected %s %s, got nothing", what, kind, range);
    const char *why = decimal_syntax(text, digits);
    if (why)
        return dt_error(DT_ERR_CONFIG, "%s: expected %s %s in decimal (no hex, inf or nan), got '%s'%s", what,
                        kind, range, text, why);
    errno = 0;
    double v = strtod(text, NULL);
    if (errno == ERANGE || !isfinite(v))
        return dt_error(DT_ERR_CONFIG, "%s: expected %s %s, got '%s' (%s)", what, kind, range, text,
                        fabs(v) > 1 ? "too large for a double" : "too small for a double");
    if (whole && v != floor(v))
        return dt_error(DT_ERR_CONFIG, "%s: expected a whole number %s, got '%s'", what, range, text);
    if (!(v >= lo && v <= hi)) return dt_error(DT_ERR_CONFIG, "%s: expected %s %s, got '%s'", what, kind, range, text);
    *out = v;
    return DT_OK;
}

dt_status dt_parse_number(const char *what, const char *text, double lo, double hi, int whole, double *out) {
    int digits;
    return parse_decimal(what, text, lo, hi, whole, out, &digits);
}

dt_status dt_parse_u64(const char *what, const char *text, uint64_t max, uint64_t *out) {
    int digits = 0;
    double v = 0, hi = (double)max;  // rounds up for max near 2^64: the exact check below decides
    dt_status st = parse_decimal(what, text, 0, hi, 1, &v, &digits);
    if (st != DT_OK) return st;
    char range[100];
    range_text(range, sizeof range, 0, hi);
    errno = 0;
    unsigned long long u = digits ? strtoull(text, NULL, 10) : 0;
    if (digits ? errno == ERANGE || u > max : v >= 18446744073709551616.0 || (uint64_t)v > max)
        return dt_error(DT_ERR_CONFIG, "%s: expected a whole number %s, got '%s'", what, range, text);
    *out = digits ? (uint64_t)u : (uint64_t)v;
    return DT_OK;
}

// ----------------------------------------------------------------------------
// the field table

// The longest line inih reads (its buffer also holds "\r\n\0"). String
// values are limited so that dt_config_write's "key = value" fits too.
#define MAX_LINE_CHARS (INI_MAX_LINE - 3)

// F_NAME: a string that is one safe path component (the run name).
typedef enum { F_INT, F_I64, F_U64, F_FLOAT, F_BOOL, F_STR, F_NAME, F_ENUM } ftype;

typedef struct {
    const char *sec, *key;
    ftype type;
    size_t off, size;        // size: for F_STR, the buffer length
    double lo, hi;           // inclusive range for numbers
    const char *const *choices;  // F_ENUM: NULL-terminated names, stored as int index
} field;

static const char *const optim_names[] = {"sgd", "adamw", NULL};
static const char *const sched_names[] = {"constant", "cosine", "linear", NULL};
static const char *const dataset_names[] = {"fashion-mnist", "tokens", "hdf5", NULL};
static const char *const sampler_names[] = {"shuffled", "balanced", NULL};
static const char *const lr_scaling_names[] = {"none", "linear", NULL};
static const char *const pipeline_schedule_names[] = {"gpipe", "1f1b", "interleaved", NULL};
static const char *const pipeline_balance_names[] = {"measured", "flops", "count", NULL};  // dt_pipeline_balance_kind
static const char *const offload_names[] = {"none", "disk", NULL};
static const char *const zero_release_names[] = {"auto", "always", NULL};
static const char *const comp_names[] = {"none", "fp16", "bf16", "int8", "qsgd", "sign", "topk", "randomk", "powersgd", NULL};
static const char *const staging_names[] = {"auto", "slice", "pieces", NULL};  // dt_staging
static const char *const partition_names[] = {"iid", "shards", "dirichlet", NULL};
static const char *const fed_algorithm_names[] = {"fedavg", "fedavgm", "fedadam", NULL};
static const char *const ps_mode_names[] = {"sync", "async", "ssp", "backup", NULL};
static const char *const aggregator_names[] = {"mean", "median", "trimmed", "krum", "clip", NULL};  // dt_agg_kind
static const char *const ps_share_names[] = {"fixed", "dynamic", NULL};
static const char *const precision_names[] = {"fp32", "fp16", "bf16", NULL};  // index = dt_dtype
static const char *const attention_names[] = {"auto", "fused", "gemm", NULL};  // index = dt_att_choice
static const char *const grad_dtype_names[] = {"fp32", "bf16", NULL};
static const char *const recompute_names[] = {"none", "blocks", NULL};
static const char *const arch_names[] = {"gpt", "llama", NULL};  // dt_arch
static const char *const table_optim_names[] = {"adagrad", "sgd", NULL};
static const char *const placement_names[] = {"range", "hash", NULL};
static const char *const shard_names[] = {"servers", "workers", NULL};
static const char *const data_shard_names[] = {"auto", "none", "ranks", NULL};  // DT_DATA_SHARD_*

#define O(f) offsetof(dt_config, f), sizeof(((dt_config *)0)->f)
static const field fields[] = {
    {"run", "name", F_NAME, O(name), 0, 0, NULL},
    {"model", "preset", F_STR, O(preset), 0, 0, NULL},
    {"model", "width", F_INT, O(width), 0, 4096, NULL},
    {"model", "sync_bn", F_BOOL, O(sync_bn), 0, 1, NULL},
    {"data", "dataset", F_ENUM, O(dataset), 0, 0, dataset_names},
    {"data", "dir", F_STR, O(data_dir), 0, 0, NULL},
    {"data", "mean", F_FLOAT, O(mean), -1e6, 1e6, NULL},
    {"data", "std", F_FLOAT, O(std), 1e-9, 1e6, NULL},
    {"data", "shuffle", F_BOOL, O(shuffle), 0, 1, NULL},
    {"data", "prefetch", F_BOOL, O(prefetch), 0, 1, NULL},
    {"data", "drop_last", F_BOOL, O(drop_last), 0, 1, NULL},
    {"data", "sampler", F_ENUM, O(sampler), 0, 0, sampler_names},
    {"data", "augment", F_STR, O(augment), 0, 0, NULL},
    {"data", "crop_pad", F_INT, O(crop_pad), 0, 1024, NULL},
    {"data", "loader_threads", F_INT, O(loader_threads), 1, 256, NULL},
    {"data", "cache", F_BOOL, O(cache), 0, 1, NULL},
    {"data", "shard", F_ENUM, O(data_shard), 0, 0, data_shard_names},
    {"data", "file", F_STR, O(data_file), 0, 0, NULL},
    {"data", "train_images", F_STR, O(h5_names[0]), 0, 0, NULL},
    {"data", "train_labels", F_STR, O(h5_names[1]), 0, 0, NULL},
    {"data", "test_images", F_STR, O(h5_names[2]), 0, 0, NULL},
    {"data", "test_labels", F_STR, O(h5_names[3]), 0, 0, NULL},
    {"train", "dynamic_batch", F_BOOL, O(dynamic_batch), 0, 1, NULL},
    {"train", "time_layers", F_BOOL, O(time_layers), 0, 1, NULL},
    {"optim", "name", F_ENUM, O(optim.kind), 0, 0, optim_names},
    {"optim", "lr", F_FLOAT, O(optim.lr), 1e-12, 1e3, NULL},
    {"optim", "momentum", F_FLOAT, O(optim.momentum), 0, 0.999999, NULL},
    {"optim", "nesterov", F_BOOL, O(optim.nesterov), 0, 1, NULL},
    {"optim", "weight_decay", F_FLOAT, O(optim.weight_decay), 0, 10, NULL},
    {"optim", "beta1", F_FLOAT, O(optim.beta1), 0, 0.999999, NULL},
    {"optim", "beta2", F_FLOAT, O(optim.beta2), 0, 0.999999999, NULL},
    {"optim", "eps", F_FLOAT, O(optim.eps), 1e-30, 1, NULL},
    {"optim", "clip_norm", F_FLOAT, O(optim.clip_norm), 0, 1e9, NULL},
    {"optim", "lr_scaling", F_ENUM, O(lr_scaling), 0, 0, lr_scaling_names},
    {"optim", "base_batch", F_INT, O(base_batch), 1, 1 << 24, NULL},
    {"schedule", "name", F_ENUM, O(sched), 0, 0, sched_names},
    {"schedule", "warmup_steps", F_I64, O(warmup_steps), 0, 1e15, NULL},
    {"schedule", "min_lr", F_FLOAT, O(min_lr), 0, 1e3, NULL},
    {"train", "batch", F_INT, O(batch), 1, 1 << 20, NULL},
    {"train", "eval_batch", F_INT, O(eval_batch), 1, 1 << 20, NULL},
    {"train", "epochs", F_INT, O(epochs), 0, 1e6, NULL},
    {"train", "max_steps", F_I64, O(max_steps), 0, 1e15, NULL},
    {"train", "seed", F_U64, O(seed), 0, (double)UINT64_MAX, NULL},
    {"train", "threads", F_INT, O(threads), 0, 4096, NULL},
    {"train", "log_every", F_INT, O(log_every), 1, 1e9, NULL},
    {"train", "grad_accum", F_INT, O(grad_accum), 1, 1 << 16, NULL},
    {"train", "precision", F_ENUM, O(precision), 0, 0, precision_names},
    {"train", "device", F_STR, O(device), 0, 0, NULL},
    {"train", "tf32", F_BOOL, O(tf32), 0, 1, NULL},
    {"train", "cuda_graph", F_BOOL, O(cuda_graph), 0, 1, NULL},
    {"train", "attention", F_ENUM, O(attention), 0, 0, attention_names},
    {"parallel", "bucket_kb", F_INT, O(bucket_kb), 4, 1 << 22, NULL},
    {"parallel", "deterministic", F_BOOL, O(deterministic), 0, 1, NULL},
    {"parallel", "micro_shards", F_INT, O(micro_shards), 1, 1 << 16, NULL},
    {"parallel", "pipeline", F_INT, O(pipeline), 1, 1024, NULL},
    {"parallel", "tensor", F_INT, O(tensor), 1, 1024, NULL},
    {"parallel", "sequence", F_BOOL, O(sequence), 0, 1, NULL},
    {"parallel", "virtual_stages", F_INT, O(virtual_stages), 1, 1024, NULL},
    {"parallel", "micro_batches", F_INT, O(micro_batches), 0, 1 << 16, NULL},
    {"parallel", "schedule", F_ENUM, O(pipeline_schedule), 0, 0, pipeline_schedule_names},
    {"parallel", "pipeline_split", F_STR, O(pipeline_split), 0, 0, NULL},
    {"parallel", "pipeline_balance", F_ENUM, O(pipeline_balance), 0, 0, pipeline_balance_names},
    {"parallel", "zero", F_INT, O(zero), 0, 3, NULL},
    {"parallel", "zero_release", F_ENUM, O(zero_release), 0, 0, zero_release_names},
    {"parallel", "offload", F_ENUM, O(offload), 0, 0, offload_names},
    {"parallel", "offload_dir", F_STR, O(offload_dir), 0, 0, NULL},
    {"parallel", "sync_every", F_INT, O(sync_every), 0, 1e9, NULL},
    {"parallel", "sync_warmup", F_I64, O(sync_warmup), 0, 1e15, NULL},
    {"parallel", "servers", F_INT, O(ps_servers), 0, 1024, NULL},
    {"ps", "mode", F_ENUM, O(ps_mode), 0, 0, ps_mode_names},
    {"ps", "staleness", F_INT, O(ps_staleness), 0, 1e6, NULL},
    {"ps", "backup_workers", F_INT, O(ps_backup), 0, 1024, NULL},
    {"ps", "staleness_lr", F_BOOL, O(ps_staleness_lr), 0, 1, NULL},
    {"ps", "groups", F_INT, O(ps_groups), 0, 1024, NULL},
    {"ps", "share", F_ENUM, O(ps_share), 0, 0, ps_share_names},
    {"ps", "aggregator", F_ENUM, O(ps_robust.kind), 0, 0, aggregator_names},
    {"ps", "trim", F_FLOAT, O(ps_robust.trim), 0, 0.5, NULL},
    {"ps", "krum_f", F_INT, O(ps_robust.krum_f), 0, 1e6, NULL},
    {"ps", "krum_m", F_INT, O(ps_robust.krum_m), 1, 1e6, NULL},
    {"ps", "clip_bound", F_FLOAT, O(ps_robust.clip), 0, 1e9, NULL},
    {"ps", "outlier", F_FLOAT, O(ps_robust.outlier), 0, 1e9, NULL},
    {"parallel", "grad_dtype", F_ENUM, O(grad_dtype), 0, 0, grad_dtype_names},
    {"federated", "clients", F_INT, O(fed_clients), 1, 1e6, NULL},
    {"federated", "fraction", F_FLOAT, O(fed_fraction), 1e-6, 1, NULL},
    {"federated", "rounds", F_INT, O(fed_rounds), 1, 1e7, NULL},
    {"federated", "local_epochs", F_INT, O(fed_local_epochs), 1, 1e4, NULL},
    {"federated", "local_batch", F_INT, O(fed_local_batch), 1, 1 << 20, NULL},
    {"federated", "partition", F_ENUM, O(fed_partition), 0, 0, partition_names},
    {"federated", "alpha", F_FLOAT, O(fed_alpha), 1e-4, 1e6, NULL},
    {"federated", "shards", F_INT, O(fed_shards), 1, 1e4, NULL},
    {"federated", "algorithm", F_ENUM, O(fed_algorithm), 0, 0, fed_algorithm_names},
    {"federated", "server_lr", F_FLOAT, O(fed_server_lr), 1e-9, 1e3, NULL},
    {"federated", "server_momentum", F_FLOAT, O(fed_server_momentum), 0, 0.999999, NULL},
    {"federated", "server_beta1", F_FLOAT, O(fed_server_beta1), 0, 0.999999, NULL},
    {"federated", "server_beta2", F_FLOAT, O(fed_server_beta2), 0, 0.999999999, NULL},
    {"federated", "server_eps", F_FLOAT, O(fed_server_eps), 1e-12, 10, NULL},
    {"federated", "mu", F_FLOAT, O(fed_mu), 0, 1e3, NULL},
    {"federated", "min_clients", F_INT, O(fed_min_clients), 1, 1e6, NULL},
    {"federated", "deadline", F_FLOAT, O(fed_deadline), 0, 1e9, NULL},
    {"federated", "secure", F_BOOL, O(fed_secure), 0, 1, NULL},
    {"federated", "aggregator", F_ENUM, O(fed_robust.kind), 0, 0, aggregator_names},
    {"federated", "trim", F_FLOAT, O(fed_robust.trim), 0, 0.5, NULL},
    {"federated", "krum_f", F_INT, O(fed_robust.krum_f), 0, 1e6, NULL},
    {"federated", "krum_m", F_INT, O(fed_robust.krum_m), 1, 1e6, NULL},
    {"federated", "clip_bound", F_FLOAT, O(fed_robust.clip), 0, 1e9, NULL},
    {"federated", "outlier", F_FLOAT, O(fed_robust.outlier), 0, 1e9, NULL},
    {"federated", "dp_clip", F_FLOAT, O(fed_dp_clip), 0, 1e9, NULL},
    {"federated", "dp_noise", F_FLOAT, O(fed_dp_noise), 0, 1e6, NULL},
    {"federated", "dp_epsilon", F_FLOAT, O(fed_dp_epsilon), 0, 1e6, NULL},
    {"federated", "dp_delta", F_FLOAT, O(fed_dp_delta), 1e-30, 0.5, NULL},
    {"train", "straggler_margin", F_FLOAT, O(straggler_margin), 0.01, 100, NULL},
    {"train", "straggler_steps", F_INT, O(straggler_steps), 0, 1e9, NULL},
    {"obs", "metrics_port", F_INT, O(metrics_port), 0, 65535, NULL},
    {"obs", "metrics_addr", F_STR, O(metrics_addr), 0, 0, NULL},
    {"obs", "trace", F_STR, O(trace), 0, 0, NULL},
    {"checkpoint", "every_steps", F_I64, O(ckpt_every_steps), 0, 1e15, NULL},
    {"checkpoint", "every_seconds", F_FLOAT, O(ckpt_every_seconds), 0, 1e9, NULL},
    {"checkpoint", "keep", F_INT, O(ckpt_keep), 1, 1e6, NULL},
    {"checkpoint", "sharded", F_BOOL, O(ckpt_sharded), 0, 1, NULL},
    {"checkpoint", "staging", F_ENUM, O(ckpt_staging), 0, 0, staging_names},
    {"checkpoint", "allow_changes", F_BOOL, O(ckpt_allow_changes), 0, 1, NULL},
    {"checkpoint", "resume", F_STR, O(resume), 0, 0, NULL},
    {"checkpoint", "dir", F_STR, O(ckpt_dir), 0, 0, NULL},
    {"s3", "endpoint", F_STR, O(s3_endpoint), 0, 0, NULL},
    {"s3", "region", F_STR, O(s3_region), 0, 0, NULL},
    {"compression", "method", F_ENUM, O(comp_method), 0, 0, comp_names},
    {"compression", "ratio", F_FLOAT, O(comp_ratio), 1e-6, 1, NULL},
    {"compression", "levels", F_INT, O(comp_levels), 1, 127, NULL},
    {"compression", "rank", F_INT, O(comp_rank), 1, 1024, NULL},
    {"compression", "error_feedback", F_BOOL, O(comp_error_feedback), 0, 1, NULL},
    {"compression", "warmup_steps", F_I64, O(comp_warmup_steps), 0, 1e15, NULL},
    {"compression", "momentum", F_FLOAT, O(comp_momentum), 0, 0.999999, NULL},
    {"compression", "clip_norm", F_FLOAT, O(comp_clip_norm), 0, 1e9, NULL},
    {"compression", "min_bytes", F_INT, O(comp_min_bytes), 0, 1 << 30, NULL},
    // ---- the recommender's (docs/recommender.md), written out for preset dlrm alone ----
    {"recsys", "tables", F_STR, O(rs_tables), 0, 0, NULL},
    {"recsys", "dim", F_INT, O(dlrm.dim), 1, 4096, NULL},
    {"recsys", "dense", F_INT, O(dlrm.ndense), 0, 4096, NULL},
    {"recsys", "bottom", F_STR, O(rs_bottom), 0, 0, NULL},
    {"recsys", "top", F_STR, O(rs_top), 0, 0, NULL},
    {"recsys", "train", F_STR, O(rs_train), 0, 0, NULL},
    {"recsys", "test", F_STR, O(rs_test), 0, 0, NULL},
    {"recsys", "table_optim", F_ENUM, O(rs_table_optim), 0, 0, table_optim_names},
    {"recsys", "table_lr", F_FLOAT, O(rs_table_lr), 0, 1e6, NULL},
    {"recsys", "table_eps", F_FLOAT, O(rs_table_eps), 0, 1, NULL},
    {"recsys", "sparse", F_BOOL, O(rs_sparse), 0, 1, NULL},
    {"recsys", "placement", F_ENUM, O(rs_placement), 0, 0, placement_names},
    {"recsys", "shard", F_ENUM, O(rs_shard), 0, 0, shard_names},
    // ---- GPT fields (docs/gpt.md) ----
    {"model", "n_layer", F_INT, O(n_layer), 0, 1024, NULL},
    {"model", "n_head", F_INT, O(n_head), 0, 1024, NULL},
    {"model", "n_embd", F_INT, O(n_embd), 0, 65536, NULL},
    {"model", "block_size", F_INT, O(block_size), 0, 1 << 20, NULL},
    {"model", "vocab_size", F_INT, O(vocab_size), 0, 65536, NULL},
    {"model", "padded_vocab_size", F_INT, O(padded_vocab_size), 0, 1 << 20, NULL},
    {"data", "train_file", F_STR, O(train_file), 0, 0, NULL},
    {"data", "val_file", F_STR, O(val_file), 0, 0, NULL},
    {"train", "seq_len", F_INT, O(seq_len), 0, 1 << 20, NULL},
    {"train", "eval_every", F_INT, O(eval_every), 0, 1e9, NULL},
    {"train", "eval_batches", F_INT, O(eval_batches), 0, 1e6, NULL},
    {"model", "init_from", F_STR, O(init_from), 0, 0, NULL},
    {"train", "recompute", F_ENUM, O(recompute), 0, 0, recompute_names},
    {"model", "arch", F_ENUM, O(arch), 0, 0, arch_names},
    {"model", "n_kv_head", F_INT, O(n_kv_head), 0, 1024, NULL},
    {"model", "ffn_hidden", F_INT, O(ffn_hidden), 0, 1 << 20, NULL},
    {"model", "rope_theta", F_FLOAT, O(rope_theta), 0, 1e30, NULL},
    {"model", "norm_eps", F_FLOAT, O(norm_eps), 0, 1e30, NULL},
    // ---- end of GPT fields ----
};
#undef O
#define NFIELDS (int)(sizeof fields / sizeof fields[0])
#define NGPT_FIELDS 18  // the GPT block at the end of the table (with the Llama's)
static const field *const gpt_fields = &fields[NFIELDS - NGPT_FIELDS];

const char *dt_config_key_section(const char *key) {
    for (int i = 0; i < NFIELDS; i++)
        if (!strcmp(fields[i].key, key)) return fields[i].sec;
    return NULL;
}

const char *dt_comp_method_name(int method) {
    return method >= 0 && method <= DT_COMP_POWERSGD ? comp_names[method] : "?";
}

dt_gpt_config dt_config_gpt(const dt_config *c) {
    return (dt_gpt_config){c->n_layer, c->n_head, c->n_embd, c->block_size, c->vocab_size, c->padded_vocab_size};
}

dt_llama_config dt_config_llama(const dt_config *c) {
    return (dt_llama_config){c->n_layer, c->n_head, c->n_kv_head, c->n_embd, c->ffn_hidden, c->block_size,
                             c->vocab_size, c->rope_theta, c->norm_eps};
}

void dt_config_defaults(dt_config *c) {
    memset(c, 0, sizeof *c);
    snprintf(c->name, sizeof c->name, "run");
    c->input[0] = 1;
    c->input[1] = 28;
    c->input[2] = 28;
    snprintf(c->dataset, sizeof c->dataset, "fashion-mnist");
    snprintf(c->data_dir, sizeof c->data_dir, "/usr/share/datasets/fashion-mnist");
    // Fashion-MNIST's training-set pixel mean and standard deviation.
    c->mean = 0.2860f;
    c->std = 0.3530f;
    c->shuffle = 1;
    c->prefetch = 1;
    c->tf32 = 1;
    c->cuda_graph = 1;
    c->crop_pad = 4;
    c->loader_threads = 1;
    c->cache = 1;
    const char *h5[4] = {"train/images", "train/labels", "test/images", "test/labels"};
    for (int i = 0; i < 4; i++) snprintf(c->h5_names[i], sizeof c->h5_names[i], "%s", h5[i]);
    c->optim = dt_optim_default_params(DT_OPTIM_SGD);
    c->dlrm.dim = 16;
    c->dlrm.ndense = 4;
    snprintf(c->rs_bottom, sizeof c->rs_bottom, "32");
    snprintf(c->rs_top, sizeof c->rs_top, "32");
    c->rs_table_lr = 0.05f;
    c->rs_table_eps = 1e-8f;
    c->rs_sparse = 1;
    c->sched = DT_SCHED_CONSTANT;
    c->batch = 64;
    c->eval_batch = 1000;
    c->epochs = 1;
    c->seed = 1;
    c->log_every = 100;
    c->grad_accum = 1;
    c->base_batch = 256;
    c->bucket_kb = 2048;
    c->micro_shards = 12;
    c->pipeline = 1;
    c->tensor = 1;
    c->virtual_stages = 1;
    snprintf(c->device, sizeof c->device, "cpu");
    c->pipeline_schedule = 1;
    c->fed_clients = 100;
    c->fed_fraction = 0.1f;
    c->fed_rounds = 100;
    c->fed_local_epochs = 1;
    c->fed_local_batch = 10;
    c->fed_alpha = 0.5f;
    c->fed_shards = 2;
    c->fed_server_lr = 1.0f;
    c->fed_server_momentum = 0.9f;
    c->fed_server_beta1 = 0.9f;
    c->fed_server_beta2 = 0.99f;
    c->fed_server_eps = 1e-3f;
    c->fed_min_clients = 1;
    c->fed_dp_delta = 1e-5f;
    c->fed_robust = c->ps_robust = (dt_robust_params){.trim = 0.1f, .krum_f = 1, .krum_m = 1, .outlier = 10};
    c->straggler_margin = 0.2f;
    c->straggler_steps = 10;
    snprintf(c->metrics_addr, sizeof c->metrics_addr, "127.0.0.1");
    c->ckpt_keep = 3;
    c->comp_ratio = 0.01f;
    c->comp_levels = 7;
    c->comp_rank = 2;
    c->comp_error_feedback = 1;
}

// ----------------------------------------------------------------------------
// layers and presets

static const char *const preset_mlp[] = {"flatten", "linear out=1024", "relu", "linear out=1024",
                                         "relu", "linear out=10", NULL};
static const char *const preset_cnn[] = {
    "conv2d out=32 kernel=5 pad=2", "relu", "maxpool kernel=2", "conv2d out=64 kernel=5 pad=2",
    "relu", "maxpool kernel=2", "flatten", "linear out=1024", "relu", "dropout p=0.4",
    "linear out=10", NULL};

// ResNet-18 for small images (28x28): a 3x3 stride-1 stem without max
// pooling, four stages of two basic blocks of W, 2W, 4W, 8W channels
// ([model] width W, torchvision's 64 by default), global average pooling.
// "%k" is replaced by k x W.
static const char *const preset_resnet18[] = {
    "conv2d out=%1 kernel=3 pad=1 bias=false", "batchnorm", "relu", "block out=%1", "block out=%1",
    "block out=%2 stride=2", "block out=%2", "block out=%4 stride=2", "block out=%4", "block out=%8 stride=2",
    "block out=%8", "avgpool", "linear out=10", NULL};

static const struct {
    const char *name;
    const char *const *layers;
} presets[] = {{"mlp", preset_mlp}, {"cnn", preset_cnn}, {"resnet18", preset_resnet18}};
#define PRESET_NAMES "mlp, cnn or resnet18"

// A preset's layer line with "%k" replaced by k x width.
static void preset_line(const char *in, int width, char *out, size_t n) {
    size_t o = 0;
    for (const char *p = in; *p && o + 16 < n; p++) {
        if (*p == '%' && p[1] >= '1' && p[1] <= '9') o += (size_t)snprintf(out + o, n - o, "%d", (p[1] - '0') * width), p++;
        else out[o++] = *p;
    }
    out[o] = 0;
}

// Parses "conv2d out=32 kernel=5 pad=2" into *s; on error writes why to err.
static int parse_layer(const char *text, dt_layer_spec *s, char *err, size_t errn) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", text);
    memset(s, 0, sizeof *s);
    char *save = NULL, *tok = strtok_r(buf, " \t", &save);
    if (!tok) return snprintf(err, errn, "empty layer"), -1;
    int k;
    for (k = DT_LAYER_LINEAR; k <= DT_LAYER_AVGPOOL; k++)
        if (!strcmp(tok, dt_layer_kind_name((dt_layer_kind)k))) break;
    if (k > DT_LAYER_AVGPOOL)
        return snprintf(err, errn, "unknown layer '%s' (expected linear, conv2d, maxpool, relu, gelu, layernorm, dropout, flatten, batchnorm, block or avgpool)", tok), -1;
    s->kind = (dt_layer_kind)k;
    // Which parameters each kind takes.
    const char *allowed = s->kind == DT_LAYER_LINEAR    ? "out bias"
                          : s->kind == DT_LAYER_CONV2D  ? "out kernel stride pad bias"
                          : s->kind == DT_LAYER_MAXPOOL ? "kernel stride"
                          : s->kind == DT_LAYER_DROPOUT ? "p"
                          : s->kind == DT_LAYER_LAYERNORM ? "eps"
                          : s->kind == DT_LAYER_BATCHNORM ? "eps momentum"
                          : s->kind == DT_LAYER_BLOCK ? "out stride eps momentum" : "";
    char seen[64] = " ";  // parameters given so far, " out kernel "
    while ((tok = strtok_r(NULL, " \t", &save))) {
        char *eq = strchr(tok, '=');
        if (!eq) return snprintf(err, errn, "'%s': expected name=value", tok), -1;
        *eq = 0;
        const char *name = tok, *val = eq + 1;
        if (!*name) return snprintf(err, errn, "'=%s': expected name=value", val), -1;
        char pat[40];
        snprintf(pat, sizeof pat, " %s ", name);
        char al[64];
        snprintf(al, sizeof al, " %s ", allowed);
        if (!strstr(al, pat))
            return snprintf(err, errn, "%s takes no parameter '%s' (it takes: %s)",
                            dt_layer_kind_name(s->kind), name, *allowed ? allowed : "none"), -1;
        if (strstr(seen, pat)) return snprintf(err, errn, "parameter '%s' given twice", name), -1;
        snprintf(seen + strlen(seen), sizeof seen - strlen(seen), "%s ", name);
        if (!strcmp(name, "bias")) {
            if (strcmp(val, "true") && strcmp(val, "false"))
                return snprintf(err, errn, "bias=%s: expected true or false", val), -1;
            s->nobias = !strcmp(val, "false");
            continue;
        }
        int is_int = strcmp(name, "p") && strcmp(name, "eps") && strcmp(name, "momentum");
        double v;
        if (dt_parse_number(name, val, 0, is_int ? 1e6 : 1, is_int, &v) != DT_OK)
            return snprintf(err, errn, "%s", dt_last_error()), -1;
        if (!strcmp(name, "out")) s->out = (int)v;
        else if (!strcmp(name, "kernel")) s->kernel = (int)v;
        else if (!strcmp(name, "stride")) s->stride = (int)v;
        else if (!strcmp(name, "pad")) s->pad = (int)v;
        else if (!strcmp(name, "p")) {
            if (!(v >= 0 && v < 1)) return snprintf(err, errn, "p=%s: expected a probability in [0, 1)", val), -1;
            s->p = (float)v;
        } else if (!strcmp(name, "eps")) {
            if (!(v > 0 && v < 1)) return snprintf(err, errn, "eps=%s: expected a number in (0, 1)", val), -1;
            s->eps = (float)v;
        } else if (!strcmp(name, "momentum")) {
            if (!(v > 0 && v <= 1)) return snprintf(err, errn, "momentum=%s: expected a number in (0, 1]", val), -1;
            s->momentum = (float)v;
        }
    }
    if ((s->kind == DT_LAYER_LINEAR || s->kind == DT_LAYER_CONV2D || s->kind == DT_LAYER_BLOCK) && s->out <= 0)
        return snprintf(err, errn, "%s needs out=N (N > 0)", dt_layer_kind_name(s->kind)), -1;
    if ((s->kind == DT_LAYER_CONV2D || s->kind == DT_LAYER_MAXPOOL) && s->kernel <= 0)
        return snprintf(err, errn, "%s needs kernel=N (N > 0)", dt_layer_kind_name(s->kind)), -1;
    return 0;
}

// Formats a layer back into config text.
static void format_layer(const dt_layer_spec *s, char *buf, size_t n) {
    int w = snprintf(buf, n, "%s", dt_layer_kind_name(s->kind));
    switch (s->kind) {
    case DT_LAYER_LINEAR: snprintf(buf + w, n - w, " out=%d%s", s->out, s->nobias ? " bias=false" : ""); break;
    case DT_LAYER_CONV2D:
        w += snprintf(buf + w, n - w, " out=%d kernel=%d stride=%d pad=%d", s->out, s->kernel,
                      s->stride ? s->stride : 1, s->pad);
        if (s->nobias) snprintf(buf + w, n - w, " bias=false");
        break;
    case DT_LAYER_BLOCK:
        w += snprintf(buf + w, n - w, " out=%d stride=%d", s->out, s->stride ? s->stride : 1);
        snprintf(buf + w, n - w, " eps=%.9g momentum=%.9g", s->eps > 0 ? s->eps : 1e-5, s->momentum > 0 ? s->momentum : 0.1);
        break;
    case DT_LAYER_BATCHNORM:
        snprintf(buf + w, n - w, " eps=%.9g momentum=%.9g", s->eps > 0 ? s->eps : 1e-5, s->momentum > 0 ? s->momentum : 0.1);
        break;
    case DT_LAYER_MAXPOOL:
        snprintf(buf + w, n - w, " kernel=%d stride=%d", s->kernel, s->stride ? s->stride : s->kernel);
        break;
    case DT_LAYER_DROPOUT: snprintf(buf + w, n - w, " p=%.9g", s->p); break;
    case DT_LAYER_LAYERNORM: snprintf(buf + w, n - w, " eps=%.9g", s->eps > 0 ? s->eps : 1e-5); break;
    default: break;
    }
}

// ----------------------------------------------------------------------------
// parsing

typedef struct {
    dt_config *c;
    const char *what;   // file name, or "--set"
    int line;           // current line (counted by the reader)
    int failed;
    int fail_line;      // line of the first failure
    int file_layers;    // layer lines seen
    int preset_line;
    int seen_line[NFIELDS + 1];  // per field (+ [model] input): where the file set it
    // the stream being read
    const char *text;
    size_t pos;
} parser;

// A run name is one path component under runs/: letters, digits, '.', '_'
// and '-', not starting with '.' (so neither "..", a hidden name nor a '/').
static int name_ok(const char *s) {
    if (!*s || *s == '.') return 0;
    for (; *s; s++)
        if (!isalnum((unsigned char)*s) && !strchr("._-", *s)) return 0;
    return 1;
}

// "FILE:LINE: [section] key" (or "--set: [section] key"): how errors name a field.
static void field_name(const parser *p, const char *sec, const char *key, char *buf, size_t n) {
    if (p->line > 0) snprintf(buf, n, "%s:%d: [%s] %s", p->what, p->line, sec, key);
    else snprintf(buf, n, "%s: [%s] %s", p->what, sec, key);
}

// Marks the parse failed (the message is already recorded); returns 0, what
// inih's handler returns to stop.
static int failed(parser *p) {
    p->failed = 1;
    p->fail_line = p->line;
    return 0;
}

static int fail(parser *p, const char *sec, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int fail(parser *p, const char *sec, const char *key, const char *fmt, ...) {
    char msg[600], name[700];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    field_name(p, sec, key, name, sizeof name);
    dt_error(DT_ERR_CONFIG, "%s: %s", name, msg);
    return failed(p);
}

static int set_field(parser *p, const field *f, const char *val) {
    char *dst = (char *)p->c + f->off;
    switch (f->type) {
    case F_STR:
    case F_NAME:
        if (strlen(val) >= f->size || strlen(f->key) + 3 + strlen(val) > MAX_LINE_CHARS) {
            size_t max = MAX_LINE_CHARS - 3 - strlen(f->key);
            return fail(p, f->sec, f->key, "value longer than %zu characters",
                        f->size - 1 < max ? f->size - 1 : max);
        }
        // Only values that dt_config_write can write back unchanged: no
        // control characters, no surrounding blanks, and no ';' where it
        // would start a comment.
        for (const char *q = val; *q; q++) {
            if ((unsigned char)*q < 0x20 || *q == 0x7f)
                return fail(p, f->sec, f->key, "control character in value");
            if (*q == ';' && (q == val || q[-1] == ' ' || q[-1] == '\t'))
                return fail(p, f->sec, f->key, "';' at the start of a value or after a blank starts a comment, got '%s'", val);
        }
        if (*val && (isspace((unsigned char)val[0]) || isspace((unsigned char)val[strlen(val) - 1])))
            return fail(p, f->sec, f->key, "value with leading or trailing blanks: '%s'", val);
        if (f->type == F_NAME && !name_ok(val))
            return fail(p, f->sec, f->key,
                        "expected a name of letters, digits, '.', '_' and '-' that does not start with '.' "
                        "(it names a directory under runs/), got '%s'", val);
        snprintf(dst, f->size, "%s", val);
        return 1;
    case F_BOOL:
        if (!strcmp(val, "true") || !strcmp(val, "yes") || !strcmp(val, "1") || !strcmp(val, "on")) *(int *)dst = 1;
        else if (!strcmp(val, "false") || !strcmp(val, "no") || !strcmp(val, "0") || !strcmp(val, "off")) *(int *)dst = 0;
        else return fail(p, f->sec, f->key, "expected true or false, got '%s'", val);
        return 1;
    case F_ENUM: {
        for (int i = 0; f->choices[i]; i++)
            if (!strcmp(val, f->choices[i])) {
                if (f->size == sizeof(int)) *(int *)dst = i;
                else snprintf(dst, f->size, "%s", val);
                return 1;
            }
        char list[200] = "";
        for (int i = 0; f->choices[i]; i++)
            snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "", f->choices[i]);
        return fail(p, f->sec, f->key, "expected one of %s, got '%s'", list, val);
    }
    default: break;
    }
    char name[700];
    field_name(p, f->sec, f->key, name, sizeof name);
    if (f->type == F_U64) return dt_parse_u64(name, val, UINT64_MAX, (uint64_t *)dst) == DT_OK ? 1 : failed(p);
    double v;
    if (dt_parse_number(name, val, f->lo, f->hi, f->type != F_FLOAT, &v) != DT_OK) return failed(p);
    switch (f->type) {
    case F_INT: *(int *)dst = (int)v; break;
    case F_I64: *(int64_t *)dst = (int64_t)v; break;
    case F_FLOAT: *(float *)dst = (float)v; break;
    default: break;
    }
    return 1;
}

static int set_input(parser *p, const char *val) {
    int d[3] = {0, 1, 1}, n = 0;
    char buf[MAX_LINE_CHARS + 1], name[700];
    snprintf(buf, sizeof buf, "%s", val);
    field_name(p, "model", "input", name, sizeof name);
    for (char *s = buf, *x; s; s = x, n++) {
        if ((x = strchr(s, 'x'))) *x++ = 0;
        double v;
        if (n == 3 || dt_parse_number(name, s, 1, 1 << 20, 1, &v) != DT_OK)
            return fail(p, "model", "input", "expected CxHxW or a feature count of whole numbers from 1 to %d "
                        "(e.g. 1x28x28 or 784), got '%s'", 1 << 20, val);
        d[n] = (int)v;
    }
    if ((int64_t)d[0] * d[1] * d[2] > 1 << 28)
        return fail(p, "model", "input", "%s is %lld values per sample, more than %d", val,
                    (long long)d[0] * d[1] * d[2], 1 << 28);
    memcpy(p->c->input, d, sizeof d);
    return 1;
}

// A key that the file gives twice is an error (a --set overrides the file,
// and layer lines repeat).
static int duplicate(parser *p, int slot, const char *sec, const char *key) {
    if (p->line <= 0) return 0;
    if (p->seen_line[slot])
        return !fail(p, sec, key, "given twice (first on line %d); give each key once", p->seen_line[slot]);
    p->seen_line[slot] = p->line;
    return 0;
}

static int handle(void *user, const char *sec, const char *key, const char *val) {
    parser *p = user;
    if (p->failed) return 0;
    if (!strcmp(sec, "model") && !strcmp(key, "layer")) {
        dt_config *c = p->c;
        if (c->nlayers >= DT_MAX_LAYERS) return fail(p, sec, key, "more than %d layers", DT_MAX_LAYERS);
        char err[300];
        if (parse_layer(val, &c->layers[c->nlayers], err, sizeof err) != 0) return fail(p, sec, key, "%s", err);
        c->nlayers++;
        p->file_layers++;
        return 1;
    }
    if (!strcmp(sec, "model") && !strcmp(key, "input"))
        return duplicate(p, NFIELDS, sec, key) ? 0 : set_input(p, val);
    for (int i = 0; i < NFIELDS; i++)
        if (!strcmp(fields[i].sec, sec) && !strcmp(fields[i].key, key)) {
            if (duplicate(p, i, sec, key)) return 0;
            if (!strcmp(sec, "model") && !strcmp(key, "preset")) p->preset_line = p->line ? p->line : -1;
            return set_field(p, &fields[i], val);
        }
    int known_sec = !strcmp(sec, "model");
    for (int i = 0; i < NFIELDS && !known_sec; i++) known_sec = !strcmp(fields[i].sec, sec);
    if (!*sec) return fail(p, sec, key, "key before any [section] header");
    if (!known_sec)
        return fail(p, sec, key, "unknown section [%s] (expected run, model, data, optim, schedule, train, parallel, obs, checkpoint or compression)", sec);
    char keys[400] = "", mean[96] = "";
    const char *names[NFIELDS + 3];
    int nn = 0;
    if (!strcmp(sec, "model")) snprintf(keys, sizeof keys, "preset, input, layer");
    if (!strcmp(sec, "model")) names[nn++] = "preset", names[nn++] = "input", names[nn++] = "layer";
    for (int i = 0; i < NFIELDS; i++)
        if (!strcmp(fields[i].sec, sec) && strcmp(fields[i].key, "preset")) {
            snprintf(keys + strlen(keys), sizeof keys - strlen(keys), "%s%s", *keys ? ", " : "", fields[i].key);
            names[nn++] = fields[i].key;
        }
    const char *near = dt_suggest(key, names, nn);
    if (near) snprintf(mean, sizeof mean, "did you mean '%s'? ", near);
    return fail(p, sec, key, "unknown key (%skeys of [%s]: %s)", mean, sec, keys);
}

// ini_reader over a string that counts lines.
static char *read_line(char *str, int num, void *stream) {
    parser *p = stream;
    const char *s = p->text + p->pos;
    if (!*s) return NULL;
    size_t len = strcspn(s, "\n");
    size_t chars = len && s[len - 1] == '\r' ? len - 1 : len;
    size_t limit = num - 3 < MAX_LINE_CHARS ? (size_t)(num - 3) : MAX_LINE_CHARS;
    p->line++;
    if (chars > limit) {
        // inih would cut the line silently (a data dir cut short, say):
        // fail instead, and end the stream here.
        dt_error(DT_ERR_CONFIG, "%s:%d: line longer than %zu characters", p->what, p->line, limit);
        p->failed = 1;
        p->fail_line = p->line;
        return NULL;
    }
    memcpy(str, s, len);
    if (s[len] == '\n') str[len++] = '\n';
    str[len] = 0;
    p->pos += len;
    return str;
}

// ---- GPT models (docs/gpt.md) ----
// A preset naming a GPT resolves the sizes (fields left 0 take the preset's
// value) and checks the GPT-only fields.
static dt_status finish_tokens(dt_config *c, const char *what);
static dt_status finish_llama(dt_config *c, const char *what);

static dt_status finish_gpt(dt_config *c, const char *what) {
    if (c->arch == DT_ARCH_LLAMA || !strncmp(c->preset, "llama", 5)) return finish_llama(c, what);
    const char *llama_key = c->n_kv_head ? "n_kv_head" : c->ffn_hidden ? "ffn_hidden" : c->rope_theta != 0 ? "rope_theta"
                          : c->norm_eps != 0 ? "norm_eps" : NULL;
    if (llama_key)
        return dt_error(DT_ERR_CONFIG, "%s: [model] %s: only arch = llama has it (the model is a GPT, preset '%s')", what,
                        llama_key, c->preset);
    dt_gpt_config g = {0};
    if (strcmp(c->preset, "gpt") && dt_gpt_preset(c->preset, &g) != DT_OK)
        return dt_error(DT_ERR_CONFIG, "%s: [model] preset: expected " PRESET_NAMES ", gpt-tiny, gpt-small, gpt2-124m or gpt, got '%s'", what, c->preset);
    int *f[] = {&c->n_layer, &c->n_head, &c->n_embd, &c->block_size, &c->vocab_size, &c->padded_vocab_size};
    int *d[] = {&g.n_layer, &g.n_head, &g.n_embd, &g.block_size, &g.vocab_size, &g.padded_vocab_size};
    const char *names[] = {"n_layer", "n_head", "n_embd", "block_size", "vocab_size", "padded_vocab_size"};
    int vocab_given = c->vocab_size != 0;
    for (int i = 0; i < 6; i++) {
        if (*f[i] == 0 && i == 5) *f[i] = vocab_given && !c->padded_vocab_size ? dt_gpt_pad_vocab(c->vocab_size) : *d[i];
        if (*f[i] == 0) *f[i] = *d[i];
        if (*f[i] == 0) return dt_error(DT_ERR_CONFIG, "%s: [model] %s: preset 'gpt' needs it set", what, names[i]);
    }
    dt_gpt_config r = dt_config_gpt(c);
    char msg[512];
    if (dt_gpt_config_check(&r, "[model]") != DT_OK)
        return snprintf(msg, sizeof msg, "%s", dt_last_error()), dt_error(DT_ERR_CONFIG, "%s: %s", what, msg);
    return finish_tokens(c, what);
}

// A Llama-style model (dtrain/llama.h): the preset's sizes where a field
// is 0 (preset "llama": every size given), checked as the model checks
// them; the strategies it does not run yet refused.
static dt_status finish_llama(dt_config *c, const char *what) {
    dt_llama_config g = {0};
    c->arch = DT_ARCH_LLAMA;
    if (!c->preset[0]) snprintf(c->preset, sizeof c->preset, "llama");
    if (strcmp(c->preset, "llama") && dt_llama_preset(c->preset, &g) != DT_OK)
        return dt_error(DT_ERR_CONFIG, "%s: [model] preset: arch = llama takes llama-tiny, llama-small, llama2-7b or llama, got '%s'",
                        what, c->preset);
    int *f[] = {&c->n_layer, &c->n_head, &c->n_kv_head, &c->n_embd, &c->ffn_hidden, &c->block_size, &c->vocab_size};
    int d[] = {g.n_layer, g.n_head, g.n_kv_head, g.n_embd, g.ffn_hidden, g.block_size, g.vocab_size};
    const char *names[] = {"n_layer", "n_head", "n_kv_head", "n_embd", "ffn_hidden", "block_size", "vocab_size"};
    for (int i = 0; i < 7; i++) {
        if (*f[i] == 0) *f[i] = i == 2 && !d[i] ? c->n_head : d[i];  // (n_kv_head: n_head's by default)
        if (*f[i] == 0) return dt_error(DT_ERR_CONFIG, "%s: [model] %s: preset 'llama' needs it set", what, names[i]);
    }
    if (c->rope_theta == 0) c->rope_theta = g.rope_theta ? g.rope_theta : 10000.0f;
    if (c->norm_eps == 0) c->norm_eps = g.norm_eps ? g.norm_eps : 1e-5f;
    c->padded_vocab_size = c->vocab_size;
    dt_llama_config r = dt_config_llama(c);
    char msg[512];
    if (dt_llama_config_check(&r, "[model]") != DT_OK)
        return snprintf(msg, sizeof msg, "%s", dt_last_error()), dt_error(DT_ERR_CONFIG, "%s: %s", what, msg);
    const char *no = c->sequence ? "[parallel] sequence" : c->recompute ? "[train] recompute"
                   : (c->tensor > 1 || c->pipeline > 1) && c->init_from[0] ? "[model] init_from with model parallelism" : NULL;
    if (no)
        return dt_error(DT_ERR_CONFIG, "%s: %s: not yet with arch = llama (it trains on one process, data parallel, "
                        "ZeRO 1-3, tensor and pipeline parallel; docs/llama.md)", what, no);
    return finish_tokens(c, what);
}

// What every language model on token files needs.
static dt_status finish_tokens(dt_config *c, const char *what) {
    if (c->seq_len == 0) c->seq_len = c->block_size;
    if (c->seq_len > c->block_size)
        return dt_error(DT_ERR_CONFIG, "%s: [train] seq_len: %d is longer than the model's context ([model] block_size = %d)", what, c->seq_len, c->block_size);
    if (strcmp(c->dataset, "tokens"))
        return dt_error(DT_ERR_CONFIG, "%s: [data] dataset: a GPT trains on 'tokens' (llm.c token files), got '%s'", what, c->dataset);
    if (!c->train_file[0]) return dt_error(DT_ERR_CONFIG, "%s: [data] train_file: expected the path of a token file", what);
    if (c->max_steps == 0) return dt_error(DT_ERR_CONFIG, "%s: [train] max_steps: a GPT run needs max_steps > 0", what);
    if (c->eval_batches == 0) c->eval_batches = 10;
    c->gpt = 1;
    c->nlayers = 0;
    return DT_OK;
}
// ---- end of GPT models ----

// Batch norm's limits: what each strategy can take of it yet.
static dt_status finish_batchnorm(const dt_config *c, const char *what) {
    int bn = -1;
    for (int i = 0; i < c->nlayers && bn < 0; i++)
        if (c->layers[i].kind == DT_LAYER_BATCHNORM || c->layers[i].kind == DT_LAYER_BLOCK) bn = i;
    if (bn < 0) return DT_OK;
    const char *l = dt_layer_kind_name(c->layers[bn].kind), *no = NULL;
    if (c->tensor > 1) no = "[parallel] tensor > 1 (tensor parallel)";
    else if (c->pipeline > 1) no = "[parallel] pipeline > 1 (pipeline parallel)";
    else if (c->ps_servers > 0) no = "[parallel] servers (parameter servers)";
    else if (c->deterministic && !c->sync_bn)
        no = "[parallel] deterministic = true without [model] sync_bn = true (each worker's own statistics change with "
             "the number of workers; sync_bn's are the whole batch's)";
    else if (c->dynamic_batch) no = "[train] dynamic_batch = true (the workers' forwards must pair up)";
    else if (dt_device_index(c->device) >= 0) no = "[train] device = cuda (no GPU batch norm yet)";
    if (no)
        return dt_error(DT_ERR_CONFIG, "%s: [model] layer %d (%s): batch norm cannot be used with %s yet "
                        "(docs/data-parallel.md, batch norm)", what, bn, l, no);
    return DT_OK;
}

static dt_status finish_layers(dt_config *c, const char *what) {
    dt_status st;
    if (c->preset[0]) {
        int found = -1;
        for (int i = 0; i < (int)(sizeof presets / sizeof presets[0]); i++)
            if (!strcmp(c->preset, presets[i].name)) found = i;
        if (found < 0)
            return dt_error(DT_ERR_CONFIG, "%s: [model] preset: expected " PRESET_NAMES ", gpt-tiny, gpt-small, gpt2-124m, "
                            "gpt or llama (arch = llama), got '%s'", what, c->preset);
        if (c->width && strcmp(c->preset, "resnet18"))
            return dt_error(DT_ERR_CONFIG, "%s: [model] width: only preset = resnet18 has it (preset '%s')", what, c->preset);
        c->nlayers = 0;
        for (const char *const *l = presets[found].layers; *l; l++) {
            char err[300], line[128];
            preset_line(*l, c->width ? c->width : 64, line, sizeof line);
            if (parse_layer(line, &c->layers[c->nlayers++], err, sizeof err) != 0)
                return dt_error(DT_ERR_INTERNAL, "preset %s: %s", c->preset, err);
        }
    }
    if (c->nlayers == 0)
        return dt_error(DT_ERR_CONFIG, "%s: [model]: no layers (give 'preset = mlp|cnn|resnet18' or 'layer = ...' lines)", what);
    if ((st = finish_batchnorm(c, what)) != DT_OK) return st;
    if (c->recompute)
        return dt_error(DT_ERR_CONFIG, "%s: [train] recompute = blocks: only a GPT has transformer blocks to recompute; use none", what);
    if (c->epochs == 0 && c->max_steps == 0)
        return dt_error(DT_ERR_CONFIG, "%s: [train]: epochs and max_steps are both 0; set one to bound the run", what);
    return DT_OK;
}

// Settings of [compression] that only some methods read, or that no
// deterministic run can honour.
static dt_status finish_compression(const dt_config *c, const char *what) {
    const char *m = comp_names[c->comp_method];
    if (c->comp_method != DT_COMP_NONE && c->deterministic)
        return dt_error(DT_ERR_CONFIG, "%s: [compression] method: '%s' cannot be used with [parallel] deterministic = true "
                        "(its fixed-point sums send no compressed gradients); use method = none", what, m);
    if (c->comp_method != DT_COMP_TOPK && (c->comp_momentum > 0 || c->comp_clip_norm > 0))
        return dt_error(DT_ERR_CONFIG, "%s: [compression] %s: only method = topk uses it (DGC), got method = %s", what,
                        c->comp_momentum > 0 ? "momentum" : "clip_norm", m);
    if (c->comp_method != DT_COMP_TOPK && c->comp_method != DT_COMP_POWERSGD && c->comp_warmup_steps > 0)
        return dt_error(DT_ERR_CONFIG, "%s: [compression] warmup_steps: only method = topk (DGC's warm-up) and powersgd "
                        "(steps sent uncompressed first) use it, got method = %s", what, m);
    if (c->comp_momentum > 0 && !c->comp_error_feedback)
        return dt_error(DT_ERR_CONFIG, "%s: [compression] momentum: momentum correction needs error_feedback = true", what);
    return DT_OK;
}

// [data]: the HDF5 file, the augmentation list, the sampler.
static dt_status finish_data(const dt_config *c, const char *what) {
    int ids[DT_MAX_AUGMENT], n;
    char msg[256];
    if (!strcmp(c->dataset, "hdf5") && !c->data_file[0])
        return dt_error(DT_ERR_CONFIG, "%s: [data] file: dataset = hdf5 needs the path of an HDF5 file", what);
    if (dt_augment_parse(c->augment, ids, &n) != DT_OK)
        return snprintf(msg, sizeof msg, "%s", dt_last_error()), dt_error(DT_ERR_CONFIG, "%s: [data] augment: %s", what, msg);
    // (An image input; a flat one leaves the check to the loader, which
    // knows the file's image shape.)
    if (n && c->input[1] > 1 && (c->crop_pad >= c->input[1] || c->crop_pad >= c->input[2]))
        return dt_error(DT_ERR_CONFIG, "%s: [data] crop_pad: %d is not smaller than the %dx%d images", what, c->crop_pad,
                        c->input[1], c->input[2]);
    if (c->sampler == DT_SAMPLER_BALANCED && !c->shuffle)
        return dt_error(DT_ERR_CONFIG, "%s: [data] sampler: balanced draws every batch at random; it cannot be used with shuffle = false", what);
    return DT_OK;
}

// A list of whole numbers "a,b,c" into out[max]; the count, or -1.
static int int_list(const char *text, int64_t lo, int64_t hi, int64_t *out, int max) {
    int n = 0;
    const char *p = text;
    while (*p) {
        char *end;
        while (*p == ' ') p++;
        long long v = strtoll(p, &end, 10);
        if (end == p || v < lo || v > hi || n == max) return -1;
        out[n++] = v;
        for (p = end; *p == ' '; p++) {}
        if (*p == ',') p++;
        else if (*p) return -1;
    }
    return n;
}

// [model] preset = dlrm: the shape from [recsys]'s lists.
static dt_status finish_recsys(dt_config *c, const char *what) {
    c->recsys = 1;
    dt_dlrm_spec *s = &c->dlrm;
    int64_t v[DT_DLRM_MAX_TABLES];
    int n = int_list(c->rs_tables, 1, 1ll << 32, s->rows, DT_DLRM_MAX_TABLES);
    if (n < 1)
        return dt_error(DT_ERR_CONFIG, "%s: [recsys] tables: expected the row counts of 1 to %d tables, as "
                        "'100000,5000,300' (each 1 to 2^32), got '%s'", what, DT_DLRM_MAX_TABLES, c->rs_tables);
    s->ntables = n;
    const char *key[2] = {"bottom", "top"};
    const char *text[2] = {c->rs_bottom, c->rs_top};
    int *cnt[2] = {&s->nbottom, &s->ntop}, *w[2] = {s->bottom, s->top};
    for (int k = 0; k < 2; k++) {
        if ((n = int_list(text[k], 1, 65536, v, DT_DLRM_MAX_MLP)) < 0)
            return dt_error(DT_ERR_CONFIG, "%s: [recsys] %s: expected up to %d hidden widths, as '64,32' (each 1 to "
                            "65536; empty: none), got '%s'", what, key[k], DT_DLRM_MAX_MLP, text[k]);
        *cnt[k] = n;
        for (int i = 0; i < n; i++) w[k][i] = (int)v[i];
    }
    if (!c->rs_train[0]) return dt_error(DT_ERR_CONFIG, "%s: [recsys] train: preset dlrm needs a click log", what);
    if (c->pipeline > 1 || c->tensor > 1)
        return dt_error(DT_ERR_CONFIG, "%s: [parallel] %s: preset dlrm has no stages or shards of its MLPs; its tables "
                        "shard by row over parameter servers ([parallel] servers)", what,
                        c->pipeline > 1 ? "pipeline" : "tensor");
    char msg[512];
    if (dt_dlrm_spec_check(s, "[recsys]") != DT_OK)
        return snprintf(msg, sizeof msg, "%s", dt_last_error()), dt_error(DT_ERR_CONFIG, "%s: %s", what, msg);
    return DT_OK;
}

// s3:// paths: this build must have the client, and the [s3] keys are
// where it finds the server when the environment does not say.
static dt_status finish_paths(const dt_config *c, const char *what) {
    const struct { const char *key, *path; } paths[] = {
        {"[checkpoint] dir", c->ckpt_dir}, {"[checkpoint] resume", c->resume}, {"[data] dir", c->data_dir},
        {"[data] file", c->data_file},     {"[data] train_file", c->train_file}, {"[data] val_file", c->val_file},
        {"[model] init_from", c->init_from}};
    for (size_t i = 0; i < sizeof paths / sizeof *paths; i++)
        if (dt_path_remote(paths[i].path) && !dt_s3_available())
            return dt_error(DT_ERR_CONFIG, "%s: %s = %.200s: s3:// paths need libcurl, which this build of dtrain lacks "
                            "(install libcurl4-openssl-dev and rebuild)", what, paths[i].key, paths[i].path);
    if (c->s3_endpoint[0] && strncmp(c->s3_endpoint, "http://", 7) && strncmp(c->s3_endpoint, "https://", 8))
        return dt_error(DT_ERR_CONFIG, "%s: [s3] endpoint: expected a URL http://HOST[:PORT] or https://..., got '%.100s'",
                        what, c->s3_endpoint);
    dt_s3_configure(c->s3_endpoint, c->s3_region);
    return DT_OK;
}

// Why the sharded order cannot be had (docs/data.md "Sharded reading"):
// what reads the data otherwise; NULL: it can.
static const char *no_shard(const dt_config *c) {
    if (c->recsys) return "the recommender reads its click logs whole";
    if (c->gpt && (c->tensor > 1 || c->pipeline > 1))
        return "a language model under [parallel] tensor or pipeline draws its windows from the whole file";
    if (!c->gpt && c->sampler == DT_SAMPLER_BALANCED) return "[data] sampler = balanced draws every batch from the whole set";
    if (c->dynamic_batch) return "[train] dynamic_batch moves samples between the ranks";
    if (c->ps_share == 1) return "[ps] share = dynamic hands any worker any part of a batch";
    return NULL;
}

int dt_config_data_sharded(const dt_config *c) {
    if (c->data_shard == DT_DATA_SHARD_NONE || no_shard(c)) return 0;
    if (c->data_shard == DT_DATA_SHARD_RANKS) return 1;
    return dt_path_remote(c->gpt ? c->train_file : !strcmp(c->dataset, "hdf5") ? c->data_file : c->data_dir);
}

static dt_status finish(dt_config *c, const char *what) {
    int lm = !strncmp(c->preset, "gpt", 3) || !strncmp(c->preset, "llama", 5) || c->arch == DT_ARCH_LLAMA;
    c->recsys = 0;
    dt_status st = lm ? finish_gpt(c, what) : !strcmp(c->preset, "dlrm") ? finish_recsys(c, what) : finish_layers(c, what);
    if (st == DT_OK) st = finish_data(c, what);
    if (st != DT_OK) return st;
    if (c->batch % c->grad_accum)
        return dt_error(DT_ERR_CONFIG, "%s: [train] grad_accum (%d) must divide batch (%d)", what, c->grad_accum, c->batch);
    if (c->min_lr > c->optim.lr)
        return dt_error(DT_ERR_CONFIG, "%s: [schedule] min_lr (%g) is above [optim] lr (%g)", what, c->min_lr, c->optim.lr);
    if (dt_device_index(c->device) < -1)
        return dt_error(DT_ERR_CONFIG, "%s: [train] device: expected cpu, cuda or cuda:N (N a GPU's index, from 0), "
                        "got '%s'", what, c->device);
    if (c->pipeline < 2 && (c->pipeline_schedule == 2 || c->virtual_stages > 1))
        return dt_error(DT_ERR_CONFIG, "%s: [parallel] %s: interleaving runs virtual stages of a pipeline, and pipeline is "
                        "%d; set pipeline >= 2 or leave it unset", what,
                        c->pipeline_schedule == 2 ? "schedule = interleaved" : "virtual_stages", c->pipeline);
    if ((st = finish_paths(c, what)) != DT_OK) return st;
    if (c->data_shard == DT_DATA_SHARD_RANKS && no_shard(c))
        return dt_error(DT_ERR_CONFIG, "%s: [data] shard = ranks: %s; use shard = none (or auto)", what, no_shard(c));
    return finish_compression(c, what);
}

int dt_device_index(const char *d) {
    int n = -1, used = 0;
    if (!strcmp(d, "cpu")) return -1;
    if (!strcmp(d, "cuda")) return 0;
    if (sscanf(d, "cuda:%3d%n", &n, &used) == 1 && !d[used] && isdigit((unsigned char)d[5]) && (d[5] != '0' || !d[6]))
        return n;
    return -2;
}

dt_status dt_config_parse(dt_config *c, const char *text, const char *what, const char *const *overrides,
                          int noverrides) {
    dt_config_defaults(c);
    // The run name defaults to the file's stem, made a safe name.
    const char *base = strrchr(what, '/');
    base = base ? base + 1 : what;
    snprintf(c->name, sizeof c->name, "%.*s", (int)strcspn(base, "."), base);
    for (char *q = c->name; *q; q++)
        if (!isalnum((unsigned char)*q) && !strchr("._-", *q)) *q = '_';
    if (!name_ok(c->name)) snprintf(c->name, sizeof c->name, "run");
    parser p = {.c = c, .what = what, .text = text};
    int rc = ini_parse_stream(read_line, &p, handle, &p);
    // inih returns the first bad line; report a syntax error there rather
    // than a later field error it caused (a key after a broken [section]).
    if (p.failed && !(rc > 0 && rc < p.fail_line)) return DT_ERR_CONFIG;
    if (rc != 0)
        return dt_error(DT_ERR_CONFIG, "%s:%d: syntax error (expected '[section]', 'key = value' or a ';' comment)",
                        what, rc > 0 ? rc : 0);
    if (p.preset_line && p.file_layers)
        return dt_error(DT_ERR_CONFIG, "%s: [model]: give either 'preset' or 'layer' lines, not both", what);
    // --set section.key=value overrides, applied in order.
    parser q = {.c = c, .what = "--set"};
    for (int i = 0; i < noverrides; i++) {
        const char *o = overrides[i], *dot = strchr(o, '.'), *eq = strchr(o, '=');
        if (!dot || !eq || dot > eq || dot == o || eq == dot + 1)
            return dt_error(DT_ERR_CONFIG, "--set '%s': expected section.key=value", o);
        char sec[64], key[64];
        snprintf(sec, sizeof sec, "%.*s", (int)(dot - o), o);
        snprintf(key, sizeof key, "%.*s", (int)(eq - dot - 1), dot + 1);
        if (!strcmp(sec, "model") && !strcmp(key, "layer"))
            return dt_error(DT_ERR_CONFIG, "--set '%s': layers cannot be overridden; use --set model.preset=NAME or edit the file", o);
        if (!strcmp(sec, "model") && !strcmp(key, "preset")) c->nlayers = 0;
        handle(&q, sec, key, eq + 1);
        if (q.failed) return DT_ERR_CONFIG;
    }
    return finish(c, what);
}

dt_status dt_config_load(dt_config *c, const char *path, const char *const *overrides, int noverrides) {
    uint8_t *buf;
    size_t len;
    FILE *f = dt_fopen_read(path);
    if (!f)  // (there but not a file: a config error, as a file that is not a config)
        return dt_error(access(path, F_OK) == 0 ? DT_ERR_CONFIG : DT_ERR_IO, "config %s", dt_last_error());
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    rewind(f);
    if (sz < 0 || sz > (16 << 20)) {
        fclose(f);
        return dt_error(DT_ERR_CONFIG, "%s: not a config file (size %ld)", path, sz);
    }
    buf = malloc((size_t)sz + 1);
    len = buf ? fread(buf, 1, (size_t)sz, f) : 0;
    fclose(f);
    if (!buf) return dt_error(DT_ERR_NOMEM, "%s: out of memory", path);
    buf[len] = 0;
    if (memchr(buf, 0, len)) {
        free(buf);
        return dt_error(DT_ERR_CONFIG, "%s: not a text file (contains NUL bytes)", path);
    }
    dt_status st = dt_config_parse(c, (const char *)buf, path, overrides, noverrides);
    free(buf);
    return st;
}

// ----------------------------------------------------------------------------
// writing

// The [model] keys of arch = llama alone (arch itself: a GPT's is the
// default), which a GPT's resolved text leaves out: its checkpoints'
// config texts stay comparable with those written before the keys came.
static int llama_only(const field *f) {
    static const char *const keys[] = {"arch", "n_kv_head", "ffn_hidden", "rope_theta", "norm_eps"};
    if (strcmp(f->sec, "model")) return 0;
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++)
        if (!strcmp(f->key, keys[i])) return 1;
    return 0;
}

char *dt_config_format(const dt_config *c) {
    char *text = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&text, &len);
    if (!m) return NULL;
    fprintf(m, "; resolved dtrain config (every field, presets expanded)\n");
    // Fields grouped by section, sections in the table's order.
    const char *secs[16];
    int ns = 0;
    for (int i = 0; i < NFIELDS; i++) {
        int seen = 0;
        for (int k = 0; k < ns; k++) seen |= !strcmp(secs[k], fields[i].sec);
        if (!seen && ns < 16) secs[ns++] = fields[i].sec;
    }
    for (int k = 0; k < ns; k++) {
        fprintf(m, "\n[%s]\n", secs[k]);
        if (!strcmp(secs[k], "model") && !c->gpt && !c->recsys) {
            fprintf(m, "input = %dx%dx%d\n", c->input[0], c->input[1], c->input[2]);
            for (int l = 0; l < c->nlayers; l++) {
                char b[128];
                format_layer(&c->layers[l], b, sizeof b);
                fprintf(m, "layer = %s\n", b);
            }
        }
        for (int i = 0; i < NFIELDS; i++) {
            const field *f = &fields[i];
            if (strcmp(f->sec, secs[k])) continue;
            if (!c->gpt && f >= gpt_fields) continue;  // GPT fields only for GPTs
            if (!c->recsys && !strcmp(f->sec, "recsys")) continue;  // the recommender's only for it
            if (!strcmp(f->key, "preset") && !c->gpt && !c->recsys) continue;  // written out as layers above
            if (c->arch != DT_ARCH_LLAMA && llama_only(f)) continue;  // (a GPT's text is as it was before them)
            // (width is the preset's, written out as its layers; sync_bn when set, so that the texts of runs
            // before it stay as they were)
            if (!strcmp(f->sec, "model") && (!strcmp(f->key, "width") || (!strcmp(f->key, "sync_bn") && !c->sync_bn)))
                continue;
            const char *src = (const char *)c + f->off;
            switch (f->type) {
            case F_STR:
            case F_NAME: fprintf(m, "%s = %s\n", f->key, src); break;
            case F_BOOL: fprintf(m, "%s = %s\n", f->key, *(const int *)src ? "true" : "false"); break;
            case F_ENUM:
                fprintf(m, "%s = %s\n", f->key, f->size == sizeof(int) ? f->choices[*(const int *)src] : src);
                break;
            case F_INT: fprintf(m, "%s = %d\n", f->key, *(const int *)src); break;
            case F_I64: fprintf(m, "%s = %lld\n", f->key, (long long)*(const int64_t *)src); break;
            case F_U64: fprintf(m, "%s = %llu\n", f->key, (unsigned long long)*(const uint64_t *)src); break;
            case F_FLOAT: fprintf(m, "%s = %.9g\n", f->key, *(const float *)src); break;
            }
        }
    }
    fclose(m);
    return text;
}

dt_status dt_config_write(const dt_config *c, const char *path) {
    char *text = dt_config_format(c);
    if (!text) return dt_error(DT_ERR_NOMEM, "%s: out of memory", path);
    const void *parts[] = {text};
    size_t sizes[] = {strlen(text)};
    dt_status st = dt_write_atomic(path, parts, sizes, 1);
    free(text);
    return st;
}

const char *dt_config_ckpt_dir(const dt_config *c, const char *run_dir, char *buf, size_t n) {
    if (c->ckpt_dir[0]) snprintf(buf, n, "%s", c->ckpt_dir);
    else if (run_dir) snprintf(buf, n, "%s/checkpoints", run_dir);
    else if (n) buf[0] = 0;
    return buf;
}
