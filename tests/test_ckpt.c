/* Checkpoints, resume, restarts and elastic workers.
 *
 *   1. The file: a round trip restores weights, optimizer state and the
 *      loop's position bit for bit; truncated, bit-flipped, wrong-model,
 *      wrong-optimizer, wrong-version files and weights-only files are
 *      refused with an error naming the file, and leave the model alone.
 *   2. The directory: the newest valid checkpoint is taken, damaged ones are
 *      skipped for older ones, an incompatible one is an error; the
 *      background writer keeps the newest N, writes the snapshot taken at
 *      save time, and clears temp files of a writer that was killed.
 *   3. Runs (deterministic mode, so "the same model" means bitwise equal):
 *      a run stopped by a failure mid-epoch and resumed with --resume auto
 *      on more workers (2 -> 3) and on fewer (3 -> 1) ends with the
 *      parameters of an uninterrupted run; so does a resume after the newest
 *      checkpoint was damaged; --max-restarts brings a run through a
 *      SIGKILLed worker and a hung one (heartbeats); --workers MIN:MAX
 *      shrinks when a worker cannot come back and grows again later.
 *      A GPT run checkpointed on 2 workers resumes on 3, one checkpointed
 *      (sharded) on 3 resumes on 1, each bitwise the uninterrupted run.
 *      ZeRO (docs/zero.md): each rank writes its own shard; the state
 *      resumes at another worker count and stage (3 on 4 -> 0 on 1, 1 on 2
 *      -> 3 on 3), after a SIGKILLed worker (zero 3), through an elastic
 *      3 -> 2 -> 3 (zero 3), and exports whole weights; a disk that fills
 *      during a ZeRO run stops it naming the file, the newest complete
 *      checkpoint intact.
 *   4. Bad flags and a refused resume: clear errors. */
#include "dtrain/ckpt.h"
#include "dtrain/gpt.h"
#include "dtrain/optim.h"
#include "testlib.h"

#include <errno.h>
#include <math.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char g_tmp[256];
static char g_out[1 << 17];

static const char *tmp(const char *name) { return tl_path(g_tmp, name); }

// ---------------------------------------------------------------------------
// 1, 2: the file and the directory

typedef struct {
    dt_model *m;
    dt_optim *o;
    dt_tensor_info t[16];
    dt_ckpt_model cm;
} net;

static void net_make(net *n, int hidden, dt_optim_kind kind, uint64_t seed) {
    int in[3] = {1, 4, 4};
    dt_layer_spec l[3] = {{.kind = DT_LAYER_FLATTEN}, {.kind = DT_LAYER_LINEAR, .out = hidden},
                          {.kind = DT_LAYER_LINEAR, .out = 3}};
    CHECK(dt_model_create(&n->m, in, l, 3, 4) == DT_OK, "model: %s", dt_last_error());
    dt_model_init(n->m, seed);
    dt_optim_params p = dt_optim_default_params(kind);
    p.momentum = 0.9f;
    CHECK(dt_optim_create(&n->o, &p, dt_model_num_params(n->m)) == DT_OK, "optim: %s", dt_last_error());
    int nt = dt_model_num_tensors(n->m);
    for (int i = 0; i < nt; i++) n->t[i] = *dt_model_tensor(n->m, i);
    n->cm = (dt_ckpt_model){.tensors = n->t, .ntensors = nt, .params = dt_model_params(n->m),
                            .nparams = dt_model_num_params(n->m), .nstates = dt_optim_num_states(n->o),
                            .opt_step = dt_optim_step_count(n->o), .optimizer = dt_optim_kind_name(kind),
                            .config = "[run]\nname = t\n"};
    for (int j = 0; j < n->cm.nstates; j++) n->cm.states[j] = dt_optim_state(n->o, j);
    // A few steps, so that the optimizer state is not zero.
    float *g = dt_model_grads(n->m);
    for (int s = 0; s < 3; s++) {
        for (size_t i = 0; i < n->cm.nparams; i++) g[i] = (float)((i * 7 + s) % 13) / 13.0f - 0.5f;
        dt_optim_step(n->o, n->cm.params, g, 0.01f, 1.0f);
    }
}

static void net_free(net *n) {
    dt_model_free(n->m);
    dt_optim_free(n->o);
}

// All of n's state, to see whether a failed load touched it.
static size_t net_bytes(const net *n, unsigned char *buf) {
    size_t k = 0, np = n->cm.nparams * sizeof(float);
    memcpy(buf + k, n->cm.params, np), k += np;
    for (int j = 0; j < n->cm.nstates; j++) memcpy(buf + k, n->cm.states[j], np), k += np;
    memcpy(buf + k, n->cm.opt_step, 8), k += 8;
    return k;
}

static void write_file(const char *path, const unsigned char *buf, size_t n) {
    FILE *f = fopen(path, "wb");
    if (f) {
        fwrite(buf, 1, n, f);
        fclose(f);
    }
}

// Values inside a checkpoint whose checksum holds are still range-checked,
// on every path, and a damaged format value does not make a checkpoint
// plain weights. Returns the number of cases.
static int test_values(net *a, net *b) {
    char p[600], wp[600];
    snprintf(p, sizeof p, "%s", tmp("values.safetensors"));
    snprintf(wp, sizeof wp, "%s", tmp("values-w.safetensors"));
    dt_train_state good = {20, 1, 3, 4, 1.5, {{1, 2, 3, 4}}, 1, 0, 0, 0};
    struct {
        const char *what, *want;
        dt_train_state s;
        int64_t opt_step;
    } cases[] = {
        {"epoch 1e12", "'epoch'", {20, 1000000000000ll, 3, 4, 1.5, {{1, 2, 3, 4}}, 1, 0, 0, 0}, 20},
        {"negative epoch", "'epoch'", {20, -1, 3, 4, 1.5, {{1, 2, 3, 4}}, 1, 0, 0, 0}, 20},
        {"negative step", "'step'", {-5, 1, 3, 4, 1.5, {{1, 2, 3, 4}}, 1, 0, 0, 0}, 20},
        {"step 2^62", "'step'", {1ll << 62, 1, 3, 4, 1.5, {{1, 2, 3, 4}}, 1, 0, 0, 0}, 20},
        {"negative epoch_batch", "'epoch_batch'", {20, 1, -3, 4, 1.5, {{1, 2, 3, 4}}, 1, 0, 0, 0}, 20},
        {"negative epoch_steps", "'epoch_steps'", {20, 1, 3, -4, 1.5, {{1, 2, 3, 4}}, 1, 0, 0, 0}, 20},
        {"world 0", "'world_size'", {20, 1, 3, 4, 1.5, {{1, 2, 3, 4}}, 0, 0, 0, 0}, 20},
        {"world -3", "'world_size'", {20, 1, 3, 4, 1.5, {{1, 2, 3, 4}}, -3, 0, 0, 0}, 20},
        {"epoch_loss NaN", "'epoch_loss'", {20, 1, 3, 4, NAN, {{1, 2, 3, 4}}, 1, 0, 0, 0}, 20},
        {"epoch_loss inf", "'epoch_loss'", {20, 1, 3, 4, INFINITY, {{1, 2, 3, 4}}, 1, 0, 0, 0}, 20},
        {"negative optimizer step", "'optimizer.step'", {20, 1, 3, 4, 1.5, {{1, 2, 3, 4}}, 1, 0, 0, 0}, -5},
        {"optimizer step 2^62", "'optimizer.step'", {20, 1, 3, 4, 1.5, {{1, 2, 3, 4}}, 1, 0, 0, 0}, 1ll << 62},
        {"loss scale inf", "'loss_scaler'", {20, 1, 3, 4, 1.5, {{1, 2, 3, 4}}, 1, INFINITY, 0, 0}, 20},
        {"loss scaler clean -1", "'loss_scaler'", {20, 1, 3, 4, 1.5, {{1, 2, 3, 4}}, 1, 1024, -1, 0}, 20},
        {"loss scaler skipped 2^62", "'loss_scaler'", {20, 1, 3, 4, 1.5, {{1, 2, 3, 4}}, 1, 1024, 5, 1ll << 62}, 20},
    };
    int n = 0;
    int64_t keep = *a->cm.opt_step;
    FILE *devnull = fopen("/dev/null", "w");
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        *a->cm.opt_step = cases[i].opt_step;
        CHECK(dt_ckpt_write(p, &a->cm, &cases[i].s) == DT_OK, "write %s", cases[i].what);
        *a->cm.opt_step = keep;
        dt_train_state r;
        for (int k = 0; k < 4; k++, n++) {
            dt_status st = k == 0 ? dt_ckpt_read(p, &b->cm, &r)
                           : k == 1 ? dt_model_load(b->m, p)
                           : k == 2 ? dt_ckpt_export_weights(p, wp)
                                    : dt_ckpt_inspect(p, devnull);
            CHECK(st == DT_ERR_FORMAT && strstr(dt_last_error(), cases[i].want) && strstr(dt_last_error(), p),
                  "%s (path %d) is refused naming %s: %s", cases[i].what, k, cases[i].want, dt_last_error());
        }
    }
    CHECK(access(wp, F_OK) != 0, "no export written from a refused checkpoint");
    // A flip inside the format value: still verified as a checkpoint.
    CHECK(dt_ckpt_write(p, &a->cm, &good) == DT_OK, "write");
    size_t len;
    unsigned char *file = (unsigned char *)tl_read_file(p, &len);
    char *v = memmem(file, len, "\"dtrain-checkpoint\"", 19);
    CHECK(v != NULL, "format value in the header");
    const char *flips[] = {"dtrain-checkpoinu", "dtrain-weights   ", "Dtrain-checkpoint"};
    for (size_t i = 0; v && i < sizeof flips / sizeof flips[0]; i++) {
        char save[17];
        memcpy(save, v + 1, 17);
        memcpy(v + 1, flips[i], 17);
        write_file(p, file, len);
        memcpy(v + 1, save, 17);
        dt_train_state r;
        for (int k = 0; k < 4; k++, n++) {
            dt_status st = k == 0 ? dt_ckpt_read(p, &b->cm, &r)
                           : k == 1 ? dt_model_load(b->m, p)
                           : k == 2 ? dt_ckpt_export_weights(p, wp)
                                    : dt_ckpt_inspect(p, devnull);
            CHECK(st == DT_ERR_FORMAT && strstr(dt_last_error(), "checksum"),
                  "format '%.17s' (path %d): a damaged checkpoint, not weights: %s", flips[i], k, dt_last_error());
        }
    }
    free(file);
    fclose(devnull);
    // Other tools' weights may carry a key a checkpoint has too: still weights.
    dt_st_meta foreign[2] = {{"format", "pt"}, {"config", "{\"hidden\": 5}"}};
    CHECK(dt_model_save(a->m, p, foreign, 2) == DT_OK && dt_model_load(b->m, p) == DT_OK,
          "weights with a 'config' key load as weights: %s", dt_last_error());
    return n;
}

