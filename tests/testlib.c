#include "testlib.h"
#include "dtrain/ckpt.h"

#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

int tl_passed, tl_failed;
// The first failures' first lines, said again by tl_finish: a long test's
// output is often read from its end.
static char tl_said[8][240];

void tl_check(int ok, const char *file, int line, const char *fmt, ...) {
    va_list ap;
    if (ok) {
        tl_passed++;
        if (getenv("TL_VERBOSE")) {  // each passed check's figures too (tests/gpu/run.sh's op table)
            printf("ok %s:%d: ", file, line);
            va_start(ap, fmt);
            vprintf(fmt, ap);
            va_end(ap);
            putchar('\n');
        }
        return;
    }
    va_start(ap, fmt);
    fprintf(stderr, "FAIL %s:%d: ", file, line);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    if (tl_failed < 8) {
        char *o = tl_said[tl_failed];
        int k = snprintf(o, sizeof tl_said[0], "FAIL %s:%d: ", file, line);
        va_start(ap, fmt);
        if (k > 0 && (size_t)k < sizeof tl_said[0]) vsnprintf(o + k, sizeof tl_said[0] - (size_t)k, fmt, ap);
        va_end(ap);
        o[strcspn(o, "\n")] = 0;
    }
    tl_failed++;
}

double tl_rel(double a, double b, double floor) {
    if (!isfinite(a) || !isfinite(b)) return a == b ? 0 : INFINITY;  // the same infinity agrees; NaN never
    double m = fmax(fmax(fabs(a), fabs(b)), floor);
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

double tl_normwise(const float *a, const float *b, size_t n) {
    double big = 1e-30, diff = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - b[i]);
        if (isnan(e)) return INFINITY;
        big = fmax(big, fabs(a[i]));
        diff = fmax(diff, e);
    }
    return diff / big;
}

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define TL_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || __has_feature(memory_sanitizer)
#define TL_SANITIZED 1
#endif
#endif

static struct rlimit tl_as_saved;
static int tl_as_capped;

int tl_cap_memory(size_t extra) {
#ifdef TL_SANITIZED
    (void)extra;
    return 0;
#else
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long long pages = 0;
    int ok = f && fscanf(f, "%llu", &pages) == 1;
    if (f) fclose(f);
    if (!ok || tl_as_capped || getrlimit(RLIMIT_AS, &tl_as_saved) != 0) return 0;
    struct rlimit cap = tl_as_saved;
    rlim_t want = (rlim_t)(pages * (unsigned long long)sysconf(_SC_PAGESIZE) + extra);
    if (cap.rlim_max != RLIM_INFINITY && want > cap.rlim_max) return 0;
    cap.rlim_cur = want;
    if (setrlimit(RLIMIT_AS, &cap) != 0) return 0;
    tl_as_capped = 1;
    return 1;
#endif
}

