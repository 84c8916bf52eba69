/* Data parallel on devices, the "device" strategy (strategy.h; docs/gpu.md):
 * taken for [train] device = cuda|cuda:N, whose other strategies are
 * refused (engine/device.c). Plain data parallel, or deterministic
 * ([parallel] deterministic = true): each shard's gradient goes into int64
 * fixed-point sums on the device (the seam's fixed_add, dp_det.c's rules),
 * so the result is the same bits for any number of ranks.
 *
 * With several ranks the gradients (or the fixed-point sums) are summed in
 * buckets of [parallel] bucket_kb by the GPUs' communicator
 * (comm/device.h): NCCL where every rank has a GPU of its own and NCCL is
 * found, else staged through pinned host memory and the host's
 * communicator; which one, and why, is logged. Plain data parallel
 * overlaps them with backward as dp.c does on the CPU: the buckets are cut
 * from the end of the model's gradient order (dt_grad_buckets_cut), and
 * during the last micro-batch's backward the device model's grad hook
 * (called once a layer's gradient kernels are queued) starts each bucket
 * that became final, non-blocking (dt_iallreduce_after: after an event
 * recorded then, one a bucket, reused each step once its sum was waited
 * for), while the host goes on queuing the earlier layers' kernels; sync
 * starts the rest and waits for them all (device-zero too, each piece
 * reduced to its slice's owner). Deterministic mode sums the buckets of its
 * int64 fixed-point sums so, the last shard's gradient added to them
 * bucket by bucket from the hook.
 *
 * In 16 bits ([parallel] grad_dtype = bf16, [compression] method = fp16 or
 * bf16, plain data parallel): each bucket rounded on the device (the
 * seam's to16, or with error feedback its ef16: the rank's residual, on the
 * device, added first and what the 16-bit values lost kept; overlapped,
 * into the bucket's part of a 16-bit copy of the block), summed by one
 * allreduce in that type, widened back (from16): cast.c's arithmetic, each
 * gradient's result its own, so the bits of the CPU's codec however either
 * cuts its pieces (checked at 2 ranks, tests/test_gpu_sim.c). The CPU codec
 * itself (engine/codecs) is kept as the host's copy of its state for the
 * checkpoints: the residual read back into it before one is written, put
 * onto the device after a resume, and its steps counted per bucket.
 *
 * One rank's step (forwards to update) is captured as a CUDA graph at the
 * second step in a row of a shape and replayed at each step of that shape
 * after (graph_begin, graph_end; [train] cuda_graph), where its calls are
 * the same from step to step (graph_eligible).
 *
 * The task's steps run on the device's blocks (dt_dev_blocks: parameters,
 * gradients, the optimizer's state, in the CPU's layout); the gradient's
 * sum of squares is made there and read back once a step (one double,
 * beside the loss the forward reads): the NaN/Inf check and the global norm
 * come from it, the clipping scale goes into the update, which runs there
 * too, the step's constants from the host's optimizer (its step count).
 * The host's blocks (s->params, the optimizer's state) are the copy that
 * checkpoints and the weights file read: params_host brings them up to
 * date, ckpt_restore puts them (the fresh start's, or a checkpoint's) onto
 * the device. Evaluations run on the device's blocks (the task's
 * evaluate), so nothing is copied for them.
 *
 * "device-zero" ([parallel] zero = 1, 2, 3 on a device; docs/zero.md) is the same
 * strategy over a rank's slice [lo, hi) = dt_shard_range(n, rank, W), as
 * zero.c's stage 1 on the CPU: the optimizer's state on the device is only
 * that slice's (dt_dev_blocks' slo, sn: 1/W of it), and so is the host's
 * copy, which checkpoints read (the CPU ZeRO's tensors). Each rank's slice
 * of the gradients is reduced to it in the overlapped buckets, their
 * pieces cut where a slice ends (deterministic mode: of the fixed-point
 * sums): a reduce-scatter into the slices; the
 * norm is the sharded one (dt_norm_sharded_by over the slice's pieces of
 * the sum of squares, made on the device and read back once a step: the
 * bits of dt_sum_squares over the whole block); each rank updates its
 * slice, and each slice is then broadcast from its owner, bucket by bucket
 * (the parameters' allgather; NCCL gathers only equal blocks). Under
 * [parallel] grad_dtype = bf16 each slice goes in bf16 (rounded on the
 * device, reduced in that type, widened back on its owner), as zero.c's.
 *
 * At [parallel] zero = 2 (several ranks) the same, and the gradient block
 * is backed on demand (dt_dev_blocks' grads_vm: a dt_dev_vm outside the
 * arena): backward backs each layer's chunks before writing them, and each
 * piece another rank owns is given back once its reduction is done
 * (settle_one: polled at the grad hook, waited for after backward, and
 * whenever backing would pass the block's budget, so that the host, which
 * queues a GPU's backward far ahead, backs at most the slice, two buckets
 * and two of the largest tensor ahead of what the device has reduced).
 * The slice's chunks stay: the reduced gradients the norm and the update
 * read, zeroed by the next step's zero_grad. [parallel] zero_release is
 * the CPU's: a device always gives them back.
 *
 * At zero = 3 (several ranks) the parameter block (and in 16 bits its
 * copy) is backed on demand too: a layer's parameters are gathered before its forward and
 * its backward (params_needed, through the device models' layer hooks)
 * and given back when the next layer is needed; see "ZeRO stage 3"
 * below. */
#include "comm/device.h"
#include "engine/codecs/codec.h"
#include "engine/device.h"
#include "engine/strategies/strategy.h"
#include "engine/worker.h"
#include "gpu/dev_model.h"
#include "gpu/gpu.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct {
    dt_strategy base;
    double norm;   // this step's, from grads_nonfinite
    int have_norm;
    uint64_t reads0, reads, steps;  // the device's reads (dev.h's reads) at this step's start; in the steps, and steps
    int zero;      // device-zero: the state is this rank's slice [lo, hi)
    double *parts;      // ... the slice's pieces of the norm's sum of squares, on the device (zero, W > 1)
    dt_comm_t gpus;     // the GPUs' communicator (several ranks)
    int64_t *acc;       // deterministic mode's fixed-point sums, on the device
    dt_dtype wire;      // the gradients' type in the exchange: DT_F32, or DT_BF16/DT_F16 (16-bit, several ranks)
    void *w16;          // ... one bucket's 16-bit values, on the device
    float *res;         // ... error feedback's residual, on the device (NULL: off)
    dt_codec *codec;    // ... the CPU codec: the host's copy of the residual and the steps, for checkpoints
    dt_grad_buckets g;  // several ranks: the order's buckets, from its end
    void **ev;          // ... an event a bucket: its gradients' kernels (re-recorded after its wait)
    int next;           // ... the next bucket to start this step
    int settled;        // ... pieces [0, settled) are done, their gradients given back (ZeRO stage 2)
    int issued;         // ... pieces [0, issued) have their collective begun
    double t_first;     // ... when this step's first started
    int64_t early, late; // the buckets summed, begun before the backward's last layer and not (summary.json)
    size_t own;          // device bytes of the strategy's own, outside the arena (the exchange's)
    // ZeRO stage 3 (the parameters backed on demand): blocks 0..L-1 (the
    // ranges of the order whose layer is one of them) gathered while their
    // layer runs, the rest (L: the embedding, the head) for the step from
    // its first forward (persist)
    int L;
    size_t *span;        // ... every block's spans (pairs lo, hi), block by block (dt_layer_spans)
    int *span_at;        // ... block l's are span[2 span_at[l], 2 span_at[l + 1])
    char *held;          // ... per block: 1 its gather in flight (the next layer's, ahead), 2 gathered
    dt_request_t *frq;   // ... the gather in flight: its broadcasts (nfrq), and its block (fblock, -1: none)
    int nfrq, fblock;
    int persist;         // ... the ranges outside the blocks are gathered
    long gathers;        // ... spans gathered (summary.json)
    int nmax;            // ... the most micro-batches a rank runs this step (the others replay the hooks of theirs)
    size_t *give[2];     // ... chunks to give back (2 i, 2 i + 1: the 16-bit copy's chunk i): [0] those found
    int ngive[2];        // ... since the last hook, [1] those found before, waiting for drop_ev
    unsigned char *queued; // ... per entry (2 i, 2 i + 1): in give[0] or give[1]
    void *drop_ev;       // ... the kernels queued when give[1]'s chunks were found
    size_t *lpos;        // ... per layer lmin..L: the lowest gradient-order position of its ranges
    int lmin;            // ... the lowest layer the order names (L: the highest)
    dt_status err;      // a micro-batch's fixed-point sum, or a bucket's start, that failed (no status to say it)
    char errmsg[512];
    // One rank: its step captured as a graph and replayed (graph_begin):
    // graph 0 never, 1 none made yet, 2 made; now this step's (0 its kernels
    // queued one by one, 1 captured, 2 replayed); shape: the made graph's
    // micro-batches (their count, their sizes), last the last step's; the
    // steps so, for summary.json.
    int graph, graph_now, shape[3], last[3];
    int64_t captured_at, replayed, other_shape;
} devs;

