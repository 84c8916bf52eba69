/*
 * dtrain/train.h - training and evaluation runs.
 *
 * dt_train() builds the model, data and optimizer a dt_config describes and
 * trains it, writing into the run directory:
 *   config.ini          the resolved config
 *   model.safetensors   final weights
 *   summary.json        steps, losses, evaluation metrics, time, throughput
 *   metrics/rank-NNNNN.jsonl  every rank: one JSON object per step and
 *                       evaluation (docs/observability.md)
 * and, as c's [obs] section asks, a Prometheus endpoint on rank 0 and a
 * Chrome trace file.
 */
#ifndef DTRAIN_TRAIN_H
#define DTRAIN_TRAIN_H

#include "dtrain/config.h"
#include "dtrain/data.h"
#include "dtrain/nn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What a progress callback sees, once per step. */
typedef struct {
    int64_t step, total_steps;   /* step counts from 1 */
    int epoch, epochs;
    float loss;                  /* this step's training loss */
    float lr;
    double samples_per_sec;      /* over the recent window */
    double eta_seconds;
    int is_eval;                 /* 1: an evaluation just ended (eval_* set) */
    float eval_loss, eval_accuracy; /* eval_accuracy < 0: none (language models) */
    double tokens_per_sec;       /* language models, over the recent window; else 0 */
    int workers;                 /* data-parallel ranks */
    int slowest_rank;            /* workers > 1: the rank with the longest step time */
    double slowest_step_seconds; /* its own work in the step (data + forward +
                                    backward + optimizer), not waiting for others */
    int slowest_stage;           /* a pipeline's: the slowest rank's stage; else -1 */
    int rounds;                  /* 1: the steps are federated averaging's rounds (no epochs) */
    int eval_auc;                /* 1: eval_accuracy is the area under the ROC curve (the recommender) */
} dt_progress;

typedef void (*dt_progress_fn)(const dt_progress *p, void *user);

typedef struct {
    int64_t steps;
    int epochs;                  /* epochs started */
    float final_train_loss;      /* mean over the last epoch's (or run's last) steps */
    float test_loss, test_accuracy;
    double wall_seconds;         /* whole run including data loading and evaluation */
    double train_seconds;        /* training steps only */
    double samples_per_sec;      /* training samples / train_seconds */
    int rank, workers, threads;  /* this worker, data-parallel workers, threads each */
    double comm_seconds;         /* gradient allreduce windows (first bucket
                                    started to last done), summed over steps */
    double comm_exposed_seconds; /* the part of them after backward had ended */
    int stopped;                 /* 1: stopped early on request, at a checkpoint */
    int64_t resumed_step;        /* the step a resumed run started from (0: none) */
    uint64_t bytes_sent;         /* by this rank's collectives during the training
                                    steps, as dt_comm_stats counts them (the
                                    gradients and the per-step exchange of loss
                                    and control), summed over steps */
    float loss_scale;            /* precision fp16: the dynamic loss scale at the end (else 0) */
    int64_t skipped_steps;       /* steps skipped for an inf/NaN gradient (fp16 overflow; any precision: a faulty one) */
} dt_train_result;

/* Trains as c says. run_dir (created if missing, may be NULL for no files).
 * progress may be NULL.
 *
 * Data parallel: when the process is one rank of several (started by
 * `dtrain run`, `dtrain train --workers N`, mpirun or srun; see comm.h), each
 * rank trains on its share of every global batch of c->batch samples and
 * the gradients are averaged, so the run gives the model one process would
 * (docs/data-parallel.md). Only rank 0 calls progress and writes run_dir's
 * files, except that every rank writes its own metrics log there. */
DT_API dt_status dt_train(const dt_config *c, const char *run_dir, dt_progress_fn progress,
                          void *user, dt_train_result *res);

/* Checks c against a run on W workers, as dt_train will before it builds
 * anything (the distribution strategy's own checks: a global batch of at
 * least W samples; in deterministic mode micro_shards a multiple of W);
 * DT_ERR_CONFIG naming the field otherwise. */
DT_API dt_status dt_train_check(const dt_config *c, int W);
/* Checks [train] device against this build and machine: "cpu" is always
 * there; "cuda" or "cuda:N" needs a CUDA build, a driver and the GPU, and
 * is refused naming what is missing, never run on the CPU instead
 * (docs/gpu.md). dt_train checks it first. */