// A sharded checkpoint (dir, of model h, 3 shards) with a damaged
// index.json: every reader refuses it with a message naming the field,
// allocates nothing for sizes the shard files do not hold, leaves h
// untouched and leaves no file behind. Returns the number of cases.
typedef struct {
    const char *what, *want;
    const char *raw;                            // the whole index, or NULL
    const char *step, *world, *nparams, *nstates, *dims0, *offset_last, *shards;  // NULL: as written
} index_case;

static void index_json(char *out, size_t n, const net *h, const index_case *c) {
    size_t np = h->cm.nparams, w = 0;
    if (c->raw) {
        snprintf(out, n, "%s", c->raw);
        return;
    }
    char nps[32];
    snprintf(nps, sizeof nps, "%zu", np);
    w += (size_t)snprintf(out + w, n - w,
                          "{\"format\":\"dtrain-checkpoint-index\",\"format_version\":1,\"step\":%s,\"world_size\":%s,"
                          "\"nparams\":%s,\"nstates\":%s,\"optimizer\":\"adamw\",\"tensors\":[",
                          c->step ? c->step : "7", c->world ? c->world : "3", c->nparams ? c->nparams : nps,
                          c->nstates ? c->nstates : "2");
    for (int i = 0; i < h->cm.ntensors; i++) {
        const dt_tensor_info *t = &h->t[i];
        char dims[200] = "", off[40];
        for (int d = 0; d < t->ndim; d++)
            snprintf(dims + strlen(dims), sizeof dims - strlen(dims), "%s%lld", d ? "," : "", (long long)t->shape[d]);
        snprintf(off, sizeof off, "%zu", t->offset);
        w += (size_t)snprintf(out + w, n - w, "%s{\"name\":\"%s\",\"shape\":[%s],\"offset\":%s}", i ? "," : "",
                              t->name, i == 0 && c->dims0 ? c->dims0 : dims,
                              i == h->cm.ntensors - 1 && c->offset_last ? c->offset_last : off);
    }
    w += (size_t)snprintf(out + w, n - w, "],\"shards\":");
    if (c->shards) {
        snprintf(out + w, n - w, "%s}", c->shards);
        return;
    }
    for (int r = 0; r < 3; r++) {
        size_t b, e;
        dt_shard_range(np, r, 3, &b, &e);
        w += (size_t)snprintf(out + w, n - w, "%s{\"file\":\"shard-%05d-of-00003.safetensors\",\"begin\":%zu,\"end\":%zu}",
                              r ? "," : "[", r, b, e);
    }
    snprintf(out + w, n - w, "]}");
}

static int test_index(const char *dir, net *h) {
    char ip[700], out[700];
    snprintf(ip, sizeof ip, "%s/index.json", dir);
    snprintf(out, sizeof out, "%s", tmp("idx-export.safetensors"));
    size_t ilen;
    char *orig = tl_read_file(ip, &ilen);
    if (!orig) return CHECK(0, "index.json"), 0;
    static unsigned char before[1 << 16], after[1 << 16];
    size_t nb = net_bytes(h, before), np = h->cm.nparams, b1, e1, b2, e2;
    dt_shard_range(np, 1, 3, &b1, &e1);
    dt_shard_range(np, 2, 3, &b2, &e2);
    char overlap[600], outside[600], claim[2][600];
    const char *f0 = "{\"file\":\"shard-00000-of-00003.safetensors\",\"begin\":0,\"end\":";
    snprintf(overlap, sizeof overlap, "[%s%zu},{\"file\":\"shard-00001-of-00003.safetensors\",\"begin\":%zu,\"end\":%zu},"
             "{\"file\":\"shard-00002-of-00003.safetensors\",\"begin\":%zu,\"end\":%zu}]", f0, b1, b1 - 1, e1, b2, e2);
    snprintf(outside, sizeof outside, "[%s%zu},{\"file\":\"../../x\",\"begin\":%zu,\"end\":%zu},"
             "{\"file\":\"shard-00002-of-00003.safetensors\",\"begin\":%zu,\"end\":%zu}]", f0, b1, b1, e1, b2, e2);
    const char *claims[2] = {"500000000", "562949953421312"};
    for (int k = 0; k < 2; k++)
        snprintf(claim[k], sizeof claim[k], "[%s%zu},{\"file\":\"shard-00001-of-00003.safetensors\",\"begin\":%zu,\"end\":%zu},"
                 "{\"file\":\"shard-00002-of-00003.safetensors\",\"begin\":%zu,\"end\":%s}]", f0, b1, b1, e1, b2, claims[k]);
    index_case cases[] = {
        {"no shards, no parameters", "nparams",
         .raw = "{\"format\":\"dtrain-checkpoint-index\",\"format_version\":1,\"step\":7,\"world_size\":3,\"nparams\":0,"
         "\"nstates\":2,\"optimizer\":\"adamw\",\"tensors\":[],\"shards\":[]}"},
        {"no shards, no tensors", "tensors",
         .raw = "{\"format\":\"dtrain-checkpoint-index\",\"format_version\":1,\"step\":7,\"world_size\":3,\"nparams\":103,"
         "\"nstates\":2,\"optimizer\":\"adamw\",\"tensors\":[],\"shards\":[]}"},
        {"no shards", "shards", .shards = "[]"},
        {"negative dimension", "shape[0]", .dims0 = "-5,16"},
        {"dimension 2^62", "shape[0]", .dims0 = "4611686018427387904,16"},
        {"dimensions whose product wraps around", "more elements than", .dims0 = "4294967296,4294967296"},
        {"five dimensions", "4 dimensions", .dims0 = "1,1,1,5,16"},
        {"5e8 parameters", "cover the block once", .nparams = claims[0], .shards = claim[0]},
        {"2^49 parameters", "cover the block once", .nparams = claims[1], .shards = claim[1]},
        {"5e8 parameters in one tensor", "bytes",
         .raw = "{\"format\":\"dtrain-checkpoint-index\",\"format_version\":1,\"step\":7,\"world_size\":3,"
         "\"nparams\":500000000,\"nstates\":2,\"optimizer\":\"adamw\",\"tensors\":[{\"name\":\"1.weight\","
         "\"shape\":[500000000],\"offset\":0}],\"shards\":[{\"file\":\"shard-00000-of-00003.safetensors\",\"begin\":0,"
         "\"end\":166666667},{\"file\":\"shard-00001-of-00003.safetensors\",\"begin\":166666667,\"end\":333333334},"
         "{\"file\":\"shard-00002-of-00003.safetensors\",\"begin\":333333334,\"end\":500000000}]}"},
        {"a tensor dropped", "cover the block once", .offset_last = "0"},
        {"nparams 1e300", "nparams", .nparams = "1e300"},
        {"nparams -1", "nparams", .nparams = "-1"},
        {"offset past the end", "ends past", .offset_last = "101"},
        {"negative offset", "offset", .offset_last = "-10"},
        {"fractional offset", "offset", .offset_last = "1.5"},
        {"offset 1e300", "offset", .offset_last = "1e300"},
        {"shards overlapping", "does not continue", .shards = overlap},
        {"shard file outside the directory", "file", .shards = outside},
        {"world_size 1e9", "world_size", .world = "1e9"},
        {"world_size 0", "world_size", .world = "0"},
        {"nstates 3", "nstates", .nstates = "3"},
        {"negative step", "step", .step = "-1"},
        {"step 1e300", "step", .step = "1e300"},
        {"not JSON", "not a JSON object", .raw = "{\"format\":"},
        {"empty", "not a JSON object", .raw = ""},
    };
    int n = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char body[4096];
        index_json(body, sizeof body, h, &cases[i]);
        write_file(ip, (const unsigned char *)body, strlen(body));
        dt_train_state r;
        FILE *devnull = fopen("/dev/null", "w");
        // Nothing allocated for what the index claims (5e8 or 2^49
        // parameters, 1e9 ranks): with the address space capped at 1 GiB
        // more than now, an attempt would fail as out of memory.
        int capped = tl_cap_memory((size_t)1 << 30);
        for (int k = 0; k < 3; k++, n++) {
            dt_status st = k == 0 ? dt_ckpt_read(dir, &h->cm, &r)
                           : k == 1 ? dt_ckpt_inspect(dir, devnull)
                                    : dt_ckpt_export_weights(dir, out);
            CHECK(st != DT_OK && st != DT_ERR_NOMEM && strstr(dt_last_error(), cases[i].want) &&
                      strstr(dt_last_error(), "index.json") && !strstr(dt_last_error(), "out of memory"),
                  "%s (path %d): refused naming %s, nothing allocated for it (%s; address space capped: %d): %s\n%s",
                  cases[i].what, k, cases[i].want, dt_status_string(st), capped, dt_last_error(), body);
        }
        tl_uncap_memory();
        fclose(devnull);
        if (i == 0 && !capped) printf("address space not capped here: the refusals' allocations are not checked\n");
        CHECK(access(out, F_OK) != 0, "%s: no export written", cases[i].what);
        net_bytes(h, after);
        CHECK(!memcmp(before, after, nb), "%s: the model is untouched", cases[i].what);
    }
    // Nothing left behind: no export, no temp files.
    char cmd[900];
    snprintf(cmd, sizeof cmd, "ls -A '%s' | grep -c 'idx-export\\|gathered'; ls -A \"${TMPDIR:-/tmp}\" | grep -c dtrain-gathered",
             g_tmp);
    tl_run(cmd, g_out, sizeof g_out);
    CHECK(!strcmp(g_out, "0\n0\n"), "no temp files left by failed reads and exports: %s", g_out);
    // Sound fields without the writer's checksum, and a value edited under it.
    struct { const char *what, *want; int edit; } sums[] = {{"no checksum", "no \"checksum\"", 0},
                                                           {"the step edited", "checksum mismatch", 1}};
    for (int i = 0; i < 2; i++, n++) {
        char body[4096];
        index_case as_written = {.what = "as written", .want = ""};
        if (sums[i].edit) {
            snprintf(body, sizeof body, "%s", orig);
            char *st = strstr(body, "\"step\":");
            for (char *q = st; q && *q && *q != ','; q++)
                if (*q == '7') *q = '8';
        } else index_json(body, sizeof body, h, &as_written);
        write_file(ip, (const unsigned char *)body, strlen(body));
        dt_train_state r;
        dt_status st = dt_ckpt_read(dir, &h->cm, &r);
        CHECK(st == DT_ERR_FORMAT && strstr(dt_last_error(), sums[i].want) && strstr(dt_last_error(), "index.json"),
              "index with %s: refused: %s", sums[i].what, dt_last_error());
    }
    write_file(ip, (const unsigned char *)orig, ilen);
    free(orig);
    return n;
}

