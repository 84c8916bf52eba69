/* llm.c token files: a 1 KiB header of 256 little-endian int32
 * {20240520, 1, ntok, 0, ...} followed by ntok uint16 token ids. The file
 * is read into memory (whole, or a rank's shard of it) and checked once
 * when opened. It is not
 * memory-mapped: a mapped file that is truncated or rewritten while a run
 * reads it kills the process with SIGBUS; a copy in memory cannot change
 * under the run. (The memory check, dt_check_memory, counts the files.) */
#include "dtrain/gpt.h"
#include "data/data_io.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define HEADER_INTS 256
#define HEADER_BYTES (HEADER_INTS * 4)

static int32_t rd32(const uint8_t *p) {
    return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
}

// The header's fields, checked; *count the tokens it announces.
static dt_status parse_header(const uint8_t *buf, const char *what, size_t *count) {
    int32_t magic = rd32(buf), version = rd32(buf + 4), n = rd32(buf + 8);
    if (magic != DT_TOKENS_MAGIC)
        return dt_error(DT_ERR_FORMAT, "%s: magic number %d, expected %d (not an llm.c token file)", what, magic,
                        DT_TOKENS_MAGIC);
    if (version != DT_TOKENS_VERSION)
        return dt_error(DT_ERR_FORMAT, "%s: version %d, expected %d", what, version, DT_TOKENS_VERSION);
    if (n < 0) return dt_error(DT_ERR_FORMAT, "%s: negative token count %d in the header", what, n);
    *count = (size_t)n;
    return DT_OK;
}

static dt_status check_length(size_t len, size_t count, const char *what) {
    size_t want = HEADER_BYTES + 2 * count;
    if (len != want)
        return dt_error(DT_ERR_FORMAT, "%s: header says %zu tokens (%zu bytes) but the file has %zu bytes (%s)", what,
                        count, want, len, len < want ? "truncated" : "trailing data");
    return DT_OK;
}

// Every id of t[n] (the file's from `first` on) below vocab.
static dt_status check_ids(const uint16_t *t, size_t n, size_t first, const char *what, int vocab) {
    for (size_t i = 0; i < n; i++)
        if (t[i] >= vocab)
            return dt_error(DT_ERR_FORMAT, "%s: token %zu is %u, not below the model's vocab_size %d", what, first + i,
                            (unsigned)t[i], vocab);
    return DT_OK;
}

static dt_status too_short(size_t len, const char *what) {
    return dt_error(DT_ERR_FORMAT, "%s: %zu bytes is shorter than the %d-byte header of a token file (truncated?)",
                    what, len, HEADER_BYTES);
}

dt_status dt_tokens_parse(const uint8_t *buf, size_t len, const char *what, int vocab,
                          const uint16_t **tokens, size_t *n) {
    if (len < HEADER_BYTES) return too_short(len, what);
    size_t count = 0;
    dt_status st = parse_header(buf, what, &count);
    if (st == DT_OK) st = check_length(len, count, what);
    const uint16_t *t = (const uint16_t *)(buf + HEADER_BYTES);
    if (st == DT_OK) st = check_ids(t, count, 0, what, vocab);
    if (st != DT_OK) return st;
    *tokens = t;
    *n = count;
    return DT_OK;
}

dt_status dt_tokens_open(dt_tokens *t, const char *path, int vocab) { return dt_tokens_open_shard(t, path, vocab, 0, 1); }

// The header, then the shard's tokens alone (the whole file: one read),
// into t.
static dt_status read_shard(dt_tokens *t, dt_rfile *f, const char *path, int vocab, int shard, int nshards) {
    size_t len = (size_t)dt_rfile_size(f), count = 0, lo, hi;
    if (len < HEADER_BYTES) return too_short(len, path);
    uint8_t hdr[HEADER_BYTES];
    dt_rfile_set_block(f, 0);  // (exact ranges: no read-ahead into another rank's shard)
    dt_status st = dt_rfile_read(f, 0, hdr, HEADER_BYTES);
    if (st == DT_OK) st = parse_header(hdr, path, &count);
    if (st == DT_OK) st = check_length(len, count, path);
    if (st != DT_OK) return st;
    dt_shard_range(count, shard, nshards, &lo, &hi);
    uint8_t *buf = malloc(2 * (hi - lo) + 1);
    if (!buf) return dt_error(DT_ERR_NOMEM, "%s: out of memory reading %zu bytes", path, 2 * (hi - lo));
    // A file that shrinks while it is read ends early: the read names it.
    st = dt_rfile_read(f, HEADER_BYTES + 2 * (uint64_t)lo, buf, 2 * (hi - lo));
    if (st == DT_OK) dt_data_read_count(HEADER_BYTES + 2 * (hi - lo));
    if (st == DT_OK) st = check_ids((const uint16_t *)buf, hi - lo, lo, path, vocab);
    if (st != DT_OK) {
        free(buf);
        return st;
    }
    *t = (dt_tokens){.tokens = (const uint16_t *)buf, .n = hi - lo, .map = buf, .map_len = 2 * (hi - lo),
                     .total = count, .first = lo, .shard = shard, .nshards = nshards};
    return DT_OK;
}

