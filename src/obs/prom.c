/* The Prometheus endpoint (see prom.h). */
#include "obs/prom.h"

#include <errno.h>
#include <math.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define POLL_MS 100           // how often the thread looks at the stop flag
#define REQUEST_SECONDS 2.0   // a client has this long to send its request
#define MAX_REQUEST 8192

struct dt_prom {
    int fd;
    pthread_t thread;
    atomic_int stop;
    dt_prom_render_fn render;
    void *user;
};

void dt_prom_family(FILE *f, const char *name, const char *type, const char *help) {
    fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

void dt_prom_sample(FILE *f, const char *name, const char *labels, double v) {
    if (isnan(v)) fprintf(f, "%s%s%s%s NaN\n", name, *labels ? "{" : "", labels, *labels ? "}" : "");
    else fprintf(f, "%s%s%s%s %.10g\n", name, *labels ? "{" : "", labels, *labels ? "}" : "", v);
}

// Sends all of buf, giving up at the deadline (a client that does not read).
static void send_all(int fd, const char *buf, size_t n, double deadline) {
    while (n > 0) {
        struct pollfd p = {fd, POLLOUT, 0};
        int left = (int)((deadline - dt_now()) * 1000);
        if (left <= 0 || poll(&p, 1, left) <= 0) return;
        ssize_t k = send(fd, buf, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k < 0 && (errno == EAGAIN || errno == EINTR)) continue;
        if (k <= 0) return;
        buf += k;
        n -= (size_t)k;
    }
}

static void respond(int fd, int code, const char *ctype, const char *body, size_t n, int head_only,
                    double deadline) {
    const char *reason = code == 200 ? "OK" : code == 400 ? "Bad Request" : code == 404 ? "Not Found"
                                                                                     : "Method Not Allowed";
    char hdr[512];
    int h = snprintf(hdr, sizeof hdr,
                     "HTTP/1.0 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n%sConnection: close\r\n\r\n",
                     code, reason, ctype, n, code == 405 ? "Allow: GET, HEAD\r\n" : "");
    send_all(fd, hdr, (size_t)h, deadline);
    if (!head_only) send_all(fd, body, n, deadline);
}

static void error_page(int fd, int code, const char *msg, double deadline) {
    respond(fd, code, "text/plain; charset=utf-8", msg, strlen(msg), 0, deadline);
}

// Reads one request (up to the blank line) and answers it.
static void serve(dt_prom *p, int fd) {
    char req[MAX_REQUEST + 1];
    size_t n = 0;
    double deadline = dt_now() + REQUEST_SECONDS;
    req[0] = 0;
    while (!strstr(req, "\r\n\r\n") && !strstr(req, "\n\n")) {
        if (n == MAX_REQUEST) return error_page(fd, 400, "request too long\n", deadline);
        struct pollfd pf = {fd, POLLIN, 0};
        int left = (int)((deadline - dt_now()) * 1000);
        if (left <= 0 || poll(&pf, 1, left) <= 0) return error_page(fd, 400, "incomplete request\n", deadline);
        ssize_t k = recv(fd, req + n, MAX_REQUEST - n, MSG_DONTWAIT);
        if (k < 0 && (errno == EAGAIN || errno == EINTR)) continue;
        if (k <= 0) {
            if (n == 0) return;  // connected and closed: nothing to answer
            break;               // ended without a blank line: answer what came
        }
        n += (size_t)k;
        req[n] = 0;
    }
    // Request line: METHOD SP TARGET SP HTTP/x.y
    char method[16], target[2048], version[16];
    char *eol = strpbrk(req, "\r\n");
    if (eol) *eol = 0;
    if (sscanf(req, "%15s %2047s %15s", method, target, version) != 3 || strncmp(version, "HTTP/", 5))
        return error_page(fd, 400, "malformed request line\n", deadline);
    int head = !strcmp(method, "HEAD");
    if (strcmp(method, "GET") && !head) return error_page(fd, 405, "only GET and HEAD\n", deadline);
    char *q = strchr(target, '?');
    if (q) *q = 0;
    if (strcmp(target, "/metrics")) return error_page(fd, 404, "not found: the metrics are at /metrics\n", deadline);
    char *body = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&body, &len);
    if (!m) return error_page(fd, 400, "out of memory\n", deadline);
    p->render(m, p->user);
    fclose(m);
    respond(fd, 200, "text/plain; version=0.0.4; charset=utf-8", body, len, head, deadline);
    free(body);
}

static void *server_main(void *arg) {
    dt_prom *p = arg;
    while (!atomic_load(&p->stop)) {
        struct pollfd pf = {p->fd, POLLIN, 0};
        if (poll(&pf, 1, POLL_MS) <= 0) continue;
        int c = accept(p->fd, NULL, NULL);
        if (c < 0) continue;
        serve(p, c);
        shutdown(c, SHUT_WR);
        close(c);
    }
    return NULL;
}

dt_status dt_prom_start(dt_prom **out, const char *addr, int port, dt_prom_render_fn render, void *user) {
    *out = NULL;
    struct addrinfo hints = {0}, *ai = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICHOST | AI_NUMERICSERV;  // no name lookups
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    int rc = getaddrinfo(addr, ps, &hints, &ai);
    if (rc != 0) return dt_error(DT_ERR_CONFIG, "metrics endpoint %s:%d: expected an IPv4 or IPv6 address such as 127.0.0.1, 0.0.0.0 or ::1 (%s)",
                        addr, port, gai_strerror(rc));
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
        freeaddrinfo(ai);
        return dt_error(DT_ERR_IO, "metrics endpoint %s:%d: socket: %s", addr, port, strerror(errno));
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 16) != 0) {
        int e = errno;
        freeaddrinfo(ai);
        close(fd);
        return dt_error(DT_ERR_IO, "metrics endpoint %s:%d: cannot listen: %s%s", addr, port, strerror(e),
                        e == EADDRINUSE ? " (choose another --metrics-port)" : "");
    }
    freeaddrinfo(ai);
    dt_prom *p = calloc(1, sizeof *p);
    if (!p) {
        close(fd);
        return dt_error(DT_ERR_NOMEM, "metrics endpoint: out of memory");
    }
    p->fd = fd;
    p->render = render;
    p->user = user;
    if (pthread_create(&p->thread, NULL, server_main, p) != 0) {
        close(fd);
        free(p);
        return dt_error(DT_ERR_INTERNAL, "metrics endpoint: cannot start its thread");
    }
    *out = p;
    return DT_OK;
}

void dt_prom_stop(dt_prom *p) {
    if (!p) return;
    atomic_store(&p->stop, 1);
    pthread_join(p->thread, NULL);
    close(p->fd);
    free(p);
}