static void test_file(void) {
    net a, b;
    net_make(&a, 5, DT_OPTIM_ADAMW, 1);
    net_make(&b, 5, DT_OPTIM_ADAMW, 2);
    dt_train_state s = {1234, 3, 17, 16, 12.375, {{1, 2, 0xdeadbeefcafef00dull, 4}}, 3, 0x1.8p-7f, 1999, 42}, r;
    char p[600];  // tmp() reuses its buffers
    snprintf(p, sizeof p, "%s", tmp("a.safetensors"));
    CHECK(dt_ckpt_write(p, &a.cm, &s) == DT_OK, "write: %s", dt_last_error());
    CHECK(dt_ckpt_read(p, &b.cm, &r) == DT_OK, "read: %s", dt_last_error());
    static unsigned char ba[1 << 16], bb[1 << 16];
    size_t na = net_bytes(&a, ba), nb = net_bytes(&b, bb);
    CHECK(na == nb && !memcmp(ba, bb, na), "round trip restores weights, optimizer state and step count");
    CHECK(!memcmp(&s, &r, sizeof s), "round trip restores the training state (step %lld epoch %lld batch %lld loss %g, "
          "loss scale %g after %lld clean steps, %lld skipped)", (long long)r.step, (long long)r.epoch,
          (long long)r.epoch_batch, r.epoch_loss, r.loss_scale, (long long)r.scale_clean, (long long)r.scale_skipped);
    // The checkpoint is also a weights file.
    net c;
    net_make(&c, 5, DT_OPTIM_ADAMW, 3);
    CHECK(dt_model_load(c.m, p) == DT_OK && !memcmp(dt_model_params(c.m), a.cm.params, a.cm.nparams * 4),
          "dt_model_load reads a checkpoint's weights");
    const char *w = tmp("w.safetensors");
    CHECK(dt_ckpt_export_weights(p, w) == DT_OK, "export: %s", dt_last_error());
    dt_st_file *f;
    CHECK(dt_st_open(&f, w) == DT_OK && dt_st_count(f) == a.cm.ntensors && !dt_st_find(f, "optimizer.step"),
          "export holds the weights alone");
    dt_st_close(f);
    CHECK(dt_ckpt_read(w, &b.cm, &r) == DT_ERR_CONFIG && strstr(dt_last_error(), "not a dtrain checkpoint"),
          "a weights file cannot resume: %s", dt_last_error());

    // Damage: every truncation and bit flip is an error, and b is untouched.
    size_t len;
    unsigned char *file = (unsigned char *)tl_read_file(p, &len);
    net_bytes(&b, bb);
    const char *d = tmp("damaged.safetensors");
    int missed = 0, tried = 0;
    size_t cuts[] = {0, 4, 8, 100, len / 3, len / 2, len - 9, len - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        write_file(d, file, cuts[i]);
        dt_status st = dt_ckpt_read(d, &b.cm, &r);
        tried++;
        if (st != DT_ERR_FORMAT && st != DT_ERR_IO) {
            missed++;
            fprintf(stderr, "truncated to %zu bytes: status %d (%s)\n", cuts[i], st, dt_last_error());
        }
        if (st != DT_OK && !strstr(dt_last_error(), d)) missed++;
    }
    // Every reader sees the flip: resume, weights loading (eval, train's
    // init), export and inspect.
    float *cw = malloc(c.cm.nparams * sizeof(float));
    memcpy(cw, c.cm.params, c.cm.nparams * sizeof(float));
    FILE *devnull = fopen("/dev/null", "w");
    int flips = 0;
    for (size_t pos = 0; pos < len; pos += 1 + pos / 40) {
        file[pos] ^= (unsigned char)(1u << (pos % 8));
        write_file(d, file, len);
        file[pos] ^= (unsigned char)(1u << (pos % 8));
        dt_status st = dt_ckpt_read(d, &b.cm, &r), sl = dt_model_load(c.m, d), se = dt_ckpt_export_weights(d, w),
                  si = dt_ckpt_inspect(d, devnull);
        tried++, flips++;
        if (st == DT_OK || sl == DT_OK || se == DT_OK || si == DT_OK) {
            missed++;
            fprintf(stderr, "bit flip at byte %zu went unnoticed by%s%s%s%s\n", pos, st ? "" : " read",
                    sl ? "" : " dt_model_load", se ? "" : " export", si ? "" : " inspect");
        }
    }
    net_bytes(&b, ba);
    CHECK(missed == 0, "%d of %d truncated or bit-flipped files not detected", missed, tried);
    CHECK(!memcmp(ba, bb, nb), "failed loads left the model and optimizer untouched");
    CHECK(!memcmp(cw, c.cm.params, c.cm.nparams * sizeof(float)), "failed weight loads left the model untouched");
    free(cw);
    printf("damage: %d truncated / bit-flipped files, all detected (the flips by read, dt_model_load, export and inspect: %d cases)\n",
           tried, 4 * flips);
    file[len / 2] ^= 1;
    write_file(d, file, len);
    CHECK(dt_ckpt_inspect(d, devnull) == DT_ERR_FORMAT && strstr(dt_last_error(), "checksum"),
          "inspect reports a damaged checksum: %s", dt_last_error());
    CHECK(dt_ckpt_inspect(p, devnull) == DT_OK, "inspect: %s", dt_last_error());
    fclose(devnull);

    // Another format version.
    file[len / 2] ^= 1;
    char *v = memmem(file, len, "\"format_version\":\"1\"", 20);
    CHECK(v != NULL, "format_version in the header");
    if (v) {
        v[18] = '2';
        write_file(d, file, len);
        CHECK(dt_ckpt_read(d, &b.cm, &r) == DT_ERR_CONFIG && strstr(dt_last_error(), "version 2"),
              "a newer format version is refused: %s", dt_last_error());
    }
    free(file);

    printf("values in range, format flips: %d cases\n", test_values(&a, &b));

    // Another model, another optimizer.
    net e, g;
    net_make(&e, 6, DT_OPTIM_ADAMW, 1);
    CHECK(dt_ckpt_read(p, &e.cm, &r) == DT_ERR_CONFIG && strstr(dt_last_error(), "'1.weight'") &&
              strstr(dt_last_error(), "[5, 16]") && strstr(dt_last_error(), "[6, 16]"),
          "another model is refused, naming the tensor and shapes: %s", dt_last_error());
    net_make(&g, 5, DT_OPTIM_SGD, 1);
    CHECK(dt_ckpt_read(p, &g.cm, &r) == DT_ERR_CONFIG && strstr(dt_last_error(), "adamw"),
          "another optimizer is refused: %s", dt_last_error());

    // 2. the directory: newest valid first, fallback over damaged ones.
    const char *dir = tmp("ckdir");
    mkdir(dir, 0755);
    char path[3][600];
    for (int i = 0; i < 3; i++) {
        s.step = 5 * (i + 1);
        snprintf(path[i], sizeof path[i], "%s/step-%08d.safetensors", dir, 5 * (i + 1));
        CHECK(dt_ckpt_write(path[i], &a.cm, &s) == DT_OK, "write %s", path[i]);
    }
    char used[1024];
    int found;
    CHECK(dt_ckpt_load_newest(dir, &b.cm, &r, &found, used, sizeof used) == DT_OK && found && r.step == 15,
          "newest: step %lld", (long long)r.step);
    truncate(path[2], 1000);
    CHECK(dt_ckpt_load_newest(dir, &b.cm, &r, &found, used, sizeof used) == DT_OK && found && r.step == 10 &&
              !strcmp(used, path[1]),
          "a truncated newest checkpoint is skipped for the one before: %s", used);
    truncate(path[1], 0);
    truncate(path[0], 50);
    CHECK(dt_ckpt_load_newest(dir, &b.cm, &r, &found, used, sizeof used) == DT_ERR_FORMAT && !found &&
              strstr(dt_last_error(), "all 3 checkpoints are damaged or incomplete"),
          "all damaged: %s", dt_last_error());
    CHECK(dt_ckpt_write(path[0], &e.cm, &s) == DT_OK, "write another model's");
    CHECK(dt_ckpt_load_newest(dir, &b.cm, &r, &found, used, sizeof used) == DT_ERR_CONFIG && !found,
          "an incompatible checkpoint is an error, not skipped: %s", dt_last_error());
    CHECK(dt_ckpt_load_newest(tmp("nothing-here"), &b.cm, &r, &found, used, sizeof used) == DT_OK && !found,
          "no checkpoints: a fresh start");

    // The background writer: snapshot at save time, keep N, temp files.
    const char *wd = tmp("writer");
    mkdir(wd, 0755);
    write_file(tmp("writer/step-00000001.safetensors.tmp.4242"), (const unsigned char *)"x", 1);
    dt_ckpt_writer *wr;
    CHECK(dt_ckpt_writer_create(&wr, wd, 2, &a.cm, 0, 1, 10) == DT_OK, "writer: %s", dt_last_error());
    CHECK(access(tmp("writer/step-00000001.safetensors.tmp.4242"), F_OK) != 0, "a killed writer's temp file is removed");
    float keep0 = 0;
    for (int i = 1; i <= 4; i++) {
        s.step = i;
        a.cm.params[0] = (float)i;
        CHECK(dt_ckpt_writer_save(wr, &s) == DT_OK, "save %d: %s", i, dt_last_error());
        keep0 = a.cm.params[0];
        a.cm.params[0] = -1;  // changed right after the save: must not reach the file
    }
    CHECK(dt_ckpt_writer_wait(wr) == DT_OK, "wait: %s", dt_last_error());
    int saves;
    double maxp, total;
    dt_ckpt_writer_stats(wr, &saves, &maxp, &total, NULL);
    dt_ckpt_writer_free(wr);
    char **list;
    int nl;
    CHECK(dt_ckpt_list(wd, &list, &nl) == DT_OK && nl == 2 && strstr(list[0], "step-00000004") &&
              strstr(list[1], "step-00000003"),
          "keep 2: the two newest are left (%d)", nl);
    for (int i = 0; i < nl; i++) free(list[i]);
    free(list);
    CHECK(dt_ckpt_read(tmp("writer/step-00000004.safetensors"), &b.cm, &r) == DT_OK && b.cm.params[0] == keep0,
          "the file holds the snapshot taken at save time (%g)", b.cm.params[0]);
    CHECK(saves == 4 && maxp >= 0 && total >= maxp, "writer stats: %d saves, longest pause %.3f ms", saves, maxp * 1e3);

    // Sharded: three writers (the ranks of a 3-worker run) write their
    // slices; the gathered checkpoint equals the whole one of the same state.
    const char *sd = tmp("sharded");
    mkdir(sd, 0755);
    dt_ckpt_writer *ws[3];
    s.step = 7;
    for (int r = 0; r < 3; r++)
        CHECK(dt_ckpt_writer_create(&ws[r], sd, 2, &a.cm, r, 3, 10) == DT_OK, "shard writer %d: %s", r, dt_last_error());
    for (int r = 2; r >= 0; r--) CHECK(dt_ckpt_writer_save(ws[r], &s) == DT_OK, "shard save %d", r);
    for (int r = 0; r < 3; r++) {
        CHECK(dt_ckpt_writer_wait(ws[r]) == DT_OK, "shard write %d: %s", r, dt_last_error());
        dt_ckpt_writer_free(ws[r]);
    }
    char sdir[600], whole[600];
    snprintf(sdir, sizeof sdir, "%s", tmp("sharded/step-00000007"));
    snprintf(whole, sizeof whole, "%s", tmp("whole.safetensors"));
    CHECK(access(tmp("sharded/step-00000007/COMPLETE"), F_OK) == 0 &&
              access(tmp("sharded/step-00000007/index.json"), F_OK) == 0 &&
              access(tmp("sharded/step-00000007/shard-00002-of-00003.safetensors"), F_OK) == 0,
          "sharded checkpoint: three shards, index.json, COMPLETE");
    CHECK(dt_ckpt_write(whole, &a.cm, &s) == DT_OK, "whole checkpoint");
    net h, k;
    net_make(&h, 5, DT_OPTIM_ADAMW, 7);
    net_make(&k, 5, DT_OPTIM_ADAMW, 8);
    dt_train_state rs, rw;
    CHECK(dt_ckpt_read(sdir, &h.cm, &rs) == DT_OK, "read sharded: %s", dt_last_error());
    CHECK(dt_ckpt_read(whole, &k.cm, &rw) == DT_OK, "read whole: %s", dt_last_error());
    na = net_bytes(&h, ba);
    nb = net_bytes(&k, bb);
    CHECK(na == nb && !memcmp(ba, bb, na) && !memcmp(&rs, &rw, sizeof rs),
          "the gathered shards equal the whole checkpoint (weights, optimizer state, step, training state)");
    CHECK(dt_ckpt_export_weights(sdir, tmp("sw.safetensors")) == DT_OK, "export of a sharded checkpoint: %s",
          dt_last_error());
    int bw;
    CHECK(tl_weights_diff(tmp("sw.safetensors"), whole, &bw) == 0 && bw, "its weights are the whole one's");
    net q;
    net_make(&q, 5, DT_OPTIM_ADAMW, 9);
    CHECK(dt_model_load(q.m, sdir) == DT_OK && !memcmp(q.cm.params, h.cm.params, h.cm.nparams * sizeof(float)),
          "dt_model_load (eval) reads a sharded checkpoint's weights: %s", dt_last_error());
    net_free(&q);
    // Damage: a bit flip in a shard, a missing COMPLETE: detected, skipped.
    char s1[600];
    snprintf(s1, sizeof s1, "%s", tmp("sharded/step-00000007/shard-00001-of-00003.safetensors"));
    size_t sl;
    unsigned char *sb = (unsigned char *)tl_read_file(s1, &sl);
    sb[sl - 3] ^= 0x10;
    write_file(s1, sb, sl);
    CHECK(dt_ckpt_read(sdir, &h.cm, &rs) == DT_ERR_FORMAT && strstr(dt_last_error(), "shard-00001-of-00003") &&
              strstr(dt_last_error(), "checksum"),
          "a damaged shard is detected: %s", dt_last_error());
    sb[sl - 3] ^= 0x10;
    write_file(s1, sb, sl);
    free(sb);
    printf("damaged index.json: %d cases\n", test_index(sdir, &h));
    CHECK(dt_ckpt_read(sdir, &h.cm, &rs) == DT_OK, "the restored index reads again: %s", dt_last_error());
    unlink(tmp("sharded/step-00000007/COMPLETE"));
    CHECK(dt_ckpt_read(sdir, &h.cm, &rs) == DT_ERR_FORMAT && strstr(dt_last_error(), "incomplete"),
          "no COMPLETE marker: incomplete: %s", dt_last_error());
    {  // in a directory of checkpoints, one whose writing never finished is none (a restart starts afresh)
        char used[1024] = "";
        int found = 1;
        dt_status lst = dt_ckpt_load_newest(tmp("sharded"), &h.cm, &rs, &found, used, sizeof used);
        CHECK(lst == DT_OK && !found,
              "the only checkpoint incomplete: none found (%s)", lst == DT_OK ? used : dt_last_error());
    }
    CHECK(dt_ckpt_read(sdir, &e.cm, &rs) != DT_OK, "another model");
    net_free(&h), net_free(&k);
    net_free(&a), net_free(&b), net_free(&c), net_free(&e), net_free(&g);
}

