/* Parts of report.c that the simulator (simulate.c) uses too. */
#ifndef DT_OBS_REPORT_H
#define DT_OBS_REPORT_H

#include "dtrain/core.h"

/* Rank 0's median seconds per step of each phase, over its step records
 * after the first two (warm-up; all of them when there are fewer than 5):
 * data, forward, backward, comm exposed, comm hidden, optimizer, and the
 * whole step (step_seconds). Errors name the run directory or the log and
 * line. */
dt_status dt_report_phase_medians(const char *run_dir, double med[7]);

/* One self-contained HTML page at path: a title, a paragraph and a table
 * given as HTML (the caller escapes what it puts there), and a line chart
 * of ns series (names[k], y[k][0..n-1] over x[0..n-1]). Written atomically. */
dt_status dt_report_chart_page(const char *path, const char *title, const char *body_html, const char *xl,
                                         const char *yl, const char *const *names, const double *x,
                               const double *const *y, int ns, int n);

#endif
