/* dtrain prepare-text: text files -> byte-level llm.c token files. */
#include "cli.h"
#include "dtrain/dtrain.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>
#include <zlib.h>

static const char help[] =
    "usage: dtrain prepare-text IN... -o OUT_PREFIX [--val-fraction F]\n"
    "\n"
    "Turns text into byte-level token files (vocabulary 256: token = byte) in\n"
    "llm.c's format, OUT_PREFIX_train.bin and OUT_PREFIX_val.bin, for a GPT\n"
    "config's [data] train_file / val_file. Each IN is a file, or a directory\n"
    "whose regular files are read in name order, its subdirectories' in turn\n"
    "(symlinks, hidden names and *.dat skipped, so /usr/share/games/fortunes\n"
    "works as it is). gzip-compressed files (*.gz, as Debian ships most\n"
    "documentation) are read uncompressed. The text is concatenated and cut\n"
    "into 8 KiB blocks; every round(1/F)-th block goes to validation (F from\n"
    "0.000001 to 0.5, default 0.1), so both splits sample the whole corpus.\n"
    "\n"
    "The text is streamed: memory stays under a megabyte whatever the\n"
    "corpus's size. Limits: at most 2 GiB - 1 of text in all (the token\n"
    "files count tokens in an int32: split a larger corpus), checked before\n"
    "anything is written, as is the free disk space (2 bytes a byte of text);\n"
    "no text at all (an empty file, an empty directory) is an error; inputs\n"
    "must be regular files or directories (not /dev/zero, not a FIFO).\n"
    "\n"
    "examples:\n"
    "  dtrain prepare-text /usr/share/games/fortunes -o data/fortunes\n"
    "  dtrain prepare-text /usr/share/doc/linux-doc-6.1/Documentation -o data/kernel-docs\n";

// The most text one run reads: the token files count tokens in an int32.
#define MAX_TEXT ((size_t)INT32_MAX)
#define MAX_DEPTH 32

typedef struct {
    char **path;
    size_t *size;  // bytes of text: a plain file's size, a gzip file's announced one
    int n, cap;
} inputs;

static int add_input(inputs *in, const char *path, size_t size) {
    if (in->n == in->cap) {
        int cap = in->cap ? 2 * in->cap : 64;
        char **p = realloc(in->path, cap * sizeof *p);
        if (p) in->path = p;
        size_t *z = p ? realloc(in->size, cap * sizeof *z) : NULL;
        if (!z) return cli_error("out of memory"), -1;
        in->size = z;
        in->cap = cap;
    }
    if (!(in->path[in->n] = strdup(path))) return cli_error("out of memory"), -1;
    in->size[in->n++] = size;
    return 0;
}

static void free_inputs(inputs *in) {
    for (int i = 0; i < in->n; i++) free(in->path[i]);
    free(in->path);
    free(in->size);
}

