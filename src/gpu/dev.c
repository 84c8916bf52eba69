/* The device seam (dev.h): the CUDA device's table, the choice between it
 * and the simulated GPU, and the one arena a run's blocks come from. */
#include "gpu/dev.h"
#include "gpu/gpu.h"
#include "gpu/launch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

size_t dt_dev_scratch_kernels(const dt_dev_scratch_ask *q) {
    switch (q->op) {
    case DT_ASK_ENCODER: return sizeof(int32_t) * dt_encoder_scratch_ints(q->n);
    case DT_ASK_COLSUM: return dt_colsum_scratch(q->n, q->C, 0);
    case DT_ASK_LAYERNORM: return dt_colsum_scratch(q->n, q->C, 1);
    case DT_ASK_SUMSQ: return dt_sumsq_scratch(q->n);
    case DT_ASK_CONV: return 0;
    }
    return 0;
}

// The bytes of scratch a call of CUDA's asks for: launch.h's, with cub's
// sort's room and cuDNN's workspaces.
static size_t gpu_scratch_of(const dt_dev_scratch_ask *q) {
    if (q->op == DT_ASK_ENCODER) return dt_gpu_encoder_scratch(q->n);
    if (q->op == DT_ASK_CONV) return dt_gpu_conv2d_scratch(q->n, q->g, q->C);
    return dt_dev_scratch_kernels(q);
}

// A kernel whose CUDA version is not written yet stays NULL (dt_dev_lacks
// names it); each dt_gpu_<name> that lands is wired in by one line here.
const dt_dev dt_dev_cuda = {
    .name = "cuda",
    .count = dt_gpu_count,
    .describe = dt_gpu_describe,
    .use = dt_gpu_use,
    .mem_info = dt_gpu_mem_info,
    .alloc = dt_gpu_alloc,
    .free = dt_gpu_free,
    .host_alloc = dt_gpu_host_alloc,
    .host_free = dt_gpu_host_free,
    .memset0 = dt_gpu_memset0,
    .vm_reserve = dt_gpu_vm_reserve,
    .vm_map = dt_gpu_vm_map,
    .vm_unmap = dt_gpu_vm_unmap,
    .vm_free = dt_gpu_vm_free,
    .to_device = dt_gpu_to_device,
    .to_device_async = dt_gpu_to_device_async,
    .reads = dt_gpu_reads,
    .scratch_of = gpu_scratch_of,
    .scratch_reserve = dt_gpu_scratch_reserve,
    .scratch_bytes = dt_gpu_scratch_bytes,
    .to_host = dt_gpu_to_host,
    .copy = dt_gpu_copy,
    .sync = dt_gpu_sync,
    .stream_create = dt_gpu_stream_create,
    .stream_destroy = dt_gpu_stream_destroy,
    .stream_after_compute = dt_gpu_stream_after_compute,
    .stream_query = dt_gpu_stream_query,
    .event_create = dt_gpu_event_create,
    .event_destroy = dt_gpu_event_destroy,
    .event_record = dt_gpu_event_record,
    .event_query = dt_gpu_event_query,
    .stream_wait_event = dt_gpu_stream_wait_event,
    .graph_capture = dt_gpu_graph_capture,
    .graph_replay = dt_gpu_graph_replay,
    .graph_run = dt_gpu_graph_run,
    .graph_drop = dt_gpu_graph_drop,
    .sgemm = dt_gpu_sgemm,
    .gemm16 = dt_gpu_gemm16,
    .to16 = dt_gpu_from_f32,
    .from16 = dt_gpu_to_f32,
    .ef16 = dt_gpu_from_f32_ef,
    .layernorm_forward = dt_gpu_layernorm_forward,
    .layernorm_backward = dt_gpu_layernorm_backward,
    .layernorm_residual = dt_gpu_layernorm_residual,
    .gelu_forward = dt_gpu_gelu_forward,
    .gelu_backward = dt_gpu_gelu_backward,
    .crossentropy_forward = dt_gpu_crossentropy_forward,
    .crossentropy_backward = dt_gpu_crossentropy_backward,
    .crossentropy_fused = dt_gpu_crossentropy_fused,
    .linear_forward = dt_gpu_linear_forward,
    .linear_dgelu = dt_gpu_linear_dgelu,
    .adamw = dt_gpu_adamw,
    .sgd = dt_gpu_sgd,
    .step_scale = dt_gpu_step_scale,
    .conv2d_ready = dt_gpu_conv2d_ready,
    .conv2d_forward = dt_gpu_conv2d_forward,
    .conv2d_backward = dt_gpu_conv2d_backward,
    .encoder_forward = dt_gpu_encoder_forward,
    .encoder_backward = dt_gpu_encoder_backward,
    .encoder_split_forward = dt_gpu_encoder_split_forward,
    .encoder_split_backward = dt_gpu_encoder_split_backward,
    .ce_split_max = dt_gpu_ce_split_max,
    .ce_split_exp = dt_gpu_ce_split_exp,
    .ce_split_finish = dt_gpu_ce_split_finish,
    .residual_forward = dt_gpu_residual_forward,
    .residual_backward = dt_gpu_residual_backward,
    .attention_forward = dt_gpu_attention_forward,
    .attention_backward = dt_gpu_attention_backward,
    .relu_forward = dt_gpu_relu_forward,
    .relu_backward = dt_gpu_relu_backward,
    .bias_forward = dt_gpu_bias_forward,
    .bias_backward = dt_gpu_bias_backward,
    .sumsq = dt_gpu_sumsq,
    .sumsq_parts = dt_gpu_sumsq_parts,
    .loss_add = dt_gpu_loss_add,
    .scale = dt_gpu_scale,
    .im2col = dt_gpu_im2col,
    .col2im = dt_gpu_col2im,
    .transpose = dt_gpu_transpose,
    .maxpool_forward = dt_gpu_maxpool_forward,
    .maxpool_backward = dt_gpu_maxpool_backward,
    .dropout_forward = dt_gpu_dropout_forward,
    .dropout_backward = dt_gpu_dropout_backward,
    .fixed_add = dt_gpu_fixed_add,
    .fixed_to_float = dt_gpu_fixed_to_float,
};

