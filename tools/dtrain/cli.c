/* Helpers shared by the subcommands. */
#include "cli.h"
#include "dtrain/core.h"

#include <stdarg.h>
#include <stdio.h>

void cli_error(const char *fmt, ...) {
    // Messages quote file names, tensor names and lines from files: escaped,
    // so that no control sequence from a file reaches the terminal.
    char msg[4096], esc[4 * sizeof msg];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    size_t len = n < 0 ? 0 : (size_t)n < sizeof msg ? (size_t)n : sizeof msg - 1;
    fprintf(stderr, "dtrain: error: %s\n", dt_escape_text(esc, sizeof esc, msg, len));
}
