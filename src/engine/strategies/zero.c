/* Sharded data parallel (ZeRO), the "zero" and "zero-deterministic"
 * strategies ([parallel] zero = 1 or 2) and "zero-3" ([parallel] zero = 3,
 * plain or deterministic; strategy.h, docs/zero.md).
 *
 * Rank r owns the slice [lo, hi) = dt_shard_range(n, r, W) of the flat
 * state: its optimizer exists only for that slice (dt_strategy_create sizes
 * it), so the optimizer state is sharded at every stage.
 *
 *   stage 1: backward's gradients are reduced to their owners in buckets
 *            while backward runs (a bucket of the gradient order, cut like
 *            dp.c's, is split at the slice boundaries and each part is one
 *            dt_ireduce to the rank that owns it: a reduce-scatter into
 *            balanced contiguous slices). Each rank updates its slice; the
 *            parameters are then allgathered.
 *   stage 2: the same, and a rank releases every part of the gradient block
 *            it does not own as soon as that part's reduction is done
 *            (madvise(MADV_DONTNEED) of the pages inside it, the edges
 *            zeroed), so the whole gradient is never resident; the block is
 *            left zero for the next step, which then skips the task's
 *            zero_grad (it would touch every page again).
 *   stage 3: as stage 2, and only the slice of the parameters is kept
 *            between steps: a layer is gathered (one non-blocking
 *            allgatherv; tensors that lie apart packed through a buffer)
 *            before its forward and backward through the model's layer
 *            hook, the next layer's gather is started ahead
 *            and the one behind released; the ranges outside the gathered
 *            layers (embedding, head) are gathered at the first forward
 *            after an update. Every rank runs the hooks of as many
 *            micro-batches as the busiest (a short share replays them).
 *            With offload = disk the slice itself lives in a file-backed
 *            mapping (dt_state_back), as the optimizer state does.
 *
 * Stages 2 and 3 give back those pages only when memory matters: with
 * [parallel] zero_release = auto, no offload, and a worker with stage 1's
 * model state taking at most half of its --memory-limit and of its share
 * of the machine's room (dt_memory_zero_held), a rank keeps them (give =
 * 0): the gradient block is zeroed by the task's zero_grad as at stage 1,
 * and the parameters outside the slice are left as they are, each gather
 * overwriting them, so no step refills pages (the kernel's clear_page and
 * its faults, a quarter of a worker's time). The collectives are the
 * same either way.
 *
 * The gradient norm is dt_strategy_norm_sharded: each rank's slice, the
 * value dt_sum_squares gives over the whole block, bitwise.
 *
 * Deterministic mode (zero-deterministic) plans the fixed micro-shards of
 * dp-deterministic and sums them in int64 fixed point; the sums are reduced
 * to their owners (int64 addition is exact), so the gradients, the norm
 * and therefore the weights are bitwise those of dp-deterministic for any
 * number of ranks and any stage. Its fixed-point sums span the whole block
 * (8 bytes a parameter), as dp-deterministic's do. */
#include "engine/strategies/strategy.h"
#include "engine/worker.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    size_t lo, hi;   // a contiguous part of the gradient block
    int root;        // the rank that owns it
    dt_request_t req;
} piece;

typedef struct {
    dt_strategy base;
    int stage;
    size_t bucket;         // floats in a bucket of the gradient order
    dt_grad_range whole;   // the order when the model gives none
    size_t *opos;          // where each range of the order starts in it
    size_t done;           // order positions >= done have been started
    piece *p;              // this step's reductions, in the order started
    int np, cap, settled;  // p[0, settled) are complete
    size_t rel_lo, rel_hi; // stage 2: settled parts not owned, still to give back
    int give;              // stages 2, 3: the parts not owned are given back to the kernel (else kept
                           // resident: zeroed by the task's zero_grad, parameters overwritten by gathers)
    int tight;             // ... every 4 KiB page of them (a worker under a memory cap)
    size_t *counts, *displs;  // every rank's slice, for the allgather
    int64_t *acc;          // deterministic: fixed-point sums of the block
    // stage 3: blocks 0..L-1 (the ranges of the order whose layer is one of
    // them) are gathered on demand; the rest (embedding, head) at the first
    // forward after an update.
    int L;                 // blocks (the head's layer number)
    size_t *span;          // every block's ranges as spans of the block (pairs lo, hi), block by block
    int *span_at;          // block l's spans are span[2 span_at[l], 2 span_at[l + 1]); l = L: outside the blocks
    size_t *pcounts, *pdispls; // per block of several spans: each rank's part of them in the pack buffer
    float *pack;           // the gather of a block of several spans, packed rank after rank
    int pack_user;         // the block whose gather holds the pack buffer (-1: none)
    dt_request_t *srq;     // the gathers in flight: one per span, or a packed block's in its first span's
    char *held;            // per block: 0 released, 1 gather in flight, 2 held
    long gathers;          // gathers started (summary.json)
    double gather_wait;    // seconds the compute thread spent on them once started (waiting, unpacking)
    int persist_ok;        // the ranges outside the blocks are whole
    int lmin, lmax;        // the layers the order names
    int nmax;              // the most micro-batches a rank runs this step
    size_t backed;         // offload = disk at stage 3: bytes of the parameter slice on disk
    // spares (--spares): a copy of the slice of rank + 1 (its buddy): its
    // parameters and optimizer state, refreshed after every update
    int buddy;             // kept: spares and more than one rank
    int buddy_ok;          // the copies have been exchanged once
    float *copy[2];        // two copies of rank + 1's slice, [parameters, state 0, state 1] each:
                           // the newest and the one before, which a failure mid-copy leaves whole
    int64_t own_t, copy_t[2]; // optimizer steps of this rank's slice and of the copies (-1: not valid)
    float *prev;           // this rank's own slice before its last update, [parameters, states]
    int64_t prev_t;        // its optimizer step (-1: none)
    dt_status err;
    char errmsg[1024];
    double t_first, t_backward_end, t_done;
} zero;

