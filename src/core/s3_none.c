/* Object storage in a build without libcurl (CMakeLists.txt: DTRAIN_S3):
 * every call refuses by name, saying how to get it. */
#include "core/s3.h"

#include <string.h>

static dt_status missing(const char *url) {
    return dt_error(DT_ERR_ARG, "%.200s: s3:// paths need libcurl, which this build of dtrain lacks (install "
                    "libcurl4-openssl-dev and rebuild)", url);
}

int dt_s3_is_url(const char *path) { return path && !strncmp(path, "s3://", 5); }
int dt_s3_available(void) { return 0; }
uint64_t dt_s3_bytes_read(void) { return 0; }
void dt_s3_configure(const char *endpoint, const char *region) { (void)endpoint, (void)region; }

dt_status dt_s3_head(const char *url, int *exists, uint64_t *size) {
    *exists = 0;
    if (size) *size = 0;
    return missing(url);
}

dt_status dt_s3_stat(const char *url, int *exists, uint64_t *size) { return dt_s3_head(url, exists, size); }

dt_status dt_s3_get(const char *url, uint64_t off, size_t n, void *dst) {
    (void)off, (void)n, (void)dst;
    return missing(url);
}

dt_status dt_s3_get_all(const char *url, size_t max, uint8_t **buf, size_t *len) {
    (void)max;
    *buf = NULL;
    *len = 0;
    return missing(url);
}

dt_status dt_s3_put(const char *url, const void *data, size_t n) {
    (void)data, (void)n;
    return missing(url);
}

dt_status dt_s3_put_fd(const char *url, int fd, uint64_t size) {
    (void)fd, (void)size;
    return missing(url);
}

dt_status dt_s3_put_parts(const char *url, const void *const *parts, const size_t *sizes, int n) {
    (void)parts, (void)sizes, (void)n;
    return missing(url);
}

dt_status dt_s3_delete(const char *url) { return missing(url); }

dt_status dt_s3_list(const char *url, int (*fn)(void *user, const char *name, uint64_t size, int is_dir),
                     void *user) {
    (void)fn, (void)user;
    return missing(url);
}

dt_status dt_s3_check_bucket(const char *url) { return missing(url); }