void tl_uncap_memory(void) {
    if (tl_as_capped && setrlimit(RLIMIT_AS, &tl_as_saved) == 0) tl_as_capped = 0;
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

int tl_run_released(const char *cmd, const char *log, const char *text, const char *release, double wait_s,
                    double end_s, int *seen) {
    pid_t pid = fork();
    if (pid == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    *seen = 0;
    for (int i = 0; i < (int)(wait_s * 20) && !*seen; i++) {
        usleep(50000);
        char *t = tl_read_file(log, NULL);
        *seen = t && strstr(t, text);
        free(t);
    }
    usleep(300000);
    unlink(release);
    int status = 0;
    for (int i = 0; i < (int)(end_s * 20) && waitpid(pid, &status, WNOHANG) == 0; i++) usleep(50000);
    if (waitpid(pid, &status, WNOHANG) == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
    }
    return status;
}

const char *tl_dtrain(void) {
    const char *b = getenv("DTRAIN_BIN");
    return b ? b : "build/dtrain";
}

static int tl_skipped;

void tl_skip(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("SKIPPED: ");
    vprintf(fmt, ap);
    putchar('\n');
    va_end(ap);
    tl_skipped = 1;
}

static void **tl_bufs;
static int tl_nbufs;

const void *tl_st_data(const dt_st_file *f, const dt_st_tensor *t) {
    void *p = malloc(t->nbytes + 1), **l = realloc(tl_bufs, sizeof *l * (size_t)(tl_nbufs + 1));
    if (l) tl_bufs = l;
    dt_status st = p && l ? dt_st_read(f, t, 0, t->nbytes / dt_dtype_size(t->dtype), t->dtype, p) : DT_ERR_NOMEM;
    if (st != DT_OK) {
        CHECK(0, "reading tensor '%s': %s", t->name, dt_last_error());
        free(p);
        return NULL;
    }
    return tl_bufs[tl_nbufs++] = p;
}

int tl_finish(void) {
    for (int i = 0; i < tl_nbufs; i++) free(tl_bufs[i]);
    free(tl_bufs);
    tl_bufs = NULL, tl_nbufs = 0;
    fflush(stdout);
    for (int i = 0; i < tl_failed && i < 8; i++) fprintf(stderr, "%s\n", tl_said[i]);
    if (tl_failed > 8) fprintf(stderr, "(and %d more failures above)\n", tl_failed - 8);
    printf("%d passed, %d failed%s\n", tl_passed, tl_failed, tl_skipped ? ", skipped" : "");
    return tl_failed ? 1 : tl_skipped ? 77 : 0;
}

char *tl_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    // Read to the end rather than trusting the size: /proc files say 0.
    size_t cap = 4096, got = 0, r;
    char *b = malloc(cap + 1);
    while (b && (r = fread(b + got, 1, cap - got, f)) > 0) {
        got += r;
        if (got == cap) {
            char *nb = realloc(b, 2 * cap + 1);
            if (!nb) free(b);
            b = nb;
            cap *= 2;
        }
    }
    fclose(f);
    if (b) b[got] = 0;
    if (len) *len = got;
    return b;
}

int tl_same_file(const char *a, const char *b) {
    size_t la, lb;
    char *x = tl_read_file(a, &la), *y = tl_read_file(b, &lb);
    int same = x && y && la == lb && !memcmp(x, y, la);
    free(x);
    free(y);
    return same;
}

const char *tl_path(const char *dir, const char *name) {
    static char buf[4][1024];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", dir, name);
    return buf[k];
}

int tl_count(const char *path, const char *what) {
    char *buf = tl_read_file(path, NULL);
    int k = 0;
    for (char *s = buf; s && (s = strstr(s, what)); s++) k++;
    free(buf);
    return k;
}

int tl_rank_pid(int launcher, int rank) {
    char path[128], want[32];
    snprintf(path, sizeof path, "/proc/%d/task/%d/children", launcher, launcher);
    snprintf(want, sizeof want, "DTRAIN_RANK=%d", rank);
    char *kids = tl_read_file(path, NULL);
    int found = -1;
    for (char *s = kids ? strtok(kids, " \n") : NULL; s && found < 0; s = strtok(NULL, " \n")) {
        size_t len;
        snprintf(path, sizeof path, "/proc/%d/environ", atoi(s));
        char *env = tl_read_file(path, &len);
        for (size_t i = 0; env && i < len; i += strlen(env + i) + 1)
            if (!strcmp(env + i, want)) found = atoi(s);
        free(env);
    }
    free(kids);
    return found;
}

void tl_cleanup(const char *dir) {
    if (tl_failed || getenv("KEEP")) {
        fprintf(stderr, "files kept in %s\n", dir);
        return;
    }
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

static void write_idx(const char *path, int ndim, const int *dims, const uint8_t *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return;
    uint8_t h[4] = {0, 0, 8, (uint8_t)ndim};
    fwrite(h, 1, 4, f);
    for (int i = 0; i < ndim; i++) {
        uint8_t d[4] = {(uint8_t)(dims[i] >> 24), (uint8_t)(dims[i] >> 16), (uint8_t)(dims[i] >> 8), (uint8_t)dims[i]};
        fwrite(d, 1, 4, f);
    }
    fwrite(data, 1, n, f);
    fclose(f);
}

void tl_make_images(const char *dir, const char *prefix, int n, unsigned long long seed) {
    uint8_t *img = malloc((size_t)n * 784), *lab = malloc(n);
    dt_rng r;
    dt_rng_seed(&r, seed);
    for (int i = 0; i < n; i++) {
        lab[i] = (uint8_t)dt_rng_below(&r, 10);
        for (int p = 0; p < 784; p++) img[(size_t)i * 784 + p] = (uint8_t)dt_rng_below(&r, 96);
        int y0 = 2 + 2 * lab[i], x0 = 4 + lab[i];
        for (int y = y0; y < y0 + 6; y++)
            for (int x = x0; x < x0 + 6; x++) img[(size_t)i * 784 + y * 28 + x] = 255;
    }
    char path[512];
    int di[3] = {n, 28, 28}, dl[1] = {n};
    snprintf(path, sizeof path, "%s/%s-images-idx3-ubyte.gz", dir, prefix);
    write_idx(path, 3, di, img, (size_t)n * 784);
    snprintf(path, sizeof path, "%s/%s-labels-idx1-ubyte.gz", dir, prefix);
    write_idx(path, 1, dl, lab, n);
    free(img);
    free(lab);
}

double tl_json_number(const char *path, const char *key) {
    char pat[128];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    char *text = tl_read_file(path, NULL);
    const char *v = text ? strstr(text, pat) : NULL;
    double x = v ? atof(v + strlen(pat)) : -1;
    free(text);
    return x;
}

double tl_weights_diff(const char *a, const char *b, int *bitwise) {
    dt_st_file *fa = NULL, *fb = NULL;
    double worst = -1;
    *bitwise = 0;
    if (dt_st_open(&fa, a) != DT_OK || dt_st_open(&fb, b) != DT_OK) {
        fprintf(stderr, "%s\n", dt_last_error());
        goto out;
    }
    worst = 0;
    *bitwise = 1;
    int n = 0;
    for (int i = 0; i < dt_st_count(fa); i++) {
        const dt_st_tensor *ta = dt_st_get(fa, i), *tb = dt_st_find(fb, ta->name);
        if (ta->dtype != DT_F32) continue;
        n++;
        if (!tb || tb->nbytes != ta->nbytes) {
            worst = -1;
            goto out;
        }
        const float *x = tl_st_data(fa, ta), *y = tl_st_data(fb, tb);
        if (!x || !y) {
            worst = -1;
            goto out;
        }
        if (memcmp(x, y, ta->nbytes)) *bitwise = 0;
        size_t k = ta->nbytes / 4;
        double mx = 1e-3;
        for (size_t j = 0; j < k; j++) {
            if (!isfinite(x[j]) || !isfinite(y[j])) {  // broken weights never agree, not even with themselves
                fprintf(stderr, "%s: %s[%zu] = %g, %s: %g\n", a, ta->name, j, x[j], b, y[j]);
                worst = NAN;
                *bitwise = 0;
                goto out;
            }
            mx = fmax(mx, fabs(x[j]));
        }
        for (size_t j = 0; j < k; j++) {
            double d = fabs((double)x[j] - y[j]) / mx;
            if (d > worst) worst = d;
        }
    }
    if (n == 0) worst = -1;
out:
    dt_st_close(fa);
    dt_st_close(fb);
    return worst;
}

const char tl_cfg_cnn[] =
    "[model]\nlayer = conv2d out=6 kernel=5 pad=2\nlayer = relu\nlayer = maxpool kernel=2\n"
    "layer = conv2d out=8 kernel=3 stride=2\nlayer = relu\nlayer = flatten\nlayer = linear out=32\n"
    "layer = relu\nlayer = dropout p=0.3\nlayer = linear out=10\n[optim]\nname = adamw\nlr = 0.002\n"
    "weight_decay = 0.01\n";

int tl_train(const char *dir, const char *name, const char *text, int workers, const char *extra, char *out, size_t n) {
    char path[512], cmd[2048];
    snprintf(path, sizeof path, "%s/%s.ini", dir, name);
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    fputs(text, f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "%s train %s --workers %d --quiet --run-dir %s/%s %s", tl_dtrain(), path, workers, dir,
             name, extra ? extra : "");
    int rc = tl_run(cmd, out, n);
    if (rc != 0) fprintf(stderr, "%s\n-> exit %d\n%s\n", cmd, rc, out);
    return rc;
}

double tl_runs_diff(const char *dir, const char *a, const char *b, int *bitwise) {
    char pa[4500], pb[4500];
    snprintf(pa, sizeof pa, "%s/%s/model.safetensors", dir, a);
    snprintf(pb, sizeof pb, "%s/%s/model.safetensors", dir, b);
    return tl_weights_diff(pa, pb, bitwise);
}
