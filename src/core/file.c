/* Files: atomic writes, whole-file reads (gzip or plain), JSON files. */
#include "core/file.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

// ----------------------------------------------------------------------------
// atomic file writes: temp file, fsync, rename, fsync the directory

struct dt_atomic_file {
    int fd;
    char tmp[4096], path[4096];
};

dt_status dt_atomic_open(dt_atomic_file **out, const char *path) {
    *out = NULL;
    dt_atomic_file *f = malloc(sizeof *f);
    if (!f) return dt_error(DT_ERR_NOMEM, "%s: out of memory", path);
    if (snprintf(f->tmp, sizeof f->tmp, "%s.tmp.%ld", path, (long)getpid()) >= (int)sizeof f->tmp ||
        snprintf(f->path, sizeof f->path, "%s", path) >= (int)sizeof f->path) {
        free(f);
        return dt_error(DT_ERR_ARG, "%s: path too long", path);
    }
    if ((f->fd = open(f->tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644)) < 0) {
        dt_status st = dt_error(DT_ERR_IO, "%s: cannot create: %s", f->tmp, strerror(errno));
        free(f);
        return st;
    }
    *out = f;
    return DT_OK;
}

dt_status dt_atomic_append(dt_atomic_file *f, const void *data, size_t n) {
    const char *p = data;
    while (n > 0) {
        ssize_t w = write(f->fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return dt_error(DT_ERR_IO, "%s: write failed: %s", f->tmp, strerror(errno));
        }
        p += w;
        n -= (size_t)w;
    }
    return DT_OK;
}

void dt_atomic_abort(dt_atomic_file *f) {
    if (!f) return;
    close(f->fd);
    unlink(f->tmp);
    free(f);
}

dt_status dt_atomic_commit(dt_atomic_file *f) {
    dt_status st = DT_OK;
    if (fsync(f->fd) != 0 || close(f->fd) != 0) {
        st = dt_error(DT_ERR_IO, "%s: fsync failed: %s", f->tmp, strerror(errno));
        unlink(f->tmp);
    } else if (rename(f->tmp, f->path) != 0) {
        st = dt_error(DT_ERR_IO, "%s: rename failed: %s", f->path, strerror(errno));
        unlink(f->tmp);
    } else {
        char dir[4096];
        snprintf(dir, sizeof dir, "%s", f->path);
        int dfd = open(dirname(dir), O_RDONLY | O_DIRECTORY);
        if (dfd >= 0) {
            fsync(dfd);
            close(dfd);
        }
    }
    free(f);
    return st;
}

dt_status dt_write_atomic(const char *path, const void *const *parts, const size_t *sizes, int n) {
    dt_atomic_file *f;
    dt_status st = dt_atomic_open(&f, path);
    for (int i = 0; i < n && st == DT_OK; i++) st = dt_atomic_append(f, parts[i], sizes[i]);
    if (st != DT_OK) {
        dt_atomic_abort(f);
        return st;
    }
    return dt_atomic_commit(f);
}

// ----------------------------------------------------------------------------
// whole-file reads, gunzipping gzip files

#define DT_MAX_FILE_BYTES ((size_t)1 << 32)  // 4 GiB

dt_status dt_read_file_gz(const char *path, uint8_t **buf, size_t *len) {
    *buf = NULL;
    *len = 0;
    gzFile f = gzopen(path, "rb");  // reads plain files as they are, too
    if (!f) return dt_error(DT_ERR_IO, "%s: cannot open: %s", path, strerror(errno ? errno : ENOENT));
    size_t cap = 1 << 20, n = 0;
    uint8_t *b = malloc(cap);
    if (!b) {
        gzclose(f);
        return dt_error(DT_ERR_NOMEM, "%s: out of memory", path);
    }
    for (;;) {
        if (n == cap) {
            // A bound on what a small compressed file may expand to.
            if (cap >= DT_MAX_FILE_BYTES) {
                free(b);
                gzclose(f);
                return dt_error(DT_ERR_FORMAT, "%s: more than %zu bytes once uncompressed (the limit for a data file)",
                                path, (size_t)DT_MAX_FILE_BYTES);
            }
            uint8_t *nb = realloc(b, cap * 2);
            if (!nb) {
                free(b);
                gzclose(f);
                return dt_error(DT_ERR_NOMEM, "%s: out of memory (file larger than %zu bytes)", path, cap);
            }
            b = nb;
            cap *= 2;
        }
        size_t want = cap - n;
        if (want > (1u << 30)) want = 1u << 30;
        int r = gzread(f, b + n, (unsigned)want);
        if (r < 0) {
            int e;
            const char *msg = gzerror(f, &e);
            // Z_ERRNO: the read itself failed (a directory, an I/O error),
            // not the data.
            dt_status st = e == Z_ERRNO
                               ? dt_error(DT_ERR_IO, "%s: cannot read: %s", path, strerror(errno))
                               : dt_error(DT_ERR_FORMAT, "%s: corrupt or truncated gzip data (%s)", path, msg);
            free(b);
            gzclose(f);
            return st;
        }
        if (r == 0) break;
        n += (size_t)r;
    }
    // zlib reports a gzip stream cut short only as a clean end of file;
    // gzclose_r then returns Z_BUF_ERROR.
    int rc = gzclose(f);
    if (rc != Z_OK) {
        free(b);
        return dt_error(DT_ERR_FORMAT, "%s: truncated gzip data (stream ended early)", path);
    }
    *buf = b;
    *len = n;
    return DT_OK;
}

// ----------------------------------------------------------------------------
// JSON files

dt_status dt_json_write(const char *path, cJSON *o) {
    char *s = cJSON_Print(o);
    cJSON_Delete(o);
    if (!s) return dt_error(DT_ERR_NOMEM, "%s: out of memory", path);
    size_t n = strlen(s);
    const void *parts[] = {s, "\n"};
    size_t sizes[] = {n, 1};
    dt_status st = dt_write_atomic(path, parts, sizes, 2);
    free(s);
    return st;
}
