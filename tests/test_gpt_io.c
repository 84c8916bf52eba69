/* GPT files and commands: llm.c token files, llm.c checkpoints, GPT
 * safetensors, the GPT config fields, and the prepare-text / train / convert
 * / sample commands end to end on a tiny model. Bad input of every kind
 * (wrong magic or version, truncated or padded files, token ids >= vocab,
 * contexts longer than the model's) must fail with a message that names
 * the file and the problem. */
#include "dtrain/dtrain.h"
#include "testlib.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char g_dir[256];

static void write_bytes(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    fwrite(p, 1, n, f);
    fclose(f);
}

static uint8_t *read_bytes(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    rewind(f);
    uint8_t *b = malloc(*n + 1);
    if (fread(b, 1, *n, f) != *n) *n = 0;
    fclose(f);
    return b;
}

// ----------------------------------------------------------------------------
// token files

static void test_tokens(void) {
    char path[512];
    snprintf(path, sizeof path, "%s/t.bin", g_dir);
    uint16_t tok[1000];
    for (int i = 0; i < 1000; i++) tok[i] = (uint16_t)(i % 97);
    CHECK(dt_tokens_write(path, tok, 1000) == DT_OK, "write token file: %s", dt_last_error());
    size_t n;
    uint8_t *buf = read_bytes(path, &n);
    CHECK(n == 1024 + 2000, "token file size %zu", n);
    int32_t h[3];
    memcpy(h, buf, sizeof h);
    CHECK(h[0] == 20240520 && h[1] == 1 && h[2] == 1000, "token header magic/version/count");

    dt_tokens t;
    CHECK(dt_tokens_open(&t, path, 97) == DT_OK && t.n == 1000 && t.tokens[5] == 5, "open (mmap)");
    // Random windows: inside the file, targets shifted by one, seeded.
    int32_t x[4 * 16], y[4 * 16], x2[4 * 16], y2[4 * 16];
    dt_rng r1, r2;
    dt_rng_seed(&r1, 3);
    dt_rng_seed(&r2, 3);
    dt_tokens_sample(&t, &r1, 4, 16, x, y);
    dt_tokens_sample(&t, &r2, 4, 16, x2, y2);
    int ok = memcmp(x, x2, sizeof x) == 0 && memcmp(y, y2, sizeof y) == 0;
    for (int i = 0; i < 4 * 16; i++) ok &= y[i] == (x[i] + 1) % 97;
    CHECK(ok, "sampled windows: reproducible, targets = next tokens");
    dt_tokens_window(&t, 0, 2, 16, x, y);
    CHECK(x[0] == 0 && x[16] == 16 && y[15] == 16, "validation windows are consecutive");
    CHECK(dt_tokens_sample(&t, &r1, 1, 1000, x, y) == DT_ERR_ARG && strstr(dt_last_error(), "too short"),
          "window longer than the file rejected: %s", dt_last_error());
    dt_tokens_close(&t);

    // Ids >= vocab.
    CHECK(dt_tokens_open(&t, path, 96) == DT_ERR_FORMAT && strstr(dt_last_error(), "token 96 is 96") &&
              strstr(dt_last_error(), path),
          "id >= vocab: %s", dt_last_error());
    // Header and length damage, through the buffer parser.
    const uint16_t *tp;
    size_t tn;
    uint8_t *bad = malloc(n + 2);
    memcpy(bad, buf, n);
    bad[0] ^= 1;
    CHECK(dt_tokens_parse(bad, n, "x.bin", 97, &tp, &tn) == DT_ERR_FORMAT && strstr(dt_last_error(), "magic"),
          "wrong magic: %s", dt_last_error());
    memcpy(bad, buf, n);
    bad[4] = 2;
    CHECK(dt_tokens_parse(bad, n, "x.bin", 97, &tp, &tn) == DT_ERR_FORMAT && strstr(dt_last_error(), "version 2"),
          "wrong version: %s", dt_last_error());
    memcpy(bad, buf, n);
    CHECK(dt_tokens_parse(bad, n - 1, "x.bin", 97, &tp, &tn) == DT_ERR_FORMAT && strstr(dt_last_error(), "truncated"),
          "truncated: %s", dt_last_error());
    CHECK(dt_tokens_parse(bad, n + 2, "x.bin", 97, &tp, &tn) == DT_ERR_FORMAT && strstr(dt_last_error(), "trailing"),
          "trailing bytes: %s", dt_last_error());
    CHECK(dt_tokens_parse(bad, 100, "x.bin", 97, &tp, &tn) == DT_ERR_FORMAT && strstr(dt_last_error(), "header"),
          "shorter than the header: %s", dt_last_error());
    bad[8] = 0xff, bad[9] = 0xff, bad[10] = 0xff, bad[11] = 0xff;
    CHECK(dt_tokens_parse(bad, n, "x.bin", 97, &tp, &tn) == DT_ERR_FORMAT, "negative count: %s", dt_last_error());
    CHECK(dt_tokens_open(&t, "/nonexistent/t.bin", 97) == DT_ERR_IO && strstr(dt_last_error(), "/nonexistent/t.bin"),
          "missing file: %s", dt_last_error());
    free(bad);
    free(buf);
}

