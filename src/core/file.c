/* Files: atomic writes, whole-file reads (gzip or plain), JSON files. */
#include "core/file.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

// ----------------------------------------------------------------------------
// opening: regular files only

static const char *kind_of(mode_t m) {
    return S_ISDIR(m) ? "a directory" : S_ISFIFO(m) ? "a FIFO" : S_ISCHR(m) || S_ISBLK(m) ? "a device"
         : S_ISSOCK(m) ? "a socket" : S_ISLNK(m) ? "a symbolic link" : "not a regular file";
}

// fd, opened without blocking, as a blocking descriptor of a regular file.
static dt_status regular(const char *path, int fd, int *out) {
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        dt_status st = dt_error(DT_ERR_IO, "%s: not a regular file (%s)", path, kind_of(sb.st_mode));
        close(fd);
        return st;
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    *out = fd;
    return DT_OK;
}

dt_status dt_open_read(const char *path, int *fd) {
    *fd = -1;
    int f = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (f < 0) return dt_error(DT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    return regular(path, f, fd);
}

dt_status dt_read_at(int fd, uint64_t off, void *dst, size_t n, const char *path) {
    for (uint8_t *p = dst; n;) {
        ssize_t r = pread(fd, p, n < ((size_t)1 << 30) ? n : (size_t)1 << 30, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return dt_error(DT_ERR_IO, "%s: reading at byte %llu: %s", path, (unsigned long long)off, strerror(errno));
        if (r == 0)
            return dt_error(DT_ERR_IO, "%s: ends before byte %llu (cut short while it was read?)", path,
                            (unsigned long long)(off + n));
        p += r, off += (uint64_t)r, n -= (size_t)r;
    }
    return DT_OK;
}

FILE *dt_fopen_read(const char *path) {
    int fd;
    if (dt_open_read(path, &fd) != DT_OK) return NULL;
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        dt_error(DT_ERR_NOMEM, "%s: out of memory", path);
        close(fd);
    }
    return f;
}

dt_status dt_open_write(const char *path, int flags, int *fd) {
    *fd = -1;
    int f = open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC | (flags & O_APPEND), 0644);
    if (f < 0 && errno == ELOOP) return dt_error(DT_ERR_IO, "%s: a symbolic link; not written through", path);
    if (f < 0) return dt_error(DT_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    dt_status st = regular(path, f, fd);
    if (st == DT_OK && (flags & O_TRUNC) && ftruncate(*fd, 0) != 0) {
        st = dt_error(DT_ERR_IO, "%s: cannot empty: %s", path, strerror(errno));
        close(*fd);
        *fd = -1;
    }
    return st;
}

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
    unlink(f->tmp);  // (an earlier process's with this pid)
    if ((f->fd = open(f->tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644)) < 0) {
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

dt_status dt_atomic_write_at(dt_atomic_file *f, size_t at, const void *data, size_t n) {
    const char *p = data;
    while (n > 0) {
        ssize_t w = pwrite(f->fd, p, n, (off_t)at);
        if (w < 0) {
            if (errno == EINTR) continue;
            return dt_error(DT_ERR_IO, "%s: write at byte %zu failed: %s", f->tmp, at, strerror(errno));
        }
        p += w;
        at += (size_t)w;
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
    struct stat sb;
    if (lstat(f->path, &sb) == 0 && !S_ISREG(sb.st_mode)) {
        st = dt_error(DT_ERR_IO, "%s: exists and is %s; not replaced", f->path, kind_of(sb.st_mode));
        close(f->fd);
        unlink(f->tmp);
    } else if (fsync(f->fd) != 0 || close(f->fd) != 0) {
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

dt_status dt_read_file_gz(const char *path, size_t max, uint8_t **buf, size_t *len) {
    *buf = NULL;
    *len = 0;
    int fd;
    dt_status st0 = dt_open_read(path, &fd);
    if (st0 != DT_OK) return st0;
    gzFile f = gzdopen(fd, "rb");  // reads plain files as they are, too
    if (!f) {
        close(fd);
        return dt_error(DT_ERR_NOMEM, "%s: out of memory", path);
    }
    size_t lim = max && max < DT_MAX_FILE_BYTES ? max : DT_MAX_FILE_BYTES;
    size_t cap = lim < (1 << 20) ? lim + 1 : 1 << 20, n = 0;  // (lim + 1: one byte more says "too long")
    uint8_t *b = malloc(cap);
    if (!b) {
        gzclose(f);
        return dt_error(DT_ERR_NOMEM, "%s: out of memory", path);
    }
    for (;;) {
        if (n == cap) {
            // A bound on what a small compressed file may expand to.
            if (cap > lim) {
                free(b);
                gzclose(f);
                return dt_error(DT_ERR_FORMAT, "%s: more than %zu bytes once uncompressed (%s)", path, lim,
                                lim == max ? "what its header announces" : "the limit for a data file");
            }
            size_t grow = cap * 2 > lim + 1 ? lim + 1 : cap * 2;
            uint8_t *nb = realloc(b, grow);
            if (!nb) {
                free(b);
                gzclose(f);
                return dt_error(DT_ERR_NOMEM, "%s: out of memory (file larger than %zu bytes)", path, cap);
            }
            b = nb;
            cap = grow;
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
