/* Helpers shared by the subcommands. */
#include "cli.h"
#include "dtrain/config.h"

#include <stdarg.h>
#include <stdio.h>

void cli_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("dtrain: error: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

int parse_number(const char *flag, const char *v, double lo, double hi, int whole, double *out) {
    if (dt_parse_number(flag, v, lo, hi, whole, out) == DT_OK) return 0;
    cli_error("%s", dt_last_error());
    return -1;
}
