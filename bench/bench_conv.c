/* The convolution's two paths on configs/fashion-cnn.ini's shapes (batch
 * 64, whole and as tensor-parallel shards at T = 2 and 4): oneDNN's
 * primitives (routing off, so a shape on oneDNN's reference kernel runs
 * there) against the portable path (im2col + GEMM), each pass timed on its
 * own, in milliseconds a call, fp32, in the layouts the model gives them
 * (blocked nChw16c between the convolutions where oneDNN prefers it, as
 * model.c's plan_layouts decides), and no input gradient for the first
 * (the model's input needs none). A third row per shape runs dt_conv_* as
 * routed (oneDNN, portable, or mixed: backward weights portable).
 *
 *   bench_conv [--threads T] [--batch B]
 *
 * Each pass runs until 0.3 s have passed (at least twice, the first call
 * not counted: it makes the plan). The "impls" column is oneDNN's choice. */
#include "dtrain/core.h"
#include "kernels/kernels.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const dt_conv_shape *s;
    float *x, *w, *b, *y, *dy, *dx, *dw, *db, *save, *scratch;
    int portable;  // 0 oneDNN's primitives alone, 1 the portable path, 2 dt_conv_* as routed
} bufs;

static void pass(const bufs *u, int which) {
    const dt_conv_shape *s = u->s;
    if (which == 0) {
        if (u->portable == 1) dt_conv_portable_forward(u->y, u->save, u->scratch, u->x, u->w, u->b, s);
        else dt_conv_forward(u->y, NULL, u->save, u->scratch, u->x, u->w, u->b, s);
        return;
    }
    float *dx = which == 1 ? u->dx : NULL, *dw = which == 2 ? u->dw : NULL, *db = which == 2 ? u->db : NULL;
    if (u->portable == 1) dt_conv_portable_backward(dx, dw, db, u->scratch, u->y, u->dy, u->save, u->w, s, 1);
    else dt_conv_backward(dx, dw, db, u->scratch, u->y, u->dy, u->save, u->w, s, 1);
}

static double ms_per_call(const bufs *u, int which) {
    dt_conv_set_routing(u->portable == 2);
    if (which == 1 && u->s->no_dinp) return 0.0;
    pass(u, 0);  // (the plan, and the save backward reads)
    int n = 0;
    double t0 = dt_now(), t;
    do {
        pass(u, which);
        n++;
        t = dt_now() - t0;
    } while (t < 0.3 || n < 2);
    return 1e3 * t / n;
}

static float *filled(size_t n) {
    float *p = malloc(sizeof(float) * (n ? n : 1));
    for (size_t i = 0; i < n; i++) p[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
    return p;
}

static void run_shape(const char *name, const dt_conv_shape *s) {
    int B = s->B, cb = (s->IC + 15) / 16 * 16, ob = (s->OC + 15) / 16 * 16;  // (blocked: channels padded)
    size_t ni = (size_t)B * (s->src_blocked ? cb : s->IC) * s->H * s->W, nw = (size_t)s->OC * s->IC * 25,
           no = (size_t)B * (s->dst_blocked ? ob : s->OC) * s->H * s->W, sv, sc, psv, psc;
    dt_conv_size(s, &sv, &sc);
    dt_conv_portable_size(s, &psv, &psc);
    bufs u = {s, filled(ni), filled(nw), filled(s->OC), filled(no), filled(no), filled(ni), filled(nw),
              filled(s->OC), filled(sv > psv ? sv : psv), filled(sc > psc ? sc : psc), 0};
    const char *impls;
    static const char *names[] = {"oneDNN", "portable", "routed"}, *paths[] = {"oneDNN", "portable", "mixed"};
    dt_conv_set_routing(1);
    int path = dt_conv_path(s, NULL);
    dt_conv_set_routing(0);
    dt_conv_path(s, &impls);
    for (u.portable = 0; u.portable < 3; u.portable++)
        printf("%-18s %-8s %-4s %9.2f %9.2f %9.2f  %s%s\n", name, names[u.portable],
               s->src_blocked ? (s->dst_blocked ? "b->b" : "b->p") : (s->dst_blocked ? "p->b" : "p->p"),
               ms_per_call(&u, 0), ms_per_call(&u, 1), ms_per_call(&u, 2), u.portable == 2 ? paths[path] : "",
               u.portable ? "" : impls);
    free(u.x), free(u.w), free(u.b), free(u.y), free(u.dy), free(u.dx), free(u.dw), free(u.db);
    free(u.save), free(u.scratch);
}

int main(int argc, char **argv) {
    int threads = 1, B = 64;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--batch")) B = atoi(argv[i + 1]);
    }
    dt_set_threads(threads);
    dt_conv_set_routing(0);
    printf("%d thread(s), batch %d, fp32, ms a call\n", threads, B);
    printf("%-18s %-8s %-4s %9s %9s %9s  %s\n", "shape", "path", "lay", "forward", "bwd data", "bwd wei",
           "oneDNN's impls");
    printf("(lay: input->output, p plain NCHW, b blocked nChw16c; bwd data 0: not run, the first layer needs none)\n");
    for (int T = 1; T <= 4; T *= 2)
        for (int first = 1; first >= 0; first--) {
            // the layouts the model picks (model.c's plan_layouts)
            dt_conv_shape c1 = {B, 1, 28, 28, 32 / T, 5, 1, 2, 0, 0, 0, 1, 0, 0},
                          c2 = {B, 32 / T, 14, 14, 64, 5, 1, 2, 0, 0, 0, 0, 0, 0};
            int s1, d1, s2, d2;
            dt_conv_prefers_blocked(&c1, &s1, &d1);
            dt_conv_prefers_blocked(&c2, &s2, &d2);
            c1.dst_blocked = c2.src_blocked = d1 && s2;
            c2.dst_blocked = d2;
            char name[32];
            snprintf(name, sizeof name, "conv%d%s (T=%d)", first ? 1 : 2, T > 1 ? " shard" : "", T);
            run_shape(name, first ? &c1 : &c2);
        }
    return 0;
}
