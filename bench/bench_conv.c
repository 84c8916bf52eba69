/* The convolution's two paths on configs/fashion-cnn.ini's shapes (batch
 * 64, whole and as tensor-parallel shards at T = 2 and 4): oneDNN's
 * primitives (routing off, so a shape on oneDNN's reference kernel runs
 * there) against the portable path (im2col + GEMM), each pass timed on its
 * own, in milliseconds a call, fp32, in the layouts the model gives them:
 * the first convolution's output and the second's input and output
 * blocked (nChw16c, as oneDNN's forward prefers them on AVX-512), and no
 * input gradient for the first (the model's input needs none).
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
    const char *name;
    int IC, H, OC, first;
} shape;

static const shape SHAPES[] = {
    {"conv1 (T=1)", 1, 28, 32, 1}, {"conv2 (T=1)", 32, 14, 64, 0}, {"conv1 shard (T=2)", 1, 28, 16, 1},
    {"conv2 shard (T=2)", 16, 14, 64, 0}, {"conv1 shard (T=4)", 1, 28, 8, 1}, {"conv2 shard (T=4)", 8, 14, 64, 0},
};

typedef struct {
    const dt_conv_shape *s;
    float *x, *w, *b, *y, *dy, *dx, *dw, *db, *save, *scratch;
    int portable;
} bufs;

static void pass(const bufs *u, int which) {
    const dt_conv_shape *s = u->s;
    if (which == 0) {
        if (u->portable) dt_conv_portable_forward(u->y, u->save, u->scratch, u->x, u->w, u->b, s);
        else dt_conv_forward(u->y, u->save, u->scratch, u->x, u->w, u->b, s);
        return;
    }
    float *dx = which == 1 ? u->dx : NULL, *dw = which == 2 ? u->dw : NULL, *db = which == 2 ? u->db : NULL;
    if (u->portable) dt_conv_portable_backward(dx, dw, db, u->scratch, u->y, u->dy, u->save, u->w, s, 1);
    else dt_conv_backward(dx, dw, db, u->scratch, u->y, u->dy, u->save, u->w, s, 1);
}

static double ms_per_call(const bufs *u, int which) {
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

int main(int argc, char **argv) {
    int threads = 1, B = 64;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--batch")) B = atoi(argv[i + 1]);
    }
    dt_set_threads(threads);
    dt_conv_set_routing(0);
    printf("%d thread(s), batch %d, fp32, ms a call\n", threads, B);
    printf("%-18s %-8s %9s %9s %9s  %s\n", "shape", "path", "forward", "bwd data", "bwd wei", "oneDNN's impls");
    printf("(bwd data 0: not run, the model's first layer needs none)\n");
    for (size_t k = 0; k < sizeof SHAPES / sizeof *SHAPES; k++) {
        const shape *h = &SHAPES[k];
        dt_conv_shape s = {B, h->IC, h->H, h->H, h->OC, 5, 1, 2, !h->first, 1, 0, h->first, 0, 0};
        int cb = (h->IC + 15) / 16 * 16, ob = (h->OC + 15) / 16 * 16;  // (blocked: channels padded)
        size_t ni = (size_t)B * (h->first ? h->IC : cb) * h->H * h->H, nw = (size_t)h->OC * h->IC * 25,
               no = (size_t)B * ob * h->H * h->H, sv, sc, psv, psc;
        dt_conv_size(&s, &sv, &sc);
        dt_conv_portable_size(&s, &psv, &psc);
        bufs u = {&s, filled(ni), filled(nw), filled(h->OC), filled(no), filled(no), filled(ni), filled(nw),
                  filled(h->OC), filled(sv > psv ? sv : psv), filled(sc > psc ? sc : psc), 0};
        const char *impls;
        dt_conv_path(&s, &impls);
        for (u.portable = 0; u.portable < 2; u.portable++)
            printf("%-18s %-8s %9.2f %9.2f %9.2f  %s\n", h->name, u.portable ? "portable" : "oneDNN",
                   ms_per_call(&u, 0), ms_per_call(&u, 1), ms_per_call(&u, 2), u.portable ? "" : impls);
        free(u.x), free(u.w), free(u.b), free(u.y), free(u.dy), free(u.dx), free(u.dw), free(u.db);
        free(u.save), free(u.scratch);
    }
    return 0;
}
