/* Status codes, per-thread error messages, logging, rng, threads, time,
 * aligned allocation and atomic file writes. */
#include "dtrain/core.h"
#include "core/rng_hd.h"
#include "version.h"
#include "core/s3.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

const char *dt_version(void) { return DT_VERSION_STRING; }

#ifdef DTRAIN_HAVE_ONEDNN
#define DT_F_ONEDNN "yes"
#else
#define DT_F_ONEDNN "no"
#endif
#ifdef DTRAIN_HAVE_HDF5
#define DT_F_HDF5 "yes"
#else
#define DT_F_HDF5 "no"
#endif
#ifdef DTRAIN_HAVE_MHD
#define DT_F_MHD "yes"
#else
#define DT_F_MHD "no"
#endif
#ifdef DTRAIN_HAVE_MPI
#define DT_F_MPI "yes"
#else
#define DT_F_MPI "no"
#endif
#ifdef DTRAIN_HAVE_CUDA
#define DT_F_CUDA "yes"
#else
#define DT_F_CUDA "no"
#endif
#ifdef DTRAIN_HAVE_S3
#define DT_F_S3 "yes"
#else
#define DT_F_S3 "no"
#endif
const char *dt_build_features(void) {
    return "oneDNN " DT_F_ONEDNN ", HDF5 " DT_F_HDF5 ", libmicrohttpd " DT_F_MHD ", MPI " DT_F_MPI ", CUDA " DT_F_CUDA ", S3 (libcurl) " DT_F_S3;
}

// ----------------------------------------------------------------------------
// status and errors

const char *dt_status_string(dt_status s) {
    switch (s) {
    case DT_OK: return "ok";
    case DT_ERR_ARG: return "invalid argument";
    case DT_ERR_IO: return "i/o error";
    case DT_ERR_FORMAT: return "bad file format";
    case DT_ERR_CONFIG: return "config error";
    case DT_ERR_NOMEM: return "out of memory";
    case DT_ERR_NUMERIC: return "numeric error";
    case DT_ERR_COMM: return "communication error";
    case DT_ERR_TIMEOUT: return "timeout";
    case DT_ERR_INTERNAL: return "internal error";
    }
    return "unknown status";
}

static _Thread_local char last_error[1024];

const char *dt_last_error(void) { return last_error; }

dt_status dt_error(dt_status s, const char *fmt, ...) {
    // Formatted into a local buffer first, so that callers may add context
    // to the previous message: dt_error(st, "step %d: %s", n, dt_last_error()).
    char msg[sizeof last_error];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    memcpy(last_error, msg, sizeof msg);
    return s;
}

size_t dt_dtype_size(dt_dtype t) {
    static const size_t sz[] = {4, 2, 2, 4, 8, 1};
    return (unsigned)t < sizeof sz / sizeof sz[0] ? sz[t] : 0;
}

const char *dt_dtype_name(dt_dtype t) {
    static const char *nm[] = {"F32", "F16", "BF16", "I32", "I64", "U8"};
    return (unsigned)t < sizeof nm / sizeof nm[0] ? nm[t] : "?";
}

// ----------------------------------------------------------------------------
// logging

static int log_level = -1;

dt_log_level dt_log_get_level(void) {
    if (log_level < 0) {
        const char *e = getenv("DTRAIN_LOG");
        log_level = DT_LOG_INFO;
        if (e) {
            if (!strcmp(e, "error")) log_level = DT_LOG_ERROR;
            else if (!strcmp(e, "warn")) log_level = DT_LOG_WARN;
            else if (!strcmp(e, "debug")) log_level = DT_LOG_DEBUG;
        }
    }
    return (dt_log_level)log_level;
}

void dt_log_set_level(dt_log_level level) { log_level = level; }

