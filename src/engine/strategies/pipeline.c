/* Model parallel, the "model-parallel" strategy (strategy.h;
 * docs/model-parallel.md): tensor parallel and pipeline parallel of the
 * GPT and of sequential models (the classifier's MLP and CNN), with data
 * parallel outside them.
 *
 * [parallel] tensor = T splits the model over T ranks (its shards, made by
 * the task, whose sums run on its shard's group: the GPT's every layer,
 * dtrain/gpt.h, heads, MLP units and vocabulary divided, two allreduces a
 * layer each way; a sequential model's pairs of linear and conv2d layers split over channels,
 * dtrain/nn.h, one allreduce a pair each way).
 * [parallel] pipeline = P cuts the GPT's n_layer blocks or a sequential
 * model's layers into P contiguous stages, pipeline_split = "a,b,..." layers
 * per stage, or else balanced ([parallel] pipeline_balance): by each
 * layer's forward and backward timed before the first step (measure_layers,
 * the default), by forward FLOPs from the shapes (dt_model_layer_costs; the
 * GPT's blocks cost the same) or by count. The embedding (the images) runs
 * on the first stage, the head and the loss on the last. The
 * W workers form D = W / (T P) data-parallel replicas, laid out as Megatron
 * does, tensor innermost, then data, then pipeline:
 *
 *   rank = (stage * D + replica) * T + t
 *
 * Sub-communicators (dt_comm_split, each with the world's timeouts and
 * checks): the T ranks of (stage, replica) run one shard group and the W /
 * T ranks of tensor rank t hold the same shard of the parameters, over
 * which the gradients are summed (both made by the task, which splits its
 * model; task.h); the P ranks of (replica, t) run one pipeline, rank in it
 * = stage (this file's).
 *
 * A step cuts the replica's share of the global batch into M =
 * micro_batches micro-batches and runs them through the stages, activations
 * (the GPT's [len,T,C], a sequential model's layer output) forward and
 * their gradients backward by dt_isend/dt_irecv, in one of three
 * schedules: "gpipe" (all forwards, then all backwards: M activation sets
 * alive on every stage), "1f1b" (P - s - 1 warm-up forwards on stage s,
 * then one forward and one backward in turn, then the rest of the
 * backwards: at most P - s sets alive) or "interleaved" (Megatron's, V
 * chunks of layers a stage: plan_ops). Each micro-batch has its own
 * activation set from the task's stage calls (task.h). With P = 1 the
 * one stage runs the M micro-batches one after the other.
 *
 * Parameters: a stage keeps only its layers (pp_layout cuts the stages
 * before any parameter is set, timing the layers on a scratch
 * micro-batch; the task's hold keeps its chunks' layers: a GPT's blocks,
 * with the embedding on the first stage and the final layernorm and the
 * tied wte on the last): its blocks keep the whole model's layout but only
 * its ranges are touched. sync() sums those ranges over the stage's replicas (dp) and
 * the tied wte's two parts between the end stages (tie); the update goes
 * range by range; evaluation gathers the other stages' layers one at a
 * time through the layer hook (params_needed). A stage of one replica
 * with spares keeps its shard's whole block instead: it computes the
 * gradients of its own layers only (the others stay zero), and sync()
 * sums the block over the W / T ranks of the same shard (which adds the
 * tied embedding's parts). Under ZeRO-1 the kept ranges (the tied wte on
 * its own) are cut into D slices, one a replica: sync() reduces each
 * slice onto its replica (a reduce-scatter over dp), the update is the
 * rank's slices', then allgathered over dp (zero_units). Over the replicas the sum is the
 * global mean (gradients carry the weight len / global). The norm adds
 * each range's one holder's squares over the replica (the split tensors of
 * every shard, the whole ones of shard 0). Checkpoints of a model in parts
 * (shards, or stages that keep their layers) hold the whole model's
 * tensors, a slice a rank, assembled a piece at a time (ckpt_stage), or,
 * [checkpoint] staging = pieces, written a piece at a time with no slice
 * (ckpt_save: docs/checkpoints.md "Staging").
 *
 * The loss: only the last stage's tensor rank 0 reports it; the others add
 * 0 to the control plane's sum, which divides by the global batch.
 *
 * Deterministic mode: the micro-batches are the global batch's micro_shards
 * fixed pieces (micro_shards / D a replica), each one's gradient goes into
 * int64 fixed point on its own (dp_det.c's sums) and sync() adds them with
 * an int64 allreduce: bitwise the same for any D and schedule. */
#include "dtrain/llama.h"
#include "engine/device.h"
#include "engine/strategies/strategy.h"
#include "engine/worker.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_STAGES 1024

typedef struct {
    dt_task_stage *st;
    float *in, *out, *d;   // the stream into and out of the stage, the gradient of out (d owned)
    float *din;            // the gradient of in, as the last backward left it
    size_t in_count, out_count, cap; // floats of the current micro-batch's streams; d's room
    dt_request_t send_out, send_d;
} slot;

// One virtual stage on this rank (V = 1: the rank's stage): layers [l0, l1)
// and an activation set per micro-batch it can have alive.
typedef struct {
    int l0, l1, vstage;    // vstage = chunk x P + stage, of P x V
    int nslots;
    slot *slots;
} chunk;

// The four ways of a stage's streams: activations to the next stage and
// from the previous one, gradients to the previous one and from the next.
// Each a communicator and the peer's rank in it: on the CPU the pipeline's
// (pp, ppb); on a device one of the GPUs' communicators of a pair of
// stages, a way each (dev_links).
enum { ACT_OUT, ACT_IN, GRAD_OUT, GRAD_IN, WAYS };
typedef struct {
    dt_comm_t c;
    int peer;
} way;

// A step's work on this rank, in order: forward (fwd = 1) or backward of
// micro-batch mb on chunk v.
typedef struct {
    int fwd, v, mb;
} op;

typedef struct {
    dt_strategy base;
    int T, P, V, D, M, gpipe;
    int t, stage, replica;
    dt_comm_t pp;          // this replica's stages, rank = stage: activations (and with V = 1 gradients)
    dt_comm_t ppb;         // V > 1: the same ranks, for the gradients (both ways between a pair)
    dt_comm_t shard;       // the ranks of this tensor rank (the task's; T = 1: the world)
    dt_comm_t tp;          // this (stage, replica)'s tensor ranks (the task's; T > 1)
    dt_comm_t rep;         // this replica's T x P ranks, which hold one copy of the model (checkpoints, the norm)
    dt_comm_t dp;          // the ranks of this (stage, t): the replicas, which hold the same layers
    dt_comm_t tie;         // P > 1, the first and the last stage of (replica, t): the tied embedding's two parts
    way ways[WAYS];        // the streams' transfers (ACT_OUT, ...)
    dt_comm_t pair[2];     // on a device: the pairs of stages this rank is in (host communicators) ...
    dt_comm_t gpus[WAYS];  // ... and the GPUs' communicators over them, a way each
    int tied;              // both keep the order's first range (a tied head's, s->tied): summed over tie
    const dt_grad_range *held; // the layers' ranges of the block this rank keeps (the task's hold), nheld;
    int nheld;             // NULL: the whole block
    int evaluating;        // between params_eval(1) and (0): other stages' layers gathered for a whole forward
    int gathered;          // the layer gathered last (DT_GPT_EMBED - 1: none)
    dt_grad_range all;     // [0, n)
    const dt_task_ops *tops;
    chunk *ch;             // [V]
    op *ops;               // [2 M V]
    dt_obs_span *spans;    // [2 M V]: the last step's, for its schedule record
    int warm;              // forwards before the first backward
    int *off, *len;        // this step's micro-batches, in the global batch
    double t_compute, t_wait;
    int alive, peak;
    int64_t steps;
    int64_t *acc;          // deterministic: the fixed-point sums of this rank's micro-batches' gradients (on a
                           // device: dacc's base, the device's)
    int *bounds;           // [P V + 1]: the first layer of each virtual stage
    int measure;           // the cut waits for the layers' times, measured at the first step
    double *layer_cost;    // [layers]: each layer's measured seconds (when measured)
    // [parallel] zero = 1: the kept ranges (the tied range on its own) are
    // the units, each cut over the D replicas (dt_shard_range of its length);
    // replica r keeps slice r of each (mine: this rank's), its optimizer state
    // and its gradient sum.
    dt_grad_range *units, *mine; // [nunits] each
    int nunits;
    size_t *zc, *zd;       // [D] each: one unit's slices, for its allgatherv
    uint64_t grad_bytes;   // what the gradient sums (sync) sent so far
    // On a device (dev_sums): the gradients' sums over GPUs' communicators
    // made over sum_over()'s and tie's ranks, deterministic mode's
    // fixed-point sums and grad_dtype's bf16 copy of the gradients (blocks
    // backed on the kept ranges), the norm's pieces' sums of squares.
    dt_comm_t gsum, gtie;
    dt_dev_vm dacc, dwire;
    double *dsq;           // [1 + norder x (nunits or 1)] device doubles: the step's losses (the last stage's,
                           // loss_add), the norm's pieces after them, read together
    uint64_t reads0, reads; // the device's reads at this step's start, and between steps' starts and updates
    int64_t updates;
    double norm;           // the norm grads_nonfinite made (have_norm), which grad_norm returns
    int have_norm;
    dt_status err;         // abandon's failure, said by regroup (errmsg)
    char errmsg[512];
} pipe;

// Deterministic mode cuts the global batch into micro_shards fixed pieces,
// micro_shards / D of them on each replica, whatever D is.
static int micro_batches(const dt_config *c, int W) {
    if (c->deterministic) {
        int D = W / (c->tensor * c->pipeline);
        return D > 0 ? c->micro_shards / D : c->micro_shards;
    }
    return c->micro_batches > 0 ? c->micro_batches : c->pipeline;
}
// The field that gives the layers the stages divide (dt_task_layers).
static const char *layers_field(const dt_config *c) { return c->gpt ? "[model] n_layer" : "[model] layer = ... lines"; }
static int virtual_stages(const dt_config *c) { return c->pipeline_schedule == 2 ? c->virtual_stages : 1; }

// (strategy.h) best(k, j): the least largest part of the first j layers in
// k stages, over the last stage's first layer i; the smallest such i.
dt_status dt_pipeline_balance(const double *costs, int L, int P, int *bounds) {
    if (P < 1 || P > L) return dt_error(DT_ERR_ARG, "pipeline: %d stages for %d layers", P, L);
    double *best = malloc(sizeof(double) * (size_t)(L + 1) * (size_t)(P + 1)), *pre = malloc(sizeof(double) * (size_t)(L + 1));
    int *cut = malloc(sizeof(int) * (size_t)(L + 1) * (size_t)(P + 1));
    if (!best || !pre || !cut) {
        free(best), free(pre), free(cut);
        return dt_error(DT_ERR_NOMEM, "pipeline: out of memory balancing the stages");
    }
#define AT(a, k, j) a[(size_t)(k) * (size_t)(L + 1) + (size_t)(j)]
    pre[0] = 0;
    for (int j = 0; j < L; j++) pre[j + 1] = pre[j] + costs[j];
    for (int j = 1; j <= L; j++) AT(best, 1, j) = pre[j], AT(cut, 1, j) = 0;
    for (int k = 2; k <= P; k++)
        for (int j = k; j <= L; j++) {
            AT(best, k, j) = -1;
            for (int i = k - 1; i < j; i++) {
                double v = AT(best, k - 1, i) > pre[j] - pre[i] ? AT(best, k - 1, i) : pre[j] - pre[i];
                if (AT(best, k, j) < 0 || v < AT(best, k, j)) AT(best, k, j) = v, AT(cut, k, j) = i;
            }
        }
    bounds[P] = L;
    for (int k = P; k >= 1; k--) bounds[k - 1] = AT(cut, k, bounds[k]);
#undef AT
    free(best), free(pre), free(cut);
    return DT_OK;
}

// Measured balance: used unless pipeline_split lists the stages, and not in
// deterministic mode, whose results must not depend on a run's timings (the
// FLOPs / count cut stands in: the same in every run), nor on a GPU (whose
// layers are not timed before the start).
static int measured_balance(const dt_config *c) {
    return c->pipeline_balance == DT_BALANCE_MEASURED && !c->pipeline_split[0] && !c->deterministic &&
           c->pipeline * virtual_stages(c) > 1 && dt_device_index(c->device) < 0;
}

// How the stages were cut, for the start lines, the metrics log and summary.json.
static const char *balance_name(const dt_config *c, int measured) {
    if (c->pipeline_split[0]) return "pipeline_split";
    if (measured) return "measured";
    int flops = c->pipeline_balance != DT_BALANCE_COUNT && !c->gpt;
    return flops ? "flops" : "count";
}

