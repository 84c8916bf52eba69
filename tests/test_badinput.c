/* Bad input is never a crash: every malformed data file, config, checkpoint
 * and command line gets the right status (or exit code) and a message that
 * names the file, the line and the field.
 *
 *   1. IDX data (library): missing file, truncated and corrupt gzip, wrong
 *      magic and element type, header/data size mismatch, images that are
 *      not 3-D, label count mismatch, labels >= 10.
 *   2. Configs (library): unknown section and key, bad numbers, ranges,
 *      bools, layer specs, preset together with layers, syntax errors, lines
 *      too long for the parser, --set errors; DT_ERR_CONFIG with
 *      "FILE:LINE: [section] key".
 *   3. safetensors (library): truncated, bad header length, bad JSON,
 *      offsets past the end, dtype/shape against byte count, overlapping
 *      ranges, duplicate names, and weights of another model given to
 *      dt_model_load; DT_ERR_FORMAT naming the tensor.
 *   4. The CLI: exit 2 for usage errors, 1 for runtime errors, 0 for --help
 *      and --version, never a signal; messages name the file or the step.
 *   5. Weights and checkpoints through the commands: sizes a file claims
 *      checked against its bytes before anything is allocated (GPT weights,
 *      a sharded index), damaged sharded checkpoints (no temp file left), a
 *      bit-flipped checkpoint given to eval, and text from files (tensor
 *      names, metadata, log lines) escaped before it reaches the terminal.
 *
 * Everything is written under a fresh temporary directory, removed at the
 * end unless a check failed or KEEP is set in the environment. CLI runs use
 * a 1000-sample copy of the data so that the whole test takes seconds. */
#include "dtrain/ckpt.h"
#include "dtrain/config.h"
#include "dtrain/data.h"
#include "dtrain/gpt.h"
#include "dtrain/nn.h"
#include "testlib.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FMNIST "/usr/share/datasets/fashion-mnist"

static char g_tmp[256];
static char g_out[1 << 16];

// g_tmp/name; the strings live until the end of the test.
static char *g_paths[256];
static int g_npaths;

static const char *tmp_path(const char *name) {
    char *p = malloc(strlen(g_tmp) + strlen(name) + 2);
    sprintf(p, "%s/%s", g_tmp, name);
    if (g_npaths < 256) g_paths[g_npaths++] = p;
    return p;
}

static void write_file(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) {
        CHECK(0, "cannot write %s", path);
        return;
    }
    fwrite(data, 1, n, f);
    fclose(f);
}

static uint8_t *read_all(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    rewind(f);
    uint8_t *b = malloc(sz > 0 ? (size_t)sz : 1);
    *n = fread(b, 1, (size_t)sz, f);
    fclose(f);
    return b;
}

static int contains(const char *hay, const char *needle) { return strstr(hay, needle) != NULL; }

// Checks status and that the last error contains every needle (NULL-ended).
#define EXPECT_ERR(call, want, ...)                                                              \
    do {                                                                                         \
        dt_status _st = (call);                                                                  \
        const char *_need[] = {__VA_ARGS__, NULL};                                               \
        CHECK(_st == (want), "%s: status %s, expected %s (%s)", #call, dt_status_string(_st),    \
              dt_status_string(want), dt_last_error());                                          \
        for (int _i = 0; _need[_i]; _i++)                                                        \
            CHECK(contains(dt_last_error(), _need[_i]), "%s: message '%s' lacks '%s'", #call,    \
                  dt_last_error(), _need[_i]);                                                   \
    } while (0)

// An IDX array of unsigned bytes with the given dims and contents (all zero
// unless data is given), optionally with a different magic / type byte.
static uint8_t *make_idx(const uint32_t *dims, int nd, const uint8_t *data, uint8_t type, size_t *len) {
    size_t n = 1;
    for (int i = 0; i < nd; i++) n *= dims[i];
    *len = 4 + 4 * (size_t)nd + n;
    uint8_t *b = calloc(1, *len);
    b[2] = type;
    b[3] = (uint8_t)nd;
    for (int i = 0; i < nd; i++) {
        b[4 + 4 * i] = (uint8_t)(dims[i] >> 24);
        b[5 + 4 * i] = (uint8_t)(dims[i] >> 16);
        b[6 + 4 * i] = (uint8_t)(dims[i] >> 8);
        b[7 + 4 * i] = (uint8_t)dims[i];
    }
    if (data) memcpy(b + 4 + 4 * nd, data, n);
    return b;
}

static void write_idx(const char *name, const uint32_t *dims, int nd, const uint8_t *data, uint8_t type) {
    size_t len;
    uint8_t *b = make_idx(dims, nd, data, type, &len);
    write_file(tmp_path(name), b, len);
    free(b);
}

// ---------------------------------------------------------------------------
// 1. IDX data files