void dt_log(dt_log_level level, const char *fmt, ...) {
    if (level > dt_log_get_level()) return;
    static const char *tag[] = {"error", "warning", "info", "debug"};
    char msg[2048], esc[4 * sizeof msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    // Messages quote names and values from files: no control sequences.
    fprintf(stderr, "dtrain: %s: %s\n", tag[level], dt_escape_text(esc, sizeof esc, msg, strlen(msg)));
}

// ----------------------------------------------------------------------------
// rng: xoshiro256** seeded through splitmix64

void dt_rng_seed(dt_rng *r, uint64_t seed) { dt_xoshiro_seed(r->s, seed); }

uint64_t dt_rng_u64(dt_rng *r) { return dt_xoshiro_next(r->s); }

uint32_t dt_rng_below(dt_rng *r, uint32_t n) {
    // Lemire's multiply-shift with rejection: unbiased.
    uint64_t m = (uint64_t)(uint32_t)(dt_rng_u64(r) >> 32) * n;
    uint32_t lo = (uint32_t)m;
    if (lo < n) {
        uint32_t t = -n % n;
        while (lo < t) {
            m = (uint64_t)(uint32_t)(dt_rng_u64(r) >> 32) * n;
            lo = (uint32_t)m;
        }
    }
    return (uint32_t)(m >> 32);
}

float dt_rng_uniform(dt_rng *r) { return dt_xoshiro_uniform(r->s); }

float dt_rng_normal(dt_rng *r) {
    double u1 = ((dt_rng_u64(r) >> 11) + 1.0) * (1.0 / 9007199254740993.0);
    double u2 = (dt_rng_u64(r) >> 11) * (1.0 / 9007199254740992.0);
    return (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
}

void dt_rng_shuffle(dt_rng *r, uint32_t *idx, size_t n) {
    for (size_t i = n; i > 1; i--) {
        uint32_t j = dt_rng_below(r, (uint32_t)i);
        uint32_t t = idx[i - 1];
        idx[i - 1] = idx[j];
        idx[j] = t;
    }
}

// ----------------------------------------------------------------------------
// threads, time, memory

void dt_set_threads(int n) {
    if (n <= 0) n = omp_get_num_procs();
    omp_set_num_threads(n);
}

int dt_get_threads(void) { return omp_get_max_threads(); }

double dt_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double dt_median(double *v, int n) {
    if (n <= 0) return 0;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Large blocks are kept in transparent huge pages where the kernel allows
// them (THP "madvise" mode): a page fault then maps 2 MiB, not 4 KiB.
enum { HUGE_PAGE = 2 << 20 };

void *dt_alloc(size_t n) {
    void *p = NULL;
    size_t sz = (n + 63) & ~(size_t)63;
    if (sz == 0) sz = 64;
    if (posix_memalign(&p, 64, sz) != 0) {
        dt_error(DT_ERR_NOMEM, "out of memory allocating %zu bytes", n);
        return NULL;
    }
    uintptr_t a = ((uintptr_t)p + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE, b = ((uintptr_t)p + sz) / HUGE_PAGE * HUGE_PAGE;
    if (b >= a + 2 * HUGE_PAGE) madvise((void *)a, b - a, MADV_HUGEPAGE);
    dt_zero_pages(p, sz);  // a large block's pages stay untouched (and take no memory) until used
    return p;
}

// [a, b) of the block, widened to whole 4 KiB pages, without huge pages.
static void no_huge(char *base, size_t a, size_t b) {
    uintptr_t g = (uintptr_t)sysconf(_SC_PAGESIZE), x = ((uintptr_t)base + a) / g * g,
              y = ((uintptr_t)base + b + g - 1) / g * g;
    if (y > x) madvise((void *)x, y - x, MADV_NOHUGEPAGE);
}

void dt_pages_unused(void *base, size_t size, size_t count, const size_t *keep, int n) {
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        if (keep[2 * i] > at) no_huge(base, at * size, keep[2 * i] * size);
        at = keep[2 * i] + keep[2 * i + 1];
    }
    if (at < count) no_huge(base, at * size, count * size);
}

// Gives back the whole g-byte pages inside p[0, bytes) when they span at
// least min bytes (madvise MADV_DONTNEED: they read as zero and take no
// memory until touched again) and clears the edges; 0 where it did not.
static int drop_pages(void *p, size_t bytes, uintptr_t g, size_t min) {
    uintptr_t a = (uintptr_t)p, b = a + bytes, pa = (a + g - 1) / g * g, pb = b / g * g;
    if (pb <= pa || pb - pa < min || madvise((void *)pa, pb - pa, MADV_DONTNEED) != 0) return 0;
    memset(p, 0, pa - a);
    memset((void *)pb, 0, b - pb);
    return 1;
}

void dt_zero_pages(void *p, size_t bytes) {
    // The whole huge pages inside the range when there are any (a 4 KiB
    // page given back would split one, and its refill would fault 4 KiB at
    // a time), else the whole pages of 64 KiB or more; memset for the rest.
    if (!drop_pages(p, bytes, HUGE_PAGE, 1) && !drop_pages(p, bytes, (uintptr_t)sysconf(_SC_PAGESIZE), 64 * 1024))
        memset(p, 0, bytes);
}

void dt_give_pages(void *p, size_t bytes) {
    if (!drop_pages(p, bytes, (uintptr_t)sysconf(_SC_PAGESIZE), 1)) memset(p, 0, bytes);
}

void dt_take_pages(void *p, size_t bytes) {
#ifdef MADV_POPULATE_WRITE
    uintptr_t g = (uintptr_t)sysconf(_SC_PAGESIZE), a = (uintptr_t)p / g * g, b = ((uintptr_t)p + bytes + g - 1) / g * g;
    if (bytes) (void)madvise((void *)a, b - a, MADV_POPULATE_WRITE);
#else
    (void)p, (void)bytes;
#endif
}

static void (*_Atomic g_alive)(void);

void dt_set_alive_hook(void (*fn)(void)) { g_alive = fn; }

void dt_alive(void) {
    void (*fn)(void) = g_alive;
    if (fn) fn();
}

void dt_free(void *p) { free(p); }

dt_status dt_make_dirs(const char *path) {
    // Object storage has no directories: the bucket must be there.
    if (dt_s3_is_url(path)) return dt_s3_check_bucket(path);
    char buf[4096];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf)
        return dt_error(DT_ERR_ARG, "%s: path too long", path);
    for (char *p = buf + 1;; p++) {
        if (*p == '/' || !*p) {
            char ch = *p;
            *p = 0;
            if (mkdir(buf, 0755) != 0 && errno != EEXIST)
                return dt_error(DT_ERR_IO, "%s: cannot create directory: %s", buf, strerror(errno));
            if (!ch) break;
            *p = ch;
        }
    }
    return DT_OK;
}

// ----------------------------------------------------------------------------
// memory budget: MemAvailable, the memory cgroup, a limit

static size_t mem_limit;
static char mem_limit_name[128];

void dt_mem_set_limit(size_t bytes, const char *name) {
    mem_limit = bytes;
    snprintf(mem_limit_name, sizeof mem_limit_name, "%s", name ? name : "the memory limit");
}

// The number after `key` in a "key value" file (key NULL: the first word of
// the file). 0 when absent or not a number ("max": no limit).
static int read_field(const char *path, const char *key, uint64_t *v) {
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char line[256];
    int ok = 0;
    size_t kl = key ? strlen(key) : 0;
    while (!ok && fgets(line, sizeof line, f)) {
        if (key && (strncmp(line, key, kl) || (line[kl] != ' ' && line[kl] != ':'))) continue;
        char *p = line + kl + (key ? 1 : 0), *end;
        while (*p == ' ') p++;
        unsigned long long x = strtoull(p, &end, 10);
        ok = end != p;
        if (ok) *v = x;
        if (!key) break;
    }
    fclose(f);
    return ok;
}

// The directory of this process's memory cgroup (v1's memory hierarchy, or
// v2's unified one); 0 when it has none. *v1 says which.
static int own_cgroup(char *dir, size_t len, int *v1) {
    FILE *f = fopen("/proc/self/cgroup", "r");
    if (!f) return 0;
    char line[512], rel[512] = "";
    int found = 0;
    while (fgets(line, sizeof line, f)) {
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2) continue;
        *c2 = 0;
        c2[1 + strcspn(c2 + 1, "\n")] = 0;
        int is_v1 = strstr(c1 + 1, "memory") != NULL, is_v2 = c1 == line + 1 && line[0] == '0' && !c1[1];
        if (is_v1 || (is_v2 && !found)) {
            snprintf(rel, sizeof rel, "%s", c2 + 1);
            *v1 = is_v1;
            found = 1;
        }
    }
    fclose(f);
    if (!found) return 0;
    const char *root = *v1 ? "/sys/fs/cgroup/memory" : "/sys/fs/cgroup";
    snprintf(dir, len, "%s%s", root, strcmp(rel, "/") ? rel : "");
    // Inside a container's cgroup namespace the path may not exist from here:
    // then the root of the mount is this process's cgroup.
    struct stat sb;
    if (stat(dir, &sb) != 0) snprintf(dir, len, "%s", root);
    return 1;
}

// What the memory cgroup (v2 or v1) and its parents still allow, or
// SIZE_MAX; *src names the cgroup file of the tightest limit.
static size_t cgroup_room(const char **src) {
    static char where[1100];
    char dir[1024], path[1200];
    int v1 = 0;
    if (!own_cgroup(dir, sizeof dir, &v1)) return SIZE_MAX;
    const char *root = v1 ? "/sys/fs/cgroup/memory" : "/sys/fs/cgroup";
    const char *fmax = v1 ? "memory.limit_in_bytes" : "memory.max", *fcur = v1 ? "memory.usage_in_bytes" : "memory.current",
               *kcache = v1 ? "total_inactive_file" : "inactive_file";
    size_t best = SIZE_MAX;
    for (;;) {
        uint64_t lim, cur = 0, cache = 0;
        snprintf(path, sizeof path, "%s/%s", dir, fmax);
        if (read_field(path, NULL, &lim) && lim < ((uint64_t)1 << 62)) {
            snprintf(path, sizeof path, "%s/%s", dir, fcur);
            read_field(path, NULL, &cur);
            snprintf(path, sizeof path, "%s/memory.stat", dir);
            read_field(path, kcache, &cache);
            uint64_t used = cur > cache ? cur - cache : 0, room = lim > used ? lim - used : 0;
            if (room < best) {
                best = (size_t)room;
                snprintf(where, sizeof where, "the memory cgroup's %s/%s", dir, fmax);
                *src = where;
            }
        }
        char *slash = strrchr(dir, '/');
        if (strlen(dir) <= strlen(root) || !slash) break;
        *slash = 0;
    }
    return best;
}

size_t dt_mem_limit(const char **name) {
    if (name) *name = mem_limit_name;
    return mem_limit;
}

size_t dt_mem_machine(const char **source) {
    const char *src = NULL;
    size_t best = SIZE_MAX;
    uint64_t kb;
    if (read_field("/proc/meminfo", "MemAvailable", &kb)) {
        best = (size_t)kb * 1024;
        src = "MemAvailable in /proc/meminfo";
    }
    const char *csrc = NULL;
    size_t c = cgroup_room(&csrc);
    if (c < best) {
        best = c;
        src = csrc;
    }
    if (source) *source = src ? src : "no limit found";
    return best;
}

size_t dt_mem_available(const char **source) {
    size_t best = dt_mem_machine(source);
    if (mem_limit && mem_limit < best) {
        best = mem_limit;
        if (source) *source = mem_limit_name;
    }
    return best;
}

size_t dt_mem_resident(void) {
    uint64_t kb = 0;
    return read_field("/proc/self/status", "VmRSS", &kb) ? (size_t)kb * 1024 : 0;
}

// ---- the cap: --memory-limit enforced on a worker -------------------------

static char cap_dir[1100];

// Back in the parent group, and the group gone (at exit).
static void cap_leave(void) {
    if (!cap_dir[0]) return;
    char path[1200];
    snprintf(path, sizeof path, "%.*s/cgroup.procs", (int)(strrchr(cap_dir, '/') - cap_dir), cap_dir);
    FILE *f = fopen(path, "w");
    if (f) {
        fprintf(f, "%ld\n", (long)getpid());
        fclose(f);
    }
    rmdir(cap_dir);
    cap_dir[0] = 0;
}

// Removes the groups of dtrain processes that are gone (killed before their
// exit could): dtrain-PID directories under root with no live PID.
static void cap_sweep(const char *root) {
    DIR *d = opendir(root);
    if (!d) return;
    struct dirent *e;
    char path[1400];
    while ((e = readdir(d))) {
        long pid;
        char end;
        if (sscanf(e->d_name, "dtrain-%ld%c", &pid, &end) != 1 || pid <= 0) continue;
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue;
        snprintf(path, sizeof path, "%s/%s", root, e->d_name);
        rmdir(path);  // fails, harmlessly, while a process is still in it
    }
    closedir(d);
}

// Writes text to dir/name; 0 on success.
static int put(const char *dir, const char *name, const char *text) {
    char path[1400];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    int bad = fputs(text, f) < 0;
    return fclose(f) != 0 || bad ? -1 : 0;
}

// The number after `key` in dir/name (a "key value" line), or -1.
static long long cg_value(const char *dir, const char *name, const char *key) {
    char path[1400], line[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "r");
    long long v = -1;
    size_t kl = key ? strlen(key) : 0;
    while (f && fgets(line, sizeof line, f))
        if (!key) v = atoll(line);
        else if (!strncmp(line, key, kl) && line[kl] == ' ') v = atoll(line + kl + 1);
    if (f) fclose(f);
    return v;
}

// This process's start in microseconds of the monotonic clock, the one the
// kernel's log stamps its records with (/proc/self/stat's start is on the
// boot clock, which also counts suspended time); 0 where unknown.
static unsigned long long own_start_us(void) {
    char buf[1024];
    FILE *f = fopen("/proc/self/stat", "r");
    size_t k = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f) fclose(f);
    buf[k] = 0;
    char *p = strrchr(buf, ')');  // (the name may hold spaces)
    unsigned long long ticks = 0;
    for (int field = 2; p && *p && field < 22; field++) p = strchr(p + 1, ' ');
    if (!p || sscanf(p, " %llu", &ticks) != 1) return 0;
    struct timespec boot, mono;
    clock_gettime(CLOCK_BOOTTIME, &boot);
    clock_gettime(CLOCK_MONOTONIC, &mono);
    double suspended = (double)(boot.tv_sec - mono.tv_sec) + 1e-9 * (double)(boot.tv_nsec - mono.tv_nsec);
    double start = (double)ticks / (double)sysconf(_SC_CLK_TCK) - suspended;
    return start > 1 ? (unsigned long long)((start - 1) * 1e6) : 0;  // (a second's slack for the clocks' rounding)
}

