/* Chrome trace-event files (the JSON "traceEvents" format that Perfetto and
 * chrome://tracing load): every rank writes its own part, FILE.rank-N, as
 * the run goes; at the end rank 0 merges the parts into FILE. In the result
 * pid is the rank (one process track per rank, named "rank N") and tid 1 is
 * the compute thread, tid 2 the communication; every span is an "X"
 * (complete) event with ts and dur in microseconds. */
#ifndef DT_OBS_TRACE_H
#define DT_OBS_TRACE_H

#include "dtrain/core.h"

typedef struct dt_trace dt_trace;

enum { DT_TRACE_COMPUTE = 1, DT_TRACE_COMM = 2 };

/* Creates path.rank-N and writes the track names into it. */
dt_status dt_trace_open(dt_trace **out, const char *path, int rank, const char *label);
/* One span: start and duration in microseconds; args is a JSON object's
 * text or NULL. Not thread-safe: callers serialise. */
void dt_trace_span(dt_trace *t, const char *name, const char *cat, int tid, double ts_us, double dur_us,
                   const char *args);
/* Closes this rank's part (NULL is fine). */
dt_status dt_trace_finish(dt_trace *t);
/* Rank 0, after every rank has finished its part: writes path from the
 * nranks parts (atomically) and removes them. */
dt_status dt_trace_merge(const char *path, int nranks);

#endif