static void test_idx(void) {
    dt_dataset ds;
    dt_idx idx;
    const uint32_t img_dims[] = {3, 2, 2}, lab_dims[] = {3}, lab4_dims[] = {4};
    const uint8_t labels_ok[] = {0, 9, 5}, labels_bad[] = {0, 10, 5};
    write_idx("img.idx", img_dims, 3, NULL, 0x08);
    write_idx("lab.idx", lab_dims, 1, labels_ok, 0x08);
    const char *img = tmp_path("img.idx"), *lab = tmp_path("lab.idx");

    // The valid pair loads (so the failures below are about what was broken).
    dt_status st = dt_dataset_load_idx(&ds, img, lab, 10, 0.0f, 1.0f);
    CHECK(st == DT_OK && ds.n == 3 && ds.y[1] == 9, "valid tiny IDX pair: %s", dt_last_error());
    if (st == DT_OK) dt_dataset_free(&ds);

    const char *missing = tmp_path("no-such-images.gz");
    EXPECT_ERR(dt_dataset_load_idx(&ds, missing, lab, 10, 0.0f, 1.0f), DT_ERR_IO, missing);
    EXPECT_ERR(dt_dataset_load_idx(&ds, img, missing, 10, 0.0f, 1.0f), DT_ERR_IO, missing);
    uint8_t *buf;
    size_t len;
    EXPECT_ERR(dt_read_file_gz(missing, &buf, &len), DT_ERR_IO, missing, "cannot open");
    CHECK(buf == NULL, "failed read leaves *buf NULL");
    EXPECT_ERR(dt_read_file_gz(g_tmp, &buf, &len), DT_ERR_IO, g_tmp);  // a directory

    // A real .gz cut short, and one with flipped bytes in the deflate stream.
    size_t gzn;
    uint8_t *gz = read_all(FMNIST "/t10k-labels-idx1-ubyte.gz", &gzn);
    CHECK(gz != NULL && gzn > 1000, "read " FMNIST "/t10k-labels-idx1-ubyte.gz");
    if (gz) {
        const char *whole = tmp_path("whole-labels.gz"), *cut = tmp_path("cut-labels.gz"),
                   *bad = tmp_path("corrupt-labels.gz");
        write_file(whole, gz, gzn);
        st = dt_read_file_gz(whole, &buf, &len);
        CHECK(st == DT_OK && len == 8 + 10000, "whole copy reads: %s", dt_last_error());
        if (st == DT_OK) free(buf);
        write_file(cut, gz, gzn / 2);
        EXPECT_ERR(dt_read_file_gz(cut, &buf, &len), DT_ERR_FORMAT, cut, "truncated");
        EXPECT_ERR(dt_dataset_load_idx(&ds, img, cut, 10, 0.0f, 1.0f), DT_ERR_FORMAT, cut);
        for (size_t i = 100; i < 200; i++) gz[i] ^= 0x5a;
        write_file(bad, gz, gzn);
        EXPECT_ERR(dt_read_file_gz(bad, &buf, &len), DT_ERR_FORMAT, bad, "gzip");
        free(gz);
    }

    // Wrong magic (a gzip header where the IDX magic belongs), element type
    // (0x0D = float), and header/data size mismatches.
    size_t n;
    uint8_t *b = make_idx(img_dims, 3, NULL, 0x08, &n);
    b[0] = 0x1f, b[1] = 0x8b;
    write_file(tmp_path("magic.idx"), b, n);
    EXPECT_ERR(dt_idx_parse(b, n, "magic.idx", &idx), DT_ERR_FORMAT, "magic.idx", "not an IDX file");
    EXPECT_ERR(dt_dataset_load_idx(&ds, tmp_path("magic.idx"), lab, 10, 0.0f, 1.0f), DT_ERR_FORMAT,
               tmp_path("magic.idx"), "magic");
    b[0] = b[1] = 0;
    b[2] = 0x0D;
    write_file(tmp_path("type.idx"), b, n);
    EXPECT_ERR(dt_dataset_load_idx(&ds, tmp_path("type.idx"), lab, 10, 0.0f, 1.0f), DT_ERR_FORMAT,
               tmp_path("type.idx"), "element type 0x0d");
    b[2] = 0x08;
    write_file(tmp_path("short.idx"), b, n - 1);
    EXPECT_ERR(dt_dataset_load_idx(&ds, tmp_path("short.idx"), lab, 10, 0.0f, 1.0f), DT_ERR_FORMAT,
               tmp_path("short.idx"), "truncated");
    EXPECT_ERR(dt_idx_parse(b, 10, "hdr.idx", &idx), DT_ERR_FORMAT, "hdr.idx", "truncated IDX header");
    uint8_t *longer = calloc(1, n + 3);
    memcpy(longer, b, n);
    EXPECT_ERR(dt_idx_parse(longer, n + 3, "long.idx", &idx), DT_ERR_FORMAT, "long.idx", "trailing bytes");
    free(longer);
    EXPECT_ERR(dt_idx_parse(b, 3, "tiny.idx", &idx), DT_ERR_FORMAT, "tiny.idx");
    EXPECT_ERR(dt_idx_parse(b, 0, "empty.idx", &idx), DT_ERR_FORMAT, "empty.idx");
    b[3] = 0;  // zero dimensions
    EXPECT_ERR(dt_idx_parse(b, n, "nd0.idx", &idx), DT_ERR_FORMAT, "nd0.idx", "dimensions");
    b[3] = 3;
    b[4] = 0x80;  // first dimension 2^31 + 3
    EXPECT_ERR(dt_idx_parse(b, n, "big.idx", &idx), DT_ERR_FORMAT, "big.idx", "dimension 0");
    free(b);

    // Shapes across the pair: 1-D images, label count, label values.
    write_idx("flat.idx", lab_dims, 1, labels_ok, 0x08);
    EXPECT_ERR(dt_dataset_load_idx(&ds, tmp_path("flat.idx"), lab, 10, 0.0f, 1.0f), DT_ERR_FORMAT,
               tmp_path("flat.idx"), "3-D");
    write_idx("lab4.idx", lab4_dims, 1, (const uint8_t[]){1, 2, 3, 4}, 0x08);
    EXPECT_ERR(dt_dataset_load_idx(&ds, img, tmp_path("lab4.idx"), 10, 0.0f, 1.0f), DT_ERR_FORMAT,
               tmp_path("lab4.idx"), img, "4 labels", "3 images");
    write_idx("lab10.idx", lab_dims, 1, labels_bad, 0x08);
    EXPECT_ERR(dt_dataset_load_idx(&ds, img, tmp_path("lab10.idx"), 10, 0.0f, 1.0f), DT_ERR_FORMAT,
               tmp_path("lab10.idx"), "label 10 of sample 1");
    CHECK(ds.x == NULL && ds.y == NULL && ds.n == 0, "failed load leaves the dataset empty");
}

// ---------------------------------------------------------------------------
// 2. configs

#define BASE "[model]\npreset = mlp\n"

static void cfg_err(const char *text, const char *const *sets, int nsets, const char *n1, const char *n2,
                    const char *n3) {
    dt_config c;
    dt_status st = dt_config_parse(&c, text, "bad.ini", sets, nsets);
    const char *e = dt_last_error();
    CHECK(st == DT_ERR_CONFIG, "config '%.60s' (%s): status %s, expected config error (%s)", text,
          nsets ? sets[0] : "no --set", dt_status_string(st), e);
    const char *need[] = {n1, n2, n3};
    for (int i = 0; i < 3; i++)
        if (need[i]) CHECK(contains(e, need[i]), "config '%.60s': message '%s' lacks '%s'", text, e, need[i]);
}