// ----------------------------------------------------------------------------
// llm.c checkpoints and safetensors

static void test_weights(void) {
    dt_gpt_config c = {2, 2, 16, 8, 30, 32};
    dt_gpt *m;
    CHECK(dt_gpt_create(&m, &c, 1, 8) == DT_OK, "create");
    dt_gpt_init(m, 5);
    char bin[512], st[512], bin2[512];
    snprintf(bin, sizeof bin, "%s/m.bin", g_dir);
    snprintf(st, sizeof st, "%s/m.safetensors", g_dir);
    snprintf(bin2, sizeof bin2, "%s/m2.bin", g_dir);
    CHECK(dt_llmc_write(bin, &c, dt_gpt_params(m)) == DT_OK, "llmc write: %s", dt_last_error());
    size_t n;
    uint8_t *buf = read_bytes(bin, &n);
    int32_t h[8];
    memcpy(h, buf, sizeof h);
    CHECK(n == 1024 + 4 * dt_gpt_num_params(m) && h[0] == 20240326 && h[1] == 3 && h[2] == 8 && h[3] == 30 &&
              h[4] == 2 && h[5] == 2 && h[6] == 16 && h[7] == 32,
          "llm.c header {magic, 3, maxT, V, L, NH, C, Vp}");
    CHECK(memcmp(buf + 1024, dt_gpt_params(m), 4 * dt_gpt_num_params(m)) == 0, "llm.c payload = parameter block");

    // Round trip through the CLI: llmc -> safetensors -> llmc, byte-exact.
    char cmd[8192], out[8192];
    snprintf(cmd, sizeof cmd, "%s convert --from llmc %s --to %s && %s convert --from safetensors %s --to %s",
             tl_dtrain(), bin, st, tl_dtrain(), st, bin2);
    int rc = tl_run(cmd, out, sizeof out);
    CHECK(rc == 0, "convert both ways: %s", out);
    size_t n2;
    uint8_t *buf2 = read_bytes(bin2, &n2);
    CHECK(buf2 && n2 == n && memcmp(buf, buf2, n) == 0, "llmc -> safetensors -> llmc is byte-exact");
    free(buf2);
    snprintf(cmd, sizeof cmd, "%s convert --from safetensors %s --to %s", tl_dtrain(), bin, st);
    CHECK(tl_run(cmd, out, sizeof out) == 1 && strstr(out, "is an llm.c checkpoint"), "--from mismatch: %s", out);

    // Loading either format into a model.
    dt_gpt *m2;
    dt_gpt_create(&m2, &c, 1, 8);
    CHECK(dt_gpt_load(m2, st) == DT_OK && memcmp(dt_gpt_params(m2), dt_gpt_params(m), 4 * dt_gpt_num_params(m)) == 0,
          "load safetensors: %s", dt_last_error());
    memset(dt_gpt_params(m2), 0, 4 * dt_gpt_num_params(m2));
    CHECK(dt_gpt_load(m2, bin) == DT_OK && memcmp(dt_gpt_params(m2), dt_gpt_params(m), 4 * dt_gpt_num_params(m)) == 0,
          "load llm.c: %s", dt_last_error());
    dt_gpt_config rc2;
    CHECK(dt_gpt_read_config(bin, &rc2) == DT_OK && rc2.padded_vocab_size == 32 && rc2.n_embd == 16, "read config llmc");
    CHECK(dt_gpt_read_config(st, &rc2) == DT_OK && rc2.padded_vocab_size == 32 && rc2.n_layer == 2, "read config st");
    dt_gpt_free(m2);
    dt_gpt_config other = c;
    other.n_layer = 3;
    dt_gpt_create(&m2, &other, 1, 8);
    CHECK(dt_gpt_load(m2, bin) == DT_ERR_FORMAT && strstr(dt_last_error(), "weights are for L2"),
          "size mismatch: %s", dt_last_error());
    CHECK(dt_gpt_load(m2, st) == DT_ERR_FORMAT && strstr(dt_last_error(), "weights are for L2"),
          "size mismatch (safetensors): %s", dt_last_error());
    dt_gpt_free(m2);

    // Damage.
    dt_gpt_config pc;
    const float *pp;
    uint8_t *bad = malloc(n + 4);
    memcpy(bad, buf, n);
    bad[0] ^= 1;
    CHECK(dt_llmc_parse(bad, n, "m.bin", &pc, &pp) == DT_ERR_FORMAT && strstr(dt_last_error(), "magic"),
          "llmc wrong magic: %s", dt_last_error());
    memcpy(bad, buf, n);
    bad[4] = 5;
    CHECK(dt_llmc_parse(bad, n, "m.bin", &pc, &pp) == DT_ERR_FORMAT && strstr(dt_last_error(), "version 5"),
          "llmc wrong version: %s", dt_last_error());
    memcpy(bad, buf, n);
    CHECK(dt_llmc_parse(bad, n - 4, "m.bin", &pc, &pp) == DT_ERR_FORMAT && strstr(dt_last_error(), "truncated"),
          "llmc truncated: %s", dt_last_error());
    CHECK(dt_llmc_parse(bad, n + 4, "m.bin", &pc, &pp) == DT_ERR_FORMAT && strstr(dt_last_error(), "trailing"),
          "llmc trailing: %s", dt_last_error());
    bad[24] = 15;  // C = 15, not a multiple of NH = 2
    CHECK(dt_llmc_parse(bad, n, "m.bin", &pc, &pp) == DT_ERR_FORMAT && strstr(dt_last_error(), "multiple of n_head"),
          "llmc inconsistent sizes: %s", dt_last_error());
    memcpy(bad, buf, n);
    bad[28] = 20;  // Vp < V
    CHECK(dt_llmc_parse(bad, n, "m.bin", &pc, &pp) == DT_ERR_FORMAT && strstr(dt_last_error(), "padded_vocab_size"),
          "llmc Vp < V: %s", dt_last_error());
    write_bytes(bin2, buf, n / 2);
    CHECK(dt_gpt_load(m, bin2) == DT_ERR_FORMAT && strstr(dt_last_error(), bin2), "truncated file named: %s", dt_last_error());
    free(bad);
    free(buf);
    dt_gpt_free(m);
}