// (model parallel on a device: the model-parallel strategy's, pipeline.c)
static int on_device(const dt_config *c) {
    return dt_device_index(c->device) >= 0 && c->pipeline <= 1 && c->tensor <= 1;
}
static int dev_wants(const dt_config *c) { return on_device(c) && c->zero == 0; }
static int dev_zero_wants(const dt_config *c) { return on_device(c) && c->zero > 0; }

static dt_status dev_check(const dt_config *c, int W) {
    return c->deterministic ? dt_strategy_dp_deterministic.check(c, W) : dt_strategy_dp.check(c, W);
}

static int dev_max_micro(const dt_config *c, int W) {
    return c->deterministic ? dt_strategy_dp_deterministic.max_micro(c, W) : dt_strategy_dp.max_micro(c, W);
}

static void states(dt_strategy *s, float *st[2]) {
    for (int j = 0; j < 2; j++) st[j] = j < dt_optim_num_states(s->opt) ? dt_optim_state(s->opt, j) : NULL;
}

// One rank has no GPUs' communicator unless DTRAIN_GPU_COMM names a
// backend: then its gradients go through it alone (NCCL with one rank: the
// library's own path on a machine of one GPU).
static int wants_gpus(const dt_strategy *s) {
    const char *want = getenv("DTRAIN_GPU_COMM");
    return s->world > 1 || (want && *want && strcmp(want, "auto"));
}

// The GPUs' communicator over the ranks (a collective), and the log's line
// on how the gradients travel.
static dt_status open_gpus(dt_strategy *s) {
    devs *d = (devs *)s;
    char why[1024];
    dt_status st = dt_train_device_comm(s->c, s->comm, s->comm, &d->gpus, why, sizeof why);
    if (st != DT_OK) return st;
    dt_obs_trace_comm(s->obs, d->gpus);  // (the buckets on the trace's communication row)
    if (s->rank == 0 && !strcmp(dt_comm_backend(d->gpus), "staging"))
        dt_log(DT_LOG_INFO, "gradients staged through host memory (%s)", why);
    else if (s->rank == 0)
        dt_log(DT_LOG_INFO, "gradients summed on the GPUs by %s", why);
    return DT_OK;
}

// Device memory of the strategy's own, outside the model's arena (the
// exchange's buffers): what and how much named where the GPU lacks it.
static dt_status own_alloc(devs *d, const char *what, void **p, size_t bytes) {
    const dt_dev *dv = d->base.device->d;
    size_t avail = 0, total = 0;
    if (dv->mem_info(&avail, &total) == DT_OK && bytes > avail)
        return dt_error(DT_ERR_NOMEM, "%s on the GPU: %zu bytes, and the GPU has %zu free of %zu: use a smaller model "
                        "or fewer ranks a GPU", what, bytes, avail, total);
    dt_status st = dv->alloc(p, bytes);
    if (st != DT_OK) return dt_error(st, "%s on the GPU (%zu bytes): %s", what, bytes, dt_last_error());
    d->own += bytes;
    return DT_OK;
}

// device-zero: this rank's slice and the device's room for the slice's
// pieces of the norm.
static dt_status zero_init(devs *d) {
    dt_strategy *s = &d->base;
    int W = s->world;
    dt_shard_range(s->n, s->rank, W, &s->lo, &s->hi);
    if (s->device->slo != s->lo || s->device->sn != s->hi - s->lo)
        return dt_error(DT_ERR_INTERNAL, "device-zero: the device's optimizer state is of [%zu, %zu), the rank's "
                        "slice [%zu, %zu)", s->device->slo, s->device->slo + s->device->sn, s->lo, s->hi);
    size_t pieces = (s->lo % DT_SUMSQ_BLOCK + (s->hi - s->lo) + DT_SUMSQ_BLOCK - 1) / DT_SUMSQ_BLOCK;
    return W > 1 ? own_alloc(d, "the sharded norm's pieces", (void **)&d->parts, sizeof(double) * (pieces ? pieces : 1))
                 : DT_OK;
}

// The log's line on the device's memory, and the metrics' figures.
static void memory_said(dt_strategy *s) {
    dt_dev_blocks *b = s->device;
    size_t k[DT_DEV_KINDS];
    dt_dev_blocks_kinds(b, k);
    dt_train_device_metrics(s->obs, k);
    char half[160] = "", slice[80] = "", vm[200] = "", wvm[160] = "";
    if (((devs *)s)->zero && s->world > 1) snprintf(slice, sizeof slice, " (this rank's slice: 1/%d)", s->world);
    if (b->grads_vm)
        snprintf(vm, sizeof vm, " (beside the arena: backed on demand in chunks of %zu KiB, the slice's kept, the "
                 "rest given back once reduced)", b->gvm.gran >> 10);
    if (b->params_vm)
        snprintf(wvm, sizeof wvm, " (beside the arena: the slice's chunks, and each layer's while it runs)");
    if (b->t != DT_F32)
        snprintf(half, sizeof half, "; GEMMs on %s operands with fp32 sums (the weights hold the parameters' %s copy, "
                 "%.1f MiB)", b->t == DT_BF16 ? "bf16" : "fp16", b->t == DT_BF16 ? "bf16" : "fp16",
                 (double)b->n * 2 / 1048576.0);
    if (s->rank == 0)
        dt_log(DT_LOG_INFO, "GPU memory (%s device): %.1f MiB in one arena = weights %.1f%s + gradients %.1f%s + "
               "optimizer state %.1f%s + activations %.1f + workspace %.1f MiB; batches through %.1f MiB of pinned "
               "host memory%s", b->d->name, (double)b->arena.size / 1048576.0, k[0] / 1048576.0, wvm,
               k[1] / 1048576.0, vm, k[2] / 1048576.0, slice, k[3] / 1048576.0, k[4] / 1048576.0,
               (double)b->pinned_bytes / 1048576.0, half);
}

// Elements of es bytes in a bucket of [parallel] bucket_kb (at least one).
static size_t bucket_elems(const dt_config *c, size_t es) {
    size_t per = (size_t)c->bucket_kb * 1024 / es;
    return per ? per : 1;
}

// Whether the buckets are summed (during backward): wherever there is a
// GPUs' communicator (several ranks, or one that DTRAIN_GPU_COMM names).
static int overlapped(const devs *d) { return d->gpus && d->base.n; }

// The rank whose slice holds element i (zero).
static int owner(const devs *d, size_t i) {
    for (int r = 0; r < d->base.world; r++) {
        size_t lo, hi;
        dt_shard_range(d->base.n, r, d->base.world, &lo, &hi);
        if (i < hi) return r;
    }
    return d->base.world - 1;
}

// ZeRO: the buckets' pieces cut again where a slice ends, so that each is
// reduced to one owner (the W - 1 ends add at most W - 1 pieces).
static dt_status split_at_slices(devs *d) {
    dt_grad_buckets *g = &d->g;
    dt_grad_piece *p = calloc((size_t)g->np + (size_t)d->base.world, sizeof *p);
    if (!p) return dt_error(DT_ERR_NOMEM, "ZeRO on the GPUs: out of memory");
    int np = 0;
    for (int i = 0; i < g->nb; i++) {
        int first = np;
        for (int k = g->b[i].first; k < g->b[i].first + g->b[i].n; k++)
            for (size_t lo = g->p[k].lo, hi = g->p[k].hi, e; lo < hi; lo = e) {
                size_t slo, shi;
                dt_shard_range(d->base.n, owner(d, lo), d->base.world, &slo, &shi);
                e = shi < hi ? shi : hi;
                p[np++] = (dt_grad_piece){lo, e, NULL};
            }
        g->b[i].first = first;
        g->b[i].n = np - first;
    }
    free(g->p);
    g->p = p;
    g->np = np;
    return DT_OK;
}

