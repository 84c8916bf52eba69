/* The messages of the parameter-server strategy (their header and kinds:
 * ps_impl.h; ps.c has the overview): the kinds' names, waiting for
 * requests, a header checked as it arrives at a worker, and a push
 * checked and taken at a server. */
#include "engine/strategies/ps/ps_impl.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *ps_kind_name(int64_t k) {
    static const char *names[] = {"INIT", "PUSH", "COMMIT", "FETCH", "END", "NORM", "WEIGHTS", "STATES",
                                  "JOIN", "JOINED", "RESUME", "DESC", "SAVE", "SAVED", "HELLO", "HELLOED",
                                  "PULL", "SPUSH", "ROWS"};
    return k > PS_MAGIC && k <= M_ROWS ? names[k - PS_MAGIC - 1] : "unknown";
}

// Waits for every request of r[0..n) (NULL ones are skipped); the first error.
dt_status ps_wait_all(dt_request_t *r, int n) {
    dt_status st = DT_OK;
    char msg[1024] = "";
    for (int i = 0; i < n; i++) {
        dt_status s = dt_wait(&r[i]);
        if (s != DT_OK && st == DT_OK) {
            st = s;
            snprintf(msg, sizeof msg, "%s", dt_last_error());
        }
    }
    return st == DT_OK ? DT_OK : dt_error(st, "%s", msg);
}

// Receives a header from server j and checks that it is the one expected.
dt_status ps_expect(ps_worker *w, int j, int64_t *h, int64_t kind) {
    dt_status st = dt_recv(h, H_N, DT_I64, j, w->base.all);
    if (st != DT_OK) return st;
    if (h[H_KIND] != kind || h[H_STEP] != w->step)
        return dt_error(DT_ERR_COMM, "worker %d: server %d sent %s for step %lld, expected %s for step %lld",
                        w->base.rank, j, ps_kind_name(h[H_KIND]), (long long)h[H_STEP] + 1, ps_kind_name(kind),
                        (long long)w->step + 1);
    return DT_OK;
}

// A failure naming this server and the worker.
dt_status ps_refuse(server *sv, int wi, const char *fmt, ...) {
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return dt_error(DT_ERR_COMM, "server %d: refused a push from worker %d at step %lld: %s", sv->me, wi,
                    (long long)sv->w[wi].step + 1, what);
}

dt_status ps_post_header(server *sv, int wi) {
    return dt_irecv(sv->w[wi].h, H_N, DT_I64, sv->w[wi].rank, sv->all, &sv->w[wi].req);
}

// A push from worker wi: checked, then its data into the worker's buffer.
dt_status ps_take_push(server *sv, int wi) {
    peer *p = &sv->w[wi];
    const int64_t *h = p->h;
    int64_t off = h[H_OFF], cnt = h[H_COUNT], lo = (int64_t)sv->lo, hi = (int64_t)(sv->lo + sv->len);
    if (h[H_STEP] != p->step) return ps_refuse(sv, wi, "step %lld, expected step %lld", (long long)h[H_STEP] + 1,
                                               (long long)p->step + 1);
    if (h[H_VERSION] != p->sent)
        return ps_refuse(sv, wi, "computed from weights version %lld, expected version %lld", (long long)h[H_VERSION],
                         (long long)p->sent);
    // fp32, int64 fixed point (deterministic), or with [compression] a
    // message of the method's (DT_U8, H_B bytes; small pieces go as fp32)
    int coded = sv->c->comp_method != DT_COMP_NONE && h[H_A] == DT_U8;
    if (h[H_A] != (sv->det ? DT_I64 : DT_F32) && !coded)
        return ps_refuse(sv, wi, "element type %lld, expected %d%s", (long long)h[H_A], sv->det ? DT_I64 : DT_F32,
                         sv->c->comp_method != DT_COMP_NONE ? " or a compressed message" : "");
    if (cnt <= 0 || off < lo || off + cnt > hi)
        return ps_refuse(sv, wi, "shape: elements [%lld, +%lld) outside this server's range", (long long)off,
                      (long long)cnt);
    if (memchr(p->seen + (off - lo), 1, (size_t)cnt))
        return ps_refuse(sv, wi, "shape: elements [%lld, +%lld) pushed twice in one step", (long long)off,
                      (long long)cnt);
    size_t es = sv->det ? sizeof(int64_t) : sizeof(float);
    dt_status st;
    if (coded) {
        if (h[H_B] <= 0 || h[H_B] > 8 * cnt + 64)
            return ps_refuse(sv, wi, "a compressed message of %lld bytes for %lld values", (long long)h[H_B],
                             (long long)cnt);
        size_t bytes = (size_t)h[H_B];
        if (bytes > sv->msgcap) {
            free(sv->msg);
            sv->msgcap = 0;
            if (!(sv->msg = malloc(bytes))) return dt_error(DT_ERR_NOMEM, "server %d: out of memory", sv->me);
            sv->msgcap = bytes;
        }
        if ((st = dt_recv(sv->msg, bytes, DT_U8, sv->w[wi].rank, sv->all)) != DT_OK) return st;
        if (dt_codec_decode(sv->c, sv->msg, bytes, (size_t)cnt, (float *)p->buf + (off - lo)) != DT_OK)
            return ps_refuse(sv, wi, "elements [%lld, +%lld): %s", (long long)off, (long long)cnt, dt_last_error());
    } else {
        st = dt_recv((char *)p->buf + (size_t)(off - lo) * es, (size_t)cnt, sv->det ? DT_I64 : DT_F32,
                     sv->w[wi].rank, sv->all);
        if (st != DT_OK) return st;
    }
    memset(p->seen + (off - lo), 1, (size_t)cnt);
    p->got += (size_t)cnt;
    return DT_OK;
}
