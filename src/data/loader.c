/* The loader: a seeded per-epoch order (shuffled, or class-balanced
 * batches, or sharded: each rank's shares from its own part of the file),
 * global batches split across ranks (evenly, or by the shares
 * dt_loader_set_shares gives), and loader threads that assemble batch k+1
 * while the caller trains on batch k (two slots, one batch in flight at a
 * time; with T threads each thread decodes and augments every T-th part of
 * it). A sample's augmentation is seeded by (seed, epoch, its position in
 * the epoch's order), so a batch is the same bits whatever the ranks and
 * threads. */
#include "dtrain/data.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

// One batch to assemble: this rank's samples [lo, hi) of the epoch's order
// into slot s.
typedef struct {
    int64_t k;
    int s;
    size_t lo, hi;
} job_t;

struct dt_loader {
    const dt_dataset *ds;
    dt_loader_params p;
    int N;                     // samples in the epoch's order: the file's (a shard holds ds->n of them)
    size_t ss;                 // floats per sample
    int per_rank_max;          // largest share of a global batch
    uint32_t *perm;
    int64_t steps, epoch, next;
    float *x[2];
    int32_t *y[2];
    int B[2], GB[2], first[2];
    int64_t slot_batch[2];     // batch index held by each slot, -1 if none
    int *units, nunits;        // the shares (NULL: even)
    int seeking;               // dt_loader_seek gives every batch: nothing to prefetch
    int part;                  // dt_loader_seek's part of the even split (-1: this rank's)
    struct {                   // the balanced sampler's lists
        int *count, *start, *cur, *present;
        uint32_t *byc, *order;
    } bal;
    uint32_t *shards;          // the sharded order's shards, each shuffled (N)
    size_t *shard_next;        // ... and the next of each to place (world)
    float fill;                // the decoded value of a zero byte
    // loader threads
    pthread_t *threads;
    int nthreads;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    job_t job;
    int64_t gen;               // jobs posted; a thread works on each once
    int busy, done, stop;      // a job is in flight; threads done with it
    double wait;
};

dt_loader_params dt_loader_default_params(void) {
    dt_loader_params p = {0};
    p.batch = 64;
    p.shuffle = 1;
    p.prefetch = 1;
    p.threads = 1;
    p.seed = 1;
    p.world = 1;
    p.aug.crop_pad = 4;
    return p;
}

// Global batch k's samples in the epoch's order [*g0, *g0 + *gb), and this
// rank's part of them [*lo, *hi).
static void layout(const dt_loader *l, int64_t k, size_t *g0, size_t *gb, size_t *lo, size_t *hi) {
    size_t n = (size_t)l->N;
    *g0 = (size_t)k * l->p.batch;
    size_t g1 = *g0 + l->p.batch;
    if (g1 > n) g1 = n;
    *gb = g1 - *g0;
    size_t u0 = (size_t)(l->part >= 0 ? l->part : l->p.rank), u1 = u0 + 1, N = (size_t)l->p.world;
    if (l->units && l->part < 0) {
        u0 = 0;
        for (int r = 0; r < l->p.rank; r++) u0 += (size_t)l->units[r];
        u1 = u0 + (size_t)l->units[l->p.rank];
        N = (size_t)l->nunits;
    }
    *lo = *g0 + *gb * u0 / N;
    *hi = *g0 + *gb * u1 / N;
}

// Samples [a, b) of the epoch's order into slot s (from position lo on):
// decoded, then augmented.
static void fill_part(dt_loader *l, int s, size_t lo, size_t a, size_t b) {
    int nops;
    const dt_augment_op *ops = dt_augment_ops(&nops);
    for (size_t i = a; i < b; i++) {
        uint32_t j = l->perm[i];
        float *x = l->x[s] + (i - lo) * l->ss;
        dt_dataset_sample(l->ds, (int)j, x);
        l->y[s][i - lo] = l->ds->y[j - (uint32_t)l->ds->first];
        if (l->p.naugment) {
            dt_rng r;
            dt_rng_seed(&r, (l->p.seed * 0x9e3779b97f4a7c15ULL + (uint64_t)l->epoch) * 0xbf58476d1ce4e5b9ULL + i);
            for (int h = 0; h < l->p.naugment; h++) ops[l->p.augment[h]].fn(x, l->ds->shape, l->fill, &l->p.aug, &r);
        }
    }
}