// The gradients in 16 bits (several ranks): a 16-bit copy of the block on
// the device (each bucket in flight its own part); plain data parallel
// also the residual there and the CPU codec on the host (ZeRO keeps none:
// grad_dtype alone, as the CPU's).
static dt_status wire_init(devs *d) {
    dt_strategy *s = &d->base;
    const dt_config *c = s->c;
    d->wire = s->world == 1 || !s->n                                   ? DT_F32
              : c->comp_method == DT_COMP_FP16                          ? DT_F16
              : c->comp_method == DT_COMP_BF16 || c->grad_dtype ? DT_BF16
                                                                : DT_F32;
    if (d->wire == DT_F32) return DT_OK;
    const dt_dev *dv = s->device->d;
    dt_status st = d->zero ? DT_OK : dt_codec_create(&d->codec, c, s->comm, s->n, NULL, 0);
    if (st == DT_OK) st = own_alloc(d, "the gradients' 16-bit copy", &d->w16, s->n * 2);
    if (st != DT_OK || !d->codec || !d->codec->residual) return st;
    st = own_alloc(d, "error feedback's residual", (void **)&d->res, sizeof(float) * s->n);
    return st == DT_OK ? dv->memset0(d->res, sizeof(float) * s->n) : st;
}

// Several ranks: the buckets, summed as backward makes them final (the
// grad hook), each after an event of its own; under zero each piece to its
// slice's owner.
static dt_status overlap_init(devs *d) {
    dt_strategy *s = &d->base;
    if (!overlapped(d)) return DT_OK;
    dt_status st = dt_grad_buckets_cut(&d->g, s, bucket_elems(s->c, sizeof(float)), "data parallel on the GPUs");
    if (st == DT_OK && d->zero) st = split_at_slices(d);
    if (st == DT_OK && !(d->ev = calloc((size_t)d->g.nb, sizeof *d->ev)))
        st = dt_error(DT_ERR_NOMEM, "data parallel on the GPUs: out of memory");
    for (int i = 0; st == DT_OK && i < d->g.nb; i++)
        if ((st = s->device->d->event_create(&d->ev[i])) != DT_OK)
            st = dt_error(st, "data parallel on the GPUs: a bucket's event: %s", dt_last_error());
    return st;
}

// ---- ZeRO stage 2: the gradients backed on demand ------------------------------
//
// A piece begun and done: nothing uses its gradients again this step (its
// sum is on its owner, and every kernel that wrote or read them came before
// its start's event), so on a rank that does not own it they are given
// back (the chunks wholly so: dt_dev_vm_unused). The block's budget (room)
// keeps the host from backing more than this rank's slice, two buckets and
// two of the largest tensor ahead: past it, backing a chunk waits for the
// oldest piece in flight first. Chunks at the ends of what is reduced stay
// while part of them is not: four, and where a layer's tensors lie apart
// (the GPT's kinds, each beside the other layers' same tensor) two a kind.

// The oldest piece begun and not settled, settled (wait: waited for, else
// only if done): 1 if it was.
static int settle_one(devs *d, int wait) {
    dt_strategy *s = &d->base;
    int done = 1;
    if (d->settled >= d->issued || d->err != DT_OK) return 0;
    dt_grad_piece *p = &d->g.p[d->settled];
    dt_status st = wait ? dt_wait(&p->req) : dt_test(&p->req, &done);
    if (st == DT_OK && !done) return 0;
    if (st != DT_OK)
        st = dt_error(st, "the gradients' exchange on the GPUs: %s", dt_last_error());
    else if (owner(d, p->lo) != s->rank)
        st = dt_dev_vm_unused(&s->device->gvm, p->lo * sizeof(float), (p->hi - p->lo) * sizeof(float));
    if (st != DT_OK) {
        d->err = st;
        snprintf(d->errmsg, sizeof d->errmsg, "%s", dt_last_error());
    }
    d->settled++;
    return 1;
}

static int room(void *user) { return settle_one(user, 1); }

static void vm_init(devs *d) {
    dt_dev_blocks *b = d->base.device;
    size_t ahead = 2 * (bucket_elems(d->base.c, sizeof(float)) + b->largest) * sizeof(float);
    size_t ends = 4 + (b->kinds > 1 ? 2 * (size_t)b->kinds : 0);
    b->gvm.budget = dt_dev_blocks_kept(b, &b->gvm, sizeof(float)) + ahead + ends * b->gvm.gran;
    b->gvm.room = room;
    b->gvm.room_user = d;
}

// ---- ZeRO stage 3: the parameters gathered while a layer needs them ------------
//
// The parameter block is backed on demand too (params_vm): the slice's
// chunks throughout, a layer's spans from their owners before its forward
// and its backward (the layer hook: params_needed), broadcast from each
// rank's part of them on the GPUs' communicator (NCCL gathers only equal
// blocks; non-blocking, begun a layer ahead), and given back once the next
// layer is needed; the ranges outside
// the layers (the embedding, the head: the GPT's tied wte is both) are
// gathered at the first forward after an update and kept for the step.
// After the update every chunk but the slice's goes. A chunk found unused
// is given back one hook later, once the kernels queued when it was found
// have run (an event; on a GPU the host queues ahead of them), unless it is
// in use again by then.

// Block l's spans (l == L: outside the blocks).
static size_t *spans(const devs *d, int l, int *n) {
    *n = d->span_at[l + 1] - d->span_at[l];
    return d->span + 2 * d->span_at[l];
}

static dt_status stage3_init(devs *d) {
    dt_strategy *s = &d->base;
    if (!s->order || !s->order_layer)
        return dt_error(DT_ERR_CONFIG, "[parallel] zero = 3: the model has no layers to gather");
    for (int i = 0; i < s->norder; i++) {
        d->L = s->order_layer[i] > d->L ? s->order_layer[i] : d->L;
        d->lmin = s->order_layer[i] < d->lmin ? s->order_layer[i] : d->lmin;
    }
    d->span = malloc(sizeof(size_t) * 2 * ((size_t)s->norder + (size_t)d->L + 2));
    d->span_at = calloc((size_t)d->L + 2, sizeof(int));
    d->held = calloc((size_t)d->L + 1, 1);
    if (!d->span || !d->span_at || !d->held) return dt_error(DT_ERR_NOMEM, "ZeRO stage 3 on the GPUs: out of memory");
    for (int l = 0; l <= d->L; l++)
        d->span_at[l + 1] = d->span_at[l] + dt_layer_spans(s->order, s->norder, s->order_layer, d->L, l < d->L ? l : -1,
                                                             d->span + 2 * d->span_at[l]);
    dt_dev_blocks *b = s->device;
    size_t chunks = 2 * (b->pvm.nchunks > b->hvm.nchunks ? b->pvm.nchunks : b->hvm.nchunks) + 2;
    d->lpos = malloc(sizeof(size_t) * (size_t)(d->L - d->lmin + 1));
    d->give[0] = malloc(sizeof(size_t) * chunks);
    d->give[1] = malloc(sizeof(size_t) * chunks);
    d->queued = calloc(chunks, 1);
    int most = 0;  // (the most spans a block has, the ranges outside them too: most x W broadcasts in flight)
    for (int l = 0; l <= d->L; l++) most = d->span_at[l + 1] - d->span_at[l] > most ? d->span_at[l + 1] - d->span_at[l] : most;
    d->frq = calloc((size_t)(most ? most : 1) * (size_t)s->world, sizeof *d->frq);
    if (!d->lpos || !d->give[0] || !d->give[1] || !d->queued || !d->frq)
        return dt_error(DT_ERR_NOMEM, "ZeRO stage 3 on the GPUs: out of memory");
    dt_status st = b->d->event_create(&d->drop_ev);
    if (st != DT_OK) return dt_error(st, "ZeRO stage 3 on the GPUs: an event: %s", dt_last_error());
    for (int l = 0; l <= d->L - d->lmin; l++) d->lpos[l] = SIZE_MAX;
    size_t at = 0;  // (range i's position in the order)
    for (int i = 0; i < s->norder; at += s->order[i++].len) {
        size_t *lp = &d->lpos[s->order_layer[i] - d->lmin];
        *lp = at < *lp ? at : *lp;
    }
    s->params_sliced = 1;
    return DT_OK;
}

