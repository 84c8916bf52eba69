/* [train] device against this build and this machine (docs/gpu.md), through
 * the device seam (gpu/dev.h: the CUDA device, or dtrain's simulated GPU
 * under DTRAIN_GPU=sim). */
#include "comm/device.h"
#include "dtrain/train.h"
#include "engine/device.h"
#include "gpu/dev.h"
#include "gpu/gpu.h"
#include "obs/obs.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <string.h>

// The kernels a model's device step calls (gpu/dev_model.c).
static const char *const mlp_ops[] = {"sgemm", "bias_forward", "bias_backward", "relu_forward", "relu_backward",
                                      "gelu_forward", "gelu_backward", "layernorm_forward", "layernorm_backward",
                                      "crossentropy_forward", "crossentropy_backward", "sumsq", "im2col", "col2im",
                                      "transpose", "maxpool_forward", "maxpool_backward", "dropout_forward",
                                      "dropout_backward", NULL};
static const char *const gpt_ops[] = {"sgemm", "encoder_forward", "encoder_backward", "layernorm_forward",
                                      "layernorm_residual", "layernorm_backward", "attention_forward",
                                      "attention_backward",
                                      "residual_forward", "residual_backward", "gelu_forward", "gelu_backward",
                                      "bias_forward", "bias_backward", "crossentropy_forward",
                                      "crossentropy_backward", "crossentropy_fused", "sumsq", NULL};
// ... and in bf16 or fp16 (the GEMMs on 16-bit operands); under ZeRO (the
// sharded norm's pieces).
static const char *const half_ops[] = {"gemm16", "to16", NULL};
// ... a GPT's tensor-parallel shards (the vocabulary-parallel embedding and loss).
static const char *const split_ops[] = {"encoder_split_forward", "encoder_split_backward", "ce_split_max",
                                        "ce_split_exp", "ce_split_finish", NULL};
static const char *const zero_ops[] = {"sumsq_parts", NULL};
// ... and gradients exchanged in 16 bits, with error feedback or not.
static const char *const wire_ops[] = {"to16", "from16", NULL};
static const char *const ef_ops[] = {"ef16", NULL};

// Whether c's gradients go over the wire in 16 bits ([parallel] grad_dtype
// = bf16, [compression] method = fp16 or bf16).
static int wire16(const dt_config *c) {
    return c->grad_dtype || c->comp_method == DT_COMP_FP16 || c->comp_method == DT_COMP_BF16;
}

// What trains on a device: data parallel (plain or deterministic, ZeRO
// stage 1, 2 or 3 or not), in fp32, bf16 or fp16, a GPT or a sequential model
// (dense, convolution, pooling and dropout layers), its gradients summed in
// fp32 or (plain data parallel) in 16 bits; pipeline, tensor and sequence
// parallel (the model-parallel strategy, its stages on the device); the
// rest refused by name.
static dt_status supported(const dt_config *c) {
    const char *no = c->ps_servers > 0 ? "[parallel] servers (parameter servers)"
                     : c->sync_every > 0 ? "[parallel] sync_every (local SGD)"
                     : c->comp_method != DT_COMP_NONE && !wire16(c) ? "[compression] method (other than fp16, bf16)"
                     : wire16(c) && c->comp_min_bytes > 0 ? "[compression] min_bytes (pieces sent as fp32)"
                     : c->offload        ? "[parallel] offload"
                     : c->dynamic_batch  ? "[train] dynamic_batch"
                     : c->recompute      ? "[train] recompute"
                     : c->gpt && c->arch == DT_ARCH_LLAMA ? "[model] arch = llama"
                                                          : NULL;
    if (no)
        return dt_error(DT_ERR_CONFIG, "[train] device = %s with %s: not in this dtrain yet (GPUs train data parallel, "
                        "plain or deterministic, ZeRO stages 1 to 3 or not, a GPT or a sequential model, gradients in fp32 "
                        "or bf16/fp16, pipeline and tensor parallel; docs/gpu.md)",
                        c->device, no);
    return DT_OK;
}

