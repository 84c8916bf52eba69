/* Training on a device without a GPU (docs/gpu.md): the device seam
 * (gpu/dev.h) and dtrain's simulated GPU (DTRAIN_GPU=sim), whose memory the
 * host cannot read outside its ops. Runs of the MLP, the CNN and of a tiny
 * GPT on the simulated device against the CPU's on the same data (the
 * first step's loss within 1e-5, the 20th's within 1e-4, and, since the
 * simulated GPU runs the CPU's own kernels, the same weights bitwise; the
 * CNN's convolutions within tolerances; the evaluations, run on the
 * device, the CPU's numbers bitwise), in fp32, bf16 and fp16 (the loss
 * scaler's skipped step too); checkpoints resumed across the two; several
 * ranks; the refusals. `test_gpu_sim gpu`: the same runs on a GPU against
 * the CPU's losses shipped in tests/fixtures/gpu-train-losses.txt. */
#include "dtrain/ckpt.h"
#include "dtrain/config.h"
#include "dtrain/data.h"
#include "dtrain/train.h"
#include "gpu/dev.h"
#include "gpu/dev_model.h"
#include "gpu/gpu.h"
#include "kernels/kernels.h"
#include "testlib.h"

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static char g_tmp[64];
static char g_out[1 << 15];

static const char *tmp(const char *name) { return tl_path(g_tmp, name); }

// ---- the seam -------------------------------------------------------------------

// A host read of device memory outside an op dies with SIGSEGV (in a child).
static void test_protection(void) {
    const dt_dev *d = dt_dev_get();
    CHECK(d == &dt_dev_sim && d->count(g_out, sizeof g_out) == 1, "DTRAIN_GPU=sim: the simulated GPU, one device");
    float host[5] = {1, 2, 3, 4, 5}, back[5] = {0};
    float *dev = NULL;
    CHECK(d->alloc((void **)&dev, sizeof host) == DT_OK && d->to_device(dev, host, sizeof host) == DT_OK &&
              d->to_host(back, dev, sizeof back) == DT_OK && !memcmp(host, back, sizeof host),
          "device memory: a copy there and back: %s", dt_last_error());
    double ss = 0;
    double *dss = NULL;
    CHECK(d->alloc((void **)&dss, sizeof ss) == DT_OK && d->sumsq(dss, dev, 5) == DT_OK &&
              d->to_host(&ss, dss, sizeof ss) == DT_OK && ss == 55.0,
          "sumsq on the device: %g (55)", ss);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        volatile float x = dev[2];  // the host read that must crash
        (void)x;
        _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV, "a host read of a device pointer dies with SIGSEGV "
          "(status %d)", status);
    pid = fork();
    if (pid == 0) {
        dev[0] = 7.0f;  // and a write
        _exit(0);
    }
    waitpid(pid, &status, 0);
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV, "a host write of a device pointer dies with SIGSEGV");
    d->free(dev);
    d->free(dss);
}

// A block backed on demand (dt_dev_vm, ZeRO stage 2's gradients): chunks
// backed zeroed where written, given back once every byte of them is
// unused, counted; an op on a chunk given back dies as on an illegal
// address.
static void test_vm(void) {
    const dt_dev *d = dt_dev_get();
    dt_dev_vm v;
    setenv("DTRAIN_GPU_SIM_MEM", "1G", 1);  // (else the host's available memory, which moves)
    CHECK(dt_dev_vm_open(&v, d, 5 * 65536 - 100, "test", "test") == DT_OK && v.gran == 65536 && v.nchunks == 5,
          "a block of 5 chunks reserved: %s", dt_last_error());
    float two[2] = {0}, got[2] = {1, 1};
    size_t free0 = 0, free1 = 0, total;
    d->mem_info(&free0, &total);
    // bytes [65530, 65540): chunks 0 and 1, zeroed (a fresh chunk holds NaNs)
    CHECK(dt_dev_vm_back(&v, 65530, 10) == DT_OK && v.now == 2 * 65536 && v.mapped[0] && v.mapped[1] && !v.mapped[2],
          "backing 10 bytes across a chunk's end backs the two chunks (%zu bytes)", v.now);
    CHECK(d->to_host(got, v.base + 65528, sizeof got) == DT_OK && got[0] == 0 && got[1] == 0, "backed chunks zeroed");
    d->mem_info(&free1, &total);
    CHECK(free0 - free1 == 2 * 65536, "the device's free memory counts the backed chunks (%zu)", free0 - free1);
    CHECK(dt_dev_vm_unused(&v, 0, 65536 + 100) == DT_OK && !v.mapped[0] && v.mapped[1] && v.now == 65536,
          "chunk 0 wholly unused given back, chunk 1 partly unused kept");
    CHECK(dt_dev_vm_back(&v, 4 * 65536, 65536 - 100) == DT_OK && v.mapped[4] && v.peak == 2 * 65536,
          "the last (short) chunk backed: peak %zu", v.peak);
    CHECK(dt_dev_vm_unused(&v, 4 * 65536, 65536 - 100) == DT_OK && !v.mapped[4],
          "the last chunk given back when its bytes inside the block are unused");
    CHECK(d->to_device(v.base + 65536, two, sizeof two) == DT_OK && dt_dev_vm_zero(&v) == DT_OK &&
              dt_dev_vm_unused(&v, 65536, 100) == DT_OK && v.mapped[1],
          "zeroing clears the step's unused counts: chunk 1 kept");
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        d->memset0(v.base, 16);  // chunk 0, given back: must die
        _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV, "an op on a chunk given back dies with SIGSEGV "
          "(status %d)", status);
    dt_dev_vm_close(&v);
    d->mem_info(&free1, &total);
    CHECK(free1 == free0, "closed: the device's free memory as before (%zu, %zu)", free1, free0);
    unsetenv("DTRAIN_GPU_SIM_MEM");
}

// The cross-entropy over padded rows (ld > V): the padding never written,
// the loss the CPU's.
static void test_ce_padded(void) {
    const dt_dev *d = &dt_dev_sim;
    enum { N = 3, V = 5, LD = 7 };
    float logits[N * LD], probs[N * LD], cpu_p[N * V], row[N * V];
    int32_t y[N] = {0, 4, 2};
    for (int i = 0; i < N * LD; i++) logits[i] = (float)((i * 37) % 11) / 3.0f - 1.0f;
    for (int i = 0; i < N; i++) memcpy(row + i * V, logits + i * LD, sizeof(float) * V);
    float cpu = dt_crossentropy_forward(cpu_p, row, y, N, V), loss = 0;
    char *m;
    size_t bytes = sizeof logits * 2 + sizeof y + 4 + sizeof(double) * N + sizeof(float);
    CHECK(d->alloc((void **)&m, bytes) == DT_OK, "alloc");
    float *dl = (float *)m, *dp = dl + N * LD;
    int32_t *dy = (int32_t *)(dp + N * LD);
    double *drow = (double *)(m + 2 * sizeof logits + sizeof y + 4);
    float *dloss = (float *)(drow + N);
    for (int i = 0; i < N * LD; i++) probs[i] = -9.0f;
    d->to_device(dl, logits, sizeof logits);
    d->to_device(dp, probs, sizeof probs);
    d->to_device(dy, y, sizeof y);
    CHECK(d->crossentropy_forward(dp, drow, dloss, dl, dy, N, V, LD) == DT_OK, "ce forward");
    d->to_host(probs, dp, sizeof probs);
    d->to_host(&loss, dloss, sizeof loss);
    int pad = 1, same = 1;
    for (int i = 0; i < N; i++)
        for (int v = 0; v < LD; v++) {
            if (v >= V) pad &= probs[i * LD + v] == -9.0f;
            else same &= probs[i * LD + v] == cpu_p[i * V + v];
        }
    CHECK(pad && same && loss == cpu, "padded rows: padding untouched %d, probabilities the CPU's %d, loss %.9g vs "
          "%.9g", pad, same, loss, cpu);
    d->free(m);
}

// The 16-bit GEMM's twin: the simulated GPU's gemm16 on to16's values is
// the CPU's dt_sgemm in that precision on the fp32 values, bitwise (every
// transpose, strided, beta 0 and 1, K = 0); its sgemm stays fp32 while
// the process's kernels are in bf16 (a bf16 run's host model), and a
// 16-bit op refuses fp32.
static void test_gemm16(void) {
    const dt_dev *d = &dt_dev_sim;
    enum { M = 37, N = 29, K = 70, LD = 75 };
    float A[K * LD], B[K * LD], C0[M * LD], C[M * LD], G[M * LD];
    uint64_t x = 7;
    for (int i = 0; i < K * LD; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        A[i] = (float)((double)(x >> 11) / 9007199254740992.0 - 0.5);
        B[i] = A[i] * 1.7f - 0.1f;
    }
    for (int i = 0; i < M * LD; i++) C0[i] = (float)(i % 13) / 7.0f;
    void *dA = NULL, *dB = NULL, *hA = NULL, *hB = NULL;
    float *dC = NULL;
    CHECK(d->alloc(&dA, sizeof A) == DT_OK && d->alloc(&dB, sizeof B) == DT_OK &&
              d->alloc(&hA, sizeof A / 2) == DT_OK && d->alloc(&hB, sizeof B / 2) == DT_OK &&
              d->alloc((void **)&dC, sizeof C) == DT_OK,
          "alloc");
    d->to_device(dA, A, sizeof A);
    d->to_device(dB, B, sizeof B);
    int worst = 0, cases = 0;
    for (int ti = 0; ti < 2; ti++) {
        dt_dtype t = ti ? DT_F16 : DT_BF16;
        CHECK(d->to16(hA, dA, K * LD, t) == DT_OK && d->to16(hB, dB, K * LD, t) == DT_OK, "to16: %s", dt_last_error());
        uint16_t h[K * LD], c[K * LD];
        dt_from_f32(c, A, K * LD, t);
        d->to_host(h, hA, sizeof h);
        CHECK(!memcmp(h, c, sizeof h), "to16 in %s: dt_from_f32's bits", dt_dtype_name(t));
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++)
                for (int k = 0; k <= K; k += K)
                    for (int beta = 0; beta < 2; beta++) {
                        memcpy(C, C0, sizeof C);
                        d->to_device(dC, C0, sizeof C);
                        dt_kernels_set_precision(t);
                        dt_sgemm(ta, tb, M, N, k, 0.5f, A, LD, B, LD, (float)beta, C, LD);
                        dt_kernels_set_precision(DT_F32);
                        d->gemm16(t, ta, tb, M, N, k, 0.5f, hA, LD, hB, LD, (float)beta, dC, LD);
                        d->to_host(G, dC, sizeof G);
                        worst += memcmp(C, G, sizeof C) != 0;
                        cases++;
                    }
    }
    CHECK(worst == 0, "the simulated GPU's 16-bit GEMM is dt_sgemm in bf16 and fp16 bitwise: %d of %d cases differ",
          worst, cases);
    // its fp32 GEMM in a process whose kernels are in bf16: fp32
    memcpy(C, C0, sizeof C);
    dt_sgemm(0, 1, M, N, K, 1.0f, A, LD, B, LD, 0.0f, C, LD);
    dt_kernels_set_precision(DT_BF16);
    d->to_device(dC, C0, sizeof C);
    d->sgemm(0, 1, M, N, K, 1.0f, dA, LD, dB, LD, 0.0f, dC, LD);
    CHECK(dt_kernels_precision() == DT_BF16, "the run's precision put back after the op");
    dt_kernels_set_precision(DT_F32);
    d->to_host(G, dC, sizeof G);
    CHECK(!memcmp(C, G, sizeof C), "the simulated GPU's sgemm is fp32 whatever the process's kernels' precision");
    CHECK(d->gemm16(DT_F32, 0, 0, 1, 1, 1, 1.0f, hA, 1, hB, 1, 0.0f, dC, 1) == DT_ERR_ARG &&
              strstr(dt_last_error(), "operands of type F32 (BF16 or F16 only)") &&
              d->to16(hA, dA, 1, DT_F32) == DT_ERR_ARG,
          "16-bit ops refuse fp32: %s", dt_last_error());
    void *bufs[] = {dA, dB, hA, hB, dC};
    for (int i = 0; i < 5; i++) d->free(bufs[i]);
}

// Every op is in the CUDA table; an entry that is NULL (a device without
// it) is named, as a run would be refused; the arena refuses a plan larger
// than the device, naming bytes.
static void test_table(void) {
    const char *mlp[] = {"sgemm", "adamw", "bias_forward", NULL};
    const char *all[] = {"sgemm", "gemm16", "to16", "layernorm_forward", "layernorm_backward", "gelu_forward",
                         "gelu_backward", "crossentropy_forward", "crossentropy_backward", "adamw", "sgd",
                         "encoder_forward", "encoder_backward", "residual_forward", "residual_backward",
                         "attention_forward", "attention_backward", "relu_forward", "relu_backward", "bias_forward",
                         "bias_backward", "sumsq", "sumsq_parts", "scale", "fixed_add", "fixed_to_float", NULL};
    const char *op = dt_dev_lacks(&dt_dev_cuda, all);
    CHECK(op == NULL, "the CUDA device has every op: lacks %s", op ? op : "none");
    dt_dev without = dt_dev_cuda;
    without.bias_forward = NULL;
    op = dt_dev_lacks(&without, mlp);
    CHECK(op && !strcmp(op, "bias_forward"), "a device without bias_forward lacks it: %s", op ? op : "none");
    CHECK(dt_dev_require(&without, mlp, "[train] device = cuda") == DT_ERR_CONFIG &&
              !strcmp(dt_last_error(), "[train] device = cuda: the GPU's bias_forward is not in this dtrain yet "
                                       "(docs/gpu.md)"),
          "refused naming the op: %s", dt_last_error());
    CHECK(dt_dev_lacks(&dt_dev_sim, mlp) == NULL, "the simulated GPU has every op");
    setenv("DTRAIN_GPU_SIM_MEM", "1M", 1);
    dt_dev_arena a = {.d = &dt_dev_sim};
    dt_dev_take(&a, DT_DEV_WEIGHTS, 600 << 10);
    dt_dev_take(&a, DT_DEV_ACTS, 600 << 10);
    CHECK(dt_dev_arena_open(&a, "the device model") == DT_ERR_NOMEM &&
              strstr(dt_last_error(), "needs 1228800 bytes of GPU memory (weights 0.6 MiB, gradients 0.0 MiB") &&
              strstr(dt_last_error(), "free of 1048576"),
          "a plan larger than the device refused with its bytes: %s", dt_last_error());
    unsetenv("DTRAIN_GPU_SIM_MEM");
    CHECK(dt_dev_arena_open(&a, "x") == DT_OK && a.base, "the same plan on a larger device: %s", dt_last_error());
    CHECK(dt_dev_take(&a, DT_DEV_WEIGHTS, 600 << 10) == a.base && dt_dev_take(&a, DT_DEV_ACTS, 600 << 10) ==
          a.base + (600 << 10) && a.used[DT_DEV_ACTS] == 600 << 10, "the second pass takes the planned blocks");
    // a 16-bit output of another type refused, as CUDA's ops refuse it
    float *x = (float *)a.base;
    dt_status st = dt_dev_sim.gelu_forward(NULL, x, 4, x + 4, DT_F32);
    CHECK(st == DT_ERR_ARG && !strcmp(dt_last_error(), "simulated GPU: GELU: a 16-bit output of type F32 (BF16 or F16 "
                                                     "only)"), "GELU's 16-bit output in F32 refused: %s", dt_last_error());
    dt_dev_arena_close(&a);
}

// The sharded norm's pieces (sumsq_parts) of every rank's slice of n over
// W, each slice's first piece from the carry the slice before left: the
// closed pieces added in order are dt_sum_squares's bits.
static void test_sumsq_parts(size_t n, int W) {
    const dt_dev *d = &dt_dev_sim;
    float *x = malloc(sizeof(float) * n), *dx = NULL;
    double *part = malloc(sizeof(double) * (n / DT_SUMSQ_BLOCK + 2 * (size_t)W)), *dp = NULL, carry = 0, sum = 0;
    for (size_t i = 0; i < n; i++) x[i] = (float)((i * 7919) % 1000) / 97.0f - 5.0f;
    dt_status st = d->alloc((void **)&dx, sizeof(float) * n);
    if (st == DT_OK) st = d->alloc((void **)&dp, sizeof(double) * (n / DT_SUMSQ_BLOCK + 2));
    if (st == DT_OK) st = d->to_device(dx, x, sizeof(float) * n);
    for (int r = 0; r < W && st == DT_OK; r++) {
        size_t lo, hi, np = 0;
        dt_shard_range(n, r, W, &lo, &hi);
        if (hi > lo) {
            np = dt_sum_squares_parts(x + lo, hi - lo, lo % DT_SUMSQ_BLOCK, carry, part);
            st = d->sumsq_parts(dp, dx + lo, hi - lo, lo % DT_SUMSQ_BLOCK, carry);
        }
        double got[np ? np : 1];
        if (st == DT_OK && np) st = d->to_host(got, dp, sizeof(double) * np);
        CHECK(st == DT_OK && (!np || !memcmp(got, part, sizeof(double) * np)),
              "sumsq_parts n %zu rank %d of %d: the device's pieces are the CPU's", n, r, W);
        int open = np && hi % DT_SUMSQ_BLOCK && hi != n;
        for (size_t k = 0; k + (size_t)open < np; k++) sum += part[k];
        carry = open ? part[np - 1] : np ? 0 : carry;
    }
    double want = dt_sum_squares(x, n);
    CHECK(st == DT_OK && !memcmp(&sum, &want, sizeof sum), "sumsq_parts n %zu over %d slices: the pieces add to "
          "dt_sum_squares's bits: %.17g, %.17g", n, W, sum, want);
    d->free(dx), d->free(dp), free(x), free(part);
}