// Parameters [a, e) backed and their broadcasts from each rank's part of
// them begun (into frq).
static dt_status gather_span(devs *d, size_t a, size_t e) {
    dt_strategy *s = &d->base;
    dt_dev_blocks *b = s->device;
    float *w = b->params;
    dt_status st = dt_dev_vm_back(&b->pvm, a * sizeof(float), (e - a) * sizeof(float));
    for (int r = 0; r < s->world && st == DT_OK; r++) {
        size_t lo, hi;
        dt_shard_range(s->n, r, s->world, &lo, &hi);
        lo = lo > a ? lo : a, hi = hi < e ? hi : e;
        if (hi > lo && (st = dt_ibroadcast(w + lo, w + lo, hi - lo, DT_F32, r, d->gpus, &d->frq[d->nfrq++])) != DT_OK)
            st = dt_error(st, "parameter gather from rank %d on the GPUs: %s", r, dt_last_error());
    }
    d->gathers++;
    return st;
}

// The gather in flight waited for, and in 16 bits its spans' copy made (a
// failure after every broadcast is waited for).
static dt_status gather_wait(devs *d) {
    dt_strategy *s = &d->base;
    dt_dev_blocks *b = s->device;
    double t0 = dt_now();
    dt_status st = DT_OK;
    for (int i = 0; i < d->nfrq; i++) {
        dt_status w = dt_wait(&d->frq[i]);
        if (w != DT_OK && st == DT_OK) st = dt_error(w, "parameter gather on the GPUs: %s", dt_last_error());
    }
    int l = d->fblock, n;
    size_t *sp = l >= 0 ? spans(d, l, &n) : NULL;
    for (int k = 0; sp && k < n && st == DT_OK && b->w16; k++)
        if ((st = dt_dev_vm_back(&b->hvm, sp[2 * k] * 2, (sp[2 * k + 1] - sp[2 * k]) * 2)) == DT_OK)
            st = b->d->to16((uint16_t *)b->w16 + sp[2 * k], b->params + sp[2 * k], sp[2 * k + 1] - sp[2 * k], b->t);
    if (l >= 0 && l < d->L) d->held[l] = st == DT_OK ? 2 : 0;
    else if (l == d->L) d->persist = st == DT_OK;
    d->nfrq = 0, d->fblock = -1;
    s->comm_seconds += dt_now() - t0;  // (what was not hidden behind the layer before: exposed)
    s->comm_exposed_seconds += dt_now() - t0;
    return st;
}

// Block l's gather begun (l == L: the ranges outside the blocks), the one
// in flight waited for first; wait: this one too.
static dt_status gather_block(devs *d, int l, int wait) {
    int n;
    size_t *sp = spans(d, l, &n);
    dt_status st = d->fblock >= 0 ? gather_wait(d) : DT_OK;
    d->fblock = l;
    if (l < d->L) d->held[l] = 1;
    for (int k = 0; k < n && st == DT_OK; k++) st = gather_span(d, sp[2 * k], sp[2 * k + 1]);
    dt_status w = st != DT_OK || wait ? gather_wait(d) : DT_OK;
    return st != DT_OK ? st : w;
}

// Whether any of [a, e) is kept: the slice, a block held, the persistent
// ranges while gathered.
static int kept(const devs *d, size_t a, size_t e) {
    const dt_strategy *s = &d->base;
    if (a < s->hi && e > s->lo) return 1;
    for (int l = 0; l <= d->L; l++) {
        if (l < d->L ? !d->held[l] : !d->persist) continue;
        int n;
        size_t *sp = spans(d, l, &n);
        for (int k = 0; k < n; k++)
            if (a < sp[2 * k + 1] && e > sp[2 * k]) return 1;
    }
    return 0;
}

// The chunks of v (es-byte elements; the 16-bit copy's: h) over elements
// [a, e) that nothing kept touches, to give back.
static void give_unkept(devs *d, dt_dev_vm *v, int h, size_t a, size_t e) {
    if (!v->base) return;  // (not backed on demand: fp32's 16-bit copy)
    size_t per = v->gran / (h ? 2 : sizeof(float));
    for (size_t c = a / per; c * per < e; c++) {
        size_t k = 2 * c + (size_t)h;
        if (!v->mapped[c] || d->queued[k] || kept(d, c * per, (c + 1) * per)) continue;
        d->give[0][d->ngive[0]++] = k;
        d->queued[k] = 1;
    }
}

// The kernels drop_ev marked, run (a poll, within the communicator's
// timeout).
static dt_status drop_wait(devs *d) {
    return dt_dev_event_wait(d->base.device->d, d->drop_ev, dt_comm_timeout(d->base.comm),
                             "ZeRO stage 3's kernels of the layers before");
}

// At each hook: the chunks found the hook before given back (their kernels
// waited for; not those in use again since), and those found now left for
// the next, after an event.
static dt_status give_back(devs *d) {
    dt_dev_blocks *b = d->base.device;
    dt_status st = d->ngive[1] ? drop_wait(d) : DT_OK;
    for (int i = 0; i < d->ngive[1] && st == DT_OK; i++) {
        size_t c = d->give[1][i] / 2;
        d->queued[d->give[1][i]] = 0;
        dt_dev_vm *v = d->give[1][i] % 2 ? &b->hvm : &b->pvm;
        size_t per = v->gran / (v == &b->hvm ? 2 : sizeof(float));
        if (v->mapped[c] && !kept(d, c * per, (c + 1) * per)) st = dt_dev_vm_give(v, c * v->gran, v->gran);
    }
    size_t *t = d->give[1];
    d->give[1] = d->give[0], d->give[0] = t;
    d->ngive[1] = st == DT_OK ? d->ngive[0] : 0;
    d->ngive[0] = 0;
    return st == DT_OK && d->ngive[1] ? b->d->event_record(d->drop_ev) : st;
}

// Block l (l == L: the persistent ranges) no longer held, and every chunk
// of its spans that nothing kept touches given back.
static dt_status drop_block(devs *d, int l) {
    dt_dev_blocks *b = d->base.device;
    int n;
    size_t *sp = spans(d, l, &n);
    dt_status st = d->fblock == l ? gather_wait(d) : DT_OK;  // (never while its broadcasts write it)
    if (st != DT_OK) return st;
    if (l < d->L) d->held[l] = 0;
    else d->persist = 0;
    for (int k = 0; k < n; k++) {
        give_unkept(d, &b->pvm, 0, sp[2 * k], sp[2 * k + 1]);
        give_unkept(d, &b->hvm, 1, sp[2 * k], sp[2 * k + 1]);
    }
    return DT_OK;
}

static dt_status drop_held(devs *d, int but) {
    dt_status st = DT_OK;
    for (int l = 0; l < d->L && st == DT_OK; l++)
        if (d->held[l] && l != but) st = drop_block(d, l);
    return st;
}

// Before layer `layer`'s forward (phase 0) or backward (1): the ranges
// outside the blocks at the first forward after an update; the layer's
// block (waited for where its gather began ahead), the one held before it
// given back, and the next layer's gather begun (forward: the layer
// after, backward: the one before; the embedding's forward begins block
// 0's), to run beside this layer's kernels; after the embedding's backward
// every block goes.
static dt_status dev_params_needed(dt_strategy *s, int layer, int phase) {
    devs *d = (devs *)s;
    dt_status st = DT_OK;
    if (!s->device->params_vm) return DT_OK;
    if (phase == 0 && !d->persist) st = gather_block(d, d->L, 1);
    int next = layer < 0 && phase == 0 ? 0 : layer >= 0 && layer < d->L ? layer + (phase ? -1 : 1) : -1;
    if (st == DT_OK && layer >= 0 && layer < d->L) {
        st = d->held[layer] == 2 ? DT_OK : d->held[layer] == 1 ? gather_wait(d) : gather_block(d, layer, 1);
        if (st == DT_OK) st = drop_held(d, layer);
    }
    if (st == DT_OK && phase == 1 && layer < 0) st = drop_held(d, -1);
    if (st == DT_OK) st = give_back(d);  // (before the next layer's chunks are backed)
    if (st == DT_OK && next >= 0 && next < d->L && !d->held[next]) st = gather_block(d, next, 0);
    return st;
}

