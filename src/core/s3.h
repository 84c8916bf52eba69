/* Objects in S3-compatible storage: a small client over libcurl, whose
 * requests are signed with AWS Signature Version 4 (CURLOPT_AWS_SIGV4).
 * Addressed as "s3://BUCKET/KEY"; the server is AWS_ENDPOINT_URL_S3 or
 * AWS_ENDPOINT_URL (else [s3] endpoint, dt_s3_configure; else AWS's
 * https://s3.REGION.amazonaws.com), path-style (ENDPOINT/BUCKET/KEY); the
 * region AWS_REGION or AWS_DEFAULT_REGION (else [s3] region, else
 * us-east-1); the credentials AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and
 * AWS_SESSION_TOKEN, read from the environment alone and never printed
 * (without them requests go unsigned: public buckets).
 *
 * Every request has a timeout (10 s to connect; a stall of
 * DTRAIN_S3_TIMEOUT seconds, default 30, with no byte moving ends it) and
 * is retried with exponential backoff (0.25 s doubling to 8 s, with
 * jitter) on a connection error, a timeout, a 5xx reply or throttling
 * (429, SlowDown), for up to DTRAIN_S3_RETRY_SECONDS (default 120) in all;
 * other replies (403, 404, ...) are errors at once. Errors name the object
 * and what the server said (its S3 error code), DT_ERR_IO.
 *
 * Built without libcurl (CMakeLists.txt: DTRAIN_S3), every call refuses by
 * name (s3_none.c). */
#ifndef DT_CORE_S3_H
#define DT_CORE_S3_H

#include "dtrain/core.h"

#include <stdint.h>

/* Whether path is "s3://..." (then every other call here takes it). */
int dt_s3_is_url(const char *path);

/* Size of object url; *exists 0 (and DT_OK) when there is none. A missing
 * bucket is an error naming it. */
dt_status dt_s3_head(const char *url, int *exists, uint64_t *size);

/* The same without asking, on a 404, whether the bucket exists (a HEAD's
 * 404 does not say): for a caller whose next request would say so (a
 * listing), one request instead of two. */
dt_status dt_s3_stat(const char *url, int *exists, uint64_t *size);

/* Bytes [off, off + n) of object url into dst: all of them, or DT_ERR_IO
 * saying where the object ends (truncated). */
dt_status dt_s3_get(const char *url, uint64_t off, size_t n, void *dst);

/* The whole object, at most max bytes (more: DT_ERR_FORMAT), into a
 * malloc'd *buf of *len bytes. */
dt_status dt_s3_get_all(const char *url, size_t max, uint8_t **buf, size_t *len);

/* Object url made from data[n] (one PUT). */
dt_status dt_s3_put(const char *url, const void *data, size_t n);

/* Object url made from the first `size` bytes of fd (read with pread): one
 * PUT, or a multipart upload in parts of DTRAIN_S3_PART_MB MiB (default
 * 16, at least 5) when larger, aborted on failure. Readers see the old
 * object or the whole new one, never a part. */
dt_status dt_s3_put_fd(const char *url, int fd, uint64_t size);

/* The same from the caller's memory: the object is parts[0..n) one after
 * another (sizes[i] bytes each), sent from there as curl asks for them (no
 * copy staged: the parts must not change until it returns). */
dt_status dt_s3_put_parts(const char *url, const void *const *parts, const size_t *sizes, int n);

/* Removes object url (a missing one too: DT_OK). */
dt_status dt_s3_delete(const char *url);

/* The names directly under prefix url + "/" (the object's name after it,
 * or a "directory": the next path component of longer keys, once), each
 * given to fn with its size (0 for a directory) and whether it is one; fn
 * returns nonzero to stop. A prefix with nothing under it lists nothing.
 * A missing bucket is an error. */
dt_status dt_s3_list(const char *url, int (*fn)(void *user, const char *name, uint64_t size, int is_dir),
                     void *user);

/* Whether bucket of url exists and answers (DT_OK), else an error naming it. */
dt_status dt_s3_check_bucket(const char *url);

#endif
