/* Straggler detection (see straggler.h). */
#include "obs/straggler.h"

#include "dtrain/core.h"

#include <stdint.h>
#include <stdlib.h>

struct dt_straggler {
    int n, steps;
    double margin;
    int *run;      // consecutive steps above the threshold, per rank
    char *flagged;
    int64_t t;     // updates so far
    int64_t *shown;  // the update of each rank's last loud report (-1: none)
    int *reports, *loud;
    double *tmp;   // n values, for medians
};

dt_straggler *dt_straggler_create(int nranks, double margin, int steps) {
    dt_straggler *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->n = nranks;
    s->steps = steps;
    s->margin = margin;
    s->run = calloc(nranks, sizeof *s->run);
    s->flagged = calloc(nranks, 1);
    s->tmp = calloc(nranks, sizeof *s->tmp);
    s->shown = malloc(sizeof *s->shown * (size_t)(nranks > 0 ? nranks : 1));
    s->reports = calloc(nranks, sizeof *s->reports);
    s->loud = calloc(nranks, sizeof *s->loud);
    for (int r = 0; s->shown && r < nranks; r++) s->shown[r] = -1;
    if (!s->run || !s->flagged || !s->tmp || !s->shown || !s->reports || !s->loud) {
        dt_straggler_free(s);
        return NULL;
    }
    return s;
}

void dt_straggler_free(dt_straggler *s) {
    if (!s) return;
    free(s->run);
    free(s->flagged);
    free(s->tmp);
    free(s->shown);
    free(s->reports);
    free(s->loud);
    free(s);
}

// The phase in which rank r exceeds the other ranks' median the most.
static int slow_phase(dt_straggler *s, int r, const double *phases, int nphases, double *excess) {
    int best = 0;
    *excess = -1e300;
    for (int p = 0; p < nphases; p++) {
        int k = 0;
        for (int q = 0; q < s->n; q++)
            if (q != r) s->tmp[k++] = phases[(size_t)q * nphases + p];
        double d = phases[(size_t)r * nphases + p] - dt_median(s->tmp, k);
        if (d > *excess) {
            *excess = d;
            best = p;
        }
    }
    return best;
}

int dt_straggler_update(dt_straggler *s, const double *busy, const double *phases, int nphases,
                        dt_straggler_report *out) {
    if (!s || s->n < 2 || s->steps <= 0) return 0;
    s->t++;
    for (int r = 0; r < s->n; r++) s->tmp[r] = busy[r];
    double med = dt_median(s->tmp, s->n);
    int k = 0;
    for (int r = 0; r < s->n; r++) {
        if (busy[r] <= med * (1 + s->margin)) {
            s->run[r] = 0;
            s->flagged[r] = 0;
            continue;
        }
        if (++s->run[r] < s->steps || s->flagged[r]) continue;
        s->flagged[r] = 1;
        dt_straggler_report *o = &out[k++];
        o->rank = r;
        o->seconds = busy[r];
        o->median = med;
        o->phase = slow_phase(s, r, phases, nphases, &o->excess);
        o->loud = s->shown[r] < 0 || s->t - s->shown[r] >= DT_STRAGGLER_QUIET;
        if (o->loud) s->shown[r] = s->t, s->loud[r]++;
        s->reports[r]++;
    }
    return k;
}

int dt_straggler_reports(const dt_straggler *s, int r, int *loud) {
    *loud = s && r >= 0 && r < s->n ? s->loud[r] : 0;
    return s && r >= 0 && r < s->n ? s->reports[r] : 0;
}

int dt_straggler_flagged(const dt_straggler *s, int r) { return s && r >= 0 && r < s->n && s->flagged[r]; }
