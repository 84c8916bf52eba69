/* Helpers shared by the subcommands. */
#include "cli.h"

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
