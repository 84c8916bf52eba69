/* The loader: a seeded per-epoch permutation, global batches split evenly
 * across ranks, and a background thread that assembles batch k+1 while the
 * caller trains on batch k (two slots, one job in flight at a time). */
#include "dtrain/data.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct dt_loader {
    const dt_dataset *ds;
    dt_loader_params p;
    size_t ss;                 // floats per sample
    int per_rank_max;          // largest share of a global batch
    uint32_t *perm;
    int64_t steps, epoch, next;
    float *x[2];
    int32_t *y[2];
    int B[2], GB[2], first[2];
    int64_t slot_batch[2];     // batch index held by each slot, -1 if none
    // prefetch thread
    pthread_t thread;
    int has_thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int64_t job;               // batch to assemble, -1 if none
    int job_slot, stop;
    double wait;
};

dt_loader_params dt_loader_default_params(void) {
    dt_loader_params p = {0};
    p.batch = 64;
    p.shuffle = 1;
    p.prefetch = 1;
    p.seed = 1;
    p.world = 1;
    return p;
}

// Fills slot s with this rank's share of global batch k.
static void fill(dt_loader *l, int64_t k, int s) {
    size_t n = (size_t)l->ds->n;
    size_t g0 = (size_t)k * l->p.batch, g1 = g0 + l->p.batch;
    if (g1 > n) g1 = n;
    size_t gb = g1 - g0;
    size_t lo = g0 + gb * l->p.rank / l->p.world, hi = g0 + gb * (l->p.rank + 1) / l->p.world;
    for (size_t i = lo; i < hi; i++) {
        uint32_t j = l->perm[i];
        memcpy(l->x[s] + (i - lo) * l->ss, l->ds->x + (size_t)j * l->ss, sizeof(float) * l->ss);
        l->y[s][i - lo] = l->ds->y[j];
    }
    l->B[s] = (int)(hi - lo);
    l->GB[s] = (int)gb;
    l->first[s] = (int)(lo - g0);
}

static void *prefetch_main(void *arg) {
    dt_loader *l = arg;
    pthread_mutex_lock(&l->mu);
    for (;;) {
        while (l->job < 0 && !l->stop) pthread_cond_wait(&l->cv, &l->mu);
        if (l->stop) break;
        int64_t k = l->job;
        int s = l->job_slot;
        pthread_mutex_unlock(&l->mu);
        fill(l, k, s);
        pthread_mutex_lock(&l->mu);
        l->slot_batch[s] = k;
        l->job = -1;
        pthread_cond_broadcast(&l->cv);
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
    if (ds->n <= 0) return dt_error(DT_ERR_ARG, "loader: empty dataset");
    dt_loader *l = calloc(1, sizeof *l);
    if (!l) return dt_error(DT_ERR_NOMEM, "loader: out of memory");
    l->ds = ds;
    l->p = *p;
    l->ss = dt_dataset_sample_size(ds);
    // A global batch holds at most the dataset: no larger slots than that.
    int gb = p->batch < ds->n ? p->batch : ds->n;
    l->per_rank_max = (gb + p->world - 1) / p->world;
    l->steps = p->drop_last ? ds->n / p->batch : (ds->n + p->batch - 1) / p->batch;
    l->perm = malloc(sizeof(uint32_t) * ds->n);
    for (int s = 0; s < 2; s++) {
        l->x[s] = dt_alloc(sizeof(float) * l->ss * l->per_rank_max);
        l->y[s] = malloc(sizeof(int32_t) * l->per_rank_max);
        l->slot_batch[s] = -1;
    }
    l->job = -1;
    if (!l->perm || !l->x[0] || !l->x[1] || !l->y[0] || !l->y[1]) {
        dt_loader_free(l);
        return dt_error(DT_ERR_NOMEM, "loader: out of memory");
    }
    if (l->steps == 0) {
        dt_loader_free(l);
        return dt_error(DT_ERR_ARG, "loader: %d samples make no full batch of %d with drop_last", ds->n,
                        p->batch);
    }
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->cv, NULL);
    if (p->prefetch) {
        if (pthread_create(&l->thread, NULL, prefetch_main, l) != 0) {
            dt_loader_free(l);
            return dt_error(DT_ERR_INTERNAL, "loader: cannot start the prefetch thread");
        }
        l->has_thread = 1;
    }
    *out = l;
    return DT_OK;
}

void dt_loader_free(dt_loader *l) {
    if (!l) return;
    if (l->has_thread) {
        pthread_mutex_lock(&l->mu);
        l->stop = 1;
        pthread_cond_broadcast(&l->cv);
        pthread_mutex_unlock(&l->mu);
        pthread_join(l->thread, NULL);
        pthread_mutex_destroy(&l->mu);
        pthread_cond_destroy(&l->cv);
    }
    free(l->perm);
    for (int s = 0; s < 2; s++) {
        dt_free(l->x[s]);
        free(l->y[s]);
    }
    free(l);
}

int64_t dt_loader_steps_per_epoch(const dt_loader *l) { return l->steps; }

// Asks the thread for batch k into its slot (caller holds no lock).
static void request(dt_loader *l, int64_t k) {
    if (k >= l->steps) return;
    pthread_mutex_lock(&l->mu);
    while (l->job >= 0) pthread_cond_wait(&l->cv, &l->mu);
    l->job = k;
    l->job_slot = (int)(k & 1);
    l->slot_batch[k & 1] = -1;
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
}

void dt_loader_start_epoch(dt_loader *l, int64_t epoch, int64_t start) {
    if (l->has_thread) {  // let any job of the old epoch finish first
        pthread_mutex_lock(&l->mu);
        while (l->job >= 0) pthread_cond_wait(&l->cv, &l->mu);
        pthread_mutex_unlock(&l->mu);
    }
    for (int i = 0; i < l->ds->n; i++) l->perm[i] = (uint32_t)i;
    if (l->p.shuffle) {
        dt_rng r;
        dt_rng_seed(&r, l->p.seed * 0x9e3779b97f4a7c15ULL + (uint64_t)epoch);
        dt_rng_shuffle(&r, l->perm, (size_t)l->ds->n);
    }
    l->epoch = epoch;
    l->next = start < 0 ? 0 : start;
    l->slot_batch[0] = l->slot_batch[1] = -1;
    if (l->has_thread) request(l, l->next);
}

int dt_loader_next(dt_loader *l, dt_batch *b) {
    int64_t k = l->next;
    if (k >= l->steps) {
        memset(b, 0, sizeof *b);
        return 0;
    }
    int s = (int)(k & 1);
    double t0 = dt_now();
    if (l->has_thread) {
        pthread_mutex_lock(&l->mu);
        while (l->slot_batch[s] != k) pthread_cond_wait(&l->cv, &l->mu);
        pthread_mutex_unlock(&l->mu);
        l->wait += dt_now() - t0;
        request(l, k + 1);  // into the other slot, which held batch k-1
    } else {
        fill(l, k, s);
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
