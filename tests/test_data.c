/* The data pipeline (docs/data.md):
 *
 *   1. Augmentation hooks against a plain reference (a padded window, a
 *      mirror) for every offset the rng draws; hook-list parsing.
 *   2. The loader's batches, bitwise: one rank on one thread against the
 *      union of 4 ranks' shares, 3 loader threads with and without
 *      prefetch, the undecoded (cache = false) dataset; augmented samples
 *      differ from the plain ones, from epoch to epoch, and not between runs.
 *   3. sampler = balanced: every batch's class counts differ by at most one
 *      (full and short last batches, an imbalanced set whose rare classes
 *      are cycled), the union over ranks is the one-rank batch, epochs differ.
 *   4. Uneven shares (dt_loader_set_shares): each rank's samples are its
 *      units' pieces, the union is the batch, shares beyond max_share and
 *      bad sums refused.
 *   5. HDF5: `dtrain convert-data` of IDX files; the HDF5 dataset equal to
 *      the IDX one bitwise; a CNN trained from either (with augmentation, 3
 *      loader threads, no cache) gives the same weights bitwise; the
 *      command's bad arguments.
 *   6. Dynamic batching: a deterministic CNN on 3 workers, rank 1 slowed 3x,
 *      with dynamic_batch: bitwise the one-process result, and the slow
 *      rank's share shrank (its metrics records); the same under ZeRO-2 on
 *      2 workers; plain dp on 2 workers against one process within 1e-4;
 *      configs it cannot serve refused.
 *   7. Sharded reading ([data] shard): the sharded order's every batch
 *      share of rank r comes from r's shard, each epoch's union is a
 *      permutation, and one rank's sharded order is the shuffled one,
 *      bitwise; IDX rows read by range (plain and gzip) and HDF5 rows
 *      through the range-reading driver are the whole read's rows; a token
 *      file's shards and the windows drawn from them; configs it cannot
 *      serve refused.
 *
 * Runs write under a fresh temporary directory, removed unless a check
 * failed or KEEP is set. */
#include "dtrain/data.h"
#include "dtrain/gpt.h"
#include "testlib.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char g_tmp[256];
static char g_out[1 << 16];

// ---------------------------------------------------------------------------
// 1. augmentation hooks

// The reference crop: the image padded by p with fill, the window at (p +
// dy, p + dx), drawn as the hook draws them.
static void ref_crop(const float *in, float *out, int C, int H, int W, int p, float fill, dt_rng *r) {
    int dy = (int)dt_rng_below(r, (uint32_t)(2 * p + 1)) - p, dx = (int)dt_rng_below(r, (uint32_t)(2 * p + 1)) - p;
    for (int c = 0; c < C; c++)
        for (int y = 0; y < H; y++)
            for (int x = 0; x < W; x++) {
                int sy = y + dy, sx = x + dx;
                out[(c * H + y) * W + x] = sy < 0 || sy >= H || sx < 0 || sx >= W ? fill : in[(c * H + sy) * W + sx];
            }
}

static void test_hooks(void) {
    int nops, ids[DT_MAX_AUGMENT], n;
    const dt_augment_op *ops = dt_augment_ops(&nops);
    CHECK(nops >= 2 && !strcmp(ops[0].name, "crop") && !strcmp(ops[1].name, "flip"), "the hook table: crop, flip");
    enum { C = 2, H = 5, W = 7 };
    const int shape[3] = {C, H, W};
    float in[C * H * W], x[C * H * W], want[C * H * W];
    for (int i = 0; i < C * H * W; i++) in[i] = (float)i + 0.5f;
    int moved = 0, mismatched = 0;
    for (int p = 0; p <= 4; p++)
        for (uint64_t seed = 0; seed < 60; seed++) {
            dt_augment_params ap = {p};
            dt_rng r1, r2;
            dt_rng_seed(&r1, seed);
            dt_rng_seed(&r2, seed);
            memcpy(x, in, sizeof x);
            ops[0].fn(x, shape, -9.0f, &ap, &r1);
            ref_crop(in, want, C, H, W, p, -9.0f, &r2);
            mismatched += memcmp(x, want, sizeof x) != 0;
            moved += memcmp(x, in, sizeof x) != 0;
        }
    CHECK(mismatched == 0, "crop: %d of 300 draws differ from the padded-window reference", mismatched);
    CHECK(moved > 200, "crop: %d of 300 draws moved the image", moved);
    int flipped = 0, wrong = 0;
    for (uint64_t seed = 0; seed < 100; seed++) {
        dt_rng r;
        dt_rng_seed(&r, seed);
        memcpy(x, in, sizeof x);
        ops[1].fn(x, shape, 0, NULL, &r);
        int f = memcmp(x, in, sizeof x) != 0;
        flipped += f;
        for (int c = 0; c < C; c++)
            for (int y = 0; y < H; y++)
                for (int i = 0; i < W; i++)
                    wrong += x[(c * H + y) * W + i] != in[(c * H + y) * W + (f ? W - 1 - i : i)];
    }
    CHECK(wrong == 0, "flip: %d values are not the mirror image (or the image)", wrong);
    CHECK(flipped > 30 && flipped < 70, "flip: %d of 100 flipped (about half expected)", flipped);
    CHECK(dt_augment_parse(" crop, flip ,crop", ids, &n) == DT_OK && n == 3 && ids[0] == 0 && ids[1] == 1 && ids[2] == 0,
          "augment list parsed in order");
    CHECK(dt_augment_parse("", ids, &n) == DT_OK && n == 0, "an empty augment list");
    CHECK(dt_augment_parse("crop,rotate", ids, &n) == DT_ERR_ARG && strstr(dt_last_error(), "'rotate'") &&
              strstr(dt_last_error(), "crop"),
          "an unknown hook named: %s", dt_last_error());
}