// ---------------------------------------------------------------------------
// 3: runs

static const char *cfg =
    "[model]\ninput = 784\nlayer = linear out=48\nlayer = relu\nlayer = dropout p=0.2\nlayer = linear out=10\n"
    "[optim]\nname = adamw\nlr = 0.003\n[schedule]\nname = cosine\nwarmup_steps = 5\n"
    "[train]\nbatch = 40\nepochs = 0\nmax_steps = 30\neval_batch = 100\nseed = 5\n[parallel]\ndeterministic = true\n";

static int train(const char *name, int N, const char *extra) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s train %s --workers %d --quiet --run-dir %s %s 2>&1", tl_dtrain(), tmp("run.ini"), N,
             tmp(name), extra ? extra : "");
    return tl_run(cmd, g_out, sizeof g_out);
}

static int same_as_ref(const char *name) {
    int bw;
    char a[600], b[600];
    snprintf(a, sizeof a, "%s/model.safetensors", tmp("ref"));
    snprintf(b, sizeof b, "%s/model.safetensors", tmp(name));
    double d = tl_weights_diff(a, b, &bw);
    if (!bw) fprintf(stderr, "%s: max relative difference to the uninterrupted run %.3g\n", name, d);
    return bw;
}

// The runs' data, config and uninterrupted reference run ("ref").
static void runs_setup(void) {
    tl_make_images(g_tmp, "train", 243, 1);  // 7 steps per epoch: 30 steps end mid-epoch 5
    tl_make_images(g_tmp, "t10k", 100, 2);
    FILE *f = fopen(tmp("run.ini"), "w");
    fprintf(f, "%s[data]\ndir = %s\n", cfg, g_tmp);
    fclose(f);
    int rc = train("ref", 2, NULL);
    CHECK(rc == 0, "uninterrupted run: exit %d\n%s", rc, g_out);
}

