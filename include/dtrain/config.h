/*
 * dtrain/config.h - run configuration: INI files with validated fields.
 *
 *   [model]                      ; either a preset or a list of layers
 *   input = 1x28x28              ; CxHxW, or a feature count
 *   layer = conv2d out=32 kernel=5 pad=2
 *   layer = relu
 *   ...
 *   [data]    dataset (fashion-mnist|hdf5|tokens), dir, file, mean, std,
 *             shuffle, sampler, prefetch, drop_last, loader_threads, cache,
 *             augment, crop_pad, train_images, train_labels, test_images,
 *             test_labels (docs/data.md)
 *   [optim]   name (sgd|adamw), lr, momentum, nesterov, weight_decay,
 *             beta1, beta2, eps, clip_norm, lr_scaling, base_batch
 *   [schedule] name (constant|cosine|linear), warmup_steps, min_lr
 *   [train]   batch, epochs, max_steps, seed, threads, eval_batch, log_every,
 *             grad_accum, straggler_margin, straggler_steps, dynamic_batch, precision (fp32|bf16|fp16),
 *             recompute (none|blocks), time_layers
 *   [parallel] bucket_kb, deterministic, micro_shards, zero, zero_release (auto|always), offload,
 *             offload_dir, pipeline, tensor, sequence, micro_batches, schedule, virtual_stages,
 *             pipeline_split, pipeline_balance (measured|flops|count), sync_every, sync_warmup, servers, grad_dtype (fp32|bf16)
 *   [ps]      mode, staleness, backup_workers, staleness_lr, groups, share
 *   [recsys]  tables, dim, dense, bottom, top, train, test, table_optim, table_lr,
 *             table_eps, sparse, placement (range|hash), shard (servers|workers) (docs/recommender.md)
 *   [federated] clients, fraction, rounds, local_epochs, local_batch,
 *             partition, alpha, shards, algorithm, server_lr, ... (dtrain federate)
 *   [obs]     metrics_port, metrics_addr, trace
 *   [checkpoint] every_steps, every_seconds, keep, resume, sharded, allow_changes, staging, dir
 *   [s3]      endpoint, region (docs/s3.md)
 *   [compression] method (none|fp16|bf16|int8|qsgd|sign|topk|randomk|powersgd),
 *             ratio, levels, rank, error_feedback, warmup_steps, momentum,
 *             clip_norm, min_bytes (docs/compression.md)
 *
 * docs/config.md lists every key with its default. Every key is checked: an
 * unknown section or key, or a value of the wrong form, fails with
 * DT_ERR_CONFIG and a message "FILE:LINE: [section] key: expected ...".
 */
#ifndef DTRAIN_CONFIG_H
#define DTRAIN_CONFIG_H

#include "dtrain/core.h"
#include "dtrain/gpt.h"
#include "dtrain/llama.h"
#include "dtrain/spec.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DT_MAX_LAYERS 64

/* [compression] method: how the data-parallel strategy sends gradients. */
/* [parallel] pipeline_balance: how pipeline stages are cut when
 * pipeline_split does not list them (docs/model-parallel.md). */
typedef enum {
    DT_BALANCE_MEASURED = 0, /* each layer's forward + backward timed before the first step */
    DT_BALANCE_FLOPS,        /* forward FLOPs from the shapes (the GPT's blocks: by count) */
    DT_BALANCE_COUNT         /* as many layers a stage as can be */
} dt_pipeline_balance_kind;

typedef enum {
    DT_COMP_NONE = 0, DT_COMP_FP16, DT_COMP_BF16, DT_COMP_INT8, DT_COMP_QSGD, DT_COMP_SIGN,
    DT_COMP_TOPK, DT_COMP_RANDOMK, DT_COMP_POWERSGD
} dt_comp_method;

/* [checkpoint] staging (docs/checkpoints.md "Staging"). */
typedef enum { DT_STAGING_AUTO, DT_STAGING_SLICE, DT_STAGING_PIECES } dt_staging;

/* Robust aggregation of updates ([federated] / [ps] aggregator and its
 * keys; engine/robust/robust.h). */