// Whether the kernel's log (/dev/kmsg, where readable) says an
// out-of-memory killer killed pid ("Killed process PID (...)") since this
// process started (an older record names another process that had the same
// number, perhaps in another container): 1 and the line into out, naming a
// memory cgroup's (a container's or a job's limit: "Memory cgroup out of
// memory") or the whole machine's.
static int kernel_oom(long pid, char *out, size_t n) {
    int fd = open("/dev/kmsg", O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return 0;
    char rec[8192], want[48];
    snprintf(want, sizeof want, "Killed process %ld ", pid);
    unsigned long long since = own_start_us(), at;
    int found = 0, memcg = 0;
    for (int i = 0; i < 100000 && !found; i++) {  // (one record a read; the ring holds at most a few MB)
        ssize_t k = read(fd, rec, sizeof rec - 1);
        if (k < 0 && errno == EPIPE) continue;  // (records overwritten while read)
        if (k <= 0) break;
        rec[k] = 0;
        // "PRIORITY,SEQUENCE,MICROSECONDS,FLAGS;TEXT"
        if (sscanf(rec, "%*u,%*u,%llu", &at) != 1 || at < since) continue;
        found = strstr(rec, want) != NULL;
        memcg = found && strstr(rec, "Memory cgroup out of memory") != NULL;
    }
    close(fd);
    if (found)
        snprintf(out, n, "killed by %s (the kernel's log says so)",
                 memcg ? "the out-of-memory killer of a memory cgroup around the run (a container's or a job's limit)"
                       : "the kernel's out-of-memory killer: the machine ran out of memory");
    return found;
}

int dt_mem_cap_oom(long pid, char *out, size_t n) {
    char own[1024], dir[1100];
    int v1 = 0;
    if (!own_cgroup(own, sizeof own, &v1)) return kernel_oom(pid, out, n);
    snprintf(dir, sizeof dir, "%s/dtrain-%ld", own, pid);
    long long kills = cg_value(dir, v1 ? "memory.oom_control" : "memory.events", "oom_kill");
    if (kills <= 0) return kernel_oom(pid, out, n);
    long long cap = cg_value(dir, v1 ? "memory.limit_in_bytes" : "memory.max", NULL);
    long long peak = cg_value(dir, v1 ? "memory.max_usage_in_bytes" : "memory.peak", NULL);
    char a[64], b[64] = "";
    dt_mem_format(cap > 0 ? (size_t)cap : 0, a, sizeof a);
    if (peak > 0) dt_mem_format((size_t)peak, b, sizeof b);
    snprintf(out, n, "killed by its memory cgroup's out-of-memory killer: its cap (--memory-limit) is %s%s%s", a,
             peak > 0 ? ", its use reached " : "", b);
    return 1;
}

dt_status dt_mem_cap(size_t bytes, char *how, size_t len) {
    char num[32], own[1024], pid[32];
    snprintf(num, sizeof num, "%zu", bytes);
    snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
    // A memory cgroup of its own inside the one it is in, so that the limits
    // around it (a container's, a batch job's) still hold: with v1 anywhere;
    // with v2 where that cgroup hands the memory controller down (only the
    // root can, holding processes itself).
    int v1 = 0;
    if (own_cgroup(own, sizeof own, &v1)) {
        char ctl[1100], line[256] = "";
        snprintf(ctl, sizeof ctl, "%s/%s", own, v1 ? "memory.limit_in_bytes" : "cgroup.subtree_control");
        FILE *f = fopen(ctl, "r");
        if (f && !fgets(line, sizeof line, f)) line[0] = 0;
        if (f) fclose(f);
        const char *limit = v1 ? "memory.limit_in_bytes" : "memory.max";
        if (f && (v1 || strstr(line, "memory"))) {
            cap_sweep(own);
            snprintf(cap_dir, sizeof cap_dir, "%s/dtrain-%ld", own, (long)getpid());
            if ((mkdir(cap_dir, 0755) == 0 || errno == EEXIST) && put(cap_dir, limit, num) == 0 &&
                put(cap_dir, "cgroup.procs", pid) == 0) {
                static int registered;
                if (!registered++) atexit(cap_leave);
                snprintf(how, len, "cgroup %s %s (%s)", v1 ? "v1" : "v2", cap_dir, limit);
                return DT_OK;
            }
            rmdir(cap_dir);
            cap_dir[0] = 0;
        }
    }
    // No cgroup to be had (not root, no controller): the kernel's limit on
    // the private writable memory a process maps.
    struct rlimit rl = {bytes, bytes};
    if (setrlimit(RLIMIT_DATA, &rl) == 0) {
        snprintf(how, len, "RLIMIT_DATA (setrlimit; no memory cgroup could be made here)");
        return DT_OK;
    }
    return dt_error(DT_ERR_IO, "cannot cap this process's memory at %zu bytes: no memory cgroup could be made, and "
                    "setrlimit(RLIMIT_DATA): %s", bytes, strerror(errno));
}

const char *dt_decimal_scan(const char *s, const char **end, int *digits) {
    const char *q = s;
    int only = 0;
    if (*q == '+' || *q == '-') q++;
    const char *int_part = q;
    while (isdigit((unsigned char)*q)) q++;
    size_t nint = (size_t)(q - int_part), nfrac = 0;
    only = nint > 0;
    if (*q == '.') {
        const char *f = ++q;
        while (isdigit((unsigned char)*q)) q++;
        nfrac = (size_t)(q - f);
        only = 0;
    }
    *end = q;
    if (digits) *digits = only;
    if (nint + nfrac == 0) return "";
    if (nint > 1 && int_part[0] == '0') return " (no leading zeros: '010' is neither octal 8 nor 10)";
    if (*q == 'e' || *q == 'E') {
        const char *e = q + 1 + (q[1] == '+' || q[1] == '-');
        if (!isdigit((unsigned char)*e)) return "";
        while (isdigit((unsigned char)*e)) e++;
        *end = e;
        if (digits) *digits = 0;
    }
    return NULL;
}

dt_status dt_mem_parse_size(const char *s, size_t *bytes) {
    const char *num;
    if (!s || !*s || *s == '-' || *s == '+' || dt_decimal_scan(s, &num, NULL)) return DT_ERR_ARG;
    char *end;
    double x = strtod(s, &end);
    if (end != num || !(x > 0)) return DT_ERR_ARG;
    double mul = 1;
    const char *u = "KMGT", *p = *end ? strchr(u, *end & ~0x20) : NULL;
    if (*end && p) {
        for (const char *q = u; q <= p; q++) mul *= 1024;
        end++;
        if (*end == 'i') end++;
    }
    if (*end == 'B' || (*end == 'b' && p)) end++;
    if (*end || !(x <= (double)((uint64_t)1 << 60))) return DT_ERR_ARG;  // finite, and in range before any cast
    if (mul == 1 && x != (double)(uint64_t)x) return DT_ERR_ARG;          // no fractions of a byte
    x *= mul;
    if (x < 1 || x > (double)((uint64_t)1 << 60)) return DT_ERR_ARG;
    *bytes = (size_t)x;
    return DT_OK;
}

const char *dt_mem_format(size_t bytes, char *buf, size_t n) {
    static const char *unit[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    double x = (double)bytes;
    int u = 0;
    while (x >= 1024 && u < 6) {
        x /= 1024;
        u++;
    }
    if (bytes == SIZE_MAX) snprintf(buf, n, "more than 16 EiB (2^64 bytes)");
    else if (u == 0) snprintf(buf, n, "%zu bytes", bytes);
    else snprintf(buf, n, "%.2f %s (%zu bytes)", x, unit[u], bytes);
    return buf;
}

// ----------------------------------------------------------------------------
// CRC-32C: a byte-wise table, and the SSE4.2 instruction 8 bytes at a time
// where the CPU has it (some 10x faster: checkpoints of a GB verify in a
// fraction of a second).

static uint32_t crc_table[256];

static void crc_table_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        crc_table[i] = c;
    }
}

