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
 *   5. Memory: sizes for --memory-limit; batches that do not fit the limit,
 *      the machine or a memory cgroup are refused (exit 1) with the field and
 *      the bytes before anything is allocated or any worker starts; a batch
 *      larger than the data set needs no more memory than the data set.
 *   6. Numbers: one table of bad values (nan, inf, 1e999, hex, octal-looking,
 *      trailing junk, empty, negative, overflow, ...) against every numeric
 *      flag of every subcommand, every kind of config field (in a file and
 *      through --set), layer parameters and [model] input.
 *   7. Weights and checkpoints through the commands: sizes a file claims
 *      checked against its bytes before anything is allocated (GPT weights,
 *      a sharded index), damaged sharded checkpoints (no temp file left), a
 *      bit-flipped checkpoint given to eval, and text from files (tensor
 *      names, metadata, log lines) escaped before it reaches the terminal.
 *   8. HDF5 data (library and CLI): a missing or non-HDF5 file, missing
 *      datasets and groups, a group for a dataset, images and labels of
 *      the wrong type or shape, counts that differ, labels out of range;
 *      the message names the file and the dataset. [data] keys of the
 *      pipeline (file, augment, crop_pad, sampler) refused by name.
 *
 * Everything is written under a fresh temporary directory, removed at the
 * end unless a check failed or KEEP is set in the environment. CLI runs use
 * a 1000-sample copy of the data so that the whole test takes seconds. */
#include "dtrain/ckpt.h"
#include "dtrain/config.h"
#include "dtrain/data.h"
#include "dtrain/gpt.h"
#include "dtrain/nn.h"
#include "dtrain/optim.h"
#include "testlib.h"

#ifdef DTRAIN_HAVE_HDF5
#include <hdf5.h>
#endif
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

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

static size_t peak_rss(void) {
    struct rusage ru;
    return getrusage(RUSAGE_SELF, &ru) == 0 ? (size_t)ru.ru_maxrss * 1024 : 0;
}

