/* Llama weights (dtrain/llama.h). In Hugging Face's layout: the stacked
 * block's tensors written and read one layer's slice at a time under
 * LlamaForCausalLM's names, wq and wk with their rows permuted between
 * dtrain's rotary pairs (2i, 2i+1) and rotate_half's (i, i + hs/2). A training run's own weights file or
 * checkpoint (dt_llama_load): the stacked tensors as they are. */
#include "dtrain/ckpt.h"
#include "dtrain/llama.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NPL 9  // per-layer tensors, in block order from attn_norm

static const char *const layer_names[NPL] = {
    "input_layernorm", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
    "post_attention_layernorm", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"};

enum { EMB = 0, WQ = 2, WK = 3, NORM = 10, HEAD = 11 };

// One HF tensor: its name, the block's elements [off, off + n) and shape.
typedef struct {
    char name[96];
    size_t off, n;
    int ndim, rot_heads;  // rot_heads > 0: rows permuted for rotate_half, that many heads
    int64_t shape[2];
} hf_tensor;

// The 3 + 9 L tensors in file order; returns how many.
static int hf_tensors(const dt_llama *m, hf_tensor *out) {
    const dt_llama_config *c = dt_llama_get_config(m);
    int L = c->n_layer, n = 0;
    const dt_tensor_info *t;
    t = dt_llama_tensor(m, EMB);
    out[n++] = (hf_tensor){"model.embed_tokens.weight", t->offset, t->numel, 2, 0, {t->shape[0], t->shape[1]}};
    for (int l = 0; l < L; l++)
        for (int k = 0; k < NPL; k++) {
            t = dt_llama_tensor(m, 1 + k);
            size_t per = t->numel / (size_t)L;
            hf_tensor *h = &out[n++];
            *h = (hf_tensor){"", t->offset + (size_t)l * per, per, t->ndim - 1, 0, {t->shape[1], t->shape[2]}};
            if (1 + k == WQ) h->rot_heads = c->n_head;
            if (1 + k == WK) h->rot_heads = c->n_kv_head;
            snprintf(h->name, sizeof h->name, "model.layers.%d.%s.weight", l, layer_names[k]);
        }
    t = dt_llama_tensor(m, NORM);
    out[n++] = (hf_tensor){"model.norm.weight", t->offset, t->numel, 1, 0, {t->shape[0], 0}};
    t = dt_llama_tensor(m, HEAD);
    out[n++] = (hf_tensor){"lm_head.weight", t->offset, t->numel, 2, 0, {t->shape[0], t->shape[1]}};
    return n;
}

// Rows of `heads` heads of hs rows each (cols columns): to_hf moves row
// 2i + p of a head to row p hs/2 + i, else back.
static void permute_rows(float *dst, const float *src, int heads, int rows, int cols, int to_hf) {
    int hs = rows / heads, half = hs / 2;
    for (int h = 0; h < heads; h++)
        for (int i = 0; i < half; i++)
            for (int p = 0; p < 2; p++) {
                size_t meta = (size_t)h * hs + 2 * i + p, hf = (size_t)h * hs + (size_t)p * half + i;
                memcpy(dst + (to_hf ? hf : meta) * cols, src + (to_hf ? meta : hf) * cols, sizeof(float) * cols);
            }
}

static hf_tensor *alloc_tensors(const dt_llama *m) {
    return malloc(sizeof(hf_tensor) * (3 + NPL * (size_t)dt_llama_get_config(m)->n_layer));
}

dt_status dt_llama_save_hf(const dt_llama *m, const char *path) {
    const dt_llama_config *c = dt_llama_get_config(m);
    hf_tensor *h = alloc_tensors(m);
    int n = h ? hf_tensors(m, h) : 0;
    dt_st_tensor *st = calloc((size_t)n + 1, sizeof *st);
    float **tmp = calloc((size_t)n + 1, sizeof *tmp);
    const float *P = dt_llama_params((dt_llama *)m);
    dt_status s = h && st && tmp ? DT_OK : dt_error(DT_ERR_NOMEM, "%s: out of memory", path);
    for (int i = 0; s == DT_OK && i < n; i++) {
        const float *src = P + h[i].off;
        if (h[i].rot_heads) {
            if (!(tmp[i] = malloc(sizeof(float) * h[i].n))) {
                s = dt_error(DT_ERR_NOMEM, "%s: out of memory", path);
                break;
            }
            permute_rows(tmp[i], src, h[i].rot_heads, (int)h[i].shape[0], (int)h[i].shape[1], 1);
            src = tmp[i];
        }
        st[i] = (dt_st_tensor){h[i].name, DT_F32, h[i].ndim, {h[i].shape[0], h[i].shape[1]}, src,
                               sizeof(float) * h[i].n};
    }
    char v[9][24];
    snprintf(v[0], 24, "%d", c->n_layer), snprintf(v[1], 24, "%d", c->n_head), snprintf(v[2], 24, "%d", c->n_kv_head);
    snprintf(v[3], 24, "%d", c->n_embd), snprintf(v[4], 24, "%d", c->ffn_hidden), snprintf(v[5], 24, "%d", c->block_size);
    snprintf(v[6], 24, "%d", c->vocab_size), snprintf(v[7], 24, "%.9g", c->rope_theta), snprintf(v[8], 24, "%.9g", c->norm_eps);
    dt_st_meta meta[10] = {{"format", "pt"}, {"num_hidden_layers", v[0]}, {"num_attention_heads", v[1]},
                           {"num_key_value_heads", v[2]}, {"hidden_size", v[3]}, {"intermediate_size", v[4]},
                           {"max_position_embeddings", v[5]}, {"vocab_size", v[6]}, {"rope_theta", v[7]},
                           {"rms_norm_eps", v[8]}};
    if (s == DT_OK) s = dt_st_write(path, st, n, meta, 10);
    for (int i = 0; tmp && i < n; i++) free(tmp[i]);
    free(tmp);
    free(st);
    free(h);
    return s;
}

// The file's tensor for h: present, and shaped as h says.
static dt_status find_tensor(const dt_st_file *f, const char *path, const hf_tensor *h, const dt_st_tensor **out) {
    const dt_st_tensor *t = *out = dt_st_find(f, h->name);
    if (!t) return dt_error(DT_ERR_FORMAT, "%s: tensor %s is missing", path, h->name);
    int ok = t->ndim == h->ndim && (t->dtype == DT_F32 || t->dtype == DT_BF16 || t->dtype == DT_F16);
    for (int d = 0; ok && d < h->ndim; d++) ok = t->shape[d] == h->shape[d];
    if (!ok)
        return dt_error(DT_ERR_FORMAT, "%s: tensor %s: expected an F32, BF16 or F16 tensor of shape [%lld%s%lld], got %d dimensions [%lld, %lld, ...]",
                        path, h->name, (long long)h->shape[0], h->ndim > 1 ? ", " : "", h->ndim > 1 ? (long long)h->shape[1] : 0LL,
                        t->ndim, (long long)t->shape[0], t->ndim > 1 ? (long long)t->shape[1] : 0LL);
    return DT_OK;
}

// A name of f that is none of h[n]'s, or NULL.
static const char *extra_tensor(const dt_st_file *f, const hf_tensor *h, int n) {
    for (int i = 0; i < dt_st_count(f); i++) {
        const char *name = dt_st_get(f, i)->name;
        int found = 0;
        for (int j = 0; !found && j < n; j++) found = !strcmp(name, h[j].name);
        if (!found) return name;
    }
    return NULL;
}

// Hugging Face's tensors of the open file f into m.
static dt_status load_hf(dt_llama *m, dt_st_file *f, const char *path) {
    hf_tensor *h = alloc_tensors(m);
    if (!h) return dt_error(DT_ERR_NOMEM, "%s: out of memory", path);
    int n = hf_tensors(m, h);
    dt_status s = DT_OK;
    const char *extra = extra_tensor(f, h, n);
    if (extra) s = dt_error(DT_ERR_FORMAT, "%s: tensor %s is not one of this Llama model's (%d layers)", path, extra,
                            dt_llama_get_config(m)->n_layer);
    const dt_st_tensor *t;
    for (int i = 0; s == DT_OK && i < n; i++) s = find_tensor(f, path, &h[i], &t);  // (all checked before any is read)
    float *P = dt_llama_params(m), *tmp = NULL;
    for (int i = 0; s == DT_OK && i < n; i++) {
        find_tensor(f, path, &h[i], &t);
        if (!h[i].rot_heads) {
            s = dt_st_read(f, t, 0, h[i].n, DT_F32, P + h[i].off);
            continue;
        }
        float *q = realloc(tmp, sizeof(float) * h[i].n);
        if (!q) {
            s = dt_error(DT_ERR_NOMEM, "%s: out of memory", path);
            break;
        }
        tmp = q;
        if ((s = dt_st_read(f, t, 0, h[i].n, DT_F32, tmp)) == DT_OK)
            permute_rows(P + h[i].off, tmp, h[i].rot_heads, (int)h[i].shape[0], (int)h[i].shape[1], 0);
    }
    if (s == DT_OK) s = dt_st_check_finite(f, path);
    free(tmp);
    free(h);
    return s;
}

dt_status dt_llama_load_hf(dt_llama *m, const char *path) {
    dt_st_file *f = NULL;
    dt_status s = dt_st_open(&f, path);
    if (s == DT_OK) s = load_hf(m, f, path);
    dt_st_close(f);
    return s;
}

// ----------------------------------------------------------------------------
// a training run's weights file (format dtrain-llama)

static dt_status check_sizes(const dt_st_file *f, const dt_llama_config *c, const char *path) {
    const char *k[7] = {"n_layer", "n_head", "n_kv_head", "n_embd", "ffn_hidden", "block_size", "vocab_size"};
    int v[7] = {c->n_layer, c->n_head, c->n_kv_head, c->n_embd, c->ffn_hidden, c->block_size, c->vocab_size};
    for (int i = 0; i < 7; i++) {
        const char *have = dt_st_meta_get(f, k[i]);
        if (!have || atoi(have) != v[i])
            return dt_error(DT_ERR_FORMAT, "%s: weights of %s %s, but the model has %s = %d", path, k[i],
                            have ? have : "(missing)", k[i], v[i]);
    }
    return DT_OK;
}

static dt_status load_own(dt_llama *m, dt_st_file *f, const char *path, int is_ckpt) {
    // (a checkpoint carries its config, not the sizes: its tensors' sizes are checked)
    dt_status s = is_ckpt ? DT_OK : check_sizes(f, dt_llama_get_config(m), path);
    float *P = dt_llama_params(m);
    for (int i = 0; s == DT_OK && i < DT_LLAMA_NTENSORS; i++) {
        const dt_tensor_info *ti = dt_llama_tensor(m, i);
        const dt_st_tensor *t = dt_st_find(f, ti->name);
        size_t n = 1;
        for (int d = 0; t && d < t->ndim; d++) n *= (size_t)t->shape[d];
        if (!t) s = dt_error(DT_ERR_FORMAT, "%s: no tensor %s", path, ti->name);
        else if (n != ti->numel)
            s = dt_error(DT_ERR_FORMAT, "%s: tensor %s has %zu elements, the model's %zu", path, ti->name, n, ti->numel);
        else s = dt_st_read(f, t, 0, n, DT_F32, P + ti->offset);
    }
    return s == DT_OK && !is_ckpt ? dt_st_check_finite(f, path) : s;  // (a checkpoint was checked when opened)
}

dt_status dt_llama_load(dt_llama *m, const char *path) {
    dt_st_file *f = NULL;
    int is_ckpt = 0;
    dt_status s = dt_ckpt_open(path, &f, &is_ckpt);
    if (s != DT_OK) return s;
    const char *format = dt_st_meta_get(f, "format");
    s = is_ckpt || (format && !strcmp(format, "dtrain-llama")) ? load_own(m, f, path, is_ckpt) : load_hf(m, f, path);
    dt_st_close(f);
    return s;
}