static void test_config(void) {
    dt_config c;
    CHECK(dt_config_parse(&c, BASE, "ok.ini", NULL, 0) == DT_OK, "base config parses: %s", dt_last_error());

    cfg_err(BASE "[trian]\nbatch = 3\n", NULL, 0, "bad.ini:4:", "[trian] batch", "unknown section");
    cfg_err(BASE "[train]\nbatchsize = 3\n", NULL, 0, "bad.ini:4:", "[train] batchsize", "unknown key");
    cfg_err(BASE "[optim]\nlr = 0.0.1\n", NULL, 0, "bad.ini:4:", "[optim] lr", "expected a number");
    cfg_err(BASE "[optim]\nlr = fast\n", NULL, 0, "bad.ini:4:", "[optim] lr", "'fast'");
    cfg_err(BASE "[train]\nbatch = 0\n", NULL, 0, "bad.ini:4:", "[train] batch", "expected a value from 1");
    cfg_err(BASE "[train]\nbatch = 2.5\n", NULL, 0, "bad.ini:4:", "[train] batch", "whole number");
    cfg_err(BASE "[optim]\nmomentum = 1.5\n", NULL, 0, "bad.ini:4:", "[optim] momentum", "expected a value");
    cfg_err(BASE "[train]\nmax_steps = 1e400\n", NULL, 0, "bad.ini:4:", "[train] max_steps", "number");
    cfg_err(BASE "[train]\nseed = 99999999999999999999999\n", NULL, 0, "bad.ini:4:", "[train] seed", NULL);
    cfg_err(BASE "[optim]\nlr = nan\n", NULL, 0, "bad.ini:4:", "[optim] lr", NULL);
    cfg_err(BASE "[data]\nshuffle = maybe\n", NULL, 0, "bad.ini:4:", "[data] shuffle", "true or false");
    cfg_err(BASE "[optim]\nname = adam\n", NULL, 0, "bad.ini:4:", "[optim] name", "sgd, adamw");
    cfg_err("[model]\nlayer = conv2d out=32 kernel=-5\n", NULL, 0, "bad.ini:2:", "[model] layer", "kernel=-5");
    cfg_err("[model]\nlayer = linear\n", NULL, 0, "bad.ini:2:", "[model] layer", "out=N");
    cfg_err("[model]\nlayer = transformer out=3\n", NULL, 0, "bad.ini:2:", "[model] layer", "unknown layer");
    cfg_err("[model]\nlayer = relu size=3\n", NULL, 0, "bad.ini:2:", "[model] layer", "takes no parameter");
    cfg_err("[model]\nlayer = dropout p=1.5\n", NULL, 0, "bad.ini:2:", "[model] layer", "probability");
    cfg_err("[model]\ninput = 1x28x28x\npreset = mlp\n", NULL, 0, "bad.ini:2:", "[model] input", NULL);
    cfg_err("[model]\ninput = 4096x4096x4096\npreset = mlp\n", NULL, 0, "bad.ini:2:", "[model] input", NULL);
    cfg_err("[model]\npreset = resnet\n", NULL, 0, "bad.ini", "preset", "mlp or cnn");
    cfg_err("[model]\npreset = cnn\nlayer = relu\n", NULL, 0, "bad.ini", "preset", "not both");
    cfg_err("[model\npreset = mlp\n", NULL, 0, "bad.ini:1:", "syntax error", NULL);
    cfg_err(BASE "[train]\nbatch\n", NULL, 0, "bad.ini:4:", "syntax error", NULL);
    cfg_err("lr = 0.1\n" BASE, NULL, 0, "bad.ini:1:", "lr", "before any [section]");
    cfg_err("", NULL, 0, "bad.ini", "no layers", NULL);
    cfg_err(BASE "[train]\nepochs = 0\n", NULL, 0, "bad.ini", "epochs", "max_steps");
    // A line longer than the INI reader's buffer is an error, not silently cut.
    char longline[700];
    snprintf(longline, sizeof longline, BASE "[data]\ndir = /%0400d\n", 7);
    cfg_err(longline, NULL, 0, "bad.ini:4:", "line longer", NULL);
    // ... and so is a --set value too long for dt_config_write to write back.
    char longset[400];
    snprintf(longset, sizeof longset, "data.dir=/%0300d", 7);
    const char *s_long[] = {longset};
    cfg_err(BASE, s_long, 1, "--set", "[data] dir", "value longer than");

    // String values that dt_config_write could not write back unchanged.
    cfg_err(BASE "[data]\ndir =; /data\n", NULL, 0, "bad.ini:4:", "[data] dir", "comment");
    const char *s_nl[] = {"run.name=a\n[train]\nbatch=5"}, *s_sp[] = {"data.dir= /x"};
    cfg_err(BASE, s_nl, 1, "--set", "[run] name", "control character");
    cfg_err(BASE, s_sp, 1, "--set", "[data] dir", "blanks");

    // What dt_config_write writes reads back to the same values (a dropout
    // p with more digits than %g keeps was once rounded).
    const char *rt = "[model]\ninput = 784\nlayer = dropout p=0.418447137\nlayer = linear out=10\n"
                     "layer = layernorm eps=3.3333e-7\n[data]\ndir = /a;b c\n[train]\nseed = 12345678901234567890\n";
    dt_config c2;
    const char *rtp = tmp_path("roundtrip.ini");
    if (dt_config_parse(&c, rt, "rt.ini", NULL, 0) == DT_OK && dt_config_write(&c, rtp) == DT_OK &&
        dt_config_load(&c2, rtp, NULL, 0) == DT_OK) {
        CHECK(c2.layers[0].p == c.layers[0].p && c2.layers[2].eps == c.layers[2].eps,
              "dropout p / layernorm eps survive dt_config_write: %.9g vs %.9g, %.9g vs %.9g", c.layers[0].p,
              c2.layers[0].p, c.layers[2].eps, c2.layers[2].eps);
        CHECK(!strcmp(c2.data_dir, "/a;b c") && c2.seed == 12345678901234567890ull,
              "dir and seed survive dt_config_write: '%s' %llu", c2.data_dir, (unsigned long long)c2.seed);
    } else {
        CHECK(0, "round trip through dt_config_write: %s", dt_last_error());
    }

    // --set errors name --set and the field.
    const char *s1[] = {"train.batch"}, *s2[] = {"train.bogus=1"}, *s3[] = {"trainbatch=3"},
               *s4[] = {"train.batch=-1"}, *s5[] = {"model.layer=relu"}, *s6[] = {"nosuch.key=1"};
    cfg_err(BASE, s1, 1, "--set", "train.batch", "section.key=value");
    cfg_err(BASE, s2, 1, "--set", "[train] bogus", "unknown key");
    cfg_err(BASE, s3, 1, "--set", "trainbatch=3", NULL);
    cfg_err(BASE, s4, 1, "--set", "[train] batch", NULL);
    cfg_err(BASE, s5, 1, "--set", "layers cannot be overridden", NULL);
    cfg_err(BASE, s6, 1, "--set", "unknown section", NULL);

    // Large integers are exact; other spellings of whole numbers still work.
    const char *seed[] = {"train.seed=18000000000000000001"};
    CHECK(dt_config_parse(&c, BASE, "ok.ini", seed, 1) == DT_OK && c.seed == 18000000000000000001ull,
          "seed 18000000000000000001 read exactly (got %llu)", (unsigned long long)c.seed);
    const char *seed2[] = {"train.seed=1.5e3"};
    CHECK(dt_config_parse(&c, BASE, "ok.ini", seed2, 1) == DT_OK && c.seed == 1500,
          "seed 1.5e3 read as 1500 (got %llu)", (unsigned long long)c.seed);

    // From a file: the path is in the message, a missing file is an I/O error.
    const char *path = tmp_path("bad-file.ini");
    const char text[] = BASE "[optim]\nlr = -1\n";
    write_file(path, text, sizeof text - 1);
    char want[600];
    snprintf(want, sizeof want, "%s:4: [optim] lr", path);
    EXPECT_ERR(dt_config_load(&c, path, NULL, 0), DT_ERR_CONFIG, want);
    EXPECT_ERR(dt_config_load(&c, tmp_path("missing.ini"), NULL, 0), DT_ERR_IO, tmp_path("missing.ini"));
    const char bin[] = "[model]\npreset = mlp\n\0\1\2";
    write_file(path, bin, sizeof bin);
    EXPECT_ERR(dt_config_load(&c, path, NULL, 0), DT_ERR_CONFIG, path, "NUL");
    EXPECT_ERR(dt_config_load(&c, g_tmp, NULL, 0), DT_ERR_CONFIG, g_tmp);  // a directory
}

