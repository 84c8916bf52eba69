/* dt_plan_* (train.h): the fastest layout of a run that fits. Every layout
 * the strategies accept (dt_train_check) on W workers is sized by the start
 * check's formula (dt_memory_worker) and timed by the simulator
 * (dt_sim_predict: the data-parallel exchange over the replicas) on top of
 * a model of one replica's step: the profile's measured time per sample,
 * split over the layers by their measured forward + backward times (by
 * their FLOPs where the profile has none), divided by tensor parallelism
 * and cut into pipeline stages with their bubble, plus the tensor-parallel
 * allreduces and the pipeline's transfers (dt_sim_allreduce). What `dtrain
 * plan` prints and `dtrain train --plan auto` trains (docs/plan.md). */
#include "dtrain/gpt.h"
#include "dtrain/nn.h"
#include "dtrain/train.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAXL DT_SIM_MAX_LAYERS  // layers whose costs a pipeline is cut by

dt_plan_params dt_plan_default_params(int workers) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int W = workers > 0 ? workers : 1, C = cores > 0 ? (int)cores : 1;
    return (dt_plan_params){.workers = W, .hosts = 1, .cores = C, .threads = C / W > 1 ? C / W : 1,
                            .link_bytes_per_s = 10e9 / 8, .link_latency_s = 50e-6,
                            .host_bytes_per_s = 5e9, .host_latency_s = 20e-6};
}

// ---- the replica's shape: FLOPs per layer, tensor-parallel exchanges ----

// A GPT's forward FLOPs per token by block (the head on the last one).
static int gpt_costs(const dt_config *c, double *f) {
    double C = c->n_embd, T = c->seq_len, V = c->padded_vocab_size > 0 ? c->padded_vocab_size : c->vocab_size;
    int L = c->n_layer < MAXL ? c->n_layer : MAXL;
    for (int i = 0; i < L; i++) f[i] = 24 * C * C + 4 * T * C;
    f[L - 1] += 2 * C * V;
    return L;
}

// Forward FLOPs per sample by layer into f; the number of layers (0: none known).
static int layer_costs(const dt_config *c, double *f) {
    if (c->gpt) return gpt_costs(c, f);
    if (c->nlayers > MAXL || dt_model_layer_costs(c->input, c->layers, c->nlayers, f) != DT_OK) return 0;
    return c->nlayers;
}

// The replica's layers as a pipeline cuts them: the weight of each in the
// step's compute, and the forward that recompute runs again as a share of
// that compute.
typedef struct {
    int n;             // layers (0: none known; the compute is one piece)
    double cost[MAXL]; // measured forward + backward per sample, else forward FLOPs
    double refwd;      // recompute: the blocks' forwards again, over the whole compute
} layers_t;

// From the profile's measured per-layer times where it has the model's
// layers (a GPT's blocks are alike: the cheapest forward, the one without
// the embedding or the head, stands for each block's in recompute's);
// else each layer's forward FLOPs, recompute one forward of the whole
// (1 - the backward's share of the step).
static void layer_model(const dt_config *c, const dt_sim_profile *p, layers_t *ly) {
    int L = c->gpt ? c->n_layer : c->nlayers;
    if (p->layers != L || L > MAXL) {
        ly->n = layer_costs(c, ly->cost);
        ly->refwd = 1 - p->backward_share;
        return;
    }
    double total = 0, fwd = INFINITY;
    for (int l = 0; l < L; l++) {
        ly->cost[l] = p->layer_forward_s[l] + p->layer_backward_s[l];
        total += ly->cost[l];
        fwd = fmin(fwd, p->layer_forward_s[l]);
    }
    ly->n = L;
    ly->refwd = total > 0 ? L * fwd / total : 1 - p->backward_share;
}