// The bytes of text in a file: its size, or what a gzip file's trailer
// announces (its size modulo 2^32: exact below 4 GiB, and the stream
// counts again as it reads).
static int text_size(const char *path, size_t *out) {
    int fd;
    if (dt_open_read(path, &fd) != DT_OK) return cli_error("%s", dt_last_error()), -1;
    struct stat sb;
    uint8_t magic[2] = {0}, isize[4];
    int rc = fstat(fd, &sb);
    *out = rc == 0 ? (size_t)sb.st_size : 0;
    if (rc == 0 && sb.st_size >= 18 && dt_read_at(fd, 0, magic, 2, path) == DT_OK && magic[0] == 0x1f &&
        magic[1] == 0x8b && dt_read_at(fd, (uint64_t)sb.st_size - 4, isize, 4, path) == DT_OK)
        *out = (size_t)isize[0] | (size_t)isize[1] << 8 | (size_t)isize[2] << 16 | (size_t)isize[3] << 24;
    close(fd);
    if (rc != 0) return cli_error("%s: %s", path, strerror(errno)), -1;
    return 0;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int collect(inputs *in, const char *path, int depth);

// A directory's regular files and subdirectories, in name order.
static int collect_dir(inputs *in, const char *path, int depth) {
    if (depth > MAX_DEPTH) return cli_error("%s: directories nested deeper than %d", path, MAX_DEPTH), -1;
    DIR *d = opendir(path);
    if (!d) return cli_error("%s: cannot open directory: %s", path, strerror(errno)), -1;
    inputs names = {0};
    struct dirent *e;
    int rc = 0;
    while (rc == 0 && (e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (e->d_name[0] == '.' || (len > 4 && !strcmp(e->d_name + len - 4, ".dat"))) continue;
        char full[4096];
        snprintf(full, sizeof full, "%s/%s", path, e->d_name);
        struct stat ls;
        if (lstat(full, &ls) == 0 && (S_ISREG(ls.st_mode) || S_ISDIR(ls.st_mode))) rc = add_input(&names, full, 0);
    }
    closedir(d);
    if (names.n) qsort(names.path, (size_t)names.n, sizeof *names.path, cmp_str);
    for (int i = 0; i < names.n && rc == 0; i++) rc = collect(in, names.path[i], depth + 1);
    free_inputs(&names);
    return rc;
}

static int collect(inputs *in, const char *path, int depth) {
    struct stat sb;
    if (stat(path, &sb) != 0) return cli_error("%s: %s", path, strerror(errno)), -1;
    if (S_ISDIR(sb.st_mode)) return collect_dir(in, path, depth);
    size_t size;
    return text_size(path, &size) != 0 ? -1 : add_input(in, path, size);
}

// Where the text goes: every `every`-th 8 KiB block to validation, or,
// for a corpus of fewer blocks than that, its last `tail` bytes.
enum { BLOCK = 8192, CHUNK = 65536 };
typedef struct {
    dt_tokens_writer *train, *val;
    size_t every, total, tail, at;  // at: bytes so far
    uint16_t buf[2][CHUNK];
    size_t nbuf[2];
} splitter;

static dt_status flush_split(splitter *s, int k) {
    dt_status st = dt_tokens_writer_put(k ? s->val : s->train, s->buf[k], s->nbuf[k]);
    s->nbuf[k] = 0;
    return st;
}

static dt_status split_bytes(splitter *s, const uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++, s->at++) {
        int k = s->tail ? s->at >= s->total - s->tail : (s->at / BLOCK) % s->every == s->every - 1;
        s->buf[k][s->nbuf[k]++] = p[i];
        if (s->nbuf[k] == CHUNK && flush_split(s, k) != DT_OK) return DT_ERR_IO;
    }
    return DT_OK;
}

static int too_much(const char *path) {
    return cli_error("%s: the input passes %zu bytes (2 GiB - 1), the most prepare-text reads (the token files count "
                     "tokens in an int32: split the corpus)", path, MAX_TEXT), -1;
}

// Streams one input (gunzipped when it is gzip) into the splits, at most
// MAX_TEXT bytes in all.
static int stream_file(splitter *s, const char *path) {
    int fd;
    if (dt_open_read(path, &fd) != DT_OK) return cli_error("%s", dt_last_error()), -1;
    gzFile f = gzdopen(fd, "rb");  // reads plain files as they are, too
    if (!f) {
        close(fd);
        return cli_error("%s: out of memory", path), -1;
    }
    uint8_t buf[CHUNK];
    int r, rc = 0;
    while (rc == 0 && (r = gzread(f, buf, sizeof buf)) > 0) {
        if ((size_t)r > MAX_TEXT - s->at)
            rc = too_much(path);
        else if (split_bytes(s, buf, (size_t)r) != DT_OK)
            rc = (cli_error("%s", dt_last_error()), -1);
    }
    int err;
    const char *msg = gzerror(f, &err);
    if (rc == 0 && r < 0) rc = (cli_error("%s: read error: %s", path, err == Z_ERRNO ? strerror(errno) : msg), -1);
    gzclose(f);
    return rc;
}

// The directory OUT_PREFIX's files go in ("." for a bare prefix).
static void parent_of(const char *out, char dir[4096]) {
    snprintf(dir, 4096, "%s", out);
    char *slash = strrchr(dir, '/');
    if (!slash) snprintf(dir, 4096, ".");
    else slash[slash == dir] = 0;  // ("/x": "/")
}

// Free bytes where OUT_PREFIX's files go.
static int check_room(const char *out, size_t text) {
    char dir[4096];
    parent_of(out, dir);
    struct statvfs v;
    if (statvfs(dir, &v) != 0) return 0;  // (the writes say it if they fail)
    size_t need = 2 * text + 4096, room = (size_t)v.f_bavail * v.f_frsize;
    char a[64], b[64];
    if (need > room)
        return cli_error("%s: the token files need %s, but %s is free there", dir, dt_mem_format(need, a, sizeof a),
                         dt_mem_format(room, b, sizeof b)), -1;
    return 0;
}

// Creates OUT_PREFIX's directory (mkdir -p), as 'train' does for runs.
static int make_parent(const char *out) {
    char dir[4096];
    parent_of(out, dir);
    return dt_make_dirs(dir) == DT_OK ? 0 : (cli_error("%s", dt_last_error()), -1);
}

static int write_splits(const inputs *in, size_t total, double frac, const char *out) {
    splitter *s = calloc(1, sizeof *s);
    if (!s) return cli_error("out of memory"), -1;
    s->every = (size_t)(1.0 / frac + 0.5) < 2 ? 2 : (size_t)(1.0 / frac + 0.5);
    s->total = total;
    // A corpus smaller than `every` blocks: validation is its end, so that
    // both files are non-empty.
    if (total / BLOCK < s->every) s->tail = (size_t)((double)total * frac) > 0 ? (size_t)((double)total * frac) : 1;
    char tp[4096], vp[4096];
    snprintf(tp, sizeof tp, "%s_train.bin", out);
    snprintf(vp, sizeof vp, "%s_val.bin", out);
    int rc = dt_tokens_writer_open(&s->train, tp) == DT_OK && dt_tokens_writer_open(&s->val, vp) == DT_OK
                 ? 0 : (cli_error("%s", dt_last_error()), -1);
    for (int i = 0; i < in->n && rc == 0; i++) rc = stream_file(s, in->path[i]);
    if (rc == 0 && (flush_split(s, 0) != DT_OK || flush_split(s, 1) != DT_OK)) rc = (cli_error("%s", dt_last_error()), -1);
    size_t nt = s->train ? dt_tokens_writer_count(s->train) : 0, nv = s->val ? dt_tokens_writer_count(s->val) : 0;
    if (rc == 0 && (s->at != total || !nt || !nv))
        rc = (cli_error("%s%s: %zu bytes of text were announced and %zu read (a file changed while it was read?)%s",
                       in->path[0], in->n > 1 ? " ..." : "", total, s->at, nt && nv ? "" : "; no token file written"),
              -1);
    if (dt_tokens_writer_close(s->train, rc == 0) != DT_OK || dt_tokens_writer_close(s->val, rc == 0) != DT_OK)
        rc = (cli_error("%s", dt_last_error()), -1);
    if (rc == 0)
        printf("read %d files, %zu bytes: %s (%zu tokens), %s (%zu tokens), vocab 256\n", in->n, nt + nv, tp, nt, vp,
               nv);
    free(s);
    return rc;
}

int cmd_prepare_text(int argc, char **argv) {
    const char *out = NULL;
    double frac = 0.1;
    const char *ins[1024];
    int nin = 0;
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i];
        if (!strcmp(s, "-h") || !strcmp(s, "--help")) {
            fputs(help, stdout);
            return 0;
        } else if (!strcmp(s, "-o") || !strcmp(s, "--out")) {
            if (i + 1 >= argc) return cli_error("%s needs OUT_PREFIX", s), EXIT_USAGE;
            out = argv[++i];
        } else if (!strcmp(s, "--val-fraction")) {
            if (parse_number(s, i + 1 < argc ? argv[++i] : NULL, 0.000001, 0.5, 0, &frac)) return EXIT_USAGE;
        } else if (s[0] == '-' && s[1]) {
            return cli_error("unknown option '%s' (see 'dtrain prepare-text --help')", s), EXIT_USAGE;
        } else if (nin < 1024) {
            ins[nin++] = s;
        } else {
            return cli_error("too many inputs (at most 1024; pass a directory)"), EXIT_USAGE;
        }
    }
    if (!nin || !out) return cli_error("need IN... and -o OUT_PREFIX (see 'dtrain prepare-text --help')"), EXIT_USAGE;
    inputs in = {0};
    size_t total = 0;
    int rc = 0;
    for (int i = 0; i < nin && rc == 0; i++) rc = collect(&in, ins[i], 0);
    for (int i = 0; i < in.n && rc == 0; i++) {
        if (in.size[i] > MAX_TEXT - total)
            rc = too_much(in.path[i]);
        total += in.size[i];
    }
    if (rc == 0 && total < 2)
        rc = (cli_error("%s%s: %zu bytes of text; prepare-text needs at least 2 (one token for each split)", ins[0],
                       nin > 1 ? " ..." : "", total), -1);
    if (rc == 0) rc = make_parent(out);
    if (rc == 0) rc = check_room(out, total);
    if (rc == 0) rc = write_splits(&in, total, frac, out);
    free_inputs(&in);
    return rc == 0 ? 0 : EXIT_RUNTIME;
}