// The first layer of each (virtual) stage, bounds[0..P V] (bounds[P V] =
// the layers): from pipeline_split; else from the layers' measured costs
// when given (measure_layers); else by count (pipeline_balance = count, and
// the GPT's blocks, which cost the same) or a sequential model's layers by
// their forward FLOPs (dt_model_layer_costs).
static dt_status stage_bounds(const dt_config *c, const double *measured, int *bounds) {
    int P = c->pipeline * virtual_stages(c), L = dt_task_layers(c);
    if (!c->pipeline_split[0] && measured) return dt_pipeline_balance(measured, L, P, bounds);
    if (!c->pipeline_split[0] && (c->gpt || c->pipeline_balance == DT_BALANCE_COUNT)) {
        for (int s = 0; s <= P; s++) bounds[s] = (int)((long)L * s / P);
        return DT_OK;
    }
    if (!c->pipeline_split[0]) {
        if (P > L) return dt_error(DT_ERR_CONFIG, "pipeline: %d stages for %d layers", P, L);
        double *costs = malloc(sizeof(double) * (size_t)L);
        if (!costs) return dt_error(DT_ERR_NOMEM, "pipeline: out of memory");
        dt_status st = dt_model_layer_costs(c->input, c->layers, L, costs);
        if (st == DT_OK) st = dt_pipeline_balance(costs, L, P, bounds);
        free(costs);
        return st;
    }
    char buf[sizeof c->pipeline_split];
    snprintf(buf, sizeof buf, "%s", c->pipeline_split);
    int n = 0, sum = 0;
    bounds[0] = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        double v;
        char what[64];
        snprintf(what, sizeof what, "[parallel] pipeline_split entry %d", n + 1);
        while (*tok == ' ') tok++;
        for (char *e = tok + strlen(tok); e > tok && e[-1] == ' ';) *--e = 0;
        dt_status st = dt_parse_number(what, tok, 1, 1024, 1, &v);
        if (st != DT_OK) return dt_error(st, "%s (layers of a stage, as in \"1,3\")", dt_last_error());
        if (++n > P) break;
        sum += (int)v;
        bounds[n] = sum;
    }
    if (n != P)
        return dt_error(DT_ERR_CONFIG, "[parallel] pipeline_split = \"%s\" gives %s%d stages; pipeline = %d%s needs %d",
                        c->pipeline_split, n > P ? "more than " : "", n > P ? P : n, c->pipeline,
                        P > c->pipeline ? " x virtual_stages" : "", P);
    if (sum != L)
        return dt_error(DT_ERR_CONFIG, "[parallel] pipeline_split = \"%s\" adds up to %d layers; the model has %d (%s)",
                        c->pipeline_split, sum, L, layers_field(c));
    return DT_OK;
}

static int pp_wants(const dt_config *c) { return c->pipeline > 1 || c->tensor > 1; }

static dt_status pp_check(const dt_config *c, int W) {
    int T = c->tensor, P = c->pipeline, M = micro_batches(c, W), L = dt_task_layers(c);
    const char *what = P > 1 ? "[parallel] pipeline" : "[parallel] tensor";
    int v = P > 1 ? P : T;
    const char *mname = c->deterministic ? "micro_shards / data-parallel replicas" : "micro_batches";
    if (c->deterministic) {
        int D = W / (T * P);
        if (c->micro_batches > 0)
            return dt_error(DT_ERR_CONFIG, "[parallel] micro_batches = %d with deterministic = true: the micro-batches are the global batch's [parallel] micro_shards = %d fixed pieces, micro_shards / data-parallel replicas on each; leave micro_batches unset",
                            c->micro_batches, c->micro_shards);
        if (D > 0 && W % (T * P) == 0 && c->micro_shards % D)
            return dt_error(DT_ERR_CONFIG, "[parallel] micro_shards (%d) must be a multiple of the %d data-parallel replicas in deterministic mode (workers %d / (tensor %d x pipeline %d))",
                            c->micro_shards, D, W, T, P);
    }
    if (c->grad_accum > 1)
        return dt_error(DT_ERR_CONFIG, "%s = %d with [train] grad_accum = %d: use [parallel] micro_batches for the micro-batches of a model-parallel step",
                        what, v, c->grad_accum);
    if (P > L)
        return dt_error(DT_ERR_CONFIG, "[parallel] pipeline = %d stages is more than the model's %d layers (%s)", P, L,
                        layers_field(c));
    int V = c->virtual_stages;
    if (c->pipeline_schedule == 2) {
        if (P < 2 || V < 2)
            return dt_error(DT_ERR_CONFIG, "[parallel] schedule = interleaved needs pipeline >= 2 and virtual_stages >= 2 (pipeline = %d, virtual_stages = %d)",
                            P, V);
        if (P * V > L)
            return dt_error(DT_ERR_CONFIG, "[parallel] pipeline = %d x virtual_stages = %d = %d virtual stages is more than the model's %d layers (%s)",
                            P, V, P * V, L, layers_field(c));
        if (M % P)
            return dt_error(DT_ERR_CONFIG, "[parallel] %s = %d is not a multiple of pipeline = %d; schedule = interleaved runs them in groups of one per stage",
                            mname, M, P);
    } else if (V > 1)
        return dt_error(DT_ERR_CONFIG, "[parallel] virtual_stages = %d needs schedule = interleaved", V);
    if (T > 1 && !c->gpt) {
        dt_status st = dt_model_tensor_parallel_check(c->layers, c->nlayers, T, "[parallel] tensor");
        if (st != DT_OK) return st;
    }
    if (T > 1 && c->gpt && c->arch == DT_ARCH_LLAMA) {
        dt_llama_config lc = dt_config_llama(c);
        if (dt_llama_tensor_parallel_check(&lc, T, "[parallel] tensor") != DT_OK)
            return dt_error(DT_ERR_CONFIG, "%s", dt_last_error());
    } else if (T > 1 && c->gpt) {
        dt_gpt_config gc = dt_config_gpt(c);
        dt_status st = dt_gpt_tensor_parallel_check(&gc, T, "[parallel] tensor");
        if (st != DT_OK) return dt_error(DT_ERR_CONFIG, "%s", dt_last_error());
    }
    if (W % (T * P))
        return T == 1 ? dt_error(DT_ERR_CONFIG, "[parallel] pipeline = %d does not divide the %d workers (data parallel = workers / pipeline)",
                                 P, W)
                      : dt_error(DT_ERR_CONFIG, "[parallel] tensor = %d x pipeline = %d = %d ranks a replica do not divide the %d workers (data parallel = workers / (tensor x pipeline))",
                                 T, P, T * P, W);
    if (c->pipeline_schedule >= 1 && M < P)
        return dt_error(DT_ERR_CONFIG, "[parallel] %s = %d is fewer than the pipeline's %d stages; schedule = %s needs at least one per stage",
                        mname, M, P, c->pipeline_schedule == 1 ? "1f1b" : "interleaved");
    int D = W / (T * P);
    if (c->batch / D < M)
        return dt_error(DT_ERR_CONFIG, "[train] batch %d over %d data-parallel replica%s leaves %d samples, fewer than [parallel] %s = %d",
                        c->batch, D, D > 1 ? "s" : "", c->batch / D, mname, M);
    if (P * virtual_stages(c) > MAX_STAGES)
        return dt_error(DT_ERR_CONFIG, "[parallel] pipeline x virtual_stages = %d: at most %d", P * virtual_stages(c), MAX_STAGES);
    int bounds[MAX_STAGES + 1];
    dt_status st = stage_bounds(c, NULL, bounds);
    for (int s = 0; s < P * virtual_stages(c) && st == DT_OK; s++)
        if (bounds[s + 1] <= bounds[s])
            st = dt_error(DT_ERR_CONFIG, "[parallel] pipeline stage %d has no layers", s);
    return st;
}

static int pp_max_micro(const dt_config *c, int W) {
    if (c->deterministic) return (c->batch + c->micro_shards - 1) / c->micro_shards;  // (the same for any W)
    int TP = c->tensor * c->pipeline, D = W / TP > 0 ? W / TP : 1, M = micro_batches(c, W);
    int share = (c->batch + D - 1) / D;
    return (share + M - 1) / M;
}

// The layout, on rank 0: the formula and, for a small world, every rank.
static void print_layout(pipe *p) {
    char ranks[1024] = "";
    int W = p->base.world;
    size_t n = 0;
    for (int r = 0; r < W && W <= 64 && n < sizeof ranks - 40; r++)
        n += (size_t)snprintf(ranks + n, sizeof ranks - n, "%s%d=(t%d,d%d,p%d)", r ? " " : "", r, r % p->T,
                              r / p->T % p->D, r / p->T / p->D);
    dt_log(DT_LOG_INFO,
           "model parallel: tensor %d x data %d x pipeline %d = %d workers, rank = (stage x %d + replica) x %d + tensor rank (tensor innermost, then data, then pipeline)%s%s",
           p->T, p->D, p->P, W, p->D, p->T, *ranks ? "; ranks " : "", ranks);
}

// The stages, once cut (at start, or after measuring): on rank 0 the
// schedule, each stage's layers and, measured, the layers' and the stages'
// costs; on every rank a "pipeline_split" record of its metrics log.
static void print_stages(pipe *p) {
    const int *bounds = p->bounds;
    const dt_config *c = p->base.c;
    int L = dt_task_layers(c), S = p->P * p->V;
    const char *how = balance_name(c, p->layer_cost != NULL);
    if (S > 1) dt_obs_pipeline_split(p->base.obs, how, bounds, S, p->layer_cost, L);
    if (p->base.rank != 0) return;
    char layers[512] = "";
    size_t n = 0;
    for (int k = 0; k < S && n < sizeof layers - 32; k++)
        n += (size_t)snprintf(layers + n, sizeof layers - n, "%s%d: [%d, %d)", k ? ", " : "", k, bounds[k], bounds[k + 1]);
    char virt[128] = "";
    if (p->V > 1) snprintf(virt, sizeof virt, " x %d virtual stages (stage s runs virtual stages s, s + %d, ...)", p->V, p->P);
    const char *why = S == 1                            ? ""
                      : !strcmp(how, "pipeline_split") ? " (as pipeline_split sets them)"
                      : !strcmp(how, "measured")       ? " (balanced by measured time)"
                      : !strcmp(how, "flops")          ? " (balanced by forward FLOPs)"
                                                       : " (balanced by layer count)";
    dt_log(DT_LOG_INFO, "model parallel: schedule %s%s, %d micro-batches; layers of %sstage %s%s",
           p->gpipe ? "gpipe" : p->V > 1 ? "interleaved 1f1b" : "1f1b", virt, p->M, p->V > 1 ? "virtual " : "", layers,
           why);
    if (!p->layer_cost) return;
    char lc[1024] = "", sc[512] = "";
    n = 0;
    for (int l = 0; l < L && n < sizeof lc - 32; l++)
        n += (size_t)snprintf(lc + n, sizeof lc - n, "%s%d: %.3f", l ? ", " : "", l, p->layer_cost[l] * 1e3);
    n = 0;
    for (int k = 0; k < S && n < sizeof sc - 32; k++) {
        double sum = 0;
        for (int l = bounds[k]; l < bounds[k + 1]; l++) sum += p->layer_cost[l];
        n += (size_t)snprintf(sc + n, sizeof sc - n, "%s%d: %.3f", k ? ", " : "", k, sum * 1e3);
    }
    char same[96] = "";
    if (c->gpt && L > 3)
        snprintf(same, sizeof same, " (layers 0, 1 and %d timed, the others cost layer 1's: the blocks are alike)", L - 1);
    dt_log(DT_LOG_INFO,
           "model parallel: measured forward + backward of one micro-batch, ms (median of %d, the largest over the %d ranks); layers %s; %sstages %s%s",
           DT_TASK_TIME_REPS, p->base.world, lc, p->V > 1 ? "virtual " : "", sc, same);
}

// A step's order of work on stage s (Megatron's schedules). gpipe: every
// forward, then every backward. 1f1b: P - s - 1 forwards, then a forward
// and a backward in turn, then the rest of the backwards. Interleaved
// (V > 1): the M V forwards run micro-batches in groups of P, each group
// through chunk 0, then chunk 1, ...; the backwards the same groups through
// the chunks from the last; (P - s - 1) x 2 + (V - 1) x P forwards first.
static void plan_ops(pipe *p) {
    int M = p->M, V = p->V, P = p->P, n = M * V, s = p->stage;
    int warm = p->gpipe ? n : V == 1 ? P - s - 1 : (P - s - 1) * 2 + (V - 1) * P;
    if (warm > n) warm = n;
    p->warm = warm;
    int k = 0, f = 0, b = 0;
#define FWD(i) (op){1, (i) / P % V, (i) / (P * V) * P + (i) % P}
#define BWD(i) (op){0, V - 1 - (i) / P % V, (i) / (P * V) * P + (i) % P}
    while (f < warm) p->ops[k++] = FWD(f), f++;
    while (f < n) {
        p->ops[k++] = FWD(f), f++;
        p->ops[k++] = BWD(b), b++;
    }
    while (b < n) p->ops[k++] = BWD(b), b++;
#undef FWD
#undef BWD
}