static const dt_dev *g_table;  // (dt_dev_set's)

void dt_dev_set(const dt_dev *d) { g_table = d; }

const dt_dev *dt_dev_get(void) {
    const char *e = getenv("DTRAIN_GPU");
    return g_table ? g_table : e && !strcmp(e, "sim") ? &dt_dev_sim : &dt_dev_cuda;
}

// The kernels by name, for dt_dev_lacks.
#define OP(f) {#f, offsetof(dt_dev, f)}
static const struct {
    const char *name;
    size_t off;
} ops[] = {OP(sgemm), OP(gemm16), OP(to16), OP(from16), OP(ef16), OP(layernorm_forward), OP(layernorm_backward),
           OP(layernorm_residual),
           OP(gelu_forward), OP(gelu_backward), OP(linear_forward), OP(linear_dgelu), OP(crossentropy_forward),
           OP(crossentropy_backward), OP(crossentropy_fused), OP(adamw), OP(sgd), OP(step_scale), OP(encoder_forward),
           OP(encoder_backward), OP(encoder_split_forward), OP(encoder_split_backward), OP(ce_split_max), OP(ce_split_exp),
           OP(ce_split_finish), OP(residual_forward), OP(residual_backward), OP(attention_forward),
           OP(attention_backward), OP(relu_forward), OP(relu_backward), OP(bias_forward), OP(bias_backward),
           OP(sumsq), OP(sumsq_parts), OP(scale), OP(loss_add), OP(im2col), OP(col2im), OP(transpose),
           OP(maxpool_forward), OP(maxpool_backward), OP(dropout_forward), OP(dropout_backward), OP(fixed_add),
           OP(fixed_to_float)};

const char *dt_dev_lacks(const dt_dev *d, const char *const *names) {
    for (; *names; names++) {
        size_t i = 0;
        while (i < sizeof ops / sizeof *ops && strcmp(ops[i].name, *names)) i++;
        if (i == sizeof ops / sizeof *ops) return *names;  // (no such op: lacking too)
        void *fn;
        memcpy(&fn, (const char *)d + ops[i].off, sizeof fn);
        if (!fn) return *names;
    }
    return NULL;
}

dt_status dt_dev_require(const dt_dev *d, const char *const *names, const char *what) {
    const char *op = dt_dev_lacks(d, names);
    if (!op) return DT_OK;
    return dt_error(DT_ERR_CONFIG, "%s: the GPU's %s is not in this dtrain yet (docs/gpu.md)", what, op);
}

// ---- the arena ---------------------------------------------------------------