static void test_runs(void) {
    int rc;

    // Stopped by a failure at step 18 (epoch 3, batch 4), resumed on 3
    // workers from step 16 (epoch 3, batch 2).
    setenv("DTRAIN_FAULT_STEP", "1:18", 1);
    rc = train("up", 2, "--checkpoint-every 4");
    unsetenv("DTRAIN_FAULT_STEP");
    CHECK(rc == 1, "failing run: exit %d", rc);
    CHECK(access(tmp("up/checkpoints/step-00000016.safetensors"), F_OK) == 0, "checkpoint at step 16 written");
    CHECK(access(tmp("up/checkpoints/step-00000004.safetensors"), F_OK) != 0, "keep 3: step 4 deleted");
    // A resume on other data is refused, naming the key old -> new
    // (nothing written: the resume below is still bitwise); one with another
    // optimizer setting goes on, saying so (a copy of the run).
    char cmd[4096], flags[4400];
    snprintf(cmd, sizeof cmd, "mkdir -p %s && cp %s/*-ubyte.gz %s", tmp("data2"), g_tmp, tmp("data2"));
    CHECK(system(cmd) == 0, "a copy of the data");
    snprintf(flags, sizeof flags, "--resume auto --set data.dir=%s", tmp("data2"));
    rc = train("up", 3, flags);
    CHECK(rc == 1 && strstr(g_out, "written with another model or data") && strstr(g_out, "data.dir: ") &&
              strstr(g_out, "allow_changes"),
          "resume on other data refused, naming the key: exit %d\n%s", rc, g_out);
    snprintf(cmd, sizeof cmd, "cp -r %s %s", tmp("up"), tmp("up-lr"));
    CHECK(system(cmd) == 0, "copy of the run");
    rc = train("up-lr", 3, "--resume auto --set optim.lr=0.02");
    CHECK(rc == 0 && strstr(g_out, "written with another config") && strstr(g_out, "optim.lr: "),
          "resume with another lr: goes on, naming it: exit %d\n%s", rc, g_out);
    rc = train("up", 3, "--resume auto --checkpoint-every 4 --keep 2");
    CHECK(rc == 0, "resume on 3 workers: exit %d\n%s", rc, g_out);
    CHECK(same_as_ref("up"), "2 -> 3 workers: resumed run bitwise equal to the uninterrupted one");

    // 3 -> 1 worker, from a failure at step 17.
    setenv("DTRAIN_FAULT_STEP", "2:17", 1);
    rc = train("down", 3, "--checkpoint-every 5");
    unsetenv("DTRAIN_FAULT_STEP");
    CHECK(rc == 1, "failing run: exit %d", rc);
    // The newest (step 15) is damaged: the resume falls back to step 10.
    truncate(tmp("down/checkpoints/step-00000015.safetensors"), 2000);
    rc = train("down", 1, "--resume auto");
    CHECK(rc == 0, "resume on 1 worker: exit %d\n%s", rc, g_out);
    CHECK(strstr(g_out, "skipping damaged checkpoint") && strstr(g_out, "step-00000015"),
          "warns about the damaged checkpoint:\n%s", g_out);
    CHECK(same_as_ref("down"), "3 -> 1 workers, after a fallback: bitwise equal to the uninterrupted run");

    // Sharded checkpoints (every worker writes its slice), resharded on
    // resume: 3 -> 2 and 2 -> 3 workers.
    setenv("DTRAIN_FAULT_STEP", "1:18", 1);
    rc = train("sh3", 3, "--checkpoint-every 4 --checkpoint-sharded");
    unsetenv("DTRAIN_FAULT_STEP");
    CHECK(rc == 1, "failing sharded run: exit %d", rc);
    CHECK(access(tmp("sh3/checkpoints/step-00000016/COMPLETE"), F_OK) == 0 &&
              access(tmp("sh3/checkpoints/step-00000016/shard-00002-of-00003.safetensors"), F_OK) == 0 &&
              access(tmp("sh3/checkpoints/step-00000004"), F_OK) != 0,
          "sharded checkpoint of 3 workers at step 16 (and step 4 pruned)");
    rc = train("sh3", 2, "--resume auto --checkpoint-every 4 --checkpoint-sharded");
    CHECK(rc == 0 && same_as_ref("sh3"), "sharded 3 -> 2 workers: exit %d, bitwise equal\n%s", rc, g_out);
    setenv("DTRAIN_FAULT_STEP", "0:11", 1);
    rc = train("sh2", 2, "--checkpoint-every 4 --checkpoint-sharded");
    unsetenv("DTRAIN_FAULT_STEP");
    CHECK(rc == 1, "failing sharded run: exit %d", rc);
    rc = train("sh2", 3, "--resume auto --checkpoint-sharded");
    CHECK(rc == 0 && same_as_ref("sh2"), "sharded 2 -> 3 workers: exit %d, bitwise equal\n%s",
          rc, g_out);

    // ZeRO: every rank writes its slice (the sharded format without
    // --checkpoint-sharded), and the state resumes at another worker count
    // and another stage: 3 on 4 -> 0 on 1, 1 on 2 -> 3 on 3.
    setenv("DTRAIN_FAULT_STEP", "3:18", 1);
    rc = train("z4", 4, "--zero 3 --checkpoint-every 4");
    unsetenv("DTRAIN_FAULT_STEP");
    CHECK(rc == 1, "failing ZeRO run: exit %d", rc);
    CHECK(access(tmp("z4/checkpoints/step-00000016/shard-00003-of-00004.safetensors"), F_OK) == 0 &&
              access(tmp("z4/checkpoints/step-00000016.safetensors"), F_OK) != 0,
          "zero = 3 on 4 workers: each rank wrote its shard of step 16");
    // The whole weights from the shards, as the run's own would be at step 16.
    char zcmd[2048];
    snprintf(zcmd, sizeof zcmd, "%s export %s -o %s 2>&1", tl_dtrain(), tmp("z4/checkpoints/step-00000016"),
             tmp("z4-16.safetensors"));
    rc = tl_run(zcmd, g_out, sizeof g_out);
    CHECK(rc == 0, "export of a ZeRO checkpoint: exit %d\n%s", rc, g_out);
    rc = train("z4", 1, "--resume auto");
    CHECK(rc == 0 && same_as_ref("z4"), "zero 3 on 4 -> zero 0 on 1 worker: exit %d, bitwise equal\n%s", rc, g_out);
    // [checkpoint] staging = pieces: each rank's slice written from its live
    // buffers, no snapshot, the training waiting: the same files, byte for
    // byte, and it resumes bitwise.
    setenv("DTRAIN_FAULT_STEP", "3:18", 1);
    rc = train("z4-live", 4, "--zero 3 --checkpoint-every 4 --set checkpoint.staging=pieces --set run.name=run");
    unsetenv("DTRAIN_FAULT_STEP");
    CHECK(rc == 1, "failing ZeRO run, checkpoints from the live state: exit %d", rc);
    const char *zf[] = {"shard-00000-of-00004.safetensors", "shard-00003-of-00004.safetensors", "index.json"};
    for (int i = 0; i < 3; i++) {
        char pa[600], pb[600];
        snprintf(pa, sizeof pa, "z4/checkpoints/step-00000016/%s", zf[i]);
        snprintf(pb, sizeof pb, "z4-live/checkpoints/step-00000016/%s", zf[i]);
        CHECK(tl_same_file(tmp(pa), tmp(pb)), "zero 3, staging = pieces: %s is not the snapshot's bytes", zf[i]);
    }
    rc = train("z4-live", 4, "--zero 3 --resume auto --set checkpoint.staging=pieces --set run.name=run");
    CHECK(rc == 0 && same_as_ref("z4-live"), "zero 3 from the live state, resumed: exit %d, bitwise equal\n%s", rc, g_out);
    setenv("DTRAIN_FAULT_STEP", "0:11", 1);
    rc = train("z2", 2, "--zero 1 --checkpoint-every 4");
    unsetenv("DTRAIN_FAULT_STEP");
    CHECK(rc == 1, "failing ZeRO run: exit %d", rc);
    rc = train("z2", 3, "--zero 3 --resume auto");
    CHECK(rc == 0 && same_as_ref("z2"), "zero 1 on 2 -> zero 3 on 3 workers: exit %d, bitwise equal\n%s", rc, g_out);
    // The export above equals the step-16 weights of one plain process.
    setenv("DTRAIN_FAULT_STEP", "0:17", 1);
    rc = train("z16", 1, "--checkpoint-every 16");
    unsetenv("DTRAIN_FAULT_STEP");
    snprintf(zcmd, sizeof zcmd, "%s export %s -o %s 2>&1", tl_dtrain(), tmp("z16/checkpoints/step-00000016.safetensors"),
             tmp("z16.safetensors"));
    CHECK(rc == 1 && tl_run(zcmd, g_out, sizeof g_out) == 0, "plain run to step 16 and its export\n%s", g_out);
    int zbw;
    char za[600], zb[600];
    snprintf(za, sizeof za, "%s", tmp("z16.safetensors"));
    snprintf(zb, sizeof zb, "%s", tmp("z4-16.safetensors"));
    double zd = tl_weights_diff(za, zb, &zbw);
    CHECK(zbw, "exported ZeRO shards = the weights of a plain run at step 16 (max rel diff %.3g)", zd);
    // That whole file resumed under ZeRO-3: each of the 3 ranks reads its
    // slice of it, none the whole file.
    rc = train("z16", 3, "--zero 3 --resume auto");
    CHECK(rc == 0 && same_as_ref("z16"), "a whole-file checkpoint -> zero 3 on 3 workers: exit %d, bitwise equal\n%s", rc,
          g_out);

    // The supervisor: a worker SIGKILLed in step 13 comes back from step 10.
    setenv("DTRAIN_FAULT_STEP", "1:13:kill", 1);
    setenv("DTRAIN_FAULT_ONCE", tmp("kill-once"), 1);
    rc = train("restart", 2, "--checkpoint-every 5 --max-restarts 2 --zero 3");
    CHECK(rc == 0, "--max-restarts: exit %d\n%s", rc, g_out);
    // Checkpoints are written in the background: the step-10 one is usually
    // complete by step 13, but under load it may not be, and the run then
    // resumes from step 5; either way the lost steps are the difference.
    const char *res = strstr(g_out, "resumed at step ");
    int from = -1, lost = -1;
    if (res) sscanf(res, "resumed at step %d, %d steps lost", &from, &lost);
    CHECK(strstr(g_out, "worker 1 Killed") && strstr(g_out, "restart 1 of 2") && strstr(g_out, "recovered in") &&
              (from == 10 || from == 5) && lost == 12 - from,
          "restart logged with the recovery time and the lost steps:\n%s", g_out);
    CHECK(same_as_ref("restart"), "restarted run bitwise equal to the uninterrupted one");

    // A hung worker (no heartbeats) is found, stopped, and the group restarted.
    setenv("DTRAIN_FAULT_STEP", "0:8:hang", 1);
    setenv("DTRAIN_FAULT_ONCE", tmp("hang-once"), 1);
    rc = train("hang", 2, "--checkpoint-every 5 --max-restarts 1 --heartbeat-timeout 4");
    unsetenv("DTRAIN_FAULT_STEP");
    unsetenv("DTRAIN_FAULT_ONCE");
    CHECK(rc == 0, "hung worker: exit %d\n%s", rc, g_out);
    CHECK(strstr(g_out, "rank 0") && strstr(g_out, "sent no heartbeat") && strstr(g_out, "worker 0 hung"),
          "the hung worker is named:\n%s", g_out);
    CHECK(same_as_ref("hang"), "run restarted after a hang bitwise equal to the uninterrupted one");

    // SIGUSR1 to the launcher: every worker checkpoints and stops (exit 75);
    // the run then resumes to the same model.
    {
        setenv("DTRAIN_SLOW_RANK", "1:50", 1);  // 1.5 s of steps
        char cmd[4096];
        snprintf(cmd, sizeof cmd, "exec %s train %s --workers 2 --quiet --run-dir %s >%s 2>&1", tl_dtrain(),
                 tmp("run.ini"), tmp("usr1"), tmp("usr1.log"));
        pid_t pid = fork();
        if (pid == 0) {
            execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
            _exit(127);
        }
        // the signal once the workers train (rank 1 logged a step; 30 steps
        // of 50 ms are left then), not after a guessed time
        char m1[700];
        snprintf(m1, sizeof m1, "%s/metrics/rank-00001.jsonl", tmp("usr1"));
        for (int i = 0; i < 6000 && tl_count(m1, "\"type\":\"step\"") < 1; i++) usleep(10000);  // (60 s: a hang guard)
        kill(pid, SIGUSR1);
        int status;
        waitpid(pid, &status, 0);
        unsetenv("DTRAIN_SLOW_RANK");
        char *text = tl_read_file(tmp("usr1.log"), NULL);
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 75 && text && strstr(text, "--resume auto"),
              "SIGUSR1: exit status %d (expected 75) and how to go on:\n%s", WEXITSTATUS(status),
              text ? text : "");
        free(text);
        char **list;
        int nl = 0;
        CHECK(dt_ckpt_list(tmp("usr1/checkpoints"), &list, &nl) == DT_OK && nl == 1,
              "a checkpoint written at the stop (%d)", nl);
        for (int i = 0; i < nl; i++) free(list[i]);
        if (nl) free(list);
        rc = train("usr1", 1, "--resume auto");
        CHECK(rc == 0 && same_as_ref("usr1"), "resumed after SIGUSR1: exit %d, bitwise equal\n%s", rc, g_out);
    }

    // Without restarts left, the failure is the run's.
    setenv("DTRAIN_FAULT_STEP", "1:6:kill", 1);
    rc = train("giveup", 2, "--checkpoint-every 5 --max-restarts 1");
    unsetenv("DTRAIN_FAULT_STEP");
    CHECK(rc == 1 && strstr(g_out, "giving up after 1 restart"), "gives up after --max-restarts: exit %d\n%s", rc,
          g_out);
}

