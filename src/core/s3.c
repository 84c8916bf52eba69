/* The S3 client (s3.h): libcurl does HTTP and the SigV4 signature; this
 * file builds the requests of S3's REST API (GET with a range, PUT,
 * multipart uploads, ListObjectsV2, HEAD, DELETE), retries them, and reads
 * the few fields it needs from the XML replies. */
#include "core/s3.h"

#include <curl/curl.h>

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

// ----------------------------------------------------------------------------
// settings: the environment, read once (and [s3] from a config)

static struct {
    char endpoint[512], region[64];
    const char *key_id, *secret, *token;  // the environment's own strings: never copied, never printed
    double retry_seconds, stall_seconds;
    size_t part;
    char cfg_endpoint[512], cfg_region[64];
} S;
static pthread_once_t S_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t S_mu = PTHREAD_MUTEX_INITIALIZER;

static const char *env(const char *name) {
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

static double env_num(const char *name, double dflt, double lo, double hi) {
    const char *v = env(name);
    char *end;
    double x = v ? strtod(v, &end) : dflt;
    if (v && (*end || x < lo || x > hi)) {
        dt_log(DT_LOG_WARN, "%s = '%.40s' is not a number from %g to %g; using %g", name, v, lo, hi, dflt);
        x = dflt;
    }
    return x;
}

static void settings_init(void) {
    curl_global_init(CURL_GLOBAL_DEFAULT);
    S.key_id = env("AWS_ACCESS_KEY_ID");
    S.secret = env("AWS_SECRET_ACCESS_KEY");
    S.token = env("AWS_SESSION_TOKEN");
    S.retry_seconds = env_num("DTRAIN_S3_RETRY_SECONDS", 120, 0, 86400);
    S.stall_seconds = env_num("DTRAIN_S3_TIMEOUT", 30, 1, 3600);
    S.part = (size_t)env_num("DTRAIN_S3_PART_MB", 16, 5, 4096) << 20;
}

// The endpoint and region now (the environment first, then the config's).
static void settings(char *endpoint, size_t ne, char *region, size_t nr) {
    pthread_once(&S_once, settings_init);
    pthread_mutex_lock(&S_mu);
    const char *r = env("AWS_REGION");
    if (!r) r = env("AWS_DEFAULT_REGION");
    if (!r) r = S.cfg_region[0] ? S.cfg_region : "us-east-1";
    snprintf(region, nr, "%s", r);
    const char *e = env("AWS_ENDPOINT_URL_S3");
    if (!e) e = env("AWS_ENDPOINT_URL");
    if (!e && S.cfg_endpoint[0]) e = S.cfg_endpoint;
    if (e) snprintf(endpoint, ne, "%s", e);
    else snprintf(endpoint, ne, "https://s3.%s.amazonaws.com", region);
    size_t l = strlen(endpoint);
    while (l && endpoint[l - 1] == '/') endpoint[--l] = 0;
    pthread_mutex_unlock(&S_mu);
}

void dt_s3_configure(const char *endpoint, const char *region) {
    pthread_once(&S_once, settings_init);
    pthread_mutex_lock(&S_mu);
    snprintf(S.cfg_endpoint, sizeof S.cfg_endpoint, "%s", endpoint ? endpoint : "");
    snprintf(S.cfg_region, sizeof S.cfg_region, "%s", region ? region : "");
    pthread_mutex_unlock(&S_mu);
}

int dt_s3_available(void) { return 1; }

// ----------------------------------------------------------------------------
// names: s3://BUCKET/KEY, and the encoding of paths and query values

int dt_s3_is_url(const char *path) { return path && !strncmp(path, "s3://", 5); }

typedef struct {
    char bucket[64];
    char key[1100];
} s3_name;

static dt_status parse_url(const char *url, s3_name *n) {
    const char *b = url + 5, *slash = strchr(b, '/');
    size_t bl = slash ? (size_t)(slash - b) : strlen(b);
    int ok = dt_s3_is_url(url) && bl >= 3 && bl <= 63;
    for (size_t i = 0; ok && i < bl; i++) ok = islower((unsigned char)b[i]) || isdigit((unsigned char)b[i]) || b[i] == '-' || b[i] == '.';
    if (!ok)
        return dt_error(DT_ERR_ARG, "%.200s: not an S3 URL s3://BUCKET/KEY (a bucket name of 3 to 63 lower-case "
                        "letters, digits, '-' and '.')", url);
    memcpy(n->bucket, b, bl);
    n->bucket[bl] = 0;
    const char *k = slash ? slash + 1 : "";
    if (strlen(k) >= sizeof n->key) return dt_error(DT_ERR_ARG, "%.200s...: key longer than 1024 bytes", url);
    snprintf(n->key, sizeof n->key, "%s", k);
    return DT_OK;
}

// s percent-encoded into out (n bytes): all but A-Z a-z 0-9 - _ . ~ (and /
// where keep_slash), as SigV4's canonical form wants.
static int encode(char *out, size_t n, const char *s, int keep_slash) {
    size_t o = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (isalnum(*p) || *p == '-' || *p == '_' || *p == '.' || *p == '~' || (keep_slash && *p == '/')) {
            if (o + 1 >= n) return 0;
            out[o++] = (char)*p;
        } else {
            if (o + 3 >= n) return 0;
            o += (size_t)snprintf(out + o, n - o, "%%%02X", *p);
        }
    }
    out[o] = 0;
    return 1;
}