// ---- runs ------------------------------------------------------------------------

// The loss of step `step` in run dir's metrics (NAN: not found).
static double step_loss(const char *dir, int step) {
    char path[600], key[64];
    snprintf(path, sizeof path, "%s/metrics/rank-00000.jsonl", dir);
    snprintf(key, sizeof key, "{\"type\":\"step\",\"step\":%d,", step);
    size_t len;
    char *s = tl_read_file(path, &len), *at = s ? strstr(s, key) : NULL, *l = at ? strstr(at, "\"loss\":") : NULL;
    double v = l ? atof(l + 7) : NAN;
    free(s);
    return v;
}

// ---- the CPU's numbers, shipped for the GPU machine -----------------------------

// tests/fixtures/gpu-train-losses.txt: "NAME STEP LOSS" lines, the CPU's
// losses of the runs below at steps 1 to 20 (`test_gpu_sim --write-fixtures`
// writes them). Here the CPU's fresh run must equal them, so they stay
// current; on a GPU machine (`test_gpu_sim gpu`) the device's run is
// compared with them and the CPU's path never runs there.
#define FIXTURES "tests/fixtures/gpu-train-losses.txt"
#define STEPS 20

static int g_write;  // --write-fixtures

// A run in bf16 or fp16 (its name ends so): the GPU within 1% of the CPU's
// losses (the goal for bf16: its GEMMs sum in another order, and
// an operand moved across a 16-bit rounding boundary moves by 2^-8 of
// itself); the CPU's fresh run within HALF_CPU_TOL of the shipped losses,
// which a CPU without bf16 kernels (or a build without oneDNN) sums in
// another order too.
#define HALF_CPU_TOL 1e-3

// The CPU's fresh fp32 run against its shipped losses: 1e-7 where the
// build has oneDNN, whose GEMMs made them; 1e-5 on the portable GEMM (a
// build without oneDNN, as on the GPU machine), which sums in another order.
static double cpu_tol(void) {
    const char *impls = "";
    dt_conv_shape cs = {1, 1, 4, 4, 1, 3, 1, 1, 0, 0, 0, 0, 0, 0};
    dt_conv_path(&cs, &impls);
    return strstr(impls, "no oneDNN") ? 1e-5 : 1e-7;
}
static int half_run(const char *name) {
    size_t n = strlen(name);
    return n > 5 && (!strcmp(name + n - 5, "-bf16") || !strcmp(name + n - 5, "-fp16"));
}

static int fixture(const char *name, double loss[STEPS + 1]) {
    FILE *f = fopen(FIXTURES, "r");
    char n[64];
    int step, found = 0;
    double v;
    while (f && fscanf(f, "%63s %d %lf", n, &step, &v) == 3)
        if (!strcmp(n, name) && step >= 1 && step <= STEPS) loss[step] = v, found++;
    if (f) fclose(f);
    return found == STEPS;
}

static void check_fixture(const char *name, const char *dir, int cpu) {
    double want[STEPS + 1];
    if (g_write && cpu) {
        FILE *f = fopen(FIXTURES, "a");
        for (int s = 1; f && s <= STEPS; s++) fprintf(f, "%s %d %.9g\n", name, s, step_loss(dir, s));
        if (f) fclose(f);
        return;
    }
    int ok = fixture(name, want);
    CHECK(ok, "%s: %d steps in %s (test_gpu_sim --write-fixtures)", name, STEPS, FIXTURES);
    for (int s = 1; ok && s <= STEPS; s++) {
        double got = step_loss(dir, s), tol = cpu ? cpu_tol() : s == 1 ? 1e-5 : 1e-4;
        if (half_run(name)) tol = cpu ? HALF_CPU_TOL : 1e-2;
        ok = fabs(got - want[s]) <= tol * fabs(want[s]);
        CHECK(ok, "%s step %d: loss %.9g, the CPU's %.9g (%s; relative tolerance %g)", name, s, got, want[s],
              cpu ? "the CPU's fresh run against " FIXTURES : "the GPU against the CPU's", tol);
    }
    if (ok)
        printf("%s: %d steps' losses %s the CPU's shipped ones\n", name, STEPS,
               cpu && !half_run(name) ? "equal" : "within tolerance of");
}

// The evaluations run dir's rank 0 logged, as text: each "eval" record's
// step and its numbers (train_loss, loss, accuracy; not its times), a line
// each.
static void evals_of(const char *dir, char *out, size_t n) {
    char path[600];
    snprintf(path, sizeof path, "%s/metrics/rank-00000.jsonl", dir);
    char *s = tl_read_file(path, NULL), *at = s;
    size_t len = 0;
    out[0] = 0;
    while (at && (at = strstr(at, "{\"type\":\"eval\",")) != NULL) {
        char *step = strstr(at, "\"step\":"), *e = strstr(at, "\"epoch\":"), *end = strstr(at, ",\"seconds\":");
        if (!step || !e || !end) break;
        len += (size_t)snprintf(out + len, len < n ? n - len : 0, "%.*s %.*s\n", (int)strcspn(step, ","), step,
                                (int)(end - e), e);
        at = end;
    }
    free(s);
}

// The evaluations of run dirs a (the CPU's) and b (the device's): the
// metrics' "eval" records the same text, summary.json's test_loss and
// test_accuracy (the GPT's val_loss) the same bits (cJSON writes them with
// 17 digits); or (tol > 0) the same steps evaluated and the summary's
// numbers within tol (relative).
static void same_evals(const char *a, const char *b, const char *what, double tol, int min_evals) {
    static char ea[8192], eb[8192];
    char sa[700], sb[700];
    evals_of(a, ea, sizeof ea);
    evals_of(b, eb, sizeof eb);
    int na = 0;
    for (const char *p = ea; (p = strchr(p, '\n')) != NULL; p++) na++;
    CHECK(na >= min_evals, "%s: %d evaluations logged, at least %d expected", what, na, min_evals);
    if (tol == 0)
        CHECK(!strcmp(ea, eb), "%s: the device's evaluations are the CPU's:\n%s-- the device's:\n%s", what, ea, eb);
    snprintf(sa, sizeof sa, "%s/summary.json", a);
    snprintf(sb, sizeof sb, "%s/summary.json", b);
    const char *keys[] = {"test_loss", "test_accuracy", "val_loss"};
    int found = 0;
    for (int k = 0; k < 3; k++) {
        double x = tl_json_number(sa, keys[k]), y = tl_json_number(sb, keys[k]);
        if (x == -1 && y == -1) continue;
        found++;
        CHECK(tol == 0 ? x == y : fabs(x - y) <= tol * fabs(x), "%s: summary.json's %s: the device's %.17g, the CPU's "
              "%.17g (%s)", what, keys[k], y, x, tol == 0 ? "bitwise" : "within tolerance");
    }
    CHECK(found >= 1, "%s: summary.json has the evaluation's numbers", what);
    if (tol == 0) printf("%s: %d evaluations on the device, the CPU's numbers bitwise\n", what, na);
}

// summary.json's ops' scratch: made before the first step as the plan
// asked, never grown after (the steps and evaluations allocated none).
static void planned_scratch(const char *sum, const char *what) {
    CHECK(tl_json_number(sum, "scratch_bytes") > 0 && tl_json_number(sum, "scratch_allocations") == 0,
          "%s: the ops' scratch planned before the first step (%g bytes) and no call past it (%g allocations)", what,
          tl_json_number(sum, "scratch_bytes"), tl_json_number(sum, "scratch_allocations"));
}

// name (CPU) and name-dev (the simulated GPU) trained on text with the
// flags extra (a precision); their losses and weights compared: bitwise
// where the simulated GPU runs the CPU's kernels, else (tol: the
// convolutions, im2col and a GEMM against the CPU's oneDNN ones) within
// tol, and the losses at steps 1 and 20 within 1e-5 and 1e-4 (ltol 0) or
// at every step within ltol.
static void compare_runs(const char *name, const char *text, const char *what, const char *extra, double tol,
                         double ltol) {
    char dev[64], flags[600];
    snprintf(dev, sizeof dev, "%s-dev", name);
    snprintf(flags, sizeof flags, "--set train.log_every=1 --set train.eval_every=10 %s", extra);
    CHECK(tl_train(g_tmp, name, text, 1, flags, g_out, sizeof g_out) == 0, "%s on the CPU: %s", what, g_out);
    snprintf(flags, sizeof flags, "--set train.log_every=1 --set train.eval_every=10 --device cuda %s", extra);
    CHECK(tl_train(g_tmp, dev, text, 1, flags, g_out, sizeof g_out) == 0, "%s on the device: %s", what, g_out);
    char a[600], b[600], msg[128];
    snprintf(a, sizeof a, "%s", tmp(name));
    snprintf(b, sizeof b, "%s", tmp(dev));
    check_fixture(name, a, 1);
    for (int s = 1; s <= STEPS; s++) {
        if (ltol == 0 && s != 1 && s != STEPS) continue;
        snprintf(msg, sizeof msg, "%s: step %d's loss", what, s);
        CHECK_NEAR(step_loss(b, s), step_loss(a, s), ltol > 0 ? ltol : s == 1 ? 1e-5 : 1e-4, msg);
    }
    int bitwise = 0;
    double diff = tl_runs_diff(g_tmp, name, dev, &bitwise);
    if (tol == 0)
        CHECK(diff == 0 && bitwise, "%s: the simulated GPU's weights are the CPU's bitwise (its kernels are the CPU's): "
              "diff %g", what, diff);
    else
        CHECK(diff >= 0 && diff <= tol, "%s: the simulated GPU's weights within %g of the CPU's: max rel diff %g", what,
              tol, diff);
    printf("%s: the simulated GPU against the CPU after %d steps: weights' max rel diff %g\n", what, STEPS, diff);
    same_evals(a, b, what, tol, 2);
    char sum[700];
    snprintf(sum, sizeof sum, "%s/summary.json", b);
    CHECK(tl_count(sum, "\"strategy\":\t\"device\"") == 1 && tl_count(sum, "\"implementation\":\t\"sim\"") == 1 &&
              tl_json_number(sum, "weights_bytes") > 0,
          "%s: summary.json says the device and its memory by kind", what);
    CHECK(tl_json_number(sum, "reads_per_step") == 1 && tl_count(sum, "\"step_end\":\t\"device\"") == 1,
          "%s: one read from the device a step (the losses and the gradient's sum of squares together, after the "
          "update made its clipping and skip there): %g reads", what, tl_json_number(sum, "reads_per_step"));
    planned_scratch(sum, what);
    snprintf(sum, sizeof sum, "%s/metrics/rank-00000.jsonl", b);
    CHECK(tl_count(sum, "\"gpu_memory_bytes\":{\"weights\":") >= 20, "%s: every step's metrics record has the GPU's "
          "memory by kind", what);
    snprintf(sum, sizeof sum, "%s/metrics/rank-00000.jsonl", a);
    CHECK(tl_count(sum, "gpu_memory_bytes") == 0, "%s: the CPU run's records have none", what);
}

static const char cfg_mlp[] =
    "[model]\nlayer = flatten\nlayer = linear out=48\nlayer = relu\nlayer = layernorm\nlayer = linear out=24\n"
    "layer = gelu\nlayer = dropout p=0\nlayer = linear out=10\n"
    "[train]\nbatch = 16\nepochs = 1\nmax_steps = 20\nseed = 3\n";
static const char opt_adamw[] = "[optim]\nname = adamw\nlr = 0.003\nweight_decay = 0.01\nclip_norm = 0.5\n",
                  opt_sgd[] = "[optim]\nname = sgd\nlr = 0.05\nmomentum = 0.9\nnesterov = true\n";

static char cfg_mlp_full[2048], cfg_gpt[2048], cfg_cnn_full[2048];

static void test_mlp(void) {
    char text[4096];
    snprintf(text, sizeof text, "%s%s", cfg_mlp_full, opt_adamw);
    compare_runs("mlp", text, "the MLP (AdamW, clipping)", "", 0, 0);
    // the host's memory formula counts no activations: they are the GPU's
    char a[700], b[700];
    snprintf(a, sizeof a, "%s/summary.json", tmp("mlp-dev"));
    snprintf(b, sizeof b, "%s/summary.json", tmp("mlp"));
    CHECK(tl_count(a, "\"activations_bytes\":\t0,") == 1 && tl_count(b, "\"activations_bytes\":\t0,") == 0,
          "summary.json's memory.activations_bytes: 0 on the device's run (the host keeps none), not 0 on the CPU's");
    snprintf(text, sizeof text, "%s%s", cfg_mlp_full, opt_sgd);
    compare_runs("mlp-sgd", text, "the MLP (SGD, Nesterov)", "", 0, 0);
}

// The CNN (convolutions with padding and stride, max pooling, dropout p =
// 0.3 with the CPU's masks): the losses within the GPU's tolerances of the
// CPU's; its convolutions the seam's conv2d (cuDNN's on a GPU), and again
// as a GPU without cuDNN makes them (im2col and a GEMM of the device
// model's own), said in the log.
static void test_cnn(void) {
    compare_runs("cnn", cfg_cnn_full, "the CNN (conv2d, maxpool, dropout)", "", 1e-3, 0);
    CHECK(!strstr(g_out, "as im2col and a GEMM"), "the CNN's convolutions by the seam's conv2d:\n%s", g_out);
    setenv("DTRAIN_GPU_SIM_CONV", "im2col", 1);
    int rc = tl_train(g_tmp, "cnn-im2col", cfg_cnn_full, 1, "--device cuda", g_out, sizeof g_out);
    unsetenv("DTRAIN_GPU_SIM_CONV");
    int bw = 0;
    double diff = rc == 0 ? tl_runs_diff(g_tmp, "cnn", "cnn-im2col", &bw) : -1;
    CHECK(rc == 0 && diff >= 0 && diff <= 1e-3 &&
              strstr(g_out, "the device's convolutions as im2col and a GEMM (slower, more memory): no cuDNN "
                     "(DTRAIN_GPU_SIM_CONV=im2col)"),
          "the CNN without cuDNN: im2col and a GEMM, said; weights within 1e-3 of the CPU's: exit %d, diff %g\n%s", rc,
          diff, g_out);
}

// [train] attention: the tiny GPT's heads (8 columns) on the GEMM plan
// (its probabilities kept: B NH T T floats a layer more) train to the
// CPU's weights bitwise (the simulated GPU's attention is the CPU's either
// way; the plan's own kernels are test_gpu_emu's and test_gpu's), and
// summary.json says which; fused asked for heads the fused kernels do not
// take is refused at the start, naming them.
static void attention_choice(void) {
    char sum[700], fused[700];
    int rc = tl_train(g_tmp, "gpt-gemm", cfg_gpt, 1, "--device cuda --set train.attention=gemm", g_out, sizeof g_out),
        bw = 0;
    double diff = tl_runs_diff(g_tmp, "gpt", "gpt-gemm", &bw);
    snprintf(sum, sizeof sum, "%s/summary.json", tmp("gpt-gemm"));
    snprintf(fused, sizeof fused, "%s/summary.json", tmp("gpt-dev"));
    double more = tl_json_number(sum, "activations_bytes") - tl_json_number(fused, "activations_bytes");
    CHECK(rc == 0 && diff == 0 && bw && tl_count(sum, "\"attention\":\t\"gemm\"") == 1 &&
              tl_count(fused, "\"attention\":\t\"fused\"") == 1,
          "attention = gemm: the CPU's weights bitwise, summary.json says gemm (and fused by default): exit %d, diff "
          "%g\n%s", rc, diff, g_out);
    // (2 layers of B 6 x NH 2 x T 8 rows: T floats a row kept, 3072 bytes, instead of a log-sum-exp, 384 bytes
    // taken as 512: the arena's takes start on 256 bytes)
    CHECK(more == 2 * (3072 - 512), "attention = gemm keeps each layer's probabilities: %g bytes of activations more "
          "than the fused kernels' (want %d)", more, 2 * (3072 - 512));
    rc = tl_train(g_tmp, "gpt-wide", cfg_gpt, 1, "--device cuda --set train.attention=fused --set model.n_head=1 "
                  "--set model.n_embd=160", g_out, sizeof g_out);
    CHECK(rc == 1 && strstr(g_out, "[train] attention = fused: heads of 160 columns (n_embd 160 / n_head 1); the fused "
                            "kernels take heads of up to 128"),
          "attention = fused with heads of 160: refused, naming them (exit %d)\n%s", rc, g_out);
}