// The busiest of P stages cut from f[0..n) in contiguous runs, as a share
// of the whole (the best cut: what a balanced pipeline gets).
static double stage_share(const double *f, int n, int P) {
    double total = 0, best[MAXL + 1], next[MAXL + 1];
    for (int i = 0; i < n; i++) total += f[i];
    if (P <= 1 || n <= 1 || total <= 0) return 1;
    if (P > n) P = n;
    // best[i]: the busiest stage of the best cut of f[0..i) into k stages
    for (int i = 0; i <= n; i++) best[i] = INFINITY;
    double s = 0;
    for (int i = 1; i <= n; i++) best[i] = s += f[i - 1];
    for (int k = 2; k <= P; k++) {
        for (int i = 0; i <= n; i++) {
            next[i] = INFINITY;
            double tail = 0;
            for (int j = i - 1; j >= k - 1; j--) {
                tail += f[j];
                double m = fmax(best[j], tail);
                if (m < next[i]) next[i] = m;
            }
        }
        memcpy(best, next, sizeof best);
    }
    return best[n] / total;
}

// Tensor parallelism of a sequential model: its linear and convolution
// layers in pairs (an odd last one whole), the first of a pair split over
// output channels, the second over inputs and its output allreduced (once
// each way). *share gets a rank's part of the FLOPs, *floats the floats
// per sample allreduced in all; returns the pairs.
static int classifier_tp(const dt_config *c, const double *f, int T, double *share, double *floats) {
    int ch = c->input[0], h = c->input[1] > 0 ? c->input[1] : 1, w = c->input[2] > 0 ? c->input[2] : 1, K = 0, k = 0;
    for (int i = 0; i < c->nlayers; i++) K += c->layers[i].kind == DT_LAYER_CONV2D || c->layers[i].kind == DT_LAYER_LINEAR;
    double total = 0, split = 0;
    *floats = 0;
    for (int i = 0; i < c->nlayers; i++) {
        const dt_layer_spec *l = &c->layers[i];
        int st = l->stride > 0 ? l->stride : l->kind == DT_LAYER_MAXPOOL ? l->kernel : 1;
        total += f[i];
        if (l->kind == DT_LAYER_CONV2D || l->kind == DT_LAYER_MAXPOOL) {
            int pad = l->kind == DT_LAYER_CONV2D ? l->pad : 0;
            h = (h + 2 * pad - l->kernel) / st + 1;
            w = (w + 2 * pad - l->kernel) / st + 1;
            if (l->kind == DT_LAYER_CONV2D) ch = l->out;
        } else if (l->kind == DT_LAYER_FLATTEN) {
            ch *= h * w, h = w = 1;
        } else if (l->kind == DT_LAYER_LINEAR) {
            ch = l->out, h = w = 1;
        }
        if (l->kind != DT_LAYER_CONV2D && l->kind != DT_LAYER_LINEAR) continue;
        if (k < K / 2 * 2) split += f[i];
        if (k++ % 2 == 1) *floats += (double)ch * h * w;  // (the second of a pair)
    }
    *share = total > 0 ? (split / T + (total - split)) / total : 1;
    return K / 2;
}

// ---- one layout's step ----

typedef struct {
    double comp_s, bwd_share, data_s, opt_s, params;  // the profile, contention counted
} rank_cost;