// The stages before and after this one's chunk in the chain of P x V
// virtual stages (virtual stage j runs on stage j mod P).
static int prev_stage(const pipe *p) { return (p->stage + p->P - 1) % p->P; }
static int next_stage(const pipe *p) { return (p->stage + 1) % p->P; }

// On a device (P > 1): the streams between stages on the GPUs'
// communicators (comm/device.h: NCCL where every rank has a GPU of its own,
// else staged through pinned host memory), a way each. Pair j is stages j
// and j + 1 (mod P: the last and the first, interleaved's only), j its
// first rank, the sender of activations. NCCL's send waits on the GPU for
// its receive and a communicator's transfers run in order, so each way has
// a communicator of its own: none waits behind a transfer of another way
// that its peer reaches later. The pairs are split first (collectives over
// the pipeline), then each rank makes its pairs' communicators in the
// order of j, so every pair's two inits meet.
static dt_status dev_links(pipe *p) {
    dt_strategy *s = &p->base;
    int P = p->P, pairs = p->V > 1 ? P : P - 1, k = 0, js[2];
    char why[1024] = "";
    dt_status st = DT_OK;
    for (int j = 0; j < pairs && st == DT_OK; j++) {
        int in = p->stage == j || p->stage == (j + 1) % P;
        dt_comm_t h = NULL;
        st = dt_comm_split(p->pp, in ? 0 : DT_COMM_UNDEFINED, p->stage == j ? 0 : 1, &h);
        if (st == DT_OK && in) js[k] = j, p->pair[k++] = h;
    }
    for (int i = 0; i < k && st == DT_OK; i++) {
        dt_comm_t h = p->pair[i];
        int first = p->stage == js[i], act = first ? ACT_OUT : ACT_IN, grad = first ? GRAD_IN : GRAD_OUT;
        if ((st = dt_train_device_comm(s->c, s->comm, h, &p->gpus[act], why, sizeof why)) == DT_OK)
            st = dt_train_device_comm(s->c, s->comm, h, &p->gpus[grad], why, sizeof why);
        p->ways[act] = (way){p->gpus[act], 1 - dt_comm_rank(h)};
        p->ways[grad] = (way){p->gpus[grad], 1 - dt_comm_rank(h)};
    }
    if (st != DT_OK) return dt_error(st, "pipeline: the streams between stages on the GPUs: %s", dt_last_error());
    if (s->rank == 0) dt_train_device_comm_said("pipeline streams between stages", p->gpus[ACT_OUT], why);
    return DT_OK;
}

// The stages' GPUs' communicators and their pairs gone.
static void dev_links_close(pipe *p) {
    for (int w = 0; w < WAYS; w++) {
        dt_comm_destroy(p->gpus[w]);
        p->gpus[w] = NULL;
    }
    for (int k = 0; k < 2; k++) {
        dt_comm_destroy(p->pair[k]);
        p->pair[k] = NULL;
    }
}

// One of the streams' transfers started: way w's (ACT_OUT, ...), n floats at x.
static dt_status transfer(pipe *p, int w, float *x, size_t n, dt_request_t *r) {
    const way *y = &p->ways[w];
    if (w == ACT_IN || w == GRAD_IN) return dt_irecv(x, n, DT_F32, y->peer, y->c, r);
    return dt_isend(x, n, DT_F32, y->peer, y->c, r);
}

// Slot sl's room for the gradient of its stream out, n floats (0: given
// back): host memory, or on a device the device's (the stage's streams are
// there), counted with the stages' memory.
static dt_status grad_room(pipe *p, slot *sl, size_t n) {
    dt_dev_blocks *b = p->base.device;
    if (b && sl->d) b->d->free(sl->d), b->stage_bytes -= sizeof(float) * sl->cap;
    else free(sl->d);
    sl->d = NULL, sl->cap = 0;
    if (!n) return DT_OK;
    dt_status st = DT_OK;
    if (b) st = b->d->alloc((void **)&sl->d, sizeof(float) * n);
    else if (!(sl->d = malloc(sizeof(float) * n))) st = DT_ERR_NOMEM;
    if (st != DT_OK) return dt_error(st, "pipeline: room for a stream's gradient (%zu floats%s): %s", n,
                                     b ? " on the GPU" : "", st == DT_ERR_NOMEM ? "out of memory" : dt_last_error());
    if (b) b->stage_bytes += sizeof(float) * n;
    sl->cap = n;
    return DT_OK;
}

// The P ranks of (replica, t): one pipeline (V > 1: twice, the gradients
// on their own). Tensor parallel: the task made the shard groups (the
// model's sums run on them), in the same layout.
static dt_status split_pipelines(pipe *p) {
    dt_strategy *s = &p->base;
    dt_status st = dt_comm_split(s->comm, p->replica * p->T + p->t, p->stage, &p->pp);
    if (st == DT_OK && p->V > 1) st = dt_comm_split(s->comm, p->replica * p->T + p->t, p->stage, &p->ppb);
    if (st == DT_OK) st = dt_comm_split(s->comm, p->replica, s->rank, &p->rep);
    if (st == DT_OK) st = dt_comm_split(s->comm, p->stage * p->T + p->t, p->replica, &p->dp);
    int ends = p->P > 1 && (p->stage == 0 || p->stage == p->P - 1);
    if (st == DT_OK && p->P > 1)
        st = dt_comm_split(s->comm, ends ? p->replica * p->T + p->t : DT_COMM_UNDEFINED, p->stage, &p->tie);
    if (st != DT_OK) return dt_error(st, "model parallel: splitting the workers: %s", dt_last_error());
    if (!p->ppb) p->ppb = p->pp;
    p->ways[ACT_OUT] = (way){p->pp, next_stage(p)}, p->ways[ACT_IN] = (way){p->pp, prev_stage(p)};
    p->ways[GRAD_OUT] = (way){p->ppb, prev_stage(p)}, p->ways[GRAD_IN] = (way){p->ppb, next_stage(p)};
    if (s->device && p->P > 1 && (st = dev_links(p)) != DT_OK) return st;
    p->shard = s->replicas;
    p->tp = s->tensor_group;
    // (every stage keeping its shard's whole block: one copy is a shard group's)
    s->copy = p->held ? p->rep : p->T > 1 ? p->tp : NULL;
    s->copy_first = p->replica == 0 && (p->held || p->stage == 0);
    return DT_OK;
}

static dt_status pp_init(dt_strategy *s) {
    pipe *p = (pipe *)s;
    const dt_config *c = s->c;
    int nb = c->pipeline * virtual_stages(c) + 1;
    if (!(p->bounds = malloc(sizeof(int) * (size_t)nb))) return dt_error(DT_ERR_NOMEM, "model parallel: out of memory");
    int *bounds = p->bounds;
    // Measured: the FLOPs / count cut until the layers are timed at the first step.
    p->measure = measured_balance(c);
    dt_status st = stage_bounds(c, NULL, bounds);
    if (st != DT_OK) return st;
    p->all = (dt_grad_range){0, s->n};
    p->gathered = -2;
    p->T = c->tensor;
    p->P = c->pipeline;
    p->V = virtual_stages(c);
    p->D = s->world / (p->T * p->P);
    p->M = micro_batches(c, s->world);
    p->gpipe = c->pipeline_schedule == 0;
    p->t = s->rank % p->T;
    p->replica = s->rank / p->T % p->D;
    p->stage = s->rank / p->T / p->D;
    p->ch = calloc((size_t)p->V, sizeof *p->ch);
    p->ops = malloc(sizeof(op) * 2 * (size_t)p->M * (size_t)p->V);
    p->spans = malloc(sizeof(dt_obs_span) * 2 * (size_t)p->M * (size_t)p->V);
    p->off = malloc(sizeof(int) * (size_t)p->M);
    p->len = malloc(sizeof(int) * (size_t)p->M);
    int host_acc = c->deterministic && !s->device;  // (a device's: dev_sums)
    if (s->device) s->device->defer_loss = 1;  // (the last stage's losses summed there: forward, make_norm)
    if (host_acc) p->acc = dt_alloc(sizeof(int64_t) * (s->n ? s->n : 1));
    if (!p->ch || !p->ops || !p->spans || !p->off || !p->len || (host_acc && !p->acc))
        return dt_error(DT_ERR_NOMEM, "model parallel: out of memory");
    plan_ops(p);
    // Each chunk's sets: as many as the schedule has alive on it at once
    // (forwards and backwards take a chunk's micro-batches in order).
    int alive[MAX_STAGES] = {0};
    for (int i = 0; i < 2 * p->M * p->V; i++) {
        chunk *ch = &p->ch[p->ops[i].v];
        alive[p->ops[i].v] += p->ops[i].fwd ? 1 : -1;
        if (alive[p->ops[i].v] > ch->nslots) ch->nslots = alive[p->ops[i].v];
    }
    for (int v = 0; v < p->V; v++) {
        chunk *ch = &p->ch[v];
        ch->vstage = v * p->P + p->stage;
        ch->l0 = bounds[ch->vstage];
        ch->l1 = bounds[ch->vstage + 1];
        if (!(ch->slots = calloc((size_t)ch->nslots, sizeof *ch->slots)))
            return dt_error(DT_ERR_NOMEM, "model parallel: out of memory");
    }
    if ((st = split_pipelines(p)) != DT_OK) return st;
    if (p->T > 1 && (!p->shard || !p->tp || dt_comm_size(p->tp) != p->T))
        return dt_error(DT_ERR_CONFIG, "model parallel: [parallel] tensor = %d, but the %s model is not split into shards",
                        p->T, c->gpt ? "GPT" : "classifier");
    if (c->zero == 1 && !(p->zc = malloc(sizeof(size_t) * 2 * (size_t)p->D)))
        return dt_error(DT_ERR_NOMEM, "model parallel: out of memory");
    p->zd = p->zc ? p->zc + p->D : NULL;
    if (s->rank == 0) print_layout(p);
    if (s->rank == 0 && c->deterministic && c->pipeline_balance == DT_BALANCE_MEASURED && !c->pipeline_split[0] &&
        p->P * p->V > 1)
        dt_log(DT_LOG_INFO, "model parallel: deterministic mode balances the stages by %s, not by measured time (which differs from run to run)",
               balance_name(c, 0));
    if (!p->measure) print_stages(p);
    return DT_OK;
}

static void dev_sums_close(pipe *p, const char *why);

static void pp_fini(dt_strategy *s) {
    pipe *p = (pipe *)s;
    for (int v = 0; v < p->V && p->ch; v++)
        for (int i = 0; i < p->ch[v].nslots && p->ch[v].slots; i++) {
            slot *sl = &p->ch[v].slots[i];
            dt_wait(&sl->send_out);
            dt_wait(&sl->send_d);
            if (p->tops) p->tops->stage_free(sl->st);
            grad_room(p, sl, 0);
        }
    if (p->steps > 0 && p->P > 1 && p->replica == 0 && p->t == 0 && p->ch) {
        double all = p->t_compute + p->t_wait;
        char layers[256] = "";
        size_t n = 0;
        for (int v = 0; v < p->V && n < sizeof layers - 24; v++)
            n += (size_t)snprintf(layers + n, sizeof layers - n, "%s[%d, %d)", v ? " " : "", p->ch[v].l0, p->ch[v].l1);
        dt_log(DT_LOG_INFO,
               "pipeline stage %d of %d (rank %d, layers %s): forward+backward %.3f s, waiting %.3f s over %lld steps: bubble %.1f%% (model (P-1)/(%sM+P-1) = %.1f%%); at most %d activation set%s alive",
               p->stage, p->P, s->rank, layers, p->t_compute, p->t_wait, (long long)p->steps,
               all > 0 ? 100 * p->t_wait / all : 0, p->V > 1 ? "V" : "", 100.0 * (p->P - 1) / (p->V * p->M + p->P - 1),
               p->peak, p->peak == 1 ? "" : "s");
    }
    dev_links_close(p);
    dev_sums_close(p, NULL);
    if (p->dacc.base) dt_dev_vm_close(&p->dacc);
    if (p->dwire.base) dt_dev_vm_close(&p->dwire);
    if (p->dsq) s->device->d->free(p->dsq);
    if (p->ppb != p->pp) dt_comm_destroy(p->ppb);
    dt_comm_destroy(p->pp);
    dt_comm_destroy(p->rep);
    dt_comm_destroy(p->dp);
    dt_comm_destroy(p->tie);
    for (int v = 0; v < p->V && p->ch; v++) free(p->ch[v].slots);
    free(p->ch);
    free(p->ops);
    free(p->spans);
    free(p->off);
    free(p->len);
    if (!s->device) dt_free(p->acc);
    free(p->units);
    free(p->mine);
    free(p->zc);
    free(p->bounds);
    free(p->layer_cost);
}

