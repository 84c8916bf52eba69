/* Chrome trace-event files (see trace.h). A part is one event per line,
 * each line ending in ",\n"; the merge concatenates the parts between the
 * array's brackets and drops the very last comma. */
#include "obs/trace.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct dt_trace {
    FILE *f;
    char part[4096];
    int rank;
    dt_status err;
};

static void part_path(char *buf, size_t n, const char *path, int rank) {
    snprintf(buf, n, "%s.rank-%d", path, rank);
}

dt_status dt_trace_open(dt_trace **out, const char *path, int rank, const char *label) {
    *out = NULL;
    dt_trace *t = calloc(1, sizeof *t);
    if (!t) return dt_error(DT_ERR_NOMEM, "trace: out of memory");
    t->rank = rank;
    part_path(t->part, sizeof t->part, path, rank);
    int fd = -1;
    if (dt_open_write(t->part, O_TRUNC, &fd) != DT_OK || !(t->f = fdopen(fd, "w"))) {
        dt_status st = dt_error(DT_ERR_IO, "trace: %s", fd < 0 ? dt_last_error() : strerror(errno));
        if (fd >= 0) close(fd);
        free(t);
        return st;
    }
    fprintf(t->f,
            "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"args\":{\"name\":\"rank %d%s\"}},\n"
            "{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"args\":{\"sort_index\":%d}},\n"
            "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":\"compute\"}},\n"
            "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":\"communication\"}},\n",
            rank, rank, label ? label : "", rank, rank, rank, DT_TRACE_COMPUTE, rank, DT_TRACE_COMM);
    *out = t;
    return DT_OK;
}

void dt_trace_span(dt_trace *t, const char *name, const char *cat, int tid, double ts_us, double dur_us,
                   const char *args) {
    if (!t || !t->f) return;
    fprintf(t->f, "{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"X\",\"ts\":%.3f,\"dur\":%.3f,\"pid\":%d,\"tid\":%d%s%s},\n",
            name, cat, ts_us, dur_us < 0 ? 0 : dur_us, t->rank, tid, args ? ",\"args\":" : "", args ? args : "");
}

dt_status dt_trace_finish(dt_trace *t) {
    if (!t) return DT_OK;
    dt_status st = DT_OK;
    if (t->f && (ferror(t->f) | fclose(t->f)))
        st = dt_error(DT_ERR_IO, "trace %s: write failed: %s", t->part, strerror(errno));
    free(t);
    return st;
}

static dt_status read_all(const char *path, char **buf, size_t *len) {
    FILE *f = dt_fopen_read(path);
    if (!f) return dt_error(DT_ERR_IO, "trace: %s", dt_last_error());
    char *b = NULL;
    size_t n = 0, cap = 0, got;
    do {
        if (cap - n < 65536) {
            char *nb = realloc(b, cap = cap * 2 + 65536);
            if (!nb) {
                free(b);
                fclose(f);
                return dt_error(DT_ERR_NOMEM, "trace %s: out of memory", path);
            }
            b = nb;
        }
        got = fread(b + n, 1, cap - n, f);
        n += got;
    } while (got > 0);
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(b);
        return dt_error(DT_ERR_IO, "trace %s: read failed", path);
    }
    *buf = b;
    *len = n;
    return DT_OK;
}

dt_status dt_trace_merge(const char *path, int nranks) {
    static const char head[] = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n", tail[] = "\n]}\n";
    int n = nranks + 2;
    char **bufs = calloc(n, sizeof *bufs);
    const void **parts = calloc(n, sizeof *parts);
    size_t *sizes = calloc(n, sizeof *sizes);
    dt_status st = bufs && parts && sizes ? DT_OK : dt_error(DT_ERR_NOMEM, "trace: out of memory");
    char part[4096];
    parts[0] = head;
    sizes[0] = sizeof head - 1;
    for (int r = 0; r < nranks && st == DT_OK; r++) {
        part_path(part, sizeof part, path, r);
        st = read_all(part, &bufs[r + 1], &sizes[r + 1]);
        parts[r + 1] = bufs[r + 1];
    }
    if (st == DT_OK) {
        // Drop the last ",\n" of the last non-empty part.
        for (int r = nranks; r >= 1; r--)
            if (sizes[r] >= 2) {
                sizes[r] -= 2;
                break;
            }
        parts[n - 1] = tail;
        sizes[n - 1] = sizeof tail - 1;
        st = dt_write_atomic(path, parts, sizes, n);
    }
    if (st == DT_OK)
        for (int r = 0; r < nranks; r++) {
            part_path(part, sizeof part, path, r);
            remove(part);
        }
    for (int i = 0; bufs && i < n; i++) free(bufs[i]);
    free(bufs);
    free(parts);
    free(sizes);
    return st;
}
