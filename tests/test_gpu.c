/* The GPU device (docs/gpu.md).
 *
 *   test_gpu        (ctest test_gpu, everywhere): [train] device is
 *                   refused naming what is missing (no CUDA in the build,
 *                   no driver, no such GPU), never run on the CPU instead;
 *                   bad names are refused by the config and by --device;
 *                   cuDNN and NCCL are found at run time, or refused
 *                   naming the file and the version.
 *   test_gpu ops    (ctest test_gpu_ops): every GPU op against the CPU op
 *                   on awkward sizes (1, 255, 257, a prime past 10^5, 2^20
 *                   + 7), five steps each: AdamW (with weight decay and a
 *                   gradient scale), SGD with and without momentum and
 *                   Nesterov; within 1e-6 relative. Reported skipped
 *                   (exit 77, the reason said) where no GPU can be used. */
#include "dtrain/config.h"
#include "dtrain/optim.h"
#include "dtrain/train.h"
#include "gpu/gpu.h"
#include "testlib.h"

#include <dlfcn.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static char g_out[1 << 14];

static void test_refusals(void) {
    char why[512] = "";
    int n = dt_gpu_count(why, sizeof why);
    printf("this build: %s; GPUs here: %d%s%s%s\n", dt_gpu_build(), n, n ? "" : " (", n ? "" : why, n ? "" : ")");
    dt_config c;
    const char *sets[] = {"train.device=cuda"};
    CHECK(dt_config_load(&c, "configs/fashion-mlp.ini", sets, 1) == DT_OK, "device = cuda parses: %s", dt_last_error());
    dt_status st = dt_train_check_device(&c);
    if (n == 0)
        CHECK(st == DT_ERR_CONFIG && strstr(dt_last_error(), "[train] device = cuda: ") && strstr(dt_last_error(), why),
              "no GPU: device = cuda refused with the reason: %s", dt_last_error());
    else  // (a GPU: training on it is not there yet, and said so)
        CHECK(st == DT_ERR_CONFIG && strstr(dt_last_error(), "training on a GPU is not in this dtrain yet"),
              "a GPU: device = cuda refused as not there yet: %s", dt_last_error());
    const char *far[] = {"train.device=cuda:63"};
    CHECK(dt_config_load(&c, "configs/fashion-mlp.ini", far, 1) == DT_OK && dt_train_check_device(&c) == DT_ERR_CONFIG &&
              strstr(dt_last_error(), "cuda:63"),
          "cuda:63 refused: %s", dt_last_error());
    const char *cpu[] = {"train.device=cpu"};
    CHECK(dt_config_load(&c, "configs/fashion-mlp.ini", cpu, 1) == DT_OK && dt_train_check_device(&c) == DT_OK,
          "cpu is always there: %s", dt_last_error());
    const char *bad[] = {"gpu", "cuda:", "cuda:x", "cuda:01", "cuda:-1", "CUDA", "cuda:0:1", ""};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char set[64];
        snprintf(set, sizeof set, "train.device=%s", bad[i]);
        const char *s1[] = {set};
        CHECK(dt_config_load(&c, "configs/fashion-mlp.ini", s1, 1) == DT_ERR_CONFIG &&
                  strstr(dt_last_error(), "[train] device: expected cpu, cuda or cuda:N"),
              "device '%s' refused by the config: %s", bad[i], dt_last_error());
    }
    // The command line: before any worker starts, exit 2 naming --device.
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s train configs/fashion-mlp.ini --device cuda:x", tl_dtrain());
    int rc = tl_run(cmd, g_out, sizeof g_out);
    CHECK(rc == 2 && strstr(g_out, "--device: expected cpu, cuda or cuda:N"), "--device cuda:x: exit %d\n%s", rc, g_out);
    snprintf(cmd, sizeof cmd, "%s train configs/fashion-mlp.ini --device cuda --workers 2", tl_dtrain());
    rc = tl_run(cmd, g_out, sizeof g_out);
    CHECK(rc == 2 && strstr(g_out, "[train] device = cuda") && !strstr(g_out, "step 1"),
          "--device cuda: refused before a step, never a CPU run: exit %d\n%s", rc, g_out);
}