dt_status dt_train_check_device(const dt_config *c) {
    int want = dt_device_index(c->device);
    if (want < 0) return DT_OK;
    const dt_dev *d = dt_dev_get();
    char why[512], what[300] = "";
    int n = d->count(why, sizeof why);
    if (n == 0) return dt_error(DT_ERR_CONFIG, "[train] device = %s: %s", c->device, why);
    if (want >= n)
        return dt_error(DT_ERR_CONFIG, "[train] device = %s: this machine has %d GPU%s (cuda:0%s%.0d)", c->device, n,
                        n > 1 ? "s" : "", n > 1 ? " to cuda:" : "", n > 1 ? n - 1 : 0);
    dt_status st = supported(c);
    if (st != DT_OK) return st;
    d->describe(want, what, sizeof what);
    char who[400];
    snprintf(who, sizeof who, "[train] device = %s (%s)", c->device, what);
    st = dt_dev_require(d, c->gpt ? gpt_ops : mlp_ops, who);
    if (st == DT_OK && c->precision != DT_F32) st = dt_dev_require(d, half_ops, who);
    if (st == DT_OK && c->gpt && c->tensor > 1) st = dt_dev_require(d, split_ops, who);
    if (st == DT_OK && wire16(c)) st = dt_dev_require(d, wire_ops, who);
    if (st == DT_OK && wire16(c) && c->comp_method != DT_COMP_NONE && c->comp_error_feedback)
        st = dt_dev_require(d, ef_ops, who);
    return st == DT_OK && c->zero > 0 ? dt_dev_require(d, zero_ops, who) : st;
}

dt_status dt_train_device_for(const dt_config *c, dt_comm_t comm, int *index, char *shared, size_t n) {
    char why[512];
    int gpus = dt_dev_get()->count(why, sizeof why), L = dt_comm_local_size(comm);
    int named = strcmp(c->device, "cuda") != 0;
    *index = dt_device_index(c->device);
    if (gpus < 1) return dt_error(DT_ERR_CONFIG, "[train] device = %s: %s", c->device, why);
    if (!named) *index = dt_comm_local_rank(comm) % gpus;
    if (*index >= gpus)
        return dt_error(DT_ERR_CONFIG, "[train] device = %s: this machine has %d GPU%s", c->device, gpus,
                        gpus > 1 ? "s" : "");
    shared[0] = 0;
    if (named && L > 1) snprintf(shared, n, "%d ranks of this host on %s", L, c->device);
    else if (!named && L > gpus) snprintf(shared, n, "%d ranks of this host on %d GPU%s", L, gpus, gpus > 1 ? "s" : "");
    return DT_OK;
}

dt_status dt_train_device_comm(const dt_config *c, dt_comm_t world, dt_comm_t over, dt_comm_t *out, char *why,
                               size_t n) {
    int index;
    char shared[128];
    dt_status st = dt_train_device_for(c, world, &index, shared, sizeof shared);
    dt_comm_device_params p = {dt_dev_get(), index, shared[0] ? shared : NULL};
    return st == DT_OK ? dt_comm_init_device(over, &p, out, why, n) : st;
}

void dt_train_device_comm_said(const char *what, dt_comm_t c, const char *why) {
    int staged = !strcmp(dt_comm_backend(c), "staging");
    dt_log(DT_LOG_INFO, "%s %s (%s)", what, staged ? "staged through host memory" : "on the GPUs", why);
}

dt_status dt_train_device_use(const dt_config *c, dt_comm_t comm) {
    if (dt_device_index(c->device) < 0) return DT_OK;
    int index;
    char shared[128];
    dt_status st = dt_train_device_for(c, comm, &index, shared, sizeof shared);
    if (st == DT_OK && (st = dt_dev_get()->use(index)) != DT_OK)
        st = dt_error(st, "[train] device = %s: cuda:%d on rank %d: %s", c->device, index, dt_comm_rank(comm),
                      dt_last_error());
    dt_gpu_set_tf32(c->tf32);  // (the CUDA GEMM's; the simulated GPU's is the CPU's fp32)
    dt_att_choose((dt_att_choice)c->attention);
    if (st == DT_OK) dt_log(DT_LOG_DEBUG, "rank %d trains on cuda:%d%s%s", dt_comm_rank(comm), index, *shared ? ": " : "", shared);
    return st;
}

// Model parallel on a device: the blocks held, the strategy backing the
// ranges a stage keeps (its ZeRO its own).
static int model_parallel(const dt_config *c) { return c->pipeline > 1 || c->tensor > 1; }

dt_dev_part dt_train_device_part(const dt_config *c, dt_comm_t comm) {
    int W = dt_comm_size(comm), z = model_parallel(c) ? 0 : c->zero;
    return (dt_dev_part){z > 0 ? dt_comm_rank(comm) : 0, z > 0 ? W : 1, z >= 2 && W > 1, z == 3 && W > 1,
                         model_parallel(c)};
}