// Thread t's part of job j: every thread an equal run of the samples.
static void fill_thread_part(dt_loader *l, const job_t *j, int t) {
    size_t n = j->hi - j->lo;
    fill_part(l, j->s, j->lo, j->lo + n * t / l->nthreads, j->lo + n * (t + 1) / l->nthreads);
}

typedef struct {
    dt_loader *l;
    int t;
} thread_arg;

static void *loader_main(void *arg) {
    dt_loader *l = ((thread_arg *)arg)->l;
    int t = ((thread_arg *)arg)->t;
    free(arg);
    int64_t seen = 0;
    pthread_mutex_lock(&l->mu);
    for (;;) {
        while (l->gen == seen && !l->stop) pthread_cond_wait(&l->cv, &l->mu);
        if (l->stop) break;
        seen = l->gen;
        job_t j = l->job;
        pthread_mutex_unlock(&l->mu);
        fill_thread_part(l, &j, t);
        pthread_mutex_lock(&l->mu);
        if (++l->done == l->nthreads) {
            l->slot_batch[j.s] = j.k;
            l->busy = 0;
            pthread_cond_broadcast(&l->cv);
        }
    }
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

dt_status dt_loader_create(dt_loader **out, const dt_dataset *ds, const dt_loader_params *p) {
    *out = NULL;
    if (p->batch <= 0) return dt_error(DT_ERR_ARG, "loader: batch must be > 0");
    if (p->world <= 0 || p->rank < 0 || p->rank >= p->world)
        return dt_error(DT_ERR_ARG, "loader: rank %d outside world of %d", p->rank, p->world);
    if (p->batch < p->world)
        return dt_error(DT_ERR_ARG, "loader: global batch %d smaller than %d ranks", p->batch, p->world);
    if (p->threads < 1 || p->threads > 256) return dt_error(DT_ERR_ARG, "loader: %d threads (expected 1 to 256)", p->threads);
    if (p->naugment < 0 || p->naugment > DT_MAX_AUGMENT) return dt_error(DT_ERR_ARG, "loader: %d augmentations", p->naugment);
    if (ds->n <= 0) return dt_error(DT_ERR_ARG, "loader: empty dataset");
    if (p->sampler == DT_SAMPLER_BALANCED && ds->classes <= 0)
        return dt_error(DT_ERR_ARG, "loader: the balanced sampler needs the dataset's class count");
    int N = ds->total > 0 ? ds->total : ds->n, first, count;
    dt_loader_shard(N, p->batch, p->world, p->rank, &first, &count);
    if (p->shard && p->sampler == DT_SAMPLER_BALANCED)
        return dt_error(DT_ERR_ARG, "loader: the balanced sampler draws from the whole data set, not from a rank's shard");
    if (p->shard ? ds->first != first || ds->n != count : ds->first != 0 || ds->n != N)
        return dt_error(DT_ERR_ARG, "loader: the dataset holds samples [%d, %d) of %d, not %s [%d, %d)", ds->first,
                        ds->first + ds->n, N, p->shard ? "rank's shard" : "all of them", p->shard ? first : 0,
                        p->shard ? first + count : N);
    if (p->naugment && (p->aug.crop_pad < 0 || p->aug.crop_pad >= ds->shape[1] || p->aug.crop_pad >= ds->shape[2]))
        return dt_error(DT_ERR_ARG, "loader: crop_pad %d for %dx%d images (expected 0 to %d)", p->aug.crop_pad,
                        ds->shape[1], ds->shape[2], (ds->shape[1] < ds->shape[2] ? ds->shape[1] : ds->shape[2]) - 1);
    dt_loader *l = calloc(1, sizeof *l);
    if (!l) return dt_error(DT_ERR_NOMEM, "loader: out of memory");
    l->ds = ds;
    l->N = N;
    l->p = *p;
    l->ss = dt_dataset_sample_size(ds);
    l->fill = ds->shift;  // 0 for a dataset built by hand
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->cv, NULL);
    // A global batch holds at most the dataset: no larger slots than that.
    int gb = p->batch < N ? p->batch : N;
    l->per_rank_max = (gb + p->world - 1) / p->world;
    if (p->max_share > l->per_rank_max) l->per_rank_max = p->max_share < gb ? p->max_share : gb;
    l->steps = p->drop_last ? N / p->batch : (N + p->batch - 1) / p->batch;
    l->perm = malloc(sizeof(uint32_t) * (size_t)N);
    if (p->shard) {
        l->shards = malloc(sizeof(uint32_t) * (size_t)N);
        l->shard_next = malloc(sizeof(size_t) * (size_t)p->world);
    }
    l->units = NULL;
    l->part = -1;
    for (int s = 0; s < 2; s++) {
        l->x[s] = dt_alloc(sizeof(float) * l->ss * l->per_rank_max);
        l->y[s] = malloc(sizeof(int32_t) * l->per_rank_max);
        l->slot_batch[s] = -1;
    }
    int bal = p->sampler == DT_SAMPLER_BALANCED, C = ds->classes > 0 ? ds->classes : 1;
    if (bal) {
        l->bal.count = malloc(sizeof(int) * (size_t)C);
        l->bal.start = calloc((size_t)C + 1, sizeof(int));
        l->bal.cur = malloc(sizeof(int) * (size_t)C);
        l->bal.present = malloc(sizeof(int) * (size_t)C);
        l->bal.byc = malloc(sizeof(uint32_t) * (size_t)ds->n);
        l->bal.order = malloc(sizeof(uint32_t) * (size_t)C);
    }
    if (!l->perm || !l->x[0] || !l->x[1] || !l->y[0] || !l->y[1] || (p->shard && (!l->shards || !l->shard_next)) ||
        (bal && (!l->bal.count || !l->bal.start || !l->bal.cur || !l->bal.present || !l->bal.byc || !l->bal.order))) {
        dt_loader_free(l);
        return dt_error(DT_ERR_NOMEM, "loader: out of memory");
    }
    if (l->steps == 0) {
        dt_loader_free(l);
        return dt_error(DT_ERR_ARG, "loader: %d samples make no full batch of %d with drop_last", N, p->batch);
    }
    // Threads when they run in the background (prefetch) or share a batch.
    int nt = p->prefetch || p->threads > 1 ? p->threads : 0;
    if (nt && !(l->threads = calloc((size_t)nt, sizeof *l->threads))) {
        dt_loader_free(l);
        return dt_error(DT_ERR_NOMEM, "loader: out of memory");
    }
    for (int t = 0; t < nt; t++) {
        thread_arg *a = malloc(sizeof *a);
        if (a) *a = (thread_arg){l, t};
        if (!a || pthread_create(&l->threads[t], NULL, loader_main, a) != 0) {
            free(a);
            dt_loader_free(l);
            return dt_error(DT_ERR_INTERNAL, "loader: cannot start loader thread %d of %d", t + 1, nt);
        }
        l->nthreads = t + 1;
    }
    l->nthreads = nt;
    *out = l;
    return DT_OK;
}