DT_API dt_status dt_train_check_device(const dt_config *c);
/* What this machine offers the GPU device, a line each into out[n]: the
 * build's CUDA, the usable GPUs (or why none), cuDNN and NCCL as found at
 * run time (version and file, or why not). dtrain --version prints it. */
DT_API void dt_device_report(char *out, size_t n);

/* Whether a run of config c can take spares (--spares K, docs/checkpoints.md):
 * a spare takes a dead worker's place and its state from a surviving
 * replica, which needs a strategy whose ranks all hold the whole state
 * (data parallel, deterministic or not) or whose slices are copied to a
 * buddy rank (ZeRO, stages 1-3; dynamic batching's split is handed over),
 * or, where each rank holds state of its own (local SGD, gradient
 * compression's residuals), checkpoints that every rank goes back to; and, for
 * data parallel, whole checkpoints (a dead worker's shard of a sharded one
 * in flight would never be written); or a strategy whose ranks are let in
 * alone by their peers (dt_train_alone_from), where a spare is a restart
 * that is ready; model parallelism, whose ranks of a tensor rank hold the
 * same shard (a twin: W / tensor >= 2 workers, and no ZeRO slices). W: the
 * workers. DT_OK for spares <= 0; DT_ERR_CONFIG naming what does not fit
 * otherwise. */
DT_API dt_status dt_train_check_spares(const dt_config *c, int W, int spares);
/* The first rank whose place a new process can take while the others go on
 * (the launcher's dt_launch_params.respawn_from): the parameter servers'
 * ranks outside mode sync, from rank 1 with dynamic sharing (server 0
 * holds the hand-out of the pieces); -1 when the run's ranks are not let
 * in alone (a death is then repaired by a spare in a new generation, or
 * by a restart of the whole group). */
DT_API int dt_train_alone_from(const dt_config *c);

/* A spare's preparation while it idles: loads the data of c's model (the
 * classifiers' splits, the GPT's token files) and keeps it for this
 * process's next dt_train with the same c, so that it trains at once when it
 * takes a dead worker's place; c == NULL frees what was loaded (a spare
 * released at the end of the run). Errors are those of loading the data. */
DT_API dt_status dt_train_warm(const dt_config *c);

/* Federated averaging (docs/federated.md, `dtrain federate`): c's
 * [federated] section splits the training set over simulated clients;
 * each round a sample of them trains locally from the global model on the
 * workers of the run (under --workers or mpirun, as dt_train) and the
 * server averages their updates weighted by sample count (FedAvg, FedAvgM,
 * FedAdam; FedProx's mu; dropouts; secure aggregation). run_dir gets
 * clients.json (each client's class histogram), metrics/ (one record and
 * one evaluation per round), model.safetensors and summary.json (the test
 * accuracy of every round). In res, steps counts rounds. */
DT_API dt_status dt_federate(const dt_config *c, const char *run_dir, dt_progress_fn progress, void *user,
                             dt_train_result *res);
/* What dt_federate refuses before any work, for W workers (DT_ERR_CONFIG
 * naming the field). */
DT_API dt_status dt_federate_check(const dt_config *c, int W);

/* Asks the running dt_train (of this process) to stop after the current
 * step: every rank stops after the same step, a checkpoint is written when
 * checkpoints are on, and dt_train returns DT_OK with res->stopped = 1.
 * Async-signal-safe: the CLI calls it from its SIGUSR1 handler. */
DT_API void dt_train_request_stop(void);

/* The GPT training loop (c->gpt set; dt_train calls it for such configs):
 * random windows of seq_len+1 tokens from [data] train_file, the optimizer
 * and schedule, the validation loss over [data] val_file every eval_every
 * steps and at the end. Writes config.ini, model.safetensors (dt_gpt_save)
 * and summary.json (val_loss, val_history, tokens_per_sec, ...) into run_dir.
 * In res, test_loss is the final validation loss and test_accuracy -1;
 * progress reports sequences as samples. Data parallel as dt_train, with
 * the same options (grad_accum, deterministic, lr_scaling): each of W ranks
 * trains on its share of the same global batch of windows and the
 * gradients are averaged in buckets during backward, so the run gives the
 * model one process would (docs/gpt.md). */
DT_API dt_status dt_gpt_train(const dt_config *c, const char *run_dir, dt_progress_fn progress,
                              void *user, dt_train_result *res);
/* A GPT's loss and next-token accuracy over eval_batches batches of
 * consecutive windows of [data] val_file (train_file when there is none);
 * *n is the number of tokens. dt_eval_checkpoint calls this for GPTs, and
 * the Llama's twin for arch = llama (weights as dt_llama_load reads). */