dt_status dt_tokens_open_shard(dt_tokens *t, const char *path, int vocab, int shard, int nshards) {
    memset(t, 0, sizeof *t);
    if (nshards < 1 || shard < 0 || shard >= nshards)
        return dt_error(DT_ERR_ARG, "%s: shard %d of %d", path, shard, nshards);
    dt_rfile *f;  // (a file, or an object: s3://, read in pieces four at a time)
    if (dt_rfile_open(&f, path) != DT_OK)
        return dt_error(DT_ERR_IO, "token file %s%s", dt_last_error(),
                        !dt_path_remote(path) && access(path, F_OK) != 0
                            ? " (make token files from text with: dtrain prepare-text FILE... -o PREFIX)" : "");
    dt_status st = read_shard(t, f, path, vocab, shard, nshards);
    dt_rfile_close(f);
    return st;
}

void dt_tokens_close(dt_tokens *t) {
    free(t->map);
    memset(t, 0, sizeof *t);
}

// ----------------------------------------------------------------------------
// writing: a header whose count is filled in last, the tokens appended

struct dt_tokens_writer {
    dt_atomic_file *f;
    char path[4096];
    size_t n;
};

dt_status dt_tokens_writer_open(dt_tokens_writer **out, const char *path) {
    *out = NULL;
    dt_tokens_writer *w = calloc(1, sizeof *w);
    if (!w) return dt_error(DT_ERR_NOMEM, "%s: out of memory", path);
    snprintf(w->path, sizeof w->path, "%s", path);
    static const int32_t header[HEADER_INTS] = {DT_TOKENS_MAGIC, DT_TOKENS_VERSION};
    dt_status st = dt_atomic_open(&w->f, path);
    if (st == DT_OK) st = dt_atomic_append(w->f, header, sizeof header);
    if (st != DT_OK) {
        dt_tokens_writer_close(w, 0);
        return st;
    }
    *out = w;
    return DT_OK;
}

dt_status dt_tokens_writer_put(dt_tokens_writer *w, const uint16_t *tokens, size_t n) {
    if (n > (size_t)INT32_MAX - w->n)
        return dt_error(DT_ERR_ARG, "%s: %zu tokens exceed the format's int32 count", w->path, w->n + n);
    w->n += n;
    return dt_atomic_append(w->f, tokens, 2 * n);
}

size_t dt_tokens_writer_count(const dt_tokens_writer *w) { return w->n; }

dt_status dt_tokens_writer_close(dt_tokens_writer *w, int commit) {
    if (!w) return DT_OK;
    dt_status st = DT_OK;
    if (commit) {
        int32_t count = (int32_t)w->n;
        st = dt_atomic_write_at(w->f, 8, &count, sizeof count);
        if (st == DT_OK) {
            st = dt_atomic_commit(w->f);
            w->f = NULL;
        }
    }
    dt_atomic_abort(w->f);
    free(w);
    return st;
}

dt_status dt_tokens_write(const char *path, const uint16_t *tokens, size_t n) {
    if (n > INT32_MAX) return dt_error(DT_ERR_ARG, "%s: %zu tokens exceed the format's int32 count", path, n);
    dt_tokens_writer *w;
    dt_status st = dt_tokens_writer_open(&w, path);
    if (st != DT_OK) return st;
    st = dt_tokens_writer_put(w, tokens, n);
    dt_status done = dt_tokens_writer_close(w, st == DT_OK);
    return st != DT_OK ? st : done;
}

// The start of a window in [0, span), as every rank draws it.
static size_t draw(dt_rng *rng, size_t span) {
    return span > UINT32_MAX ? (size_t)(dt_rng_u64(rng) % span) : dt_rng_below(rng, (uint32_t)span);
}

dt_status dt_tokens_sample(const dt_tokens *t, dt_rng *rng, int B, int T, int32_t *inputs,
                           int32_t *targets) {
    int W = t->nshards > 0 ? t->nshards : 1;
    size_t total = t->nshards > 0 ? t->total : t->n;  // (tokens set by hand: the whole file)
    if (total / (size_t)W < (size_t)T + 1)  // (the smallest shard)
        return W > 1 ? dt_error(DT_ERR_ARG, "token file of %zu tokens in %d shards: a shard of %zu is too short for "
                                "windows of %d+1 tokens", total, W, total / (size_t)W, T)
                     : dt_error(DT_ERR_ARG, "token file of %zu tokens is too short for windows of %d+1 tokens", t->n, T);
    for (int b = 0, r = 0; b < B; b++) {
        while ((long)B * (r + 1) / W <= b) r++;  // (window b's rank)
        size_t lo, hi;
        dt_shard_range(total, r, W, &lo, &hi);
        size_t s = draw(rng, hi - lo - (size_t)T);  // window starts lo .. hi-T-1
        if (r != t->shard) continue;
        const uint16_t *w = t->tokens + s;
        for (int i = 0; i < T; i++) {
            inputs[(size_t)b * T + i] = w[i];
            targets[(size_t)b * T + i] = w[i + 1];
        }
    }
    return DT_OK;
}

dt_status dt_tokens_window(const dt_tokens *t, int64_t i, int B, int T, int32_t *inputs,
                           int32_t *targets) {
    if (t->n < (size_t)T + 1)
        return dt_error(DT_ERR_ARG, "token file of %zu tokens is too short for windows of %d+1 tokens", t->n, T);
    size_t nwin = (t->n - 1) / (size_t)T;  // whole windows with a next token
    for (int b = 0; b < B; b++) {
        size_t s = ((size_t)i * B + b) % nwin * T;
        for (int k = 0; k < T; k++) {
            inputs[(size_t)b * T + k] = t->tokens[s + k];
            targets[(size_t)b * T + k] = t->tokens[s + k + 1];
        }
    }
    return DT_OK;
}
