/* Model parallel, the "model-parallel" strategy (strategy.h;
 * docs/model-parallel.md): tensor parallel and pipeline parallel of the GPT,
 * with data parallel outside them.
 *
 * [parallel] tensor = T splits every layer over T ranks (the model's
 * shards, dtrain/gpt.h: heads, MLP units and vocabulary divided, two
 * allreduces a layer each way, made by the task on its shard's group).
 * [parallel] pipeline = P cuts the GPT's n_layer blocks into P stages
 * (balanced by count, or pipeline_split = "a,b,..." layers per stage): the
 * embedding runs on the first stage, the head and the loss on the last. The
 * W workers form D = W / (T P) data-parallel replicas, laid out as Megatron
 * does, tensor innermost, then data, then pipeline:
 *
 *   rank = (stage * D + replica) * T + t
 *
 * Sub-communicators (dt_comm_split, each with the world's timeouts and
 * checks): the T ranks of (stage, replica) run one shard group (the
 * task's); the P ranks of (replica, t) one pipeline, rank in it = stage;
 * the W / T ranks of tensor rank t hold the same shard of the parameters,
 * over which the gradients are summed.
 *
 * A step cuts the replica's share of the global batch into M =
 * micro_batches micro-batches and runs them through the stages, activations
 * [len,T,C] forward and their gradients backward by dt_isend/dt_irecv, in
 * one of two schedules: "gpipe" (all forwards, then all backwards: M
 * activation sets alive on every stage) or "1f1b" (P - s - 1 warm-up
 * forwards on stage s, then one forward and one backward in turn, then the
 * rest of the backwards: at most P - s sets alive). Each micro-batch has its
 * own activation set from the task's stage calls (task.h). With P = 1 the
 * one stage runs the M micro-batches one after the other.
 *
 * Parameters: every rank holds its shard's whole flat block (the whole
 * model when T = 1) and its optimizer state, as replicated data parallel
 * does; a stage computes the gradients of its own layers only (the others
 * stay zero). sync() then sums the gradient block over the W / T ranks of
 * the same shard: per replica every parameter has one stage that computed
 * it -- except the tied token embedding, whose two parts (embedding on the
 * first stage, head on the last) are added there, as the tie requires --
 * and over the replicas the sum is the global mean (gradients carry the
 * weight len / global). The ranks of a shard then hold the same gradient,
 * take the same norm (the split tensors' squares summed over the T shards,
 * the whole ones counted once) and make the same update, so the weights
 * stay equal on them. The cost of this version: every rank stores and
 * updates all the layers of its shard, and the gradient sum moves the
 * whole block (docs/model-parallel.md).
 *
 * The loss: only the last stage's tensor rank 0 reports it; the others add
 * 0 to the control plane's sum, which divides by the global batch. */
#include "engine/strategy.h"
#include "engine/worker.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_STAGES 1024

typedef struct {
    dt_task_stage *st;
    float *in, *out, *d;   // the stream into and out of the stage, its gradient (d owned)
    size_t count, cap;     // floats in the current micro-batch's stream; d's room
    dt_request_t send_out, send_d;
} slot;

typedef struct {
    dt_strategy base;
    int T, P, D, M, gpipe;
    int t, stage, replica, l0, l1;
    dt_comm_t pp;          // this replica's stages, rank = stage
    dt_comm_t shard;       // the ranks of this tensor rank (T > 1; else the world)
    dt_comm_t tp;          // this (stage, replica)'s tensor ranks (T > 1)
    const dt_task_ops *tops;
    int nslots;
    slot *slots;
    int *off, *len;        // this step's micro-batches, in the global batch
    double t_compute, t_wait;
    int alive, peak;
    int64_t steps;
} pipe;

static int micro_batches(const dt_config *c) { return c->micro_batches > 0 ? c->micro_batches : c->pipeline; }

