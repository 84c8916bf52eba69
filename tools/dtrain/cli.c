/* Helpers shared by the subcommands. */
#include "cli.h"
#include "dtrain/config.h"

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

int cli_memory_limit(const char *v) {
    size_t bytes;
    if (!v || dt_mem_parse_size(v, &bytes) != DT_OK) {
        cli_error("--memory-limit needs a size such as 2G, 512M or 1073741824 (bytes; K, M, G, T are powers of "
                  "1024), got '%s'", v ? v : "");
        return -1;
    }
    char name[160];
    snprintf(name, sizeof name, "--memory-limit %s", v);
    dt_mem_set_limit(bytes, name);
    return 0;
}

int parse_number(const char *flag, const char *v, double lo, double hi, int whole, double *out) {
    if (dt_parse_number(flag, v, lo, hi, whole, out) == DT_OK) return 0;
    cli_error("%s", dt_last_error());
    return -1;
}