typedef enum { DT_AGG_MEAN = 0, DT_AGG_MEDIAN, DT_AGG_TRIMMED, DT_AGG_KRUM, DT_AGG_CLIP } dt_agg_kind;
typedef struct {
    int kind;        /* dt_agg_kind */
    float trim;      /* trimmed: the fraction beta cut at each end of every coordinate */
    int krum_f;      /* krum: the Byzantine updates it tolerates (needs n > 2f + 2) */
    int krum_m;      /* krum: the best-scored updates averaged (1: Krum, more: multi-Krum) */
    float clip;      /* clip: every update's L2 norm bounded by this */
    float outlier;   /* an update whose norm is above outlier x the median norm is left out (0: off) */
} dt_robust_params;

typedef struct {
    char name[64];                 /* run name (default: config file stem) */
    /* [model] */
    char preset[32];               /* "mlp", "cnn", "resnet18", or "" for explicit layers */
    int input[3];                  /* C, H, W */
    int width;                     /* resnet18: channels of the first stage (stages W, 2W, 4W, 8W; 0 = 64) */
    int sync_bn;                   /* batch norm's statistics over every data-parallel worker's samples */
    int nlayers;
    dt_layer_spec layers[DT_MAX_LAYERS];
    /* [data] */
    char dataset[32];              /* "fashion-mnist" */
    char data_dir[512];
    float mean, std;               /* normalisation after scaling to [0,1] */
    int shuffle, prefetch, drop_last;
    int sampler;                   /* dt_sampler (data.h): shuffled or balanced */
    char augment[128];             /* augmentation hooks, "crop, flip" ("": none) */
    int crop_pad;                  /* crop: padding on each side */
    int loader_threads;            /* threads assembling each batch */
    int cache;                     /* keep the decoded samples (else the file's bytes) */
    char data_file[512];           /* dataset = hdf5: the file */
    char h5_names[4][128];         /* its datasets: train images, train labels, test images, test labels */
    int data_shard;                /* [data] shard: DT_DATA_SHARD_* (dt_config_data_sharded) */
    int dynamic_batch;             /* [train] ranks' shares follow their step times */
    /* [optim] and [schedule] */
    dt_optim_params optim;
    dt_sched_kind sched;
    int64_t warmup_steps;
    float min_lr;
    /* [train] */
    int batch, eval_batch;
    int epochs;
    int64_t max_steps;             /* 0 = no bound beyond epochs */
    uint64_t seed;
    int threads;                   /* 0 = all cores */
    int log_every;                 /* steps between plain progress lines */
    int grad_accum;                /* micro-steps per step (divides batch) */
    int lr_scaling;                /* 0 none, 1 linear: lr x batch / base_batch */
    int base_batch;
    int precision;                 /* dt_dtype of the matmuls and convolutions: DT_F32, DT_BF16, DT_F16 (docs/mixed-precision.md) */
    int recompute;                 /* [train] recompute: 0 none, 1 blocks (a GPT keeps only each block's input; docs/model-parallel.md) */
    int time_layers;               /* [train] time_layers: each layer's forward and backward timed before the first step,
                                      into summary.json's layer_times (what dtrain plan's calibration sets; docs/plan.md) */
    /* [parallel] (data-parallel workers) */
    int bucket_kb;                 /* gradient bucket size for the allreduce */
    int deterministic;             /* bitwise identical results for any worker count */
    int micro_shards;              /* fixed shards of a global batch (deterministic mode) */
    /* model parallel (docs/model-parallel.md) */
    int pipeline;                  /* stages P (1: none) */
    int tensor;                    /* tensor-parallel ranks T (1: none) */
    int sequence;                  /* [parallel] sequence: a GPT's sequence parallelism over the T ranks (0: off) */
    int micro_batches;             /* per data-parallel replica and step (0: P) */
    int pipeline_schedule;         /* 0 gpipe, 1 1f1b, 2 interleaved (1f1b over virtual stages) */
    int virtual_stages;            /* V: chunks of layers a stage runs (schedule = interleaved) */
    char pipeline_split[256];      /* layers per stage, "2,3,3" ("": balanced by pipeline_balance) */
    int pipeline_balance;          /* dt_pipeline_balance_kind: how the stages are balanced without pipeline_split */
    int zero;                      /* ZeRO stage: 0 replicated, 1 optimizer state, 2 + gradients, 3 + parameters sharded */
    int zero_release;              /* stages 2, 3: 0 auto (give back the pages not owned when memory matters), 1 always */
    int offload;                   /* 0 none, 1 disk: the optimizer state in a file-backed mapping */
    char offload_dir[512];         /* where (offload = disk) */
    int sync_every;                /* local SGD: average parameters every H steps (0: plain dp) */
    int grad_dtype;                /* gradients on the wire: 0 fp32, 1 bf16 (summed in fp32; docs/mixed-precision.md) */
    int64_t sync_warmup;           /* local SGD: plain data-parallel steps first (post-local SGD) */
    /* parameter servers (docs/parameter-server.md) */
    int ps_servers;                /* [parallel] servers: S server processes besides the workers (0: none) */
    int ps_mode;                   /* [ps] mode: 0 sync, 1 async, 2 ssp, 3 backup */
    int ps_staleness;              /* ssp: how many steps a worker may run ahead of the slowest */
    int ps_backup;                 /* backup: workers whose gradients a step may go without */
    int ps_staleness_lr;           /* a stale gradient's learning rate divided by its staleness */
    int ps_groups;                 /* workers allreduce in G groups, one leader each talks to the servers (0: none) */
    dt_robust_params ps_robust;    /* [ps] aggregator and its parameters (sync mode; docs/parameter-server.md) */
    int ps_share;                  /* [ps] share: 0 fixed (each worker its share of every batch), 1 dynamic (async,
                                      ssp: the epoch's pieces of batches to whichever worker is free) */
    /* [federated] (dtrain federate, docs/federated.md) */
    int fed_clients;               /* simulated clients */
    float fed_fraction;            /* of them sampled per round */
    int fed_rounds;
    int fed_local_epochs;          /* E: passes over a client's data per round */
    int fed_local_batch;           /* B: a client's batch */
    int fed_partition;             /* 0 iid, 1 shards, 2 dirichlet */
    float fed_alpha;               /* Dirichlet concentration (label skew) */
    int fed_shards;                /* label-sorted shards per client (partition = shards) */
    int fed_algorithm;             /* 0 fedavg, 1 fedavgm, 2 fedadam */
    float fed_server_lr;
    float fed_server_momentum;     /* fedavgm */
    float fed_server_beta1, fed_server_beta2, fed_server_eps;  /* fedadam */
    float fed_mu;                  /* FedProx proximal term on clients (0: none) */
    int fed_min_clients;           /* fewest clients a round may aggregate */
    float fed_deadline;            /* seconds a client may train in a round (0: no deadline) */
    int fed_secure;                /* secure aggregation: pairwise masks mod 2^32 */
    dt_robust_params fed_robust;   /* [federated] aggregator and its parameters (docs/federated.md) */
    float fed_dp_clip;             /* DP-FedAvg: every client's update clipped to this L2 norm (0: no DP) */
    float fed_dp_noise;            /* ... Gaussian noise sigma x dp_clip on the sum (0: from dp_epsilon) */
    float fed_dp_epsilon;          /* ... the epsilon the rounds may spend, sigma solved for it (0: dp_noise) */
    float fed_dp_delta;            /* ... the delta of (epsilon, delta) */
    /* straggler detection (rank 0, docs/observability.md) */
    float straggler_margin;        /* a rank's step time above the median by this fraction */
    int straggler_steps;           /* ... for this many steps in a row is reported (0: off) */
    /* [obs] outputs besides the run directory */
    int metrics_port;              /* Prometheus endpoint on rank 0 (0: none) */
    char metrics_addr[64];         /* address it listens on */
    char trace[512];               /* Chrome trace-event JSON file ("" : none) */
    char device[16];               /* [train] device: "cpu", "cuda" or "cuda:N" (docs/gpu.md) */
    int tf32;                      /* [train] tf32: a GPU's fp32 matmuls on TF32 tensor cores (default 1) */
    int attention;                 /* [train] attention: a GPU's causal attention, dt_att_choice (0 auto, 1 fused, 2 gemm) */
    int cuda_graph;                /* [train] cuda_graph: one rank's step captured as a CUDA graph and replayed (default 1) */
    /* [checkpoint] (RUN_DIR/checkpoints, docs/checkpoints.md) */
    int64_t ckpt_every_steps;      /* 0 = not by steps */
    float ckpt_every_seconds;      /* 0 = not by time */
    int ckpt_keep;                 /* newest checkpoints kept */
    int ckpt_sharded;              /* every rank writes its slice (step-N/ directories) */
    int ckpt_staging;              /* a model in parts' checkpoints: DT_STAGING_AUTO, _SLICE (staged, written in
                                      the background) or _PIECES (written a piece at a time, synchronously) */
    int ckpt_allow_changes;        /* resume a checkpoint written with another [model] or [data] */
    char resume[512];              /* "" none, "auto" RUN_DIR's newest, or a file/dir */
    char ckpt_dir[1024];           /* where checkpoints go ("" RUN_DIR/checkpoints; s3://BUCKET/PREFIX, docs/s3.md) */
    /* [s3] the object store's endpoint and region where the environment names none (docs/s3.md) */
    char s3_endpoint[512];
    char s3_region[64];
    /* [compression] (docs/compression.md) */
    int comp_method;               /* dt_comp_method */
    float comp_ratio;              /* top-k, random-k: the fraction of a piece sent, in (0, 1] */
    int comp_levels;               /* QSGD: quantization levels per sign */
    int comp_rank;                 /* PowerSGD: rank of the factors */
    int comp_error_feedback;       /* keep what was not sent and add it to the next step */
    int64_t comp_warmup_steps;     /* top-k: density ramps down to ratio over these steps; powersgd: steps sent as fp32 */
    float comp_momentum;           /* top-k: DGC momentum correction (0: off) */
    float comp_clip_norm;          /* top-k: DGC local clipping (0: off) */
    int comp_min_bytes;            /* pieces smaller than this go uncompressed */
    /* ---- GPT language models (docs/gpt.md) ----
     * [model] preset = gpt-tiny | gpt-small | gpt2-124m | gpt, with n_layer,
     * n_head, n_embd, block_size, vocab_size, padded_vocab_size overriding
     * the preset (0 = the preset's; preset "gpt" needs them all), and
     * init_from (weights to start from: safetensors or an llm.c checkpoint);
     * [data] dataset = tokens, train_file, val_file (llm.c token files);
     * [train] seq_len (0 = block_size), eval_every, eval_batches. */
    int gpt;                       /* set by validation: the model is a GPT */
    int n_layer, n_head, n_embd, block_size, vocab_size, padded_vocab_size;
    char init_from[512];
    char train_file[512], val_file[512];
    int seq_len;                   /* tokens per training sequence */
    int eval_every;                /* steps between validation losses (0 = end only) */
    int eval_batches;              /* batches per validation loss */
    /* [model] arch = llama (docs/llama.md): a Llama-style decoder on the same
     * token files (gpt is set too: a language model), presets llama-tiny,
     * llama-small, llama2-7b or llama (every size given); n_kv_head (0 =
     * n_head), ffn_hidden, rope_theta, norm_eps (0 = the preset's). */
    int arch;                      /* DT_ARCH_GPT or DT_ARCH_LLAMA */
    int n_kv_head, ffn_hidden;
    float rope_theta, norm_eps;
    /* [model] preset = dlrm (docs/recommender.md): the click model, its
     * shape from [recsys] tables, dim, dense, bottom, top; its data the
     * click logs [recsys] train and test; its tables' own optimizer
     * (table_optim: adagrad or sgd, table_lr, table_eps) and, with
     * [parallel] servers, where they live (sparse: on the servers, a row
     * range each, pulled and pushed row by row). */
    int recsys;                    /* set by validation: the model is the recommender */
    dt_dlrm_spec dlrm;
    char rs_tables[512], rs_bottom[128], rs_top[128];
    char rs_train[512], rs_test[512];
    int rs_table_optim;            /* 0 adagrad (row-wise), 1 sgd */
    float rs_table_lr, rs_table_eps;
    int rs_sparse;
    int rs_placement;              /* the rows' placement on their shards: 0 range, 1 hash (tables.h) */
    int rs_shard;                  /* who holds the rows with sparse = true: 0 the servers, 1 the workers (tensor parallel) */
} dt_config;