const char *const dt_dev_kind_names[DT_DEV_KINDS] = {"weights", "gradients", "optimizer_state", "activations",
                                                     "workspace"};

enum { ALIGN = 256 };

void *dt_dev_take(dt_dev_arena *a, int kind, size_t bytes) {
    size_t n = (bytes + ALIGN - 1) / ALIGN * ALIGN;
    if (!a->base) {
        a->planned[kind] += n;
        a->size += n;
        return NULL;
    }
    if (a->at + n > a->size) return NULL;  // (a second pass that differs from the plan: the caller checks)
    void *p = a->base + a->at;
    a->at += n;
    a->used[kind] += n;
    return p;
}

void dt_dev_ask_scratch(dt_dev_arena *a, dt_dev_ask_op op, size_t n, int C, const dt_im2col_t *g) {
    dt_dev_scratch_ask q = {op, n, C, g};
    size_t bytes = a->d->scratch_of(&q);
    a->scratch = bytes > a->scratch ? bytes : a->scratch;
}

static void mib(char *out, size_t n, size_t bytes) { snprintf(out, n, "%.1f MiB", (double)bytes / (1 << 20)); }

dt_status dt_dev_arena_check(const dt_dev_arena *a, const char *what) {
    int same = a->at == a->size;
    for (int i = 0; i < DT_DEV_KINDS; i++) same &= a->used[i] == a->planned[i];
    if (same) return DT_OK;
    char line[512];
    int k = snprintf(line, sizeof line, "%s: the arena's taking pass took %zu bytes of the %zu planned (", what, a->at,
                     a->size);
    for (int i = 0; i < DT_DEV_KINDS && k < (int)sizeof line; i++)
        k += snprintf(line + k, sizeof line - k, "%s%s %zu of %zu", i ? ", " : "", dt_dev_kind_names[i], a->used[i],
                      a->planned[i]);
    return dt_error(DT_ERR_INTERNAL, "%s)", line);
}

// The arena and the scratch its plan asks for (where the device's buffer
// is smaller, a new one, made before the old goes) allocated, or refused
// naming the bytes by kind (the scratch's as workspace) where the GPU has
// not that much free.
dt_status dt_dev_arena_open(dt_dev_arena *a, const char *what) {
    size_t free_b = 0, total = 0, more = a->scratch > a->d->scratch_bytes(NULL) ? a->scratch : 0;
    dt_status st = a->d->mem_info(&free_b, &total);
    if (st != DT_OK) return st;
    if (a->size + more > free_b) {
        char line[512], m[32];
        int k = snprintf(line, sizeof line, "%s: the run needs %zu bytes of GPU memory (", what, a->size + more);
        for (int i = 0; i < DT_DEV_KINDS && k < (int)sizeof line; i++) {
            mib(m, sizeof m, a->planned[i] + (i == DT_DEV_WORK ? more : 0));
            k += snprintf(line + k, sizeof line - k, "%s%s %s", i ? ", " : "", dt_dev_kind_names[i], m);
        }
        return dt_error(DT_ERR_NOMEM, "%s) and the GPU has %zu free of %zu: use a smaller model or batch", line,
                        free_b, total);
    }
    void *p;
    if ((st = a->d->alloc(&p, a->size)) != DT_OK) return dt_error(st, "%s: %s", what, dt_last_error());
    if ((st = a->d->scratch_reserve(a->scratch)) != DT_OK) {
        a->d->free(p);
        return dt_error(st, "%s: the ops' scratch: %s", what, dt_last_error());
    }
    a->base = p;
    a->at = 0;
    memset(a->used, 0, sizeof a->used);
    return DT_OK;
}

void dt_dev_arena_close(dt_dev_arena *a) {
    if (a->base) a->d->free(a->base);
    a->base = NULL;
}

// ---- a block backed on demand ------------------------------------------------

dt_status dt_dev_vm_open(dt_dev_vm *v, const dt_dev *d, size_t bytes, const char *name, const char *what) {
    *v = (dt_dev_vm){.d = d, .name = name};
    if (!d->vm_reserve) return dt_error(DT_ERR_CONFIG, "%s: the GPU's vm_reserve is not in this dtrain yet", what);
    void *p;
    size_t gran;
    dt_status st = d->vm_reserve(&p, bytes ? bytes : 1, &gran);
    if (st != DT_OK) return dt_error(st, "%s: %s", what, dt_last_error());
    v->base = p, v->bytes = bytes, v->gran = gran;
    v->nchunks = ((bytes ? bytes : 1) + gran - 1) / gran;  // what was reserved (freed whole: CUDA takes no part)
    v->mapped = calloc(v->nchunks ? v->nchunks : 1, 1);
    v->unused = calloc(v->nchunks ? v->nchunks : 1, sizeof *v->unused);
    if (!v->mapped || !v->unused) {
        dt_dev_vm_close(v);
        return dt_error(DT_ERR_NOMEM, "%s: out of host memory", what);
    }
    return DT_OK;
}

