/* What describes a model and its training (spec.h): names, presets,
 * defaults and checks of plain data. */
#include "dtrain/spec.h"

#include <string.h>

const char *dt_layer_kind_name(dt_layer_kind k) {
    static const char *n[] = {"linear", "conv2d", "maxpool", "relu", "gelu",
                              "layernorm", "dropout", "flatten", "batchnorm", "block", "avgpool"};
    return (unsigned)k < sizeof n / sizeof n[0] ? n[k] : "?";
}

int dt_gpt_pad_vocab(int V) { return (V + 127) / 128 * 128; }

dt_status dt_gpt_preset(const char *name, dt_gpt_config *c) {
    memset(c, 0, sizeof *c);
    if (!strcmp(name, "gpt-tiny")) *c = (dt_gpt_config){2, 4, 64, 256, 256, 256};
    else if (!strcmp(name, "gpt-small")) *c = (dt_gpt_config){6, 6, 384, 256, 256, 256};
    else if (!strcmp(name, "gpt2-124m")) *c = (dt_gpt_config){12, 12, 768, 1024, 50257, 50304};
    else return dt_error(DT_ERR_ARG, "unknown GPT preset '%s' (expected gpt-tiny, gpt-small or gpt2-124m)", name);
    return DT_OK;
}

dt_status dt_gpt_config_check(const dt_gpt_config *c, const char *what) {
    const struct { const char *name; int v, lo, hi; } f[] = {
        {"n_layer", c->n_layer, 1, 1024},      {"n_head", c->n_head, 1, 1024},
        {"n_embd", c->n_embd, 1, 65536},       {"block_size", c->block_size, 1, 1 << 20},
        {"vocab_size", c->vocab_size, 1, 65536}, {"padded_vocab_size", c->padded_vocab_size, 1, 1 << 20}};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if (f[i].v < f[i].lo || f[i].v > f[i].hi)
            return dt_error(DT_ERR_ARG, "%s: %s = %d: expected a value from %d to %d", what, f[i].name,
                            f[i].v, f[i].lo, f[i].hi);
    if (c->n_embd % c->n_head)
        return dt_error(DT_ERR_ARG, "%s: n_embd (%d) is not a multiple of n_head (%d)", what, c->n_embd, c->n_head);
    if (c->padded_vocab_size < c->vocab_size)
        return dt_error(DT_ERR_ARG, "%s: padded_vocab_size (%d) is below vocab_size (%d)", what,
                        c->padded_vocab_size, c->vocab_size);
    // Token files hold uint16 ids: a larger vocabulary could not be fed.
    if (c->vocab_size > 65536) return dt_error(DT_ERR_ARG, "%s: vocab_size %d exceeds 65536", what, c->vocab_size);
    return DT_OK;
}

dt_status dt_gpt_tensor_parallel_check(const dt_gpt_config *c, int ntp, const char *what) {
    if (ntp < 1) return dt_error(DT_ERR_ARG, "%s = %d: expected at least 1", what, ntp);
    if (c->n_embd % ntp)
        return dt_error(DT_ERR_ARG, "%s = %d does not divide the model's hidden size %d (n_embd)", what, ntp, c->n_embd);
    if (c->n_head % ntp)
        return dt_error(DT_ERR_ARG, "%s = %d does not divide the model's %d attention heads (n_head): each rank takes n_head / %d heads",
                        what, ntp, c->n_head, ntp);
    if (c->padded_vocab_size % ntp)
        return dt_error(DT_ERR_ARG, "%s = %d does not divide the model's vocabulary of %d rows (padded_vocab_size; vocab_size %d): each rank takes a slice of the token embedding",
                        what, ntp, c->padded_vocab_size, c->vocab_size);
    return DT_OK;
}

dt_optim_params dt_optim_default_params(dt_optim_kind kind) {
    dt_optim_params p = {0};
    p.kind = kind;
    p.beta1 = 0.9f;
    p.beta2 = 0.999f;
    p.eps = 1e-8f;
    if (kind == DT_OPTIM_ADAMW) {
        p.lr = 1e-3f;
        p.weight_decay = 0.01f;
    } else {
        p.lr = 0.01f;
    }
    return p;
}

const char *dt_optim_kind_name(dt_optim_kind kind) {
    return kind == DT_OPTIM_ADAMW ? "adamw" : "sgd";
}

const char *dt_sched_kind_name(dt_sched_kind kind) {
    switch (kind) {
    case DT_SCHED_COSINE: return "cosine";
    case DT_SCHED_LINEAR: return "linear";
    default: return "constant";
    }
}

dt_status dt_dlrm_spec_check(const dt_dlrm_spec *s, const char *what) {
    if (s->ntables < 1 || s->ntables > DT_DLRM_MAX_TABLES)
        return dt_error(DT_ERR_CONFIG, "%s tables: %d tables, expected 1 to %d", what, s->ntables, DT_DLRM_MAX_TABLES);
    for (int t = 0; t < s->ntables; t++)
        if (s->rows[t] < 1 || s->rows[t] > (1ll << 32))
            return dt_error(DT_ERR_CONFIG, "%s tables: table %d has %lld rows, expected 1 to 2^32", what, t,
                            (long long)s->rows[t]);
    if (s->dim < 1 || s->dim > 4096) return dt_error(DT_ERR_CONFIG, "%s dim: %d, expected 1 to 4096", what, s->dim);
    if (s->ndense < 0 || s->ndense > 4096)
        return dt_error(DT_ERR_CONFIG, "%s dense: %d, expected 0 to 4096", what, s->ndense);
    if (s->nbottom < 0 || s->nbottom > DT_DLRM_MAX_MLP || s->ntop < 0 || s->ntop > DT_DLRM_MAX_MLP)
        return dt_error(DT_ERR_CONFIG, "%s bottom, top: at most %d widths each", what, DT_DLRM_MAX_MLP);
    for (int i = 0; i < s->nbottom + s->ntop; i++) {
        int w = i < s->nbottom ? s->bottom[i] : s->top[i - s->nbottom];
        if (w < 1 || w > 65536)
            return dt_error(DT_ERR_CONFIG, "%s %s: width %d, expected 1 to 65536", what, i < s->nbottom ? "bottom" : "top", w);
    }
    return DT_OK;
}
