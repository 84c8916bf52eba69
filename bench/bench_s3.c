/* Object storage against local disk, the way dtrain's readers and writers
 * use them (bench/s3.sh drives it against a real S3 server):
 *
 *   bench_s3 read PATH REPS      read PATH whole through dt_rfile (a token
 *                                file's load: s3:// in 8 MiB ranged GETs,
 *                                four in flight), REPS times: MB/s each
 *   bench_s3 write PATH MB REPS  write MB MiB atomically (a checkpoint's
 *                                write: a local file fsync'd and renamed;
 *                                s3:// staged, then a multipart upload),
 *                                REPS times: seconds each
 *   bench_s3 copy FILE URL       FILE uploaded as URL
 *
 * Each line: "read PATH BYTES SECONDS MB/s" or "write PATH BYTES SECONDS MB/s". */
#include "dtrain/core.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int bench_read(const char *path, int reps) {
    for (int r = 0; r < reps; r++) {
        double t0 = dt_now();
        dt_rfile *f;
        if (dt_rfile_open(&f, path) != DT_OK) return fprintf(stderr, "%s\n", dt_last_error()), 1;
        size_t n = (size_t)dt_rfile_size(f);
        void *buf = malloc(n ? n : 1);
        dt_status st = buf ? dt_rfile_read(f, 0, buf, n) : DT_ERR_NOMEM;
        dt_rfile_close(f);
        free(buf);
        if (st != DT_OK) return fprintf(stderr, "%s\n", dt_last_error()), 1;
        double s = dt_now() - t0;
        printf("read %s %zu %.3f %.1f\n", path, n, s, n / s / 1e6);
        fflush(stdout);
    }
    return 0;
}

static int bench_write(const char *path, size_t mb, int reps) {
    size_t n = mb << 20;
    unsigned char *buf = malloc(n);
    if (!buf) return fprintf(stderr, "out of memory\n"), 1;
    for (size_t i = 0; i < n; i++) buf[i] = (unsigned char)(i * 2654435761u >> 11);
    for (int r = 0; r < reps; r++) {
        double t0 = dt_now();
        const void *parts[] = {buf};
        if (dt_write_atomic(path, parts, &n, 1) != DT_OK) return fprintf(stderr, "%s\n", dt_last_error()), 1;
        double s = dt_now() - t0;
        printf("write %s %zu %.3f %.1f\n", path, n, s, n / s / 1e6);
        fflush(stdout);
    }
    free(buf);
    return 0;
}

static int copy(const char *from, const char *to) {
    uint8_t *b;
    size_t n;
    dt_rfile *f;
    if (dt_rfile_open(&f, from) != DT_OK) return fprintf(stderr, "%s\n", dt_last_error()), 1;
    n = (size_t)dt_rfile_size(f);
    b = malloc(n ? n : 1);
    dt_status st = b ? dt_rfile_read(f, 0, b, n) : DT_ERR_NOMEM;
    dt_rfile_close(f);
    const void *parts[] = {b};
    if (st == DT_OK) st = dt_write_atomic(to, parts, &n, 1);
    free(b);
    if (st != DT_OK) return fprintf(stderr, "%s\n", dt_last_error()), 1;
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 4 && !strcmp(argv[1], "read")) return bench_read(argv[2], atoi(argv[3]));
    if (argc == 5 && !strcmp(argv[1], "write")) return bench_write(argv[2], (size_t)atol(argv[3]), atoi(argv[4]));
    if (argc == 4 && !strcmp(argv[1], "copy")) return copy(argv[2], argv[3]);
    fprintf(stderr, "usage: bench_s3 read PATH REPS | write PATH MB REPS | copy FILE URL\n");
    return 2;
}