// ---------------------------------------------------------------------------
// 2-4. the loader

#define NS 103  // samples of the synthetic set (a short last batch)
#define SS 64   // 1x8x8

// A dataset of NS 8x8 images (class i % 10, or skewed: class c has about
// (c + 1)^2 samples' share), from bytes, cached or not.
static void make_set(dt_dataset *ds, int cache, int skewed) {
    uint8_t px[NS * SS];
    int64_t y[NS];
    dt_rng r;
    dt_rng_seed(&r, 7);
    for (int i = 0; i < NS * SS; i++) px[i] = (uint8_t)dt_rng_below(&r, 256);
    for (int i = 0; i < NS; i++) {
        y[i] = i % 10;
        if (skewed) {  // class c for i in [c^2 .. (c+1)^2) scaled to NS
            int c = 0;
            while (c < 9 && (c + 1) * (c + 1) * NS <= 100 * i) c++;
            y[i] = c;
        }
    }
    int shape[3] = {1, 8, 8};
    CHECK(dt_dataset_from_u8(ds, px, y, NS, shape, 10, 0.3f, 0.4f, cache, "test") == DT_OK, "dataset: %s",
          dt_last_error());
}

typedef struct {
    float x[2][NS * SS];   // two epochs of batches, in the epoch's order
    int32_t y[2][NS];
    int batches;
} stream;

// Two epochs of `world` ranks' shares, concatenated in rank order per batch
// (the global batch).
static int read_stream(const dt_dataset *ds, dt_loader_params p, int world, stream *s, const int *units, int nunits) {
    memset(s, 0, sizeof *s);
    dt_loader *l[8];
    p.world = world;
    for (int r = 0; r < world; r++) {
        p.rank = r;
        if (dt_loader_create(&l[r], ds, &p) != DT_OK) {
            CHECK(0, "loader: %s", dt_last_error());
            return -1;
        }
        if (units) CHECK(dt_loader_set_shares(l[r], units, nunits) == DT_OK, "shares: %s", dt_last_error());
    }
    for (int e = 0; e < 2; e++) {
        size_t pos = 0;
        for (int r = 0; r < world; r++) dt_loader_start_epoch(l[r], e, 0);
        for (;;) {
            int more = 0;
            size_t g0 = pos;
            for (int r = 0; r < world; r++) {
                dt_batch b;
                more = dt_loader_next(l[r], &b);
                if (!more) break;
                CHECK(b.first == (int)(pos - g0), "rank %d's share starts at %d, expected %zu", r, b.first, pos - g0);
                memcpy(s->x[e] + pos * SS, b.x, sizeof(float) * SS * (size_t)b.B);
                memcpy(s->y[e] + pos, b.y, sizeof(int32_t) * (size_t)b.B);
                pos += (size_t)b.B;
            }
            if (!more) break;
            if (e == 0) s->batches++;
        }
        CHECK(pos == NS, "epoch %d: %zu samples, expected %d", e, pos, NS);
    }
    for (int r = 0; r < world; r++) dt_loader_free(l[r]);
    return 0;
}

static int same(const stream *a, const stream *b) {
    return !memcmp(a->x, b->x, sizeof a->x) && !memcmp(a->y, b->y, sizeof a->y) && a->batches == b->batches;
}

static stream g_a, g_b;