// The ranges of the block this rank keeps: the task's hold, or all of it.
static const dt_grad_range *kept(const pipe *p, int *n) {
    *n = p->held ? p->nheld : 1;
    return p->held ? p->held : &p->all;
}

// The ranges whose optimizer state this rank keeps and updates: its slices
// of the units under ZeRO-1, else the kept ranges.
static const dt_grad_range *updated(const pipe *p, int *n) {
    if (!p->units) return kept(p, n);
    *n = p->nunits;
    return p->mine;
}

// The optimizer's state blocks (the host's), st[2].
static void host_states(const pipe *p, float *st[2]) {
    for (int j = 0; j < 2; j++)
        st[j] = j < dt_optim_num_states(p->base.opt) ? dt_optim_state(p->base.opt, j) : NULL;
}

// ---- on a GPU ([train] device = cuda; docs/gpu.md, "Model parallel") -------
// The task's stages run on the device (their activations there, the
// streams between stages on the GPUs' communicators: dev_links), and so do
// the gradients' sums over the replicas and the tied embedding's pair
// (dev_sums), the norm's sums of squares and the update, over the ranges
// the stage keeps, whose parameters, gradients and optimizer state are
// backed on the device (dev_put_kept, at the start, a resume and a spare's
// take-over). The host's blocks are the copy that checkpoints, the
// weights file, an evaluation's gathered layers and a spare's state read:
// brought up to date before them (dev_get_kept).

// Once the stages are made: the device's memory in the metrics and the log.
static void dev_said(pipe *p) {
    dt_strategy *s = &p->base;
    dt_dev_blocks *b = s->device;
    size_t k[DT_DEV_KINDS];
    dt_dev_blocks_kinds(b, k);
    dt_train_device_metrics(s->obs, k);
    if (s->rank == 0)
        dt_log(DT_LOG_INFO, "pipeline stages on the GPU (%s device): weights %.1f + gradients %.1f + optimizer %.1f + "
               "activations %.1f (the stage's sets %.1f) + workspace %.1f MiB", b->d->name,
               k[DT_DEV_WEIGHTS] / 1048576.0, k[DT_DEV_GRADS] / 1048576.0, k[DT_DEV_OPTIM] / 1048576.0,
               k[DT_DEV_ACTS] / 1048576.0, b->stage_bytes / 1048576.0, k[DT_DEV_WORK] / 1048576.0);
}

// Ranges r[n] of the parameters onto the device (kept: the ranges this
// rank keeps, whose gradients are backed too; states: with the host's
// optimizer state of them; else an evaluation's).
static dt_status dev_put(pipe *p, const dt_grad_range *r, int n, int kept, float *const *states) {
    dt_strategy *s = &p->base;
    dt_dev_blocks *b = s->device;
    dt_status st = DT_OK;
    for (int i = 0; i < n && st == DT_OK && b; i++)
        st = dt_dev_blocks_put_range(b, s->params, states, r[i].offset, r[i].len, kept);
    return st == DT_OK ? DT_OK : dt_error(st, "pipeline: the parameters onto the GPU: %s", dt_last_error());
}

// The kept ranges onto the device, with the optimizer state of the
// ranges this rank updates.
static dt_status dev_put_kept(pipe *p) {
    int n, nu;
    const dt_grad_range *r = kept(p, &n), *u = updated(p, &nu);
    float *st[2];
    host_states(p, st);
    dt_status e = p->units ? dev_put(p, r, n, 1, NULL) : DT_OK;
    return e == DT_OK ? dev_put(p, u, nu, 1, st) : e;
}

// The host's copy made the device's: the kept ranges' parameters, with
// states the updated ranges' optimizer state too.
static dt_status dev_get_kept(pipe *p, int states) {
    dt_dev_blocks *b = p->base.device;
    int n, nu;
    const dt_grad_range *r = kept(p, &n), *u = updated(p, &nu);
    float *st[2];
    host_states(p, st);
    dt_status e = DT_OK;
    for (int i = 0; i < n && e == DT_OK && b && (p->units || !states); i++)  // (else the loop below's)
        e = dt_dev_blocks_get_range(b, p->base.params, NULL, r[i].offset, r[i].len);
    for (int i = 0; i < nu && e == DT_OK && b && states; i++)
        e = dt_dev_blocks_get_range(b, p->base.params, st, u[i].offset, u[i].len);
    return e == DT_OK ? DT_OK : dt_error(e, "pipeline: the parameters from the GPU: %s", dt_last_error());
}

// The ranks the gradients are summed over: the stage's replicas where it
// keeps its layers, else the whole block's shard (or every rank).
static dt_comm_t sum_over(const pipe *p) { return p->held ? p->dp : p->shard ? p->shard : p->base.comm; }

// At the first step after the layout (or a regroup): the sums' GPUs'
// communicators, and deterministic mode's and grad_dtype's blocks, backed
// on the kept ranges.
static dt_status dev_sums(pipe *p) {
    dt_strategy *s = &p->base;
    dt_dev_blocks *b = s->device;
    char why[1024] = "";
    int n;
    const dt_grad_range *r = kept(p, &n);
    if (!b || p->gsum) return DT_OK;
    dt_status st = dt_train_device_comm(s->c, s->comm, sum_over(p), &p->gsum, why, sizeof why);
    if (st == DT_OK && p->tied) st = dt_train_device_comm(s->c, s->comm, p->tie, &p->gtie, why, sizeof why);
    if (st == DT_OK && s->rank == 0) dt_train_device_comm_said("model parallel: gradient sums", p->gsum, why);
    if (st == DT_OK && s->c->deterministic && !p->dacc.base)
        st = dt_dev_vm_open(&p->dacc, b->d, s->n * 8, "the fixed-point sums", "model parallel");
    if (st == DT_OK && s->c->grad_dtype && !p->dwire.base)
        st = dt_dev_vm_open(&p->dwire, b->d, s->n * 2, "the gradients' bf16 copy", "model parallel");
    if (st == DT_OK) p->acc = p->dacc.base ? (int64_t *)p->dacc.base : p->acc;
    if (st == DT_OK && !p->dsq) {
        size_t m = 1 + (size_t)s->norder * (size_t)(p->nunits > 1 ? p->nunits : 1);
        st = b->d->alloc((void **)&p->dsq, sizeof(double) * m);
    }
    for (int i = 0; i < n && st == DT_OK; i++) {
        if (p->dacc.base) st = dt_dev_vm_back(&p->dacc, r[i].offset * 8, r[i].len * 8);
        if (st == DT_OK && p->dwire.base) st = dt_dev_vm_back(&p->dwire, r[i].offset * 2, r[i].len * 2);
    }
    if (st != DT_OK) dev_sums_close(p, "the gradients' sums could not be set up");  // (made again at the next try)
    return st == DT_OK ? DT_OK : dt_error(st, "model parallel: the gradients' sums on the GPUs: %s", dt_last_error());
}

static void dev_sums_close(pipe *p, const char *why) {
    dt_comm_t *c[2] = {&p->gsum, &p->gtie};
    for (int i = 0; i < 2; i++) {
        if (*c[i] && why) dt_comm_abort(*c[i], why);
        dt_comm_destroy(*c[i]);
        *c[i] = NULL;
    }
}

// The gradients: the device's, or the host's.
static float *grads_of(const pipe *p) { return p->base.device ? p->base.device->grads : p->base.grads; }

// Gradients g[n] into bf16 w[n] (narrow) or back (widen), where they are.
static dt_status narrow(const pipe *p, uint16_t *w, const float *g, size_t n) {
    dt_dev_blocks *b = p->base.device;
    if (b) return b->d->to16(w, g, n, DT_BF16);
    dt_from_f32(w, g, n, DT_BF16);
    return DT_OK;
}

static dt_status widen(const pipe *p, float *g, const uint16_t *w, size_t n) {
    dt_dev_blocks *b = p->base.device;
    if (b) return b->d->from16(g, w, n, DT_BF16);
    dt_to_f32(g, w, n, DT_BF16);
    return DT_OK;
}

// grad_dtype's bf16 copy of the block (NULL: out of memory).
static uint16_t *wire_of(pipe *p) { return p->base.device ? (uint16_t *)p->dwire.base : dt_strategy_wire(&p->base); }

// Deterministic: the kept ranges' gradients added to the fixed-point sums
// and zeroed (in: each micro-batch's), or the sums made the gradients and
// zeroed (sync's end), where they are.
static dt_status fixed_move(pipe *p, int in) {
    dt_dev_blocks *b = p->base.device;
    float *g = grads_of(p);
    int n;
    const dt_grad_range *r = kept(p, &n);
    dt_status st = DT_OK;
    for (int i = 0; i < n && st == DT_OK; i++) {
        size_t a = r[i].offset, m = r[i].len, zb = in ? sizeof(float) * m : sizeof(int64_t) * m;
        void *z = in ? (void *)(g + a) : (void *)(p->acc + a);
        if (b) st = in ? b->d->fixed_add(p->acc + a, g + a, m) : b->d->fixed_to_float(g + a, p->acc + a, m);
        else if (in) dt_fixed_add(p->acc + a, g + a, m, DT_FIXED_SCALE);
        else dt_fixed_to_float(g + a, p->acc + a, m);
        if (st == DT_OK) st = b ? b->d->memset0(z, zb) : (memset(z, 0, zb), DT_OK);
    }
    return st;
}

// ---- ZeRO stage 1: the units' slices over the replicas ----

// Slice r of unit u: dt_shard_range of its length over the D replicas.
static dt_grad_range unit_slice(const pipe *p, int u, int r) {
    size_t a, b;
    dt_shard_range(p->units[u].len, r, p->D, &a, &b);
    return (dt_grad_range){p->units[u].offset + a, b - a};
}

// A block laid out as the parameters (an optimizer state, gathered or
// read whole) given back in the units outside this rank's slices: zeros,
// their pages too (dt_zero_pages; nothing outside the units was touched).
static void release_outside(const pipe *p, float *x) {
    for (int u = 0; u < p->nunits; u++) {
        size_t a = p->units[u].offset, b = a + p->units[u].len, m0 = p->mine[u].offset, m1 = m0 + p->mine[u].len;
        if (m0 > a) dt_zero_pages(x + a, sizeof(float) * (m0 - a));
        if (b > m1) dt_zero_pages(x + m1, sizeof(float) * (b - m1));
    }
}

// The units: the kept ranges, with the tied range (the order's first: the
// GPT's wte) cut out on its own, so that replica r of the first and of the
// last stage keep the same slice of it; then this rank's slices, outside
// which the optimizer state (not touched yet) is never made.
static dt_status zero_units(pipe *p) {
    dt_strategy *s = &p->base;
    int n;
    const dt_grad_range *k = kept(p, &n);
    p->units = malloc(sizeof(dt_grad_range) * (size_t)(n + 2));
    p->mine = malloc(sizeof(dt_grad_range) * (size_t)(n + 2));
    if (!p->units || !p->mine) return dt_error(DT_ERR_NOMEM, "model parallel: out of memory");
    size_t ta = p->tied ? s->order[0].offset : 0, tb = p->tied ? ta + s->order[0].len : 0;
    p->nunits = 0;
    for (int i = 0; i < n; i++) {
        size_t a = k[i].offset, b = a + k[i].len;
        size_t cut[4] = {a, ta < a ? a : ta > b ? b : ta, tb < a ? a : tb > b ? b : tb, b};
        for (int c = 0; c < 3; c++)
            if (cut[c + 1] > cut[c]) p->units[p->nunits++] = (dt_grad_range){cut[c], cut[c + 1] - cut[c]};
    }
    for (int u = 0; u < p->nunits; u++) p->mine[u] = unit_slice(p, u, p->replica);
    for (int j = 0; j < dt_optim_num_states(s->opt); j++)  // (no huge page across a slice's edge)
        dt_pages_unused(dt_optim_state(s->opt, j), sizeof(float), s->n, (const size_t *)p->mine, p->nunits);
    return DT_OK;
}

// Block x's units gathered over the replicas from each one's slices (the
// parameters after an update; an optimizer state before a checkpoint).
static dt_status gather_units(pipe *p, float *x) {
    dt_status st = DT_OK;
    for (int u = 0; u < p->nunits && st == DT_OK && p->D > 1; u++) {
        for (int r = 0; r < p->D; r++) {
            dt_grad_range g = unit_slice(p, u, r);
            p->zc[r] = g.len;
            p->zd[r] = g.offset - p->units[u].offset;
        }
        st = dt_allgatherv(x + p->mine[u].offset, p->mine[u].len, x + p->units[u].offset, p->zc, p->zd, DT_F32, p->dp);
    }
    return st;
}