void dt_loader_free(dt_loader *l) {
    if (!l) return;
    if (l->threads) {
        pthread_mutex_lock(&l->mu);
        l->stop = 1;
        pthread_cond_broadcast(&l->cv);
        pthread_mutex_unlock(&l->mu);
        for (int t = 0; t < l->nthreads; t++) pthread_join(l->threads[t], NULL);
        free(l->threads);
    }
    pthread_mutex_destroy(&l->mu);
    pthread_cond_destroy(&l->cv);
    free(l->perm);
    free(l->shards);
    free(l->shard_next);
    free(l->bal.count);
    free(l->bal.start);
    free(l->bal.cur);
    free(l->bal.present);
    free(l->bal.byc);
    free(l->bal.order);
    free(l->units);
    for (int s = 0; s < 2; s++) {
        dt_free(l->x[s]);
        free(l->y[s]);
    }
    free(l);
}

int64_t dt_loader_steps_per_epoch(const dt_loader *l) { return l->steps; }

// Waits for the job in flight to finish (caller holds the lock).
static void wait_idle(dt_loader *l) {
    while (l->busy) pthread_cond_wait(&l->cv, &l->mu);
}

// Batch k's layout into its slot; the threads assemble it (caller holds no
// lock).
static void request(dt_loader *l, int64_t k) {
    if (k >= l->steps) return;
    int s = (int)(k & 1);
    size_t g0, gb, lo, hi;
    layout(l, k, &g0, &gb, &lo, &hi);
    pthread_mutex_lock(&l->mu);
    wait_idle(l);
    l->B[s] = (int)(hi - lo);
    l->GB[s] = (int)gb;
    l->first[s] = (int)(lo - g0);
    l->slot_batch[s] = -1;
    l->job = (job_t){k, s, lo, hi};
    l->done = 0;
    l->busy = 1;
    l->gen++;
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
}