// The head over a padded vocabulary (32 tokens, 40 rows of wte): on the
// device the logits' rows 40 apart (head_ld), the padding's columns neither
// written nor read; fp32 and bf16 bitwise the CPU's (its rows 32 apart).
static void padded_head(void) {
    const char *prec[] = {"", "--precision bf16"};
    for (int i = 0; i < 2; i++) {
        char a[64], b[64], flags[300];
        snprintf(a, sizeof a, "gpt-pad%d", i);
        snprintf(b, sizeof b, "gpt-pad%d-dev", i);
        snprintf(flags, sizeof flags, "--set model.padded_vocab_size=40 %s", prec[i]);
        CHECK(tl_train(g_tmp, a, cfg_gpt, 1, flags, g_out, sizeof g_out) == 0, "padded head on the CPU: %s", g_out);
        snprintf(flags, sizeof flags, "--set model.padded_vocab_size=40 --device cuda %s", prec[i]);
        CHECK(tl_train(g_tmp, b, cfg_gpt, 1, flags, g_out, sizeof g_out) == 0, "padded head on the device: %s", g_out);
        int bitwise = 0;
        double diff = tl_runs_diff(g_tmp, a, b, &bitwise);
        CHECK(diff == 0 && bitwise, "a tiny GPT's head over a padded vocabulary%s: the simulated GPU's weights are the "
              "CPU's bitwise: diff %g", i ? " in bf16" : "", diff);
    }
}

static void test_gpt(void) {
    compare_runs("gpt", cfg_gpt, "a tiny GPT", "", 0, 0);
    padded_head();
    char cmd[2048];
    // the device run's weights evaluated (on the CPU): the CPU run's numbers
    snprintf(cmd, sizeof cmd, "%s eval %s --checkpoint %s 2>&1", tl_dtrain(), tmp("gpt.ini"),
             tmp("gpt-dev/model.safetensors"));
    char out2[4096];
    int rc = tl_run(cmd, g_out, sizeof g_out);
    snprintf(cmd, sizeof cmd, "%s eval %s --checkpoint %s 2>&1", tl_dtrain(), tmp("gpt.ini"), tmp("gpt/model.safetensors"));
    int rc2 = tl_run(cmd, out2, sizeof out2);
    CHECK(rc == 0 && rc2 == 0 && !strcmp(g_out, out2), "dtrain eval reads the device run's weights: exit %d\n%s\n%s",
          rc, g_out, out2);
    attention_choice();
}

// A run that diverges (SGD with momentum 0.99 at lr 1000): on the device
// the NaN loss, summed there and read at the step's end, stops the run at
// the CPU's step with its words.
static void diverged(void) {
    char text[4096], out2[4096];
    snprintf(text, sizeof text, "%s[optim]\nname = sgd\nlr = 1000\nmomentum = 0.99\n[schedule]\nname = constant\n",
             cfg_mlp_full);
    const char *more = "--set train.batch=4 --set train.max_steps=100";
    int a = tl_train(g_tmp, "nan-cpu", text, 1, more, out2, sizeof out2);
    char flags[200];
    snprintf(flags, sizeof flags, "%s --device cuda", more);
    int b = tl_train(g_tmp, "nan-dev", text, 1, flags, g_out, sizeof g_out);
    const char *sa = strstr(out2, "step "), *sb = strstr(g_out, "step ");
    CHECK(a == 1 && b == 1 && sa && sb && atoi(sa + 5) == atoi(sb + 5) && strstr(g_out, "the loss is NaN (diverged"),
          "a diverging run on the device stops at the CPU's step, naming the NaN loss: exit %d and %d\n%s\n%s", a, b,
          out2, g_out);
}

// Several micro-batches a step: their losses summed on the device, read
// with the norm in the step's one read; the runs bitwise the CPU's.
static void one_read(void) {
    const char *rows[][3] = {{"gpt", "--set train.grad_accum=3", "a tiny GPT, 3 micro-batches a step"},
                             {"mlp", "--set train.grad_accum=4", "the MLP, 4 micro-batches a step"}};
    for (int i = 0; i < 2; i++) {
        char text[4096], a[64], b[64], flags[300], sum[700], suma[700];
        snprintf(text, sizeof text, "%s%s", i ? cfg_mlp_full : cfg_gpt, i ? opt_adamw : "");
        snprintf(a, sizeof a, "%s-accum", rows[i][0]);
        snprintf(b, sizeof b, "%s-accum-dev", rows[i][0]);
        CHECK(tl_train(g_tmp, a, text, 1, rows[i][1], g_out, sizeof g_out) == 0, "%s on the CPU: %s", rows[i][2], g_out);
        snprintf(flags, sizeof flags, "%s --device cuda", rows[i][1]);
        CHECK(tl_train(g_tmp, b, text, 1, flags, g_out, sizeof g_out) == 0, "%s on the device: %s", rows[i][2], g_out);
        int bitwise = 0;
        double diff = tl_runs_diff(g_tmp, a, b, &bitwise);
        snprintf(sum, sizeof sum, "%s/%s/summary.json", g_tmp, b);
        snprintf(suma, sizeof suma, "%s/%s/summary.json", g_tmp, a);
        CHECK(diff == 0 && bitwise && tl_json_number(sum, "reads_per_step") == 1 &&
                  tl_json_number(sum, "final_train_loss") == tl_json_number(suma, "final_train_loss"),
              "%s: the CPU's weights and losses bitwise, one read a step: diff %g, %g reads a step", rows[i][2], diff,
              tl_json_number(sum, "reads_per_step"));
    }
}

// A model's config text: "mlp" (AdamW, clipping), "mlp-sgd" (Nesterov),
// "gpt", "cnn".
static const char *model_text(const char *model, char *buf, size_t n) {
    if (!strcmp(model, "gpt")) return cfg_gpt;
    if (!strcmp(model, "cnn")) return cfg_cnn_full;
    snprintf(buf, n, "%s%s", cfg_mlp_full, strcmp(model, "mlp") ? opt_sgd : opt_adamw);
    return buf;
}

// The runs in bf16 and fp16 (fp32 master weights and optimizer state, the
// GEMMs' and the attention's products on 16-bit operands; fp16 with the
// dynamic loss scaler): the simulated GPU against the CPU in the same
// precision, bitwise where its kernels are the CPU's (the MLP, the GPT: its
// 16-bit GEMM is dt_sgemm's in that precision), the CNN within tolerances
// (im2col and a 16-bit GEMM against oneDNN's bf16 convolutions: sums in
// another order move an operand across a bf16 rounding boundary now and
// then; every step's loss within 1e-3 relative, measured within 4e-4; the
// weights within 0.1 of each tensor's largest, measured 0.065, as AdamW's
// normalised steps make small gradients' differences lr-sized, where bf16
// and fp32 on the CPU differ by 0.12). Their CPU losses are shipped for the
// GPU machine (on_gpu).
static const struct {
    const char *name, *model, *extra, *what;
    double tol, ltol;  // compare_runs's
} half_rows[] = {
    {"mlp-bf16", "mlp", "--precision bf16", "the MLP in bf16", 0, 0},
    {"gpt-bf16", "gpt", "--precision bf16", "a tiny GPT in bf16", 0, 0},
    {"cnn-bf16", "cnn", "--precision bf16", "the CNN in bf16", 0.1, 1e-3},
    {"mlp-fp16", "mlp-sgd", "--precision fp16", "the MLP in fp16 (SGD, loss scaling)", 0, 0},
    {"gpt-fp16", "gpt", "--precision fp16", "a tiny GPT in fp16 (loss scaling)", 0, 0},
};

static void test_half(void) {
    char text[4096], sum[700], want[64];
    for (size_t i = 0; i < sizeof half_rows / sizeof *half_rows; i++) {
        compare_runs(half_rows[i].name, model_text(half_rows[i].model, text, sizeof text), half_rows[i].what,
                     half_rows[i].extra, half_rows[i].tol, half_rows[i].ltol);
        snprintf(sum, sizeof sum, "%s-dev/summary.json", tmp(half_rows[i].name));
        snprintf(want, sizeof want, "\"gemm_operands\":\t\"%s\"", strstr(half_rows[i].extra, "bf16") ? "bf16" : "fp16");
        CHECK(tl_count(sum, want) == 1, "%s: summary.json says the GEMMs' operands: %s", half_rows[i].what, want);
    }
}

// fp16's loss scaler on the device: an overflow at step 5 (DTRAIN_FAULT_OVERFLOW
// puts an inf among the device's gradients, read back with the sum of
// squares; in a pipeline rank 0 says it saw one) skips the step and halves
// the scale, as on the CPU: the same weights bitwise, one skipped step and
// a scale of 2^15 in the summaries. Then each run's checkpoint of step 10
// (the scaler in it) resumed on the other: the uninterrupted run's
// weights, scale and count. On one worker, and in 2 pipeline stages
// (their update on the device).
static void fp16_skip(const char *tag, int W, const char *layout) {
    char text[4096], ck[4096], flags[1200], name[4][64], ref[64];
    snprintf(ck, sizeof ck, "%s[checkpoint]\nevery_steps = 10\n", model_text("gpt", text, sizeof text));
    const char *what[] = {"cpu", "dev", "from-dev", "from-cpu"}, *dev[] = {"", "--device cuda", "", "--device cuda"};
    for (int i = 0; i < 4; i++) snprintf(name[i], sizeof name[i], "skip%s-%s", tag, what[i]);
    snprintf(ref, sizeof ref, "%s", name[0]);
    setenv("DTRAIN_FAULT_OVERFLOW", "0:5", 1);
    for (int i = 0; i < 4; i++) {
        int k = snprintf(flags, sizeof flags, "--precision fp16 %s %s", layout, dev[i]);
        if (i >= 2) {
            char from[300];
            snprintf(from, sizeof from, "%s/checkpoints/step-00000010%s", name[i == 2 ? 1 : 0],
                     W > 1 ? "" : ".safetensors");  // (several ranks: a directory of shards)
            snprintf(flags + k, sizeof flags - k, " --set checkpoint.resume=%s", tmp(from));
        }
        int rc = tl_train(g_tmp, name[i], ck, W, flags, g_out, sizeof g_out);
        CHECK(rc == 0, "fp16 with an overflow at step 5, %s: exit %d\n%s", name[i], rc, g_out);
        char sum[700];
        snprintf(sum, sizeof sum, "%s/summary.json", tmp(name[i]));
        CHECK(tl_json_number(sum, "skipped_steps") == 1 && tl_json_number(sum, "loss_scale") == 32768,
              "fp16, %s: one step skipped, the scale halved to 32768: skipped %g, scale %g", name[i],
              tl_json_number(sum, "skipped_steps"), tl_json_number(sum, "loss_scale"));
        if (i == 0) continue;
        int bw = 0;
        double diff = tl_runs_diff(g_tmp, ref, name[i], &bw);
        CHECK(diff == 0 && bw, "fp16, a step skipped: %s's weights are the CPU's uninterrupted run's bitwise (diff %g)",
              name[i], diff);
    }
    unsetenv("DTRAIN_FAULT_OVERFLOW");
}

static void test_fp16_skip(void) {
    fp16_skip("", 1, "");
    fp16_skip("-pp", 2, "--set parallel.pipeline=2");
}

// A checkpoint of the device resumed on the CPU, and the other way: the
// uninterrupted run's weights bitwise.
// A checkpoint across devices: cfg (with [checkpoint] every_steps = 10
// added) on W ranks with flags, on the device (P-dev) and on the CPU
// (P-cpu); each one's step-10 checkpoint (file: a step's path below
// checkpoints/) resumed by the other side (P-from-dev, P-from-cpu). The
// uninterrupted CPU run's weights, bitwise, for the device's run and both
// resumed ones; the two runs' step-`step` checkpoint files (shards: 0 for
// a whole file) hold the same tensors bitwise (the metadata names the run
// and its config, which differ).
static void crosswise(const char *P, const char *extra, int W, const char *flags, const char *file, int step,
                      int shards) {
    char ck[4096], f[1200], run[4][64], a[700], b[700];
    const char *side[4] = {"dev", "cpu", "from-dev", "from-cpu"};
    for (int i = 0; i < 4; i++) snprintf(run[i], sizeof run[i], "%s-%s", P, side[i]);
    snprintf(ck, sizeof ck, "%s%s[checkpoint]\nevery_steps = 10\n", cfg_gpt, extra);
    snprintf(f, sizeof f, "%s --device cuda", flags);
    CHECK(tl_train(g_tmp, run[0], ck, W, f, g_out, sizeof g_out) == 0, "%s: on the device: %s", P, g_out);
    CHECK(tl_train(g_tmp, run[1], ck, W, flags, g_out, sizeof g_out) == 0, "%s: on the CPU: %s", P, g_out);
    for (int i = 2; i < 4; i++) {  // (the device's checkpoint on the CPU, the CPU's on the device)
        snprintf(f, sizeof f, "%s%s --set checkpoint.resume=%s/%s/checkpoints/%s", flags, i == 3 ? " --device cuda" : "",
                 g_tmp, run[i - 2], file);
        CHECK(tl_train(g_tmp, run[i], ck, W, f, g_out, sizeof g_out) == 0, "%s: %s: %s", P, run[i], g_out);
    }
    for (int i = 0; i < 4; i++) {
        int bw = 0;
        double d = i == 1 ? 0 : tl_runs_diff(g_tmp, run[1], run[i], &bw);
        CHECK(i == 1 || (d == 0 && bw), "%s x %d %s: %s, the uninterrupted CPU run's weights bitwise (diff %g)", P, W,
              flags, run[i], d);
    }
    for (int r = 0; r < (shards ? shards : 1); r++) {
        char name[80];
        if (shards) snprintf(name, sizeof name, "step-%08d/shard-%05d-of-%05d.safetensors", step, r, shards);
        else snprintf(name, sizeof name, "step-%08d.safetensors", step);
        snprintf(a, sizeof a, "%s/%s/checkpoints/%s", g_tmp, run[0], name);
        snprintf(b, sizeof b, "%s/%s/checkpoints/%s", g_tmp, run[1], name);
        int same = 0;
        double d = tl_weights_diff(a, b, &same);
        CHECK(d == 0 && same, "%s: the device's checkpoint %s holds the CPU's tensors bitwise (%g)", P, name, d);
    }
}

// Checkpoint a resumed with flags fa and checkpoint b with fb (below
// g_tmp), on W workers (runs name-a, name-b): the same weights, bitwise.
static void same_resumed(const char *name, const char *ck, int W, const char *fa, const char *a, const char *fb,
                         const char *b) {
    char f[1200], run[2][80];
    const char *from[2] = {a, b}, *flags[2] = {fa, fb};
    for (int i = 0; i < 2; i++) {
        snprintf(run[i], sizeof run[i], "%s-%c", name, 'a' + i);
        snprintf(f, sizeof f, "%s --set checkpoint.resume=%s/%s", flags[i], g_tmp, from[i]);
        CHECK(tl_train(g_tmp, run[i], ck, W, f, g_out, sizeof g_out) == 0, "%s: %s: %s", name, run[i], g_out);
    }
    int bw = 0;
    double d = tl_runs_diff(g_tmp, run[0], run[1], &bw);
    CHECK(d == 0 && bw, "%s: %s (%s) and %s (%s) on %d workers resumed to the same weights bitwise (diff %g)", name, a,
          fa, b, fb, W, d);
}

// One process: a device checkpoint resumed on the CPU and the other way;
// then under the CPU's other layouts: the device's step-10 checkpoint on 2
// CPU workers in a pipeline of 2 stages, in tensor shards, under ZeRO 3, as
// the CPU's own is; and a checkpoint the CPU wrote in a pipeline of 2
// stages (a shard a stage) on the device, as on one CPU process.
static void test_resume(void) {
    crosswise("ck", "", 1, "", "step-00000010.safetensors", 20, 0);
    char ck[4096];
    snprintf(ck, sizeof ck, "%s[checkpoint]\nevery_steps = 10\n", cfg_gpt);
    const char *layouts[] = {"--set parallel.pipeline=2", "--set parallel.tensor=2", "--zero 3"};
    for (int i = 0; i < 3; i++) {
        char name[32];
        snprintf(name, sizeof name, "layout%d", i);
        same_resumed(name, ck, 2, layouts[i], "ck-dev/checkpoints/step-00000010.safetensors", layouts[i],
                     "ck-cpu/checkpoints/step-00000010.safetensors");
    }
    CHECK(tl_train(g_tmp, "ckpp-cpu", ck, 2, "--set parallel.pipeline=2", g_out, sizeof g_out) == 0,
          "a pipeline of 2 stages on the CPU, checkpoints: %s", g_out);
    same_resumed("from-pp", ck, 1, "--device cuda", "ckpp-cpu/checkpoints/step-00000010", "",
                 "ckpp-cpu/checkpoints/step-00000010");
}

// ---- several ranks on the device ------------------------------------------------