// ----------------------------------------------------------------------------
// config

static void test_config(void) {
    dt_config c;
    const char *base = "[model]\npreset = gpt-tiny\n[data]\ndataset = tokens\ntrain_file = a.bin\n[train]\nmax_steps = 5\n";
    CHECK(dt_config_parse(&c, base, "g.ini", NULL, 0) == DT_OK, "gpt-tiny config: %s", dt_last_error());
    CHECK(c.gpt && c.n_layer == 2 && c.n_embd == 64 && c.n_head == 4 && c.vocab_size == 256 && c.seq_len == c.block_size,
          "preset resolved");
    const char *sets[] = {"model.n_layer=3", "model.vocab_size=1000"};
    CHECK(dt_config_parse(&c, base, "g.ini", sets, 2) == DT_OK && c.n_layer == 3 && c.vocab_size == 1000 &&
              c.padded_vocab_size == 1024,
          "overrides; padded vocab follows vocab_size");
    char path[512];
    snprintf(path, sizeof path, "%s/w.ini", g_dir);
    dt_config c2;
    CHECK(dt_config_write(&c, path) == DT_OK && dt_config_load(&c2, path, NULL, 0) == DT_OK, "write + reload: %s",
          dt_last_error());
    CHECK(c2.gpt && c2.n_layer == 3 && c2.padded_vocab_size == 1024 && !strcmp(c2.train_file, "a.bin") &&
              c2.max_steps == 5,
          "reloaded config equals");
    const char *longer[] = {"train.seq_len=300"};
    CHECK(dt_config_parse(&c, base, "g.ini", longer, 1) == DT_ERR_CONFIG && strstr(dt_last_error(), "block_size = 256"),
          "seq_len > block_size: %s", dt_last_error());
    const char *heads[] = {"model.n_head=5"};
    CHECK(dt_config_parse(&c, base, "g.ini", heads, 1) == DT_ERR_CONFIG && strstr(dt_last_error(), "n_head"),
          "n_embd %% n_head: %s", dt_last_error());
    const char *ds[] = {"data.dataset=fashion-mnist"};
    CHECK(dt_config_parse(&c, base, "g.ini", ds, 1) == DT_ERR_CONFIG && strstr(dt_last_error(), "tokens"),
          "GPT needs dataset = tokens: %s", dt_last_error());
    CHECK(dt_config_parse(&c, "[model]\npreset = gpt\nn_layer = 2\n[data]\ndataset = tokens\ntrain_file = a\n[train]\nmax_steps = 1\n",
                          "g.ini", NULL, 0) == DT_ERR_CONFIG && strstr(dt_last_error(), "n_head"),
          "preset gpt needs every size: %s", dt_last_error());
    CHECK(dt_config_parse(&c, "[model]\npreset = gpt-mega\n", "g.ini", NULL, 0) == DT_ERR_CONFIG &&
              strstr(dt_last_error(), "gpt-mega"),
          "unknown GPT preset: %s", dt_last_error());
    CHECK(dt_config_load(&c, "configs/gpt-fortunes.ini", NULL, 0) == DT_OK && c.gpt && c.seq_len == 128,
          "configs/gpt-fortunes.ini loads: %s", dt_last_error());
    // Classifier configs are untouched by the GPT fields.
    CHECK(dt_config_parse(&c, "[model]\npreset = mlp\n", "m.ini", NULL, 0) == DT_OK && !c.gpt && c.nlayers == 6,
          "classifier config still parses");
}

// ----------------------------------------------------------------------------
// commands end to end