// The replica's step without its data-parallel exchange: its compute
// (bubbles included) and the tensor-parallel and pipeline transfers.
static double replica_step(const dt_config *c, const dt_layout *l, const dt_plan_params *s, const rank_cost *rc,
                           const layers_t *ly, double b, double *share) {
    double tp_share = 1.0 / l->tensor, floats = 0;
    int T = l->tensor, P = l->pipeline, M = P > 1 ? l->micro_batches : 1;
    if (M < 1) M = P;
    int nar = 0;  // allreduces each way per micro-batch
    double stage = stage_share(ly->cost, ly->n, P);
    if (c->gpt) {
        nar = 2 * ((c->n_layer + P - 1) / P);
        floats = (double)c->seq_len * c->n_embd;
    } else if (T > 1 && ly->n) {
        nar = classifier_tp(c, ly->cost, T, &tp_share, &floats);
        if (nar) floats /= nar;
    }
    *share = stage * tp_share;
    double comp = rc->comp_s * (l->recompute ? 1 + ly->refwd : 1);
    double per_micro = b / M * comp * stage * tp_share;
    int R = s->workers / s->hosts;
    dt_sim_params grp = {.hosts = T > R ? (T + R - 1) / R : 1, .ranks_per_host = T > R ? R : T,
                        .link_bytes_per_s = s->link_bytes_per_s, .link_latency_s = s->link_latency_s,
                        .host_bytes_per_s = s->host_bytes_per_s, .host_latency_s = s->host_latency_s};
    double tp = T > 1 ? 2 * nar * dt_sim_allreduce(4 * floats * b / M, &grp, NULL) : 0;
    // a pipeline's activations and their gradients, a stage's neighbour away
    double width = c->gpt ? floats
                          : (double)c->input[0] * (c->input[1] > 0 ? c->input[1] : 1) * (c->input[2] > 0 ? c->input[2] : 1);
    double bytes = 4 * b / M * width, lat = s->host_latency_s, bw = s->host_bytes_per_s;
    if (s->hosts > 1 && s->workers / P >= R) lat = s->link_latency_s, bw = s->link_bytes_per_s;
    double pp = P > 1 ? 2 * (lat + bytes / bw) : 0;
    return (M + P - 1) * (per_micro + tp + pp);
}

// The step of layout l: the replica's, then the simulator's exchange of
// its gradients over the D replicas.
static void predict(const dt_config *c, const dt_layout *l, const dt_plan_params *s, const rank_cost *rc,
                    const layers_t *ly, dt_plan_row *row) {
    int W = s->workers, R = W / s->hosts, TP = l->tensor * l->pipeline, D = W / TP;
    double b = (double)c->batch / D, share;
    double rep = replica_step(c, l, s, rc, ly, b, &share);
    double ratio = l->codec == DT_COMP_INT8 ? 0.25 : l->codec ? 0.5 : 1;  // (fp16, bf16)
    int hd = D * l->tensor > R ? (D * l->tensor + R - 1) / R : 1;  // hosts a replica group spans
    if (hd > D) hd = D;
    dt_sim_profile q = {.compute_s = rep / b, .backward_share = rc->bwd_share, .data_s = rc->data_s,
                        .optimizer_s = rc->opt_s * share, .params = rc->params * share * ratio, .batch = c->batch,
                        .workers = D, .bucket_bytes = 1024.0 * l->bucket_kb};
    dt_sim_params sp = {.hosts = hd, .ranks_per_host = D / hd, .link_bytes_per_s = s->link_bytes_per_s,
                        .link_latency_s = s->link_latency_s, .host_bytes_per_s = s->host_bytes_per_s,
                        .host_latency_s = s->host_latency_s, .zero = l->zero > 0};
    dt_sim_point o;
    dt_sim_predict(&q, &sp, &o);
    double extra = 0, S = 4 * rc->params * share;
    if (l->zero >= 3 && D > 1)  // every layer's parameters gathered for forward and again for backward
        extra = dt_sim_allreduce(S, &sp, NULL) + 2 * (c->gpt ? c->n_layer : c->nlayers) * s->host_latency_s;
    if (l->codec && D > 1) extra += 3 * S / s->host_bytes_per_s;  // encode, decode, error feedback
    // With no core idle (the host's ranks' threads fill its cores) a
    // bucket's fixed cost is CPU time taken from the compute, not hidden
    // behind backward: every bucket's but the last (exposed already).
    if (D > 1 && hd == 1 && R * s->threads >= s->cores)
        extra += (ceil(S * ratio / q.bucket_bytes) - 1) * 2 * s->host_latency_s;
    row->l = *l;
    row->compute_s = o.compute_s;
    row->exposed_s = o.exposed_s + extra;
    row->step_s = o.step_s + extra;
}

// ---- the layouts ----

typedef struct {
    const dt_config *c;
    const dt_plan_params *s;
    rank_cost rc;
    layers_t ly;
    size_t limit, machine;
    dt_plan_row *rows;
    int n, cap;
    char first_error[512];  // why plain data parallel was refused
} plan_t;

