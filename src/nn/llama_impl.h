/* The Llama model's insides, shared by nn/llama.c (configuration, the
 * block, shards, kept layers, initialisation) and nn/llama_run.c
 * (activation sets, the stages' forward and backward). */
#ifndef DT_NN_LLAMA_IMPL_H
#define DT_NN_LLAMA_IMPL_H

#include "dtrain/llama.h"

#define NPT DT_LLAMA_NTENSORS
#define NPL 9  // per-layer tensors

enum { EMB, ATTN_NORM, WQ, WK, WV, WO, MLP_NORM, W_GATE, W_UP, W_DOWN, NORM, HEAD };

struct dt_llama {
    dt_llama_config c;
    size_t nparams;
    dt_tensor_info t[NPT];    // this model's (a shard's) tensors
    float *params, *grads, *p[NPT], *g[NPT];
    dt_grad_range *ord;       // the gradient order, NPL L + 3 ranges
    dt_llama_acts *acts;      // the default set (NULL: created with B = T = 0)
    // Backward scratch for up to scratch_bt tokens, shared by every set.
    size_t scratch_bt, scratch_att;
    float *scratch, *d0, *d1, *dF0, *dF1, *dF2, *datt, *dq, *dk, *dv;
    int tp, ntp;              // shard tp of ntp (0 of 1: the whole model)
    dt_llama_reduce_fn reduce;
    void *reduce_user;
    unsigned char *held;      // the blocks kept (NULL: all)
    dt_grad_range *hranges;   // the block's ranges kept
    int nheld;
    float loss_scale;
    dt_grad_ready_fn hook;
    void *hook_user;
    dt_llama_layer_fn layer_hook;
    void *layer_user;
};

// A shard's sizes: query channels, key/value channels, hidden units, heads.
typedef struct {
    int C, Cl, KCl, Fl, NHl, KVl, hs, V;
} llama_dims;

static inline llama_dims llama_dims_of(const dt_llama_config *c, int ntp) {
    int hs = c->n_embd / c->n_head;
    return (llama_dims){c->n_embd, c->n_embd / ntp, c->n_kv_head * hs / ntp, c->ffn_hidden / ntp,
                        c->n_head / ntp, c->n_kv_head / ntp, hs, c->vocab_size};
}

/* The tensors of shard tp of ntp (1: the whole model) at their offsets. */
void dt_llama_shard_shapes(const dt_llama_config *c, int ntp, dt_tensor_info t[NPT]);
/* Makes the backward scratch hold B x T tokens of a shard of m's. */
dt_status dt_llama_reserve_scratch(dt_llama *m, int B, int T);
void dt_llama_free_scratch(dt_llama *m);

#endif