dt_status dt_loader_set_shares(dt_loader *l, const int *units, int nunits) {
    if (l->p.shard && units)
        return dt_error(DT_ERR_ARG, "loader: a rank's share comes from its shard of the data; shares cannot move");
    if (!units) {
        free(l->units);
        l->units = NULL;
        return DT_OK;
    }
    int W = l->p.world, gb = l->p.batch < l->N ? l->p.batch : l->N;
    long sum = 0, most = 0;
    for (int r = 0; r < W; r++) {
        if (units[r] < 0) return dt_error(DT_ERR_ARG, "loader: rank %d's share of %d units is negative", r, units[r]);
        // the rank's largest share: its pieces at their longest
        long share = ((long)gb * (sum + units[r]) + nunits - 1) / nunits - (long)gb * sum / nunits;
        if (share > most) most = share;
        sum += units[r];
    }
    if (nunits <= 0 || sum != nunits)
        return dt_error(DT_ERR_ARG, "loader: shares sum to %ld units, expected %d", sum, nunits);
    if (most > l->per_rank_max)
        return dt_error(DT_ERR_ARG, "loader: a share of %ld samples is more than the %d the loader holds", most,
                        l->per_rank_max);
    if (!l->units && !(l->units = malloc(sizeof(int) * (size_t)W))) return dt_error(DT_ERR_NOMEM, "loader: out of memory");
    memcpy(l->units, units, sizeof(int) * (size_t)W);
    l->nunits = nunits;
    return DT_OK;
}

// Balanced batches: each global batch draws its classes as evenly as its
// size allows (the classes that get one more are drawn anew per batch), each
// class from its own shuffled list, reshuffled when it runs out; the
// batch's samples are then shuffled so that every rank's share mixes them.
static void balanced_order(dt_loader *l, dt_rng *r) {
    const dt_dataset *ds = l->ds;
    int C = ds->classes, n = l->N, np = 0;
    int *count = l->bal.count, *start = l->bal.start, *cur = l->bal.cur, *present = l->bal.present;
    uint32_t *byc = l->bal.byc, *order = l->bal.order;
    memset(count, 0, sizeof(int) * (size_t)C);
    memset(cur, 0, sizeof(int) * (size_t)C);
    for (int i = 0; i < n; i++) count[ds->y[i]]++;
    for (int c = 0; c < C; c++) {
        start[c + 1] = start[c] + count[c];
        if (count[c]) present[np++] = c;
    }
    for (int i = 0; i < n; i++) byc[start[ds->y[i]] + cur[ds->y[i]]++] = (uint32_t)i;
    for (int c = 0; c < C; c++) {
        cur[c] = 0;
        dt_rng_shuffle(r, byc + start[c], (size_t)count[c]);
    }
    for (int64_t k = 0; k < l->steps; k++) {
        size_t g0 = (size_t)k * l->p.batch, gb = (size_t)l->p.batch;
        if (g0 + gb > (size_t)n) gb = (size_t)n - g0;
        for (int i = 0; i < np; i++) order[i] = (uint32_t)present[i];
        dt_rng_shuffle(r, order, (size_t)np);
        size_t pos = g0;
        for (int i = 0; i < np; i++) {
            int c = (int)order[i];
            size_t take = gb / (size_t)np + ((size_t)i < gb % (size_t)np);
            for (size_t t = 0; t < take; t++) {
                if (cur[c] == count[c]) {
                    cur[c] = 0;
                    dt_rng_shuffle(r, byc + start[c], (size_t)count[c]);
                }
                l->perm[pos++] = byc[start[c] + cur[c]++];
            }
        }
        dt_rng_shuffle(r, l->perm + g0, gb);
    }
}

void dt_loader_shard(int n, int batch, int world, int rank, int *first, int *count) {
    int64_t full = batch > 0 ? n / batch : 0, rem = batch > 0 ? n % batch : n, at = 0;
    for (int r = 0; r <= rank && world > 0; r++) {
        int64_t c = full * ((int64_t)batch * (r + 1) / world - (int64_t)batch * r / world) +
                    (rem * (r + 1) / world - rem * r / world);
        if (r < rank) at += c;
        else *first = (int)at, *count = (int)c;
    }
}