DT_API dt_status dt_gpt_eval_checkpoint(const dt_config *c, const char *weights, float *loss,
                                        float *accuracy, int *n);
DT_API dt_status dt_llama_eval_checkpoint(const dt_config *c, const char *weights, float *loss,
                                          float *accuracy, int *n);

/* Mean loss and accuracy of m over ds, in batches of `batch`. */
DT_API dt_status dt_evaluate(dt_model *m, const dt_dataset *ds, int batch, float *loss,
                             float *accuracy);

/* Loads the test split named by c, the weights in `weights`, and evaluates. */
DT_API dt_status dt_eval_checkpoint(const dt_config *c, const char *weights, float *loss,
                                    float *accuracy, int *n);

/* What a memory check is for: a training run, dt_eval_checkpoint, or
 * sampling text from a GPT (batch 1, block_size tokens). */
typedef enum { DT_MEM_TRAIN, DT_MEM_EVAL, DT_MEM_SAMPLE } dt_mem_use;

/* Works out, from c's validated sizes and without allocating them, the
 * memory one worker needs: the model's activations for its largest batch
 * (a classifier's for min(batch, samples) rows: train.batch's micro-batch
 * or train.eval_batch, whichever is larger; a GPT's for its micro-batch x
 * seq_len tokens), parameters, gradients and optimizer state, and the data
 * (the splits as floats, the loader's buffers; token files, read whole).
 * workers: the run's data-parallel workers. starting = 1: all of them are
 * about to start on this machine (the CLI, before it starts them) and must
 * fit together; 0: this process is one of them and checks its own need.
 * dt_mem_limit() is each worker's own; the machine (dt_mem_machine()) is
 * shared by the workers starting. The program's resident memory counts
 * too. Fails with DT_ERR_NOMEM when the need exceeds either, with a
 * message naming the field behind
 * the largest part and the bytes; with the data files' errors when their
 * headers cannot be read. *model_rows (may be NULL) gets the batch rows a
 * classifier's model needs. */
DT_API dt_status dt_check_memory(const dt_config *c, dt_mem_use use, int workers, int starting,
                                 int *model_rows);

/* A worker's model-state bytes by kind ([parallel] zero, docs/zero.md). */
typedef struct {
    size_t weights, gradients, optimizer, comm;  /* comm: deterministic mode's int64 sums */
    size_t offloaded;  /* on disk ([parallel] offload = disk), not in memory: optimizer, and weights at stage 3 */
} dt_memory_kinds;

/* The model-state bytes one of W workers holds for np parameters at ZeRO
 * stage `zero` (the largest slice of dt_shard_range): fp32 weights,
 * gradients and the optimizer's states, replicated or sliced by stage, and
 * deterministic mode's fixed-point sums. Fills *k (may be NULL) and returns
 * the bytes in memory (the sum, less what is offloaded). For fp32 AdamW: 16 np at stage 0, 8 np + 8 np / W at 1,
 * 4 np + 12 np / W at 2, 16 np / W at 3 (the layers gathered at a time
 * come on top, as activations do). */
DT_API size_t dt_memory_model_state(const dt_config *c, dt_mem_use use, size_t np, int zero, int W,
                                    dt_memory_kinds *k);
/* The ZeRO stage whose model state a worker of W holds (docs/zero.md,
 * "Pages kept or given back"): c->zero, or 1 where a stage-2 or stage-3
 * rank keeps the pages of the parts of the block it does not own resident
 * (zeroed or overwritten, not given back to the kernel): on more than one
 * worker, with [parallel] zero_release = auto and no offload, when a
 * worker needing stage 1's model state (with its activations, data,
 * checkpoints and program) takes at most half its --memory-limit
 * (dt_mem_limit) and W of them at most half the machine's room
 * (dt_mem_machine, read once a process). dt_memory_worker counts that
 * stage; dt_check_memory, the least a run needs, the config's. */
DT_API int dt_memory_zero_held(const dt_config *c, int W);
/* The bytes of a training worker's activation and scratch buffers (the
 * model's, sized for its largest micro-batch or evaluation share, as
 * dt_check_memory counts them) on W workers; 0 when the data files'
 * headers cannot be read. */