static void test_cli(void) {
    char cmd[8192], out[16384], txt[512], prefix[512], ini[512], run[512];
    snprintf(txt, sizeof txt, "%s/corpus.txt", g_dir);
    FILE *f = fopen(txt, "w");
    for (int i = 0; i < 400; i++) fprintf(f, "the cat sat on the mat. %d\n", i % 10);
    fclose(f);
    snprintf(prefix, sizeof prefix, "%s/corpus", g_dir);
    snprintf(cmd, sizeof cmd, "%s prepare-text %s -o %s", tl_dtrain(), txt, prefix);
    CHECK(tl_run(cmd, out, sizeof out) == 0 && strstr(out, "vocab 256"), "prepare-text: %s", out);
    // The same text gzip-compressed, in a subdirectory: the same tokens.
    snprintf(cmd, sizeof cmd, "mkdir -p %s/gz/a/b && gzip -c %s > %s/gz/a/b/corpus.txt.gz && %s prepare-text %s/gz -o %s-gz",
             g_dir, txt, g_dir, tl_dtrain(), g_dir, prefix);
    CHECK(tl_run(cmd, out, sizeof out) == 0 && strstr(out, "read 1 files"), "prepare-text of a gzip file: %s", out);
    for (int i = 0; i < 2; i++) {
        char a[600], b[600];
        snprintf(a, sizeof a, "%s_%s.bin", prefix, i ? "val" : "train");
        snprintf(b, sizeof b, "%s-gz_%s.bin", prefix, i ? "val" : "train");
        CHECK(tl_same_file(a, b), "%s equals %s", b, a);
    }

    snprintf(ini, sizeof ini, "%s/tiny.ini", g_dir);
    f = fopen(ini, "w");
    fprintf(f,
            "[model]\npreset = gpt\nn_layer = 1\nn_head = 2\nn_embd = 16\nblock_size = 32\nvocab_size = 256\n"
            "[data]\ndataset = tokens\ntrain_file = %s_train.bin\nval_file = %s_val.bin\n"
            "[optim]\nname = adamw\nlr = 0.01\n[train]\nbatch = 4\nseq_len = 32\nmax_steps = 30\neval_every = 10\n"
            "eval_batches = 2\nthreads = 1\n",
            prefix, prefix);
    fclose(f);
    snprintf(run, sizeof run, "%s/run", g_dir);
    snprintf(cmd, sizeof cmd, "%s train %s --run-dir %s -q --checkpoint-every 30", tl_dtrain(), ini, run);
    CHECK(tl_run(cmd, out, sizeof out) == 0 && strstr(out, "val loss"), "train GPT: %s", out);
    char p[600];
    size_t n;
    snprintf(p, sizeof p, "%s/summary.json", run);
    char *sum = (char *)read_bytes(p, &n);
    if (sum) sum[n] = 0;
    CHECK(sum && strstr(sum, "\"val_loss\"") && strstr(sum, "\"val_history\"") && strstr(sum, "tokens_per_sec"),
          "summary.json has val_loss, val_history, tokens_per_sec");
    free(sum);
    snprintf(p, sizeof p, "%s/config.ini", run);
    CHECK(access(p, R_OK) == 0, "config.ini written");

    // Sampling: reproducible for a seed, the prompt comes first.
    char out2[16384];
    snprintf(cmd, sizeof cmd, "%s sample %s --checkpoint %s/model.safetensors --prompt 'the ' -n 40 --temperature 0.8 --seed 3",
             tl_dtrain(), ini, run);
    int rc1 = tl_run(cmd, out, sizeof out), rc2 = tl_run(cmd, out2, sizeof out2);
    // (A sampled NUL byte would end the captured string early: at most 45.)
    CHECK(rc1 == 0 && rc2 == 0 && !strcmp(out, out2) && !strncmp(out, "the ", 4) && strlen(out) <= 4 + 40 + 1,
          "sample is reproducible and starts with the prompt: '%s'", out);
    // The last checkpoint holds the same weights (its sizes in weights_meta), verified.
    snprintf(cmd, sizeof cmd,
             "%s sample %s --checkpoint %s/checkpoints/step-00000030.safetensors --prompt 'the ' -n 40 --temperature 0.8 --seed 3",
             tl_dtrain(), ini, run);
    CHECK(tl_run(cmd, out2, sizeof out2) == 0 && !strcmp(out, out2), "sample from the run's checkpoint: '%s'", out2);
    snprintf(cmd, sizeof cmd, "%s sample %s --checkpoint %s/model.safetensors --prompt 'the ' -n 60 --temperature 0 --top-k 5",
             tl_dtrain(), ini, run);
    CHECK(tl_run(cmd, out, sizeof out) == 0, "greedy sample beyond block_size (sliding context): %s", out);
    char longp[100];
    memset(longp, 'a', 40);
    longp[40] = 0;
    snprintf(cmd, sizeof cmd, "%s sample %s --checkpoint %s/model.safetensors --prompt %s", tl_dtrain(), ini, run, longp);
    CHECK(tl_run(cmd, out, sizeof out) == 2 && strstr(out, "longer than the model's context"), "prompt too long: %s", out);
    snprintf(cmd, sizeof cmd, "%s sample %s --checkpoint %s/model.safetensors --set model.n_layer=2", tl_dtrain(), ini, run);
    CHECK(tl_run(cmd, out, sizeof out) == 1 && strstr(out, "weights are for L1"), "checkpoint of another model: %s", out);

    snprintf(cmd, sizeof cmd, "%s eval %s --checkpoint %s/model.safetensors", tl_dtrain(), ini, run);
    CHECK(tl_run(cmd, out, sizeof out) == 0 && strstr(out, "validation tokens 256: next-token accuracy"),
          "eval of a GPT checkpoint: %s", out);

    // init_from: one more step from the trained weights keeps the val loss
    // near the trained one, far below a fresh model's ~ln(256) = 5.5.
    snprintf(cmd, sizeof cmd, "%s train %s --run-dir %s/run3 -q --set model.init_from=%s/model.safetensors "
             "--set train.max_steps=1 --set optim.lr=1e-5", tl_dtrain(), ini, g_dir, run);
    char *vl = NULL;
    CHECK(tl_run(cmd, out, sizeof out) == 0 && (vl = strstr(out, "val loss ")) && atof(vl + 9) < 4.0,
          "init_from continues from saved weights: %s", out);
    // init_from where no rank keeps the whole model (a tensor-parallel
    // shard reads its part a piece at a time, a ZeRO-3 rank its slice): one
    // step of lr 1e-12 ends where it started.
    const char *lays[] = {"--set parallel.tensor=2", "--zero 3"};
    for (int i = 0; i < 2; i++) {
        char a[600], b[600];
        snprintf(cmd, sizeof cmd, "%s train %s --workers 2 --run-dir %s/run5-%d -q --set model.init_from=%s/model.safetensors "
                 "--set train.max_steps=1 --set optim.lr=1e-12 %s", tl_dtrain(), ini, g_dir, i, run, lays[i]);
        snprintf(a, sizeof a, "%s/model.safetensors", run);
        snprintf(b, sizeof b, "%s/run5-%d/model.safetensors", g_dir, i);
        int bw, rc = tl_run(cmd, out, sizeof out);
        double d = rc == 0 ? tl_weights_diff(a, b, &bw) : -1;
        CHECK(rc == 0 && d >= 0 && d <= 1e-6, "init_from on 2 workers %s: exit %d, max rel diff %.3g to the file\n%s",
              lays[i], rc, d, out);
    }
    snprintf(cmd, sizeof cmd, "%s train %s --run-dir %s/run3 -q --set model.init_from=%s/nothing.bin", tl_dtrain(), ini,
             g_dir, g_dir);
    CHECK(tl_run(cmd, out, sizeof out) == 1 && strstr(out, "nothing.bin"), "init_from missing file: %s", out);

    snprintf(cmd, sizeof cmd, "%s train %s --run-dir %s/run4 -q --set data.val_file= --set train.max_steps=2", tl_dtrain(),
             ini, g_dir);
    CHECK(tl_run(cmd, out, sizeof out) == 0 && strstr(out, "no val_file"), "training without a val file: %s", out);

    // Data parallel: 2 workers on half a batch each follow the 1-worker run
    // (same global batches, gradient mean by allreduce) up to rounding.
    char out1[16384];
    snprintf(cmd, sizeof cmd, "%s train %s --run-dir %s/dp1 -q --set train.max_steps=8 --set train.eval_every=0",
             tl_dtrain(), ini, g_dir);
    int r1 = tl_run(cmd, out1, sizeof out1);
    snprintf(cmd, sizeof cmd, "%s train %s --workers 2 --run-dir %s/dp2 -q --set train.max_steps=8 --set train.eval_every=0",
             tl_dtrain(), ini, g_dir);
    int r2 = tl_run(cmd, out, sizeof out);
    char *v1 = strstr(out1, "val loss "), *v2 = strstr(out, "val loss ");
    CHECK(r1 == 0 && r2 == 0 && v1 && v2 && tl_rel(atof(v1 + 9), atof(v2 + 9), 1e-6) < 1e-3,
          "2 workers match 1 worker: '%s' vs '%s'", out1, out);
    snprintf(cmd, sizeof cmd, "%s train %s --workers 3 --run-dir %s/dp3 -q --set train.batch=2", tl_dtrain(), ini, g_dir);
    CHECK(tl_run(cmd, out, sizeof out) != 0 && strstr(out, "batch 2 is smaller than the 3 workers"),
          "fewer windows than workers: %s", out);
    snprintf(cmd, sizeof cmd, "%s train %s --workers 3 --run-dir %s/dp3 -q --deterministic --set parallel.micro_shards=4",
             tl_dtrain(), ini, g_dir);
    CHECK(tl_run(cmd, out, sizeof out) != 0 && strstr(out, "micro_shards (4) must be a multiple of the 3 workers"),
          "deterministic shards not divisible by workers: %s", out);
    snprintf(cmd, sizeof cmd, "%s train %s --run-dir %s/dp4 -q --set train.grad_accum=3", tl_dtrain(), ini, g_dir);
    CHECK(tl_run(cmd, out, sizeof out) != 0 && strstr(out, "grad_accum (3) must divide batch (4)"),
          "grad_accum must divide the batch: %s", out);

    // Bad data: a token file whose ids exceed the config's vocab.
    snprintf(cmd, sizeof cmd, "%s train %s --run-dir %s/run2 -q --set model.vocab_size=100", tl_dtrain(), ini, g_dir);
    CHECK(tl_run(cmd, out, sizeof out) == 1 && strstr(out, "not below the model's vocab_size 100") && strstr(out, "_train.bin"),
          "token ids >= vocab_size: %s", out);
    snprintf(cmd, sizeof cmd, "%s train %s --run-dir %s/run2 -q --set train.seq_len=64", tl_dtrain(), ini, g_dir);
    CHECK(tl_run(cmd, out, sizeof out) != 0 && strstr(out, "longer than the model's context"), "seq_len > block_size: %s", out);
    snprintf(cmd, sizeof cmd, "%s train %s --run-dir %s/run2 -q --set data.train_file=%s", tl_dtrain(), ini, g_dir, txt);
    CHECK(tl_run(cmd, out, sizeof out) == 1 && strstr(out, "magic"), "text file as token file: %s", out);
}