// ----------------------------------------------------------------------------
// curl handles: a small pool, so that connections are kept between requests

#define POOL 8
static pthread_mutex_t pool_mu = PTHREAD_MUTEX_INITIALIZER;
static CURL *pool[POOL];
static int npool;
static pid_t pool_pid;

static CURL *take_handle(void) {
    CURL *h = NULL;
    pthread_mutex_lock(&pool_mu);
    if (pool_pid != getpid()) npool = 0, pool_pid = getpid();  // (a forked child: the parent's connections are not its own)
    if (npool) h = pool[--npool];
    pthread_mutex_unlock(&pool_mu);
    if (h) curl_easy_reset(h);
    else h = curl_easy_init();
    return h;
}

static void give_handle(CURL *h) {
    pthread_mutex_lock(&pool_mu);
    if (npool < POOL && pool_pid == getpid()) pool[npool++] = h, h = NULL;
    pthread_mutex_unlock(&pool_mu);
    if (h) curl_easy_cleanup(h);
}

// ----------------------------------------------------------------------------
// one request, retried

typedef struct {
    uint8_t *p;
    size_t len, cap, max;  // max: more is an overflow
    int over;
} buf_t;

static int buf_add(buf_t *b, const void *d, size_t n) {
    if (b->len + n > b->max) {
        b->over = 1;
        return 0;
    }
    if (b->len + n + 1 > b->cap) {
        size_t c = b->cap ? b->cap : 4096;
        while (c < b->len + n + 1) c *= 2;
        uint8_t *q = realloc(b->p, c);
        if (!q) return 0;
        b->p = q;
        b->cap = c;
    }
    memcpy(b->p + b->len, d, n);
    b->len += n;
    b->p[b->len] = 0;
    return 1;
}

// An object's bytes as the caller holds them: n parts, one after another.
typedef struct {
    const void *const *p;
    const size_t *len;
    int n;
} gather_t;

// Bytes [off, off + n) of g into dst.
static void gather_copy(const gather_t *g, uint64_t off, uint8_t *dst, size_t n) {
    for (int i = 0; i < g->n && n; i++) {
        if (off >= g->len[i]) {
            off -= g->len[i];
            continue;
        }
        size_t k = g->len[i] - off < n ? (size_t)(g->len[i] - off) : n;
        memcpy(dst, (const uint8_t *)g->p[i] + off, k);
        dst += k, n -= k, off = 0;
    }
}

typedef struct {
    const char *method;             // GET, HEAD, PUT, POST, DELETE
    const char *url;                // s3://... (messages)
    s3_name name;
    const char *query;              // canonical: keys sorted, values encoded; NULL none
    uint64_t range_off;             // a ranged GET of range_len bytes (0: none)
    size_t range_len;
    const uint8_t *body;            // PUT/POST body
    const gather_t *gather;         // ... or a PUT's bytes [gather_off, gather_off + body_len) of these
    uint64_t gather_off;
    size_t body_len, body_at;
    uint8_t *dst;                   // a ranged GET's bytes (range_len of them)
    size_t got;
    buf_t out;                      // any other reply body (list, upload id), out.max bytes at most
    buf_t err;                      // an error reply's body
    CURL *h;
    long code;
    char etag[160];
    curl_off_t length;              // Content-Length of a HEAD
} s3_req;

static size_t on_body(char *d, size_t sz, size_t nm, void *user) {
    s3_req *q = user;
    size_t n = sz * nm;
    long code = 0;
    curl_easy_getinfo(q->h, CURLINFO_RESPONSE_CODE, &code);
    if (code >= 300) {
        if (q->err.len + n <= q->err.max) buf_add(&q->err, d, n);
        return n;
    }
    if (q->dst) {
        if (q->got + n > q->range_len) return 0;  // (more than asked: the transfer stops)
        memcpy(q->dst + q->got, d, n);
        q->got += n;
        return n;
    }
    return buf_add(&q->out, d, n) ? n : 0;
}

static size_t on_send(char *d, size_t sz, size_t nm, void *user) {
    s3_req *q = user;
    size_t n = sz * nm, left = q->body_len - q->body_at;
    if (n > left) n = left;
    if (q->gather) gather_copy(q->gather, q->gather_off + q->body_at, (uint8_t *)d, n);
    else memcpy(d, q->body + q->body_at, n);
    q->body_at += n;
    return n;
}

