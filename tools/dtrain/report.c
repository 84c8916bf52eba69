/* dtrain report: a run directory -> one self-contained HTML file. */
#include "cli.h"
#include "dtrain/dtrain.h"

#include <stdio.h>
#include <string.h>

static const char help[] =
    "usage: dtrain report RUN_DIR [-o FILE]\n"
    "\n"
    "Writes an HTML report of the training run in RUN_DIR (a directory written\n"
    "by 'dtrain train'), from its metrics logs (metrics/rank-*.jsonl) and\n"
    "summary.json: loss and accuracy curves, throughput over time, each\n"
    "rank's time per step by phase, and a straggler view (each rank's step\n"
    "time against the median, flagged ranks); for 'dtrain federate', each\n"
    "client's samples by class (clients.json). One file, charts as inline SVG,\n"
    "nothing loaded from the network: it opens in any browser.\n"
    "\n"
    "options:\n"
    "  -o, --output FILE  where to write (default RUN_DIR/report.html)\n"
    "  -h, --help         this help\n";

int cmd_report(int argc, char **argv) {
    const char *dir = NULL, *out = NULL;
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i];
        if (!strcmp(s, "-h") || !strcmp(s, "--help")) {
            fputs(help, stdout);
            return 0;
        } else if (!strcmp(s, "-o") || !strcmp(s, "--output")) {
            if (i + 1 >= argc || !*argv[i + 1]) return cli_error("%s needs a file", s), EXIT_USAGE;
            out = argv[++i];
        } else if (s[0] == '-' && s[1]) {
            return cli_error("unknown option '%s' (see 'dtrain report --help')", s), EXIT_USAGE;
        } else if (!dir) {
            dir = s;
        } else {
            return cli_error("unexpected argument '%s' (one RUN_DIR only)", s), EXIT_USAGE;
        }
    }
    if (!dir) return cli_error("missing RUN_DIR (see 'dtrain report --help')"), EXIT_USAGE;
    char def[4096];
    if (!out) {
        snprintf(def, sizeof def, "%s/report.html", dir);
        out = def;
    }
    if (dt_report_html(dir, out) != DT_OK) return cli_error("%s", dt_last_error()), EXIT_RUNTIME;
    printf("report: %s\n", out);
    return 0;
}