static void test_loader(void) {
    dt_dataset ds, raw;
    make_set(&ds, 1, 0);
    make_set(&raw, 0, 0);
    CHECK(ds.x && !ds.raw && raw.raw && !raw.x, "cache = 1 keeps floats, cache = 0 the bytes");
    dt_loader_params p = dt_loader_default_params();
    p.batch = 20;
    p.prefetch = 0;
    p.seed = 11;
    CHECK(dt_augment_parse("crop, flip", p.augment, &p.naugment) == DT_OK, "augment list");
    p.aug.crop_pad = 2;
    read_stream(&ds, p, 1, &g_a, NULL, 0);
    read_stream(&ds, p, 4, &g_b, NULL, 0);
    CHECK(same(&g_a, &g_b), "augmented batches: 4 ranks' union equals one rank's, bitwise");
    dt_loader_params q = p;
    q.threads = 3;
    read_stream(&ds, q, 1, &g_b, NULL, 0);
    CHECK(same(&g_a, &g_b), "3 loader threads, no prefetch: the same batches bitwise");
    q.prefetch = 1;
    read_stream(&ds, q, 2, &g_b, NULL, 0);
    CHECK(same(&g_a, &g_b), "3 loader threads with prefetch on 2 ranks: the same batches bitwise");
    q.threads = 1;
    read_stream(&raw, q, 3, &g_b, NULL, 0);
    CHECK(same(&g_a, &g_b), "the undecoded dataset (cache = false), 3 ranks, prefetch: the same batches bitwise");
    read_stream(&ds, p, 1, &g_b, NULL, 0);
    CHECK(same(&g_a, &g_b), "a second run: the same batches");
    CHECK(memcmp(g_a.x[0], g_a.x[1], sizeof g_a.x[0]) != 0, "epochs differ");
    // The same epoch order without augmentation: the samples differ, the
    // labels do not.
    dt_loader_params plain = p;
    plain.naugment = 0;
    read_stream(&ds, plain, 1, &g_b, NULL, 0);
    CHECK(!memcmp(g_a.y, g_b.y, sizeof g_a.y) && memcmp(g_a.x, g_b.x, sizeof g_a.x) != 0,
          "augmentation changes the samples, not the order or labels");
    // Plain samples are the decoded bytes: the loader's sample of index j
    // is dt_dataset_sample's.
    float one[SS];
    int found = 0;
    for (int j = 0; j < NS && !found; j++) {
        dt_dataset_sample(&raw, j, one);
        found = !memcmp(one, g_b.x[0], sizeof one);
    }
    CHECK(found, "the first sample is a decoded sample of the set");

    // 4. uneven shares: 12 units as 1, 5, 6 over 3 ranks.
    int units[3] = {1, 5, 6};
    dt_loader_params wide = plain;
    wide.max_share = 20;
    read_stream(&ds, wide, 3, &g_a, units, 12);
    CHECK(!memcmp(g_a.x, g_b.x, sizeof g_a.x) && !memcmp(g_a.y, g_b.y, sizeof g_a.y),
          "uneven shares: the union is the global batch, bitwise");
    dt_loader *l;
    plain.world = 3;
    plain.rank = 1;
    CHECK(dt_loader_create(&l, &ds, &plain) == DT_OK, "loader");
    dt_batch b;
    dt_loader_start_epoch(l, 0, 0);
    CHECK(dt_loader_set_shares(l, units, 12) == DT_ERR_ARG && strstr(dt_last_error(), "more than"),
          "a share beyond the even split's slots is refused: %s", dt_last_error());
    int bad[3] = {4, 4, 3};
    CHECK(dt_loader_set_shares(l, bad, 12) == DT_ERR_ARG && strstr(dt_last_error(), "sum to 11"),
          "shares that do not sum to the units: %s", dt_last_error());
    dt_loader_free(l);
    plain.max_share = 12;
    CHECK(dt_loader_create(&l, &ds, &plain) == DT_OK, "loader");
    dt_loader_start_epoch(l, 0, 0);
    CHECK(dt_loader_set_shares(l, units, 12) == DT_OK, "shares within max_share");
    dt_loader_next(l, &b);
    CHECK(b.B == 20 * 6 / 12 - 20 * 1 / 12 && b.first == 1 && b.global_B == 20,
          "rank 1's share: samples [1, 10) of 20, got %d from %d", b.B, b.first);
    dt_loader_free(l);
    dt_dataset_free(&ds);
    dt_dataset_free(&raw);
}

static void test_balanced(void) {
    dt_dataset ds;
    make_set(&ds, 1, 1);
    int hist[10] = {0};
    for (int i = 0; i < NS; i++) hist[ds.y[i]]++;
    CHECK(hist[0] <= 2 && hist[9] >= 15, "the skewed set: class 0 has %d samples, class 9 %d", hist[0], hist[9]);
    dt_loader_params p = dt_loader_default_params();
    p.sampler = DT_SAMPLER_BALANCED;
    p.prefetch = 0;
    p.seed = 5;
    for (int bs = 20; bs <= 25; bs += 5) {
        p.batch = bs;
        read_stream(&ds, p, 1, &g_a, NULL, 0);
        int uneven = 0, nb = 0;
        for (int e = 0; e < 2; e++)
            for (int g0 = 0; g0 < NS; g0 += bs, nb++) {
                int cnt[10] = {0}, gb = NS - g0 < bs ? NS - g0 : bs, lo = gb, hi = 0;
                for (int i = g0; i < g0 + gb; i++) cnt[g_a.y[e][i]]++;
                for (int c = 0; c < 10; c++) {
                    lo = cnt[c] < lo ? cnt[c] : lo;
                    hi = cnt[c] > hi ? cnt[c] : hi;
                }
                if (hi - lo > 1 || lo != gb / 10) {
                    uneven++;
                    fprintf(stderr, "batch %d of %d: classes %d..%d\n", nb, bs, lo, hi);
                }
            }
        CHECK(uneven == 0 && nb == 2 * ((NS + bs - 1) / bs), "balanced, batch %d: %d of %d batches uneven", bs, uneven, nb);
        read_stream(&ds, p, 3, &g_b, NULL, 0);
        CHECK(same(&g_a, &g_b), "balanced, batch %d: 3 ranks' union equals one rank's", bs);
        CHECK(memcmp(g_a.y[0], g_a.y[1], sizeof g_a.y[0]) != 0, "balanced: the epochs' orders differ");
    }
    dt_dataset_free(&ds);
}