static size_t on_header(char *d, size_t sz, size_t nm, void *user) {
    s3_req *q = user;
    size_t n = sz * nm;
    if (n > 5 && !strncasecmp(d, "etag:", 5)) {
        const char *v = d + 5;
        while (*v == ' ') v++;
        size_t l = n - (size_t)(v - d);
        while (l && (v[l - 1] == '\r' || v[l - 1] == '\n' || v[l - 1] == ' ')) l--;
        if (l < sizeof q->etag) memcpy(q->etag, v, l), q->etag[l] = 0;
    }
    return n;
}

// The text of XML element <tag> in s (the first one), entities decoded,
// into out (n bytes); 0 when there is none.
static int xml_get(const char *s, const char *tag, char *out, size_t n) {
    char open[64], close[64];
    snprintf(open, sizeof open, "<%s>", tag);
    snprintf(close, sizeof close, "</%s>", tag);
    const char *a = s ? strstr(s, open) : NULL, *b;
    if (!a || !(b = strstr(a += strlen(open), close))) return 0;
    size_t o = 0;
    static const struct { const char *e; char c; } ents[] = {{"&amp;", '&'}, {"&lt;", '<'}, {"&gt;", '>'},
                                                            {"&quot;", '"'}, {"&apos;", '\''}};
    while (a < b && o + 1 < n) {
        int done = 0;
        for (size_t i = 0; i < sizeof ents / sizeof ents[0] && *a == '&' && !done; i++)
            if (!strncmp(a, ents[i].e, strlen(ents[i].e))) out[o++] = ents[i].c, a += strlen(ents[i].e), done = 1;
        if (!done && *a == '&' && a[1] == '#') {
            char *e;
            long c = a[2] == 'x' ? strtol(a + 3, &e, 16) : strtol(a + 2, &e, 10);
            if (*e == ';' && c > 0 && c < 128) out[o++] = (char)c, a = e + 1, done = 1;
        }
        if (!done) out[o++] = *a++;
    }
    out[o] = 0;
    return 1;
}

static int transient_curl(CURLcode rc) {
    return rc == CURLE_COULDNT_CONNECT || rc == CURLE_OPERATION_TIMEDOUT || rc == CURLE_SEND_ERROR ||
           rc == CURLE_RECV_ERROR || rc == CURLE_GOT_NOTHING || rc == CURLE_PARTIAL_FILE ||
           rc == CURLE_COULDNT_RESOLVE_HOST || rc == CURLE_SSL_CONNECT_ERROR || rc == CURLE_HTTP2 ||
           rc == CURLE_HTTP2_STREAM;
}

static int transient_http(long code, const char *s3code) {
    return code == 500 || code == 502 || code == 503 || code == 504 || code == 429 ||
           !strcmp(s3code, "SlowDown") || !strcmp(s3code, "RequestTimeout") || !strcmp(s3code, "InternalError");
}

// What an S3 error code means for the user (credentials are named, never shown).
static const char *hint(long code, const char *s3code) {
    if (!strcmp(s3code, "SignatureDoesNotMatch"))
        return "the request's signature does not match: a wrong AWS_SECRET_ACCESS_KEY (or AWS_REGION)";
    if (!strcmp(s3code, "InvalidAccessKeyId")) return "the server does not know this access key (AWS_ACCESS_KEY_ID)";
    if (!strcmp(s3code, "AccessDenied") || code == 403)
        return S.key_id && S.secret ? "access denied to these credentials"
                                    : "access denied (no credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)";
    if (!strcmp(s3code, "NoSuchBucket")) return "no such bucket";
    if (!strcmp(s3code, "NoSuchKey") || code == 404) return "no such object";
    if (!strcmp(s3code, "SlowDown") || code == 429) return "the server asks to slow down (throttled)";
    if (code >= 500) return "the server failed";
    return "refused";
}