enum { DT_ARCH_GPT = 0, DT_ARCH_LLAMA = 1 };

/* The one number reader of configs and command-line flags. `text` must be,
 * whole, a decimal number: an optional sign, digits (no leading zeros: "010"
 * is not 8 nor 10), an optional fraction and exponent; so no hex, "inf",
 * "nan", blanks or trailing characters. The value must be finite, within
 * [lo, hi], and whole when `whole` is set. On success *out holds it; else
 * DT_ERR_CONFIG with the message "WHAT: expected ..., got 'TEXT'" (`what`
 * names the flag or "FILE:LINE: [section] key"). */
DT_API dt_status dt_parse_number(const char *what, const char *text, double lo, double hi, int whole,
                                 double *out);
/* dt_parse_number for a whole number in [0, max], exact beyond 2^53 when
 * written as plain digits (a seed such as 18000000000000000001). */
DT_API dt_status dt_parse_u64(const char *what, const char *text, uint64_t max, uint64_t *out);

/* The [compression] method's name ("none", "fp16", ...; "?" out of range). */
DT_API const char *dt_comp_method_name(int method);
/* The section of config key `key` (its first, where several sections have
 * one), or NULL when no section has it: for "did you mean --set ...". */
DT_API const char *dt_config_key_section(const char *key);
/* A device name ([train] device, --device) as a GPU index: -1 for "cpu",
 * N for "cuda:N" ("cuda": 0); -2 when it is none of those. */
