/* Checkpoints and data in object storage, against a real S3 server that
 * the test starts: Ceph's RADOS Gateway on a one-node cluster
 * (tests/s3_server.sh), reached through a proxy that injects faults on
 * request (tests/s3_fault_proxy.py). Skipped (exit 77) where radosgw is not
 * installed or this build has no libcurl.
 *
 *   1. The client: objects put and read back by ranges, byte for byte; a
 *      multipart upload (5 MiB parts), from a file and from memory; a large read in pieces; listings;
 *      deletes; a 503 SlowDown retried; a missing object and a missing
 *      bucket named.
 *   2. Runs (deterministic, so "the same" is bitwise): whole and sharded
 *      checkpoints in s3://, keep, a run stopped by a failure and resumed
 *      on another worker count, equal to the uninterrupted local run; a
 *      killed worker's group restarted from s3:// (--max-restarts); ZeRO-3
 *      resumed from s3:// with each rank reading its own slice (summary's
 *      io.ranks_read_bytes); inspect, export and eval of s3:// checkpoints;
 *      IDX, HDF5 and token files read from s3:// train the same model as
 *      the local files, each rank reading its shard alone ([data] shard:
 *      each of 2 ranks half of the training files, each of 4 a quarter of
 *      a token file, io.ranks_s3_read_bytes), or whole; sample from an
 *      s3:// checkpoint. Parameter servers' checkpoints in s3:// (mode
 *      sync failed and resumed; the recommender's tables on the servers
 *      resumed on another server count: bitwise), and in mode async with compression a worker's file and a
 *      server's shard each lost: given up, the run goes on.
 *   3. Faults: wrong and missing credentials, a missing bucket (clear
 *      messages naming the object, exit 1 before training); 503/500 replies
 *      retried; the gateway killed in the middle of the checkpoints and
 *      started again (the run goes on, every checkpoint completes, the
 *      model is the uninterrupted run's); the server unreachable past the
 *      retries (the checkpoint is given up, never marked complete, the run
 *      goes on; resume falls back to the one before; a run whose last
 *      checkpoint is lost exits 1 saying so); truncated objects (inspect
 *      refuses naming the shard, resume falls back). */
#include "core/s3.h"
#include "dtrain/ckpt.h"
#include "dtrain/gpt.h"
#include "dtrain/recsys.h"
#include "testlib.h"

#include <arpa/inet.h>
#include <math.h>
#include <cjson/cJSON.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

static char g_tmp[256], g_srv[300], g_out[1 << 17];
static int g_proxy_pid = -1;

static const char *tmp(const char *name) { return tl_path(g_tmp, name); }

// A shell command's output into g_out; its exit status.
static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sh(const char *fmt, ...) {
    char cmd[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    return tl_run(cmd, g_out, sizeof g_out);
}

static int free_port(void) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t l = sizeof a;
    int port = -1;
    if (s >= 0 && bind(s, (struct sockaddr *)&a, sizeof a) == 0 && getsockname(s, (struct sockaddr *)&a, &l) == 0)
        port = ntohs(a.sin_port);
    if (s >= 0) close(s);
    return port;
}

static void stop_all(void) {
    if (g_proxy_pid > 0) kill(g_proxy_pid, SIGTERM);
    if (g_srv[0]) sh("tests/s3_server.sh stop %s", g_srv);
}

// The fault proxy's rules (s3_fault_proxy.py), as JSON; "" none.
static void rules(const char *json) {
    char p[600];
    snprintf(p, sizeof p, "%s/rules.json", g_srv);
    FILE *f = fopen(p, "w");
    fputs(json, f);
    fclose(f);
}

// How many requests the proxy saw whose line holds `what` since the log
// was last cleared (log_clear).
static int seen(const char *what) {
    char p[600];
    snprintf(p, sizeof p, "%s/proxy.log", g_srv);
    return tl_count(p, what);
}

static void log_clear(void) {
    char p[600];
    snprintf(p, sizeof p, "%s/proxy.log", g_srv);
    fclose(fopen(p, "w"));
}

// Starts the server and the proxy; the environment then points at the
// proxy. 77: cannot run here.
static int start(void) {
    snprintf(g_srv, sizeof g_srv, "%s/srv", g_tmp);
    int rc = sh("tests/s3_server.sh start %s 2>&1", g_srv);
    if (rc == 77 || strstr(g_out, "SKIPPED")) {
        g_srv[0] = 0;
        tl_skip("%s", g_out);
        return 77;
    }
    if (rc != 0) {
        CHECK(0, "the S3 server starts: exit %d\n%s", rc, g_out);
        g_srv[0] = 0;
        return 1;
    }
    atexit(stop_all);
    int up = -1;
    for (char *l = strtok(g_out, "\n"); l; l = strtok(NULL, "\n")) {
        char k[64], v[256];
        if (sscanf(l, "export %63[^=]=%255s", k, v) != 2) continue;
        setenv(k, v, 1);
        if (!strcmp(k, "AWS_ENDPOINT_URL")) sscanf(v, "http://127.0.0.1:%d", &up);
    }
    for (const char *b = "ckpt data"; *b; b += strcspn(b, " "), b += *b == ' ') {
        char name[16];
        snprintf(name, sizeof name, "%.*s", (int)strcspn(b, " "), b);
        rc = sh("tests/s3_server.sh mb %s %s 2>&1", g_srv, name);
        CHECK(rc == 0, "bucket %s made: %s", name, g_out);
    }
    int port = free_port();
    rules("[]");
    log_clear();
    char pidf[600], url[64];
    snprintf(pidf, sizeof pidf, "%s/proxy.pid", g_srv);
    sh("python3 tests/s3_fault_proxy.py %d %d %s/rules.json %s/proxy.log >%s/proxy.out 2>&1 & echo $! >%s", port, up,
       g_srv, g_srv, g_srv, pidf);
    char *p = tl_read_file(pidf, NULL);
    g_proxy_pid = p ? atoi(p) : -1;
    free(p);
    snprintf(url, sizeof url, "http://127.0.0.1:%d", port);
    setenv("AWS_ENDPOINT_URL", url, 1);
    for (int i = 0; i < 100 && sh("curl -s -o /dev/null -m 1 %s/", url) != 0; i++) usleep(100000);
    return 0;
}

// ---------------------------------------------------------------------------
// 1. the client

static int count_names(void *user, const char *name, uint64_t size, int is_dir) {
    char *list = user;
    size_t l = strlen(list);
    snprintf(list + l, 1024 - l, "%s%s%s:%llu", l ? " " : "", name, is_dir ? "/" : "", (unsigned long long)size);
    return 0;
}