static void set_common(s3_req *q, const char *endpoint, const char *region, struct curl_slist **hdrs) {
    CURL *h = q->h;
    char path[3400], url[4200];
    encode(path, sizeof path, q->name.key, 1);
    snprintf(url, sizeof url, "%s/%s%s%s%s%s", endpoint, q->name.bucket, q->name.key[0] || q->query ? "/" : "", path,
             q->query ? "?" : "", q->query ? q->query : "");
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT, 10L);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, (long)S.stall_seconds);
    size_t bytes = q->range_len + q->body_len;
    curl_easy_setopt(h, CURLOPT_TIMEOUT, (long)(4 * S.stall_seconds + 60 + (double)bytes / (1 << 20)));
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, q);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, q);
    if (S.key_id && S.secret) {
        char sig[128];
        snprintf(sig, sizeof sig, "aws:amz:%s:s3", region);
        curl_easy_setopt(h, CURLOPT_AWS_SIGV4, sig);
        curl_easy_setopt(h, CURLOPT_USERNAME, S.key_id);
        curl_easy_setopt(h, CURLOPT_PASSWORD, S.secret);
    }
    *hdrs = curl_slist_append(*hdrs, "x-amz-content-sha256: UNSIGNED-PAYLOAD");
    // (no "Expect:" to drop curl's 100-continue: curl 7.88 signs the empty header it does not send)
    if (S.token) {
        size_t l = strlen(S.token) + 32;
        char *t = malloc(l);
        if (t) {
            snprintf(t, l, "x-amz-security-token: %s", S.token);
            *hdrs = curl_slist_append(*hdrs, t);
            free(t);
        }
    }
    if (q->range_len) {
        char r[96];
        snprintf(r, sizeof r, "Range: bytes=%" PRIu64 "-%" PRIu64, q->range_off, q->range_off + q->range_len - 1);
        *hdrs = curl_slist_append(*hdrs, r);
    }
    if (!strcmp(q->method, "HEAD")) curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
    else if (!strcmp(q->method, "PUT")) {
        curl_easy_setopt(h, CURLOPT_UPLOAD, 1L);
        curl_easy_setopt(h, CURLOPT_READFUNCTION, on_send);
        curl_easy_setopt(h, CURLOPT_READDATA, q);
        curl_easy_setopt(h, CURLOPT_INFILESIZE_LARGE, (curl_off_t)q->body_len);
    } else if (!strcmp(q->method, "POST")) {
        curl_easy_setopt(h, CURLOPT_POST, 1L);
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, q->body ? (const char *)q->body : "");
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)q->body_len);
        *hdrs = curl_slist_append(*hdrs, "Content-Type: application/xml");
    } else if (strcmp(q->method, "GET")) curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, q->method);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, *hdrs);
}

static double rand01(void) {
    static _Atomic uint64_t s = 0x9e3779b97f4a7c15ull;
    uint64_t x = atomic_fetch_add(&s, 0x9e3779b97f4a7c15ull) ^ (uint64_t)time(NULL) ^ (uint64_t)getpid() << 20;
    x ^= x >> 31, x *= 0xbf58476d1ce4e5b9ull, x ^= x >> 29;
    return (double)(x >> 11) / 9007199254740992.0;
}

// Runs q until it succeeds (a 2xx reply: DT_OK, q->code set), fails for
// good (DT_ERR_IO naming q->url, what the server said, how often it was
// tried), or, where `ok404`, answers 404 (DT_OK, q->code 404).
static dt_status run(s3_req *q, int ok404) {
    char endpoint[512], region[64];
    settings(endpoint, sizeof endpoint, region, sizeof region);
    if (S.key_id && !S.secret)
        return dt_error(DT_ERR_CONFIG, "%s: AWS_ACCESS_KEY_ID is set but AWS_SECRET_ACCESS_KEY is not", q->url);
    double t0 = dt_now(), wait = 0.25;
    q->err.max = 64 << 10;
    for (int attempt = 1;; attempt++) {
        if (!(q->h = take_handle())) return dt_error(DT_ERR_NOMEM, "%s: out of memory", q->url);
        q->got = q->body_at = q->out.len = q->err.len = 0;
        q->out.over = 0;
        q->etag[0] = 0;
        struct curl_slist *hdrs = NULL;
        set_common(q, endpoint, region, &hdrs);
        char cerr[CURL_ERROR_SIZE] = "";
        curl_easy_setopt(q->h, CURLOPT_ERRORBUFFER, cerr);
        CURLcode rc = curl_easy_perform(q->h);
        q->code = 0;
        curl_easy_getinfo(q->h, CURLINFO_RESPONSE_CODE, &q->code);
        curl_easy_getinfo(q->h, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &q->length);
        curl_easy_setopt(q->h, CURLOPT_ERRORBUFFER, NULL);
        curl_slist_free_all(hdrs);
        give_handle(q->h);
        q->h = NULL;
        char s3code[64] = "", msg[256] = "";
        if (q->err.len) {
            xml_get((const char *)q->err.p, "Code", s3code, sizeof s3code);
            xml_get((const char *)q->err.p, "Message", msg, sizeof msg);
        }
        if (rc == CURLE_OK && q->code >= 200 && q->code < 300) return DT_OK;
        if (rc == CURLE_OK && q->code == 404 && ok404 && strcmp(s3code, "NoSuchBucket")) return DT_OK;
        if (rc == CURLE_WRITE_ERROR && q->out.over)
            return dt_error(DT_ERR_FORMAT, "%s: more than %zu bytes in the reply", q->url, q->out.max);
        if (rc == CURLE_WRITE_ERROR && q->dst)
            return dt_error(DT_ERR_IO, "%s: the server sent more than the %zu bytes asked for", q->url, q->range_len);
        char what[700];
        if (rc != CURLE_OK)
            snprintf(what, sizeof what, "cannot reach %s (%s): %s", endpoint, q->method,
                     cerr[0] ? cerr : curl_easy_strerror(rc));
        else
            snprintf(what, sizeof what, "HTTP %ld%s%s (%s): %s%s%s%s", q->code, s3code[0] ? " " : "", s3code, q->method,
                     hint(q->code, s3code), !strcmp(s3code, "NoSuchBucket") ? " '" : "",
                     !strcmp(s3code, "NoSuchBucket") ? q->name.bucket : "",
                     !strcmp(s3code, "NoSuchBucket") ? "'" : "");
        int again = rc != CURLE_OK ? transient_curl(rc) : transient_http(q->code, s3code);
        double pause = wait * (0.5 + 0.5 * rand01()), spent = dt_now() - t0;
        if (!again || spent + pause > S.retry_seconds) {
            char tries[96] = "";
            if (attempt > 1) snprintf(tries, sizeof tries, " (%d attempts over %.0f s)", attempt, spent);
            if (!strcmp(s3code, "NoSuchBucket"))
                return dt_error(DT_ERR_IO, "%s: %s at %s%s", q->url, what, endpoint, tries);
            return dt_error(DT_ERR_IO, "%s: %s%s", q->url, what, tries);
        }
        dt_log(DT_LOG_WARN, "%s: %s; retrying in %.1f s (attempt %d)", q->url, what, pause, attempt + 1);
        struct timespec ts = {(time_t)pause, (long)((pause - (double)(time_t)pause) * 1e9)};
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
        wait = wait * 2 < 8 ? wait * 2 : 8;
    }
}