void dt_plan_apply(dt_config *c, const dt_layout *l) {
    c->zero = l->zero;
    c->tensor = l->tensor;
    c->pipeline = l->pipeline;
    c->micro_batches = l->micro_batches;
    c->pipeline_schedule = l->schedule;
    c->recompute = l->recompute;
    c->bucket_kb = l->bucket_kb;
    c->comp_method = l->codec;
}

// Layout l when the strategies accept it: timed, sized and kept.
static void consider(plan_t *pl, const dt_layout *l) {
    dt_config cc = *pl->c;
    dt_plan_apply(&cc, l);
    int W = pl->s->workers;
    if (dt_train_check(&cc, W) != DT_OK) {
        if (!pl->first_error[0]) snprintf(pl->first_error, sizeof pl->first_error, "%s", dt_last_error());
        return;
    }
    if (pl->n == pl->cap) {
        int cap = pl->cap ? 2 * pl->cap : 64;
        dt_plan_row *r = realloc(pl->rows, sizeof *r * (size_t)cap);
        if (!r) return;
        pl->rows = r, pl->cap = cap;
    }
    dt_plan_row *row = &pl->rows[pl->n];
    predict(&cc, l, pl->s, &pl->rc, &pl->ly, row);
    row->formula = dt_memory_worker(&cc, W, NULL);
    if (row->formula == 0) return;  // (the data files' headers could not be read)
    row->memory = row->formula + (size_t)(pl->s->memory_extra > 0 ? pl->s->memory_extra : 0);
    int here = pl->s->hosts > 1 ? W / pl->s->hosts : W;  // ranks sharing this machine's memory
    row->fits = (!pl->limit || row->memory <= pl->limit) && row->memory <= pl->machine / (size_t)here;
    pl->n++;
}

// The choices beside data, tensor and pipeline: micro-batches and schedule
// for a pipeline, recompute for a GPT, bucket and codec for plain data
// parallel.
static void each_detail(plan_t *pl, dt_layout l) {
    const dt_config *c = pl->c;
    int plain = l.tensor * l.pipeline == 1 && l.zero == 0 && pl->s->workers > 1;
    int buckets[3] = {c->bucket_kb, 256, 16384}, nb = plain ? 3 : 1;
    int codecs[4] = {DT_COMP_NONE, DT_COMP_FP16, DT_COMP_BF16, DT_COMP_INT8}, nc = plain && pl->s->lossy ? 4 : 1;
    for (int r = 0; r <= (c->gpt ? 1 : 0); r++)
        for (int m = 1; m <= (l.pipeline > 1 ? 4 : 1); m *= 2)
            for (int sch = 0; sch <= (l.pipeline > 1 ? 1 : 0); sch++)
                for (int b = 0; b < nb; b++)
                    for (int k = 0; k < nc; k++) {
                        if (b && buckets[b] == c->bucket_kb) continue;
                        l.recompute = r;
                        l.micro_batches = l.pipeline > 1 ? m * l.pipeline : c->micro_batches;
                        l.schedule = l.pipeline > 1 ? sch : c->pipeline_schedule;
                        l.bucket_kb = buckets[b];
                        l.codec = codecs[k];
                        consider(pl, &l);
                    }
}

// Fitting rows first, fastest first (equal times: less memory, then the
// simpler layout), then the rest by memory.
static int by_speed(const void *a, const void *b) {
    const dt_plan_row *x = a, *y = b;
    if (x->fits != y->fits) return y->fits - x->fits;
    double u = x->fits ? x->step_s : (double)x->memory, v = y->fits ? y->step_s : (double)y->memory;
    if (u != v) return u < v ? -1 : 1;
    if (x->memory != y->memory) return x->memory < y->memory ? -1 : 1;
    const int *p = &x->l.zero, *q = &y->l.zero;  // (dt_layout: ints only)
    for (size_t i = 0; i < sizeof x->l / sizeof(int); i++)
        if (p[i] != q[i]) return p[i] < q[i] ? -1 : 1;
    return 0;
}