static uint32_t crc_bytes(uint32_t c, const uint8_t *p, size_t n) {
    while (n--) c = crc_table[(c ^ *p++) & 0xff] ^ (c >> 8);
    return c;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) static uint32_t crc_hw(uint32_t c, const uint8_t *p, size_t n) {
    uint64_t c64 = c;
    for (; n >= 8; n -= 8, p += 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        c64 = __builtin_ia32_crc32di(c64, v);
    }
    c = (uint32_t)c64;
    for (; n; n--) c = __builtin_ia32_crc32qi(c, *p++);
    return c;
}
#endif

uint32_t dt_crc32c(uint32_t crc, const void *p, size_t n) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, crc_table_init);
    uint32_t c = ~crc;
#if defined(__x86_64__)
    if (__builtin_cpu_supports("sse4.2")) return ~crc_hw(c, p, n);
#endif
    return ~crc_bytes(c, p, n);
}

// Length of the well-formed UTF-8 character at s[0, left) that is not a C1
// control (U+0080..U+009F), or 0.
static size_t utf8_len(const unsigned char *s, size_t left) {
    unsigned c = s[0];
    size_t n = c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
    if (!n || n > left) return 0;
    for (size_t i = 1; i < n; i++)
        if ((s[i] & 0xc0) != 0x80) return 0;
    if ((c == 0xc2 && s[1] < 0xa0) || (c == 0xe0 && s[1] < 0xa0) || (c == 0xed && s[1] > 0x9f) ||
        (c == 0xf0 && s[1] < 0x90) || (c == 0xf4 && s[1] > 0x8f))
        return 0;  // C1 controls, overlong forms, surrogates, beyond U+10FFFF
    return n;
}