static dt_status req_init(s3_req *q, const char *method, const char *url) {
    memset(q, 0, sizeof *q);
    q->method = method;
    q->url = url;
    q->out.max = 64 << 20;
    return parse_url(url, &q->name);
}

static void req_free(s3_req *q) {
    free(q->out.p);
    free(q->err.p);
}

// ----------------------------------------------------------------------------
// objects

// A HEAD of url; a 404 is no object (or no bucket: check_bucket then asks
// which, as a HEAD's reply has no body to say).
static dt_status head(const char *url, int *exists, uint64_t *size, int check_bucket) {
    *exists = 0;
    if (size) *size = 0;
    s3_req q;
    dt_status st = req_init(&q, "HEAD", url);
    if (st == DT_OK && !q.name.key[0]) st = dt_error(DT_ERR_ARG, "%s: names a bucket, not an object", url);
    if (st == DT_OK) st = run(&q, 1);
    // A HEAD's 404 or 403 has no body to say why (a missing bucket, a
    // wrong secret): the bucket's listing says.
    if (st == DT_OK && q.code == 404) {
        if (check_bucket) st = dt_s3_check_bucket(url);
    } else if (st != DT_OK && q.code == 403) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", dt_last_error());
        dt_status b = dt_s3_check_bucket(url);
        st = b != DT_OK ? b : dt_error(st, "%s", msg);
    } else if (st == DT_OK) {
        *exists = 1;
        if (size) *size = q.length > 0 ? (uint64_t)q.length : 0;
    }
    req_free(&q);
    return st;
}

dt_status dt_s3_head(const char *url, int *exists, uint64_t *size) { return head(url, exists, size, 1); }

dt_status dt_s3_stat(const char *url, int *exists, uint64_t *size) { return head(url, exists, size, 0); }

dt_status dt_s3_check_bucket(const char *url) {
    s3_req q;
    dt_status st = req_init(&q, "GET", url);
    if (st == DT_OK) {
        q.name.key[0] = 0;
        q.query = "list-type=2&max-keys=1";
        st = run(&q, 1);
        if (st == DT_OK && q.code == 404) {
            char endpoint[512], region[64];
            settings(endpoint, sizeof endpoint, region, sizeof region);
            st = dt_error(DT_ERR_IO, "%s: HTTP 404 NoSuchBucket: no such bucket '%s' at %s", url, q.name.bucket, endpoint);
        }
    }
    req_free(&q);
    return st;
}

static _Atomic uint64_t bytes_got;  // the GETs' bytes received (dt_s3_bytes_read)

uint64_t dt_s3_bytes_read(void) { return bytes_got; }

static dt_status get_one(const char *url, uint64_t off, size_t n, void *dst) {
    s3_req q;
    dt_status st = req_init(&q, "GET", url);
    q.range_off = off;
    q.range_len = n;
    q.dst = dst;
    if (st == DT_OK) st = run(&q, 0);
    bytes_got += q.got;
    if (st != DT_OK && q.code == 416)
        st = dt_error(DT_ERR_IO, "%s: ends before byte %" PRIu64 " (cut short?)", url, off + n);
    else if (st == DT_OK && q.got < n)
        st = dt_error(DT_ERR_IO, "%s: ends at byte %" PRIu64 ", before byte %" PRIu64 " (cut short?)", url,
                      off + q.got, off + n);
    req_free(&q);
    return st;
}

// ----------------------------------------------------------------------------
// jobs on a few threads (the pieces of a large GET, the parts of an upload)

typedef struct {
    dt_status (*fn)(void *user, int job, int slot);
    void *user;
    int njobs;
    _Atomic int next, failed;
    pthread_mutex_t mu;
    dt_status st;
    char msg[1024];
} jobs_t;

