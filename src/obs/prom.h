/* A Prometheus endpoint: a small HTTP/1.0 server on its own thread that
 * answers GET /metrics with the text exposition format (version 0.0.4).
 * The thread polls with short timeouts, serves one request at a time with
 * a deadline, and never touches the training thread's data except through
 * the render callback (which takes its own lock). Malformed requests get
 * 400, other paths 404, other methods 405. */
#ifndef DT_OBS_PROM_H
#define DT_OBS_PROM_H

#include "dtrain/core.h"

#include <stdio.h>

typedef struct dt_prom dt_prom;

/* Writes the current metrics to f (called on the server's thread). */
typedef void (*dt_prom_render_fn)(FILE *f, void *user);

/* Listens on addr:port (an IPv4 or IPv6 address, not a name) and starts
 * the thread. A port in use or a bad address is an error naming it. */
dt_status dt_prom_start(dt_prom **out, const char *addr, int port, dt_prom_render_fn render, void *user);
/* Stops the thread and closes the socket. NULL is fine. */
void dt_prom_stop(dt_prom *p);

/* Exposition helpers: the # HELP and # TYPE lines of a metric family, and
 * one sample (labels: "" or e.g. "rank=\"1\",phase=\"forward\""). */
void dt_prom_family(FILE *f, const char *name, const char *type, const char *help);
void dt_prom_sample(FILE *f, const char *name, const char *labels, double v);

#endif