// The CPU's optimizer and the GPU's on the same values for `steps` steps;
// the largest relative difference of the weights and the state.
static double compare(const dt_optim_params *p, size_t n, int steps) {
    dt_optim *o;
    if (dt_optim_create(&o, p, n) != DT_OK) return INFINITY;
    float *w = malloc(sizeof(float) * n), *g = malloc(sizeof(float) * n), *gw = malloc(sizeof(float) * n);
    float *gs0 = malloc(sizeof(float) * n), *gs1 = malloc(sizeof(float) * n);
    void *dw = NULL, *dg = NULL, *d0 = NULL, *d1 = NULL;
    int ns = dt_optim_num_states(o);
    dt_status st = dt_gpu_alloc(&dw, sizeof(float) * n);
    if (st == DT_OK) st = dt_gpu_alloc(&dg, sizeof(float) * n);
    if (st == DT_OK && ns > 0) st = dt_gpu_alloc(&d0, sizeof(float) * n);
    if (st == DT_OK && ns > 1) st = dt_gpu_alloc(&d1, sizeof(float) * n);
    uint64_t x = 88172645463325252ull;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        w[i] = (float)((double)(x >> 11) / 9007199254740992.0 - 0.5);
    }
    if (st == DT_OK) st = dt_gpu_to_device(dw, w, sizeof(float) * n);
    if (st == DT_OK && ns > 0) {  // (the state starts at zero, as the CPU's)
        float *z = calloc(n, sizeof(float));
        st = dt_gpu_to_device(d0, z, sizeof(float) * n);
        if (st == DT_OK && ns > 1) st = dt_gpu_to_device(d1, z, sizeof(float) * n);
        free(z);
    }
    for (int s = 0; s < steps && st == DT_OK; s++) {
        for (size_t i = 0; i < n; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            g[i] = (float)((double)(x >> 11) / 9007199254740992.0 - 0.5) * 0.1f;
        }
        dt_optim_begin_step(o);
        float lr = 1e-3f * (float)(s + 1), scale = 0.5f;
        if ((st = dt_gpu_to_device(dg, g, sizeof(float) * n)) != DT_OK) break;
        if (p->kind == DT_OPTIM_ADAMW) {
            dt_adamw_k k = dt_optim_adamw_k(o, lr, scale);
            st = dt_gpu_adamw(dw, dg, d0, d1, n, &k);
        } else {
            dt_sgd_k k = dt_optim_sgd_k(o, lr, scale);
            st = dt_gpu_sgd(dw, dg, d0, n, &k);
        }
        dt_optim_update(o, 0, n, w, g, lr, scale);
    }
    double worst = st == DT_OK ? 0 : INFINITY;
    if (st == DT_OK && (st = dt_gpu_to_host(gw, dw, sizeof(float) * n)) == DT_OK) worst = tl_max_rel(w, gw, n, 1e-6);
    for (int j = 0; j < ns && st == DT_OK; j++) {
        st = dt_gpu_to_host(j ? gs1 : gs0, j ? d1 : d0, sizeof(float) * n);
        double d = st == DT_OK ? tl_max_rel(dt_optim_state(o, j), j ? gs1 : gs0, n, 1e-6) : INFINITY;
        worst = d > worst || isnan(d) ? d : worst;
    }
    if (st != DT_OK) printf("GPU: %s\n", dt_last_error());
    dt_gpu_free(dw), dt_gpu_free(dg), dt_gpu_free(d0), dt_gpu_free(d1);
    free(w), free(g), free(gw), free(gs0), free(gs1);
    dt_optim_free(o);
    return worst;
}