// Slice g of the gradients summed over the replicas onto replica `root`
// (a reduce over c; [parallel] grad_dtype = bf16: sent in bf16, as
// sum_range).
static dt_status reduce_slice(pipe *p, dt_grad_range g, int root, dt_comm_t c) {
    dt_strategy *s = &p->base;
    int me = root == p->replica;
    float *x = grads_of(p) + g.offset;
    if (!s->c->grad_dtype) return dt_reduce(x, me ? x : NULL, g.len, DT_F32, DT_SUM, root, c);
    uint16_t *w = wire_of(p);
    if (!w) return DT_ERR_NOMEM;
    dt_status st = narrow(p, w + g.offset, x, g.len);
    if (st == DT_OK) st = dt_reduce(w + g.offset, me ? w + g.offset : NULL, g.len, DT_BF16, DT_SUM, root, c);
    return st == DT_OK && me ? widen(p, x, w + g.offset, g.len) : st;
}

// Waits for a transfer, the time counted as the stage waiting.
static dt_status wait_timed(pipe *p, dt_request_t *req, const char *what, int peer) {
    if (!*req) return DT_OK;
    double t0 = dt_now();
    dt_status st = dt_wait(req);
    p->t_wait += dt_now() - t0;
    if (st != DT_OK)
        return dt_error(st, "pipeline stage %d: %s stage %d: %s", p->stage, what, peer, dt_last_error());
    return DT_OK;
}

static dt_status forward(pipe *p, dt_task *task, int64_t step, int v, int k, dt_obs_span *sp, double *loss_sum) {
    chunk *ch = &p->ch[v];
    slot *sl = &ch->slots[k % ch->nslots];
    int last = ch->vstage == p->P * p->V - 1;
    if (p->len[k] == 0) {  // (a short last batch of an epoch: every stage of the replica skips it)
        *sp = (dt_obs_span){1, k, v, dt_now(), dt_now()};
        return DT_OK;
    }
    dt_status st = wait_timed(p, &sl->send_out, "sending activations to", next_stage(p));
    if (st == DT_OK)
        st = p->tops->stage_begin(task, sl->st, step, p->off[k], p->len[k],
                                  (float)p->len[k] / (float)p->base.global * p->base.loss_scale, &sl->in,
                                  &sl->in_count, &sl->out, &sl->out_count);
    if (st == DT_OK && ch->vstage > 0) {
        dt_request_t r = NULL;
        st = transfer(p, ACT_IN, sl->in, sl->in_count, &r);
        if (st == DT_OK) st = wait_timed(p, &r, "receiving activations from", prev_stage(p));
    }
    if (st != DT_OK) return st;
    float loss = 0;
    double t0 = dt_now();
    dt_obs_begin(p->base.obs, DT_OBS_FORWARD);
    st = p->tops->stage_forward(task, sl->st, &loss);
    dt_obs_end(p->base.obs, DT_OBS_FORWARD);
    *sp = (dt_obs_span){1, k, v, t0, dt_now()};
    p->t_compute += sp->t1 - t0;
    if (st != DT_OK) return st;
    dt_dev_blocks *b = p->base.device;  // (on a device the loss stays there: summed, read by make_norm)
    if (last && b && p->t == 0) st = b->d->loss_add(p->dsq, b->loss, (double)p->len[k]);
    else if (last) *loss_sum += p->t == 0 ? (double)loss * p->len[k] : 0;
    else st = transfer(p, ACT_OUT, sl->out, sl->out_count, &sl->send_out);
    if (++p->alive > p->peak) p->peak = p->alive;
    return st;
}

static dt_status backward(pipe *p, dt_task *task, int v, int k, dt_obs_span *sp) {
    chunk *ch = &p->ch[v];
    slot *sl = &ch->slots[k % ch->nslots];
    int last = ch->vstage == p->P * p->V - 1;
    if (p->len[k] == 0) {
        *sp = (dt_obs_span){0, k, v, dt_now(), dt_now()};
        return DT_OK;
    }
    dt_status st = wait_timed(p, &sl->send_d, "sending gradients to", prev_stage(p));
    // (the room for the largest micro-batch, once: a device's free would wait for the transfers in flight)
    if (st == DT_OK && sl->cap < sl->out_count)
        st = grad_room(p, sl, sl->out_count / (size_t)p->len[k] * (size_t)pp_max_micro(p->base.c, p->base.world));
    if (st == DT_OK && !last) {
        dt_request_t r = NULL;
        st = transfer(p, GRAD_IN, sl->d, sl->out_count, &r);
        if (st == DT_OK) st = wait_timed(p, &r, "receiving gradients from", next_stage(p));
    }
    if (st != DT_OK) return st;
    double t0 = dt_now();
    dt_obs_begin(p->base.obs, DT_OBS_BACKWARD);
    st = p->tops->stage_backward(task, sl->st, sl->d, &sl->din);
    dt_obs_end(p->base.obs, DT_OBS_BACKWARD);
    *sp = (dt_obs_span){0, k, v, t0, dt_now()};
    p->t_compute += sp->t1 - t0;
    if (st == DT_OK && ch->vstage > 0)
        st = transfer(p, GRAD_OUT, sl->din, sl->in_count, &sl->send_d);
    // Deterministic: each micro-batch's gradient on its own into int64
    // fixed point, whose sums do not depend on their order (dp_det.c).
    if (st == DT_OK && p->acc) st = fixed_move(p, 1);
    p->alive--;
    return st;
}

// The lowest rank of c that has the state (have), or -1.
static dt_status holder(dt_comm_t c, int have, int *root) {
    int64_t v = have ? dt_comm_rank(c) : INT32_MAX;
    dt_status st = dt_allreduce(&v, &v, 1, DT_I64, DT_MIN, c);
    *root = st == DT_OK && v < INT32_MAX ? (int)v : -1;
    return st;
}

// Measured balance, before the model's parameters are set (pp_layout):
// every rank times each layer through the task's stages, on the layer's
// own (unset: untouched) parameters, and the ranks agree on the largest
// figures (dt_task_time_layers: exact, so every rank cuts the same stages
// from the same numbers); a layer's cost is its forward + backward. The
// first layer's includes the embedding (the images), the last one's the
// head and the loss, which stay on the end stages. Tensor-parallel shards
// of one copy run the same layers together (their sums inside the layers
// match).
static dt_status measure_layers(pipe *p, const dt_task_ops *tops, dt_task *task) {
    dt_strategy *s = &p->base;
    int L = dt_task_layers(s->c);
    dt_task_layer_times t;
    dt_status rc = dt_task_time_layers(tops, task, s->c, s->comm, pp_max_micro(s->c, s->world), s->grads, s->n, &t);
    if (rc == DT_OK && !(p->layer_cost = calloc((size_t)L, sizeof *p->layer_cost)))
        rc = dt_error(DT_ERR_NOMEM, "pipeline: out of memory measuring the layers");
    for (int l = 0; l < L && rc == DT_OK; l++) p->layer_cost[l] = t.forward[l] + t.backward[l];
    dt_task_layer_times_free(&t);
    return rc == DT_OK ? DT_OK : dt_error(rc, "pipeline: measuring the layers: %s", dt_last_error());
}

// The cut (bounds, whether measured, the layers' costs) from the lowest
// rank that has it to every rank: a replacement, which meets the others
// in its layout as they meet it in their regroup.
static dt_status share_cut(pipe *p, int have) {
    dt_strategy *s = &p->base;
    int L = dt_task_layers(s->c), nb = p->P * p->V + 1, root;
    dt_status st = holder(s->comm, have, &root);
    if (st == DT_OK && root < 0) st = dt_error(DT_ERR_INTERNAL, "model parallel: no worker holds the stages' cut");
    int64_t m = p->layer_cost != NULL;
    if (st == DT_OK) st = dt_broadcast(p->bounds, p->bounds, (size_t)nb, DT_I32, root, s->comm);
    if (st == DT_OK) st = dt_broadcast(&m, &m, 1, DT_I64, root, s->comm);
    if (st == DT_OK && m && !p->layer_cost && !(p->layer_cost = calloc((size_t)L, sizeof *p->layer_cost)))
        st = dt_error(DT_ERR_NOMEM, "model parallel: out of memory");
    if (st == DT_OK && m) st = dt_broadcast(p->layer_cost, p->layer_cost, (size_t)L * 2, DT_I32, root, s->comm);
    if (st != DT_OK) return st;
    for (int v = 0; v < p->V; v++) {
        p->ch[v].l0 = p->bounds[p->ch[v].vstage];
        p->ch[v].l1 = p->bounds[p->ch[v].vstage + 1];
    }
    return DT_OK;
}

// Bytes this rank's gradient sums sent so far (over its stage's replicas
// and the tied embedding's pair).
static uint64_t grad_sent(const pipe *p) {
    dt_comm_stats a, b;
    dt_comm_get_stats(p->base.device ? p->gsum : sum_over(p), &a);
    dt_comm_get_stats(p->base.device ? p->gtie : p->tie, &b);
    return a.bytes_sent + b.bytes_sent;
}

// A stage that keeps every layer, its parameters set after the cut all the
// same (the task deferred them): every rank's from rank 0 of its tensor
// rank, as the loop shares a whole model's.
static dt_status keep_all(pipe *p, const dt_task_ops *tops, dt_task *task, int joining) {
    dt_strategy *s = &p->base;
    const dt_grad_range *r;
    int n;
    dt_status st = tops->hold(task, NULL, &r, &n);
    if (st == DT_OK && !joining) st = dt_broadcast(s->params, s->params, s->n, DT_F32, 0, p->shard ? p->shard : s->comm);
    return st == DT_OK ? DT_OK : dt_error(st, "model parallel: the stage's layers: %s", dt_last_error());
}

// Before the first step, after the model and this strategy are made: the
// cut (measured now, or from a rank that has it when this rank replaces
// one), then this rank's layers: a model that can keep only some (the
// task's hold) keeps its chunks' layers, whose parameters it sets now and,
// at the start, takes from the first replica of its stage (dp): no rank
// ever holds the other stages'. Under ZeRO-1 the kept ranges are then cut
// into the replicas' slices (zero_units).
static dt_status pp_layout(dt_strategy *s, const dt_task_ops *tops, dt_task *task, int joining) {
    pipe *p = (pipe *)s;
    int L = dt_task_layers(s->c);
    dt_status st = DT_OK;
    if (joining) st = share_cut(p, 0);
    else if (p->measure) st = measure_layers(p, tops, task);
    if (st == DT_OK && p->measure && !joining) st = stage_bounds(s->c, p->layer_cost, p->bounds);
    if (st != DT_OK) return st;
    for (int v = 0; v < p->V; v++) {
        p->ch[v].l0 = p->bounds[p->ch[v].vstage];
        p->ch[v].l1 = p->bounds[p->ch[v].vstage + 1];
    }
    if (p->measure && !joining) print_stages(p);
    // Every layer kept with spares where a stage has no twin to give a
    // spare its layers (one replica): any survivor can.
    int whole = p->D == 1 && dt_worker_spares() > 0;
    if (!tops->hold || p->P == 1) return p->zc ? zero_units(p) : DT_OK;  // (the task set them all at create)
    if (whole) return keep_all(p, tops, task, joining);
    unsigned char *held = calloc((size_t)L, 1);
    if (!held) return dt_error(DT_ERR_NOMEM, "model parallel: out of memory");
    for (int v = 0; v < p->V; v++) memset(held + p->ch[v].l0, 1, (size_t)(p->ch[v].l1 - p->ch[v].l0));
    st = tops->hold(task, held, &p->held, &p->nheld);
    free(held);
    for (int j = 0; j < dt_optim_num_states(s->opt) && st == DT_OK; j++)  // (the blocks' pages: the model's own)
        dt_pages_unused(dt_optim_state(s->opt, j), sizeof(float), s->n, (const size_t *)p->held, p->nheld);
    if (st == DT_OK && p->acc) dt_pages_unused(p->acc, sizeof(int64_t), s->n, (const size_t *)p->held, p->nheld);
    // A tied embedding (the GPT's wte, the order's first range) is kept by
    // the first and the last stage alike.
    p->tied = s->tied && p->tie && s->order;
    s->copy = p->rep;
    s->copy_first = p->replica == 0;
    if (st == DT_OK) st = dt_strategy_ckpt_slices(s);
    for (int i = 0; i < p->nheld && st == DT_OK && !joining; i++)
        st = dt_broadcast(s->params + p->held[i].offset, s->params + p->held[i].offset, p->held[i].len, DT_F32, 0, p->dp);
    if (st == DT_OK && p->zc) st = zero_units(p);
    return st == DT_OK ? DT_OK : dt_error(st, "model parallel: the stage's layers: %s", dt_last_error());
}