// A GPT run (deterministic mode, so bitwise) stopped by a failure and
// resumed on another worker count: 2 -> 3 workers from a whole checkpoint,
// 3 -> 1 from a sharded one; each ends with the parameters of the
// uninterrupted 2-worker run. The window sampler's generator travels in the
// checkpoint ('rng').
static void test_gpt_runs(void) {
    const size_t n = 4000;
    uint16_t *t = malloc(sizeof(uint16_t) * n);
    dt_rng r;
    dt_rng_seed(&r, 11);
    t[0] = 0;
    for (size_t i = 1; i < n; i++)  // mostly t -> 5t + 3 (mod 32), with random jumps
        t[i] = dt_rng_below(&r, 8) ? (uint16_t)((5 * t[i - 1] + 3) % 32) : (uint16_t)dt_rng_below(&r, 32);
    CHECK(dt_tokens_write(tmp("gpt_train.bin"), t, n) == DT_OK && dt_tokens_write(tmp("gpt_val.bin"), t, 1000) == DT_OK,
          "token files: %s", dt_last_error());
    free(t);
    FILE *f = fopen(tmp("gpt.ini"), "w");
    fprintf(f,
            "[model]\npreset = gpt\nn_layer = 2\nn_head = 2\nn_embd = 16\nblock_size = 8\nvocab_size = 32\n"
            "[data]\ndataset = tokens\ntrain_file = %s\nval_file = %s\n"
            "[optim]\nname = adamw\nlr = 0.003\n[schedule]\nname = cosine\nwarmup_steps = 5\n"
            "[train]\nbatch = 20\nseq_len = 8\nmax_steps = 30\neval_batches = 1\nseed = 5\n"
            "[parallel]\ndeterministic = true\n",
            tmp("gpt_train.bin"), tmp("gpt_val.bin"));
    fclose(f);
    char cmd[4096], ini[600];
    snprintf(ini, sizeof ini, "%s", tmp("gpt.ini"));
#define GPT_TRAIN(name, N, extra)                                                                               \
    (snprintf(cmd, sizeof cmd, "%s train %s --workers %d --quiet --run-dir %s %s 2>&1", tl_dtrain(), ini, N, \
              tmp(name), extra),                                                                              \
     tl_run(cmd, g_out, sizeof g_out))
    int rc = GPT_TRAIN("gpt-ref", 2, "");
    CHECK(rc == 0, "GPT, uninterrupted on 2 workers: exit %d\n%s", rc, g_out);
    char a[600], b[600];
    snprintf(a, sizeof a, "%s/model.safetensors", tmp("gpt-ref"));
    static const struct {
        const char *name, *fault, *flags, *resume_flags;
        int from, to, step;
    } runs[] = {
        {"gpt-up", "1:18", "--checkpoint-every 4", "", 2, 3, 16},
        {"gpt-down", "2:17", "--checkpoint-every 5 --checkpoint-sharded", "--checkpoint-sharded", 3, 1, 15},
    };
    for (int i = 0; i < 2; i++) {
        setenv("DTRAIN_FAULT_STEP", runs[i].fault, 1);
        rc = GPT_TRAIN(runs[i].name, runs[i].from, runs[i].flags);
        unsetenv("DTRAIN_FAULT_STEP");
        CHECK(rc == 1, "GPT %s: the failing run on %d workers: exit %d\n%s", runs[i].name, runs[i].from, rc, g_out);
        char ck[700];
        snprintf(ck, sizeof ck, "%s/checkpoints/step-%08d%s", tmp(runs[i].name), runs[i].step,
                 i ? "/COMPLETE" : ".safetensors");
        CHECK(access(ck, F_OK) == 0, "GPT %s: the %s checkpoint of step %d (%s)", runs[i].name, i ? "sharded" : "whole",
              runs[i].step, ck);
        char flags[200], at[64];
        snprintf(flags, sizeof flags, "--resume auto %s", runs[i].resume_flags);
        rc = GPT_TRAIN(runs[i].name, runs[i].to, flags);
        // Resumed, not started again (which deterministic mode would make
        // bitwise too): rank 0's metrics after the second run record, the
        // one on the new worker count, begin at the step after the checkpoint.
        char mpath[700], want[96];
        snprintf(mpath, sizeof mpath, "%s/metrics/rank-00000.jsonl", tmp(runs[i].name));
        snprintf(at, sizeof at, "\"workers\":%d,", runs[i].to);
        snprintf(want, sizeof want, "\"type\":\"step\",\"step\":%d,", runs[i].step + 1);
        char *m = tl_read_file(mpath, NULL);
        const char *run2 = m ? strstr(m, "\"type\":\"run\"") : NULL;
        run2 = run2 ? strstr(run2 + 1, "\"type\":\"run\"") : NULL;
        const char *nl = run2 ? strchr(run2, '\n') : NULL, *first = nl ? strstr(nl, "\"type\":\"step\"") : NULL;
        CHECK(rc == 0 && nl && memmem(run2, (size_t)(nl - run2), at, strlen(at)) && first &&
                  !strncmp(first, want, strlen(want)),
              "GPT %s: resumed on %d workers at step %d: exit %d, rank 0's metrics:\n%s\n%s", runs[i].name, runs[i].to,
              runs[i].step + 1, rc, m ? m : "(none)", g_out);
        free(m);
        int bw;
        snprintf(b, sizeof b, "%s/model.safetensors", tmp(runs[i].name));
        double d = tl_weights_diff(a, b, &bw);
        CHECK(bw, "GPT checkpointed on %d workers at step %d, resumed on %d: not bitwise the uninterrupted run (max "
              "rel diff %.3g)", runs[i].from, runs[i].step, runs[i].to, d);
        printf("GPT, deterministic: checkpointed on %d workers at step %d, resumed on %d: %s\n", runs[i].from,
               runs[i].step, runs[i].to, bw ? "bitwise the uninterrupted run" : "DIFFERS");
    }
    // A finished run resumed with more steps (the GPT's epoch is its run):
    // it goes on from its last checkpoint's step to the new end.
    rc = GPT_TRAIN("gpt-more", 2, "--set train.max_steps=10 --checkpoint-every 5");
    if (rc == 0) rc = GPT_TRAIN("gpt-more", 2, "--set train.max_steps=14 --checkpoint-every 5 --resume auto");
    char mpath[700], last[700];
    snprintf(mpath, sizeof mpath, "%s/metrics/rank-00000.jsonl", tmp("gpt-more"));
    snprintf(last, sizeof last, "%s/checkpoints/step-00000014.safetensors", tmp("gpt-more"));
    char *m = tl_read_file(mpath, NULL);
    CHECK(rc == 0 && m && strstr(m, "\"type\":\"step\",\"step\":11,") && strstr(m, "\"type\":\"step\",\"step\":14,") &&
              !strstr(m, "\"type\":\"step\",\"step\":15,") && access(last, F_OK) == 0,
          "GPT run of 10 steps resumed with max_steps 14: exit %d, steps 11 to 14 trained, the step-14 checkpoint "
          "written\n%s", rc, g_out);
    free(m);
#undef GPT_TRAIN
}

// Elastic: worker 2 cannot start while a file exists. The group shrinks to
// 2, tries to grow every second, and grows once the file is gone. With
// `extra` flags (ZeRO: the state re-sharded at each change of size) and
// the same bitwise reference, a fixed 2-worker run.
static void test_elastic(const char *name, const char *extra) {
    const char *block = tmp("slot2-unavailable");
    write_file(block, (const unsigned char *)"", 0);
    char env[700];
    snprintf(env, sizeof env, "2:%s", block);
    setenv("DTRAIN_FAULT_START", env, 1);
    setenv("DTRAIN_SLOW_RANK", "0:15", 1);  // about 0.5 s of training per 30 steps
    char logname[128], cmd[4096];
    snprintf(logname, sizeof logname, "%s.log", name);
    const char *log = tmp(logname);
    snprintf(cmd, sizeof cmd,
             "exec %s train %s --workers 2:3 --set train.max_steps=150 --checkpoint-every 10 --max-restarts 3 "
             "--elastic-retry 1 %s --run-dir %s >%s 2>&1",
             tl_dtrain(), tmp("run.ini"), extra, tmp(name), log);
    // Wait for the shrink, then give the slot back.
    int shrunk;
    int status = tl_run_released(cmd, log, "continuing with 2 workers", block, 30, 60, &shrunk);
    unsetenv("DTRAIN_FAULT_START");
    unsetenv("DTRAIN_SLOW_RANK");
    char *out = tl_read_file(log, NULL);
    if (!out) out = calloc(1, 1);
    CHECK(shrunk, "shrank to 2 workers when worker 2 could not come back:\n%s", out);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "elastic run: exit status %d\n%s", status, out);
    CHECK(strstr(out, "growing to 3 workers") != NULL, "grew back to 3 workers:\n%s", out);
    CHECK(strstr(out, "3 workers x") != NULL, "finished on 3 workers:\n%s", out);
    // Deterministic mode: the same model as 2 workers all along.
    char b[600];
    snprintf(b, sizeof b, "%s/model.safetensors", tmp("elastic-ref"));
    if (access(b, F_OK) != 0) {
        snprintf(cmd, sizeof cmd, "%s train %s --workers 2 --quiet --set train.max_steps=150 --run-dir %s", tl_dtrain(),
                 tmp("run.ini"), tmp("elastic-ref"));
        CHECK(tl_run(cmd, g_out, sizeof g_out) == 0, "elastic reference run\n%s", g_out);
    }
    int bw;
    char a[600];
    snprintf(a, sizeof a, "%s/model.safetensors", tmp(name));
    double d = tl_weights_diff(a, b, &bw);
    CHECK(bw, "elastic run %s(3 -> 2 -> 3 workers) bitwise equal to a fixed 2-worker run (max rel diff %.3g)", extra, d);
    free(out);
}

// A disk that fills during a run (root only: a tmpfs with room for the
// run's checkpoints at its start, which the start's disk check wants, then
// filled by another file once the step-5 checkpoint is complete, rank 0
// slowed to 100 ms a step meanwhile): ZeRO training stops with exit 1
// naming the file that could not be written; the newest complete
// checkpoint verifies, and a run resumed from it ends bitwise equal to the
// uninterrupted one.
static void test_disk_full(void) {
    int rc = train("full-size", 2, "--zero 1 --checkpoint-every 5 --set train.max_steps=5");
    char cmd[4096], out[256] = "";
    snprintf(cmd, sizeof cmd, "du -sb %s/checkpoints/step-00000005 | cut -f1", tmp("full-size"));
    tl_run(cmd, out, sizeof out);
    long one = atol(out);
    CHECK(rc == 0 && one > 0, "a checkpoint's size: %ld bytes (exit %d)\n%s", one, rc, g_out);
    char mnt[600];  // (a copy: tmp()'s buffers are reused, and the unmount at the end needs it)
    snprintf(mnt, sizeof mnt, "%s", tmp("full"));
    mkdir(mnt, 0755);
    snprintf(cmd, sizeof cmd, "mount -t tmpfs -o size=%ldk tmpfs %s 2>&1", one * 8 / 1024 + 1, mnt);
    if (tl_run(cmd, out, sizeof out) != 0) {
        tl_skip("the disk-full case: cannot mount a tmpfs here: %s", out);
        return;
    }
    char run[700], extra[1200];
    snprintf(run, sizeof run, "%s/run", mnt);
    snprintf(extra, sizeof extra, "--zero 1 --checkpoint-every 5 --keep 20 --set train.max_steps=30 --run-dir %s", run);
    snprintf(cmd, sizeof cmd,
             "(DTRAIN_SLOW_RANK=0:100 %s train %s --workers 2 --quiet %s 2>&1 & P=$!; i=0; "
             "while [ $i -lt 600 ] && [ ! -e %s/checkpoints/step-00000005/COMPLETE ]; do sleep 0.05; i=$((i+1)); done; "
             "dd if=/dev/zero of=%s/filler bs=64k 2>/dev/null; wait $P)",
             tl_dtrain(), tmp("run.ini"), extra, run, mnt);
    rc = tl_run(cmd, g_out, sizeof g_out);
    CHECK(rc == 1 && strstr(g_out, "No space left on device") && strstr(g_out, run),
          "disk full: exit %d, the error names the file:\n%s", rc, g_out);
    int newest = 0;
    for (int step = 5; step <= 30; step += 5) {
        char marker[800];
        snprintf(marker, sizeof marker, "%s/checkpoints/step-%08d/COMPLETE", run, step);
        if (access(marker, F_OK) == 0) newest = step;
    }
    char ck[800];
    snprintf(ck, sizeof ck, "%s/checkpoints/step-%08d", run, newest);
    snprintf(cmd, sizeof cmd, "%s inspect %s 2>&1", tl_dtrain(), ck);
    CHECK(newest >= 5 && newest < 30 && tl_run(cmd, g_out, sizeof g_out) == 0,
          "disk full: the newest complete checkpoint (step %d) verifies:\n%s", newest, g_out);
    snprintf(extra, sizeof extra, "--zero 1 --resume %s", ck);
    rc = train("full-resumed", 2, extra);
    CHECK(rc == 0 && same_as_ref("full-resumed"), "disk full: resumed from step %d, bitwise the uninterrupted run (exit %d)",
          newest, rc);
    printf("disk full: stopped naming the file; step %d intact, resumed to the same model\n", newest);
    snprintf(cmd, sizeof cmd, "umount %s", mnt);
    CHECK(tl_run(cmd, g_out, sizeof g_out) == 0, "disk full: the tmpfs unmounted: %s", g_out);
}