static void *jobs_main(void *arg) {
    jobs_t *j = ((void **)arg)[0];
    int slot = (int)(intptr_t)((void **)arg)[1];
    for (int k; !j->failed && (k = atomic_fetch_add(&j->next, 1)) < j->njobs;) {
        dt_status st = j->fn(j->user, k, slot);
        if (st != DT_OK) {
            pthread_mutex_lock(&j->mu);
            if (j->st == DT_OK) j->st = st, snprintf(j->msg, sizeof j->msg, "%s", dt_last_error());
            pthread_mutex_unlock(&j->mu);
            j->failed = 1;
        }
    }
    return NULL;
}

// fn(user, k, slot) for k in [0, njobs) on up to `threads` threads (slot:
// the thread's number, for its buffer); the first error, its message
// carried to this thread.
static dt_status run_jobs(int threads, int njobs, dt_status (*fn)(void *, int, int), void *user) {
    jobs_t j = {.fn = fn, .user = user, .njobs = njobs};
    pthread_mutex_init(&j.mu, NULL);
    pthread_t t[8];
    void *args[8][2];
    int started = 0;
    if (threads > 8) threads = 8;
    for (int i = 1; i < threads && i < njobs; i++) {
        args[i][0] = &j, args[i][1] = (void *)(intptr_t)i;
        if (pthread_create(&t[i], NULL, jobs_main, args[i]) != 0) break;
        started = i;
    }
    args[0][0] = &j, args[0][1] = (void *)(intptr_t)0;
    jobs_main(args[0]);
    for (int i = 1; i <= started; i++) pthread_join(t[i], NULL);
    pthread_mutex_destroy(&j.mu);
    return j.st == DT_OK ? DT_OK : dt_error(j.st, "%s", j.msg);
}

#define GET_PIECE ((size_t)8 << 20)
#define THREADS 4

typedef struct {
    const char *url;
    uint64_t off;
    size_t n;
    uint8_t *dst;
} get_many_t;

static dt_status get_piece(void *user, int k, int slot) {
    (void)slot;
    get_many_t *g = user;
    size_t a = (size_t)k * GET_PIECE, len = g->n - a < GET_PIECE ? g->n - a : GET_PIECE;
    return get_one(g->url, g->off + a, len, g->dst + a);
}

dt_status dt_s3_get(const char *url, uint64_t off, size_t n, void *dst) {
    if (n == 0) return DT_OK;
    if (n <= 2 * GET_PIECE) return get_one(url, off, n, dst);
    get_many_t g = {url, off, n, dst};
    return run_jobs(THREADS, (int)((n + GET_PIECE - 1) / GET_PIECE), get_piece, &g);
}

dt_status dt_s3_get_all(const char *url, size_t max, uint8_t **buf, size_t *len) {
    *buf = NULL;
    *len = 0;
    int exists;
    uint64_t size;
    dt_status st = dt_s3_head(url, &exists, &size);
    if (st != DT_OK) return st;
    if (!exists) return dt_error(DT_ERR_IO, "%s: cannot open: no such object", url);
    if (size > max) return dt_error(DT_ERR_FORMAT, "%s: %" PRIu64 " bytes, more than the %zu expected", url, size, max);
    uint8_t *b = malloc(size + 1);
    if (!b) return dt_error(DT_ERR_NOMEM, "%s: out of memory for %" PRIu64 " bytes", url, size);
    if ((st = dt_s3_get(url, 0, size, b)) != DT_OK) {
        free(b);
        return st;
    }
    b[size] = 0;
    *buf = b;
    *len = size;
    return DT_OK;
}

dt_status dt_s3_put(const char *url, const void *data, size_t n) {
    s3_req q;
    dt_status st = req_init(&q, "PUT", url);
    q.body = data;
    q.body_len = n;
    if (st == DT_OK && !q.name.key[0]) st = dt_error(DT_ERR_ARG, "%s: names a bucket, not an object", url);
    if (st == DT_OK) st = run(&q, 0);
    req_free(&q);
    return st;
}

dt_status dt_s3_delete(const char *url) {
    s3_req q;
    dt_status st = req_init(&q, "DELETE", url);
    if (st == DT_OK) st = run(&q, 1);
    req_free(&q);
    return st;
}

// ----------------------------------------------------------------------------
// multipart uploads

// An upload's bytes come from a file (fd, read into a buffer a part at a
// time) or from the caller's memory (g: curl reads them from there).
typedef struct {
    const char *url;
    int fd;
    const gather_t *g;
    uint64_t size;
    size_t part;
    char id_enc[600];         // the upload's id, encoded for a query
    char (*etags)[160];
    uint8_t *bufs[THREADS];
} upload_t;

static dt_status read_part(const upload_t *u, uint64_t at, size_t n, uint8_t *dst) {
    for (size_t done = 0; done < n;) {
        ssize_t r = pread(u->fd, dst + done, n - done, (off_t)(at + done));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0)
            return dt_error(DT_ERR_IO, "%s: reading the staged bytes at %" PRIu64 ": %s", u->url, at + done,
                            r < 0 ? strerror(errno) : "ends early");
        done += (size_t)r;
    }
    return DT_OK;
}