// ---------------------------------------------------------------------------
// 5. HDF5 and convert-data; 6. dynamic batching (through the CLI)

// Trains the small CNN on N workers with [data] `data`; the run dir is
// TMP/name.
static int train(const char *name, const char *data, int N, const char *extra) {
    char text[4096];
    snprintf(text, sizeof text, "%s[train]\nbatch = 40\nmax_steps = 30\neval_batch = 100\nseed = 3\n[data]\n%s\n",
             tl_cfg_cnn, data);
    return tl_train(g_tmp, name, text, N, extra, g_out, sizeof g_out);
}

static double compare(const char *a, const char *b, int *bitwise) { return tl_runs_diff(g_tmp, a, b, bitwise); }

static void test_hdf5(void) {
    char cmd[1024], h5[512], img[512], lab[512];
    snprintf(h5, sizeof h5, "%s/data.h5", g_tmp);
    snprintf(cmd, sizeof cmd, "%s convert-data --from idx %s --to %s", tl_dtrain(), g_tmp, h5);
    int rc = tl_run(cmd, g_out, sizeof g_out);
    CHECK(rc == 0 && strstr(g_out, "243 train and 100 test samples of 784 bytes, labels 0 to 9 (a model reading it needs 10"),
          "convert-data: exit %d\n%s", rc, g_out);
    for (int s = 0; s < 2; s++) {
        dt_dataset a, b;
        CHECK(dt_idx_find_split(g_tmp, s ? "t10k" : "train", img, lab, sizeof img) == DT_OK, "the IDX split");
        CHECK(dt_dataset_load_idx(&a, img, lab, 10, 0.2860f, 0.3530f, 1) == DT_OK, "IDX: %s", dt_last_error());
        CHECK(dt_dataset_load_hdf5(&b, h5, s ? "test/images" : "train/images", s ? "test/labels" : "/train/labels", 10,
                                   0.2860f, 0.3530f, 1) == DT_OK,
              "HDF5: %s", dt_last_error());
        CHECK(a.n == b.n && !memcmp(a.shape, b.shape, sizeof a.shape) && a.n > 0 &&
                  !memcmp(a.x, b.x, sizeof(float) * (size_t)a.n * 784) && !memcmp(a.y, b.y, sizeof(int32_t) * (size_t)a.n),
              "split %d: the HDF5 dataset is the IDX one, bitwise", s);
        dt_dataset_free(&a);
        dt_dataset_free(&b);
    }
    int64_t n;
    size_t ss;
    CHECK(dt_hdf5_images_shape(h5, "train/images", &n, &ss) == DT_OK && n == 243 && ss == 784, "the images' shape");

    char idx_data[600], h5_data[600];
    snprintf(idx_data, sizeof idx_data, "dir = %s\n", g_tmp);
    snprintf(h5_data, sizeof h5_data, "dataset = hdf5\nfile = %s\n", h5);
    const char *aug = "--set data.augment=crop,flip --set data.crop_pad=3";
    char more[256];
    CHECK(train("idx", idx_data, 1, aug) == 0, "CNN from IDX");
    snprintf(more, sizeof more, "%s --set data.loader_threads=3 --set data.cache=false", aug);
    CHECK(train("h5", h5_data, 1, more) == 0, "CNN from HDF5, 3 loader threads, no cache");
    int bw;
    double d = compare("idx", "h5", &bw);
    CHECK(bw, "IDX and HDF5 (3 loader threads, uncached) train the same weights bitwise (max rel diff %.3g)", d);
    CHECK(train("idx-plain", idx_data, 1, NULL) == 0, "CNN without augmentation");
    d = compare("idx", "idx-plain", &bw);
    CHECK(!bw && d > 0, "augmentation changes the training (max rel diff %.3g)", d);
    // A flat [model] input: the hooks work on the file's 28x28 images.
    char mlp[1024];
    snprintf(mlp, sizeof mlp, "[model]\ninput = 784\nlayer = linear out=10\n[train]\nbatch = 40\nmax_steps = 10\n"
             "eval_batch = 100\n[data]\ndir = %s\n", g_tmp);
    CHECK(tl_train(g_tmp, "mlp-aug", mlp, 1, "--set data.augment=crop,flip", g_out, sizeof g_out) == 0 &&
              tl_train(g_tmp, "mlp-plain", mlp, 1, NULL, g_out, sizeof g_out) == 0,
          "a flat-input model with and without augmentation");
    d = compare("mlp-aug", "mlp-plain", &bw);
    CHECK(!bw && d > 0, "a flat input is augmented too (max rel diff %.3g)", d);
    CHECK(train("h5-bal", h5_data, 1, "--set data.sampler=balanced") == 0, "CNN, balanced sampler");
    double acc = tl_json_number(tl_path(g_tmp, "h5-bal/summary.json"), "test_accuracy");
    CHECK(acc > 0.3, "balanced sampler: the CNN learns (test accuracy %.3f)", acc);

    // The command's own errors.
    snprintf(cmd, sizeof cmd, "%s convert-data --from idx %s/nowhere --to %s/x.h5", tl_dtrain(), g_tmp, g_tmp);
    rc = tl_run(cmd, g_out, sizeof g_out);
    CHECK(rc == 1 && strstr(g_out, "nowhere/train-images-idx3-ubyte"), "convert-data, no such dir: exit %d\n%s", rc, g_out);
    CHECK(access(tl_path(g_tmp, "x.h5"), F_OK) != 0, "convert-data failed: no file left");
    snprintf(cmd, sizeof cmd, "%s convert-data --from csv %s --to %s/x.h5", tl_dtrain(), g_tmp, g_tmp);
    rc = tl_run(cmd, g_out, sizeof g_out);
    CHECK(rc == 2 && strstr(g_out, "--from 'csv': expected idx"), "convert-data --from csv: exit %d\n%s", rc, g_out);
    snprintf(cmd, sizeof cmd, "%s convert-data --from idx %s", tl_dtrain(), g_tmp);
    rc = tl_run(cmd, g_out, sizeof g_out);
    CHECK(rc == 2 && strstr(g_out, "--to"), "convert-data without --to: exit %d\n%s", rc, g_out);
    snprintf(cmd, sizeof cmd, "%s convert-data --help", tl_dtrain());
    rc = tl_run(cmd, g_out, sizeof g_out);
    CHECK(rc == 0 && strstr(g_out, "dataset = hdf5"), "convert-data --help: exit %d", rc);
}

