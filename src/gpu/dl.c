/* cuBLASLt, cuDNN and NCCL, found at run time (gpu.h: dt_gpu_lib_open).
 * They are never linked: a binary built here starts where none is
 * installed, and a GPU machine may have them only inside PyTorch's
 * packages (site-packages/nvidia/cublas/lib, .../cudnn/lib, .../nccl/lib). Compiled in every build:
 * it needs no CUDA header, only the loader. */
#include "gpu/gpu.h"

#include <dlfcn.h>
#include <glob.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *which, *name, *soname, *env, *pkg, *version_fn;
    long min, below;  // accepted versions: [min, below)
} libspec;

#ifndef DT_CUDA_MAJOR
#define DT_CUDA_MAJOR 13  // (CMake sets the toolkit's)
#endif
#define DT_STR_(x) #x
#define DT_STR(x) DT_STR_(x)

// Version codes: major*10000 + minor*100 + patch. cuBLASLt's major is the
// CUDA toolkit's this dtrain was built with.
static const libspec g_libs[] = {
    {"cublaslt", "cuBLASLt", "libcublasLt.so." DT_STR(DT_CUDA_MAJOR), "DTRAIN_CUBLASLT", "nvidia/cublas/lib",
     "cublasLtGetVersion", DT_CUDA_MAJOR * 10000L, (DT_CUDA_MAJOR + 1) * 10000L},
    {"cudnn", "cuDNN", "libcudnn.so.9", "DTRAIN_CUDNN", "nvidia/cudnn/lib", "cudnnGetVersion", 90000, 100000},
    {"nccl", "NCCL", "libnccl.so.2", "DTRAIN_NCCL", "nvidia/nccl/lib", "ncclGetVersion", 21800, 30000},
};

// Where PyTorch's wheels put them (pip, conda, a user's site).
static const char *const g_sites[] = {
    "/usr/local/lib/python3*/dist-packages", "/usr/lib/python3*/dist-packages", "/usr/local/lib/python3*/site-packages",
    "/opt/conda/lib/python3*/site-packages", "%s/.local/lib/python3*/site-packages",
};

static void *open_in_sites(const libspec *l) {
    const char *home = getenv("HOME");
    for (size_t i = 0; i < sizeof g_sites / sizeof *g_sites; i++) {
        char pat[1024], site[512];
        if (strstr(g_sites[i], "%s") && !home) continue;
        snprintf(site, sizeof site, g_sites[i], home);
        snprintf(pat, sizeof pat, "%s/%s/%s", site, l->pkg, l->soname);
        glob_t g;
        void *h = NULL;
        if (glob(pat, 0, NULL, &g) == 0)
            for (size_t k = 0; k < g.gl_pathc && !h; k++) h = dlopen(g.gl_pathv[k], RTLD_NOW | RTLD_LOCAL);
        globfree(&g);
        if (h) return h;
    }
    return NULL;
}

static long version_of(const libspec *l, void *h) {
    void *f = dlsym(h, l->version_fn);
    if (!f) return -1;
    if (strcmp(l->which, "nccl")) return (long)((size_t (*)(void))f)();  // (cuBLASLt's, cuDNN's)
    int v = 0;
    return ((int (*)(int *))f)(&v) == 0 ? v : -1;
}

static dt_status check(const libspec *l, void *h, dt_gpu_lib *out) {
    struct link_map *lm = NULL;
    const char *path = dlinfo(h, RTLD_DI_LINKMAP, &lm) == 0 && lm ? lm->l_name : l->soname;
    snprintf(out->path, sizeof out->path, "%s", path);
    long v = version_of(l, h);
    if (v < 0) {
        dlclose(h);
        return dt_error(DT_ERR_IO, "%s at %s: no %s: not %s", l->name, out->path, l->version_fn, l->name);
    }
    if (v < l->min || v >= l->below) {
        dlclose(h);
        // (cuDNN 8 and before: major*1000 + minor*100 + patch)
        long major = v >= 10000 ? v / 10000 : v / 1000, minor = v >= 10000 ? v / 100 % 100 : v / 100 % 10;
        return dt_error(DT_ERR_IO, "%s at %s is version %ld.%ld.%ld; dtrain needs %ld.%ld or later, before %ld", l->name,
                        out->path, major, minor, v % 100, l->min / 10000, l->min / 100 % 100, l->below / 10000);
    }
    out->handle = h;
    out->version = v;
    return DT_OK;
}

dt_status dt_gpu_lib_open(const char *which, dt_gpu_lib *out) {
    memset(out, 0, sizeof *out);
    const libspec *l = NULL;
    for (size_t i = 0; i < sizeof g_libs / sizeof *g_libs; i++)
        if (!strcmp(which, g_libs[i].which)) l = &g_libs[i];
    if (!l) return dt_error(DT_ERR_ARG, "no GPU library '%s' (cublaslt, cudnn or nccl)", which);
    const char *forced = getenv(l->env);
    if (forced && *forced) {  // the user's file, and only it
        void *h = dlopen(forced, RTLD_NOW | RTLD_LOCAL);
        if (!h) return dt_error(DT_ERR_IO, "%s=%s: cannot load it: %s", l->env, forced, dlerror());
        return check(l, h, out);
    }
    void *h = dlopen(l->soname, RTLD_NOW | RTLD_LOCAL);
    if (!h) h = open_in_sites(l);
    if (!h)
        return dt_error(DT_ERR_IO, "%s (%s) not found: not on the loader's path, nor in PyTorch's packages (%s under "
                        "a Python site); set %s to the file", l->name, l->soname, l->pkg, l->env);
    return check(l, h, out);
}

void *dt_gpu_lib_sym(const dt_gpu_lib *lib, const char *name) { return lib->handle ? dlsym(lib->handle, name) : NULL; }

void dt_gpu_lib_close(dt_gpu_lib *lib) {
    if (lib->handle) dlclose(lib->handle);
    memset(lib, 0, sizeof *lib);
}
