/* dtrain make-clicks: a synthetic click log from a planted model. */
#include "cli.h"
#include "dtrain/dtrain.h"
#include "dtrain/recsys.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char help[] =
    "usage: dtrain make-clicks --train FILE [--test FILE] [options]\n"
    "\n"
    "Writes click logs (docs/recommender.md) drawn from one planted model:\n"
    "each record's ids follow a power law over its table's rows, its dense\n"
    "features are counts, and its label is drawn from the planted model's\n"
    "click probability, so the planted model's own AUC (printed) is the best\n"
    "any model can reach on the test log. The same options and seed write the\n"
    "same bytes.\n"
    "\n"
    "  --tables N,N,...  rows of each table (default 1000,500,200,100)\n"
    "  --dense N         dense features (default 4)\n"
    "  --records N       training records (default 50000)\n"
    "  --test-records N  test records (default 10000)\n"
    "  --zipf S          the ids' power law (default 1.1)\n"
    "  --rank K          the planted embeddings' width (default 4)\n"
    "  --scale X         the planted weights' spread (default 1)\n"
    "  --seed N          (default 1)\n"
    "\n"
    "example:\n"
    "  dtrain make-clicks --train clicks.bin --test clicks-test.bin --tables 100000,5000,300\n";

static int tables(const char *v, dt_clicks_gen *g) {
    int n = 0;
    for (const char *p = v; p && *p && n < DT_DLRM_MAX_TABLES;) {
        char *end;
        long long x = strtoll(p, &end, 10);
        if (end == p || x < 1 || x > (1ll << 32)) return -1;
        g->rows[n++] = x;
        p = *end == ',' ? end + 1 : *end ? NULL : end;
        if (!p) return -1;
    }
    g->ntables = n;
    return n > 0 ? 0 : -1;
}

int cmd_make_clicks(int argc, char **argv) {
    dt_clicks_gen g = dt_clicks_gen_default();
    const char *train = NULL, *test = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        double x;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) return fputs(help, stdout), 0;
        if (!v) return cli_error("%s: a value is missing (see dtrain make-clicks --help)", a), EXIT_USAGE;
        i++;
        if (!strcmp(a, "--train")) train = v;
        else if (!strcmp(a, "--test")) test = v;
        else if (!strcmp(a, "--tables")) {
            if (tables(v, &g) != 0)
                return cli_error("--tables '%s': expected 1 to %d row counts, as 1000,500 (each 1 to 2^32)", v,
                                 DT_DLRM_MAX_TABLES), EXIT_USAGE;
        } else if (!strcmp(a, "--dense")) {
            if (parse_number(a, v, 0, 4096, 1, &x)) return EXIT_USAGE;
            g.ndense = (int)x;
        } else if (!strcmp(a, "--records") || !strcmp(a, "--test-records")) {
            if (parse_number(a, v, a[2] == 'r' ? 1 : 0, 1e10, 1, &x)) return EXIT_USAGE;
            *(a[2] == 'r' ? &g.train : &g.test) = (int64_t)x;
        } else if (!strcmp(a, "--zipf")) {
            if (parse_number(a, v, 0, 4, 0, &x)) return EXIT_USAGE;
            g.zipf = x;
        } else if (!strcmp(a, "--rank")) {
            if (parse_number(a, v, 0, 64, 1, &x)) return EXIT_USAGE;
            g.rank = (int)x;
        } else if (!strcmp(a, "--scale")) {
            if (parse_number(a, v, 0, 100, 0, &x)) return EXIT_USAGE;
            g.scale = (float)x;
        } else if (!strcmp(a, "--seed")) {
            if (parse_number(a, v, 0, 9e15, 1, &x)) return EXIT_USAGE;
            g.seed = (uint64_t)x;
        } else {
            return cli_error("unknown option '%s' (see dtrain make-clicks --help)", a), EXIT_USAGE;
        }
    }
    if (!train) return cli_error("--train FILE is needed (see dtrain make-clicks --help)"), EXIT_USAGE;
    double auc;
    if (dt_clicks_generate(&g, train, test, &auc) != DT_OK) return cli_error("%s", dt_last_error()), EXIT_RUNTIME;
    printf("%s: %lld records", train, (long long)g.train);
    if (test) printf("; %s: %lld records", test, (long long)g.test);
    printf("; %d tables, %d dense features; the planted model's AUC on the %s log: %.4f\n", g.ntables, g.ndense,
           test ? "test" : "training", auc);
    return 0;
}