// A rank's mean "share" over the second half of its step records (the
// split settles in the first steps).
static double mean_share(const char *run, int rank) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s/metrics/rank-%05d.jsonl", g_tmp, run, rank);
    char *t = tl_read_file(path, NULL), *p = t;
    int v[256], n = 0;
    while (p && (p = strstr(p, "\"share\":")) && n < 256) v[n++] = atoi(p += 8);
    free(t);
    double sum = 0;
    for (int i = n / 2; i < n; i++) sum += v[i];
    return n ? sum / (n - n / 2) : -1;
}

static void test_dynamic(void) {
    char data[600];
    snprintf(data, sizeof data, "dir = %s\n", g_tmp);
    // 4 epochs of 6 full batches.
    const char *det = "--deterministic --set train.dynamic_batch=true --set train.epochs=4 --set data.drop_last=true";
    CHECK(train("dyn-ref", data, 1, "--deterministic --set train.epochs=4 --set data.drop_last=true") == 0,
          "deterministic, one process");
    setenv("DTRAIN_SLOW_RANK", "1:x3", 1);
    CHECK(train("dyn-3", data, 3, det) == 0, "deterministic, 3 workers, rank 1 slowed 3x, dynamic batch");
    unsetenv("DTRAIN_SLOW_RANK");
    int bw;
    double d = compare("dyn-ref", "dyn-3", &bw);
    CHECK(bw, "dynamic batch, deterministic: bitwise the one-process weights (max rel diff %.3g)", d);
    // Timings on a shared machine are noisy: the slow rank's mean share
    // is below the even split's and no other rank's is smaller.
    double s0 = mean_share("dyn-3", 0), s1 = mean_share("dyn-3", 1), s2 = mean_share("dyn-3", 2);
    CHECK(fabs(s0 + s1 + s2 - 40) < 1e-9 && s1 < 0.85 * 40 / 3 && s1 <= s0 && s1 <= s2,
          "the slow rank's share shrank: %.1f, %.1f, %.1f of 40", s0, s1, s2);
    // ZeRO-2 (gradients and optimizer state sharded) with a slow rank: the
    // same bits.
    setenv("DTRAIN_SLOW_RANK", "0:x3", 1);
    char z3[256];
    snprintf(z3, sizeof z3, "%s --zero 2", det);
    CHECK(train("dyn-z2", data, 2, z3) == 0, "ZeRO-2 deterministic, 2 workers, rank 0 slowed, dynamic batch");
    unsetenv("DTRAIN_SLOW_RANK");
    d = compare("dyn-ref", "dyn-z2", &bw);
    CHECK(bw, "dynamic batch, ZeRO-2 deterministic: bitwise the one-process weights (max rel diff %.3g)", d);
    s0 = mean_share("dyn-z2", 0), s1 = mean_share("dyn-z2", 1);
    CHECK(fabs(s0 + s1 - 40) < 1e-9 && s0 < 0.85 * 20, "ZeRO-2: the slow rank 0's share shrank: %.1f, %.1f", s0, s1);

    setenv("DTRAIN_SLOW_RANK", "0:x3", 1);
    CHECK(train("dyn-dp", data, 2, "--set train.dynamic_batch=true --set train.epochs=4 --set data.drop_last=true") == 0,
          "dp, 2 workers, rank 0 slowed, dynamic batch");
    unsetenv("DTRAIN_SLOW_RANK");
    CHECK(train("dp-ref", data, 1, "--set train.epochs=4 --set data.drop_last=true") == 0, "dp, one process");
    d = compare("dp-ref", "dyn-dp", &bw);
    CHECK(d >= 0 && d < 1e-4, "dynamic batch, dp: the one-process weights within 1e-4 (max rel diff %.3g)", d);
    s0 = mean_share("dyn-dp", 0), s1 = mean_share("dyn-dp", 1);
    CHECK(fabs(s0 + s1 - 40) < 1e-9 && s0 < 0.85 * 20, "dp: the slow rank 0's share shrank: %.1f, %.1f", s0, s1);

    int rc = train("dyn-pp", data, 2, "--set train.dynamic_batch=true --set parallel.sync_every=4");
    CHECK(rc == 2 && strstr(g_out, "dynamic_batch") && strstr(g_out, "sync_every"), "dynamic batch with local SGD refused: exit %d\n%s",
          rc, g_out);
    rc = train("dyn-z3", data, 2, "--set train.dynamic_batch=true --zero 3");
    CHECK(rc == 2 && strstr(g_out, "dynamic_batch") && strstr(g_out, "zero = 3"), "dynamic batch with ZeRO-3 refused: exit %d\n%s",
          rc, g_out);
}