static void test_client(void) {
    const char *u = "s3://data/c/a.bin";
    CHECK(dt_s3_put(u, "hello object storage", 20) == DT_OK, "put: %s", dt_last_error());
    int ex;
    uint64_t size;
    CHECK(dt_s3_head(u, &ex, &size) == DT_OK && ex && size == 20, "head: %d %llu", ex, (unsigned long long)size);
    char b[32] = "";
    CHECK(dt_s3_get(u, 6, 6, b) == DT_OK && !memcmp(b, "object", 6), "ranged get: '%.6s'", b);
    CHECK(dt_s3_get(u, 15, 10, b) == DT_ERR_IO && strstr(dt_last_error(), "s3://data/c/a.bin: ends at byte 20"),
          "a read past the end names where it ends: %s", dt_last_error());
    // 12 MiB in 5 MiB parts (DTRAIN_S3_PART_MB), then read back in 8 MiB pieces
    size_t n = 12u << 20;
    uint8_t *big = malloc(n), *back = malloc(n);
    for (size_t i = 0; i < n; i++) big[i] = (uint8_t)(i * 2654435761u >> 13);
    int fd = open(tmp("big"), O_RDWR | O_CREAT | O_TRUNC, 0644);
    CHECK(write(fd, big, n) == (ssize_t)n, "staged");
    log_clear();
    CHECK(dt_s3_put_fd("s3://data/c/sub/big.bin", fd, n) == DT_OK, "multipart put: %s", dt_last_error());
    close(fd);
    CHECK(seen("?uploads=") == 1 && seen("partNumber=3&") == 1 && seen("partNumber=4&") == 0,
          "a multipart upload of 3 parts: %d, %d", seen("?uploads="), seen("partNumber=3&"));
    memset(back, 0, n);
    CHECK(dt_s3_get("s3://data/c/sub/big.bin", 0, n, back) == DT_OK && !memcmp(big, back, n), "read back: %s",
          dt_last_error());
    // the same bytes from memory in 3 pieces of odd sizes (dt_write_atomic: no staging)
    const void *pieces[3] = {big, big + 777, big + (5u << 20) + 3};
    size_t sizes[3] = {777, (5u << 20) + 3 - 777, n - (5u << 20) - 3};
    log_clear();
    CHECK(dt_write_atomic("s3://data/c/sub/gather.bin", pieces, sizes, 3) == DT_OK, "upload from memory: %s", dt_last_error());
    memset(back, 0, n);
    CHECK(seen("?uploads=") == 1 && seen("partNumber=3&") == 1 && dt_s3_get("s3://data/c/sub/gather.bin", 0, n, back) == DT_OK &&
              !memcmp(big, back, n),
          "12 MiB uploaded from 3 pieces of memory in 3 parts, read back the same: %s", dt_last_error());
    CHECK(dt_write_atomic("s3://data/c/sub/small.bin", pieces, sizes, 1) == DT_OK &&
              dt_s3_get("s3://data/c/sub/small.bin", 0, 777, back) == DT_OK && !memcmp(big, back, 777),
          "a small object uploaded from memory in one PUT: %s", dt_last_error());
    dt_s3_delete("s3://data/c/sub/gather.bin");
    dt_s3_delete("s3://data/c/sub/small.bin");
    dt_rfile *rf;
    CHECK(dt_rfile_open(&rf, "s3://data/c/sub/big.bin") == DT_OK && dt_rfile_size(rf) == n, "rfile opens");
    uint8_t x[100];
    int ok = 1;
    log_clear();
    for (size_t at = 1000; at < 500000; at += 4999) ok &= dt_rfile_read(rf, at, x, 100) == DT_OK && !memcmp(x, big + at, 100);
    CHECK(ok && seen("GET") == 1, "100 small reads through one 1 MiB block: %d GETs", seen("GET"));
    dt_rfile_close(rf);
    free(big);
    free(back);
    char list[1024] = "";
    CHECK(dt_s3_list("s3://data/c", count_names, list) == DT_OK && strstr(list, "a.bin:20") && strstr(list, "sub/:0"),
          "listing: %s", list);
    char **names;
    int nn, kind;
    CHECK(dt_path_list("s3://data/c/sub", &names, &nn) == DT_OK && nn == 1 && !strcmp(names[0], "big.bin"), "path list");
    dt_path_list_free(names, nn);
    CHECK(dt_path_kind("s3://data/c/sub", &kind, NULL) == DT_OK && kind == 2, "a prefix is a directory");
    CHECK(dt_path_kind("s3://data/c/none", &kind, NULL) == DT_OK && kind == 0, "nothing there");
    // a 503 SlowDown twice: retried
    rules("[{\"match\": \"PUT /data/c/retry\", \"count\": 2, \"status\": 503, \"code\": \"SlowDown\"}]");
    log_clear();
    CHECK(dt_s3_put("s3://data/c/retry", "x", 1) == DT_OK && seen("PUT /data/c/retry") == 3,
          "SlowDown retried: %d PUTs: %s", seen("PUT /data/c/retry"), dt_last_error());
    rules("[]");
    CHECK(dt_s3_delete(u) == DT_OK && dt_s3_head(u, &ex, NULL) == DT_OK && !ex, "deleted");
    CHECK(dt_s3_get(u, 0, 1, b) == DT_ERR_IO && strstr(dt_last_error(), "s3://data/c/a.bin: HTTP 404 NoSuchKey"),
          "a missing object named: %s", dt_last_error());
    CHECK(dt_s3_put("s3://nosuchbucket/x", "x", 1) == DT_ERR_IO &&
              strstr(dt_last_error(), "s3://nosuchbucket/x: HTTP 404 NoSuchBucket") &&
              strstr(dt_last_error(), "no such bucket 'nosuchbucket'"),
          "a missing bucket named: %s", dt_last_error());
}

// ---------------------------------------------------------------------------
// 2. runs

static const char *cfg =
    "[model]\ninput = 784\nlayer = linear out=1000\nlayer = relu\nlayer = dropout p=0.2\nlayer = linear out=10\n"
    "[optim]\nname = adamw\nlr = 0.001\n[schedule]\nname = cosine\nwarmup_steps = 5\n"
    "[train]\nbatch = 40\nepochs = 0\nmax_steps = 30\neval_batch = 100\nseed = 5\nthreads = 1\n"
    "[parallel]\ndeterministic = true\n";

static int train(const char *name, int N, const char *extra) {
    return sh("%s train %s --workers %d --quiet --run-dir %s %s 2>&1", tl_dtrain(), tmp("run.ini"), N, tmp(name),
              extra ? extra : "");
}