// Rows of {model, workers, flags, the reference's workers}: the row's run on
// the simulated GPU (its ranks share cuda:0, so their gradients are staged
// through host memory) against the CPU's run with the same flags on as many
// workers, and, where ref1 is set, against one CPU process; bitwise (the
// simulated GPU's kernels are the CPU's, and both sum the ranks' gradients
// with the host's communicator in rank order, or in deterministic mode as
// integers).
typedef struct {
    const char *model;  // "mlp" (AdamW, clipping) or "gpt"
    int workers;
    const char *flags;
    int ref1;           // also bitwise one CPU process (deterministic mode)
} dev_row;

static const dev_row dev_rows[] = {
    {"mlp", 2, "", 0},
    {"mlp", 2, "--set parallel.bucket_kb=4", 0},  // (buckets summed during backward: buckets_said)
    {"mlp", 3, "--set train.grad_accum=2", 0},
    {"gpt", 2, "", 0},
    {"gpt", 3, "--set parallel.bucket_kb=4", 0},
    {"mlp", 2, "--deterministic", 1},
    {"mlp", 3, "--deterministic --set parallel.bucket_kb=4", 1},
    {"gpt", 2, "--deterministic", 1},
    {"gpt", 3, "--deterministic", 1},
    {"gpt", 2, "--precision bf16", 0},
    {"mlp", 2, "--precision fp16", 0},
    {"mlp", 3, "--deterministic --precision bf16", 1},
    // ZeRO stage 1: each rank's slice reduced to it, the norm sharded, the
    // slices broadcast after the update (engine/strategies/device.c)
    {"mlp", 2, "--zero 1", 0},
    {"mlp", 3, "--zero 1 --set train.grad_accum=2", 0},
    {"gpt", 2, "--zero 1", 0},
    {"gpt", 3, "--zero 1 --set parallel.bucket_kb=4", 0},
    {"mlp", 3, "--deterministic --zero 1", 1},
    {"gpt", 2, "--deterministic --zero 1", 1},
    {"gpt", 3, "--deterministic --zero 1 --set parallel.bucket_kb=4", 1},
    {"gpt", 2, "--zero 1 --precision bf16", 0},
    {"mlp", 2, "--zero 1 --precision fp16", 0},
    // gradients summed in 16 bits: each bucket rounded on the device (with
    // error feedback under a method), one allreduce in that type, widened
    // back: the CPU's codec (engine/codecs/cast.c), whose pieces are cut
    // otherwise (the GPT's by its gradient order, from the block's end)
    {"mlp", 2, "--set parallel.grad_dtype=bf16", 0},
    {"gpt", 2, "--set parallel.grad_dtype=bf16", 0},
    {"gpt", 3, "--set parallel.grad_dtype=bf16 --set parallel.bucket_kb=4", 0},
    {"mlp", 2, "--set compression.method=fp16", 0},
    {"gpt", 2, "--set compression.method=bf16 --set parallel.bucket_kb=4", 0},
    {"mlp", 3, "--set compression.method=bf16 --set train.grad_accum=2", 0},
    {"gpt", 2, "--set compression.method=fp16 --precision bf16", 0},
    // ZeRO's slices reduced in bf16 (zero.c's grad_dtype)
    {"mlp", 2, "--zero 1 --set parallel.grad_dtype=bf16", 0},
    {"gpt", 3, "--zero 1 --set parallel.grad_dtype=bf16 --set parallel.bucket_kb=4", 0},
    // ZeRO stage 2: stage 1's exchange, the gradients backed on demand and
    // each piece another rank owns given back once reduced (zero2_memory)
    {"mlp", 2, "--zero 2", 0},
    {"mlp", 3, "--zero 2 --set train.grad_accum=2 --set parallel.bucket_kb=4", 0},
    {"gpt", 3, "--zero 2 --set parallel.bucket_kb=4", 0},
    {"mlp", 3, "--deterministic --zero 2 --set parallel.bucket_kb=4", 1},
    {"gpt", 2, "--zero 2 --precision bf16 --set parallel.grad_dtype=bf16 --set parallel.bucket_kb=4", 0},
    // ZeRO stage 3: stage 2, and each layer's parameters gathered before its
    // forward and backward, evaluations too (zero3_memory)
    {"mlp", 2, "--zero 3", 0},
    {"mlp", 3, "--zero 3 --set train.grad_accum=2 --set parallel.bucket_kb=4", 0},
    {"gpt", 3, "--zero 3 --set parallel.bucket_kb=4", 0},
    {"mlp", 3, "--deterministic --zero 3 --set parallel.bucket_kb=4", 1},
    {"gpt", 2, "--deterministic --zero 3", 1},
    {"gpt", 2, "--zero 3 --set parallel.grad_dtype=bf16", 0},
    {"gpt", 3, "--zero 3 --precision bf16 --set parallel.bucket_kb=4", 0},
    {"mlp", 2, "--zero 3 --precision fp16", 0},
    // the epoch's last batch (step 20 of 400 samples in batches of 21) is
    // one sample: two ranks have none, their buckets zeros (backed where no
    // backward wrote), at stage 3 their gathers those of the busiest
    {"mlp", 3, "--zero 2 --set train.batch=21 --set parallel.bucket_kb=4", 0},
    {"mlp", 3, "--zero 3 --set train.batch=21 --set parallel.bucket_kb=4", 0},
    // a pipeline's stages on the device, the update on the host
    // (engine/strategies/pipeline.c): 1f1b, gpipe and interleaved, with
    // data parallel and ZeRO 1 outside, deterministic, in bf16, the MLP and
    // the GPT (its tied embedding on both end stages); evaluations gather
    // the other stages' layers onto the device
    {"mlp", 2, "--set parallel.pipeline=2 --set parallel.pipeline_balance=flops", 0},
    {"mlp", 4, "--set parallel.pipeline=2 --set parallel.pipeline_split=3,5 --set parallel.schedule=gpipe "
               "--set parallel.micro_batches=4", 0},
    {"mlp", 3, "--set parallel.pipeline=3 --set parallel.pipeline_balance=count --set parallel.micro_batches=5", 0},
    {"mlp", 2, "--set parallel.pipeline=2 --set parallel.schedule=interleaved --set parallel.virtual_stages=2 "
               "--set parallel.pipeline_balance=count", 0},
    {"mlp", 4, "--zero 1 --set parallel.pipeline=2 --set parallel.pipeline_balance=flops", 0},
    {"mlp", 4, "--deterministic --set parallel.pipeline=2 --set parallel.pipeline_balance=flops", 0},
    {"mlp", 2, "--precision bf16 --set parallel.pipeline=2 --set parallel.pipeline_balance=flops", 0},
    {"mlp", 2, "--precision fp16 --set parallel.pipeline=2 --set parallel.pipeline_balance=flops", 0},
    {"gpt", 2, "--set parallel.pipeline=2", 0},
    {"gpt", 4, "--set parallel.pipeline=2 --set parallel.schedule=gpipe --set parallel.micro_batches=3", 0},
    {"gpt", 4, "--zero 1 --set parallel.pipeline=2", 0},
    {"gpt", 2, "--deterministic --set parallel.pipeline=2 --set parallel.micro_shards=6", 0},
    {"gpt", 2, "--precision bf16 --set parallel.pipeline=2", 0},
    // a sequential model's tensor parallel: its shards' sums through the
    // host (the task's), alone, with data parallel, with a pipeline
    {"mlp", 2, "--set parallel.tensor=2", 0},
    {"mlp", 4, "--set parallel.tensor=2", 0},
    {"mlp", 4, "--set parallel.tensor=2 --set parallel.pipeline=2 --set parallel.pipeline_balance=flops", 0},
    {"mlp", 2, "--precision bf16 --set parallel.tensor=2", 0},
    // the GPT's: its heads, MLP units and vocabulary rows split, the
    // embedding and the loss vocabulary-parallel (with a padded vocabulary
    // of 96, shard 1's head holds no column of the 32 words)
    {"gpt", 2, "--set parallel.tensor=2", 0},
    {"gpt", 4, "--set parallel.tensor=2 --set parallel.pipeline=2", 0},
    {"gpt", 4, "--set parallel.tensor=2", 0},
    {"gpt", 2, "--set parallel.tensor=2 --set model.padded_vocab_size=96", 0},
    {"gpt", 2, "--precision bf16 --set parallel.tensor=2", 0},
    {"gpt", 2, "--deterministic --set parallel.tensor=2 --set parallel.micro_shards=6", 0},
    // sequence parallel: the stream, the layernorms and the residual adds
    // divided along the tokens, the shards' rows gathered before each
    // column-parallel linear and reduce-scattered after each row-parallel
    // one (fp32, bf16; with a pipeline: the stream between stages the
    // shard's rows; with data parallel)
    {"gpt", 2, "--set parallel.tensor=2 --set parallel.sequence=true", 0},
    {"gpt", 2, "--precision bf16 --set parallel.tensor=2 --set parallel.sequence=true", 0},
    {"gpt", 4, "--set parallel.tensor=2 --set parallel.pipeline=2 --set parallel.sequence=true", 0},
    {"gpt", 4, "--set parallel.tensor=2 --set parallel.sequence=true", 0},
};

// The index of dev_rows' row {model, workers, flags}.
static size_t dev_row_of(const char *model, int workers, const char *flags) {
    size_t i = 0;
    while (i < sizeof dev_rows / sizeof *dev_rows &&
           (strcmp(dev_rows[i].model, model) || dev_rows[i].workers != workers || strcmp(dev_rows[i].flags, flags)))
        i++;
    CHECK(i < sizeof dev_rows / sizeof *dev_rows, "dev_rows has {%s, %d, %s}", model, workers, flags);
    return i;
}

// The device's memory under ZeRO (summary.json, rank 0's): the optimizer
// state of its slice, 1/W of the replicated run's (each of AdamW's two
// state blocks aligned to 256 bytes in the arena), the rest unchanged.
static void zero_memory(void) {
    struct {
        const char *model;
        int workers;
    } z[] = {{"gpt", 2}, {"gpt", 3}, {"mlp", 2}};
    const char *rflags[] = {"", "--set parallel.bucket_kb=4", ""},
               *zflags[] = {"--zero 1", "--zero 1 --set parallel.bucket_kb=4", "--zero 1"};
    for (int i = 0; i < 3; i++) {
        char a[700], b[700];
        snprintf(a, sizeof a, "%s/row%zu-dev/summary.json", g_tmp, dev_row_of(z[i].model, z[i].workers, rflags[i]));
        snprintf(b, sizeof b, "%s/row%zu-dev/summary.json", g_tmp, dev_row_of(z[i].model, z[i].workers, zflags[i]));
        double full = tl_json_number(a, "optimizer_state_bytes"), mine = tl_json_number(b, "optimizer_state_bytes");
        CHECK(full > 0 && mine > 0 && fabs(mine * z[i].workers - full) <= 2 * 256 * z[i].workers &&
                  tl_json_number(a, "weights_bytes") == tl_json_number(b, "weights_bytes") &&
                  tl_json_number(a, "gradients_bytes") == tl_json_number(b, "gradients_bytes") &&
                  tl_count(b, "\"strategy\":\t\"device-zero\"") == 1,
              "%s x %d --zero 1 on the device: the optimizer state %g bytes, 1/%d of the replicated %g; the weights "
              "and gradients as replicated; strategy device-zero", z[i].model, z[i].workers, mine, z[i].workers, full);
        printf("%s x %d: the device's optimizer state %g bytes under --zero 1, %g replicated\n", z[i].model,
               z[i].workers, mine, full);
    }
}

// Sequence parallel's memory on the device (rank 0's summary.json): the
// GPT's activations in 2 tensor shards smaller with it (the stream, the
// layernorms and the residual adds a shard's half of the rows) than
// without, beside the same weights.
static void sequence_memory(void) {
    char a[700], b[700];
    snprintf(a, sizeof a, "%s/row%zu-dev/summary.json", g_tmp, dev_row_of("gpt", 2, "--set parallel.tensor=2"));
    snprintf(b, sizeof b, "%s/row%zu-dev/summary.json", g_tmp,
             dev_row_of("gpt", 2, "--set parallel.tensor=2 --set parallel.sequence=true"));
    double whole = tl_json_number(a, "activations_bytes"), seq = tl_json_number(b, "activations_bytes");
    CHECK(whole > 0 && seq > 0 && seq < whole && tl_json_number(a, "weights_bytes") == tl_json_number(b, "weights_bytes"),
          "the GPT in 2 tensor shards on the device: activations %g bytes with sequence parallel, %g without; the same "
          "weights", seq, whole);
    printf("the GPT in 2 tensor shards on the device: activations %g bytes with sequence parallel, %g without\n", seq,
           whole);
}

// Model parallel's run on the device: summary.json says the stages ran
// there, their activations beside the arena, the update there (with the
// optimizer's state), and the streams between stages, the gradients' sums
// and a tensor-parallel shard's sums on the GPUs' communicators: NCCL
// where each rank has a simulated GPU of its own (dir's run on the fake
// NCCL, 3 GPUs), else staged through host memory (streams: none without
// stages; shards: absent without shards); and on NCCL one read from the
// device a step.
static void pipeline_said(const char *dir, const dev_row *r) {
    char sum[700], streams[64], shards[64], sums[64];
    const char *way = strstr(dir, "-nccl") && r->workers <= 3 ? "nccl" : "staging";
    snprintf(sum, sizeof sum, "%s/summary.json", dir);
    snprintf(streams, sizeof streams, "\"streams\":\t\"%s\"", strstr(r->flags, "pipeline=") ? way : "none");
    snprintf(shards, sizeof shards, "\"shards\":\t\"%s\"", way);
    snprintf(sums, sizeof sums, "\"sums\":\t\"%s\"", way);
    int tensor = strstr(r->flags, "tensor=") != NULL;
    CHECK(tl_count(sum, "\"strategy\":\t\"model-parallel\"") == 1 && tl_count(sum, "\"implementation\":\t\"sim\"") == 1 &&
              tl_count(sum, "\"update\":\t\"device\"") == 1 && tl_json_number(sum, "activations_bytes") > 0 &&
              tl_json_number(sum, "optimizer_state_bytes") > 0 && tl_count(sum, streams) == 1 &&
              tl_count(sum, sums) == 1 && tl_count(sum, "\"shards\"") == tensor && (!tensor || tl_count(sum, shards) == 1),
          "%s x %d %s: summary.json says the stages ran on the device, the update there, the streams %s, the "
          "gradients' sums %s, the shards' sums %s", r->model, r->workers, r->flags, streams, sums,
          tensor ? shards : "none");
    // (on NCCL one read from the device a step: the losses and the norm's pieces; staged, the copies add theirs)
    double reads = tl_json_number(sum, "reads_per_step");
    CHECK(strcmp(way, "nccl") ? reads >= 1 : reads == 1, "%s x %d %s (%s): %g reads from the device a step", r->model,
          r->workers, r->flags, way, reads);
}

// summary.json's buckets (rank 0's, over the 20 steps): plain data
// parallel (in fp32 or 16 bits, ZeRO's and deterministic mode's too) sums
// each as soon as backward has queued its gradients' kernels
// (engine/strategies/device.c's grad hook), the rest after backward. The MLP's 39202 gradients in buckets of 1024 from the block's
// end: the last bucket is final once the two last linears and the
// layernorm are (before the first layer's backward), 38 more with the first
// layer; in one bucket, with the first layer. The GPT's 8768 (wte's 128
// rows, the vocabulary padded, first) in its gradient order: 9 buckets, 6
// final before the embedding's backward, 3 with it (wte, wpe and layer 0's
// first 448). Deterministic mode's int64 sums: the same buckets (cut in
// fp32 elements).
static void buckets_said(const char *dir, const dev_row *r) {
    static const struct {
        const char *model;
        int workers;
        const char *flags;
        double in, after;
    } want[] = {
        {"mlp", 2, "", 0, 20},
        {"mlp", 2, "--set parallel.bucket_kb=4", 20, 760},
        {"gpt", 3, "--set parallel.bucket_kb=4", 120, 60},
        {"gpt", 2, "--precision bf16", 0, 20},
        {"mlp", 3, "--deterministic --set parallel.bucket_kb=4", 20, 760},
        // the 16-bit exchange's buckets: the same (cut in fp32 elements)
        {"gpt", 3, "--set parallel.grad_dtype=bf16 --set parallel.bucket_kb=4", 120, 60},
        {"gpt", 2, "--set compression.method=bf16 --set parallel.bucket_kb=4", 120, 60},
        // ZeRO's: each piece reduced to its slice's owner, the same buckets
        {"gpt", 3, "--zero 1 --set parallel.bucket_kb=4", 120, 60},
        {"gpt", 3, "--zero 1 --set parallel.grad_dtype=bf16 --set parallel.bucket_kb=4", 120, 60},
        {"gpt", 3, "--zero 2 --set parallel.bucket_kb=4", 120, 60},
    };
    if (strstr(r->flags, "pipeline=") || strstr(r->flags, "tensor="))  // (no buckets: the strategy sums its kept ranges)
        return pipeline_said(dir, r);
    char sum[700];
    snprintf(sum, sizeof sum, "%s/summary.json", dir);
    double in = tl_json_number(sum, "buckets_in_backward"), after = tl_json_number(sum, "buckets_after_backward");
    CHECK(in + after > 0, "%s x %d %s: its buckets counted (%g during backward, %g after)", r->model, r->workers,
          r->flags, in, after);
    for (size_t i = 0; i < sizeof want / sizeof *want; i++)
        if (!strcmp(want[i].model, r->model) && want[i].workers == r->workers && !strcmp(want[i].flags, r->flags))
            CHECK(in == want[i].in && after == want[i].after, "%s x %d %s (%s): %g buckets begun during backward, %g "
                  "after (want %g, %g)", r->model, r->workers, r->flags, dir, in, after, want[i].in, want[i].after);
}