// ---------------------------------------------------------------------------
// 3. safetensors

// A safetensors file from a JSON header and n data bytes (values 0..n-1).
static void write_st(const char *path, const char *json, size_t ndata, uint64_t hlen_override) {
    size_t hl = strlen(json);
    uint64_t h = hlen_override ? hlen_override : hl;
    size_t n = 8 + hl + ndata;
    uint8_t *b = malloc(n);
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(h >> (8 * i));
    memcpy(b + 8, json, hl);
    for (size_t i = 0; i < ndata; i++) b[8 + hl + i] = (uint8_t)i;
    write_file(path, b, n);
    free(b);
}

static void st_err(const char *name, const char *json, size_t ndata, uint64_t hlen, const char *n1,
                   const char *n2) {
    const char *path = tmp_path(name);
    write_st(path, json, ndata, hlen);
    dt_st_file *f = (dt_st_file *)1;
    dt_status st = dt_st_open(&f, path);
    const char *e = dt_last_error();
    CHECK(st == DT_ERR_FORMAT, "%s: status %s, expected bad file format (%s)", name, dt_status_string(st), e);
    CHECK(f == NULL, "%s: a failed open hands back NULL", name);
    CHECK(contains(e, path), "%s: message '%s' lacks the path", name, e);
    if (n1) CHECK(contains(e, n1), "%s: message '%s' lacks '%s'", name, e, n1);
    if (n2) CHECK(contains(e, n2), "%s: message '%s' lacks '%s'", name, e, n2);
    if (st == DT_OK) dt_st_close(f);
}

static dt_model *small_model(int out1, int out2) {
    dt_layer_spec l[3] = {{.kind = DT_LAYER_LINEAR, .out = out1}, {.kind = DT_LAYER_RELU},
                          {.kind = DT_LAYER_LINEAR, .out = out2}};
    int in[3] = {6, 1, 1};
    dt_model *m = NULL;
    dt_status st = dt_model_create(&m, in, l, out2 ? 3 : 1, 4);
    CHECK(st == DT_OK, "dt_model_create: %s", dt_last_error());
    if (m) dt_model_init(m, 1);
    return m;
}