static void test_ops(void) {
    char why[512], what[200] = "";
    if (dt_gpu_count(why, sizeof why) == 0) {
        tl_skip("no GPU to run the ops on: %s", why);
        return;
    }
    CHECK(dt_gpu_use(0) == DT_OK && dt_gpu_describe(0, what, sizeof what) == DT_OK, "GPU 0: %s", dt_last_error());
    printf("GPU 0: %s (%s)\n", what, dt_gpu_build());
    const size_t sizes[] = {1, 255, 257, 100003, (1u << 20) + 7};
    struct { const char *name; dt_optim_kind kind; float momentum, wd; int nesterov; } opts[] = {
        {"adamw", DT_OPTIM_ADAMW, 0, 0.01f, 0},
        {"sgd", DT_OPTIM_SGD, 0, 0, 0},
        {"sgd momentum", DT_OPTIM_SGD, 0.9f, 1e-4f, 0},
        {"sgd nesterov", DT_OPTIM_SGD, 0.9f, 0, 1},
    };
    for (size_t a = 0; a < sizeof opts / sizeof *opts; a++)
        for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
            dt_optim_params p = dt_optim_default_params(opts[a].kind);
            p.momentum = opts[a].momentum;
            p.weight_decay = opts[a].wd;
            p.nesterov = opts[a].nesterov;
            double d = compare(&p, sizes[i], 5);
            CHECK(d >= 0 && d <= 1e-6, "%s, n = %zu, 5 steps: GPU against CPU, max rel diff %.3g", opts[a].name,
                  sizes[i], d);
        }
    CHECK(dt_gpu_sync() == DT_OK, "no error left on the device: %s", dt_last_error());
}

// cuDNN and NCCL found at run time: the machine's own where the loader finds
// them (this machine's CUDA toolkit has both), a user's file (DTRAIN_CUDNN,
// DTRAIN_NCCL), PyTorch's packages under a Python site, and the refusals: a
// missing file, a library that is not the one asked for, another version.
static void test_libs(void) {
    const char *names[] = {"cudnn", "nccl"}, *sonames[] = {"libcudnn.so.9", "libnccl.so.2"};
    for (int i = 0; i < 2; i++) {
        void *ref = dlopen(sonames[i], RTLD_NOW | RTLD_LOCAL);  // the loader's own answer, independently
        dt_gpu_lib l;
        dt_status st = dt_gpu_lib_open(names[i], &l);
        if (ref)
            CHECK(st == DT_OK && strstr(l.path, sonames[i]) && l.version >= (i ? 21800 : 90000) &&
                      dt_gpu_lib_sym(&l, i ? "ncclGetVersion" : "cudnnGetVersion"),
                  "%s on the loader's path: found (%s, version %ld): %s", names[i], l.path, l.version,
                  st ? dt_last_error() : "");
        else
            printf("%s: not on this machine's loader path (%s)\n", names[i], st ? dt_last_error() : l.path);
        printf("%s: %s\n", names[i], st == DT_OK ? l.path : dt_last_error());
        dt_gpu_lib_close(&l);
        if (ref) dlclose(ref);
    }
    dt_gpu_lib l;
    struct { const char *env, *file, *which, *want; } bad[] = {
        {"DTRAIN_CUDNN", "/nonexistent/libcudnn.so.9", "cudnn", "DTRAIN_CUDNN=/nonexistent/libcudnn.so.9: cannot load it"},
        {"DTRAIN_NCCL", FAKE_CUDNN9, "nccl", "no ncclGetVersion: not NCCL"},
        {"DTRAIN_CUDNN", FAKE_CUDNN8, "cudnn", "is version 8.9.2; dtrain needs 9.0 or later, before 10"},
    };
    for (int i = 0; i < 3; i++) {
        setenv(bad[i].env, bad[i].file, 1);
        dt_status st = dt_gpu_lib_open(bad[i].which, &l);
        CHECK(st == DT_ERR_IO && strstr(dt_last_error(), bad[i].want) && !l.handle, "%s=%s refused: %s", bad[i].env,
              bad[i].file, dt_last_error());
        unsetenv(bad[i].env);
    }
    setenv("DTRAIN_CUDNN", FAKE_CUDNN9, 1);
    CHECK(dt_gpu_lib_open("cudnn", &l) == DT_OK && l.version == 90100 && strstr(l.path, "fake_cudnn_90100"),
          "DTRAIN_CUDNN names the file taken: %s", l.path);
    dt_gpu_lib_close(&l);
    unsetenv("DTRAIN_CUDNN");
    CHECK(dt_gpu_lib_open("cublas", &l) == DT_ERR_ARG, "an unknown library is refused: %s", dt_last_error());
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "ops")) test_ops();
    else test_refusals(), test_libs();
    return tl_finish();
}