dt_status dt_plan_rank(const dt_config *c, const dt_sim_profile *p, const dt_plan_params *s, size_t limit,
                       dt_plan_row **rows, int *n, int *nfit) {
    int W = s->workers;
    if (W < 1 || s->hosts < 1 || W % s->hosts)
        return dt_error(DT_ERR_ARG, "plan: %d workers cannot be spread evenly over %d hosts", W, s->hosts);
    // Ranks that share a host's cores run slower: by R's load over that of
    // the profile's run (measured on p->workers ranks of this machine).
    int R = W / s->hosts, P = p->workers > 0 ? p->workers : 1;
    double k = fmax(1, (double)R * s->threads / s->cores) / fmax(1, (double)P * s->threads / s->cores);
    plan_t pl = {.c = c, .s = s, .limit = limit, .machine = dt_mem_machine(NULL),
                 .rc = {p->compute_s * k, p->backward_share, p->data_s * k, p->optimizer_s * k, p->params}};
    layer_model(c, p, &pl.ly);
    for (int T = 1; T <= W; T++)
        for (int P = 1; T * P <= W; P++) {
            if (W % (T * P)) continue;
            // (batch norm takes no model parallelism yet: the config refuses it)
            if (T * P > 1 && !c->gpt && dt_layers_have_batchnorm(c->layers, c->nlayers)) continue;
            for (int z = 0; z <= (T * P == 1 ? 3 : 1); z++)
                each_detail(&pl, (dt_layout){.zero = z, .tensor = T, .pipeline = P});
        }
    if (pl.n == 0) {
        free(pl.rows);
        return dt_error(DT_ERR_CONFIG, "no layout of the model runs on %d workers: %s", W,
                        pl.first_error[0] ? pl.first_error : dt_last_error());
    }
    qsort(pl.rows, (size_t)pl.n, sizeof *pl.rows, by_speed);
    *nfit = 0;
    while (*nfit < pl.n && pl.rows[*nfit].fits) ++*nfit;
    *rows = pl.rows;
    *n = pl.n;
    return DT_OK;
}

// ---- words and flags ----

static const char *schedule_name(int s) { return s == 0 ? "gpipe" : s == 1 ? "1f1b" : "interleaved"; }

void dt_plan_sets(const dt_config *base, const dt_layout *l, char *out, size_t len) {
    size_t o = 0;
    out[0] = 0;
#define SET(cond, ...)                                                     \
    if ((cond) && o < len) o += (size_t)snprintf(out + o, len - o, __VA_ARGS__)
    SET(l->zero != base->zero, " --set parallel.zero=%d", l->zero);
    SET(l->tensor != base->tensor, " --set parallel.tensor=%d", l->tensor);
    SET(l->pipeline != base->pipeline, " --set parallel.pipeline=%d", l->pipeline);
    SET(l->micro_batches != base->micro_batches, " --set parallel.micro_batches=%d", l->micro_batches);
    SET(l->schedule != base->pipeline_schedule, " --set parallel.schedule=%s", schedule_name(l->schedule));
    SET(l->recompute != base->recompute, " --set train.recompute=%s", l->recompute ? "blocks" : "none");
    SET(l->bucket_kb != base->bucket_kb, " --set parallel.bucket_kb=%d", l->bucket_kb);
    SET(l->codec != base->comp_method, " --set compression.method=%s", dt_comp_method_name(l->codec));
#undef SET
}

void dt_plan_describe(const dt_layout *l, char *out, size_t len) {
    char pp[96] = "";
    if (l->pipeline > 1)
        snprintf(pp, sizeof pp, " x %d micro-batches %s", l->micro_batches, schedule_name(l->schedule));
    snprintf(out, len, "zero %d, tensor %d, pipeline %d%s%s, bucket %d KiB%s%s", l->zero, l->tensor, l->pipeline, pp,
             l->recompute ? ", recompute" : "", l->bucket_kb, l->codec ? ", codec " : "",
             l->codec ? dt_comp_method_name(l->codec) : "");
}