// Files changing under a run, prepare-text's limits, and memory refusals
// of GPT runs (the field and the bytes, exit 1, never a signal).
static void test_files_and_memory(void) {
    char cmd[8192], out[16384], ini[512], prefix[512], trunc[600], run[600];
    snprintf(ini, sizeof ini, "%s/tiny.ini", g_dir);  // test_cli's
    snprintf(prefix, sizeof prefix, "%s/corpus", g_dir);

    // A token file truncated to nothing while training: the run read it
    // whole at the start, so it goes on; SIGUSR1 then stops it at a step
    // (exit 75). A memory-mapped file would end the run with SIGBUS.
    snprintf(trunc, sizeof trunc, "%s/trunc_train.bin", g_dir);
    snprintf(run, sizeof run, "%s/run-trunc", g_dir);
    snprintf(cmd, sizeof cmd,
             "cp %s_train.bin %s && (%s train %s --run-dir %s -q --set data.train_file=%s --set train.max_steps=100000000 "
             "--set train.eval_every=0 & P=$!; i=0; while [ $i -lt 600 ] && "
             "[ \"$(cat %s/metrics/rank-00000.jsonl 2>/dev/null | wc -l)\" -lt 3 ]; do sleep 0.1; i=$((i+1)); done; "
             ": > %s; sleep 0.5; b=$(sed -n 's/^SigBlk:[[:space:]]*//p' /proc/$P/status); "
             "[ $((0x$b & 0x200)) -ne 0 ] || echo \"SIGUSR1 unblocked in the main thread\"; kill -USR1 $P; wait $P; echo exit=$?)",
             prefix, trunc, tl_dtrain(), ini, run, trunc, run, trunc);
    tl_run(cmd, out, sizeof out);
    CHECK(strstr(out, "exit=75") && strstr(out, "stopped at step"),
          "token file truncated during a run: the run goes on and stops on SIGUSR1 (exit 75): %s", out);
    // The training threads block SIGUSR1 (a thread of its own sigwaits for
    // it): a handler run on a thread in oneDNN's JIT GEMM would write its
    // frame into the heap (tools/dtrain/train.c, take_stop_signal).
    CHECK(!strstr(out, "unblocked"), "SIGUSR1 is blocked in a training process's main thread: %s", out);
    // Opened again, the empty file is refused with a message.
    snprintf(cmd, sizeof cmd, "%s train %s --run-dir %s2 -q --set data.train_file=%s", tl_dtrain(), ini, run, trunc);
    CHECK(tl_run(cmd, out, sizeof out) == 1 && strstr(out, "trunc_train.bin") && strstr(out, "0 bytes is shorter"),
          "an empty token file: %s", out);

    // prepare-text: no text, and an endless input.
    snprintf(cmd, sizeof cmd, ": > %s/empty.txt && %s prepare-text %s/empty.txt -o %s/null", g_dir, tl_dtrain(), g_dir, g_dir);
    CHECK(tl_run(cmd, out, sizeof out) == 1 && strstr(out, "empty.txt: 0 bytes of text"), "prepare-text of an empty file: %s", out);
    snprintf(cmd, sizeof cmd, "%s prepare-text /dev/null -o %s/null", tl_dtrain(), g_dir);
    CHECK(tl_run(cmd, out, sizeof out) == 1 && strstr(out, "/dev/null: not a regular file (a device)"),
          "prepare-text /dev/null: %s", out);
    snprintf(cmd, sizeof cmd, "%s/null_train.bin", g_dir);
    CHECK(access(cmd, F_OK) != 0, "prepare-text /dev/null writes no token file");
    snprintf(cmd, sizeof cmd, "mkdir -p %s/emptydir && %s prepare-text %s/emptydir -o %s/null", g_dir, tl_dtrain(), g_dir,
             g_dir);
    CHECK(tl_run(cmd, out, sizeof out) == 1 && strstr(out, "0 bytes of text"), "prepare-text of an empty directory: %s", out);
    // Past the token files' int32 count: refused before a byte is written.
    snprintf(cmd, sizeof cmd, "truncate -s 2100M %s/huge.txt && %s prepare-text %s/huge.txt -o %s/zero", g_dir,
             tl_dtrain(), g_dir, g_dir);
    int rc = tl_run(cmd, out, sizeof out);
    CHECK(rc == 1 && strstr(out, "huge.txt") && strstr(out, "2147483647 bytes"),
          "prepare-text of a 2.1 GB file stops at the 2 GiB - 1 limit: exit %d: %s", rc, out);
    snprintf(cmd, sizeof cmd, "%s/zero_train.bin", g_dir);
    CHECK(access(cmd, F_OK) != 0, "prepare-text past the limit writes no token file");
    snprintf(cmd, sizeof cmd, "%s/huge.txt", g_dir);
    unlink(cmd);
    // Streamed: 64 MB of text in 200 MB of address space (a whole-corpus
    // copy and its tokens would take 5 bytes a byte).
    snprintf(cmd, sizeof cmd, "truncate -s 64M %s/big.txt && (ulimit -v 200000; %s prepare-text %s/big.txt -o %s/big)",
             g_dir, tl_dtrain(), g_dir, g_dir);
    rc = tl_run(cmd, out, sizeof out);
    CHECK(rc == 0 && strstr(out, "(60399616 tokens)") && strstr(out, "(6709248 tokens)"),
          "prepare-text of 64 MB under a 200 MB address-space limit: exit %d: %s", rc, out);
    snprintf(cmd, sizeof cmd, "rm -f %s/big.txt %s/big_train.bin %s/big_val.bin", g_dir, g_dir, g_dir);
    tl_run(cmd, NULL, 0);

    // Memory: B x T activations of a GPT, for train, eval and sample.
    snprintf(cmd, sizeof cmd, "%s train %s --run-dir %s/run-mem -q --set train.batch=1048576 --memory-limit 1G",
             tl_dtrain(), ini, g_dir);
    CHECK(tl_run(cmd, out, sizeof out) == 1 && strstr(out, "train.batch or train.seq_len (1048576 x 32) needs") &&
              strstr(out, "bytes") && strstr(out, "--memory-limit 1G"),
          "GPT batch over --memory-limit: %s", out);
    snprintf(cmd, sizeof cmd, "%s train %s --run-dir %s/run-mem -q --workers 2 --set train.batch=1024 --memory-limit 16M",
             tl_dtrain(), ini, g_dir);
    CHECK(tl_run(cmd, out, sizeof out) == 1 && strstr(out, "(--memory-limit 16M, each worker)") &&
              strstr(out, "train.batch") && strstr(out, "512 x 32 tokens"),
          "2 GPT workers, each over --memory-limit with its half of the batch, refused before they start: %s", out);
    // No flag: a context of 2^20 tokens x 2^20 windows needs petabytes.
    snprintf(cmd, sizeof cmd, "%s train %s --run-dir %s/run-mem -q --set train.batch=1048576 --set model.block_size=1048576 "
             "--set train.seq_len=1048576", tl_dtrain(), ini, g_dir);
    CHECK(tl_run(cmd, out, sizeof out) == 1 && strstr(out, "train.batch or train.seq_len (1048576 x 1048576)") &&
              strstr(out, "is available ("),
          "GPT batch over the machine's memory: %s", out);
    snprintf(cmd, sizeof cmd, "%s eval %s --checkpoint %s/run/model.safetensors --set train.batch=65536 --memory-limit 64M",
             tl_dtrain(), ini, g_dir);
    CHECK(tl_run(cmd, out, sizeof out) == 1 && strstr(out, "train.batch or train.seq_len (65536 x 32)") &&
              strstr(out, "bytes"),
          "GPT eval over --memory-limit: %s", out);
    snprintf(cmd, sizeof cmd, "%s sample %s --checkpoint %s/run/model.safetensors --memory-limit 4K", tl_dtrain(), ini,
             g_dir);
    CHECK(tl_run(cmd, out, sizeof out) == 1 && strstr(out, "not enough memory") && strstr(out, "--memory-limit 4K"),
          "sample over --memory-limit: %s", out);
    snprintf(cmd, sizeof cmd, "%s sample %s --checkpoint %s/run/model.safetensors --memory-limit lots", tl_dtrain(), ini,
             g_dir);
    CHECK(tl_run(cmd, out, sizeof out) == 2 && strstr(out, "--memory-limit needs a size"), "sample --memory-limit lots: %s",
          out);
    snprintf(cmd, sizeof cmd, "%s sample %s --checkpoint %s/run/model.safetensors --memory-limit 1G -n 5", tl_dtrain(),
             ini, g_dir);
    CHECK(tl_run(cmd, out, sizeof out) == 0, "sample under a limit it fits: %s", out);
}