static void test_idx(void) {
    dt_dataset ds;
    dt_idx idx;
    const uint32_t img_dims[] = {3, 2, 2}, lab_dims[] = {3}, lab4_dims[] = {4};
    const uint8_t labels_ok[] = {0, 9, 5}, labels_bad[] = {0, 10, 5};
    write_idx("img.idx", img_dims, 3, NULL, 0x08);
    write_idx("lab.idx", lab_dims, 1, labels_ok, 0x08);
    const char *img = tmp_path("img.idx"), *lab = tmp_path("lab.idx");

    // The valid pair loads (so the failures below are about what was broken).
    dt_status st = dt_dataset_load_idx(&ds, img, lab, 10, 0.0f, 1.0f, 1);
    CHECK(st == DT_OK && ds.n == 3 && ds.y[1] == 9, "valid tiny IDX pair: %s", dt_last_error());
    if (st == DT_OK) dt_dataset_free(&ds);

    const char *missing = tmp_path("no-such-images.gz");
    EXPECT_ERR(dt_dataset_load_idx(&ds, missing, lab, 10, 0.0f, 1.0f, 1), DT_ERR_IO, missing);
    EXPECT_ERR(dt_dataset_load_idx(&ds, img, missing, 10, 0.0f, 1.0f, 1), DT_ERR_IO, missing);
    uint8_t *buf;
    size_t len;
    EXPECT_ERR(dt_read_file_gz(missing, 0, &buf, &len), DT_ERR_IO, missing, "cannot open");
    CHECK(buf == NULL, "failed read leaves *buf NULL");
    EXPECT_ERR(dt_read_file_gz(g_tmp, 0, &buf, &len), DT_ERR_IO, g_tmp);  // a directory

    // A split's files are found as NAME.gz, else as NAME (plain).
    char fi[600], fl[600], want[700];
    const char *fdir = tmp_path("find");
    snprintf(fi, sizeof fi, "mkdir -p %s && touch %s/train-images-idx3-ubyte %s/train-labels-idx1-ubyte.gz "
             "%s/train-labels-idx1-ubyte", fdir, fdir, fdir, fdir);
    CHECK(tl_run(fi, NULL, 0) == 0, "set up %s", fdir);
    st = dt_idx_find_split(fdir, "train", fi, fl, sizeof fi);
    snprintf(want, sizeof want, "%s/train-images-idx3-ubyte", fdir);
    CHECK(st == DT_OK && !strcmp(fi, want), "plain images found: %s (%s)", fi, dt_last_error());
    snprintf(want, sizeof want, "%s/train-labels-idx1-ubyte.gz", fdir);
    CHECK(st == DT_OK && !strcmp(fl, want), ".gz labels preferred to the plain name: %s", fl);
    snprintf(want, sizeof want, "%s/t10k-images-idx3-ubyte.gz", fdir);
    EXPECT_ERR(dt_idx_find_split(fdir, "t10k", fi, fl, sizeof fi), DT_ERR_IO, want, "t10k-images-idx3-ubyte, plain");
    EXPECT_ERR(dt_idx_find_split(fdir, "train", fi, fl, 20), DT_ERR_ARG, "longer than");

    // A real .gz cut short, and one with flipped bytes in the deflate stream.
    size_t gzn;
    uint8_t *gz = read_all(FMNIST "/t10k-labels-idx1-ubyte.gz", &gzn);
    CHECK(gz != NULL && gzn > 1000, "read " FMNIST "/t10k-labels-idx1-ubyte.gz");
    if (gz) {
        const char *whole = tmp_path("whole-labels.gz"), *cut = tmp_path("cut-labels.gz"),
                   *bad = tmp_path("corrupt-labels.gz");
        write_file(whole, gz, gzn);
        st = dt_read_file_gz(whole, 0, &buf, &len);
        CHECK(st == DT_OK && len == 8 + 10000, "whole copy reads: %s", dt_last_error());
        if (st == DT_OK) free(buf);
        write_file(cut, gz, gzn / 2);
        EXPECT_ERR(dt_read_file_gz(cut, 0, &buf, &len), DT_ERR_FORMAT, cut, "truncated");
        EXPECT_ERR(dt_dataset_load_idx(&ds, img, cut, 10, 0.0f, 1.0f, 1), DT_ERR_FORMAT, cut);
        for (size_t i = 100; i < 200; i++) gz[i] ^= 0x5a;
        write_file(bad, gz, gzn);
        EXPECT_ERR(dt_read_file_gz(bad, 0, &buf, &len), DT_ERR_FORMAT, bad, "gzip");
        free(gz);
    }

    // Gzip bombs: a header announcing 3x2x2 bytes over 64 MiB of zeros is
    // stopped one byte past the claim; one announcing 4.7 GB before inflating.
    const char *bomb = tmp_path("bomb-idx.gz"), *claim = tmp_path("claim-idx.gz");
    const uint8_t hb[2][16] = {{0, 0, 8, 3, 0, 0, 0, 3, 0, 0, 0, 2, 0, 0, 0, 2},
                               {0, 0, 8, 3, 0, 0, 0xea, 0x60, 0, 0, 1, 0x18, 0, 0, 1, 0x18}};  // 60000x280x280
    for (int k = 0; k < 2; k++) {
        gzFile g = gzopen(k ? claim : bomb, "wb9");
        static uint8_t zeros[1 << 20];
        gzwrite(g, hb[k], 16);
        for (int i = 0; i < 64; i++) gzwrite(g, zeros, sizeof zeros);
        gzclose(g);
    }
    size_t rss0 = peak_rss();
    EXPECT_ERR(dt_idx_read(bomb, &buf, &idx), DT_ERR_FORMAT, bomb, "more than 29 bytes once uncompressed",
               "what its header announces");
    EXPECT_ERR(dt_dataset_load_idx(&ds, bomb, lab, 10, 0.0f, 1.0f, 1), DT_ERR_FORMAT, bomb, "header announces");
    EXPECT_ERR(dt_idx_read(claim, &buf, &idx), DT_ERR_FORMAT, claim, "more than 4 GiB");
    CHECK(peak_rss() < rss0 + (16 << 20), "the bombs were stopped before inflating (peak RSS %zu -> %zu)", rss0,
          peak_rss());

    // Wrong magic (a gzip header where the IDX magic belongs), element type
    // (0x0D = float), and header/data size mismatches.
    size_t n;
    uint8_t *b = make_idx(img_dims, 3, NULL, 0x08, &n);
    b[0] = 0x1f, b[1] = 0x8b;
    write_file(tmp_path("magic.idx"), b, n);
    EXPECT_ERR(dt_idx_parse(b, n, "magic.idx", &idx), DT_ERR_FORMAT, "magic.idx", "not an IDX file");
    EXPECT_ERR(dt_dataset_load_idx(&ds, tmp_path("magic.idx"), lab, 10, 0.0f, 1.0f, 1), DT_ERR_FORMAT,
               tmp_path("magic.idx"), "magic");
    b[0] = b[1] = 0;
    b[2] = 0x0D;
    write_file(tmp_path("type.idx"), b, n);
    EXPECT_ERR(dt_dataset_load_idx(&ds, tmp_path("type.idx"), lab, 10, 0.0f, 1.0f, 1), DT_ERR_FORMAT,
               tmp_path("type.idx"), "element type 0x0d");
    b[2] = 0x08;
    write_file(tmp_path("short.idx"), b, n - 1);
    EXPECT_ERR(dt_dataset_load_idx(&ds, tmp_path("short.idx"), lab, 10, 0.0f, 1.0f, 1), DT_ERR_FORMAT,
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
    EXPECT_ERR(dt_dataset_load_idx(&ds, tmp_path("flat.idx"), lab, 10, 0.0f, 1.0f, 1), DT_ERR_FORMAT,
               tmp_path("flat.idx"), "3-D");
    write_idx("lab4.idx", lab4_dims, 1, (const uint8_t[]){1, 2, 3, 4}, 0x08);
    EXPECT_ERR(dt_dataset_load_idx(&ds, img, tmp_path("lab4.idx"), 10, 0.0f, 1.0f, 1), DT_ERR_FORMAT,
               tmp_path("lab4.idx"), img, "4 labels", "3 images");
    write_idx("lab10.idx", lab_dims, 1, labels_bad, 0x08);
    EXPECT_ERR(dt_dataset_load_idx(&ds, img, tmp_path("lab10.idx"), 10, 0.0f, 1.0f, 1), DT_ERR_FORMAT,
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
    cfg_err(BASE "[train]\nbatch = 0\n", NULL, 0, "bad.ini:4:", "[train] batch", "from 1 to 1048576");
    cfg_err(BASE "[train]\nbatch = 2.5\n", NULL, 0, "bad.ini:4:", "[train] batch", "whole number");
    cfg_err(BASE "[optim]\nmomentum = 1.5\n", NULL, 0, "bad.ini:4:", "[optim] momentum", "from 0 to 0.999999");
    cfg_err(BASE "[train]\nmax_steps = 1e400\n", NULL, 0, "bad.ini:4:", "[train] max_steps", "number");
    cfg_err(BASE "[train]\nseed = 99999999999999999999999\n", NULL, 0, "bad.ini:4:", "[train] seed", NULL);
    cfg_err(BASE "[optim]\nlr = nan\n", NULL, 0, "bad.ini:4:", "[optim] lr", NULL);
    cfg_err(BASE "[data]\nshuffle = maybe\n", NULL, 0, "bad.ini:4:", "[data] shuffle", "true or false");
    cfg_err(BASE "[optim]\nname = adam\n", NULL, 0, "bad.ini:4:", "[optim] name", "sgd, adamw");
    cfg_err("[model]\nlayer = conv2d out=32 kernel=-5\n", NULL, 0, "bad.ini:2: [model] layer: kernel", "'-5'", NULL);
    cfg_err("[model]\nlayer = linear\n", NULL, 0, "bad.ini:2:", "[model] layer", "out=N");
    cfg_err("[model]\nlayer = transformer out=3\n", NULL, 0, "bad.ini:2:", "[model] layer", "unknown layer");
    cfg_err("[model]\nlayer = relu size=3\n", NULL, 0, "bad.ini:2:", "[model] layer", "takes no parameter");
    cfg_err("[model]\nlayer = dropout p=1.5\n", NULL, 0, "bad.ini:2:", "[model] layer", "'1.5'");
    cfg_err("[model]\nlayer = dropout p=1\n", NULL, 0, "bad.ini:2:", "[model] layer", "probability");
    cfg_err("[model]\ninput = 1x28x28x\npreset = mlp\n", NULL, 0, "bad.ini:2:", "[model] input", NULL);
    cfg_err("[model]\ninput = 4096x4096x4096\npreset = mlp\n", NULL, 0, "bad.ini:2:", "[model] input", NULL);
    cfg_err("[model]\npreset = resnet\n", NULL, 0, "bad.ini", "preset", "mlp, cnn or resnet18");
    cfg_err("[model]\npreset = resnet34\n", NULL, 0, "bad.ini", "'resnet34'", "mlp, cnn or resnet18");
    cfg_err("[model]\npreset = mlp\nwidth = 16\n", NULL, 0, "bad.ini", "[model] width", "only preset = resnet18");
    // batch norm where a strategy cannot take it yet: refused by name
    cfg_err("[model]\npreset = resnet18\n[parallel]\ntensor = 2\n", NULL, 0, "layer 1 (batchnorm)",
            "batch norm cannot be used with [parallel] tensor", NULL);
    cfg_err("[model]\npreset = resnet18\n[parallel]\npipeline = 2\n", NULL, 0, "layer 1 (batchnorm)", "pipeline parallel", NULL);
    cfg_err("[model]\nlayer = block out=4\nlayer = avgpool\nlayer = linear out=10\n[parallel]\ndeterministic = true\n", NULL, 0,
            "layer 0 (block)", "[parallel] deterministic = true without [model] sync_bn = true", NULL);
    cfg_err("[model]\npreset = resnet18\nsync_bn = true\n[train]\ndevice = cuda\n", NULL, 0, "batchnorm", "device = cuda", NULL);
    cfg_err("[model]\nlayer = batchnorm momentum=2\nlayer = linear out=3\n", NULL, 0, "[model] layer: momentum", "from 0 to 1", NULL);
    cfg_err("[model]\nlayer = conv2d out=4 kernel=3 bias=maybe\n", NULL, 0, "[model] layer", "true or false", NULL);
    cfg_err("[model]\nlayer = block stride=2\n", NULL, 0, "[model] layer", "block needs out=N", NULL);
    cfg_err("[model]\nlayer = avgpool out=3\n", NULL, 0, "[model] layer", "takes no parameter", NULL);
    cfg_err("[model]\npreset = cnn\nlayer = relu\n", NULL, 0, "bad.ini", "preset", "not both");
    cfg_err("[model\npreset = mlp\n", NULL, 0, "bad.ini:1:", "syntax error", NULL);
    cfg_err(BASE "[train]\nbatch\n", NULL, 0, "bad.ini:4:", "syntax error", NULL);
    cfg_err("lr = 0.1\n" BASE, NULL, 0, "bad.ini:1:", "lr", "before any [section]");
    cfg_err("", NULL, 0, "bad.ini", "no layers", NULL);
    cfg_err(BASE "[train]\nepochs = 0\n", NULL, 0, "bad.ini", "epochs", "max_steps");

    // A key given twice in a file names both lines; --set still overrides.
    cfg_err(BASE "[train]\nbatch = 3\nbatch = 4\n", NULL, 0, "bad.ini:5: [train] batch", "first on line 4", NULL);
    cfg_err(BASE "[train]\nbatch = 3\n[optim]\nlr = 0.1\n[train]\nbatch = 3\n", NULL, 0, "bad.ini:8: [train] batch",
            "first on line 4", NULL);
    cfg_err("[model]\npreset = mlp\npreset = cnn\n", NULL, 0, "bad.ini:3: [model] preset", "first on line 2", NULL);
    cfg_err("[model]\ninput = 784\ninput = 784\npreset = mlp\n", NULL, 0, "bad.ini:3: [model] input",
            "first on line 2", NULL);
    cfg_err("[run]\nname = a\n" BASE "[run]\nname = b\n", NULL, 0, "bad.ini:6: [run] name", "first on line 2", NULL);
    const char *s_batch[] = {"train.batch=8", "train.batch=16"};
    CHECK(dt_config_parse(&c, BASE "[train]\nbatch = 4\n", "ok.ini", s_batch, 2) == DT_OK && c.batch == 16,
          "--set overrides a file's key, the last --set wins (batch %d): %s", c.batch, dt_last_error());

    // Layer lines: "name=value" with a name, each parameter once.
    cfg_err("[model]\nlayer = relu =5\n", NULL, 0, "bad.ini:2: [model] layer", "'=5': expected name=value", NULL);
    cfg_err("[model]\nlayer = linear =5 out=3\n", NULL, 0, "bad.ini:2: [model] layer", "expected name=value", NULL);
    cfg_err("[model]\nlayer = linear out=3 out=4\n", NULL, 0, "bad.ini:2: [model] layer", "'out' given twice", NULL);
    cfg_err("[model]\nlayer = linear out==3\n", NULL, 0, "bad.ini:2: [model] layer", "'=3'", NULL);

    // The run name is one safe path component: it names runs/NAME-TIME.
    const char *bad_names[] = {"../../x", "..", ".", ".hidden", "a/b", "/abs", "x y", "a\\b", "ä", "*", "$HOME"};
    for (size_t i = 0; i < sizeof bad_names / sizeof *bad_names; i++) {
        char t[200], set[100];
        snprintf(t, sizeof t, "[run]\nname = %s\n" BASE, bad_names[i]);
        cfg_err(t, NULL, 0, "bad.ini:2: [run] name", bad_names[i], "under runs/");
        snprintf(set, sizeof set, "run.name=%s", bad_names[i]);
        const char *sets[] = {set};
        cfg_err(BASE, sets, 1, "--set: [run] name", "under runs/", NULL);
    }
    CHECK(dt_config_parse(&c, "[run]\nname = my-run_1.2\n" BASE, "ok.ini", NULL, 0) == DT_OK &&
              !strcmp(c.name, "my-run_1.2"), "a plain run name is kept: %s", dt_last_error());
    // A default name from an odd file name is made safe, and reads back.
    CHECK(dt_config_parse(&c, BASE, "dir/we ird$.v2.ini", NULL, 0) == DT_OK && !strcmp(c.name, "we_ird_"),
          "stem 'we ird$' becomes 'we_ird_', got '%s'", c.name);
    CHECK(dt_config_parse(&c, BASE, "dir/.ini", NULL, 0) == DT_OK && !strcmp(c.name, "run"),
          "stem '' becomes 'run', got '%s'", c.name);
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
        if (dt_read_file_gz(src[k], 0, &buf, &len) != DT_OK) return -1;
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
    // Near misses get a suggestion: an option, a config key given as one, a
    // config key; a bad --precision names itself.
    cli(2, "train --worker 2 configs/fashion-mlp.ini", "unknown option '--worker'", "did you mean '--workers'?");
    cli(2, "train --epochs 2 configs/fashion-mlp.ini", "unknown option '--epochs'", "did you mean '--set train.epochs=...'?");
    cli(2, "train configs/fashion-mlp.ini --set train.epoch=2", "[train] epoch: unknown key", "did you mean 'epochs'?");
    cli(2, "train configs/fashion-mlp.ini --precision fp8", "--precision: expected fp32, bf16 or fp16, got 'fp8'", NULL);
    cli(0, "train --help", "[--zero N] [--precision P] [--device D] [--memory-limit SIZE]", NULL);
    cli(2, "eval configs/fashion-mlp.ini --run-dir x", "unknown option", NULL);
    cli(2, "train", "missing CONFIG", NULL);
    cli(2, "train a.ini b.ini", "unexpected argument", NULL);
    cli(2, "train configs/fashion-mlp.ini --set", "--set needs", NULL);
    cli(2, "eval configs/fashion-mlp.ini", "--checkpoint", NULL);
    cli(0, "--help", "usage", "train");
    cli(0, "train --help", "usage: dtrain train", NULL);
    cli(0, "eval --help", "usage: dtrain eval", NULL);
    cli(0, "--version", "dtrain 0.", NULL);

    // A config file that is not there: a usage error (2); a bad one: exit 1,
    // the path (and line) named.
    snprintf(args, sizeof args, "train %s", tmp_path("nope.ini"));
    cli(2, args, tmp_path("nope.ini"), "no such config file");
    // A GPT's missing token file: how to make one.
    const char *notok = tmp_path("no-tokens.ini");
    const char ntext[] = "[model]\npreset = gpt-tiny\n[data]\ndataset = tokens\ntrain_file = /nonexistent/tok.bin\n"
                         "[train]\nmax_steps = 2\n";
    write_file(notok, ntext, sizeof ntext - 1);
    snprintf(args, sizeof args, "train %s --run-dir %s", notok, tmp_path("run-notok"));
    cli(1, args, "[data] train_file: /nonexistent/tok.bin", "dtrain prepare-text");
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

    // IDX files are found as NAME.gz or NAME: a copy of the small set under
    // the plain names trains; a directory with neither names both.
    const char *plain = tmp_path("plain");
    snprintf(cmd, sizeof cmd, "mkdir -p %s && for f in %s/*.gz; do b=$(basename $f .gz); cp $f %s/$b; done", plain,
             small, plain);
    CHECK(tl_run(cmd, g_out, sizeof g_out) == 0, "set up %s: %s", plain, g_out);
    snprintf(args, sizeof args, "train configs/fashion-mlp.ini --set data.dir=%s --set train.max_steps=2 %s --run-dir %s",
             plain, Q, tmp_path("run-plain"));
    cli(0, args, NULL, NULL);
    snprintf(args, sizeof args, "train configs/fashion-mlp.ini --set data.dir=%s %s --workers 4 --run-dir %s",
             tmp_path("nodata"), Q, tmp_path("run-nodata"));
    snprintf(want, sizeof want, "%s/train-images-idx3-ubyte.gz", tmp_path("nodata"));
    cli(1, args, want, "train-images-idx3-ubyte, plain");

    // Worker counts are checked against the config before any starts.
    const char *wdir = tmp_path("run-workers");
    snprintf(args, sizeof args, "train configs/fashion-mlp.ini --workers 1000 --run-dir %s", wdir);
    cli(2, args, "--workers 1000", "[train] batch 256 is smaller than the 1000 workers");
    snprintf(args, sizeof args, "train configs/fashion-mlp.ini --workers 5 --deterministic --run-dir %s", wdir);
    cli(2, args, "--workers 5", "micro_shards (12)");
    snprintf(args, sizeof args, "train configs/fashion-mlp.ini --workers 2:5 --deterministic --run-dir %s", wdir);
    cli(2, args, "--workers 5", "micro_shards (12)");
    // Offload to disk: the directory must be named, exist, be one and be writable.
    snprintf(args, sizeof args, "train configs/fashion-mlp.ini --workers 2 --zero 1 --set parallel.offload=disk --run-dir %s", wdir);
    cli(2, args, "[parallel] offload = disk needs [parallel] offload_dir", NULL);
    snprintf(args, sizeof args, "train configs/fashion-mlp.ini --workers 2 --set parallel.offload=disk "
             "--set parallel.offload_dir=%s/no-such-dir --run-dir %s", g_tmp, wdir);
    cli(2, args, "[parallel] offload_dir", "no-such-dir: No such file or directory");
    snprintf(args, sizeof args, "train configs/fashion-mlp.ini --workers 2 --set parallel.offload=disk "
             "--set parallel.offload_dir=configs/fashion-mlp.ini --run-dir %s", wdir);
    cli(2, args, "[parallel] offload_dir configs/fashion-mlp.ini", "not a directory");
    snprintf(args, sizeof args, "train configs/fashion-mlp.ini --workers 2 --set parallel.offload=disk "
             "--set parallel.offload_dir=/proc --run-dir %s", wdir);
    cli(2, args, "[parallel] offload_dir /proc", "not writable");
    snprintf(args, sizeof args, "train configs/fashion-mlp.ini --workers 8 --set train.batch=4 --run-dir %s", wdir);
    cli(2, args, "--workers 8", "batch 4");
    snprintf(cmd, sizeof cmd, "test -e %s", wdir);
    CHECK(tl_run(cmd, NULL, 0) != 0, "no worker started: %s does not exist", wdir);
    // No room on the run directory's file system for the checkpoints it
    // would keep: refused before anything trains, naming the bytes.
    snprintf(cmd, sizeof cmd, "%s prepare-text README.md -o %s/disk-tok", tl_dtrain(), g_tmp);
    CHECK(tl_run(cmd, NULL, 0) == 0, "prepare-text README.md");
    snprintf(args, sizeof args, "train configs/gpt-fortunes.ini --set checkpoint.keep=1000000 --set checkpoint.every_steps=1 "
             "--set train.max_steps=100000000 --set data.train_file=%s/disk-tok_train.bin "
             "--set data.val_file=%s/disk-tok_val.bin --run-dir %s-disk", g_tmp, g_tmp, wdir);
    cli(1, args, "not enough disk for the run directory", "keep = 1000000");

    // --resume PATH: a path that is missing, or holds no checkpoint, is an
    // error; only auto may find nothing.
    const char *nockpt = tmp_path("no-checkpoints");
    snprintf(args, sizeof args, "train configs/fashion-mlp.ini --set data.dir=%s %s --resume %s --run-dir %s",
             small, Q, tmp_path("missing-ckpt"), tmp_path("run-resume"));
    cli(1, args, "[checkpoint] resume", tmp_path("missing-ckpt"));
    snprintf(args, sizeof args, "train configs/fashion-mlp.ini --set data.dir=%s %s --set checkpoint.resume=%s "
             "--workers 2 --run-dir %s", small, Q, tmp_path("missing-ckpt"), tmp_path("run-resume"));
    cli(1, args, "[checkpoint] resume", tmp_path("missing-ckpt"));
    snprintf(cmd, sizeof cmd, "mkdir -p %s", nockpt);
    tl_run(cmd, NULL, 0);
    snprintf(args, sizeof args, "train configs/fashion-mlp.ini --set data.dir=%s --set train.max_steps=2 %s "
             "--resume %s --run-dir %s", small, Q, nockpt, tmp_path("run-resume"));
    cli(1, args, "no checkpoint at", nockpt);
    snprintf(args, sizeof args, "train configs/fashion-mlp.ini --set data.dir=%s --set train.max_steps=2 %s "
             "--resume auto --run-dir %s", small, Q, tmp_path("run-resume-auto"));
    cli(0, args, NULL, NULL);

    // A run name that would leave runs/.
    const char *escape = tmp_path("escape.ini");
    const char esc[] = "[run]\nname = ../../x\n[model]\npreset = mlp\n";
    write_file(escape, esc, sizeof esc - 1);
    snprintf(args, sizeof args, "train %s", escape);
    snprintf(want, sizeof want, "%s:2: [run] name", escape);
    cli(1, args, want, "'../../x'");

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
// 5. memory

// Runs `dtrain ARGS` inside a new memory cgroup limited to `limit` bytes
// (v2, else v1). Returns the exit code, or -2 when no cgroup can be made
// here (not root, no memory controller).
static int cli_in_cgroup(const char *args, const char *limit) {
    char cg[256], cmd[4096];
    const char *v2 = "/sys/fs/cgroup", *v1 = "/sys/fs/cgroup/memory";
    int rc = -2;
    for (int k = 0; k < 2 && rc == -2; k++) {
        snprintf(cg, sizeof cg, "%s/dtrain-test-%d", k ? v1 : v2, (int)getpid());
        // (A real cgroup directory comes with its files: cgroup.procs.)
        snprintf(cmd, sizeof cmd, "mkdir %s 2>/dev/null && test -f %s/cgroup.procs && echo %s > %s/%s 2>/dev/null", cg,
                 cg, limit, cg, k ? "memory.limit_in_bytes" : "memory.max");
        if (tl_run(cmd, NULL, 0) != 0) {
            snprintf(cmd, sizeof cmd, "rmdir %s 2>/dev/null", cg);
            tl_run(cmd, NULL, 0);
            continue;
        }
        snprintf(cmd, sizeof cmd, "sh -c 'echo $$ > %s/cgroup.procs && exec %s %s'", cg, tl_dtrain(), args);
        rc = tl_run(cmd, g_out, sizeof g_out);
        snprintf(cmd, sizeof cmd, "rmdir %s", cg);
        tl_run(cmd, NULL, 0);
    }
    return rc;
}

static void test_memory(void) {
    size_t b = 0;
    struct { const char *s; size_t want; } ok[] = {{"2G", (size_t)2 << 30}, {"512M", (size_t)512 << 20},
                                                  {"1.5G", (size_t)3 << 29}, {"4096", 4096}, {"1KiB", 1024},
                                                  {"64kb", 65536}, {"1T", (size_t)1 << 40}};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
        CHECK(dt_mem_parse_size(ok[i].s, &b) == DT_OK && b == ok[i].want, "size '%s' = %zu, got %zu", ok[i].s,
              ok[i].want, b);
    const char *bad[] = {"", "0", "-1G", "2X", "G", "1.5", "nan", "inf", "2G2", "99999999T",
                         "0x40000000", "010M", "0x1p30", "00", "1e", "infinity", " 1G"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECK(dt_mem_parse_size(bad[i], &b) == DT_ERR_ARG, "size '%s' refused", bad[i]);
    const char *src = NULL;
    CHECK(dt_mem_available(&src) > 0 && src && *src, "available memory has a source: %s", src ? src : "(null)");
    char fb[64];
    CHECK(!strcmp(dt_mem_format(3 << 29, fb, sizeof fb), "1.50 GiB (1610612736 bytes)"), "format: %s", fb);

    // The model's estimate: grows with the batch, parameters do not.
    dt_config c;
    const char *sets[] = {"train.threads=1"};
    if (dt_config_load(&c, "configs/fashion-cnn.ini", sets, 1) == DT_OK) {
        size_t np1, np2, a1, a2;
        CHECK(dt_model_memory(c.input, c.layers, c.nlayers, 10, &np1, &a1) == DT_OK &&
                  dt_model_memory(c.input, c.layers, c.nlayers, 20, &np2, &a2) == DT_OK && np1 == np2 && np1 > 0 &&
                  a2 > a1 && a2 <= 2 * a1 + 4096,
              "dt_model_memory: %zu params, %zu bytes for 10, %zu for 20", np1, a1, a2);
    }

    char args[2048], want[256];
    const char *small = tmp_path("small");  // test_cli's 1000 samples
    const char *Q = "--set train.threads=1 -q --set train.max_steps=2";
    cli(2, "train configs/fashion-mlp.ini --memory-limit", "--memory-limit needs a size", NULL);
    cli(2, "train configs/fashion-mlp.ini --memory-limit 2X", "--memory-limit needs a size", "'2X'");
    cli(2, "eval configs/fashion-mlp.ini --checkpoint x --memory-limit=0", "--memory-limit needs a size", NULL);
    cli(0, "train --help", "--memory-limit SIZE", NULL);
    cli(0, "eval --help", "--memory-limit SIZE", NULL);

    // eval_batch 2^20 over 1000 test samples: activations for 1000 rows, so
    // a 1 GiB limit is plenty for the MLP ...
    snprintf(args, sizeof args, "train configs/fashion-mlp.ini --set data.dir=%s --set train.eval_batch=1048576 %s "
             "--memory-limit 1G --run-dir %s", small, Q, tmp_path("run-mem-ok"));
    cli(0, args, NULL, NULL);
    // ... but not the CNN under 64 MiB: refused naming the field, the bytes
    // and the limit.
    snprintf(args, sizeof args, "train configs/fashion-cnn.ini --set data.dir=%s --set train.eval_batch=1048576 %s "
             "--memory-limit 64M --run-dir %s", small, Q, tmp_path("run-mem-cnn"));
    cli(1, args, "train.eval_batch = 1048576 needs", "bytes) of activations for 1000 samples");
    CHECK(contains(g_out, "--memory-limit 64M") && contains(g_out, "67108864 bytes"), "limit named: %s", g_out);
    // The training batch, when it weighs most.
    snprintf(args, sizeof args, "train configs/fashion-cnn.ini --set data.dir=%s --set train.batch=1000 "
             "--set train.eval_batch=10 %s --memory-limit 64M --run-dir %s", small, Q, tmp_path("run-mem-cnn"));
    cli(1, args, "train.batch = 1000 needs", "bytes");
    // --workers 2: each worker has the limit; refused before any worker starts (no run directory).
    const char *wdir = tmp_path("run-mem-workers");
    snprintf(args, sizeof args, "train configs/fashion-cnn.ini --set data.dir=%s --set train.eval_batch=1048576 %s "
             "--memory-limit 64M --workers 2 --run-dir %s", small, Q, wdir);
    cli(1, args, "(--memory-limit 64M, each worker)", "train.eval_batch");
    snprintf(want, sizeof want, "%s/config.ini", wdir);
    CHECK(access(want, F_OK) != 0, "no worker started: %s does not exist", want);
    // Two workers that fit under the limit run, each capped at it.
    snprintf(args, sizeof args, "train configs/fashion-mlp.ini --set data.dir=%s --set train.eval_batch=100 %s "
             "--memory-limit 2G --workers 2 --run-dir %s", small, Q, tmp_path("run-mem-w2"));
    cli(0, args, NULL, NULL);
    // eval: the same check.
    snprintf(args, sizeof args, "eval configs/fashion-cnn.ini --checkpoint %s/model.safetensors --set data.dir=%s "
             "--set train.eval_batch=1048576 --memory-limit 16M", tmp_path("run-mem-ok"), small);
    cli(1, args, "train.eval_batch", "bytes");
}

// The parts that depend on the machine, each run alone (ctest
// test_badinput_memory-machine and _memory-cgroup) and reported skipped
// where it cannot run.
static const char *const QM = "--set train.threads=1 -q --set train.max_steps=2";

// Without a flag the machine's own memory decides: a 2^20 batch of the
// CNN on the full training set (60000 rows) needs some 43 GiB.
static void test_memory_machine(void) {
    char args[2048];
    if (dt_mem_available(NULL) >= ((size_t)42 << 30)) {
        tl_skip("the run over the machine's memory: more than 42 GiB available");
        return;
    }
    snprintf(args, sizeof args, "train configs/fashion-cnn.ini --set train.batch=1048576 %s --run-dir %s", QM,
             tmp_path("run-mem-big"));
    cli(1, args, "train.batch = 1048576 needs", "of activations for 60000 samples");
    CHECK(contains(g_out, "is available (") && contains(g_out, "bytes"), "machine's memory named: %s", g_out);
}

// Under a memory cgroup of 256 MiB (where one can be made).
static void test_memory_cgroup(void) {
    char args[2048];
    const char *small = tmp_path("small");
    CHECK(make_small_data(small, 1000) == 0, "small data set in %s: %s", small, dt_last_error());
    snprintf(args, sizeof args, "train configs/fashion-cnn.ini --set data.dir=%s --set train.eval_batch=1048576 %s "
             "--run-dir %s", small, QM, tmp_path("run-mem-cg"));
    int rc = cli_in_cgroup(args, "268435456");
    if (rc == -2) {
        tl_skip("the memory cgroup run: cannot create a cgroup here");
        return;
    }
    CHECK(rc == 1 && contains(g_out, "train.eval_batch") && contains(g_out, "memory cgroup") && contains(g_out, "bytes"),
          "refused under a 256 MiB memory cgroup: exit %d\n%s", rc, g_out);
}

// ---------------------------------------------------------------------------
// 6. numbers: every numeric flag and config field against one table

// Values no number in dtrain accepts (every range there is within
// [-1e6, 1.9e19], and none takes a negative value except [data] mean).
// blank: has surrounding blanks, which an INI file trims (so not for files).
static const struct {
    const char *text;
    int blank;
} bad_numbers[] = {
    {"nan", 0}, {"NaN", 0}, {"-nan", 0}, {"nan(1)", 0}, {"inf", 0}, {"-inf", 0}, {"+inf", 0}, {"Infinity", 0},
    {"1e999", 0}, {"-1e999", 0}, {"1e-400", 0}, {"0x40", 0}, {"0X10", 0}, {"0x1p3", 0}, {"0b101", 0},
    {"010", 0}, {"007", 0}, {"00", 0}, {"12abc", 0}, {"3 4", 0}, {"1,5", 0}, {"1.5.2", 0}, {"1_000", 0},
    {"1e", 0}, {"e5", 0}, {".", 0}, {"+", 0}, {"-", 0}, {"--1", 0}, {"", 0}, {" 1", 1}, {"1 ", 1},
    {"-5", 0}, {"-1", 0}, {"99999999999999999999", 0}, {"18446744073709551616", 0}, {"1e20", 0},
};
#define NBAD (int)(sizeof bad_numbers / sizeof bad_numbers[0])
static int g_number_cases;

// A config in a file and through --set, for each bad value of field.
static void number_field(const char *sec, const char *key, const char *extra_bad) {
    for (int i = -1; i < NBAD; i++) {
        const char *v = i < 0 ? extra_bad : bad_numbers[i].text;
        if (!v) continue;
        char text[300], set[200], where[100];
        snprintf(where, sizeof where, "[%s] %s", sec, key);
        if (i < 0 || !bad_numbers[i].blank) {
            snprintf(text, sizeof text, BASE "[%s]\n%s = %s\n", sec, key, v);
            cfg_err(text, NULL, 0, "bad.ini:4: ", where, *v ? NULL : "got nothing");
            g_number_cases++;
        }
        snprintf(set, sizeof set, "%s.%s=%s", sec, key, v);
        const char *sets[] = {set};
        cfg_err(BASE, sets, 1, "--set: ", where, *v ? NULL : "got nothing");
        g_number_cases++;
    }
}

static void test_number_config(void) {
    number_field("train", "batch", "2.5");              // int
    number_field("train", "max_steps", "1.5");          // int64
    number_field("train", "seed", "0.5");               // uint64, exact
    number_field("optim", "lr", "0");                   // float, positive
    number_field("checkpoint", "every_seconds", NULL);  // float from 0
    number_field("obs", "metrics_port", "65536");       // int, upper bound
    number_field("parallel", "zero", "4");              // a stage out of range
    // Layer parameters and [model] input, in files.
    const char *layers[] = {"linear out=%s", "dropout p=%s", "conv2d out=3 kernel=%s", "layernorm eps=%s"};
    for (int l = 0; l < 4; l++)
        for (int i = 0; i < NBAD; i++) {
            if (bad_numbers[i].blank || strchr(bad_numbers[i].text, ' ')) continue;  // a blank ends the parameter
            char layer[100], text[200];
            snprintf(layer, sizeof layer, layers[l], bad_numbers[i].text);
            snprintf(text, sizeof text, "[model]\ninput = 784\nlayer = %s\n", layer);
            cfg_err(text, NULL, 0, "bad.ini:3: [model] layer", NULL, NULL);
            snprintf(text, sizeof text, "[model]\ninput = %s\npreset = mlp\n", bad_numbers[i].text);
            if (l == 0) cfg_err(text, NULL, 0, "bad.ini:2: [model] input", NULL, NULL), g_number_cases++;
            g_number_cases++;
        }
    cfg_err("[model]\ninput = 1x010x28\npreset = mlp\n", NULL, 0, "bad.ini:2: [model] input", "1x010x28", NULL);
    // Good spellings still read.
    dt_config c;
    const char *good[] = {"optim.lr=1e-3", "train.batch=1e2", "data.mean=-0.5", "optim.momentum=.9",
                          "train.max_steps=+7", "optim.weight_decay=0", "optim.clip_norm=5."};
    CHECK(dt_config_parse(&c, BASE, "ok.ini", good, 7) == DT_OK && c.batch == 100 && c.max_steps == 7 &&
              c.optim.lr == 1e-3f && c.optim.momentum == 0.9f && c.mean == -0.5f && c.optim.clip_norm == 5.0f,
          "decimal spellings read: %s", dt_last_error());
    // The parser itself: what it names, and the u64 edge.
    double x;
    uint64_t u;
    EXPECT_ERR(dt_parse_number("--flag", "0x40", 0, 100, 1, &x), DT_ERR_CONFIG, "--flag: ", "'0x40'", "decimal");
    EXPECT_ERR(dt_parse_number("--flag", "010", 0, 100, 1, &x), DT_ERR_CONFIG, "'010'", "leading zeros");
    EXPECT_ERR(dt_parse_number("--flag", NULL, 0, 100, 1, &x), DT_ERR_CONFIG, "--flag: ", "got nothing");
    EXPECT_ERR(dt_parse_u64("--seed", "18446744073709551616", UINT64_MAX, &u), DT_ERR_CONFIG, "--seed: ", "whole");
    CHECK(dt_parse_u64("s", "18446744073709551615", UINT64_MAX, &u) == DT_OK && u == UINT64_MAX,
          "2^64-1 reads exactly: %s", dt_last_error());
    CHECK(dt_parse_number("s", "0", 0, 0, 1, &x) == DT_OK && x == 0 && dt_parse_number("s", "-0.0", 0, 1, 0, &x) == DT_OK,
          "0 and -0.0 read: %s", dt_last_error());
    g_number_cases += 7;
}

// The numeric flags of every subcommand. fmt makes the value from the bad
// text (--workers MIN:MAX has two numbers); low is below the flag's range
// (NULL: the table's negatives are); good is accepted (checked with --help).
static const struct {
    const char *cmd, *flag, *fmt;
    int whole;
    const char *low, *good;
} num_flags[] = {
    {"train configs/fashion-mlp.ini", "--checkpoint-every", "%s", 1, "0", "5"},
    {"train configs/fashion-mlp.ini", "--checkpoint-seconds", "%s", 0, "0", "1.5"},
    {"train configs/fashion-mlp.ini", "--keep", "%s", 1, "0", "2"},
    {"train configs/fashion-mlp.ini", "--metrics-port", "%s", 1, "0", "9100"},
    {"train configs/fashion-mlp.ini", "--max-restarts", "%s", 1, NULL, "3"},
    {"train configs/fashion-mlp.ini", "--heartbeat-timeout", "%s", 0, NULL, "0.5"},
    {"train configs/fashion-mlp.ini", "--elastic-retry", "%s", 0, "0", "5"},
    {"train configs/fashion-mlp.ini", "--workers", "%s", 1, "0", "2"},
    {"train configs/fashion-mlp.ini", "--workers", "%s:4", 1, "0", "1:4"},
    {"train configs/fashion-mlp.ini", "--workers", "1:%s", 1, "0", "2:2"},
    {"train configs/fashion-mlp.ini", "--zero", "%s", 1, "-1", "2"},
    {"train configs/fashion-mlp.ini", "--zero", "%s", 1, "4", "1"},
    {"run", "-n", "%s", 1, "0", "2"},
    {"run", "--nranks", "%s", 1, "0", "4096"},
    {"run", "--timeout", "%s", 0, "0", "0.5"},
    {"run", "--grace", "%s", 0, NULL, "0"},
    {"sample x.ini", "-n", "%s", 1, NULL, "10"},
    {"sample x.ini", "--temperature", "%s", 0, NULL, "0.7"},
    {"sample x.ini", "--top-k", "%s", 1, NULL, "40"},
    {"sample x.ini", "--seed", "%s", 1, NULL, "18446744073709551615"},
    {"prepare-text x", "--val-fraction", "%s", 0, "0", "0.2"},
};

static void test_number_flags(void) {
    char args[600], val[100], want[200];
    for (size_t f = 0; f < sizeof num_flags / sizeof *num_flags; f++) {
        const char *flag = num_flags[f].flag;
        snprintf(args, sizeof args, "%s %s %s --help", num_flags[f].cmd, flag, num_flags[f].good);
        cli(0, args, "usage", NULL);
        snprintf(args, sizeof args, "%s %s", num_flags[f].cmd, flag);  // no value
        cli(2, args, flag, NULL);
        g_number_cases += 2;
        for (int i = -2; i < NBAD; i++) {
            const char *b = i == -2 ? num_flags[f].low : i == -1 ? (num_flags[f].whole ? "1.5" : NULL)
                                                                  : bad_numbers[i].text;
            if (!b) continue;
            snprintf(val, sizeof val, num_flags[f].fmt, b);
            snprintf(args, sizeof args, "%s %s '%s'", num_flags[f].cmd, flag, val);
            snprintf(want, sizeof want, "'%s'", b);
            cli(2, args, flag, *b ? want : NULL);
            g_number_cases++;
        }
    }
    // A flag's number is read whole after '=' too.
    cli(2, "train configs/fashion-mlp.ini --keep=0x10", "--keep", "'0x10'");
    cli(2, "train configs/fashion-mlp.ini --workers 3:2", "--workers 3:2", "expected MIN:MAX with MIN <= MAX");
    cli(2, "train configs/fashion-mlp.ini --set train.batch=0x40", "--set: [train] batch", "'0x40'");
    cli(2, "train configs/fashion-mlp.ini --set optim.lr=nan", "--set: [optim] lr", "'nan'");
    g_number_cases += 4;
    printf("numbers: %d bad-value cases (%d values x %zu flags, config fields, layers)\n", g_number_cases, NBAD,
           sizeof num_flags / sizeof *num_flags);
}

// ---------------------------------------------------------------------------
// 7. weights and checkpoints through the commands

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
    dt_ckpt_model m = {.tensors = t, .ntensors = 2, .params = p, .nparams = 15, .nstates = 2,
                       .states = {m1, m2}, .opt_step = &step, .optimizer = "adamw", .config = "[model]\n"};
    dt_train_state s = {1, 0, 1, 1, 2.5, {{1, 2, 3, 4}}, 2, 0, 0, 0};
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
        {"5e8 parameters", "500000000", "499999997", "500000000", "bytes"},
        {"a gap between the tensors", "16", "3,4", "16", "leaves a gap"},
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
                     "{\"name\":\"0.bias\",\"shape\":[3],\"offset\":%s}],%s",
                     hdr, cases[i].nparams, cases[i].shape, i == 3 ? "499999997" : i == 4 ? "13" : "12", shards);
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
        for (int i = 0; i < dt_st_count(f); i++) t[i] = *dt_st_get(f, i), t[i].data = tl_st_data(f, dt_st_get(f, i));
        CHECK(dt_st_write(tmp_path("big-claim2.safetensors"), t, dt_st_count(f), meta, nm) == DT_OK, "write: %s",
              dt_last_error());
        dt_st_close(f);
    }
    free(p);
    bigf = tmp_path("big-claim2.safetensors");
    float *wp = NULL;
    dt_gpt_config got;
    // Refused before anything is allocated for the claimed model: with the
    // address space capped at 1 GiB more than now, an allocation of its
    // size would fail as out of memory, not as the format error expected.
    dt_gpt *m = NULL;
    CHECK(dt_gpt_create(&m, &tiny, 1, 8) == DT_OK, "tiny GPT: %s", dt_last_error());
    int capped = tl_cap_memory((size_t)1 << 30);
    EXPECT_ERR(dt_gpt_weights_load(bigf, &got, &wp), DT_ERR_FORMAT, bigf, "n_layer 48", "bytes of tensors");
    EXPECT_ERR(dt_gpt_load(m, bigf), DT_ERR_FORMAT, bigf, "bytes of tensors");
    tl_uncap_memory();
    dt_gpt_free(m);
    ncases += 2;
    CHECK(wp == NULL, "refused, nothing allocated (address space capped: %d)", capped);
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

// ---------------------------------------------------------------------------
// 8. HDF5 data

#ifdef DTRAIN_HAVE_HDF5

// Writes dataset `name` (groups on the way made) of type t, with ndim dims
// and data (n elements of t's size) into the HDF5 file at path (created
// when new).
static void h5_put(const char *path, const char *name, hid_t t, int ndim, const hsize_t *dims, const void *data) {
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    hid_t f = access(path, F_OK) == 0 ? H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT)
                                      : H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
    H5Pset_create_intermediate_group(lcpl, 1);
    hid_t sp = H5Screate_simple(ndim, dims, NULL);
    hid_t d = H5Dcreate2(f, name, t, sp, lcpl, H5P_DEFAULT, H5P_DEFAULT);
    CHECK(f >= 0 && d >= 0 && H5Dwrite(d, t, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) >= 0, "writing %s:%s", path, name);
    H5Dclose(d);
    H5Sclose(sp);
    H5Pclose(lcpl);
    H5Fclose(f);
}

// A chunked dataset of `dims` with nothing written: a claim with no data.
static void h5_claim(const char *path, const char *name, int ndim, const hsize_t *dims, const hsize_t *chunk) {
    hid_t f = access(path, F_OK) == 0 ? H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT)
                                      : H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    hid_t lcpl = H5Pcreate(H5P_LINK_CREATE), dcpl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_create_intermediate_group(lcpl, 1);
    H5Pset_chunk(dcpl, ndim, chunk);
    hid_t sp = H5Screate_simple(ndim, dims, NULL);
    hid_t d = H5Dcreate2(f, name, H5T_NATIVE_UINT8, sp, lcpl, dcpl, H5P_DEFAULT);
    CHECK(f >= 0 && d >= 0, "creating %s:%s", path, name);
    H5Dclose(d);
    H5Sclose(sp);
    H5Pclose(dcpl);
    H5Pclose(lcpl);
    H5Fclose(f);
}