// ---------------------------------------------------------------------------
// 7. sharded reading

// A set whose label is the sample's index (NS classes): the loader's labels
// say which samples it gave.
static void index_set(dt_dataset *ds, int first, int count) {
    uint8_t px[NS * SS];
    int64_t y[NS];
    for (int i = 0; i < count; i++) {
        y[i] = first + i;
        for (int k = 0; k < SS; k++) px[i * SS + k] = (uint8_t)(first + i + k);
    }
    int shape[3] = {1, 8, 8};
    CHECK(dt_dataset_from_u8(ds, px, y, count, shape, NS, 0.3f, 0.4f, 1, "index set") == DT_OK, "set: %s",
          dt_last_error());
    ds->first = first;
    ds->total = NS;
}

static void test_sharded_order(void) {
    dt_loader_params p = dt_loader_default_params();
    p.batch = 20;
    p.prefetch = 0;
    p.seed = 11;
    p.shard = 1;
    enum { W = 3 };
    dt_dataset part[W], whole;
    dt_loader *l[W];
    int first[W], count[W], at = 0;
    for (int r = 0; r < W; r++) {
        dt_loader_shard(NS, p.batch, W, r, &first[r], &count[r]);
        CHECK(first[r] == at, "rank %d's shard starts where rank %d's ends (%d, %d)", r, r - 1, first[r], at);
        at += count[r];
        index_set(&part[r], first[r], count[r]);
        p.rank = r, p.world = W;
        CHECK(dt_loader_create(&l[r], &part[r], &p) == DT_OK, "sharded loader %d: %s", r, dt_last_error());
    }
    CHECK(at == NS && count[0] == 5 * (20 * 1 / 3) + 3 * 1 / 3 && count[2] == 5 * (20 - 20 * 2 / 3) + (3 - 3 * 2 / 3),
          "the shards cover the %d samples, each rank's share of each batch: %d %d %d", NS, count[0], count[1], count[2]);
    int32_t seen[2][NS];
    for (int e = 0; e < 2; e++) {
        int n = 0, outside = 0;
        for (int r = 0; r < W; r++) dt_loader_start_epoch(l[r], e, 0);
        for (dt_batch b; n < NS;) {
            for (int r = 0; r < W; r++) {
                if (!dt_loader_next(l[r], &b)) goto done;
                for (int i = 0; i < b.B; i++) {
                    outside += b.y[i] < first[r] || b.y[i] >= first[r] + count[r];
                    seen[e][n++] = b.y[i];
                }
            }
        }
    done:;
        int hit[NS] = {0}, dup = 0;
        for (int i = 0; i < n; i++) dup += hit[seen[e][i]]++ > 0;
        CHECK(n == NS && !dup && !outside, "epoch %d: %d samples, %d twice, %d outside their rank's shard", e, n, dup, outside);
    }
    CHECK(memcmp(seen[0], seen[1], sizeof seen[0]) != 0, "the epochs' orders differ");
    for (int r = 0; r < W; r++) dt_loader_free(l[r]);
    int units[3] = {4, 4, 4};
    p.rank = 0;
    CHECK(dt_loader_create(&l[0], &part[0], &p) == DT_OK && dt_loader_set_shares(l[0], units, 12) == DT_ERR_ARG &&
              strstr(dt_last_error(), "shares cannot move"),
          "moving shares refused in the sharded order: %s", dt_last_error());
    dt_loader_free(l[0]);
    CHECK(dt_loader_create(&l[0], &part[1], &p) == DT_ERR_ARG && strstr(dt_last_error(), "not rank's shard"),
          "a dataset that is not the rank's shard refused: %s", dt_last_error());
    // One rank: the sharded order is the shuffled one.
    index_set(&whole, 0, NS);
    dt_loader_params q = p;
    q.shard = 0;
    read_stream(&whole, q, 1, &g_a, NULL, 0);
    read_stream(&whole, p, 1, &g_b, NULL, 0);
    CHECK(same(&g_a, &g_b), "one rank: the sharded order is the shuffled order, bitwise");
    for (int r = 0; r < W; r++) dt_dataset_free(&part[r]);
    dt_dataset_free(&whole);
}

