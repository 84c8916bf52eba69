/* A standalone driver for the fuzz targets, used where libFuzzer is not
 * (the default gcc build): feeds every regular file of each directory (or
 * each file) named on the command line to LLVMFuzzerTestOneInput, once.
 * ctest runs it over tests/fuzz/corpus/<target>/ as a regression test: a
 * crash, abort or sanitizer report fails it.
 *
 *   replay_idx tests/fuzz/corpus/idx
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "replay: %s: cannot open\n", path);
        return -1;
    }
    size_t cap = 4096, n = 0, r;
    uint8_t *buf = malloc(cap);
    while (buf && (r = fread(buf + n, 1, cap - n, f)) > 0) {
        n += r;
        if (n == cap) {
            uint8_t *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
    }
    fclose(f);
    if (!buf) {
        fprintf(stderr, "replay: %s: out of memory\n", path);
        return -1;
    }
    // An exact-size copy, so that ASan (when on) catches a read one past the end.
    uint8_t *exact = malloc(n ? n : 1);
    if (exact) memcpy(exact, buf, n);
    free(buf);
    if (!exact) return -1;
    LLVMFuzzerTestOneInput(exact, n);
    free(exact);
    return 0;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s CORPUS_DIR_OR_FILE...\n", argv[0]);
        return 2;
    }
    int files = 0, errors = 0;
    for (int a = 1; a < argc; a++) {
        struct stat st;
        if (stat(argv[a], &st) != 0) {
            fprintf(stderr, "replay: %s: not found\n", argv[a]);
            errors++;
            continue;
        }
        if (!S_ISDIR(st.st_mode)) {
            errors += run_file(argv[a]) != 0;
            files++;
            continue;
        }
        DIR *d = opendir(argv[a]);
        if (!d) {
            errors++;
            continue;
        }
        // Sorted, so a failure reproduces in the same order.
        char **names = NULL;
        size_t nn = 0, cap = 0;
        struct dirent *e;
        while ((e = readdir(d))) {
            if (e->d_name[0] == '.') continue;
            if (nn == cap) {
                cap = cap ? cap * 2 : 64;
                char **nb = realloc(names, cap * sizeof *names);
                if (!nb) break;
                names = nb;
            }
            names[nn++] = strdup(e->d_name);
        }
        closedir(d);
        if (nn) qsort(names, nn, sizeof *names, cmp_str);
        for (size_t i = 0; i < nn; i++) {
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", argv[a], names[i]);
            if (stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
                fprintf(stderr, "replay: %s\n", path);
                errors += run_file(path) != 0;
                files++;
            }
            free(names[i]);
        }
        free(names);
    }
    printf("replayed %d inputs, %d unreadable\n", files, errors);
    return errors || files == 0 ? 1 : 0;
}