static dt_status put_part(void *user, int k, int slot) {
    upload_t *u = user;
    uint64_t at = (uint64_t)k * u->part;
    size_t n = u->size - at < u->part ? (size_t)(u->size - at) : u->part;
    dt_status st = u->g ? DT_OK : read_part(u, at, n, u->bufs[slot]);
    if (st != DT_OK) return st;
    char query[700];
    snprintf(query, sizeof query, "partNumber=%d&uploadId=%s", k + 1, u->id_enc);
    s3_req q;
    st = req_init(&q, "PUT", u->url);
    q.query = query;
    q.body = u->g ? NULL : u->bufs[slot];
    q.gather = u->g;
    q.gather_off = at;
    q.body_len = n;
    if (st == DT_OK) st = run(&q, 0);
    if (st == DT_OK && !q.etag[0]) st = dt_error(DT_ERR_IO, "%s: part %d: the server's reply has no ETag", u->url, k + 1);
    if (st == DT_OK) snprintf(u->etags[k], sizeof u->etags[k], "%s", q.etag);
    req_free(&q);
    return st;
}

static void abort_upload(const upload_t *u) {
    char query[700];
    snprintf(query, sizeof query, "uploadId=%s", u->id_enc);
    s3_req q;
    if (req_init(&q, "DELETE", u->url) == DT_OK) {
        q.query = query;
        if (run(&q, 1) != DT_OK) dt_log(DT_LOG_WARN, "%s: abandoning the multipart upload: %s", u->url, dt_last_error());
    }
    req_free(&q);
}

// CompleteMultipartUpload; a retry that finds the upload gone (the first
// try completed it, its reply lost) checks that the object is there whole.
static dt_status complete_upload(const upload_t *u, int parts) {
    buf_t body = {.max = (size_t)parts * 256 + 256};
    int ok = buf_add(&body, "<CompleteMultipartUpload>", 25);
    for (int k = 0; k < parts && ok; k++) {
        char e[256];
        int l = snprintf(e, sizeof e, "<Part><PartNumber>%d</PartNumber><ETag>%s</ETag></Part>", k + 1, u->etags[k]);
        ok = buf_add(&body, e, (size_t)l);
    }
    ok = ok && buf_add(&body, "</CompleteMultipartUpload>", 26);
    if (!ok) {
        free(body.p);
        return dt_error(DT_ERR_NOMEM, "%s: out of memory", u->url);
    }
    char query[700];
    snprintf(query, sizeof query, "uploadId=%s", u->id_enc);
    s3_req q;
    dt_status st = req_init(&q, "POST", u->url);
    q.query = query;
    q.body = body.p;
    q.body_len = body.len;
    if (st == DT_OK) st = run(&q, 1);
    char code[64] = "";
    if (st == DT_OK && q.code == 404) {  // NoSuchUpload
        int exists;
        uint64_t size;
        st = dt_s3_head(u->url, &exists, &size);
        if (st == DT_OK && (!exists || size != u->size))
            st = dt_error(DT_ERR_IO, "%s: completing the multipart upload: the upload is gone and the object is not "
                          "there whole", u->url);
    } else if (st == DT_OK && xml_get((const char *)q.out.p, "Code", code, sizeof code))
        st = dt_error(DT_ERR_IO, "%s: completing the multipart upload: %s", u->url, code);  // (an error in a 200 reply)
    req_free(&q);
    free(body.p);
    return st;
}

// One PUT of all of u's bytes.
static dt_status put_whole(upload_t *u) {
    s3_req q;
    dt_status st = req_init(&q, "PUT", u->url);
    uint8_t *b = NULL;
    if (st == DT_OK && !q.name.key[0]) st = dt_error(DT_ERR_ARG, "%s: names a bucket, not an object", u->url);
    if (st == DT_OK && !u->g && !(b = malloc(u->size ? u->size : 1)))
        st = dt_error(DT_ERR_NOMEM, "%s: out of memory for %" PRIu64 " bytes", u->url, u->size);
    if (st == DT_OK && b) st = read_part(u, 0, u->size, b);
    q.body = b;
    q.gather = u->g;
    q.body_len = u->size;
    if (st == DT_OK) st = run(&q, 0);
    req_free(&q);
    free(b);
    return st;
}

