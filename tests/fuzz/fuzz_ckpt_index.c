/* libFuzzer target: the index.json of a sharded checkpoint. A real sharded
 * checkpoint of a small model (tensors "0.weight" [3, 4] and "0.bias" [3],
 * AdamW, two shards) is written once into a temp directory; each input
 * replaces its index.json, and the directory is read (dt_ckpt_read),
 * inspected and exported, as resume, `dtrain inspect` and `dtrain export`
 * do.
 *
 * Whatever the bytes: no crash, overread or leak; a failed read leaves the
 * model's buffers exactly as they were; a successful one has a training
 * state in range; nothing is left in the temp directory but the
 * checkpoint. */
#include "dtrain/ckpt.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define NP 15

static char g_root[512], g_dir[600];

static void remove_tree(void) {
    char p[1200];
    const char *dirs[] = {g_dir, g_root};
    for (int k = 0; k < 2; k++) {
        DIR *d = opendir(dirs[k]);
        struct dirent *e;
        while (d && (e = readdir(d))) {
            if (e->d_name[0] == '.') continue;
            snprintf(p, sizeof p, "%s/%s", dirs[k], e->d_name);
            unlink(p);
        }
        if (d) closedir(d);
        rmdir(dirs[k]);
    }
}

static const dt_tensor_info g_t[2] = {{"0.weight", 2, {3, 4}, 0, 12}, {"0.bias", 1, {3}, 12, 3}};

// The sharded checkpoint at step 1, written by the writers of two ranks.
static int setup(void) {
    const char *td = getenv("TMPDIR");
    snprintf(g_root, sizeof g_root, "%s/fuzz-ckpt-index-XXXXXX", td && *td ? td : "/tmp");
    if (!mkdtemp(g_root)) return -1;
    snprintf(g_dir, sizeof g_dir, "%s/step-00000001", g_root);
    atexit(remove_tree);
    float p[NP], m1[NP], m2[NP];
    int64_t step = 1;
    for (int i = 0; i < NP; i++) p[i] = (float)i, m1[i] = 0.5f * (float)i, m2[i] = 0.25f;
    dt_ckpt_model m = {.tensors = g_t, .ntensors = 2, .params = p, .nparams = NP, .nstates = 2,
                       .states = {m1, m2}, .opt_step = &step, .optimizer = "adamw", .config = "[model]\n"};
    dt_train_state s = {1, 0, 1, 1, 2.5, {{1, 2, 3, 4}}, 2, 0, 0, 0};
    dt_ckpt_writer *w[2] = {NULL, NULL};
    int ok = 1;
    for (int r = 0; r < 2; r++) ok = ok && dt_ckpt_writer_create(&w[r], g_root, 2, &m, r, 2, 10) == DT_OK;
    for (int r = 0; r < 2; r++) ok = ok && dt_ckpt_writer_save(w[r], &s) == DT_OK;
    for (int r = 0; r < 2; r++) {
        if (w[r]) ok = ok && dt_ckpt_writer_wait(w[r]) == DT_OK;
        dt_ckpt_writer_free(w[r]);
    }
    return ok ? 0 : -1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int ready = 0;
    if (!ready) {
        if (setup() != 0) {
            fprintf(stderr, "fuzz_ckpt_index: cannot write the sharded checkpoint: %s\n", dt_last_error());
            abort();
        }
        ready = 1;
    }
    char path[700];
    snprintf(path, sizeof path, "%s/index.json", g_dir);
    FILE *f = fopen(path, "wb");
    if (!f) abort();
    if (size && fwrite(data, 1, size, f) != size) abort();
    fclose(f);

    float p[NP], m1[NP], m2[NP], before[3 * NP];
    int64_t step = -7;
    for (int i = 0; i < NP; i++) p[i] = m1[i] = m2[i] = (float)-i;
    memcpy(before, p, sizeof p);
    memcpy(before + NP, m1, sizeof m1);
    memcpy(before + 2 * NP, m2, sizeof m2);
    dt_ckpt_model m = {.tensors = g_t, .ntensors = 2, .params = p, .nparams = NP, .nstates = 2,
                       .states = {m1, m2}, .opt_step = &step, .optimizer = "adamw", .config = ""};
    dt_train_state s;
    if (dt_ckpt_read(g_dir, &m, &s) != DT_OK) {
        if (memcmp(before, p, sizeof p) || memcmp(before + NP, m1, sizeof m1) ||
            memcmp(before + 2 * NP, m2, sizeof m2) || step != -7)
            abort();  // a failed read touched the model
    } else if (s.step < 0 || s.epoch < 0 || s.epoch_batch < 0 || s.world < 1 || step < 0) {
        abort();
    }
    FILE *devnull = fopen("/dev/null", "w");
    if (devnull) {
        dt_ckpt_inspect(g_dir, devnull);
        fclose(devnull);
    }
    char out[700];
    snprintf(out, sizeof out, "%s/exported.safetensors", g_root);
    dt_ckpt_export_weights(g_dir, out);
    unlink(out);
    // Nothing else appears beside the checkpoint (no temp files).
    DIR *d = opendir(g_root);
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (e->d_name[0] != '.' && strcmp(e->d_name, "step-00000001")) abort();
    if (d) closedir(d);
    return 0;
}