// After an evaluation (which gathers through the layer hook as a forward
// does): the blocks it left held go.
static dt_status dev_params_eval(dt_strategy *s, int begin) {
    devs *d = (devs *)s;
    dt_status st = s->device->params_vm && !begin ? drop_held(d, -1) : DT_OK;
    return st == DT_OK && s->device->params_vm && !begin ? give_back(d) : st;
}

// After the update: every chunk but the slice's goes (the blocks and the
// persistent ranges are gathered again, updated).
static dt_status params_updated(devs *d) {
    dt_dev_blocks *b = d->base.device;
    dt_status st = d->fblock >= 0 ? gather_wait(d) : DT_OK;
    if (st != DT_OK) return st;
    memset(d->held, 0, (size_t)d->L);
    d->persist = 0;
    give_unkept(d, &b->pvm, 0, 0, b->n);
    give_unkept(d, &b->hvm, 1, 0, b->n);
    return give_back(d);
}

static int graph_eligible(const devs *d);

static dt_status dev_init(dt_strategy *s) {
    dt_dev_blocks *b = s->device;
    devs *d = (devs *)s;
    if (!b) return dt_error(DT_ERR_CONFIG, "[train] device = %s: this model has no device step", s->c->device);
    if (b->n != s->n) return dt_error(DT_ERR_INTERNAL, "device blocks of %zu floats, the model's %zu", b->n, s->n);
    d->zero = s->ops == &dt_strategy_device_zero;
    d->fblock = -1;  // (stage 3: no gather in flight)
    dt_status st = d->zero ? zero_init(d) : DT_OK;
    if (st != DT_OK) return st;
    memory_said(s);
    b->defer_loss = 1;  // (the step's losses summed on the device, micro_end; read with the norm)
    if (s->c->deterministic) {  // (outside the arena: the strategy's, 8 bytes a parameter)
        DT_TRY(own_alloc(d, "deterministic mode's fixed-point sums", (void **)&d->acc,
                         sizeof(int64_t) * (s->n ? s->n : 1)), done);
        DT_TRY(b->d->memset0(d->acc, sizeof(int64_t) * s->n), done);
    }
    if (wants_gpus(s)) st = open_gpus(s);
    if (st == DT_OK) st = wire_init(d);
    if (st == DT_OK) st = overlap_init(d);
    if (st == DT_OK && b->grads_vm) vm_init(d);
    if (st == DT_OK && b->params_vm) st = stage3_init(d);
    if (st == DT_OK && d->own && s->rank == 0)
        dt_log(DT_LOG_INFO, "GPU memory beside the arena: %.1f MiB for the gradients' exchange (summary.json's "
               "gpu.exchange_bytes)", (double)d->own / 1048576.0);
    d->graph = graph_eligible(d);
done:
    return st;
}

static void dev_fini(dt_strategy *s) {
    devs *d = (devs *)s;
    if (d->graph && s->device) s->device->d->graph_drop();
    for (int i = 0; i < d->g.np; i++)
        if (d->g.p[i].req) dt_wait(&d->g.p[i].req);
    for (int i = 0; d->ev && i < d->g.nb; i++)
        if (d->ev[i]) s->device->d->event_destroy(d->ev[i]);
    free(d->ev);
    dt_grad_buckets_free(&d->g);
    dt_comm_destroy(d->gpus);
    if (d->acc) s->device->d->free(d->acc);
    if (d->parts) s->device->d->free(d->parts);
    if (d->w16) s->device->d->free(d->w16);
    if (d->res) s->device->d->free(d->res);
    dt_codec_free(d->codec);
    free(d->span);
    free(d->span_at);
    free(d->held);
    free(d->lpos);
    if (d->frq && d->fblock >= 0) gather_wait(d);
    free(d->frq);
    free(d->give[0]);
    free(d->give[1]);
    free(d->queued);
    if (d->drop_ev) s->device->d->event_destroy(d->drop_ev);
}

// ---- one rank's step as a CUDA graph (docs/gpu.md, "A step as a CUDA graph") ----
// Where a step's calls are the same each step (their arguments: one rank
// without a GPUs' communicator, not under ZeRO, no dropout key, no fp16
// loss scale, which changes) and [train] cuda_graph is on. The optimizer's constants
// and the batches go through pinned memory the graph's copies read.
static int graph_eligible(const devs *d) {
    const dt_strategy *s = &d->base;
    const dt_dev_blocks *b = s->device;
    return s->c->cuda_graph && s->world == 1 && !d->gpus && !d->zero && b->d->graph_capture && !b->step_values &&
           !b->grads_vm && !b->params_vm && s->c->precision != DT_F16 &&
           !getenv("DTRAIN_FAULT_OVERFLOW");  // (the test aid writes the gradients from the host mid-step)
}

// This step's graph, once planned (k micro-batches): a step of the shape
// of the one before it (the first of a shape queues its kernels one by
// one: the libraries' first calls, their heuristics, the scratch pool) is
// captured, unless the graph is of that shape, when it is replayed; a
// graph of another shape is dropped then (a new steady shape: an epoch's
// short last batch is not one). More micro-batches than the two pinned
// slots: queued one by one.
static void graph_begin(devs *d, int k) {
    dt_strategy *s = &d->base;
    const dt_dev *dv = s->device->d;
    int now[3] = {k, s->len[0], k > 1 ? s->len[1] : 0};
    int same = !memcmp(now, d->shape, sizeof now), again = !memcmp(now, d->last, sizeof now);
    memcpy(d->last, now, sizeof now);
    d->graph_now = 0;
    int replay = d->graph == 2 && same;
    if (!d->graph || d->err != DT_OK || k > 2 || (!replay && !again)) {
        d->other_shape += d->graph == 2;
        return;
    }
    if (d->graph == 2 && !same) dv->graph_drop(), d->graph = 1;
    s->device->next_slot = 0;  // (the batches through the captured step's pinned slots)
    dt_status st = d->graph == 2 ? dv->graph_replay() : dv->graph_capture();
    if (st != DT_OK) {
        d->err = st;
        snprintf(d->errmsg, sizeof d->errmsg, "the step as a CUDA graph: %s", dt_last_error());
        return;
    }
    d->graph_now = d->graph;
    if (d->graph == 1) memcpy(d->shape, now, sizeof now);
}

// The captured step's graph made, or the replayed one's end: either
// queued, before the step's one read.
static dt_status graph_end(devs *d) {
    if (!d->graph_now) return DT_OK;
    int captured = d->graph_now == 1;
    d->graph_now = 0;
    dt_status st = d->base.device->d->graph_run();
    if (st != DT_OK) return dt_error(st, "the step as a CUDA graph: %s", dt_last_error());
    if (captured && d->base.rank == 0)
        dt_log(DT_LOG_INFO, "the training step captured as a CUDA graph at this run's step %lld (%d micro-batch%s "
               "of %d): replayed at each step of that shape", (long long)d->steps + 1, d->shape[0],
               d->shape[0] > 1 ? "es" : "", d->shape[1]);
    if (captured) d->graph = 2, d->captured_at = d->steps + 1;
    else d->replayed++;
    return DT_OK;
}

// A step that failed inside its capture or replay: the capture given up
// (a replay has nothing of its own), the graph made again at the next.
static void graph_abandon(devs *d) {
    if (!d->graph_now) return;
    d->base.device->d->graph_drop();
    d->graph_now = 0;
    d->graph = 1;
}

static int dev_plan(dt_strategy *s, int first, int share, int global) {
    devs *d = (devs *)s;
    graph_abandon(d);
    d->have_norm = 0;
    d->reads0 = s->device->d->reads();
    dt_status st = s->device->d->memset0(s->device->sumsq + 1, sizeof(double));  // (the step's losses' sum)
    if (st != DT_OK && d->err == DT_OK) {
        d->err = st;
        snprintf(d->errmsg, sizeof d->errmsg, "the step's losses on the device: %s", dt_last_error());
    }
    d->next = d->settled = d->issued = 0;
    d->t_first = 0;
    int k = s->c->deterministic ? dt_strategy_plan_shards(s, first, share, global)
                                : dt_strategy_plan_accum(s, first, share, global);
    d->nmax = k;  // stage 3: every rank's layer hooks (gathers) and buckets as the busiest's
    st = s->device->params_vm ? dt_allreduce(&d->nmax, &d->nmax, 1, DT_I32, DT_MAX, s->comm) : DT_OK;
    if (st != DT_OK && d->err == DT_OK) {
        d->err = st;
        snprintf(d->errmsg, sizeof d->errmsg, "micro-batch count: %s", dt_last_error());
    }
    graph_begin(d, k);
    return k;
}