DT_API size_t dt_memory_activations(const dt_config *c, int W);
/* The bytes a training worker of W needs by dt_check_memory's formula
 * (with the model state of the ZeRO stage it holds, dt_memory_zero_held):
 * activations, model state, checkpoints (the writer's snapshot, a
 * tensor-parallel run's staged slice, the weights file's pieces), data and
 * this process's resident memory now (the program's baseline); the parts
 * into *k (may be NULL). 0 when the data files' headers cannot be read. */
typedef struct {
    size_t activations, model, checkpoints, data, program, total;
    int ckpt_pieces;  /* checkpoints: a model in parts' written in pieces (dt_memory_ckpt_pieces) */
} dt_memory_need;
DT_API size_t dt_memory_worker(const dt_config *c, int W, dt_memory_need *k);
/* Whether a worker of W whose ranks keep parts of the model (tensor
 * parallel, pipeline stages keeping their layers) writes its checkpoints a
 * piece at a time, synchronously, rather than from a staged slice written
 * in the background ([checkpoint] staging, docs/checkpoints.md "Staging"):
 * staging = pieces, or auto with a cap (--memory-limit, dt_mem_limit) that
 * the formula's need with the slice exceeds (the program counted as 64
 * MiB, the same on every rank). 0 for a model not in parts. */
DT_API int dt_memory_ckpt_pieces(const dt_config *c, int W);

/* [parallel] offload = disk: offload_dir is set, a directory, and a file
 * can be created there; DT_ERR_CONFIG naming the field otherwise. (Its free
 * space is checked by dt_check_memory.) */
DT_API dt_status dt_check_offload(const dt_config *c);
/* Room on run_dir's file system for what the run writes: the checkpoints
 * it keeps on disk at once ([checkpoint] keep, and the one being written;
 * fewer where it saves fewer; those already in run_dir/checkpoints count
 * as written) and the final weights file. DT_ERR_IO with a message naming
 * the bytes where there is not. */
DT_API dt_status dt_check_disk(const dt_config *c, const char *run_dir);

/* Formats a progress line into buf: "step 120/2340 | epoch 1/10 | loss 0.4312
 * | lr 1.0e-03 | 5123 samples/s | ETA 1m02s | slowest rank 1 (12 ms)". */
DT_API void dt_progress_format(const dt_progress *p, char *buf, size_t n);
/* The same as one line of JSON: {"type":"step"|"eval", "step": ..., ...}
 * (docs/observability.md lists the keys). */
DT_API void dt_progress_format_json(const dt_progress *p, char *buf, size_t n);

/* Writes a self-contained HTML report (inline SVG charts: loss and
 * accuracy, throughput, per-rank time by phase, stragglers) of the run in
 * run_dir, from its metrics logs (metrics/rank-*.jsonl) and summary.json,
 * to out_path. Errors name the file and line of bad input. */
DT_API dt_status dt_report_html(const char *run_dir, const char *out_path);

/* ---- the scaling simulator (dtrain simulate) -------------------------------
 * Predicts the step time of data-parallel training on many hosts from a
 * profiled run and an alpha-beta model of the collectives, on CPU hosts
 * (ranks over shared memory) or GPU hosts (gpus_per_host > 0: NVLink
 * inside, a NIC a GPU between hosts):
 *
 *   dt_sim_profile p;
 *   dt_sim_profile_load("runs/gpt", &p);          // a finished dtrain train run
 *   dt_sim_params s = {.hosts = 64, .ranks_per_host = 1, .link_bytes_per_s = 12.5e9,
 *                      .link_latency_s = 5e-6, .host_bytes_per_s = 5e9};
 *   dt_sim_point o;
 *   dt_sim_predict(&p, &s, &o);                    // o.step_s, o.samples_per_s */
#define DT_SIM_MAX_LAYERS 512
typedef struct {
    double compute_s;      /* forward + backward seconds per sample on one rank */
    double backward_share; /* backward's part of compute_s (what buckets overlap) */
    double data_s;         /* data loading seconds per sample */
    double optimizer_s;    /* optimizer seconds per step, all parameters */
    double params;         /* parameter count */
    int batch, workers;    /* the profiled run's global batch and ranks */
    double bucket_bytes;   /* its gradient bucket ([parallel] bucket_kb) */
    int device;            /* 1: a device run's (compute_s is its whole step) */
    int layers;            /* the layers timed one by one (0: none; the planner then splits
                              compute_s by FLOPs) */
    double layer_forward_s[DT_SIM_MAX_LAYERS], layer_backward_s[DT_SIM_MAX_LAYERS];
                           /* [layers]: each layer's seconds per sample, alone on a micro-batch
                              (a GPT's first with the embedding, its last with the head and loss) */
} dt_sim_profile;