static void test_safetensors(void) {
    const char *W = "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]}}";
    dt_st_file *f;
    write_st(tmp_path("ok.st"), W, 16, 0);
    dt_status st = dt_st_open(&f, tmp_path("ok.st"));
    CHECK(st == DT_OK && dt_st_count(f) == 1 && dt_st_find(f, "w"), "valid file opens: %s", dt_last_error());
    if (st == DT_OK) dt_st_close(f);

    st_err("truncated.st", W, 12, 0, "'w'", "truncated");
    st_err("tiny.st", "", 0, 0, "header length", NULL);
    st_err("hlen-huge.st", W, 16, 1ull << 40, "header length", NULL);
    st_err("hlen-past-end.st", W, 16, 200, "header length", NULL);
    st_err("bad-json.st", "{\"w\":{\"dtype\":\"F32\",", 16, 0, "JSON", NULL);
    st_err("json-array.st", "[1,2]", 0, 0, "JSON object", NULL);
    st_err("past-end.st", "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,32]}}", 16, 0,
           "'w'", "[0, 32]");
    st_err("reversed.st", "{\"w\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,4]}}", 16, 0, "'w'", NULL);
    st_err("fraction.st", "{\"w\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0.5,4.5]}}", 16, 0, "'w'", NULL);
    st_err("shape.st", "{\"w\":{\"dtype\":\"F32\",\"shape\":[3,2],\"data_offsets\":[0,16]}}", 16, 0, "'w'",
           "do not match its shape");
    st_err("dtype.st", "{\"w\":{\"dtype\":\"F16\",\"shape\":[2,2],\"data_offsets\":[0,16]}}", 16, 0, "'w'",
           "F16");
    st_err("dtype-unknown.st", "{\"w\":{\"dtype\":\"Q4\",\"shape\":[2],\"data_offsets\":[0,1]}}", 16, 0, "'w'",
           "dtype");
    st_err("shape-wrap.st",
           "{\"w\":{\"dtype\":\"U8\",\"shape\":[281474976710656,65536],\"data_offsets\":[0,0]}}", 16, 0, "'w'",
           "too large");
    st_err("overlap.st",
           "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
           "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
           16, 0, "overlap", "'a'");
    st_err("dup.st",
           "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
           "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
           16, 0, "'a'", "twice");
    st_err("meta.st", "{\"__metadata__\":{\"k\":1}}", 0, 0, "__metadata__", NULL);
    EXPECT_ERR(dt_st_open(&f, tmp_path("missing.st")), DT_ERR_IO, tmp_path("missing.st"));
    EXPECT_ERR(dt_st_open(&f, g_tmp), DT_ERR_IO, g_tmp);

    // Weights of another model: a different shape, and a missing tensor.
    dt_model *a = small_model(4, 3), *b = small_model(5, 3), *c = small_model(3, 0);
    const char *wa = tmp_path("a.safetensors"), *wc = tmp_path("c.safetensors");
    if (a && b && c) {
        CHECK(dt_model_save(a, wa, NULL, 0) == DT_OK, "save: %s", dt_last_error());
        CHECK(dt_model_save(c, wc, NULL, 0) == DT_OK, "save: %s", dt_last_error());
        CHECK(dt_model_load(a, wa) == DT_OK, "load into the same model: %s", dt_last_error());
        EXPECT_ERR(dt_model_load(b, wa), DT_ERR_FORMAT, wa, "'0.weight'", "[4, 6]", "[5, 6]");
        EXPECT_ERR(dt_model_load(a, wc), DT_ERR_FORMAT, wc, "'0.weight'");
        EXPECT_ERR(dt_model_load(c, wa), DT_ERR_FORMAT, wa, "'0.weight'");
        EXPECT_ERR(dt_model_load(a, tmp_path("truncated.st")), DT_ERR_FORMAT, tmp_path("truncated.st"));
    }
    dt_model_free(a);
    dt_model_free(b);
    dt_model_free(c);
}

// ---------------------------------------------------------------------------
// 4. the CLI

// Runs `dtrain ARGS`, checks the exit code and that the output contains
// each needle. A signal (crash) shows up as -1 or 128+N and fails.
static int cli(int want_rc, const char *args, const char *n1, const char *n2) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s %s", tl_dtrain(), args);
    int rc = tl_run(cmd, g_out, sizeof g_out);
    CHECK(rc == 0 || rc == 1 || rc == 2, "dtrain %s: exit %d is not 0, 1 or 2 (a crash?)\n%s", args, rc, g_out);
    CHECK(rc == want_rc, "dtrain %s: exit %d, expected %d\n%s", args, rc, want_rc, g_out);
    if (n1) CHECK(contains(g_out, n1), "dtrain %s: output lacks '%s'\n%s", args, n1, g_out);
    if (n2) CHECK(contains(g_out, n2), "dtrain %s: output lacks '%s'\n%s", args, n2, g_out);
    return rc;
}

// A small copy of Fashion-MNIST in dir: the first n test samples as both
// the train and the test split, written as plain IDX under the .gz names
// (dt_read_file_gz reads plain files too). Keeps the CLI runs fast.
static int make_small_data(const char *dir, int n) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "mkdir -p '%s'", dir);
    if (tl_run(cmd, NULL, 0) != 0) return -1;
    const char *src[2] = {FMNIST "/t10k-images-idx3-ubyte.gz", FMNIST "/t10k-labels-idx1-ubyte.gz"};
    const char *dst[2][2] = {{"train-images-idx3-ubyte.gz", "t10k-images-idx3-ubyte.gz"},
                             {"train-labels-idx1-ubyte.gz", "t10k-labels-idx1-ubyte.gz"}};
    for (int k = 0; k < 2; k++) {
        uint8_t *buf;
        size_t len;
        dt_idx idx;
        if (dt_read_file_gz(src[k], &buf, &len) != DT_OK) return -1;
        if (dt_idx_parse(buf, len, src[k], &idx) != DT_OK || idx.dims[0] < n) {
            free(buf);
            return -1;
        }
        size_t hdr = (size_t)(idx.data - buf), per = idx.count / (size_t)idx.dims[0];
        buf[4] = (uint8_t)(n >> 24), buf[5] = (uint8_t)(n >> 16), buf[6] = (uint8_t)(n >> 8), buf[7] = (uint8_t)n;
        for (int d = 0; d < 2; d++) {
            char path[600];
            snprintf(path, sizeof path, "%s/%s", dir, dst[k][d]);
            write_file(path, buf, hdr + per * (size_t)n);
        }
        free(buf);
    }
    return 0;
}

