/* Files: atomic writes, whole-file reads (gzip or plain), JSON files; the
 * same for objects in S3-compatible storage (s3://, core/s3.h), and what
 * readers of ranges and directories see of both. */
#include "core/file.h"
#include "core/s3.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <libgen.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
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

// ----------------------------------------------------------------------------
// objects staged in local files

int dt_path_remote(const char *path) { return dt_s3_is_url(path); }

// An unlinked temporary file under TMPDIR (else /tmp), open for reading and
// writing: bytes on their way to or from object storage, gone with the
// descriptor whatever happens to the process.
static dt_status anon_file(const char *what, int *fd) {
    const char *dir = getenv("TMPDIR");
    if (!dir || !*dir) dir = "/tmp";
    int f = open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    if (f < 0) {  // (a file system without O_TMPFILE)
        char tmp[4200];
        snprintf(tmp, sizeof tmp, "%s/dtrain-stage-XXXXXX", dir);
        if ((f = mkostemp(tmp, O_CLOEXEC)) >= 0) unlink(tmp);
    }
    if (f < 0) return dt_error(DT_ERR_IO, "%s: cannot make a temporary file in %s (TMPDIR): %s", what, dir, strerror(errno));
    *fd = f;
    return DT_OK;
}

#define STAGE_PIECE ((size_t)32 << 20)

// Object url copied into an unlinked temporary file, *fd at its start.
static dt_status stage_object(const char *url, int *fd) {
    *fd = -1;
    int exists;
    uint64_t size;
    dt_status st = dt_s3_head(url, &exists, &size);
    if (st != DT_OK) return st;
    if (!exists) return dt_error(DT_ERR_IO, "%s: cannot open: no such object", url);
    int f;
    if ((st = anon_file(url, &f)) != DT_OK) return st;
    uint8_t *buf = size ? malloc(size < STAGE_PIECE ? size : STAGE_PIECE) : NULL;
    if (size && !buf) st = dt_error(DT_ERR_NOMEM, "%s: out of memory", url);
    for (uint64_t at = 0; at < size && st == DT_OK;) {
        size_t n = size - at < STAGE_PIECE ? (size_t)(size - at) : STAGE_PIECE;
        if ((st = dt_s3_get(url, at, n, buf)) != DT_OK) break;
        for (size_t w = 0; w < n && st == DT_OK;) {
            ssize_t r = pwrite(f, buf + w, n - w, (off_t)(at + w));
            if (r < 0 && errno == EINTR) continue;
            if (r < 0) st = dt_error(DT_ERR_IO, "%s: staging it in a temporary file: %s", url, strerror(errno));
            else w += (size_t)r;
        }
        at += n;
    }
    free(buf);
    if (st != DT_OK) {
        close(f);
        return st;
    }
    *fd = f;
    return DT_OK;
}