static void fail(zero *z, dt_status st) {
    if (z->err != DT_OK) return;
    z->err = st;
    snprintf(z->errmsg, sizeof z->errmsg, "%s", dt_last_error());
}

static dt_status buddy_exchange(zero *z);
static dt_status keep_prev(zero *z);

// Gives back the pages of g[lo, hi) (they read as zero on the next touch).
static void release(float *g, size_t lo, size_t hi) {
    if (hi > lo) dt_zero_pages(g + lo, (hi - lo) * sizeof(float));
}

// The same for the parts of a layer's parameters given back after their
// use, every step: every 4 KiB page (dt_give_pages), not just the whole
// huge pages, or the cleared edges of a layer's ranges stay resident.
static void give_back(float *p, size_t lo, size_t hi) {
    if (hi > lo) dt_give_pages(p + lo, (hi - lo) * sizeof(float));
}

// The rank whose slice holds element i.
static int owner(const zero *z, size_t i) {
    int lo = 0, hi = z->base.world - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (z->displs[mid] <= i) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

// Starts the reduction of block elements [lo, hi), one part per owner.
static void reduce_block(zero *z, size_t lo, size_t hi) {
    dt_strategy *s = &z->base;
    for (int r = owner(z, lo); lo < hi && z->np < z->cap; r++) {
        size_t e = z->displs[r] + z->counts[r] < hi ? z->displs[r] + z->counts[r] : hi;
        if (e == lo) continue;
        piece *p = &z->p[z->np++];
        *p = (piece){lo, e, r, NULL};
        dt_status st;
        uint16_t *w = s->c->grad_dtype ? dt_strategy_wire(s) : NULL;  // bf16 on the wire
        if (w) dt_from_f32(w + lo, s->grads + lo, e - lo, DT_BF16);
        if (s->c->grad_dtype && !w) st = DT_ERR_NOMEM;
        else if (w) st = dt_ireduce(w + lo, w + lo, e - lo, DT_BF16, DT_SUM, r, s->comm, &p->req);
        else st = dt_ireduce(s->grads + lo, s->grads + lo, e - lo, DT_F32, DT_SUM, r, s->comm, &p->req);
        if (st != DT_OK) fail(z, st);
        lo = e;
    }
}

// Starts the reductions of gradient-order positions [a, b).
static void reduce_order(zero *z, size_t a, size_t b) {
    dt_strategy *s = &z->base;
    const dt_grad_range *o = s->order ? s->order : &z->whole;
    int no = s->order ? s->norder : 1;
    if (!z->t_first) z->t_first = dt_now();
    size_t lo = 0, hi = 0;  // parts that touch in the block go as one
    for (int i = no - 1; i >= 0; i--) {  // from the end, as backward finishes them
        size_t x = z->opos[i], y = x + o[i].len;
        if (y <= a || x >= b) continue;
        size_t from = a > x ? a : x, to = b < y ? b : y, plo = o[i].offset + (from - x), phi = o[i].offset + (to - x);
        if (hi > lo && phi == lo) {
            lo = plo;
            continue;
        }
        if (hi > lo) reduce_block(z, lo, hi);
        lo = plo, hi = phi;
    }
    if (hi > lo) reduce_block(z, lo, hi);
}

// Stage 2: gives back the settled part [lo, hi) this rank does not own.
// Parts that touch (backward settles them from the block's end down) are
// joined and given back in one call once they reach two buckets, and the
// rest when the step's reductions are done (flush): each call is one
// madvise, whose TLB flush must reach every CPU running the process, a
// stall per call on a busy VM. Under a memory cap (--memory-limit) every
// 4 KiB page goes back (give_back), else the whole huge pages (their
// refill costs a few faults, not hundreds), the edges of each call,
// cleared, staying resident until the step's end gives the rest back.
static void release_later(zero *z, size_t lo, size_t hi, int flush) {
    float *g = z->base.grads;
    void (*back)(float *, size_t, size_t) = z->tight ? give_back : release;
    if (hi > lo && z->rel_hi > z->rel_lo && (hi == z->rel_lo || lo == z->rel_hi)) {
        z->rel_lo = lo < z->rel_lo ? lo : z->rel_lo;
        z->rel_hi = hi > z->rel_hi ? hi : z->rel_hi;
    } else if (hi > lo) {
        back(g, z->rel_lo, z->rel_hi);
        z->rel_lo = lo, z->rel_hi = hi;
    }
    if (flush || z->rel_hi - z->rel_lo >= 2 * z->bucket) {
        back(g, z->rel_lo, z->rel_hi);
        z->rel_lo = z->rel_hi = 0;
    }
}

// Completes the reductions that are done (all of them if wait; at stage 2
// also the oldest while more than two buckets are in flight, which with
// the two buckets waiting to be given back bounds the gradient a rank
// holds), giving back at stage 2 the parts this rank does not own.
static void settle(zero *z, int wait) {
    dt_strategy *s = &z->base;
    size_t flight = 0;
    for (int i = z->settled; i < z->np; i++) flight += z->p[i].hi - z->p[i].lo;
    while (z->settled < z->np) {
        piece *p = &z->p[z->settled];
        int fin = 1, must = wait || (z->give && flight > 2 * z->bucket);
        dt_status st = must ? dt_wait(&p->req) : dt_test(&p->req, &fin);
        flight -= fin ? p->hi - p->lo : 0;
        if (st != DT_OK) fail(z, st);
        if (!fin) break;
        p->req = NULL;
        if (s->wire && p->root == s->rank) dt_to_f32(s->grads + p->lo, s->wire + p->lo, p->hi - p->lo, DT_BF16);
        if (z->give && p->root != s->rank) release_later(z, p->lo, p->hi, 0);
        z->settled++;
    }
    if (wait && z->give) release_later(z, 0, 0, 1);
}

// ---- stage 3 --------------------------------------------------------------

static const dt_grad_range *order_of(const zero *z, int *no) {
    *no = z->base.order ? z->base.norder : 1;
    return z->base.order ? z->base.order : &z->whole;
}

// Gathers block elements [a, b) from their owners, in place.
static dt_status gather_range(zero *z, size_t a, size_t b, dt_request_t *req) {
    dt_strategy *s = &z->base;
    int W = s->world;
    size_t cnt[2 * W], *dsp = cnt + W;
    for (int r = 0; r < W; r++) {
        size_t x = z->displs[r], y = x + z->counts[r];
        x = x < a ? a : x > b ? b : x;
        y = y < a ? a : y > b ? b : y;
        cnt[r] = y - x;
        dsp[r] = x - a;
    }
    float *base = s->params + a;
    dt_status st = req ? dt_iallgatherv(base + dsp[s->rank], cnt[s->rank], base, cnt, dsp, DT_F32, s->comm, req)
                       : dt_allgatherv(base + dsp[s->rank], cnt[s->rank], base, cnt, dsp, DT_F32, s->comm);
    return st != DT_OK ? dt_error(st, "parameter gather: %s", dt_last_error()) : DT_OK;
}

// Block l's ranges as spans of the parameter block (dt_layer_spans).
static int block_spans(const zero *z, int l, size_t *sp) {
    int no;
    const dt_grad_range *o = order_of(z, &no);
    return dt_layer_spans(o, no, z->base.order_layer, z->L, l, sp);
}

// Copies block l's spans' parts in rank r's slice between the parameters
// and the pack buffer, where they lie one after another from rank r's
// displacement (in: parameters to pack).
static void pack_copy(zero *z, int l, int r, int in) {
    dt_strategy *s = &z->base;
    const size_t *sp = z->span + 2 * z->span_at[l];
    float *q = z->pack + z->pdispls[(size_t)l * (size_t)s->world + (size_t)r];
    size_t lo = z->displs[r], hi = lo + z->counts[r];
    for (int k = 0; k < z->span_at[l + 1] - z->span_at[l]; k++) {
        size_t a = sp[2 * k] > lo ? sp[2 * k] : lo, e = sp[2 * k + 1] < hi ? sp[2 * k + 1] : hi;
        if (e <= a) continue;
        if (in) memcpy(q, s->params + a, sizeof(float) * (e - a));
        else memcpy(s->params + a, q, sizeof(float) * (e - a));
        q += e - a;
    }
}

// Starts block l's gather: one non-blocking allgatherv of the whole
// layer. A block that is one span is gathered in place; else each rank's
// parts of its spans go packed, rank after rank, through the pack buffer
// (one gather at a time uses it: one in flight is completed first), and
// are unpacked by wait_block. Without a pack buffer (the pages given back:
// memory is short) each span is gathered in place, one after another.
static dt_status wait_block(zero *z, int l);

static dt_status gather_block(zero *z, int l) {
    dt_strategy *s = &z->base;
    if (l < 0 || l >= z->L || z->held[l]) return DT_OK;
    int ns = z->span_at[l + 1] - z->span_at[l];
    dt_status st = DT_OK;
    for (int k = z->span_at[l]; z->give && k < z->span_at[l + 1]; k++) {  // (what drop_block gave back)
        size_t a = z->span[2 * k], e = z->span[2 * k + 1], x = e < s->lo ? e : s->lo > a ? s->lo : a,
               y = s->hi > a ? (s->hi < e ? s->hi : e) : a;
        if (x > a) dt_take_pages(s->params + a, sizeof(float) * (x - a));
        if (e > y) dt_take_pages(s->params + y, sizeof(float) * (e - y));
    }
    if (ns == 1 || !z->pack) {
        for (int k = z->span_at[l]; k < z->span_at[l + 1] && st == DT_OK; k++)
            st = gather_range(z, z->span[2 * k], z->span[2 * k + 1], &z->srq[k]);
        z->gathers += ns;
    } else if (ns > 1) {
        if (z->pack_user >= 0 && (st = wait_block(z, z->pack_user)) != DT_OK) return st;
        size_t *cnt = z->pcounts + (size_t)l * (size_t)s->world, *dsp = z->pdispls + (size_t)l * (size_t)s->world;
        pack_copy(z, l, s->rank, 1);
        st = dt_iallgatherv(z->pack + dsp[s->rank], cnt[s->rank], z->pack, cnt, dsp, DT_F32, s->comm,
                            &z->srq[z->span_at[l]]);
        if (st != DT_OK) st = dt_error(st, "parameter gather: %s", dt_last_error());
        z->pack_user = l;
        z->gathers++;
    }
    z->held[l] = 1;
    return st;
}

// Waits for block l's gather (starting it if it is not), and unpacks it.
static dt_status wait_block(zero *z, int l) {
    dt_status st = gather_block(z, l);
    if (st != DT_OK || l < 0 || l >= z->L || z->held[l] == 2) return st;
    double t0 = dt_now();
    for (int k = z->span_at[l]; k < z->span_at[l + 1]; k++)
        if (z->srq[k] && (st = dt_wait(&z->srq[k])) != DT_OK) return dt_error(st, "parameter gather: %s", dt_last_error());
    if (z->pack_user == l) {
        for (int r = 0; r < z->base.world; r++)
            if (r != z->base.rank) pack_copy(z, l, r, 0);
        z->pack_user = -1;
    }
    z->gather_wait += dt_now() - t0;
    z->held[l] = 2;
    return DT_OK;
}

// The parameters outside the blocks (embedding, head), whole for the step:
// each of their spans gathered in place, all at once.
static dt_status gather_persist(zero *z) {
    int L = z->L, n = z->span_at[L + 1] - z->span_at[L];
    dt_request_t rq[n > 0 ? n : 1];
    memset(rq, 0, sizeof rq);
    dt_status st = DT_OK;
    double t0 = dt_now();
    for (int k = 0; k < n && st == DT_OK; k++)
        st = gather_range(z, z->span[2 * (z->span_at[L] + k)], z->span[2 * (z->span_at[L] + k) + 1], &rq[k]);
    for (int k = 0; k < n; k++) {
        dt_status w = dt_wait(&rq[k]);
        if (st == DT_OK && w != DT_OK) st = dt_error(w, "parameter gather: %s", dt_last_error());
    }
    z->gathers += n;
    z->gather_wait += dt_now() - t0;
    return st;
}

// Gives back the parts of block l (l < 0: of every block held) this rank
// does not own.
static dt_status drop_block(zero *z, int l) {
    dt_strategy *s = &z->base;
    for (int b = l < 0 ? 0 : l; b < (l < 0 ? z->L : l + 1); b++) {
        if (b >= z->L) break;
        if (!z->held[b]) continue;
        dt_status st = wait_block(z, b);
        if (st != DT_OK) return st;
        for (int k = z->span_at[b]; z->give && k < z->span_at[b + 1]; k++) {
            size_t a = z->span[2 * k], e = z->span[2 * k + 1];
            give_back(s->params, a, e < s->lo ? e : s->lo > a ? s->lo : a);
            give_back(s->params, s->hi > a ? (s->hi < e ? s->hi : e) : a, e);
        }
        z->held[b] = 0;
    }
    return DT_OK;
}

// Stage 3's tables: every block's spans (index L: the ranges outside the
// blocks), and for the blocks of more than one span each rank's part of
// them in the pack buffer, which holds the largest such block; it exists
// only while the pages are kept (a block more of memory, where the
// memory is there).
static dt_status layers_init(zero *z) {
    dt_strategy *s = &z->base;
    int no, W = s->world, L = z->L;
    order_of(z, &no);
    z->span = malloc(sizeof(size_t) * 2 * (size_t)(no + 1));
    z->span_at = calloc((size_t)L + 2, sizeof(int));
    z->pcounts = calloc((size_t)L * (size_t)W * 2 + 1, sizeof(size_t));
    z->srq = calloc((size_t)no + 1, sizeof *z->srq);
    if (!z->span || !z->span_at || !z->pcounts || !z->srq) return dt_error(DT_ERR_NOMEM, "zero: out of memory");
    z->pdispls = z->pcounts + (size_t)L * (size_t)W;
    z->pack_user = -1;
    size_t most = 0;
    for (int l = 0; l <= L; l++) {
        int n = block_spans(z, l < L ? l : -1, z->span + 2 * z->span_at[l]);
        z->span_at[l + 1] = z->span_at[l] + n;
        if (l == L || n < 2) continue;
        size_t at = 0, *sp = z->span + 2 * z->span_at[l];
        for (int r = 0; r < W; r++) {
            size_t lo = z->displs[r], hi = lo + z->counts[r], c = 0;
            for (int k = 0; k < n; k++) {
                size_t a = sp[2 * k] > lo ? sp[2 * k] : lo, e = sp[2 * k + 1] < hi ? sp[2 * k + 1] : hi;
                c += e > a ? e - a : 0;
            }
            z->pcounts[(size_t)l * (size_t)W + (size_t)r] = c;
            z->pdispls[(size_t)l * (size_t)W + (size_t)r] = at;
            at += c;
        }
        most = at > most ? at : most;
    }
    if (most && !z->give && !(z->pack = dt_alloc(sizeof(float) * most)))
        return dt_error(DT_ERR_NOMEM, "zero: out of memory for the gather's pack buffer (%zu bytes)", sizeof(float) * most);
    return DT_OK;
}

// Before block `layer`'s forward: it is waited for, the next one's gather
// starts (prefetch), the one before is released (the last block stays for
// backward). Backward: the same downwards.
static dt_status zero_params_needed(dt_strategy *s, int layer, int phase) {
    zero *z = (zero *)s;
    if (s->world == 1) return DT_OK;
    dt_status st = DT_OK;
    if (phase == 0 && !z->persist_ok) {  // the first forward hook after an update: nothing is in flight
        st = gather_persist(z);
        z->persist_ok = st == DT_OK;
    }
    if (st == DT_OK && phase == 0 && layer < 0) {
        st = gather_block(z, 0);
    } else if (st == DT_OK && layer >= 0 && layer < z->L) {
        int next = phase == 0 ? layer + 1 : layer - 1, prev = phase == 0 ? layer - 1 : layer + 1;
        st = wait_block(z, layer);
        if (st == DT_OK) st = gather_block(z, next);
        if (st == DT_OK && prev >= 0 && prev < z->L) st = drop_block(z, prev);
    } else if (st == DT_OK && phase == 1 && layer < 0) {
        st = drop_block(z, 0);
    }
    if (st != DT_OK) fail(z, st);  // a backward cannot return it: sync reports it
    return st;
}

// After an evaluation, which gathers the blocks through the layer hook as a
// forward does: the blocks still held are given back.
static dt_status zero_params_eval(dt_strategy *s, int begin) {
    zero *z = (zero *)s;
    return s->world == 1 || begin ? DT_OK : drop_block(z, -1);
}

static dt_status zero_init(dt_strategy *s) {
    zero *z = (zero *)s;
    z->stage = s->c->zero;
    int W = s->world;
    dt_shard_range(s->n, s->rank, W, &s->lo, &s->hi);
    z->whole = (dt_grad_range){0, s->n};
    z->give = z->stage >= 2 && W > 1 && dt_memory_zero_held(s->c, W) >= z->stage;
    int no = s->order ? s->norder : 1;
    const dt_grad_range *o = s->order ? s->order : &z->whole;
    z->bucket = (size_t)s->c->bucket_kb * 1024 / sizeof(float);
    size_t nb = s->n ? (s->n + z->bucket - 1) / z->bucket : 0;
    z->cap = (int)nb + no + W + 1;  // a range's end or a slice's end adds a piece
    z->opos = malloc(sizeof(size_t) * (size_t)no);
    z->p = calloc((size_t)z->cap, sizeof *z->p);
    z->counts = malloc(sizeof(size_t) * 2 * (size_t)W);
    if (!z->opos || !z->p || !z->counts) return dt_error(DT_ERR_NOMEM, "zero: out of memory");
    z->displs = z->counts + W;
    size_t pos = 0;
    for (int i = 0; i < no; i++) z->opos[i] = pos, pos += o[i].len;
    if (pos != s->n)
        return dt_error(DT_ERR_ARG, "zero: the gradient order covers %zu of the %zu gradients", pos, s->n);
    for (int r = 0; r < W; r++) {
        size_t a, b;
        dt_shard_range(s->n, r, W, &a, &b);
        z->displs[r] = a;
        z->counts[r] = b - a;
    }
    if (z->stage >= 3) {
        if (!s->order_layer) return dt_error(DT_ERR_CONFIG, "[parallel] zero = 3: the model has no layers to gather");
        z->lmin = z->lmax = s->order_layer[0];
        for (int i = 0; i < no; i++) {
            if (s->order_layer[i] > z->L) z->L = s->order_layer[i];
            if (s->order_layer[i] < z->lmin) z->lmin = s->order_layer[i];
            if (s->order_layer[i] > z->lmax) z->lmax = s->order_layer[i];
        }
        z->held = calloc((size_t)(z->L ? z->L : 1), 1);
        if (!z->held) return dt_error(DT_ERR_NOMEM, "zero: out of memory");
        if (W > 1) {
            s->params_sliced = 1;
            for (int l = 0; l < z->L; l++) z->held[l] = 2;
            dt_status st = layers_init(z);
            if (st == DT_OK) st = drop_block(z, -1);  // and the rest is gathered before the first forward
            if (st != DT_OK) return st;
            if (s->c->offload) {  // the slice of the parameters on disk between its uses, like the optimizer state
                z->backed = dt_state_back(s->params + s->lo, s->hi - s->lo, s->c->offload_dir);
                if (z->backed == SIZE_MAX) return DT_ERR_IO;
            }
        }
    }
    z->buddy = W > 1 && dt_worker_spares() > 0;
    z->tight = dt_mem_limit(NULL) != 0;
    z->copy_t[0] = z->copy_t[1] = z->prev_t = -1;
    if (s->c->deterministic && !(s->fixed = z->acc = dt_alloc(sizeof(int64_t) * (s->n ? s->n : 1))))
        return DT_ERR_NOMEM;
    if (z->give) {  // the block starts zero and stays so outside the rank's slice
        release(s->grads, 0, s->lo);
        release(s->grads, s->hi, s->n);
        s->grads_zero = 1;
    }
    return DT_OK;
}

static void zero_fini(dt_strategy *s) {
    zero *z = (zero *)s;
    settle(z, 1);
    for (int k = 0; z->srq && k < z->span_at[z->L]; k++) dt_wait(&z->srq[k]);
    if (z->backed && z->backed != SIZE_MAX) dt_state_unback(s->params + s->lo, s->hi - s->lo);
    free(z->srq);
    free(z->span);
    free(z->span_at);
    free(z->pcounts);
    dt_free(z->pack);
    free(z->held);
    free(z->opos);
    free(z->p);
    free(z->counts);
    dt_free(z->acc);
    dt_free(z->copy[0]);
    dt_free(z->copy[1]);
    dt_free(z->prev);
}

static int zero_plan(dt_strategy *s, int first, int share, int global) {
    zero *z = (zero *)s;
    z->np = z->settled = 0;
    z->done = s->n;
    z->err = DT_OK;
    z->t_first = 0;
    int k = s->c->deterministic ? dt_strategy_dp_deterministic.plan(s, first, share, global)
                                : dt_strategy_plan_accum(s, first, share, global);
    // Stage 3: the gathers are collectives, so every rank runs the layer
    // hooks of as many micro-batches as the rank with the most (a short
    // share replays them in sync).
    z->nmax = k;
    if (z->buddy && !z->buddy_ok) {  // the copies of the starting state (fresh or resumed)
        z->own_t = *dt_optim_step_count(s->opt);
        dt_status st = buddy_exchange(z);
        if (st != DT_OK) fail(z, st);
    }
    if (s->params_sliced) {
        dt_status st = dt_allreduce(&z->nmax, &z->nmax, 1, DT_I32, DT_MAX, s->comm);
        if (st != DT_OK) fail(z, dt_error(st, "micro-batch count: %s", dt_last_error()));
    }
    return k;
}

static dt_status zero_params_needed(dt_strategy *s, int layer, int phase);

// The model's grad hook: gradient-order positions >= pos are final.
static void ready(size_t pos, void *user) {
    zero *z = user;
    for (; z->done >= pos + z->bucket; z->done -= z->bucket) reduce_order(z, z->done - z->bucket, z->done);
    settle(z, 0);
}

static dt_grad_ready_fn zero_grad_hook(dt_strategy *s, int k, void **user) {
    *user = s;
    return s->world > 1 && !s->c->deterministic && k == ((zero *)s)->nmax - 1 ? ready : NULL;
}

// A micro-batch this rank does not have (stage 3): the layer hooks its
// forward and backward would call, and for the last one the positions its
// grad hook would report after each layer.
static dt_status replay(zero *z, int last) {
    dt_strategy *s = &z->base;
    int no;
    order_of(z, &no);
    dt_status st = DT_OK;
    for (int l = z->lmin; l <= z->lmax && st == DT_OK; l++) st = zero_params_needed(s, l, 0);
    for (int l = z->lmax; l >= z->lmin && st == DT_OK; l--) {
        st = zero_params_needed(s, l, 1);
        size_t pos = SIZE_MAX;
        for (int i = 0; i < no; i++)
            if (s->order_layer[i] == l && z->opos[i] < pos) pos = z->opos[i];
        if (st == DT_OK && last && !z->acc && pos != SIZE_MAX) ready(pos, z);
    }
    return st;
}

static void zero_micro_end(dt_strategy *s, int k) {
    (void)k;
    zero *z = (zero *)s;
    if (!z->acc) return;
    dt_fixed_add(z->acc, s->grads, s->n, DT_FIXED_SCALE);
    memset(s->grads, 0, sizeof(float) * s->n);
}

static dt_status zero_sync(dt_strategy *s) {
    zero *z = (zero *)s;
    if (s->world == 1 && !z->acc) return DT_OK;
    for (int k = s->nmicro; s->params_sliced && k < z->nmax && z->err == DT_OK; k++) replay(z, k == z->nmax - 1);
    z->t_backward_end = dt_now();
    if (z->acc) {  // every rank's slice of the fixed-point sums to it
        for (int r = 0; r < s->world && z->err == DT_OK; r++) {
            dt_status st = dt_reduce(z->acc + z->displs[r], z->acc + z->displs[r], z->counts[r], DT_I64, DT_SUM, r,
                                     s->comm);
            if (st != DT_OK) fail(z, st);
        }
        dt_fixed_to_float(s->grads + s->lo, z->acc + s->lo, s->hi - s->lo);
        memset(z->acc, 0, sizeof(int64_t) * s->n);
        if (z->give) {
            release(s->grads, 0, s->lo);
            release(s->grads, s->hi, s->n);
        }
    } else {
        ready(0, z);  // (a rank without samples ran no backward: its buckets cut as the others')
        reduce_order(z, 0, z->done);
        z->done = 0;
        settle(z, 1);
        if (z->give) {  // (and the edges of what settle gave back a part at a time)
            release(s->grads, 0, s->lo);
            release(s->grads, s->hi, s->n);
        }
    }
    z->t_done = dt_now();
    if (!z->t_first) z->t_first = z->t_backward_end;
    if (s->world > 1) {
        s->comm_seconds += z->t_done - z->t_first;
        s->comm_exposed_seconds += z->t_done - (z->t_backward_end > z->t_first ? z->t_backward_end : z->t_first);
    }
    if (z->err != DT_OK) return dt_error(z->err, "gradient reduce-scatter: %s", z->errmsg);
    return DT_OK;
}

// The slice's update, then every rank's slice to everyone; at stage 2 the
// slice's gradients are zeroed for the next step (the rest already is).
static dt_status zero_update(dt_strategy *s, float lr, float scale) {
    zero *z = (zero *)s;
    dt_status st = z->buddy ? keep_prev(z) : DT_OK;
    if (st == DT_OK) st = dt_strategy_update_slice(s, lr, scale);
    z->persist_ok = 0;
    if (st == DT_OK && s->params_sliced) st = drop_block(z, -1);  // what a model without layer -1 still holds
    z->own_t = *dt_optim_step_count(s->opt);
    // Spares: the copies before the allgather, so that a rank past it knows
    // that every copy is there (no rank enters it before its copy came);
    // stage 3, which has no allgather here, waits in a barrier for that.
    if (st == DT_OK && z->buddy) st = buddy_exchange(z);
    if (st == DT_OK && z->buddy && z->stage >= 3 && (st = dt_barrier(s->comm)) != DT_OK)
        st = dt_error(st, "spares: after copying the slices: %s", dt_last_error());
    if (st == DT_OK && s->world > 1 && z->stage < 3) {
        st = dt_allgatherv(s->params + s->lo, s->hi - s->lo, s->params, z->counts, z->displs, DT_F32, s->comm);
        if (st != DT_OK) st = dt_error(st, "parameter allgather: %s", dt_last_error());
    }
    if (s->grads_zero) memset(s->grads + s->lo, 0, (s->hi - s->lo) * sizeof(float));  // filled again next step
    return st;
}

// ---- spares ---------------------------------------------------------------
//
// With --spares, rank r keeps a copy of the slice of its buddy, rank
// (r + 1) mod W: the parameters (which stage 3 keeps nowhere else) and the
// optimizer state, with the optimizer's step count. After every update
// (before the parameters' allgather; at stage 3 before a barrier) each
// rank sends its slice to rank r - 1 and takes rank r + 1's, point to
// point, both at once: (1 + states) x 4 bytes a parameter of the slice
// each way (AdamW: 12 Ψ/W bytes sent a step). No rank ends a step before
// every copy of it has come (the collective after); each keeps the newest
// copy and the one before (AdamW: 24 Ψ/W bytes), so that a death while the
// copies are refreshed leaves the one before whole, and its own slice as
// it was before its update (keep_prev, 12 Ψ/W), for a rank whose update
// ran ahead of the state shared while the rank holding its copy died.
// When rank d dies, the spare in its place gets d's slice from rank d - 1;
// every other rank keeps its own, or goes back to the one before its
// update (its own, or rank r - 1's copy) when it ran ahead of the state.

static dt_status buddy_exchange(zero *z) {
    dt_strategy *s = &z->base;
    int W = s->world, to = (s->rank + W - 1) % W, from = (s->rank + 1) % W, ns = dt_optim_num_states(s->opt);
    size_t mine = s->hi - s->lo, theirs = z->counts[from];
    for (int i = 0; i < 2; i++)
        if (!z->copy[i] && !(z->copy[i] = dt_alloc(sizeof(float) * (theirs ? theirs : 1) * (size_t)(1 + ns))))
            return dt_error(DT_ERR_NOMEM, "spares: out of memory for the copies of rank %d's slice (2 x %zu bytes)",
                            from, sizeof(float) * theirs * (size_t)(1 + ns));
    int b = z->copy_t[0] <= z->copy_t[1] ? 0 : 1;  // the older copy is overwritten
    dt_request_t rq[8] = {0};
    int64_t t_in = -1;
    z->copy_t[b] = -1;  // until the whole copy has come
    dt_status st = dt_irecv(&t_in, 1, DT_I64, from, s->comm, &rq[0]);
    for (int j = 0; j <= ns && st == DT_OK && theirs; j++)
        st = dt_irecv(z->copy[b] + theirs * (size_t)j, theirs, DT_F32, from, s->comm, &rq[1 + j]);
    if (st == DT_OK) st = dt_isend(&z->own_t, 1, DT_I64, to, s->comm, &rq[4]);
    for (int j = 0; j <= ns && st == DT_OK && mine; j++)
        st = dt_isend(j ? dt_optim_state(s->opt, j - 1) : s->params + s->lo, mine, DT_F32, to, s->comm, &rq[5 + j]);
    for (int i = 0; i < 8; i++) {
        dt_status w = dt_wait(&rq[i]);
        if (st == DT_OK) st = w;
    }
    if (st != DT_OK) return dt_error(st, "spares: copying slices to the buddy ranks: %s", dt_last_error());
    z->copy_t[b] = t_in;
    z->buddy_ok = 1;
    return DT_OK;
}

// Spares: this rank's slice as it is before its update, kept until the
// next one: should the step fail after this rank's update, it goes back
// to it (its own copy on rank - 1 may be gone with that rank).
static dt_status keep_prev(zero *z) {
    dt_strategy *s = &z->base;
    int ns = dt_optim_num_states(s->opt);
    size_t n = s->hi - s->lo;
    if (!z->prev && !(z->prev = dt_alloc(sizeof(float) * (n ? n : 1) * (size_t)(1 + ns))))
        return dt_error(DT_ERR_NOMEM, "spares: out of memory for the slice before the update (%zu bytes)",
                        sizeof(float) * n * (size_t)(1 + ns));
    z->prev_t = -1;
    for (int j = 0; j <= ns; j++)
        memcpy(z->prev + n * (size_t)j, j ? dt_optim_state(s->opt, j - 1) : s->params + s->lo, sizeof(float) * n);
    z->prev_t = z->own_t;
    return DT_OK;
}

// After a failed step (a peer died), before the rejoin: no transfer of
// this strategy is left in flight, and the next step starts as a step does
// (the gradient block and the fixed-point sums zero, no layer held).
static void zero_abandon(dt_strategy *s) {
    zero *z = (zero *)s;
    settle(z, 1);
    z->np = z->settled = 0;
    if (z->srq) {
        for (int k = 0; k < z->span_at[z->L]; k++) dt_wait(&z->srq[k]);
        memset(z->held, 0, (size_t)(z->L ? z->L : 1));
        z->pack_user = -1;
    }
    z->persist_ok = 0;
    if (s->params_sliced) {
        release(s->params, 0, s->lo);
        release(s->params, s->hi, s->n);
    }
    if (z->acc) memset(z->acc, 0, sizeof(int64_t) * s->n);
    if (s->grads_zero) {
        memset(s->grads + s->lo, 0, (s->hi - s->lo) * sizeof(float));
        release(s->grads, 0, s->lo);
        release(s->grads, s->hi, s->n);
    }
    z->err = DT_OK;
}

// Every rank's slice at the optimizer step u shared (*step count): its own
// if it holds that, else from the copy of rank - 1.
static dt_status zero_take_over(dt_strategy *s, int have, int *lost) {
    zero *z = (zero *)s;
    int W = s->world, ns = dt_optim_num_states(s->opt);
    int64_t u = *dt_optim_step_count(s->opt);
    *lost = 0;
    int64_t mine[5] = {have, have ? z->own_t : -1, have ? z->copy_t[0] : -1, have ? z->copy_t[1] : -1,
                       have ? z->prev_t : -1};
    int64_t *all = malloc(sizeof(int64_t) * 5 * (size_t)W);
    if (!all) return dt_error(DT_ERR_NOMEM, "spares: out of memory");
    dt_status st = dt_allgather(mine, all, 5, DT_I64, s->comm);
    if (st != DT_OK) {
        free(all);
        return st;
    }
    int get = -1, give = -1, gb = 0;  // the rank whose copy this rank takes; the rank this one gives its copy b to
    for (int q = 0; q < W && !*lost; q++) {
        if (all[5 * q] && (all[5 * q + 1] == u || all[5 * q + 4] == u)) continue;  // its own, or the one before
        int h = (q + W - 1) % W, b = all[5 * h + 2] == u ? 0 : 1;
        if (all[5 * h] && all[5 * h + 2 + b] == u) {
            if (q == s->rank) get = h;
            if (h == s->rank) give = q, gb = b;
            continue;
        }
        *lost = 1;
        if (!all[5 * h])
            st = dt_error(DT_ERR_COMM, "spares: rank %d's slice of the ZeRO state (optimizer step %lld) is on no surviving "
                                       "rank: rank %d, which kept its copy, died too (two ranks died whose slices "
                                       "were only on each other); it can only come from a checkpoint",
                          q, (long long)u, h);
        else {
            int64_t newest = all[5 * h + 2] > all[5 * h + 3] ? all[5 * h + 2] : all[5 * h + 3];
            char held[160];
            if (newest < 0)
                snprintf(held, sizeof held, "rank %d holds no whole copy of it yet: the death came while the first "
                                            "copies were being made", h);
            else snprintf(held, sizeof held, "rank %d's newest copy of it is of step %lld", h, (long long)newest);
            st = dt_error(DT_ERR_COMM, "spares: rank %d's slice of the ZeRO state (optimizer step %lld) is on no surviving "
                                       "rank (%s; %s); it can only come from a checkpoint",
                          q, (long long)u, all[5 * q] ? "its own has moved on" : "it died", held);
        }
    }
    free(all);
    if (*lost) return st;
    size_t n = s->hi - s->lo, nq = give >= 0 ? z->counts[give] : 0;
    dt_request_t rq[6] = {0};
    if (have && z->own_t != u && z->prev_t == u && get < 0) {  // back to the slice before its update
        for (int j = 0; j <= ns; j++)
            memcpy(j ? dt_optim_state(s->opt, j - 1) : s->params + s->lo, z->prev + n * (size_t)j, sizeof(float) * n);
        z->own_t = u;
    }
    if (get >= 0) z->own_t = -1;  // until the whole slice has come
    for (int j = 0; j <= ns && st == DT_OK && get >= 0 && n; j++)
        st = dt_irecv(j ? dt_optim_state(s->opt, j - 1) : s->params + s->lo, n, DT_F32, get, s->comm, &rq[j]);
    for (int j = 0; j <= ns && st == DT_OK && give >= 0 && nq; j++)
        st = dt_isend(z->copy[gb] + nq * (size_t)j, nq, DT_F32, give, s->comm, &rq[3 + j]);
    for (int i = 0; i < 6; i++) {
        dt_status w = dt_wait(&rq[i]);
        if (st == DT_OK) st = w;
    }
    if (st != DT_OK) return dt_error(st, "spares: a slice from its buddy's copy: %s", dt_last_error());
    z->own_t = u;
    if ((st = buddy_exchange(z)) != DT_OK) return st;
    if (z->stage < 3) {  // the whole parameter block again, from every slice
        st = dt_allgatherv(s->params + s->lo, s->hi - s->lo, s->params, z->counts, z->displs, DT_F32, s->comm);
        if (st != DT_OK) return dt_error(st, "parameter allgather: %s", dt_last_error());
    }
    return DT_OK;
}

// summary.json (stage 3, rank 0): its parameter gathers, and the seconds
// its compute thread spent on them once started, waiting and unpacking
// (what prefetch did not hide).
static void zero3_summary(dt_strategy *s, cJSON *o) {
    zero *z = (zero *)s;
    if (!s->params_sliced) return;
    cJSON *g = cJSON_AddObjectToObject(o, "parameter_gathers");
    cJSON_AddNumberToObject(g, "count", (double)z->gathers);
    cJSON_AddNumberToObject(g, "wait_seconds", z->gather_wait);
}

static int zero_wants(const dt_config *c) { return c->zero > 0 && c->zero < 3 && !c->deterministic; }
static int zero_det_wants(const dt_config *c) { return c->zero > 0 && c->zero < 3 && c->deterministic; }
static int zero3_wants(const dt_config *c) { return c->zero == 3; }

static dt_status zero_check(const dt_config *c, int W) {
    return c->deterministic ? dt_strategy_dp_deterministic.check(c, W) : dt_strategy_dp.check(c, W);
}

static int zero_max_micro(const dt_config *c, int W) {
    return c->deterministic ? dt_strategy_dp_deterministic.max_micro(c, W) : dt_strategy_dp.max_micro(c, W);
}

const dt_strategy_ops dt_strategy_zero = {
    .name = "zero",
    .size = sizeof(zero),
    .wants = zero_wants,
    .check = zero_check,
    .max_micro = zero_max_micro,
    .init = zero_init,
    .fini = zero_fini,
    .plan = zero_plan,
    .grad_hook = zero_grad_hook,
    .sync = zero_sync,
    .grad_norm = dt_strategy_norm_sharded,
    .update = zero_update,
    .abandon = zero_abandon,
    .take_over = zero_take_over,
};

const dt_strategy_ops dt_strategy_zero_deterministic = {
    .name = "zero-deterministic",
    .size = sizeof(zero),
    .wants = zero_det_wants,
    .check = zero_check,
    .max_micro = zero_max_micro,
    .init = zero_init,
    .fini = zero_fini,
    .plan = zero_plan,
    .micro_end = zero_micro_end,
    .sync = zero_sync,
    .grad_norm = dt_strategy_norm_sharded,
    .update = zero_update,
    .abandon = zero_abandon,
    .take_over = zero_take_over,
};

// Stage 3, plain or deterministic (the micro-batches and sums as above).

const dt_strategy_ops dt_strategy_zero3 = {
    .name = "zero-3",
    .size = sizeof(zero),
    .wants = zero3_wants,
    .check = zero_check,
    .max_micro = zero_max_micro,
    .init = zero_init,
    .fini = zero_fini,
    .plan = zero_plan,
    .grad_hook = zero_grad_hook,
    .params_needed = zero_params_needed,
    .micro_end = zero_micro_end,
    .sync = zero_sync,
    .grad_norm = dt_strategy_norm_sharded,
    .update = zero_update,
    .params_eval = zero_params_eval,
    .summary = zero3_summary,
    .abandon = zero_abandon,
    .take_over = zero_take_over,
};
