/* dtrain run: start N local ranks of a program linked with libdtrain. */
#include "cli.h"
#include "dtrain/launch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void run_usage(FILE *f) {
    fprintf(f,
            "usage: dtrain run -n N [options] -- PROGRAM [ARGS]...\n\n"
            "Starts N ranks of PROGRAM on this machine; they find each other through\n"
            "shared memory (dt_comm_init_env). The exit status is the first failing\n"
            "rank's; Ctrl-C stops all ranks.\n\n"
            "options:\n"
            "  -n, --nranks N     number of ranks (required, 1 to 4096)\n"
            "  --timeout SEC      timeout of every collective wait (DTRAIN_COMM_TIMEOUT,\n"
            "                     0.001 to 1e9)\n"
            "  --check            compare collective arguments across ranks (DTRAIN_COMM_CHECK)\n"
            "  --grace SEC        after a rank fails, seconds before the others are stopped\n"
            "                     (default 3, at most 1e6)\n"
            "  --spares K         also start K idle spares (DTRAIN_SPARE set): a rank killed\n"
            "                     by a signal or hung gets one as its replacement, which\n"
            "                     joins the group with dt_comm_rejoin (0 to 4096; default 0)\n"
            "Numbers are decimal (no hex, nan or inf).\n"
            "  -v, --verbose      log rank starts and exits\n");
}

int cmd_run(int argc, char **argv) {
    dt_launch_params p = dt_launch_default_params();
    p.nranks = 0;
    int i = 1;
    for (; i < argc; i++) {
        const char *a = argv[i];
        double v;
        if (!strcmp(a, "--")) {
            i++;
            break;
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            run_usage(stdout);
            return 0;
        } else if (!strcmp(a, "-n") || !strcmp(a, "--nranks")) {
            if (parse_number(a, i + 1 < argc ? argv[++i] : NULL, 1, 4096, 1, &v)) return EXIT_USAGE;
            p.nranks = (int)v;
        } else if (!strcmp(a, "--timeout")) {
            if (parse_number(a, i + 1 < argc ? argv[++i] : NULL, 0.001, 1e9, 0, &v)) return EXIT_USAGE;
            setenv("DTRAIN_COMM_TIMEOUT", argv[i], 1);
        } else if (!strcmp(a, "--grace")) {
            if (parse_number(a, i + 1 < argc ? argv[++i] : NULL, 0, 1e6, 0, &v)) return EXIT_USAGE;
            p.grace = v;
        } else if (!strcmp(a, "--spares")) {
            if (parse_number(a, i + 1 < argc ? argv[++i] : NULL, 0, 4096, 1, &v)) return EXIT_USAGE;
            p.nspares = (int)v;
        } else if (!strcmp(a, "--check")) {
            setenv("DTRAIN_COMM_CHECK", "1", 1);
        } else if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) {
            p.verbose = 1;
        } else if (a[0] == '-') {
            cli_error("run: unknown option '%s' (see 'dtrain run --help')", a);
            return EXIT_USAGE;
        } else {
            break; /* the program starts here (no "--") */
        }
    }
    if (p.nranks < 1) {
        cli_error("run: -n N is required (see 'dtrain run --help')");
        return EXIT_USAGE;
    }
    if (i >= argc) {
        cli_error("run: no program given (dtrain run -n N -- PROGRAM [ARGS])");
        return EXIT_USAGE;
    }
    dt_launch_result r;
    if (dt_launch(&p, argv + i, &r) != DT_OK) {
        cli_error("%s", dt_last_error());
        return EXIT_RUNTIME;
    }
    return r.exit_code;
}
