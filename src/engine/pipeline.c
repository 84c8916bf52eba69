/* Pipeline parallel, the "pipeline" strategy (strategy.h; docs/model-parallel.md).
 *
 * [parallel] pipeline = P cuts the GPT's n_layer blocks into P stages
 * (balanced by count, or pipeline_split = "a,b,..." layers per stage): the
 * embedding runs on the first stage, the head and the loss on the last. The
 * W workers form D = W / P data-parallel replicas of the pipeline, laid out
 * as Megatron does with the data axis inner:
 *
 *   rank = stage * D + replica
 *
 * so stage s of replica r talks to ranks (s +- 1) * D + r, through a
 * sub-communicator per replica (dt_comm_split, rank in it = stage).
 *
 * A step cuts the replica's share of the global batch into M =
 * micro_batches micro-batches and runs them through the stages, activations
 * [len,T,C] forward and their gradients backward by dt_isend/dt_irecv, in
 * one of two schedules: "gpipe" (all forwards, then all backwards: M
 * activation sets alive on every stage) or "1f1b" (P - s - 1 warm-up
 * forwards on stage s, then one forward and one backward in turn, then the
 * rest of the backwards: at most P - s sets alive). Each micro-batch has its
 * own activation set from the task's stage calls (task.h).
 *
 * Parameters: every rank holds the whole flat block and the whole
 * optimizer state, as replicated data parallel does; a stage computes the
 * gradients of its own layers only (the others stay zero). sync() then sums
 * the gradient block over ALL ranks: per replica every parameter has one
 * stage that computed it -- except the tied token embedding, whose two
 * parts (embedding on the first stage, head on the last) are added there, as
 * the tie requires -- and over the replicas the sum is the global mean
 * (gradients carry the weight len / global). Every rank then holds the same
 * global gradient, takes the same norm (each parameter counted once) and
 * makes the same update, so the weights stay equal on all ranks and the
 * checkpoints, evaluation and final weights are those of data parallel. The
 * cost of this first version: every rank stores and updates the whole model
 * and the gradient sum moves the whole block (docs/model-parallel.md).
 *
 * The loss: only the last stage computes it; the other stages add 0 to the
 * control plane's sum, which divides by the global batch. */
#include "engine/strategy.h"
#include "engine/worker.h"

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
    int P, D, M, gpipe;
    int stage, replica, l0, l1;
    dt_comm_t pp;          // this replica's stages, rank = stage
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

static int pp_wants(const dt_config *c) { return c->pipeline > 1; }

static dt_status pp_check(const dt_config *c, int W) {
    int P = c->pipeline, M = micro_batches(c);
    if (!c->gpt)
        return dt_error(DT_ERR_CONFIG, "[parallel] pipeline = %d: pipeline parallel runs the GPT only; the classifier model ([model] layer = ...) is not supported yet",
                        P);
    if (c->deterministic)
        return dt_error(DT_ERR_CONFIG, "[parallel] pipeline = %d with deterministic = true is not supported yet", P);
    if (c->grad_accum > 1)
        return dt_error(DT_ERR_CONFIG, "[parallel] pipeline = %d with [train] grad_accum = %d: use [parallel] micro_batches for the micro-batches of a pipeline",
                        P, c->grad_accum);
    if (P > c->n_layer)
        return dt_error(DT_ERR_CONFIG, "[parallel] pipeline = %d stages is more than the model's %d layers ([model] n_layer)",
                        P, c->n_layer);
    if (W % P)
        return dt_error(DT_ERR_CONFIG, "[parallel] pipeline = %d does not divide the %d workers (data parallel = workers / pipeline)",
                        P, W);
    if (c->pipeline_schedule == 1 && M < P)
        return dt_error(DT_ERR_CONFIG, "[parallel] micro_batches = %d is fewer than the pipeline's %d stages; schedule = 1f1b needs at least one per stage",
                        M, P);
    int D = W / P;
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
    int D = W / c->pipeline > 0 ? W / c->pipeline : 1, M = micro_batches(c);
    int share = (c->batch + D - 1) / D;
    return (share + M - 1) / M;
}

static dt_status pp_init(dt_strategy *s) {
    pipe *p = (pipe *)s;
    const dt_config *c = s->c;
    int bounds[MAX_STAGES + 1];
    dt_status st = stage_bounds(c, bounds);
    if (st != DT_OK) return st;
    p->P = c->pipeline;
    p->D = s->world / p->P;
    p->M = micro_batches(c);
    p->gpipe = c->pipeline_schedule == 0;
    p->stage = s->rank / p->D;
    p->replica = s->rank % p->D;
    p->l0 = bounds[p->stage];
    p->l1 = bounds[p->stage + 1];
    p->nslots = p->gpipe ? p->M : (p->P - p->stage < p->M ? p->P - p->stage : p->M);
    p->slots = calloc((size_t)p->nslots, sizeof *p->slots);
    p->off = malloc(sizeof(int) * (size_t)p->M);
    p->len = malloc(sizeof(int) * (size_t)p->M);
    if (!p->slots || !p->off || !p->len) return dt_error(DT_ERR_NOMEM, "pipeline: out of memory");
    if ((st = dt_comm_split(s->comm, p->replica, p->stage, &p->pp)) != DT_OK)
        return dt_error(st, "pipeline: splitting the workers into stages: %s", dt_last_error());
    if (s->rank == 0) {
        char layers[512] = "";
        size_t n = 0;
        for (int k = 0; k < p->P && n < sizeof layers - 32; k++)
            n += (size_t)snprintf(layers + n, sizeof layers - n, "%s%d: [%d, %d)", k ? ", " : "", k, bounds[k],
                                  bounds[k + 1]);
        dt_log(DT_LOG_INFO,
               "pipeline: %d stages x %d data-parallel replica%s, rank = stage x %d + replica; schedule %s, %d micro-batches; layers of stage %s",
               p->P, p->D, p->D > 1 ? "s" : "", p->D, p->gpipe ? "gpipe" : "1f1b", p->M, layers);
    }
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
    if (p->steps > 0 && p->replica == 0) {
        double all = p->t_compute + p->t_wait;
        dt_log(DT_LOG_INFO,
               "pipeline stage %d of %d (rank %d, layers [%d, %d)): forward+backward %.3f s, waiting %.3f s over %lld steps: bubble %.1f%% (model (P-1)/(M+P-1) = %.1f%%); at most %d activation set%s alive",
               p->stage, p->P, s->rank, p->l0, p->l1, p->t_compute, p->t_wait, (long long)p->steps,
               all > 0 ? 100 * p->t_wait / all : 0, 100.0 * (p->P - 1) / (p->M + p->P - 1), p->peak, p->peak == 1 ? "" : "s");
    }
    dt_comm_destroy(p->pp);
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
        st = p->tops->stage_begin(task, sl->st, p->off[k], p->len[k], (float)p->len[k] / (float)p->base.global * p->base.loss_scale,
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
    if (p->stage == p->P - 1) *loss_sum += (double)loss * p->len[k];
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

// Every rank's gradient block becomes the global one (see the top).
static dt_status pp_sync(dt_strategy *s) { return dt_strategy_sum_grads(s, "pipeline"); }

const dt_strategy_ops dt_strategy_pipeline = {
    .name = "pipeline",
    .size = sizeof(pipe),
    .wants = pp_wants,
    .check = pp_check,
    .max_micro = pp_max_micro,
    .init = pp_init,
    .fini = pp_fini,
    .run_step = pp_run_step,
    .sync = pp_sync,
    .grad_norm = dt_strategy_norm_replicated,
    .update = dt_strategy_update_slice,
};