static dt_status pp_run_step(dt_strategy *s, const dt_task_ops *tops, dt_task *task, int64_t step,
                             const dt_task_batch *b, double *loss_sum) {
    pipe *p = (pipe *)s;
    *loss_sum = 0;
    int first = (int)((long)b->global * p->replica / p->D);
    int share = (int)((long)b->global * (p->replica + 1) / p->D) - first;
    int max_len = pp_max_micro(s->c, s->world);
    // The replica's share in M micro-batches; deterministic: the global
    // batch's fixed pieces replica x M ... (replica + 1) x M - 1 of M x D.
    for (int k = 0; k < p->M; k++) {
        if (s->c->deterministic) {
            long j = (long)p->replica * p->M + k, n = (long)p->M * p->D;
            p->off[k] = (int)(b->global * j / n);
            p->len[k] = (int)(b->global * (j + 1) / n) - p->off[k];
        } else {
            p->off[k] = first + (int)((long)share * k / p->M);
            p->len[k] = first + (int)((long)share * (k + 1) / p->M) - p->off[k];
        }
    }
    s->nmicro = p->M;
    s->global = b->global;
    dt_status st = dev_sums(p);
    if (st == DT_OK && p->dsq) st = s->device->d->memset0(p->dsq, sizeof(double));  // (the step's losses)
    if (s->device) p->reads0 = s->device->d->reads();
    if (st != DT_OK) return st;
    if (!p->tops) {  // at the first step: the activation sets
        if (!tops->stage_create)
            return dt_error(DT_ERR_CONFIG, "strategy model-parallel: the %s model has no stages", tops->name);
        p->tops = tops;
        for (int v = 0; v < p->V; v++)
            for (int i = 0; i < p->ch[v].nslots; i++) {
                st = tops->stage_create(task, p->ch[v].l0, p->ch[v].l1, max_len, &p->ch[v].slots[i].st);
                if (st != DT_OK) return st;
            }
        if (s->device) dev_said(p);
    }
    p->alive = 0;
    for (int i = 0; i < 2 * p->M * p->V && st == DT_OK; i++) {
        if (i == p->warm) st = dt_fault_step(s->rank, step + 1);
        if (st != DT_OK) break;
        const op *o = &p->ops[i];
        st = o->fwd ? forward(p, task, step, o->v, o->mb, &p->spans[i], loss_sum)
                    : backward(p, task, o->v, o->mb, &p->spans[i]);
    }
    for (int v = 0; v < p->V && st == DT_OK; v++)
        for (int i = 0; i < p->ch[v].nslots && st == DT_OK; i++) {
            st = wait_timed(p, &p->ch[v].slots[i].send_out, "sending activations to", next_stage(p));
            if (st == DT_OK) st = wait_timed(p, &p->ch[v].slots[i].send_d, "sending gradients to", prev_stage(p));
        }
    p->steps++;
    // The schedule as it ran, at the second step (the first after the
    // set-up) and every log_every steps: dtrain report's timeline.
    if (st == DT_OK && (step + 1 == 2 || (step + 1) % s->c->log_every == 0)) {
        dt_obs_sched h = {step + 1, p->stage, p->P, p->V, p->M, p->t, p->replica};
        dt_obs_schedule(s->obs, &h, p->spans, 2 * p->M * p->V);
    }
    return st;
}

// Every rank's gradient block becomes the global one of its shard (see the
// top). A stage that keeps only its layers sums them over its stage's
// replicas alone (dp), and the tied embedding's two parts are then summed
// between the first and the last stage (tie); else the whole block over
// the ranks of its tensor rank, every stage adding its layers' part.
// (deterministic: the fixed-point sums; [parallel] grad_dtype = bf16: sent
// in bf16, as dt_strategy_sum_grads does)
static dt_status sum_range(pipe *p, size_t off, size_t len, dt_comm_t c) {
    dt_strategy *s = &p->base;
    if (p->acc) return dt_allreduce(p->acc + off, p->acc + off, len, DT_I64, DT_SUM, c);
    float *g = grads_of(p) + off;
    if (!s->c->grad_dtype) return dt_allreduce(g, g, len, DT_F32, DT_SUM, c);
    uint16_t *w = wire_of(p);
    if (!w) return DT_ERR_NOMEM;
    dt_status st = narrow(p, w + off, g, len);
    if (st == DT_OK) st = dt_allreduce(w + off, w + off, len, DT_BF16, DT_SUM, c);
    return st == DT_OK ? widen(p, g, w + off, len) : st;
}

// ZeRO-1 (not deterministic): each unit's slices reduced onto their
// replicas (a reduce-scatter of the stage's own ranges), then the tied
// range's slice between the end stages.
static dt_status zero_sum(pipe *p, dt_comm_t c, dt_comm_t tie) {
    dt_status st = DT_OK;
    int tu = -1;
    for (int u = 0; u < p->nunits && st == DT_OK; u++) {
        if (p->tied && p->units[u].offset == p->base.order[0].offset) tu = u;
        for (int r = 0; r < p->D && st == DT_OK; r++) {
            dt_grad_range g = unit_slice(p, u, r);
            if (g.len) st = reduce_slice(p, g, r, c);
        }
    }
    if (st == DT_OK && tu >= 0 && p->mine[tu].len) st = sum_range(p, p->mine[tu].offset, p->mine[tu].len, tie);
    return st;
}

static dt_status pp_sync(dt_strategy *s) {
    pipe *p = (pipe *)s;
    double t0 = dt_now();
    uint64_t sent = grad_sent(p);
    int n, scatter = p->units && !p->acc;
    const dt_grad_range *k = kept(p, &n);
    dt_comm_t c = s->device ? p->gsum : sum_over(p), tie = s->device ? p->gtie : p->tie;
    dt_status st = DT_OK;
    p->have_norm = 0;
    if (scatter) st = zero_sum(p, c, tie);
    for (int i = 0; i < n && st == DT_OK && !scatter; i++) st = sum_range(p, k[i].offset, k[i].len, c);
    // (the order's first range is wte: the embedding's, and the head's on the last stage)
    if (st == DT_OK && p->tied && !scatter) st = sum_range(p, s->order[0].offset, s->order[0].len, tie);
    if (st == DT_OK && p->acc) st = fixed_move(p, 0);
    p->grad_bytes += grad_sent(p) - sent;
    s->comm_seconds += dt_now() - t0;
    s->comm_exposed_seconds += dt_now() - t0;
    if (st != DT_OK) return dt_error(st, "model parallel: gradient %s: %s", scatter ? "reduce-scatter" : "allreduce", dt_last_error());
    return DT_OK;
}

// On a device, ZeRO-1's gather of the parameters: each unit's slices
// broadcast from their replicas (NCCL gathers only equal blocks).
static dt_status dev_gather_params(pipe *p) {
    dt_status st = DT_OK;
    for (int u = 0; u < p->nunits && st == DT_OK && p->D > 1; u++)
        for (int r = 0; r < p->D && st == DT_OK; r++) {
            dt_grad_range g = unit_slice(p, u, r);
            float *w = p->base.device->params + g.offset;
            if (g.len) st = dt_broadcast(w, w, g.len, DT_F32, r, p->gsum);
        }
    return st;
}

// The update of the ranges this rank keeps: its layers' (or the whole
// block); under [parallel] zero = 1 its slices of them, and every
// replica's slices then go to every replica (gather_units). On a device
// there, the 16-bit copy of the kept ranges made again after.
static dt_status pp_update(dt_strategy *s, float lr, float scale) {
    pipe *p = (pipe *)s;
    dt_dev_blocks *b = s->device;
    int n, nk;
    const dt_grad_range *u = updated(p, &n), *k = kept(p, &nk);
    dt_optim_begin_step(s->opt);
    dt_status st = b ? dt_dev_blocks_update(b, s->opt, lr, scale, NULL, u, n) : DT_OK;
    for (int i = 0; i < n && !b; i++)
        if (u[i].len) dt_optim_update(s->opt, u[i].offset, u[i].len, s->params + u[i].offset, s->grads + u[i].offset, lr, scale);
    if (st != DT_OK) return dt_error(st, "model parallel: the update on the GPU: %s", dt_last_error());
    st = !p->units ? DT_OK : b ? dev_gather_params(p) : gather_units(p, s->params);
    if (st != DT_OK) return dt_error(st, "model parallel: parameter allgather: %s", dt_last_error());
    st = b ? dt_dev_blocks_changed(b, k, nk) : DT_OK;
    if (b) p->reads += b->d->reads() - p->reads0, p->updates++;
    return st == DT_OK ? DT_OK : dt_error(st, "model parallel: the parameters' 16-bit copy: %s", dt_last_error());
}

// The whole model's gradient norm from the parts: each rank sums the
// squares of the order's ranges it is the one holder of in its replica
// (the split ranges of every shard, the whole ones of shard 0; of a stage
// that keeps only its layers, those layers, and the tied embedding on the
// first stage), and the replica's T x P figures are added in rank order.
// Under ZeRO-1 a rank has the sums of its slices alone: its squares of
// those, the D replicas' figures added in replica order first. Every
// layer kept (T = 1): the replicated block's norm.
static int sole_holder(const pipe *p, int i) {
    const dt_strategy *s = &p->base;
    if (p->T > 1 && !(s->order_split && s->order_split[i]) && p->t != 0) return 0;
    if (!p->held) return p->stage == 0;
    int l = s->order_layer ? s->order_layer[i] : 0, L = dt_task_layers(s->c);
    l = l < 0 ? 0 : l >= L ? L - 1 : l;  // (the embedding with block 0, the head with the last)
    for (int v = 0; v < p->V; v++)
        if (l >= p->ch[v].l0 && l < p->ch[v].l1) return 1;
    return 0;
}

// This rank's pieces of the norm, in order, into r (room for norder x
// (nunits or 1)), each with the order's range it is of (grp): the ranges it
// is the sole holder of, under ZeRO-1 their parts in its slices. Every
// layer kept (T = 1): the whole block, one piece.
static int norm_pieces(const pipe *p, dt_grad_range *r, int *grp) {
    const dt_strategy *s = &p->base;
    int k = 0, sliced = p->units && !p->acc;
    if (p->T == 1 && !p->held) return r[0] = p->all, grp[0] = 0, 1;
    for (int i = 0; i < s->norder; i++) {
        const dt_grad_range *o = &s->order[i];
        for (int u = 0; sole_holder(p, i) && u < (sliced ? p->nunits : 1); u++) {
            size_t a = sliced ? p->mine[u].offset : o->offset, b = sliced ? a + p->mine[u].len : a + o->len;
            a = a > o->offset ? a : o->offset;
            b = b < o->offset + o->len ? b : o->offset + o->len;
            if (a < b) r[k] = (dt_grad_range){a, b - a}, grp[k++] = i;
        }
    }
    return k;
}

// This rank's squares: each range's pieces summed, the ranges' sums added
// in order (on a device each piece's sum of squares made there, the
// dt_sum_squares bits, read back at once with the step's losses there,
// *losses; else 0).
static dt_status my_squares(pipe *p, double *mine, double *losses) {
    dt_strategy *s = &p->base;
    dt_dev_blocks *b = s->device;
    size_t m = (size_t)s->norder * (size_t)(p->nunits > 1 ? p->nunits : 1) + 1;
    dt_grad_range *r = malloc(sizeof *r * m);
    int *grp = malloc(sizeof(int) * m);
    double *v = malloc(sizeof(double) * (m + 1)), *sq = v ? v + 1 : NULL;
    dt_status st = r && grp && v ? DT_OK : dt_error(DT_ERR_NOMEM, "model parallel: out of memory");
    int n = st == DT_OK ? norm_pieces(p, r, grp) : 0;
    for (int j = 0; j < n && st == DT_OK; j++)
        if (b) st = b->d->sumsq(p->dsq + 1 + j, b->grads + r[j].offset, r[j].len);
        else sq[j] = dt_sum_squares(s->grads + r[j].offset, r[j].len);
    if (st == DT_OK && b) st = b->d->to_host(v, p->dsq, sizeof(double) * (size_t)(n + 1));
    *losses = st == DT_OK && b ? v[0] : 0;
    *mine = 0;
    for (int j = 0; j < n && st == DT_OK;) {
        double sum = 0;
        int i = grp[j];
        for (; j < n && grp[j] == i; j++) sum += sq[j];
        *mine += sum;
    }
    free(r), free(grp), free(v);
    return st;
}