/* Reads the profile from run_dir: the median per-phase times of rank 0's
 * step records (metrics/rank-00000.jsonl, after two warm-up steps),
 * summary.json's params, batch and workers and, where the run timed its
 * layers ([train] time_layers), their times over the samples they ran
 * (layer_times; none where there are more than DT_SIM_MAX_LAYERS),
 * config.ini's bucket_kb. A device run's (summary.json's "gpu") phases
 * are the host's launch times, so its compute_s is its whole step
 * (step_seconds; optimizer and data in it: optimizer_s and data_s 0) and
 * its backward_share 2/3, backward's FLOPs; one of several ranks is
 * refused (DT_ERR_FORMAT: its exchange, which waits for backward's
 * kernels, cannot be told from its compute). */
DT_API dt_status dt_sim_profile_load(const char *run_dir, dt_sim_profile *out);

/* The profile of a model of `params` parameters from p's of another:
 * compute per sample times params / p->params (6 x params FLOPs a token,
 * attention's sequence-length term left out), the optimizer too, and the
 * exchange of params gradients. */
DT_API void dt_sim_profile_scale(dt_sim_profile *p, double params);

typedef struct {
    int hosts, ranks_per_host;
    double link_bytes_per_s, link_latency_s; /* each host's link (GPU hosts: each GPU's NIC) */
    double host_bytes_per_s;                 /* shared memory inside a host */
    double host_latency_s;                   /* each collective's fixed cost inside a host (0: none) */
    int gpus_per_host;                       /* G > 0: GPU hosts, a rank a GPU (ranks_per_host, host_*
                                                unused); 0: CPU hosts */
    double nvlink_bytes_per_s;               /* GPU hosts: each GPU's NVLink rate, one direction */
    double nvlink_latency_s;                 /* ... and a ring step's latency on it */
    int grad_bytes;                          /* bytes a gradient on the wire: 4 (fp32, also 0) or 2 */
    int zero;                                /* 1: ZeRO (reduce-scatter + allgather,
                                                optimizer on 1/N); 0: dp (allreduce) */
    int weak;                                /* keep the profiled batch per rank;
                                                0: keep the global batch */
} dt_sim_params;

typedef struct {
    int ranks;
    double local_batch; /* samples per rank per step */
    double compute_s;   /* data + forward + backward */
    double comm_s;      /* the gradient exchange: shm inside hosts + between hosts */
    double exposed_s;   /* the part of comm_s not hidden behind backward */
    double step_s, samples_per_s;
    const char *algo;   /* between hosts: "ring", "rhd", "tree" or "none" (static) */
} dt_sim_point;

/* The predicted step: compute scales with the local batch; the allreduce
 * of grad_bytes x params bytes (dt_sim_allreduce) once per gradient
 * bucket; buckets hide it behind backward except the last. */
DT_API void dt_sim_predict(const dt_sim_profile *p, const dt_sim_params *s, dt_sim_point *out);

/* The model's time of one allreduce of S = `bytes` over s's hosts and
 * ranks (what dt_sim_predict charges for the gradients). Between h hosts
 * the cheapest of ring (2(h-1) alpha + 2(h-1)/h S/beta), recursive
 * halving-doubling (2 log2 h alpha + 2(h-1)/h S/beta) and tree
 * (2 log2 h (alpha + S/beta)) on the link. CPU hosts (hier): that on S,
 * plus 2 x (host_latency_s + S / host_bytes_per_s) inside a host (reduce
 * to the leader, broadcast back). GPU hosts (NCCL's hierarchy): a ring
 * reduce-scatter and allgather over NVLink inside a host, 2(G-1)
 * (alpha_nv + S / (G beta_nv)), and between hosts the cheapest of the
 * three on each GPU's S/G over its own NIC, all G at once. *algo (if not
 * NULL) gets the algorithm between hosts ("none" for one host). */
DT_API double dt_sim_allreduce(double bytes, const dt_sim_params *s, const char **algo);
/* The ranks of one of s's hosts: its GPUs, else ranks_per_host (at least 1). */
DT_API int dt_sim_host_ranks(const dt_sim_params *s);

/* An HTML page at path (written atomically): title, body_html (the caller
 * escapes what it puts there; a table, say) and a line chart of ns <= 10
 * series named names[k] with values y[k][0..n-1] over x[0..n-1]. */