// --trace shows the device's buckets on the communication row: the MLP on
// 2 ranks in buckets of 4 KiB, each rank's 38 full buckets a step (1024
// floats: 8192 bytes sent and received) over 20 steps; how many began
// inside their step's backward is printed (timing, not asserted).
static void trace_buckets(void) {
    char text[4096], flags[700], path[600];
    snprintf(path, sizeof path, "%s", tmp("buckets.trace.json"));
    snprintf(flags, sizeof flags, "--set parallel.bucket_kb=4 --device cuda --trace %s", path);
    int rc = tl_train(g_tmp, "traced", model_text("mlp", text, sizeof text), 2, flags, g_out, sizeof g_out);
    int n = tl_count(path, "\"cat\":\"comm\",\"ph\":\"X\""), full = tl_count(path, "\"bytes\":8192}");
    CHECK(rc == 0 && full == 2 * 38 * 20 && n > full, "--trace on the device: %d bucket collectives of 8192 bytes "
          "(want %d) among %d on the communication row (exit %d)\n%s", full, 2 * 38 * 20, n, rc, g_out);
    // rank 0's backward spans, then its buckets' starts inside one of them
    char *t = tl_read_file(path, NULL);
    double bw[2][64];
    int nb = 0, inside = 0;
    for (int pass = 0; pass < 2; pass++)
        for (char *line = t, *nl; line && *line; line = nl ? nl + 1 : NULL) {
            if ((nl = strchr(line, '\n'))) *nl = 0;
            double ts = 0, dur = 0;
            const char *q = strstr(line, "\"ts\":");
            int mine = q && strstr(line, "\"pid\":0,") && sscanf(q, "\"ts\":%lf,\"dur\":%lf", &ts, &dur) == 2;
            if (mine && pass == 0 && strstr(line, "\"name\":\"backward\"") && nb < 64)
                bw[0][nb] = ts, bw[1][nb++] = ts + dur;
            for (int k = 0; mine && pass == 1 && strstr(line, "\"bytes\":8192}") && k < nb; k++)
                inside += ts >= bw[0][k] && ts < bw[1][k];
            if (nl) *nl = '\n';
        }
    free(t);
    printf("--trace: rank 0's full buckets begun inside their step's backward: %d of %d (the hook begins one a "
           "step before the first layer's backward)\n", inside, full / 2);
}

// Rank 0 of 4's figures in run's summary.json (ZeRO 2 and 3 on the
// device): the parameters, the gradients' peak backed and the chunk; the
// bytes of its slice's chunks (the slice rounded up, and one chunk at
// either end).
static double slice_chunks(const char *run, double *n, double *peak, double *gran) {
    char sum[700];
    snprintf(sum, sizeof sum, "%s/summary.json", tmp(run));
    *n = tl_json_number(sum, "params");
    *peak = tl_json_number(sum, "gradients_backed_peak_bytes");
    *gran = tl_json_number(sum, "gradients_backed_chunk_bytes");
    size_t lo, hi;
    dt_shard_range((size_t)*n, 0, 4, &lo, &hi);
    return (ceil((double)(hi - lo) * 4 / *gran) + 2) * *gran;
}

// A GPT's gradients under --zero 2 on the device: its block laid out tensor
// by tensor (each of a layer's 12 beside the other layers' same one), a
// chunk goes once every layer's piece in it is reduced, which the budget
// counts as two chunks a kind. 6 layers of 256 (4773888 parameters) on 4
// ranks in buckets of 256 KiB: the peak within the budget (the slice's
// chunks, two buckets and two of the largest tensor (a layer's fc, 262144
// floats), 4 + 2 x 12 chunks), under the block's 19.1 MB (measured 9.37 MB).
static void zero2_gpt(void) {
    char cfg[4096];
    snprintf(cfg, sizeof cfg, "%s", cfg_gpt);
    const char *from[] = {"n_layer = 2\n", "n_head = 2\n", "n_embd = 16\n", "max_steps = 20\n"},
               *to[] = {"n_layer = 6\n", "n_head = 4\n", "n_embd = 256\n", "max_steps = 3\n"};
    for (int i = 0; i < 4; i++) {
        char *at = strstr(cfg, from[i]), rest[4096];
        if (!at) return (void)CHECK(0, "the GPT's config has %s", from[i]);
        snprintf(rest, sizeof rest, "%s", at + strlen(from[i]));
        snprintf(at, sizeof cfg - (size_t)(at - cfg), "%s%s", to[i], rest);
    }
    int rc = tl_train(g_tmp, "gpt-z2-big", cfg, 4, "--zero 2 --device cuda --set parallel.bucket_kb=256", g_out,
                      sizeof g_out);
    double n, peak, gran, budget = slice_chunks("gpt-z2-big", &n, &peak, &gran) + 2 * (256 * 1024 + 262144 * 4) +
                                   (4 + 24) * gran;
    CHECK(rc == 0 && n == 4773888 && peak > 0 && peak <= budget && peak < 0.6 * n * 4, "--zero 2, the GPT on 4 "
          "ranks: gradients backed at most %g bytes, the budget %g, the block %g (exit %d)", peak, budget, n * 4, rc);
    printf("--zero 2 on the device, a GPT of %g parameters on 4 ranks: gradients backed at most %.2f MB (budget %.2f "
           "MB; the block %.2f MB)\n", n, peak / 1e6, budget / 1e6, n * 4 / 1e6);
}

// ZeRO stages 2 and 3's memory on the device (summary.json, rank 0's): a deep
// MLP (747554 parameters, 11 linears of 256 x 256) on 4 ranks in buckets
// of 64 KiB. The block is backed in chunks of 64 KiB as backward writes
// it; what another rank owns is given back once reduced, and backing waits
// for the oldest piece in flight past the budget: the slice's chunks (its
// floats rounded up, and one chunk at either end), two buckets and two of
// the largest tensor ahead, and a chunk's rounding at four ends. The peak
// within that formula, computed here, and under the whole block (2.99 MB;
// measured 1.84 MB); the weights bitwise the CPU's ZeRO 2 and the device's
// ZeRO 1 (the same exchange). At stage 3 the parameters too: the slice's
// chunks, three layers (the one in use, the one before it, given back a
// hook later, and the next, gathered ahead: the largest 65792 floats), the
// ranges outside the layers (the last linear, 2570) and six chunks'
// rounding at most (measured 1.44 MB); the weights the same bits.
// The deep MLP (747554 parameters): the MLP's config with its linear of 48
// made a linear of 16 and twelve linears of 256, each with a relu.
static void deep_mlp(char *cfg, size_t n) {
    char text[4096], layers[1024] = "layer = linear out=16\nlayer = relu\n";
    for (int i = 0; i < 12; i++) strcat(layers, "layer = linear out=256\nlayer = relu\n");
    const char *base = model_text("mlp", text, sizeof text), *at = strstr(base, "layer = linear out=48\n");
    snprintf(cfg, n, "%.*s%s%s", (int)(at - base), base, layers, at + strlen("layer = linear out=48\n"));
}

static void zero2_memory(void) {
    char cfg[8192];
    deep_mlp(cfg, sizeof cfg);
    const char *flags[] = {"--zero 2 --set parallel.bucket_kb=64 --device cuda",
                           "--zero 1 --set parallel.bucket_kb=64 --device cuda", "--zero 2 --set parallel.bucket_kb=64",
                           "--zero 3 --set parallel.bucket_kb=64 --device cuda"};
    const char *names[] = {"deep-z2-dev", "deep-z1-dev", "deep-z2-cpu", "deep-z3-dev"};
    for (int i = 0; i < 4; i++)
        CHECK(tl_train(g_tmp, names[i], cfg, 4, flags[i], g_out, sizeof g_out) == 0, "the deep MLP, %s: %s", flags[i],
              g_out);
    char sum[700];
    snprintf(sum, sizeof sum, "%s/summary.json", tmp("deep-z2-dev"));
    double n, peak, gran, kept = slice_chunks("deep-z2-dev", &n, &peak, &gran);
    double budget = kept + 2 * (64 * 1024 + 256 * 256 * 4) + 4 * gran;
    CHECK(n == 747554 && peak > 0 && peak <= budget && peak < 0.7 * n * 4, "--zero 2 on the device: rank 0's "
          "gradients backed at most %g bytes, the formula %g, the block %g", peak, budget, n * 4);
    CHECK(tl_json_number(sum, "gradients_bytes") == kept, "summary.json's gpu.gradients_bytes: the slice's chunks "
          "(%g, want %g)", tl_json_number(sum, "gradients_bytes"), kept);
    int bw = 0;
    double d1 = tl_runs_diff(g_tmp, "deep-z2-cpu", "deep-z2-dev", &bw), d2;
    CHECK(d1 == 0 && bw, "--zero 2 on the device: the CPU's ZeRO 2 weights bitwise (diff %g)", d1);
    d2 = tl_runs_diff(g_tmp, "deep-z1-dev", "deep-z2-dev", &bw);
    CHECK(d2 == 0 && bw, "--zero 2 on the device: its ZeRO 1 weights bitwise (diff %g)", d2);
    d2 = tl_runs_diff(g_tmp, "deep-z3-dev", "deep-z2-dev", &bw);
    snprintf(sum, sizeof sum, "%s/summary.json", tmp("deep-z3-dev"));
    double wpeak = tl_json_number(sum, "weights_backed_peak_bytes"), wform = kept + (3 * 65792 + 2570) * 4 + 6 * gran;
    CHECK(d2 == 0 && bw && wpeak > 0 && wpeak <= wform && tl_json_number(sum, "gradients_backed_peak_bytes") <= budget,
          "--zero 3 on the device: its ZeRO 2 weights bitwise (diff %g); the parameters backed at most %g bytes, the "
          "formula %g", d2, wpeak, wform);
    printf("--zero 3 on the device, the same: parameters backed at most %.2f MB (formula %.2f MB), gradients %.2f MB\n",
           wpeak / 1e6, wform / 1e6, tl_json_number(sum, "gradients_backed_peak_bytes") / 1e6);
    snprintf(sum, sizeof sum, "%s/summary.json", tmp("deep-z2-dev"));
    printf("--zero 2 on the device, the deep MLP on 4 ranks: gradients backed at most %.2f MB (formula %.2f MB; the "
           "block %.2f MB)\n", peak / 1e6, budget / 1e6, n * 4 / 1e6);
    zero2_gpt();
    // A GPU with room for the arena, the exchange and the slice's chunks
    // but not for backward's: refused mid-step by every rank, naming the
    // bytes, a non-zero exit (no kernel on memory never backed).
    char mem[64], cmd[2048];
    snprintf(mem, sizeof mem, "%.0f", tl_json_number(sum, "arena_bytes") + tl_json_number(sum, "exchange_bytes") +
                                          kept + 3 * gran);
    setenv("DTRAIN_GPU_SIM_MEM", mem, 1);
    snprintf(cmd, sizeof cmd, "%s train %s --workers 4 %s --run-dir %s 2>&1", tl_dtrain(), tmp("deep-z2-dev.ini"),
             flags[0], tmp("deep-oom"));
    int rc = tl_run(cmd, g_out, sizeof g_out);
    unsetenv("DTRAIN_GPU_SIM_MEM");
    CHECK(rc == 1 && strstr(g_out, "gradients backed on demand (ZeRO): 65536 bytes more with ") &&
              strstr(g_out, "simulated GPU: out of memory") && !strstr(g_out, "signal"),
          "--zero 2 on a GPU of %s bytes: the out-of-memory named, exit %d\n%s", mem, rc, g_out);
}

// The CNN's model parallel on the device: 3 stages (each a convolution's
// or the dense layers'); 2 tensor shards (its convolutions and linears
// split over channels, dropout p = 0.3 on a shard's part of the mask),
// with 2 stages: the CPU's run within the CNN's tolerance (its
// convolutions are im2col and a GEMM, the CPU's oneDNN's: compare_runs).
static void pipeline_cnn(void) {
    static const struct {
        int workers;
        const char *flags, *what;
    } rows[] = {
        {3, "--set parallel.pipeline=3 --set parallel.pipeline_split=3,3,4", "the CNN in 3 stages"},
        {2, "--set parallel.tensor=2", "the CNN in 2 tensor shards"},
        {4, "--set parallel.tensor=2 --set parallel.pipeline=2 --set parallel.pipeline_split=5,5",
         "the CNN in 2 shards x 2 stages"},
    };
    for (size_t i = 0; i < sizeof rows / sizeof *rows; i++) {
        char dflags[200], a[600], b[600], name[64], dev[64];
        snprintf(dflags, sizeof dflags, "%s --device cuda", rows[i].flags);
        snprintf(name, sizeof name, "mp-cnn%zu", i);
        snprintf(dev, sizeof dev, "mp-cnn%zu-dev", i);
        CHECK(tl_train(g_tmp, name, cfg_cnn_full, rows[i].workers, rows[i].flags, g_out, sizeof g_out) == 0,
              "%s on the CPU", rows[i].what);
        int rc = tl_train(g_tmp, dev, cfg_cnn_full, rows[i].workers, dflags, g_out, sizeof g_out), bw = 0;
        double diff = tl_runs_diff(g_tmp, name, dev, &bw);
        CHECK(rc == 0 && diff >= 0 && diff <= 1e-3, "%s on the device: the CPU's weights within 1e-3 (exit %d, max rel "
              "diff %g)\n%s", rows[i].what, rc, diff, g_out);
        snprintf(a, sizeof a, "%s", tmp(name));
        snprintf(b, sizeof b, "%s", tmp(dev));
        same_evals(a, b, rows[i].what, 1e-3, 1);
        printf("%s on the device: weights' max rel diff %g from the CPU's\n", rows[i].what, diff);
    }
}

// A pipeline's memory on the device: the deep MLP of zero2_memory (747554
// parameters) in 4 stages of 8, 8, 8 and 9 layers; stage 0 (rank 0's
// summary.json) keeps flatten, linear 16, relu and linear 256 (x 2, and
// relus): 12560 + 4352 + 2 x 65792 = 148496 floats, whose chunks are all
// it backs of the parameters and the gradients after the run (the
// evaluation's gathered layers given back); the evaluation's peak below
// half the whole block. The CPU's weights bitwise.
static void pipeline_memory(void) {
    char cfg[8192], sum[700];
    deep_mlp(cfg, sizeof cfg);
    const char *flags = "--set parallel.pipeline=4 --set parallel.pipeline_balance=count";
    char dflags[200];
    snprintf(dflags, sizeof dflags, "%s --device cuda", flags);
    CHECK(tl_train(g_tmp, "deep-pp-cpu", cfg, 4, flags, g_out, sizeof g_out) == 0, "the deep MLP's pipeline: %s", g_out);
    int rc = tl_train(g_tmp, "deep-pp-dev", cfg, 4, dflags, g_out, sizeof g_out), bw = 0;
    double diff = tl_runs_diff(g_tmp, "deep-pp-cpu", "deep-pp-dev", &bw);
    snprintf(sum, sizeof sum, "%s/summary.json", tmp("deep-pp-dev"));
    double gran = tl_json_number(sum, "gradients_backed_chunk_bytes"), whole = 747554 * 4.0;
    double held = gran > 0 ? ceil(148496 * 4.0 / gran) * gran : -1, w = tl_json_number(sum, "weights_bytes");
    double g = tl_json_number(sum, "gradients_bytes"), peak = tl_json_number(sum, "weights_backed_peak_bytes");
    double o = tl_json_number(sum, "optimizer_state_bytes");
    CHECK(rc == 0 && diff == 0 && bw && w == held && g == held && o == 2 * held && peak >= held && peak < whole / 2,
          "the deep MLP in 4 stages on the device: the CPU's weights bitwise (exit %d, diff %g); stage 0 backs its "
          "layers' chunks alone: weights %g, gradients %g and AdamW's state %g bytes (want %g, %g, %g), the "
          "evaluation's peak %g (below %g)", rc, diff, w, g, o, held, held, 2 * held, peak, whole / 2);
    printf("the deep MLP in 4 stages on the device: stage 0 backs %g bytes of parameters, of gradients and of each "
           "AdamW state (the whole block %g), %g at the evaluation's peak\n", held, whole, peak);
    // The GPT's own activations under model parallel serve evaluations
    // alone: one block's and two slots of the stream, as many bytes at 2
    // layers as at 6 (the stages' sets beside them grow with the layers).
    double own[2], sets[2];
    for (int i = 0; i < 2; i++) {
        char name[32], f[200];
        snprintf(name, sizeof name, "gpt-pp-layers%d", 2 + 4 * i);
        snprintf(f, sizeof f, "--device cuda --set parallel.pipeline=2 --set model.n_layer=%d", 2 + 4 * i);
        rc = tl_train(g_tmp, name, cfg_gpt, 2, f, g_out, sizeof g_out);
        snprintf(sum, sizeof sum, "%s/summary.json", tmp(name));
        sets[i] = tl_json_number(sum, "stage_activations_bytes");
        own[i] = rc == 0 ? tl_json_number(sum, "activations_bytes") - sets[i] : -1;
    }
    CHECK(own[0] > 0 && own[0] == own[1] && sets[1] > sets[0], "the GPT in 2 stages on the device: its own activations "
          "(evaluations') %g bytes at 2 layers, %g at 6; the stages' sets %g and %g", own[0], own[1], sets[0], sets[1]);
    printf("the GPT in 2 stages on the device: rank 0's own activations %g bytes at 2 layers and at 6, its stages' "
           "%g and %g\n", own[0], sets[0], sets[1]);
}

