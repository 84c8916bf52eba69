/* The Prometheus endpoint (see prom.h for the design and its bounds). */
#include "obs/prom.h"

#include <errno.h>
#include <math.h>
#ifdef DTRAIN_HAVE_MHD
#include <microhttpd.h>
#endif
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

// Bounds on what clients can hold (see prom.h).
#define MAX_WAITING 256            // connections still sending their request header
#define MAX_SERVED 64              // connections handed to libmicrohttpd
#define HEADER_SECONDS 10.0        // time to send a request header (408 after)
#define IDLE_SECONDS 10            // libmicrohttpd: time without any progress
#define MAX_HEADER 8192            // bytes of request line and headers
#define CONNECTION_MEMORY (32 * 1024)  // libmicrohttpd's buffer per connection

#ifdef DTRAIN_HAVE_MHD
struct waiting {
    int fd;  // -1: free slot
    double deadline;
    struct sockaddr_storage addr;
    socklen_t addrlen;
};

struct dt_prom {
    int listen_fd, epoll_fd, stop_fd;
    int nwaiting, accepting;
    double pause_until;  // accept() failed (out of descriptors): try again then
    pthread_t thread;
    struct MHD_Daemon *mhd;
    dt_prom_render_fn render;
    void *user;
    struct waiting w[MAX_WAITING];
    char buf[MAX_HEADER];
};
#endif