// The norm (see above), made once a step: by grads_nonfinite, whose check
// it is (a non-finite norm), and which grad_norm then returns.
static dt_status make_norm(pipe *p, double *losses) {
    int G = p->T * p->P, sliced = p->units && !p->acc;
    double mine = 0, *all = malloc(sizeof(double) * (size_t)(G > p->D ? G : p->D));
    dt_status st = all ? my_squares(p, &mine, losses) : dt_error(DT_ERR_NOMEM, "model parallel: out of memory");
    if (st == DT_OK && p->T == 1 && !p->held) {
        free(all);
        p->norm = sqrt(mine), p->have_norm = 1;
        return DT_OK;
    }
    // (doubles moved as their 8 bytes: no reduction touches them)
    if (st == DT_OK && sliced && p->D > 1) st = dt_allgather(&mine, all, 1, DT_I64, p->dp);
    if (sliced && p->D > 1 && st == DT_OK) {
        mine = 0;
        for (int r = 0; r < p->D; r++) mine += all[r];
    }
    if (st == DT_OK) st = dt_allgather(&mine, all, 1, DT_I64, p->rep);
    double sum = 0;
    for (int r = 0; r < G && st == DT_OK; r++) sum += all[r];
    free(all);
    if (st != DT_OK) return dt_error(st, "model parallel: gradient norm: %s", dt_last_error());
    p->norm = sqrt(sum), p->have_norm = 1;
    return DT_OK;
}

// The synchronised gradient's check: a NaN or an Inf makes the norm so
// (DTRAIN_FAULT_OVERFLOW: this rank says it saw one). On a device the
// step's losses come back in the same read: *loss_sum (a non-finite one
// is the run's error, as the CPU's forward says).
static dt_status pp_grads_nonfinite(dt_strategy *s, int64_t step, double *loss_sum, int *nonfinite) {
    pipe *p = (pipe *)s;
    double losses = 0;
    dt_status st = make_norm(p, &losses);
    if (st == DT_OK && s->device) *loss_sum = losses;
    if (st == DT_OK && !isfinite(*loss_sum))
        st = dt_error(DT_ERR_NUMERIC, "the loss is %s (diverged: lower the learning rate or clip gradients)",
                      isnan(*loss_sum) ? "NaN" : "Inf");
    *nonfinite = st == DT_OK && (!isfinite(p->norm) || dt_fault_overflow(s->rank, step));
    return st;
}

static dt_status pp_grad_norm(dt_strategy *s, double *norm) {
    pipe *p = (pipe *)s;
    dt_status st = p->have_norm ? DT_OK : make_norm(p, &(double){0});
    *norm = p->norm;
    return st;
}

// ---- evaluation of stages that keep only their layers ----
//
// The task evaluates with whole forwards, every rank its windows (a rank
// with fewer chunks replays the busiest's layer hooks: dt_task_replay), so
// every rank of a pipeline calls the hook for the same layers in the same
// order. Before layer l's forward its ranges (the order's ranges of that
// layer) come from the stage that keeps it, a broadcast over the pipeline,
// and the block gathered before is given back (its pages too); the
// embedding (wte, which the head uses too) and the head stay until the
// evaluation ends. A rank thus holds its own layers, one more block, the
// embedding and the head.

// Whether this rank keeps element `off` of the block.
static int keeps(const pipe *p, size_t off) {
    int n;
    const dt_grad_range *k = kept(p, &n);
    for (int i = 0; i < n; i++)
        if (off >= k[i].offset && off < k[i].offset + k[i].len) return 1;
    return 0;
}

static int owner(const pipe *p, int layer) {
    int L = dt_task_layers(p->base.c), l = layer < 0 ? 0 : layer >= L ? L - 1 : layer;
    for (int k = 0; k < p->P * p->V; k++)
        if (l >= p->bounds[k] && l < p->bounds[k + 1]) return k % p->P;
    return 0;
}

// The parameters of `layer` (as the order names them) on this rank: taken
// from their owner (get), or given back where another stage owns them.
static dt_status eval_layer(pipe *p, int layer, int get) {
    dt_strategy *s = &p->base;
    int root = owner(p, layer);
    dt_status st = DT_OK;
    for (int i = 0; i < s->norder && st == DT_OK; i++) {
        if (s->order_layer[i] != layer) continue;
        float *w = s->params + s->order[i].offset;
        if (get && (st = dt_broadcast(w, w, s->order[i].len, DT_F32, root, p->pp)) == DT_OK)
            st = dev_put(p, &s->order[i], 1, 0, NULL);
        else if (!get && !keeps(p, s->order[i].offset)) {
            dt_zero_pages(w, sizeof(float) * s->order[i].len);
            if (s->device) st = dt_dev_blocks_drop_range(s->device, s->order[i].offset, s->order[i].len);
        }
    }
    return st == DT_OK ? DT_OK
                       : dt_error(st, "pipeline: evaluation: %s layer %d: %s", get ? "gathering" : "giving back", layer,
                                  dt_last_error());
}

static dt_status pp_params_needed(dt_strategy *s, int layer, int phase) {
    pipe *p = (pipe *)s;
    int L = dt_task_layers(s->c), block = layer >= 0 && layer < L;
    if (!p->evaluating || phase != 0) return DT_OK;
    if (!block && (layer < 0 ? p->evaluating & 2 : p->evaluating & 4)) return DT_OK;  // (kept)
    dt_status st = eval_layer(p, layer, 1);
    if (st == DT_OK && block && p->gathered >= 0 && p->gathered != layer) st = eval_layer(p, p->gathered, 0);
    if (block) p->gathered = layer;
    else p->evaluating |= layer < 0 ? 2 : 4;
    return st;
}

static dt_status pp_params_eval(dt_strategy *s, int begin) {
    pipe *p = (pipe *)s;
    if (!p->held || s->world == 1) return DT_OK;
    dt_status st = begin ? dev_get_kept(p, 0) : DT_OK;  // (on a GPU: the layers the others gather from the host)
    if (!begin) {
        int L = dt_task_layers(s->c), n;
        if (p->gathered >= 0) st = eval_layer(p, p->gathered, 0);
        if (st == DT_OK && p->evaluating & 2) st = eval_layer(p, -1, 0);  // (the embedding: the layer hook's -1)
        if (st == DT_OK && p->evaluating & 4) st = eval_layer(p, L, 0);
        const dt_grad_range *k = kept(p, &n);  // (on a GPU: the chunks the layers shared too)
        if (st == DT_OK && s->device && (st = dt_dev_blocks_keep_only(s->device, k, n)) != DT_OK)
            st = dt_error(st, "pipeline: after the evaluation, the GPU's chunks: %s", dt_last_error());
    }
    p->evaluating = begin;
    p->gathered = -2;
    return st;
}

// ---- checkpoints of a model in parts (tensor parallel) ----
//
// A checkpoint holds the whole model's tensors, sharded as a sliced run's
// are: rank r keeps dt_shard_range(nwhole, r, W) of the whole block and of
// each optimizer state (strategy.h's ckpt_*). No rank ever holds more.

#define CKPT_PIECE ((size_t)4 << 20)  // floats of the whole block moved at a time

// Before a save: each replica's T x P ranks hold one copy of the model
// between them, and assemble their slices from it: for each rank of the
// replica in turn, a piece of its slice at a time, every rank puts in what
// it holds of the piece (the task's part_fill; where every stage keeps its
// shard's whole block, stage 0's ranks alone) and the pieces are summed onto
// that rank, -0.0 elsewhere (which adds nothing, not even to a zero's sign).
// Under ZeRO-1 each optimizer state's units are gathered from the
// replicas' slices first, and given back after (gather_units).
// Where one block's summed pieces go: the rank's staged slice of it
// (pp_ckpt_stage), or, in pieces (slice NULL), `sum` and then the rank's
// shard file at once (pp_ckpt_save).
typedef struct {
    float *slice, *sum;
    dt_ckpt_pieces *w;
} ckpt_sink;

// One block (the parameters, j < 0, or optimizer state j) assembled over
// the replica: each replica rank's slice of the whole model's block, a
// piece at a time, each piece summed onto its rank from the parts the
// others hold (-0.0 elsewhere). Under ZeRO-1 a state's units are
// gathered first from the replicas' slices, and given back after.
static dt_status assemble_block(dt_strategy *s, int j, float *piece, ckpt_sink *k) {
    pipe *p = (pipe *)s;
    int G = p->T * p->P, me = dt_comm_rank(p->rep);
    float *local = j < 0 ? s->params : dt_optim_state(s->opt, j);
    dt_status st = j >= 0 && p->units ? gather_units(p, local) : DT_OK;
    for (int g = 0; g < G && st == DT_OK; g++) {  // replica rank g = stage x T + t
        size_t lo, hi;
        dt_shard_range(s->nwhole, (g / p->T * p->D + p->replica) * p->T + g % p->T, s->world, &lo, &hi);
        for (size_t a = lo; a < hi && st == DT_OK; a += CKPT_PIECE) {
            size_t b = hi - a < CKPT_PIECE ? hi : a + CKPT_PIECE;
            for (size_t i = 0; i < b - a; i++) piece[i] = -0.0f;
            if (p->held || p->stage == 0) s->part_fill(s->part_user, local, a, b, piece);
            float *dst = g != me ? NULL : k->slice ? k->slice + (a - lo) : k->sum;
            st = dt_reduce(piece, dst, b - a, DT_F32, DT_SUM, g, p->rep);
            if (st == DT_OK && g == me && !k->slice) st = dt_ckpt_pieces_put(k->w, j, a, k->sum, b - a);
        }
    }
    if (j >= 0 && p->units) release_outside(p, local);
    return st;
}

static dt_status pp_ckpt_stage(dt_strategy *s) {
    if (!s->ckpt_params) return DT_OK;
    float *piece = dt_alloc(sizeof(float) * CKPT_PIECE);
    dt_status st = piece ? DT_OK : dt_error(DT_ERR_NOMEM, "out of memory");
    for (int j = -1; j < dt_optim_num_states(s->opt) && st == DT_OK; j++) {
        ckpt_sink k = {j < 0 ? s->ckpt_params : s->ckpt_states[j], NULL, NULL};
        st = assemble_block(s, j, piece, &k);
    }
    dt_free(piece);
    return st == DT_OK ? DT_OK : dt_error(st, "model parallel: assembling the checkpoint's slices: %s", dt_last_error());
}

// [checkpoint] staging = pieces: the checkpoint written without the slice.
// The same assembly as pp_ckpt_stage, in the checksum's order (each
// optimizer state, then the parameters: dt_ckpt_pieces), each piece summed
// onto its rank, which writes it at its place in its shard file at once:
// a rank holds two pieces beyond its live state, and the training waits
// for the save. The ranks then agree that every shard is there before rank
// 0 completes the checkpoint; in object storage one that failed past the
// retries is given up on every rank (dt_ckpt_give_up), as the background
// writer's are, and the run goes on.
static dt_status pp_ckpt_save(dt_strategy *s, const dt_train_state *ts, char *lost, size_t n) {
    int nst = dt_optim_num_states(s->opt);
    ckpt_sink k = {NULL, dt_alloc(sizeof(float) * CKPT_PIECE), NULL};
    float *piece = dt_alloc(sizeof(float) * CKPT_PIECE);
    dt_status st = piece && k.sum ? DT_OK : dt_error(DT_ERR_NOMEM, "out of memory");
    if (st == DT_OK) st = dt_ckpt_pieces_open(&k.w, s->ckpt_dir, s->ckpt_model, ts, s->rank, s->world);
    for (int i = 0; i <= nst && st == DT_OK; i++) st = assemble_block(s, i < nst ? i : -1, piece, &k);
    dt_free(piece);
    dt_free(k.sum);
    if (st != DT_OK) {
        dt_ckpt_pieces_abort(k.w);
        return dt_error(st, "model parallel: the checkpoint of step %lld in pieces: %s", (long long)ts->step,
                        dt_last_error());
    }
    st = dt_ckpt_pieces_commit(k.w);
    char why[1024] = "";
    if (st != DT_OK) snprintf(why, sizeof why, "%s", dt_last_error());
    int64_t ok = st == DT_OK;
    dt_status ag = dt_allreduce(&ok, &ok, 1, DT_I64, DT_MIN, s->comm);
    if (ag != DT_OK) {
        dt_ckpt_pieces_abort(k.w);
        return dt_error(ag, "model parallel: the checkpoint of step %lld in pieces, agreeing that every shard is "
                        "written: %s", (long long)ts->step, dt_last_error());
    }
    if (ok) st = dt_ckpt_pieces_finish(k.w, s->c->ckpt_keep, 300);
    else {
        dt_ckpt_pieces_abort(k.w);
        if (st == DT_OK) st = dt_error(DT_ERR_IO, "%s/step-%08lld: another rank's shard was not written", s->ckpt_dir,
                                       (long long)ts->step);
        else dt_error(st, "%s", why);
    }
    if (st == DT_OK) return DT_OK;
    // (a rank whose own upload failed says why, rank 0 that the checkpoint is lost; the others keep it quiet)
    int quiet = why[0] == 0 && s->rank != 0;
    if (quiet && dt_path_remote(s->ckpt_dir)) {
        snprintf(lost, n, "checkpoint at step %lld not written: another rank's shard was not written", (long long)ts->step);
        return DT_OK;
    }
    return dt_ckpt_give_up(s->ckpt_dir, st, ts->step, lost, n) ? DT_OK : st;
}

