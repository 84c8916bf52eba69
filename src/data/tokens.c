/* llm.c token files: a 1 KiB header of 256 little-endian int32
 * {20240520, 1, ntok, 0, ...} followed by ntok uint16 token ids. The file
 * is read into memory whole and checked once when opened. It is not
 * memory-mapped: a mapped file that is truncated or rewritten while a run
 * reads it kills the process with SIGBUS; a copy in memory cannot change
 * under the run. (The memory check, dt_check_memory, counts the files.) */
#include "dtrain/gpt.h"

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

dt_status dt_tokens_parse(const uint8_t *buf, size_t len, const char *what, int vocab,
                          const uint16_t **tokens, size_t *n) {
    if (len < HEADER_BYTES)
        return dt_error(DT_ERR_FORMAT, "%s: %zu bytes is shorter than the %d-byte header of a token file (truncated?)",
                        what, len, HEADER_BYTES);
    int32_t magic = rd32(buf), version = rd32(buf + 4), count = rd32(buf + 8);
    if (magic != DT_TOKENS_MAGIC)
        return dt_error(DT_ERR_FORMAT, "%s: magic number %d, expected %d (not an llm.c token file)", what, magic,
                        DT_TOKENS_MAGIC);
    if (version != DT_TOKENS_VERSION)
        return dt_error(DT_ERR_FORMAT, "%s: version %d, expected %d", what, version, DT_TOKENS_VERSION);
    if (count < 0) return dt_error(DT_ERR_FORMAT, "%s: negative token count %d in the header", what, count);
    size_t want = HEADER_BYTES + 2 * (size_t)count;
    if (len != want)
        return dt_error(DT_ERR_FORMAT, "%s: header says %d tokens (%zu bytes) but the file has %zu bytes (%s)", what,
                        count, want, len, len < want ? "truncated" : "trailing data");
    const uint16_t *t = (const uint16_t *)(buf + HEADER_BYTES);
    for (size_t i = 0; i < (size_t)count; i++)
        if (t[i] >= vocab)
            return dt_error(DT_ERR_FORMAT, "%s: token %zu is %u, not below the model's vocab_size %d", what, i,
                            (unsigned)t[i], vocab);
    *tokens = t;
    *n = (size_t)count;
    return DT_OK;
}

dt_status dt_tokens_open(dt_tokens *t, const char *path, int vocab) {
    memset(t, 0, sizeof *t);
    dt_rfile *f;  // (a file, or an object: s3://, read in pieces four at a time)
    if (dt_rfile_open(&f, path) != DT_OK)
        return dt_error(DT_ERR_IO, "token file %s%s", dt_last_error(),
                        !dt_path_remote(path) && access(path, F_OK) != 0
                            ? " (make token files from text with: dtrain prepare-text FILE... -o PREFIX)" : "");
    size_t len = (size_t)dt_rfile_size(f);
    if (len < HEADER_BYTES) {
        dt_rfile_close(f);
        return dt_error(DT_ERR_FORMAT, "%s: %zu bytes is shorter than the %d-byte header of a token file (truncated?)",
                        path, len, HEADER_BYTES);
    }
    uint8_t *buf = malloc(len);
    if (!buf) {
        dt_rfile_close(f);
        return dt_error(DT_ERR_NOMEM, "%s: out of memory reading %zu bytes", path, len);
    }
    // A file that shrinks while it is read ends early: the read names it.
    dt_status st = dt_rfile_read(f, 0, buf, len);
    dt_rfile_close(f);
    if (st == DT_OK) st = dt_tokens_parse(buf, len, path, vocab, &t->tokens, &t->n);
    if (st != DT_OK) {
        free(buf);
        return st;
    }
    t->map = buf;
    t->map_len = len;
    return DT_OK;
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

dt_status dt_tokens_sample(const dt_tokens *t, dt_rng *rng, int B, int T, int32_t *inputs,
                           int32_t *targets) {
    if (t->n < (size_t)T + 1)
        return dt_error(DT_ERR_ARG, "token file of %zu tokens is too short for windows of %d+1 tokens", t->n, T);
    size_t span = t->n - (size_t)T;  // window starts 0 .. n-T-1
    for (int b = 0; b < B; b++) {
        size_t s = span > UINT32_MAX ? (size_t)(dt_rng_u64(rng) % span) : dt_rng_below(rng, (uint32_t)span);
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
