/* dtrun: `dtrain run` on its own (the same cmd_run.c), so that the
 * communication tests can start ranks without the rest of the CLI. */
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

int main(int argc, char **argv) { return cmd_run(argc, argv); }
