/* Dynamic batching: the split of the global batch from the ranks' speeds
 * (dynbatch.h). */
#include "engine/dynbatch.h"

#include <stdlib.h>
#include <string.h>

struct dt_dynbatch {
    int W, global, nunits, steps;
    double *spp;     // smoothed seconds per sample, per rank
    int *units;      // the split in force
    double *want;    // scratch: each rank's ideal units
};

int dt_dynbatch_max_share(int global, int W) {
    int even = (global + W - 1) / W;
    return 2 * even < global ? 2 * even : global;
}

dt_status dt_dynbatch_create(dt_dynbatch **out, int W, int global, int nunits) {
    dt_dynbatch *d = calloc(1, sizeof *d);
    *out = NULL;
    if (!d) return dt_error(DT_ERR_NOMEM, "dynamic batch: out of memory");
    d->W = W;
    d->global = global;
    d->nunits = nunits;
    d->spp = calloc((size_t)W, sizeof *d->spp);
    d->units = calloc((size_t)W, sizeof *d->units);
    d->want = calloc((size_t)W, sizeof *d->want);
    if (!d->spp || !d->units || !d->want) {
        dt_dynbatch_free(d);
        return dt_error(DT_ERR_NOMEM, "dynamic batch: out of memory");
    }
    for (int r = 0; r < W; r++) d->units[r] = (int)((long)nunits * (r + 1) / W - (long)nunits * r / W);
    *out = d;
    return DT_OK;
}

void dt_dynbatch_free(dt_dynbatch *d) {
    if (!d) return;
    free(d->spp);
    free(d->units);
    free(d->want);
    free(d);
}

int dt_dynbatch_update(dt_dynbatch *d, const double *seconds, const int *share, int *units) {
    int W = d->W, N = d->nunits;
    // Seconds per sample, smoothed over steps (a rank with no samples this
    // step keeps its estimate).
    for (int r = 0; r < W; r++) {
        if (share[r] <= 0 || !(seconds[r] > 0)) continue;
        double s = seconds[r] / share[r];
        d->spp[r] = d->spp[r] > 0 ? 0.7 * d->spp[r] + 0.3 * s : s;
    }
    if (++d->steps < 3) return 0;  // the first steps are warm-up (caches, page faults)
    double speed = 0;
    for (int r = 0; r < W; r++) {
        if (!(d->spp[r] > 0)) return 0;
        speed += 1.0 / d->spp[r];
    }
    // The most units a rank may have: its share at most max_share samples
    // (a run of u units holds at most ceil(global * u / N) samples).
    int most = (int)((long)dt_dynbatch_max_share(d->global, W) * N / d->global);
    if (most < 1) most = 1;
    int total = 0;
    for (int r = 0; r < W; r++) {
        d->want[r] = N * (1.0 / d->spp[r]) / speed;
        int u = (int)d->want[r];
        units[r] = u < 1 ? 1 : u > most ? most : u;
        total += units[r];
    }
    // Units left over (or too many) go to (come from) the ranks furthest
    // below (above) their ideal, within the bounds.
    while (total != N) {
        int best = -1, up = total < N;
        for (int r = 0; r < W; r++) {
            if (up ? units[r] >= most : units[r] <= 1) continue;
            double gap = up ? d->want[r] - units[r] : units[r] - d->want[r];
            if (best < 0 || gap > (up ? d->want[best] - units[best] : units[best] - d->want[best])) best = r;
        }
        if (best < 0) return 0;  // cannot happen: W <= N <= W * most
        units[best] += up ? 1 : -1;
        total += up ? 1 : -1;
    }
    // Small moves are noise: keep the split unless some rank moves by more
    // than 1/16 of an even share (any move when units are that coarse).
    int moved = 0;
    for (int r = 0; r < W; r++) moved |= abs(units[r] - d->units[r]) > N / (16 * W);
    if (!moved) return 0;
    memcpy(d->units, units, sizeof(int) * (size_t)W);
    return 1;
}

dt_status dt_dynbatch_share(dt_dynbatch *d, dt_comm_t comm, int from, int *units) {
    int W = d->W;
    size_t n = 1 + 2 * (size_t)W;
    double *buf = malloc(sizeof *buf * n);  // (the estimates' bits, and counts exact in a double)
    if (!buf) return dt_error(DT_ERR_NOMEM, "dynamic batch: out of memory");
    buf[0] = d->steps;
    for (int r = 0; r < W; r++) {
        buf[1 + r] = d->spp[r];
        buf[1 + W + r] = d->units[r];
    }
    dt_status st = dt_broadcast(buf, buf, n * 2, DT_I32, from, comm);  // (doubles as pairs of 32-bit words)
    if (st == DT_OK) {
        d->steps = (int)buf[0];
        for (int r = 0; r < W; r++) {
            d->spp[r] = buf[1 + r];
            units[r] = d->units[r] = (int)buf[1 + W + r];
        }
    }
    free(buf);
    return st == DT_OK ? DT_OK : dt_error(st, "dynamic batch: taking rank %d's split: %s", from, dt_last_error());
}