// The first layer of each stage, bounds[0..P] (bounds[P] = n_layer), from
// pipeline_split or balanced by count.
static dt_status stage_bounds(const dt_config *c, int *bounds) {
    int P = c->pipeline, L = c->n_layer;
    if (!c->pipeline_split[0]) {
        for (int s = 0; s <= P; s++) bounds[s] = (int)((long)L * s / P);
        return DT_OK;
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
        return dt_error(DT_ERR_CONFIG, "[parallel] pipeline_split = \"%s\" gives %s%d stages; pipeline = %d needs %d",
                        c->pipeline_split, n > P ? "more than " : "", n > P ? P : n, P, P);
    if (sum != L)
        return dt_error(DT_ERR_CONFIG, "[parallel] pipeline_split = \"%s\" adds up to %d layers; the model has %d ([model] n_layer)",
                        c->pipeline_split, sum, L);
    return DT_OK;
}

static int pp_wants(const dt_config *c) { return c->pipeline > 1 || c->tensor > 1; }

static dt_status pp_check(const dt_config *c, int W) {
    int T = c->tensor, P = c->pipeline, M = micro_batches(c);
    const char *what = P > 1 ? "[parallel] pipeline" : "[parallel] tensor";
    int v = P > 1 ? P : T;
    if (!c->gpt)
        return dt_error(DT_ERR_CONFIG, "%s = %d: model parallelism runs the GPT only; the classifier model ([model] layer = ...) is not supported yet",
                        what, v);
    if (c->deterministic)
        return dt_error(DT_ERR_CONFIG, "%s = %d with deterministic = true is not supported yet", what, v);
    if (c->grad_accum > 1)
        return dt_error(DT_ERR_CONFIG, "%s = %d with [train] grad_accum = %d: use [parallel] micro_batches for the micro-batches of a model-parallel step",
                        what, v, c->grad_accum);
    if (P > c->n_layer)
        return dt_error(DT_ERR_CONFIG, "[parallel] pipeline = %d stages is more than the model's %d layers ([model] n_layer)",
                        P, c->n_layer);
    if (T > 1) {
        dt_gpt_config gc = {c->n_layer, c->n_head, c->n_embd, c->block_size, c->vocab_size, c->padded_vocab_size};
        dt_status st = dt_gpt_tensor_parallel_check(&gc, T, "[parallel] tensor");
        if (st != DT_OK) return dt_error(DT_ERR_CONFIG, "%s", dt_last_error());
    }
    if (W % (T * P))
        return T == 1 ? dt_error(DT_ERR_CONFIG, "[parallel] pipeline = %d does not divide the %d workers (data parallel = workers / pipeline)",
                                 P, W)
                      : dt_error(DT_ERR_CONFIG, "[parallel] tensor = %d x pipeline = %d = %d ranks a replica do not divide the %d workers (data parallel = workers / (tensor x pipeline))",
                                 T, P, T * P, W);
    if (c->pipeline_schedule == 1 && M < P)
        return dt_error(DT_ERR_CONFIG, "[parallel] micro_batches = %d is fewer than the pipeline's %d stages; schedule = 1f1b needs at least one per stage",
                        M, P);
    int D = W / (T * P);
    if (c->batch / D < M)
        return dt_error(DT_ERR_CONFIG, "[train] batch %d over %d data-parallel replica%s leaves %d samples, fewer than [parallel] micro_batches = %d",
                        c->batch, D, D > 1 ? "s" : "", c->batch / D, M);
    int bounds[MAX_STAGES + 1];
    dt_status st = stage_bounds(c, bounds);
    for (int s = 0; s < P && st == DT_OK; s++)
        if (bounds[s + 1] <= bounds[s])
            st = dt_error(DT_ERR_CONFIG, "[parallel] pipeline stage %d has no layers", s);
    return st;
}

static int pp_max_micro(const dt_config *c, int W) {
    int TP = c->tensor * c->pipeline, D = W / TP > 0 ? W / TP : 1, M = micro_batches(c);
    int share = (c->batch + D - 1) / D;
    return (share + M - 1) / M;
}

// The layout, on rank 0: the formula and, for a small world, every rank.
static void print_layout(pipe *p, const int *bounds) {
    char layers[512] = "", ranks[1024] = "";
    size_t n = 0;
    for (int k = 0; k < p->P && n < sizeof layers - 32; k++)
        n += (size_t)snprintf(layers + n, sizeof layers - n, "%s%d: [%d, %d)", k ? ", " : "", k, bounds[k], bounds[k + 1]);
    int W = p->base.world;
    n = 0;
    for (int r = 0; r < W && W <= 64 && n < sizeof ranks - 40; r++)
        n += (size_t)snprintf(ranks + n, sizeof ranks - n, "%s%d=(t%d,d%d,p%d)", r ? " " : "", r, r % p->T,
                              r / p->T % p->D, r / p->T / p->D);
    dt_log(DT_LOG_INFO,
           "model parallel: tensor %d x data %d x pipeline %d = %d workers, rank = (stage x %d + replica) x %d + tensor rank (tensor innermost, then data, then pipeline)%s%s",
           p->T, p->D, p->P, W, p->D, p->T, *ranks ? "; ranks " : "", ranks);
    dt_log(DT_LOG_INFO, "model parallel: schedule %s, %d micro-batches; layers of stage %s", p->gpipe ? "gpipe" : "1f1b",
           p->M, layers);
}

static dt_status pp_init(dt_strategy *s) {
    pipe *p = (pipe *)s;
    const dt_config *c = s->c;
    int bounds[MAX_STAGES + 1];
    dt_status st = stage_bounds(c, bounds);
    if (st != DT_OK) return st;
    p->T = c->tensor;
    p->P = c->pipeline;
    p->D = s->world / (p->T * p->P);
    p->M = micro_batches(c);
    p->gpipe = c->pipeline_schedule == 0;
    p->t = s->rank % p->T;
    p->replica = s->rank / p->T % p->D;
    p->stage = s->rank / p->T / p->D;
    p->l0 = bounds[p->stage];
    p->l1 = bounds[p->stage + 1];
    p->nslots = p->gpipe ? p->M : (p->P - p->stage < p->M ? p->P - p->stage : p->M);
    p->slots = calloc((size_t)p->nslots, sizeof *p->slots);
    p->off = malloc(sizeof(int) * (size_t)p->M);
    p->len = malloc(sizeof(int) * (size_t)p->M);
    if (!p->slots || !p->off || !p->len) return dt_error(DT_ERR_NOMEM, "model parallel: out of memory");
    st = dt_comm_split(s->comm, p->replica * p->T + p->t, p->stage, &p->pp);
    if (st == DT_OK && p->T > 1) st = dt_comm_split(s->comm, p->t, s->rank, &p->shard);
    if (st == DT_OK && p->T > 1) st = dt_comm_split(s->comm, s->rank / p->T, p->t, &p->tp);
    if (st != DT_OK) return dt_error(st, "model parallel: splitting the workers: %s", dt_last_error());
    if (s->rank == 0) print_layout(p, bounds);
    return DT_OK;
}

static void pp_fini(dt_strategy *s) {
    pipe *p = (pipe *)s;
    for (int i = 0; i < p->nslots && p->slots; i++) {
        dt_wait(&p->slots[i].send_out);
        dt_wait(&p->slots[i].send_d);
        if (p->tops) p->tops->stage_free(p->slots[i].st);
        free(p->slots[i].d);
    }
    if (p->steps > 0 && p->replica == 0 && p->t == 0) {
        double all = p->t_compute + p->t_wait;
        dt_log(DT_LOG_INFO,
               "pipeline stage %d of %d (rank %d, layers [%d, %d)): forward+backward %.3f s, waiting %.3f s over %lld steps: bubble %.1f%% (model (P-1)/(M+P-1) = %.1f%%); at most %d activation set%s alive",
               p->stage, p->P, s->rank, p->l0, p->l1, p->t_compute, p->t_wait, (long long)p->steps,
               all > 0 ? 100 * p->t_wait / all : 0, 100.0 * (p->P - 1) / (p->M + p->P - 1), p->peak, p->peak == 1 ? "" : "s");
    }
    dt_comm_destroy(p->pp);
    dt_comm_destroy(p->shard);
    dt_comm_destroy(p->tp);
    free(p->slots);
    free(p->off);
    free(p->len);
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

static dt_status forward(pipe *p, dt_task *task, int k, double *loss_sum) {
    slot *sl = &p->slots[k % p->nslots];
    dt_status st = wait_timed(p, &sl->send_out, "sending activations to", p->stage + 1);
    if (st == DT_OK)
        st = p->tops->stage_begin(task, sl->st, p->off[k], p->len[k], (float)p->len[k] / (float)p->base.global,
                                  &sl->in, &sl->out, &sl->count);
    if (st == DT_OK && p->stage > 0) {
        dt_request_t r = NULL;
        st = dt_irecv(sl->in, sl->count, DT_F32, p->stage - 1, p->pp, &r);
        if (st == DT_OK) st = wait_timed(p, &r, "receiving activations from", p->stage - 1);
    }
    if (st != DT_OK) return st;
    float loss = 0;
    double t0 = dt_now();
    dt_obs_begin(p->base.obs, DT_OBS_FORWARD);
    st = p->tops->stage_forward(task, sl->st, &loss);
    dt_obs_end(p->base.obs, DT_OBS_FORWARD);
    p->t_compute += dt_now() - t0;
    if (st != DT_OK) return st;
    if (p->stage == p->P - 1) *loss_sum += p->t == 0 ? (double)loss * p->len[k] : 0;
    else st = dt_isend(sl->out, sl->count, DT_F32, p->stage + 1, p->pp, &sl->send_out);
    if (++p->alive > p->peak) p->peak = p->alive;
    return st;
}

static dt_status backward(pipe *p, dt_task *task, int k) {
    slot *sl = &p->slots[k % p->nslots];
    dt_status st = wait_timed(p, &sl->send_d, "sending gradients to", p->stage - 1);
    if (st == DT_OK && sl->cap < sl->count) {
        free(sl->d);
        sl->cap = 0;
        if (!(sl->d = malloc(sizeof(float) * sl->count))) return dt_error(DT_ERR_NOMEM, "pipeline: out of memory");
        sl->cap = sl->count;
    }
    if (st == DT_OK && p->stage < p->P - 1) {
        dt_request_t r = NULL;
        st = dt_irecv(sl->d, sl->count, DT_F32, p->stage + 1, p->pp, &r);
        if (st == DT_OK) st = wait_timed(p, &r, "receiving gradients from", p->stage + 1);
    }
    if (st != DT_OK) return st;
    double t0 = dt_now();
    dt_obs_begin(p->base.obs, DT_OBS_BACKWARD);
    st = p->tops->stage_backward(task, sl->st, sl->d);
    dt_obs_end(p->base.obs, DT_OBS_BACKWARD);
    p->t_compute += dt_now() - t0;
    if (st == DT_OK && p->stage > 0) st = dt_isend(sl->d, sl->count, DT_F32, p->stage - 1, p->pp, &sl->send_d);
    p->alive--;
    return st;
}

static dt_status pp_run_step(dt_strategy *s, const dt_task_ops *tops, dt_task *task, int64_t step,
                             const dt_task_batch *b, double *loss_sum) {
    pipe *p = (pipe *)s;
    *loss_sum = 0;
    int first = (int)((long)b->global * p->replica / p->D);
    int share = (int)((long)b->global * (p->replica + 1) / p->D) - first;
    int max_len = pp_max_micro(s->c, s->world);
    if (!p->tops) {  // the activation sets, at the first step
        if (!tops->stage_create)
            return dt_error(DT_ERR_CONFIG, "strategy pipeline: the %s model has no stages", tops->name);
        p->tops = tops;
        for (int i = 0; i < p->nslots; i++) {
            dt_status st = tops->stage_create(task, p->l0, p->l1, max_len, &p->slots[i].st);
            if (st != DT_OK) return st;
        }
    }
    for (int k = 0; k < p->M; k++) {
        p->off[k] = first + (int)((long)share * k / p->M);
        p->len[k] = first + (int)((long)share * (k + 1) / p->M) - p->off[k];
    }
    s->nmicro = p->M;
    s->global = b->global;
    p->alive = 0;
    int M = p->M, warm = p->gpipe ? M : (p->P - p->stage - 1 < M ? p->P - p->stage - 1 : M);
    dt_status st = DT_OK;
    int f = 0, bw = 0;  // next forward, next backward
    while (st == DT_OK && f < warm) st = forward(p, task, f++, loss_sum);
    if (st == DT_OK) st = dt_fault_step(s->rank, step + 1);
    while (st == DT_OK && f < M) {  // 1f1b's steady state
        st = forward(p, task, f++, loss_sum);
        if (st == DT_OK) st = backward(p, task, bw++);
    }
    while (st == DT_OK && bw < M) st = backward(p, task, bw++);
    for (int i = 0; i < p->nslots && st == DT_OK; i++) {
        st = wait_timed(p, &p->slots[i].send_out, "sending activations to", p->stage + 1);
        if (st == DT_OK) st = wait_timed(p, &p->slots[i].send_d, "sending gradients to", p->stage - 1);
    }
    p->steps++;
    return st;
}

// Every rank's gradient block becomes the global one of its shard (see the top).
static dt_status pp_sync(dt_strategy *s) {
    pipe *p = (pipe *)s;
    double t0 = dt_now();
    dt_status st = dt_allreduce(s->grads, s->grads, s->n, DT_F32, DT_SUM, p->shard ? p->shard : s->comm);
    double t = dt_now() - t0;
    s->comm_seconds += t;
    s->comm_exposed_seconds += t;
    if (st != DT_OK) return dt_error(st, "model parallel: gradient allreduce: %s", dt_last_error());
    return DT_OK;
}

// The whole model's gradient norm from the shards: the split ranges' squares
// of every shard, the whole ones of shard 0, summed in shard order.
static dt_status pp_grad_norm(dt_strategy *s, double *norm) {
    pipe *p = (pipe *)s;
    if (p->T == 1) return dt_strategy_norm_replicated(s, norm);
    double mine = 0, all[MAX_STAGES];
    for (int i = 0; i < s->norder; i++)
        if (s->order_split[i] || p->t == 0) mine += dt_sum_squares(s->grads + s->order[i].offset, s->order[i].len);
    // (doubles moved as their 8 bytes: no reduction touches them)
    dt_status st = p->T <= MAX_STAGES ? dt_allgather(&mine, all, 1, DT_I64, p->tp) : DT_ERR_ARG;
    if (st != DT_OK) return dt_error(st, "model parallel: gradient norm: %s", dt_last_error());
    double sum = 0;
    for (int r = 0; r < p->T; r++) sum += all[r];
    *norm = sqrt(sum);
    return DT_OK;
}

// Shards: the whole model's parameters and optimizer state for a
// checkpoint, gathered from the shard group (every group holds the same).
static dt_status pp_params_sync(dt_strategy *s) {
    pipe *p = (pipe *)s;
    if (!s->whole) return DT_OK;
    size_t n = s->n;
    float *all = dt_alloc(sizeof(float) * n * (size_t)p->T);
    if (!all) return dt_error(DT_ERR_NOMEM, "model parallel: out of memory gathering the shards for a checkpoint");
    dt_status st = DT_OK;
    for (int j = -1; j < dt_optim_num_states(s->opt) && st == DT_OK; j++) {
        float *local = j < 0 ? s->params : dt_optim_state(s->opt, j), *whole = j < 0 ? s->whole : s->whole_states[j];
        st = dt_allgather(local, all, n, DT_F32, p->tp);
        for (int r = 0; r < p->T && st == DT_OK; r++) s->shard_copy(s->shard_user, r, all + n * r, whole, 1);
    }
    dt_free(all);
    return st == DT_OK ? DT_OK : dt_error(st, "model parallel: gathering the shards for a checkpoint: %s", dt_last_error());
}

// After a resume (every rank holds the whole model's state): this shard's.
static dt_status pp_ckpt_restore(dt_strategy *s, const char *path, int parts) {
    pipe *p = (pipe *)s;
    (void)parts;
    if (!s->whole || !path[0]) return DT_OK;
    s->shard_copy(s->shard_user, p->t, s->params, s->whole, 0);
    for (int j = 0; j < dt_optim_num_states(s->opt); j++)
        s->shard_copy(s->shard_user, p->t, dt_optim_state(s->opt, j), s->whole_states[j], 0);
    return DT_OK;
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
    .update = dt_strategy_update_slice,
    .params_sync = pp_params_sync,
    .ckpt_restore = pp_ckpt_restore,
};