static int same(const char *a, const char *b) {
    int bw;
    char x[600], y[600];
    snprintf(x, sizeof x, "%s/model.safetensors", tmp(a));
    snprintf(y, sizeof y, "%s/model.safetensors", tmp(b));
    double d = tl_weights_diff(x, y, &bw);
    if (!bw) fprintf(stderr, "%s against %s: max relative difference %.3g\n", b, a, d);
    return bw;
}

static int there(const char *url) {
    int kind;
    return dt_path_kind(url, &kind, NULL) == DT_OK ? kind : -1;
}

// The local file's bytes as object url.
static void upload(const char *path, const char *url) {
    int fd = open(path, O_RDONLY);
    struct stat sb;
    CHECK(fd >= 0 && fstat(fd, &sb) == 0 && dt_s3_put_fd(url, fd, (uint64_t)sb.st_size) == DT_OK, "uploaded %s: %s",
          path, dt_last_error());
    if (fd >= 0) close(fd);
}

// A run's summary.json number array io.KEY, into v[n]; how many.
static int io_numbers(const char *run, const char *key, double *v, int n) {
    char *js = tl_read_file(tl_path(tmp(run), "summary.json"), NULL);
    cJSON *o = js ? cJSON_Parse(js) : NULL, *a = cJSON_GetObjectItem(cJSON_GetObjectItem(o, "io"), key);
    int k = 0;
    for (; a && k < n && k < cJSON_GetArraySize(a); k++) v[k] = cJSON_GetArrayItem(a, k)->valuedouble;
    cJSON_Delete(o);
    free(js);
    return k;
}

static uint64_t object_size(const char *url) {
    int ex;
    uint64_t size = 0;
    dt_s3_head(url, &ex, &size);
    return size;
}