static void test_cli(void) {
    char args[2048], want[1024];
    // Small eval batches: a CNN with the default eval_batch=1000 allocates
    // (and zeroes) ~1 GB of buffers before it gets to the weights.
    // One thread: on a shared 2-core machine two spinning threads can take
    // several times longer.
    const char *Q = "--set train.threads=1 --set train.eval_batch=50 -q";

    cli(2, "", "usage", NULL);
    cli(2, "frobnicate", "unknown command 'frobnicate'", NULL);
    cli(2, "train --frob configs/fashion-mlp.ini", "unknown option '--frob'", NULL);
    cli(2, "eval configs/fashion-mlp.ini --run-dir x", "unknown option", NULL);
    cli(2, "train", "missing CONFIG", NULL);
    cli(2, "train a.ini b.ini", "unexpected argument", NULL);
    cli(2, "train configs/fashion-mlp.ini --set", "--set needs", NULL);
    cli(2, "eval configs/fashion-mlp.ini", "--checkpoint", NULL);
    cli(0, "--help", "usage", "train");
    cli(0, "train --help", "usage: dtrain train", NULL);
    cli(0, "eval --help", "usage: dtrain eval", NULL);
    cli(0, "--version", "dtrain 0.", NULL);

    // Missing and bad config files: exit 1, the path (and line) named.
    snprintf(args, sizeof args, "train %s", tmp_path("nope.ini"));
    cli(1, args, tmp_path("nope.ini"), NULL);
    const char *bad = tmp_path("bad-cli.ini");
    const char text[] = "[model]\npreset = mlp\n[train]\nbatch = many\n";
    write_file(bad, text, sizeof text - 1);
    snprintf(args, sizeof args, "train %s --run-dir %s", bad, tmp_path("run-bad"));
    snprintf(want, sizeof want, "%s:4:", bad);
    cli(1, args, want, "[train] batch");
    // --set errors are usage errors.
    cli(2, "train configs/fashion-mlp.ini --set train.batch", "--set", "section.key=value");
    cli(2, "train configs/fashion-mlp.ini --set train.nosuch=1", "--set", "[train] nosuch");
    cli(2, "train configs/fashion-mlp.ini --set optim.lr=abc", "--set", "[optim] lr");

    // A data dir holding a truncated copy of the training images.
    char cmd[4096];
    const char *dd = tmp_path("data");
    snprintf(cmd, sizeof cmd,
             "mkdir -p %s && head -c 300000 " FMNIST "/train-images-idx3-ubyte.gz > %s/train-images-idx3-ubyte.gz"
             " && cp " FMNIST "/train-labels-idx1-ubyte.gz " FMNIST "/t10k-* %s/",
             dd, dd, dd);
    CHECK(tl_run(cmd, g_out, sizeof g_out) == 0, "set up %s: %s", dd, g_out);
    snprintf(args, sizeof args, "train configs/fashion-mlp.ini --set data.dir=%s --set train.max_steps=2 %s --run-dir %s",
             dd, Q, tmp_path("run-data"));
    snprintf(want, sizeof want, "%s/train-images-idx3-ubyte.gz", dd);
    cli(1, args, want, "truncated");
    // ... and labels that do not match the images in count (1000 images of
    // the small set, 10000 real labels).
    const char *small = tmp_path("small");
    CHECK(make_small_data(small, 1000) == 0, "small data set in %s: %s", small, dt_last_error());
    snprintf(cmd, sizeof cmd, "cp %s/train-images-idx3-ubyte.gz %s/ && cp " FMNIST
             "/t10k-labels-idx1-ubyte.gz %s/train-labels-idx1-ubyte.gz", small, dd, dd);
    CHECK(tl_run(cmd, g_out, sizeof g_out) == 0, "set up %s: %s", dd, g_out);
    snprintf(want, sizeof want, "%s/train-labels-idx1-ubyte.gz", dd);
    cli(1, args, want, "10000 labels");
    snprintf(args, sizeof args, "train configs/fashion-mlp.ini --set data.dir=%s %s --run-dir %s",
             tmp_path("nodata"), Q, tmp_path("run-nodata"));
    cli(1, args, tmp_path("nodata"), NULL);

    // Divergence: a huge constant learning rate makes the loss NaN/Inf in a
    // few steps; the run stops with exit 1 naming the step.
    snprintf(args, sizeof args,
             "train configs/fashion-mlp.ini --set data.dir=%s --set optim.lr=1000 --set schedule.name=constant "
             "--set schedule.warmup_steps=0 --set train.max_steps=50 %s --run-dir %s",
             small, Q, tmp_path("run-nan"));
    cli(1, args, "step ", NULL);
    CHECK(contains(g_out, "NaN") || contains(g_out, "Inf"), "diverged run: message lacks NaN/Inf\n%s", g_out);

    // eval with the weights of the other model.
    const char *mlp_dir = tmp_path("run-mlp");
    snprintf(args, sizeof args,
             "train configs/fashion-mlp.ini --set data.dir=%s --set train.max_steps=2 --checkpoint-every 2 %s --run-dir %s",
             small, Q, mlp_dir);
    if (cli(0, args, NULL, NULL) == 0) {
        // eval reads a checkpoint's weights, verified: a flipped bit in a
        // tensor is a damaged file, not an accuracy.
        char ck[700], flipped[700];
        snprintf(ck, sizeof ck, "%s/checkpoints/step-00000002.safetensors", mlp_dir);
        snprintf(flipped, sizeof flipped, "%s", tmp_path("flipped.safetensors"));
        snprintf(args, sizeof args, "eval configs/fashion-mlp.ini --checkpoint %s --set data.dir=%s %s", ck, small, Q);
        cli(0, args, NULL, NULL);
        size_t len;
        uint8_t *b = read_all(ck, &len);
        if (b && len > 1000) {
            b[len - 500] ^= 0x04;
            write_file(flipped, b, len);
            snprintf(args, sizeof args, "eval configs/fashion-mlp.ini --checkpoint %s --set data.dir=%s %s", flipped,
                     small, Q);
            cli(1, args, flipped, "checksum mismatch");
            CHECK(!contains(g_out, "accuracy"), "no accuracy from a damaged checkpoint\n%s", g_out);
        }
        free(b);
        snprintf(args, sizeof args, "eval configs/fashion-cnn.ini --checkpoint %s/model.safetensors --set data.dir=%s %s",
                 mlp_dir, small, Q);
        cli(1, args, "model.safetensors", "tensor '0.weight'");
        snprintf(args, sizeof args, "eval configs/fashion-mlp.ini --checkpoint %s/model.safetensors --set model.preset=cnn "
                 "--set data.dir=%s %s", mlp_dir, small, Q);
        cli(1, args, "tensor '", NULL);
        snprintf(args, sizeof args, "eval configs/fashion-mlp.ini --checkpoint %s --set data.dir=%s %s",
                 tmp_path("truncated.st"), small, Q);
        cli(1, args, tmp_path("truncated.st"), NULL);
        snprintf(args, sizeof args, "eval configs/fashion-mlp.ini --checkpoint %s --set data.dir=%s %s",
                 tmp_path("nope.st"), small, Q);
        cli(1, args, tmp_path("nope.st"), NULL);
    }
}

// ---------------------------------------------------------------------------
// 5. weights and checkpoints through the commands

// Whether s holds an ESC or another C0 control byte other than newline.
static int has_control(const char *s) {
    for (const unsigned char *p = (const unsigned char *)s; *p; p++)
        if (*p < 0x20 && *p != '\n') return 1;
    return 0;
}