// Rows of IDX and HDF5 files read by range against the whole read.
static void test_rows(void) {
    char img[512], lab[512], plain[600], gz[600], h5[600];
    CHECK(dt_idx_find_split(g_tmp, "train", img, lab, sizeof img) == DT_OK, "the IDX split");  // (plain bytes)
    snprintf(plain, sizeof plain, "%s/plain-images", g_tmp);
    snprintf(gz, sizeof gz, "%s/gzip-images.gz", g_tmp);
    char cmd[2600];
    snprintf(cmd, sizeof cmd, "cp %s %s && gzip -c %s > %s", img, plain, img, gz);
    CHECK(tl_run(cmd, NULL, 0) == 0, "a plain and a gzip copy of %s", img);
    dt_dataset all, rows;
    CHECK(dt_dataset_load_idx(&all, img, lab, 10, 0.2860f, 0.3530f, 0) == DT_OK, "IDX: %s", dt_last_error());
    const char *files[2] = {gz, plain};
    for (int k = 0; k < 2; k++) {
        uint64_t before = dt_data_bytes_read();
        CHECK(dt_dataset_load_idx_rows(&rows, files[k], lab, 10, 0.2860f, 0.3530f, 0, 50, 70) == DT_OK, "rows: %s",
              dt_last_error());
        uint64_t read = dt_data_bytes_read() - before;
        CHECK(rows.n == 70 && rows.first == 50 && rows.total == 243 && !memcmp(rows.raw, all.raw + 50 * 784, 70 * 784) &&
                  !memcmp(rows.y, all.y + 50, 70 * sizeof(int32_t)),
              "%s: rows [50, 120) are the whole read's, bitwise", k ? "plain" : "gzip");
        if (k) CHECK(read == 16 + 70 * 784 + 8 + 70, "plain: the header and the rows read, nothing else: %llu bytes",
                     (unsigned long long)read);
        dt_dataset_free(&rows);
    }
    uint8_t *buf;
    dt_idx out;
    int64_t total;
    CHECK(dt_idx_read_rows(plain, 200, 50, &total, &buf, &out) == DT_ERR_ARG && strstr(dt_last_error(), "rows [200, 250) of 243"),
          "rows past the end refused: %s", dt_last_error());
    snprintf(cmd, sizeof cmd, "head -c 100000 %s > %s.cut && head -c 50000 %s > %s.cut", plain, plain, gz, gz);
    CHECK(tl_run(cmd, NULL, 0) == 0, "cut copies");
    char cut[700];
    snprintf(cut, sizeof cut, "%s.cut", plain);
    CHECK(dt_idx_read_rows(cut, 0, 10, &total, &buf, &out) == DT_ERR_FORMAT && strstr(dt_last_error(), "truncated"),
          "a cut plain file refused by its length: %s", dt_last_error());
    snprintf(cut, sizeof cut, "%s.cut", gz);
    CHECK(dt_idx_read_rows(cut, 200, 43, &total, &buf, &out) == DT_ERR_FORMAT && strstr(dt_last_error(), "truncated"),
          "a cut gzip file's rows past its end refused: %s", dt_last_error());
    dt_dataset_free(&all);

    snprintf(h5, sizeof h5, "%s/data.h5", g_tmp);  // (test_hdf5's)
    CHECK(dt_dataset_load_hdf5(&all, h5, "train/images", "train/labels", 10, 0.2860f, 0.3530f, 1) == DT_OK, "HDF5: %s",
          dt_last_error());
    uint64_t before = dt_data_bytes_read();
    CHECK(dt_dataset_load_hdf5_rows(&rows, h5, "train/images", "train/labels", 10, 0.2860f, 0.3530f, 1, 81, 81) == DT_OK,
          "HDF5 rows: %s", dt_last_error());
    uint64_t read = dt_data_bytes_read() - before;
    CHECK(rows.n == 81 && rows.first == 81 && rows.total == 243 &&
              !memcmp(rows.x, all.x + 81 * 784, 81 * 784 * sizeof(float)) && !memcmp(rows.y, all.y + 81, 81 * sizeof(int32_t)),
          "HDF5 rows [81, 162) are the whole read's, bitwise");
    CHECK(read < 81 * 785 + 20000, "HDF5 rows: %llu bytes read for 81 x 785 bytes of samples (the metadata besides)",
          (unsigned long long)read);
    dt_dataset_free(&rows);
    dt_dataset_free(&all);
}