void dt_train_device_metrics(dt_obs *obs, const size_t k[DT_DEV_KINDS]) {
    double g[DT_DEV_KINDS];
    for (int i = 0; i < DT_DEV_KINDS; i++) g[i] = (double)k[i];
    dt_obs_set_gpu_memory(obs, g);
}

cJSON *dt_train_device_summary(cJSON *o, const dt_config *c, const dt_dev_blocks *b) {
    size_t k[DT_DEV_KINDS];
    char what[300] = "";
    dt_dev_blocks_kinds(b, k);
    b->d->describe(dt_device_index(c->device), what, sizeof what);
    cJSON *g = cJSON_AddObjectToObject(o, "gpu");
    cJSON_AddStringToObject(g, "device", c->device);
    cJSON_AddStringToObject(g, "implementation", b->d->name);
    cJSON_AddStringToObject(g, "name", what);
    cJSON_AddBoolToObject(g, "tf32", c->tf32 && !strcmp(b->d->name, "cuda") && b->t == DT_F32);
    cJSON_AddStringToObject(g, "gemm_operands", b->t == DT_BF16 ? "bf16" : b->t == DT_F16 ? "fp16" : "fp32");
    cJSON_AddNumberToObject(g, "arena_bytes", (double)b->arena.size);
    for (int i = 0; i < DT_DEV_KINDS; i++) {
        char key[64];
        snprintf(key, sizeof key, "%s_bytes", dt_dev_kind_names[i]);
        cJSON_AddNumberToObject(g, key, (double)k[i]);
    }
    cJSON_AddNumberToObject(g, "pinned_host_bytes", (double)b->pinned_bytes);
    uint64_t allocs = 0;  // (the ops' scratch, planned before the first step: in workspace_bytes)
    cJSON_AddNumberToObject(g, "scratch_bytes", (double)b->d->scratch_bytes(&allocs));
    cJSON_AddNumberToObject(g, "scratch_allocations", (double)allocs);
    if (b->attention) cJSON_AddStringToObject(g, "attention", b->attention);
    if (b->shards)  // (tensor parallel: the shards' sums on a GPUs' communicator of this backend)
        cJSON_AddStringToObject(g, "shards", b->shards);
    if (b->stage_bytes)  // (model parallel: its pipeline stages' activation sets, in activations_bytes)
        cJSON_AddNumberToObject(g, "stage_activations_bytes", (double)b->stage_bytes);
    if (b->grads_vm) {  // (ZeRO stage 2, model parallel: the gradients backed on demand)
        cJSON_AddNumberToObject(g, "gradients_backed_peak_bytes", (double)b->gvm.peak);
        cJSON_AddNumberToObject(g, "gradients_backed_chunk_bytes", (double)b->gvm.gran);
    }
    if (b->params_vm) {  // (stage 3, model parallel: the parameters too)
        cJSON_AddNumberToObject(g, "weights_backed_peak_bytes", (double)b->pvm.peak);
        if (b->hvm.base) cJSON_AddNumberToObject(g, "weights_16bit_backed_peak_bytes", (double)b->hvm.peak);
    }
    return g;
}

void dt_device_report(char *out, size_t n) {
    const dt_dev *d = dt_dev_get();
    char why[512] = "", what[300] = "";
    int gpus = d->count(why, sizeof why);
    size_t k = (size_t)snprintf(out, n, "cuda: %s\ngpus: %d", dt_gpu_build(), gpus);
    for (int i = 0; i < gpus && k < n; i++)
        if (d->describe(i, what, sizeof what) == DT_OK) k += (size_t)snprintf(out + k, n - k, "%s cuda:%d %s",
                                                                               i ? ";" : " (", i, what);
    if (k < n) k += (size_t)snprintf(out + k, n - k, "%s", gpus ? ")" : "");
    if (!gpus && k < n) k += (size_t)snprintf(out + k, n - k, " (%s)", why);
    const char *libs[] = {"cublaslt", "cudnn", "nccl"};
    for (int i = 0; i < 3 && k < n; i++) {
        dt_gpu_lib l;
        if (dt_gpu_lib_open(libs[i], &l) == DT_OK) {
            k += (size_t)snprintf(out + k, n - k, "\n%s: %ld.%ld.%ld (%s)", libs[i], l.version / 10000,
                                  l.version / 100 % 100, l.version % 100, l.path);
            dt_gpu_lib_close(&l);
        } else {
            k += (size_t)snprintf(out + k, n - k, "\n%s: %s", libs[i], dt_last_error());
        }
    }
}