char *dt_escape_text(char *out, size_t n, const char *s, size_t len) {
    static const char hex[] = "0123456789abcdef";
    const unsigned char *p = (const unsigned char *)s;
    size_t w = 0;
    if (!n) return out;
    for (size_t i = 0; i < len;) {
        unsigned c = p[i];
        size_t u = c >= 0x80 ? utf8_len(p + i, len - i) : 0;
        if (u) {  // printable UTF-8
            if (w + u >= n) break;
            memcpy(out + w, p + i, u);
            w += u, i += u;
        } else if (c >= 0x20 && c < 0x7f) {
            if (w + 1 >= n) break;
            out[w++] = (char)c, i++;
        } else {
            if (w + 4 >= n) break;
            out[w++] = '\\', out[w++] = 'x', out[w++] = hex[c >> 4], out[w++] = hex[c & 15], i++;
        }
    }
    out[w] = 0;
    return out;
}

// Optimal string alignment distance of a and b, given up past `cap`.
static int edits(const char *a, const char *b, int cap) {
    int la = (int)strlen(a), lb = (int)strlen(b);
    if (la > 63 || lb > 63 || abs(la - lb) > cap) return cap + 1;
    int d[64][64];
    for (int i = 0; i <= la; i++) d[i][0] = i;
    for (int j = 0; j <= lb; j++) d[0][j] = j;
    for (int i = 1; i <= la; i++)
        for (int j = 1; j <= lb; j++) {
            int c = a[i - 1] != b[j - 1], v = d[i - 1][j - 1] + c;
            if (d[i - 1][j] + 1 < v) v = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < v) v = d[i][j - 1] + 1;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && d[i - 2][j - 2] + 1 < v)
                v = d[i - 2][j - 2] + 1;
            d[i][j] = v;
        }
    return d[la][lb];
}

const char *dt_suggest(const char *word, const char *const *cands, int n) {
    int cap = (int)strlen(word) / 2 - (strlen(word) % 2 == 0), best = 3;
    if (cap > 2) cap = 2;
    const char *pick = NULL;
    for (int i = 0; i < n && cap > 0; i++) {
        int e = edits(word, cands[i], cap);
        if (e <= cap && e < best) best = e, pick = cands[i];
    }
    return pick;
}