// Whether micro-batch k's backward sums the buckets (its grad hook): the
// last of this rank's, under stage 3 the last of the busiest's.
static int hooked(const devs *d, int k) {
    return d->g.nb && k == (d->base.device->params_vm ? d->nmax : d->base.nmicro) - 1;
}

// Micro-batch k's loss into the step's sum on the device (the loop's
// loss x len[k], read once with the norm). Deterministic mode: each
// shard's gradient into the fixed-point sums, and the gradient block zero
// again for the next (the last's, overlapped, goes in bucket by bucket from
// the grad hook).
static void dev_micro_end(dt_strategy *s, int k) {
    devs *d = (devs *)s;
    const dt_dev *dv = s->device->d;
    if (d->err != DT_OK) return;
    dt_status st = dv->loss_add(s->device->sumsq + 1, s->device->loss, (double)s->len[k]);
    if (st != DT_OK) {
        d->err = st;
        snprintf(d->errmsg, sizeof d->errmsg, "the step's losses on the device: %s", dt_last_error());
    }
    if (!s->c->deterministic || d->err != DT_OK || hooked(d, k)) return;
    st = dv->fixed_add(d->acc, s->device->grads, s->n);
    if (st == DT_OK) st = dt_dev_blocks_zero_grad(s->device);
    if (st != DT_OK) {
        d->err = st;
        snprintf(d->errmsg, sizeof d->errmsg, "deterministic mode's sums on the device: %s", dt_last_error());
    }
}

// ---- the buckets overlapped with backward -------------------------------------

// Gradients [lo, hi) rounded to the wire's 16 bits into w on the device
// (error feedback kept in the residual), the codec's piece counted (the
// steps its checkpoint state holds).
static dt_status to_wire(devs *d, void *w, size_t lo, size_t hi) {
    const dt_dev *dv = d->base.device->d;
    float *g = d->base.device->grads;
    dt_codec_piece *p = d->codec ? dt_codec_piece_at(d->codec, lo, hi) : NULL;
    if (d->codec && !p) return dt_error(DT_ERR_NOMEM, "the codec's pieces: out of memory");
    if (p) dt_codec_piece_begin(d->codec, p, 0);
    dt_status st = d->res ? dv->ef16(w, g + lo, d->res + lo, hi - lo, d->wire) : dv->to16(w, g + lo, hi - lo, d->wire);
    if (st != DT_OK) return dt_error(st, "gradients to %s on the device: %s", dt_dtype_name(d->wire), dt_last_error());
    return DT_OK;
}

// What the buckets sum and in which type: the gradients, their 16-bit copy,
// or deterministic mode's int64 fixed-point sums.
static dt_dtype wire_type(const devs *d) { return d->base.c->deterministic ? DT_I64 : d->wire; }
static char *wire_block(devs *d) {
    return d->base.c->deterministic ? (char *)d->acc : d->wire == DT_F32 ? (char *)d->base.device->grads : d->w16;
}

// Bucket pieces [lo, hi) made ready to sum: the last shard's gradients
// added to deterministic mode's fixed-point sums, or rounded to 16 bits.
static dt_status to_sum(devs *d, size_t lo, size_t hi) {
    const dt_dev *dv = d->base.device->d;
    if (!d->base.c->deterministic)
        return d->wire == DT_F32 ? DT_OK : to_wire(d, (uint16_t *)d->w16 + lo, lo, hi);
    dt_status st = dv->fixed_add(d->acc + lo, d->base.device->grads + lo, hi - lo);
    return st == DT_OK ? DT_OK : dt_error(st, "deterministic mode's sums on the device: %s", dt_last_error());
}

// Bucket i's sum begun (early: before the backward's last layer), after
// the event marking its gradients' kernels, which are queued by now; the
// host goes on queuing the backward's (a failure kept for sync).
static void start(devs *d, int i, int early) {
    const dt_dev *dv = d->base.device->d;
    dt_grad_bucket *b = &d->g.b[i];
    dt_grad_piece *p0 = d->g.p + b->first, *end = p0 + b->n, *p;
    char *w = wire_block(d);
    dt_dtype t = wire_type(d);
    size_t es = dt_dtype_size(t);
    if (!d->t_first) d->t_first = dt_now();
    if (d->err != DT_OK) return;
    *(early ? &d->early : &d->late) += 1;
    dt_status st = DT_OK;
    for (p = p0; p < end && st == DT_OK; p++)  // (backed, zero, where no backward wrote: a rank without samples)
        if ((st = dt_dev_blocks_back(d->base.device, p->lo, p->hi - p->lo)) == DT_OK) st = to_sum(d, p->lo, p->hi);
    if (st == DT_OK && (st = dv->event_record(d->ev[i])) != DT_OK)
        st = dt_error(st, "a bucket's event on the device: %s", dt_last_error());
    for (p = p0; p < end && st == DT_OK; p++) {
        char *at = w + p->lo * es;
        int root = d->zero ? owner(d, p->lo) : -1;
        st = root < 0 ? dt_iallreduce_after(at, at, p->hi - p->lo, t, DT_SUM, d->ev[i], d->gpus, &p->req)
                      : dt_ireduce_after(at, at, p->hi - p->lo, t, DT_SUM, root, d->ev[i], d->gpus, &p->req);
        if (st != DT_OK)
            st = dt_error(st, "gradient %s in %s on the GPUs: %s", root < 0 ? "allreduce" : "reduce to its owner",
                          dt_dtype_name(t), dt_last_error());
        else
            d->issued = (int)(p - d->g.p) + 1;  // (settle_one waits for no piece before this)
    }
    if (st != DT_OK) {
        d->err = st;
        snprintf(d->errmsg, sizeof d->errmsg, "%s", dt_last_error());
    }
}

// The grad hook: gradients at positions >= pos of the order are final once
// the kernels queued so far have run.
static void ready(size_t pos, void *user) {
    devs *d = user;
    while (d->next < d->g.nb && d->g.b[d->next].pos >= pos) start(d, d->next++, pos > 0);
    if (d->base.device->grads_vm)
        while (settle_one(d, 0)) {
        }
}

static dt_grad_ready_fn dev_grad_hook(dt_strategy *s, int k, void **user) {
    *user = s;
    return hooked((devs *)s, k) ? ready : NULL;
}

// Stage 3: a micro-batch this rank does not have, as the busiest runs it:
// its layer hooks (the gathers), and for the last the grad hook's
// positions after each layer's backward (the buckets, of what this rank
// accumulated).
static void replay(devs *d, int last) {
    dt_strategy *s = &d->base;
    dt_status st = DT_OK;
    for (int l = d->lmin; l <= d->L && st == DT_OK; l++) st = dev_params_needed(s, l, 0);
    for (int l = d->L; l >= d->lmin && st == DT_OK; l--) {
        st = dev_params_needed(s, l, 1);
        if (st == DT_OK && last && d->lpos[l - d->lmin] != SIZE_MAX) ready(d->lpos[l - d->lmin], d);
    }
    if (st != DT_OK && d->err == DT_OK) {
        d->err = st;
        snprintf(d->errmsg, sizeof d->errmsg, "%s", dt_last_error());
    }
}

// The sums back into the gradients (this rank's slice under zero): deterministic
// mode's fixed-point sums (and the sums zero again), or the 16-bit ones.
static void widen(devs *d) {
    dt_strategy *s = &d->base;
    const dt_dev *dv = s->device->d;
    dt_status st = DT_OK;
    if (s->c->deterministic) {
        st = dv->fixed_to_float(s->device->grads + s->lo, d->acc + s->lo, s->hi - s->lo);
        if (st == DT_OK) st = dv->memset0(d->acc, sizeof(int64_t) * s->n);
    }
    for (int i = 0; i < d->g.np && st == DT_OK && !s->c->deterministic && d->wire != DT_F32; i++) {
        dt_grad_piece *p = &d->g.p[i];
        if (!d->zero || owner(d, p->lo) == s->rank)  // (under zero another rank's sum is not here)
            st = dv->from16(s->device->grads + p->lo, (uint16_t *)d->w16 + p->lo, p->hi - p->lo, d->wire);
    }
    if (st != DT_OK) {
        d->err = st;
        snprintf(d->errmsg, sizeof d->errmsg, "the sums back into the gradients on the device: %s", dt_last_error());
    }
}

