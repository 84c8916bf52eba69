/* libFuzzer target: dt_config_write round trip.
 *
 * Whatever dt_config_parse accepts (input as in fuzz_config: the text, and
 * the bytes after a NUL as one --set override), dt_config_write must write as
 * a file that dt_config_load reads back to the same config. This found a
 * dropout p written with too few digits and values whose ';' turned into a
 * comment when written back. Uses the config corpus (tests/fuzz/corpus/config).
 * Writes one scratch file, in /dev/shm when there is one (dt_config_write
 * fsyncs), else in $TMPDIR or /tmp. */
#include "dtrain/config.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char g_path[512];

// Fields the writer spells out where the parser left 0 for "the default".
static void normalise(dt_config *c) {
    for (int i = 0; i < c->nlayers; i++) {
        dt_layer_spec *l = &c->layers[i];
        if (l->kind == DT_LAYER_CONV2D && !l->stride) l->stride = 1;
        if (l->kind == DT_LAYER_MAXPOOL && !l->stride) l->stride = l->kernel;
        if (l->kind == DT_LAYER_LAYERNORM && !l->eps) l->eps = 1e-5f;
    }
    c->preset[0] = 0;  // written out as its layers
    memset(c->name, 0, sizeof c->name);  // the name comes from the file name
}

#define SAME(f)                                                                     \
    if (memcmp(&a->f, &b->f, sizeof a->f)) {                                        \
        fprintf(stderr, "config round trip: %s differs after dt_config_write\n", #f); \
        abort();                                                                    \
    }

static void compare(dt_config *a, dt_config *b) {
    normalise(a);
    normalise(b);
    SAME(input) SAME(nlayers) SAME(mean) SAME(std) SAME(shuffle) SAME(prefetch) SAME(drop_last)
    SAME(optim) SAME(sched) SAME(warmup_steps) SAME(min_lr) SAME(batch) SAME(eval_batch) SAME(epochs)
    SAME(max_steps) SAME(seed) SAME(threads) SAME(log_every)
    if (strcmp(a->dataset, b->dataset) || strcmp(a->data_dir, b->data_dir)) {
        fprintf(stderr, "config round trip: data '%s' '%s' read back as '%s' '%s'\n", a->dataset, a->data_dir,
                b->dataset, b->data_dir);
        abort();
    }
    for (int i = 0; i < a->nlayers; i++)
        if (memcmp(&a->layers[i], &b->layers[i], sizeof a->layers[i])) {
            fprintf(stderr, "config round trip: layer %d differs after dt_config_write\n", i);
            abort();
        }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > (1 << 16)) return 0;
    if (!g_path[0]) {
        const char *dir = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
        snprintf(g_path, sizeof g_path, "%s/dtrain-fuzz-roundtrip-%d.ini", dir, (int)getpid());
    }
    char *text = malloc(size + 2);
    dt_config *a = malloc(sizeof *a), *b = malloc(sizeof *b);
    if (!text || !a || !b) goto out;
    memcpy(text, data, size);
    text[size] = text[size + 1] = 0;
    size_t tl = strlen(text);
    const char *ov[1] = {text + tl + 1};
    if (dt_config_parse(a, text, "fuzz.ini", ov, tl < size) != DT_OK) goto out;
    if (dt_config_write(a, g_path) != DT_OK) {
        fprintf(stderr, "config round trip: write: %s\n", dt_last_error());
        abort();
    }
    if (dt_config_load(b, g_path, NULL, 0) != DT_OK) {
        fprintf(stderr, "config round trip: the written config does not load: %s\n", dt_last_error());
        abort();
    }
    unlink(g_path);
    compare(a, b);
out:
    free(text);
    free(a);
    free(b);
    return 0;
}
