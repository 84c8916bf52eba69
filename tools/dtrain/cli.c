/* Helpers shared by the subcommands. */
#include "cli.h"
#include "dtrain/config.h"

#include "dtrain/core.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

int cli_from_to(int argc, char **argv, const char *help, const char *in_name, const char *out_name, const char **from,
                const char **in, const char **out) {
    *from = *in = *out = NULL;
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i];
        if (!strcmp(s, "-h") || !strcmp(s, "--help")) {
            fputs(help, stdout);
            return 0;
        } else if (!strcmp(s, "--from")) {
            if (i + 2 >= argc) return cli_error("--from needs FORMAT and %s", in_name), EXIT_USAGE;
            *from = argv[++i];
            *in = argv[++i];
        } else if (!strcmp(s, "--to")) {
            if (i + 1 >= argc) return cli_error("--to needs %s", out_name), EXIT_USAGE;
            *out = argv[++i];
        } else {
            return cli_error("unexpected argument '%s' (see 'dtrain %s --help')", s, argv[0]), EXIT_USAGE;
        }
    }
    if (!*from || !*out)
        return cli_error("need --from FORMAT %s and --to %s (see 'dtrain %s --help')", in_name, out_name, argv[0]),
               EXIT_USAGE;
    return -1;
}

// A decimal number (dt_decimal_scan: no hex, inf or nan) and its unit.
static int number_unit(const char *s, double *x, const char **unit) {
    char *end;
    if (dt_decimal_scan(s, unit, NULL)) return -1;
    *x = strtod(s, &end);
    return end == *unit && isfinite(*x) ? 0 : -1;
}

// "100gbit" -> bytes per second
static int parse_rate(const char *v, size_t n, double *out) {
    char s[64];
    const char *u;
    double x;
    if (n == 0 || n >= sizeof s) return -1;
    memcpy(s, v, n);
    s[n] = 0;
    if (number_unit(s, &x, &u)) return -1;
    double m = !strcmp(u, "gbit") ? 1e9 : !strcmp(u, "mbit") ? 1e6 : !strcmp(u, "kbit") ? 1e3 : !strcmp(u, "bit") ? 1 : -1;
    if (m < 0 || !(x > 0)) return -1;
    *out = x * m / 8;
    return 0;
}

// "50us" -> seconds
static int parse_time(const char *v, double *out) {
    const char *u;
    double x;
    if (number_unit(v, &x, &u)) return -1;
    double m = !strcmp(u, "us") ? 1e-6 : !strcmp(u, "ms") ? 1e-3 : !strcmp(u, "s") ? 1 : !strcmp(u, "ns") ? 1e-9 : -1;
    if (m < 0 || !(x >= 0)) return -1;
    *out = x * m;
    return 0;
}

int cli_parse_link(const char *flag, const char *link, double *bytes_per_s, double *latency_s) {
    const char *comma = strchr(link, ',');
    if (comma && !parse_rate(link, (size_t)(comma - link), bytes_per_s) && !parse_time(comma + 1, latency_s)) return 0;
    cli_error("%s: expected BW,LATENCY such as 100gbit,5us or 1gbit,0.1ms (rates in gbit, mbit, kbit or bit "
              "a second; latencies in s, ms, us or ns), got '%s'", flag, link);
    return -1;
}