// After backward: the buckets not begun yet, then every one waited for
// (the first failure kept); exposed is what is left after backward.
static void finish(devs *d) {
    dt_strategy *s = &d->base;
    double t_end = dt_now();
    while (d->next < d->g.nb) start(d, d->next++, 0);
    if (s->device->grads_vm)
        while (settle_one(d, 1)) {
        }
    for (int i = 0; i < d->g.np; i++) {
        dt_status st = d->g.p[i].req ? dt_wait(&d->g.p[i].req) : DT_OK;
        if (st != DT_OK && d->err == DT_OK) {
            d->err = st;
            snprintf(d->errmsg, sizeof d->errmsg, "the gradients' exchange on the GPUs: %s", dt_last_error());
        }
    }
    if (d->err == DT_OK) widen(d);
    double done = dt_now();
    s->comm_seconds += done - d->t_first;
    s->comm_exposed_seconds += done - (t_end > d->t_first ? t_end : d->t_first);
}

// ---- the parameters' slices after the update (zero) ---------------------------

// Every rank's slice of the parameters broadcast from it, bucket by bucket
// of [parallel] bucket_kb (the parameters' allgather: NCCL gathers only
// equal blocks).
static dt_status broadcast_slices(devs *d) {
    float *w = d->base.device->params;
    size_t per = bucket_elems(d->base.c, sizeof(float));
    for (int r = 0; r < d->base.world; r++) {
        size_t lo, hi;
        dt_shard_range(d->base.n, r, d->base.world, &lo, &hi);
        for (; lo < hi; lo += per) {
            size_t len = hi - lo < per ? hi - lo : per;
            dt_status st = dt_broadcast(w + lo, w + lo, len, DT_F32, r, d->gpus);
            if (st != DT_OK)
                return dt_error(st, "parameter broadcast from rank %d's slice on the GPUs: %s", r, dt_last_error());
        }
    }
    return DT_OK;
}

static dt_status dev_sync(dt_strategy *s) {
    devs *d = (devs *)s;
    dt_dev_blocks *b = s->device;
    for (int k = s->nmicro; b->params_vm && k < d->nmax && d->err == DT_OK; k++) replay(d, k == d->nmax - 1);
    if (d->g.nb) finish(d);
    if (d->err != DT_OK) {
        dt_status e = d->err;
        d->err = DT_OK;
        return dt_error(e, "%s", d->errmsg);
    }
    // one rank without a communicator: deterministic mode's sums are its gradient
    dt_status st = DT_OK;
    if (!d->g.nb && s->c->deterministic) {
        st = b->d->fixed_to_float(b->grads, d->acc, s->n);
        if (st == DT_OK) st = b->d->memset0(d->acc, sizeof(int64_t) * s->n);
    }
    return st;
}

// device-zero's norm (dt_norm_parts_fn): the slice's pieces of the sum of
// squares, made on the device, read back.
static dt_status slice_parts(void *user, size_t n, size_t first, double carry, double *part) {
    devs *d = user;
    dt_dev_blocks *b = d->base.device;
    size_t pieces = (first + n + DT_SUMSQ_BLOCK - 1) / DT_SUMSQ_BLOCK;
    dt_status st = b->d->sumsq_parts(d->parts, b->grads + d->base.lo, n, first, carry);
    return st == DT_OK ? b->d->to_host(part, d->parts, sizeof(double) * pieces) : st;
}

// DTRAIN_FAULT_OVERFLOW=RANK:STEP: an inf at the start of the rank's slice
// of the gradients (a test aid: fp16's overflow, a faulty gradient).
static dt_status fault_overflow(dt_strategy *s, int64_t step) {
    static const float inf = INFINITY;
    dt_dev_blocks *b = s->device;
    return s->hi > s->lo && dt_fault_overflow(s->rank, step) ? b->d->to_device(b->grads + s->lo, &inf, sizeof inf)
                                                             : DT_OK;
}

// The step's one read from the device (dt_dev_blocks_step_values): the
// micro-batches' losses summed there (*loss_sum; a non-finite one is the
// run's error, as the CPU's forward says) and, with norm_too, the norm
// from the sum of squares queued before it.
static dt_status read_values(devs *d, int norm_too, double *loss_sum) {
    double v[2];
    dt_status st = dt_dev_blocks_step_values(d->base.device, v);
    if (st != DT_OK) return st;
    if (!isfinite(v[1]))
        return dt_error(DT_ERR_NUMERIC, "the loss is %s (diverged: lower the learning rate or clip gradients)",
                        isnan(v[1]) ? "NaN" : "Inf");
    if (norm_too) d->norm = sqrt(v[0]);
    d->have_norm = 1;
    *loss_sum = v[1];
    return DT_OK;
}

// The reads from the device between the step's start and its end
// (summary.json's gpu.reads_per_step).
static void count_reads(devs *d) {
    d->reads += d->base.device->d->reads() - d->reads0;
    d->steps++;
}

// Several ranks (the loop's order: they agree on a skip before the
// update): the step's one read, the gradient's sum of squares made on the
// device (under zero with several ranks the norm is the slice's pieces', a
// collective, and the losses a read of their own). The NaN/Inf check
// (fp16's loss scaler skips the step and halves its scale on it), the
// norm and the clipping come from it.
static dt_status dev_nonfinite(dt_strategy *s, int64_t step, double *loss_sum, int *nonfinite) {
    devs *d = (devs *)s;
    dt_dev_blocks *b = s->device;
    dt_status st = fault_overflow(s, step);
    int sharded = d->zero && s->world > 1;
    if (st == DT_OK && sharded) st = dt_norm_sharded_by(slice_parts, d, s->n, s->lo, s->hi, s->comm, &d->norm);
    else if (st == DT_OK) st = b->d->sumsq(b->sumsq, b->grads, b->n);
    if (st == DT_OK) st = read_values(d, !sharded, loss_sum);
    *nonfinite = st == DT_OK && !isfinite(d->norm);
    return st;
}

static dt_status dev_norm(dt_strategy *s, double *norm) {
    devs *d = (devs *)s;
    dt_status st = d->have_norm ? DT_OK : dev_nonfinite(s, 0, &(double){0}, &(int){0});
    *norm = d->norm;
    return st;
}

// The update of the rank's slice (the whole block but under zero), each
// slice then broadcast from its owner (zero), the 16-bit copy made again;
// guard: the scale and the skip made on the device (dt_dev_blocks_update).
static dt_status update_queue(devs *d, float lr, float scale, const float *guard) {
    dt_strategy *s = &d->base;
    dt_optim_begin_step(s->opt);
    dt_status st = dt_dev_blocks_update(s->device, s->opt, lr, scale, guard, NULL, 0);
    double t0 = dt_now();
    if (st == DT_OK && s->device->params_vm) {
        st = params_updated(d);
    } else if (st == DT_OK && d->zero && s->world > 1) {
        st = broadcast_slices(d);
        s->comm_seconds += dt_now() - t0;
        s->comm_exposed_seconds += dt_now() - t0;
    }
    return st == DT_OK ? dt_dev_blocks_changed(s->device, NULL, 0) : st;
}

static dt_status dev_update(dt_strategy *s, float lr, float scale) {
    dt_status st = update_queue((devs *)s, lr, scale, NULL);
    count_reads((devs *)s);
    return st;
}

// One rank: the step's end on the device, its one read last. The sum of
// squares, the clipping scale and the NaN/Inf skip made there
// (step_scale), the update queued behind them, skipping itself on a
// non-finite gradient (the host's optimizer step then taken back) or loss
// (the run's error after the read), then the read of the norm and the
// losses.
static dt_status dev_update_end(dt_strategy *s, int64_t step, float lr, float clip, float unscale, double *loss_sum,
                                double *norm, int *nonfinite) {
    devs *d = (devs *)s;
    dt_dev_blocks *b = s->device;
    dt_status st = fault_overflow(s, step);
    if (st == DT_OK) st = b->d->sumsq(b->sumsq, b->grads, b->n);
    if (st == DT_OK) st = b->d->step_scale(b->guard, b->sumsq, unscale, clip);
    if (st == DT_OK) st = update_queue(d, lr, 1.0f, b->guard);
    if (st == DT_OK) st = graph_end(d);
    else graph_abandon(d);
    if (st == DT_OK) st = read_values(d, 1, loss_sum);
    *norm = d->norm;
    *nonfinite = st == DT_OK && !isfinite(d->norm);
    if (*nonfinite) dt_optim_unstep(s->opt);
    count_reads(d);
    return st;
}