void dt_dev_vm_close(dt_dev_vm *v) {
    if (v->base) v->d->sync();  // (nothing queued may use what goes)
    for (size_t i = 0; v->base && v->mapped && i < v->nchunks; i++)
        if (v->mapped[i]) v->d->vm_unmap(v->base + i * v->gran, v->gran);
    if (v->base) v->d->vm_free(v->base, v->nchunks * v->gran);
    free(v->mapped);
    free(v->unused);
    *v = (dt_dev_vm){0};
}

// Chunk i given back.
static dt_status unmap(dt_dev_vm *v, size_t i) {
    dt_status st = v->d->vm_unmap(v->base + i * v->gran, v->gran);
    if (st != DT_OK) return dt_error(st, "device memory backed on demand, given back: %s", dt_last_error());
    v->mapped[i] = 0;
    v->now -= v->gran;
    return DT_OK;
}

dt_status dt_dev_vm_back(dt_dev_vm *v, size_t off, size_t len) {
    if (!len) return DT_OK;
    for (size_t i = off / v->gran; i <= (off + len - 1) / v->gran && i < v->nchunks; i++) {
        if (v->mapped[i]) continue;
        while (v->budget && v->now + v->gran > v->budget && v->room && v->room(v->room_user)) {
        }
        size_t free_b = 0, total = 0;
        dt_status st = v->d->vm_map(v->base + i * v->gran, v->gran);
        if (st != DT_OK) {
            v->d->mem_info(&free_b, &total);
            return dt_error(st, "%s backed on demand (ZeRO): %zu bytes more with %zu backed, and the GPU has %zu free "
                            "of %zu: %s", v->name, v->gran, v->now, free_b, total, dt_last_error());
        }
        v->mapped[i] = 1;
        v->unused[i] = 0;  // (backed again within a step: its bytes in use again)
        v->now += v->gran;
        v->peak = v->now > v->peak ? v->now : v->peak;
        if ((st = v->d->memset0(v->base + i * v->gran, v->gran)) != DT_OK) return st;
    }
    return DT_OK;
}

// The bytes of chunk i inside the block (the last may be short).
static size_t chunk_bytes(const dt_dev_vm *v, size_t i) {
    size_t lo = i * v->gran, hi = lo + v->gran < v->bytes ? lo + v->gran : v->bytes;
    return hi - lo;
}

dt_status dt_dev_vm_unused(dt_dev_vm *v, size_t off, size_t len) {
    for (size_t i = off / v->gran; len && i <= (off + len - 1) / v->gran && i < v->nchunks; i++) {
        size_t lo = i * v->gran > off ? i * v->gran : off, end = (i + 1) * v->gran;
        size_t hi = end < off + len ? end : off + len;
        v->unused[i] += hi - lo;
        if (v->unused[i] < chunk_bytes(v, i) || !v->mapped[i]) continue;
        dt_status st = unmap(v, i);
        if (st != DT_OK) return st;
    }
    return DT_OK;
}

dt_status dt_dev_vm_give(dt_dev_vm *v, size_t off, size_t len) {
    for (size_t i = (off + v->gran - 1) / v->gran; (i + 1) * v->gran <= off + len && i < v->nchunks; i++)
        if (v->mapped[i]) {
            dt_status st = unmap(v, i);
            if (st != DT_OK) return st;
        }
    return DT_OK;
}

dt_status dt_dev_vm_zero(dt_dev_vm *v) {
    for (size_t i = 0; i < v->nchunks; i++) {
        v->unused[i] = 0;
        if (!v->mapped[i]) continue;
        size_t j = i;  // (a run of backed chunks: one memset)
        while (j + 1 < v->nchunks && v->mapped[j + 1]) v->unused[++j] = 0;
        dt_status st = v->d->memset0(v->base + i * v->gran, (j - i + 1) * v->gran);
        if (st != DT_OK) return st;
        i = j;
    }
    return DT_OK;
}