// ----------------------------------------------------------------------------
// converting and loading a piece at a time

// Whether files a and b hold the same bytes.
static int same_file(const char *a, const char *b) {
    size_t na, nb;
    uint8_t *x = read_bytes(a, &na), *y = read_bytes(b, &nb);
    int same = x && y && na == nb && !memcmp(x, y, na);
    free(x), free(y);
    return same;
}

// Bytes this process has read (/proc/self/io's rchar: every read and
// pread); -1 where the kernel does not count them.
static long long bytes_read(void) {
    FILE *f = fopen("/proc/self/io", "r");
    long long v = -1;
    char line[128];
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "rchar: ", 7)) v = atoll(line + 7);
    if (f) fclose(f);
    return v;
}

// What dt_gpt_load of `path` reads beyond opening it (dt_gpt_weights_open,
// which checks every value, a piece at a time): the bytes of the ranges m
// keeps, none more (up to a few bytes another thread of the process may
// read meanwhile: 1 was seen once). -1: not counted here.
static long long load_reads(dt_gpt *m, const char *path) {
    dt_gpt_config c;
    dt_gpt_weights *w = NULL;
    long long a = bytes_read();
    if (dt_gpt_weights_open(&w, path, &c) != DT_OK) return -2;
    dt_gpt_weights_close(w);
    long long b = bytes_read();
    if (dt_gpt_load(m, path) != DT_OK) return -2;
    long long e = bytes_read();
    return a < 0 ? -1 : (e - b) - (b - a);
}

