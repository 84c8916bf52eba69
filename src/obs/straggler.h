/* Straggler detection (rank 0): a rank whose step time stays above the
 * median of all ranks by more than a margin for several steps in a row.
 *
 * The step time compared is a rank's own work in the step (data wait +
 * forward + backward + optimizer), not its wall time: in synchronous data
 * parallel every rank's wall time is the same, because the fast ranks wait
 * for the slow one inside the gradient allreduce. */
#ifndef DT_OBS_STRAGGLER_H
#define DT_OBS_STRAGGLER_H

typedef struct dt_straggler dt_straggler;

/* A rank that just became a straggler. */
typedef struct {
    int rank;
    int phase;          /* index into the phases given to update */
    double seconds;     /* its step time */
    double median;      /* the median step time of all ranks */
    double excess;      /* its time in `phase` minus the others' median there */
    int loud;           /* worth a warning: the rank's first report, or the first after
                           DT_STRAGGLER_QUIET steps without one shown (a shared machine
                           makes the same ranks flip in and out) */
} dt_straggler_report;

#define DT_STRAGGLER_QUIET 100

/* nranks ranks, margin (0.2: 20% above the median), steps in a row before
 * a report (0: never). NULL when out of memory. */
dt_straggler *dt_straggler_create(int nranks, double margin, int steps);
void dt_straggler_free(dt_straggler *s);
/* One step: busy[r] is rank r's step time, phases[r * nphases + p] its time
 * in phase p. Fills out[] (nranks entries) with the ranks that crossed the
 * threshold at this step, once per episode: a rank is reported again only
 * after it has been back under the threshold. Returns how many. */
int dt_straggler_update(dt_straggler *s, const double *busy, const double *phases, int nphases,
                        dt_straggler_report *out);
/* 1 while rank r is a reported straggler. */
int dt_straggler_flagged(const dt_straggler *s, int r);
/* Rank r's reports so far, and how many of them were loud. */
int dt_straggler_reports(const dt_straggler *s, int r, int *loud);

#endif
