#include "testlib.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

int tl_passed, tl_failed;

void tl_check(int ok, const char *file, int line, const char *fmt, ...) {
    if (ok) {
        tl_passed++;
        return;
    }
    tl_failed++;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "FAIL %s:%d: ", file, line);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

double tl_rel(double a, double b, double floor) {
    double m = fmax(fmax(fabs(a), fabs(b)), floor);
    if (isnan(a) || isnan(b)) return INFINITY;
    return fabs(a - b) / m;
}

double tl_max_rel(const float *a, const float *b, size_t n, double floor) {
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double r = tl_rel(a[i], b[i], floor);
        if (r > worst) worst = r;
    }
    return worst;
}

int tl_run(const char *cmd, char *out, size_t n) {
    char full[8192];
    snprintf(full, sizeof full, "%s 2>&1", cmd);
    FILE *p = popen(full, "r");
    if (!p) return -1;
    size_t len = 0;
    if (out && n) {
        size_t r;
        while (len + 1 < n && (r = fread(out + len, 1, n - 1 - len, p)) > 0) len += r;
        out[len] = 0;
    }
    char sink[4096];
    while (fread(sink, 1, sizeof sink, p) > 0) {}
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

const char *tl_dtrain(void) {
    const char *b = getenv("DTRAIN_BIN");
    return b ? b : "build/dtrain";
}

int tl_finish(void) {
    printf("%d passed, %d failed\n", tl_passed, tl_failed);
    return tl_failed ? 1 : 0;
}