// The sharded order: rank q's shard (dt_loader_shard: in file order after
// the shards of ranks 0..q-1) shuffled, ranks in order, from the epoch's one
// generator; then every global batch's share of rank q (the even split)
// takes the next samples of q's shard. Every rank makes the whole order and
// reads only its own positions' samples; with one rank it is the shuffled
// order itself.
static void sharded_order(dt_loader *l, dt_rng *r) {
    int W = l->p.world, first, count;
    for (int q = 0; q < W; q++) {
        dt_loader_shard(l->N, l->p.batch, W, q, &first, &count);
        for (int i = 0; i < count; i++) l->shards[first + i] = (uint32_t)(first + i);
        if (l->p.shuffle) dt_rng_shuffle(r, l->shards + first, (size_t)count);
        l->shard_next[q] = (size_t)first;
    }
    for (size_t g0 = 0; g0 < (size_t)l->N; g0 += (size_t)l->p.batch) {
        size_t gb = (size_t)l->N - g0 < (size_t)l->p.batch ? (size_t)l->N - g0 : (size_t)l->p.batch;
        for (int q = 0; q < W; q++)
            for (size_t i = g0 + gb * q / W; i < g0 + gb * (q + 1) / W; i++) l->perm[i] = l->shards[l->shard_next[q]++];
    }
}

void dt_loader_start_epoch(dt_loader *l, int64_t epoch, int64_t start) {
    if (l->threads) {  // let any job of the old epoch finish first
        pthread_mutex_lock(&l->mu);
        wait_idle(l);
        pthread_mutex_unlock(&l->mu);
    }
    dt_rng r;
    dt_rng_seed(&r, l->p.seed * 0x9e3779b97f4a7c15ULL + (uint64_t)epoch);
    if (l->p.sampler == DT_SAMPLER_BALANCED) {
        balanced_order(l, &r);
    } else if (l->p.shard) {
        sharded_order(l, &r);
    } else {
        for (int i = 0; i < l->N; i++) l->perm[i] = (uint32_t)i;
        if (l->p.shuffle) dt_rng_shuffle(&r, l->perm, (size_t)l->N);
    }
    l->epoch = epoch;
    l->next = start < 0 ? 0 : start;
    l->part = -1;
    l->seeking = 0;
    l->slot_batch[0] = l->slot_batch[1] = -1;
    if (l->threads && l->p.prefetch) request(l, l->next);
}
void dt_loader_seek(dt_loader *l, int64_t k, int part) {
    if (l->threads) {  // the job in flight was for the batch before
        pthread_mutex_lock(&l->mu);
        wait_idle(l);
        pthread_mutex_unlock(&l->mu);
    }
    l->part = part >= 0 && part < l->p.world ? part : -1;
    l->next = k < 0 ? 0 : k;
    l->slot_batch[0] = l->slot_batch[1] = -1;
    l->seeking = part >= 0;
    if (l->threads) request(l, l->next);
}

int dt_loader_next(dt_loader *l, dt_batch *b) {
    int64_t k = l->next;
    if (k >= l->steps) {
        memset(b, 0, sizeof *b);
        return 0;
    }
    int s = (int)(k & 1);
    double t0 = dt_now();
    if (l->threads) {
        if (!l->p.prefetch) request(l, k);
        pthread_mutex_lock(&l->mu);
        while (l->slot_batch[s] != k) pthread_cond_wait(&l->cv, &l->mu);
        pthread_mutex_unlock(&l->mu);
        l->wait += dt_now() - t0;
        if (l->p.prefetch && !l->seeking) request(l, k + 1);  // into the other slot, which held batch k-1
    } else {
        size_t g0, gb, lo, hi;
        layout(l, k, &g0, &gb, &lo, &hi);
        fill_part(l, s, lo, lo, hi);
        l->B[s] = (int)(hi - lo);
        l->GB[s] = (int)gb;
        l->first[s] = (int)(lo - g0);
        l->slot_batch[s] = k;
        l->wait += dt_now() - t0;
    }
    l->next = k + 1;
    b->x = l->x[s];
    b->y = l->y[s];
    b->B = l->B[s];
    b->global_B = l->GB[s];
    b->first = l->first[s];
    return 1;
}

double dt_loader_wait_seconds(dt_loader *l) {
    double w = l->wait;
    l->wait = 0;
    return w;
}