// Each of 2 ranks reads its half of a 6.3 MB training file from s3://
// (plain IDX, and HDF5 through the range-reading driver), and trains what
// the same files read sharded from local disk train: io.ranks_s3_read_bytes
// less the test split's files (read whole) against the training files.
static void test_sharded_bytes(void) {
    char big[300];
    snprintf(big, sizeof big, "%s/bigset", g_tmp);
    sh("mkdir -p %s", big);
    tl_make_images(big, "train", 8000, 3);
    tl_make_images(big, "t10k", 100, 4);
    const char *names[4] = {"train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                            "t10k-labels-idx1-ubyte"};
    double sizes[4];
    for (int i = 0; i < 4; i++) {
        char path[400], url[200];
        snprintf(path, sizeof path, "%s/%s.gz", big, names[i]);  // (plain bytes under the .gz name)
        snprintf(url, sizeof url, "s3://data/big/%s", names[i]);
        upload(path, url);
        sizes[i] = (double)object_size(url);
    }
    char set[400];
    snprintf(set, sizeof set, "--set data.dir=%s --set data.shard=ranks", big);
    int rc = train("bigref", 2, set), rc2 = train("bigs3", 2, "--set data.dir=s3://data/big");
    CHECK(rc == 0 && rc2 == 0 && same("bigref", "bigs3"), "a 6.3 MB IDX set read sharded from s3://: exit %d, %d, bitwise "
          "the local files read sharded\n%s", rc, rc2, g_out);
    double v[2] = {0, 0}, train_bytes = sizes[0] + sizes[1], test_bytes = sizes[2] + sizes[3];
    int n = io_numbers("bigs3", "ranks_s3_read_bytes", v, 2);
    double f0 = (v[0] - test_bytes) / train_bytes, f1 = (v[1] - test_bytes) / train_bytes;
    CHECK(n == 2 && fabs(f0 - 0.5) < 0.005 && fabs(f1 - 0.5) < 0.005,
          "IDX: each rank read its half of the training files from s3:// (%.4f, %.4f of %.0f bytes; %.0f and %.0f in "
          "all, the test split's %.0f whole)", f0, f1, train_bytes, v[0], v[1], test_bytes);
    fprintf(stderr, "sharded IDX from s3://: ranks read %.4f and %.4f of the training files' %.0f bytes\n", f0, f1,
            train_bytes);
    if (!strstr(dt_build_features(), "HDF5 yes")) return;
    char h5[400];
    snprintf(h5, sizeof h5, "%s/big.h5", g_tmp);
    rc = sh("%s convert-data --from idx %s --to %s 2>&1", tl_dtrain(), big, h5);
    upload(h5, "s3://data/big.h5");
    double h5_bytes = (double)object_size("s3://data/big.h5");
    rc2 = train("h5", 2, "--set data.dataset=hdf5 --set data.dir= --set data.file=s3://data/big.h5");
    CHECK(rc == 0 && rc2 == 0 && same("bigref", "h5"), "HDF5 read sharded from s3://: exit %d, %d, bitwise the IDX files "
          "read sharded\n%s", rc, rc2, g_out);
    n = io_numbers("h5", "ranks_s3_read_bytes", v, 2);
    // (of the file: the training rows' half, the test split whole, and the
    // metadata, which a rank reads in 16 KiB blocks at each of its opens of
    // the file: a few blocks whatever the file's size)
    double e0 = v[0] - (train_bytes / 2 + test_bytes), e1 = v[1] - (train_bytes / 2 + test_bytes);
    CHECK(n == 2 && e0 > 0 && e0 < 200000 && e1 > 0 && e1 < 200000,
          "HDF5: each rank read its half of the training rows, the test split and under 200 kB of metadata from the "
          "%.0f-byte file: %.0f and %.0f bytes (%.0f and %.0f beyond the rows)", h5_bytes, v[0], v[1], e0, e1);
    fprintf(stderr, "sharded HDF5 from s3://: ranks read %.3f and %.3f of the %.0f-byte file (%.0f and %.0f bytes beyond "
            "their half of the training rows and the test split)\n", v[0] / h5_bytes, v[1] / h5_bytes, h5_bytes, e0, e1);
}

static void test_runs(void) {
    tl_make_images(g_tmp, "train", 243, 1);
    tl_make_images(g_tmp, "t10k", 100, 2);
    FILE *f = fopen(tmp("run.ini"), "w");
    fprintf(f, "%s[data]\ndir = %s\n", cfg, g_tmp);
    fclose(f);
    int rc = train("ref", 2, NULL);
    CHECK(rc == 0, "uninterrupted local run: exit %d\n%s", rc, g_out);

    // whole checkpoints (9.4 MB: multipart), keep 2; failed at step 18, resumed on 3 workers
    setenv("DTRAIN_FAULT_STEP", "1:18", 1);
    rc = train("whole", 2, "--checkpoint-every 4 --keep 2 --checkpoint-dir s3://ckpt/whole");
    unsetenv("DTRAIN_FAULT_STEP");
    CHECK(rc == 1, "failing run: exit %d", rc);
    CHECK(there("s3://ckpt/whole/step-00000016.safetensors") == 1 && there("s3://ckpt/whole/step-00000012.safetensors") == 1 &&
              there("s3://ckpt/whole/step-00000008.safetensors") == 0,
          "keep 2: steps 12 and 16 in s3://ckpt/whole, 8 deleted");
    rc = train("whole", 3, "--checkpoint-every 4 --keep 2 --checkpoint-dir s3://ckpt/whole --resume auto");
    CHECK(rc == 0 && same("ref", "whole"), "resumed from s3:// on 3 workers: exit %d, bitwise the uninterrupted run\n%s",
          rc, g_out);
    // the credentials are in no file of the run and in none of its output
    const char *id = getenv("AWS_ACCESS_KEY_ID"), *secret = getenv("AWS_SECRET_ACCESS_KEY");
    rc = sh("cat %s/*.* | grep -c -e '%s' -e '%s'", tmp("whole"), id, secret);
    CHECK(!strncmp(g_out, "0", 1) && !strstr(g_out, secret), "no credential in the run directory's files: %s", g_out);

    // sharded on 3, resumed on 2
    setenv("DTRAIN_FAULT_STEP", "1:18", 1);
    rc = train("sharded", 3, "--checkpoint-every 4 --checkpoint-sharded --checkpoint-dir s3://ckpt/sharded");
    unsetenv("DTRAIN_FAULT_STEP");
    CHECK(rc == 1 && there("s3://ckpt/sharded/step-00000016/COMPLETE") == 1 &&
              there("s3://ckpt/sharded/step-00000016/index.json") == 1 &&
              there("s3://ckpt/sharded/step-00000016/shard-00002-of-00003.safetensors") == 1,
          "sharded checkpoint in s3://: exit %d\n%s", rc, g_out);
    rc = sh("%s inspect s3://ckpt/sharded/step-00000016 2>&1", tl_dtrain());
    CHECK(rc == 0 && strstr(g_out, "checksums: ok (every shard's)") && strstr(g_out, "step            16"),
          "inspect s3:// sharded: exit %d\n%s", rc, g_out);
    rc = train("sharded", 2, "--checkpoint-every 4 --checkpoint-sharded --checkpoint-dir s3://ckpt/sharded --resume auto");
    CHECK(rc == 0 && same("ref", "sharded"), "sharded 3 -> 2 from s3://: exit %d\n%s", rc, g_out);

    // a worker killed, the group restarted from the newest checkpoint in s3://
    setenv("DTRAIN_FAULT_STEP", "1:18:kill", 1);
    setenv("DTRAIN_FAULT_ONCE", tmp("killed-once"), 1);
    rc = train("restart", 2, "--checkpoint-every 4 --checkpoint-dir s3://ckpt/restart --max-restarts 2");
    unsetenv("DTRAIN_FAULT_STEP");
    unsetenv("DTRAIN_FAULT_ONCE");
    CHECK(rc == 0 && strstr(g_out, "restarting 2 workers from the newest checkpoint") && same("ref", "restart"),
          "--max-restarts from s3://: exit %d, bitwise the uninterrupted run\n%s", rc, g_out);

    // ZeRO-3: each rank reads its slice
    rc = train("zref", 2, "--zero 3");
    setenv("DTRAIN_FAULT_STEP", "1:18", 1);
    rc = train("zero", 2, "--zero 3 --checkpoint-every 8 --checkpoint-dir s3://ckpt/zero");
    unsetenv("DTRAIN_FAULT_STEP");
    rc = train("zero", 2, "--zero 3 --checkpoint-every 8 --checkpoint-dir s3://ckpt/zero --resume auto");
    CHECK(rc == 0 && same("zref", "zero"), "ZeRO-3 resumed from s3://: exit %d\n%s", rc, g_out);
    char *js = tl_read_file(tl_path(tmp("zero"), "summary.json"), NULL);
    cJSON *o = js ? cJSON_Parse(js) : NULL, *rr = cJSON_GetObjectItem(cJSON_GetObjectItem(o, "io"), "ranks_read_bytes");
    double ck = 0;
    for (int r = 0; r < 2; r++) {
        char p[200];
        snprintf(p, sizeof p, "s3://ckpt/zero/step-00000016/shard-%05d-of-00002.safetensors", r);
        int ex;
        uint64_t s = 0;
        dt_s3_head(p, &ex, &s);
        ck += (double)s;
    }
    double r0 = cJSON_GetArraySize(rr) == 2 ? cJSON_GetArrayItem(rr, 0)->valuedouble / ck : -1,
           r1 = cJSON_GetArraySize(rr) == 2 ? cJSON_GetArrayItem(rr, 1)->valuedouble / ck : -1;
    CHECK(r0 > 1.3 && r0 < 1.6 && r1 > 0.4 && r1 < 0.6,
          "ZeRO-3 resume: rank 0 read %.2f of the checkpoint (its verifying pass and its slice), rank 1 %.2f (its slice)",
          r0, r1);
    fprintf(stderr, "zero-3 resume from s3://: ranks read %.2f and %.2f of the checkpoint's %.0f bytes\n", r0, r1, ck);
    cJSON_Delete(o);
    free(js);

    // readers: export to s3:// and locally, eval from both the same
    rc = sh("%s export s3://ckpt/sharded/step-00000028 -o s3://ckpt/exported.safetensors 2>&1 && %s export "
            "s3://ckpt/sharded/step-00000028 -o %s 2>&1", tl_dtrain(), tl_dtrain(), tmp("exported.safetensors"));
    CHECK(rc == 0, "export from and to s3://: %s", g_out);
    rc = sh("%s eval %s --checkpoint s3://ckpt/exported.safetensors 2>&1", tl_dtrain(), tmp("run.ini"));
    char *e1 = strdup(g_out);
    int rc2 = sh("%s eval %s --checkpoint %s 2>&1", tl_dtrain(), tmp("run.ini"), tmp("exported.safetensors"));
    CHECK(rc == 0 && rc2 == 0 && strstr(e1, "accuracy") && !strcmp(e1, g_out), "eval of s3:// weights:\n%s\n%s", e1,
          g_out);
    free(e1);

    // IDX data from s3://: read sharded (shard = auto), the same model as
    // the local files read sharded; read whole (shard = none), the
    // uninterrupted run's. (The fixture's files are plain bytes: gzip'd for
    // the bucket, a rank inflating them up to its rows' end.)
    const char *idx[] = {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz",
                         "t10k-labels-idx1-ubyte.gz"};
    for (int i = 0; i < 4; i++) {
        char url[200];
        snprintf(url, sizeof url, "s3://data/idx/%s", idx[i]);
        sh("gzip -c %s/%s > %s/real.gz", g_tmp, idx[i], g_tmp);
        upload(tmp("real.gz"), url);
    }
    rc = train("idx", 2, "--set data.dir=s3://data/idx");
    rc2 = train("idxref", 2, "--set data.shard=ranks");
    CHECK(rc == 0 && rc2 == 0 && same("idxref", "idx"),
          "IDX data read sharded from s3:// (gzip): exit %d, bitwise the local files read sharded\n%s", rc, g_out);
    rc = train("idxwhole", 2, "--set data.dir=s3://data/idx --set data.shard=none");
    CHECK(rc == 0 && same("ref", "idxwhole"), "IDX data read whole from s3:// (shard = none): exit %d, bitwise the "
          "local run\n%s", rc, g_out);
    test_sharded_bytes();
}

// GPT: token files from s3://, a checkpoint in s3://, sampled from there
static void test_gpt(void) {
    enum { N = 60000 };
    uint16_t *t = malloc(sizeof *t * N);
    for (int i = 0; i < N; i++) t[i] = (uint16_t)("the quick brown fox jumps over the lazy dog. "[i % 45]);
    CHECK(dt_tokens_write(tmp("tok.bin"), t, N) == DT_OK && dt_tokens_write("s3://data/tok.bin", t, N) == DT_OK,
          "token files written, one to s3://: %s", dt_last_error());
    free(t);
    FILE *f = fopen(tmp("gpt.ini"), "w");
    fprintf(f, "[model]\npreset = gpt-tiny\nblock_size = 32\n[data]\ndataset = tokens\ntrain_file = %s\nval_file = %s\n"
               "[optim]\nname = adamw\nlr = 0.003\n[train]\nbatch = 4\nmax_steps = 6\nthreads = 1\n"
               "[parallel]\ndeterministic = true\n", tmp("tok.bin"), tmp("tok.bin"));
    fclose(f);
    int rc = sh("%s train %s --workers 2 --quiet --run-dir %s --set data.shard=ranks 2>&1", tl_dtrain(), tmp("gpt.ini"),
                tmp("gref"));
    CHECK(rc == 0, "GPT on local tokens, read sharded: %s", g_out);
    rc = sh("%s train %s --workers 2 --quiet --run-dir %s --set data.train_file=s3://data/tok.bin "
            "--set data.val_file=s3://data/tok.bin --checkpoint-every 3 --checkpoint-dir s3://ckpt/gpt 2>&1",
            tl_dtrain(), tmp("gpt.ini"), tmp("gs3"));
    CHECK(rc == 0 && same("gref", "gs3"), "GPT on tokens read sharded from s3://: exit %d, bitwise the local run\n%s", rc,
          g_out);
    rc = sh("%s sample %s --checkpoint s3://ckpt/gpt/step-00000006.safetensors --prompt 'the ' -n 20 --seed 1 2>&1",
            tl_dtrain(), tmp("gpt.ini"));
    char *a = strdup(g_out);
    int rc2 = sh("%s sample %s --checkpoint %s/model.safetensors --prompt 'the ' -n 20 --seed 1 2>&1", tl_dtrain(),
                 tmp("gpt.ini"), tmp("gref"));
    CHECK(rc == 0 && rc2 == 0 && !strcmp(a, g_out), "sample from s3:// is the local model's:\n%s\n%s", a, g_out);
    free(a);
    // 4 ranks, each reading its quarter of a 1.6 MB token file
    enum { N4 = 800000 };
    t = malloc(sizeof *t * N4);
    for (int i = 0; i < N4; i++) t[i] = (uint16_t)("the quick brown fox jumps over the lazy dog. "[i % 45]);
    CHECK(dt_tokens_write("s3://data/tok4.bin", t, N4) == DT_OK, "a token file in s3://: %s", dt_last_error());
    free(t);
    rc = sh("%s train %s --workers 4 --quiet --run-dir %s --set data.train_file=s3://data/tok4.bin --set data.val_file= "
            "--set train.max_steps=2 2>&1", tl_dtrain(), tmp("gpt.ini"), tmp("g4"));
    double v[4] = {0}, size = (double)object_size("s3://data/tok4.bin");
    int n = io_numbers("g4", "ranks_s3_read_bytes", v, 4), ok = n == 4;
    for (int r = 0; r < 4; r++) ok &= fabs((v[r] - 1024) / (size - 1024) - 0.25) < 0.001;
    CHECK(rc == 0 && ok, "4 ranks each read the header and a quarter of the token file from s3://: %.0f %.0f %.0f %.0f of "
          "%.0f bytes: exit %d\n%s", v[0], v[1], v[2], v[3], size, rc, g_out);
}

// Parameter servers' checkpoints in s3://: mode sync (the workers write
// them) failed and resumed, bitwise one process; the recommender's tables
// on the servers (the servers write their shards, rows and sums) resumed
// on 3 servers, bitwise the uninterrupted run; mode async with compression (the servers' shards and
// each worker's codec state), a worker's file and a server's shard each
// lost past the retries: given up, the run goes on.
static const char *cfg_rs =
    "[model]\npreset = dlrm\n[recsys]\ntables = 1000,500,200,100\ndim = 8\ndense = 4\nbottom = 16\ntop = 32\n"
    "train = %s\ntest = %s\ntable_optim = adagrad\ntable_lr = 0.05\n[optim]\nname = adamw\nlr = 0.003\n[train]\n"
    "batch = 100\nepochs = 2\neval_batch = 1000\nseed = 1\n";

// Checkpoint ckpt's tables.rows, every part's in order (malloc'd; *n floats).
static float *ckpt_rows(const char *ckpt, size_t *n) {
    int parts = 0;
    float *all = NULL;
    *n = 0;
    if (dt_ckpt_open_part(ckpt, -1, NULL, &parts) != DT_OK) return NULL;
    for (int p = 0; p < parts; p++) {
        dt_st_file *f;
        if (dt_ckpt_open_part(ckpt, p, &f, &parts) != DT_OK) return free(all), NULL;
        const dt_st_tensor *t = dt_st_find(f, "tables.rows");
        if (t) {
            all = realloc(all, *n * sizeof(float) + t->nbytes);
            dt_st_read(f, t, 0, t->nbytes / sizeof(float), DT_F32, all + *n);
            *n += t->nbytes / sizeof(float);
        }
        dt_st_close(f);
    }
    return all;
}

static int same_rows(const char *a, const char *b) {
    size_t na, nb;
    float *ra = ckpt_rows(a, &na), *rb = ckpt_rows(b, &nb);
    int same = ra && rb && na == nb && na > 0 && !memcmp(ra, rb, na * sizeof(float));
    free(ra);
    free(rb);
    return same;
}

static void test_ps(void) {
    int rc = train("psone", 1, NULL);
    setenv("DTRAIN_FAULT_STEP", "1:18", 1);  // (worker 1)
    int rc1 = train("ps22", 2, "--servers 2 --checkpoint-every 4 --checkpoint-dir s3://ckpt/ps22");
    unsetenv("DTRAIN_FAULT_STEP");
    int rc2 = train("ps22", 2, "--servers 2 --checkpoint-every 4 --checkpoint-dir s3://ckpt/ps22 --resume auto");
    CHECK(rc == 0 && rc1 == 1 && rc2 == 0 && there("s3://ckpt/ps22/step-00000030.safetensors") == 1 && same("psone", "ps22"),
          "parameter servers (sync, 2 x 2): failed at step 18, resumed from s3://: exit %d, %d, %d, bitwise one process\n%s",
          rc, rc1, rc2, g_out);

    dt_clicks_gen g = dt_clicks_gen_default();
    g.train = 6000, g.test = 2000;
    CHECK(dt_clicks_generate(&g, tmp("s.bin"), tmp("st.bin"), NULL) == DT_OK, "clicks: %s", dt_last_error());
    FILE *f = fopen(tmp("rs.ini"), "w");
    fprintf(f, cfg_rs, tmp("s.bin"), tmp("st.bin"));
    fclose(f);
    const char *rs = "%s train %s --workers 2 --quiet --run-dir %s --servers %d --checkpoint-every 25 --checkpoint-dir %s %s 2>&1";
    rc = sh(rs, tl_dtrain(), tmp("rs.ini"), tmp("rs"), 2, "s3://ckpt/rs", "");
    CHECK(rc == 0 && there("s3://ckpt/rs/step-00000075/COMPLETE") == 1 &&
              there("s3://ckpt/rs/step-00000075/shard-00001-of-00002.safetensors") == 1,
          "the recommender's tables on 2 servers, checkpoints in s3://: exit %d\n%s", rc, g_out);
    rc = sh(rs, tl_dtrain(), tmp("rs.ini"), tmp("rs3"), 3, "s3://ckpt/rs3", "--resume s3://ckpt/rs/step-00000075");
    CHECK(rc == 0 && same("rs", "rs3") && same_rows("s3://ckpt/rs/step-00000120", "s3://ckpt/rs3/step-00000120"),
          "the tables' step 75 in s3:// resumed on 3 servers: exit %d, the MLPs and the rows of step 120 bitwise the "
          "uninterrupted run's\n%s", rc, g_out);

    setenv("DTRAIN_S3_RETRY_SECONDS", "2", 1);
    rules("[{\"match\": \"PUT /ckpt/psa/step-00000012/worker-00001-of-00003\\\\.safetensors($|\\\\?)\", \"count\": 1000, "
          "\"drop\": true}, {\"match\": \"PUT /ckpt/psa/step-00000020/shard-00001-of-00002\\\\.safetensors($|\\\\?)\", "
          "\"count\": 1000, \"drop\": true}]");
    const char *psa = "--servers 2 --set ps.mode=async --set compression.method=int8 --set parallel.deterministic=false "
                      "--checkpoint-every 4 --keep 10 --checkpoint-dir s3://ckpt/psa";
    double t0 = dt_now();
    rc = train("psa", 3, psa);
    double took = dt_now() - t0;
    rules("[]");
    unsetenv("DTRAIN_S3_RETRY_SECONDS");
    CHECK(rc == 0 && strstr(g_out, "checkpoint at step 12 not written: s3://ckpt/psa/step-00000012/worker-00001-of-00003") &&
              strstr(g_out, "worker 1 gave it up") &&
              strstr(g_out, "checkpoint at step 20 not written: s3://ckpt/psa/step-00000020/shard-00001-of-00002") &&
              strstr(g_out, "rank 1 gave it up") && there("s3://ckpt/psa/step-00000012/COMPLETE") == 0 &&
              there("s3://ckpt/psa/step-00000020/COMPLETE") == 0 && there("s3://ckpt/psa/step-00000016/COMPLETE") == 1 &&
              there("s3://ckpt/psa/step-00000030/COMPLETE") == 1 && took < 60,
          "async with compression: a worker's codec state and a server's shard lost past the retries, both checkpoints "
          "given up, the run went on (%.0f s): exit %d\n%s", took, rc, g_out);
    rc = sh("%s inspect s3://ckpt/psa/step-00000016 2>&1", tl_dtrain());
    CHECK(rc == 0 && strstr(g_out, "checksums: ok"), "the servers' step 16 in s3:// verifies: exit %d\n%s", rc, g_out);
}

// ---------------------------------------------------------------------------
// 3. faults

static void test_credentials(void) {
    const struct { const char *env, *want; } cases[] = {
        {"AWS_SECRET_ACCESS_KEY=wrong", "SignatureDoesNotMatch"},
        {"AWS_ACCESS_KEY_ID=NOSUCHKEY", "InvalidAccessKeyId"},
        {"AWS_ACCESS_KEY_ID= AWS_SECRET_ACCESS_KEY=", "no credentials: set AWS_ACCESS_KEY_ID"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        int rc = sh("env %s %s train %s --workers 2 --quiet --run-dir %s --checkpoint-every 4 "
                    "--checkpoint-dir s3://ckpt/creds 2>&1", cases[i].env, tl_dtrain(), tmp("run.ini"), tmp("creds"));
        CHECK(rc == 1 && strstr(g_out, "s3://ckpt/creds") && strstr(g_out, cases[i].want) &&
                  access(tl_path(tmp("creds"), "model.safetensors"), F_OK) != 0,
              "%s: the run refused before training, naming the object and %s: exit %d\n%s", cases[i].env,
              cases[i].want, rc, g_out);
        rc = sh("env %s %s inspect s3://ckpt/whole/step-00000030.safetensors 2>&1", cases[i].env, tl_dtrain());
        CHECK(rc == 1 && strstr(g_out, "s3://ckpt/whole/step-00000030.safetensors") && strstr(g_out, cases[i].want),
              "%s: inspect refused naming the object: exit %d\n%s", cases[i].env, rc, g_out);
    }
    int rc = train("nobucket", 2, "--checkpoint-every 4 --checkpoint-dir s3://nosuchbucket/run");
    CHECK(rc == 1 && strstr(g_out, "no such bucket 'nosuchbucket'"), "missing bucket: exit %d\n%s", rc, g_out);
    rc = train("nobucket", 2, "--resume s3://nosuchbucket/run");
    CHECK(rc == 1 && strstr(g_out, "no such bucket 'nosuchbucket'"), "resume from a missing bucket: exit %d\n%s", rc,
          g_out);
    // (a config that names its server)
    rc = train("nobucket", 2, "--set s3.endpoint=ftp://x --checkpoint-dir s3://ckpt/y");
    CHECK(rc != 0 && strstr(g_out, "[s3] endpoint: expected a URL"), "a bad [s3] endpoint: exit %d\n%s", rc, g_out);
}

static void test_replies(void) {
    // 503 SlowDown on the upload of step 8, 500 on reads while resuming
    rules("[{\"match\": \"PUT /ckpt/slow/step-00000008\", \"count\": 3, \"status\": 503, \"code\": \"SlowDown\"},"
          " {\"match\": \"GET /ckpt/slow/step-00000016\", \"count\": 2, \"status\": 500, \"code\": \"InternalError\"}]");
    setenv("DTRAIN_FAULT_STEP", "1:18", 1);
    int rc = train("slow", 2, "--checkpoint-every 4 --checkpoint-dir s3://ckpt/slow");
    unsetenv("DTRAIN_FAULT_STEP");
    CHECK(rc == 1 && strstr(g_out, "HTTP 503 SlowDown") && strstr(g_out, "retrying") &&
              there("s3://ckpt/slow/step-00000008.safetensors") == 1,
          "SlowDown retried, the checkpoint written: exit %d\n%s", rc, g_out);
    rc = train("slow", 2, "--checkpoint-every 4 --checkpoint-dir s3://ckpt/slow --resume auto");
    CHECK(rc == 0 && strstr(g_out, "HTTP 500 InternalError") && same("ref", "slow"),
          "500s while resuming retried: exit %d\n%s", rc, g_out);
    rules("[]");
}

// The gateway killed while a run checkpoints to it, started again: the run
// goes on, each checkpoint completes once it is back.
static void test_server_stopped(void) {
    log_clear();
    // (the proxy holds part 2 of step 8's upload for 3 s: it reaches the
    // gateway once the gateway is gone)
    rules("[{\"match\": \"PUT /ckpt/stopped/step-00000008.safetensors\\\\?partNumber=2\", \"count\": 1, \"delay\": 3}]");
    char rcf[600];
    snprintf(rcf, sizeof rcf, "%s", tmp("stopped.rc"));
    unlink(rcf);
    sh("(DTRAIN_SLOW_RANK='*:60' %s train %s --workers 2 --quiet --run-dir %s --checkpoint-every 4 "
       "--checkpoint-dir s3://ckpt/stopped >%s 2>&1; echo $? >%s) >/dev/null 2>&1 &",
       tl_dtrain(), tmp("run.ini"), tmp("stopped"), tmp("stopped.log"), rcf);
    double t0 = dt_now();
    while (!seen("PUT /ckpt/stopped/step-00000008.safetensors?partNumber=2") && dt_now() - t0 < 120) usleep(2000);
    int rc = sh("tests/s3_server.sh stop-gw %s 2>&1", g_srv);
    CHECK(rc == 0 && seen("PUT /ckpt/stopped/step-00000008"), "the gateway killed during the upload of step 8: %s",
          g_out);
    sleep(4);
    rules("[]");
    rc = sh("tests/s3_server.sh start-gw %s 2>&1", g_srv);
    CHECK(rc == 0, "the gateway started again: %s", g_out);
    char *r = NULL;
    for (t0 = dt_now(); !(r = tl_read_file(rcf, NULL)) && dt_now() - t0 < 240;) usleep(100000);
    char *out = tl_read_file(tmp("stopped.log"), NULL);
    CHECK(r && atoi(r) == 0 && out && strstr(out, "retrying") && same("ref", "stopped"),
          "the run went on through the outage: exit %s, bitwise the uninterrupted run\n%s", r ? r : "(none)",
          out ? out : "");
    for (int s = 4; s <= 28; s += 4) {
        char u[200];
        snprintf(u, sizeof u, "s3://ckpt/stopped/step-%08d.safetensors", s);
        if (s >= 24) CHECK(there(u) == 1, "%s written", u);
    }
    free(r);
    free(out);
}

// [checkpoint] staging = pieces (a model in parts, tensor parallel, its
// shards written a piece at a time while training waits): rank 1's shard of
// step 12 cannot be uploaded past the retries: the checkpoint is given up
// on every rank, never marked complete, and training goes on (to a failure
// at step 14); the resume falls back to step 8, and the resumed run, whose
// last checkpoint is lost too, exits 1 saying so with the uninterrupted
// run's weights.
static void test_gone_pieces(void) {
    const char *tp = "--set parallel.tensor=2 --set checkpoint.staging=pieces --checkpoint-every 4 "
                     "--checkpoint-dir s3://ckpt/pieces";
    int rc = train("tpref", 2, "--set parallel.tensor=2");
    rules("[{\"match\": \"PUT /ckpt/pieces/step-00000012/shard-00001-of-00002\", \"count\": 1000, \"drop\": true}]");
    setenv("DTRAIN_FAULT_STEP", "0:14", 1);
    int rc1 = train("pieces", 2, tp);
    unsetenv("DTRAIN_FAULT_STEP");
    rules("[]");
    CHECK(rc == 0 && rc1 == 1 && strstr(g_out, "checkpoint at step 12 not written: s3://ckpt/pieces/step-00000012/shard-00001") &&
              strstr(g_out, "training goes on") && strstr(g_out, "injected fault (DTRAIN_FAULT_STEP") &&
              there("s3://ckpt/pieces/step-00000012/COMPLETE") == 0 && there("s3://ckpt/pieces/step-00000008/COMPLETE") == 1,
          "staging = pieces: rank 1's shard of step 12 lost, the checkpoint given up, training went on: exit %d, %d\n%s", rc,
          rc1, g_out);
    char flags[300];
    snprintf(flags, sizeof flags, "%s --resume auto", tp);
    rules("[{\"match\": \"PUT /ckpt/pieces/step-00000030/shard-00000\", \"count\": 1000, \"drop\": true}]");
    rc = train("pieces", 2, flags);
    rules("[]");
    CHECK(rc == 1 && strstr(g_out, "skipping s3://ckpt/pieces/step-00000012: its writing never finished") &&
              strstr(g_out, "the run's last checkpoint at step 30 not written") &&
              strstr(g_out, "the newest checkpoint is s3://ckpt/pieces/step-00000028:") && same("tpref", "pieces"),
          "staging = pieces: resumed from step 8, its last checkpoint lost: exit %d, bitwise the uninterrupted run\n%s", rc,
          g_out);
}

// The server unreachable for longer than the retries: the checkpoint is
// given up (never marked complete); the run goes on; resume falls back.
static void test_gone(void) {
    setenv("DTRAIN_S3_RETRY_SECONDS", "2", 1);
    rules("[{\"match\": \"/ckpt/gone/step-000000(12|16)/(index.json|COMPLETE)\", \"count\": 1000, \"drop\": true}]");
    setenv("DTRAIN_FAULT_STEP", "0:17", 1);
    int rc = train("gone", 2, "--checkpoint-every 4 --checkpoint-sharded --checkpoint-dir s3://ckpt/gone");
    unsetenv("DTRAIN_FAULT_STEP");
    rules("[]");
    CHECK(rc == 1 && strstr(g_out, "checkpoint at step 12 not written") && strstr(g_out, "training goes on") &&
              there("s3://ckpt/gone/step-00000012/shard-00000-of-00002.safetensors") == 1 &&
              there("s3://ckpt/gone/step-00000012/COMPLETE") == 0,
          "step 12 given up after the retries, never marked complete: exit %d\n%s", rc, g_out);
    rc = train("gone", 2, "--checkpoint-every 4 --checkpoint-sharded --checkpoint-dir s3://ckpt/gone --resume auto");
    CHECK(rc == 0 && strstr(g_out, "skipping s3://ckpt/gone/step-00000016: its writing never finished") &&
              strstr(g_out, "skipping s3://ckpt/gone/step-00000012: its writing never finished") &&
              same("ref", "gone"),
          "resume fell back to step 8: exit %d\n%s", rc, g_out);
    // a run that goes on past a given-up checkpoint: keep counts complete
    // ones, and the unfinished one goes once a complete one is newer
    rules("[{\"match\": \"PUT /ckpt/gone2/step-00000012/(index.json|COMPLETE)\", \"count\": 1000, \"drop\": true}]");
    rc = train("gone2", 2, "--checkpoint-every 4 --checkpoint-sharded --keep 2 --checkpoint-dir s3://ckpt/gone2");
    rules("[]");
    CHECK(rc == 0 && strstr(g_out, "checkpoint at step 12 not written") && there("s3://ckpt/gone2/step-00000012") == 0 &&
              there("s3://ckpt/gone2/step-00000024") == 0 && there("s3://ckpt/gone2/step-00000028/COMPLETE") == 1 &&
              there("s3://ckpt/gone2/step-00000030/COMPLETE") == 1,
          "given up at step 12, the run went on; keep 2 left steps 28 and 30: exit %d\n%s", rc, g_out);
    // the run's last checkpoint lost: exit 1, saying so
    rules("[{\"match\": \"/ckpt/last/step-00000030\", \"count\": 1000, \"drop\": true}]");
    rc = train("last", 2, "--checkpoint-every 10 --checkpoint-dir s3://ckpt/last");
    rules("[]");
    CHECK(rc == 1 && strstr(g_out, "the run's last checkpoint at step 30 not written: s3://ckpt/last/step-00000030"),
          "a run whose last checkpoint is lost: exit %d\n%s", rc, g_out);
    test_gone_pieces();
    unsetenv("DTRAIN_S3_RETRY_SECONDS");
}

// An object cut short: refused naming it; resume falls back.
static void test_truncated(void) {
    const char *u = "s3://ckpt/sharded/step-00000030/shard-00001-of-00002.safetensors";
    uint8_t *b;
    size_t len;
    CHECK(dt_s3_get_all(u, 1 << 30, &b, &len) == DT_OK && dt_s3_put(u, b, len / 2) == DT_OK, "truncated %s", u);
    free(b);
    int rc = sh("%s inspect s3://ckpt/sharded/step-00000030 2>&1", tl_dtrain());
    CHECK(rc == 1 && strstr(g_out, "s3://ckpt/sharded/step-00000030/index.json") &&
              strstr(g_out, "shard-00001-of-00002.safetensors has "),
          "inspect refuses, naming the shard: exit %d\n%s", rc, g_out);
    rc = train("trunc", 2, "--checkpoint-every 4 --checkpoint-sharded --checkpoint-dir s3://ckpt/sharded --resume auto");
    CHECK(rc == 0 && strstr(g_out, "skipping damaged checkpoint: s3://ckpt/sharded/step-00000030") &&
              strstr(g_out, "shard-00001-of-00002.safetensors has ") && same("ref", "trunc"),
          "resume fell back past the truncated shard (to step 28): exit %d\n%s", rc, g_out);
    const char *w = "s3://ckpt/whole/step-00000030.safetensors";
    CHECK(dt_s3_get_all(w, 1 << 30, &b, &len) == DT_OK && dt_s3_put(w, b, len - 100) == DT_OK, "truncated %s", w);
    free(b);
    rc = sh("%s eval %s --checkpoint %s 2>&1", tl_dtrain(), tmp("run.ini"), w);
    CHECK(rc == 1 && strstr(g_out, w), "eval refuses the truncated checkpoint, naming it: exit %d\n%s", rc, g_out);
}

int main(void) {
    snprintf(g_tmp, sizeof g_tmp, "/tmp/dtrain-test-s3-XXXXXX");
    if (!mkdtemp(g_tmp)) return perror("mkdtemp"), 1;
    if (!dt_s3_available()) {
        tl_skip("this build has no libcurl: s3:// paths are refused (install libcurl4-openssl-dev and rebuild)");
        rmdir(g_tmp);
        return tl_finish();
    }
    setenv("DTRAIN_S3_PART_MB", "5", 1);  // (multipart uploads for objects over 5 MiB)
    setenv("DTRAIN_S3_RETRY_SECONDS", "90", 1);
    unsetenv("DTRAIN_FAULT_STEP");
    if (start() == 0) {
        test_client();
        test_runs();
        test_gpt();
        test_ps();
        test_credentials();
        test_replies();
        test_server_stopped();
        test_gone();
        test_truncated();
    }
    stop_all();
    g_srv[0] = 0, g_proxy_pid = -1;
    tl_cleanup(g_tmp);
    return tl_finish();
}