static void test_hdf5(void) {
    dt_dataset ds;
    uint8_t px[4 * 2 * 3] = {0};
    const uint8_t lab_ok[4] = {0, 9, 3, 1}, lab_10[4] = {0, 1, 10, 2};
    const int8_t lab_neg[4] = {0, 1, -1, 2};
    const float fl[4 * 2 * 3] = {0};
    const double dl[4] = {0};
    const hsize_t d3[3] = {4, 2, 3}, d2[2] = {4, 6}, d1[1] = {4}, d5[1] = {5}, d41[2] = {4, 1};
    const char *ok = tmp_path("ok.h5");
    h5_put(ok, "train/images", H5T_NATIVE_UINT8, 3, d3, px);
    h5_put(ok, "train/labels", H5T_NATIVE_UINT8, 1, d1, lab_ok);
    h5_put(ok, "x/float_images", H5T_NATIVE_FLOAT, 3, d3, fl);
    h5_put(ok, "x/short_images", H5T_NATIVE_INT16, 3, d3, fl);  // 48 bytes: room for 24 int16
    h5_put(ok, "x/flat_images", H5T_NATIVE_UINT8, 2, d2, px);
    h5_put(ok, "x/float_labels", H5T_NATIVE_DOUBLE, 1, d1, dl);
    h5_put(ok, "x/labels_2d", H5T_NATIVE_UINT8, 2, d41, lab_ok);
    h5_put(ok, "x/labels_5", H5T_NATIVE_UINT8, 1, d5, px);
    h5_put(ok, "x/labels_10", H5T_NATIVE_UINT8, 1, d1, lab_10);
    h5_put(ok, "x/labels_neg", H5T_NATIVE_INT8, 1, d1, lab_neg);
    CHECK(dt_dataset_load_hdf5(&ds, ok, "train/images", "train/labels", 10, 0, 1, 1) == DT_OK && ds.n == 4 &&
              ds.shape[0] == 1 && ds.shape[1] == 2 && ds.shape[2] == 3 && ds.y[1] == 9,
          "a good HDF5 file loads: %s", dt_last_error());
    dt_dataset_free(&ds);
#define H5_ERR(img, lab, want, ...) \
    EXPECT_ERR(dt_dataset_load_hdf5(&ds, ok, img, lab, 10, 0, 1, 1), want, ok, __VA_ARGS__)
    H5_ERR("train/imgs", "train/labels", DT_ERR_FORMAT, "'train/imgs'", "the images", "not found");
    H5_ERR("nogroup/deeper/images", "train/labels", DT_ERR_FORMAT, "'nogroup/deeper/images'", "not found");
    H5_ERR("train/images", "test/labels", DT_ERR_FORMAT, "'test/labels'", "the labels", "not found");
    H5_ERR("train", "train/labels", DT_ERR_FORMAT, "'train'", "is a group, not a dataset");
    H5_ERR("x/float_images", "train/labels", DT_ERR_FORMAT, "'x/float_images'", "32-bit floats",
           "expected 8-bit unsigned integers");
    H5_ERR("x/short_images", "train/labels", DT_ERR_FORMAT, "'x/short_images'", "16-bit signed integers");
    H5_ERR("x/flat_images", "train/labels", DT_ERR_FORMAT, "'x/flat_images'", "2 dimensions", "(N, H, W)");
    H5_ERR("train/images", "x/float_labels", DT_ERR_FORMAT, "'x/float_labels'", "64-bit floats", "expected integers");
    H5_ERR("train/images", "x/labels_2d", DT_ERR_FORMAT, "'x/labels_2d'", "2 dimensions", "expected 1");
    H5_ERR("train/images", "x/labels_5", DT_ERR_FORMAT, "'x/labels_5' has 5 labels but 'train/images' has 4 images");
    H5_ERR("train/images", "x/labels_10", DT_ERR_FORMAT, "dataset 'x/labels_10'", "label 10 of sample 2 is outside 0..9");
    H5_ERR("train/images", "x/labels_neg", DT_ERR_FORMAT, "dataset 'x/labels_neg'", "label -1 of sample 2");
#undef H5_ERR
    // Size claims: a small file claiming 2e6 images, or more than a data file may hold.
    const char *claim = tmp_path("claim.h5");
    const hsize_t big[3] = {2000000, 28, 28}, bigc[3] = {1000, 28, 28}, huge[3] = {6000000, 28, 28};
    const hsize_t nl[1] = {2000000}, nlc[1] = {1000}, nh[1] = {6000000};
    h5_claim(claim, "a/images", 3, big, bigc);
    h5_claim(claim, "a/labels", 1, nl, nlc);
    h5_claim(claim, "b/images", 3, huge, bigc);
    h5_claim(claim, "b/labels", 1, nh, nlc);
    size_t rss0 = peak_rss();
    EXPECT_ERR(dt_dataset_load_hdf5(&ds, claim, "a/images", "a/labels", 10, 0, 1, 1), DT_ERR_FORMAT,
               "dataset 'a/images' (the images) claims 1568000000 bytes but the file stores 0", "crafted");
    EXPECT_ERR(dt_dataset_load_hdf5(&ds, claim, "b/images", "b/labels", 10, 0, 1, 1), DT_ERR_FORMAT,
               "dataset 'b/images' (the images): more than 4294967296 bytes");
    CHECK(peak_rss() < rss0 + (64 << 20), "the claims were refused before anything was allocated (peak RSS %zu -> %zu)",
          rss0, peak_rss());
    CHECK(ds.x == NULL && ds.y == NULL && ds.raw == NULL && ds.n == 0, "a failed HDF5 load leaves the dataset empty");
    const char *missing = tmp_path("missing.h5"), *text = tmp_path("text.h5");
    write_file(text, "not hdf5\n", 9);
    EXPECT_ERR(dt_dataset_load_hdf5(&ds, missing, "a", "b", 10, 0, 1, 1), DT_ERR_IO, missing, "cannot open");
    EXPECT_ERR(dt_dataset_load_hdf5(&ds, text, "a", "b", 10, 0, 1, 1), DT_ERR_FORMAT, text, "not an HDF5 file");
    int64_t n;
    size_t ss;
    EXPECT_ERR(dt_hdf5_images_shape(ok, "x/flat_images", &n, &ss), DT_ERR_FORMAT, ok, "'x/flat_images'");

    // Through the CLI: before the run (the memory check reads the shapes),
    // and configs missing what HDF5 needs.
    char args[2048];
    snprintf(args, sizeof args, "train configs/fashion-mlp.ini --set data.dataset=hdf5 --set data.file=%s --run-dir %s", ok,
             tmp_path("run-h5"));
    cli(1, args, ok, "'test/images' (the images) not found");
    snprintf(args, sizeof args, "train configs/fashion-mlp.ini --set data.dataset=hdf5 --set data.file=%s --run-dir %s",
             missing, tmp_path("run-h5"));
    cli(1, args, "[data] file", missing);
    cfg_err(BASE "[data]\ndataset = hdf5\n", NULL, 0, "bad.ini", "[data] file", "HDF5");
    cfg_err(BASE "[data]\naugment = crop, rotate\n", NULL, 0, "[data] augment", "'rotate'", "crop");
    cfg_err(BASE "[data]\naugment = crop\ncrop_pad = 28\n", NULL, 0, "[data] crop_pad", "28", "28x28");
    cfg_err(BASE "[data]\nsampler = balanced\nshuffle = false\n", NULL, 0, "[data] sampler", "shuffle = false", NULL);
    cfg_err(BASE "[data]\nsampler = classwise\n", NULL, 0, "[data] sampler", "shuffled", "balanced");
    cfg_err(BASE "[data]\nloader_threads = 0\n", NULL, 0, "[data] loader_threads", "from 1 to 256", NULL);

    // Data outside the file: external raw storage naming another file.
    const char *ext = tmp_path("external.h5"), *raw = tmp_path("external.raw");
    write_file(raw, px, sizeof px);
    hid_t f = H5Fcreate(ext, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), dcpl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_external(dcpl, raw, 0, sizeof px);
    hid_t sp = H5Screate_simple(3, d3, NULL);
    hid_t ds_ext = H5Dcreate2(f, "images", H5T_NATIVE_UINT8, sp, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    CHECK(f >= 0 && ds_ext >= 0, "an HDF5 file with external storage");
    H5Dclose(ds_ext), H5Sclose(sp), H5Pclose(dcpl), H5Fclose(f);
    h5_put(ext, "labels", H5T_NATIVE_UINT8, 1, d1, lab_ok);
    EXPECT_ERR(dt_dataset_load_hdf5(&ds, ext, "images", "labels", 10, 0, 1, 1), DT_ERR_FORMAT, "dataset 'images'",
               "keeps its data outside the file");

    // Settings that a layout would not apply: refused by name.
    cfg_err(BASE "[parallel]\nschedule = interleaved\n", NULL, 0, "[parallel] schedule = interleaved", "pipeline is 1",
            NULL);
    cfg_err(BASE "[parallel]\nvirtual_stages = 2\n", NULL, 0, "[parallel] virtual_stages", "pipeline >= 2", NULL);
    char run[700];
    snprintf(run, sizeof run, "--set data.dir=%s --set train.threads=1 -q --run-dir %s", tmp_path("small"),
             tmp_path("run-ps-bad"));
    snprintf(args, sizeof args, "train configs/fashion-mlp-ps.ini --set ps.mode=sync --set ps.staleness=0 --set ps.staleness_lr=true %s", run);
    cli(2, args, "[ps] staleness_lr", "mode = sync applies no stale gradient");
    snprintf(args, sizeof args, "train configs/fashion-mlp-ps.ini --set parallel.grad_dtype=bf16 %s", run);
    cli(2, args, "[parallel] grad_dtype = bf16", "parameter servers");

    // A damaged checkpoint under parameter servers: every error names it
    // first (the servers' included: none reports the consequence alone).
    const char *psr = tmp_path("run-ps-damaged");
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s train configs/fashion-mlp-ps.ini --workers 2 --set data.dir=%s --set train.threads=1 "
             "--set train.max_steps=2 --set checkpoint.every_steps=2 -q --run-dir %s && "
             "printf 'XXXX' | dd of=%s/checkpoints/step-00000002/shard-00000-of-00002.safetensors bs=1 seek=200 "
             "conv=notrunc 2>/dev/null", tl_dtrain(), tmp_path("small"), psr, psr);
    CHECK(tl_run(cmd, g_out, sizeof g_out) == 0, "a parameter-server run with a checkpoint: %s", g_out);
    snprintf(cmd, sizeof cmd, "timeout 120 %s train configs/fashion-mlp-ps.ini --workers 2 --set data.dir=%s "
             "--set train.threads=1 --set train.max_steps=4 --set checkpoint.every_steps=2 -q --run-dir %s --resume auto",
             tl_dtrain(), tmp_path("small"), psr);
    int rc = tl_run(cmd, g_out, sizeof g_out), lines = 0, named = 0;
    for (const char *e = strstr(g_out, "error: "); e; e = strstr(e + 1, "error: "), lines++) {
        char line[1024];
        snprintf(line, sizeof line, "%.*s", (int)strcspn(e, "\n"), e);
        named += strstr(line, "/checkpoints") != NULL || !strncmp(line, "error: run: rank", 16);  // (the launcher's)
    }
    CHECK(rc == 1 && lines > 0 && named == lines && !contains(g_out, "the first message from worker"),
          "resume of a damaged checkpoint under servers: exit %d, %d of %d errors name the checkpoints\n%s", rc, named,
          lines, g_out);
}
#else
static void test_hdf5(void) { printf("HDF5 data: not built (no libhdf5): its cases did not run\n"); }
#endif