void dt_prom_family(FILE *f, const char *name, const char *type, const char *help) {
    fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

void dt_prom_sample(FILE *f, const char *name, const char *labels, double v) {
    if (isnan(v)) fprintf(f, "%s%s%s%s NaN\n", name, *labels ? "{" : "", labels, *labels ? "}" : "");
    else fprintf(f, "%s%s%s%s %.10g\n", name, *labels ? "{" : "", labels, *labels ? "}" : "", v);
}

#ifndef DTRAIN_HAVE_MHD
// Built without libmicrohttpd: no endpoint.
dt_status dt_prom_start(dt_prom **out, const char *addr, int port, dt_prom_render_fn render, void *user) {
    (void)addr, (void)port, (void)render, (void)user;
    *out = NULL;
    return dt_error(DT_ERR_ARG, "the metrics endpoint (--metrics-port, [obs] metrics_port) needs libmicrohttpd, which "
                    "this build of dtrain lacks (install libmicrohttpd-dev and rebuild)");
}
int dt_prom_port(const dt_prom *p) { return (void)p, -1; }
void dt_prom_stop(dt_prom *p) { (void)p; }
#else
static enum MHD_Result answer(struct MHD_Connection *c, unsigned code, const char *ctype, char *body, size_t n,
                              enum MHD_ResponseMemoryMode mode) {
    struct MHD_Response *r = MHD_create_response_from_buffer(n, body, mode);
    if (!r) {
        if (mode == MHD_RESPMEM_MUST_FREE) free(body);
        return MHD_NO;  // closes the connection
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    // One request per connection: every request passes the gate.
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONNECTION, "close");
    if (code == MHD_HTTP_METHOD_NOT_ALLOWED) MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
    enum MHD_Result ret = MHD_queue_response(c, code, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result error_page(struct MHD_Connection *c, unsigned code, const char *msg) {
    return answer(c, code, "text/plain; charset=utf-8", (char *)msg, strlen(msg), MHD_RESPMEM_PERSISTENT);
}

// libmicrohttpd calls this once the request header is in (and again for
// each piece of an upload, which every answer here refuses by coming first).
static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                              const char *version, const char *upload, size_t *upload_size, void **state) {
    (void)version, (void)upload, (void)upload_size, (void)state;
    dt_prom *p = cls;
    if (strcmp(method, MHD_HTTP_METHOD_GET) && strcmp(method, MHD_HTTP_METHOD_HEAD))
        return error_page(c, MHD_HTTP_METHOD_NOT_ALLOWED, "only GET and HEAD\n");
    if (strcmp(url, "/metrics")) return error_page(c, MHD_HTTP_NOT_FOUND, "not found: the metrics are at /metrics\n");
    char *body = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&body, &len);
    if (!m) return MHD_NO;
    p->render(m, p->user);
    fclose(m);
    return answer(c, MHD_HTTP_OK, "text/plain; version=0.0.4; charset=utf-8", body, len, MHD_RESPMEM_MUST_FREE);
}

// ---- the gate ----------------------------------------------------------------

// Where the header of buf[0..n) ends (after its blank line), or 0.
static size_t header_end(const char *buf, size_t n) {
    for (size_t i = 1; i < n; i++)
        if (buf[i] == '\n' && (buf[i - 1] == '\n' || (i >= 2 && buf[i - 1] == '\r' && buf[i - 2] == '\n')))
            return i + 1;
    return 0;
}

// NULL when the header is one libmicrohttpd reads as it was sent, else why not.
static const char *header_problem(const char *h, size_t n) {
    if (memchr(h, 0, n)) return "malformed request: a NUL byte in the request line or a header\n";
    // METHOD SP TARGET SP HTTP/x.y: three words on the first line.
    const char *eol = memchr(h, '\n', n), *sp1 = memchr(h, ' ', n);
    const char *sp2 = sp1 && sp1 < eol ? memchr(sp1 + 1, ' ', (size_t)(eol - sp1 - 1)) : NULL;
    if (!sp2 || sp1 == h || sp2 == sp1 + 1 || eol - sp2 < 9 || strncmp(sp2 + 1, "HTTP/", 5))
        return "malformed request line: expected METHOD TARGET HTTP/x.y\n";
    return NULL;
}

// Answers 400 (or 408) and closes: reads what was sent first (up to a
// header's worth) so that closing does not reset the connection before the
// client reads the answer.
static void refuse(int fd, int code, const char *why) {
    char hdr[192], sink[1024];
    int h = snprintf(hdr, sizeof hdr,
                     "HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\n"
                     "Content-Length: %zu\r\nConnection: close\r\n\r\n",
                     code, code == 408 ? "Request Timeout" : "Bad Request", strlen(why));
    for (size_t left = MAX_HEADER; left > 0;) {
        ssize_t k = recv(fd, sink, sizeof sink, MSG_DONTWAIT);
        if (k <= 0) break;
        left -= (size_t)k < left ? (size_t)k : left;
    }
    // Small enough for an empty socket buffer: never waits.
    if (send(fd, hdr, (size_t)h, MSG_DONTWAIT | MSG_NOSIGNAL | MSG_MORE) == h)
        send(fd, why, strlen(why), MSG_DONTWAIT | MSG_NOSIGNAL);
    shutdown(fd, SHUT_WR);
    close(fd);
}

static void drop(dt_prom *p, int i, int close_it) {
    epoll_ctl(p->epoll_fd, EPOLL_CTL_DEL, p->w[i].fd, NULL);
    if (close_it) close(p->w[i].fd);
    p->w[i].fd = -1;
    p->nwaiting--;
}

// New data on a waiting connection: look at its header so far (without
// taking it off the socket) and pass it on, refuse it or keep waiting.
// ended: the client has sent all it will.
static void look(dt_prom *p, int i, int ended) {
    int fd = p->w[i].fd;
    ssize_t n = recv(fd, p->buf, sizeof p->buf, MSG_PEEK | MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (n <= 0) return drop(p, i, 1);  // closed (or reset) before a request
    size_t end = header_end(p->buf, (size_t)n);
    const char *why = end ? header_problem(p->buf, end) : memchr(p->buf, 0, (size_t)n) ? header_problem(p->buf, (size_t)n)
                      : (size_t)n == sizeof p->buf ? "request header too long\n"
                      : ended ? "incomplete request: the client stopped sending before the header's blank line\n" : NULL;
    if (why) {
        drop(p, i, 0);
        refuse(fd, 400, why);
    } else if (end) {
        drop(p, i, 0);
        MHD_add_connection(p->mhd, fd, (struct sockaddr *)&p->w[i].addr, p->w[i].addrlen);  // closes fd on failure
    }
}

static void accept_all(dt_prom *p) {
    while (p->nwaiting < MAX_WAITING) {
        int i = 0;
        while (p->w[i].fd >= 0) i++;
        struct waiting *w = &p->w[i];
        w->addrlen = sizeof w->addr;
        int fd = accept4(p->listen_fd, (struct sockaddr *)&w->addr, &w->addrlen, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            // Out of descriptors: the connection stays queued, and the
            // listening socket readable; look again in 100 ms, not at once.
            if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED) p->pause_until = dt_now() + 0.1;
            return;
        }
        // Edge-triggered: one wake-up per arrival, though the bytes stay unread.
        struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP | EPOLLET, .data.u32 = (uint32_t)i};
        if (epoll_ctl(p->epoll_fd, EPOLL_CTL_ADD, fd, &ev) != 0) {
            close(fd);
            return;
        }
        w->fd = fd;
        w->deadline = dt_now() + HEADER_SECONDS;
        p->nwaiting++;
    }
}