DT_API int dt_device_index(const char *device);

/* Defaults for every field (the values docs/config.md lists). */
DT_API void dt_config_defaults(dt_config *c);
/* A language model's config ([model]'s sizes) as its model takes it: a
 * GPT's, or a Llama's (arch = llama). */
DT_API dt_gpt_config dt_config_gpt(const dt_config *c);
DT_API dt_llama_config dt_config_llama(const dt_config *c);

/* Loads `path` over the defaults, then applies overrides given as
 * "section.key=value" strings (the CLI's --set), then validates the whole.
 * Errors name the file and line (or "--set") and the field. */
DT_API dt_status dt_config_load(dt_config *c, const char *path, const char *const *overrides,
                                int noverrides);
/* The same from text in memory; `what` names it in errors. */
DT_API dt_status dt_config_parse(dt_config *c, const char *text, const char *what,
                                 const char *const *overrides, int noverrides);

/* The resolved config (every field, presets expanded) as INI text that
 * dt_config_parse reads back to the same struct; malloc'd, NULL when out of
 * memory. */
DT_API char *dt_config_format(const dt_config *c);
/* Writes dt_config_format's text to path atomically. */
DT_API dt_status dt_config_write(const dt_config *c, const char *path);
/* [data] shard: who reads which part of the training data file. */
enum { DT_DATA_SHARD_AUTO = 0, DT_DATA_SHARD_NONE = 1, DT_DATA_SHARD_RANKS = 2 };
/* Whether each data-parallel rank reads only its shard of the training
 * file (docs/data.md "Sharded reading"): shard = ranks; auto where the file
 * is an s3:// object and the run reads its data the data-parallel way
 * (not the balanced sampler, dynamic batches or [ps] share = dynamic; a
 * language model without tensor or pipeline parallel; not the
 * recommender); none never. */
DT_API int dt_config_data_sharded(const dt_config *c);
/* Where a run's checkpoints go, into buf[n] (returned): [checkpoint] dir
 * when set (a directory, or s3://BUCKET/PREFIX), else RUN_DIR/checkpoints,
 * else (run_dir NULL) "": none. */
DT_API const char *dt_config_ckpt_dir(const dt_config *c, const char *run_dir, char *buf, size_t n);

#ifdef __cplusplus
}
#endif
#endif