dt_status dt_open_read(const char *path, int *fd) {
    *fd = -1;
    if (dt_s3_is_url(path)) return stage_object(path, fd);
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

// An object (s3://) is staged in an unlinked temporary file and uploaded
// at commit: a PUT or a multipart upload makes the object appear whole or
// not at all.
struct dt_atomic_file {
    int fd, remote;
    char tmp[4096], path[4096];
};

dt_status dt_atomic_open(dt_atomic_file **out, const char *path) {
    *out = NULL;
    dt_atomic_file *f = malloc(sizeof *f);
    if (!f) return dt_error(DT_ERR_NOMEM, "%s: out of memory", path);
    if ((f->remote = dt_s3_is_url(path))) {
        snprintf(f->path, sizeof f->path, "%s", path);
        snprintf(f->tmp, sizeof f->tmp, "%.4000s (staged for upload)", path);
        dt_status st = anon_file(path, &f->fd);
        if (st != DT_OK) free(f), f = NULL;
        *out = f;
        return st;
    }
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
    if (!f->remote) unlink(f->tmp);
    free(f);
}

dt_status dt_atomic_commit(dt_atomic_file *f) {
    dt_status st = DT_OK;
    struct stat sb;
    if (f->remote) {
        st = fstat(f->fd, &sb) == 0 ? dt_s3_put_fd(f->path, f->fd, (uint64_t)sb.st_size)
                                    : dt_error(DT_ERR_IO, "%s: cannot stat: %s", f->tmp, strerror(errno));
        close(f->fd);
    } else if (lstat(f->path, &sb) == 0 && !S_ISREG(sb.st_mode)) {
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
    if (dt_s3_is_url(path)) return dt_s3_put_parts(path, parts, sizes, n);  // (from memory: nothing staged)
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

// ----------------------------------------------------------------------------
// what is at a path; directories

typedef struct {
    int any;
} probe_t;

static int probe_one(void *user, const char *name, uint64_t size, int is_dir) {
    (void)name, (void)size, (void)is_dir;
    ((probe_t *)user)->any = 1;
    return 1;
}

dt_status dt_path_kind(const char *path, int *kind, uint64_t *size) {
    *kind = 0;
    if (size) *size = 0;
    if (!dt_s3_is_url(path)) {
        struct stat sb;
        if (stat(path, &sb) != 0) return DT_OK;
        *kind = S_ISDIR(sb.st_mode) ? 2 : 1;
        if (size) *size = (uint64_t)sb.st_size;
        return DT_OK;
    }
    int exists = 0;
    const char *key = strchr(path + 5, '/');  // (no object: the listing below says if the bucket is missing)
    dt_status st = key && key[1] && key[strlen(key) - 1] != '/' ? dt_s3_stat(path, &exists, size) : DT_OK;
    if (st != DT_OK || exists) {
        *kind = exists;
        return st;
    }
    probe_t p = {0};
    if ((st = dt_s3_list(path, probe_one, &p)) == DT_OK && p.any) *kind = 2;
    return st;
}

typedef struct {
    char **names;
    int n, cap, oom;
} names_t;

static int add_name(void *user, const char *name, uint64_t size, int is_dir) {
    (void)size, (void)is_dir;
    names_t *l = user;
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 16;
        char **p = realloc(l->names, sizeof *p * (size_t)cap);
        if (!p) return l->oom = 1;
        l->names = p;
        l->cap = cap;
    }
    if (!(l->names[l->n] = strdup(name))) return l->oom = 1;
    l->n++;
    return 0;
}

void dt_path_list_free(char **names, int n) {
    for (int i = 0; i < n; i++) free(names[i]);
    free(names);
}

dt_status dt_path_list(const char *dir, char ***names, int *n) {
    *names = NULL;
    *n = 0;
    names_t l = {0};
    dt_status st = DT_OK;
    if (dt_s3_is_url(dir)) {
        st = dt_s3_list(dir, add_name, &l);
    } else {
        DIR *d = opendir(dir);
        if (!d) return errno == ENOENT ? DT_OK : dt_error(DT_ERR_IO, "%s: cannot read directory: %s", dir, strerror(errno));
        for (struct dirent *e; !l.oom && (e = readdir(d));)
            if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) add_name(&l, e->d_name, 0, 0);
        closedir(d);
    }
    if (st == DT_OK && l.oom) st = dt_error(DT_ERR_NOMEM, "%s: out of memory", dir);
    if (st != DT_OK) {
        dt_path_list_free(l.names, l.n);
        return st;
    }
    *names = l.names;
    *n = l.n;
    return DT_OK;
}

dt_status dt_path_remove(const char *path) {
    if (dt_s3_is_url(path)) return dt_s3_delete(path);
    if (unlink(path) != 0 && errno != ENOENT) return dt_error(DT_ERR_IO, "%s: cannot remove: %s", path, strerror(errno));
    return DT_OK;
}

void dt_path_rmdir(const char *path) {
    if (!dt_s3_is_url(path)) rmdir(path);
}

// ----------------------------------------------------------------------------
// reading by ranges

#define BLOCK ((size_t)1 << 20)  // an object's small reads come from one block (dt_rfile_set_block)

struct dt_rfile {
    int fd;                      // a local file's; -1 an object
    char *path;
    uint64_t size;
    size_t block_size;           // the read-ahead (0: none)
    pthread_mutex_t mu;          // the block:
    uint8_t *block;              //   bytes [block_off, block_off + block_len) of the object
    uint64_t block_off;
    size_t block_len;
};

dt_status dt_rfile_open(dt_rfile **out, const char *path) {
    *out = NULL;
    dt_rfile *f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(path))) {
        free(f);
        return dt_error(DT_ERR_NOMEM, "%s: out of memory", path);
    }
    f->fd = -1;
    f->block_size = BLOCK;
    pthread_mutex_init(&f->mu, NULL);
    dt_status st;
    if (dt_s3_is_url(path)) {
        int exists;
        st = dt_s3_head(path, &exists, &f->size);
        if (st == DT_OK && !exists) st = dt_error(DT_ERR_IO, "%s: cannot open: no such object", path);
    } else if ((st = dt_open_read(path, &f->fd)) == DT_OK) {
        struct stat sb;
        if (fstat(f->fd, &sb) != 0) st = dt_error(DT_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
        else f->size = (uint64_t)sb.st_size;
    }
    if (st != DT_OK) {
        dt_rfile_close(f);
        return st;
    }
    *out = f;
    return DT_OK;
}

uint64_t dt_rfile_size(const dt_rfile *f) { return f->size; }

void dt_rfile_set_block(dt_rfile *f, size_t bytes) {
    pthread_mutex_lock(&f->mu);
    if (bytes != f->block_size) {
        free(f->block);
        f->block = NULL;
        f->block_len = 0;
        f->block_size = bytes;
    }
    pthread_mutex_unlock(&f->mu);
}

dt_status dt_rfile_read(dt_rfile *f, uint64_t off, void *dst, size_t n) {
    if (f->fd >= 0) return dt_read_at(f->fd, off, dst, n, f->path);
    if (n == 0) return DT_OK;
    if (off > f->size || n > f->size - off)
        return dt_error(DT_ERR_IO, "%s: ends at byte %" PRIu64 ", before byte %" PRIu64 " (cut short?)", f->path, f->size,
                        off + n);
    pthread_mutex_lock(&f->mu);
    size_t bs = f->block_size;
    if (n >= bs / 4) {
        pthread_mutex_unlock(&f->mu);
        return dt_s3_get(f->path, off, n, dst);
    }
    dt_status st = DT_OK;
    if (!f->block || off < f->block_off || off + n > f->block_off + f->block_len) {
        size_t len = f->size - off < bs ? (size_t)(f->size - off) : bs;
        if (!f->block && !(f->block = malloc(bs))) st = dt_error(DT_ERR_NOMEM, "%s: out of memory", f->path);
        f->block_len = 0;
        if (st == DT_OK && (st = dt_s3_get(f->path, off, len, f->block)) == DT_OK) f->block_off = off, f->block_len = len;
    }
    if (st == DT_OK) memcpy(dst, f->block + (off - f->block_off), n);
    pthread_mutex_unlock(&f->mu);
    return st;
}

void dt_rfile_close(dt_rfile *f) {
    if (!f) return;
    if (f->fd >= 0) close(f->fd);
    pthread_mutex_destroy(&f->mu);
    free(f->block);
    free(f->path);
    free(f);
}