// After a resume the whole block is spread a piece at a time: each piece
// is gathered from the ranks whose slices it crosses (dt_shard_range of
// the whole block over the W ranks), and every rank takes its part of it
// (part_take; under ZeRO-1 into its stage's whole state, of which it then
// keeps its slices). A rank's part of the piece comes from its staged slice, which
// it read on resume; in pieces (f: [checkpoint] staging = pieces), from
// the checkpoint itself, read just then. Either way the checkpoint is read
// once over all the ranks, and in pieces a rank holds two pieces and no
// slice.
static dt_status spread(dt_strategy *s, dt_st_file *f, const char *path, float *piece, float *mine, size_t *cnt,
                        size_t *dsp) {
    int W = s->world, me = s->rank;
    dt_status st = DT_OK;
    for (int j = -1; j < dt_optim_num_states(s->opt) && st == DT_OK; j++) {
        float *dst = j < 0 ? s->params : dt_optim_state(s->opt, j);
        for (size_t a = 0; a < s->nwhole && st == DT_OK; a += CKPT_PIECE) {
            size_t b = s->nwhole - a < CKPT_PIECE ? s->nwhole : a + CKPT_PIECE;
            for (int r = 0; r < W; r++) {
                size_t x, y;
                dt_shard_range(s->nwhole, r, W, &x, &y);
                x = x < a ? a : x > b ? b : x;
                y = y < a ? a : y > b ? b : y;
                cnt[r] = y - x;
                dsp[r] = x - a;
            }
            const float *src = mine;
            if (!f && cnt[me]) src = (j < 0 ? s->ckpt_params : s->ckpt_states[j]) + (a + dsp[me] - s->ckpt_lo);
            else if (cnt[me])
                st = dt_ckpt_read_range(f, path, s->ckpt_model, j, a + dsp[me], a + dsp[me] + cnt[me], mine);
            if (st == DT_OK) st = dt_allgatherv(src, cnt[me], piece, cnt, dsp, DT_F32, s->comm);
            if (st == DT_OK) s->part_take(s->part_user, dst, a, b, piece);
        }
    }
    return st;
}

static dt_status ckpt_spread(dt_strategy *s, const char *path) {
    pipe *p = (pipe *)s;
    int pieces = s->ckpt_pieces != 0;
    if (!path[0] || (!pieces && !s->ckpt_params)) return DT_OK;
    dt_st_file *f = NULL;
    float *piece = dt_alloc(sizeof(float) * CKPT_PIECE), *mine = pieces ? dt_alloc(sizeof(float) * CKPT_PIECE) : NULL;
    size_t *cnt = malloc(sizeof(size_t) * 2 * (size_t)s->world);
    dt_status st = piece && (!pieces || mine) && cnt ? DT_OK : dt_error(DT_ERR_NOMEM, "out of memory");
    if (st == DT_OK && pieces) st = dt_ckpt_open_chosen(path, -1, &f);  // (rank 0 verified it: dt_run_ckpt_begin)
    if (st == DT_OK) st = spread(s, f, path, piece, mine, cnt, cnt + s->world);
    // (every replica took its layers' whole optimizer state: under ZeRO-1 a rank keeps its slices alone)
    for (int j = 0; j < dt_optim_num_states(s->opt) && st == DT_OK && p->units; j++)
        release_outside(p, dt_optim_state(s->opt, j));
    dt_st_close(f);
    free(cnt);
    dt_free(piece);
    dt_free(mine);
    return st == DT_OK ? DT_OK : dt_error(st, "model parallel: spreading the checkpoint %s: %s", path, dt_last_error());
}

// After the start or a resume (the checkpoint's parts spread): the kept
// ranges and their optimizer state onto a GPU.
static dt_status pp_ckpt_restore(dt_strategy *s, const char *path, int parts) {
    (void)parts;
    dt_status st = ckpt_spread(s, path);
    return st == DT_OK ? dev_put_kept((pipe *)s) : st;
}

// Before a checkpoint and the weights file, on a GPU: the host's copy of
// the kept ranges and their optimizer state made the device's.
static dt_status pp_params_host(dt_strategy *s) { return dev_get_kept((pipe *)s, 1); }

// summary.json's "pipeline": the grid, how the stages were cut, each
// (virtual) stage's layers and, measured, the layers' and stages' seconds.
static void pp_summary(dt_strategy *s, struct cJSON *o) {
    pipe *p = (pipe *)s;
    const dt_config *c = s->c;
    int S = p->P * p->V, L = dt_task_layers(c);
    if (s->device) {  // (its stages' activations beside the arena: rank 0's)
        cJSON *g = dt_train_device_summary(o, c, s->device);
        dt_comm_t w = p->gpus[ACT_OUT] ? p->gpus[ACT_OUT] : p->gpus[ACT_IN];
        cJSON_AddStringToObject(g, "update", "device");
        cJSON_AddStringToObject(g, "sums", p->gsum ? dt_comm_backend(p->gsum) : "none");
        cJSON_AddNumberToObject(g, "reads_per_step", p->updates ? (double)p->reads / (double)p->updates : 0.0);
        cJSON_AddStringToObject(g, "streams", w ? dt_comm_backend(w) : "none");
    }
    cJSON *j = cJSON_AddObjectToObject(o, "pipeline");
    if (!j) return;
    cJSON_AddNumberToObject(j, "tensor", p->T);
    cJSON_AddBoolToObject(j, "sequence", p->T > 1 && c->sequence);
    cJSON_AddNumberToObject(j, "data", p->D);
    cJSON_AddNumberToObject(j, "stages", p->P);
    cJSON_AddNumberToObject(j, "virtual_stages", p->V);
    cJSON_AddNumberToObject(j, "micro_batches", p->M);
    if ((p->held || p->units) && p->steps > 0)  // what the gradient sums sent a step (the comm's count, dt_comm_stats)
        cJSON_AddNumberToObject(j, "gradient_bytes_per_step", (double)p->grad_bytes / (double)p->steps);
    if (S == 1) return;
    cJSON_AddStringToObject(j, "balance", balance_name(c, p->layer_cost != NULL));
    cJSON *a = cJSON_AddArrayToObject(j, "stage_layers");  // [first layer, end] of each (virtual) stage
    for (int k = 0; k < S && a; k++) {
        cJSON *e = cJSON_CreateArray();
        cJSON_AddItemToArray(e, cJSON_CreateNumber(p->bounds[k]));
        cJSON_AddItemToArray(e, cJSON_CreateNumber(p->bounds[k + 1]));
        cJSON_AddItemToArray(a, e);
    }
    if (!p->layer_cost) return;
    cJSON *l = cJSON_AddArrayToObject(j, "layer_seconds"), *st = cJSON_AddArrayToObject(j, "stage_seconds");
    for (int i = 0; i < L && l; i++) cJSON_AddItemToArray(l, cJSON_CreateNumber(p->layer_cost[i]));
    for (int k = 0; k < S && st; k++) {
        double sum = 0;
        for (int i = p->bounds[k]; i < p->bounds[k + 1]; i++) sum += p->layer_cost[i];
        cJSON_AddItemToArray(st, cJSON_CreateNumber(sum));
    }
}

// ---- spares: a dead rank's place, its state from a twin -----------------------
//
// Every rank of tensor rank t holds the same shard block and optimizer state
// (T = 1: every rank the whole block), so a spare in a dead rank's place
// takes them from a rank of its tensor rank that has them, and the stages'
// cut from a survivor; the pipelines' communicators, which the new
// generation broke, are split again (regroup, as a spare's init does).

// A failed step: the pipelines' transfers end (their communicators aborted,
// so no wait lasts) and the communicators go; what the step summed of its
// micro-batches is dropped.
static void leave_step(pipe *p) {
    p->have_norm = 0;
    if (p->acc && !p->base.device) memset(p->acc, 0, sizeof(int64_t) * p->base.n);
    if (p->pp) dt_comm_abort(p->pp, "a worker died: the step is redone");
    if (p->ppb && p->ppb != p->pp) dt_comm_abort(p->ppb, "a worker died: the step is redone");
    for (int w = 0; w < WAYS; w++)
        if (p->gpus[w]) dt_comm_abort(p->gpus[w], "a worker died: the step is redone");
    for (int v = 0; v < p->V && p->ch; v++)
        for (int i = 0; i < p->ch[v].nslots && p->ch[v].slots; i++) {
            dt_wait(&p->ch[v].slots[i].send_out);
            dt_wait(&p->ch[v].slots[i].send_d);
        }
    dev_links_close(p);
    dev_sums_close(p, "a worker died: the step is redone");
    if (p->ppb != p->pp) dt_comm_destroy(p->ppb);
    dt_comm_destroy(p->pp);
    dt_comm_destroy(p->rep);
    dt_comm_destroy(p->dp);
    dt_comm_destroy(p->tie);
    p->pp = p->ppb = p->rep = p->dp = p->tie = NULL;
}

// A rank that holds its state: the step left, and on a GPU the step's
// fixed-point sums dropped there and the host's copy made the device's
// (the state a spare's twin gives, or the loop shares).
static void pp_abandon(dt_strategy *s) {
    pipe *p = (pipe *)s;
    leave_step(p);
    dt_status st = p->dacc.base ? dt_dev_vm_zero(&p->dacc) : DT_OK;
    if (st == DT_OK && s->device) st = dev_get_kept(p, 1);
    p->err = st;
    if (st != DT_OK)  // (regroup, which comes next, says it)
        snprintf(p->errmsg, sizeof p->errmsg, "the device's state to the host, for a spare: %s", dt_last_error());
}

static dt_status pp_regroup(dt_strategy *s) {
    pipe *p = (pipe *)s;
    if (p->err != DT_OK) {
        dt_status e = p->err;
        p->err = DT_OK;
        return dt_error(e, "%s", p->errmsg);
    }
    leave_step(p);  // (what a try before this one left)
    dt_status st = split_pipelines(p);
    return st == DT_OK ? share_cut(p, 1) : st;  // (as a replacement's layout takes it)
}

// After a spare took a dead rank's place (every rank regrouped; the cut
// came in the spare's layout): a rank's block from a twin that has it, the
// ranks of its stage and tensor rank in the other replicas (what it keeps
// of the block and its optimizer state; with T = 1 and every layer kept,
// the whole block came with the loop's state).
static dt_status pp_take_over(dt_strategy *s, int have, int *lost) {
    pipe *p = (pipe *)s;
    *lost = 0;
    if (p->T == 1 && !p->held) return dev_put_kept(p);  // (the whole block came with the loop's state)
    dt_comm_t twins = p->held ? p->dp : p->shard;
    int root, n;
    dt_status st = holder(twins, have, &root);
    if (st != DT_OK) return st;
    if (root < 0) {
        *lost = 1;
        return dt_error(DT_ERR_COMM, "model parallel: no surviving worker holds stage %d, tensor rank %d's layers",
                        p->stage, p->t);
    }
    const dt_grad_range *k = kept(p, &n);
    for (int i = 0; i < n && st == DT_OK; i++) {
        st = dt_broadcast(s->params + k[i].offset, s->params + k[i].offset, k[i].len, DT_F32, root, twins);
        for (int j = 0; j < dt_optim_num_states(s->opt) && st == DT_OK; j++) {
            float *o = dt_optim_state(s->opt, j) + k[i].offset;
            st = dt_broadcast(o, o, k[i].len, DT_F32, root, twins);
        }
    }
    return st == DT_OK ? dev_put_kept(p) : st;
}

const dt_strategy_ops dt_strategy_pipeline = {
    .name = "model-parallel",
    .size = sizeof(pipe),
    .wants = pp_wants,
    .check = pp_check,
    .max_micro = pp_max_micro,
    .init = pp_init,
    .fini = pp_fini,
    .run_step = pp_run_step,
    .sync = pp_sync,
    .grad_norm = pp_grad_norm,
    .grads_nonfinite = pp_grads_nonfinite,
    .update = pp_update,
    .params_host = pp_params_host,
    .ckpt_stage = pp_ckpt_stage,
    .ckpt_save = pp_ckpt_save,
    .params_needed = pp_params_needed,
    .params_eval = pp_params_eval,
    .ckpt_restore = pp_ckpt_restore,
    .summary = pp_summary,
    .abandon = pp_abandon,
    .take_over = pp_take_over,
    .layout = pp_layout,
    .regroup = pp_regroup,
};