// Special files and planted links: every input is a regular file, read
// without waiting on a FIFO's writer; files made in a run directory never
// write through a symbolic link; an output never replaces a device or a link.
static void test_special_files(void) {
    char cmd[4096], args[2048];
    int cases = 0;
    const char *fifo = tmp_path("fifo");
    snprintf(cmd, sizeof cmd, "mkfifo %s && mkdir %s-idx && cd %s-idx && for s in train t10k; do mkfifo $s-images-idx3-ubyte.gz "
             "$s-labels-idx1-ubyte.gz; done", fifo, fifo, fifo);
    CHECK(tl_run(cmd, NULL, 0) == 0, "mkfifo %s", fifo);
    // Token files of its own: a clean checkout has no data/fortunes_*.bin.
    snprintf(cmd, sizeof cmd, "%s prepare-text README.md -o %s-tok", tl_dtrain(), fifo);
    CHECK(tl_run(cmd, NULL, 0) == 0, "prepare-text README.md");
    // (timeout: a regression shows as a failed case, not a hung suite)
    struct { const char *args, *want; } in[] = {
        {"train %s", "not a regular file (a FIFO)"},
        {"train configs/fashion-mlp.ini --set data.dataset=hdf5 --set data.file=%s", "not a regular file (a FIFO)"},
        {"prepare-text %s -o " "%s.tok", "not a regular file (a FIFO)"},
        {"inspect %s", "not a regular file (a FIFO)"},
        {"train configs/fashion-mlp.ini --set data.dir=%s-idx", "not a regular file (a FIFO)"},
        {"train configs/gpt-fortunes.ini --set model.init_from=%s --set data.train_file=%s-tok_train.bin "
         "--set data.val_file=%s-tok_val.bin", "not a regular file"},
        {"train /dev/zero", "not a regular file (a device)"},
        {"train /tmp", "not a regular file (a directory)"},
    };
    for (size_t i = 0; i < sizeof in / sizeof in[0]; i++, cases++) {
        snprintf(args, sizeof args, in[i].args, i == 6 || i == 7 ? "" : fifo, fifo, fifo);
        snprintf(cmd, sizeof cmd, "timeout 60 %s %s --run-dir %s", tl_dtrain(), args, tmp_path("run-special"));
        if (!strncmp(args, "inspect", 7) || !strncmp(args, "prepare", 7))
            snprintf(cmd, sizeof cmd, "timeout 60 %s %s", tl_dtrain(), args);
        int rc = tl_run(cmd, g_out, sizeof g_out);
        CHECK((rc == 1 || rc == 2) && contains(g_out, in[i].want), "dtrain %s: exit %d, wants '%s'\n%s", args, rc,
              in[i].want, g_out);
    }
    // A sharded checkpoint whose index.json is a FIFO; a run whose metrics log is one.
    const char *sd = tmp_path("sharded-fifo");
    CHECK(make_sharded(sd) == 0, "sharded checkpoint: %s", dt_last_error());
    snprintf(cmd, sizeof cmd, "rm %s/step-00000001/index.json && mkfifo %s/step-00000001/index.json", sd, sd);
    tl_run(cmd, NULL, 0);
    snprintf(cmd, sizeof cmd, "timeout 60 %s inspect %s/step-00000001", tl_dtrain(), sd);
    int rc = tl_run(cmd, g_out, sizeof g_out);
    CHECK(rc == 1 && contains(g_out, "index.json: not a regular file (a FIFO)"), "inspect, index.json a FIFO: exit %d\n%s", rc, g_out);
    const char *rd = tmp_path("run-fifo-log");
    snprintf(cmd, sizeof cmd, "mkdir -p %s/metrics && mkfifo %s/metrics/rank-00000.jsonl", rd, rd);
    tl_run(cmd, NULL, 0);
    snprintf(cmd, sizeof cmd, "timeout 60 %s report %s -o %s/r.html", tl_dtrain(), rd, rd);
    rc = tl_run(cmd, g_out, sizeof g_out);
    CHECK(rc == 1 && contains(g_out, "not a regular file (a FIFO)"), "report, a FIFO metrics log: exit %d\n%s", rc, g_out);
    // A metrics log past what report reads (a sparse file: nothing is stored).
    snprintf(cmd, sizeof cmd, "rm %s/metrics/rank-00000.jsonl && truncate -s 1100M %s/metrics/rank-00000.jsonl", rd, rd);
    tl_run(cmd, NULL, 0);
    snprintf(cmd, sizeof cmd, "timeout 60 %s report %s -o %s/r.html", tl_dtrain(), rd, rd);
    rc = tl_run(cmd, g_out, sizeof g_out);
    CHECK(rc == 1 && contains(g_out, "1153433600 bytes, more than the 1024 MiB"), "report, a 1.1 GB metrics log: exit %d\n%s",
          rc, g_out);
    cases += 3;

    // Planted links: a run directory's .lock, its metrics log, an output.
    const char *victim = tmp_path("victim"), *run = tmp_path("run-links");
    write_file(victim, "precious\n", 9);
    struct { const char *name, *want; } links[] = {{".lock", "a symbolic link; not written through"},
                                                    {"metrics/rank-00000.jsonl", "a symbolic link; not written through"}};
    for (size_t i = 0; i < 2; i++, cases++) {
        snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir -p %s/metrics && ln -s %s %s/%s", run, run, victim, run, links[i].name);
        tl_run(cmd, NULL, 0);
        snprintf(cmd, sizeof cmd, "timeout 120 %s train configs/fashion-mlp.ini --set data.dir=%s --set train.max_steps=1 "
                 "--set train.threads=1 -q --run-dir %s", tl_dtrain(), tmp_path("small"), run);
        rc = tl_run(cmd, g_out, sizeof g_out);
        char *v = tl_read_file(victim, NULL);
        CHECK(rc == 1 && contains(g_out, links[i].want) && v && !strcmp(v, "precious\n"),
              "train with %s a planted link: exit %d, the file it points at %s\n%s", links[i].name, rc,
              v && !strcmp(v, "precious\n") ? "kept" : "changed", g_out);
        free(v);
    }
    const char *dev = tmp_path("devnull"), *lnk = tmp_path("out-link"), *good = tmp_path("sharded-good");
    CHECK(make_sharded(good) == 0, "sharded checkpoint: %s", dt_last_error());
    snprintf(cmd, sizeof cmd, "mknod %s c 1 3 && ln -s %s %s", dev, victim, lnk);
    int have_dev = tl_run(cmd, NULL, 0) == 0;
    const char *outs[] = {dev, lnk};
    for (int i = have_dev ? 0 : 1; i < 2; i++, cases++) {
        snprintf(cmd, sizeof cmd, "timeout 60 %s export %s/step-00000001 -o %s", tl_dtrain(), good, outs[i]);
        rc = tl_run(cmd, g_out, sizeof g_out);
        struct stat sb;
        CHECK(rc == 1 && contains(g_out, "not replaced") && lstat(outs[i], &sb) == 0 &&
                  (i == 0 ? S_ISCHR(sb.st_mode) : S_ISLNK(sb.st_mode)),
              "export -o %s: exit %d, left as it was\n%s", i == 0 ? "a device" : "a link", rc, g_out);
    }
    char *v = tl_read_file(victim, NULL);
    CHECK(v && !strcmp(v, "precious\n"), "the planted links' target is untouched");
    free(v);
    printf("special files and planted links: %d cases\n", cases);
}