static void test_ranks(void) {
    char text[4096], flags[600], name[64], ref[64], one[64];
    for (size_t i = 0; i < sizeof dev_rows / sizeof *dev_rows; i++) {
        const dev_row *r = &dev_rows[i];
        const char *cfg = model_text(r->model, text, sizeof text);
        snprintf(name, sizeof name, "row%zu-dev", i);
        snprintf(ref, sizeof ref, "row%zu-cpu", i);
        snprintf(one, sizeof one, "row%zu-one", i);
        snprintf(flags, sizeof flags, "%s --device cuda", r->flags);
        int rc = tl_train(g_tmp, name, cfg, r->workers, flags, g_out, sizeof g_out);
        CHECK(rc == 0, "%s x %d %s on the device: exit %d", r->model, r->workers, r->flags, rc);
        CHECK(tl_train(g_tmp, ref, cfg, r->workers, r->flags, g_out, sizeof g_out) == 0, "the CPU's run");
        int bw = 0;
        double diff = tl_runs_diff(g_tmp, ref, name, &bw);
        CHECK(rc == 0 && diff == 0 && bw, "%s x %d %s: the device's weights are the CPU's on %d workers bitwise "
              "(diff %g)", r->model, r->workers, r->flags, r->workers, diff);
        char ra[600], rb[600], w[160], sa[700], sb[700];
        snprintf(ra, sizeof ra, "%s", tmp(ref));
        snprintf(rb, sizeof rb, "%s", tmp(name));
        snprintf(sa, sizeof sa, "%s/summary.json", ra);
        snprintf(sb, sizeof sb, "%s/summary.json", rb);
        double la = tl_json_number(sa, "final_train_loss"), lb = tl_json_number(sb, "final_train_loss");
        CHECK(la > 0 && la == lb, "%s x %d %s: the training loss the device summed is the CPU's (%.9g, %.9g)", r->model,
              r->workers, r->flags, lb, la);
        snprintf(w, sizeof w, "%s x %d %s", r->model, r->workers, r->flags);
        same_evals(ra, rb, w, 0, 1);
        planned_scratch(sb, w);
        buckets_said(rb, r);
        if (!r->ref1) continue;
        CHECK(tl_train(g_tmp, one, cfg, 1, r->flags, g_out, sizeof g_out) == 0, "one CPU process");
        diff = tl_runs_diff(g_tmp, one, name, &bw);
        CHECK(rc == 0 && diff == 0 && bw, "%s x %d %s: the device's weights are one CPU process's bitwise (diff %g)",
              r->model, r->workers, r->flags, diff);
    }
    // the log says how the gradients travel, summary.json too
    char cmd[2048], sum[700];
    snprintf(cmd, sizeof cmd, "%s train %s --workers 2 --device cuda --run-dir %s 2>&1", tl_dtrain(), tmp("gpt.ini"),
             tmp("said"));
    int rc = tl_run(cmd, g_out, sizeof g_out);
    CHECK(rc == 0 && strstr(g_out, "gradients staged through host memory (pinned host buffers and the host's "
                                   "communicator; not nccl: 2 ranks of this host on 1 GPU, and NCCL takes one GPU a "
                                   "rank)"),
          "ranks sharing the GPU: the staging logged with why: exit %d\n%s", rc, g_out);
    snprintf(sum, sizeof sum, "%s/summary.json", tmp("said"));
    CHECK(tl_count(sum, "\"collectives\":\t\"staging\"") == 1 && tl_count(sum, "\"step_end\":\t\"host\"") == 1,
          "summary.json: the GPUs' collectives staged, the step's end on the host (the ranks agree on a skip first)");
    zero_memory();
    sequence_memory();
    zero2_memory();
    trace_buckets();
    pipeline_cnn();
    pipeline_memory();
}

// 2 ranks (data parallel; error feedback's residuals read back into the
// shards, method = bf16): the same across devices.
static void test_ranks_resume(void) {
    crosswise("ck2", "", 2, "", "step-00000010.safetensors", 20, 0);
    crosswise("ckc", "[compression]\nmethod = bf16\n", 2, "", "step-00000010", 10, 2);
    // (a pipeline's: each stage's slice of the whole model's tensors, its
    // optimizer state the device's; under --zero 1 each replica's slices of
    // it; tensor shards' too)
    crosswise("ckp", "", 2, "--set parallel.pipeline=2", "step-00000010", 10, 2);
    crosswise("ckpz", "", 4, "--zero 1 --set parallel.pipeline=2", "step-00000010", 10, 4);
    crosswise("ckt", "", 2, "--set parallel.tensor=2", "step-00000010", 10, 2);
}

// ZeRO stage 1 (and 3) on the device: a checkpoint of 2 ranks at step 10
// resumed by 2 CPU workers under --zero 1 (3) and under no ZeRO, and the
// CPU's resumed on the device: the uninterrupted CPU run's weights bitwise;
// the device's checkpoint shards hold the CPU's tensors (the parameters,
// the optimizer state's slices) bitwise.
static void zero_resume(int stage) {
    char ck[4096], flags[1200], zf[32], zd[48], dev[32], cpu[32];
    snprintf(ck, sizeof ck, "%s[checkpoint]\nevery_steps = 10\n", cfg_gpt);
    snprintf(zf, sizeof zf, "--zero %d", stage);
    snprintf(zd, sizeof zd, "--zero %d --device cuda", stage);
    snprintf(dev, sizeof dev, "ckz%d-dev", stage);
    snprintf(cpu, sizeof cpu, "ckz%d-cpu", stage);
    CHECK(tl_train(g_tmp, dev, ck, 2, zd, g_out, sizeof g_out) == 0, "2 ranks on the device, %s, checkpoints: %s", zf,
          g_out);
    CHECK(tl_train(g_tmp, cpu, ck, 2, zf, g_out, sizeof g_out) == 0, "2 CPU workers, %s: %s", zf, g_out);
    struct {
        const char *name, *flags, *from;
    } runs[] = {
        {"fromz-dev", zf, dev},
        {"fromz-dev0", "", dev},
        {"fromz-cpu", zd, cpu},
    };
    for (int i = 0; i < 3; i++) {
        char name[64];
        snprintf(name, sizeof name, "%s%d", runs[i].name, stage);
        snprintf(flags, sizeof flags, "%s --set checkpoint.resume=%s/%s/checkpoints/step-00000010", runs[i].flags,
                 g_tmp, runs[i].from);
        int rc = tl_train(g_tmp, name, ck, 2, flags, g_out, sizeof g_out), bw = 0;
        double d = tl_runs_diff(g_tmp, cpu, name, &bw);
        CHECK(rc == 0 && d == 0 && bw, "%s (%s) resumes %s's step 10: the uninterrupted run's weights bitwise (exit %d, "
              "diff %g)\n%s", name, runs[i].flags, runs[i].from, rc, d, g_out);
    }
    int bw = 0;
    double d = tl_runs_diff(g_tmp, cpu, dev, &bw);
    CHECK(d == 0 && bw, "%s x 2 on the device: the CPU's weights bitwise (diff %g)", zf, d);
    for (int r = 0; r < 2; r++) {
        char a[700], b[700];
        int same = 0;
        snprintf(a, sizeof a, "%s/%s/checkpoints/step-00000020/shard-%05d-of-00002.safetensors", g_tmp, dev, r);
        snprintf(b, sizeof b, "%s/%s/checkpoints/step-00000020/shard-%05d-of-00002.safetensors", g_tmp, cpu, r);
        d = tl_weights_diff(a, b, &same);
        CHECK(d == 0 && same, "%s: the device's checkpoint shard %d holds the CPU's tensors bitwise (%g)", zf, r, d);
    }
}

static void test_zero_resume(void) {
    zero_resume(1);
    zero_resume(3);
}

// The launcher's recovery line in g_out for fault "R:S:kill": the group
// went on from step F with L steps lost, F + L = S (the dead rank had
// finished S - 1); L = 0 but where the run went back to a checkpoint (back).
static int recovered(const char *fault, int back) {
    int r, S, F, L;
    char want[64];
    if (sscanf(fault, "%d:%d", &r, &S) != 2) return 0;
    snprintf(want, sizeof want, "run: rank %d recovered in ", r);
    const char *p = strstr(g_out, want);
    p = p ? strstr(p, "first step, step ") : NULL;
    if (!p || sscanf(p, "first step, step %d); %d step", &F, &L) != 2) return 0;
    return F + L == S && (back ? L > 0 : L == 0);
}

// Spares on the device (--spares 1): rank R killed at step S (fault
// "R:S:kill"), its place taken by a spare that gets a surviving replica's
// state onto its GPU (with a codec's residuals every rank goes back to the
// newest checkpoint: back); the launcher's recovery line says so
// (recovered; a death in the checkpoint of step 0, place save0: every
// rank from the start's state, step 1 the first); the run ends with the
// weights of
// dev_rows' row {model, W, rflags} on the CPU, bitwise.
static void spares(const char *model, int W, const char *rflags, const char *fault, const char *extra,
                   const char *tag, int back) {
    char text[4096], flags[700], name[64], once[64], ref[64];
    snprintf(ref, sizeof ref, "row%zu-cpu", dev_row_of(model, W, rflags));
    snprintf(name, sizeof name, "spare-%s", tag);
    snprintf(once, sizeof once, "once-%s", tag);
    snprintf(flags, sizeof flags, "%s --device cuda --spares 1 %s", rflags, extra);
    setenv("DTRAIN_FAULT_STEP", fault, 1);
    setenv("DTRAIN_FAULT_ONCE", tmp(once), 1);
    int rc = tl_train(g_tmp, name, model_text(model, text, sizeof text), W, flags, g_out, sizeof g_out), bw = 0;
    unsetenv("DTRAIN_FAULT_STEP");
    unsetenv("DTRAIN_FAULT_ONCE");
    double diff = tl_runs_diff(g_tmp, ref, name, &bw);
    int went = strstr(fault, ":save0") ? strstr(g_out, "replacement's first step, step 1); 0 steps lost") != NULL
                                       : recovered(fault, back);
    CHECK(rc == 0 && strstr(g_out, "takes its place (0 spares left)") && went && diff == 0 && bw,
          "%s x %d %s on the device, fault %s, a spare in its place (%s): the CPU's weights bitwise (exit %d, diff "
          "%g)\n%s", model, W, rflags, fault, back ? "back to a checkpoint" : "no step lost", rc, diff, g_out);
}

// Under ZeRO --max-restarts restarts every rank from the newest
// checkpoint: the MLP on 3 ranks at
// stage 3, rank 1 killed at step 12 (named), back to step 10 (1 step
// lost; or to step 5 where step 10's was not finished), the weights those
// of the CPU's uninterrupted --zero 3 run on 3 workers bitwise.
static void zero_restart(void) {
    char text[4096];
    setenv("DTRAIN_FAULT_STEP", "1:12:kill", 1);
    setenv("DTRAIN_FAULT_ONCE", tmp("once-z3"), 1);
    int rc = tl_train(g_tmp, "restart-z3", model_text("mlp", text, sizeof text), 3,
                      "--zero 3 --device cuda --max-restarts 1 --checkpoint-every 5", g_out, sizeof g_out), bw = 0;
    unsetenv("DTRAIN_FAULT_STEP");
    unsetenv("DTRAIN_FAULT_ONCE");
    CHECK(tl_train(g_tmp, "restart-z3-cpu", text, 3, "--zero 3", g_out + strlen(g_out),
                   sizeof g_out - strlen(g_out)) == 0, "the CPU's --zero 3 run");
    double diff = tl_runs_diff(g_tmp, "restart-z3-cpu", "restart-z3", &bw);
    // (step 10's checkpoint is written in the background: on a loaded
    // machine it may still be unfinished at step 12, and step 5's is taken)
    int back = strstr(g_out, "resumed at step 10, 1 step lost") ||
               (strstr(g_out, "its writing never finished") && strstr(g_out, "resumed at step 5, 6 steps lost"));
    CHECK(rc == 0 && strstr(g_out, "rank 1 (pid") && strstr(g_out, "killed by signal 9") && back && diff == 0 && bw,
          "--zero 3 on the device, rank 1 killed at step 12, --max-restarts 1: back to step 10, the CPU's weights "
          "bitwise (exit %d, diff %g)\n%s", rc, diff, g_out);
}

// fp16 under ZeRO with a spare: an overflow at step 2 halves the loss
// scale, rank 1 dies at step 4, every rank goes back to the step-0
// checkpoint (its scale the starting one) and redoes the steps: the
// uninterrupted run's weights bitwise (the same overflow in it).
static void spare_fp16(void) {
    char text[4096];
    const char *flags = "--zero 1 --precision fp16 --device cuda --spares 1 --checkpoint-every 5";
    setenv("DTRAIN_FAULT_OVERFLOW", "0:2", 1);
    int rc0 = tl_train(g_tmp, "fp16-spare-ref", model_text("mlp", text, sizeof text), 3, flags, g_out, sizeof g_out);
    setenv("DTRAIN_FAULT_STEP", "1:4:kill", 1);
    setenv("DTRAIN_FAULT_ONCE", tmp("once-fp16-spare"), 1);
    int rc = tl_train(g_tmp, "fp16-spare", text, 3, flags, g_out, sizeof g_out), bw = 0;
    unsetenv("DTRAIN_FAULT_STEP");
    unsetenv("DTRAIN_FAULT_ONCE");
    unsetenv("DTRAIN_FAULT_OVERFLOW");
    double diff = tl_runs_diff(g_tmp, "fp16-spare-ref", "fp16-spare", &bw);
    CHECK(rc0 == 0 && rc == 0 && recovered("1:4:kill", 1) && diff == 0 && bw, "fp16 under --zero 1 on the device, "
          "an overflow at step 2, rank 1 killed at step 4: back to step 0, the uninterrupted run's weights bitwise "
          "(exit %d, %d, diff %g)\n%s", rc0, rc, diff, g_out);
}

static void test_spares(void) {
    spare_fp16();
    zero_restart();
    spares("mlp", 3, "--set train.grad_accum=2", "1:13:kill", "", "mlp", 0);
    spares("gpt", 2, "--deterministic", "0:9:kill", "--checkpoint-every 5", "gpt0", 0);
    // (a codec's residuals: back to the newest checkpoint, step 10's or, its
    // write still under way, step 5's)
    spares("gpt", 2, "--set compression.method=bf16 --set parallel.bucket_kb=4", "1:12:kill", "--checkpoint-every 5",
           "codec", 1);
    // (ZeRO: each slice of the optimizer state is on one GPU alone, so
    // every rank goes back to the newest checkpoint, the spare reading the
    // dead rank's slice; stage 3 with its gathers in flight)
    spares("mlp", 3, "--zero 1 --set train.grad_accum=2", "0:12:kill", "--checkpoint-every 5", "zero1", 1);
    // (a death before the first scheduled checkpoint: back to the one of step 0)
    spares("mlp", 3, "--zero 1 --set train.grad_accum=2", "1:3:kill", "--checkpoint-every 5", "zero1-early", 1);
    // (a death in that checkpoint of step 0, its write in flight: no
    // checkpoint yet, every rank from the start's state, the save again)
    spares("mlp", 3, "--zero 1 --set train.grad_accum=2", "0:0:kill:save0", "--checkpoint-every 5", "zero1-save0", 1);
    spares("gpt", 2, "--set compression.method=bf16 --set parallel.bucket_kb=4", "1:0:kill:save0",
           "--checkpoint-every 5", "codec-save0", 1);
    spares("mlp", 3, "--zero 3 --set train.grad_accum=2 --set parallel.bucket_kb=4", "2:0:kill:save0",
           "--checkpoint-every 5", "zero3-save0", 1);
    spares("gpt", 3, "--zero 2 --set parallel.bucket_kb=4", "2:13:kill", "--checkpoint-every 5", "zero2", 1);
    spares("mlp", 3, "--zero 3 --set train.grad_accum=2 --set parallel.bucket_kb=4", "1:12:kill",
           "--checkpoint-every 5", "zero3", 1);
    // (a pipeline's stage: its layers from the twin in the other replica)
    spares("mlp", 4, "--deterministic --set parallel.pipeline=2 --set parallel.pipeline_balance=flops", "3:12:kill",
           "", "pipe", 0);
    spares("mlp", 4, "--set parallel.tensor=2", "2:12:kill", "", "tensor", 0);  // (its shard from its twin)
    spares("gpt", 4, "--set parallel.tensor=2", "1:12:kill", "", "gpt-tensor", 0);
}