// A model of 10.5 M parameters (wte alone is 4 M floats: more than one
// 16 MiB piece, with a piece boundary inside a tensor): `dtrain convert`
// writes the bytes that the in-memory writers write (dt_llmc_write,
// dt_gpt_weights_save) both ways, and a tensor-parallel shard, a model
// that keeps some blocks (a pipeline stage's) and both at once load their
// part of the file (init_from) as they would take it from the whole block,
// reading the bytes of that part alone (into the model's block: no buffer).
static void test_piecewise(void) {
    dt_gpt_config c = {2, 4, 512, 8, 8000, 8192};
    size_t np = dt_gpt_config_num_params(&c);
    float *p = dt_alloc(np * sizeof(float));
    if (!p) {
        CHECK(0, "out of memory");
        return;
    }
    for (size_t i = 0; i < np; i++) p[i] = (float)((i * 2654435761u) % 1000003) * 1e-6f - 0.5f;
    char bin[512], st[512], bin2[512], st2[512], cmd[4096], out[4096];
    snprintf(bin, sizeof bin, "%s/big.bin", g_dir);
    snprintf(st, sizeof st, "%s/big.safetensors", g_dir);
    snprintf(bin2, sizeof bin2, "%s/big2.bin", g_dir);
    snprintf(st2, sizeof st2, "%s/big2.safetensors", g_dir);
    CHECK(dt_llmc_write(bin, &c, p) == DT_OK && dt_gpt_weights_save(st, &c, p) == DT_OK, "reference files: %s",
          dt_last_error());
    snprintf(cmd, sizeof cmd, "%s convert --from llmc %s --to %s && %s convert --from safetensors %s --to %s",
             tl_dtrain(), bin, st2, tl_dtrain(), st, bin2);
    int rc = tl_run(cmd, out, sizeof out);
    CHECK(rc == 0 && same_file(st, st2), "convert llmc -> safetensors, in pieces: the bytes dt_gpt_weights_save writes\n%s",
          out);
    CHECK(rc == 0 && same_file(bin, bin2), "convert safetensors -> llmc, in pieces: the bytes dt_llmc_write writes");
    // Shards of 2 (and the whole model), keeping both blocks or the last
    // one (with the head and the tied wte, without wpe), load their part:
    // what dt_gpt_part_take takes from the block, read alone.
    unsigned char last[2] = {0, 1};
    for (int k = 0; k < 6; k++) {
        int ntp = k < 4 ? 2 : 1, tp = k % 2, held = k % 4 >= 2 || k == 5;
        dt_gpt *m = NULL, *want = NULL;
        dt_gpt_acts_params a = {0, 0, 0, c.n_layer, ntp, 0, 0, 0};
        if (dt_gpt_create_shard(&m, &c, &a, tp * (ntp > 1)) != DT_OK ||
            dt_gpt_create_shard(&want, &c, &a, tp * (ntp > 1)) != DT_OK ||
            (held && (dt_gpt_set_held(m, last) != DT_OK || dt_gpt_set_held(want, last) != DT_OK))) {
            CHECK(0, "shard %d of %d: %s", tp, ntp, dt_last_error());
            dt_gpt_free(m);
            dt_gpt_free(want);
            break;
        }
        int nr;
        const dt_grad_range *r = dt_gpt_held_ranges(m, &nr);
        long long part = 0;
        for (int i = 0; i < nr; i++) part += (long long)(sizeof(float) * r[i].len);
        dt_gpt_part_take(want, dt_gpt_params(want), 0, np, p);
        for (int f = 0; f < 2; f++) {
            memset(dt_gpt_params(m), 0, sizeof(float) * dt_gpt_num_params(m));
            long long got = load_reads(m, f ? bin : st);
            CHECK(got != -2 && !memcmp(dt_gpt_params(m), dt_gpt_params(want), sizeof(float) * dt_gpt_num_params(m)),
                  "shard %d of %d%s loads its part of %s: %s", tp, ntp, held ? " keeping block 1" : "",
                  f ? "an llm.c file" : "safetensors", dt_last_error());
            if (got == -1) printf("note: /proc/self/io is not there: bytes read not checked\n");
            else
                CHECK(got >= part && got < part + 4096, "shard %d of %d%s reads %lld bytes of %s beyond opening it, expected its part's %lld (the file's %zu)",
                      tp, ntp, held ? " keeping block 1" : "", got, f ? "an llm.c file" : "safetensors", part,
                      sizeof(float) * np);
        }
        dt_gpt_free(m);
        dt_gpt_free(want);
    }
    dt_free(p);
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/dtrain-gpt-io-XXXXXX");
    if (!mkdtemp(g_dir)) return 1;
    dt_set_threads(1);
    test_tokens();
    test_weights();
    test_piecewise();
    test_config();
    test_cli();
    test_files_and_memory();
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    if (tl_failed == 0 && system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
    return tl_finish();
}