static void test_token_shards(void) {
    enum { N = 1000, T = 8, B = 6 };
    uint16_t t[N];
    for (int i = 0; i < N; i++) t[i] = (uint16_t)i;  // (a token says where it is)
    char path[600];
    snprintf(path, sizeof path, "%s/tok.bin", g_tmp);
    CHECK(dt_tokens_write(path, t, N) == DT_OK, "token file");
    dt_tokens whole, sh[3];
    CHECK(dt_tokens_open(&whole, path, N) == DT_OK, "whole: %s", dt_last_error());
    int32_t x[3][B * T], y[3][B * T], wx[B * T], wy[B * T];
    dt_rng r0, r[3];
    dt_rng_seed(&r0, 5);
    CHECK(dt_tokens_sample(&whole, &r0, B, T, wx, wy) == DT_OK, "whole windows");
    for (int k = 0; k < 3; k++) {
        CHECK(dt_tokens_open_shard(&sh[k], path, N, k, 3) == DT_OK, "shard %d: %s", k, dt_last_error());
        size_t lo = (size_t)N * k / 3, hi = (size_t)N * (k + 1) / 3;
        CHECK(sh[k].first == lo && sh[k].n == hi - lo && sh[k].total == N && !memcmp(sh[k].tokens, t + lo, 2 * (hi - lo)),
              "shard %d holds tokens [%zu, %zu)", k, lo, hi);
        memset(x[k], 0, sizeof x[k]);
        dt_rng_seed(&r[k], 5);
        CHECK(dt_tokens_sample(&sh[k], &r[k], B, T, x[k], y[k]) == DT_OK, "shard %d's windows", k);
        CHECK(!memcmp(&r[k], &r[0], sizeof r[0]), "every shard's rng moved alike");
        for (int b = 2 * k; b < 2 * k + 2; b++) {  // (windows [2k, 2k+2) are rank k's)
            int s0 = x[k][b * T], ok = s0 >= (int)lo && s0 + T < (int)hi;
            for (int i = 0; i < T; i++) ok &= x[k][b * T + i] == s0 + i && y[k][b * T + i] == s0 + i + 1;
            CHECK(ok, "shard %d's window %d (from token %d) lies in its tokens [%zu, %zu)", k, b, s0, lo, hi);
        }
    }
    dt_tokens one;
    dt_rng_seed(&r[0], 5);
    CHECK(dt_tokens_open_shard(&one, path, N, 0, 1) == DT_OK && dt_tokens_sample(&one, &r[0], B, T, x[0], y[0]) == DT_OK &&
              !memcmp(x[0], wx, sizeof wx) && !memcmp(y[0], wy, sizeof wy),
          "shard 0 of 1 draws the whole file's windows");
    dt_tokens_close(&one);
    for (int k = 0; k < 3; k++) dt_tokens_close(&sh[k]);
    dt_tokens_close(&whole);
}

static void test_shard_config(void) {
    char data[600];
    snprintf(data, sizeof data, "dir = %s\n", g_tmp);
    int rc = train("shard-bal", data, 2, "--set data.shard=ranks --set data.sampler=balanced");
    CHECK(rc != 0 && strstr(g_out, "[data] shard = ranks: [data] sampler = balanced draws every batch from the whole set"),
          "shard = ranks with the balanced sampler refused: exit %d\n%s", rc, g_out);
    rc = train("shard-dyn", data, 2, "--set data.shard=ranks --set train.dynamic_batch=true");
    CHECK(rc != 0 && strstr(g_out, "[train] dynamic_batch moves samples between the ranks"),
          "shard = ranks with dynamic batches refused: exit %d\n%s", rc, g_out);
    rc = train("shard-1", data, 1, "--set data.shard=ranks");
    CHECK(rc == 0, "shard = ranks on one worker: exit %d\n%s", rc, g_out);
    CHECK(train("shard-0", data, 1, NULL) == 0, "the same run unsharded");
    int bw;
    double d = compare("shard-0", "shard-1", &bw);
    CHECK(bw, "one worker: shard = ranks trains the unsharded run's weights bitwise (max rel diff %.3g)", d);
}

int main(void) {
    snprintf(g_tmp, sizeof g_tmp, "/tmp/dtrain-test-data-XXXXXX");
    if (!mkdtemp(g_tmp)) return perror("mkdtemp"), 1;
    tl_make_images(g_tmp, "train", 243, 1);
    tl_make_images(g_tmp, "t10k", 100, 2);
    test_hooks();
    test_loader();
    test_balanced();
    test_hdf5();
    test_dynamic();
    test_sharded_order();
    test_rows();
    test_token_shards();
    test_shard_config();
    tl_cleanup(g_tmp);
    return tl_finish();
}