// ---- NCCL: the fake one over shared memory (tests/gpu/fake_nccl.c) ---------------

// A run of the MLP on the device with the environment env ("NAME=VALUE
// ..."), its output in g_out; the exit code, *seconds the run's.
static int run_env(const char *name, int workers, const char *env, const char *flags, double *seconds) {
    char cmd[3000];
    snprintf(cmd, sizeof cmd, "env %s %s train %s --workers %d --device cuda --run-dir %s %s 2>&1", env,
             tl_dtrain(), tmp("row0-dev.ini"), workers, tmp(name), flags);
    double t0 = dt_now();
    int rc = tl_run(cmd, g_out, sizeof g_out);
    if (seconds) *seconds = dt_now() - t0;
    return rc;
}

// One rank with DTRAIN_GPU_COMM=nccl: its gradients through an NCCL
// communicator of one rank (what a machine of one GPU can run of NCCL),
// the weights one CPU process's bitwise; said in the log and summary.json.
static void nccl_alone(void) {
    char text[4096], sum[700];
    CHECK(tl_train(g_tmp, "alone-cpu", model_text("mlp", text, sizeof text), 1, "", g_out, sizeof g_out) == 0,
          "the MLP on one CPU process");
    int rc = run_env("alone-nccl", 1, "DTRAIN_GPU_COMM=nccl", "", NULL), bw = 0;
    double diff = tl_runs_diff(g_tmp, "alone-cpu", "alone-nccl", &bw);
    snprintf(sum, sizeof sum, "%s/summary.json", tmp("alone-nccl"));
    CHECK(rc == 0 && diff == 0 && bw && strstr(g_out, "gradients summed on the GPUs by NCCL 2.28.9") &&
              tl_count(sum, "\"collectives\":\t\"nccl\"") == 1,
          "one rank, DTRAIN_GPU_COMM=nccl: through NCCL, one CPU process's weights bitwise (exit %d, diff %g)\n%s", rc,
          diff, g_out);
}

// With as many simulated GPUs as ranks and the fake NCCL, the rows above
// run on the nccl backend: the CPU's weights bitwise (the fake reduces in
// rank order, as the host's communicator does).
static void test_nccl_rows(void) {
    char text[4096], flags[600], name[64], ref[64];
    setenv("DTRAIN_GPU_SIM_DEVICES", "3", 1);
    setenv("DTRAIN_NCCL", FAKE_NCCL, 1);
    for (size_t i = 0; i < sizeof dev_rows / sizeof *dev_rows; i++) {
        const dev_row *r = &dev_rows[i];
        const char *cfg = model_text(r->model, text, sizeof text);
        snprintf(name, sizeof name, "row%zu-nccl", i);
        snprintf(ref, sizeof ref, "row%zu-cpu", i);
        snprintf(flags, sizeof flags, "%s --device cuda", r->flags);
        int rc = tl_train(g_tmp, name, cfg, r->workers, flags, g_out, sizeof g_out), bw = 0;
        double diff = tl_runs_diff(g_tmp, ref, name, &bw);
        CHECK(rc == 0 && diff == 0 && bw, "%s x %d %s on NCCL: the CPU's weights on %d workers bitwise (exit %d, "
              "diff %g)", r->model, r->workers, r->flags, r->workers, rc, diff);
        buckets_said(tmp(name), r);
    }
    char cmd[2048], sum[700];
    snprintf(cmd, sizeof cmd, "%s train %s --workers 2 --device cuda --run-dir %s 2>&1", tl_dtrain(), tmp("gpt.ini"),
             tmp("said-nccl"));
    int rc = tl_run(cmd, g_out, sizeof g_out);
    CHECK(rc == 0 && strstr(g_out, "gradients summed on the GPUs by NCCL 2.28.9 (" FAKE_NCCL "), one GPU a rank"),
          "a GPU a rank and NCCL: NCCL logged: exit %d\n%s", rc, g_out);
    snprintf(sum, sizeof sum, "%s/summary.json", tmp("said-nccl"));
    CHECK(tl_count(sum, "\"collectives\":\t\"nccl\"") == 1, "summary.json: the GPUs' collectives on NCCL");
    // staging asked for: staging, the same bits
    rc = run_env("forced-staging", 2, "DTRAIN_GPU_COMM=staging", "--set train.log_every=1", NULL);
    int bw = 0;
    double diff = tl_runs_diff(g_tmp, "row0-cpu", "forced-staging", &bw);
    CHECK(rc == 0 && diff == 0 && bw, "DTRAIN_GPU_COMM=staging beside NCCL: staged, the same weights (exit %d, "
          "diff %g)\n%s", rc, diff, g_out);
    nccl_alone();
    spares("mlp", 3, "--set train.grad_accum=2", "2:7:kill", "", "nccl", 0);  // (NCCL's wait ends on the death)
    // a pipeline's streams on NCCL: the pairs' communicators aborted and made again over the new generation
    setenv("DTRAIN_GPU_SIM_DEVICES", "5", 1);
    spares("mlp", 4, "--deterministic --set parallel.pipeline=2 --set parallel.pipeline_balance=flops", "3:12:kill", "",
           "pp-nccl", 0);
    snprintf(sum, sizeof sum, "%s/summary.json", tmp("spare-pp-nccl"));
    CHECK(tl_count(sum, "\"streams\":\t\"nccl\"") == 1, "the spare's run: the streams on NCCL");
    // a tensor-parallel shard's sums on NCCL: the shards' communicator made again over the new generation
    spares("gpt", 4, "--set parallel.tensor=2", "1:12:kill", "", "tp-nccl", 0);
    snprintf(sum, sizeof sum, "%s/summary.json", tmp("spare-tp-nccl"));
    CHECK(tl_count(sum, "\"shards\":\t\"nccl\"") == 1, "the spare's run: the shards' sums on NCCL");
    setenv("DTRAIN_GPU_SIM_DEVICES", "3", 1);
}

// Faults in NCCL, each ending the run with a non-zero exit and an error
// naming the op, its sequence number (a collective's) and the ranks, within
// the timeout (2 s) and the launcher's stop: never a silent hang.
#define PP2 "--set parallel.pipeline=2 --set parallel.pipeline_balance=flops"
static void test_nccl_faults(void) {
    struct {
        const char *env, *says[2], *flags;
    } f[] = {
        // rank 1's part of allreduce 5 never comes: every rank times out, each had issued it
        {"DTRAIN_FAKE_NCCL_FAULT=hang:5:1",
         {"NCCL allreduce (seq 5, 39202 x F32) on rank 0: timed out after 2 s; ranks not arrived: none (every rank "
          "issued seq 5: stuck inside NCCL)", "exited with status 1"}, ""},
        // ... and in buckets of 1024: allreduce 40, step 2's first bucket, begun during backward
        {"DTRAIN_FAKE_NCCL_FAULT=hang:40:1",
         {"the gradients' exchange on the GPUs: NCCL allreduce (seq 40, 1024 x F32) on rank 0: timed out after 2 s; ranks "
          "not arrived: none (every rank issued seq 40: stuck inside NCCL)", "exited with status 1"},
         "--set parallel.bucket_kb=4"},
        // NCCL's asynchronous error on rank 1, by name
        {"DTRAIN_FAKE_NCCL_FAULT=error:5:1",
         {"NCCL allreduce (seq 5, 39202 x F32) on rank 1: NCCL's asynchronous error: unhandled system error "
          "(ncclResult 2): fake NCCL: an error injected at op 5 on rank 1", "rank 1 (pid"}, ""},
        // rank 1 dies inside NCCL
        {"DTRAIN_FAKE_NCCL_FAULT=abort:5:1", {"rank 1 aborts in op 5", "killed by signal 6"}, ""},
        // rank 1 never joins the communicator's init
        {"DTRAIN_FAKE_NCCL_FAULT=hang:0:1",
         {"NCCL's communicator init on rank 0: timed out after 2 s; ranks not arrived: none (every rank began it: "
          "stuck inside NCCL)", "exited with status 1"}, ""},
        // rank 1 stopped before its step 5: rank 0 waits in NCCL, and the host names rank 1
        {"DTRAIN_FAULT_STEP=1:5:stop",
         {"NCCL allreduce (seq 5, 39202 x F32) on rank 0: timed out after 2 s; ranks not arrived: unknown to NCCL; "
          "the host communicator, asked:", "ranks not arrived: 1"}, ""},
        // a pipeline's streams (a communicator a way, of 2 ranks): stage 1's receive of step 3's first
        // activations never comes (the fake's op 5 of the activations' communicator)
        {"DTRAIN_FAKE_NCCL_FAULT=hang:5:1",
         {"rank 1, step 3: pipeline stage 1: receiving activations from stage 0: recv (384 x F32, peer 0) on rank 1: "
          "timed out after 2 s", "exited with status 1"}, PP2},
        {"DTRAIN_FAKE_NCCL_FAULT=error:5:1",
         {"pipeline stage 1: receiving activations from stage 0: NCCL recv (384 x F32, peer 0) on rank 1: NCCL's "
          "asynchronous error: unhandled system error (ncclResult 2): fake NCCL: an error injected at op 5", "rank 1 "
          "(pid"}, PP2},
        // a tensor-parallel shard's sums on NCCL: step 3's first never ends
        {"DTRAIN_FAKE_NCCL_FAULT=hang:5:1",
         {"rank 0, step 3: tensor-parallel allreduce: NCCL allreduce (seq 5, 160 x F32) on rank 0: timed out after 2 s",
          "exited with status 1"}, "--set parallel.tensor=2"},
        // stage 0 dies inside NCCL: stage 1 names it at once
        {"DTRAIN_FAKE_NCCL_FAULT=abort:7:0",
         {"pipeline stage 1: receiving activations from stage 0: NCCL recv (384 x F32, peer 0) on rank 1: rank 0 exited",
          "killed by signal 6"}, PP2},
    };
    for (size_t i = 0; i < sizeof f / sizeof *f; i++) {
        char env[300];
        double secs = 0;
        snprintf(env, sizeof env, "DTRAIN_COMM_TIMEOUT=2 %s", f[i].env);
        int rc = run_env("fault", 2, env, f[i].flags, &secs);
        CHECK(rc != 0 && strstr(g_out, f[i].says[0]) && strstr(g_out, f[i].says[1]) && secs < 60,
              "%s: exit %d after %.1f s, '%s' and '%s'\n%s", f[i].env, rc, secs, f[i].says[0], f[i].says[1], g_out);
    }
    // the fake's segments are unlinked once every rank has its own, so even dead ranks leave none
    int left = system("ls /dev/shm | grep -q dtrain-fake-nccl");
    CHECK(left != 0, "no segment of the fake NCCL left in /dev/shm");
}

// Refused with a clear error: NCCL asked for where ranks share a GPU, an
// unknown backend, an NCCL too old (which auto passes over, saying why),
// a GPU out of range.
static void test_nccl_refusals(void) {
    struct {
        const char *env;
        int workers;
        const char *flags, *says;
        int ok;
    } f[] = {
        {"DTRAIN_GPU_SIM_DEVICES=1 DTRAIN_GPU_COMM=nccl", 2, "",
         "DTRAIN_GPU_COMM=nccl on rank 0: 2 ranks of this host on 1 GPU, and NCCL takes one GPU a rank", 0},
        {"DTRAIN_GPU_SIM_DEVICES=2 DTRAIN_GPU_COMM=nccl", 2, "--set train.device=cuda:1",
         "DTRAIN_GPU_COMM=nccl on rank 0: 2 ranks of this host on cuda:1, and NCCL takes one GPU a rank", 0},
        {"DTRAIN_GPU_COMM=gloo", 2, "", "DTRAIN_GPU_COMM=gloo: expected nccl, staging, or auto", 0},
        {"DTRAIN_FAKE_NCCL_VERSION=21703 DTRAIN_GPU_COMM=nccl", 2, "",
         "is version 2.17.3; dtrain needs 2.18 or later, before 3", 0},
        {"DTRAIN_FAKE_NCCL_VERSION=21703", 2, "",
         "gradients staged through host memory (pinned host buffers and the host's communicator; not nccl: NCCL at "
         FAKE_NCCL " is version 2.17.3; dtrain needs 2.18 or later, before 3)", 1},
        {"DTRAIN_GPU_SIM_DEVICES=3", 2, "--set train.device=cuda:3", "device = cuda:3: this machine has 3 GPUs", 0},
    };
    for (size_t i = 0; i < sizeof f / sizeof *f; i++) {
        int rc = run_env("refused-nccl", f[i].workers, f[i].env, f[i].flags, NULL);
        CHECK((f[i].ok ? rc == 0 : rc != 0) && strstr(g_out, f[i].says), "%s %s: exit %d, '%s'\n%s", f[i].env,
              f[i].flags, rc, f[i].says, g_out);
    }
}

// What a device run refuses, by name, before its first step.
static void test_refusals(void) {
    struct {
        const char *cfg, *flags, *says;
    } no[] = {
        {cfg_mlp_full, "--device cuda --workers 2 --zero 2 --spares 1", "--spares with [parallel] zero on a GPU: each "
         "rank's slice of the optimizer state (on its GPU alone) is its own, so after a death every rank goes back to "
         "the newest checkpoint and redoes the steps since; checkpoints are off (add --checkpoint-every N)"},
        {cfg_mlp_full, "--device cuda --set compression.method=int8", "with [compression] method (other than fp16, "
         "bf16): not in this dtrain yet"},
        {cfg_mlp_full, "--device cuda --workers 2 --zero 1 --set compression.method=bf16", "[compression] method works "
         "with plain data parallel and parameter servers only"},
        {cfg_mlp_full, "--device cuda --workers 2 --set compression.method=bf16 --set compression.min_bytes=64",
         "with [compression] min_bytes (pieces sent as fp32): not in this dtrain yet"},
        {cfg_gpt, "--device cuda --set train.recompute=blocks", "with [train] recompute"},
        {tl_cfg_cnn, "--device cuda:1", "device = cuda:1: this machine has 1 GPU (cuda:0)"},
    };
    char text[4096];
    for (size_t i = 0; i < sizeof no / sizeof *no; i++) {
        const char *cfg = no[i].cfg;
        if (cfg == tl_cfg_cnn) snprintf(text, sizeof text, "%s[data]\ndir = %s\n[train]\nbatch = 16\n", cfg, g_tmp);
        else snprintf(text, sizeof text, "%s", cfg);
        int rc = tl_train(g_tmp, "refused", text, 1, no[i].flags, g_out, sizeof g_out);
        CHECK(rc == 2 && strstr(g_out, no[i].says) && !strstr(g_out, "step 1"), "%s: exit %d, '%s'\n%s", no[i].flags,
              rc, no[i].says, g_out);
    }
    // a device too small: refused before the first step, with the bytes
    setenv("DTRAIN_GPU_SIM_MEM", "64K", 1);
    int rc = tl_train(g_tmp, "small", cfg_gpt, 1, "--device cuda", g_out, sizeof g_out);
    unsetenv("DTRAIN_GPU_SIM_MEM");
    CHECK(rc != 0 && strstr(g_out, "bytes of GPU memory (weights 0.") && strstr(g_out, "free of 65536") &&
              !strstr(g_out, "step 1"),
          "a model larger than the device refused naming the bytes: exit %d\n%s", rc, g_out);
    // room for the arena but not for the exchange's own buffers beside it
    // (deterministic mode's sums, 8 bytes a parameter): refused naming them
    char sum[700], mem[32];
    snprintf(sum, sizeof sum, "%s/row%zu-dev/summary.json", g_tmp, dev_row_of("mlp", 2, "--deterministic"));
    snprintf(mem, sizeof mem, "%.0f", tl_json_number(sum, "arena_bytes") + 4096);
    setenv("DTRAIN_GPU_SIM_MEM", mem, 1);
    rc = tl_train(g_tmp, "small2", model_text("mlp", text, sizeof text), 2, "--device cuda --deterministic", g_out,
                  sizeof g_out);
    unsetenv("DTRAIN_GPU_SIM_MEM");
    CHECK(rc != 0 && strstr(g_out, "deterministic mode's fixed-point sums on the GPU: 313616 bytes") &&
              !strstr(g_out, "step 1"),
          "the exchange's buffers beside the arena refused by name and bytes (GPU of %s bytes): exit %d\n%s", mem, rc,
          g_out);
    // no simulated GPU asked for: the CUDA device (none here, or one that lacks ops), never the CPU
    unsetenv("DTRAIN_GPU");
    rc = tl_train(g_tmp, "nogpu", cfg_mlp_full, 1, "--device cuda", g_out, sizeof g_out);
    setenv("DTRAIN_GPU", "sim", 1);
    CHECK(rc == 2 && strstr(g_out, "[train] device = cuda") && !strstr(g_out, "step 1"),
          "without DTRAIN_GPU=sim: the CUDA device's refusal, no CPU run: exit %d\n%s", rc, g_out);
}

