/* A Prometheus endpoint: an HTTP server on its own threads that answers
 * GET (and HEAD) /metrics with the text exposition format (version 0.0.4).
 *
 * libmicrohttpd parses and answers the requests, on one internal thread
 * waiting in epoll. In front of it a gate thread (epoll too) accepts the
 * connections and holds each until its request header is complete, looking
 * at the bytes without taking them: a NUL byte or a request line that is
 * not METHOD TARGET HTTP/x.y gets 400 there, since libmicrohttpd 0.9.75
 * would read a shorter request or close without an answer. Neither thread
 * waits on one client, and neither touches the training thread's data
 * except through the render callback (which takes its own lock).
 *
 * Bounds: 256 connections sending their header (then the gate stops
 * accepting; the kernel queues the rest), 10 s to send it (then closed),
 * a header of 8 KiB (then 400); 64 connections in libmicrohttpd, each with
 * 32 KiB of buffer and closed after 10 s without progress. One request per
 * connection (Connection: close). Other paths get 404, other methods 405. */
#ifndef DT_OBS_PROM_H
#define DT_OBS_PROM_H

#include "dtrain/core.h"

#include <stdio.h>

typedef struct dt_prom dt_prom;

/* Writes the current metrics to f (called on the server's thread). */
typedef void (*dt_prom_render_fn)(FILE *f, void *user);

/* Listens on addr:port (an IPv4 or IPv6 address, not a name; port 0: one
 * the system picks) and starts the threads. A port in use or a bad address
 * is an error naming it. */
dt_status dt_prom_start(dt_prom **out, const char *addr, int port, dt_prom_render_fn render, void *user);
/* The port listened on (-1 if it cannot be read). */
int dt_prom_port(const dt_prom *p);
/* Stops the threads and closes every socket. NULL is fine. */
void dt_prom_stop(dt_prom *p);

/* Exposition helpers: the # HELP and # TYPE lines of a metric family, and
 * one sample (labels: "" or e.g. "rank=\"1\",phase=\"forward\""). */
void dt_prom_family(FILE *f, const char *name, const char *type, const char *help);
void dt_prom_sample(FILE *f, const char *name, const char *labels, double v);

#endif