static void test_escape(void) {
    struct {
        const char *in, *want;
    } cases[] = {
        {"plain 0.weight", "plain 0.weight"},
        {"\x1b[31mred\x1b[0m", "\\x1b[31mred\\x1b[0m"},
        {"title\x1b]0;pwned\x07", "title\\x1b]0;pwned\\x07"},
        {"tab\there\nnl\r", "tab\\x09here\\x0anl\\x0d"},
        {"del\x7f", "del\\x7f"},
        {"back\\slash \\x1b", "back\\slash \\x1b"},  // escaping twice is escaping once
        {"caf\xc3\xa9 \xe2\x82\xac", "caf\xc3\xa9 \xe2\x82\xac"},            // UTF-8 kept
        {"c1 \xc2\x9b" "2J", "c1 \\xc2\\x9b2J"},                               // CSI as UTF-8 C1
        {"raw \x9b" "2J", "raw \\x9b2J"},                                      // CSI as one byte
        {"bad \xff\xfe", "bad \\xff\\xfe"},
        {"overlong \xe0\x80\x9b", "overlong \\xe0\\x80\\x9b"},
        {"cut \xe2\x82", "cut \\xe2\\x82"},
    };
    char out[256];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        dt_escape_text(out, sizeof out, cases[i].in, strlen(cases[i].in));
        CHECK(!strcmp(out, cases[i].want), "escape case %zu: '%s', want '%s'", i, out, cases[i].want);
    }
    // A full buffer: never half an escape, always terminated.
    char small[7];
    dt_escape_text(small, sizeof small, "ab\x1b[1m", 6);
    CHECK(!strcmp(small, "ab\\x1b"), "escape into 7 bytes: '%s'", small);
    dt_escape_text(small, 4, "ab\x1b", 3);
    CHECK(!strcmp(small, "ab"), "escape into 4 bytes: '%s'", small);
    printf("escaping: %zu cases\n", sizeof cases / sizeof cases[0] + 2);
}

// A sharded checkpoint of a small model (0.weight [3, 4], 0.bias [3],
// AdamW) written by the writers of 2 ranks: DIR/step-00000001/.
static int make_sharded(const char *dir) {
    static const dt_tensor_info t[2] = {{"0.weight", 2, {3, 4}, 0, 12}, {"0.bias", 1, {3}, 12, 3}};
    float p[15], m1[15], m2[15];
    int64_t step = 1;
    for (int i = 0; i < 15; i++) p[i] = (float)i, m1[i] = m2[i] = 0.5f;
    dt_ckpt_model m = {t, 2, p, 15, 2, {m1, m2}, &step, "adamw", "[model]\n", NULL, 0};
    dt_train_state s = {1, 0, 1, 1, 2.5, {{1, 2, 3, 4}}, 2};
    dt_ckpt_writer *w[2] = {NULL, NULL};
    int ok = 1;
    for (int r = 0; r < 2; r++) ok = ok && dt_ckpt_writer_create(&w[r], dir, 2, &m, r, 2, 10) == DT_OK;
    for (int r = 0; r < 2; r++) ok = ok && dt_ckpt_writer_save(w[r], &s) == DT_OK;
    for (int r = 0; r < 2; r++) {
        if (w[r]) ok = ok && dt_ckpt_writer_wait(w[r]) == DT_OK;
        dt_ckpt_writer_free(w[r]);
    }
    return ok ? 0 : -1;
}

// Counts the files of dir whose name contains part.
static int count_files(const char *dir, const char *part) {
    char cmd[1024], out[64];
    snprintf(cmd, sizeof cmd, "ls -A '%s' | grep -c -- '%s'", dir, part);
    tl_run(cmd, out, sizeof out);
    return atoi(out);
}