static void make_data(void) {
    tl_make_images(g_tmp, "train", 400, 1);
    tl_make_images(g_tmp, "t10k", 64, 2);
    snprintf(cfg_mlp_full, sizeof cfg_mlp_full, "%s[data]\ndir = %s\n", cfg_mlp, g_tmp);
    snprintf(cfg_cnn_full, sizeof cfg_cnn_full, "%s[data]\ndir = %s\n[train]\nbatch = 16\nmax_steps = %d\nseed = 7\n",
             tl_cfg_cnn, g_tmp, STEPS);
    enum { N = 4000 };
    uint16_t *t = malloc(sizeof(uint16_t) * N);
    dt_rng r;
    dt_rng_seed(&r, 11);
    t[0] = 0;
    for (size_t i = 1; i < N; i++)
        t[i] = dt_rng_below(&r, 8) ? (uint16_t)((5 * t[i - 1] + 3) % 32) : (uint16_t)dt_rng_below(&r, 32);
    CHECK(dt_tokens_write(tmp("train.bin"), t, N) == DT_OK && dt_tokens_write(tmp("val.bin"), t, 1000) == DT_OK,
          "token files: %s", dt_last_error());
    free(t);
    char train[600];
    snprintf(train, sizeof train, "%s", tmp("train.bin"));
    snprintf(cfg_gpt, sizeof cfg_gpt,
             "[model]\npreset = gpt\nn_layer = 2\nn_head = 2\nn_embd = 16\nblock_size = 8\nvocab_size = 32\n"
             "[data]\ndataset = tokens\ntrain_file = %s\nval_file = %s\n"
             "[optim]\nname = adamw\nlr = 0.01\nclip_norm = 1.0\n[schedule]\nname = cosine\nwarmup_steps = 5\n"
             "[train]\nbatch = 6\nseq_len = 8\nmax_steps = 20\neval_every = 10\neval_batches = 1\nseed = 5\n",
             train, tmp("val.bin"));
}

// A run on the GPU machine: every step logged, TF32 off (the comparisons
// with the CPU's shipped losses).
#define ON_GPU "--set train.log_every=1 --set train.tf32=false --device cuda"

// On a GPU machine, NCCL itself with one rank (where it is found): the
// MLP's gradients through a communicator of one GPU, the weights the run's
// without it bitwise (a sum over one rank is its values).
static void gpu_nccl_alone(const char *text) {
    dt_gpu_lib l;
    if (dt_gpu_lib_open("nccl", &l) != DT_OK) {
        printf("skipped: NCCL with one rank: %s\n", dt_last_error());
        return;
    }
    dt_gpu_lib_close(&l);
    setenv("DTRAIN_GPU_COMM", "nccl", 1);
    int rc = tl_train(g_tmp, "mlp-nccl", text, 1, ON_GPU, g_out, sizeof g_out), bw = 0;
    unsetenv("DTRAIN_GPU_COMM");
    double diff = tl_runs_diff(g_tmp, "mlp", "mlp-nccl", &bw);
    char sum[700];
    snprintf(sum, sizeof sum, "%s/summary.json", tmp("mlp-nccl"));
    CHECK(rc == 0 && tl_count(sum, "\"collectives\":\t\"nccl\"") == 1 && diff == 0 && bw,
          "the MLP on one GPU through NCCL with one rank (summary.json: collectives nccl): the run's weights without it "
          "bitwise (exit %d, diff %g)\n%s", rc, diff, g_out);
}

// On a GPU machine, files interchangeable: the tiny GPT's step-10
// checkpoint from the GPU resumed on the CPU, and the CPU's resumed on the
// GPU (a CPU run of 20 tiny steps there), each run's steps 11 to 20 within
// the GPU's tolerance (1e-4) of the CPU's shipped losses; `dtrain eval`
// reads the GPU's final weights.
static void gpu_crosswise(const char *text) {
    char ck[4096], f[1200];
    const char *dev = ON_GPU;
    snprintf(ck, sizeof ck, "%s[checkpoint]\nevery_steps = 10\n", text);
    int rc = tl_train(g_tmp, "x-dev", ck, 1, dev, g_out, sizeof g_out);
    CHECK(rc == 0, "the GPT with checkpoints on the GPU: exit %d\n%s", rc, g_out);
    rc = tl_train(g_tmp, "x-cpu", ck, 1, "--set train.log_every=1", g_out, sizeof g_out);
    CHECK(rc == 0, "the GPT with checkpoints on the CPU: exit %d\n%s", rc, g_out);
    const char *run[2] = {"x-from-dev", "x-from-cpu"}, *from[2] = {"x-dev", "x-cpu"};
    for (int i = 0; i < 2; i++) {
        snprintf(f, sizeof f, "%s --set checkpoint.resume=%s/%s/checkpoints/step-00000010.safetensors",
                 i ? dev : "--set train.log_every=1", g_tmp, from[i]);
        rc = tl_train(g_tmp, run[i], ck, 1, f, g_out, sizeof g_out);
        double want[STEPS + 1], worst = rc == 0 && fixture("gpt", want) ? 0 : INFINITY;
        for (int s = 11; s <= STEPS && worst < INFINITY; s++) {
            double d = fabs(step_loss(tmp(run[i]), s) - want[s]) / fabs(want[s]);
            if (d != d) worst = INFINITY;  // (a step not logged)
            else if (d > worst) worst = d;
        }
        CHECK(worst <= 1e-4, "%s's checkpoint resumed on the %s: steps 11 to 20 within %.3g of the CPU's shipped "
              "losses (1e-4; exit %d)\n%s", i ? "the CPU" : "the GPU", i ? "GPU" : "CPU", worst, rc, g_out);
    }
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s eval %s --checkpoint %s/x-dev/model.safetensors 2>&1", tl_dtrain(), tmp("x-dev.ini"),
             g_tmp);
    rc = tl_run(cmd, g_out, sizeof g_out);
    CHECK(rc == 0 && strstr(g_out, "loss"), "dtrain eval reads the GPU run's weights on the CPU: exit %d\n%s", rc,
          g_out);
}

// On a GPU machine: the device's runs against the CPU's shipped losses.
// ZeRO stages 2 and 3 with 2 ranks sharing one GPU (staged; on a GPU:
// CUDA's memory backed on demand, and the parameters given back after
// their kernels' event), 2 pipeline stages and 2 tensor shards (the
// stages' memory backed on demand, the streams and the shards' sums
// through pinned host memory), each step's loss against the one-process
// CPU losses shipped for the MLP, within the GPU's tolerances (here, on
// the simulated GPU, the same check).
static void zero_gpu_rows(void) {
    static const char *const rows[][2] = {
        {"mlp-zero2", "--zero 2 --set parallel.bucket_kb=64"},
        {"mlp-zero3", "--zero 3 --set parallel.bucket_kb=64"},
        {"mlp-pipeline2", "--set parallel.pipeline=2 --set parallel.pipeline_balance=flops"},
        {"mlp-tensor2", "--set parallel.tensor=2"},
    };
    char text[4096], flags[600];
    for (size_t i = 0; i < sizeof rows / sizeof *rows; i++) {
        snprintf(flags, sizeof flags, ON_GPU " %s", rows[i][1]);
        int rc = tl_train(g_tmp, rows[i][0], model_text("mlp", text, sizeof text), 2, flags, g_out, sizeof g_out);
        CHECK(rc == 0, "%s: 2 ranks on the GPU: exit %d\n%s", rows[i][0], rc, g_out);
        if (rc == 0) check_fixture("mlp", tmp(rows[i][0]), 0);
    }
}

// On a GPU machine: the same run again gives the same weights bitwise (no
// floating-point atomics in the reductions, cuDNN's deterministic
// algorithms), in fp32 and bf16.
static void gpu_repeat(void) {
    const char *rows[][3] = {{"mlp", "mlp", ""}, {"gpt", "gpt", ""}, {"cnn", "cnn", ""},
                             {"gpt-bf16", "gpt", "--precision bf16"}};
    char text[4096], flags[600], again[64];
    for (int i = 0; i < 4; i++) {
        snprintf(flags, sizeof flags, ON_GPU " %s", rows[i][2]);
        snprintf(again, sizeof again, "%s-again", rows[i][0]);
        int rc = tl_train(g_tmp, again, model_text(rows[i][1], text, sizeof text), 1, flags, g_out, sizeof g_out);
        int bw = 0;
        double diff = rc == 0 ? tl_runs_diff(g_tmp, rows[i][0], again, &bw) : -1;
        CHECK(rc == 0 && diff == 0 && bw, "%s on the GPU again: the same weights bitwise (exit %d, diff %g)", rows[i][0],
              rc, diff);
    }
}

static void test_graph(void);

static int on_gpu(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);  // each line in the log as it comes (a stage may be stopped at its limit)
    unsetenv("DTRAIN_GPU");
    char why[512];
    if (dt_dev_get()->count(why, sizeof why) == 0) {
        printf("skipped: no usable GPU (%s)\n", why);
        tl_cleanup(g_tmp);
        return 77;
    }
    make_data();
    const char *names[] = {"mlp", "mlp-sgd", "gpt", "cnn"};
    size_t nh = sizeof half_rows / sizeof *half_rows;
    char text[4096], flags[600];
    for (size_t i = 0; i < 4 + nh; i++) {
        const char *name = i < 4 ? names[i] : half_rows[i - 4].name, *model = i < 4 ? names[i] : half_rows[i - 4].model;
        snprintf(flags, sizeof flags, ON_GPU " %s", i < 4 ? "" : half_rows[i - 4].extra);
        int rc = tl_train(g_tmp, name, model_text(model, text, sizeof text), 1, flags, g_out, sizeof g_out);
        CHECK(rc == 0, "%s on the GPU: exit %d\n%s", name, rc, g_out);
        if (rc == 0) check_fixture(name, tmp(name), 0);
        char sum[700];  // (CUDA's scratch: cub's sort and cuDNN's workspaces asked for too)
        snprintf(sum, sizeof sum, "%s/summary.json", tmp(name));
        if (rc == 0) planned_scratch(sum, name);
    }
    // the GPT with its attention on the GEMM plan ([train] attention = gemm: cuBLASLt's strided batches and the
    // softmax's row kernels at heads of 8), against the same CPU losses
    const char *gemm[][2] = {{"gpt", ""}, {"gpt-bf16", "--precision bf16"}};
    for (int i = 0; i < 2; i++) {
        char name[64];
        snprintf(name, sizeof name, "%s-gemm", gemm[i][0]);
        snprintf(flags, sizeof flags, ON_GPU " --set train.attention=gemm %s", gemm[i][1]);
        int rc = tl_train(g_tmp, name, cfg_gpt, 1, flags, g_out, sizeof g_out);
        CHECK(rc == 0, "%s on the GPU: exit %d\n%s", name, rc, g_out);
        if (rc == 0) check_fixture(gemm[i][0], tmp(name), 0);
    }
    gpu_repeat();
    gpu_nccl_alone(model_text("mlp", text, sizeof text));
    gpu_crosswise(model_text("gpt", text, sizeof text));
    test_graph();
    zero_gpu_rows();
    tl_cleanup(g_tmp);
    return tl_finish();
}

// One rank's step as a CUDA graph ([train] cuda_graph, on by default;
// docs/gpu.md "A step as a CUDA graph"): on the simulated GPU a graph is
// its captured calls, run again at each replay with the captured
// arguments, a replayed step's calls compared with them (an op or an
// argument that differs is an error), so a graph that would replay stale
// values shows here. The weights those of the run that queues every
// step's calls, bitwise: the MLP with evaluations between steps and an
// epoch's short last batch (another shape: queued one by one), the CNN in
// bf16 and in fp32 (its dropout off; in fp32 its convolutions cuDNN's on
// a GPU), the GPT in bf16. Not taken where the calls
// change from step to step (dropout's key, fp16's loss scale) or off. On
// a GPU (test_gpu_sim gpu) the same: CUDA's graphs against the steps'
// kernels queued one by one, bitwise.
static void graph_run(const char *name, const char *text, const char *flags, int eligible) {
    char sum[700], off[128], all[700];
    snprintf(all, sizeof all, "--device cuda %s", flags);
    CHECK(tl_train(g_tmp, name, text, 1, all, g_out, sizeof g_out) == 0, "%s: %s", name, g_out);
    snprintf(sum, sizeof sum, "%s/summary.json", tmp(name));
    int yes = tl_count(sum, "\"eligible\":\ttrue") == 1;
    double at = tl_json_number(sum, "captured_at_step"), replays = tl_json_number(sum, "replayed_steps");
    CHECK(yes == eligible && (eligible ? at == 2 && replays > 0 : at == 0 && replays == 0),
          "%s %s: the step as a graph %s (eligible %d, captured at step %g, %g replays)", name, flags,
          eligible ? "captured at step 2 and replayed" : "not taken", yes, at, replays);
    planned_scratch(sum, name);
    if (!eligible) return;
    snprintf(off, sizeof off, "%s-off", name);
    snprintf(all, sizeof all, "--device cuda %s --set train.cuda_graph=false", flags);
    CHECK(tl_train(g_tmp, off, text, 1, all, g_out, sizeof g_out) == 0, "%s: %s", off, g_out);
    int bw = 0;
    double diff = tl_runs_diff(g_tmp, off, name, &bw);
    CHECK(diff == 0 && bw, "%s %s: replayed as a graph, the weights of the steps queued call by call bitwise (diff %g)",
          name, flags, diff);
}

static void test_graph(void) {
    char text[4096], drop[4096], sum[700];
    snprintf(text, sizeof text, "%s%s", cfg_mlp_full, opt_adamw);
    graph_run("graph-mlp", text, "--set train.batch=48 --set train.eval_every=5", 1);
    snprintf(sum, sizeof sum, "%s/summary.json", tmp("graph-mlp"));
    CHECK(tl_json_number(sum, "steps_of_another_shape") > 0, "the MLP in batches of 48: the epoch's last, of 16, "
          "queued call by call (%g)", tl_json_number(sum, "steps_of_another_shape"));
    const char *p = strstr(text, "dropout p=0\n");
    CHECK(p != NULL, "the MLP's config has its dropout layer");
    snprintf(drop, sizeof drop, "%.*sdropout p=0.2%s", p ? (int)(p - text) : 0, text, p ? p + 11 : "");
    // the CNN without its dropout (its convolutions' geometry kept by value in the graph's calls)
    char cnn[4096];
    const char *q = strstr(cfg_cnn_full, "dropout p=0.3\n");
    CHECK(q != NULL, "the CNN's config has its dropout layer");
    snprintf(cnn, sizeof cnn, "%.*sdropout p=0%s", q ? (int)(q - cfg_cnn_full) : 0, cfg_cnn_full, q ? q + 13 : "");
    graph_run("graph-cnn", cnn, "--precision bf16", 1);
    graph_run("graph-cnn32", cnn, "", 1);  // (fp32: the seam's conv2d, cuDNN's on a GPU, in the graph)
    graph_run("graph-dropout", drop, "", 0);
    graph_run("graph-fp16", text, "--precision fp16", 0);
    graph_run("graph-off", text, "--set train.cuda_graph=false", 0);
    graph_run("graph-gpt", cfg_gpt, "--precision bf16 --set train.eval_every=10", 1);
}

int main(int argc, char **argv) {
    snprintf(g_tmp, sizeof g_tmp, "/tmp/dtrain-test-gpu-sim-XXXXXX");
    if (!mkdtemp(g_tmp)) return perror("mkdtemp"), 1;
    if (argc > 1 && !strcmp(argv[1], "gpu")) return on_gpu();
    g_write = argc > 1 && !strcmp(argv[1], "--write-fixtures");
    if (g_write) remove(FIXTURES);
    setenv("DTRAIN_GPU", "sim", 1);
    test_protection();
    test_vm();
    test_ce_padded();
    test_gemm16();
    test_table();
    const size_t sq[][2] = {{1, 1}, {4095, 2}, {4097, 3}, {39202, 3}, {100003, 2}, {100003, 7}, {5, 7}};
    for (size_t i = 0; i < sizeof sq / sizeof *sq; i++) test_sumsq_parts(sq[i][0], (int)sq[i][1]);
    make_data();
    test_mlp();
    test_gpt();
    test_graph();
    one_read();
    diverged();
    test_cnn();
    test_half();
    test_fp16_skip();
    test_resume();
    test_ranks();
    test_ranks_resume();
    test_zero_resume();
    if (!g_write) zero_gpu_rows();
    test_spares();
    test_nccl_rows();
    test_nccl_faults();
    test_nccl_refusals();
    unsetenv("DTRAIN_GPU_SIM_DEVICES");
    unsetenv("DTRAIN_NCCL");
    test_refusals();
    tl_cleanup(g_tmp);
    return tl_finish();
}