// Stops or resumes accepting, so that at most MAX_WAITING connections wait.
static void set_accepting(dt_prom *p, double now) {
    int want = p->nwaiting < MAX_WAITING && now >= p->pause_until;
    if (want == p->accepting) return;
    struct epoll_event ev = {.events = want ? EPOLLIN : 0, .data.u32 = MAX_WAITING};
    epoll_ctl(p->epoll_fd, EPOLL_CTL_MOD, p->listen_fd, &ev);
    p->accepting = want;
}

static void *gate_main(void *arg) {
    dt_prom *p = arg;
    struct epoll_event ev[64];
    for (;;) {
        double now = dt_now(), next = now + 1;
        for (int i = 0; i < MAX_WAITING; i++) {
            if (p->w[i].fd < 0) continue;
            if (p->w[i].deadline <= now) {
                int fd = p->w[i].fd;
                drop(p, i, 0);
                refuse(fd, 408, "request timeout: the request header did not end in time\n");
            }
            else if (p->w[i].deadline < next) next = p->w[i].deadline;
        }
        if (p->pause_until > now && p->pause_until < next) next = p->pause_until;
        set_accepting(p, now);
        int n = epoll_wait(p->epoll_fd, ev, 64, (int)((next - now) * 1000) + 1);
        for (int k = 0; k < n; k++) {
            uint32_t i = ev[k].data.u32;
            if (i == MAX_WAITING + 1) return NULL;  // dt_prom_stop
            if (i == MAX_WAITING) accept_all(p);
            else if (p->w[i].fd >= 0) look(p, (int)i, (ev[k].events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) != 0);
        }
    }
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
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
    if (fd < 0) {
        freeaddrinfo(ai);
        return dt_error(DT_ERR_IO, "metrics endpoint %s:%d: socket: %s", addr, port, strerror(errno));
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, SOMAXCONN) != 0) {
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
    p->listen_fd = fd;
    p->render = render;
    p->user = user;
    for (int i = 0; i < MAX_WAITING; i++) p->w[i].fd = -1;
    // libmicrohttpd: one internal thread waiting in epoll, no listening
    // socket of its own (the gate adds connections), no logging.
    p->mhd = MHD_start_daemon(MHD_USE_EPOLL_INTERNAL_THREAD | MHD_USE_NO_LISTEN_SOCKET | MHD_USE_ITC, 0, NULL, NULL,
                              handle, p,
                              MHD_OPTION_CONNECTION_LIMIT, (unsigned)MAX_SERVED,
                              MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)IDLE_SECONDS,
                              MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)CONNECTION_MEMORY,
                              MHD_OPTION_END);
    p->epoll_fd = epoll_create1(EPOLL_CLOEXEC);
    p->stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    struct epoll_event lev = {.events = EPOLLIN, .data.u32 = MAX_WAITING};
    struct epoll_event sev = {.events = EPOLLIN, .data.u32 = MAX_WAITING + 1};
    p->accepting = 1;
    if (!p->mhd || p->epoll_fd < 0 || p->stop_fd < 0 || epoll_ctl(p->epoll_fd, EPOLL_CTL_ADD, fd, &lev) != 0 ||
        epoll_ctl(p->epoll_fd, EPOLL_CTL_ADD, p->stop_fd, &sev) != 0 ||
        pthread_create(&p->thread, NULL, gate_main, p) != 0) {
        int e = errno;
        if (p->mhd) MHD_stop_daemon(p->mhd);
        if (p->epoll_fd >= 0) close(p->epoll_fd);
        if (p->stop_fd >= 0) close(p->stop_fd);
        close(fd);
        free(p);
        return dt_error(DT_ERR_INTERNAL, "metrics endpoint %s:%d: cannot start the server threads: %s", addr, port,
                        strerror(e));
    }
    *out = p;
    return DT_OK;
}

int dt_prom_port(const dt_prom *p) {
    struct sockaddr_storage a;
    socklen_t len = sizeof a;
    if (getsockname(p->listen_fd, (struct sockaddr *)&a, &len) != 0) return -1;
    return ntohs(a.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&a)->sin6_port : ((struct sockaddr_in *)&a)->sin_port);
}

void dt_prom_stop(dt_prom *p) {
    if (!p) return;
    uint64_t one = 1;
    ssize_t k = write(p->stop_fd, &one, sizeof one);  // (cannot fail: the counter is 0)
    (void)k;
    pthread_join(p->thread, NULL);
    for (int i = 0; i < MAX_WAITING; i++)
        if (p->w[i].fd >= 0) close(p->w[i].fd);
    MHD_stop_daemon(p->mhd);  // joins its thread, closes its connections
    close(p->epoll_fd);
    close(p->stop_fd);
    close(p->listen_fd);
    free(p);
}
#endif