static void test_weights_cli(void) {
    char args[2048];
    int ncases = 0;
    // Damaged sharded checkpoints: inspect and export exit 1 naming the
    // field, and leave nothing behind (no temp file, no output).
    const char *sd = tmp_path("sharded");
    CHECK(make_sharded(sd) == 0, "sharded checkpoint: %s", dt_last_error());
    char dir[600], ip[700];
    snprintf(dir, sizeof dir, "%s/step-00000001", sd);
    snprintf(ip, sizeof ip, "%s/index.json", dir);
    snprintf(args, sizeof args, "inspect %s", dir);
    cli(0, args, "sharded checkpoint, every shard verified", "checksum");
    const char *hdr = "{\"format\":\"dtrain-checkpoint-index\",\"format_version\":1,\"step\":1,\"world_size\":2,"
                      "\"optimizer\":\"adamw\",\"nstates\":2,";
    const char *sh = "\"shards\":[{\"file\":\"shard-00000-of-00002.safetensors\",\"begin\":0,\"end\":7},"
                     "{\"file\":\"shard-00001-of-00002.safetensors\",\"begin\":7,\"end\":%s}]}";
    struct {
        const char *what, *nparams, *shape, *end, *want;
    } cases[] = {
        {"no shards and no parameters", NULL, NULL, NULL, "\"nparams\" is 0"},
        {"a negative dimension", "15", "-3,4", "15", "shape[0]"},
        {"dimensions that wrap around", "15", "4294967296,4294967296", "15", "more elements than"},
        {"5e8 parameters", "500000000", "3,4", "500000000", "bytes"},
    };
    const char *tmpdir = tmp_path("tmpdir");
    tl_run((snprintf(args, sizeof args, "mkdir -p %s", tmpdir), args), NULL, 0);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char json[2048], shards[400];
        if (!cases[i].nparams) {
            snprintf(json, sizeof json, "%s\"nparams\":0,\"tensors\":[],\"shards\":[]}", hdr);
        } else {
            snprintf(shards, sizeof shards, sh, cases[i].end);
            snprintf(json, sizeof json,
                     "%s\"nparams\":%s,\"tensors\":[{\"name\":\"0.weight\",\"shape\":[%s],\"offset\":0},"
                     "{\"name\":\"0.bias\",\"shape\":[3],\"offset\":12}],%s",
                     hdr, cases[i].nparams, cases[i].shape, shards);
        }
        write_file(ip, json, strlen(json));
        const char *out = tmp_path("exported.safetensors");
        snprintf(args, sizeof args, "inspect %s", dir);
        ncases++, cli(1, args, "index.json", cases[i].want);
        // TMPDIR set for the command: the gathering used to leave its temp file there.
        char cmd[2048];
        snprintf(cmd, sizeof cmd, "TMPDIR=%s %s export %s -o %s", tmpdir, tl_dtrain(), dir, out);
        int rc = tl_run(cmd, g_out, sizeof g_out);
        ncases++;
        CHECK(rc == 1 && contains(g_out, cases[i].want), "export, index with %s: exit %d\n%s", cases[i].what, rc, g_out);
        CHECK(count_files(tmpdir, "") == 0 && count_files(g_tmp, "exported") == 0,
              "export, index with %s: no temp file or output left behind", cases[i].what);
    }
    // The sizes a GPT weights file claims, checked against its bytes: a
    // small file whose metadata describes a 39-billion-parameter model is
    // refused at once, by every reader, before anything is allocated.
    dt_gpt_config tiny = {2, 2, 16, 32, 256, 256}, big = {48, 64, 8192, 1024, 50257, 50304};
    size_t np = dt_gpt_config_num_params(&tiny);
    float *p = calloc(np, sizeof(float));
    const char *bigf = tmp_path("big-claim.safetensors");
    CHECK(p && dt_gpt_weights_save(bigf, &tiny, p) == DT_OK, "tiny GPT weights: %s", dt_last_error());
    dt_st_file *f;
    if (dt_st_open(&f, bigf) == DT_OK) {  // the same tensors under the big model's metadata
        char vals[6][16];
        dt_st_meta meta[7];
        int nm = dt_gpt_weights_meta(&big, vals, meta);
        dt_st_tensor t[16];
        for (int i = 0; i < dt_st_count(f); i++) t[i] = *dt_st_get(f, i);
        CHECK(dt_st_write(tmp_path("big-claim2.safetensors"), t, dt_st_count(f), meta, nm) == DT_OK, "write: %s",
              dt_last_error());
        dt_st_close(f);
    }
    free(p);
    bigf = tmp_path("big-claim2.safetensors");
    float *wp = NULL;
    dt_gpt_config got;
    double t0 = dt_now();
    EXPECT_ERR(dt_gpt_weights_load(bigf, &got, &wp), DT_ERR_FORMAT, bigf, "n_layer 48", "bytes of tensors");
    dt_gpt *m = NULL;
    CHECK(dt_gpt_create(&m, &tiny, 1, 8) == DT_OK, "tiny GPT: %s", dt_last_error());
    EXPECT_ERR(dt_gpt_load(m, bigf), DT_ERR_FORMAT, bigf, "bytes of tensors");
    dt_gpt_free(m);
    ncases += 2;
    CHECK(wp == NULL && dt_now() - t0 < 2, "refused at once (%.2f s), nothing allocated", dt_now() - t0);
    const char *bin = tmp_path("big-claim.bin");
    snprintf(args, sizeof args, "convert --from safetensors %s --to %s", bigf, bin);
    ncases++, cli(1, args, "n_layer 48", "bytes of tensors");
    CHECK(count_files(g_tmp, "big-claim.bin") == 0, "convert: no output or temp file left");
    snprintf(args, sizeof args, "sample configs/gpt-fortunes.ini --checkpoint %s", bigf);
    ncases++, cli(1, args, "n_layer 48", "bytes of tensors");

    // Text from a file reaches the terminal escaped: tensor names and
    // metadata in inspect, the quoted line in report.
    const char *evil = tmp_path("evil.safetensors");
    const char *J = "{\"__metadata__\":{\"format\":\"\\u001b]0;pwned\\u0007\"},"
                    "\"\\u001b[2J\\u001b[31mred\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}";
    write_st(evil, J, 4, 0);
    snprintf(args, sizeof args, "inspect %s", evil);
    ncases++, cli(0, args, "\\x1b[2J\\x1b[31mred", "\\x1b]0;pwned\\x07");
    CHECK(!has_control(g_out), "inspect prints no control characters from the file\n%s", g_out);
    const char *rd = tmp_path("evil-run");
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "mkdir -p %s/metrics && printf '\\033[2J\\033]0;pwned\\007 not json\\n' > %s/metrics/rank-00000.jsonl",
             rd, rd);
    CHECK(tl_run(cmd, g_out, sizeof g_out) == 0, "evil metrics log: %s", g_out);
    snprintf(args, sizeof args, "report %s", rd);
    ncases++, cli(1, args, "got '\\x1b[2J\\x1b]0;pwned\\x07 not json'", NULL);
    CHECK(!has_control(g_out), "report quotes the bad line escaped\n%s", g_out);
    // Error messages quote names from the file: escaped too.
    const char *evil2 = tmp_path("evil2.safetensors");
    write_st(evil2, "{\"\\u001b[2Jx\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, 0);
    snprintf(args, sizeof args, "inspect %s", evil2);
    ncases++, cli(1, args, "\\x1b[2Jx", "bad shape entry");
    CHECK(!has_control(g_out), "error messages print no control characters from the file\n%s", g_out);
    // ... and so do warnings: resume skips a damaged checkpoint whose
    // message quotes such a name.
    const char *rs = tmp_path("evil-resume");
    snprintf(cmd, sizeof cmd, "mkdir -p %s && cp %s %s/step-00000001.safetensors", rs, evil2, rs);
    CHECK(tl_run(cmd, g_out, sizeof g_out) == 0, "evil checkpoint dir: %s", g_out);
    snprintf(args, sizeof args, "train configs/fashion-mlp.ini --set data.dir=%s --set train.threads=1 -q --run-dir %s "
             "--resume %s", tmp_path("small"), tmp_path("evil-resume-run"), rs);
    ncases++, cli(1, args, "skipping damaged checkpoint", "\\x1b[2Jx");
    CHECK(!has_control(g_out), "warnings print no control characters from the file\n%s", g_out);
    printf("weights and checkpoints through the commands: %d cases\n", ncases);
}

int main(void) {
    snprintf(g_tmp, sizeof g_tmp, "%s/dtrain-badinput-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(g_tmp)) {
        perror("mkdtemp");
        return 1;
    }
    dt_set_threads(1);
    test_idx();
    test_config();
    test_safetensors();
    test_cli();
    test_escape();
    test_weights_cli();
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_tmp);
    if (!tl_failed && !getenv("KEEP")) tl_run(cmd, NULL, 0);
    else fprintf(stderr, "files kept in %s\n", g_tmp);
    for (int i = 0; i < g_npaths; i++) free(g_paths[i]);
    return tl_finish();
}