DT_API dt_status dt_sim_html(const char *path, const char *title, const char *body_html, const char *xlabel,
                             const char *ylabel, const char *const *names, const double *x,
                             const double *const *y, int ns, int n);

/* ---- the planner (dtrain plan, dtrain train --plan auto) -------------------
 * Every layout of a run on W workers that the strategies accept
 * (dt_train_check), its memory by dt_memory_worker's formula (the start
 * check's) and its step time by the simulator (dt_sim_predict for the
 * data-parallel exchange, on top of a model of tensor and pipeline
 * parallelism from the profile's measured per-sample time, split over the
 * layers by their measured times, or by their FLOPs where the profile has
 * none; docs/plan.md):
 *
 *   dt_plan_params s = dt_plan_default_params(4);   // 4 workers on this host
 *   dt_plan_row *rows; int n, nfit;
 *   dt_plan_rank(&cfg, &profile, &s, (size_t)1 << 30, &rows, &n, &nfit);
 *   dt_plan_apply(&cfg, &rows[0].l);                 // the fastest that fits
 *   free(rows); */
typedef struct {
    int zero;           /* [parallel] zero */
    int tensor, pipeline;
    int micro_batches;  /* [parallel] micro_batches (0: the strategy's default) */
    int schedule;       /* [parallel] schedule: 0 gpipe, 1 1f1b */
    int recompute;      /* [train] recompute (a GPT's blocks) */
    int bucket_kb;      /* [parallel] bucket_kb */
    int codec;          /* [compression] method (dt_comp_method) */
} dt_layout;

typedef struct {
    int workers, hosts;    /* W ranks on `hosts` hosts, W / hosts on each */
    int cores;             /* each host's cores (this machine's) */
    int threads;           /* each rank's threads (what the profile was measured with) */
    double link_bytes_per_s, link_latency_s;  /* between hosts */
    double host_bytes_per_s, host_latency_s;  /* inside a host (shared memory) */
    int lossy;             /* also the lossy gradient codecs fp16, bf16 and int8 */
    double memory_extra;   /* bytes a worker holds beyond the formula (measured: the calibration
                              run's peak less its formula), added to every layout's */
} dt_plan_params;

/* W workers on one host of this machine's cores, one thread a core
 * shared out, a 10 Gbit/s 50 us link, shared memory at 5 GB/s and 20 us a
 * collective, no lossy codecs. */
DT_API dt_plan_params dt_plan_default_params(int workers);

typedef struct {
    dt_layout l;
    double step_s;     /* predicted step time */
    double compute_s;  /* ... of it the replica's compute (bubbles, tensor-parallel exchanges included) */
    double exposed_s;  /* ... the data-parallel exchange not hidden behind backward */
    size_t formula;    /* the busiest rank's bytes by dt_memory_worker (the start check's formula) */
    size_t memory;     /* formula + memory_extra: its predicted peak */
    int fits;          /* memory <= the limit (and the ranks on a host x memory <= this machine's) */
} dt_plan_row;

/* Ranks every layout of c (its model, data, batch and optimizer kept) on
 * s->workers: *rows (malloc'd, the caller frees) gets the *n layouts the
 * strategies accept, the *nfit that fit in `limit` bytes a worker first,
 * fastest first, then the rest, smallest first. limit 0: no limit of the
 * worker's own. p: the model's profile, its per-sample times measured with
 * s->threads threads; its layer times count where it has as many as the
 * model's layers (a GPT's n_layer blocks, a sequential model's layers). DT_ERR_CONFIG, naming why, when no layout is
 * accepted on that many workers (a batch they cannot divide, say). */
DT_API dt_status dt_plan_rank(const dt_config *c, const dt_sim_profile *p, const dt_plan_params *s, size_t limit,
                              dt_plan_row **rows, int *n, int *nfit);

/* Sets l's fields in c. */
DT_API void dt_plan_apply(dt_config *c, const dt_layout *l);

/* The --set options (" --set parallel.zero=2 ...") that turn `base`'s
 * layout into l, into out; l's fields that base already has are left out. */
DT_API void dt_plan_sets(const dt_config *base, const dt_layout *l, char *out, size_t len);

/* l in words: "zero 2, tensor 1, pipeline 2 x 4 micro-batches 1f1b, ...". */
DT_API void dt_plan_describe(const dt_layout *l, char *out, size_t len);

#ifdef __cplusplus
}
#endif
#endif
