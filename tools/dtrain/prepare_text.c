/* dtrain prepare-text: text files -> byte-level llm.c token files. */
#include "cli.h"
#include "dtrain/dtrain.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char help[] =
    "usage: dtrain prepare-text IN... -o OUT_PREFIX [--val-fraction F]\n"
    "\n"
    "Turns text into byte-level token files (vocabulary 256: token = byte) in\n"
    "llm.c's format, OUT_PREFIX_train.bin and OUT_PREFIX_val.bin, for a GPT\n"
    "config's [data] train_file / val_file. Each IN is a file, or a directory\n"
    "whose regular files are read in name order (symlinks and *.dat skipped,\n"
    "so /usr/share/games/fortunes works as it is). The text is concatenated\n"
    "and cut into 8 KiB blocks; every round(1/F)-th block goes to validation\n"
    "(F from 0.000001 to 0.5, default 0.1), so both splits sample the whole\n"
    "corpus.\n"
    "\n"
    "Limits: at most 1 GiB of text in all (a larger input, or an endless one\n"
    "such as /dev/zero, is an error: split the corpus); the run needs about\n"
    "5 bytes of memory per byte of text and refuses when that is not\n"
    "available; no text at all (an empty file, /dev/null) is an error.\n"
    "\n"
    "example: dtrain prepare-text /usr/share/games/fortunes -o data/fortunes\n";

// The most text one run reads: the token files count tokens in an int32,
// and the run holds the text and its tokens (5 bytes a byte) in memory.
#define MAX_TEXT ((size_t)1 << 30)

typedef struct {
    uint8_t *data;
    size_t n, cap;
} bytes;

static int append_file(bytes *b, const char *path) {
    FILE *f = dt_fopen_read(path);
    if (!f) return cli_error("%s", dt_last_error()), -1;
    for (;;) {
        if (b->n > MAX_TEXT) {
            fclose(f);
            return cli_error("%s: the input passes %zu bytes (1 GiB), the most prepare-text reads (an endless "
                             "file? split a larger corpus)", path, MAX_TEXT), -1;
        }
        if (b->cap - b->n < 65536) {
            size_t cap = b->cap ? b->cap * 2 : 1 << 20;
            if (cap > MAX_TEXT + 65536) cap = MAX_TEXT + 65536;
            uint8_t *d = realloc(b->data, cap);
            if (!d) {
                fclose(f);
                return cli_error("out of memory"), -1;
            }
            b->data = d;
            b->cap = cap;
        }
        size_t r = fread(b->data + b->n, 1, b->cap - b->n < 65536 ? b->cap - b->n : 65536, f);
        b->n += r;
        if (r == 0) break;
    }
    int err = ferror(f);
    fclose(f);
    if (err) return cli_error("%s: read error", path), -1;
    return 0;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int append_path(bytes *b, const char *path, int *nfiles) {
    struct stat sb;
    if (stat(path, &sb) != 0) return cli_error("%s: %s", path, strerror(errno)), -1;
    if (!S_ISDIR(sb.st_mode)) {
        (*nfiles)++;
        return append_file(b, path);
    }
    DIR *d = opendir(path);
    if (!d) return cli_error("%s: cannot open directory: %s", path, strerror(errno)), -1;
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    int rc = 0;
    while ((e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (e->d_name[0] == '.' || (len > 4 && !strcmp(e->d_name + len - 4, ".dat"))) continue;
        char full[4096];
        snprintf(full, sizeof full, "%s/%s", path, e->d_name);
        struct stat ls;
        if (lstat(full, &ls) != 0 || !S_ISREG(ls.st_mode)) continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            char **nn = realloc(names, cap * sizeof *names);
            if (!nn) {
                rc = -1;
                break;
            }
            names = nn;
        }
        names[n++] = strdup(full);
    }
    closedir(d);
    if (names) qsort(names, n, sizeof *names, cmp_str);
    for (size_t i = 0; i < n; i++) {
        if (rc == 0) {
            rc = append_file(b, names[i]);
            (*nfiles)++;
        }
        free(names[i]);
    }
    free(names);
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
    bytes b = {0};
    int nfiles = 0;
    for (int i = 0; i < nin; i++)
        if (append_path(&b, ins[i], &nfiles) != 0) {
            free(b.data);
            return EXIT_RUNTIME;
        }
    if (b.n < 2) {
        free(b.data);
        return cli_error("%s%s: %zu bytes of text; prepare-text needs at least 2 (one token for each split)", ins[0],
                         nin > 1 ? " ..." : "", b.n), EXIT_RUNTIME;
    }
    const char *src;
    char need[64], have[64];
    size_t avail = dt_mem_available(&src);
    if (b.n * 5 > avail) {
        free(b.data);
        return cli_error("%zu bytes of text need %s of memory to split into tokens, but %s is available (%s)", b.n,
                         dt_mem_format(b.n * 5, need, sizeof need), dt_mem_format(avail, have, sizeof have), src),
               EXIT_RUNTIME;
    }
    enum { BLOCK = 8192 };
    size_t every = (size_t)(1.0 / frac + 0.5);
    if (every < 2) every = 2;
    uint16_t *train = malloc(sizeof(uint16_t) * (b.n + 1)), *val = malloc(sizeof(uint16_t) * (b.n + 1));
    if (!train || !val) {
        free(b.data);
        free(train);
        free(val);
        return cli_error("out of memory"), EXIT_RUNTIME;
    }
    size_t nt = 0, nv = 0;
    for (size_t i = 0; i < b.n; i++) {
        if ((i / BLOCK) % every == every - 1) val[nv++] = b.data[i];
        else train[nt++] = b.data[i];
    }
    // A corpus smaller than `every` blocks: take the validation split from
    // the end so that both files are non-empty.
    if (nv == 0 && nt > 1) {
        size_t k = (size_t)(nt * frac) > 0 ? (size_t)(nt * frac) : 1;
        memcpy(val, train + nt - k, k * sizeof *val);
        nv = k;
        nt -= k;
    }
    // Create OUT_PREFIX's directory (mkdir -p), as 'train' does for runs.
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", out);
    char *slash = strrchr(dir, '/');
    if (slash && slash != dir) {
        *slash = 0;
        for (char *p = dir + 1;; p++) {
            if (*p == '/' || !*p) {
                char ch = *p;
                *p = 0;
                if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
                    cli_error("%s: cannot create directory: %s", dir, strerror(errno));
                    free(b.data);
                    free(train);
                    free(val);
                    return EXIT_RUNTIME;
                }
                if (!ch) break;
                *p = ch;
            }
        }
    }
    char tp[4096], vp[4096];
    snprintf(tp, sizeof tp, "%s_train.bin", out);
    snprintf(vp, sizeof vp, "%s_val.bin", out);
    dt_status st = dt_tokens_write(tp, train, nt);
    if (st == DT_OK) st = dt_tokens_write(vp, val, nv);
    free(b.data);
    free(train);
    free(val);
    if (st != DT_OK) return cli_error("%s", dt_last_error()), EXIT_RUNTIME;
    printf("read %d files, %zu bytes: %s (%zu tokens), %s (%zu tokens), vocab 256\n", nfiles, nt + nv, tp, nt, vp, nv);
    return 0;
}