static void test_flags(void) {
    static const struct { const char *args, *want; } bad[] = {
        {"--checkpoint-every 0", "--checkpoint-every"},
        {"--checkpoint-every x", "--checkpoint-every"},
        {"--keep", "--keep needs a value"},
        {"--max-restarts -1", "--max-restarts"},
        {"--workers 3:2", "MIN:MAX"},
        {"--heartbeat-timeout abc", "--heartbeat-timeout"},
    };
    char cmd[2048];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(cmd, sizeof cmd, "%s train %s %s 2>&1", tl_dtrain(), tmp("run.ini"), bad[i].args);
        int rc = tl_run(cmd, g_out, sizeof g_out);
        CHECK(rc == 2 && strstr(g_out, bad[i].want), "'%s': exit %d, expected 2 naming %s:\n%s", bad[i].args, rc,
              bad[i].want, g_out);
    }
    // Resuming another model's run is refused, naming the checkpoint.
    FILE *f = fopen(tmp("other.ini"), "w");
    fprintf(f, "[model]\ninput = 784\nlayer = linear out=10\n[data]\ndir = %s\n", g_tmp);
    fclose(f);
    snprintf(cmd, sizeof cmd, "%s train %s --quiet --run-dir %s --resume auto 2>&1", tl_dtrain(), tmp("other.ini"),
             tmp("up"));
    int rc = tl_run(cmd, g_out, sizeof g_out);
    CHECK(rc == 1 && strstr(g_out, "step-000000") && strstr(g_out, "different model"),
          "resume with another model: exit %d\n%s", rc, g_out);
    // --checkpoint-dir: the checkpoints elsewhere, where --resume auto finds them
    char flags[1200];
    snprintf(flags, sizeof flags, "--checkpoint-every 4 --checkpoint-dir %s", tmp("elsewhere"));
    setenv("DTRAIN_FAULT_STEP", "1:18", 1);
    rc = train("cdir", 2, flags);
    unsetenv("DTRAIN_FAULT_STEP");
    CHECK(rc == 1 && access(tl_path(tmp("elsewhere"), "step-00000016.safetensors"), F_OK) == 0 &&
              access(tl_path(tmp("cdir"), "checkpoints"), F_OK) != 0,
          "--checkpoint-dir: step 16 there, no RUN_DIR/checkpoints: exit %d\n%s", rc, g_out);
    snprintf(flags, sizeof flags, "--checkpoint-every 4 --checkpoint-dir %s --resume auto", tmp("elsewhere"));
    rc = train("cdir", 3, flags);
    CHECK(rc == 0 && same_as_ref("cdir"), "resumed from --checkpoint-dir: exit %d\n%s", rc, g_out);
}

// ---------------------------------------------------------------------------
// slices: save and restore from what each rank holds (a sharded strategy),
// with state of each rank's own in its shard (dt_ckpt_model.extra)

enum { SN = 101 };  // prime: no worker count divides it
static const dt_tensor_info slice_tensors[2] = {{"w", 2, {10, 10}, 0, 100}, {"b", 1, {1}, 100, 1}};

// Rank r of W's view: all of the parameters, the states' dt_shard_range
// slice (as ZeRO stage 1 holds them), values from the whole arrays.
static dt_ckpt_model slice_view(float *p, float *s0, float *s1, int64_t *step, int r, int W, const float *full) {
    size_t lo, hi;
    dt_shard_range(SN, r, W, &lo, &hi);
    for (size_t i = 0; i < SN; i++) p[i] = full[i];
    for (size_t i = lo; i < hi; i++) s0[i - lo] = full[SN + i], s1[i - lo] = full[2 * SN + i];
    return (dt_ckpt_model){.tensors = slice_tensors, .ntensors = 2, .params = p, .nparams = SN, .nstates = 2,
                           .states = {s0, s1}, .opt_step = step, .optimizer = "adamw", .config = "",
                           .params_lo = 0, .params_hi = SN, .states_lo = lo, .states_hi = hi};
}

// A rank's extra state (dt_ckpt_model.extra): user's 4 floats.
static int slice_extra(void *user, dt_st_tensor *t, int max) {
    if (max > 0) t[0] = (dt_st_tensor){"extra.state", DT_F32, 1, {4}, user, 4 * sizeof(float)};
    return 1;
}

static void test_slices(void) {
    float full[3 * SN];
    for (int i = 0; i < 3 * SN; i++) full[i] = (float)i * 0.25f - 7;
    dt_train_state st = {9, 1, 2, 3, 1.5, {{5, 6, 7, 8}}, 3, 0, 0, 0};
    enum { W = 3 };
    float p[W][SN], s0[W][SN], s1[W][SN];
    int64_t step[W];
    dt_ckpt_writer *w[W] = {0};
    const char *dir = tmp("slices");
    int ok = 1;
    float extra[W][4];
    // Three ranks each write their slice, and state of their own, into one
    // sharded checkpoint.
    for (int r = 0; r < W; r++) {
        step[r] = 9;
        for (int i = 0; i < 4; i++) extra[r][i] = (float)(10 * r + i);
        dt_ckpt_model m = slice_view(p[r], s0[r], s1[r], &step[r], r, W, full);
        m.extra = slice_extra;
        m.extra_user = extra[r];
        ok = ok && dt_ckpt_writer_create(&w[r], dir, 2, &m, r, W, 10) == DT_OK;
    }
    for (int r = 0; r < W; r++) ok = ok && dt_ckpt_writer_save(w[r], &st) == DT_OK;
    for (int r = 0; r < W; r++) extra[r][0] = -1;  // after the snapshot: not in the file
    for (int r = 0; r < W; r++) {
        if (w[r]) ok = ok && dt_ckpt_writer_wait(w[r]) == DT_OK;
        dt_ckpt_writer_free(w[r]);
    }
    CHECK(ok, "slices: three ranks write their slices: %s", dt_last_error());
    char ck[700];
    snprintf(ck, sizeof ck, "%s/step-00000009", dir);
    // Each rank's extra state, in its own shard, as the snapshot had it.
    int parts = 0;
    CHECK(dt_ckpt_open_part(ck, -1, NULL, &parts) == DT_OK && parts == W, "slices: written by %d parts", parts);
    for (int r = 0; r < W; r++) {
        dt_st_file *f = NULL;
        const dt_st_tensor *t = dt_ckpt_open_part(ck, r, &f, &parts) == DT_OK ? dt_st_find(f, "extra.state") : NULL;
        float want[4] = {(float)(10 * r), (float)(10 * r + 1), (float)(10 * r + 2), (float)(10 * r + 3)};
        const void *got = t && t->nbytes == sizeof want ? tl_st_data(f, t) : NULL;
        CHECK(got && !memcmp(got, want, sizeof want),
              "slices: part %d holds rank %d's extra state as saved: %s", r, r, t ? "wrong values" : dt_last_error());
        dt_st_close(f);
    }
    CHECK(dt_ckpt_open_part(ck, W, &(dt_st_file *){NULL}, &parts) == DT_ERR_ARG && strstr(dt_last_error(), "no part 3"),
          "slices: part 3 of 3 refused: %s", dt_last_error());
    // Read whole: the ranks' slices put together.
    float wp[SN], w0[SN], w1[SN];
    int64_t ws = 0;
    dt_train_state got;
    dt_ckpt_model whole = {.tensors = slice_tensors, .ntensors = 2, .params = wp, .nparams = SN, .nstates = 2,
                           .states = {w0, w1}, .opt_step = &ws, .optimizer = "adamw", .config = ""};
    CHECK(dt_ckpt_read(ck, &whole, &got) == DT_OK, "slices: read whole: %s", dt_last_error());
    CHECK(!memcmp(wp, full, sizeof wp) && !memcmp(w0, full + SN, sizeof w0) && !memcmp(w1, full + 2 * SN, sizeof w1) &&
              ws == 9 && got.step == 9,
          "slices: the whole state read back is the ranks' slices put together");
    // Read by 2 and by 4 ranks, each its own slice only.
    for (int W2 = 2; W2 <= 4; W2 += 2) {
        for (int r = 0; r < W2; r++) {
            float q[SN], t0[SN], t1[SN];
            int64_t qs = 0;
            float zero[3 * SN] = {0};
            dt_ckpt_model m = slice_view(q, t0, t1, &qs, r, W2, zero);
            size_t lo = m.states_lo, hi = m.states_hi;
            CHECK(dt_ckpt_read(ck, &m, &got) == DT_OK, "slices: rank %d of %d reads its slice: %s", r, W2,
                  dt_last_error());
            CHECK(!memcmp(q, full, sizeof q) && !memcmp(t0, full + SN + lo, sizeof(float) * (hi - lo)) &&
                      !memcmp(t1, full + 2 * SN + lo, sizeof(float) * (hi - lo)) && qs == 9,
                  "slices: rank %d of %d holds [%zu, %zu) of the state written by 3", r, W2, lo, hi);
        }
    }
    // A whole checkpoint file read into a slice; a slice cannot be written
    // as a whole file, nor a shard the rank does not hold.
    const char *file = tmp("slices-whole.safetensors");
    CHECK(dt_ckpt_write(file, &whole, &got) == DT_OK, "slices: whole file: %s", dt_last_error());
    float q[SN], t0[SN], t1[SN];
    int64_t qs = 0;
    float zero[3 * SN] = {0};
    dt_ckpt_model m = slice_view(q, t0, t1, &qs, 1, 2, zero);
    CHECK(dt_ckpt_read(file, &m, &got) == DT_OK && !memcmp(t1, full + 2 * SN + m.states_lo,
                                                           sizeof(float) * (m.states_hi - m.states_lo)),
          "slices: a whole file read into rank 1 of 2's slice: %s", dt_last_error());
    CHECK(dt_ckpt_write(tmp("slice-as-whole.safetensors"), &m, &got) == DT_ERR_ARG &&
              strstr(dt_last_error(), "slice"),
          "slices: a slice written as a whole checkpoint is refused: %s", dt_last_error());
    whole.extra = slice_extra;
    whole.extra_user = extra[0];
    CHECK(dt_ckpt_write(tmp("extra-as-whole.safetensors"), &whole, &got) == DT_ERR_ARG &&
              strstr(dt_last_error(), "state of its own"),
          "slices: a rank's own state in a whole checkpoint is refused: %s", dt_last_error());
    dt_ckpt_writer *bad = NULL;
    CHECK(dt_ckpt_writer_create(&bad, tmp("slices-bad"), 2, &m, 0, 2, 10) == DT_ERR_ARG && !bad &&
              strstr(dt_last_error(), "not inside what it holds"),
          "slices: a writer for a shard this rank does not hold is refused: %s", dt_last_error());
}