// The host's copy, parameters and optimizer state, before a checkpoint
// and the weights file (evaluations run on the device's blocks).
static dt_status dev_params_host(dt_strategy *s) {
    float *st[2];
    states(s, st);
    return dt_dev_blocks_get(s->device, s->params, st);
}

// After the start or a resume: the host's blocks (initial, or read from
// the checkpoint) onto the device.
static dt_status put_state(dt_strategy *s) {
    float *st[2];
    states(s, st);
    return dt_dev_blocks_put(s->device, s->params, st);
}

static dt_status dev_restore(dt_strategy *s, const char *path, int parts) {
    devs *d = (devs *)s;
    dt_status e = put_state(s);
    if (e == DT_OK && s->device->params_vm) e = params_updated(d);  // (stage 3: nothing held is current)
    if (e == DT_OK && d->codec) e = dt_codec_restore(d->codec, path, parts);
    if (e == DT_OK && d->res) e = s->device->d->to_device(d->res, d->codec->residual, sizeof(float) * s->n);
    return e;
}

// ---- spares: a dead rank's place (--spares; engine/loop.c's take_state) --------
//
// The ranks hold the whole state (replicated), the live one the device's:
// a failed step drops what it left, the GPUs' communicator goes and the
// host's copy is made the device's (abandon), from which dt_run_ckpt_share
// gives the furthest replica's state to every rank; the communicator is
// made again over the new generation (regroup, as a spare's init makes
// it), and every rank puts the state it was given onto its device
// (take_over). Under ZeRO each slice of the optimizer state is on one GPU
// alone (own_state): after abandon and regroup every rank goes back to the
// newest checkpoint, its slice put onto its device by ckpt_restore.

static void dev_abandon(dt_strategy *s) {
    devs *d = (devs *)s;
    dt_dev_blocks *b = s->device;
    graph_abandon(d);
    d->have_norm = 0;
    d->err = DT_OK;
    // The buckets begun in backward first, and stage 3's gather (each ends
    // on the death it meets, or at the timeout): the communicator's
    // progress thread is then out of it when it is aborted.
    for (int i = 0; i < d->g.np; i++)
        if (d->g.p[i].req) dt_wait(&d->g.p[i].req);
    for (int i = 0; i < d->nfrq; i++) dt_wait(&d->frq[i]);
    d->nfrq = 0, d->fblock = -1;
    if (d->held) memset(d->held, 0, (size_t)d->L);  // (the restore gives their chunks back: params_updated)
    d->persist = 0;
    if (d->gpus) dt_comm_abort(d->gpus, "a worker died: the step is redone");
    dt_comm_destroy(d->gpus);
    d->gpus = NULL;
    dt_status st = d->acc ? b->d->memset0(d->acc, sizeof(int64_t) * s->n) : DT_OK;
    if (st == DT_OK && b->grads_vm) {  // (stage 2: the pieces the step left backed outside the slice)
        st = dt_dev_vm_give(&b->gvm, 0, s->lo * sizeof(float));
        if (st == DT_OK) st = dt_dev_vm_give(&b->gvm, s->hi * sizeof(float), (s->n - s->hi) * sizeof(float));
    }
    if (st == DT_OK && !d->zero) st = dev_params_host(s);  // (ZeRO goes back to the newest checkpoint)
    if (st != DT_OK) {  // (regroup, which comes next, says it)
        d->err = st;
        snprintf(d->errmsg, sizeof d->errmsg, "%s: %s", d->zero ? "a failed step's state dropped on the device, for a spare"
                 : "the device's state to the host, for a spare", dt_last_error());
    }
}

static dt_status dev_regroup(dt_strategy *s) {
    devs *d = (devs *)s;
    if (d->err != DT_OK) {
        dt_status e = d->err;
        d->err = DT_OK;
        return dt_error(e, "%s", d->errmsg);
    }
    return wants_gpus(s) ? open_gpus(s) : DT_OK;
}

static dt_status dev_take_over(dt_strategy *s, int have, int *lost) {
    (void)have;
    *lost = 0;
    return put_state(s);
}

// The codec's state in checkpoints (16-bit gradients, several ranks): the
// CPU codec's tensors, the residual read back from the device first.
static int dev_ckpt_extra(dt_strategy *s, dt_st_tensor *t, int max) {
    devs *d = (devs *)s;
    if (!d->codec) return 0;
    if (max > 0 && d->res && s->device->d->to_host(d->codec->residual, d->res, sizeof(float) * s->n) != DT_OK)
        return dt_error(DT_ERR_IO, "error feedback's residual from the device: %s", dt_last_error()), -1;
    return dt_codec_state(d->codec, t, max);
}

static void dev_summary(dt_strategy *s, cJSON *o) {
    dt_dev_blocks *b = s->device;
    cJSON *g = dt_train_device_summary(o, s->c, b);
    devs *d = (devs *)s;
    cJSON_AddStringToObject(g, "collectives", d->gpus ? dt_comm_backend(d->gpus) : "none");
    cJSON_AddNumberToObject(g, "exchange_bytes", (double)d->own);
    cJSON_AddNumberToObject(g, "reads_per_step", d->steps ? (double)d->reads / (double)d->steps : 0.0);
    cJSON_AddStringToObject(g, "step_end", dt_strategy_ends_on_device(s) ? "device" : "host");
    cJSON_AddNumberToObject(g, "buckets_in_backward", (double)d->early);
    cJSON_AddNumberToObject(g, "buckets_after_backward", (double)d->late);
    cJSON *gr = cJSON_AddObjectToObject(g, "graph");  // (one rank's step as a CUDA graph)
    cJSON_AddBoolToObject(gr, "eligible", d->graph != 0);
    cJSON_AddNumberToObject(gr, "captured_at_step", (double)d->captured_at);
    cJSON_AddNumberToObject(gr, "replayed_steps", (double)d->replayed);
    cJSON_AddNumberToObject(gr, "steps_of_another_shape", (double)d->other_shape);
    if (b->params_vm) cJSON_AddNumberToObject(g, "parameter_gathers", (double)d->gathers);  // (stage 3)
}

const dt_strategy_ops dt_strategy_device = {
    .name = "device",
    .size = sizeof(devs),
    .wants = dev_wants,
    .check = dev_check,
    .max_micro = dev_max_micro,
    .init = dev_init,
    .fini = dev_fini,
    .plan = dev_plan,
    .micro_end = dev_micro_end,
    .grad_hook = dev_grad_hook,
    .sync = dev_sync,
    .grad_norm = dev_norm,
    .grads_nonfinite = dev_nonfinite,
    .update_end = dev_update_end,
    .update = dev_update,
    .params_host = dev_params_host,
    .ckpt_extra = dev_ckpt_extra,
    .ckpt_restore = dev_restore,
    .summary = dev_summary,
    .abandon = dev_abandon,
    .take_over = dev_take_over,
    .regroup = dev_regroup,
    .replicated = 1,
};

// [parallel] zero = 1, 2 or 3 on a device: the same operations over the
// rank's slice (dev_init reads which table it was made with), and stage
// 3's layer hooks.
const dt_strategy_ops dt_strategy_device_zero = {
    .name = "device-zero",
    .size = sizeof(devs),
    .wants = dev_zero_wants,
    .check = dev_check,
    .max_micro = dev_max_micro,
    .init = dev_init,
    .fini = dev_fini,
    .plan = dev_plan,
    .micro_end = dev_micro_end,
    .grad_hook = dev_grad_hook,
    .sync = dev_sync,
    .grad_norm = dev_norm,
    .grads_nonfinite = dev_nonfinite,
    .update_end = dev_update_end,
    .update = dev_update,
    .params_host = dev_params_host,
    .ckpt_restore = dev_restore,
    .summary = dev_summary,
    .params_needed = dev_params_needed,
    .params_eval = dev_params_eval,
    .abandon = dev_abandon,
    .regroup = dev_regroup,
    .own_state = 1,
};