// u's bytes as object u->url: one PUT, or a multipart upload in parts of
// u->part, four at a time, aborted on failure.
static dt_status upload(upload_t *u) {
    if (u->size <= u->part) return put_whole(u);
    uint64_t parts = (u->size + u->part - 1) / u->part;
    if (parts > 10000)
        return dt_error(DT_ERR_ARG, "%s: %" PRIu64 " bytes need %" PRIu64 " parts of %zu MiB, more than S3's 10000 "
                        "(raise DTRAIN_S3_PART_MB)", u->url, u->size, parts, u->part >> 20);
    s3_req q;
    dt_status st = req_init(&q, "POST", u->url);
    q.query = "uploads=";
    if (st == DT_OK) st = run(&q, 0);
    char id[512] = "";
    if (st == DT_OK && !xml_get((const char *)q.out.p, "UploadId", id, sizeof id))
        st = dt_error(DT_ERR_IO, "%s: starting a multipart upload: no UploadId in the reply", u->url);
    req_free(&q);
    if (st != DT_OK) return st;
    encode(u->id_enc, sizeof u->id_enc, id, 0);
    int threads = parts < THREADS ? (int)parts : THREADS;
    u->etags = calloc(parts, sizeof *u->etags);
    for (int i = 0; i < threads && u->etags && !u->g; i++)
        if (!(u->bufs[i] = malloc(u->part))) break;
    if (!u->etags || (!u->g && !u->bufs[threads - 1]))
        st = dt_error(DT_ERR_NOMEM, "%s: out of memory for the upload's parts", u->url);
    if (st == DT_OK) st = run_jobs(threads, (int)parts, put_part, u);
    if (st == DT_OK) st = complete_upload(u, (int)parts);
    if (st != DT_OK) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", dt_last_error());
        abort_upload(u);
        dt_error(st, "%s", msg);
    }
    for (int i = 0; i < threads; i++) free(u->bufs[i]);
    free(u->etags);
    return st;
}

dt_status dt_s3_put_fd(const char *url, int fd, uint64_t size) {
    pthread_once(&S_once, settings_init);
    upload_t u = {.url = url, .fd = fd, .size = size, .part = S.part};
    return upload(&u);
}

dt_status dt_s3_put_parts(const char *url, const void *const *parts, const size_t *sizes, int n) {
    pthread_once(&S_once, settings_init);
    gather_t g = {parts, sizes, n};
    upload_t u = {.url = url, .fd = -1, .g = &g, .part = S.part};
    for (int i = 0; i < n; i++) u.size += sizes[i];
    return upload(&u);
}

// ----------------------------------------------------------------------------
// listing

// Calls fn for each <Contents> and <CommonPrefixes> of a ListObjectsV2
// reply, the names after `prefix`; *stop when fn said so.
static void list_page(const char *xml, size_t plen, int (*fn)(void *, const char *, uint64_t, int), void *user,
                      int *stop) {
    const char *p = xml;
    char key[1200], size[32];
    while (!*stop && p) {
        const char *c = strstr(p, "<Contents>"), *cp = strstr(p, "<CommonPrefixes>");
        const char *at = c && (!cp || c < cp) ? c : cp;
        if (!at) break;
        const char *end = strstr(at, at == c ? "</Contents>" : "</CommonPrefixes>");
        if (!end) break;
        size_t len = (size_t)(end - at);
        char *one = strndup(at, len);
        if (!one) break;
        if (at == c && xml_get(one, "Key", key, sizeof key) && strlen(key) > plen) {
            size[0] = 0;
            xml_get(one, "Size", size, sizeof size);
            *stop = fn(user, key + plen, strtoull(size, NULL, 10), 0);
        } else if (at == cp && xml_get(one, "Prefix", key, sizeof key) && strlen(key) > plen + 1) {
            key[strlen(key) - 1] = 0;  // (the delimiter)
            *stop = fn(user, key + plen, 0, 1);
        }
        free(one);
        p = end;
    }
}

dt_status dt_s3_list(const char *url, int (*fn)(void *user, const char *name, uint64_t size, int is_dir),
                     void *user) {
    s3_name n;
    dt_status st = parse_url(url, &n);
    if (st != DT_OK) return st;
    char prefix[1200], penc[3600], token[1024] = "", tenc[3100], query[7000], bucket_url[80];
    size_t kl = strlen(n.key);
    snprintf(prefix, sizeof prefix, "%s%s", n.key, kl && n.key[kl - 1] != '/' ? "/" : "");
    encode(penc, sizeof penc, prefix, 0);
    snprintf(bucket_url, sizeof bucket_url, "s3://%s", n.bucket);
    int stop = 0;
    do {
        encode(tenc, sizeof tenc, token, 0);
        // (in the canonical order: keys sorted)
        snprintf(query, sizeof query, "%s%s%sdelimiter=%%2F&list-type=2&prefix=%s", token[0] ? "continuation-token=" : "",
                 token[0] ? tenc : "", token[0] ? "&" : "", penc);
        s3_req q;
        st = req_init(&q, "GET", bucket_url);
        q.url = url;
        q.query = query;
        if (st == DT_OK) st = run(&q, 0);
        char trunc[16] = "";
        token[0] = 0;
        if (st == DT_OK) {
            list_page((const char *)q.out.p, strlen(prefix), fn, user, &stop);
            xml_get((const char *)q.out.p, "IsTruncated", trunc, sizeof trunc);
            if (!strcmp(trunc, "true")) xml_get((const char *)q.out.p, "NextContinuationToken", token, sizeof token);
        }
        req_free(&q);
    } while (st == DT_OK && !stop && token[0]);
    return st;
}