// NaN or Inf weights under a sound checksum: resume, export and loading
// refuse them naming the tensor; inspect says so and exits 0.
static void test_nonfinite(void) {
    net a, b;
    net_make(&a, 5, DT_OPTIM_ADAMW, 1);
    net_make(&b, 5, DT_OPTIM_ADAMW, 2);
    float *p = dt_model_params(a.m);
    p[a.t[1].offset + 2] = NAN;  // in the second tensor
    p[a.t[2].offset] = INFINITY;
    dt_train_state s = {.step = 3, .world = 1}, r;
    char ck[600], w[600], ex[600], cmd[2000];
    snprintf(ck, sizeof ck, "%s", tmp("nan.safetensors"));
    snprintf(w, sizeof w, "%s", tmp("nan-weights.safetensors"));
    snprintf(ex, sizeof ex, "%s", tmp("nan-export.safetensors"));
    CHECK(dt_ckpt_write(ck, &a.cm, &s) == DT_OK && dt_model_save(a.m, w, NULL, 0) == DT_OK, "written: %s",
          dt_last_error());
    float before = dt_model_params(b.m)[0];
    dt_status st = dt_ckpt_read(ck, &b.cm, &r);
    CHECK(st == DT_ERR_NUMERIC && strstr(dt_last_error(), "2 values are NaN or Inf") &&
              strstr(dt_last_error(), a.t[1].name) && dt_model_params(b.m)[0] == before,
          "resume refuses NaN weights, the model untouched: %s", dt_last_error());
    st = dt_ckpt_export_weights(ck, ex);
    CHECK(st == DT_ERR_NUMERIC && access(ex, F_OK) != 0, "export refuses them, nothing written: %s", dt_last_error());
    st = dt_model_load(b.m, w);
    CHECK(st == DT_ERR_NUMERIC && strstr(dt_last_error(), w), "loading NaN weights refused: %s", dt_last_error());
    snprintf(cmd, sizeof cmd, "%s inspect %s", tl_dtrain(), ck);
    int rc = tl_run(cmd, g_out, sizeof g_out);
    CHECK(rc == 0 && strstr(g_out, "values: 2 values are NaN or Inf") && strstr(g_out, "checksum"),
          "inspect says so: exit %d\n%s", rc, g_out);
    net_free(&a), net_free(&b);
}

// A checkpoint larger than the memory its readers may take: with the
// address space capped at 48 MiB above what the process uses, a 72 MB
// checkpoint is inspected, exported (fp32, bf16, fp16) and read by a rank
// that holds a slice (each reads 16 MiB at a time, and the rank only its
// slice), and every export holds the bytes the in-memory writer
// (dt_st_write) writes for the same weights.
static float stream_value(size_t i, int j) {
    return j == 0 ? (float)(i % 1009) * 0.001f - 0.25f : j == 1 ? (float)(i % 13) * 0.5f : (float)(i % 7);
}

static void test_streaming(void) {
    enum { ROWS = 3, COLS = 2000000, LO = 4194300, N = 1000 };  // (LO: across a 16 MiB piece's end)
    size_t nw = (size_t)ROWS * COLS, np = nw + 5;
    dt_tensor_info t[2] = {{"w", 2, {ROWS, COLS}, 0, nw}, {"b", 1, {5}, nw, 5}};
    float *v[3] = {malloc(np * sizeof(float)), malloc(np * sizeof(float)), malloc(np * sizeof(float))};
    uint16_t *half = malloc(np * sizeof(uint16_t));
    if (!v[0] || !v[1] || !v[2] || !half) {
        CHECK(0, "out of memory");
        return;
    }
    for (int j = 0; j < 3; j++)
        for (size_t i = 0; i < np; i++) v[j][i] = stream_value(i, j);
    int64_t step = 42;
    dt_st_meta wm[1] = {{"n_layer", "1"}};
    dt_ckpt_model cm = {.tensors = t, .ntensors = 2, .params = v[0], .nparams = np, .nstates = 2, .states = {v[1], v[2]},
                        .opt_step = &step, .optimizer = "adamw", .config = "", .weights_meta = wm, .nweights_meta = 1};
    dt_train_state s = {.step = 7, .world = 1}, r;
    char ck[600], ref[3][600], ex[3][600];
    const char *names[3] = {"fp32", "bf16", "fp16"};
    const dt_dtype types[3] = {DT_F32, DT_BF16, DT_F16};
    snprintf(ck, sizeof ck, "%s", tmp("big.safetensors"));
    CHECK(dt_ckpt_write(ck, &cm, &s) == DT_OK, "big checkpoint: %s", dt_last_error());
    // The references: the weights file as dt_st_write writes it from memory.
    dt_st_meta meta[4] = {{"n_layer", "1"}, {"format", "dtrain-weights"}, {"dtrain_version", dt_version()}, {"step", "7"}};
    for (int k = 0; k < 3; k++) {
        snprintf(ref[k], sizeof ref[k], "%s/ref-%s.safetensors", g_tmp, names[k]);
        snprintf(ex[k], sizeof ex[k], "%s/export-%s.safetensors", g_tmp, names[k]);
        const void *d = v[0];
        size_t es = k ? 2 : 4;
        if (k) dt_from_f32(half, v[0], np, types[k]), d = half;
        dt_st_tensor w[2] = {{"w", types[k], 2, {ROWS, COLS}, d, nw * es},
                             {"b", types[k], 1, {5}, (const char *)d + nw * es, 5 * es}};
        CHECK(dt_st_write(ref[k], w, 2, meta, 4) == DT_OK, "reference %s: %s", names[k], dt_last_error());
    }
    for (int j = 0; j < 3; j++) free(v[j]);
    free(half);
    struct stat sb;
    CHECK(stat(ck, &sb) == 0 && sb.st_size > (48 << 20) + (16 << 20), "the checkpoint (%lld bytes) is larger than the cap",
          (long long)sb.st_size);
    FILE *devnull = fopen("/dev/null", "w");
    float slice[3][N];
    int64_t got_step = -1;
    dt_ckpt_model mine = cm;
    mine.params = slice[0], mine.states[0] = slice[1], mine.states[1] = slice[2], mine.opt_step = &got_step;
    mine.params_lo = mine.states_lo = LO, mine.params_hi = mine.states_hi = LO + N;
    int capped = tl_cap_memory((size_t)48 << 20);
    dt_status ist = devnull ? dt_ckpt_inspect(ck, devnull) : DT_ERR_IO;
    char ierr[512];
    snprintf(ierr, sizeof ierr, "%s", ist == DT_OK ? "" : dt_last_error());
    dt_status est[3];
    for (int k = 0; k < 3; k++) est[k] = dt_ckpt_export_weights_as(ck, ex[k], types[k]);
    dt_status rst = dt_ckpt_read(ck, &mine, &r);
    tl_uncap_memory();
    if (devnull) fclose(devnull);
    printf("streaming: a %lld-byte checkpoint read with the address space %s\n", (long long)sb.st_size,
           capped ? "capped at 48 MiB above the process's" : "uncapped (sanitizers)");
    CHECK(ist == DT_OK, "inspect under the cap: %s", ierr);
    for (int k = 0; k < 3; k++) {
        CHECK(est[k] == DT_OK, "export %s under the cap: %s", names[k], dt_status_string(est[k]));
        size_t na, nb;
        char *a = tl_read_file(ref[k], &na), *b = tl_read_file(ex[k], &nb);
        CHECK(a && b && na == nb && !memcmp(a, b, na), "export %s: the bytes dt_st_write writes (%zu and %zu bytes)",
              names[k], na, nb);
        free(a), free(b);
        unlink(ref[k]), unlink(ex[k]);
    }
    int same = rst == DT_OK && got_step == 42 && r.step == 7;
    for (int j = 0; j < 3 && same; j++)
        for (size_t i = 0; i < N && same; i++) same = slice[j][i] == stream_value(LO + i, j);
    CHECK(same, "a rank's slice [%d, %d) of the parameters and both states read under the cap: %s", LO, LO + N,
          rst == DT_OK ? "wrong values" : dt_status_string(rst));
    unlink(ck);
}

// `test_ckpt disk-full` (ctest test_ckpt_disk-full) runs the disk-full
// case alone: it needs to mount a tmpfs (root), and is reported skipped
// where it cannot.
int main(int argc, char **argv) {
    snprintf(g_tmp, sizeof g_tmp, "/tmp/dtrain-test-ckpt-XXXXXX");
    if (!mkdtemp(g_tmp)) return perror("mkdtemp"), 1;
    if (argc > 1 && !strcmp(argv[1], "disk-full")) {
        runs_setup();
        test_disk_full();
        tl_cleanup(g_tmp);
        return tl_finish();
    }
    test_file();
    test_nonfinite();
    test_streaming();
    test_slices();
    runs_setup();
    test_runs();
    test_gpt_runs();
    test_elastic("elastic", "");
    test_elastic("elastic-zero3", "--zero 3");
    test_flags();
    tl_cleanup(g_tmp);
    return tl_finish();
}