// A checkpoint whose position is outside the run (batch 1e12 of an epoch
// of a few), written soundly with the run's own model and config: refused
// before a step, not trained from.
static void test_position(void) {
    dt_config c;
    char dset[700], cmd[2048];
    snprintf(dset, sizeof dset, "data.dir=%s", tmp_path("small"));
    const char *sets[] = {dset, "train.threads=1", "train.eval_batch=50"};
    if (dt_config_load(&c, "configs/fashion-mlp.ini", sets, 3) != DT_OK) {
        CHECK(0, "config: %s", dt_last_error());
        return;
    }
    dt_model *m = NULL;
    dt_optim *o = NULL;
    CHECK(dt_model_create(&m, c.input, c.layers, c.nlayers, 4) == DT_OK &&
              dt_optim_create(&o, &c.optim, dt_model_num_params(m)) == DT_OK, "model: %s", dt_last_error());
    dt_model_init(m, 1);
    dt_tensor_info t[32];
    int nt = dt_model_num_tensors(m);
    for (int i = 0; i < nt && i < 32; i++) t[i] = *dt_model_tensor(m, i);
    char *text = dt_config_format(&c);
    dt_ckpt_model cm = {.tensors = t, .ntensors = nt, .params = dt_model_params(m), .nparams = dt_model_num_params(m),
                        .nstates = dt_optim_num_states(o), .opt_step = dt_optim_step_count(o),
                        .optimizer = dt_optim_kind_name(c.optim.kind), .config = text};
    for (int j = 0; j < cm.nstates; j++) cm.states[j] = dt_optim_state(o, j);
    const char *dir = tmp_path("far-ckpt");
    struct { int64_t epoch, batch; } at[] = {{0, 1000000000000}, {9999, 0}, {3, 100000}};
    for (int k = 0; k < 3; k++) {
        dt_train_state st = {.step = 3, .epoch = at[k].epoch, .epoch_batch = at[k].batch, .world = 1};
        snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir -p %s", dir, dir);
        tl_run(cmd, NULL, 0);
        CHECK(dt_ckpt_write(tl_path(dir, "step-00000003.safetensors"), &cm, &st) == DT_OK, "written: %s", dt_last_error());
        snprintf(cmd, sizeof cmd, "timeout 120 %s train configs/fashion-mlp.ini --set %s --set train.threads=1 -q "
                 "--run-dir %s --resume %s", tl_dtrain(), dset, tmp_path("far-run"), dir);
        int rc = tl_run(cmd, g_out, sizeof g_out);
        CHECK((rc == 1 || rc == 2) && contains(g_out, "is outside this run") && !contains(g_out, "step 4"),
              "resume at epoch %lld batch %lld: exit %d\n%s", (long long)at[k].epoch, (long long)at[k].batch, rc, g_out);
    }
    free(text);
    dt_optim_free(o);
    dt_model_free(m);
}

int main(int argc, char **argv) {
    snprintf(g_tmp, sizeof g_tmp, "%s/dtrain-badinput-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(g_tmp)) {
        perror("mkdtemp");
        return 1;
    }
    dt_set_threads(1);
    const char *only = argc > 1 ? argv[1] : NULL;
    if (only && !strcmp(only, "memory-machine")) test_memory_machine();
    else if (only && !strcmp(only, "memory-cgroup")) test_memory_cgroup();
    if (only) {
        tl_cleanup(g_tmp);
        for (int i = 0; i < g_npaths; i++) free(g_paths[i]);
        return tl_finish();
    }
    test_idx();
    test_config();
    test_safetensors();
    test_cli();
    test_memory();
    test_number_config();
    test_number_flags();
    test_escape();
    test_weights_cli();
    test_hdf5();
    test_special_files();
    test_position();
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_tmp);
    if (!tl_failed && !getenv("KEEP")) tl_run(cmd, NULL, 0);
    else fprintf(stderr, "files kept in %s\n", g_tmp);
    for (int i = 0; i < g_npaths; i++) free(g_paths[i]);
    return tl_finish();
}
